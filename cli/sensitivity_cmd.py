"""`cptsim sensitivity`: how much each quantized layer's precision matters, measured on the workload."""

from __future__ import annotations

import click
from rich.table import Table

from .common import emit_json, err, json_option, parse_fp_layers, workload_options
from .common import out as console

_EPILOG = """\b
Examples:
  cptsim sensitivity                              digits-cnn on digits: both methods, ~5 s on a CPU
  cptsim sensitivity --model resnet20 --dataset cifar10 --data-dir ~/data --method loss
  cptsim sensitivity --json > sens.json           the document 'cptsim plan --per-layer --sensitivity' reads
  cptsim sensitivity --db results.db              also store the per-layer values in the results database

\b
Methods (each row of the table gives both, and each method's time):
  hessian  Hutchinson's trace of each layer's Hessian block (double backward, full precision), times
           ||Q_qmin(W) - W||^2 / n: HAWQ-V3's perturbation, the expected loss increase at q_min
  loss     the loss increase when that layer alone runs at q_min and the rest at q_max (forward passes only)
The weights (each method's values clipped at 0 and normalised to sum 1) are what the per-layer planner uses.
With --number-format fp|mx|nvfp both methods probe in the formats q_min and q_max name (mx: --q-min 4 is MXFP4).
"""


@click.command(epilog=_EPILOG)
@workload_options("model", "dataset", "data_dir", "batch_size", "fp_layers", "number_format", "grad_format")
@click.option("--q-min", type=int, default=2, show_default=True, help="Low precision a layer is probed at.")
@click.option("--q-max", type=int, default=8, show_default=True, help="Precision of every other layer.")
@click.option("--g-bits", type=int, default=8, show_default=True, help="Gradient bits of the warm-up training.")
@click.option("--warmup", type=int, default=50, show_default=True,
              help="Training steps at static q_max before measuring (sensitivity at initialisation says little).")
@click.option("--batches", type=int, default=4, show_default=True, help="Fixed training batches measured on.")
@click.option("--samples", type=int, default=16, show_default=True, help="Hutchinson Rademacher vectors.")
@click.option("--method", "methods", default="hessian,loss", show_default=True, help="hessian, loss or both.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--db", default=None, help="Store the result in this results database (sensitivity table).")
@json_option
def sensitivity(model, dataset, data_dir, batch_size, fp_layers, number_format, grad_format, q_min, q_max, g_bits,
                warmup, batches, samples, methods, seed, db, as_json) -> None:
    """Measure per-layer sensitivity to low precision (Hutchinson Hessian trace and one-layer loss increase)."""
    from cptsim.study.sensitivity import Settings, measure

    s = Settings(model=model, dataset=dataset, data_dir=data_dir, batch_size=batch_size, q_min=q_min, q_max=q_max,
                 g_bits=g_bits, warmup=warmup, batches=batches, samples=samples, seed=seed,
                 methods=tuple(m.strip() for m in methods.split(",") if m.strip()),
                 fp_layers=parse_fp_layers(fp_layers), number_format=number_format, grad_format=grad_format)
    s.validate()
    if not as_json:
        err.print(f"measuring {model}: {warmup} warm-up steps, then {', '.join(s.methods)} ...")
    doc = measure(s)
    if db:
        from cptsim.study.results import ResultsDB, record_sensitivity

        doc["db"] = {"path": str(db), "rows": record_sensitivity(ResultsDB(db), doc)}
    if as_json:
        emit_json(doc)
        return
    nf = doc.get("number_format")  # a float family: the formats q_min and q_max ran
    lo, hi = (f"{q_min} ({nf['q_min_format']})", f"{q_max} ({nf['q_max_format']})") if nf else (q_min, q_max)
    t = Table(title=f"{doc['model']} on {doc['dataset']}: sensitivity at q_min {lo} (others at {hi})",
              title_justify="left")
    for c in ("layer", "params", "tr(H)", "hessian Ω", "w (hessian)", "loss +", "w (loss)"):
        t.add_column(c, justify="left" if c == "layer" else "right")
    mw = {m: doc["methods"][m]["weights"] for m in doc["methods"]}
    for r in doc["layers"]:
        f = lambda k: "-" if r.get(k) is None else f"{r[k]:.4g}"  # noqa: E731
        t.add_row(r["name"], str(r["params"]), f("hessian_trace"), f("hessian"),
                  f"{mw['hessian'][r['name']]:.3f}" if "hessian" in mw else "-", f("loss"),
                  f"{mw['loss'][r['name']]:.3f}" if "loss" in mw else "-")
    console.print(t)
    costs = "; ".join(f"{m}: {v['time_s']:.2f} s" for m, v in doc["methods"].items())
    console.print(f"cost: warm-up {doc['warmup_s']:.2f} s; {costs}" +
                  (f"; stored in {db}" if db else ""), highlight=False)

"""`cptsim plan`: search precision schedules for the best one whose estimated cost fits a budget; write plan.json."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from cptsim.errors import InputError
from cptsim.planner.budget import BUDGET_HELP
from cptsim.planner.score import SCORE_HELP
from cptsim.study.plots import plot_frontier

from .common import (check_output_file, emit_json, err, json_option, out, parse_fp_layers, print_table, si,
                     wide_option, workload_options)

DEFAULT_HW = "bitfusion"

_EPILOG = f"""\b
Examples:
  cptsim plan --budget 65%                               digits-cnn on digits, 15 epochs, BitOPs, bitfusion
  cptsim plan --budget 65% --metric energy --hw bitfusion --plot plan.png
  cptsim plan --budget 2h --hw a100 --model resnet20 --dataset cifar10 --batch-size 128 --steps 64000
  cptsim plan --budget 60% --schedules cos-rep,rex-rep --cycles 8,32 --q-min 3-4 --q-max 8
  cptsim plan --budget 65% --min-bits auto --pilot 4     range test for q_min; pilot-train 4 different candidates
  cptsim plan --budget 65% --quality db                  rank by accuracy predicted from measured runs
  cptsim plan --budget 50% --per-layer --sensitivity loss per-layer offsets of the best schedules (a MILP),
                                                         weighted by measured one-layer loss increase
                                                         (cptsim sweep fills the database)
  cptsim train --plan plan.json                          train exactly what was planned

{BUDGET_HELP}

Which plan: among the candidates whose estimated cost on the budget's metric fits the budget, the highest
score; ties go to the cheaper. The estimate is cptsim's one cost model (as 'cptsim cost'), so a plan's
estimate is always within its budget. A budget below the cheapest candidate exits 2 naming that candidate
and its cost. A budget that covers the static-q_max cost plans static q_max (the most precise schedule in
the space); --prefer-cyclic plans the best cyclic schedule instead. The space offers every static width
from the lowest q_min to the highest q_max: a static schedule below q_max is often the best buy.

Evaluation: every run is evaluated at its schedule's q_max after BatchNorm statistics and activation ranges
are re-estimated at q_max (16 training batches, no gradient; 'cptsim train --recal-batches'). The statistics a
model carries belong to the precision it last trained at: without this, a schedule ending at q_min scored 24%
instead of 92% on MNIST. So schedules may end low, as one-cycle triangular ones do, and are judged fairly.

Checked against measured runs (benchmarks/quality_check.py, results in benchmarks/results/quality-digits.db): on
digits-cnn at forward bits 2-4, 3 epochs, 14 schedules at equal BitOPs x 3 seeds, the score's Spearman rank
correlation with measured accuracy is reported there (it must be >= 0.5; tests/test_quality.py checks it).

--quality db ranks by a model fitted to measured runs of the same workload in the results database
(monotone-linear/2: accuracy rises with score, mean bits, cost and the share of the work above the lowest
width measured; coefficients by non-negative least squares; +- from bootstrap refits and seed spread), and falls
back to the score below 5 measured schedules. Per-layer runs count too, by their plans' MAC-weighted features,
and --per-layer ranks its plans by the model where they lie inside the measured range.
It fits the runs' VALIDATION accuracy (a language model: validation loss), never their test accuracy: 'cptsim
sweep' holds out --val-split 0.2 of the training data by default and records it; runs without one are left out.
A candidate outside the range of the features that was measured gets no prediction ("outside
fit") and keeps its place by the score; the model re-orders only the candidates inside that range.

Hardware: BitOPs do not depend on it; energy and latency do, and often not smoothly -- an H100 runs every
width up to 8 bits on its int8 tier, so its latency and energy do not fall below 8 bits and a latency budget
under the static-8 cost is infeasible (the message says why). The default --hw is bitfusion (Sharma et
al., ISCA 2018), an accelerator whose fused 2-bit bricks run narrower operands faster and with less
energy, so the energy and latency columns show what low precision can buy; name your own hardware for
energy or latency budgets.

{SCORE_HELP}

The plan file (--out, default plan.json; never overwritten without --force) holds the workload, hardware
(name and content hash), budget, the chosen schedule and its estimate by phase and layer, the static-q_max
baseline, the alternatives, the cost-vs-score Pareto frontier and notes.
"""


@click.command("plan", epilog=_EPILOG)  # its short help is in cli/main.py's table
@click.option("--budget", required=True, help="NUMBER UNIT: 65%, 2.5e17bitops, 500kJ, 3h (grammar below).")
@click.option("--metric", type=click.Choice(["bitops", "energy", "latency"]), default=None,
              help="What a % budget is a fraction of [default: bitops; an absolute unit picks its own metric].")
@click.option("--hw", "--hardware", "hw", default=DEFAULT_HW, show_default=True,
              help="Target hardware profile (name or .toml path) for energy and latency.")
@workload_options("model", "dataset", "data_dir", "image_size", "batch_size", "epochs", "steps")
@click.option("--dataset-size", type=int, default=None,
              help="Samples per epoch, for data not at hand [default: counted in --data-dir, else the full train "
                   "split's size]; one that contradicts the data found is an error (exit 2).")
@workload_options("lr")
@click.option("--momentum", type=float, default=0.9, show_default=True)
@click.option("--weight-decay", type=float, default=5e-4, show_default=True)
@click.option("--lr-schedule", type=click.Choice(["step", "cosine", "constant"]), default="cosine",
              show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@workload_options("optimizer", "lr_min", "quant_agg", "fp_layers")
@workload_options("number_format", "grad_format")
@click.option("--no-augment", is_flag=True, help="Turn off random crop / flip in training.")
@click.option("--schedules", default=None, help="Schedules to search, comma-separated, or 'all' [default: all 11].")
@click.option("--cycles", default=None, help="Cycle counts, e.g. 1,2,4 or 1-8 [default: 1,2,4,8,16,32,64].")
@click.option("--q-min", default=None, help="q_min range LOW-HIGH or one value [default: 2-8].")
@click.option("--q-max", default=None, help="q_max range LOW-HIGH or one value [default: 4-8].")
@click.option("--g-bits", default=None, help="Gradient bits: G static, GMIN-GMAX cyclic, comma list [default: 8].")
@click.option("--min-bits", default=None, help="Lowest forward bits allowed: N, or auto (runs the range test).")
@click.option("--max-bits", default=None, help="Highest forward bits allowed.")
@click.option("--range-steps", type=int, default=None,
              help="Steps per precision for --min-bits auto [default: one epoch].")
@click.option("--prefer-cyclic", is_flag=True,
              help="When the budget covers static q_max, plan the best cyclic schedule instead.")
@click.option("--quality", type=click.Choice(["proxy", "db"]), default="proxy", show_default=True,
              help="Rank by the proxy score, or by accuracy predicted from measured runs in the results database.")
@click.option("--db", default=None, help="Results database for --quality db and pilot runs "
                                         "[default: $CPTSIM_DB or ~/.local/share/cptsim/results.db].")
@click.option("--pilot", type=int, default=0, show_default=True,
              help="Rank K genuinely different candidates (best of each family, incl. static and CPT's own) by real "
                   "short training runs on a validation split of the training data (successive halving).")
@click.option("--pilot-steps", type=int, default=None,
              help="Steps of the first pilot round [default: steps / 4, at least two epochs].")
@click.option("--pilot-dir", default=None, help="Keep the pilot runs here [default: a temporary directory, removed].")
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda, for --pilot and --min-bits auto.")
@click.option("--top", type=int, default=10, show_default=True, help="Alternatives to list and record.")
@click.option("--out", "out_path", default="plan.json", show_default=True, help="Plan file to write.")
@click.option("--force", is_flag=True, help="Overwrite an existing --out file.")
@click.option("--plot", default=None, help="Write a PNG of the cost-vs-score Pareto frontier here.")
@click.option("--quiet", is_flag=True, help="No progress on stderr.")
@click.option("--per-layer", is_flag=True,
              help="Also plan per-layer precision: each quantized layer takes an offset -2..+2 of the schedule's "
                   "range (tied: a downsample conv and its block's first conv), chosen by a MILP "
                   "(scipy.optimize.milp) to maximise the sensitivity-weighted score within the budget, around "
                   "the best uniform schedules; kept only where it scores above the uniform choice. plan.json "
                   "records the rules (train --plan runs them), the solver's gap and time and the comparison.")
@click.option("--sensitivity", "sensitivity_src", default="none", show_default=True,
              help="Layer weights for --per-layer: none (equal), hessian or loss (measured now: 'cptsim "
                   "sensitivity' on this workload), db:hessian / db:loss (the newest in --db), or a JSON file "
                   "from 'cptsim sensitivity --json'.")
@click.option("--channels-last", is_flag=True,
              help="The run will train in NHWC memory format (train --channels-last follows the plan); a GPU prices "
                   "its convolutions and batch norms by it. Default NCHW, PyTorch's default.")
@wide_option
@json_option
def plan(budget, metric, hw, model, dataset, data_dir, image_size, batch_size, epochs, steps, dataset_size, lr, momentum,
         weight_decay, lr_schedule, seed, optimizer, lr_min, quant_agg, fp_layers, number_format, grad_format,
         no_augment, schedules, cycles, q_min, q_max, g_bits, min_bits,
         max_bits, range_steps, prefer_cyclic, quality, db, pilot, pilot_steps, pilot_dir, device, top, out_path,
         force, plot, quiet, per_layer, sensitivity_src, channels_last, as_json) -> None:
    """Search cyclic-precision schedules for the best one whose estimated cost on the target hardware fits the
    budget, show the top candidates, and write plan.json for 'cptsim train --plan'."""
    from cptsim.cost.hardware import load_profile
    from cptsim.planner.budget import parse_budget
    from cptsim.run.planfile import write_plan
    from cptsim.planner.search import Workload, plan as make_plan, range_settings
    from cptsim.study.evidence import LocalEvidence
    from cptsim.planner.space import parse_space

    # Everything that can be wrong with the flags is checked before any work.
    bud = parse_budget(budget, metric)
    space = parse_space(schedules, cycles, q_min, q_max, g_bits, min_bits, max_bits)
    for flag, v, low in (("--top", top, 1), ("--pilot", pilot, 0), ("--pilot-steps", pilot_steps, 1),
                         ("--range-steps", range_steps, 1)):
        if v is not None and v < low:
            raise InputError(f"{flag} must be at least {low}, got {v}")
    if pilot == 1:
        raise InputError("--pilot K needs K >= 2 candidates to compare (0 = rank by the score)")
    src = (sensitivity_src or "none").strip()
    if src not in ("none", "hessian", "loss", "db:hessian", "db:loss") and not Path(src).is_file():
        raise InputError(f"--sensitivity {src!r}: not none, hessian, loss, db:hessian, db:loss or a readable "
                         "'cptsim sensitivity --json' file")
    if src != "none" and not per_layer:
        raise InputError("--sensitivity weighs the layers of --per-layer; add --per-layer")
    target = Path(out_path)
    if target.exists() and not force:
        raise InputError(f"{target} already exists; pass --force to overwrite it or pick another --out")
    check_output_file("--out", target)
    if plot:
        check_output_file("--plot", plot)
    if plot and target.resolve() == Path(plot).resolve():
        raise InputError("--plot and --out name the same file")
    hardware = load_profile(hw)
    from cptsim.numerics.families import format_map

    # unknown names, --grad-format without a float family, a float family on an integer-only accelerator: refused
    # here, before the profiling step
    hardware.with_formats(format_map(number_format, grad_format))
    show = not (quiet or as_json)

    with err.status(f"profiling {model}: one training step ...") if show else _nothing():
        from .common import batch_size_or_default

        workload = Workload.build(model=model, dataset=dataset, data_dir=data_dir,
                                  batch_size=batch_size_or_default(batch_size, dataset, model),
                                  epochs=epochs, steps=steps, dataset_size=dataset_size,
                                  fp_layers=parse_fp_layers(fp_layers), lr=lr, lr_schedule=lr_schedule,
                                  momentum=momentum, weight_decay=weight_decay, seed=seed, augment=not no_augment,
                                  image_size=image_size, channels_last=channels_last, optimizer=optimizer,
                                  lr_min=lr_min, quant_agg=quant_agg, number_format=number_format,
                                  grad_format=grad_format)
    rt = None
    if space.min_bits_auto:
        from .rangetest_view import print_result, run_with_progress

        from cptsim.study.rangetest import RangeTestSettings

        settings = RangeTestSettings(**range_settings(workload, space, range_steps, device))
        settings.validate()
        rt = run_with_progress(settings, show=show)
        if not as_json:
            print_result(rt)

    def on_pilot(ev: dict) -> None:
        if show and ev["event"] == "done":
            err.print(f"pilot round {ev['round'] + 1}: {ev['schedule']} {ev['steps']} steps -> validation "
                      f"{_pilot_figure(ev)} @ {ev['eval_bits']} bits ({_pilot_time(ev)})", highlight=False)

    result = make_plan(workload, hardware, bud, space, prefer_cyclic=prefer_cyclic, top=top, pilot=pilot,
                       pilot_steps=pilot_steps, pilot_dir=pilot_dir, device=device, range_test=rt,
                       on_pilot=on_pilot, quality=quality, db=db, evidence=LocalEvidence())
    doc = result.to_json()
    doc.update(plan_sureness(result))
    if result.estimate.formats is not None:  # the formats the chosen schedule's widths name, and the GPU tiers
        doc["number_format"] = result.estimate.formats
    if per_layer:
        from cptsim.planner.perlayer import plan_doc_with_layers, refine

        weights = _layer_weights(sensitivity_src, workload, db, show)
        lp, rows = refine(result, weights)
        doc = plan_doc_with_layers(doc, result, lp, rows, sensitivity_src)
        if show:
            pl = doc["per_layer"]
            err.print(f"per-layer: {'chosen' if pl['chosen'] else 'not chosen'}; " + (
                f"{pl['layers']['text'] or '(no offsets)'} score {pl['score']:.4f} vs uniform "
                f"{pl['uniform_score']:.4f}, MILP {pl['solver']['status']} gap {pl['solver']['mip_gap']:.2g} in "
                f"{pl['solver']['time_s']:.3f} s" if pl["chosen"] else pl["why"]), highlight=False)
    if target.exists() and not force:  # appeared while we searched
        raise InputError(f"{target} already exists; pass --force to overwrite it or pick another --out")
    write_plan(doc, target)
    if plot:
        plot_frontier(result, plot)
    if as_json:
        emit_json(doc)
        return
    print_plan(result, doc)
    out.print(f"plan written to {target}" + (f", frontier plot to {plot}" if plot else "") +
              f"; train it with: cptsim train --plan {target}", highlight=False)


def _layer_weights(src: str, workload, db, show: bool) -> dict | None:
    """--sensitivity: None (equal weights), measured now, from the results database, or from a file."""
    src = (src or "none").strip()
    if src == "none":
        return None
    if src in ("hessian", "loss"):
        from cptsim.study.sensitivity import Settings, measure

        if show:
            err.print(f"measuring per-layer sensitivity ({src}) ...")
        doc = measure(Settings(model=workload.model, dataset=workload.dataset, data_dir=workload.data_dir,
                               batch_size=workload.batch_size, fp_layers=workload.fp_layers or [],
                               methods=(src,), number_format=workload.number_format,
                               grad_format=workload.grad_format))
        return doc["methods"][src]["weights"]
    if src.startswith("db:"):
        from cptsim.study.results import ResultsDB, sensitivity_weights

        method = src[3:]
        family = workload.number_format or "int"
        got = sensitivity_weights(ResultsDB(db), workload.model, method, family)
        if got is None:
            fam = "" if family == "int" else f" --number-format {family}"
            raise InputError(f"--sensitivity {src}: the results database holds no {method} sensitivity of "
                             f"{workload.model} in the {family} family; run 'cptsim sensitivity --model "
                             f"{workload.model}{fam} --db ...' first")
        return got
    import json

    try:
        doc = json.loads(Path(src).read_text())
        methods = doc["methods"]
        method = "hessian" if "hessian" in methods else next(iter(methods))
        if doc.get("model") not in (None, workload.model):
            raise InputError(f"--sensitivity {src} was measured on {doc.get('model')}, not {workload.model}")
        return methods[method]["weights"]
    except (OSError, ValueError, KeyError, StopIteration, TypeError):
        raise InputError(f"--sensitivity {src!r}: not none, hessian, loss, db:METHOD or a readable "
                         "'cptsim sensitivity --json' file") from None


def plan_sureness(p) -> dict:
    """How sure the plan's times are, as ``cost`` says it (``timing.time_sureness``: the profile's [validation]
    against this network's op mix, and on a GPU with a measured host overhead whether an eager step is
    launch-bound), and, for a time budget, the pick's margin against the profile's error (``budget_margin``)."""
    from cptsim.planner.budget import time_margin

    from .timing import time_sureness

    prof = p.workload.profile
    doc = time_sureness(p.hardware, prof, prof.op_mix(), p.estimate)
    if p.metric == "latency":
        doc["budget_margin"] = time_margin(p.budget, p.chosen_cost, p.budget_absolute, doc["time_validation"],
                                           p.hardware.name)
    return doc


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _pilot_time(rec: dict) -> str:
    return "reused from --pilot-dir" if rec.get("reused") else f"{rec['time_s']:.1f} s"


def _pilot_figure(rec: dict) -> str:
    """A pilot run's ranking measure: perplexity for a language model (lower is better), else accuracy."""
    if "val_ppl" in rec:
        return f"ppl {rec['val_ppl']:.2f}" + (f" ({rec['val_bpc']:.3f} bpc)" if "val_bpc" in rec else "")
    return f"acc {100 * rec['val_acc']:.1f}%"


_RANKED_BY = {"pilot": "pilot runs (validation accuracy, or perplexity for a language model)",
              "db": "validation accuracy (or loss) predicted from measured runs"}


def _pct(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.1f}%" if abs(x) >= 1e-3 or x == 0 else f"{100 * x:.2g}%"


def _predicted_cell(a: dict) -> str:
    """--quality db's prediction for one alternative: validation accuracy, or validation loss (a language model)."""
    if a.get("extrapolated"):
        return "outside fit"
    if a.get("predicted_val_loss") is not None:
        return f"loss {a['predicted_val_loss']:.3f} ± {a['predicted_std']:.3f}"
    if a.get("predicted_acc") is not None:
        return f"{100 * a['predicted_acc']:.1f} ± {100 * a['predicted_std']:.1f}%"
    return "-"


_UNIFORM = "u"  # the table's mark of the best uniform schedule when a per-layer plan replaced it


def _per_layer(doc: dict) -> bool:
    """Whether plan.json holds a per-layer plan (a schedule and layer rules that replace the uniform pick)."""
    return isinstance(doc.get("layers"), dict)


def chosen_text(doc: dict) -> str:
    """What plan.json holds, as `cptsim train --plan` will run it: the schedule, and a per-layer plan's layer rule."""
    text = doc["schedule"]["text"]
    ran = (doc.get("number_format") or {}).get("run")
    if ran:  # a float family: the text form alone reads as integers
        fwd = list(dict.fromkeys(ran["forward"].values()))
        grad = list(dict.fromkeys(ran["gradient"].values()))
        text += f" in {'/'.join(fwd)}" + ("" if grad == fwd else f", gradients {'/'.join(grad)}")
    if _per_layer(doc):
        text += f" with layer rule {doc['layers'].get('text') or '(none)'}"
    return text


def print_plan(p, doc: dict) -> None:
    """The top candidates, the chosen one highlighted, then baseline and notes."""
    from cptsim.planner.budget import format_quantity
    from cptsim.planner.search import METRIC_NAMES

    w = p.workload
    layered = _per_layer(doc)
    what = METRIC_NAMES[p.metric]
    base = p.baseline_schedule.to_text()
    # an absolute budget is its own figure; a relative one's is said in the unit the notes and the margin use
    t = Table(title=f"plan: {w.describe()}; {p.hardware.name}; budget {p.budget.describe()}"
                    + ("" if not p.budget.relative else f" = {si(p.budget_absolute)} BitOPs" if p.metric == "bitops"
                       else f" = {format_quantity(p.metric, p.budget_absolute)}"),
              title_justify="left",
              caption=f"{len(p.candidates)} candidates; n = cycles, bits = mean forward bits"
                      + (" (the schedule's nominal widths; BitOPs count each format's element bits)"
                         if doc.get("number_format") else "")
                      + f", budget = % of the budget used, static = {what} as % of {base}; "
                      f"ranked by {_RANKED_BY.get(p.ranking, 'score')}"
                      + (f"; {_UNIFORM}1 = the best uniform schedule, which the per-layer plan below replaces"
                         if layered else ""),
              caption_justify="left", box=None, pad_edge=False, collapse_padding=True, padding=(0, 1),
              header_style="bold underline")
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("schedule", no_wrap=True)
    predicted = p.ranking == "db"
    for col in ("n", "bits", "BitOPs", "energy", "latency", "budget", "static", "score") + (
            ("predicted val",) if predicted else ()):
        t.add_column(col, justify="right", no_wrap=True)
    for a in p.alternatives:
        if a["role"] == "cheapest":
            t.add_section()
        chosen = a["role"] == "chosen"
        label = "min" if a["role"] == "cheapest" else str(a["rank"])
        mark = (_UNIFORM if layered else ">") if chosen else ""
        t.add_row(mark + label, a["schedule"],
                  "-" if a["name"] == "static" else str(a["cycles"]), f"{a['mean_bits']:.2f}",
                  si(a["bitops"]), si(a["energy_j"], "J"), si(a["latency_s"], "s"), _pct(a["budget_fraction"]),
                  _pct(a["vs_baseline"]), f"{a['score']:.4f}",
                  *((_predicted_cell(a),) if predicted else ()),
                  style=("green" if layered else "bold green") if chosen else None)
    budgeted = {"bitops": "BitOPs", "energy": "energy", "latency": "latency"}[p.metric]  # never left out
    print_table(t, drop=tuple(c for c in ("n", "static", "bits", "latency", "energy", "BitOPs") if c != budgeted))
    est, b = doc["estimate"], doc["baseline"]
    out.print(f"[bold]chosen[/]: {chosen_text(doc)}: {si(est['bitops']['total'])} BitOPs, "
              f"{si(est['energy_j'], 'J')}, {si(est['latency_s'], 's')} on {p.hardware.name}; "
              f"{_pct(est['budget_fraction'])} of the budget, score {est['score']:.4f}"
              + (f" (per-layer; the best uniform schedule, row {_UNIFORM}1, scored {p.score:.4f})"
                 if _per_layer(doc) else ""), highlight=False)
    out.print(f"baseline {base}: {si(b['bitops']['total'])} BitOPs, {si(b['energy_j'], 'J')}, "
              f"{si(b['latency_s'], 's')}", highlight=False)
    from .timing import sureness_lines

    for line in sureness_lines(p.hardware.name, doc):
        out.print(line, highlight=False, markup=False)  # [validation] is text, not markup
    if doc.get("budget_margin"):
        out.print(f"budget margin: {doc['budget_margin']['text']}", highlight=False, markup=False)  # text, not markup
    q = p.quality or {}
    if q.get("name"):
        loo = q.get("loo_spearman")
        out.print(f"quality model {q['name']}: fitted to the {(q.get('measure') or {}).get('name', 'measure')} of "
                  f"{q['runs']} measured runs of {q['schedules']} schedules in {q['db']}" + ("" if loo is None else f"; leave-one-schedule-out Spearman {loo:.2f}"),
                  highlight=False)
    if p.pilot:
        for r in p.pilot["rounds"]:
            accs = ", ".join(f"{x['schedule']} {_pilot_figure(x)}" for x in r["runs"])
            test = ""
            if r.get("p_value") is not None:  # McNemar's exact test on the samples the cut's two sides disagree on
                test = (f"; McNemar {r['kept_only']} vs {r['dropped_only']} disagreements, p = {r['p_value']:.3g}"
                        + ("" if r.get("resolvable_gap") is None else
                           f" (resolves gaps >= {100 * r['resolvable_gap']:.1f} points)"))
            out.print(f"pilot round {r['round'] + 1} ({r['steps']} steps): {accs}{test}"
                      f"{'' if r['separated'] else ' - not separated'}", highlight=False)
    for n in doc.get("notes", p.notes):
        out.print(f"[yellow]note:[/] {n}", highlight=False)

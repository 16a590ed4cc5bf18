"""Issue 26 item 5 through `cptsim sweep`: number formats side by side at about equal cost, modelled on a B200.

One `cptsim sweep` per number-format family (a sweep's --number-format / --grad-format are workload settings: every
entry of one sweep runs in the same family, and the results database keys each family as its own workload), all into
one results database; then `cptsim report RUN... --hw b200 --json` re-counts every finished run in the formats it
ran, and this script lays the sweeps' results side by side: test accuracy (digits) or test perplexity (LM) over the
seeds, and the modelled B200 time / energy of the whole run and of the quantized layers' GEMMs alone.

    python benchmarks/bench_formats_sweep.py --workload digits --root runs/fmt-digits            # train + table
    python benchmarks/bench_formats_sweep.py --workload lm --steps 200 --root runs/fmt-lm --table  # table only

Recipes (schedule, family, gradient format):
  BF16            static:16:g16       mx (9..16 bits name bf16 in every float family)
  FP8             static:8:g8         fp, --grad-format fp8e5m2 (E4M3 forward, E5M2 errors)
  MXFP8           static:8:g8         mx (digits only)
  MXFP4           static:4:g8         mx (MXFP8 errors)
  MX cycle 4-8    cos-rep:4-8:g8:n8   mx (4 MXFP4, 5-6 MXFP6, 7-8 MXFP8; MXFP8 errors)
  INT8, INT4      static:8:g8, static:4:g8      int (CPT's integers)
  INT cycle 4-8   cos-rep:4-8:g8:n8   int
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

HW = "b200"
CPTSIM = str(Path(sys.executable).with_name("cptsim"))

# sweep name -> (family, grad format, [(recipe label, schedule)])
SWEEPS = {
    "mx": ("mx", None, [("BF16", "static:16:g16"), ("MXFP8", "static:8:g8"), ("MXFP4 (MXFP8 grads)", "static:4:g8"),
                        ("MX cycle 4-8", "cos-rep:4-8:g8:n8")]),
    "fp8": ("fp", "fp8e5m2", [("FP8 (E4M3 / E5M2 grads)", "static:8:g8")]),
    "int": ("int", None, [("INT8", "static:8:g8"), ("INT4", "static:4:g8"), ("INT cycle 4-8", "cos-rep:4-8:g8:n8")]),
}
LM_SKIP = {"MXFP8", "INT8"}  # the LM's CPU budget: two recipes fewer (8-bit formats = BF16 within seeds on digits)
ORDER = ["BF16", "FP8 (E4M3 / E5M2 grads)", "MXFP8", "INT8", "MXFP4 (MXFP8 grads)", "INT4", "MX cycle 4-8",
         "INT cycle 4-8"]


def workload_flags(a) -> list[str]:
    if a.workload == "digits":
        return ["--model", "digits-cnn", "--epochs", str(a.epochs)]
    return ["--model", "transformer-lm", "--steps", str(a.steps)]


def sweep_commands(a) -> list[tuple[str, list[str]]]:
    out = []
    for name, (family, grad, recipes) in SWEEPS.items():
        scheds = [s for r, s in recipes if not (a.workload == "lm" and r in LM_SKIP)]
        cmd = ["cptsim", "sweep", *workload_flags(a), "--number-format", family]
        if grad:
            cmd += ["--grad-format", grad]
        cmd += ["--schedules", ",".join(scheds)]
        if name == "mx" and a.pick_budget:  # and the planner's pick on a B200 at this budget, trained alongside
            cmd += ["--top", "1", "--budget", a.pick_budget, "--hw", HW]
        cmd += ["--seeds", a.seeds, "--jobs", str(a.jobs), "--out", f"{a.root}/{name}", "--db", f"{a.root}/results.db"]
        out.append((name, cmd))
    return out


def run_sweeps(a) -> None:
    only = set(a.only.split(",")) if a.only else None
    for name, cmd in sweep_commands(a):
        if only is not None and name not in only:
            continue
        print("$ " + shlex.join(cmd), flush=True)
        t = time.perf_counter()
        subprocess.run([CPTSIM, *cmd[1:], "--quiet"], check=True)
        print(f"# {name}: {time.perf_counter() - t:.0f} s", flush=True)


def run_dir(root, sweep, schedule, seed) -> Path:
    return Path(root) / sweep / f"{schedule.replace(':', '_')}-s{seed}"


def _gemm_cost(run_path: Path, family: str, grad) -> dict:
    """The quantized layers' fwd/dgrad/wgrad GEMMs alone on the B200, with the cost model `cptsim report` uses
    (cptsim.cost.model.estimate on the run's trace, in its formats): on these small workloads the whole step is
    launches and non-GEMM ops, and the GEMMs are where a format's tier shows."""
    from cptsim.cost.model import estimate
    from cptsim.numerics.families import format_map
    from cptsim.run.rundir import RunDir

    run = RunDir.open(run_path)
    cost = estimate(run.read_profile(), run.read_trace().records, HW, per_layer=True, formats=format_map(family, grad))
    g = [r for r in cost.per_layer if r["quantized"]]
    return {"gemm_s": sum(r["latency_s"]["total"] for r in g), "gemm_j": sum(r["energy_j"]["total"] for r in g)}


def _label_formats(nf, schedule: str) -> str:
    if not nf:
        q = schedule.split(":")[1]
        return f"int{q} | g int8" if "-" not in q else f"int{q.replace('-', '..')} | g int8"
    f = nf["formats"]
    fwd = sorted(set(f["forward"].values()), key=lambda n: (len(n), n))
    return "/".join(fwd) + " | g " + "/".join(sorted(set(f["gradient"].values())))


def table(a) -> dict:
    seeds = [int(s) for s in a.seeds.split(",")]
    rows = []
    for name, (family, grad, recipes) in SWEEPS.items():
        recipes = [(r, sc) for r, sc in recipes if not (a.workload == "lm" and r in LM_SKIP)]
        sj = Path(a.root) / name / "sweep.json"
        if sj.is_file():  # schedules the sweep trained beyond the named recipes: the planner's pick (--top)
            named = {sc for _, sc in recipes}
            recipes += [("planner pick, B200", sc) for sc in json.loads(sj.read_text())["schedules"]
                        if sc not in named]
        for label, sched in recipes:
            dirs = [run_dir(a.root, name, sched, s) for s in seeds]
            dirs = [d for d in dirs if (d / "result.json").is_file()]
            if not dirs:
                continue
            cmd = [CPTSIM, "report", *map(str, dirs), "--hw", HW, "--json", "--no-save", "--no-calibrate"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"cptsim report failed for {label}: {r.stderr.strip()}")
            rep = json.loads(r.stdout)["runs"]
            per = []
            for d, rr in zip(dirs, rep):
                res = json.loads((d / "result.json").read_text())
                hw = next(h for h in rr["hardware"] if h["name"] == HW)
                per.append({"run": str(d), "seed": res["seed"], "test_acc": res["test_acc"],
                            "test_loss": res["test_loss"], "test_ppl": res["extra"].get("test_ppl"),
                            "train_loss": res["extra"].get("train_loss"), "bitops": rr["bitops"]["executed"]["total"],
                            "latency_s": hw["executed"]["latency_s"], "energy_j": hw["executed"]["energy_j"],
                            **_gemm_cost(d, family, grad)})
            rows.append({"recipe": label, "sweep": name, "family": family, "grad_format": grad, "schedule": sched,
                         "formats": _label_formats(rep[0].get("number_format"), sched), "runs": per})
    return {"workload": a.workload, "seeds": seeds, "hardware": HW, "rows": rows}


def render(doc: dict) -> str:
    lm = doc["workload"] == "lm"
    ref = next((r for r in doc["rows"] if r["recipe"] == "BF16"), doc["rows"][0])
    base = {k: statistics.mean(x[k] for x in ref["runs"]) for k in ("bitops", "latency_s", "energy_j", "gemm_s",
                                                                     "gemm_j")}
    key = "test_ppl" if lm else "test_acc"
    order = {n: i for i, n in enumerate(ORDER)}
    rows = sorted(doc["rows"], key=lambda r: order.get(r["recipe"], len(order)))
    head = (f"{'recipe':24} {'schedule':18} {'formats (forward | grads)':30} "
            f"{'test ppl' if lm else 'test acc %':>15} {'per seed':>21} {'test loss':>9} {'train loss':>10} "
            f"{'BitOPs':>6} {'B200 time':>9} {'energy':>6} {'GEMM time':>9} {'GEMM J':>6}")
    out = [head, "-" * len(head)]
    for r in rows:
        v = [x[key] * (1 if lm else 100) for x in r["runs"]]
        sd = statistics.stdev(v) if len(v) > 1 else 0.0
        per = " ".join(f"{x:.3f}" if lm else f"{x:.1f}" for x in v)
        m = {k: statistics.mean(x[k] for x in r["runs"]) for k in ("bitops", "latency_s", "energy_j", "gemm_s",
                                                                   "gemm_j", "test_loss", "train_loss")}
        pct = lambda k: f"{100 * m[k] / base[k]:.1f}%"  # noqa: E731
        out.append(f"{r['recipe']:24} {r['schedule']:18} {r['formats']:30} "
                   f"{statistics.mean(v):8.3f} +- {sd:4.2f} " if lm else
                   f"{r['recipe']:24} {r['schedule']:18} {r['formats']:30} {statistics.mean(v):8.2f} +- {sd:4.2f} ")
        out[-1] += (f"{per:>21} {m['test_loss']:9.4f} {m['train_loss']:10.4f} {pct('bitops'):>6} "
                    f"{pct('latency_s'):>9} {pct('energy_j'):>6} {pct('gemm_s'):>9} {pct('gemm_j'):>6}")
    out.append(f"(100% = BF16: {base['bitops']:.3g} BitOPs, {1e3 * base['latency_s']:.1f} ms and {base['energy_j']:.3g} J "
               f"per run modelled on {doc['hardware']} (cptsim report --hw {doc['hardware']}); GEMM = the quantized "
               f"layers' fwd/dgrad/wgrad GEMMs alone, {1e6 * base['gemm_s']:.0f} us and {1e3 * base['gemm_j']:.3g} mJ)")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=["digits", "lm"], default="digits")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--root", required=True)
    ap.add_argument("--table", action="store_true", help="only the table, from the finished sweeps")
    ap.add_argument("--pick-budget", default=None, help="the MX sweep also trains the planner's top schedule on a B200 "
                    "at this budget (sweep --top 1 --budget B --hw b200)")
    ap.add_argument("--only", default=None, help="comma-separated sweep names to run (mx, fp8, int)")
    ap.add_argument("--print-commands", action="store_true")
    ap.add_argument("--save-json", default=None)
    a = ap.parse_args()
    if a.print_commands:
        for _, cmd in sweep_commands(a):
            print(shlex.join(cmd))
        return
    if not a.table:
        run_sweeps(a)
    doc = table(a)
    if a.save_json:
        Path(a.save_json).write_text(json.dumps(doc, indent=1))
    print(render(doc))


if __name__ == "__main__":
    main()

"""Does the planner's pick train a model at least as good as CPT's default at the same cost? (issue 9)

Reads measured runs from a results database (default: the shipped benchmarks/results/issue9.db, filled by the two
sweeps below) and, per workload, plans at the BitOPs of CPT's default schedule exactly as a user would, then
prints the pick's and CPT default's measured accuracy over seeds, and the Spearman rank correlation between the
planner's score and measured accuracy over every schedule of the workload.

The runs were made with (each run a normal run directory; ~10-30 s per run on one core):

    cptsim sweep --epochs 3 --seeds 0,1,2 --jobs 3 --out runs/hard --db benchmarks/results/issue9.db \\
      --schedules cos-rep:2-4:g8:n1,cos-rep:2-4:g8:n2,cos-rep:2-4:g8:n8,cos-rep:2-4:g8:n32,cos-tri:2-4:g8:n1,\\
    cos-tri:2-4:g8:n4,lin-tri:2-4:g8:n1,lin-tri:2-4:g8:n2,lin-tri:2-4:g8:n8,lin-rep:2-4:g8:n1,lin-rep:2-4:g8:n8,\\
    exp-tri-v:2-4:g8:n4,rex-tri-v:2-4:g8:n2,static:3
    cptsim sweep --seeds 0,1,2 --jobs 3 --out runs/digits --db benchmarks/results/issue9.db \\
      --schedules cos-rep:3-8:g8:n32,static:5,lin-tri:3-8:g8:n1,exp-tri-v:5-8:g8:n1

    python benchmarks/quality_check.py [--db PATH] [--json] [--plot DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# (name, Workload.build kwargs, CPT default at this workload, planner space: q_min, q_max, g_bits)
WORKLOADS = [
    ("digits-cnn on digits, 3 epochs, forward bits 2-4 (accuracy not saturated)", {"epochs": 3},
     "cos-rep:2-4:g8:n32", ("2", "4", "8")),
    ("digits-cnn on digits, 15 epochs, forward bits 3-8 (the embedded default)", {"epochs": 15},
     "cos-rep:3-8:g8:n32", ("3", "8", "8")),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=str(HERE / "results" / "issue9.db"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--plot", default=None, help="write one accuracy-vs-cost PNG per workload into this folder")
    args = ap.parse_args()

    from cptsim.planner import Workload, plan
    from cptsim.planner.space import parse_space
    from cptsim.study.results import ResultsDB, workload_key
    from cptsim.cost.schedules import parse_schedule
    from cptsim.study.sweep import sweep_report

    out = []
    with ResultsDB(args.db) as db:
        for title, kw, cpt_text, (qmin, qmax, g) in WORKLOADS:
            w = Workload.build(**kw)
            key = workload_key(w.to_json())
            rows = [r for r in db.rows(workload_key=key) if r["source"] == "sweep"]
            if not rows:
                print(f"{title}: no runs in {args.db}", file=sys.stderr)
                continue
            cpt = parse_schedule(cpt_text)
            budget = w.estimate(cpt, "bitfusion").bitops["total"]
            p = plan(w, "bitfusion", f"{budget}bitops", parse_space(None, None, qmin, qmax, g, None, None))
            rep = sweep_report(rows)
            by = {t["schedule"]: t for t in rep["schedules"]}
            pick, ref = by.get(p.schedule.to_text()), by.get(cpt.to_text())
            doc = {"workload": title, "workload_key": key, "steps": w.steps, "cpt_default": cpt.to_text(),
                   "pick": p.schedule.to_text(), "pick_bitops_vs_cpt": p.estimate.bitops["total"] / budget,
                   "pick_acc": pick and [pick["acc_mean"], pick["acc_std"], pick["n"]],
                   "cpt_acc": ref and [ref["acc_mean"], ref["acc_std"], ref["n"]],
                   "pick_ok": bool(pick and ref and pick["acc_mean"] >= ref["acc_mean"] - ref["acc_std"]),
                   "spearman": rep["spearman"], "schedules": [
                       {k: t[k] for k in ("schedule", "n", "acc_mean", "acc_std", "cost_rel", "score")}
                       for t in rep["schedules"]]}
            out.append(doc)
            if args.plot:
                from cptsim.study.plots import sweep_figure
                from cptsim.run.rundir import atomic_write_bytes

                Path(args.plot).mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(Path(args.plot) / f"quality-{key}.png", sweep_figure(rep))
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    for d in out:
        print(f"\n{d['workload']} ({d['steps']} steps)")
        print(f"  {'schedule':24s} {'seeds':>5s} {'acc mean':>9s} {'std':>6s} {'BitOPs':>7s} {'score':>7s}")
        for t in sorted(d["schedules"], key=lambda t: -t["acc_mean"]):
            mark = " <- pick" if t["schedule"] == d["pick"] else " <- CPT default" if t["schedule"] == d[
                "cpt_default"] else ""
            print(f"  {t['schedule']:24s} {t['n']:5d} {100 * t['acc_mean']:8.2f}% {100 * t['acc_std']:6.2f} "
                  f"{100 * t['cost_rel']:6.1f}% {t['score']:7.4f}{mark}")
        s = d["spearman"]
        rho = "n/a" if s["rho"] is None else f"{s['rho']:.3f}"
        per = "" if s["per_seed_mean"] is None else f", per seed {s['per_seed_mean']:.3f} +- {s['per_seed_std']:.3f}"
        print(f"  Spearman(score, mean accuracy) over {s['n_schedules']} schedules: {rho}{per}")
        if d["pick_acc"] and d["cpt_acc"]:
            print(f"  pick {d['pick']} ({100 * d['pick_bitops_vs_cpt']:.1f}% of CPT default's BitOPs): "
                  f"{100 * d['pick_acc'][0]:.2f}% vs CPT default {100 * d['cpt_acc'][0]:.2f}% +- "
                  f"{100 * d['cpt_acc'][1]:.2f} -> {'OK' if d['pick_ok'] else 'WORSE'} "
                  f"(needs >= CPT mean - 1 std)")
        else:
            print(f"  pick {d['pick']}: not measured in this database")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Does the planner's pick train a model at least as good as CPT's default at the same cost? (issue 9)

Reads measured runs from a results database (default: the shipped benchmarks/results/quality-digits.db, filled by the two
sweeps below) and, per workload, plans at the BitOPs of CPT's default schedule exactly as a user would, then
prints the pick's and CPT default's measured accuracy over seeds, and the Spearman rank correlation between the
planner's score and measured accuracy over every schedule of the workload.

The runs were made with (each run a normal run directory; ~10-30 s per run on one core):

    cptsim sweep --epochs 3 --seeds 0,1,2 --jobs 3 --out runs/hard --db benchmarks/results/quality-digits.db \\
      --schedules cos-rep:2-4:g8:n1,cos-rep:2-4:g8:n2,cos-rep:2-4:g8:n8,cos-rep:2-4:g8:n32,cos-tri:2-4:g8:n1,\\
    cos-tri:2-4:g8:n4,lin-tri:2-4:g8:n1,lin-tri:2-4:g8:n2,lin-tri:2-4:g8:n8,lin-rep:2-4:g8:n1,lin-rep:2-4:g8:n8,\\
    exp-tri-v:2-4:g8:n4,rex-tri-v:2-4:g8:n2,static:3
    cptsim sweep --seeds 0,1,2 --jobs 3 --out runs/digits --db benchmarks/results/quality-digits.db \\
      --schedules cos-rep:3-8:g8:n32,static:5,lin-tri:3-8:g8:n1,exp-tri-v:5-8:g8:n1

    python benchmarks/quality_check.py [--db PATH] [--json] [--plot DIR] [--val-db PATH]

The planner's ``--quality db`` fits a run's *validation* measure, never its test accuracy (issue 22), and the runs
above recorded none (they trained on the whole training set). ``--val-db`` (default: the shipped
benchmarks/results/quality-digits-val-split.db) holds the 3-epoch bits-2-4 sweep again, with the default validation
split held out (``cptsim sweep`` does that by default now):

    cptsim sweep --epochs 3 --seeds 0,1,2 --jobs 2 --out runs/hard-val \
      --db benchmarks/results/quality-digits-val-split.db \
      --schedules (the 14 schedules above)

and this script plans that workload with ``--quality db`` from it at CPT default's BitOPs: the model's measure,
its leave-one-schedule-out Spearman, the pick, its predicted validation accuracy +- and its measured validation
and test accuracy (the test split reported here, never used to choose); then the same database asked about the
3-8 space, all of it outside the measured range, which the plan must rank by the proxy.
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
    ap.add_argument("--db", default=str(HERE / "results" / "quality-digits.db"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--plot", default=None, help="write one accuracy-vs-cost PNG per workload into this folder")
    ap.add_argument("--val-db", default=str(HERE / "results" / "quality-digits-val-split.db"),
                    help="runs with a validation split, for the --quality db check (issue 22)")
    args = ap.parse_args()
    val = quality_db_check(args.val_db) if Path(args.val_db).exists() else None

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
        print(json.dumps({"workloads": out, "quality_db": val}, indent=1))
        return 0
    if val is not None:
        print_quality_db(val)
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


def quality_db_check(db_path: str) -> dict:
    """plan --quality db on the 3-epoch bits-2-4 workload from runs with a validation split (issue 22)."""
    from cptsim.cost.schedules import parse_schedule
    from cptsim.planner import Workload, plan
    from cptsim.planner.quality import measured_workload
    from cptsim.planner.space import parse_space
    from cptsim.study.evidence import LocalEvidence
    from cptsim.study.results import ResultsDB, workload_key

    w = Workload.build(epochs=3)
    cpt = parse_schedule("cos-rep:2-4:g8:n32")
    budget = f"{w.estimate(cpt, 'bitfusion').bitops['total']}bitops"
    ev = LocalEvidence()
    p = plan(w, "bitfusion", budget, parse_space(None, None, "2", "4", "8", None, None), quality="db", db=db_path,
             evidence=ev, top=30)
    with ResultsDB(db_path) as db:
        rows = db.rows(workload_key=workload_key(measured_workload(w)))

    def measured(text):
        rs = [r for r in rows if r["schedule"] == text]
        v, t = [r["val_acc"] for r in rs], [r["test_acc"] for r in rs]
        return {"n": len(rs), "val": [statistics.mean(v), statistics.stdev(v) if len(v) > 1 else 0.0] if v else None,
                "test": [statistics.mean(t), statistics.stdev(t) if len(t) > 1 else 0.0] if t else None}

    pick = next(a for a in p.alternatives if a["role"] == "chosen")
    wide = plan(w, "bitfusion", "90%", parse_space(None, None, "3", "8", "8", None, None), quality="db",
                db=db_path, evidence=ev)
    wide_proxy = plan(w, "bitfusion", "90%", parse_space(None, None, "3", "8", "8", None, None))
    q = p.quality
    return {"db": db_path, "workload_key": q.get("workload_key"), "steps": measured_workload(w)["steps"],
            "ranking": p.ranking, "measure": q.get("measure"), "runs": q.get("runs"), "schedules": q.get("schedules"),
            "loo_spearman": q.get("loo_spearman"), "feature_range": q.get("feature_range"),
            "in_range": q.get("in_range"), "extrapolated": q.get("extrapolated"),
            "pick": p.schedule.to_text(), "pick_predicted": [pick.get("predicted_acc"), pick.get("predicted_std")],
            "pick_measured": measured(p.schedule.to_text()), "cpt_default": cpt.to_text(),
            "cpt_measured": measured(cpt.to_text()),
            "best_measured_val": max(({"schedule": s, **measured(s)} for s in {r["schedule"] for r in rows}),
                                     key=lambda d: d["val"][0]) if rows else None,
            "notes": p.notes, "space_3_8": {"budget": "90%", "ranking": wide.ranking, "pick": wide.schedule.to_text(),
                                            "proxy_pick": wide_proxy.schedule.to_text(),
                                            "in_range": wide.quality.get("in_range"),
                                            "extrapolated": wide.quality.get("extrapolated"),
                                            "notes": [n for n in wide.notes if n.startswith("--quality db")]}}


def print_quality_db(v: dict) -> None:
    pct = lambda m: "n/a" if m is None else f"{100 * m[0]:.2f} +- {100 * m[1]:.2f}%"  # noqa: E731
    print(f"\nplan --quality db from {v['db']} (digits-cnn, 3 epochs, bits 2-4, a validation split held out: "
          f"{v['steps']} steps)")
    print(f"  fitted to the {v['measure']['name']} of {v['runs']} runs of {v['schedules']} schedules; "
          f"leave-one-schedule-out Spearman {v['loo_spearman']:.3f}")
    print("  measured range: " + "; ".join(f"{k} {a:.4g}-{b:.4g}" for k, (a, b) in v["feature_range"].items()))
    print(f"  candidates within budget: {v['in_range']} inside the range, {v['extrapolated']} outside; "
          f"ranked by {v['ranking']}")
    pp = v["pick_predicted"]
    pred = "extrapolated: no prediction" if pp[0] is None else f"{100 * pp[0]:.2f} +- {100 * pp[1]:.2f}%"
    pm, cm = v["pick_measured"], v["cpt_measured"]
    print(f"  pick {v['pick']}: predicted validation accuracy {pred}; measured validation {pct(pm['val'])}, "
          f"test {pct(pm['test'])} ({pm['n']} seeds; the test split is reported, never used to choose)")
    print(f"  CPT default {v['cpt_default']}: validation {pct(cm['val'])}, test {pct(cm['test'])}")
    b = v["best_measured_val"]
    if b:
        print(f"  best measured validation accuracy: {b['schedule']} {pct(b['val'])} (test {pct(b['test'])})")
    s = v["space_3_8"]
    print(f"  the same runs asked about the 3-8 space at {s['budget']} of static 8: {s['in_range']} candidates "
          f"inside the range, {s['extrapolated']} outside -> pick {s['pick']} (the proxy alone: {s['proxy_pick']})")


if __name__ == "__main__":
    sys.exit(main())

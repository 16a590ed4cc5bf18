"""Issue 27 item 4: does a per-layer precision plan train better than uniform CPT and the best uniform static
schedule at about equal BitOPs, and at about equal modelled Bit Fusion energy? Measured with `cptsim sweep`.

Workload: digits-cnn on the embedded digits set, forward bits 2-4, 80 steps of batch 64 (about 4.5 epochs of the
training split once the sweep holds out its 20% validation split): short enough that test accuracy is not at the
ceiling (15 epochs reach about 99.4%, where one image of the 360 is 0.28% and nothing can be told apart).

What it does, every step a `cptsim` command:
  1. `cptsim cost` of uniform CPT (cpt:2-4:g8:n8) on Bit Fusion: its BitOPs and energy as % of static 4 bits;
  2. `cptsim plan --per-layer` at exactly those budgets: on BitOPs (loss-increase sensitivity, and Hessian-trace
     sensitivity) and on Bit Fusion energy (loss-increase sensitivity); each plan.json holds its layer rules;
  3. one `cptsim sweep` of every arm x seeds (--jobs 2, --threads 1): CPT, static 2/3/4, the planner's uniform
     picks at the two budgets, and the per-layer plans (--layer-plan PLAN.json);
  4. per arm: test accuracy mean +- std over seeds (and validation), executed BitOPs (the results row: each layer
     at its own bits) and modelled Bit Fusion energy of the executed trace (`cptsim.cost.estimate` with the run's
     layer plan), each also as % of CPT's.

    .venv/bin/python benchmarks/bench_perlayer_evidence.py [--workload digits|karate] [--seeds 0-4] [--steps N]
                                                           [--out DIR] [--json]

--workload lm: transformer-lm at width 64 (2 pre-LN blocks, 4 heads, dropout 0) on the embedded pydoc-chars corpus,
300 steps of 32 x 64 characters (~1.5 epochs), SGD lr 0.3 momentum 0.9 without weight decay (issue 12's recipe);
measured by test perplexity (lower is better; the text's own validation split gives the validation loss), where
the output head is by far the most sensitive layer (about half to three quarters of each method's weight).

--workload karate: GCN on Zachary's karate club (the embedded graph; 30 test nodes), 200 full-batch steps, where
one layer (convs.1.lin) holds 90% of the quantized MACs. Rerunning with the same --out reuses the plans and the
finished runs (the sweep skips them). digits: 40 runs, about 4 minutes on the 2-core VM when it is otherwise idle
(8.8 minutes measured while other sessions' jobs shared it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CPTSIM = [sys.executable, "-m", "cptsim.cli.main"]
HW = "bitfusion"
CPT = "cos-rep:2-4:g8:n8"
# the workloads: model, dataset, steps, the sweep's validation split, the test set's size (what one sample is worth)
WORKLOADS = {
    "digits": {"model": "digits-cnn", "dataset": "digits", "steps": 80, "val_split": 0.2, "test": 360,
               "what": "80 steps x batch 64"},
    # Zachary's karate club: 4 labelled nodes, the other 30 are the test set (no validation split: too few nodes);
    # GCN's default recipe (full batch, Adam, 200 steps); convs.1.lin holds 90% of the quantized MACs
    # a small character-level GPT (one run ~40 s on one thread); the recipe flags go to plan and sweep alike, so that
    # the plans are of the very workload the sweep trains (--layer-plan checks it)
    "lm": {"model": "transformer-lm:width=64,dropout=0", "dataset": "pydoc-chars", "steps": 300, "val_split": None,
           "test": None, "what": "300 steps x 32 x 64 characters", "lm": True,
           "recipe": ["--batch-size", "32", "--lr", "0.3", "--momentum", "0.9", "--weight-decay", "0"]},
    "karate": {"model": "gcn", "dataset": "karate", "steps": 200, "val_split": 0.0, "test": 30,
               "what": "200 full-batch steps"},
}
STATICS = ["static:2:g8", "static:3:g8", "static:4:g8"]


def _run(argv: list[str], what: str) -> str:
    t0 = time.perf_counter()
    p = subprocess.run(CPTSIM + argv, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{what} failed (exit {p.returncode}): {p.stderr.strip().splitlines()[-1:]}\n  {' '.join(argv)}")
    print(f"  {what}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return p.stdout


def _wl(w: dict, recipe: bool = True) -> list[str]:
    """The workload's flags; ``recipe=False``: only those that set its cost (``cptsim cost`` takes no --lr)."""
    flags = ["--model", w["model"], "--dataset", w["dataset"], "--steps", str(w["steps"])]
    extra = w.get("recipe", [])
    return flags + (extra if recipe else extra[:2])  # the batch size comes first: it sets the cost


def _cost_rel(w: dict) -> dict:
    doc = json.loads(_run(["cost", *_wl(w, recipe=False), "--schedule", CPT, "--hw", HW, "--json"], "cost of CPT"))
    return doc["profiles"][0]["vs_static"]


def _plan(out: Path, name: str, w: dict, budget: float, metric: str, sensitivity: str) -> Path:
    path = out / f"plan-{name}.json"
    if not path.is_file():
        _run(["plan", *_wl(w), "--budget", f"{100 * budget:.2f}%", "--metric",
              metric, "--hw", HW, "--q-min", "2", "--q-max", "2-4", "--per-layer", "--sensitivity", sensitivity,
              "--out", str(path), "--json"], f"plan --per-layer ({name})")
    return path


def _energy(run_path: str, hw) -> float:
    """Modelled Bit Fusion energy (J) of the run's executed trace, each layer at the bits it held."""
    from cptsim.cost.layerplan import layers_of_run
    from cptsim.cost.model import estimate
    from cptsim.cost.schedules import Schedule
    from cptsim.run.rundir import RunDir

    rd = RunDir.open(run_path)
    cfg = rd.read_config()
    sched = Schedule.from_json(cfg["schedule"])
    layers = layers_of_run(cfg, sched)
    c = estimate(rd.read_profile(), rd.read_executed().records, hw, layers=layers,
                 layer_steps=cfg["total_steps"] if layers is not None else None)
    return float(c.energy_j["total"])


def _std(xs):
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="digits")
    ap.add_argument("--seeds", default="0-4")
    ap.add_argument("--steps", type=int, default=None, help="[default: the workload's]")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=None, help="sweep directory (reused: finished runs are skipped)")
    ap.add_argument("--extra", action="append", default=[], metavar="SCHEDULE@RULES",
                    help="also sweep this entry, e.g. a hand-written per-layer plan static:3@features.7=2")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="cptsim-perlayer-evidence-"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    w = dict(WORKLOADS[args.workload])
    if args.steps is not None:
        w["steps"] = args.steps
    rel = _cost_rel(w)
    plans = {
        "per-layer, loss, = BitOPs": _plan(out, "bitops-loss", w, rel["bitops"], "bitops", "loss"),
        "per-layer, hessian, = BitOPs": _plan(out, "bitops-hessian", w, rel["bitops"], "bitops", "hessian"),
        "per-layer, loss, = energy": _plan(out, "energy-loss", w, rel["energy_j"], "energy", "loss"),
    }
    arms: dict[str, str] = {"uniform CPT": CPT} | {f"uniform {s.split(':g')[0]}": s for s in STATICS}
    from cptsim.cost.schedules import Schedule
    from cptsim.study.sweep import canonical_entry

    for label, path in plans.items():
        doc = json.loads(path.read_text())
        uni = [c["base"] for c in (doc.get("per_layer") or {}).get("candidates", [])][:1]
        if uni:  # the planner's best uniform schedule at this budget (what the per-layer MILP is laid around)
            arms.setdefault(f"planner uniform, {label.split(', ')[-1]}", uni[0])
        rules = (doc.get("layers") or {}).get("rules")
        sched = Schedule.from_json(doc["schedule"]).to_text()
        arms[label] = canonical_entry(sched, ";".join(rules) if rules else None)
    plan_entries = {arms[k] for k in plans}
    for e in args.extra:
        arms.setdefault(f"by hand: {e.split('@')[-1]}" if "@" in e else f"by hand: {e}", canonical_entry(e))
    # a text corpus has its own validation split: nothing to hold out
    vs = [] if w["val_split"] is None else ["--val-split", repr(w["val_split"])]
    sweep = ["sweep", *_wl(w), *vs, "--seeds", args.seeds, "--jobs", str(args.jobs),
             "--threads", "1", "--out", str(out / "sweep"), "--db", str(out / "results.db"), "--quiet", "--json",
             "--schedules", ",".join(s for s in dict.fromkeys(arms.values())
                                     if "@" not in s or s not in plan_entries)]
    for p in plans.values():
        sweep += ["--layer-plan", str(p)]
    command = "cptsim " + " ".join(sweep[:-2 * len(plans)]) + "".join(f" --layer-plan {p.name}" for p in plans.values())
    rep = json.loads(_run(sweep, "sweep"))
    from cptsim.cost.hardware import load_profile
    from cptsim.study.sweep import row_entry

    hw = load_profile(HW)
    by_entry: dict[str, list[dict]] = {}
    for r in rep["runs"]:
        if r["status"] == "done":
            by_entry.setdefault(r["schedule"], []).append(r)
    rows_db = {}
    from cptsim.study.results import ResultsDB

    with ResultsDB(out / "results.db") as db:
        for row in db.rows():
            rows_db[row["run_path"]] = row
    lm = bool(w.get("lm"))
    table = []
    for label, entry in arms.items():
        runs = by_entry.get(entry, [])
        rows = [rows_db[str(Path(r["path"]).resolve())] for r in runs]
        if not rows:
            continue
        if lm:  # perplexity per character: exp of the per-token loss (lower is better)
            accs = [math.exp(r["test_loss"]) for r in rows]
            vals = [math.exp(r["val_loss"]) for r in rows if r.get("val_loss") is not None]
        else:
            accs = [r["test_acc"] for r in rows]
            vals = [r["val_acc"] for r in rows if r.get("val_acc") is not None]
        energies = [_energy(r["run_path"], hw) for r in rows]
        table.append({"arm": label, "entry": row_entry(rows[0]), "n": len(rows), "seeds": [r["seed"] for r in rows],
                      "acc_mean": sum(accs) / len(accs), "acc_std": _std(accs), "accs": accs,
                      "val_mean": sum(vals) / len(vals) if vals else None, "val_std": _std(vals) if vals else None,
                      "bitops": sum(r["bitops"] for r in rows) / len(rows),
                      "energy_j": sum(energies) / len(energies)})
    ref = next(t for t in table if t["arm"] == "uniform CPT")
    for t in table:
        t["bitops_vs_cpt"] = t["bitops"] / ref["bitops"]
        t["energy_vs_cpt"] = t["energy_j"] / ref["energy_j"]
        # paired by seed against CPT: mean and std of the accuracy differences
        d = [a - ref["accs"][ref["seeds"].index(s)] for a, s in zip(t["accs"], t["seeds"]) if s in ref["seeds"]]
        t["vs_cpt_mean"], t["vs_cpt_std"] = (sum(d) / len(d), _std(d)) if d else (None, None)
    doc = {"benchmark": "perlayer_evidence", "issue": 27, "workload": args.workload, "model": w["model"],
           "dataset": w["dataset"], "steps": w["steps"], "measure": "test perplexity" if lm else "test accuracy",
           "hardware": HW, "cpt_vs_static4": rel, "seeds": args.seeds, "command": command,
           "out": str(out), "wall_s": round(time.perf_counter() - t0, 1), "arms": table,
           "plans": {k: str(v) for k, v in plans.items()}}
    if args.json:
        print(json.dumps(doc))
        return
    k = 1 if lm else 100  # perplexity as is; accuracy in %
    print(f"{w['model']} on {w['dataset']}, {w['what']}, forward bits 2-4, gradient 8; seeds {args.seeds}; "
          + ("test perplexity per character at q_max (lower is better)" if lm else
             f"test accuracy at q_max ({w['test']} test samples: 1 = {100 / w['test']:.2f}%)"))
    print(f"CPT {CPT} on {HW}: {100 * rel['bitops']:.2f}% of static-4 BitOPs, {100 * rel['energy_j']:.2f}% of its "
          "energy -- the per-layer plans' budgets")
    print(f"{'arm':30s} {'entry (schedule@layer rules)':44s} {'n':>2s} {'test ppl' if lm else 'test acc':>14s} "
          f"{'val ppl' if lm else 'val acc':>14s} "
          f"{'BitOPs':>9s} {'vs CPT':>7s} {'energy':>8s} {'vs CPT':>7s} {'paired d vs CPT':>16s}")
    for t in table:
        d = "" if t["arm"] == "uniform CPT" else f"{k * t['vs_cpt_mean']:+.2f}+-{k * t['vs_cpt_std']:.2f}"
        val = "-" if t["val_mean"] is None else f"{k * t['val_mean']:.2f}+-{k * t['val_std']:.2f}"
        print(f"{t['arm']:30s} {t['entry']:44s} {t['n']:2d} {k * t['acc_mean']:8.2f}+-{k * t['acc_std']:4.2f} "
              f"{val:>14s} {t['bitops']:9.3e} {100 * t['bitops_vs_cpt']:6.1f}% {1e3 * t['energy_j']:6.2f}mJ "
              f"{100 * t['energy_vs_cpt']:6.1f}% {d:>16s}")
    print(f"command: {command}")
    print(f"wall time {doc['wall_s']} s; runs in {out}")


if __name__ == "__main__":
    main()

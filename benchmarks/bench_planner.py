"""How fast the planner is: a whole search space for resnet20 (CIFAR shape) over 64,000 steps.

    python benchmarks/bench_planner.py [--space default|large] [--cycles 1-64] [--g-bits 6-8]
                                       [--steps 64000] [--batch-size 128] [--hw h100,bitfusion,a100]
                                       [--metrics bitops,energy,latency] [--budget 65%] [--repeats 5] [--json]

Spaces: ``default`` is the planner's default (11 schedules, cycles 1..64 in powers of two, q_min 2..8, q_max
4..8, gradient 8: 1,407 candidates); ``large`` is every cycle count 1..64 with cyclic gradient bits 6-8 (issue 13's
"10x larger" space: 12,807 candidates). ``--cycles`` / ``--g-bits`` (the plan command's text forms) override
either.

The workload is profiled once (one real training step of the quantized resnet20 on a random 3x32x32 batch; no
data needed) and that time is reported apart. Each timed figure is the median over --repeats of one whole
planning call after profiling: evaluating every candidate by the fast path on the hardware profile
(``cptsim.planner.evaluate.evaluate``) plus selecting under the budget (``select``: baseline, cheapest candidate,
the chosen one and the alternatives re-costed with ``cptsim.cost.estimate``). Every repeat is cold: the cost
model's per-schedule histogram cache and the workload's one-step cost tables (``Workload.step_costs``) are
cleared first, so each call builds its tables as a fresh ``cptsim plan`` does. An infeasible budget (e.g. latency
on an H100, where bits below 8 save nothing) is timed up to the error it raises. ``--json`` gives, per row, every
repeat's wall time besides the median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from cptsim.cost import model as cost_model
from cptsim.errors import InputError
from cptsim.cost.hardware import load_profile
from cptsim.planner.budget import parse_budget
from cptsim.planner.evaluate import evaluate
from cptsim.planner.select import select
from cptsim.planner.space import parse_space
from cptsim.planner.workload import Workload


SPACES = {"default": {}, "large": {"cycles": "1-64", "g_bits": "6-8"}}


def _one(workload, hw, budget, space):
    cost_model._schedule_hist.cache_clear()  # cold: no schedule's bits are cached from an earlier repeat
    workload.__dict__.pop("_step_costs", None)  # nor any one-step cost table (Workload.step_costs)
    t0 = time.perf_counter()
    cands = evaluate(workload, hw, space)
    t1 = time.perf_counter()
    try:
        p = select(cands, budget)
        outcome = (p.schedule.to_text(), p.budget_fraction)
    except InputError as e:
        outcome = ("infeasible", str(e))
    t2 = time.perf_counter()
    return len(cands), t1 - t0, t2 - t1, outcome


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--dataset", default="cifar10", help="shapes and epoch size only; nothing is loaded")
    ap.add_argument("--steps", type=int, default=64_000)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--hw", default="h100,bitfusion,a100")
    ap.add_argument("--metrics", default="bitops,energy,latency")
    ap.add_argument("--budget", default="65%")
    ap.add_argument("--space", choices=sorted(SPACES), default="default")
    ap.add_argument("--cycles", help="cycle counts, as the plan command takes them (overrides --space's)")
    ap.add_argument("--g-bits", help="gradient bits, as the plan command takes them (overrides --space's)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()

    t0 = time.perf_counter()
    workload = Workload.build(model=args.model, dataset=args.dataset, batch_size=args.batch_size, steps=args.steps)
    build_s = time.perf_counter() - t0
    spec = dict(SPACES[args.space])
    spec.update({k: v for k, v in (("cycles", args.cycles), ("g_bits", args.g_bits)) if v is not None})
    space = parse_space(**spec)
    rows = []
    for name in args.hw.split(","):
        hw = load_profile(name.strip())
        for metric in args.metrics.split(","):
            budget = parse_budget(args.budget, metric.strip())
            runs = [_one(workload, hw, budget, space) for _ in range(args.repeats)]
            n = runs[0][0]
            ev = statistics.median(r[1] for r in runs)
            se = statistics.median(r[2] for r in runs)
            walls = [r[1] + r[2] for r in runs]
            total = statistics.median(walls)
            chosen, detail = runs[0][3]
            rows.append({"hardware": hw.name, "metric": budget.metric, "budget": args.budget, "candidates": n,
                         "evaluate_s": ev, "select_s": se, "wall_s": total, "candidates_per_s": n / total,
                         "wall_s_runs": walls, "wall_s_min": min(walls), "wall_s_max": max(walls),
                         "chosen": chosen,
                         "budget_used": detail if chosen != "infeasible" else None,
                         "error": detail if chosen == "infeasible" else None})
    doc = {"workload": {"model": args.model, "input_shape": list(workload.input_shape), "steps": workload.steps,
                        "batch_size": workload.batch_size, "dataset_size": workload.dataset_size,
                        "layers": len(workload.profile.layers)},
           "space": {"name": args.space, **spec, "candidates": space.size()},
           "profile_s": workload.profile_s, "build_s": build_s, "repeats": args.repeats, "rows": rows,
           "max_wall_s": max(r["wall_s"] for r in rows),
           "min_candidates_per_s": min(r["candidates_per_s"] for r in rows),
           "median_candidates_per_s": statistics.median(r["candidates_per_s"] for r in rows)}
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"planner: {args.model} {tuple(workload.input_shape)}, {workload.steps} steps x "
                    f"{workload.batch_size}, {args.space} space, budget {args.budget}; median of {args.repeats}, "
                    f"after profiling ({workload.profile_s:.2f} s)", title_justify="left")
    for col in ("hardware", "metric", "candidates", "evaluate", "select", "wall", "candidates/s", "chosen", "used"):
        t.add_column(col, justify="left" if col in ("hardware", "metric", "chosen") else "right")
    for r in rows:
        t.add_row(r["hardware"], r["metric"], str(r["candidates"]), f"{r['evaluate_s'] * 1e3:.0f} ms",
                  f"{r['select_s'] * 1e3:.0f} ms", f"{r['wall_s'] * 1e3:.0f} ms", f"{r['candidates_per_s']:,.0f}",
                  r["chosen"], "-" if r["budget_used"] is None else f"{100 * r['budget_used']:.1f}%")
    Console().print(t)


if __name__ == "__main__":
    main()

"""How fast the cost model is: one schedule over 100k steps on a 100-layer model.

    python benchmarks/bench_cost.py [--steps 100000] [--layers 100] [--json]

The profile is synthetic (100 layers, CNN-like sizes, a first layer without dgrad, an FP32 classifier). Each figure
is the median of repeated timings (timeit, best-of-loop per repeat, median over repeats). "warm" means the
schedule's (q, g, samples) histogram is cached from an earlier call with the same schedule, steps, batch and
dataset size -- what the planner and `cptsim cost` get when one schedule is costed on several profiles;
"cold" includes generating the per-step bits (cptsim.cost.schedules) and the histogram.
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit

import numpy as np

from cptsim.cost import model as C
from cptsim.cost.hardware import load_profile
from cptsim.measure.profiler import LayerProfile, LayerRecord
from cptsim.cost.schedules import parse_schedule


def synthetic_profile(layers: int, seed: int = 0) -> LayerProfile:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(layers):
        m = int(rng.integers(100_000, 5_000_000))
        w, a = int(rng.integers(400, 600_000)), int(rng.integers(4_000, 70_000))
        rows.append(LayerRecord(f"layer{i}", "Conv2d", i != layers - 1,
                                {"fwd": m, "dgrad": 0 if i == 0 else m, "wgrad": m},
                                {"weight": w, "input": a, "output": a}))
    return LayerProfile("synthetic", [3, 32, 32], rows)


def _time(fn, repeats: int = 7) -> float:
    """Median seconds per call."""
    t = timeit.Timer(fn)
    n, _ = t.autorange()
    return statistics.median(t.repeat(repeat=repeats, number=n)) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--layers", type=int, default=100)
    ap.add_argument("--schedule", default="cpt:3-8:g8:n32")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--dataset-size", type=int, default=50_000)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()

    prof = synthetic_profile(args.layers)
    arrays = prof.arrays()
    sched = parse_schedule(args.schedule)
    T, B, N = args.steps, args.batch_size, args.dataset_size
    hws = {name: load_profile(name) for name in ("h100", "bitfusion", "host")}
    q, g = sched.bits(T), sched.grad_bits(T)
    trace = {"batch_size": np.full(T, B), "bits": q, "grad_bits": g}

    def est(hw=None, per_layer=False):
        return lambda: C.estimate(arrays, sched, hw, steps=T, batch_size=B, dataset_size=N, per_layer=per_layer)

    def cold(hw=None):
        def run():
            C._schedule_hist.cache_clear()
            C.estimate(arrays, sched, hw, steps=T, batch_size=B, dataset_size=N, per_layer=False)
        return run

    est()()  # fill the histogram cache
    figures = [
        ("schedule bits + grad_bits (cptsim.cost.schedules)", _time(lambda: (sched.bits(T), sched.grad_bits(T)))),
        ("(q, g, samples) histogram of those bits", _time(lambda: C.bits_histogram(q, g, B, N))),
        ("estimate, BitOPs only, warm", _time(est())),
        ("estimate, BitOPs only, cold", _time(cold())),
        ("estimate, BitOPs only, warm, per-layer rows", _time(est(per_layer=True))),
    ]
    for name, hw in hws.items():
        figures.append((f"estimate on {name} (energy + latency), warm", _time(est(hw))))
    figures.append(("estimate on h100, cold", _time(cold(hws["h100"]))))
    figures.append((f"estimate of a {T}-step trace (arrays), BitOPs only", _time(
        lambda: C.estimate(arrays, trace, None, per_layer=False))))
    figures.append(("step_cost (one trace line, per training step)", _time(lambda: C.step_cost(arrays, 5, 8, B))))
    k = len(C._schedule_hist(sched, T, B, N).count)

    res = {"steps": T, "layers": args.layers, "schedule": sched.to_text(), "distinct_step_kinds": k,
           "batch_size": B, "dataset_size": N,
           "seconds": {name: s for name, s in figures}}
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"{sched.to_text()} over {T} steps x {B} (epochs of {N}) on {args.layers} layers: "
          f"{k} distinct (q, g, samples) step kinds; medians")
    w = max(len(n) for n, _ in figures)
    for name, s in figures:
        print(f"  {name:<{w}}  {s * 1e3:9.3f} ms")


if __name__ == "__main__":
    main()

"""What the MAC counter costs a training step: counter attached vs not, and FlopCounterMode for comparison.

    python benchmarks/bench_profiler.py [--model resnet20] [--batch-size 128] [--rounds 15] [--threads N] [--json]

Two identical copies of the quantized model (8/8 bits), one with a MacCounter attached, take alternating SGD steps
on the same batch (order flipped every round, so drift on a noisy shared machine favours neither; the counter moves
to the other copy every two rounds, so a difference between the copies favours neither). Each counted
step does what the training loop does: reset(), the step, step_macs(). Figures: median step time of each, the
overhead median(with) / median(without) - 1, and the median of the per-round paired ratios. A third copy runs the
same step under torch's FlopCounterMode. A micro-benchmark times the hook itself (a 1x1 Linear called in a loop
with and without the counter), which gives the expected per-step overhead = hook cost x layer calls per step
without the step's noise.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from cptsim.numerics.layers import quantize_model
from cptsim.models import create_model
from cptsim.measure.profiler import MacCounter


def _step(model, opt, x, y, counter=None) -> float:
    t0 = time.perf_counter()
    if counter is not None:
        counter.reset()
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if counter is not None:
        counter.step_macs()
    return time.perf_counter() - t0


def _flop_counter_step(model, opt, x, y) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    t0 = time.perf_counter()
    with FlopCounterMode(display=False) as fc:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
    opt.step()
    fc.get_total_flops()
    return time.perf_counter() - t0


def _hook_cost_us(calls: int = 20000, repeats: int = 7) -> float:
    """Microseconds one counted forward call adds (median over repeats of the per-call difference)."""
    lin = nn.Linear(1, 1)
    x = torch.randn(1, 1, requires_grad=True)
    diffs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            lin(x)
        bare = time.perf_counter() - t0
        counter = MacCounter(lin)
        t0 = time.perf_counter()
        for _ in range(calls):
            lin(x)
        hooked = time.perf_counter() - t0
        counter.close()
        diffs.append((hooked - bare) / calls * 1e6)
    return statistics.median(diffs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=15, help="alternating rounds (>= 15 on a shared machine)")
    ap.add_argument("--flop-rounds", type=int, default=5, help="steps timed under FlopCounterMode")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    base = create_model(args.model, num_classes=10, in_channels=3)
    quantize_model(base).set(8, 8)
    plain, counted, flops = base, copy.deepcopy(base), copy.deepcopy(base)
    opts = {id(m): torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for m in (plain, counted, flops)}
    counter = MacCounter(counted, args.model)
    x = torch.randn(args.batch_size, 3, 32, 32)
    y = torch.randint(10, (args.batch_size,))

    for _ in range(2):  # warm-up: allocator, kernels, lazy imports
        _step(plain, opts[id(plain)], x, y)
        _step(counted, opts[id(counted)], x, y, counter)
    without, with_, paired = [], [], []
    copies, on = [plain, counted], counted
    for r in range(args.rounds):
        # The counter moves to the other copy every two rounds: a difference between the two copies themselves
        # (where their tensors landed in memory) then cancels out instead of reading as the counter's overhead.
        target = copies[1 - (r // 2) % 2]
        if target is not on:
            counter.close()
            counter, on = MacCounter(target, args.model), target
        bare = copies[(r // 2) % 2]
        if r % 2 == 0:
            a = _step(bare, opts[id(bare)], x, y)
            b = _step(on, opts[id(on)], x, y, counter)
        else:
            b = _step(on, opts[id(on)], x, y, counter)
            a = _step(bare, opts[id(bare)], x, y)
        without.append(a)
        with_.append(b)
        paired.append(b / a - 1.0)
    _flop_counter_step(flops, opts[id(flops)], x, y)  # warm-up (first use imports and builds its tables)
    flop_times = [_flop_counter_step(flops, opts[id(flops)], x, y) for _ in range(args.flop_rounds)]

    layer_calls = sum(acc[3] for acc in counter._acc)
    hook_us = _hook_cost_us()
    med_without, med_with = statistics.median(without), statistics.median(with_)
    res = {
        "model": args.model, "batch_size": args.batch_size, "rounds": args.rounds, "threads": torch.get_num_threads(),
        "step_s_without": med_without, "step_s_with_counter": med_with,
        "overhead_pct": 100 * (med_with / med_without - 1.0),
        "overhead_pct_paired_median": 100 * statistics.median(paired),
        "step_s_flop_counter_mode": statistics.median(flop_times),
        "flop_counter_mode_overhead_pct": 100 * (statistics.median(flop_times) / med_without - 1.0),
        "hook_us_per_call": hook_us, "layer_calls_per_step": layer_calls,
        "expected_overhead_pct": 100 * hook_us * 1e-6 * layer_calls / med_without,
        "macs_per_step": counter.step_macs(),
    }
    counter.close()
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"{args.model}, batch {args.batch_size}, {res['threads']} threads, {args.rounds} alternating rounds "
          f"(medians)")
    rows = [
        ("training step, no counter", f"{1e3 * med_without:.1f} ms"),
        ("training step, MacCounter attached", f"{1e3 * med_with:.1f} ms"),
        ("overhead (ratio of medians)", f"{res['overhead_pct']:+.2f}%"),
        ("overhead (median of paired rounds)", f"{res['overhead_pct_paired_median']:+.2f}%"),
        ("hook cost per layer call", f"{hook_us:.2f} us"),
        (f"expected overhead ({layer_calls} layer calls x hook)", f"{res['expected_overhead_pct']:.3f}%"),
        (f"same step under FlopCounterMode ({args.flop_rounds} steps)",
         f"{1e3 * res['step_s_flop_counter_mode']:.1f} ms ({res['flop_counter_mode_overhead_pct']:+.1f}%)"),
    ]
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{w}}  {v:>18}")


if __name__ == "__main__":
    main()

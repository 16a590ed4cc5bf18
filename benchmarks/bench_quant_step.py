"""Quantized training step vs FP32 training step, side by side in one process.

    python benchmarks/bench_quant_step.py [--model resnet20] [--batch-size 128] [--rounds 15] [--json]

Two copies of the same model (one swapped to quantized layers at 8/8 bits, one plain FP32) take alternating
SGD steps on the same batch; the figure is median(quantized step) / median(FP32 step). Alternating the two
keeps a noisy shared machine from favouring either. A third column breaks the quantized step's extra time
down by quantizer (torch.profiler self-CPU time of the fake-quantize and min/max kernels).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from cptsim.layers import quantize_model
from cptsim.models import create_model


def _step(model, opt, x, y) -> float:
    t0 = time.perf_counter()
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return time.perf_counter() - t0


def _breakdown(model, opt, x, y) -> dict[str, float]:
    """Self CPU time per op kind in one quantized step (ms)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _step(model, opt, x, y)
    groups = {"fake_quantize": 0.0, "aminmax": 0.0, "rand (stochastic rounding)": 0.0, "convolution": 0.0,
              "other": 0.0}
    for ev in prof.key_averages():
        name, ms = ev.key, ev.self_cpu_time_total / 1e3
        if "fake_quantize" in name:
            groups["fake_quantize"] += ms
        elif "aminmax" in name:
            groups["aminmax"] += ms
        elif "uniform" in name or "rand" in name:
            groups["rand (stochastic rounding)"] += ms
        elif "convolution" in name or "mkldnn" in name or "conv" in name:
            groups["convolution"] += ms
        else:
            groups["other"] += ms
    return {k: round(v, 2) for k, v in groups.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--bits", type=int, default=8)
    ap.add_argument("--grad-bits", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    torch.manual_seed(0)
    shape = (1, 8, 8) if a.model == "digits-cnn" else (3, 32, 32)
    fp = create_model(a.model, num_classes=10, in_channels=shape[0], input_shape=shape)
    q = create_model(a.model, num_classes=10, in_channels=shape[0], input_shape=shape)
    q.load_state_dict(fp.state_dict())
    quantize_model(q).set(a.bits, a.grad_bits)
    opt_fp = torch.optim.SGD(fp.parameters(), lr=0.01, momentum=0.9)
    opt_q = torch.optim.SGD(q.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(a.batch_size, *shape)
    y = torch.randint(0, 10, (a.batch_size,))

    for _ in range(3):  # warm-up: allocator, oneDNN primitive caches
        _step(fp, opt_fp, x, y)
        _step(q, opt_q, x, y)
    t_fp, t_q = [], []
    for _ in range(a.rounds):
        t_fp.append(_step(fp, opt_fp, x, y))
        t_q.append(_step(q, opt_q, x, y))
    med_fp, med_q = statistics.median(t_fp), statistics.median(t_q)
    res = {
        "model": a.model, "batch_size": a.batch_size, "bits": a.bits, "grad_bits": a.grad_bits,
        "threads": torch.get_num_threads(), "rounds": a.rounds,
        "fp32_step_ms": round(med_fp * 1e3, 2), "quant_step_ms": round(med_q * 1e3, 2),
        "ratio": round(med_q / med_fp, 3),
        "quant_breakdown_ms": _breakdown(q, opt_q, x, y),
    }
    if a.json:
        print(json.dumps(res, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{a.model}, batch {a.batch_size}, {res['threads']} threads: quantized ({a.bits}/{a.grad_bits}) vs FP32 step")
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("FP32 step (median)", f"{res['fp32_step_ms']:.1f} ms")
    t.add_row("quantized step (median)", f"{res['quant_step_ms']:.1f} ms")
    t.add_row("[bold]ratio quantized / FP32", f"[bold]{res['ratio']:.3f}x")
    for k, v in res["quant_breakdown_ms"].items():
        t.add_row(f"  quantized step: {k}", f"{v:.1f} ms")
    Console().print(t)


if __name__ == "__main__":
    main()

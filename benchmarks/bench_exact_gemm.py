"""Quantized LM training step on the exact integer GEMM path vs the FP32 fake-quant path vs FP32, in one process.

    python benchmarks/bench_exact_gemm.py [--models transformer-lm lstm-lm] [--vocab 10000] [--rounds 9]
                                          [--bits 8] [--grad-bits 8] [--threads N] [--json]

Three copies of each model with the same weights -- FP32, quantized with CPTSIM_EXACT_GEMM=0 (today's fake-quant
GEMMs), quantized with CPTSIM_EXACT_GEMM=1 (the exact int8 GEMMs of cptsim.numerics.exact_gemm) -- take alternating SGD steps on the same
batch, in an order that reverses every round; figures are medians over the rounds (3 warm-up rounds dropped) and
the ratios are to the FP32 step measured in the same rounds. Issue 28's target: exact <= 0.8x FP32 at 8 bits.

Defaults: lstm-lm is Zaremba's medium (2 x 650) on batch 20 x 35 tokens; transformer-lm is the registry default
(2 layers, width 128, 4 heads) on batch 16 x 256 tokens; vocabulary 10,000 (PTB's) for both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

from cptsim.models import create_model
from cptsim.numerics.layers import quantize_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_quant_step import _step as timed_step  # noqa: E402  one timed step for both benchmarks

SHAPES = {"lstm-lm": (20, 35), "transformer-lm": (16, 256)}


def _step(model, opt, x, y, env: str | None) -> float:
    """bench_quant_step's timed SGD step, with CPTSIM_EXACT_GEMM set to ``env`` during it."""
    if env is not None:
        os.environ["CPTSIM_EXACT_GEMM"] = env
    try:
        return timed_step(model, opt, x, y)
    finally:
        os.environ.pop("CPTSIM_EXACT_GEMM", None)


def bench(name: str, vocab: int, rounds: int, bits: int, grad_bits: int) -> dict:
    batch, T = SHAPES.get(name.split(":")[0], (16, 64))
    torch.manual_seed(0)
    copies = {}
    base = create_model(name, num_classes=vocab, input_shape=(T,))
    for key in ("fp32", "fake", "exact"):
        m = create_model(name, num_classes=vocab, input_shape=(T,))
        m.load_state_dict(base.state_dict())
        if key != "fp32":
            quantize_model(m).set(bits, grad_bits)
        m.train()
        copies[key] = (m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9), {"fake": "0", "exact": "1"}.get(key))
    x = torch.randint(0, vocab, (batch, T))
    y = torch.randint(0, vocab, (batch, T))
    times: dict[str, list[float]] = {k: [] for k in copies}
    for r in range(3 + rounds):
        for k in (list(copies) if r % 2 == 0 else list(copies)[::-1]):
            m, opt, env = copies[k]
            t = _step(m, opt, x, y, env)
            if r >= 3:
                times[k].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    paths = {n: getattr(mod, "gemm_path", None) for n, mod in copies["exact"][0].named_modules()
             if getattr(mod, "gemm_path", None)}
    return {
        "model": name, "batch": batch, "tokens": T, "vocab": vocab, "bits": bits, "grad_bits": grad_bits,
        "threads": torch.get_num_threads(), "rounds": rounds,
        "fp32_step_ms": round(med["fp32"] * 1e3, 1), "fake_quant_step_ms": round(med["fake"] * 1e3, 1),
        "exact_step_ms": round(med["exact"] * 1e3, 1),
        "fake_over_fp32": round(med["fake"] / med["fp32"], 3), "exact_over_fp32": round(med["exact"] / med["fp32"], 3),
        "exact_over_fake": round(med["exact"] / med["fake"], 3),
        "exact_over_fp32_paired_median": round(statistics.median(e / f for f, e in zip(times["fp32"], times["exact"])), 3),
        "int8_layers": sum(1 for p in paths.values() if p["forward"] == "int8-exact"), "layers": len(paths),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["transformer-lm", "lstm-lm"])
    ap.add_argument("--vocab", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--bits", type=int, default=8)
    ap.add_argument("--grad-bits", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    out = [bench(n, a.vocab, a.rounds, a.bits, a.grad_bits) for n in a.models]
    if a.json:
        print(json.dumps(out, indent=2))
        return
    for r in out:
        print(f"{r['model']:<16} FP32 {r['fp32_step_ms']:8.1f} ms  fake-quant {r['fake_quant_step_ms']:8.1f} ms "
              f"({r['fake_over_fp32']:.3f}x)  exact {r['exact_step_ms']:8.1f} ms ({r['exact_over_fp32']:.3f}x FP32, "
              f"{r['exact_over_fake']:.3f}x fake; paired {r['exact_over_fp32_paired_median']:.3f})  "
              f"int8 layers {r['int8_layers']}/{r['layers']}  [{r['threads']} threads, batch {r['batch']}x{r['tokens']}]")


if __name__ == "__main__":
    main()

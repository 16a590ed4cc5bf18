"""Quantized LM training step on the exact integer GEMM path vs the FP32 fake-quant path vs FP32, in one process.

    python benchmarks/bench_exact_gemm.py [--models transformer-lm lstm-lm] [--vocab 10000] [--rounds 9]
                                          [--bits 8] [--grad-bits 8] [--threads N] [--json]

Three copies of each model with the same weights -- FP32, quantized with CPTSIM_EXACT_GEMM=0 (today's fake-quant
GEMMs), quantized with CPTSIM_EXACT_GEMM=1 (the exact int8 GEMMs of cptsim.numerics.exact_gemm) -- take alternating SGD steps on the same
batch, in an order that reverses every round; figures are medians over the rounds (3 warm-up rounds dropped) and
the ratios are to the FP32 step measured in the same rounds. Issue 28's target: exact <= 0.8x FP32 at 8 bits.

``--convs``: whether CPU convolutions should take an int8 path (issue 28 item 1: "im2col + int8 where it measures
faster on a CPU"). For resnet20's conv shapes at batch 128: the FP32 convolution (oneDNN) against the int8 part of
an im2col path alone -- channels-last int8 codes (padded), the im2col copy (as_strided + reshape) and torch._int_mm
-- leaving out what such a path adds on top (the codes pass, the row sums, the int32 epilogue, the layout change
back). A shape where even that part is not clearly faster than the FP32 conv cannot gain. Beside them, the whole
quantized forward both ways: today's (the input's fake quantization with its range, C kernel, then the FP32 conv of
the fake-quantized values) and a working int8 one (the same quantization, cptsim's codes kernel, the codes copied
channels-last into a buffer padded with the code of 0, im2col, torch._int_mm, the row sums as a box filter of pixel
sums, cptsim's int32 epilogue, the NCHW result) -- checked against today's output.

Defaults: lstm-lm is Zaremba's medium (2 x 650) on batch 20 x 35 tokens; transformer-lm is the registry default
(2 layers, width 128, 4 heads) on batch 16 x 256 tokens; vocabulary 10,000 (PTB's) for both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
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


RESNET20_CONVS = [(16, 32, 16, 1), (16, 32, 32, 2), (32, 16, 32, 1), (32, 16, 64, 2), (64, 8, 64, 1)]  # C, H, O, stride


def _alternating_ms(fns: dict, rounds: int = 15) -> dict:
    """Median ms of each callable over rounds of one call each (3 warm-up rounds: oneDNN builds its primitives on
    a shape's first calls), the order reversed every round."""
    keys, ts = list(fns), {k: [] for k in fns}
    for r in range(3 + rounds):
        for k in (keys if r % 2 == 0 else keys[::-1]):
            t0 = time.perf_counter()
            fns[k]()
            if r >= 3:
                ts[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in ts.items()}


def convs(batch: int = 128) -> list[dict]:
    import torch.nn.functional as F

    out = []
    for C, H, O, s in RESNET20_CONVS:
        x, w = torch.randn(batch, C, H, H), torch.randn(O, C, 3, 3)
        xi = torch.randint(-128, 128, (batch, H + 2, H + 2, C), dtype=torch.int8)  # codes, padded, channels-last
        wi = torch.randint(-128, 128, (9 * C, O), dtype=torch.int8)
        Ho = (H - 1) // s + 1

        def int8_part():
            v = xi.as_strided((batch, Ho, Ho, 3, 3, C), (xi.stride(0), xi.stride(1) * s, xi.stride(2) * s,
                                                         xi.stride(1), xi.stride(2), 1))
            return torch._int_mm(v.reshape(batch * Ho * Ho, 9 * C), wi)

        today, whole = _whole_forwards(batch, C, H, O, s)
        y0, y1 = today(), whole()
        # the four side by side: rounds of one call each, the order reversed every round (a shared, noisy machine)
        fns = {"fp": lambda: F.conv2d(x, w, padding=1, stride=s), "i8": int8_part, "today": today, "whole": whole}
        ms = _alternating_ms(fns)
        out.append({"conv": f"{C}->{O} {H}x{H} s{s}", "fp32_conv_ms": round(ms["fp"], 2),
                    "im2col_int8_ms": round(ms["i8"], 2), "ratio": round(ms["i8"] / ms["fp"], 2),
                    "today_forward_ms": round(ms["today"], 2), "int8_forward_ms": round(ms["whole"], 2),
                    "int8_forward_rel_err": float((y0 - y1).abs().max() / y0.abs().max())})
        out[-1]["forward_ratio"] = round(out[-1]["int8_forward_ms"] / out[-1]["today_forward_ms"], 2)
    return out


def _whole_forwards(batch, C, H, O, s):
    """(today's quantized conv forward, a whole int8 one) at 8 bits, 3x3, padding 1 (see the module docstring)."""
    import torch.nn.functional as F

    from cptsim.numerics import ckernels, exact_gemm
    from cptsim.numerics.quant import choose_qparams, quantize_weight

    x, w = torch.randn(batch, C, H, H).relu_(), torch.randn(O, C, 3, 3)
    run = (torch.zeros(()), torch.zeros(()), torch.zeros((), dtype=torch.long))
    wq = quantize_weight(w, 8)
    lo, hi = torch.aminmax(w.reshape(O, -1), dim=1)
    sw, zw = choose_qparams(lo, hi, 8)
    wc = exact_gemm.codes(wq.reshape(O, -1), sw.unsqueeze(1), zw.unsqueeze(1)).reshape(O, C, 3, 3)
    wc = wc.permute(2, 3, 1, 0).reshape(9 * C, O).contiguous()  # (kh, kw, c) x O: im2col's column order
    cw, ow = wc.sum(0, dtype=torch.int32), exact_gemm.offset(zw).contiguous()
    Ho, K = (H - 1) // s + 1, 9 * C

    def today():
        xq, _, _ = ckernels.fake_quant_rtn_tracked(x, *run, 255, 0.9, slot="act")
        return F.conv2d(xq, wq, None, s, 1)

    def whole():
        xq, lo_, hi_ = ckernels.fake_quant_rtn_tracked(x, *run, 255, 0.9, slot="act")
        sx, zx = exact_gemm.per_tensor_qparams(lo_, hi_, 8)
        a = exact_gemm.codes(xq.view(batch * C, H * H), sx, zx)
        buf = torch.empty(batch, H + 2, H + 2, C, dtype=torch.int8)
        pad = int(zx) - 128  # the code of 0: zero padding stays exact
        for edge in (buf[:, 0], buf[:, -1], buf[:, :, 0], buf[:, :, -1]):
            edge.fill_(pad)
        buf[:, 1:-1, 1:-1].copy_(a.view(batch, C, H, H).permute(0, 2, 3, 1))
        st = buf.stride()
        cols = buf.as_strided((batch, Ho, Ho, 3, 3, C), (st[0], st[1] * s, st[2] * s, st[1], st[2], 1))
        p = torch._int_mm(cols.reshape(batch * Ho * Ho, K), wc)
        S = buf.sum(-1, dtype=torch.int32)
        ss = S.stride()
        r = S.as_strided((batch, Ho, Ho, 3, 3), (ss[0], ss[1] * s, ss[2] * s, ss[1], ss[2])).sum((-1, -2), dtype=torch.int32)
        ox = exact_gemm.offset(zx)
        u = (cw * ox + ow * (ox * K)).to(torch.int32).contiguous()
        y = torch.empty(0).set_(p.untyped_storage(), 0, (batch * Ho * Ho, O))
        y = ckernels.int_epilogue(p, r.reshape(-1).contiguous(), ow, u, (sx * sw).float().contiguous(), None, y)
        return y.view(batch, Ho, Ho, O).permute(0, 3, 1, 2).contiguous()
    return today, whole


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["transformer-lm", "lstm-lm"])
    ap.add_argument("--vocab", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--bits", type=int, default=8)
    ap.add_argument("--grad-bits", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--convs", action="store_true", help="resnet20's convs: FP32 vs the int8 part of im2col (above)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.convs:
        rows = convs()
        if a.json:
            print(json.dumps(rows, indent=2))
            return
        print(f"resnet20 convs, batch 128, forward, {torch.get_num_threads()} threads (int8 part only: no codes pass, "
              "row sums, epilogue or layout change)")
        for r in rows:
            print(f"  {r['conv']:<18} FP32 conv {r['fp32_conv_ms']:6.2f} ms   im2col + int8 GEMM {r['im2col_int8_ms']:6.2f} ms"
                  f" ({r['ratio']:.2f}x) | whole quantized forward: today {r['today_forward_ms']:6.2f} ms, int8 "
                  f"{r['int8_forward_ms']:6.2f} ms ({r['forward_ratio']:.2f}x; max error {r['int8_forward_rel_err']:.0e})")
        return
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

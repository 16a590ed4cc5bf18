"""Exact integer GEMMs for quantized Linear layers on a CPU (issue 28, item 1: Linear layers, CPU only).

A fake-quantized operand is a small integer times a scale: ``q = (k - zp) * s`` with ``k`` in ``0..2**b - 1``
(cptsim.numerics.quant: activations and errors one (s, zp) per tensor, weights one per output channel). At b <= 8
bits ``k - 128`` is an int8, so with the offset ``o = 128 - zp``

    sum_j q_ij r_jc = s_q s_r sum_j (a_ij + o_q)(b_jc + o_r)
                    = s_q s_r [ A@B  +  o_r R_i  +  o_q C_c  +  K o_q o_r ]      (R, C: row sums of A, column sums of B)

where ``A@B`` is ``torch._int_mm`` (int8 x int8 -> int32, exact) and the other terms are int32 vectors: the whole
bracket is an exact integer (|.| <= 65536 K, so K <= 32767 keeps it in int32), converted to float32 once and
scaled once. Against the FP32 fake-quant GEMM the result differs only by FP32 rounding: the fake path rounds every
product and every partial sum (error up to ~K ulp of sum |q r|), this one rounds the exact integer and the scale
product (a few ulp of the result). tests/test_exact_gemm.py checks both against a float64 integer reference.

Which GEMMs take it (``QLinear`` and every ``nn.Linear`` of the LM transforms, cptsim.numerics.lm_layers):

* forward ``y = Qa(x) Qw(W)^T``: the activation's scale is per tensor and the weight's per output channel, i.e. per
  output column: both factor out. int8 when the forward bits are <= 8.
* wgrad ``Qe(g)^T Qa(x)``: both per tensor. int8 when forward and gradient bits are both <= 8 and the tokens (the
  GEMM's K) are <= 32767.
* dgrad ``Qe(g) Qw(W)``: the weight's per-output-channel scale varies along this GEMM's K, so it does not factor
  out of the sum: this GEMM stays on today's FP32 fake-quant path (exact only with one weight scale per tensor,
  which is not cptsim's quantizer).

Everything else -- bits above 8 or 32, a non-CPU device, eval / no-grad, no C quantizer kernels, a dispatch mode,
float64 weights, convolutions, attention's activation-by-activation products -- runs today's path, per layer and
per call. The quantizers are the same calls in the same order (the stochastic rounding of the error included), so
the random stream and kill/resume exactness within a path are unchanged; the integer codes are derived from the
fake-quantized tensors (``codes``), never re-quantized.

On by default on a CPU (measured faster: benchmarks/bench_exact_gemm.py); ``CPTSIM_EXACT_GEMM=0`` turns it off
(today's FP32 fake-quant path everywhere). config.json records each layer's paths (``host.gemm_paths``,
``gemm_paths`` below); a layer's last call's paths are on the layer (``layer.gemm_path``).

Memory: the forward keeps the int8 codes of Qa(x) for wgrad (1 byte per input element) instead of re-quantizing x
in backward, and the layer keeps a float32 Qw(W) for dgrad as before.
"""

from __future__ import annotations

import os

import torch

from cptsim.numerics import ckernels
from .quant import FULL_PRECISION, choose_qparams

MAX_BITS = 8  # int8 operands
MAX_K = 32767  # the integer bracket stays inside int32 (|.| <= 65536 K)
FAKE = "fp32-fake-quant"
INT8 = "int8-exact"


def enabled() -> bool:
    """The exact path is on unless CPTSIM_EXACT_GEMM=0."""
    return os.environ.get("CPTSIM_EXACT_GEMM", "1") != "0" and hasattr(torch, "_int_mm")


def codes(q: torch.Tensor, scale: torch.Tensor, zp: torch.Tensor) -> torch.Tensor:
    """int8 ``k - 128`` of a 2-D fake-quantized ``q = (k - zp) * scale`` (scale/zp 0-d, or (rows, 1); b <= 8 bits).

    ``q / scale`` is within ~1e-4 of the integer ``k - zp`` (three float32 roundings of a value <= 255), so adding
    ``zp + 0.5`` and truncating gives ``k`` exactly. One C pass (cptsim.numerics.ckernels.codes) where the kernels
    are built, else four torch passes (truncation to uint8, then flipping the top bit is subtracting 128)."""
    inv = scale.reciprocal()
    if ckernels.usable(q) and q.dim() == 2:
        return ckernels.codes(q, inv.reshape(-1), (zp + 0.5).reshape(-1))
    u = torch.mul(q, inv).add_(zp + 0.5).to(torch.uint8)
    return u.bitwise_xor_(128).view(torch.int8)


def _ones(k: int, rows: bool) -> torch.Tensor:
    return torch.ones((8, k) if rows else (k, 8), dtype=torch.int8)


def int_linear(a: torch.Tensor, b: torch.Tensor, oa: torch.Tensor, ob: torch.Tensor, scale: torch.Tensor,
               bias: torch.Tensor | None, shape) -> torch.Tensor:
    """``float32(sum_j (a_ij + oa)(b_jc + ob_c)) * scale_c (+ bias_c)`` shaped ``shape`` (M rows of N): the int8
    GEMM, the row and column sums as int8 GEMMs against ones (VNNI too), and one C pass for the int32 bracket,
    its rounding to float32, the scale and the bias (``ckernels.int_epilogue``). K <= MAX_K."""
    K, N = b.shape
    p = torch._int_mm(a, b)
    r = torch._int_mm(a, _ones(K, False))[:, 0].contiguous()
    c = torch._int_mm(_ones(K, True), b)[0]
    o = ob.to(torch.int32).expand(N).contiguous()
    u = (c * oa + o * (oa * K)).to(torch.int32).contiguous()
    s = scale.float().expand(N).contiguous()
    bias = None if bias is None else bias.detach().contiguous()
    return ckernels.int_epilogue(p, r, o, u, s, bias, torch.empty(shape))


def offset(zp: torch.Tensor) -> torch.Tensor:
    """``o = 128 - zp`` as int32: ``q = (a + o) * scale`` for ``a = codes(q, ...)``."""
    return (128 - zp).to(torch.int32)


def int_gemm(a: torch.Tensor, b: torch.Tensor, oa: torch.Tensor, ob: torch.Tensor) -> torch.Tensor:
    """The exact int32 ``sum_j (a_ij + oa)(b_jc + ob_c)``: a (M, K) int8, b (K, N) int8 (any strides), ``oa`` a 0-d
    int32 tensor, ``ob`` 0-d or (N,) int32. K <= MAX_K."""
    K = a.shape[1]
    p = torch._int_mm(a, b)
    r = a.sum(1, dtype=torch.int32)
    c = b.sum(0, dtype=torch.int32)
    col = c.mul_(oa).add_(ob * oa * K)  # o_q C_c + K o_q o_r
    if ob.dim() == 0:
        p.add_((r * ob).unsqueeze(1))
    else:
        p.addr_(r, ob)
    return p.add_(col)


def quantized_weight_codes(wq: torch.Tensor, w: torch.Tensor, bits: int):
    """(codes, scale (out,), offset (out,)) of a per-output-channel fake-quantized weight ``wq = Qw(w)``."""
    lo, hi = torch.aminmax(w.detach().reshape(w.shape[0], -1), dim=1)
    s, zp = choose_qparams(lo, hi, bits)
    return codes(wq, s.unsqueeze(1), zp.unsqueeze(1)), s, offset(zp)


def per_tensor_qparams(lo, hi, bits: int):
    """(scale, zero point) as the quantizer computes them from a per-tensor range (floats or 0-d tensors)."""
    lo = lo if isinstance(lo, torch.Tensor) else torch.tensor(lo, dtype=torch.float32)
    hi = hi if isinstance(hi, torch.Tensor) else torch.tensor(hi, dtype=torch.float32)
    return choose_qparams(lo, hi, bits)


def forward_path(bits: int, in_features: int) -> str:
    return INT8 if bits <= MAX_BITS and in_features <= MAX_K else FAKE


def wgrad_path(bits: int, grad_bits: int, tokens: int) -> str:
    return INT8 if bits <= MAX_BITS and grad_bits != FULL_PRECISION and grad_bits <= MAX_BITS and tokens <= MAX_K \
        else FAKE


def gemm_paths(model: torch.nn.Module, device: str) -> dict:
    """What config.json records (``host.gemm_paths``): the rule, and per quantized layer the path of each GEMM at
    forward/gradient bits <= 8 (above 8 bits every GEMM is the fake-quant path)."""
    on = enabled() and str(device).startswith("cpu")
    layers = {}
    for name, m in model.named_modules():
        if not hasattr(m, "precision") or not hasattr(m, "act_count"):
            continue
        linear = getattr(m, "_exact_capable", False)
        fwd = INT8 if on and linear and m.weight.shape[-1] <= MAX_K else FAKE
        layers[name] = {"forward": fwd, "dgrad": FAKE, "wgrad": fwd}
    return {"exact_gemm": "on" if on else ("off (CPTSIM_EXACT_GEMM=0)" if not enabled() else "off (not a CPU)"),
            "rule": f"{INT8}: forward at bits <= {MAX_BITS}; wgrad at bits and grad bits <= {MAX_BITS} and <= "
                    f"{MAX_K} tokens; dgrad stays {FAKE} (per-channel weight scales lie along its K); training "
                    "only; anything else " + FAKE,
            "layers": layers}

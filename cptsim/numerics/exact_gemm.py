"""Exact GEMMs for quantized layers: int8 ``torch._int_mm`` for Linear layers on a CPU (below),
integer codes on TF32 for Conv2d and Linear layers on CUDA (section "Integer codes on TF32"), and FP8
``torch._scaled_mm`` forwards (section "FP8 forward GEMMs"). On CUDA the tensor-core routes of
cptsim.numerics.gpu_gemm (int8 ``_int_mm`` and an implicit-GEMM int8 kernel where exact, FP16 beyond) are the
default where a measurement on that GPU says they pay (cptsim.numerics.gemm_choice.cuda_choice);
``CPTSIM_EXACT_GEMM=int8`` forces them, on a CPU too (checks), and config.json records them (``gpu_gemm.gemm_paths``).

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
* wgrad ``Qe(g)^T Qa(x)``: both per tensor. int8 when forward and gradient bits are both <= 8 and the call's tokens
  (the GEMM's K) are 256..32767 (fewer measured slower than FP32 here: MIN_WGRAD_TOKENS).
* dgrad ``Qe(g) Qw(W)``: the weight's per-output-channel scale varies along this GEMM's K, so it does not factor
  out of the sum: this GEMM stays on today's FP32 fake-quant path (exact only with one weight scale per tensor,
  which is not cptsim's quantizer).

Everything else -- bits above 8 or 32, a non-CPU device (CUDA: the integer-codes section below), eval / no-grad,
no C quantizer kernels, a dispatch mode, float64 weights, convolutions (measured slower on an int8 im2col path:
benchmarks/bench_exact_gemm.py --convs), attention's activation-by-activation products -- runs today's path, per
layer and per call. The quantizers are the same calls in the same order (the stochastic rounding of the error
included), so the random stream and kill/resume exactness within a path are unchanged (tests/test_exact_resume.py);
the integer codes are derived from the fake-quantized tensors (``codes``), never re-quantized.

On by default on a CPU where it pays: where ``torch._int_mm`` is at least 2x faster than the FP32 matmul, measured
once per machine and thread count (cptsim.numerics.gemm_choice: on an AVX2-only CPU it is ~40x slower, and the
path stays off there). ``CPTSIM_EXACT_GEMM=0`` turns it off, ``=1`` on without measuring and also turns on the CUDA
path below, which is off by default until a GPU measures it. config.json records the choice and why
(``host.gemm_paths.choice``); a resume that would run another path than the run recorded says so (``path_change``).
Measured side by side on a CPU with AVX512-VNNI
(``python benchmarks/bench_quant_step.py --models resnet20 transformer-lm lstm-lm gcn``, 2 threads, two runs,
benchmarks/results/quant-step-gemm-paths.txt): the exact step is 0.85-0.88x the fake-quant step on lstm-lm
(0.96-1.01x FP32), 0.94-1.00x on transformer-lm, 0.99x on gcn, and resnet20 has no int8 layer (the same step); peak memory the
same within 3%. What made it pay: the weight's range, Qw(W), codes, sums and transpose in one C call
(``weight_codes``, 37 -> 11 ms for lstm-lm's head) and the error's stochastic rounding with its codes in one pass
(``ckernels.fake_quant_sr_codes``); before them it measured 0.99-1.03x the fake-quant step. config.json records each
layer's paths (``host.gemm_paths``, ``gemm_paths`` below); a layer's last call's paths are on the layer
(``layer.gemm_path``).

Memory: the forward keeps the int8 codes of Qa(x) for wgrad (1 byte per input element) instead of re-quantizing x
in backward, and the layer keeps a float32 Qw(W) for dgrad as before.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from cptsim.numerics import ckernels
from . import gemm_choice
from .quant import FULL_PRECISION, choose_qparams, quantize_weight

MAX_BITS = 8  # int8 operands
MAX_K = 32767  # the integer bracket stays inside int32 (|.| <= 65536 K)
# wgrad's K is the tokens of the call. Below this many, torch._int_mm on this CPU measured slower than the FP32 GEMM
# of the same values (an LSTM's per-time-step hidden-to-hidden call: 20 tokens, 5.8 ms vs 0.9 ms; 64-128: even):
# such a call's wgrad takes the fake-quant path.
MIN_WGRAD_TOKENS = 256
FAKE = "fp32-fake-quant"
INT8 = "int8-exact"


def mode() -> str:
    """CPTSIM_EXACT_GEMM: "auto" (unset: the CPU int8 path where measured to pay, on CUDA the tensor-core routes of
    cptsim.numerics.gpu_gemm where measured to pay), "1" (the CPU int8 path and the CUDA codes path on), "0" (all
    off), "codes" (the integer-codes path everywhere, for checks on a CPU), "int8" (the tensor-core routes without
    measuring, on a CPU too, for checks)."""
    m = os.environ.get("CPTSIM_EXACT_GEMM", "auto").strip().lower()
    return m if m in ("0", "1", "codes", "int8") else "auto"


def enabled(threads: int | None = None) -> bool:
    """The CPU int8 path is on: with CPTSIM_EXACT_GEMM=1, and unset where this machine measured it to pay at
    ``threads`` threads (default: torch's current count; gemm_choice). Cheap after the first call."""
    return choice(threads)["on"]


def choice(threads: int | None = None) -> dict:
    """Whether the CPU int8 path is on and why: ``{"on": bool, "why": str, ...}``, with the measured figures and
    where they came from when the default decided (what config.json records as ``host.gemm_paths.choice``)."""
    m = mode()
    if m == "0":
        return {"on": False, "why": "CPTSIM_EXACT_GEMM=0"}
    if m == "codes":
        return {"on": False, "why": "CPTSIM_EXACT_GEMM=codes (the integer-codes path instead)"}
    if m == "int8":
        return {"on": False, "why": "CPTSIM_EXACT_GEMM=int8 (the tensor-core routes instead)"}
    if not hasattr(torch, "_int_mm"):
        return {"on": False, "why": "this torch has no torch._int_mm"}
    if m == "1":
        return {"on": True, "why": "CPTSIM_EXACT_GEMM=1"}
    return gemm_choice.measured_choice(threads)


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


_ONES: dict = {}


def _ones(k: int, rows: bool) -> torch.Tensor:
    key = (k, rows)
    t = _ONES.get(key)
    if t is None:
        if len(_ONES) > 64:
            _ONES.clear()
        t = _ONES[key] = torch.ones((8, k) if rows else (k, 8), dtype=torch.int8)
    return t


def int_linear(a: torch.Tensor, b: torch.Tensor, oa: torch.Tensor, ob: torch.Tensor, scale: torch.Tensor,
               bias: torch.Tensor | None, shape, col_sums: torch.Tensor | None = None) -> torch.Tensor:
    """``float32(sum_j (a_ij + oa)(b_jc + ob_c)) * scale_c (+ bias_c)`` shaped ``shape`` (M rows of N): the int8
    GEMM, the row and column sums as int8 GEMMs against ones (VNNI too), and one C pass for the int32 bracket,
    its rounding to float32, the scale and the bias (``ckernels.int_epilogue``). K <= MAX_K."""
    K, N = b.shape
    p = torch._int_mm(a, b)
    r = torch._int_mm(a, _ones(K, False))[:, 0].contiguous()
    c = torch._int_mm(_ones(K, True), b)[0] if col_sums is None else col_sums  # (a weight's: made with its codes)
    o = ob.to(torch.int32).expand(N).contiguous()
    u = (c * oa + o * (oa * K)).to(torch.int32).contiguous()
    s = scale.float().expand(N).contiguous()
    bias = None if bias is None else bias.detach().contiguous()
    # the float32 result goes over the int32 bracket in place (each element read, then written): no fresh
    # output-sized allocation (its page faults cost as much as the pass). A new tensor on p's storage, not a view.
    # (shaped as the caller wants it, dense: p is dense (M, N); the kernel reads and writes by position)
    out = torch.empty(0).set_(p.untyped_storage(), 0, tuple(shape))
    return ckernels.int_epilogue(p, r, o, u, s, bias, out)


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
    """(codes transposed, (in, out) row-major; scale (out,); offset (out,); the codes' column sums) of a per-output-channel fake-quantized
    weight ``wq = Qw(w)``. Transposed once here: ``torch._int_mm`` on this CPU is up to 1.4x slower with a
    column-major right operand."""
    lo, hi = torch.aminmax(w.detach().reshape(w.shape[0], -1), dim=1)
    s, zp = choose_qparams(lo, hi, bits)
    a = codes(wq, s.unsqueeze(1), zp.unsqueeze(1)).t().contiguous()
    return a, s, offset(zp), a.sum(0, dtype=torch.int32)


def weight_codes(w: torch.Tensor, bits: int):
    """(Qw(w) float32, its codes transposed (in, out), scale (out,), offset (out,), the codes' column sums) of a 2-D
    weight: one C call where the kernels are usable (``ckernels.fake_quant_rtn_channels_codes``: the range, Qw(w)
    bit for bit as quantize_weight makes it, the codes from the same rounded levels, their sums, and a tiled
    transpose), else quantize_weight and ``quantized_weight_codes``. The separate passes (quantize, aminmax, codes,
    transpose, sums) took ~38 ms a step for an LSTM-LM head of 10000 x 650 here, the one call ~10 ms."""
    w = w.detach()
    if w.dim() == 2 and ckernels.usable(w):
        wq, a, sums, s, zp = ckernels.fake_quant_rtn_channels_codes(w, (1 << bits) - 1)
        return wq, a, s, offset(zp), sums
    wq = quantize_weight(w, bits)
    return (wq, *quantized_weight_codes(wq, w, bits))


def per_tensor_qparams(lo, hi, bits: int):
    """(scale, zero point), 0-d float32 tensors, as quant.choose_qparams computes them from a per-tensor range
    (floats or 0-d tensors): the same float32 operations, here on numpy scalars (one small torch op costs ~10 us,
    and an LSTM calls this twice per time step and layer)."""
    f32 = np.float32
    lo, hi = f32(float(lo)), f32(float(hi))
    lo, hi = min(lo, f32(0.0)), max(hi, f32(0.0))
    scale = max(f32(hi - lo) / f32((1 << bits) - 1), f32(1e-12))
    zp = min(max(np.round(f32(-lo) / scale), f32(0.0)), f32((1 << bits) - 1))
    return torch.tensor(scale, dtype=torch.float32), torch.tensor(zp, dtype=torch.float32)


def forward_path(bits: int, in_features: int) -> str:
    return INT8 if bits <= MAX_BITS and in_features <= MAX_K else FAKE


def wgrad_path(bits: int, grad_bits: int, tokens: int) -> str:
    return INT8 if (bits <= MAX_BITS and grad_bits != FULL_PRECISION and grad_bits <= MAX_BITS
                    and MIN_WGRAD_TOKENS <= tokens <= MAX_K) else FAKE


# The tensor-core routes (cptsim.numerics.gpu_gemm, which imports this module) register here when imported -- the
# quantized layers import them -- so that gemm_paths records them without an import cycle: {"enabled", "paths",
# "choice"}, gpu_gemm's functions of those names.
_TC: dict = {}


def register_tensor_core_routes(enabled, paths, choice) -> None:
    _TC.update(enabled=enabled, paths=paths, choice=choice)


def gemm_paths(model: torch.nn.Module, device: str) -> dict:
    """What config.json records (``host.gemm_paths``): the rule, and per quantized layer the path of each GEMM at
    forward/gradient bits <= 8 (above 8 bits every GEMM is the fake-quant path)."""
    if codes_on(device):
        return codes_gemm_paths(model, device)
    if _TC and _TC["enabled"](device):
        return _TC["paths"](model, device)
    cpu = str(device).startswith("cpu")
    why = choice() if cpu else None  # (not measured for a GPU run: the CPU path is not its question)
    on = cpu and why["on"]
    layers = {}
    for name, m in model.named_modules():
        if not hasattr(m, "precision") or not hasattr(m, "act_count"):
            continue
        linear = getattr(m, "_exact_capable", False)
        fwd = INT8 if on and linear and m.weight.shape[-1] <= MAX_K else FAKE
        layers[name] = {"forward": fwd, "dgrad": FAKE, "wgrad": fwd}
    return {"exact_gemm": "on" if on else "off (not a CPU)" if not cpu else f"off ({why['why']})",
            **({"choice": why} if cpu else {"tensor_cores": _TC["choice"](device)} if _TC else {}),
            "rule": f"{INT8}: forward at bits <= {MAX_BITS}; wgrad at bits and grad bits <= {MAX_BITS} and "
                    f"{MIN_WGRAD_TOKENS}..{MAX_K} tokens per call (an LSTM's per-step calls: fewer); dgrad stays {FAKE} (per-channel weight scales lie along its K); training "
                    "only; anything else " + FAKE,
            "layers": layers}


# ------------------------------------------------------------------------------------------------------------------
# Integer codes on TF32: exact quantized convolutions and linears on CUDA
#
# Why: a CUDA quantized layer today convolves the fake-quantized FP32 values under PyTorch's default
# torch.backends.cudnn.allow_tf32 = True, so cuDNN rounds every ``(k - zp) * s`` operand to TF32's 11-bit significand
# before multiplying: measured on an H100 (one ResNet-50 3x3 conv, 64x256x14x14, 8 bits,
# against float64) the output was off by up to 3.2e-4 of max|y| -- not the quantized layer cptsim says it trains
# (strict FP32: 4.6e-7). The integer part ``k - zp`` (|.| <= 2**b - 1) is exact in TF32 for b <= 11. So the layer
# runs its GEMMs on the integers and applies the scales after -- activation per tensor, weight per output channel,
# both constant along the forward GEMM's reduction:
#
#     conv(Qa(x), Qw(W))[n, c] = s_x s_w[c] conv(X, Wi)[n, c]        X = Qa(x) / s_x,  Wi = Qw(W) / s_w  (integers)
#
# with TF32 on for that call: the products are exact, the sums FP32 (exact below 2**24, else FP32 accumulation
# rounding -- the fake path's own order of error), then one rounding for the scale. Zero padding is exact: a padded 0
# is the integer 0 (the quantizer's zero point keeps 0 on the grid). Measured on that H100: error 6.9e-8, and 0.134
# ms against 0.149 ms for today's TF32 conv of the same layer (strict FP32: 0.273 ms) -- exact and no slower.
#
# wgrad ``Qe(g) x Qa(x)``: both scales per tensor, so wgrad takes the integers too (error bits <= 11). dgrad
# ``Qe(g) x Qw(W)``: the weight's per-channel scale lies along dgrad's reduction and does not factor out; dgrad stays
# on the fake-quantized values under the user's TF32 setting (today's path). The integers come from the quantizers'
# own outputs (``int_values``: q / s is within ~1e-6 of its integer), so every quantizer (fused CUDA, eager, C) and
# its random stream are unchanged and the path needs no quantizer of its own.
#
# Where: CPTSIM_EXACT_GEMM=1 on a CUDA device (opt-in, unlike the CPU int8 path: the whole-step speed has not been
# measured on a GPU yet; the one-layer figures above have), float32 QConv2d/QLinear layers (zero padding), forward
# bits <= 11, no autocast (fp16 operands would round the output to 11 bits), no per-forward weight cache (the LSTM's
# hidden-to-hidden layer). ``CPTSIM_EXACT_GEMM=codes`` runs the same path on a CPU, for checks only (FP32 convs of
# integer-valued floats: exact, and slower than today's path by the extra passes). config.json host.gemm_paths
# records it per layer (``gemm_paths``).

TF32_CODES = "tf32-int-codes"
MAX_TF32_BITS = 11  # |k - zp| <= 2**11 - 1 = 2047: exact in TF32's (and FP16's) 11-bit significand


def codes_on(device) -> bool:
    """Whether quantized layers on ``device`` take the integer-codes path (CPTSIM_EXACT_GEMM=1 on CUDA, =codes
    anywhere; off by default)."""
    m = mode()
    return m == "codes" or (m == "1" and torch.device(device).type == "cuda")


def int_values(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The integers ``k - zp`` of a fake-quantized ``q = (k - zp) * scale`` (scale 0-d or broadcastable), as float32:
    ``q * (1/scale)`` is within three float32 roundings (~2e-7 relative) of an integer of magnitude < 2**12, so
    rounding gives it exactly."""
    return torch.mul(q, scale.reciprocal()).round_()


def channel_scale(w: torch.Tensor, bits: int) -> torch.Tensor:
    """The per-output-channel scale (shape (out,)) that quantize_weight used for ``w``: the same range and the same
    float32 operations (quant.choose_qparams)."""
    lo, hi = torch.aminmax(w.detach().reshape(w.shape[0], -1), dim=1)
    return choose_qparams(lo, hi, bits)[0]


def tensor_scale(t: torch.Tensor, bits: int) -> torch.Tensor:
    """The per-tensor scale (0-d) of a min/max quantizer of ``t`` (quantize_error's, from the same range)."""
    lo, hi = torch.aminmax(t.detach())
    return choose_qparams(lo, hi, bits)[0]


class tf32:
    """TF32 on for cuDNN convolutions and cuBLAS matmuls inside the block (integer operands: exact), restored after.
    The flags are read when a kernel is chosen, so this also holds inside a CUDA graph capture."""

    def __enter__(self):
        self.saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cuda.matmul.allow_tf32 = True
        return self

    def __exit__(self, *exc):
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = self.saved


def codes_gemm_paths(model: torch.nn.Module, device: str) -> dict:
    """config.json ``host.gemm_paths`` where the integer-codes path is on (``codes_on``): per quantized layer that
    can take it, forward and wgrad on the integers, dgrad on the fake-quantized values."""
    layers = {}
    for name, m in model.named_modules():
        if not hasattr(m, "precision") or not hasattr(m, "act_count"):
            continue
        ok = getattr(m, "_codes_capable", False)
        layers[name] = {"forward": TF32_CODES if ok else FAKE, "dgrad": FAKE, "wgrad": TF32_CODES if ok else FAKE}
    return {"exact_gemm": TF32_CODES,
            "rule": f"{TF32_CODES}: a Conv2d/Linear layer's forward at bits <= {MAX_TF32_BITS} and its wgrad at "
                    f"gradient bits <= {MAX_TF32_BITS} on the integer codes with TF32 on, the scales after; dgrad "
                    f"{FAKE} under torch's TF32 setting (per-channel weight scales lie along its K); float32, no "
                    "autocast, zero padding; anything else " + FAKE,
            "layers": layers}


# ------------------------------------------------------------------------------------------------------------------
# FP8 forward GEMMs through torch._scaled_mm
#
# A QLinear step in ``fp8e4m3`` (the fp family's 8 bits, nvfp's 5..8) fake-quantizes both forward operands per tensor:
# ``q = e / s`` with ``e`` an E4M3 element and ``s`` the FP32 encode scale (formats.per_tensor_scale). ``q * s`` is
# within an ulp of ``e``, so casting it to float8_e4m3fn (RNE) gives ``e`` back exactly; torch._scaled_mm then
# multiplies the FP8 elements (each product exact) and applies the decode scales 1/s_x, 1/s_w. How it sums them is
# the device's: torch's CPU emulation accumulates in FP32 (within K ulp of sum |q_x||q_w| of the exact product, as the
# FP32 fake-quant GEMM of the same operands: tests/test_format_scaled_mm.py), but Hopper's FP8 tensor cores keep
# their partial sums to ~14 significant bits and promote them to FP32 only every so many products, so on an H100 the
# two paths differ by far more than FP32 rounding (max |fast - fake| 0.0895 on a 256x512 @ 512x384 GEMM whose
# sum |q_x||q_w| is ~1e3; a CPU emulation that truncates the running sum to 14 bits every 32 / 128 products gives
# 0.149 / 0.060 there: tests/test_format_scaled_mm.py). ``fp8_product_bound`` holds whatever the interval. The backward
# GEMMs (dgrad, wgrad) stay on the fake-quant path: their error operand is E5M2 or E4M3 with stochastic rounding,
# produced by a hook in backward.
#
# Where: CUDA with compute capability 8.9 or newer (Ada, Hopper, Blackwell: the FP8 tensor cores), K and N multiples
# of 16 (_scaled_mm's shape rule there); anything else runs the FP32 fake-quant path. CPTSIM_SCALED_MM=0 turns it off,
# =1 also runs it on a CPU where this torch has a CPU _scaled_mm (2.14 does: an emulation, for checks only -- a
# transformer-lm step took ~210 s with it against ~1 s on the fake-quant path; tests use it on small GEMMs to check
# the path's numerics). Not yet run on a GPU (the CUDA branch is the same call with device tensors;
# benchmarks/bench_formats_train.py --gpu-check checks it there). A layer's last forward path is ``layer.gemm_path["forward"]``; config.json ``host.gemm_paths``
# records the rule and per layer the path its fp8 forward takes (``format_gemm_paths``).

SCALED_MM = "fp8-scaled-mm"
# Significant bits of an FP8 tensor-core partial sum on Hopper: "around 14 bits" (DeepSeek-V3 technical report,
# section 3.3.2, measured on H800), not FP32's 24. NVIDIA documents no figure; this is the one measured.
FP8_PARTIAL_SUM_BITS = 14


def fp8_product_bound(abs_product: torch.Tensor, k: int) -> torch.Tensor:
    """The largest ``|_scaled_mm(a, b) - a @ b|`` (exact product of the decoded FP8 operands) the hardware allows, per
    element: ``abs_product`` is ``|a| @ |b|`` (float64), ``k`` the reduction length.

    The products of two FP8 elements are exact; each addition to a partial sum keeps FP8_PARTIAL_SUM_BITS significant
    bits (truncated: relative error below u = 2**-13) and FP32's promotions lose less, so recursive summation's bound
    holds for any promotion interval: ``gamma(k - 1) * sum |a||b|`` with ``gamma(n) = n u / (1 - n u)`` (Higham,
    Accuracy and Stability of Numerical Algorithms, 2nd ed., section 4.2); plus three FP32 roundings of the result
    (the two decode scales and the output). Infinite where ``k u >= 1`` (no bound from this model)."""
    u = 2.0 ** (1 - FP8_PARTIAL_SUM_BITS)
    n = max(int(k) - 1, 0)
    gamma = n * u / (1 - n * u) if n * u < 1 else float("inf")
    return abs_product * (gamma + 3 * 2.0 ** -24)


_SAFE_AMAX = (2.0 ** -100, 2.0 ** 100)  # amax ranges whose q * s re-encodes exactly (no FP32 under/overflow of q)


def scaled_mm_mode() -> str:
    """CPTSIM_SCALED_MM: "auto" (default: CUDA sm89+), "1" (also a CPU whose torch runs it), "0" (off)."""
    m = os.environ.get("CPTSIM_SCALED_MM", "auto").strip().lower()
    return m if m in ("auto", "0", "1") else "auto"


_CPU_OK: list = []


def _cpu_scaled_mm() -> bool:
    """Whether this torch runs torch._scaled_mm on a CPU for float8_e4m3fn operands (probed once)."""
    if not _CPU_OK:
        try:
            a = torch.ones(16, 16).to(torch.float8_e4m3fn)
            one = torch.ones(())
            ok = bool(torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)[0, 0] == 16)
        except Exception:  # noqa: BLE001 - any failure means: not here, fall back
            ok = False
        _CPU_OK.append(ok)
    return _CPU_OK[0]


def scaled_mm_device(device) -> tuple[bool, str]:
    """(whether fp8 forward GEMMs take torch._scaled_mm on ``device``, why / why not)."""
    mode = scaled_mm_mode()
    if mode == "0":
        return False, "off (CPTSIM_SCALED_MM=0)"
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return False, "off (this torch has no _scaled_mm)"
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return False, "off (no CUDA)"
        cap = torch.cuda.get_device_capability(device)
        if tuple(cap) >= (8, 9):
            return True, f"on (CUDA sm{cap[0]}{cap[1]})"
        return False, f"off (CUDA sm{cap[0]}{cap[1]}: FP8 needs sm89+)"
    if device.type == "cpu":
        if mode != "1":
            return False, "off (a CPU: CPTSIM_SCALED_MM=1 runs torch's CPU emulation)"
        return (True, "on (CPU emulation, CPTSIM_SCALED_MM=1)") if _cpu_scaled_mm() else \
            (False, "off (this torch has no CPU _scaled_mm)")
    return False, f"off ({device.type})"


def scaled_mm_shape_ok(x: torch.Tensor, w: torch.Tensor) -> bool:
    """The GEMM's shape on its device: 2-D weight, K = w.shape[1] matching x, and on CUDA K and N multiples of 16."""
    if w.dim() != 2 or x.dim() < 1 or x.shape[-1] != w.shape[1] or x.numel() == 0:
        return False
    if x.device.type == "cuda":
        return w.shape[0] % 16 == 0 and w.shape[1] % 16 == 0
    return True


def _safe(amax: torch.Tensor) -> bool:
    a = float(amax)
    return _SAFE_AMAX[0] <= a <= _SAFE_AMAX[1]


class ScaledMMLinear(torch.autograd.Function):
    """``y = xq wq^T + b`` with the product through torch._scaled_mm (module section above). ``xq``, ``wq``: the
    fake-quantized fp8e4m3 operands (q = e / s), ``sx``, ``sw``: their encode scales. Backward is the linear op's on
    ``xq`` and ``wq`` (the FP32 GEMMs of the fake-quant path)."""

    @staticmethod
    def forward(ctx, xq, wq, bias, sx, sw):
        ctx.save_for_backward(xq, wq)
        ctx.has_bias = bias is not None
        x2 = xq.reshape(-1, xq.shape[-1])
        a = (x2 * sx).to(torch.float8_e4m3fn)
        b = (wq * sw).to(torch.float8_e4m3fn).t()  # (K, N), column-major as _scaled_mm wants its second operand
        y = torch._scaled_mm(a, b, scale_a=sx.reciprocal(), scale_b=sw.reciprocal(), out_dtype=torch.float32)
        if bias is not None:
            y = y + bias
        return y.reshape(*xq.shape[:-1], wq.shape[0])

    @staticmethod
    def backward(ctx, grad):
        xq, wq = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])
        gx = grad.matmul(wq) if ctx.needs_input_grad[0] else None
        gw = g2.t().mm(xq.reshape(-1, xq.shape[-1])) if ctx.needs_input_grad[1] else None
        gb = g2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb, None, None


def _capturing(x: torch.Tensor) -> bool:
    """Whether ``x``'s device stream is being captured into a CUDA graph."""
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def scaled_mm_linear(x: torch.Tensor, xq: torch.Tensor, weight: torch.Tensor, wq: torch.Tensor,
                     bias: torch.Tensor | None, fmt) -> torch.Tensor | None:
    """The forward GEMM through torch._scaled_mm when ``fmt`` is fp8e4m3, the device has it and the shape and
    ranges allow it; else None (the caller runs the fake-quant op). ``x``, ``weight``: the unquantized operands
    (their encode scales are recomputed from them, the same function the quantizer ran)."""
    from .formats import per_tensor_scale

    if fmt.name != "fp8e4m3" or not scaled_mm_device(x.device)[0] or not scaled_mm_shape_ok(x, weight) \
            or x.dtype != torch.float32 or weight.dtype != torch.float32:
        return None
    sx, sw = per_tensor_scale(x, fmt), per_tensor_scale(weight, fmt)
    # The range check reads two device scalars back to the host: eagerly that is a sync per layer, and inside a
    # CUDA graph capture (cptsim train's default on CUDA) a read-back is not allowed at all -- the capture would fail
    # and the run fall back to eager steps for good. A captured graph replays on later batches without re-running
    # Python anyway, so a check at capture time would guard nothing: while capturing, the path is taken unchecked
    # (amaxes outside 2^-100..2^100, an all-but-underflowed activation, are the only inputs it protects).
    if not _capturing(x):
        ax, aw = fmt.element.max / sx, fmt.element.max / sw  # ~ the amaxes, enough for the range check
        if not (_safe(ax) and _safe(aw)):
            return None
    return ScaledMMLinear.apply(xq, wq, bias, sx, sw)


def format_gemm_paths(model: torch.nn.Module, device: str, fmap) -> dict:
    """config.json ``host.gemm_paths`` of a float-format run: the exact int8 path is off (the formats are
    fake-quantized in FP32), and which GEMMs of each quantized layer take torch._scaled_mm at a step whose forward
    format is fp8e4m3 (the forward of a Linear whose shape allows it, on a device that has it)."""
    on, why = scaled_mm_device(device)
    fp8 = sorted({w for w in range(1, len(fmap.fwd_names)) if fmap.fwd_names[w] == "fp8e4m3"})
    layers = {}
    for name, m in model.named_modules():
        if not hasattr(m, "precision") or not hasattr(m, "act_count"):
            continue
        w = getattr(m, "weight", None)
        lin = getattr(m, "_exact_capable", False) and w is not None and w.dim() == 2 and \
            (str(device).startswith("cpu") or (w.shape[0] % 16 == 0 and w.shape[1] % 16 == 0))
        layers[name] = {"forward": SCALED_MM if on and lin and fp8 else FAKE, "dgrad": FAKE, "wgrad": FAKE}
    return {"exact_gemm": "off (float number formats run fake-quantized in FP32)",
            "scaled_mm": why if fp8 else "off (no fp8e4m3 forward width in this family)",
            "rule": f"{SCALED_MM}: a Linear's forward GEMM at widths {fp8 or 'none'} (fp8e4m3) on CUDA sm89+ "
                    f"(K, N multiples of 16) or with CPTSIM_SCALED_MM=1 on a CPU; every other GEMM {FAKE}",
            "layers": layers}


# ------------------------------------------------------------------------------------------------------------------
# A resume on another path

TC_ROUTES = "int8-tc"  # config.json's name for the tensor-core routes (cptsim.numerics.gpu_gemm.INT8)


def path_kind(doc) -> str | None:
    """The exact path a config.json ``host.gemm_paths`` names (INT8, TF32_CODES, TC_ROUTES, SCALED_MM, or FAKE when
    none is on); None when there is no such record (a run of an older cptsim)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("exact_gemm"), str):
        return None
    if doc["exact_gemm"] == "on":
        return INT8
    if doc["exact_gemm"] in (TF32_CODES, TC_ROUTES):
        return doc["exact_gemm"]
    return SCALED_MM if str(doc.get("scaled_mm", "")).startswith("on") else FAKE


# the setting that brings a recorded path back, by (recorded, what this process would run)
_BACK = {INT8: "CPTSIM_EXACT_GEMM=1", SCALED_MM: "CPTSIM_SCALED_MM=1",
         TF32_CODES: "CPTSIM_EXACT_GEMM=1 (=codes on a CPU)", TC_ROUTES: "CPTSIM_EXACT_GEMM=int8",
         (FAKE, TC_ROUTES): "CPTSIM_EXACT_GEMM=0",
         (FAKE, INT8): "CPTSIM_EXACT_GEMM=0", (FAKE, SCALED_MM): "CPTSIM_SCALED_MM=0",
         (FAKE, TF32_CODES): "CPTSIM_EXACT_GEMM unset"}


def path_change(recorded, now: dict) -> str | None:
    """One line for a resume whose process would run other GEMMs than the run recorded (``recorded``: its config.json
    ``host.gemm_paths``; ``now``: gemm_paths / format_gemm_paths here), else None. A resume is bit-identical to an
    uninterrupted run only on the same path: the paths round differently (module docstring), so it is a warning,
    not an error -- the run goes on, a little off the one it would have been."""
    was, will = path_kind(recorded), path_kind(now)
    if was is None or will is None or was == will:
        return None
    why = (now.get("choice") or {}).get("why") or now.get("scaled_mm") or now["exact_gemm"]
    back = _BACK.get(was) or _BACK.get((was, will))
    if was == INT8 and not hasattr(torch, "_int_mm"):
        back = None  # nothing brings it back in this torch
    return (f"this run's quantized GEMMs ran on the {was} path (config.json host.gemm_paths) and this process would "
            f"run {will} ({why}): the resumed steps round differently from an uninterrupted run"
            + (f"; {back} runs the recorded path" if back else ""))

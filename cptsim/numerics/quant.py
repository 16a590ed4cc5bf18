"""Quantizer primitives as plain functions (the torchao style): choose qparams, fake-quantize.

The scheme is the one CPT inherited from SBM (Banner et al., "Scalable methods for 8-bit training"):
uniform, asymmetric, min/max ranges.

* weights: one (min, max) range per output channel, round to nearest;
* input activations: one range per tensor (batch min/max in training, a running average in eval);
* errors (output gradients) in backward: one range per tensor, *stochastic* rounding.

Bits are integers 1..16 (that many bits, 2**b levels) or 32, which means full precision and no quantizer at
all. Everything here is stateless; the modules that hold running ranges live in `cptsim.numerics.layers`.

The quantizer's element-wise passes are what makes fake-quantized training slower than FP32 on a CPU, so the
functions below are written for few allocations and vectorised in-place passes (see the note at fake_quant).
"""

from __future__ import annotations

import os
import warnings

import torch

from cptsim.numerics import ckernels
from cptsim.errors import InputError

FULL_PRECISION = 32
VALID_BITS = frozenset(range(1, 17)) | {FULL_PRECISION}


def check_bits(bits: int, what: str = "bits") -> int:
    """Validate a bit-width: 1..16 quantize, 32 is full precision."""
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in VALID_BITS:
        raise InputError(f"{what} must be an integer in 1..16 or 32 (full precision), got {bits!r}")
    return bits


def qrange(bits: int) -> tuple[int, int]:
    """Integer grid of an unsigned (asymmetric) b-bit quantizer."""
    return 0, (1 << bits) - 1


def choose_qparams(lo: torch.Tensor, hi: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point mapping [lo, hi] onto the b-bit grid (tensors of any shape, elementwise).

    The range is widened to include 0 so that 0 (padding, ReLU zeros) stays exactly representable, as
    PyTorch's observers do; the zero point is an integer (kept as float for arithmetic); a degenerate range
    gets a tiny positive width so the scale is never 0.
    """
    qmin, qmax = qrange(bits)
    lo = torch.clamp(lo.float(), max=0.0)
    hi = torch.clamp(hi.float(), min=0.0)
    width = hi - lo
    # Divided by a tensor on width's device, not by a Python number: CUDA computes a tensor over a number (or a CPU
    # scalar) as a multiply by the number's rounded reciprocal, one rounding more than the CPU's division, so the
    # same range gave scales 1 ulp apart and codes that differed near half-steps (as formats.py's NVFP4 scale does).
    scale = torch.clamp(torch.div(width, torch.full_like(width, float(qmax - qmin))), min=1e-12)
    zero_point = torch.clamp(torch.round(-lo / scale), qmin, qmax)
    return scale, zero_point


# Why not torch.fake_quantize_per_tensor_affine: on this project's 2-core x86 machines its kernel costs ~13 ns
# per element, against ~1 ns for the six in-place vectorised passes below (benchmarks/bench_quant_step.py).
# One allocation (the output) per call; everything after it is in place, which matters because a fresh
# multi-megabyte tensor costs page faults on every step.


def fake_quant(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, bits: int) -> torch.Tensor:
    """Round-to-nearest fake quantization of `x` with range [lo, hi] (0-d, or broadcastable per channel)."""
    qmin, qmax = qrange(bits)
    scale, zp = choose_qparams(lo, hi, bits)
    out = torch.mul(x, scale.reciprocal())
    return out.add_(zp).round_().clamp_(qmin, qmax).sub_(zp).mul_(scale)


def fake_quant_per_tensor(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, bits: int) -> torch.Tensor:
    """Round-to-nearest fake quantization of `x` with one range [lo, hi] (0-d tensors)."""
    return fake_quant(x, lo, hi, bits)


def fake_quant_per_channel(w: torch.Tensor, bits: int, axis: int = 0) -> torch.Tensor:
    """Round-to-nearest fake quantization of a weight, one min/max range per output channel."""
    flat = w.detach().transpose(0, axis).reshape(w.shape[axis], -1)
    lo, hi = torch.aminmax(flat, dim=1)
    shape = [1] * w.dim()
    shape[axis] = -1
    return fake_quant(w, lo.view(shape), hi.view(shape), bits)


# Random bits per stochastic-rounding draw. u = (k + 1/2) / 2**8 with k uniform on 0..255: E[floor(y + u)]
# differs from y by at most 2**-9 of a quantization step (documented bias bound, checked in the tests).
# Three uniform bytes come out of each int32 from torch's generator (the fourth is only 7 bits wide:
# random_() on int32 draws from [0, 2**31)), which is ~3x cheaper than torch.rand's one draw per element.
SR_RANDOM_BITS = 8


def uniform_bytes(n: int, device: torch.device | str = "cpu", generator: torch.Generator | None = None) -> torch.Tensor:
    """n independent uniform uint8 values (0..255)."""
    words = torch.empty((n + 2) // 3, dtype=torch.int32, device=device).random_(generator=generator)
    return words.view(torch.uint8).view(-1, 4)[:, :3].reshape(-1)[:n]


def fake_quant_stochastic(x: torch.Tensor, bits: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Per-tensor min/max fake quantization with stochastic rounding: E[q(x)] = x inside the range.

    q = s * (floor(x/s + zp + u) - zp), u uniform in (0, 1) on a 2**-8 grid (see SR_RANDOM_BITS).
    Computed in units of s/256 so that the uint8 draws add in without a conversion pass.
    """
    qmin, qmax = qrange(bits)
    lo, hi = torch.aminmax(x.detach())
    scale, zp = choose_qparams(lo, hi, bits)
    k = 1 << SR_RANDOM_BITS
    out = torch.mul(x, k / scale)
    if not (out.is_contiguous() or (out.dim() == 4 and out.is_contiguous(memory_format=torch.channels_last))):
        out = out.contiguous()  # a gradient can arrive with any strides; the noise goes over dense memory
    _add_uniform_bytes(out, generator)
    out.add_(zp * k + 0.5).mul_(1.0 / k).floor_()
    return out.clamp_(qmin, qmax).sub_(zp).mul_(scale)


def _add_uniform_bytes(out: torch.Tensor, generator: torch.Generator | None = None) -> None:
    """out += independent uniform bytes (0..255), three per int32 word as in ``uniform_bytes``, added straight from
    the words: the first, second and third third of ``out`` take the words' bytes 0, 1 and 2 (strided reads, long
    inner loops), with no gathered byte tensor in between -- 3x cheaper than adding ``uniform_bytes`` (which copies
    the bytes out, and whose contiguous uint8 add is slower still)."""
    n = out.numel()
    flat = out.as_strided((n,), (1,))  # dense memory in storage order: the draws are i.i.d., any order will do
    m = n // 3
    words = torch.empty(m + (1 if n % 3 else 0), dtype=torch.int32, device=out.device).random_(generator=generator)
    b = words.view(torch.uint8).view(-1, 4)
    if m:
        planes = flat[:3 * m].view(3, m)
        for j in range(3):
            planes[j].add_(b[:m, j])
    if n % 3:
        flat[3 * m:].add_(b[m, :n % 3])


def quantize_error_bound(lo: float, hi: float, bits: int) -> float:
    """Worst-case round-to-nearest error for values inside [lo, hi]: half a step (range widened to include 0)."""
    qmin, qmax = qrange(bits)
    return 0.5 * (max(hi, 0.0) - min(lo, 0.0)) / (qmax - qmin)


# ----------------------------------------------------------------------------------------------------------------------
# Fused quantizers for CUDA tensors.
#
# On a GPU each of the in-place passes above is a kernel launch and a full read + write of the tensor; a quantized
# layer runs ~20 of them per step. torch.compile (inductor, which generates Triton kernels) fuses each quantizer into
# one or two kernels. The functions below are the same formulas written out of place for the compiler; stochastic
# rounding draws u ~ U[0, 1) from inductor's own Philox generator, seeded from torch's CUDA generator, so it stays
# unbiased (E[floor(y + u)] = y exactly, not only within 2**-9). CPU tensors, CPTSIM_FUSED=0, and any failure to
# compile (no Triton, no compiler) take the eager functions above: same formulas, same results up to rounding.


def _fq_fused(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, qmax: int) -> torch.Tensor:
    lo = torch.clamp(lo.float(), max=0.0)
    hi = torch.clamp(hi.float(), min=0.0)
    scale = torch.clamp((hi - lo) / qmax, min=1e-12)
    zp = torch.clamp(torch.round(-lo / scale), 0, qmax)
    return (torch.clamp(torch.round(x * scale.reciprocal() + zp), 0, qmax) - zp) * scale


def _fq_channel_fused(w: torch.Tensor, qmax: int) -> torch.Tensor:
    flat = w.detach().reshape(w.shape[0], -1)
    shape = [-1] + [1] * (w.dim() - 1)
    return _fq_fused(w, flat.amin(dim=1).view(shape), flat.amax(dim=1).view(shape), qmax)


def _sr_fused(x: torch.Tensor, qmax: int) -> torch.Tensor:
    lo = torch.clamp(x.detach().amin().float(), max=0.0)
    hi = torch.clamp(x.detach().amax().float(), min=0.0)
    scale = torch.clamp((hi - lo) / qmax, min=1e-12)
    zp = torch.clamp(torch.round(-lo / scale), 0, qmax)
    u = torch.rand_like(x)
    return (torch.clamp(torch.floor(x / scale + zp + u), 0, qmax) - zp) * scale


class _Fused:
    """One quantizer: the compiled form for CUDA tensors, the eager one otherwise or once compilation has failed."""

    def __init__(self, name: str, fused):
        self.name = name
        self._fused = fused
        self._compiled = None
        self.failed: str | None = None

    def usable(self, x: torch.Tensor) -> bool:
        return x.is_cuda and self.failed is None and fusion_enabled()

    def __call__(self, *args):
        try:
            if self._compiled is None:
                # dynamic: one graph serves every layer shape and bit width (no recompilation per layer or per step)
                self._compiled = torch.compile(self._fused, dynamic=True)
            return self._compiled(*args)
        except Exception as e:  # no Triton / no C compiler / an inductor bug: fall back for good, say so once
            self.failed = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            warnings.warn(f"cptsim: fused CUDA quantizer {self.name} unavailable ({self.failed}); using the eager "
                          "quantizer", RuntimeWarning, stacklevel=3)
            return None


def fusion_enabled() -> bool:
    """Fused CUDA quantizers are on unless CPTSIM_FUSED=0 (benchmarks compare both)."""
    return os.environ.get("CPTSIM_FUSED", "1") != "0"


_FQ = _Fused("fake_quant", _fq_fused)
_FQ_CHANNEL = _Fused("fake_quant_per_channel", _fq_channel_fused)
_SR = _Fused("fake_quant_stochastic", _sr_fused)


def fused_status() -> dict:
    """Which quantizers run fused on CUDA right now (None: not tried yet or fine; a string: why it fell back)."""
    return {"enabled": fusion_enabled(), **{q.name: q.failed for q in (_FQ, _FQ_CHANNEL, _SR)}}


# ----------------------------------------------------------------------------------------------------------------------
# The quantizers the layers call. CUDA: the fused (compiled) forms above. CPU: the one-pass C kernels of
# cptsim.numerics.ckernels where they are built and usable (dense float32, no dispatch mode tracing), else the eager functions.
# The C kernels compute the quantization parameters as choose_qparams does (the same float32 operations), so
# round-to-nearest is bit-identical either way and stochastic rounding is the same formula on other uniform bytes.


def quantize_activation(x: torch.Tensor, lo: torch.Tensor | float, hi: torch.Tensor | float, bits: int,
                        scratch: str | None = None) -> torch.Tensor:
    """Per-tensor round-to-nearest fake quantization: fused on CUDA, one C pass on a CPU, else
    ``fake_quant_per_tensor``. The range is 0-d tensors, or floats (float32 values) from the C kernels' own min/max.
    ``scratch``: the C pass writes into that reusable buffer (``ckernels.scratch``; the caller drops the result)."""
    if (isinstance(lo, float) or lo.dim() == 0) and ckernels.usable(x):  # (CPU only: _FQ below is CUDA only)
        return ckernels.fake_quant_rtn(x, lo, hi, qrange(bits)[1], slot=scratch)
    if isinstance(lo, float):
        lo, hi = torch.tensor(lo, device=x.device), torch.tensor(hi, device=x.device)  # exact: they are float32 values
    if _FQ.usable(x):
        out = _FQ(x, lo, hi, qrange(bits)[1])
        if out is not None:
            return out
    return fake_quant_per_tensor(x, lo, hi, bits)


class QuantActivationSTE(torch.autograd.Function):
    """``quantize_activation`` in forward, the gradient passed straight through (the straight-through estimator):
    the one rule for every per-tensor quantized input -- a layer's (cptsim.numerics.layers), attention's operands
    (lm_layers), an aggregation's messages (graph_layers)."""

    @staticmethod
    def forward(ctx, x, lo, hi, bits):
        return quantize_activation(x, lo, hi, bits)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None


def quantize_weight(w: torch.Tensor, bits: int) -> torch.Tensor:
    """Per-output-channel round-to-nearest fake quantization: fused on CUDA, one C call on a CPU, else
    ``fake_quant_per_channel``."""
    if _FQ_CHANNEL.usable(w):
        out = _FQ_CHANNEL(w, qrange(bits)[1])
        if out is not None:
            return out
    if w.dim() >= 1 and ckernels.usable(w):
        return ckernels.fake_quant_rtn_channels(w, qrange(bits)[1])
    return fake_quant_per_channel(w, bits, axis=0)


def quantize_error(g: torch.Tensor, bits: int, scratch: str | None = None) -> torch.Tensor:
    """Per-tensor stochastic-rounding fake quantization: fused on CUDA, one C pass with Philox bytes on a CPU, else
    ``fake_quant_stochastic``. ``scratch`` as for ``quantize_activation``."""
    if _SR.usable(g):
        out = _SR(g, qrange(bits)[1])
        if out is not None:
            return out
    if ckernels.usable(g):
        return ckernels.fake_quant_sr(g, qrange(bits)[1], slot=scratch)
    return fake_quant_stochastic(g, bits)

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
from cptsim.numerics.strides import dense, rows_contiguous  # noqa: F401 - the kernels and tests use them from here too
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
# The quantizers on a GPU.
#
# On a GPU each in-place pass above is a kernel launch and a full read and write of the tensor: ~20 per quantized
# layer and step. Three routes run them there, chosen by CPTSIM_QUANT_KERNELS:
#
# * "triton" (the default): cptsim.numerics.kernels, one Triton kernel per quantizer (a range pass first where the
#   range must be known), the eager formula's float32 arithmetic operation for operation, so round to nearest is
#   bit-identical to it on the same device; stochastic rounding keyed by one int64 per call drawn from torch's
#   generator of the device. Its kernels compile once per variant (dtype, pointer alignment, the weight's row block:
#   a few), never per shape.
# * "compile": torch.compile (inductor) of the formulas below, on detached tensors viewed flat in storage order and
#   marked dynamic, so one graph serves every layer shape; fullgraph, so that dynamo's recompile limit raises (and
#   is recorded) instead of running the eager formula in silence.
# * "eager": the functions above (CPTSIM_FUSED=0 also means this, unless CPTSIM_QUANT_KERNELS says otherwise).
#
# Triton is the default because it cannot recompile per shape and its rounding is the eager formula's. Which of
# the two fused routes is faster is not measured yet: that needs a GPU, and the prepared GPU script times both.
#
# A call that runs the eager formula although the route is a fused one is a fallback: it is recorded against the
# layer named by the innermost ``fallback_scope`` (``fallbacks()``), and each distinct reason is warned about once.
# Two cases are deliberate and not recorded: a TorchDispatchMode (cptsim.measure.opcount, FlopCounterMode) or
# torch.compile is tracing -- the tracer has to see the aten ops. CPU tensors take the C kernels or the eager
# formula (cptsim.numerics.ckernels), as before.

ROUTES = ("triton", "compile", "eager")
QUANTIZERS = ("fake_quant", "fake_quant_per_channel", "fake_quant_stochastic")
# Device types whose tensors take the chosen route (the tests add "cpu" or "meta" to check the dispatch without a GPU).
KERNEL_DEVICES = ("cuda",)
# torch.compile's backend for the compile route (the tests use "eager": dynamo's graphs without code generation).
COMPILE_BACKEND = "inductor"


def quant_route() -> str:
    """The route the quantizers take on a GPU: CPTSIM_QUANT_KERNELS=triton|compile|eager, default triton;
    CPTSIM_FUSED=0 (without CPTSIM_QUANT_KERNELS) means eager."""
    route = os.environ.get("CPTSIM_QUANT_KERNELS", "").strip().lower()
    if route:
        if route not in ROUTES:
            raise InputError(f"CPTSIM_QUANT_KERNELS must be one of {', '.join(ROUTES)}, got {route!r}")
        return route
    return "eager" if os.environ.get("CPTSIM_FUSED", "1") == "0" else "triton"


def fusion_enabled() -> bool:
    """The GPU quantizers take a fused route (triton or compile), not the eager formula."""
    return quant_route() != "eager"


def kernel_route(device: torch.device | str) -> str:
    """The route quantizers run on ``device``: on CUDA "triton", "compile" or "eager" ("eager" also where the
    chosen route cannot run at all: Triton not importable); on a CPU "c-kernels" or "eager (why)"; elsewhere
    "eager". A fused route may still have fallen back on some layers: ``fallbacks()`` names them."""
    dev = torch.device(device)
    if dev.type == "cpu":
        st = ckernels.status()
        return "c-kernels" if st["in_use"] else f"eager ({st['why_not']})"
    if dev.type not in KERNEL_DEVICES:
        return "eager"
    route = quant_route()
    if route == "triton" and _triton() is None:
        return "eager"
    if route == "compile" and all(q.failed for q in _COMPILED.values()):
        return "eager"
    return route


# ----------------------------------------------------------------------------------------------------------------------
# Fallback records


class fallback_scope:
    """``with fallback_scope(name):`` -- the quantizers called inside belong to layer ``name`` (for ``fallbacks()``).
    Cheap (two assignments); nests. The name is process-wide, not per thread: autograd runs a CUDA backward pass on
    a thread of its own, where the layer's hook or Function sets the scope again for the error's quantizer."""

    __slots__ = ("name", "_prev")

    def __init__(self, name: str | None):
        self.name = name

    def __enter__(self):
        self._prev = _scope[0]
        _scope[0] = self.name
        return self

    def __exit__(self, *exc):
        _scope[0] = self._prev
        return False


def set_fallback_scope(name: str | None) -> str | None:
    """Name the layer whose quantizers run next (``fallback_scope`` without a block); returns the previous name."""
    prev, _scope[0] = _scope[0], name
    return prev


_scope: list = [None]
_records: dict[str, dict[str, None]] = {}  # layer -> its distinct reasons, in order
_first_why: dict[str, str] = {}  # quantizer -> why it first fell back
_warned: set[str] = set()
UNSCOPED = "(no layer)"


def _fell_back(kernel: str, route: str, why: str) -> None:
    layer = _scope[0] or UNSCOPED
    reason = f"{kernel}: {why}"
    reasons = _records.setdefault(layer, {})
    if reason not in reasons:
        reasons[reason] = None
    _first_why.setdefault(kernel, why)
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"cptsim: the {kernel} quantizer ran the eager formula instead of the {route} route ({why}), "
                      f"first in layer {layer}; cptsim.numerics.quant.fallbacks() names every layer",
                      RuntimeWarning, stacklevel=4)


def fallbacks() -> dict[str, str]:
    """Each layer where a quantizer ran a slower path than the chosen route, and why ("kernel: reason; ...")."""
    return {layer: "; ".join(reasons) for layer, reasons in _records.items()}


def clear_fallbacks() -> None:
    """Forget the records and the warnings given (a new run in the same process starts clean)."""
    _records.clear()
    _first_why.clear()
    _warned.clear()


def fused_status() -> dict:
    """The GPU quantizers' route and, per quantizer, None while every call ran on that route, else why one did not
    (its first reason); ``fallbacks`` per layer."""
    route = quant_route()
    if route == "triton":
        _triton()  # (whether Triton imports at all is part of the truth)
    status = {"route": route, "enabled": route != "eager"}
    for q in QUANTIZERS:
        broken = (_triton_broken.get(q) if route == "triton" else _COMPILED[q].failed if route == "compile"
                  else None)
        status[q] = broken or _first_why.get(q)
    status["fallbacks"] = fallbacks()
    return status


# ----------------------------------------------------------------------------------------------------------------------
# The compile route: the formulas written out of place for the compiler. Stochastic rounding draws u ~ U[0, 1) from
# inductor's Philox generator, seeded from torch's CUDA generator.


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
    """One quantizer compiled: ``None`` from a call means the caller runs the eager formula (recorded)."""

    def __init__(self, name: str, fused):
        self.name = name
        self._fused = fused
        self._compiled = None
        self.failed: str | None = None  # why the compiled form is unusable for good

    def usable(self, x: torch.Tensor) -> bool:
        return x.device.type in KERNEL_DEVICES and self.failed is None and quant_route() == "compile"

    def __call__(self, *args):
        from torch._dynamo.exc import FailOnRecompileLimitHit

        try:
            if self._compiled is None:
                self._compiled = torch.compile(self._fused, dynamic=True, fullgraph=True, backend=COMPILE_BACKEND)
            return self._compiled(*args)
        except FailOnRecompileLimitHit:  # this shape only: the graphs already made still serve the others
            _fell_back(self.name, "compile", f"dynamo's recompile limit ({torch._dynamo.config.recompile_limit})")
            return None
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # no Triton / no C compiler / an inductor bug: the eager formula for good
            self.failed = _why(e)
            _fell_back(self.name, "compile", self.failed)
            return None


def _why(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


_FQ = _Fused("fake_quant", _fq_fused)
_FQ_CHANNEL = _Fused("fake_quant_per_channel", _fq_channel_fused)
_SR = _Fused("fake_quant_stochastic", _sr_fused)
_COMPILED = {"fake_quant": _FQ, "fake_quant_per_channel": _FQ_CHANNEL, "fake_quant_stochastic": _SR}


def _alias(x: torch.Tensor, shape: tuple, stride: tuple) -> torch.Tensor:
    """A tensor over x's memory with this shape and these strides that is not a view: dynamo guards a view's base
    (its sizes, strides, 0/1 specialisations), which made a graph per layer shape again."""
    return torch.empty((0,), dtype=x.dtype, device=x.device).set_(x.untyped_storage(), x.storage_offset(), shape,
                                                                   stride)


def _flat(x: torch.Tensor) -> torch.Tensor:
    """x detached, as a 1-D tensor in storage order (a copy first where x is not dense), marked dynamic: one graph
    of the compile route for every shape and memory format."""
    x = x.detach()
    if not dense(x):
        x = x.contiguous()
    flat = _alias(x, (x.numel(),), (1,))
    torch._dynamo.maybe_mark_dynamic(flat, 0)
    return flat


def _unflat(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The flat result with x's shape, and x's strides where x is dense (else contiguous, as eager's output is)."""
    return out.as_strided(x.shape, x.stride()) if dense(x) else out.view(x.shape)


def _compile_activation(x, lo, hi, qmax):
    out = _FQ(_flat(x), lo.detach(), hi.detach(), qmax)
    return None if out is None else _unflat(out, x)


def _compile_weight(w, qmax):
    w = w.detach()
    if not rows_contiguous(w):
        w = w.contiguous()
    rows = w.shape[0] if w.dim() else 1
    rows2d = _alias(w, (rows, w.numel() // rows), (w.numel() // rows, 1))
    torch._dynamo.maybe_mark_dynamic(rows2d, 0)
    torch._dynamo.maybe_mark_dynamic(rows2d, 1)
    out = _FQ_CHANNEL(rows2d, qmax)
    return None if out is None else out.as_strided(w.shape, w.stride())


def _compile_error(g, qmax):
    out = _SR(_flat(g), qmax)
    return None if out is None else _unflat(out, g)


# ----------------------------------------------------------------------------------------------------------------------
# The Triton route


_triton_state: dict = {}  # "module": cptsim.numerics.kernels, or "why": why it cannot be imported
_triton_broken: dict[str, str] = {}  # quantizer -> why its Triton kernel is unusable for good


def _triton():
    """cptsim.numerics.kernels, or None (Triton missing: every quantizer records why)."""
    if "module" not in _triton_state and "why" not in _triton_state:
        try:
            from cptsim.numerics import kernels
            _triton_state["module"] = kernels
        except Exception as e:
            _triton_state["why"] = f"Triton unavailable ({_why(e)})"
            for q in QUANTIZERS:
                _triton_broken.setdefault(q, _triton_state["why"])
    return _triton_state.get("module")


def _triton_activation(k, x, lo, hi, qmax):
    return k.fake_quant_tensor(x, lo, hi, qmax)


def _triton_weight(k, w, qmax):
    return k.fake_quant_rows(w, qmax)


def _triton_error(k, g, qmax):
    return k.fake_quant_sr(g, qmax)


_TRITON = {"fake_quant": _triton_activation, "fake_quant_per_channel": _triton_weight,
           "fake_quant_stochastic": _triton_error}
_COMPILE = {"fake_quant": _compile_activation, "fake_quant_per_channel": _compile_weight,
            "fake_quant_stochastic": _compile_error}


def _device_route(x: torch.Tensor) -> str | None:
    """The fused route for this call, or None: a CPU tensor, the eager route, or a tracer that must see aten ops."""
    if x.device.type not in KERNEL_DEVICES:
        return None
    route = quant_route()
    if route == "eager" or torch._C._len_torch_dispatch_stack() or torch.compiler.is_compiling():
        return None
    return route


def _refusal(kernel: str, route: str, x: torch.Tensor, rng: tuple) -> str | None:
    """Why this call cannot take the route (None: it can)."""
    if route == "triton":
        if _triton() is None or kernel in _triton_broken:
            return _triton_broken[kernel]
        why = _triton_state["module"].unsupported(x)
        if why:
            return why
    elif _COMPILED[kernel].failed:
        return _COMPILED[kernel].failed
    if torch.is_grad_enabled() and x.requires_grad:
        return "the input needs autograd (called outside an autograd Function)"
    if rng and (rng[0].numel() != 1 or rng[1].numel() != 1):
        return "a range per channel, not per tensor"
    if kernel == "fake_quant_per_channel" and x.dim() == 0:
        return "a 0-d weight"
    return None


def _on_device(kernel: str, route: str, x: torch.Tensor, qmax: int, *rng) -> torch.Tensor | None:
    """The quantizer on the fused route, or None after recording why the caller runs the eager formula."""
    why = _refusal(kernel, route, x, rng)
    if why is not None:
        _fell_back(kernel, route, why)
        return None
    if route == "compile":
        return _COMPILE[kernel](x, *rng, qmax)
    try:
        return _TRITON[kernel](_triton_state["module"], x, *rng, qmax)
    except torch.OutOfMemoryError:
        raise
    except Exception as e:  # a kernel that does not build or launch here: the eager formula for good
        _triton_broken[kernel] = _why(e)
        _fell_back(kernel, route, _triton_broken[kernel])
        return None


# ----------------------------------------------------------------------------------------------------------------------
# The quantizers the layers call. GPU: the route above. CPU: the one-pass C kernels of cptsim.numerics.ckernels where
# they are built and usable (dense float32, no dispatch mode tracing), else the eager functions. The C kernels
# compute the quantization parameters as choose_qparams does (the same float32 operations), so round-to-nearest is
# bit-identical either way and stochastic rounding is the same formula on other uniform bytes.


def quantize_activation(x: torch.Tensor, lo: torch.Tensor | float, hi: torch.Tensor | float, bits: int,
                        scratch: str | None = None) -> torch.Tensor:
    """Per-tensor round-to-nearest fake quantization: the GPU route on CUDA, one C pass on a CPU, else
    ``fake_quant_per_tensor``. The range is 0-d tensors, or floats (float32 values) from the C kernels' own min/max.
    ``scratch``: the C pass writes into that reusable buffer (``ckernels.scratch``; the caller drops the result)."""
    if (isinstance(lo, float) or lo.dim() == 0) and ckernels.usable(x):  # (CPU only)
        return ckernels.fake_quant_rtn(x, lo, hi, qrange(bits)[1], slot=scratch)
    if isinstance(lo, float):
        lo, hi = torch.tensor(lo, device=x.device), torch.tensor(hi, device=x.device)  # exact: they are float32 values
    route = _device_route(x)
    if route is not None:
        out = _on_device("fake_quant", route, x, qrange(bits)[1], lo, hi)
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
    """Per-output-channel round-to-nearest fake quantization: the GPU route on CUDA, one C call on a CPU, else
    ``fake_quant_per_channel``."""
    route = _device_route(w)
    if route is not None:
        out = _on_device("fake_quant_per_channel", route, w, qrange(bits)[1])
        if out is not None:
            return out
    if w.dim() >= 1 and ckernels.usable(w):
        return ckernels.fake_quant_rtn_channels(w, qrange(bits)[1])
    return fake_quant_per_channel(w, bits, axis=0)


def quantize_error(g: torch.Tensor, bits: int, scratch: str | None = None) -> torch.Tensor:
    """Per-tensor stochastic-rounding fake quantization: the GPU route on CUDA, one C pass with Philox bytes on a
    CPU, else ``fake_quant_stochastic``. ``scratch`` as for ``quantize_activation``."""
    route = _device_route(g)
    if route is not None:
        out = _on_device("fake_quant_stochastic", route, g, qrange(bits)[1])
        if out is not None:
            return out
    if ckernels.usable(g):
        return ckernels.fake_quant_sr(g, qrange(bits)[1], slot=scratch)
    return fake_quant_stochastic(g, bits)

"""Quantized Conv2d / Linear, the shared precision state, and `quantize_model` that swaps them in place.

The precision a step runs at is set once per step on one `PrecisionState` that every quantized layer holds a
reference to, so models keep their normal `forward(x)` signature (CPT's `model(x, num_bits, num_grad_bits)`
does not compose with ordinary models).

What a quantized layer does at forward bits q and gradient bits g (CPT / SBM):
    forward:  y = op(Qa(x), Qw(W)) + b    Qa per-tensor (batch range in training, running range in eval),
                                          Qw per output channel; straight-through estimator for both
    backward: the error dL/dy is quantized per tensor with stochastic rounding to g bits *before* the op's
              backward, so both backward GEMMs (dgrad: error x W, wgrad: error x activation) consume it.
32 bits means the layer runs exactly as the FP32 layer: no quantizer op at all.

Number formats: ``quantize_model(model, number_format="mx")`` gives the PrecisionState a format family's
map (cptsim.numerics.families): at a step of width q the forward operands run in the format q names (mx: 4 MXFP4,
6 MXFP6, 8 MXFP8), the error in the format g names (or ``--grad-format``), each fake-quantized in FP32 by
``cptsim.numerics.formats.quantize`` with straight-through gradients: weights and activations round to nearest even,
per tensor with an FP32 scale (fp8/fp6/fp4), in blocks of 32 with an E8M0 scale (MX) or of 16 with an E4M3 scale and
an FP32 one (NVFP4) along the channel dimension (a conv with fewer channels than a block: along its reduction /
channels-last rows instead; QConv2d); the error with stochastic rounding (see the note in formats.py).
Activations are scaled by the batch's own amax in evaluation too (current scaling: no running range). The integer
family (the default: no map) runs the code below exactly as before, C kernels and all.

PyTorch Geometric's Linear (a graph convolution's dense transform) is swapped as nn.Linear is (``_FOREIGN``:
known by its class path, PyG is never imported here); a message-passing layer's aggregation is quantized only on
request (``quantize_model(..., quant_agg=True)``, cptsim.numerics.graph_layers).
"""

from __future__ import annotations

import fnmatch
from contextlib import contextmanager
from functools import lru_cache, partial
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from cptsim.errors import InputError
from cptsim.numerics import ckernels
from . import exact_gemm, gpu_gemm
from . import formats as _formats
from .graph_layers import AggregationQuantizer, check_has_aggregation, quantize_aggregations, unquantized_parameters
from .quant import (FULL_PRECISION, check_bits, choose_qparams, qrange, quantize_activation, quantize_error,
                    quantize_weight)
from .quant import QuantActivationSTE as _QuantInput  # per-tensor fake quantization, straight-through gradient
from . import quant as _quant

ACT_MOMENTUM = 0.9  # running-range momentum for eval, as in the SBM/CPT code


class _NoScope:
    """A no-op stand-in for quant.fallback_scope (a quant module without fallback records)."""

    __slots__ = ()

    def __init__(self, name=None):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# The quantizers record a call that ran a slower path than the chosen one against the layer named by the innermost
# scope: a quantized layer names itself (its module name, set by quantize_model) around its quantizers, and again in
# backward, which autograd runs on a thread of its own on a GPU.
_fallback_scope = getattr(_quant, "fallback_scope", _NoScope)


def _name(layer) -> str | None:
    return layer.__dict__.get("_cptsim_name")


def _scoped_error(grad: torch.Tensor, bits: int, name: str | None) -> torch.Tensor:
    """quantize_error(grad, bits) with the layer ``name`` as its fallback scope (the error hook)."""
    with _fallback_scope(name):
        return quantize_error(grad, bits)


@dataclass
class PrecisionState:
    """The bits every quantized layer runs at right now; the training loop sets it each step.

    ``formats``: a float family's ``cptsim.numerics.families.FormatMap`` (every width names a format); None: the
    integer family, CPT's integers (today's path, untouched)."""

    bits: int = FULL_PRECISION
    grad_bits: int = FULL_PRECISION
    formats: object = None

    def set(self, bits: int, grad_bits: int) -> None:
        self.bits = check_bits(int(bits), "forward bits")
        self.grad_bits = check_bits(int(grad_bits), "gradient bits")

    def forward_format(self):
        """The ``Format`` the forward operands run in now, or None (the integer family, or 32 bits)."""
        f = self.formats
        if f is None or self.bits == FULL_PRECISION:
            return None
        return _format(f.fwd_names[self.bits])

    def gradient_format(self):
        """The ``Format`` the error runs in now, or None (the integer family, or 32 gradient bits)."""
        f = self.formats
        if f is None or self.grad_bits == FULL_PRECISION:
            return None
        return _format(f.grad_names[self.grad_bits])


@lru_cache(maxsize=None)
def _format(name: str):
    return _formats.parse_format(name)


class _QuantInputTracked(torch.autograd.Function):
    """_QuantInput in training with the C kernels: the batch range, the layer's running range and the quantization
    in one call (see _QuantMixin._kernel_input). The batch range is appended to ``rng`` as floats."""

    @staticmethod
    def forward(ctx, x, layer, bits, rng):
        xq, lo, hi = layer._quantize_tracked(x, bits)
        rng += (lo, hi)
        return xq

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None


class _QuantLayerCPU(torch.autograd.Function):
    """A whole quantized layer as one autograd node: CPU training with the C kernels (see _QuantMixin._one_node).

    What it computes is what the general path of _quantized_call does -- y = op(Qa(x), Qw(W)) + b with x's batch
    range and the running-range update, straight-through gradients, the error quantized (stochastic rounding, g
    bits) before both backward GEMMs, Qa(x) recomputed in backward from x and its range rather than kept -- with
    the op's own backward (aten.convolution_backward; the three GEMMs of a linear layer) called here. One node
    instead of four (the two quantizers' straight-through nodes, the op's, the error hook) and no Python
    saved-tensor hooks: ~125 us less per layer per step, which in a quantized CPU step (where small ops run with
    cold caches) is ~1% of a resnet20 step. Not twice differentiable (create_graph=True raises: run
    with CPTSIM_CKERNELS=0 for that)."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer, bits, grad_bits):
        # Qa(x) dies with the op below, so it goes into the thread's reusable buffer (ckernels.scratch)
        xq, lo, hi = layer._quantize_tracked(x, bits, slot="act")
        wq = quantize_weight(weight, bits)
        y = layer._op(xq, wq, bias)
        ctx.save_for_backward(x)  # alive anyway (the layer before holds it); autograd checks its version
        ctx.wq, ctx.layer, ctx.range, ctx.bits, ctx.grad_bits = wq, layer, (lo, hi), bits, grad_bits
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors  # first: a checkpointed graph recomputes here, and may use the scratch buffers
        # The quantized error and Qa(x) die with the op's backward: the reusable buffers where the kernels run (a
        # dispatch mode entered for backward alone gets the eager quantizers, which it can see)
        if ctx.grad_bits != FULL_PRECISION:
            grad = quantize_error(grad, ctx.grad_bits, scratch="err")
        xq = quantize_activation(x, *ctx.range, ctx.bits, scratch="act")  # forward's Qa(x), bit for bit
        need = ctx.needs_input_grad
        gx, gw, gb = ctx.layer._op_backward(grad, xq, ctx.wq, (need[0], need[1], ctx.has_bias and need[2]))
        return gx, gw, gb, None, None, None


class _ExactLinearCPU(torch.autograd.Function):
    """_QuantLayerCPU for a linear layer with the exact integer GEMMs of cptsim.numerics.exact_gemm: the same
    quantizer calls in the same order (so the same random stream), the forward GEMM and (at gradient bits <= 8)
    wgrad as int8 ``torch._int_mm`` with the scales and offsets factored out, dgrad on the fake-quantized values as
    today. Used only when ``_QuantLinearMixin._exact`` says so (CPU training, bits <= 8, exact_gemm.enabled(): by
    default where this machine's int8 GEMM measured fast enough, CPTSIM_EXACT_GEMM=0/1 forces it)."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer, bits, grad_bits):
        xq, lo, hi = layer._quantize_tracked(x, bits, slot="act")
        sx, zx = exact_gemm.per_tensor_qparams(lo, hi, bits)
        fin = x.shape[-1]
        ax = exact_gemm.codes(xq.reshape(-1, fin), sx, zx)
        ox = exact_gemm.offset(zx)
        wq, aw, sw, ow, cw = layer._exact_weight(weight, bits)
        y = exact_gemm.int_linear(ax, aw, ox, ow, sx * sw, bias, (*x.shape[:-1], aw.shape[1]), col_sums=cw)
        tokens = ax.shape[0]
        wpath = exact_gemm.wgrad_path(bits, grad_bits, tokens)
        ctx.save_for_backward(x)
        ctx.ax = ax if wpath == exact_gemm.INT8 else None
        ctx.wq, ctx.sx, ctx.ox, ctx.layer, ctx.range = wq, sx, ox, layer, (lo, hi)
        ctx.bits, ctx.grad_bits, ctx.has_bias = bits, grad_bits, bias is not None
        layer.gemm_path = {"forward": exact_gemm.INT8, "dgrad": exact_gemm.FAKE, "wgrad": wpath}
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        need = ctx.needs_input_grad
        # dense once, here: the quantizer would copy a strided error (an LM head's, from the logits' transpose)
        # itself, and the range pass below would copy it again. The same values in the same storage order, so the
        # quantizer draws the same random bytes for the same elements.
        grad = grad if grad.is_contiguous() else grad.contiguous()
        g2 = grad.view(-1, grad.shape[-1])
        gw = None
        if ctx.ax is not None:  # wgrad on the integers: the error's range first (quantize_error takes the same)
            lo, hi = ckernels.minmax(g2)
            sg, zg = exact_gemm.per_tensor_qparams(lo, hi, ctx.grad_bits)
            if ckernels.usable(grad):  # quantize_error's output bit for bit, and the codes of the same levels
                gq, ag = ckernels.fake_quant_sr_codes(grad, lo, hi, qrange(ctx.grad_bits)[1], slot="err")
                ag = ag.view(-1, ag.shape[-1])
            else:
                gq = quantize_error(grad, ctx.grad_bits, scratch="err")
                ag = exact_gemm.codes(gq.reshape(-1, gq.shape[-1]), sg, zg) if need[1] else None
            gq2 = gq.reshape(-1, gq.shape[-1])
            if need[1]:
                gw = exact_gemm.int_linear(ag.t(), ctx.ax, exact_gemm.offset(zg), ctx.ox, sg * ctx.sx, None,
                                           (ag.shape[1], ctx.ax.shape[1]))
        else:
            gq = grad if ctx.grad_bits == FULL_PRECISION else quantize_error(grad, ctx.grad_bits, scratch="err")
            gq2 = gq.reshape(-1, gq.shape[-1])
            if need[1]:
                xq = quantize_activation(x, *ctx.range, ctx.bits, scratch="act")
                gw = gq2.t().mm(xq.reshape(-1, xq.shape[-1]))
        gx = gq.matmul(ctx.wq) if need[0] else None
        gb = gq2.sum(0) if ctx.has_bias and need[2] else None
        ctx.ax = None
        return gx, gw, gb, None, None, None


class _IntCodesLayer(torch.autograd.Function):
    """A quantized Conv2d / Linear with its forward and wgrad GEMMs on the integer codes, TF32 on, the scales after
    (cptsim.numerics.exact_gemm, "Integer codes on TF32"): exact on CUDA, where today's path convolves fake-quantized
    values that TF32 rounds. The same quantizer calls as the general path -- Qa(x) with the batch range and the
    running-range update, Qw(W) per output channel, the error with stochastic rounding in backward -- and the same
    straight-through gradients; dgrad on the fake-quantized values (today's GEMM). Qa(x) is recomputed in backward
    from x and its range (the same function of the same operands: the same tensor), as the general path does."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer, bits, grad_bits):
        lo, hi = layer._input_range(x)
        sx = choose_qparams(lo, hi, bits)[0]
        xi = exact_gemm.int_values(quantize_activation(x, lo, hi, bits), sx)
        wq = quantize_weight(weight, bits)
        sw = exact_gemm.channel_scale(weight, bits)
        wi = exact_gemm.int_values(wq, sw.view(-1, *[1] * (weight.dim() - 1)))
        with exact_gemm.tf32():
            y = layer._op(xi, wi, None)
        del xi, wi
        shape = [1] * y.dim()
        shape[layer._channel_dim] = -1
        y.mul_((sx * sw).view(shape))
        if bias is not None:
            y.add_(bias.view(shape))
        ctx.save_for_backward(x, lo, hi, sx)
        ctx.wq, ctx.layer, ctx.bits, ctx.grad_bits, ctx.has_bias = wq, layer, bits, grad_bits, bias is not None
        wpath = exact_gemm.TF32_CODES if grad_bits <= exact_gemm.MAX_TF32_BITS else exact_gemm.FAKE
        layer.__dict__["gemm_path"] = {"forward": exact_gemm.TF32_CODES, "dgrad": exact_gemm.FAKE, "wgrad": wpath}
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        with _fallback_scope(_name(ctx.layer)):
            return _IntCodesLayer._backward(ctx, grad)

    @staticmethod
    def _backward(ctx, grad):
        x, lo, hi, sx = ctx.saved_tensors
        layer, g, need = ctx.layer, ctx.grad_bits, ctx.needs_input_grad
        gq = grad if g == FULL_PRECISION else quantize_error(grad, g)
        gx = gw = gb = None
        if need[0] or (ctx.has_bias and need[2]):
            gx, _, gb = layer._op_backward(gq, x, ctx.wq, (need[0], False, ctx.has_bias and need[2]))
        if need[1]:
            xq = quantize_activation(x, lo, hi, ctx.bits)  # forward's Qa(x), bit for bit
            if g <= exact_gemm.MAX_TF32_BITS:
                sg = exact_gemm.tensor_scale(grad, g)  # quantize_error's scale: the same range, the same formula
                ei = exact_gemm.int_values(gq, sg)
                with exact_gemm.tf32():
                    gw = layer._op_backward(ei, exact_gemm.int_values(xq, sx), ctx.wq, (False, True, False))[1]
                gw.mul_(sg * sx)
            else:
                gw = layer._op_backward(gq, xq, ctx.wq, (False, True, False))[1]
        ctx.wq = None
        return gx, gw, gb, None, None, None


class _TensorCoreLayer(torch.autograd.Function):
    """A quantized Conv2d / Linear whose three GEMMs take the routes cptsim.numerics.gpu_gemm names (``routes``:
    ``gpu_gemm.route`` for this layer, bits and shapes): at <= 8 bits the forward and wgrad on int8 tensor cores with
    int32 sums, dgrad on FP16, wider as that module says. The same quantizer calls as the general path -- Qa(x) with
    the batch range and the running-range update, Qw(W) per output channel, the error with stochastic rounding in
    backward -- and the same straight-through gradients; the GEMMs take the integers of the quantizers' outputs.
    Backward re-quantizes x from its range (the same tensor) unless the forward's int8 codes serve wgrad (kept: one
    byte per input element)."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer, bits, grad_bits, routes):
        lo, hi = layer._input_range(x)
        sx = choose_qparams(lo, hi, bits)[0]
        # Qa(x)'s integers over Qa(x) itself (exact_gemm.int_values' operations, in place: one activation-sized
        # tensor fewer)
        xv = quantize_activation(x, lo, hi, bits).mul_(sx.reciprocal()).round_()
        wq = quantize_weight(weight, bits)
        sw = exact_gemm.channel_scale(weight, bits)
        wv = exact_gemm.int_values(wq, sw.view(-1, *[1] * (weight.dim() - 1)))
        y, codes = gpu_gemm.forward(layer._tc_kind, routes["forward"], xv, sx, wv, sw, bias, bits, layer._tc_geom)
        del xv, wv
        ctx.save_for_backward(x, lo, hi, sx)
        ctx.wq, ctx.sw, ctx.layer, ctx.bits, ctx.grad_bits, ctx.routes = wq, sw, layer, bits, grad_bits, routes
        ctx.codes = codes if routes["wgrad"] in (gpu_gemm.INT8, gpu_gemm.INT8_IMPLICIT) else None
        ctx.has_bias = bias is not None
        layer.__dict__["gemm_path"] = dict(routes)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        with _fallback_scope(_name(ctx.layer)):
            return _TensorCoreLayer._backward(ctx, grad)

    @staticmethod
    def _backward(ctx, grad):
        x, lo, hi, sx = ctx.saved_tensors
        layer, g, need, routes, wq = ctx.layer, ctx.grad_bits, ctx.needs_input_grad, ctx.routes, ctx.wq
        kind, geom, bits = layer._tc_kind, layer._tc_geom, ctx.bits
        gq = grad if g == FULL_PRECISION else quantize_error(grad, g)
        ev = se = None
        if (need[0] and routes["dgrad"] != gpu_gemm.FAKE) or (need[1] and routes["wgrad"] != gpu_gemm.FAKE):
            se = exact_gemm.tensor_scale(grad, g)  # quantize_error's scale: the same range, the same formula
            ev = exact_gemm.int_values(gq, se)
        gx = gw = gb = None
        if need[0]:
            if routes["dgrad"] == gpu_gemm.FAKE:
                gx = layer._op_backward(gq, x, wq, (True, False, False))[0]
            else:
                gx = gpu_gemm.dgrad(kind, ev, se, g, wq, ctx.sw, bits, x.shape, geom)
        if need[1]:
            r = routes["wgrad"]
            if ctx.codes is not None:
                gw = gpu_gemm.wgrad(kind, r, ev, se, g, sx, bits, wq.shape, geom, codes=ctx.codes)
            else:
                xq = quantize_activation(x, lo, hi, bits)  # forward's Qa(x), bit for bit
                if r == gpu_gemm.FAKE:
                    gw = layer._op_backward(gq, xq, wq, (False, True, False))[1]
                else:
                    gw = gpu_gemm.wgrad(kind, r, ev, se, g, sx, bits, wq.shape, geom,
                                        xv=xq.mul_(sx.reciprocal()).round_())
        if ctx.has_bias and need[2]:
            gb = gq.reshape(-1, gq.shape[-1]).sum(0) if kind == "linear" else gq.sum((0, 2, 3))
        ctx.wq = ctx.codes = None
        return gx, gw, gb, None, None, None, None


class _QuantWeight(torch.autograd.Function):
    """Per-output-channel fake quantization with a straight-through gradient."""

    @staticmethod
    def forward(ctx, w, bits):
        return quantize_weight(w, bits)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _QuantError(torch.autograd.Function):
    """Identity forward; quantizes the incoming error (dL/d output) with stochastic rounding in backward."""

    @staticmethod
    def forward(ctx, y, bits):
        ctx.bits = bits
        # A copy, not a view: models apply in-place ops (ReLU(inplace=True)) straight to a layer's output,
        # which autograd forbids on a custom Function's view output. One memcpy of the output per layer.
        return y.clone()

    @staticmethod
    def backward(ctx, grad):
        return quantize_error(grad, ctx.bits), None


class _QuantMixin:
    """What QConv2d and QLinear share: the precision reference, the running activation range, the three quantizers."""

    precision: PrecisionState

    def _init_quant(self, precision: PrecisionState) -> None:
        self.precision = precision
        # Running input range for eval; act_count = 0 means "never seen a training batch".
        self.register_buffer("act_lo", torch.zeros((), device=self.weight.device))
        self.register_buffer("act_hi", torch.zeros((), device=self.weight.device))
        self.register_buffer("act_count", torch.zeros((), dtype=torch.long, device=self.weight.device))

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        # the running input range is state (a resumed run continues with it), also under a layer whose own
        # _save_to_state_dict writes its parameters only (PyG's Linear, for its lazy weights)
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name in ("act_lo", "act_hi", "act_count"):
            buf = self._buffers.get(name)
            if buf is not None and prefix + name not in destination:
                destination[prefix + name] = buf if keep_vars else buf.detach()

    def _input_range(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # No host read of act_count (an int() here was a host-device synchronisation per layer per step on a GPU):
        # "never seen a training batch" is decided on the device with torch.where, so whoever zeroes act_count
        # (BatchNorm re-estimation does) or loads a state dict gets exactly the old behaviour.
        lo, hi = torch.aminmax(x.detach())
        if self.training and self.act_count.device.type == "cpu" and not torch._C._len_torch_dispatch_stack():
            # On a CPU reading act_count costs nothing, and the same arithmetic takes 5 small ops instead of 10
            # (their per-op overhead is a measurable share of a quantized CPU step). Under a dispatch mode
            # the device path below runs instead: what tests/test_cuda.py's read counter checks on a CPU is the
            # code a GPU runs.
            with torch.no_grad():
                if int(self.act_count) == 0:
                    self.act_lo.copy_(lo)
                    self.act_hi.copy_(hi)
                else:
                    self.act_lo.mul_(ACT_MOMENTUM).add_(lo, alpha=1 - ACT_MOMENTUM)
                    self.act_hi.mul_(ACT_MOMENTUM).add_(hi, alpha=1 - ACT_MOMENTUM)
                self.act_count += 1
            return lo, hi
        first = self.act_count == 0
        if self.training:
            with torch.no_grad():
                # first batch: its range; later ones: a running average (the same arithmetic as mul_ then add_)
                self.act_lo.copy_(torch.where(first, lo, torch.add(self.act_lo * ACT_MOMENTUM, lo,
                                                                   alpha=1 - ACT_MOMENTUM)))
                self.act_hi.copy_(torch.where(first, hi, torch.add(self.act_hi * ACT_MOMENTUM, hi,
                                                                   alpha=1 - ACT_MOMENTUM)))
                self.act_count += 1
            return lo, hi
        return torch.where(first, lo, self.act_lo), torch.where(first, hi, self.act_hi)

    def _kernel_input(self, x: torch.Tensor) -> bool:
        """Training on a CPU with the C kernels: the input's range, the running-range update and the quantization
        are one kernel call (``ckernels.fake_quant_rtn_tracked``) instead of ten torch ops. In a quantized step each
        small op costs 10-20 us -- the big passes before it have flushed the caches -- so those ten were ~3 ms of a
        resnet20 step."""
        return (self.training and self.act_lo.dtype == torch.float32 and self.act_count.dtype == torch.int64
                and self.act_lo.device.type == "cpu" and ckernels.usable(x.detach()))

    def _quantize_tracked(self, x: torch.Tensor, bits: int, slot: str | None = None
                          ) -> tuple[torch.Tensor, float, float]:
        """Qa(x) with x's batch range, and the running-range update, in one kernel call (when _kernel_input)."""
        return ckernels.fake_quant_rtn_tracked(x, self.act_lo, self.act_hi, self.act_count, qrange(bits)[1],
                                               ACT_MOMENTUM, slot=slot)

    def _one_node(self, x: torch.Tensor) -> bool:
        """The layer can run as _QuantLayerCPU: a class that has _op/_op_backward, float32 CPU weight (and bias),
        and no quantized-weight cache (reuse_quantized_weights sums one straight-through gradient over calls)."""
        w, b = self.weight, self.bias
        return (hasattr(self, "_op_backward") and "_wq_cache" not in self.__dict__ and ckernels.usable(w.detach())
                and (b is None or (b.dtype == torch.float32 and b.device.type == "cpu")))

    def _quantized_call(self, op, x: torch.Tensor) -> torch.Tensor:
        with _fallback_scope(_name(self)):
            return self._quantized_call_scoped(op, x)

    def _quantized_call_scoped(self, op, x: torch.Tensor) -> torch.Tensor:
        """``op(Qa(x), Qw(W))`` with the error quantized in backward.

        The op (conv, linear) saves its input for wgrad; that input would be Qa(x), an activation-sized tensor per
        layer alive until backward on top of x itself (which the previous ReLU / BatchNorm / the data keep alive
        anyway): +30% peak memory on resnet20. So it saves x and the range instead, and backward re-quantizes --
        the same deterministic function of the same operands, hence the same tensor bit for bit."""
        bits = self.precision.bits
        if bits == FULL_PRECISION:
            return self._quantize_error(op(x, self.weight))
        fmt = self.precision.forward_format()
        if fmt is not None:  # a float format (number_format fp | mx | nvfp): its own path, below
            return self._format_call(op, x, fmt)
        routes = self._tc_routes(x, bits)
        if routes is not None:  # GEMMs on tensor cores where exact (CUDA where measured to pay, or forced)
            return _TensorCoreLayer.apply(x, self.weight, self.bias, self, bits, self.precision.grad_bits, routes)
        if self._codes(x, bits):  # exact GEMMs on the integer codes (CUDA with CPTSIM_EXACT_GEMM=1, opt-in)
            return _IntCodesLayer.apply(x, self.weight, self.bias, self, bits, self.precision.grad_bits)
        kernel_input = self._kernel_input(x)
        if kernel_input and self._exact(x, bits):
            return _ExactLinearCPU.apply(x, self.weight, self.bias, self, bits, self.precision.grad_bits)
        if kernel_input and self._one_node(x):
            return _QuantLayerCPU.apply(x, self.weight, self.bias, self, bits, self.precision.grad_bits)
        if kernel_input:
            rng: list = []  # the batch range comes back as floats, for backward's re-quantization
            xq = _QuantInputTracked.apply(x, self, bits, rng)
            lo, hi = rng
        else:
            lo, hi = self._input_range(x)
            xq = _QuantInput.apply(x, lo, hi, bits)
        w = self._quantized_weight(bits)
        if not (torch.is_grad_enabled() and (xq.requires_grad or w.requires_grad)):
            return self._quantize_error(op(xq, w))
        xd, version, key, name = x.detach(), x._version, (xq.data_ptr(), xq.shape, xq.dtype), _name(self)
        # (the hooks refer to xq's key, not to xq: autograd keeps the hooks, and with them what they refer to)

        def pack(t):
            if (t.data_ptr(), t.shape, t.dtype) == key:
                return (xd, version, lo, hi, bits)
            return t

        def unpack(p):
            if not isinstance(p, tuple):
                return p
            x0, v, lo0, hi0, b = p
            if x0._version != v:
                raise RuntimeError("the input of a quantized layer was modified in place after its forward; "
                                   "its quantized copy cannot be recomputed for backward")
            with torch.no_grad(), _fallback_scope(name):
                return quantize_activation(x0, lo0, hi0, b)

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            y = op(xq, w)
        return self._quantize_error(y)

    # The dimension of the layer's input and output that holds its channels: MX / NVFP4 blocks run along it (a
    # Linear's features, the last dimension; a convolution's channels, dimension 1, when there is at least a block of
    # them: QConv2d). A Linear's weight blocks along dimension 1, a conv's along its reduction (QConv2d).
    _channel_dim = -1
    _exact_capable = False  # a Linear (its mixin says True): the int8 path and the FP8 _scaled_mm forward

    def _format_call(self, op, x: torch.Tensor, fmt) -> torch.Tensor:
        """``op(Q(x), Q(W))`` in the float format ``fmt`` (round to nearest even, straight-through), the error in the
        gradient format in backward (``_quantize_error``). The op keeps its quantized input for wgrad (the integer
        path's recompute-in-backward trick is not worth it here: this is the FP32 emulation of a format)."""
        xq = self._fq_input(x, fmt)
        wq = self._format_weight(fmt)
        if fmt.name == "fp8e4m3" and self._exact_capable:
            # a Linear's FP8 forward GEMM on torch._scaled_mm where the device has it (exact_gemm: CUDA sm89+)
            y = exact_gemm.scaled_mm_linear(x, xq, self.weight, wq, self.bias, fmt)
            fwd = exact_gemm.FAKE if y is None else exact_gemm.SCALED_MM
            self.__dict__["gemm_path"] = {"forward": fwd, "dgrad": exact_gemm.FAKE, "wgrad": exact_gemm.FAKE}
            if y is not None:
                return self._quantize_error(y)
        return self._quantize_error(op(xq, wq))

    def _format_weight(self, fmt) -> torch.Tensor:
        # as _quantized_weight: once per forward inside reuse_quantized_weights (the LSTM's hidden-to-hidden layer)
        cache = self.__dict__.get("_wq_cache")
        if cache is None:
            return self._fq_weight(self.weight, fmt)
        key = (self.weight._version, fmt.name, torch.is_grad_enabled())
        if cache.get("fkey") != key:
            cache["fkey"], cache["fw"] = key, self._fq_weight(self.weight, fmt)
        return cache["fw"]

    # Where a float format's blocks (MX: 32 elements, NVFP4: 16) run. A Linear: activations and errors along their
    # features (the last dimension), the weight (out, in) along dimension 1: the GEMM's reduction. QConv2d overrides
    # these for channel counts that do not hold whole blocks (its docstring).
    def _fq_input(self, x: torch.Tensor, fmt) -> torch.Tensor:
        return _formats.QuantFormatSTE.apply(x, fmt, self._channel_dim)

    def _fq_weight(self, w: torch.Tensor, fmt) -> torch.Tensor:
        return _formats.QuantFormatSTE.apply(w, fmt, 1)

    def _error_fn(self, gfmt):
        return partial(_formats.quantize_error, fmt=gfmt, dim=self._channel_dim)

    def _exact(self, x: torch.Tensor, bits: int) -> bool:
        """The exact integer path (cptsim.numerics.exact_gemm): a linear layer only (see _QuantLinearMixin)."""
        return False

    _codes_capable = False  # QConv2d and the Linear mixin: _IntCodesLayer can run them (exact_gemm.codes_gemm_paths)

    def _codes(self, x: torch.Tensor, bits: int) -> bool:
        """The integer-codes path (_IntCodesLayer): on where exact_gemm.codes_on says, for a layer class that can
        take it, bits <= 11, float32 input and weight on one device, no autocast, no per-forward weight cache."""
        if not (self._codes_capable and bits <= exact_gemm.MAX_TF32_BITS and exact_gemm.codes_on(x.device)):
            return False
        w = self.weight
        return (x.dtype == torch.float32 and w.dtype == torch.float32 and w.device == x.device
                and (self.bias is None or self.bias.dtype == torch.float32)
                and "_wq_cache" not in self.__dict__ and not torch.is_autocast_enabled(x.device.type))

    _tc_kind = None  # gpu_gemm.layer_kind of a layer _TensorCoreLayer can run (QConv2d, the Linear mixin)
    _tc_geom = None  # a convolution's (stride, padding, dilation, groups)

    def _tc_routes(self, x: torch.Tensor, bits: int) -> dict | None:
        """The tensor-core routes (gpu_gemm.route) this call takes, or None for the paths below: on where
        gpu_gemm.enabled says (CUDA where measured faster, or CPTSIM_EXACT_GEMM=int8), for a layer class that can take
        them, float32 input, weight and bias on one device, no autocast (AMP's own GEMMs then), no per-forward weight
        cache; None too where every GEMM's route would be today's."""
        if self._tc_kind is None or (x.device.type == "cpu" and exact_gemm.mode() != "int8"):
            return None  # (a CPU's default: one environment read, then the CPU paths as before)
        w = self.weight
        if not (x.dtype == torch.float32 and w.dtype == torch.float32 and w.device == x.device
                and (self.bias is None or self.bias.dtype == torch.float32) and "_wq_cache" not in self.__dict__
                and not torch.is_autocast_enabled(x.device.type)):
            return None
        if not gpu_gemm.enabled(x.device):  # (after the autocast check: a first call may time the routes here)
            return None
        routes = gpu_gemm.layer_routes(self, bits, self.precision.grad_bits, x.device)
        return None if all(r == gpu_gemm.FAKE for r in routes.values()) else routes

    def _quantized_weight(self, bits: int) -> torch.Tensor:
        # Inside reuse_quantized_weights (an LSTM's hidden-to-hidden layer, called once per time step of one
        # forward) the quantized weight is made once and reused while the weight's version counter and the bits
        # stay the same; its straight-through gradient reaches the master weight once, summed over the calls.
        cache = self.__dict__.get("_wq_cache")
        if cache is None:
            return _QuantWeight.apply(self.weight, bits)
        key = (self.weight._version, bits, torch.is_grad_enabled())
        if cache.get("key") != key:
            cache["key"], cache["w"] = key, _QuantWeight.apply(self.weight, bits)
        return cache["w"]

    def _quantize_error(self, y: torch.Tensor) -> torch.Tensor:
        g = self.precision.grad_bits
        if g == FULL_PRECISION or not (torch.is_grad_enabled() and y.requires_grad):
            return y
        gfmt = self.precision.gradient_format()
        if gfmt is not None:  # a float gradient format (stochastic rounding), blocks along the output channels
            y.register_hook(self._error_fn(gfmt))
            return y
        # A gradient hook on the output, not _QuantError: that identity Function has to return a copy (in-place ops
        # such as ReLU(inplace=True) follow a layer, and autograd forbids them on a custom Function's view output),
        # one more output-sized tensor per layer alive until backward (+20-57% peak memory on resnet20). A hook
        # registered before an in-place op receives the gradient w.r.t. the tensor as it was then -- the layer's own
        # output -- and what it returns is what flows into the layer's backward (dgrad and wgrad).
        y.register_hook(partial(_scoped_error, bits=g, name=_name(self)))
        return y


def _whole_blocks(t: torch.Tensor, fmt) -> bool:
    """Whether a conv tensor blocks along its channel dimension (1): a per-tensor format, or at least one whole block
    of ``fmt`` there (QConv2d's docstring)."""
    return not fmt.block or t.dim() != 4 or t.shape[1] >= fmt.block


def _nhwc_blocks(t: torch.Tensor, fn) -> torch.Tensor:
    """``fn(v)`` on an NCHW tensor viewed as NHWC rows (N, H, W*C): blocks run along channels, then along W, as in
    the tensor stored channels-last; back to NCHW, contiguous."""
    n, c, h, w = t.shape
    v = t.permute(0, 2, 3, 1).reshape(n, h, w * c)
    return fn(v).reshape(n, h, w, c).permute(0, 3, 1, 2).contiguous()


def _conv_error(g: torch.Tensor, fmt) -> torch.Tensor:
    if _whole_blocks(g, fmt):
        return _formats.quantize_error(g, fmt, dim=1)
    return _nhwc_blocks(g, lambda v: _formats.quantize_error(v, fmt, dim=-1))


class QConv2d(_QuantMixin, nn.Conv2d):
    """nn.Conv2d that runs at the shared precision (see module docstring).

    Float block formats (MX: 32 elements, NVFP4: 16) block along the GEMM's reduction. The weight
    (O, C_in/groups, kh, kw): along dimension 1 (input channels, at each kernel position; a last partial block padded
    with zeros, as MX pads K) when C_in/groups holds at least one block; when it holds less -- a depthwise conv's
    (C, 1, 3, 3), a first conv's (O, 3, 3, 3), 16-channel layers under MX -- along each output channel's whole
    reduction in implicit-GEMM (channels-last) order (kh, kw, C_in/groups): a depthwise conv blocks each channel's
    9 taps together, an RGB conv its 27. (Blocking along a size-1 dimension 1 gave every element its own scale: no
    block format at all, and more accurate than the format is.) Activations and errors, by the same rule: along
    channels when there are at least a block of them, else along the channels-last rows (W, C) as the tensor stored
    channels-last blocks: a 1- or 3-channel image blocks over neighbouring pixels. (A depthwise conv's activations
    block along channels, not along its reduction -- each channel's window -- as its stored tensor does; a depthwise
    conv is no tensor-core GEMM on these GPUs.)"""

    _channel_dim = 1

    def _fq_input(self, x: torch.Tensor, fmt) -> torch.Tensor:
        if _whole_blocks(x, fmt):
            return super()._fq_input(x, fmt)
        return _nhwc_blocks(x, lambda v: _formats.QuantFormatSTE.apply(v, fmt, -1))

    def _fq_weight(self, w: torch.Tensor, fmt) -> torch.Tensor:
        if _whole_blocks(w, fmt):
            return super()._fq_weight(w, fmt)
        o, i, kh, kw = w.shape
        v = _formats.QuantFormatSTE.apply(w.permute(0, 2, 3, 1).reshape(o, kh * kw * i), fmt, -1)
        return v.reshape(o, kh, kw, i).permute(0, 3, 1, 2).contiguous()

    def _error_fn(self, gfmt):
        return partial(_conv_error, fmt=gfmt)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._quantized_call(lambda a, w: self._conv_forward(a, w, self.bias), x)

    @property
    def _codes_capable(self) -> bool:
        # aten.convolution_backward (which _IntCodesLayer and _QuantLayerCPU call) takes numeric zero padding:
        # 'same'/'valid' and padded modes take the general path
        return self.padding_mode == "zeros" and not isinstance(self.padding, str)

    def _one_node(self, x: torch.Tensor) -> bool:
        return self._codes_capable and super()._one_node(x)

    @property
    def _tc_kind(self):
        return gpu_gemm.layer_kind(self.kernel_size, self.padding, self.groups) if self._codes_capable else None

    @property
    def _tc_geom(self):
        return self.stride, self.padding, self.dilation, self.groups

    def _op(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        return F.conv2d(x, w, b, self.stride, self.padding, self.dilation, self.groups)

    def _op_backward(self, grad, x, w, mask):
        """dgrad, wgrad, bias grad: the op autograd records for conv2d (ConvolutionBackward0) calls the same."""
        return torch.ops.aten.convolution_backward(
            grad, x, w, [w.shape[0]] if mask[2] else None, list(self.stride), list(self.padding),
            list(self.dilation), False, [0, 0], self.groups, list(mask))


class _QuantLinearMixin(_QuantMixin):
    """The quantized linear op, ``y = x W^T + b`` over any leading dims, for any class whose weight is (out, in):
    nn.Linear (QLinear) and PyTorch Geometric's Linear (QPygLinear, made on demand: see _FOREIGN)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._quantized_call(lambda a, w: F.linear(a, w, self.bias), x)

    _exact_capable = True  # exact_gemm.gemm_paths: this layer can take the int8 path
    _codes_capable = True  # _IntCodesLayer (exact_gemm: integer codes on TF32)
    _tc_kind = "linear"  # _TensorCoreLayer (gpu_gemm)

    def _op(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, w, b)

    def _exact(self, x: torch.Tensor, bits: int) -> bool:
        """Training on a CPU with the C kernels (the caller checked), bits <= 8, exact_gemm.enabled(), float32
        weight and bias on the CPU, a K the int32 bracket holds. Otherwise today's path (``gemm_path`` says so)."""
        w, b = self.weight, self.bias
        ok = (bits <= exact_gemm.MAX_BITS and exact_gemm.enabled() and w.dim() == 2 and x.dim() >= 2
              and w.shape[1] <= exact_gemm.MAX_K and ckernels.usable(w.detach())
              and (b is None or (b.dtype == torch.float32 and b.device.type == "cpu")))
        if not ok:
            self.__dict__["gemm_path"] = {k: exact_gemm.FAKE for k in ("forward", "dgrad", "wgrad")}
        return ok

    def _exact_weight(self, weight: torch.Tensor, bits: int):
        """(Qw(W) float32, its int8 codes, scale, offset): made once per weight version and bits inside
        reuse_quantized_weights (the LSTM's hidden-to-hidden layer), else once per call."""
        cache = self.__dict__.get("_wq_cache")
        key = (weight._version, bits)
        if cache is not None and cache.get("exact_key") == key:
            return cache["exact"]
        out = exact_gemm.weight_codes(weight, bits)
        if cache is not None:
            cache["exact_key"], cache["exact"] = key, out
        return out

    def _op_backward(self, grad, x, w, mask):
        """y = x W^T + b over any leading dims: dgrad = g W, wgrad = g^T x, bias grad = sum of g (2-D GEMMs)."""
        g2 = grad.reshape(-1, grad.shape[-1])
        gx = grad.matmul(w) if mask[0] else None
        gw = g2.t().mm(x.reshape(-1, x.shape[-1])) if mask[1] else None
        gb = g2.sum(0) if mask[2] else None
        return gx, gw, gb


class QLinear(_QuantLinearMixin, nn.Linear):
    """nn.Linear that runs at the shared precision (see module docstring)."""


_SWAP = {nn.Conv2d: QConv2d, nn.Linear: QLinear}
# Layers of other libraries that compute a swappable layer's op, known by their class path so that cptsim never
# imports the library: (module, qualname) -> (the quantized op's mixin, the name of the class made from the two).
# PyTorch Geometric's Linear (GCNConv's, SAGEConv's, GATConv's dense transform) is not an nn.Linear, but computes
# F.linear(x, weight, bias) with weight (out, in): it runs as QLinear does.
_FOREIGN = {("torch_geometric.nn.dense.linear", "Linear"): (_QuantLinearMixin, "QPygLinear")}
# The quantized modules: _QuantMixin covers the classes made on demand (subclasses, QPygLinear), so that a copy of
# this tuple imported early still recognises them. An AggregationQuantizer is what quantize_model(quant_agg=True)
# adds to a message-passing layer: a precision and an act_count buffer as every quantized module has.
QUANTIZED_TYPES = (QConv2d, QLinear, _QuantMixin, AggregationQuantizer)


def register_quantized(fp_cls: type, q_cls: type) -> None:
    """Let quantize_model swap ``fp_cls`` for ``q_cls`` (which has ``_init_quant(precision)`` and an ``act_count``
    buffer); cptsim.numerics.lm_layers registers attention's activation-by-activation Matmul this way."""
    global QUANTIZED_TYPES
    _SWAP[fp_cls] = q_cls
    if q_cls not in QUANTIZED_TYPES:
        QUANTIZED_TYPES = QUANTIZED_TYPES + (q_cls,)


# A subclass of a swappable layer (timm's Conv2dSame, torch's NonDynamicallyQuantizableLinear, a user's own) is
# quantized when its forward is its base's: the quantized class is made for it (its own methods and attributes
# kept, the quantized forward first in line). One that overrides forward computes something cptsim cannot know,
# so it stays in full precision, and ``unquantized_layers`` says so (config.json records it).
_SUBCLASS_SWAP: dict[type, type] = {}
# Subclasses whose own forward is known to compute the parent's op, possibly on a transformed input:
# cls -> pre(module, x) -> x (None: the input as it is). timm's are registered when timm is loaded.
_EQUIVALENT: dict[type, object] = {}


def register_equivalent_forward(cls: type, pre=None) -> None:
    """Declare that ``cls`` (a subclass of a swappable layer) computes its parent's op on ``pre(module, x)`` (on x
    when ``pre`` is None), so quantize_model quantizes it although it overrides forward."""
    _EQUIVALENT[cls] = pre
    _SUBCLASS_SWAP.pop(cls, None)


def _timm_equivalents() -> None:
    """timm's Conv2dSame (TF 'SAME' padding, then the conv) and Linear (nn.Linear's op in eager mode; its dtype cast
    is TorchScript's only), once timm is imported (never imported from here)."""
    import sys

    if "timm" not in sys.modules or _EQUIVALENT.get("timm-done"):
        return
    _EQUIVALENT["timm-done"] = True
    try:
        from timm.layers.conv2d_same import Conv2dSame
        from timm.layers.linear import Linear
        from timm.layers.padding import pad_same
    except ImportError:  # another timm: its layers stay as they are, listed by unquantized_layers
        return
    register_equivalent_forward(Linear)
    register_equivalent_forward(Conv2dSame, lambda m, x: pad_same(x, list(m.weight.shape[-2:]), list(m.stride),
                                                                     list(m.dilation)))


def _swap_base(cls: type) -> type | None:
    """The nearest class in ``cls``'s MRO that quantize_model swaps (Conv2d, Linear, a registered one, a _FOREIGN
    one), or None."""
    return next((c for c in cls.__mro__ if c in _SWAP or (c.__module__, c.__qualname__) in _FOREIGN), None)


def _nested_weight_user(model: nn.Module) -> dict[str, str]:
    """Layers whose owner computes with their weight directly, never calling their forward: name -> reason.
    nn.MultiheadAttention's out_proj is one (F.multi_head_attention_forward reads out_proj.weight)."""
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.MultiheadAttention):
            prefix = f"{name}." if name else ""
            out[prefix + "out_proj"] = ("nn.MultiheadAttention computes with out_proj's weight itself "
                                        "(F.multi_head_attention_forward), never through its forward")
    return out


def _skip_reason(module: nn.Module) -> str | None:
    """Why a Conv2d/Linear (or registered) layer cannot be quantized, or None when it can (or is no such layer)."""
    cls = type(module)
    if isinstance(module, QUANTIZED_TYPES):
        return None
    base = _swap_base(cls)
    if base is None:
        return None
    if _lazy_weight(module):
        return (f"{cls.__module__}.{cls.__name__} has a lazily initialised weight (in_channels=-1, not yet "
                "materialised): run one forward pass before quantize_model, or give its input size")
    if cls in _SWAP:
        return None
    _timm_equivalents()
    if cls.forward is not base.forward and cls not in _EQUIVALENT:
        return (f"{cls.__module__}.{cls.__name__} overrides {base.__name__}.forward: what it computes is its own, "
                "so cptsim cannot quantize it (it runs in full precision)")
    return None


def _quantized_class(module: nn.Module) -> type | None:
    """The quantized class to give ``module`` (None: not swappable, or already quantized)."""
    cls = type(module)
    if isinstance(module, QUANTIZED_TYPES):
        return None
    base = _swap_base(cls)
    if base is None or _skip_reason(module) is not None:
        return None
    if cls in _SWAP:
        return _SWAP[cls]
    return _subclass_quantized(cls)


def _lazy_weight(module: nn.Module) -> bool:
    """A weight that does not exist yet (nn.LazyLinear before its first call, PyG's Linear(-1, n))."""
    return isinstance(module.__dict__.get("_parameters", {}).get("weight"), nn.parameter.UninitializedParameter)


def _subclass_quantized(cls: type) -> type:
    """The quantized class made for the subclass ``cls`` (made once): the base's quantized class first in the MRO,
    then ``cls``; for another library's layer (_FOREIGN, or a subclass of one) the quantized op's mixin, then
    ``cls``. Pickles (and deep-copies) by ``cls``, since the made class has no importable name."""
    q = _SUBCLASS_SWAP.get(cls)
    if q is None:
        base = _swap_base(cls)
        q_base, name, module = _SWAP.get(base), f"Q{cls.__name__}", cls.__module__
        if q_base is None:
            q_base, own = _FOREIGN[(base.__module__, base.__qualname__)]
            if cls is base:
                name, module = own, __name__

        def __reduce_ex__(self, protocol):
            return _rebuild_subclass_quantized, (cls,), self.__getstate__()

        body = {"__doc__": f"{cls.__name__} at the shared precision ({q_base.__name__}'s forward; made by "
                           "cptsim.numerics.layers.quantize_model)",
                "__module__": module, "__qualname__": name, "__reduce_ex__": __reduce_ex__}
        pre = _EQUIVALENT.get(cls)
        if pre is not None:
            def forward(self, x, _pre=pre, _fwd=q_base.forward):
                return _fwd(self, _pre(self, x))

            body["forward"] = forward
        q = type(name, (q_base, cls), body)
        _SUBCLASS_SWAP[cls] = q
    return q


def _rebuild_subclass_quantized(cls: type):
    return object.__new__(_subclass_quantized(cls))


def quantizable_layers(model: nn.Module) -> list[str]:
    """Names of the layers cptsim can quantize (Conv2d and Linear, and their subclasses that keep the parent's
    forward), in module order."""
    nested = _nested_weight_user(model)
    return [n for n, m in model.named_modules()
            if isinstance(m, QUANTIZED_TYPES) or (_quantized_class(m) is not None and n not in nested)]


def unquantized_layers(model: nn.Module) -> list[dict]:
    """Every Conv2d/Linear-like layer (the swappable types and their subclasses) that is not quantized, and why:
    ``[{"name", "type", "reason"}]`` in module order. Reasons: kept in full precision (--fp-layers or the model's
    convention), a subclass that overrides forward, or a layer whose owner never calls its forward."""
    nested = _nested_weight_user(model)
    out = []
    for name, m in model.named_modules():
        if isinstance(m, QUANTIZED_TYPES) or _swap_base(type(m)) is None:
            continue
        reason = nested.get(name) or _skip_reason(m) or "kept in full precision (--fp-layers, or the model's convention)"
        out.append({"name": name, "type": f"{type(m).__module__}.{type(m).__name__}", "reason": reason})
    return out + unquantized_parameters(model)  # weights a PyG message-passing layer uses outside a Linear


# The attribute in which a model declares its own full-precision layers (the model registry sets it on what
# create_model builds). The convention lives here, with the quantizer, so that a model from anywhere -- the
# registry, a user's own loop -- is quantized by one rule, and numerics never has to ask the registry.
FP_LAYERS_ATTR = "cptsim_fp_layers"


def declared_fp_layers(model: nn.Module) -> list[str]:
    """The model's own ``cptsim_fp_layers`` if it has one, otherwise its last ``nn.Linear`` in
    ``named_modules`` order (CPT's CIFAR convention: every conv quantized, the final classifier not)."""
    own = getattr(model, FP_LAYERS_ATTR, None)
    if own is not None:
        return list(own)
    last = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    return last[-1:]


def resolve_fp_layers(model: nn.Module, patterns: list[str] | None) -> list[str]:
    """Expand full-precision layer patterns (fnmatch globs over module names) to layer names.

    None means the model's own convention (``declared_fp_layers``; ``cptsim.models.default_fp_layers`` for a
    registry model); an empty list quantizes every layer. A pattern that matches no Conv2d/Linear is an error:
    a typo would silently quantize a layer the user meant to keep in FP32.
    """
    names = quantizable_layers(model)
    if patterns is None:
        return [n for n in declared_fp_layers(model) if n in names]
    chosen: list[str] = []
    for pat in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pat)]
        if not hits:
            shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
            raise InputError(f"full-precision layer pattern {pat!r} matches no Conv2d/Linear layer (layers: {shown})")
        chosen += [n for n in hits if n not in chosen]
    return chosen


def quantize_model(
    model: nn.Module, precision: PrecisionState | None = None, fp_layers: list[str] | None = None,
    quant_agg: bool = False, number_format: str = "int", grad_format: str | None = None,
) -> PrecisionState:
    """Swap every Conv2d/Linear except the full-precision ones for its quantized version, in place.

    Subclasses are swapped too when their forward is the parent's (timm's Conv2dSame is not: it pads in its own
    forward); ``unquantized_layers(model)`` lists the layers left in full precision and why. PyTorch Geometric's
    ``Linear`` (the dense transform inside GCNConv, SAGEConv, GATConv, ...) is swapped like nn.Linear. A layer whose
    weight is not materialised yet (lazy, in_channels=-1) is refused: run one forward pass first.

    ``quant_agg``: also quantize every message-passing layer's aggregation (the inputs of its messages at the
    forward bits, round to nearest; the error flowing back into it at the gradient bits, stochastic rounding),
    as Wolfe's cpt_gnn ``--quant-agg``; see cptsim.numerics.graph_layers. By default it stays FP32. An InputError
    when the model has no message-passing layer.

    ``number_format``: the format family the widths name (``int``, CPT's integers, the default; ``fp``, ``mx``,
    ``nvfp``: cptsim.numerics.families), ``grad_format`` the gradient format (a float family only). A float family
    makes every quantized layer run the format its step's width names (module docstring); it is set on the
    returned PrecisionState (``precision.formats``), so a state passed in is given the map too. Bad names or
    pairings raise a one-line InputError before anything is swapped.

    Parameters are kept (the same Parameter objects), so an optimizer built before or after sees the same
    weights. Returns the shared PrecisionState the training loop drives.
    """
    from .families import format_map

    fmap = format_map(number_format, grad_format)
    precision = precision or PrecisionState()
    if fmap is not None:
        precision.formats = fmap
    keep = set(resolve_fp_layers(model, fp_layers))
    nested = _nested_weight_user(model)
    lazy = [name for name, m in model.named_modules()
            if name not in keep and _swap_base(type(m)) is not None and _lazy_weight(m)]
    if lazy:
        raise InputError(f"layer {lazy[0]!r} has a lazily initialised weight (in_channels=-1) that does not exist "
                         "yet: run one forward pass (model(x, edge_index)) before quantize_model, or build it with "
                         "its input size" + (f" ({len(lazy)} such layers)" if len(lazy) > 1 else ""))
    if quant_agg:
        check_has_aggregation(model)
    for name, module in list(model.named_modules()):
        cls = _quantized_class(module)
        if cls is None or name in keep or name in nested:
            continue
        # Changing the class in place keeps parameters, hooks and state_dict keys exactly as they were.
        module.__class__ = cls
        module._init_quant(precision)
        module.__dict__["_cptsim_name"] = name  # the quantizers' fallback records name the layer by it
    if quant_agg:
        quantize_aggregations(model, precision, ACT_MOMENTUM)
    return precision


@contextmanager
def reuse_quantized_weights(*modules: nn.Module):
    """Within the block, each quantized layer among ``modules`` quantizes its weight once, not once per call.

    For a layer called many times in one forward (the LSTM's hidden-to-hidden GEMM, once per time step): the
    result is the same (the quantizer is deterministic), the work is one quantization instead of T. The cache
    lives only inside the block, so no autograd graph outlives its forward; it is keyed on the weight's version
    counter and the bits, so an in-place update of the weight (opt.step) inside the block quantizes again.
    """
    layers = [m for m in modules if isinstance(m, _QuantMixin)]
    for m in layers:
        m.__dict__["_wq_cache"] = {}
    try:
        yield
    finally:
        for m in layers:
            m.__dict__.pop("_wq_cache", None)


def quantized_layer_names(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, QUANTIZED_TYPES)]


def assign_precision(model: nn.Module, states: dict) -> None:
    """Point the named quantized layers at their own ``PrecisionState`` (a per-layer plan: layers of one schedule
    share one state, which the training loop sets each step); every other quantized layer keeps the state
    ``quantize_model`` returned. Nothing in a layer's forward changes: it reads ``self.precision`` as always."""
    modules = dict(model.named_modules())
    for name, state in states.items():
        m = modules.get(name)
        if m is None or not isinstance(getattr(m, "precision", None), PrecisionState):
            raise InputError(f"layer {name!r} is not a quantized layer of this model")
        m.precision = state

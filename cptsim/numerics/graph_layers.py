"""The message-passing aggregation of graph models at the shared precision, on request (``quant_agg``).

No torch_geometric import: ``cptsim.numerics.layers`` imports this module (it sits below the layers, using only
the quantizer primitives), and PyG's classes are looked up in ``sys.modules`` -- a model that holds PyG layers has
loaded them.

Dense transforms are not here: a graph convolution's X·W is PyG's ``torch_geometric.nn.dense.linear.Linear``
(inside GCNConv, SAGEConv, GATConv, ... and users' own layers), which ``cptsim.numerics.layers.quantize_model``
swaps for ``QPygLinear``, made from QLinear's op and PyG's class: weights per output channel, the input per tensor
(round to nearest, the batch range in training, the running range in eval), the error of its output with
stochastic rounding at the gradient bits before both backward GEMMs. (cpt_gnn quantizes the weight per tensor;
cptsim keeps one rule for every layer.) Weight matrices a message-passing layer uses outside any Linear cannot be
swapped: GATConv's ``att_src`` / ``att_dst`` (the attention logits, an element-wise product summed over channels,
x·a per node and head), RGCNConv's relation weights. ``unquantized_parameters`` names them, and
``layers.unquantized_layers`` reports them with the layers it left in full precision.

Aggregation (``quantize_model(..., quant_agg=True)``; cpt_gnn's ``--quant-agg``). By default the sparse
aggregation -- gather, weight, scatter-sum (``MessagePassing.propagate``) -- runs in FP32, as in cpt_gnn. With
quant_agg each ``MessagePassing`` layer gets an ``AggregationQuantizer`` child named ``cptsim_agg`` and two
propagate hooks (``register_propagate_forward_pre_hook`` / ``register_propagate_forward_hook``, so any user's own
MessagePassing works), reading the same PrecisionState as the Linear layers:

* forward, at the step's forward bits q: every floating-point input that the layer's ``message`` reads is
  fake-quantized per tensor (round to nearest, straight-through; the batch range in training, the running range
  in eval, one range per input): the features gathered from the source nodes (``x_j``: of a (source, target)
  pair only the side the message reads), and per-edge coefficients such as GATConv's attention ``alpha``. As in
  cpt_gnn, whose GCN quantizes the source features before the sum, whose SAGE quantizes them before the mean, and
  whose GAT quantizes the neighbours' features and the attention coefficients.
* ``edge_weight`` stays FP32 (``AGG_FP_ARGS``): in GCNConv it is the degree normalisation D^-1/2 (A+I) D^-1/2,
  which cpt_gnn quantizes only under its separate ``--quant-norm`` (not implemented in cptsim).
* backward: the error flowing back into the aggregation (dL/d of propagate's output) is quantized per tensor with
  stochastic rounding at the gradient bits, as cpt_gnn's ``quantize_grad`` on the aggregated result.

The layer is marked ``cptsim_quant_agg = True`` (the counter's sign that its aggregation ran at q / g bits). The
quantizer's running ranges are buffers of ``<layer>.cptsim_agg`` (state_dict, deepcopy and ``.to(device)`` carry
them); ``AggregationQuantizer`` is one of ``layers.QUANTIZED_TYPES``, so re-estimating ranges before evaluation
(zeroing ``act_count``) covers it. PyG skips propagate hooks under TorchScript and ``torch.compile``: there the
aggregation runs in FP32.
"""

from __future__ import annotations

import sys
from functools import partial

import torch
import torch.nn as nn

from cptsim.errors import InputError
from .formats import QuantFormatSTE
from .formats import quantize_error as quantize_error_format
from .quant import FULL_PRECISION, QuantActivationSTE, quantize_error

__all__ = ["AggregationQuantizer", "AGG_CHILD", "AGG_FP_ARGS", "QUANT_AGG_ATTR", "quantize_aggregations",
           "quantized_aggregations", "message_passing_layers", "check_has_aggregation", "unquantized_parameters",
           "aggregation_inputs"]

AGG_CHILD = "cptsim_agg"  # the child module of a MessagePassing layer that holds its aggregation's quantizer
QUANT_AGG_ATTR = "cptsim_quant_agg"  # True on a MessagePassing layer whose aggregation is quantized
# propagate arguments the aggregation keeps in FP32 under quant_agg: GCN's degree normalisation (cpt_gnn's quant_norm)
AGG_FP_ARGS = frozenset({"edge_weight"})


class AggregationQuantizer(nn.Module):
    """The quantizer state of one message-passing layer's aggregation (see the module docstring).

    ``act_lo`` / ``act_hi`` hold one running range per quantized input (their number, ``len(slots)``, is known
    at the first call: x_j alone for GCN and SAGE, x_j and alpha for GAT); ``act_count`` = 0 means "no training
    batch seen since the ranges were reset": the next call's own ranges are used (and, in training, kept).
    ``momentum``: the running average's, the Linear layers' (layers.ACT_MOMENTUM)."""

    def __init__(self, precision: PrecisionState, momentum: float):
        super().__init__()
        self.precision = precision
        self.momentum = float(momentum)
        self.register_buffer("act_lo", torch.zeros(0))
        self.register_buffer("act_hi", torch.zeros(0))
        self.register_buffer("act_count", torch.zeros((), dtype=torch.long))
        self.slots: list[str] = []  # names of the quantized inputs, in slot order ("x[0]", "alpha")

    def _init_quant(self, precision: PrecisionState) -> None:
        self.precision = precision

    def extra_repr(self) -> str:
        return f"slots={self.slots}" if self.slots else ""

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # the number of ranges is the saved model's (known after its first call): take its size before loading
        for name in ("act_lo", "act_hi"):
            saved = state_dict.get(prefix + name)
            own = self._buffers[name]
            if isinstance(saved, torch.Tensor) and saved.shape != own.shape:
                self._buffers[name] = torch.zeros(saved.shape, dtype=own.dtype, device=own.device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def ranges(self, tensors: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(lo, hi), one entry per tensor: the tensors' own min/max in training (and the running average updated),
        the running range in eval (the tensors' own while none has been measured). No host synchronisation."""
        mins, maxs = zip(*(torch.aminmax(t.detach()) for t in tensors))
        lo, hi = torch.stack(mins).float(), torch.stack(maxs).float()
        if self.act_lo.shape != lo.shape:  # first call, or a call with other inputs: start the ranges anew
            self._buffers["act_lo"] = torch.zeros_like(lo)
            self._buffers["act_hi"] = torch.zeros_like(hi)
            self.act_count.zero_()
        first, m = self.act_count == 0, self.momentum
        if self.training:
            with torch.no_grad():  # the arithmetic of the Linear layers' running range (layers._QuantMixin)
                self.act_lo.copy_(torch.where(first, lo, torch.add(self.act_lo * m, lo, alpha=1 - m)))
                self.act_hi.copy_(torch.where(first, hi, torch.add(self.act_hi * m, hi, alpha=1 - m)))
                self.act_count += 1
            return lo, hi
        return torch.where(first, lo, self.act_lo), torch.where(first, hi, self.act_hi)


def aggregation_inputs(module: nn.Module, kwargs: dict) -> list[tuple[str, int | None, torch.Tensor]]:
    """The floating-point inputs of ``module``'s messages among propagate's ``kwargs``: (argument, pair side or
    None, tensor), in a fixed order. The message's arguments come from PyG's inspector (``_user_args``: ``x_j``
    reads the source side of ``x``, ``x_i`` the target side, as ``MessagePassing._collect`` does); AGG_FP_ARGS
    stay out."""
    i, j = (1, 0) if getattr(module, "flow", "source_to_target") == "source_to_target" else (0, 1)
    names = getattr(module, "_user_args", None)
    if names is None:  # not a PyG version we know: every floating-point input
        names = [a for k, v in kwargs.items()
                 for a in ((k + "_j", k + "_i") if isinstance(v, (tuple, list)) else (k,))]
    out, seen = [], set()
    for arg in names:
        base, side = arg, None
        if arg[-2:] in ("_i", "_j"):
            base, side = arg[:-2], (j if arg[-2:] == "_j" else i)
        if base in AGG_FP_ARGS or base not in kwargs:
            continue
        value = kwargs[base]
        if isinstance(value, (tuple, list)):
            if side is None:
                continue
            value = value[side]
        else:
            side = None  # one tensor serves both sides: quantize it once
        key = (base, side)
        if key in seen or not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.numel() == 0:
            continue
        seen.add(key)
        out.append((base, side, value))
    return out


def _pre_hook(module: nn.Module, inputs):
    """Before propagate: the message's inputs at the forward bits (per tensor, round to nearest, straight-through)."""
    quant = module._modules.get(AGG_CHILD)
    if quant is None or quant.precision.bits == FULL_PRECISION:
        return None
    edge_index, size, kwargs = inputs
    targets = aggregation_inputs(module, kwargs)
    if not targets:
        return None
    fmt = quant.precision.forward_format() if hasattr(quant.precision, "forward_format") else None
    # a float format: each input by its own amax (current scaling), MX / NVFP4 blocks along the features
    lo, hi = quant.ranges([t for _, _, t in targets]) if fmt is None else (None, None)
    quant.slots = [name if side is None else f"{name}[{side}]" for name, side, _ in targets]
    bits = quant.precision.bits
    new = dict(kwargs)
    for k, (name, side, t) in enumerate(targets):
        tq = QuantActivationSTE.apply(t, lo[k], hi[k], bits) if fmt is None else QuantFormatSTE.apply(t, fmt, -1)
        if side is None:
            new[name] = tq
        else:
            pair = list(new[name])
            pair[side] = tq
            new[name] = tuple(pair)
    return edge_index, size, new


def _post_hook(module: nn.Module, inputs, out):
    """After propagate: the error flowing back into the aggregation at the gradient bits (stochastic rounding)."""
    quant = module._modules.get(AGG_CHILD)
    if quant is None:
        return None
    g = quant.precision.grad_bits
    if g != FULL_PRECISION and isinstance(out, torch.Tensor) and torch.is_grad_enabled() and out.requires_grad:
        gfmt = quant.precision.gradient_format() if hasattr(quant.precision, "gradient_format") else None
        out.register_hook(partial(quantize_error, bits=g) if gfmt is None
                          else partial(quantize_error_format, fmt=gfmt, dim=-1))
    return None


def message_passing_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of the model's PyG MessagePassing layers. None unless PyG's message passing is loaded (no
    model can hold one otherwise): nothing is imported here."""
    mp = getattr(sys.modules.get("torch_geometric.nn.conv.message_passing"), "MessagePassing", None)
    if mp is None:
        return []
    return [(n, m) for n, m in model.named_modules() if isinstance(m, mp)]


def check_has_aggregation(model: nn.Module) -> None:
    if not message_passing_layers(model):
        raise InputError(f"quant_agg quantizes a graph model's aggregation, but {type(model).__name__} has no "
                         "message-passing layer (torch_geometric MessagePassing)")


def quantize_aggregations(model: nn.Module, precision: PrecisionState, momentum: float) -> list[str]:
    """Quantize every MessagePassing layer's aggregation (module docstring), its running ranges averaged with
    ``momentum``; returns the layers' names. Idempotent: a layer already quantized follows ``precision`` from now
    on. An InputError when the model has none (``layers.quantize_model(..., quant_agg=True)`` calls this)."""
    check_has_aggregation(model)
    names = []
    for name, m in message_passing_layers(model):
        quant = m._modules.get(AGG_CHILD)
        if quant is None:
            ref = next(iter(m.parameters()), None)
            quant = AggregationQuantizer(precision, momentum)
            if ref is not None:
                quant.to(ref.device)
            m.add_module(AGG_CHILD, quant)
            # module-level functions: deepcopy and pickle keep them as they are
            m.register_propagate_forward_pre_hook(_pre_hook)
            m.register_propagate_forward_hook(_post_hook)
        else:
            quant._init_quant(precision)
        setattr(m, QUANT_AGG_ATTR, True)
        names.append(name)
    return names


def quantized_aggregations(model: nn.Module) -> list[str]:
    """Names of the message-passing layers whose aggregation is quantized."""
    return [n for n, m in message_passing_layers(model) if getattr(m, QUANT_AGG_ATTR, False)]


def unquantized_parameters(model: nn.Module) -> list[dict]:
    """Weight matrices (parameters of 2 or more dims) that a message-passing layer holds itself, outside any Linear,
    and so computes with in full precision: ``[{"name", "type", "reason"}]`` as ``unquantized_layers``."""
    out = []
    for name, m in message_passing_layers(model):
        cls = type(m)
        for pname, p in m.named_parameters(recurse=False):
            if p.dim() < 2:
                continue  # a bias or a scalar: an addition, no product
            what = ("its attention logits (x·a per node and head: an element-wise product summed over channels)"
                    if pname.startswith("att") else "a product of its own")
            out.append({"name": f"{name}.{pname}" if name else pname, "type": f"{cls.__module__}.{cls.__name__}",
                        "reason": f"{cls.__name__} computes {what} with its parameter {pname!r} "
                                  f"{tuple(p.shape)} directly, not through a Linear layer: it runs in full precision"})
    return out

"""Measured per-layer MACs: what each training step really executes, per phase (forward, dgrad, wgrad).

In the style of fvcore / ``torch.utils.flop_counter``: a table ``COUNTERS`` from module type to a counting function
``fn(module, input, output) -> MACs``; supporting another layer type is one entry. Types are matched through the MRO,
so ``QConv2d`` / ``QLinear`` (subclasses of ``nn.Conv2d`` / ``nn.Linear``) use their base class's counter.

Counting rules ("count what executes"), applied by a forward hook per layer:

* forward: every call while ``MacCounter.enabled`` (the training loop turns it off for evaluation);
* dgrad (error x weight -> input gradient): only if grad mode is on and the layer's input requires grad, so the
  first layer, whose input is the data, has none;
* wgrad (error x input -> weight gradient): only if grad mode is on and the weight requires grad (frozen -> 0);
* a layer called several times in one step accumulates every call.

For Conv and Linear each of the three GEMMs has the forward's MAC count (dgrad is the transposed conv of the
error with the same weights, wgrad the correlation of input and error), so one number per call serves all three
phases. The hooks only read shapes and do integer arithmetic: no tensor ops, no ``.item()``, no syncs.
Activation checkpointing re-runs forwards during backward; those re-runs are counted as executed forwards
(and would count their backward again), which is the one case where hooks and reality part.

Graph models (torch_geometric): each ``MessagePassing`` layer's sparse aggregation -- gather the neighbours'
features, weight them per edge, scatter-sum them into each node -- is its own weightless entry of type
``Aggregation`` named ``<conv>.aggregate``, counted by a hook on ``propagate`` (``aggregation_macs`` gives the rule;
any user's MessagePassing layer is counted, nothing is matched by class name). PyG's own ``Linear`` (inside GCNConv,
SAGEConv, GATConv) is counted as a ``Linear``. A graph model's sample is its whole graph (``profile_model``).

Attention inside other libraries' models (timm, torchvision, any model of the user's): their transformers call
``F.scaled_dot_product_attention`` (SDPA), a function, not a Conv2d/Linear, so no layer hook sees its two matmuls.
The counter wraps ``torch.nn.functional.scaled_dot_product_attention`` while it is alive (``_sdpa_counting``: the
real kernel runs, then the call is counted from its tensors' shapes; no tensor op, no sync) and files each call
under the innermost module of the counted model whose code is running -- the first ``self`` that is an
``nn.Module`` on the Python call stack above the call: timm's ``blocks.0.attn``, torchvision's
``encoder.layers.encoder_layer_0.self_attention`` (an ``nn.MultiheadAttention``, whose
``F.multi_head_attention_forward`` calls SDPA). Each such module gets two weightless entries of type ``Matmul``,
exactly as cptsim's own attention has (``cptsim.numerics.lm_layers.CausalSelfAttention``: ``attn.scores`` and
``attn.mix``): ``<module>.scores`` = q·kᵀ and ``<module>.mix`` = p·v, listed after the module's own sublayers
(as a graph layer's aggregation is), created at the module's first call (``sdpa_macs`` gives the rule):

* forward: scores = rows·S·E, mix = rows·S·Ev MACs (rows = batch x heads x L query positions, S key positions,
  E the q/k head width, Ev the v head width) -- the full L x S matrix whatever the mask: ``is_causal`` and
  ``attn_mask`` change no count. That is what a dense kernel computes and ``torch.utils.flop_counter``'s
  convention (its SDPA formulas are "upper bounds for causal or otherwise masked attention"), and what cptsim's
  own causal attention counts (it masks a full matmul);
* dgrad / wgrad as for cptsim's ``Matmul(a, b)``: the gradient w.r.t. a (scores: dq = ds·k; mix: dp = do·vᵀ) and
  w.r.t. b (scores: dk = dsᵀ·q; mix: dv = pᵀ·do), each the forward's MACs, when grad mode is on and that operand
  needs a gradient (p needs one when q, k or a float mask does). flop_counter's SDPA backward formula counts
  5 matmuls (it adds the recomputation of the scores a FlashAttention backward runs); the layer entries count the
  4 gradient GEMMs, as cptsim's own attention does, and the recomputation stays in the op list's GPU time;
* ``quantized`` is False: SDPA runs at full precision (cptsim quantizes only its own ``Matmul``), so its BitOPs
  are 32 x 32 in every command; ``operand`` = K's (scores) or V's (mix) elements, input / output the first
  operand's and the product's, as for cptsim's Matmul;
* ``sdpa`` = True marks the entries as a fused kernel's: on a GPU the op list (``cptsim.measure.opcount``, kind
  ``attention``) prices FlashAttention and its kin from their own MACs and bytes, so ``cptsim.cost.model``
  leaves these entries' GEMM time and energy out by the share of their MACs the op list holds
  (``cost.model.fused_attention_share``): nothing is priced twice, and where the profiling device ran SDPA as
  plain matmuls (the op list then has no attention MACs) the entries are priced as GEMMs.

``nn.MultiheadAttention`` in full: its forward runs its in-projection and its ``out_proj`` through
``F.linear`` on their weights (``F.multi_head_attention_forward``), so neither is a module call a hook sees.
The counter gives it an entry ``<mha>.in_proj`` (type ``Linear``, its weight ``in_proj_weight``, or q/k/v_proj_weight)
and counts ``out_proj``'s GEMM into ``out_proj``'s own entry whenever the module's forward did not call it; both
run at full precision whatever ``out_proj``'s class (``quantized`` False: fake quantization lives in a QLinear's
forward, which is never called). With ``need_weights=True`` (its default) it computes attention with ``bmm``,
not SDPA: its ``scores`` / ``mix`` entries are then counted from the shapes by the same rule, ``sdpa`` False
(plain GEMMs on every hardware). Not seen: calls to SDPA through a reference taken before the counter was made
(``from torch.nn.functional import scaled_dot_product_attention`` at import time -- timm and torchvision look it
up at call time), code compiled by ``torch.compile``, nested (jagged) tensors, and matmuls a model writes out
itself (``q @ k.transpose(-2, -1)`` outside a counted module; timm's ``fused_attn=False`` path, Swin in
torchvision).
"""

from __future__ import annotations

import bisect
import copy
import inspect
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from cptsim.errors import InputError
from cptsim.models.loss import class_cross_entropy
from cptsim.numerics.lm_layers import Matmul, matmul_macs
from .opcount import GRAPH_DIRECT_LIMIT, is_graph_model, is_message_passing

__all__ = [
    "PHASES",
    "PROFILE_FORMAT",
    "MATMUL_TYPES",
    "COUNTERS",
    "conv2d_macs",
    "linear_macs",
    "counter_for",
    "LayerRecord",
    "GEMM_KEYS",
    "gemm_shape",
    "conv_geometry",
    "LayerProfile",
    "ProfileArrays",
    "MacCounter",
    "profile_model",
    "profile_named_model",
    "AGGREGATION",
    "aggregation_macs",
    "aggregation_quantized",
    "is_message_passing",
    "is_graph_model",
    "propagated_edges",
    "GRAPH_DIRECT_LIMIT",
    "sdpa_macs",
    "ATTENTION_PARTS",
]

PHASES = ("fwd", "dgrad", "wgrad")
NUMEL_KEYS = ("weight", "input", "output")
# The forward GEMM of a layer, as a GPU kernel tiles it (cptsim.cost.hardware.gpu_kernels): ``groups``
# independent GEMMs per call (a grouped or depthwise conv), each ``n`` output columns by ``k`` deep, over ``rows``
# output rows per sample (summed over calls; conv: output positions, linear: tokens, attention: batched rows);
# ``rows_per_gemm`` > 0 when the rows come as a batch of separate GEMMs of that many rows (attention's bmm),
# 0 when all of a call's rows, batch included, form one GEMM (conv, linear).
GEMM_KEYS = ("groups", "n", "k", "rows", "rows_per_gemm")
# A convolution's geometry, flattened in ProfileArrays.conv: kernel (h, w), stride (h, w), input (h, w), output (h, w)
CONV_COLUMNS = ("kernel_h", "kernel_w", "stride_h", "stride_w", "in_h", "in_w", "out_h", "out_w")


def is_depthwise_gemm(groups, n):
    """A depthwise convolution: more than one group, one output column each (scalars or arrays alike)."""
    return (n == 1) & (groups > 1)
PROFILE_FORMAT = "cptsim.profile/2"  # /2 adds "ops": every op of the step (cptsim.measure.opcount)
READABLE_FORMATS = ("cptsim.profile/1", PROFILE_FORMAT)
# Layer types whose GEMMs are matrix multiplies (cuBLAS on a GPU; torch.backends.cuda.matmul.allow_tf32 governs
# their FP32 precision), as opposed to convolutions (cuDNN; torch.backends.cudnn.allow_tf32).
MATMUL_TYPES = frozenset({"Linear", "Matmul"})
# The layer type of a message-passing layer's sparse aggregation (a weightless entry, ``aggregation_macs``).
AGGREGATION = "Aggregation"


# ------------------------------------------------------------------------------------------------ counting functions


def conv2d_macs(module: nn.Conv2d, input: torch.Tensor, output: torch.Tensor) -> int:
    """N·Cout·Hout·Wout · (Cin/groups)·kh·kw, read from the real output shape.

    Using the output shape makes stride, padding and dilation free: each output element is one dot product of
    (Cin/groups)·kh·kw terms, whatever produced its position. Works unchanged for Conv1d/Conv3d shapes.
    """
    per_output = module.in_channels // module.groups
    for k in module.kernel_size:
        per_output *= k
    return output.numel() * per_output


def linear_macs(module: nn.Linear, input: torch.Tensor, output: torch.Tensor) -> int:
    """prod(input.shape[:-1]) · in_features · out_features, for input of any rank (B, F), (B, T, F), ..."""
    return input.numel() * module.out_features


COUNTERS: dict[type, Callable[[nn.Module, torch.Tensor, Any], int]] = {
    nn.Conv2d: conv2d_macs,
    nn.Linear: linear_macs,
    Matmul: matmul_macs,  # attention's two activation-by-activation matmuls (cptsim.numerics.lm_layers)
}


def _weight_numel(m: nn.Module) -> int:
    w = getattr(m, "weight", None)
    return int(w.numel()) if isinstance(w, torch.Tensor) else 0


def counter_for(cls: type) -> tuple[type, Callable] | None:
    """(the COUNTERS key, its counting function) for a module class, via its MRO; None if not counted."""
    for base in cls.__mro__:
        fn = COUNTERS.get(base)
        if fn is not None:
            return base, fn
    return None


def pyg_linear_macs(module: nn.Module, input: torch.Tensor, output: torch.Tensor) -> int:
    """torch_geometric's own ``Linear`` (GCNConv's, SAGEConv's, GATConv's dense transform): output elements x
    in_channels, read from its weight [out, in] (its ``in_channels`` may be -1, a lazy layer)."""
    return output.numel() * int(module.weight.shape[-1])


def _register_pyg_linear() -> None:
    """Count torch_geometric's ``Linear`` (not an ``nn.Linear`` subclass) once torch_geometric has been imported by
    whoever built the model; never imports it (cptsim works without it)."""
    if "torch_geometric" not in sys.modules:
        return
    try:
        from torch_geometric.nn.dense.linear import Linear as PygLinear
    except ImportError:  # pragma: no cover - a torch_geometric without the module
        return
    COUNTERS.setdefault(PygLinear, pyg_linear_macs)


def _is_pyg_linear(module: nn.Module) -> bool:
    """torch_geometric's Linear or a subclass (cptsim's quantized QPygLinear), without importing PyG."""
    return any(c.__name__ == "Linear" and c.__module__.startswith("torch_geometric.") for c in type(module).__mro__)


def _is_quantized(module: nn.Module) -> bool:
    from cptsim.numerics.layers import QUANTIZED_TYPES

    return isinstance(module, QUANTIZED_TYPES)


# ------------------------------------------------------------------------------------------------ graph aggregation

# The arguments PyG fills in itself (MessagePassing.special_args): neither node nor edge data.
_PYG_SPECIAL = frozenset({"edge_index", "adj_t", "edge_index_i", "edge_index_j", "size", "size_i", "size_j", "ptr",
                          "index", "dim_size"})


def aggregation_quantized(module: nn.Module) -> bool:
    """Whether a MessagePassing layer's aggregation runs quantized (``quantize_model(..., quant_agg=True)`` marks
    it with ``cptsim_quant_agg = True``); full precision otherwise, as in cpt_gnn."""
    return bool(getattr(module, "cptsim_quant_agg", False))


def propagated_edges(edge_index: Any) -> int:
    """nnz of the propagation matrix a ``propagate`` call runs over: the edges of an ``edge_index`` [2, E] (self
    loops a layer added included), or the stored entries of a sparse adjacency (torch.sparse, torch_sparse)."""
    if isinstance(edge_index, torch.Tensor):
        if edge_index.layout != torch.strided:
            return int(edge_index._nnz())
        return int(edge_index.shape[-1]) if edge_index.dim() else 0
    nnz = getattr(edge_index, "nnz", None)  # torch_sparse.SparseTensor
    return int(nnz()) if callable(nnz) else 0


def _message_args(module: nn.Module) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(node-level, edge-level) keyword names of a layer's ``message``: ``x_j`` / ``x_i`` are node features lifted
    to the edges (the propagated features: kwarg ``x``), the others (``edge_weight``, GAT's ``alpha``) the per-edge
    values of the propagation matrix."""
    try:
        params = list(inspect.signature(module.message).parameters)
    except (TypeError, ValueError):  # pragma: no cover - a message without a signature
        return ("x",), ()
    node, edge = [], []
    for p in params:
        if p in _PYG_SPECIAL:
            continue
        if p.endswith(("_i", "_j")):
            if p[:-2] not in node:
                node.append(p[:-2])
        else:
            edge.append(p)
    return tuple(node), tuple(edge)


def _tensors(v: Any) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (tuple, list)):
        return [t for t in v if isinstance(t, torch.Tensor)]
    return []


def aggregation_macs(module: nn.Module, edge_index: Any, kwargs: dict, output: torch.Tensor,
                     node_args: tuple[str, ...], edge_args: tuple[str, ...], grad: bool) -> dict[str, int]:
    """The MACs and sizes of one ``propagate`` call: the aggregation out = A·X of a sparse propagation matrix A
    (nnz entries: the call's edges, self loops included) and the propagated features X (``width`` per node).

    * forward = nnz x width: each edge's message (x_j, times the edge's value where A has values -- GCN's
      normalisation, GAT's attention coefficient alpha -- per feature) summed into its destination; SAGE's mean
      is the same sum (its division by the degree is an elementwise op, in the op list, not a MAC);
    * dgrad = nnz x width, when the propagated features need a gradient: the error flows back through Aᵀ (gather
      the destinations' error rows, weight, scatter-sum into the sources); 0 otherwise (a first SAGE layer
      aggregates the raw features: autograd runs no backward there);
    * wgrad = nnz x width when A's values need a gradient -- GAT's attention coefficients: d alpha[e, h] =
      sum over c of error[dst(e), h, c] x x_j[e, h, c], one MAC per edge, head and channel (heads x channels =
      width); 0 for GCN and SAGE, whose A is fixed.

    GATConv in full (``torch_geometric.nn.conv.gat_conv``): its aggregation is this entry with width = heads x
    out_channels: fwd = dgrad = wgrad = nnz x H x C. What computes alpha is not in it: the node-level logits
    (x_src·att_src and x_dst·att_dst, 2 x N x H x C multiply-adds forward, as an elementwise product and a sum),
    the per-edge sum alpha_src[j] + alpha_dst[i], leaky ReLU, the softmax over each node's in-edges and dropout
    (all O(nnz x H)) run as elementwise and reduction kernels: the step's op list (``cptsim.measure.opcount``)
    holds them with their bytes, and no layer's MACs do, as for a softmax or a norm anywhere else.

    ``torch.utils.flop_counter.FlopCounterMode`` sees none of this over an ``edge_index`` (PyG's default): the
    aggregation runs index_select, mul, scatter_add_ / index_add and gather, none of which has a FLOP formula
    there, so it counts the dense transforms exactly and the sparse work as 0. Over a torch.sparse adjacency it
    misses the forward SpMM too and counts the backward's Aᵀ·error as a dense aten.mm of N x N x width MACs, not
    nnz x width (tests/test_graph_counting.py). fvcore, which cpt_gnn's cost used, is likewise blind to it.

    Returns {"fwd", "dgrad", "wgrad", "edges", "input", "output", "operand"}: input = elements of the
    propagated source features, output = of the result, operand = the per-edge values (nnz per value, x heads).
    ``grad``: whether autograd records this call (grad mode on).
    """
    nnz = propagated_edges(edge_index)
    nd = getattr(module, "node_dim", -2)
    if output.dim():
        rows = int(output.shape[nd if -output.dim() <= nd < output.dim() else 0])
    else:
        rows = 1
    width = output.numel() // max(rows, 1)
    n = nnz * width
    node = [t for a in node_args for t in _tensors(kwargs.get(a))]
    src = node[0] if node else None
    edge = [t for a in edge_args for t in _tensors(kwargs.get(a)) if t.dim() and int(t.shape[0]) == nnz]
    sparse_values = isinstance(edge_index, torch.Tensor) and edge_index.layout != torch.strided
    operand = sum(t.numel() for t in edge) + (nnz if sparse_values else 0)
    needs_d = grad and any(t.requires_grad for t in node)
    needs_w = grad and (any(t.requires_grad for t in edge) or (sparse_values and edge_index.requires_grad))
    return {"fwd": n, "dgrad": n if needs_d else 0, "wgrad": n if needs_w else 0, "edges": nnz,
            "input": src.numel() if src is not None else 0, "output": output.numel(), "operand": operand}


# ------------------------------------------------------------------------------------------------ attention (SDPA)

# The two matmuls of an attention, one entry each, named <module>.<part> (as cptsim's own CausalSelfAttention's).
ATTENTION_PARTS = ("scores", "mix")


def _attention_parts(rows: int, q_len: int, s_len: int, e: int, ev: int, q_numel: int, k_numel: int, v_numel: int,
                     out_numel: int, need_q: bool, need_k: bool, need_v: bool, need_p: bool) -> dict[str, dict]:
    """The scores (q·kᵀ) and mix (p·v) entries of one attention call of ``rows`` = batch x heads x L query rows
    against S = ``s_len`` keys: MACs per phase, element counts and the GEMM's shape (``sdpa_macs``)."""
    p = rows * s_len  # the attention matrix: scores' output, mix's first operand
    fwd_s, fwd_m = rows * s_len * e, rows * s_len * ev
    return {
        "scores": {"fwd": fwd_s, "dgrad": fwd_s if need_q else 0, "wgrad": fwd_s if need_k else 0,
                   "input": q_numel, "output": p, "operand": k_numel,
                   "gemm": (1, s_len, e, rows, q_len)},
        "mix": {"fwd": fwd_m, "dgrad": fwd_m if need_p else 0, "wgrad": fwd_m if need_v else 0,
                "input": p, "output": out_numel, "operand": v_numel,
                "gemm": (1, ev, s_len, rows, q_len)},
    }


def sdpa_macs(query: Any, key: Any, value: Any, output: Any, attn_mask: Any = None,
              grad: bool = True) -> dict[str, dict] | None:
    """The two matmuls of one ``F.scaled_dot_product_attention(query, key, value, attn_mask, ...)`` call, read from
    the real shapes: query (..., L, E), key (..., S, E), value (..., S, Ev), output (..., L, Ev), the batch and
    head dims broadcast (grouped-query attention included: rows come from the output, which has the query's heads).

    {"scores": {...}, "mix": {...}}, each with "fwd", "dgrad", "wgrad" MACs (module docstring: the full L x S
    matrix, masked or causal alike; dgrad the gradient w.r.t. the first operand, wgrad w.r.t. the second, each
    only when it is needed and ``grad``), "input", "output", "operand" elements and "gemm" = (groups, n, k, rows,
    rows_per_gemm) -- forward MACs = FlopCounterMode's ``sdpa_flop_count`` / 2. None for what it cannot read
    (a nested tensor, a missing operand)."""
    ts = (query, key, value, output)
    if not all(isinstance(t, torch.Tensor) for t in ts) or any(t.is_nested for t in ts):
        return None
    qs, ks, vs = query.shape, key.shape, value.shape
    if min(len(qs), len(ks), len(vs), output.dim()) < 2:
        return None
    q_len, e, s_len, ev = int(qs[-2]), int(qs[-1]), int(ks[-2]), int(vs[-1])
    rows = output.numel() // ev if ev else 0
    if grad:
        need_q, need_k, need_v = query.requires_grad, key.requires_grad, value.requires_grad
        need_mask = isinstance(attn_mask, torch.Tensor) and attn_mask.requires_grad
    else:
        need_q = need_k = need_v = need_mask = False
    return _attention_parts(rows, q_len, s_len, e, ev, query.numel(), key.numel(), value.numel(), output.numel(),
                            need_q, need_k, need_v, need_q or need_k or need_mask)


def _arg(args: tuple, kwargs: dict, i: int, name: str, default: Any = None) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def _calling_module(frame) -> nn.Module | None:
    """The innermost ``nn.Module`` whose code is running at ``frame``: the first frame up the stack whose first
    argument ``self`` is a module (its forward, or a method or ``F.*`` helper it called: the helper's frame has no
    module ``self``, its caller's has)."""
    depth = 0
    while frame is not None and depth < 64:
        code = frame.f_code
        if code.co_argcount and code.co_varnames[0] == "self":
            owner = frame.f_locals.get("self")
            if isinstance(owner, nn.Module):
                return owner
        frame = frame.f_back
        depth += 1
    return None


_SDPA_LOCK = threading.Lock()
# The counters open now, weakly (a counter never closed must not keep its model alive): replaced, never mutated.
_SDPA_LIVE: tuple = ()
_SDPA_CALL: Callable = F.scaled_dot_product_attention  # what the wrapper runs: the function it replaced


def _sdpa_counting(*args, **kwargs):
    """``torch.nn.functional.scaled_dot_product_attention`` while a MacCounter is open: the function it replaced,
    then the call counted by every open, enabled counter whose model holds the calling module."""
    out = _SDPA_CALL(*args, **kwargs)
    owner = None
    for ref in _SDPA_LIVE:
        c = ref()
        if c is None or not c.enabled:
            continue
        if owner is None:
            if torch.compiler.is_compiling():
                break
            owner = _calling_module(sys._getframe(1))
            if owner is None:
                break
        c._count_sdpa(owner, args, kwargs, out)
    return out


_sdpa_counting.__doc__ = (_sdpa_counting.__doc__ or "") + "\n\n" + (getattr(_SDPA_CALL, "__doc__", None) or "")
_sdpa_counting.__name__ = _sdpa_counting.__qualname__ = "scaled_dot_product_attention"


def _sdpa_open(counter: "MacCounter") -> None:
    global _SDPA_CALL, _SDPA_LIVE
    with _SDPA_LOCK:
        _SDPA_LIVE = tuple(r for r in _SDPA_LIVE if r() is not None) + (weakref.ref(counter),)
        current = F.scaled_dot_product_attention
        if current is not _sdpa_counting:
            _SDPA_CALL = current
            F.scaled_dot_product_attention = _sdpa_counting


def _sdpa_close(counter: "MacCounter") -> None:
    global _SDPA_LIVE
    with _SDPA_LOCK:
        _SDPA_LIVE = tuple(r for r in _SDPA_LIVE if r() is not None and r() is not counter)
        if not _SDPA_LIVE and F.scaled_dot_product_attention is _sdpa_counting:
            F.scaled_dot_product_attention = _SDPA_CALL


def _mha_parts(module: nn.MultiheadAttention, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               grad: bool) -> tuple[dict, dict[str, dict]]:
    """An ``nn.MultiheadAttention`` call's in-projection (as a layer entry's counts) and its attention computed
    with bmm (``need_weights=True``; the ``sdpa_macs`` rule): q = query·Wqᵀ, k = key·Wkᵀ, v = value·Wvᵀ, each
    token x E x (E, kdim or vdim) MACs."""
    e, kdim, vdim = module.embed_dim, module.kdim, module.vdim
    tq, tk, tv = query.numel() // e, key.numel() // kdim, value.numel() // vdim
    parts = (tq * e * e, tk * e * kdim, tv * e * vdim)
    if module.in_proj_weight is not None:
        weights = (module.in_proj_weight,) * 3
    else:
        weights = (module.q_proj_weight, module.k_proj_weight, module.v_proj_weight)
    bias = module.in_proj_bias
    b_grad = bias is not None and bias.requires_grad
    x_grad = [grad and x.requires_grad for x in (query, key, value)]
    out_grad = [grad and (xg or w.requires_grad or b_grad) for xg, w in zip(x_grad, weights)]
    same = query is key and key is value
    seen, inputs = set(), 0
    for x in (query, key, value):
        if id(x) not in seen:
            seen.add(id(x))
            inputs += x.numel()
    proj = {"fwd": sum(parts), "dgrad": sum(p for p, g in zip(parts, x_grad) if g),
            "wgrad": sum(p for p, w in zip(parts, weights) if grad and w.requires_grad),
            "input": inputs, "output": (tq + tk + tv) * e,
            "gemm": (1, 3 * e, e, tq, 0) if same else (1, e, e, tq + tk + tv, 0)}
    # attention as F.multi_head_attention_forward computes it with need_weights=True: (N*h, L, E/h) x (N*h, S, E/h)
    if query.dim() == 3:
        n, L = (query.shape[0], query.shape[1]) if module.batch_first else (query.shape[1], query.shape[0])
        S = key.shape[1] if module.batch_first else key.shape[0]
    else:  # unbatched (L, E)
        n, L, S = 1, query.shape[0], key.shape[0]
    S = int(S) + (module.bias_k is not None) + bool(module.add_zero_attn)
    n, L, h = int(n), int(L), module.num_heads
    hd = e // h
    rows = n * h * L
    att = _attention_parts(rows, L, S, hd, hd, n * L * e, n * S * e, n * S * e, n * L * e,
                           out_grad[0], out_grad[1], out_grad[2], out_grad[0] or out_grad[1])
    return proj, att


# ------------------------------------------------------------------------------------------------ records


@dataclass
class LayerRecord:
    """One counted layer. ``macs`` are per sample and per phase; ``numel``: weight total, input/output per sample
    (summed over the layer's calls in a step); ``calls`` per step; ``operand``: elements per sample of a weightless
    layer's second operand (attention's ``Matmul(a, b)``: K or V; an ``Aggregation``'s per-edge values: GCN's
    normalisation, GAT's attention coefficients), summed over calls, 0 for layers with a weight; ``edges``: an
    ``Aggregation``'s nnz per sample (the edges its propagate calls ran over, self loops included), summed over
    calls, 0 for every other layer; ``sdpa``: a Matmul entry of ``F.scaled_dot_product_attention`` calls (a fused
    kernel, which a GPU's op list prices: module docstring), False for every other layer."""

    name: str
    type: str
    quantized: bool
    macs: dict[str, int]
    numel: dict[str, int]
    calls: int = 1
    gemm: dict | None = None  # the forward GEMM's shape (``gemm_shape``); None where the layer type has none
    operand: int = 0
    edges: int = 0
    sdpa: bool = False
    # a convolution's geometry (``conv_geometry``): kernel, stride, input and output sizes, channels, groups; None
    # for other layer types and in profiles written before it was recorded
    conv: dict | None = None

    def to_json(self) -> dict:
        d = {"name": self.name, "type": self.type, "quantized": self.quantized,
             "macs": {p: int(self.macs[p]) for p in PHASES},
             "numel": {k: int(self.numel[k]) for k in NUMEL_KEYS}, "calls": int(self.calls)}
        if self.gemm is not None:
            d["gemm"] = {k: int(self.gemm[k]) for k in GEMM_KEYS}
        if self.operand:
            d["operand"] = int(self.operand)
        if self.edges:
            d["edges"] = int(self.edges)
        if self.sdpa:
            d["sdpa"] = True
        if self.conv is not None:
            d["conv"] = {k: list(v) if isinstance(v, (list, tuple)) else int(v) for k, v in self.conv.items()}
        return d


@dataclass
class ProfileArrays:
    """Numpy views of a profile for the cost model (rows in layer order).

    macs (L, 3) float64 per sample, columns PHASES; quantized (L,) bool; numel (L, 3) float64, columns
    weight (total), input, output (per sample, summed over calls); calls (L,) float64.
    """

    names: list[str]
    macs: np.ndarray
    quantized: np.ndarray
    numel: np.ndarray
    calls: np.ndarray
    ops: Any = None  # the step's other ops (cptsim.measure.opcount.OpProfile), when the profile has them
    gemm: np.ndarray | None = None  # (L, 5) GEMM_KEYS per layer; NaN rows where a layer has no shape record
    is_conv: np.ndarray | None = None  # (L,) bool: a convolution (its kernel depends on the memory format)
    matmul: Any = None  # (L,) bool: the layer's GEMMs are matmuls (MATMUL_TYPES), not convolutions; None: unknown
    channels_last: bool = False  # the step's memory format: NHWC (channels_last) or PyTorch's default NCHW
    operand: np.ndarray | None = None  # (L,) float64: second-operand elements per sample (LayerRecord.operand)
    edges: np.ndarray | None = None  # (L,) float64: an aggregation's nnz per sample (LayerRecord.edges), 0 elsewhere
    aggregation: np.ndarray | None = None  # (L,) bool: a graph layer's sparse aggregation (type AGGREGATION)
    sdpa: np.ndarray | None = None  # (L,) bool: a fused attention kernel's matmul (LayerRecord.sdpa)
    conv: np.ndarray | None = None  # (L, 8) CONV_COLUMNS of each convolution (LayerRecord.conv); NaN rows elsewhere

    def __len__(self) -> int:
        return len(self.names)


def _bad(msg: str) -> InputError:
    return InputError(f"profile: {msg}")


def _count(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != int(v):
        raise _bad(f"{where} must be an integer >= 0, got {v!r}")
    return int(v)


def _gemm_record(g: Any, where: str) -> dict | None:
    if g is None:
        return None  # profiles written before the shapes were recorded
    if not isinstance(g, dict) or any(k not in g for k in GEMM_KEYS):
        raise _bad(f"{where}.gemm must be an object with keys {', '.join(GEMM_KEYS)}")
    return {k: _count(g[k], f"{where}.gemm.{k}") for k in GEMM_KEYS}


CONV_PAIRS = ("kernel", "stride", "in_hw", "out_hw")
CONV_INTS = ("in_channels", "out_channels", "groups")


def conv_geometry(module: nn.Module, x: torch.Tensor, output: torch.Tensor) -> dict | None:
    """A 2-d convolution's geometry as an accelerator's array model needs it (``cptsim.cost.hardware.array``):
    kernel, stride, input and output spatial sizes, channels and groups -- what the GEMM shape folds together
    (``k = in_channels / groups x taps``). None for other layer types."""
    if not isinstance(module, nn.Conv2d) or x.dim() < 3 or output.dim() < 3:
        return None
    return {"kernel": [int(d) for d in module.kernel_size], "stride": [int(d) for d in module.stride],
            "in_hw": [int(d) for d in x.shape[-2:]], "out_hw": [int(d) for d in output.shape[-2:]],
            "in_channels": int(module.in_channels), "out_channels": int(module.out_channels),
            "groups": int(module.groups)}


def _conv_record(c: Any, where: str) -> dict | None:
    if c is None:
        return None  # profiles written before the geometry was recorded
    if not isinstance(c, dict) or any(k not in c for k in CONV_PAIRS + CONV_INTS):
        raise _bad(f"{where}.conv must be an object with keys {', '.join(CONV_PAIRS + CONV_INTS)}")
    out = {}
    for k in CONV_PAIRS:
        v = c[k]
        if not isinstance(v, list) or len(v) != 2:
            raise _bad(f"{where}.conv.{k} must be a list of two integers, got {v!r}")
        out[k] = [_count(x, f"{where}.conv.{k}") for x in v]
    for k in CONV_INTS:
        out[k] = _count(c[k], f"{where}.conv.{k}")
    return out


def _conv_row(c: dict | None) -> list[float]:
    if c is None:
        return [np.nan] * len(CONV_COLUMNS)
    return [float(x) for k in CONV_PAIRS for x in c[k]]


def gemm_shape(module: nn.Module, x: torch.Tensor, output: torch.Tensor) -> tuple[int, int, int, int, int] | None:
    """(groups, n, k, rows of this call, rows_per_gemm) of a counted layer's forward GEMM; None for other types."""
    if isinstance(module, nn.Conv2d):
        g = module.groups
        kk = 1
        for d in module.kernel_size:
            kk *= d
        return g, module.out_channels // g, module.in_channels // g * kk, output.numel() // module.out_channels, 0
    if isinstance(module, nn.Linear):
        return 1, module.out_features, module.in_features, output.numel() // module.out_features, 0
    if _is_pyg_linear(module):
        n, k = (int(d) for d in module.weight.shape)
        return 1, n, k, output.numel() // max(n, 1), 0
    if isinstance(module, Matmul) and output.dim() >= 2:
        n = int(output.shape[-1])
        return 1, n, int(x.shape[-1]), output.numel() // max(n, 1), int(output.shape[-2])
    return None


@dataclass
class LayerProfile:
    """Per-sample MACs of every counted layer of a model, as measured in one real training step."""

    model: str
    input_shape: list[int]
    layers: list[LayerRecord] = field(default_factory=list)
    ops: Any = None  # cptsim.measure.opcount.OpProfile: every op of the step (format /2); None in /1 files
    # The memory format the step runs in: a GPU's convolutions cost differently in NHWC (channels_last) and in
    # PyTorch's default NCHW (cptsim.cost.hardware.gpu_kernels); MACs and bytes do not depend on it.
    channels_last: bool = False
    # The layers kept at full precision as the model was built (``profile_named_model``: the model's convention or
    # the globs given, resolved to names); None when not known (a profile read from a file). Not part of the file:
    # a plan and a run record them themselves.
    fp_layers: list[str] | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict:
        d = {"format": PROFILE_FORMAT, "model": self.model, "input_shape": [int(s) for s in self.input_shape],
             "layers": [r.to_json() for r in self.layers]}
        if self.ops is not None:
            d["ops"] = self.ops.to_json()
        if self.channels_last:
            d["memory_format"] = "channels_last"
        return d

    @classmethod
    def from_json(cls, d: Any) -> "LayerProfile":
        if not isinstance(d, dict):
            raise _bad(f"expected a JSON object with \"format\": {PROFILE_FORMAT!r}, got {type(d).__name__}")
        fmt = d.get("format")
        if fmt not in READABLE_FORMATS:
            raise _bad(f"format must be {PROFILE_FORMAT!r} (or the older {READABLE_FORMATS[0]!r}), got {fmt!r}")
        for key in ("model", "input_shape", "layers"):
            if key not in d:
                raise _bad(f"missing key {key!r}")
        shape = d["input_shape"]
        if not isinstance(shape, list) or not shape or any(isinstance(s, bool) or not isinstance(s, int) or s < 1
                                                           for s in shape):
            raise _bad(f"input_shape must be a list of positive integers, got {shape!r}")
        if not isinstance(d["layers"], list):
            raise _bad(f"layers must be a list, got {type(d['layers']).__name__}")
        layers = []
        for i, r in enumerate(d["layers"]):
            where = f"layers[{i}]"
            if not isinstance(r, dict):
                raise _bad(f"{where} must be an object")
            for key in ("name", "type", "quantized", "macs", "numel"):
                if key not in r:
                    raise _bad(f"{where} lacks key {key!r}")
            if not isinstance(r["name"], str) or not isinstance(r["type"], str):
                raise _bad(f"{where}.name and .type must be strings")
            if not isinstance(r["quantized"], bool):
                raise _bad(f"{where}.quantized must be true or false, got {r['quantized']!r}")
            if not isinstance(r.get("sdpa", False), bool):
                raise _bad(f"{where}.sdpa must be true or false, got {r['sdpa']!r}")
            for key, names in (("macs", PHASES), ("numel", NUMEL_KEYS)):
                if not isinstance(r[key], dict) or any(n not in r[key] for n in names):
                    raise _bad(f"{where}.{key} must be an object with keys {', '.join(names)}")
            layers.append(LayerRecord(
                name=r["name"], type=r["type"], quantized=r["quantized"],
                macs={p: _count(r["macs"][p], f"{where}.macs.{p}") for p in PHASES},
                numel={k: _count(r["numel"][k], f"{where}.numel.{k}") for k in NUMEL_KEYS},
                calls=_count(r.get("calls", 1), f"{where}.calls"),
                gemm=_gemm_record(r.get("gemm"), where),
                operand=_count(r.get("operand", 0), f"{where}.operand"),
                edges=_count(r.get("edges", 0), f"{where}.edges"),
                sdpa=r.get("sdpa", False),
                conv=_conv_record(r.get("conv"), where),
            ))
        model = d["model"]
        if not isinstance(model, str):
            raise _bad(f"model must be a string, got {model!r}")
        ops = None
        if d.get("ops") is not None:
            from .opcount import OpProfile

            ops = OpProfile.from_json(d["ops"])
        fmt = d.get("memory_format", "contiguous")
        if fmt not in ("contiguous", "channels_last"):
            raise _bad(f'memory_format must be "contiguous" or "channels_last", got {fmt!r}')
        return cls(model=model, input_shape=list(shape), layers=layers, ops=ops, channels_last=fmt == "channels_last")

    def op_mix(self) -> list[str]:
        """The kinds of kernel that make up this network (``cptsim.cost.hardware.files.OP_MIXES``), so that a time
        estimate can say whether the networks its profile was checked on had them: dense convolutions, grouped
        ones, depthwise ones, attention (matmul layers or fused kernels), linear-dominated (over half the forward
        MACs in Linear layers), recurrent (LSTM)."""
        mix = set()
        fwd = sum(r.macs["fwd"] for r in self.layers) or 1
        lin = 0
        for r in self.layers:
            g = r.gemm or {}
            if r.type == "Conv2d":
                groups = g.get("groups", 1)
                mix.add("conv" if groups == 1 else "depthwise" if is_depthwise_gemm(groups, g.get("n")) else "grouped")
            elif r.type == "Matmul":
                mix.add("attention")
            elif r.type == AGGREGATION:
                mix.add("graph")
            elif r.type == "Linear":
                lin += r.macs["fwd"]
            if r.name.endswith(".hh"):  # a recurrent layer's hidden-to-hidden GEMM (cptsim.numerics.lm_layers)
                mix.add("lstm")
        if lin * 2 > fwd:
            mix.add("linear")
        if self.ops is not None and any(o.kind == "attention" for o in self.ops.records):
            mix.add("attention")
        return sorted(mix)

    def totals(self) -> dict[str, int]:
        """Per-phase MACs per sample, summed over layers."""
        return {p: sum(r.macs[p] for r in self.layers) for p in PHASES}

    def arrays(self) -> ProfileArrays:
        return ProfileArrays(
            names=[r.name for r in self.layers],
            macs=np.array([[r.macs[p] for p in PHASES] for r in self.layers], dtype=np.float64).reshape(-1, 3),
            quantized=np.array([r.quantized for r in self.layers], dtype=bool),
            numel=np.array([[r.numel[k] for k in NUMEL_KEYS] for r in self.layers], dtype=np.float64).reshape(-1, 3),
            calls=np.array([r.calls for r in self.layers], dtype=np.float64),
            ops=self.ops,
            matmul=np.array([r.type in MATMUL_TYPES for r in self.layers], dtype=bool),
            gemm=np.array([[r.gemm[k] for k in GEMM_KEYS] if r.gemm is not None else [np.nan] * len(GEMM_KEYS)
                           for r in self.layers], dtype=np.float64).reshape(-1, len(GEMM_KEYS)),
            is_conv=np.array([r.type == "Conv2d" for r in self.layers], dtype=bool),
            channels_last=bool(self.channels_last),
            operand=np.array([r.operand for r in self.layers], dtype=np.float64),
            edges=np.array([r.edges for r in self.layers], dtype=np.float64),
            aggregation=np.array([r.type == AGGREGATION for r in self.layers], dtype=bool),
            sdpa=np.array([r.sdpa for r in self.layers], dtype=bool),
            conv=np.array([_conv_row(r.conv) for r in self.layers], dtype=np.float64).reshape(-1, len(CONV_COLUMNS)),
        )


# ------------------------------------------------------------------------------------------------ the counter

# Accumulator slots of one layer (a plain list: the hook's integer adds are the whole per-step cost).
_FWD, _DGRAD, _WGRAD, _CALLS, _IN, _OUT, _ROWS, _OPND, _EDGES = range(9)
_ZERO = (0,) * 9


class MacCounter:
    """Attach to a model (forward hooks on every layer type in COUNTERS, propagate hooks on every torch_geometric
    MessagePassing layer, forward hooks on every ``nn.MultiheadAttention``, and the SDPA wrapper while open);
    counts what each training step executes.

    ``reset()`` at the start of a step, run the step, read ``step_macs()`` (batch included) or
    ``layer_profile(batch, shape)`` (per sample). Set ``enabled = False`` around work that must not count
    (evaluation). ``close()`` (or leaving a ``with`` block) removes the hooks.

    The entries are the counted layers in the model's module order, each aggregation after its layer's sublayers;
    an attention module's ``scores`` / ``mix`` entries are made at its first SDPA call and inserted after its
    sublayers (module docstring), so a step's entries are known once a step has run.
    """

    def __init__(self, model: nn.Module, model_name: str = ""):
        self.model_name = model_name
        self.enabled = True
        self._modules: list[nn.Module] = []
        self._names: list[str] = []
        self._types: list[str] = []
        self._acc: list[list[int]] = []
        self._shapes: list[dict] = []  # per layer: the forward GEMM's (groups, n, k, rows_per_gemm), first call
        # per layer: {"agg": an aggregation entry (its module is the MessagePassing layer), "sdpa": a fused
        # attention kernel's matmul, "fp": runs at full precision whatever its module's class (attention, MHA's
        # functional projections), "weight": its weight's elements where the module's ``weight`` is not it}
        self._meta: list[dict] = []
        self._keys: list[tuple] = []  # per layer: its place in the module order (entries made later go there)
        self._handles: list = []
        self._tree: dict[int, tuple[nn.Module, str, int]] = {}  # id(module) -> (module, name, end of its subtree)
        self._entry_of: dict[int, tuple] = {}  # id(counted module) -> (module, acc, shape, meta) of its entry
        self._sites: dict[int, tuple[nn.Module, list]] = {}  # id(attention module) -> (module, its two entries)
        self._open_mha: dict[int, tuple[int, int]] = {}  # id(MHA) -> out_proj's and attention's calls at entry
        _register_pyg_linear()
        mods = list(model.named_modules())
        end = list(range(len(mods)))  # the last preorder index inside each module's subtree
        stack: list[int] = []
        for i, (name, _) in enumerate(mods):
            while stack and mods[stack[-1]][0] and not name.startswith(mods[stack[-1]][0] + "."):
                end[stack.pop()] = i - 1
            stack.append(i)
        for j in stack:
            end[j] = len(mods) - 1
        pending: list[tuple[str, nn.Module, int]] = []  # aggregations, listed after their layer's own sublayers
        for i, (name, module) in enumerate(mods):
            self._tree.setdefault(id(module), (module, name, end[i]))
            while pending and pending[-1][0] and not name.startswith(pending[-1][0] + "."):
                self._add_aggregation(*pending.pop())
            if is_message_passing(module):
                pending.append((name, module, end[i]))
            if isinstance(module, nn.MultiheadAttention):
                self._add_mha(name, module, (i, 0))
            found = counter_for(type(module))
            if found is None:
                continue
            base, fn = found
            acc = list(_ZERO)
            shape: dict = {}
            meta = self._append((i, 0), module, name or type(module).__name__, base.__name__, acc, shape)
            self._entry_of.setdefault(id(module), (module, acc, shape, meta))
            self._handles.append(module.register_forward_hook(self._hook(module, fn, acc, shape), with_kwargs=True))
        while pending:
            self._add_aggregation(*pending.pop())
        _sdpa_open(self)
        self._sdpa_opened = True

    # -- entries

    def _append(self, key: tuple, module: nn.Module, name: str, typ: str, acc: list, shape: dict,
                pos: int | None = None, **meta) -> dict:
        pos = len(self._acc) if pos is None else pos
        m = {"agg": False, "sdpa": False, "fp": False, "weight": None, **meta}
        for lst, v in ((self._modules, module), (self._names, name), (self._types, typ), (self._acc, acc),
                       (self._shapes, shape), (self._meta, m), (self._keys, key)):
            lst.insert(pos, v)
        return m

    def _add_aggregation(self, name: str, module: nn.Module, end: int) -> None:
        acc = list(_ZERO)
        self._append((end, 1), module, f"{name}.aggregate" if name else "aggregate", AGGREGATION, acc, {"none": True},
                     agg=True)
        self._handles.append(module.register_propagate_forward_hook(self._propagate_hook(module, acc)))

    def _add_mha(self, name: str, module: nn.MultiheadAttention, key: tuple) -> None:
        acc, shape = list(_ZERO), {}
        w = module.in_proj_weight
        weight = w.numel() if w is not None else sum(t.numel() for t in (module.q_proj_weight, module.k_proj_weight,
                                                                         module.v_proj_weight))
        self._append(key, module, f"{name}.in_proj" if name else "in_proj", "Linear", acc, shape, fp=True,
                     weight=int(weight))
        self._handles.append(module.register_forward_pre_hook(self._mha_pre_hook(module), with_kwargs=True))
        self._handles.append(module.register_forward_hook(self._mha_hook(module, acc, shape), with_kwargs=True))

    def _site(self, module: nn.Module) -> list:
        """The scores and mix entries of an attention module: [(acc, shape, meta)] x 2, made at its first call."""
        site = self._sites.get(id(module))
        if site is not None and site[0] is module:
            return site[1]
        _, name, last = self._tree[id(module)]
        entries = []
        prefix = f"{name}." if name else ""
        taken = set(self._names)
        if any(prefix + part in taken for part in ATTENTION_PARTS):  # it has a counted layer of that name
            prefix += "sdpa."
        for j, part in enumerate(ATTENTION_PARTS):
            full = prefix + part
            acc, shape = list(_ZERO), {}
            key = (last, 2, j)
            pos = bisect.bisect_right(self._keys, key)
            meta = self._append(key, module, full, "Matmul", acc, shape, pos=pos, fp=True, weight=0)
            entries.append((acc, shape, meta))
        self._sites[id(module)] = (module, entries)
        return entries

    @staticmethod
    def _add(acc: list[int], shape: dict, c: dict) -> None:
        acc[_FWD] += c["fwd"]
        acc[_DGRAD] += c["dgrad"]
        acc[_WGRAD] += c["wgrad"]
        acc[_CALLS] += 1
        acc[_IN] += c["input"]
        acc[_OUT] += c["output"]
        acc[_OPND] += c.get("operand", 0)
        g = c.get("gemm")
        if g is not None:
            if "n" not in shape:
                shape.update(groups=g[0], n=g[1], k=g[2], rows_per_gemm=g[4])
            acc[_ROWS] += g[3]

    def _count_attention(self, module: nn.Module, parts: dict[str, dict], fused: bool) -> None:
        for (acc, shape, meta), part in zip(self._site(module), ATTENTION_PARTS):
            self._add(acc, shape, parts[part])
            meta["sdpa"] = meta["sdpa"] or fused

    def _count_sdpa(self, owner: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
        """One ``F.scaled_dot_product_attention`` call made inside ``owner`` (the SDPA wrapper's report)."""
        node = self._tree.get(id(owner))
        if node is None or node[0] is not owner:
            return  # not this counter's model (a deepcopy of it, another model)
        c = sdpa_macs(_arg(args, kwargs, 0, "query"), _arg(args, kwargs, 1, "key"), _arg(args, kwargs, 2, "value"),
                      out, _arg(args, kwargs, 3, "attn_mask"), torch.is_grad_enabled())
        if c is not None:
            self._count_attention(owner, c, fused=True)

    # -- hooks

    def _propagate_hook(self, owner: nn.Module, acc: list[int]) -> Callable:
        node_args, edge_args = _message_args(owner)
        grad_enabled = torch.is_grad_enabled

        def hook(module, inputs, output):
            if not self.enabled or module is not owner or not isinstance(output, torch.Tensor):
                return None
            edge_index, _size, kwargs = inputs
            c = aggregation_macs(module, edge_index, kwargs, output, node_args, edge_args, grad_enabled())
            self._add(acc, {}, c)  # an aggregation has no GEMM shape
            acc[_EDGES] += c["edges"]
            return None

        return hook

    def _calls(self, module: nn.Module | None) -> int:
        """Calls counted so far into a counted module's entry (-1 if it has none)."""
        e = self._entry_of.get(id(module)) if module is not None else None
        return e[1][_CALLS] if e is not None and e[0] is module else -1

    def _site_calls(self, module: nn.Module) -> int:
        site = self._sites.get(id(module))
        return site[1][0][0][_CALLS] if site is not None and site[0] is module else 0

    def _mha_pre_hook(self, owner: nn.MultiheadAttention) -> Callable:
        def hook(module, args, kwargs):
            if self.enabled and module is owner:
                self._open_mha[id(module)] = (self._calls(getattr(module, "out_proj", None)), self._site_calls(module))
            return None

        return hook

    def _mha_hook(self, owner: nn.MultiheadAttention, acc: list[int], shape: dict) -> Callable:
        grad_enabled = torch.is_grad_enabled

        def hook(module, args, kwargs, output):
            if module is not owner:
                return
            before = self._open_mha.pop(id(module), None)
            if before is None or not self.enabled:
                return
            query, key, value = (_arg(args, kwargs, i, n) for i, n in enumerate(("query", "key", "value")))
            if not all(isinstance(t, torch.Tensor) and not t.is_nested for t in (query, key, value)):
                return
            grad = grad_enabled()
            proj, att = _mha_parts(module, query, key, value, grad)
            self._add(acc, shape, proj)
            out = output[0] if isinstance(output, (tuple, list)) else output
            op = getattr(module, "out_proj", None)
            if isinstance(op, nn.Linear) and isinstance(out, torch.Tensor) and self._calls(op) == before[0]:
                # F.multi_head_attention_forward ran out_proj with F.linear on its weight: count it in its entry
                _, op_acc, op_shape, op_meta = self._entry_of[id(op)]
                n = out.numel() * op.in_features
                # its input, the attention's output p·v, needs a gradient when p or v does
                x_grad = att["mix"]["dgrad"] > 0 or att["mix"]["wgrad"] > 0
                self._add(op_acc, op_shape, {
                    "fwd": n, "dgrad": n if x_grad else 0, "wgrad": n if grad and op.weight.requires_grad else 0,
                    "input": out.numel(), "output": out.numel(),
                    "gemm": (1, op.out_features, op.in_features, out.numel() // op.out_features, 0)})
                op_meta["fp"] = True
            if self._site_calls(module) == before[1]:  # no SDPA call: need_weights=True computed it with bmm
                self._count_attention(module, att, fused=False)

        return hook

    def _hook(self, owner: nn.Module, fn: Callable, acc: list[int], shape: dict) -> Callable:
        grad_enabled = torch.is_grad_enabled

        def hook(module, args, kwargs, output):
            # `module is owner`: a deepcopy of the model carries this hook along; its calls are not ours.
            if not self.enabled or module is not owner:
                return
            x = args[0] if args else next(iter(kwargs.values()))
            n = fn(module, x, output)
            acc[_FWD] += n
            if grad_enabled():
                if x.requires_grad:
                    acc[_DGRAD] += n
                # a weightless layer (attention's Matmul, called m(a, b)) has its second operand where a layer
                # has its weight: its "dgrad" is the gradient w.r.t. a (error x b), its "wgrad" the one w.r.t. b
                w = args[1] if len(args) > 1 else getattr(module, "weight", None)
                if w is not None and w.requires_grad:
                    acc[_WGRAD] += n
            acc[_CALLS] += 1
            acc[_IN] += x.numel()
            acc[_OUT] += output.numel()
            if len(args) > 1 and isinstance(args[1], torch.Tensor):  # Matmul(a, b): b is read (and its grad written)
                acc[_OPND] += args[1].numel()
            if shape.get("none") is None:
                gs = gemm_shape(module, x, output)
                if gs is None:
                    shape["none"] = True
                else:
                    shape.update(groups=gs[0], n=gs[1], k=gs[2], rows_per_gemm=gs[4])
                    acc[_ROWS] += gs[3]
                    geo = conv_geometry(module, x, output)
                    if geo is not None:
                        shape["conv"] = geo

        return hook

    def _quantized(self, i: int) -> bool:
        m, meta = self._modules[i], self._meta[i]
        if meta["fp"]:
            return False
        return aggregation_quantized(m) if meta["agg"] else _is_quantized(m)

    def _weight(self, i: int) -> int:
        meta = self._meta[i]
        if meta["agg"]:
            return 0
        return meta["weight"] if meta["weight"] is not None else _weight_numel(self._modules[i])

    # -- per step

    def reset(self) -> None:
        """Start a new step: zero every count."""
        for acc in self._acc:
            acc[:] = _ZERO

    def step_macs(self) -> dict[str, int]:
        """MACs of everything counted since ``reset``, per phase, batch included."""
        return {p: sum(acc[i] for acc in self._acc) for i, p in enumerate(PHASES)}

    def step_arrays(self) -> ProfileArrays:
        """The counted step as ProfileArrays with the batch included (macs and input/output numel are totals), so
        ``cost.step_cost(counter.step_arrays(), q, g, batch=1)`` costs exactly what was measured."""
        idx = range(len(self._acc))
        return ProfileArrays(
            names=list(self._names),
            macs=np.array([acc[:3] for acc in self._acc], dtype=np.float64).reshape(-1, 3),
            quantized=np.array([self._quantized(i) for i in idx], dtype=bool),
            numel=np.array([[self._weight(i), acc[_IN], acc[_OUT]] for i, acc in zip(idx, self._acc)],
                           dtype=np.float64).reshape(-1, 3),
            calls=np.array([acc[_CALLS] for acc in self._acc], dtype=np.float64),
            matmul=np.array([t in MATMUL_TYPES for t in self._types], dtype=bool),
            operand=np.array([acc[_OPND] for acc in self._acc], dtype=np.float64),
            edges=np.array([acc[_EDGES] for acc in self._acc], dtype=np.float64),
            aggregation=np.array([m["agg"] for m in self._meta], dtype=bool),
            sdpa=np.array([m["sdpa"] for m in self._meta], dtype=bool),
        )

    def layer_profile(self, batch_size: int, input_shape: Iterable[int]) -> LayerProfile:
        """Per-sample profile of the last counted step (every count divided by ``batch_size``)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")
        b = batch_size

        def per_sample(v: int) -> int:
            return (v + b // 2) // b  # exact for layers that see the batch; rounded otherwise

        layers = []
        for i, (name, typ, acc, shape) in enumerate(zip(self._names, self._types, self._acc, self._shapes)):
            gemm = None
            if "n" in shape and acc[_CALLS]:
                gemm = {"groups": shape["groups"], "n": shape["n"], "k": shape["k"], "rows": per_sample(acc[_ROWS]),
                        "rows_per_gemm": shape["rows_per_gemm"]}
            layers.append(LayerRecord(
                name=name, type=typ, quantized=self._quantized(i),
                macs={p: per_sample(acc[j]) for j, p in enumerate(PHASES)},
                numel={"weight": self._weight(i),
                       "input": per_sample(acc[_IN]), "output": per_sample(acc[_OUT])},
                calls=acc[_CALLS], gemm=gemm, operand=per_sample(acc[_OPND]), edges=per_sample(acc[_EDGES]),
                sdpa=self._meta[i]["sdpa"], conv=shape.get("conv") if gemm is not None else None,
            ))
        return LayerProfile(model=self.model_name, input_shape=[int(s) for s in input_shape], layers=layers)

    # -- lifetime

    def close(self) -> None:
        """Remove the hooks and stop counting SDPA calls (idempotent)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if getattr(self, "_sdpa_opened", False):
            _sdpa_close(self)
            self._sdpa_opened = False

    def __enter__(self) -> "MacCounter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------------------------------------ one-shot profiling


def _what(v: Any) -> str:
    """A value as an error message names it: an array by its type, shape and dtype (never its contents, which
    can be thousands of numbers), anything else by a short repr."""
    if isinstance(v, (torch.Tensor, np.ndarray)):
        return f"a {type(v).__name__} of shape {tuple(v.shape)} ({v.dtype})"
    if isinstance(v, (list, tuple)) and any(isinstance(x, (torch.Tensor, np.ndarray)) for x in v):
        return f"a {type(v).__name__} of {len(v)} items, the first {_what(v[0])}"
    text = " ".join(repr(v).split())
    return text if len(text) <= 60 else f"a {type(v).__name__} ({text[:40]}...)"


def _random_batch(shape: Any, batch_size: int, device: torch.device) -> torch.Tensor:
    try:
        dims = [int(s) for s in shape]
    except (TypeError, ValueError, RuntimeError):
        raise InputError(f"input shape must be sizes like (C, H, W) or (T, F), got {_what(shape)}") from None
    if not dims or any(s < 1 for s in dims):
        raise InputError(f"input shape must be positive sizes like (C, H, W) or (T, F), got {_what(tuple(dims))}")
    return torch.randn(batch_size, *dims, device=device)


def profile_model(model: nn.Module, example_batch_or_input_shape: Any, batch_size: int = 2,
                  model_name: str = "", optimizer: str = "sgd", graph_edges: int | None = None) -> LayerProfile:
    """Per-sample MACs of one real training step: forward, cross-entropy on random labels, backward (no optimizer).

    Runs on a deepcopy of ``model`` in training mode, inside ``torch.random.fork_rng``, so the caller's weights,
    BatchNorm statistics, activation ranges, precision state and RNG streams are all untouched. Give an example
    batch (a tensor, first dim = batch) or a per-sample input shape ((C, H, W), (T, F)) for a random batch of
    ``batch_size``. The layers' ``requires_grad`` flags are kept, so frozen layers profile with wgrad 0.
    ``optimizer``: the one whose update the step's op list counts (``cptsim.measure.opcount.training_optimizer``).

    A graph model (one holding a torch_geometric MessagePassing layer) has one sample = its whole graph: its input
    shape is (N, F) (or an example [1, N, F] / [N, F]), its graph has ``graph_edges`` directed edges (default: the
    bound graph's, else the model's ``cptsim_default_edges``, else 4 per node), ``batch_size`` does not apply, and
    the profile is of one graph (``_profile_graph``).
    """
    if is_graph_model(model):
        return _profile_graph(model, example_batch_or_input_shape, model_name, optimizer, graph_edges)
    if isinstance(batch_size, (torch.Tensor, np.ndarray)):  # profile_model(model, x, y): labels are not taken
        raise InputError(f"profile_model(model, example_batch_or_input_shape, batch_size=...) takes no labels (the "
                         f"step's are drawn at random); its third argument is batch_size, got {_what(batch_size)}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer, got {_what(batch_size)}")
    work = copy.deepcopy(model)
    work.train()
    param = next(work.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.enable_grad():
        torch.manual_seed(0)
        if isinstance(example_batch_or_input_shape, torch.Tensor):
            x = example_batch_or_input_shape.detach().to(device)
            if x.dim() < 2:
                raise InputError(f"example batch must have a batch dimension, got shape {tuple(x.shape)}")
            batch_size = int(x.shape[0])
        else:
            make = getattr(work, "example_input", None)  # a language model wants token ids, not floats
            x = (make(batch_size, example_batch_or_input_shape, device) if make is not None
                 else _random_batch(example_batch_or_input_shape, batch_size, device))
        shape = list(x.shape[1:])
        counter = MacCounter(work, model_name)
        try:
            out = _forward(work, (x,), model_name or type(model).__name__, shape)
            if not isinstance(out, torch.Tensor) or out.dim() < 2 or out.shape[0] != batch_size:
                raise InputError(f"model output must be logits (batch, classes, ...), got "
                                 f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
            _loss_backward(out)
            prof = counter.layer_profile(batch_size, shape)
        finally:
            counter.close()
        from .opcount import count_step_ops

        # the step's other ops, on fresh copies (the MACs above are untouched)
        prof.ops = count_step_ops(model, x, optimizer=optimizer)
        return prof


def _forward(work: nn.Module, args: tuple, name: str, shape) -> Any:
    try:
        return work(*args)
    except RuntimeError as e:
        # Nearly always a model that cannot take this input shape: the user's shape or model choice.
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"{name}: a training step on input shape {tuple(shape)} failed: {reason}") from None


def _loss_backward(out: torch.Tensor) -> None:
    # Class dim 1, as F.cross_entropy expects; labels sized from the output.
    labels = torch.randint(out.shape[1], (out.shape[0], *out.shape[2:]), device=out.device)
    loss = class_cross_entropy(out.float(), labels)
    if loss.requires_grad:
        loss.backward()


def _graph_shape(example: Any) -> tuple[int, int]:
    if isinstance(example, torch.Tensor):
        if example.dim() not in (2, 3) or (example.dim() == 3 and example.shape[0] != 1):
            raise InputError(f"a graph model's example input is one graph's node features [1, N, F] or [N, F], got "
                             f"shape {tuple(example.shape)}")
        dims = [int(d) for d in example.shape[-2:]]
    else:
        try:
            dims = [int(d) for d in example]
        except (TypeError, ValueError):
            raise InputError(f"a graph model's input shape is (nodes, features), got {example!r}") from None
    if len(dims) != 2 or min(dims) < 1:
        raise InputError(f"a graph model's input shape is (nodes, features), got {tuple(dims)}")
    return dims[0], dims[1]


def _profile_graph(model: nn.Module, example: Any, model_name: str, optimizer: str,
                   graph_edges: int | None, direct: bool | None = None) -> LayerProfile:
    """A graph model's per-sample profile: one training step on one graph of N nodes (F features each) and E
    directed edges, the model called as PyG's ``model(x [N, F], edge_index)`` on seeded random structures with
    those sizes -- exact, since a step's work depends on the sizes and widths, not on which nodes are joined.

    The step runs on four small graphs and every count is extrapolated as a·N + b·E + c
    (``opcount.affine_extrapolate``: exact for a node classifier, whose layers do per-node and per-edge work, and
    checked on the fourth graph), so ogbn-arxiv (169k nodes, 2.3M edges: a real step holds GBs of per-edge
    messages) profiles in about a second. A model whose counts are not affine is run on a graph of its own size,
    up to ``GRAPH_DIRECT_LIMIT`` nodes + edges (an InputError above). ``direct``: True runs at the graph's own size
    in any case, False never (``opcount.count_graph_step_ops``)."""
    from .opcount import FIT_SIZES, NotAffine, _random_graph, bound_edges, count_graph_step_ops, not_affine_error

    name = model_name or type(model).__name__
    nodes, features = _graph_shape(example)
    if graph_edges is None:
        graph_edges = bound_edges(model)
        graph_edges = 4 * nodes if graph_edges is None else graph_edges
    if isinstance(graph_edges, bool) or not isinstance(graph_edges, int) or graph_edges < 0:
        raise InputError(f"graph_edges must be an integer >= 0, got {graph_edges!r}")
    if graph_edges > nodes * (nodes - 1):
        raise InputError(f"a graph of {nodes} nodes has at most {nodes * (nodes - 1)} directed edges without "
                         f"self-loops, not {graph_edges}")
    work = copy.deepcopy(model)
    work.train()
    param = next(work.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    devices = [device] if device.type == "cuda" else []

    def steps(sizes) -> list[LayerProfile]:
        profs = []
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            torch.manual_seed(0)
            counter = MacCounter(work, model_name)
            try:
                for n, e in sizes:
                    counter.reset()
                    x = torch.randn(n, features, device=device)
                    try:
                        out = _forward(work, (x, _random_graph(n, e, device)), name, (n, features))
                    except TypeError as err:
                        raise InputError(f"{name}: a graph model is profiled as PyG calls one, model(x [N, F], "
                                         f"edge_index); that call failed: {err}") from None
                    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != n:
                        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                        raise InputError(f"{name}: a graph model called as model(x [N, F], edge_index) must return "
                                         f"logits [N, classes], got {got}")
                    _loss_backward(out)
                    profs.append(counter.layer_profile(1, (nodes, features)))
            finally:
                counter.close()
        return profs

    prof = None
    if direct is not True:
        try:
            prof = _extrapolate(steps(FIT_SIZES), nodes, graph_edges)
        except NotAffine as e:
            if direct is False or nodes + graph_edges > GRAPH_DIRECT_LIMIT:
                raise not_affine_error(name, e.what, nodes, graph_edges) from None
    if prof is None:
        prof = steps([(nodes, graph_edges)])[0]
    prof.ops = count_graph_step_ops(model, features, nodes, graph_edges, optimizer, device=device, direct=direct)
    return prof


def _extrapolate(profs: list[LayerProfile], nodes: int, edges: int) -> LayerProfile:
    """The profile at (nodes, edges) from profiles at ``opcount.FIT_SIZES``, field by field (``NotAffine`` when a
    count is not a·N + b·E + c)."""
    from .opcount import NotAffine, affine_extrapolate

    def value(vals: list[int], what: str) -> int:
        got = affine_extrapolate(vals, nodes, edges)
        if got is None:
            raise NotAffine(what)
        return max(0, round(got[0] + got[1]))

    layers = []
    for recs in zip(*(p.layers for p in profs)):
        r = recs[0]
        if len({x.calls for x in recs}) != 1:
            raise NotAffine(f"the number of calls of layer {r.name}")
        where = f"layer {r.name}'s"
        gemm = None
        if r.gemm is not None:
            gemm = dict(r.gemm, rows=value([x.gemm["rows"] if x.gemm else 0 for x in recs], f"{where} GEMM rows"))
        layers.append(LayerRecord(
            name=r.name, type=r.type, quantized=r.quantized,
            macs={p: value([x.macs[p] for x in recs], f"{where} {p} MACs") for p in PHASES},
            numel={"weight": r.numel["weight"],
                   **{k: value([x.numel[k] for x in recs], f"{where} {k} size") for k in ("input", "output")}},
            calls=r.calls, gemm=gemm, operand=value([x.operand for x in recs], f"{where} operand"),
            edges=value([x.edges for x in recs], f"{where} edges"), sdpa=r.sdpa, conv=r.conv,
        ))
    return LayerProfile(model=profs[0].model, input_shape=list(profs[0].input_shape), layers=layers)


def profile_named_model(model: str, shape: tuple[int, ...], num_classes: int,
                        fp_layers: list[str] | None = None, graph_edges: int | None = None,
                        optimizer: str = "sgd", quant_agg: bool = False, channels_last: bool = False) -> "LayerProfile":
    """Create a registry model, quantize it as training would, and profile one training step (per-sample MACs).

    ``fp_layers``: globs of layers kept at full precision; None = the model's own convention, resolved by the
    registry (``cptsim.models.default_fp_layers``); [] = quantize every layer. The step runs at the fresh
    PrecisionState's 32 bits (no quantizer ops): MACs do not depend on the bits, and the layers are the quantized
    ones, so each layer's ``quantized`` flag is what training will have. A graph model (input shape (N, F)) is
    profiled on one graph of ``graph_edges`` directed edges (a dataset's ``DataInfo.graph_edges``; None: the
    model's default), its aggregations quantized when ``quant_agg``; ``optimizer``: the update the op list
    counts; ``channels_last``: the memory format the step runs in (the profile records it). The one place a
    named model is built and profiled: `cptsim profile`, `cptsim cost` and the planner's workload all call it, and
    the profile carries the full-precision layers as resolved (``LayerProfile.fp_layers``)."""
    from cptsim.models import create_model, default_fp_layers
    from cptsim.numerics.layers import quantize_model, resolve_fp_layers

    in_channels = shape[0] if len(shape) == 3 else 1
    torch_model = create_model(model, num_classes=num_classes, in_channels=in_channels, input_shape=shape,
                               graph=graph_edges is not None)
    keep = default_fp_layers(torch_model) if fp_layers is None else resolve_fp_layers(torch_model, fp_layers)
    quantize_model(torch_model, fp_layers=keep, **({"quant_agg": True} if quant_agg else {}))
    prof = profile_model(torch_model, shape, batch_size=2, model_name=model, optimizer=optimizer,
                         graph_edges=graph_edges)
    prof.channels_last = bool(channels_last)
    prof.fp_layers = list(keep)
    return prof

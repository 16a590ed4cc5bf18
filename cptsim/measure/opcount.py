"""Every op of a training step, counted at the dispatcher: bytes read and written and kernel launches per op.

The per-layer MACs (``cptsim.measure.profiler``) cost the GEMMs; a real step also runs batch norm, activations, residual
adds, pooling, the loss, the optimizer's update and (when the model runs fake-quantized) the quantizers' own
passes. On a GPU those memory-bound ops and the per-kernel overhead are a large share of the time. They are
counted here under a ``TorchDispatchMode`` -- the mechanism of ``torch.utils.flop_counter.FlopCounterMode`` -- so
every aten op that executes is seen, whatever module or functional call issued it; nothing is matched by name.

Per op the counter records (rules, not measurements of a GPU):

* ``kind``: ``gemm`` for the ops ``torch.utils.flop_counter`` counts FLOPs for (mm, addmm, bmm, convolution and
  its backward) -- their time comes from the per-layer MACs -- ``attention`` for fused scaled-dot-product
  attention kernels (their MACs counted here, ``attention_macs``: a GPU's time of them is priced from here),
  ``memory`` for every other op that launches a kernel, ``view`` for ops that only make a view (reshape,
  transpose, detach, ...) or allocate, ``aggregation`` for the memory ops a graph layer's sparse aggregation runs
  (below).
* a graph model's aggregation: every kernel that runs inside a ``MessagePassing.propagate`` call (the gather,
  the per-edge weighting, the scatter-sum) and inside the autograd nodes that call created (their backward: the
  transposed gather/scatter, GAT's gradient into alpha) is of kind ``aggregation``. Their bytes are kept here
  (tensors counted at most at their storage's size: PyG's scatter reads an index expanded to [nnz, width] from
  nnz stored entries), but the cost model prices the aggregation from its layer entry (``cptsim.cost.model
  .aggregation_bytes``), as it prices GEMMs from theirs, and counts only their launches from here.
* ``launches``: 1 per call for a kernel op, 0 for a view; ``convolution_backward`` one per gradient it computes;
  a ``_foreach_*`` op (the multi-tensor optimizer) one per 48 tensors, as CUDA's multi_tensor_apply chunks them.
* bytes read = the sizes of its tensor arguments (each tensor once); bytes written = its new outputs plus the
  arguments it mutates. Caches are not modelled: every op reads and writes DRAM.
* ``phase``: ``fwd`` (forward and loss), ``bwd`` (autograd backward), ``opt`` (the optimizer step).

A step is counted at two batch sizes (b and 2b) and each op's bytes split into a part proportional to the batch
(``per_sample``: activations, errors) and a fixed part (weights, gradients, optimizer state), so a profile taken
at batch 2 costs a step of any batch. The step counted is the one ``cptsim train`` runs: the same optimizer
(``training_optimizer``: SGD with momentum and weight decay, Adam or AdamW, in the multi-tensor ``foreach`` form
PyTorch picks by default on a GPU) and the same clearing of gradients (``zero_grad``: kept allocated and zeroed,
so the backward accumulates into them, one ``add_`` per parameter).

A graph model's sample is its whole graph (N nodes, E edges), so its "batch" is one graph (``count_graph_step_ops``):
it is called as PyG's ``model(x [n, F], edge_index)`` on seeded random structures, whose counts are those of any
graph of the same sizes. It runs on four small graphs (``FIT_SIZES``) and every count is extrapolated exactly as
c = a·N + b·E + c0 (per node, per edge, fixed: ``affine_extrapolate``), the fourth size checking that the model's
counts are affine in its graph's sizes, as a node classifier's are (one rule per node and per edge). So a graph of
any size costs the same few milliseconds (ogbn-arxiv's real step holds GBs of per-edge messages; Cora's dense
transform alone is 2 GMACs). A model whose counts are not affine is run on a graph of its own size instead, at
(N, E) and (2N, 2E), split as b and 2b are -- up to ``GRAPH_DIRECT_LIMIT`` nodes + edges; above, an InputError.
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
from fractions import Fraction
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from cptsim.errors import InputError
from cptsim.models.loss import class_cross_entropy

__all__ = ["OP_PHASES", "OpRecord", "OpProfile", "OpCounter", "count_step_ops", "count_graph_step_ops",
           "training_optimizer", "optimizer_label", "OPTIMIZERS", "ADAM_BETAS", "ADAM_EPS", "zero_grad",
           "ZERO_GRAD_SET_TO_NONE", "GRAPH_DIRECT_LIMIT", "FIT_SIZES", "is_message_passing", "is_graph_model",
           "bound_edges", "affine_extrapolate", "NotAffine"]

OP_PHASES = ("fwd", "bwd", "opt")
KINDS = ("gemm", "memory", "view", "attention", "aggregation")
FOREACH_TENSORS_PER_LAUNCH = 48  # multi_tensor_apply's depth-3/4 chunk (csrc/cuda/MultiTensorApply.cuh: 48 / 36)


# How `cptsim train` clears gradients before each step: zeroed in place, not freed (set_to_none=False), so every
# backward accumulates into them (AccumulateGrad's add_, one per parameter) -- what the counted step must run too.
ZERO_GRAD_SET_TO_NONE = False


OPTIMIZERS = ("sgd", "adam", "adamw")
ADAM_BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults, as cpt_gnn uses them (Adam(lr=1e-3))
ADAM_EPS = 1e-8


def _optimizer_name(name: str) -> str:
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in OPTIMIZERS:
        raise InputError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    return key


def training_optimizer(params, lr: float, momentum: float, weight_decay: float,
                       name: str = "sgd") -> torch.optim.Optimizer:
    """The optimizer `cptsim train` steps and ``count_step_ops`` counts, in its multi-tensor (``foreach``) form,
    what PyTorch picks by default for CUDA tensors, asked for explicitly so that a step counted on a CPU launches
    what it launches on a GPU, and so that ``zero_grad`` zeroes the gradients with ``_foreach_zero_`` there too.

    * ``sgd``: SGD with ``momentum`` and ``weight_decay`` (L2: wd x w added to the gradient);
    * ``adam``: Adam (Kingma & Ba), betas ``ADAM_BETAS`` (0.9, 0.999), eps ``ADAM_EPS`` (1e-8), ``weight_decay``
      as torch's Adam defines it: L2, wd x w added to the gradient before the moments;
    * ``adamw``: AdamW (Loshchilov & Hutter), the same betas and eps, ``weight_decay`` decoupled: w <- w x
      (1 - lr x wd) before the Adam update.

    Adam and AdamW take no momentum (their first moment's beta1 is 0.9): ``momentum`` is used by SGD only."""
    key = _optimizer_name(name)
    if key == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, foreach=True)
    cls = torch.optim.Adam if key == "adam" else torch.optim.AdamW
    return cls(params, lr=lr, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=weight_decay, foreach=True)


def optimizer_label(name: str = "sgd") -> str:
    """How an op list names the optimizer whose update it counted (``OpProfile.optimizer``)."""
    key = _optimizer_name(name)
    if key == "sgd":
        return "sgd(momentum, weight_decay, foreach)"
    return f"{key}(betas={ADAM_BETAS}, eps={ADAM_EPS:g}, weight_decay, foreach)"


def zero_grad(opt: torch.optim.Optimizer) -> None:
    """Clear the gradients as `cptsim train` does before each step (``ZERO_GRAD_SET_TO_NONE``)."""
    opt.zero_grad(set_to_none=ZERO_GRAD_SET_TO_NONE)


def _gemm_ops() -> frozenset:
    from torch.utils.flop_counter import flop_registry

    return frozenset(k for k in flop_registry if isinstance(k, torch._ops.OpOverloadPacket))


_GEMM = None
_NO_KERNEL = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "set_",
                        "resize_", "_local_scalar_dense", "lift_fresh", "_has_compatible_shallow_copy_type"})


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _stored_nbytes(t: torch.Tensor) -> int:
    """A tensor's bytes, at most its storage's: an expanded (broadcast) index is read from its stored entries."""
    n = t.numel() * t.element_size()
    try:
        return min(n, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError, TypeError):  # sparse or storage-less tensors
        return n


def _is_view(func) -> bool:
    rets = func._schema.returns
    return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)


@dataclass
class _Acc:
    calls: int = 0
    launches: int = 0
    read: int = 0
    write: int = 0
    macs: int = 0
    shapes: dict = field(default_factory=dict)  # a batch norm's (positions per sample, channels) -> calls


def is_batch_norm(op: str) -> bool:
    """Batch norm ops, forward and backward: on a GPU in an NCHW step their time follows their shape (one thread
    block walks a channel's positions: ``OpRecord.norm_shapes``), not only their bytes."""
    return "batch_norm" in op


_NORM = re.compile(r"(batch|layer|group|instance)_norm")


def is_norm(op: str) -> bool:
    """Batch, layer, group and instance norm ops, forward and backward (their own achieved bandwidth on a GPU:
    statistics reduced per channel or row, then applied)."""
    return _NORM.search(op) is not None


def attention_macs(base: str, tensors: list) -> int:
    """MACs of a fused scaled-dot-product attention kernel (FlashAttention and its kin, forward or backward), by
    ``torch.utils.flop_counter``'s own formulas (flops / 2): the scores and the weighted values, and in backward
    their 4 gradient GEMMs plus the recomputed scores. The per-layer profile holds the same forward MACs in each
    attention module's ``scores`` / ``mix`` entries (``cptsim.measure.profiler``, ``sdpa`` True: their BitOPs, at
    32 bits); a GPU's time of the kernels is priced from here, and those entries' GEMM time left out by the share
    held here (``cptsim.cost.model.fused_attention_share``), so nothing is priced twice. ``tensors``: the op's
    tensor arguments in order."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    if base.endswith("_backward"):
        grad_out, q, k, v = (t.shape for t in tensors[:4])
        return sdpa_backward_flop_count(grad_out, q, k, v) // 2
    q, k, v = (t.shape for t in tensors[:3])
    return sdpa_flop_count(q, k, v) // 2


class OpCounter(TorchDispatchMode):
    """Counts every aten op dispatched inside it, under the phase set by ``phase(name)``."""

    def __init__(self):
        super().__init__()
        self.current = "fwd"
        self.acc: dict[tuple[str, str, str], _Acc] = {}  # (op, phase, kind) -> counts
        self.agg_depth = 0  # > 0 inside a graph layer's aggregation (forward or backward): memory ops are its own

    @contextlib.contextmanager
    def phase(self, name: str):
        prev, self.current = self.current, name
        try:
            yield
        finally:
            self.current = prev

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self._count(func, args, kwargs, out)
        return out

    def _count(self, func, args, kwargs, out) -> None:
        global _GEMM
        if _GEMM is None:
            _GEMM = _gemm_ops()
        name = str(func)
        base = func.overloadpacket.__name__
        flat_in, _ = tree_flatten((args, kwargs))
        tensors, seen = [], set()
        for a in flat_in:
            if isinstance(a, torch.Tensor) and id(a) not in seen:
                seen.add(id(a))
                tensors.append(a)
        if "scaled_dot_product" in base and len(tensors) >= 3:
            kind = "attention"  # fused attention: priced from its MACs, not from any layer's
        elif func.overloadpacket in _GEMM:
            kind = "gemm"
        elif _is_view(func) or base in _NO_KERNEL or getattr(func, "namespace", "aten") == "profiler":
            kind = "view"
        else:
            kind = "aggregation" if self.agg_depth > 0 else "memory"
        a = self.acc.setdefault((name, self.current, kind), _Acc())
        a.calls += 1
        if kind == "view":
            return
        size = _stored_nbytes if kind == "aggregation" else _nbytes
        read = sum(size(t) for t in tensors)
        # Written: new outputs, plus every argument the schema says the op mutates (in-place and out= ops).
        write = 0
        mutated = set()
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                v = args[i] if i < len(args) else kwargs.get(arg.name)
                for t in tree_flatten(v)[0]:
                    if isinstance(t, torch.Tensor) and id(t) not in mutated:
                        mutated.add(id(t))
                        write += _nbytes(t)
        rets = func._schema.returns
        outs = out if isinstance(out, (tuple, list)) and len(rets) > 1 else (out,)
        for r, o in zip(rets, outs):
            if r.alias_info is None:
                write += sum(_nbytes(t) for t in tree_flatten(o)[0] if isinstance(t, torch.Tensor))
        if base.startswith("_foreach_"):
            n = max(1, max((len(v) for v in args if isinstance(v, (list, tuple))), default=1))
            launches = math.ceil(n / FOREACH_TENSORS_PER_LAUNCH)
        elif base == "convolution_backward":
            mask = args[-1] if args and isinstance(args[-1], (list, tuple)) else kwargs.get("output_mask", (1,))
            launches = max(1, sum(bool(m) for m in mask))
        else:
            launches = 1
        a.launches += launches
        a.read += read
        a.write += write
        if kind == "attention":
            a.macs += attention_macs(base, tensors)
        elif kind == "memory" and is_batch_norm(base) and tensors and tensors[0].dim() >= 2:
            # the input (forward) or the output's gradient (backward): the same (N, C, *spatial) shape
            t = tensors[0]
            key = (t.numel() // max(1, t.shape[0] * t.shape[1]), int(t.shape[1]))
            a.shapes[key] = a.shapes.get(key, 0) + 1


# ------------------------------------------------------------------------------------------------ records


def _num(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise InputError(f"profile: {where} must be a number >= 0, got {v!r}")
    return float(v)


@dataclass
class OpRecord:
    """One aten op in one phase of a step: calls and launches per step, bytes per sample and fixed per step."""

    op: str
    phase: str
    kind: str
    calls: int
    launches: int
    read_per_sample: float = 0.0
    read_fixed: float = 0.0
    write_per_sample: float = 0.0
    write_fixed: float = 0.0
    macs_per_sample: float = 0.0  # a fused attention kernel's MACs (kind "attention"); 0 for the others
    # A batch norm's calls by shape: [[positions per sample (H x W), channels, calls per step], ...]. None: not
    # recorded (a profile written before they were, or not a batch norm on feature maps).
    norm_shapes: list | None = None

    def to_json(self) -> dict:
        d = {"op": self.op, "phase": self.phase, "kind": self.kind, "calls": self.calls,
             "launches": self.launches,
             "read_bytes": {"per_sample": self.read_per_sample, "fixed": self.read_fixed},
             "write_bytes": {"per_sample": self.write_per_sample, "fixed": self.write_fixed}}
        if self.macs_per_sample:
            d["macs_per_sample"] = self.macs_per_sample
        if self.norm_shapes is not None:
            d["norm_shapes"] = [list(x) for x in self.norm_shapes]
        return d

    @classmethod
    def from_json(cls, r: Any, where: str) -> "OpRecord":
        if not isinstance(r, dict):
            raise InputError(f"profile: {where} must be an object")
        for key in ("op", "phase", "kind", "calls", "launches", "read_bytes", "write_bytes"):
            if key not in r:
                raise InputError(f"profile: {where} lacks key {key!r}")
        if r["phase"] not in OP_PHASES:
            raise InputError(f"profile: {where}.phase must be one of {', '.join(OP_PHASES)}, got {r['phase']!r}")
        if r["kind"] not in KINDS:
            raise InputError(f"profile: {where}.kind must be one of {', '.join(KINDS)}, got {r['kind']!r}")
        rw = {}
        for key in ("read_bytes", "write_bytes"):
            d = r[key]
            if not isinstance(d, dict) or "per_sample" not in d or "fixed" not in d:
                raise InputError(f"profile: {where}.{key} must be an object with keys per_sample, fixed")
            rw[key] = (_num(d["per_sample"], f"{where}.{key}.per_sample"), _num(d["fixed"], f"{where}.{key}.fixed"))
        return cls(op=str(r["op"]), phase=r["phase"], kind=r["kind"], calls=int(_num(r["calls"], f"{where}.calls")),
                   launches=int(_num(r["launches"], f"{where}.launches")),
                   read_per_sample=rw["read_bytes"][0], read_fixed=rw["read_bytes"][1],
                   write_per_sample=rw["write_bytes"][0], write_fixed=rw["write_bytes"][1],
                   macs_per_sample=_num(r.get("macs_per_sample", 0), f"{where}.macs_per_sample"),
                   norm_shapes=_norm_shapes(r.get("norm_shapes"), f"{where}.norm_shapes"))


def _norm_shapes(v: Any, where: str) -> list | None:
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(x, list) and len(x) == 3 for x in v):
        raise InputError(f"profile: {where} must be a list of [positions, channels, calls]")
    return [[_num(x[0], where), _num(x[1], where), _num(x[2], where)] for x in v]


@dataclass
class OpProfile:
    """Every op of one training step (``records``), measured with tensors of ``element_bits`` bits."""

    records: list[OpRecord] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    element_bits: int = 32
    optimizer: str = "sgd(momentum, weight_decay, foreach)"

    def to_json(self) -> dict:
        return {"batch_sizes": list(self.batch_sizes), "element_bits": self.element_bits,
                "optimizer": self.optimizer, "records": [r.to_json() for r in self.records]}

    @classmethod
    def from_json(cls, d: Any) -> "OpProfile":
        if not isinstance(d, dict) or not isinstance(d.get("records"), list):
            raise InputError("profile: ops must be an object with a list 'records'")
        recs = [OpRecord.from_json(r, f"ops.records[{i}]") for i, r in enumerate(d["records"])]
        return cls(records=recs, batch_sizes=[int(b) for b in d.get("batch_sizes", [])],
                   element_bits=int(d.get("element_bits", 32)), optimizer=str(d.get("optimizer", "")))

    def summary(self) -> dict[str, dict[str, float]]:
        """Per phase: memory-op bytes per sample and fixed, kernel launches (all kinds), GEMM launches and the
        convolutions' among them, the
        fused attention kernels' MACs and bytes per sample, and the graph aggregation's kernels' bytes (counted
        apart: the cost model prices the aggregation from its layer entries).

        Kept for as long as ``records`` holds the same record objects: the cost model asks for it on every
        estimate, and a fit or a planner search estimates one profile thousands of times. Callers only read it."""
        recs = self.records
        cached = self.__dict__.get("_summary_cache")
        if cached is not None and len(cached[0]) == len(recs) and all(a is b for a, b in zip(cached[0], recs)):
            return cached[1]
        s = self._summary()
        self.__dict__["_summary_cache"] = (tuple(recs), s)
        return s

    def _summary(self) -> dict[str, dict[str, float]]:
        s = {p: {"bytes_per_sample": 0.0, "bytes_fixed": 0.0, "launches": 0.0, "gemm_launches": 0.0,
                 "conv_launches": 0.0,
                 "attention_macs_per_sample": 0.0, "attention_bytes_per_sample": 0.0,
                 "norm_bytes_per_sample": 0.0, "conv_norm_bytes_per_sample": 0.0,
                 "aggregation_bytes_per_sample": 0.0, "aggregation_bytes_fixed": 0.0,
                 "aggregation_launches": 0.0} for p in OP_PHASES}
        for r in self.records:
            d = s[r.phase]
            d["launches"] += r.launches
            if r.kind == "gemm":
                d["gemm_launches"] += r.launches
                if "convolution" in r.op:  # cuDNN's: the host's setup per call is several times a plain op's
                    d["conv_launches"] += r.launches
            elif r.kind == "memory":
                d["bytes_per_sample"] += r.read_per_sample + r.write_per_sample
                d["bytes_fixed"] += r.read_fixed + r.write_fixed
                if is_norm(r.op):  # a normalisation's share of those bytes (reductions per channel or row)
                    d["norm_bytes_per_sample"] += r.read_per_sample + r.write_per_sample
                    if "layer_norm" not in r.op:  # batch/group/instance norm: on NCHW or NHWC feature maps
                        d["conv_norm_bytes_per_sample"] += r.read_per_sample + r.write_per_sample
            elif r.kind == "attention":
                d["attention_macs_per_sample"] += r.macs_per_sample
                d["attention_bytes_per_sample"] += r.read_per_sample + r.write_per_sample
            elif r.kind == "aggregation":
                d["aggregation_bytes_per_sample"] += r.read_per_sample + r.write_per_sample
                d["aggregation_bytes_fixed"] += r.read_fixed + r.write_fixed
                d["aggregation_launches"] += r.launches
        return s

    def batch_norm_shapes(self) -> dict[str, list] | None:
        """Per phase, the batch norms' calls by shape: [(positions per sample, channels, calls per step), ...]; None
        when a batch / group / instance norm record has none (a profile written before they were recorded, or a
        group / instance norm: the cost model then prices all of them by their bytes alone)."""
        out: dict[str, list] = {p: [] for p in OP_PHASES}
        for r in self.records:
            if r.kind != "memory" or not is_norm(r.op) or "layer_norm" in r.op:
                continue
            if r.norm_shapes is None or not is_batch_norm(r.op):
                if r.read_per_sample + r.write_per_sample > 0:
                    return None
                continue
            out[r.phase] += [tuple(x) for x in r.norm_shapes]
        return out

    def totals(self) -> dict[str, float]:
        s = self.summary()
        return {k: sum(s[p][k] for p in OP_PHASES)
                for k in ("bytes_per_sample", "bytes_fixed", "launches", "conv_launches")}


# ------------------------------------------------------------------------------------------------ graph models

# nodes + edges up to which a graph model whose counts are not affine in its sizes is run at its own size
GRAPH_DIRECT_LIMIT = 200_000
# The four small sizes of the exact affine extrapolation: (n0, e0), (2 n0, e0), (n0, 2 e0), and (3 n0, 3 e0) to check
# (off the other three's rectangle, so that a count quadratic in N or in E, or growing with N x E, fails the check).
FIT_NODES, FIT_EDGES = 48, 192
FIT_SIZES = ((FIT_NODES, FIT_EDGES), (2 * FIT_NODES, FIT_EDGES), (FIT_NODES, 2 * FIT_EDGES),
             (3 * FIT_NODES, 3 * FIT_EDGES))


class NotAffine(Exception):
    """A count of a graph model's step that is not a·N + b·E + c0 in its graph's sizes (``what``: which)."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


def not_affine_error(name: str, what: str, nodes: int, edges: int) -> InputError:
    return InputError(f"{name}: {what} does not grow as one per-node and per-edge rule with the graph's size, so a "
                      f"{nodes:,}-node, {edges:,}-edge step cannot be counted from small graphs, and a real step "
                      f"is run only up to {GRAPH_DIRECT_LIMIT:,} nodes + edges")


def is_message_passing(module: nn.Module) -> bool:
    """A torch_geometric ``MessagePassing`` layer (duck-typed: its propagate hooks), without importing PyG."""
    return callable(getattr(module, "register_propagate_forward_hook", None)) and \
        callable(getattr(module, "propagate", None))


def is_graph_model(model: nn.Module) -> bool:
    """Whether ``model`` holds a message-passing layer: its sample is a whole graph."""
    return any(is_message_passing(m) for m in model.modules())


def bound_edges(model: nn.Module) -> int | None:
    """E of the graph bound to a graph model (``cptsim.models.graph.bind_graph``: its ``edge_index`` buffer
    [2, E]), else the model's ``cptsim_default_edges``, else None."""
    ei = getattr(model, "_buffers", {}).get("edge_index")
    if isinstance(ei, torch.Tensor) and ei.dim() == 2 and ei.shape[0] == 2:
        return int(ei.shape[1])
    e = getattr(model, "cptsim_default_edges", None)
    return int(e) if isinstance(e, int) and not isinstance(e, bool) and e >= 0 else None


def affine_extrapolate(c, nodes: int, edges: int) -> tuple[Fraction, Fraction] | None:
    """(a·N + b·E, c0) for counts ``c`` at the four ``FIT_SIZES``, c = a·n + b·e + c0 (exact
    rationals, from the first three); None when the fourth count, at (3 n0, 3 e0), is not their prediction."""
    n0, e0 = FIT_NODES, FIT_EDGES
    c0, cn, ce, check = (Fraction(v) for v in c)
    a, b = (cn - c0) / n0, (ce - c0) / e0
    const = c0 - a * n0 - b * e0
    if check != a * 3 * n0 + b * 3 * e0 + const:
        return None
    return a * nodes + b * edges, const


def _random_graph(nodes: int, edges: int, device) -> torch.Tensor:
    """A seeded random ``edge_index`` [2, E] without self-loops (``cptsim.models.graph.random_graph``; where that
    module is absent, the same kind of structure drawn here: the counts depend only on N and E)."""
    edges = min(edges, nodes * (nodes - 1))
    try:
        from cptsim.models.graph import random_graph
    except ImportError:
        gen = torch.Generator().manual_seed(0)
        src = torch.randint(nodes, (edges,), generator=gen)
        dst = (src + torch.randint(1, max(nodes, 2), (edges,), generator=gen)) % nodes
        return torch.stack([src, dst]).to(device)
    return random_graph(nodes, edges).to(device)


def _tag_aggregations(work: nn.Module, counter: "OpCounter") -> list:
    """Propagate hooks on ``work``'s message-passing layers that make ``counter`` file the ops of each aggregation,
    forward and backward, under kind ``aggregation``: the forward between propagate's entry and exit, the backward
    in every autograd node the call created (from its output back to its inputs' nodes), entered and left by node
    hooks. Returns the hook handles."""
    def enter(*_):
        counter.agg_depth += 1

    def leave(*_):
        counter.agg_depth -= 1

    def post(module, inputs, out):
        counter.agg_depth -= 1
        if not isinstance(out, torch.Tensor) or out.grad_fn is None:
            return None
        stop = {t.grad_fn for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor) and t.grad_fn is not None}
        seen, todo = set(), [out.grad_fn]
        while todo:
            node = todo.pop()
            if node is None or node in stop or node in seen or type(node).__name__ == "AccumulateGrad":
                continue
            seen.add(node)
            node.register_prehook(enter)
            node.register_hook(leave)
            todo.extend(nxt for nxt, _ in node.next_functions)
        return None

    handles = []
    for m in work.modules():
        if is_message_passing(m):
            handles.append(m.register_propagate_forward_pre_hook(enter))
            handles.append(m.register_propagate_forward_hook(post))
    return handles


# ------------------------------------------------------------------------------------------------ one step


def _one_step(model: nn.Module, x: torch.Tensor, edge_index: torch.Tensor | None = None,
              optimizer: str = "sgd") -> OpCounter:
    work = copy.deepcopy(model)
    work.train()
    params = [p for p in work.parameters() if p.requires_grad]
    opt = training_optimizer(params, lr=0.01, momentum=0.9, weight_decay=5e-4, name=optimizer) if params else None
    # One step first so the momentum buffers exist: the counted step is a steady-state one.
    counter = OpCounter()
    _tag_aggregations(work, counter)
    for counted in (False, True):
        counter.agg_depth = 0
        with counter if counted else contextlib.nullcontext():
            with counter.phase("fwd"):
                out = work(x) if edge_index is None else work(x, edge_index)
                labels = torch.randint(out.shape[1], (out.shape[0], *out.shape[2:]), device=out.device)
                loss = class_cross_entropy(out.float(), labels)  # the training loop's loss (cptsim.models.loss)
            if loss.requires_grad:
                with counter.phase("bwd"):
                    loss.backward()
                if opt is not None:
                    with counter.phase("opt"):
                        opt.step()
                        zero_grad(opt)  # train clears before its next step: the same call, the same launches
    return counter


def _records(c1: OpCounter, c2: OpCounter, b: int) -> list[OpRecord]:
    """Records from counts at batch b (c1) and 2b (c2): each op's bytes split into per-sample and fixed parts."""
    recs = []
    for key in sorted(set(c1.acc) | set(c2.acc), key=lambda k: (OP_PHASES.index(k[1]), k[0], k[2])):
        a1, a2 = c1.acc.get(key, _Acc()), c2.acc.get(key, _Acc())
        split = []
        for v1, v2 in ((a1.read, a2.read), (a1.write, a2.write)):
            per = max(0.0, (v2 - v1) / b)
            split += [per, max(0.0, v1 - b * per)]
        recs.append(OpRecord(op=key[0], phase=key[1], kind=key[2], calls=a1.calls or a2.calls,
                             launches=a1.launches or a2.launches, read_per_sample=split[0], read_fixed=split[1],
                             write_per_sample=split[2], write_fixed=split[3],
                             macs_per_sample=max(0.0, (a2.macs - a1.macs) / b),
                             norm_shapes=[[float(p), float(c), float(k)] for (p, c), k in sorted(a1.shapes.items())]
                             if a1.shapes else None))
    return recs


def _bits(model: nn.Module) -> int:
    p = next(model.parameters(), None)
    return p.element_size() * 8 if p is not None and p.is_floating_point() else 32


def count_step_ops(model: nn.Module, x: torch.Tensor, optimizer: str = "sgd") -> OpProfile:
    """Count every op of a training step (forward, cross-entropy, backward, the optimizer's step) on copies of
    ``model``, at the batch of ``x`` (b) and at 2b, and split each op's bytes into per-sample and fixed parts.

    A graph model (``is_graph_model``) is counted by ``count_graph_step_ops`` at its graph's sizes: N and F from
    ``x`` ([B, N, F] or [N, F]), E from the bound graph (``bound_edges``; else 4 per node)."""
    if is_graph_model(model):
        nodes, features = int(x.shape[-2]), int(x.shape[-1])
        edges = bound_edges(model)
        return count_graph_step_ops(model, features, nodes, 4 * nodes if edges is None else edges, optimizer,
                                    device=x.device)
    b = int(x.shape[0])
    c1 = _one_step(model, x, optimizer=optimizer)
    c2 = _one_step(model, torch.cat([x, x]), optimizer=optimizer)
    return OpProfile(records=_records(c1, c2, b), batch_sizes=[b, 2 * b], element_bits=_bits(model),
                     optimizer=optimizer_label(optimizer))


def count_graph_step_ops(model: nn.Module, features: int, nodes: int, edges: int, optimizer: str = "sgd",
                         device=None, direct: bool | None = None) -> OpProfile:
    """The op list of a graph model's training step on a graph of ``nodes`` nodes of ``features`` features and
    ``edges`` directed edges (one sample: the whole graph), the model called as ``model(x, edge_index)`` on seeded
    random structures (module docstring). ``direct``: None = extrapolated from ``FIT_SIZES``, or run at (N, E) and
    (2N, 2E) when the counts are not affine and the graph has at most ``GRAPH_DIRECT_LIMIT`` nodes + edges (else an
    InputError); True = run at (N, E) and (2N, 2E); False = extrapolated or an InputError."""
    if device is None:
        p = next(model.parameters(), None)
        device = p.device if p is not None else torch.device("cpu")
    bits, label = _bits(model), optimizer_label(optimizer)
    if direct is not True:
        try:
            return OpProfile(records=_fitted_records(model, features, nodes, edges, optimizer, device),
                             batch_sizes=[1], element_bits=bits, optimizer=label)
        except NotAffine as e:
            if direct is False or nodes + edges > GRAPH_DIRECT_LIMIT:
                raise not_affine_error(type(model).__name__, e.what, nodes, edges) from None
    c1, c2 = (_graph_step(model, features, n, e, optimizer, device) for n, e in ((nodes, edges),
                                                                                   (2 * nodes, 2 * edges)))
    return OpProfile(records=_records(c1, c2, 1), batch_sizes=[1, 2], element_bits=bits, optimizer=label)


def _graph_step(model, features, n, e, optimizer, device) -> OpCounter:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=gen).to(device)
    return _one_step(model, x, _random_graph(n, e, device), optimizer)


def _fitted_records(model, features, nodes, edges, optimizer, device) -> list[OpRecord]:
    counts = [_graph_step(model, features, n, e, optimizer, device) for n, e in FIT_SIZES]
    recs = []
    keys = sorted(set().union(*(c.acc for c in counts)), key=lambda k: (OP_PHASES.index(k[1]), k[0], k[2]))
    for key in keys:
        accs = [c.acc.get(key, _Acc()) for c in counts]
        if len({(a.calls, a.launches) for a in accs}) != 1:
            raise NotAffine(f"the number of its {key[0]} calls ({key[1]})")
        parts = []
        for field in ("read", "write", "macs"):
            fit = affine_extrapolate([getattr(a, field) for a in accs], nodes, edges)
            if fit is None:
                raise NotAffine(f"the bytes of its {key[0]} ({key[1]})")
            parts.append((max(0.0, float(fit[0])), max(0.0, float(fit[1]))))
        recs.append(OpRecord(op=key[0], phase=key[1], kind=key[2], calls=accs[0].calls, launches=accs[0].launches,
                             read_per_sample=parts[0][0], read_fixed=parts[0][1], write_per_sample=parts[1][0],
                             write_fixed=parts[1][1], macs_per_sample=parts[2][0]))
    return recs

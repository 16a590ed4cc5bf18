"""Every op of a training step, counted at the dispatcher: bytes read and written and kernel launches per op.

The per-layer MACs (``cptsim.measure.profiler``) cost the GEMMs; a real step also runs batch norm, activations, residual
adds, pooling, the loss, the optimizer's update and (when the model runs fake-quantized) the quantizers' own
passes. On a GPU those memory-bound ops and the per-kernel overhead are a large share of the time. They are
counted here under a ``TorchDispatchMode`` -- the mechanism of ``torch.utils.flop_counter.FlopCounterMode`` -- so
every aten op that executes is seen, whatever module or functional call issued it; nothing is matched by name.

Per op the counter records (rules, not measurements of a GPU):

* ``kind``: ``gemm`` for the ops ``torch.utils.flop_counter`` counts FLOPs for (mm, addmm, bmm, convolution and
  its backward, attention kernels) -- their time comes from the per-layer MACs -- ``memory`` for every other op
  that launches a kernel, ``view`` for ops that only make a view (reshape, transpose, detach, ...) or allocate.
* ``launches``: 1 per call for a kernel op, 0 for a view; ``convolution_backward`` one per gradient it computes;
  a ``_foreach_*`` op (the multi-tensor optimizer) one per 48 tensors, as CUDA's multi_tensor_apply chunks them.
* bytes read = the sizes of its tensor arguments (each tensor once); bytes written = its new outputs plus the
  arguments it mutates. Caches are not modelled: every op reads and writes DRAM.
* ``phase``: ``fwd`` (forward and loss), ``bwd`` (autograd backward), ``opt`` (the optimizer step).

A step is counted at two batch sizes (b and 2b) and each op's bytes split into a part proportional to the batch
(``per_sample``: activations, errors) and a fixed part (weights, gradients, optimizer state), so a profile taken
at batch 2 costs a step of any batch. The step counted is the one ``cptsim train`` runs: the same optimizer
(``training_optimizer``: SGD with momentum and weight decay in its multi-tensor ``foreach`` form, what PyTorch
picks by default on a GPU) and the same clearing of gradients (``zero_grad``: kept allocated and zeroed, so the
backward accumulates into them, one ``add_`` per parameter).
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from cptsim.errors import InputError

__all__ = ["OP_PHASES", "OpRecord", "OpProfile", "OpCounter", "count_step_ops", "training_optimizer", "zero_grad",
           "ZERO_GRAD_SET_TO_NONE"]

OP_PHASES = ("fwd", "bwd", "opt")
KINDS = ("gemm", "memory", "view", "attention")
FOREACH_TENSORS_PER_LAUNCH = 48  # multi_tensor_apply's depth-3/4 chunk (csrc/cuda/MultiTensorApply.cuh: 48 / 36)


# How `cptsim train` clears gradients before each step: zeroed in place, not freed (set_to_none=False), so every
# backward accumulates into them (AccumulateGrad's add_, one per parameter) -- what the counted step must run too.
ZERO_GRAD_SET_TO_NONE = False


def training_optimizer(params, lr: float, momentum: float, weight_decay: float) -> torch.optim.SGD:
    """The optimizer `cptsim train` steps and ``count_step_ops`` counts: SGD in its multi-tensor (``foreach``) form,
    what PyTorch picks by default for CUDA tensors, asked for explicitly so that a step counted on a CPU launches
    what it launches on a GPU, and so that ``zero_grad`` zeroes the gradients with ``_foreach_zero_`` there too."""
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, foreach=True)


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


def is_norm(op: str) -> bool:
    """Batch, layer, group and instance norm ops, forward and backward (their own achieved bandwidth on a GPU:
    statistics reduced per channel or row, then applied)."""
    return re.search(r"(batch|layer|group|instance)_norm", op) is not None


def attention_macs(base: str, tensors: list) -> int:
    """MACs of a fused scaled-dot-product attention kernel (FlashAttention and its kin, forward or backward), by
    ``torch.utils.flop_counter``'s own formulas (flops / 2): the scores and the weighted values -- work no layer's
    MAC count holds, since the fused kernel is not a module. ``tensors``: the op's tensor arguments in order."""
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
        self.acc: dict[tuple[str, str], _Acc] = {}
        self.kinds: dict[str, str] = {}

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
            kind = "memory"
        a = self.acc.setdefault((name, self.current), _Acc())
        self.kinds[name] = kind
        a.calls += 1
        if kind == "view":
            return
        read = sum(_nbytes(t) for t in tensors)
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

    def to_json(self) -> dict:
        d = {"op": self.op, "phase": self.phase, "kind": self.kind, "calls": self.calls,
             "launches": self.launches,
             "read_bytes": {"per_sample": self.read_per_sample, "fixed": self.read_fixed},
             "write_bytes": {"per_sample": self.write_per_sample, "fixed": self.write_fixed}}
        if self.macs_per_sample:
            d["macs_per_sample"] = self.macs_per_sample
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
                   macs_per_sample=_num(r.get("macs_per_sample", 0), f"{where}.macs_per_sample"))


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
        """Per phase: memory-op bytes per sample and fixed, kernel launches (all kinds), GEMM launches, and the
        fused attention kernels' MACs and bytes per sample."""
        s = {p: {"bytes_per_sample": 0.0, "bytes_fixed": 0.0, "launches": 0.0, "gemm_launches": 0.0,
                 "attention_macs_per_sample": 0.0, "attention_bytes_per_sample": 0.0,
                 "norm_bytes_per_sample": 0.0, "conv_norm_bytes_per_sample": 0.0} for p in OP_PHASES}
        for r in self.records:
            d = s[r.phase]
            d["launches"] += r.launches
            if r.kind == "gemm":
                d["gemm_launches"] += r.launches
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
        return s

    def totals(self) -> dict[str, float]:
        s = self.summary()
        return {k: sum(s[p][k] for p in OP_PHASES) for k in ("bytes_per_sample", "bytes_fixed", "launches")}


# ------------------------------------------------------------------------------------------------ one step


def _one_step(model: nn.Module, x: torch.Tensor) -> OpCounter:
    work = copy.deepcopy(model)
    work.train()
    params = [p for p in work.parameters() if p.requires_grad]
    opt = training_optimizer(params, lr=0.01, momentum=0.9, weight_decay=5e-4) if params else None
    # One step first so the momentum buffers exist: the counted step is a steady-state one.
    counter = OpCounter()
    for counted in (False, True):
        with counter if counted else contextlib.nullcontext():
            with counter.phase("fwd"):
                out = work(x)
                labels = torch.randint(out.shape[1], (out.shape[0], *out.shape[2:]), device=out.device)
                loss = nn.functional.cross_entropy(out.float(), labels)
            if loss.requires_grad:
                with counter.phase("bwd"):
                    loss.backward()
                if opt is not None:
                    with counter.phase("opt"):
                        opt.step()
                        zero_grad(opt)  # train clears before its next step: the same call, the same launches
    return counter


def count_step_ops(model: nn.Module, x: torch.Tensor) -> OpProfile:
    """Count every op of a training step (forward, cross-entropy, backward, SGD step) on copies of ``model``,
    at the batch of ``x`` (b) and at 2b, and split each op's bytes into per-sample and fixed parts."""
    b = int(x.shape[0])
    c1 = _one_step(model, x)
    c2 = _one_step(model, torch.cat([x, x]))
    recs = []
    for key in sorted(set(c1.acc) | set(c2.acc), key=lambda k: (OP_PHASES.index(k[1]), k[0])):
        a1, a2 = c1.acc.get(key, _Acc()), c2.acc.get(key, _Acc())
        split = []
        for v1, v2 in ((a1.read, a2.read), (a1.write, a2.write)):
            per = max(0.0, (v2 - v1) / b)
            split += [per, max(0.0, v1 - b * per)]
        kind = c1.kinds.get(key[0]) or c2.kinds[key[0]]
        recs.append(OpRecord(op=key[0], phase=key[1], kind=kind, calls=a1.calls or a2.calls,
                             launches=a1.launches or a2.launches, read_per_sample=split[0], read_fixed=split[1],
                             write_per_sample=split[2], write_fixed=split[3],
                             macs_per_sample=max(0.0, (a2.macs - a1.macs) / b)))
    bits = 32
    p = next(model.parameters(), None)
    if p is not None and p.is_floating_point():
        bits = p.element_size() * 8
    return OpProfile(records=recs, batch_sizes=[b, 2 * b], element_bits=bits)

"""The one cost model that plan, train and report share: BitOPs, bytes, energy and latency of training steps.

Pure, vectorized functions over a profile's per-layer arrays (``cptsim.measure.profiler.ProfileArrays``: L layers x the
three phases fwd / dgrad / wgrad). Nothing here loops over steps: a schedule takes few distinct (q, g) pairs, and
every per-step quantity is a function of (q, g, samples in the step) alone, so a run is costed from its histogram
of (q, g, samples) triples (``np.bincount`` on small integer keys) times the cost of one step of each triple.

What one step of each kind costs: MACs and BitOPs from the formulas every hardware shares
(``cptsim.cost.formulas``: operand widths per phase, BitOPs, bytes moved, quantizer passes), time and energy from
the hardware profile, which prices a whole step of its kind (``HardwareProfile.price_step``: how it stores operands,
AMP's rule for full-precision layers, its GEMMs, graph aggregations, fused attention and the step's other ops). This
module adds up what the profile returns and never asks which kind it holds: a new kind is one module of
``cptsim.cost.hardware``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from cptsim.errors import InputError
from cptsim.measure.profiler import PHASES, LayerProfile, ProfileArrays
from .formulas import (INDEX_BITS, aggregation_bytes, bitops, bytes_moved, fused_attention_share, layer_bits,
                       layer_bitops, packed_bits, phase_operands, quant_elems)
from .runlength import RunLength
from .schedules import FULL_PRECISION, VALID_BITS, Schedule

__all__ = [
    "PHASES",
    "Cost",
    "layer_bits",
    "phase_operands",
    "bitops",
    "layer_bitops",
    "bytes_moved",
    "aggregation_bytes",
    "INDEX_BITS",
    "quant_elems",
    "storage_bits",
    "step_cost",
    "estimate",
    "estimate_totals",
    "relative_to_static",
    "bits_histogram",
    "step_ops_cost",
    "fused_attention_share",
    "StepCosts",
    "step_key",
]

FP = FULL_PRECISION
_KEY = FP + 1  # bits take values 1..32: q * 33 + g is a unique small integer key per (q, g) pair
_NKEYS = _KEY * _KEY
_VALID = np.zeros(FP + 1, dtype=bool)
_VALID[sorted(VALID_BITS)] = True


# ------------------------------------------------------------------------------------------------ storage

def storage_bits(hardware, formats=None) -> Any:
    """The storage (bits -> stored bits, ``cptsim.cost.formulas``) of a hardware profile: its own
    (``HardwareProfile.storage_bits``), or, without one, operands packed at their width.

    ``formats`` (a float family's ``cptsim.numerics.families.FormatMap``; None: integers, as always): an operand
    of width b is its format's, stored at the format's storage bits (scales amortised: MXFP4 4.25, NVFP4 4.5)
    without hardware, and on a GPU view (``GPUProfile.with_formats``) where its tier runs the format natively,
    else at the tier's width; the function's ``.grad`` gives a gradient operand's (``--grad-format``)."""
    if hardware is not None:
        return hardware.storage_bits(formats)
    if formats is None:
        return packed_bits

    def fwd(b):
        return formats.fwd_storage_bits[np.asarray(b).astype(np.int64)]

    def grad(b):
        return formats.grad_storage_bits[np.asarray(b).astype(np.int64)]

    fwd.grad = grad
    return fwd


# ------------------------------------------------------------------------------------------------ input checks


def _arrays(profile) -> ProfileArrays:
    if isinstance(profile, ProfileArrays):
        return profile
    if isinstance(profile, LayerProfile):
        return profile.arrays()
    if isinstance(profile, Mapping):
        return LayerProfile.from_json(profile).arrays()
    raise InputError(f"expected a LayerProfile (or its JSON), got {type(profile).__name__}")


def _hardware(hardware):
    if hardware is None:
        return None
    if isinstance(hardware, str):
        from .hardware import load_profile

        return load_profile(hardware)
    from .hardware import HardwareProfile

    if not isinstance(hardware, HardwareProfile):
        raise InputError(f"hardware must be a profile name, a path or a HardwareProfile, got {hardware!r}")
    return hardware


def _positive_int(v, what: str) -> int:
    if isinstance(v, bool) or v is None:
        raise InputError(f"{what} must be a positive integer, got {v!r}")
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        v = int(v)
    if not isinstance(v, (int, np.integer)) or v < 1:
        raise InputError(f"{what} must be a positive integer, got {v!r}")
    return int(v)


def _check_bits_array(a: np.ndarray, what: str) -> np.ndarray:
    a = np.asarray(a)
    if a.size == 0:
        raise InputError(f"{what}: no steps")
    if np.issubdtype(a.dtype, np.floating):
        if not np.all(np.isfinite(a)) or not np.all(a == np.rint(a)):
            bad = a[~(np.isfinite(a) & (a == np.rint(a)))].flat[0]
            raise InputError(f"{what} must be integer bits 1..16 or 32, got {bad!r}")
        a = a.astype(np.int64)
    elif a.dtype.kind not in "iu":
        raise InputError(f"{what} must be integer bits 1..16 or 32, got values of type {a.dtype}")
    a = a.astype(np.int64, copy=False)
    ok = (a >= 1) & (a <= FP)
    ok[ok] = _VALID[a[ok]]
    if not ok.all():
        raise InputError(f"{what} must be bits 1..16, or 32 for full precision; got {int(a[~ok].flat[0])}")
    return a


# ------------------------------------------------------------------------------------------------ histograms


@dataclass(frozen=True)
class _Hist:
    """K kinds of step: forward bits, gradient bits, samples, and how many steps of each kind."""

    q: np.ndarray
    g: np.ndarray
    samples: np.ndarray
    count: np.ndarray

    @property
    def steps(self) -> int:
        return int(self.count.sum())

    @property
    def total_samples(self) -> int:
        return int((self.count * self.samples).sum())

    def with_q(self, q: int, g: int | None = None) -> "_Hist":
        """The same steps at forward bits ``q`` (and gradient bits ``g``; None: each step's own)."""
        return _Hist(np.full_like(self.q, q), self.g if g is None else np.full_like(self.g, g), self.samples,
                     self.count)


def _pairs(keys: np.ndarray, counts: np.ndarray, samples: int) -> tuple[np.ndarray, ...]:
    nz = np.flatnonzero(counts)
    return nz // _KEY, nz % _KEY, np.full(nz.size, samples, dtype=np.int64), counts[nz]


def bits_histogram(q: np.ndarray, g: np.ndarray, batch_size: int, dataset_size: int | None = None):
    """(q, g, samples, count) arrays of the distinct step kinds of a run with these per-step bits.

    Steps hold ``batch_size`` samples, except, when ``dataset_size`` N is given, the last step of every epoch
    (steps_per_epoch = ceil(N / B)), which holds N - (steps_per_epoch - 1)·B: exactly what a DataLoader with
    drop_last=False feeds the training loop.
    """
    q = np.asarray(q, dtype=np.int64)
    g = np.broadcast_to(np.asarray(g, dtype=np.int64), q.shape)
    keys = q * _KEY + g
    ragged = _ragged_steps(q.size, batch_size, dataset_size)
    return _kinds(np.bincount(keys, minlength=_NKEYS),
                  None if ragged is None else np.bincount(keys[ragged[0]], minlength=_NKEYS),
                  batch_size, None if ragged is None else ragged[1])


def _ragged_steps(steps: int, batch_size: int, dataset_size: int | None) -> tuple[np.ndarray, int] | None:
    """(the steps that are an epoch's short last batch, its samples), or None when every batch is full."""
    run = RunLength(batch_size, dataset_size, steps)
    return None if run.ragged is None else (run.ragged_steps(), run.last_batch)


def _kinds(counts: np.ndarray, ragged: np.ndarray | None, batch_size: int, last: int | None):
    """(q, g, samples, count) from the step counts per (q, g) key (``step_key``) of all steps and of the ragged
    ones (None: every batch is full)."""
    parts = []
    if ragged is not None:
        counts = counts - ragged
        parts.append(_pairs(None, ragged, last))
    parts.insert(0, _pairs(None, counts, batch_size))
    return tuple(np.concatenate(cols) for cols in zip(*parts))


def step_key(q: np.ndarray, g: np.ndarray) -> np.ndarray:
    """The key of step kind (q, g) in per-kind step counts: q * 33 + g (0..1088)."""
    return q * _KEY + g


_step_key = step_key


@functools.lru_cache(maxsize=256)
def _schedule_hist(schedule: Schedule, steps: int, batch_size: int, dataset_size: int | None) -> _Hist:
    # The same arrays as bits_histogram(schedule.bits(steps), schedule.grad_bits(steps), ...), from the schedule's
    # per-position tables instead of its T steps (``Schedule.step_kinds``); cached: the planner and `cptsim cost`
    # cost one schedule on several profiles.
    ragged = _ragged_steps(steps, batch_size, dataset_size)
    counts, at = schedule.step_kinds(steps, _step_key, _NKEYS, None if ragged is None else ragged[0])
    q, g, s, c = _kinds(counts, None if ragged is None else np.bincount(at, minlength=_NKEYS), batch_size,
                        None if ragged is None else ragged[1])
    for a in (q, g, s, c):
        a.setflags(write=False)
    return _Hist(q, g, s, c)


def _trace_columns(trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keys = ("batch_size", "bits", "grad_bits")
    if isinstance(trace, Mapping):
        missing = [k for k in keys if k not in trace]
        if missing:
            raise InputError(f"trace lacks {', '.join(missing)}; a trace needs per-step {', '.join(keys)}")
        cols = [np.asarray(trace[k]) for k in keys]
        n = max(c.size if c.ndim else 1 for c in cols)
        cols = [np.broadcast_to(c, (n,)) if c.ndim == 0 else c.reshape(-1) for c in cols]
        if len({c.size for c in cols}) != 1:
            raise InputError(f"trace columns differ in length: {', '.join(f'{k} {c.size}' for k, c in zip(keys, cols))}")
        return tuple(cols)
    if isinstance(trace, Sequence) and not isinstance(trace, (str, bytes)):
        try:
            return tuple(np.array([row[k] for row in trace]) for k in keys)
        except (KeyError, TypeError):
            raise InputError(f"every trace line must be an object with {', '.join(keys)}") from None
    raise InputError(f"expected a Schedule or a trace (lines with {', '.join(keys)}), got {type(trace).__name__}")


def _trace_hist(trace) -> _Hist:
    b, q, g = _trace_columns(trace)
    q = _check_bits_array(q, "trace bits")
    g = _check_bits_array(g, "trace grad_bits")
    if b.size == 0:
        raise InputError("trace has no steps")
    if np.issubdtype(b.dtype, np.floating) and np.all(b == np.rint(b)):
        b = b.astype(np.int64)
    if b.dtype.kind not in "iu" or b.min() < 1:
        raise InputError("trace batch_size must be positive integers")
    keys = (b.astype(np.int64) * _KEY + q) * _KEY + g
    uniq, counts = np.unique(keys, return_counts=True)
    pair, samples = uniq % _NKEYS, uniq // _NKEYS
    return _Hist(pair // _KEY, pair % _KEY, samples, counts)


# ------------------------------------------------------------------------------------------------ aggregation


@dataclass
class _Totals:
    macs: np.ndarray      # (L, 3)
    bitops: np.ndarray    # (L, 3)
    energy: np.ndarray | None
    latency: np.ndarray | None


def _format_bitops(macs_k, quantized, q, g, fmap):
    """BitOPs with a float family: MACs x the operands' *element* bits (``FormatMap``; the MX / NVFP4 block
    scales' and per-tensor scales' work is not counted -- one scale multiply per 16 or 32 MACs of a block's dot
    product, done in the MMA's FP32 accumulate path -- nor their storage here: memory traffic counts it)."""
    b_w, _, b_g = layer_bits(quantized, q, g)
    e_w = fmap.fwd_element_bits[b_w.astype(np.int64)]
    e_g = fmap.grad_element_bits[b_g.astype(np.int64)]
    e1, e2 = np.stack((e_w, e_g, e_g), axis=-1), np.stack((e_w, e_w, e_w), axis=-1)
    return macs_k * e1 * e2


def _kind_costs(a: ProfileArrays, hw, q: np.ndarray, g: np.ndarray, samples: np.ndarray, fmap=None) -> tuple:
    """ONE step of each of K kinds (q, g, samples): MACs, BitOPs, time and energy per layer and phase (K, L, 3),
    and the step's other ops (time, energy), each (K, 3); the hardware's entries None without a hardware (or, for
    the other ops, where its kind does not price them: ``HardwareProfile.price_step``). Every formula is
    element-wise over the kinds, so a kind's numbers do not depend on the others computed with it."""
    s = samples.astype(np.float64)[:, None, None]
    macs_k = a.macs[None] * s                                          # (K, L, 3)
    b1, b2 = phase_operands(a.quantized, q, g)                         # (K, L, 3)
    bops = macs_k * b1 * b2 if fmap is None else _format_bitops(macs_k, a.quantized, q, g, fmap)
    t = e = xt = xe = None
    if hw is not None:
        t, e, xt, xe = hw.price_step(a, q, g, samples, fmap)
    return macs_k, bops, t, e, xt, xe


class StepCosts:
    """The cost of one step of each kind (q, g, samples) of one layer profile on one hardware (None: BitOPs only),
    per layer and phase (``_kind_costs``): computed once per kind, a batch of new kinds at a time, and looked up by
    every ``estimate`` given this object -- the planner costs a dozen schedules and their baselines on one workload
    and hardware, whose steps are of a few dozen kinds in all. A kind's numbers are the same whichever kinds were
    computed with it (``_kind_costs`` is element-wise over kinds), so a shared StepCosts changes no result."""

    def __init__(self, layer_profile, hardware=None, formats=None):
        self.source = layer_profile
        self.arrays = _arrays(layer_profile)
        self.hardware = _hardware(hardware)
        self.formats = formats   # a float family's FormatMap (cptsim.numerics.families), None for integers
        self.priced = None if self.hardware is None else self.hardware.with_formats(formats)
        self._row: dict[tuple[int, int, int], int] = {}
        self._data: list | None = None

    def rows(self, q: np.ndarray, g: np.ndarray, samples: np.ndarray) -> np.ndarray:
        """Row indices of these kinds (computing the ones not seen before)."""
        kinds = list(zip(q.tolist(), g.tolist(), samples.tolist()))
        new = [k for k in dict.fromkeys(kinds) if k not in self._row]
        if new:
            nq, ng, ns = (np.array(col, dtype=np.int64) for col in zip(*new))
            fresh = _kind_costs(self.arrays, self.priced, nq, ng, ns, self.formats)
            self._data = list(fresh) if self._data is None else \
                [None if d is None else np.concatenate((d, f)) for d, f in zip(self._data, fresh)]
            base = len(self._row)
            self._row.update((k, base + i) for i, k in enumerate(new))
        return np.array([self._row[k] for k in kinds], dtype=np.int64)

    def take(self, q: np.ndarray, g: np.ndarray, samples: np.ndarray) -> tuple:
        """``_kind_costs(arrays, hardware, q, g, samples)``, from the computed kinds."""
        idx = self.rows(q, g, samples)
        return tuple(None if d is None else d[idx] for d in self._data)


def _aggregate(a: ProfileArrays, h: _Hist, hw, costs: StepCosts | None = None) -> _Totals:
    """Sum over step kinds of count x (one step's cost), per layer and phase."""
    c = h.count.astype(np.float64)
    if costs is None:
        macs_k, bops, t, e, xt, xe = _kind_costs(a, hw, h.q, h.g, h.samples)  # integers (StepCosts for formats)
    else:
        macs_k, bops, t, e, xt, xe = costs.take(h.q, h.g, h.samples)
    L = len(a)
    weigh = lambda x: (c @ x.reshape(len(c), -1)).reshape(L, 3)        # noqa: E731
    energy = latency = None
    if hw is not None:
        latency, energy = weigh(t), weigh(e)
        if xt is not None:  # the step's other ops: one more row, summed into the phases, in no layer's row
            latency, energy = np.vstack((latency, c @ xt)), np.vstack((energy, c @ xe))
    return _Totals(weigh(macs_k), weigh(bops), energy, latency)


def _layer_totals(a: ProfileArrays, hw, costs: StepCosts, schedule_or_trace, hist: _Hist, layers, layer_steps,
                  batch_size, dataset_size, step_kinds) -> _Totals:
    """A per-layer plan's totals: layer i's rows from the whole-model aggregate at its own schedule, the extra row
    (the step's other ops, when the hardware prices them) from the global schedule's. Exact because every per-layer
    row of ``_kind_costs`` depends on that layer's bits and the step's alone (the GPU's AMP rule for full-precision
    layers and its op list follow the step's global bits, which a per-layer plan keeps as the trace's ``bits``)."""
    if step_kinds is not None:
        raise ValueError("step_kinds describe one schedule; a per-layer plan is costed from its schedules")
    names = list(a.names)
    unknown = [n for n in layers.layers if n not in names]
    if unknown:
        raise InputError(f"the layer plan names {unknown[0]!r}, which the profile does not have (a plan for "
                         "another model?)")
    tot = _aggregate(a, hist, hw, costs)
    if not layers.layers:
        return tot
    if isinstance(schedule_or_trace, Schedule):
        T = hist.steps
        if schedule_or_trace != layers.base:
            raise ValueError("the layer plan's global schedule is not the schedule costed")
    else:
        if layer_steps is None:
            raise InputError("costing a trace with a layer plan needs the run's planned steps (layer_steps)")
        T = _positive_int(layer_steps, "layer_steps")
        rows = schedule_or_trace
        try:
            step = np.array([r["step"] for r in rows], dtype=np.int64) if not isinstance(rows, Mapping) \
                else np.asarray(rows["step"], dtype=np.int64)
        except (KeyError, TypeError):
            raise InputError("a trace costed with a layer plan needs each line's 'step'") from None
        if step.size and (step.min() < 0 or step.max() >= T):
            raise InputError(f"trace steps run outside 0..{T - 1}, the layer plan's run length")
        b, _, g = _trace_columns(rows)
    parts = [tot.macs, tot.bitops, tot.energy, tot.latency]
    parts = [None if x is None else x.copy() for x in parts]
    for sched, members in layers.groups():
        if isinstance(schedule_or_trace, Schedule):
            h = _schedule_hist(sched, T, batch_size, dataset_size)
        else:
            h = _trace_hist({"batch_size": b, "bits": sched.bits(T)[step], "grad_bits": g})
        sub = _aggregate(a, h, hw, costs)
        rows_i = np.array([names.index(n) for n in members], dtype=np.int64)
        for x, y in zip(parts, (sub.macs, sub.bitops, sub.energy, sub.latency)):
            if x is not None:
                x[rows_i] = y[rows_i]
    return _Totals(*parts)


def step_ops_cost(a: ProfileArrays, hw, q, g, samples):
    """(time s, energy J), each (K, 3) per step kind (q, g, samples) and phase, of everything in a step besides
    the layers' GEMMs -- the memory-bound ops and kernel launches of the profile's op list (``cptsim.measure.opcount``) --
    on hardware whose kind prices them (``HardwareProfile.op_list_cost``: a GPU); None when the kind does not, the
    profile has no op list, or there is no hardware."""
    return None if hw is None else hw.op_list_cost(a, q, g, samples)


def _phase_dict(x: np.ndarray) -> dict[str, float]:
    per = x.sum(axis=0)
    d = {p: float(per[i]) for i, p in enumerate(PHASES)}
    d["total"] = float(per.sum())
    return d


def _row_dict(row: np.ndarray) -> dict[str, float]:
    d = {p: float(row[i]) for i, p in enumerate(PHASES)}
    d["total"] = float(row.sum())
    return d


# ------------------------------------------------------------------------------------------------ results


@dataclass
class Cost:
    """What a run (a schedule over T steps, or an executed trace) costs, by phase and by layer.

    ``bitops`` / ``macs`` / ``energy_j`` / ``latency_s`` are dicts with keys fwd, dgrad, wgrad, total (energy and
    latency are None without a hardware profile). ``baseline`` is the same run at static bits (q_max unless told)
    with the same batches and gradient bits (or fixed ones: a plan's baseline), named by its "label"; ``vs_static``
    the ratios to it (bitops, energy_j, latency_s); ``relative_to_static`` is the BitOPs ratio.
    """

    bitops: dict
    macs: dict
    energy_j: dict | None
    latency_s: dict | None
    per_layer: list = field(default_factory=list)
    steps: int = 0
    samples: int = 0
    relative_to_fp32: float = 0.0
    relative_to_static: float | None = None
    vs_static: dict | None = None
    baseline: dict | None = None
    hardware: str = ""
    hardware_hash: str = ""
    workload: str = ""
    formats: dict | None = None   # a float family's formats and, on a GPU, the tiers they ran on (_formats_ran)

    def to_json(self) -> dict:
        extra = {} if self.formats is None else {"formats": self.formats}
        return {**extra,
            "bitops": self.bitops, "macs": self.macs, "energy_j": self.energy_j, "latency_s": self.latency_s,
            "steps": self.steps, "samples": self.samples, "relative_to_fp32": self.relative_to_fp32,
            "relative_to_static": self.relative_to_static, "vs_static": self.vs_static, "baseline": self.baseline,
            "hardware": self.hardware, "hardware_hash": self.hardware_hash, "workload": self.workload,
            "per_layer": self.per_layer,
        }

    # print(cost) is a table of a few lines (every figure, per layer too, is in to_json())
    def __str__(self) -> str:
        import textwrap

        from cptsim.textfmt import si

        where = f" on {self.hardware}" if self.hardware else " (no hardware: BitOPs and MACs only)"
        lines = textwrap.wrap(f"Cost of {self.workload or 'a run'}{where}: {self.steps:,} steps, "
                              f"{self.samples:,} samples", 80)
        lines.append(f"{'phase':<6}{'BitOPs':>14}{'MACs':>14}{'energy':>14}{'latency':>14}")
        for ph in (*PHASES, "total"):
            lines.append(f"{ph:<6}{si(self.bitops[ph], 'BitOPs'):>14}{si(self.macs[ph], 'MACs'):>14}"
                         f"{si((self.energy_j or {}).get(ph), 'J'):>14}{si((self.latency_s or {}).get(ph), 's'):>14}")
        if self.vs_static and self.baseline:
            label = self.baseline.get("label") or f"static {self.baseline['bits']}"
            ratios = ", ".join(f"{name} {self.vs_static[k]:.3f}x" for k, name in
                               (("bitops", "BitOPs"), ("energy_j", "energy"), ("latency_s", "latency"))
                               if self.vs_static.get(k) is not None)
            lines += textwrap.wrap(f"vs {label}: {ratios}", 80)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"<Cost {self.workload or 'run'}{' on ' + self.hardware if self.hardware else ''}: {self.steps} "
                f"steps, {self.bitops['total']:.4g} BitOPs>")


def _formats_ran(fmap, hw, hist: _Hist, based: _Hist) -> dict:
    """What ``Cost.formats`` holds: the family, the gradient format, the formats each width of the run and of its
    baseline named, and on a GPU the tier each step kind's quantized GEMMs ran on, per phase."""
    out = {**fmap.to_json(), "run": fmap.used(hist.q, hist.g), "baseline": fmap.used(based.q, based.g)}
    if hw is not None:
        kinds = sorted(set(zip(np.concatenate((hist.q, based.q)).tolist(), np.concatenate((hist.g, based.g)).tolist())))
        tiers = hw.step_tiers(kinds)
        if tiers is not None:
            out["tiers"] = tiers
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b else (1.0 if a == b else math.inf)


def _prepare(layer_profile, schedule_or_trace, hardware, steps, batch_size, dataset_size, epochs, static_bits,
             step_costs, step_kinds, formats=None, static_grad_bits=None):
    """``estimate``'s inputs checked: (arrays, hardware, histogram, static bits, workload text, StepCosts holding
    the kinds of the run and of its static baseline)."""
    if step_costs is not None:
        if step_costs.source is not layer_profile or step_costs.hardware is not _hardware(hardware):
            raise ValueError("step_costs belongs to another layer profile or hardware")
        if step_costs.formats is not formats:
            raise ValueError("step_costs was made for other number formats")
        arrays, hw = step_costs.arrays, step_costs.hardware
    else:
        arrays = _arrays(layer_profile)
        hw = _hardware(hardware)
    if isinstance(schedule_or_trace, Schedule):
        sched = schedule_or_trace
        batch_size = _positive_int(batch_size, "batch_size")
        if dataset_size is not None:
            dataset_size = _positive_int(dataset_size, "dataset_size")
        if epochs is not None:
            epochs = _positive_int(epochs, "epochs")
            if dataset_size is None:
                raise InputError("epochs need dataset_size (samples per epoch) to give a number of steps")
            by_epochs = RunLength(batch_size, dataset_size).epoch_steps(epochs)
            if steps is not None and _positive_int(steps, "steps") != by_epochs:
                raise InputError(f"steps={steps} contradicts epochs={epochs} ({by_epochs} steps); give one")
            steps = by_epochs
        if steps is None:
            raise InputError("a schedule needs steps (or epochs and dataset_size) to be costed")
        steps = _positive_int(steps, "steps")
        if step_kinds is None:
            hist = _schedule_hist(sched, steps, batch_size, dataset_size)
        else:
            hist = _Hist(*(np.asarray(a, dtype=np.int64) for a in step_kinds))
            if hist.steps != steps:
                raise ValueError(f"step_kinds hold {hist.steps} steps, not {steps}")
        static = sched.q_max if static_bits is None else static_bits
        workload = sched.to_text()
    else:
        hist = _trace_hist(schedule_or_trace)
        if steps is not None and _positive_int(steps, "steps") != hist.steps:
            raise InputError(f"steps={steps} but the trace has {hist.steps} steps")
        static = int(hist.q.max()) if static_bits is None else static_bits
        workload = "trace"
    static = int(_check_bits_array(np.array([static]), "static bits")[0])
    if static_grad_bits is not None:
        static_grad_bits = int(_check_bits_array(np.array([static_grad_bits]), "static gradient bits")[0])

    costs = step_costs if step_costs is not None else StepCosts(arrays, hw, formats)
    based = hist.with_q(static, static_grad_bits)
    costs.rows(np.concatenate((hist.q, based.q)), np.concatenate((hist.g, based.g)),
               np.concatenate((hist.samples, based.samples)))   # both runs' kinds in one batch
    return arrays, hw, hist, based, (static, static_grad_bits), workload, costs


def baseline_label(bits: int, grad_bits: int | None) -> str:
    """The baseline in words: 'static 8, 8-bit gradients' or 'static 8, the run's gradient bits'."""
    g = "the run's gradient bits" if grad_bits is None else \
        ("FP32 gradients" if grad_bits == FP else f"{grad_bits}-bit gradients")
    return f"static {bits}, {g}"


def estimate(layer_profile, schedule_or_trace, hardware=None, steps: int | None = None,
             batch_size: int | None = None, dataset_size: int | None = None, per_layer: bool = True,
             epochs: int | None = None, static_bits: int | None = None, step_costs: StepCosts | None = None,
             step_kinds: tuple | None = None, layers=None, layer_steps: int | None = None,
             formats=None, static_grad_bits: int | None = None) -> Cost:
    """Cost of a whole run on ``hardware`` (a HardwareProfile, a profile name or path; None: BitOPs only).

    ``schedule_or_trace``: a ``Schedule`` run for ``steps`` steps of ``batch_size`` (or ``epochs`` epochs of
    ``dataset_size`` samples; with ``dataset_size`` the ragged last batch of every epoch is modelled exactly), or a
    trace of executed steps: a list of dicts with "batch_size", "bits", "grad_bits" (trace.jsonl lines), or a dict
    of those three columns as arrays. Latency is the sum of every layer-phase's time (layers run one after
    another), energy the sum of energies. The static baseline runs the same steps at ``static_bits`` (default: the
    schedule's q_max; for a trace, its highest forward bits) and ``static_grad_bits`` (default: each step's own
    gradient bits; a plan's baseline fixes them, ``Cost.baseline`` names which). ``step_costs``: a ``StepCosts``
    of this very ``layer_profile`` and ``hardware`` object, to reuse one-step costs across calls (the numbers are
    the same without it). ``step_kinds``: the schedule's steps by kind, (q, g, samples, count) exactly as
    ``bits_histogram`` gives them for its bits, when the caller has counted them (the planner's fast path); the
    schedule's bits are then not generated.

    ``layers``: a per-layer plan (``cptsim.cost.layerplan.ResolvedLayers``): every layer's rows are those of the
    whole-model estimate at its own schedule, the step's other ops (a GPU's op list) those of the global schedule
    (``_layer_totals``); the baseline stays the whole model at static q_max. For a trace, ``layer_steps`` is the run's
    planned length T (a layer's bits at step t are its schedule's over T steps, t from the trace's "step").

    ``formats``: a float family's ``FormatMap`` (``cptsim.numerics.families.format_map``): every width names a
    format (BitOPs at element bits, bytes at storage bits, a GPU's tier by format: ``GPUProfile.with_formats``);
    the Cost then names the formats that ran (``Cost.formats``). None: integers, today's numbers unchanged.
    """
    arrays, hw, hist, based, (static, static_g), workload, costs = _prepare(
        layer_profile, schedule_or_trace, hardware, steps, batch_size, dataset_size, epochs, static_bits, step_costs,
        step_kinds, formats, static_grad_bits)
    if layers is not None:
        tot = _layer_totals(arrays, hw, costs, schedule_or_trace, hist, layers, layer_steps,
                             batch_size, dataset_size, step_kinds)
        workload = f"{workload}+layers[{layers.rules.to_text()}]"
    else:
        tot = _aggregate(arrays, hist, hw, costs)
    base = _aggregate(arrays, based, hw, costs)
    bitops_d, macs_d = _phase_dict(tot.bitops), _phase_dict(tot.macs)
    energy_d = _phase_dict(tot.energy) if tot.energy is not None else None
    latency_d = _phase_dict(tot.latency) if tot.latency is not None else None
    base_bitops = _phase_dict(base.bitops)
    baseline = {"bits": static, "grad_bits": static_g, "label": baseline_label(static, static_g),
                "bitops": base_bitops,
                "energy_j": _phase_dict(base.energy) if base.energy is not None else None,
                "latency_s": _phase_dict(base.latency) if base.latency is not None else None}
    vs_static = {"bitops": _ratio(bitops_d["total"], base_bitops["total"])}
    if hw is not None:
        vs_static["energy_j"] = _ratio(energy_d["total"], baseline["energy_j"]["total"])
        vs_static["latency_s"] = _ratio(latency_d["total"], baseline["latency_s"]["total"])

    rows = []
    if per_layer:
        for i, name in enumerate(arrays.names):
            row = {"name": name, "quantized": bool(arrays.quantized[i]), "macs": _row_dict(tot.macs[i]),
                   "bitops": _row_dict(tot.bitops[i])}
            if hw is not None:
                row["energy_j"] = _row_dict(tot.energy[i])
                row["latency_s"] = _row_dict(tot.latency[i])
            rows.append(row)
    return Cost(
        bitops=bitops_d, macs=macs_d, energy_j=energy_d, latency_s=latency_d, per_layer=rows,
        steps=hist.steps, samples=hist.total_samples,
        relative_to_fp32=_ratio(bitops_d["total"], macs_d["total"] * FP * FP),
        relative_to_static=vs_static["bitops"], vs_static=vs_static, baseline=baseline,
        hardware=hw.name if hw is not None else "", hardware_hash=hw.content_hash if hw is not None else "",
        workload=workload, formats=None if formats is None else _formats_ran(formats, costs.priced, hist, based),
    )


def estimate_totals(layer_profile, schedule_or_trace, hardware=None, steps: int | None = None,
                    batch_size: int | None = None, dataset_size: int | None = None, epochs: int | None = None,
                    step_costs: StepCosts | None = None, step_kinds: tuple | None = None, layers=None,
                    layer_steps: int | None = None, formats=None) -> dict:
    """{"bitops", "energy_j", "latency_s"}: the totals of ``estimate`` (the very numbers: the same sums), without
    its baseline, per-phase and per-layer parts (energy and latency None without a hardware). Arguments as for
    ``estimate``; the planner re-costs its alternatives with it."""
    arrays, hw, hist, _, _, _, costs = _prepare(layer_profile, schedule_or_trace, hardware, steps, batch_size,
                                                dataset_size, epochs, None, step_costs, step_kinds, formats)
    if layers is not None:
        tot = _layer_totals(arrays, hw, costs, schedule_or_trace, hist, layers, layer_steps,
                             batch_size, dataset_size, step_kinds)
    else:
        tot = _aggregate(arrays, hist, hw, costs)
    return {"bitops": _phase_dict(tot.bitops)["total"],
            "energy_j": _phase_dict(tot.energy)["total"] if tot.energy is not None else None,
            "latency_s": _phase_dict(tot.latency)["total"] if tot.latency is not None else None}


def relative_to_static(layer_profile, schedule_or_trace, hardware=None, **kwargs) -> dict:
    """{"bitops", "energy_j", "latency_s"}: the run's cost over the static-q_max run with the same gradient bits
    and batches (energy and latency only with a hardware profile). Arguments as for ``estimate``."""
    return estimate(layer_profile, schedule_or_trace, hardware, per_layer=False, **kwargs).vs_static


def step_cost(profile_arrays, q: int, g: int, batch: int) -> dict:
    """MACs and BitOPs of ONE step at bits (q, g) with ``batch`` samples, per phase, as exact Python ints --
    what the training loop writes into each trace line. The same ``bitops`` formula as ``estimate``.

    ``profile_arrays``: a per-sample profile (``LayerProfile.arrays()``), or ``MacCounter.step_arrays()`` (the
    measured step, batch included) with ``batch=1``.
    """
    a = _arrays(profile_arrays)
    g = int(_check_bits_array(np.array([g]), "grad_bits")[0])
    batch = _positive_int(batch, "batch")
    macs = np.rint(a.macs).astype(np.int64) * batch
    if np.ndim(q):  # per-layer forward bits (a per-layer plan): one width per layer, in the profile's order
        qv = _check_bits_array(np.asarray(q), "bits")
        if qv.shape != (len(a),):
            raise ValueError(f"per-layer bits: {qv.shape[0]} values for {len(a)} layers")
        bops = layer_bitops(macs, a.quantized, qv, g)
    else:
        q = int(_check_bits_array(np.array([q]), "bits")[0])
        bops = bitops(macs, a.quantized, np.int64(q), np.int64(g)).astype(np.int64)
    m, b = macs.sum(axis=0), bops.sum(axis=0)
    return {"macs": {p: int(m[i]) for i, p in enumerate(PHASES)},
            "bitops": {p: int(b[i]) for i, p in enumerate(PHASES)}}

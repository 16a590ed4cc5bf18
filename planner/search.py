"""Schedule search: the best-scoring precision schedule whose estimated cost fits a budget on a target hardware.

``plan(workload, hardware, budget, space) -> Plan`` (also ``from cptsim.planner import plan``):

1. **Evaluate every candidate fast** (``evaluate``). Cost is separable per step: a step's BitOPs, energy and
   latency depend only on its (q, g) bits and its number of samples (the full batch, or the ragged last batch of
   an epoch). So one table per metric holds the cost of one step for every (q, g) -- built once, with the cost
   model's own pure functions (``cptsim.cost``) and ``HardwareProfile.gemm_cost`` -- and a candidate's cost is
   sum_b (steps at b) x table[b]. The steps at each b come without materialising any candidate's bits: for one
   (schedule name, cycles) the profile f_t is computed once; q_t = rint(q_min + (q_max - q_min) f_t) is a
   non-decreasing function of f_t, so after sorting f once, "steps with q_t <= b" is a prefix, found by binary
   search for every (q_min, q_max, b) at once -- evaluating the very floating-point expression
   ``Schedule.bits`` evaluates, so the counts are exact. Prefix sums of the score weights and of the ragged-batch
   indicator in the same order give each candidate's score and its ragged steps per b. The default space
   (1405 candidates) for resnet20 over 64,000 steps evaluates in well under a second.
2. **Select** (``select``): among candidates whose cost on the budget's metric is <= the budget, the highest
   score (``cptsim.planner.score``), ties to the cheaper. The choice is then re-costed with the one cost model,
   ``cptsim.cost.estimate``: the plan's numbers come from there, and if the fast path and ``estimate`` ever
   disagreed at the budget's edge, ``estimate`` wins and the next candidate is tried. So a plan's estimate is
   always <= its budget.
3. **Record** the static-q_max baseline, the top alternatives by score within budget plus the cheapest candidate
   (each re-costed by ``estimate``), and the Pareto frontier of cost vs score over all candidates.

Budget semantics:

* a relative budget ("65%") is that fraction of the **baseline**: the static schedule at the space's largest
  q_max (after --max-bits) with the space's highest gradient bits, on the budget's metric;
* below the cheapest candidate: ``InputError`` (exit 2) naming the cheapest achievable cost and the schedule that
  achieves it, and -- where the metric does not fall with bits on that hardware -- why;
* at or above the baseline's cost: the plan is static q_max (nothing in the space is more precise, so nothing
  scores higher) and a note says so; ``prefer_cyclic=True`` (``--prefer-cyclic``) plans the best cyclic
  schedule instead. If ``--schedules`` leaves static out, the listed schedules are searched as usual.
* "flat" metrics: energy and latency fall in steps, not smoothly, on most hardware (an H100 runs every width up
  to 8 bits on its int8 tier; a fixed 8-bit array likewise). The plan says, per metric, which forward widths
  cost the same, so that an infeasible latency budget on an H100 reads as what it is: below 8 bits nothing is
  saved, so no schedule in a q_max <= 8 space is cheaper than static 8.

``pilot=K`` replaces the proxy score with evidence (``run_pilot``): the top K candidates by score within budget
train for real for ``pilot_steps`` steps each (their schedule compressed to that run length), the better half by
test accuracy at q_max goes on with twice the steps, and so on until one is left (successive halving). Runs go to
a temporary directory (or ``pilot_dir``), never to the user's runs.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from cptsim.errors import InputError
from cptsim.schedules import FULL_PRECISION, Schedule, cycle_position, profile_fn

from .budget import Budget, format_quantity, parse_budget
from .space import SearchSpace
from .score import score_json, step_fidelity, step_weights

__all__ = ["Workload", "Candidates", "Plan", "plan", "evaluate", "select", "run_pilot", "step_cost_tables",
           "baseline_schedule", "flat_note", "metric_levels", "range_settings", "COST_KEYS", "METRIC_NAMES"]

COST_KEYS = {"bitops": "bitops", "energy": "energy_j", "latency": "latency_s"}
METRIC_NAMES = {"bitops": "BitOPs", "energy": "energy", "latency": "latency"}
_NB = FULL_PRECISION + 1  # tables are indexed by bits 0..32 directly
_LEVELS = 17              # cyclic bits take values 1..16: counts "<= b" for b = 0..16


# ---------------------------------------------------------------------------------------------------- workload


@dataclass
class Workload:
    """What is being trained: model, data, run length, and the measured per-layer profile of its quantized model.

    ``steps`` is the exact number of optimizer steps; ``dataset_size`` (samples per epoch) makes the ragged last
    batch of every epoch part of the cost, exactly as ``cptsim train`` executes it. Build with ``Workload.build``.
    """

    model: str
    dataset: str
    batch_size: int
    steps: int
    profile: Any  # cptsim.profiler.LayerProfile
    input_shape: tuple[int, ...]
    num_classes: int
    dataset_size: int | None = None
    data_dir: str | None = None
    epochs: int | None = None
    fp_layers: list[str] = field(default_factory=list)
    lr: float = 0.1
    lr_schedule: str = "cosine"
    momentum: float = 0.9
    weight_decay: float = 5e-4
    seed: int = 0
    augment: bool = True
    profile_s: float = 0.0

    @classmethod
    def build(cls, model: str = "digits-cnn", dataset: str = "digits", data_dir: str | None = None,
              batch_size: int = 64, epochs: int | None = None, steps: int | None = None,
              dataset_size: int | None = None, fp_layers: list[str] | None = None, lr: float = 0.1,
              lr_schedule: str = "cosine", momentum: float = 0.9, weight_decay: float = 5e-4, seed: int = 0,
              augment: bool = True) -> "Workload":
        """Resolve the workload without loading data (``dataset_info``), and profile one real training step of the
        model quantized as ``cptsim train`` will quantize it (``fp_layers``: None = the model's convention).

        Give ``epochs`` (steps = epochs x ceil(N / B)) or ``steps``; neither means 15 epochs."""
        from cptsim.data import dataset_info
        from cptsim.layers import quantize_model, resolve_fp_layers
        from cptsim.models import create_model
        from cptsim.profiler import profile_model
        from cptsim.train import TrainConfig, validate

        if epochs is not None and steps is not None:
            raise InputError("give --epochs or --steps, not both")
        for flag, v in (("--epochs", epochs), ("--steps", steps), ("--batch-size", batch_size),
                        ("--dataset-size", dataset_size)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise InputError(f"{flag} must be a positive integer, got {v!r}")
        validate(TrainConfig(model=model, dataset=dataset, batch_size=batch_size, lr=lr, lr_schedule=lr_schedule,
                             steps=steps))
        info = dataset_info(dataset, data_dir)
        n = dataset_size if dataset_size is not None else info.train_size
        if steps is None:
            epochs = 15 if epochs is None else epochs
            if n is None:
                raise InputError(f"{dataset}: the epoch size is unknown without loading the data; "
                                 "give --dataset-size N or --steps T")
            steps = epochs * -(-n // batch_size)
        shape = tuple(int(s) for s in info.input_shape)
        t0 = time.perf_counter()
        net = create_model(model, num_classes=info.num_classes, in_channels=shape[0], input_shape=shape)
        resolved = resolve_fp_layers(net, fp_layers)
        quantize_model(net, fp_layers=resolved)
        prof = profile_model(net, shape, batch_size=2, model_name=model)
        return cls(model=model, dataset=info.name, batch_size=batch_size, steps=steps, profile=prof,
                   input_shape=shape, num_classes=info.num_classes, dataset_size=n, data_dir=data_dir,
                   epochs=epochs, fp_layers=list(resolved), lr=lr, lr_schedule=lr_schedule, momentum=momentum,
                   weight_decay=weight_decay, seed=seed, augment=augment, profile_s=time.perf_counter() - t0)

    @property
    def ragged(self) -> tuple[int, int] | None:
        """(steps per epoch, samples in the last batch) when the last batch of an epoch is short, else None."""
        if self.dataset_size is None:
            return None
        spe = -(-self.dataset_size // self.batch_size)
        last = self.dataset_size - (spe - 1) * self.batch_size
        return None if last == self.batch_size else (spe, last)

    def describe(self) -> str:
        ep = ""
        if self.dataset_size:
            ep = f" ({self.steps * self.batch_size / self.dataset_size:.3g} epochs)" if self.epochs is None \
                else f" ({self.epochs} epochs of {self.dataset_size})"
        return f"{self.model} on {self.dataset}, {self.steps} steps x batch {self.batch_size}{ep}"

    def to_json(self) -> dict:
        """The plan's workload section: what TrainConfig.from_plan reads to run exactly this."""
        return {"model": self.model, "dataset": self.dataset, "data_dir": self.data_dir,
                "batch_size": self.batch_size, "steps": self.steps, "epochs": self.epochs,
                "dataset_size": self.dataset_size, "input_shape": list(self.input_shape),
                "num_classes": self.num_classes, "fp_layers": list(self.fp_layers), "lr": self.lr,
                "lr_schedule": self.lr_schedule, "momentum": self.momentum, "weight_decay": self.weight_decay,
                "seed": self.seed, "augment": self.augment}

    def estimate(self, schedule: Schedule, hardware, per_layer: bool = False, static_bits: int | None = None):
        """``cptsim.cost.estimate`` of this workload run with ``schedule``: the one cost model."""
        from cptsim.cost import estimate

        return estimate(self.profile, schedule, hardware, steps=self.steps, batch_size=self.batch_size,
                        dataset_size=self.dataset_size, per_layer=per_layer, static_bits=static_bits)


# ---------------------------------------------------------------------------------------------------- step tables


def step_cost_tables(profile_arrays, hardware, q_values, g_values, samples) -> dict[str, np.ndarray]:
    """Cost of ONE step for every (q, g) in q_values x g_values and each sample count: metric key ("bitops",
    "energy_j", "latency_s") -> array (len(samples), 33, 33) indexed [sample kind, q, g] (NaN elsewhere).

    The same formulas, in the same form, as ``cptsim.cost.estimate`` applies to each kind of step."""
    from cptsim.cost import bytes_moved, phase_operands, quant_elems, storage_bits

    a = profile_arrays
    qq, gg = (x.ravel() for x in np.meshgrid(np.asarray(q_values, dtype=np.int64),
                                              np.asarray(g_values, dtype=np.int64), indexing="ij"))
    K = qq.size
    out = {k: np.full((len(samples), _NB, _NB), np.nan) for k in COST_KEYS.values()}
    store = storage_bits(hardware)
    for i, s in enumerate(samples):
        s_k = np.full(K, int(s), dtype=np.int64)
        macs_k = a.macs[None] * s_k.astype(np.float64)[:, None, None]            # (K, L, 3)
        b1, b2 = phase_operands(a.quantized, qq, gg)
        out["bitops"][i, qq, gg] = (macs_k * b1 * b2).sum(axis=(1, 2))
        nbytes = bytes_moved(a.numel, a.macs, a.quantized, qq, gg, s_k, a.calls, store)
        qe = quant_elems(a.numel, a.macs, a.quantized, qq, gg, s_k, a.calls)
        t, e = hardware.gemm_cost(macs_k, b1, b2, nbytes, qe)
        out["latency_s"][i, qq, gg] = t.sum(axis=(1, 2))
        out["energy_j"][i, qq, gg] = e.sum(axis=(1, 2))
    return out


# ---------------------------------------------------------------------------------------------------- candidates


@dataclass
class Candidates:
    """Every candidate of a space with its fast-path cost (each metric) and score; arrays in ``schedules`` order."""

    schedules: list[Schedule]
    cost: dict[str, np.ndarray]      # "bitops" | "energy_j" | "latency_s" -> (C,)
    score: np.ndarray
    mean_bits: np.ndarray
    workload: Workload
    hardware: Any
    space: SearchSpace
    tables: dict[str, np.ndarray]    # step_cost_tables for (full batch[, ragged batch])
    eval_s: float = 0.0

    def __len__(self) -> int:
        return len(self.schedules)

    def index(self, schedule: Schedule) -> int | None:
        for i, s in enumerate(self.schedules):
            if s == schedule:
                return i
        return None


def _count_le(fs: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """(C, 17): for each row (lo, hi) and b = 0..16, how many sorted positions i have rint(lo + (hi-lo)*fs[i]) <= b.

    rint(lo + d*f) is non-decreasing in f (IEEE +, x and rint are monotone), so those positions are a prefix of
    the sorted ``fs``; all (row, b) prefixes are found together by one vectorized binary search evaluating the
    same floating-point expression as ``Schedule.bits``."""
    T = fs.size
    b = np.arange(_LEVELS)
    out = np.where(b[None, :] >= hi[:, None], T, 0).astype(np.int64)
    rows, levels = np.nonzero((b[None, :] >= lo[:, None]) & (b[None, :] < hi[:, None]))
    if rows.size:
        L, D = lo[rows], hi[rows] - lo[rows]
        left = np.zeros(rows.size, dtype=np.int64)
        right = np.full(rows.size, T, dtype=np.int64)
        while True:
            active = left < right
            if not active.any():
                break
            mid = (left + right) // 2
            ok = np.rint(L + D * fs[np.minimum(mid, T - 1)]) <= levels
            left = np.where(active & ok, mid + 1, left)
            right = np.where(active & ~ok, mid, right)
        out[rows, levels] = left
    return out


def _segments(le_q: np.ndarray, le_g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For one candidate whose q and g both follow the sorted profile: (starts, ends, q, g) of the runs of sorted
    positions where (q, g) is constant."""
    cuts = np.union1d(np.union1d(le_q, le_g), [0])
    starts, ends = cuts[:-1], cuts[1:]
    q = np.searchsorted(le_q, starts, side="right")
    g = np.searchsorted(le_g, starts, side="right")
    return starts, ends, q, g


def evaluate(workload: Workload, hardware, space: SearchSpace | None = None) -> Candidates:
    """Cost (every metric) and score of every candidate of ``space`` by the fast path (module docstring)."""
    from cptsim.hardware import load_profile

    t0 = time.perf_counter()
    hw = load_profile(hardware) if isinstance(hardware, str) else hardware
    space = space or SearchSpace()
    if space.min_bits_auto:
        raise InputError("--min-bits auto must be resolved (run the range test) before candidates are evaluated")
    scheds = space.candidates()
    C, T = len(scheds), workload.steps
    arrays = workload.profile.arrays()
    rag = workload.ragged
    samples = [workload.batch_size] + ([rag[1]] if rag else [])

    g_set = sorted({b for s in scheds for b in range(s.g_min, s.g_max + 1)} |
                   {s.g_max for s in scheds})
    q_set = sorted(set(range(1, 17)) | {s.q_max for s in scheds})
    tables = step_cost_tables(arrays, hw, q_set, g_set, samples)
    phi = step_fidelity(np.arange(_NB)[:, None], np.arange(_NB)[None, :])   # [q, g]

    w = step_weights(T)
    w_total = float(w.sum())
    ragged = np.zeros(T, dtype=np.int64)
    if rag:
        ragged[rag[0] - 1::rag[0]] = 1
    r_total = int(ragged.sum())

    keys = list(COST_KEYS.values())
    cost = {k: np.zeros(C) for k in keys}
    score = np.zeros(C)
    mean_bits = np.zeros(C)

    def add(idx, q, g, n, wsum, r):
        """Add steps to candidates ``idx``: n steps (r of them ragged) at bits (q, g) with score weight wsum;
        the last axis runs over kinds of step and is summed."""
        for k in keys:
            last = tables[k][1, q, g] if rag else 0.0
            cost[k][idx] += ((n - r) * tables[k][0, q, g] + r * last).sum(axis=-1)
        score[idx] += (wsum * phi[q, g]).sum(axis=-1)
        mean_bits[idx] += (n * q).sum(axis=-1)

    groups: dict[tuple[str, int], list[int]] = {}
    for i, s in enumerate(scheds):
        if s.name == "static" or (s.q_min == s.q_max and s.g_min == s.g_max):
            add(i, np.array([s.q_max]), np.array([s.g_max]), np.array([T]), np.array([w_total]),
                np.array([r_total]))  # every step at (q_max, g_max)
        else:
            groups.setdefault((s.name, s.cycles), []).append(i)

    bcol = np.arange(1, _LEVELS)
    positions: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for (name, n_cyc), idx_list in groups.items():
        if n_cyc not in positions:  # shared by every schedule name with this many cycles
            positions[n_cyc] = cycle_position(T, n_cyc)
        k, z = positions[n_cyc]
        f = profile_fn(name)(z, k)
        order = np.argsort(f, kind="stable")
        fs = f[order]
        cum_w = np.concatenate(([0.0], np.cumsum(w[order])))
        cum_r = np.concatenate(([0], np.cumsum(ragged[order])))
        idx = np.array(idx_list)
        lo = np.array([scheds[i].q_min for i in idx_list], dtype=np.int64)
        hi = np.array([scheds[i].q_max for i in idx_list], dtype=np.int64)
        g_lo = np.array([scheds[i].g_min for i in idx_list], dtype=np.int64)
        g_hi = np.array([scheds[i].g_max for i in idx_list], dtype=np.int64)
        le_q = _count_le(fs, lo, hi)                                        # (c, 17)
        static_g = g_lo == g_hi
        if static_g.any():
            le = le_q[static_g]
            n = np.diff(le, axis=1)                                         # steps at b = 1..16
            wsum = np.diff(cum_w[le], axis=1)
            r = np.diff(cum_r[le], axis=1)
            g = g_hi[static_g][:, None]
            add(idx[static_g], np.broadcast_to(bcol, n.shape), g, n, wsum, r)
        if (~static_g).any():
            le_g = _count_le(fs, g_lo[~static_g], g_hi[~static_g])
            for j, ci in enumerate(idx[~static_g]):
                st, en, q, g = _segments(le_q[~static_g][j], le_g[j])
                n = en - st
                add(ci, q, g, n, cum_w[en] - cum_w[st], cum_r[en] - cum_r[st])
    score /= w_total
    mean_bits /= T
    return Candidates(schedules=scheds, cost=cost, score=score, mean_bits=mean_bits, workload=workload,
                      hardware=hw, space=space, tables=tables, eval_s=time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------------------- explanations


def _bits_span(bits: list[int]) -> str:
    return f"{bits[0]}" if len(bits) == 1 else f"{bits[0]}-{bits[-1]}"


def metric_levels(cands: Candidates, metric: str) -> list[tuple[list[int], float, float, str]]:
    """The forward widths the space can use, grouped into levels: for energy and latency, consecutive widths the
    hardware runs at the same rate (the same ``describe_bits``: GPU tier, Bit Fusion bricks, passes; memory
    traffic may still differ a little), for BitOPs every width on its own. [(bits, lowest and highest cost of
    one full-batch step at those bits and the baseline's gradient bits, how the hardware runs them)]."""
    key = COST_KEYS[metric]
    space, hw = cands.space, cands.hardware
    top = baseline_schedule(space)
    lo = max(space.q_min_range[0], space.min_bits or 1)
    table = cands.tables[key][0]
    levels: list[tuple[list[int], float, float, str]] = []
    for q in range(min(lo, top.q_max), top.q_max + 1):
        c = float(table[q, top.g_max])
        how = hw.describe_bits(q, q) if metric != "bitops" else ""
        if levels and ((how and how == levels[-1][3]) or math.isclose(levels[-1][2], c, rel_tol=1e-12)):
            bits, c_lo, c_hi, _ = levels[-1]
            levels[-1] = (bits + [q], min(c_lo, c), max(c_hi, c), how)
        else:
            levels.append(([q], c, c, how))
    return levels


def flat_note(cands: Candidates, metric: str) -> str | None:
    """Why bits below some width save little or nothing on ``metric`` here (None for BitOPs, or when every bit
    changes the rate)."""
    if metric == "bitops":
        return None
    levels = metric_levels(cands, metric)
    hw = cands.hardware
    what = METRIC_NAMES[metric]
    if len(levels) == 1:
        bits, c_lo, c_hi, how = levels[0]
        if math.isclose(c_lo, c_hi, rel_tol=1e-9):
            return (f"on {hw.name}, {what} does not fall with bits: every forward width {_bits_span(bits)} costs the "
                    f"same per step{f' ({how})' if how else ''}, so every schedule in this space costs what static "
                    f"{bits[-1]} costs; lower bits save BitOPs only (budget --metric bitops, or plan for hardware "
                    "with narrow arithmetic such as bitfusion or stripes)")
        return (f"on {hw.name}, every forward width {_bits_span(bits)} runs at the same rate"
                f"{f' ({how})' if how else ''}; only memory traffic shrinks with the bits, so a step at {bits[0]} "
                f"bits still costs {100 * c_lo / c_hi:.0f}% of one at {bits[-1]} in {what}")
    if not any(len(lv[0]) > 1 for lv in levels):
        return None
    parts = ", ".join(f"{_bits_span(b)} bits{f' {how}' if how else ''}" for b, _, _, how in levels)
    lowest = levels[0][0]
    return (f"on {hw.name}, {what} falls in steps, not per bit: forward widths within a step run at the same rate "
            f"({parts}); only steps at <= {lowest[-1]} bits reach the lowest level, so a tight {what} budget forces "
            f"time at {_bits_span(lowest)} bits")


# ---------------------------------------------------------------------------------------------------- the plan


def _dataset_needs_dir(dataset: str) -> str | None:
    """What --data-dir must hold for this dataset (None: it ships with a package, like digits)."""
    from cptsim import data

    spec = getattr(data, "_DATASETS", {}).get(dataset)
    return getattr(spec, "needs_dir", None)


def baseline_schedule(space: SearchSpace) -> Schedule:
    """The static-q_max baseline: the space's largest allowed q_max, at its highest gradient bits."""
    q_max = space.q_max_range[1] if space.max_bits is None else min(space.q_max_range[1], space.max_bits)
    g = max(g_hi for _, g_hi in space.g_bits)
    return Schedule(name="static", q_min=q_max, q_max=q_max, g_min=g, g_max=g, cycles=1)


def _cost_value(cost, metric: str) -> float:
    v = getattr(cost, COST_KEYS[metric])
    return float(v["total"])


def _fmt(metric: str, v: float) -> str:
    return f"{v:.4g} BitOPs" if metric == "bitops" else format_quantity(metric, v)


def _cost_json(cost, base=None) -> dict:
    d = {"bitops": dict(cost.bitops), "energy_j": float(cost.energy_j["total"]),
         "latency_s": float(cost.latency_s["total"]), "macs": dict(cost.macs),
         "per_phase": {"energy_j": dict(cost.energy_j), "latency_s": dict(cost.latency_s)},
         "steps": cost.steps, "samples": cost.samples}
    if base is not None:
        d["vs_baseline"] = {k: (float(getattr(cost, k)["total"]) / float(getattr(base, k)["total"])
                                if float(getattr(base, k)["total"]) else None)
                            for k in COST_KEYS.values()}
    return d


@dataclass
class Plan:
    """The outcome of ``plan``: the chosen schedule and its estimate, the baseline, alternatives, frontier, notes."""

    workload: Workload
    hardware: Any
    budget: Budget
    budget_absolute: float
    space: SearchSpace
    schedule: Schedule
    estimate: Any          # cptsim.cost.Cost of the chosen schedule (per layer)
    baseline_schedule: Schedule
    baseline: Any          # cptsim.cost.Cost of the baseline
    score: float
    alternatives: list[dict]
    frontier: list[dict]
    notes: list[str]
    candidates: Candidates
    chosen_index: int | None
    ranking: str = "proxy"
    pilot: dict | None = None
    range_test: dict | None = None
    timings: dict = field(default_factory=dict)

    @property
    def metric(self) -> str:
        return self.budget.metric

    @property
    def chosen_cost(self) -> float:
        return _cost_value(self.estimate, self.metric)

    @property
    def budget_fraction(self) -> float:
        """Estimated cost on the budget's metric over the budget (<= 1 by construction)."""
        return self.chosen_cost / self.budget_absolute

    def to_json(self) -> dict:
        """The plan.json document (format in planner/planfile.py)."""
        from cptsim import __version__

        from .planfile import PLAN_FORMAT

        hw = self.hardware
        est = _cost_json(self.estimate, self.baseline)
        est.update({"relative_to_static": float(self.estimate.bitops["total"] / self.baseline.bitops["total"]),
                    "score": self.score, "budget_fraction": self.budget_fraction,
                    "mean_bits": float(self.schedule.bits(self.workload.steps).mean()),
                    "per_layer": self.estimate.per_layer})
        base = _cost_json(self.baseline)
        base["schedule"] = self.baseline_schedule.to_text()
        base["score"] = float(self.candidates.score[self.candidates.index(self.baseline_schedule)]) \
            if self.candidates.index(self.baseline_schedule) is not None else None
        return {
            "format": PLAN_FORMAT,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "cptsim_version": __version__,
            "workload": self.workload.to_json(),
            "hardware": {"name": hw.name, "kind": hw.kind, "hash": hw.content_hash, "path": hw.path},
            "budget": self.budget.to_json(),
            "budget_absolute": self.budget_absolute,
            "budget_text": self.budget.describe(),
            "space": self.space.to_json(),
            "candidates": len(self.candidates),
            "score": score_json(),
            "ranking": self.ranking,
            "schedule": self.schedule.to_json() | {"text": self.schedule.to_text()},
            "estimate": est,
            "baseline": base,
            "alternatives": self.alternatives,
            "frontier": {"metric": self.metric, "cost_key": COST_KEYS[self.metric], "points": self.frontier},
            "notes": list(self.notes),
            "pilot": self.pilot,
            "range_test": self.range_test,
            "profile": self.workload.profile.to_json(),
            "timings": dict(self.timings),
        }


def _pareto(cost: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Indices of the candidates no other beats on both cost (lower) and score (higher), by increasing cost."""
    order = np.lexsort((-score, cost))
    keep, best = [], -np.inf
    for i in order:
        if score[i] > best:
            keep.append(int(i))
            best = score[i]
    return np.array(keep, dtype=np.int64)


def _ranked(cands: Candidates, mask: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Candidate indices under ``mask`` by score descending, then cost ascending, then space order."""
    idx = np.flatnonzero(mask)
    order = np.lexsort((idx, cost[idx], -cands.score[idx]))
    return idx[order]


def select(cands: Candidates, budget: Budget | str, *, prefer_cyclic: bool = False, top: int = 10,
           pilot: int = 0, pilot_steps: int | None = None, pilot_dir: str | None = None, device: str = "cpu",
           on_pilot: Callable[[dict], None] | None = None) -> Plan:
    """Pick the plan from evaluated candidates (budget semantics in the module docstring)."""
    t0 = time.perf_counter()
    if isinstance(budget, str):
        budget = parse_budget(budget)
    w, hw, space = cands.workload, cands.hardware, cands.space
    metric = budget.metric
    key = COST_KEYS[metric]
    what = METRIC_NAMES[metric]
    cost = cands.cost[key]
    notes: list[str] = []

    base_sched = baseline_schedule(space)
    base = w.estimate(base_sched, hw)
    base_val = _cost_value(base, metric)
    if base_val <= 0:
        raise InputError(f"{hw.name} reports no {what} for this workload (static {base_sched.q_max} costs 0); "
                         + ("its power is unknown (power_w = 0): " if metric == "energy" else "")
                         + "plan for another --metric or --hw")
    limit = budget.absolute(base_val)
    pct = lambda v: 100.0 * v / base_val  # noqa: E731
    flat = flat_note(cands, metric)

    # The cheapest candidate, as the one cost model counts it (ties: the best score).
    # Costs equal to rounding (a GPU's flat int8 tier) count as ties.
    near = np.flatnonzero(cost <= cost.min() * (1.0 + 1e-12))
    cheapest = int(near[np.lexsort((near, -cands.score[near]))[0]])
    cheap_est = w.estimate(cands.schedules[cheapest], hw)
    cheap_val = _cost_value(cheap_est, metric)

    def infeasible() -> InputError:
        levels = metric_levels(cands, metric)
        lo_bits, lo_cost, hi_bits, hi_cost = levels[0][0], levels[0][1], levels[-1][0], levels[-1][2]
        why = f"; {flat}" if flat else ""
        if not math.isclose(lo_cost, hi_cost, rel_tol=1e-9):
            why += (f"; even a step at {lo_bits[0]} bits costs {100 * lo_cost / hi_cost:.0f}% of one at "
                    f"{hi_bits[-1]} in {what}" + ("" if metric == "bitops" else f" on {hw.name}") +
                    (" (the gradient GEMMs run at the gradient bits and full-precision layers at 32, whatever the "
                     "forward bits)" if metric == "bitops" else
                     " (gradient GEMMs, full-precision layers and memory traffic do not shrink with the forward "
                     "bits)"))
        return InputError(
            f"budget {budget.spec} ({_fmt(metric, limit)}{'' if metric == 'bitops' else f' of {what} on {hw.name}'}) "
            f"is below the cheapest candidate: {cands.schedules[cheapest].to_text()} costs {_fmt(metric, cheap_val)} "
            f"({pct(cheap_val):.1f}% of static {base_sched.q_max}){why}")

    above_static = limit >= base_val
    mask = cost <= limit
    if not mask.any():
        raise infeasible()
    static_first = False
    if above_static:
        notes.append(f"the budget ({_fmt(metric, limit)}) covers the static-{base_sched.q_max} cost "
                     f"({_fmt(metric, base_val)}, {pct(limit):.0f}% of it)")
        if prefer_cyclic:
            cyclic = np.array([s.name != "static" for s in cands.schedules])
            if (mask & cyclic).any():
                mask = mask & cyclic
                notes.append("--prefer-cyclic: planning the best cyclic schedule instead of static q_max")
        elif "static" in space.schedules:
            static_first = True
            notes.append(f"planning static {base_sched.q_max} (the most precise schedule in the space; "
                         "pass --prefer-cyclic for the best cyclic schedule instead)")
        else:
            notes.append("static is not among --schedules, so the listed schedules are ranked as usual")
    ranked = _ranked(cands, mask, cost)
    if static_first:
        bi = cands.index(base_sched)
        if bi is not None:
            ranked = np.concatenate(([bi], ranked[ranked != bi]))

    ranking, pilot_doc = "proxy", None
    if pilot and not static_first:
        if pilot < 2:
            raise InputError(f"--pilot K needs K >= 2 candidates to compare, got {pilot}")
        pool = [int(i) for i in ranked[:pilot]]
        if len(pool) >= 2:
            winner_pos, pilot_doc = run_pilot(cands, pool, pilot_steps, pilot_dir, device, on_pilot)
            ranked = np.concatenate(([pool[winner_pos]], ranked[ranked != pool[winner_pos]]))
            ranking = "pilot"
        else:
            notes.append("--pilot skipped: only one candidate fits the budget")
    elif pilot:
        notes.append("--pilot skipped: the budget covers static q_max, which is planned")

    # Verify with the one cost model; if the fast path was optimistic at the budget's edge, trust estimate.
    chosen = est = None
    for i in ranked:
        e = w.estimate(cands.schedules[int(i)], hw, per_layer=True)
        if _cost_value(e, metric) <= limit:
            chosen, est = int(i), e
            break
        notes.append(f"{cands.schedules[int(i)].to_text()} passed the fast check but cost.estimate puts it "
                     f"above the budget; skipped")
    if chosen is None:
        raise infeasible()
    sched = cands.schedules[chosen]

    # Alternatives: the best by score within budget, the chosen one, and the cheapest candidate overall.
    alt_idx = [chosen] + [int(i) for i in ranked[:top] if int(i) != chosen]
    alt_idx = alt_idx[:max(top, 1)]
    if cheapest not in alt_idx:
        alt_idx.append(cheapest)
    alternatives = []
    for rank, i in enumerate(alt_idx, start=1):
        e = est if i == chosen else cheap_est if i == cheapest else w.estimate(cands.schedules[i], hw)
        v = _cost_value(e, metric)
        role = "chosen" if i == chosen else "cheapest" if i == cheapest and rank > top else "alternative"
        alternatives.append({
            "rank": rank, "role": role, "schedule": cands.schedules[i].to_text(),
            "name": cands.schedules[i].name, "cycles": cands.schedules[i].cycles,
            "q_min": cands.schedules[i].q_min, "q_max": cands.schedules[i].q_max,
            "mean_bits": float(cands.mean_bits[i]), "score": float(cands.score[i]),
            "bitops": float(e.bitops["total"]), "energy_j": float(e.energy_j["total"]),
            "latency_s": float(e.latency_s["total"]), "budget_fraction": v / limit,
            "vs_baseline": v / base_val, "within_budget": bool(v <= limit),
            "cheapest": i == cheapest,
        })

    front = _pareto(cost, cands.score)
    frontier = [{"schedule": cands.schedules[i].to_text(), "cost": float(cost[i]),
                 "vs_baseline": float(cost[i] / base_val), "score": float(cands.score[i]),
                 "within_budget": bool(cost[i] <= limit)} for i in front]

    used = _cost_value(est, metric) / limit
    if not above_static:
        notes.insert(0, f"{sched.to_text()} uses {100 * used:.1f}% of the budget "
                        f"({100 * _cost_value(est, metric) / base_val:.1f}% of static {base_sched.q_max} {what})")
    if flat:
        notes.append(flat)
    if metric == "bitops":  # say where saved BitOPs buy no time or energy on this hardware
        saved = 1.0 - est.bitops["total"] / base.bitops["total"]
        stuck = []
        for m in ("latency", "energy"):
            k = COST_KEYS[m]
            b = float(getattr(base, k)["total"])
            ratio = float(getattr(est, k)["total"]) / b if b else 1.0
            if saved > 0.05 and ratio > 0.98:
                stuck.append((m, ratio))
        if stuck:
            top_bits, _, _, how = metric_levels(cands, stuck[0][0])[-1]
            if sched.q_min in top_bits:
                why = (f"its forward bits {sched.q_min}-{sched.q_max} all run at the rate of "
                       f"{base_sched.q_max} bits here ({how})")
            else:
                why = next((w for w in (flat_note(cands, m) for m, _ in stuck) if w), None)
            notes.append(f"on {hw.name} this plan saves {100 * saved:.0f}% of the BitOPs but only "
                         + " and ".join(f"{100 * (1 - r):.1f}% of the {m}" for m, r in stuck)
                         + (f"; {why}" if why else ""))
    needs = _dataset_needs_dir(w.dataset)
    if needs and not w.data_dir:
        notes.append(f"{w.dataset} is not on disk for this plan: 'cptsim train --plan' reads the data directory "
                     f"from the plan, so plan again with --data-dir pointing at {needs} before training it")
    notes.extend(f"{hw.name}: {n}" for n in hw.notes)
    return Plan(workload=w, hardware=hw, budget=budget, budget_absolute=limit, space=space, schedule=sched,
                estimate=est, baseline_schedule=base_sched, baseline=base, score=float(cands.score[chosen]),
                alternatives=alternatives, frontier=frontier, notes=notes, candidates=cands, chosen_index=chosen,
                ranking=ranking, pilot=pilot_doc,
                timings={"profile_s": w.profile_s, "evaluate_s": cands.eval_s,
                         "select_s": time.perf_counter() - t0})


def plan(workload: Workload, hardware, budget: Budget | str, space: SearchSpace | None = None, *,
         prefer_cyclic: bool = False, top: int = 10, pilot: int = 0, pilot_steps: int | None = None,
         pilot_dir: str | None = None, device: str = "cpu", range_test=None,
         on_pilot: Callable[[dict], None] | None = None) -> Plan:
    """The best-scoring schedule of ``space`` whose estimated cost on ``hardware`` fits ``budget``.

    ``hardware``: a HardwareProfile, name or path; ``budget``: a Budget or its text ("65%", "500kJ").
    ``space`` with ``--min-bits auto`` runs CPT's precision range test first (or give its ``range_test`` result).
    Raises InputError when nothing fits (the message names the cheapest candidate and its cost)."""
    space = space or SearchSpace()
    if isinstance(budget, str):
        budget = parse_budget(budget)
    rt_doc = None
    if space.min_bits_auto or range_test is not None:
        if range_test is None:
            from cptsim.rangetest import run_range_test

            range_test = run_range_test(range_settings(workload, space))
        space = space.with_min_bits(range_test.suggested_q_min) if space.min_bits_auto else space
        rt_doc = range_test.to_json()
    cands = evaluate(workload, hardware, space)
    p = select(cands, budget, prefer_cyclic=prefer_cyclic, top=top, pilot=pilot, pilot_steps=pilot_steps,
               pilot_dir=pilot_dir, device=device, on_pilot=on_pilot)
    if rt_doc is not None:
        p.range_test = rt_doc
        p.notes.append(f"--min-bits auto: the precision range test suggests q_min = {range_test.suggested_q_min} "
                       f"({range_test.reason})")
    return p


def range_settings(workload: Workload, space: SearchSpace, steps_per_stage: int | None = None, device="cpu"):
    """The range test for this workload: forward bits from the space's lowest q_min up to its largest q_max."""
    from cptsim.rangetest import RangeTestSettings

    top = baseline_schedule(space)
    return RangeTestSettings(model=workload.model, dataset=workload.dataset, data_dir=workload.data_dir,
                             batch_size=workload.batch_size, q_start=min(space.q_min_range[0], top.q_max - 1),
                             q_max=top.q_max, g_bits=min(top.g_max, 16), steps_per_stage=steps_per_stage,
                             seed=workload.seed, device=device, augment=workload.augment)



# ---------------------------------------------------------------------------------------------------- pilot


def run_pilot(cands: Candidates, pool: list[int], pilot_steps: int | None, pilot_dir: str | None,
              device: str = "cpu", on_event: Callable[[dict], None] | None = None) -> tuple[int, dict]:
    """Successive halving over real short training runs of the candidates ``pool`` (indices, best proxy first).

    Round r trains every survivor from scratch for s_r steps (s_0 = ``pilot_steps``, default T/8; doubled each
    round, at most T) with the workload's settings and the candidate's schedule laid over those s_r steps, and
    measures test accuracy at q_max (the dataset's test split stands in for a validation split). The better half
    (ties: the better proxy rank) survives; the last one standing wins. Returns (position in pool, record)."""
    from cptsim.train import TrainConfig, train

    w = cands.workload
    steps = max(1, w.steps // 8) if pilot_steps is None else pilot_steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InputError(f"--pilot-steps must be a positive integer, got {pilot_steps!r}")
    steps = min(steps, w.steps)
    if pilot_dir is None:
        root, keep = Path(tempfile.mkdtemp(prefix="cptsim-pilot-")), False
    else:
        root, keep = Path(pilot_dir).expanduser(), True
        if root.exists() and not root.is_dir():
            raise InputError(f"--pilot-dir {root} exists and is not a directory")
        root.mkdir(parents=True, exist_ok=True)
    alive = list(range(len(pool)))
    rounds = []
    try:
        r = 0
        while len(alive) > 1:
            runs = []
            for pos in alive:
                s = cands.schedules[pool[pos]]
                cfg = TrainConfig(model=w.model, dataset=w.dataset, data_dir=w.data_dir, schedule=s.to_text(),
                                  steps=steps, batch_size=w.batch_size, lr=w.lr, momentum=w.momentum,
                                  weight_decay=w.weight_decay, lr_schedule=w.lr_schedule,
                                  fp_layers=list(w.fp_layers), seed=w.seed, device=device, augment=w.augment)
                out = root / f"round{r}-{pos:02d}-{s.name}"
                if on_event:
                    on_event({"event": "start", "round": r, "steps": steps, "schedule": s.to_text()})
                t0 = time.perf_counter()
                run = train(cfg, str(out), progress=False)
                metrics = run.read_metrics().records
                acc = float(metrics[-1]["test_acc"]) if metrics else float("nan")
                rec = {"schedule": s.to_text(), "proxy_rank": pos + 1, "proxy_score": float(cands.score[pool[pos]]),
                       "steps": steps, "test_acc": acc, "eval_bits": s.q_max,
                       "train_loss": float(metrics[-1]["train_loss"]) if metrics else None,
                       "time_s": round(time.perf_counter() - t0, 3),
                       "run_dir": str(out) if keep else None}
                runs.append((pos, rec))
                if on_event:
                    on_event({"event": "done", "round": r, **rec})
            order = sorted(runs, key=lambda pr: (-(pr[1]["test_acc"] if math.isfinite(pr[1]["test_acc"]) else -1),
                                                 pr[0]))
            alive = sorted(pos for pos, _ in order[:math.ceil(len(order) / 2)])
            rounds.append({"round": r, "steps": steps, "runs": [rec for _, rec in runs],
                           "kept": [cands.schedules[pool[p]].to_text() for p in alive]})
            steps = min(steps * 2, w.steps)
            r += 1
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    winner = alive[0]
    doc = {"k": len(pool), "method": "successive halving",
           "measure": "test accuracy at q_max after a short run (the dataset's test split used as validation)",
           "first_steps": rounds[0]["steps"] if rounds else 0, "rounds": rounds,
           "winner": cands.schedules[pool[winner]].to_text(), "dir": str(root) if keep else None}
    return winner, doc

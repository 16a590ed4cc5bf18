"""Candidate evaluation: cost (every metric) and score of every schedule of a search space, fast.

**Every candidate, fast** (``evaluate``). Cost is separable per step: a step's BitOPs, energy and
   latency depend only on its (q, g) bits and its number of samples (the full batch, or the ragged last batch of
   an epoch). So one table per metric holds the cost of one step for every (q, g) -- built once, with the cost
   model's own pure functions (``cptsim.cost``) and ``HardwareProfile.gemm_cost`` -- and a candidate's cost is
   sum_b (steps at b) x table[b]. The steps at each b come without materialising any candidate's bits: for one
   (schedule name, cycles) the profile f_t is computed once; q_t = rint(q_min + (q_max - q_min) f_t) is a
   non-decreasing function of f_t, so after sorting f once, "steps with q_t <= b" is a prefix, found by binary
   search for every (q_min, q_max, b) at once -- evaluating the very floating-point expression
   ``Schedule.bits`` evaluates, so the counts are exact. Prefix sums of the score weights and of the ragged-batch
   indicator in the same order give each candidate's score and its ragged steps per b. The default space
   (1407 candidates) for resnet20 over 64,000 steps evaluates in well under a second.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from cptsim.errors import InputError
from cptsim.schedules import FULL_PRECISION, Schedule, cycle_position, profile_fn

from .score import step_fidelity, step_weights
from .space import SearchSpace
from .workload import Workload

__all__ = ["Candidates", "evaluate", "step_cost_tables", "COST_KEYS", "METRIC_NAMES"]

COST_KEYS = {"bitops": "bitops", "energy": "energy_j", "latency": "latency_s"}
METRIC_NAMES = {"bitops": "BitOPs", "energy": "energy", "latency": "latency"}
_NB = FULL_PRECISION + 1  # tables are indexed by bits 0..32 directly
_LEVELS = 17              # cyclic bits take values 1..16: counts "<= b" for b = 0..16


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

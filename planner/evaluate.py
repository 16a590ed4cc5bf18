"""Candidate evaluation: cost (every metric) and score of every schedule of a search space, fast.

**Every candidate, fast** (``evaluate``). Cost is separable per step: a step's BitOPs, energy and
   latency depend only on its (q, g) bits and its number of samples (the full batch, or the ragged last batch of
   an epoch). So one table per metric holds the cost of one step for every (q, g) -- built once, with the cost
   model's own pure functions (``cptsim.cost``) and ``HardwareProfile.gemm_cost`` -- and a candidate's cost is
   sum_b (steps at b) x table[b]. The steps at each b come without materialising any candidate's bits: a step's
   bits depend only on its position r = (t*n) mod T in its cycle (z = r/T) and, for a -tri schedule, on the parity
   of its cycle. Each piece of a schedule (``Schedule.pieces``) is monotone in r, so its bits are <= b on a prefix
   (rising) or suffix (falling) of r, whose end is one threshold per (shape, q_min, q_max, b) -- the same for
   every cycle count -- given for all of them at once by ``Schedule.thresholds``, exactly (the schedule keeps the
   formula; this module only counts the steps on either side). The steps of each cycle below
   a threshold are counted in closed form (integers), their score weights by the geometric series of
   ``step_weights``, the ragged last batches by a search among the few ragged steps. The default space (1407
   candidates) for resnet20 over 64,000 steps evaluates in ~7 ms, every cycle count 1..64 with cyclic gradient
   bits 6-8 (12,807 candidates) in ~90 ms (benchmarks/bench_planner.py, 2 shared cores). The counts per
   candidate stay at hand (``Candidates.step_kinds``): ``select`` re-costs its dozen schedules from them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from cptsim.errors import InputError
from cptsim.cost.schedules import FULL_PRECISION, Schedule

from .score import ALPHA, TAU0, step_fidelity
from .space import CandidateList, SearchSpace
from .workload import Workload

__all__ = ["Candidates", "evaluate", "step_cost_tables", "COST_KEYS", "METRIC_NAMES"]

COST_KEYS = {"bitops": "bitops", "energy": "energy_j", "latency": "latency_s"}
METRIC_NAMES = {"bitops": "BitOPs", "energy": "energy", "latency": "latency"}
_NB = FULL_PRECISION + 1  # tables are indexed by bits 0..32 directly
_KEY = _NB                # cptsim.cost.step_key(q, g) = q * 33 + g
_LEVELS = 17              # cyclic bits take values 1..16: counts "<= b" for b = 0..16


# ---------------------------------------------------------------------------------------------------- step tables


def step_cost_tables(profile_arrays, hardware, q_values, g_values, samples, step_costs=None) -> dict[str, np.ndarray]:
    """Cost of ONE step for every (q, g) in q_values x g_values and each sample count: metric key ("bitops",
    "energy_j", "latency_s") -> array (len(samples), 33, 33) indexed [sample kind, q, g] (NaN elsewhere).

    The per-layer costs of each kind of step are ``cptsim.cost.estimate``'s own (``cptsim.cost.StepCosts``; give
    ``step_costs`` of this profile and hardware to share them with later estimates), summed over layers and phases."""
    from cptsim.cost.model import StepCosts

    costs = step_costs if step_costs is not None else StepCosts(profile_arrays, hardware)
    qq, gg = (x.ravel() for x in np.meshgrid(np.asarray(q_values, dtype=np.int64),
                                              np.asarray(g_values, dtype=np.int64), indexing="ij"))
    K = qq.size
    out = {k: np.full((len(samples), _NB, _NB), np.nan) for k in COST_KEYS.values()}
    costs.rows(np.tile(qq, len(samples)), np.tile(gg, len(samples)),          # every kind in one batch
               np.repeat(np.asarray(samples, dtype=np.int64), K))
    for i, s in enumerate(samples):
        _, bops, t, e, xt, xe = costs.take(qq, gg, np.full(K, int(s), dtype=np.int64))   # each (K, L, 3)
        out["bitops"][i, qq, gg] = bops.sum(axis=(1, 2))
        out["latency_s"][i, qq, gg] = t.sum(axis=(1, 2))
        out["energy_j"][i, qq, gg] = e.sum(axis=(1, 2))
        if xt is not None:  # a GPU's non-GEMM ops and launches
            out["latency_s"][i, qq, gg] += xt.sum(axis=1)
            out["energy_j"][i, qq, gg] += xe.sum(axis=1)
    return out


# ---------------------------------------------------------------------------------------------------- candidates


@dataclass
class Candidates:
    """Every candidate of a space with its fast-path cost (each metric) and score; arrays in ``schedules`` order."""

    schedules: Sequence[Schedule]    # a list, or the space's CandidateList (each Schedule built when read)
    cost: dict[str, np.ndarray]      # "bitops" | "energy_j" | "latency_s" -> (C,)
    score: np.ndarray
    mean_bits: np.ndarray
    workload: Workload
    hardware: Any
    space: SearchSpace
    tables: dict[str, np.ndarray]    # step_cost_tables for (full batch[, ragged batch])
    eval_s: float = 0.0
    steps_log: list = field(default_factory=list, repr=False)  # (candidates, q, g, steps, ragged steps) blocks
    fields: np.ndarray | None = field(default=None, repr=False)  # (C, 6): q_min, q_max, g_min, g_max, cycles, name
    names: tuple = field(default=(), repr=False)                 # name ids of ``fields``
    _kinds: dict = field(default_factory=dict, repr=False)       # step_kinds counted so far

    def __len__(self) -> int:
        return len(self.schedules)

    def index(self, schedule: Schedule) -> int | None:
        if self.fields is not None and isinstance(schedule, Schedule):
            if schedule.name not in self.names:
                return None
            row = (schedule.q_min, schedule.q_max, schedule.g_min, schedule.g_max, schedule.cycles,
                   self.names.index(schedule.name))
            hit = np.flatnonzero((self.fields == np.array(row, dtype=np.int64)).all(axis=1))
            return int(hit[0]) if hit.size else None
        for i, s in enumerate(self.schedules):
            if s == schedule:
                return i
        return None

    def step_kinds(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Candidate i's steps by kind, (q, g, samples, count), from the fast path's counts: what
        ``cptsim.cost.bits_histogram`` gives for its bits (tests/test_planner_speed.py checks every candidate of
        several spaces), so ``estimate(..., step_kinds=...)`` costs it without generating its bits."""
        i = int(i)
        if i not in self._kinds:
            self.count_step_kinds([i])
        return self._kinds[i]

    def count_step_kinds(self, indices) -> None:
        """Count the step kinds of these candidates (one pass over the fast path's counts for all of them)."""
        from cptsim.cost.model import step_key

        wanted = np.array(sorted({int(i) for i in indices} - set(self._kinds)), dtype=np.int64)
        if not wanted.size:
            return
        NK = _NB * _NB
        slot = np.full(len(self), -1, dtype=np.int64)
        slot[wanted] = np.arange(wanted.size)
        full = np.zeros(wanted.size * NK)
        ragged = np.zeros(wanted.size * NK)
        for idx, q, g, n, r in self.steps_log:
            j = slot[idx]
            rows = np.flatnonzero(j >= 0)
            if rows.size:
                n_, r_ = n[rows], r[rows]
                key = (j[rows][:, None] * NK + step_key(np.broadcast_to(q[rows], n_.shape),
                                                        np.broadcast_to(g[rows], n_.shape))).ravel()
                full += np.bincount(key, weights=(n_ - r_).ravel(), minlength=full.size)  # integer-valued floats
                ragged += np.bincount(key, weights=r_.ravel(), minlength=ragged.size)
        full, ragged = full.astype(np.int64).reshape(-1, NK), ragged.astype(np.int64).reshape(-1, NK)
        rag = self.workload.ragged
        # bits_histogram's form, the nonzero counts of all rows found at once: a candidate's kinds are
        # its full batches' (q, g) in key order, then (with ragged batches) its ragged ones'
        blocks = [(full, self.workload.batch_size)] + ([(ragged, rag[1])] if rag else [])
        found = []
        for counts, samples in blocks:
            r, key = np.nonzero(counts)
            cuts = np.searchsorted(r, np.arange(wanted.size + 1))
            found.append((key // _KEY, key % _KEY, counts[r, key], cuts, samples))
        for j, i in enumerate(wanted.tolist()):
            parts = [(q[c[j]:c[j + 1]], g[c[j]:c[j + 1]], np.full(c[j + 1] - c[j], smp, dtype=np.int64),
                      n[c[j]:c[j + 1]]) for q, g, n, c, smp in found]
            self._kinds[i] = tuple(np.concatenate(cols) for cols in zip(*parts))


class _Steps:
    """Aggregates over the steps of one run of T steps in n cycles, restricted to a class of cycles (all, the even
    or the odd ones): for thresholds R, the steps whose position r = (t*n) mod T is below R -- their number, their
    summed score weight and how many of them are an epoch's ragged last batch. Exact integer counts; the weights
    by the closed form of the geometric series sum_t (1 + ALPHA rho^t), rho = exp(-1 / (T TAU0))."""

    def __init__(self, T: int, n: int, cls: str, ragged_steps: np.ndarray, starts=None, kr=None):
        if starts is None:
            starts = Schedule.cycle_starts(T, n)                         # cycle k is steps starts[k]..starts[k+1]-1
        k = np.arange(n, dtype=np.int64)
        if cls != "all":
            k = k[(k % 2) == (0 if cls == "even" else 1)]
        self.T, self.n = T, n
        self.s = starts[k]
        self.len = starts[k + 1] - starts[k]
        self.o = self.s * n - k * T                                        # r of each cycle's first step, in [0, n)
        self.uniform = bool(np.all(self.o == 0) and np.all(self.len == self.len[0])) if k.size else True
        self.beta = 1.0 / (T * TAU0)
        self.geo = ALPHA / -np.expm1(-self.beta)                          # ALPHA / (1 - rho)
        self.rho_s = np.exp(-self.beta * self.s)
        self.sum_rho_s = float(self.rho_s.sum())
        # the ragged steps of these cycles, by their position r
        if kr is None:
            kr = np.searchsorted(starts, ragged_steps, side="right") - 1   # the cycle of each ragged step
        sel = np.ones(kr.shape, dtype=bool) if cls == "all" else (kr % 2) == (0 if cls == "even" else 1)
        self.rag_r = np.sort(ragged_steps[sel] * n - kr[sel] * T)

    @classmethod
    def of_classes(cls_, T: int, n: int, classes, ragged_steps: np.ndarray) -> dict:
        """{class: _Steps(T, n, class, ragged_steps)} for these classes, with what they share computed once:
        a class's cycles are a slice of all n (even: 0::2, odd: 1::2), so are their starts, lengths, offsets and
        rho^start (the same values, element by element, as the constructor computes for the class alone)."""
        starts = Schedule.cycle_starts(T, n)
        k = np.arange(n, dtype=np.int64)
        s_all = starts[:-1]
        len_all = starts[1:] - starts[:-1]
        o_all = s_all * n - k * T
        beta = 1.0 / (T * TAU0)
        geo = ALPHA / -np.expm1(-beta)
        rho_all = np.exp(-beta * s_all)
        kr = np.searchsorted(starts, ragged_steps, side="right") - 1
        r_all = ragged_steps * n - kr * T
        out = {}
        for c in classes:
            cut = slice(None) if c == "all" else slice(0, None, 2) if c == "even" else slice(1, None, 2)
            st = object.__new__(cls_)
            st.T, st.n, st.beta, st.geo = T, n, beta, geo
            st.s, st.len, st.o, st.rho_s = s_all[cut], len_all[cut], o_all[cut], rho_all[cut]
            st.uniform = bool(np.all(st.o == 0) and np.all(st.len == st.len[0])) if st.s.size else True
            st.sum_rho_s = float(st.rho_s.sum())
            st.rag_r = np.sort(r_all if c == "all" else r_all[(kr % 2) == (0 if c == "even" else 1)])
            out[c] = st
        return out

    def below(self, R: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        R = np.asarray(R, dtype=np.int64)
        rag = np.searchsorted(self.rag_r, R, side="left")
        if self.s.size == 0:
            return np.zeros(R.shape, dtype=np.int64), np.zeros(R.shape), rag
        n = self.n
        if self.uniform:  # every cycle alike: c = ceil(R / n) steps of each
            c = np.clip(-(-R // n), 0, self.len[0])
            cnt = c * self.s.size
            w = cnt + self.geo * -np.expm1(-self.beta * c) * self.sum_rho_s
            return cnt, w, rag
        c = np.clip(-((self.o[None, :] - R[:, None]) // n), 0, self.len[None, :])     # (Q, cycles)
        w = c.sum(axis=1) + self.geo * (-np.expm1(-self.beta * c) * self.rho_s[None, :]).sum(axis=1)
        return c.sum(axis=1), w, rag


class _Groups:
    """``_Steps`` of several (cycle count n, cycle class) groups, evaluated together: ``below(gid, R)`` is
    ``_Steps(T, n[gid], class[gid]).below(R)`` element by element -- the same integer and floating-point operations
    on the same operands, so the same numbers -- with the groups whose cycles are alike (``uniform``) in one
    vectorised expression and the others one group at a time."""

    def __init__(self, T: int, n: np.ndarray, cls: np.ndarray, ragged_steps: np.ndarray):
        names = ("all", "even", "odd")
        pairs = list(zip(np.asarray(n).tolist(), np.asarray(cls).tolist()))
        wanted: dict[int, list] = {}
        for n_, c in pairs:
            wanted.setdefault(n_, []).append(names[c])
        of_n = {n_: _Steps.of_classes(T, n_, cs, ragged_steps) for n_, cs in wanted.items()}
        self.steps = [of_n[n_][names[c]] for n_, c in pairs]
        st = self.steps
        self.beta, self.geo = 1.0 / (T * TAU0), ALPHA / -np.expm1(-1.0 / (T * TAU0))
        self.n = np.asarray(n, dtype=np.int64)
        self.uniform = np.array([s.uniform or s.s.size == 0 for s in st])
        self.len0 = np.array([s.len[0] if s.s.size else 0 for s in st], dtype=np.int64)
        self.count = np.array([s.s.size for s in st], dtype=np.int64)
        self.sum_rho_s = np.array([s.sum_rho_s for s in st])
        # every group's ragged positions in one sorted array: group u's at u * (T + 1) + r
        self.rag_key = np.concatenate([u * (T + 1) + s.rag_r for u, s in enumerate(st)] + [np.zeros(0, np.int64)])
        self.rag_start = np.searchsorted(self.rag_key, np.arange(len(st), dtype=np.int64) * (T + 1))
        self.T = T

    def below(self, gid: np.ndarray, R: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        gid, R = np.asarray(gid, dtype=np.int64), np.asarray(R, dtype=np.int64)
        rag = np.searchsorted(self.rag_key, gid * (self.T + 1) + R, side="left") - self.rag_start[gid]
        c = np.clip(-(-R // self.n[gid]), 0, self.len0[gid])
        cnt = c * self.count[gid]
        w = cnt + self.geo * -np.expm1(-self.beta * c) * self.sum_rho_s[gid]
        odd = np.flatnonzero(~self.uniform[gid])
        if odd.size:  # one group at a time, each distinct R once
            codes, inv = np.unique(gid[odd] * (self.T + 1) + R[odd], return_inverse=True)
            cg, cR = codes // (self.T + 1), codes % (self.T + 1)
            bounds = np.flatnonzero(np.diff(cg)) + 1
            c_all, w_all = np.empty(codes.size, dtype=np.int64), np.empty(codes.size)
            for a, b in zip(np.concatenate(([0], bounds)).tolist(), np.concatenate((bounds, [codes.size])).tolist()):
                c_all[a:b], w_all[a:b], _ = self.steps[int(cg[a])].below(cR[a:b])
            cnt[odd], w[odd] = c_all[inv], w_all[inv]
        return cnt, w, rag


def _cyclic_g_parts(cp, lo, hi, glo, ghi, pf, pdown, gid, groups, thr, T, add, pc) -> None:
    """Add the parts ``cp`` (cyclic gradient bits) to their candidates: within a part, the positions r in [0, T)
    split into segments at the thresholds of q and of g (and at 0 and T); in a segment both bits are constant, and
    its steps are the part's steps below its end minus those below its start."""
    P = cp.size
    nq, ng = hi[cp] - lo[cp], ghi[cp] - glo[cp]
    Lq, Lg = int(nq.max()), int(ng.max())
    down = pdown[cp]
    # the part's thresholds, padded with a value that no segment start counts (rising: st >= pad never holds;
    # falling: st < pad never holds)
    pad = np.where(down, -1, T + 1)[:, None]

    def level_thresholds(l_, n_, L):
        j = np.arange(L)[None, :]
        valid = j < n_[:, None]
        rr, jj = np.nonzero(valid)
        out = np.broadcast_to(pad, (P, L)).copy()
        out[rr, jj] = thr(pf[cp][rr], l_[cp][rr], (l_[cp] + n_)[rr], l_[cp][rr] + jj)
        return out, valid

    Rq, vq = level_thresholds(lo, nq, Lq)
    Rg, vg = level_thresholds(glo, ng, Lg)
    # the segment boundaries of each part: the union of its thresholds, 0 and T, sorted and deduplicated
    B = np.concatenate((np.where(vq, Rq, T), np.where(vg, Rg, T), np.zeros((P, 1), np.int64),
                        np.full((P, 1), T, np.int64)), axis=1)
    B.sort(axis=1)
    new = np.ones(B.shape, dtype=bool)
    new[:, 1:] = B[:, 1:] != B[:, :-1]
    nb = new.sum(axis=1)                                   # boundaries; segments = nb - 1
    U = np.full(B.shape, T, dtype=np.int64)
    rr, cc = np.nonzero(new)
    U[rr, np.cumsum(new, axis=1)[rr, cc] - 1] = B[rr, cc]
    # the parts' steps below every boundary, all at once (element-wise: the same numbers as per segment)
    A = groups.below(np.broadcast_to(gid[cp][:, None], U.shape).ravel(), U.ravel())
    A = [a.reshape(U.shape) for a in A]
    lo_c, glo_c, pc_c = lo[cp], glo[cp], pc[cp]
    for k in np.unique(nb).tolist():
        in_k = nb == k
        for sel in (in_k & ~down, in_k & down):
            if not sel.any():
                continue
            st = U[sel, :k - 1]
            if down[sel][0]:
                q = lo_c[sel][:, None] + (st[:, :, None] < Rq[sel][:, None, :]).sum(axis=2)
                g = glo_c[sel][:, None] + (st[:, :, None] < Rg[sel][:, None, :]).sum(axis=2)
            else:
                q = lo_c[sel][:, None] + (st[:, :, None] >= Rq[sel][:, None, :]).sum(axis=2)
                g = glo_c[sel][:, None] + (st[:, :, None] >= Rg[sel][:, None, :]).sum(axis=2)
            add(pc_c[sel], q, g, *(a[sel, 1:k] - a[sel, :k - 1] for a in A))


def evaluate(workload: Workload, hardware, space: SearchSpace | None = None) -> Candidates:
    """Cost (every metric) and score of every candidate of ``space`` by the fast path (module docstring)."""
    from cptsim.cost.hardware import load_profile

    t0 = time.perf_counter()
    hw = load_profile(hardware) if isinstance(hardware, str) else hardware
    space = space or SearchSpace()
    if space.min_bits_auto:
        raise InputError("--min-bits auto must be resolved (run the range test) before candidates are evaluated")
    space_names, table = space.candidate_table()
    scheds = CandidateList(space_names, table)
    C, T = len(scheds), workload.steps
    shared = workload.step_costs(hw)
    rag = workload.ragged
    samples = [workload.batch_size] + ([rag[1]] if rag else [])

    present = np.unique(table[:, 0])
    names = sorted(space_names[j] for j in present.tolist())          # the names with candidates
    to_id = np.zeros(len(space_names), dtype=np.int64)
    to_id[present] = [names.index(space_names[j]) for j in present.tolist()]
    F = np.concatenate((table[:, 1:], to_id[table[:, :1]]), axis=1)   # q_min, q_max, g_min, g_max, cycles, name id
    c_lo, c_hi, c_glo, c_ghi, c_n, c_name = F.T
    g_set = sorted({b for lo_, hi_ in set(zip(c_glo.tolist(), c_ghi.tolist())) for b in range(lo_, hi_ + 1)})
    q_set = sorted(set(range(1, 17)) | set(c_hi.tolist()))
    tables = step_cost_tables(shared.arrays, hw, q_set, g_set, samples, shared)
    phi = step_fidelity(np.arange(_NB)[:, None], np.arange(_NB)[None, :])   # [q, g]

    beta = 1.0 / (T * TAU0)
    w_total = T + ALPHA / -np.expm1(-beta) * -np.expm1(-beta * T)         # sum of step_weights(T)
    ragged_steps = workload.run_length.ragged_steps()
    r_total = ragged_steps.size

    keys = list(COST_KEYS.values())
    flat = {k: tables[k].reshape(len(samples), _NB * _NB) for k in keys}
    phi_flat = phi.ravel()
    cost = {k: np.zeros(C) for k in keys}
    score = np.zeros(C)
    mean_bits = np.zeros(C)

    def add(idx, q, g, n, wsum, r):
        """Add steps to candidates ``idx``: n steps (r of them ragged) at bits (q, g) with score weight wsum;
        the last axis runs over kinds of step and is summed."""
        at = q * _NB + g                                    # flat [q, g] of the tables (a gather, same values)
        full, ragged = (n - r).astype(np.float64), r.astype(np.float64)   # the casts int * float makes, once
        for k in keys:
            last = flat[k][1].take(at) if rag else 0.0
            cost[k][idx] += (full * flat[k][0].take(at) + ragged * last).sum(axis=-1)
        score[idx] += (wsum * phi_flat.take(at)).sum(axis=-1)
        mean_bits[idx] += (n * q).sum(axis=-1)
        log.append((idx, q, g, n, r))

    log: list = []

    # A candidate's steps split into parts that follow one monotone profile: a -rep schedule's f over all cycles,
    # a -tri schedule's rising f over its odd cycles and its falling d over its even ones. Within a part, bits change
    # only at thresholds of the position r (the same for every cycle count), so steps at each bits come from
    # Schedule.thresholds and _Steps without materialising any candidate's bits.
    shapes: list = []
    cycle_class = {"all": 0, "even": 1, "odd": 2}
    piece_of = []                     # per name: [(shape id, falling?, cycle class code)]
    for nm in names:
        row = []
        for piece in Schedule.pieces(nm):
            if piece.shape not in shapes:
                shapes.append(piece.shape)
            row.append((shapes.index(piece.shape), piece.falling, cycle_class[piece.cycles]))
        piece_of.append(row)
    is_static = np.array([not row for row in piece_of], dtype=bool)[c_name]   # no piece: every step at q_max
    deg = is_static | ((c_lo == c_hi) & (c_glo == c_ghi))      # every step at (q_max, g_max)
    if deg.any():
        d = np.nonzero(deg)[0]
        one = np.ones((d.size, 1), dtype=np.int64)
        add(d, c_hi[d][:, None], c_ghi[d][:, None], T * one, w_total * one, r_total * one)
    # parts: (candidate, shape id, falling?, cycle class)
    pc_l, pf_l, pd_l, pk_l = [], [], [], []
    for j, row in enumerate(piece_of):
        cj = np.nonzero(~deg & (c_name == j))[0]
        for fid, falling, cls in row:
            pc_l.append(cj)
            pf_l.append(np.full(cj.size, fid))
            pd_l.append(np.full(cj.size, falling))
            pk_l.append(np.full(cj.size, cls))
    pc = np.concatenate(pc_l) if pc_l else np.zeros(0, dtype=np.int64)
    if pc.size:
        pf, pdown, pcl = np.concatenate(pf_l), np.concatenate(pd_l), np.concatenate(pk_l)
        lo, hi, glo, ghi, pn = c_lo[pc], c_hi[pc], c_glo[pc], c_ghi[pc], c_n[pc]
        # threshold keys (shape, lo, hi, b) for b in lo..hi-1, of q and of a cyclic g, deduplicated
        b_all = np.arange(_LEVELS)
        key_rows = []
        for l_, h_ in ((lo, hi), (glo, ghi)):
            fl = np.unique((pf * _NB + l_) * _NB + h_)                      # distinct (shape, lo, hi) first
            fl_l, fl_h = fl // _NB % _NB, fl % _NB
            rows, bb = np.nonzero((b_all[None, :] >= fl_l[:, None]) & (b_all[None, :] < fl_h[:, None]))
            key_rows.append(fl[rows] * _NB + bb)
        code = np.unique(np.concatenate(key_rows))                          # sorted by shape id first
        kf, kl, kh, kb = code // _NB**3, code // _NB**2 % _NB, code // _NB % _NB, code % _NB
        R = Schedule.thresholds(T, shapes, kf, kl, kh, kb)

        def thr(f, l_, h_, b):
            return R[np.searchsorted(code, ((f * _NB + l_) * _NB + h_) * _NB + b)]

        # the (cycle count, cycle class) of each part: its steps' aggregates below a threshold come from _Groups
        gcode, gid = np.unique(pn * 3 + pcl, return_inverse=True)
        groups = _Groups(T, gcode // 3, gcode % 3, ragged_steps)
        static_g = glo == ghi
        # static gradient bits: le[p, b] = aggregates of the part's steps with q <= b, b = 0..16
        sp = np.nonzero(static_g)[0]
        if sp.size:
            rows, bb = np.nonzero((b_all[None, :] >= lo[sp, None]) & (b_all[None, :] < hi[sp, None]))
            Rv = thr(pf[sp[rows]], lo[sp[rows]], hi[sp[rows]], bb)
            gsp = gid[sp]
            tot = groups.below(gsp, np.full(sp.size, T, dtype=np.int64))
            agg = groups.below(gsp[rows], Rv)
            hi_mask = b_all[None, :] >= hi[sp, None]
            down_rows = pdown[sp[rows]]
            le = np.zeros((3, sp.size, _LEVELS))
            for a in range(3):
                le[a] = np.where(hi_mask, tot[a][:, None], 0.0)
                le[a, rows, bb] = np.where(down_rows, tot[a][rows] - agg[a], agg[a])
            n_, w_, r_ = (np.diff(x, axis=1) for x in le)                   # at b = 1..16
            add_rows = pc[sp]
            qb = np.broadcast_to(np.arange(1, _LEVELS), n_.shape)
            gb = ghi[sp][:, None]
            # a -tri candidate has two parts (rising, falling): one add each, as fancy += does not accumulate
            for sel in (~pdown[sp], pdown[sp]):
                if sel.any():
                    add(add_rows[sel], qb[sel], gb[sel], n_[sel].round().astype(np.int64), w_[sel],
                        r_[sel].round().astype(np.int64))
        # cyclic gradient bits: segments between the union of q's and g's thresholds (and 0, T), where both bits are
        # constant; parts with the same number of segments together
        cp = np.nonzero(~static_g)[0]
        if cp.size:
            _cyclic_g_parts(cp, lo, hi, glo, ghi, pf, pdown, gid, groups, thr, T, add, pc)
    score /= w_total
    mean_bits /= T
    return Candidates(schedules=scheds, cost=cost, score=score, mean_bits=mean_bits, workload=workload,
                      hardware=hw, space=space, tables=tables, eval_s=time.perf_counter() - t0, steps_log=log,
                      fields=F, names=tuple(names))

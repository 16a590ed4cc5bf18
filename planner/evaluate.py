"""Candidate evaluation: cost (every metric) and score of every schedule of a search space, fast.

**Every candidate, fast** (``evaluate``). Cost is separable per step: a step's BitOPs, energy and
   latency depend only on its (q, g) bits and its number of samples (the full batch, or the ragged last batch of
   an epoch). So one table per metric holds the cost of one step for every (q, g) -- built once, with the cost
   model's own pure functions (``cptsim.cost``) and ``HardwareProfile.gemm_cost`` -- and a candidate's cost is
   sum_b (steps at b) x table[b]. The steps at each b come without materialising any candidate's bits: a step's
   bits depend only on its position r = (t*n) mod T in its cycle (z = r/T) and, for a -tri schedule, on the parity
   of its cycle. Each profile is monotone in r, so q_t = rint(q_min + (q_max - q_min) f(r/T)) <= b holds on a prefix
   (rising f) or suffix (falling d) of r, whose end is one threshold per (profile, q_min, q_max, b) -- the same for
   every cycle count -- found by one vectorised binary search over all of them that evaluates the very
   floating-point expression ``Schedule.bits`` evaluates, so the counts are exact. The steps of each cycle below
   a threshold are counted in closed form (integers), their score weights by the geometric series of
   ``step_weights``, the ragged last batches by a search among the few ragged steps. The default space (1407
   candidates) for resnet20 over 64,000 steps evaluates in ~15 ms.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from cptsim.errors import InputError
from cptsim.schedules import FULL_PRECISION, Schedule

from .score import ALPHA, TAU0, step_fidelity
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
    from cptsim.cost import bytes_moved, phase_operands, quant_elems, step_ops_cost, storage_bits

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
        extra = step_ops_cost(a, hardware, qq, gg, s_k)  # a GPU's non-GEMM ops and launches
        if extra is not None:
            out["latency_s"][i, qq, gg] += extra[0].sum(axis=1)
            out["energy_j"][i, qq, gg] += extra[1].sum(axis=1)
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


def _thresholds(T: int, fns: list, fn_id: np.ndarray, lo: np.ndarray, hi: np.ndarray, b: np.ndarray,
                down: np.ndarray) -> np.ndarray:
    """For each key (profile fns[fn_id], bits lo..hi, level b): the first r in [0, T] at which
    ``rint(lo + (hi - lo) * f(r / T)) <= b`` stops holding (an increasing f) or ``> b`` stops holding (a decreasing
    one). One vectorised binary search over all keys together, evaluating the very floating-point expression
    ``Schedule.bits`` evaluates at r / T (the same float z for the same r), so the thresholds -- and every count
    built on them -- are exact. Keys must be sorted by fn_id (each profile is evaluated on one contiguous slice)."""
    K = fn_id.size
    left = np.zeros(K, dtype=np.int64)
    right = np.full(K, T, dtype=np.int64)
    bounds = np.searchsorted(fn_id, np.arange(len(fns) + 1))
    L, D = lo.astype(np.float64), (hi - lo).astype(np.float64)
    f = np.empty(K)
    while True:
        active = left < right
        if not active.any():
            return left
        mid = (left + right) // 2
        z = mid.astype(np.float64) / T
        for j, fn in enumerate(fns):
            a, e = bounds[j], bounds[j + 1]
            if a < e:
                f[a:e] = fn(z[a:e])
        q = np.rint(L + D * f)
        ok = np.where(down, q > b, q <= b)
        left = np.where(active & ok, mid + 1, left)
        right = np.where(active & ~ok, mid, right)


class _Steps:
    """Aggregates over the steps of one run of T steps in n cycles, restricted to a class of cycles (all, the even
    or the odd ones): for thresholds R, the steps whose position r = (t*n) mod T is below R -- their number, their
    summed score weight and how many of them are an epoch's ragged last batch. Exact integer counts; the weights
    by the closed form of the geometric series sum_t (1 + ALPHA rho^t), rho = exp(-1 / (T TAU0))."""

    def __init__(self, T: int, n: int, cls: str, ragged_steps: np.ndarray):
        starts = -(-np.arange(n + 1, dtype=np.int64) * T // n)         # cycle k is steps starts[k]..starts[k+1]-1
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
        kr = np.searchsorted(starts, ragged_steps, side="right") - 1
        sel = np.isin(kr, k)
        self.rag_r = np.sort(ragged_steps[sel] * n - kr[sel] * T)

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


def evaluate(workload: Workload, hardware, space: SearchSpace | None = None) -> Candidates:
    """Cost (every metric) and score of every candidate of ``space`` by the fast path (module docstring)."""
    from cptsim.hardware import load_profile
    from cptsim.schedules import _REGISTRY

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

    names = sorted({s.name for s in scheds})
    name_id = {nm: j for j, nm in enumerate(names)}
    F = np.array([(s.q_min, s.q_max, s.g_min, s.g_max, s.cycles, name_id[s.name]) for s in scheds],
                 dtype=np.int64).reshape(-1, 6)
    c_lo, c_hi, c_glo, c_ghi, c_n, c_name = F.T
    g_set = sorted({b for lo_, hi_ in set(zip(c_glo.tolist(), c_ghi.tolist())) for b in range(lo_, hi_ + 1)})
    q_set = sorted(set(range(1, 17)) | set(c_hi.tolist()))
    tables = step_cost_tables(arrays, hw, q_set, g_set, samples)
    phi = step_fidelity(np.arange(_NB)[:, None], np.arange(_NB)[None, :])   # [q, g]

    beta = 1.0 / (T * TAU0)
    w_total = T + ALPHA / -np.expm1(-beta) * -np.expm1(-beta * T)         # sum of step_weights(T)
    ragged_steps = np.arange(rag[0] - 1, T, rag[0], dtype=np.int64) if rag else np.zeros(0, dtype=np.int64)
    r_total = ragged_steps.size

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

    # A candidate's steps split into parts that follow one monotone profile: a -rep schedule's f over all cycles,
    # a -tri schedule's rising f over its odd cycles and its falling d over its even ones. Within a part, bits change
    # only at thresholds of the position r (the same for every cycle count), so steps at each bits come from
    # _thresholds and _Steps without materialising any candidate's bits.
    fns: list = []
    falls: list = []
    kinds = [_REGISTRY[nm].kind for nm in names]
    piece_of = []                     # per name: [(fn id, falling?, cycle class code)]; class 0 all, 1 even, 2 odd
    for nm in names:
        e = _REGISTRY[nm]
        pieces = ([] if e.kind == "static" else [(e.up, False, 0)] if e.kind == "repeated" else
                  [(e.up, False, 2), (e.down, True, 1)])
        row = []
        for fn, falling, cls in pieces:
            if fn not in fns:
                fns.append(fn)
                falls.append(falling)
            row.append((fns.index(fn), falling, cls))
        piece_of.append(row)
    is_static = np.array([k == "static" for k in kinds])[c_name]
    deg = is_static | ((c_lo == c_hi) & (c_glo == c_ghi))      # every step at (q_max, g_max)
    if deg.any():
        d = np.nonzero(deg)[0]
        one = np.ones((d.size, 1), dtype=np.int64)
        add(d, c_hi[d][:, None], c_ghi[d][:, None], T * one, w_total * one, r_total * one)
    # parts: (candidate, fn id, falling?, cycle class)
    pc_l, pf_l, pd_l, pk_l = [], [], [], []
    for j, row in enumerate(piece_of):
        cj = np.nonzero(~deg & (c_name == j))[0]
        for fid, falling, cls in row:
            pc_l.append(cj)
            pf_l.append(np.full(cj.size, fid))
            pd_l.append(np.full(cj.size, falling))
            pk_l.append(np.full(cj.size, cls))
    cls_names = ("all", "even", "odd")

    steps_of: dict[tuple[int, str], _Steps] = {}

    def steps(n, cls):
        if (n, cls) not in steps_of:
            steps_of[(n, cls)] = _Steps(T, n, cls, ragged_steps)
        return steps_of[(n, cls)]

    pc = np.concatenate(pc_l) if pc_l else np.zeros(0, dtype=np.int64)
    if pc.size:
        pf, pdown, pcl = np.concatenate(pf_l), np.concatenate(pd_l), np.concatenate(pk_l)
        lo, hi, glo, ghi, pn = c_lo[pc], c_hi[pc], c_glo[pc], c_ghi[pc], c_n[pc]
        # threshold keys (fn, lo, hi, b) for b in lo..hi-1, of q and of a cyclic g, deduplicated
        b_all = np.arange(_LEVELS)
        key_rows = []
        for l_, h_ in ((lo, hi), (glo, ghi)):
            rows, bb = np.nonzero((b_all[None, :] >= l_[:, None]) & (b_all[None, :] < h_[:, None]))
            key_rows.append(((pf[rows] * _NB + l_[rows]) * _NB + h_[rows]) * _NB + bb)
        code = np.unique(np.concatenate(key_rows))                          # sorted by fn id first
        kf, kl, kh, kb = code // _NB**3, code // _NB**2 % _NB, code // _NB % _NB, code % _NB
        R = _thresholds(T, fns, kf, kl, kh, kb, np.array(falls)[kf])

        def thr(f, l_, h_, b):
            return R[np.searchsorted(code, ((f * _NB + l_) * _NB + h_) * _NB + b)]

        static_g = glo == ghi
        # static gradient bits: le[p, b] = aggregates of the part's steps with q <= b, b = 0..16
        sp = np.nonzero(static_g)[0]
        if sp.size:
            le = np.zeros((3, sp.size, _LEVELS))
            rows, bb = np.nonzero((b_all[None, :] >= lo[sp, None]) & (b_all[None, :] < hi[sp, None]))
            Rv = thr(pf[sp[rows]], lo[sp[rows]], hi[sp[rows]], bb)
            gkey = pn[sp] * 3 + pcl[sp]
            ukeys, gid = np.unique(gkey, return_inverse=True)
            gid_rows = gid[rows]
            for u, key in enumerate(ukeys):
                n, cls = int(key // 3), cls_names[int(key % 3)]
                js = np.nonzero(gid == u)[0]
                st = steps(n, cls)
                tot = st.below(np.array([T]))
                hi_mask = b_all[None, :] >= hi[sp[js], None]
                for a in range(3):
                    le[a, js] = np.where(hi_mask, tot[a][0], 0.0)
                m = gid_rows == u
                if m.any():
                    agg = st.below(Rv[m])
                    down_rows = pdown[sp[rows[m]]]
                    for a in range(3):
                        le[a, rows[m], bb[m]] = np.where(down_rows, tot[a][0] - agg[a], agg[a])
            n_, w_, r_ = (np.diff(x, axis=1) for x in le)                   # at b = 1..16
            add_rows = pc[sp]
            qb = np.broadcast_to(np.arange(1, _LEVELS), n_.shape)
            gb = ghi[sp][:, None]
            # several parts of one candidate: accumulate per part (np.add.at semantics via a loop over parts kinds)
            for sel in (~pdown[sp], pdown[sp]):
                if sel.any():
                    add(add_rows[sel], qb[sel], gb[sel], n_[sel].round().astype(np.int64), w_[sel],
                        r_[sel].round().astype(np.int64))
        # cyclic gradient bits: segments between the union of q's and g's thresholds, one part at a time
        for p in np.nonzero(~static_g)[0]:
            Rq = thr(np.full(hi[p] - lo[p], pf[p]), lo[p], hi[p], np.arange(lo[p], hi[p]))
            Rg = thr(np.full(ghi[p] - glo[p], pf[p]), glo[p], ghi[p], np.arange(glo[p], ghi[p]))
            B = np.union1d(np.concatenate((Rq, Rg)), [0, T])
            st, en = B[:-1], B[1:]
            if pdown[p]:
                q = lo[p] + (st[:, None] < Rq[None, :]).sum(axis=1)
                g = glo[p] + (st[:, None] < Rg[None, :]).sum(axis=1)
            else:
                q = lo[p] + (st[:, None] >= Rq[None, :]).sum(axis=1)
                g = glo[p] + (st[:, None] >= Rg[None, :]).sum(axis=1)
            S = steps(int(pn[p]), cls_names[pcl[p]])
            a_en, a_st = S.below(en), S.below(st)
            add(pc[p], q, g, a_en[0] - a_st[0], a_en[1] - a_st[1], a_en[2] - a_st[2])
    score /= w_total
    mean_bits /= T
    return Candidates(schedules=scheds, cost=cost, score=score, mean_bits=mean_bits, workload=workload,
                      hardware=hw, space=space, tables=tables, eval_s=time.perf_counter() - t0)

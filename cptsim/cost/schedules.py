"""Precision schedules: how many bits each training step uses.

A schedule maps a step t of a run of T steps to forward bits q_t (weights and activations) and gradient
bits g_t (the error in backward). The eleven schedules are CPT's cosine schedule (Fu et al., ICLR 2021,
arXiv 2101.09868), the ten-schedule suite of Wolfe & Kyrillidis (arXiv 2403.02243) and the static baseline.

Definitions (DESIGN.md, "Schedules")::

    n cycles, cycle length L = T/n (real), cycle index k = floor(t/L), position z = (t mod L)/L in [0, 1)
    q_t = rint(q_min + (q_max - q_min) * f(z))          numpy rint: round half to even

    increasing f           cos ½(1−cos πz)   lin z     exp 1−e^(−4z)   rex 1−(1−z)/(0.1+0.9(1−z))
    decreasing d           cos ½(1+cos πz)   lin 1−z
                           exp vertical e^(−4z),               horizontal 1−e^(−4(1−z))
                           rex vertical (1−z)/(0.1+0.9(1−z)),  horizontal 1−z/(0.1+0.9z)

    NAME-rep  f in every cycle (cos-rep = the original CPT schedule, alias `cpt`); starts at q_min
    NAME-tri  d in even cycles (k = 0, 2, ...), f in odd ones; starts at q_max
    static    q_max at every step

Position in the cycle is computed in exact integer arithmetic: t/L = t·n/T, so
k = (t·n) // T and z = ((t·n) mod T) / T. The only rounding is that one final division, so every cycle
boundary gives exactly z = 0 in the right cycle and z stays in [0, 1). Floating-point L does not: for
T=20, n=6 (L=3.33...), t=10 starts cycle 3, yet fmod(10, L)/L = 0.9999999999999999 while floor(10/L) = 3,
i.e. q_max where q_min belongs.

Gradient bits are static by default (g_min == g_max, 8 as in both papers). A gradient range g_min < g_max
follows the same profile and cycles as the forward bits.

Bits: 1..16 quantize; 32 means full precision (no quantization). Cyclic bounds must lie in 1..16; only a
static precision (forward `static`, or a constant gradient precision) may be 32.

Compact text form (``parse_schedule`` / ``Schedule.to_text``)::

    NAME[:QMIN-QMAX|:Q][:gG|:gGMIN-GMAX][:nCYCLES]

    cos-rep:3-8:g8:n32      cosine repeated, forward 3..8, gradient 8, 32 cycles
    cpt:3-8                 alias of cos-rep; gradient 8 and 32 cycles by default
    rex-tri-h:4-8:g6-8:n8   gradient bits cycle 6..8 with the same profile
    static:8   static:32    constant forward precision (32 = full precision)

Parts after NAME are told apart by their first character (a digit, `g` or `n`), so their order is free,
but each may appear once. Omitted parts default to 3-8, g8, n32 (static: 8). A single `:Q` on a cyclic
schedule means q_min = q_max = Q. For `static` a range is an error and `:nCYCLES` is accepted and ignored
(a static schedule has no cycles; it is stored as cycles=1).
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from cptsim.errors import InputError

__all__ = [
    "ALIASES",
    "Piece",
    "SCHEDULE_NAMES",
    "TEXT_FORM",
    "VALID_BITS",
    "FULL_PRECISION",
    "Schedule",
    "aliasing",
    "canonical_name",
    "cycle_position",
    "cpt_relative_cost",
    "describe",
    "list_schedules",
    "make_schedule",
    "parse_schedule",
    "profile_fn",
]

FULL_PRECISION = 32
VALID_BITS: frozenset = frozenset(range(1, 17)) | {FULL_PRECISION}
_CYCLIC_BITS = range(1, 17)

TEXT_FORM = "NAME[:QMIN-QMAX|:Q][:gG|:gGMIN-GMAX][:nCYCLES]"
_TEXT_EXAMPLE = "e.g. cos-rep:3-8:g8:n32"

DEFAULT_Q_MIN = 3
DEFAULT_Q_MAX = 8
DEFAULT_G_BITS = 8
DEFAULT_CYCLES = 32

# ---------------------------------------------------------------------------------------------- profiles
# Each maps z in [0, 1) (ndarray) to the fraction of the range (q_max - q_min) to add to q_min.


def _cos_up(z):
    return 0.5 * (1.0 - np.cos(np.pi * z))


def _cos_down(z):
    return 0.5 * (1.0 + np.cos(np.pi * z))


def _lin_up(z):
    return z


def _lin_down(z):
    return 1.0 - z


def _exp_up(z):
    return 1.0 - np.exp(-4.0 * z)


def _exp_down_v(z):
    return np.exp(-4.0 * z)


def _exp_down_h(z):
    return 1.0 - np.exp(-4.0 * (1.0 - z))


def _rex_up(z):
    # 0.9, not the REX learning-rate paper's 1/2: the constant Wolfe & Kyrillidis use for precision.
    return 1.0 - (1.0 - z) / (0.1 + 0.9 * (1.0 - z))


def _rex_down_v(z):
    return (1.0 - z) / (0.1 + 0.9 * (1.0 - z))


def _rex_down_h(z):
    return 1.0 - z / (0.1 + 0.9 * z)


# The monotone shapes by name: (function of z, falling?). A schedule's bits follow one shape per class of cycles
# (``Schedule.pieces``), so a count of its steps below a width needs one threshold per shape (``Schedule.thresholds``).
_SHAPES: dict[str, tuple[Callable, bool]] = {
    "cos-up": (_cos_up, False), "cos-down": (_cos_down, True),
    "lin-up": (_lin_up, False), "lin-down": (_lin_down, True),
    "exp-up": (_exp_up, False), "exp-down-v": (_exp_down_v, True), "exp-down-h": (_exp_down_h, True),
    "rex-up": (_rex_up, False), "rex-down-v": (_rex_down_v, True), "rex-down-h": (_rex_down_h, True),
}


@dataclass(frozen=True)
class _Entry:
    kind: str  # "static" | "repeated" | "triangular"
    profile: str  # "constant" | "cos" | "lin" | "exp" | "rex"
    up: str | None  # a key of _SHAPES
    down: str | None  # triangular only
    description: str
    reference: str


@dataclass(frozen=True)
class Piece:
    """One monotone part of a schedule: its bits follow ``shape`` (a name ``Schedule.thresholds`` takes) over the
    cycles of one class, ``"all"``, ``"even"`` (k = 0, 2, ...) or ``"odd"``; ``falling``: the bits never rise with the
    position in the cycle (else they never fall)."""

    shape: str
    falling: bool
    cycles: str


_CPT = "Fu et al., CPT, ICLR 2021 (arXiv 2101.09868)"
_WK = "Wolfe & Kyrillidis 2024 (arXiv 2403.02243)"

_REGISTRY: dict[str, _Entry] = {
    "static": _Entry("static", "constant", None, None, "q_max at every step: the static-precision baseline", _CPT),
    "cos-rep": _Entry("repeated", "cos", "cos-up", None,
                      "half-cosine rise q_min→q_max, restarting every cycle (the original CPT schedule)", _CPT),
    "lin-rep": _Entry("repeated", "lin", "lin-up", None, "linear rise q_min→q_max, restarting every cycle", _WK),
    "exp-rep": _Entry("repeated", "exp", "exp-up", None,
                      "exponential rise 1−e^(−4z): reaches high precision early in each cycle (dearest)", _WK),
    "rex-rep": _Entry("repeated", "rex", "rex-up", None,
                      "REX rise: stays low most of the cycle, climbs to q_max at its end (cheapest)", _WK),
    "cos-tri": _Entry("triangular", "cos", "cos-up", "cos-down",
                      "half-cosine fall then rise in alternating cycles; starts at q_max", _WK),
    "lin-tri": _Entry("triangular", "lin", "lin-up", "lin-down",
                      "linear fall then rise in alternating cycles; starts at q_max", _WK),
    "exp-tri-v": _Entry("triangular", "exp", "exp-up", "exp-down-v",
                        "exponential; falling half is the vertical flip e^(−4z): drops fast", _WK),
    "exp-tri-h": _Entry("triangular", "exp", "exp-up", "exp-down-h",
                        "exponential; falling half is the horizontal flip 1−e^(−4(1−z)): stays high, drops late", _WK),
    "rex-tri-v": _Entry("triangular", "rex", "rex-up", "rex-down-v",
                        "REX; falling half is the vertical flip: stays high, drops late", _WK),
    "rex-tri-h": _Entry("triangular", "rex", "rex-up", "rex-down-h",
                        "REX; falling half is the horizontal flip: drops fast, stays low", _WK),
}

SCHEDULE_NAMES: tuple[str, ...] = tuple(_REGISTRY)
ALIASES: dict[str, str] = {"cpt": "cos-rep"}


def _valid_names_text() -> str:
    alias_of = {v: k for k, v in ALIASES.items()}
    return ", ".join(f"{n} (alias {alias_of[n]})" if n in alias_of else n for n in SCHEDULE_NAMES)


def canonical_name(name: Any) -> str:
    """The canonical schedule name for `name` (aliases resolved, case-insensitive); InputError if unknown."""
    if not isinstance(name, str):
        raise InputError(f"schedule name must be a string, got {name!r}; valid: {_valid_names_text()}")
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in _REGISTRY:
        raise InputError(f"unknown schedule {name!r}; valid: {_valid_names_text()}")
    return key


def profile_fn(name: str) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The schedule's shape as ``frac(z, k)``: the fraction of (q_max − q_min) added to q_min at cycle
    position z in [0, 1) of cycle k. Vectorized over numpy arrays. `static` returns all ones (q_max)."""
    entry = _REGISTRY[canonical_name(name)]
    if entry.kind == "static":
        return lambda z, k: np.ones_like(np.asarray(z, dtype=np.float64))
    if entry.kind == "repeated":
        up = _SHAPES[entry.up][0]
        return lambda z, k: up(np.asarray(z, dtype=np.float64))
    up, down = _SHAPES[entry.up][0], _SHAPES[entry.down][0]

    def tri(z, k):
        z = np.asarray(z, dtype=np.float64)
        return np.where(np.asarray(k) % 2 == 0, down(z), up(z))

    return tri


def cycle_position(total_steps: int, cycles: int) -> tuple[np.ndarray, np.ndarray]:
    """(k, z) for every step t in range(total_steps): cycle index (int64) and position in [0, 1) (float64).

    Exact integer arithmetic: t/L = t·n/T, so k = (t·n) // T and z = ((t·n) mod T) / T. Cycle j starts at step
    ceil(j·T/n), so k is a run-length expansion of the n cycle lengths and the remainder is t·n − k·T: no
    per-step division (numpy's int64 divmod made this ~3 ms of a 100k-step schedule; the planner calls it a lot).
    """
    T = _check_steps(total_steps)
    n = _check_cycles(cycles)
    k, r = _cycle_index(T, n)
    return k, r.astype(np.float64) / T


def _cycle_starts(T: int, n: int) -> np.ndarray:
    """ceil(j·T/n) for j = 0..n, int64: cycle j is steps starts[j]..starts[j+1]-1."""
    return -(-np.arange(n + 1, dtype=np.int64) * T // n)


def _level(lo, span, frac):
    """The bits at fraction ``frac`` of the range: rint(lo + span·frac), numpy's round half to even. The one
    expression every bit of every schedule comes from (``Schedule.bits`` and ``Schedule.thresholds`` alike)."""
    return np.rint(lo + span * frac)


def _cycle_index(T: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(k, r) per step, both int64: cycle index and r = t·n − k·T = (t·n) mod T, so z = r / T."""
    starts = _cycle_starts(T, n)
    k = np.repeat(np.arange(n, dtype=np.int64), np.diff(starts))
    r = np.arange(T, dtype=np.int64) * n - k * T
    return k, r


# ---------------------------------------------------------------------------------------------- validation


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise InputError(f"{what} must be an integer, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    try:
        return operator.index(value)
    except TypeError:
        raise InputError(f"{what} must be an integer, got {value!r}") from None


def _check_bits(value: Any, what: str, cyclic: bool) -> int:
    b = _as_int(value, what)
    if cyclic and b not in _CYCLIC_BITS:
        extra = " (32 = full precision only as static:32 or a constant gradient g32)" if b == FULL_PRECISION else ""
        raise InputError(f"{what}={b} is not a valid cyclic precision; use 1..16{extra}")
    if b not in VALID_BITS:
        raise InputError(f"{what}={b} is not a valid precision; use 1..16, or 32 for full precision")
    return b


def _check_steps(total_steps: Any) -> int:
    T = _as_int(total_steps, "total_steps")
    if T < 1:
        raise InputError(f"total_steps must be >= 1, got {T}")
    return T


def _check_cycles(cycles: Any) -> int:
    n = _as_int(cycles, "cycles")
    if n < 1:
        raise InputError(f"cycles must be >= 1, got {n}")
    return n


def _check_range(lo: Any, hi: Any, what: str, always_cyclic: bool) -> tuple[int, int]:
    lo_i = _as_int(lo, f"{what}_min")
    hi_i = _as_int(hi, f"{what}_max")
    if lo_i > hi_i:
        raise InputError(f"{what}_min={lo_i} is greater than {what}_max={hi_i}")
    cyclic = always_cyclic or lo_i != hi_i
    _check_bits(lo_i, f"{what}_min", cyclic)
    _check_bits(hi_i, f"{what}_max", cyclic)
    return lo_i, hi_i


# ---------------------------------------------------------------------------------------------- Schedule


@dataclass(frozen=True)
class Schedule:
    """A validated precision schedule. Construct with `make_schedule`, `parse_schedule` or `from_json`.

    For `static`, q_min is normalised to q_max and cycles to 1 (they mean nothing there); the gradient
    precision of a static schedule must be a single value.
    """

    name: str
    q_min: int
    q_max: int
    g_min: int = DEFAULT_G_BITS
    g_max: int = DEFAULT_G_BITS
    cycles: int = DEFAULT_CYCLES

    def __post_init__(self) -> None:
        name = canonical_name(self.name)
        static = name == "static"
        if static:
            q_max = _check_bits(self.q_max, "q_max", cyclic=False)
            q_min, cycles = q_max, 1
        else:
            # Even a degenerate range (q_min == q_max) stays in 1..16: full precision is `static:32`.
            q_min, q_max = _check_range(self.q_min, self.q_max, "q", always_cyclic=True)
            cycles = _check_cycles(self.cycles)
        if static and _as_int(self.g_min, "g_min") != _as_int(self.g_max, "g_max"):
            raise InputError(
                f"static schedule needs one gradient precision, got g {self.g_min}-{self.g_max}; "
                "use a cyclic schedule name for a gradient range")
        g_min, g_max = _check_range(self.g_min, self.g_max, "g", always_cyclic=False)
        for field, value in (("name", name), ("q_min", q_min), ("q_max", q_max),
                             ("g_min", g_min), ("g_max", g_max), ("cycles", cycles)):
            object.__setattr__(self, field, value)

    @classmethod
    def _trusted(cls, name: str, q_min: int, q_max: int, g_min: int, g_max: int, cycles: int) -> "Schedule":
        """A Schedule from fields that are already valid and normalised (canonical name, a static schedule's
        q_min == q_max and cycles == 1), without re-checking them: the planner's search space checks its ranges
        once and builds thousands of candidates (validating each one was ~20 us, most of a planning call)."""
        s = object.__new__(cls)
        s.__dict__.update(name=name, q_min=q_min, q_max=q_max, g_min=g_min, g_max=g_max, cycles=cycles)
        return s

    # -- bits per step

    @property
    def kind(self) -> str:
        return _REGISTRY[self.name].kind

    # -- the schedule family's shape, for counting many schedules' steps without their bits

    @staticmethod
    def pieces(name: str) -> tuple[Piece, ...]:
        """The monotone parts of schedule ``name``'s bits: none for ``static`` (every step at q_max); a -rep
        schedule's rising shape over all cycles; a -tri schedule's rising shape over its odd cycles, then its falling
        shape over its even ones. Within a piece a step's bits depend only on its position r = (t·n) mod T, so
        ``thresholds`` give its steps at each width, for every cycle count n at once."""
        e = _REGISTRY[canonical_name(name)]
        if e.kind == "static":
            return ()
        if e.kind == "repeated":
            return (Piece(e.up, False, "all"),)
        return (Piece(e.up, False, "odd"), Piece(e.down, True, "even"))

    @staticmethod
    def cycle_starts(total_steps: int, cycles: int) -> np.ndarray:
        """The first step of each cycle and T: ceil(j·T/n) for j = 0..n (int64); cycle j is steps
        starts[j]..starts[j+1]-1, and its first step's position is starts[j]·n − j·T, in [0, n)."""
        return _cycle_starts(_check_steps(total_steps), _check_cycles(cycles))

    @staticmethod
    def thresholds(total_steps: int, shapes, which, lo, hi, level) -> np.ndarray:
        """Where each piece crosses a width, for many (shape, range, width) at once: element i is shape
        ``shapes[which[i]]`` (``Piece.shape``) over bits lo[i]..hi[i] and width level[i]; the answer is the first
        position r in [0, T] at which ``rint(lo + (hi − lo)·f(r/T)) <= level`` stops holding (a rising shape) or
        ``> level`` stops holding (a falling one). So a step of that piece at position r = (t·n) mod T has bits <= level
        exactly when r < R (rising) or r >= R (falling), for any cycle count n. Exact: one vectorised binary search
        over all elements that evaluates the very floating-point expression ``bits`` evaluates at r/T (int64)."""
        T = _check_steps(total_steps)
        which = np.asarray(which, dtype=np.int64)
        lo, hi, level = (np.asarray(x, dtype=np.int64) for x in (lo, hi, level))
        order = None
        if which.size > 1 and np.any(which[1:] < which[:-1]):  # each shape evaluated on one contiguous slice
            order = np.argsort(which, kind="stable")
            which, lo, hi, level = which[order], lo[order], hi[order], level[order]
        fns = [_SHAPES[sh][0] for sh in shapes]
        down = np.array([_SHAPES[sh][1] for sh in shapes] + [False], dtype=bool)[which]
        K = which.size
        left = np.zeros(K, dtype=np.int64)
        right = np.full(K, T, dtype=np.int64)
        bounds = np.searchsorted(which, np.arange(len(fns) + 1))
        L, D = lo.astype(np.float64), (hi - lo).astype(np.float64)
        f = np.empty(K)
        while True:
            active = left < right
            if not active.any():
                break
            mid = (left + right) // 2
            z = mid.astype(np.float64) / T
            for j, fn in enumerate(fns):
                a, e = bounds[j], bounds[j + 1]
                if a < e:
                    f[a:e] = fn(z[a:e])
            q = _level(L, D, f)
            ok = np.where(down, q > level, q <= level)
            left = np.where(active & ok, mid + 1, left)
            right = np.where(active & ~ok, mid, right)
        if order is None:
            return left
        out = np.empty_like(left)
        out[order] = left
        return out

    def _tables(self, lo: int, hi: int, T: int) -> tuple[int, np.ndarray, np.ndarray | None]:
        """(g, up, down) of bits lo..hi over a run of T steps: a step's bits depend only on r = (t·n) mod T (and, for
        -tri, the parity of its cycle k); r is a multiple of g = gcd(n, T), so the profile is evaluated once on the
        T/g distinct positions z = r/T -- the very floats cycle_position gives. ``up[r // g]`` are the bits of a
        rising cycle (every cycle of a -rep schedule, the odd ones of a -tri), ``down`` those of a falling (even)
        -tri cycle, None for a -rep schedule. Only for a cyclic range lo < hi."""
        n = self.cycles
        g = math.gcd(n, T)
        z = (np.arange(T // g, dtype=np.int64) * g).astype(np.float64) / T
        entry = _REGISTRY[self.name]

        def table(shape):
            return _level(lo, hi - lo, _SHAPES[shape][0](z)).astype(np.int64)

        return g, table(entry.up), table(entry.down) if entry.kind == "triangular" else None

    def _cyclic_bits(self, lo: int, hi: int, total_steps: int) -> np.ndarray:
        T = _check_steps(total_steps)
        if lo == hi or self.name == "static":
            return np.full(T, hi, dtype=np.int64)
        # Every step looks its bits up in the per-position tables (``_tables``): no per-step transcendental. When n
        # divides T that table is one cycle, tiled n times: no per-step division either.
        n = self.cycles
        g, up, down = self._tables(lo, hi, T)
        if g == n:  # every cycle has length T/n and starts at r = 0
            if down is None:
                return np.tile(up, n)
            out = np.tile(np.concatenate((down, up)), n // 2)
            return np.concatenate((out, down)) if n % 2 else out
        k, r = _cycle_index(T, n)
        idx = r // g
        if down is None:
            return up[idx]
        return np.where(k % 2 == 0, down[idx], up[idx])

    def _bits_at(self, lo: int, hi: int, total_steps: int, steps: np.ndarray, tables=None) -> np.ndarray:
        """``_cyclic_bits(lo, hi, total_steps)[steps]`` without the other steps (``tables``: ``_tables``'s)."""
        T = _check_steps(total_steps)
        steps = np.asarray(steps, dtype=np.int64)
        if lo == hi or self.name == "static":
            return np.full(steps.shape, hi, dtype=np.int64)
        n = self.cycles
        g, up, down = tables if tables is not None else self._tables(lo, hi, T)
        k = steps * n // T
        idx = (steps * n - k * T) // g
        return up[idx] if down is None else np.where(k % 2 == 0, down[idx], up[idx])

    def step_kinds(self, total_steps: int, key: Callable[[np.ndarray, np.ndarray], np.ndarray], nkeys: int,
                   steps: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """How many of the run's steps have each (forward, gradient) bits: ``np.bincount(key(bits(T),
        grad_bits(T)), minlength=nkeys)``, and the keys at ``steps`` (``key(bits(T)[steps], grad_bits(T)[steps])``;
        None without ``steps``), computed from the per-position tables instead of the T steps where that is exact:
        every position r of a -rep schedule occurs g = gcd(n, T) times (t -> t·n mod T hits each multiple of g
        exactly g times), and when n divides T a -tri schedule has ceil(n/2) falling and floor(n/2) rising cycles of
        T/n steps. A -tri schedule whose cycles differ in length (n does not divide T) is counted step by step.
        ``key`` must be element-wise and give integers in 0..nkeys-1."""
        T = _check_steps(total_steps)
        n = self.cycles
        q_cyc = self.q_min != self.q_max and self.name != "static"
        g_cyc = self.g_min != self.g_max and self.name != "static"
        at = None
        if not q_cyc and not g_cyc:  # one kind of step
            one = np.asarray(key(np.array([self.q_max]), np.array([self.g_max])), dtype=np.int64)
            counts = np.bincount(one, minlength=nkeys) * T
            if steps is not None:
                at = np.broadcast_to(one, np.shape(steps)).copy()
            return counts, at
        tri = self.kind == "triangular"
        if tri and T % n:
            q, gb = self.bits(T), self.grad_bits(T)
            keys = key(q, gb)
            return np.bincount(keys, minlength=nkeys), (None if steps is None else keys[np.asarray(steps)])
        tq = self._tables(self.q_min, self.q_max, T) if q_cyc else None
        tg = self._tables(self.g_min, self.g_max, T) if g_cyc else None
        gcd, M = (tq or tg)[0], T // (tq or tg)[0]

        def column(t, hi, which):
            return np.full(M, hi, dtype=np.int64) if t is None else t[which]

        up = key(column(tq, self.q_max, 1), column(tg, self.g_max, 1))
        if tri:  # n divides T: ceil(n/2) falling cycles (k even), floor(n/2) rising ones, T/n steps each
            down = key(column(tq, self.q_max, 2), column(tg, self.g_max, 2))
            counts = (np.bincount(down, minlength=nkeys) * ((n + 1) // 2) + np.bincount(up, minlength=nkeys) * (n // 2))
        else:
            counts = np.bincount(up, minlength=nkeys) * gcd
        if steps is not None:
            at = key(self._bits_at(self.q_min, self.q_max, T, steps, tq),
                     self._bits_at(self.g_min, self.g_max, T, steps, tg))
        return counts, at

    def bits(self, total_steps: int) -> np.ndarray:
        """Forward bits (weights and activations) for each step 0..total_steps-1, int64."""
        return self._cyclic_bits(self.q_min, self.q_max, total_steps)

    def grad_bits(self, total_steps: int) -> np.ndarray:
        """Gradient (error) bits per step, int64: constant, or the forward profile over g_min..g_max."""
        return self._cyclic_bits(self.g_min, self.g_max, total_steps)

    # -- serialisation

    def to_text(self) -> str:
        """The compact text form; ``parse_schedule(s.to_text()) == s``."""
        g = f"g{self.g_max}" if self.g_min == self.g_max else f"g{self.g_min}-{self.g_max}"
        if self.name == "static":
            return f"static:{self.q_max}:{g}"
        return f"{self.name}:{self.q_min}-{self.q_max}:{g}:n{self.cycles}"

    def to_json(self) -> dict:
        return {"name": self.name, "q_min": self.q_min, "q_max": self.q_max,
                "g_min": self.g_min, "g_max": self.g_max, "cycles": self.cycles}

    @classmethod
    def from_json(cls, d: Any) -> "Schedule":
        keys = ("name", "q_min", "q_max", "g_min", "g_max", "cycles")
        if not isinstance(d, dict):
            raise InputError(f"schedule must be a JSON object with keys {', '.join(keys)}; got {type(d).__name__}")
        missing = [k for k in keys if k not in d]
        if missing:
            raise InputError(f"schedule JSON lacks key(s) {', '.join(missing)}; expected keys {', '.join(keys)}")
        return cls(**{k: d[k] for k in keys})  # unknown keys are ignored: later formats may add some

    def __str__(self) -> str:
        return self.to_text()


def _parse_g_bits(g_bits: Any) -> tuple[int, int]:
    if isinstance(g_bits, str):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", g_bits)
        if not m:
            raise InputError(f"gradient bits {g_bits!r} must be G or GMIN-GMAX, e.g. 8 or 6-8")
        lo = int(m.group(1))
        return lo, int(m.group(2)) if m.group(2) else lo
    if isinstance(g_bits, (tuple, list)):
        if len(g_bits) != 2:
            raise InputError(f"gradient bits range must be (lo, hi), got {g_bits!r}")
        return g_bits[0], g_bits[1]
    return g_bits, g_bits


def default_g_bits(name: str, q_max: int) -> int:
    """The gradient bits a schedule gets when none are written: full precision for full precision (``static:32``:
    forward and error unquantized), else DEFAULT_G_BITS (both papers' static 8-bit error).

    Why: ``static:32`` is the FP32 baseline people compare against; an 8-bit error quantizer under it (what it
    meant before) made "full precision" cost 50% of FP32 and quantized its backward. Plans and run directories
    store the schedule as JSON with its gradient bits written out, so those written before keep their meaning;
    a run's settings text is re-read only through its resolved JSON (``cptsim.run.train.resume``)."""
    return FULL_PRECISION if canonical_name(name) == "static" and q_max == FULL_PRECISION else DEFAULT_G_BITS


def make_schedule(name: str, q_min: int = DEFAULT_Q_MIN, q_max: int = DEFAULT_Q_MAX,
                  g_bits: int | tuple[int, int] | str | None = None, cycles: int = DEFAULT_CYCLES) -> Schedule:
    """A validated Schedule. `g_bits` is one precision (static gradient) or (lo, hi) / "lo-hi" (cyclic); None:
    ``default_g_bits`` (32 for static:32, else 8).

    For `static`, q_min and cycles are ignored: the schedule is q_max at every step.
    """
    g_min, g_max = _parse_g_bits(default_g_bits(name, q_max) if g_bits is None else g_bits)
    return Schedule(name=name, q_min=q_min, q_max=q_max, g_min=g_min, g_max=g_max, cycles=cycles)


_RANGE_RE = re.compile(r"(\d+)(?:-(\d+))?")


def parse_schedule(text: str, *, q_min: int = DEFAULT_Q_MIN, q_max: int = DEFAULT_Q_MAX,
                   g_bits: int | tuple[int, int] | str | None = None, cycles: int = DEFAULT_CYCLES) -> Schedule:
    """Parse ``NAME[:QMIN-QMAX|:Q][:gG|:gGMIN-GMAX][:nCYCLES]``. The keyword arguments fill the parts the
    text leaves out (a static schedule's omitted Q comes from `q_max`); parts written in the text win. Gradient
    bits neither written nor given: ``default_g_bits`` (``static:32`` is full precision, error included)."""
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"empty schedule; expected {TEXT_FORM}, {_TEXT_EXAMPLE}")
    parts = [p.strip() for p in text.strip().split(":")]
    name = canonical_name(parts[0])
    g_lo, g_hi = _parse_g_bits(DEFAULT_G_BITS if g_bits is None else g_bits)
    seen: set[str] = set()

    def bad(part: str, why: str) -> InputError:
        return InputError(f"bad schedule {text!r}: part {part!r} {why}; expected {TEXT_FORM}, {_TEXT_EXAMPLE}")

    for part in parts[1:]:
        low = part.lower()
        if not low:
            raise bad(part, "is empty")
        if low[0].isdigit():
            what, body = "q", low
        elif low[0] in "gn":
            what, body = low[0], low[1:]
        else:
            raise bad(part, "is not a precision (Q or QMIN-QMAX), gG / gGMIN-GMAX or nCYCLES")
        if what in seen:
            raise bad(part, "repeats an earlier part")
        seen.add(what)
        m = _RANGE_RE.fullmatch(body)
        if not m:
            raise bad(part, {"q": "is not a precision Q or QMIN-QMAX",
                             "g": "is not gradient bits gG or gGMIN-GMAX",
                             "n": "is not a cycle count nCYCLES"}[what])
        lo, hi = int(m.group(1)), int(m.group(2)) if m.group(2) else None
        if what == "q":
            if name == "static" and hi is not None:
                raise bad(part, "is a range, but static takes one precision (e.g. static:8)")
            q_min, q_max = lo, (lo if hi is None else hi)
        elif what == "g":
            g_lo, g_hi = lo, (lo if hi is None else hi)
        else:
            if hi is not None:
                raise bad(part, "is not a cycle count nCYCLES")
            cycles = lo
    if g_bits is None and "g" not in seen:
        g_lo = g_hi = default_g_bits(name, q_max)
    try:
        return Schedule(name=name, q_min=q_min, q_max=q_max, g_min=g_lo, g_max=g_hi, cycles=cycles)
    except InputError as e:
        raise InputError(f"bad schedule {text!r}: {e}") from None


# ---------------------------------------------------------------------------------------------- cost


def cpt_relative_cost(bits: np.ndarray, grad_bits: np.ndarray) -> float:
    """CPT's training cost relative to FP32, averaged over steps: mean of (q² + 2·q·g) / (3·32²).

    Forward W×A at q·q plus the two backward GEMMs (error×W, error×A) at q·g, assuming the three GEMMs
    have equal MACs -- the formula in the CPT code and in Wolfe & Kyrillidis. `grad_bits` may be a scalar.
    """
    q = np.asarray(bits, dtype=np.float64)
    g = np.asarray(grad_bits, dtype=np.float64)
    if q.size == 0:
        raise InputError("cannot cost an empty schedule (no steps)")
    try:
        q, g = np.broadcast_arrays(q, g)
    except ValueError:
        raise InputError(f"bits and grad_bits differ in shape: {q.shape} vs {g.shape}") from None
    return float(np.mean((q * q + 2.0 * q * g) / (3.0 * FULL_PRECISION**2)))


def describe(schedule: Schedule, total_steps: int) -> dict:
    """Summary of a schedule over a run: bits statistics, CPT relative cost, histogram.

    ``relative_cost_static`` divides by the static-q_max schedule with the same gradient bits.
    ``histogram`` maps forward bits (as a string key, so the dict is the same before and after JSON) to
    the number of steps at that precision, in increasing bits order.
    """
    T = _check_steps(total_steps)
    q = schedule.bits(T)
    g = schedule.grad_bits(T)
    cost = cpt_relative_cost(q, g)
    static_cost = cpt_relative_cost(np.full(T, schedule.q_max, dtype=np.int64), g)
    values, counts = np.unique(q, return_counts=True)
    return {
        "name": schedule.name,
        "text": schedule.to_text(),
        "schedule": schedule.to_json(),
        "kind": schedule.kind,
        "total_steps": T,
        "mean_bits": float(q.mean()),
        "min_bits": int(q.min()),
        "max_bits": int(q.max()),
        "mean_grad_bits": float(g.mean()),
        "min_grad_bits": int(g.min()),
        "max_grad_bits": int(g.max()),
        "relative_cost_fp32": cost,
        "relative_cost_static": cost / static_cost,
        "histogram": {str(int(b)): int(c) for b, c in zip(values, counts)},
    }


def aliasing(schedule: Schedule, total_steps: int) -> str | None:
    """Why ``schedule`` aliases over a run of ``total_steps`` steps (one line), or None when it does not.

    A cycle of L = T/n steps samples its shape at L points; to show every width of its range it must have at least
    as many steps as the range has widths, W = max - min + 1 (the forward range, or the gradient range where that
    cycles and is wider). Below that no cycle can visit all its widths, whatever the shape (pigeonhole), and with a
    step or two a cycle the bits stop tracing the shape at all: each cycle samples it at another phase (cycle j's
    first position is (ceil(j·T/n)·n - j·T)/T, anywhere in [0, 1/L)), so cos-rep:3-8:n32 over 40 steps (1.25 steps
    a cycle) runs 3, 8, 6, 5, 3, 3, 8, ... and cpt:3-8:n1000 over 20 steps every step at 3 bits. So a schedule
    aliases when L < W, i.e. when its shortest cycle (floor(T/n) steps) is shorter than its widths. At W steps or
    more the shape is still sampled coarsely -- a gentle one (lin, cos) lands on every width only from about 2W steps
    a cycle, the steep exp and rex shapes skip widths on their steep part until much longer cycles -- but every cycle
    runs its range in order from its start: that is the shape at that length, not aliasing. A static schedule, or
    one whose ranges are single widths, never aliases."""
    T = _check_steps(total_steps)
    if schedule.name == "static":
        return None
    ranges = [(lo, hi, what) for lo, hi, what in ((schedule.q_min, schedule.q_max, "forward"),
                                                 (schedule.g_min, schedule.g_max, "gradient")) if hi > lo]
    if not ranges:
        return None
    lo, hi, what = max(ranges, key=lambda r: r[1] - r[0])
    widths, n = hi - lo + 1, schedule.cycles
    if T >= n * widths:
        return None
    most = T // widths
    fix = (f"use at most n{most} over {T} steps, or more steps" if most else
           f"even one cycle needs {widths} steps: more steps, or a narrower range")
    return (f"{schedule.to_text()} over {T} steps aliases: {T / n:.3g} steps a cycle, fewer than the {widths} "
            f"{what} widths {lo}-{hi} a cycle spans, so no cycle can visit them all and the bits do not follow the "
            f"schedule's shape ({fix})")


def list_schedules() -> list[dict]:
    """One dict per schedule in SCHEDULE_NAMES order: name, aliases, kind, profile, description, reference."""
    rows = []
    for name, e in _REGISTRY.items():
        rows.append({
            "name": name,
            "aliases": sorted(a for a, c in ALIASES.items() if c == name),
            "kind": e.kind,
            "profile": e.profile,
            "description": e.description,
            "reference": e.reference,
        })
    return rows

"""The search space of the planner: which schedules, cycle counts and bit ranges it may choose from.

A candidate is one `Schedule`: a name x (q_min, q_max) x gradient bits x cycles, subject to

* cyclic schedules need q_min < q_max (q_min == q_max is the static schedule under another name);
* `static` ignores cycles and has one precision q: one candidate per q from the lowest q_min to the highest
  q_max (after the constraints) and per gradient setting;
  with a gradient *range* (g_min < g_max) static runs at g_max (a static schedule has one gradient precision,
  and "static" is the top-precision baseline);
* constraints: q_min >= min_bits (from ``--min-bits N`` or the precision range test; a static candidate's one
  precision counts as its q_min) and q_max <= max_bits.

The default space (all 11 schedules, cycles 1..64 in powers of two, q_min 2..8, q_max 4..8, gradient 8) has
20 (q_min, q_max) pairs x 10 cyclic schedules x 7 cycle counts + 7 static (2..8 bits) = 1407 candidates.

CLI text forms (``parse_space``)::

    --schedules  cos-rep,rex-rep  (names or aliases such as cpt; 'all' = every schedule)
    --cycles     1,2,4,8  or ranges 1-8 (every integer in it), mixed: 1,2,4-6
    --q-min      2-6  or one value 3       lowest and highest q_min allowed
    --q-max      6-8  or one value 8       the q_max values allowed
    --g-bits     8 | 6-8 | 8,6-8           each item is one gradient setting: G static, GMIN-GMAX cyclic
                                           (to search static 6, 7 and 8 write 6,7,8)
    --min-bits   N | auto                  auto: the plan command runs the precision range test
    --max-bits   N
"""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

import numpy as np

from cptsim.errors import InputError
from cptsim.cost.schedules import FULL_PRECISION, SCHEDULE_NAMES, Schedule, canonical_name

__all__ = ["DEFAULT_CYCLES", "MAX_CANDIDATES", "CandidateList", "SearchSpace", "parse_space"]

DEFAULT_CYCLES = (1, 2, 4, 8, 16, 32, 64)
MAX_CANDIDATES = 200_000  # far beyond any useful sweep; guards against e.g. --cycles 1-1000000

_BITS = range(1, 17)


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise InputError(f"{what} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise InputError(f"{what} must be an integer, got {value!r}") from None


def _bits(value: Any, what: str, allow_fp: bool = False) -> int:
    b = _int(value, what)
    if b not in _BITS and not (allow_fp and b == FULL_PRECISION):
        raise InputError(f"{what}={b} is outside 1..16" + (" (or 32, full precision)" if allow_fp else ""))
    return b


def _pair(value: Any, what: str) -> tuple[int, int]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise InputError(f"{what} must be a (low, high) pair, got {value!r}")
    lo, hi = _bits(value[0], f"{what} low"), _bits(value[1], f"{what} high")
    if lo > hi:
        raise InputError(f"{what}: low {lo} is greater than high {hi}")
    return lo, hi


def _g_setting(value: Any) -> tuple[int, int]:
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise InputError(f"gradient bits must be G or a (GMIN, GMAX) pair, got {value!r}")
        lo, hi = _int(value[0], "gradient bits"), _int(value[1], "gradient bits")
    else:
        lo = hi = _int(value, "gradient bits")
    if lo == hi:
        return _bits(lo, "gradient bits", allow_fp=True), hi  # a constant gradient may be full precision
    if lo > hi:
        raise InputError(f"gradient bits range {lo}-{hi}: low is greater than high")
    return _bits(lo, "gradient bits low"), _bits(hi, "gradient bits high")


@dataclass(frozen=True)
class SearchSpace:
    """Validated on construction (InputError): names resolved to canonical ones and deduplicated, every bit
    value in 1..16, low <= high, and at least one candidate left after the constraints (else the message says
    which constraint emptied it). `min_bits_auto` marks ``--min-bits auto``: the caller runs the range test and
    fills min_bits with ``space.with_min_bits(n)``."""

    schedules: tuple[str, ...] = SCHEDULE_NAMES
    cycles: tuple[int, ...] = DEFAULT_CYCLES
    q_min_range: tuple[int, int] = (2, 8)
    q_max_range: tuple[int, int] = (4, 8)
    g_bits: tuple = ((8, 8),)
    min_bits: int | None = None
    max_bits: int | None = None
    min_bits_auto: bool = field(default=False)

    def __post_init__(self) -> None:
        if isinstance(self.schedules, str) or not isinstance(self.schedules, (tuple, list)):
            raise InputError(f"schedules must be a list of names, got {self.schedules!r}")
        names = tuple(dict.fromkeys(canonical_name(n) for n in self.schedules))
        if not names:
            raise InputError("no schedules to search; give at least one name")
        if not isinstance(self.cycles, (tuple, list)):
            raise InputError(f"cycles must be a list of integers, got {self.cycles!r}")
        cycles = tuple(sorted(set(_int(c, "cycles") for c in self.cycles)))
        if not cycles:
            raise InputError("no cycle counts to search; give at least one")
        if cycles[0] < 1:
            raise InputError(f"cycles must be >= 1, got {cycles[0]}")
        if not isinstance(self.g_bits, (tuple, list)) or not self.g_bits:
            raise InputError(f"gradient bits must be a non-empty list of G or (GMIN, GMAX), got {self.g_bits!r}")
        g_bits = tuple(dict.fromkeys(_g_setting(g) for g in self.g_bits))
        min_bits = None if self.min_bits is None else _bits(self.min_bits, "min-bits")
        max_bits = None if self.max_bits is None else _bits(self.max_bits, "max-bits")
        if min_bits is not None and max_bits is not None and min_bits > max_bits:
            raise InputError(f"--min-bits {min_bits} is greater than --max-bits {max_bits}")
        if self.min_bits_auto and min_bits is not None:
            raise InputError("--min-bits is either a number or auto, not both")
        values = dict(schedules=names, cycles=cycles, q_min_range=_pair(self.q_min_range, "q_min range"),
                      q_max_range=_pair(self.q_max_range, "q_max range"), g_bits=g_bits,
                      min_bits=min_bits, max_bits=max_bits, min_bits_auto=bool(self.min_bits_auto))
        if values["q_min_range"][0] > values["q_max_range"][1]:
            raise InputError(f"q_min {values['q_min_range'][0]} is above every q_max (at most "
                             f"{values['q_max_range'][1]}): q_min must not exceed q_max")
        for k, v in values.items():
            object.__setattr__(self, k, v)
        n = self.size()
        if n == 0:
            raise InputError(self._why_empty())
        if n > MAX_CANDIDATES:
            raise InputError(f"the search space has {n} candidates (limit {MAX_CANDIDATES}); "
                             "narrow --schedules, --cycles or the bit ranges")

    # -- candidates

    def _combos(self, min_bits: int | None, max_bits: int | None) -> Iterator[tuple]:
        """(name, q_min, q_max, g_min, g_max, cycles) of every candidate, without duplicates, in a stable order."""
        lo_min, hi_min = self.q_min_range
        lo_max, hi_max = self.q_max_range
        if min_bits is not None:
            lo_min = max(lo_min, min_bits)
        if max_bits is not None:
            hi_max = min(hi_max, max_bits)
        seen: set[tuple] = set()
        for name in self.schedules:
            if name == "static":
                # Every width from the lowest q_min to the highest q_max: a static schedule below q_max is a real
                # contender (measured: static 5 beat CPT 3-8 at less cost on MNIST; static 3 beat every cyclic 2-4
                # schedule on digits in 10 of 10 seeds), and a planner that learns from runs must be free to pick it.
                for q_max in range(lo_min, hi_max + 1):
                    for g_min, g_max in self.g_bits:
                        c = ("static", q_max, q_max, g_max, g_max, 1)
                        if c not in seen:
                            seen.add(c)
                            yield c
                continue
            for q_max in range(lo_max, hi_max + 1):
                for q_min in range(lo_min, min(hi_min, q_max - 1) + 1):
                    for g_min, g_max in self.g_bits:
                        for n in self.cycles:
                            yield (name, q_min, q_max, g_min, g_max, n)  # distinct by construction

    def size(self) -> int:
        """The number of candidates, without building them."""
        return sum(1 for _ in self._combos(self.min_bits, self.max_bits))

    def candidates(self) -> list[Schedule]:
        """Every candidate schedule, validated, deduplicated, in schedule-name order."""
        # __post_init__ checked the names and every range these combinations draw from
        return [Schedule._trusted(*c) for c in self._combos(self.min_bits, self.max_bits)]

    def candidate_table(self) -> tuple[tuple[str, ...], np.ndarray]:
        """The candidates as numbers, in ``candidates()`` order: (names, F) with F (C, 6) int64 rows (name index
        into names, q_min, q_max, g_min, g_max, cycles). Built by whole arrays (a cyclic schedule's block is its
        (q_min, q_max) pairs x gradient settings x cycle counts), not one tuple per candidate."""
        lo_min, hi_min = self.q_min_range
        lo_max, hi_max = self.q_max_range
        if self.min_bits is not None:
            lo_min = max(lo_min, self.min_bits)
        if self.max_bits is not None:
            hi_max = min(hi_max, self.max_bits)
        g = np.array(self.g_bits, dtype=np.int64).reshape(-1, 2)
        cyc = np.array(self.cycles, dtype=np.int64)
        pairs = np.array([(q_min, q_max) for q_max in range(lo_max, hi_max + 1)
                          for q_min in range(lo_min, min(hi_min, q_max - 1) + 1)], dtype=np.int64).reshape(-1, 2)
        G, N = len(g), len(cyc)
        block = np.concatenate((np.repeat(pairs, G * N, axis=0),
                                np.tile(np.repeat(g, N, axis=0), (len(pairs), 1)),
                                np.tile(cyc, len(pairs) * G)[:, None]), axis=1)          # pairs x g x cycles
        statics = np.array(list(dict.fromkeys((q, q, g_max, g_max, 1) for q in range(lo_min, hi_max + 1)
                                              for _, g_max in self.g_bits)), dtype=np.int64).reshape(-1, 5)
        parts = []
        for j, name in enumerate(self.schedules):
            b = statics if name == "static" else block
            parts.append(np.concatenate((np.full((len(b), 1), j, dtype=np.int64), b), axis=1))
        return tuple(self.schedules), np.concatenate(parts) if parts else np.zeros((0, 6), dtype=np.int64)

    def _why_empty(self) -> str:
        """Name the constraint that left no candidate (called only when the space is empty)."""

        def count(min_bits, max_bits):
            return sum(1 for _ in self._combos(min_bits, max_bits))

        names = "all schedules" if set(self.schedules) == set(SCHEDULE_NAMES) else ",".join(self.schedules)
        where = (f"schedules {names}, q_min {self.q_min_range[0]}-{self.q_min_range[1]}, "
                 f"q_max {self.q_max_range[0]}-{self.q_max_range[1]}")
        mn, mx = self.min_bits, self.max_bits
        if count(None, None) == 0:
            only_cyclic = "static" not in self.schedules
            return (f"empty search space: no q_min below q_max ({where})" +
                    ("; cyclic schedules need q_min < q_max" if only_cyclic else ""))
        if mx is not None and count(None, mx) == 0:
            return f"--max-bits {mx} leaves no candidate: it is below every allowed q_max ({where})"
        if mn is not None and count(mn, None) == 0:
            hi = self.q_max_range[1]
            reason = (f"cyclic schedules need {mn} <= q_min <= {self.q_min_range[1]} and q_min < q_max <= {hi}"
                      if "static" not in self.schedules else f"it is above every allowed q_max (<= {hi})")
            return f"--min-bits {mn} leaves no candidate: {reason} ({where})"
        return f"--min-bits {mn} together with --max-bits {mx} leaves no candidate with q_min < q_max ({where})"

    # -- derived spaces and files

    def with_min_bits(self, min_bits: int) -> "SearchSpace":
        """This space with q_min >= min_bits (how `--min-bits auto` is resolved once the range test has run)."""
        return replace(self, min_bits=min_bits, min_bits_auto=False)

    def to_json(self) -> dict:
        return {"schedules": list(self.schedules), "cycles": list(self.cycles),
                "q_min_range": list(self.q_min_range), "q_max_range": list(self.q_max_range),
                "g_bits": [list(g) for g in self.g_bits], "min_bits": self.min_bits, "max_bits": self.max_bits,
                "min_bits_auto": self.min_bits_auto}

    @classmethod
    def from_json(cls, d: Any) -> "SearchSpace":
        if not isinstance(d, dict):
            raise InputError(f"search space must be a JSON object, got {type(d).__name__}")
        known = {"schedules", "cycles", "q_min_range", "q_max_range", "g_bits", "min_bits", "max_bits",
                 "min_bits_auto"}
        kwargs = {k: v for k, v in d.items() if k in known}  # unknown keys: a later format may add some
        for k in ("schedules", "cycles", "g_bits"):
            if k in kwargs and isinstance(kwargs[k], list):
                kwargs[k] = tuple(tuple(x) if isinstance(x, list) else x for x in kwargs[k])
        for k in ("q_min_range", "q_max_range"):
            if k in kwargs and isinstance(kwargs[k], list):
                kwargs[k] = tuple(kwargs[k])
        return cls(**kwargs)


class CandidateList(Sequence):
    """The candidates of ``SearchSpace.candidate_table`` as a sequence of ``Schedule``: each built when it is read
    (a planning call reads a dozen of thousands, and building every one was a tenth of its time)."""

    def __init__(self, names: tuple[str, ...], table: np.ndarray):
        self.names, self.table = names, table

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        j, q_min, q_max, g_min, g_max, n = self.table[operator.index(i)].tolist()
        # the space checked the names and every range these rows draw from, and normalised static rows
        return Schedule._trusted(self.names[j], q_min, q_max, g_min, g_max, n)

    def __iter__(self):
        return iter(self._build(self.table))

    def take(self, indices) -> list[Schedule]:
        """The schedules at these indices (one conversion of their rows, not one per schedule)."""
        return self._build(self.table[np.asarray(indices, dtype=np.int64)])

    def _build(self, rows: np.ndarray) -> list[Schedule]:
        names, trusted = self.names, Schedule._trusted
        return [trusted(names[j], q_min, q_max, g_min, g_max, n) for j, q_min, q_max, g_min, g_max, n in rows.tolist()]

    def __eq__(self, other) -> bool:
        return isinstance(other, (Sequence, CandidateList)) and len(self) == len(other) and \
            all(a == b for a, b in zip(self, other))

    def __repr__(self) -> str:
        return f"CandidateList({len(self)} schedules)"


# ---------------------------------------------------------------------------------------------- CLI text

_INT = r"\s*(\d+)\s*"
_RANGE_RE = re.compile(rf"{_INT}(?:-{_INT})?", re.ASCII)


def _items(text: str, flag: str) -> list[str]:
    if not isinstance(text, str):
        text = str(text)
    items = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in items):
        raise InputError(f"{flag} {text!r}: empty item; write a comma-separated list")
    return items


def _match_range(item: str, bad: str) -> tuple[int, int]:
    """(lo, hi) of "N" (hi = lo) or "LOW-HIGH"; InputError(bad) for anything else."""
    m = _RANGE_RE.fullmatch(str(item))
    if not m:
        raise InputError(bad)
    lo = int(m.group(1))
    return lo, (int(m.group(2)) if m.group(2) is not None else lo)


def _range(text: str, flag: str, example: str) -> tuple[int, int]:
    lo, hi = _match_range(text, f"{flag} {text!r} must be N or LOW-HIGH, e.g. {example}")
    if lo > hi:
        raise InputError(f"{flag} {text!r}: low {lo} is greater than high {hi}")
    for b in (lo, hi):
        if b not in _BITS:
            raise InputError(f"{flag} {text!r}: {b} bits is outside 1..16")
    return lo, hi


def _parse_cycles(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for item in _items(text, "--cycles"):
        lo, hi = _match_range(item, f"--cycles {text!r}: {item!r} is not a count N or a range LOW-HIGH, e.g. 1,2,4,8")
        if lo < 1:
            raise InputError(f"--cycles {text!r}: cycle counts start at 1")
        if lo > hi:
            raise InputError(f"--cycles {text!r}: low {lo} is greater than high {hi}")
        if hi - lo > MAX_CANDIDATES:
            raise InputError(f"--cycles {text!r}: range {lo}-{hi} is too large to search")
        out.extend(range(lo, hi + 1))
    return tuple(out)


def _parse_g_bits(text: str) -> tuple[tuple[int, int], ...]:
    out = []
    for item in _items(text, "--g-bits"):
        lo, hi = _match_range(item, f"--g-bits {text!r}: {item!r} is not G or GMIN-GMAX, e.g. 8 or 6-8 or 8,6-8")
        try:
            out.append(_g_setting((lo, hi)))
        except InputError as e:
            raise InputError(f"--g-bits {text!r}: {e}") from None
    return tuple(out)


def parse_space(schedules: str | None = None, cycles: str | None = None, q_min: str | None = None,
                q_max: str | None = None, g_bits: str | None = None, min_bits: str | int | None = None,
                max_bits: str | int | None = None) -> SearchSpace:
    """A SearchSpace from the plan command's flags (text forms in the module docstring); None = default."""
    kw: dict[str, Any] = {}
    if schedules is not None:
        items = _items(schedules, "--schedules")
        kw["schedules"] = SCHEDULE_NAMES if [i.lower() for i in items] == ["all"] else tuple(items)
    if cycles is not None:
        kw["cycles"] = _parse_cycles(cycles)
    if q_min is not None:
        kw["q_min_range"] = _range(q_min, "--q-min", "2-6 or 3")
    if q_max is not None:
        kw["q_max_range"] = _range(q_max, "--q-max", "6-8 or 8")
    if g_bits is not None:
        kw["g_bits"] = _parse_g_bits(g_bits)
    if min_bits is not None:
        if isinstance(min_bits, str) and min_bits.strip().lower() == "auto":
            kw["min_bits_auto"] = True
        else:
            kw["min_bits"] = _flag_int(min_bits, "--min-bits", "a number of bits or auto")
    if max_bits is not None:
        kw["max_bits"] = _flag_int(max_bits, "--max-bits", "a number of bits")
    return SearchSpace(**kw)


def _flag_int(value: Any, flag: str, what: str) -> int:
    if isinstance(value, str):
        if not re.fullmatch(r"\s*\d+\s*", value, re.ASCII):
            raise InputError(f"{flag} {value!r} must be {what}")
        value = int(value)
    b = _int(value, flag)
    if b not in _BITS:
        raise InputError(f"{flag} {b} is outside 1..16")
    return b

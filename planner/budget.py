"""Compute budgets: one piece of text, whose unit decides what is being limited.

Grammar (``parse_budget``)::

    BUDGET  = NUMBER [spaces] UNIT            e.g.  65%   2.5e17bitops   1.6e8 GBitOPs   500 kJ   2kWh   45min
    NUMBER  = decimal or scientific, positive and finite (1, 0.5, .5, 2.5e17, 1E3)

    unit                    metric    meaning
    %                       (chosen)  fraction of the static-q_max baseline cost on the chosen metric
                                      (bitops unless --metric says energy or latency); stored as a fraction
    bitops bops             bitops    a count of bit operations; SI prefixes k M G T P E (1.6e8gbitops = 1.6e17)
    J   Wh                  energy    joules, watt-hours (1 Wh = 3600 J); prefixes m (milli) k M (mega) G
    s ms min h d            latency   also sec/secs/second(s), msec, mins/minute(s), hr/hrs/hour(s), day(s)

Units are case-insensitive (``GBITOPS``, ``kwh``, ``500 KJ``, ``3H``) with one exception: an energy prefix
``m`` is milli and ``M`` is mega, as in SI, because for energy both are plausible (a digits run on a GPU
costs millijoules, a CIFAR run megajoules) and guessing would be off by 10^9. For bit operations there is no
milli, so ``m`` and ``M`` both mean mega; for time, ``ms``/``MS`` is milliseconds (there are no megaseconds).

Refused, each with a one-line reason: a bare number (``0.6`` could be a fraction, a count or seconds: write
``60%``), an unknown unit (the message lists the accepted ones), zero, negative, NaN or infinite values, a
percentage above 1000% (a typo guard: anything above 100% already plans the static q_max schedule), and a
``--metric`` that contradicts the unit (``--metric latency`` with ``500kJ``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from cptsim.errors import InputError

__all__ = ["METRICS", "BASE_UNITS", "MAX_PERCENT", "BUDGET_HELP", "Budget", "parse_budget", "format_value",
           "time_margin"]

METRICS = ("bitops", "energy", "latency")
BASE_UNITS = {"bitops": "bitops", "energy": "J", "latency": "s"}
MAX_PERCENT = 1000.0

BUDGET_HELP = (
    "Budget: NUMBER UNIT. 65% = fraction of the static-q_max cost (metric: bitops, or --metric energy|latency); "
    "bit operations: bitops, kbitops .. Ebitops (e.g. 2.5e17bitops, 1.6e8gbitops); "
    "energy: J, mJ, kJ, MJ, GJ, Wh, kWh, MWh (m = milli, M = mega); "
    "latency: ms, s, min, h, d."
)

_ACCEPTED = "%, bitops (k/M/G/T/P/E prefixes), J, mJ, kJ, MJ, GJ, Wh, mWh, kWh, MWh, ms, s, min, h, d"

_BITOPS_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15, "e": 1e18}
_ENERGY_PREFIX = {"": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "g": 1e9, "G": 1e9}
_TIME_UNITS = {
    "ms": 1e-3, "msec": 1e-3, "msecs": 1e-3, "millisecond": 1e-3, "milliseconds": 1e-3,
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
}

# The number is matched loosely (any sign, nan/inf spelled out) so that the error can say what is wrong with it.
_NUMBER = r"[+-]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|nan|inf|infinity)"
_BUDGET_RE = re.compile(rf"\s*({_NUMBER})\s*(.*?)\s*", re.ASCII | re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class Budget:
    """A parsed budget. `value` is in base units (bitops: a count, energy: J, latency: s); a relative budget has
    unit "%" and `value` a fraction of the static-q_max baseline (0.65 for 65%). `spec` is the text as typed."""

    metric: str
    value: float
    unit: str
    spec: str

    @property
    def relative(self) -> bool:
        return self.unit == "%"

    def absolute(self, baseline_value: float) -> float:
        """The budget in base units: value x baseline for a relative budget, value otherwise."""
        return self.value * baseline_value if self.relative else self.value

    def to_json(self) -> dict:
        return {"metric": self.metric, "value": self.value, "unit": self.unit, "spec": self.spec}

    @classmethod
    def from_json(cls, d: object) -> "Budget":
        """Read a budget back from plan.json; the spec is re-parsed so a hand-edited file is validated too."""
        if not isinstance(d, dict) or not isinstance(d.get("spec"), str) or not isinstance(d.get("metric"), str):
            raise InputError(f"budget must be a JSON object with keys metric, value, unit, spec; got {d!r}")
        return parse_budget(d["spec"], d["metric"])

    def text(self) -> str:
        """A readable form that parses back to the same budget (to float rounding): '65%', '250 kJ', '45 min'."""
        if self.relative:
            return f"{format_value(self.value * 100)}%"
        return format_quantity(self.metric, self.value, exact=True)

    def describe(self) -> str:
        """The budget in words, for tables and messages: '65% of the static-q_max BitOPs', '500 kJ of energy'."""
        what = {"bitops": "BitOPs", "energy": "energy", "latency": "latency"}[self.metric]
        if self.relative:
            return f"{format_value(self.value * 100)}% of the static-q_max {what}"
        if self.metric == "bitops":
            return f"{self.value:.4g} BitOPs"
        return f"{format_quantity(self.metric, self.value)} of {what}"

    def __str__(self) -> str:
        return self.text()


def format_value(x: float) -> str:
    """Shortest text for a float that reads back exactly ('65', '2.5e+17', '0.1')."""
    r = repr(float(x))
    return r[:-2] if r.endswith(".0") else r


_SCALES = {
    "bitops": (("bitops", 1.0),),
    "energy": (("GJ", 1e9), ("MJ", 1e6), ("kJ", 1e3), ("J", 1.0), ("mJ", 1e-3)),
    "latency": (("d", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0), ("ms", 1e-3)),
}


def format_quantity(metric: str, value: float, exact: bool = False) -> str:
    """A base-unit value in the most readable unit of its metric ('7.2 MJ', '45 min'); parse_budget reads it
    back. `exact` prints every digit needed to read back the same float (up to one rounding of the scale)."""
    scales = _SCALES[metric]
    unit, scale = next(((u, s) for u, s in scales if value >= s), scales[-1])
    x = value / scale
    return f"{format_value(x) if exact else f'{x:.4g}'} {unit}"


def format_quantities(metric: str, *values: float) -> list[str]:
    """Several base-unit values of one metric, for one sentence, all in one unit: the one ``format_quantity`` picks
    for the smallest (a pick of 58.33 s and a budget of 60 s read '58.33 s' and '60 s', not '58.33 s' and '1 min')."""
    scales = _SCALES[metric]
    low = min(values)
    unit, scale = next(((u, s) for u, s in scales if low >= s), scales[-1])
    return [f"{v / scale:.4g} {unit}" for v in values]


def _unit(unit: str, spec: str) -> tuple[str, float]:
    """(metric, scale to base units) for a unit text; InputError if it is not one we know."""
    low = unit.lower()
    m = re.fullmatch(r"([kmgtpe]?)(bitops?|bops?)", low)
    if m:
        return "bitops", _BITOPS_PREFIX[m.group(1)]
    # Energy keeps the case of its prefix (m milli, M mega, as in SI); the rest is case-insensitive.
    m = re.fullmatch(r"([mkg]?)(j|wh)", unit, re.IGNORECASE)
    if m:
        prefix = m.group(1)
        base = 1.0 if m.group(2).lower() == "j" else 3600.0
        return "energy", _ENERGY_PREFIX[prefix if prefix in ("m", "M") else prefix.lower()] * base
    if low in _TIME_UNITS:
        return "latency", _TIME_UNITS[low]
    hint = ""
    if low == "m":
        hint = " ('m' is ambiguous: write min for minutes)"
    elif low in ("x", "frac", "fraction"):
        hint = " (write a fraction of the static cost as a percentage, e.g. 65%)"
    raise InputError(f"budget {spec!r}: unknown unit {unit!r}{hint}; accepted units: {_ACCEPTED}")


def parse_budget(spec: str, metric: str | None = None) -> Budget:
    """Parse a budget text (grammar in the module docstring). `metric` (bitops | energy | latency) picks what a
    percentage is a fraction of; with an absolute unit it must agree with the unit's metric."""
    if metric is not None:
        if not isinstance(metric, str) or metric.strip().lower() not in METRICS:
            raise InputError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
        metric = metric.strip().lower()
    if not isinstance(spec, str) or not spec.strip():
        raise InputError(f"empty budget; write NUMBER UNIT, e.g. 65%, 2.5e17bitops, 500kJ, 3h ({_ACCEPTED})")
    shown = spec.strip()
    m = _BUDGET_RE.fullmatch(spec)
    if m is None:
        raise InputError(f"budget {shown!r} is not NUMBER UNIT, e.g. 65%, 2.5e17bitops, 500kJ, 3h")
    number, unit = m.group(1), m.group(2)
    try:
        x = float(number)
    except ValueError:  # pragma: no cover - the regex only lets float() spellings through
        raise InputError(f"budget {shown!r}: {number!r} is not a number") from None
    if not math.isfinite(x):
        raise InputError(f"budget {shown!r} must be a finite positive number, got {number}")
    if x <= 0:
        raise InputError(f"budget {shown!r} must be positive, got {number}")
    if not unit:
        raise InputError(f"budget {shown!r} has no unit: a bare number is ambiguous; write a percentage of the "
                         f"static-q_max cost (e.g. {format_value(x * 100) if x <= 1 else format_value(x)}%) "
                         f"or give a unit ({_ACCEPTED})")
    if unit == "%":
        if x > MAX_PERCENT:
            raise InputError(f"budget {shown!r} is over {MAX_PERCENT:g}% of the static q_max cost - a typo? "
                             "any budget above 100% already plans static q_max")
        return Budget(metric or "bitops", x / 100.0, "%", shown)
    unit_metric, scale = _unit(unit, shown)
    if metric is not None and metric != unit_metric:
        raise InputError(f"budget {shown!r} is {unit_metric} (unit {unit}), but --metric {metric} was asked for; "
                         f"drop --metric or give a budget in {metric} units")
    value = x * scale
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"budget {shown!r} is out of range once converted to {BASE_UNITS[unit_metric]}")
    return Budget(unit_metric, value, BASE_UNITS[unit_metric], shown)


def time_margin(budget: Budget, chosen_s: float, budget_s: float, validation: dict, hardware: str = "") -> dict:
    """How far a time budget's pick is from the budget, against how wrong the profile's times are known to be.

    ``chosen_s``: the pick's modelled time; ``budget_s``: the budget in seconds (a relative budget: its fraction of
    the modelled static-q_max time); ``validation``: the profile's ``time_validation(op_mix)``. The error of a
    profile is |predicted / measured - 1| (its [validation]), so a pick modelled a fraction ``margin`` under the
    budget really runs over it only if its time is underestimated by more than that: predicted / measured below
    1 - margin, an |error| above ``margin``. Returns ``margin`` (1 - chosen / budget), ``verdict`` (one of
    "within at worst error", "within at median error", "margin under median error", "unknown error") and
    ``text``, the sentence plan prints.
    """
    if budget.metric != "latency":
        raise ValueError(f"time_margin is for a latency budget, got a {budget.metric} one")
    margin = 1.0 - chosen_s / budget_s if budget_s > 0 else float("nan")
    pick, budget_text = format_quantities("latency", chosen_s, budget_s)
    limit = (f"the {format_value(budget.value * 100)}% budget ({budget_text} of modelled static-q_max time)"
             if budget.relative else f"the {budget_text} budget")
    who = f"{hardware}'s" if hardware else "the profile's"
    head = f"the pick's {pick} is {100 * margin:.0f}% under {limit}"
    doc = {"chosen_s": float(chosen_s), "budget_s": float(budget_s), "margin": float(margin),
           "relative": budget.relative}
    if not validation.get("checked"):
        doc.update(verdict="unknown error", median_abs_error=None, worst_abs_error=None)
        doc["text"] = (f"{head}; {who} times were never checked against measurements (no [validation]), so how "
                       "far off they may be is unknown")
        if validation.get("op_list_missing"):
            doc["text"] += "; the profile has no op list, so these times leave out the step's other ops"
        return doc
    med, worst = float(validation["median_abs_error"]), float(validation["worst_abs_error"])
    if worst <= margin:
        verdict, tail = "within at worst error", "within budget even at its worst error"
    elif med <= margin:
        verdict, tail = "within at median error", (f"within budget unless the time is underestimated by more "
                                                  f"than {100 * margin:.0f}% (at the median error it fits; at "
                                                  "the worst it would not)")
    else:
        verdict, tail = "margin under median error", ("the margin is smaller than the median error: the run may "
                                                      "well take longer than the budget")
    doc.update(verdict=verdict, median_abs_error=med, worst_abs_error=worst)
    sample = "held out" if validation.get("held_out") == "yes" else "in-sample"
    text = (f"{head}; {who} median |error| is {100 * med:.0f}%, worst {100 * worst:.0f}% ({sample}, "
            f"{validation.get('n')} {validation.get('against')}): {tail}")
    if validation.get("op_mix_missing"):
        text += f"; that check had no {', '.join(validation.get('op_mix_missing', []))}, which this network has"
    if validation.get("op_list_missing"):
        text += "; the profile has no op list, so these times leave out the step's other ops"
    if budget.relative:
        text += ("; a budget relative to the modelled static time shares the model's error with the pick, so "
                 "most of it cancels")
    doc["text"] = text
    return doc

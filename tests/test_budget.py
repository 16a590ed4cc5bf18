"""Budgets: units decide the metric, values land in base units, bad text is one InputError."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cptsim.errors import InputError
from cptsim.planner.budget import METRICS, Budget, parse_budget


@pytest.mark.parametrize(
    "spec, metric, value, unit",
    [
        ("65%", "bitops", 0.65, "%"),
        ("60 %", "bitops", 0.60, "%"),
        ("150%", "bitops", 1.5, "%"),  # above static q_max is allowed: it plans static q_max
        ("2.5e17bitops", "bitops", 2.5e17, "bitops"),
        ("1.6e8gbitops", "bitops", 1.6e17, "bitops"),
        ("1.6e8 GBitOPs", "bitops", 1.6e17, "bitops"),
        ("3 Tbitops", "bitops", 3e12, "bitops"),
        ("2Mbitops", "bitops", 2e6, "bitops"),
        ("500kJ", "energy", 5e5, "J"),
        ("500 KJ", "energy", 5e5, "J"),
        ("800J", "energy", 800.0, "J"),
        ("2kWh", "energy", 7.2e6, "J"),
        ("3Wh", "energy", 10800.0, "J"),
        ("3 mJ", "energy", 3e-3, "J"),   # SI: m is milli ...
        ("3MJ", "energy", 3e6, "J"),     # ... and M is mega
        ("1 MWh", "energy", 3.6e9, "J"),
        ("3h", "latency", 10800.0, "s"),
        ("3 hours", "latency", 10800.0, "s"),
        ("45min", "latency", 2700.0, "s"),
        ("900s", "latency", 900.0, "s"),
        ("1.5d", "latency", 129600.0, "s"),
        ("250ms", "latency", 0.25, "s"),
        ("250 MS", "latency", 0.25, "s"),
        (".5h", "latency", 1800.0, "s"),
    ],
)
def test_units_decide_metric_and_value_is_in_base_units(spec, metric, value, unit):
    b = parse_budget(spec)
    assert (b.metric, b.unit, b.spec) == (metric, unit, spec.strip())
    assert math.isclose(b.value, value, rel_tol=1e-12)


def test_percent_takes_the_metric_asked_for():
    assert parse_budget("65%", "energy").metric == "energy"
    assert parse_budget("65%", "Latency").metric == "latency"
    assert parse_budget("500kJ", "energy").metric == "energy"


def test_relative_budget_json_and_absolute():
    b = parse_budget("65%")
    assert b.relative
    assert b.to_json() == {"metric": "bitops", "value": 0.65, "unit": "%", "spec": "65%"}
    assert math.isclose(b.absolute(2e17), 1.3e17)
    e = parse_budget("500kJ")
    assert not e.relative and e.absolute(123.0) == 5e5
    assert Budget.from_json(e.to_json()) == e


@pytest.mark.parametrize(
    "spec, metric, needle",
    [
        ("0.6", None, "60%"),          # a bare number is ambiguous; the message shows the percentage form
        ("60", None, "no unit"),
        ("5 parsecs", None, "accepted units"),
        ("5 m", None, "min"),
        ("-5%", None, "positive"),
        ("0kJ", None, "positive"),
        ("0%", None, "positive"),
        ("nan%", None, "finite"),
        ("inf J", None, "finite"),
        ("1e999 J", None, "finite"),
        ("1e308 kJ", None, "out of range"),
        ("2000%", None, "1000%"),
        ("500kJ", "latency", "--metric latency"),
        ("3h", "bitops", "--metric bitops"),
        ("65%", "power", "unknown metric"),
        ("", None, "empty"),
        ("kJ", None, "NUMBER UNIT"),
        ("five hours", None, "NUMBER UNIT"),
        ("1,000J", None, "unknown unit"),
    ],
)
def test_bad_budgets_are_one_line_input_errors(spec, metric, needle):
    with pytest.raises(InputError) as e:
        parse_budget(spec, metric)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=30), st.sampled_from([None, *METRICS, "x"]))
def test_random_text_raises_only_input_error(text, metric):
    try:
        b = parse_budget(text, metric)
    except InputError as e:
        assert "\n" not in str(e)
    else:
        assert b.value > 0 and math.isfinite(b.value) and b.metric in METRICS


_UNITS = ["%", "bitops", "kbitops", "Gbitops", "pbitops", "J", "mJ", "kJ", "MJ", "Wh", "kWh", "ms", "s", "min",
          "h", "d"]


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False),
       st.sampled_from(_UNITS), st.sampled_from(["", " ", "  "]))
def test_valid_budgets_round_trip_through_their_text(x, unit, space):
    if unit == "%":
        x = min(x, 1000.0)
    b = parse_budget(f"{x!r}{space}{unit}")
    again = parse_budget(b.text())
    assert (again.metric, again.unit) == (b.metric, b.unit)
    assert math.isclose(again.value, b.value, rel_tol=1e-12)
    assert parse_budget(b.to_json()["spec"]) == b


# ---------------------------------------------------------------------- a time budget's margin against the model's error

_VAL = {"checked": True, "against": "24 timm runs", "n": 24, "median_abs_error": 0.08, "worst_abs_error": 0.25,
        "held_out": "no", "op_mix_covered": True, "op_mix_missing": []}


@pytest.mark.parametrize("chosen_h, verdict", [(2.61, "within at median error"),   # 13% under: 8% < 13% < 25%
                                               (2.0, "within at worst error"),      # 33% under: beyond the worst
                                               (2.85, "margin under median error")])  # 5% under: inside the median
def test_a_time_budgets_margin_is_read_against_the_profiles_median_and_worst_error(chosen_h, verdict):
    from cptsim.planner.budget import time_margin

    b = parse_budget("3h")
    m = time_margin(b, chosen_h * 3600, b.value, _VAL, "rtx3090")
    assert m["margin"] == pytest.approx(1 - chosen_h / 3)
    assert m["verdict"] == verdict and m["median_abs_error"] == 0.08 and m["worst_abs_error"] == 0.25
    assert m["text"].startswith(f"the pick's {chosen_h:.4g} h is {100 * (1 - chosen_h / 3):.0f}% under the 3 h budget")
    assert "rtx3090's median |error| is 8%, worst 25% (in-sample, 24 24 timm runs)" in m["text"]


def test_a_margin_says_when_the_error_is_unknown_or_the_check_missed_the_op_mix_or_the_budget_is_relative():
    from cptsim.planner.budget import time_margin

    b = parse_budget("3h")
    m = time_margin(b, 9000.0, b.value, {"checked": False, "note": "no [validation]"})
    assert m["verdict"] == "unknown error" and m["median_abs_error"] is None and "unknown" in m["text"]
    m = time_margin(b, 9000.0, b.value, {**_VAL, "op_mix_covered": False, "op_mix_missing": ["lstm"]})
    assert "that check had no lstm, which this network has" in m["text"]
    rel = parse_budget("80%", "latency")
    m = time_margin(rel, 35.0, 40.0, _VAL)
    assert m["relative"] and m["margin"] == pytest.approx(0.125) and "most of it cancels" in m["text"]
    assert "the 80% budget (40 s of modelled static-q_max time)" in m["text"]
    with pytest.raises(ValueError):
        time_margin(parse_budget("500kJ"), 1.0, 2.0, _VAL)

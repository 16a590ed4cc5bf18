"""What plan prints is true and reads in one unit a message.

A plan printed its budget in s and its margin in min ('budget 1 min of latency = 60 s', 'the pick's 58.33 s is 3%
under the 1 min budget'); its note 'a tight latency budget forces time at 2-4 bits' came with static 8 under a budget
that covered it."""

import json
import re

import pytest

from cli_util import one_line_error, run_cli

UNIT = re.compile(r"\b\d[\d.e+-]* (d|h|min|s|ms|GJ|MJ|kJ|J|mJ)\b")


def _units(text: str) -> set[str]:
    return {m.group(1) for m in UNIT.finditer(text)}


def _plan(tmp_path, *args):
    r = run_cli("plan", *args, "--out", tmp_path / "plan.json", "--force")
    return r


def test_a_margin_says_the_pick_and_the_budget_in_one_unit():
    from cptsim.planner.budget import format_quantities, parse_budget, time_margin

    b = parse_budget("1min")
    m = time_margin(b, 58.33, b.value, {"checked": False})
    assert m["text"].startswith("the pick's 58.33 s is 3% under the 60 s budget")
    rel = parse_budget("60%", "latency")
    m = time_margin(rel, 3500.0, 3700.0, {"checked": False})
    assert "the pick's 58.33 min is 5% under the 60% budget (61.67 min of modelled static-q_max time)" in m["text"]
    assert format_quantities("energy", 990.0, 1019.0) == ["990 J", "1019 J"]
    assert format_quantities("latency", 7200.0, 90000.0) == ["2 h", "25 h"]


def test_an_infeasible_budget_and_the_static_cost_are_said_in_one_unit(tmp_path):
    # digits-cnn over 33000 steps on an A100: static 4 costs 1.019 kJ, static 8 1.037 kJ
    line = one_line_error(_plan(tmp_path, "--budget", "990J", "--hw", "a100", "--steps", "33000"))
    head = line.split(";")[0]
    assert "(990 J of energy on a100)" in head and "costs 1019 J" in head and _units(head) == {"J"}
    # static 8 over 31500 steps costs 990 J: a 1 kJ budget covers it, said in joules both
    r = _plan(tmp_path, "--budget", "1kJ", "--hw", "a100", "--steps", "31500", "--json")
    assert r.exit_code == 0, r.output
    (note,) = [n for n in json.loads(r.stdout)["notes"] if "covers the static-8 cost" in n]
    assert note.startswith("the budget (1000 J) covers the static-8 cost (9") and _units(note) == {"J"}


def test_plans_title_and_margin_agree_and_an_absolute_budget_is_not_said_twice(tmp_path):
    r = _plan(tmp_path, "--budget", "99.5%", "--metric", "latency", "--hw", "a100", "--steps", "400000")
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    title = text.split("# schedule")[0]
    margin = text.split("budget margin: ")[1].split(";")[0]
    assert _units(title) == _units(margin) == {"min"}, (title, margin)
    r = _plan(tmp_path, "--budget", "20s", "--hw", "a100", "--steps", "100000")
    text = " ".join(r.stdout.split())
    assert "budget 20 s of latency #" in text and "budget 20 s of latency =" not in text


def _forces(doc) -> list[str]:
    return [n for n in doc["notes"] if "falls in steps" in n and "forces time at" in n]


@pytest.mark.parametrize("budget, forced", [("100%", False), ("99.5%", True)])
def test_the_note_that_a_budget_forces_time_at_the_lowest_widths_comes_only_when_it_does(budget, forced, tmp_path):
    """The truth by a second plan: the same budget over a space whose q_min stays above the lowest level (int4 on an
    A100: 2-4 bits) is feasible exactly when nothing forces time there."""
    r = _plan(tmp_path, "--budget", budget, "--metric", "latency", "--hw", "a100", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert any("falls in steps" in n and "only steps at <= 4 bits reach the lowest level" in n for n in doc["notes"])
    assert bool(_forces(doc)) == forced
    above = _plan(tmp_path, "--budget", budget, "--metric", "latency", "--hw", "a100", "--q-min", "5-8", "--json")
    assert (above.exit_code == 2) == forced, above.output

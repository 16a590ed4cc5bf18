"""A schedule whose cycles are shorter than its widths aliases, and cost, plan and train say so.

`cptsim train --steps 40` with the default cos-rep:3-8:g8:n32 (1.25 steps a cycle) ran 3, 8, 6, 5, 3, 3, 8, ...;
cpt:3-8:n1000 over 20 steps ran every step at 3 bits; nothing said so. The rule (``aliasing``) is checked here against
the bits themselves: each cycle's steps and the widths they visit, counted from ``Schedule.bits`` with the cycle of
step t taken from its definition, k = floor(t·n / T)."""

import json
from collections import defaultdict

import pytest

from cli_util import run_cli
from cptsim.cost.schedules import SCHEDULE_NAMES, aliasing, make_schedule, parse_schedule


def _cycles(sched, T) -> list[list[int]]:
    """The bits of each cycle, the cycle of step t being floor(t·n / T) (DESIGN's definition, in integers)."""
    by = defaultdict(list)
    for t, b in enumerate(sched.bits(T).tolist()):
        by[t * sched.cycles // T].append(b)
    return [by[k] for k in sorted(by)]


CYCLIC = [n for n in SCHEDULE_NAMES if n != "static"]
GRID = [(name, lo, hi, n, T) for name in CYCLIC for lo, hi in ((3, 8), (2, 4), (4, 5))
        for n in (1, 3, 8, 32) for T in (5, 12, 40, 97, 345)]


@pytest.mark.parametrize("name, lo, hi, n, T", GRID)
def test_a_schedule_aliases_exactly_when_a_cycle_has_fewer_steps_than_widths_and_then_one_misses_widths(
        name, lo, hi, n, T):
    s = make_schedule(name, lo, hi, 8, n)
    widths = hi - lo + 1
    cycles = _cycles(s, T)
    shortest = min(len(c) for c in cycles) if len(cycles) == n else 0  # a cycle without a step has none
    why = aliasing(s, T)
    assert (why is not None) == (shortest < widths), (why, shortest, widths)
    if why is not None:  # the cycle that is too short visits fewer widths than its range has: counted
        assert min(len(set(c)) for c in cycles) < widths
        assert f"{widths} forward widths {lo}-{hi}" in why and f"over {T} steps" in why
        # the count it suggests fits: that many cycles have at least `widths` steps each
        most = T // widths
        if most:
            assert f"at most n{most} " in why and aliasing(make_schedule(name, lo, hi, 8, most), T) is None
            assert aliasing(make_schedule(name, lo, hi, 8, most + 1), T) is not None


@pytest.mark.parametrize("name", ["cos-rep", "lin-rep", "cos-tri", "lin-tri"])
def test_a_gentle_shape_with_two_steps_a_width_visits_every_width_in_every_cycle(name):
    """Not aliasing is not a promise of every width at W steps a cycle (a cos cycle of 6 steps on 3-8 skips 5:
    0.5(1 - cos(pi·3/6))·5 + 3 = 5.5 rounds to 6); at 2W steps a gentle shape lands on each of them."""
    for lo, hi, n in ((3, 8, 4), (2, 4, 8), (2, 8, 3)):
        T = 2 * (hi - lo + 1) * n
        s = make_schedule(name, lo, hi, 8, n)
        assert aliasing(s, T) is None
        assert all(set(c) == set(range(lo, hi + 1)) for c in _cycles(s, T))
    assert set(parse_schedule("cpt:3-8:n1").bits(6).tolist()) == {3, 4, 6, 7, 8}  # the docstring's case


def test_the_issues_two_runs():
    s = parse_schedule("cos-rep:3-8:g8:n32")
    assert s.bits(40).tolist()[:7] == [3, 8, 6, 5, 3, 3, 8]
    assert "1.25 steps a cycle" in aliasing(s, 40) and aliasing(s, 345) is None  # the default 15-epoch run: 10.8
    s = parse_schedule("cpt:3-8:n1000")
    assert set(s.bits(20).tolist()) == {3} and "0.02 steps a cycle" in aliasing(s, 20)


def test_gradient_ranges_count_and_single_widths_never_alias():
    s = make_schedule("cos-rep", 6, 8, "2-8", 8)  # forward 3 widths, gradient 7: the gradient's decide
    assert "7 gradient widths 2-8" in aliasing(s, 40) and aliasing(s, 56) is None
    assert len(set(s.grad_bits(40).tolist()[:5])) < 7
    assert aliasing(make_schedule("cos-rep", 5, 5, 8, 1000), 10) is None
    assert aliasing(parse_schedule("static:4"), 1) is None


# -- the three commands


def test_cost_warns_in_one_line_and_in_its_json():
    r = run_cli("cost", "--steps", "40", "--hw", "bitfusion")
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(lines) == 1 and "cos-rep:3-8:g8:n32 over 40 steps aliases" in lines[0]
    r = run_cli("cost", "--steps", "40", "--hw", "bitfusion", "--json")
    assert any("over 40 steps aliases" in w for w in json.loads(r.stdout)["warnings"])
    r = run_cli("cost", "--steps", "400", "--hw", "bitfusion", "--json")
    assert json.loads(r.stdout)["warnings"] == []


@pytest.mark.parametrize("cycles, aliases", [("64", True), ("8", False)])
def test_plan_notes_a_pick_that_aliases(cycles, aliases, tmp_path):
    r = run_cli("plan", "--budget", "70%", "--steps", "100", "--schedules", "cos-rep", "--q-min", "3", "--q-max", "8",
                "--cycles", cycles, "--out", tmp_path / "plan.json", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    notes = [n for n in doc["notes"] if "aliases" in n]
    assert bool(notes) == aliases
    if aliases:
        assert doc["schedule"]["text"] == "cos-rep:3-8:g8:n64" and "1.56 steps a cycle" in notes[0]


def test_train_warns_before_it_trains(tmp_path):
    r = run_cli("train", "--steps", "6", "--schedule", "cpt:3-8:n8", "--out", tmp_path / "run", "--json")
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert lines == [f"warning: {aliasing(parse_schedule('cpt:3-8:n8'), 6)}"]

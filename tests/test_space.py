"""The planner's search space: candidates, constraints, CLI text, and the errors that name their cause."""

import pytest

from cptsim.errors import InputError
from cptsim.planner.space import SearchSpace, parse_space
from cptsim.cost.schedules import SCHEDULE_NAMES, Schedule


def test_default_space_counts_every_valid_candidate_once():
    cands = SearchSpace().candidates()
    # 20 (q_min < q_max) pairs x 10 cyclic schedules x 7 cycle counts, plus static at every width 2..8
    assert len(cands) == 20 * 10 * 7 + 7 == 1407
    assert len(set(cands)) == len(cands)
    assert {c.name for c in cands} == set(SCHEDULE_NAMES)
    assert all(isinstance(c, Schedule) for c in cands)
    assert all(c.q_min < c.q_max for c in cands if c.name != "static")
    assert sorted(c.q_max for c in cands if c.name == "static") == [2, 3, 4, 5, 6, 7, 8]
    assert all((c.g_min, c.g_max) == (8, 8) for c in cands)


def test_static_offers_every_width_in_range_and_ignores_cycles():
    s = SearchSpace(schedules=("static",), cycles=(1, 8, 32), q_min_range=(2, 6), q_max_range=(8, 8))
    assert [c.to_text() for c in s.candidates()] == [f"static:{q}:g8" for q in range(2, 9)]
    assert [c.to_text() for c in s.with_min_bits(5).candidates()] == [f"static:{q}:g8" for q in range(5, 9)]


def test_static_with_a_gradient_range_runs_at_its_top():
    s = SearchSpace(schedules=("static", "cpt"), q_min_range=(3, 3), q_max_range=(8, 8), cycles=(32,),
                    g_bits=((8, 8), (6, 8)))
    assert [c.to_text() for c in s.candidates()] == [f"static:{q}:g8" for q in range(3, 9)] + [
        "cos-rep:3-8:g8:n32", "cos-rep:3-8:g6-8:n32"]


def test_constraints_bound_q_min_and_q_max():
    s = SearchSpace(min_bits=4, max_bits=6)
    cands = s.candidates()
    assert cands and all(c.q_min >= 4 and c.q_max <= 6 for c in cands)
    assert sorted({(c.q_min, c.q_max) for c in cands if c.name != "static"}) == [(4, 5), (4, 6), (5, 6)]
    assert s.with_min_bits(5).size() < s.size()


def test_parse_space_reads_the_cli_text():
    s = parse_space("cpt, rex-rep,cos-rep,static", "1,2,4-6", "2-6", "6-8", "8,6-8", None, "7")
    assert s.schedules == ("cos-rep", "rex-rep", "static")  # alias resolved, duplicate dropped
    assert s.cycles == (1, 2, 4, 5, 6)
    assert (s.q_min_range, s.q_max_range, s.g_bits, s.max_bits) == ((2, 6), (6, 8), ((8, 8), (6, 8)), 7)
    assert parse_space(schedules="all").schedules == SCHEDULE_NAMES
    assert parse_space(q_min="3").q_min_range == (3, 3)
    assert parse_space() == SearchSpace()


def test_min_bits_auto_is_a_marker_resolved_later():
    s = parse_space(min_bits="auto")
    assert s.min_bits_auto and s.min_bits is None
    r = s.with_min_bits(4)
    assert not r.min_bits_auto and r.min_bits == 4
    assert parse_space(min_bits="5").min_bits == 5


def test_json_round_trip():
    s = parse_space("cpt,static", "4,8", "3-5", "8", "8,6-8", "auto", 8)
    d = s.to_json()
    assert SearchSpace.from_json(d) == s
    assert d["g_bits"] == [[8, 8], [6, 8]] and d["min_bits_auto"] is True


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(schedules="cosine,rex-rep"), "valid: static, cos-rep (alias cpt)"),
        (dict(schedules=","), "empty item"),
        (dict(q_min="6-2"), "greater than"),
        (dict(q_max="4-17"), "outside 1..16"),
        (dict(q_min="0"), "outside 1..16"),
        (dict(q_max="x"), "N or LOW-HIGH"),
        (dict(cycles="0,4"), "start at 1"),
        (dict(cycles="8-2"), "greater than"),
        (dict(cycles="two"), "not a count"),
        (dict(g_bits="8-6"), "greater than"),
        (dict(g_bits="20"), "outside 1..16"),
        (dict(min_bits="7", max_bits="5"), "--min-bits 7 is greater than --max-bits 5"),
        (dict(min_bits="seven"), "auto"),
        (dict(max_bits="0"), "outside 1..16"),
        # constraints that leave nothing say which one did it
        (dict(schedules="cpt,rex-rep", max_bits="3"), "--max-bits 3 leaves no candidate"),
        (dict(schedules="cpt", min_bits="8"), "--min-bits 8 leaves no candidate"),
        (dict(min_bits="9"), "--min-bits 9 leaves no candidate"),
        (dict(schedules="cpt", min_bits="6", max_bits="6"), "--min-bits 6 together with --max-bits 6"),
        (dict(schedules="cpt,rex-rep", q_min="7-8", q_max="4-6"), "q_min must not exceed q_max"),
        (dict(cycles="1-300000"), "too large"),
    ],
)
def test_bad_space_is_one_line_input_error(kwargs, needle):
    with pytest.raises(InputError) as e:
        parse_space(**kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_from_json_rejects_malformed_input():
    with pytest.raises(InputError):
        SearchSpace.from_json([1, 2])
    with pytest.raises(InputError):
        SearchSpace.from_json({"q_min_range": [2]})
    with pytest.raises(InputError):
        SearchSpace.from_json({"schedules": "cpt"})


def test_candidates_are_the_schedules_the_validating_constructor_builds():
    # candidates() skips per-candidate validation (the space checked its ranges); the result must be identical
    from cptsim.cost.schedules import Schedule

    for space in (SearchSpace(), SearchSpace(g_bits=((6, 8), 8, 32), cycles=(1, 3, 7), q_min_range=(1, 5))):
        for s in space.candidates():
            assert s == Schedule(**s.to_json()) and hash(s) == hash(Schedule(**s.to_json()))

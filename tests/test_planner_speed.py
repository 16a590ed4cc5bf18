"""The planner's vectorised paths against independent truths: every candidate's steps by kind as the fast path
counts them (``Candidates.step_kinds``, which ``select`` hands to ``cost.estimate``) are the histogram of its
materialised bits; the cyclic-gradient candidates, evaluated together, cost what ``cost.estimate`` says and score
what their bits score; and ``Candidates.index`` finds what a search of the list finds."""

from dataclasses import replace

import numpy as np
import pytest

from cptsim.cost.model import bits_histogram
from cptsim.planner.evaluate import COST_KEYS, evaluate
from cptsim.planner.score import score_bits
from cptsim.planner.space import SearchSpace, parse_space
from cptsim.planner.workload import Workload
from cptsim.cost.schedules import Schedule


@pytest.fixture(scope="module")
def workload():
    return Workload.build()  # digits-cnn, 345 steps, ragged last batch of every epoch


def _workloads(w):
    return {"digits": w,
            "odd": replace(w, steps=1001, batch_size=50, dataset_size=333),       # 7 steps/epoch, last batch 33
            "full-batches": replace(w, steps=640, batch_size=64, dataset_size=64 * 40),
            "long": replace(w, steps=7919)}


SPACES = {
    "default": SearchSpace(),
    "large": parse_space(cycles="1-64", g_bits="6-8"),                  # issue 13's 10x space
    "mixed": parse_space(cycles="1-9,31-33", g_bits="8,5-8,32,4-16", min_bits="3", max_bits="9", q_max="4-9"),
    "wide": parse_space(q_min="1-15", q_max="2-16", cycles="3,5,64", g_bits="2-16,16"),
}


@pytest.fixture(scope="module")
def bitfusion_roofline():
    """The bitfusion profile without its array table: the hardware only has to price the candidates here (the
    subject is their step kinds), and the roofline prices the wide spaces' hundreds of width pairs without a tiling
    search each (tests/test_array_model.py checks the array)."""
    from cptsim.cost.hardware import load_profile

    return load_profile("bitfusion").roofline()


def _check_every_candidate(w, space, hw, every=1, together=False):
    c = evaluate(w, hw, space)
    if together:  # as select counts them: many candidates in one pass
        c.count_step_kinds(range(0, len(c), every))
    for i in range(0, len(c), every):
        s = c.schedules[i]
        ref = bits_histogram(s.bits(w.steps), s.grad_bits(w.steps), w.batch_size, w.dataset_size)
        got = c.step_kinds(i)
        for a, b in zip(ref, got):
            assert a.dtype == b.dtype and np.array_equal(a, b), (s, w.steps, ref, got)


@pytest.mark.parametrize("space", ["default", "mixed", "wide"])
@pytest.mark.parametrize("wl", ["digits", "odd", "full-batches", "long"])
def test_fast_step_kinds_are_the_histogram_of_the_bits_for_every_candidate(workload, bitfusion_roofline, wl, space):
    _check_every_candidate(_workloads(workload)[wl], SPACES[space], bitfusion_roofline, together=wl == "odd")


@pytest.mark.parametrize("wl", ["digits", "odd"])
def test_fast_step_kinds_of_the_large_space(workload, bitfusion_roofline, wl):
    _check_every_candidate(_workloads(workload)[wl], SPACES["large"], bitfusion_roofline,
                           every=3 if wl == "digits" else 7, together=True)


def test_cyclic_gradient_candidates_cost_and_score_what_their_bits_do(workload):
    w = _workloads(workload)["odd"]
    c = evaluate(w, "int8-systolic", SPACES["large"])
    rng = np.random.default_rng(5)
    for i in rng.choice(len(c), 150, replace=False):
        s = c.schedules[i]
        est = w.estimate(s, c.hardware)  # from the schedule's own bits
        for key in COST_KEYS.values():
            assert c.cost[key][i] == pytest.approx(getattr(est, key)["total"], rel=1e-9), (s, key)
        q, g = s.bits(w.steps), s.grad_bits(w.steps)
        assert c.mean_bits[i] == pytest.approx(q.mean(), abs=1e-12)
        assert c.score[i] == pytest.approx(score_bits(q, g), abs=1e-12)


@pytest.mark.parametrize("space", [*SPACES.values(), SearchSpace(min_bits=8), SearchSpace(schedules=("static",)),
                                   SearchSpace(schedules=("cos-rep", "static"), g_bits=((6, 8), (8, 8), 7)),
                                   SearchSpace(schedules=("rex-tri-h",), cycles=(5,), q_min_range=(4, 4))])
def test_the_candidate_table_lists_the_candidates(space):
    from cptsim.planner.space import CandidateList

    names, table = space.candidate_table()
    got = CandidateList(names, table)
    want = space.candidates()
    assert len(got) == len(want) and list(got) == want and got.take(range(0, len(want), 3)) == want[::3]
    assert got[len(want) - 1] == want[-1] and got[np.int64(0)] == want[0] and got[1:4] == want[1:4]


def test_index_finds_what_a_search_of_the_list_finds(workload, bitfusion_roofline):
    c = evaluate(workload, bitfusion_roofline, SPACES["mixed"])
    first = {}  # the truth by a plain scan of the list: each schedule's first position (one pass, not one per query)
    for j, s in enumerate(c.schedules):
        first.setdefault(s, j)
    for i in range(0, len(c), 37):
        assert c.index(c.schedules[i]) == first[c.schedules[i]]
    assert c.index(Schedule("cos-rep", 3, 8, 8, 8, 10)) is None          # 10 cycles: not in the space
    assert c.index(Schedule("static", 2, 2, 8, 8, 1)) is None            # below --min-bits 3
    c2 = evaluate(workload, bitfusion_roofline, SearchSpace(schedules=("cos-rep",), cycles=(4,)))
    assert c2.index(Schedule("static", 8, 8, 8, 8, 1)) is None           # a name the space does not hold


def test_step_costs_are_kept_per_hardware_and_profile(workload):
    from cptsim.cost.hardware import load_profile

    w = replace(workload)
    a, b = load_profile("bitfusion"), load_profile("h100")
    assert w.step_costs(a) is w.step_costs(a) and w.step_costs(a) is not w.step_costs(b)
    old = w.step_costs(a)
    w.profile = type(w.profile).from_json(w.profile.to_json())
    assert w.step_costs(a) is not old and w.step_costs(a).source is w.profile

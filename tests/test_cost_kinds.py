"""The cost model's shortcuts change no number: a schedule's histogram of step kinds from its per-position tables
is the histogram of its materialised bits, and one-step costs shared between estimates (``StepCosts``) give the
estimate a fresh computation gives."""

import json

import numpy as np
import pytest

from cptsim.cost import model as cost
from cptsim.cost.model import StepCosts, bits_histogram, estimate
from cptsim.cost.hardware import load_profile
from cptsim.planner.workload import Workload
from cptsim.cost.schedules import SCHEDULE_NAMES, Schedule


def _schedules():
    out = []
    for name in SCHEDULE_NAMES:
        for q in ((3, 8), (2, 4), (5, 5), (1, 16)):
            for g in ((8, 8), (6, 8), (4, 16), (32, 32)):
                for n in (1, 2, 3, 7, 8, 64):
                    if name == "static" and (q[0] != q[1] or n != 1 or g[0] != g[1]):
                        continue
                    out.append(Schedule(name, q[0], q[1], g[0], g[1], n))
    return out


SCHEDULES = _schedules()


@pytest.mark.parametrize("steps,batch,dataset", [
    (1, 64, None), (5, 10, 5), (345, 64, 1437), (1001, 50, 333), (640, 64, 64 * 40), (7919, 64, None),
    (64000, 128, 50000)])
def test_schedule_histogram_is_the_histogram_of_its_bits(steps, batch, dataset):
    for s in SCHEDULES:
        ref = bits_histogram(s.bits(steps), s.grad_bits(steps), batch, dataset)
        cost._schedule_hist.cache_clear()
        h = cost._schedule_hist(s, steps, batch, dataset)
        for a, b in zip(ref, (h.q, h.g, h.samples, h.count)):
            assert a.dtype == b.dtype and np.array_equal(a, b), (s, steps, batch, dataset)


def test_step_kinds_counts_and_keys_at_steps_are_those_of_the_bits():
    def key(q, g):
        return q * 33 + g

    rng = np.random.default_rng(0)
    for s in SCHEDULES:
        for T in (97, 1000, 4096):
            at = rng.integers(0, T, 50)
            counts, keys = s.step_kinds(T, key, 33 * 33, at)
            k = key(s.bits(T), s.grad_bits(T))
            assert np.array_equal(counts, np.bincount(k, minlength=33 * 33)), (s, T)
            assert np.array_equal(keys, k[at]), (s, T)


@pytest.fixture(scope="module")
def workload():
    return Workload.build()


def _doc(c):
    return json.dumps(c.to_json(), sort_keys=True)  # floats by repr: equal documents mean equal bits


@pytest.mark.parametrize("hw", [None, "bitfusion", "h100", "a100", "host", "int8-systolic", "stripes"])
def test_shared_step_costs_give_the_estimate_of_a_fresh_computation(workload, hw):
    hw = load_profile(hw) if hw else None
    shared = StepCosts(workload.profile, hw)
    rng = np.random.default_rng(3)
    for i in rng.choice(len(SCHEDULES), 40, replace=False):
        s = SCHEDULES[i]
        for static_bits in (None, 16):
            kw = dict(steps=workload.steps, batch_size=workload.batch_size, dataset_size=workload.dataset_size,
                      static_bits=static_bits)
            fresh = estimate(workload.profile, s, hw, **kw)
            assert _doc(estimate(workload.profile, s, hw, step_costs=shared, **kw)) == _doc(fresh), s
            kinds = bits_histogram(s.bits(workload.steps), s.grad_bits(workload.steps), workload.batch_size,
                                   workload.dataset_size)
            assert _doc(estimate(workload.profile, s, hw, step_kinds=kinds, **kw)) == _doc(fresh), s


@pytest.mark.parametrize("hw", [None, "bitfusion", "h100", "host"])
def test_estimate_totals_are_the_totals_of_estimate(workload, hw):
    from cptsim.cost.model import estimate_totals

    hw = load_profile(hw) if hw else None
    shared = StepCosts(workload.profile, hw)
    for s in SCHEDULES[::7]:
        kw = dict(steps=workload.steps, batch_size=workload.batch_size, dataset_size=workload.dataset_size)
        full = estimate(workload.profile, s, hw, **kw)
        want = {k: None if getattr(full, k) is None else getattr(full, k)["total"]
                for k in ("bitops", "energy_j", "latency_s")}
        assert estimate_totals(workload.profile, s, hw, **kw) == want, s
        assert estimate_totals(workload.profile, s, hw, step_costs=shared, **kw) == want, s


def test_step_costs_of_another_profile_or_hardware_are_refused(workload):
    shared = StepCosts(workload.profile, load_profile("bitfusion"))
    s = Schedule("cos-rep", 3, 8, 8, 8, 4)
    with pytest.raises(ValueError):
        estimate(workload.profile, s, load_profile("h100"), steps=100, batch_size=64, step_costs=shared)
    with pytest.raises(ValueError):
        estimate(workload.profile.to_json(), s, shared.hardware, steps=100, batch_size=64, step_costs=shared)
    kinds = bits_histogram(s.bits(100), s.grad_bits(100), 64)
    with pytest.raises(ValueError):
        estimate(workload.profile, s, None, steps=101, batch_size=64, step_kinds=kinds)

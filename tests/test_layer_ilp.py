"""The per-layer MILP (planner/perlayer.py) against independent truths: HAWQ-V3's published ResNet-18 ILP and its
published bit configuration, and brute force on small random instances (issue 27)."""

import numpy as np
import pytest

from cptsim.planner.perlayer import brute_force, plan_layers, resnet_ties, solve

# HAWQ-V3 (Yao et al., ICML 2021), github.com/Zhen-Dong/HAWQ, ILP.ipynb ("ResNet18" cells): per-layer Hessian trace
# (normalised by parameter count), ||W - Q8(W)||^2, ||W - Q4(W)||^2 and BOPs of the 19 layers the ILP assigns
# (18 layers less the first and last, plus 3 residual downsample convs), with the ties x4=x6, x9=x11, x14=x16.
HUTCHINSON_TRACE = [0.06857826, 0.03162379, 0.03298575, 0.01205663, 0.02222431, 0.00596336, 0.06931772, 0.00807129,
                    0.00372905, 0.00530698, 0.00209011, 0.00737569, 0.00210454, 0.00151197, 0.00158041, 0.00078146,
                    0.00451841, 0.00098745, 0.00072944]
DELTA_W8_SQ = [0.0235, 0.0125, 0.0102, 0.0082, 0.0145, 0.0344, 0.0023, 0.0287, 0.0148, 0.0333, 0.0682, 0.0027,
               0.0448, 0.0336, 0.0576, 0.1130, 0.0102, 0.0947, 0.0532]
DELTA_W4_SQ = [6.7430, 3.9691, 3.3281, 2.6796, 4.7277, 10.5966, 0.6827, 9.0942, 4.8857, 10.7599, 21.7546, 0.8603,
               14.5324, 10.9651, 18.7706, 36.4044, 3.1572, 29.6994, 17.4016]
BOPS = [115605504, 115605504, 115605504, 115605504, 57802752, 115605504, 6422528, 115605504, 115605504, 57802752,
        115605504, 6422528, 115605504, 115605504, 57802752, 115605504, 6422528, 115605504, 115605504]
HAWQ_TIES = [(4, 6), (9, 11), (14, 16)]
# HAWQ's bit_config.py, "bit_config_resnet18_bops_0.5": the weight bits of stage{1..4}.unit{1,2}.quant_convbn{1,2}
# and quant_identity_convbn, in the ILP's layer order
HAWQ_BOPS_05 = [8, 8, 8, 4, 8, 8, 8, 8, 4, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4]


def test_hawq_v3_resnet18_bops_half_gives_the_published_bit_config():
    trace, d8, d4 = map(np.array, (HUTCHINSON_TRACE, DELTA_W8_SQ, DELTA_W4_SQ))
    bops = np.array(BOPS) / 1e6
    b4, b8 = bops / 64, bops / 16  # HAWQ: bops / 8 / 8 and bops / 4 / 4
    limit = b4.sum() + (b8.sum() - b4.sum()) * 0.5  # lambda = 0.5
    # options (4 bits, 8 bits); value = minus the perturbation Omega = trace * ||W - Q(W)||^2
    value = -np.stack([trace * d4, trace * d8], axis=1)
    cost = np.stack([b4, b8], axis=1)
    sol = solve(value, cost, limit, ties=HAWQ_TIES)
    assert sol.status == "optimal" and sol.gap == pytest.approx(0, abs=1e-9)
    assert [(4, 8)[c] for c in sol.choice] == HAWQ_BOPS_05
    assert sol.cost <= limit
    assert np.array_equal(brute_force(value, cost, limit, ties=HAWQ_TIES).choice, sol.choice)


@pytest.mark.parametrize("seed", range(12))
def test_the_milp_agrees_with_brute_force_on_small_random_instances(seed):
    rng = np.random.default_rng(seed)
    L, M = int(rng.integers(2, 7)), int(rng.integers(2, 4))
    value = rng.random((L, M))
    cost = rng.random((L, M)) * 10
    allowed = rng.random((L, M)) > 0.15
    allowed[:, 0] = True
    ties = [tuple(rng.choice(L, 2, replace=False))] if L > 3 and seed % 2 else []
    lo = sum(cost[i][allowed[i]].min() for i in range(L))
    budget = lo + rng.random() * (cost.sum() / M - lo + 5)
    ref = brute_force(value, cost, budget, ties=ties, allowed=allowed)
    got = solve(value, cost, budget, ties=ties, allowed=allowed)
    assert got.status == ref.status
    if ref.status == "optimal":
        assert got.value == pytest.approx(ref.value, abs=1e-7)  # the optimum (the argmax may tie)
        assert got.cost <= budget * (1 + 1e-9)
        for a, b in ties:
            assert got.choice[a] == got.choice[b]
        assert allowed[np.arange(L), got.choice].all()


def test_resnet_ties_pair_each_downsample_with_its_blocks_first_conv():
    names = ["conv1", "layer2.0.conv1", "layer2.0.conv2", "layer2.0.downsample.0", "layer3.0.conv1",
             "layer3.0.shortcut"]
    assert resnet_ties(names) == [["layer2.0.conv1", "layer2.0.downsample.0"], ["layer3.0.conv1", "layer3.0.shortcut"]]


def test_a_per_layer_plan_on_digits_fits_the_budget_exactly_as_costed_and_never_scores_below_uniform():
    from cptsim.cost.model import estimate
    from cptsim.cost.schedules import parse_schedule
    from cptsim.planner.workload import Workload

    w = Workload.build("digits-cnn", steps=60)
    base = parse_schedule("cpt:3-6:n4")
    full = w.estimate(base, "bitfusion").energy_j["total"]
    lp = plan_layers(w, "bitfusion", base, "energy", 0.9 * full,
                     weights={"features.0": 5.0, "features.3": 1.0, "features.7": 1.0})
    again = estimate(w.profile, base, "bitfusion", steps=60, batch_size=w.batch_size,
                     dataset_size=w.dataset_size, layers=lp.resolved)
    assert again.energy_j["total"] == pytest.approx(lp.cost, rel=1e-12) and lp.cost <= 0.9 * full
    assert lp.solution.status == "optimal"
    # the sensitive first layer keeps at least the bits of the others
    assert lp.offsets["features.0"] >= max(lp.offsets["features.3"], lp.offsets["features.7"])
    # with the whole budget, keeping the base everywhere is feasible: the plan scores at least the uniform one
    lp2 = plan_layers(w, "bitfusion", base, "energy", full)
    assert lp2.score >= lp2.uniform_score - 1e-12

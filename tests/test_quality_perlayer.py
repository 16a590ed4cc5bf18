"""--quality db learns from measured per-layer runs (issue 27): a per-layer run's features are its plan's, computed
here by hand; a model fitted to synthetic rows drawn from a known monotone function of uniform and per-layer plans
recovers its ranking; and the per-layer refinement ranks its plans by the model's prediction, not the proxy's."""

from __future__ import annotations

import numpy as np
import pytest

from cptsim.cost.schedules import parse_schedule
from cptsim.planner.score import score_bits
from cptsim.study.evidence import LocalEvidence

T = 20  # steps: inside the first epoch of digits (23 steps, the last one ragged), so every step has 64 samples


@pytest.fixture(scope="module")
def w():
    from cptsim.planner import Workload

    return Workload.build("digits-cnn", steps=T)


def _hand(w, base: str, own: dict, floor: int, weights=None):
    """The four features by hand: digits-cnn's quantized layers features.0/.3/.7, each layer's bits (``own`` or the
    base schedule's), weighted by its forward MACs; BitOPs = sum over steps of M_fwd q q + M_dgrad g q + M_wgrad g q
    (batch 64), the FP32 classifier at 32 x 32, over the baseline static 4 (g8: the space's highest)."""
    a = w.profile.arrays()
    s = parse_schedule(base)
    g = s.grad_bits(T)
    bits = {n: parse_schedule(own[n]).bits(T) if n in own else s.bits(T) for n in ("features.0", "features.3",
                                                                                     "features.7")}
    macs = dict(zip(a.names, a.macs * 64))
    m = np.array([macs[n][0] for n in bits]) if weights is None else np.array([weights[n] for n in bits])
    wt = m / m.sum()
    Q = np.array(list(bits.values()))
    bitops = sum((macs[n][0] * q * q + macs[n][1] * g * q + macs[n][2] * g * q).sum() for n, q in bits.items())
    bitops += macs["fc"].sum() * 32 * 32 * T
    base_ops = sum(macs[n][0] * 16 + macs[n][1] * 32 + macs[n][2] * 32 for n in bits) * T + macs["fc"].sum() * 1024 * T
    return (float(wt @ np.array([score_bits(q, g) for q in Q])), float(wt @ Q.mean(axis=1)), bitops / base_ops,
            float(wt @ (Q > floor).mean(axis=1)))


def test_a_per_layer_runs_features_are_its_plans_computed_by_hand(w):
    from cptsim.planner.quality import plan_bits

    base_ops = w.estimate(parse_schedule("static:4:g8"), None).bitops["total"]
    got = plan_bits(w, parse_schedule("cos-rep:2-4:g8:n2"), "features.3=2;features.0=4", base_ops).features(2)
    want = _hand(w, "cos-rep:2-4:g8:n2", {"features.3": "static:2:g8", "features.0": "static:4:g8"}, 2)
    assert got == pytest.approx(want, rel=1e-12)
    # a uniform schedule: its own score, mean bits and BitOPs, whatever the MAC weights
    s = parse_schedule("cos-rep:2-4:g8:n2")
    got = plan_bits(w, s, None, base_ops).features(2)
    q = s.bits(T)
    assert got == pytest.approx((score_bits(q, s.grad_bits(T)), q.mean(), w.estimate(s, None).bitops["total"]
                                 / base_ops, (q > 2).mean()), rel=1e-12)
    assert got == pytest.approx(_hand(w, "cos-rep:2-4:g8:n2", {}, 2), rel=1e-12)


# uniform schedules and per-layer plans at forward bits 2-4 (layer rules as a results row records them)
MEASURED = ["static:2:g8", "static:3:g8", "static:4:g8", "cos-rep:2-4:g8:n2", "lin-tri:2-4:g8:n1",
            "static:4:g8@features.3=2", "static:3:g8@features.7=2", "static:3:g8@features.0=2;features.3=4",
            "cos-rep:2-4:g8:n2@features.3=3-4", "static:2:g8@features.3=4"]


def _truth(f):
    """A known monotone function of the features: a cliff at the floor (2 bits), a slope in the mean bits."""
    return 0.70 + 0.20 * f[3] + 0.02 * f[1]


def _rows(w, entries, value_of, seeds=(0, 1, 2)):
    from cptsim.planner.quality import measured_workload
    from cptsim.study.results import workload_key

    wl = measured_workload(w)
    rows = []
    for e in entries:
        text, _, rules = e.partition("@")
        s = parse_schedule(text)
        for seed in seeds:
            rows.append({"workload_key": workload_key(wl), "workload": wl, "schedule": s.to_text(), "family": s.name,
                         "q_min": s.q_min, "q_max": s.q_max, "g_min": s.g_min, "g_max": s.g_max, "cycles": s.cycles,
                         "seed": seed, "steps": wl["steps"], "test_acc": 0.5, "val_acc": value_of(e, seed),
                         "val_size": 287, "source": "sweep", "run_path": f"/fake/{e}-{seed}",
                         "extra": {"layers": rules} if rules else {}})
    return rows


def test_quality_db_fits_per_layer_runs_and_recovers_a_known_monotone_ranking(w, tmp_path):
    from cptsim.planner import plan
    from cptsim.planner.space import parse_space
    from cptsim.study.results import ResultsDB

    base_ops = w.estimate(parse_schedule("static:4:g8"), None).bitops["total"]
    hand = {}
    for e in MEASURED:
        text, _, rules = e.partition("@")
        own = {r.split("=")[0]: (f"static:{r.split('=')[1]}:g8" if "-" not in r.split("=")[1] else
                                 f"cos-rep:{r.split('=')[1]}:g8:n2") for r in rules.split(";") if r}
        hand[e] = _hand(w, text, own, 2)
    rng = np.random.default_rng(0)
    noise = {(e, s): rng.normal(0, 0.002) for e in MEASURED for s in range(3)}
    db = tmp_path / "r.db"
    with ResultsDB(db) as r:
        for row in _rows(w, MEASURED, lambda e, s: _truth(hand[e]) + noise[(e, s)]):
            r.add_run(row)
    p = plan(w, "bitfusion", "70%", parse_space(None, None, "2", "2-4", "8", None, None), quality="db", db=str(db),
             evidence=LocalEvidence())
    q = p.quality
    assert p.ranking == "db" and q["runs"] == 30 and q["per_layer_runs"] == 15 and q["schedules"] == 10
    m = p.quality_model
    assert m.floor == 2 and m.n_schedules == 10
    X = np.array([hand[e] for e in MEASURED])
    assert np.allclose(np.column_stack([m.lo, m.hi]), np.column_stack([X.min(axis=0), X.max(axis=0)]), rtol=1e-12)
    from scipy.stats import spearmanr

    mean, _ = m.predict(X)
    truth = np.array([_truth(x) for x in X])
    assert spearmanr(mean, truth)[0] > 0.95 and np.max(np.abs(mean - truth)) < 0.01
    assert m.coef[4] > 0  # the cliff is what the truth weighs most, and the model sees it


SENSITIVITY = {"features.0": 8.0, "features.3": 1.0, "features.7": 1.0}  # as 'cptsim sensitivity' weights them


def test_with_a_sensitivity_the_refinement_refits_the_model_on_sensitivity_weighted_layers(w, tmp_path):
    """Measured quality that follows the sensitivity-weighted bits (the sensitive first layer matters, the big middle
    conv does not): the MAC-weighted model cannot see it, the refit that --per-layer --sensitivity makes
    (``perlayer._refit``) recovers it. Truth and features by hand."""
    from cptsim.planner import plan
    from cptsim.planner.perlayer import refine
    from cptsim.planner.space import parse_space
    from cptsim.study.results import ResultsDB
    from scipy.stats import spearmanr

    entries = MEASURED + ["static:2:g8@features.0=4", "static:3:g8@features.0=2", "cos-rep:2-4:g8:n2@features.0=4"]
    own = {e: {r.split("=")[0]: (f"static:{r.split('=')[1]}:g8" if "-" not in r.split("=")[1] else
                                 f"cos-rep:{r.split('=')[1]}:g8:n2") for r in e.partition("@")[2].split(";") if r}
           for e in entries}
    hand = {e: _hand(w, e.partition("@")[0], own[e], 2, SENSITIVITY) for e in entries}
    db = tmp_path / "r.db"
    with ResultsDB(db) as r:
        for row in _rows(w, entries, lambda e, s: _truth(hand[e]), seeds=(0, 1)):
            r.add_run(row)
    p = plan(w, "bitfusion", "70%", parse_space(None, None, "2", "2-4", "8", None, None), quality="db", db=str(db),
             evidence=LocalEvidence())
    refine(p, SENSITIVITY)
    pm = p.quality["per_layer_model"]
    assert pm["layers_weighted_by"] == "sensitivity" and pm["floor_bits"] == 2 and pm["schedules"] == len(entries)
    names = list(pm["coefficients"])
    X = np.array([hand[e] for e in entries])
    pred = pm["intercept"] + sum(pm["coefficients"][k] * (X[:, i] - pm["feature_mean"][k]) / pm["feature_std"][k]
                                 for i, k in enumerate(names))
    truth = np.array([_truth(x) for x in X])
    assert spearmanr(pred, truth)[0] > 0.95 and np.max(np.abs(pred - truth)) < 1e-6
    assert pm["loo_spearman"] > 0.9 and p.quality["loo_spearman"] < pm["loo_spearman"]


def test_the_per_layer_refinement_ranks_its_plans_by_the_quality_model(w):
    """The MILP's plans against the uniform choice: by the proxy score a per-layer plan wins. A quality model (made by
    hand, to make the ranking plain: it predicts minus the BitOPs) re-orders the plans inside its measured range by
    its prediction, so the cheapest plan of the pool wins; a plan outside the range keeps its proxy place and gets
    no prediction."""
    from cptsim.planner import plan
    from cptsim.planner.perlayer import refine
    from cptsim.planner.quality import QualityModel, plan_bits
    from cptsim.planner.space import parse_space

    p = plan(w, "bitfusion", "70%", parse_space(None, None, "2", "2-4", "8", None, None))
    lp, rows = refine(p)
    assert lp is not None and lp.ranked_by == "proxy" and lp.score > p.score and lp.predicted is None
    base_ops = float(p.baseline.bitops["total"])

    def model(lo, hi):
        return QualityModel(coef=np.array([0.0, 0, 0, -1.0, 0]), mu=np.zeros(4), sd=np.ones(4),
                            boot=np.zeros((2, 5)), seed_sd=0.0, n_runs=0, n_schedules=0, schedules=[],
                            loo_spearman=None, lo=lo, hi=hi, floor=2)

    p.quality_model, p.quality = model(np.full(4, -np.inf), np.full(4, np.inf)), {"source": "db"}
    got, rows = refine(p)
    cost = {r["base"]: r["per_layer_cost"] for r in rows if r["per_layer_cost"] is not None}
    uni = plan_bits(w, p.schedule, None, base_ops).features(2)
    assert p.quality["uniform_choice_prediction"]["predicted"] == pytest.approx(-uni[2])
    for r in rows:  # each plan's prediction: minus its BitOPs over the baseline's (the budget's metric here)
        if r["per_layer_cost"] is not None:
            assert r["predicted"] == pytest.approx(-r["per_layer_cost"] / base_ops, rel=1e-9)
    cheapest = min(cost, key=cost.get)
    assert got is not None and got.ranked_by == "db" and got.base.to_text() == cheapest != lp.base.to_text()
    # trusted only at the uniform choice's features: every plan is outside, keeps its proxy place, no prediction
    x = np.array(uni)
    p.quality_model = model(x, x)
    got, rows = refine(p)
    assert got.ranked_by == "proxy" and got.base == lp.base and got.resolved.layers == lp.resolved.layers
    assert got.predicted["extrapolated"] and got.predicted["predicted"] is None
    assert all(r["extrapolated"] for r in rows if r["per_layer_cost"] is not None)

"""`plan --per-layer` names what plan.json holds (the schedule and its layer rule, the per-layer plan's cost and
score), `train` says the layer rule it runs, and the per-layer MILP never picks a plan over its budget, even by the
solver's feasibility tolerance."""

import json
from fractions import Fraction

import numpy as np
import pytest

from cli_util import run_cli
from cptsim.planner.perlayer import brute_force, solve

# digits, 8 steps, a small space on Bit Fusion: the MILP moves the first conv up (features.0=+2)
PLAN = ["plan", "--budget", "60%", "--per-layer", "--steps", "8", "--hw", "bitfusion",
        "--schedules", "cos-tri,exp-tri-v,rex-tri-h"]


@pytest.fixture(scope="module")
def per_layer_plan(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    r = run_cli(*PLAN, "--out", out, "--quiet")
    assert r.exit_code == 0, (r.output, r.exception)
    doc = json.loads(out.read_text())
    assert isinstance(doc.get("layers"), dict) and doc["layers"]["rules"], "the case needs a per-layer plan"
    return out, doc, " ".join(r.stdout.split())


def test_the_summary_line_names_the_schedule_and_layer_rule_plan_json_holds(per_layer_plan):
    _, doc, text = per_layer_plan
    est = doc["estimate"]
    chosen = text.split("chosen: ")[1].split(" baseline ")[0]
    assert chosen.startswith(f"{doc['schedule']['text']} with layer rule {doc['layers']['text']}:"), chosen
    assert f"score {est['score']:.4f}" in chosen and f"{100 * est['budget_fraction']:.1f}% of the budget" in chosen
    assert est["score"] == doc["per_layer"]["score"]
    # the uniform pick is named as what it is, not as the choice
    uniform = next(a for a in doc["alternatives"] if a["role"] == "chosen")
    assert f"scored {uniform['score']:.4f}" in chosen


def test_plan_json_and_json_output_hold_the_per_layer_plans_figures_throughout(per_layer_plan, tmp_path):
    _, doc, _ = per_layer_plan
    r = run_cli(*PLAN, "--out", tmp_path / "again.json", "--json")
    assert r.exit_code == 0, r.output
    js = json.loads(r.stdout)
    assert (js["schedule"]["text"], js["layers"]["rules"]) == (doc["schedule"]["text"], doc["layers"]["rules"])
    est, base = doc["estimate"], doc["baseline"]
    # every figure is the per-layer plan's: its BitOPs against the baseline's, its schedule's bits
    assert est["vs_baseline"]["bitops"] == pytest.approx(est["bitops"]["total"] / base["bitops"]["total"])
    assert est["per_phase"]["energy_j"]["total"] == pytest.approx(est["energy_j"])
    from cptsim.cost.schedules import Schedule

    sched = Schedule.from_json(doc["schedule"])
    assert doc["evaluation"]["bits"] == sched.q_max
    assert est["mean_bits"] == pytest.approx(sched.bits(doc["workload"]["steps"]).mean())


def test_the_train_banner_names_the_plans_layer_rule(per_layer_plan, tmp_path):
    from shared_runs import cptsim_here

    plan, doc, _ = per_layer_plan
    # the banner comes before the first step; a ^C at step 0 ends the run there
    r = cptsim_here("train", "--plan", plan, "--out", tmp_path / "run", env_extra={"CPTSIM_FAULT_SIGINT_AT_STEP": "0"})
    assert r.exit_code == 130, (r.output, r.exception)
    banner = " ".join(r.stderr.split("->")[0].split())
    assert f"with {doc['schedule']['text']} and layer rule {doc['layers']['text']}" in banner, banner


def _overshooting_case(eps=1e-7):
    """Three layers, two options each; taking option 0 everywhere costs 1 + eps against a budget of 1. HiGHS accepts
    that (its feasibility tolerance is ~1e-6 of the row), so the solver alone returns a plan over the budget."""
    value = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    cost = np.array([[1 / 3 + eps, 0.0], [1 / 3, 0.0], [1 / 3, 0.0]])
    return value, cost, 1.0


def _exact_cost(cost, choice):
    return sum(Fraction(float(c)) for c in cost[np.arange(len(choice)), choice])


@pytest.mark.parametrize("eps", [1e-7, 5e-7, 1e-12])
def test_the_milp_choice_fits_the_budget_in_exact_arithmetic(eps):
    value, cost, budget = _overshooting_case(eps)
    got = solve(value, cost, budget)
    assert _exact_cost(cost, got.choice) <= budget
    # and it is the best choice that fits: brute force over the 8 choices, exactly
    best = max((sum(value[i, c] for i, c in enumerate(ch)), ch) for ch in np.ndindex(2, 2, 2)
               if _exact_cost(cost, np.array(ch)) <= budget)
    assert got.value == best[0]


def test_a_choice_the_solver_keeps_over_the_budget_is_repaired(monkeypatch):
    """A solver that returns the same over-budget choice however the row is tightened: the plan is repaired by the
    downgrade that loses least, and says so."""
    import scipy.optimize

    value, cost, budget = _overshooting_case()
    value = value * np.array([[3.0], [1.0], [2.0]])  # layer 1 is the cheapest to give up

    class Res:
        status, message, mip_gap = 0, "optimal", 0.0
        x = np.array([1.0, 0.0, 1.0, 0.0, 1.0, 0.0])

    monkeypatch.setattr(scipy.optimize, "milp", lambda *a, **k: Res())
    got = solve(value, cost, budget)
    assert _exact_cost(cost, got.choice) <= budget
    assert list(got.choice) == [0, 1, 0] and "repaired" in got.status
    assert got.value == brute_force(value, cost, budget * (1 - 1e-12)).value


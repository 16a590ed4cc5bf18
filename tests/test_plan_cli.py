"""`cptsim plan` end to end: the table and plan.json, the acceptance cases, exact execution by `cptsim train --plan`,
and bad input (plan flags and plan files) as one line with exit code 2."""

import json

import pytest

from cptsim.planner.planfile import read_plan
from cptsim.run.rundir import RunDir
from cli_util import one_line_error as _one_line_error
from cli_util import run_cli as _cli


@pytest.fixture(scope="module")
def default_plan(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan")
    r = _cli("plan", "--budget", "65%", "--out", d / "plan.json", "--plot", d / "plan.png", "--json")
    assert r.exit_code == 0, r.output
    return d, json.loads(r.stdout)


def test_help_prints_the_score_definition_and_the_budget_grammar():
    r = _cli("plan", "--help")
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    assert "early-weighted-fidelity/1" in text and "4^-(b-1)" in text and "Kyrillidis" in text
    assert "kWh" in text and "fraction of the static-q_max cost" in text and "--prefer-cyclic" in text


def test_65_percent_on_the_default_workload_uses_at_least_95_percent(default_plan):
    d, doc = default_plan
    assert doc == read_plan(d / "plan.json")  # --json prints exactly the file written
    assert doc["budget"] == {"metric": "bitops", "value": 0.65, "unit": "%", "spec": "65%"}
    est, base = doc["estimate"], doc["baseline"]
    assert 0.95 <= est["budget_fraction"] <= 1.0
    assert est["bitops"]["total"] <= 0.65 * base["bitops"]["total"] == pytest.approx(doc["budget_absolute"])
    assert est["relative_to_static"] == pytest.approx(est["bitops"]["total"] / base["bitops"]["total"])
    assert doc["workload"]["steps"] == 15 * 23 and doc["workload"]["dataset_size"] == 1437
    assert doc["hardware"]["name"] == "bitfusion" and doc["candidates"] == 1407
    assert doc["alternatives"][0]["role"] == "chosen" and doc["frontier"]["points"]
    assert (d / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_table_highlights_the_choice_and_states_the_budget_used(tmp_path):
    r = _cli("plan", "--budget", "65%", "--out", tmp_path / "p.json", "--top", "3")
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert ">1 exp-tri-v:5-8:g8:n1" in text and "% of the budget" in text and "baseline static:8:g8" in text
    assert "cptsim train --plan" in text


def test_an_existing_plan_file_is_not_overwritten_without_force(default_plan):
    d, _ = default_plan
    before = (d / "plan.json").read_text()
    msg = _one_line_error(_cli("plan", "--budget", "50%", "--out", d / "plan.json"))
    assert "--force" in msg and (d / "plan.json").read_text() == before
    r = _cli("plan", "--budget", "50%", "--out", d / "plan.json", "--force", "--quiet")
    assert r.exit_code == 0, r.output
    assert read_plan(d / "plan.json")["budget"]["spec"] == "50%"


def test_an_infeasible_budget_exits_2_with_the_cheapest_schedule(tmp_path):
    msg = _one_line_error(_cli("plan", "--budget", "5%", "--out", tmp_path / "p.json"))
    assert "cheapest candidate: static:2:g8 costs" in msg and "% of static 8" in msg  # every width is offered
    assert not (tmp_path / "p.json").exists()


def test_h100_latency_below_static_is_explained(tmp_path):
    msg = _one_line_error(_cli("plan", "--budget", "90%", "--metric", "latency", "--hw", "h100",
                               "--out", tmp_path / "p.json"))
    assert "h100" in msg and "int8" in msg and "does not fall with bits" in msg


def test_a_budget_above_static_plans_static_q_max_and_says_so(tmp_path):
    r = _cli("plan", "--budget", "1h", "--hw", "h100", "--out", tmp_path / "p.json", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schedule"]["text"] == "static:8:g8" and doc["budget"]["metric"] == "latency"
    assert any("covers the static-8 cost" in n for n in doc["notes"])
    assert any("int8" in n for n in doc["notes"])


def test_min_bits_auto_runs_the_range_test_and_records_it(tmp_path):
    # 2-step stages make the suggestion noise (rangetest's docstring): the budget covers whatever q_min it suggests
    r = _cli("plan", "--budget", "100%", "--min-bits", "auto", "--range-steps", "2", "--schedules", "cos-rep,static",
             "--cycles", "8", "--out", tmp_path / "p.json", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    q = doc["range_test"]["suggested_q_min"]
    assert doc["space"]["min_bits"] == q and doc["schedule"]["q_min"] >= q


def test_train_plan_executes_exactly_the_planned_bitops(tmp_path):
    plan_path = tmp_path / "p.json"
    r = _cli("plan", "--budget", "60%", "--epochs", "2", "--batch-size", "128", "--out", plan_path, "--quiet")
    assert r.exit_code == 0, r.output
    plan = read_plan(plan_path)
    assert plan["workload"]["steps"] == 2 * 12  # ceil(1437 / 128) = 12 steps per epoch, the last of 29 samples
    r = _cli("train", "--plan", plan_path, "--out", tmp_path / "run", "--quiet")
    assert r.exit_code == 0, r.output
    run = RunDir.open(tmp_path / "run")
    trace = run.read_trace().records
    assert len(trace) == 24 and sorted({t["batch_size"] for t in trace}) == [29, 128]
    for phase in ("fwd", "dgrad", "wgrad"):
        executed = sum(t["bitops"][phase] for t in trace)
        assert executed == int(plan["estimate"]["bitops"][phase]), phase
    assert run.read_json("plan.json") == plan


def test_train_warns_when_the_plans_hardware_changed(tmp_path):
    plan_path = tmp_path / "p.json"
    assert _cli("plan", "--budget", "60%", "--steps", "2", "--out", plan_path, "--quiet").exit_code == 0
    doc = json.loads(plan_path.read_text())
    doc["hardware"]["hash"] = "0" * 16
    plan_path.write_text(json.dumps(doc))
    r = _cli("train", "--plan", plan_path, "--out", tmp_path / "run", "--quiet")
    assert r.exit_code == 0, r.output
    assert "changed since the plan was made" in r.stderr


@pytest.mark.parametrize("args", [
    ("--budget", "65"),                              # no unit
    ("--budget", "65 parsecs"),                      # unknown unit
    ("--budget", "0%"),
    ("--budget", "-5%"),
    ("--budget", "65%", "--schedules", "cos-rep,nope"),
    ("--budget", "65%", "--q-min", "6-4"),           # min > max
    ("--budget", "65%", "--min-bits", "7", "--max-bits", "5"),
    ("--budget", "5kJ", "--metric", "latency"),      # unit contradicts metric
    ("--budget", "65%", "--metric", "speed"),
    ("--budget", "65%", "--pilot", "1"),
    ("--budget", "65%", "--top", "0"),
    ("--budget", "65%", "--hw", "no-such-hw"),
    ("--budget", "65%", "--epochs", "2", "--steps", "10"),
    ("--budget", "65%", "--out", "no/such/dir/plan.json"),
])
def test_bad_plan_input_exits_2_with_one_line(args, tmp_path):
    if "--out" not in args:
        args = (*args, "--out", tmp_path / "p.json")
    _one_line_error(_cli("plan", *args))


@pytest.mark.parametrize("content, words", [
    ("{not json", "not valid JSON"),
    (json.dumps({"format": "cptsim.plan/9"}), "not supported"),
    (json.dumps({"format": "cptsim.plan/1", "workload": {}}), "missing"),
    (json.dumps([1, 2]), "not a JSON object"),
])
def test_bad_plan_files_exit_2_with_one_line(tmp_path, content, words):
    p = tmp_path / "plan.json"
    p.write_text(content)
    msg = _one_line_error(_cli("train", "--plan", p, "--out", tmp_path / "run"))
    assert words in msg


def test_plan_says_how_sure_its_times_are_as_cost_does(default_plan):
    """Item 5 of issue 23: plan prints and records the profile's [validation] against this network's op mix; a
    profile with none (bitfusion) says so; a BitOPs budget has no time margin."""
    d, doc = default_plan
    v = doc["time_validation"]
    assert v["checked"] is False and "no [validation]" in v["note"]
    assert "budget_margin" not in doc


def test_a_time_budget_reports_the_picks_margin_against_the_profiles_error(tmp_path):
    r = _cli("plan", "--budget", "1h", "--hw", "h100", "--out", tmp_path / "a.json", "--json")
    assert r.exit_code == 0, r.output
    static = json.loads(r.stdout)["estimate"]["latency_s"]
    budget = 1.05 * static  # 4.8% over what the pick will cost
    r = _cli("plan", "--budget", f"{budget!r}s", "--hw", "h100", "--out", tmp_path / "p.json")
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    from cptsim.cost.hardware import load_profile

    med = load_profile("h100").validation["median_abs_error"]  # the file's (held-out) figure, as printed
    assert f"h100 time: median |error| {100 * med:.0f}%" in text and "its op mix was covered" in text
    assert "budget margin: the pick's" in text and "5% under the" in text
    doc = read_plan(tmp_path / "p.json")
    v, m = doc["time_validation"], doc["budget_margin"]
    assert v["checked"] and v["op_mix_covered"] and v["op_mix"] == ["conv"]
    assert doc["launch_bound"]["bound"] == "launch (host)"  # digits-cnn's tiny kernels, eager
    assert m["margin"] == pytest.approx(1 - doc["estimate"]["latency_s"] / budget)
    assert m["median_abs_error"] == v["median_abs_error"] and m["worst_abs_error"] == v["worst_abs_error"]
    assert m["verdict"] == ("within at worst error" if v["worst_abs_error"] <= m["margin"] else
                            "within at median error" if v["median_abs_error"] <= m["margin"] else
                            "margin under median error")


def test_a_time_budget_on_a_profile_never_checked_says_its_error_is_unknown(tmp_path):
    r = _cli("plan", "--budget", "1h", "--hw", "bitfusion", "--out", tmp_path / "p.json")
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "were never checked against measurements (no [validation])" in text  # printed as text, not markup
    m = read_plan(tmp_path / "p.json")["budget_margin"]
    assert m["verdict"] == "unknown error" and m["median_abs_error"] is None

"""Random and adversarial input at every parser: only InputError (CLI: exit 2 with one line), never a traceback."""

import json
import string
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cptsim.cli.main import cli
from cptsim.errors import InputError
from cptsim.cost.hardware import load_profile
from cptsim.planner.planfile import read_plan
from cptsim.run.rundir import RunDir
from cptsim.cost.schedules import parse_schedule

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

schedule_words = st.sampled_from(["cpt", "cos-rep", "rex-tri-h", "static", "lin-tri", "exp-tri-v", "x", ""])
schedule_parts = st.one_of(st.text(alphabet=string.digits + "-gn:", max_size=6),
                           st.integers(-5, 40).map(str), st.text(max_size=4))


@FAST
@given(schedule_words, st.lists(schedule_parts, max_size=4))
def test_schedule_text(name, parts):
    try:
        s = parse_schedule(":".join([name, *parts]))
    except InputError:
        return
    assert parse_schedule(s.to_text()) == s


@FAST
@given(st.text(max_size=40))
def test_schedule_text_any_string(text):
    try:
        parse_schedule(text)
    except InputError:
        pass


H100 = (Path(__file__).resolve().parents[1] / "hw_profiles" / "h100.toml").read_text().splitlines()
bad_values = st.sampled_from(["-1", "0", "1e999", "nan", "inf", '"x"', "[]", "{}", "true", "", "[1,", "1 2", '"""'])


@FAST
@given(st.lists(st.tuples(st.integers(0, len(H100) - 1), st.sampled_from(["drop", "dup", "value", "garble"]),
                          bad_values, st.text(max_size=8)), min_size=1, max_size=3))
def test_hardware_toml_mutations(tmp_path, edits):
    lines = list(H100)
    for i, op, value, junk in edits:
        i %= len(lines)
        if op == "drop":
            lines.pop(i)
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "value" and "=" in lines[i]:
            lines[i] = lines[i].split("=")[0] + "= " + value
        else:
            lines[i] = lines[i][: len(lines[i]) // 2] + junk
        if not lines:
            lines = [""]
    path = tmp_path / "h100.toml"
    path.write_text("\n".join(lines))
    try:
        load_profile(str(path))
    except InputError:
        pass


@FAST
@given(st.binary(max_size=200))
def test_hardware_toml_random_bytes(tmp_path, data):
    path = tmp_path / "x.toml"
    path.write_bytes(data)
    try:
        load_profile(str(path))
    except InputError:
        pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10)

VALID_PLAN = {
    "format": "cptsim.plan/1",
    "workload": {"model": "digits-cnn", "dataset": "digits", "batch_size": 64, "steps": 10},
    "hardware": {"name": "h100", "hash": "0"},
    "budget": {"metric": "bitops", "value": 0.65, "unit": "%", "spec": "65%"},
    "schedule": {"name": "cos-rep", "q_min": 3, "q_max": 8, "g_min": 8, "g_max": 8, "cycles": 32},
    "estimate": {"bitops": {"total": 1}, "energy_j": 0, "latency_s": 0, "relative_to_static": 0.6},
    "baseline": {"bitops": {"total": 2}},
}


@FAST
@given(st.sampled_from(sorted(VALID_PLAN)), st.one_of(st.sampled_from(sorted(VALID_PLAN["schedule"])), st.none()),
       json_values)
def test_plan_file_mutations(tmp_path, section, key, value):
    plan = json.loads(json.dumps(VALID_PLAN))
    if key is not None and isinstance(plan[section], dict):
        plan[section][key] = value
    else:
        plan[section] = value
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    try:
        read_plan(path)
    except InputError:
        pass


@FAST
@given(st.binary(max_size=120))
def test_plan_file_random_bytes(tmp_path, data):
    path = tmp_path / "plan.json"
    path.write_bytes(data)
    with pytest.raises(InputError):
        read_plan(path)


@FAST
@given(json_values, st.binary(max_size=120))
def test_run_dir_files(tmp_path, config, trace):
    d = tmp_path / "run"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    (d / "trace.jsonl").write_bytes(trace)
    try:
        run = RunDir.open(d)
        run.read_trace()
        run.read_metrics()
    except InputError:
        pass


flag_values = st.one_of(st.integers(-3, 40).map(str), st.text(alphabet=string.printable, max_size=6))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["cpt", "static", "rex-tri-h:2-9", "cos-rep:0-8", "bogus"]), min_size=1, max_size=2),
       st.sampled_from(["--q-min", "--q-max", "--g-bits", "--cycles", "--steps"]), flag_values)
def test_cli_schedules_show_flags(specs, flag, value):
    r = CliRunner().invoke(cli, ["schedules", "show", *specs, flag, value, "--json"])
    assert r.exit_code in (0, 2), r.output
    if r.exit_code == 2:
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["--epochs", "--steps", "--batch-size", "--lr", "--q-min", "--cycles", "--g-bits",
                        "--schedule", "--model", "--dataset", "--device", "--fp-layers", "--workers"]),
       st.one_of(st.sampled_from(["0", "-1", "nan", "inf", "17", "x", "", "cpt:9-3", "1e9999"]),
                 st.text(alphabet=string.ascii_letters + string.digits + ":-.,", max_size=5)))
def test_cli_train_bad_flags_fail_before_training(tmp_path_factory, flag, value):
    """Invalid values are refused up front (exit 2, one line); a value that happens to be valid may train, so
    those runs are capped at one step."""
    out = tmp_path_factory.mktemp("r") / "run"
    r = CliRunner().invoke(cli, ["train", "--quiet", "--steps", "1", "--out", str(out), flag, value])
    assert r.exit_code in (0, 2), (flag, value, r.output, r.exception)
    if r.exit_code == 2:
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr

"""Issue 25 item 4: one set of workload flags and defaults, defined once (cli.common.workload_options) and shared by
train, plan, cost, profile, sweep and range-test: profile's batch defaulted to 128 where the others used 64, and
sweep and range-test took no --image-size."""

import json

import pytest

from cli_util import one_line_error, run_cli
from cptsim.cli.main import cli

COMMANDS = ("train", "plan", "cost", "profile", "sweep", "range-test")
EVERYWHERE = ("model", "dataset", "data_dir", "image_size", "batch_size", "fp_layers")
RUN_LENGTH = ("epochs", "steps")  # the commands that run (or cost) a whole training run


def _option(command: str, name: str):
    return next((p for p in cli.commands[command].params if p.name == name), None)


@pytest.mark.parametrize("name", EVERYWHERE + RUN_LENGTH)
def test_every_command_takes_the_workload_flag_with_one_default_and_one_help(name):
    from cptsim.cli.common import _workload_option_defs

    commands = COMMANDS if name in EVERYWHERE else ("train", "plan", "cost", "sweep")

    def probe():
        pass

    ref = next(p for p in _workload_option_defs()[name](probe).__click_params__)
    for c in commands:
        opt = _option(c, name)
        assert opt is not None, f"cptsim {c} has no --{name.replace('_', '-')}"
        assert (opt.opts, opt.default, opt.help, opt.type.name) == (ref.opts, ref.default, ref.help, ref.type.name), c


def test_profile_costs_a_step_of_the_shared_batch_size():
    r = run_cli("profile", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["step"]["batch_size"] == 64  # was 128


def test_sweep_passes_image_size_to_its_runs_and_checks_it_first(tmp_path):
    from cptsim.study.sweep import SweepSettings
    from test_image_size import _folder

    _folder(tmp_path / "imgs", size=(32, 32))
    s = SweepSettings(dataset="imagefolder", data_dir=str(tmp_path / "imgs"), image_size=16, steps=1)
    s.validate()
    flags = s.train_flags()
    assert flags[flags.index("--image-size") + 1] == "16" and s.workload()["image_size"] == 16
    assert "image_size" not in SweepSettings().workload()  # older sweeps' workloads are unchanged
    # the CLI flag exists and reaches the check: a size for a dataset of fixed size is one line, exit 2
    r = run_cli("sweep", "--schedules", "static:8", "--image-size", "16", "--steps", "1", "--out", tmp_path / "sw",
                "--no-db")
    assert "image-size" in one_line_error(r)


def test_range_test_runs_at_the_image_size_given(tmp_path):
    from test_image_size import _folder

    _folder(tmp_path / "imgs", size=(32, 32))
    r = run_cli("range-test", "--dataset", "imagefolder", "--data-dir", tmp_path / "imgs", "--image-size", "16",
                "--model", "mlp", "--steps-per-stage", "1", "--batch-size", "4", "--q-start", "7", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["input_shape"] == [3, 16, 16] and doc["settings"]["image_size"] == 16


def test_cost_defaults_to_the_shared_run_length():
    r = run_cli("cost", "--schedule", "static:8", "--hw", "bitfusion", "--json")  # no --epochs, no --steps
    assert r.exit_code == 0, r.output
    w = json.loads(r.stdout)["workload"]
    assert w["samples"] == 15 * w["dataset_size"]  # DEFAULT_EPOCHS of the dataset

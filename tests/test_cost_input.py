"""What `cost` prices a model on is said, and a --data-dir that is not there is refused.

`cptsim cost --model torchvision:mobilenet_v2 --hw h100` priced MobileNetV2 on the embedded digits' 1x8x8 images and
said neither the dataset nor the input shape; `--data-dir /nonexistent` was accepted by every command."""

import json

import pytest

from cli_util import one_line_error, run_cli
from cptsim.cli.main import cli


SHORT = ("--steps", "10", "--schedule", "cpt:3-8:n1")  # a short run of a schedule that does not alias over it


def _warnings(r) -> list[str]:
    return [line for line in r.stderr.splitlines() if line.startswith("warning:")]


def test_the_cost_table_names_the_dataset_and_the_input_shape():
    r = run_cli("cost", "--model", "resnet20", "--dataset", "cifar10", *SHORT, "--hw", "bitfusion")
    assert r.exit_code == 0, r.output
    head = " ".join(r.stdout.split())  # the title may wrap
    assert "on resnet20, cifar10 input 3x32x32:" in head
    r = run_cli("cost", "--model", "mlp", "--input-shape", "1,4,4", *SHORT, "--hw", "bitfusion")
    assert r.exit_code == 0, r.output
    assert "on mlp, --input-shape input 1x4x4:" in " ".join(r.stdout.split())


def test_a_model_made_for_other_images_costed_on_the_default_digits_is_warned_about_in_one_line():
    r = run_cli("cost", "--model", "resnet20", *SHORT, "--hw", "bitfusion", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["workload"]["dataset"] == "digits" and doc["workload"]["input_shape"] == [1, 8, 8]
    (w,) = doc["warnings"]
    assert "resnet20" in w and "3x32x32" in w and "digits" in w and "1x8x8" in w and "--dataset" in w
    assert _warnings(r) == []  # --json: in the document, stderr left quiet
    # the same line on stderr beside the tables
    r = run_cli("cost", "--model", "resnet20", *SHORT, "--hw", "bitfusion")
    assert r.exit_code == 0 and _warnings(r) == [f"warning: {w}"]
    r = run_cli("profile", "--model", "resnet20", "--hw", "bitfusion")
    assert r.exit_code == 0 and _warnings(r) == [f"warning: {w}"]


@pytest.mark.parametrize("args", [
    ("--model", "digits-cnn"),                                  # made for digits
    ("--model", "mlp"),                                         # any input
    ("--model", "resnet20", "--dataset", "digits"),             # asked for
    ("--model", "resnet20", "--input-shape", "3,32,32"),        # its own shape given
])
def test_no_warning_when_the_input_is_the_models_own_or_was_asked_for(args):
    r = run_cli("cost", *args, *SHORT, "--hw", "bitfusion", "--json")
    assert r.exit_code == 0, r.output
    assert _warnings(r) == [] and json.loads(r.stdout)["warnings"] == []


def test_the_warning_rule_by_model_kind():
    from cptsim.data import default_input_warning

    assert "ImageNet's 3x224x224" in default_input_warning("torchvision:mobilenet_v2", None, False)
    assert "ImageNet's 3x224x224" in default_input_warning("imagenet-resnet18", None, False)
    assert "CIFAR's 3x32x32" in default_input_warning("mobilenetv2", None, False)
    for model in ("digits-cnn", "mlp", "token-mlp", "lstm-lm", "gcn"):  # digits, any input, text, graph
        assert default_input_warning(model, None, False) is None, model
    assert default_input_warning("resnet20", "cifar10", False) is None
    assert default_input_warning("resnet20", None, True) is None


def _takes_data_dir() -> list[str]:
    return sorted(n for n in cli.list_commands(None)
                  if any(p.name == "data_dir" for p in getattr(cli.get_command(None, n), "params", [])))


def test_the_commands_that_take_a_data_dir():
    assert {"cost", "plan", "train", "profile", "sweep"} <= set(_takes_data_dir())


@pytest.mark.parametrize("command", _takes_data_dir())
def test_a_data_dir_that_does_not_exist_is_one_line_exit_2_in_every_command(command, tmp_path):
    missing = tmp_path / "nonexistent"
    extra = {"plan": ["--budget", "60%", "--out", tmp_path / "plan.json"], "sweep": ["--out", tmp_path / "sw"],
             "train": ["--out", tmp_path / "run"]}.get(command, [])
    line = one_line_error(run_cli(command, "--data-dir", missing, *extra))
    assert str(missing) in line and "no such directory" in line
    a_file = tmp_path / "file"
    a_file.write_text("x")
    line = one_line_error(run_cli(command, "--data-dir", a_file, *extra))
    assert str(a_file) in line and "not a directory" in line
    assert not (tmp_path / "plan.json").exists() and not (tmp_path / "run").exists()


def test_an_existing_data_dir_is_still_taken_for_a_dataset_that_needs_none(tmp_path):
    r = run_cli("cost", "--data-dir", tmp_path, *SHORT, "--hw", "bitfusion", "--json")
    assert r.exit_code == 0, r.output

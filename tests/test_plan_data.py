"""A plan describes the data it will train on: plan and cost count the data at hand, `train --plan` refuses a plan
made for data of another size, and a flag next to --plan either overrides the plan (recorded) or is refused."""

import json
import struct

import numpy as np
import pytest

from cptsim.errors import InputError
from cptsim.planner.planfile import read_plan
from cptsim.run.train import TrainConfig
from cli_util import one_line_error as _one_line_error
from cli_util import run_cli as _cli

N = 200  # training images in the tiny MNIST set; the registry's MNIST has 60,000


def _idx(path, array):
    # idx: two zero bytes, type 0x08 (ubyte), the number of dimensions, big-endian uint32 sizes, the bytes.
    head = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(head + array.astype(np.uint8).tobytes())


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory):
    """An MNIST subset in torchvision's raw format: N training and 50 test images."""
    root = tmp_path_factory.mktemp("mnist")
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", N), ("t10k", 50)):
        _idx(raw / f"{split}-images-idx3-ubyte", rng.integers(0, 256, size=(n, 28, 28)))
        _idx(raw / f"{split}-labels-idx1-ubyte", rng.integers(0, 10, size=(n,)))
    return root


def test_a_plan_against_a_smaller_dataset_records_its_real_size(mnist_dir, tmp_path):
    r = _cli("plan", "--budget", "65%", "--dataset", "mnist", "--data-dir", mnist_dir, "--epochs", "3",
             "--batch-size", "64", "--out", tmp_path / "p.json", "--quiet")
    assert r.exit_code == 0, r.output
    w = read_plan(tmp_path / "p.json")["workload"]
    assert w["dataset_size"] == N and w["dataset_size_from"] == "data"
    assert w["steps"] == 3 * -(-N // 64) == 12  # not 3 x 938 for the nominal 60,000


def test_plan_refuses_a_dataset_size_that_contradicts_the_data(mnist_dir, tmp_path):
    r = _cli("plan", "--budget", "65%", "--dataset", "mnist", "--data-dir", mnist_dir, "--dataset-size", "60000",
             "--epochs", "3", "--out", tmp_path / "p.json", "--quiet")
    line = _one_line_error(r)
    assert "--dataset-size 60000" in line and f"{N} training samples" in line
    assert not (tmp_path / "p.json").exists()


def test_train_refuses_a_plan_made_for_another_dataset_size(mnist_dir, tmp_path):
    # Planned without the data: the nominal 60,000 images, 3 epochs = 2814 steps.
    r = _cli("plan", "--budget", "65%", "--dataset", "mnist", "--epochs", "3", "--out", tmp_path / "p.json",
             "--quiet")
    assert r.exit_code == 0, r.output
    assert read_plan(tmp_path / "p.json")["workload"]["dataset_size_from"] == "nominal"
    r = _cli("train", "--plan", tmp_path / "p.json", "--data-dir", mnist_dir, "--out", tmp_path / "run", "--quiet")
    line = _one_line_error(r)
    assert "60000" in line and f"holds {N}" in line and "2814 steps" in line
    assert not (tmp_path / "run").exists()


def test_seed_next_to_plan_overrides_it_and_is_recorded(tmp_path):
    assert _cli("plan", "--budget", "65%", "--epochs", "1", "--out", tmp_path / "p.json", "--quiet").exit_code == 0
    # --batch-size and --epochs repeat the plan's values: nothing to refuse.
    r = _cli("train", "--plan", tmp_path / "p.json", "--seed", "1", "--batch-size", "64", "--epochs", "1",
             "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    assert "overriding the plan: --seed 1 (the plan's: 0)" in r.stderr
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["settings"]["seed"] == 1 and config["settings"]["epochs"] == 1
    assert json.loads((tmp_path / "run" / "plan.json").read_text())["workload"]["seed"] == 0


@pytest.mark.parametrize("flags,named", [
    (("--batch-size", "32"), "--batch-size 32"),
    (("--epochs", "5"), "--epochs 5"),
    (("--steps", "7"), "--steps 7"),
    (("--model", "resnet20"), "--model resnet20"),
    (("--q-min", "2"), "--q-min"),
    (("--schedule", "static:8"), "--schedule"),
])
def test_flags_that_change_the_planned_cost_are_refused_next_to_plan(tmp_path, flags, named):
    assert _cli("plan", "--budget", "65%", "--epochs", "1", "--out", tmp_path / "p.json", "--quiet").exit_code == 0
    line = _one_line_error(_cli("train", "--plan", tmp_path / "p.json", *flags, "--out", tmp_path / "run"))
    assert named in line and "re-plan" in line
    assert not (tmp_path / "run").exists()


def test_from_plan_applies_overrides_and_refuses_cost_changes(tmp_path):
    assert _cli("plan", "--budget", "65%", "--epochs", "1", "--out", tmp_path / "p.json", "--quiet").exit_code == 0
    plan = read_plan(tmp_path / "p.json")
    cfg = TrainConfig.from_plan(plan, seed=3, lr=0.05, device="cpu")
    assert (cfg.seed, cfg.lr, cfg.steps, cfg.batch_size) == (3, 0.05, plan["workload"]["steps"], 64)
    assert TrainConfig.from_plan(plan, batch_size=64).batch_size == 64  # the plan's own value
    with pytest.raises(InputError, match="--batch-size 128 differs from the plan's 64"):
        TrainConfig.from_plan(plan, batch_size=128)


def test_cost_counts_the_data_at_hand_with_the_batch_size_plan_and_train_use(mnist_dir):
    r = _cli("cost", "--dataset", "mnist", "--data-dir", mnist_dir, "--epochs", "3", "--hw", "h100", "--json")
    assert r.exit_code == 0, r.output
    w = json.loads(r.stdout)["workload"]
    assert (w["batch_size"], w["dataset_size"], w["dataset_size_from"], w["steps"]) == (64, N, "data", 12)
    r = _cli("cost", "--epochs", "1", "--hw", "h100", "--json")
    w = json.loads(r.stdout)["workload"]
    assert (w["batch_size"], w["steps"]) == (64, 23)  # digits: ceil(1437 / 64), as `cptsim train` runs it

"""Training end to end: kill -> resume equals an uninterrupted run; bad input is one line and exit code 2."""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from cptsim.cli.main import cli
from cptsim.run.rundir import RunDir
from cptsim.run.train import cpu_threads, lr_factor
import shared_runs
from shared_runs import cptsim_here

ARGS = ["train", "--epochs", "2", "--batch-size", "128", "--quiet", "--schedule", "cpt:3-8:g8:n4"]


def _cptsim(*args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "cptsim.cli.main", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def _strip_times(records, keys=("time_s", "epoch_time_s", "recal_time_s")):
    return [{k: v for k, v in r.items() if k not in keys} for r in records]


@pytest.fixture(scope="module")
def reference_run(digits_uninterrupted, tmp_path_factory):
    """ARGS uninterrupted: a copy of conftest.py's shared run, which is ARGS with a checkpoint every 5 steps (that
    changes no step, metric or weight), made in this process: digits-cnn trains on one thread in any (cpu_threads),
    so the runs killed and resumed in subprocesses below must equal it bit for bit. A copy, as two tests here resume
    it or train into its place (and check that nothing changed)."""
    import shutil

    assert [a for a in shared_runs.DIGITS if a not in ("--checkpoint-every", "5")] == ARGS
    out = tmp_path_factory.mktemp("ref") / "run"
    shutil.copytree(digits_uninterrupted.path, out)
    return RunDir.open(out)


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", [5, 17])  # before the first checkpoint, and in the second epoch
def test_kill_then_resume_gives_the_uninterrupted_trace(reference_run, tmp_path, kill_at):
    out = tmp_path / "run"
    r = _cptsim(*ARGS, "--out", str(out), env_extra={"CPTSIM_FAULT_KILL_AT_STEP": str(kill_at)})
    assert r.returncode == -signal.SIGKILL
    run = RunDir.open(out)
    assert len(run.read_trace().records) == kill_at  # the steps before the kill were recorded

    if kill_at == 17:  # a new process resumes; the kill at 5 is resumed in this one
        r = _cptsim("train", "--resume", str(out), "--quiet")
        assert r.returncode == 0, r.stderr
    else:
        r = cptsim_here("train", "--resume", str(out), "--quiet")
        assert r.exit_code == 0, (r.output, r.exception)
    ref_trace, trace = reference_run.read_trace(), run.read_trace()
    steps = [rec["step"] for rec in trace.records]
    assert steps == list(range(24))  # every step exactly once
    assert _strip_times(trace.records) == _strip_times(ref_trace.records)
    assert _strip_times(run.read_metrics().records) == _strip_times(reference_run.read_metrics().records)
    a, b = reference_run.load_checkpoint(), run.load_checkpoint()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k


def test_trained_default_learns(reference_run):
    metrics = reference_run.read_metrics().records
    assert len(metrics) == 2 and metrics[-1]["eval_bits"] == 8
    assert metrics[-1]["test_acc"] > 0.3  # only 24 steps of digits-cnn; chance is 0.1
    trace = reference_run.read_trace().records
    assert sum(r["loss"] for r in trace[-4:]) < sum(r["loss"] for r in trace[:4])
    bits = [r["bits"] for r in trace]
    assert min(bits) == 3 and max(bits) == 8 and bits[0] == 3
    assert all(r["grad_bits"] == 8 for r in trace)
    assert sum(r["batch_size"] for r in trace[:12]) == 1437  # one epoch sees every training sample once
    cfg = reference_run.read_config()
    assert cfg["schedule"]["text"] == "cos-rep:3-8:g8:n4" and cfg["fp_layers"] == ["fc"]


def test_resume_of_a_finished_run_changes_nothing(reference_run):
    before = (reference_run.path / "trace.jsonl").read_bytes()
    r = cptsim_here("train", "--resume", str(reference_run.path), "--quiet", "--json")
    assert r.exit_code == 0, (r.output, r.exception)
    assert json.loads(r.stdout)["complete"] is True
    assert (reference_run.path / "trace.jsonl").read_bytes() == before


def test_small_inputs_train_on_one_thread_unless_asked():
    assert cpu_threads(None, (1, 8, 8)) == 1
    from cptsim.run.train import _DEFAULT_THREADS

    assert cpu_threads(None, (3, 32, 32)) == _DEFAULT_THREADS  # torch's own default, whatever ran before
    assert cpu_threads(2, (1, 8, 8)) == 2


def test_lr_schedules():
    assert lr_factor("step", 0, 100) == 1.0
    assert lr_factor("step", 50, 100) == pytest.approx(0.1)
    assert lr_factor("step", 75, 100) == pytest.approx(0.01)
    assert lr_factor("cosine", 50, 100) == pytest.approx(0.5)
    assert lr_factor("constant", 99, 100) == 1.0


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--model", "resnet21"], "resnet"),
        (["--model", "nosuchmodel"], "digits-cnn"),
        (["--dataset", "imagenette"], "cifar10"),
        (["--schedule", "cos-wobble"], "cos-rep"),
        (["--schedule", "cpt:8-3"], "q_min"),
        (["--q-max", "17"], "16"),
        (["--schedule", "static:20"], "32"),
        (["--g-bits", "0"], "1..16"),
        (["--dataset", "cifar10"], "--data-dir"),
        (["--dataset", "cifar10", "--data-dir", "/nonexistent/dir"], "/nonexistent/dir"),
        (["--schedule", "cpt:3-8", "--q-min", "4"], "contradicts"),
        (["--fp-layers", "classifier"], "matches no"),
        (["--epochs", "0"], "epochs"),
        (["--device", "tpu"], "cpu"),
        (["--resume", "/nonexistent/run"], "not a run directory"),
        (["--batch-size", "x"], "batch-size"),
        (["--threads", "0"], "threads"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, needle):
    r = CliRunner().invoke(cli, ["train", "--quiet", "--out", str(tmp_path / "r"), *args])
    assert r.exit_code == 2, (r.output, r.exception)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert needle in lines[0]
    assert "Traceback" not in r.output


def test_existing_run_dir_is_refused_not_overwritten(reference_run):
    before = {p.name: p.read_bytes() for p in reference_run.path.iterdir()}
    r = CliRunner().invoke(cli, ["train", "--quiet", "--out", str(reference_run.path)])
    assert r.exit_code == 2 and "--resume" in r.stderr
    assert {p.name: p.read_bytes() for p in reference_run.path.iterdir()} == before


def test_trace_counts_what_ran_and_the_cost_model_reproduces_it(reference_run):
    """Executed BitOPs summed from the trace == the cost model's estimate of the same schedule, to the BitOP
    (the estimate models the ragged last batch of each epoch: 1437 = 11 x 128 + 29)."""
    from cptsim.cost.model import estimate
    from cptsim.measure.profiler import LayerProfile
    from cptsim.cost.schedules import parse_schedule

    profile = LayerProfile.from_json(reference_run.read_json("profile.json"))
    trace = reference_run.read_trace().records
    assert [r["batch_size"] for r in trace[:12]] == [128] * 11 + [29]
    per_sample = profile.totals()
    for r in trace:
        assert r["macs"] == {p: per_sample[p] * r["batch_size"] for p in ("fwd", "dgrad", "wgrad")}
    assert per_sample["dgrad"] < per_sample["fwd"]  # the first conv's input needs no gradient: no dgrad there
    cfg = reference_run.read_config()
    est = estimate(profile, parse_schedule(cfg["schedule"]["text"]), steps=cfg["total_steps"], batch_size=128,
                   dataset_size=cfg["train_size"])
    for p in ("fwd", "dgrad", "wgrad"):
        assert est.bitops[p] == sum(r["bitops"][p] for r in trace), p


def _image_folder(root, n=48, size=16):
    """Random 16x16 RGB images in two classes: small enough for CIFAR's augmentation (shifted crops, flips)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", n), ("val", 8)):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True)
            for i in range(count):
                Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(root / split / c / f"{i}.png")
    return root


@pytest.mark.slow
def test_kill_mid_epoch_with_two_workers_and_augmentation_resumes_exactly(tmp_path):
    """Issue 22 item 5: with --workers 2, a DataLoader rebuilt at a resumed run's batch used to restart its
    workers' generators, so the crops and flips after a mid-epoch resume were not the uninterrupted run's.
    Augmentation is seeded per sample now: killed mid-epoch (after the checkpoint at step 9, in epoch 1) and
    resumed, the run equals the uninterrupted one bit for bit."""
    data = _image_folder(tmp_path / "data")
    args = ["train", "--dataset", "imagefolder", "--data-dir", str(data), "--model", "mlp", "--epochs", "2",
            "--batch-size", "16", "--workers", "2", "--val-split", "0", "--schedule", "cpt:3-8:g8:n4",
            "--checkpoint-every", "3", "--quiet"]  # 96 images: 6 steps an epoch
    ref, out = tmp_path / "ref", tmp_path / "run"
    r = cptsim_here(*args, "--out", str(ref))  # the reference in this process (768 inputs: one thread in any)
    assert r.exit_code == 0, (r.output, r.exception)
    r = _cptsim(*args, "--out", str(out), env_extra={"CPTSIM_FAULT_KILL_AT_STEP": "10"})
    assert r.returncode == -signal.SIGKILL
    run = RunDir.open(out)
    assert run.load_checkpoint()["step"] == 9
    r = _cptsim("train", "--resume", str(out), "--quiet")
    assert r.returncode == 0, r.stderr
    a = RunDir.open(ref)
    assert [rec["step"] for rec in run.read_trace().records] == list(range(12))
    assert _strip_times(run.read_trace().records) == _strip_times(a.read_trace().records)
    assert _strip_times(run.read_metrics().records) == _strip_times(a.read_metrics().records)
    wa, wb = a.load_checkpoint()["model"], run.load_checkpoint()["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)

"""TensorBoard: `cptsim train --tensorboard` and RunRecorder(tensorboard=) log what the run records, read back."""

import json

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

pytest.importorskip("tensorboard")

from cptsim.run.tensorboard import read_scalars  # noqa: E402


def _trace(run):
    return [json.loads(s) for s in (run / "trace.jsonl").read_text().splitlines()]


def _check_logged(tb, run):
    s = read_scalars(tb)
    trace = _trace(run)
    assert [v for _, v in s["precision/bits"]] == [r["bits"] for r in trace]
    assert [step for step, _ in s["precision/bits"]] == [r["step"] for r in trace]
    assert [v for _, v in s["precision/grad_bits"]] == [r["grad_bits"] for r in trace]
    assert s["train/loss"][-1][1] == pytest.approx(trace[-1]["loss"], rel=1e-6)
    assert s["train/lr"][0][1] == pytest.approx(trace[0]["lr"])
    total = sum(sum(r["bitops"].values()) for r in trace)
    assert s["cost/bitops"][-1][1] == pytest.approx(total, rel=1e-6)  # float32 in the event file
    energy = s["cost/energy_j/bitfusion"]
    assert len(energy) == len(trace) and all(b[1] > a[1] for a, b in zip(energy, energy[1:]))
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [v for _, v in s["test/acc"]] == pytest.approx([m["test_acc"] for m in metrics])
    return s


def test_train_tensorboard_logs_bits_loss_lr_cumulative_bitops_energy_and_test_metrics(tmp_path):
    from cptsim.cli.main import cli

    run, tb = tmp_path / "run", tmp_path / "tb"
    r = CliRunner().invoke(cli, ["train", "--steps", "6", "--batch-size", "256", "--recal-batches", "1",
                                 "--out", str(run), "--tensorboard", str(tb), "--quiet", "--json"])
    assert r.exit_code == 0, r.output
    _check_logged(tb, run)
    assert json.loads((run / "config.json").read_text())["settings"]["tensorboard"] == str(tb)


def test_recorder_tensorboard_round_trip(tmp_path):
    import cptsim
    from cptsim.data import load_datasets
    from cptsim.models import create_model

    train, test, info = load_datasets("digits")
    torch.manual_seed(0)
    model = create_model("digits-cnn", num_classes=10, in_channels=1)
    sched = cptsim.PrecisionScheduler(cptsim.quantize_model(model), "cpt:3-8:g8:n2", total_steps=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    run, tb = tmp_path / "run", tmp_path / "tb"
    with cptsim.RunRecorder(run, model, sched, optimizer=opt, tensorboard=tb,
                            config={"dataset": "digits", "batch_size": 32}) as rec:
        for i in range(4):
            x, y = train.tensors[0][32 * i:32 * (i + 1)], train.tensors[1][32 * i:32 * (i + 1)]
            sched.step()
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
        rec.epoch(test_acc=0.5, test_loss=1.0)
    s = _check_logged(tb, run)
    assert s["test/loss"] == [(4, 1.0)]


def test_tensorboard_dir_that_cannot_be_written_is_bad_input(tmp_path):
    from cptsim.cli.main import cli

    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = CliRunner().invoke(cli, ["train", "--steps", "2", "--out", str(tmp_path / "run"),
                                 "--tensorboard", str(blocker / "tb"), "--quiet"])
    assert r.exit_code == 2

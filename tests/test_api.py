"""cptsim in a user's own loop: PrecisionScheduler and RunRecorder write a run `cptsim report` reads unchanged."""

import json
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from click.testing import CliRunner
from torch.utils.data import DataLoader, Subset

import cptsim
from cptsim.errors import InputError

SCHEDULE = "cpt:3-8:g8:n4"


def _digits(n_train=200):
    from cptsim.data import load_datasets

    train, test, info = load_datasets("digits")
    return Subset(train, range(n_train)), Subset(test, range(64)), info


def _model(info):
    from cptsim.models import create_model

    torch.manual_seed(0)
    return create_model("digits-cnn", num_classes=info.num_classes, in_channels=info.input_shape[0])


def _own_loop(out, epochs=2, batch_size=64, quantize=True, optimizer_cls=None, **rec_kw):
    """The loop of examples/own_loop.py, small: 200 samples, so 4 steps per epoch with a ragged last batch (8)."""
    train_set, test_set, info = _digits()
    model = _model(info)
    precision = cptsim.quantize_model(model) if quantize else cptsim.PrecisionState()
    loader = DataLoader(train_set, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    total = epochs * len(loader)
    sched = cptsim.PrecisionScheduler(precision, SCHEDULE, total_steps=total)
    opt = (torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9) if optimizer_cls is None
           else optimizer_cls(model.parameters(), lr=0.05))
    rec = cptsim.RunRecorder(out, model, sched, optimizer=opt, config={
        "model": "digits-cnn", "dataset": "digits", "batch_size": batch_size, "train_size": len(train_set)},
        **rec_kw)
    for _ in range(epochs):
        model.train()
        for x, y in loader:
            sched.step()
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss.item())
        model.eval()
        with torch.no_grad(), sched.evaluating():
            acc = sum((model(x).argmax(1) == y).sum().item() for x, y in DataLoader(test_set, batch_size=64))
        rec.epoch(test_acc=acc / len(test_set))
    rec.close()
    return rec, sched, total


def test_scheduler_sets_the_schedules_bits_step_by_step_and_refuses_to_run_past_its_end():
    from cptsim.cost.schedules import parse_schedule

    precision = cptsim.PrecisionState()
    sched = cptsim.PrecisionScheduler(precision, SCHEDULE, total_steps=20)
    want = parse_schedule(SCHEDULE).bits(20)
    got = []
    for _ in range(20):
        q, g = sched.step()
        assert (precision.bits, precision.grad_bits) == (q, g) == sched.get_bits()
        got.append(q)
    assert got == want.tolist()
    with pytest.raises(InputError, match="made for 20 steps and step 21"):
        sched.step()


def test_scheduler_state_dict_resumes_at_the_same_step_and_refuses_another_schedule():
    a = cptsim.PrecisionScheduler(cptsim.PrecisionState(), SCHEDULE, total_steps=20)
    for _ in range(7):
        a.step()
    p = cptsim.PrecisionState()
    b = cptsim.PrecisionScheduler(p, SCHEDULE, total_steps=20)
    b.load_state_dict(a.state_dict())
    assert b.last_step == 6 and (p.bits, p.grad_bits) == a.get_bits()
    assert b.step() == a.step()
    with pytest.raises(InputError, match="saved scheduler ran"):
        cptsim.PrecisionScheduler(cptsim.PrecisionState(), SCHEDULE, total_steps=30).load_state_dict(a.state_dict())


def test_evaluating_runs_at_q_max_and_puts_the_step_bits_back():
    p = cptsim.PrecisionState()
    sched = cptsim.PrecisionScheduler(p, SCHEDULE, total_steps=20)
    sched.step()
    with sched.evaluating():
        assert p.bits == 8
    assert p.bits == 3


def test_recorded_run_reports_and_its_bitops_equal_cptsim_cost(tmp_path):
    from cptsim.cli.main import cli
    from cptsim.study.report import build_report

    rec, sched, total = _own_loop(tmp_path / "run")
    lines = [json.loads(s) for s in (tmp_path / "run" / "trace.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(total))
    assert [r["batch_size"] for r in lines] == [64, 64, 64, 8] * 2
    assert [r["bits"] for r in lines] == sched.schedule.bits(total).tolist()
    assert all(r["lr"] == 0.05 and r["time_s"] > 0 for r in lines)
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 2
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["steps_per_epoch"] == 4 and cfg["input_shape"] == [1, 8, 8]

    r = build_report(tmp_path / "run", ["bitfusion"])
    executed = r.data["bitops"]["executed"]
    assert r.data["bitops"]["trace_check"]["agrees"]
    assert r.data["accuracy"]["final"] is not None

    out = CliRunner().invoke(cli, ["cost", "--model", "digits-cnn", "--input-shape", "1,8,8", "--schedule", SCHEDULE,
                                   "--steps", str(total), "--batch-size", "64", "--dataset-size", "200",
                                   "--hw", "bitfusion", "--json"])
    assert out.exit_code == 0, out.output
    cost = json.loads(out.output)["profiles"][0]["bitops"]
    for k in ("fwd", "dgrad", "wgrad", "total"):
        assert executed[k] == cost[k]


def test_recorder_refuses_an_existing_run_directory(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "trace.jsonl").write_text("")
    _, _, info = _digits()
    model = _model(info)
    sched = cptsim.PrecisionScheduler(cptsim.quantize_model(model), SCHEDULE, total_steps=4)
    with pytest.raises(InputError, match="already exists and is not empty"):
        cptsim.RunRecorder(tmp_path / "run", model, sched)


def test_recorder_needs_sched_step_before_each_recorded_step(tmp_path):
    _, _, info = _digits()
    model = _model(info)
    sched = cptsim.PrecisionScheduler(cptsim.quantize_model(model), SCHEDULE, total_steps=4)
    with cptsim.RunRecorder(tmp_path / "run", model, sched) as rec:
        model(torch.zeros(2, 1, 8, 8))
        with pytest.raises(InputError, match="call sched.step"):
            rec.step(loss=1.0)


def test_a_model_without_quantized_layers_is_said_and_recorded_at_fp32_cost(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _own_loop(tmp_path / "run", epochs=1, quantize=False)
    assert any("no quantized layers" in str(w.message) for w in caught)
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["quantized_layers"] == [] and "no quantized layers" in cfg["notes"][0]
    line = json.loads((tmp_path / "run" / "trace.jsonl").read_text().splitlines()[0])
    for p in ("fwd", "dgrad", "wgrad"):
        assert line["bitops"][p] == line["macs"][p] * 32 * 32


def test_recorder_with_a_plan_writes_it_for_the_report(tmp_path):
    from cptsim.study.report import build_report

    plan = _tiny_plan(tmp_path)
    _own_loop(tmp_path / "run", plan=plan)
    assert (tmp_path / "run" / "plan.json").is_file()
    r = build_report(tmp_path / "run", ["bitfusion"])
    assert r.data["run"]["plan"] is not None


def _tiny_plan(tmp_path):
    from cptsim.cli.main import cli

    path = tmp_path / "plan.json"
    out = CliRunner().invoke(cli, ["plan", "--budget", "80%", "--hw", "bitfusion", "--steps", "8",
                                   "--batch-size", "64", "--out", str(path), "--json"])
    assert out.exit_code == 0, out.output
    return path


def test_top_level_exports_the_api():
    for name in ("quantize_model", "PrecisionScheduler", "RunRecorder", "PrecisionState"):
        assert hasattr(cptsim, name)
    assert np is not None and nn is not None


def test_own_loop_run_on_a_gpu_is_priced_as_profile_model_prices_the_same_steps(tmp_path):
    """The report's modelled h100 time of an own-loop run is the cost model's time of the very steps it ran, on
    the planner's profile of the same model (``profile_model``, which counts the step's op list): a profile.json
    holding only the GEMMs would price the GPU several times lower."""
    from cptsim.cost.model import estimate
    from cptsim.measure.profiler import profile_model
    from cptsim.study.report import build_report

    _own_loop(tmp_path / "run", epochs=1)
    trace = [json.loads(s) for s in (tmp_path / "run" / "trace.jsonl").read_text().splitlines()]
    assert json.loads((tmp_path / "run" / "profile.json").read_text()).get("ops") is not None
    _, _, info = _digits()
    fresh = _model(info)
    cptsim.quantize_model(fresh)
    want = estimate(profile_model(fresh, (1, 8, 8), batch_size=64, model_name="digits-cnn"), trace, "h100",
                    per_layer=False)
    row = build_report(tmp_path / "run", ["h100"]).data["hardware"][0]
    assert row["executed"]["latency_s"] == pytest.approx(want.latency_s["total"], rel=1e-9)
    assert row["executed"]["energy_j"] == pytest.approx(want.energy_j["total"], rel=1e-9)
    assert row["time_validation"]["op_mix_covered"] is True


def test_a_profile_without_its_op_list_is_reported_as_such_never_as_covered(tmp_path):
    from cptsim.cli.main import cli

    _own_loop(tmp_path / "run", epochs=1)
    pf = tmp_path / "run" / "profile.json"
    doc = json.loads(pf.read_text())
    del doc["ops"]  # as a recorder before the op list, or one whose model's step could not be counted, wrote it
    pf.write_text(json.dumps(doc))
    out = CliRunner().invoke(cli, ["report", str(tmp_path / "run"), "--hw", "h100"], terminal_width=200)
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "op mix was covered" not in text
    assert "h100 time: the workload's profile has no op list: this time leaves out the step's other ops" in text
    # bitfusion prices GEMMs only: the op list is nothing its time could leave out
    out = CliRunner().invoke(cli, ["report", str(tmp_path / "run"), "--hw", "bitfusion"], terminal_width=200)
    assert out.exit_code == 0, out.output
    assert "no op list" not in out.output


def test_the_recorder_records_the_op_list_of_an_adam_loop(tmp_path):
    """The op list counts the optimizer the loop steps (Adam's update reads and writes two moments per weight,
    SGD's one momentum buffer): it names it, so the GPU prices the update the loop ran."""
    _own_loop(tmp_path / "run", epochs=1, optimizer_cls=torch.optim.Adam)
    ops = json.loads((tmp_path / "run" / "profile.json").read_text())["ops"]
    assert ops["optimizer"].startswith("adam(")

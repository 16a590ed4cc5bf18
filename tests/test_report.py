"""`cptsim report`: executed vs planned BitOPs (exact for an uninterrupted plan run, the gap and its reason for one
stopped early, each step once after a resume), host time, target hardware, plots, and bad input."""

from __future__ import annotations

import builtins
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

from cptsim.cli.main import cli
from cptsim.run.rundir import RunDir

DIGITS_TRAIN = 1437
BATCH = 128
EPOCHS = 2
STEPS = EPOCHS * -(-DIGITS_TRAIN // BATCH)  # 24, the last step of each epoch ragged (29 samples)
SCHEDULE = "cpt:3-8:g8:n4"


@pytest.fixture(autouse=True, scope="module")
def _isolated_home(tmp_path_factory):
    """Never read the real ~/.config/cptsim (a calibrated host profile there would change 'host')."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CPTSIM_HOME", str(tmp_path_factory.mktemp("home")))
        yield


def make_plan(schedule: str = SCHEDULE, steps: int = STEPS, batch: int = BATCH, ragged: bool = True,
              hardware: str = "bitfusion") -> dict:
    """A plan as `cptsim plan` writes one (the keys planfile.validate_plan and TrainConfig.from_plan read), its
    estimate from the cost model; ``ragged``: whether the estimate models the ragged last batch of each epoch."""
    from cptsim.cli.profile_cmd import build_profile
    from cptsim.cost.model import estimate
    from cptsim.cost.hardware import load_profile
    from cptsim.planner.planfile import validate_plan
    from cptsim.cost.schedules import parse_schedule

    sched = parse_schedule(schedule)
    hw = load_profile(hardware)
    prof = build_profile("digits-cnn", (1, 8, 8), 10, None)
    ds = DIGITS_TRAIN if ragged else None
    c = estimate(prof, sched, hw, steps=steps, batch_size=batch, dataset_size=ds, per_layer=False)
    return validate_plan({
        "format": "cptsim.plan/1",
        "workload": {"model": "digits-cnn", "dataset": "digits", "data_dir": None, "batch_size": batch, "steps": steps,
                     "dataset_size": ds, "lr": 0.1, "lr_schedule": "cosine", "momentum": 0.9, "weight_decay": 5e-4,
                     "seed": 0, "fp_layers": None, "augment": True},
        "hardware": {"name": hw.name, "kind": hw.kind, "hash": hw.content_hash, "path": hw.path},
        "budget": {"metric": "bitops", "value": 0.65, "unit": "%", "spec": "65%"},
        "schedule": sched.to_json() | {"text": sched.to_text()},
        "estimate": {"bitops": c.bitops, "energy_j": c.energy_j["total"], "latency_s": c.latency_s["total"],
                     "relative_to_static": c.relative_to_static},
        "baseline": {"bitops": c.baseline["bitops"], "energy_j": c.baseline["energy_j"]["total"],
                     "latency_s": c.baseline["latency_s"]["total"]},
        "profile": prof.to_json(),
    })


def train_plan(plan: dict, out) -> RunDir:
    from cptsim.run.train import TrainConfig, train

    return train(TrainConfig.from_plan(plan), str(out), progress=False, plan=plan)


def report(*args):
    return CliRunner().invoke(cli, ["report", *map(str, args)])


def report_json(*args) -> dict:
    r = report(*args, "--json", "--no-save")
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def plan_run(tmp_path_factory):
    """An uninterrupted run of a plan whose estimate models the ragged last batch."""
    d = tmp_path_factory.mktemp("plan_run")
    plan = make_plan()
    run = train_plan(plan, d / "run")
    return plan, run


@pytest.fixture(scope="module")
def hand_run(tmp_path_factory):
    """A run given its schedule by hand (no plan): one epoch of batch 64."""
    from cptsim.run.train import TrainConfig, train

    d = tmp_path_factory.mktemp("hand_run")
    return train(TrainConfig(schedule="rex-tri-h:4-8:g8:n2", epochs=1, batch_size=64), str(d / "run"),
                 progress=False)


# ------------------------------------------------------------------------------------------------ executed vs planned


def test_uninterrupted_plan_run_executes_exactly_the_planned_bitops(plan_run):
    plan, run = plan_run
    doc = report_json(run.path)["runs"][0]
    b = doc["bitops"]
    assert b["planned"]["source"] == "plan.json estimate"
    assert b["planned"]["models_ragged_batch"] is True
    assert b["planned"]["total"] == plan["estimate"]["bitops"]["total"]
    for k in ("fwd", "dgrad", "wgrad", "total"):
        assert b["executed"][k] == pytest.approx(b["planned"][k], rel=1e-12)  # exact: the plan modelled the ragged batch
        assert b["executed"][k] == pytest.approx(b["trace_counted"][k], rel=1e-12)
    assert abs(b["diff_pct"]["total"]) <= 0.5 and b["within_tolerance"]
    assert b["trace_check"]["agrees"]
    assert b["reasons"] == ["executed what was planned"]
    assert doc["run"]["complete"] and doc["run"]["steps_done"] == STEPS


def test_plan_without_the_ragged_batch_names_it_as_the_reason(plan_run, tmp_path):
    _, run = plan_run
    d = tmp_path / "run"
    shutil.copytree(run.path, d)
    flat = make_plan(ragged=False)
    RunDir(d).write_json("plan.json", flat)
    b = report_json(d)["runs"][0]["bitops"]
    assert b["planned"]["models_ragged_batch"] is False
    short = EPOCHS * (BATCH - (DIGITS_TRAIN - (STEPS // EPOCHS - 1) * BATCH))  # samples the plan counted but never ran
    assert b["planned"]["samples"] - b["executed"]["samples"] == short
    assert b["diff_pct"]["total"] < 0
    assert any("ragged last batch not modelled by the plan" in r for r in b["reasons"])


def test_hand_given_schedule_is_compared_with_its_own_estimate(hand_run):
    b = report_json(hand_run.path)["runs"][0]["bitops"]
    assert b["planned"]["source"] == "schedule estimate (no plan)"
    assert b["diff_pct"]["total"] == pytest.approx(0.0, abs=1e-9)
    assert any(r.startswith("no plan") for r in b["reasons"])


def _cptsim(*args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "cptsim.cli.main", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.slow
def test_stopped_early_shows_the_gap_and_a_resumed_run_counts_each_step_once(plan_run, tmp_path):
    planned = plan_run[0]
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(planned))
    out = tmp_path / "run"
    kill_at = 17  # in the second epoch, after the first epoch's checkpoint
    r = _cptsim("train", "--plan", plan_path, "--out", out, "--quiet",
                env_extra={"CPTSIM_FAULT_KILL_AT_STEP": str(kill_at)})
    assert r.returncode == -signal.SIGKILL, r.stderr

    doc = report_json(out)["runs"][0]
    b = doc["bitops"]
    assert doc["run"]["steps_done"] == kill_at and not doc["run"]["complete"]
    assert b["executed"]["steps"] == kill_at
    assert b["diff_pct"]["total"] < -0.5 and not b["within_tolerance"]
    assert any(r.startswith(f"stopped early: {kill_at} of {STEPS} planned steps") for r in b["reasons"])
    people = report(out, "--no-save")
    assert people.exit_code == 0 and "stopped early" in people.stdout

    r = CliRunner().invoke(cli, ["train", "--resume", str(out), "--quiet"])  # in this process: the report is checked
    assert r.exit_code == 0, (r.output, r.exception)
    doc = report_json(out)["runs"][0]
    b = doc["bitops"]
    assert doc["run"]["steps_done"] == STEPS and doc["run"]["duplicate_lines"] == 0
    assert b["executed"]["steps"] == STEPS
    assert b["executed"]["total"] == pytest.approx(b["planned"]["total"], rel=1e-12)
    assert b["reasons"] == ["executed what was planned"]


def test_repeated_trace_lines_are_counted_once(plan_run, tmp_path):
    _, run = plan_run
    d = tmp_path / "run"
    shutil.copytree(run.path, d)
    lines = (d / "trace.jsonl").read_text().splitlines(keepends=True)
    # A resume that re-ran steps 10..15 without dropping their old lines.
    (d / "trace.jsonl").write_text("".join(lines[:16] + lines[10:16] + lines[16:]))
    doc = report_json(d)["runs"][0]
    b = doc["bitops"]
    assert doc["run"]["duplicate_lines"] == 6 and doc["run"]["steps_done"] == STEPS
    assert b["executed"]["total"] == pytest.approx(b["planned"]["total"], rel=1e-12)
    assert b["trace_counted"]["total"] == pytest.approx(b["planned"]["total"], rel=1e-12)
    assert any("counted once" in r for r in b["reasons"])


# ------------------------------------------------------------------------------------------------ the other sections


def test_host_time_is_the_cost_model_on_the_host_profile_vs_the_measured_steps(plan_run):
    from cptsim.cost.model import estimate
    from cptsim.cost.hardware import load_profile

    _, run = plan_run
    h = report_json(run.path)["runs"][0]["host_time"]
    steps = run.read_executed().records
    assert h["measured_s"] == pytest.approx(sum(r["time_s"] for r in steps))
    assert h["modelled_s"] == pytest.approx(estimate(run.read_profile(), steps, load_profile("host")).latency_s["total"])
    assert sum(e["modelled_s"] for e in h["per_epoch"]) == pytest.approx(h["modelled_s"], rel=1e-9)
    assert [e["epoch"] for e in h["per_epoch"]] == list(range(EPOCHS))
    assert h["error_pct"] == pytest.approx((h["modelled_s"] / h["measured_s"] - 1) * 100)
    assert any("placeholder" in n for n in h["notes"])  # the shipped host.toml is not measured here
    assert "measured" in h["measured_label"] and "modelled" in h["modelled_label"]


def test_target_hardware_is_labelled_modelled_and_the_plans_own_estimate_is_shown(plan_run):
    plan, run = plan_run
    rows = report_json(run.path)["runs"][0]["hardware"]
    assert [r["name"] for r in rows] == ["bitfusion", "h100"]  # the plan's hardware once, then the defaults
    for r in rows:
        assert r["label"] == "modelled (not executed on this hardware)"
        assert r["diff_pct"]["energy_j"] == pytest.approx(0.0, abs=1e-9)
    assert rows[0]["planned"]["source"] == "plan.json estimate"
    assert rows[0]["planned"]["energy_j"] == plan["estimate"]["energy_j"]
    rows = report_json(run.path, "--hw", "stripes,int8-systolic")["runs"][0]["hardware"]
    assert [r["name"] for r in rows] == ["stripes", "int8-systolic"]


def test_layer_table_lists_top_layers_with_share_and_bits(plan_run):
    _, run = plan_run
    L = report_json(run.path, "--top", "2")["runs"][0]["layers"]
    assert len(L["top"]) == 2 and L["other"]["layers"] == L["count"] - 2
    assert sum(x["share"] for x in L["top"]) + L["other"]["share"] == pytest.approx(1.0)
    assert L["top"][0]["share"] >= L["top"][1]["share"]
    full = report_json(run.path)["runs"][0]["layers"]["top"]
    assert {x["name"]: x["bits"] for x in full}["fc"] == "32"  # the FP32 classifier
    assert all(x["bits"] == "3-8" and x["grad_bits"] == "8" for x in full if x["quantized"])


def test_accuracy_final_and_best_at_q_max(plan_run):
    _, run = plan_run
    a = report_json(run.path)["runs"][0]["accuracy"]
    accs = [m["test_acc"] for m in run.read_metrics().records]
    assert a["eval_bits"] == 8 and a["final"] == accs[-1] and a["best"] == max(accs)


def test_people_output_has_the_tables(plan_run):
    _, run = plan_run
    r = report(run.path, "--no-save")
    assert r.exit_code == 0, r.stderr
    for needle in ("BitOPs: planned vs executed", "host time on this machine", "MODELLED (not executed",
                   "layers by executed BitOPs", "accuracy at q_max = 8 bits"):
        assert needle in r.stdout


# ------------------------------------------------------------------------------------------------ files and plots


def _check_png(path, min_bytes=10_000):
    import matplotlib.image as mpimg

    assert path.is_file() and path.stat().st_size > min_bytes, path
    img = mpimg.imread(path)
    h, w = img.shape[:2]
    assert 300 <= h <= 3000 and 500 <= w <= 3000 and img.std() > 0.05  # a figure, not a blank
    return img


def test_report_writes_json_and_png_into_the_run_dir_and_nothing_else(plan_run, tmp_path):
    _, run = plan_run
    d = tmp_path / "run"
    shutil.copytree(run.path, d)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    r = report(d)
    assert r.exit_code == 0, r.stderr
    after = {p.name: p.read_bytes() for p in d.iterdir()}
    assert set(after) - set(before) == {"report.json", "report.png"}
    assert all(after[k] == v for k, v in before.items())  # no other run file touched
    doc = json.loads((d / "report.json").read_text())
    assert doc["format"] == "cptsim.report/1" and doc["bitops"]["within_tolerance"]
    _check_png(d / "report.png")


def test_several_runs_give_a_comparison_table_and_an_accuracy_vs_cost_plot(plan_run, hand_run, tmp_path):
    _, run = plan_run
    png = tmp_path / "cmp.png"
    r = CliRunner().invoke(cli, ["report", str(run.path), str(hand_run.path), "--plot", str(png), "--no-save",
                                 "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["runs"]) == 2 and [c["run"] for c in doc["comparison"]] == ["run", "run"]
    assert all(c["executed_bitops"] > 0 and c["final_acc"] is not None for c in doc["comparison"])
    _check_png(png)
    one = tmp_path / "one.png"
    assert report(run.path, "--plot", one, "--no-save").exit_code == 0
    _check_png(one)


# ------------------------------------------------------------------------------------------------ bad input


def _one_line_exit_2(r, needle):
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    assert needle in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr


def test_not_a_run_dir(tmp_path):
    _one_line_exit_2(report(tmp_path / "nope"), "is not a run directory")
    (tmp_path / "empty").mkdir()
    _one_line_exit_2(report(tmp_path / "empty"), "no config.json")


def test_config_from_a_newer_format_is_refused(plan_run, tmp_path):
    _, run = plan_run
    d = tmp_path / "run"
    shutil.copytree(run.path, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(cfg | {"format": "cptsim.run/2"}))
    _one_line_exit_2(report(d), "written by a newer cptsim")


def test_trace_line_from_a_newer_format_is_refused(plan_run, tmp_path):
    _, run = plan_run
    d = tmp_path / "run"
    shutil.copytree(run.path, d)
    with open(d / "trace.jsonl", "a") as f:
        f.write(json.dumps({"format": "cptsim.trace/2", "step": STEPS, "epoch": 2, "batch_size": 1, "bits": 8,
                            "grad_bits": 8}) + "\n")
    _one_line_exit_2(report(d), "written by a newer cptsim")


def test_truncated_last_trace_line_is_reported_with_a_warning(plan_run, tmp_path):
    _, run = plan_run
    d = tmp_path / "run"
    shutil.copytree(run.path, d)
    text = (d / "trace.jsonl").read_text()
    (d / "trace.jsonl").write_text(text[: len(text) - 40])  # the last line cut mid-write
    r = CliRunner().invoke(cli, ["report", str(d), "--json", "--no-save"])
    assert r.exit_code == 0, r.stderr
    assert "cut short" in r.stderr and "warning" in r.stderr
    doc = json.loads(r.stdout)["runs"][0]
    assert doc["run"]["trace_truncated"] and doc["run"]["steps_done"] == STEPS - 1
    assert any("cut short" in w for w in doc["warnings"])
    assert any("stopped early" in x for x in doc["bitops"]["reasons"])


def test_plot_without_matplotlib_is_a_clear_error(plan_run, monkeypatch, tmp_path):
    _, run = plan_run
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    _one_line_exit_2(report(run.path, "--plot", tmp_path / "x.png"), "plots need matplotlib")
    assert not (tmp_path / "x.png").exists()
    # Without --plot the report still works; only the run dir's PNG is skipped, with a warning.
    d = tmp_path / "run"
    shutil.copytree(run.path, d)
    (d / "report.png").unlink(missing_ok=True)
    r = report(d)
    assert r.exit_code == 0 and "no report.png" in r.stderr and not (d / "report.png").exists()


@pytest.mark.parametrize("args,needle", [
    (["--fit"], "--fit needs --fit-out"),
    (["--fit-out", "x.toml"], "go with --fit"),
    (["--hw", ","], "--hw needs at least one"),
    (["--hw", "nosuchhw"], "unknown hardware profile"),
    (["--top", "-1"], "--top must be"),
])
def test_bad_flags_exit_2(plan_run, args, needle):
    _, run = plan_run
    _one_line_exit_2(report(run.path, "--no-save", *args), needle)


def test_each_modelled_hardware_says_how_sure_its_times_are(plan_run):
    """Item 5 of issue 23: report carries each target profile's [validation] against the run's op mix, as cost does;
    a profile with none says so."""
    _, run = plan_run
    rows = {r["name"]: r for r in report_json(run.path)["runs"][0]["hardware"]}
    h = rows["h100"]["time_validation"]
    assert h["checked"] and h["op_mix_covered"] and 0 < h["median_abs_error"] <= h["worst_abs_error"]
    assert rows["bitfusion"]["time_validation"]["checked"] is False
    text = " ".join(report(run.path, "--no-save").stdout.split())
    assert "h100 time: median |error|" in text and "bitfusion time: not checked against measurements" in text

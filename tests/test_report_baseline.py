"""One baseline from plan to report: a run trained from a plan is reported against the plan's baseline (the same
width, the same gradient bits), recorded in its config.json; a run without a plan says which baseline it uses; the
JSON names it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared_runs import cptsim_here

STEPS = 24


@pytest.fixture(autouse=True, scope="module")
def _isolated_home(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CPTSIM_HOME", str(tmp_path_factory.mktemp("home")))
        yield


def _user_profile(tmp: Path) -> Path:
    """A user's own bit-serial design: the shipped Stripes file cut to 8192 lanes (16 x 32 x 16)."""
    from importlib.resources import files

    text = (files("cptsim.hw_profiles") / "stripes.toml").read_text()
    text = text.replace('name = "stripes"', 'name = "my-stripes"', 1)
    lines = []
    for line in text.splitlines():
        if line.startswith("lanes = "):
            line = "lanes = 8192"
        elif line.startswith("columns = "):
            line = "columns = 32"
        lines.append(line)
    p = tmp / "my-stripes.toml"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.fixture(scope="module")
def planned_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("baseline")
    hw = _user_profile(d)
    r = cptsim_here("plan", "--budget", "60%", "--metric", "latency", "--hw", hw, "--steps", STEPS,
                    "--batch-size", 64, "--out", d / "plan.json")
    assert r.exit_code == 0, r.output
    r = cptsim_here("train", "--plan", d / "plan.json", "--out", d / "run", "--quiet")
    assert r.exit_code == 0, r.output
    plan = json.loads((d / "plan.json").read_text())
    return d, hw, plan


def _report(run, *args) -> dict:
    r = cptsim_here("report", run, "--json", "--no-save", *args)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["runs"][0]


def test_the_report_saves_what_the_plan_promised_against_the_plans_baseline(planned_run):
    from cptsim.cost.hardware import load_profile
    from cptsim.cost.model import estimate
    from cptsim.cost.schedules import parse_schedule
    from cptsim.run.rundir import RunDir

    d, hw_path, plan = planned_run
    pick = parse_schedule(plan["schedule"]["text"])
    assert plan["baseline"]["schedule"] == "static:8:g8"
    assert pick.q_max < 8  # else static q_max of what ran is the plan's baseline and the test proves nothing
    rep = _report(d / "run", "--hw", hw_path)
    row = rep["hardware"][0]
    assert row["name"] == "my-stripes"
    planned_saving = 1 - plan["estimate"]["vs_baseline"]["latency_s"]
    executed_saving = 1 - row["vs_static"]["latency_s"]
    assert executed_saving == pytest.approx(planned_saving, abs=1e-3)  # to 0.1 point
    assert 1 - row["planned_vs_static"]["latency_s"] == pytest.approx(planned_saving, abs=1e-3)
    # independently: the executed steps' latency over the plan's baseline schedule costed on its own, step for step
    run = RunDir.open(d / "run")
    steps = run.read_executed().records
    hw = load_profile(str(hw_path))
    prof = run.read_profile()
    ran = estimate(prof, steps, hw, per_layer=False)
    base = estimate(prof, parse_schedule("static:8:g8"), hw, steps=len(steps), batch_size=64,
                    dataset_size=1437, per_layer=False)
    assert executed_saving == pytest.approx(1 - ran.latency_s["total"] / base.latency_s["total"], rel=1e-9)
    # what the old report said: static q_max of the executed schedule, a far smaller saving
    old = estimate(prof, steps, hw, per_layer=False, static_bits=pick.q_max)
    assert abs((1 - old.vs_static["latency_s"]) - planned_saving) > 0.05
    # recorded in the run, named in the JSON
    cfg = run.read_config()
    assert cfg["baseline"]["bits"] == 8 and cfg["baseline"]["grad_bits"] == 8
    assert rep["baseline"]["label"] == "static 8, 8-bit gradients"
    assert rep["baseline"]["source"] == "the plan's baseline"
    assert row["baseline"] == "static 8, 8-bit gradients"
    assert rep["bitops"]["executed"]["relative_to_static"] == pytest.approx(
        ran.bitops["total"] / base.bitops["total"], rel=1e-9)


def test_people_output_names_the_baseline_and_both_savings(planned_run):
    d, hw_path, plan = planned_run
    r = cptsim_here("report", d / "run", "--no-save", "--hw", hw_path, "--wide")
    assert r.exit_code == 0, r.output
    assert "static 8, 8-bit gradients (the plan's baseline)" in " ".join(r.output.split())
    saving = f"{100 * (1 - plan['estimate']['vs_baseline']['latency_s']):.1f}%"
    row = next(line for line in r.output.splitlines() if "my-stripes" in line and "│" in line)
    assert row.count(saving) == 2  # planned and executed


def test_a_run_from_before_runs_recorded_their_baseline_takes_the_plans(planned_run, tmp_path):
    import shutil

    d, hw_path, plan = planned_run
    old = tmp_path / "old"
    shutil.copytree(d / "run", old)
    cfg = json.loads((old / "config.json").read_text())
    del cfg["baseline"]
    (old / "config.json").write_text(json.dumps(cfg))
    rep = _report(old, "--hw", hw_path)
    assert rep["baseline"]["bits"] == 8 and rep["baseline"]["source"] == "the plan's baseline"
    assert 1 - rep["hardware"][0]["vs_static"]["latency_s"] == pytest.approx(
        1 - plan["estimate"]["vs_baseline"]["latency_s"], abs=1e-3)


def test_a_run_without_a_plan_says_its_baseline_is_its_own_q_max(tmp_path):
    r = cptsim_here("train", "--schedule", "cos-tri:3-6:g8:n2", "--steps", 6, "--batch-size", 32,
                    "--out", tmp_path / "run", "--quiet")
    assert r.exit_code == 0, r.output
    rep = _report(tmp_path / "run", "--hw", "bitfusion")
    assert rep["baseline"]["bits"] == 6 and rep["baseline"]["grad_bits"] is None
    assert "no plan" in rep["baseline"]["source"]
    assert rep["baseline"]["label"] == "static 6, the run's gradient bits"


def test_the_row_of_the_gpu_that_ran_holds_its_measurement_beside_both_models(tmp_path):
    """A CUDA run measured on an H100 (tests/data/gpu_runs): the h100 row's exec figures are what the trace
    measured over every step, warm-up included (the plan prices every step); the model as it ran and natively sit
    beside them, each labelled."""
    import shutil

    from cptsim.cost.hardware import load_profile
    from cptsim.cost.model import estimate
    from cptsim.run.rundir import RunDir

    src = Path(__file__).parent / "data" / "gpu_runs" / "resnet20-cpt-synthetic"
    run = tmp_path / "cpt"
    shutil.copytree(src, run)
    rep = _report(run)
    row = next(x for x in rep["hardware"] if x["name"] == "h100")
    assert row["label"].startswith("executed")
    lines = [json.loads(s) for s in (run / "trace.jsonl").read_text().splitlines() if s.strip()]
    assert row["executed"]["latency_s"] == pytest.approx(sum(r["time_s"] for r in lines), rel=1e-12)
    assert row["executed"]["energy_j"] == pytest.approx(sum(r["energy_j"] for r in lines), rel=1e-12)
    assert "measured" in row["executed"]["source"]
    h = rep["host_time"]
    assert row["modelled_as_ran"]["latency_s"] == h["modelled_s"]
    assert row["modelled_as_ran"]["steps"] == len(lines) - h["warmup_steps_skipped"]
    rd = RunDir.open(run)
    native = estimate(rd.read_profile(), rd.read_executed().records, load_profile("h100"), per_layer=False)
    assert row["modelled_natively"]["latency_s"] == pytest.approx(native.latency_s["total"], rel=1e-12)
    assert row["diff_pct"]["latency_s"] == pytest.approx(
        100 * (row["executed"]["latency_s"] / row["planned"]["latency_s"] - 1), rel=1e-9)
    for x in rep["hardware"]:
        if x["name"] != "h100":
            assert x["label"].startswith("modelled") and x["executed"]["source"].startswith("modelled")


def test_report_png_draws_planned_executed_and_baseline_per_target_with_legends_off_the_data(planned_run):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cptsim.study.plots import run_figure_object
    from cptsim.study.report import build_report

    d, hw_path, plan = planned_run
    rep = build_report(d / "run", hardware=[str(hw_path), "bitfusion"])
    fig = run_figure_object(rep)
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        panels = {ax.get_title().split(" on the target")[0]: ax for ax in fig.axes if "target hardware" in ax.get_title()}
        assert set(panels) == {"energy", "latency"}
        for what, key in (("energy", "energy_j"), ("latency", "latency_s")):
            ax = panels[what]
            heights = sorted(round(p.get_height(), 6) for p in ax.patches)
            want = []
            for row in rep.data["hardware"]:  # planned, executed, baseline, in % of the baseline
                want += [100 * row["planned_vs_static"][key], 100 * row["vs_static"][key], 100.0]
            assert heights == sorted(round(v, 6) for v in want)
            labels = [t.get_text() for t in ax.get_legend().get_texts()]
            assert "baseline: static 8, 8-bit gradients" in labels
        for ax in fig.axes:  # every legend clear of its panel's plotting area
            leg = ax.get_legend()
            if leg is not None:
                assert not leg.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer)), ax.get_title()
    finally:
        plt.close(fig)

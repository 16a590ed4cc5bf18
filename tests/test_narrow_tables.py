"""Reading comfort: tables fit an 80-column terminal without cutting names to "…"; --wide shows every column;
report.png has the test metric under the precision panel; `cptsim --help` lists plan -> train -> report first."""

import json

import pytest
from click.testing import CliRunner

from cptsim.cli.main import cli

ELLIPSIS = "…"


def _run(*args, columns=80):
    r = CliRunner().invoke(cli, [str(a) for a in args], env={"COLUMNS": str(columns), "CPTSIM_NO_CALIBRATE": "1"})
    assert r.exit_code == 0, r.output
    return r.stdout


def test_cost_fits_80_columns_and_wide_shows_every_column():
    text = _run("cost", "--steps", "100")
    assert ELLIPSIS not in text
    for name in ("h100", "a100", "bitfusion", "stripes", "int8-systolic"):
        assert name in text
    assert "left out to fit 80 columns" in text and "--wide" in text
    wide = _run("cost", "--steps", "100", "--wide")
    assert ELLIPSIS not in wide and "left out" not in wide
    for col in ("kind", "vs FP32", "vs static", "energy saving", "latency saving", "bit-fusion", "fixed-int"):
        assert col in wide
    assert max(len(line) for line in wide.splitlines()) > 80


def test_hw_list_fits_80_columns():
    text = _run("hw", "list")
    assert ELLIPSIS not in text and "bitfusion" in text and "int8-systolic" in text
    assert ELLIPSIS not in _run("hw", "list", columns=50)


def test_plan_fits_80_columns(tmp_path):
    text = _run("plan", "--budget", "60%", "--schedules", "rex-tri-h,exp-tri-v", "--g-bits", "6-8",
                "--cycles", "16,32", "--out", tmp_path / "plan.json")
    assert ELLIPSIS not in text and "rex-tri-h" in text
    wide = _run("plan", "--budget", "60%", "--schedules", "rex-tri-h,exp-tri-v", "--g-bits", "6-8",
                "--cycles", "16,32", "--out", tmp_path / "plan2.json", "--wide")
    for col in ("n", "bits", "BitOPs", "energy", "latency", "budget", "static", "score"):
        assert f" {col} " in f" {wide} "


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("narrow") / "run"
    _run("train", "--quiet", "--steps", "12", "--batch-size", "256", "--recal-batches", "0", "--out", out)
    return out


def test_report_fits_80_columns_and_wide_shows_every_column(small_run):
    text = _run("report", small_run, "--no-save", "--hw", "bitfusion,int8-systolic")
    assert ELLIPSIS not in text
    assert "bitfusion" in text and "int8-systolic" in text and "features.3" in text
    wide = _run("report", small_run, "--no-save", "--hw", "bitfusion,int8-systolic", "--wide")
    assert ELLIPSIS not in wide
    for col in ("kind", "plan from", "E plan", "t plan", "saving E/t", "trace's own count", "MACs share"):
        assert col in wide


def test_report_png_has_the_test_metric_over_steps(small_run):
    from cptsim.study import plots as P
    from cptsim.study import report as R

    P.require_matplotlib()
    rep = R.build_report(str(small_run), ["bitfusion"], host="host", top=5)
    label, curves = P.metric_curve(rep.series["accuracy"])
    assert "accuracy" in label and curves and curves[0][0] == "test accuracy"
    steps = [json.loads(line)["step"] for line in (small_run / "metrics.jsonl").read_text().splitlines()]
    assert curves[0][1] == steps
    png = P.run_figure(rep)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_help_lists_the_main_job_first():
    text = _run("--help")
    commands = text.split("Commands:")[1].split()
    listed = [w for w in commands if w in ("plan", "train", "report", "cost", "sweep", "hw", "profile")]
    assert listed[:3] == ["plan", "train", "report"]
    intro = text.split("Commands:")[0]
    assert intro.index("cptsim plan") < intro.index("cptsim train --plan") < intro.index("cptsim report")

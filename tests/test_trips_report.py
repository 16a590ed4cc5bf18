"""`cptsim report` names a run's number format and what its numbers count, offers no default target that cannot run
the format, says what a plan file is, and gives a resumed epoch a wall time that holds all its steps."""

import json
import pathlib

import pytest

from cli_util import one_line_error, run_cli
from shared_runs import cptsim_here

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture(scope="module")
def fp8_run(tmp_path_factory):
    """Three steps of digits in FP8 (static 8 bits in the fp family: every width 8 runs fp8e4m3)."""
    out = tmp_path_factory.mktemp("fp8") / "run"
    r = cptsim_here("train", "--number-format", "fp", "--schedule", "static:8", "--steps", "3", "--batch-size", "32",
                    "--recal-batches", "0", "--quiet", "--out", out)
    assert r.exit_code == 0, (r.output, r.exception)
    return out, r.stdout


def _report_json(*args):
    r = run_cli("report", *args, "--no-save", "--no-calibrate", "--json")
    assert r.exit_code == 0, (r.output, r.exception)
    return json.loads(r.stdout)


def test_an_fp8_run_is_named_by_its_format_in_the_report_and_the_comparison(fp8_run):
    run, _ = fp8_run
    cfg = json.loads((run / "config.json").read_text())
    fmt = cfg["number_format"]["formats"]["forward"]["8"]  # what the training loop recorded it ran
    assert fmt == "fp8e4m3"
    doc = _report_json(run, run)
    r0 = doc["runs"][0]["run"]
    assert r0["schedule"] == "static:8:g8"
    assert r0["schedule_label"] == f"static:8:g8 in {fmt}"
    assert [row["number_format"] for row in doc["comparison"]] == [fmt, fmt]
    text = run_cli("report", run, run, "--no-save", "--no-calibrate", "--wide")
    assert text.exit_code == 0, text.output
    table = text.stdout.split("runs compared")[1]
    assert "format" in table and table.count(fmt) == 2
    head = " ".join(text.stdout.split("BitOPs: planned")[0].split())
    assert f"digits-cnn on digits, static:8:g8 in {fmt};" in head, head


def test_a_float_run_gets_no_default_target_that_computes_integers_only(fp8_run):
    from cptsim.cost.hardware import load_profile
    from cptsim.errors import InputError
    from cptsim.numerics.families import format_map
    from cptsim.study.report import DEFAULT_TARGETS, _default_targets

    run, _ = fp8_run
    refuses = []
    for name in DEFAULT_TARGETS:
        try:
            load_profile(name).with_formats(format_map("fp"))
        except InputError:
            refuses.append(name)
    assert refuses == ["bitfusion"]  # the truth the report must follow: Bit Fusion's bricks are integer
    doc = _report_json(run)["runs"][0]
    assert [h["name"] for h in doc["hardware"]] == [n for n in DEFAULT_TARGETS if n not in refuses]
    assert not [w for w in doc["warnings"] if "skipped" in w], doc["warnings"]
    assert _default_targets(None) == list(DEFAULT_TARGETS)  # an integer run keeps every default
    # named by the user, it is still refused on one line
    assert "computes integers only" in one_line_error(run_cli("report", run, "--hw", "bitfusion", "--no-save",
                                                              "--no-calibrate"))


def test_nominal_widths_and_the_element_bits_bitops_count_are_told_apart():
    import numpy as np

    from cptsim.numerics.families import format_map
    from cptsim.numerics.formats import parse_format
    from cptsim.study.report import number_format_of

    q, g = np.array([4, 5, 7, 8]), np.array([8, 8, 8, 8])
    f = number_format_of(format_map("mx"), q, g)
    # OCP MX: width 5 runs MXFP6 (6-bit E3M2 elements), 7 runs MXFP8
    elem = [parse_format(n).element_bits for n in ("mxfp4", "mxfp6", "mxfp8", "mxfp8")]
    assert f["mean_nominal_bits"] == pytest.approx(q.mean())
    assert f["mean_element_bits"] == pytest.approx(np.mean(elem)) != pytest.approx(q.mean())
    assert "width 5 ran mxfp6 (6 element bits)" in f["bitops_count"]
    assert f["label"] == "mxfp4/mxfp6/mxfp8, gradients mxfp8"
    assert number_format_of(None, q, g) is None  # integers: a width is its own format


def test_the_report_and_the_train_summary_say_what_each_number_counts(fp8_run):
    run, summary = fp8_run
    text = " ".join(run_cli("report", run, "--no-save", "--no-calibrate", "--wide").stdout.split())
    assert "BitOPs count each operand at its format's element bits: width 8 ran fp8e4m3 (8 element bits)" in text
    flat = " ".join(summary.split())
    assert "static:8:g8 in fp8e4m3" in flat
    assert "mean forward width (the schedule's nominal bits)" in " ".join(flat.replace("│", " ").split())
    assert "mean forward element bits (what BitOPs count)" in " ".join(flat.replace("│", " ").split())


def test_the_comparison_plot_legend_names_the_format(fp8_run, monkeypatch):
    from matplotlib.figure import Figure

    from cptsim.study import plots as P
    from cptsim.study import report as R

    run, _ = fp8_run
    rows = R.compare([R.build_report(run, ["h100"], top=3), R.build_report(run, ["h100"], top=3)])
    seen = []
    real = Figure.legend

    def spy(self, *args, **kw):
        seen.extend(args[1] if len(args) > 1 else [])
        return real(self, *args, **kw)

    monkeypatch.setattr(Figure, "legend", spy)
    P.comparison_figure(rows)
    assert seen and all("static:8:g8 in fp8e4m3" in label for label in seen), seen


def test_a_plan_file_given_to_report_is_named_as_one_with_how_to_train_it(tmp_path, fp8_run):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"format": "cptsim.plan/1"}))
    msg = one_line_error(run_cli("report", plan))
    assert "is a plan file" in msg and f"cptsim train --plan {plan} --out DIR" in msg, msg
    assert "no such directory" not in msg
    run, _ = fp8_run
    msg = one_line_error(run_cli("report", run / "config.json"))
    assert f"give {run}" in msg, msg
    assert "no such directory" in one_line_error(run_cli("report", tmp_path / "missing"))


def test_a_resumed_epochs_wall_time_holds_all_of_its_steps(tmp_path):
    """Stopped (^C) after step 9 of 12 (6 steps an epoch), resumed: epoch 1 ran steps 6-9 before the stop and 10-11
    after. Its wall time covered only the last two steps and read far less than the six steps' own times."""
    out = tmp_path / "run"
    args = ["train", "--epochs", "2", "--batch-size", "256", "--recal-batches", "0", "--quiet"]
    r = cptsim_here(*args, "--out", out, env_extra={"CPTSIM_FAULT_SIGINT_AT_STEP": "9"})
    assert r.exit_code == 130, (r.output, r.exception)
    r = cptsim_here("train", "--resume", out, "--quiet")
    assert r.exit_code == 0, (r.output, r.exception)
    trace = [json.loads(line) for line in (out / "trace.jsonl").read_text().splitlines()]
    assert [t["step"] for t in trace] == list(range(12))
    host = _report_json(out)["runs"][0]["host_time"]
    for e in host["per_epoch"]:
        steps_s = sum(t["time_s"] for t in trace if t["epoch"] == e["epoch"])
        assert e["epoch_wall_s"] is not None and e["epoch_wall_s"] >= steps_s, (e, steps_s)


def test_the_readme_has_no_leaked_editor_text():
    text = README.read_text()
    assert "(its text up to" not in text
    assert text.count("-->") == text.count("<!--")

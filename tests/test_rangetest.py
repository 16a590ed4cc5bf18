"""Precision range test: the q_min rule on hand-made stages, a real short run on digits, and the CLI."""

import json
import math

import pytest
from click.testing import CliRunner

from cptsim.cli.main import cli
from cptsim.errors import InputError
from cptsim.study.rangetest import RangeTestSettings, StageRow, run_range_test, suggest_q_min


def _rows(start, accs, baseline=0.1):
    rows, prev = [], baseline
    for i, a in enumerate(accs):
        rows.append(StageRow(bits=start + i, steps=10, samples=640, train_acc=a, loss=1.0, improvement=a - prev))
        prev = a
    return rows


@pytest.mark.parametrize(
    "accs, threshold, expected",
    [
        ([0.10, 0.12, 0.60, 0.90, 0.95], 0.05, (4, True)),   # 2, 3 bits do not learn; 4 bits jumps
        ([0.50, 0.80, 0.90], 0.05, (2, True)),               # learns at the first precision
        ([0.10, 0.14, 0.30], 0.05, (4, True)),               # +4 points is not more than 5
        ([0.25, 0.5, 0.875], 0.25, (4, True)),               # exactly the threshold is not *more* than it
        ([0.10, 0.16, 0.30], 0.05, (3, True)),
        ([0.10, 0.20, 0.60], 0.30, (4, True)),               # a larger threshold skips the small step
        ([0.11, 0.13, 0.16, 0.17], 0.05, (4, False)),        # none passes: largest improvement (+3 at 4 bits)
        ([0.125, 0.1875, 0.25, 0.3125], 0.07, (3, False)),   # ties (+6.25 at 3, 4, 5 bits) go to the lowest
        ([0.09, 0.08, 0.08], 0.05, (4, False)),              # never improved: top precision
    ],
)
def test_suggest_q_min_takes_the_first_precision_over_the_threshold(accs, threshold, expected):
    q_min, conclusive, reason = suggest_q_min(_rows(2, accs), threshold)
    assert (q_min, conclusive) == expected
    assert ("inconclusive" in reason) != conclusive


def test_suggest_q_min_needs_rows():
    with pytest.raises(ValueError):
        suggest_q_min([], 0.05)


@pytest.fixture(scope="module")
def tiny_run():
    return run_range_test(RangeTestSettings(steps_per_stage=3, batch_size=32, q_start=2, q_max=8))


def test_real_run_on_digits_has_a_row_per_precision(tiny_run):
    r = tiny_run
    assert [row.bits for row in r.rows] == [2, 3, 4, 5, 6, 7, 8]
    assert all(row.steps == 3 and row.samples == 96 for row in r.rows)
    assert all(0 <= row.train_acc <= 1 and math.isfinite(row.loss) for row in r.rows)
    assert 0 <= r.baseline_acc <= 1
    assert math.isclose(r.rows[0].improvement, r.rows[0].train_acc - r.baseline_acc)
    assert all(math.isclose(b.improvement, b.train_acc - a.train_acc) for a, b in zip(r.rows, r.rows[1:]))
    assert 2 <= r.suggested_q_min <= 8
    assert (r.suggested_q_min, r.conclusive, r.reason) == suggest_q_min(r.rows, r.threshold)
    doc = json.loads(json.dumps(r.to_json()))
    assert doc["format"] == "cptsim.rangetest/1" and len(doc["stages"]) == 7
    assert doc["suggested_q_min"] == r.suggested_q_min and doc["threshold"] == 0.05


def test_same_seed_same_result(tiny_run):
    again = run_range_test(RangeTestSettings(steps_per_stage=3, batch_size=32, q_start=2, q_max=8))
    assert again.rows == tiny_run.rows and again.baseline_acc == tiny_run.baseline_acc


def test_cli_json_is_one_document():
    r = CliRunner().invoke(cli, ["range-test", "--steps-per-stage", "2", "--q-start", "3", "--q-max", "5", "--json"])
    assert r.exit_code == 0, (r.output, r.exception)
    doc = json.loads(r.stdout)
    assert [s["bits"] for s in doc["stages"]] == [3, 4, 5]
    assert 3 <= doc["suggested_q_min"] <= 5


def test_cli_table_marks_the_suggestion():
    r = CliRunner().invoke(cli, ["range-test", "--steps-per-stage", "2", "--q-max", "4", "--quiet"])
    assert r.exit_code == 0, (r.output, r.exception)
    assert "<- q_min" in r.stdout and "q_min = " in r.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--q-start", "6", "--q-max", "4"], "--q-start 6 must be below --q-max 4"),
        (["--q-start", "0"], "1..16"),
        (["--q-max", "17"], "1..16"),
        (["--threshold", "0"], "--threshold"),
        (["--threshold", "1"], "--threshold"),
        (["--threshold", "-0.1"], "--threshold"),
        (["--threshold", "nan"], "--threshold"),
        (["--steps-per-stage", "0"], "--steps-per-stage"),
        (["--g-bits", "20"], "--g-bits"),
        (["--model", "nosuchmodel"], "digits-cnn"),
        (["--dataset", "imagenette"], "cifar10"),
        (["--lr", "-1"], "--lr"),
        (["--device", "tpu"], "cpu"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(args, needle):
    r = CliRunner().invoke(cli, ["range-test", *args])
    assert r.exit_code == 2, (r.output, r.exception)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert needle in lines[0]


def test_settings_validate_raises_input_error():
    with pytest.raises(InputError):
        RangeTestSettings(q_start=8, q_max=8).validate()

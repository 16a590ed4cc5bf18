"""Issue 26: the precision range test (`range-test`, `plan --min-bits auto`) and `cptsim sensitivity` probe in the
run's number format, not in CPT's integers, when a float family is given."""

import json

import pytest
import torch

from cptsim.errors import InputError
from cptsim.study.rangetest import RangeTestSettings, run_range_test, stage_bits


@pytest.mark.parametrize("family,lo,hi,want", [
    ("int", 2, 8, [2, 3, 4, 5, 6, 7, 8]),
    ("mx", 2, 8, [4, 6, 8]),  # 2, 3 run MXFP4 as 4 does: one stage per distinct format, at its widest width
    ("fp", 3, 7, [4, 6, 7]),  # 7 is q_max: it names fp8e4m3, as 8 would
    ("nvfp", 2, 8, [4, 8]),
    ("mx", 5, 16, [6, 8, 16]),
])
def test_stages_are_one_per_distinct_format(family, lo, hi, want):
    assert stage_bits(RangeTestSettings(number_format=family, q_start=lo, q_max=hi)) == want


def test_a_range_naming_one_format_is_refused():
    with pytest.raises(InputError, match="name one mx format only"):
        RangeTestSettings(number_format="mx", q_start=2, q_max=4).validate()
    with pytest.raises(InputError, match="unknown number format family"):
        RangeTestSettings(number_format="posit").validate()
    with pytest.raises(InputError, match="needs a float --number-format"):
        RangeTestSettings(grad_format="fp8e5m2").validate()


def test_range_test_trains_in_the_family_formats():
    r = run_range_test(RangeTestSettings(number_format="mx", grad_format="mxfp8", steps_per_stage=1, batch_size=16))
    assert [(row.bits, row.format) for row in r.rows] == [(4, "mxfp4"), (6, "mxfp6"), (8, "mxfp8")]
    assert r.suggested_q_min in (4, 6, 8) and "mx family" in r.reason
    doc = r.to_json()
    assert doc["settings"]["number_format"] == "mx" and doc["settings"]["grad_format"] == "mxfp8"
    assert [s["format"] for s in doc["stages"]] == ["mxfp4", "mxfp6", "mxfp8"]


def test_integer_range_test_document_is_unchanged():
    from cptsim.study.rangetest import RangeTestResult, StageRow

    rt = RangeTestResult(settings=RangeTestSettings(), baseline_acc=0.1, suggested_q_min=4, conclusive=True,
                         reason="r", rows=[StageRow(bits=4, steps=1, samples=64, train_acc=0.5, loss=1.0,
                                                    improvement=0.4)], steps_per_stage=1)
    doc = rt.to_json()
    assert "number_format" not in doc["settings"] and "grad_format" not in doc["settings"]
    assert "format" not in doc["stages"][0]


def test_plan_min_bits_auto_probes_in_the_plans_format(tmp_path):
    from shared_runs import cptsim_here

    r = cptsim_here("plan", "--budget", "100%", "--hw", "b200", "--number-format", "mx", "--min-bits", "auto",
                    "--range-steps", "1", "--schedules", "cos-rep,static", "--cycles", "8",
                    "--out", tmp_path / "p.json", "--json")
    assert r.exit_code == 0, (r.output, r.exception)
    doc = json.loads(r.stdout)
    rt = doc["range_test"]
    assert rt["settings"]["number_format"] == "mx" and [s["format"] for s in rt["stages"]] == ["mxfp4", "mxfp6",
                                                                                                 "mxfp8"]
    assert doc["space"]["min_bits"] == rt["suggested_q_min"] in (4, 6, 8)


def test_range_test_cli_names_the_formats(tmp_path):
    from shared_runs import cptsim_here

    r = cptsim_here("range-test", "--number-format", "nvfp", "--steps-per-stage", "1", "--batch-size", "16",
                    "--q-start", "3", "--q-max", "8")
    assert r.exit_code == 0, (r.output, r.exception)
    assert "nvfp4" in r.stdout and "fp8e4m3" in r.stdout and "format" in r.stdout
    r = cptsim_here("range-test", "--number-format", "mx", "--q-start", "2", "--q-max", "3")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1 and "one mx format" in r.stderr


def test_sensitivity_probes_in_the_format_q_min_names():
    from cptsim.numerics.formats import quantize
    from cptsim.study.sensitivity import Settings, measure, weight_perturbation

    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    want = float(((quantize(w, "mxfp4", dim=1) - w) ** 2).sum())
    assert weight_perturbation(w, 4, "mxfp4") == want != weight_perturbation(w, 4)
    kw = dict(warmup=2, batches=1, samples=1, q_min=4, q_max=8)
    mx = measure(Settings(number_format="mx", **kw))
    it = measure(Settings(**kw))
    assert mx["number_format"] == {"family": "mx", "grad_format": None, "q_min_format": "mxfp4",
                                   "q_max_format": "mxfp8"}
    assert "number_format" not in it and mx["workload_key"] != it["workload_key"]
    by = {r["name"]: r for r in mx["layers"]}
    assert all(by[r["name"]]["loss"] != r["loss"] for r in it["layers"])  # each layer ran MXFP4, not int4
    assert all(by[r["name"]]["weight_delta_sq"] != r["weight_delta_sq"] for r in it["layers"])
    with pytest.raises(InputError, match="unknown number format family"):
        Settings(number_format="posit").validate()


def test_sensitivity_cli_takes_the_format(tmp_path):
    from shared_runs import cptsim_here

    r = cptsim_here("sensitivity", "--number-format", "fp", "--grad-format", "fp8e5m2", "--q-min", "4",
                    "--warmup", "1", "--batches", "1", "--samples", "1", "--method", "loss", "--json")
    assert r.exit_code == 0, (r.output, r.exception)
    doc = json.loads(r.stdout)
    assert doc["number_format"]["q_min_format"] == "fp4e2m1" and doc["number_format"]["grad_format"] == "fp8e5m2"


def test_sweep_top_plans_in_the_sweeps_formats(monkeypatch):
    """`cptsim sweep --number-format mx --top K --budget B --hw H` plans the MX workload, not the integer one (the
    workload's build is stubbed: what matters is what it is asked for)."""
    import cptsim.planner as P
    from cptsim.study.sweep import SweepSettings, planner_schedules

    seen = {}

    def build(**kw):
        seen.update(kw)
        raise InputError("stop")

    monkeypatch.setattr(P.Workload, "build", staticmethod(build))
    with pytest.raises(InputError, match="stop"):
        planner_schedules(SweepSettings(number_format="mx", grad_format="fp8e5m2", steps=20), ["60%"], "b200", 1)
    assert seen["number_format"] == "mx" and seen["grad_format"] == "fp8e5m2"
    with pytest.raises(InputError, match="stop"):
        planner_schedules(SweepSettings(steps=20), ["60%"], "b200", 1)
    assert seen["number_format"] == "int" and seen["grad_format"] is None

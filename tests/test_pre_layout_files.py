"""Files written by cptsim before the layout became one package per stage (main @ fb8bbd5) load after it.

tests/data/pre_layout/ was written by that commit's code: ``cptsim plan --budget 65% --hw bitfusion --steps 12``
(plan.json), ``cptsim train --plan plan.json`` (run/, checkpoints left out), ``cptsim train --model digits-cnn
--schedule cpt:3-8:g8:n2 --steps 46`` stopped by SIGINT after step 31 (partial/, its checkpoint kept),
``cptsim profile --model digits-cnn --json`` (profile_cmd.json) and a two-run ``cptsim sweep`` (results.db).
A checkpoint pickles what the loop saved; a renamed module in it would make every old run unresumable.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cli_util import run_cli

DATA = Path(__file__).parent / "data" / "pre_layout"


def test_an_old_plan_reads_and_trains_exactly(tmp_path):
    from cptsim.planner.planfile import read_plan

    plan = read_plan(str(DATA / "plan.json"))
    r = run_cli("train", "--plan", DATA / "plan.json", "--out", tmp_path / "run", "--json")
    assert r.exit_code == 0, r.output
    trace = [json.loads(line) for line in (tmp_path / "run" / "trace.jsonl").read_text().splitlines()]
    assert len(trace) == plan["workload"]["steps"] == 12


def test_an_old_run_reports_its_executed_bitops_equal_to_its_plan(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(DATA / "run", run)
    r = run_cli("report", run, "--hw", "bitfusion", "--json", "--no-save")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)["runs"][0]["bitops"]
    assert doc["within_tolerance"] and doc["executed"]["total"] > 0


def test_an_old_stopped_run_resumes_from_its_checkpoint(tmp_path):
    run = tmp_path / "partial"
    shutil.copytree(DATA / "partial", run)
    before = (run / "trace.jsonl").read_text().splitlines()
    assert json.loads(before[-1])["step"] == 30
    r = run_cli("train", "--resume", run)
    assert r.exit_code == 0, r.output
    steps = [json.loads(line)["step"] for line in (run / "trace.jsonl").read_text().splitlines()]
    assert steps == list(range(46))
    assert (run / "trace.jsonl").read_text().splitlines()[:31] == before  # the old lines kept as they were


def test_an_old_profile_loads_as_the_same_layer_profile():
    from cptsim.profiler import profile_model  # noqa: F401  (DESIGN's public name still imports)
    from cptsim.measure.profiler import LayerProfile, profile_named_model

    old = LayerProfile.from_json(json.loads((DATA / "profile_cmd.json").read_text()))
    new = profile_named_model("digits-cnn", (1, 8, 8), 10)
    assert [(l.name, l.quantized, l.macs) for l in old.layers] == [(l.name, l.quantized, l.macs) for l in new.layers]


def test_an_old_results_database_opens_and_reports(tmp_path):
    from cptsim.study.results import ResultsDB

    db_path = tmp_path / "results.db"  # a copy: opening may write (journal, schema checks)
    shutil.copy(DATA / "results.db", db_path)
    with ResultsDB(str(db_path)) as db:
        rows = list(db.rows())
    assert sorted(r["schedule"] for r in rows) == ["cos-rep:3-8:g8:n2", "static:8:g8"]
    r = run_cli("sweep", "--report", "--db", db_path, "--json")
    assert r.exit_code == 0, r.output

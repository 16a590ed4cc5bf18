"""`cptsim sweep` with per-layer plans (issue 27) and number formats (issue 26) passed through to its runs.

Every check here is a --dry-run (the runs and their `cptsim train` commands, nothing trained or written) or plain
data, so the file costs about a second: the bookkeeping of a per-layer run (executed = planned, kill/resume) is
tested with `cptsim train` itself (tests/test_layerplan.py)."""

import json

import pytest
from click.testing import CliRunner

from cptsim.cli.main import cli
from cptsim.errors import InputError
from cptsim.study import cluster as C
from cptsim.study import sweep as SW


def _cli(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _dry(tmp_path, *args):
    r = _cli("sweep", "--steps", "4", "--dry-run", "--json", "--out", tmp_path / "sw", *args)
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "sw").exists()  # a dry run writes nothing
    return json.loads(r.stdout)


def _flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_entries_with_layer_rules_parse_canonically_and_name_their_runs():
    got = SW.parse_schedule_list("cpt:2-4:g8:n8, cpt:2-4:g8:n8@features.0=+1 ; features.3=2-3,static:3")
    assert got == ["cos-rep:2-4:g8:n8", "cos-rep:2-4:g8:n8@features.0=+1;features.3=2-3", "static:3:g8"]
    assert SW.split_entry(got[1]) == ("cos-rep:2-4:g8:n8", "features.0=+1;features.3=2-3")
    name = SW.run_name(got[1], 1)
    assert name.startswith("cos-rep_2-4_g8_n8-L") and name.endswith("-s1") and "*" not in name
    assert SW.run_name(got[0], 1) == "cos-rep_2-4_g8_n8-s1" != name  # a uniform run keeps its old name
    # --layer gives its rules to the entries without their own
    assert SW.with_layers(["static:3:g8", "static:3:g8@features.0=4"], "features.7=2") == \
        ["static:3:g8@features.7=2", "static:3:g8@features.0=4"]
    run = SW.SweepRun(schedule=got[1], seed=0, path=SW.Path("x"), log=SW.Path("x.log"))
    assert run.global_schedule == "cos-rep:2-4:g8:n8" and run.layer_rules == ["features.0=+1", "features.3=2-3"]


def test_layer_rules_reach_each_runs_train_command_and_a_cluster_jobs(tmp_path):
    doc = _dry(tmp_path, "--schedules", "cpt:2-4:g8:n8,static:3@features.0=4;features.3=2",
               "--layer", "features.7=+1", "--seeds", "0,1")
    entries = [r["schedule"] for r in doc["runs"]]
    assert entries == ["cos-rep:2-4:g8:n8@features.7=+1"] * 2 + ["static:3:g8@features.0=4;features.3=2"] * 2
    cmds = {name: cmd.split() for name, cmd in doc["train"].items()}
    assert len(cmds) == 4
    for r in doc["runs"]:
        argv = cmds[r["name"]]
        sched, rules = SW.split_entry(r["schedule"])
        assert _flag_values(argv, "--schedule") == [sched]
        assert _flag_values(argv, "--layer") == rules.split(";")
        assert _flag_values(argv, "--seed") == [str(r["seed"])]
    # a cluster job trains the same command (one place spells it)
    run = SW.SweepRun(schedule=entries[2], seed=0, path=tmp_path / "r", log=tmp_path / "r.log")
    job = C.TrainJob(C.run_spec(SW.SweepSettings(steps=4), run)).command(resume=False)
    assert _flag_values(job, "--layer") == ["features.0=4", "features.3=2"]


def test_a_layer_schedule_file_and_a_per_layer_plan_become_entries(tmp_path, monkeypatch):
    import cptsim.run.planfile as PF  # where the plan is read (cptsim.planner.planfile re-exports it)

    f = tmp_path / "layers.toml"
    f.write_text('format = "cptsim.layers/1"\nmodel = "digits-cnn"\n[layers]\n"features.*" = "+1"\n')
    plan = {  # the parts of a `plan --per-layer` plan.json that a sweep reads (read_plan checks the rest)
        "format": "cptsim.plan/1", "workload": {"model": "digits-cnn", "dataset": "digits", "batch_size": 64,
                                                "steps": 4},
        "schedule": {"name": "static", "q_min": 3, "q_max": 3, "g_min": 8, "g_max": 8, "cycles": 1},
        "layers": {"format": "cptsim.layers/1", "rules": ["features.0=+1", "features.3=-1"]}}
    monkeypatch.setattr(PF, "read_plan", lambda path: plan)
    doc = _dry(tmp_path, "--schedules", "cpt:2-4:g8:n8", "--layer-schedule", f, "--layer-plan", "plan.json")
    assert [r["schedule"] for r in doc["runs"]] == ["cos-rep:2-4:g8:n8@features.*=+1",
                                                    "static:3:g8@features.0=+1;features.3=-1"]
    # a plan of another workload: its rules and costs would not hold -- one line, exit 2
    plan["workload"]["batch_size"] = 32
    r = _cli("sweep", "--steps", "4", "--dry-run", "--out", tmp_path / "sw", "--layer-plan", "plan.json")
    assert r.exit_code == 2 and "another workload" in r.stderr and "batch_size 32" in r.stderr, r.output


def test_number_and_gradient_formats_reach_the_runs_and_the_workload(tmp_path):
    s = SW.SweepSettings(steps=4, number_format="fp", grad_format="fp8e5m2")
    f = s.train_flags()
    assert _flag_values(f, "--number-format") == ["fp"] and _flag_values(f, "--grad-format") == ["fp8e5m2"]
    assert s.workload()["number_format"] == "fp"
    plain = SW.SweepSettings(steps=4)  # without them: the workload (and an old sweep's) is unchanged
    assert "number_format" not in plain.workload() and "--number-format" not in plain.train_flags()
    assert SW.SweepSettings(steps=4, number_format="int").workload() == plain.workload()  # train's default, named
    doc = _dry(tmp_path, "--schedules", "cpt:2-4", "--number-format", "fp", "--grad-format", "fp8e5m2")
    argv = next(iter(doc["train"].values())).split()
    assert _flag_values(argv, "--number-format") == ["fp"] and _flag_values(argv, "--grad-format") == ["fp8e5m2"]


def test_report_keeps_a_per_layer_run_apart_from_the_uniform_run_of_its_schedule():
    base = {"workload_key": "k", "workload": {}, "family": "static", "q_max": 3, "g_max": 8, "steps": 10,
            "bitops_static": 100.0}
    rows = [base | {"schedule": "static:3:g8", "seed": s, "test_acc": 0.5 + s / 10, "bitops": 100.0, "extra": {}}
            for s in (0, 1)]
    rows += [base | {"schedule": "static:3:g8", "seed": s, "test_acc": 0.9, "bitops": 90.0,
                     "extra": {"layers": "features.0=+1"}} for s in (0, 1)]
    rep = SW.sweep_report(rows)
    by = {t["schedule"]: t for t in rep["schedules"]}
    assert set(by) == {"static:3:g8", "static:3:g8@features.0=+1"}
    pl = by["static:3:g8@features.0=+1"]
    assert pl["layers"] == "features.0=+1" and pl["acc_mean"] == pytest.approx(0.9) and pl["score"] is None
    assert pl["cost_rel"] == pytest.approx(0.9) and by["static:3:g8"]["acc_mean"] == pytest.approx(0.55)


@pytest.mark.parametrize("args,needle", [
    (["--schedules", "cpt:2-4", "--layer", "nosuch=3"], "matches no quantized layer"),
    (["--schedules", "cpt:2-4", "--layer", "features.0=20"], "outside 1..16"),
    (["--schedules", "static:3@features.0=2-4"], "range needs a cyclic"),
    (["--schedules", "cpt:2-4", "--grad-format", "fp8e5m2"], "--grad-format"),
    (["--schedules", "cpt:2-4", "--number-format", "nosuch"], "nosuch"),
])
def test_bad_layer_rules_or_formats_are_one_line_and_exit_2_before_any_run(args, needle, tmp_path):
    r = _cli("sweep", "--steps", "4", "--dry-run", "--out", tmp_path / "sw", *args)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr
    assert not (tmp_path / "sw").exists()


def test_a_per_layer_run_is_recognised_on_rerun_and_its_row_names_its_rules(tmp_path):
    """A rerun of the sweep finds the run its entry names (the rules compared with the run's config.json), refuses a
    directory that holds the run of another entry, and the run's results row names its rules (``row_entry``)."""
    from cptsim.study.resultfile import record_result

    entry = SW.canonical_entry("cpt:2-4:g8:n2@features.0=+1")
    out = tmp_path / "sw"
    run = out / SW.run_name(entry, 0)
    r = _cli("train", "--model", "digits-cnn", "--steps", "2", "--schedule", "cpt:2-4:g8:n2", "--layer",
             "features.0=+1", "--seed", "0", "--recal-batches", "0", "--out", run, "--quiet", "--json")
    assert r.exit_code == 0, r.output
    (done,) = SW.prepare(out, SW.SweepSettings(steps=2), [entry], [0], write=False)
    assert done.action == "record"  # trained: only its result record is missing
    row = record_result(run, "sweep")
    assert row["schedule"] == "cos-rep:2-4:g8:n2" and SW.row_entry(row) == entry
    uniform = out / SW.run_name("cos-rep:2-4:g8:n2", 0)
    run.rename(uniform)  # the uniform entry's directory now holds the per-layer run
    with pytest.raises(InputError, match="features.0"):
        SW.prepare(out, SW.SweepSettings(steps=2), ["cos-rep:2-4:g8:n2"], [0], write=False)

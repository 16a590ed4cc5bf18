"""`cptsim sweep`: schedules x seeds as separate training processes, resumable as a whole, rows in the results
database, and a report whose numbers match a hand computation.

The runs are tiny (digits-cnn on the embedded digits set, 4 steps): what is tested is the bookkeeping, not the
accuracy."""

import fcntl
import json
import math
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from cptsim.study import sweep as SW
from cptsim.cli.main import cli
from cptsim.errors import InputError
from cptsim.study.results import ResultsDB

STEPS = "4"


def _cli(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _one_line_error(r, needle):
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr


# ------------------------------------------------------------------------------------------------ input


def test_seeds_and_schedules_parse_to_canonical_distinct_lists():
    assert SW.parse_seeds("0,1,2") == [0, 1, 2]
    assert SW.parse_seeds("0-2,5,1") == [0, 1, 2, 5]
    assert SW.parse_schedule_list("cpt:3-8:g8:n32, cos-rep:3-8 ,static:5") == ["cos-rep:3-8:g8:n32", "static:5:g8"]
    assert SW.run_name("cos-rep:3-8:g8:n32", 2) == "cos-rep_3-8_g8_n32-s2"
    for bad in ("x", "3-1", ""):
        with pytest.raises(InputError):
            SW.parse_seeds(bad)


def test_train_flags_spell_out_the_workload():
    s = SW.SweepSettings(steps=7, lr=0.05, fp_layers=[], augment=False)
    f = s.train_flags()
    assert f[f.index("--steps") + 1] == "7" and "--epochs" not in f
    assert f[f.index("--lr") + 1] == "0.05" and f[f.index("--fp-layers") + 1] == "none" and "--no-augment" in f
    assert "device" not in s.workload() and s.workload()["steps"] == 7


def test_a_sweep_holds_out_a_validation_split_by_default_and_the_database_records_it(one_run_sweep, tmp_path):
    """Issue 22 item 1: every run of a sweep holds out the planner's validation fraction of its training data
    (what ``plan --quality db`` fits to), its row records the validation accuracy, and the row is found under the
    key the planner looks up (``measured_workload``). A sweep directory written before the split existed (its
    sweep.json has no val_split: nothing was held out) continues only with --val-split 0."""
    from cptsim.planner import Workload
    from cptsim.planner.quality import measured_workload
    from cptsim.run.config import VAL_SPLIT
    from cptsim.study.results import workload_key

    s = SW.SweepSettings(steps=int(STEPS))
    assert s.val_split == VAL_SPLIT and s.workload()["val_split"] == VAL_SPLIT
    f = s.train_flags()
    assert float(f[f.index("--val-split") + 1]) == VAL_SPLIT
    out, db = one_run_sweep["as_made"]  # `sweep --schedules static:4 --steps 4`, exit code 0
    with ResultsDB(db) as d:
        (row,) = d.rows()
    cfg = json.loads((out / "static_4_g8-s0" / "config.json").read_text())
    assert cfg["settings"]["val_split"] == VAL_SPLIT and row["val_size"] == cfg["val_size"] > 0
    assert 0 <= row["val_acc"] <= 1
    assert row["workload_key"] == workload_key(measured_workload(Workload.build(steps=int(STEPS))))
    old = tmp_path / "old"
    old.mkdir()
    wl = {k: v for k, v in s.workload().items() if k != "val_split"}
    (old / SW.SWEEP_FILE).write_text(json.dumps({"format": SW.SWEEP_FORMAT, "workload": wl, "schedules": [],
                                                 "seeds": []}))
    with pytest.raises(InputError, match="val_split 0.0 there, 0.2 now"):
        SW.prepare(old, s, ["static:4:g8"], [0])
    assert len(SW.prepare(old, SW.SweepSettings(steps=int(STEPS), val_split=0.0), ["static:4:g8"], [0])) == 1


@pytest.mark.parametrize("args,needle", [
    (["--schedules", "cpt", "--jobs", "0", "--out", "X"], "--jobs must be at least 1"),
    (["--schedules", "cpt", "--seeds", "a", "--out", "X"], "--seeds"),
    (["--schedules", "nosuch", "--out", "X"], "nosuch"),
    (["--schedules", "cpt"], "--out DIR is required"),
    (["--out", "X"], "nothing to sweep"),
    (["--schedules", "cpt", "--budget", "60%", "--out", "X"], "go with --top"),
    (["--top", "2", "--out", "X"], "needs --budget"),
    (["--schedules", "cpt", "--model", "nosuchnet", "--out", "X"], "nosuchnet"),
    (["--schedules", "cpt", "--lr", "-1", "--out", "X"], "--lr"),
    (["--report", "--out", "."], "not a sweep directory"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _one_line_error(_cli("sweep", "--db", tmp_path / "r.db", *args) if "--report" not in args
                    else _cli("sweep", *args), needle)
    assert not (tmp_path / "X").exists()


def test_top_k_takes_the_planners_best_within_each_budget():
    picked = SW.planner_schedules(SW.SweepSettings(steps=40), ["60%", "80%"], "bitfusion", 2)
    assert [p["budget"] for p in picked] == ["60%", "60%", "80%", "80%"]
    assert all(p["vs_baseline"] <= float(p["budget"][:-1]) / 100 + 1e-9 for p in picked)
    assert picked[0]["rank"] == 1 and picked[2]["rank"] == 1


# ------------------------------------------------------------------------------------------------ the report


def _rows():
    """Four schedules x three seeds with accuracies chosen so the statistics are easy to do by hand."""
    accs = {"static:4:g8": [0.50, 0.52, 0.54], "cos-rep:3-8:g8:n2": [0.60, 0.58, 0.62],
            "lin-tri:3-8:g8:n1": [0.55, 0.57, 0.65], "static:8:g8": [0.70, 0.71, 0.72]}
    bitops = {"static:4:g8": 1e9, "cos-rep:3-8:g8:n2": 2e9, "lin-tri:3-8:g8:n1": 3e9, "static:8:g8": 10e9}
    rows = []
    for text, a in accs.items():
        fam, q = text.split(":")[0], int(text.split(":")[1].split("-")[-1])
        for seed, acc in enumerate(a):
            rows.append({"workload_key": "k", "workload": {"model": "m", "dataset": "d", "steps": 4, "batch_size": 8},
                         "schedule": text, "family": fam, "q_max": q, "g_max": 8, "seed": seed, "steps": 4,
                         "bitops": bitops[text], "bitops_static": 10e9 if q == 8 else 5e9, "test_acc": acc,
                         "eval_bits": q, "run_path": f"/r/{text}-{seed}"})
    return rows


SCORES = {"static:4:g8": 0.1, "cos-rep:3-8:g8:n2": 0.2, "lin-tri:3-8:g8:n1": 0.3, "static:8:g8": 0.4}


def test_report_numbers_match_a_hand_computation():
    rep = SW.sweep_report(_rows(), score_fn=lambda text, steps: SCORES[text])
    by = {t["schedule"]: t for t in rep["schedules"]}
    assert [t["schedule"] for t in rep["schedules"]] == ["static:4:g8", "cos-rep:3-8:g8:n2", "lin-tri:3-8:g8:n1",
                                                         "static:8:g8"]  # by cost
    assert by["static:4:g8"]["acc_mean"] == pytest.approx(0.52) and by["static:4:g8"]["acc_std"] == pytest.approx(0.02)
    assert by["lin-tri:3-8:g8:n1"]["acc_mean"] == pytest.approx(0.59)
    assert by["lin-tri:3-8:g8:n1"]["acc_std"] == pytest.approx(math.sqrt((0.04**2 + 0.02**2 + 0.06**2) / 2))
    assert by["static:8:g8"]["acc_std"] == pytest.approx(0.01) and by["static:8:g8"]["n"] == 3
    # cost: BitOPs over the costliest static baseline among the rows (static 8 at 10e9)
    assert rep["cost_reference"] == {"schedule": "static:8:g8", "bitops": 10e9}
    assert [t["cost_rel"] for t in rep["schedules"]] == pytest.approx([0.1, 0.2, 0.3, 1.0])
    # means .52 .60 .59 .71 rank 1 3 2 4 against scores 1 2 3 4: rho = 1 - 6*(0+1+1+0)/(4*15) = 0.8
    sp = rep["spearman"]
    assert sp["rho"] == pytest.approx(0.8) and sp["n_schedules"] == 4
    # per seed: seeds 0 and 1 rank like the means (0.8); seed 2 (.54 .62 .65 .72) ranks like the scores (1.0)
    assert sp["per_seed"] == pytest.approx({"0": 0.8, "1": 0.8, "2": 1.0})
    assert sp["per_seed_mean"] == pytest.approx(2.6 / 3)
    assert sp["per_seed_std"] == pytest.approx(math.sqrt(((0.8 - 2.6 / 3) ** 2 * 2 + (1.0 - 2.6 / 3) ** 2) / 2))


def test_report_refuses_rows_of_two_workloads_and_says_when_no_correlation_exists():
    rows = _rows()
    rows[0] = dict(rows[0], workload_key="other")
    with pytest.raises(InputError, match="2 workloads"):
        SW.sweep_report(rows)
    two = [r for r in _rows() if r["schedule"] in ("static:4:g8", "static:8:g8")]
    rep = SW.sweep_report(two, score_fn=lambda text, steps: SCORES[text])
    assert rep["spearman"]["rho"] is None and rep["notes"]


def test_report_figure_is_a_png():
    from cptsim.study.plots import sweep_figure

    png = sweep_figure(SW.sweep_report(_rows(), score_fn=lambda text, steps: SCORES[text]))
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


# ------------------------------------------------------------------------------------------------ running


def _sweep_args(out, db, schedules, seeds="0"):
    return ["sweep", "--schedules", schedules, "--seeds", seeds, "--steps", STEPS, "--out", out, "--db", db]


@pytest.fixture(scope="module")
def one_run_sweep(tmp_path_factory):
    """`sweep --schedules static:4 --seeds 0 --steps 4`, finished, made once for the two tests that begin with it:
    "as_made" (out, db) a copy of it, which the tests only read; "grown" (out, db) the sweep itself, which
    test_a_killed_sweep... grows in place and is the only one to use."""
    import shutil

    base = tmp_path_factory.mktemp("one-run-sweep")
    out, db = base / "sw", base / "results.db"
    r = _cli(*_sweep_args(out, db, "static:4"), "--json")
    assert r.exit_code == 0, r.output
    copy = base / "as-made"
    shutil.copytree(out, copy / "sw")
    for f in base.glob(db.name + "*"):  # the database and any WAL files beside it
        shutil.copy2(f, copy / f.name)
    return {"as_made": (copy / "sw", copy / db.name), "grown": (out, db)}


def test_a_killed_sweep_reruns_only_its_unfinished_runs_and_two_sweeps_share_one_database(one_run_sweep, tmp_path,
                                                                                          monkeypatch):
    # 1. one run finishes (the module's sweep, grown here in place: its rows name their run directories)
    out, db = one_run_sweep["grown"]
    done = out / "static_4_g8-s0"
    stamp = {p.name: p.stat().st_mtime_ns for p in done.iterdir()}
    # 2. the sweep grows by one schedule, whose training is killed (SIGKILL) at step 2
    monkeypatch.setenv("CPTSIM_FAULT_KILL_AT_STEP", "2")
    r = _cli(*_sweep_args(out, db, "static:4,cpt:3-8:g8:n2"), "--json")
    assert r.exit_code == 1 and "1 of 2 runs did not finish" in r.stderr, r.output
    doc = json.loads(r.stdout)
    assert [(x["action"], x["status"]) for x in doc["runs"]] == [("skip", "done"), ("new", "failed")]
    killed = out / "cos-rep_3-8_g8_n2-s0"
    assert len((killed / "trace.jsonl").read_text().splitlines()) == 2
    monkeypatch.delenv("CPTSIM_FAULT_KILL_AT_STEP")
    # 3. rerun it, while another sweep writes to the same database from another process
    other = subprocess.Popen([sys.executable, "-m", "cptsim.cli.main", *map(str, _sweep_args(
        tmp_path / "sw2", db, "static:4", seeds="1")), "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    r = _cli(*_sweep_args(out, db, "static:4,cpt:3-8:g8:n2"), "--json")
    o_out, o_err = other.communicate(timeout=300)
    assert r.exit_code == 0, r.output
    assert other.returncode == 0, o_err.decode()
    doc = json.loads(r.stdout)
    assert [(x["name"], x["action"], x["status"]) for x in doc["runs"]] == [
        ("static_4_g8-s0", "skip", "done"), ("cos-rep_3-8_g8_n2-s0", "resume", "done")]
    assert {p.name: p.stat().st_mtime_ns for p in done.iterdir()} == stamp  # the finished run was not touched
    assert "--resume" in (out / "cos-rep_3-8_g8_n2-s0.log").read_text()
    assert len((killed / "trace.jsonl").read_text().splitlines()) == int(STEPS)
    with ResultsDB(db) as d:
        rows = d.rows()
    assert sorted((x["schedule"], x["seed"]) for x in rows) == [
        ("cos-rep:3-8:g8:n2", 0), ("static:4:g8", 0), ("static:4:g8", 1)]
    assert len({x["workload_key"] for x in rows}) == 1 and all(x["source"] == "sweep" for x in rows)
    assert {x["run_path"] for x in rows} >= {str(done.resolve()), str(killed.resolve())}
    # 4. the report from the directory and from the database agree
    r = _cli("sweep", "--report", "--out", out, "--json", "--plot", tmp_path / "sw.png")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert {t["schedule"]: t["n"] for t in rep["schedules"]} == {"static:4:g8": 1, "cos-rep:3-8:g8:n2": 1}
    assert (tmp_path / "sw.png").read_bytes()[:4] == b"\x89PNG"
    r = _cli("sweep", "--report", "--db", db, "--json")
    assert r.exit_code == 0, r.output
    assert {t["schedule"]: t["n"] for t in json.loads(r.stdout)["schedules"]} == {"static:4:g8": 2,
                                                                                   "cos-rep:3-8:g8:n2": 1}
    # 5. another workload into the same directory is refused
    _one_line_error(_cli("sweep", "--schedules", "static:4", "--steps", "5", "--out", out, "--db", db),
                    "another workload")


def test_a_run_held_by_a_live_process_is_left_alone(tmp_path):
    out = tmp_path / "sw"
    out.mkdir()
    (out / SW.SWEEP_FILE).write_text(json.dumps({"format": SW.SWEEP_FORMAT, "workload": SW.SweepSettings(
        steps=int(STEPS)).workload(), "schedules": [], "seeds": []}))
    fd = os.open(out / ".static_4_g8-s0.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a `cptsim train` of an earlier, killed sweep would hold it
    try:
        r = _cli(*_sweep_args(out, tmp_path / "r.db", "static:4"), "--json")
    finally:
        os.close(fd)
    assert r.exit_code == 1, r.output
    assert [(x["action"], x["status"]) for x in json.loads(r.stdout)["runs"]] == [("busy", "busy")]
    assert not (out / "static_4_g8-s0").exists()


def test_plan_sweep_then_plan_quality_db_finds_the_sweeps_rows_on_a_synthetic_dataset(tmp_path):
    """Issue 22 item 6: one workload had two keys -- the plan keyed the canonical dataset name
    (synthetic:1,8,8:4:1024), its runs the string given (synthetic:1,8,8:4) -- so `plan --quality db` never found
    the rows of a sweep of the plan's own workload. One function keys the resolved workload for all of them."""
    from cptsim.run.config import workload_key as key_of

    ds = "synthetic:1,8,8:4"
    wl = ["--dataset", ds, "--steps", STEPS]
    r = _cli("plan", "--budget", "65%", *wl, "--out", tmp_path / "p1.json", "--json", "--quiet")
    assert r.exit_code == 0, r.output
    first = json.loads((tmp_path / "p1.json").read_text())
    out, db = tmp_path / "sw", tmp_path / "r.db"
    r = _cli("sweep", "--schedules", f"{first['schedule']['text']},static:4", "--seeds", "0", *wl, "--out", out,
             "--db", db, "--quiet")
    assert r.exit_code == 0, r.output
    with ResultsDB(db) as d:
        rows = d.rows()
    assert len(rows) == 2 and len({x["workload_key"] for x in rows}) == 1
    config = json.loads((out / "static_4_g8-s0" / "config.json").read_text())
    assert config["workload_key"] == rows[0]["workload_key"]  # train records the key its row gets
    r = _cli("plan", "--budget", "65%", *wl, "--quality", "db", "--db", db, "--out", tmp_path / "p2.json", "--json",
             "--quiet")
    assert r.exit_code == 0, r.output
    q = json.loads(r.stdout)["quality"]
    assert q["workload_key"] == rows[0]["workload_key"] and q["runs"] == 2, q
    assert key_of(json.loads((tmp_path / "p2.json").read_text())["workload"] | {"dataset_size": 819}) == \
        q["workload_key"]  # the plan's workload, as a sweep trains it (a fifth held out)

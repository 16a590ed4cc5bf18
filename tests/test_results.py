"""The results database: schema, one row per run path, concurrent writers, rows from real run directories."""

import json
import multiprocessing as mp
import sqlite3
import time

import pytest

from cptsim.errors import InputError
from cptsim.study.results import (COLUMN_NAMES, SCHEMA_VERSION, ResultsDB, default_db_path, proxy_score, record_run,
                            run_row, workload_key)
from cptsim.cost.schedules import parse_schedule

WORKLOAD = {"model": "digits-cnn", "dataset": "digits", "dataset_size": 1437, "batch_size": 64, "steps": 3,
            "lr": 0.1, "lr_schedule": "cosine", "momentum": 0.9, "weight_decay": 5e-4, "fp_layers": ["fc"],
            "augment": True}


def _row(i: int, **kw) -> dict:
    r = {"workload_key": workload_key(WORKLOAD), "workload": WORKLOAD, "schedule": "cos-rep:3-8:g8:n32",
         "seed": i, "steps": 3, "bitops": 1.0e9, "bitops_static": 2.0e9, "bitops_rel": 0.5, "score": 0.9,
         "test_acc": 0.5, "test_loss": 1.0, "eval_bits": 8, "source": "sweep", "run_path": f"/runs/r{i}"}
    r.update(kw)
    return r


def test_new_database_has_the_schema_its_version_and_wal_mode(tmp_path):
    path = tmp_path / "sub" / "results.db"
    ResultsDB(path).close()
    con = sqlite3.connect(path)
    assert con.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    cols = [r[1] for r in con.execute("PRAGMA table_info(runs)")]
    assert cols == ["id", *COLUMN_NAMES]
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()
    ResultsDB(path).close()  # reopening neither fails nor adds a second version row
    con = sqlite3.connect(path)
    assert con.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == 1


def test_a_database_from_a_newer_cptsim_is_refused(tmp_path):
    path = tmp_path / "r.db"
    ResultsDB(path).close()
    con = sqlite3.connect(path)
    con.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    con.commit()
    con.close()
    with pytest.raises(InputError, match="newer cptsim"):
        ResultsDB(path)


def test_a_file_that_is_not_a_database_is_an_input_error(tmp_path):
    bad = tmp_path / "r.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(InputError, match="not a cptsim results database"):
        ResultsDB(bad)
    with pytest.raises(InputError, match="directory"):
        ResultsDB(tmp_path)


def test_default_path_follows_cptsim_db_then_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("CPTSIM_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_db_path() == tmp_path / "xdg" / "cptsim" / "results.db"
    monkeypatch.setenv("CPTSIM_DB", str(tmp_path / "mine.db"))
    assert default_db_path() == tmp_path / "mine.db"


def test_adding_the_same_run_path_twice_replaces_its_row(tmp_path):
    with ResultsDB(tmp_path / "r.db") as db:
        a = db.add_run(_row(0, test_acc=0.4))
        b = db.add_run(_row(0, test_acc=0.6))
        db.add_run(_row(1))
        rows = db.rows()
    assert a == b
    assert [r["seed"] for r in rows] == [0, 1]
    assert rows[0]["test_acc"] == 0.6
    assert rows[0]["family"] == "cos-rep" and rows[0]["cycles"] == 32  # filled in from the schedule text
    assert rows[0]["workload"] == WORKLOAD


def test_rows_filter_by_workload_and_source(tmp_path):
    other = dict(WORKLOAD, lr=0.05)
    with ResultsDB(tmp_path / "r.db") as db:
        db.add_run(_row(0))
        db.add_run(_row(1, source="pilot"))
        db.add_run(_row(2, workload=other, workload_key=workload_key(other)))
        assert len(db.rows()) == 3
        assert [r["seed"] for r in db.rows(workload_key(WORKLOAD))] == [0, 1]
        assert [r["seed"] for r in db.rows(workload_key(WORKLOAD), source="pilot")] == [1]
        assert {w["workload_key"]: w["runs"] for w in db.workloads()} == {workload_key(WORKLOAD): 2,
                                                                           workload_key(other): 1}


def test_bad_rows_are_refused(tmp_path):
    with ResultsDB(tmp_path / "r.db") as db:
        with pytest.raises(InputError, match="source"):
            db.add_run(_row(0, source="guess"))
        with pytest.raises(InputError, match="unknown results column"):
            db.add_run(_row(0, colour="red"))
        with pytest.raises(InputError, match="lacks run_path"):
            db.add_run(_row(0, run_path=None))
        assert db.rows() == []


def test_workload_key_ignores_spelling_but_not_settings():
    same = dict(WORKLOAD, lr=1e-1, batch_size=64.0, dataset="Digits", fp_layers=("fc",))
    assert workload_key(same) == workload_key(WORKLOAD)
    assert workload_key(dict(reversed(list(WORKLOAD.items())))) == workload_key(WORKLOAD)
    for k, v in (("lr", 0.05), ("steps", 4), ("fp_layers", []), ("augment", False), ("dataset_size", 1000)):
        assert workload_key(dict(WORKLOAD, **{k: v})) != workload_key(WORKLOAD), k
    # settings that do not define the workload do not change its key
    assert workload_key(dict(WORKLOAD, seed=3, data_dir="/x", device="cuda")) == workload_key(WORKLOAD)


def test_one_workload_has_one_key_and_two_workloads_two(tmp_path):
    """Issue 22 item 6. The dataset is keyed by its registry name (a plan wrote synthetic:1,8,8:4:1024, its runs
    synthetic:1,8,8:4); --image-size keys imagefolder only (any other dataset has one size); an image folder's path
    and class count, and the evaluation settings when not the defaults, are part of the workload."""
    syn = dict(WORKLOAD, dataset="synthetic:1,8,8:4")
    assert workload_key(syn) == workload_key(dict(syn, dataset="Synthetic:1,8,8:4:1024"))
    assert workload_key(syn) != workload_key(dict(syn, dataset="synthetic:1,8,8:4:512"))
    cifar = dict(WORKLOAD, dataset="cifar10")
    assert workload_key(dict(cifar, image_size=32)) == workload_key(dict(cifar, image_size=None))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    folder = dict(WORKLOAD, dataset="imagefolder", image_size=32, num_classes=10, data_dir=str(tmp_path / "a"))
    assert workload_key(folder) != workload_key(dict(folder, image_size=64))
    assert workload_key(folder) != workload_key(dict(folder, data_dir=str(tmp_path / "b")))
    assert workload_key(folder) != workload_key(dict(folder, num_classes=100))
    assert workload_key(folder) == workload_key(dict(folder, data_dir=str(tmp_path / "x" / ".." / "a")))
    for k, v in (("eval_bits", 8), ("recal_batches", 0)):
        assert workload_key(dict(WORKLOAD, **{k: v})) != workload_key(WORKLOAD), k
    # the defaults (q_max, 16 batches) are what every run had before they were keyed: those keys stay
    assert workload_key(dict(WORKLOAD, eval_bits=None, recal_batches=16)) == workload_key(WORKLOAD)


def test_the_keys_of_databases_written_before_stay_the_same():
    """Rows of the shipped evidence databases (benchmarks/results/*.db) keep the keys they were written with."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    dbs = sorted(root.glob("*.db"))
    assert dbs
    for path in dbs:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)  # read only: the evidence files stay as they are
        try:
            held = con.execute("SELECT DISTINCT workload_key, workload FROM runs").fetchall()
        finally:
            con.close()
        assert held
        for key, workload in held:
            assert workload_key(json.loads(workload)) == key, (path.name, workload)


def test_a_runs_config_records_the_key_of_its_row(finished_run):
    cfg = json.loads((finished_run / "config.json").read_text())
    assert cfg["workload_key"] == run_row(finished_run)["workload_key"]


def _writer(path: str, worker: int, n: int) -> None:
    with ResultsDB(path) as db:
        for i in range(n):
            db.add_run(_row(worker * 10_000 + i, run_path=f"/runs/w{worker}-{i}"))


def test_two_processes_writing_at_once_lose_no_row(tmp_path):
    path = str(tmp_path / "r.db")
    ctx = mp.get_context("spawn")  # a fresh interpreter each: as two separate sweeps would be
    n = 150
    procs = [ctx.Process(target=_writer, args=(path, w, n)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with ResultsDB(path) as db:
        rows = db.rows()
    assert len(rows) == 2 * n
    assert {r["run_path"] for r in rows} == {f"/runs/w{w}-{i}" for w in range(2) for i in range(n)}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    from cptsim.run.train import TrainConfig, train

    out = tmp_path_factory.mktemp("runs") / "r"
    train(TrainConfig(schedule="cos-rep:3-8:g8:n2", steps=3, seed=1), str(out), progress=False)
    return out


def test_record_run_reads_a_finished_run_once(finished_run, tmp_path):
    with ResultsDB(tmp_path / "r.db") as db:
        row = record_run(finished_run, db, "train")
        record_run(finished_run, db, "train")
        rows = db.rows()
    assert len(rows) == 1
    r = rows[0]
    assert r["id"] == row["id"]
    assert r["schedule"] == "cos-rep:3-8:g8:n2" and r["family"] == "cos-rep" and r["seed"] == 1
    assert r["steps"] == 3 and r["eval_bits"] == 8 and r["source"] == "train"
    assert r["run_path"] == str(finished_run.resolve())
    assert 0.0 <= r["test_acc"] <= 1.0 and r["test_loss"] > 0
    assert r["bitops"] > 0 and r["bitops_rel"] == pytest.approx(r["bitops"] / r["bitops_static"])
    assert 0 < r["bitops_rel"] < 1
    sched = parse_schedule("cos-rep:3-8:g8:n2")
    assert r["score"] == pytest.approx(proxy_score(sched, 3))
    assert r["workload"]["steps"] == 3 and r["workload"]["dataset_size"] == 1437


def test_a_plans_workload_and_the_run_trained_from_it_share_a_key(finished_run):
    from cptsim.planner import Workload

    w = Workload.build(steps=3, seed=1)
    assert workload_key(w.to_json()) == run_row(finished_run)["workload_key"]


def test_an_unfinished_run_is_not_a_result(finished_run, tmp_path):
    import shutil

    part = tmp_path / "part"
    shutil.copytree(finished_run, part)
    (part / "metrics.jsonl").write_text("")
    with pytest.raises(InputError, match="not finished"):
        run_row(part)


def _opener(path: str, start: float) -> None:
    while time.time() < start:  # all at the same instant: the race is in switching a new database to WAL
        pass
    with ResultsDB(path):
        pass


def test_processes_opening_one_new_database_at_the_same_instant_all_succeed(tmp_path):
    """Before the retry in ResultsDB.__init__ about 1 in 16 such processes failed with 'database is locked'."""
    ctx = mp.get_context("fork")  # fast, and the child touches only sqlite
    for i in range(10):
        path, start = str(tmp_path / f"r{i}.db"), time.time() + 0.2
        procs = [ctx.Process(target=_opener, args=(path, start)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0] * 4, i


def test_an_old_database_reads_unchanged_and_gains_the_validation_columns_on_its_first_write(tmp_path):
    """Issue 22 item 1: schema 2 adds val_acc, val_loss, val_size. A schema-1 database (written by main @ fb8bbd5)
    reads as before with None there, is not changed by reading, and is upgraded in place by its first write."""
    import hashlib
    import shutil
    from pathlib import Path

    old = Path(__file__).parent / "data" / "pre_layout" / "results.db"
    path = tmp_path / "old.db"
    shutil.copy(old, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with ResultsDB(path) as db:
        rows = db.rows()
    assert len(rows) == 2 and all(r["val_acc"] is None and r["val_size"] is None for r in rows)
    assert all(0 <= r["test_acc"] <= 1 for r in rows)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    with ResultsDB(path) as db:
        db.add_run(_row(9, val_acc=0.75, val_loss=0.5, val_size=287))
        new = db.rows()
    con = sqlite3.connect(path)
    assert con.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)] == [(2,)]
    assert {"val_acc", "val_loss", "val_size"} <= {r[1] for r in con.execute("PRAGMA table_info(runs)")}
    con.close()
    assert [r["val_acc"] for r in new] == [None, None, 0.75] and new[-1]["val_size"] == 287


def test_a_run_with_a_validation_split_records_its_validation_measure(tmp_path):
    """Issue 22 item 1: a run's row carries its final validation accuracy and loss and the split's size (the
    fraction held out by cptsim.run.train.validation_split), beside the test ones."""
    from cptsim.run.config import VAL_SPLIT, held_out
    from cptsim.run.train import TrainConfig, train

    run = train(TrainConfig(schedule="static:8", steps=3, val_split=VAL_SPLIT), str(tmp_path / "r"), progress=False)
    last = run.read_metrics().records[-1]
    row = run_row(run.path)
    assert row["val_size"] == held_out(1437, VAL_SPLIT) == 287
    assert row["val_acc"] == pytest.approx(last["val_acc"]) and row["val_loss"] == pytest.approx(last["val_loss"])
    assert row["workload"]["dataset_size"] == 1437 - 287

"""The results database: one row per measured run, in SQLite. This module alone knows its schema.

Sweeps (``cptsim sweep``), pilot runs and the planner's learned quality model read and write it. A row holds what
defines the run's workload (a stable key and the settings as JSON), its schedule and seed, what it cost (BitOPs, and
BitOPs relative to static q_max of the same workload), the planner's proxy score of the schedule, and what it
measured at ``eval_bits``: on the held-out validation split (``val_acc``, ``val_loss``, ``val_size``: what the
planner's ``--quality db`` fits to, never the test split) and on the test split (``test_acc``, ``test_loss``: for
reports) -- plus where the run directory is.

Schema versions: 1 had no validation columns. A version-1 database opens and reads as before (the validation
columns read as None); the first write to it adds the columns (``ALTER TABLE ... ADD COLUMN``, one transaction)
and marks it version 2, so a database is never changed by reading it.

Where: ``--db PATH``, else ``$CPTSIM_DB``, else ``$XDG_DATA_HOME/cptsim/results.db`` (``~/.local/share/...``).

Several processes may write at once (two sweeps on one machine): the database runs in WAL mode with a busy timeout,
and every write is one ``BEGIN IMMEDIATE`` transaction, so a writer waits for the other instead of failing, and a
kill leaves each row either wholly in or wholly out. A row is keyed by its run directory's absolute path, so
recording a run twice updates its row rather than adding a second one. (WAL needs a local file system: not NFS.)

Python API (stable names)::

    db = ResultsDB(path=None)              # opens or creates; schema version checked
    db.add_run(row) -> int                 # insert or replace (by run_path); returns the row id
    db.rows(workload_key=None, source=None) -> list[dict]   # oldest first; "workload" parsed back to a dict
    db.workloads() -> list[dict]           # {"workload_key", "workload", "runs"} per workload held
    workload_key(settings) -> str          # 16 hex digits of sha256 over the workload-defining settings
    run_row(run_dir, source) -> dict       # the row a finished run directory makes (nothing written)
    record_run(run_dir, db, source) -> dict  # run_row + add_run
    proxy_score(schedule, total_steps) -> float
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from cptsim.errors import InputError

SCHEMA_VERSION = 2
SOURCES = ("sweep", "pilot", "train")

# Columns in order: (name, SQL type). `workload` and `extra` hold JSON text.
COLUMNS = (
    ("workload_key", "TEXT NOT NULL"),
    ("workload", "TEXT NOT NULL"),
    ("schedule", "TEXT NOT NULL"),        # canonical text form, e.g. cos-rep:3-8:g8:n32
    ("family", "TEXT NOT NULL"),          # the schedule's name: cos-rep, static, ...
    ("q_min", "INTEGER NOT NULL"),
    ("q_max", "INTEGER NOT NULL"),
    ("g_min", "INTEGER NOT NULL"),
    ("g_max", "INTEGER NOT NULL"),
    ("cycles", "INTEGER NOT NULL"),
    ("seed", "INTEGER NOT NULL"),
    ("steps", "INTEGER NOT NULL"),        # steps executed (= the workload's steps for a finished run)
    ("bitops", "REAL"),                   # executed BitOPs, whole run
    ("bitops_static", "REAL"),            # the same workload at static q_max (same gradient bits)
    ("bitops_rel", "REAL"),               # bitops / bitops_static
    ("score", "REAL"),                    # the proxy score when the row was written
    ("score_name", "TEXT"),
    ("test_acc", "REAL"),                 # final evaluation, at eval_bits
    ("test_loss", "REAL"),
    ("eval_bits", "INTEGER"),
    ("val_acc", "REAL"),                  # final evaluation on the held-out validation split (schema 2)
    ("val_loss", "REAL"),                 # its loss (per token for a language model: log perplexity)
    ("val_size", "INTEGER"),              # validation samples (0 or None: no validation split)
    ("source", "TEXT NOT NULL"),          # sweep | pilot | train
    ("run_path", "TEXT NOT NULL UNIQUE"),
    ("created", "TEXT NOT NULL"),         # when the row was written, ISO 8601 local time with offset
    ("extra", "TEXT"),                    # JSON object: anything else worth keeping (best acc, time, ...)
)
COLUMN_NAMES = tuple(c for c, _ in COLUMNS)
REQUIRED = ("workload_key", "workload", "schedule", "seed", "steps", "source", "run_path")

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    {(',' + chr(10) + '    ').join(f'{c} {t}' for c, t in COLUMNS)}
);
CREATE INDEX IF NOT EXISTS runs_workload ON runs (workload_key);
"""


def default_db_path() -> Path:
    """$CPTSIM_DB, else $XDG_DATA_HOME/cptsim/results.db, else ~/.local/share/cptsim/results.db."""
    env = os.environ.get("CPTSIM_DB")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "cptsim" / "results.db"


# ------------------------------------------------------------------------------------------------ workload key
# Built in one place, ``cptsim.run.config``, for the planner, runs, sweeps and this database alike; these are
# that function, under the names it has always had here.


def workload_settings(settings: dict) -> dict:
    """``cptsim.run.config.workload_settings``: a workload's defining settings in one normal form."""
    from cptsim.run.config import workload_settings as normal

    return normal(settings)


def workload_key(settings: dict) -> str:
    """``cptsim.run.config.workload_key``: 16 hex digits of sha256 over the workload-defining settings."""
    from cptsim.run.config import workload_key as key

    return key(settings)


def workload_from_config(cfg: dict) -> dict:
    """The workload settings of a run, from its config.json (``cptsim.run.config.run_workload``)."""
    from cptsim.run.config import run_workload

    return run_workload(cfg)


# ------------------------------------------------------------------------------------------------ proxy score


def proxy_score(schedule, total_steps: int) -> float:
    """The planner's proxy score of ``schedule`` over ``total_steps`` steps -- the one place results call it.

    Uses ``cptsim.planner.score.schedule_score`` when the planner provides one, else ``score_bits`` on the
    schedule's bits per step."""
    from cptsim.planner import score as S

    fn = getattr(S, "schedule_score", None)
    if fn is not None:
        return float(fn(schedule, int(total_steps)))
    return float(S.score_bits(schedule.bits(int(total_steps)), schedule.grad_bits(int(total_steps))))


def score_name() -> str:
    from cptsim.planner import score as S

    return str(getattr(S, "SCORE_NAME", "proxy"))


# ------------------------------------------------------------------------------------------------ the database


class ResultsDB:
    """The results database at ``path`` (default ``default_db_path()``); created with its schema on first use."""

    def __init__(self, path: str | os.PathLike | None = None, timeout_s: float = 60.0):
        self.path = Path(path).expanduser() if path is not None else default_db_path()
        if self.path.is_dir():
            raise InputError(f"--db names a directory, not a database file: {self.path}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: we open every transaction ourselves (BEGIN IMMEDIATE takes the write lock at
            # once, so two writers queue on busy_timeout instead of one failing at its first write).
            self._con = sqlite3.connect(str(self.path), timeout=timeout_s, isolation_level=None)
        except (OSError, sqlite3.Error) as e:
            raise InputError(f"--db {self.path}: cannot open the results database ({e})") from None
        self._con.row_factory = sqlite3.Row
        try:
            self._con.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    self._con.execute("PRAGMA journal_mode = WAL")
                    self._con.execute("PRAGMA synchronous = NORMAL")  # durable at each checkpoint; WAL: consistent
                    self._init_schema()
                    break
                except sqlite3.OperationalError as e:
                    # Two processes opening a new database at once: switching it to WAL needs an exclusive lock,
                    # and SQLite answers "database is locked" at once there, without waiting on busy_timeout (a
                    # flaky failure of tests/test_results.py's two-writer test; 10 of 160 processes failed when four
                    # opened one new database at once, none with this retry).
                    if "locked" not in str(e) and "busy" not in str(e) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
        except sqlite3.DatabaseError as e:
            self._con.close()
            raise InputError(f"--db {self.path}: not a cptsim results database ({e})") from None

    def _init_schema(self) -> None:
        # One statement at a time inside our transaction (executescript would COMMIT first).
        with self._write():
            for stmt in filter(str.strip, _SCHEMA.split(";")):  # IF NOT EXISTS: an existing table is left as is
                self._con.execute(stmt)
            row = self._con.execute("SELECT version FROM schema_version").fetchone()
            if row is None:
                self._con.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
                self.version = SCHEMA_VERSION
                return
            version = int(row[0])
        if version > SCHEMA_VERSION:
            raise InputError(f"--db {self.path}: results schema version {version} was written by a newer cptsim; "
                             f"this one reads version {SCHEMA_VERSION}")
        self.version = version  # older: readable as it is; upgraded by the first write (_upgrade)

    def _upgrade(self, con: sqlite3.Connection) -> None:
        """Inside a write transaction: bring an older schema to ``SCHEMA_VERSION`` (add the missing columns)."""
        if self.version >= SCHEMA_VERSION:
            return
        have = {r[1] for r in con.execute("PRAGMA table_info(runs)").fetchall()}
        for c, t in COLUMNS:
            if c not in have:  # added columns are nullable: old rows read None there
                con.execute(f"ALTER TABLE runs ADD COLUMN {c} {t}")
        con.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
        self.version = SCHEMA_VERSION

    class _Tx:
        def __init__(self, con: sqlite3.Connection):
            self.con = con

        def __enter__(self):
            self.con.execute("BEGIN IMMEDIATE")
            return self.con

        def __exit__(self, exc_type, exc, tb):
            if exc_type is None:
                self.con.execute("COMMIT")
            else:
                self.con.execute("ROLLBACK")
            return False

    def _write(self) -> "ResultsDB._Tx":
        return ResultsDB._Tx(self._con)

    # ---- writing -------------------------------------------------------------------------------------------
    def add_run(self, row: dict) -> int:
        """Insert one measured run (keys: ``COLUMN_NAMES``; ``workload`` and ``extra`` may be dicts), or replace
        the row of the same ``run_path``. Returns the row id. One transaction."""
        values = self._check_row(row)
        cols = ", ".join(COLUMN_NAMES)
        marks = ", ".join("?" for _ in COLUMN_NAMES)
        update = ", ".join(f"{c} = excluded.{c}" for c in COLUMN_NAMES if c != "run_path")
        with self._write() as con:
            self._upgrade(con)
            con.execute(f"INSERT INTO runs ({cols}) VALUES ({marks}) ON CONFLICT(run_path) DO UPDATE SET {update}",
                        values)
            return int(con.execute("SELECT id FROM runs WHERE run_path = ?", (row["run_path"],)).fetchone()[0])

    @staticmethod
    def _check_row(row: dict) -> list:
        if not isinstance(row, dict):
            raise InputError(f"a results row must be a dict, got {type(row).__name__}")
        unknown = set(row) - set(COLUMN_NAMES) - {"id"}
        if unknown:
            raise InputError(f"unknown results column(s): {', '.join(sorted(unknown))}")
        missing = [k for k in REQUIRED if row.get(k) is None]
        if missing:
            raise InputError(f"results row lacks {', '.join(missing)}")
        if row["source"] not in SOURCES:
            raise InputError(f"results row source must be one of {', '.join(SOURCES)}, got {row['source']!r}")
        r = dict(row)
        if isinstance(r.get("workload"), dict):
            r["workload"] = json.dumps(r["workload"], sort_keys=True)
        if isinstance(r.get("extra"), dict):
            r["extra"] = json.dumps(r["extra"], sort_keys=True)
        if r.get("schedule") and any(r.get(k) is None for k in ("family", "q_min", "q_max", "g_min", "g_max",
                                                                  "cycles")):
            from cptsim.cost.schedules import parse_schedule

            s = parse_schedule(r["schedule"])
            for k, v in (("family", s.name), ("q_min", s.q_min), ("q_max", s.q_max), ("g_min", s.g_min),
                         ("g_max", s.g_max), ("cycles", s.cycles)):
                if r.get(k) is None:
                    r[k] = v
        r.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        if r["created"] is None:
            r["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        return [r.get(c) for c in COLUMN_NAMES]

    # ---- reading -------------------------------------------------------------------------------------------
    def rows(self, workload_key: str | None = None, source: str | None = None) -> list[dict]:
        """Every row (of one workload, of one source), oldest first, as dicts; ``workload``/``extra`` parsed."""
        where, args = [], []
        if workload_key is not None:
            where.append("workload_key = ?")
            args.append(workload_key)
        if source is not None:
            where.append("source = ?")
            args.append(source)
        sql = "SELECT * FROM runs" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        out = []
        for r in self._con.execute(sql, args).fetchall():
            d = dict.fromkeys(COLUMN_NAMES) | dict(r)  # an older schema's missing columns read as None
            for k in ("workload", "extra"):
                d[k] = json.loads(d[k]) if d.get(k) else ({} if k == "extra" else None)
            out.append(d)
        return out

    def workloads(self) -> list[dict]:
        """The workloads held: key, settings and number of rows, the most recent first."""
        sql = ("SELECT workload_key, workload, COUNT(*) AS runs, MAX(id) AS last FROM runs "
               "GROUP BY workload_key ORDER BY last DESC")
        return [{"workload_key": r["workload_key"], "workload": json.loads(r["workload"]), "runs": r["runs"]}
                for r in self._con.execute(sql).fetchall()]

    def has_run(self, run_path: str | os.PathLike) -> bool:
        key = str(Path(run_path).resolve())
        return self._con.execute("SELECT 1 FROM runs WHERE run_path = ?", (key,)).fetchone() is not None

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> "ResultsDB":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------------------------------------ run -> row


def run_finished(run) -> bool:
    """A run is finished when every step ran and an evaluation was recorded after the last one."""
    cfg = run.read_config()
    total = cfg["total_steps"]
    metrics = run.read_metrics().records
    return any(m.get("step") == total and isinstance(m.get("test_acc"), (int, float)) for m in metrics)


def run_row(run_dir, source: str = "train") -> dict:
    """The results row of a finished run directory, read through ``cptsim.run.rundir.RunDir`` (nothing is written).
    InputError if the run is not finished."""
    from cptsim.cost.model import estimate
    from cptsim.run.rundir import RunDir
    from cptsim.cost.schedules import Schedule

    run = run_dir if isinstance(run_dir, RunDir) else RunDir.open(run_dir)
    cfg = run.read_config()
    total = cfg["total_steps"]
    if not run_finished(run):
        raise InputError(f"{run.path} is not finished (no evaluation after step {total}); "
                         f"resume it with: cptsim train --resume {run.path}")
    metrics = [m for m in run.read_metrics().records if isinstance(m.get("test_acc"), (int, float))]
    last = [m for m in metrics if m.get("step") == total][-1]
    sched = Schedule.from_json(cfg["schedule"])
    # a per-layer run: its layers re-counted at the bits each held (the trace's bits are the global schedule's)
    from cptsim.cost.layerplan import layers_of_run

    layers = layers_of_run(cfg, sched)
    executed = run.read_executed()
    prof = run.read_profile()
    bitops = static = rel = None
    if executed.records and prof is not None:
        c = estimate(prof, executed.records, None, static_bits=sched.q_max, layers=layers,
                     layer_steps=total if layers is not None else None)
        bitops = float(c.bitops["total"])
        static = float(c.baseline["bitops"]["total"]) if c.baseline else None
        rel = c.relative_to_static
    workload = workload_from_config(cfg)
    accs = [m["test_acc"] for m in metrics]
    return {
        "workload_key": workload_key(workload), "workload": workload,
        "schedule": sched.to_text(), "family": sched.name, "q_min": sched.q_min, "q_max": sched.q_max,
        "g_min": sched.g_min, "g_max": sched.g_max, "cycles": sched.cycles,
        "seed": int(cfg["settings"].get("seed", 0)), "steps": len(executed.records),
        "bitops": bitops, "bitops_static": static, "bitops_rel": None if rel is None else float(rel),
        "score": proxy_score(sched, total), "score_name": score_name(),
        "test_acc": float(last["test_acc"]),
        "test_loss": None if last.get("test_loss") is None else float(last["test_loss"]),
        "eval_bits": int(last.get("eval_bits", cfg["eval_bits"])),
        "val_acc": _maybe_float(last.get("val_acc")), "val_loss": _maybe_float(last.get("val_loss")),
        "val_size": int(cfg.get("val_size") or 0),
        "source": source, "run_path": str(run.path.resolve()),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "extra": {"best_test_acc": max(accs), "epochs_evaluated": len(metrics),
                  "train_loss": last.get("train_loss"), "train_acc": last.get("train_acc"),
                  "train_time_s": round(sum(r.get("time_s", 0.0) for r in executed.records), 3),
                  "data_dir": cfg["settings"].get("data_dir")}
                 # a per-layer run's rules: its schedule column is the global schedule alone
                 | ({"layers": layers.rules.to_text()} if layers is not None else {})
                 # language models: perplexity (lower is better) is their measure; test_acc is next-token accuracy
                 | {k: last[k] for k in ("test_ppl", "val_ppl", "test_bpc", "val_loss") if k in last},
    }


def _maybe_float(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def record_run(run_dir, db: ResultsDB, source: str = "train") -> dict:
    """Insert the row of a finished run into ``db`` (again: its row is replaced, never doubled). Returns the row."""
    row = run_row(run_dir, source)
    row["id"] = db.add_run({k: v for k, v in row.items() if k != "id"})
    return row


# ------------------------------------------------------------------------------------------------ sensitivity
# Per-layer sensitivity measured by `cptsim sensitivity` (cptsim.study.sensitivity): one row per layer and method,
# keyed by the workload. A table of its own beside ``runs``, created by the first sensitivity written (opening or
# reading a database never changes it), so the runs schema and its version are untouched.
_SENSITIVITY_SCHEMA = ("""
CREATE TABLE IF NOT EXISTS sensitivity (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    workload_key TEXT NOT NULL, model TEXT NOT NULL, method TEXT NOT NULL, layer TEXT NOT NULL,
    value REAL, weight REAL, q_min INTEGER, q_max INTEGER, seed INTEGER, time_s REAL, created TEXT,
    UNIQUE (workload_key, method, layer, q_min, q_max, seed)
)""", "CREATE INDEX IF NOT EXISTS sensitivity_workload ON sensitivity (workload_key, method)")


def record_sensitivity(db: ResultsDB, doc: dict) -> int:
    """Store a sensitivity document's per-layer values (replacing an earlier measurement of the same workload,
    method, bits and seed). Returns the rows written."""
    family = sensitivity_family(doc)
    rows = []
    for method, info in doc["methods"].items():
        for r in doc["layers"]:
            rows.append((doc["workload_key"], doc["model"], method, r["name"], r.get(method),
                         info["weights"].get(r["name"]), doc["q_min"], doc["q_max"], doc["seed"], info["time_s"],
                         time.strftime("%Y-%m-%dT%H:%M:%S%z"), family))
    with db._write() as con:
        for stmt in _SENSITIVITY_SCHEMA:
            con.execute(stmt)
        if not _has_family_column(con):  # a table written before the column existed: its rows are integer ones
            con.execute("ALTER TABLE sensitivity ADD COLUMN number_format TEXT")
        con.executemany("INSERT INTO sensitivity (workload_key, model, method, layer, value, weight, q_min, q_max, "
                        "seed, time_s, created, number_format) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT "
                        "(workload_key, method, layer, q_min, q_max, seed) DO UPDATE SET value = excluded.value, "
                        "weight = excluded.weight, time_s = excluded.time_s, created = excluded.created, "
                        "number_format = excluded.number_format", rows)
    return len(rows)


def sensitivity_family(doc: dict) -> str:
    """The number-format family a sensitivity document was measured in: its ``number_format`` section's family,
    "int" for an integer document (which has none)."""
    nf = doc.get("number_format")
    return str(nf.get("family", "int")) if isinstance(nf, dict) else "int"


def _has_family_column(con) -> bool:
    return any(r[1] == "number_format" for r in con.execute("PRAGMA table_info(sensitivity)"))


def sensitivity_weights(db: ResultsDB, model: str, method: str, number_format: str = "int") -> dict | None:
    """{layer: weight} of the newest measurement of ``model`` by ``method`` in the format family ``number_format``
    (mean over seeds and workloads of that newest q range), or None when the database holds none. A layer's
    sensitivity at MXFP4 is not its sensitivity at int4: an integer plan never takes a float-format
    measurement, nor the other way round; rows written before the family was recorded are integer ones."""
    if db._con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sensitivity'").fetchone() is None:
        return None
    fam = "COALESCE(number_format, 'int') = ?" if _has_family_column(db._con) else "'int' = ?"
    cur = db._con.execute(f"SELECT layer, AVG(weight) FROM sensitivity WHERE model = ? AND method = ? AND {fam} AND "
                          "(q_min, q_max) = (SELECT q_min, q_max FROM sensitivity WHERE model = ? AND method = ? "
                          f"AND {fam} ORDER BY created DESC, id DESC LIMIT 1) GROUP BY layer",
                          (model, method, number_format, model, method, number_format))
    got = {r[0]: float(r[1]) for r in cur.fetchall() if r[1] is not None}
    return got or None

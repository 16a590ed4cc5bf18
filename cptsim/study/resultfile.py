"""``result.json``: a finished run's own result record, written into its run directory. This module alone reads and
writes it.

Run directories are the source of truth and the results database is an index built from them
(``cptsim sweep --index``). On a cluster every job writes the record of its own run, beside the run, on the shared
file system; no compute node ever writes the SQLite database, which must not be shared over NFS (SQLite's own
documentation warns that its locks do not hold there). The login node indexes the records into the database.

The record holds the run's results-database row (``cptsim.study.results.run_row``: workload and its key,
schedule, seed, steps, cost, proxy score, validation and test measures, extra) under ``"format":
"cptsim.result/1"``, without ``run_path``: where the record is found is where the run is (a cluster's file
system may be mounted under another name on the login node than on the node that wrote it).

Written atomically (``cptsim.fileio``), so a kill leaves the old record or the new one. A record that cannot be
read anyway (a copy cut short, an edit) raises ``ResultDamaged`` naming the file: readers skip that run with a
warning, and a rerun of the sweep writes the record again from the run directory.

Python API::

    write_result(run_path, row)            # row: a results row (run_path, id ignored)
    read_result(run_path) -> dict | None   # the row, run_path set to this directory; None: no record; ResultDamaged
    record_result(run_dir, source) -> dict # run_row of a finished run + write_result; returns the row
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from cptsim.errors import InputError

RESULT_FILE = "result.json"
RESULT_FORMAT = "cptsim.result/1"

# what a row must hold to be indexed and reported, with the types a reader relies on
_REQUIRED = {"workload_key": str, "workload": dict, "schedule": str, "seed": int, "steps": int,
             "test_acc": (int, float), "source": str}


class ResultDamaged(InputError):
    """A result.json that exists but cannot be used (truncated, not JSON, another format, a key missing)."""


def result_path(run_path: str | os.PathLike) -> Path:
    return Path(run_path) / RESULT_FILE


def write_result(run_path: str | os.PathLike, row: dict) -> None:
    """Write the result record of the run at ``run_path`` (atomically; an existing record is replaced)."""
    from cptsim.fileio import atomic_write_json

    doc = {"format": RESULT_FORMAT} | {k: v for k, v in row.items() if k not in ("id", "run_path")}
    atomic_write_json(result_path(run_path), doc)


def read_result(run_path: str | os.PathLike) -> dict | None:
    """The results row recorded in ``run_path``/result.json, its ``run_path`` the directory's absolute path.

    None if there is no record; ``ResultDamaged`` (naming the file and what is wrong) if it cannot be used."""
    from .results import COLUMN_NAMES

    path = result_path(run_path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ResultDamaged(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ResultDamaged(f"{path}: not valid JSON ({e}); half written or damaged") from None
    if not isinstance(doc, dict) or doc.get("format") != RESULT_FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ResultDamaged(f"{path}: not a cptsim result record (format {got!r}, expected {RESULT_FORMAT!r})")
    for key, types in _REQUIRED.items():
        v = doc.get(key)
        if not isinstance(v, types) or isinstance(v, bool):
            raise ResultDamaged(f"{path}: {key!r} is {'missing' if v is None else repr(v)}")
    # keys a later format adds are left out of the row (the database has no column for them)
    row = {k: doc[k] for k in COLUMN_NAMES if k in doc}
    row["run_path"] = str(Path(run_path).resolve())
    return row


def record_result(run_dir, source: str = "sweep") -> dict:
    """Write the result record of a finished run (``run_row``: InputError if it is not finished); return its row."""
    from .results import run_row

    row = run_row(run_dir, source)
    write_result(row["run_path"], row)
    return row

"""A sweep directory's finished runs as results rows, read from the run directories (their result records), and
put into the results database: ``cptsim sweep --index``, the same rows a local sweep writes as each run finishes.
The run directories stay the source of truth; the database can be rebuilt from them."""

from __future__ import annotations

import os
from pathlib import Path

from cptsim.errors import InputError

from .sweepspec import SWEEP_FILE


def rows_from_dir(out: str | os.PathLike, warnings: list[str] | None = None) -> list[dict]:
    """The results rows of the finished runs in a sweep directory, read from the run directories themselves: each
    run's result record (result.json); a finished run without one (a sweep from before records existed) from its
    files. A damaged record is skipped -- its run counts as unfinished -- and named in ``warnings``."""
    from .results import run_finished, run_row
    from .resultfile import ResultDamaged, read_result
    from cptsim.run.rundir import CONFIG, RunDir

    out = Path(out)
    if not (out / SWEEP_FILE).is_file():
        raise InputError(f"{out} is not a sweep directory (no {SWEEP_FILE})")
    rows = []
    for p in sorted(out.iterdir()):
        if p.is_dir() and (p / CONFIG).is_file():
            try:
                row = read_result(p)
            except ResultDamaged as e:
                if warnings is not None:
                    warnings.append(f"{e}; skipped, the run counts as unfinished (rerun the sweep to record it)")
                continue
            if row is not None:
                rows.append(row)
                continue
            rd = RunDir.open(p)
            if run_finished(rd):
                rows.append(run_row(rd, "sweep"))
    return rows


def index(out: str | os.PathLike, db) -> dict:
    """Update the results database ``db`` from the run directories of sweep OUT (``rows_from_dir``): a row per
    finished run, replacing the row of the same run directory. Returns {"rows", "added", "warnings"}."""
    warnings: list[str] = []
    rows = rows_from_dir(out, warnings)
    added = 0
    for row in rows:
        added += not db.has_run(row["run_path"])
        row["id"] = db.add_run({k: v for k, v in row.items() if k != "id"})
    return {"rows": rows, "added": added, "warnings": warnings}

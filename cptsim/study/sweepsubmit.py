"""A sweep's runs as scheduler jobs (``--executor slurm | submitit-local``): which runs need a job, submitting them
under the sweep's lock, waiting for them, and collecting what they left (status, the database, the report).

A run whose job of an earlier submission is still queued or running is left to it (never two jobs on one run); a run
trained already but missing its result record gets the record here, under its run lock, with no job; the rest are
submitted as one job array (``cptsim.study.cluster``). Nodes never write the database: after ``wait`` the records
are indexed here, on the machine that submitted them.
"""

from __future__ import annotations

import os
import shlex
import time
from typing import Callable

from cptsim.errors import InputError, RunStopped

from . import cluster as C
from .sweepindex import index, rows_from_dir
from .sweep import SweepResult, SweepRun, prepare, sweep_status
from .sweepspec import SWEEP_FORMAT, SweepSettings
from .sweepstats import sweep_report


def _sort_runs(out: str | os.PathLike, runs: list[SweepRun], dry_run: bool) -> list[SweepRun]:
    """Each run's action against the scheduler's view; returns the runs to submit."""
    from cptsim.run.rundir import RunLock
    from .resultfile import ResultDamaged, read_result, record_result

    jobs_doc = C.read_jobs(out)
    states = C.scheduler_states(out, {"runs": {r.name: jobs_doc["runs"][r.name] for r in runs
                                               if r.action != "skip" and r.name in jobs_doc["runs"]}})
    todo = []
    for r in runs:
        rec = jobs_doc["runs"].get(r.name) or {}
        phase = C.job_phase(states.get(r.name))
        if r.action == "skip":
            try:
                r.row = read_result(r.path)
            except ResultDamaged:
                r.row = None
        elif phase in ("queued", "running"):  # its job of an earlier submission is still on it: not twice
            r.action, r.status, r.job_id = "wait", phase, rec.get("job_id")
        elif r.action == "record":
            if not dry_run:  # trained already: writing its record is all there is to do, no job needed
                lock = RunLock(r.path)
                if lock.try_acquire():
                    try:
                        r.row, r.status = record_result(r.path, "sweep"), "done"
                    finally:
                        lock.release()
                else:
                    r.action, r.status = "busy", "running"
        else:
            todo.append(r)
    return todo


def submit_sweep(out: str, settings: SweepSettings, entries: list[str], seeds: list[int],
                 cluster: C.ClusterSettings, planner: list[dict] | None = None, wait: bool = False,
                 dry_run: bool = False, db_path: str | None = None, no_db: bool = False,
                 on_event: Callable[[str, dict], None] | None = None) -> SweepResult:
    """Submit the unfinished runs of sweep ``out`` as jobs; with ``wait``, wait for them, index their records into
    the results database (unless ``no_db``) and report. ``dry_run``: decide, submit and write nothing; the document
    holds the job script and the first job's `cptsim train` command.

    Events (``on_event(name, detail)``): "submitted" {runs, todo} once the jobs are queued; with ``wait``, "waiting"
    {names}, then "poll" {states} at each look at the scheduler, then "waited" {} (also when waiting is interrupted).
    ^C while waiting raises RunStopped: the jobs go on."""
    from cptsim.run.rundir import ExclusiveLock

    emit = on_event or (lambda ev, detail: None)
    runs = prepare(out, settings, entries, seeds, write=not dry_run)
    todo = _sort_runs(out, runs, dry_run)
    if dry_run:
        doc = {"executor": cluster.executor, "out": out, "submit": [r.name for r in todo],
               "runs": [r.to_json() for r in runs],
               "script": C.sbatch_script(out, cluster, len(todo)) if cluster.executor == "slurm" else None,
               "train": shlex.join(C.TrainJob(C.run_spec(settings, todo[0])).command(resume=False)) if todo else None}
        return SweepResult(doc, runs, todo)
    sweep_lock = ExclusiveLock(f"{out}/.sweep.lock")
    if not sweep_lock.try_acquire():
        raise InputError(f"another sweep is submitting or running in {out}; wait for it or pick another --out")
    t0 = time.perf_counter()
    try:
        ids = C.submit(out, todo, settings, cluster)
        for r, jid in zip(todo, ids):
            r.job_id, r.status = jid, "submitted"
        emit("submitted", {"runs": runs, "todo": todo})
        doc = {"format": SWEEP_FORMAT, "out": out, "executor": cluster.executor,
               "workload": settings.workload(), "planner": planner or [], "submitted": ids}
        if not wait:
            doc["runs"] = [r.to_json() for r in runs]
            return SweepResult(doc, runs, todo)
        waiting = [r.name for r in runs if r.job_id]
        poll_s = 1.0 if cluster.executor == "submitit-local" else 30.0
        emit("waiting", {"names": waiting})
        try:
            C.wait(out, waiting, poll_s, lambda states: emit("poll", {"states": states}))
        except KeyboardInterrupt:
            raise RunStopped(f"stopped waiting; the jobs go on: cptsim sweep --status --out {out}") from None
        finally:
            emit("waited", {})
    finally:
        sweep_lock.release()
    return _collect(out, runs, todo, doc, t0, db_path, no_db)


def _collect(out, runs, todo, doc, t0, db_path, no_db) -> SweepResult:
    """After the jobs ended: where each run stands, the records into the database, the report of the finished."""
    status = sweep_status(out)
    by_name = {r["name"]: r for r in status["runs"]}
    ind = None
    if not no_db:
        from .results import ResultsDB

        with ResultsDB(db_path) as db:
            ind = index(out, db)
            doc["db"] = str(db.path)
    rows = {row["run_path"]: row for row in (ind["rows"] if ind else rows_from_dir(out, []))}
    for r in runs:
        st = by_name.get(r.name, {})
        r.status, r.error = st.get("status", r.status), st.get("error") or r.error
        r.steps_done, r.total_steps = st.get("steps_done", r.steps_done), st.get("total_steps")
        r.row = rows.get(str(r.path.resolve()), r.row)
    mine = [r.row for r in runs if r.row is not None and r.status == "done"]
    doc.update(runs=[r.to_json() for r in runs], wall_time_s=round(time.perf_counter() - t0, 2),
               workload_key=mine[0]["workload_key"] if mine else None,
               report=sweep_report(mine) if mine else None, warnings=status["warnings"])
    return SweepResult(doc, runs, todo, failed=[r for r in runs if r.status != "done"])

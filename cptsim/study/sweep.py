"""Sweeps: many runs of one workload (schedules x seeds), N processes at a time or as scheduler jobs, each a normal run
directory. This module holds the sweep directory's runs: prepared, trained N processes at a time, and where each
stands. The other stages have their own modules, and their public names are importable from here too:

- ``sweepspec``: the workload (``SweepSettings``), the entries (``SCHEDULE[@RULES]``), seeds, the planner's picks;
- ``sweepsubmit``: the same runs as scheduler jobs (``cptsim.study.cluster``): submitted, waited for, collected;
- ``sweepindex``: the finished runs' result records read back, and put into the results database;
- ``sweepstats``: accuracy vs cost per schedule over seeds, and the proxy score's rank correlation.

A sweep lives in one directory OUT::

    OUT/sweep.json              the workload (as `cptsim train` settings) and every schedule and seed asked for
    OUT/<schedule-slug>-s<seed>/  a run directory, written by its own `cptsim train` process
    OUT/<schedule-slug>-s<seed>.log   that process's stdout and stderr
    OUT/.<name>.lock            the run's lock (cptsim.run.rundir.RunLock): taken by the sweep, handed to the `cptsim train`
                                process that trains the run (it adopts it), so nothing else writes the run meanwhile
    OUT/<name>/result.json      the finished run's result record (cptsim.study.resultfile): the source of truth
    OUT/jobs.json, OUT/.submitit/   with --executor slurm | submitit-local: which job trains which run, and
                                submitit's files (cptsim.study.cluster)

Resumable as a whole: rerunning the same sweep skips finished runs (an evaluation recorded after the last step),
continues interrupted ones with `cptsim train --resume` (from their last checkpoint), and starts missing ones. A
run still held by a live process of an earlier, killed sweep is left alone ("busy"). The workload of OUT is fixed
by its first sweep; a rerun may add schedules or seeds but not change the workload.

Each finished run writes its result record (result.json) into its run directory; a local sweep also puts the same
row into the results database (``cptsim.study.results``) as the run finishes. A sweep of cluster jobs
(``cptsim.study.cluster``) never writes the database from a node: ``index(OUT, db)`` (``cptsim sweep --index``)
builds or updates it from the records, the same rows a local sweep writes. ``sweep_status(OUT)`` shows every run:
done, running, queued, failed, unfinished, not started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cptsim.errors import InputError

from .sweepindex import index, rows_from_dir
from .sweepspec import (ENTRY_SEP, SWEEP_FILE, SWEEP_FORMAT, SweepSettings, canonical_entry, check_layers,
                        layer_plan_entry, parse_schedule_list, parse_seeds, planner_schedules, run_name, split_entry,
                        with_layers)
from .sweepstats import REPORT_FORMAT, row_entry, row_layers, sweep_report

__all__ = [
    "ENTRY_SEP", "REPORT_FORMAT", "STATUSES", "SWEEP_FILE", "SWEEP_FORMAT", "SweepResult", "SweepRun",
    "SweepSettings", "canonical_entry", "check_layers", "dry_run", "execute", "index", "layer_plan_entry",
    "parse_schedule_list", "parse_seeds", "planner_schedules", "prepare", "row_entry", "row_layers", "rows_from_dir",
    "run_name", "run_state", "run_sweep", "split_entry", "sweep_report", "sweep_status", "train_command",
    "with_layers",
]


# ------------------------------------------------------------------------------------------------ the runs


@dataclass
class SweepRun:
    schedule: str
    seed: int
    path: Path
    log: Path
    action: str = ""          # skip (finished) | resume | new | busy (held by another live process)
    status: str = "pending"   # pending | running | done | failed | stopped | busy
    returncode: int | None = None
    steps_done: int = 0
    total_steps: int | None = None
    time_s: float = 0.0
    row: dict | None = None
    error: str | None = None
    job_id: str | None = None  # the scheduler's job training it (--executor slurm | submitit-local)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def global_schedule(self) -> str:
        """The run's schedule (``schedule`` is the sweep entry: with ``@RULES`` for a per-layer plan)."""
        return split_entry(self.schedule)[0]

    @property
    def layer_rules(self) -> list[str] | None:
        """A per-layer run's rules, ``GLOB=SPEC`` each (its ``--layer`` flags); None for a uniform run."""
        rules = split_entry(self.schedule)[1]
        return None if rules is None else [r for r in rules.split(";") if r]

    @property
    def lock_path(self) -> Path:
        from cptsim.run.rundir import lock_file

        return lock_file(self.path)  # the run's own lock (cptsim.run.rundir.RunLock), which its training adopts

    def to_json(self) -> dict:
        r = self.row or {}
        return {"name": self.name, "schedule": self.schedule, "layers": split_entry(self.schedule)[1],
                "seed": self.seed, "path": str(self.path),
                "log": str(self.log), "action": self.action, "status": self.status, "returncode": self.returncode,
                "steps_done": self.steps_done, "total_steps": self.total_steps, "time_s": round(self.time_s, 2),
                "test_acc": r.get("test_acc"), "eval_bits": r.get("eval_bits"), "bitops": r.get("bitops"),
                "bitops_rel": r.get("bitops_rel"), "score": r.get("score"), "error": self.error,
                "job_id": self.job_id}


def _sweep_doc(out: Path, settings: SweepSettings, schedules: list[str], seeds: list[int]) -> dict:
    """sweep.json: the workload is fixed by the first sweep into OUT; schedules and seeds accumulate."""
    path = out / SWEEP_FILE
    wanted = settings.workload()
    doc = {"format": SWEEP_FORMAT, "workload": wanted, "schedules": [], "seeds": []}
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise InputError(f"{path}: cannot read ({e})") from None
        if not isinstance(old, dict) or old.get("format") != SWEEP_FORMAT:
            raise InputError(f"{path}: not a cptsim sweep file (format {old.get('format') if isinstance(old, dict) else None!r}, "
                             f"expected {SWEEP_FORMAT!r})")
        have = old.get("workload", {})
        if isinstance(have, dict):  # written before sweeps held out a validation split: nothing was held out
            have = {"val_split": 0.0} | have
        diff = [f"{k} {have.get(k)!r} there, {v!r} now" for k, v in wanted.items() if have.get(k) != v]
        if diff:
            raise InputError(f"{out} holds a sweep of another workload ({'; '.join(diff)}); "
                             "give the same workload flags or pick another --out")
        doc = old
    doc["schedules"] = list(dict.fromkeys(list(doc.get("schedules", [])) + schedules))
    doc["seeds"] = list(dict.fromkeys(list(doc.get("seeds", [])) + seeds))
    return doc


def run_state(run: SweepRun) -> str:
    """new | partial | trained | done, for a run directory of this sweep; InputError if it holds another run.

    done: its result record (result.json) is there and sound; trained: every step ran and was evaluated, but the
    record is missing (a sweep from before records existed, a job killed after training) or damaged (a warning in
    ``run.error``): writing the record is all that is left to do."""
    from .results import run_finished
    from .resultfile import ResultDamaged, read_result
    from cptsim.run.rundir import CONFIG, RunDir

    p = run.path
    if not p.exists() or (p.is_dir() and not any(p.iterdir())):
        return "new"
    if not (p / CONFIG).is_file():
        raise InputError(f"{p} exists but is not a run directory (no {CONFIG}); move it away and rerun the sweep")
    rd = RunDir.open(p)
    cfg = rd.read_config()
    from cptsim.cost.schedules import Schedule

    have = Schedule.from_json(cfg["schedule"]).to_text()
    rec = cfg.get("layers")
    if isinstance(rec, dict) and rec.get("rules"):  # a per-layer run: its entry names its rules
        have = canonical_entry(have, ";".join(rec["rules"]))
    seed = cfg["settings"].get("seed")
    if have != run.schedule or seed != run.seed:
        raise InputError(f"{p} holds {have} seed {seed}, not {run.schedule} seed {run.seed}; move it away")
    run.total_steps = cfg["total_steps"]
    run.steps_done = len(rd.read_trace().records)
    if not run_finished(rd):
        return "partial"
    try:
        if read_result(p) is not None:
            return "done"
    except ResultDamaged as e:
        run.error = f"{e} (written again from the run directory)"
    return "trained"


def prepare(out: str | os.PathLike, settings: SweepSettings, schedules: list[str], seeds: list[int],
            write: bool = True) -> list[SweepRun]:
    """The runs of this sweep, in order (schedule-major), each with its action: new, resume, record (trained, its
    result record to write) or skip (done). Writes OUT/sweep.json unless ``write`` is False (a dry run)."""
    from cptsim.fileio import atomic_write_json

    if not schedules:
        raise InputError("nothing to sweep: give --schedules and/or --top K --budget B")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file, not a directory")
    doc = _sweep_doc(out, settings, schedules, seeds)
    runs = []
    for s in schedules:
        for seed in seeds:
            name = run_name(s, seed)
            runs.append(SweepRun(schedule=s, seed=seed, path=out / name, log=out / f"{name}.log"))
    for r in runs:
        state = run_state(r)
        r.action = {"new": "new", "done": "skip", "partial": "resume", "trained": "record"}[state]
        if state == "done":
            r.status = "done"
    if not write:
        return runs
    try:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / SWEEP_FILE, doc)
    except OSError as e:
        raise InputError(f"--out {out}: cannot write the sweep there ({e.strerror or e})") from None
    return runs


def train_command(settings: SweepSettings, run: SweepRun) -> list[str]:
    """The `cptsim train` process of one run: resume it, or start it with the sweep's workload."""
    from .cluster import TrainJob

    # the one place that spells the command: a local sweep and a cluster job train a run alike
    spec = {"run": str(run.path), "schedule": run.global_schedule, "layers": run.layer_rules, "seed": run.seed,
            "train_flags": settings.train_flags(), "nproc": settings.nproc}
    return TrainJob(spec).command(resume=run.action == "resume")


class _StepCounter:
    """Lines of a growing trace.jsonl, read incrementally (a resume that truncates the file starts it over)."""

    def __init__(self, path: Path):
        self.path, self.pos, self.lines = path, 0, 0

    def count(self) -> int:
        try:
            size = self.path.stat().st_size
        except OSError:
            return self.lines
        if size < self.pos:
            self.pos, self.lines = 0, 0
        if size > self.pos:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                chunk = f.read(size - self.pos)
            self.lines += chunk.count(b"\n")
            self.pos += len(chunk)
        return self.lines


def _child_env(jobs: int) -> dict:
    env = dict(os.environ)
    if jobs > 1 and "OMP_NUM_THREADS" not in env:  # N processes on the CPU must not each take every core
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))
    return env


def execute(runs: list[SweepRun], settings: SweepSettings, jobs: int = 1, db=None,
            on_event: Callable[[str, SweepRun], None] | None = None, poll_s: float = 0.25) -> list[SweepRun]:
    """Train the runs that are not finished, ``jobs`` processes at a time; record every finished run in ``db``.

    Events: ("start" | "progress" | "end", run). SIGINT / SIGTERM stop the sweep: running trainings get SIGINT
    (they checkpoint and stop), no new one starts, and RunStopped is raised once they have exited.
    """
    from cptsim.errors import RunStopped
    from .results import run_finished
    from .resultfile import ResultDamaged, read_result, record_result
    from cptsim.run.rundir import ExclusiveLock, RunDir, RunLock

    if jobs < 1:
        raise InputError(f"--jobs must be at least 1, got {jobs}")
    emit = on_event or (lambda ev, run: None)
    out = runs[0].path.parent if runs else None
    sweep_lock = None
    if out is not None:
        sweep_lock = ExclusiveLock(out / ".sweep.lock")
        if not sweep_lock.try_acquire():
            raise InputError(f"another sweep is running in {out}; wait for it or pick another --out")

    def record(run: SweepRun, write: bool = True) -> None:
        """The run's row: read from its result record (a run done before), else computed from the run directory
        and written as its record; into the database too, the same row the index would make of the record."""
        row = None
        if run.action == "skip":
            try:
                row = read_result(run.path)
            except ResultDamaged:
                row = None
        if row is None:
            rd = RunDir.open(run.path)
            if not run_finished(rd):
                run.status, run.error = "failed", "the process exited 0 but the run has no final evaluation"
                return
            row = record_result(rd, "sweep")
        run.row = row
        run.status = "done"
        run.steps_done = run.row["steps"]
        if db is not None and write:
            run.row["id"] = db.add_run({k: v for k, v in run.row.items() if k != "id"})

    stop = {"requested": False}
    old_handlers = {}

    def _on_signal(signum, frame):
        stop["requested"] = True

    import threading

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            old_handlers[sig] = signal.signal(sig, _on_signal)
    env = _child_env(jobs)
    running: dict[int, tuple[SweepRun, subprocess.Popen, RunLock, _StepCounter, float, object]] = {}
    try:
        for run in runs:  # finished by an earlier sweep: make sure the database holds their rows
            if run.action == "skip":
                record(run, write=db is not None and not db.has_run(run.path))
                emit("end", run)
            elif run.action == "record":  # trained, only its result record is missing: no process needed
                lock = RunLock(run.path)
                if not lock.try_acquire():
                    run.action, run.status = "busy", "busy"
                    run.error = "another process is writing this run"
                else:
                    try:
                        record(run)
                    except InputError as e:
                        run.status, run.error = "failed", str(e)
                    finally:
                        lock.release()
                emit("end", run)
        queue = [r for r in runs if r.action not in ("skip", "record")]
        while queue or running:
            while queue and len(running) < jobs and not stop["requested"]:
                run = queue.pop(0)
                lock = RunLock(run.path)
                if not lock.try_acquire():
                    run.action, run.status = "busy", "busy"
                    run.error = "another process is training this run (from an earlier sweep that was killed?)"
                    emit("end", run)
                    continue
                if run.action == "resume":  # the state may have moved on since prepare() looked
                    try:
                        state = run_state(run)
                        if state in ("done", "trained"):
                            run.action = "skip" if state == "done" else "record"
                            try:
                                record(run)
                            finally:
                                lock.release()
                            emit("end", run)
                            continue
                    except InputError as e:
                        lock.release()
                        run.status, run.error = "failed", str(e)
                        emit("end", run)
                        continue
                log = open(run.log, "ab")
                log.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} {run.action}: "
                          f"{' '.join(train_command(settings, run))}\n".encode())
                log.flush()
                # Its own session: a ^C at the terminal reaches the sweep alone, which passes it on exactly once
                # (a second SIGINT makes `cptsim train` stop without its end-of-step checkpoint).
                with lock.handed_down() as fd:
                    proc = subprocess.Popen(train_command(settings, run), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env | lock.handoff_env(), pass_fds=(fd,),
                                            start_new_session=True)
                run.status = "running"
                running[proc.pid] = (run, proc, lock, _StepCounter(run.path / "trace.jsonl"), time.perf_counter(),
                                     log)
                emit("start", run)
            if stop["requested"] and not stop.get("forwarded"):
                stop["forwarded"] = True
                for run, proc, *_ in running.values():
                    if proc.poll() is None:
                        try:
                            proc.send_signal(signal.SIGINT)
                        except ProcessLookupError:
                            pass
                queue.clear()
            time.sleep(poll_s)
            for pid in list(running):
                run, proc, lock, counter, t0, log = running[pid]
                if run.total_steps is None and (run.path / "config.json").exists():
                    try:
                        run.total_steps = int(json.loads((run.path / "config.json").read_text())["total_steps"])
                    except (OSError, ValueError, KeyError):
                        pass
                run.steps_done = counter.count()
                rc = proc.poll()
                if rc is None:
                    emit("progress", run)
                    continue
                del running[pid]
                log.close()
                run.returncode, run.time_s = rc, time.perf_counter() - t0
                try:
                    if rc == 0:
                        try:
                            record(run)
                        except InputError as e:  # the run's files cannot be read back: that run failed
                            run.status, run.error = "failed", str(e)
                    elif rc == 130 or (stop["requested"] and rc in (-signal.SIGINT, 1)):
                        run.status = "stopped"
                    else:
                        run.status = "failed"
                        run.error = _last_error(run.log) or f"exit code {rc}"
                finally:
                    lock.release()
                emit("end", run)
    finally:
        for run, proc, lock, *_ in running.values():  # only on an exception of our own: do not orphan children
            if proc.poll() is None:
                if not stop.get("forwarded"):
                    proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            lock.release()
        for sig, h in old_handlers.items():
            signal.signal(sig, h)
        if sweep_lock is not None:
            sweep_lock.release()
    if stop["requested"]:
        raise RunStopped("sweep stopped; finished runs are recorded - rerun the same command to continue")
    return runs



@dataclass
class SweepResult:
    """What a sweep did: ``doc`` is its --json document; ``todo`` the runs it trained or submitted (would, in a dry
    run); ``failed`` those that did not finish."""

    doc: dict
    runs: list[SweepRun]
    todo: list[SweepRun] = field(default_factory=list)
    failed: list[SweepRun] = field(default_factory=list)


def run_sweep(out: str, settings: SweepSettings, entries: list[str], seeds: list[int], jobs: int | None = None,
              planner: list[dict] | None = None, db_path: str | None = None, no_db: bool = False,
              on_event: Callable[[str, object], None] | None = None) -> SweepResult:
    """A local sweep from start to end: prepare OUT, train what is unfinished ``jobs`` processes at a time
    (``execute``), record the rows in the results database (``db_path``; none with ``no_db``), and report on the
    finished runs (``cptsim.study.sweepstats``).

    Events: ("prepared", runs) once the runs are known, then ``execute``'s ("start" | "progress" | "end", run),
    then ("executed", runs), also when the sweep is stopped."""
    from .results import ResultsDB
    from .sweepstats import sweep_report

    emit = on_event or (lambda ev, obj: None)
    jobs = jobs or 1
    db = None if no_db else ResultsDB(db_path)
    try:
        runs = prepare(out, settings, entries, seeds)
        t0 = time.perf_counter()
        emit("prepared", runs)
        try:
            execute(runs, settings, jobs, db, on_event=emit)
        finally:
            emit("executed", runs)
    finally:
        if db is not None:
            db.close()
    doc = {"format": SWEEP_FORMAT, "out": out, "db": None if db is None else str(db.path),
           "workload": settings.workload(), "planner": planner or [], "runs": [r.to_json() for r in runs],
           "wall_time_s": round(time.perf_counter() - t0, 2)}
    rows = [r.row for r in runs if r.row is not None]
    doc["workload_key"] = rows[0]["workload_key"] if rows else None
    doc["report"] = sweep_report(rows) if rows else None
    return SweepResult(doc, runs, [r for r in runs if r.action != "skip"],
                       failed=[r for r in runs if r.status in ("failed", "busy")])


def dry_run(out: str, settings: SweepSettings, entries: list[str], seeds: list[int]) -> SweepResult:
    """A local sweep's --dry-run: the runs and the `cptsim train` command each would run; nothing written."""
    import shlex

    runs = prepare(out, settings, entries, seeds, write=False)
    todo = [r for r in runs if r.action in ("new", "resume")]
    doc = {"executor": "local", "out": out, "workload": settings.workload(), "runs": [r.to_json() for r in runs],
           "train": {r.name: shlex.join(train_command(settings, r)) for r in todo}}
    return SweepResult(doc, runs, todo)

def _lock_held(run_path: Path) -> bool:
    """Whether a live process holds the run's lock -- asked without taking it over (the file keeps its holder)."""
    import fcntl

    from cptsim.run.rundir import lock_file

    try:
        fd = os.open(lock_file(run_path), os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def _last_job_line(log: Path) -> str | None:
    """The last line a cluster job wrote about its training's end ("=== job ID: cptsim train exited ...")."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("=== job ") and "exited" in line:
            return line.split(": ", 1)[-1]
    return None


def _last_error(log: Path) -> str | None:
    """The last 'error: ...' line a failed `cptsim train` wrote (its one-line reason)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("error: "):
            return line[len("error: "):]
    return None



# ------------------------------------------------------------------------------------------------ status

STATUSES = ("done", "running", "queued", "failed", "unfinished", "not started")


def sweep_status(out: str | os.PathLike, query_scheduler: bool = True) -> dict:
    """Where every run of sweep OUT stands, from its run directory and (for runs submitted as jobs) the scheduler.

    Per run: done (a sound result record, or a finished run from before records existed), running (its job runs,
    or a process holds its lock), queued (its job waits), failed (its job ended without a result: the scheduler's
    state and the run's last error), unfinished (stopped part way with no job: a rerun resumes it; or its record
    is damaged: a rerun writes it again), not started. Returns {"runs": [...], "counts": {...}, "warnings": [...]}.
    """
    from . import cluster as C
    from .results import run_finished
    from .resultfile import ResultDamaged, read_result
    from cptsim.run.rundir import CONFIG, RunDir

    out = Path(out)
    path = out / SWEEP_FILE
    if not path.is_file():
        raise InputError(f"{out} is not a sweep directory (no {SWEEP_FILE})")
    try:
        doc = json.loads(path.read_text())
        names = [(s, int(seed)) for s in doc["schedules"] for seed in doc["seeds"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"{path}: cannot read ({e})") from None
    jobs = C.read_jobs(out)
    states = C.scheduler_states(out, jobs) if query_scheduler else {}
    warnings: list[str] = []
    runs = []
    for schedule, seed in names:
        name = run_name(schedule, seed)
        p = out / name
        job = jobs["runs"].get(name) or {}
        r = {"name": name, "schedule": schedule, "seed": seed, "path": str(p), "log": str(out / f"{name}.log"),
             "status": "not started", "job_id": job.get("job_id"), "job_state": states.get(name),
             "steps_done": 0, "total_steps": None, "test_acc": None, "val_acc": None, "bitops_rel": None,
             "error": None}
        runs.append(r)
        phase = C.job_phase(states.get(name))
        started = (p / CONFIG).is_file()
        rd = None
        if started:
            try:
                rd = RunDir.open(p)
                r["total_steps"] = rd.read_config()["total_steps"]
                r["steps_done"] = _StepCounter(p / "trace.jsonl").count()  # lines: a long run's trace is not parsed
            except (InputError, KeyError, OSError, ValueError) as e:
                r["status"], r["error"] = "failed", f"cannot read the run directory: {e}"
                continue
            try:
                row = read_result(p)
            except ResultDamaged as e:
                warnings.append(f"{e}; the run counts as unfinished (rerun the sweep to record it)")
                row, r["error"] = None, str(e)
            if row is not None:
                r.update(status="done", test_acc=row.get("test_acc"), val_acc=row.get("val_acc"),
                         bitops_rel=row.get("bitops_rel"))
                continue
            if r["error"] is None and run_finished(rd) and phase != "running":
                r["status"] = "done"  # trained before runs wrote records: the report reads its files
                r["error"] = "no result.json: read from the run directory (rerun the sweep to record it)"
                continue
        if phase in ("queued", "running"):
            r["status"] = phase
            continue
        if started and _lock_held(p):  # a local sweep's training, or a job the scheduler cannot tell us about
            r["status"] = "running"
        elif phase == "ended" and r["error"] is None:
            r["status"] = "failed"
            log = out / f"{name}.log"
            # the training's own last word; else (the job died before it started one) the scheduler's log
            why = _last_error(log) or _last_job_line(log) or \
                f"see {out / C.SUBMITIT_DIR / (str(job.get('job_id')) + '_0_log.err')}"
            r["error"] = f"job {job.get('job_id')} {states.get(name)}: {why}"
        elif started:
            r["status"] = "unfinished"
    counts = {s: sum(r["status"] == s for r in runs) for s in STATUSES}
    return {"format": "cptsim.sweep-status/1", "out": str(out), "executor": jobs.get("executor", "local"),
            "runs": runs, "counts": counts, "warnings": warnings}

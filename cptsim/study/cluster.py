"""Sweeps through a scheduler: each run of a sweep as a job submitted with submitit (Slurm, or submitit's local
executor), in a normal run directory on the shared file system.

What a job does (``TrainJob``): takes the run's lock, runs the same ``cptsim train`` process a local sweep runs --
a new run, or ``--resume`` of one an earlier job began (decided when the job starts, so a requeued job continues
where the last one stopped) -- and, once the run is finished, writes its ``result.json``
(``cptsim.study.resultfile``). Jobs never write the results database: it is SQLite, whose locks do not hold over
NFS. The database is an index the login node builds from the records (``cptsim sweep --index``).

Time limits and preemption: Slurm warns a job (USR2, ``signal_delay_s`` before its limit); submitit calls
``TrainJob.checkpoint``, which asks the training to stop (SIGINT: it checkpoints at the end of the step) and
requeues the job, which resumes. A preempted job's training gets SIGTERM and checkpoints the same way.

The sweep directory keeps which job trains which run in ``OUT/jobs.json`` (this module alone reads and writes it),
and submitit's own files (pickled job, scheduler logs) in ``OUT/.submitit/``. A rerun of the sweep leaves runs
whose job is still queued or running alone and submits only the unfinished rest; ``sweep_status`` shows every run
from its run directory and the scheduler.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cptsim.errors import InputError

EXECUTORS = ("local", "slurm", "submitit-local")
JOBS_FILE = "jobs.json"
JOBS_FORMAT = "cptsim.sweep-jobs/1"
SUBMITIT_DIR = ".submitit"
UNKNOWN_GRACE_S = 60.0

# Slurm job states (sacct) by what they mean for the run; anything else is read as ended
_QUEUED = {"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "CONFIGURING", "SUSPENDED", "RESIZING",
           "SPECIAL_EXIT"}
_RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"}


def _submitit():
    try:
        import submitit
    except ImportError:
        raise InputError("--executor slurm needs submitit: pip install 'cptsim[cluster]'") from None
    return submitit


# ------------------------------------------------------------------------------------------------ settings


@dataclass
class ClusterSettings:
    """How the jobs are submitted: the executor and the Slurm job's resources (one job per run: one node, one
    task -- a `cptsim train` process, which starts the ``--nproc`` workers itself through torchrun)."""

    executor: str = "local"
    partition: str | None = None
    time_min: int | None = None            # the job's time limit, minutes (--slurm-time)
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    setup: list[str] = field(default_factory=list)   # lines of the job script, before the job starts
    options: dict = field(default_factory=dict)      # other sbatch options, as given (--slurm-option)
    parallel: int | None = None            # at most this many jobs of the array at once (--jobs)
    job_name: str = "cptsim-sweep"
    max_requeues: int = 3                  # time limits reached before a run is given up (submitit's countdown)

    def validate(self, device: str = "cpu", nproc: int | None = None) -> None:
        if self.executor not in EXECUTORS:
            raise InputError(f"--executor must be one of {', '.join(EXECUTORS)}, got {self.executor!r}")
        slurm_given = [f for f, v in (("--slurm-partition", self.partition), ("--slurm-time", self.time_min),
                                      ("--slurm-gpus-per-node", self.gpus_per_node),
                                      ("--slurm-cpus-per-task", self.cpus_per_task),
                                      ("--slurm-setup", self.setup), ("--slurm-option", self.options)) if v]
        if self.executor == "local" and slurm_given:
            raise InputError(f"{', '.join(slurm_given)} go with --executor slurm")
        if self.executor == "slurm" and self.time_min is None:
            raise InputError("--executor slurm needs --slurm-time (the job's time limit, e.g. 4:00:00 or 240): "
                             "a run that reaches it checkpoints and is requeued")
        for flag, v in (("--slurm-gpus-per-node", self.gpus_per_node), ("--slurm-cpus-per-task", self.cpus_per_task),
                        ("--jobs", self.parallel)):
            if v is not None and v < 1:
                raise InputError(f"{flag} must be at least 1, got {v}")
        if self.executor == "slurm" and device.startswith("cuda") and nproc and self.gpus() and nproc > self.gpus():
            raise InputError(f"--nproc {nproc} workers on --device cuda need as many GPUs; "
                             f"--slurm-gpus-per-node is {self.gpus()}")
        self._device, self._nproc = device, nproc

    def gpus(self) -> int | None:
        """GPUs a job asks for: as given; else, training on CUDA, one per --nproc worker."""
        if self.gpus_per_node is not None:
            return self.gpus_per_node
        if getattr(self, "_device", "cpu").startswith("cuda"):
            return max(1, getattr(self, "_nproc", None) or 1)
        return None

    def slurm_parameters(self) -> dict:
        """The parameters of submitit's SlurmExecutor (``update_parameters``) for these settings."""
        p = {"job_name": self.job_name, "time": int(self.time_min or 60), "nodes": 1, "ntasks_per_node": 1}
        if self.partition:
            p["partition"] = self.partition
        if self.gpus() is not None:
            p["gpus_per_node"] = self.gpus()
        if self.cpus_per_task is not None:
            p["cpus_per_task"] = self.cpus_per_task
        if self.setup:
            p["setup"] = list(self.setup)
        if self.options:
            p["additional_parameters"] = dict(self.options)
        if self.parallel is not None:
            p["array_parallelism"] = self.parallel
        return p


def parse_slurm_time(text: str | None) -> int | None:
    """--slurm-time in Slurm's forms (MIN, MIN:SEC, H:MM:SS, D-H, D-H:MM, D-H:MM:SS), as whole minutes (rounded
    up: submitit wants minutes, and a limit is never shortened)."""
    if text is None:
        return None
    t = str(text).strip()
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", t)
    if m is None:
        raise InputError(f"--slurm-time {text!r}: give minutes or Slurm's [D-]H:MM:SS, e.g. 240 or 4:00:00")
    d, a, b, c = m.groups()
    if d is not None:  # D-H[:MM[:SS]]
        secs = int(d) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # H:MM:SS
        secs = int(a) * 3600 + int(b) * 60 + int(c)
    elif b is not None:  # MIN:SEC
        secs = int(a) * 60 + int(b)
    else:
        secs = int(a) * 60
    if secs <= 0:
        raise InputError(f"--slurm-time {text!r} is no time at all")
    return -(-secs // 60)


def parse_slurm_options(items) -> dict:
    """--slurm-option KEY=VALUE (or a bare KEY for a flag such as exclusive), repeatable: other sbatch options,
    written into the job script as ``#SBATCH --KEY=VALUE``; a key given here wins over cptsim's own."""
    out: dict = {}
    for item in items or ():
        text = str(item).strip().lstrip("-")
        key, eq, value = text.partition("=")
        key = key.strip().replace("_", "-")
        if not re.fullmatch(r"[a-z][a-z0-9-]*", key):
            raise InputError(f"--slurm-option {item!r}: expected an sbatch option as KEY=VALUE, e.g. account=myproj")
        out[key] = value if eq else True
    return out


# ------------------------------------------------------------------------------------------------ the job


def _ignore_usr2() -> None:  # pragma: no cover - runs in the child before exec
    # Slurm's time-limit warning reaches every process of the job step; the training must not die of it (USR2's
    # default action): the job (submitit) handles it and asks the training to stop cleanly.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class TrainJob:
    """One run of a sweep as a submitit job (picklable: ``spec`` is plain data).

    ``spec``: run (path), log (path), schedule (the global one), seed, train_flags (the workload's `cptsim train`
    flags), nproc, layers (a per-layer plan's rules ``GLOB=SPEC``, each a ``--layer`` flag; absent or None: none)."""

    STOP_WAIT_S = 60.0  # how long a training asked to stop gets to write its checkpoint

    def __init__(self, spec: dict):
        self.spec = dict(spec)
        self._proc: subprocess.Popen | None = None

    def __getstate__(self):
        return {"spec": self.spec}

    def __setstate__(self, state):
        self.spec, self._proc = state["spec"], None

    def command(self, resume: bool) -> list[str]:
        s = self.spec
        base = [sys.executable, "-m", "cptsim.cli.main", "train"]
        nproc = ["--nproc", str(s["nproc"])] if s.get("nproc") else []
        if resume:
            return base + ["--resume", s["run"], *nproc, "--quiet", "--json"]
        layers = [a for rule in s.get("layers") or () for a in ("--layer", rule)]
        return base + list(s["train_flags"]) + ["--schedule", s["schedule"], *layers, "--seed", str(s["seed"]),
                                                "--out", s["run"], *nproc, "--quiet", "--json"]

    def __call__(self) -> dict:
        from cptsim.run.rundir import CONFIG, RunDir, RunLock
        from .results import run_finished
        from .resultfile import read_result, record_result, ResultDamaged

        run, log_path = Path(self.spec["run"]), Path(self.spec["log"])
        lock = RunLock(run)
        if not lock.try_acquire():
            from cptsim.run.rundir import describe_holder

            raise RuntimeError(f"{run} is being written by {describe_holder(lock.holder())}; not started twice")
        try:
            try:
                if read_result(run) is not None:
                    return {"run": str(run), "action": "skip"}
            except ResultDamaged:
                pass  # written again below, from the run directory
            started = (run / CONFIG).is_file()
            if started and run_finished(RunDir.open(run)):
                row = record_result(run, "sweep")
                return {"run": str(run), "action": "record", "test_acc": row["test_acc"]}
            argv = self.command(resume=started)
            env = dict(os.environ) | lock.handoff_env()
            if "OMP_NUM_THREADS" not in env and env.get("SLURM_CPUS_PER_TASK"):
                env["OMP_NUM_THREADS"] = env["SLURM_CPUS_PER_TASK"]  # the allocation's cores, not the node's
            fault = env.pop("CPTSIM_FAULT_KILL_RUN", "")  # test hook: "NAME:STEP" kills that run's training
            if fault.rpartition(":")[0] == run.name:
                env["CPTSIM_FAULT_KILL_AT_STEP"] = fault.rpartition(":")[2]
            job_id = env.get("SLURM_ARRAY_JOB_ID") and f"{env['SLURM_ARRAY_JOB_ID']}_{env.get('SLURM_ARRAY_TASK_ID')}" \
                or env.get("SLURM_JOB_ID") or env.get("SUBMITIT_LOCAL_JOB_ID") or "?"
            with open(log_path, "ab") as log:
                log.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} job {job_id} on {os.uname().nodename} "
                          f"{'resume' if started else 'new'}: {shlex.join(argv)}\n".encode())
                log.flush()
                with lock.handed_down() as fd:
                    self._proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL, env=env, pass_fds=(fd,),
                                                  preexec_fn=_ignore_usr2)
                # what writing the record needs, imported while the training runs rather than after it
                try:
                    import cptsim.cost.model  # noqa: F401
                    from .results import run_row  # noqa: F401

                    # polled, not Popen.wait(): submitit runs ``checkpoint`` in a signal handler of this thread,
                    # and a wait() interrupted there would hold the lock the handler needs to see the training end
                    while (rc := self._proc.poll()) is None:
                        time.sleep(0.25)
                except BaseException:  # the job cancelled (SIGINT) or failing: the training must not outlive it
                    self._stop_training()
                    raise
                if rc != 0:
                    log.write(f"=== job {job_id}: cptsim train exited with code {rc}\n".encode())
            if rc != 0:
                raise RuntimeError(f"{run.name}: cptsim train exited with code {rc} (log {log_path})")
            row = record_result(run, "sweep")
            return {"run": str(run), "action": "resume" if started else "new", "test_acc": row["test_acc"]}
        finally:
            lock.release()

    def checkpoint(self, *args, **kwargs):
        """submitit, on Slurm's warning before the time limit (or a preemption): stop the training at the end of
        its step (it writes a checkpoint), then requeue this job; the new job resumes the run."""
        self._stop_training(kill=False)  # the job ends anyway; the run resumes from its last checkpoint
        return _submitit().helpers.DelayedSubmission(TrainJob(self.spec))

    def _stop_training(self, kill: bool = True) -> None:
        """SIGINT to the training (it checkpoints at the end of its step and exits); SIGKILL if it has not within
        STOP_WAIT_S and ``kill``."""
        proc = self._proc
        if proc is None or proc.returncode is not None or _exited(proc.pid):
            return
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + self.STOP_WAIT_S
        while time.monotonic() < deadline:
            if _exited(proc.pid):
                return
            time.sleep(0.1)
        if kill:
            proc.kill()


def _exited(pid: int) -> bool:
    """Whether child ``pid`` has ended, asked without reaping it (WNOWAIT) and without Popen's lock, which the
    interrupted thread may hold when this runs in a signal handler."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already
        return True


# ------------------------------------------------------------------------------------------------ jobs.json


def read_jobs(out: str | os.PathLike) -> dict:
    """OUT/jobs.json: {"format", "executor", "runs": {run name: {"job_id", "executor", "submitted", "earlier"}}}
    (earlier: the job ids that were given the run before, oldest first); an empty
    record if there is none. InputError if it cannot be read."""
    path = Path(out) / JOBS_FILE
    empty = {"format": JOBS_FORMAT, "runs": {}}
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return empty
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot read the sweep's job record ({e}); move it away to start afresh") from None
    if not isinstance(doc, dict) or doc.get("format") != JOBS_FORMAT or not isinstance(doc.get("runs"), dict):
        raise InputError(f"{path}: not a cptsim job record (expected format {JOBS_FORMAT!r})")
    return doc


def write_jobs(out: str | os.PathLike, doc: dict) -> None:
    from cptsim.fileio import atomic_write_json

    atomic_write_json(Path(out) / JOBS_FILE, doc)


# ------------------------------------------------------------------------------------------------ executors


def _slurm_executor_class(check: bool = True):
    submitit = _submitit()
    if check:
        return submitit.SlurmExecutor

    class ScriptOnly(submitit.SlurmExecutor):
        """Builds the job script without a Slurm installation here (--dry-run, tests)."""

        @classmethod
        def affinity(cls) -> int:
            return 2

    return ScriptOnly


def make_executor(out: str | os.PathLike, cluster: ClusterSettings, script_only: bool = False):
    """The submitit executor of a sweep: its files in OUT/.submitit (on the shared file system, as the nodes read
    them)."""
    folder = Path(out).resolve() / SUBMITIT_DIR
    if cluster.executor == "submitit-local":
        ex = _submitit().LocalExecutor(folder=folder, max_num_timeout=cluster.max_requeues)
        # no time limit of its own worth having: a local job runs until its training ends
        ex.update_parameters(timeout_min=int(cluster.time_min or 7 * 24 * 60), stderr_to_stdout=False)
        return ex
    if cluster.executor != "slurm":
        raise InputError(f"no submitit executor for --executor {cluster.executor}")
    try:
        ex = _slurm_executor_class(check=not script_only)(folder=folder, max_num_timeout=cluster.max_requeues)
    except RuntimeError as e:  # submitit: 'Could not detect "srun"'
        raise InputError(f"--executor slurm: no Slurm on this machine ({e}); submit from a login node of the "
                         "cluster, or add --dry-run to see the job script") from None
    try:
        ex.update_parameters(**cluster.slurm_parameters())
    except ValueError as e:
        raise InputError(f"--slurm-*: {str(e).splitlines()[0]}") from None
    return ex


def sbatch_script(out: str | os.PathLike, cluster: ClusterSettings, n_runs: int) -> str:
    """The job script ``sbatch`` would be given for ``n_runs`` runs (an array when there are several), built by
    submitit exactly as a submission builds it, without submitting."""
    ex = make_executor(out, cluster, script_only=True)
    if n_runs > 1:
        ex.parameters["map_count"] = n_runs  # what submitit sets for an array submission
    text = ex._make_submission_file_text(ex._submitit_command_str, "dry-run")
    ex.parameters.pop("map_count", None)
    return text


def run_spec(settings, run) -> dict:
    """The plain data a TrainJob needs (``settings``: SweepSettings; ``run``: SweepRun)."""
    return {"run": str(Path(run.path).resolve()), "log": str(Path(run.log).resolve()),
            "schedule": run.global_schedule, "layers": run.layer_rules, "seed": run.seed,
            "train_flags": settings.train_flags(), "nproc": settings.nproc}


def submit(out: str | os.PathLike, runs: list, settings, cluster: ClusterSettings, executor=None) -> list:
    """Submit a job for each of ``runs`` (several: one job array); record them in OUT/jobs.json. Returns the job
    ids in the order of ``runs``."""
    if not runs:
        return []
    ex = executor or make_executor(out, cluster)
    jobs_doc = read_jobs(out)
    jobs_doc["executor"] = cluster.executor
    fns = [TrainJob(run_spec(settings, r)) for r in runs]
    try:
        if len(fns) == 1:
            jobs = [ex.submit(fns[0])]
        else:
            with ex.batch():
                jobs = [ex.submit(f) for f in fns]
    except Exception as e:  # noqa: BLE001 - sbatch refusing the job (bad partition, account...) is bad input
        msg = " ".join(str(e).split())
        raise InputError(f"submitting the jobs failed: {msg[:400]}") from None
    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    for r, j in zip(runs, jobs):
        old = jobs_doc["runs"].get(r.name) or {}
        earlier = list(old.get("earlier", [])) + ([old["job_id"]] if old.get("job_id") else [])
        jobs_doc["runs"][r.name] = {"job_id": str(j.job_id), "executor": cluster.executor, "submitted": now,
                                    "earlier": earlier}  # the jobs that trained it before, oldest first
    write_jobs(out, jobs_doc)
    return [str(j.job_id) for j in jobs]


# ------------------------------------------------------------------------------------------------ job states


def _local_state(job_id: str, folder: Path) -> str:
    """A submitit local job's state from another process: its controller (pid = job id) alive or not."""
    try:
        pid = int(job_id)
        os.kill(pid, 0)
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes() if Path(f"/proc/{pid}").exists() else b"submitit"
        alive = b"submitit" in cmd and not Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z")
    except (ValueError, OSError):
        alive = False
    if alive:
        return "RUNNING"
    result = folder / f"{job_id}_0_result.pkl"
    if not result.exists():
        return "FAILED"
    try:
        import pickle

        with open(result, "rb") as f:
            outcome = pickle.load(f)[0]
    except Exception:  # noqa: BLE001 - an unreadable result pickle: the job did not end well
        return "FAILED"
    return "COMPLETED" if outcome == "success" else "FAILED"


def scheduler_states(out: str | os.PathLike, jobs_doc: dict) -> dict[str, str]:
    """run name -> the scheduler's state of its recorded job (Slurm's words: PENDING, RUNNING, COMPLETED, FAILED,
    TIMEOUT, ...; UNKNOWN when the scheduler cannot say)."""
    folder = Path(out).resolve() / SUBMITIT_DIR
    recs = jobs_doc.get("runs", {})
    states: dict[str, str] = {}
    slurm = {name: r["job_id"] for name, r in recs.items() if r.get("executor") == "slurm"}
    for name, r in recs.items():
        if r.get("executor") == "submitit-local":
            states[name] = _local_state(str(r["job_id"]), folder)
    if slurm:
        submitit = _submitit()
        import logging

        logging.getLogger("submitit").setLevel(logging.ERROR)  # an sacct failure reads as UNKNOWN below
        watcher = submitit.SlurmJob.watcher
        watcher.clear()  # a state asked for now, not one cached by an earlier question in this process
        for jid in slurm.values():
            watcher.register_job(str(jid))
        watcher.update()
        for name, jid in slurm.items():
            states[name] = watcher.get_state(str(jid), mode="cache").split()[0].upper()  # "CANCELLED by 123"
    return states


def job_phase(state: str | None) -> str | None:
    """queued | running | ended | None (no job, or the scheduler does not know it)."""
    if not state or state == "UNKNOWN":
        return None
    if state in _QUEUED:
        return "queued"
    if state in _RUNNING:
        return "running"
    return "ended"


# ------------------------------------------------------------------------------------------------ waiting


def wait(out: str | os.PathLike, names: list[str], poll_s: float = 5.0,
         on_poll: Callable[[dict[str, str]], None] | None = None, stop: Callable[[], bool] | None = None) -> dict:
    """Block until the jobs of the named runs have ended (or ``stop()`` says so); returns their last states."""
    doc = read_jobs(out)
    t0 = time.monotonic()
    while True:
        states = scheduler_states(out, {"runs": {n: doc["runs"][n] for n in names if n in doc["runs"]}})
        if on_poll is not None:
            on_poll(states)
        # sacct may not know a job for a while after sbatch took it: an unknown state is not taken as the end
        # until a minute has passed
        settled = time.monotonic() - t0 > UNKNOWN_GRACE_S
        if all(job_phase(states.get(n)) == "ended" or (settled and job_phase(states.get(n)) is None)
               for n in names) or (stop is not None and stop()):
            return states
        time.sleep(poll_s)

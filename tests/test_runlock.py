"""One writer per run: a second writer is refused (exit 2, one line naming the holder) and writes nothing; a killed
owner leaves no lock; a process its parent started to write the run adopts the parent's lock."""

import functools
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

from cptsim.cli.main import cli
from cptsim.run.rundir import LOCK_ENV, RunDir, RunLock, RunLocked, lock_file
from shared_runs import cptsim_here

ARGS = ["train", "--epochs", "2", "--quiet", "--schedule", "cpt:3-8:g8:n4"]


def _cptsim(*args, env_extra=None, **kw):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "cptsim.cli.main", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=400, **kw)


def _files(path):
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.fixture
def killed(digits_killed_at_17, tmp_path):
    """A copy of a run SIGKILLed at step 17 of 24 (batch 128, checkpoints every 5 steps; conftest.py's, shared with
    test_checkpoints.py and test_dist_crash.py): what a cluster restarts."""
    out = tmp_path / "run"
    shutil.copytree(digits_killed_at_17, out)
    shutil.copy2(lock_file(digits_killed_at_17), lock_file(out))  # the lock file lies beside the run
    return out


def test_a_sigkilled_owner_leaves_no_lock(killed):
    assert lock_file(killed).exists()  # the file stays; the kernel dropped the flock with the process
    assert json.loads(lock_file(killed).read_text())["command"].startswith("cptsim train")
    with RunLock.acquire(killed) as lock:
        assert lock.fd is not None and not lock.adopted


@pytest.mark.slow
def test_a_second_resume_of_a_held_run_exits_2_and_writes_nothing(killed):
    """The resumes run in this process (the lock is a flock of an open file: a second open of it conflicts in one
    process as in two); test_two_concurrent_resumes... has two real processes race."""
    run = killed
    before = _files(run)
    with RunLock.acquire(run):  # a live owner (as a still-running old instance of the job would be)
        r = cptsim_here("train", "--resume", run, "--quiet")
        assert r.exit_code == 2, (r.output, r.exception)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
        assert f"pid {os.getpid()}" in lines[0] and "being written by" in lines[0]
        assert _files(run) == before
        # the report refuses to write into it too, and reads it without writing
        rep = CliRunner().invoke(cli, ["report", str(run), "--hw", "h100"])
        assert rep.exit_code == 2 and "--no-save" in rep.stderr, rep.output
        rep = CliRunner().invoke(cli, ["report", str(run), "--no-save", "--hw", "h100", "--json"])
        assert rep.exit_code == 0, rep.output
        assert _files(run) == before
    r = cptsim_here("train", "--resume", run, "--quiet")  # the owner is gone: this one proceeds
    assert r.exit_code == 0, (r.output, r.exception)
    assert [x["step"] for x in RunDir.open(run).read_trace().records] == list(range(24))


@pytest.mark.slow
def test_two_concurrent_resumes_one_proceeds_and_the_trace_holds_each_step_once(tmp_path):
    """The issue's scenario: a killed run resumed twice at once. Exactly one proceeds; the other exits 2 naming it
    (its pid) before writing anything; after the survivor finishes, every step is in the trace once."""
    out = tmp_path / "run"
    r = _cptsim(*ARGS, "--batch-size", "32", "--checkpoint-every", "10", "--out", out,
                env_extra={"CPTSIM_FAULT_KILL_AT_STEP": "25"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    cmd = [sys.executable, "-m", "cptsim.cli.main", "train", "--resume", str(out), "--quiet"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p, *p.communicate(timeout=400)) for p in procs]
    codes = sorted(p.returncode for p, _, _ in results)
    assert codes == [0, 2], [(p.returncode, e) for p, _, e in results]
    (winner, _, _), = [x for x in results if x[0].returncode == 0]
    (_, _, lost), = [x for x in results if x[0].returncode == 2]
    lines = lost.strip().splitlines()
    assert len(lines) == 1 and f"pid {winner.pid}" in lines[0], lost
    run = RunDir.open(out)
    total = run.read_config()["total_steps"]
    trace = run.read_trace()
    assert [x["step"] for x in trace.records] == list(range(total)) and not trace.truncated
    assert len(run.read_metrics().records) == 2


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _hold_unrecorded(path, record):
    """Take the flock as a winner does, before it has recorded itself: the file still holds ``record``."""
    import fcntl

    path.write_text(json.dumps(record) + "\n")
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def test_a_loser_names_the_winner_even_while_the_file_still_names_a_killed_holder(tmp_path, monkeypatch):
    """The race two resumes of a killed run met: the winner has the flock but the file still holds the killed
    process's record (then, for a moment, nothing). The loser waits for the live record instead of naming the
    dead pid or "another process"."""
    import socket
    import threading

    run = tmp_path / "run"
    dead = {"pid": _dead_pid(), "host": socket.gethostname(), "started": "then", "command": "cptsim train"}
    fd = _hold_unrecorded(lock_file(run), dead)
    try:
        live = dict(dead, pid=os.getpid(), started="now", token="t")
        timer = threading.Timer(0.3, lambda: os.pwrite(fd, (json.dumps(live) + "\n").encode(), 0))
        timer.start()
        with pytest.raises(RunLocked, match=f"pid {os.getpid()} on "):
            RunLock.acquire(run)
        timer.join()
    finally:
        os.close(fd)
    fd = _hold_unrecorded(lock_file(run), dead)  # a winner that never records itself: the dead pid is not named
    # (the loser gives up waiting for a live record sooner than its 2 s: how long it waits is not the subject)
    monkeypatch.setattr(RunLock, "holder", functools.partialmethod(RunLock.holder, wait_s=0.3))
    try:
        with pytest.raises(RunLocked, match="another process \\(it has not recorded itself yet\\)"):
            RunLock.acquire(run)
    finally:
        os.close(fd)


def test_a_new_run_into_a_locked_place_is_refused_before_anything_is_made(tmp_path):
    out = tmp_path / "new"
    with RunLock.acquire(out):
        r = CliRunner().invoke(cli, ["train", "--quiet", "--steps", "1", "--out", str(out)])
    assert r.exit_code == 2 and "being written by" in r.stderr, r.output
    assert not out.exists()


def test_a_child_adopts_its_parents_lock_and_nobody_else_does(tmp_path, monkeypatch):
    run = tmp_path / "run"
    parent = RunLock.acquire(run)
    try:
        with pytest.raises(RunLocked, match=f"pid {os.getpid()}"):
            RunLock.acquire(run)  # no token: a second writer
        monkeypatch.setenv(LOCK_ENV, f"0000000000000000:{lock_file(run)}")
        with pytest.raises(RunLocked):
            RunLock.acquire(run)  # a token that is not the holder's
        monkeypatch.setenv(LOCK_ENV, parent.handoff_env()[LOCK_ENV])
        child = RunLock.acquire(run)
        assert child.adopted and child.fd is None  # the parent's descriptor holds it
    finally:
        parent.release()
    orphan = RunLock.acquire(run)  # the parent is gone: the child it meant to write the run takes the lock itself
    try:
        assert not orphan.adopted and orphan.fd is not None
        monkeypatch.delenv(LOCK_ENV)
        with pytest.raises(RunLocked):
            RunLock.acquire(run)
    finally:
        orphan.release()


FORKS_THEN_DIES = """
import os, signal, sys, time
from cptsim.run.rundir import RunLock
lock = RunLock.acquire(sys.argv[1])
pid = os.fork()  # a DataLoader worker (fork start method): a copy of the process, lock descriptor included
if pid == 0:
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1), os.dup2(null, 2)  # (the test reads the parent's output to its end)
    time.sleep(30)
    os._exit(0)
print(pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_forked_worker_does_not_keep_a_killed_runs_lock(tmp_path):
    """A run's process forks workers (DataLoader workers) and is SIGKILLed: a resume at once must get the run. The
    forked copy of the lock's descriptor used to hold the flock until the workers noticed and exited (~5 s), and
    the resume was refused as 'being written by another process'."""
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-c", FORKS_THEN_DIES, str(run)], capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGKILL, p.stderr
    child = int(p.stdout.split()[0])
    try:
        os.kill(child, 0)  # the forked worker still runs ...
        with RunLock.acquire(run) as lock:  # ... and the run is free
            assert lock.fd is not None and not lock.adopted
    finally:
        os.kill(child, signal.SIGKILL)

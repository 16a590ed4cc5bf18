"""Issue 25 item 3: `--max-restarts` restarts a job that dies of a worker's failure, never one that has bad input.

A typo is found by the launcher before any worker starts; bad input only a worker can find (here: a run whose every
checkpoint is damaged, found when the workers read them) stops the job at once, without restarts. Either way: exit
2 and the one line that says what is wrong. Worker starts are counted by a ``sitecustomize`` that every Python
started with the test's PYTHONPATH runs: it appends the worker's restart count and rank to a file.
(A good job that loses a worker is still restarted: tests/test_elastic.py.)"""

import os
import subprocess
import sys
import time

import pytest

SITE = """import os
log = os.environ.get("CPTSIM_TEST_WORKER_LOG")
if log and "TORCHELASTIC_RESTART_COUNT" in os.environ:
    with open(log, "a") as f:
        f.write(os.environ["TORCHELASTIC_RESTART_COUNT"] + " " + os.environ.get("RANK", "?") + "\\n")
"""


def _cptsim(tmp_path, *args):
    """(completed process, seconds, worker starts as (restart count, rank) pairs)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITE)
    log = tmp_path / "workers.log"
    log.unlink(missing_ok=True)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, CPTSIM_TEST_WORKER_LOG=str(log))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "cptsim.cli.main", *map(str, args)], capture_output=True, text=True,
                       env=env, timeout=300)
    dt = time.perf_counter() - t0
    starts = [tuple(line.split()) for line in log.read_text().splitlines()] if log.exists() else []
    return r, dt, starts


def test_a_typo_is_refused_by_the_launcher_before_any_worker_starts(tmp_path):
    out = tmp_path / "run"
    for typo, said in ((["--schedule", "cpt:3-8:g8:n-1"], "cycle count"), (["--fp-layers", "nosuch"], "'nosuch'")):
        r, dt, starts = _cptsim(tmp_path, "train", "--model", "mlp", "--steps", "2", "--quiet", "--out", out,
                                "--nproc", "2", "--max-restarts", "3", *typo)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], r.stderr
        assert starts == []  # no worker ran, so none was restarted
        assert not out.exists()


@pytest.mark.slow
def test_bad_input_a_worker_finds_stops_the_job_without_restarts(tmp_path):
    from shared_runs import cptsim_here

    run = tmp_path / "run"
    r = cptsim_here("train", "--model", "mlp", "--steps", "3", "--quiet", "--out", run)  # a run to resume
    assert r.exit_code == 0, (r.output, r.exception)
    for ckpt in run.glob("checkpoint*.pt"):  # the launcher cannot tell (it does not read them); the workers can
        ckpt.write_bytes(b"damaged")
    r, dt, starts = _cptsim(tmp_path, "train", "--resume", run, "--quiet", "--nproc", "2", "--max-restarts", "3")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and "no usable checkpoint" in lines[0], r.stderr
    # one attempt: two workers, both of restart 0 (before the fix: 4 attempts, 8 starts, 4 x 2 error lines, exit 1)
    assert sorted(starts) == [("0", "0"), ("0", "1")], starts
    print(f"bad input found by a worker: exit {r.returncode} after {dt:.1f} s, {len(starts)} worker starts")


def test_report_bad_input_outside_a_launched_job_does_nothing(monkeypatch):
    from cptsim.run import dist

    monkeypatch.delenv(dist.BAD_INPUT_ENV, raising=False)
    t0 = time.perf_counter()
    assert dist.report_bad_input("anything") is False and time.perf_counter() - t0 < 1

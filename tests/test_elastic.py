"""Elastic restarts through torchrun: one rank SIGKILLed mid-epoch -> torchrun restarts the group, every rank resumes
from the last checkpoint, and the finished run holds every step once with the weights of an uninterrupted run."""

import pytest
import torch
from click.testing import CliRunner

from cptsim.cli.main import cli
from cptsim.run.rundir import RunDir, RunLock
# Full precision, no BatchNorm (mlp), 24 steps, a checkpoint every 5: the 2-rank update equals the 1-rank one up to
# the order of float sums in the gradient all-reduce (test_dist_crash.test_two_gloo_processes_match_one_process),
# hence its tolerance below.
from shared_runs import MLP_FP as ARGS
from shared_runs import cptsim


@pytest.mark.slow
def test_a_killed_rank_is_restarted_and_the_job_completes_by_itself(mlp_fp_one_process, tmp_path):
    """The one-process run of ARGS is conftest.py's (made in the test process, shared with test_dist_crash.py)."""
    two = tmp_path / "two"
    r2 = cptsim(*ARGS, "--out", two, "--nproc", "2", "--max-restarts", "1", timeout=500,
                env_extra={"CPTSIM_FAULT_KILL_AT_STEP": "17", "CPTSIM_FAULT_RANK": "1"})
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert "restart 1 of the job: resuming" in r2.stderr
    a, b = mlp_fp_one_process, RunDir.open(two)
    trace = b.read_trace()
    assert [r["step"] for r in trace.records] == list(range(24)) and not trace.truncated  # each step exactly once
    assert len(b.read_metrics().records) == 2
    for ra, rb in zip(a.read_trace().records, trace.records):
        assert (ra["batch_size"], ra["bits"], ra["macs"], ra["bitops"]) == \
               (rb["batch_size"], rb["bits"], rb["macs"], rb["bitops"])
        assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-5)
    wa, wb = a.load_checkpoint()["model"], b.load_checkpoint()["model"]
    for k in wa:
        assert torch.allclose(wa[k], wb[k], rtol=1e-4, atol=1e-6), k
    assert b.read_config()["world_size"] == 2
    with RunLock.acquire(two):  # the launcher held the run for the job and let it go at the end
        pass


def test_max_restarts_goes_with_nproc(tmp_path):
    r = CliRunner().invoke(cli, ["train", "--quiet", "--steps", "1", "--out", str(tmp_path / "r"),
                                 "--max-restarts", "1"])
    assert r.exit_code == 2 and "--nproc" in r.stderr, r.output
    assert not (tmp_path / "r").exists()

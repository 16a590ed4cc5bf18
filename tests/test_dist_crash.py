"""Data parallel equals single process; kills, ^C and NaN never lose or double-count a step."""

import os
import shutil

import pytest
import torch

from cptsim.run.rundir import RunDir
from shared_runs import DIGITS as BASE  # 24 steps, a checkpoint every 5
from shared_runs import MLP_FP, cptsim_here
from shared_runs import cptsim as _cptsim


def _no_time(records):
    return [{k: v for k, v in r.items() if k not in ("time_s", "epoch_time_s", "recal_time_s")} for r in records]


def _weights(run):
    return run.load_checkpoint()["model"]


@pytest.mark.slow
def test_two_gloo_processes_match_one_process(mlp_fp_one_process, tmp_path):
    """Full precision, no BatchNorm (mlp): the 2-rank update is the 1-rank update up to the order of float sums in
    the gradient all-reduce, so weights agree to ~1e-6 relative after 24 steps; BitOPs count the global batch and
    agree exactly. A quantized run (cpt) must give identical BitOPs too: they depend on shapes and bits only.
    The one-process runs are made in this process (the fp one shared with test_elastic.py, conftest.py); the
    two-rank runs are real launches."""
    for args, exact in ((MLP_FP, True), ([*BASE, "--model", "mlp", "--schedule", "cpt:3-8:g8:n4"], False)):
        one, two = tmp_path / f"one-{exact}", tmp_path / f"two-{exact}"
        if exact:
            a = mlp_fp_one_process
        else:
            r1 = cptsim_here(*args, "--out", str(one))
            assert r1.exit_code == 0, (r1.output, r1.exception)
            a = RunDir.open(one)
        r2 = _cptsim(*args, "--out", str(two), "--nproc", "2")
        assert r2.returncode == 0, r2.stderr
        b = RunDir.open(two)
        ta, tb = a.read_trace().records, b.read_trace().records
        assert [r["step"] for r in tb] == list(range(24))
        for ra, rb in zip(ta, tb):
            assert (ra["batch_size"], ra["bits"], ra["macs"], ra["bitops"]) == \
                   (rb["batch_size"], rb["bits"], rb["macs"], rb["bitops"])
        assert b.read_config()["world_size"] == 2
        if exact:
            wa, wb = _weights(a), _weights(b)
            for k in wa:
                assert torch.allclose(wa[k], wb[k], rtol=1e-4, atol=1e-6), k
            assert [r["loss"] for r in ta] == pytest.approx([r["loss"] for r in tb], rel=1e-5)


@pytest.fixture
def uninterrupted(digits_uninterrupted):
    """BASE uninterrupted (conftest.py, shared with test_checkpoints.py)."""
    return digits_uninterrupted


def _same_as(run, ref):
    trace = run.read_trace()
    assert not trace.truncated
    assert [r["step"] for r in trace.records] == list(range(24))  # each step exactly once
    assert _no_time(trace.records) == _no_time(ref.read_trace().records)
    assert _no_time(run.read_metrics().records) == _no_time(ref.read_metrics().records)
    wa, wb = _weights(run), _weights(ref)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not list(run.path.glob(".*.tmp"))


@pytest.mark.slow
def test_sigkill_mid_epoch_with_half_written_files_resumes_exactly(uninterrupted, digits_killed_at_17, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(digits_killed_at_17, out)  # BASE SIGKILLed as step 17 began (conftest.py, a real process)
    run = RunDir.open(out)
    assert run.load_checkpoint()["step"] == 15  # the mid-epoch checkpoint before the kill
    # what a kill during a trace append and during a checkpoint write leave behind:
    with open(out / "trace.jsonl", "a") as f:
        f.write('{"step": 17, "epoch": 1, "batch_si')
    (out / ".checkpoint.pt.abc123.tmp").write_bytes(b"\x80half a checkpoint")
    assert run.read_trace().truncated  # readers see the cut line and say so
    r = _cptsim("train", "--resume", str(out), "--quiet")
    assert r.returncode == 0, r.stderr
    _same_as(run, uninterrupted)


@pytest.mark.slow
def test_ctrl_c_checkpoints_then_resume_is_exact(uninterrupted, tmp_path):
    out = tmp_path / "run"
    r = _cptsim(*BASE, "--out", str(out), env_extra={"CPTSIM_FAULT_SIGINT_AT_STEP": "8"})
    assert r.returncode == 130, r.stderr
    assert "--resume" in r.stderr and "Traceback" not in r.stderr
    run = RunDir.open(out)
    assert run.load_checkpoint()["step"] == 9  # the step that was running finished, then the checkpoint
    assert len(run.read_trace().records) == 9
    # resumed in this process (test_sigkill_mid_epoch... resumes in a new one)
    r = cptsim_here("train", "--resume", str(out), "--quiet")
    assert r.exit_code == 0, (r.output, r.exception)
    _same_as(run, uninterrupted)


@pytest.mark.slow
def test_nan_loss_stops_with_the_step_and_bits_and_keeps_the_checkpoint(tmp_path):
    """In this process: a NaN is no process behaviour (the exit code and the one line are the command's)."""
    out = tmp_path / "run"
    r = cptsim_here(*BASE, "--out", str(out), env_extra={"CPTSIM_FAULT_NAN_AT_STEP": "14"})
    assert r.exit_code == 1, (r.output, r.exception)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "step 14" in lines[0] and "bits" in lines[0] and "--resume" in lines[0]
    run = RunDir.open(out)
    assert run.load_checkpoint()["step"] == 12  # the last good checkpoint: end of epoch 0
    assert [r["step"] for r in run.read_trace().records] == list(range(14))  # the NaN step was not recorded


LSTM = ["train", "--model", "lstm-lm:layers=1,hidden=32", "--dataset", "pydoc-chars", "--batch-size", "64",
        "--steps", "8", "--checkpoint-every", "3", "--quiet", "--nproc", "2"]


@pytest.mark.slow
def test_two_ranks_of_an_lstm_resume_each_with_its_own_carried_state(tmp_path):
    """Issue 22 item 4: each rank carries the hidden state of its own rows of the text streams. A checkpoint holds
    every rank's (not rank 0's alone), so a 2-rank run killed mid-epoch and resumed equals the uninterrupted one
    bit for bit (two ranks' gradient sums are exact whatever their order)."""
    ref, out = tmp_path / "ref", tmp_path / "run"
    r = _cptsim(*LSTM, "--out", str(ref))
    assert r.returncode == 0, r.stderr[-3000:]
    r = _cptsim(*LSTM, "--out", str(out), env_extra={"CPTSIM_FAULT_KILL_AT_STEP": "5"})
    assert r.returncode != 0
    run = RunDir.open(out)
    assert run.load_checkpoint()["step"] == 3
    r = _cptsim("train", "--resume", str(out), "--quiet", "--nproc", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    a = RunDir.open(ref)
    assert [x["step"] for x in run.read_trace().records] == list(range(8))
    assert _no_time(run.read_trace().records) == _no_time(a.read_trace().records)
    assert _no_time(run.read_metrics().records) == _no_time(a.read_metrics().records)
    wa, wb = _weights(a), _weights(run)
    assert all(torch.equal(wa[k], wb[k]) for k in wa if k != "carry")


def _cuda_rng_worker(rank, world, port, out):
    """One gloo rank of a job on "cuda" whose CUDA generator is a stub: its state is 16 bytes of the rank."""
    import torch.distributed as dist

    from cptsim.run.dist import Dist
    from cptsim.run.train import rank_model_state, rank_states, restore_rng

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    restored = []
    torch.cuda.get_rng_state = lambda device="cuda": torch.full((16,), 10 + rank, dtype=torch.uint8)
    torch.cuda.set_rng_state = lambda state, device="cuda": restored.append(state.clone())
    d = Dist(rank=rank, world=world, device="cuda")
    model = torch.nn.BatchNorm1d(3)
    model.running_mean.fill_(rank)  # a rank-local buffer, as between two end-of-epoch broadcasts
    state = rank_states(d, model, "cuda")
    ckpt = [{"model": model.state_dict(), **state}]
    dist.broadcast_object_list(ckpt, src=0)  # what every rank reads back from rank 0's checkpoint file
    torch.manual_seed(123)
    restore_rng(ckpt[0], d, "cuda")
    mine = rank_model_state(ckpt[0], rank)["running_mean"]
    torch.save({"restored": restored, "running_mean": mine, "n_cuda": len(ckpt[0]["rng"]["cuda"])},
               f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


def test_every_rank_gets_its_own_cuda_generator_state_back(tmp_path):
    """Issue 22 item 4: a checkpoint of a data-parallel CUDA run held rank 0's CUDA generator state alone, and
    resume read ``["cuda"][rank]``: an IndexError on every rank but 0. Two gloo ranks with the CUDA generator
    stubbed: the checkpoint holds both states, each rank restores its own, and its own buffers."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # forked, not spawned: the ranks need this process's modules, not a fresh start of Python and torch each
    mp.start_processes(_cuda_rng_worker, args=(2, port, str(tmp_path)), nprocs=2, start_method="fork")
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["n_cuda"] == 2
        assert len(got["restored"]) == 1 and torch.equal(got["restored"][0], torch.full((16,), 10 + rank,
                                                                                        dtype=torch.uint8))
        assert torch.equal(got["running_mean"], torch.full((3,), float(rank)))

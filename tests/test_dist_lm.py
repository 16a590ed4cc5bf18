"""Issue 25 item 9: with several processes, every rank keeps its own rows of the text streams -- and the hidden state
it carries for them -- on every step, the epoch's short last step included; so 2-process LM training is 1-process
LM training (as tests/test_dist_crash.py shows for the MLP).

The mechanism: ``stream_order(B)`` lays an epoch out as B rows of consecutive sequences, the first rows one sequence
longer, so the last step holds only the first n < B rows. Each rank carries the LSTM state of the rows it got; the
model keeps the first rows of that state when a batch shrinks. A plain contiguous split of the last step's n rows
(``train.local_share``) gave rank 1 of 2 rows n/2..n-1 with the state of rows B/2..B/2 + n/2 - 1: another row's
text. ``TextStream.rank_share`` gives each rank the rows it owns, always."""

import os
import subprocess
import sys

import pytest
import torch

from cptsim.data.text import TextStream
from cptsim.run.rundir import RunDir
from cptsim.run.train import local_share
from shared_runs import cptsim_here


def _stream(n_sequences: int, T: int = 4) -> TextStream:
    return TextStream(torch.arange(n_sequences * T + 1), T, ["a"], True, "test")


def _misaligned(n: int, rows: int, world: int, share) -> list[tuple]:
    """(step, rank, row) wherever a rank's j-th sample does not continue the text of its carried state's row j.

    A rank's carried state is that of the samples it ran last (a rank given none keeps it); the model uses the first
    rows of it: sample j at step i must be the sequence after the j-th sample of the rank's previous step."""
    order = _stream(n).stream_order(rows)
    bad = []
    for rank in range(world):
        carried = None
        for i in range(0, len(order), rows):
            mine = share(order[i:i + rows], rank, world, rows)
            if len(mine) == 0:
                continue
            if carried is not None:
                if len(mine) > len(carried):
                    bad.append((i // rows, rank, "more rows than its state"))
                bad += [(i // rows, rank, j) for j in range(min(len(mine), len(carried)))
                        if int(mine[j]) != int(carried[j]) + 1]
            carried = mine
    return bad


@pytest.mark.parametrize("n,rows,world", [(6539, 64, 2), (6539, 1000, 2), (6539, 700, 2), (6539, 64, 3),
                                          (100, 8, 4), (101, 8, 3), (7, 8, 2), (64, 64, 2)])
def test_every_rank_continues_its_own_rows_on_every_step(n, rows, world):
    bad = _misaligned(n, rows, world, TextStream.rank_share)
    assert bad == []
    # the shares are the whole step, each sample once, in rank order; a full step is split as local_share splits it
    order = _stream(n).stream_order(rows)
    for i in range(0, len(order), rows):
        step = order[i:i + rows]
        parts = [TextStream.rank_share(step, r, world, rows) for r in range(world)]
        assert sorted(torch.cat(parts).tolist()) == sorted(step.tolist())
        if len(step) == rows:
            assert all(torch.equal(p, q) for p, q in zip(parts, (local_share(step, r, world) for r in range(world))))


def test_a_plain_split_of_the_short_last_step_gave_ranks_other_rows_state():
    """The bug, as it was: pydoc-chars' 6539 training sequences at batch 1000 end in a step of 539 rows; rank 1
    got rows 270-538 with the state of rows 500-768."""
    bad = _misaligned(6539, 1000, 2, lambda g, rank, world, rows: local_share(g, rank, world))
    assert bad and {(step, rank) for step, rank, _ in bad} == {(6, 1)}


def _cptsim(*args):
    return subprocess.run([sys.executable, "-m", "cptsim.cli.main", *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ), timeout=300)


# Full precision, no dropout: nothing random, so 2 ranks equal 1 up to the order of float sums in the all-reduce.
# Batch 1000 over pydoc-chars' 6539 training sequences: 7 steps, the last one of 539 rows (rank 0: 500, rank 1: 39).
LM = ["train", "--model", "lstm-lm:layers=1,hidden=16,dropout=0", "--dataset", "pydoc-chars", "--schedule",
      "static:32:g32", "--batch-size", "1000", "--epochs", "1", "--lr", "1", "--recal-batches", "0", "--quiet"]


@pytest.mark.slow
def test_two_processes_train_a_language_model_as_one_does(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    r = cptsim_here(*LM, "--out", one)  # the one process is this one; the two are a real launch
    assert r.exit_code == 0, (r.output, r.exception)
    r = _cptsim(*LM, "--out", two, "--nproc", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = RunDir.open(one), RunDir.open(two)
    ta, tb = a.read_trace().records, b.read_trace().records
    assert [x["batch_size"] for x in tb] == [1000] * 6 + [539]
    for ra, rb in zip(ta, tb, strict=True):
        assert (ra["batch_size"], ra["bits"], ra["macs"], ra["bitops"]) == \
               (rb["batch_size"], rb["bits"], rb["macs"], rb["bitops"])
    # the last step is where a misaligned state showed: its loss (and the weights it made) differed
    assert [x["loss"] for x in tb] == pytest.approx([x["loss"] for x in ta], rel=1e-5)
    ca, cb = a.load_checkpoint(), b.load_checkpoint()
    wa, wb = ca["model"], cb["model"]
    for k in wa:
        if k != "carry":  # the carried state is per rank (a checkpoint holds every rank's)
            assert torch.allclose(wa[k], wb[k], rtol=1e-4, atol=1e-6), k
    # Each rank carries the state of the rows it owns (rank 0: rows 0-499, rank 1: 500-999), the short last step
    # included: there rank 0 ran rows 0-499 and rank 1 rows 500-538 (a plain split: 0-269 and 270-538). Together
    # they are the one process's state after that step. (The losses cannot tell: this small LSTM forgets its
    # initial state within the 64 characters of a sequence.)
    carried = [cb["rank_buffers"][r]["carry"] for r in (0, 1)]  # (layers, h/c, rows, hidden)
    assert [c.shape[2] for c in carried] == [500, 39]
    assert torch.allclose(torch.cat(carried, dim=2), wa["carry"], rtol=1e-4, atol=1e-5)
    ma, mb = a.read_metrics().records[-1], b.read_metrics().records[-1]
    assert mb["train_loss"] == pytest.approx(ma["train_loss"], rel=1e-5)
    assert mb["val_loss"] == pytest.approx(ma["val_loss"], rel=1e-4)

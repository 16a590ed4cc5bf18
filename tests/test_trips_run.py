"""What a new user trips on in `cptsim train`: a ^C stop reads as a notice with the way to resume, not an error; a
language model's loss is per token in the progress bar and trace.jsonl as in metrics.jsonl; a small graph trains on
one thread and does not write a checkpoint at every one of its one-step epochs."""

import math

import torch

from cptsim.run.config import TrainConfig
from cptsim.run.rundir import RunDir
from cptsim.run.train import _DEFAULT_THREADS, _CheckpointPacer, cpu_threads, train

from shared_runs import cptsim_here


def test_a_ctrl_c_stop_is_a_notice_that_says_how_to_resume_and_exits_130(tmp_path):
    out = tmp_path / "run"
    r = cptsim_here("train", "--model", "mlp", "--steps", "6", "--schedule", "cpt:3-8:n1", "--batch-size", "64",
                    "--quiet", "--out", out, env_extra={"CPTSIM_FAULT_SIGINT_AT_STEP": "2"})
    assert r.exit_code == 130, (r.output, r.exception)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and not lines[0].startswith("error") and "Traceback" not in r.stderr, r.stderr
    assert "stopped after step 3 of 6" in lines[0] and f"cptsim train --resume {out}" in lines[0]
    assert RunDir.open(out).load_checkpoint()["step"] == 3  # what it says is there


def test_a_language_models_trace_loss_is_the_per_token_cross_entropy(tmp_path):
    cfg = TrainConfig.from_dict({"model": "lstm-lm:layers=1,hidden=16", "dataset": "pydoc-chars", "steps": 3,
                                 "batch_size": 8, "schedule": "static:8", "lr_schedule": "constant"})
    run = train(cfg, str(tmp_path / "lm"), progress=False)
    trace, metrics = run.read_trace().records, run.read_metrics().records
    vocab = run.read_config()["num_classes"]
    # an untrained model's next-character guess is near uniform: ln(vocab) per token (a sequence's sum is ~T times)
    assert abs(trace[0]["loss"] - math.log(vocab)) < 0.1 * math.log(vocab), (trace[0]["loss"], vocab)
    # metrics.jsonl's train_loss is per token over the epoch's tokens: the trace's losses weighted by their batches
    mean = sum(r["loss"] * r["batch_size"] for r in trace) / sum(r["batch_size"] for r in trace)
    assert abs(mean - metrics[-1]["train_loss"]) < 1e-6 * mean


def test_a_small_graph_trains_on_one_thread_a_large_one_on_the_default():
    assert cpu_threads(None, (34, 34), graph=True) == 1                     # karate: one graph, 34 x 34
    assert cpu_threads(None, (2708, 1433), graph=True) == _DEFAULT_THREADS  # Cora
    assert cpu_threads(None, (3, 32, 32)) == _DEFAULT_THREADS and cpu_threads(3, (34, 34), graph=True) == 3


class _OneRank:
    is_main = True

    @staticmethod
    def any(flag):
        return flag


def test_checkpoints_of_millisecond_epochs_are_paced_and_the_first_and_forced_ones_always_written(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("cptsim.run.train.time.perf_counter", lambda: clock[0])
    pacer = _CheckpointPacer()
    assert pacer.due(_OneRank, forced=False)  # the first epoch's end
    pacer.wrote(0.05)                          # a 50 ms checkpoint
    clock[0] += 0.01                           # a 10 ms epoch later
    assert not pacer.due(_OneRank, forced=False) and pacer.due(_OneRank, forced=True)
    clock[0] += pacer.RATIO * 0.05             # once RATIO x its write time has passed, the next end writes
    assert pacer.due(_OneRank, forced=False)


def test_a_one_step_epoch_graph_run_writes_few_checkpoints_and_ends_with_one(tmp_path, monkeypatch):
    writes = []
    save = RunDir.save_checkpoint
    monkeypatch.setattr(RunDir, "save_checkpoint", lambda self, state, **k: writes.append(state["step"])
                        or save(self, state, **k))
    cfg = TrainConfig.from_dict({"model": "gcn:hidden=16,layers=2", "dataset": "karate", "epochs": 40,
                                 "batch_size": 1, "recal_batches": 1})
    run = train(cfg, str(tmp_path / "g"), progress=False)
    assert torch.get_num_threads() == 1
    assert len(run.read_metrics().records) == 40  # evaluated every epoch, as before
    assert writes[0] == 1 and writes[-1] == 40 and len(writes) < 20, writes
    assert run.read_checkpoint_manifest()[-1]["step"] == 40 and run.load_checkpoint()["step"] == 40

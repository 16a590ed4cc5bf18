"""Checkpoints with a history and a checksum: the newest damaged (truncated, bit-flipped, deleted) -> resume falls
back one checkpoint, says so in one line, and finishes equal to an uninterrupted run; a full disk during a
checkpoint leaves the previous one intact (exit 1, one line)."""

import errno
import hashlib
import json
import os
import shutil

import pytest
import torch
from click.testing import CliRunner

from cptsim.cli.main import cli
from cptsim.run.rundir import CHECKPOINT, CHECKPOINTS, RunDir, checkpoint_file

from shared_runs import DIGITS as ARGS  # 24 steps, a checkpoint every 5
from shared_runs import cptsim as _cptsim
from shared_runs import cptsim_here


def _no_time(records):
    return [{k: v for k, v in r.items() if k not in ("time_s", "epoch_time_s", "recal_time_s")} for r in records]


def _same_as(run, ref):
    trace = run.read_trace()
    assert [r["step"] for r in trace.records] == list(range(24)) and not trace.truncated  # each step once
    assert _no_time(trace.records) == _no_time(ref.read_trace().records)
    assert _no_time(run.read_metrics().records) == _no_time(ref.read_metrics().records)
    wa, wb = run.load_checkpoint()["model"], ref.load_checkpoint()["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture
def reference(digits_uninterrupted):
    """ARGS uninterrupted (conftest.py, shared with test_dist_crash.py)."""
    return digits_uninterrupted


@pytest.fixture
def killed(digits_killed_at_17):
    """ARGS SIGKILLed at step 17 (conftest.py, shared): checkpoints at 12 (end of epoch 0) and 15 are kept; 5 and 10
    were pruned."""
    return digits_killed_at_17


def test_the_last_k_checkpoints_are_kept_with_their_checksums(reference):
    manifest = json.loads((reference.path / CHECKPOINTS).read_text())
    entries = manifest["checkpoints"]
    assert manifest["format"] == "cptsim.checkpoints/1" and [e["step"] for e in entries] == [20, 24]
    for e in entries:
        data = (reference.path / e["file"]).read_bytes()
        assert len(data) == e["size"] and hashlib.sha256(data).hexdigest() == e["sha256"]
    assert sorted(p.name for p in reference.path.glob("checkpoint*.pt")) == sorted([
        CHECKPOINT, checkpoint_file(20), checkpoint_file(24)])
    assert (reference.path / CHECKPOINT).read_bytes() == (reference.path / checkpoint_file(24)).read_bytes()
    assert reference.load_checkpoint()["step"] == 24


def _damage(path, how):
    if how == "truncated":
        data = path.read_bytes()
        with open(path, "r+b") as f:
            f.truncate(len(data) // 2)
    elif how == "bit-flipped":
        with open(path, "r+b") as f:
            f.seek(path.stat().st_size // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x10]))
    else:
        path.unlink()


@pytest.mark.slow
@pytest.mark.parametrize("how, why", [("truncated", "is truncated"), ("bit-flipped", "fails its SHA-256 checksum"),
                                      ("deleted", "is missing")])
def test_a_damaged_newest_checkpoint_falls_back_one_and_the_run_ends_as_if_uninterrupted(
        reference, killed, tmp_path, how, why):
    out = tmp_path / "run"
    shutil.copytree(killed, out)
    _damage(out / checkpoint_file(15), how)
    doc = json.loads(CliRunner().invoke(cli, ["report", str(out), "--no-save", "--hw", "h100", "--json"]).stdout)
    resume = doc["runs"][0]["run"]["resume"]
    assert (resume["step"], resume["file"]) == (12, checkpoint_file(12)) and resume["verified"]
    assert resume["skipped"] == [{"file": checkpoint_file(15), "step": 15, "why": resume["skipped"][0]["why"]}]
    assert resume["skipped"][0]["why"].startswith(why)

    if how == "truncated":  # the resume of a real process once; the other two damages resume in this process
        r = _cptsim("train", "--resume", out, "--quiet")
        assert r.returncode == 0, r.stderr
    else:
        r = cptsim_here("train", "--resume", out, "--quiet")
        assert r.exit_code == 0, (r.output, r.exception)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: "), r.stderr
    assert checkpoint_file(15) in lines[0] and why in lines[0] and f"from {checkpoint_file(12)} (step 12)" in lines[0]
    _same_as(RunDir.open(out), reference)


def test_no_usable_checkpoint_is_one_line_and_exit_2(killed, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(killed, out)
    _damage(out / checkpoint_file(15), "truncated")
    _damage(out / checkpoint_file(12), "bit-flipped")
    before = (out / "trace.jsonl").read_bytes()
    r = CliRunner().invoke(cli, ["train", "--resume", str(out), "--quiet"])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no usable checkpoint" in lines[0] and checkpoint_file(12) in lines[0]
    assert (out / "trace.jsonl").read_bytes() == before


def test_history_is_pruned_to_keep_and_survives_a_damaged_manifest(tmp_path):
    run = RunDir(tmp_path)
    for step in (3, 6, 9, 12):
        run.save_checkpoint({"step": step, "x": torch.tensor([float(step)])}, keep=3)
    assert [e["step"] for e in run.read_checkpoint_manifest()] == [6, 9, 12]
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*.pt")) == [checkpoint_file(s) for s in (6, 9, 12)]
    (tmp_path / CHECKPOINTS).write_text("{not json")
    c = run.find_checkpoint()
    assert c.step == 12 and not c.verified and "cannot read the checkpoint manifest" in c.fallback_message()
    # A resume from 6 abandons the later timeline: saving step 7 drops 9 and 12.
    run.save_checkpoint({"step": 6, "x": torch.tensor([6.0])}, keep=3)
    run.save_checkpoint({"step": 7, "x": torch.tensor([7.0])}, keep=3)
    assert [e["step"] for e in run.read_checkpoint_manifest()] == [6, 7]
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*.pt")) == [checkpoint_file(6), checkpoint_file(7)]


def test_a_run_of_an_older_cptsim_resumes_from_its_lone_checkpoint(tmp_path):
    import io

    buf = io.BytesIO()
    torch.save({"step": 5, "x": torch.tensor([1.0])}, buf)
    (tmp_path / CHECKPOINT).write_bytes(buf.getvalue())
    c = RunDir(tmp_path).find_checkpoint()
    assert c.step == 5 and c.state["step"] == 5 and c.fallback_message() is None
    assert "unverified" in RunDir(tmp_path).resume_point()["text"]


@pytest.mark.slow
def test_enospc_during_a_checkpoint_keeps_the_previous_one_and_exits_1(reference, tmp_path, monkeypatch):
    """The disk fills while the second checkpoint (step 10) is written: one line, exit 1, and the manifest and
    checkpoint of step 5 untouched; a resume then finishes the run as if nothing happened."""
    out = tmp_path / "run"
    real_fsync, seen = os.fsync, []

    def fsync(fd):
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            name = ""
        if os.path.basename(name).startswith(".checkpoint-"):
            seen.append(name)
            if len(seen) == 2:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    r = CliRunner().invoke(cli, [*ARGS, "--out", str(out)])
    monkeypatch.undo()
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "No space left on device" in lines[0] and "step 10" in lines[0], r.stderr
    assert "--resume" in lines[0]
    run = RunDir.open(out)
    assert [e["step"] for e in run.read_checkpoint_manifest()] == [5]
    assert run.find_checkpoint().step == 5 and not list(out.glob(".*.tmp"))
    r = cptsim_here("train", "--resume", out, "--quiet")
    assert r.exit_code == 0, (r.output, r.exception)
    _same_as(run, reference)

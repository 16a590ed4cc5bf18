"""Kill/resume exactness within an exact GEMM path (issue 28's acceptance): a run SIGKILLed mid-epoch and resumed
on the CPU int8 path (CPTSIM_EXACT_GEMM=1: the mlp's hidden Linear layers on torch._int_mm) or on the integer-codes
path (=codes: digits-cnn's convolutions on the integers), or on the GPU tensor-core routes' arithmetic run on a
CPU (=int8: cptsim.numerics.gpu_gemm) ends bit for bit as the same run uninterrupted on that
path, and config.json records the path."""

import signal

import pytest
import torch

from cptsim.run.rundir import RunDir

from shared_runs import cptsim, cptsim_here

ARGS = ["train", "--epochs", "1", "--batch-size", "128", "--quiet", "--checkpoint-every", "3"]  # 12 steps


def _no_time(records):
    return [{k: v for k, v in r.items() if k not in ("time_s", "epoch_time_s", "recal_time_s")} for r in records]


@pytest.mark.slow
@pytest.mark.parametrize("env, model, path", [("1", "mlp", "int8-exact"), ("codes", "digits-cnn", "tf32-int-codes"),
                                               # the tensor-core routes' arithmetic (cptsim.numerics.gpu_gemm) forced
                                               # on a CPU: the convolutions as int8 im2col + _int_mm, dgrad FP16
                                               ("int8", "digits-cnn", "int8-tc-im2col")])
def test_a_killed_run_resumes_exactly_on_its_gemm_path(env, model, path, tmp_path):
    extra = {"CPTSIM_EXACT_GEMM": env}
    ref = tmp_path / "ref"
    r = cptsim_here(*ARGS, "--model", model, "--out", ref, env_extra=extra)
    assert r.exit_code == 0, (r.output, r.exception)
    out = tmp_path / "killed"
    p = cptsim(*ARGS, "--model", model, "--out", out, env_extra={**extra, "CPTSIM_FAULT_KILL_AT_STEP": "8"})
    assert p.returncode == -signal.SIGKILL, p.stderr
    r = cptsim_here("train", "--resume", out, "--quiet", env_extra=extra)
    assert r.exit_code == 0, (r.output, r.exception)
    a, b = RunDir.open(ref), RunDir.open(out)
    layers = a.read_config()["host"]["gemm_paths"]["layers"]
    assert any(v["forward"] == path for v in layers.values())
    assert _no_time(b.read_trace().records) == _no_time(a.read_trace().records)
    wa, wb = a.load_checkpoint()["model"], b.load_checkpoint()["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)

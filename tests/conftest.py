"""Shared test set-up."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """The suite runs small models on 2 shared cores: one intra-op thread is as fast and far steadier (two OpenMP
    threads next to another busy process slow tiny ops down ~10x). Subprocess tests are unaffected."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _one_torch_thread_in_each_test(_one_torch_thread):
    """Back to one thread before every test: an in-process `train` of a larger input (CIFAR-sized and up) sets
    torch's threads to its default (cptsim.run.train.cpu_threads) and leaves them there, so every later test of
    that worker ran on 2 threads (a set of compute-heavy files took 209 s that way with -n 2, 55 s on one)."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _no_automatic_host_measurement():
    """`cptsim report` measures this machine once when no host profile was (cptsim.calibration.autocal): seconds per test and a
    file in the user's profile dir. Tests model with the shipped profile; test_autocal.py turns it back on."""
    import os

    before = os.environ.get("CPTSIM_NO_CALIBRATE")
    os.environ["CPTSIM_NO_CALIBRATE"] = "1"
    yield
    if before is None:
        os.environ.pop("CPTSIM_NO_CALIBRATE", None)
    else:
        os.environ["CPTSIM_NO_CALIBRATE"] = before


@pytest.fixture(autouse=True, scope="session")
def _private_user_state(tmp_path_factory):
    """The suite neither reads nor writes the user's own cptsim state: runs that record themselves (pilots, sweeps)
    go to a private results database, and hardware profiles the user (or an earlier auto-calibration on this
    machine) saved under ~/.config/cptsim are not seen (CI runs on a developer's machine)."""
    import os

    keys = {"CPTSIM_DB": str(tmp_path_factory.mktemp("resultsdb") / "results.db"),
            "CPTSIM_HOME": str(tmp_path_factory.mktemp("cptsim-home"))}
    before = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    yield
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


# Runs that several files check, trained once per session (tests/shared_runs.py has their arguments). Tests copy a
# run before they change it; these stay as made.

@pytest.fixture(scope="session")
def digits_uninterrupted(tmp_path_factory):
    """shared_runs.DIGITS, uninterrupted: the reference of the kill/resume tests (test_checkpoints, test_dist_crash).
    Made in this process: a run resumed in a subprocess must equal it bit for bit."""
    from shared_runs import DIGITS, cptsim_here

    from cptsim.run.rundir import RunDir

    out = tmp_path_factory.mktemp("digits-uninterrupted") / "run"
    r = cptsim_here(*DIGITS, "--out", out)
    assert r.exit_code == 0, (r.output, r.exception)
    return RunDir.open(out)


@pytest.fixture(scope="session")
def digits_killed_at_17(tmp_path_factory):
    """shared_runs.DIGITS SIGKILLed as step 17 began (a real process killed): checkpoints at 12 (end of epoch 0) and
    15 kept, 5 and 10 pruned, the lock file left behind. Tests copy it (shutil.copytree) and never write into it."""
    import signal

    from shared_runs import DIGITS, cptsim

    out = tmp_path_factory.mktemp("digits-killed") / "run"
    r = cptsim(*DIGITS, "--out", out, env_extra={"CPTSIM_FAULT_KILL_AT_STEP": "17"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    return out


@pytest.fixture(scope="session")
def mlp_fp_one_process(tmp_path_factory):
    """shared_runs.MLP_FP in one process: what a 2-rank run must equal (test_dist_crash, test_elastic)."""
    from shared_runs import MLP_FP, cptsim_here

    from cptsim.run.rundir import RunDir

    out = tmp_path_factory.mktemp("mlp-fp-one") / "run"
    r = cptsim_here(*MLP_FP, "--out", out)
    assert r.exit_code == 0, (r.output, r.exception)
    return RunDir.open(out)

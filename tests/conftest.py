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

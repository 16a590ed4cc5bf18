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

"""RunLength counts a run's steps and samples as a DataLoader with drop_last=False feeds them."""

import numpy as np
import pytest

from cptsim.cost.runlength import RunLength


def _fed(N, B, steps):
    # the batches an epoch-by-epoch loader yields, every sample once per epoch, the rest in a short last batch
    sizes = []
    while len(sizes) < steps:
        sizes += [min(B, N - i) for i in range(0, N, B)]
    return np.array(sizes[:steps], dtype=np.int64)


@pytest.mark.parametrize("N, B, steps", [(50_000, 128, 2000), (1000, 100, 35), (7, 3, 10), (5, 8, 4), (1, 1, 3),
                                         (129, 128, 5)])
def test_samples_per_step_are_what_a_loader_feeds(N, B, steps):
    run = RunLength(B, N, steps)
    fed = _fed(N, B, steps)
    assert np.array_equal(run.samples(), fed)
    spe = run.steps_per_epoch
    assert spe == len(range(0, N, B))  # batches in one epoch
    assert run.last_batch == fed[spe - 1]
    short = np.flatnonzero(fed < B)
    assert np.array_equal(run.ragged_steps(), short)
    assert (run.ragged is None) == (short.size == 0 and N % B == 0)
    assert run.epochs == -(-steps // spe) and run.epoch_steps(3) == 3 * spe


def test_without_a_dataset_size_every_batch_is_full():
    run = RunLength(64, None, 10)
    assert run.steps_per_epoch is None and run.ragged is None and run.epochs is None
    assert np.array_equal(run.samples(), np.full(10, 64)) and run.ragged_steps().size == 0
    with pytest.raises(ValueError):
        run.epoch_steps(2)

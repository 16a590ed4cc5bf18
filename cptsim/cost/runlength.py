"""How a run's steps split into batches: steps per epoch and the ragged last batch of every epoch.

A DataLoader with drop_last=False feeds every sample once per epoch: an epoch of N samples in batches of B is
ceil(N / B) steps, the last of which holds the rest, N - (steps_per_epoch - 1)·B (B itself when B divides N). The
cost model, the planner, the report and the training loop all count a run's steps and samples this way; this is
the one place that says how.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["RunLength"]


@dataclass(frozen=True)
class RunLength:
    """``steps`` steps of ``batch_size`` samples over ``dataset_size`` samples per epoch (None: not known, every
    batch full). Integer arithmetic throughout; nothing is validated here (the callers check their inputs)."""

    batch_size: int
    dataset_size: int | None = None
    steps: int | None = None

    @property
    def steps_per_epoch(self) -> int | None:
        """ceil(N / B): the ragged last batch is a step too. None without a dataset size."""
        if self.dataset_size is None:
            return None
        return -(-self.dataset_size // self.batch_size)

    @property
    def last_batch(self) -> int | None:
        """Samples in each epoch's last step: N - (steps_per_epoch - 1)·B. None without a dataset size."""
        spe = self.steps_per_epoch
        return None if spe is None else self.dataset_size - (spe - 1) * self.batch_size

    @property
    def ragged(self) -> tuple[int, int] | None:
        """(steps per epoch, samples in the last batch) when the last batch of an epoch is short, else None."""
        last = self.last_batch
        return None if last is None or last == self.batch_size else (self.steps_per_epoch, last)

    @property
    def epochs(self) -> int | None:
        """The epochs the run's steps reach into, a partial one included: ceil(steps / steps_per_epoch)."""
        spe = self.steps_per_epoch
        return None if spe is None or self.steps is None else -(-self.steps // spe)

    def epoch_steps(self, epochs: int) -> int:
        """The steps of ``epochs`` whole epochs: epochs · steps_per_epoch (a dataset size is needed)."""
        if self.dataset_size is None:
            raise ValueError("steps of whole epochs need the dataset size")
        return epochs * self.steps_per_epoch

    def ragged_steps(self) -> np.ndarray:
        """The steps (0-based, int64) of the run that are an epoch's short last batch; none when every batch is full."""
        rag = self.ragged
        if rag is None:
            return np.zeros(0, dtype=np.int64)
        return np.arange(rag[0] - 1, self._steps(), rag[0], dtype=np.int64)

    def samples(self) -> np.ndarray:
        """Samples per step, int64: the batch, and each epoch's ragged last batch where it is short."""
        n = np.full(self._steps(), self.batch_size, dtype=np.int64)
        rag = self.ragged
        if rag is not None:
            n[rag[0] - 1::rag[0]] = rag[1]
        return n

    def _steps(self) -> int:
        if self.steps is None:
            raise ValueError("the run's steps are not known")
        return self.steps

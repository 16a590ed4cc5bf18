"""Measured GPU energy from NVML's total-energy counter (``nvidia-ml-py``, the optional extra ``cptsim[nvml]``).

``EnergyMeter.read()`` returns the energy the GPU drew since the previous read (or ``start()``) and the average power
over that interval. The training loop starts it where a step's clock starts and reads it right after the step's one
host-device synchronisation, so each trace line carries ``energy_j`` and ``power_w`` for the same interval as its
``time_s``. In one process on a GPU that synchronisation is the wait, during step k+1, for step k's work to end
(``cptsim.run.train.lagged_reads``): the read then falls where the GPU passes from step k to k+1, one read per step
and no synchronisation of its own, and the next interval starts there; after an evaluation or a checkpoint the
meter is started again at the next step. Nothing drawn between steps --
the evaluation, re-estimation and checkpoint between epochs, seconds of it -- lands in a step's energy (it did in
benchmarks/results/gpu_check_H200_run2.txt: an epoch of imagenet-resnet18 steps read 1090 W on a 700 W card). Reading the counter is
a driver call (tens of microseconds), no GPU sync.

The counter (``nvmlDeviceGetTotalEnergyConsumption``, millijoules since the driver loaded; Volta and newer) is
refreshed by the driver every few tens of milliseconds, so one short step's value is coarse -- a step may read 0 and
the next twice its share -- but sums over an epoch are exact. Without NVML, the package, a GPU or the counter,
``for_device`` returns None and the trace has no energy columns.
"""

from __future__ import annotations

import os
import time


def nvml_index(torch_index: int) -> int:
    """NVML numbers all GPUs; torch only the visible ones (CUDA_VISIBLE_DEVICES=2,3 makes torch's 0 NVML's 2)."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if torch_index < len(visible) and visible[torch_index].isdigit():
        return int(visible[torch_index])
    return torch_index


class EnergyMeter:
    """Energy (J) and average power (W) between consecutive reads of one GPU's NVML energy counter."""

    def __init__(self, read_mj, clock=time.perf_counter):
        self._read_mj = read_mj
        self._clock = clock
        self._e = read_mj()
        self._t = clock()

    @classmethod
    def for_device(cls, device: str = "cuda") -> "EnergyMeter | None":
        """A meter for a torch CUDA device, or None where NVML or the energy counter is unavailable."""
        try:
            import pynvml
            import torch

            if not torch.cuda.is_available():
                return None
            index = torch.device(device).index
            index = torch.cuda.current_device() if index is None else index
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index(index))
            return cls(lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        except Exception:  # no pynvml, no driver, or a GPU without the counter (pre-Volta)
            return None

    def start(self) -> None:
        """Begin an interval here: energy drawn before now is not reported by the next ``read``."""
        self._e, self._t = self._read_mj(), self._clock()

    def read(self) -> tuple[float, float]:
        """(energy in J, average power in W) since the previous read (or since the meter was made)."""
        e, t = self._read_mj(), self._clock()
        de = max(e - self._e, 0) * 1e-3  # mJ -> J; the counter never goes back unless the driver reloaded
        dt = t - self._t
        self._e, self._t = e, t
        return round(de, 6), round(de / dt, 3) if dt > 0 else 0.0

"""What a run executed on, as config.json records it (``device``): on CUDA the GPU (name, SMs, clocks, memory,
power limit, driver, CUDA and cuDNN, the TF32 flags) and the profile that describes it; on a CPU its model and the
vector extensions that decide a GEMM's speed.

Why: ``report`` compares a run's measured step times with a model of the hardware that ran them, so it must know
which hardware that was; a profile chosen later by name alone (the user's memory, a directory name) is a guess.
Everything here is read once, at the run's start, and nothing here may fail a run: a value that cannot be read is
left out (NVML missing, a driver without clocks).
"""

from __future__ import annotations

import torch


def _nvml(index: int) -> dict:
    """Clocks, power limit and driver from NVML, where pynvml (nvidia-ml-py) is installed and the driver answers."""
    out: dict = {}
    try:
        import pynvml as nv

        nv.nvmlInit()
    except Exception:
        return out
    try:
        from cptsim.measure.energy import nvml_index

        h = nv.nvmlDeviceGetHandleByIndex(nvml_index(index))
        reads = {
            "driver": lambda: nv.nvmlSystemGetDriverVersion(),
            "sm_clock_max_mhz": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
            "memory_clock_max_mhz": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM),
            "power_limit_w": lambda: nv.nvmlDeviceGetPowerManagementLimit(h) / 1000.0,
        }
        for key, read in reads.items():
            try:
                v = read()
                out[key] = v.decode() if isinstance(v, bytes) else v
            except Exception:
                pass
    except Exception:
        pass
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass
    return out


def cuda_record(device: str) -> dict:
    """The GPU a CUDA run uses and the profile that describes it (``cptsim.cost.hardware.gpus.profile_for``)."""
    from cptsim.cost.hardware.gpus import profile_for

    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    p = torch.cuda.get_device_properties(index)
    rec = {
        "type": "cuda",
        "name": p.name,
        "sm_count": int(p.multi_processor_count),
        "compute_capability": f"{p.major}.{p.minor}",
        "memory_gb": round(p.total_memory / 1e9, 2),
        **_nvml(index),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "tf32": {"torch.backends.cuda.matmul.allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
                 "torch.backends.cudnn.allow_tf32": bool(torch.backends.cudnn.allow_tf32)},
    }
    match = profile_for(p.name)
    rec["profile"], rec["profile_why"] = match["profile"], match["why"]
    return rec


def cpu_record() -> dict:
    """The CPU model and its GEMM-relevant vector extensions (AVX2, AVX-512, VNNI, AMX; Arm's too)."""
    import platform

    from cptsim.numerics.gemm_choice import cpu_signature

    model, ext = cpu_signature()
    return {"type": "cpu", "name": model or platform.processor() or platform.machine(), "extensions": ext}


def device_record(device: str) -> dict:
    """config.json's ``device``: ``cuda_record`` for a CUDA device, ``cpu_record`` otherwise."""
    if str(device).startswith("cuda") and torch.cuda.is_available():
        return cuda_record(device)
    return cpu_record()

"""The GPU kernel model's constants fitted to measured training throughput, and checked on what the fit left out.

One GPU generation's handful of constants (``cptsim.cost.hardware.gpu_kernels``: the tensor-core tier's
large-GEMM efficiency, the shape constants n0 and k0, the NCHW factors, the depthwise rates, the achieved memory
bandwidth) are fitted by least squares on log(predicted / measured) images per second over many networks, each
priced by ``cptsim.cost.estimate`` exactly as ``cptsim cost`` prices it -- never a factor per network. How well
that transfers to networks the fit did not see is measured by leaving one family out at a time (``lofo``).

The data: timm's published RTX 3090 training tables (``benchmarks/data/timm``), profiled once by
``benchmarks/gpu_zoo_profiles.py``; ``benchmarks/bench_gpu_zoo.py --fit`` runs this and prints the TOML lines.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

# What the fit may move, with its bounds. "tier:NAME" is that tier's large-GEMM efficiency.
PARAMS = {
    "tier:fp16": (0.2, 1.0),
    "gemm_n0": (0.0, 512.0),
    "gemm_k0": (0.0, 1024.0),
    "nchw_conv_factor": (0.1, 1.0),
    "nchw_depthwise_factor": (0.05, 1.0),
    "depthwise_efficiency": (0.005, 1.0),
    "depthwise_memory_efficiency": (0.05, 1.0),
    "memory_efficiency": (0.2, 1.0),
    "kernel_overhead_us": (0.0, 50.0),
}


@dataclass
class Row:
    """One measured network: ``img_s`` images per second training at ``batch``, in ``memory_format``."""

    model: str
    family: str
    batch: int
    img_s: float
    channels_last: bool = False


def get(hw, name: str) -> float:
    if name.startswith("tier:"):
        i = hw._tier_names.index(name[5:])
        return float(hw._tier_eff[i])
    return float(hw.calibration.get(name) if hw.calibration.get(name) is not None else hw.kernel_constant(name))


def with_values(hw, values: dict):
    """A copy of GPU profile ``hw`` with these constants (``PARAMS`` names) replaced."""
    out = copy.copy(hw)
    out.calibration = dict(hw.calibration)
    out.params = dict(hw.params)
    out._tier_eff = np.array(hw._tier_eff, dtype=np.float64)
    for name, v in values.items():
        if name.startswith("tier:"):
            out._tier_eff[hw._tier_names.index(name[5:])] = float(v)
        else:
            out.calibration[name] = float(v)
    out._derive_kernel_constants()
    return out


def predicted_img_s(hw, profile, row: Row, schedule: str = "static:16") -> float:
    """Images per second ``cptsim.cost.estimate`` gives for this row (one step at the row's batch)."""
    from cptsim.cost.model import estimate
    from cptsim.cost.schedules import parse_schedule

    prof = copy.copy(profile)
    prof.channels_last = row.channels_last
    c = estimate(prof, parse_schedule(schedule), hw, steps=1, batch_size=row.batch, per_layer=False)
    return row.batch / c.latency_s["total"]


def log_errors(hw, profiles: dict, rows: list[Row]) -> np.ndarray:
    return np.array([np.log(predicted_img_s(hw, profiles[r.model], r) / r.img_s) for r in rows])


def fit(hw, profiles: dict, rows: list[Row], names=tuple(PARAMS), max_nfev: int = 200) -> dict:
    """Least squares on log(predicted / measured) over ``rows``; returns {name: value}."""
    from scipy.optimize import least_squares

    x0 = np.array([get(hw, n) for n in names])
    lo = np.array([PARAMS[n][0] for n in names])
    hi = np.array([PARAMS[n][1] for n in names])
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)

    def resid(x):
        return log_errors(with_values(hw, dict(zip(names, x))), profiles, rows)

    # soft L1: a few rows the model cannot express (an NHWC grouped conv cuDNN ran slowly) do not drag the rest
    res = least_squares(resid, x0, bounds=(lo, hi), x_scale=np.maximum(np.abs(x0), 1e-3), max_nfev=max_nfev,
                        loss="soft_l1", f_scale=0.1)
    return dict(zip(names, (float(v) for v in res.x)))


def lofo(hw, profiles: dict, rows: list[Row], names=tuple(PARAMS), max_nfev: int = 100) -> list[dict]:
    """Leave one family out: fit on the other families, predict this one. One record per row."""
    out = []
    for fam in sorted({r.family for r in rows}):
        train = [r for r in rows if r.family != fam]
        held = [r for r in rows if r.family == fam]
        values = fit(hw, profiles, train, names, max_nfev=max_nfev)
        h = with_values(hw, values)
        for r in held:
            p = predicted_img_s(h, profiles[r.model], r)
            out.append({"model": r.model, "family": fam, "measured": r.img_s, "predicted": p,
                        "error": p / r.img_s - 1.0})
    return out


def error_summary(errors) -> dict:
    """median and 90th percentile of |error|, worst, count and how many within 25%."""
    e = np.abs(np.asarray(errors, dtype=np.float64))
    if e.size == 0:
        return {"n": 0}
    return {"n": int(e.size), "median_abs": float(np.median(e)), "p90_abs": float(np.percentile(e, 90)),
            "worst_abs": float(e.max()), "within_25pct": int((e <= 0.25).sum())}

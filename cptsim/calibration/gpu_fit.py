"""The GPU kernel model's constants fitted to measured training throughput, and checked on what the fit left out.

One GPU generation's handful of constants (``cptsim.cost.hardware.gpu_kernels``: the tensor-core tier's
large-GEMM efficiency, the shape constants n0 and k0, the NCHW factors, the depthwise rates, the achieved memory
bandwidth) are fitted by least squares on log(predicted / measured) images per second over many networks, each
priced by ``cptsim.cost.estimate`` exactly as ``cptsim cost`` prices it -- never a factor per network. How well
that transfers to networks the fit did not see is measured by leaving one family out at a time (``lofo``).

The data: timm's published RTX 3090 training tables (``benchmarks/data/timm``), profiled once by
``benchmarks/gpu/gpu_zoo_profiles.py``; ``benchmarks/gpu/bench_gpu_zoo.py --fit`` runs this and prints the TOML lines.
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
    "norm_memory_efficiency": (0.02, 1.0),
    "nchw_norm_factor": (0.1, 1.0),
    "nchw_norm_elements_per_clock": (0.05, 20.0),
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
            out.calibration[name] = float(v)  # read at each pricing (kernel_constant): nothing to refresh
    return out


def predicted_img_s(hw, profile, row: Row, bits: int = 16) -> float:
    """Images per second of one training step at the row's batch, every layer at ``bits`` (16: AMP), priced by
    the cost model's own per-step function (``cptsim.cost.model._kind_costs``, what ``estimate`` sums; the
    profile's arrays are cached, so a fit evaluates thousands of steps quickly). tests/test_gpu_fit.py checks
    it equals ``estimate``'s."""
    from cptsim.cost.model import _kind_costs

    cache = profile.__dict__.setdefault("_fit_arrays", {})  # on the profile itself: no stale entry can outlive it
    a = cache.get(row.channels_last)
    if a is None:
        a = profile.arrays()
        a.channels_last = row.channels_last
        cache[row.channels_last] = a
    q = np.array([bits])
    _, _, t, _, xt, _ = _kind_costs(a, hw, q, q, np.array([row.batch]))
    total = float(t.sum()) + (float(xt.sum()) if xt is not None else 0.0)
    return row.batch / total


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


# ---------------------------------------------------------------------------------------------------- kernels
# Per-kernel microbenchmarks (benchmarks/gpu/gpu_measure.py's "conv" and "gemm" records on a GPU): each priced by the
# same gpu_kernels.gemm_times the cost model calls, one layer at a time.

def _kernel_case(rec: dict) -> tuple[np.ndarray, bool, float, float, int, str]:
    """(gemm row (5,), is_conv, samples, bytes of one phase, phase index, dtype) of a conv or GEMM record."""
    if "C" in rec:  # a convolution: N x C x H x W -> K channels, R x R kernel
        g = rec["groups"]
        p, q = rec["P"], rec["Q"]
        row = np.array([g, rec["K"] // g, rec["C"] // g * rec["R"] * rec["R"], p * q, 0], dtype=np.float64)
        nbytes = rec["bytes_x"] + rec["bytes_w"] + rec["bytes_y"]
        return row, True, float(rec["N"]), float(nbytes), rec["dtype"]
    row = np.array([1, rec["N"], rec["K"], rec["M"], 0], dtype=np.float64)  # M x K @ K x N, M rows at one sample
    size = {"fp16": 2, "bf16": 2, "tf32": 4, "fp32": 4, "int8": 1}[rec["dtype"]]
    return row, False, 1.0, float(size * (rec["M"] * rec["K"] + rec["K"] * rec["N"] + rec["M"] * rec["N"])), \
        rec["dtype"]


def kernel_rows(measurement: dict, min_us: float = 40.0, dtypes=("fp16",)) -> list[dict]:
    """The conv (fwd, dgrad, wgrad) and GEMM (fwd) timings of a gpu_measure.py result, each at least ``min_us``
    (shorter ones measure the host's dispatch, not the GPU), in ``dtypes``."""
    out = []
    for rec in measurement.get("conv", []):
        if rec.get("dtype") not in dtypes:
            continue
        for i, ph in enumerate(("fwd", "dgrad", "wgrad")):
            ms = rec.get(f"{ph}_ms")
            if ms is not None and ms * 1e3 >= min_us:
                out.append({"rec": rec, "phase": i, "seconds": ms * 1e-3, "channels_last": rec["format"] == "nhwc",
                            "label": f"conv {rec['label']} {rec['format']} {ph}"})
    for rec in measurement.get("gemm", []):
        if rec.get("dtype") in dtypes and rec.get("ms") is not None and rec["ms"] * 1e3 >= min_us:
            out.append({"rec": rec, "phase": 0, "seconds": rec["ms"] * 1e-3, "channels_last": True,
                        "label": f"gemm {rec['M']}x{rec['N']}x{rec['K']} {rec['dtype']}"})
    return out


def kernel_seconds(hw, row: dict) -> float:
    """The cost model's time for one measured kernel (``kernel_rows``) on GPU profile ``hw``: the kernel as a
    one-layer profile priced by ``GPUProfile.shaped_gemm_cost``, the very call ``cptsim.cost.estimate`` makes."""
    from types import SimpleNamespace

    gemm, is_conv, samples, nbytes, dtype = _kernel_case(row["rec"])
    macs = np.zeros((1, 1, 3))
    macs[0, 0, row["phase"]] = gemm[0] * gemm[1] * gemm[2] * gemm[3] * samples
    bits = np.full((1, 1, 3), {"fp16": 16, "bf16": 16, "int8": 8, "tf32": 32, "fp32": 32}[dtype])
    # as PyTorch runs them: a "tf32" record ran with TF32 allowed (fp32_tier), an "fp32" GEMM in strict FP32
    # (the matmul tier), an "fp32" convolution under cuDNN's default TF32
    layer = SimpleNamespace(gemm=gemm[None], is_conv=np.array([is_conv]), channels_last=row["channels_last"],
                            matmul=np.array([dtype == "fp32" and not is_conv]))
    t, _ = hw.shaped_gemm_cost(layer, macs, bits, bits, np.full((1, 1, 3), nbytes), np.array([samples]))
    return float(t[0, 0, row["phase"]])


def fit_kernels(hw, rows: list[dict], names, max_nfev: int = 300) -> dict:
    """Least squares on log(model / measured) kernel time over microbenchmark ``rows``."""
    from scipy.optimize import least_squares

    x0 = np.array([get(hw, n) for n in names])
    lo = np.array([PARAMS[n][0] for n in names])
    hi = np.array([PARAMS[n][1] for n in names])
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)

    def resid(x):
        h = with_values(hw, dict(zip(names, x)))
        return np.array([np.log(kernel_seconds(h, r) / r["seconds"]) for r in rows])

    res = least_squares(resid, x0, bounds=(lo, hi), x_scale=np.maximum(np.abs(x0), 1e-3), max_nfev=max_nfev,
                        loss="soft_l1", f_scale=0.1)
    return dict(zip(names, (float(v) for v in res.x)))

"""Fit a ``host`` profile's calibration to measured training steps (``cptsim report --fit``).

The host model (``HostProfile``, the one ``cost.estimate`` uses) splits a step's time into four terms, each the
step's work at the rate ``cptsim hw calibrate`` measured with microbenchmarks:

    t_c = MACs / matmul rate        t_m = bytes / bandwidth        t_q = quantizer elements / element-wise rate
    t_o = executed layer-phases x layer overhead + the op list's launches x op overhead (a profile that prices the
          step's other ops: cptsim.cost.hardware.host; their bytes join t_m, their random-number and transcendental
          elements t_q)
    step time = t_c / compute_efficiency + t_m / memory_efficiency + t_q · k_q + t_o · k_o

Real training steps do not run at microbenchmark rates (small convolutions reach a fraction of a big GEMM's rate,
small tensors stay in cache, every op pays dispatch overhead), so we fit the four factors -- k_c = 1 /
compute_efficiency, k_m = 1 / memory_efficiency, k_q and k_o -- to the measured ``time_s`` of every step of one or more
runs. The profile format has no element-wise or overhead efficiency, so k_q and k_o are written back into the
numbers themselves (``elementwise_gelem_s`` / k_q, ``layer_overhead_us`` · k_o). ``HostFit.overhead`` reports, as
a diagnostic, how much a further constant per-step term would explain.

The fit (scipy.optimize.least_squares) works on log factors and relative residuals, so a 10 ms step and a 1 s step
weigh the same and the factors stay positive; a robust loss (soft L1 at 10%) keeps warm-up steps and hiccups of a
shared machine from pulling the fit; a weak prior towards 1 (the microbenchmark rate) pins the directions one run
cannot tell apart (one run has at most two distinct step shapes: the full and the ragged batch).

Warm-up steps are left out of the fit and of every measured-vs-modelled comparison (``steady_steps``): on a GPU the
first steps compile the fused quantizers and capture CUDA graphs, seconds each, which no per-step model describes
and which once dominated a short run's total (-77% on a held-out run, benchmarks/results/gpu_check_H200.txt). The
training loop marks them (``"warmup": true`` in the trace); a CUDA run traced before it did loses its first epoch
(its first tenth if it has one epoch). Every result says how many steps it skipped.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cptsim.errors import InputError

TERMS = ("compute", "memory", "elementwise", "layer_overhead")
PRIOR_WEIGHT = 0.01      # residual weight of log(factor): pins only what the steps cannot tell apart
ROBUST_SCALE = 0.10      # soft-L1 scale: steps off by more than ~10% count linearly, not quadratically
FACTOR_BOUND = 1000.0    # factors stay within [1/1000, 1000]


def host_profile(hw) -> "object":
    """A loaded ``host`` profile (name, path or HardwareProfile); InputError for any other kind."""
    from cptsim.cost.hardware import HardwareProfile, load_profile

    prof = hw if isinstance(hw, HardwareProfile) else load_profile(hw)
    if prof.kind != "host":
        raise InputError(f"hardware profile {prof.name!r} is of kind {prof.kind!r}; fitting step times needs a "
                         "host profile (the machine the runs executed on, `cptsim hw calibrate`)")
    return prof


def step_components(profile, records, host) -> np.ndarray:
    """(S, 4) seconds per executed step: t_c, t_m, t_q, t_o at the host's measured rates, before any calibration
    (t_o = executed layer-phases x the measured per-layer-phase overhead).

    ``profile``: the run's LayerProfile (or arrays); ``records``: trace lines (batch_size, bits, grad_bits).
    The same formulas as ``cost.estimate`` (bytes at the host's 32-bit storage, quantizer passes of q, g < 32).
    """
    from cptsim.cost.model import _arrays, _check_bits_array, bytes_moved, quant_elems, storage_bits

    a = _arrays(profile)
    host = host_profile(host)
    if not records:
        return np.zeros((0, len(TERMS)))
    n = np.array([r["batch_size"] for r in records], dtype=np.int64)
    q = _check_bits_array(np.array([r["bits"] for r in records]), "trace bits")
    g = _check_bits_array(np.array([r["grad_bits"] for r in records]), "trace grad_bits")
    keys = np.stack((n, q, g), axis=1)
    kinds, inverse = np.unique(keys, axis=0, return_inverse=True)
    kn, kq, kg = kinds[:, 0], kinds[:, 1], kinds[:, 2]
    macs = a.macs[None] * kn[:, None, None].astype(np.float64)  # (kinds, layers, phases)
    opnd = getattr(a, "operand", None)
    nbytes = bytes_moved(a.numel, a.macs, a.quantized, kq, kg, kn, a.calls, storage_bits(host), opnd)
    elems = quant_elems(a.numel, a.macs, a.quantized, kq, kg, kn, a.calls, opnd)
    # (kinds, layers, phases, terms): the profile's own model
    comp = host.time_components(macs, nbytes, elems, layers=a)
    agg = getattr(a, "aggregation", None)
    if agg is not None and np.any(agg) and hasattr(host, "aggregation_components"):
        # a graph layer's aggregation: a gather's and a scatter's bytes and its own fixed cost, as cost.estimate
        # prices it (HostProfile.aggregation_cost)
        from cptsim.cost.model import aggregation_bytes

        agg_bytes = aggregation_bytes(a.numel, a.macs, a.quantized, kq, kg, kn, a.edges, opnd, storage_bits(host))
        comp = np.where(np.asarray(agg, dtype=bool)[None, :, None, None],
                        host.aggregation_components(agg_bytes), comp)
    per_kind = comp.sum(axis=(1, 2))
    other = host.op_list_components(a, kn) if hasattr(host, "op_list_components") else None
    if other is not None:  # the step's other ops (norms, activations, dropout, the optimizer), as cost.estimate
        per_kind = per_kind + other.sum(axis=1)
    return per_kind[inverse.reshape(-1)]


def profile_factors(host) -> np.ndarray:
    """The factors (k_c, k_m, k_q, k_o) a host profile applies to ``step_components``: its own calibration."""
    return host.factors()


def measured_times(records) -> np.ndarray:
    """Measured seconds per step (the trace's ``time_s``); InputError if a line has none."""
    try:
        t = np.array([float(r["time_s"]) for r in records], dtype=np.float64)
    except (KeyError, TypeError, ValueError):
        raise InputError("a trace line lacks a numeric time_s: this run has no measured step times to fit") from None
    return t


def steady_steps(records: list[dict], device: str = "cpu") -> tuple[np.ndarray, str | None]:
    """Which trace lines a per-step time model describes: a boolean mask (warm-up steps False) and a note saying
    what was left out (None when nothing was). Never leaves out every step."""
    n = len(records)
    keep = np.array([not r.get("warmup") for r in records], dtype=bool)
    why = "marked warm-up in the trace (first CUDA step, compiling, CUDA graph capture)"
    if keep.all() and n and str(device).startswith("cuda") and not any("warmup" in r for r in records):
        epochs = np.array([r.get("epoch", 0) for r in records])
        if len(np.unique(epochs)) > 1:
            keep, why = epochs != epochs.min(), "the first epoch of a CUDA run whose trace does not mark warm-up"
        else:
            k = max(1, n // 10)
            keep, why = np.arange(n) >= k, "the first tenth of a one-epoch CUDA run whose trace does not mark warm-up"
    if not keep.any():
        return np.ones(n, dtype=bool), None
    skipped = int(n - keep.sum())
    return keep, (f"{skipped} warm-up step(s) left out: {why}" if skipped else None)


def run_device(run) -> str:
    """The device a run trained on (its config's settings), 'cpu' if it does not say."""
    try:
        return str((run.read_config().get("settings") or {}).get("device") or "cpu")
    except Exception:
        return "cpu"


@dataclass
class RunSteps:
    """One run's executed steps as the fit sees them: per-step model components and measured times (steady steps
    only: see ``steady_steps``)."""

    label: str
    components: np.ndarray   # (S, 4) seconds, uncalibrated
    measured: np.ndarray     # (S,) seconds
    skipped_warmup: int = 0
    warmup_note: str | None = None
    energy: np.ndarray | None = None  # (S,) measured J per step (NVML, a CUDA run's trace), None when not measured

    @classmethod
    def from_run(cls, run, host, label: str | None = None) -> "RunSteps":
        """From a RunDir (its profile.json and trace), costed on ``host``; warm-up steps left out."""
        steps = run.read_executed().records
        prof = run.read_profile()
        if prof is None or not steps:
            raise InputError(f"{run.path}: no executed steps to fit (empty trace or no profile.json)")
        keep, note = steady_steps(steps, run_device(run))
        steps = [r for r, k in zip(steps, keep) if k]
        energy = None
        if steps and all(r.get("energy_j") is not None for r in steps):
            energy = np.array([float(r["energy_j"]) for r in steps])
        return cls(label or str(run.path), step_components(prof, steps, host), measured_times(steps),
                   int((~keep).sum()), note, energy)


def quality(pred: np.ndarray, meas: np.ndarray) -> dict:
    """Fit figures: R² of per-step times, median |error| % per step, error % of the total.

    R² only means something across steps of different shapes (batch sizes, models): within one run every full
    step costs the same in the model, so the variance left is timing noise and R² sits near 0 (or below) however
    good the fit; read the median step error and the total error there.
    """
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    ss_res = float(((pred - meas) ** 2).sum())
    ss_tot = float(((meas - meas.mean()) ** 2).sum()) if meas.size else 0.0
    ok = meas > 0
    return {
        "steps": int(meas.size),
        "r2": (1.0 - ss_res / ss_tot) if ss_tot > 0 else None,
        "median_abs_step_error_pct": float(np.median(np.abs(pred[ok] / meas[ok] - 1.0)) * 100) if ok.any() else None,
        "measured_s": float(meas.sum()),
        "modelled_s": float(pred.sum()),
        "total_error_pct": float((pred.sum() / meas.sum() - 1.0) * 100) if meas.sum() > 0 else None,
    }


@dataclass
class HostFit:
    """Fitted factors (k_c, k_m, k_q, k_o) on top of ``base``'s measured rates, and how well they fit."""

    base: object
    factors: np.ndarray
    fitted_on: list[str]
    runs: list[dict] = field(default_factory=list)     # quality per fitted run
    overall: dict = field(default_factory=dict)         # quality over every fitted step
    overhead: dict = field(default_factory=dict)        # diagnostic: the same fit plus a constant per-step term
    power_w: float | None = None  # measured: the fitted runs' NVML energy / their step time (None: not measured)

    @property
    def compute_efficiency(self) -> float:
        return float(1.0 / self.factors[0])

    @property
    def memory_efficiency(self) -> float:
        return float(1.0 / self.factors[1])

    @property
    def elementwise_gelem_s(self) -> float:
        return float(self.base.params["elementwise_gelem_s"] / self.factors[2])

    @property
    def layer_overhead_us(self) -> float:
        return float(self.base.params.get("layer_overhead_us", 0.0) * self.factors[3])

    def predict(self, steps: RunSteps) -> np.ndarray:
        return steps.components @ self.factors

    def evaluate(self, steps: RunSteps) -> dict:
        """Quality of this fit on a run (a hold-out run when it was not fitted on), next to the base profile's;
        with measured energy, the modelled energy (fitted power x modelled time) against it too."""
        base = quality(steps.components @ profile_factors(self.base), steps.measured)
        pred = self.predict(steps)
        out = {"run": steps.label, "held_out": steps.label not in self.fitted_on, **quality(pred, steps.measured),
               "base_profile_total_error_pct": base["total_error_pct"],
               "skipped_warmup_steps": steps.skipped_warmup, "warmup_note": steps.warmup_note}
        if steps.energy is not None:
            power = self.power_w if self.power_w is not None else float(self.base.params.get("power_w") or 0.0)
            measured, modelled = float(steps.energy.sum()), power * float(pred.sum())
            out.update({"measured_energy_j": measured, "modelled_energy_j": modelled,
                        "energy_error_pct": (modelled / measured - 1.0) * 100 if measured > 0 else None,
                        "measured_avg_power_w": measured / max(float(steps.measured.sum()), 1e-12)})
        return out

    def to_json(self) -> dict:
        return {
            "base_profile": {"name": self.base.name, "path": self.base.path, "hash": self.base.content_hash,
                             "calibrated": bool(self.base.params.get("calibrated"))},
            "model": "step time = MACs/(matmul rate·compute_efficiency) + bytes/(bandwidth·memory_efficiency) "
                     "+ quantizer elements/elementwise rate + layer-phases·layer overhead",
            "fitted": {"compute_efficiency": self.compute_efficiency, "memory_efficiency": self.memory_efficiency,
                       "elementwise_gelem_s": self.elementwise_gelem_s, "layer_overhead_us": self.layer_overhead_us,
                       "power_w": self.power_w},
            "factors": dict(zip(TERMS, map(float, self.factors))),
            "fitted_on": list(self.fitted_on),
            "fit": self.overall,
            "runs": self.runs,
            "overhead_diagnostic": self.overhead,
        }


def _solve(C: np.ndarray, y: np.ndarray, with_overhead: bool) -> np.ndarray:
    from scipy.optimize import least_squares

    scale = float(np.median(y))
    k = len(TERMS)
    n = k + with_overhead

    def residuals(x):
        pred = C @ np.exp(x[:k]) + (x[k] * scale if with_overhead else 0.0)
        return np.concatenate(((pred - y) / y, PRIOR_WEIGHT * x[:k]))

    lo = np.full(n, -math.log(FACTOR_BOUND))
    hi = np.full(n, math.log(FACTOR_BOUND))
    x0 = np.zeros(n)
    if with_overhead:
        lo[k], hi[k], x0[k] = 0.0, 10.0, 0.1  # in units of the median step time
    res = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=ROBUST_SCALE, x_scale="jac")
    x = res.x.copy()
    if with_overhead:
        x[k] *= scale
    return x


def fit_host(runs: list[RunSteps], base) -> HostFit:
    """Fit (k_c, k_m, k_q, k_o) to every step of ``runs`` on top of the ``base`` host profile's rates."""
    base = host_profile(base)
    if not runs:
        raise InputError("--fit needs at least one run with measured steps")
    C = np.concatenate([r.components for r in runs])
    y = np.concatenate([r.measured for r in runs])
    keep = y > 0
    if keep.sum() < 2:
        raise InputError("--fit needs at least two steps with a measured time > 0")
    C, y = C[keep], y[keep]
    x = _solve(C, y, with_overhead=False)
    k = len(TERMS)
    fit = HostFit(base=base, factors=np.exp(x[:k]), fitted_on=[r.label for r in runs])
    if all(r.energy is not None for r in runs):  # NVML energy on every fitted step: the power training draws
        t = sum(float(r.measured.sum()) for r in runs)
        fit.power_w = sum(float(r.energy.sum()) for r in runs) / t if t > 0 else None
    fit.overall = quality(C @ fit.factors, y)
    fit.runs = [fit.evaluate(r) for r in runs]
    xo = _solve(C, y, with_overhead=True)
    pred_o = C @ np.exp(xo[:k]) + xo[k]
    fit.overhead = {"step_overhead_s": float(xo[k]), "factors": dict(zip(TERMS, map(float, np.exp(xo[:k])))),
                    "share_of_measured_time": float(xo[k] * y.size / y.sum()), **quality(pred_o, y),
                    "note": "not written to the profile: the host kind has no per-step overhead term"}
    return fit


# ------------------------------------------------------------------------------------------------ the profile file


def fitted_profile_toml(fit: HostFit, name: str) -> str:
    """The text of a host profile: the base profile's measured rates with the fitted calibration."""
    from cptsim.cost.hardware import host_profile_text

    base = fit.base
    now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    q = fit.overall
    runs = ", ".join(Path(r).name for r in fit.fitted_on)
    source = (f"calibration fitted by `cptsim report --fit` at {now} from {q['steps']} measured training steps of "
              f"{len(fit.fitted_on)} run(s) ({runs}): R² {q['r2'] if q['r2'] is None else round(q['r2'], 3)}, "
              f"median step error {q['median_abs_step_error_pct']:.1f}%, total error {q['total_error_pct']:+.1f}%; "
              f"elementwise_gelem_s = measured {base.params['elementwise_gelem_s']:g} / {fit.factors[2]:.4g}")
    params = {k: v for k, v in base.params.items() if v is not None}  # an optional key left out stays out
    params["elementwise_gelem_s"] = fit.elementwise_gelem_s
    params["layer_overhead_us"] = fit.layer_overhead_us
    # the op list's terms share the factors of the terms they join (fit.step_components)
    for key in ("rng_gelem_s", "transcendental_gelem_s"):
        if params.get(key):
            params[key] = float(params[key]) / float(fit.factors[2])
    for key in ("op_overhead_us", "conv_overhead_us"):
        if params.get(key):
            params[key] = float(params[key]) * float(fit.factors[3])
    if fit.power_w:
        params["power_w"] = fit.power_w
        source += f"; power_w = NVML energy / time of those steps ({fit.power_w:.4g} W)"
    header = [f"Written by `cptsim report --fit` at {now} from the host profile {base.name!r} ({base.path}).",
              "time = macs / (matmul rate x compute_efficiency) + bytes / (bandwidth x memory_efficiency)",
              "       + quantizer elements / elementwise rate + layer_overhead per executed layer-phase",
              "       (rates measured by `cptsim hw calibrate`; factors, the element-wise rate and the overhead fitted)"]
    return host_profile_text(name, base.description + " (calibration fitted to measured runs)",
                             [*base.sources, source], params,
                             {"compute_efficiency": fit.compute_efficiency,
                              "memory_efficiency": fit.memory_efficiency}, header)


def check_fit_out(path: str | os.PathLike, force: bool = False) -> Path:
    """The path --fit-out names, checked before any work: a .toml file, not there yet unless ``force``."""
    p = Path(path).expanduser()
    if p.suffix != ".toml":
        raise InputError(f"--fit-out must name a .toml file, got {str(path)!r}")
    if p.is_dir():
        raise InputError(f"--fit-out names a directory, not a file: {p}")
    from cptsim.cost.hardware import check_profile_file_name

    check_profile_file_name(p, "--fit-out")
    if p.exists() and not force:
        raise InputError(f"--fit-out {p} already exists; pass --force to replace it")
    if not p.parent.is_dir():
        raise InputError(f"--fit-out: directory {str(p.parent)!r} does not exist")
    return p


def write_fitted_profile(fit: HostFit, path: str | os.PathLike, force: bool = False):
    """Write the fitted profile atomically and read it back through ``load_profile`` (which validates it).

    The profile's name is the file's stem, so a file in the user's profile dir loads by that name.
    """
    from cptsim.cost.hardware import load_profile
    from cptsim.fileio import atomic_write_bytes

    p = check_fit_out(path, force)
    text = fitted_profile_toml(fit, p.stem)
    atomic_write_bytes(p, text.encode("utf-8"))
    return p, load_profile(str(p))

"""A GPU profile's calibration fitted to the measured steps of CUDA runs (``cptsim report --fit`` on GPU runs).

What a run can identify: its steady steps' times per width and its NVML energy. The model that prices them is the
report's (``price_kinds``: each step as it ran, ``cptsim.cost.hardware.gpu_executed``), and the constants fitted are
the ones such steps move -- never the tiers' peak rates, which a datasheet gives:

* ``kernel_overhead_us``: GPU-side time per kernel launched (a graphed small network's step is mostly this);
* ``memory_efficiency``: achieved / peak DRAM bandwidth of the memory-bound kernels and the quantizers' passes;
* ``power_fraction``: busy power / TDP, from the energy the steps took against their modelled busy time.

A fit moves only what its runs identify (``identify``). The time constants are fitted as far as the runs'
distinct step kinds tell them apart: the design -- d log(modelled step time) / d log(constant), one row per run and
step kind, one column per time constant -- has a rank, and only that many constants are fitted (those the steps'
times are most sensitive to first: QR with column pivoting); the others keep the base profile's value, and the fit
says why. One network's steps usually move the launch overhead and the bandwidth together (its fake-quantized
steps are priced alike at every width: rank 1), so one of them is held. ``power_fraction`` is fitted only where a
run measured its energy. Least squares on log(modelled / measured) over the fitted constants: one residual per run
and step kind (the mean step time, weighted by the square root of its step count) and one per run for its energy.

Steps whose trace says the loop did its host work between them (``host_work_between``: a line without the GEMM
route that the overlapping loop records) are left out: their times hold host work the GPU model does not price,
and fitting them folds it into the GPU's constants. A run with no other steps is refused, named. A fit never
writes a host profile for GPU runs, nor a GPU profile for CPU runs.
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cptsim.errors import InputError

PARAMS = {"kernel_overhead_us": (0.0, 100.0), "memory_efficiency": (0.02, 1.0), "power_fraction": (0.02, 1.0)}
TIME_PARAMS = ("kernel_overhead_us", "memory_efficiency")  # what step times move; power_fraction: energy only
# A design direction counts toward the rank when its singular value is at least this share of the largest: a
# condition number above 20 would let a 1% measurement wobble move a constant by 20% or more.
RANK_TOL = 0.05
TF32_KEYS = ("torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32")


def recorded_gpu(cfg: dict) -> dict | None:
    """config.json's ``device`` record of a CUDA run (None: a run written before runs recorded their GPU)."""
    d = cfg.get("device")
    return d if isinstance(d, dict) and d.get("type") == "cuda" else None


def run_route(cfg: dict) -> tuple[str, bool, dict]:
    """(the route the run's quantized GEMMs took, whether its quantizers ran eagerly, its TF32 flags), from what
    config.json recorded (``host.quantizers``, ``host.gemm_paths``, the TF32 flags): the tensor-core routes
    (``native``) or the integer codes where ``host.gemm_paths.exact_gemm`` names them, else fake quantization."""
    from cptsim.cost.hardware.gpu_executed import FAKE_QUANT, INT8_MM, INT_CODES, NATIVE, TF32_CODES

    host = cfg.get("host") or {}
    dev = recorded_gpu(cfg) or {}
    tf32 = {k: host[k] for k in TF32_KEYS if k in host} or dict(dev.get("tf32") or {})
    eager = str(host.get("quantizers", "")).startswith("eager")
    which = (host.get("gemm_paths") or {}).get("exact_gemm")
    route = NATIVE if which == INT8_MM else INT_CODES if which == TF32_CODES else FAKE_QUANT
    return route, eager, tf32


def run_layers(cfg: dict, prof, route: str) -> "TensorCoreLayers | None":
    """The run's layers on the tensor-core routes (``TensorCoreLayers``) where it took them, else None."""
    from cptsim.cost.hardware.gpu_executed import NATIVE

    return TensorCoreLayers(cfg, prof) if route == NATIVE else None


def _recorded(rec: dict, label: str) -> dict | None:
    """A layer's record of its routes at one of gpu_gemm.RECORDED_WIDTHS' labels: the top-level entry holds the
    first, ``widths`` the others."""
    from cptsim.numerics.gpu_gemm import GEMMS, RECORDED_WIDTHS

    got = rec if label == next(iter(RECORDED_WIDTHS)) else (rec.get("widths") or {}).get(label)
    return {k: got[k] for k in GEMMS} if isinstance(got, dict) and all(k in got for k in GEMMS) else None


def _route_args(layer) -> list[tuple[str, int, int]]:
    """The (kind, forward K, dgrad K) that gpu_gemm.route may have been given for a profiled layer: exact where the
    profile records a convolution's geometry; else every kind and dgrad K its type allows (the run's record picks)."""
    from cptsim.numerics.gpu_gemm import FP16_MAX, layer_kind

    gm = layer.gemm or {}
    k_fwd = int(gm.get("k", 0))
    if layer.type == "Linear":
        return [("linear", k_fwd, 0)]
    if layer.type != "Conv2d":
        return []
    groups = int(gm.get("groups", 1))
    cv = layer.conv
    if cv:
        (kh, kw), (sh, sw) = cv["kernel"], cv["stride"]
        (ih, iw), (oh, ow) = cv["in_hw"], cv["out_hw"]
        # unpadded where the output is what no padding gives (a 1x1 kernel's kind depends on it, no other's)
        pad = tuple(0 if o == (i - 1) // s + 1 else 1 for i, o, s in ((ih, oh, sh), (iw, ow, sw)))
        return [(layer_kind((kh, kw), pad, groups), k_fwd, int(cv["out_channels"]) * kh * kw // groups)]
    kinds = ["grouped"] if groups != 1 else ["conv1x1", "conv"]
    return [(k, k_fwd, kd) for k in kinds for kd in (0, FP16_MAX + 1)]


class TensorCoreLayers:
    """Each profiled layer's kind and routes on the tensor-core routes at any step's widths, as the run took them:
    ``cptsim.numerics.gpu_gemm.route`` -- the function the layers decide with -- given the layer's kind and
    reductions and the run's recorded choice (implicit-GEMM kernels on or off), checked against what config.json
    recorded for the layer at gpu_gemm.RECORDED_WIDTHS; a layer the record shows on today's path at every width (an
    attention product, an aggregation) takes the general path. Where the profile cannot tell a layer's kind, the
    candidates that reproduce its record decide; where none does (a run of a cptsim whose rule differed), the
    record's own entry for the width is used."""

    def __init__(self, cfg: dict, prof):
        from cptsim.numerics.gpu_gemm import FAKE, RECORDED_WIDTHS, route

        paths = (cfg.get("host") or {}).get("gemm_paths") or {}
        choice = paths.get("choice") or {}
        self._route = route
        self._opts = {"device": "cuda", "implicit": bool(choice.get("implicit_conv")),
                      "implicit_wgrad": bool(choice.get("implicit_wgrad"))}
        self._widths = RECORDED_WIDTHS
        recorded = paths.get("layers") or {}
        self.layers = []  # per profiled layer: (candidate args, {label: routes}, bias)
        for layer in prof.layers:
            rec = recorded.get(layer.name)
            seen = {label: _recorded(rec, label) for label in RECORDED_WIDTHS} if isinstance(rec, dict) else {}
            seen = {k: v for k, v in seen.items() if v is not None}
            if not seen or all(r == FAKE for v in seen.values() for r in v.values()):
                self.layers.append(None)
                continue
            args = [c for c in _route_args(layer)
                    if all(route(c[0], b, gb, c[1], k_dgrad=c[2], **self._opts) == seen[label]
                           for label, (b, gb) in RECORDED_WIDTHS.items() if label in seen)]
            self.layers.append((args, seen, layer.type == "Linear"))  # (a Linear's bias: nn.Linear's default)
        self._memo: dict = {}

    def at(self, q: int, g: int) -> list:
        """Per profiled layer ``(kind, routes, bias)`` at forward bits ``q`` and gradient bits ``g`` (``(None, None,
        False)``: the general path)."""
        got = self._memo.get((q, g))
        if got is None:
            got = self._memo[(q, g)] = [self._one(x, q, g) for x in self.layers]
        return got

    def _one(self, x, q: int, g: int):
        if x is None:
            return None, None, False
        args, seen, bias = x
        if args:
            kind, k_fwd, k_dgrad = args[0]
            return kind, self._route(kind, q, g, k_fwd, k_dgrad=k_dgrad, **self._opts), bias
        for label, (b, _) in self._widths.items():  # the record's entry for the narrowest width at least q
            if label in seen and q <= b:
                return None, seen[label], bias
        return None, None, False


def host_work_between(row: dict) -> bool:
    """Whether a CUDA trace line's step was timed with the loop's host work between steps: the loop that overlaps
    its host work with the GPU names each step's GEMM route (``path``); a trace line without one comes from a loop
    that did that work between steps, and its time holds it (on an H100 it doubled a graphed resnet20 b128 step)."""
    return "path" not in row


def step_kinds(steps: list[dict]) -> list[tuple[int, int, int]]:
    """The distinct (bits, grad bits, batch size) of trace lines."""
    return sorted({(int(r["bits"]), int(r["grad_bits"]), int(r["batch_size"])) for r in steps})


def price_kinds(prof, kinds, gpu, route: str, eager: bool, tf32: dict, fmap=None, native: bool = True,
                layers: TensorCoreLayers | None = None, cache: dict | None = None) -> dict:
    """{(bits, grad bits, batch): {"time_s", "energy_j", "quantizer_s", "phases_s", "native_time_s",
    "native_energy_j", "native_tiers"}}: one step of each kind on ``gpu``, as it ran (``route``; on the tensor-core
    routes each layer's phases on the routes ``layers`` gives them) and, with ``native``, on the profile's own tiers
    (the fit, which only needs the first, leaves that out). ``quantizer_s``: the quantizer and code passes
    (``gpu_executed.layer_passes``); ``cache``: a dict to keep those passes' counts in across calls (they do not
    depend on the profile's constants)."""
    from cptsim.cost.hardware.gpu_executed import (INT_CODES, NATIVE, fp32_tiers, passes_cost, route_view,
                                                    step_passes, tensor_core_step)
    from cptsim.cost.model import estimate

    arrays = prof.arrays() if cache is None else cache.setdefault("arrays", prof.arrays())
    if route == NATIVE and layers is None:
        raise ValueError("pricing the tensor-core routes needs the run's layers (TensorCoreLayers)")
    tiers_view = fp32_tiers(gpu, tf32)
    quantizers = "eager" if eager else "fused"
    linear = arrays.matmul & (arrays.numel[:, 0] > 0) if arrays.matmul is not None else np.zeros(len(arrays), bool)
    general = [(None, None, bool(b)) for b in linear]  # (a Linear's bias: nn.Linear's default)
    out = {}
    for q, g, n in kinds:
        lay = layers.at(q, g) if route == NATIVE else general
        key = ("passes", route, quantizers, q, g, n)
        counted = None if cache is None else cache.get(key)
        if counted is None:
            counted = step_passes(arrays, lay, q, g, n, quantizers, codes=route == INT_CODES)
            if cache is not None:
                cache[key] = counted
        tq, eq = passes_cost(gpu, *counted)
        if route == NATIVE:
            t, e = tensor_core_step(gpu, arrays, tf32, [x[1] for x in lay], q, g, n)
        else:
            view = route_view(gpu, route, tf32)
            pt, pe, xt, xe = view.price_step(arrays, np.array([32]), np.array([32]), np.array([n]))
            t, e = pt[0].sum(axis=0), pe[0].sum(axis=0)
            if xt is not None:
                t, e = t + xt[0], e + xe[0]
        phases = t + tq
        out[(q, g, n)] = {
            "time_s": float(phases.sum()), "energy_j": float((e + eq).sum()), "quantizer_s": float(tq.sum()),
            "phases_s": {p: float(v) for p, v in zip(("fwd", "dgrad", "wgrad"), phases)},
            "passes_s": {p: float(v) for p, v in zip(("fwd", "dgrad", "wgrad"), tq)},
            "passes_kernels": int(counted[0].sum()),
        }
        if native:
            nat = estimate(prof, [{"step": 0, "batch_size": n, "bits": q, "grad_bits": g}], tiers_view,
                           per_layer=False, formats=fmap)
            tiers = tiers_view.step_tiers([(q, g)])[0]
            out[(q, g, n)].update({
                "native_time_s": float(nat.latency_s["total"]), "native_energy_j": float(nat.energy_j["total"]),
                "native_tiers": {k: tiers[k] for k in ("fwd", "dgrad", "wgrad") if k in tiers}})
    return out


def gpu_profile(hw):
    """A loaded ``gpu`` profile (name, path or HardwareProfile); InputError for any other kind."""
    from cptsim.cost.hardware import HardwareProfile, load_profile

    prof = hw if isinstance(hw, HardwareProfile) else load_profile(hw)
    if prof.kind != "gpu":
        raise InputError(f"hardware profile {prof.name!r} is of kind {prof.kind!r}; CUDA runs' step times are "
                         "fitted to a GPU profile (--host h100, a .toml path, or host-gpu)")
    return prof


@dataclass
class GPURunSteps:
    """One CUDA run's steady steps as the fit sees them: the mean measured time per step kind, the energy."""

    label: str
    prof: object
    kinds: list
    counts: np.ndarray          # steps per kind
    measured: np.ndarray        # mean seconds per step, per kind
    energy: float | None        # NVML joules over the steady steps, None when not measured
    route: str
    eager: bool
    tf32: dict = field(default_factory=dict)
    left_out: int = 0           # steady steps left out: timed with the loop's host work between them
    layers: TensorCoreLayers | None = None  # the tensor-core routes' layers (route "native")
    cache: dict = field(default_factory=dict)  # price_kinds' counts, kept across the fit's evaluations

    @classmethod
    def from_run(cls, run, label: str | None = None) -> "GPURunSteps":
        from cptsim.calibration.fit import measured_times, steady_steps

        cfg = run.read_config()
        steps = run.read_executed().records
        prof = run.read_profile()
        if prof is None or not steps:
            raise InputError(f"{run.path}: no executed steps to fit (empty trace or no profile.json)")
        meas = measured_times(steps)
        keep, _ = steady_steps(steps, "cuda")
        steady = int(keep.sum())
        keep &= np.array([not host_work_between(r) for r in steps], dtype=bool)
        if not keep.any():
            raise InputError(f"{run.path}: its {steady} steady steps were timed with the loop's host work between "
                             "them (its trace names no GEMM route: a cptsim from before the loop overlapped that "
                             "work with the GPU), which the GPU model does not price; fitting them would fold it "
                             "into the GPU's constants -- fit runs trained with this cptsim")
        steps, meas = [r for r, k in zip(steps, keep) if k], meas[keep]
        kinds = step_kinds(steps)
        key = [(int(r["bits"]), int(r["grad_bits"]), int(r["batch_size"])) for r in steps]
        counts = np.array([sum(k == kk for k in key) for kk in kinds], dtype=np.float64)
        mean = np.array([meas[[k == kk for k in key]].mean() for kk in kinds])
        e = [r.get("energy_j") for r in steps]
        energy = float(np.sum(e)) if e and all(x is not None for x in e) and float(np.sum(e)) > 0 else None
        route, eager, tf32 = run_route(cfg)
        layers = run_layers(cfg, prof, route)
        return cls(label or str(run.path), prof, kinds, counts, mean, energy, route, eager, tf32,
                   steady - len(steps), layers)

    def predict(self, gpu) -> tuple[np.ndarray, float]:
        """(modelled seconds per step of each kind, modelled joules of all the steady steps) on ``gpu``."""
        priced = price_kinds(self.prof, self.kinds, gpu, self.route, self.eager, self.tf32, native=False,
                             layers=self.layers, cache=self.cache)
        t = np.array([priced[k]["time_s"] for k in self.kinds])
        e = float(sum(priced[k]["energy_j"] * c for k, c in zip(self.kinds, self.counts)))
        return t, e


def _with(gpu, values: dict):
    from cptsim.calibration.gpu_fit import with_values

    return with_values(gpu, values)


def _base_value(gpu, name: str) -> float:
    v = gpu.calibration.get(name)
    return float(v if v is not None else {"memory_efficiency": 1.0, "power_fraction": 1.0}.get(name, 0.0))


def evaluate(gpu, rs: GPURunSteps) -> dict:
    """How ``gpu`` prices one run's steady steps: total time and energy, errors in %."""
    t, e = rs.predict(gpu)
    meas = float((rs.measured * rs.counts).sum())
    model = float((t * rs.counts).sum())
    per_step = np.abs(t / rs.measured - 1) * 100
    return {"run": rs.label, "steps": int(rs.counts.sum()), "measured_s": meas, "modelled_s": model,
            "error_pct": (model / meas - 1) * 100 if meas > 0 else None,
            "max_abs_width_error_pct": float(per_step.max()) if per_step.size else None,
            "measured_energy_j": rs.energy, "modelled_energy_j": e,
            "energy_error_pct": (e / rs.energy - 1) * 100 if rs.energy else None}


@dataclass
class GPUFit:
    base: object
    values: dict
    fitted_on: list
    runs: list
    before: list
    held: dict = field(default_factory=dict)      # constant -> why it kept the base profile's value
    design: dict = field(default_factory=dict)    # what the runs identify (``identify``)

    def profile(self):
        return _with(self.base, self.values)

    def evaluate(self, rs: GPURunSteps) -> dict:
        return evaluate(self.profile(), rs) | {"unfitted_error_pct": evaluate(self.base, rs)["error_pct"]}

    def to_json(self) -> dict:
        return {"kind": "gpu", "base": {"name": self.base.name, "path": self.base.path, "hash": self.base.content_hash},
                "fitted": {k: v for k, v in self.values.items() if k not in self.held},
                "held": {k: {"value": self.values[k], "why": why} for k, why in self.held.items()},
                "before": {k: _base_value(self.base, k) for k in self.values},
                "design": dict(self.design), "fitted_on": list(self.fitted_on), "runs": self.runs,
                "runs_before": self.before}


def _start(base, names) -> np.ndarray:
    """Where the search starts (and the design is taken): the base's values; a constant the base leaves at 0 (no
    launch overhead) at 5% of its range, since the search runs in log space."""
    x0 = np.array([_base_value(base, n) for n in names])
    lo = np.array([PARAMS[n][0] for n in names])
    hi = np.array([PARAMS[n][1] for n in names])
    return np.clip(np.where(x0 > 0, x0, 0.05 * (lo + hi)), np.maximum(lo, 1e-3), hi)


def time_design(runs: list[GPURunSteps], base, names=TIME_PARAMS, step: float = 0.05) -> np.ndarray:
    """(rows, constants): d log(modelled step time) / d log(constant) at the start values, one row per run and step
    kind (central differences in log space)."""
    x0 = dict(zip(names, _start(base, names)))
    cols = []
    for n in names:
        up, down = (_with(base, x0 | {n: x0[n] * f}) for f in (np.exp(step), np.exp(-step)))
        cols.append(np.concatenate([(np.log(r.predict(up)[0]) - np.log(r.predict(down)[0])) / (2 * step)
                                    for r in runs]))
    return np.stack(cols, axis=1)


def design_rank(d: np.ndarray) -> int:
    """How many independent directions the rows of ``d`` hold (singular values >= RANK_TOL of the largest)."""
    s = np.linalg.svd(d, compute_uv=False)
    return int((s >= RANK_TOL * s[0]).sum()) if s.size and s[0] > 0 else 0


def identify(runs: list[GPURunSteps], base) -> tuple[list[str], dict, dict]:
    """(the constants the runs identify, {held constant: why}, the design's summary): the time constants up to the
    rank of their design (``time_design``), the most sensitive first (QR with column pivoting); ``power_fraction``
    where some run measured its energy."""
    from scipy.linalg import qr

    d = time_design(runs, base)
    rank = design_rank(d)
    kinds = sum(len(r.kinds) for r in runs)
    distinct = len(np.unique(np.round(d, 6), axis=0))
    order = list(qr(d, pivoting=True, mode="r")[1]) if rank else []
    fit = [TIME_PARAMS[i] for i in order[:rank]]
    held = {}
    for n in TIME_PARAMS:
        if n in fit:
            continue
        if not np.any(np.abs(d[:, TIME_PARAMS.index(n)]) > 1e-9):
            held[n] = "the runs' step times do not depend on it"
        else:
            held[n] = (f"the runs' {kinds} step kind(s), {distinct} distinct as the model prices them, identify "
                       f"{rank} of the {len(TIME_PARAMS)} time constants (design rank {rank}); "
                       f"{' and '.join(fit) or 'none'} moves their times most -- runs of another network or batch "
                       "size would tell them apart")
    if any(r.energy for r in runs):
        fit.append("power_fraction")
    else:
        held["power_fraction"] = "no run measured its energy (the trace has no energy_j)"
    return fit, held, {"step_kinds": kinds, "distinct_rows": distinct, "rank": rank,
                       "time_constants": len(TIME_PARAMS), "sensitivity": np.round(d, 4).tolist()}


def fit_gpu(runs: list[GPURunSteps], base) -> GPUFit:
    """Fit ``PARAMS`` of GPU profile ``base`` to ``runs``, as far as they identify them (module docstring)."""
    from scipy.optimize import least_squares

    base = gpu_profile(base)
    if not runs:
        raise InputError("--fit needs at least one run with measured steps")
    names = list(PARAMS)
    fit_names, held, design = identify(runs, base)
    values = {n: _base_value(base, n) for n in names}
    if fit_names:
        x0 = _start(base, fit_names)
        lo = np.log(np.maximum([PARAMS[n][0] for n in fit_names], 1e-3))
        hi = np.log([PARAMS[n][1] for n in fit_names])
        energy = "power_fraction" in fit_names

        def residuals(logx):
            gpu = _with(base, dict(zip(fit_names, np.exp(logx))))
            res = []
            for r in runs:
                t, e = r.predict(gpu)
                res.extend(np.sqrt(r.counts) * np.log(t / r.measured))
                if energy and r.energy:
                    res.append(np.sqrt(r.counts.sum()) * np.log(e / r.energy))
            return np.array(res)

        sol = least_squares(residuals, np.log(x0), bounds=(lo, hi), method="trf", max_nfev=200)
        values.update(zip(fit_names, (float(v) for v in np.exp(sol.x))))
    fit = GPUFit(base, values, [r.label for r in runs], [], [evaluate(base, r) for r in runs], held, design)
    fit.runs = [evaluate(fit.profile(), r) | ({"left_out_steps": r.left_out} if r.left_out else {}) for r in runs]
    return fit


def fitted_gpu_profile_text(fit: GPUFit, name: str) -> str:
    """The fitted profile's text: the base GPU profile's file with the fitted calibration and its provenance."""
    from cptsim.cost.hardware import recalibrated_profile_text

    base = fit.base
    if not base.path or not Path(base.path).is_file():
        raise InputError(f"the GPU profile {base.name!r} has no file to start the fitted profile from")
    now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    runs = ", ".join(Path(r).name for r in fit.fitted_on)
    errs = ", ".join(f"{Path(r['run']).name} {r['error_pct']:+.1f}% time"
                     + (f" {r['energy_error_pct']:+.1f}% energy" if r.get("energy_error_pct") is not None else "")
                     for r in fit.runs)
    source = (f"calibration ({', '.join(f'{k} = {v:.4g}' for k, v in fit.values.items() if k not in fit.held)}) "
              f"fitted by `cptsim report "
              f"--fit` at {now} to the steady steps of {len(fit.fitted_on)} CUDA run(s) ({runs}) from the GPU "
              f"profile {base.name!r}; fitted: {errs}. Identified on these runs' networks only: check it on others "
              "(--holdout) before trusting it on them")
    fitted = [k for k in fit.values if k not in fit.held]
    header = [f"Written by `cptsim report --fit` at {now} from the GPU profile {base.name!r} ({base.path}).",
              f"Only [calibration]'s {', '.join(fitted) or 'nothing'} {'was' if len(fitted) == 1 else 'were'} "
              "fitted; every other number is the base profile's"
              + "".join(f"; {k} held: {why}" for k, why in fit.held.items()) + "."]
    return recalibrated_profile_text(Path(base.path).read_text(), name,
                                     base.description + " (calibration fitted to measured runs)", source,
                                     fit.values, header)


def write_fitted_gpu_profile(fit: GPUFit, path: str | os.PathLike, force: bool = False):
    """Write the fitted GPU profile atomically and read it back (``load_profile`` validates it)."""
    from cptsim.calibration.fit import check_fit_out
    from cptsim.cost.hardware import load_profile
    from cptsim.fileio import atomic_write_bytes

    p = check_fit_out(path, force)
    atomic_write_bytes(p, fitted_gpu_profile_text(fit, p.stem).encode("utf-8"))
    return p, load_profile(str(p))

"""A CUDA run's side of a report: its measured step times and NVML energy against the model of the GPU that ran it.

Which profile: the one config.json's ``device`` names (``cptsim.run.device``: the shipped profile of that GPU, or
``host-gpu.toml`` measured on it), or the one the user names with ``--host``. A run written before runs recorded
their GPU is modelled with cptsim's default GPU target (``DEFAULT_GPU``) and a warning says so; a run from a GPU no
profile describes is refused (one line, exit 2) rather than priced on a guess.

What is compared: the steady steps (warm-up -- the first CUDA step, compiling, graph capture -- left out, as on a
CPU), per width (bits, gradient bits) and per epoch, time and energy. The model prices each step *as it ran*
(``cptsim.cost.hardware.gpu_executed``: fake-quant FP32 on the run's TF32 tiers, the integer codes, or the
tensor-core routes -- each layer's forward, dgrad and wgrad on the route config.json recorded for it, int8, FP16 or
TF32 -- plus the quantizer and code passes each route's code runs), and beside it as the GPU would run the same
widths natively (its int8 / FP16 tiers: ``cptsim cost``'s figure), so that the error is the model's and the gap
between the two is what a native low-precision pipeline would save. The trace times whole steps, so the comparison
is per step; the model's own split into phases is in ``per_width[].modelled_phases_ms``, the passes' share of it in
``modelled_passes_ms`` (and their kernels, ``modelled_pass_kernels``).

The section has the shape of a CPU run's ``host_time`` (the same keys, plots and table), plus ``kind: "gpu"``,
``gpu``, ``ran``, ``per_width`` and the native figures.
"""

from __future__ import annotations

import numpy as np

from cptsim.errors import InputError

from cptsim.calibration.gpu_runfit import (host_work_between, price_kinds, recorded_gpu, run_layers, run_route,
                                          step_kinds)

from .reportbitops import _pct

DEFAULT_GPU = "h100"  # the GPU among report's default targets (report.DEFAULT_TARGETS)


def is_cuda_run(cfg: dict) -> bool:
    return str((cfg.get("settings") or {}).get("device") or "cpu").startswith("cuda")


def gpu_profile_for_run(cfg: dict, host: str | None, run_path) -> tuple[object, str, list[str]]:
    """(the GPU profile modelling a CUDA run, why that one, warnings). ``host``: what the user named (None or
    "host": choose from the run's record). InputError: a named profile that is not a GPU's, a GPU no profile
    describes."""
    from cptsim.cost.hardware import load_profile

    warnings: list[str] = []
    rec = recorded_gpu(cfg)
    if host not in (None, "host"):
        hw = load_profile(host)
        if hw.kind != "gpu":
            raise InputError(f"{run_path} ran on CUDA; --host {host!r} names {_what_profile(hw)}, which cannot "
                             "model the step times a GPU measured: name a GPU profile (--host h100, a .toml path, "
                             "or host-gpu from `cptsim hw calibrate --device cuda`)"
                             + (f"; to price the run on {hw.name!r}, use --hw {host}"
                                if hw.kind != "host" else ""))
        return hw, f"named with --host ({host})", warnings
    if rec is None:
        warnings.append(f"{run_path} does not record which GPU ran it (written before runs recorded their device); "
                        f"modelled as {DEFAULT_GPU}, the default GPU target -- name its profile with --host if "
                        "another GPU ran it")
        return load_profile(DEFAULT_GPU), f"assumed: the default GPU target {DEFAULT_GPU!r}", warnings
    from cptsim.cost.hardware.gpus import profile_for

    match = profile_for(rec.get("name"))  # this machine's host-gpu.toml may describe it, as well as a shipped one
    name = match["profile"] or rec.get("profile")
    if not name:
        raise InputError(f"{run_path} ran on {rec.get('name')!r}, which no GPU profile describes: name one with "
                         "--host (e.g. --host h100), or measure this GPU with `cptsim hw calibrate --device cuda`")
    return load_profile(name), match["why"] if match["profile"] else rec.get("profile_why", ""), warnings


def _what_profile(hw) -> str:
    """What a non-GPU profile describes, in words: an accelerator design (its kind) or a host measured on a CPU."""
    from cptsim.cost.hardware.base import _AcceleratorProfile

    if isinstance(hw, _AcceleratorProfile):
        return f"a {hw.kind} accelerator (a design the cost model prices, not a machine that ran the steps)"
    if hw.kind == "host":
        return ("a host profile (a CPU's step-time model)" if (hw.params.get("device") or "cpu") == "cpu" else
                "a host profile (the host's side of CUDA steps, without the GPU's)")
    return f"a {hw.kind!r} profile, not a GPU's"


def gpu_time(run, cfg: dict, prof, steps: list[dict], host, metrics: list[dict], world: int,
             warnings: list[str], fmap=None) -> dict | None:
    """The ``host_time`` section of a CUDA run, modelled by its GPU's profile (module docstring)."""
    from cptsim.calibration.fit import measured_times, steady_steps
    from cptsim.cost.hardware.gpu_executed import describe_route

    gpu, why, notes_w = gpu_profile_for_run(cfg, host, run.path)
    warnings.extend(notes_w)
    try:
        meas = measured_times(steps)
    except InputError as e:
        warnings.append(f"GPU time not compared: {e}")
        return None
    keep, warmup_note = steady_steps(steps, "cuda")
    with_warmup = {"measured_s": float(meas.sum()),
                   "measured_energy_j": (float(sum(r["energy_j"] for r in steps))
                                         if steps and all(r.get("energy_j") is not None for r in steps) else None)}
    steps, meas = [r for r, k in zip(steps, keep) if k], meas[keep]
    route, eager, tf32 = run_route(cfg)
    priced = price_kinds(prof, step_kinds(steps), gpu, route, eager, tf32, fmap,
                         layers=run_layers(cfg, prof, route))
    key = [(int(r["bits"]), int(r["grad_bits"]), int(r["batch_size"])) for r in steps]
    model_steps = np.array([priced[k]["time_s"] for k in key])
    model_energy = np.array([priced[k]["energy_j"] for k in key])
    native_steps = np.array([priced[k]["native_time_s"] for k in key])
    native_energy = np.array([priced[k]["native_energy_j"] for k in key])
    energy = [r.get("energy_j") for r in steps]
    has_energy = bool(steps) and all(e is not None for e in energy)
    e_meas = np.array(energy, dtype=np.float64) if has_energy else None

    per_width = []
    for q, g in sorted({(k[0], k[1]) for k in key}):
        sel = np.array([(k[0], k[1]) == (q, g) for k in key])
        ms, mo, na = (float(x[sel].mean()) * 1e3 for x in (meas, model_steps, native_steps))
        kinds = [k for k in priced if (k[0], k[1]) == (q, g)]
        first = priced[kinds[0]]
        per_width.append({
            "bits": q, "grad_bits": g, "steps": int(sel.sum()),
            "measured_ms": ms, "measured_median_ms": float(np.median(meas[sel])) * 1e3,
            "modelled_ms": mo, "error_pct": _pct(mo, ms),
            "native_ms": na, "native_error_pct": _pct(na, ms), "native_tiers": first["native_tiers"],
            "modelled_quantizer_ms": first["quantizer_s"] * 1e3,
            "modelled_passes_ms": {p: v * 1e3 for p, v in first["passes_s"].items()},
            "modelled_pass_kernels": first["passes_kernels"],
            "modelled_phases_ms": {p: v * 1e3 for p, v in first["phases_s"].items()},
        })
    epochs = np.array([r["epoch"] for r in steps])
    wall = {m.get("epoch"): m.get("epoch_time_s") for m in metrics}
    per_epoch = []
    for e in np.unique(epochs):
        sel = epochs == e
        ms, mo = float(meas[sel].sum()), float(model_steps[sel].sum())
        row = {"epoch": int(e), "steps": int(sel.sum()), "measured_s": ms, "modelled_s": mo,
               "error_pct": _pct(mo, ms), "epoch_wall_s": wall.get(int(e))}
        if has_energy:
            me, moe = float(e_meas[sel].sum()), float(model_energy[sel].sum())
            row.update({"measured_energy_j": me, "modelled_energy_j": moe, "energy_error_pct": _pct(moe, me)})
        per_epoch.append(row)
    measured, modelled = float(meas.sum()), float(model_steps.sum())
    native = float(native_steps.sum())
    ran = describe_route(route, tf32, eager)
    notes = list(gpu.notes) + ([warmup_note] if warmup_note else [])
    notes.append(f"modelled as it ran: {ran}; natively (the profile's tiers by width, `cptsim cost`'s figure) "
                 f"{native:.4g} s, {_fmt_pct(_pct(native, measured))} vs measured")
    hosted = sum(host_work_between(r) for r in steps)
    if hosted:
        notes.append(f"{hosted} of {len(steps)} compared steps ran with the loop's host work between steps (their "
                     "trace lines name no GEMM route: a cptsim before the loop overlapped it with the GPU): their "
                     "times hold that work too, which the model of the GPU does not -- on an H100 it doubled a "
                     "graphed resnet20 b128 step (8.07 ms against its graph's 4.03 ms replay); `report --fit` leaves "
                     "them out")
    eager_steps = sum(not r.get("graph") for r in steps)
    if eager_steps:
        notes.append(f"{eager_steps} of {len(steps)} compared steps ran without CUDA graphs: the model prices the "
                     "GPU's work, and an eager step of small kernels is bound by the host's dispatch instead")
    if world > 1:
        notes.append(f"the run used {world} processes: measured step times are the parallel wall time, the model "
                     "costs the whole global batch on one GPU")
    energy_doc = {"measured_energy_j": None, "modelled_energy_j": float(model_energy.sum()), "energy_error_pct": None,
                  "energy_note": "not measured: the trace has no energy_j column (cptsim train records it on a CUDA "
                                 "device when NVML is available: pip install 'cptsim[nvml]')"}
    if has_energy:
        me, mo = float(e_meas.sum()), float(model_energy.sum())
        energy_doc = {
            "measured_energy_j": me, "modelled_energy_j": mo, "energy_error_pct": _pct(mo, me),
            "native_energy_j": float(native_energy.sum()), "native_energy_error_pct": _pct(float(native_energy.sum()),
                                                                                         me),
            "measured_avg_power_w": me / max(measured, 1e-12),
            "energy_note": f"measured: NVML total-energy counter of the GPU over the compared steps (it updates "
                           f"every few steps, so per step it comes in lumps; per epoch and in total it holds); "
                           f"modelled: the {gpu.name} profile's busy power x its modelled time, idle power between "
                           f"kernels"}
    rec = recorded_gpu(cfg) or {}
    return {
        "kind": "gpu", "profile": gpu.name, "path": gpu.path, "hash": gpu.content_hash,
        "calibrated": bool(gpu.params.get("calibrated")), "calibration": dict(gpu.calibration),
        "gpu": {"name": rec.get("name"), "profile": gpu.name, "why": why},
        "ran": ran, "route": route,
        "measured_label": "measured on the run's GPU (sum of the trace's step times)",
        "modelled_label": f"modelled by the GPU profile {gpu.name!r}, as it ran: {ran}",
        "measured_s": measured, "modelled_s": modelled, "error_pct": _pct(modelled, measured),
        "native_modelled_s": native, "native_error_pct": _pct(native, measured),
        "median_abs_step_error_pct": float(np.median(np.abs(model_steps[meas > 0] / meas[meas > 0] - 1)) * 100)
        if (meas > 0).any() else None,
        "per_width": per_width, "per_epoch": per_epoch, "notes": notes,
        "warmup_steps_skipped": int((~keep).sum()), "with_warmup": with_warmup,
        **energy_doc,
        "step_measured_s": meas.tolist(), "step_modelled_s": model_steps.tolist(),
    }


def _fmt_pct(x) -> str:
    return "-" if x is None else f"{x:+.1f}%"

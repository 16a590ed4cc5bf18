"""This machine's side of a report: the host profile's modelled step times against the trace's measured ones (per
epoch and in total, energy too on a CUDA run: ``host_time``), and the saving of the run's schedule over static 32 and
static 8, modelled next to measured (``host_saving``). The host profile's time model is the one
``cptsim.calibration.fit`` fits (``report --fit``)."""

from __future__ import annotations

import numpy as np

from cptsim.errors import InputError

from .reportbitops import _pct
from .reportmeasure import _exact_on, measure_host_steps

MEASURED = "measured on this machine (sum of the trace's step times)"


SAVING_NOTE = (
    "saving = 1 - time of the run's schedule / time of the same steps at a static width (static 32: full precision, "
    "no quantizer; static 8: 8-bit forward at the run's gradient bits). Modelled: the host profile's estimate of the "
    "executed steps (cost.estimate, its GEMM tiers as the run's CPTSIM_EXACT_GEMM routed them). Measured: a timing "
    "pass of the run's own model on one batch, the widths alternating, medians (report --measure-host N), and the "
    "run's own step times for its schedule. gap = measured - modelled saving, in points of %. What it means: with "
    "the fake-quant path (CPTSIM_EXACT_GEMM=0, and every GEMM the exact path does not take) every GEMM runs in "
    "FP32 whatever the bits, so a quantized step costs its "
    "quantizer passes on top of an FP32 step -- the saving over static 32 is negative, and over static 8 near 0, "
    "modelled and measured alike; a gap there is the host model's error on the quantizer and per-layer overhead "
    "terms. With the exact path (the CPU default where int8 measured faster here) a Linear layer's forward and wgrad at <= 8 "
    "bits run as int8 _int_mm, the only "
    "place bits change this machine's time: the modelled saving is what the int8 tier's measured rate promises, "
    "and the gap says how much of it the exact path's extra passes (codes, epilogue) and the GEMM shapes the "
    "calibration did not time keep from showing up. Measured on this project's 2-CPU VM "
    "(benchmarks/results/host-saving-modelled-vs-measured.txt): on transformer-lm the exact path runs 62% of the MACs as int8 "
    "and saves 3-6% of an 8-bit step (modelled 0-5%), which stays 1.23-1.33x the FP32 step; on digits-cnn nothing is "
    "int8 (its only Linear layer is the full-precision classifier). On a machine other jobs share, a saving moves by "
    "~10 points from one pass to the next: read the range the pass prints.")


def _at_width(steps: list[dict], bits: int, grad_bits: int | None) -> list[dict]:
    """The trace's steps (batch sizes kept) at a static width; ``grad_bits`` None keeps each step's own."""
    return [{"step": r["step"], "batch_size": r["batch_size"], "bits": bits,
             "grad_bits": r["grad_bits"] if grad_bits is None else grad_bits} for r in steps]


def _saving(t, base) -> float | None:
    return None if t is None or not base else 1.0 - t / base


def host_saving(run_path, cfg: dict, prof, steps: list[dict], host_name, measure: int = 0,
                warnings: list[str] | None = None, timer=None) -> dict | None:
    """The ``host_saving`` section: the run's schedule against static 32 and static 8 on this machine, modelled and
    measured (SAVING_NOTE). None for a run on another device than a CPU, or without a host profile.

    ``measure``: steps per width of the timing pass (``measure_host_steps``); 0 leaves the measured static sides
    out. ``timer``: replaces ``measure_host_steps`` (tests)."""
    from cptsim.calibration.fit import host_profile, measured_times, steady_steps
    from cptsim.cost.model import estimate

    warnings = warnings if warnings is not None else []
    device = str((cfg.get("settings") or {}).get("device") or "cpu")
    if not device.startswith("cpu"):
        return None
    try:
        host = host_profile(host_name)
        meas = measured_times(steps)
    except InputError as e:
        warnings.append(f"host saving not compared: {e}")
        return None
    exact = _exact_on(cfg)
    host = host.with_exact_gemm(exact)
    keep, _ = steady_steps(steps, device)
    kept = [r for r, k in zip(steps, keep) if k]
    meas = meas[keep]
    gb = sorted({int(r["grad_bits"]) for r in kept})
    g8 = min(gb[0], 8) if len(gb) == 1 else None   # static 8 keeps the run's gradient bits (<= 8)
    cases = {"schedule": kept, "static32": _at_width(kept, 32, 32), "static8": _at_width(kept, 8, g8)}
    modelled = {k: float(estimate(prof, v, host, per_layer=False).latency_s["total"]) for k, v in cases.items()}
    widths = sorted({(int(r["bits"]), int(r["grad_bits"])) for r in kept})
    counts = {w: sum(1 for r in kept if (int(r["bits"]), int(r["grad_bits"])) == w) for w in widths}
    per_width_model = {f"{q}/{g}": float(estimate(prof, [r for r in kept if (int(r["bits"]), int(r["grad_bits"]))
                                                         == (q, g)], host, per_layer=False).latency_s["total"])
                       / counts[(q, g)] for q, g in widths}
    int8_share = 0.0
    if host.int8_active:
        from cptsim.cost.hardware.host import host_gemm_tiers

        a = prof.arrays()
        kinds, count = np.unique(np.array([[int(r[k]) for k in ("bits", "grad_bits", "batch_size")] for r in kept]),
                                 axis=0, return_counts=True)
        macs = a.macs[None] * (kinds[:, 2] * count)[:, None, None]
        int8_share = float((macs * host_gemm_tiers(a, kinds[:, 0], kinds[:, 1], kinds[:, 2])).sum()
                           / max(macs.sum(), 1e-300))
    notes = [f"exact int8 GEMMs: {'on' if exact else 'off'} in this run (config.json host.gemm_paths); the host "
             f"profile prices int8 {'where the exact path routed it' if host.int8_active else 'nowhere'}"
             + ("" if host.int8_active or not exact else " (the profile has no int8 rate: `cptsim hw calibrate`)")]
    if cfg.get("settings", {}).get("layer_schedule"):
        notes.append("a per-layer plan: the saving is modelled at the run's global bits per step")
    doc = {
        "profile": host.name, "calibrated": bool(host.params.get("calibrated")), "exact_gemm": exact,
        "int8_priced": host.int8_active, "int8_mac_share": int8_share, "tiers": host.tiers(), "steps": len(kept),
        "static8_grad_bits": g8 if g8 is not None else "the run's own",
        "modelled_s": modelled,
        "modelled_saving": {"vs_static32": _saving(modelled["schedule"], modelled["static32"]),
                            "vs_static8": _saving(modelled["schedule"], modelled["static8"])},
        "modelled_step_s": per_width_model,
        "measured_trace_s": float(meas.sum()),
        "measured": None, "measured_saving": None, "gap_pts": None, "note": SAVING_NOTE, "notes": notes,
    }
    if measure and measure > 0:
        want = list(dict.fromkeys([*widths, (8, g8 if g8 is not None else widths[0][1]), (32, 32)]))
        try:
            raw = (timer or measure_host_steps)(run_path, cfg, want, measure, raw=True)
        except InputError as e:
            warnings.append(f"host saving: no timing pass: {e}")
            raw = None
        if raw:
            import statistics

            med = {w: statistics.median(v) for w, v in raw.items()}
            sched = sum(counts[w] * med[w] for w in widths)
            n = len(kept)
            w8 = want[-2]
            t32, t8 = n * med[(32, 32)], n * med[w8]
            # the saving per round (each round times every width once, close together), then the median over
            # rounds: a machine whose load drifts moves a round's times together, and their ratio much less
            rounds = range(min(len(v) for v in raw.values()))
            per_round = {"vs_static32": [_saving(sum(counts[w] * raw[w][r] for w in widths), n * raw[(32, 32)][r])
                                         for r in rounds],
                         "vs_static8": [_saving(sum(counts[w] * raw[w][r] for w in widths), n * raw[w8][r])
                                        for r in rounds]}
            doc["measured"] = {"steps_per_width": int(measure), "step_s": {f"{q}/{g}": med[(q, g)] for q, g in want},
                               "schedule_s": sched, "static32_s": t32, "static8_s": t8,
                               "trace_over_pass": float(meas.sum()) / sched if sched else None,
                               "saving_of_medians": {"vs_static32": _saving(sched, t32),
                                                     "vs_static8": _saving(sched, t8)},
                               "saving_spread": {k: [min(v), max(v)] for k, v in per_round.items()},
                               "source": "timing pass: one batch of the run's data, the run's model, optimizer and "
                                         "exact-GEMM setting, widths alternating (order reversed every round), "
                                         "2 warm-up rounds; step_s: medians; saving: median over rounds of each "
                                         "round's saving"}
            ms = {k: statistics.median(v) for k, v in per_round.items()}
            doc["measured_saving"] = ms
            doc["gap_pts"] = {k: None if ms[k] is None or doc["modelled_saving"][k] is None
                              else 100.0 * (ms[k] - doc["modelled_saving"][k]) for k in ms}
    else:
        notes.append("measured static sides need a timing pass: `cptsim report RUN --measure-host N`")
    return doc


def _host_time(run, cfg, prof, steps, host_name, metrics, world, warnings) -> dict | None:
    from cptsim.cost.model import estimate
    from cptsim.calibration.fit import host_profile, measured_times, profile_factors, steady_steps, step_components

    try:
        host = host_profile(host_name).with_exact_gemm(_exact_on(cfg))  # the tiers as this run routed its GEMMs
    except InputError as e:
        warnings.append(f"host time not modelled: {e}")
        return None
    try:
        meas = measured_times(steps)
    except InputError as e:
        warnings.append(f"host time not compared: {e}")
        return None
    # Warm-up steps (compiling, CUDA graph capture: seconds each on a GPU) are compared by no per-step model: left
    # out of time and energy alike, and said so (cptsim.calibration.fit.steady_steps)
    keep, warmup_note = steady_steps(steps, (cfg.get("settings") or {}).get("device", "cpu"))
    with_warmup = {"measured_s": float(meas.sum()),
                   "measured_energy_j": (float(sum(r["energy_j"] for r in steps))
                                         if steps and all(r.get("energy_j") is not None for r in steps) else None)}
    steps, meas = [r for r, k in zip(steps, keep) if k], meas[keep]
    if host.int8_active:  # int8 tiers: step_components (what --fit fits) is the FP32 model; cost per step kind
        model_steps = _step_estimates(prof, steps, host)
    else:
        comp = step_components(prof, steps, host)
        model_steps = comp @ profile_factors(host)
    total_model = estimate(prof, steps, host, per_layer=False).latency_s["total"]  # the cost model's own sum
    epochs = np.array([r["epoch"] for r in steps])
    wall = {m.get("epoch"): m.get("epoch_time_s") for m in metrics}
    per_epoch, short = [], []
    for e in np.unique(epochs):
        sel = epochs == e
        ms, mo = float(meas[sel].sum()), float(model_steps[sel].sum())
        w = wall.get(int(e))
        if isinstance(w, (int, float)) and w < ms:
            # An epoch's wall holds its steps, so it cannot be shorter than their sum: this one was timed from a
            # mid-epoch resume on (a cptsim that did not carry the epoch's time in the checkpoint wrote it).
            short.append(int(e))
            w = None
        per_epoch.append({"epoch": int(e), "steps": int(sel.sum()), "measured_s": ms, "modelled_s": mo,
                          "error_pct": _pct(mo, ms), "epoch_wall_s": w})
    energy = _measured_energy(steps, epochs, per_epoch, host, float(total_model))
    notes = list(host.notes) + ([warmup_note] if warmup_note else [])
    if short:
        notes.append(f"epoch {', '.join(map(str, short))}: no wall time: the one recorded is shorter than the "
                     "epoch's step times, so it covers only the steps after a resume (a run trained by an older "
                     "cptsim, whose checkpoints did not carry the epoch's time)")
    run_threads = (cfg.get("host") or {}).get("threads")
    if run_threads and host.params.get("threads") and run_threads != host.params["threads"]:
        notes.append(f"the run used {run_threads} threads, the host profile was measured with "
                     f"{host.params['threads']}")
    device = (cfg.get("settings") or {}).get("device", "cpu")
    if str(device).split(":")[0] != host.params.get("device", "cpu"):
        notes.append(f"the run executed on {device}, the host profile describes {host.params.get('device')}")
    eager = sum(not r.get("graph") for r in steps)
    if str(device).startswith("cuda") and host.params.get("device") == "cuda" and eager:
        notes.append(f"{eager} of {len(steps)} compared steps ran without CUDA graphs (several processes, or "
                     "CPTSIM_CUDA_GRAPHS=0): a CUDA host profile models graph replays, where the GPU's terms add up "
                     "and the host's dispatch is hidden; launched op by op, a small model's step is bound by the "
                     "host's dispatch and takes longer than modelled")
    if world > 1:
        notes.append(f"the run used {world} processes: measured step times are the parallel wall time, the host "
                     "model costs the whole global batch on one process")
    measured = float(meas.sum())
    return {
        "profile": host.name, "path": host.path, "hash": host.content_hash,
        "calibrated": bool(host.params.get("calibrated")),
        "calibration": dict(host.calibration),
        "measured_label": MEASURED, "modelled_label": f"modelled by the host profile {host.name!r}",
        "measured_s": measured, "modelled_s": float(total_model), "error_pct": _pct(float(total_model), measured),
        "median_abs_step_error_pct": float(np.median(np.abs(model_steps[meas > 0] / meas[meas > 0] - 1)) * 100)
        if (meas > 0).any() else None,
        "per_epoch": per_epoch, "notes": notes,
        "warmup_steps_skipped": int((~keep).sum()), "with_warmup": with_warmup,
        **energy,
        "step_measured_s": meas.tolist(), "step_modelled_s": model_steps.tolist(),
    }


def _step_estimates(prof, steps: list[dict], host) -> np.ndarray:
    """The host profile's seconds for each step: ``cost.estimate`` of one step of each (bits, grad bits, batch)."""
    from cptsim.cost.model import estimate

    keys = [(int(r["bits"]), int(r["grad_bits"]), int(r["batch_size"])) for r in steps]
    one = {k: float(estimate(prof, [{"step": 0, "bits": k[0], "grad_bits": k[1], "batch_size": k[2]}], host,
                             per_layer=False).latency_s["total"]) for k in set(keys)}
    return np.array([one[k] for k in keys], dtype=np.float64)


def _measured_energy(steps, epochs, per_epoch, host, total_model_s: float) -> dict:
    """Measured energy (the trace's NVML ``energy_j``, a CUDA run's) against the host profile's modelled energy
    (its power x its modelled time: the run's own GPU when the profile was calibrated on it), in total and per
    epoch (added to ``per_epoch``). The modelled power is one number; what it misses shows up per epoch."""
    power = float(host.params.get("power_w") or 0.0)
    energy = [r.get("energy_j") for r in steps]
    if not steps or any(e is None for e in energy):
        return {"measured_energy_j": None, "modelled_energy_j": power * total_model_s if power else None,
                "energy_error_pct": None,
                "energy_note": "not measured: the trace has no energy_j column (cptsim train records it on a CUDA "
                               "device when NVML is available: pip install 'cptsim[nvml]')"}
    e = np.array(energy, dtype=np.float64)
    for row in per_epoch:
        me = float(e[epochs == row["epoch"]].sum())
        mo = power * row["modelled_s"] if power else None
        row.update({"measured_energy_j": me, "modelled_energy_j": mo, "energy_error_pct": _pct(mo, me)})
    measured, modelled = float(e.sum()), (power * total_model_s if power else None)
    note = (f"measured: NVML total-energy counter of the GPU, per step; modelled: the host profile's "
            f"{power:g} W x its modelled time" if power else
            "measured: NVML; not modelled: the host profile's power is unknown (power_w = 0)")
    return {"measured_energy_j": measured, "modelled_energy_j": modelled, "energy_error_pct": _pct(modelled, measured),
            "measured_avg_power_w": measured / max(float(sum(r["time_s"] for r in steps)), 1e-12),
            "energy_note": note}

"""What a run cost against what was planned, and how far the host estimate was from the measured time.

``build_report(run_dir)`` reads a run directory (through ``cptsim.run.rundir``, the one place that parses its files) and
returns a ``RunReport``: one JSON-able document (``.data``) and the per-step series its plots draw (``.series``).

Sections of ``.data`` (the keys scripts may rely on; extend freely, rename never without bumping REPORT_FORMAT):

    run          what ran: model, dataset, schedule, plan digest, steps done / planned, trace state
    bitops       planned (plan.json's estimate, or the cost model's estimate of a schedule given by hand) vs
                 executed (the trace re-counted by ``cost.estimate``, the same model the planner used), the trace's
                 own per-step counts as a cross-check, the difference in % and the reasons for it
    host_time    the host profile's estimate of the steps' wall time vs the measured step times, per epoch and total
    hardware     energy and latency of the executed steps on each target profile -- MODELLED, not executed there --
                 next to the planned estimate on the same profile, and how sure that profile's times are
                 (``time_validation``: its [validation] against this network's op mix, as ``cost`` prints it)
    layers       the top layers by executed BitOPs, their share, and the bits they ran at
    accuracy     final and best test accuracy at q_max
    host_saving  (a CPU run) the saving of the run's schedule over static 32 and static 8 on this machine,
                 MODELLED by the host profile (its GEMM tiers as the run's exact-GEMM setting routes them) next to
                 the MEASURED one -- the run's own step times, and with ``measure_host`` N a side-by-side timing pass
                 of the run's model at each width -- and the gap between them (``host_saving`` below)

Everything measured comes from this machine's trace (``time_s``, accuracy); everything on other hardware is
modelled. A CUDA run's trace carries the GPU's measured energy (NVML) per step; host_time then compares it, per
epoch and in total, with the host profile's modelled energy (its power x its modelled time).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cptsim.cost.runlength import RunLength
from cptsim.errors import InputError

REPORT_FORMAT = "cptsim.report/1"
AGREE_PCT = 0.5                       # executed vs planned BitOPs of an uninterrupted run of a plan
DEFAULT_TARGETS = ("h100", "bitfusion")
MODELLED = "modelled (not executed on this hardware)"
MEASURED = "measured on this machine (sum of the trace's step times)"
PHASE_KEYS = ("fwd", "dgrad", "wgrad", "total")


@dataclass
class RunReport:
    data: dict
    series: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------ small helpers


def _pct(a: float | None, b: float | None) -> float | None:
    """(a - b) / b in %, None when either is missing or b is 0 (and a is not)."""
    if a is None or b is None:
        return None
    if b == 0:
        return 0.0 if a == 0 else None
    return (a / b - 1.0) * 100.0


def _total(x) -> float | None:
    """A plan's energy / latency: a number, or a per-phase dict with "total"."""
    if isinstance(x, dict):
        x = x.get("total")
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _phases(d: dict | None) -> dict | None:
    if not isinstance(d, dict):
        return None
    out = {k: float(d[k]) for k in PHASE_KEYS if isinstance(d.get(k), (int, float))}
    if "total" not in out and all(k in out for k in PHASE_KEYS[:3]):
        out["total"] = out["fwd"] + out["dgrad"] + out["wgrad"]
    return out


def _bits_range(values) -> str:
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def per_step_bitops(arrays, q, g, n, groups=None) -> np.ndarray:
    """BitOPs of each step (bits q, g and n samples), summed over layers and phases: ``cost.bitops`` per step kind.
    ``groups``: a per-layer run's (group of each layer, forward bits of each group per step) (``layer_groups``, with
    ``q`` the global bits): each layer counted at its own bits (``cost.layer_bitops``)."""
    from cptsim.cost.model import bitops, layer_bitops

    q, g, n = (np.asarray(v, dtype=np.int64) for v in (q, g, n))
    if q.size == 0:
        return np.zeros(0)
    if groups is not None:
        gi, gq = groups
        gq = np.asarray(gq, dtype=np.int64)
        kinds, inverse = np.unique(np.vstack((gq, g, n)), axis=1, return_inverse=True)
        per = np.array([layer_bitops(arrays.macs * int(k[-1]), arrays.quantized, k[:-2][gi], int(k[-2])).sum()
                        for k in kinds.T], dtype=np.float64)
        return per[inverse.reshape(-1)]
    kinds, inverse = np.unique(np.stack((q, g, n), axis=1), axis=0, return_inverse=True)
    per = np.array([bitops(arrays.macs * float(kn), arrays.quantized, kq, kg).sum() for kq, kg, kn in kinds])
    return per[inverse.reshape(-1)]


def layer_groups(names, layers, steps: int, element=None):
    """A per-layer plan (``cptsim.cost.layerplan.ResolvedLayers``) over ``steps`` steps: (the group of each layer of
    ``names`` (L,), the forward bits of each group per step (G, steps), the groups' schedules). Group 0 is the global
    schedule (and every layer no rule moved); ``element`` maps widths to the element bits a number format counts."""
    scheds = [layers.base] + [s for s, _ in layers.groups()]
    at = {s: i for i, s in enumerate(scheds)}
    gi = np.array([at[layers.schedule_of(n)] for n in names], dtype=np.int64)
    gq = np.array([s.bits(steps) for s in scheds], dtype=np.int64)
    return gi, (gq if element is None else element(gq)), scheds


def effective_bits(arrays, gi, gq) -> np.ndarray:
    """Forward bits per step averaged over the quantized layers, each weighted by its forward MACs: what one number
    per step says of a per-layer run (a uniform run: its bits)."""
    m = np.where(arrays.quantized, arrays.macs[:, 0], 0.0)
    w = np.bincount(gi, weights=m, minlength=len(gq))
    return (w / w.sum()) @ gq if w.sum() > 0 else np.asarray(gq[0], dtype=np.float64)


def planned_batches(steps: int, batch: int, dataset_size: int | None) -> np.ndarray:
    """Samples per planned step: ``batch``, and the ragged last batch of each epoch when ``dataset_size`` is known
    (what ``cost.bits_histogram`` models and a DataLoader with drop_last=False feeds)."""
    return RunLength(batch, dataset_size or None, steps).samples()


# ------------------------------------------------------------------------------------------------ the report


def build_report(path, hardware: list[str] | None = None, host: str = "host", top: int = 10,
                 measure_host: int = 0) -> RunReport:
    """Read one run directory and compare what was planned, executed, modelled and measured.

    ``hardware``: target profiles (names or paths) to model the executed run on; default the plan's hardware (if
    any) plus h100 and bitfusion. ``host``: the profile that estimates this machine's wall time.
    ``measure_host``: steps per width of a side-by-side timing pass for ``host_saving`` (0: none).
    """
    from cptsim.cost.model import estimate
    from cptsim.cost.hardware import load_profile
    from cptsim.run.rundir import RunDir
    from cptsim.cost.schedules import Schedule

    run = RunDir.open(path)
    cfg = run.read_config()
    executed = run.read_executed()
    steps = executed.records
    metrics = run.read_metrics()
    plan = run.read_plan()
    prof = run.read_profile()
    warnings: list[str] = []
    if executed.truncated:
        warnings.append(f"{run.path / 'trace.jsonl'}: the last line is cut short (killed mid-write?); reporting "
                        f"the {len(steps)} complete steps before it")
    if metrics.truncated:
        warnings.append(f"{run.path / 'metrics.jsonl'}: the last line is cut short; it is left out")

    settings = cfg.get("settings", {})
    sched = Schedule.from_json(plan["schedule"] if plan else cfg["schedule"])
    run_sched = Schedule.from_json(cfg["schedule"])
    layers = _run_layers(cfg, run_sched)  # a per-layer run: every re-count below costs each layer at its own bits
    w = plan["workload"] if plan else {}
    planned_steps = int(w.get("steps") or cfg["total_steps"])
    batch = int(w.get("batch_size") or settings.get("batch_size"))
    train_size = w.get("dataset_size") or cfg.get("train_size")
    world = int(cfg.get("world_size", 1) or 1)

    info = {
        "path": str(run.path), "name": run.path.name, "model": settings.get("model"),
        "dataset": settings.get("dataset"), "schedule": run_sched.to_text(),
        "plan": ({"digest": (cfg.get("plan") or {}).get("digest"), "schedule": sched.to_text(),
                  "budget": (plan.get("budget") or {}).get("spec"), "hardware": plan["hardware"].get("name")}
                 if plan else None),
        "batch_size": settings.get("batch_size"), "world_size": world,
        "steps_done": len(steps), "total_steps": cfg["total_steps"], "planned_steps": planned_steps,
        "complete": len(steps) >= cfg["total_steps"] and not executed.missing,
        "trace_truncated": executed.truncated, "duplicate_lines": executed.duplicates,
        "missing_steps": len(executed.missing), "epochs_evaluated": len(metrics.records),
        "resume": run.resume_point(),  # the checkpoint `train --resume` would continue from, and any passed over
    }
    # what ran; a run with no step yet: what its schedule will run
    fmap = run_format_map(cfg)
    info["number_format"] = number_format_of(fmap, [r["bits"] for r in steps] or run_sched.bits(cfg["total_steps"]),
                                             [r["grad_bits"] for r in steps] or run_sched.grad_bits(cfg["total_steps"]))
    info["schedule_label"] = schedule_label(info["schedule"], info["number_format"])
    data = {"format": REPORT_FORMAT, "run": info}
    series: dict = {"name": run.path.name}

    accuracy = _accuracy(cfg, metrics.records)
    data["accuracy"] = accuracy
    series["accuracy"] = accuracy
    if not steps or prof is None:
        warnings.append(f"{run.path}: no executed steps recorded yet; nothing to compare")
        for k in ("bitops", "host_time", "hardware", "layers", "host_saving"):
            data[k] = None
        return RunReport(data, series, warnings)

    arrays = prof.arrays()
    q = np.array([r["bits"] for r in steps], dtype=np.int64)
    g = np.array([r["grad_bits"] for r in steps], dtype=np.int64)
    n = np.array([r["batch_size"] for r in steps], dtype=np.int64)
    step_ids = np.array([r["step"] for r in steps], dtype=np.int64)

    # ---- BitOPs: planned vs executed ------------------------------------------------------------------------
    plan_prof = prof
    if plan and isinstance(plan.get("profile"), dict):
        from cptsim.measure.profiler import LayerProfile

        try:
            plan_prof = LayerProfile.from_json(plan["profile"])
        except InputError:
            plan_prof = prof
    if prof.ops is None and plan_prof.ops is not None:
        # The run records per-layer MACs only; the step's other ops (GPU time) depend on the model and input, not on
        # what ran, so the plan's op list costs both sides and executed == planned stays a comparison of the runs.
        prof = dataclasses.replace(prof, ops=plan_prof.ops)
        arrays = prof.arrays()
    if fmap is not None:
        data["number_format"] = cfg["number_format"]
    models_ragged, plan_est = _planned_estimate(plan, plan_prof, sched, planned_steps, batch, train_size,
                                                layers if sched == run_sched else None, formats=fmap)
    exe = estimate(prof, steps, None, layers=layers, layer_steps=planned_steps, formats=fmap)
    trace_sum = _trace_bitops(steps)
    planned = plan_est["bitops"]
    executed_b = exe.bitops
    pq, pg = sched.bits(planned_steps), sched.grad_bits(planned_steps)
    pn = planned_batches(planned_steps, batch, train_size if models_ragged else None)
    # a per-layer run: each layer at its own bits, per step (the plan's layers when the plan's schedule ran)
    elem = None if fmap is None else (lambda b: _element_bits(fmap, b, 0)[0])
    plan_arrays = plan_prof.arrays()
    pgroups = layer_groups(plan_arrays.names, layers, planned_steps, elem) \
        if layers is not None and sched == run_sched else None
    xgroups = layer_groups(arrays.names, layers, planned_steps, elem) if layers is not None else None
    planned_step_bitops = per_step_bitops(plan_arrays, *_element_bits(fmap, pq, pg), pn, pgroups and pgroups[:2])
    if xgroups is not None:  # what each layer ran at the executed steps: the global bits the trace records (group 0)
        xq = np.full((len(xgroups[1]), len(q)), -1, dtype=np.int64)
        ok = (step_ids >= 0) & (step_ids < planned_steps)  # a layer's bits are a function of the step
        xq[:, ok] = xgroups[1][:, step_ids[ok]]
        xq[0] = _element_bits(fmap, q, g)[0]
        xgroups = (xgroups[0], xq, xgroups[2])
    executed_step_bitops = (np.array([sum(r["bitops"].values()) for r in steps], dtype=np.float64)
                            if trace_sum is not None else
                            per_step_bitops(arrays, *_element_bits(fmap, q, g), n, xgroups and xgroups[:2]))
    reasons = _reasons(plan, cfg, sched, run_sched, executed, steps, step_ids, q, g, n, pq, pg, pn, planned_steps,
                       planned_step_bitops, plan_est, models_ragged, prof, plan_prof, batch, train_size)
    diff = {k: _pct(executed_b.get(k), planned.get(k)) for k in PHASE_KEYS}
    check = None
    if trace_sum is not None:
        rel = max(abs(_pct(executed_b[k], trace_sum[k]) or 0.0) for k in PHASE_KEYS)
        check = {"max_diff_pct": rel, "agrees": rel < 1e-6}
        if not check["agrees"]:
            reasons.append(f"the trace's own per-step BitOPs differ from the re-count by up to {rel:.3g}% "
                           "(profile.json is not the MACs the steps executed)")
    within = diff["total"] is not None and abs(diff["total"]) <= AGREE_PCT
    data["bitops"] = {
        "planned": {**planned, "source": plan_est["source"], "steps": planned_steps,
                    "samples": int(pn.sum()), "models_ragged_batch": models_ragged},
        "executed": {**executed_b, "source": "trace.jsonl re-counted with cost.estimate (the planner's cost model)",
                     "steps": exe.steps, "samples": exe.samples, "relative_to_fp32": exe.relative_to_fp32,
                     "relative_to_static": exe.relative_to_static},
        "trace_counted": trace_sum, "trace_check": check, "diff_pct": diff,
        "tolerance_pct": AGREE_PCT, "within_tolerance": within,
        "reasons": reasons or (["executed what was planned"] if within else []),
    }
    series.update(step=step_ids, bits=q, grad_bits=g, executed_bitops=executed_step_bitops,
                  planned_bits=pq, planned_grad_bits=pg, planned_bitops=planned_step_bitops)
    if xgroups is not None:  # the plot draws a per-layer run's bits per layer group and MAC-weighted
        series["layer_bits"] = _layer_bits_series(arrays, xgroups, pgroups, q)

    # ---- host time: modelled vs measured -------------------------------------------------------------------
    data["host_time"] = _host_time(run, cfg, prof, steps, host, metrics.records, world, warnings)
    series["host_time"] = data["host_time"]

    # ---- target hardware: modelled -------------------------------------------------------------------------
    names = list(hardware) if hardware else _default_targets(plan, fmap)
    rows, seen = [], set()
    mix = prof.op_mix()  # how sure each profile's times are for this network: its [validation] against this mix
    for name in names:
        try:
            hw = load_profile(name)
        except InputError as e:
            if hardware:
                raise
            warnings.append(f"target hardware {name!r} skipped: {e}")
            continue
        if (hw.name, hw.content_hash) in seen:  # the plan's hardware by path and again by name
            continue
        seen.add((hw.name, hw.content_hash))
        try:
            c = estimate(prof, steps, hw, per_layer=False, static_bits=sched.q_max, layers=layers,
                         layer_steps=planned_steps, formats=fmap)
        except InputError as e:  # a float run on an integer-only accelerator: one line, as cost says it
            if hardware:
                raise
            warnings.append(f"target hardware {name!r} skipped: {e}")
            continue
        pl, src = None, None
        if plan and hw.name == plan["hardware"].get("name") and hw.content_hash == plan["hardware"].get("hash"):
            pl = {"energy_j": _total(plan["estimate"].get("energy_j")),
                  "latency_s": _total(plan["estimate"].get("latency_s"))}
            src = "plan.json estimate"
        else:
            pc = estimate(plan_prof, sched, hw, steps=planned_steps, batch_size=batch, per_layer=False,
                          dataset_size=train_size if models_ragged else None,
                          layers=layers if sched == run_sched else None, formats=fmap)
            pl = {"energy_j": pc.energy_j["total"], "latency_s": pc.latency_s["total"]}
            src = "cost model estimate of the planned schedule" if plan else "schedule estimate (no plan)"
        ex = {"energy_j": c.energy_j["total"], "latency_s": c.latency_s["total"]}
        rows.append({"name": hw.name, "kind": hw.kind, "label": MODELLED, "planned": {**pl, "source": src},
                     "executed": ex, "diff_pct": {k: _pct(ex[k], pl[k]) for k in ex},
                     "vs_static": c.vs_static, "notes": list(hw.notes),
                     "time_validation": hw.time_validation(mix)})
    data["hardware"] = rows

    # ---- layers ---------------------------------------------------------------------------------------------
    data["layers"] = _layers(exe, prof, q, g, top, xgroups)
    series["layers"] = data["layers"]

    # ---- host saving: modelled vs measured -------------------------------------------------------
    data["host_saving"] = host_saving(run.path, cfg, prof, steps, host, measure_host, warnings)
    return RunReport(data, series, warnings)


# ------------------------------------------------------------------------------------------------ host saving

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
    "(benchmarks/results/issue28-host-saving.txt): on transformer-lm the exact path runs 62% of the MACs as int8 "
    "and saves 3-6% of an 8-bit step (modelled 0-5%), which stays 1.23-1.33x the FP32 step; on digits-cnn nothing is "
    "int8 (its only Linear layer is the full-precision classifier). On a machine other jobs share, a saving moves by "
    "~10 points from one pass to the next: read the range the pass prints.")


def _exact_on(cfg: dict) -> bool:
    """Whether the run trained with the exact int8 GEMMs (config.json host.gemm_paths, cptsim.numerics.exact_gemm)."""
    paths = (cfg.get("host") or {}).get("gemm_paths") or {}
    return paths.get("exact_gemm") == "on"


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


def measure_host_steps(run_path, cfg: dict, widths, n: int, warmup: int = 2, exact_modes=None,
                       raw: bool = False) -> dict:
    """Median seconds of one training step of the run's model at each (bits, grad_bits) in ``widths``: the run's
    config rebuilt (cptsim.run.train.build: model, data, quantizers, number format), one batch of its training data,
    its optimizer, its thread count and its exact-GEMM setting; ``warmup`` + ``n`` rounds, each one step per width,
    the order reversed every round (``raw``: every round's seconds, in round order). ``exact_modes`` (e.g.
    (False, True)): time each width with CPTSIM_EXACT_GEMM at each of these instead of the run's setting, in the
    same rounds; keys are then (bits, grad_bits, mode).
    InputError for what it cannot time (a graph dataset)."""
    import os
    import statistics
    import time

    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    from cptsim.measure.opcount import training_optimizer, zero_grad
    from cptsim.run.config import TrainConfig
    from cptsim.run.train import build, is_graph

    settings = dict(cfg.get("settings") or {})
    settings["device"] = "cpu"
    settings.pop("tensorboard", None)
    tc = TrainConfig.from_dict(settings)
    threads = (cfg.get("host") or {}).get("threads")
    before_threads, before_env = torch.get_num_threads(), os.environ.get("CPTSIM_EXACT_GEMM")
    os.environ["CPTSIM_EXACT_GEMM"] = "1" if _exact_on(cfg) else "0"
    try:
        with torch.random.fork_rng(devices=[]):
            w = build(tc)
            if isinstance(threads, int) and threads >= 1:
                torch.set_num_threads(threads)
            if is_graph(w.train_set):
                raise InputError("the timing pass does not time graph workloads (one graph per step)")
            x, y = next(iter(DataLoader(w.train_set, batch_size=tc.batch_size, shuffle=False)))
            model = w.model
            model.train()
            opt = training_optimizer([p for p in model.parameters() if p.requires_grad], lr=tc.lr * 1e-3,
                                     momentum=tc.momentum, weight_decay=tc.weight_decay,
                                     name=tc.optimizer.strip().lower())
            params = [p for p in model.parameters() if p.requires_grad]
            clip = getattr(model, "cptsim_grad_clip", None)  # as the training loop: LMs clip the gradient norm
            keys = [tuple(wd) for wd in widths] if exact_modes is None else \
                [(*wd, bool(m)) for wd in widths for m in exact_modes]
            times: dict = {k: [] for k in keys}
            order = list(times)
            for r in range(warmup + n):
                for wd in (order if r % 2 == 0 else order[::-1]):
                    if exact_modes is not None:
                        os.environ["CPTSIM_EXACT_GEMM"] = "1" if wd[2] else "0"
                    w.set_all(wd[0], wd[1])
                    t0 = time.perf_counter()
                    zero_grad(opt)
                    loss = F.cross_entropy(model(x), y)
                    loss.backward()
                    if clip:
                        torch.nn.utils.clip_grad_norm_(params, clip)
                    opt.step()
                    dt = time.perf_counter() - t0
                    if r >= warmup:
                        times[wd].append(dt)
    finally:
        torch.set_num_threads(before_threads)
        if before_env is None:
            os.environ.pop("CPTSIM_EXACT_GEMM", None)
        else:
            os.environ["CPTSIM_EXACT_GEMM"] = before_env
    return times if raw else {wd: statistics.median(v) for wd, v in times.items()}


def _accuracy(cfg: dict, metrics: list[dict]) -> dict:
    accs = [(m.get("epoch"), m.get("test_acc")) for m in metrics if isinstance(m.get("test_acc"), (int, float))]
    best = max(accs, key=lambda t: t[1]) if accs else (None, None)
    return {
        "eval_bits": cfg.get("eval_bits"), "final": accs[-1][1] if accs else None, "best": best[1],
        "best_epoch": best[0], "label": f"test accuracy at q_max = {cfg.get('eval_bits')} bits (measured)",
        "epochs": [{k: m.get(k) for k in ("epoch", "step", "test_acc", "test_loss", "train_loss", "train_acc",
                                          "test_ppl", "val_ppl", "test_bpc") if k in m or not k.endswith(("ppl", "bpc"))}
                   for m in metrics],
    } | _perplexity(metrics)


def _perplexity(metrics: list[dict]) -> dict:
    """Language models (cptsim.data.text): test/validation perplexity at q_max, lower is better; {} otherwise."""
    ppl = [(m.get("epoch"), m["test_ppl"]) for m in metrics if isinstance(m.get("test_ppl"), (int, float))]
    if not ppl:
        return {}
    best = min(ppl, key=lambda t: t[1])
    last = metrics[-1]
    return {"perplexity": {"final": ppl[-1][1], "best": best[1], "best_epoch": best[0],
                           "final_val": last.get("val_ppl"), "final_bpc": last.get("test_bpc"),
                           "label": "test perplexity at q_max (measured; lower is better)"}}


def _trace_bitops(steps: list[dict]) -> dict | None:
    """Sum of the trace's own per-step BitOPs (exact integers), or None if its lines carry none."""
    if not all(isinstance(r.get("bitops"), dict) for r in steps):
        return None
    out = {p: float(sum(int(r["bitops"].get(p, 0)) for r in steps)) for p in PHASE_KEYS[:3]}
    out["total"] = out["fwd"] + out["dgrad"] + out["wgrad"]
    return out


def _layer_bits_series(arrays, xgroups, pgroups, q) -> dict:
    """What the plot draws of a per-layer run: per group of layers sharing a schedule its planned bits per step, and
    the MAC-weighted forward bits per step planned and executed (``effective_bits``; executed: the global bits the
    trace records, the other groups at their schedules' bits at the executed steps -- a layer's bits are a function
    of the step, and the loop sets them so). NaN where a step lies beyond the plan."""
    gi, xq, scheds = xgroups
    m = np.where(arrays.quantized, arrays.macs[:, 0], 0.0)
    share = np.bincount(gi, weights=m, minlength=len(scheds)) / (m.sum() or 1.0)
    names = np.asarray(arrays.names)
    groups = []
    for k, s in enumerate(scheds):
        members = [str(x) for x in names[(gi == k) & np.asarray(arrays.quantized, dtype=bool)]]
        if members:
            groups.append({"schedule": s.to_text(), "layers": members, "mac_share": float(share[k]),
                           "global": k == 0, "bits": None if pgroups is None else pgroups[1][k]})
    x_eff = effective_bits(arrays, gi, np.where(xq >= 0, xq, 0)).astype(np.float64)
    x_eff[(xq < 0).any(axis=0)] = np.nan
    return {"groups": groups, "executed_effective": x_eff,
            "planned_effective": None if pgroups is None else effective_bits(arrays, pgroups[0], pgroups[1])}


def _run_layers(cfg: dict, schedule):
    """A per-layer run's plan (config.json "layers", resolved again on its recorded layers), or None."""
    from cptsim.cost.layerplan import layers_of_run

    return layers_of_run(cfg, schedule)


def run_format_map(cfg: dict):
    """The float family a run trained in (config.json "number_format") as a ``FormatMap``, else None
    (integers). Every re-count of the run and of its plan takes it, as the trace's own per-step BitOPs do (element
    bits: an MX step at width 5 ran MXFP6 and counts 6), so executed and planned compare like with like."""
    nf = cfg.get("number_format")
    if not isinstance(nf, dict) or not nf.get("family"):
        return None
    from cptsim.numerics.families import format_map

    return format_map(str(nf["family"]), nf.get("grad_format"))


def number_format_of(fmap, q, g) -> dict | None:
    """How a float-format run is named and what its numbers count (None for integers, where a width is its own
    format and the bits BitOPs count). ``q`` / ``g``: the forward / gradient widths the run took.

    A schedule's widths are nominal: the family runs each in one of its formats (MX at width 5 runs MXFP6), and
    BitOPs count that format's element bits. ``label`` names the formats ("fp8e4m3", "mxfp4/mxfp6/mxfp8, gradients
    fp8e5m2"); ``bitops_count`` says, width by width, which format ran and the element bits BitOPs counted for it."""
    if fmap is None:
        return None
    q = np.asarray(q, dtype=np.int64)
    g = np.asarray(g, dtype=np.int64)
    used = fmap.used(q, g)
    fwd = list(dict.fromkeys(used["forward"].values()))
    grad = list(dict.fromkeys(used["gradient"].values()))
    label = "/".join(fwd) + ("" if grad == fwd else f", gradients {'/'.join(grad)}")
    counts = [f"width {w} ran {n} ({fmap.fwd_element_bits[w]:g} element bits)" for w, n in used["forward"].items()]
    counts += [f"gradient width {w} ran {n} ({fmap.grad_element_bits[w]:g} element bits)"
               for w, n in used["gradient"].items() if grad != fwd]
    return {"family": fmap.family, "grad_format": fmap.grad_format, "label": label,
            "forward": {str(w): n for w, n in used["forward"].items()},
            "gradient": {str(w): n for w, n in used["gradient"].items()},
            "mean_nominal_bits": float(q.mean()) if q.size else None,
            "mean_element_bits": float(np.asarray(fmap.fwd_element_bits)[q].mean()) if q.size else None,
            "bitops_count": "BitOPs count each operand at its format's element bits: " + ", ".join(counts)
                            + "; 'bits' are the schedule's nominal widths"}


def schedule_label(schedule_text: str, fmt: dict | None) -> str:
    """A run's schedule as people read it: the text form, and for a float-format run the formats it ran in (the
    text form alone reads as integers: an FP8 run would be "static:8:g8")."""
    return schedule_text if fmt is None else f"{schedule_text} in {fmt['label']}"


def _element_bits(fmap, q, g):
    """The widths ``q`` / ``g`` as the element bits their formats count (unchanged without a float family)."""
    if fmap is None:
        return q, g
    return (np.asarray(fmap.fwd_element_bits)[np.asarray(q, dtype=int)],
            np.asarray(fmap.grad_element_bits)[np.asarray(g, dtype=int)])


def _planned_estimate(plan, plan_prof, sched, steps, batch, train_size, layers=None, formats=None
                      ) -> tuple[bool, dict]:
    """(whether the plan modelled the ragged last batch, the planned BitOPs and where they come from)."""
    from cptsim.cost.model import estimate

    def est(ds):
        return estimate(plan_prof, sched, None, steps=steps, batch_size=batch, dataset_size=ds, per_layer=False,
                        layers=layers, formats=formats)

    ragged = est(train_size) if train_size else None
    if not plan:
        c = ragged or est(None)
        return ragged is not None, {"bitops": dict(c.bitops), "source": "schedule estimate (no plan)",
                                    "reestimate_total": c.bitops["total"]}
    stored = _phases(plan["estimate"].get("bitops")) or {}
    flat = est(None)
    # The plan says whether it modelled the ragged batch only through its numbers: take the model that gives them.
    cands = [(True, ragged), (False, flat)] if ragged is not None else [(False, flat)]
    target = stored.get("total")
    if target:
        models_ragged, best = min(cands, key=lambda c: abs(c[1].bitops["total"] - target))
    else:
        models_ragged, best = cands[0]
    planned = {k: stored.get(k, best.bitops[k]) for k in PHASE_KEYS}
    return models_ragged, {"bitops": planned, "source": "plan.json estimate", "reestimate_total": best.bitops["total"]}


def _reasons(plan, cfg, sched, run_sched, executed, steps, step_ids, q, g, n, pq, pg, pn, planned_steps,
             planned_step_bitops, plan_est, models_ragged, prof, plan_prof, batch, train_size) -> list[str]:
    """Why executed and planned BitOPs differ, one sentence each."""
    out = []
    planned_total = float(planned_step_bitops.sum())
    if not plan:
        out.append("no plan: the schedule was given by hand; 'planned' is the cost model's estimate of that "
                   f"schedule ({run_sched.to_text()}) over the configured {planned_steps} steps")
    else:
        if run_sched.to_text() != sched.to_text():
            out.append(f"the run executed schedule {run_sched.to_text()}, the plan chose {sched.to_text()}")
        rt = plan_est["reestimate_total"]
        stored = plan_est["bitops"].get("total")
        if stored and abs(rt / stored - 1) > 1e-6:
            out.append(f"the plan's stored estimate differs from this cptsim's cost model by "
                       f"{_pct(stored, rt):+.3g}% (planned by another version, or the plan's numbers were edited)")
        pa, ra = plan_prof.arrays(), prof.arrays()
        pm, rm = float(pa.macs.sum()), float(ra.macs.sum())
        if pm and abs(rm / pm - 1) > 1e-9:
            out.append(f"the run's measured MACs per sample differ from the plan's profile by {_pct(rm, pm):+.3g}% "
                       "(a different model, input shape or full-precision layers)")
    done = len(steps)
    if executed.truncated:
        out.append(f"the trace's last line is cut short (killed mid-write); {done} complete steps are counted")
    if executed.duplicates:
        out.append(f"{executed.duplicates} repeated step line(s) (a resume that re-ran steps): each step is counted "
                   "once, the last time it ran")
    if executed.missing:
        m = executed.missing
        out.append(f"{len(m)} step(s) missing from the trace (first: {m[:5]}): not counted")
    last = int(step_ids.max()) + 1 if done else 0
    if last < planned_steps:
        rest = float(planned_step_bitops[last:].sum())
        out.append(f"stopped early: {done} of {planned_steps} planned steps executed; the {planned_steps - last} "
                   f"steps not run hold {100 * rest / planned_total:.3g}% of the planned BitOPs"
                   if planned_total else f"stopped early: {done} of {planned_steps} planned steps executed")
    elif last > planned_steps:
        out.append(f"ran {last - planned_steps} steps more than the {planned_steps} planned")
    inside = step_ids < planned_steps
    idx = step_ids[inside]
    if idx.size:
        bits_off = int(((q[inside] != pq[idx]) | (g[inside] != pg[idx])).sum())
        if bits_off:
            out.append(f"{bits_off} executed step(s) ran at other bits than planned for that step")
        dn = n[inside] - pn[idx]
        if (dn != 0).any():
            small = int((dn < 0).sum())
            last = RunLength(batch, train_size).last_batch if train_size else None
            ragged_like = (not models_ragged and small and train_size
                           and set(n[inside][dn < 0].tolist()) <= {last})
            if ragged_like:
                out.append(f"ragged last batch not modelled by the plan: {small} step(s) ran "
                           f"{last} samples, not {batch} "
                           f"({int(dn.sum()):+d} samples)")
            else:
                out.append(f"{int((dn != 0).sum())} step(s) ran another number of samples than planned "
                           f"({int(dn.sum()):+d} samples in all; global batch {batch} planned)")
    return out


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


def _default_targets(plan, fmap=None) -> list[str]:
    """The plan's hardware, then DEFAULT_TARGETS less those that cannot run the run's number format (an
    integer-only accelerator for a float run): a default the report would only skip, with a warning, is no default."""
    from cptsim.cost.hardware import load_profile

    names = []
    if plan:
        hw = plan["hardware"]
        p = hw.get("path")
        names.append(p if p and Path(p).is_file() else hw["name"])
    for name in DEFAULT_TARGETS:
        if fmap is not None:
            try:
                load_profile(name).with_formats(fmap)
            except InputError:
                continue
        names.append(name)
    return names


def _layers(exe, prof, q, g, top: int, groups=None) -> dict:
    rows = sorted(exe.per_layer, key=lambda r: -r["bitops"]["total"])
    total = exe.bitops["total"] or 1.0
    macs_total = exe.macs["total"] or 1.0
    types = {r.name: r.type for r in prof.layers}
    qb, gb = _bits_range(q.tolist()), _bits_range(g.tolist())
    own = {}
    if groups is not None:  # a per-layer run: each layer's own bits at the executed steps
        gi, gq, _ = groups
        ranges = [_bits_range(b[b >= 0].tolist()) if (b >= 0).any() else qb for b in gq]
        own = {n: ranges[gi[i]] for i, n in enumerate(prof.arrays().names)}

    def row(r):
        return {"name": r["name"], "type": types.get(r["name"]), "quantized": r["quantized"],
                "bits": own.get(r["name"], qb) if r["quantized"] else "32",
                "grad_bits": gb if r["quantized"] else "32",
                "bitops": r["bitops"]["total"], "share": r["bitops"]["total"] / total,
                "macs": r["macs"]["total"], "macs_share": r["macs"]["total"] / macs_total}

    shown = [row(r) for r in rows[:max(top, 0)]]
    rest = rows[max(top, 0):]
    other = None
    if rest:
        b = sum(r["bitops"]["total"] for r in rest)
        other = {"layers": len(rest), "bitops": b, "share": b / total}
    return {"count": len(rows), "top": shown, "other": other}


# ------------------------------------------------------------------------------------------------ several runs


def compare(reports: list[RunReport]) -> list[dict]:
    """One row per run: what it cost (executed BitOPs, measured host time) and the accuracy it reached."""
    rows = []
    for r in reports:
        d = r.data
        b, h, a, run = d.get("bitops"), d.get("host_time"), d["accuracy"], d["run"]
        rows.append({
            "run": run["name"], "path": run["path"], "model": run["model"], "dataset": run["dataset"],
            "schedule": run["schedule"], "steps_done": run["steps_done"], "total_steps": run["total_steps"],
            "number_format": (run.get("number_format") or {}).get("label", "int"),
            "schedule_label": run.get("schedule_label", run["schedule"]),
            "executed_bitops": b["executed"]["total"] if b else None,
            "relative_to_static": b["executed"]["relative_to_static"] if b else None,
            "relative_to_fp32": b["executed"]["relative_to_fp32"] if b else None,
            "measured_time_s": h["measured_s"] if h else None,
            "final_acc": a["final"], "best_acc": a["best"], "eval_bits": a["eval_bits"],
        })
    return rows


def to_json(report: RunReport, include_steps: bool = False) -> dict:
    """The report document; per-step host times only with ``include_steps`` (they are long)."""
    d = dict(report.data)
    h = d.get("host_time")
    if h and not include_steps:
        d["host_time"] = {k: v for k, v in h.items() if not k.startswith("step_")}
    d["warnings"] = list(report.warnings)
    return d

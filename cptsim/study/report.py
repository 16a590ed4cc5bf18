"""What a run cost against what was planned, and how far the host estimate was from the measured time.

``build_report(run_dir)`` reads a run directory (through ``cptsim.run.rundir``, the one place that parses its files) and
returns a ``RunReport``: one JSON-able document (``.data``) and the per-step series its plots draw (``.series``).

Sections of ``.data`` (the keys scripts may rely on; extend freely, rename never without bumping REPORT_FORMAT):

    run          what ran: model, dataset, schedule, plan digest, steps done / planned, trace state
    baseline     what every saving is measured against: {"bits", "grad_bits" (None: each step's own), "label",
                 "source"} -- the plan's baseline for a run of a plan (config.json records it), so the report's
                 saving is the one the plan promised; static q_max of the run's schedule without a plan
    bitops       planned (plan.json's estimate, or the cost model's estimate of a schedule given by hand) vs
                 executed (the trace re-counted by ``cost.estimate``, the same model the planner used), the trace's
                 own per-step counts as a cross-check, the difference in % and the reasons for it
    host_time    the host profile's estimate of the steps' wall time vs the measured step times, per epoch and total;
                 on a CUDA run the model of its GPU instead, per width too, as it ran and natively (``reportgpu``)
    hardware     energy and latency of the executed steps on each target profile -- MODELLED, not executed there --
                 next to the planned estimate on the same profile, both savings against the baseline (vs_static,
                 planned_vs_static), and how sure that profile's times are (``time_validation``: its [validation]
                 against this network's op mix, as ``cost`` prints it). The row of the GPU a CUDA run ran on holds
                 what executed: "executed" is its measurement over every step, "modelled_as_ran" and
                 "modelled_natively" the model's two figures
    layers       the top layers by executed BitOPs, their share, and the bits they ran at
    accuracy     final and best test accuracy at q_max
    host_saving  (a CPU run) the saving of the run's schedule over static 32 and static 8 on this machine,
                 MODELLED by the host profile (its GEMM tiers as the run's exact-GEMM setting routes them) next to
                 the MEASURED one -- the run's own step times, and with ``measure_host`` N a side-by-side timing pass
                 of the run's model at each width -- and the gap between them (``host_saving`` below)

One module per stage: ``reportbitops`` (planned vs executed BitOPs), ``reporthost`` (host time and saving, modelled
vs measured), ``reportmeasure`` (the timing pass through ``cptsim.run.train``), ``reportformat`` (a float run's
formats); this module reads the run directory, models the target hardware and assembles the document. Their public
names are importable from here.

Everything measured comes from this machine's trace (``time_s``, accuracy); everything on other hardware is
modelled. A CUDA run's trace carries the GPU's measured energy (NVML) per step; host_time then compares it, per
epoch and in total, with the host profile's modelled energy (its power x its modelled time).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cptsim.errors import InputError

from .reportbitops import (PHASE_KEYS, _layer_bits_series, _layers, _pct, _planned_estimate, _reasons, _trace_bitops,
                           effective_bits, layer_groups, per_step_bitops, planned_batches)
from .reportformat import _element_bits, number_format_of, run_format_map, schedule_label
from .reporthost import MEASURED, SAVING_NOTE, _host_time, host_saving
from .reportgpu import gpu_time, is_cuda_run
from .reportmeasure import _exact_on, measure_host_steps  # noqa: F401 - _exact_on: scripts import it from here

REPORT_FORMAT = "cptsim.report/1"
AGREE_PCT = 0.5                       # executed vs planned BitOPs of an uninterrupted run of a plan
DEFAULT_TARGETS = ("h100", "bitfusion")
MODELLED = "modelled (not executed on this hardware)"
EXECUTED = "executed: the run's GPU; executed holds its measurement, modelled_as_ran and modelled_natively the model"

__all__ = [
    "AGREE_PCT", "DEFAULT_TARGETS", "EXECUTED", "MEASURED", "MODELLED", "PHASE_KEYS", "REPORT_FORMAT", "SAVING_NOTE", "RunReport",
    "build_report", "compare", "recorded_baseline", "effective_bits", "host_saving", "layer_groups", "measure_host_steps",
    "number_format_of", "per_step_bitops", "planned_batches", "run_format_map", "schedule_label", "to_json",
]


@dataclass
class RunReport:
    data: dict
    series: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def _total(x) -> float | None:
    """A plan's energy / latency: a number, or a per-phase dict with "total"."""
    if isinstance(x, dict):
        x = x.get("total")
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


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
    base = recorded_baseline(cfg, plan, run_sched)
    data["baseline"] = base
    exe = estimate(prof, steps, None, layers=layers, layer_steps=planned_steps, formats=fmap,
                   static_bits=base["bits"], static_grad_bits=base["grad_bits"])
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

    # ---- host time: modelled vs measured (a CUDA run: its GPU's profile) ------------------------------------
    if _gpu_modelled(cfg, host, run.path):
        data["host_time"] = gpu_time(run, cfg, prof, steps, host, metrics.records, world, warnings, fmap)
    else:
        data["host_time"] = _host_time(run, cfg, prof, steps, host, metrics.records, world, warnings)
    series["host_time"] = data["host_time"]
    ran_on = data["host_time"] if (data["host_time"] or {}).get("kind") == "gpu" else None

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
            c = estimate(prof, steps, hw, per_layer=False, static_bits=base["bits"],
                         static_grad_bits=base["grad_bits"], layers=layers, layer_steps=planned_steps, formats=fmap)
        except InputError as e:  # a float run on an integer-only accelerator: one line, as cost says it
            if hardware:
                raise
            warnings.append(f"target hardware {name!r} skipped: {e}")
            continue
        pl, src, pvs = None, None, None
        if plan and hw.name == plan["hardware"].get("name") and hw.content_hash == plan["hardware"].get("hash"):
            pl = {"energy_j": _total(plan["estimate"].get("energy_j")),
                  "latency_s": _total(plan["estimate"].get("latency_s"))}
            src = "plan.json estimate"
            pvs = _plan_vs_baseline(plan, base)
        if pvs is None:
            pc = estimate(plan_prof, sched, hw, steps=planned_steps, batch_size=batch, per_layer=False,
                          dataset_size=train_size if models_ragged else None,
                          layers=layers if sched == run_sched else None, formats=fmap,
                          static_bits=base["bits"], static_grad_bits=base["grad_bits"])
            pvs = pc.vs_static
            if pl is None:
                pl = {"energy_j": pc.energy_j["total"], "latency_s": pc.latency_s["total"]}
                src = "cost model estimate of the planned schedule" if plan else "schedule estimate (no plan)"
        native = {"energy_j": c.energy_j["total"], "latency_s": c.latency_s["total"]}
        row = {"name": hw.name, "kind": hw.kind, "label": MODELLED, "planned": {**pl, "source": src},
               "executed": {**native, "source": MODELLED}, "vs_static": c.vs_static, "planned_vs_static": pvs,
               "baseline": base["label"], "notes": list(hw.notes),
               "time_validation": hw.time_validation(mix, op_list=prof.ops is not None)}
        if ran_on is not None and (hw.name, hw.content_hash) == (ran_on["profile"], ran_on["hash"]):
            _executed_here(row, ran_on, len(steps))
        row["diff_pct"] = {k: _pct(row["executed"][k], pl[k]) for k in native}
        rows.append(row)
    data["hardware"] = rows

    # ---- layers ---------------------------------------------------------------------------------------------
    data["layers"] = _layers(exe, prof, q, g, top, xgroups)
    series["layers"] = data["layers"]

    # ---- host saving: modelled vs measured -------------------------------------------------------
    data["host_saving"] = host_saving(run.path, cfg, prof, steps, host, measure_host, warnings)
    return RunReport(data, series, warnings)


def recorded_baseline(cfg: dict, plan: dict | None, schedule) -> dict:
    """The baseline a run's savings are measured against: what config.json recorded ("baseline"), else (a run
    written before runs recorded it) the plan's baseline, else static q_max of the run's schedule
    (``cptsim.run.planfile.run_baseline``); "source" says which."""
    from cptsim.run.planfile import run_baseline as baseline_of

    rec = cfg.get("baseline")
    if isinstance(rec, dict) and isinstance(rec.get("bits"), int):
        return rec
    return baseline_of(schedule, plan)


def _plan_vs_baseline(plan: dict, base: dict) -> dict | None:
    """The plan's own ratios to its baseline (plan.json estimate.vs_baseline), when ``base`` is that baseline."""
    vs = (plan.get("estimate") or {}).get("vs_baseline")
    if base.get("source") != "the plan's baseline" or not isinstance(vs, dict):
        return None
    out = {k: float(vs[k]) for k in ("bitops", "energy_j", "latency_s") if isinstance(vs.get(k), (int, float))}
    return out if {"energy_j", "latency_s"} <= set(out) else None


def _executed_here(row: dict, ran: dict, n_steps: int) -> None:
    """The target row of the GPU the run ran on holds what executed: its measured time and energy over every
    step (warm-up included, as the plan prices every step), beside the model as it ran (the steady steps
    ``host_time`` compares) and natively (the profile's tiers by width: `cptsim cost`'s figure, as other rows)."""
    ww = ran.get("with_warmup") or {}
    native = {k: row["executed"][k] for k in ("energy_j", "latency_s")}
    row["label"] = EXECUTED
    row["executed"] = {"energy_j": ww.get("measured_energy_j"), "latency_s": ww.get("measured_s"),
                       "source": f"measured on the run's GPU over all {n_steps} steps (warm-up included)"
                                 + ("" if ww.get("measured_energy_j") is not None else "; energy not measured")}
    compared = n_steps - int(ran.get("warmup_steps_skipped") or 0)
    row["modelled_as_ran"] = {"energy_j": ran.get("modelled_energy_j"), "latency_s": ran.get("modelled_s"),
                              "steps": compared, "source": ran.get("modelled_label")}
    row["measured_compared"] = {"energy_j": ran.get("measured_energy_j"), "latency_s": ran.get("measured_s"),
                                "steps": compared}
    row["modelled_natively"] = {**native, "steps": n_steps,
                                "source": "the profile's tiers by width, as `cptsim cost` prices it"}


def _gpu_modelled(cfg: dict, host, run_path) -> bool:
    """Whether the run's measured side is modelled by a GPU profile (``reportgpu``) rather than a host profile.

    A CUDA run: yes, unless the user named a host profile measured on a CUDA machine (``cptsim hw calibrate
    --device cuda``'s host.toml: graph replays as host terms). A CPU run: never; a GPU profile named for it is an
    error, one line."""
    from cptsim.cost.hardware import load_profile

    named = None if host in (None, "host") else load_profile(host)
    if is_cuda_run(cfg):
        return not (named is not None and named.kind == "host" and named.params.get("device") == "cuda")
    if named is not None and named.kind != "host":
        raise InputError(f"{run_path} ran on a CPU; --host {host!r} is a {named.kind!r} profile: a CPU run's step "
                         "times are modelled by a host profile (--host host, or a file from `cptsim hw calibrate`)")
    return False


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


def _run_layers(cfg: dict, schedule):
    """A per-layer run's plan (config.json "layers", resolved again on its recorded layers), or None."""
    from cptsim.cost.layerplan import layers_of_run

    return layers_of_run(cfg, schedule)


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

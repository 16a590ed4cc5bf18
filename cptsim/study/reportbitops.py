"""Planned vs executed BitOPs of a run: the cost model's formulas applied to a trace step by step (each layer at its
own bits in a per-layer run), the plan's own estimate, the reasons the two differ, and the layers that hold the
most. Pure functions of the profile, the trace and the plan: nothing here reads a file or times anything."""

from __future__ import annotations

import numpy as np

from cptsim.cost.runlength import RunLength

PHASE_KEYS = ("fwd", "dgrad", "wgrad", "total")


def _pct(a: float | None, b: float | None) -> float | None:
    """(a - b) / b in %, None when either is missing or b is 0 (and a is not)."""
    if a is None or b is None:
        return None
    if b == 0:
        return 0.0 if a == 0 else None
    return (a / b - 1.0) * 100.0


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

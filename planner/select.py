"""Selection: the best-scoring schedule whose estimated cost fits a budget on a target hardware, and the plan
document that records it.

``plan(workload, hardware, budget, space) -> Plan`` (also ``from cptsim.planner import plan``) evaluates every
candidate (``cptsim.planner.evaluate``), then:

1. **Select** (``select``): among candidates whose cost on the budget's metric is <= the budget, the highest
   score (``cptsim.planner.score``), ties to the cheaper. The choice is then re-costed with the one cost model,
   ``cptsim.cost.estimate``: the plan's numbers come from there, and if the fast path and ``estimate`` ever
   disagreed at the budget's edge, ``estimate`` wins and the next candidate is tried. So a plan's estimate is
   always <= its budget. (``estimate`` is given each candidate's steps by kind as the fast path counted them,
   ``Candidates.step_kinds``: the very histogram its bits give -- tests/test_planner_speed.py checks every
   candidate of several spaces -- so that it need not generate each schedule's bits, T steps of them.)
2. **Record** the static-q_max baseline, the top alternatives by score within budget plus the cheapest candidate
   (each re-costed by ``estimate``), and the Pareto frontier of cost vs score over all candidates.

Budget semantics:

* a relative budget ("65%") is that fraction of the **baseline**: the static schedule at the space's largest
  q_max (after --max-bits) with the space's highest gradient bits, on the budget's metric;
* below the cheapest candidate: ``InputError`` (exit 2) naming the cheapest achievable cost and the schedule that
  achieves it, and -- where the metric does not fall with bits on that hardware -- why;
* at or above the baseline's cost: the plan is static q_max (nothing in the space is more precise, so nothing
  scores higher) and a note says so; ``prefer_cyclic=True`` (``--prefer-cyclic``) plans the best cyclic
  schedule instead. If ``--schedules`` leaves static out, the listed schedules are searched as usual.
* "flat" metrics: energy and latency fall in steps, not smoothly, on most hardware (an H100 runs every width up
  to 8 bits on its int8 tier; a fixed 8-bit array likewise). The plan says, per metric, which forward widths
  cost the same, so that an infeasible latency budget on an H100 reads as what it is: below 8 bits nothing is
  saved, so no schedule in a q_max <= 8 space is cheaper than static 8.

``pilot=K`` replaces the proxy score with evidence: the top K candidates by score within budget train for real
(``cptsim.planner.pilot.run_pilot``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from cptsim.errors import InputError
from cptsim.cost.schedules import Schedule, aliasing

from .budget import Budget, format_quantities, parse_budget
from .evaluate import COST_KEYS, METRIC_NAMES, Candidates, evaluate
from .evidence import Evidence, need_evidence
from .pilot import pilot_pool, run_pilot
from .score import score_json
from .space import SearchSpace
from .workload import Workload

__all__ = ["Plan", "plan", "select", "baseline_schedule", "flat_note", "metric_levels", "range_settings"]


# ---------------------------------------------------------------------------------------------------- explanations


def _bits_span(bits: list[int]) -> str:
    return f"{bits[0]}" if len(bits) == 1 else f"{bits[0]}-{bits[-1]}"


def metric_levels(cands: Candidates, metric: str) -> list[tuple[list[int], float, float, str]]:
    """The forward widths the space can use, grouped into levels: for energy and latency, consecutive widths the
    hardware runs at the same rate (the same ``describe_bits``: GPU tier, Bit Fusion bricks, passes; memory
    traffic may still differ a little), for BitOPs every width on its own. [(bits, lowest and highest cost of
    one full-batch step at those bits and the baseline's gradient bits, how the hardware runs them)]."""
    key = COST_KEYS[metric]
    # with a float family a width's tier is its format's: describe the profile that prices them
    space, hw = cands.space, cands.hardware.with_formats(getattr(cands.workload, "formats", None))
    top = baseline_schedule(space)
    lo = max(space.q_min_range[0], space.min_bits or 1)
    table = cands.tables[key][0]
    levels: list[tuple[list[int], float, float, str]] = []
    for q in range(min(lo, top.q_max), top.q_max + 1):
        c = float(table[q, top.g_max])
        # a profile that prices layers from their shapes (an accelerator's array) has no per-width rate that holds
        # for every layer: its levels are the workload's own costs
        how = hw.describe_bits(q, q) if metric != "bitops" and not getattr(hw, "has_array", False) else ""
        if levels and ((how and how == levels[-1][3]) or math.isclose(levels[-1][2], c, rel_tol=1e-12)):
            bits, c_lo, c_hi, _ = levels[-1]
            levels[-1] = (bits + [q], min(c_lo, c), max(c_hi, c), how)
        else:
            levels.append(([q], c, c, how))
    return levels


def flat_note(cands: Candidates, metric: str, fits: np.ndarray | None = None) -> str | None:
    """Why bits below some width save little or nothing on ``metric`` here (None for BitOPs, or when every bit
    changes the rate). ``fits``: which candidates the budget admits; then the note says that a tight budget forces
    time at the lowest level's widths only when it does -- when every candidate within it has its q_min there (a
    pick that never goes below 4 bits, or static 8 under a budget that covers it, was told otherwise). Without
    ``fits`` the clause is said as a property of the hardware (a budget below every candidate)."""
    if metric == "bitops":
        return None
    levels = metric_levels(cands, metric)
    hw = cands.hardware
    what = METRIC_NAMES[metric]
    if len(levels) == 1:
        bits, c_lo, c_hi, how = levels[0]
        if math.isclose(c_lo, c_hi, rel_tol=1e-9):
            return (f"on {hw.name}, {what} does not fall with bits: every forward width {_bits_span(bits)} costs the "
                    f"same per step{f' ({how})' if how else ''}, so every schedule in this space costs what static "
                    f"{bits[-1]} costs; lower bits save BitOPs only (budget --metric bitops, or plan for hardware "
                    "with narrow arithmetic such as bitfusion or stripes)")
        return (f"on {hw.name}, every forward width {_bits_span(bits)} runs at the same rate"
                f"{f' ({how})' if how else ''}; only memory traffic shrinks with the bits, so a step at {bits[0]} "
                f"bits still costs {100 * c_lo / c_hi:.0f}% of one at {bits[-1]} in {what}")
    if not any(len(lv[0]) > 1 for lv in levels):
        return None
    parts = ", ".join(f"{_bits_span(b)} bits{f' {how}' if how else ''}" for b, _, _, how in levels)
    lowest = levels[0][0]
    text = (f"on {hw.name}, {what} falls in steps, not per bit: forward widths within a step run at the same rate "
            f"({parts}); only steps at <= {lowest[-1]} bits reach the lowest level")
    if fits is not None:
        q_min = cands.fields[:, 0] if cands.fields is not None else np.array([s.q_min for s in cands.schedules])
        if not fits.any() or (q_min[fits] > lowest[-1]).any():  # a candidate within budget stays above it
            return text
        return f"{text}, so this {what} budget forces time at {_bits_span(lowest)} bits"
    return f"{text}, so a tight {what} budget forces time at {_bits_span(lowest)} bits"


# ---------------------------------------------------------------------------------------------------- the plan


def _dataset_needs_dir(dataset: str) -> str | None:
    """What --data-dir must hold for this dataset (None: it ships with a package, like digits)."""
    from cptsim import data

    spec = getattr(data, "_DATASETS", {}).get(dataset)
    return getattr(spec, "needs_dir", None)


def baseline_schedule(space: SearchSpace) -> Schedule:
    """The static-q_max baseline: the space's largest allowed q_max, at its highest gradient bits."""
    q_max = space.q_max_range[1] if space.max_bits is None else min(space.q_max_range[1], space.max_bits)
    g = max(g_hi for _, g_hi in space.g_bits)
    return Schedule(name="static", q_min=q_max, q_max=q_max, g_min=g, g_max=g, cycles=1)


def _cost_value(cost, metric: str) -> float:
    """The total of ``metric`` in a ``Cost`` or in ``estimate_totals``' dict."""
    if isinstance(cost, dict):
        return float(cost[COST_KEYS[metric]])
    v = getattr(cost, COST_KEYS[metric])
    return float(v["total"])


def _total(cost, key: str) -> float:
    return float(cost[key]) if isinstance(cost, dict) else float(getattr(cost, key)["total"])


def _fmt(metric: str, *values: float) -> list[str]:
    """Values of ``metric`` for one message, in one unit (``format_quantities``)."""
    if metric == "bitops":
        return [f"{v:.4g} BitOPs" for v in values]
    return format_quantities(metric, *values)


def _cost_json(cost, base=None) -> dict:
    d = {"bitops": dict(cost.bitops), "energy_j": float(cost.energy_j["total"]),
         "latency_s": float(cost.latency_s["total"]), "macs": dict(cost.macs),
         "per_phase": {"energy_j": dict(cost.energy_j), "latency_s": dict(cost.latency_s)},
         "steps": cost.steps, "samples": cost.samples}
    if base is not None:
        d["vs_baseline"] = {k: (float(getattr(cost, k)["total"]) / float(getattr(base, k)["total"])
                                if float(getattr(base, k)["total"]) else None)
                            for k in COST_KEYS.values()}
    return d


@dataclass
class Plan:
    """The outcome of ``plan``: the chosen schedule and its estimate, the baseline, alternatives, frontier, notes."""

    workload: Workload
    hardware: Any
    budget: Budget
    budget_absolute: float
    space: SearchSpace
    schedule: Schedule
    estimate: Any          # cptsim.cost.Cost of the chosen schedule (per layer)
    baseline_schedule: Schedule
    baseline: Any          # cptsim.cost.Cost of the baseline
    score: float
    alternatives: list[dict]
    frontier: list[dict]
    notes: list[str]
    candidates: Candidates
    chosen_index: int | None
    ranking: str = "proxy"
    pilot: dict | None = None
    range_test: dict | None = None
    quality: dict | None = None
    timings: dict = field(default_factory=dict)
    quality_model: Any = field(default=None, repr=False)  # --quality db's fitted QualityModel (not in plan.json)

    @property
    def metric(self) -> str:
        return self.budget.metric

    @property
    def chosen_cost(self) -> float:
        return _cost_value(self.estimate, self.metric)

    @property
    def budget_fraction(self) -> float:
        """Estimated cost on the budget's metric over the budget (<= 1 by construction)."""
        return self.chosen_cost / self.budget_absolute

    def to_json(self) -> dict:
        """The plan.json document (format in planner/planfile.py)."""
        from cptsim import __version__

        from cptsim.run.planfile import PLAN_FORMAT

        hw = self.hardware
        est = _cost_json(self.estimate, self.baseline)
        est.update({"relative_to_static": float(self.estimate.bitops["total"] / self.baseline.bitops["total"]),
                    "score": self.score, "budget_fraction": self.budget_fraction,
                    "mean_bits": float(self.schedule.bits(self.workload.steps).mean()),
                    "per_layer": self.estimate.per_layer})
        base = _cost_json(self.baseline)
        base["schedule"] = self.baseline_schedule.to_text()
        base["score"] = float(self.candidates.score[self.candidates.index(self.baseline_schedule)]) \
            if self.candidates.index(self.baseline_schedule) is not None else None
        return {
            "format": PLAN_FORMAT,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "cptsim_version": __version__,
            "workload": self.workload.to_json(),
            "hardware": {"name": hw.name, "kind": hw.kind, "hash": hw.content_hash, "path": hw.path},
            "budget": self.budget.to_json(),
            "budget_absolute": self.budget_absolute,
            "budget_text": self.budget.describe(),
            "space": self.space.to_json(),
            "candidates": len(self.candidates),
            "score": score_json(),
            "ranking": self.ranking,
            "quality": self.quality,
            "evaluation": evaluation_json(self.schedule, self.workload.steps),
            "schedule": self.schedule.to_json() | {"text": self.schedule.to_text()},
            "estimate": est,
            "baseline": base,
            "alternatives": self.alternatives,
            "frontier": {"metric": self.metric, "cost_key": COST_KEYS[self.metric], "points": self.frontier},
            "notes": list(self.notes),
            "pilot": self.pilot,
            "range_test": self.range_test,
            "profile": self.workload.profile.to_json(),
            "timings": dict(self.timings),
        }


def evaluation_json(schedule: Schedule, steps: int) -> dict:
    """How a run of this plan is evaluated (``cptsim.run.train.evaluate``): at q_max, after BatchNorm statistics and
    activation ranges are re-estimated at q_max. The statistics a model carries belong to the precision it last
    trained at, so a schedule that ends below q_max (one-cycle or odd-cycle triangular) would otherwise be scored
    with statistics of the wrong precision (24% instead of 92% on MNIST, measured)."""
    from cptsim.run.config import TrainConfig

    cfg = TrainConfig()
    return {"bits": schedule.q_max, "final_bits": int(schedule.bits(steps)[-1]),
            "recal_batches": cfg.recal_batches,
            "why": "BatchNorm statistics and activation ranges are re-estimated at the evaluation bits before "
                   "every evaluation, so the final precision of the schedule does not leak into its score"}


def _quality_rank(cands: Candidates, mask: np.ndarray, cost: np.ndarray, base_bitops: float, db,
                  notes: list[str], evidence=None) -> tuple[np.ndarray | None, dict]:
    """Candidates under ``mask`` ranked by accuracy predicted from measured runs (``quality.py``), or None (with
    the reason in the returned document) when the database has too few runs of this workload. Measured per-layer
    runs count with the features of their plans (``quality.plan_features``); the fitted model is returned in the
    document under ``"model"`` (an object: the plan keeps it for the per-layer refinement, not plan.json)."""
    from .quality import MIN_SCHEDULES, fit_quality, features, load_measurements, measured_features, share_above

    w = cands.workload
    m = load_measurements(w, db, evidence)
    accs, path = m.values, m.db
    doc = {"source": "db", "db": path, "workload_key": m.workload_key, "measure": m.measure, "runs": len(accs),
           "schedules": len(set(m.entries)), "runs_without_validation": m.without_validation,
           "per_layer_runs": sum(lr is not None for lr in m.layers)}
    if m.without_validation:
        notes.append(f"--quality db: {m.without_validation} run(s) of this workload in {path} recorded no "
                     "validation measure (swept with --val-split 0, or before sweeps held one out); they are left "
                     "out - decisions never use the test split")
    model = None
    names: list[str] = []
    if accs:
        X, floor, left_out = measured_features(m, w, cands.hardware, base_bitops)
        keep = np.all(np.isfinite(X), axis=1)
        if left_out:
            doc["left_out"] = left_out
            notes.append(f"--quality db: {int((~keep).sum())} per-layer run(s) left out: their layer rules do not "
                         f"resolve on this workload ({next(iter(left_out.values()))})")
        names = [e for e, k in zip(m.entries, keep) if k]
        model = fit_quality(names, X[keep], np.asarray(accs)[keep])
        if model is not None:
            model.floor, model.measured = floor, m
    if model is None:
        doc["fallback"] = "proxy"
        notes.append(f"--quality db: {len(set(names))} measured schedule(s) of this workload with a "
                     f"{m.measure['name']} in {path} (need {MIN_SCHEDULES}); ranked by the proxy score instead - "
                     "'cptsim sweep' measures more")
        return None, doc
    Xc = features(cands.score, cands.mean_bits, cands.cost["bitops"] / base_bitops,
                  share_above(cands, model.floor))
    mean, std = model.predict(Xc)
    inside = model.in_range(Xc)
    doc.update(model.to_json())
    idx = np.flatnonzero(mask)
    ins, outs = idx[inside[idx]], idx[~inside[idx]]
    doc["in_range"], doc["extrapolated"] = int(ins.size), int(outs.size)
    doc["model"] = model  # popped by select (an object, not JSON)
    rng = "; ".join(f"{label} {lo:.4g}-{hi:.4g}" for label, (lo, hi) in
                    zip(("score", "mean bits", "BitOPs/baseline", f"work above {model.floor} bits"),
                        doc["feature_range"].values()))
    if ins.size == 0:
        doc["fallback"] = "proxy"
        notes.append(f"--quality db: every one of the {outs.size} candidates within budget lies outside the range "
                     f"the model was measured over ({rng}); a linear fit would extrapolate there, so the plan is "
                     "ranked by the proxy score instead - sweep schedules like these to extend the range")
        return None, doc
    # The proxy's ranking, in which the model re-orders the candidates it was measured over among the places they
    # hold; a candidate outside keeps the place the proxy gives it.
    ranked = _ranked(cands, mask, cost)
    slots = inside[ranked]
    by_model = ins[np.lexsort((ins, cost[ins], -cands.score[ins], -np.round(mean[ins], 12)))]
    ranked = ranked.copy()
    ranked[slots] = by_model
    if outs.size:
        notes.append(f"--quality db: {outs.size} of the {idx.size} candidates within budget lie outside the range "
                     f"the model was measured over ({rng}); they get no prediction (marked extrapolated) and keep "
                     f"the proxy score's ranking; the model re-orders the {ins.size} inside it among their places")
    doc["predicted"] = {"mean": mean, "std": std, "in_range": inside}  # arrays: per alternative in select
    return ranked, doc


def _why_not_separated(rd: dict) -> str:
    """One pilot round's failed separation test, in words (``cptsim.planner.pilot``)."""
    if "two_se" in rd:  # a language model: the loss gap against twice its standard error
        return f"loss gap {rd['gap']:.3f} < 2 standard errors {rd['two_se']:.3f}"
    if "p_value" not in rd:
        return f"accuracy gap {rd['gap']:.3f}, untested: {rd.get('why', 'no paired results')}"
    can = rd.get("resolvable_gap")
    return (f"accuracy gap {rd['gap']:.3f}; McNemar's exact test on the {rd['disagreements']} validation samples "
            f"they disagree on ({rd['kept_only']} vs {rd['dropped_only']}): p = {rd['p_value']:.3g} >= 0.05; "
            + (f"with that many disagreements a gap of {can:.3f} would have been needed" if can is not None else
               "too few disagreements to resolve any gap"))


def _predicted_json(predicted: dict, quality_doc: dict, i: int) -> dict:
    """An alternative's predicted quality: validation accuracy, or a language model's validation loss (the model
    fits minus the loss)."""
    mean, std = float(predicted["mean"][i]), float(predicted["std"][i])
    lm = (quality_doc.get("measure") or {}).get("key") == "val_loss"
    if not predicted["in_range"][i]:  # outside the measured range: the model says nothing there
        return {"predicted_val_loss" if lm else "predicted_acc": None, "predicted_std": None, "extrapolated": True}
    if lm:
        return {"predicted_val_loss": -mean, "predicted_std": std, "extrapolated": False}
    return {"predicted_acc": mean, "predicted_std": std, "extrapolated": False}


def _pareto(cost: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Indices of the candidates no other beats on both cost (lower) and score (higher), by increasing cost."""
    order = np.lexsort((-score, cost))
    s = score[order]
    best_before = np.concatenate(([-np.inf], np.fmax.accumulate(s)[:-1]))  # the best score of anything cheaper
    return order[s > best_before].astype(np.int64)


def _ranked(cands: Candidates, mask: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Candidate indices under ``mask`` by score descending, then cost ascending, then space order."""
    idx = np.flatnonzero(mask)
    order = np.lexsort((idx, cost[idx], -cands.score[idx]))
    return idx[order]


def select(cands: Candidates, budget: Budget | str, *, prefer_cyclic: bool = False, top: int = 10,
           pilot: int = 0, pilot_steps: int | None = None, pilot_dir: str | None = None, device: str = "cpu",
           on_pilot: Callable[[dict], None] | None = None, quality: str = "proxy", db: str | None = None,
           evidence: Evidence | None = None) -> Plan:
    """Pick the plan from evaluated candidates (budget semantics in the module docstring)."""
    t0 = time.perf_counter()
    if isinstance(budget, str):
        budget = parse_budget(budget)
    w, hw, space = cands.workload, cands.hardware, cands.space
    metric = budget.metric
    key = COST_KEYS[metric]
    what = METRIC_NAMES[metric]
    cost = cands.cost[key]
    notes: list[str] = []

    base_sched = baseline_schedule(space)
    base = w.estimate(base_sched, hw)
    base_val = _cost_value(base, metric)
    if base_val <= 0:
        raise InputError(f"{hw.name} reports no {what} for this workload (static {base_sched.q_max} costs 0); "
                         + ("its power is unknown (power_w = 0): " if metric == "energy" else "")
                         + "plan for another --metric or --hw")
    limit = budget.absolute(base_val)
    pct = lambda v: 100.0 * v / base_val  # noqa: E731
    flat = flat_note(cands, metric)

    # The cheapest candidate, as the one cost model counts it (ties: the best score).
    # Costs equal to rounding (a GPU's flat int8 tier) count as ties.
    near = np.flatnonzero(cost <= cost.min() * (1.0 + 1e-12))
    cheapest = int(near[np.lexsort((near, -cands.score[near]))[0]])
    # the step kinds of the cheapest candidate and of the best within budget (what is re-costed below), in one pass
    cands.count_step_kinds([cheapest, *_ranked(cands, cost <= budget.absolute(base_val), cost)[:top + 1].tolist()])
    cheap_est = w.estimate_totals(cands.schedules[cheapest], hw, step_kinds=cands.step_kinds(cheapest))
    cheap_val = _cost_value(cheap_est, metric)

    def infeasible() -> InputError:
        levels = metric_levels(cands, metric)
        lo_bits, lo_cost, hi_bits, hi_cost = levels[0][0], levels[0][1], levels[-1][0], levels[-1][2]
        why = f"; {flat}" if flat else ""
        if not math.isclose(lo_cost, hi_cost, rel_tol=1e-9):
            why += (f"; even a step at {lo_bits[0]} bits costs {100 * lo_cost / hi_cost:.0f}% of one at "
                    f"{hi_bits[-1]} in {what}" + ("" if metric == "bitops" else f" on {hw.name}") +
                    (" (the gradient GEMMs run at the gradient bits and full-precision layers at 32, whatever the "
                     "forward bits)" if metric == "bitops" else
                     " (gradient GEMMs, full-precision layers and memory traffic do not shrink with the forward "
                     "bits)"))
        limit_text, cheap_text = _fmt(metric, limit, cheap_val)
        return InputError(
            f"budget {budget.spec} ({limit_text}{'' if metric == 'bitops' else f' of {what} on {hw.name}'}) "
            f"is below the cheapest candidate: {cands.schedules[cheapest].to_text()} costs {cheap_text} "
            f"({pct(cheap_val):.1f}% of static {base_sched.q_max}){why}")

    above_static = limit >= base_val
    mask = cost <= limit
    if not mask.any():
        raise infeasible()
    static_first = False
    if above_static:
        limit_text, base_text = _fmt(metric, limit, base_val)
        notes.append(f"the budget ({limit_text}) covers the static-{base_sched.q_max} cost "
                     f"({base_text}, {pct(limit):.0f}% of it)")
        if prefer_cyclic:
            cyclic = np.array([s.name != "static" for s in cands.schedules])
            if (mask & cyclic).any():
                mask = mask & cyclic
                notes.append("--prefer-cyclic: planning the best cyclic schedule instead of static q_max")
        elif "static" in space.schedules:
            static_first = True
            notes.append(f"planning static {base_sched.q_max} (the most precise schedule in the space; "
                         "pass --prefer-cyclic for the best cyclic schedule instead)")
        else:
            notes.append("static is not among --schedules, so the listed schedules are ranked as usual")
    ranked = _ranked(cands, mask, cost)
    if quality not in ("proxy", "db"):
        raise InputError(f"--quality must be proxy or db, got {quality!r}")
    quality_doc, predicted, ranking, quality_model = {"source": "proxy"}, None, "proxy", None
    if quality == "db":
        by_model, quality_doc = _quality_rank(cands, mask, cost, float(base.bitops["total"]), db, notes,
                                              evidence)
        quality_model = quality_doc.pop("model", None)
        if by_model is not None:
            ranked, ranking = by_model, "db"
            predicted = quality_doc.pop("predicted")
    if static_first:
        bi = cands.index(base_sched)
        if bi is not None:
            ranked = np.concatenate(([bi], ranked[ranked != bi]))

    pilot_doc = None
    if static_first and predicted is not None:
        notes.append("--quality db: the budget covers static q_max, which is planned (the most precise schedule)")
    if pilot and not static_first:
        if pilot < 2:
            raise InputError(f"--pilot K needs K >= 2 candidates to compare, got {pilot}")
        pool = pilot_pool(cands, ranked, pilot)
        if len(pool) >= 2:
            winner_pos, pilot_doc = run_pilot(cands, pool, pilot_steps, pilot_dir, device, on_pilot, db=db,
                                              evidence=evidence)
            ranked = np.concatenate(([pool[winner_pos]], ranked[ranked != pool[winner_pos]]))
            ranking = "pilot"
            if not pilot_doc.get("separated", True):
                weak = [rd for rd in pilot_doc["rounds"] if not rd["separated"]]
                notes.append(f"--pilot: {len(weak)} of {len(pilot_doc['rounds'])} round(s) did not separate their "
                             f"candidates ({_why_not_separated(weak[0])}); give longer --pilot-steps for a firmer "
                             "ranking")
        else:
            notes.append("--pilot skipped: only one candidate fits the budget")
    elif pilot:
        notes.append("--pilot skipped: the budget covers static q_max, which is planned")

    # Verify with the one cost model; if the fast path was optimistic at the budget's edge, trust estimate.
    cands.count_step_kinds(ranked[:top + 1])  # what the loop and the alternatives below cost, counted in one go
    chosen = est = None
    for i in ranked:
        e = w.estimate(cands.schedules[int(i)], hw, per_layer=True, step_kinds=cands.step_kinds(int(i)))
        if _cost_value(e, metric) <= limit:
            chosen, est = int(i), e
            break
        notes.append(f"{cands.schedules[int(i)].to_text()} passed the fast check but cost.estimate puts it "
                     f"above the budget; skipped")
    if chosen is None:
        raise infeasible()
    sched = cands.schedules[chosen]
    alias = aliasing(sched, w.steps)
    if alias:  # the space's cycle counts are not chosen by the run's length: a short run can pick one that aliases
        notes.append(f"the chosen {alias}; --cycles sets the counts searched")
    if predicted is not None and not predicted["in_range"][chosen]:
        notes.append(f"--quality db: the chosen {sched.to_text()} lies outside the range the model was measured over; "
                     "it holds its place by the proxy score, not by a prediction")

    # Alternatives: the best by score within budget, the chosen one, and the cheapest candidate overall.
    alt_idx = [chosen] + [int(i) for i in ranked[:top] if int(i) != chosen]
    alt_idx = alt_idx[:max(top, 1)]
    if cheapest not in alt_idx:
        alt_idx.append(cheapest)
    alternatives = []
    for rank, i in enumerate(alt_idx, start=1):
        e = est if i == chosen else cheap_est if i == cheapest else \
            w.estimate_totals(cands.schedules[i], hw, step_kinds=cands.step_kinds(i))
        v = _cost_value(e, metric)
        role = "chosen" if i == chosen else "cheapest" if i == cheapest and rank > top else "alternative"
        alternatives.append({
            "rank": rank, "role": role, "schedule": cands.schedules[i].to_text(),
            "name": cands.schedules[i].name, "cycles": cands.schedules[i].cycles,
            "q_min": cands.schedules[i].q_min, "q_max": cands.schedules[i].q_max,
            "mean_bits": float(cands.mean_bits[i]), "score": float(cands.score[i]),
            "bitops": _total(e, "bitops"), "energy_j": _total(e, "energy_j"),
            "latency_s": _total(e, "latency_s"), "budget_fraction": v / limit,
            "vs_baseline": v / base_val, "within_budget": bool(v <= limit),
            **(_predicted_json(predicted, quality_doc, i) if predicted is not None else {}),
            "cheapest": i == cheapest,
        })

    front = _pareto(cost, cands.score)
    take = getattr(cands.schedules, "take", None)
    front_scheds = take(front) if take else [cands.schedules[i] for i in front]
    frontier = [{"schedule": s.to_text(), "cost": float(cost[i]),
                 "vs_baseline": float(cost[i] / base_val), "score": float(cands.score[i]),
                 "within_budget": bool(cost[i] <= limit)} for s, i in zip(front_scheds, front.tolist())]

    used = _cost_value(est, metric) / limit
    flat = flat_note(cands, metric, cost <= limit)  # now that the budget's candidates are known
    if not above_static:
        notes.insert(0, f"{sched.to_text()} uses {100 * used:.1f}% of the budget "
                        f"({100 * _cost_value(est, metric) / base_val:.1f}% of static {base_sched.q_max} {what})")
    if flat:
        notes.append(flat)
    if metric == "bitops":  # say where saved BitOPs buy no time or energy on this hardware
        saved = 1.0 - est.bitops["total"] / base.bitops["total"]
        stuck = []
        for m in ("latency", "energy"):
            k = COST_KEYS[m]
            b = float(getattr(base, k)["total"])
            ratio = float(getattr(est, k)["total"]) / b if b else 1.0
            if saved > 0.05 and ratio > 0.98:
                stuck.append((m, ratio))
        if stuck:
            top_bits, _, _, how = metric_levels(cands, stuck[0][0])[-1]
            if sched.q_min in top_bits:
                why = (f"its forward bits {sched.q_min}-{sched.q_max} all run at the rate of "
                       f"{base_sched.q_max} bits here ({how})")
            else:
                why = next((w for w in (flat_note(cands, m) for m, _ in stuck) if w), None)
            notes.append(f"on {hw.name} this plan saves {100 * saved:.0f}% of the BitOPs but only "
                         + " and ".join(f"{100 * (1 - r):.1f}% of the {m}" for m, r in stuck)
                         + (f"; {why}" if why else ""))
    needs = _dataset_needs_dir(w.dataset)
    if needs and not w.data_dir:
        notes.append(f"{w.dataset} is not on disk for this plan: 'cptsim train --plan' reads the data directory "
                     f"from the plan, so plan again with --data-dir pointing at {needs} before training it")
    notes.extend(f"{hw.name}: {n}" for n in hw.notes)
    return Plan(workload=w, hardware=hw, budget=budget, budget_absolute=limit, space=space, schedule=sched,
                estimate=est, baseline_schedule=base_sched, baseline=base, score=float(cands.score[chosen]),
                alternatives=alternatives, frontier=frontier, notes=notes, candidates=cands, chosen_index=chosen,
                ranking=ranking, pilot=pilot_doc, quality=quality_doc, quality_model=quality_model,
                timings={"profile_s": w.profile_s, "evaluate_s": cands.eval_s,
                         "select_s": time.perf_counter() - t0})


def plan(workload: Workload, hardware, budget: Budget | str, space: SearchSpace | None = None, *,
         prefer_cyclic: bool = False, top: int = 10, pilot: int = 0, pilot_steps: int | None = None,
         pilot_dir: str | None = None, device: str = "cpu", range_test=None,
         on_pilot: Callable[[dict], None] | None = None, quality: str = "proxy", db: str | None = None,
         evidence: Evidence | None = None) -> Plan:
    """The best-scoring schedule of ``space`` whose estimated cost on ``hardware`` fits ``budget``.

    ``hardware``: a HardwareProfile, name or path; ``budget``: a Budget or its text ("65%", "500kJ").
    ``space`` with ``--min-bits auto`` runs CPT's precision range test first (or give its ``range_test`` result).
    Raises InputError when nothing fits (the message names the cheapest candidate and its cost)."""
    space = space or SearchSpace()
    if isinstance(budget, str):
        budget = parse_budget(budget)
    rt_doc = None
    if space.min_bits_auto or range_test is not None:
        if range_test is None:
            range_test = need_evidence(evidence, "--min-bits auto").range_test(range_settings(workload, space))
        space = space.with_min_bits(range_test.suggested_q_min) if space.min_bits_auto else space
        rt_doc = range_test.to_json()
    cands = evaluate(workload, hardware, space)
    p = select(cands, budget, prefer_cyclic=prefer_cyclic, top=top, pilot=pilot, pilot_steps=pilot_steps,
               pilot_dir=pilot_dir, device=device, on_pilot=on_pilot, quality=quality, db=db,
               evidence=evidence)
    if rt_doc is not None:
        p.range_test = rt_doc
        p.notes.append(f"--min-bits auto: the precision range test suggests q_min = {range_test.suggested_q_min} "
                       f"({range_test.reason})")
    return p


def range_settings(workload: Workload, space: SearchSpace, steps_per_stage: int | None = None, device="cpu"):
    """The range test for this workload: forward bits from the space's lowest q_min up to its largest q_max
    (the fields of ``cptsim.study.rangetest.RangeTestSettings``)."""
    top = baseline_schedule(space)
    return dict(model=workload.model, dataset=workload.dataset, data_dir=workload.data_dir,
                batch_size=workload.batch_size, q_start=min(space.q_min_range[0], top.q_max - 1),
                q_max=top.q_max, g_bits=min(top.g_max, 16), steps_per_stage=steps_per_stage,
                seed=workload.seed, device=device, augment=workload.augment,
                image_size=getattr(workload, "image_size", None), fp_layers=list(workload.fp_layers),
                # the test probes in the workload's number formats (one stage per distinct format)
                number_format=workload.number_format, grad_format=workload.grad_format)

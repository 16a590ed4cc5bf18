"""Per-layer (time-varying) precision under a budget: a multiple-choice knapsack solved as a MILP.

Each quantized layer l picks one option m from a small menu (an offset of the global schedule's range, so its
bits still vary over training with the global shape). Choosing option m for layer l costs C[l, m] on the budget's
metric (the layer's rows of a whole-model estimate at that option's schedule: ``cptsim.cost.estimate``'s
``per_layer``, exact on every hardware kind) and is worth V[l, m] to the quality score. The program::

    maximise   sum_l sum_m V[l, m] x[l, m]
    subject to sum_m x[l, m] = 1                      each layer (or tied group) takes exactly one option
               sum_l sum_m C[l, m] x[l, m] <= B - C0  the budget, less what no choice changes (full-precision
                                                     layers, the step's other ops)
               x[l, m] in {0, 1};  x[l, m] = 0 where option m is not allowed for l
    ties:      layers that must share an option (HAWQ-V3 ties a residual downsample to its block's first conv)
               are one unit: their C and V rows summed.

Solved with ``scipy.optimize.milp`` (HiGHS); ``solve`` reports the solver's status, relative optimality gap
(``mip_gap``: 0 = proven optimal) and time. ``brute_force`` enumerates every choice, for tests.

The value: ``V[l, m] = w_l * score(option m)``, where ``score`` is the planner's early-weighted-fidelity score of the
option's bits per step (``planner.score``) and ``w_l`` the layer's sensitivity weight, normalised to sum to 1
(measured by ``cptsim sensitivity``; equal weights without a measurement). Every layer on one schedule S then
scores exactly ``score(S)``: uniform and per-layer plans are ranked on one scale, and a per-layer plan is chosen only
where it scores above the best uniform schedule that fits the budget.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import product

import numpy as np

from cptsim.errors import InputError

from .evaluate import COST_KEYS
from .score import layer_weights  # noqa: F401 - planner.perlayer.layer_weights, as before

__all__ = ["Solution", "solve", "brute_force", "tie_units", "DEFAULT_OFFSETS", "LayerPlan", "plan_layers",
           "resnet_ties"]

DEFAULT_OFFSETS = (-2, -1, 0, 1, 2)


@dataclass
class Solution:
    choice: np.ndarray      # (L,) option index per layer
    value: float            # objective: sum of chosen V
    cost: float             # sum of chosen C
    status: str             # "optimal", "time limit", "infeasible", ...
    gap: float              # relative MIP gap (0: proven optimal)
    time_s: float

    def to_json(self) -> dict:
        return {"status": self.status, "objective": self.value, "cost": self.cost, "mip_gap": self.gap,
                "time_s": round(self.time_s, 4), "solver": "scipy.optimize.milp (HiGHS)"}


def tie_units(n: int, ties=()) -> list[list[int]]:
    """Layers 0..n-1 grouped into units: the transitive closure of ``ties`` (each a sequence of layer indices)."""
    parent = list(range(n))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for group in ties:
        group = list(group)
        for j in group:
            if not 0 <= j < n:
                raise InputError(f"tie names layer index {j}, outside 0..{n - 1}")
        for j in group[1:]:
            parent[find(j)] = find(group[0])
    units: dict[int, list[int]] = {}
    for i in range(n):
        units.setdefault(find(i), []).append(i)
    return list(units.values())


def _merged(value, cost, allowed, units):
    V = np.array([value[u].sum(axis=0) for u in units])
    C = np.array([cost[u].sum(axis=0) for u in units])
    A = np.array([allowed[u].all(axis=0) for u in units])
    return V, C, A


def _check(value, cost, allowed):
    value, cost = np.asarray(value, dtype=np.float64), np.asarray(cost, dtype=np.float64)
    if value.shape != cost.shape or value.ndim != 2:
        raise ValueError(f"value {value.shape} and cost {cost.shape} must both be (layers, options)")
    allowed = np.ones(value.shape, dtype=bool) if allowed is None else np.asarray(allowed, dtype=bool)
    allowed = allowed & np.isfinite(value) & np.isfinite(cost)
    return np.where(allowed, value, 0.0), np.where(allowed, cost, 0.0), allowed


def solve(value, cost, budget: float, ties=(), allowed=None, time_limit: float = 10.0) -> Solution:
    """The MILP above with ``scipy.optimize.milp``. ``value``, ``cost``: (L, M); ``budget``: the bound on the sum of
    chosen costs (a float or an exact ``Fraction``), which the chosen costs' exact sum never exceeds; ``allowed``:
    (L, M) bools (default all; NaN/inf entries are never allowed)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    t0 = time.perf_counter()
    value, cost, allowed = _check(value, cost, allowed)
    L, M = value.shape
    units = tie_units(L, ties)
    V, C, A = _merged(value, cost, allowed, units)
    U = len(units)
    if not A.any(axis=1).all():
        bad = units[int(np.flatnonzero(~A.any(axis=1))[0])]
        raise InputError(f"no option is allowed for every layer of the tied group {bad}")
    # scale the budget row so HiGHS's feasibility tolerance is relative to it
    scale = max(abs(float(budget)), float(np.abs(C).max()), 1e-300)
    rows = [np.kron(np.eye(U), np.ones(M)), (C / scale).reshape(1, -1)]
    lo = np.concatenate([np.ones(U), [-np.inf]])

    def run(bound: float):
        hi = np.concatenate([np.ones(U), [bound / scale]])
        return milp(-V.reshape(-1), constraints=LinearConstraint(np.vstack(rows), lo, hi),
                    integrality=np.ones(U * M), bounds=Bounds(0, A.reshape(-1).astype(np.float64)),
                    options={"time_limit": time_limit, "mip_rel_gap": 1e-9})

    # HiGHS accepts a choice that breaks the budget row by up to its feasibility tolerance (~1e-6 of the budget):
    # each choice is checked against the budget in exact arithmetic, and the row tightened by 4x the choice's
    # excess over the row (so the excess it can hide grows 5x a solve: the smallest tightening that works is
    # found first, and the choice stays the best that fits); one still over after that is repaired by the
    # cheapest downgrades.
    bound, pick, res, status, repaired = float(budget), None, None, None, False
    for _ in range(_RESOLVES):
        got = run(bound)
        if got.x is None:
            status = status or _status(got)
            break
        res, status = got, _status(got)
        pick = np.asarray(got.x).reshape(U, M).argmax(axis=1)
        if _overshoot(C, pick, budget) <= 0:
            break
        bound -= 4 * float(_overshoot(C, pick, bound))
    if pick is not None and _overshoot(C, pick, budget) > 0:
        pick, repaired = _repair(V, C, A, pick, budget), True
    dt = time.perf_counter() - t0
    if pick is None:
        return Solution(np.full(L, -1), -np.inf, np.inf, "infeasible" if repaired else status, np.inf, dt)
    if repaired:
        status = f"{status}, repaired to fit the budget"
    choice = np.empty(L, dtype=np.int64)
    for u, members in enumerate(units):
        choice[members] = pick[u]
    got_v = float(value[np.arange(L), choice].sum())
    got_c = float(cost[np.arange(L), choice].sum())
    gap = float(getattr(res, "mip_gap", 0.0) or 0.0)
    return Solution(choice, got_v, got_c, status, gap, dt)


_RESOLVES = 6  # solves of one program before a choice still over the budget is repaired


def _status(res) -> str:
    return {0: "optimal", 1: "time limit", 2: "infeasible", 3: "unbounded"}.get(res.status, res.message)


def _overshoot(C, pick, budget) -> Fraction:
    """How far the chosen options' cost lies above ``budget``, exactly (> 0: over; floats are exact fractions)."""
    return sum((Fraction(float(C[u, m])) for u, m in enumerate(pick)), Fraction(0)) - Fraction(budget)


def _repair(V, C, A, pick, budget):
    """``pick`` made to fit ``budget``: one unit at a time moved to a cheaper allowed option, the move that loses
    the least value per unit of cost saved first. None when even the cheapest options do not fit."""
    pick = np.array(pick)
    while _overshoot(C, pick, budget) > 0:
        best = None
        for u in range(len(pick)):
            for m in np.flatnonzero(A[u] & (C[u] < C[u, pick[u]])):
                loss = (V[u, pick[u]] - V[u, m]) / (C[u, pick[u]] - C[u, m])
                if best is None or loss < best[0]:
                    best = (loss, u, m)
        if best is None:
            return None
        pick[best[1]] = best[2]
    return pick


def brute_force(value, cost, budget: float, ties=(), allowed=None) -> Solution:
    """Every choice enumerated (M^units of them): the reference ``solve`` is tested against. Ties in value are
    broken towards the lower cost."""
    t0 = time.perf_counter()
    value, cost, allowed = _check(value, cost, allowed)
    L, M = value.shape
    units = tie_units(L, ties)
    V, C, A = _merged(value, cost, allowed, units)
    best = None
    for pick in product(range(M), repeat=len(units)):
        idx = (np.arange(len(units)), np.array(pick))
        if not A[idx].all():
            continue
        c = C[idx].sum()
        if c > budget * (1 + 1e-9) + 1e-12:
            continue
        v = V[idx].sum()
        if best is None or v > best[0] + 1e-12 or (abs(v - best[0]) <= 1e-12 and c < best[1]):
            best = (v, c, pick)
    if best is None:
        return Solution(np.full(L, -1), -np.inf, np.inf, "infeasible", np.inf, time.perf_counter() - t0)
    choice = np.empty(L, dtype=np.int64)
    for u, members in enumerate(units):
        choice[members] = best[2][u]
    return Solution(choice, float(best[0]), float(best[1]), "optimal", 0.0, time.perf_counter() - t0)


# ------------------------------------------------------------------------------------------------ on a workload


def resnet_ties(names: list[str]) -> list[list[str]]:
    """HAWQ-V3's ties in a ResNet: a block's downsample/shortcut conv shares the bits of the block's first conv
    (both read the block's input). Returns groups of layer names present in ``names``."""
    out = []
    for n in names:
        for key in (".downsample.0", ".downsample", ".shortcut.0", ".shortcut"):
            if n.endswith(key):
                conv1 = n[: -len(key)] + ".conv1"
                if conv1 in names:
                    out.append([conv1, n])
                break
    return out


@dataclass
class LayerPlan:
    """A per-layer plan around one global schedule, and how it was found."""

    base: object                 # the global Schedule
    resolved: object             # cptsim.cost.layerplan.ResolvedLayers
    score: float                 # sensitivity-weighted score (= score(base) when every layer keeps offset 0)
    uniform_score: float         # the base schedule's own score
    cost: float                  # total on the budget's metric
    solution: Solution
    offsets: dict = field(default_factory=dict)   # layer -> chosen offset
    menu: tuple = DEFAULT_OFFSETS
    weights: dict = field(default_factory=dict)
    ties: list = field(default_factory=list)
    predicted: dict | None = None   # --quality db: the model's prediction for this plan (refine)
    ranked_by: str = "proxy"        # what chose it over the uniform choice: "proxy" (score) or "db" (the model)

    def to_json(self) -> dict:
        return {"base": self.base.to_text(), "menu_offsets": list(self.menu), "score": self.score,
                "base_score": self.uniform_score, "cost": self.cost, "solver": self.solution.to_json(),
                "offsets": self.offsets, "weights": self.weights, "ties": self.ties,
                "layers": self.resolved.to_json(), "ranked_by": self.ranked_by,
                **({"predicted": self.predicted} if self.predicted is not None else {})}


_COST_KEYS = {"bitops": "bitops", "energy": "energy_j", "latency": "latency_s"}


def option_schedule(base, offset: int):
    """The base schedule's range shifted by ``offset`` (None where it leaves 1..16)."""
    from cptsim.cost.schedules import Schedule

    lo, hi = base.q_min + offset, base.q_max + offset
    if not (1 <= lo <= hi <= 16):
        return None
    if base.name == "static":
        return Schedule("static", hi, hi, base.g_min, base.g_max, 1)
    return Schedule(base.name, lo, hi, base.g_min, base.g_max, base.cycles)


def plan_layers(workload, hardware, base, metric: str, budget: float, weights: dict | None = None,
                offsets=DEFAULT_OFFSETS, ties: list | None = None, min_bits: int = 1, max_bits: int = 16,
                time_limit: float = 10.0, cands=None) -> LayerPlan | None:
    """The best per-layer offsets of ``base`` on ``workload`` (planner.workload.Workload) whose cost on ``metric``
    (bitops, energy, latency) fits ``budget`` (absolute, base units). ``weights``: layer -> sensitivity (>= 0;
    None: equal). ``ties``: groups of layer names (default: ``resnet_ties``). None when nothing fits."""
    from cptsim.cost.layerplan import LayerRule, LayerSchedule, ResolvedLayers

    from .score import score_bits

    a = workload.profile.arrays()
    names = list(a.names)
    qidx = [i for i, q in enumerate(a.quantized) if q]
    qnames = [names[i] for i in qidx]
    key = _COST_KEYS[metric]
    T = workload.steps
    opts = [option_schedule(base, k) for k in offsets]
    ok = [s is not None and (s == base or (s.q_min >= min_bits and s.q_max <= max_bits)) for s in opts]
    L, M = len(qidx), len(offsets)
    cost = np.full((L, M), np.nan)
    sc = np.full(M, np.nan)
    const = None
    for m, s in enumerate(opts):
        if not ok[m] and offsets[m] != 0:
            continue
        est = workload.estimate(s, hardware, per_layer=True)
        if getattr(est, key) is None:
            raise InputError(f"a {metric} budget needs a hardware profile")
        rows = np.array([r[key]["total"] for r in est.per_layer])
        if s == base:  # what no choice changes: full-precision layers and the step's other ops, at the global bits
            # exactly: in floats, total - sum may round up, and the base itself would no longer fit a budget of
            # exactly its own cost
            const = Fraction(float(getattr(est, key)["total"])) - sum(Fraction(float(x)) for x in rows[qidx])
        if ok[m]:
            cost[:, m] = rows[qidx]
            i = cands.index(s) if cands is not None else None  # the fast path scored it already (same T)
            sc[m] = float(cands.score[i]) if i is not None else float(score_bits(s.bits(T), s.grad_bits(T)))
    if const is None:
        raise ValueError("the menu must hold offset 0 (the base schedule)")
    w = layer_weights(qnames, weights)
    value = w[:, None] * sc[None, :]
    tie_names = resnet_ties(qnames) if ties is None else ties
    pos = {n: i for i, n in enumerate(qnames)}
    tie_idx = [[pos[n] for n in g if n in pos] for g in tie_names]
    # the room the choices have, exactly: budget - const in floats may round up past it
    sol = solve(value, cost, Fraction(float(budget)) - const, ties=tie_idx, time_limit=time_limit)
    if sol.status == "infeasible" or sol.choice[0] < 0:
        return None
    chosen = {n: int(offsets[sol.choice[i]]) for i, n in enumerate(qnames)}
    rules = tuple(LayerRule(n, "offset", k) for n, k in chosen.items() if k != 0)
    ls = LayerSchedule(rules, workload.model)
    resolved = ls.resolve(base, qnames, [n for n in names if n not in pos], workload.model) if rules else \
        ResolvedLayers(base, {}, ls)
    i0 = list(offsets).index(0) if 0 in offsets else None
    return LayerPlan(base=base, resolved=resolved, score=sol.value,
                     uniform_score=float(sc[i0]) if i0 is not None else float("nan"),
                     cost=float(Fraction(float(sol.cost)) + const),
                     solution=sol, offsets=chosen, menu=tuple(offsets),
                     weights={n: float(x) for n, x in zip(qnames, w)}, ties=tie_names)


def refine(p, weights: dict | None = None, k: int = 3, offsets=DEFAULT_OFFSETS, ties: list | None = None):
    """Per-layer plans around the uniform planner's best candidates (``planner.select.Plan`` ``p``): the ``k`` best
    scoring schedules within the budget and the ``k`` best just above it (up to 1.5x: some layers may drop bits to
    fit), each solved by ``plan_layers``. Returns (the best LayerPlan, or None when the uniform choice ranks first,
    and every one tried as rows for the plan's comparison).

    The ranking: by score (the sensitivity-weighted proxy; the uniform choice by its own score), unless the plan was
    made with ``--quality db`` and its model was fitted (``p.quality_model``): then, as the uniform path does, the
    model re-orders the plans that lie inside its measured range (``quality.plan_bits`` features: the per-layer
    plan's bits weighted by the layers' MACs, or by ``weights`` when a sensitivity was measured -- the model is then
    refitted with the measured per-layer runs weighted so too, ``_refit`` -- and its exact BitOPs) among the places
    the proxy gives them, and a plan outside it keeps its proxy place and gets no prediction."""

    cands, metric = p.candidates, p.metric
    cost = np.asarray(cands.cost[COST_KEYS[metric]])
    score = np.asarray(cands.score)
    limit = p.budget_absolute
    order = np.argsort(-score, kind="stable")
    inside = [int(i) for i in order if cost[i] <= limit][:k]
    above = [int(i) for i in order if limit < cost[i] <= 1.5 * limit][:k]
    # the space's bounds hold per layer too: no layer below its lowest q_min (or --min-bits) nor above its highest
    # q_max (or --max-bits)
    space = p.space
    min_bits = max(space.min_bits or 1, space.q_min_range[0])
    max_bits = min(space.max_bits or 16, space.q_max_range[1])
    rows, plans = [], []
    for i in dict.fromkeys(inside + above):
        base = cands.schedules[i]
        lp = plan_layers(p.workload, p.hardware, base, metric, limit, weights, offsets, ties, min_bits, max_bits,
                         cands=cands)
        rows.append({"base": base.to_text(), "uniform_score": float(score[i]), "uniform_cost": float(cost[i]),
                     "per_layer_score": None if lp is None else lp.score,
                     "per_layer_cost": None if lp is None else lp.cost,
                     "solver": None if lp is None else lp.solution.to_json()})
        if lp is not None:
            plans.append((lp, rows[-1]))
    # the pool: the uniform choice (None) and each plan, by proxy score (ties: the uniform choice, then the first)
    pool = [(None, p.score)] + [(lp, lp.score) for lp, _ in plans]
    ranked = sorted(range(len(pool)), key=lambda j: (-round(pool[j][1], 12), j))
    model = getattr(p, "quality_model", None)
    if model is not None:
        from .quality import plan_bits

        base_bitops = float(p.baseline.bitops["total"])
        if weights and getattr(model, "measured", None) is not None:
            model = _refit(p, model, weights, base_bitops)
        X = np.array([plan_bits(p.workload, p.schedule if lp is None else lp.base,
                                None if lp is None else lp.resolved, base_bitops, p.hardware,
                                weights).features(model.floor)
                      for lp, _ in pool])
        mean, std = model.predict(X)
        ok = model.in_range(X)
        for j, (lp, _) in enumerate(pool):
            pred = {"predicted": float(mean[j]) if ok[j] else None, "predicted_std": float(std[j]) if ok[j] else None,
                    "extrapolated": not bool(ok[j]), "features": dict(zip(("score", "mean_bits", "cost_rel",
                                                                           "above_floor"), map(float, X[j])))}
            if lp is None:
                p.quality["uniform_choice_prediction"] = pred
            else:
                lp.predicted = pred
                plans[j - 1][1].update(pred)
        slots = [pos for pos, j in enumerate(ranked) if ok[j]]
        by_model = sorted((j for j in ranked if ok[j]), key=lambda j: (-round(float(mean[j]), 12), ranked.index(j)))
        for pos, j in zip(slots, by_model):
            ranked[pos] = j
    best = pool[ranked[0]][0]
    if best is not None:
        best.ranked_by = "db" if model is not None and best.predicted and not best.predicted["extrapolated"] \
            else "proxy"
    return best, rows


def _refit(p, model, weights: dict, base_bitops: float):
    """The --quality db model refitted with the measured per-layer runs' layers weighted by the sensitivity the MILP
    maximises (``quality.plan_bits`` weights; uniform runs' features do not change); recorded in the plan's quality
    section as ``per_layer_model``. The MAC-weighted model when the refit has too few schedules."""
    from .quality import fit_quality, measured_features

    X, floor, _ = measured_features(model.measured, p.workload, p.hardware, base_bitops, weights)
    keep = np.all(np.isfinite(X), axis=1)
    names = [e for e, k in zip(model.measured.entries, keep) if k]
    again = fit_quality(names, X[keep], np.asarray(model.measured.values)[keep])
    if again is None:
        return model
    again.floor, again.measured = floor, model.measured
    if isinstance(p.quality, dict):
        p.quality["per_layer_model"] = again.to_json() | {"layers_weighted_by": "sensitivity"}
    return again


def _predicted_note(p, lp, section: dict) -> str:
    """", predicted validation accuracy (or loss) A vs B uniform by --quality db" for the plan's note."""
    lm = ((p.quality or {}).get("measure") or {}).get("key") == "val_loss"  # the model fits minus the loss
    sign, what = (-1.0, "validation loss") if lm else (1.0, "validation accuracy")
    uni = (section.get("uniform_prediction") or {}).get("predicted")
    return (f", predicted {what} {sign * lp.predicted['predicted']:.4f} vs "
            f"{sign * uni if uni is not None else float('nan'):.4f} uniform by --quality db")


def plan_doc_with_layers(doc: dict, p, lp, rows: list, weights_from: str) -> dict:
    """plan.json with the per-layer plan: ``layers`` (the rules; ``cptsim train --plan`` resolves them again on
    the model), its estimate re-costed per layer, and ``per_layer`` (solver, gap, time, the comparison)."""

    section = {"chosen": lp is not None, "weights_from": weights_from, "uniform_score": p.score,
               "candidates": rows}
    by_db = getattr(p, "quality_model", None) is not None
    if by_db:  # --quality db: the model's prediction for the uniform choice, which the plans were ranked against
        section["uniform_prediction"] = (p.quality or {}).get("uniform_choice_prediction")
    if lp is None:
        section["why"] = ("no per-layer plan ranked above the best uniform schedule within the budget (by the "
                          "quality model where inside its measured range, else by the score)" if by_db else
                          "no per-layer plan scored above the best uniform schedule within the budget")
        doc["per_layer"] = section
        return doc
    w = p.workload
    est = w.estimate(lp.base, p.hardware, per_layer=True) if not lp.resolved.layers else None
    from cptsim.cost.model import estimate

    est = est or estimate(w.profile, lp.base, p.hardware, steps=w.steps, batch_size=w.batch_size,
                          dataset_size=w.dataset_size, layers=lp.resolved, static_bits=p.baseline_schedule.q_max,
                          formats=getattr(w, "formats", None))
    from .select import _cost_json, evaluation_json

    base_total = p.baseline.bitops["total"]
    e = doc["estimate"]
    # every figure of the estimate is the per-layer plan's (none left over from the uniform pick it replaces)
    e.update(_cost_json(est, p.baseline))
    e.update({"relative_to_static": est.bitops["total"] / base_total, "score": lp.score,
              "mean_bits": float(lp.base.bits(w.steps).mean()), "per_layer": est.per_layer})
    doc["evaluation"] = evaluation_json(lp.base, w.steps)
    key = COST_KEYS[p.metric]
    total = est.bitops["total"] if key == "bitops" else getattr(est, key)["total"]
    e["budget_fraction"] = total / p.budget_absolute
    doc["schedule"] = lp.base.to_json() | {"text": lp.base.to_text()}
    doc["layers"] = lp.resolved.to_json()
    section.update(lp.to_json())
    doc["per_layer"] = section
    doc.setdefault("notes", []).append(
        f"per-layer plan: {lp.base.to_text()} with {len(lp.resolved.layers)} layer(s) offset "
        f"({lp.resolved.rules.to_text() or 'none'}), score {lp.score:.4f} vs {p.score:.4f} uniform"
        + (_predicted_note(p, lp, section) if lp.ranked_by == "db" else "") + "; MILP "
        f"{lp.solution.status}, gap {lp.solution.gap:.2g}, {lp.solution.time_s:.3f} s")
    return doc

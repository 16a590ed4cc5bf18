"""A sweep's statistics: ``sweep_report(rows)`` summarises results rows of one workload: per schedule the mean and
spread of accuracy over seeds, its cost relative to static q_max, the planner's proxy score, and the Spearman rank
correlation between score and measured mean accuracy over schedules, with its seed spread (the correlation computed
per seed). For a language model (rows whose extra holds test_ppl) the measure is test perplexity instead - lower is
better, so the correlation is with minus the perplexity - and the report's ``measure`` says which.
"""

from __future__ import annotations

import math
from typing import Callable

from cptsim.errors import InputError

from .sweepspec import ENTRY_SEP

REPORT_FORMAT = "cptsim.sweep-report/1"


def row_layers(row: dict) -> str | None:
    """A results row's layer rules (a per-layer run; ``extra["layers"]``), None for a uniform run."""
    return (row.get("extra") or {}).get("layers") or None


def row_entry(row: dict) -> str:
    """The sweep entry a results row ran: its schedule, with ``@RULES`` for a per-layer run."""
    rules = row_layers(row)
    return row["schedule"] if rules is None else f"{row['schedule']}{ENTRY_SEP}{rules}"


def _std(xs: list[float]) -> float:
    """Sample standard deviation (ddof 1); 0 for one value."""
    n = len(xs)
    if n < 2:
        return 0.0
    m = sum(xs) / n
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))


def _spearman(x: list[float], y: list[float]) -> tuple[float | None, float | None]:
    from scipy.stats import spearmanr

    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return None, None
    r = spearmanr(x, y)
    rho, p = float(r.statistic if hasattr(r, "statistic") else r[0]), float(r.pvalue if hasattr(r, "pvalue") else r[1])
    return (None, None) if math.isnan(rho) else (rho, p)


def sweep_report(rows: list[dict], score_fn: Callable[[str, int], float] | None = None) -> dict:
    """Summarise results rows of ONE workload (see the module docstring for what is computed).

    ``score_fn(schedule_text, total_steps)``: the score to correlate; default the planner's current proxy score
    (``cptsim.study.results.proxy_score``), so a revised score is judged on old runs without re-training. Accuracy
    spread is the sample standard deviation over seeds (ddof 1; 0 for one seed). Cost is BitOPs relative to the
    costliest static baseline among the rows (static q_max of the schedule with the highest q_max), so every
    schedule sits on one axis."""
    from .results import proxy_score, score_name
    from cptsim.cost.schedules import parse_schedule

    if not rows:
        raise InputError("no finished runs to report on")
    keys = {r["workload_key"] for r in rows}
    if len(keys) > 1:
        raise InputError(f"the rows hold {len(keys)} workloads ({', '.join(sorted(keys))}); pick one with --workload")
    if score_fn is None:
        def score_fn(text, steps):
            return proxy_score(parse_schedule(text), steps)
    uniform = [r for r in rows if not row_layers(r)] or rows  # the cost axis: uniform statics where there are any
    statics = [(r["bitops_static"], r["q_max"], r["g_max"]) for r in uniform if r.get("bitops_static")]
    ref = max(statics) if statics else None
    by_sched: dict[str, list[dict]] = {}
    for r in rows:
        by_sched.setdefault(row_entry(r), []).append(r)
    # A language model's measure is its test perplexity (lower is better; test_acc is next-token accuracy)
    lm = all(isinstance((r.get("extra") or {}).get("test_ppl"), (int, float)) for r in rows)
    table = []
    for text, rs in by_sched.items():
        rs = sorted(rs, key=lambda r: r["seed"])
        accs = [float(r["test_acc"]) for r in rs]
        costs = [r["bitops"] / ref[0] for r in rs if ref and r.get("bitops") is not None]
        steps = rs[0]["steps"]
        rules = row_layers(rs[0])
        table.append({
            "schedule": text, "family": rs[0]["family"] + (" per-layer" if rules else ""),
            "layers": rules, "n": len(rs), "seeds": [r["seed"] for r in rs],
            "acc_mean": sum(accs) / len(accs), "acc_std": _std(accs), "accs": accs,
            "eval_bits": sorted({r.get("eval_bits") for r in rs if r.get("eval_bits") is not None}),
            "cost_rel": (sum(costs) / len(costs)) if costs else None,
            "bitops": sum(r["bitops"] for r in rs if r.get("bitops") is not None) / len(rs) if ref else None,
            # the proxy score rates a uniform schedule; a per-layer plan has none (left out of the correlation)
            "score": None if rules else float(score_fn(text, steps)),
            "runs": [r.get("run_path") for r in rs],
        })
        if lm:
            ppls = [float(r["extra"]["test_ppl"]) for r in rs]
            table[-1].update({"ppl_mean": sum(ppls) / len(ppls), "ppl_std": _std(ppls), "ppls": ppls})
            bpcs = [r["extra"].get("test_bpc") for r in rs]
            if all(isinstance(b, (int, float)) for b in bpcs):
                table[-1]["bpc_mean"] = sum(bpcs) / len(bpcs)
    table.sort(key=lambda t: (t["cost_rel"] if t["cost_rel"] is not None else math.inf, t["schedule"]))

    # the correlation is with "better": accuracy, or minus the perplexity
    mean_key, seeds_key, sign = ("ppl_mean", "ppls", -1.0) if lm else ("acc_mean", "accs", 1.0)
    scored = [t for t in table if t["score"] is not None]
    rho, p = _spearman([t["score"] for t in scored], [sign * t[mean_key] for t in scored])
    per_seed = {}
    for seed in sorted({s for t in scored for s in t["seeds"]}):
        pts = [(t["score"], sign * t[seeds_key][t["seeds"].index(seed)]) for t in scored if seed in t["seeds"]]
        r_s, _ = _spearman([a for a, _ in pts], [b for _, b in pts])
        if r_s is not None:
            per_seed[str(seed)] = r_s
    vals = list(per_seed.values())
    notes = []
    if rho is None:
        notes.append("no rank correlation: it needs at least 3 schedules whose scores and "
                     f"{'perplexities' if lm else 'accuracies'} are not all equal")
    costs = [t["cost_rel"] for t in table if t["cost_rel"] is not None]
    return {
        "format": REPORT_FORMAT,
        "workload_key": next(iter(keys)), "workload": rows[0].get("workload"),
        "runs": len(rows), "schedules": table,
        "cost_reference": ({"schedule": f"static:{ref[1]}:g{ref[2]}", "bitops": ref[0]} if ref else None),
        "cost_range": [min(costs), max(costs)] if costs else None,
        "score_name": score_name(),
        "measure": ({"key": "ppl", "name": "test perplexity", "higher_is_better": False} if lm else
                    {"key": "acc", "name": "test accuracy", "higher_is_better": True}),
        "spearman": {"rho": rho, "p_value": p, "n_schedules": len(scored),
                     "per_seed": per_seed, "per_seed_mean": (sum(vals) / len(vals)) if vals else None,
                     "per_seed_std": _std(vals) if vals else None,
                     "what": "Spearman rank correlation between the proxy score and "
                             + ("minus the mean test perplexity (a language model: lower is better)" if lm else
                                "the mean test accuracy")
                             + " over schedules; per seed: the same over the schedules run with that seed"},
        "notes": notes,
    }

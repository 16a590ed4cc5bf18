"""plan.json: the one place that writes, reads and validates a plan file (format cptsim.plan/1).

The planner assembles the document (``planner.search.Plan.to_json``); every read and write goes through here. It
sits in run/, beside the run's config, because both sides need it: the planner writes a plan, and a run reads the plan
it trains (``cptsim.planner.planfile`` re-exports it), so that run/ never imports the planner.

A plan records everything needed to (1) reproduce the planned training exactly (`workload` + `schedule`) and
(2) compare a finished run against what was promised (`estimate`, `baseline`, `profile`, `hardware`):

    {"format": "cptsim.plan/1", "created": ISO time, "cptsim_version": "0.1.0",
     "workload": {"model", "dataset", "data_dir", "batch_size", "steps", "epochs" (null when planned by steps),
                  "dataset_size" (samples per epoch: the ragged last batch is costed exactly), "input_shape",
                  "num_classes", "fp_layers" (resolved layer names), "lr", "lr_schedule", "momentum",
                  "weight_decay", "seed", "augment"},
     "hardware": {"name", "kind", "hash", "path"},
     "budget": {"metric", "value", "unit", "spec"}, "budget_absolute": float (base units: bitops, J or s),
     "budget_text": "65% of the static-q_max BitOPs",
     "space": {...SearchSpace.to_json()}, "candidates": int (how many were searched),
     "score": {"name": "early-weighted-fidelity/1", "definition", "params": {"alpha", "tau0"}, "help"},
     "ranking": "proxy" (by the score) | "pilot" (by measured accuracy, see "pilot"),
     "schedule": {"name", "q_min", "q_max", "g_min", "g_max", "cycles", "text"},
     "estimate": {"bitops": {"fwd", "dgrad", "wgrad", "total"}, "energy_j": float (total), "latency_s": float,
                  "relative_to_static": float (BitOPs / the baseline's), "score": float,
                  "budget_fraction": float (cost on the budget's metric / budget_absolute, <= 1),
                  "vs_baseline": {"bitops", "energy_j", "latency_s"} (ratios to the baseline), "mean_bits",
                  "macs": {"fwd", "dgrad", "wgrad", "total"}, "steps", "samples",
                  "per_phase": {"energy_j": {...}, "latency_s": {...}}, "per_layer": [Cost.per_layer rows]},
     "baseline": {"schedule": text (static at the space's largest q_max), "bitops": {"total", ...},
                  "energy_j": float, "latency_s": float, "score", "macs", "per_phase", "steps", "samples"},
     "alternatives": [{"rank", "role": "chosen" | "alternative" | "cheapest", "schedule": text, "name", "cycles",
                       "q_min", "q_max", "mean_bits", "score", "bitops": float, "energy_j", "latency_s",
                       "budget_fraction", "vs_baseline" (on the budget's metric), "within_budget", "cheapest"}],
     "frontier": {"metric", "cost_key", "points": [{"schedule", "cost", "vs_baseline", "score", "within_budget"}]}
                 (the Pareto frontier of cost on the budget's metric vs score over all candidates, cheapest first),
     "notes": [text] (budget used, above-static fallback, why a metric does not fall with bits, hardware notes),
     "pilot": null | {"k", "method", "measure", "first_steps", "winner", "dir",
                      "rounds": [{"round", "steps", "kept": [text], "runs": [{"schedule", "proxy_rank",
                                  "proxy_score", "steps", "test_acc", "eval_bits", "train_loss", "time_s",
                                  "run_dir"}]}]},
     "range_test": null | {...cptsim.rangetest/1 document, when --min-bits auto chose q_min},
     "timings": {"profile_s", "evaluate_s", "select_s"},
     "profile": {...profile.json document}}

Only the keys in REQUIRED are checked when reading; anything else may be added freely (never renamed without
bumping the format).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from cptsim.errors import InputError

__all__ = ["PLAN_FORMAT", "REQUIRED", "validate_plan", "read_plan", "write_plan", "plan_digest", "looks_like_plan",
           "run_baseline", "run_records"]

PLAN_FORMAT = "cptsim.plan/1"

REQUIRED = {
    "workload": ("model", "dataset", "batch_size", "steps"),
    "hardware": ("name", "hash"),
    "budget": ("metric", "value", "unit", "spec"),
    "schedule": ("name", "q_min", "q_max", "g_min", "g_max", "cycles"),
    "estimate": ("bitops", "energy_j", "latency_s", "relative_to_static"),
    "baseline": ("bitops",),
}


def validate_plan(plan: Any, where: str = "plan") -> dict:
    """Check a plan document's format and required keys; InputError naming the first problem."""
    if not isinstance(plan, dict):
        raise InputError(f"{where}: not a JSON object")
    fmt = plan.get("format")
    if fmt != PLAN_FORMAT:
        if isinstance(fmt, str) and fmt.startswith("cptsim.plan/"):
            raise InputError(f"{where}: plan format {fmt!r} is not supported by this cptsim (reads {PLAN_FORMAT})")
        raise InputError(f"{where}: not a cptsim plan (format {fmt!r}, expected {PLAN_FORMAT!r})")
    for section, keys in REQUIRED.items():
        body = plan.get(section)
        if not isinstance(body, dict):
            raise InputError(f"{where}: missing section {section!r}")
        for k in keys:
            if k not in body:
                raise InputError(f"{where}: {section}.{k} is missing")
    from cptsim.cost.schedules import Schedule

    Schedule.from_json(plan["schedule"])  # raises InputError on bad bits / names
    steps, batch = plan["workload"]["steps"], plan["workload"]["batch_size"]
    for name, v in (("workload.steps", steps), ("workload.batch_size", batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"{where}: {name} must be a positive integer, got {v!r}")
    return plan


def read_plan(path: str | Path) -> dict:
    """Load and validate a plan file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InputError(f"{p}: cannot read plan ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise InputError(f"{p}: not a plan file (not UTF-8 text)") from None
    try:
        plan = json.loads(text)
    except ValueError as e:
        raise InputError(f"{p}: not valid JSON ({e})") from None
    return validate_plan(plan, str(p))


def write_plan(plan: dict, path: str | Path) -> None:
    """Validate, then write atomically (a kill leaves the old file or the new one)."""
    from cptsim.fileio import atomic_write_json

    validate_plan(plan, str(path))
    atomic_write_json(Path(path), plan)


def plan_digest(plan: dict) -> str:
    """Short content hash of a plan (recorded in a run's config so a report can tell which plan it ran)."""
    return hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()[:16]


def looks_like_plan(path: str | Path) -> bool:
    """Whether ``path`` is a JSON document of the plan format (any version): for telling a user who gave a plan
    where something else belongs what they gave. Nothing else is checked."""
    try:
        fmt = json.loads(Path(path).read_text()).get("format")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(fmt, str) and fmt.split("/")[0] == PLAN_FORMAT.split("/")[0]


def run_baseline(schedule, plan: dict | None = None) -> dict:
    """What a run's savings are measured against (config.json "baseline"): {"bits", "grad_bits" (None: each step's
    own), "label", "source"}.

    A run of a plan is measured against the plan's baseline (plan.json ``baseline.schedule``: static at the space's
    largest q_max, its highest gradient bits), so that the report's saving is the saving the plan promised: a plan
    that picked cos-tri:3-4 under a 60% budget saved 40% against static 8, not 3% against static 4 (the q_max of
    what it ran). A run without a plan (or of a plan written before it named its baseline) is measured against
    static q_max of its own schedule with its own gradient bits, and says so."""
    from cptsim.cost.model import baseline_label
    from cptsim.cost.schedules import Schedule, parse_schedule

    text = ((plan or {}).get("baseline") or {}).get("schedule")
    if isinstance(text, str):
        try:
            b = parse_schedule(text)
        except InputError:
            b = None
        if b is not None and b.q_min == b.q_max and b.g_min == b.g_max:
            return {"bits": int(b.q_max), "grad_bits": int(b.g_max), "label": baseline_label(b.q_max, b.g_max),
                    "schedule": b.to_text(), "source": "the plan's baseline"}
    s = schedule if isinstance(schedule, Schedule) else Schedule.from_json(schedule)
    return {"bits": int(s.q_max), "grad_bits": None, "label": baseline_label(s.q_max, None), "schedule": None,
            "source": "static q_max of the run's schedule (no plan)"}


def run_records(schedule, plan: dict | None = None) -> dict:
    """What config.json records of a new run's plan: "plan" (the plan it executes: digest, schedule, budget; absent
    without one) and "baseline" (what the report measures its savings against: ``run_baseline``)."""
    out = {} if plan is None else {"plan": {"digest": plan_digest(plan), "schedule": plan["schedule"],
                                            "budget": plan.get("budget")}}
    return {**out, "baseline": run_baseline(schedule, plan)}

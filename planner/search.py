"""The planner's former single module, kept so that ``from cptsim.planner.search import X`` keeps working.

The code lives in rooms named for what they hold: ``workload`` (Workload), ``evaluate`` (candidate costs and
scores, the fast path), ``select`` (budget semantics, Plan, ``plan``), ``pilot`` (short real runs), ``planfile``.
"""

from .evaluate import COST_KEYS, METRIC_NAMES, Candidates, evaluate, step_cost_tables
from .pilot import run_pilot
from .select import Plan, baseline_schedule, flat_note, metric_levels, plan, range_settings, select
from .workload import Workload

__all__ = ["Workload", "Candidates", "Plan", "plan", "evaluate", "select", "run_pilot", "step_cost_tables",
           "baseline_schedule", "flat_note", "metric_levels", "range_settings", "COST_KEYS", "METRIC_NAMES"]

"""The planner: budgets, the schedule search space, the quality score, the search, and the plan file.

``from cptsim.planner import plan``: plan(workload, hardware, budget, space) -> Plan (see planner/search.py).
"""

from .search import Plan, Workload, plan

__all__ = ["Plan", "Workload", "plan"]

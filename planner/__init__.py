"""The planner: budgets, the schedule search space, the quality score, the search, and the plan file.

``from cptsim.planner import plan``: plan(workload, hardware, budget, space) -> Plan. Modules: ``workload``
(what is trained), ``evaluate`` (every candidate's cost and score), ``select`` (the pick under a budget, the Plan),
``pilot`` (short real runs), ``planfile`` (plan.json), ``budget``, ``space``, ``score``.
"""

from .select import Plan, plan
from .workload import Workload

__all__ = ["Plan", "Workload", "plan"]

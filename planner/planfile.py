"""plan.json's reader and writer, under the planner's name: they live in ``cptsim.run.planfile`` (a run reads the plan
it trains, and run/ may not import the planner), re-exported here for scripts that import them from the planner."""

from cptsim.run.planfile import *  # noqa: F401,F403
from cptsim.run.planfile import __all__  # noqa: F401

"""``from cptsim.schedules import make_schedule`` as DESIGN's public API names it: a re-export of ``cptsim.cost.schedules``.

The code lives in ``cptsim/cost/schedules`` since the layout became one package per stage; this module keeps
users' imports working. Nothing inside cptsim imports it (tests/test_layout.py checks).
"""

from cptsim.cost.schedules import *  # noqa: F401,F403
from cptsim.cost.schedules import __all__  # noqa: F401

"""``from cptsim.profiler import profile_model`` as DESIGN's public API names it: a re-export of ``cptsim.measure.profiler``.

The code lives in ``cptsim/measure/profiler`` since the layout became one package per stage; this module keeps
users' imports working. Nothing inside cptsim imports it (tests/test_layout.py checks).
"""

from cptsim.measure.profiler import *  # noqa: F401,F403
from cptsim.measure.profiler import __all__  # noqa: F401

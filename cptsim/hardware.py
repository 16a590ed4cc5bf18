"""``from cptsim.hardware import load_profile`` as DESIGN's public API names it: a re-export of ``cptsim.cost.hardware``.

The code lives in ``cptsim/cost/hardware`` since the layout became one package per stage; this module keeps
users' imports working. Nothing inside cptsim imports it (tests/test_layout.py checks).
"""

from cptsim.cost.hardware import *  # noqa: F401,F403
from cptsim.cost.hardware import __all__  # noqa: F401

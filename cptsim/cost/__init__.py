"""cost/: what a schedule costs on a hardware (schedules x profile x hardware -> Cost).

- ``schedules``: the schedule formulas (bits per step, vectorised);
- ``runlength``: how a run's steps split into batches (steps per epoch, each epoch's ragged last batch);
- ``formulas``: the per-layer formulas of one step every hardware shares (operand widths, BitOPs, bytes moved,
  quantizer passes);
- ``model``: the cost model, ``estimate(layer_profile, schedule_or_trace, hardware, steps=...) -> Cost``; the one
  function plan, train and report all cost through;
- ``hardware/``: the hardware profiles, one module per kind (gpu, bit-fusion, bit-serial, fixed-int, host), each
  pricing a whole step of its kind (``HardwareProfile.price_step``), and the TOML reader.

``from cptsim.cost import estimate`` is the public entry (DESIGN's API).
May import: ``cptsim.errors``, ``cptsim.fileio``, ``cptsim.numerics``, ``cptsim.models``, ``cptsim.data``,
``cptsim.measure``. Never the training loop, the planner or anything later.
"""

from .model import *  # noqa: F401,F403
from .model import __all__  # noqa: F401

"""measure/: what a training step executes, measured (the profile of the data flow).

- ``profiler``: per-layer MACs of real quantized training steps (``profile_model`` -> ``LayerProfile``), counted
  by a table from module type to counting function (``COUNTERS``);
- ``opcount``: the step's op list (every kernel: GEMMs and the memory-bound rest) for the GPU time model;
- ``energy``: NVML energy readings.

May import: ``cptsim.errors``, ``cptsim.fileio``, ``cptsim.numerics``, ``cptsim.models``, ``cptsim.data``.
"""

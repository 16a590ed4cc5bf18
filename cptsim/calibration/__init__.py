"""calibration/: hardware profiles fitted to measurements (after the runs, before the report that uses them).

- ``calibrate``: ``cptsim hw calibrate``, the host's (and a CUDA GPU's) measured rates -> a profile;
- ``gpu``: the GPU profiles' efficiencies fitted to published training throughput;
- ``fit``: a profile's factors fitted to measured runs (``report --fit``);
- ``autocal``: the host profile measured once and cached, for reports of runs on this machine.

May import everything below it: errors, fileio, numerics, models, data, measure, cost, planner, run.
"""

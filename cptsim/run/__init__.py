"""run/: the run that executes a plan, and everything that makes it safe and usable.

- ``config``: ``TrainConfig`` and ``validate`` (the one piece of this package the planner may import);
- ``train``: the quantized training loop, read top to bottom;
- ``rundir``: the run directory, the one place that reads and writes its files, and its lock;
- ``dist``: data parallel (torchrun) and elastic restarts; ``cudagraph``: CUDA-graph replay of a step;
- ``api``: ``PrecisionScheduler`` and ``RunRecorder`` for users' own loops; ``tensorboard``;
  ``integrations/``: PyTorch Lightning.

May import: errors, fileio, numerics, models, data, measure, cost, planner (the plan file).
"""

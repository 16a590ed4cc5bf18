"""cptsim: plan, run and cost cyclic-precision training."""

__version__ = "0.1.0"

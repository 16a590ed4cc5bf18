"""cptsim: plan, run and cost cyclic-precision training."""

__version__ = "0.1.0"

# The API for your own training loop (cptsim.run.api). Imported on first use, so that `import cptsim` (and the CLI,
# which imports it) does not load torch before it needs it.
_LAZY = {
    "quantize_model": ("cptsim.numerics.layers", "quantize_model"),
    "PrecisionState": ("cptsim.numerics.layers", "PrecisionState"),
    "PrecisionScheduler": ("cptsim.run.api", "PrecisionScheduler"),
    "RunRecorder": ("cptsim.run.api", "RunRecorder"),
    "make_schedule": ("cptsim.cost.schedules", "make_schedule"),
    "parse_schedule": ("cptsim.cost.schedules", "parse_schedule"),
}
__all__ = ["__version__", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'cptsim' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))

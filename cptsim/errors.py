"""The one exception type that means "the user gave us bad input" (CLI exit code 2, one line, no traceback)."""


class InputError(ValueError):
    """Bad input from the user: a name, a flag value, a file. The message is shown as-is on one line."""


class RunFailed(RuntimeError):
    """A run stopped for a reason the user must act on (e.g. the loss diverged). One line, exit code 1."""


class RunStopped(Exception):
    """A run stopped on request (SIGINT / SIGTERM) after saving a checkpoint. Exit code 130."""

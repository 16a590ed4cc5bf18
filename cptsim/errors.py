"""The one exception type that means "the user gave us bad input" (CLI exit code 2, one line, no traceback)."""


class InputError(ValueError):
    """Bad input from the user: a name, a flag value, a file. The message is shown as-is on one line."""

"""What every command shares: JSON output, the consoles, and the exit-code contract."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console

# Tables for people go to stdout; progress bars and notes go to stderr so `--json` stdout stays one document.
out = Console()
err = Console(stderr=True)


def emit_json(obj: Any) -> None:
    """Write exactly one JSON document to stdout."""
    click.echo(json.dumps(obj, indent=2, default=_jsonable))


def _jsonable(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout instead of tables.")


def die(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)

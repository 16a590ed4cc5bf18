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

_WIDE = "cptsim.wide"
ELLIPSIS = "…"


def _wide_flag(ctx, param, value):
    ctx.meta[_WIDE] = bool(value)
    return value


wide_option = click.option("--wide", is_flag=True, expose_value=False, callback=_wide_flag,
                           help="Every table column, however wide the terminal [default: columns that do not fit "
                                "are left out, and a line says which].")


def print_table(table, drop: tuple = (), wrap: tuple[str, ...] = ()) -> list[str]:
    """Print a table for people without cutting any cell to "…" (a name cut to "bitfu…" says nothing).

    Cells stay on one line except in the ``wrap`` columns (prose). When the table does not fit the terminal, the
    ``drop`` columns (by header, least needed first) are left out until it does, and a line says which; with
    ``--wide`` (``wide_option``) every column is printed at its full width. Returns the headers left out."""
    import io

    def render(width: int) -> str:
        probe = Console(width=width, file=io.StringIO(), color_system=None, legacy_windows=False)
        probe.print(table)
        return probe.file.getvalue()

    for col in table.columns:
        col.no_wrap = str(col.header) not in wrap
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.meta.get(_WIDE):  # meta is shared by every context of one invocation
        natural = max(len(line.rstrip()) for line in render(10_000).splitlines())
        # Console.print never goes past the console's own width: a console as wide as the table, same stdout
        (Console(width=natural) if natural > out.width else out).print(table, crop=False)
        return []

    def cut() -> bool:
        return ELLIPSIS in render(out.width)

    left_out = []
    for group in drop:  # a header, or a tuple of headers that go together (E plan and t plan)
        if not cut():
            break
        for header in (group,) if isinstance(group, str) else group:
            i = next((i for i, c in enumerate(table.columns) if str(c.header) == header), None)
            if i is not None:
                table.columns.pop(i)
                left_out.append(header)
    out.print(table)
    if left_out:
        out.print(f"  (left out to fit {out.width} columns: {', '.join(left_out)}; --wide shows them)",
                  style="dim", highlight=False)
    return left_out


def die(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def si(x: float | None, unit: str = "") -> str:
    """1.024e12 -> '1.02 T' (+unit); None -> '-'."""
    if x is None:
        return "-"
    for factor, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g} {prefix}{unit}"
    if x and abs(x) < 1:
        for factor, prefix in ((1e-3, "m"), (1e-6, "µ"), (1e-9, "n"), (1e-12, "p")):
            if abs(x) >= factor:
                return f"{x / factor:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}".rstrip()


def parse_fp_layers(text: str | None) -> list[str] | None:
    """--fp-layers: None = the model's convention, "none" = quantize every layer, else comma-separated globs."""
    if text is None:
        return None
    if text.strip().lower() == "none":
        return []
    return [p.strip() for p in text.split(",") if p.strip()]


def check_output_file(flag: str, path):
    """A file a command will write: its directory must exist and it must not be a directory (checked before work)."""
    from pathlib import Path

    from cptsim.errors import InputError

    p = Path(path)
    if p.is_dir():
        raise InputError(f"{flag} names a directory, not a file: {p}")
    if not p.parent.is_dir():
        raise InputError(f"{flag} {p}: directory {str(p.parent)!r} does not exist")
    return p

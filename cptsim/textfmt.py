"""Numbers in text for people: one SI formatter for the CLI's tables, the figures' labels and ``print(Cost)``."""

from __future__ import annotations


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

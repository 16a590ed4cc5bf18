"""Schedules over number formats: a format *family* maps the width a schedule gives each step to
a format of the registry (``cptsim.numerics.formats``). Pure functions, no state.

A schedule still yields a width per step (forward bits q, gradient bits g, 1..16 or 32). ``--number-format``
picks the family that turns widths into formats:

=========  ==================================================================================================
family     width -> format
=========  ==================================================================================================
``int``    ``int<b>``: today's CPT integers, every width its own format (the default; costs are today's, unchanged)
``fp``     1..4 -> ``fp4e2m1``, 5..6 -> ``fp6e3m2``, 7..8 -> ``fp8e4m3`` (per-tensor FP32 scale)
``mx``     1..4 -> ``mxfp4``, 5..6 -> ``mxfp6`` (E3M2), 7..8 -> ``mxfp8`` (E4M3) (E8M0 scale per 32 elements)
``nvfp``   1..4 -> ``nvfp4``, 5..8 -> ``fp8e4m3`` (the per-tensor FP8 that NVIDIA's NVFP4 recipe keeps beside NVFP4:
           the family has one format, so a wider width takes the next format up)
=========  ==================================================================================================

and in every float family 9..16 -> ``bf16`` and 17..32 -> ``fp32`` (32 = full precision, as for integers).

**A width the family lacks** (5 or 7 in ``mx``, 3 in ``fp``) means the *next wider* format of the family: it never
runs narrower than the schedule asked, so it is never cheaper than asked either. ``fp6e3m2`` (not E2M3) is the
6-bit pick for range, as ``mxfp6`` picks E3M2; name ``fp6e2m3`` / ``mxfp6e2m3`` through ``--grad-format`` or
the registry to get the other one.

**The gradient format** (``--grad-format NAME``, a float format of the registry, e.g. ``fp8e5m2`` or ``mxfp8``)
is the format of every gradient (error) operand at a step whose gradient width g is below 32, whatever g is;
without it gradients map through the family like the forward operands. It needs a float family: with
``int`` (the default) it is refused, as is an integer format named as the gradient format.

``format_map(family, grad_format)`` returns None for the integer family without a gradient format (every caller
then runs today's code, bit for bit), else a ``FormatMap``: per width 0..32, the forward and the gradient
format's name, element bits (what BitOPs count: ``cptsim.cost.model``) and storage bits (scales amortised: what
memory traffic counts: MXFP4 4.25, NVFP4 4.5).

May import: ``cptsim.errors``, ``cptsim.numerics.formats`` (first stage; see tests/test_layout.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cptsim.errors import InputError
from cptsim.numerics.formats import Format, parse_format

__all__ = ["FAMILIES", "FLOAT_FAMILIES", "family_format", "FormatMap", "format_map"]

FAMILIES = ("int", "fp", "mx", "nvfp")
FLOAT_FAMILIES = ("fp", "mx", "nvfp")
MAX_WIDTH = 32

# the family's own formats by width (a width not listed takes the next wider one listed)
_LADDER: dict[str, tuple[tuple[int, str], ...]] = {
    "fp": ((4, "fp4e2m1"), (6, "fp6e3m2"), (8, "fp8e4m3"), (16, "bf16"), (32, "fp32")),
    "mx": ((4, "mxfp4"), (6, "mxfp6"), (8, "mxfp8"), (16, "bf16"), (32, "fp32")),
    "nvfp": ((4, "nvfp4"), (8, "fp8e4m3"), (16, "bf16"), (32, "fp32")),
}


def _check_family(family: str) -> str:
    f = str(family).strip().lower()
    if f not in FAMILIES:
        raise InputError(f"unknown number format family {family!r}; valid: {', '.join(FAMILIES)}")
    return f


def family_format(family: str, width: int) -> Format:
    """The format a step of ``width`` bits (1..32) runs in under ``family``: the family's narrowest format at
    least ``width`` bits wide (see the module docstring)."""
    family = _check_family(family)
    w = int(width)
    if not 1 <= w <= MAX_WIDTH:
        raise InputError(f"a width must be 1..{MAX_WIDTH} bits, got {width!r}")
    if family == "int":
        return parse_format(f"int{w}") if w <= 16 else parse_format("fp32")
    for top, name in _LADDER[family]:
        if w <= top:
            return parse_format(name)
    raise AssertionError(w)


@dataclass(frozen=True)
class FormatMap:
    """Per width 0..32 (index = bits; index 0 unused): the forward and gradient operands' formats, their element
    bits and storage bits. ``family``: the forward family; ``grad_format``: the named gradient format or None."""

    family: str
    grad_format: str | None
    fwd_names: tuple[str, ...]
    grad_names: tuple[str, ...]
    fwd_element_bits: np.ndarray
    grad_element_bits: np.ndarray
    fwd_storage_bits: np.ndarray
    grad_storage_bits: np.ndarray

    @property
    def formats(self) -> set[Format]:
        """Every format this map can name (forward and gradient, all widths)."""
        return {parse_format(n) for n in (*self.fwd_names[1:], *self.grad_names[1:])}

    def used(self, q, g) -> dict:
        """{"forward": {width: format}, "gradient": {width: format}} for the widths ``q`` / ``g`` a run takes."""
        return {"forward": {int(w): self.fwd_names[int(w)] for w in sorted(set(np.asarray(q).ravel().tolist()))},
                "gradient": {int(w): self.grad_names[int(w)] for w in sorted(set(np.asarray(g).ravel().tolist()))}}

    def to_json(self) -> dict:
        return {"family": self.family, "grad_format": self.grad_format}


def format_map(family: str = "int", grad_format: str | None = None) -> FormatMap | None:
    """The ``FormatMap`` of a family and an optional gradient format; None for ``int`` without one (today's
    integer cost, unchanged). Bad input raises a one-line ``InputError``: an unknown family or format,
    ``grad_format`` with the integer family, an integer format as the gradient format."""
    family = _check_family(family)
    gfmt = None
    if grad_format is not None:
        if family == "int":
            raise InputError(f"--grad-format {grad_format} needs a float --number-format "
                             f"({', '.join(FLOAT_FAMILIES)}); the integer family quantizes gradients as integers")
        gfmt = parse_format(grad_format)
        if gfmt.family == "int":
            raise InputError(f"--grad-format must be a float format, got {gfmt.name} (the integer family's "
                             "gradients are the schedule's g-bit integers)")
    if family == "int":
        return None
    fwd = [family_format(family, max(w, 1)) for w in range(MAX_WIDTH + 1)]
    grad = [f if gfmt is None or w >= MAX_WIDTH else gfmt for w, f in enumerate(fwd)]

    def col(fs, attr):
        a = np.array([float(getattr(f, attr)) for f in fs])
        a.setflags(write=False)
        return a

    return FormatMap(family, None if gfmt is None else gfmt.name, tuple(f.name for f in fwd),
                     tuple(f.name for f in grad), col(fwd, "element_bits"), col(grad, "element_bits"),
                     col(fwd, "storage_bits"), col(grad, "storage_bits"))

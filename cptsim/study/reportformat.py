"""A float-format run's number formats as a report counts and names them: the family it trained in, the formats
each nominal width ran, and the element bits its BitOPs count (integers: none of this; a width is its own format)."""

from __future__ import annotations

import numpy as np


def run_format_map(cfg: dict):
    """The float family a run trained in (config.json "number_format") as a ``FormatMap``, else None
    (integers). Every re-count of the run and of its plan takes it, as the trace's own per-step BitOPs do (element
    bits: an MX step at width 5 ran MXFP6 and counts 6), so executed and planned compare like with like."""
    nf = cfg.get("number_format")
    if not isinstance(nf, dict) or not nf.get("family"):
        return None
    from cptsim.numerics.families import format_map

    return format_map(str(nf["family"]), nf.get("grad_format"))


def number_format_of(fmap, q, g) -> dict | None:
    """How a float-format run is named and what its numbers count (None for integers, where a width is its own
    format and the bits BitOPs count). ``q`` / ``g``: the forward / gradient widths the run took.

    A schedule's widths are nominal: the family runs each in one of its formats (MX at width 5 runs MXFP6), and
    BitOPs count that format's element bits. ``label`` names the formats ("fp8e4m3", "mxfp4/mxfp6/mxfp8, gradients
    fp8e5m2"); ``bitops_count`` says, width by width, which format ran and the element bits BitOPs counted for it."""
    if fmap is None:
        return None
    q = np.asarray(q, dtype=np.int64)
    g = np.asarray(g, dtype=np.int64)
    used = fmap.used(q, g)
    fwd = list(dict.fromkeys(used["forward"].values()))
    grad = list(dict.fromkeys(used["gradient"].values()))
    label = "/".join(fwd) + ("" if grad == fwd else f", gradients {'/'.join(grad)}")
    counts = [f"width {w} ran {n} ({fmap.fwd_element_bits[w]:g} element bits)" for w, n in used["forward"].items()]
    counts += [f"gradient width {w} ran {n} ({fmap.grad_element_bits[w]:g} element bits)"
               for w, n in used["gradient"].items() if grad != fwd]
    return {"family": fmap.family, "grad_format": fmap.grad_format, "label": label,
            "forward": {str(w): n for w, n in used["forward"].items()},
            "gradient": {str(w): n for w, n in used["gradient"].items()},
            "mean_nominal_bits": float(q.mean()) if q.size else None,
            "mean_element_bits": float(np.asarray(fmap.fwd_element_bits)[q].mean()) if q.size else None,
            "bitops_count": "BitOPs count each operand at its format's element bits: " + ", ".join(counts)
                            + "; 'bits' are the schedule's nominal widths"}


def schedule_label(schedule_text: str, fmt: dict | None) -> str:
    """A run's schedule as people read it: the text form, and for a float-format run the formats it ran in (the
    text form alone reads as integers: an FP8 run would be "static:8:g8")."""
    return schedule_text if fmt is None else f"{schedule_text} in {fmt['label']}"


def _element_bits(fmap, q, g):
    """The widths ``q`` / ``g`` as the element bits their formats count (unchanged without a float family)."""
    if fmap is None:
        return q, g
    return (np.asarray(fmap.fwd_element_bits)[np.asarray(q, dtype=int)],
            np.asarray(fmap.grad_element_bits)[np.asarray(g, dtype=int)])

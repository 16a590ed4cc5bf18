"""Per-layer precision schedules: each quantized layer (or glob of layers) may run its own bits per step.

A layer schedule is a list of rules ``PATTERN=SPEC`` laid over the run's global schedule (``Schedule``). PATTERN is
an fnmatch glob over module names, as ``--fp-layers`` takes; SPEC is one of

    QMIN-QMAX   its own forward range, with the global schedule's shape, cycles and gradient bits   layer1.*=2-6
    +K | -K     the global range shifted by K bits (q_min+K .. q_max+K)                             conv1=+2
    Q           a static width Q: every step at Q bits (the gradient bits still follow the global)  fc=8

Rules apply in order and the last rule that matches a layer wins; layers no rule matches follow the global schedule.
Only forward bits (weights and activations) are per layer: the error's bits g_t stay the global schedule's, which is
what the trace records (one line per step, its global bits; a layer's bits are a function of the step, so the
resolved plan is recorded once, in plan.json and config.json). Every resolved layer schedule is itself a
``Schedule`` (``name`` and ``cycles`` of the global one; a static width on a cyclic global schedule is the degenerate
range Q-Q), so the cost model costs a per-layer plan as the layers' rows of a few whole-model estimates
(``cptsim.cost.model.estimate(..., layers=...)``).

Text forms (``parse_layer_text``; one place reads and writes the file, ``read_layer_schedule``)::

    compact   "layer1.*=2-6;layer3.*=+1;conv1=8"         (``--layer`` repeats one rule per flag)
    JSON      {"format": "cptsim.layers/1", "model": "resnet20",          (model: optional; checked when given)
               "layers": {"layer1.*": "2-6", "layer3.*": {"offset": 1}, "conv1": {"bits": 8},
                          "layer2.*": {"q_min": 3, "q_max": 7}}}
    TOML      format = "cptsim.layers/1"
              model = "resnet20"
              [layers]
              "layer1.*" = "2-6"
              "conv1" = 8

Bits: a range or an offset must land in 1..16; a static width in 1..16, or 32 (full precision) only on a static
global schedule (on a cyclic one, keep the layer in full precision with ``--fp-layers``).
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cptsim.errors import InputError
from .schedules import FULL_PRECISION, Schedule

__all__ = ["LAYERS_FORMAT", "LayerRule", "LayerSchedule", "ResolvedLayers", "parse_rule", "parse_layer_text",
           "read_layer_schedule", "layer_schedule_from_json", "layers_of_run"]

LAYERS_FORMAT = "cptsim.layers/1"
RULE_FORM = "PATTERN=QMIN-QMAX | PATTERN=+K | PATTERN=-K | PATTERN=Q"
_SPEC = re.compile(r"\s*(?:(?P<lo>\d+)\s*-\s*(?P<hi>\d+)|(?P<off>[+-]\s*\d+)|(?P<q>\d+))\s*")


@dataclass(frozen=True)
class LayerRule:
    """One rule: layers matching ``pattern`` run ``kind`` ("range": lo..hi; "offset": the global range + lo;
    "static": lo bits every step)."""

    pattern: str
    kind: str
    lo: int
    hi: int = 0

    def spec(self) -> str:
        if self.kind == "range":
            return f"{self.lo}-{self.hi}"
        if self.kind == "offset":
            return f"{self.lo:+d}"
        return str(self.lo)

    def to_text(self) -> str:
        return f"{self.pattern}={self.spec()}"

    def schedule(self, base: Schedule, layer: str) -> Schedule:
        """This rule's schedule for ``layer`` on top of the global schedule ``base``; InputError if out of range."""
        where = f"layer schedule {self.to_text()!r} for {layer}"
        static = base.name == "static"
        if self.kind == "offset":
            lo, hi = base.q_min + self.lo, base.q_max + self.lo
        elif self.kind == "range":
            lo, hi = self.lo, self.hi
        else:
            lo = hi = self.lo
        if self.kind == "static" and lo == FULL_PRECISION:
            if not static:
                raise InputError(f"{where}: 32 bits (full precision) only on a static global schedule; keep the "
                                 "layer in full precision with --fp-layers instead")
        elif not (1 <= lo <= hi <= 16):
            raise InputError(f"{where}: bits {lo}-{hi} are outside 1..16 (global {base.to_text()})")
        if static:
            if lo != hi:
                raise InputError(f"{where}: a range needs a cyclic global schedule, not {base.to_text()}; give a "
                                 "static width (PATTERN=Q) or an offset")
            return Schedule("static", hi, hi, base.g_min, base.g_max, 1)
        return Schedule(base.name, lo, hi, base.g_min, base.g_max, base.cycles)


def _rule(pattern: Any, spec: Any) -> LayerRule:
    if not isinstance(pattern, str) or not pattern.strip():
        raise InputError(f"layer pattern must be a non-empty glob, got {pattern!r}")
    pattern = pattern.strip()
    if isinstance(spec, bool):
        raise InputError(f"layer {pattern!r}: spec must be {RULE_FORM.split(' | ')[0].split('=')[1]}, +K or Q")
    if isinstance(spec, int):
        return LayerRule(pattern, "static", spec)
    if isinstance(spec, dict):
        keys = set(spec)
        if keys == {"bits"}:
            return _rule(pattern, spec["bits"])
        if keys == {"offset"} and isinstance(spec["offset"], int) and not isinstance(spec["offset"], bool):
            return LayerRule(pattern, "offset", spec["offset"])
        if keys == {"q_min", "q_max"} and all(isinstance(spec[k], int) for k in keys):
            if spec["q_min"] > spec["q_max"]:
                raise InputError(f"layer {pattern!r}: q_min {spec['q_min']} > q_max {spec['q_max']}")
            return LayerRule(pattern, "range", spec["q_min"], spec["q_max"])
        raise InputError(f"layer {pattern!r}: spec {spec!r} must be one of {{\"bits\": Q}}, {{\"offset\": K}}, "
                         "{\"q_min\": A, \"q_max\": B} or a text QMIN-QMAX / +K / Q")
    if isinstance(spec, str):
        m = _SPEC.fullmatch(spec)
        if not m:
            raise InputError(f"layer {pattern!r}: spec {spec!r} is not QMIN-QMAX, +K, -K or Q (e.g. 2-6, +1, 8)")
        if m["lo"] is not None:
            lo, hi = int(m["lo"]), int(m["hi"])
            if lo > hi:
                raise InputError(f"layer {pattern!r}: range {spec!r} has q_min > q_max")
            return LayerRule(pattern, "range", lo, hi)
        if m["off"] is not None:
            return LayerRule(pattern, "offset", int(m["off"].replace(" ", "")))
        return LayerRule(pattern, "static", int(m["q"]))
    raise InputError(f"layer {pattern!r}: spec must be text or a number, got {type(spec).__name__}")


def parse_rule(text: str) -> LayerRule:
    """One ``PATTERN=SPEC`` rule (a ``--layer`` flag)."""
    if not isinstance(text, str) or "=" not in text:
        raise InputError(f"layer rule {text!r} must be {RULE_FORM}, e.g. 'layer1.*=2-6'")
    pattern, _, spec = text.rpartition("=")
    return _rule(pattern, spec)


@dataclass(frozen=True)
class LayerSchedule:
    """The rules as written (unresolved: they need the model's layers and the global schedule)."""

    rules: tuple[LayerRule, ...]
    model: str | None = None

    def to_text(self) -> str:
        return ";".join(r.to_text() for r in self.rules)

    def to_json(self) -> dict:
        d = {"format": LAYERS_FORMAT, "layers": {}, "rules": [r.to_text() for r in self.rules]}
        for r in self.rules:  # the ordered list is authoritative; the dict is for readers (a repeated glob: last)
            d["layers"][r.pattern] = r.spec()
        if self.model:
            d["model"] = self.model
        return d

    def __bool__(self) -> bool:
        return bool(self.rules)

    def resolve(self, base: Schedule, quantized: list[str], fp_layers: list[str] = (),
                model: str | None = None) -> "ResolvedLayers":
        """Each quantized layer's schedule. InputError for a pattern that matches no quantized layer, a schedule
        written for another model, bits out of range."""
        if self.model and model and self.model != model:
            raise InputError(f"the layer schedule is for model {self.model!r}, not {model!r}")
        chosen: dict[str, Schedule] = {}
        for r in self.rules:
            hits = [n for n in quantized if fnmatch.fnmatchcase(n, r.pattern)]
            if not hits:
                fp = [n for n in fp_layers if fnmatch.fnmatchcase(n, r.pattern)]
                if fp:
                    raise InputError(f"layer pattern {r.pattern!r} matches only full-precision layers "
                                     f"({', '.join(fp[:4])}); drop them from --fp-layers to plan their bits")
                shown = ", ".join(quantized[:12]) + (", ..." if len(quantized) > 12 else "")
                raise InputError(f"layer pattern {r.pattern!r} matches no quantized layer"
                                 f"{' of ' + model if model else ''} (layers: {shown})")
            for n in hits:
                chosen[n] = r.schedule(base, n)
        layers = {n: chosen[n] for n in quantized if n in chosen and chosen[n] != base}
        return ResolvedLayers(base, layers, self)


def parse_layer_text(text: str | list[str] | tuple[str, ...]) -> LayerSchedule:
    """The compact form: rules separated by ';' (or a list of rules, one per ``--layer`` flag)."""
    items = text if isinstance(text, (list, tuple)) else str(text).split(";")
    rules = tuple(parse_rule(t) for part in items for t in str(part).split(";") if t.strip())
    if not rules:
        raise InputError(f"empty layer schedule; give rules {RULE_FORM}")
    return LayerSchedule(rules)


def layer_schedule_from_json(d: Any, where: str = "layer schedule") -> LayerSchedule:
    """From the JSON/TOML document (or the ``rules`` list a plan or config records)."""
    if not isinstance(d, dict):
        raise InputError(f"{where}: expected an object with a 'layers' table, got {type(d).__name__}")
    fmt = d.get("format", LAYERS_FORMAT)
    if fmt != LAYERS_FORMAT:
        raise InputError(f"{where}: format {fmt!r} is not {LAYERS_FORMAT!r}")
    model = d.get("model")
    if model is not None and not isinstance(model, str):
        raise InputError(f"{where}: model must be a name, got {model!r}")
    if isinstance(d.get("rules"), list):
        rules = parse_layer_text([str(x) for x in d["rules"]]).rules
    elif isinstance(d.get("layers"), dict) and d["layers"]:
        rules = tuple(_rule(k, v) for k, v in d["layers"].items())
    else:
        raise InputError(f"{where}: needs a non-empty 'layers' table (glob = spec), e.g. {{\"layers\": "
                         "{\"layer1.*\": \"2-6\"}}")
    return LayerSchedule(rules, model)


def read_layer_schedule(path: str | Path) -> LayerSchedule:
    """A ``--layer-schedule FILE``: JSON (``.json``) or TOML (any other suffix)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise InputError(f"{p}: cannot read layer schedule ({e.strerror or e})") from None
    try:
        if p.suffix.lower() == ".json":
            doc = json.loads(raw.decode())
        else:
            import tomllib

            doc = tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"{p}: not a valid layer schedule ({str(e).splitlines()[0]})") from None
    return layer_schedule_from_json(doc, str(p))


@dataclass(frozen=True)
class ResolvedLayers:
    """The global schedule and each quantized layer that runs another schedule (the rest follow ``base``)."""

    base: Schedule
    layers: dict
    rules: LayerSchedule

    def schedule_of(self, name: str) -> Schedule:
        return self.layers.get(name, self.base)

    def groups(self) -> list[tuple[Schedule, list[str]]]:
        """Distinct non-global schedules with their layers, in layer order."""
        out: dict[Schedule, list[str]] = {}
        for n, s in self.layers.items():
            out.setdefault(s, []).append(n)
        return list(out.items())

    def to_json(self) -> dict:
        return {"format": LAYERS_FORMAT, "text": self.rules.to_text(),
                "rules": [r.to_text() for r in self.rules.rules], "model": self.rules.model,
                "layers": {n: s.to_text() for n, s in self.layers.items()}}

    def eval_bits(self, name: str, eval_bits: int | None) -> int:
        """The bits a layer is evaluated at: ``eval_bits`` when given, else its own schedule's q_max."""
        return self.schedule_of(name).q_max if eval_bits is None else eval_bits


def layers_of_run(cfg: dict, schedule) -> "ResolvedLayers | None":
    """A finished or running run's per-layer plan: config.json's ``layers`` resolved again on the run's recorded
    quantized and full-precision layers over its global ``schedule``; None for a run without one. What the report
    and the results database re-count a per-layer run's trace with (its layers at their own bits)."""
    rec = cfg.get("layers")
    if not isinstance(rec, dict):
        return None
    return layer_schedule_from_json({k: rec[k] for k in ("format", "rules", "model") if rec.get(k) is not None}) \
        .resolve(schedule, list(cfg.get("quantized_layers") or []), list(cfg.get("fp_layers") or []))

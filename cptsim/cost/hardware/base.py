"""The common part of every hardware profile: the base class, the kind registry, TOML checking, argument checks.

A profile is one TOML file (``hw_profiles/NAME.toml``, or any path a user gives) of one *kind*; the kind says which
cost formula applies and which numbers it needs. Each kind is one module of this package (gpu, bit_fusion,
bit_serial, fixed_int, host) holding its formula -- small pure functions, vectorized over numpy arrays because the
planner costs thousands of schedules at once -- and its profile class, which only holds the numbers and passes them
in. A class decorated with ``@register`` is the class of its ``KIND``: adding a kind is adding one module.

A kind prices a whole training step behind one method, ``HardwareProfile.price_step``; the cost model
(``cptsim.cost.model``) sums what it returns over a run and never asks which kind it holds. The base class prices a
step from a few narrower methods with defaults -- how operands are stored, the width full-precision layers run at,
the layers' GEMMs, a graph aggregation, the step's other ops -- and a kind overrides the ones where it differs.

Common conventions for every kind:

* ``macs``: multiply-accumulates executed (a FLOP counter's FLOPs / 2).
* ``b1``, ``b2``: operand widths in bits, integers 1..32; 32 means full precision (FP32). The formulas are symmetric in
  (b1, b2) except ``bit-serial``, where ``b2`` is the operand streamed one bit per cycle.
* ``bytes_moved``: DRAM traffic of the phase, computed by the caller from tensor sizes and widths.
* Rates in the TOML files are in the units their key names say (``_gb_s`` = 1e9 B/s, ``_mhz``, ``_pj``...);
  ``throughput_macs_per_s`` and ``gemm_cost`` speak SI (MAC/s, s, J).
* ``[calibration]`` holds factors that measured runs fit: ``compute_efficiency`` and ``memory_efficiency`` scale the
  peak compute rate and bandwidth (1.0 = the published peak, so time is a lower bound until fitted).
"""

from __future__ import annotations

import copy
import hashlib
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np

from cptsim.errors import InputError
from ..formulas import aggregation_bytes, bytes_moved, packed_bits, phase_operands, quant_elems
from .array import problem_alternatives
from .tiling import ArraySpec
from .tiling_cache import store as tiling_store

MIN_BITS, MAX_BITS = 1, 32
FULL_PRECISION_BITS = 32

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_profile_file_name(path, flag: str) -> None:
    """A profile file's stem is its name: refuse one that could not be loaded back by name, before any work."""
    stem = Path(path).stem
    if not _NAME_RE.match(stem):
        raise InputError(f"{flag} {str(path)!r}: a profile's file name is its name and must match "
                         f"[A-Za-z0-9][A-Za-z0-9._-]* (got {stem!r})")


_PJ = 1e-12

_WARNED: set[str] = set()


def _warn_once(msg: str) -> None:
    """A warning said once per process (the planner prices the same profile thousands of times)."""
    if msg not in _WARNED:
        _WARNED.add(msg)
        import warnings

        warnings.warn(msg, stacklevel=3)


# ----------------------------------------------------------------------------------------------------------------------
# Formulas shared by several kinds: pure, vectorized, no profile objects.
# ----------------------------------------------------------------------------------------------------------------------


def roofline_time(macs, mac_rate, bytes_moved, bandwidth):
    """Time of a phase whose compute and DRAM traffic overlap (double-buffered): ``max(macs / rate, bytes / bw)``.

    The roofline bound (Williams et al., CACM 2009); DESIGN.md "Cost model" for gpu and the accelerators.
    """
    return np.maximum(macs / mac_rate, bytes_moved / bandwidth)


def traffic_energy_j(bytes_moved, dram_pj_per_bit, sram_pj_per_dram_bit=0.0):
    """Energy of the DRAM traffic and of the on-chip buffer accesses it causes: ``bytes * 8 * (dram + sram) pJ``.

    DRAM: Horowitz, ISSCC 2014, 1300-2600 pJ per 64-bit access (20-41 pJ/bit). The SRAM term charges each bit
    moved from/to DRAM for its buffer accesses (a write on fill plus a read out; a lower bound on buffer traffic).
    """
    return np.asarray(bytes_moved, dtype=np.float64) * 8.0 * (dram_pj_per_bit + sram_pj_per_dram_bit) * _PJ


# ----------------------------------------------------------------------------------------------------------------------
# Validation of a parsed TOML document: every error names the file, the key, and what was expected.
# ----------------------------------------------------------------------------------------------------------------------

_MISSING = object()


@dataclass(frozen=True)
class Field:
    """One key of a profile table: its check, default (``_MISSING`` = required) and what it means (for messages)."""

    key: str
    check: str  # a key of _EXPECT
    doc: str
    default: Any = _MISSING


_EXPECT = {
    "positive": "a positive number",
    "nonneg": "a number >= 0",
    "fraction": "a number in (0, 1]",
    "count": "a positive integer",
    "bits": f"an integer width in bits, {MIN_BITS}..{MAX_BITS}",
    "string": "a string",
    "bool": "true or false",
    "list": "a non-empty list",
    "store": f'an integer width in bits, {MIN_BITS}..{MAX_BITS}, or "operand"',
}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _passes(check: str, v: Any) -> bool:
    if check == "positive":
        return _is_number(v) and v > 0
    if check == "nonneg":
        return _is_number(v) and v >= 0
    if check == "fraction":
        return _is_number(v) and 0 < v <= 1
    if check == "count":
        return isinstance(v, int) and not isinstance(v, bool) and v >= 1
    if check == "bits":
        return isinstance(v, int) and not isinstance(v, bool) and MIN_BITS <= v <= MAX_BITS
    if check == "string":
        return isinstance(v, str) and v.strip() != ""
    if check == "bool":
        return isinstance(v, bool)
    if check == "list":
        return isinstance(v, list) and len(v) > 0
    if check == "store":
        return v == "operand" or _passes("bits", v)
    raise AssertionError(check)


class _Checker:
    """Reads one parsed TOML document, raising InputError('<file>: <key> must be <expected>, got <value>')."""

    def __init__(self, label: str):
        self.label = label

    def fail(self, msg: str) -> None:
        raise InputError(f"{self.label}: {msg}")

    def table(self, doc: dict, key: str, what: str) -> dict:
        if key not in doc:
            self.fail(f"missing table [{key}] ({what})")
        if not isinstance(doc[key], dict):
            self.fail(f"{key} must be a table [{key}], got {doc[key]!r}")
        return doc[key]

    def fields(self, table: dict, fields: tuple[Field, ...], where: str, nested: tuple[str, ...] = ()) -> dict:
        """Check ``table`` against ``fields``; keys in ``nested`` are the caller's to check, any other is an error."""
        known = {f.key for f in fields}
        for k in table:
            if k not in known and k not in nested:
                self.unknown(k, known | set(nested), where)
        out = {}
        for f in fields:
            path = f"{where}.{f.key}" if where else f.key
            if f.key not in table:
                if f.default is _MISSING:
                    self.fail(f"missing key '{path}' ({_EXPECT[f.check]}: {f.doc})")
                out[f.key] = f.default
                continue
            v = table[f.key]
            if not _passes(f.check, v):
                self.fail(f"{path} must be {_EXPECT[f.check]} ({f.doc}), got {v!r}")
            out[f.key] = v
        return out

    def unknown(self, key: str, known: set[str], where: str) -> None:
        path = f"{where}.{key}" if where else key
        self.fail(f"unknown key '{path}' (expected one of: {', '.join(sorted(known))})")


# ----------------------------------------------------------------------------------------------------------------------
# Profiles
# ----------------------------------------------------------------------------------------------------------------------

class StepPrice(NamedTuple):
    """What one training step of each of K kinds (q, g, samples) costs on a machine (``price_step``)."""

    time: np.ndarray                  # (K, L, 3) seconds per layer and phase (fwd, dgrad, wgrad)
    energy: np.ndarray                # (K, L, 3) joules
    other_time: np.ndarray | None     # (K, 3) seconds of everything besides the layers; None: not priced here
    other_energy: np.ndarray | None   # (K, 3) joules of the same


_CAL_COMPUTE = Field("compute_efficiency", "fraction", "achieved / peak compute rate, fitted from measured runs", 1.0)
_CAL_MEMORY = Field("memory_efficiency", "fraction", "achieved / peak DRAM bandwidth", 1.0)


@dataclass
class HardwareProfile:
    """One machine: its numbers (``params``, as in the TOML file) and the cost formula of its kind.

    Subclasses, one per kind, declare ``PARAMS`` (the keys of the kind's table) and ``CALIBRATION`` and implement
    ``_cost`` / ``_throughput`` / ``describe_bits`` by calling their module's pure functions, and override the
    step-pricing methods (``price_step`` and the ones it calls) where the kind prices a step otherwise;
    ``@register`` makes a subclass the class of its ``KIND``.
    """

    name: str
    kind: str
    description: str
    sources: list[str]
    path: str
    content_hash: str
    params: dict
    calibration: dict
    notes: list[str] = field(default_factory=list)
    validation: dict = field(default_factory=dict)  # the file's [validation]: what its times were checked on

    KIND: ClassVar[str] = ""
    PRICES_OP_LIST: ClassVar[bool] = False  # whether a step's time includes its op list (``op_list_cost``)
    PARAMS: ClassVar[tuple[Field, ...]] = ()
    CALIBRATION: ClassVar[tuple[Field, ...]] = (_CAL_COMPUTE, _CAL_MEMORY)

    # -- construction -------------------------------------------------------------------------------------------------

    @classmethod
    def parse_params(cls, chk: _Checker, table: dict) -> dict:
        """Validate the kind's table; subclasses with nested structures (gpu tiers) extend this."""
        return chk.fields(table, cls.PARAMS, cls.KIND)

    def __post_init__(self) -> None:
        self._derive()

    def _derive(self) -> None:
        """Precompute SI quantities from ``params`` (subclasses)."""

    # -- the public API -----------------------------------------------------------------------------------------------

    def gemm_cost(self, macs, b1, b2, bytes_moved, quant_elems=0, matmul=None) -> tuple[np.ndarray, np.ndarray]:
        """(time s, energy J) of GEMM phases: ``macs`` MACs with operand widths b1, b2 moving ``bytes_moved`` bytes.

        Vectorized: all arguments broadcast together (arrays of one shape, or scalars). ``quant_elems`` (element-wise
        quantizer element-passes) only costs time on the ``host`` kind. ``matmul`` (bool, broadcast likewise): the
        GEMM is a matrix multiply (Linear, attention), not a convolution; only the ``gpu`` kind tells them apart
        (their FP32 precision is set by different PyTorch flags); None = convolutions. See the kind's class for
        the formula.
        """
        macs, b1, b2, bytes_moved, quant_elems = _gemm_args(macs, b1, b2, bytes_moved, quant_elems)
        if matmul is None:
            return self._cost(macs, b1, b2, bytes_moved, quant_elems)
        try:
            mm = np.broadcast_to(np.asarray(matmul, dtype=bool), macs.shape)
        except ValueError:
            raise InputError(f"gemm_cost: matmul of shape {np.shape(matmul)} does not broadcast to the arguments' "
                             f"shape {macs.shape}") from None
        return self._cost_by_op(macs, b1, b2, bytes_moved, quant_elems, mm)

    def throughput_macs_per_s(self, b1, b2) -> np.ndarray:
        """Compute rate at widths (b1, b2): the peak at those widths x ``compute_efficiency``, in MAC/s."""
        b1, b2 = np.broadcast_arrays(_bits(b1, "b1"), _bits(b2, "b2"))
        return self._throughput(b1, b2)

    def describe_bits(self, b1: int, b2: int) -> str:
        """How a (b1, b2) GEMM runs here, in a few words (the GPU tier, the passes...)."""
        return ""

    def with_formats(self, fmap) -> "HardwareProfile":
        """This profile pricing the float formats of ``fmap`` (``cptsim.numerics.families.FormatMap``; None: the
        integer family, this very profile). Kinds that price formats (gpu) return a view; the host, which fake-
        quantizes in FP32 whatever the format, prices them as it prices integers; integer-only kinds refuse."""
        return self

    def time_validation(self, op_mix: list[str] | None = None, op_list: bool = True) -> dict:
        """How sure this profile's times are: its [validation] (what they were checked on, median and worst
        |error|, held out or in-sample) and whether that set covered ``op_mix`` (``LayerProfile.op_mix``); a
        profile without one says it was not checked. ``op_list``: whether the workload's profile has its step's
        op list (``LayerProfile.ops``); on a kind that prices it (``PRICES_OP_LIST``) a profile without one is
        timed on its GEMMs alone, which is not what [validation] checked, so its op mix is never "covered" and
        ``op_list_missing`` says why."""
        no_ops = self.PRICES_OP_LIST and not op_list
        lacks = {"op_list_missing": "the workload's profile has no op list: this time leaves out the step's other "
                                    "ops (norms, activations, the optimizer, launches)"} if no_ops else {}
        if not self.validation:
            return {"checked": False, "note": "not checked against measurements (the profile has no [validation])",
                    **lacks}
        v = dict(self.validation)
        out = {"checked": True, **v, **lacks}
        if op_mix is not None:
            missing = sorted(set(op_mix) - set(v.get("op_mixes", [])))
            out["op_mix"] = list(op_mix)
            out["op_mix_covered"] = not missing and not no_ops
            out["op_mix_missing"] = missing
        return out

    # -- pricing a training step: the cost model's one question to a kind ----------------------------------------

    def price_step(self, a, q, g, samples, formats=None) -> StepPrice:
        """Time and energy of ONE training step of each of K kinds -- forward bits ``q``, gradient bits ``g``,
        ``samples`` in the step, each (K,) -- of the layers of profile arrays ``a``
        (``cptsim.measure.profiler.ProfileArrays``) on this machine, per layer and phase, and of the step's other
        ops where this kind prices them. ``formats``: the float family the widths name (``with_formats`` gave this
        profile's view of it), None for integers.

        Element-wise over the kinds, so a kind's numbers do not depend on the others priced with it. The steps,
        each a method a kind overrides where it differs: the width full-precision layers run at
        (``full_precision_bits``), how operands are stored (``storage_bits``), the layers' GEMMs (``layer_cost``),
        a graph layer's aggregation (``aggregation_cost``), and everything besides the layers (``op_list_cost``).
        """
        fp = self.full_precision_bits(q)
        b1, b2 = phase_operands(a.quantized, q, g, fp)
        store = self.storage_bits(formats)
        nbytes = bytes_moved(a.numel, a.macs, a.quantized, q, g, samples, a.calls, store, a.operand, fp)
        agg = a.aggregation[:, None] if a.aggregation is not None and np.any(a.aggregation) else None
        if agg is not None:  # a graph layer's aggregation moves a gather's and a scatter's bytes, not a GEMM's
            nbytes = np.where(agg, aggregation_bytes(a.numel, a.macs, a.quantized, q, g, samples, a.edges, a.operand,
                                                     store, fp), nbytes)
        qe = quant_elems(a.numel, a.macs, a.quantized, q, g, samples, a.calls, a.operand)
        macs = a.macs[None] * samples.astype(np.float64)[:, None, None]
        t, e = self.layer_cost(a, macs, b1, b2, nbytes, qe, samples)
        if agg is not None:
            priced = self.aggregation_cost(nbytes)
            if priced is not None:
                t, e = np.where(agg, priced[0], t), np.where(agg, priced[1], e)
        other = self.op_list_cost(a, q, g, samples)
        return StepPrice(t, e, *((None, None) if other is None else other))

    def full_precision_bits(self, q):
        """The width a step's full-precision layers run at, per step kind of forward bits ``q``: 32 here (a kind
        whose steps cast them, as a GPU's AMP does, overrides it). Time, bytes and energy only: BitOPs keep them
        at 32 on every kind."""
        return FULL_PRECISION_BITS

    def storage_bits(self, formats=None):
        """How this machine stores operands: a storage (``cptsim.cost.formulas``: bits -> stored bits, with
        ``.output``, the width GEMM outputs are written at, where that is not 32). Here: packed at the operand
        width. ``formats``: a float family (None: integers), for kinds that store formats apart."""
        return packed_bits

    def layer_cost(self, a, macs, b1, b2, bytes_moved, quant_elems, samples) -> tuple[np.ndarray, np.ndarray]:
        """(time s, energy J), (K, L, 3), of the layers' GEMMs of profile arrays ``a``: ``macs`` executed at
        operand widths ``b1``, ``b2``, moving ``bytes_moved`` bytes with ``quant_elems`` quantizer element-passes,
        in steps of ``samples``. Here ``gemm_cost``, matmuls told from convolutions (``a.matmul``); kinds that
        price a GEMM from its shape override it."""
        mm = None if a.matmul is None else a.matmul[:, None]
        return self.gemm_cost(macs, b1, b2, bytes_moved, quant_elems, matmul=mm)

    def aggregation_cost(self, bytes_moved) -> tuple[np.ndarray, np.ndarray] | None:
        """(time s, energy J) of graph aggregation phases that move ``bytes_moved`` bytes
        (``cptsim.cost.formulas.aggregation_bytes``), or None: priced by ``layer_cost`` as any other MACs at their
        widths, as a fixed-point array runs them."""
        return None

    def op_list_cost(self, a, q, g, samples) -> tuple[np.ndarray, np.ndarray] | None:
        """(time s, energy J), each (K, 3) per step kind and phase, of everything in a step besides the layers'
        GEMMs (the profile's op list, ``a.ops``: norms, activations, the optimizer, kernel launches), or None where
        this kind does not price them (here)."""
        return None

    def step_tiers(self, kinds) -> list[dict] | None:
        """For kinds that run GEMMs on precision tiers: the tier a quantized layer's GEMMs run on in each phase,
        per step kind (q, g) of ``kinds`` -- rows {"bits", "grad_bits", "fwd", "dgrad", "wgrad"}; None here."""
        return None

    def launch_bound(self, ops, step_s: float) -> dict | None:
        """Whether an eager step of ``ops`` is bound by the host's dispatch, given the modelled time of one step,
        on kinds that launch a step kernel by kernel and measured their host's time per launch; None here."""
        return None

    def allow_tf32_matmul(self) -> "HardwareProfile":
        """This profile for a run whose FP32 matmuls may use TF32: the same profile, on kinds without TF32."""
        return self

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "description": self.description,
            "sources": list(self.sources),
            "path": self.path,
            "hash": self.content_hash,
            "params": copy.deepcopy(self.params),
            "calibration": dict(self.calibration),
            "validation": dict(self.validation),
            "notes": list(self.notes),
        }

    # -- for subclasses -----------------------------------------------------------------------------------------------

    def _cost(self, macs, b1, b2, bytes_moved, quant_elems):
        raise NotImplementedError

    def _cost_by_op(self, macs, b1, b2, bytes_moved, quant_elems, matmul):
        """``_cost`` for GEMMs that are matmuls where ``matmul`` is true: kinds that price them apart override it."""
        return self._cost(macs, b1, b2, bytes_moved, quant_elems)

    def _throughput(self, b1, b2):
        raise NotImplementedError

    @property
    def _ceff(self) -> float:
        return float(self.calibration["compute_efficiency"])

    @property
    def _meff(self) -> float:
        return float(self.calibration["memory_efficiency"])


_KIND_CLASSES: dict[str, type[HardwareProfile]] = {}


def register(cls: type[HardwareProfile]) -> type[HardwareProfile]:
    """Class decorator: ``cls`` is the profile class of files with ``kind = cls.KIND``.

    The shipped kinds register when this package is imported; a kind defined elsewhere (a user's module, a test)
    registers the same way, before its profiles are loaded. Registering a second class for a kind is an error."""
    if not cls.KIND:
        raise ValueError(f"{cls.__name__} has no KIND")
    if _KIND_CLASSES.get(cls.KIND, cls) is not cls:
        raise ValueError(f"kind {cls.KIND!r} is registered twice ({_KIND_CLASSES[cls.KIND].__name__}, {cls.__name__})")
    _KIND_CLASSES[cls.KIND] = cls
    return cls


def unregister(kind: str) -> None:
    """Forget ``kind`` (its files no longer load), so that a kind registered for a while -- a test's -- does not
    outlive it; a kind that is not registered is left alone."""
    _KIND_CLASSES.pop(kind, None)


def kinds() -> tuple[str, ...]:
    """The registered kinds, in the order their modules were imported."""
    return tuple(_KIND_CLASSES)


def kind_class(kind: str) -> type[HardwareProfile] | None:
    """The profile class of ``kind``, or None when no module registered it."""
    return _KIND_CLASSES.get(kind)


# ----------------------------------------------------------------------------------------------------------------------
# Shared by the accelerator kinds (bit_fusion, bit_serial, fixed_int)
# ----------------------------------------------------------------------------------------------------------------------


DATAFLOWS = ("channels", "im2col-first", "im2col")
ARRAY_FIELDS = (
    Field("rows", "count", "reduction lanes of the array (count): input channels, packed by the kind's law"),
    Field("columns", "count", "output-channel lanes of the array (count)"),
    Field("windows", "count", "output positions the array computes at once (count)", 1),
    Field("weight_buffer_bytes", "positive", "weight buffer, bytes (double-buffered: a tile uses half)"),
    Field("input_buffer_bytes", "positive", "input (activation) buffer, bytes (double-buffered)"),
    Field("output_buffer_bytes", "positive", "output (partial sum) buffer, bytes (double-buffered)"),
    Field("dataflow", "string", 'convolutions: "channels" (input channels on the rows, taps in time), '
          '"im2col-first" (the same, but a first layer folds its taps into the reduction, as the Bit Fusion '
          'authors run it) or "im2col" (every layer)', "channels"),
    Field("weight_buffer_read_pj_per_bit", "nonneg", "weight buffer read energy, pJ per bit"),
    Field("weight_buffer_write_pj_per_bit", "nonneg", "weight buffer write energy, pJ per bit"),
    Field("input_buffer_read_pj_per_bit", "nonneg", "input buffer read energy, pJ per bit"),
    Field("input_buffer_write_pj_per_bit", "nonneg", "input buffer write energy, pJ per bit"),
    Field("output_buffer_read_pj_per_bit", "nonneg", "output buffer read energy, pJ per bit"),
    Field("output_buffer_write_pj_per_bit", "nonneg", "output buffer write energy, pJ per bit"),
)


def _layer_signatures(a) -> list[tuple]:
    """Per layer, everything of profile arrays ``a`` its array pricing reads (``array.problem_alternatives``), so
    that equal layers -- in one profile or across the profiles the planner builds of one model -- share a price."""
    L = len(a.names)

    def col(x, width):
        return [()] * L if x is None else [tuple(r) for r in np.asarray(x, dtype=np.float64).reshape(L, width).tolist()]

    parts = [col(a.macs, 3), col(a.numel, 3), col(a.calls, 1), col(getattr(a, "gemm", None), 5),
             col(getattr(a, "conv", None), 8), col(getattr(a, "edges", None), 1),
             col(getattr(a, "aggregation", None), 1)]
    return [tuple(p[i] for p in parts) for i in range(L)]


class _AcceleratorProfile(HardwareProfile):
    """Shared by the three accelerator kinds: an array with buffers and a tiling search, or (a file without an
    ``array`` table, written before the array model) a roofline.

    With ``[KIND.array]`` (``cptsim.cost.hardware.array`` and ``tiling``): each layer-phase is mapped onto the
    array -- reduction on the rows packed by the kind's law (``_pack``), output channels on the columns, padded to
    whole rows and columns -- and tiled into the double-buffered weight, input and output buffers by a search over
    tile sizes and loop orders; time = the fastest tiling's cycles (compute, DRAM stalls, first fill and last drain)
    / (frequency x compute_efficiency), the interface moving bandwidth_gb_s x memory_efficiency; energy = the
    array's energy per busy cycle x compute cycles + each buffer's reads and writes x its pJ per bit + DRAM bits x
    dram_pj_per_bit + static_power_w x time.

    Without it (the roofline, kept so that older profile files price as they did, with a warning):
    time   = max(compute cycles / (frequency x compute_efficiency), bytes / (bandwidth x memory_efficiency))
    energy = core dynamic energy of the cycles the work occupies + traffic_energy_j(bytes) + static_power_w x time
    """

    # The kind's keys for its count of units (fusion units, lanes, MACs: the array's rows x columns x windows) and
    # for one unit's dynamic energy per busy cycle, pJ
    UNITS_KEY: ClassVar[str] = ""
    CORE_PJ_KEY: ClassVar[str] = ""

    COMMON = (
        Field("frequency_mhz", "positive", "clock in MHz"),
        Field("bandwidth_gb_s", "positive", "DRAM bandwidth in GB/s (1e9 bytes/s)"),
        Field("dram_pj_per_bit", "nonneg", "DRAM access energy in pJ per bit"),
        Field("sram_pj_per_dram_bit", "nonneg", "on-chip buffer energy charged per bit moved to/from DRAM, pJ "
              "(a profile without an array table only)", 0.0),
        Field("static_power_w", "nonneg", "leakage power of the compute array in W", 0.0),
    )

    @staticmethod
    def output_bits_field(default, why: str) -> Field:
        """``output_bits``: the width at which a GEMM's output -- the forward activation, the backward error --
        is written to DRAM: a fixed width in bits, or "operand" (already quantized to the width the next GEMM
        reads it at, which needs a quantizer at the array's output). ``why``: where the kind's default comes from.
        Read by ``storage_bits``; weight gradients are written at 32 bits whatever this says."""
        return Field("output_bits", "store", 'width of activations / errors written to DRAM: bits, or "operand" '
                     f"(default {default}: {why})", default)

    @classmethod
    def parse_params(cls, chk: _Checker, table: dict) -> dict:
        params = chk.fields(table, cls.PARAMS, cls.KIND, nested=("array",))
        if "array" in table:
            raw = table["array"]
            if not isinstance(raw, dict):
                chk.fail(f"{cls.KIND}.array must be a table [{cls.KIND}.array], got {raw!r}")
            arr = chk.fields(raw, ARRAY_FIELDS, f"{cls.KIND}.array")
            if arr["dataflow"] not in DATAFLOWS:
                chk.fail(f'{cls.KIND}.array.dataflow must be one of {", ".join(map(repr, DATAFLOWS))}, '
                         f'got {arr["dataflow"]!r}')
            have = arr["rows"] * arr["columns"] * arr["windows"]
            if cls.UNITS_KEY and params[cls.UNITS_KEY] != have:
                chk.fail(f"{cls.KIND}.array: rows x columns x windows = {have} must equal the kind's unit count "
                         f"({cls.KIND}.{cls.UNITS_KEY} = {params[cls.UNITS_KEY]})")
            params["array"] = arr
        return params

    def _pack(self, b1, b2):
        """Reduction elements one row of the array takes per cycle at operand widths (b1, b2): the kind's law."""
        raise NotImplementedError

    def pack_factor(self, b1: int, b2: int) -> float:
        """Reduction elements one row of the array takes per cycle at operand widths (b1, b2) (below 1: cycles per
        element, 1/x) -- a ``tiling.Problem``'s ``pf``."""
        return float(self._pack(b1, b2))

    @property
    def has_array(self) -> bool:
        return "array" in self.params

    def roofline(self) -> "_AcceleratorProfile":
        """This profile without its array: priced by the roofline over total MACs and bytes, as a file without an
        array table is (for comparisons of the two models). Named ``<name>-roofline``."""
        name = f"{self.name}-roofline"
        return replace(
            self, name=name, params={k: v for k, v in self.params.items() if k != "array"},
            content_hash=hashlib.sha256(f"{self.content_hash}|roofline".encode()).hexdigest()[:16])

    def array_spec(self) -> ArraySpec:
        """This profile's array, buffers, interface and energies in the tiling search's units."""
        arr, p = self.params["array"], self.params
        units = arr["rows"] * arr["columns"] * arr["windows"]
        return ArraySpec(
            rows=arr["rows"], columns=arr["columns"], windows=arr["windows"],
            wbuf_bits=arr["weight_buffer_bytes"] * 8.0, ibuf_bits=arr["input_buffer_bytes"] * 8.0,
            obuf_bits=arr["output_buffer_bytes"] * 8.0,
            interface_bits=self._bandwidth * self._meff * 8.0 / self._freq,
            core_pj_per_cycle=self.params[self.CORE_PJ_KEY] * units,
            wbuf_read_pj=arr["weight_buffer_read_pj_per_bit"], wbuf_write_pj=arr["weight_buffer_write_pj_per_bit"],
            ibuf_read_pj=arr["input_buffer_read_pj_per_bit"], ibuf_write_pj=arr["input_buffer_write_pj_per_bit"],
            obuf_read_pj=arr["output_buffer_read_pj_per_bit"], obuf_write_pj=arr["output_buffer_write_pj_per_bit"],
            dram_pj=p["dram_pj_per_bit"])

    def layer_cost(self, a, macs, b1, b2, bytes_moved, quant_elems, samples):
        """The array model where the profile has an ``array`` table (class docstring); the roofline otherwise, and
        for layers whose profile recorded no shape (each said once, as a warning)."""
        if not self.has_array:
            t, e = super().layer_cost(a, macs, b1, b2, bytes_moved, quant_elems, samples)
            _warn_once(f"cptsim: {self.name} has no [{self.kind}.array] table (a profile written before the array "
                       "model): priced as a roofline over total MACs and bytes, which overstates low precision's "
                       "saving on narrow layers; add the table to price its array, buffers and tiling")
            return t, e
        t, e = np.zeros(macs.shape), np.zeros(macs.shape)
        spec = self.array_spec()
        out_bits = self.params.get("output_bits", 32)
        flow = self.params["array"]["dataflow"]
        unpriced = set()
        cache = tiling_store(spec)
        # One price per distinct (samples, layer, phase, widths), kept by the profile across calls and keyed by what
        # the layer is (its signature), not where it sits: the planner's thousands of step kinds share a few
        # hundred, and it rebuilds a workload's arrays for every plan. Known prices are looked up vectorized.
        kind_of = np.array([self._sig_ids.setdefault(sig, len(self._sig_ids)) for sig in _layer_signatures(a)],
                           dtype=np.int64)
        K, L = macs.shape[:2]
        sam = np.rint(np.broadcast_to(np.asarray(samples, dtype=np.float64).reshape(-1), (K,))).astype(np.int64)
        # widths are 1..32, layer classes fewer than 2**24 / 3267
        code = ((sam.reshape(-1, 1, 1) << 24) + ((kind_of.reshape(1, -1, 1) * 3 + np.arange(3).reshape(1, 1, -1)) * 33
                                                  + np.asarray(b1, dtype=np.int64)) * 33
                + np.asarray(b2, dtype=np.int64))
        run = macs > 0
        if run.any():
            if len(self._sig_ids) * 3267 >= 1 << 24:
                raise ValueError("too many distinct layers for one accelerator profile object")
            uniq, inv = np.unique(code[run], return_inverse=True)
            known, te = self._known_codes, self._known_te
            pos = np.minimum(np.searchsorted(known, uniq), max(len(known) - 1, 0))
            hit = (known[pos] == uniq) if len(known) else np.zeros(len(uniq), dtype=bool)
            if not hit.all():
                where = {int(c): int(l) for l, c in enumerate(kind_of.tolist())}
                new_codes = uniq[~hit]
                new_te = np.empty((len(new_codes), 2))
                for i, c in enumerate(new_codes.tolist()):
                    sv, c = divmod(c, 1 << 24)
                    c, y = divmod(c, 33)
                    c, x = divmod(c, 33)
                    cv, pv = divmod(c, 3)
                    lv = where[cv]
                    got = self._array_phase(a, lv, pv, float(sv), float(x), float(y), out_bits, flow, spec, cache)
                    new_te[i] = (np.nan, np.nan) if got is None else got
                known = np.concatenate([known, new_codes])
                te = np.concatenate([te, new_te])
                order = np.argsort(known, kind="stable")
                self._known_codes, self._known_te = known[order], te[order]
                known, te = self._known_codes, self._known_te
                pos = np.searchsorted(known, uniq)
            got = te[pos][inv.reshape(-1)]
            t[run], e[run] = got[:, 0], got[:, 1]
            gap = np.isnan(t)
            if gap.any():
                unpriced.update(a.names[l] for l in np.unique(np.nonzero(gap)[1]).tolist())
                rt, re_ = super().layer_cost(a, macs, b1, b2, bytes_moved, quant_elems, samples)
                t, e = np.where(gap, rt, t), np.where(gap, re_, e)
        cache.flush()
        if unpriced:
            _warn_once(f"cptsim: {self.name}: {len(unpriced)} layer(s) have no recorded shape (e.g. "
                       f"{sorted(unpriced)[0]}): priced as a roofline; profile the model again to price them on the "
                       "array")
        return t, e

    def _array_phase(self, a, l, ph, samples, b1, b2, out_bits, flow, spec, cache):
        """(time s, energy J) of one layer-phase on the array, or None when the profile has no shape for it."""
        # DESIGN.md's phase operands (b1, b2): fwd (b_w, b_a), dgrad (b_g, b_w), wgrad (b_g, b_a); the array's
        # input side is b_a, b_g, b_a and its weight side b_w, b_w, b_g.
        act, wgt = (b2, b1) if ph == 0 else (b1, b2) if ph == 1 else (b2, b1)
        pf = self._packs.get((b1, b2))
        if pf is None:
            pf = self._packs[(b1, b2)] = float(self._pack(b1, b2))
        ob = max(b1, b2) if out_bits == "operand" else float(out_bits)
        alts = problem_alternatives(a, l, ph, samples, float(self._operand_bits(act)),
                                    float(self._operand_bits(wgt)), pf, ob, flow)
        if alts is None:
            return None
        best = None
        for alt in alts:
            cyc = en = 0.0
            for times, prob in alt:
                c, j = cache.get(prob, spec)
                cyc += times * c
                en += times * j
            if best is None or cyc < best[0]:
                best = (cyc, en)
        cyc, en = best
        time = cyc / (self._freq * self._ceff)
        return time, en + self.params["static_power_w"] * time

    def with_formats(self, fmap) -> "HardwareProfile":
        """Integer datapaths only (Bit Fusion's bricks, a bit-serial array, a fixed-width int array): a float
        format family is refused, one line."""
        if fmap is None:
            return self
        raise InputError(f"{self.name} ({self.kind}) computes integers only: --number-format {fmap.family} "
                         "(float formats) cannot run on it; use --number-format int or a gpu profile")

    def storage_bits(self, formats=None):
        """Operands stored as ``_operand_bits`` says, GEMM outputs written at ``output_bits``."""
        out = self.params["output_bits"]

        def accel_store(b):
            return self._operand_bits(b)

        accel_store.output = (lambda b: np.asarray(b, dtype=np.float64)) if out == "operand" \
            else (lambda b: np.full(np.shape(b), float(out)))
        return accel_store

    def _operand_bits(self, b):
        """The bits an operand of width ``b`` is stored in: packed at its width (a fixed-width array overrides)."""
        return b

    def _derive(self) -> None:
        self._freq = self.params["frequency_mhz"] * 1e6
        self._bandwidth = self.params["bandwidth_gb_s"] * 1e9
        self._sig_ids: dict = {}     # a layer's signature (_layer_signatures) -> its class id in the codes below
        self._known_codes = np.zeros(0, dtype=np.int64)  # sorted codes of (samples, class, phase, b1, b2)
        self._known_te = np.zeros((0, 2))                # their (time s, energy J); NaN: no shape recorded
        self._packs: dict = {}

    def _macs_per_cycle(self, b1, b2):
        raise NotImplementedError

    def _core_energy_j(self, macs, b1, b2):
        raise NotImplementedError

    def _throughput(self, b1, b2):
        return self._macs_per_cycle(b1, b2) * self._freq * self._ceff

    def _cost(self, macs, b1, b2, bytes_moved, quant_elems):
        p = self.params
        t = roofline_time(macs, self._throughput(b1, b2), bytes_moved, self._bandwidth * self._meff)
        e = (self._core_energy_j(macs, b1, b2)
             + traffic_energy_j(bytes_moved, p["dram_pj_per_bit"], p["sram_pj_per_dram_bit"])
             + p["static_power_w"] * t)
        return t, e


# ----------------------------------------------------------------------------------------------------------------------
# Argument checks for the vectorized calls
# ----------------------------------------------------------------------------------------------------------------------


def _bits(b, name: str) -> np.ndarray:
    try:
        a = np.asarray(b, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be integer bit widths {MIN_BITS}..{MAX_BITS}, got {b!r}") from None
    if a.size and not (np.all(a == np.rint(a)) and a.min() >= MIN_BITS and a.max() <= MAX_BITS):
        bad = a[~((a == np.rint(a)) & (a >= MIN_BITS) & (a <= MAX_BITS))].flat[0]
        raise InputError(f"{name} must be integer bit widths {MIN_BITS}..{MAX_BITS} (32 = full precision), got {bad:g}")
    return a


def _amount(x, name: str) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be numbers >= 0, got {x!r}") from None
    if a.size and not (np.all(np.isfinite(a)) and a.min() >= 0):
        bad = a[~(np.isfinite(a) & (a >= 0))].flat[0]
        raise InputError(f"{name} must be finite numbers >= 0, got {bad:g}")
    return a


def _gemm_args(macs, b1, b2, bytes_moved, quant_elems):
    args = (_amount(macs, "macs"), _bits(b1, "b1"), _bits(b2, "b2"), _amount(bytes_moved, "bytes_moved"),
            _amount(quant_elems, "quant_elems"))
    try:
        return np.broadcast_arrays(*args)
    except ValueError:
        shapes = ", ".join(str(np.shape(a)) for a in args)
        raise InputError(f"gemm_cost arguments must have one shape (or be scalars), got shapes {shapes}") from None

"""Hardware profiles: what a GEMM at given operand widths costs, in seconds and joules, on one machine.

A profile is one TOML file (``hw_profiles/NAME.toml``, or any path a user gives) of one *kind*; the kind says which
cost formula applies and which numbers it needs. The formulas are the small pure functions below, vectorized over
numpy arrays because the planner costs thousands of schedules at once; the profile classes only hold the numbers
and pass them in. Adding a kind is one class and one entry in ``_KIND_CLASSES``.

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
import json
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from .errors import InputError

KINDS = ("gpu", "bit-fusion", "bit-serial", "fixed-int", "host")
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


# ----------------------------------------------------------------------------------------------------------------------
# The formulas: pure, vectorized, no profile objects. Each docstring gives the formula and where it comes from.
# ----------------------------------------------------------------------------------------------------------------------


def roofline_time(macs, mac_rate, bytes_moved, bandwidth):
    """Time of a phase whose compute and DRAM traffic overlap (double-buffered): ``max(macs / rate, bytes / bw)``.

    The roofline bound (Williams et al., CACM 2009); DESIGN.md "Cost model" for gpu and the accelerators.
    """
    return np.maximum(macs / mac_rate, bytes_moved / bandwidth)


def gpu_tier_index(bmax, narrow_bits, narrow_index, fp32_index):
    """Index of the tier a GEMM with operand widths up to ``bmax`` runs on.

    The smallest tier width >= bmax among the tiers narrower than 32 bits (``narrow_bits`` sorted ascending,
    ``narrow_index`` their positions in the profile's tier list); widths with no such tier (17..32, or 9..16 on a GPU
    without fp16) run on the profile's FP32 tier ``fp32_index``. So cost falls in steps with bits: on an H100,
    which has no int4 tier, a 4-bit GEMM runs at the int8 rate (NVIDIA H100 datasheet; shared/reference/hardware.md).
    """
    narrow_bits = np.asarray(narrow_bits)
    pos = np.searchsorted(narrow_bits, bmax, side="left")
    lookup = np.append(np.asarray(narrow_index, dtype=np.int64), fp32_index)
    return lookup[pos]


def brick_factor(b, high_bits=8, low_bits=2):
    """Bit Fusion's per-operand throughput factor: ``floor(high / max(b, low))`` if b <= high, else ``1/ceil(b/high)``.

    A Fusion Unit holds 16 2-bit BitBricks that fuse to one 8b x 8b multiplier, or split into 2 (8x4), 4 (4x4),
    8 (4x2), 16 (2x2) narrower ones (Sharma et al., ISCA 2018, Sec. III; the authors' simulator,
    github.com/hsharma35/bitfusion src/simulator/accelerator.py ``get_perf_factor``). Widths below 2 bits still
    occupy a 2-bit brick. Operands wider than 8 bits are not fused spatially in the paper; we split them into
    ``ceil(b / 8)`` 8-bit slices processed in successive passes (a 16-bit operand = 2 passes, 32-bit = 4).
    """
    b = np.asarray(b, dtype=np.float64)
    narrow = np.floor(high_bits / np.maximum(b, low_bits))
    wide = 1.0 / np.ceil(b / high_bits)
    return np.where(b <= high_bits, narrow, wide)


def bitfusion_macs_per_unit_cycle(b1, b2, high_bits=8, low_bits=2):
    """MACs per Fusion Unit per cycle: ``brick_factor(b1) * brick_factor(b2)``.

    1 at 8x8, 4 at 4x4, 16 at 2x2 (the brick law), 1/4 at 16x16 (four 8x8 passes), 1/16 at 32x32.
    """
    return brick_factor(b1, high_bits, low_bits) * brick_factor(b2, high_bits, low_bits)


def fixed_int_passes(b1, b2, width_bits=8):
    """Passes of a fixed ``width_bits`` MAC array per MAC: ``ceil(b1 / w) * ceil(b2 / w)``.

    Any width <= w costs exactly one pass (a 3-bit GEMM costs what an 8-bit one does); wider operands are split into
    w-bit slices and every slice pair is one pass (16x16 on an 8-bit array = 4 passes), the usual way fixed-width
    integer arrays run wider arithmetic (cf. the temporal passes in Sharma et al., ISCA 2018).
    """
    b1, b2 = np.asarray(b1, dtype=np.float64), np.asarray(b2, dtype=np.float64)
    return np.ceil(b1 / width_bits) * np.ceil(b2 / width_bits)


def bit_serial_lane_cycles_per_mac(b_parallel, b_serial, parallel_bits=16, serial_bits_per_cycle=1):
    """Lane-cycles one MAC occupies on a bit-serial array: ``ceil(b_parallel / P) * ceil(b_serial / s)``.

    Stripes (Judd et al., MICRO 2016): each lane holds a P-bit (16) parallel operand and consumes the other operand
    ``s`` (1) bit per cycle, so run time scales with the serial operand's width. A parallel operand wider than P
    (a 32-bit full-precision one) takes ``ceil(b / P)`` passes.
    """
    par = np.ceil(np.asarray(b_parallel, dtype=np.float64) / parallel_bits)
    ser = np.ceil(np.asarray(b_serial, dtype=np.float64) / serial_bits_per_cycle)
    return par * ser


def traffic_energy_j(bytes_moved, dram_pj_per_bit, sram_pj_per_dram_bit=0.0):
    """Energy of the DRAM traffic and of the on-chip buffer accesses it causes: ``bytes * 8 * (dram + sram) pJ``.

    DRAM: Horowitz, ISSCC 2014, 1300-2600 pJ per 64-bit access (20-41 pJ/bit). The SRAM term charges each bit
    moved from/to DRAM for its buffer accesses (a write on fill plus a read out; a lower bound on buffer traffic).
    """
    return np.asarray(bytes_moved, dtype=np.float64) * 8.0 * (dram_pj_per_bit + sram_pj_per_dram_bit) * _PJ


def host_time_components(macs, mac_rate, bytes_moved, bandwidth, quant_elems, elem_rate, overhead_s):
    """Seconds of each host term, stacked on a new last axis: compute, memory, element-wise, overhead.

    ``macs / rate``, ``bytes / bw``, ``quant_elems / elem_rate`` and ``overhead_s`` for each layer-phase that
    executes. Fake-quantized training runs every GEMM in FP32 whatever the bits (DESIGN.md "Cost model", host), one
    eager PyTorch op after another, so the terms add up (no overlap). The rates are measured on this machine by
    ``cptsim hw calibrate``; `cptsim report --fit` fits a factor per term to measured runs.
    """
    macs = np.asarray(macs, dtype=np.float64)
    return np.stack((macs / mac_rate, np.asarray(bytes_moved, dtype=np.float64) / bandwidth,
                     np.asarray(quant_elems, dtype=np.float64) / elem_rate,
                     np.where(macs > 0, overhead_s, 0.0)), axis=-1)


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

_CAL_COMPUTE = Field("compute_efficiency", "fraction", "achieved / peak compute rate, fitted from measured runs", 1.0)
_CAL_MEMORY = Field("memory_efficiency", "fraction", "achieved / peak DRAM bandwidth", 1.0)


@dataclass
class HardwareProfile:
    """One machine: its numbers (``params``, as in the TOML file) and the cost formula of its kind.

    Subclasses, one per kind, declare ``PARAMS`` (the keys of the kind's table) and ``CALIBRATION`` and implement
    ``_cost`` / ``_throughput`` / ``describe_bits`` by calling the pure functions above.
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

    KIND: ClassVar[str] = ""
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

    def gemm_cost(self, macs, b1, b2, bytes_moved, quant_elems=0) -> tuple[np.ndarray, np.ndarray]:
        """(time s, energy J) of GEMM phases: ``macs`` MACs with operand widths b1, b2 moving ``bytes_moved`` bytes.

        Vectorized: all arguments broadcast together (arrays of one shape, or scalars). ``quant_elems`` (element-wise
        quantizer element-passes) only costs time on the ``host`` kind. See the kind's class for the formula.
        """
        macs, b1, b2, bytes_moved, quant_elems = _gemm_args(macs, b1, b2, bytes_moved, quant_elems)
        return self._cost(macs, b1, b2, bytes_moved, quant_elems)

    def throughput_macs_per_s(self, b1, b2) -> np.ndarray:
        """Compute rate at widths (b1, b2): the peak at those widths x ``compute_efficiency``, in MAC/s."""
        b1, b2 = np.broadcast_arrays(_bits(b1, "b1"), _bits(b2, "b2"))
        return self._throughput(b1, b2)

    def describe_bits(self, b1: int, b2: int) -> str:
        """How a (b1, b2) GEMM runs here, in a few words (the GPU tier, the passes...)."""
        return ""

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
            "notes": list(self.notes),
        }

    # -- for subclasses -----------------------------------------------------------------------------------------------

    def _cost(self, macs, b1, b2, bytes_moved, quant_elems):
        raise NotImplementedError

    def _throughput(self, b1, b2):
        raise NotImplementedError

    @property
    def _ceff(self) -> float:
        return float(self.calibration["compute_efficiency"])

    @property
    def _meff(self) -> float:
        return float(self.calibration["memory_efficiency"])


class GPUProfile(HardwareProfile):
    """``gpu``: precision tiers with published dense peak rates.

    time   = max(macs / (tier MAC rate x compute_efficiency), bytes / (bandwidth x memory_efficiency))
    energy = power_w x power_fraction x time      (power_fraction 1.0 = board TDP: an upper bound)

    The tier is the narrowest one at least max(b1, b2) bits wide (``gpu_tier_index``). Peak rates are given in
    TOPS / TFLOPS (1e12 ops/s, one MAC = 2 ops, so MAC rate = ops / 2). GEMMs wider than 16 bits (FP32) run on the
    tier named by ``fp32_tier``: default "tf32" where the GPU has it, because PyTorch runs convolutions in TF32 by
    default (``torch.backends.cudnn.allow_tf32 = True``); set ``fp32_tier = "fp32"`` for strict FP32.
    """

    KIND = "gpu"
    PARAMS = (
        Field("bandwidth_gb_s", "positive", "DRAM bandwidth in GB/s (1e9 bytes/s)"),
        Field("power_w", "positive", "board power (TDP) in W"),
        Field("fp32_tier", "string", "name of the tier that runs FP32 GEMMs", None),
    )
    TIER = (
        Field("name", "string", "tier name, e.g. int8"),
        Field("bits", "bits", "widest operand the tier takes"),
        Field("peak_ops", "positive", "dense peak rate in the tier's unit (1e12 ops/s; 1 MAC = 2 ops)"),
        Field("unit", "string", '"TOPS" or "TFLOPS"'),
    )
    CALIBRATION = (
        _CAL_COMPUTE,
        _CAL_MEMORY,
        Field("power_fraction", "fraction", "average power / TDP while training (1.0 = TDP, an upper bound)", 1.0),
    )

    @classmethod
    def parse_params(cls, chk: _Checker, table: dict) -> dict:
        params = chk.fields(table, cls.PARAMS, cls.KIND, nested=("tiers",))
        tiers_raw = table.get("tiers", _MISSING)
        if tiers_raw is _MISSING:
            chk.fail('missing key \'gpu.tiers\' (a list of {name, bits, peak_ops, unit} tables, e.g. '
                     '{name = "int8", bits = 8, peak_ops = 624, unit = "TOPS"})')
        if not isinstance(tiers_raw, list) or not tiers_raw:
            chk.fail(f"gpu.tiers must be a non-empty list of {{name, bits, peak_ops, unit}} tables, got {tiers_raw!r}")
        tiers = []
        for i, t in enumerate(tiers_raw):
            where = f"gpu.tiers[{i}]"
            if not isinstance(t, dict):
                chk.fail(f"{where} must be a table {{name, bits, peak_ops, unit}}, got {t!r}")
            tier = chk.fields(t, cls.TIER, where)
            if tier["unit"] not in ("TOPS", "TFLOPS"):
                chk.fail(f'{where}.unit must be "TOPS" or "TFLOPS" (1e12 ops/s), got {tier["unit"]!r}')
            tiers.append(tier)
        names = [t["name"] for t in tiers]
        for i, n in enumerate(names):
            if n in names[:i]:
                chk.fail(f"gpu.tiers[{i}].name {n!r} is used twice")
        narrow = [t["bits"] for t in tiers if t["bits"] < FULL_PRECISION_BITS]
        if len(set(narrow)) != len(narrow):
            chk.fail("gpu.tiers: two tiers narrower than 32 bits have the same width (which one would run?)")
        wide = [t["name"] for t in tiers if t["bits"] == FULL_PRECISION_BITS]
        fp32 = params["fp32_tier"]
        if fp32 is None:
            fp32 = "tf32" if "tf32" in wide else (wide[0] if len(wide) == 1 else None)
            if fp32 is None:
                chk.fail("gpu.fp32_tier is needed: name the 32-bit tier that runs FP32 GEMMs "
                         f"(32-bit tiers: {', '.join(wide) or 'none - add one with bits = 32'})")
        elif fp32 not in wide:
            chk.fail(f"gpu.fp32_tier must name a tier with bits = 32 ({', '.join(wide) or 'none defined'}), "
                     f"got {fp32!r}")
        params["fp32_tier"] = fp32
        params["tiers"] = tiers
        return params

    def _derive(self) -> None:
        tiers = self.params["tiers"]
        self._tier_names = [t["name"] for t in tiers]
        self._tier_mac_rate = np.array([t["peak_ops"] * 1e12 / 2.0 for t in tiers])
        order = sorted((t["bits"], i) for i, t in enumerate(tiers) if t["bits"] < FULL_PRECISION_BITS)
        self._narrow_bits = np.array([b for b, _ in order], dtype=np.int64)
        self._narrow_index = np.array([i for _, i in order], dtype=np.int64)
        self._fp32_index = self._tier_names.index(self.params["fp32_tier"])
        self._bandwidth = self.params["bandwidth_gb_s"] * 1e9

    def tier_index(self, b1, b2) -> np.ndarray:
        return gpu_tier_index(np.maximum(b1, b2), self._narrow_bits, self._narrow_index, self._fp32_index)

    def _throughput(self, b1, b2):
        return self._tier_mac_rate[self.tier_index(b1, b2)] * self._ceff

    def _cost(self, macs, b1, b2, bytes_moved, quant_elems):
        t = roofline_time(macs, self._throughput(b1, b2), bytes_moved, self._bandwidth * self._meff)
        return t, self.params["power_w"] * self.calibration["power_fraction"] * t

    def describe_bits(self, b1: int, b2: int) -> str:
        return self._tier_names[int(self.tier_index(b1, b2))]


class _AcceleratorProfile(HardwareProfile):
    """Shared by the three 45 nm accelerator models: a core energy per cycle plus DRAM/SRAM traffic and leakage.

    time   = max(compute cycles / (frequency x compute_efficiency), bytes / (bandwidth x memory_efficiency))
    energy = core dynamic energy of the cycles the work occupies + traffic_energy_j(bytes) + static_power_w x time

    Idle units are assumed clock-gated: compute_efficiency stretches time (and so leakage), not dynamic energy.
    """

    COMMON = (
        Field("frequency_mhz", "positive", "clock in MHz"),
        Field("bandwidth_gb_s", "positive", "DRAM bandwidth in GB/s (1e9 bytes/s)"),
        Field("dram_pj_per_bit", "nonneg", "DRAM access energy in pJ per bit"),
        Field("sram_pj_per_dram_bit", "nonneg", "on-chip buffer energy charged per bit moved to/from DRAM, pJ", 0.0),
        Field("static_power_w", "nonneg", "leakage power of the compute array in W", 0.0),
    )

    def _derive(self) -> None:
        self._freq = self.params["frequency_mhz"] * 1e6
        self._bandwidth = self.params["bandwidth_gb_s"] * 1e9

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


class BitFusionProfile(_AcceleratorProfile):
    """``bit-fusion`` (Sharma et al., ISCA 2018): Fusion Units of 2-bit BitBricks that fuse to the operand widths.

    MACs per cycle = fusion_units x bitfusion_macs_per_unit_cycle(b1, b2)   (the brick law, ``brick_factor``)
    core energy    = core_pj_per_unit_cycle x unit-cycles,  unit-cycles = macs / bitfusion_macs_per_unit_cycle
    so the core energy per MAC is 0.46 pJ at 8x8, 0.115 at 4x4, 0.029 at 2x2 with the shipped numbers
    (synthesis data in github.com/hsharma35/bitfusion results/systolic_array_synth.csv).
    """

    KIND = "bit-fusion"
    PARAMS = (
        Field("fusion_units", "count", "number of Fusion Units (16 x 32 = 512 in the paper's Eyeriss-matched design)"),
        Field("high_bits", "count", "widest operand one fused unit takes in one pass", 8),
        Field("low_bits", "count", "BitBrick width", 2),
        Field("core_pj_per_unit_cycle", "positive", "dynamic energy of one Fusion Unit per busy cycle, pJ"),
    ) + _AcceleratorProfile.COMMON

    @classmethod
    def parse_params(cls, chk: _Checker, table: dict) -> dict:
        params = super().parse_params(chk, table)
        if params["low_bits"] > params["high_bits"]:
            chk.fail(f"bit-fusion.low_bits must be <= high_bits ({params['high_bits']}), got {params['low_bits']}")
        return params

    def _per_unit(self, b1, b2):
        return bitfusion_macs_per_unit_cycle(b1, b2, self.params["high_bits"], self.params["low_bits"])

    def _macs_per_cycle(self, b1, b2):
        return self.params["fusion_units"] * self._per_unit(b1, b2)

    def _core_energy_j(self, macs, b1, b2):
        return macs / self._per_unit(b1, b2) * self.params["core_pj_per_unit_cycle"] * _PJ

    def describe_bits(self, b1: int, b2: int) -> str:
        f = float(self._per_unit(b1, b2))
        return f"{f:g} MAC/unit/cycle" if f >= 1 else f"{round(1 / f)} passes"


class BitSerialProfile(_AcceleratorProfile):
    """``bit-serial`` (Stripes-like, Judd et al., MICRO 2016): time proportional to the serial operand's width.

    MACs per cycle = lanes / bit_serial_lane_cycles_per_mac(b1, b2)
    core energy    = pj_per_lane_cycle x macs x bit_serial_lane_cycles_per_mac(b1, b2)

    ``b1`` takes the parallel path (``parallel_bits`` = 16 wide), ``b2`` is streamed one bit per cycle. Callers pass
    the phases in DESIGN.md's order: forward (b_w, b_a) streams the activations as Stripes does; dgrad (b_g, b_w)
    streams the weights and wgrad (b_g, b_a) the activations, with the gradient on the 16-bit parallel path — a GEMM
    may stream either operand, and this way all three phases scale with CPT's cycling precision q while the static
    gradient precision (8 bits) fits the parallel path.
    """

    KIND = "bit-serial"
    PARAMS = (
        Field("lanes", "count", "bit-serial lanes, each a parallel_bits x 1-bit multiplier-adder"),
        Field("parallel_bits", "count", "width of each lane's parallel operand", 16),
        Field("serial_bits_per_cycle", "count", "bits of the serial operand a lane consumes per cycle", 1),
        Field("pj_per_lane_cycle", "positive", "dynamic energy of one lane per busy cycle, pJ"),
    ) + _AcceleratorProfile.COMMON

    def _lane_cycles(self, b1, b2):
        p = self.params
        return bit_serial_lane_cycles_per_mac(b1, b2, p["parallel_bits"], p["serial_bits_per_cycle"])

    def _macs_per_cycle(self, b1, b2):
        return self.params["lanes"] / self._lane_cycles(b1, b2)

    def _core_energy_j(self, macs, b1, b2):
        return macs * self._lane_cycles(b1, b2) * self.params["pj_per_lane_cycle"] * _PJ

    def describe_bits(self, b1: int, b2: int) -> str:
        return f"{float(self._lane_cycles(b1, b2)):g} lane-cycles/MAC"


class FixedIntProfile(_AcceleratorProfile):
    """``fixed-int``: a fixed-width integer MAC array; every width <= ``width_bits`` costs the same.

    MACs per cycle = mac_units / fixed_int_passes(b1, b2, width_bits)
    core energy    = pj_per_mac x macs x fixed_int_passes(b1, b2, width_bits)
    """

    KIND = "fixed-int"
    PARAMS = (
        Field("mac_units", "count", "MAC units in the array"),
        Field("width_bits", "count", "operand width of the MAC units", 8),
        Field("pj_per_mac", "positive", "dynamic energy of one width_bits x width_bits MAC, pJ"),
    ) + _AcceleratorProfile.COMMON

    def _passes(self, b1, b2):
        return fixed_int_passes(b1, b2, self.params["width_bits"])

    def _macs_per_cycle(self, b1, b2):
        return self.params["mac_units"] / self._passes(b1, b2)

    def _core_energy_j(self, macs, b1, b2):
        return macs * self._passes(b1, b2) * self.params["pj_per_mac"] * _PJ

    def describe_bits(self, b1: int, b2: int) -> str:
        n = int(self._passes(b1, b2))
        return "1 pass" if n == 1 else f"{n} passes"


class HostProfile(HardwareProfile):
    """``host``: the machine cptsim runs on; fake-quantized training runs in FP32, so bits do not change the time.

    time   = macs / (matmul rate x compute_efficiency) + bytes / (bandwidth x memory_efficiency)
             + quant_elems / elementwise rate + layer_overhead for every layer-phase that executes
             (host_time_components, weighted by ``factors()``)
    The overhead term is what makes small layers and small batches cost more than their MACs say: a training step
    of a CIFAR ResNet at batch 32 on a CPU is dominated by per-op costs, not by arithmetic.
    energy = power_w x time            (power_w = 0 means unknown: energy is reported as 0)
    Rates are measured by ``cptsim hw calibrate`` (cptsim.calibrate); the shipped host.toml is a placeholder.

    On a CUDA device (``device = "cuda"``) the same sum is the overlap model: ``cptsim train`` replays each step as a
    CUDA graph (cptsim.cudagraph), so the host's dispatch -- what adds to the GPU's time when ops launch one by one,
    and overlaps it otherwise -- is one launch per step and hidden; what remains is GPU time, whose terms follow one
    another on the device and add up. ``hw calibrate --device cuda`` measures every rate that way (conv forward +
    backward, fused quantizers and the tiny-layer step replayed as graphs), so ``layer_overhead`` is the GPU's
    fixed cost per layer-phase (small kernels), not the host's. Steps that ran without graphs are flagged by the
    report. Measured on an H200: held-out imagenet-resnet18 within 5% after a fit on resnet20
    (benchmarks/results/gpu_check_H200_run2.txt).
    """

    KIND = "host"
    PARAMS = (
        Field("matmul_gmac_s", "positive", "FP32 matmul rate in 1e9 MAC/s"),
        Field("bandwidth_gb_s", "positive", "memory bandwidth in GB/s (bytes read + written per second)"),
        Field("elementwise_gelem_s", "positive", "quantizer element-wise rate in 1e9 elements/s"),
        Field("layer_overhead_us", "nonneg", "fixed time per executed layer-phase in microseconds (op dispatch, "
              "autograd, and the per-layer work that does not scale with MACs)", 0.0),
        Field("power_w", "nonneg", "average power while training in W; 0 = unknown"),
        Field("calibrated", "bool", "true when the numbers were measured on this machine"),
        Field("device", "string", '"cpu" or "cuda"', "cpu"),
        Field("threads", "count", "threads the measurement used", 1),
        Field("cpu", "string", "processor model", "unknown"),
        Field("torch_version", "string", "torch version that measured", "unknown"),
        Field("measured_at", "string", "when it was measured (ISO 8601)", "never"),
    )
    CALIBRATION = (
        Field("compute_efficiency", "positive", "achieved / measured matmul rate, fitted from runs", 1.0),
        Field("memory_efficiency", "positive", "achieved / measured bandwidth, fitted from runs", 1.0),
    )

    def _derive(self) -> None:
        p = self.params
        self._mac_rate = p["matmul_gmac_s"] * 1e9
        self._bandwidth = p["bandwidth_gb_s"] * 1e9
        self._elem_rate = p["elementwise_gelem_s"] * 1e9
        self._overhead_s = p["layer_overhead_us"] * 1e-6
        if p["power_w"] == 0 and not any("power" in n for n in self.notes):
            self.notes.append("power unknown (power_w = 0): energy is reported as 0 J")
        if not p["calibrated"]:
            self.notes.append("placeholder numbers, not measured here: run `cptsim hw calibrate`")

    def _throughput(self, b1, b2):
        return np.full(np.shape(b1), self._mac_rate * self._ceff)

    def time_components(self, macs, bytes_moved, quant_elems) -> np.ndarray:
        """Uncalibrated seconds per term (..., 4): compute, memory, element-wise, overhead."""
        return host_time_components(macs, self._mac_rate, bytes_moved, self._bandwidth, quant_elems,
                                    self._elem_rate, self._overhead_s)

    def factors(self) -> np.ndarray:
        """What this profile's calibration multiplies each term by (compute and memory efficiencies)."""
        return np.array([1.0 / self._ceff, 1.0 / self._meff, 1.0, 1.0])

    def _cost(self, macs, b1, b2, bytes_moved, quant_elems):
        t = self.time_components(macs, bytes_moved, quant_elems) @ self.factors()
        return t, self.params["power_w"] * t

    def describe_bits(self, b1: int, b2: int) -> str:
        return "fp32 (fake-quant)"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(float(f"{v:.6g}"))
    return json.dumps(str(v))  # a JSON string (ASCII, escaped) is a valid TOML basic string


def host_profile_text(name: str, description: str, sources: list[str], params: dict, calibration: dict,
                      header: list[str] = (), comments: dict | None = None) -> str:
    """The text of a ``host`` profile file: the one writer of the format that ``load_profile`` reads.

    ``header``: comment lines for the top; ``comments``: a trailing comment per [host] key. The text is checked by
    parsing it back before it is returned, so a writer can never leave a profile that will not load.
    """
    comments = comments or {}
    lines = [*(f"# {h}" for h in header),
             f"name = {_toml_value(name)}", 'kind = "host"', f"description = {_toml_value(description)}",
             "sources = [" + ", ".join(_toml_value(x) for x in sources) + "]", "", "[host]"]
    for k, v in params.items():
        lines.append(f"{k} = {_toml_value(v)}" + (f"  # {comments[k]}" if k in comments else ""))
    lines += ["", "[calibration]", *(f"{k} = {_toml_value(v)}" for k, v in calibration.items()), ""]
    text = "\n".join(lines)
    parse_profile(text.encode("utf-8"), f"{name}.toml")
    return text


_KIND_CLASSES: dict[str, type[HardwareProfile]] = {
    "gpu": GPUProfile,
    "bit-fusion": BitFusionProfile,
    "bit-serial": BitSerialProfile,
    "fixed-int": FixedIntProfile,
    "host": HostProfile,
}
assert tuple(_KIND_CLASSES) == KINDS


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


# ----------------------------------------------------------------------------------------------------------------------
# Finding and loading files
# ----------------------------------------------------------------------------------------------------------------------


def user_profile_dir() -> Path:
    """Where the user's own profiles live (``cptsim hw calibrate`` writes host.toml there).

    ``$CPTSIM_HOME/hw_profiles`` if CPTSIM_HOME is set, else ``$XDG_CONFIG_HOME/cptsim/hw_profiles``
    (``~/.config/cptsim/hw_profiles``).
    """
    home = os.environ.get("CPTSIM_HOME")
    if home:
        return Path(home).expanduser() / "hw_profiles"
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config).expanduser() / "cptsim" / "hw_profiles"


def _shipped() -> dict[str, Any]:
    root = resources.files("cptsim.hw_profiles")
    return {p.name[:-5]: p for p in root.iterdir() if p.name.endswith(".toml")}


def _user() -> dict[str, Path]:
    d = user_profile_dir()
    if not d.is_dir():
        return {}
    return {p.stem: p for p in d.glob("*.toml") if p.is_file()}


def list_profiles() -> list[str]:
    """Names ``load_profile`` accepts: the shipped profiles plus the user's (e.g. a calibrated host), sorted."""
    return sorted(set(_shipped()) | set(_user()))


def profile_origin(name: str) -> str:
    """"user" when ``load_profile(name)`` reads the user's directory, else "shipped"."""
    return "user" if name in _user() else "shipped"


def _looks_like_path(s: str) -> bool:
    return s.endswith(".toml") or "/" in s or os.sep in s or (os.altsep is not None and os.altsep in s)


def load_profile(name_or_path: str) -> HardwareProfile:
    """A profile by name (the user's directory first, then the shipped ones) or by path to a .toml file.

    Raises InputError naming the file, the key and what was expected for anything wrong with it.
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise InputError(f"hardware profile must be a name or a path, got {name_or_path!r}")
    s = os.fspath(name_or_path)
    if not s.strip():
        raise InputError(f"hardware profile name is empty (valid: {', '.join(list_profiles())})")
    if isinstance(name_or_path, os.PathLike) or _looks_like_path(s) or Path(s).is_file():
        p = Path(s).expanduser()
        if not p.is_file():
            raise InputError(f"hardware profile file not found: {s}")
        try:
            data = p.read_bytes()
        except OSError as e:
            raise InputError(f"cannot read hardware profile {s}: {e.strerror}") from None
        return parse_profile(data, label=s, path=str(p.resolve()))
    user = _user()
    if s in user:
        p = user[s]
        return parse_profile(p.read_bytes(), label=str(p), path=str(p), expect_name=s)
    shipped = _shipped()
    if s in shipped:
        res = shipped[s]
        return parse_profile(res.read_bytes(), label=res.name, path=str(res), expect_name=s)
    raise InputError(f"unknown hardware profile {s!r} (valid: {', '.join(list_profiles())}; or a path to a .toml file)")


_TOP = (
    Field("name", "string", "the profile's name: letters, digits, '.', '_', '-'"),
    Field("kind", "string", f"one of {', '.join(KINDS)}"),
    Field("description", "string", "one line saying which machine this is"),
    Field("sources", "list", "citations: where the numbers come from"),
)
_TOML_POS = re.compile(r"^(?P<msg>.*) \(at line (?P<line>\d+), column (?P<col>\d+)\)$")


def parse_profile(data: bytes, label: str, path: str = "", expect_name: str | None = None) -> HardwareProfile:
    """Validate and build a profile from a TOML file's bytes; ``label`` names the file in error messages."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{label}: not UTF-8 text (a TOML file was expected)") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = _TOML_POS.match(str(e))
        where = f"{label}:{m['line']}:{m['col']}" if m else label
        raise InputError(f"{where}: invalid TOML: {m['msg'] if m else e}") from None
    chk = _Checker(label)

    # The kind first: it says which table the file must have, so it decides what counts as an unknown key.
    if "kind" not in doc:
        chk.fail(f"missing key 'kind' (one of {', '.join(KINDS)})")
    kind = doc["kind"]
    if not isinstance(kind, str) or kind not in _KIND_CLASSES:
        chk.fail(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    head = chk.fields(doc, _TOP, "", nested=(kind, "calibration"))
    if not _NAME_RE.match(head["name"]):
        chk.fail(f"name must be letters, digits, '.', '_' or '-', got {head['name']!r}")
    if expect_name is not None and head["name"] != expect_name:
        chk.fail(f"name {head['name']!r} must match the file name {expect_name!r}")
    sources = head["sources"]
    if not (isinstance(sources, list) and sources and all(isinstance(x, str) and x.strip() for x in sources)):
        chk.fail(f"sources must be a non-empty list of non-empty strings (citations), got {sources!r}")

    cls = _KIND_CLASSES[kind]
    params = cls.parse_params(chk, chk.table(doc, kind, f"the numbers of a {kind} profile"))
    cal_table = doc.get("calibration", {})
    if not isinstance(cal_table, dict):
        chk.fail(f"calibration must be a table [calibration], got {cal_table!r}")
    calibration = chk.fields(cal_table, cls.CALIBRATION, "calibration")

    return cls(
        name=head["name"], kind=kind, description=head["description"], sources=list(sources), path=path,
        content_hash=hashlib.sha256(data).hexdigest()[:16], params=params, calibration=calibration,
    )


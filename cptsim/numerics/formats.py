"""Number formats beyond CPT's integers: a registry and exact (fake-)quantize functions.

Pure functions, no state. ``quantize(x, fmt)`` returns the dequantized FP32 tensor: what a tensor stored in ``fmt``
reads back as. Every float path rounds to nearest, ties to even, saturates (a finite input never becomes NaN or inf:
values beyond the largest finite magnitude clamp to it) and keeps subnormals; ``rounding="stochastic"`` rounds each
element to one of its two neighbours on the format's grid with probability given by the distance (unbiased inside the
range), for errors (output gradients), as ``cptsim.numerics.quant`` does for integers. Vectorised torch, no loop over
elements or blocks. NaN inputs stay NaN; nothing else makes one.

The formats (``FORMATS``, ``parse_format``):

* ``int2``..``int16``: today's CPT integers, unchanged -- uniform, asymmetric min/max range, per tensor
  (activations; ``quant.fake_quant_per_tensor``, stochastic ``quant.fake_quant_stochastic``) or per output channel
  (weights: ``channel_axis=0``, ``quant.fake_quant_per_channel``). The range's FP32 scale and zero point are not
  counted in storage bits (one pair per tensor or channel).
* ``fp8e4m3``, ``fp8e5m2``, ``fp6e3m2``, ``fp6e2m3``, ``fp4e2m1``: the element format with one FP32 scale per
  tensor, chosen as Transformer Engine's current scaling does (NVIDIA/TransformerEngine
  docs/.../fp8_current_scaling.rst): ``s = max_elem / amax`` in FP32 (amax 0 -> s = 1; s capped at FP32's largest
  finite value), element = round(x * s), read back as element / s.
* ``mxfp8`` (E4M3 elements), ``mxfp8e5m2``, ``mxfp6`` (= ``mxfp6e3m2``), ``mxfp6e2m3``, ``mxfp4`` (E2M1),
  ``mxint8``: OCP Microscaling v1.0 -- blocks of k = 32 consecutive elements along ``dim`` (the reduction
  dimension of the GEMM that consumes the tensor), one E8M0 (power-of-two) scale per block. ``mxfp6`` names E3M2
  as the OCP spec lists MXFP6's two element types (E2M3 and E3M2) -- both are here, ``mxfp6`` picks E3M2 for range,
  as ``mxfp8`` picks E4M3 (the spec's and Transformer Engine's default for MXFP8). The scale rule is selectable:
  ``floor`` (the OCP spec's, section 6.3: X = 2^(floor(log2 amax) - emax_elem), clamped to E8M0's [-127, 127]; elements
  that then exceed the element maximum saturate) or ``rceil`` (NVIDIA's for MXFP8, cuBLAS "1D block quantization" /
  Transformer Engine mxfp8.rst / PTX ``cvt.rp.satfinite.ue8m0x2.f32``: X = 2^ceil(log2(amax / max_elem)), the
  quotient computed in FP32, clamped to [-127, 127]). Pick it with a name suffix (``"mxfp8:rceil"``) or
  ``quantize(..., scale_rule="rceil")``. A length along ``dim`` that is not a multiple of 32 ends in a partial block,
  quantized as if padded with zeros (zeros change no block maximum).
* ``nvfp4``: NVIDIA's NVFP4 (arXiv 2509.25149; Transformer Engine common/cast/nvfp4/core_nvfp4.cuh): E2M1
  elements, blocks of 16 along ``dim`` with an E4M3 scale each (unsigned use), one FP32 scale per tensor:
  ``S_enc = 448 * 6 / amax_tensor`` (capped at FP32's max; 1 when amax is 0), block scale
  ``s_b = e4m3(amax_block / 6 * S_enc)`` (RNE, saturating at 448, subnormals kept), elements
  ``e2m1(x * (S_enc / s_b))`` (0 where s_b is 0), read back as ``element * s_b / S_enc``. 1-D blocks only (TE's
  16x16 weight blocks and the random Hadamard transform are recipe choices for later items).
* ``bf16``, ``fp16``: IEEE-style casts (RNE, subnormals), saturating at the largest finite value instead of inf.
* ``fp32``: no quantization (the input, as float32).

Reading back: a scaled value beyond FP32's range (possible only where rounding goes up past an amax near FLT_MAX, e.g.
MXFP4 under rceil: 3e38 -> 4 * 2^126 = 2^128) reads back as +-FLT_MAX.

Element constants (bias, max, emax_elem) are those of the OCP MX v1.0 spec as tabulated in
graphcore-research/gfloat ``formats.py`` and pytorch/ao ``torchao/prototype/mx_formats/constants.py``; MXINT8's element is
microxcaling's ``int8`` (Microsoft's MX reference emulator ``mx/formats.py``: ebits 0, mbits 8, emax 0): a two's
complement 8-bit integer times 2^-6, saturating symmetrically at +-127/64 (microxcaling's ``saturate_normals`` clamps
to +-max_norm; gfloat lets -128/64 = -2.0 through: the two differ only for values below -127.5/64 of the scale).

Storage bits per element amortise the shared scales: MX b + 8/32 (MXFP4 4.25, MXFP6 6.25, MXFP8/MXINT8 8.25), NVFP4
4 + 8/16 = 4.5 (its one FP32 per tensor is not counted, nor the per-tensor FP32 scale of the fp8/fp6/fp4 formats).

May import: ``cptsim.errors`` and ``cptsim.numerics.quant`` (first stage; see tests/test_layout.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from cptsim.errors import InputError
from cptsim.numerics import quant

__all__ = ["ElementFormat", "Format", "FORMATS", "ELEMENTS", "SCALE_RULES", "ROUNDINGS", "parse_format",
           "format_names", "quantize", "round_element", "mx_scale_exponent", "quantize_error", "QuantFormatSTE",
           "per_tensor_scale"]

ROUNDINGS = ("nearest", "stochastic")
SCALE_RULES = ("floor", "rceil")
MX_BLOCK = 32
NVFP4_BLOCK = 16
_F32_MAX = torch.finfo(torch.float32).max


@dataclass(frozen=True)
class ElementFormat:
    """A sign-magnitude element grid: values m * 2^(e - mbits), m an integer, e >= emin (below 2^emin the quantum
    stays 2^(emin - mbits): the subnormals), magnitudes up to ``max`` (saturation). ``emax`` is floor(log2 max),
    the MX spec's emax_elem. ``ebits`` is 0 for a fixed-point element (MXINT8's)."""

    name: str
    ebits: int
    mbits: int  # explicit mantissa (fraction) bits
    emin: int  # exponent of the smallest normal (1 - bias)
    max: float
    emax: int

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits if self.ebits else 8  # fixed point: 8-bit two's complement

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.mbits)


def _fp(name: str, ebits: int, mbits: int, bias: int, max_: float) -> ElementFormat:
    import math
    return ElementFormat(name, ebits, mbits, 1 - bias, float(max_), math.floor(math.log2(max_)))


# Sources: gfloat formats.py (bias, max, smallest subnormal of each), torchao constants.py (*_MAX, *_MAX_POW2).
ELEMENTS: dict[str, ElementFormat] = {e.name: e for e in (
    _fp("e4m3", 4, 3, 7, 448.0),  # OCP FP8 E4M3 ("fn": no inf, NaN only S.1111.111); 2^-9 .. 448
    _fp("e5m2", 5, 2, 15, 57344.0),  # OCP FP8 E5M2 (IEEE-like); 2^-16 .. 57344 (inf/NaN codes never produced here)
    _fp("e3m2", 3, 2, 3, 28.0),  # OCP FP6 E3M2, no inf/NaN; 0.0625 .. 28
    _fp("e2m3", 2, 3, 1, 7.5),  # OCP FP6 E2M3, no inf/NaN; 0.125 .. 7.5
    _fp("e2m1", 2, 1, 1, 6.0),  # OCP FP4 E2M1, no inf/NaN; {0, 0.5, 1, 1.5, 2, 3, 4, 6}
    ElementFormat("int8", 0, 6, 0, 127 / 64, 0),  # MXINT8 element: k/64, |k| <= 127 (microxcaling int8, emax 0)
    _fp("fp16", 5, 10, 15, 65504.0),  # IEEE binary16
    _fp("bf16", 8, 7, 127, float(torch.finfo(torch.bfloat16).max)),  # bfloat16
)}


@dataclass(frozen=True)
class Format:
    """One number format of the registry.

    ``family``: int | fp | mx | nvfp. ``element_bits``: bits of one stored element (what BitOPs count).
    ``storage_bits``: bits per element with the shared scales amortised (what memory traffic counts).
    ``element``: the element grid (None for the integer formats and fp32). ``block``: elements per shared scale
    (0: one scale per tensor, or none). ``scale_rule``: MX only, ``floor`` (OCP) or ``rceil`` (NVIDIA)."""

    name: str
    family: str
    element_bits: int
    storage_bits: float
    element: ElementFormat | None = None
    block: int = 0
    scale: str = "none"  # none | minmax (int) | fp32 (per tensor) | e8m0 (MX) | e4m3+fp32 (NVFP4) | cast
    scale_rule: str | None = None
    int_bits: int | None = None

    def with_scale_rule(self, rule: str) -> "Format":
        if self.family != "mx":
            raise InputError(f"a scale rule applies to MX formats only, not {self.name}")
        if rule not in SCALE_RULES:
            raise InputError(f"unknown MX scale rule {rule!r}; valid: {', '.join(SCALE_RULES)}")
        base = self.name.split(":")[0]
        return dataclasses.replace(self, name=base if rule == "floor" else f"{base}:{rule}", scale_rule=rule)


def _registry() -> dict[str, Format]:
    E = ELEMENTS
    out: dict[str, Format] = {}
    for b in range(2, 17):
        out[f"int{b}"] = Format(f"int{b}", "int", b, float(b), scale="minmax", int_bits=b)
    for name, el in (("fp8e4m3", "e4m3"), ("fp8e5m2", "e5m2"), ("fp6e3m2", "e3m2"), ("fp6e2m3", "e2m3"),
                     ("fp4e2m1", "e2m1")):
        bits = E[el].bits
        out[name] = Format(name, "fp", bits, float(bits), E[el], scale="fp32")
    for name, el in (("mxfp8", "e4m3"), ("mxfp8e5m2", "e5m2"), ("mxfp6", "e3m2"), ("mxfp6e3m2", "e3m2"),
                     ("mxfp6e2m3", "e2m3"), ("mxfp4", "e2m1"), ("mxint8", "int8")):
        bits = E[el].bits
        out[name] = Format(name, "mx", bits, bits + 8 / MX_BLOCK, E[el], MX_BLOCK, "e8m0", "floor")
    out["nvfp4"] = Format("nvfp4", "nvfp", 4, 4 + 8 / NVFP4_BLOCK, E["e2m1"], NVFP4_BLOCK, "e4m3+fp32")
    out["bf16"] = Format("bf16", "fp", 16, 16.0, E["bf16"], scale="cast")
    out["fp16"] = Format("fp16", "fp", 16, 16.0, E["fp16"], scale="cast")
    out["fp32"] = Format("fp32", "fp", 32, 32.0)
    return out


FORMATS: dict[str, Format] = _registry()


def format_names() -> list[str]:
    return list(FORMATS)


def parse_format(name: str | Format) -> Format:
    """A format by name (``"mxfp8"``, ``"nvfp4"``, ``"int8"``; an MX name may end in ``:floor`` or ``:rceil``).
    Unknown names raise a one-line ``InputError`` listing the valid ones."""
    if isinstance(name, Format):
        return name
    key = str(name).strip().lower()
    base, _, rule = key.partition(":")
    fmt = FORMATS.get(base)
    if fmt is None or (rule and fmt.family != "mx"):
        raise InputError(f"unknown number format {name!r}; valid: {', '.join(FORMATS)} "
                         f"(MX names may end in :floor or :rceil)")
    return fmt.with_scale_rule(rule) if rule else fmt


# ----------------------------------------------------------------------------------------------------------------------
# Bit-level helpers (exact: powers of two are built from their bit patterns, never from exp2/log2).

def _pow2(e: torch.Tensor) -> torch.Tensor:
    """2.0**e as float32 for integer tensors e in [-149, 127], exactly (subnormal powers included)."""
    e = e.to(torch.int32)
    normal = torch.bitwise_left_shift(e.clamp(min=-126) + 127, 23)
    sub = torch.bitwise_left_shift(torch.ones_like(e), (e + 149).clamp(0, 22))
    return torch.where(e >= -126, normal, sub).view(torch.float32)


def _floor_log2(a: torch.Tensor) -> torch.Tensor:
    """floor(log2 a) for float32 a > 0 from the exponent field; -127 for subnormals and zero (every caller clamps
    to an exponent >= -127, so the true value of a subnormal's exponent never matters)."""
    return torch.bitwise_right_shift(a.view(torch.int32), 23).bitwise_and_(0xFF).sub_(127)


def _ceil_log2(a: torch.Tensor) -> torch.Tensor:
    """ceil(log2 a) for float32 a >= 0, clamped below at -127 (0 and a <= 2^-127 give -127)."""
    bits = a.view(torch.int32)
    e = torch.bitwise_right_shift(bits, 23).bitwise_and_(0xFF)
    frac = bits.bitwise_and(0x7FFFFF)
    normal = e - 127 + (frac != 0).to(torch.int32)
    sub = torch.where(frac > (1 << 22), -126, -127)  # subnormal: above 2^-127 rounds up to 2^-126
    return torch.where(e > 0, normal, sub).to(torch.int32)


def round_element(y: torch.Tensor, el: ElementFormat, rounding: str = "nearest",
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Round float32 ``y`` onto the element grid ``el``: saturate |y| at ``el.max``, then round to nearest even (or
    stochastically) with quantum 2^(max(floor(log2|y|), emin) - mbits). Sign kept (a negative value that rounds to
    zero gives -0.0, as ml_dtypes and torch's float8 casts do). Exact for grids whose quantum is >= 2^-24 (every
    element format here; bf16 goes through ``_round_bf16``)."""
    y = y.float()
    a = y.abs().clamp_(max=el.max)  # saturation (NaN stays NaN)
    # biased float32 exponent of the quantum: max(floor(log2 a), emin) - mbits (+127); >= 103 for every grid here,
    # so the quantum and its inverse are normal float32 powers of two built from their bits
    eq = torch.bitwise_right_shift(a.view(torch.int32), 23).clamp_(min=el.emin + 127).sub_(el.mbits)
    n = a * torch.bitwise_left_shift(254 - eq, 23).view(torch.float32)  # |y| in quanta: exact, < 2^(mbits+1)
    if rounding == "nearest":
        n.round_()  # half to even
    else:
        n.add_(torch.rand(n.shape, generator=generator, device=n.device)).floor_()
    out = torch.copysign(n.mul_(torch.bitwise_left_shift(eq, 23).view(torch.float32)).clamp_(max=el.max), y)
    return out.add_(0.0) if el.ebits == 0 else out  # a two's complement element has no -0


def _round_bf16(y: torch.Tensor, rounding: str, generator: torch.Generator | None) -> torch.Tensor:
    """bfloat16: torch's cast (RNE) after clamping to bf16's max; stochastic: add 16 uniform random bits below the
    kept 16 and truncate (exact and unbiased: the bit pattern is monotone in the value, subnormals included)."""
    bmax = ELEMENTS["bf16"].max
    y = y.float()
    if rounding == "nearest":
        return y.clamp(-bmax, bmax).to(torch.bfloat16).float()
    bits = y.view(torch.int32)
    r = torch.randint(0, 1 << 16, y.shape, generator=generator, device=y.device, dtype=torch.int32)
    mag = bits.bitwise_and(0x7FFFFFFF).add_(r).bitwise_and_(~0xFFFF)
    out = mag.view(torch.float32).clamp_(max=bmax)  # a carry past the max bf16 lands on inf: saturate
    out = torch.where(torch.isnan(y), y, out)
    return torch.copysign(out, y)


def _check_rounding(rounding: str) -> None:
    if rounding not in ROUNDINGS:
        raise InputError(f"unknown rounding {rounding!r}; valid: {', '.join(ROUNDINGS)}")


# ----------------------------------------------------------------------------------------------------------------------
# Block helpers: move ``dim`` last, pad to whole blocks with zeros, view as (..., blocks, k); and back.

def _blocks(x: torch.Tensor, dim: int, k: int) -> tuple[torch.Tensor, tuple]:
    x = x.float()
    if x.dim() == 0:
        x = x.reshape(1)
        dim, restore = 0, ((), 0, 1, True)
    else:
        dim = dim % x.dim()
        restore = (x.shape, dim, x.shape[dim], False)
    t = x.movedim(dim, -1)
    n = t.shape[-1]
    pad = (-n) % k
    if pad:
        t = torch.nn.functional.pad(t, (0, pad))
    return t.reshape(*t.shape[:-1], -1, k), restore


def _unblocks(b: torch.Tensor, restore: tuple) -> torch.Tensor:
    shape, dim, n, scalar = restore
    t = b.reshape(*b.shape[:-2], -1)[..., :n]
    if scalar:
        return t.reshape(())
    return t.movedim(-1, dim).contiguous()


def mx_scale_exponent(amax: torch.Tensor, el: ElementFormat, rule: str = "floor") -> torch.Tensor:
    """The E8M0 shared exponent (unbiased, int32 in [-127, 127]) of blocks whose largest magnitude is ``amax``.

    floor (OCP MX v1.0 section 6.3): floor(log2 amax) - emax_elem; an all-zero block gets -127 (gfloat's
    ``compute_scale_amax``; any scale would do). rceil (NVIDIA, cuBLAS 1D block quantization for MXFP8):
    ceil(log2(fl32(amax / max_elem))), i.e. the smallest power of two X with amax / X <= max_elem (up to the FP32
    rounding of the quotient). Both clamp to E8M0's finite range [-127, 127]: a finite input never needs 0xFF (NaN)
    except MXINT8 under rceil at amax > 2^127 * 127/64, which saturates instead."""
    a = amax.float()
    if rule == "floor":
        se = _floor_log2(a) - el.emax
    elif rule == "rceil":
        se = _ceil_log2(a / el.max)
    else:
        raise InputError(f"unknown MX scale rule {rule!r}; valid: {', '.join(SCALE_RULES)}")
    return se.clamp(-127, 127).to(torch.int32)


def _saturate_f32(y: torch.Tensor) -> torch.Tensor:
    """Read-back saturation: a stored value beyond FP32's range (MXFP4 under rceil holds 4 * 2^126 = 2^128 for an
    input near 3e38; an element rounded up past a near-FLT_MAX amax) reads back as +-FLT_MAX, never inf."""
    return y.clamp_(-_F32_MAX, _F32_MAX)


def _quantize_mx(x: torch.Tensor, fmt: Format, rounding: str, generator, dim: int, rule: str) -> torch.Tensor:
    b, restore = _blocks(x, dim, fmt.block)
    amax = b.abs().amax(dim=-1, keepdim=True)
    se = mx_scale_exponent(amax, fmt.element, rule)
    # b * 2^-se and q * 2^se are exact: a power-of-two scale, and every element quantum * 2^se >= 2^-143 is a float32
    # value; values that underflow float32 in b * 2^-se lie far below half the element's smallest subnormal.
    q = round_element(b * _pow2(-se), fmt.element, rounding, generator)
    return _unblocks(_saturate_f32(q.mul_(_pow2(se))), restore)


def _e4m3(y: torch.Tensor) -> torch.Tensor:
    return round_element(y, ELEMENTS["e4m3"])


def _quantize_nvfp4(x: torch.Tensor, fmt: Format, rounding: str, generator, dim: int) -> torch.Tensor:
    b, restore = _blocks(x, dim, fmt.block)
    amax_t = b.abs().amax()
    # (torch.div, not ``2688.0 / amax_t``: a Python number over a tensor is computed as number * (1 / tensor), which
    # rounds twice)
    s_enc = torch.clamp(torch.div(torch.full_like(amax_t, 448.0 * 6.0), amax_t), max=_F32_MAX)
    s_enc = torch.where((amax_t == 0) | (s_enc == 0), torch.ones_like(s_enc), s_enc)
    amax_b = b.abs().amax(dim=-1, keepdim=True)
    # the order of TE's reference (tests/cpp/operator/test_cast_nvfp4_transpose.cu): (amax_b / 6) * S_enc, in FP32
    s_b = _e4m3(amax_b / 6.0 * s_enc)  # the stored E4M3 block scale (decode direction, in units of 1/S_enc)
    # 0 where the block scale is 0 (the block reads back as 0); capped at FP32's max, so a tiny tensor's small block
    # never multiplies by inf (a 0 element would become NaN)
    enc = torch.where(s_b == 0, torch.zeros_like(s_b), torch.clamp(s_enc / s_b, max=_F32_MAX))
    q = round_element(b * enc, fmt.element, rounding, generator)
    return _unblocks(_saturate_f32(q.mul_(s_b).div_(s_enc)), restore)


def per_tensor_scale(x: torch.Tensor, fmt: Format) -> torch.Tensor:
    """The 0-d FP32 encode scale ``s`` of a per-tensor scaled format (fp8/fp6/fp4): ``max_elem / amax`` (one rounding,
    capped at FP32's max; 1 for an all-zero tensor). The stored element is ``round(x * s)``, the value read back
    ``element / s``. (cptsim.numerics.exact_gemm re-derives the FP8 elements with it for torch._scaled_mm.)"""
    amax = x.detach().float().abs().amax() if x.numel() else torch.zeros((), device=x.device)
    s = torch.clamp(torch.div(torch.full_like(amax, fmt.element.max), amax), max=_F32_MAX)  # one rounding
    return torch.where((amax == 0) | (s == 0), torch.ones_like(s), s)


def _quantize_per_tensor(x: torch.Tensor, fmt: Format, rounding: str, generator) -> torch.Tensor:
    x = x.float()
    s = per_tensor_scale(x, fmt)
    return _saturate_f32(round_element(x * s, fmt.element, rounding, generator).div_(s))


def quantize(x: torch.Tensor, fmt: str | Format, rounding: str = "nearest", generator: torch.Generator | None = None,
             dim: int = -1, *, scale_rule: str | None = None, channel_axis: int | None = None) -> torch.Tensor:
    """``x`` stored in ``fmt`` and read back, as float32 (a new tensor; fp32 returns ``x`` as float32).

    rounding: ``nearest`` (ties to even) or ``stochastic`` (``generator`` feeds the draws). dim: the dimension the
    MX / NVFP4 blocks run along (the GEMM's reduction dimension). scale_rule: MX only, overrides the format's
    (``floor`` | ``rceil``). channel_axis: integer formats only, one min/max range per slice along that axis
    (weights; round to nearest only, as ``quant.fake_quant_per_channel``); None: one range per tensor."""
    fmt = parse_format(fmt)
    _check_rounding(rounding)
    if channel_axis is not None and fmt.family != "int":
        raise InputError(f"channel_axis applies to integer formats only, not {fmt.name}")
    if scale_rule is not None and fmt.family != "mx":
        raise InputError(f"a scale rule applies to MX formats only, not {fmt.name}")
    if x.numel() == 0:
        return x.float().clone()
    if fmt.family == "int":
        bits = fmt.int_bits
        if channel_axis is not None:
            if rounding != "nearest":
                raise InputError("per-channel integer quantization rounds to nearest only")
            return quant.fake_quant_per_channel(x.float(), bits, axis=channel_axis)
        if rounding == "stochastic":
            return quant.fake_quant_stochastic(x.float(), bits, generator=generator)
        lo, hi = torch.aminmax(x.detach().float())
        return quant.fake_quant_per_tensor(x.float(), lo, hi, bits)
    if fmt.name == "fp32":
        return x.float()
    if fmt.name == "bf16":
        return _round_bf16(x, rounding, generator)
    if fmt.name == "fp16":
        if rounding == "nearest":
            m = fmt.element.max
            return x.float().clamp(-m, m).to(torch.float16).float()
        return round_element(x, fmt.element, rounding, generator)
    if fmt.family == "mx":
        rule = scale_rule or fmt.scale_rule or "floor"
        if rule not in SCALE_RULES:
            raise InputError(f"unknown MX scale rule {rule!r}; valid: {', '.join(SCALE_RULES)}")
        return _quantize_mx(x, fmt, rounding, generator, dim, rule)
    if fmt.family == "nvfp":
        return _quantize_nvfp4(x, fmt, rounding, generator, dim)
    return _quantize_per_tensor(x, fmt, rounding, generator)


# ----------------------------------------------------------------------------------------------------------------------
# What the quantized layers call at a step whose width names a float format
# (cptsim.numerics.layers, lm_layers, graph_layers). FP32 fake quantization, vectorised: ``quantize`` above.
#
# Rounding: forward operands (weights, activations) round to nearest even; the error (dL/d output) rounds
# stochastically, as the integer path does and as the FP4 training recipes do for gradients (FP4 All the Way, NVIDIA's
# NVFP4 report: SR on gradients). One rule for every gradient format, E5M2 and bf16 included (Transformer Engine
# rounds its E5M2 gradients to nearest; cptsim keeps CPT's unbiased errors so that a format's effect is its grid's).
#
# Blocks (MX, NVFP4) run along ``dim``: a tensor's channel dimension -- a Linear's in-features for its input and weight
# (its forward GEMM's reduction), a convolution's channels (the reduction of the NHWC implicit GEMM is (kh, kw, C):
# 32 consecutive channels at one filter tap, the weight blocked along C_in likewise, so both operands' blocks cover the
# same reduction indices), the error along the output channels (dgrad's reduction). Each tensor is quantized once and
# that copy feeds every GEMM that reads it, as the integer path does; a hardware MX recipe (Transformer Engine) keeps
# a second, column-wise copy for the backward GEMMs that reduce over tokens (wgrad) -- not modelled here.

def quantize_error(g: torch.Tensor, fmt: Format, dim: int = -1) -> torch.Tensor:
    """The error ``g`` in the gradient format ``fmt`` (stochastic rounding, the global generator), as g's dtype."""
    return quantize(g, fmt, "stochastic", dim=dim).to(g.dtype)


class QuantFormatSTE(torch.autograd.Function):
    """``quantize(x, fmt, dim=dim)`` (round to nearest even) in forward, the gradient straight through."""

    @staticmethod
    def forward(ctx, x, fmt, dim):
        return quantize(x, fmt, dim=dim).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None

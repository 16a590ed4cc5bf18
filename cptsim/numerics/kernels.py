"""The GPU quantizers as Triton kernels: one kernel per quantizer, each reading its input once and writing once.

* ``fake_quant_tensor``: an activation, one range per tensor (given as 0-d tensors), round to nearest;
* ``fake_quant_rows``: a weight, one min/max range per output channel (dimension 0), round to nearest: one
  program per output channel finds the row's range and quantizes it (one read when the row fits a block, else a
  range pass over the row, then the quantize pass, which reads it again from cache);
* ``minmax``: a tensor's (min, max) as a float32 tensor of 2 on its device -- a two-stage reduction (partial ranges
  per program, then one program over the partials), no host synchronisation;
* ``fake_quant_sr``: the error, one range per tensor (``minmax`` first), stochastic rounding with uniforms from a
  counter-based generator (Philox4x32-10, Random123's): the key is one int64 drawn per call from torch's generator of
  the tensor's device, the counter is the element's index. Same generator state, same draws: a run resumed with
  torch's RNG state restored reproduces them exactly.

The arithmetic is ``cptsim.numerics.quant``'s, operation for operation in float32 (``choose_qparams`` then
``fake_quant``): scale = max(width / qmax, 1e-12) as a correctly rounded division, zp = clamp(round(-lo / scale)),
q = (clamp(round(x * (1 / scale) + zp)) - zp) * scale with round half to even. Round to nearest is therefore the
eager formula's result on the same device, bit for bit (bit patterns compared in the tests on a CPU; the kernels
clamp before they round, the same value, so at most the sign of a zero could differ where a device's eager clamp
kept a -0). Inputs are float32, float16 or bfloat16, computed in float32 and stored in the input's dtype (the eager
formula on a 16-bit input rounds every operation to 16 bits, so there the results are not the eager ones).
The CUDA build runs with fused multiply-adds off (``_scaled``); tests/test_triton_quant.py reads its PTX.

On a CPU the same kernels run in Triton's interpreter (numpy, what ``TRITON_INTERPRET=1`` selects; slow, for the
tests): a CPU tensor always takes the interpreted build, a CUDA tensor the compiled one, whatever the environment
says, so both can run in one process.
"""

from __future__ import annotations

import types

import torch
import triton
import triton.language as tl

from cptsim.numerics.strides import dense, rows_contiguous

# Elements per program of the element-wise passes; the stochastic-rounding pass takes four blocks of SR_BLOCK per
# program, one per 32-bit word of a Philox block. Not tuned on a GPU yet.
BLOCK = 1024
SR_BLOCK = 512
# The range reduction: at most RANGE_PARTS programs (a power of two: the second stage reads them as one block), each
# over whole RANGE_BLOCKs.
RANGE_BLOCK = 2048
RANGE_PARTS = 1024
# A weight row of up to this many elements is read once (one block per program); a longer one twice.
ROW_BLOCKS = (32, 256, 2048)
MAX_ELEMENTS = 2 ** 31 - 2 ** 24  # int32 offsets (a program's last block may reach past n), uint32 counters
DTYPES = (torch.float32, torch.float16, torch.bfloat16)

_SOURCES: list = []


def _device_fn(fn):
    """A kernel or device function, jitted per build (``_build``): compiled for CUDA, interpreted for a CPU."""
    _SOURCES.append(fn)
    return fn


# ----------------------------------------------------------------------------------------------------------------------
# Device functions. NaN propagates through every min, max and clamp, as it does through torch's.


@_device_fn
def _nanmin(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@_device_fn
def _nanmax(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@_device_fn
def _reduce_min(v):
    # the whole block's min, NaN if it holds one (the reduction's own min skips NaN, as numpy's nanmin in the
    # interpreter; torch.aminmax propagates it)
    lo = tl.reduce(v, 0, tl.standard._elementwise_min)
    nan = tl.reduce((v != v).to(tl.int32), 0, tl.standard._elementwise_max)
    return tl.where(nan > 0, float("nan"), lo)


@_device_fn
def _reduce_max(v):
    hi = tl.reduce(v, 0, tl.standard._elementwise_max)
    nan = tl.reduce((v != v).to(tl.int32), 0, tl.standard._elementwise_max)
    return tl.where(nan > 0, float("nan"), hi)


@_device_fn
def _clamp_grid(y, qmax):
    return tl.minimum(tl.maximum(y, 0.0, propagate_nan=tl.PropagateNan.ALL), qmax, propagate_nan=tl.PropagateNan.ALL)


@_device_fn
def _round_half_even(y):
    # torch.round for y in [0, 2**16] (clamped first: round and clamp to integer bounds commute): y + 0.5 and r - y
    # are exact there. Written with floor because libdevice's rint has no interpreter version.
    r = tl.floor(y + 0.5)
    tie = (r - y) == 0.5
    odd = tl.floor(r * 0.5) * 2.0 != r
    return tl.where(tie & odd, r - 1.0, r)


@_device_fn
def _qparams(lo, hi, qmax):
    # quant.choose_qparams: the range widened to hold 0, scale = width / qmax (a correctly rounded division, as
    # torch's on either device; Triton's plain "/" is an approximate one on CUDA), never below 1e-12
    lo = tl.minimum(lo, 0.0, propagate_nan=tl.PropagateNan.ALL)
    hi = tl.maximum(hi, 0.0, propagate_nan=tl.PropagateNan.ALL)
    scale = tl.maximum(tl.math.div_rn(hi - lo, qmax), 1e-12, propagate_nan=tl.PropagateNan.ALL)
    zp = _round_half_even(_clamp_grid(tl.math.div_rn(-lo, scale), qmax))
    inv = tl.math.div_rn(1.0, scale)  # as scale.reciprocal()
    return scale, zp, inv


@_device_fn
def _scaled(x, zp, inv):
    # x * (1 / scale) + zp is the one place where a multiply feeds an add. Contracted into a fused multiply-add
    # (one rounding instead of two) it moves values that sit within an ulp of a half-step across the tie -- what
    # made the compiled quantizer round 99.5 the other way. Every launch passes enable_fp_fusion=False, which
    # keeps Triton's LLVM from contracting and runs ptxas with --fmad=false: a multiply and an add, each rounded,
    # as torch's two eager kernels are. (The interpreter computes in numpy, which never fuses.)
    return x * inv + zp


@_device_fn
def _rtn(x, scale, zp, inv, qmax):
    k = _round_half_even(_clamp_grid(_scaled(x, zp, inv), qmax))
    return (k - zp) * scale


@_device_fn
def _philox(c0, c1, c2, c3, k0, k1):
    # Philox4x32-10 (Salmon et al., SC'11; Random123's constants): uint32 counters and key
    for _ in tl.static_range(10):
        a0 = c0
        a2 = c2
        c0 = tl.math.umulhi(a2, 0xCD9E8D57) ^ c1 ^ k0
        c2 = tl.math.umulhi(a0, 0xD2511F53) ^ c3 ^ k1
        c1 = a2 * 0xCD9E8D57
        c3 = a0 * 0xD2511F53
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@_device_fn
def _uniform(r):
    # the top 24 bits of a word: k / 2**24, exact in float32, uniform on [0, 1)
    return (r >> 8).to(tl.float32) * 5.9604644775390625e-08


# ----------------------------------------------------------------------------------------------------------------------
# Kernels


@_device_fn
def _fq_tensor_kernel(x_ptr, out_ptr, lo_ptr, hi_ptr, n, qmax, BLOCK: tl.constexpr):
    scale, zp, inv = _qparams(tl.load(lo_ptr), tl.load(hi_ptr), qmax)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, _rtn(x, scale, zp, inv, qmax), mask=mask)


@_device_fn
def _fq_rows_kernel(w_ptr, out_ptr, row_len, qmax, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * row_len
    cols = tl.arange(0, BLOCK)
    if ONE_PASS:
        mask = cols < row_len
        x = tl.load(w_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
        lo = _reduce_min(tl.where(mask, x, float("inf")))
        hi = _reduce_max(tl.where(mask, x, float("-inf")))
        scale, zp, inv = _qparams(lo, hi, qmax)
        tl.store(out_ptr + base + cols, _rtn(x, scale, zp, inv, qmax), mask=mask)
    else:
        acc_lo = tl.full([BLOCK], float("inf"), tl.float32)
        acc_hi = tl.full([BLOCK], float("-inf"), tl.float32)
        for start in range(0, row_len, BLOCK):
            mask = start + cols < row_len
            x = tl.load(w_ptr + base + start + cols, mask=mask, other=0.0).to(tl.float32)
            acc_lo = _nanmin(acc_lo, tl.where(mask, x, float("inf")))
            acc_hi = _nanmax(acc_hi, tl.where(mask, x, float("-inf")))
        scale, zp, inv = _qparams(_reduce_min(acc_lo), _reduce_max(acc_hi), qmax)
        for start in range(0, row_len, BLOCK):
            mask = start + cols < row_len
            x = tl.load(w_ptr + base + start + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(out_ptr + base + start + cols, _rtn(x, scale, zp, inv, qmax), mask=mask)


@_device_fn
def _minmax_parts_kernel(x_ptr, parts_ptr, n, chunk, BLOCK: tl.constexpr):
    # program p: the range of elements [p * chunk, (p + 1) * chunk); parts = [lo_0 .. lo_{P-1}, hi_0 .. hi_{P-1}]
    pid = tl.program_id(0)
    start0 = pid * chunk
    cols = tl.arange(0, BLOCK)
    acc_lo = tl.full([BLOCK], float("inf"), tl.float32)
    acc_hi = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, chunk, BLOCK):
        offs = start0 + start + cols
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        acc_lo = _nanmin(acc_lo, tl.where(mask, x, float("inf")))
        acc_hi = _nanmax(acc_hi, tl.where(mask, x, float("-inf")))
    tl.store(parts_ptr + pid, _reduce_min(acc_lo))
    tl.store(parts_ptr + tl.num_programs(0) + pid, _reduce_max(acc_hi))


@_device_fn
def _minmax_final_kernel(parts_ptr, out_ptr, nparts, PARTS: tl.constexpr):
    i = tl.arange(0, PARTS)
    mask = i < nparts
    lo = tl.load(parts_ptr + i, mask=mask, other=float("inf"))
    hi = tl.load(parts_ptr + nparts + i, mask=mask, other=float("-inf"))
    tl.store(out_ptr, _reduce_min(lo))
    tl.store(out_ptr + 1, _reduce_max(hi))


@_device_fn
def _fq_sr_kernel(x_ptr, out_ptr, range_ptr, seed_ptr, n, qmax, BLOCK: tl.constexpr):
    scale, zp, inv = _qparams(tl.load(range_ptr), tl.load(range_ptr + 1), qmax)
    seed = tl.load(seed_ptr)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    lane = tl.arange(0, BLOCK)
    # counter (g, 0, 0, 0) for the g-th group of four elements: word j of block g serves element 4 * BLOCK * pid +
    # j * BLOCK + lane, where g = BLOCK * pid + lane
    g = (tl.program_id(0) * BLOCK + lane).to(tl.uint32)
    zero = g * 0
    r0, r1, r2, r3 = _philox(g, zero, zero, zero, k0, k1)
    base = tl.program_id(0) * (4 * BLOCK) + lane
    _sr_store(x_ptr, out_ptr, base, n, r0, scale, zp, inv, qmax)
    _sr_store(x_ptr, out_ptr, base + BLOCK, n, r1, scale, zp, inv, qmax)
    _sr_store(x_ptr, out_ptr, base + 2 * BLOCK, n, r2, scale, zp, inv, qmax)
    _sr_store(x_ptr, out_ptr, base + 3 * BLOCK, n, r3, scale, zp, inv, qmax)


@_device_fn
def _sr_store(x_ptr, out_ptr, offs, n, r, scale, zp, inv, qmax):
    # quant.fake_quant_stochastic: floor(x / s + zp + u), clamped (floor and clamp to integer bounds commute)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    k = tl.floor(_clamp_grid(_scaled(x, zp, inv) + _uniform(r), qmax))
    tl.store(out_ptr + offs, (k - zp) * scale, mask=mask)


@_device_fn
def _philox_kernel(ctr_ptr, key_ptr, out_ptr):
    i = tl.arange(0, 1)
    c0 = tl.load(ctr_ptr + i).to(tl.uint32, bitcast=True)
    c1 = tl.load(ctr_ptr + i + 1).to(tl.uint32, bitcast=True)
    c2 = tl.load(ctr_ptr + i + 2).to(tl.uint32, bitcast=True)
    c3 = tl.load(ctr_ptr + i + 3).to(tl.uint32, bitcast=True)
    k0 = tl.load(key_ptr + i).to(tl.uint32, bitcast=True)
    k1 = tl.load(key_ptr + i + 1).to(tl.uint32, bitcast=True)
    r0, r1, r2, r3 = _philox(c0, c1, c2, c3, k0, k1)
    tl.store(out_ptr + i, r0.to(tl.int32, bitcast=True))
    tl.store(out_ptr + i + 1, r1.to(tl.int32, bitcast=True))
    tl.store(out_ptr + i + 2, r2.to(tl.int32, bitcast=True))
    tl.store(out_ptr + i + 3, r3.to(tl.int32, bitcast=True))


# ----------------------------------------------------------------------------------------------------------------------
# Builds: the functions above jitted once per kind (compiled: CUDA; interpreted: a CPU), each in its own copy of this
# module's namespace so that a kernel's calls resolve to device functions of its own kind.

_builds: dict[bool, types.SimpleNamespace] = {}


def _build(interpret: bool) -> types.SimpleNamespace:
    from triton import knobs

    ns = dict(globals())
    with knobs.runtime.scope():
        knobs.runtime.interpret = interpret
        for fn in _SOURCES:
            clone = types.FunctionType(fn.__code__, ns, fn.__name__, fn.__defaults__, fn.__closure__)
            clone.__qualname__, clone.__module__ = fn.__qualname__, fn.__module__
            ns[fn.__name__] = triton.jit(clone)
    return types.SimpleNamespace(**{fn.__name__: ns[fn.__name__] for fn in _SOURCES})


def _kernels(device: torch.device) -> types.SimpleNamespace:
    interpret = device.type != "cuda"
    build = _builds.get(interpret)
    if build is None:
        build = _builds[interpret] = _build(interpret)
    return build


def _launch(device: torch.device, name: str, grid: tuple, *args, **meta) -> None:
    """``kernel[grid](*args)`` on ``device``'s build, the fused multiply-add off (see ``_scaled``)."""
    kernel = getattr(_kernels(device), name)
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        with torch.cuda.device(device):
            kernel[grid](*args, enable_fp_fusion=False, **meta)
    else:
        kernel[grid](*args, enable_fp_fusion=False, **meta)


# ----------------------------------------------------------------------------------------------------------------------
# Launchers


def unsupported(x: torch.Tensor) -> str | None:
    """Why the kernels cannot take ``x`` (None: they can)."""
    if x.dtype not in DTYPES:
        return f"dtype {str(x.dtype).replace('torch.', '')}"
    if x.numel() > MAX_ELEMENTS:
        return f"{x.numel()} elements (more than the kernels' int32 offsets reach)"
    return None


def _dense(x: torch.Tensor) -> torch.Tensor:
    x = x.detach()
    return x if dense(x) else x.contiguous()  # (a gradient can arrive expanded, with zero strides)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _range_scalar(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return t.detach().to(device=device, dtype=torch.float32).reshape(())


def fake_quant_tensor(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, qmax: int) -> torch.Tensor:
    """``quant.fake_quant_per_tensor(x, lo, hi, bits)`` with qmax = 2**bits - 1: one pass; lo, hi one element each.
    The output has x's strides where x is dense (contiguous, channels_last, any dense permutation)."""
    x = _dense(x)
    out = torch.empty_like(x)
    n = x.numel()
    if n:
        _launch(x.device, "_fq_tensor_kernel", (_cdiv(n, BLOCK),), x, out, _range_scalar(lo, x.device),
                _range_scalar(hi, x.device), n, float(qmax), BLOCK=BLOCK, num_warps=4)
    return out


def row_plan(w: torch.Tensor) -> tuple[int, int, int, bool]:
    """(rows, row length, block, one pass) of the per-channel kernel for a weight (dense, rows contiguous)."""
    rows = w.shape[0] if w.dim() else 1
    row_len = w.numel() // rows if rows else 0
    block = next((b for b in ROW_BLOCKS if row_len <= b), ROW_BLOCKS[-1])
    return rows, row_len, block, row_len <= block


def fake_quant_rows(w: torch.Tensor, qmax: int) -> torch.Tensor:
    """``quant.fake_quant_per_channel(w, bits)`` (axis 0): each output channel's min/max, then the pass, one program
    per channel. A weight whose channels are not each one stretch of memory is made contiguous first."""
    w = w.detach()
    if not rows_contiguous(w):
        w = w.contiguous()
    out = torch.empty_like(w)
    rows, row_len, block, one_pass = row_plan(w)
    if w.numel():
        _launch(w.device, "_fq_rows_kernel", (rows,), w, out, row_len, float(qmax), BLOCK=block,
                ONE_PASS=one_pass, num_warps=1 if block <= 32 else 4)
    return out


def range_plan(n: int) -> tuple[int, int]:
    """(programs, elements per program) of ``minmax``'s first stage."""
    parts = max(1, min(_cdiv(n, RANGE_BLOCK), RANGE_PARTS))
    return parts, _cdiv(_cdiv(n, parts), RANGE_BLOCK) * RANGE_BLOCK


def minmax(x: torch.Tensor) -> torch.Tensor:
    """[min, max] of ``x`` (float32, on x's device; NaN if x holds one), computed there: ``torch.aminmax``'s values."""
    x = _dense(x)
    n = x.numel()
    if n == 0:
        raise ValueError("the range of an empty tensor")
    out = torch.empty(2, dtype=torch.float32, device=x.device)
    parts, chunk = range_plan(n)
    if parts == 1:  # one program: its partial range is the range
        _launch(x.device, "_minmax_parts_kernel", (1,), x, out, n, chunk, BLOCK=RANGE_BLOCK, num_warps=8)
        return out
    partial = torch.empty(2 * parts, dtype=torch.float32, device=x.device)
    _launch(x.device, "_minmax_parts_kernel", (parts,), x, partial, n, chunk, BLOCK=RANGE_BLOCK, num_warps=8)
    _launch(x.device, "_minmax_final_kernel", (1,), partial, out, parts, PARTS=RANGE_PARTS, num_warps=4)
    return out


def draw_seed(device: torch.device, generator: torch.Generator | None = None) -> torch.Tensor:
    """The Philox key of one stochastic-rounding call: one int64 from torch's generator of ``device`` (the
    default one unless given), drawn on the device (no synchronisation)."""
    return torch.empty((), dtype=torch.int64, device=device).random_(generator=generator)


def fake_quant_sr(x: torch.Tensor, qmax: int, generator: torch.Generator | None = None,
                  seed: torch.Tensor | None = None) -> torch.Tensor:
    """``quant.fake_quant_stochastic(x, bits)``: x's range (``minmax``), then one pass that adds u ~ U[0, 1) on a
    2**-24 grid, Philox4x32-10 keyed by ``seed`` (default: ``draw_seed(x.device, generator)``), counter = element
    index / 4 in x's storage order. Each output is one of the two grid points around x; E[q] = x up to the float32
    rounding of x / s + zp + u (within 2**(bits - 24) + 2**-24 of a step)."""
    x = _dense(x)
    out = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return out
    rng = minmax(x)
    if seed is None:
        seed = draw_seed(x.device, generator)
    _launch(x.device, "_fq_sr_kernel", (_cdiv(n, 4 * SR_BLOCK),), x, out, rng, seed, n, float(qmax), BLOCK=SR_BLOCK,
            num_warps=4)
    return out


def philox4x32_10(ctr: tuple[int, int, int, int], key: tuple[int, int], device: str = "cpu") -> tuple[int, ...]:
    """One Philox4x32-10 block as the kernels compute it (for the known-answer test)."""
    def i32(v):
        return [w - (1 << 32) if w >= 1 << 31 else w for w in v]

    dev = torch.device(device)
    c = torch.tensor(i32(ctr), dtype=torch.int32, device=dev)
    k = torch.tensor(i32(key), dtype=torch.int32, device=dev)
    out = torch.empty(4, dtype=torch.int32, device=dev)
    _launch(dev, "_philox_kernel", (1,), c, k, out)
    return tuple(int(v) & 0xFFFFFFFF for v in out.tolist())

"""Quantized Conv2d / Linear GEMMs on a GPU's tensor cores, exact where the arithmetic allows: which route each of a
layer's three GEMMs takes (``route``), what each route guarantees (``exact``), and the routes themselves.

A fake-quantized operand is an integer times a scale, ``q = v * s`` with ``v = k - zp`` (cptsim.numerics.quant:
activations and errors one scale per tensor, weights one per output channel). Where every scale of a GEMM is constant
along its reduction -- the forward (activation per tensor, weight per output column) and wgrad (error and activation
both per tensor) -- the GEMM runs on the integers ``v`` and the scales are applied after, once:

    y[i, c] = float32(sum_j v_a[i, j] v_w[c, j]) * (s_a s_w[c])  (+ bias[c])

The integers come from the quantizers' own outputs (``exact_gemm.int_values``: ``q / s`` is within 3 float32
roundings of an integer below 2**16, so rounding gives it exactly even with a scale an ulp off the quantizer's), so
any quantizer -- eager, C, fused CUDA -- and its random stream are unchanged.

Routes and the bound each guarantees (``exact``):

* ``int8-tc`` (forward and wgrad of a Linear or a 1x1 convolution at <= 8 bits): int8 operands, int32 accumulation,
  ``torch._int_mm``. At <= 7 bits ``|v| <= 127`` is an int8 as it is. At 8 bits ``|v| <= 255`` is not, so the operand
  is ``a = v - o`` with ``o = min(min v, 0) + 128`` (per tensor, per weight row): ``v`` lies on the quantizer's grid
  ``-zp .. 255 - zp``, which holds 0, so ``a`` and the zero value ``-o`` are int8s whatever the zero point (the offset
  is read from the data, never from a zero point recomputed here that could differ from the quantizer's by a flipped
  tie). Then ``sum (a + o_a)(b + o_b) = A@B + o_b R + o_a C + K o_a o_b`` (R, C: row and column sums), every term
  within ``65536 K``: exact in int32 while ``K <= MAX_K = 32767``. A longer reduction (wgrad's tokens: batch x
  positions) is split into chunks of at most MAX_K whose exact int32 results add in int64: exact for any K. The
  int32/int64 sum is then converted to float32 (exact below 2**24, else one rounding) and multiplied by the scale
  product (one
  rounding; the scale product itself one more): the result is within 3 float32 roundings of the exact product of
  the fake-quantized operands, where the FP32 fake-quant GEMM rounds every product and partial sum (up to ~K ulp).
  CUDA's ``_int_mm`` takes M > 16 rows and K, N multiples of 8: other shapes are padded with zeros (a zero int8
  adds nothing to A@B; the sums and K of the correction are the unpadded ones), never sent elsewhere.
* ``int8-tc-implicit-gemm`` (forward and wgrad of a k x k convolution at <= 8 bits, groups 1): the same
  arithmetic in Triton kernels that gather the im2col rows from the NHWC int8 codes as they go (no im2col tensor in
  memory); padded positions read the zero value's code ``-o``; the window sums are taken in the kernel. Forward: the
  corrections, scale and bias in its epilogue, exact for ``K = C kh kw <= MAX_K`` (one int32 accumulator). Wgrad
  (reduction: batch x output pixels): the pixels split into chunks of at most WGRAD_CHUNK (int32 partial sums,
  |.| <= 2**30) summed in int64, the corrections after: exact at any K.
* ``int8-tc-im2col``: the same GEMM through an explicit im2col of the int8 codes and ``_int_mm`` -- the reference
  for the kernel above, and the route on a CPU when Triton's interpreter is not on (checks only: its im2col tensor
  is kh kw times the activation).
* ``fp16-fp32acc`` (forward and wgrad of a Linear or a 1x1 convolution at 9..11 bits): the integers as FP16 (exact:
  ``|v| <= 2047``), products exact in FP32 (22 bits), FP32 accumulation, FP32 output (``torch.mm(..., out_dtype=
  torch.float32)``): exact while ``K (2**b_a - 1)(2**b_b - 1) < 2**24`` (every partial sum an integer below 2**24),
  else FP32 accumulation's rounding -- the fake path's own order of error without its rounded products.
* ``tf32-int-codes`` (a k x k or grouped convolution's forward and wgrad at 9..11 bits, and at <= 8 bits where
  the implicit-GEMM kernels are not used): cuDNN on the float integers with TF32 on
  (cptsim.numerics.exact_gemm "Integer codes on TF32"): products exact, the same 2**24 bound for exact sums.
  A convolution's FP16 path has no FP32 output in cuDNN (its sums would round to 11 bits), so the exact 16-bit-operand
  route for convolutions is TF32. Also a convolution's wgrad at 12..16 bits: not exact there (TF32 rounds the
  integers to 11 bits as FP16 would), but its FP32 output holds a sum over batch x pixels that FP16's could not.
* ``fp16`` (12..16 bits): the integers scaled by 2**-b into FP16 (|.| < 1, no overflow, no underflow: the scale is
  applied after; one rounding, relative 2**-11, where |v| >= 2048), FP32 accumulation; a Linear's output FP32, a
  convolution's forward FP16 (one more rounding, 2**-11 relative; |sum| <= K, so only for K <= FP16_MAX). Not
  exact: operand rounding of TF32's size (both keep 11 significant bits), on tensor cores twice TF32's rate. No
  BF16: codes scaled into [-1, 1] need FP16's range only, and BF16 would keep 8 bits where FP16 keeps 11.
* dgrad ``Qe(g) Qw(W)^T``: the weight's per-output-channel scale lies along dgrad's reduction, so no integer GEMM
  gives it with one scale multiply after (the scale of every term differs). Route ``fp16``: the error's integers
  scaled by 2**-g (exact in FP16 at g <= 11) times ``Qw(W) / (max_c s_w[c] 2**b)`` rounded to FP16 (|.| < 1), FP32
  accumulation, the scales after. Error per element within ``(2**-11 [+ 2**-11 at g > 11] + gamma_K) sum |e||w|``
  (gamma_K = K 2**-24 / (1 - K 2**-24), FP32 accumulation) plus, for a convolution, the FP16 output's 2**-11 relative:
  not exact, the operand rounding today's TF32 convolutions already have. A convolution's FP16 output holds the sum
  (|.| <= K) for K = O kh kw / groups <= FP16_MAX; a larger one takes today's path. (A channel whose scale is below
  2**-14 of the largest one falls among FP16's subnormals: an absolute 2**-25 of the largest channel's range, not
  2**-11 relative.)
* ``fp32-fake-quant``: today's path, for 32 bits, autocast (the user asked for AMP: its GEMMs of the fake-quantized
  values), gradient bits 32 (no error integers), and anything the routes above do not take.

``route`` is a pure function of the layer's kind, bits and shapes: no device read, so the graphed step captures the
same kernels the eager one ran. Which device runs it and whether it is on is cptsim.numerics.layers'
(``enabled``: ``CPTSIM_EXACT_GEMM=int8`` forces it, on a CPU too for checks; unset on CUDA, on when
cptsim.numerics.gemm_choice measured it faster than today's path on this GPU model and torch).
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache

import torch
import torch.nn.functional as F

from . import exact_gemm
from .quant import FULL_PRECISION

INT8 = "int8-tc"
INT8_IMPLICIT = "int8-tc-implicit-gemm"
INT8_IM2COL = "int8-tc-im2col"
FP16_ACC32 = "fp16-fp32acc"
FP16 = "fp16"
TF32 = exact_gemm.TF32_CODES
FAKE = exact_gemm.FAKE
INT8_ROUTES = (INT8, INT8_IMPLICIT, INT8_IM2COL)
GEMMS = ("forward", "dgrad", "wgrad")

INT8_BITS = 8  # |v| <= 255 as int8 plus an offset
DIRECT_INT8_BITS = 7  # |v| <= 127: an int8 as it is, no offset
FP16_EXACT_BITS = 11  # |v| <= 2047: exact in FP16's and TF32's 11-bit significand
MAX_K = 32767  # int32 holds every term of the offset bracket (|.| <= 65536 K)
FP32_EXACT = 1 << 24  # integers below this are exact in FP32
FP16_MAX = 65504  # the largest finite FP16: a convolution's FP16 output of K products of |.| < 1 needs K <= this
CUDA_MIN_ROWS = 17  # torch._int_mm on CUDA: more than 16 rows,
CUDA_ALIGN = 8  # and K, N multiples of 8

KINDS = ("linear", "conv1x1", "conv", "grouped")


def layer_kind(kernel=None, padding=(0, 0), groups: int = 1) -> str:
    """A layer's GEMM shape: "linear" (kernel None), "conv1x1" (a 1x1 kernel, no padding, groups 1: a GEMM over the
    (strided) pixels), "grouped" (groups > 1), else "conv"."""
    if kernel is None:
        return "linear"
    if groups != 1:
        return "grouped"
    if tuple(kernel) == (1, 1) and tuple(padding) == (0, 0):
        return "conv1x1"
    return "conv"


def exact_sum_bound(k: int, bits_a: int, bits_b: int) -> int:
    """The largest |partial sum| of K products of integers of widths bits_a, bits_b (|v| <= 2**b - 1)."""
    return int(k) * ((1 << bits_a) - 1) * ((1 << bits_b) - 1)


def _forward_route(kind: str, bits: int, k: int, implicit: bool, device: str) -> str:
    mm = kind in ("linear", "conv1x1")
    if bits <= INT8_BITS:
        if mm:
            return INT8
        if kind == "conv" and k <= MAX_K:
            if implicit:
                return INT8_IMPLICIT
            if device == "cpu":
                return INT8_IM2COL
        return TF32
    if bits <= FP16_EXACT_BITS:
        return FP16_ACC32 if mm else TF32
    return FP16 if mm or k <= FP16_MAX else TF32


def route(kind: str, bits: int, grad_bits: int, k_fwd: int, *, device: str = "cuda", autocast: bool = False,
          implicit: bool = True, implicit_wgrad: bool | None = None, k_dgrad: int = 0) -> dict:
    """``{"forward", "dgrad", "wgrad"}``: the route of each GEMM of a quantized layer of ``kind`` (KINDS) at forward
    bits ``bits`` and gradient bits ``grad_bits``; ``k_fwd`` the forward GEMM's reduction (in_features, or
    C/groups kh kw). ``implicit`` / ``implicit_wgrad`` (default: as ``implicit``): the implicit-GEMM Triton kernels
    for a k x k convolution's forward / wgrad may run (Triton on CUDA where each measured faster, or the interpreter
    on a CPU); ``device`` "cuda" or "cpu" (checks); ``k_dgrad`` a convolution's dgrad reduction (O kh kw / groups:
    its FP16 output holds it up to FP16_MAX). The module docstring gives the rule's why."""
    if kind not in KINDS:
        raise ValueError(f"unknown layer kind {kind!r}")
    if autocast or bits == FULL_PRECISION:
        return dict.fromkeys(GEMMS, FAKE)
    fwd = _forward_route(kind, bits, k_fwd, implicit, device)
    if grad_bits == FULL_PRECISION:
        return {"forward": fwd, "dgrad": FAKE, "wgrad": FAKE}
    mm = kind in ("linear", "conv1x1")
    widest = max(bits, grad_bits)
    if widest <= INT8_BITS:
        implicit_wgrad = implicit if implicit_wgrad is None else implicit_wgrad
        wgrad = INT8 if mm else TF32
        if kind == "conv":
            wgrad = INT8_IMPLICIT if implicit_wgrad else INT8_IM2COL if device == "cpu" else TF32
    elif widest <= FP16_EXACT_BITS:
        wgrad = FP16_ACC32 if mm else TF32
    else:
        wgrad = FP16 if mm else TF32
    dgrad = FP16 if mm or k_dgrad <= FP16_MAX else FAKE
    return {"forward": fwd, "dgrad": dgrad, "wgrad": wgrad}


def exact(r: str, bits_a: int, bits_b: int, k: int | None) -> bool | int:
    """Whether route ``r`` gives a GEMM of integers of widths ``bits_a``, ``bits_b`` over a reduction of ``k``
    exactly (integer sums exact, then the float32 conversion and the scale multiply). ``k`` None (not known yet: a
    wgrad's tokens): True/False where K does not matter, else the largest exact K. (The implicit-GEMM forward
    keeps one int32 per output, K <= MAX_K; its wgrad splits the pixels, exact at any K: called with None.)"""
    if r in (INT8, INT8_IM2COL):
        return True  # split into int32 chunks of MAX_K, summed in int64
    if r == INT8_IMPLICIT:
        return True if k is None else k <= MAX_K
    if r in (FP16_ACC32, TF32) and max(bits_a, bits_b) <= FP16_EXACT_BITS:
        limit = (FP32_EXACT - 1) // exact_sum_bound(1, bits_a, bits_b)
        return limit if k is None else k <= limit
    return False


# ------------------------------------------------------------------------------------------------------------------
# int8 operands and the int32 GEMM

def int8_operand(v: torch.Tensor, bits: int, rows: bool = False):
    """(int8 ``a``, offset ``o`` or None) with ``v = a + o`` for integer-valued float ``v`` of a ``bits``-wide
    quantizer (module docstring): ``o`` 0-d int32 per tensor, or (rows,) with ``rows`` (a weight's per-channel
    grid); None at <= 7 bits."""
    if bits <= DIRECT_INT8_BITS:
        return v.to(torch.int8), None
    lo = v.amin(dim=1) if rows else v.amin()
    o = torch.clamp(lo, max=0.0).add_(128.0)
    a = (v - (o.unsqueeze(1) if rows else o)).to(torch.int8)
    return a, o.to(torch.int32)


def cuda_padding(m: int, k: int, n: int) -> tuple[int, int, int]:
    """Rows, reduction and columns to add for CUDA's torch._int_mm (M > 16; K, N multiples of 8)."""
    return max(CUDA_MIN_ROWS - m, 0), (-k) % CUDA_ALIGN, (-n) % CUDA_ALIGN


def _int_mm_tn(a: torch.Tensor, bt: torch.Tensor, pad: bool) -> torch.Tensor:
    """int32 ``a @ bt^T`` for row-major int8 a (M, K), bt (N, K): the right operand column-major, as cuBLAS's int8
    GEMM runs fastest; zero-padded to CUDA's shape rule when ``pad``."""
    m, k = a.shape
    n = bt.shape[0]
    pm, pk, pn = cuda_padding(m, k, n) if pad else (0, 0, 0)
    if pm or pk:
        a = F.pad(a, (0, pk, 0, pm))
    if pn or pk:
        bt = F.pad(bt, (0, pk, 0, pn))
    p = torch._int_mm(a.contiguous(), bt.contiguous().t())
    return p[:m, :n] if (pm or pn) else p


def mm_int8(a: torch.Tensor, bt: torch.Tensor, oa: torch.Tensor | None = None, ob: torch.Tensor | None = None,
            pad: bool | None = None) -> torch.Tensor:
    """The exact ``sum_j (a[i, j] + oa)(bt[c, j] + ob[c])``: int8 a (M, K), bt (N, K); ``oa`` 0-d, ``ob`` 0-d or (N,)
    int32, or None (0). int32 when K <= MAX_K, else int64 (int32 chunks summed). ``pad``: apply CUDA's shape rule
    (default: on a CUDA tensor)."""
    pad = a.is_cuda if pad is None else pad
    k = a.shape[1]
    if k <= MAX_K:
        acc = _int_mm_tn(a, bt, pad)
    else:
        acc = None
        step = max(MAX_K - MAX_K % CUDA_ALIGN, 1)  # chunks a multiple of 8: no CUDA padding inside
        for k0 in range(0, k, step):
            p = _int_mm_tn(a[:, k0:k0 + step], bt[:, k0:k0 + step], pad).to(torch.int64)
            acc = p if acc is None else acc.add_(p)
    if oa is None and ob is None:
        return acc
    dt = acc.dtype
    if ob is not None:
        acc.add_(a.sum(1, dtype=dt).unsqueeze(1) * ob.to(dt).reshape(1, -1))
    if oa is not None:
        col = bt.sum(1, dtype=dt)
        if ob is not None:
            col = col + k * ob.to(dt)
        acc.add_((oa.to(dt) * col).reshape(1, -1))
    return acc


def epilogue(acc: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, dim: int = -1) -> torch.Tensor:
    """``float32(acc) * scale (+ bias)``, scale and bias per channel along ``dim`` (or 0-d): the one place every
    route applies its scales, so two routes with equal integer sums give equal results bit for bit."""
    y = acc.to(torch.float32)
    shape = [1] * y.dim()
    if scale.dim():
        shape[dim] = -1
    y.mul_(scale.reshape(shape))
    if bias is not None:
        shape[dim] = -1
        y.add_(bias.detach().reshape(shape))
    return y


# ------------------------------------------------------------------------------------------------------------------
# FP16 GEMMs with an FP32 output

_MM_DTYPE: list = []


def mm16(a16: torch.Tensor, b16: torch.Tensor) -> torch.Tensor:
    """float32 ``a @ b`` of FP16 operands: products exact in FP32, FP32 sums. CUDA: ``torch.mm(out_dtype=float32)``
    (cuBLAS, FP32 accumulation and output); a CPU: the same values in float32 (products exact, FP32 sums) -- the
    CUDA arithmetic up to the order of the sums."""
    if a16.is_cuda:
        if not _MM_DTYPE:
            try:
                torch.mm(a16[:1, :1], b16[:1, :1], out_dtype=torch.float32)
                _MM_DTYPE.append(True)
            except (TypeError, RuntimeError):  # a torch without mm's out_dtype: FP32 GEMM of the same values
                _MM_DTYPE.append(False)
        if _MM_DTYPE[0]:
            return torch.mm(a16, b16, out_dtype=torch.float32)
    return torch.mm(a16.float(), b16.float())


def _fp16(v: torch.Tensor, bits: int, route: str) -> torch.Tensor:
    """The integers ``v`` as FP16: as they are (FP16_ACC32, exact at <= 11 bits), or times 2**-bits (FP16)."""
    return (v if route == FP16_ACC32 else v * 2.0 ** -bits).to(torch.float16)


def _unscale(route: str, *bits: int) -> float:
    return 1.0 if route == FP16_ACC32 else 2.0 ** sum(bits)


def conv16(fn, a16: torch.Tensor, b16: torch.Tensor) -> torch.Tensor:
    """A convolution op ``fn(a, b)`` of FP16 operands as cuDNN runs it on CUDA (FP32 accumulation, FP16 output),
    returned as float32; on a CPU the same values in float32 and the output rounded to FP16."""
    if a16.is_cuda:
        return fn(a16, b16).float()
    return fn(a16.float(), b16.float()).half().float()


# ------------------------------------------------------------------------------------------------------------------
# Convolutions as GEMMs

def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def out_size(h: int, w: int, kernel, stride, padding, dilation) -> tuple[int, int]:
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = map(_pair, (kernel, stride, padding, dilation))
    return (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1


def nhwc_rows(t: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) -> (N H W, C) rows (a copy unless ``t`` is stored channels-last)."""
    n, c, h, w = t.shape
    return t.permute(0, 2, 3, 1).reshape(n * h * w, c)


def from_rows(y: torch.Tensor, n: int, h: int, w: int, like: torch.Tensor) -> torch.Tensor:
    """(N H W, C) rows -> (N, C, H, W), stored as ``like`` is (channels-last stays, else contiguous)."""
    out = y.view(n, h, w, -1).permute(0, 3, 1, 2)
    return out if like.is_contiguous(memory_format=torch.channels_last) and not like.is_contiguous() \
        else out.contiguous()


def im2col(a: torch.Tensor, kernel, stride, padding, dilation, pad_value: int = 0) -> torch.Tensor:
    """(N Ho Wo, kh kw C) rows of an (N, C, H, W) tensor, columns in (kh, kw, C) order (a weight permuted to
    (O, kh, kw, C) is its right operand); padded positions hold ``pad_value``."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = map(_pair, (kernel, stride, padding, dilation))
    n, c, h, w = a.shape
    ho, wo = out_size(h, w, kernel, stride, padding, dilation)
    p = F.pad(a.permute(0, 2, 3, 1), (0, 0, pw, pw, ph, ph), value=pad_value).contiguous()
    s0, s1, s2, s3 = p.stride()
    cols = p.as_strided((n, ho, wo, kh, kw, c), (s0, s1 * sh, s2 * sw, s1 * dh, s2 * dw, s3))
    return cols.reshape(n * ho * wo, kh * kw * c)


# ------------------------------------------------------------------------------------------------------------------
# The implicit-GEMM int8 convolution (Triton)

_KERNELS: dict = {}


@lru_cache(maxsize=None)
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def implicit_usable(device) -> bool:
    """Whether a layer on ``device`` takes the Triton kernels: CUDA with Triton; a CPU (Triton's interpreter, numpy:
    slow) only when asked with TRITON_INTERPRET=1 -- else its checks take the im2col route."""
    t = torch.device(device).type
    return triton_available() and (t == "cuda" or (t == "cpu" and interpreter_on()))


def _conv_kernel(device):
    """(triton, the forward kernel, the wgrad kernel) for tensors on ``device``: compiled for CUDA, interpreted for a
    CPU whatever TRITON_INTERPRET says (both can run in one process). Defined on first use: importing Triton costs
    ~0.15 s, which a run that never takes these routes does not pay."""
    interpret = torch.device(device).type != "cuda"
    if interpret in _KERNELS:
        return _KERNELS[interpret]
    import triton
    import triton.language as tl
    from triton import knobs

    globals()["tl"] = tl  # the kernels' source names tl; Triton resolves it in this module's globals
    with knobs.runtime.scope():
        knobs.runtime.interpret = interpret  # read when a kernel is defined
        _KERNELS[interpret] = (triton, *_define_kernels(triton, tl))
    return _KERNELS[interpret]


def _define_kernels(triton, tl):
    # (tl.full and tl.reduce with the standard library's combine function rather than tl.zeros and tl.sum: those are
    # jitted functions, which an interpreted kernel may not call when Triton was imported for compiling)

    @triton.jit
    def conv_int8(x_ptr, w_ptr, out_ptr, oa_ptr, ob_ptr, csum_ptr, scale_ptr, bias_ptr,
                  M, H, W, C, HO, WO, COUT, K, KW, SH, SW, PH, PW, DH, DW,
                  HAS_BIAS: tl.constexpr, RAW: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # output pixels (n, ho, wo)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # output channels
        img = rm // (HO * WO)
        pix = rm % (HO * WO)
        h0 = (pix // WO) * SH - PH
        w0 = (pix % WO) * SW - PW
        oa = tl.load(oa_ptr)
        zero_code = (-oa).to(tl.int8)  # the code of the value 0: a padded position adds (zero_code + oa) * b = 0
        acc = tl.full((BLOCK_M, BLOCK_N), 0, tl.int32)
        rsum = tl.full((BLOCK_M,), 0, tl.int32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)  # (r, s, c) in the weight's (O, kh, kw, C) order
            c = rk % C
            rs = rk // C
            hi = h0[:, None] + (rs // KW)[None, :] * DH
            wi = w0[:, None] + (rs % KW)[None, :] * DW
            valid = (rm[:, None] < M) & (rk[None, :] < K)
            inside = (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
            a = tl.load(x_ptr + ((img[:, None] * H + hi) * W + wi) * C + c[None, :], mask=valid & inside, other=0)
            a = tl.where(valid & ~inside, zero_code, a).to(tl.int8)
            b = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=(rn[None, :] < COUT) & (rk[:, None] < K),
                        other=0)
            acc += tl.dot(a, b, out_dtype=tl.int32)
            rsum += tl.reduce(a.to(tl.int32), 1, tl.standard._sum_combine)
        nmask = rn < COUT
        ob = tl.load(ob_ptr + rn, mask=nmask, other=0)
        cs = tl.load(csum_ptr + rn, mask=nmask, other=0)
        acc += rsum[:, None] * ob[None, :] + (oa * (cs + K * ob))[None, :]
        omask = (rm[:, None] < M) & nmask[None, :]
        optr = out_ptr + rm[:, None] * COUT + rn[None, :]
        if RAW:
            tl.store(optr, acc, mask=omask)
        else:
            y = acc.to(tl.float32) * tl.load(scale_ptr + rn, mask=nmask, other=0.0)[None, :]
            if HAS_BIAS:
                y = y + tl.load(bias_ptr + rn, mask=nmask, other=0.0)[None, :]
            tl.store(optr, y, mask=omask)

    @triton.jit
    def conv_wgrad_int8(e_ptr, x_ptr, out_ptr, csum_ptr, ox_ptr,
                        P, H, W, C, HO, WO, O, NCOL, KW, SH, SW, PH, PW, DH, DW, CHUNK,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # one split of the pixels (<= CHUNK of them) of wgrad[o, (r, s, c)] = sum_p e[p, o] x[p's window, (r, s, c)]
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        pid_s = tl.program_id(2)
        ro = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # output channels
        rc = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # weight columns (r, s, c)
        c = rc % C
        rs = rc // C
        dr = (rs // KW) * DH
        ds = (rs % KW) * DW
        ox = tl.load(ox_ptr)
        zero_code = (-ox).to(tl.int8)
        acc = tl.full((BLOCK_M, BLOCK_N), 0, tl.int32)
        cs = tl.full((BLOCK_N,), 0, tl.int32)
        k_end = tl.minimum(pid_s * CHUNK + CHUNK, P)
        for k0 in range(pid_s * CHUNK, k_end, BLOCK_K):
            rp = k0 + tl.arange(0, BLOCK_K)  # pixels (n, ho, wo)
            pv = rp < k_end
            img = rp // (HO * WO)
            pix = rp % (HO * WO)
            a = tl.load(e_ptr + rp[None, :] * O + ro[:, None], mask=(ro[:, None] < O) & pv[None, :], other=0)
            hi = ((pix // WO) * SH - PH)[:, None] + dr[None, :]
            wi = ((pix % WO) * SW - PW)[:, None] + ds[None, :]
            valid = pv[:, None] & (rc[None, :] < NCOL)
            inside = (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
            b = tl.load(x_ptr + ((img[:, None] * H + hi) * W + wi) * C + c[None, :], mask=valid & inside, other=0)
            b = tl.where(valid & ~inside, zero_code, b).to(tl.int8)
            acc += tl.dot(a.to(tl.int8), b, out_dtype=tl.int32)
            cs += tl.reduce(b.to(tl.int32), 0, tl.standard._sum_combine)
        tl.store(out_ptr + (pid_s * O + ro[:, None]) * NCOL + rc[None, :], acc,
                 mask=(ro[:, None] < O) & (rc[None, :] < NCOL))
        if pid_m == 0:  # the window sums, once per column block and split
            tl.store(csum_ptr + pid_s * NCOL + rc, cs, mask=rc < NCOL)

    return conv_int8, conv_wgrad_int8


def _blocks(m: int, n: int, k: int, device) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps) for an (m x k) @ (k x n) int8 GEMM: tiles for int8 mma on a GPU (not tuned:
    the measurement in gemm_choice decides whether the kernels are used); the smallest tl.dot tiles under the
    interpreter (it runs one program at a time in numpy)."""
    if torch.device(device).type != "cuda":
        return 16, 16, 16, 1

    def tile(d):
        return 128 if d >= 128 else 64 if d >= 64 else 32

    bm, bn = tile(m), tile(n)
    return bm, bn, 64 if k >= 64 else 32, 8 if bm * bn >= 128 * 128 else 4


def conv_int8_implicit(a_nhwc: torch.Tensor, wt: torch.Tensor, oa, ob, scale: torch.Tensor,
                       bias: torch.Tensor | None, kernel, stride, padding, dilation, raw: bool = False) -> torch.Tensor:
    """(N Ho Wo, O) rows of ``conv(x, w)`` from int8 codes: ``a_nhwc`` (N, H, W, C) contiguous (x = a + oa), ``wt``
    (O, kh kw C) contiguous in (kh, kw, C) order (w = wt + ob per row); float32 ``epilogue`` applied in the kernel
    (``raw``: the exact int32 sums instead). K = C kh kw <= MAX_K."""
    triton, kern, _ = _conv_kernel(a_nhwc.device)
    n, h, w, c = a_nhwc.shape
    cout, k = wt.shape
    assert k <= MAX_K, "the implicit-GEMM kernel accumulates in one int32: K <= MAX_K"
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = map(_pair, (kernel, stride, padding, dilation))
    ho, wo = out_size(h, w, kernel, stride, padding, dilation)
    m = n * ho * wo
    assert a_nhwc.numel() < 2 ** 31 and m * cout < 2 ** 31, "the kernel indexes in int32"
    dev = a_nhwc.device
    oa = torch.zeros((), dtype=torch.int32, device=dev) if oa is None else oa.to(torch.int32).reshape(())
    ob = torch.zeros(cout, dtype=torch.int32, device=dev) if ob is None else ob.to(torch.int32).expand(cout)
    csum = wt.sum(1, dtype=torch.int32)
    out = torch.empty((m, cout), dtype=torch.int32 if raw else torch.float32, device=dev)
    scale = scale.to(torch.float32).expand(cout).contiguous()
    bm, bn, bk, warps = _blocks(m, cout, k, dev)
    grid = (triton.cdiv(m, bm), triton.cdiv(cout, bn))
    kern[grid](a_nhwc, wt, out, oa, ob.contiguous(), csum, scale, scale if bias is None else bias.detach().contiguous(),
               m, h, w, c, ho, wo, cout, k, kw, sh, sw, ph, pw, dh, dw,
               HAS_BIAS=bias is not None, RAW=raw, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps)
    return out


WGRAD_CHUNK = 65536  # pixels per int32 partial sum of the wgrad kernel: |sum a b| <= 128 * 128 * 65536 = 2**30


def conv_wgrad_int8_implicit(e_rows: torch.Tensor, oe, x_nhwc: torch.Tensor, ox, kernel, stride, padding,
                             dilation) -> torch.Tensor:
    """The exact int64 ``sum_p (e[p, o] + oe)(x[p's window, (r, s, c)] + ox)`` (O, kh kw C): a k x k convolution's
    wgrad from int8 codes, ``e_rows`` (N Ho Wo, O) and ``x_nhwc`` (N, H, W, C), both contiguous, offsets 0-d or
    None. The pixels split into chunks of at most WGRAD_CHUNK (int32 partial sums, exact) -- enough chunks to give
    every SM work when O x kh kw C is small -- summed in int64; padded positions read the zero value's code."""
    triton, _, kern = _conv_kernel(x_nhwc.device)
    n, h, w, c = x_nhwc.shape
    p, o = e_rows.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = map(_pair, (kernel, stride, padding, dilation))
    ho, wo = out_size(h, w, kernel, stride, padding, dilation)
    assert p == n * ho * wo, "e_rows must be the output's (N Ho Wo, O) rows"
    assert x_nhwc.numel() < 2 ** 31 and e_rows.numel() < 2 ** 31, "the kernel indexes in int32"
    ncol = kh * kw * c
    dev = x_nhwc.device
    bm, bn, bk, warps = _blocks(o, ncol, p, dev)
    tiles = triton.cdiv(o, bm) * triton.cdiv(ncol, bn)
    splits = max(triton.cdiv(p, WGRAD_CHUNK), min(triton.cdiv(264, tiles), triton.cdiv(p, 4 * bk)))
    chunk = triton.cdiv(triton.cdiv(p, splits), bk) * bk  # a multiple of the tile: splits never share a tile
    splits = triton.cdiv(p, chunk)
    part = torch.empty((splits, o, ncol), dtype=torch.int32, device=dev)
    csum = torch.empty((splits, ncol), dtype=torch.int32, device=dev)
    oxt = torch.zeros((), dtype=torch.int32, device=dev) if ox is None else ox.to(torch.int32).reshape(())
    kern[(triton.cdiv(o, bm), triton.cdiv(ncol, bn), splits)](
        e_rows, x_nhwc, part, csum, oxt, p, h, w, c, ho, wo, o, ncol, kw, sh, sw, ph, pw, dh, dw, chunk,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps)
    acc = part.sum(0, dtype=torch.int64)
    if ox is not None:
        acc.add_(e_rows.sum(0, dtype=torch.int64).unsqueeze(1) * ox.to(torch.int64))
    if oe is not None:
        col = csum.sum(0, dtype=torch.int64)
        if ox is not None:
            col = col + p * ox.to(torch.int64)
        acc.add_(oe.to(torch.int64) * col.unsqueeze(0))
    return acc


# ------------------------------------------------------------------------------------------------------------------
# A layer's three GEMMs by route. ``geom``: (stride, padding, dilation, groups) of a convolution, None for a Linear.
# Operands are the integers (float tensors of exact integers) and their scales; results float32.

def forward(kind: str, r: str, xv: torch.Tensor, sx: torch.Tensor, wv: torch.Tensor, sw: torch.Tensor,
            bias: torch.Tensor | None, bits: int, geom=None):
    """(y, codes): the layer's output ``op(xv sx, wv sw) + bias`` on route ``r``, and for the int8 routes that wgrad
    can reuse its activation operand ``(a, oa)`` -- a Linear's / 1x1 convolution's GEMM rows, a k x k convolution's
    NHWC codes (int8-tc-implicit-gemm) -- else None."""
    scale = sx * sw  # (O,): the one scale product every route multiplies by
    if kind == "linear":
        x2 = xv.reshape(-1, xv.shape[-1])
        codes = None
        if r == INT8:
            a, oa = int8_operand(x2, bits)
            b, ob = int8_operand(wv, bits, rows=True)
            acc, codes = mm_int8(a, b, oa, ob), (a, oa)
        else:  # FP16_ACC32 / FP16
            acc = mm16(_fp16(x2, bits, r), _fp16(wv, bits, r).t()).mul_(_unscale(r, bits, bits))
        return epilogue(acc, scale, bias).view(*xv.shape[:-1], wv.shape[0]), codes
    stride, padding, dilation, groups = geom
    if kind == "conv1x1" and r in (INT8, FP16_ACC32, FP16):
        sh, sw_ = _pair(stride)
        xs = xv[:, :, ::sh, ::sw_]
        n, _, ho, wo = xs.shape
        rows = nhwc_rows(xs)
        w2 = wv.reshape(wv.shape[0], -1)
        codes = None
        if r == INT8:
            a, oa = int8_operand(rows, bits)
            b, ob = int8_operand(w2, bits, rows=True)
            acc, codes = mm_int8(a, b, oa, ob), (a, oa)
        else:
            acc = mm16(_fp16(rows, bits, r), _fp16(w2, bits, r).t()).mul_(_unscale(r, bits, bits))
        return from_rows(epilogue(acc, scale, bias), n, ho, wo, xv), codes
    kernel = wv.shape[-2:]
    if r in (INT8_IMPLICIT, INT8_IM2COL):
        n, _, h, w = xv.shape
        ho, wo = out_size(h, w, kernel, stride, padding, dilation)
        a, oa = int8_operand(xv, bits)
        wt = wv.permute(0, 2, 3, 1).reshape(wv.shape[0], -1)
        b, ob = int8_operand(wt, bits, rows=True)
        if r == INT8_IMPLICIT:
            a = a.permute(0, 2, 3, 1).contiguous()
            y = conv_int8_implicit(a, b.contiguous(), oa, ob, scale, bias, kernel, stride, padding, dilation)
            return from_rows(y, n, ho, wo, xv), (a, oa)
        else:
            pad_value = 0 if oa is None else -int(oa)  # (a host read: the CPU check route only)
            cols = im2col(a, kernel, stride, padding, dilation, pad_value)
            y = epilogue(mm_int8(cols, b, oa, ob), scale, bias)
        return from_rows(y, n, ho, wo, xv), None
    op = lambda p, q: F.conv2d(p, q, None, stride, padding, dilation, groups)  # noqa: E731
    if r == TF32:
        with exact_gemm.tf32():
            acc = op(xv, wv)
        return epilogue(acc, scale, bias, dim=1), None
    if r == FP16:
        acc = conv16(op, _fp16(xv, bits, r), _fp16(wv, bits, r)).mul_(_unscale(r, bits, bits))
        return epilogue(acc, scale, bias, dim=1), None
    raise ValueError(f"route {r!r} does not run a {kind} forward")


def dgrad(kind: str, ev: torch.Tensor, se: torch.Tensor, grad_bits: int, wq: torch.Tensor, sw: torch.Tensor,
          bits: int, x_shape, geom=None) -> torch.Tensor:
    """dL/dx on the FP16 route (module docstring): the error's integers ``ev`` (scale ``se``) times the
    fake-quantized weight ``wq`` normalised by its largest channel scale, both as FP16."""
    smax = sw.max()
    e16 = (ev * 2.0 ** -grad_bits).to(torch.float16)
    w16 = (wq * (2.0 ** -bits / smax)).to(torch.float16)
    unscale = se * smax * 2.0 ** (grad_bits + bits)
    if kind == "linear":
        g = mm16(e16.reshape(-1, e16.shape[-1]), w16)
        return g.mul_(unscale).view(*ev.shape[:-1], wq.shape[1])
    stride, padding, dilation, groups = geom
    fn = lambda e, w: torch.nn.grad.conv2d_input(x_shape, w, e, stride, padding, dilation, groups)  # noqa: E731
    return conv16(fn, e16, w16).mul_(unscale)


def wgrad(kind: str, r: str, ev: torch.Tensor, se: torch.Tensor, grad_bits: int, sx: torch.Tensor, bits: int,
          w_shape, geom=None, xv: torch.Tensor | None = None, codes=None) -> torch.Tensor:
    """dL/dW on route ``r``: the error's integers ``ev`` (scale ``se``) against the activation's -- ``codes``
    ``(a, oa)`` kept by ``forward`` on the same int8 route, else its integers ``xv``."""
    scale = se * sx
    if kind in ("linear", "conv1x1") and r in (INT8, FP16_ACC32, FP16):
        if kind == "linear":
            e2 = ev.reshape(-1, ev.shape[-1])
        else:
            e2 = nhwc_rows(ev)
        if r == INT8:
            a, oa = codes if codes is not None else int8_operand(_rows(kind, xv, geom), bits)
            ae, oe = int8_operand(e2, grad_bits)
            acc = mm_int8(ae.t().contiguous(), a.t().contiguous(), oe, oa)
        else:
            x2 = _rows(kind, xv, geom)
            acc = mm16(_fp16(e2, grad_bits, r).t(), _fp16(x2, bits, r)).mul_(_unscale(r, grad_bits, bits))
        return epilogue(acc, scale, None).view(w_shape)
    stride, padding, dilation, groups = geom
    if r in (INT8_IMPLICIT, INT8_IM2COL):
        o, c, kh, kw = w_shape
        ae, oe = int8_operand(nhwc_rows(ev), grad_bits)
        if r == INT8_IMPLICIT:
            if codes is not None:  # the forward's NHWC codes
                a, ox = codes
            else:
                a, ox = int8_operand(xv, bits)
                a = a.permute(0, 2, 3, 1).contiguous()
            acc = conv_wgrad_int8_implicit(ae.contiguous(), oe, a, ox, (kh, kw), stride, padding, dilation)
        else:
            a, ox = int8_operand(xv, bits)
            pad_value = 0 if ox is None else -int(ox)  # (a host read: the CPU check route only)
            cols = im2col(a, (kh, kw), stride, padding, dilation, pad_value)
            acc = mm_int8(ae.t().contiguous(), cols.t().contiguous(), oe, ox)
        return epilogue(acc, scale, None).view(o, kh, kw, c).permute(0, 3, 1, 2).contiguous()
    fn = lambda e, x: torch.nn.grad.conv2d_weight(x, w_shape, e, stride, padding, dilation, groups)  # noqa: E731
    if r == TF32:
        with exact_gemm.tf32():
            acc = fn(ev, xv)
    elif r == FP16:
        acc = conv16(fn, _fp16(ev, grad_bits, r), _fp16(xv, bits, r)).mul_(_unscale(r, grad_bits, bits))
    else:
        raise ValueError(f"route {r!r} does not run a {kind} wgrad")
    return epilogue(acc, scale, None)


def _rows(kind: str, xv: torch.Tensor, geom) -> torch.Tensor:
    """The activation's rows of the GEMM: a Linear's tokens, a 1x1 convolution's (strided) pixels."""
    if kind == "linear":
        return xv.reshape(-1, xv.shape[-1])
    sh, sw_ = _pair(geom[0])
    return nhwc_rows(xv[:, :, ::sh, ::sw_])


# ------------------------------------------------------------------------------------------------------------------
# On or off, and what config.json records

def mode() -> str:
    return exact_gemm.mode()


def choice(device) -> dict:
    """Whether quantized layers on ``device`` take these routes, and why: ``{"on", "why", "implicit_conv", ...}``.
    CPTSIM_EXACT_GEMM=int8 forces them (on a CPU too, for checks); unset on CUDA they are on where
    gemm_choice.cuda_choice measured them faster than today's path; anything else, off."""
    dev = torch.device(device)
    m = mode()
    if not hasattr(torch, "_int_mm"):
        return {"on": False, "why": "this torch has no torch._int_mm", "implicit_conv": False, "implicit_wgrad": False}
    if m == "int8":
        return {"on": dev.type in ("cuda", "cpu"), "why": "CPTSIM_EXACT_GEMM=int8",
                "implicit_conv": implicit_usable(dev), "implicit_wgrad": implicit_usable(dev)}
    if dev.type != "cuda":
        return {"on": False, "why": "not a CUDA device", "implicit_conv": False, "implicit_wgrad": False}
    if m != "auto":
        return {"on": False, "why": f"CPTSIM_EXACT_GEMM={m}", "implicit_conv": False, "implicit_wgrad": False}
    memo = (str(dev), os.environ.get("CPTSIM_HOME"), os.environ.get("XDG_CACHE_HOME"))
    out = _CUDA_CHOICE.get(memo)
    if out is None:  # (layers ask on every call: once per device and cache location)
        from . import gemm_choice

        out = dict(gemm_choice.cuda_choice(dev, make_probes=cuda_probes))
        for k in ("implicit_conv", "implicit_wgrad"):
            out[k] = bool(out.get(k)) and implicit_usable(dev)
        if out.get("source"):  # a decision, not "not measured yet"
            _CUDA_CHOICE[memo] = out
    return out


_CUDA_CHOICE: dict = {}


def enabled(device) -> bool:
    """Cheap on a CPU (the mode only); on CUDA the measured decision, kept after the first call."""
    if torch.device(device).type == "cpu" and mode() != "int8":
        return False
    return choice(device)["on"]


def layer_routes(m, bits: int, grad_bits: int, device, autocast: bool = False) -> dict:
    """``route`` for the quantized layer ``m`` (its kind and forward K from its weight and geometry) on ``device``."""
    why, w = choice(device), m.weight
    k_dgrad = w.shape[0] * w[0, 0].numel() // max(int(getattr(m, "groups", 1)), 1) if w.dim() == 4 else 0
    return route(m._tc_kind, bits, grad_bits, w[0].numel(), device=torch.device(device).type, autocast=autocast,
                 implicit=why["implicit_conv"], implicit_wgrad=why["implicit_wgrad"], k_dgrad=k_dgrad)


def _record(m, bits: int, grad_bits: int, device) -> dict:
    r = layer_routes(m, bits, grad_bits, device)
    k = m.weight[0].numel()
    return {**r, "exact": {"forward": exact(r["forward"], bits, bits, k), "dgrad": False,
                           "wgrad": exact(r["wgrad"], grad_bits, bits, None)}}


def cuda_probes(device) -> dict:
    """The calls cptsim.numerics.gemm_choice.cuda_choice times on ``device`` (that module's CUDA section says which):
    label -> a no-argument callable. Operands from a private generator: a run's random stream is untouched."""
    from .gemm_choice import CUDA_CONV_PROBE, CUDA_MM_PROBE

    g = torch.Generator(device=device).manual_seed(0)  # not the global generator
    M, K, N = CUDA_MM_PROBE
    s = torch.full((N,), 1e-3, device=device)
    xq = torch.randint(-100, 156, (M, K), generator=g, device=device).float() * s[0]
    wq = torch.randint(-128, 128, (N, K), generator=g, device=device).float() * s[0]

    def int8_mm():
        xv, wv = exact_gemm.int_values(xq, s[0]), exact_gemm.int_values(wq, s[:, None])
        return forward("linear", INT8, xv, s[0], wv, s, None, 8)[0]

    def tf32_mm():
        with exact_gemm.tf32():
            return torch.mm(xq, wq.t())

    n, c, h, w, o, k = CUDA_CONV_PROBE
    cs = torch.full((o,), 1e-3, device=device)
    cx = torch.randint(-100, 156, (n, c, h, w), generator=g, device=device).float() * cs[0]
    cw = torch.randint(-128, 128, (o, c, k, k), generator=g, device=device).float() * cs[0]

    def conv_probe(r):
        xv, wv = exact_gemm.int_values(cx, cs[0]), exact_gemm.int_values(cw, cs.view(-1, 1, 1, 1))
        return forward("conv", r, xv, cs[0], wv, cs, None, 8, (1, 1, 1, 1))[0]

    ce = torch.randint(-100, 156, (n, o, h, w), generator=g, device=device).float() * cs[0]

    def wgrad_probe(r):
        ev, xv = exact_gemm.int_values(ce, cs[0]), exact_gemm.int_values(cx, cs[0])
        return wgrad("conv", r, ev, cs[0], 8, cs[0], 8, (o, c, k, k), (1, 1, 1, 1), xv=xv)

    return {"int8_mm": int8_mm, "tf32_mm": tf32_mm, "implicit_conv": lambda: conv_probe(INT8_IMPLICIT),
            "tf32_conv": lambda: conv_probe(TF32), "implicit_wgrad": lambda: wgrad_probe(INT8_IMPLICIT),
            "tf32_wgrad": lambda: wgrad_probe(TF32)}


# the widths config.json records routes at (forward bits = gradient bits): the int8 routes' (the layer's top-level
# entry, as every other path records it), FP16's exact integers, FP16 scaled
RECORDED_WIDTHS = {"<=8": (8, 8), "9-11": (11, 11), "12-16": (16, 16)}


def gemm_paths(model: torch.nn.Module, device) -> dict:
    """config.json ``host.gemm_paths`` where these routes are on: the rule, the decision, and per quantized layer
    the routes of its forward / dgrad / wgrad at <= 8 bits (top level) and at 9-11 and 12-16 bits (``widths``), each
    with whether it is exact (True, False, or for wgrad the largest exact tokens per call)."""
    why = choice(device)
    layers = {}
    for name, m in model.named_modules():
        if not hasattr(m, "precision") or not hasattr(m, "act_count"):
            continue
        if getattr(m, "_tc_kind", None) is None:  # attention's products, aggregations: today's path
            layers[name] = dict.fromkeys(GEMMS, FAKE)
            continue
        rec = {w: _record(m, b, g, device) for w, (b, g) in RECORDED_WIDTHS.items()}
        layers[name] = {**rec.pop("<=8"), "widths": rec}
    return {"exact_gemm": INT8, "choice": why,
            "rule": (f"forward: {INT8} (Linear, 1x1 conv) / {INT8_IMPLICIT if why['implicit_conv'] else TF32} (k x k "
                     f"conv) at <= {INT8_BITS} bits, {FP16_ACC32} / {TF32} at <= {FP16_EXACT_BITS}, {FP16} at <= 16; "
                     f"wgrad: {INT8} (Linear, 1x1) / {INT8_IMPLICIT if why['implicit_wgrad'] else TF32} (k x k) "
                     f"at forward and gradient bits <= {INT8_BITS}, "
                     f"{FP16_ACC32} / {TF32} at <= {FP16_EXACT_BITS}, {FP16} / {TF32} above; dgrad: {FP16} "
                     f"(the weight's "
                     f"per-channel scales lie along its reduction: not exact); exact: int8 sums always (int32 chunks "
                     f"of K <= {MAX_K}, int64 across), FP32 sums of integers while K (2^a - 1)(2^b - 1) < 2^24; "
                     f"32 bits, gradient bits 32, autocast, float64: {FAKE}"),
            "layers": layers}


exact_gemm.register_tensor_core_routes(enabled, gemm_paths, choice)

"""A GPU training step priced as it *ran*, not as the GPU could run it natively.

``cptsim cost --hw h100`` prices a quantized step on the GPU's integer tensor cores: a 4-bit GEMM on the int8
tier, its operands stored in 8 bits, no quantizer passes -- what a native low-precision pipeline would cost. A
step ``cptsim train --device cuda`` ran may have executed something else: fake quantization (quantizers, then FP32
GEMMs -- on TF32 for convolutions by PyTorch's default), the integer codes on TF32, or int8 tensor cores. To compare
a run's measured step times with the model, the model must price what ran. A ``route`` names that:

* ``fake-quant``: every GEMM on the FP32 tiers the run's TF32 flags select, activations and errors stored in FP32,
  plus the quantizers' own passes (below);
* ``int-codes``: the same GEMMs forced onto TF32 (both convolutions and matmuls), plus the quantizers and the
  passes that take the integer codes out (exact_gemm's integer-codes layer);
* ``native`` (the tensor-core routes, ``cptsim.numerics.gpu_gemm``): each quantized layer's forward, dgrad and wgrad
  on the route that module's ``route`` gave it at the step's widths (int8 tensor cores, FP16, TF32 on the integer
  codes, or today's FP32 GEMM; ``tensor_core_step``), every other layer and op in FP32 as the run kept them.

Besides its GEMMs a quantized layer runs passes: the quantizers (its input's range and running range, Qa(x), Qw(W),
the error with stochastic rounding in backward, Qa(x) again for wgrad where the route recomputes it) and, on the
integer routes, the code passes that turn quantized tensors into integer codes and scales (ranges of the weight and
the error, the integers, int8 operands with their offsets, the offset corrections of an int8 GEMM, FP16 operands,
the scale epilogue and the layout copies). ``layer_passes`` lists them as each route's code runs them, kernel by
kernel, with the bytes each moves; tests/test_gpu_layer_passes.py counts the kernels the real code launches for each
route and checks them against it. They are memory-bound: their bytes at the profile's achieved bandwidth, and every
kernel pays the profile's per-kernel overhead.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np

from .base import FULL_PRECISION_BITS

FAKE_QUANT, INT_CODES, NATIVE = "fake-quant", "int-codes", "native"
ROUTES = (FAKE_QUANT, INT_CODES, NATIVE)


def fp32_tiers(gpu, tf32: dict | None):
    """A copy of ``gpu`` whose FP32 convolutions and matmuls run on the tiers the run's TF32 flags
    (``torch.backends.cudnn.allow_tf32``, ``torch.backends.cuda.matmul.allow_tf32``) gave them; None: PyTorch's
    defaults, as the profile assumes."""
    if not tf32:
        return gpu
    names = gpu._tier_names
    strict = "fp32" if "fp32" in names else gpu.params["fp32_matmul_tier"]
    tf = "tf32" if "tf32" in names else gpu.params["fp32_tier"]
    conv = tf if tf32.get("torch.backends.cudnn.allow_tf32", True) else strict
    mm = tf if tf32.get("torch.backends.cuda.matmul.allow_tf32", False) else strict
    return _with_tiers(gpu, conv, mm)


def _with_tiers(gpu, conv: str, matmul: str):
    if (conv, matmul) == (gpu.params["fp32_tier"], gpu.params["fp32_matmul_tier"]):
        return gpu
    params = copy.deepcopy(gpu.params)
    params["fp32_tier"], params["fp32_matmul_tier"] = conv, matmul
    view = dataclasses.replace(gpu, params=params)
    return view


def route_view(gpu, route: str, tf32: dict | None):
    """The profile that prices every GEMM of a step on the fake-quant route (the FP32 tiers the run's TF32 flags
    give) or the integer-codes route (TF32, convolutions and matmuls); the tensor-core routes price each layer's
    phases apart (``tensor_core_step``)."""
    if route == INT_CODES:
        tf = "tf32" if "tf32" in gpu._tier_names else gpu.params["fp32_tier"]
        return _with_tiers(gpu, tf, tf)
    return fp32_tiers(gpu, tf32)


# config.json's names of the GEMM routes (cptsim.numerics.gpu_gemm's INT8, INT8_IMPLICIT, INT8_IM2COL, FP16_ACC32,
# FP16, TF32, FAKE; kept as text here, where torch is not imported: tests/test_gpu_layer_passes.py checks them)
INT8_MM, INT8_IMPLICIT, INT8_IM2COL = "int8-tc", "int8-tc-implicit-gemm", "int8-tc-im2col"
FP16_ACC32, FP16_SCALED, TF32_CODES, FAKE_GEMM = "fp16-fp32acc", "fp16", "tf32-int-codes", "fp32-fake-quant"
INT8_GEMMS = (INT8_MM, INT8_IMPLICIT, INT8_IM2COL)
FULL_BITS = FULL_PRECISION_BITS
CODES_BITS = 11        # exact_gemm.MAX_TF32_BITS: the integer-codes layer takes forward bits <= 11 (and its wgrad the
#                        error's integers at gradient bits <= 11); wider, the general path
OFFSET_BITS = 8        # gpu_gemm.int8_operand: at 8 bits an int8 operand carries an offset, at <= 7 none
MAX_K = 32767          # gpu_gemm.MAX_K: an int8 GEMM sums K <= MAX_K in one int32; a longer K in chunks of
CHUNK_K = MAX_K - MAX_K % 8  # this many (a multiple of 8), summed in int64


def route_tier(r: str) -> str:
    """The tier a GEMM route runs on: "int8", "fp16", "tf32" (TF32 on the integer codes, whatever the run's flags),
    or "fp32" (today's FP32 GEMM of the fake-quantized values, on the tiers the run's TF32 flags give it)."""
    if r in INT8_GEMMS:
        return "int8"
    if r in (FP16_ACC32, FP16_SCALED):
        return "fp16"
    return "tf32" if r == TF32_CODES else "fp32"


# The passes, as the code runs them (cptsim.numerics.layers, quant, kernels, exact_gemm, gpu_gemm). Kernels count
# launches; bytes follow one rule: a kernel reads its tensor arguments and writes its outputs (an in-place op reads
# and writes its tensor), per element of the tensor it runs over, FP32 4 bytes, FP16 2, int8 1. Scalars and per-channel
# vectors are left out of the bytes (not of the kernels).
QPARAMS = 10   # quant.choose_qparams: clamp, clamp, sub, full_like, div, clamp, neg, div, round, clamp
RANGE = 11     # layers._input_range training on a device: aminmax, then the running range (eq, 2 x mul, add, where,
#                copy_, and add_ on the count)
# (kernels, bytes per element of its tensor) of one quantizer call, by how the quantizers ran (config.json
# host.quantizers): "fused" -- cptsim.numerics.kernels' Triton kernels (torch.compile's fused route is taken to launch
# as many: its kernels are generated, not counted here): Qa(x) one pass on the range given, Qw(W) one program per
# channel (its range and the pass), the error's range in two stages, its Philox seed, the stochastic pass; "eager" --
# quant.fake_quant (choose_qparams, reciprocal and six passes), per channel after an aminmax, and
# quant.fake_quant_stochastic (aminmax, choose_qparams, the scale's reciprocal, a multiply, the random words and their
# three byte planes added, then six passes).
QUANTIZER_CALLS = {
    "fused": {"act": (1, 8.0), "weight": (1, 8.0), "error": (4, 12.0)},
    "eager": {"act": (QPARAMS + 7, 48.0), "weight": (1 + QPARAMS + 7, 52.0), "error": (27, 72.0)},
}


def _int8_operand(bits: int) -> tuple[int, float]:
    """gpu_gemm.int8_operand of an FP32 tensor: at 8 bits its minimum, the offset (clamp, add), the subtraction, the
    cast to int8 and the offset's to int32; at <= 7 bits the cast alone."""
    return (6, 17.0) if bits >= OFFSET_BITS else (1, 5.0)


def _mm_corrections(oa: bool, ob: bool, a_elems: float, b_elems: float, out: float, wide: bool):
    """gpu_gemm.mm_int8's offset terms for ``sum (a + oa)(b + ob)`` with an ``out``-element accumulator (int64 when
    ``wide``: a chunked K): with ob the row sums of a times ob added; with oa the column sums of b (plus K ob) times oa
    added."""
    w = 8.0 if wide else 4.0
    k = b = 0.0
    if ob:
        k, b = k + 3 + wide, b + a_elems + w * out + 3 * w * out
    if oa:
        k, b = k + 3 + (2 if ob else 0) + wide + (wide and ob), b + b_elems + 2 * w * out
    return k, b


def _chunks(k: float) -> int:
    return max(1, int(-(-k // CHUNK_K)))


def layer_passes(kind: str | None, routes: dict | None, bits: int, grad_bits: int, a: float, w: float, e: float,
                 tokens: float, quantizers: str = "fused", codes: bool = False, bias: bool = False,
                 dgrad: bool = True, wgrad: bool = True, calls: float = 1.0,
                 weightless: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(kernels, bytes), each (3,) per phase (fwd, dgrad, wgrad), of one training step's quantizer and code passes of
    one quantized layer. ``kind``: gpu_gemm's layer kind ("linear", "conv1x1", "conv", "grouped"); ``routes``: its
    ``{"forward", "dgrad", "wgrad"}`` at these widths on the tensor-core routes (None: the general fake-quant path;
    ``codes``: the integer-codes path of exact_gemm instead); ``a``, ``w``, ``e``: the elements of its input, weight
    and output (= error) in the step; ``tokens``: its forward GEMM's rows (wgrad's reduction); ``bias``: it adds a
    bias; ``dgrad`` / ``wgrad``: the step computes them; ``calls``: the layer's calls per step (each quantizes anew).
    The module docstring says what is counted."""
    kern, nbytes = np.zeros(3), np.zeros(3)

    def add(phase: int, k: float, b: float = 0.0) -> None:
        kern[phase] += k
        nbytes[phase] += b

    q = QUANTIZER_CALLS[quantizers]
    back = 1 if dgrad else 2  # the error's quantizer: before dgrad, or before wgrad where there is no dgrad
    quant_fwd, quant_back = bits < FULL_BITS, grad_bits < FULL_BITS
    if routes is not None and all(r == FAKE_GEMM for r in routes.values()):
        routes = None  # (gpu_gemm's layers take the general path then)
    if codes and bits > CODES_BITS:
        codes = False
    if routes is None and not codes:  # the general path: Qa(x), Qw(W); the error; Qa(x) again for wgrad
        if quant_fwd:
            second = q["act"] if weightless else q["weight"]
            add(0, (RANGE * (1 + weightless) + q["act"][0] + second[0]) * calls,
                4 * a + q["act"][1] * a + (4 * weightless + second[1]) * w)
            if wgrad:
                add(2, q["act"][0] * calls, q["act"][1] * a)
        if quant_back and (dgrad or wgrad):
            add(back, q["error"][0] * calls, q["error"][1] * e)
        return kern, nbytes
    if not quant_fwd:  # (neither integer path runs at full precision: the general path's error alone)
        return layer_passes(kind, None, bits, grad_bits, a, w, e, tokens, quantizers, False, bias, dgrad, wgrad, calls,
                            weightless)
    # both integer paths: Qa(x) from its range, its scale, Qw(W), the weight's channel scales and integers
    add(0, (RANGE + QPARAMS + q["act"][0] + q["weight"][0] + 1 + QPARAMS) * calls,
        4 * a + q["act"][1] * a + q["weight"][1] * w + 4 * w)
    add(0, 3 * calls, 16 * w)  # exact_gemm.int_values(Qw(W)): reciprocal, multiply, round
    add(0, 3 * calls, 16 * a)  # Qa(x)'s integers: reciprocal, multiply, round (in place or not)
    if codes:  # exact_gemm's integer-codes layer: the GEMM on TF32, then y * (sx sw) (+ bias)
        add(0, (2 + bias) * calls, (8 + 8 * bias) * e)
        if quant_back and (dgrad or wgrad):
            add(back, q["error"][0] * calls, q["error"][1] * e)
        if wgrad:  # Qa(x) again; at <= 11 bits the error's scale and integers, x's integers, then gw * (sg sx)
            add(2, q["act"][0] * calls, q["act"][1] * a)
            if grad_bits <= CODES_BITS:
                add(2, (1 + QPARAMS + 3 + 3 + 2) * calls, 4 * e + 16 * e + 16 * a + 8 * w)
        return kern, nbytes
    fwd, dg, wg = routes["forward"], routes["dgrad"], routes["wgrad"]
    mm = kind in ("linear", "conv1x1")
    add(0, calls)  # the scale product sx sw
    # forward: its operands as the route takes them, the GEMM (priced on its tier), its epilogue and layout copies
    if fwd in INT8_GEMMS:
        ka, ba = _int8_operand(bits)
        add(0, 2 * ka * calls, ba * (a + w))
        if mm:
            if kind == "conv1x1":
                add(0, 2 * calls, 8 * a + 8 * e)  # the (strided) pixels as rows, the output back from rows
            ck, cb = _mm_corrections(bits >= OFFSET_BITS, bits >= OFFSET_BITS, a, w, e, False)
            add(0, (ck + 2 + bias) * calls, cb + (8 + 8 + 8 * bias) * e)
        else:  # the implicit-GEMM kernel: weight to (O, kh kw C) and the NHWC codes, its window sums; no offsets:
            # zeros; the epilogue inside the kernel; the output from rows
            add(0, (3 + (0 if bits >= OFFSET_BITS else 2) + 1) * calls, 8 * w + 2 * a + w + 8 * e)
    elif fwd in (FP16_ACC32, FP16_SCALED):
        per = (2, 14.0) if fwd == FP16_SCALED else (1, 6.0)  # (times 2**-b,) to FP16
        add(0, 2 * per[0] * calls, per[1] * (a + w))
        if mm:
            if kind == "conv1x1":
                add(0, 2 * calls, 8 * a + 8 * e)
            add(0, (2 + bias) * calls, (16 + 8 * bias) * e)  # unscale, scales (+ bias)
        else:  # cuDNN's FP16 output to FP32, unscale, scales (+ bias)
            add(0, (3 + bias) * calls, (6 + 16 + 8 * bias) * e)
    else:  # TF32 on the integers: scales (+ bias)
        add(0, (1 + bias) * calls, (8 + 8 * bias) * e)
    # backward: the error quantized; its scale and integers where a backward GEMM takes them
    if quant_back and (dgrad or wgrad):
        add(back, q["error"][0] * calls, q["error"][1] * e)
    if (dgrad and dg != FAKE_GEMM) or (wgrad and wg != FAKE_GEMM):
        add(back, (1 + QPARAMS + 3) * calls, 4 * e + 16 * e)
    if dgrad and dg != FAKE_GEMM:  # FP16: the error's integers and the normalised weight to FP16, the unscale
        add(1, (1 + 2 + 2 + 2 + 2 + 1) * calls, 14 * e + 14 * w + 8 * a)
        if kind != "linear":
            add(1, calls, 6 * a)  # a convolution's: cuDNN's FP16 output to FP32
    if not wgrad:
        return kern, nbytes
    kept = fwd in (INT8_MM, INT8_IMPLICIT) and wg in (INT8_MM, INT8_IMPLICIT)  # the forward's int8 codes serve wgrad
    if not kept:  # Qa(x) again (and its integers for a route that takes them)
        add(2, q["act"][0] * calls, q["act"][1] * a)
        if wg != FAKE_GEMM:
            add(2, 3 * calls, 16 * a)
    if wg == FAKE_GEMM:
        return kern, nbytes
    add(2, calls)  # the scale product se sx
    if wg in INT8_GEMMS and mm:
        ke, be = _int8_operand(grad_bits)
        add(2, ke * calls, be * e)
        if kind == "conv1x1":
            add(2, calls, 8 * e)  # the error as rows
        if not kept:
            ka, ba = _int8_operand(bits)
            add(2, (ka + (kind == "conv1x1")) * calls, ba * a + (8 * a if kind == "conv1x1" else 0))
        n = _chunks(tokens)
        # both operands transposed into rows; a K over MAX_K summed in chunks: each chunk's slices copied, its int32
        # sums to int64 and added
        add(2, 2 * calls, 2 * e + 2 * a)
        if n > 1:
            add(2, (3 * n + n - 1) * calls, 2 * e + 2 * a + 12 * w * n + 24 * w * (n - 1))
        ck, cb = _mm_corrections(grad_bits >= OFFSET_BITS, bits >= OFFSET_BITS, e, a, w, n > 1)
        add(2, (ck + 2) * calls, cb + (12 if n > 1 else 8) * w + 8 * w)
    elif wg in INT8_GEMMS:  # the implicit-GEMM wgrad kernel
        ke, be = _int8_operand(grad_bits)
        add(2, (1 + ke) * calls, 8 * e + be * e)  # the error as rows, then int8
        if not kept:
            ka, ba = _int8_operand(bits)
            add(2, (ka + 1) * calls, ba * a + 2 * a)
        ox, oe = bits >= OFFSET_BITS, grad_bits >= OFFSET_BITS
        # its split sums added in int64 (their partial sums' size, which depends on the launch, is left out of the
        # bytes); the offsets' terms; the int64 sums to FP32, scaled; back to (O, C, kh, kw)
        add(2, (1 + (0 if ox else 1) + (4 if ox else 0) + (1 + (3 if ox else 0) + 3 if oe else 0)) * calls,
            (e + 16 * w if ox else 0.0) + (16 * w if oe else 0.0))
        add(2, 3 * calls, 12 * w + 8 * w + 8 * w)
    elif wg in (FP16_ACC32, FP16_SCALED):
        per = (2, 14.0) if wg == FP16_SCALED else (1, 6.0)
        if kind == "conv1x1":
            add(2, 2 * calls, 8 * e + 8 * a)  # the error and the activation as rows
        add(2, 2 * per[0] * calls, per[1] * (e + a))
        add(2, (2 + (not mm)) * calls, 16 * w + (6 * w if not mm else 0))  # (FP16 output to FP32,) unscale, scale
    else:  # TF32 on the integers: the scale
        add(2, calls, 8 * w)
    return kern, nbytes


def tensor_core_step(gpu, arrays, tf32: dict | None, layer_routes: list, q: int, g: int, batch: int):
    """(seconds, joules), each (3,) per phase, of one step's GEMMs and other ops on the tensor-core routes: each
    quantized layer's forward / dgrad / wgrad on the tier of the route it took (``layer_routes[i]``: gpu_gemm's
    ``{"forward", "dgrad", "wgrad"}``, None for a layer those routes did not run), at the operand width that selects
    it (int8: 8 bits, FP16: 16, TF32 on the codes and today's FP32 GEMM: 32 -- on TF32 whatever the flags, and on the
    run's FP32 tiers); every other layer, and the step's other ops, at 32 bits as the run kept them (its activations
    FP32). Operands and outputs are stored as each tier stores them."""
    run32 = fp32_tiers(gpu, tf32)
    tf = "tf32" if "tf32" in gpu._tier_names else gpu.params["fp32_tier"]
    views = {"fp32": (run32, 32), "int8": (run32, 8), "fp16": (run32, 16), "tf32": (_with_tiers(gpu, tf, tf), 32)}
    tier = np.full((len(arrays), 3), "fp32", dtype=object)
    for i, r in enumerate(layer_routes):
        if r is not None and arrays.quantized[i]:
            tier[i] = [route_tier(r[k]) for k in ("forward", "dgrad", "wgrad")]
    one = lambda v: np.array([v])  # noqa: E731
    t, e = np.zeros(3), np.zeros(3)
    for name, (view, width) in views.items():
        sel = tier == name
        if name != "fp32" and not sel.any():
            continue
        pt, pe, xt, xe = view.price_step(arrays, one(width), one(width), one(batch))
        t += np.where(sel, pt[0], 0.0).sum(axis=0)
        e += np.where(sel, pe[0], 0.0).sum(axis=0)
        if name == "fp32" and xt is not None:  # the step's other ops, FP32 as the run kept them
            t, e = t + xt[0], e + xe[0]
    return t, e


def passes_cost(gpu, kernels: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, joules) per phase of passes that launch ``kernels`` and move ``nbytes``: the bytes at the profile's
    achieved bandwidth with the GPU busy, each launch's overhead at idle power (as the profile prices its other
    memory-bound ops)."""
    meff = float(gpu.calibration.get("memory_efficiency", 1.0) or 1.0)
    busy = np.asarray(nbytes, dtype=np.float64) / (gpu.params["bandwidth_gb_s"] * 1e9 * meff)
    over = np.asarray(kernels, dtype=np.float64) * gpu.kernel_overhead_s
    return busy + over, busy * gpu.busy_power_w + over * gpu.idle_power_w


def step_passes(arrays, layers: list, q: int, g: int, batch: int, quantizers: str = "fused",
                codes: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(kernels, bytes), each (3,), of one step's quantizer and code passes at forward bits ``q``, gradient bits
    ``g`` and ``batch`` samples: ``layer_passes`` of each quantized layer of ``arrays`` (``LayerProfile.arrays()``),
    ``layers[i]`` its ``(kind, routes, bias)`` on the tensor-core routes (routes None: the general path or, with
    ``codes``, the integer-codes one)."""
    kern, nbytes = np.zeros(3), np.zeros(3)
    n = float(batch)
    rows = arrays.gemm[:, 3] if arrays.gemm is not None else np.full(len(arrays), np.nan)
    for i in np.flatnonzero(arrays.quantized):
        kind, routes, bias = layers[i]
        operand = float(arrays.operand[i]) if arrays.operand is not None else 0.0
        calls = float(arrays.calls[i])
        macs = arrays.macs[i]
        if macs[0] <= 0:
            continue
        weightless = arrays.numel[i, 0] == 0
        w = operand * n if weightless else float(arrays.numel[i, 0]) * calls
        tokens = float(rows[i]) * n / calls if np.isfinite(rows[i]) else 0.0
        k, b = layer_passes(kind, routes, q, g, float(arrays.numel[i, 1]) * n, w, float(arrays.numel[i, 2]) * n,
                            tokens, quantizers, codes, bias, bool(macs[1] > 0), bool(macs[2] > 0), calls,
                            bool(weightless))
        kern += k
        nbytes += b
    return kern, nbytes


def describe_route(route: str, tf32: dict | None, eager: bool) -> str:
    """What ran, in words, for the report's table."""
    q = "eager quantizers" if eager else "fused quantizers"
    if route == INT_CODES:
        return f"integer codes on TF32 tensor cores ({q})"
    if route == NATIVE:
        return f"int8 / FP16 / TF32 tensor-core routes by layer and GEMM ({q})"
    conv = "TF32" if (tf32 or {}).get("torch.backends.cudnn.allow_tf32", True) else "strict FP32"
    mm = "TF32" if (tf32 or {}).get("torch.backends.cuda.matmul.allow_tf32", False) else "strict FP32"
    return f"fake-quant FP32 ({q}; convolutions {conv}, matmuls {mm})"

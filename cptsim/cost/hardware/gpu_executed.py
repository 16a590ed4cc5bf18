"""A GPU training step priced as it *ran*, not as the GPU could run it natively.

``cptsim cost --hw h100`` prices a quantized step on the GPU's integer tensor cores: a 4-bit GEMM on the int8
tier, its operands stored in 8 bits, no quantizer passes -- what a native low-precision pipeline would cost. A
step ``cptsim train --device cuda`` ran may have executed something else: fake quantization (quantizers, then FP32
GEMMs -- on TF32 for convolutions by PyTorch's default), the integer codes on TF32, or int8 tensor cores. To compare
a run's measured step times with the model, the model must price what ran. A ``route`` names that:

* ``fake-quant``: every GEMM on the FP32 tiers the run's TF32 flags select, activations and errors stored in FP32,
  plus the quantizers' own passes (below);
* ``int-codes``: the same GEMMs forced onto TF32 (both convolutions and matmuls), plus the quantizers and one
  more pass per quantized operand that takes its integer codes out;
* ``native``: the profile's own tiers (int8 / fp16 by width: what a native pipeline or int8 tensor-core GEMMs run),
  plus the quantizers.

The quantizers' passes: each quantizer (weight per forward, input per forward, error per backward) reads its
tensor for the range, reads it again and writes its output -- 12 bytes per FP32 element fused into two kernels
(torch.compile or Triton: a range kernel and a quantize kernel), and its element-wise chain (~13 kernels of
~52 bytes per element: six in-place passes and a min/max) when it runs eagerly. They are memory-bound, priced at
the profile's achieved bandwidth, and every kernel pays the profile's per-kernel overhead. The element counts are
``cptsim.cost.formulas.quant_elems``: the same counts the host model prices.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np

from ..formulas import quant_elems

FAKE_QUANT, INT_CODES, NATIVE = "fake-quant", "int-codes", "native"
ROUTES = (FAKE_QUANT, INT_CODES, NATIVE)

# bytes per quantized FP32 element and kernels per quantizer call, by how the quantizers ran
QUANTIZER_PASSES = {"fused": (12.0, 2), "eager": (52.0, 13)}
CODES_PASS = (8.0, 1)  # the integer-codes route's extra pass per operand: read the quantized value, write its code


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
    """The profile that prices a route's GEMMs, and the widths (forward, gradient) to price each step at:
    ``None`` keeps the step's own widths (native), 32 prices the step's GEMMs on the FP32 tiers."""
    if route == NATIVE:
        return fp32_tiers(gpu, tf32), None  # its 32-bit steps on the tiers the run's TF32 flags gave them
    if route == INT_CODES:
        tf = "tf32" if "tf32" in gpu._tier_names else gpu.params["fp32_tier"]
        return _with_tiers(gpu, tf, tf), 32
    return fp32_tiers(gpu, tf32), 32


def quantizer_cost(gpu, arrays, q, g, batch, eager: bool = False, codes: bool = False) -> tuple[float, float]:
    """Seconds and joules of one step's quantizer passes at forward bits ``q``, gradient bits ``g`` and ``batch``
    samples on ``gpu`` (``arrays``: the run's ``LayerProfile.arrays()``)."""
    elems = quant_elems(arrays.numel, arrays.macs, arrays.quantized, np.array([q]), np.array([g]),
                        np.array([float(batch)]), arrays.calls, arrays.operand)[0]  # (L, 3)
    bytes_per, kernels = QUANTIZER_PASSES["eager" if eager else "fused"]
    if codes:
        bytes_per, kernels = bytes_per + CODES_PASS[0], kernels + CODES_PASS[1]
    calls = float(np.count_nonzero(elems))  # one quantizer call per layer-phase that quantizes
    meff = float(gpu.calibration.get("memory_efficiency", 1.0) or 1.0)
    t = float(elems.sum()) * bytes_per / (gpu.params["bandwidth_gb_s"] * 1e9 * meff) \
        + calls * kernels * gpu.kernel_overhead_s
    return t, gpu.busy_power_w * t


def describe_route(route: str, tf32: dict | None, eager: bool) -> str:
    """What ran, in words, for the report's table."""
    q = "eager quantizers" if eager else "fused quantizers"
    if route == INT_CODES:
        return f"integer codes on TF32 tensor cores ({q})"
    if route == NATIVE:
        return f"int8 / FP16 tensor cores by width ({q})"
    conv = "TF32" if (tf32 or {}).get("torch.backends.cudnn.allow_tf32", True) else "strict FP32"
    mm = "TF32" if (tf32 or {}).get("torch.backends.cuda.matmul.allow_tf32", False) else "strict FP32"
    return f"fake-quant FP32 ({q}; convolutions {conv}, matmuls {mm})"

"""What a quantized layer runs on a GPU besides its GEMMs, as the GPU report prices it
(cptsim.cost.hardware.gpu_executed.layer_passes), against the kernels the layer's own code launches; and which
routes the report's tensor-core layers take (cptsim.calibration.gpu_runfit.TensorCoreLayers), against the layers'
own decision.

The count: one training step of one quantized layer, run on a CPU down the GPU's code path -- the quantizers take
their Triton route (quant.KERNEL_DEVICES), each launch counted and stood in for; the implicit-GEMM kernels stood in
for; FP16 GEMMs called as on CUDA (one call, an FP32 output); every aten op counted under a dispatch mode, except those
that launch nothing (views, allocations). The running range then takes its device path, as on a GPU. GEMMs are left
out of both sides: their time is priced from the layer's MACs and their launches are the op list's.
"""

from __future__ import annotations

import collections
import contextlib

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

pytest.importorskip("triton")

NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "detach",
             "resize_", "set_", "alias", "_unsafe_view"}
GEMM = {"convolution", "convolution_backward", "mm", "addmm", "bmm", "_int_mm"}


class _Count(TorchDispatchMode):
    """Kernels per phase, and their bytes (each reads its tensor arguments and writes its outputs)."""

    def __init__(self):
        super().__init__()
        self.kernels, self.bytes = collections.Counter(), collections.Counter()
        self.phase, self.paused, self.on = "fwd", 0, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if not self.paused and not func.is_view and name not in NO_KERNEL and name not in GEMM:
            self.add([t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)])
        return out

    def add(self, tensors):
        self.kernels[self.phase] += 1
        self.bytes[self.phase] += sum(t.numel() * t.element_size() for t in tensors)

    @contextlib.contextmanager
    def off(self):
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1


def _count(mp, kind, bits, grad_bits, quantizers="triton", path="tc", bias=False, rows=4096):
    """(kernels, bytes) per phase ("fwd", "bwd") of one step of one quantized layer, its routes, and its input,
    weight and output elements."""
    import triton

    from cptsim.numerics import gpu_gemm, kernels, quant
    from cptsim.numerics.layers import quantize_model

    c = _Count()
    mp.setenv("CPTSIM_QUANT_KERNELS", quantizers)
    mp.setenv("CPTSIM_CKERNELS", "0")
    mp.setenv("CPTSIM_EXACT_GEMM", {"fake": "0", "codes": "codes", "tc": "int8"}[path])
    mp.setenv("TRITON_INTERPRET", "1")  # the implicit-GEMM routes are on where Triton can run them
    mp.setattr(quant, "KERNEL_DEVICES", ("cpu",))
    # the quantizers take their GPU route although a dispatch mode is counting (it would otherwise see eager ops)
    mp.setattr(quant, "_device_route", lambda x: None if x.device.type not in quant.KERNEL_DEVICES
               or quant.quant_route() == "eager" else quant.quant_route())

    def launch(device, name, grid, *args, **meta):
        if c.on and not c.paused:
            c.add(args[:2])  # the tensor it reads, the one it writes
        with c.off():
            if name in ("_fq_tensor_kernel", "_fq_rows_kernel", "_fq_sr_kernel"):
                args[1].copy_(args[0])
            else:
                args[1].copy_(torch.arange(args[1].numel()) % 2)

    class GemmKernel:  # the implicit-GEMM Triton kernels: GEMMs
        def __getitem__(self, grid):
            return lambda *a, **k: None

    def mm16(a16, b16):
        with c.off():
            return torch.mm(a16.float(), b16.float())

    def conv16(fn, a16, b16):  # cuDNN's FP16 convolution, then its output to FP32
        with c.off():
            y = fn(a16.float(), b16.float()).half()
        return y.float()

    mp.setattr(kernels, "_launch", launch)
    mp.setattr(gpu_gemm, "_conv_kernel", lambda device: (triton, GemmKernel(), GemmKernel()))
    mp.setattr(gpu_gemm, "mm16", mm16)
    mp.setattr(gpu_gemm, "conv16", conv16)
    torch.manual_seed(0)
    layer = {"conv": nn.Conv2d(16, 32, 3, padding=1, bias=bias), "conv1x1": nn.Conv2d(16, 32, 1, bias=bias),
             "linear": nn.Linear(64, 32, bias=bias)}[kind]
    model = nn.Sequential(layer)
    quantize_model(model, fp_layers=[]).set(bits, grad_bits)
    model.train()
    x = (torch.randn(4, 16, 32, 32) if kind != "linear" else torch.randn(rows, 64)).requires_grad_(True)
    y = model(x)  # a first step seeds the running range
    grad = torch.ones(y.shape)
    y.backward(grad)
    model.zero_grad(set_to_none=True)
    x.grad = None
    with c:
        c.on = True
        y = model(x)
        c.phase = "bwd"
        y.backward(grad)
    return c.kernels, c.bytes, getattr(model[0], "gemm_path", None), (x.numel(), layer.weight.numel(), y.numel())


CASES = [  # (layer, bits, gradient bits, quantizers, path)
    ("conv", 8, 8, "triton", "fake"), ("conv", 8, 8, "eager", "fake"), ("linear", 6, 8, "triton", "fake"),
    ("conv", 8, 8, "triton", "codes"), ("conv", 8, 8, "eager", "codes"),
    ("conv", 8, 8, "triton", "tc"), ("conv", 4, 8, "triton", "tc"), ("conv", 8, 4, "triton", "tc"),
    ("conv1x1", 8, 8, "triton", "tc"), ("linear", 8, 8, "triton", "tc"), ("linear", 4, 4, "triton", "tc"),
    ("linear", 8, 8, "eager", "tc"), ("linear", 11, 11, "triton", "tc"), ("linear", 16, 16, "triton", "tc"),
    ("conv", 11, 11, "triton", "tc"), ("conv", 16, 16, "triton", "tc"), ("conv1x1", 16, 16, "triton", "tc"),
    ("conv", 8, 32, "triton", "tc"),
]


@pytest.mark.parametrize("kind,bits,grad_bits,quantizers,path", CASES)
def test_a_layers_passes_are_the_kernels_its_code_launches(monkeypatch, kind, bits, grad_bits, quantizers, path):
    from cptsim.cost.hardware.gpu_executed import layer_passes

    kernels, nbytes, routes, (a, w, e) = _count(monkeypatch, kind, bits, grad_bits, quantizers, path)
    if path == "tc":
        assert routes is not None and routes["forward"] != "fp32-fake-quant"
    k, b = layer_passes(kind, routes if path == "tc" else None, bits, grad_bits, a, w, e,
                        a // 64 if kind == "linear" else 4 * 32 * 32, "eager" if quantizers == "eager" else "fused",
                        codes=path == "codes")
    assert (k[0], k[1] + k[2]) == (kernels["fwd"], kernels["bwd"])
    # bytes: scalars, per-channel vectors and the implicit wgrad's split partial sums are left out of the model
    assert b[0] == pytest.approx(nbytes["fwd"], rel=0.05)
    assert b[1] + b[2] == pytest.approx(nbytes["bwd"], rel=0.05)


def test_each_quantizer_is_more_than_one_kernel_and_a_bias_adds_the_epilogues_add(monkeypatch):
    from cptsim.cost.hardware.gpu_executed import layer_passes

    # the general path: one quantized layer's step is 18 kernels, not one per layer-phase that quantizes
    kernels, _, _, (a, w, e) = _count(monkeypatch, "conv", 8, 8, "triton", "fake")
    assert kernels["fwd"] + kernels["bwd"] == 18
    # a Linear's bias is added after its int8 GEMM: one more forward kernel (its gradient's sum is the op list's)
    with_bias, _, routes, (a, w, e) = _count(monkeypatch, "linear", 8, 8, "triton", "tc", bias=True)
    k, _ = layer_passes("linear", routes, 8, 8, a, w, e, a // 64, bias=True)
    assert k[0] == with_bias["fwd"]


def test_a_wgrad_over_more_tokens_than_one_int32_holds_is_summed_in_chunks(monkeypatch):
    from cptsim.cost.hardware.gpu_executed import MAX_K, layer_passes

    for rows, bits, grad_bits in ((MAX_K + 7233, 8, 8), (2 * MAX_K + 100, 8, 4)):
        kernels, nbytes, routes, (a, w, e) = _count(monkeypatch, "linear", bits, grad_bits, rows=rows)
        k, b = layer_passes("linear", routes, bits, grad_bits, a, w, e, rows)
        assert (k[0], k[1] + k[2]) == (kernels["fwd"], kernels["bwd"])
        assert b[1] + b[2] == pytest.approx(nbytes["bwd"], rel=0.05)


def test_the_route_names_are_gpu_gemms():
    from cptsim.cost.hardware import gpu_executed as X
    from cptsim.numerics import exact_gemm, gpu_gemm

    assert (X.INT8_MM, X.INT8_IMPLICIT, X.INT8_IM2COL) == (gpu_gemm.INT8, gpu_gemm.INT8_IMPLICIT, gpu_gemm.INT8_IM2COL)
    assert (X.FP16_ACC32, X.FP16_SCALED, X.TF32_CODES, X.FAKE_GEMM) == (gpu_gemm.FP16_ACC32, gpu_gemm.FP16,
                                                                       gpu_gemm.TF32, gpu_gemm.FAKE)
    assert (X.MAX_K, X.OFFSET_BITS, X.CODES_BITS) == (gpu_gemm.MAX_K, gpu_gemm.INT8_BITS, exact_gemm.MAX_TF32_BITS)
    assert X.INT8_MM == exact_gemm.TC_ROUTES  # what config.json's exact_gemm says when these routes are on


def _model():
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 1, stride=2),
                         nn.Conv2d(32, 32, 3, padding=1, groups=4), nn.Conv2d(32, 32, 1, padding=1), nn.Flatten(),
                         nn.Linear(32 * 18 * 18, 10), nn.Linear(10, 10))


def test_the_reports_layers_take_the_routes_the_layers_themselves_take_at_any_widths(monkeypatch):
    """At widths config.json records and at the mixed ones it does not (4 / 16, 16 / 4, ...), with and without the
    convolutions' geometry in the profile (profiles written before it was recorded): each layer's routes are the
    ones gpu_gemm.layer_routes gives the layer itself."""
    from cptsim.calibration.gpu_runfit import TensorCoreLayers
    from cptsim.measure.profiler import LayerProfile, profile_model
    from cptsim.numerics import gpu_gemm
    from cptsim.numerics.layers import quantize_model

    monkeypatch.setenv("CPTSIM_EXACT_GEMM", "int8")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the implicit-GEMM kernels on, as on CUDA
    model = _model()
    quantize_model(model, fp_layers=[])
    prof = profile_model(model, (3, 32, 32), batch_size=2)
    cfg = {"host": {"gemm_paths": gpu_gemm.gemm_paths(model, "cpu")}}
    assert cfg["host"]["gemm_paths"]["choice"]["implicit_conv"]
    old = LayerProfile.from_json(prof.to_json())
    for rec in old.layers:
        rec.conv = None
    modules = dict(model.named_modules())
    widths = [(8, 8), (4, 8), (8, 4), (3, 16), (16, 3), (11, 11), (10, 16), (16, 16), (12, 9), (8, 32), (32, 8)]
    for p in (prof, old):
        layers = TensorCoreLayers(cfg, p)
        for q, g in widths:
            got = layers.at(q, g)
            for rec, (kind, routes, _) in zip(p.layers, got):
                want = gpu_gemm.layer_routes(modules[rec.name], q, g, "cpu")
                assert routes == want, (rec.name, q, g, routes, want)
                assert kind == modules[rec.name]._tc_kind

"""No quantizer falls back on a GPU's fused routes for any layer of timm's resnet50, convnext_tiny,
vit_small_patch16_224 and efficientnet_b0: every quantizer call of a training step counted, fused against eager.

Without a GPU, CPU tensors are made to take the GPU route (quant.KERNEL_DEVICES; the C kernels off, so the layers
take the general path that CUDA takes):

* Triton route: one training step per model (batch 2, 32x32 images: the layers' weight shapes are the models'
  own), the launchers run for real (layouts, plans, seeds) up to the launch, which is counted and stands in for
  the kernel by copying its input -- the dispatch picks a Triton kernel for every call, whatever the shape;
* compile route: torch.compile (backend "eager": dynamo's graphs, no code generation) over every (quantizer,
  shape, strides) those steps produced, on meta tensors; dynamo's own counters give the graphs made, and no call
  hits the recompile limit (which fullgraph turns into a recorded fallback).
"""

from __future__ import annotations

import collections

import pytest
import torch

timm = pytest.importorskip("timm")
kernels = pytest.importorskip("cptsim.numerics.kernels")

from cptsim.numerics import quant  # noqa: E402
from cptsim.numerics.layers import quantize_model, quantized_layer_names  # noqa: E402

MODELS = ("resnet50", "convnext_tiny", "vit_small_patch16_224", "efficientnet_b0")
EAGER = ("fake_quant_per_tensor", "fake_quant_per_channel", "fake_quant_stochastic")


def _count_eager(monkeypatch, counts):
    for name in EAGER:
        original = getattr(quant, name)
        monkeypatch.setattr(quant, name, lambda *a, _f=original, _n=name, **k: counts.update([_n]) or _f(*a, **k))


def _step(name):
    """One training step of ``name`` at 8/8 bits; its number of quantized layers."""
    torch.manual_seed(0)
    kw = {"img_size": 32} if name.startswith("vit") else {}
    model = timm.create_model(name, pretrained=False, **kw)
    quantize_model(model).set(8, 8)
    model.train()
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    return len(quantized_layer_names(model))


def _stand_in(device, name, grid, *args, **meta):
    """A launch counted, not run: the quantizers' outputs are their inputs, the ranges (0, 1)."""
    if name in ("_fq_tensor_kernel", "_fq_rows_kernel", "_fq_sr_kernel"):
        args[1].copy_(args[0])
    else:
        args[1].copy_(torch.arange(args[1].numel()) % 2)
    return name


@pytest.fixture(scope="module")
def triton_steps():
    """The four models' steps on the Triton route: kernel launches, eager calls, fallbacks, and every distinct
    (quantizer, shape, strides) the layers quantized."""
    mp = pytest.MonkeyPatch()
    launches, eager, calls = collections.Counter(), collections.Counter(), {}
    try:
        mp.setattr(quant, "KERNEL_DEVICES", ("cuda", "cpu"))
        mp.setenv("CPTSIM_QUANT_KERNELS", "triton")
        mp.setenv("CPTSIM_CKERNELS", "0")
        mp.setattr(kernels, "_launch", lambda *a, **k: launches.update([_stand_in(*a, **k)]))
        _count_eager(mp, eager)
        on_device = quant._on_device

        def record(kernel, route, x, qmax, *rng):
            calls.setdefault((kernel, tuple(x.shape), x.stride(), x.dtype), None)
            return on_device(kernel, route, x, qmax, *rng)

        mp.setattr(quant, "_on_device", record)
        quant.clear_fallbacks()
        layers = {}
        for name in MODELS:
            layers[name] = _step(name)
        yield {"layers": layers, "launches": launches, "eager": eager, "fallbacks": quant.fallbacks(),
               "calls": list(calls)}
    finally:
        mp.undo()
        quant.clear_fallbacks()


def test_the_triton_route_takes_every_quantizer_call_of_four_timm_models(triton_steps):
    assert all(triton_steps["layers"].values())  # every Conv2d and Linear but the classifier is quantized
    n = sum(triton_steps["layers"].values())
    launches = triton_steps["launches"]
    assert sum(triton_steps["eager"].values()) == 0, triton_steps["eager"]
    assert triton_steps["fallbacks"] == {}
    # per quantized layer and step: its weight once, its input in forward (and again in backward where wgrad's
    # saved input is recomputed, layers._quantized_call), its error once (a range pass first: one or two kernels)
    assert launches["_fq_rows_kernel"] == n
    assert n < launches["_fq_tensor_kernel"] <= 2 * n
    assert launches["_fq_sr_kernel"] == launches["_minmax_parts_kernel"] == n
    assert launches["_minmax_final_kernel"] <= n


def test_the_compile_route_makes_one_graph_per_quantizer_for_every_shape(triton_steps, monkeypatch):
    dynamo = torch._dynamo
    monkeypatch.setattr(quant, "KERNEL_DEVICES", ("cuda", "meta"))
    monkeypatch.setenv("CPTSIM_QUANT_KERNELS", "compile")
    monkeypatch.setattr(quant, "COMPILE_BACKEND", "eager")
    for attr, kernel in (("_FQ", "fake_quant"), ("_FQ_CHANNEL", "fake_quant_per_channel"),
                         ("_SR", "fake_quant_stochastic")):  # fresh compiled forms, compiled with the eager backend
        fresh = quant._Fused(kernel, getattr(quant, attr)._fused)
        monkeypatch.setattr(quant, attr, fresh)
        monkeypatch.setitem(quant._COMPILED, kernel, fresh)
    eager = collections.Counter()
    _count_eager(monkeypatch, eager)
    quant.clear_fallbacks()
    dynamo.reset()
    dynamo.utils.counters.clear()
    lo, hi = torch.zeros((), device="meta"), torch.ones((), device="meta")
    compiled = 0
    try:
        for kernel, shape, stride, dtype in triton_steps["calls"]:
            x = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
            if kernel == "fake_quant":
                out = quant.quantize_activation(x, lo, hi, 8)
            elif kernel == "fake_quant_per_channel":
                out = quant.quantize_weight(x, 8)
            else:
                out = quant.quantize_error(x, 8)
            assert out.shape == x.shape and (out.stride() == x.stride() or not quant.dense(x))
            compiled += 1
        graphs = dynamo.utils.counters["stats"]["unique_graphs"]
        assert sum(eager.values()) == 0 and quant.fallbacks() == {}, (eager, quant.fallbacks())
        assert graphs == len(quant.QUANTIZERS), dict(dynamo.utils.counters["stats"])
        assert compiled - sum(eager.values()) == len(triton_steps["calls"]) > 100
    finally:
        quant.clear_fallbacks()
        dynamo.reset()

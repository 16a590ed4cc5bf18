"""Quantized layers against a second implementation built from torch.nn.grad and the quantizer primitives."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cptsim.errors import InputError
from cptsim.numerics.layers import (
    ACT_MOMENTUM,
    PrecisionState,
    QConv2d,
    QLinear,
    quantize_model,
    quantized_layer_names,
)
from cptsim.numerics import ckernels
from cptsim.numerics.quant import (
    fake_quant_per_channel,
    fake_quant_per_tensor,
    fake_quant_stochastic,
    quantize_activation,
    quantize_error,
)


def _net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2), nn.ReLU(), nn.Flatten(),
        nn.Linear(8 * 4 * 4, 16), nn.ReLU(), nn.Linear(16, 10),
    )


def test_32_bits_is_exactly_the_fp32_layer():
    ref = _net()
    net = copy.deepcopy(ref)
    quantize_model(net, fp_layers=[]).set(32, 32)
    x = torch.randn(4, 3, 8, 8)
    y_ref, y = ref(x), net(x)
    assert torch.equal(y, y_ref)
    y_ref.square().sum().backward()
    y.square().sum().backward()
    for (n, p_ref), (_, p) in zip(ref.named_parameters(), net.named_parameters()):
        assert torch.equal(p.grad, p_ref.grad), n


def test_default_keeps_the_final_classifier_full_precision():
    net = _net()
    quantize_model(net)
    assert quantized_layer_names(net) == ["0", "3", "6"]
    assert type(net[8]) is nn.Linear


def test_fp_layer_globs_and_typos():
    net = _net()
    quantize_model(net, fp_layers=["0", "[68]"])
    assert quantized_layer_names(net) == ["3"]
    with pytest.raises(InputError, match="matches no"):
        quantize_model(_net(), fp_layers=["classifier"])


def test_swap_keeps_the_same_parameter_objects_and_state_dict_keys():
    net = _net()
    params = [id(p) for p in net.parameters()]
    keys = set(net.state_dict())
    quantize_model(net)
    assert [id(p) for p in net.parameters()] == params
    assert keys <= set(net.state_dict())


@pytest.mark.parametrize("kernels", ["1", "0"])
def test_forward_is_conv_of_quantized_operands_and_backward_uses_quantized_error(kernels, monkeypatch):
    """Second implementation: F.conv2d on Qa(x), Qw(W); dgrad / wgrad from torch.nn.grad with SR-quantized error.

    With the C kernels (cptsim.numerics.ckernels) and without them (CPTSIM_CKERNELS=0, the eager quantizers): the kernels'
    stochastic rounding draws other random bytes than fake_quant_stochastic, so the expected error is the one
    quant.quantize_error (what the layer calls) gives under the same seed; that it equals the eager formula in
    distribution is tests/test_ckernels.py's business, and with kernels off it is fake_quant_stochastic itself."""
    monkeypatch.setenv("CPTSIM_CKERNELS", kernels)
    torch.manual_seed(1)
    conv = nn.Conv2d(3, 4, 3, padding=1, stride=2)
    w0, b0 = conv.weight.detach().clone(), conv.bias.detach().clone()
    state = quantize_model(nn.Sequential(conv), fp_layers=[])
    q, g = 4, 5
    state.set(q, g)
    x = torch.randn(2, 3, 9, 9, requires_grad=True)
    grad_out = torch.randn(2, 4, 5, 5)

    xq = fake_quant_per_tensor(x.detach(), x.detach().min(), x.detach().max(), q)
    wq = fake_quant_per_channel(w0, q)
    expect = F.conv2d(xq, wq, b0, stride=2, padding=1)

    torch.manual_seed(7)
    y = conv(x)
    assert torch.allclose(y, expect, atol=1e-6)
    y.backward(grad_out)

    torch.manual_seed(7)  # the same random draws as the layer's backward
    err = fake_quant_stochastic(grad_out, g) if kernels == "0" else quantize_error(grad_out, g)
    assert torch.unique(err).numel() <= 2**g
    dgrad = torch.nn.grad.conv2d_input(x.shape, wq, err, stride=2, padding=1)  # STE: through Qa unchanged
    wgrad = torch.nn.grad.conv2d_weight(xq, w0.shape, err, stride=2, padding=1)  # STE: through Qw unchanged
    assert torch.allclose(x.grad, dgrad, atol=1e-5)
    assert torch.allclose(conv.weight.grad, wgrad, atol=1e-4)
    assert torch.allclose(conv.bias.grad, err.sum((0, 2, 3)), atol=1e-5)


def test_linear_on_nd_input():
    torch.manual_seed(0)
    lin = nn.Linear(6, 3)
    ref = copy.deepcopy(lin)
    quantize_model(nn.Sequential(lin), fp_layers=[]).set(8, 32)
    assert isinstance(lin, QLinear)
    x = torch.randn(2, 5, 6)
    xq = fake_quant_per_tensor(x, x.min(), x.max(), 8)
    assert torch.allclose(lin(x), F.linear(xq, fake_quant_per_channel(ref.weight.detach(), 8), ref.bias), atol=1e-6)


@pytest.mark.parametrize("kernels", ["1", "0"])
def test_eval_uses_the_running_activation_range(kernels, monkeypatch):
    """With the C kernels the range, its running average and the quantization are one call (the buffers written
    from C); without them, torch ops. Both against the running average written out here."""
    monkeypatch.setenv("CPTSIM_CKERNELS", kernels)
    conv = nn.Conv2d(1, 1, 1, bias=False)
    state = quantize_model(nn.Sequential(conv), fp_layers=[])
    state.set(4, 32)
    assert isinstance(conv, QConv2d)
    batches = [torch.rand(1, 1, 4, 4) * s for s in (1.0, 3.0, 2.0)]
    lo = hi = None
    for b in batches:
        conv(b)
        blo, bhi = b.min().item(), b.max().item()
        lo = blo if lo is None else ACT_MOMENTUM * lo + (1 - ACT_MOMENTUM) * blo
        hi = bhi if hi is None else ACT_MOMENTUM * hi + (1 - ACT_MOMENTUM) * bhi
    assert conv.act_lo.item() == pytest.approx(lo, rel=1e-5)
    assert conv.act_hi.item() == pytest.approx(hi, rel=1e-5)
    conv.eval()
    x = torch.rand(1, 1, 4, 4) * 10  # far outside the running range: eval clamps it there
    with torch.no_grad():
        y = conv(x)
    w = fake_quant_per_channel(conv.weight.detach(), 4)
    expect = F.conv2d(fake_quant_per_tensor(x, torch.tensor(lo), torch.tensor(hi), 4), w)
    assert torch.allclose(y, expect, atol=1e-5)
    assert int(conv.act_count) == 3  # eval did not update the running range


def test_precision_state_rejects_bad_bits():
    s = PrecisionState()
    with pytest.raises(InputError):
        s.set(0, 8)
    with pytest.raises(InputError):
        s.set(8, 20)


def test_inplace_activation_after_a_quantized_layer_trains():
    """MLPs put ReLU(inplace=True) directly on a Linear's output; the error quantizer must allow it."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 2))
    quantize_model(net).set(4, 6)
    net(torch.randn(3, 4)).sum().backward()
    assert torch.isfinite(net[0].weight.grad).all() and net[0].weight.grad.abs().sum() > 0


@pytest.mark.parametrize("kernels", ["1", "0"])
def test_the_quantized_input_is_recomputed_for_backward_not_kept(kernels, monkeypatch):
    """The conv saves x and its range, not Qa(x) (an activation-sized tensor per layer); what backward gets back is
    Qa(x) bit for bit, and an in-place change of x before backward is an error, not a silently wrong gradient.

    With the C kernels the layer is one autograd node (layers._QuantLayerCPU) that saves x itself and the
    quantized weight; without them the conv's own node, whose saved input the saved-tensor hooks turn into x."""
    monkeypatch.setenv("CPTSIM_CKERNELS", kernels)
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(3, 4, 3))
    quantize_model(conv, fp_layers=[]).set(5, 8)
    x = torch.randn(2, 3, 8, 8)
    y = conv(x)
    lo, hi = torch.aminmax(x)
    if kernels == "1" and ckernels.library() is not None:
        assert type(y.grad_fn).__name__ == "_QuantLayerCPUBackward"
        (saved,) = y.grad_fn.saved_tensors
        assert saved.data_ptr() == x.data_ptr()  # x itself, no copy and no Qa(x)
        assert y.grad_fn.wq.shape == conv[0].weight.shape
        xq = quantize_activation(saved, *y.grad_fn.range, 5)  # what backward computes
    else:
        xq = y.grad_fn._saved_input
    assert torch.equal(xq, fake_quant_per_tensor(x, lo, hi, 5))
    y.sum().backward()
    y = conv(x)
    x.mul_(2)
    with pytest.raises(RuntimeError, match="modified (in place|by an inplace operation)"):
        y.sum().backward()

"""The integer-codes path of quantized Conv2d / Linear layers (cptsim.numerics.exact_gemm "Integer codes on TF32",
layers._IntCodesLayer; issue 28 item 1, the CUDA part).

On a CPU it runs with CPTSIM_EXACT_GEMM=codes: FP32 GEMMs of integer-valued floats, the arithmetic a CUDA TF32 GEMM
does on them (integers below 2**11 are exact in TF32). Each op is checked in float64 against the integer reference
-- the fake-quantized operands multiplied exactly -- and against today's fake-quant path. The error is made exactly
on the gradient grid (a power-of-two scale, codes -128..127), so stochastic rounding returns it unchanged and the
reference knows the quantized error without reading the quantizer's draws.
"""

from __future__ import annotations

import copy
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cptsim.numerics import exact_gemm
from cptsim.numerics.layers import quantize_model
from cptsim.numerics.quant import choose_qparams, quantize_activation, quantize_weight

U = 2.0 ** -24  # float32 unit roundoff
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _grid_error(shape, seed=1, device="cpu"):
    """An error tensor already on the 8-bit SR grid: integers -128..127 (both ends present) times 2**-6."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randint(-128, 128, shape, generator=g).float()
    e.view(-1)[0], e.view(-1)[1] = -128.0, 127.0
    return (e * 2.0 ** -6).to(device)


def _layer(kind, device="cpu"):
    torch.manual_seed(0)
    m = (nn.Sequential(nn.Conv2d(6, 12, 3, stride=2, padding=1), nn.Flatten(), nn.Linear(12 * 16, 4))
         if kind == "conv" else nn.Sequential(nn.Linear(40, 24), nn.Linear(24, 4)))
    quantize_model(m).set(8, 8)
    return m.to(device)[0]


def _x(kind, device="cpu"):
    torch.manual_seed(2)
    return (torch.randn(3, 6, 9, 9) if kind == "conv" else torch.randn(5, 7, 40)).to(device) * 2 + 0.5


def _run(layer, x, env, monkeypatch):
    monkeypatch.setenv("CPTSIM_EXACT_GEMM", env)
    layer = copy.deepcopy(layer)
    x = x.clone().requires_grad_(True)
    y = layer(x)
    y.backward(_grid_error(y.shape, device=x.device))
    return y.detach(), x.grad, layer.weight.grad, layer.bias.grad, getattr(layer, "gemm_path", None)


def _reference(layer, x, gy):
    """float64: Qa(x) and Qw(W) as the quantizers make them, the op and its two backward GEMMs exactly; with the
    sums of |products| for FP32 accumulation's error bound."""
    lo, hi = torch.aminmax(x)
    xq = quantize_activation(x, lo, hi, 8).double().requires_grad_(True)
    wq = quantize_weight(layer.weight.detach(), 8).double().requires_grad_(True)
    b = layer.bias.detach().double()

    def op(a, w, bias=None):
        if isinstance(layer, nn.Conv2d):
            return F.conv2d(a, w, bias, layer.stride, layer.padding)
        return F.linear(a, w, bias)

    y = op(xq, wq, b)
    gx, gw = torch.autograd.grad(y, (xq, wq), gy.double())
    # sums of |products| per output and per weight: the float32 Qa(x), Qw(W) are (k - zp) s rounded once, so the
    # integer path (which multiplies by s after the sum) differs from this reference by an ulp per term at most
    xa, wa = xq.detach().abs().requires_grad_(True), wq.detach().abs().requires_grad_(True)
    a = op(xa, wa)
    gwa = torch.autograd.grad(a, wa, gy.double().abs())[0]
    return y.detach(), gx, gw, (a.detach(), gwa)


@pytest.mark.parametrize("kind", ["conv", "linear"])
def test_forward_and_wgrad_on_the_integers_are_exact_up_to_one_rounding(kind, monkeypatch):
    monkeypatch.setenv("CPTSIM_CKERNELS", "0")  # the general path's quantizers on both sides
    layer, x = _layer(kind), _x(kind)
    y, gx, gw, gb, path = _run(layer, x, "codes", monkeypatch)
    assert path == {"forward": exact_gemm.TF32_CODES, "dgrad": exact_gemm.FAKE, "wgrad": exact_gemm.TF32_CODES}
    yf, gxf, gwf, gbf, _ = _run(layer, x, "0", monkeypatch)
    gy = _grid_error(y.shape)
    ref_y, ref_gx, ref_gw, (absprod, absgw) = _reference(layer, x, gy)
    K = layer.weight[0].numel()
    # the codes path: integer sums exact (|sum| < 2**24 here), then the scale product and the bias: a few ulp
    assert ((y.double() - ref_y).abs() <= 4 * U * (absprod + ref_y.abs())).all()
    # today's path: within FP32 accumulation's bound, and measurably further from the reference
    assert ((yf.double() - ref_y).abs() <= 2 * K * U * absprod + 4 * U * ref_y.abs()).all()
    assert (y.double() - ref_y).abs().max() <= (yf.double() - ref_y).abs().max()
    # wgrad on the integers: exact sums, one rounding of the scale product
    assert ((gw.double() - ref_gw).abs() <= 4 * U * (absgw + ref_gw.abs())).all()
    # dgrad is today's GEMM (the same call on the same values): bit for bit the fake path's
    assert torch.equal(gx, gxf) and torch.equal(gb, gbf)
    k_dgrad = gy.shape[1] * 9 if kind == "conv" else gy.shape[-1]  # dgrad's reduction: output channels (x taps)
    assert ((gx.double() - ref_gx).abs() <= 2 * k_dgrad * U * ref_gx.abs().max()).all()


def test_a_model_trains_the_same_on_either_path(monkeypatch):
    """Whole steps of a conv net: the codes path's loss and gradients match the fake path's up to FP32 rounding
    (one flipped rounding of a quantizer moves a value by a step: compared in distribution, not bit for bit)."""
    monkeypatch.setenv("CPTSIM_CKERNELS", "0")
    torch.manual_seed(0)
    base = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))
    quantize_model(base).set(8, 8)
    x, t = torch.randn(16, 3, 8, 8), torch.randint(0, 4, (16,))
    losses = {}
    for env in ("0", "codes"):
        monkeypatch.setenv("CPTSIM_EXACT_GEMM", env)
        m = copy.deepcopy(base)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        torch.manual_seed(3)
        losses[env] = []
        for _ in range(5):
            loss = F.cross_entropy(m(x), t)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[env].append(loss.item())
    assert losses["codes"][-1] < losses["codes"][0]
    assert max(abs(a - b) for a, b in zip(losses["0"], losses["codes"])) < 1e-2 * losses["0"][0]


def test_what_falls_back_and_what_config_records(monkeypatch):
    monkeypatch.setenv("CPTSIM_CKERNELS", "0")
    monkeypatch.setenv("CPTSIM_EXACT_GEMM", "codes")
    lin = _layer("linear")
    x = _x("linear")
    lin.precision.set(12, 8)  # above TF32's exact integers: today's path
    lin(x)
    assert "gemm_path" not in lin.__dict__
    lin.precision.set(8, 16)  # forward on the integers, wgrad not (16-bit errors)
    lin(x.requires_grad_(True)).sum().backward()
    assert lin.gemm_path == {"forward": exact_gemm.TF32_CODES, "dgrad": exact_gemm.FAKE, "wgrad": exact_gemm.FAKE}
    lin.__dict__.pop("gemm_path", None)
    lin.precision.set(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # 16-bit operands would round the sums: today's path
        lin(x)
    assert "gemm_path" not in lin.__dict__
    conv = nn.Sequential(nn.Conv2d(3, 4, 3, padding="same"), nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect"),
                         nn.Conv2d(4, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 25, 2))
    quantize_model(conv).set(8, 8)
    conv(torch.randn(2, 3, 5, 5))
    assert [m._codes_capable for m in conv[:3]] == [False, False, True]
    paths = exact_gemm.gemm_paths(conv, "cpu")
    assert paths["exact_gemm"] == exact_gemm.TF32_CODES
    assert paths["layers"]["2"] == {"forward": exact_gemm.TF32_CODES, "dgrad": exact_gemm.FAKE,
                                    "wgrad": exact_gemm.TF32_CODES}
    assert paths["layers"]["0"]["forward"] == exact_gemm.FAKE
    monkeypatch.setenv("CPTSIM_EXACT_GEMM", "1")  # on a CPU, =1 is the int8 Linear path, not this one
    assert not exact_gemm.codes_on("cpu") and exact_gemm.gemm_paths(conv, "cpu")["exact_gemm"] != exact_gemm.TF32_CODES


def test_tf32_flags_are_restored():
    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    with exact_gemm.tf32():
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == before


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("kind", ["conv", "linear"])
def test_on_cuda_the_codes_path_is_exact_where_tf32_fake_quant_is_not(kind, monkeypatch):
    """What the path is for: under PyTorch's default TF32 convolutions today's quantized conv rounds its operands;
    the codes path stays within a few ulp of the float64 reference (the H100 measurement of issue 28)."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    layer, x = _layer(kind, "cuda"), _x(kind, "cuda")
    layer.weight.data.normal_()  # a weight range wide enough that TF32 rounding of (k - zp) * s shows
    monkeypatch.setenv("CPTSIM_EXACT_GEMM", "1")
    y, _, gw, _, path = _run(layer, x, "1", monkeypatch)
    assert path["forward"] == exact_gemm.TF32_CODES
    yf = _run(layer, x, "0", monkeypatch)[0]
    # The reference's Qa(x) and Qw(W) are the CUDA quantizers' own outputs: the GPU may round an exact tie the other
    # way than the CPU does, and what this test checks is the GEMMs on the quantized operands, not the quantizers.
    qa, qw = quantize_activation, quantize_weight
    here = sys.modules[__name__]
    monkeypatch.setattr(here, "quantize_activation", lambda t, lo, hi, b: qa(t.cuda(), lo.cuda(), hi.cuda(), b).cpu())
    monkeypatch.setattr(here, "quantize_weight", lambda w, b: qw(w.cuda(), b).cpu())
    ref_y, _, ref_gw, (absprod, absgw) = _reference(copy.deepcopy(layer).cpu(), x.cpu(), _grid_error(y.shape))
    K = layer.weight[0].numel()
    err = (y.cpu().double() - ref_y).abs()
    assert (err <= 2 * K * U * absprod + 4 * U * ref_y.abs()).all()
    assert err.max() < (yf.cpu().double() - ref_y).abs().max()
    assert ((gw.cpu().double() - ref_gw).abs() <= 4 * U * (absgw + ref_gw.abs())).all()

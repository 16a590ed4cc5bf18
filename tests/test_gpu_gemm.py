"""The tensor-core routes of quantized Conv2d / Linear GEMMs (cptsim.numerics.gpu_gemm, layers._TensorCoreLayer),
checked on a CPU: torch._int_mm runs int8 GEMMs here too (without CUDA's shape rule, which ``pad=True`` applies), the
implicit-GEMM Triton kernel runs under Triton's interpreter, and the FP16 routes run as their FP32 emulation (FP16
operands, FP32 sums, a convolution's output rounded to FP16).

Truth is independent of the routes: integer sums against float64 GEMMs / convolutions of the same integers (exact in
float64), whole layers against float64 GEMMs of the fake-quantized operands, within the bound each route states. The
error is made on the 8-bit stochastic-rounding grid (a power-of-two scale, integers -128..127), so the quantizer
returns it unchanged and the reference knows the quantized error without reading the random draws.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cptsim.numerics import exact_gemm, gemm_choice, gpu_gemm as G
from cptsim.numerics.layers import quantize_model
from cptsim.numerics.quant import quantize_activation, quantize_weight

U = 2.0 ** -24  # float32 unit roundoff
H = 2.0 ** -11  # FP16 unit roundoff
needs_int_mm = pytest.mark.skipif(not hasattr(torch, "_int_mm"), reason="needs torch._int_mm")
interpreter = pytest.mark.skipif(not G.triton_available(), reason="needs Triton (its interpreter runs CPU tensors)")


@pytest.fixture
def kernels_on_cpu(monkeypatch):
    """Layers on a CPU take the Triton kernels (interpreted) rather than the im2col route."""
    if G.triton_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    return G.triton_available()


def test_route_rule_by_hand():
    r = G.route
    # <= 8 bits: int8 for a Linear's / 1x1 conv's forward and wgrad, FP16 dgrad
    for bits in (2, 8):
        assert r("linear", bits, 8, 512) == {"forward": G.INT8, "dgrad": G.FP16, "wgrad": G.INT8}
        assert r("conv1x1", bits, bits, 256) == {"forward": G.INT8, "dgrad": G.FP16, "wgrad": G.INT8}
        # a k x k conv: the implicit-GEMM kernel where it runs, else TF32 on the integers (im2col on a CPU)
        assert r("conv", bits, 8, 576) == {"forward": G.INT8_IMPLICIT, "dgrad": G.FP16, "wgrad": G.INT8_IMPLICIT}
        assert r("conv", bits, 8, 576, implicit=False) == {"forward": G.TF32, "dgrad": G.FP16, "wgrad": G.TF32}
        assert r("conv", bits, 8, 576, implicit_wgrad=False)["wgrad"] == G.TF32  # each kernel measured on its own
        assert r("conv", bits, 8, 576, implicit=False, device="cpu") == \
            {"forward": G.INT8_IM2COL, "dgrad": G.FP16, "wgrad": G.INT8_IM2COL}
        assert r("grouped", bits, 8, 9)["forward"] == G.TF32
    # a forward K beyond one int32 accumulator: the kernel is not exact there, _int_mm splits K
    assert r("conv", 8, 8, G.MAX_K + 1) == {"forward": G.TF32, "dgrad": G.FP16, "wgrad": G.INT8_IMPLICIT}
    assert r("linear", 8, 8, G.MAX_K + 1)["forward"] == G.INT8
    # wgrad takes the wider of the two widths
    assert r("linear", 8, 9, 64)["wgrad"] == G.FP16_ACC32 and r("linear", 9, 8, 64)["wgrad"] == G.FP16_ACC32
    assert r("linear", 4, 16, 64)["wgrad"] == G.FP16
    # 9 bits: integers exact in FP16 (Linear, 1x1), TF32 for convolutions; 16: FP16 of the scaled integers
    assert r("linear", 9, 9, 64) == {"forward": G.FP16_ACC32, "dgrad": G.FP16, "wgrad": G.FP16_ACC32}
    assert r("conv", 9, 9, 64) == {"forward": G.TF32, "dgrad": G.FP16, "wgrad": G.TF32}
    assert r("linear", 16, 16, 64) == {"forward": G.FP16, "dgrad": G.FP16, "wgrad": G.FP16}
    # a convolution's FP16 output holds |sum| <= K up to 65504; its wgrad (a sum over batch x pixels) stays FP32
    assert r("conv", 16, 16, 64, k_dgrad=576) == {"forward": G.FP16, "dgrad": G.FP16, "wgrad": G.TF32}
    assert r("conv", 16, 16, 70000, k_dgrad=70000) == {"forward": G.TF32, "dgrad": G.FAKE, "wgrad": G.TF32}
    assert r("linear", 16, 16, 70000)["forward"] == G.FP16  # a Linear's output is FP32
    # 32 bits, gradient bits 32, autocast: today's path for what has no integers
    assert set(r("linear", 32, 8, 64).values()) == {G.FAKE}
    assert r("linear", 8, 32, 64) == {"forward": G.INT8, "dgrad": G.FAKE, "wgrad": G.FAKE}
    assert set(r("conv", 8, 8, 64, autocast=True).values()) == {G.FAKE}
    with pytest.raises(ValueError):
        r("lstm", 8, 8, 64)
    assert [G.layer_kind(None), G.layer_kind((1, 1)), G.layer_kind((1, 1), (1, 1)), G.layer_kind((3, 3), groups=4)] \
        == ["linear", "conv1x1", "conv", "grouped"]


def test_exactness_bounds_by_hand():
    assert G.exact(G.INT8, 8, 8, 10 ** 7) is True  # int32 chunks summed in int64
    assert G.exact(G.INT8_IMPLICIT, 8, 8, G.MAX_K) and not G.exact(G.INT8_IMPLICIT, 8, 8, G.MAX_K + 1)
    # FP32 sums of integers: K (2^a - 1)(2^b - 1) < 2^24 -- 8 bits: 258 terms (258 * 65025 = 16776450 < 16777216)
    assert G.exact(G.FP16_ACC32, 8, 8, 258) and not G.exact(G.FP16_ACC32, 8, 8, 259)
    assert G.exact(G.TF32, 11, 11, 4) and not G.exact(G.TF32, 11, 11, 5)  # 4 * 2047^2 < 2^24 < 5 * 2047^2
    assert G.exact(G.TF32, 8, 8, None) == 258  # unknown K (a wgrad's tokens): the largest exact one
    assert not G.exact(G.TF32, 12, 12, 1) and not G.exact(G.FP16, 8, 8, 1) and not G.exact(G.FAKE, 2, 2, 1)
    # the int32 bracket: every term of sum (a + oa)(b + ob) within 65536 K < 2^31 at MAX_K
    assert 4 * 128 * 128 * G.MAX_K < 2 ** 31 and G.exact_sum_bound(G.MAX_K, 8, 8) < 2 ** 31
    assert G.cuda_padding(16, 147, 64) == (1, 5, 0) and G.cuda_padding(401408, 256, 64) == (0, 0, 0)


@needs_int_mm
@pytest.mark.parametrize("bits", [3, 7, 8])
def test_int8_operands_fit_whatever_the_zero_point(bits):
    """v on the grid -zp .. 2^b - 1 - zp, for zero points at both ends and between: v = a + o with a an int8, and
    the value 0's code -o an int8 (what padded positions hold)."""
    top = (1 << bits) - 1
    for zp in (0, 1, top // 2, top - 1, top):
        v = torch.arange(-zp, top - zp + 1, dtype=torch.float32).reshape(1, -1)
        for sub in (v, v[:, 3:-3] if v.shape[1] > 8 else v, v.clamp(min=1) if zp < top else v):
            a, o = G.int8_operand(sub, bits)
            o = 0 if o is None else int(o)
            assert torch.equal(a.double() + o, sub.double().reshape(a.shape))
            assert -128 <= -o <= 127
    w = torch.stack([torch.arange(-zp, top - zp + 1).float() for zp in (0, top // 3, top)])
    a, o = G.int8_operand(w, bits, rows=True)
    assert torch.equal(a.double() + (0 if o is None else o.double().unsqueeze(1)), w.double())


@needs_int_mm
def test_mm_int8_is_exact_with_offsets_cuda_padding_and_split_k(monkeypatch):
    g = torch.Generator().manual_seed(0)
    for (M, K, N) in [(3, 5, 7), (16, 147, 12), (40, 64, 24)]:
        a = torch.randint(-128, 128, (M, K), generator=g, dtype=torch.int8)
        bt = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
        oa = torch.tensor(int(torch.randint(-127, 129, (), generator=g)), dtype=torch.int32)
        ob = torch.randint(0, 256, (N,), generator=g, dtype=torch.int32) - 128
        ref = (a.double() + oa.double()) @ (bt.double() + ob.double().unsqueeze(1)).t()
        for pad in (False, True):  # pad: CUDA's shape rule (M > 16, K and N multiples of 8) applied here
            got = G.mm_int8(a, bt, oa, ob, pad=pad)
            assert got.dtype == torch.int32 and torch.equal(got.double(), ref)
        assert torch.equal(G.mm_int8(a, bt, None, ob).double(), a.double() @ (bt.double() + ob.double()[:, None]).t())
        same = (a.double() + oa.double()) @ (bt.double() + oa.double()).t()
        assert torch.equal(G.mm_int8(a, bt, oa, oa).double(), same)
        # K beyond one int32 accumulator: chunks summed in int64 (a small MAX_K stands in for 32767)
        monkeypatch.setattr(G, "MAX_K", 16)
        got = G.mm_int8(a, bt, oa, ob, pad=True)
        assert got.dtype == (torch.int64 if K > 16 else torch.int32) and torch.equal(got.double(), ref)
        monkeypatch.undo()


def _conv_case(bits, seed, c=8, o=16, k=3):
    g = torch.Generator().manual_seed(seed)
    top = (1 << bits) - 1
    zx = int(torch.randint(0, top + 1, (), generator=g))
    xv = (torch.randint(0, top + 1, (2, c, 6, 6), generator=g) - zx).float()
    zw = torch.randint(0, top + 1, (o, 1, 1, 1), generator=g)
    wv = (torch.randint(0, top + 1, (o, c, k, k), generator=g) - zw).float()
    return xv, wv


GEOMETRIES = [((1, 1), (1, 1), (1, 1)), ((2, 2), (1, 1), (1, 1)), ((1, 2), (2, 0), (2, 1)), ((2, 1), (0, 0), (1, 1))]


@interpreter
@needs_int_mm
@pytest.mark.parametrize("bits", [4, 8])
def test_implicit_gemm_kernel_is_bit_exact(bits):
    """The Triton kernel's int32 sums equal the float64 convolution of the same integers; its float32 output equals
    the im2col route's (the same epilogue on the same sums) bit for bit."""
    for i, (stride, padding, dilation) in enumerate(GEOMETRIES if bits == 8 else GEOMETRIES[1:3]):
        xv, wv = _conv_case(bits, i)
        a, oa = G.int8_operand(xv, bits)
        b, ob = G.int8_operand(wv.permute(0, 2, 3, 1).reshape(wv.shape[0], -1), bits, rows=True)
        ref = F.conv2d(xv.double(), wv.double(), None, stride, padding, dilation)
        n, o, ho, wo = ref.shape
        raw = G.conv_int8_implicit(a.permute(0, 2, 3, 1).contiguous(), b.contiguous(), oa, ob, torch.ones(o), None,
                                   (3, 3), stride, padding, dilation, raw=True)
        assert raw.dtype == torch.int32 and torch.equal(raw.view(n, ho, wo, o).permute(0, 3, 1, 2).double(), ref)
        sx, sw, bias = torch.tensor(0.037), torch.rand(o) * 0.01 + 1e-3, torch.randn(o)
        y = G.forward("conv", G.INT8_IMPLICIT, xv, sx, wv, sw, bias, bits, (stride, padding, dilation, 1))[0]
        y2 = G.forward("conv", G.INT8_IM2COL, xv, sx, wv, sw, bias, bits, (stride, padding, dilation, 1))[0]
        assert torch.equal(y, y2)
        assert torch.equal(y, (ref.float() * (sx * sw).view(1, -1, 1, 1)).add_(bias.view(1, -1, 1, 1)))


@interpreter
@needs_int_mm
@pytest.mark.parametrize("bits", [4, 8])
def test_implicit_gemm_wgrad_kernel_is_bit_exact(bits, monkeypatch):
    """The wgrad kernel's int64 sums (int32 partial sums over chunks of pixels, a few here) equal the float64 weight
    gradient of the same integers; the layer-level function equals the im2col route bit for bit."""
    monkeypatch.setattr(G, "WGRAD_CHUNK", 32)
    for i, (stride, padding, dilation) in enumerate(GEOMETRIES if bits == 8 else GEOMETRIES[::3]):
        xv, wv = _conv_case(bits, i)
        ho, wo = G.out_size(6, 6, (3, 3), stride, padding, dilation)
        ev = _conv_case(bits, 10 + i, c=16)[0][..., :ho, :wo]
        ae, oe = G.int8_operand(G.nhwc_rows(ev), bits)
        a, ox = G.int8_operand(xv, bits)
        acc = G.conv_wgrad_int8_implicit(ae.contiguous(), oe, a.permute(0, 2, 3, 1).contiguous(), ox, (3, 3),
                                         stride, padding, dilation)
        ref = torch.nn.grad.conv2d_weight(xv.double(), (16, 8, 3, 3), ev.double(), stride, padding, dilation)
        assert acc.dtype == torch.int64 and torch.equal(acc.view(16, 3, 3, 8).permute(0, 3, 1, 2).double(), ref)
        s = torch.tensor(0.021)
        geom = (stride, padding, dilation, 1)
        gw = G.wgrad("conv", G.INT8_IMPLICIT, ev, s, bits, s, bits, (16, 8, 3, 3), geom, xv=xv)
        assert torch.equal(gw, G.wgrad("conv", G.INT8_IM2COL, ev, s, bits, s, bits, (16, 8, 3, 3), geom, xv=xv))
        assert torch.equal(gw, ref.float() * (s * s))


def _grid_error(shape, seed=1):
    """An error already on the 8-bit SR grid: integers -128..127 (both ends present) times 2**-6."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randint(-128, 128, shape, generator=g).float()
    e.view(-1)[0], e.view(-1)[1] = -128.0, 127.0
    return e * 2.0 ** -6


def _model(kind):
    torch.manual_seed(0)
    first = {"linear": nn.Linear(40, 24), "conv1x1": nn.Conv2d(8, 12, 1, stride=2),
             "conv": nn.Conv2d(8, 12, 3, stride=1, padding=1)}[kind]
    head = nn.Linear(24, 4) if kind == "linear" else nn.Sequential(nn.Flatten(), nn.LazyLinear(4))
    m = nn.Sequential(first, head)
    torch.manual_seed(2)
    x = (torch.randn(5, 7, 40) if kind == "linear" else torch.randn(2, 8, 6, 6)) * 2 + 0.5
    m(x)  # materialise the lazy head
    quantize_model(m)
    return m, x


def _run(m, x, bits, env, monkeypatch):
    monkeypatch.setenv("CPTSIM_EXACT_GEMM", env)
    m = copy.deepcopy(m)
    m[0].precision.set(bits, 8)
    layer, x = m[0], x.clone().requires_grad_(True)
    y = layer(x)
    y.backward(_grid_error(y.shape))
    return y.detach(), x.grad, layer.weight.grad, layer.bias.grad, layer.__dict__.get("gemm_path")


def _reference(layer, x, gy, bits):
    """float64: Qa(x), Qw(W) as the quantizers make them, the op and its backward GEMMs exactly, and the sums of
    |products| each bound is relative to."""
    lo, hi = torch.aminmax(x)
    xq = quantize_activation(x, lo, hi, bits).double().requires_grad_(True)
    wq = quantize_weight(layer.weight.detach(), bits).double().requires_grad_(True)

    def op(a, w, b=None):
        if isinstance(layer, nn.Conv2d):
            return F.conv2d(a, w, b, layer.stride, layer.padding)
        return F.linear(a, w, b)

    y = op(xq, wq, layer.bias.detach().double())
    gx, gw = torch.autograd.grad(y, (xq, wq), gy.double())
    xa, wa = xq.detach().abs().requires_grad_(True), wq.detach().abs().requires_grad_(True)
    absy = op(xa, wa)
    agx, agw = torch.autograd.grad(absy, (xa, wa), gy.double().abs())
    return y.detach(), gx, gw, absy.detach(), agx, agw


@needs_int_mm
@pytest.mark.parametrize("kind", ["linear", "conv1x1", "conv"])
def test_a_layer_on_the_routes_equals_the_fake_quant_reference(kind, monkeypatch, kernels_on_cpu):
    """Forward and backward through _TensorCoreLayer (CPTSIM_EXACT_GEMM=int8 on a CPU) at 8 bits: forward and wgrad
    within a few float32 roundings of the exact float64 result (integer sums exact), dgrad within the FP16 route's
    bound, the bias gradient as the fake path's; and the fake-quant layer within FP32 accumulation's bound of the
    same reference."""
    monkeypatch.setenv("CPTSIM_CKERNELS", "0")
    m, x = _model(kind)
    y, gx, gw, gb, path = _run(m, x, 8, "int8", monkeypatch)
    want = {"linear": G.INT8, "conv1x1": G.INT8,
            "conv": G.INT8_IMPLICIT if G.implicit_usable("cpu") else G.INT8_IM2COL}[kind]
    assert path == {"forward": want, "dgrad": G.FP16, "wgrad": want}
    yf, gxf, gwf, gbf, pathf = _run(m, x, 8, "0", monkeypatch)
    ref_y, ref_gx, ref_gw, absy, agx, agw = _reference(m[0], x, _grid_error(y.shape), 8)
    # integer sums exact: the int -> float32 conversion, the scale product and its multiply, the bias add
    assert ((y.double() - ref_y).abs() <= 4 * U * (absy + ref_y.abs())).all()
    assert ((gw.double() - ref_gw).abs() <= 4 * U * (agw + ref_gw.abs())).all()
    # dgrad on FP16: the weight operand rounded to 11 bits, FP32 sums, a convolution's output rounded to FP16
    k_dgrad = m[0].weight.shape[0] * m[0].weight[0, 0].numel()
    out16 = H * ref_gx.abs() if kind != "linear" else 0
    assert ((gx.double() - ref_gx).abs() <= (H + k_dgrad * U + 4 * U) * agx + out16 + 1e-30).all()
    assert torch.allclose(gb, gbf, rtol=1e-6, atol=1e-6)
    # the fake-quant path against the same reference: FP32 products and sums
    K = m[0].weight[0].numel()
    assert ((yf.double() - ref_y).abs() <= 2 * K * U * absy + 4 * U * ref_y.abs()).all()
    assert (gxf - gx).abs().max() <= 2 * H * agx.max() and (gwf - gw).abs().max() <= 1e-4 * agw.max()


@needs_int_mm
@pytest.mark.parametrize("bits", [9, 11, 12, 16])
def test_wider_routes_stay_within_their_bounds(bits, monkeypatch):
    """9-11 bits: a Linear on FP16 integers with FP32 sums (products exact); a convolution on TF32 integers. 12-16:
    FP16 of the integers scaled by 2^-b (one rounding each, 2^-11), a convolution's output in FP16."""
    monkeypatch.setenv("CPTSIM_CKERNELS", "0")
    for kind in ("linear", "conv"):
        m, x = _model(kind)
        y, _, gw, _, path = _run(m, x, bits, "int8", monkeypatch)
        ref_y, _, ref_gw, absy, _, agw = _reference(m[0], x, _grid_error(y.shape), bits)
        K = m[0].weight[0].numel()
        if bits <= 11:
            assert path["forward"] == (G.FP16_ACC32 if kind == "linear" else G.TF32)
            bound = (K + 4) * U * absy + 4 * U * ref_y.abs()  # exact products, FP32 sums
        else:
            assert path["forward"] == G.FP16
            bound = (2 * H + (K + 4) * U) * absy + (H if kind == "conv" else 4 * U) * ref_y.abs()
        assert ((y.double() - ref_y).abs() <= bound).all()
        n_tok = x.numel() // x.shape[-1] if kind == "linear" else 36 * 2
        wb = (n_tok + 4) * U if bits <= 11 else (2 * H + (n_tok + 4) * U)  # (a conv's TF32 wgrad: FP32 output)
        assert ((gw.double() - ref_gw).abs() <= wb * agw + 4 * U * ref_gw.abs()).all()


@needs_int_mm
def test_the_model_trains_on_the_routes_and_the_cpu_default_is_untouched(monkeypatch, kernels_on_cpu):
    monkeypatch.delenv("CPTSIM_EXACT_GEMM", raising=False)
    assert not G.enabled("cpu")  # unset on a CPU: never these routes (today's CPU paths, golden outputs)
    m, x = _model("conv")
    m[0].precision.set(8, 8)
    m[0](x)
    assert (m[0].__dict__.get("gemm_path") or {}).get("forward") in (None, G.FAKE)
    monkeypatch.setenv("CPTSIM_EXACT_GEMM", "int8")
    assert G.enabled("cpu") and not exact_gemm.choice()["on"]  # =int8: the routes, not the CPU int8 Linear path
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 1), nn.ReLU(),
                        nn.Flatten(), nn.Linear(8 * 4, 16), nn.ReLU(), nn.Linear(16, 4))
    quantize_model(net).set(8, 8)
    xs, t = torch.randn(4, 3, 4, 4), torch.randint(0, 4, (4,))
    losses = []
    for _ in range(3):
        loss = F.cross_entropy(net(xs), t)
        net.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in net.parameters():
                p -= 0.2 * p.grad
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert net[2].gemm_path["forward"] == G.INT8 and net[5].gemm_path["wgrad"] == G.INT8


def test_config_records_the_routes_per_layer_and_width(monkeypatch, kernels_on_cpu):
    monkeypatch.setenv("CPTSIM_EXACT_GEMM", "int8")
    m, _ = _model("conv")
    paths = exact_gemm.gemm_paths(m, "cpu")
    assert paths["exact_gemm"] == G.INT8 and paths["choice"]["why"] == "CPTSIM_EXACT_GEMM=int8"
    rec = paths["layers"]["0"]
    assert rec["dgrad"] == G.FP16 and rec["wgrad"] == rec["forward"] and rec["exact"]["dgrad"] is False
    assert rec["exact"]["forward"] is True and rec["exact"]["wgrad"] is True
    assert rec["widths"]["9-11"]["forward"] == G.TF32 and rec["widths"]["12-16"]["forward"] == G.FP16
    assert rec["widths"]["9-11"]["exact"]["wgrad"] == (2 ** 24 - 1) // 2047 ** 2  # FP32 sums: the largest exact K
    assert rec["widths"]["12-16"]["exact"] == {"forward": False, "dgrad": False, "wgrad": False}
    assert "1.1" not in paths["layers"]  # the full-precision head
    assert exact_gemm.path_kind(paths) == exact_gemm.TC_ROUTES
    note = exact_gemm.path_change(paths, {"exact_gemm": "off (not a CPU)"})
    assert "CPTSIM_EXACT_GEMM=0" not in note and "int8-tc" in note


def test_the_gpu_default_is_measured_once_and_kept(tmp_path, monkeypatch, kernels_on_cpu):
    """The CUDA decision with stand-in probes and timer: on when the int8 route is CUDA_MIN_SPEEDUP times faster than
    the TF32 GEMM, the implicit conv when it beats TF32; kept per GPU model and torch version."""
    monkeypatch.setenv("CPTSIM_HOME", str(tmp_path))
    gemm_choice.forget()
    calls = []

    def timer_for(times):
        def timer(fn):
            calls.append(fn())
            return times[calls[-1]]
        return timer

    labels = ("int8_mm", "tf32_mm", "implicit_conv", "tf32_conv", "implicit_wgrad", "tf32_wgrad")
    probes = {k: (lambda k=k: k) for k in labels}
    gpu = ("NVIDIA Test GPU", (9, 0))
    fast = dict(zip(labels, (0.10e-3, 0.21e-3, 0.2e-3, 0.13e-3, 0.1e-3, 0.2e-3)))
    got = gemm_choice.cuda_choice("cuda", timer=timer_for(fast), gpu=gpu, probes=probes)
    assert got["on"] and not got["implicit_conv"] and got["implicit_wgrad"] and got["source"].startswith("measured")
    assert got["int8_mm_ms"] == 0.1 and "sm90" in got["capability"] and len(calls) == 6
    assert gemm_choice.cuda_choice("cuda", timer=timer_for(fast), gpu=gpu, probes=probes) is got and len(calls) == 6
    gemm_choice.forget()
    again = gemm_choice.cuda_choice("cuda", timer=timer_for({}), gpu=gpu, probes=probes)  # from the file: no timing
    assert again["on"] and again["source"].startswith("cached") and len(calls) == 6
    # another GPU model: measured on its own; the int8 route not fast enough there (below CUDA_MIN_SPEEDUP)
    slow = dict(zip(labels, (0.19e-3, 0.21e-3, 0.1e-3, 0.13e-3, 0.3e-3, 0.2e-3)))
    other = gemm_choice.cuda_choice("cuda", timer=timer_for(slow), gpu=("Other GPU", (8, 0)), probes=probes)
    assert not other["on"] and other["implicit_conv"] and not other["implicit_wgrad"]
    if G.implicit_usable("cpu"):  # the real probes, shrunk, on a CPU: each runs and returns its GEMM's result
        monkeypatch.setattr(gemm_choice, "CUDA_MM_PROBE", (24, 16, 8))
        monkeypatch.setattr(gemm_choice, "CUDA_CONV_PROBE", (1, 8, 4, 4, 16, 3))
        shapes = {}
        real = gemm_choice.cuda_choice("cpu", make_probes=G.cuda_probes, gpu=("CPU stand-in", (0, 0)),
                                       timer=lambda fn: shapes.setdefault(len(shapes), tuple(fn().shape)) and 1e-3)
        assert sorted(shapes.values()) == [(1, 16, 4, 4), (1, 16, 4, 4), (16, 8, 3, 3), (16, 8, 3, 3), (24, 8),
                                           (24, 8)] and "int8_mm_ms" in real
    broken = gemm_choice.cuda_record({"tf32_mm": 1e-3, "errors": {"int8_mm": "RuntimeError: no"}}, "X", (7, 5))
    assert not broken["on"] and "no" in broken["why"]
    if not torch.cuda.is_available():
        assert not gemm_choice.cuda_choice("cuda")["on"] and not G.enabled("cuda")
    gemm_choice.forget()


@needs_int_mm
def test_the_routes_read_no_tensor_value(monkeypatch):
    """No host read of a tensor's value in a training step or in eval (each would be a host-device synchronisation
    on a GPU, and fails a CUDA graph capture): the routes decide from shapes and bits, the offsets stay tensors."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Reads(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                Reads.n += 1
            return func(*args, **(kwargs or {}))

    monkeypatch.setenv("CPTSIM_EXACT_GEMM", "int8")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 1, stride=2), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4, 16), nn.ReLU(),
                        nn.Linear(16, 4))
    state = quantize_model(net)
    x = torch.randn(20, 3, 4, 4)
    for bits in (8, 10, 16):
        state.set(bits, 8)
        with Reads():
            net(x).sum().backward()
        assert net[0].gemm_path["forward"] != G.FAKE and net[3].gemm_path["wgrad"] != G.FAKE
    net.eval()
    with Reads(), torch.no_grad():
        net(x)
    assert Reads.n == 0


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("kind", ["linear", "conv1x1", "conv"])
def test_on_cuda_each_route_is_within_its_bound(kind, monkeypatch):
    """The same checks on the GPU, with the reference built from the CUDA quantizers' own outputs (a compiled
    quantizer may round a tie the other way from the CPU's): int8 sums exact (forward, and wgrad for Linear / 1x1),
    dgrad within the FP16 bound."""
    monkeypatch.setenv("CPTSIM_EXACT_GEMM", "int8")
    m, x = _model(kind)
    m, x = m.cuda(), x.cuda().requires_grad_(True)
    layer = m[0]
    layer.precision.set(8, 8)
    y = layer(x)
    gy = _grid_error(y.shape).cuda()
    y.backward(gy)
    assert layer.gemm_path["forward"] in G.INT8_ROUTES
    lo, hi = torch.aminmax(x.detach())
    xq = quantize_activation(x.detach(), lo, hi, 8).double().cpu().requires_grad_(True)
    wq = quantize_weight(layer.weight.detach(), 8).double().cpu().requires_grad_(True)
    op = (lambda a, w, b=None: F.conv2d(a, w, b, layer.stride, layer.padding)) if kind != "linear" else F.linear
    ref = op(xq, wq, layer.bias.detach().double().cpu())
    gx_ref, gw_ref = torch.autograd.grad(ref, (xq, wq), gy.double().cpu())
    xa, wa = xq.detach().abs().requires_grad_(True), wq.detach().abs().requires_grad_(True)
    absy = op(xa, wa)
    agx, agw = torch.autograd.grad(absy, (xa, wa), gy.double().cpu().abs())
    # (a compiled epilogue may fuse the scale multiply and the bias add: one rounding fewer, within the same bound)
    assert ((y.detach().cpu().double() - ref).abs() <= 4 * U * (absy + ref.abs())).all()
    gw_bound = 4 * U * (agw + gw_ref.abs()) if kind != "conv" else (36 * 2 + 4) * U * agw + 4 * U * gw_ref.abs()
    assert ((layer.weight.grad.cpu().double() - gw_ref).abs() <= gw_bound).all()
    k_dgrad = layer.weight.shape[0] * layer.weight[0, 0].numel()
    out16 = H * gx_ref.abs() if kind != "linear" else 0
    assert ((x.grad.cpu().double() - gx_ref).abs() <= (H + (k_dgrad + 4) * U) * agx + out16 + 1e-30).all()


@pytest.mark.cuda
@cuda
def test_on_cuda_the_int8_gemms_are_bit_exact():
    """torch._int_mm under CUDA's shape rule (padded here), the implicit-GEMM kernel's int32 sums: float64's."""
    g = torch.Generator().manual_seed(0)
    for (M, K, N) in [(3, 5, 7), (200, 147, 64), (40, 40000, 24)]:
        a = torch.randint(-128, 128, (M, K), generator=g, dtype=torch.int8)
        bt = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
        oa, ob = torch.tensor(100, dtype=torch.int32), torch.randint(-127, 129, (N,), generator=g, dtype=torch.int32)
        ref = (a.double() + 100) @ (bt.double() + ob.double()[:, None]).t()
        assert torch.equal(G.mm_int8(a.cuda(), bt.cuda(), oa.cuda(), ob.cuda()).cpu().double(), ref)
    for i, (stride, padding, dilation) in enumerate(GEOMETRIES):
        xv, wv = _conv_case(8, i, c=64, o=64)
        a, oa = G.int8_operand(xv.cuda(), 8)
        b, ob = G.int8_operand(wv.cuda().permute(0, 2, 3, 1).reshape(64, -1), 8, rows=True)
        raw = G.conv_int8_implicit(a.permute(0, 2, 3, 1).contiguous(), b.contiguous(), oa, ob,
                                   torch.ones(64, device="cuda"), None, (3, 3), stride, padding, dilation, raw=True)
        ref = F.conv2d(xv.double(), wv.double(), None, stride, padding, dilation)
        n, o, ho, wo = ref.shape
        assert torch.equal(raw.view(n, ho, wo, o).permute(0, 3, 1, 2).cpu().double(), ref)
        ev = _conv_case(8, 10 + i, c=64)[0][..., :ho, :wo].contiguous()
        ae, oe = G.int8_operand(G.nhwc_rows(ev.cuda()), 8)
        acc = G.conv_wgrad_int8_implicit(ae.contiguous(), oe, a.permute(0, 2, 3, 1).contiguous(), oa, (3, 3),
                                         stride, padding, dilation)
        ref = torch.nn.grad.conv2d_weight(xv.double(), (64, 64, 3, 3), ev.double(), stride, padding, dilation)
        assert torch.equal(acc.view(64, 3, 3, 64).permute(0, 3, 1, 2).cpu().double(), ref)


def test_layers_name_themselves_for_the_quantizers_fallback_records(monkeypatch):
    """Each quantized layer's quantizer calls -- forward, the error hook and a Function's backward -- run inside a
    fallback scope named after the layer (quantize_model's module names)."""
    from cptsim.numerics import layers

    seen = []

    class Scope:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            seen.append(self.name)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(layers, "_fallback_scope", Scope)
    monkeypatch.setenv("CPTSIM_CKERNELS", "0")  # the general path, as on a GPU (a CPU's own kernels never fall back)
    for env in ("0", "int8"):  # the general path (error hook), the tensor-core routes (their Function's backward)
        monkeypatch.setenv("CPTSIM_EXACT_GEMM", env)
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8)), nn.Linear(8, 2))
        quantize_model(net).set(8, 8)
        seen.clear()
        net(torch.randn(20, 6)).sum().backward()
        # forward, then backward (the error's quantizer; the general path also re-quantizes x there); "3", the
        # full-precision head, runs no quantizer
        assert set(seen) == {"0", "2.0"} and seen.count("0") >= 2 and seen.count("2.0") >= 2

"""The exact integer GEMM path of quantized Linear layers on a CPU (cptsim.numerics.exact_gemm, issue 28 item 1).

Each op is checked in float64 against the integer reference -- the fake-quantized operands, which are integers
times scales, multiplied exactly -- and against today's FP32 fake-quant path: both sit within FP32 rounding of the
reference, the exact path within a few ulp of the result, the fake path within FP32 accumulation's bound.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cptsim.numerics import ckernels, exact_gemm, layers
from cptsim.numerics.layers import QLinear, quantize_model
from cptsim.numerics.quant import choose_qparams, quantize_activation

U = 2.0 ** -24  # float32 unit roundoff

pytestmark = pytest.mark.skipif(not ckernels.status()["in_use"] or not hasattr(torch, "_int_mm"),
                                reason="needs the C quantizer kernels and torch._int_mm")


@pytest.mark.parametrize("per_col", [False, True])
def test_int_gemm_equals_int64_reference(per_col):
    g = torch.Generator().manual_seed(0)
    for M, K, N in [(1, 1, 1), (3, 5, 7), (17, 64, 33), (40, 650, 24)]:
        a = torch.randint(-128, 128, (M, K), generator=g, dtype=torch.int8)
        b = torch.randint(-128, 128, (K, N), generator=g, dtype=torch.int8)
        oa = torch.tensor(int(torch.randint(-127, 129, (), generator=g)), dtype=torch.int32)
        ob = (torch.randint(-127, 129, (N,), generator=g, dtype=torch.int32) if per_col
              else torch.tensor(-127, dtype=torch.int32))
        ref = (a.long() + oa.long()) @ (b.long() + ob.long())
        assert torch.equal(exact_gemm.int_gemm(a, b, oa, ob).long(), ref)
        assert torch.equal(exact_gemm.int_gemm(a, b.t().contiguous().t(), oa, ob).long(), ref)  # column-major b


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_codes_recover_the_integers(bits):
    x = torch.randn(300, 37) * 3 + 1
    lo, hi = torch.aminmax(x)
    q = quantize_activation(x, lo, hi, bits)
    s, zp = exact_gemm.per_tensor_qparams(lo, hi, bits)
    a = exact_gemm.codes(q, s, zp)
    n = a.long() + exact_gemm.offset(zp).long()
    assert n.min() >= -int(zp) and n.max() <= (1 << bits) - 1 - int(zp)
    assert torch.equal(n.double() * s.double(), q.double()) or \
        ((n.double() * s.double() - q.double()).abs() <= U * q.double().abs()).all()
    w = torch.randn(24, 37)
    wq = layers.quantize_weight(w, bits)
    aw, sw, ow, cw = exact_gemm.quantized_weight_codes(wq, w, bits)
    assert torch.equal(cw, aw.sum(0, dtype=torch.int32))
    nw = aw.t().long() + ow.long().unsqueeze(1)
    assert ((nw.double() * sw.double().unsqueeze(1) - wq.double()).abs() <= U * wq.double().abs()).all()


@pytest.mark.parametrize("bits", [2, 5, 8])
def test_weight_codes_in_one_call_equal_the_separate_passes(bits):
    """exact_gemm.weight_codes (one C call: range, Qw(W), codes, sums, tiled transpose) gives bit for bit what
    quantize_weight and quantized_weight_codes give -- also for rows all positive, all negative, constant, a
    single column, and sizes that are not multiples of the transpose's 64 x 64 tiles."""
    g = torch.Generator().manual_seed(bits)
    for shape in [(130, 67), (7, 3), (1, 1), (64, 1), (3, 200)]:
        w = torch.randn(*shape, generator=g) * 3
        if shape[0] >= 3:
            w[0] = torch.rand(shape[1], generator=g)
            w[1] = -torch.rand(shape[1], generator=g)
            w[2] = 0.25
        wq = layers.quantize_weight(w, bits)
        old = (wq, *exact_gemm.quantized_weight_codes(wq, w, bits))
        new = exact_gemm.weight_codes(w, bits)
        assert all(torch.equal(a, b) for a, b in zip(old, new)), shape


@pytest.mark.parametrize("bits", [3, 8])
def test_error_and_its_codes_in_one_pass_equal_quantize_error_then_codes(bits):
    """ckernels.fake_quant_sr_codes (the exact path's backward): under the same seed, the same key and stream as
    quantize_error's C pass, so the quantized error bit for bit, and the codes of its levels as exact_gemm.codes."""
    g = torch.randn(37, 1000) * 0.01
    lo, hi = ckernels.minmax(g)
    torch.manual_seed(5)
    ref = ckernels.fake_quant_sr(g, (1 << bits) - 1)
    torch.manual_seed(5)
    gq, codes = ckernels.fake_quant_sr_codes(g, lo, hi, (1 << bits) - 1)
    assert torch.equal(gq, ref)
    s, zp = exact_gemm.per_tensor_qparams(lo, hi, bits)
    assert torch.equal(codes, exact_gemm.codes(ref, s, zp))


def _pair(fin, fout, bias=True, seed=0):
    torch.manual_seed(seed)
    lin = nn.Linear(fin, fout, bias=bias)
    q = copy.deepcopy(lin)
    quantize_model(q, fp_layers=[]).set(8, 8)
    return q


class _Record:
    """Records the fake-quantized error the layer's backward consumes: the one quantize_error call, or on the exact
    path the one ckernels.fake_quant_sr_codes call (the same error and the codes of its levels, in one pass)."""

    def __init__(self, monkeypatch):
        self.seen = []
        real, real_codes = layers.quantize_error, ckernels.fake_quant_sr_codes

        def rec(g, bits, scratch=None):
            out = real(g, bits, scratch=scratch)
            self.seen.append(out.clone())
            return out

        def rec_codes(*args, **kwargs):
            out = real_codes(*args, **kwargs)
            self.seen.append(out[0].clone())
            return out

        monkeypatch.setattr(layers, "quantize_error", rec)
        monkeypatch.setattr(ckernels, "fake_quant_sr_codes", rec_codes)


def _run(layer, x, G, env, monkeypatch, bits=8, grad_bits=8):
    monkeypatch.setenv("CPTSIM_EXACT_GEMM", env)
    layer = copy.deepcopy(layer)
    layer.precision.set(bits, grad_bits)
    layer.train()
    rec = _Record(monkeypatch)
    xx = x.clone().requires_grad_(True)
    torch.manual_seed(123)
    y = layer(xx)
    y.backward(G)
    monkeypatch.undo()
    return layer, y.detach(), xx.grad, layer.weight.grad, layer.bias.grad, rec.seen, torch.get_rng_state()


@pytest.mark.parametrize("bits,shape", [(8, (6, 50, 40)), (4, (300, 96)), (8, (3, 133, 650))])
def test_linear_forward_and_grads_equal_integer_reference(bits, shape, monkeypatch):
    fin, fout = shape[-1], 48
    q = _pair(fin, fout)
    x = torch.randn(*shape) * 2 + 0.5
    G = torch.randn(*shape[:-1], fout)
    le, ye, gxe, gwe, gbe, seen_e, rng_e = _run(q, x, G, "1", monkeypatch, bits, bits)
    lf, yf, gxf, gwf, gbf, seen_f, rng_f = _run(q, x, G, "0", monkeypatch, bits, bits)
    assert le.gemm_path == {"forward": "int8-exact", "dgrad": "fp32-fake-quant", "wgrad": "int8-exact"}
    assert lf.gemm_path["forward"] == "fp32-fake-quant"
    assert torch.equal(rng_e, rng_f)  # the same random stream consumed
    assert len(seen_e) == len(seen_f) == 1 and torch.equal(seen_e[0], seen_f[0])  # the same quantized error

    # the integer reference in float64: the operands' integers multiplied exactly, times the scales. The fake path
    # multiplies the float32 values fl(n * s) instead, whose rounding (<= u |n s| each) adds to its accumulation's
    lo, hi = torch.aminmax(x)
    sx, _ = exact_gemm.per_tensor_qparams(lo, hi, bits)
    xq = quantize_activation(x, lo, hi, bits).double().reshape(-1, fin)
    nx = torch.round(xq / sx.double())
    lo_w, hi_w = torch.aminmax(q.weight.detach(), dim=1)
    sw = choose_qparams(lo_w, hi_w, bits)[0].double()
    wq = layers.quantize_weight(q.weight.detach(), bits).double()
    nw = torch.round(wq / sw.unsqueeze(1))
    b = q.bias.detach().double()
    ref = (nx @ nw.t()) * (sx.double() * sw) + b
    mag = xq.abs() @ wq.abs().t() + b.abs()
    ye2, yf2 = ye.double().reshape(-1, fout), yf.double().reshape(-1, fout)
    assert ((ye2 - ref).abs() <= 6 * U * ((ref - b).abs() + b.abs())).all()  # a few ulp of the result
    assert ((yf2 - ref).abs() <= (fin + 4) * U * mag).all()  # FP32 accumulation's bound
    assert ((ye2 - yf2).abs() <= (fin + 10) * U * mag).all()

    gq = seen_e[0].double().reshape(-1, fout)
    sg, _ = exact_gemm.per_tensor_qparams(*torch.aminmax(G), bits)
    ref_w = (torch.round(gq / sg.double()).t() @ nx) * (sg.double() * sx.double())
    assert ((gwe.double() - ref_w).abs() <= 4 * U * ref_w.abs()).all()
    tokens = gq.shape[0]
    assert ((gwf.double() - ref_w).abs() <= (tokens + 4) * U * (gq.abs().t() @ xq.abs())).all()
    assert torch.equal(gxe, gxf)  # dgrad: today's path in both
    assert torch.equal(gbe, gbf)


def test_fallbacks_per_layer(monkeypatch):
    q = _pair(16, 8)
    x, G = torch.randn(300, 16), torch.randn(300, 8)
    le, *_ = _run(q, x[:20], G[:20], "1", monkeypatch)
    assert (le.gemm_path["forward"], le.gemm_path["wgrad"]) == ("int8-exact", "fp32-fake-quant")  # 20 tokens
    for bits, grad_bits, want in [(9, 8, ("fp32-fake-quant", "fp32-fake-quant")),
                                  (8, 32, ("int8-exact", "fp32-fake-quant")),
                                  (8, 12, ("int8-exact", "fp32-fake-quant"))]:
        le, ye, gxe, gwe, *_ = _run(q, x, G, "1", monkeypatch, bits, grad_bits)
        lf, yf, gxf, gwf, *_ = _run(q, x, G, "0", monkeypatch, bits, grad_bits)
        assert (le.gemm_path["forward"], le.gemm_path["wgrad"]) == want
        assert torch.allclose(ye, yf, rtol=1e-5, atol=1e-6) and torch.allclose(gwe, gwf, rtol=1e-5, atol=1e-6)
    le, *_ = _run(q, x, G, "0", monkeypatch)
    assert le.gemm_path["forward"] == "fp32-fake-quant"  # CPTSIM_EXACT_GEMM=0: today's path


def test_lstm_lm_exact_matches_fake(monkeypatch):
    """The LSTM's hidden-to-hidden layer reuses its weight codes over the time steps; its weight gradient sums
    the per-step exact wgrads. Nothing upstream of a code flip differs, so the two paths agree to FP32 rounding."""
    from cptsim.models import create_model

    torch.manual_seed(0)
    m = create_model("lstm-lm:hidden=32,layers=1", num_classes=40, input_shape=(12,))
    quantize_model(m).set(8, 8)
    x, y = torch.randint(0, 40, (4, 12)), torch.randint(0, 40, (4, 12))
    grads = []
    for env in ("1", "0"):
        monkeypatch.setenv("CPTSIM_EXACT_GEMM", env)
        mm = copy.deepcopy(m)
        torch.manual_seed(5)
        F.cross_entropy(mm(x), y).backward()
        grads.append({n: p.grad for n, p in mm.named_parameters()})
        if env == "1":
            assert mm.layers[0].hh.gemm_path["forward"] == "int8-exact"
    for n, g in grads[0].items():
        assert torch.allclose(g, grads[1][n], rtol=1e-3, atol=1e-6 * grads[1][n].abs().max()), n


def test_gemm_paths_for_config(monkeypatch):
    from cptsim.models import create_model

    m = create_model("transformer-lm:layers=1,width=32,heads=2,context=16", num_classes=30, input_shape=(16,))
    quantize_model(m)
    monkeypatch.setenv("CPTSIM_EXACT_GEMM", "0")
    off = exact_gemm.gemm_paths(m, "cpu")
    assert off["exact_gemm"] == "off (CPTSIM_EXACT_GEMM=0)" and off["layers"]["head"]["forward"] == "fp32-fake-quant"
    monkeypatch.delenv("CPTSIM_EXACT_GEMM")
    # unset: this machine's measured decision (cptsim.numerics.gemm_choice; tests/test_gemm_choice.py), either way
    for on in (True, False):
        why = {"on": on, "why": f"measured: {'fast' if on else 'slow'}"}
        monkeypatch.setattr(exact_gemm.gemm_choice, "measured_choice", lambda threads=None, why=why: why)
        paths = exact_gemm.gemm_paths(m, "cpu")
        assert paths["exact_gemm"] == ("on" if on else "off (measured: slow)") and paths["choice"] == why
        assert paths["layers"]["head"]["forward"] == ("int8-exact" if on else "fp32-fake-quant")
    # CUDA: the tensor-core routes only where that GPU measured them faster (gemm_choice.cuda_choice); measured slow:
    monkeypatch.setattr(exact_gemm.gemm_choice, "cuda_choice", lambda *a, **k: {
        "on": False, "implicit_conv": False, "implicit_wgrad": False, "why": "stub: measured slower"})
    assert exact_gemm.gemm_paths(m, "cuda")["layers"]["head"]["forward"] == "fp32-fake-quant"
    monkeypatch.setenv("CPTSIM_EXACT_GEMM", "1")
    paths = exact_gemm.gemm_paths(m, "cpu")
    assert paths["exact_gemm"] == "on" and paths["layers"]["head"]["forward"] == "int8-exact"
    assert paths["layers"]["blocks.0.attn.scores"]["forward"] == "fp32-fake-quant"  # QMatmul: not a Linear
    cuda = exact_gemm.gemm_paths(m, "cuda")  # =1 on CUDA: the integer codes on TF32 (tests/test_int_codes.py)
    assert cuda["layers"]["head"] == {"forward": "tf32-int-codes", "dgrad": "fp32-fake-quant", "wgrad": "tf32-int-codes"}
    assert cuda["layers"]["blocks.0.attn.scores"]["forward"] == "fp32-fake-quant"


def test_per_tensor_qparams_are_the_quantizers():
    g = torch.Generator().manual_seed(1)
    for bits in (1, 3, 5, 8):
        for _ in range(300):
            lo, hi = sorted((torch.randn(2, generator=g) * torch.rand(2, generator=g) * 10).tolist())
            s, zp = exact_gemm.per_tensor_qparams(lo, hi, bits)
            s2, zp2 = choose_qparams(torch.tensor(lo), torch.tensor(hi), bits)
            assert torch.equal(s, s2) and torch.equal(zp, zp2)

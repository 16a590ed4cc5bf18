"""Issue 26 item 4: a Linear's FP8 (fp8e4m3) forward GEMM through torch._scaled_mm where the device has it
(cptsim.numerics.exact_gemm: CUDA sm89+), the FP32 fake-quant path otherwise. This torch runs _scaled_mm on a CPU
too (an emulation), which CPTSIM_SCALED_MM=1 turns on: that is how the path's numerics are checked here. On a GPU the
path is unverified (no GPU in the session that built it)."""

import pytest
import torch

from cptsim.numerics import exact_gemm as E
from cptsim.numerics import formats as F
from cptsim.numerics.layers import QConv2d, QLinear, quantize_model

pytestmark = pytest.mark.skipif(not E._cpu_scaled_mm(), reason="this torch has no CPU torch._scaled_mm")


def _bound(xq, wq):
    """K ulp of sum |q_x| |q_w|: the FP32 accumulation rounding of either path against the exact product (torch's
    CPU emulation of _scaled_mm accumulates in FP32; a GPU's FP8 tensor cores need exact_gemm.fp8_product_bound)."""
    K = xq.shape[-1]
    return (xq.abs().double() @ wq.abs().double().t()) * K * 2.0 ** -24 + 1e-45


@pytest.mark.parametrize("scale", [1.0, 1e-3, 1e4, 1e-20])
def test_scaled_mm_is_the_fake_quant_product_within_fp32_rounding(scale, monkeypatch):
    monkeypatch.setenv("CPTSIM_SCALED_MM", "1")
    g = torch.Generator().manual_seed(1)
    fmt = F.parse_format("fp8e4m3")
    x, w, b = torch.randn(3, 20, 96, generator=g) * scale, torch.randn(40, 96, generator=g), torch.randn(40, generator=g)
    x[0, 0, 0] = 0.0
    xq, wq = F.quantize(x, fmt), F.quantize(w, fmt)
    # the FP8 elements come back exactly from the fake-quantized values
    sx = F.per_tensor_scale(x, fmt)
    assert torch.equal((xq * sx).to(torch.float8_e4m3fn).float(), F.round_element(x * sx, fmt.element))
    y = E.scaled_mm_linear(x, xq, w, wq, None, fmt)
    fake = xq @ wq.t()
    exact = xq.double() @ wq.double().t()
    assert ((y.double() - exact).abs() <= _bound(xq, wq)).all()
    assert ((fake.double() - exact).abs() <= _bound(xq, wq)).all()
    assert ((y - fake).abs() <= 2 * _bound(xq, wq).float()).all()
    yb = E.scaled_mm_linear(x, xq, w, wq, b, fmt)
    assert torch.allclose(yb, y + b, rtol=0, atol=0)


def _hopper_like(chunk: int, wrong: float = 1.0):
    """torch._scaled_mm summing as Hopper's FP8 tensor cores do: exact products, ``chunk`` of them at a time added
    into a running sum that keeps FP8_PARTIAL_SUM_BITS significant bits (truncated); the decode scales after, in
    FP32. ``wrong`` multiplies scale_b: a genuinely wrong result."""
    bits = E.FP8_PARTIAL_SUM_BITS

    def truncate(v):
        m, e = torch.frexp(v)
        return torch.ldexp(torch.trunc(m * 2.0 ** bits) / 2.0 ** bits, e)

    def scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32, **_):
        A, B = a.double(), b.double()  # FP8 values: exact in float64; a chunk's sum is exact enough there
        acc = torch.zeros(A.shape[0], B.shape[1], dtype=torch.float64)
        for c in range(0, A.shape[1], chunk):
            acc = truncate(acc + A[:, c:c + chunk] @ B[c:c + chunk, :])
        return (acc.float() * scale_a.float() * (scale_b.float() * wrong)).to(out_dtype)

    return scaled_mm


@pytest.mark.parametrize("chunk", [4, 32])
def test_the_fp8_bound_holds_for_reduced_precision_accumulation_and_rejects_a_wrong_result(chunk, monkeypatch):
    """The bound a GPU check applies (exact_gemm.fp8_product_bound): a Hopper-like accumulation, which FP32
    accumulation's bound (``_bound``, what the H100 check applied) rejects, is inside it; a wrong scale is not."""
    monkeypatch.setenv("CPTSIM_SCALED_MM", "1")
    g = torch.Generator().manual_seed(4)
    fmt = F.parse_format("fp8e4m3")
    K = 512
    x, w = torch.randn(32, K, generator=g) * 3, torch.randn(48, K, generator=g)
    xq, wq = F.quantize(x, fmt), F.quantize(w, fmt)
    exact = xq.double() @ wq.double().t()
    bound = E.fp8_product_bound(xq.abs().double() @ wq.abs().double().t(), K)
    monkeypatch.setattr(torch, "_scaled_mm", _hopper_like(chunk))
    err = (E.scaled_mm_linear(x, xq, w, wq, None, fmt).double() - exact).abs()
    assert (err <= bound).all()
    assert (err > _bound(xq, wq)).any()
    fake = (xq @ wq.t()).double()  # the fake-quant GEMM: inside FP32's bound, so within both of the fast result
    assert ((E.scaled_mm_linear(x, xq, w, wq, None, fmt).double() - fake).abs() <= bound + _bound(xq, wq)).all()
    for factor in (2.0, 0.5):  # a decode scale off by a power of two (what a slipped exponent does)
        monkeypatch.setattr(torch, "_scaled_mm", _hopper_like(chunk, wrong=factor))
        assert ((E.scaled_mm_linear(x, xq, w, wq, None, fmt).double() - exact).abs() > bound).any()


def test_the_fp8_bound_is_recursive_summation_at_14_bits():
    mag = torch.ones(())
    u = 2.0 ** -13
    assert float(E.fp8_product_bound(mag, 1)) == pytest.approx(3 * 2.0 ** -24)
    assert float(E.fp8_product_bound(mag, 512)) == pytest.approx(511 * u / (1 - 511 * u) + 3 * 2.0 ** -24)
    assert float(E.fp8_product_bound(mag, 8193)) == float("inf")  # past k u = 1 the model bounds nothing


def _fp_linear(seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU(), torch.nn.Linear(48, 16))
    p = quantize_model(m, fp_layers=[], number_format="fp", grad_format="fp8e5m2")
    p.set(8, 8)
    return m


def test_layers_take_the_path_only_when_the_device_has_it(monkeypatch):
    x = torch.randn(10, 32, generator=torch.Generator().manual_seed(2))
    monkeypatch.setenv("CPTSIM_SCALED_MM", "1")
    fast = _fp_linear()
    torch.manual_seed(5)
    yf = fast(x)
    yf.square().sum().backward()
    assert all(m.gemm_path["forward"] == E.SCALED_MM for m in fast.modules() if isinstance(m, QLinear))
    monkeypatch.setenv("CPTSIM_SCALED_MM", "auto")  # a CPU: the fallback, today's fake-quant path
    slow = _fp_linear()
    torch.manual_seed(5)
    ys = slow(x)
    ys.square().sum().backward()
    assert all(m.gemm_path["forward"] == E.FAKE for m in slow.modules() if isinstance(m, QLinear))
    assert torch.allclose(yf, ys, rtol=1e-5, atol=1e-6)
    # the backward GEMMs are the fake-quant path's: same error (same draws), same quantized operands
    for a, b in zip(fast.parameters(), slow.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-6)


def test_other_formats_and_convs_never_take_it(monkeypatch):
    monkeypatch.setenv("CPTSIM_SCALED_MM", "1")
    fmt = F.parse_format("mxfp8")
    x, w = torch.randn(4, 32), torch.randn(8, 32)
    assert E.scaled_mm_linear(x, F.quantize(x, fmt), w, F.quantize(w, fmt), None, fmt) is None
    huge = torch.full((4, 32), 2.0 ** 110)  # a range whose q * s does not re-encode safely: fallback
    f8 = F.parse_format("fp8e4m3")
    assert E.scaled_mm_linear(huge, F.quantize(huge, f8), w, F.quantize(w, f8), None, f8) is None
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))
    quantize_model(m, fp_layers=[], number_format="fp").set(8, 8)
    m(torch.randn(1, 3, 6, 6))
    assert isinstance(m[0], QConv2d) and "gemm_path" not in m[0].__dict__


def test_device_rule(monkeypatch):
    monkeypatch.setenv("CPTSIM_SCALED_MM", "auto")
    assert E.scaled_mm_device("cpu") == (False, "off (a CPU: CPTSIM_SCALED_MM=1 runs torch's CPU emulation)")
    monkeypatch.setenv("CPTSIM_SCALED_MM", "0")
    assert E.scaled_mm_device("cpu")[0] is False and E.scaled_mm_device("cuda")[0] is False
    monkeypatch.setenv("CPTSIM_SCALED_MM", "1")
    assert E.scaled_mm_device("cpu")[0] is True
    if not torch.cuda.is_available():
        monkeypatch.setenv("CPTSIM_SCALED_MM", "auto")
        assert E.scaled_mm_device("cuda") == (False, "off (no CUDA)")
    # the CUDA shape rule: K and N multiples of 16
    assert E.scaled_mm_shape_ok(torch.zeros(2, 32), torch.zeros(8, 32))  # a CPU: any shape


def test_config_records_the_paths():
    from cptsim.numerics.families import format_map

    m = _fp_linear()
    doc = E.format_gemm_paths(m, "cpu", format_map("fp", "fp8e5m2"))
    assert doc["exact_gemm"].startswith("off") and doc["scaled_mm"].startswith("off (a CPU")
    assert set(doc["layers"]) == {"0", "2"} and doc["layers"]["0"]["forward"] == E.FAKE
    assert E.format_gemm_paths(m, "cpu", format_map("mx"))["scaled_mm"].startswith("off (no fp8e4m3")


def test_a_cuda_graph_capture_takes_the_path_without_reading_the_range_back(monkeypatch):
    """Inside a CUDA graph capture (cptsim train's default on CUDA) a device-to-host read fails the capture: the
    range check is skipped there (a replay would not re-run it anyway); eagerly it runs."""
    monkeypatch.setenv("CPTSIM_SCALED_MM", "1")
    fmt = F.parse_format("fp8e4m3")
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(4, 32, generator=g), torch.randn(16, 32, generator=g)
    xq, wq = F.quantize(x, fmt), F.quantize(w, fmt)
    checked = []
    monkeypatch.setattr(E, "_safe", lambda a: checked.append(float(a)) or True)
    assert E.scaled_mm_linear(x, xq, w, wq, None, fmt) is not None and len(checked) == 2
    checked.clear()
    monkeypatch.setattr(E, "_capturing", lambda t: True)
    y = E.scaled_mm_linear(x, xq, w, wq, None, fmt)
    assert y is not None and checked == []
    assert torch.allclose(y, xq @ wq.t(), rtol=1e-5, atol=1e-5)

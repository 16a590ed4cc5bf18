"""The GPU quantizers' Triton kernels (cptsim.numerics.kernels), run on a CPU by Triton's interpreter, against the
eager formulas of cptsim.numerics.quant; and the GPU dispatch of quant.py (routes, fallback records).

Round to nearest is checked bit for bit (torch.equal) against quant.fake_quant / fake_quant_per_channel, the ranges
against torch.aminmax, Philox against Random123's published answers, stochastic rounding by what any correct
draw must satisfy (neighbouring grid points, seeded, unbiased). CPU tensors always take the kernels' interpreted
build (what TRITON_INTERPRET=1 selects, without setting it for the rest of the process, whose CUDA tests need
compiled Triton); the interpreter runs numpy per program, so the tensors stay small.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

kernels = pytest.importorskip("cptsim.numerics.kernels")

from cptsim.errors import InputError  # noqa: E402
from cptsim.numerics import quant  # noqa: E402

BITS = (2, 4, 8, 16)

# Random123 1.14, tests/kat_vectors: "philox4x32 10" counter[4] key[2] -> output[4]
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def _qmax(bits):
    return (1 << bits) - 1


def _bits(t):
    """The float32 bit patterns (a -0 differs from a +0 here, unlike under ==)."""
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize("ctr,key,want", PHILOX_KAT)
def test_philox_matches_random123_known_answers(ctr, key, want):
    assert kernels.philox4x32_10(ctr, key) == want


# ----------------------------------------------------------------------------------------------------------------------
# Round to nearest


def _activation_cases():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, generator=g) * 3
    yield "own range", x, *torch.aminmax(x)
    yield "narrower range (clamps)", x, torch.tensor(-1.0), torch.tensor(0.5)
    yield "all negative", -x.abs() - 0.1, *torch.aminmax(-x.abs() - 0.1)
    yield "all positive", x.abs() + 0.1, *torch.aminmax(x.abs() + 0.1)
    yield "degenerate zero range", x, torch.tensor(0.0), torch.tensor(0.0)
    yield "degenerate constant", torch.full((37,), 2.5), torch.tensor(2.5), torch.tensor(2.5)
    # exact half-steps: range [0, 255] at 8 bits is scale 1, zp 0: k + 0.5 must round half to even
    yield "ties", torch.arange(0, 255, dtype=torch.float32) + 0.5, torch.tensor(0.0), torch.tensor(255.0)
    yield "ties, negative zero point", torch.arange(-128, 127, dtype=torch.float32) + 0.5, torch.tensor(-128.0), \
        torch.tensor(127.0)


@pytest.mark.parametrize("bits", BITS)
def test_activation_kernel_is_the_eager_formula_bit_for_bit(bits):
    for what, x, lo, hi in _activation_cases():
        got = kernels.fake_quant_tensor(x, lo, hi, _qmax(bits))
        assert torch.equal(_bits(got), _bits(quant.fake_quant(x, lo, hi, bits))), (what, bits)


def test_activation_kernel_keeps_the_memory_format_and_takes_any_strides():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 6, 5, 3, generator=g).contiguous(memory_format=torch.channels_last)
    lo, hi = torch.aminmax(x)
    got = kernels.fake_quant_tensor(x, lo, hi, 15)
    want = quant.fake_quant(x, lo, hi, 4)
    assert torch.equal(got, want) and got.stride() == want.stride() == x.stride()
    xt = torch.randn(12, 7, generator=g).t()  # dense, permuted: eager keeps the strides, so does the kernel
    assert torch.equal(kernels.fake_quant_tensor(xt, lo, hi, 15), quant.fake_quant(xt, lo, hi, 4))
    assert kernels.fake_quant_tensor(xt, lo, hi, 15).stride() == xt.stride()
    xs = torch.randn(10, 20, generator=g)[:, ::3]  # not dense: made contiguous
    assert torch.equal(kernels.fake_quant_tensor(xs, lo, hi, 15), quant.fake_quant(xs, lo, hi, 4))


def _weights():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(8, 3, 5, 5, generator=g)
    w[1] = 0.0  # a degenerate row
    w[2] = 0.75  # a constant row
    w[3] = -w[3].abs() - 0.01  # all negative
    w[4] = w[4].abs() + 0.01  # all positive
    yield "conv", w
    yield "conv channels_last", w.contiguous(memory_format=torch.channels_last)
    yield "depthwise (short rows)", torch.randn(6, 1, 3, 3, generator=g)
    yield "linear", torch.randn(5, 300, generator=g)
    yield "long rows (two passes)", torch.randn(3, 2500, generator=g) * 4
    yield "transposed (rows not contiguous)", torch.randn(9, 4, generator=g).t()


@pytest.mark.parametrize("bits", BITS)
def test_weight_kernel_is_the_eager_formula_bit_for_bit(bits):
    for what, w in _weights():
        got = kernels.fake_quant_rows(w, _qmax(bits))
        assert torch.equal(_bits(got), _bits(quant.fake_quant_per_channel(w, bits))), (what, bits)
        if quant.rows_contiguous(w):
            assert got.stride() == w.stride(), what


def test_weight_plan_reads_short_rows_once_and_long_rows_twice():
    assert kernels.row_plan(torch.empty(64, 3, 3, 3))[2:] == (32, True)
    assert kernels.row_plan(torch.empty(64, 512))[2:] == (2048, True)
    assert kernels.row_plan(torch.empty(8, 512, 3, 3))[2:] == (2048, False)


# ----------------------------------------------------------------------------------------------------------------------
# Ranges


def test_range_kernel_equals_aminmax():
    g = torch.Generator().manual_seed(3)
    cases = [torch.tensor([2.5]), torch.randn(1000, generator=g), torch.randn(5000, generator=g) - 7,  # 3 parts
             torch.randn(2, 4, 6, 6, generator=g).contiguous(memory_format=torch.channels_last),
             torch.randn(1, 1, 9, generator=g).expand(8, 5, 9)]  # a gradient with zero strides
    for x in cases:
        lo, hi = torch.aminmax(x)
        assert kernels.minmax(x).tolist() == [lo.item(), hi.item()]
    x = torch.randn(3000, generator=g)
    x[2100] = float("nan")  # torch.aminmax propagates NaN: so does the range
    assert kernels.minmax(x).isnan().all()
    assert kernels.range_plan(5000) == (3, 2048) and kernels.range_plan(10 ** 8)[0] == kernels.RANGE_PARTS


# ----------------------------------------------------------------------------------------------------------------------
# Stochastic rounding


def _neighbours(x, bits):
    """The two grid points around each x, computed with quant's float32 ops: (floor(y) - zp) s, (floor(y) + 1 - zp) s
    clamped to the grid, y = x (1/s) + zp."""
    qmax = _qmax(bits)
    s, zp = quant.choose_qparams(*torch.aminmax(x), bits)
    y = torch.floor(x * s.reciprocal() + zp)
    return ((y.clamp(0, qmax) - zp) * s, ((y + 1).clamp(0, qmax) - zp) * s)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_stochastic_rounding_lands_on_a_neighbouring_grid_point(bits):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(1000, generator=g) * 2 + 0.3
    q = kernels.fake_quant_sr(x, _qmax(bits), seed=torch.tensor(12345))
    down, up = _neighbours(x, bits)
    assert ((q == down) | (q == up)).all()
    assert (q == down).any() and (q == up).any()


def test_same_seed_same_draws_and_a_restored_generator_reproduces_the_call():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 4, 10, 10, generator=g).contiguous(memory_format=torch.channels_last)
    a = kernels.fake_quant_sr(x, 15, seed=torch.tensor(7))
    assert torch.equal(a, kernels.fake_quant_sr(x, 15, seed=torch.tensor(7)))
    assert not torch.equal(a, kernels.fake_quant_sr(x, 15, seed=torch.tensor(8)))
    assert a.stride() == x.stride()
    state = torch.get_rng_state()
    b = kernels.fake_quant_sr(x, 15)  # seed drawn from torch's (CPU) generator
    c = kernels.fake_quant_sr(x, 15)
    assert not torch.equal(b, c)
    torch.set_rng_state(state)
    assert torch.equal(kernels.fake_quant_sr(x, 15), b)
    gen = torch.Generator().manual_seed(11)
    d = kernels.fake_quant_sr(x, 15, generator=gen)
    assert torch.equal(d, kernels.fake_quant_sr(x, 15, generator=torch.Generator().manual_seed(11)))


def test_stochastic_rounding_is_unbiased():
    vals = torch.tensor([0.0, 1.0, 0.3, 0.77, 0.51, 0.05, 0.999, 0.5])  # the range [0, 1] is fixed by the first two
    n = 4000
    x = vals.repeat(n)
    for bits in (2, 4):
        step = 1 / _qmax(bits)
        q = kernels.fake_quant_sr(x, _qmax(bits), seed=torch.tensor(99 + bits)).view(n, -1).mean(0)
        # each draw's variance is at most step**2 / 4: five standard errors of the mean, plus the documented bias
        # bound of the float32 rounding (2**(bits - 24) + 2**-24 of a step)
        bound = 5 * step / (2 * math.sqrt(n)) + (2.0 ** (bits - 24) + 2.0 ** -24) * step
        assert ((q - vals).abs() <= bound).all(), (bits, (q - vals).abs().max().item(), bound)


def test_stochastic_rounding_takes_a_gradient_with_any_strides():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1, 5, 7, generator=g).expand(6, 5, 7)
    q = kernels.fake_quant_sr(x, 7, seed=torch.tensor(3))
    down, up = _neighbours(x, 3)
    assert q.is_contiguous() and ((q == down) | (q == up)).all()


# ----------------------------------------------------------------------------------------------------------------------
# The CUDA build, compiled ahead of time for an H100 (sm_90) without a GPU: its PTX shows the arithmetic the GPU runs


def _ptx(name, signature, constexprs, fusion):
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    try:
        knobs.nvidia.ptxas.path
    except Exception as e:  # a Triton without the CUDA toolchain: nothing to compile with
        pytest.skip(f"no ptxas: {e}")
    fn = getattr(kernels._kernels(torch.device("cuda")), name)
    src = ASTSource(fn, signature, constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": fusion}).asm["ptx"]


_RTN_SIG = {"x_ptr": "*fp32", "out_ptr": "*fp32", "lo_ptr": "*fp32", "hi_ptr": "*fp32", "n": "i32", "qmax": "fp32",
            "BLOCK": "constexpr"}
_ROWS_SIG = {"w_ptr": "*fp32", "out_ptr": "*fp32", "row_len": "i32", "qmax": "fp32", "BLOCK": "constexpr",
             "ONE_PASS": "constexpr"}
_SR_SIG = {"x_ptr": "*fp32", "out_ptr": "*fp32", "range_ptr": "*fp32", "seed_ptr": "*i64", "n": "i32", "qmax": "fp32",
           "BLOCK": "constexpr"}


def test_the_cuda_build_multiplies_and_adds_separately_and_divides_correctly_rounded():
    """As launched (enable_fp_fusion=False) no fused multiply-add, every float32 multiply `.rn` (which ptxas may not
    contract either), the three qparams divisions IEEE `div.rn`; with fusion on, x * (1/s) + zp becomes an FMA --
    the hazard the flag removes."""
    for name, sig, const in (("_fq_tensor_kernel", _RTN_SIG, {"BLOCK": 1024}),
                             ("_fq_rows_kernel", _ROWS_SIG, {"BLOCK": 2048, "ONE_PASS": False}),
                             ("_fq_sr_kernel", _SR_SIG, {"BLOCK": 512})):
        ptx = _ptx(name, sig, const, fusion=False)
        assert "fma." not in ptx and "mul.f32" not in ptx and "mul.rn.f32" in ptx, name
        assert ptx.count("div.rn.f32") == 3 and "div.full" not in ptx and "div.approx" not in ptx, name
    assert "fma.rn.f32" in _ptx("_fq_tensor_kernel", _RTN_SIG, {"BLOCK": 1024}, fusion=True)


def test_every_launch_turns_fusion_off(monkeypatch):
    seen = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *a, **k: seen.append(k)

    monkeypatch.setattr(kernels, "_kernels", lambda device: type("B", (), {"_fq_tensor_kernel": Kernel()})())
    kernels._launch(torch.device("cpu"), "_fq_tensor_kernel", (1,), BLOCK=8)
    assert seen == [{"enable_fp_fusion": False, "BLOCK": 8}]


# ----------------------------------------------------------------------------------------------------------------------
# quant.py's dispatch: CPU tensors made to take the GPU route here (the C kernels off, so nothing comes first)


@pytest.fixture
def route_on_cpu(monkeypatch):
    monkeypatch.setattr(quant, "KERNEL_DEVICES", ("cpu",))
    monkeypatch.setenv("CPTSIM_CKERNELS", "0")
    monkeypatch.delenv("CPTSIM_QUANT_KERNELS", raising=False)
    monkeypatch.delenv("CPTSIM_FUSED", raising=False)
    quant.clear_fallbacks()
    yield
    quant.clear_fallbacks()


def test_the_triton_route_runs_each_quantizer_and_records_nothing(route_on_cpu, monkeypatch):
    g = torch.Generator().manual_seed(7)
    x, w = torch.randn(4, 50, generator=g), torch.randn(8, 3, 5, 5, generator=g)
    lo, hi = torch.aminmax(x)
    eager = []
    for name in ("fake_quant_per_tensor", "fake_quant_per_channel", "fake_quant_stochastic"):
        monkeypatch.setattr(quant, name, lambda *a, _n=name, **k: eager.append(_n))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(quant.quantize_activation(x, lo, hi, 4), quant.fake_quant(x, lo, hi, 4))
        assert torch.equal(quant.quantize_weight(w, 4), kernels.fake_quant_rows(w, 15))
        torch.manual_seed(0)
        q = quant.quantize_error(x, 4)
        torch.manual_seed(0)
        assert torch.equal(q, kernels.fake_quant_sr(x, 15))
    assert eager == [] and quant.fallbacks() == {}
    st = quant.fused_status()
    assert st["route"] == "triton" and all(st[k] is None for k in quant.QUANTIZERS) and st["fallbacks"] == {}


def test_a_fallback_is_recorded_against_its_layer_and_warned_once(route_on_cpu):
    x = torch.randn(100, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match=r"fake_quant_stochastic quantizer ran the eager formula .*float64"):
        with quant.fallback_scope("layer1.conv"):
            q = quant.quantize_error(x, 4)
    assert q.dtype == torch.float64
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same reason again: no second warning
        with quant.fallback_scope("layer2.conv"):
            quant.quantize_error(x, 4)
    assert quant.fallbacks() == {"layer1.conv": "fake_quant_stochastic: dtype float64",
                                 "layer2.conv": "fake_quant_stochastic: dtype float64"}
    st = quant.fused_status()
    assert st["fake_quant_stochastic"] == "dtype float64" and st["fake_quant"] is None


def test_a_kernel_that_fails_falls_back_for_good_and_says_why(route_on_cpu, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(kernels, "fake_quant_rows", broken)
    monkeypatch.setattr(quant, "_triton_broken", {})
    w = torch.randn(4, 6)
    prev = quant.set_fallback_scope("fc1")
    try:
        with pytest.warns(RuntimeWarning, match="no compiler here"):
            assert torch.equal(quant.quantize_weight(w, 4), quant.fake_quant_per_channel(w, 4))
    finally:
        quant.set_fallback_scope(prev)
    assert quant.fused_status()["fake_quant_per_channel"] == "RuntimeError: no compiler here"
    assert quant.fallbacks() == {"fc1": "fake_quant_per_channel: RuntimeError: no compiler here"}


def test_routes_are_chosen_by_the_environment(monkeypatch):
    monkeypatch.delenv("CPTSIM_QUANT_KERNELS", raising=False)
    monkeypatch.delenv("CPTSIM_FUSED", raising=False)
    assert quant.quant_route() == "triton" and quant.kernel_route("cuda") == "triton"
    monkeypatch.setenv("CPTSIM_FUSED", "0")  # the old switch: eager
    assert quant.quant_route() == "eager" and not quant.fusion_enabled()
    monkeypatch.setenv("CPTSIM_QUANT_KERNELS", "compile")  # the new one wins
    assert quant.kernel_route("cuda:0") == "compile"
    monkeypatch.setenv("CPTSIM_QUANT_KERNELS", "fast")
    with pytest.raises(InputError, match="CPTSIM_QUANT_KERNELS"):
        quant.quant_route()
    monkeypatch.setenv("CPTSIM_CKERNELS", "0")
    assert quant.kernel_route("cpu") == "eager (CPTSIM_CKERNELS=0)"


# ----------------------------------------------------------------------------------------------------------------------
# on a GPU: the compiled kernels against torch's eager CUDA ops, bit for bit; no synchronisation; CUDA graphs

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.cuda
@cuda
def test_on_cuda_the_kernels_are_the_eager_formula_bit_for_bit():
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(64, 16, 32, 32, device="cuda", generator=g) * 3
    ties = torch.arange(0, 255, dtype=torch.float32, device="cuda") + 0.5  # scale 1, zp 0 at 8 bits over [0, 255]
    for bits in BITS:
        for t in (x, x.contiguous(memory_format=torch.channels_last), x[:, :, :7].transpose(1, 3)):
            lo, hi = torch.aminmax(t)
            assert torch.equal(kernels.fake_quant_tensor(t, lo, hi, _qmax(bits)), quant.fake_quant(t, lo, hi, bits))
        lo, hi = torch.tensor(0.0, device="cuda"), torch.tensor(255.0, device="cuda")
        assert torch.equal(kernels.fake_quant_tensor(ties, lo, hi, _qmax(bits)), quant.fake_quant(ties, lo, hi, bits))
        for w in (torch.randn(64, 16, 3, 3, device="cuda", generator=g), torch.randn(96, 1, 5, 5, device="cuda"),
                  torch.randn(32, 4608, device="cuda"), torch.randn(8, 64, 3, 3, device="cuda").contiguous(
                      memory_format=torch.channels_last)):
            assert torch.equal(kernels.fake_quant_rows(w, _qmax(bits)), quant.fake_quant_per_channel(w, bits))
    big = torch.randn(10_000_019, device="cuda", generator=g)
    assert kernels.minmax(big).tolist() == [v.item() for v in torch.aminmax(big)]


@pytest.mark.cuda
@cuda
def test_on_cuda_stochastic_rounding_is_seeded_by_the_cuda_generator_and_unbiased():
    vals = torch.tensor([0.0, 1.0, 0.3, 0.77, 0.51, 0.05, 0.999, 0.5], device="cuda")
    n = 200_000
    x = vals.repeat(n)
    state = torch.cuda.get_rng_state()
    a = kernels.fake_quant_sr(x, 15)
    torch.cuda.set_rng_state(state)
    assert torch.equal(kernels.fake_quant_sr(x, 15), a)
    step = 1 / 15
    bound = 5 * step / (2 * math.sqrt(n)) + (2.0 ** -20 + 2.0 ** -24) * step
    assert ((a.view(n, -1).mean(0) - vals).abs() <= bound).all()
    down, up = _neighbours(x, 4)
    assert ((a == down) | (a == up)).all()


@pytest.mark.cuda
@cuda
def test_on_cuda_the_quantizers_never_synchronise_and_replay_in_a_cuda_graph(monkeypatch):
    monkeypatch.delenv("CPTSIM_QUANT_KERNELS", raising=False)
    monkeypatch.delenv("CPTSIM_FUSED", raising=False)
    x = torch.randn(32, 64, 28, 28, device="cuda")
    w = torch.randn(64, 64, 3, 3, device="cuda")
    lo, hi = torch.aminmax(x)

    def step():
        return quant.quantize_activation(x, lo, hi, 4), quant.quantize_weight(w, 4), quant.quantize_error(x, 4)

    step()  # the kernels compile on first use
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert quant.fused_status()["route"] == "triton"
    assert all(quant.fused_status()[k] is None for k in quant.QUANTIZERS), quant.fused_status()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    graph.replay()
    first = [t.clone() for t in out]
    graph.replay()
    assert torch.equal(out[0], quant.fake_quant(x, lo, hi, 4)) and torch.equal(out[1], first[1])
    assert not torch.equal(out[2], first[2])  # a new Philox key per replay: the generator's graph-safe offset
    down, up = _neighbours(x, 4)
    assert ((out[2] == down) | (out[2] == up)).all()

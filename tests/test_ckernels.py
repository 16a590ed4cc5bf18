"""The CPU quantizer kernels (cptsim/numerics/_qkernels.c via cptsim.numerics.ckernels) against independent truth: the eager PyTorch
quantizers (bit for bit where the formula is deterministic), Random123's published Philox answers, the SR
formula written again in torch ops on the kernel's own bytes, and the statistics of the bytes."""

from __future__ import annotations

import pytest
import torch

from cptsim.numerics import ckernels
from cptsim.numerics import quant
from cptsim.numerics.quant import (
    SR_RANDOM_BITS,
    choose_qparams,
    fake_quant_per_channel,
    fake_quant_per_tensor,
    quantize_activation,
    quantize_error,
    quantize_weight,
)

@pytest.fixture(autouse=True)
def _kernels_on(monkeypatch):
    """Kernels on, and built at test time (into the suite's private CPTSIM_HOME, not at collection into the user's
    cache); without a C compiler these tests skip and the eager quantizers' own tests cover the quantizers."""
    monkeypatch.delenv("CPTSIM_CKERNELS", raising=False)
    if ckernels.library() is None:
        pytest.skip(f"CPU kernels unavailable: {ckernels.status()}")


# Random123 1.14, tests/kat_vectors: "philox4x32 10" counter[4] key[2] -> output[4]
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("ctr,key,want", PHILOX_KAT)
def test_philox_matches_random123_known_answers(ctr, key, want):
    assert ckernels.philox4x32_10(ctr, key) == want


def test_uniform_bytes_are_the_philox_words_in_the_documented_layout():
    """Element 1024*c + 256*t + w is byte t of word w of chunk c, W[64*j + l] = word j of block 64*c + l (counter
    (64*c + l, 0, 0, 0)). Every word of three chunks, against the scalar Philox of the known-answer test: the
    stream's own generator is vectorised (AVX2, where the CPU has it) and must give the same words."""
    key = (0x12345678, 0x9ABCDEF0)
    for stream in (0, 5):  # stream s: counter (block, 0, s, 0)
        got = ckernels.uniform_bytes(3 * 1024, key, stream).view(3, 4, 256)
        for c in range(3):
            for lane in range(64):
                block = ckernels.philox4x32_10((64 * c + lane, 0, stream, 0), key)
                for j, word in enumerate(block):
                    want = [(word >> (8 * t)) & 255 for t in range(4)]
                    assert got[c, :, 64 * j + lane].tolist() == want, (stream, c, lane, j)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 8, 12, 16])
def test_round_to_nearest_is_bit_identical_to_the_eager_quantizer(bits):
    torch.manual_seed(bits)
    x = torch.randn(8, 16, 20, 20) * 3 + 0.5  # above the kernel's threshold for threads
    lo, hi = torch.aminmax(x)
    assert torch.equal(quantize_activation(x, lo, hi, bits), fake_quant_per_tensor(x, lo, hi, bits))
    # a running range narrower than the data (eval): clamping at both ends
    lo2, hi2 = lo * 0.3, hi * 0.4
    assert torch.equal(quantize_activation(x, lo2, hi2, bits), fake_quant_per_tensor(x, lo2, hi2, bits))
    # all positive (ReLU output: lo widened to 0), and a degenerate all-zero range
    r = x.relu()
    assert torch.equal(quantize_activation(r, r.min(), r.max(), bits), fake_quant_per_tensor(r, r.min(), r.max(), bits))
    z = torch.zeros(5000)
    assert torch.equal(quantize_activation(z, z.min(), z.max(), bits), fake_quant_per_tensor(z, z.min(), z.max(), bits))


def test_round_to_nearest_keeps_layout_and_handles_strided_and_nan_inputs():
    torch.manual_seed(0)
    x = torch.randn(4, 8, 6, 6).contiguous(memory_format=torch.channels_last)
    lo, hi = torch.aminmax(x)
    got = quantize_activation(x, lo, hi, 4)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, fake_quant_per_tensor(x, lo, hi, 4))
    t = torch.randn(30, 40).t()  # not dense in either layout order
    assert torch.equal(quantize_activation(t, t.min(), t.max(), 5), fake_quant_per_tensor(t, t.min(), t.max(), 5))
    n = torch.tensor([0.5, float("nan"), -1.0])
    got = quantize_activation(n, torch.tensor(-1.0), torch.tensor(1.0), 8)
    want = fake_quant_per_tensor(n, torch.tensor(-1.0), torch.tensor(1.0), 8)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got[~got.isnan()], want[~want.isnan()])


@pytest.mark.parametrize("bits", [1, 2, 4, 8, 16])
def test_per_channel_weights_are_bit_identical_to_the_eager_quantizer(bits):
    torch.manual_seed(bits)
    w = torch.randn(32, 16, 3, 3) * torch.rand(32, 1, 1, 1)
    w[3] = 0.0  # a dead channel
    w[5] = w[5].abs()  # an all-positive one
    w[7] = -w[7].abs()
    assert torch.equal(quantize_weight(w, bits), fake_quant_per_channel(w, bits))
    lin = torch.randn(10, 7)
    assert torch.equal(quantize_weight(lin, bits), fake_quant_per_channel(lin, bits))
    w[9, 4, 2, 1] = float("nan")  # a NaN in one channel: that whole channel is NaN, the others are as before
    got, want = quantize_weight(w, bits), fake_quant_per_channel(w, bits)
    assert torch.equal(got.isnan(), want.isnan()) and got[9].isnan().all()
    assert torch.equal(got[~got.isnan()], want[~want.isnan()])


def _sr_formula(x: torch.Tensor, bits: int, noise: torch.Tensor) -> torch.Tensor:
    """quant.fake_quant_stochastic's formula, written out in torch ops, on given uniform bytes."""
    qmin, qmax = quant.qrange(bits)
    lo, hi = torch.aminmax(x)
    scale, zp = choose_qparams(lo, hi, bits)
    k = 1 << SR_RANDOM_BITS
    out = x * (k / scale) + noise.float() + (zp * k + 0.5)
    return (torch.floor(out * (1.0 / k)).clamp(qmin, qmax) - zp) * scale


@pytest.mark.parametrize("bits", [2, 5, 8])
def test_stochastic_rounding_is_the_eager_formula_on_the_kernel_bytes(bits):
    torch.manual_seed(3)
    x = torch.randn(3, 5000) * 0.01
    torch.manual_seed(11)
    got = quantize_error(x, bits)
    torch.manual_seed(11)
    key = ckernels.draw_key()  # the key the call drew from torch's generator
    noise = ckernels.uniform_bytes(x.numel(), key).view_as(x)
    assert torch.equal(got, _sr_formula(x, bits, noise))


def test_kernel_bytes_are_uniform_and_independent():
    key = ckernels.draw_key(torch.Generator().manual_seed(5))
    b = ckernels.uniform_bytes(1 << 20, key).long()
    expected = b.numel() / 256
    chi2 = ((torch.bincount(b, minlength=256) - expected) ** 2 / expected).sum().item()
    assert chi2 < 255 + 5 * (2 * 255) ** 0.5  # 255 degrees of freedom, 5 sigma
    # neighbours (same word, and across planes) carry no information about each other: pairs of high nibbles
    for a, c in ((b[:-1], b[1:]), (b[:-256], b[256:])):
        pairs = (a >> 4) * 16 + (c >> 4)
        e = pairs.numel() / 256
        chi2 = ((torch.bincount(pairs, minlength=256) - e) ** 2 / e).sum().item()
        assert chi2 < 255 + 5 * (2 * 255) ** 0.5
    for other in (ckernels.uniform_bytes(1 << 20, (key[0] ^ 1, key[1])),  # another key, or the next stream
                  ckernels.uniform_bytes(1 << 20, key, 1)):
        corr = torch.corrcoef(torch.stack([b.float(), other.float()]))[0, 1].item()
        assert abs(corr) < 5 / (1 << 10)  # 5 sigma of a correlation over 2**20 pairs


@pytest.mark.parametrize("checkpointed", [False, True])
@pytest.mark.parametrize("against", ["torch-path", "fresh-buffers"])
def test_layers_sharing_the_scratch_buffers_train_as_without_them(checkpointed, against, monkeypatch):
    """Several quantized convs of one size in a row share one Qa(x) buffer in forward and two (Qa(x), the quantized
    error) in backward (ckernels.scratch). Outputs and every gradient bit for bit equal to those of the torch path
    (CPTSIM_CKERNELS=0; g = 32, no random draws) and of the kernels with a fresh tensor per call (g = 6, the same
    draws under one seed), also when the stack is recomputed in backward (torch.utils.checkpoint); the buffers are
    gone after backward."""
    import copy
    import os

    from torch.utils.checkpoint import checkpoint

    from cptsim.numerics.layers import quantize_model

    g = 32 if against == "torch-path" else 6
    torch.manual_seed(0)
    fast = torch.nn.Sequential(*[m for _ in range(3) for m in (torch.nn.Conv2d(4, 4, 3, padding=1),
                                                               torch.nn.ReLU(inplace=True))])
    slow = copy.deepcopy(fast)
    for m in (fast, slow):
        quantize_model(m, fp_layers=[]).set(6, g)
    x = torch.randn(5, 4, 12, 12)
    res = []
    for m, env in ((fast, "1"), (slow, "0" if g == 32 else "1")):
        if m is slow and g != 32:
            monkeypatch.setattr(ckernels, "scratch", lambda slot, like: torch.empty_like(like))
        os.environ["CPTSIM_CKERNELS"] = env
        try:
            torch.manual_seed(1)
            xi = x.clone().requires_grad_()
            y = checkpoint(m, xi, use_reentrant=False) if checkpointed else m(xi)
            (y * torch.arange(y.numel()).view_as(y)).sum().backward()
        finally:
            os.environ.pop("CPTSIM_CKERNELS")
        res.append([y.detach(), xi.grad] + [p.grad for p in m.parameters()])
        if m is fast:
            assert not ckernels._scratch.__dict__.get("bufs")  # released when the backward pass ended
    for a, b in zip(*res):
        assert torch.equal(a, b)


def test_one_key_per_backward_pass_and_one_stream_per_layer():
    """Inside a backward pass the first error quantization draws the Philox key from torch's generator and the
    others take the next streams under it: torch's generator advances by one key per step, not one per layer, and
    each layer's bytes are those of (key, its stream)."""
    from cptsim.numerics.layers import quantize_model

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 3))
    quantize_model(net, fp_layers=[]).set(8, 6)
    x = torch.randn(4, 6)
    seen = []
    real = ckernels._lib.cpt_fq_sr_auto

    class Spy:  # the key and stream of each call, as the kernel receives them
        def __getattr__(self, name):
            return getattr(lib, name)

        def cpt_fq_sr_auto(self, *a):
            seen.append((a[4], a[5], a[6]))
            return real(*a)

    lib = ckernels._lib
    ckernels._lib = Spy()
    try:
        torch.manual_seed(1)
        net(x).sum().backward()
        after = torch.rand(1)
    finally:
        ckernels._lib = lib
    torch.manual_seed(1)
    key = ckernels.draw_key()
    assert torch.equal(torch.rand(1), after)  # exactly one key drawn in the whole backward
    assert seen == [(*key, 0), (*key, 1), (*key, 2)]  # last layer first, as autograd runs them
    torch.manual_seed(1)
    assert ckernels.fake_quant_sr(x, 63) is not None and torch.equal(torch.rand(1), after)  # outside: its own key


def test_stochastic_rounding_is_deterministic_under_the_seed_and_independent_of_threads():
    x = torch.randn(64, 32, 16, 16)  # several chunks, above the threads' threshold
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            torch.manual_seed(42)
            outs.append(quantize_error(x, 8))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    torch.manual_seed(43)
    assert not torch.equal(quantize_error(x, 8), outs[0])


@pytest.mark.parametrize("n", [1, 7, 8, 9, 4097, 100_003])
def test_min_max_is_torch_aminmax(n):
    """The kernels' range (one pass, eight lanes, per-chunk partials, two threads above 32k elements) against
    torch.aminmax, including where the extreme or a NaN sits in a tail, and infinities."""
    torch.manual_seed(n)
    x = torch.randn(n) * 3
    assert ckernels.minmax(x) == tuple(v.item() for v in torch.aminmax(x))
    x[-1] = -50.0
    assert ckernels.minmax(x)[0] == -50.0
    x[n // 2] = float("inf")
    assert ckernels.minmax(x)[1] == float("inf")
    x[n - 1 - n // 3] = float("nan")
    lo, hi = ckernels.minmax(x)
    assert lo != lo and hi != hi and torch.aminmax(x)[0].isnan()


@pytest.mark.parametrize("kind", ["conv", "conv-strided-grouped", "linear-3d"])
def test_training_forward_in_one_call_matches_the_torch_ops(kind, monkeypatch):
    """A quantized layer in training with the kernels -- one autograd node (layers._QuantLayerCPU): range, running
    range and quantization in one C call, the op's backward called directly -- against the same layer with
    CPTSIM_CKERNELS=0 (torch.aminmax, torch's running-average ops, the eager quantizer, autograd's own nodes):
    outputs and gradients bit for bit for convolutions (g = 32: no random draws; backward re-quantizes from the
    float range the call returned; aten.convolution_backward is what autograd calls too), to float32 rounding for
    the linear layer (its GEMMs are grouped differently); the running range to the last bit of float32 (torch's
    add with alpha is one fused multiply-add on this build's kernels, as in the C code; a build that rounds twice
    may differ by one unit in the last place)."""
    import copy
    import os

    from cptsim.numerics.layers import quantize_model

    # the one-node FP32 fake-quant path (a linear layer would take the exact int8 path otherwise: test_exact_gemm)
    monkeypatch.setenv("CPTSIM_EXACT_GEMM", "0")
    torch.manual_seed(0)
    fast, shape = {
        "conv": (torch.nn.Conv2d(4, 6, 3, padding=1), (8, 4, 16, 16)),
        "conv-strided-grouped": (torch.nn.Conv2d(4, 6, 3, stride=2, padding=(1, 2), dilation=2, groups=2,
                                                 bias=False), (8, 4, 15, 17)),
        "linear-3d": (torch.nn.Linear(12, 5), (3, 7, 12)),
    }[kind]
    slow = copy.deepcopy(fast)
    for m in (fast, slow):
        quantize_model(torch.nn.Sequential(m), fp_layers=[]).set(5, 32)
    for i, scale in enumerate((1.0, 4.0, 0.5, 2.0)):
        x = (torch.randn(shape) * scale).relu() if i % 2 else torch.randn(shape) * scale
        grads, nodes = [], []
        for m, env in ((fast, "1"), (slow, "0")):
            os.environ["CPTSIM_CKERNELS"] = env
            try:
                xi = x.clone().requires_grad_()
                y = m(xi)
                nodes.append(type(y.grad_fn).__name__)
                y.backward(torch.ones_like(y))
            finally:
                os.environ.pop("CPTSIM_CKERNELS")
            grads.append((y.detach(), xi.grad, m.weight.grad.clone()))
            m.weight.grad = None
        assert nodes[0] == "_QuantLayerCPUBackward" != nodes[1]  # one node with the kernels, autograd's without
        for a, b in zip(*grads):
            if kind.startswith("conv"):
                assert torch.equal(a, b)
            else:
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        assert int(fast.act_count) == int(slow.act_count) == i + 1
        for a, b in ((fast.act_lo, slow.act_lo), (fast.act_hi, slow.act_hi)):
            torch.testing.assert_close(a, b, rtol=2**-23, atol=0)


def test_off_switch_and_missing_compiler_fall_back_to_the_eager_quantizers(monkeypatch, tmp_path):
    x = torch.randn(1000)
    monkeypatch.setenv("CPTSIM_CKERNELS", "0")
    assert ckernels.status() == {"in_use": False, "why_not": "CPTSIM_CKERNELS=0"}
    assert not ckernels.usable(x)
    monkeypatch.delenv("CPTSIM_CKERNELS")
    monkeypatch.setattr(ckernels, "_lib", None)
    monkeypatch.setattr(ckernels, "_tried", False)
    monkeypatch.setattr(ckernels, "_why_not", None)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("CPTSIM_HOME", str(tmp_path))
    st = ckernels.status()
    assert st["in_use"] is False and "no C compiler" in st["why_not"]
    torch.manual_seed(0)
    got = quantize_error(x, 4)  # the eager function, same draws
    torch.manual_seed(0)
    assert torch.equal(got, quant.fake_quant_stochastic(x, 4))


def test_autograd_and_dispatch_modes_see_the_eager_ops():
    x = torch.randn(100, requires_grad=True)
    y = quantize_activation(x, torch.tensor(-1.0), torch.tensor(1.0), 4)
    assert y.grad_fn is not None  # differentiable eager ops, not a kernel autograd cannot see
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False):
        assert not ckernels.usable(torch.randn(100))


def test_runs_record_which_quantizers_they_ran(monkeypatch):
    from cptsim.run.train import quantizer_path

    assert quantizer_path("cpu") == "c-kernels"
    monkeypatch.setenv("CPTSIM_CKERNELS", "0")
    assert quantizer_path("cpu") == "eager (CPTSIM_CKERNELS=0)"


def test_the_benchmark_floor_replaces_every_quantizer_with_a_copy():
    """benchmarks/bench_quant_step.py's floor (quantizers as plain copies) is only a floor if no quantizer is left:
    under it a fully quantized resnet20 gives FP32's output and gradients bit for bit (and, outside it, does not --
    so the patch is what made them equal), and every kernel function is back afterwards."""
    import copy
    import importlib.util
    from pathlib import Path

    from cptsim.numerics.layers import quantize_model
    from cptsim.models import create_model

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_quant_step.py"
    spec = importlib.util.spec_from_file_location("bench_quant_step", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    torch.manual_seed(0)
    fp = create_model("resnet20", num_classes=10, in_channels=3, input_shape=(3, 32, 32))
    q = copy.deepcopy(fp)
    quantize_model(q, fp_layers=[]).set(4, 4)
    x = torch.randn(8, 3, 32, 32)

    def run(m):
        m.zero_grad(set_to_none=True)
        y = m(x)
        (y * torch.arange(y.numel()).view_as(y)).sum().backward()
        return [y.detach()] + [p.grad for p in m.parameters()]

    before = {n: getattr(ckernels, n) for n in bench._CopyQuantizers.NAMES}
    want = run(fp)
    with bench._CopyQuantizers():
        got = run(q)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert {n: getattr(ckernels, n) for n in bench._CopyQuantizers.NAMES} == before
    assert not torch.equal(run(q)[0], want[0])

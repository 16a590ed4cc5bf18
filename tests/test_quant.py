"""Quantizer primitives against hand-derived bounds and plain-arithmetic reimplementations."""

import pytest
import torch

from cptsim.errors import InputError
from cptsim.numerics.quant import (
    SR_RANDOM_BITS,
    check_bits,
    choose_qparams,
    fake_quant_per_channel,
    fake_quant_per_tensor,
    fake_quant_stochastic,
    quantize_error_bound,
    uniform_bytes,
)


@pytest.mark.parametrize("bits", list(range(1, 17)))
def test_round_trip_error_is_at_most_half_a_step(bits):
    torch.manual_seed(bits)
    x = torch.randn(10_000) * 3 + 0.5
    lo, hi = torch.aminmax(x)
    q = fake_quant_per_tensor(x, lo, hi, bits)
    bound = quantize_error_bound(lo.item(), hi.item(), bits)
    assert (q - x).abs().max().item() <= bound * (1 + 1e-4) + 1e-6
    assert torch.unique(q).numel() <= 2**bits


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_per_tensor_matches_the_textbook_formula(bits):
    """Second implementation: scale = (hi - lo) / (2^b - 1), integer zero point, round, clamp, dequantize."""
    torch.manual_seed(0)
    x = torch.rand(5000) * 4 - 1  # contains 0 in the range
    lo, hi = x.min().item(), x.max().item()
    qmax = 2**bits - 1
    s = (hi - lo) / qmax
    zp = round(-lo / s)
    expect = torch.tensor([(min(max(round(v / s + zp), 0), qmax) - zp) * s for v in x.tolist()])
    got = fake_quant_per_tensor(x, torch.tensor(lo), torch.tensor(hi), bits)
    # the kernel multiplies by 1/s instead of dividing by s: rare last-ulp differences may flip a tie
    mismatch = ((got - expect).abs() > 1e-5).float().mean().item()
    assert mismatch < 1e-3


def test_zero_stays_exact_and_range_includes_zero():
    x = torch.tensor([0.0, 0.3, 1.0, 2.0])  # lo > 0: the range is widened to include 0
    q = fake_quant_per_tensor(x, x.min(), x.max(), 3)
    assert q[0].item() == 0.0
    s, zp = choose_qparams(torch.tensor(0.5), torch.tensor(2.0), 3)
    assert zp.item() == 0 and s.item() == pytest.approx(2.0 / 7)


def test_degenerate_range_does_not_divide_by_zero():
    x = torch.zeros(100)
    assert torch.equal(fake_quant_per_tensor(x, x.min(), x.max(), 4), x)
    assert torch.isfinite(fake_quant_stochastic(x, 4)).all()


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_per_channel_uses_each_channels_own_range(bits):
    torch.manual_seed(0)
    w = torch.randn(6, 3, 3, 3) * torch.tensor([0.01, 0.1, 1, 10, 100, 1000]).view(6, 1, 1, 1)
    q = fake_quant_per_channel(w, bits)
    for c in range(6):
        lo, hi = w[c].min().item(), w[c].max().item()
        assert (q[c] - w[c]).abs().max().item() <= quantize_error_bound(lo, hi, bits) * (1 + 1e-4) + 1e-9
    # a per-tensor quantizer would flatten the small channels to zero; per-channel keeps them
    assert q[0].abs().sum() > 0


@pytest.mark.parametrize("path", ["eager", "c-kernels"])
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_stochastic_rounding_is_unbiased(bits, path, monkeypatch):
    """fake_quant_stochastic, and the CPU kernel (cptsim.numerics.ckernels) that quantize_error runs in its place."""
    if path == "eager":
        sr = fake_quant_stochastic
    else:
        from cptsim.numerics import ckernels
        from cptsim.numerics.quant import quantize_error

        monkeypatch.delenv("CPTSIM_CKERNELS", raising=False)
        if ckernels.library() is None:
            pytest.skip(f"CPU kernels unavailable: {ckernels.status()}")
        sr = quantize_error
    torch.manual_seed(0)
    # values deliberately between grid points; one tensor holds the range ends so the grid is fixed
    vals = torch.tensor([0.013, 0.21, 0.377, 0.5, 0.61, 0.999])
    n = 200_000
    x = torch.cat([torch.tensor([0.0, 1.0]), vals.repeat_interleave(n)])
    q = sr(x, bits)[2:].view(len(vals), n)
    step = 1.0 / (2**bits - 1)
    mean_err = (q.mean(1) - vals).abs()
    # bias bound of the 8-bit noise grid + 5 sigma of the mean of n Bernoulli(step) draws
    tol = step * 2.0 ** -(SR_RANDOM_BITS + 1) + 5 * step * 0.5 / n**0.5
    assert (mean_err <= tol).all(), (mean_err, tol)
    # and each draw lands on one of the two neighbouring grid points
    assert ((q - vals[:, None]).abs() <= step * (1 + 1e-4)).all()


def test_round_to_nearest_is_biased_where_stochastic_is_not():
    """Control for the test above: deterministic rounding of 0.2 steps errs by the full 0.2 on average."""
    x = torch.cat([torch.tensor([0.0, 1.0]), torch.full((1000,), 0.2 / 3)])
    q = fake_quant_per_tensor(x, torch.tensor(0.0), torch.tensor(1.0), 2)[2:]
    assert (q.mean() - 0.2 / 3).abs().item() > 0.06


def test_uniform_bytes_are_uniform():
    torch.manual_seed(0)
    u = uniform_bytes(600_000).float()
    assert u.numel() == 600_000
    assert u.mean().item() == pytest.approx(127.5, abs=0.5)
    counts = torch.bincount(u.long(), minlength=256).float()
    assert counts.min() > 0.8 * counts.mean() and counts.max() < 1.2 * counts.mean()


@pytest.mark.parametrize("bad", [0, 17, 31, 33, -1, 8.0, "8", True])
def test_bits_outside_the_valid_set_are_rejected(bad):
    with pytest.raises(InputError):
        check_bits(bad)


@pytest.mark.parametrize("ok", [1, 8, 16, 32])
def test_valid_bits_pass(ok):
    assert check_bits(ok) == ok

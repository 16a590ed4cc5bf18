"""The integer quantizers' scale is the correctly rounded float32 ``(hi - lo) / (2**b - 1)`` on every device.

CUDA computes a tensor divided by a Python number (or by a CPU scalar) as a multiply by the number's float32
reciprocal: one rounding more than a division, so ~70% of ranges got a scale 1 ulp off the CPU's and codes that
differed near half-steps (an H100 check: 176 / 315 / 903 / 1661 elements of int3 / int4 / int8 / int13). There is no
GPU here, so ``CudaScalarDivision`` applies CUDA's rule on the CPU, and the quantizers run under it must still match
an independent numpy float32 computation of the documented formula -- at inputs chosen on the rounding boundaries,
where a scale 1 ulp off moves codes."""

import contextlib

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from cptsim.numerics import formats, quant

F32 = np.float32
BITS = (3, 4, 8, 13)


class CudaScalarDivision(TorchFunctionMode):
    """A float tensor divided by a Python number, computed as CUDA computes it: times the number's float32
    reciprocal (PyTorch's div_true_kernel_cuda for a CPU-scalar divisor)."""

    DIVS = {torch.Tensor.div, torch.Tensor.__truediv__, torch.div, torch.true_divide, torch.Tensor.true_divide}
    IN_PLACE = {torch.Tensor.div_, torch.Tensor.__itruediv__, torch.Tensor.true_divide_}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func in self.DIVS | self.IN_PLACE and len(args) == 2 and isinstance(args[1], (int, float))
                and not isinstance(args[1], bool) and not kwargs and args[0].is_floating_point()):
            inv = float(F32(1.0) / F32(args[1]))  # a float32 value: the multiply below rounds once, in float32
            return args[0].mul_(inv) if func in self.IN_PLACE else torch.mul(args[0], inv)
        return func(*args, **kwargs)


def test_the_emulation_is_cudas_rule():
    d = torch.tensor([1.0, 0.7, 3.3], dtype=torch.float32)
    with CudaScalarDivision():
        got = d / 255.0
    assert torch.equal(got, d * float(F32(1) / F32(255)))
    assert not torch.equal(got, torch.div(d, torch.full_like(d, 255.0)))  # a tensor divisor: a true division


def ref_qparams(lo, hi, bits):
    """quant.choose_qparams in numpy float32: the range widened to hold 0, scale = (hi - lo) / qmax correctly
    rounded (numpy's float32 division), at least 1e-12; zp = clip(rint(-lo / scale), 0, qmax)."""
    qmax = F32((1 << bits) - 1)
    lo, hi = np.minimum(F32(lo), F32(0)), np.maximum(F32(hi), F32(0))
    scale = np.maximum((hi - lo) / qmax, F32(1e-12))
    zp = np.clip(np.rint(-lo / scale), F32(0), qmax)
    return scale, zp


def ref_fake_quant(x, lo, hi, bits, scale=None):
    """quant.fake_quant's float32 passes: x * (1/scale) + zp, rounded half to even, clamped, - zp, * scale."""
    s, zp = ref_qparams(lo, hi, bits)
    s = s if scale is None else scale
    qmax = F32((1 << bits) - 1)
    v = np.rint(x * (F32(1) / s) + zp)
    return (np.clip(v, F32(0), qmax) - zp) * s


def ranges(bits, n=64, seed=0):
    """(lo, hi) float32 pairs whose width divided by qmax is not the width times qmax's float32 reciprocal."""
    rng = np.random.default_rng(seed + bits)
    qmax = F32((1 << bits) - 1)
    out = []
    while len(out) < n:
        lo, hi = F32(-rng.uniform(0, 3)), F32(rng.uniform(0.1, 5))
        w = hi - lo
        if w / qmax != w * (F32(1) / qmax):
            out.append((lo, hi))
    return out


def boundary_inputs(lo, hi, bits):
    """Values on both sides of every rounding boundary (k + 1/2 - zp) * scale of the correct scale, float32
    neighbours included, and the range's ends."""
    s, zp = ref_qparams(lo, hi, bits)
    k = np.arange(0, min(1 << bits, 64), dtype=np.float64)
    mid = ((k + 0.5 - float(zp)) * float(s)).astype(F32)
    xs = np.concatenate([mid, np.nextafter(mid, F32(np.inf)), np.nextafter(mid, F32(-np.inf)), [lo, hi, F32(0)]])
    return xs.astype(F32)


@pytest.mark.parametrize("bits", BITS)
def test_per_tensor_scale_and_codes_match_numpy_under_cudas_division_rule(bits):
    moved = 0
    for lo, hi in ranges(bits):
        x = boundary_inputs(lo, hi, bits)
        want = ref_fake_quant(x, lo, hi, bits)
        # the test has teeth: the reciprocal-multiplied scale moves codes at these inputs for some ranges
        wrong = ref_fake_quant(x, lo, hi, bits, scale=(hi - lo) * (F32(1) / F32((1 << bits) - 1)))
        moved += int((wrong != want).sum())
        tx, tlo, thi = torch.from_numpy(x), torch.tensor(lo), torch.tensor(hi)
        for emulate in (False, True):
            with (CudaScalarDivision() if emulate else contextlib.nullcontext()):
                s, zp = quant.choose_qparams(tlo, thi, bits)
                got = quant.fake_quant_per_tensor(tx, tlo, thi, bits)
                reg = formats.quantize(tx, f"int{bits}") if bits >= 2 else got
            rs, rzp = ref_qparams(lo, hi, bits)
            assert s.item() == rs and zp.item() == rzp, (bits, lo, hi, emulate)
            assert np.array_equal(got.numpy(), want), (bits, lo, hi, emulate)
            assert np.array_equal(reg.numpy(), ref_fake_quant(x, x.min(), x.max(), bits)), (bits, lo, hi, emulate)
    assert moved > 0


@pytest.mark.parametrize("bits", BITS)
def test_per_channel_weights_match_numpy_under_cudas_division_rule(bits):
    rows = ranges(bits, n=16, seed=7)
    w = np.stack([np.clip(np.resize(boundary_inputs(lo, hi, bits), 48), lo, hi) for lo, hi in rows])
    w[:, 0], w[:, 1] = [r[0] for r in rows], [r[1] for r in rows]  # each row's range is its (lo, hi)
    want = np.stack([ref_fake_quant(r, r.min(), r.max(), bits) for r in w])
    for emulate in (False, True):
        with (CudaScalarDivision() if emulate else contextlib.nullcontext()):
            got = quant.fake_quant_per_channel(torch.from_numpy(w), bits)
        assert np.array_equal(got.numpy(), want), (bits, emulate)


@pytest.mark.parametrize("bits", BITS)
def test_the_cpu_kernels_compute_the_same_scale(bits):
    """The layers' CPU quantizers (C kernels where built) agree with the reference bit for bit too."""
    for lo, hi in ranges(bits, n=8, seed=3):
        x = boundary_inputs(lo, hi, bits)
        got = quant.quantize_activation(torch.from_numpy(x), torch.tensor(lo), torch.tensor(hi), bits)
        assert np.array_equal(got.numpy(), ref_fake_quant(x, lo, hi, bits)), (bits, lo, hi)

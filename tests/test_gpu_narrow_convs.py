"""Narrow convolutions on tensor cores: channels padded to whole tiles (gpu_kernels.conv_padding), checked by hand and
per traced call on networks the tile was not chosen on (the lent H100's traces, benchmarks/results/gpu-optrace-H100)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from cptsim.cost.hardware import gpu_kernels as K
from cptsim.cost.hardware import load_profile

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"


def _gemm(groups, c_in, c_out, taps, rows=1024):
    """A conv's GEMM row (groups, N = C_out per group, K = C_in per group x taps, rows, 0)."""
    return np.array([[groups, c_out, c_in * taps, rows, 0]], dtype=np.float64)


def test_padding_by_hand_fp16_18_channels():
    # 3x3, 18 -> 18 channels, FP16 (2 bytes): 64-wide N-tiles, 32-byte MMA steps = 16 channels per tap
    pad = K.conv_padding(_gemm(1, 18, 18, 9), np.array([9.0]), np.full((1, 1, 3), 2.0), 64, 32)[0, 0]
    fwd = (64 / 18) * (32 / 18)                   # C_out 18 -> 64; each tap's C_in 18 -> 32
    wgrad = (32 / 18) * (192 / 162)               # C_out 18 -> 32 (MMA steps); taps x C_in 162 -> 192 (N-tile)
    assert pad == pytest.approx([fwd, fwd, wgrad])


def test_padding_by_hand_tf32_and_aligned_and_grouped():
    # TF32 (4 bytes): an MMA step is 8 channels, so 16 input channels need none; 16 output channels -> 64
    pad = K.conv_padding(_gemm(1, 16, 16, 9), np.array([9.0]), np.full((1, 1, 3), 4.0), 64, 32)[0, 0]
    assert pad == pytest.approx([4.0, 4.0, 1.0 * (192 / 144)])
    # whole tiles: nothing padded
    assert K.conv_padding(_gemm(1, 64, 128, 9), np.array([9.0]), np.full((1, 1, 3), 2.0), 64, 32) == \
        pytest.approx(np.ones((1, 1, 3)))
    # grouped convolutions (ResNeXt's 4-channel groups) are left unpadded: no traced call says how cuDNN packs them
    assert K.conv_padding(_gemm(32, 4, 4, 9), np.array([9.0]), np.full((1, 1, 3), 2.0), 64, 32) == \
        pytest.approx(np.ones((1, 1, 3)))
    # the identity constants (every Ampere / datasheet profile) pad nothing
    assert K.conv_padding(_gemm(1, 18, 18, 9), np.array([9.0]), np.full((1, 1, 3), 2.0), 1, 0) == \
        pytest.approx(np.ones((1, 1, 3)))


@pytest.mark.parametrize("c_in,hw_in,k,stride,taps", [(18, 56, 3, 1, 9), (64, 56, 3, 2, 9), (3, 224, 7, 2, 49),
                                                      (256, 14, 1, 1, 1), (64, 56, 1, 2, 1), (16, 7, 3, 2, 9)])
def test_taps_read_from_the_recorded_shapes(c_in, hw_in, k, stride, taps):
    out = -(-hw_in // stride)  # 'same' padding
    gemm = _gemm(1, c_in, 32, k * k, rows=out * out)
    assert K.conv_taps(gemm, np.array([c_in * hw_in * hw_in], dtype=float), np.array([True]))[0] == taps


def test_padding_holds_per_call_on_networks_it_was_not_chosen_on():
    """Each traced network's spatial convolution calls priced with the N-tile the other networks' calls choose:
    pooled median |log(model / measured)| within 0.25 (1.28x), and better than without padding; the shipped tiles
    better than none on the narrow calls (C_in or C_out <= 72)."""
    sys.path.insert(0, str(BENCH))
    import fit_gpu_model as FG

    from cptsim.calibration import gpu_fit as F

    hw = F.with_values(load_profile("h100"), {"memory_efficiency": FG.STREAM_EFFICIENCY})
    doc = FG.narrow_check(hw, 1.41e-6)
    pooled = doc["lono_pooled"]
    assert pooled["after_median_abs_log"] < 0.25
    assert pooled["after_median_abs_log"] < pooled["before_median_abs_log"] - 0.05
    assert doc["narrow"]["after"]["median_abs_log"] < doc["narrow"]["before"]["median_abs_log"] - 0.1
    assert doc["narrow"]["after"]["calls"] >= 100

"""`cptsim hw calibrate --device cuda`'s GPU profile (cptsim.calibration.gpu_micro), checked offline on the records
it wrote on our H100 (benchmarks/results/gpu-calibrate-H100.json) and against what that card then measured."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cptsim.calibration import gpu_micro
from cptsim.cost.hardware import parse_profile
from cptsim.errors import InputError

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


@pytest.fixture(scope="module")
def records():
    return json.loads((RESULTS / "gpu-calibrate-H100.json").read_text())["gpu_records"]


def test_the_shipped_calibrated_profile_is_what_its_records_give(records):
    """Provenance: the TOML the H100 run wrote is re-derived from the raw microbenchmarks it saved (the same fits,
    the same inherited constants), so nothing in it was typed by hand."""
    text = gpu_micro.calibrated_profile_text(records, "host-gpu")
    assert text == (RESULTS / "gpu-calibrate-H100-profile.toml").read_text()


def test_what_is_measured_and_what_is_inherited(records):
    p = parse_profile(gpu_micro.calibrated_profile_text(records, "x").encode(), "x.toml")
    assert p.params["sm_count"] == 132 and p.params["boost_clock_mhz"] == 1980 and p.params["power_w"] == 700
    tiers = {t["name"]: t for t in p.params["tiers"]}
    # 8-bit GEMMs run on the faster 8-bit path torch reached: FP8 (_scaled_mm, 1410 TFLOPS) over int8 (_int_mm, 129)
    assert set(tiers) == {"fp8", "fp16", "tf32", "fp32"} and tiers["fp8"]["bits"] == 8
    fp16 = max(r["tflops"] for r in records["gemm"] if r["dtype"] in ("fp16", "bf16") and r["M"] == 8192)
    assert tiers["fp16"]["peak_ops"] == pytest.approx(fp16, rel=1e-3)
    stream = max(m["gb_per_s"] for m in records["membw"])
    assert p.params["bandwidth_gb_s"] == pytest.approx(stream, rel=1e-3)
    # these records hold no dispatch microbenchmark: no host time is written (none is closed on ResNet-20's step)
    assert p.calibration.get("host_overhead_us") is None and p.calibration.get("host_conv_overhead_us") is None
    assert p.calibration["power_fraction"] == pytest.approx(records["power"]["busy_power_w"] / 700, rel=1e-3)
    # a network-level constant the kernels cannot show comes from the Hopper fit, re-expressed against the stream
    from cptsim.cost.hardware import load_profile

    h100 = load_profile("h100")
    assert p.calibration["nchw_norm_elements_per_clock"] == pytest.approx(
        h100.calibration["nchw_norm_elements_per_clock"], rel=1e-3)
    assert p.calibration["memory_efficiency"] == pytest.approx(
        h100.calibration["memory_efficiency"] / gpu_micro.STREAM_EFFICIENCY, rel=1e-3)


def test_the_launch_times_come_from_microbenchmarks_not_from_a_network_step(records):
    """kernel_overhead_us is a graphed chain of empty kernels' time per kernel x the kernels per counted launch (the
    generation's shipped value where the records have no chain); the host's times are the eager add_ and cuDNN
    convolution dispatch loops. None is closed on ResNet-20's step, whose unmodelled work would hide in it."""
    from cptsim.cost.hardware import load_profile

    p = parse_profile(gpu_micro.calibrated_profile_text(records, "x").encode(), "x.toml")
    assert p.calibration["kernel_overhead_us"] == load_profile("h100").calibration["kernel_overhead_us"]
    more = {**records, "graph_launch": {"kernels": 1000, "us_per_kernel": 1.5},
            "launch": {"kernels": 2000, "eager_host_us_per_kernel": 9.0},
            "conv_dispatch": {"calls": 600, "eager_host_us_per_conv": 31.0}}
    q = parse_profile(gpu_micro.calibrated_profile_text(more, "x").encode(), "x.toml")
    assert q.calibration["kernel_overhead_us"] == pytest.approx(1.5 * gpu_micro.KERNELS_PER_LAUNCH, rel=1e-3)
    assert q.calibration["host_overhead_us"] == 9.0 and q.calibration["host_conv_overhead_us"] == 31.0


def test_microbenchmarks_alone_price_networks_they_never_saw(records):
    """The calibrated profile against the timm networks measured on the same H100 (none of them entered it): no
    worse than the shipped, network-fitted h100 profile by more than a few points (benchmarks/
    bench_gpu_heldout.py; the fourth session's 7 never-seen networks included)."""
    sys.path.insert(0, str(RESULTS.parent))
    import bench_gpu_heldout as BH

    from cptsim.calibration import gpu_fit as F
    from cptsim.measure.profiler import LayerProfile
    cal = parse_profile(gpu_micro.calibrated_profile_text(records, "x").encode(), "x.toml")
    zoo = BH.zoo_profiles()
    errs = []
    for r in BH.timm_rows():
        prof = LayerProfile.from_json(zoo[r["model"]]["profile"])
        row = F.Row(r["model"], "", r["batch"], r["measured"], r["format"] == "nhwc")
        errs.append(F.predicted_img_s(cal, prof, row) / r["measured"] - 1)
    s = F.error_summary(errs)
    assert s["n"] == 25 and s["median_abs"] < 0.25


def test_records_without_the_tiers_a_profile_needs_are_refused(records):
    bare = {**records, "gemm": [g for g in records["gemm"] if g["dtype"] not in ("fp16", "bf16")]}
    with pytest.raises(InputError, match="16-bit and 32-bit GEMM tier"):
        gpu_micro.profile_text(bare, "x")
    with pytest.raises(InputError, match="stream bandwidth"):
        gpu_micro.profile_text({**records, "membw": []}, "x")


def test_the_generation_picks_the_shipped_fit():
    assert gpu_micro.generation("9.0") == "hopper" and gpu_micro.generation("8.6") == "ampere"
    assert gpu_micro.generation(None) == "ampere"

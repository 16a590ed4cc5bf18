"""GPUs are never priced out of order.

A GPU profile at least as fast as another in every tier (overall and per SM), in bandwidth and in every other rate
the time model uses, with no larger per-launch time, must never be priced slower for any network. Checked two ways,
on every shipped GPU profile over CIFAR and ImageNet CNNs, a ViT, the two language models and a GCN:

* each profile against slower copies of itself built here (every rate scaled down, the launch time scaled up; one
  at a time and all together; fewer SMs at the same per-SM rate);
* every pair of shipped profiles where one dominates the other on its numbers (``dominates``: H200 over H100, H100
  over A100, A100 over V100 and T4, ...), which must include the pairs the datasheets say.

And the ratio of two GPUs' ResNet-50 step times must lie within a band around the datasheet ratios: between the
smallest and the largest ratio of the resources a step's kernels are bound by (the tier's peak, DRAM bandwidth, SMs x
clock), widened by ``BAND`` for the fitted efficiencies in between.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

from cptsim.cost.hardware import list_profiles, load_profile
from cptsim.cost.model import estimate
from cptsim.cost.schedules import parse_schedule

ROOT = Path(__file__).resolve().parents[1]
GPUS = sorted(n for n in list_profiles() if load_profile(n).kind == "gpu")
# FP32 (TF32 convolutions, strict FP32 matmuls), AMP, and an int8 pipeline
SCHEDULES = ("static:32", "static:16", "static:8")
# the GEMM widths those run at: domination is judged there (an A100's INT4 tier runs 4-bit GEMMs faster per SM than
# an H100, which has none and runs them on its INT8 tier: below 8 bits the A100 may rightly win a small GEMM)
WIDTHS = (8, 16, 32)
# the datasheet pairs that must dominate (faster, first): if a profile edit breaks one, that is a finding to explain
DATASHEET_PAIRS = [("h200", "h100"), ("h100", "a100"), ("a100", "v100"), ("a100", "t4"),
                   ("rtx4090", "t4")]
# how far outside the datasheet ratios a predicted speed-up may fall: fitted tier efficiencies (the H100's FP16 0.74
# of peak against Ampere's fitted 1.0) and per-generation memory efficiencies (0.41 against 0.48 of the bandwidth)
BAND = 1.25


@pytest.fixture(scope="module")
def networks() -> dict:
    """{name: (layer profile, batch)}: profiled once per module at the profiler's own small batch; the cost model
    prices them at any batch from per-sample counts."""
    from cptsim.calibration.gpu import resnet50_profile
    from cptsim.measure.profiler import LayerProfile, profile_named_model

    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    from gpu_zoo_profiles import load_profiles

    zoo = load_profiles()
    return {
        "resnet20-cifar": (profile_named_model("resnet20", (3, 32, 32), 10), 128),
        "mobilenet_v3_small-cifar": (profile_named_model("torchvision:mobilenet_v3_small", (3, 32, 32), 10), 128),
        "resnet50-imagenet": (resnet50_profile(ROOT / "tests" / "data" / "imagenet-resnet50-profile.json"), 128),
        "vit_small-imagenet": (LayerProfile.from_json(zoo["vit_small_patch16_224"]["profile"]), 128),
        "transformer-lm": (profile_named_model("transformer-lm", (35,), 10000), 64),
        "lstm-lm": (profile_named_model("lstm-lm:layers=2,hidden=256", (35,), 10000), 64),
        "gcn": (profile_named_model("gcn", (1000, 128), 16, graph_edges=5000), 1),
    }


def step_seconds(hw, prof, batch: int, schedule: str) -> float:
    return float(estimate(prof, parse_schedule(schedule), hw, steps=1, batch_size=batch,
                          per_layer=False).latency_s["total"])


def scaled(hw, rate: float = 1.0, bandwidth: float = 1.0, launch: float = 1.0, sms: float = 1.0):
    """A copy of GPU profile ``hw`` with every tier's peak x ``rate`` x ``sms`` (``sms`` < 1: fewer SMs at the same
    per-SM rate), bandwidth x ``bandwidth``, boost clock x ``rate``, per-launch times x ``launch``."""
    params = {**hw.params, "tiers": [{**t, "peak_ops": t["peak_ops"] * rate * sms} for t in hw.params["tiers"]],
              "bandwidth_gb_s": hw.params["bandwidth_gb_s"] * bandwidth}
    if params.get("boost_clock_mhz") is not None:
        params["boost_clock_mhz"] = params["boost_clock_mhz"] * rate
    if params.get("sm_count") is not None and sms != 1.0:
        params["sm_count"] = max(1, int(round(params["sm_count"] * sms)))
        # the tiers keep their per-SM rate exactly at the rounded count
        k = params["sm_count"] / hw.params["sm_count"]
        params["tiers"] = [{**t, "peak_ops": t["peak_ops"] * rate * k} for t in hw.params["tiers"]]
    cal = dict(hw.calibration)
    for key in ("kernel_overhead_us", "host_overhead_us", "host_conv_overhead_us"):
        if cal.get(key) is not None:
            cal[key] = cal[key] * launch
    return dataclasses.replace(hw, params=params, calibration=cal)


# -- domination on the profiles' numbers --------------------------------------------------------------------------

# the rates of one SM or one thread block: a small kernel that leaves SMs idle runs at these, so an older card with a
# higher clock (a T4's 1590 MHz against an A100's 1410) may rightly win it; and the NCHW layout transforms, priced per
# byte on Hopper (measured per call) but folded into Ampere's fitted nchw_conv_factor: two forms of one cost, not
# comparable constant by constant. The datasheet pairs are checked on the networks for these.
PER_UNIT = ("per SM", "batch norm rows", "nchw transform")


def _rates(hw) -> dict:
    """Every rate the time model prices with (higher = faster), and every time it charges (lower = faster)."""
    def const(k):
        return hw.kernel_constant(k) if hw.shape_model else 0.0

    bw = hw._bandwidth * hw._meff
    fast = {"bandwidth": bw}
    for b in WIDTHS:
        for mm in (False, True):
            i = int(hw.tier_index(np.array(b), np.array(b), np.array(mm)))
            r = hw._tier_mac_rate[i] * hw._tier_eff[i] * hw._ceff
            fast[f"tier {b} {'matmul' if mm else 'conv'}"] = r
            if hw.shape_model:
                fast[f"tier {b} {'matmul' if mm else 'conv'} per SM"] = r / float(hw.params["sm_count"])
                if not mm:
                    fast[f"tier {b} conv nchw"] = r * (const("nchw_conv_factor") if hw._tier_names[i] != "fp32"
                                                       else 1.0)
    if "fp32" in hw._tier_names:
        j = hw._tier_names.index("fp32")
        fast["cuda cores"] = hw._tier_mac_rate[j] * hw._tier_eff[j] * hw._ceff
    if hw.shape_model:
        fp32 = hw._tier_mac_rate[hw._tier_names.index("fp32")] if "fp32" in hw._tier_names else \
            hw._tier_mac_rate[hw._fp32_index]
        sms, clock = float(hw.params["sm_count"]), float(hw.params.get("boost_clock_mhz") or 0.0)
        fast.update({
            "depthwise": fp32 * const("depthwise_efficiency"),
            "depthwise nchw": fp32 * const("depthwise_efficiency") * const("nchw_depthwise_factor"),
            "depthwise bytes": hw._bandwidth * const("depthwise_memory_efficiency"),
            "norm bytes": hw._bandwidth * const("norm_memory_efficiency"),
            "nchw norm elements": sms * clock * const("nchw_norm_elements_per_clock"),
            "nchw batch norm rows": clock * const("nchw_norm_rows_per_clock"),
            "nchw batch norm rows bwd": clock * const("nchw_norm_backward_rows_per_clock"),
            "nchw batch norm channels": sms * const("nchw_norm_channels_per_sm"),
            "1/n0": 1.0 / max(const("gemm_n0"), 1e-9), "1/k0": 1.0 / max(const("gemm_k0"), 1e-9)})
    fast["1/launch"] = 1.0 / max(hw.kernel_overhead_s, 1e-12)
    if hw.shape_model:
        fast["nchw transform"] = hw._bandwidth / max(const("nchw_transform_bytes"), 1e-12)
    eff = hw.calibration.get("attention_efficiency")
    fast["attention"] = 0.6 if eff is None else float(eff)  # a factor on the tier rate above
    return fast


def dominates(a, b, per_unit: bool = True) -> list[str]:
    """The rates where GPU profile ``a`` is slower than ``b`` (empty: ``a`` dominates ``b``); without ``per_unit``,
    the whole GPU's rates only (``PER_UNIT`` left out). Both must price by shape or neither (one model against the
    other is no comparison of hardware)."""
    if a.shape_model != b.shape_model:
        return ["shape model on one only"]
    ra, rb = _rates(a), _rates(b)
    return [k for k in rb if (per_unit or not any(u in k for u in PER_UNIT))
            and (k not in ra or ra[k] < rb[k] * (1 - 1e-9))]


@pytest.mark.parametrize("faster,slower", DATASHEET_PAIRS)
def test_the_datasheet_pairs_dominate_on_the_profiles_numbers_and_are_priced_in_order(faster, slower, networks):
    """Every whole-GPU rate at least as high, the launch time no longer; a few per-SM or per-clock rates of the
    slower card may be higher (``PER_UNIT``), so this is checked on the networks, not implied."""
    a, b = load_profile(faster), load_profile(slower)
    bad = dominates(a, b, per_unit=False)
    assert not bad, f"{faster} is slower than {slower} in: {bad}"
    bad = _check_order(networks, a, b, f"{faster} over {slower}")
    assert not bad, bad


def _check_order(nets, fast, slow, label) -> list[str]:
    bad = []
    for name, (prof, batch) in nets.items():
        for s in SCHEDULES:
            tf, ts = step_seconds(fast, prof, batch, s), step_seconds(slow, prof, batch, s)
            if tf > ts * (1 + 1e-9):
                bad.append(f"{label} {name} {s}: {tf * 1e3:.3f} ms on the faster, {ts * 1e3:.3f} ms on the slower")
    return bad


@pytest.mark.parametrize("gpu", GPUS)
def test_a_slower_copy_of_every_profile_is_never_priced_faster(gpu, networks):
    hw = load_profile(gpu)
    variants = {"rates x0.7": scaled(hw, rate=0.7), "bandwidth x0.7": scaled(hw, bandwidth=0.7),
                "launch x1.5": scaled(hw, launch=1.5), "all": scaled(hw, 0.6, 0.6, 2.0)}
    if hw.shape_model:
        variants["3/4 of the SMs"] = scaled(hw, sms=0.75)
    bad = []
    for label, slow in variants.items():
        assert not dominates(hw, slow), (label, dominates(hw, slow))  # built no faster in any rate
        bad += _check_order(networks, hw, slow, label)
    assert not bad, bad


def test_every_dominating_pair_of_shipped_profiles_is_priced_in_order(networks):
    profiles = {n: load_profile(n) for n in GPUS}
    pairs = [(a, b) for a, b in itertools.permutations(GPUS, 2) if not dominates(profiles[a], profiles[b])]
    assert ("h200", "h100") in pairs  # the same chip with faster memory
    bad = []
    for a, b in pairs:
        bad += _check_order(networks, profiles[a], profiles[b], f"{a} over {b}")
    assert not bad, bad


def test_the_cases_that_were_out_of_order_are_in_order(networks):
    """mobilenet_v3_small on CIFAR (batch 128, the cost command's default CPT schedule) was priced 9.25 ms on the H100,
    5.04 ms on a T4 and 3.97 ms on an RTX 3090; resnet20 at static:32, 3.66 ms on the A100 and 5.03 on the H100."""
    prof, batch = networks["mobilenet_v3_small-cifar"]
    cpt = {g: step_seconds(load_profile(g), prof, batch, "static:8") for g in ("h100", "t4", "rtx3090")}
    assert cpt["h100"] < cpt["rtx3090"] and cpt["h100"] < cpt["t4"], cpt
    prof, batch = networks["resnet20-cifar"]
    r20 = {g: step_seconds(load_profile(g), prof, batch, "static:32") for g in ("h100", "a100")}
    assert r20["h100"] < r20["a100"], r20


def datasheet_ratio_band(a, b, bits: int) -> tuple[float, float]:
    """(low, high) of a step's speed-up of ``a`` over ``b`` that the datasheets allow: between the smallest and the
    largest ratio of the three resources a step's kernels are bound by -- the peak of the tier ``bits``-wide
    convolutions run on, DRAM bandwidth, and SMs x boost clock (NCHW batch norms, small kernels) -- each side
    widened by ``BAND``."""
    def peak(hw):
        i = int(hw.tier_index(np.array(bits), np.array(bits)))
        return hw.params["tiers"][i]["peak_ops"]

    def sm_clock(hw):
        return hw.params["sm_count"] * hw.params["boost_clock_mhz"]

    ratios = (a.params["bandwidth_gb_s"] / b.params["bandwidth_gb_s"], peak(a) / peak(b), sm_clock(a) / sm_clock(b))
    return min(ratios) / BAND, max(ratios) * BAND


@pytest.mark.parametrize("bits", [16, 32])
def test_resnet50_step_ratios_between_gpus_follow_the_datasheets(bits, networks):
    prof, batch = networks["resnet50-imagenet"]
    shaped = [n for n in GPUS if load_profile(n).shape_model]
    times = {n: step_seconds(load_profile(n), prof, batch, f"static:{bits}") for n in shaped}
    bad = []
    for a, b in itertools.combinations(shaped, 2):
        lo, hi = datasheet_ratio_band(load_profile(a), load_profile(b), bits)
        r = times[b] / times[a]
        if not lo <= r <= hi:
            bad.append(f"{a}/{b} at {bits} bits: speed-up {r:.2f}, datasheets allow {lo:.2f}..{hi:.2f}")
    assert not bad, bad

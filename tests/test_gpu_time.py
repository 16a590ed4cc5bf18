"""The GPU time and energy model (issue 11): per-op step time calibrated on published training throughput."""

import json
from pathlib import Path

import numpy as np
import pytest

from cptsim.cost.model import estimate, step_ops_cost
from cptsim.calibration.gpu import resnet50_profile
from cptsim.cost.hardware import load_profile
from cptsim.measure.profiler import LayerProfile
from cptsim.cost.schedules import parse_schedule

DATA = Path(__file__).parent / "data" / "imagenet-resnet50-profile.json"
GPUS = ["a100", "v100", "h100", "t4", "rtx4090"]


@pytest.fixture(scope="module")
def r50():
    return resnet50_profile(DATA)


def _datasheet_bench():
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"))
    import bench_gpu_datasheet as B

    return B


def test_published_resnet50_throughput_is_predicted_from_the_datasheet_profiles(r50):
    """Issue 23: a100, v100 and rtx4090 are written from their datasheets with Ampere's fitted constants, so every
    published row is a held-out check (benchmarks/gpu/bench_gpu_datasheet.py). NVIDIA's rows are priced as they ran
    (AMP in NHWC). Each profile's [validation] is what the check gives today: a change to the model that moves a
    prediction fails here until the check is re-run (--write)."""
    import copy

    B = _datasheet_bench()
    rows = B.table(r50)
    by = {(r["gpu"], r["source"], r["precision"]): r for r in rows}
    # NVIDIA's A100 rows within 10% (the bar); every row within 25%
    assert abs(by["a100", "nvidia", "TF32"]["error"]) <= 0.10 and abs(by["a100", "nvidia", "AMP"]["error"]) <= 0.10
    assert all(abs(r["error"]) <= 0.25 for r in rows), [(r["gpu"], r["precision"], r["error"]) for r in rows]
    for gpu, s in B.per_gpu(rows).items():
        if gpu not in B.DATASHEET:
            continue
        v = load_profile(gpu).validation
        assert v["held_out"] == "yes" and v["n"] == s["n"], gpu
        assert v["median_abs_error"] == pytest.approx(s["median_abs_error"], abs=0.005), gpu
        assert v["worst_abs_error"] == pytest.approx(s["worst_abs_error"], abs=0.005), gpu
    assert not load_profile("t4").validation  # nothing published to check it on: its times say so
    # the check prices exactly what estimate prices (the fit's fast path)
    row = B.ROWS[1]
    prof = copy.copy(r50)
    prof.channels_last = row.channels_last
    c = estimate(prof, parse_schedule("static:16:g16"), load_profile(row.gpu), steps=1, batch_size=row.batch,
                 per_layer=False)
    assert B.predicted_img_s(r50, row) == pytest.approx(row.batch / c.latency_s["total"], rel=1e-9)


@pytest.mark.parametrize("name", GPUS)
def test_gpu_parameters_are_physically_plausible(name):
    p = load_profile(name)
    assert all(0 < t["efficiency"] <= 1 for t in p.params["tiers"])
    assert 0 < p.calibration["memory_efficiency"] <= 1
    assert 0.5 <= p.calibration["kernel_overhead_us"] <= 50  # microseconds, not ms
    assert 0 < p.idle_power_w < p.busy_power_w


def test_no_per_model_factor_the_same_profile_costs_every_network(r50):
    # Only the profile's numbers enter: two workloads on one GPU share every parameter, and a step's time is the
    # sum of GEMMs, memory-bound ops and launches, each growing with the work.
    a100 = load_profile("a100")
    sched = parse_schedule("static:16")
    small = estimate(r50, sched, a100, steps=1, batch_size=32).latency_s["total"]
    big = estimate(r50, sched, a100, steps=1, batch_size=256).latency_s["total"]
    assert 4 < big / small < 8  # sub-linear: launches and fixed traffic do not grow with the batch


def test_the_op_list_adds_memory_bound_work_and_launches_to_the_gemms(r50):
    a100 = load_profile("a100")
    old = LayerProfile.from_json({**{k: v for k, v in r50.to_json().items() if k != "ops"},
                                  "format": "cptsim.profile/1"})
    sched = parse_schedule("static:32")
    gemms = estimate(old, sched, a100, steps=1, batch_size=256).latency_s["total"]
    whole = estimate(r50, sched, a100, steps=1, batch_size=256).latency_s["total"]
    t, _ = step_ops_cost(r50.arrays(), a100, 32, 8, 256)
    assert whole == pytest.approx(gemms + t.sum(), rel=1e-9)
    # ResNet-50's BN/ReLU/adds are a large share of a step (gpu-throughput.md): in an NCHW FP32 step on an A100
    # the shape model gives ~0.7 (its NCHW norms run at the SMs' element rate, far below DRAM bandwidth)
    assert 0.3 < t.sum() / whole < 0.8


def test_amp_stores_activations_at_16_bits_and_fp32_master_weights():
    import dataclasses

    # the roofline form (a profile without an SM count): every op's bytes at one bandwidth
    shaped = load_profile("a100")
    a100 = dataclasses.replace(shaped, params={**shaped.params, "sm_count": None})
    assert not a100.shape_model
    ops = resnet50_profile(DATA).ops
    s = ops.summary()
    t32, _ = a100.step_ops_cost(ops, np.array([32]), np.array([8]), np.array([1000.0]))
    t16, _ = a100.step_ops_cost(ops, np.array([16]), np.array([8]), np.array([1000.0]))
    bw = a100.params["bandwidth_gb_s"] * 1e9 * a100.calibration["memory_efficiency"]
    want = (s["fwd"]["bytes_per_sample"] * 1000 / 2 + s["fwd"]["bytes_fixed"]) / bw + \
        s["fwd"]["launches"] * a100.kernel_overhead_s
    assert t16[0, 0] == pytest.approx(want, rel=1e-12)
    assert t16[0, 2] == t32[0, 2]  # the optimizer's traffic is FP32 master weights either way


def test_tiny_model_step_is_launch_bound_on_an_h100():
    from cptsim.cli.profile_cmd import build_profile

    prof = build_profile("digits-cnn", (1, 8, 8), 10, None)
    h100 = load_profile("h100")
    c = estimate(prof, parse_schedule("cpt"), h100, steps=345, batch_size=64)
    launches = prof.ops.totals()["launches"]
    per_step = c.latency_s["total"] / 345
    assert per_step >= launches * h100.kernel_overhead_s
    assert per_step < 2 * launches * h100.kernel_overhead_s  # the kernels themselves are tiny


def test_gpu_energy_lies_between_idle_and_board_power(r50):
    for name in ("a100", "h100"):
        p = load_profile(name)
        c = estimate(r50, parse_schedule("static:16"), p, steps=2, batch_size=64)
        t, e = c.latency_s["total"], c.energy_j["total"]
        assert p.idle_power_w * t < e < p.busy_power_w * t
    # a launch-bound step spends most of its time waiting: its average power is close to idle
    from cptsim.cli.profile_cmd import build_profile

    prof = build_profile("digits-cnn", (1, 8, 8), 10, None)
    h = load_profile("h100")
    c = estimate(prof, parse_schedule("static:16"), h, steps=10, batch_size=8)
    assert c.energy_j["total"] / c.latency_s["total"] < 0.5 * (h.idle_power_w + h.busy_power_w)


def test_planner_step_tables_include_the_gpu_op_time(r50):
    from cptsim.planner.evaluate import step_cost_tables

    a100 = load_profile("a100")
    tables = step_cost_tables(r50.arrays(), a100, [4, 8], [8], [64])
    for q in (4, 8):
        c = estimate(r50, {"batch_size": [64], "bits": [q], "grad_bits": [8]}, a100)
        assert tables["latency_s"][0, q, 8] == pytest.approx(c.latency_s["total"], rel=1e-9)
        assert tables["energy_j"][0, q, 8] == pytest.approx(c.energy_j["total"], rel=1e-9)


def test_shipped_profile_fixture_is_format_2_with_ops():
    d = json.loads(DATA.read_text())
    assert d["format"] == "cptsim.profile/2" and d["ops"]["records"]


def test_cost_and_profile_show_samples_per_second_and_time_per_epoch():
    from cli_util import run_cli

    r = run_cli("cost", "--schedule", "static:16", "--epochs", "2", "--batch-size", "64", "--hw", "h100,bitfusion",
                "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    n = doc["workload"]["dataset_size"]
    for row in doc["profiles"]:
        s = row["throughput"]
        assert s["samples_per_s"] == pytest.approx(row["samples"] / row["latency_s"]["total"])
        assert s["epoch_samples"] == n and s["epoch_s"] == pytest.approx(n / s["samples_per_s"])
    table = run_cli("cost", "--schedule", "static:16", "--steps", "10", "--hw", "h100,a100")
    assert table.exit_code == 0 and "samples/s" in table.stdout and "time/epoch" in table.stdout

    r = run_cli("profile", "--hw", "a100", "--batch-size", "32", "--json")
    assert r.exit_code == 0, r.output
    step = json.loads(r.stdout)["step"]
    assert step["throughput"]["samples_per_s"] == pytest.approx(32 / step["latency_s"]["total"])
    assert step["throughput"]["epoch_s"] > 0
    assert "samples/s" in run_cli("profile", "--hw", "a100").stdout


# ---------------------------------------------------------------------------------------------- issue 23, item 7

PROFILES = Path(__file__).resolve().parents[1] / "hw_profiles"


def _toml_tiers(name):
    import tomllib

    doc = tomllib.loads((PROFILES / f"{name}.toml").read_text())
    return {t["name"]: t for t in doc["gpu"]["tiers"]}, doc["gpu"]


def _one_conv_one_linear(macs=10**9):
    """A hand-made profile: one convolution and one Linear layer of ``macs`` MACs per sample each, 1 element
    of every tensor (compute-bound: the roofline is the MAC rate)."""
    layer = {"quantized": True, "macs": {"fwd": macs, "dgrad": macs, "wgrad": macs},
             "numel": {"weight": 1, "input": 1, "output": 1}, "calls": 1}
    return LayerProfile.from_json({"format": "cptsim.profile/1", "model": "hand", "input_shape": [1],
                                   "layers": [{"name": "conv", "type": "Conv2d", **layer},
                                              {"name": "fc", "type": "Linear", **layer}]})


def test_fp32_convs_price_on_cudnn_tf32_and_fp32_matmuls_on_strict_fp32_as_pytorch_defaults_say():
    import torch

    # PyTorch's own defaults (a process that changed neither): cuDNN may use TF32, cuBLAS matmuls may not
    assert torch.backends.cudnn.allow_tf32 is True
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert torch.get_float32_matmul_precision() == "highest"
    tiers, _ = _toml_tiers("a100")
    rate = {n: t["peak_ops"] * 1e12 / 2 * t.get("efficiency", 1.0) for n, t in tiers.items()}
    macs = 10**9
    c = estimate(_one_conv_one_linear(macs), parse_schedule("static:32:g32"), load_profile("a100"), steps=1,
                 batch_size=1)
    conv, fc = (row["latency_s"] for row in c.per_layer)
    assert conv["fwd"] == pytest.approx(macs / rate["tf32"], rel=1e-9)
    assert fc["fwd"] == fc["dgrad"] == fc["wgrad"] == pytest.approx(macs / rate["fp32"], rel=1e-9)
    # a run that allowed TF32 matmuls prices its Linear layers as its convolutions
    c = estimate(_one_conv_one_linear(macs), parse_schedule("static:32:g32"),
                 load_profile("a100").allow_tf32_matmul(), steps=1, batch_size=1)
    assert c.per_layer[1]["latency_s"]["fwd"] == pytest.approx(macs / rate["tf32"], rel=1e-9)
    # below 32 bits nothing changes: an FP16 Linear runs on the fp16 tier
    c = estimate(_one_conv_one_linear(macs), parse_schedule("static:16:g16"), load_profile("a100"), steps=1,
                 batch_size=1)
    assert c.per_layer[1]["latency_s"]["fwd"] == pytest.approx(c.per_layer[0]["latency_s"]["fwd"], rel=1e-9)


def test_the_layer_profile_and_the_counted_step_say_which_gemms_are_matmuls():
    import torch
    from cptsim.measure.profiler import MacCounter
    from cptsim.models import create_model

    m = create_model("transformer-lm", num_classes=50, in_channels=1, input_shape=(8,))
    with MacCounter(m) as counter:
        m(m.example_input(2, (8,), torch.device("cpu"))).sum().backward()
        step = counter.step_arrays()
    assert step.matmul.all() and len(step.matmul) > 3   # Linear and attention Matmul layers only
    a = _one_conv_one_linear().arrays()
    assert a.matmul.tolist() == [False, True]


def test_train_records_the_tf32_flags_the_run_had_in_config_json(tmp_path):
    import torch
    from cli_util import run_cli

    r = run_cli("train", "--model", "digits-cnn", "--dataset", "digits", "--steps", "2", "--batch-size", "8",
                "--out", tmp_path / "run", "--quiet", "--recal-batches", "0")
    assert r.exit_code == 0, r.output
    host = json.loads((tmp_path / "run" / "config.json").read_text())["host"]
    assert host["torch.backends.cuda.matmul.allow_tf32"] is torch.backends.cuda.matmul.allow_tf32 is False
    assert host["torch.backends.cudnn.allow_tf32"] is torch.backends.cudnn.allow_tf32 is True
    assert {"machine", "threads", "quantizers"} <= set(host)   # the keys it had before


@pytest.mark.parametrize("name", GPUS)
def test_allowing_tf32_never_prices_an_fp32_gemm_slower_than_the_files_own_fp32_tier(name):
    # cuDNN and cuBLAS, allowed TF32, still pick an FP32 kernel where it is faster. Checked on the TOML's own
    # numbers: peak x efficiency of the tier FP32 convolutions run on against the strict FP32 tier's, and two
    # 32-bit tiers of one peak (RTX 4090: TF32 82.6 = FP32 82.6 TFLOPS, Ada whitepaper) at one efficiency.
    tiers, gpu = _toml_tiers(name)
    rate = {n: t["peak_ops"] * t.get("efficiency", 1.0) for n, t in tiers.items() if t["bits"] == 32}
    p = load_profile(name)
    assert rate[p.params["fp32_tier"]] >= rate[p.params["fp32_matmul_tier"]]
    assert p.params["fp32_matmul_tier"] == "fp32"   # PyTorch's default: strict FP32 matmuls
    wide = [t for t in tiers.values() if t["bits"] == 32]
    for a in wide:
        for b in wide:
            if a["peak_ops"] == b["peak_ops"]:
                assert a.get("efficiency", 1.0) == b.get("efficiency", 1.0), (a["name"], b["name"])


@pytest.mark.parametrize("name", ["a100", "v100", "t4", "rtx4090"])
def test_a_datasheet_profile_holds_its_datasheet_and_amperes_fit_and_nothing_fitted_to_it(name):
    # provenance: every shipped GPU profile uses the shape model; these four give their datasheet's peaks, SM count
    # and boost clock, and take the rest from the Ampere fit (fit_gpu_model.py --write keeps them equal)
    p, r3090 = load_profile(name), load_profile("rtx3090")
    assert p.shape_model and p.params["boost_clock_mhz"] > 0
    # the boost clock is the one the FP32 peak is quoted at: SMs x FP32 lanes (64 or 128 per SM) x 2 x clock
    tiers, _ = _toml_tiers(name)
    fp32 = tiers["fp32"]["peak_ops"] * 1e12
    lanes = fp32 / (p.params["sm_count"] * 2 * p.params["boost_clock_mhz"] * 1e6)
    assert min(abs(lanes - 64), abs(lanes - 128)) < 0.01 * lanes, lanes
    assert {t["efficiency"] for t in tiers.values()} == {r3090.params["tiers"][2]["efficiency"]}
    assert p.calibration["memory_efficiency"] == r3090.calibration["memory_efficiency"]
    for k in ("gemm_n0", "gemm_k0", "nchw_norm_elements_per_clock", "depthwise_efficiency", "nchw_conv_factor"):
        assert p.calibration.get(k) is None and p.kernel_constant(k) == pytest.approx(r3090.calibration[k], rel=1e-3)


# ---------------------------------------------------------------------------------------------- AMP means AMP


def test_autocast_runs_the_layers_cptsim_keeps_full_precision_in_low_precision_too():
    # PyTorch's own autocast (on the CPU: bfloat16) casts every conv and linear layer, whatever cptsim calls them
    import torch
    from cptsim.models import create_model, default_fp_layers

    m = create_model("resnet20", 10, 3)
    kept = default_fp_layers(m)
    assert kept   # cptsim's convention keeps some layers (the classifier) at full precision
    seen = {}
    for name, mod in m.named_modules():
        if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear)):
            mod.register_forward_hook(lambda mod, i, o, name=name: seen.__setitem__(name, o.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        m(torch.randn(2, 3, 32, 32))
    assert set(seen.values()) == {torch.bfloat16}
    assert all(any(n == k or n.startswith(k) for n in seen) for k in kept)


def test_under_static_16_a_gpu_runs_the_full_precision_layers_on_the_fp16_tier_bitops_unchanged():
    tiers, _ = _toml_tiers("a100")
    fp16 = tiers["fp16"]["peak_ops"] * 1e12 / 2 * tiers["fp16"]["efficiency"]
    macs = 10**9
    prof = LayerProfile.from_json({**_one_conv_one_linear(macs).to_json(), "format": "cptsim.profile/1"})
    for r in prof.layers:
        r.quantized = False   # both kept at full precision, as a stem and a classifier
    c = estimate(prof, parse_schedule("static:16"), load_profile("a100"), steps=1, batch_size=1)
    for row in c.per_layer:
        assert row["latency_s"]["fwd"] == pytest.approx(macs / fp16, rel=1e-9)   # compute-bound at the FP16 rate
        assert row["bitops"]["fwd"] == macs * 32 * 32                             # BitOPs: still 32 x 32
    # a 32-bit step leaves them on the 32-bit tiers; other kinds of hardware are not autocast
    c32 = estimate(prof, parse_schedule("static:32"), load_profile("a100"), steps=1, batch_size=1)
    assert c32.per_layer[0]["latency_s"]["fwd"] == pytest.approx(2 * c.per_layer[0]["latency_s"]["fwd"])  # TF32
    bf = estimate(prof, parse_schedule("static:16"), load_profile("bitfusion"), steps=1, batch_size=1)
    bf32 = estimate(prof, parse_schedule("static:32"), load_profile("bitfusion"), steps=1, batch_size=1)
    assert bf.latency_s["total"] == bf32.latency_s["total"]


def test_nvidias_amp_rows_with_default_flags(r50):
    # AMP means AMP: cptsim's default full-precision layers run FP16 too. The A100 (Ampere, the generation the
    # constants were fitted on) within 10%; the V100 (Volta, priced from its datasheet with Ampere's constants)
    # within 15% -- benchmarks/results/gpu-datasheet-resnet50.txt
    assert not all(layer.quantized for layer in r50.layers)   # the shipped profile has cptsim's default fp layers
    B = _datasheet_bench()
    amp = {r.gpu: r for r in B.ROWS if r.source == "nvidia" and r.precision == "AMP"}
    assert amp["a100"].channels_last and amp["v100"].channels_last  # NVIDIA ran its AMP configurations in NHWC
    assert B.predicted_img_s(r50, amp["a100"]) == pytest.approx(amp["a100"].img_s, rel=0.10)
    assert B.predicted_img_s(r50, amp["v100"]) == pytest.approx(amp["v100"].img_s, rel=0.15)


def test_cost_help_says_amp_means_amp():
    from cli_util import run_cli

    text = " ".join(run_cli("cost", "--help").stdout.split())
    assert "autocast" in text and "full-precision layers" in text and "BitOPs" in text


def test_language_models_are_priced_against_published_throughput():
    """Issue 23 item 6: benchmarks/gpu/bench_gpu_lm.py prices cptsim's transformer-lm and lstm-lm stand-ins for
    Transformer-XL base and GNMT on every shipped GPU profile (its cached step counts ship with it); the stand-ins
    do the published networks' work per token (within 5%), and every row prices to a finite, positive rate."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"))
    import bench_gpu_lm as B

    assert B.CACHE.is_file()  # shipped: the test never profiles (minutes on a CPU)
    profs = B.profiles()
    per_token = {n: profs[n].totals()["fwd"] / s.seq for n, s in B.STANDINS.items()}
    assert per_token["txl-base"] == pytest.approx(66.9e6, rel=0.01)  # 16 x (4 x 512^2 + 2 x 512 x 2048 + ...) + head
    assert per_token["gnmt"] == pytest.approx(63.5e6, rel=0.05)      # GNMT's MACs per source or target token
    assert "attention" in profs["txl-base"].op_mix() and "lstm" in profs["gnmt"].op_mix()
    rows = B.table(profs)
    assert len(rows) == len(B.ROWS) and all(np.isfinite(r["modelled_tok_s"]) and r["modelled_tok_s"] > 0
                                            for r in rows)

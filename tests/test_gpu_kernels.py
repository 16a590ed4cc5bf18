"""The GPU shape model's pieces against hand counts (cptsim.cost.hardware.gpu_kernels)."""

from __future__ import annotations

import numpy as np
import pytest

from cptsim.cost.hardware import gpu_kernels as K


def test_wave_efficiency_by_hand():
    # 132 SMs: 132 tiles fill one wave; 133 need two waves, the second nearly empty
    assert K.wave_efficiency(132, 132) == 1.0
    assert K.wave_efficiency(133, 132) == pytest.approx(133 / 264)
    assert K.wave_efficiency(392, 132) == pytest.approx(392 / 396)
    assert K.wave_efficiency(1, 132) == pytest.approx(1 / 132)


def test_shape_efficiency_is_half_at_n0_and_at_k0():
    assert K.shape_efficiency(32, 1e12, 32, 64) == pytest.approx(0.5)
    assert K.shape_efficiency(1e12, 64, 32, 64) == pytest.approx(0.5)
    assert K.shape_efficiency(1e12, 1e12, 32, 64) == pytest.approx(1.0)


def test_phase_dims_of_a_conv_and_of_attentions_batched_matmul_by_hand():
    # a conv: 2 groups, 8 output columns and 36-deep per group, 64 output positions per sample; batch 4
    # attention's scores: 1 group, a 16 x 16 output 8 deep per GEMM, 16 rows per GEMM, 3 GEMMs per sample
    gemm = np.array([[2, 8, 36, 64, 0], [1, 16, 8, 48, 16]], dtype=float)
    count, m, n, k = K.phase_dims(gemm, np.array([4.0]))
    # conv: fwd 2 x (256 x 8 x 36); dgrad 2 x (256 x 36 x 8); wgrad 2 x (8 x 36 x 256)
    assert count[0, 0].tolist() == [2, 2, 2]
    assert m[0, 0].tolist() == [256, 256, 8]
    assert n[0, 0].tolist() == [8, 36, 36]
    assert k[0, 0].tolist() == [36, 8, 256]
    # scores: 12 GEMMs of 16 rows per phase, each with the same MACs as the forward
    assert count[0, 1].tolist() == [12, 12, 12]
    assert m[0, 1].tolist() == [16, 16, 16]
    for phase in range(3):
        assert count[0, :, phase] @ (m[0, :, phase] * n[0, :, phase] * k[0, :, phase]) == pytest.approx(
            4 * (gemm[:, 0] * gemm[:, 1] * gemm[:, 2] * gemm[:, 3]).sum())


def test_a_large_gemm_runs_at_the_tiers_rate_and_memory_bound_at_the_bandwidth():
    # one 8192 x 8192 x 8192 linear layer (rows = 8192 at one sample), n0 = k0 = 0: the tier's rate exactly
    gemm = np.array([[1, 8192, 8192, 8192, 0]], dtype=float)
    macs = np.full((1, 1, 3), 8192.0 ** 3)
    rate = np.full((1, 1, 3), 100e12)
    t = K.gemm_times(gemm, np.array([False]), macs, np.array([1.0]), rate, np.ones((1, 1, 3), bool), 1e12,
                     np.zeros((1, 1, 3)), 1e12, 132, {"gemm_n0": 0.0, "gemm_k0": 0.0})
    waves = K.wave_efficiency(64 * 64, 132)  # 4096 tiles over 132 SMs
    assert t[0, 0, 0] == pytest.approx(8192.0 ** 3 / (100e12 * waves))
    # the same layer with 1 TB of traffic is bound by its bytes
    t = K.gemm_times(gemm, np.array([False]), macs, np.array([1.0]), rate, np.ones((1, 1, 3), bool), 1e12,
                     np.full((1, 1, 3), 1e12), 1e12, 132, {"gemm_n0": 0.0, "gemm_k0": 0.0})
    assert t[0, 0, 0] == pytest.approx(1.0)


def test_a_depthwise_conv_runs_on_cuda_cores_and_nchw_costs_convs_only():
    dw = np.array([[96, 1, 9, 3136, 0]], dtype=float)
    assert K.is_depthwise(dw).tolist() == [True]
    macs = np.full((1, 1, 3), 96 * 9 * 3136 * 128.0)
    consts = {"depthwise_efficiency": 0.1, "nchw_depthwise_factor": 0.5, "depthwise_memory_efficiency": 0.5}
    t = K.gemm_times(dw, np.array([True]), macs, np.array([128.0]), np.full((1, 1, 3), 1e15),
                     np.ones((1, 1, 3), bool), 20e12, np.zeros((1, 1, 3)), 1e12, 132, consts, channels_last=True)
    assert t[0, 0, 0] == pytest.approx(macs[0, 0, 0] / (20e12 * 0.1))
    t_nchw = K.gemm_times(dw, np.array([True]), macs, np.array([128.0]), np.full((1, 1, 3), 1e15),
                          np.ones((1, 1, 3), bool), 20e12, np.zeros((1, 1, 3)), 1e12, 132, consts)
    assert t_nchw[0, 0, 0] == pytest.approx(2 * t[0, 0, 0])
    # a linear layer is not a convolution: NCHW does not change it
    lin = np.array([[1, 768, 768, 197, 0]], dtype=float)
    args = (np.full((1, 1, 3), 768 * 768 * 197 * 64.0), np.array([64.0]), np.full((1, 1, 3), 100e12),
            np.ones((1, 1, 3), bool), 20e12, np.zeros((1, 1, 3)), 1e12, 132, {"nchw_conv_factor": 0.5})
    assert np.allclose(K.gemm_times(lin, np.array([False]), *args),
                       K.gemm_times(lin, np.array([False]), *args[:-1], args[-1], channels_last=True))


def test_fused_attention_is_counted_by_its_macs_and_priced_on_the_gpu():
    """A fused scaled-dot-product attention kernel is no module, so no layer holds its MACs: the op counter counts
    them (fwd: 2 T^2 d per head by hand; bwd: flop_counter's 2.5x) and the GPU model prices them."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from cptsim.cost.hardware import load_profile
    from cptsim.measure.opcount import count_step_ops

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(32, 96)
            self.fc = nn.Linear(32, 5)

        def forward(self, x):  # (B, T=10, 32), 4 heads of 8
            q, k, v = self.qkv(x).view(x.shape[0], 10, 3, 4, 8).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(x.shape[0], 10, 32)
            return self.fc(y.mean(1))

    s = count_step_ops(Attn(), torch.randn(2, 10, 32)).summary()
    fwd = 2 * 10 * 10 * 8 * 4  # scores and weighted values, per head, per sample
    assert s["fwd"]["attention_macs_per_sample"] == fwd
    assert s["bwd"]["attention_macs_per_sample"] == 2.5 * fwd
    hw = load_profile("h100")
    t = hw._attention_time(s, 32, np.array([16]), np.array([16]), np.array([1024]))
    assert t.shape == (1, 3) and t[0, 0] > 0 and t[0, 1] > t[0, 0] and t[0, 2] == 0


def test_launch_bound_by_hand():
    from cptsim.cost.hardware.gpu import launch_bound

    lb = launch_bound(268, 41e-6, 5e-3)  # resnet20's counted launches x the H100 host's 41 us vs 5 ms of GPU work
    assert lb["host_step_s"] == pytest.approx(268 * 41e-6)
    assert lb["bound"] == "launch (host)" and lb["eager_step_s"] == pytest.approx(268 * 41e-6)
    assert lb["cuda_graphs_saving"] == pytest.approx(1 - 5e-3 / (268 * 41e-6))
    gpu_bound = launch_bound(268, 41e-6, 0.1)
    assert gpu_bound["bound"] == "GPU" and gpu_bound["cuda_graphs_saving"] == 0.0


def test_a_profiles_validation_says_how_sure_its_times_are_and_whether_it_covered_the_op_mix(tmp_path):
    from cptsim.cost.hardware import load_profile
    from cptsim.errors import InputError

    r3090 = load_profile("rtx3090")  # checked on timm's CNN / ViT / MLP tables: no LSTM among them
    v = r3090.time_validation(["conv", "lstm"])
    assert v["checked"] and 0 < v["median_abs_error"] <= v["worst_abs_error"]
    assert v["op_mix_covered"] is False and v["op_mix_missing"] == ["lstm"]
    assert r3090.time_validation(["conv"])["op_mix_covered"] is True
    assert load_profile("h100").time_validation(["conv", "lstm", "graph"])["op_mix_covered"] is True  # held out
    assert load_profile("t4").time_validation(["conv"])["checked"] is False  # no [validation]: it says so
    bad = (tmp_path / "x.toml")
    text = (load_profile("h100").path and open(load_profile("h100").path).read())
    bad.write_text(text.replace('name = "h100"', 'name = "x"').replace("n = 35", 'n = "many"'))
    with pytest.raises(InputError, match="validation.n"):
        load_profile(str(bad))


def test_cost_json_carries_the_validation_and_the_launch_bound():
    import json

    from cli_util import run_cli

    r = run_cli("cost", "--model", "resnet20", "--dataset", "cifar10", "--hw", "h100", "--batch-size", "16",
                "--steps", "1", "--schedule", "static:32", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    row = doc["profiles"][0]
    assert doc["workload"]["op_mix"] == ["conv"] and doc["workload"]["channels_last"] is False
    assert row["time_validation"]["checked"] and row["time_validation"]["op_mix_covered"]
    lb = row["launch_bound"]
    assert lb["bound"] == "launch (host)" and lb["eager_step_s"] > lb["gpu_step_s"]  # small convs, eager
    r = run_cli("cost", "--model", "resnet20", "--dataset", "cifar10", "--hw", "h100", "--batch-size", "16",
                "--steps", "1", "--schedule", "static:32")
    assert "CUDA graphs" in r.stdout and "median |error|" in r.stdout


def test_a_channels_last_plan_is_trained_in_channels_last_and_its_profile_says_so(tmp_path):
    """plan --channels-last records the memory format (it changes a GPU's time); train --plan follows it, a run
    asking for NCHW against it is refused, and the run's profile.json records the format report re-costs with."""
    import json

    from cli_util import run_cli

    plan = tmp_path / "p.json"
    r = run_cli("plan", "--budget", "65%", "--hw", "h100", "--channels-last", "--steps", "4", "--out", plan, "--quiet")
    assert r.exit_code == 0, r.output
    assert json.loads(plan.read_text())["workload"]["channels_last"] is True
    r = run_cli("train", "--plan", plan, "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    prof = json.loads((tmp_path / "run" / "profile.json").read_text())
    assert prof["memory_format"] == "channels_last"
    nchw = tmp_path / "nchw.json"
    assert run_cli("plan", "--budget", "65%", "--hw", "h100", "--steps", "4", "--out", nchw, "--quiet").exit_code == 0
    assert "channels_last" not in json.loads(nchw.read_text())["workload"]  # an NCHW plan keeps its old keys


def test_a_plan_less_runs_profile_has_the_op_list_so_its_report_prices_the_whole_gpu_step(tmp_path):
    """issue 25 item 6: the run's own profile.json records the step's op list; report's GPU time on a run made
    without a plan then includes the memory-bound ops and launches, not the GEMMs only."""
    import json

    from cli_util import run_cli
    from cptsim.cost.hardware import load_profile
    from cptsim.cost.model import estimate
    from cptsim.cost.schedules import parse_schedule
    from cptsim.measure.profiler import LayerProfile

    run = tmp_path / "run"
    r = run_cli("train", "--model", "resnet20", "--dataset", "synthetic:3,32,32:10:64", "--steps", "2",
                "--batch-size", "16", "--schedule", "static:8", "--out", run)
    assert r.exit_code == 0, r.output
    prof = LayerProfile.from_json(json.loads((run / "profile.json").read_text()))
    assert prof.ops is not None and prof.ops.totals()["launches"] > 100
    rep = run_cli("report", run, "--hw", "h100", "--json", "--no-save")
    assert rep.exit_code == 0, rep.output
    latency = json.loads(rep.stdout)["runs"][0]["hardware"][0]["executed"]["latency_s"]
    gemms_only = LayerProfile(prof.model, prof.input_shape, prof.layers, ops=None)
    c = estimate(gemms_only, parse_schedule("static:8"), load_profile("h100"), steps=2, batch_size=16)
    assert latency > 1.5 * c.latency_s["total"]


def test_an_eager_steps_host_time_splits_convolutions_from_other_launches():
    """The host's time by hand: per dispatched op, and per cuDNN convolution where the profile measures it. h100
    ships only the op's (9.75 us, a microbenchmark; a convolution's was once closed on ResNet-20's eager step
    alone, so it is not shipped until a dispatch microbenchmark measures it): its convolutions take the op's time.
    The LSTM-LM's 2281 light launches cost the host 22 ms, under its GPU time: GPU-bound (our H100 measured
    52.6 ms; one constant of 41 us per launch had priced it at 93 ms)."""
    from cptsim.cost.hardware import load_profile
    from cptsim.cost.hardware.gpu import launch_bound
    from cptsim.measure.profiler import profile_named_model

    lb = launch_bound(206, 9.75e-6, 5e-3, conv_launches=62, host_s_per_conv=146.3e-6)
    assert lb["host_step_s"] == pytest.approx(206 * 9.75e-6 + 62 * 146.3e-6)
    h100 = load_profile("h100")
    r20 = profile_named_model("resnet20", (3, 32, 32), 10)
    assert r20.ops.totals()["conv_launches"] == 62  # 20 convs x (fwd, dgrad, wgrad) + the stem's fwd and wgrad
    assert h100.calibration.get("host_conv_overhead_us") is None
    lb = h100.launch_bound(r20.ops, 1e-3)
    assert lb["bound"] == "launch (host)" and lb["host_step_s"] == pytest.approx(268 * 9.75e-6)
    lstm = profile_named_model("lstm-lm:layers=2,hidden=650", (35,), 10000, fp_layers=[])
    t = lstm.ops.totals()
    assert t["conv_launches"] == 0
    assert h100.launch_bound(lstm.ops, 0.054)["bound"] == "GPU"
    assert h100.launch_bound(lstm.ops, 0.0)["host_step_s"] == pytest.approx(t["launches"] * 9.75e-6)


def test_an_nchw_batch_norm_takes_its_channels_blocks_time_by_hand():
    # 132 SMs x 1.5 = 198 channels in flight: a 10-channel norm takes as long as a 198-channel one; 512 channels
    # take 512/198 of that
    shapes = [(12544.0, 10.0, 4.0), (3136.0, 512.0, 1.0)]
    t = K.nchw_batch_norm_seconds(shapes, np.array([2.0, 4.0]), 132, 1.98e9, 0.73, 1.5)
    one = 2 * (12544 * 4 + 3136 * 512 / 198) / (0.73 * 1.98e9)
    assert t.tolist() == pytest.approx([one, 2 * one])
    assert K.nchw_batch_norm_seconds([(12544.0, 10.0, 1.0)], np.array([1.0]), 132, 1.98e9, 0.73, 1.5)[0] == \
        pytest.approx(K.nchw_batch_norm_seconds([(12544.0, 198.0, 1.0)], np.array([1.0]), 132, 1.98e9, 0.73, 1.5)[0])


def _bn_net():
    import torch.nn as nn

    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(4, 5))


def test_the_op_counter_records_each_batch_norms_shape_and_an_old_profile_has_none():
    import torch

    from cptsim.measure.opcount import OpProfile, count_step_ops

    torch.manual_seed(0)
    ops = count_step_ops(_bn_net(), torch.randn(2, 3, 8, 6))
    sh = ops.batch_norm_shapes()
    # one call forward and one backward, on 8 x 6 = 48 positions per sample of 4 channels
    assert sh["fwd"] == [(48.0, 4.0, 1.0)] and sh["bwd"] == [(48.0, 4.0, 1.0)] and sh["opt"] == []
    again = OpProfile.from_json(ops.to_json())
    assert again.batch_norm_shapes() == sh
    old = ops.to_json()
    for r in old["records"]:
        r.pop("norm_shapes", None)
    assert OpProfile.from_json(old).batch_norm_shapes() is None  # priced by bytes, as before


def test_an_nchw_steps_batch_norms_are_priced_by_shape_and_channels_last_ones_by_bytes():
    import torch

    from cptsim.cost.hardware import load_profile
    from cptsim.measure.opcount import OpProfile, count_step_ops

    hw = load_profile("h100")
    torch.manual_seed(0)
    ops = count_step_ops(_bn_net(), torch.randn(2, 3, 64, 64))
    n = np.array([512.0])
    bn = hw.nchw_batch_norm_time(ops, n)
    c = hw.kernel_constant
    want = 512 * 4096 * 1 / (c("nchw_norm_rows_per_clock") * 1980e6)  # 4 channels: one block each, in parallel
    assert bn["fwd"][0] == pytest.approx(want)
    nchw, _ = hw.step_ops_cost(ops, np.array([16]), np.array([16]), n, channels_last=False)
    nhwc, _ = hw.step_ops_cost(ops, np.array([16]), np.array([16]), n, channels_last=True)
    assert nchw[0, 0] >= want and nchw[0, 0] - nhwc[0, 0] > 0.5 * want
    old = ops.to_json()
    for r in old["records"]:
        r.pop("norm_shapes", None)
    old = OpProfile.from_json(old)
    assert hw.nchw_batch_norm_time(old, n) is None
    # measured on FP16 kernels only: a 32-bit step's norms are priced as an op list without shapes is
    fp32, _ = hw.step_ops_cost(ops, np.array([32]), np.array([32]), n, channels_last=False)
    fp32_old, _ = hw.step_ops_cost(old, np.array([32]), np.array([32]), n, channels_last=False)
    assert fp32.ravel().tolist() == pytest.approx(fp32_old.ravel().tolist())


def test_the_zoo_backfills_hook_count_of_batch_norms_equals_the_op_counters():
    import sys
    from pathlib import Path

    import torch
    import torch.nn as nn

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks" / "gpu"))
    from gpu_zoo_profiles import batch_norm_shapes_by_hooks

    from cptsim.measure.opcount import count_step_ops

    net = nn.Sequential(_bn_net()[:3], nn.Conv2d(4, 6, 3, stride=2), nn.BatchNorm2d(6), _bn_net()[3:5],
                        nn.Linear(6, 3))
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 9)
    ops = count_step_ops(net, x).batch_norm_shapes()
    hooks = [tuple(s) for s in batch_norm_shapes_by_hooks(net, x[:1])]
    assert ops["fwd"] == hooks and sorted(ops["bwd"]) == hooks and len(hooks) == 2


def test_winograd_convs_are_the_dense_3x3_stride_1_ones_read_from_their_shapes():
    # rows: 3x3 s1 (64 -> 64 at 56x56), 3x3 s2 (v1.5's strided 3x3: 28x28 out of 56x56), 1x1, grouped 3x3 (32
    # groups), depthwise 3x3, and a layer with no recorded shape
    gemm = np.array([[1, 64, 576, 3136, 0], [1, 128, 1152, 784, 0], [1, 256, 64, 3136, 0],
                     [32, 4, 36, 3136, 0], [96, 1, 9, 3136, 0], [np.nan] * 5], dtype=float)
    inp = np.array([64 * 3136, 128 * 3136, 64 * 3136, 128 * 3136, 96 * 3136, 1.0])
    assert K.winograd_convs(gemm, inp, np.ones(6, bool)).tolist() == [True, False, False, False, False, False]
    # a linear layer is never one, whatever its numbers
    assert K.winograd_convs(gemm[:1], inp[:1], np.array([False])).tolist() == [False]


def test_a_winograd_eligible_fp32_conv_takes_the_faster_of_the_implicit_gemm_and_winograd_by_hand():
    # 3x3 s1, 256 -> 256 at 14x14, batch 128; shape constants 0 so only the waves scale the rates
    gemm = np.array([[1, 256, 2304, 196, 0]], dtype=float)
    macs = np.full((1, 1, 3), 256 * 2304 * 196 * 128.0)
    consts = {"gemm_n0": 0.0, "gemm_k0": 0.0}
    fp32 = 15.7e12 / 2  # V100's FP32 peak in MAC/s
    args = (np.array([True]), macs, np.array([128.0]), np.full((1, 1, 3), fp32), np.zeros((1, 1, 3), bool), fp32,
            np.zeros((1, 1, 3)), 900e9, 80, consts)
    direct = K.gemm_times(gemm, *args, channels_last=True)
    wino = K.gemm_times(gemm, *args, channels_last=True, winograd=np.ones((1, 1, 3), bool), winograd_rate=fp32)
    # F(2x2, 3x3): 16 multiplications where direct takes 36, at the same rate and waves
    assert wino[0, 0] == pytest.approx(direct[0, 0] / 2.25)
    assert K.WINOGRAD_MAC_REDUCTION == (2 * 3) ** 2 / (2 + 3 - 1) ** 2
    # on a tensor tier 8x the CUDA cores' rate (an A100's TF32) the implicit GEMM stays faster: nothing changes
    tc = (args[0], macs, args[2], np.full((1, 1, 3), 8 * fp32), np.ones((1, 1, 3), bool), *args[5:])
    assert np.array_equal(K.gemm_times(gemm, *tc, winograd=np.ones((1, 1, 3), bool), winograd_rate=fp32),
                          K.gemm_times(gemm, *tc))
    # and a byte-bound layer stays bound by its bytes
    heavy = (*args[:6], np.full((1, 1, 3), 1e12), *args[7:])
    assert K.gemm_times(gemm, *heavy, winograd=np.ones((1, 1, 3), bool), winograd_rate=fp32)[0, 0, 0] == \
        pytest.approx(1e12 / 900e9)


def test_winograd_prices_fp32_steps_only_and_where_the_cuda_cores_compete(monkeypatch):
    """On ResNet-50's profile: a V100 FP32 step (no TF32) runs its 13 stride-1 3x3 convs by Winograd, an AMP step
    none; an A100's TF32 tensor cores (8x its FP32 rate) keep the implicit GEMM on every layer."""
    from cptsim.calibration.gpu import resnet50_profile
    from cptsim.cost.hardware import load_profile
    from cptsim.cost.model import _kind_costs

    a = resnet50_profile("tests/data/imagenet-resnet50-profile.json").arrays()
    w3 = K.winograd_convs(a.gemm, a.numel[:, 1], a.is_conv)
    assert int(w3.sum()) == 13  # the stem is 7x7, v1.5's four strided 3x3 are stride 2
    find = K.winograd_convs
    for gpu, bits, moved in (("v100", 32, True), ("v100", 16, False), ("a100", 32, False)):
        hw, q = load_profile(gpu), np.array([bits])
        monkeypatch.setattr(K, "winograd_convs", find)
        t = _kind_costs(a, hw, q, q, np.array([128]))[2]
        monkeypatch.setattr(K, "winograd_convs", lambda g, i, c: np.zeros(len(g), bool))  # every conv direct
        t_direct = _kind_costs(a, hw, q, q, np.array([128]))[2]
        faster = t[0] < t_direct[0] * (1 - 1e-9)
        assert faster.any(axis=1).tolist() == (w3 & moved).tolist(), gpu
        assert (t[0] <= t_direct[0]).all()


def test_a_run_whose_op_list_cannot_be_counted_says_so_and_goes_on(tmp_path, monkeypatch):
    """The op count fails (a model whose step cannot be rerun from its first batch alone, say): the run trains on,
    profile.json has no op list, and train says what that costs instead of dropping it silently."""
    import json

    import cptsim.measure.opcount as O
    from shared_runs import cptsim_here

    def broken(*a, **k):
        raise RuntimeError("cannot rerun this step")

    monkeypatch.setattr(O, "count_step_ops", broken)
    r = cptsim_here("train", "--steps", "2", "--quiet", "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    warned = [line for line in r.stderr.splitlines() if "op list" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: ") and "could not be counted" in warned[0]
    assert "ops" not in json.loads((tmp_path / "run" / "profile.json").read_text())

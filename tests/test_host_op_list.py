"""The host model's step beyond its layers' GEMMs (cptsim.cost.hardware.host): the op list's ops priced one by one
(launches, bytes, random numbers, transcendental elements), fixed costs by layer kind, attention's matmul rate --
each against a hand count; and a profile measured before them prices a run as it always did."""

import numpy as np
import pytest

from cptsim.calibration.calibrate import write_host_profile
from cptsim.cost.hardware import load_profile
from cptsim.cost.hardware.host import layer_kinds
from cptsim.cost.model import estimate
from cptsim.measure.opcount import OpProfile, OpRecord
from cptsim.measure.profiler import LayerProfile, LayerRecord

# rates of the hand counts: 10 GB/s, 0.1 G random numbers/s, 2 G transcendental elements/s, 5 us per launch
BW, RNG, TRANS, OP_S = 10e9, 0.1e9, 2e9, 5e-6
LAYER_S, CONV_S = 200e-6, 300e-6


def _measured(**over) -> dict:
    m = {"device": "cpu", "threads": 1, "cpu": "test", "gpu": None, "torch_version": "x",
         "matmul_macs_per_s": 50e9, "matmul_by_shape": [{"shape": [1, 1, 1], "macs_per_s": 50e9}],
         "bandwidth_bytes_per_s": BW, "elementwise_elems_per_s": 1e9, "layer_overhead_s": LAYER_S, "tiers": {},
         "power_w": None, "power_source": "unknown", "measured_at": "now", "op_list": True,
         "op_overhead_s": OP_S, "conv_overhead_s": CONV_S, "rng_elems_per_s": RNG, "transcendental_elems_per_s": TRANS,
         "attention_macs_per_s": 10e9}
    m.update(over)
    return m


def _host(tmp_path, **over):
    return write_host_profile(_measured(**over), tmp_path / "h.toml")[1].with_exact_gemm(False)


def _rec(op, phase, kind, launches, read=(0.0, 0.0), write=(0.0, 0.0)):
    return OpRecord(op=op, phase=phase, kind=kind, calls=launches, launches=launches, read_per_sample=read[0],
                    read_fixed=read[1], write_per_sample=write[0], write_fixed=write[1])


OPS = OpProfile(records=[
    _rec("aten.add.Tensor", "fwd", "memory", 2, read=(800.0, 0.0), write=(400.0, 0.0)),      # plain: bytes
    _rec("aten.bernoulli_.float", "fwd", "memory", 1, read=(400.0, 0.0), write=(400.0, 0.0)),  # 100 draws/sample
    _rec("aten.gelu_backward.default", "bwd", "memory", 1, read=(800.0, 0.0), write=(400.0, 0.0)),  # 100 elements
    _rec("aten.mm.default", "bwd", "gemm", 3, read=(1e6, 0.0)),               # a layer's GEMM: its layer's
    _rec("aten.view.default", "fwd", "view", 0),                              # launches nothing
    _rec("aten.index_select.default", "bwd", "aggregation", 2, read=(5e5, 0.0)),  # bytes: its layer's
    _rec("aten._foreach_add_.List", "opt", "memory", 1, read=(0.0, 4000.0), write=(0.0, 2000.0)),  # fixed bytes
], batch_sizes=[2, 4])


def _profile(layers, ops=OPS):
    return LayerProfile(model="t", input_shape=[4], layers=layers, ops=ops)


def _linear(name, quantized=True, macs=1000):
    return LayerRecord(name=name, type="Linear", quantized=quantized, macs={"fwd": macs, "dgrad": macs, "wgrad": macs},
                       numel={"weight": 0, "input": 0, "output": 0}, calls=1)


def test_the_op_list_is_priced_op_by_op(tmp_path):
    host = _host(tmp_path)
    comp = host.op_list_components(_profile([_linear("fc")]).arrays(), np.array([10]))[0]  # (3 phases, 4 terms)
    n = 10
    # fwd: add's bytes, bernoulli's draws, 3 launches; dgrad column (backward ops): gelu_backward's elements and
    # 3 launches (its 1 and the aggregation's 2; the GEMM's launches belong to its layer); wgrad (the optimizer):
    # its fixed bytes, 1 launch
    assert comp[0] == pytest.approx([0.0, 1200.0 * n / BW, 100 * n / RNG, 3 * OP_S])
    assert comp[1] == pytest.approx([0.0, 0.0, 100 * n / TRANS, 3 * OP_S])
    assert comp[2] == pytest.approx([0.0, 6000.0 / BW, 0.0, OP_S])


def test_an_unmeasured_rate_prices_its_ops_by_their_bytes(tmp_path):
    host = _host(tmp_path, rng_elems_per_s=0.0, transcendental_elems_per_s=0.0)
    comp = host.op_list_components(_profile([_linear("fc")]).arrays(), np.array([10]))[0]
    assert comp[0, 1] == pytest.approx((1200.0 + 800.0) * 10 / BW) and comp[0, 2] == 0.0
    assert comp[1, 1] == pytest.approx(1200.0 * 10 / BW) and comp[1, 2] == 0.0


def test_fixed_costs_follow_the_layer_kind(tmp_path):
    host = _host(tmp_path)
    conv = LayerRecord(name="conv", type="Conv2d", quantized=True, macs={"fwd": 10, "dgrad": 0, "wgrad": 10},
                       numel={"weight": 0, "input": 0, "output": 0}, calls=1)
    scores = LayerRecord(name="scores", type="Matmul", quantized=True, macs={"fwd": 10, "dgrad": 10, "wgrad": 10},
                         numel={"weight": 0, "input": 0, "output": 0}, calls=1, operand=64)
    a = _profile([conv, _linear("fc"), scores, _linear("head", quantized=False)]).arrays()
    assert list(layer_kinds(a)) == ["conv", "layer", "attention", "fp"]
    fixed = host.layer_fixed_s(a).ravel()
    assert fixed == pytest.approx([CONV_S, LAYER_S, LAYER_S, OP_S])
    # the whole step: 2 executed conv phases (no dgrad), 3 + 3 quantized layer phases, 3 full-precision ones, and
    # the op list's 7 launches
    step = [{"step": 0, "batch_size": 10, "bits": 8, "grad_bits": 8}]
    zero = _host(tmp_path, layer_overhead_s=0.0, conv_overhead_s=0.0, op_overhead_s=0.0)
    t, t0 = (float(estimate(_profile([conv, _linear("fc"), scores, _linear("head", quantized=False)]), step, h,
                            per_layer=False).latency_s["total"]) for h in (host, zero))
    assert t - t0 == pytest.approx(2 * CONV_S + 6 * LAYER_S + 3 * OP_S + 7 * OP_S)


def test_each_layer_kind_computes_at_its_own_rate(tmp_path):
    scores = LayerRecord(name="scores", type="Matmul", quantized=True, macs={"fwd": 1e6, "dgrad": 0, "wgrad": 0},
                         numel={"weight": 0, "input": 0, "output": 0}, calls=1, operand=64)
    conv = LayerRecord(name="conv", type="Conv2d", quantized=True, macs={"fwd": 1e6, "dgrad": 0, "wgrad": 0},
                       numel={"weight": 0, "input": 0, "output": 0}, calls=1)
    a = _profile([scores, _linear("fc", macs=1e6), conv]).arrays()
    zeros = np.zeros((1, 3, 3))
    comp = _host(tmp_path, linear_macs_per_s=40e9).time_components(a.macs[None] * 10, zeros, zeros, layers=a)
    # attention at its measured rate, a Linear layer at the Linear shapes' one, a convolution at the matmul rate
    assert comp[0, :, 0, 0] == pytest.approx([1e7 / 10e9, 1e7 / 40e9, 1e7 / 50e9])
    # a Linear rate not measured: the matmul rate
    comp = _host(tmp_path).time_components(a.macs[None] * 10, zeros, zeros, layers=a)
    assert comp[0, 1, 0, 0] == pytest.approx(1e7 / 50e9)


def test_a_profile_measured_before_the_op_list_prices_as_it_did(tmp_path):
    """No ``op_list``: every layer-phase at layer_overhead_us, the op list unpriced, attention at the matmul rate."""
    old = _host(tmp_path, op_list=False)
    assert not old.prices_op_list and old.op_list_components(_profile([_linear("fc")]).arrays(), [10]) is None
    prof = _profile([_linear("fc"), _linear("head", quantized=False)])
    step = [{"step": 0, "batch_size": 10, "bits": 8, "grad_bits": 8}]
    t = float(estimate(prof, step, old, per_layer=False).latency_s["total"])
    assert t == pytest.approx(6 * 1000 * 10 / 50e9 + 6 * LAYER_S, rel=1e-3)
    assert "op_list" not in (tmp_path / "h.toml").read_text()
    placeholder = load_profile("host")
    assert not placeholder.prices_op_list

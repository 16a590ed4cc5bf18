"""A hardware kind is one class: a kind defined here, outside cptsim, registers itself, loads from its own TOML file
and prices a whole run through the public API (``cptsim.cost.estimate``), exactly as a hand computation says --
the cost model sums what the kind returns and asks it nothing else."""

import numpy as np
import pytest

from cptsim.cost import estimate
from cptsim.errors import InputError
from cptsim.hardware import Field, HardwareProfile, kinds, load_profile, register, unregister
from cptsim.profiler import LayerProfile
from cptsim.schedules import make_schedule

KIND = "toy-bitops"


class ToyBitOpsProfile(HardwareProfile):
    """A machine whose GEMM time is proportional to its BitOPs: macs x b1 x b2 / (bitops_per_s x efficiency),
    energy joules_per_bitop per BitOP. It runs full-precision layers at 16 bits (its own AMP), and every step pays a
    fixed time for its other ops, charged to the forward phase, at power_w."""

    KIND = KIND
    PARAMS = (
        Field("bitops_per_s", "positive", "BitOPs per second at full efficiency"),
        Field("joules_per_bitop", "positive", "energy per BitOP"),
        Field("step_overhead_s", "nonneg", "time of a step's other ops"),
        Field("power_w", "nonneg", "power while running the other ops"),
    )

    def _cost(self, macs, b1, b2, bytes_moved, quant_elems):
        work = macs * b1 * b2
        return work / (self.params["bitops_per_s"] * self._ceff), work * self.params["joules_per_bitop"]

    def _throughput(self, b1, b2):
        return self.params["bitops_per_s"] * self._ceff / (b1 * b2)

    def full_precision_bits(self, q):
        return 16

    def op_list_cost(self, a, q, g, samples):
        t = np.zeros((np.size(q), 3))
        t[:, 0] = self.params["step_overhead_s"]
        return t, t * self.params["power_w"]


TOML = f"""
name = "toy"
kind = "{KIND}"
description = "a BitOP-proportional array, defined in a test"
sources = ["tests/test_toy_kind.py"]

[{KIND}]
bitops_per_s = 2.0e12
joules_per_bitop = 3.0e-15
step_overhead_s = 1.5e-4
power_w = 40.0

[calibration]
compute_efficiency = 0.5
"""

# two layers: a quantized one, and a full-precision classifier (its BitOPs at 32 x 32, its time here at 16 x 16);
# the first layer has no dgrad (its input needs no gradient)
LAYERS = [
    {"name": "body", "type": "Linear", "quantized": True, "macs": {"fwd": 1000, "dgrad": 0, "wgrad": 1000},
     "numel": {"weight": 1000, "input": 100, "output": 10}},
    {"name": "head", "type": "Linear", "quantized": False, "macs": {"fwd": 50, "dgrad": 50, "wgrad": 50},
     "numel": {"weight": 50, "input": 10, "output": 5}},
]
PROFILE = {"format": "cptsim.profile/1", "model": "toy-net", "input_shape": [100], "layers": LAYERS}


@pytest.fixture
def toy(tmp_path):
    register(ToyBitOpsProfile)
    try:
        path = tmp_path / "toy.toml"
        path.write_text(TOML)
        yield load_profile(str(path))
    finally:
        unregister(KIND)


def _by_hand(q_steps, g_bits, batch, time_bits):
    """(BitOPs, seconds, joules) per layer and phase summed over the steps, plus the other ops' seconds and
    joules: a plain loop over steps, layers and phases. ``time_bits``: the widths a full-precision layer's time
    and energy use (BitOPs always count it at 32)."""
    rate, jpb, over, power = 2.0e12 * 0.5, 3.0e-15, 1.5e-4, 40.0
    bitops = np.zeros((2, 3))
    seconds = np.zeros((2, 3))
    joules = np.zeros((2, 3))
    for q in q_steps:
        for i, layer in enumerate(LAYERS):
            for j, phase in enumerate(("fwd", "dgrad", "wgrad")):
                m = layer["macs"][phase] * batch
                if layer["quantized"]:
                    b1, b2 = [(q, q), (g_bits, q), (g_bits, q)][j]
                    bitops[i, j] += m * b1 * b2
                    seconds[i, j] += m * b1 * b2 / rate
                    joules[i, j] += m * b1 * b2 * jpb
                else:
                    bitops[i, j] += m * 32 * 32
                    seconds[i, j] += m * time_bits * time_bits / rate
                    joules[i, j] += m * time_bits * time_bits * jpb
    steps = len(q_steps)
    return bitops, seconds, joules, steps * over, steps * over * power


def test_a_kind_defined_outside_cptsim_prices_a_run_as_the_hand_computation_says(toy):
    assert toy.kind == KIND and isinstance(toy, ToyBitOpsProfile)
    steps, batch = 40, 8
    sched = make_schedule("cos-rep", q_min=3, q_max=8, g_bits=8, cycles=4)
    c = estimate(LayerProfile.from_json(PROFILE), sched, toy, steps=steps, batch_size=batch)

    bitops, seconds, joules, other_s, other_j = _by_hand(sched.bits(steps).tolist(), 8, batch, time_bits=16)
    assert c.bitops["total"] == pytest.approx(bitops.sum(), rel=1e-12)
    assert c.latency_s["total"] == pytest.approx(seconds.sum() + other_s, rel=1e-12)
    assert c.energy_j["total"] == pytest.approx(joules.sum() + other_j, rel=1e-12)
    # the step's other ops sit in the phase they were charged to, in no layer's row
    assert c.latency_s["fwd"] == pytest.approx(seconds[:, 0].sum() + other_s, rel=1e-12)
    assert c.latency_s["wgrad"] == pytest.approx(seconds[:, 2].sum(), rel=1e-12)
    for i, row in enumerate(c.per_layer):
        assert row["latency_s"]["total"] == pytest.approx(seconds[i].sum(), rel=1e-12)
        assert row["energy_j"]["total"] == pytest.approx(joules[i].sum(), rel=1e-12)

    # the static q_max baseline is priced by the same kind
    base_bitops, base_s, _, base_other, _ = _by_hand([8] * steps, 8, batch, time_bits=16)
    assert c.baseline["latency_s"]["total"] == pytest.approx(base_s.sum() + base_other, rel=1e-12)
    assert c.vs_static["bitops"] == pytest.approx(bitops.sum() / base_bitops.sum(), rel=1e-12)
    assert c.hardware == "toy" and c.hardware_hash == toy.content_hash


def test_an_unregistered_kind_no_longer_loads(tmp_path):
    path = tmp_path / "toy.toml"
    path.write_text(TOML)
    register(ToyBitOpsProfile)
    unregister(KIND)
    assert KIND not in kinds()
    with pytest.raises(InputError, match=f"kind must be one of .*, got '{KIND}'"):
        load_profile(str(path))

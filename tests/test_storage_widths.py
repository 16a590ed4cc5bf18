"""Accelerator output storage width (issue 11 item 4): a profile parameter, defaulted per kind to its design."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from cptsim.cost.model import bytes_moved, storage_bits
from cptsim.errors import InputError
from cptsim.cost.hardware import load_profile, parse_profile

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_storage_widths.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_storage_widths", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_defaults_follow_each_design():
    assert load_profile("bitfusion").params["output_bits"] == 32  # the simulator's oprec = 32
    assert load_profile("stripes").params["output_bits"] == 16  # Stripes' 16-bit neuron storage
    assert load_profile("int8-systolic").params["output_bits"] == 32
    assert "output_bits" not in load_profile("a100").params


@pytest.mark.parametrize("bad", ["0", "33", '"fp8"', "8.5", "true"])
def test_a_bad_value_names_the_key_and_what_it_takes(bad):
    text = (BENCH.parents[1] / "hw_profiles" / "bitfusion.toml").read_text()
    assert "output_bits = 32" in text
    with pytest.raises(InputError, match=r"bit-fusion\.output_bits must be .*or \"operand\""):
        parse_profile(text.replace("output_bits = 32", f"output_bits = {bad}").encode(), "bitfusion.toml")


def test_outputs_are_written_at_the_profile_width():
    b = _bench()
    numel = np.array([[100.0, 1000.0, 2000.0]])  # weight, input, output elements per sample
    macs = np.ones((1, 3))
    quantized = np.array([True])

    def fwd_dgrad_bytes(hw):
        by = bytes_moved(numel, macs, quantized, 4, 8, 10, None, storage_bits(hw))
        return by[0, 0], by[0, 1]

    f32, d32 = fwd_dgrad_bytes(b.with_output_bits("bitfusion", 32))
    fop, dop = fwd_dgrad_bytes(b.with_output_bits("bitfusion", "operand"))
    # forward: output (2000 x 10) at 32 bits vs at the 4-bit operand width; dgrad: input grad (1000 x 10) at 32
    # vs at max(g, q) = 8 bits. Reads do not change.
    assert f32 - fop == pytest.approx(2000 * 10 * (32 - 4) / 8)
    assert d32 - dop == pytest.approx(1000 * 10 * (32 - 8) / 8)
    f16, _ = fwd_dgrad_bytes(b.with_output_bits("stripes", 16))
    assert f32 - f16 == pytest.approx(2000 * 10 * 16 / 8)


def test_cpt_saving_on_the_accelerators_by_output_width(capsys):
    rows = _bench().savings()
    by = {(r["hardware"], r["output_bits"]): r for r in rows if not r["default"]}
    with capsys.disabled():
        print("\nCPT 3-8 on resnet20, saving over static 8 bits (BitOPs / energy / latency):")
        for (hw, w), r in by.items():
            print(f"  {hw:<10} output_bits={str(w):<8} {100 * r['bitops_saving']:.1f}% / "
                  f"{100 * r['energy_saving']:.1f}% / {100 * r['latency_saving']:.1f}%")
    bf = by[("bitfusion", 32)]
    assert bf["bitops_saving"] == pytest.approx(0.367, abs=5e-4)
    # the array model's figures (benchmarks/bench_storage_widths.py); the roofline said 7.7% / 17.3%
    assert (bf["energy_saving"], bf["latency_saving"]) == pytest.approx((0.110, 0.107), abs=5e-4)
    for hw in ("bitfusion", "stripes"):
        e = [by[(hw, w)]["energy_saving"] for w in (32, 16, "operand")]
        t = [by[(hw, w)]["latency_saving"] for w in (32, 16, "operand")]
        assert e == sorted(e) and t == sorted(t)  # narrower outputs, larger savings
        assert by[(hw, "operand")]["energy_saving"] < by[(hw, "operand")]["bitops_saving"]

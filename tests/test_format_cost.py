"""Issue 26, items 2-3 on the cost side: a schedule's widths name formats of a family (--number-format), BitOPs count
element bits, memory traffic storage bits (scales amortised), and a GPU runs each GEMM on the tier of its operands'
formats; the integer family's costs are today's; bad input is one line, exit 2."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from cptsim.cli.main import cli
from cptsim.cost.hardware import load_profile
from cptsim.cost.model import bytes_moved, storage_bits
from cptsim.errors import InputError
from cptsim.numerics.families import family_format, format_map


def _invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], env={"COLUMNS": "200", "CPTSIM_NO_CALIBRATE": "1"})


def _cost_json(*args):
    r = _invoke("cost", "--steps", 64, "--json", *args)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_family_widths_and_the_width_a_family_lacks():
    assert [family_format("mx", w).name for w in (1, 4, 5, 6, 7, 8, 9, 16, 17, 32)] == \
        ["mxfp4", "mxfp4", "mxfp6", "mxfp6", "mxfp8", "mxfp8", "bf16", "bf16", "fp32", "fp32"]
    assert [family_format("fp", w).name for w in (3, 4, 6, 8)] == ["fp4e2m1", "fp4e2m1", "fp6e3m2", "fp8e4m3"]
    assert [family_format("nvfp", w).name for w in (4, 5, 8, 12)] == ["nvfp4", "fp8e4m3", "fp8e4m3", "bf16"]
    assert format_map("int") is None
    m = format_map("mx", "fp8e5m2")
    assert m.grad_names[8] == "fp8e5m2" and m.grad_names[32] == "fp32" and m.fwd_names[8] == "mxfp8"


def test_cost_mx_cycle_on_b200_runs_each_gemm_on_its_formats_tier():
    doc = _cost_json("--number-format", "mx", "--schedule", "cos-rep:4-8:g8:n8", "--hw", "b200")
    f = doc["profiles"][0]["formats"]
    assert f["family"] == "mx" and f["grad_format"] is None
    assert f["run"]["forward"] == {"4": "mxfp4", "5": "mxfp6", "6": "mxfp6", "7": "mxfp8", "8": "mxfp8"}
    assert f["run"]["gradient"] == {"8": "mxfp8"}
    tiers = {(r["bits"], r["grad_bits"]): (r["fwd"], r["dgrad"], r["wgrad"]) for r in f["tiers"]}
    # by hand: MXFP4 x MXFP4 on the FP4 tier (9,000); anything with an MXFP8 gradient or an MXFP6/8 forward
    # operand on the FP8/FP6 tier (4,500): the wider of the two operands' tiers
    assert tiers[(4, 8)] == ("fp4", "fp8", "fp8")
    assert tiers[(5, 8)] == tiers[(6, 8)] == tiers[(8, 8)] == ("fp8", "fp8", "fp8")
    v = load_profile("b200").with_formats(format_map("mx"))
    macs = 1e15
    t44, _ = v.gemm_cost(macs, 4, 4, 0.0)
    t84, _ = v.gemm_cost(macs, 8, 4, 0.0)
    assert float(t44) == pytest.approx(macs / (9000e12 / 2)) and float(t84) == pytest.approx(macs / (4500e12 / 2))
    assert doc["workload"]["number_format"] == "mx"


def test_fp8_on_an_a100_prices_at_the_fp16_tier():
    a100 = load_profile("a100")
    v = a100.with_formats(format_map("fp"))
    assert v._tier_names[int(v.tier_index(8, 8))] == "fp16"
    t8, e8 = v.gemm_cost(1e15, 8, 8, 0.0)
    t16, e16 = a100.gemm_cost(1e15, 16, 16, 0.0)
    assert float(t8) == float(t16) == pytest.approx(1e15 / (312e12 / 2)) and float(e8) == float(e16)
    assert float(v.format_storage_bits(8)) == 16.0  # upcast: stored at the tier's width, as int4 on an H100
    # an H100 has an FP8 tier: 1979 x 0.715 (measured _scaled_mm rate, 1415.8 TFLOPS)
    h = load_profile("h100").with_formats(format_map("fp"))
    assert float(h.gemm_cost(1e15, 8, 8, 0.0)[0]) == pytest.approx(1e15 / (1979e12 / 2 * 0.715))


def test_integer_family_costs_are_todays():
    base = ["--schedule", "cos-rep:4-8:g8:n8", "--hw", "h100,a100,b200,bitfusion"]
    r0, r1 = _invoke("cost", "--steps", 64, "--json", *base), \
        _invoke("cost", "--steps", 64, "--json", "--number-format", "int", *base)
    assert r0.exit_code == r1.exit_code == 0 and r0.stdout == r1.stdout
    assert "formats" not in json.loads(r0.stdout)["profiles"][0]
    # the new FP8 tier beside int8 moves no integer width's tier
    h = load_profile("h100")
    assert [h._tier_names[int(h.tier_index(b, b))] for b in (2, 4, 8, 9, 16, 32)] == \
        ["int8", "int8", "int8", "fp16", "fp16", "tf32"]


def test_storage_bits_in_memory_traffic_by_hand():
    W, I, O = 1000.0, 300.0, 200.0
    numel, macs = np.array([[W, I, O]]), np.array([[1.0, 1.0, 1.0]])
    for fam, s4, s8 in (("mx", 4.25, 8.25), ("nvfp", 4.5, 8.0)):
        st = storage_bits(None, format_map(fam))
        got = bytes_moved(numel, macs, np.array([True]), 4, 8, 1, storage=st)[0]
        want = np.array([W * s4 + I * s4 + O * 32, O * s8 + W * s4 + I * 32, O * s8 + I * s4 + W * 32]) / 8
        assert np.allclose(got, want), (fam, got, want)
    # on a B200 MXFP4 runs natively: 4.25 bits; on an H100 it is upcast into its FP8 tier: 8 bits
    assert float(load_profile("b200").with_formats(format_map("mx")).format_storage_bits(4)) == 4.25
    assert float(load_profile("b200").with_formats(format_map("nvfp")).format_storage_bits(4)) == 4.5
    assert float(load_profile("h100").with_formats(format_map("mx")).format_storage_bits(4)) == 8.0


def test_bitops_count_element_bits():
    i5 = _cost_json("--schedule", "static:6:g8", "--hw", "b200")["profiles"][0]["bitops"]
    m5 = _cost_json("--schedule", "static:5:g8", "--number-format", "mx", "--hw", "b200")["profiles"][0]["bitops"]
    assert m5 == i5  # a 5-bit MX step runs MXFP6: 6-bit elements, as an int6 step's BitOPs


@pytest.mark.parametrize("args,needle", [
    (["--number-format", "bogus"], "unknown number format family"),
    (["--number-format", "mx", "--hw", "bitfusion"], "computes integers only"),
    (["--number-format", "fp", "--hw", "int8-systolic"], "computes integers only"),
    (["--number-format", "nvfp", "--hw", "stripes"], "computes integers only"),
    (["--grad-format", "fp8e5m2"], "needs a float --number-format"),
    (["--number-format", "mx", "--grad-format", "int8"], "must be a float format"),
    (["--number-format", "mx", "--grad-format", "fp9"], "unknown number format"),
])
def test_bad_format_input_is_one_line_exit_2(args, needle):
    r = _invoke("cost", "--steps", 8, "--schedule", "static:8:g8", *args)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.output


def test_accelerators_refuse_a_format_map_directly():
    for name in ("bitfusion", "stripes", "int8-systolic"):
        with pytest.raises(InputError):
            load_profile(name).with_formats(format_map("mx"))
        assert load_profile(name).with_formats(None) is not None


@pytest.mark.parametrize("name,rate", [("h200", 1979 * 0.715), ("mi300x", 2614.9), ("l40s", 733), ("rtx4090", 330.3)])
def test_fp8_tiers_of_the_fp8_gpus(name, rate):
    hw = load_profile(name)
    v = hw.with_formats(format_map("fp", "fp8e5m2"))
    assert v._tier_names[int(v.tier_index(8, 8))] == "fp8"
    assert float(v.gemm_cost(1e15, 8, 8, 0.0)[0]) == pytest.approx(1e15 / (rate * 1e12 / 2))
    assert hw._tier_names[int(hw.tier_index(8, 8))] == "int8"  # integer widths keep their int8 tier

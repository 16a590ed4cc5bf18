"""The accelerators' array model (cptsim.cost.hardware.tiling / array) against independent truth: the Bit Fusion
authors' published per-layer simulator results, DNNsim's Stripes cycle formula, and hand counts."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from cptsim.cost.hardware import load_profile
from cptsim.cost.hardware.array import problem_alternatives
from cptsim.cost.hardware.files import parse_profile
from cptsim.cost.hardware.tiling import ArraySpec, Problem, search
from cptsim.errors import InputError
from cptsim.measure.profiler import LayerProfile, profile_named_model

DATA = Path(__file__).parent / "data" / "bitfusion_authors"


def _layers():
    with open(DATA / "layers.csv", newline="") as f:
        return [{k: (v if k in ("network", "layer") else int(v)) for k, v in r.items()} for r in csv.DictReader(f)]


def _authors():
    with open(DATA / "sweep.csv", newline="") as f:
        return {(int(r["M"]), int(r["Bandwidth (bits/cycle)"]), r["Network"], r["Layer"].rsplit("/", 1)[0]): r
                for r in csv.DictReader(f)}


def test_every_published_bitfusion_row_is_reproduced_exactly():
    """Cycles, memory-wait cycles, DRAM bits and every buffer's reads and writes of all 305 rows (five arrays, two
    interfaces, eight networks) from the shipped profile, changing only what the authors' sweep changed."""
    hw = load_profile("bitfusion")
    base = hw.array_spec()
    ref = _authors()
    configs = sorted({k[:2] for k in ref})
    assert len(configs) == 5 and len(ref) == 305
    for columns, interface in configs:
        scale = columns / base.columns
        spec = dataclasses.replace(base, columns=columns, wbuf_bits=base.wbuf_bits * scale,
                                   ibuf_bits=base.ibuf_bits * scale, obuf_bits=base.obuf_bits * scale,
                                   interface_bits=float(interface))
        for row in _layers():
            r = ref[(columns, interface, row["network"], row["layer"])]
            k, o = float(row["kernel"]), float(row["out_size"])
            p = Problem(16.0, o, o, k, k, float(row["stride"]), k * k, float(row["in_channels"]),
                        float(row["out_channels"]), float(hw.pack_factor(row["weight_bits"], row["input_bits"])),
                        float(row["input_bits"]), float(row["weight_bits"]), 32.0, bool(row["im2col"]))
            a = search(p, spec)
            where = (columns, interface, row["network"], row["layer"])
            assert a.cycles == float(r["Cycles"]), where
            assert a.stall_cycles == float(r["Memory wait cycles"]), where
            assert (a.dram_read_bits, a.dram_write_bits) == (float(r["DRAM Read"]), float(r["DRAM Write"])), where
            assert (a.wbuf_read_bits, a.wbuf_write_bits, a.ibuf_read_bits, a.ibuf_write_bits, a.obuf_read_bits,
                    a.obuf_write_bits) == tuple(float(r[c]) for c in (
                        "WBUF Read", "WBUF Write", "IBUF Read", "IBUF Write", "OBUF Read", "OBUF Write")), where


def _spec(**kw):
    d = dict(rows=4, columns=4, windows=1, wbuf_bits=1e9, ibuf_bits=1e9, obuf_bits=1e9, interface_bits=64.0,
             core_pj_per_cycle=1.0, wbuf_read_pj=0.0, wbuf_write_pj=0.0, ibuf_read_pj=0.0, ibuf_write_pj=0.0,
             obuf_read_pj=0.0, obuf_write_pj=0.0, dram_pj=0.0)
    d.update(kw)
    return ArraySpec(**d)


def test_a_layer_that_fits_costs_compute_plus_first_fill_and_last_drain_by_hand():
    # 1x1 conv, batch 2, 3x3 outputs, 6 input channels -> 5 output channels at 8x8 bits on a 4x4 array, pf 1:
    # compute = 2 * 9 positions * ceil(5/4) column tiles * ceil(6/4) row tiles = 72 cycles; everything fits, so
    # DRAM = weights padded to whole rows (8 x 5 x 8 b) + inputs (2 x 9 x 6 x 8 b) + outputs (2 x 9 x 8 padded
    # columns x 32 b) written and read back; all of it is first fill or last drain: 320 + 864 + 4608 in,
    # 4608 out, at 64 bits per cycle: ceil(5792 / 64) + ceil(4608 / 64) = 91 + 72 stall cycles.
    p = Problem(2.0, 3.0, 3.0, 1.0, 1.0, 1.0, 1.0, 6.0, 5.0, 1.0, 8.0, 8.0, 32.0, False)
    a = search(p, _spec())
    assert a.compute_cycles == 2 * 9 * 2 * 2
    assert a.dram_read_bits == 8 * 5 * 8 + 2 * 9 * 6 * 8 + 2 * 9 * 8 * 32
    assert a.dram_write_bits == 2 * 9 * 8 * 32
    assert a.stall_cycles == math.ceil(5792 / 64) + math.ceil(4608 / 64)
    assert a.cycles == a.compute_cycles + a.stall_cycles


def test_padding_to_whole_rows_and_columns_makes_narrow_layers_slower_than_their_macs():
    """A 16-channel layer on Bit Fusion's 16 x 32 array at 2x2 bits (16 per row) uses 1/16 of the rows and half the
    columns: its compute cycles are 32x what its MACs over the peak would say."""
    hw = load_profile("bitfusion")
    spec = dataclasses.replace(hw.array_spec(), interface_bits=1e12)
    p = Problem(1.0, 8.0, 8.0, 3.0, 3.0, 1.0, 9.0, 16.0, 16.0, 16.0, 2.0, 2.0, 32.0, False)
    a = search(p, spec)
    macs = 64 * 9 * 16 * 16
    assert a.compute_cycles == pytest.approx(32 * macs / (512 * 16))


def _dnnsim_cycles(windows, filters, channels, k, p):
    return math.ceil(windows / 16) * math.ceil(filters / 256) * math.ceil(channels / 16) * k * k * p


@pytest.fixture(scope="module")
def resnet20():
    return profile_named_model("resnet20", (3, 32, 32), 10)


@pytest.mark.parametrize("bits", [8, 4])
def test_stripes_forward_compute_cycles_are_dnnsims_formula_on_every_resnet20_conv(resnet20, bits):
    """DNNsim (github isakedo/DNNsim, the Stripes designers' simulator): ceil(windows/16) ceil(filters/256)
    ceil(channels/16) K^2 P per image, P the activation's bits."""
    hw = load_profile("stripes")
    spec = hw.array_spec()
    a = resnet20.arrays()
    checked = 0
    for l, r in enumerate(resnet20.layers):
        if r.type != "Conv2d":
            continue
        alts = problem_alternatives(a, l, 0, 1.0, float(bits), float(bits), float(hw.pack_factor(bits, bits)), 16.0,
                                    hw.params["array"]["dataflow"])
        (times, p), = alts[0]
        c = r.conv
        want = _dnnsim_cycles(c["out_hw"][0] * c["out_hw"][1], c["out_channels"], c["in_channels"],
                              c["kernel"][0], bits)
        assert times * search(p, spec).compute_cycles == want, r.name
        checked += 1
    assert checked >= 19


def test_profiles_record_conv_geometry_and_read_back(resnet20, tmp_path):
    rec = {r.name: r for r in resnet20.layers}
    c = rec["layer2.0.conv1"].conv
    assert c == {"kernel": [3, 3], "stride": [2, 2], "in_hw": [32, 32], "out_hw": [16, 16], "in_channels": 16,
                 "out_channels": 32, "groups": 1}
    back = LayerProfile.from_json(json.loads(json.dumps(resnet20.to_json())))
    assert [r.conv for r in back.layers] == [r.conv for r in resnet20.layers]
    assert np.array_equal(back.arrays().conv, resnet20.arrays().conv, equal_nan=True)


def test_the_training_passes_map_with_the_forward_macs(resnet20):
    """dgrad and wgrad are priced on problems whose products are the layer's own dgrad and wgrad MACs."""
    a = resnet20.arrays()
    for l, r in enumerate(resnet20.layers):
        if r.type != "Conv2d":
            continue
        for ph, phase in enumerate(("fwd", "dgrad", "wgrad")):
            if r.macs[phase] == 0:
                continue
            for alt in problem_alternatives(a, l, ph, 4.0, 8.0, 8.0, 1.0, 32.0):
                macs = sum(t * p.batch * p.out_h * p.out_w * p.taps * p.ic * p.oc for t, p in alt)
                assert macs == pytest.approx(4 * r.macs[phase]), (r.name, phase)


def test_old_profiles_without_geometry_price_convolutions_as_im2col_gemms(resnet20):
    d = resnet20.to_json()
    for r in d["layers"]:
        r.pop("conv", None)
    old = LayerProfile.from_json(d)
    assert all(r.conv is None for r in old.layers)
    from cptsim.cost import estimate
    from cptsim.schedules import make_schedule

    s = make_schedule("static", q_min=8, q_max=8, g_bits=8)
    new_t = estimate(resnet20, s, "bitfusion", steps=2, batch_size=8).latency_s["total"]
    old_t = estimate(old, s, "bitfusion", steps=2, batch_size=8).latency_s["total"]
    assert old_t > 0 and new_t > 0 and old_t != new_t


def _without_array(name):
    text = Path(load_profile(name).path).read_text()
    head = text.index(f"[{load_profile(name).kind}.array]")
    return text[:head]


def test_a_profile_without_an_array_table_prices_the_roofline_and_says_so(resnet20):
    old = parse_profile(_without_array("bitfusion").encode(), "old.toml")
    assert not old.has_array
    from cptsim.cost import estimate
    from cptsim.cost.hardware import base
    from cptsim.schedules import make_schedule

    base._WARNED.clear()
    s = make_schedule("static", q_min=8, q_max=8, g_bits=8)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        t = estimate(resnet20, s, old, steps=1, batch_size=8).latency_s["total"]
    assert any("roofline" in str(x.message) for x in w)
    macs = sum(r.macs[p] for r in resnet20.layers for p in ("fwd", "dgrad", "wgrad")) * 8
    assert t >= macs / (512 * 500e6)  # at least the peak's time


@pytest.mark.parametrize("key, new, msg", [
    ("rows", "rows = 0", "rows must be a positive integer"),
    ("dataflow", 'dataflow = "diagonal"', "dataflow must be one of"),
    ("columns", "columns = 64", "must equal the kind's unit count"),
    ("columns", "colums = 32", "unknown key 'bit-fusion.array.colums'"),
])
def test_a_malformed_array_table_is_one_clear_error(key, new, msg):
    import re

    text = Path(load_profile("bitfusion").path).read_text()
    body, n = re.subn(rf"^{key} = .*$", new, text, flags=re.M)
    assert n == 1
    with pytest.raises(InputError, match=msg):
        parse_profile(body.encode(), "mine.toml")


def test_buffers_too_small_for_any_tile_are_a_clear_error_not_a_crash():
    p = Problem(1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 64.0, 64.0, 1.0, 8.0, 8.0, 32.0, False)
    with pytest.raises(InputError, match="hold no tile"):
        search(p, _spec(rows=16, columns=32, obuf_bits=100.0))


@pytest.mark.parametrize("name", ["bitfusion", "stripes", "int8-systolic"])
def test_hw_show_gives_every_key_of_an_accelerator_a_meaning_with_its_unit(name):
    from cli_util import run_cli

    r = run_cli("hw", "show", name, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    keys = [k for k in d["params"] if k != "array"] + [f"array.{k}" for k in d["params"]["array"]]
    assert keys and all(d["meanings"].get(k) for k in keys), [k for k in keys if not d["meanings"].get(k)]
    for k in keys:  # the unit is in the key's name or its meaning
        m = d["meanings"][k]
        assert any(u in k or u in m for u in ("bytes", "pj", "pJ", "mhz", "MHz", "gb_s", "GB/s", "count", "bits",
                                               "W", "width", '"')), (k, m)


def test_an_old_user_profile_without_an_array_loads_and_prices_by_path(tmp_path, resnet20):
    from cli_util import run_cli

    f = tmp_path / "mybf.toml"
    f.write_text(_without_array("bitfusion").replace('name = "bitfusion"', 'name = "mybf"'))
    r = run_cli("hw", "show", str(f), "--json")
    assert r.exit_code == 0, r.output
    assert "array" not in json.loads(r.stdout)["params"]


def test_the_tiling_cache_on_disk_gives_the_search_result_and_survives_a_damaged_file(tmp_path, monkeypatch):
    from cptsim.cost.hardware import tiling_cache

    monkeypatch.setenv("CPTSIM_HOME", str(tmp_path))
    spec = load_profile("bitfusion").array_spec()
    p = Problem(3.0, 5.0, 5.0, 3.0, 3.0, 1.0, 9.0, 24.0, 40.0, 4.0, 4.0, 4.0, 32.0, False)
    want = search(p, spec)
    st = tiling_cache._Store(spec)
    assert st.get(p, spec) == (want.cycles, want.energy_j)
    st.flush()
    assert json.loads(st.path.read_text())  # written, and readable by the next process
    again = tiling_cache._Store(spec)
    assert again.data and again.get(p, spec) == (want.cycles, want.energy_j)
    st.path.write_text("{not json")
    damaged = tiling_cache._Store(spec)
    assert damaged.data == {} and damaged.get(p, spec) == (want.cycles, want.energy_j)


def test_a_per_layer_latency_plan_on_bitfusion_widens_the_layers_the_array_gives_no_speed():
    """resnet20 within 92% of static 8's latency around cos-tri:4-7 (benchmarks/bench_perlayer_array.py): the MILP
    spends its extra bits on layers whose step at 4 bits is barely faster than at 8 on the array (narrow input
    channels leave the packed rows empty) and none on the 64-channel layers, where 4 bits halve the time."""
    from cptsim.cost.schedules import parse_schedule
    from cptsim.planner.perlayer import plan_layers
    from cptsim.planner.workload import Workload

    w = Workload.build("resnet20", dataset="cifar10", steps=64000, batch_size=128)
    hw = load_profile("bitfusion")
    ratio = {}
    l4, l8 = (estimate_per_layer(w, hw, s) for s in ("static:4:g8", "static:8:g8"))
    for n in l8:
        ratio[n] = l4[n] / l8[n]
    full = w.estimate(parse_schedule("static:8:g8"), hw).latency_s["total"]
    lp = plan_layers(w, hw, parse_schedule("cos-tri:4-7:g8:n1"), "latency", 0.92 * full)
    raised = {n for n, k in lp.offsets.items() if k > 0}
    fast = {n for n in lp.offsets if ratio[n] < 0.5}
    assert fast and not (raised & fast) and all(lp.offsets[n] <= 0 for n in fast)
    assert len([n for n in raised if ratio[n] > 0.85]) >= 3
    assert lp.cost <= 0.92 * full and lp.score > lp.uniform_score


def estimate_per_layer(w, hw, spec):
    from cptsim.cost import estimate
    from cptsim.cost.schedules import parse_schedule

    c = estimate(w.profile, parse_schedule(spec), hw, steps=w.steps, batch_size=w.batch_size,
                 dataset_size=w.dataset_size)
    return {r["name"]: r["latency_s"]["total"] for r in c.per_layer}

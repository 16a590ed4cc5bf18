"""The cost model: CPT's published convention, histogram aggregation vs a per-step loop, traces, ragged batches,
what each hardware kind does with bits, bad input, and the `profile` / `cost` commands."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from click.testing import CliRunner

from cptsim.cli.main import cli
from cptsim.cost.model import bytes_moved, estimate, quant_elems, relative_to_static, step_cost, storage_bits
from cptsim.errors import InputError
from cptsim.cost.hardware import load_profile
from cptsim.measure.profiler import LayerProfile, LayerRecord
from cptsim.cost.schedules import cpt_relative_cost, describe, make_schedule, parse_schedule

HW = ["h100", "a100", "bitfusion", "stripes", "int8-systolic", "host"]


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    """Never read the real ~/.config/cptsim (a calibrated host profile there would change 'host')."""
    monkeypatch.setenv("CPTSIM_HOME", str(tmp_path / "home"))


def _profile(rows, name="synthetic") -> LayerProfile:
    """rows: (quantized, (fwd, dgrad, wgrad) MACs per sample, (weight, input, output) numel)."""
    return LayerProfile(name, [3, 8, 8], [
        LayerRecord(f"l{i}", "Conv2d", q, dict(zip(("fwd", "dgrad", "wgrad"), m)),
                    dict(zip(("weight", "input", "output"), n)))
        for i, (q, m, n) in enumerate(rows)])


# A small CNN-like profile: first layer without dgrad, FP32 classifier, uneven sizes.
MIXED = _profile([
    (True, (442_368, 0, 442_368), (432, 3072, 16384)),
    (True, (2_359_296,) * 3, (2304, 16384, 16384)),
    (True, (1_179_648,) * 3, (4608, 16384, 8192)),
    (True, (131_072,) * 3, (512, 16384, 8192)),
    (False, (640,) * 3, (640, 64, 10)),
])


def _equal_phase_profile(seed=0, layers=7) -> LayerProfile:
    rng = np.random.default_rng(seed)
    return _profile([(True, (int(m),) * 3, (int(w), int(i), int(o)))
                     for m, w, i, o in rng.integers(1_000, 5_000_000, size=(layers, 4))])


# -- CPT's convention -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,steps", [("cpt:3-8:g8:n32", 1000), ("rex-tri-h:4-8:g6-8:n8", 9999),
                                        ("lin-rep:2-6:g4:n3", 777), ("static:8", 50), ("exp-tri-v:1-16:g32:n5", 640)])
def test_all_quantized_equal_phase_macs_reproduce_cpts_relative_cost(text, steps):
    sched = parse_schedule(text)
    c = estimate(_equal_phase_profile(), sched, None, steps=steps, batch_size=32)
    want = cpt_relative_cost(sched.bits(steps), sched.grad_bits(steps))
    assert c.relative_to_fp32 == pytest.approx(want, rel=1e-12)
    assert c.relative_to_static == pytest.approx(describe(sched, steps)["relative_cost_static"], rel=1e-12)
    assert c.steps == steps and c.samples == steps * 32


# -- aggregation == brute force ---------------------------------------------------------------------------------------


def _brute_force(profile: LayerProfile, qs, gs, batches, hw):
    """Per-step Python loop, formulas written out again from DESIGN.md and cost.py's stated bytes model."""
    tot = {"bitops": 0.0, "macs": 0.0, "energy": 0.0, "latency": 0.0}
    store = storage_bits(hw)
    for q, g, n in zip(qs, gs, batches):
        for r in profile.layers:
            bw = ba = q if r.quantized else 32
            bg = g if r.quantized else 32
            # AMP means AMP: a GPU step at 16 bits or less (every shipped GPU has an fp16 tier) runs its
            # full-precision layers in FP16 as autocast does -- in time and energy; BitOPs keep them at 32
            tw, tg = (16, 16) if (hw is not None and hw.kind == "gpu" and q <= 16 and not r.quantized) else (bw, bg)
            W, I, O = r.numel["weight"] * r.calls, r.numel["input"] * n, r.numel["output"] * n
            sw, sa, sg = (float(store(np.array(b))) for b in (tw, tw, tg))
            out = getattr(store, "output", None)  # a GPU writes outputs at its compute width (AMP: FP16)
            so_f, so_d = (32.0, 32.0) if out is None else (float(out(np.array(tw))), float(out(np.array(max(tg, tw)))))
            phases = [
                ("fwd", (bw, ba), (tw, tw), W * sw + I * sa + O * so_f, (I + W) if (r.quantized and q < 32) else 0),
                ("dgrad", (bg, bw), (tg, tw), O * sg + W * sw + I * so_d, O if (r.quantized and g < 32) else 0),
                ("wgrad", (bg, ba), (tg, tw), O * sg + I * sa + W * 32,
                 O if (r.quantized and g < 32 and r.macs["dgrad"] == 0) else 0),
            ]
            for phase, (b1, b2), (t1, t2), bits_moved, qe in phases:
                m = r.macs[phase] * n
                if m == 0:
                    continue
                tot["macs"] += m
                tot["bitops"] += m * b1 * b2
                if hw is not None:
                    t, e = hw.gemm_cost(m, t1, t2, bits_moved / 8, qe)
                    tot["latency"] += float(t)
                    tot["energy"] += float(e)
    return tot


@pytest.mark.parametrize("hw_name", HW)
def test_histogram_aggregation_equals_a_per_step_loop(hw_name):
    hw = load_profile(hw_name)
    sched = parse_schedule("cos-tri:2-9:g5-8:n3")
    T, B, N = 170, 16, 100  # 7 steps per epoch, the last of 4 samples
    c = estimate(MIXED, sched, hw, steps=T, batch_size=B, dataset_size=N)
    batches = [N - 6 * B if t % 7 == 6 else B for t in range(T)]
    want = _brute_force(MIXED, sched.bits(T), sched.grad_bits(T), batches, hw)
    assert c.bitops["total"] == pytest.approx(want["bitops"], rel=1e-12)
    assert c.macs["total"] == pytest.approx(want["macs"], rel=1e-12)
    assert c.latency_s["total"] == pytest.approx(want["latency"], rel=1e-9)
    assert c.energy_j["total"] == pytest.approx(want["energy"], rel=1e-9)
    assert c.samples == sum(batches)
    # per-layer rows add up to the phase totals
    for key, total in (("bitops", c.bitops), ("energy_j", c.energy_j), ("latency_s", c.latency_s)):
        for phase in ("fwd", "dgrad", "wgrad", "total"):
            assert sum(r[key][phase] for r in c.per_layer) == pytest.approx(total[phase], rel=1e-12)


def test_trace_input_equals_schedule_input():
    sched = parse_schedule("cpt:3-8:g8:n4")
    T, B, N = 50, 32, 200  # 7 steps per epoch, last batch 8
    hw = load_profile("bitfusion")
    by_schedule = estimate(MIXED, sched, hw, steps=T, batch_size=B, dataset_size=N)
    q, g = sched.bits(T), sched.grad_bits(T)
    batches = [N - 6 * B if t % 7 == 6 else B for t in range(T)]
    lines = [{"step": t, "batch_size": b, "bits": int(qq), "grad_bits": int(gg)}
             for t, (b, qq, gg) in enumerate(zip(batches, q, g))]
    for trace in (lines, {"batch_size": np.array(batches), "bits": q, "grad_bits": g}):
        by_trace = estimate(MIXED, trace, hw)
        for key in ("bitops", "macs", "energy_j", "latency_s"):
            for phase, v in getattr(by_schedule, key).items():
                assert getattr(by_trace, key)[phase] == pytest.approx(v, rel=1e-12), (key, phase)
        assert (by_trace.steps, by_trace.samples) == (by_schedule.steps, by_schedule.samples)
        assert by_trace.relative_to_static == pytest.approx(by_schedule.relative_to_static, rel=1e-12)


def test_step_cost_is_one_step_of_estimate_and_exact_ints():
    a = MIXED.arrays()
    one = step_cost(a, 4, 8, 128)
    c = estimate(MIXED, [{"batch_size": 128, "bits": 4, "grad_bits": 8}], None)
    for phase in ("fwd", "dgrad", "wgrad"):
        assert isinstance(one["bitops"][phase], int) and isinstance(one["macs"][phase], int)
        assert one["bitops"][phase] == c.bitops[phase]
        assert one["macs"][phase] == c.macs[phase]
    first, fc = MIXED.layers[0], MIXED.layers[-1]
    assert one["bitops"]["fwd"] == 128 * (sum(r.macs["fwd"] for r in MIXED.layers[:-1]) * 16 + fc.macs["fwd"] * 1024)
    assert one["macs"]["dgrad"] == 128 * (sum(r.macs["dgrad"] for r in MIXED.layers))
    assert first.macs["dgrad"] == 0


# -- ragged batches -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("N,B", [(50_000, 128), (1437, 64), (1000, 100), (30, 64)])
def test_ragged_last_batch_is_modelled_exactly(N, B):
    epochs = 3
    spe = math.ceil(N / B)
    c = estimate(MIXED, make_schedule("cos-rep", 3, 8, 8, 4), None, epochs=epochs, batch_size=B, dataset_size=N)
    assert c.steps == epochs * spe
    assert c.samples == epochs * N
    per_sample = sum(sum(r.macs.values()) for r in MIXED.layers)
    assert c.macs["total"] == pytest.approx(epochs * N * per_sample, rel=1e-12)


# -- what hardware does with bits -------------------------------------------------------------------------------------


def _run(text, hw, profile=MIXED, steps=100, batch=128):
    return estimate(profile, parse_schedule(text), hw, steps=steps, batch_size=batch)


def test_h100_runs_5_bits_at_the_cost_of_8():
    five, eight = _run("static:5:g8", "h100"), _run("static:8:g8", "h100")
    assert five.bitops["total"] < eight.bitops["total"]
    assert five.latency_s["total"] == pytest.approx(eight.latency_s["total"], rel=1e-12)
    assert five.energy_j["total"] == pytest.approx(eight.energy_j["total"], rel=1e-12)
    assert _run("cpt:3-8:g8", "h100").vs_static["latency_s"] == pytest.approx(1.0, rel=1e-12)


def test_a100_runs_4_bits_cheaper_than_8():
    for g in (4, 8):
        four, eight = _run(f"static:4:g{g}", "a100"), _run(f"static:8:g{g}", "a100")
        assert four.latency_s["total"] < eight.latency_s["total"]
        assert four.energy_j["total"] < eight.energy_j["total"]


def test_bitfusion_4_bits_take_a_quarter_of_the_cycles_of_8_when_compute_bound():
    huge_compute = _profile([(True, (10**9,) * 3, (16, 16, 16))] * 3)  # ~no DRAM traffic per MAC
    four, eight = _run("static:4:g4", "bitfusion", huge_compute), _run("static:8:g8", "bitfusion", huge_compute)
    assert eight.latency_s["total"] / four.latency_s["total"] == pytest.approx(4.0, rel=1e-6)
    # The same workload on an 8-bit systolic array gains nothing, on an H100 nothing either.
    for hw in ("int8-systolic", "h100"):
        f, e = _run("static:4:g4", hw, huge_compute), _run("static:8:g8", hw, huge_compute)
        assert f.latency_s["total"] == pytest.approx(e.latency_s["total"], rel=1e-9)


def test_host_time_does_not_shrink_with_bits_but_pays_the_quantizers():
    fp, eight, four = _run("static:32:g32", "host"), _run("static:8:g8", "host"), _run("static:4:g4", "host")
    assert four.latency_s["total"] == pytest.approx(eight.latency_s["total"], rel=1e-12)
    assert eight.latency_s["total"] > fp.latency_s["total"]  # fake quantization adds element-wise passes


# -- the bytes and quantizer models, by hand ---------------------------------------------------------------------------


def test_bytes_moved_by_hand():
    numel = np.array([[10.0, 20.0, 30.0], [5.0, 6.0, 7.0]])
    macs = np.array([[100.0, 0.0, 100.0], [9.0, 9.0, 9.0]])
    quant = np.array([True, False])
    b = bytes_moved(numel, macs, quant, 4, 8, batch=2)
    # layer 0 at (q, q, g) = (4, 4, 8): W=10, I=40, O=60 elements this step
    assert b[0].tolist() == [(10 * 4 + 40 * 4 + 60 * 32) / 8, 0.0, (60 * 8 + 40 * 4 + 10 * 32) / 8]
    # layer 1 stays FP32 on every operand: W=5, I=12, O=14
    assert b[1].tolist() == [(5 + 12 + 14) * 4.0, (14 + 5 + 12) * 4.0, (14 + 12 + 5) * 4.0]
    # On an H100 a 5-bit tensor is stored as int8, and the int8 GEMM's output written at FP16 (the step's width);
    # on the host (fake quantization) everything as fp32.
    h100, host = load_profile("h100"), load_profile("host")
    on_h100 = bytes_moved(numel, macs, quant, 5, 8, 2, storage=storage_bits(h100))
    assert on_h100.tolist() == bytes_moved(numel, macs, quant, 8, 8, 2, storage=storage_bits(h100)).tolist()
    assert on_h100[0].tolist() == [(10 * 8 + 40 * 8 + 60 * 16) / 8, 0.0, (60 * 8 + 40 * 8 + 10 * 32) / 8]
    assert bytes_moved(numel, macs, quant, 5, 8, 2, storage=storage_bits(host)).tolist() == \
        bytes_moved(numel, macs, quant, 32, 32, 2).tolist()
    # K step kinds at once: (K, L, 3), each row as its scalar call
    many = bytes_moved(numel, macs, quant, np.array([4, 6]), np.array([8, 2]), np.array([2, 3]))
    assert many.shape == (2, 2, 3)
    assert many[1].tolist() == bytes_moved(numel, macs, quant, 6, 2, 3).tolist()


def test_quant_elems_by_hand():
    numel = np.array([[10.0, 20.0, 30.0], [5.0, 6.0, 7.0], [1.0, 2.0, 3.0]])
    macs = np.array([[100.0, 0.0, 100.0], [9.0, 9.0, 9.0], [1.0, 1.0, 1.0]])
    quant = np.array([True, True, False])
    e = quant_elems(numel, macs, quant, 4, 8, batch=2)
    assert e.tolist() == [[40 + 10, 0, 60],     # first layer: error quantization billed to wgrad (no dgrad)
                          [12 + 5, 14, 0],      # otherwise to dgrad, once for both backward GEMMs
                          [0, 0, 0]]            # full-precision layer: no quantizers
    assert quant_elems(numel, macs, quant, 32, 32, 2).sum() == 0


# -- results and bad input ---------------------------------------------------------------------------------------------


def test_cost_json_and_relative_to_static():
    c = _run("cpt:3-8:g8", "bitfusion")
    doc = json.loads(json.dumps(c.to_json()))
    assert {"bitops", "energy_j", "latency_s", "per_layer", "steps", "samples", "relative_to_fp32",
            "relative_to_static", "hardware", "baseline"} <= set(doc)
    assert set(doc["bitops"]) == {"fwd", "dgrad", "wgrad", "total"}
    assert doc["hardware"] == "bitfusion" and doc["baseline"]["bits"] == 8
    assert relative_to_static(MIXED, parse_schedule("cpt:3-8:g8"), "bitfusion", steps=100, batch_size=128) == \
        pytest.approx(c.vs_static)
    assert _run("static:8", "bitfusion").vs_static == {"bitops": 1.0, "energy_j": 1.0, "latency_s": 1.0}
    assert _run("cpt:3-8:g8", None).energy_j is None


@pytest.mark.parametrize("call", [
    lambda: _run("cpt", "no-such-hardware"),
    lambda: estimate(MIXED, parse_schedule("cpt"), None, steps=0, batch_size=8),
    lambda: estimate(MIXED, parse_schedule("cpt"), None, steps=10),
    lambda: estimate(MIXED, parse_schedule("cpt"), None, epochs=2, batch_size=8),
    lambda: estimate(MIXED, [{"batch_size": 8, "bits": 17, "grad_bits": 8}], None),
    lambda: estimate(MIXED, [{"batch_size": 8, "bits": 0, "grad_bits": 8}], None),
    lambda: estimate(MIXED, [{"batch_size": 8, "bits": 4, "grad_bits": 4.5}], None),
    lambda: estimate(MIXED, [{"batch_size": 0, "bits": 4, "grad_bits": 8}], None),
    lambda: estimate(MIXED, [{"bits": 4, "grad_bits": 8}], None),
    lambda: estimate(MIXED, [], None),
    lambda: estimate(MIXED, {"batch_size": [8, 8], "bits": [4], "grad_bits": [8, 8]}, None),
    lambda: estimate(MIXED, [{"batch_size": 8, "bits": 4, "grad_bits": 8}], None, steps=2),
    lambda: estimate({"format": "nope"}, parse_schedule("cpt"), None, steps=10, batch_size=8),
    lambda: step_cost(MIXED.arrays(), 33, 8, 1),
    lambda: step_cost(MIXED.arrays(), 8, 8, 0),
], ids=["unknown-hw", "steps-0", "no-batch", "epochs-no-dataset", "bits-17", "bits-0", "grad-bits-float",
        "batch-0", "trace-key", "empty-trace", "ragged-columns", "steps-vs-trace", "bad-profile",
        "step-bits-33", "step-batch-0"])
def test_bad_input_raises_input_error(call):
    with pytest.raises(InputError):
        call()


# -- the commands -----------------------------------------------------------------------------------------------------


def _cli(*args):
    return CliRunner().invoke(cli, list(args))


def test_profile_command_json_is_the_profile_document_plus_step_costs():
    r = _cli("profile", "--model", "digits-cnn", "--dataset", "digits", "--bits", "4", "--hw", "bitfusion",
             "--batch-size", "32", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    prof = LayerProfile.from_json(doc)
    assert prof.model == "digits-cnn" and prof.input_shape == [1, 8, 8]
    assert [layer["quantized"] for layer in doc["layers"]] == [True, True, True, False]
    assert doc["layers"][0]["macs"]["dgrad"] == 0
    assert doc["step"]["hardware"] == "bitfusion" and doc["step"]["bits"] == 4
    want = step_cost(prof.arrays(), 4, 8, 32)["bitops"]
    assert doc["step"]["bitops"]["fwd"] == want["fwd"]
    assert sum(layer["step"]["latency_s"]["total"] for layer in doc["layers"]) == \
        pytest.approx(doc["step"]["latency_s"]["total"])


def test_profile_command_table_and_shape_flags():
    r = _cli("profile", "--model", "token-mlp", "--input-shape", "4,12", "--num-classes", "3", "--fp-layers", "none")
    assert r.exit_code == 0, r.output
    assert "fc1" in r.stdout and "total" in r.stdout


def test_cost_command_compares_profiles():
    r = _cli("cost", "--model", "digits-cnn", "--schedule", "cpt:3-8:g8:n4", "--epochs", "2", "--batch-size", "64",
             "--hw", "h100,bitfusion", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["workload"]["samples"] == 2 * 1437 and doc["workload"]["steps"] == 2 * 23
    rows = {p["hardware"]: p for p in doc["profiles"]}
    assert rows["h100"]["saving_vs_static"]["latency_s"] == pytest.approx(0.0, abs=1e-12)
    assert rows["bitfusion"]["saving_vs_static"]["latency_s"] > 0.05
    assert rows["h100"]["bitops"] == rows["bitfusion"]["bitops"]
    table = _cli("cost", "--schedule", "cpt", "--steps", "100", "--hw", "h100,stripes")
    assert table.exit_code == 0, table.output
    assert "stripes" in table.stdout and "saving" in table.stdout


@pytest.mark.parametrize("args", [
    ("profile", "--hw", "no-such-hw"),
    ("profile", "--bits", "17"),
    ("profile", "--input-shape", "3,x,3"),
    ("profile", "--model", "no-such-model"),
    ("cost", "--steps", "0"),
    ("cost", "--steps", "10", "--epochs", "1"),
    ("cost", "--input-shape", "1,8,8"),  # the default 15 epochs, of an epoch size not known
    ("cost", "--epochs", "1", "--input-shape", "1,8,8"),
    ("cost", "--steps", "10", "--schedule", "cpt:3-40"),
    ("cost", "--steps", "10", "--hw", "h100,nope"),
])
def test_commands_exit_2_with_one_line_on_bad_input(args):
    r = _cli(*args)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr


# -- issue 23, item 7c: an int GEMM on a GPU writes its outputs into the step's FP16 pipeline ---------------------------


def test_gpu_int_gemms_write_fp16_outputs_by_hand_count():
    # one conv: W weights, I inputs and O outputs per sample; batch 4, q = g = 8 on an A100 (int8 tier: operands
    # stored at 8 bits); outputs (activation, input gradient) at 16, the weight gradient at 32
    W, I, O, n = 1000, 300, 500, 4
    prof = _profile([(True, (7, 7, 7), (W, I, O))])
    a = prof.arrays()
    got = bytes_moved(a.numel, a.macs, a.quantized, 8, 8, n, a.calls, storage_bits(load_profile("a100")))
    want = [(W * 8 + I * n * 8 + O * n * 16) / 8,
            (O * n * 8 + W * 8 + I * n * 16) / 8,
            (O * n * 8 + I * n * 8 + W * 32) / 8]
    assert got[0].tolist() == want


@pytest.mark.parametrize("hw_name", ["a100", "h100", "t4"])
def test_an_int8_step_moves_no_more_dram_bytes_than_an_fp16_one(hw_name):
    from cptsim.measure.profiler import profile_named_model

    a = profile_named_model("resnet20", (3, 32, 32), 10, None).arrays()
    store = storage_bits(load_profile(hw_name))
    total = {q: bytes_moved(a.numel, a.macs, a.quantized, q, 8, 128, a.calls, store).sum() for q in (4, 8, 16)}
    assert total[4] <= total[8] <= total[16]
    assert total[8] < total[16]   # narrower operands, same outputs


# -- issue 23, item 7e: attention's Matmul reads its second operand (K, V) and writes its gradient ----------------------


def test_attention_matmuls_count_their_second_operand_by_hand():
    from cptsim.measure.profiler import profile_model
    from cptsim.models import create_model

    T, classes = 12, 50
    from cptsim.numerics.layers import quantize_model

    m = create_model("transformer-lm", num_classes=classes, in_channels=1, input_shape=(T,))
    quantize_model(m)
    width = m.blocks[0].attn.q.in_features
    prof = profile_model(m, (T,), batch_size=2, model_name="transformer-lm")
    rows = {r.name: r for r in prof.layers}
    mats = [r for r in prof.layers if r.type == "Matmul"]
    assert mats and all(r.operand == width * T for r in mats)   # kᵀ: heads x head_dim x T; v: heads x T x head_dim
    assert all(r.operand == 0 for r in prof.layers if r.type != "Matmul")
    back = LayerProfile.from_json(json.loads(json.dumps(prof.to_json())))
    assert [r.operand for r in back.layers] == [r.operand for r in prof.layers]

    # the bytes of one Matmul row at FP32 and on an A100 under AMP, by hand
    r = rows[mats[0].name]
    a = LayerProfile("x", [T], [r]).arrays()
    I, O, B, n = r.numel["input"], r.numel["output"], r.operand, 4
    got = bytes_moved(a.numel, a.macs, a.quantized, 32, 32, n, a.calls, None, a.operand)[0]
    assert got.tolist() == [(B + I + O) * n * 4.0, (O + B + I) * n * 4.0, (O + I + B) * n * 4.0]
    got = bytes_moved(a.numel, a.macs, a.quantized, 16, 16, n, a.calls, storage_bits(load_profile("a100")),
                      a.operand)[0]
    assert got.tolist() == [(B + I + O) * n * 2.0, (O + B + I) * n * 2.0, (O + I + B) * n * 2.0]
    assert r.quantized   # every Matmul runs at the schedule's bits (QMatmul), so the rows above are its bits
    # and the second operand is quantized in the forward pass like the first
    qe = quant_elems(a.numel, a.macs, a.quantized, 8, 8, n, a.calls, a.operand)[0]
    assert qe[0] == (I + B) * n


_PREFIX = {"E": 1e18, "P": 1e15, "T": 1e12, "G": 1e9, "M": 1e6, "k": 1e3, "": 1.0, "m": 1e-3, "µ": 1e-6}


def _read_si(text: str, unit: str) -> float:
    """'9.64 TBitOPs' -> 9.64e12: the printed figure read back, prefix by prefix."""
    number, rest = text.split(" ")
    assert rest.endswith(unit), (text, unit)
    return float(number) * _PREFIX[rest[: -len(unit)]]


@pytest.mark.parametrize("hw, workload", [("h100", "schedule"), ("bitfusion", "trace"), (None, "schedule")])
def test_a_cost_prints_as_a_short_table_of_the_totals_it_holds(hw, workload):
    sched = parse_schedule("cpt:3-8:g8:n8")
    if workload == "trace":
        q = sched.bits(50)
        c = estimate(MIXED, {"batch_size": 64, "bits": q, "grad_bits": np.full_like(q, 8)}, hw)
    else:
        c = estimate(MIXED, sched, hw, steps=50, batch_size=64)
    text = str(c)
    assert len(text.encode()) < 1024 and all(len(line) <= 80 for line in text.splitlines())
    assert len(repr(c)) <= 120 and "\n" not in repr(c)
    doc = c.to_json()
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines()}
    for ph in ("fwd", "dgrad", "wgrad", "total"):  # 3 significant digits: within 0.5% of what to_json holds
        got = rows[ph]
        assert _read_si(" ".join(got[0:2]), "BitOPs") == pytest.approx(doc["bitops"][ph], rel=5e-3)
        assert _read_si(" ".join(got[2:4]), "MACs") == pytest.approx(doc["macs"][ph], rel=5e-3)
        if hw is None:
            assert got[4:] == ["-", "-"]
        else:
            assert _read_si(" ".join(got[4:6]), "J") == pytest.approx(doc["energy_j"][ph], rel=5e-3)
            assert _read_si(" ".join(got[6:8]), "s") == pytest.approx(doc["latency_s"][ph], rel=5e-3)
    flat = " ".join(text.split())  # the baseline line may wrap
    assert f"vs {doc['baseline']['label']}:" in flat
    for key, name in (("bitops", "BitOPs"), ("energy_j", "energy"), ("latency_s", "latency")):
        m = re.search(rf"{name} ([0-9.]+)x", flat.split(" vs ")[-1])
        if hw is None and key != "bitops":
            assert m is None
        else:
            assert float(m.group(1)) == pytest.approx(doc["vs_static"][key], abs=5e-4)

"""Per-layer precision schedules (issue 27): rules resolved on a model, the cost counted per layer by hand, the bits
each layer ran at in training, executed BitOPs = planned per layer, kill/resume exactness, bad input in one line."""

import json
import signal

import numpy as np
import pytest
import torch

from cli_util import one_line_error
from shared_runs import cptsim, cptsim_here

from cptsim.cost.layerplan import parse_layer_text, read_layer_schedule
from cptsim.cost.model import estimate
from cptsim.cost.schedules import make_schedule, parse_schedule
from cptsim.errors import InputError

QUANT = ["features.0", "features.3", "features.7"]  # digits-cnn's quantized layers; fc stays FP32
BASE = "cpt:3-6:g8:n4"
RULES = "features.0=8;features.7=+1;features.*=2-5;features.3=4-6"  # last match wins: features.3 4-6, .0 2-5


def test_rules_resolve_last_match_wins_offsets_ranges_and_static_widths():
    base = parse_schedule(BASE)
    lp = parse_layer_text(RULES).resolve(base, QUANT, ["fc"], "digits-cnn")
    want = {"features.0": make_schedule("cos-rep", 2, 5, 8, 4), "features.3": make_schedule("cos-rep", 4, 6, 8, 4),
            "features.7": make_schedule("cos-rep", 2, 5, 8, 4)}
    assert {n: lp.schedule_of(n) for n in QUANT} == want and lp.schedule_of("fc") == base
    one = parse_layer_text("features.0=8;features.7=+1").resolve(base, QUANT, ["fc"])
    assert one.schedule_of("features.0").bits(10).tolist() == [8] * 10
    assert one.schedule_of("features.7") == make_schedule("cos-rep", 4, 7, 8, 4)
    assert one.schedule_of("features.3") == base
    # a static global schedule takes static widths and offsets, 32 included
    st = parse_layer_text("features.0=32;features.3=-2").resolve(parse_schedule("static:6"), QUANT, [])
    assert st.schedule_of("features.0").to_text() == "static:32:g8" and st.schedule_of("features.3").q_max == 4


@pytest.mark.parametrize("rules, model, why", [
    ("conv9=4", "digits-cnn", "matches no quantized layer"),
    ("fc=4", "digits-cnn", "only full-precision"),
    ("features.0=15-17", "digits-cnn", "outside 1..16"),
    ("features.0=-3", "digits-cnn", "outside 1..16"),
    ("features.0=32", "digits-cnn", "--fp-layers"),
])
def test_bad_rules_are_input_errors(rules, model, why):
    with pytest.raises(InputError, match=why.replace(".", r"\.").replace("-", r"\-")):
        parse_layer_text(rules).resolve(parse_schedule(BASE), QUANT, ["fc"], model)


def test_a_layer_file_for_another_model_is_refused(tmp_path):
    f = tmp_path / "layers.toml"
    f.write_text('format = "cptsim.layers/1"\nmodel = "resnet20"\n[layers]\n"layer1.*" = "2-6"\n')
    ls = read_layer_schedule(f)
    assert ls.rules[0].to_text() == "layer1.*=2-6"
    with pytest.raises(InputError, match="for model 'resnet20', not 'digits-cnn'"):
        ls.resolve(parse_schedule(BASE), QUANT, ["fc"], "digits-cnn")


@pytest.mark.parametrize("flags", [
    ["--layer", "nope.*=4"],
    ["--layer", "features.0=2-20"],
    ["--layer", "features.0"],
    ["--schedule", "static:4", "--layer", "features.0=33"],  # 32 is full precision; nothing above it is a width
    ["--schedule", "static:4", "--layer", "features.0=0"],
    ["--layer-schedule", "OTHER_MODEL"],  # a file written for resnet20, on the default digits-cnn
])
def test_cli_bad_layer_input_is_one_line_exit_2(flags, tmp_path):
    other = tmp_path / "resnet20-layers.toml"
    other.write_text('format = "cptsim.layers/1"\nmodel = "resnet20"\n[layers]\n"layer1.*" = "2-6"\n')
    flags = [other if f == "OTHER_MODEL" else f for f in flags]
    r = cptsim_here("train", "--steps", "2", "--quiet", "--out", tmp_path / "r", *flags)
    assert "layer" in one_line_error(r)
    assert not (tmp_path / "r").exists()


def _profile():
    from cptsim.planner.workload import Workload

    return Workload.build("digits-cnn", steps=40).profile


@pytest.mark.parametrize("hw", [None, "bitfusion"])
def test_per_layer_cost_is_the_hand_count_and_the_layers_rows_of_whole_model_estimates(hw):
    prof = _profile()
    a = prof.arrays()
    base = parse_schedule(BASE)
    lp = parse_layer_text(RULES).resolve(base, QUANT, ["fc"])
    T, B = 40, 64
    c = estimate(prof, base, hw, steps=T, batch_size=B, layers=lp)
    for i, n in enumerate(a.names):  # BitOPs by hand: sum over steps of M·q·q + M·g·q + M·g·q
        q = lp.schedule_of(n).bits(T)
        m = a.macs[i] * B
        want = ((m[0] * q * q + m[1] * 8 * q + m[2] * 8 * q).sum() if a.quantized[i] else m.sum() * 32 * 32 * T)
        assert c.per_layer[i]["bitops"]["total"] == pytest.approx(want, rel=1e-12)
        if hw:  # each layer's energy is its row of the whole model at its own schedule
            own = estimate(prof, lp.schedule_of(n), hw, steps=T, batch_size=B)
            assert c.per_layer[i]["energy_j"]["total"] == pytest.approx(own.per_layer[i]["energy_j"]["total"])
    assert c.bitops["total"] == pytest.approx(sum(r["bitops"]["total"] for r in c.per_layer))
    # the baseline is unchanged: the whole model at static q_max
    assert c.baseline["bitops"]["total"] == estimate(prof, base, hw, steps=T, batch_size=B).baseline["bitops"]["total"]


def test_executed_bits_and_bitops_per_layer_equal_the_plan():
    """Drive the training workload's layers step by step: the bits each quantized layer held when its forward ran
    (hooks) are the plan's, and those bits x the MACs it executed give, per layer, the plan's BitOPs."""
    from cptsim.measure.profiler import MacCounter
    from cptsim.run.train import TrainConfig, build

    T = 12
    cfg = TrainConfig(steps=T, schedule=BASE, layer_schedule=parse_layer_text(RULES).to_json(), batch_size=16)
    w = build(cfg)
    mods = dict(w.model.named_modules())
    seen = {n: [] for n in QUANT}
    for n in QUANT:
        mods[n].register_forward_hook(lambda m, i, o, n=n: seen[n].append(m.precision.bits))
    counter = MacCounter(w.model, cfg.model)
    x = torch.stack([w.train_set[i][0] for i in range(16)])
    y = torch.tensor([w.train_set[i][1] for i in range(16)])
    executed = np.zeros((4, 3))
    for t in range(T):
        w.set_bits(w.bits[t], w.grad_bits[t], t)
        counter.reset()
        torch.nn.functional.cross_entropy(w.model(x), y).backward()
        arr = counter.step_arrays()
        for i, n in enumerate(arr.names):
            q = seen[n][-1] if n in seen else 32
            g = w.grad_bits[t] if n in seen else 32
            executed[i] += arr.macs[i] * np.array([q * q, g * q, g * q])
    counter.close()
    # the hand-made schedules: features.0 and .7 at cos-rep 2-5, features.3 at 4-6, n4, over T steps
    assert seen["features.3"] == make_schedule("cos-rep", 4, 6, 8, 4).bits(T).tolist()
    assert seen["features.0"] == seen["features.7"] == make_schedule("cos-rep", 2, 5, 8, 4).bits(T).tolist()
    planned = estimate(_profile(), parse_schedule(BASE), None, steps=T, batch_size=16, layers=w.layers)
    for i, row in enumerate(planned.per_layer):
        assert row["name"] == arr.names[i]
        assert [row["bitops"][p] for p in ("fwd", "dgrad", "wgrad")] == pytest.approx(executed[i].tolist(), rel=1e-12)


LAYER_RUN = ["train", "--epochs", "2", "--batch-size", "128", "--quiet", "--checkpoint-every", "5",
             "--schedule", BASE, "--layer", "features.0=8", "--layer", "features.7=+1"]


@pytest.fixture(scope="module")
def layer_ref(tmp_path_factory):
    """The uninterrupted per-layer run (LAYER_RUN), made once: the kill/resume test and the report test read it."""
    ref = tmp_path_factory.mktemp("layer-run") / "ref"
    r = cptsim_here(*LAYER_RUN, "--out", ref)
    assert r.exit_code == 0, r.output
    return ref


def test_a_per_layer_run_killed_and_resumed_equals_the_uninterrupted_run_and_its_plan(tmp_path, layer_ref):
    from cptsim.run.rundir import RunDir

    ref, cut = layer_ref, tmp_path / "cut"
    k = cptsim(*LAYER_RUN, "--out", cut, env_extra={"CPTSIM_FAULT_KILL_AT_STEP": "17"})
    assert k.returncode == -signal.SIGKILL, k.stderr
    r = cptsim_here("train", "--resume", cut, "--quiet")
    assert r.exit_code == 0, r.output
    a, b = RunDir.open(ref), RunDir.open(cut)
    sa, sb = a.load_checkpoint()["model"], b.load_checkpoint()["model"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    ta = [json.loads(x) for x in (ref / "trace.jsonl").read_text().splitlines()]
    tb = [json.loads(x) for x in (cut / "trace.jsonl").read_text().splitlines()]
    assert [(x["step"], x["loss"], x["bitops"]) for x in ta] == [(x["step"], x["loss"], x["bitops"]) for x in tb]
    # executed (the trace: the bits the layers held x measured MACs) = planned, in every phase
    cfg = json.loads((ref / "config.json").read_text())
    assert cfg["layers"]["layers"] == {"features.0": "cos-rep:8-8:g8:n4", "features.7": "cos-rep:4-7:g8:n4"}
    from cptsim.cost.layerplan import layer_schedule_from_json
    from cptsim.measure.profiler import LayerProfile

    prof = LayerProfile.from_json(json.loads((ref / "profile.json").read_text()))
    base = parse_schedule(BASE)
    lp = layer_schedule_from_json(cfg["settings"]["layer_schedule"]).resolve(base, QUANT, ["fc"])
    plan = estimate(prof, base, None, steps=24, batch_size=128, dataset_size=cfg["train_size"], layers=lp)
    for p in ("fwd", "dgrad", "wgrad"):
        assert sum(x["bitops"][p] for x in ta) == plan.bitops[p]
    recount = estimate(prof, ta, None, layers=lp, layer_steps=24)  # the report's re-count from the trace
    assert [r["bitops"] for r in recount.per_layer] == [r["bitops"] for r in plan.per_layer]
    # the results database's row: the per-layer BitOPs (the trace's sum), the rules named, which --quality db
    # reads as the run's plan (its features are the plan's: tests/test_quality_perlayer.py)
    from cptsim.study.results import run_row
    from cptsim.planner.quality import _layers_text

    row = run_row(ref)
    assert row["bitops"] == sum(sum(x["bitops"][p] for p in ("fwd", "dgrad", "wgrad")) for x in ta)
    assert row["bitops"] != estimate(prof, ta, None).bitops["total"]  # what the global bits alone would give
    assert row["extra"]["layers"] == lp.rules.to_text() and row["schedule"] == base.to_text()
    assert _layers_text(row) == lp.rules.to_text() and _layers_text({"extra": {}}) is None


def test_report_counts_a_per_layer_runs_planned_steps_bits_and_layers_each_at_its_own_bits(layer_ref):
    """cptsim report of the per-layer run: the planned BitOPs of every step, the bits the plot draws (per group of
    layers and forward-MAC-weighted) and the layer table, against a hand count from the rules and the trace's
    samples per step (the last batch of each epoch is ragged)."""
    from cptsim.study.report import build_report

    rep = build_report(layer_ref, hardware=[])
    s, d = rep.series, rep.data
    prof = json.loads((layer_ref / "profile.json").read_text())
    macs = {x["name"]: np.array([x["macs"][p] for p in ("fwd", "dgrad", "wgrad")], float) for x in prof["layers"]}
    trace = [json.loads(x) for x in (layer_ref / "trace.jsonl").read_text().splitlines()]
    T, n = len(trace), np.array([x["batch_size"] for x in trace], float)
    own = {"features.0": make_schedule("cos-rep", 8, 8, 8, 4), "features.3": make_schedule("cos-rep", 3, 6, 8, 4),
           "features.7": make_schedule("cos-rep", 4, 7, 8, 4)}
    bits = {k: v.bits(T) for k, v in own.items()}
    # per step: fwd M q q + dgrad M g q + wgrad M g q per quantized layer, the FP32 classifier at 32 x 32
    hand = sum(n * (macs[k][0] * q * q + macs[k][1] * 8 * q + macs[k][2] * 8 * q) for k, q in bits.items())
    hand = hand + n * macs["fc"].sum() * 32 * 32
    assert s["planned_bitops"] == pytest.approx(hand, rel=1e-12)
    assert s["executed_bitops"] == pytest.approx(hand, rel=1e-12)
    assert s["planned_bitops"].sum() == pytest.approx(d["bitops"]["planned"]["total"], rel=1e-12)
    assert d["bitops"]["within_tolerance"] and abs(d["bitops"]["diff_pct"]["total"]) < 1e-9
    lb = s["layer_bits"]
    m = np.array([macs[k][0] for k in QUANT])
    eff = (m / m.sum()) @ np.array([bits[k] for k in QUANT])
    assert lb["planned_effective"] == pytest.approx(eff, rel=1e-12)
    assert lb["executed_effective"] == pytest.approx(eff, rel=1e-12)
    groups = {g["schedule"]: g for g in lb["groups"]}
    assert set(groups) == {own[k].to_text() for k in QUANT}
    for k in QUANT:
        g = groups[own[k].to_text()]
        assert g["layers"] == [k] and g["mac_share"] == pytest.approx(macs[k][0] / m.sum())
        assert g["bits"].tolist() == bits[k].tolist()
    assert {r["name"]: r["bits"] for r in d["layers"]["top"]} == {"features.0": "8", "features.3": "3-6",
                                                                    "features.7": "4-7", "fc": "32"}
    pytest.importorskip("matplotlib")
    from cptsim.study.plots import run_figure

    assert run_figure(rep)[:4] == b"\x89PNG"

"""A first report models host time with this machine measured once, kept per machine, not with placeholders."""

import json

import pytest

from cptsim.calibration.autocal import auto_profile_path, report_host
from cptsim.run.rundir import RunDir


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("CPTSIM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CPTSIM_NO_CALIBRATE", raising=False)
    return tmp_path / "home"


def _run(tmp_path, threads=1):
    return RunDir.create(tmp_path / "run", {
        "settings": {"model": "m", "dataset": "d", "device": "cpu"}, "schedule": {"text": "static:8"},
        "total_steps": 1, "steps_per_epoch": 1, "eval_bits": 8, "host": {"threads": threads}}).path


def test_report_measures_the_host_once_and_reuses_it(home, tmp_path):
    run = _run(tmp_path)
    said = []
    first = report_host(run, say=said.append, seconds=0.4)
    assert first == str(auto_profile_path("cpu", 1)) and first.startswith(str(home))
    assert len(said) == 2 and "measuring it once" in said[0] and "kept in" in said[1]
    text = open(first).read()
    assert "calibrated = true" in text and "op_list = true" in text and "reference workloads" in text
    said.clear()
    assert report_host(run, say=said.append) == first and said == []  # kept: not measured again


def test_no_calibrate_and_a_users_own_profile_are_respected(home, tmp_path):
    run = _run(tmp_path, threads=3)
    assert report_host(run, calibrate=False) == "host"
    assert not auto_profile_path("cpu", 3).exists()
    assert report_host(run, host="h100") == "h100"
    (home / "hw_profiles").mkdir(parents=True)
    (home / "hw_profiles" / "host.toml").write_text("")  # the user's own (cptsim hw calibrate)
    assert report_host(run) == "host"


def test_the_profile_is_keyed_by_thread_count_and_device(home):
    assert auto_profile_path("cpu", 1) != auto_profile_path("cpu", 2) != auto_profile_path("cuda", 2)


# -- the fixed costs' fit ---------------------------------------------------------------------------------------------

# a machine's fixed costs (seconds): per quantized conv phase, per other quantized layer phase, per launched op
KNOWN = {"conv": 420e-6, "layer": 160e-6, "op": 11e-6}


def _step(name, work, conv=0.0, layer=0.0, op=0.0, costs=KNOWN):
    from cptsim.calibration.autocal import ReferenceStep

    counts = {"conv": conv, "layer": layer, "op": op}
    return ReferenceStep(name, "", work + sum(costs[k] * counts[k] for k in costs), work, counts)


def test_the_fit_recovers_the_fixed_costs_of_synthetic_steps():
    from cptsim.calibration.autocal import fit_fixed_costs

    # the reference set's shapes: a CNN, an MLP, a transformer block, a graph convolution, a norm stack
    steps = [_step("cnn", 5e-3, conv=8, op=45), _step("mlp", 1.7e-3, layer=8, op=31),
             _step("transformer", 11e-3, layer=27, op=101), _step("graph", 0.8e-3, layer=5, op=42),
             _step("norms", 0.4e-3, op=46)]
    assert fit_fixed_costs(steps) == pytest.approx(KNOWN, rel=1e-6)
    # no workload with a convolution: a convolution costs what another layer does
    got = fit_fixed_costs(steps[1:])
    assert got["layer"] == pytest.approx(KNOWN["layer"]) and got["conv"] == got["layer"]
    assert got["op"] == pytest.approx(KNOWN["op"])
    # workloads with the same launches per layer-phase cannot part the two: the layer-phase takes it all, and the
    # model still reproduces them
    alike = [_step("a", 1e-3, layer=8, op=32), _step("b", 2e-3, layer=16, op=64)]
    got = fit_fixed_costs(alike)
    assert got["op"] == 0.0
    assert all(s.modelled_s(got) == pytest.approx(s.measured_s) for s in alike)
    # a workload measured faster than its work alone: costs stay >= 0
    assert min(fit_fixed_costs([_step("x", 1e-3, layer=8, op=30, costs=dict.fromkeys(KNOWN, 0.0))]
                               + [_step("y", 2e-3, layer=2, op=80)]).values()) >= 0.0


def test_step_overhead_recovers_a_machines_fixed_costs_from_its_reference_steps(tmp_path):
    """Reference steps timed on a simulated machine whose fixed costs are KNOWN (its rates: the measured ones):
    each step takes its modelled work plus KNOWN x what it runs -- executed phases counted by hand, launches from
    its op list plus its full-precision layer's phases. The fit gives KNOWN back, and the profile written with
    it prices the workloads at those times."""
    from cptsim.calibration import autocal
    from cptsim.calibration.calibrate import write_host_profile
    from cptsim.cost.hardware.host import host_op_totals

    measured = _rates()
    refs = [r for r in autocal.REFERENCES if r.name in ("cnn", "mlp", "norms")]
    # by hand: 3 convs (the first has no dgrad, its input needs no gradient), an FP32 head; 3 Linear layers (the
    # first without dgrad); no quantized layer and an FP32 head
    phases = {"cnn": {"conv": 8, "layer": 0, "fp": 3}, "mlp": {"conv": 0, "layer": 8, "fp": 0},
              "norms": {"conv": 0, "layer": 0, "fp": 3}}
    seen = {}

    def timer(ref, step):
        _, _, (work, counts), close = autocal.prepare_reference(measured, "cpu", ref)
        close()
        assert counts["conv"] == pytest.approx(phases[ref.name]["conv"], abs=1e-6)
        assert counts["layer"] == pytest.approx(phases[ref.name]["layer"], abs=1e-6)
        seen[ref.name] = counts
        return work + KNOWN["conv"] * counts["conv"] + KNOWN["layer"] * counts["layer"] + KNOWN["op"] * counts["op"]

    out = autocal.step_overhead(measured, "cpu", 0.1, refs=refs, timer=timer)
    assert out["op_list"] is True
    assert {k: out[f"{k}_overhead_s"] for k in KNOWN} == pytest.approx(KNOWN, rel=1e-3)
    assert [r["workload"] for r in out["references"]] == ["cnn", "mlp", "norms"]
    assert all(abs(r["error_pct"]) < 0.1 for r in out["references"])
    # the launches the fit used are the op list's plus the full-precision layer's phases
    ref = refs[2]
    net = ref.make()
    from cptsim.numerics.layers import quantize_model

    ops = autocal._op_list(net, ref, quantize_model(net, fp_layers=list(ref.fp_layers)), "cpu")
    assert seen["norms"]["op"] == pytest.approx(host_op_totals(ops)["launches"].sum() + 3)
    path, host = write_host_profile(out, tmp_path / "fitted.toml")
    assert host.prices_op_list and host.params["conv_overhead_us"] == pytest.approx(420, rel=1e-3)


def _rates() -> dict:
    """Rates of a plausible CPU (what calibrate_host returns), without measuring."""
    return {"device": "cpu", "threads": 1, "cpu": "test", "gpu": None, "torch_version": "x",
            "matmul_macs_per_s": 50e9, "matmul_by_shape": [{"shape": [1, 1, 1], "macs_per_s": 50e9}],
            "bandwidth_bytes_per_s": 20e9, "elementwise_elems_per_s": 2e9, "rng_elems_per_s": 0.15e9,
            "transcendental_elems_per_s": 1.5e9, "attention_macs_per_s": 25e9, "layer_overhead_s": 180e-6,
            "tiers": {}, "power_w": None, "power_source": "unknown", "measured_at": "now"}


def test_hw_calibrate_prints_its_fit_on_each_reference_workload(tmp_path):
    from click.testing import CliRunner

    from cptsim.cli.hw_cmd import hw

    out = tmp_path / "box.toml"
    r = CliRunner().invoke(hw, ["calibrate", "--out", str(out), "--seconds", "0.2"])
    assert r.exit_code == 0, r.output
    table = r.output[r.output.index("fixed costs fitted to reference training steps"):]
    for col in ("workload", "measured", "modelled", "error %"):
        assert col in table
    for name in ("cnn", "mlp", "transformer", "graph", "norms"):
        assert f"\n│ {name} " in table or f"\n{name} " in table or f" {name} " in table
    assert "op_list = true" in out.read_text() and "fixed costs fitted to training steps" in out.read_text()
    doc = CliRunner().invoke(hw, ["calibrate", "--out", str(tmp_path / "b.toml"), "--seconds", "0.1", "--json"])
    refs = json.loads(doc.output)["measured"]["references"]
    assert [x["workload"] for x in refs] == ["cnn", "mlp", "transformer", "graph", "norms"]
    assert all(x["measured_s"] > 0 and x["modelled_s"] > 0 for x in refs)

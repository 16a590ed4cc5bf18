"""Measured energy: the NVML meter's arithmetic, the trace's optional energy columns, and the report's measured vs
modelled energy per epoch (on a CPU, with a trace that carries energy as a CUDA run's does)."""

import json

import pytest

from cptsim.measure.energy import EnergyMeter, nvml_index


def test_meter_reports_energy_and_power_between_reads():
    counter = iter([1000, 1500, 1500, 4500])  # mJ
    clock = iter([10.0, 10.5, 11.0, 12.0])  # s
    m = EnergyMeter(lambda: next(counter), clock=lambda: next(clock))
    assert m.read() == (0.5, 1.0)   # 500 mJ over 0.5 s
    assert m.read() == (0.0, 0.0)   # the counter had not moved (it refreshes every few tens of ms)
    assert m.read() == (3.0, 3.0)


def test_meter_start_leaves_out_what_was_drawn_before_it():
    counter = iter([1000, 9000, 9600])  # mJ: 8 J drawn between steps (an evaluation), then 0.6 J in the step
    clock = iter([0.0, 5.0, 5.2])
    m = EnergyMeter(lambda: next(counter), clock=lambda: next(clock))
    m.start()
    assert m.read() == (0.6, 3.0)


def test_fit_takes_the_power_training_draws_from_measured_energy_and_predicts_energy():
    import numpy as np

    from cptsim.calibration.fit import RunSteps, fit_host
    from cptsim.cost.hardware import load_profile

    base = load_profile("host")
    comp = np.tile([[0.004, 0.001, 0.001, 0.001]], (20, 1))
    meas = comp.sum(axis=1)
    run = RunSteps("a", comp, meas, energy=meas * 250.0)  # 250 W while training
    held = RunSteps("b", comp * 2, meas * 2, energy=meas * 2 * 300.0)
    fit = fit_host([run], base)
    assert fit.power_w == pytest.approx(250.0)
    doc = fit.evaluate(held)
    assert doc["measured_avg_power_w"] == pytest.approx(300.0)
    assert doc["energy_error_pct"] == pytest.approx((250 / 300 - 1) * 100, abs=2)
    assert "power_w = NVML energy" in __import__("cptsim.calibration.fit", fromlist=["x"]).fitted_profile_toml(fit, "f")


def test_meter_never_reports_negative_energy():
    counter = iter([5000, 100])  # the driver reloaded and the counter restarted
    clock = iter([0.0, 1.0])
    assert EnergyMeter(lambda: next(counter), clock=lambda: next(clock)).read() == (0.0, 0.0)


def test_nvml_index_follows_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert nvml_index(0) == 2 and nvml_index(1) == 3
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert nvml_index(1) == 1


def test_cpu_runs_have_no_energy_columns_and_no_meter(tmp_path):
    from cptsim.run.train import TrainConfig, train

    cfg = TrainConfig(model="digits-cnn", dataset="synthetic:1,8,8:10:64", schedule="cpt:3-8:g8:n2", steps=2,
                      batch_size=32)
    trace = train(cfg, str(tmp_path / "run"), progress=False).read_trace().records
    assert all("energy_j" not in r and "power_w" not in r and "host_syncs" not in r for r in trace)


@pytest.fixture()
def energy_run(tmp_path):
    """A finished CPU run whose trace is given energy columns, as a CUDA run with NVML writes them."""
    from cptsim.run.train import TrainConfig, train

    cfg = TrainConfig(model="digits-cnn", dataset="synthetic:1,8,8:10:96", schedule="cpt:3-8:g8:n2", epochs=2,
                      batch_size=32)
    run = train(cfg, str(tmp_path / "run"), progress=False)
    path = run.path / "trace.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    for r in lines:
        r["energy_j"], r["power_w"] = 2.0 * r["time_s"] * 100, 200.0  # a 200 W GPU
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return run


def _host_profile(tmp_path, power_w):
    from cptsim.cost.hardware import host_profile_text

    text = host_profile_text("gpuhost", "test", ["test"], {
        "matmul_gmac_s": 1000.0, "bandwidth_gb_s": 1000.0, "elementwise_gelem_s": 100.0, "layer_overhead_us": 10.0,
        "power_w": power_w, "calibrated": True, "device": "cuda"}, {"compute_efficiency": 1.0, "memory_efficiency": 1.0})
    p = tmp_path / "gpuhost.toml"
    p.write_text(text)
    return str(p)


def test_report_compares_measured_and_modelled_energy_per_epoch(energy_run, tmp_path):
    from cptsim.study.report import build_report

    h = build_report(energy_run.path, host=_host_profile(tmp_path, 150.0)).data["host_time"]
    trace = energy_run.read_trace().records
    assert h["measured_energy_j"] == pytest.approx(sum(r["energy_j"] for r in trace))
    assert h["modelled_energy_j"] == pytest.approx(150.0 * h["modelled_s"])
    assert h["measured_avg_power_w"] == pytest.approx(200.0, rel=1e-3)
    assert len(h["per_epoch"]) == 2
    for e in h["per_epoch"]:
        assert e["modelled_energy_j"] == pytest.approx(150.0 * e["modelled_s"])
        assert e["energy_error_pct"] == pytest.approx((e["modelled_energy_j"] / e["measured_energy_j"] - 1) * 100)


def test_report_without_measured_energy_says_how_to_get_it(tmp_path):
    from cptsim.study.report import build_report
    from cptsim.run.train import TrainConfig, train

    cfg = TrainConfig(model="digits-cnn", dataset="synthetic:1,8,8:10:64", schedule="cpt:3-8:g8:n2", steps=2,
                      batch_size=32)
    run = train(cfg, str(tmp_path / "run"), progress=False)
    h = build_report(run.path, host=_host_profile(tmp_path, 0.0)).data["host_time"]
    assert h["measured_energy_j"] is None and "NVML" in h["energy_note"]


def test_energy_figure_is_drawn_only_with_measured_energy(energy_run, tmp_path):
    pytest.importorskip("matplotlib")
    from cptsim.study.plots import energy_figure
    from cptsim.study.report import build_report

    png = energy_figure(build_report(energy_run.path, host=_host_profile(tmp_path, 150.0)))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_cli_writes_the_energy_plot(energy_run, tmp_path):
    pytest.importorskip("matplotlib")
    from click.testing import CliRunner

    from cptsim.cli.main import cli

    r = CliRunner().invoke(cli, ["report", str(energy_run.path), "--host", _host_profile(tmp_path, 150.0)])
    assert r.exit_code == 0, r.output
    assert "GPU energy: measured" in r.output
    assert (energy_run.path / "report-energy.png").is_file()

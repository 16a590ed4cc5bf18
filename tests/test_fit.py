"""Host calibration fit (`cptsim report --fit`): recovers known factors, predicts a held-out run, shrugs off
outlier steps, and writes a profile that load_profile reads back and the cost model uses."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from cptsim.cli.main import cli
from cptsim.cost.model import estimate
from cptsim.errors import InputError
from cptsim.calibration.fit import (RunSteps, check_fit_out, fit_host, profile_factors, quality, step_components,
                        write_fitted_profile)
from cptsim.cost.hardware import load_profile

TRUE = np.array([2.5, 0.6, 4.0, 1.5])  # k_c, k_m, k_q, k_o: what the "machine" does relative to the microbenchmarks


@pytest.fixture(autouse=True, scope="module")
def _isolated_home(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CPTSIM_HOME", str(tmp_path_factory.mktemp("home")))
        yield


@pytest.fixture(scope="module")
def host():
    return load_profile("host")


@pytest.fixture(scope="module")
def profiles():
    from cptsim.cli.profile_cmd import build_profile

    return {"cnn": build_profile("digits-cnn", (1, 8, 8), 10, None),
            "resnet20": build_profile("resnet20", (1, 8, 8), 10, None)}


def trace(n_steps, batch, ragged=None, every=23, fp_every=0, seed=0):
    """Trace lines: cyclic bits, a ragged batch every ``every`` steps, full-precision steps every ``fp_every``."""
    rng = np.random.default_rng(seed)
    out = []
    for s in range(n_steps):
        q = int(rng.integers(3, 9))
        g = 8
        if fp_every and s % fp_every == 0:
            q = g = 32
        n = ragged if ragged and s % every == every - 1 else batch
        out.append({"step": s, "epoch": s // every, "batch_size": n, "bits": q, "grad_bits": g})
    return out


def synthetic(label, prof, lines, host, noise=0.0, seed=1) -> RunSteps:
    comp = step_components(prof, lines, host)
    t = comp @ TRUE
    if noise:
        t = t * (1 + noise * np.random.default_rng(seed).standard_normal(t.size))
    return RunSteps(label, comp, t)


def test_components_are_the_cost_models_host_time(profiles, host):
    lines = trace(50, 64, ragged=29, fp_every=7)
    comp = step_components(profiles["cnn"], lines, host)
    assert comp.shape == (50, 4) and (comp > 0).any(axis=0).all()
    assert (comp @ profile_factors(host)).sum() == pytest.approx(
        estimate(profiles["cnn"], lines, host).latency_s["total"], rel=1e-12)
    fp = [i for i, r in enumerate(lines) if r["bits"] == 32]
    assert np.all(comp[fp, 2] == 0)  # no quantizer passes at full precision


def test_fit_recovers_known_factors(profiles, host):
    a = synthetic("a", profiles["cnn"], trace(120, 64, ragged=29, fp_every=5), host)
    b = synthetic("b", profiles["resnet20"], trace(60, 128, ragged=29, fp_every=4, seed=3), host)
    fit = fit_host([a, b], host)
    # the weak prior towards 1 costs a few % on the smallest term (memory, ~5% of these steps' time)
    assert fit.factors[[0, 2, 3]] == pytest.approx(TRUE[[0, 2, 3]], rel=0.03)
    assert fit.factors[1] == pytest.approx(TRUE[1], rel=0.06)
    assert fit.overall["r2"] > 0.999 and abs(fit.overall["total_error_pct"]) < 0.5
    assert fit.compute_efficiency == pytest.approx(1 / TRUE[0], rel=0.02)
    assert fit.elementwise_gelem_s == pytest.approx(host.params["elementwise_gelem_s"] / TRUE[2], rel=0.02)


def test_fit_on_one_run_predicts_another_model_and_batch_size(profiles, host):
    fit_run = synthetic("fit", profiles["resnet20"], trace(100, 64, ragged=29, fp_every=6), host, noise=0.05)
    other_model = synthetic("cnn", profiles["cnn"], trace(80, 64, ragged=29, seed=5), host, noise=0.05, seed=2)
    other_batch = synthetic("b128", profiles["resnet20"], trace(50, 128, ragged=29, seed=6), host, noise=0.05,
                            seed=3)
    fit = fit_host([fit_run], host)
    for held in (other_model, other_batch):
        ev = fit.evaluate(held)
        assert ev["held_out"] and abs(ev["total_error_pct"]) < 5, ev
        assert abs(ev["base_profile_total_error_pct"]) > 30  # the unfitted profile was far off


def test_outlier_steps_do_not_pull_the_fit(profiles, host):
    run = synthetic("a", profiles["resnet20"], trace(200, 64, ragged=29, fp_every=5), host)
    spoiled = run.measured.copy()
    spoiled[::20] *= 10  # 5% of the steps hit by a busy neighbour
    fit = fit_host([RunSteps("a", run.components, spoiled)], host)
    # The clean steps are still predicted (the spoiled total is 45% higher); the memory term, a few % of the time,
    # is the least determined factor, so only the two that carry the time are checked one by one.
    assert fit.predict(run).sum() == pytest.approx(run.measured.sum(), rel=0.01)
    assert fit.factors[[0, 2]] == pytest.approx(TRUE[[0, 2]], rel=0.05)


def test_fitted_profile_round_trips_through_load_profile_and_the_cost_model(profiles, host, tmp_path):
    lines = trace(100, 64, ragged=29, fp_every=5)
    run = synthetic("a", profiles["cnn"], lines, host)
    fit = fit_host([run], host)
    path, prof = write_fitted_profile(fit, tmp_path / "host-fitted.toml")
    assert prof.kind == "host" and prof.name == "host-fitted"
    assert prof.calibration["compute_efficiency"] == pytest.approx(fit.compute_efficiency, rel=1e-5)
    assert prof.calibration["memory_efficiency"] == pytest.approx(fit.memory_efficiency, rel=1e-5)
    assert prof.params["matmul_gmac_s"] == host.params["matmul_gmac_s"]
    assert estimate(profiles["cnn"], lines, prof).latency_s["total"] == pytest.approx(fit.predict(run).sum(), rel=1e-4)
    assert any("cptsim report --fit" in s for s in prof.sources)
    with pytest.raises(InputError, match="already exists; pass --force"):
        write_fitted_profile(fit, path)
    write_fitted_profile(fit, path, force=True)
    with pytest.raises(InputError, match="must name a .toml file"):
        check_fit_out(tmp_path / "x.json")
    with pytest.raises(InputError, match="does not exist"):
        check_fit_out(tmp_path / "no" / "x.toml")


def test_quality_figures():
    q = quality(np.array([1.0, 2.0, 3.3]), np.array([1.0, 2.0, 3.0]))
    assert q["total_error_pct"] == pytest.approx(5.0)
    assert q["median_abs_step_error_pct"] == pytest.approx(0.0)
    assert 0.9 < q["r2"] < 1.0


def test_fit_needs_a_host_profile(profiles):
    with pytest.raises(InputError, match="needs a host profile"):
        fit_host([], "h100")


# ------------------------------------------------------------------------------------------------ the command


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    from cptsim.run.train import TrainConfig, train

    d = tmp_path_factory.mktemp("fit_runs")
    a = train(TrainConfig(epochs=1, batch_size=64, schedule="cpt:3-8:g8:n2"), str(d / "b64"), progress=False)
    b = train(TrainConfig(epochs=1, batch_size=128, schedule="cpt:3-8:g8:n2"), str(d / "b128"), progress=False)
    return a, b


def test_report_fit_writes_the_profile_and_reports_hold_out_error(two_runs, tmp_path):
    a, b = two_runs
    out = tmp_path / "fitted.toml"
    r = CliRunner().invoke(cli, ["report", str(a.path), "--fit", "--fit-out", str(out), "--holdout", str(b.path),
                                 "--no-save", "--json"])
    assert r.exit_code == 0, r.stderr
    fit = json.loads(r.stdout)["fit"]
    assert fit["fitted_on"] == [str(a.path)] and fit["written"]["path"] == str(out)
    assert [h["run"] for h in fit["holdout"]] == [str(b.path)] and fit["holdout"][0]["held_out"]
    for key in ("r2", "median_abs_step_error_pct", "total_error_pct"):
        assert key in fit["fit"]
    assert np.isfinite(fit["holdout"][0]["total_error_pct"])
    prof = load_profile(str(out))
    assert prof.calibration["compute_efficiency"] == pytest.approx(fit["fitted"]["compute_efficiency"], rel=1e-5)

    # The fitted profile is what a later report on this machine uses with --host.
    r = CliRunner().invoke(cli, ["report", str(b.path), "--host", str(out), "--no-save", "--json"])
    assert r.exit_code == 0, r.stderr
    h = json.loads(r.stdout)["runs"][0]["host_time"]
    assert h["modelled_s"] == pytest.approx(fit["holdout"][0]["modelled_s"], rel=1e-4)

    r = CliRunner().invoke(cli, ["report", str(a.path), "--fit", "--fit-out", str(out), "--no-save"])
    assert r.exit_code == 2 and "already exists; pass --force" in r.stderr

    r = CliRunner().invoke(cli, ["report", str(a.path), str(b.path), "--fit", "--fit-out", str(out), "--force",
                                 "--no-save"])
    assert r.exit_code == 0, r.stderr
    assert "host calibration fit" in r.stdout and "leave-one-out" in r.stdout


def test_warmup_steps_are_left_out_of_fits_and_comparisons_and_said_so():
    from cptsim.calibration.fit import steady_steps

    marked = [{"epoch": 0, "warmup": True}, {"epoch": 0, "warmup": True}] + [{"epoch": 0}] * 8
    keep, note = steady_steps(marked, "cuda")
    assert keep.tolist() == [False, False] + [True] * 8 and "2 warm-up step(s)" in note
    # a CUDA trace from before the loop marked warm-up: its first epoch goes
    old = [{"epoch": e} for e in (0, 0, 0, 1, 1, 1)]
    keep, note = steady_steps(old, "cuda:0")
    assert keep.tolist() == [False] * 3 + [True] * 3 and "first epoch" in note
    # CPU runs keep every step; a trace of nothing but warm-up is kept whole rather than emptied
    assert steady_steps(old, "cpu")[0].all() and steady_steps(old, "cpu")[1] is None
    assert steady_steps([{"epoch": 0, "warmup": True}], "cuda")[0].all()

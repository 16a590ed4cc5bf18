"""The host measurement a first report makes: bounded in time however slow a GEMM tier is, kept in the cache
directory and said so before it starts, and a model that covers graph steps (a gcn run's modelled host time near
its measured step times, where the CNN-only figure put it at 2-3x)."""

import time

import numpy as np
import pytest
import torch

from cptsim.calibration import autocal, calibrate


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("CPTSIM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CPTSIM_NO_CALIBRATE", raising=False)
    return tmp_path / "home"


def test_a_slow_gemm_tier_is_measured_within_its_budget_not_for_repetitions_of_it(monkeypatch):
    def slow_int_mm(a, b):  # an int8 GEMM as an AVX2-only CPU runs it: 0.4 s a call, whatever the shape
        time.sleep(0.2)
        return torch.zeros(a.shape[0], b.shape[1], dtype=torch.int32)

    monkeypatch.setattr(torch, "_int_mm", slow_int_mm)
    t0 = time.perf_counter()
    tiers = calibrate.cpu_tier_rates(0.2, shapes=((64, 64, 64), (128, 64, 64), (64, 128, 64)))
    elapsed = time.perf_counter() - t0
    # a warm-up and one timed call of the first shape, then the budget is spent: ~0.4 s, not 3 shapes x 5 calls
    assert elapsed < 1.2, elapsed
    int8 = tiers["int8"]
    assert len(int8["by_shape"]) == 1 and "1 of 3 shapes" in int8["note"]
    assert int8["macs_per_s"] == pytest.approx(64 ** 3 / 0.2, rel=0.5)


def test_the_automatic_profile_goes_to_the_cache_and_the_first_line_says_where(home, tmp_path):
    from cptsim.cost.hardware import user_profile_dir
    from cptsim.run.rundir import RunDir

    run = RunDir.create(tmp_path / "run", {
        "settings": {"model": "m", "dataset": "d", "device": "cpu"}, "schedule": {"text": "static:8"},
        "total_steps": 1, "steps_per_epoch": 1, "eval_bits": 8, "host": {"threads": 1}}).path
    said = []
    t0 = time.perf_counter()
    path = autocal.report_host(run, say=said.append, seconds=1.0)
    elapsed = time.perf_counter() - t0
    assert path == str(home / "cache" / autocal.auto_profile_path("cpu", 1).name)
    assert not user_profile_dir().exists() or not any(user_profile_dir().iterdir())  # the user's dir untouched
    # 1 s of timing and ~2 s building the reference workloads and counting their op lists
    assert path in said[0] and "about 3 s" in said[0] and path in said[1]
    assert elapsed < 6.5, elapsed  # "about 3 s": its parts are bounded (a loaded machine may double the timing)
    assert "reference workloads" in open(path).read()


def _karate_run(out):
    from cptsim.run.config import TrainConfig
    from cptsim.run.train import train

    return train(TrainConfig.from_dict({"model": "gcn", "dataset": "karate", "epochs": 25, "batch_size": 1,
                                        "recal_batches": 1}), str(out), progress=False)


def test_a_graph_runs_modelled_host_time_is_near_its_measured_step_times(home, tmp_path):
    from cptsim.cost.model import estimate
    from cptsim.hardware import load_profile
    from cptsim.study.report import _exact_on

    run = _karate_run(tmp_path / "gcn")
    host = load_profile(autocal.report_host(run.path, seconds=1.2)).with_exact_gemm(_exact_on(run.read_config()))
    steps = run.read_trace().records[1:]  # the first step allocates: a warm-up outlier on any model
    measured = float(np.sum([r["time_s"] for r in steps]))
    modelled = float(estimate(run.read_profile(), steps, host, per_layer=False).latency_s["total"])
    # the per-layer figure of a CNN alone (its BatchNorm's bytes spread over its layer-phases) and the
    # aggregations priced as GEMMs put this at 1.9-2.7x on the (loaded, 2-core) machine this was written on; now
    # 0.55-0.85x there (once 0.4x, with other tests running). The bounds are wide: the run and the measurement
    # see a shared machine's load at different moments; the upper one is what catches the 2-5x of a CNN-only figure.
    assert 0.3 < modelled / measured < 1.6, (modelled, measured)

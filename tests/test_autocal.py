"""A first report models host time with this machine measured once, kept per machine, not with placeholders."""

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
    assert "calibrated = true" in text and "reference CNN" in text
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

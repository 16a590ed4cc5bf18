"""The exact int8 GEMM path is the CPU default only where it pays, measured on the machine
(cptsim.numerics.gemm_choice): a torch._int_mm much slower than FP32 (an AVX2-only CPU) gets the fake-quant path, a
fast one the exact path; the decision is kept per machine and thread count and read back without measuring again;
CPTSIM_EXACT_GEMM overrides it; config.json records which path and why; the host cost model takes the same decision;
a resume on another path than the run recorded warns in one line. torch._int_mm is replaced by stubs of known speed
(the FP32 side of the measurement is real)."""

import json
import time

import pytest
import torch

from cptsim.numerics import exact_gemm as X
from cptsim.numerics import gemm_choice as G

from shared_runs import cptsim_here

TINY = ["train", "--model", "mlp", "--steps", "3", "--batch-size", "32", "--recal-batches", "0", "--quiet"]


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A fresh cache directory and no decision remembered in this process; CPTSIM_EXACT_GEMM unset."""
    monkeypatch.setenv("CPTSIM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CPTSIM_EXACT_GEMM", raising=False)
    monkeypatch.setattr(G, "_DECIDED", {})
    return tmp_path


class Stub:
    """torch._int_mm taking ``seconds_at_probe`` for the probe's 4096 rows (proportionally less for fewer), counting
    its calls."""

    def __init__(self, seconds_at_probe: float):
        self.s, self.calls = seconds_at_probe, 0

    def __call__(self, a, b):
        self.calls += 1
        if self.s:
            time.sleep(self.s * a.shape[0] / G.PROBE_SHAPE[0])
        return torch.zeros(a.shape[0], b.shape[1], dtype=torch.int32)


def _no_call(a, b):
    raise AssertionError("torch._int_mm was called: the decision should not have been measured")


def test_a_slow_int_mm_gets_the_fake_quant_path_and_the_run_records_why(machine, monkeypatch):
    slow = Stub(0.3)  # ~30x an FP32 matmul of the probe's shape on this machine (~10 ms): an AVX2-only CPU's ratio
    monkeypatch.setattr(torch, "_int_mm", slow)
    out = machine / "run"
    r = cptsim_here(*TINY, "--out", out)
    assert r.exit_code == 0, (r.output, r.exception)
    paths = json.loads((out / "config.json").read_text())["host"]["gemm_paths"]
    choice = paths["choice"]
    assert choice["on"] is False and choice["why"].startswith("measured: _int_mm ") and "slower" in choice["why"]
    assert choice["threads"] == 1 and choice["int_mm_ms"] > G.MIN_SPEEDUP * choice["fp32_ms"]
    assert paths["exact_gemm"] == f"off ({choice['why']})"  # what report reads: not "on"
    assert paths["layers"] and all(v["forward"] == X.FAKE for v in paths["layers"].values())
    # a small warm-up call and the probe's calls decided it; the training steps never called it (fake-quant path)
    assert slow.calls == 1 + choice["calls"]


def test_a_fast_int_mm_gets_the_exact_path_without_touching_the_random_stream(machine, monkeypatch):
    monkeypatch.setattr(torch, "_int_mm", Stub(0.0))
    rng = torch.get_rng_state()
    c = X.choice()
    assert c["on"] is True and X.enabled() and "faster" in c["why"] and c["source"].startswith("measured now")
    assert torch.equal(torch.get_rng_state(), rng)
    from cptsim.models import create_model
    from cptsim.numerics.layers import quantize_model

    m = create_model("mlp", num_classes=10, in_channels=1, input_shape=(1, 8, 8))
    quantize_model(m)
    paths = X.gemm_paths(m, "cpu")
    assert paths["exact_gemm"] == "on" and any(v["forward"] == X.INT8 for v in paths["layers"].values())


def test_the_decision_is_kept_per_thread_count_and_read_back_without_measuring(machine, monkeypatch):
    slow = Stub(0.3)
    monkeypatch.setattr(torch, "_int_mm", slow)
    first = X.choice(threads=1)
    assert first["on"] is False and slow.calls == 1 + first["calls"]
    G.forget()  # as a new process would: only the file remains
    monkeypatch.setattr(torch, "_int_mm", _no_call)
    again = X.choice(threads=1)
    assert again["source"] == f"cached in {G.cache_path()}"
    assert {k: v for k, v in again.items() if k != "source"} == {k: v for k, v in first.items() if k != "source"}
    doc = json.loads(G.cache_path().read_text())
    cpu, ext = G.cpu_signature()
    assert doc["entries"][G.cache_key(cpu, ext, 1)]["on"] is False
    # another thread count is another question: measured on its own (a fast stub now)
    monkeypatch.setattr(torch, "_int_mm", Stub(0.0))
    assert X.choice(threads=2)["on"] is True and X.choice(threads=1)["on"] is False
    # a damaged file is measured again and rewritten
    G.cache_path().write_text("{not json")
    G.forget()
    assert X.choice(threads=1)["source"].startswith("measured now")
    assert json.loads(G.cache_path().read_text())["format"] == G.FORMAT


def test_cptsim_exact_gemm_overrides_without_measuring(machine, monkeypatch):
    monkeypatch.setattr(torch, "_int_mm", _no_call)
    monkeypatch.setenv("CPTSIM_EXACT_GEMM", "0")
    assert not X.enabled() and X.choice() == {"on": False, "why": "CPTSIM_EXACT_GEMM=0"}
    monkeypatch.setenv("CPTSIM_EXACT_GEMM", "1")
    assert X.enabled() and X.choice() == {"on": True, "why": "CPTSIM_EXACT_GEMM=1"}
    monkeypatch.setenv("CPTSIM_EXACT_GEMM", "codes")
    assert not X.enabled()
    assert not G.cache_path().exists()
    # =1 wins over a kept "off"
    monkeypatch.delenv("CPTSIM_EXACT_GEMM")
    monkeypatch.setattr(torch, "_int_mm", Stub(0.3))
    assert not X.enabled()
    monkeypatch.setenv("CPTSIM_EXACT_GEMM", "1")
    assert X.enabled()


def _host_profile(tmp_path, threads: int, int8: float):
    from cptsim.cost.hardware import load_profile

    src = load_profile("host").path
    text = open(src).read().replace('name = "host"', 'name = "t"').replace("threads = 2", f"threads = {threads}")
    path = tmp_path / "t.toml"
    path.write_text(text.replace("power_w = 0.0", f"power_w = 0.0\nint8_gmac_s = {int8}"))
    return load_profile(str(path))


def test_the_host_model_reads_the_decision_a_run_here_takes(machine, monkeypatch):
    # a profile without an int8 rate never prices int8: nothing to decide, nothing measured
    monkeypatch.setattr(torch, "_int_mm", _no_call)
    assert not _host_profile(machine, 1, 0.0).int8_active
    # a run on this machine decided "off" (slow _int_mm): the model of a later process reads it, measuring nothing
    monkeypatch.setattr(torch, "_int_mm", Stub(0.3))
    assert not X.enabled(threads=1)
    G.forget()
    monkeypatch.setattr(torch, "_int_mm", _no_call)
    p = _host_profile(machine, 1, 1000.0)
    assert not p.int8_active and p.describe_bits(8, 8) == "fp32 (fake-quant)"
    assert p.with_exact_gemm(True).int8_active  # a run that recorded the exact path is priced as it ran
    # nothing kept yet for the profile's thread count: measured once (fast here), then kept for the run to read
    fast = Stub(0.0)
    monkeypatch.setattr(torch, "_int_mm", fast)
    assert _host_profile(machine, 2, 1000.0).int8_active and fast.calls > 0
    G.forget()
    monkeypatch.setattr(torch, "_int_mm", _no_call)
    assert X.enabled(threads=2)


def test_a_resume_on_another_path_warns_in_one_line(machine):
    out = machine / "run"
    r = cptsim_here(*TINY, "--out", out, env_extra={"CPTSIM_EXACT_GEMM": "1"})
    assert r.exit_code == 0, (r.output, r.exception)
    r = cptsim_here("train", "--resume", out, "--quiet", env_extra={"CPTSIM_EXACT_GEMM": "0"})
    assert r.exit_code == 0, (r.output, r.exception)
    warn = [line for line in r.stderr.splitlines() if "host.gemm_paths" in line]
    assert len(warn) == 1 and warn[0].startswith("warning: ")
    assert f"ran on the {X.INT8} path" in warn[0] and f"would run {X.FAKE} (CPTSIM_EXACT_GEMM=0)" in warn[0]
    assert "CPTSIM_EXACT_GEMM=1 runs the recorded path" in warn[0]
    r = cptsim_here("train", "--resume", out, "--quiet", env_extra={"CPTSIM_EXACT_GEMM": "1"})
    assert r.exit_code == 0 and "host.gemm_paths" not in r.stderr


def test_path_change_compares_the_recorded_path():
    on, off = {"exact_gemm": "on"}, {"exact_gemm": "off (measured: ...)", "choice": {"why": "measured: ..."}}
    assert X.path_change(on, on) is None and X.path_change(off, off) is None
    assert X.path_change(None, off) is None and X.path_change({}, on) is None  # an older run: nothing recorded
    assert "would run int8-exact" in X.path_change(off, on) and "CPTSIM_EXACT_GEMM=0 runs" in X.path_change(off, on)
    fp8 = {"exact_gemm": "off (float number formats run fake-quantized in FP32)", "scaled_mm": "on (CUDA sm90)"}
    cpu = {"exact_gemm": "off (float number formats run fake-quantized in FP32)",
           "scaled_mm": "off (a CPU: CPTSIM_SCALED_MM=1 runs torch's CPU emulation)"}
    assert "ran on the fp8-scaled-mm path" in X.path_change(fp8, cpu) and X.path_change(fp8, fp8) is None

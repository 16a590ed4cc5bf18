"""The host's GEMM tiers (issue 28 item 2): which GEMM the host profile prices as int8 is exactly what
cptsim.numerics.exact_gemm routes to torch._int_mm; `hw calibrate` writes the tier rates and reads them back; an old
host.toml still reads; `report --json` carries the modelled-vs-measured host saving of a CPU run."""

import json
import os

import numpy as np
import pytest

from cptsim.cost.hardware import load_profile
from cptsim.cost.hardware.host import host_gemm_tiers
from cptsim.measure.profiler import ProfileArrays
from cptsim.numerics import exact_gemm as X

# hand-built layers: (name, type, quantized, k = in features, rows per sample summed over calls, calls, operand)
LAYERS = (
    ("proj", "Linear", True, 128, 64, 1, 0),          # a transformer projection: 64 tokens per sample, one call
    ("gate", "Linear", True, 650, 35, 35, 0),         # an LSTM's per-time-step call: one token per sample per call
    ("wide", "Linear", True, X.MAX_K + 1, 4, 1, 0),   # K beyond the int32 bracket
    ("head", "Linear", False, 128, 64, 1, 0),         # a full-precision classifier
    ("conv", "Conv2d", True, 576, 64, 1, 0),          # convolutions never take the int8 path
    ("scores", "Matmul", True, 32, 64, 1, 2048),      # attention's activation-by-activation product
)


def _arrays():
    L = len(LAYERS)
    gemm = np.array([[1, 64, k, rows, 0] for _, _, _, k, rows, _, _ in LAYERS], dtype=np.float64)
    return ProfileArrays(
        names=[x[0] for x in LAYERS], macs=np.ones((L, 3)), quantized=np.array([x[2] for x in LAYERS]),
        numel=np.ones((L, 3)), calls=np.array([x[5] for x in LAYERS], dtype=np.float64), gemm=gemm,
        is_conv=np.array([x[1] == "Conv2d" for x in LAYERS]), matmul=np.array([x[1] in ("Linear", "Matmul")
                                                                              for x in LAYERS]),
        operand=np.array([x[6] for x in LAYERS], dtype=np.float64), aggregation=np.zeros(L, bool))


def test_tier_per_gemm_is_exact_gemms_routing():
    a = _arrays()
    kinds = [(q, g, n) for q in (2, 4, 8, 9, 16, 32) for g in (4, 8, 12, 32) for n in (1, 4, 8, 64, 600)]
    q, g, n = (np.array(c) for c in zip(*kinds))
    tiers = host_gemm_tiers(a, q, g, n)
    for i, (qi, gi, ni) in enumerate(kinds):
        for j, (_, typ, quant, k, rows, calls, _) in enumerate(LAYERS):
            linear = typ == "Linear" and quant
            fwd = X.forward_path(qi, k) if linear else X.FAKE
            wgrad = X.wgrad_path(qi, gi, rows * ni // calls) if linear else X.FAKE
            got = ["int8-exact" if t else X.FAKE for t in tiers[i, j]]
            assert got == [fwd, X.FAKE, wgrad], (LAYERS[j][0], qi, gi, ni, got)


def test_the_hosts_quantizer_elements_are_the_cost_models():
    from cptsim.cost.hardware.host import quantizer_elems
    from cptsim.cost.model import quant_elems

    a = _arrays()
    a.numel[:] = np.arange(3 * len(LAYERS)).reshape(-1, 3) + 1.0
    a.macs[0, 1] = 0  # a first layer: its error pass in wgrad
    q, g, n = np.array([3, 8, 32, 32]), np.array([8, 32, 8, 32]), np.array([5, 7, 9, 11])
    assert np.array_equal(quantizer_elems(a, q, g, n),
                          quant_elems(a.numel, a.macs, a.quantized, q, g, n, a.calls, a.operand))


def test_int8_is_priced_only_with_the_exact_path_on_and_a_measured_rate(tmp_path, monkeypatch):
    monkeypatch.setenv("CPTSIM_EXACT_GEMM", "0")  # off in this process: the profile follows it (last lines)
    old = load_profile("host")  # the shipped file, written before the tiers: reads, FP32 only
    assert old.params["int8_gmac_s"] == 0 and not old.with_exact_gemm(True).int8_active
    text = (tmp_path / "t.toml")
    src = old.path
    text.write_text(open(src).read().replace('name = "host"', 'name = "t"')
                    .replace("power_w = 0.0", "power_w = 0.0\nint8_gmac_s = 1000.0"))
    p = load_profile(str(text))
    assert not p.int8_active and p.describe_bits(8, 8) == "fp32 (fake-quant)"
    on = p.with_exact_gemm(True)
    assert on.int8_active and on.shape_model and "int8" in on.describe_bits(8, 8)
    assert on.describe_bits(9, 9) == "fp32 (fake-quant)"
    monkeypatch.setenv("CPTSIM_EXACT_GEMM", "1")
    assert load_profile(str(text)).int8_active  # this process's setting by default
    monkeypatch.delenv("CPTSIM_EXACT_GEMM")
    for measured in (True, False):  # ... and unset, what this machine measured (exact_gemm.enabled, gemm_choice)
        monkeypatch.setattr(X.gemm_choice, "measured_choice", lambda threads=None, m=measured: {"on": m, "why": ""})
        assert load_profile(str(text)).int8_active is measured

    # the Linear layer's forward and wgrad get cheaper at 8 bits, nothing else changes
    a = _arrays()
    macs = np.full((1, len(LAYERS), 3), 1e9)
    zeros = np.zeros_like(macs)
    b = np.full_like(macs, 8)
    from cptsim.cost.model import quant_elems

    b[:, :, 1] = 8  # dgrad's first operand: the gradient bits
    qe = quant_elems(a.numel, a.macs, a.quantized, np.array([8]), np.array([8]), np.array([64]), a.calls, a.operand)
    t_on, _ = on.shaped_gemm_cost(a, macs, b, b, zeros, np.array([64]))
    t_off, _ = p.gemm_cost(macs, b, b, zeros, qe)
    int8 = host_gemm_tiers(a, [8], [8], [64])
    assert int8.sum() == 4 and (t_on[int8] < t_off[int8]).all()  # proj fwd + wgrad, gate fwd, wide wgrad
    assert np.allclose(t_on[~int8], t_off[~int8])


def test_calibrate_writes_the_tier_rates_and_reads_them_back(tmp_path, monkeypatch):
    from cptsim.calibration import calibrate as C

    monkeypatch.setattr(C, "_median_time", lambda fn, budget_s, sync, **kw: 1e-3)  # no timing: instant
    monkeypatch.setattr(C, "COPY_NUMEL", {"cpu": 1024, "cuda": 1024})
    monkeypatch.setattr(C, "ELEMENTWISE_NUMEL", 1024)
    m = C.calibrate_host("cpu", seconds=0.05)
    want = {t: float(np.median([mm * k * n / 1e-3 for mm, k, n in C.INT_SHAPES])) for t in ("int8", "bf16")}
    assert {t: m["tiers"][t]["macs_per_s"] for t in want} == pytest.approx(want)
    path, prof = C.write_host_profile(m, tmp_path / "mine.toml")
    assert prof.params["int8_gmac_s"] == C._sig(want["int8"] / 1e9)
    assert prof.params["bf16_gmac_s"] == C._sig(want["bf16"] / 1e9)
    assert [t["name"] for t in prof.tiers()] == ["fp32", "int8", "bf16"]
    assert "int8_gmac_s" in path.read_text()

    # a torch without _int_mm: the tier is "not measured" (0), its key left out, the file still loads
    import torch

    monkeypatch.delattr(torch, "_int_mm")
    tiers = C.cpu_tier_rates(0.01)
    assert tiers["int8"]["macs_per_s"] == 0 and "not measured" in tiers["int8"]["note"]
    m["tiers"] = tiers
    path, prof = C.write_host_profile(m, tmp_path / "old.toml")
    assert "int8_gmac_s" not in path.read_text() and prof.params["int8_gmac_s"] == 0


def test_report_json_has_the_modelled_and_measured_host_saving(digits_uninterrupted, monkeypatch):
    from shared_runs import cptsim_here

    from cptsim.study import report as R

    # the section itself, with a stand-in timing pass: saving and gap follow from the step times it returns
    run = digits_uninterrupted.path
    cfg = json.loads((run / "config.json").read_text())
    steps = [json.loads(x) for x in (run / "trace.jsonl").read_text().splitlines()]
    prof = digits_uninterrupted.read_profile()
    timed = lambda path, c, widths, n, raw: {w: [0.1 if w == (32, 32) else 0.12] * n for w in widths}  # noqa: E731
    s = R.host_saving(run, cfg, prof, steps, "host", measure=3, timer=timed)
    # the exact path as the run recorded it (this machine's default; config.json host.gemm_paths), but digits-cnn
    # has no quantized Linear layer (its classifier is full precision) and the shipped host profile no int8 rate
    assert s["exact_gemm"] is (cfg["host"]["gemm_paths"]["exact_gemm"] == "on") and s["int8_priced"] is False
    assert s["measured_saving"]["vs_static32"] == pytest.approx(1 - 0.12 / 0.1)
    assert s["measured_saving"]["vs_static8"] == pytest.approx(0.0)
    assert s["modelled_saving"]["vs_static32"] < 0  # fake-quant: quantizer passes on top of FP32 GEMMs
    assert s["gap_pts"]["vs_static32"] == pytest.approx(100 * (s["measured_saving"]["vs_static32"]
                                                              - s["modelled_saving"]["vs_static32"]))

    # the command: a real one-step-per-width timing pass, in --json
    r = cptsim_here("report", run, "--json", "--no-save", "--hw", "h100", "--measure-host", "1")
    assert r.exit_code == 0, r.output
    hs = json.loads(r.stdout)["runs"][0]["host_saving"]
    assert set(hs["modelled_saving"]) == {"vs_static32", "vs_static8"}
    assert hs["measured"]["steps_per_width"] == 1 and "32/32" in hs["measured"]["step_s"]
    assert set(hs["gap_pts"]) == {"vs_static32", "vs_static8"} and "gap" in hs["note"]
    bad = cptsim_here("report", run, "--no-save", "--measure-host", "-1")
    assert bad.exit_code == 2 and "--measure-host" in bad.output


def test_an_automatic_cpu_measurement_without_tiers_is_measured_again_once(digits_uninterrupted, tmp_path,
                                                                           monkeypatch):
    from cptsim.calibration import autocal

    monkeypatch.setenv("CPTSIM_HOME", str(tmp_path))
    monkeypatch.delenv(autocal.NO_CALIBRATE_ENV, raising=False)
    run = digits_uninterrupted.path
    device, threads = autocal._run_conditions(run)
    path = autocal.auto_profile_path(device, threads)
    path.parent.mkdir(parents=True)
    old = open(load_profile("host").path).read()
    path.write_text(old)  # kept before the tiers: no int8 rate, no "tiers measured" line
    calls = []
    monkeypatch.setattr(autocal, "measure", lambda p, *a, **k: calls.append(p) or p)
    assert autocal.report_host(run) == str(path) and calls == [path]
    # with the tiers but without the op list priced (an older file): measured again, once
    path.write_text("# GEMM tiers measured: int8 not measured: this torch has no _int_mm\n" + old)
    assert autocal.report_host(run) == str(path) and len(calls) == 2
    path.write_text("# GEMM tiers measured: int8 not measured: this torch has no _int_mm\n"
                    + old.replace("[host]\n", "[host]\nop_list = true\n"))
    assert autocal.report_host(run) == str(path) and len(calls) == 2
    assert autocal.report_host(run, calibrate=False) == str(path) and len(calls) == 2


def test_the_exact_paths_sum_gemms_are_the_int_mm_calls_a_real_step_makes(monkeypatch, tmp_path):
    """exact_sum_macs against the GEMMs a real exact-path Linear step runs: every torch._int_mm call of a forward and
    backward recorded, those against 8 columns (rows) of ones are the sums; their MACs per phase must be the host's
    count of the profiled layer, which it prices at the sum rate (not the square GEMMs' 4x faster one)."""
    import torch

    from cptsim.cost.hardware.host import CODES_BYTES, SUM_COLUMNS, exact_sum_macs, exact_weight_elems
    from cptsim.cost.model import _arrays
    from cptsim.measure.profiler import profile_model
    from cptsim.numerics.layers import quantize_model

    monkeypatch.setenv("CPTSIM_EXACT_GEMM", "1")
    tokens, fin, fout = 2 * 300, 24, 40  # 300 tokens a sample: wgrad's K >= MIN_WGRAD_TOKENS takes int8 too
    net = torch.nn.Sequential(torch.nn.Linear(fin, fout))
    precision = quantize_model(net, fp_layers=[])  # (a lone layer is the classifier, kept FP32 by default)
    precision.set(8, 8)
    prof = profile_model(net, (300, fin), batch_size=2)
    calls = {"fwd": [], "bwd": []}
    phase = ["fwd"]
    real = torch._int_mm

    def spy(a, b):
        calls[phase[0]].append((a.shape[0], a.shape[1], b.shape[1]))
        return real(a, b)

    monkeypatch.setattr(torch, "_int_mm", spy)
    coded = []
    real_codes = X.weight_codes

    def codes_spy(w, bits):
        coded.append(w.numel())
        return real_codes(w, bits)

    monkeypatch.setattr(X, "weight_codes", codes_spy)
    x = torch.randn(2, 300, fin, requires_grad=False)
    y = net(x)
    phase[0] = "bwd"
    y.square().sum().backward()
    assert net[0].gemm_path == {"forward": X.INT8, "dgrad": X.FAKE, "wgrad": X.INT8}
    sums = {p: sum(m * k * n for m, k, n in c if SUM_COLUMNS in (m, n)) for p, c in calls.items()}
    # by hand: fwd the input's row sums, wgrad the error's row sums and the input's column sums
    assert sums == {"fwd": tokens * fin * 8, "bwd": tokens * fout * 8 + 8 * tokens * fin}
    a = _arrays(prof)
    int8 = host_gemm_tiers(a, [8], [8], [2])
    got = exact_sum_macs(a, int8, [2])[0, 0]
    assert got.tolist() == [sums["fwd"], 0.0, sums["bwd"]]
    assert coded == [fin * fout]  # the weight's pass: once, in the forward
    assert exact_weight_elems(a, int8)[0, 0].tolist() == [fin * fout, 0.0, 0.0]

    # priced at the sum rate where one was measured, on top of the square GEMM at the int8 rate; not at all without
    base = open(load_profile("host").path).read().replace('name = "host"', 'name = "t"')
    priced = {}
    for extra in ("", "\nint8_sum_gmac_s = 2.0"):
        path = tmp_path / f"t{len(priced)}.toml"
        path.write_text(base.replace("power_w = 0.0", "power_w = 0.0\nint8_gmac_s = 1000.0" + extra))
        priced[bool(extra)] = estimate_one(prof, load_profile(str(path)).with_exact_gemm(True))
    assert priced[True] - priced[False] == pytest.approx((sums["fwd"] + sums["bwd"]) / 2e9, rel=1e-9)
    # the weight's pass at its own rate where measured, in place of a quantizer pass and the codes' bytes
    path = tmp_path / "coded.toml"
    path.write_text(base.replace("power_w = 0.0", "power_w = 0.0\nint8_gmac_s = 1000.0\nweight_codes_gelem_s = 0.5"))
    hw = load_profile(str(path)).with_exact_gemm(True)
    W, p = fin * fout, hw.params
    want = W / 0.5e9 - W / (p["elementwise_gelem_s"] * 1e9) - CODES_BYTES * W / (p["bandwidth_gb_s"] * 1e9)
    assert estimate_one(prof, hw) - priced[False] == pytest.approx(want, rel=1e-9)


def estimate_one(prof, hw):
    from cptsim.cost.model import estimate

    return estimate(prof, [{"step": 0, "batch_size": 2, "bits": 8, "grad_bits": 8}], hw,
                    per_layer=False).latency_s["total"]

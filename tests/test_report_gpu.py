"""`cptsim report` on CUDA runs, without a GPU: the two resnet20 runs measured on an H100 (tests/data/gpu_runs) and
copies of them with a device record, another GPU, or fabricated step times. The measured side is checked against a
hand computation from the trace; the model's quantizer term against a hand count from profile.json."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from shared_runs import cptsim_here

RUNS = Path(__file__).parent / "data" / "gpu_runs"
CPT, STATIC32 = RUNS / "resnet20-cpt-synthetic", RUNS / "resnet20-static32-synthetic"
H100_NAME = "NVIDIA H100 80GB HBM3"


def _copy(src: Path, dst: Path, device_name: str | None = None, edit=None) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    if device_name is not None:
        from cptsim.cost.hardware.gpus import profile_for

        m = profile_for(device_name)
        cfg["device"] = {"type": "cuda", "name": device_name, "sm_count": 132, "profile": m["profile"],
                         "profile_why": m["why"]}
    if edit:
        edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _flat(text: str) -> str:
    return " ".join(text.split())  # rich wraps warnings at the terminal's width


def _report(*args):
    r = cptsim_here("report", *map(str, args), "--no-save", "--json")
    return r


def _steady(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "trace.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if not r.get("warmup")]


def test_a_cuda_run_is_compared_per_width_with_the_h100_model_and_the_measured_side_is_the_trace(tmp_path):
    run = _copy(CPT, tmp_path / "cpt")
    r = _report(run)
    assert r.exit_code == 0, r.stderr
    assert "does not record which GPU ran it" in _flat(r.stderr) and "h100" in r.stderr  # the assumption, said
    h = json.loads(r.stdout)["runs"][0]["host_time"]
    assert h["kind"] == "gpu" and h["profile"] == "h100" and h["warmup_steps_skipped"] == 12
    steady = _steady(run)
    by = {}
    for s in steady:
        by.setdefault((s["bits"], s["grad_bits"]), []).append(s["time_s"])
    assert [(w["bits"], w["grad_bits"]) for w in h["per_width"]] == sorted(by)
    for w in h["per_width"]:  # hand computation from the trace: mean step time per width, error vs the model
        times = by[(w["bits"], w["grad_bits"])]
        assert w["steps"] == len(times)
        assert w["measured_ms"] == pytest.approx(1e3 * sum(times) / len(times), rel=1e-12)
        assert w["error_pct"] == pytest.approx(100 * (w["modelled_ms"] / w["measured_ms"] - 1), rel=1e-9)
        assert w["native_tiers"] == {"fwd": "int8", "dgrad": "int8", "wgrad": "int8"}  # what the GPU would run
    assert h["measured_s"] == pytest.approx(sum(s["time_s"] for s in steady), rel=1e-12)
    assert h["measured_energy_j"] == pytest.approx(sum(s["energy_j"] for s in steady), rel=1e-12)
    assert h["energy_error_pct"] == pytest.approx(100 * (h["modelled_energy_j"] / h["measured_energy_j"] - 1))
    assert h["ran"].startswith("fake-quant FP32") and "convolutions TF32" in h["ran"]
    assert sum(e["measured_s"] for e in h["per_epoch"]) == pytest.approx(h["measured_s"])
    # its trace names no GEMM route: the loop then did its host work between steps, and the report says so
    assert any("host work between steps" in n for n in h["notes"])
    # the target table: the GPU that ran says so, the others stay modelled
    rows = {x["name"]: x["label"] for x in json.loads(r.stdout)["runs"][0]["hardware"]}
    assert rows["h100"].startswith("executed") and rows["bitfusion"].startswith("modelled")


def test_a_fake_quant_step_is_its_fp32_step_plus_its_quantizers_kernels_and_passes():
    from cptsim.calibration.gpu_runfit import price_kinds
    from cptsim.cost.hardware import load_profile
    from cptsim.cost.model import estimate
    from cptsim.measure.profiler import LayerProfile

    doc = json.loads((CPT / "profile.json").read_text())
    prof = LayerProfile.from_json(doc)
    gpu = load_profile("h100")
    n = 128
    quantized = [L for L in doc["layers"] if L["quantized"]]
    # per quantized layer and step on the fused route (tests/test_gpu_layer_passes.py counts them from the code):
    # forward 13 kernels -- its input's range (aminmax) and running range (10 small kernels), Qa(x), Qw(W) -- and
    # backward 5: the error's range (2 stages), its seed, its stochastic pass, and Qa(x) again for wgrad.
    # Bytes: the input read for its range, read and written by Qa(x), again in backward; the weight read and
    # written; the error read for its range, read and written.
    kernels = 18 * len(quantized)
    nbytes = sum(L["numel"]["input"] * n * (4 + 8 + 8) + L["numel"]["weight"] * 8 + L["numel"]["output"] * n * 12
                 for L in quantized)
    bw = gpu.params["bandwidth_gb_s"] * 1e9 * gpu.calibration["memory_efficiency"]
    want = nbytes / bw + kernels * gpu.calibration["kernel_overhead_us"] * 1e-6
    p = price_kinds(prof, [(8, 8, n)], gpu, "fake-quant", False, {})[(8, 8, n)]
    assert p["passes_kernels"] == kernels and p["quantizer_s"] == pytest.approx(want, rel=1e-9)
    # as it ran: the step's GEMMs at 32 bits (its FP32 tiers) plus those passes; natively: int8 tiers, no passes
    t32 = estimate(prof, [{"step": 0, "batch_size": n, "bits": 32, "grad_bits": 32}], gpu,
                   per_layer=False).latency_s["total"]
    assert p["time_s"] == pytest.approx(t32 + want, rel=1e-9)
    t8 = estimate(prof, [{"step": 0, "batch_size": n, "bits": 8, "grad_bits": 8}], gpu,
                  per_layer=False).latency_s["total"]
    assert p["native_time_s"] == pytest.approx(t8, rel=1e-9)


def test_a_recorded_gpu_picks_its_profile_and_an_unknown_one_is_refused_in_one_line(tmp_path):
    known = _copy(CPT, tmp_path / "known", H100_NAME)
    r = _report(known)
    assert r.exit_code == 0, r.stderr
    assert "does not record" not in _flat(r.stderr)
    h = json.loads(r.stdout)["runs"][0]["host_time"]
    assert h["gpu"]["name"] == H100_NAME and h["profile"] == "h100" and "describes" in h["gpu"]["why"]
    pcie = _copy(CPT, tmp_path / "pcie", "NVIDIA H100 PCIe")  # not the SXM part h100.toml describes
    r = _report(pcie)
    assert r.exit_code == 2
    assert "NVIDIA H100 PCIe" in r.stderr and "--host" in r.stderr and "Traceback" not in r.stderr
    assert len([x for x in r.stderr.splitlines() if x.strip()]) == 1
    r = _report(pcie, "--host", "a100")  # the user may name one
    assert r.exit_code == 0 and json.loads(r.stdout)["runs"][0]["host_time"]["profile"] == "a100"


def test_a_cpu_profile_for_a_cuda_run_and_a_gpu_profile_for_a_cpu_run_are_refused(tmp_path):
    run = _copy(CPT, tmp_path / "cpt", H100_NAME)
    r = _report(run, "--host", str(Path(__file__).parent.parent / "hw_profiles" / "host.toml"))
    assert r.exit_code == 2 and "GPU profile" in _flat(r.stderr) and "Traceback" not in r.stderr
    cpu_run = Path(__file__).parent / "data" / "pre_layout" / "run"
    r = _report(cpu_run, "--host", "h100")
    assert r.exit_code == 2 and "ran on a CPU" in _flat(r.stderr) and "host profile" in _flat(r.stderr)


def test_an_accelerator_named_as_a_cuda_runs_host_is_called_an_accelerator_in_one_line(tmp_path):
    from cli_util import one_line_error

    run = _copy(CPT, tmp_path / "cpt", H100_NAME)
    # (at 80 columns: the message must stay one line however narrow the terminal)
    r = cptsim_here("report", run, "--host", "bitfusion", "--no-save", env_extra={"COLUMNS": "80"})
    line = one_line_error(r)
    # Bit Fusion is an accelerator design the cost model prices, not a host, and not a model of measured GPU steps
    assert "accelerator" in line and "host)" not in line and "cpu" not in line.lower().replace("cuda", "")
    assert "--host h100" in line and "--hw bitfusion" in line  # where it does belong: the priced targets
    r = cptsim_here("report", run, "--hw", "bitfusion", "--no-save", "--json")  # and that advice works
    assert r.exit_code == 0, r.stderr
    assert "bitfusion" in {x["name"] for x in json.loads(r.stdout)["runs"][0]["hardware"]}


def _tensor_core_run(src: Path, dst: Path, step_ms, monkeypatch) -> Path:
    """A copy of ``src`` that ran the tensor-core routes, its steady steps ``step_ms(bits)`` long: config.json records
    them as a run with them on does -- gpu_gemm.gemm_paths of the run's own model (int8 implicit-GEMM convolutions,
    int8 1x1 downsampling, FP16 dgrad) -- and every trace line names its route, as the loop that overlaps its host
    work writes them."""
    from cptsim.models import create_model
    from cptsim.numerics import gpu_gemm
    from cptsim.numerics.layers import quantize_model

    monkeypatch.setenv("CPTSIM_EXACT_GEMM", "int8")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the implicit-GEMM kernels on, as on CUDA
    cfg = json.loads((src / "config.json").read_text())
    model = create_model("resnet20", num_classes=10)
    quantize_model(model, fp_layers=cfg["fp_layers"])
    paths = gpu_gemm.gemm_paths(model, "cpu")
    run = _copy(src, dst, H100_NAME, lambda c: c["host"].update(gemm_paths=paths))
    rows = [json.loads(line) for line in (run / "trace.jsonl").read_text().splitlines() if line.strip()]
    for r in rows:
        if not r.get("warmup"):
            r["time_s"] = step_ms(r["bits"]) / 1e3
        r["path"] = "int8-tc-implicit-gemm+int8-tc"
    (run / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_a_tensor_core_run_is_priced_phase_by_phase_on_the_routes_it_recorded(tmp_path, monkeypatch):
    """ResNet-20 on the int8 routes: forward and wgrad on the int8 tier, dgrad on FP16 (gpu_gemm runs it there),
    the unquantized classifier and every other op in FP32; beside them the quantizer and code passes."""
    from cptsim.cost.hardware import load_profile
    from cptsim.cost.model import estimate
    from cptsim.measure.profiler import LayerProfile

    run = _tensor_core_run(CPT, tmp_path / "int8", lambda b: 4.0 + 0.25 * b, monkeypatch)
    r = _report(run)
    assert r.exit_code == 0, r.stderr
    h = json.loads(r.stdout)["runs"][0]["host_time"]
    assert h["route"] == "native" and h["ran"].startswith("int8")
    assert not any("host work between steps" in n for n in h["notes"])
    layers = json.loads((run / "config.json").read_text())["host"]["gemm_paths"]["layers"]
    prof = LayerProfile.from_json(json.loads((run / "profile.json").read_text()))
    gpu = load_profile("h100")
    width = {"int8-tc": 8, "int8-tc-implicit-gemm": 8, "fp16": 16}  # the tier each recorded route runs on
    phases = ("fwd", "dgrad", "wgrad")
    est = {b: estimate(prof, [{"step": 0, "batch_size": 128, "bits": b, "grad_bits": b}], gpu, per_layer=True)
           for b in (8, 16, 32)}
    want = {p: est[32].latency_s[p] - sum(x["latency_s"][p] for x in est[32].per_layer) for p in phases}  # ops
    int8_dgrad = want["dgrad"]  # (dgrad on the int8 tier, as the run was once priced)
    for i, L in enumerate(prof.layers):
        rec = layers.get(L.name) if L.quantized else None
        for p, gemm in zip(phases, ("forward", "dgrad", "wgrad")):
            want[p] += est[width[rec[gemm]] if rec else 32].per_layer[i]["latency_s"][p]
        int8_dgrad += est[8 if rec else 32].per_layer[i]["latency_s"]["dgrad"]
    assert abs(want["dgrad"] / int8_dgrad - 1) > 0.01
    for w in h["per_width"]:  # (3..8 bits: every one at the record's top-level routes)
        assert w["measured_ms"] == pytest.approx(4.0 + 0.25 * w["bits"])
        got = {p: w["modelled_phases_ms"][p] - w["modelled_passes_ms"][p] for p in phases}
        for p in phases:
            assert got[p] == pytest.approx(1e3 * want[p], rel=1e-9), p
        # the passes: quantizers and code passes in every phase, some 100 kernels for each of the 20 layers
        assert w["modelled_quantizer_ms"] == pytest.approx(sum(w["modelled_passes_ms"].values()))
        assert all(v > 0 for v in w["modelled_passes_ms"].values()) and w["modelled_pass_kernels"] > 20 * 90


def _synthetic(src: Path, dst: Path, truth: dict, batch: int | None = None, energy: bool = True) -> Path:
    """A copy of ``src`` whose steady steps take exactly what the h100 profile with the constants ``truth`` prices
    them at (and, with ``energy``, draw its energy), traced by the loop that overlaps its host work (``path`` on
    every line); ``batch``: every step at that batch size instead."""
    from cptsim.calibration.gpu_fit import with_values
    from cptsim.calibration.gpu_runfit import GPURunSteps, price_kinds
    from cptsim.cost.hardware import load_profile
    from cptsim.run.rundir import RunDir

    run = _copy(src, dst, H100_NAME)
    rows = [json.loads(line) for line in (run / "trace.jsonl").read_text().splitlines() if line.strip()]
    for r in rows:
        r["path"] = "fp32-fake-quant"
        if batch:
            r["batch_size"] = batch
    (run / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rs = GPURunSteps.from_run(RunDir.open(run))
    priced = price_kinds(rs.prof, rs.kinds, with_values(load_profile("h100"), truth), rs.route, rs.eager, rs.tf32,
                         native=False)
    for r in rows:
        if not r.get("warmup"):
            p = priced[(r["bits"], r["grad_bits"], r["batch_size"])]
            r["time_s"] = p["time_s"]
            r["energy_j"] = p["energy_j"] if energy else None
    (run / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_a_fit_on_runs_of_two_batch_sizes_recovers_the_constants_that_made_their_steps(tmp_path):
    """Steps at batch 128 and at batch 4 weigh launch overhead and bandwidth differently: the design has rank 2,
    and the fit finds the constants that generated the times and the energy, not the profile's."""
    from cptsim.calibration.gpu_runfit import GPURunSteps, fit_gpu
    from cptsim.cost.hardware import load_profile
    from cptsim.run.rundir import RunDir

    base = load_profile("h100")
    truth = {"kernel_overhead_us": 1.9 * base.calibration["kernel_overhead_us"],
             "memory_efficiency": 0.6 * base.calibration["memory_efficiency"], "power_fraction": 0.55}
    runs = [GPURunSteps.from_run(RunDir.open(_synthetic(CPT, tmp_path / f"b{n}", truth, batch=n))) for n in (128, 4)]
    fit = fit_gpu(runs, base)
    assert fit.held == {} and fit.design["rank"] == 2
    for k, v in truth.items():
        assert fit.values[k] == pytest.approx(v, rel=1e-3), k


def test_one_networks_run_fits_only_what_its_step_kinds_identify_and_holds_the_rest(tmp_path):
    from cptsim.calibration.gpu_runfit import GPURunSteps, fit_gpu
    from cptsim.cost.hardware import load_profile
    from cptsim.run.rundir import RunDir

    base = load_profile("h100")
    truth = {"kernel_overhead_us": 1.5 * base.calibration["kernel_overhead_us"], "power_fraction": 0.5}
    run = GPURunSteps.from_run(RunDir.open(_synthetic(CPT, tmp_path / "one", truth)))
    fit = fit_gpu([run], base)
    # six step kinds (3..8 bits, batch 128) which its fake-quant route prices alike: one direction, one constant
    assert len(run.kinds) == 6 and fit.design["rank"] == 1
    [held] = [k for k in ("kernel_overhead_us", "memory_efficiency") if k in fit.held]
    [moved] = [k for k in ("kernel_overhead_us", "memory_efficiency") if k != held]
    assert "rank 1" in fit.held[held] and "6 step kind" in fit.held[held]
    assert fit.values[held] == base.calibration[held]  # held at the profile's value
    # what one direction identifies: the steps' time and energy, whichever constant carries it
    assert abs(fit.runs[0]["error_pct"]) < 1e-3 and abs(fit.runs[0]["energy_error_pct"]) < 1e-3
    # steps made with the held constant at the profile's value: the moved one and the power fraction recovered
    truth = {moved: 1.5 * base.calibration[moved], "power_fraction": 0.5}
    fit = fit_gpu([GPURunSteps.from_run(RunDir.open(_synthetic(CPT, tmp_path / "two", truth)))], base)
    assert fit.values[held] == base.calibration[held]
    for k, v in truth.items():
        assert fit.values[k] == pytest.approx(v, rel=1e-3), k
    # without an energy measurement the power fraction is held too, and says why
    quiet = GPURunSteps.from_run(RunDir.open(_synthetic(CPT, tmp_path / "quiet", truth, energy=False)))
    fit = fit_gpu([quiet], base)
    assert fit.values["power_fraction"] == base.calibration["power_fraction"]
    assert "energy" in fit.held["power_fraction"]
    assert fit.values[moved] == pytest.approx(truth[moved], rel=1e-3)


def test_report_fit_on_cuda_runs_writes_a_gpu_profile_and_prices_the_holdout_in_80_columns(tmp_path):
    from cptsim.cost.hardware import load_profile

    base = load_profile("h100")
    truth = {"kernel_overhead_us": 1.9 * base.calibration["kernel_overhead_us"],
             "memory_efficiency": 0.6 * base.calibration["memory_efficiency"], "power_fraction": 0.55}
    a = _synthetic(CPT, tmp_path / "resnet20-cpt-synthetic-batch-128", truth)
    b = _synthetic(CPT, tmp_path / "resnet20-cpt-synthetic-batch-4", truth, batch=4)
    held_out = _synthetic(STATIC32, tmp_path / "resnet20-static32-synthetic-held-out", truth)
    out = tmp_path / "h100-fitted.toml"
    r = cptsim_here("report", a, b, "--fit", "--fit-out", out, "--holdout", held_out, "--no-save",
                    env_extra={"COLUMNS": "80"})
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(len(x) for x in lines) <= 80, [x for x in lines if len(x) > 80]
    assert "…" not in r.stdout
    # the held-out run's row keeps its numbers whole: its time, energy and unfitted errors
    [row] = [x for x in lines if x.startswith("│") and "hold-out" in x]
    assert row.count("%") == 3 and row.count(" s ") == 2, row
    r = _report(a, b, "--fit", "--fit-out", out, "--force", "--holdout", held_out)
    assert r.exit_code == 0, r.stderr
    fit = json.loads(r.stdout)["fit"]
    assert fit["kind"] == "gpu" and set(fit["fitted"]) == set(truth) and fit["held"] == {}
    prof = load_profile(str(out))
    assert prof.kind == "gpu" and "fitted by `cptsim report --fit`" in prof.sources[0]
    assert prof.params["tiers"] == base.params["tiers"]  # only the calibration moved
    [held] = fit["holdout"]
    assert abs(held["error_pct"]) < 0.01 and abs(held["energy_error_pct"]) < 0.01
    # the written profile prices the held-out run as the fit said: report it with --host
    r = _report(held_out, "--host", out)
    h = json.loads(r.stdout)["runs"][0]["host_time"]
    # (to 0.01 points: the file keeps 6 significant digits of each fitted value)
    assert h["profile"] == "h100-fitted" and h["error_pct"] == pytest.approx(held["error_pct"], abs=0.01)


def test_fit_refuses_steps_timed_with_the_loops_host_work_naming_the_run(tmp_path):
    old = _copy(CPT, tmp_path / "no-route", H100_NAME)  # the H100 trace: no GEMM route on its lines
    r = _report(old, "--fit", "--fit-out", tmp_path / "x.toml")
    assert r.exit_code == 2 and "no-route" in r.stderr and "host work" in _flat(r.stderr)
    assert len([x for x in r.stderr.splitlines() if x.startswith("error")]) == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "x.toml").exists()
    # a run with some such lines: those are left out, the rest fitted, and the report says how many
    mixed = _synthetic(CPT, tmp_path / "mixed", {"power_fraction": 0.5})
    rows = [json.loads(line) for line in (mixed / "trace.jsonl").read_text().splitlines() if line.strip()]
    steady = [r for r in rows if not r.get("warmup")]
    for r in steady[:10]:
        del r["path"]
        r["time_s"] *= 2  # the host's work in them: it must not reach the fit
    (mixed / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = _report(mixed, "--fit", "--fit-out", tmp_path / "y.toml")
    assert r.exit_code == 0, r.stderr
    [run] = json.loads(r.stdout)["fit"]["runs"]
    assert run["left_out_steps"] == 10 and run["steps"] == len(steady) - 10 and abs(run["error_pct"]) < 1e-3


def test_fit_never_mixes_cpu_and_cuda_runs(tmp_path):
    cuda = _copy(CPT, tmp_path / "a", H100_NAME)
    cpu = Path(__file__).parent / "data" / "pre_layout" / "run"
    r = _report(cuda, "--fit", "--fit-out", tmp_path / "x.toml", "--holdout", cpu)
    assert r.exit_code == 2 and "CUDA runs and CPU runs together" in _flat(r.stderr)
    assert not (tmp_path / "x.toml").exists()


def test_static_32_is_full_precision_and_static_32_g8_keeps_the_old_meaning():
    from cptsim.cost.schedules import describe, parse_schedule

    fp, old = parse_schedule("static:32"), parse_schedule("static:32:g8")
    assert (fp.g_min, fp.g_max) == (32, 32) and (old.g_min, old.g_max) == (8, 8)
    assert describe(fp, 10)["relative_cost_fp32"] == 1.0
    assert describe(old, 10)["relative_cost_fp32"] == pytest.approx((32 * 32 + 2 * 32 * 8) / (3 * 32 * 32))
    assert parse_schedule(fp.to_text()) == fp and parse_schedule(old.to_text()) == old
    # the shipped static:32 run (written when static:32 meant g8) keeps its meaning: its resolved JSON says g8
    cfg = json.loads((STATIC32 / "config.json").read_text())
    assert cfg["settings"]["schedule"] == "static:32:g8" or cfg["schedule"]["g_max"] == 8
    assert np.all(np.array([json.loads(x)["grad_bits"] for x in (STATIC32 / "trace.jsonl").read_text().split()]) == 8)


def test_resume_reads_the_schedule_from_the_resolved_json_not_the_settings_text(tmp_path, monkeypatch):
    import cptsim.run.train as T
    from cptsim.run.config import TrainConfig
    from cptsim.run.rundir import RunDir

    cfg = TrainConfig(model="digits-cnn", dataset="digits", schedule="static:32:g8", steps=2, batch_size=64,
                      seed=0, device="cpu")
    w = T.build(cfg)
    doc = T.resolved_config(cfg, w)
    doc["settings"]["schedule"] = "static:32"  # as a text written before static:32 meant an unquantized error
    run = RunDir.create(tmp_path / "r", doc)
    seen = {}
    monkeypatch.setattr(T, "_loop", lambda cfg, w, *a, **k: seen.setdefault("sched", w.schedule))
    T.resume(str(run.path), progress=False)
    assert (seen["sched"].g_min, seen["sched"].g_max) == (8, 8)


def test_runs_record_their_device_and_driver_names_map_only_to_the_variant_a_profile_describes():
    from cptsim.cost.hardware.gpus import shipped_profile_for
    from cptsim.run.device import device_record

    cpu = device_record("cpu")
    assert cpu["type"] == "cpu" and cpu["name"] and isinstance(cpu["extensions"], list)
    names = {"NVIDIA H100 80GB HBM3": "h100", "NVIDIA H100 PCIe": None, "NVIDIA H100 NVL": None,
             "NVIDIA H200": "h200", "NVIDIA A100-SXM4-80GB": "a100", "NVIDIA A100 80GB PCIe": None,
             "NVIDIA A100-SXM4-40GB": None, "Tesla T4": "t4", "Tesla V100-SXM2-32GB": "v100",
             "Tesla V100-PCIE-16GB": None, "NVIDIA GeForce RTX 3090": "rtx3090", "NVIDIA GeForce RTX 3090 Ti": None,
             "NVIDIA GeForce RTX 4090": "rtx4090", "NVIDIA L40S": "l40s", "NVIDIA B200": "b200",
             "AMD Instinct MI300X": "mi300x"}
    assert {n: shipped_profile_for(n) for n in names} == names


@pytest.mark.cuda
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_a_run_records_its_gpu_and_the_profile_that_describes_it():
    import torch

    from cptsim.cost.hardware.gpus import profile_for
    from cptsim.run.device import device_record

    rec = device_record("cuda")
    p = torch.cuda.get_device_properties(0)
    assert rec["type"] == "cuda" and rec["name"] == p.name and rec["sm_count"] == p.multi_processor_count
    assert rec["cuda"] == torch.version.cuda and rec["memory_gb"] > 1
    assert rec["profile"] == profile_for(p.name)["profile"]
    assert set(rec["tf32"]) == {"torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32"}

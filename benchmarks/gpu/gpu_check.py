"""The GPU acceptance check of issue 14, in one go (benchmarks/gpu/gpu_check.sh runs it; about 4-5 minutes on one GPU).

    python benchmarks/gpu/gpu_check.py [--device cuda] [--quick] [--json]

Prints, section by section:
  1. the CUDA tests (pytest -m cuda tests/test_cuda.py);
  2. resnet20 at batch 128 on synthetic CIFAR-shaped data: median steady step time (warm-up steps left out) of FP32
     (every layer full precision) and quantized, as cptsim trains on a GPU (CUDA graphs, fused quantizers), and
     without CUDA graphs (CPTSIM_CUDA_GRAPHS=0) for comparison; the ratios (target <= 1.3x);
  3. host-device synchronisations per training step (CPTSIM_SYNC_DEBUG=warn; target 1);
  4. `cptsim hw calibrate --device cuda` (GEMM rate per tier, bandwidth, overhead, power);
  5. resnet20 and imagenet-resnet18 trained on synthetic data, `cptsim report --fit` on resnet20 with resnet18 held
     out: GPU time estimated vs measured on the run that was not fitted (target <= 15%);
  6. NVML energy measured vs modelled for both runs.
Each part has its own time limit and a failure in one does not stop the others. --device cpu --quick runs the same
plumbing on a CPU with tiny sizes (to test this script; the figures mean nothing there).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
T0 = time.perf_counter()
DEADLINE = [float("inf")]  # --budget: no command runs past T0 + budget (a partial report beats none)


def say(msg: str = "") -> None:
    print(msg, flush=True)


def section(title: str) -> None:
    say(f"\n=== {title}  [t+{time.perf_counter() - T0:.0f}s]")


def sh(args: list[str], timeout: float, env: dict | None = None, show: bool = True) -> subprocess.CompletedProcess:
    e = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    left = DEADLINE[0] - time.perf_counter()
    if left < 5:
        say(f"SKIPPED (--budget spent): {' '.join(args[2:6])} ...")
        return subprocess.CompletedProcess(args, 124, "", "")
    timeout = min(timeout, left)
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=e, cwd=ROOT)
    except subprocess.TimeoutExpired as ex:
        say(f"TIMEOUT after {timeout:.0f}s: {' '.join(args)}")
        out = ex.stdout.decode() if isinstance(ex.stdout, bytes) else (ex.stdout or "")
        return subprocess.CompletedProcess(args, 124, out, "")
    if show and r.stdout.strip():
        say(r.stdout.rstrip())
    if r.returncode != 0:
        say(f"exit {r.returncode}: {' '.join(args)}")
        say("\n".join(r.stderr.strip().splitlines()[-25:]))
    return r


def cptsim(*args: str, timeout: float = 120, env: dict | None = None, show: bool = True):
    return sh([PY, "-m", "cptsim.cli.main", *args], timeout, env, show)


def trace(run: Path) -> list[dict]:
    p = run / "trace.jsonl"
    if not p.is_file():
        return []
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def median_step(run: Path, skip: int) -> float | None:
    """Median time of the steady steps: past the first ``skip`` and not marked warm-up by the training loop."""
    t = [r["time_s"] for r in trace(run)[skip:] if not r.get("warmup")]
    return statistics.median(t) if t else None


def cptsim_warnings(r: subprocess.CompletedProcess) -> list[str]:
    """cptsim's own warnings on stderr (a fused quantizer or a CUDA graph capture that fell back to eager)."""
    return [x.strip() for x in (r.stderr or "").splitlines() if "cptsim:" in x and "Warning" in x]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a plumbing test on a CPU)")
    ap.add_argument("--json", action="store_true", help="also print one JSON object of the figures at the end")
    ap.add_argument("--work", default=None, help="directory for runs and profiles (default: a temporary one)")
    ap.add_argument("--budget", type=float, default=360.0,
                    help="seconds the whole check may take (the issue's 6 minutes); commands are cut to fit")
    a = ap.parse_args()
    DEADLINE[0] = T0 + a.budget
    dev, quick = a.device, a.quick
    work = Path(a.work or tempfile.mkdtemp(prefix="cptsim-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    figs: dict = {"device": dev}

    import torch

    if dev == "cuda":
        figs["gpu"] = torch.cuda.get_device_name()
        say(f"GPU: {figs['gpu']}  torch {torch.__version__}  CUDA {torch.version.cuda}  python {sys.version.split()[0]}")
        try:
            import pynvml  # noqa: F401

            say("NVML: pynvml importable")
        except ImportError:
            say("NVML: pynvml NOT importable (no energy figures)")
    say(f"work dir: {work}")

    # ---- 1. CUDA tests --------------------------------------------------------------------------------------------
    section("1. CUDA tests: pytest -m cuda tests/test_cuda.py")
    r = sh([PY, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", "tests/test_cuda.py", "-rs"],
           timeout=40 if quick else 170)
    figs["cuda_tests_rc"] = r.returncode
    figs["cuda_tests"] = (r.stdout.strip().splitlines() or ["(no output)"])[-1]

    # ---- 2. step-time ratio ---------------------------------------------------------------------------------------
    section("2. resnet20, batch 128, synthetic 3x32x32: quantized / FP32 median step time")
    bs, steps, skip = (16, 8, 3) if quick else (128, 50, 5)
    data = f"synthetic:3,32,32:10:{bs * (steps + 4)}"
    base = ["train", "--model", "resnet20", "--dataset", data, "--batch-size", str(bs), "--steps", str(steps),
            "--schedule", "static:4:g8", "--device", dev, "--quiet", "--lr-schedule", "constant"]
    med = {}
    eager = {"CPTSIM_CUDA_GRAPHS": "0"}
    for label, extra, env in (("fp32", ["--fp-layers", "*"], {}), ("quant", [], {}),
                              ("quant_unfused", [], {"CPTSIM_FUSED": "0"}),
                              ("fp32_nographs", ["--fp-layers", "*"], eager), ("quant_nographs", [], eager)):
        out = work / f"ratio-{label}"
        r = cptsim(*base, *extra, "--out", str(out), timeout=60 if quick else 100, env=env, show=False)
        med[label] = median_step(out, skip)
        steady = sum(not x.get("warmup") for x in trace(out))
        say(f"  {label:15s} median steady step {med[label] * 1e3:.2f} ms ({steady} steady steps)" if med[label]
            else f"  {label}: no trace")
        for wline in cptsim_warnings(r)[:3]:
            say(f"    {wline}")
    for label, ref in (("quant", "fp32"), ("quant_unfused", "fp32"), ("quant_nographs", "fp32_nographs"),
                       ("quant_nographs", "fp32")):
        if med.get(label) and med.get(ref):
            key = f"ratio_{label}" + ("" if ref == "fp32" else f"_vs_{ref}")
            figs[key] = med[label] / med[ref]
            say(f"  ratio {label} / {ref} = {figs[key]:.2f}x (target <= 1.3x)")
    figs["step_ms"] = {k: (v * 1e3 if v else None) for k, v in med.items()}

    # ---- 3. syncs per step ----------------------------------------------------------------------------------------
    section("3. host-device synchronisations per training step (CPTSIM_SYNC_DEBUG=warn)")
    if dev == "cuda":
        out = work / "syncs"
        cptsim(*base[:base.index("--steps") + 1], "12", *base[base.index("--steps") + 2:], "--out", str(out),
               timeout=120, env={"CPTSIM_SYNC_DEBUG": "warn"}, show=False)
        tr = trace(out)
        counts = [r["host_syncs"] for r in tr if "host_syncs" in r and not r.get("warmup")]
        figs["host_syncs_per_step"] = statistics.mean(counts) if counts else None
        say(f"  per step (steady steps; {sum(bool(r.get('warmup')) for r in tr)} warm-up steps not counted): {counts}"
            f"  mean {figs['host_syncs_per_step']} (target 1)")
    else:
        say("  (CUDA only)")

    # ---- 4. calibrate ---------------------------------------------------------------------------------------------
    section("4. cptsim hw calibrate --device " + dev)
    host = work / "host.toml"
    r = cptsim("hw", "calibrate", "--device", dev, "--seconds", "2" if quick else "12", "--out", str(host),
               timeout=90 if quick else 150)
    ok_cal = r.returncode == 0 and host.is_file()
    gpu_prof = work / "host-gpu.toml"
    if gpu_prof.is_file():
        say(gpu_prof.read_text())

    # ---- 5. train two workloads, fit on one, predict the other -----------------------------------------------------
    section("5. resnet20 and imagenet-resnet18 on synthetic data; report --fit on resnet20, resnet18 held out")
    runs = {}
    specs = {
        "resnet20": (["--model", "resnet20", "--dataset", "synthetic:3,32,32:10:" + ("64" if quick else "6400"),
                      "--batch-size", "16" if quick else "128", "--epochs", "2"], 60 if quick else 120),
        "imagenet-resnet18": (["--model", "imagenet-resnet18", "--dataset",
                               "synthetic:3,224,224:1000:" + ("16" if quick else "1280"),
                               "--batch-size", "8" if quick else "64", "--epochs", "2"], 90 if quick else 150),
    }
    for name, (args, limit) in specs.items():
        out = work / f"run-{name}"
        t = time.perf_counter()
        r = cptsim("train", *args, "--schedule", "cpt:3-8:g8:n4", "--device", dev, "--quiet", "--out", str(out),
                   timeout=limit, show=False)
        for wline in cptsim_warnings(r)[:3]:
            say(f"    {wline}")
        if r.returncode == 0:
            runs[name] = out
            tr = trace(out)
            st = [x["time_s"] for x in tr if not x.get("warmup")] or [x["time_s"] for x in tr]
            say(f"  {name}: {len(tr)} steps ({len(tr) - sum(not x.get('warmup') for x in tr)} warm-up) in "
                f"{time.perf_counter() - t:.0f}s wall, median steady step {statistics.median(st) * 1e3:.1f} ms, "
                f"warm-up steps {sum(x['time_s'] for x in tr if x.get('warmup')):.2f} s in all"
                + (f", energy column present" if tr and "energy_j" in tr[0] else ", no energy column"))
    if ok_cal and len(runs) == 2:
        fitted = work / "host-fitted.toml"
        r = cptsim("report", str(runs["resnet20"]), "--host", str(host), "--fit", "--fit-out", str(fitted),
                   "--holdout", str(runs["imagenet-resnet18"]), "--no-save", "--json", timeout=90, show=False)
        try:
            doc = json.loads(r.stdout)["fit"]
            fit_q = {"fit_on_resnet20": doc.get("fit"), "fitted": doc.get("fitted")}
            figs["fit"] = fit_q
            for h in doc.get("holdout", []):
                figs["holdout_total_error_pct"] = h.get("total_error_pct")
                figs["holdout_base_profile_error_pct"] = h.get("base_profile_total_error_pct")
                say(f"  ({h.get('warmup_note') or 'no warm-up step left out'})")
                if h.get("measured_energy_j") is not None:
                    figs["holdout_energy_error_pct"] = h.get("energy_error_pct")
                    say(f"  held-out energy: measured {h['measured_energy_j']:.1f} J (avg "
                        f"{h['measured_avg_power_w']:.0f} W), modelled {h['modelled_energy_j']:.1f} J with the power "
                        f"fitted on resnet20's NVML energy ({doc.get('fitted', {}).get('power_w')} W) -> "
                        f"{h['energy_error_pct']:+.1f}%")
                say(f"  held-out imagenet-resnet18: measured {h['measured_s']:.2f} s, modelled {h['modelled_s']:.2f} s "
                    f"-> error {h['total_error_pct']:+.1f}% (target |err| <= 15%); unfitted calibrate profile: "
                    f"{h['base_profile_total_error_pct']:+.1f}%")
            say(f"  fit on resnet20: {json.dumps(fit_q, default=str)}")
        except (ValueError, KeyError, TypeError) as e:
            say(f"  fit output not readable ({type(e).__name__}: {e}); stderr: {r.stderr[-800:]}")

        # ---- 6. energy -------------------------------------------------------------------------------------------
        section("6. energy: NVML measured vs modelled (fitted host profile: its power, fitted on resnet20's measured "
                "energy when the traces carry it, x modelled time)")
        prof = fitted if fitted.is_file() else host
        for name, out in runs.items():
            r = cptsim("report", str(out), "--host", str(prof), "--hw", "h100", "--json", timeout=90, show=False)
            try:
                h = json.loads(r.stdout)["runs"][0]["host_time"]
                figs[f"energy_{name}"] = {k: h.get(k) for k in ("measured_energy_j", "modelled_energy_j",
                                                                 "energy_error_pct", "measured_avg_power_w",
                                                                 "measured_s", "modelled_s", "error_pct",
                                                                 "warmup_steps_skipped", "with_warmup")}
                say(f"  {name}: time measured {h['measured_s']:.2f} s vs modelled {h['modelled_s']:.2f} s "
                    f"({h['error_pct']:+.1f}%); energy measured {h.get('measured_energy_j')} J vs modelled "
                    f"{h.get('modelled_energy_j')} J ({h.get('energy_error_pct')}%), avg "
                    f"{h.get('measured_avg_power_w')} W; {h.get('warmup_steps_skipped')} warm-up steps left out "
                    f"(with them: {h.get('with_warmup')})")
                for e in h["per_epoch"]:
                    say(f"    epoch {e['epoch']}: {e['steps']} steps, time {e['measured_s']:.2f} vs "
                        f"{e['modelled_s']:.2f} s, energy {e.get('measured_energy_j')} vs {e.get('modelled_energy_j')} J")
            except (ValueError, KeyError, TypeError, IndexError) as e:
                say(f"  {name}: report not readable ({type(e).__name__}: {e}); stderr: {r.stderr[-800:]}")
    else:
        say("  skipped: calibration or a training run failed (see above)")

    section("summary")
    figs["elapsed_s"] = round(time.perf_counter() - T0, 1)
    for k, v in figs.items():
        say(f"  {k}: {json.dumps(v) if isinstance(v, (dict, list)) else v}")
    if a.json:
        print(json.dumps(figs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Modelled vs measured saving of a CPT schedule over static 32 and static 8 on this machine (issue 28 item 2).

    python benchmarks/bench_host_saving.py                       # ~3-4 min on a 2-core CPU, 1 thread
    python benchmarks/bench_host_saving.py --steps 12 --measure 5 --json

For digits-cnn and transformer-lm (the registry's small default: 2 layers, width 128, 4 heads, on the embedded
pydoc-chars text, 64 characters per sequence, batch 64 -> 4,096 tokens per GEMM call), each with the exact int8
GEMMs off (CPTSIM_EXACT_GEMM=0: every GEMM FP32 fake-quant) and on (=1, the CPU default since the sixth session: a
quantized Linear layer's forward and wgrad at <= 8 bits as torch._int_mm): calibrates this machine once (`cptsim hw calibrate`, 1 thread, int8 and
bf16 tiers included), trains a short run of a cyclic schedule that visits 3..8 bits, and runs
`cptsim report RUN --measure-host N` on it. Prints per case the modelled saving of the schedule over static 32 and
static 8 (the host profile, its int8 tier priced only where the run's exact path ran int8), the measured saving (a
side-by-side timing pass of the run's model, widths alternating, medians), and the gap (measured - modelled,
points of %); and the measured 8/8 and 32/32 steps, so the int8 path's own effect (exact on vs off) shows.

Everything is written under a temporary directory (CPTSIM_HOME included): nothing of the user's is touched.
Timings on a machine shared with other jobs move by ~10% from one pass to the next.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CASES = (
    ("digits-cnn", ["--model", "digits-cnn", "--batch-size", "128"]),
    ("transformer-lm", ["--model", "transformer-lm", "--dataset", "pydoc-chars", "--batch-size", "64"]),
)


def _cptsim(args, env) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "cptsim.cli.main", *args], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"cptsim {' '.join(args)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return r


def _paired(run: Path, n: int, threads: int, env: dict) -> dict:
    """One alternating timing pass of the run's model at 8/8 with the exact path off and on and at 32/32
    (cptsim.study.report.measure_host_steps), next to the host profile's modelled step times of the same."""
    os.environ.update({k: env[k] for k in ("CPTSIM_HOME", "CPTSIM_NO_CALIBRATE")})
    import numpy as np
    import torch

    from cptsim.cost.hardware import load_profile
    from cptsim.cost.hardware.host import host_gemm_tiers
    from cptsim.cost.model import estimate
    from cptsim.run.rundir import RunDir
    from cptsim.study.report import measure_host_steps

    torch.set_num_threads(threads)
    rd = RunDir.open(run)
    cfg = rd.read_config()
    prof = rd.read_profile()
    batch = int(cfg["settings"]["batch_size"])
    med = measure_host_steps(run, cfg, [(8, 8), (32, 32)], n, exact_modes=(False, True))
    host = load_profile("host")
    step = lambda q, g, on: float(estimate(prof, [{"step": 0, "bits": q, "grad_bits": g, "batch_size": batch}],  # noqa: E731
                                           host.with_exact_gemm(on), per_layer=False).latency_s["total"])
    mo = {"fake": step(8, 8, False), "exact": step(8, 8, True), "fp32": step(32, 32, False)}
    me = {"fake": med[(8, 8, False)], "exact": med[(8, 8, True)], "fp32": med[(32, 32, False)]}
    a = prof.arrays()
    share = float((a.macs * host_gemm_tiers(a, [8], [8], [batch])[0]).sum() / a.macs.sum()) \
        if host.with_exact_gemm(True).int8_active else 0.0
    ratio = lambda d: {"exact_over_fake": d["exact"] / d["fake"], "exact_over_fp32": d["exact"] / d["fp32"],  # noqa: E731
                       "fake_over_fp32": d["fake"] / d["fp32"]}
    return {"model": cfg["settings"]["model"], "int8_mac_share": share, "modelled_step_s": mo, "measured_step_s": me,
            "measured_fp32_exact_on_s": med[(32, 32, True)], "modelled_ratio": ratio(mo), "measured_ratio": ratio(me)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12, help="training steps per run (default 12)")
    ap.add_argument("--measure", type=int, default=5, help="timing-pass steps per width (default 5)")
    ap.add_argument("--schedule", default="cos-rep:3-8:g8:n2", help="the cyclic schedule (default cos-rep:3-8:g8:n2)")
    ap.add_argument("--calibrate-seconds", type=float, default=4.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--keep", default=None, help="keep the runs (and the calibrated profile) here")
    a = ap.parse_args()

    work = Path(a.keep or tempfile.mkdtemp(prefix="cptsim-bench-saving-"))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CPTSIM_HOME=str(work / "home"), CPTSIM_NO_CALIBRATE="1", OMP_NUM_THREADS=str(a.threads))
    env.pop("CPTSIM_EXACT_GEMM", None)
    cal = json.loads(_cptsim(["hw", "calibrate", "--seconds", str(a.calibrate_seconds), "--json"], env).stdout)
    m = cal["measured"]
    tiers = {"fp32": m["matmul_macs_per_s"], **{t: r["macs_per_s"] for t, r in (m.get("tiers") or {}).items()}}
    rows = []
    for name, args in CASES:
        for exact in ("0", "1"):
            run = work / f"{name}-exact{exact}"
            e = dict(env, CPTSIM_EXACT_GEMM=exact)
            _cptsim(["train", *args, "--steps", str(a.steps), "--schedule", a.schedule, "--threads", str(a.threads),
                     "--quiet", "--out", str(run)], e)
            rep = json.loads(_cptsim(["report", str(run), "--json", "--no-save", "--hw", "h100", "--measure-host",
                                      str(a.measure)], env).stdout)
            s = rep["runs"][0]["host_saving"]
            meas = s["measured"] or {}
            rows.append({
                "model": name, "exact_gemm": exact == "1", "int8_priced": s["int8_priced"],
                "int8_mac_share": s["int8_mac_share"], "steps": s["steps"],
                "modelled_saving": s["modelled_saving"], "measured_saving": s["measured_saving"],
                "gap_pts": s["gap_pts"], "modelled_s": s["modelled_s"],
                "measured_s": {k: meas.get(f"{k}_s") for k in ("schedule", "static32", "static8")},
                "measured_step_s": meas.get("step_s"), "modelled_step_s": s["modelled_step_s"],
                "trace_s": s["measured_trace_s"], "trace_over_pass": meas.get("trace_over_pass"),
            })
    paired = [_paired(work / f"{name}-exact0", a.measure, a.threads, env) for name, _ in CASES]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    doc = {"load_average_1min_at_end": load, "cpus": os.cpu_count(), "threads": a.threads, "steps": a.steps, "measure": a.measure, "schedule": a.schedule,
           "cpu": m["cpu"], "tier_macs_per_s": tiers, "cases": rows, "exact_path_at_8": paired}
    if a.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"{m['cpu']}, {a.threads} thread(s); tiers measured: "
          + ", ".join(f"{k} {v / 1e9:.1f} GMAC/s" for k, v in tiers.items()))
    print(f"schedule {a.schedule}, {a.steps} steps; timing pass {a.measure} steps per width (medians); "
          f"load average at the end {load:.1f} on {os.cpu_count()} CPUs (other jobs share this machine)")
    hdr = (f"{'model':<16}{'exact':>6}{'int8 MACs':>10}  {'vs static 32: model':>20}{'meas.':>8}{'gap':>9}  "
           f"{'vs static 8: model':>19}{'meas.':>8}{'gap':>9}  {'8/8 ms':>8}{'32/32 ms':>9}{'trace/pass':>11}")
    print(hdr)
    pc = lambda x: "-" if x is None else f"{100 * x:+.1f}%"  # noqa: E731
    pt = lambda x: "-" if x is None else f"{x:+.1f}pt"  # noqa: E731
    for r in rows:
        st = r["measured_step_s"] or {}
        print(f"{r['model']:<16}{'on' if r['exact_gemm'] else 'off':>6}{100 * r['int8_mac_share']:>9.0f}%  "
              f"{pc(r['modelled_saving']['vs_static32']):>20}{pc((r['measured_saving'] or {}).get('vs_static32')):>8}"
              f"{pt((r['gap_pts'] or {}).get('vs_static32')):>9}  "
              f"{pc(r['modelled_saving']['vs_static8']):>19}{pc((r['measured_saving'] or {}).get('vs_static8')):>8}"
              f"{pt((r['gap_pts'] or {}).get('vs_static8')):>9}  "
              f"{1e3 * st.get('8/8', float('nan')):>8.1f}{1e3 * st.get('32/32', float('nan')):>9.1f}"
              f"{r['trace_over_pass'] or float('nan'):>11.2f}")
    print("saving = 1 - schedule time / static time of the same steps; gap = measured - modelled saving (points of %);"
          " trace/pass = the run's own step times over the timing pass's time for the same schedule")
    print("\nthe exact int8 path's own effect at 8/8 bits, one alternating pass (fake-quant 8/8, exact 8/8, FP32 32/32):")
    print(f"{'model':<16}{'int8 MACs':>10}  {'exact/fake: model':>18}{'meas.':>8}  {'exact/FP32: model':>18}{'meas.':>8}"
          f"  {'fake/FP32: model':>17}{'meas.':>8}")
    for r in paired:
        mo, me = r["modelled_ratio"], r["measured_ratio"]
        print(f"{r['model']:<16}{100 * r['int8_mac_share']:>9.0f}%  {mo['exact_over_fake']:>18.3f}"
              f"{me['exact_over_fake']:>8.3f}  {mo['exact_over_fp32']:>18.3f}{me['exact_over_fp32']:>8.3f}  "
              f"{mo['fake_over_fp32']:>17.3f}{me['fake_over_fp32']:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

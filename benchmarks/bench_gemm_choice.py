"""The measurement that picks the CPU's default GEMM path (cptsim.numerics.gemm_choice), repeated and printed.

    python benchmarks/bench_gemm_choice.py [--threads 1 2] [--repeats 5] [--json]
    python benchmarks/bench_gemm_choice.py --slow-int-mm transformer-lm [--steps 4]

Each repeat is a fresh measurement (the cache file is neither read nor written): torch._int_mm against the FP32
matmul of gemm_choice.PROBE_SHAPE at each thread count, the fastest of a few calls each, the decision it gives
(exact int8 path on when _int_mm is at least MIN_SPEEDUP times faster) and the wall time the measurement took. The
spread over repeats says how far a busy machine moves it; the decision should not move. Beside them, the decision
this machine has kept (what a run here takes), where there is one.

``--slow-int-mm MODEL``: what a CPU without int8 dot products (AVX2 only: _int_mm ~40x slower than here) gets by
default, on this one: `cptsim train --model MODEL --steps N` in a subprocess whose torch._int_mm sleeps 39x its own
time, with a fresh cache directory, once by default and once with CPTSIM_EXACT_GEMM=1; the path config.json records
and the step times.
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

import torch

from cptsim.numerics import gemm_choice as G


SLOW_INT_MM = """
import sys, time
import torch
real = torch._int_mm
def slow(a, b):
    t = time.perf_counter()
    out = real(a, b)
    time.sleep(39 * (time.perf_counter() - t))
    return out
torch._int_mm = slow
from cptsim.cli.main import cli
sys.exit(cli(sys.argv[1:]))
"""


def slow_int_mm_runs(model: str, steps: int) -> int:
    """``--slow-int-mm`` (module docstring)."""
    with tempfile.TemporaryDirectory(prefix="cptsim-gemm-choice-") as tmp:
        for env in ("auto", "1"):
            out = Path(tmp) / f"run-{env}"
            e = dict(os.environ, CPTSIM_HOME=str(Path(tmp) / f"home-{env}"), CPTSIM_EXACT_GEMM=env)
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-c", SLOW_INT_MM, "train", "--model", model, "--steps", str(steps),
                                "--quiet", "--out", str(out)], env=e, capture_output=True, text=True)
            if r.returncode != 0:
                print(r.stderr[-2000:])
                return 1
            cfg = json.loads((out / "config.json").read_text())
            steps_s = [json.loads(x)["time_s"] for x in (out / "trace.jsonl").read_text().splitlines()]
            print(f"CPTSIM_EXACT_GEMM={env}: {cfg['host']['gemm_paths']['exact_gemm']}")
            print(f"  {cfg['host']['threads']} thread(s), step times {' '.join(f'{t:.2f}' for t in steps_s)} s, "
                  f"wall {time.perf_counter() - t0:.1f} s")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, torch.get_num_threads()])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--slow-int-mm", metavar="MODEL", help="train MODEL with _int_mm made ~40x slower (above)")
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    if args.slow_int_mm:
        return slow_int_mm_runs(args.slow_int_mm, args.steps)
    cpu, ext = G.cpu_signature()
    M, K, N = G.PROBE_SHAPE
    out = {"cpu": cpu, "int8_extension": G.int8_extension(ext), "torch": torch.__version__,
           "shape": [M, K, N], "min_speedup": G.MIN_SPEEDUP, "threads": {}}
    for t in dict.fromkeys(args.threads):
        rows = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            f = G.measure(t)
            wall = time.perf_counter() - t0
            if "error" in f:
                rows.append({"error": f["error"], "wall_s": wall})
                continue
            rows.append({"int_mm_ms": f["int_mm_s"] * 1e3, "fp32_ms": f["fp32_s"] * 1e3,
                         "speedup": f["fp32_s"] / f["int_mm_s"], "on": G.decide(f["int_mm_s"], f["fp32_s"]),
                         "calls": f["calls"], "wall_s": wall})
        kept = G._read(G.cache_path()).get(G.cache_key(cpu, ext, t))
        out["threads"][str(t)] = {"repeats": rows, "kept": kept}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{cpu} ({out['int8_extension']}), torch {torch.__version__}: torch._int_mm vs FP32 torch.mm of "
          f"{M}x{K} @ {K}x{N}; exact path on when >= {G.MIN_SPEEDUP:g}x faster")
    print(f"{'threads':>7} {'_int_mm ms':>11} {'fp32 ms':>9} {'speedup':>8} {'decision':>9} {'calls':>5} "
          f"{'wall ms':>8}")
    for t, doc in out["threads"].items():
        for r in doc["repeats"]:
            if "error" in r:
                print(f"{t:>7} _int_mm failed: {r['error']}")
                continue
            print(f"{t:>7} {r['int_mm_ms']:>11.3f} {r['fp32_ms']:>9.3f} {r['speedup']:>7.2f}x "
                  f"{'exact' if r['on'] else 'fake':>9} {r['calls']:>5} {r['wall_s'] * 1e3:>8.0f}")
        ok = [r for r in doc["repeats"] if "error" not in r]
        if ok:
            print(f"{t:>7} median {statistics.median(r['int_mm_ms'] for r in ok):.3f} vs "
                  f"{statistics.median(r['fp32_ms'] for r in ok):.3f} ms, "
                  f"{statistics.median(r['speedup'] for r in ok):.2f}x; decisions: "
                  f"{sorted({'exact' if r['on'] else 'fake' for r in ok})}")
        kept = doc["kept"]
        print(f"{t:>7} kept here: {kept['why'] if kept else 'nothing yet (' + str(G.cache_path()) + ')'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

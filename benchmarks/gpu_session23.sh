#!/usr/bin/env bash
# Issue 23's device check, one call on a lent GPU (about 7 minutes): run from the repo root as
#   OUT=/some/dir bash benchmarks/gpu_session23.sh
# 1. `cptsim hw calibrate --device cuda` -> $OUT/cal/host-gpu.toml (the card's profile from microbenchmarks) and
#    $OUT/calibrate.json (every microbenchmark record);
# 2. benchmarks/gpu_measure.py sections a,h,f,b -> $OUT/heldout.json: cptsim's graph / LM / CIFAR workloads and a
#    ViT (step time, NVML joules per step), FP8/int8/FP16 GEMMs, and 12 timm networks nothing was fitted on
#    (NCHW, then channels-last while time is left).
# benchmarks/bench_gpu_heldout.py compares them with the cost model afterwards, on any machine.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu23}
mkdir -p "$OUT/cal"
PY=${PY:-python3}
. benchmarks/gpu_session_env.sh
echo "== 1/2 cptsim hw calibrate --device cuda"
t0=$(date +%s)
timeout 170 "$PY" -c 'import sys; from cptsim.cli.main import main; sys.argv[0] = "cptsim"; main()' \
    hw calibrate --device cuda --seconds 10 --out "$OUT/cal/host.toml" --json >"$OUT/calibrate.json" 2>"$OUT/calibrate.err"
echo "calibrate rc=$? in $(( $(date +%s) - t0 )) s"; tail -5 "$OUT/calibrate.err"; cat "$OUT/cal/host-gpu.toml" 2>/dev/null
echo "== 2/2 held-out measurements"
timeout 300 "$PY" benchmarks/gpu_measure.py --out "$OUT/heldout.json" --budget ${BUDGET:-270} --sections a,h,f,b \
    --models held-out --formats nchw,nhwc --no-flops
echo "gpu_measure rc=$?"

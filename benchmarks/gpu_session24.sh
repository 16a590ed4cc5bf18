#!/usr/bin/env bash
# The fourth session's device check, one call on a lent GPU (about 6 minutes): run from the repo root as
#   OUT=/some/dir bash benchmarks/gpu_session24.sh
# 1. the CUDA tests (pytest -m cuda tests/test_cuda.py), which no CPU session can run;
# 2. `cptsim hw calibrate --device cuda` as the code stands now (the per-op dispatch microbenchmark had never run on a
#    GPU) -> $OUT/cal/host-gpu.toml, $OUT/calibrate.json;
# 3. benchmarks/gpu_optrace.py: ResNet-50 quantized 8/8 vs AMP vs FP32 and a quantized conv's exactness four ways
#    (issue 28); per-op GPU time of the held-out outliers and the LMs under AMP (issue 23) -> $OUT/trace-*.json.gz,
#    packed with cal/ into $OUT/pack.tgz at the end (the device tool returns at most 8 files).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu24}
mkdir -p "$OUT/cal"
PY=${PY:-python3}
. benchmarks/gpu_session_env.sh
echo "== 1/3 CUDA tests"
t0=$(date +%s)
timeout ${T_TESTS:-100} "$PY" -m pytest -q -m cuda tests/test_cuda.py -p no:cacheprovider 2>&1 | tail -15
echo "cuda tests in $(( $(date +%s) - t0 )) s"
echo "== 2/3 cptsim hw calibrate --device cuda"
t0=$(date +%s)
timeout ${T_CAL:-110} "$PY" -c 'import sys; from cptsim.cli.main import main; sys.argv[0] = "cptsim"; main()' \
    hw calibrate --device cuda --seconds 10 --out "$OUT/cal/host.toml" --json >"$OUT/calibrate.json" 2>"$OUT/calibrate.err"
echo "calibrate rc=$? in $(( $(date +%s) - t0 )) s"; tail -5 "$OUT/calibrate.err"; cat "$OUT/cal/host-gpu.toml" 2>/dev/null
echo "== 3/3 quantized ResNet-50 and per-op traces"
timeout ${T_TRACE:-230} "$PY" benchmarks/gpu_optrace.py --out "$OUT" --budget ${BUDGET:-215}
echo "gpu_optrace rc=$?"
# The device tool returns at most 8 files from $OUT: pack the traces and the calibrated profile into one archive
# (the first run of this script lost 7 traces and host-gpu.toml that way).
( cd "$OUT" && tar czf pack.tgz trace-*.json.gz cal 2>/dev/null && rm -rf trace-*.json.gz cal ) || true
ls "$OUT"

#!/usr/bin/env bash
# Issue 28's device check, prepared on a CPU-only session for the next one that is lent a GPU: one call, about 7
# minutes on an H100. Run from the repo root as
#   OUT=/some/dir bash benchmarks/gpu_session28.sh
# 1. the CUDA tests of the exact GEMM paths (pytest -m cuda tests/test_int_codes.py tests/test_format_scaled_mm.py
#    tests/test_cuda.py): the integer-codes path exact where TF32 fake-quant is not, and _scaled_mm's fp8 forward --
#    neither has run on a GPU yet;
# 2. benchmarks/gpu_optrace.py --sections quant: torchvision ResNet-50 at batch 128, AMP vs FP32 vs cptsim's
#    quantized 8/8 today (TF32 on, off) vs the integer-codes path (quant8_codes, CPTSIM_EXACT_GEMM=1), one conv's
#    exactness four ways, and a 1x1 conv's routes as a GEMM of the codes (FP16 with FP32 output via aten::mm.dtype,
#    int8) -> $OUT/quant-resnet50.json (acceptance: quantized <= 1.3x AMP and <= 0.8x today's);
# 3. benchmarks/bench_quant_step.py --models ... --device cuda: FP32, fake-quant, integer codes and AMP whole steps of
#    resnet20, transformer-lm, lstm-lm and gcn -> $OUT/paths-cuda.json.
# If the codes path measures no slower than today's on (2) and (3), flip its default on CUDA (exact_gemm.codes_on).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu28}
mkdir -p "$OUT"
PY=${PY:-python3}
. benchmarks/gpu_session_env.sh
echo "== 1/3 CUDA tests of the exact paths"
t0=$(date +%s)
timeout ${T_TESTS:-120} "$PY" -m pytest -q -m cuda tests/test_int_codes.py tests/test_format_scaled_mm.py \
    tests/test_cuda.py -p no:cacheprovider 2>&1 | tail -15
echo "cuda tests in $(( $(date +%s) - t0 )) s"
echo "== 2/3 quantized ResNet-50: today's path, the integer codes, AMP, FP32"
timeout ${T_QUANT:-200} "$PY" benchmarks/gpu_optrace.py --out "$OUT" --sections quant --budget ${BUDGET_QUANT:-190}
echo "gpu_optrace rc=$?"
echo "== 3/3 whole steps by GEMM path"
timeout ${T_PATHS:-150} "$PY" benchmarks/bench_quant_step.py --models resnet20 transformer-lm lstm-lm gcn \
    --rounds 7 --device cuda --json >"$OUT/paths-cuda.json" 2>"$OUT/paths-cuda.err"
echo "bench_quant_step rc=$?"; tail -3 "$OUT/paths-cuda.err"; head -c 3000 "$OUT/paths-cuda.json"
ls "$OUT"

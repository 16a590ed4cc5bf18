#!/usr/bin/env bash
# The prepared device call: the GPU measurements that no CPU machine can make, as named sections, run in the order
# given. Run from anywhere as
#   OUT=/some/dir bash benchmarks/gpu/session.sh SECTION...
#   bash benchmarks/gpu/session.sh --list          # the sections, what each measures and writes, its time limit
# A lent GPU is held for minutes, so each section runs under a time limit (the T_* variable --list names; the
# measuring scripts get a budget a little under it) and the call goes on to the next one whatever the last returned.
# Results land in $OUT, which the device tool brings back. On a bare GPU machine cptsim is installed in place without
# dependencies (else into /tmp/cptsim_site).
#
# The calls made so far, one line each (their output is in benchmarks/results/):
#   calibrate heldout             gpu-session-calibrate-heldout-H100.log, gpu-calibrate-H100*, gpu-heldout-H100-run*
#   cuda-tests calibrate optrace  gpu-optrace-H100/ (traces, calibrate.json, calibrated.toml, session.log)
#   never-seen                    gpu-optrace-H100/heldout3.json
#   cuda-tests quant paths        prepared, not run yet
#   gpu-train                     prepared, not run yet (quantized vs AMP steps, train vs its graph: < 8 min)
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-session}
PY=${PY:-python3}

# name|the variable that sets its time limit|the limit (s)|what it measures -> what it writes
SECTIONS=(
    "cuda-tests|T_TESTS|${T_TESTS:-120}|the CUDA tests (pytest -m cuda: tests/test_cuda.py, and the exact GEMM paths' tests/test_int_codes.py, tests/test_format_scaled_mm.py): the integer-codes path exact where TF32 fake-quant is not, _scaled_mm's fp8 forward -> the console"
    "calibrate|T_CAL|${T_CAL:-170}|cptsim hw calibrate --device cuda: the card's profile from microbenchmarks (GEMM tiers and grid, depthwise convolutions, stream, launch and per-op dispatch) -> \$OUT/cal/host-gpu.toml, \$OUT/calibrate.json (every record)"
    "heldout|T_HELDOUT|${T_HELDOUT:-300}|gpu_measure.py sections a,h,f,b: cptsim's graph / LM / CIFAR workloads and a ViT (step time, NVML joules per step), FP8/int8/FP16 GEMMs, and 12 timm networks nothing was fitted on (NCHW, then channels-last while time is left) -> \$OUT/heldout.json; benchmarks/bench_gpu_heldout.py prices it"
    "optrace|T_TRACE|${T_TRACE:-230}|gpu_optrace.py: per-op GPU time of the held-out outliers and the LMs under AMP (torch.profiler, shapes recorded), and ResNet-50 quantized 8/8 vs AMP vs FP32 with a quantized conv's exactness four ways -> \$OUT/trace-*.json.gz, \$OUT/quant-resnet50.json; the traces and cal/ packed into \$OUT/pack.tgz; benchmarks/gpu/bench_gpu_optrace.py prices them"
    "never-seen|T_MEASURE|${T_MEASURE:-210}|gpu_measure.py section b: timm networks no constant of the GPU model has seen (not fitted, not traced, not held out before) trained in AMP, NCHW then channels-last: the out-of-sample check of the NCHW batch-norm model -> \$OUT/heldout3.json; benchmarks/bench_gpu_heldout.py prices it"
    "quant|T_QUANT|${T_QUANT:-200}|gpu_optrace.py --sections quant: torchvision ResNet-50 at batch 128, AMP vs FP32 vs cptsim's quantized 8/8 (TF32 on, off) vs the integer-codes path (CPTSIM_EXACT_GEMM=1), one conv's exactness four ways, a 1x1 conv's routes as a GEMM of the codes -> \$OUT/quant-resnet50.json (acceptance: quantized <= 1.3x AMP and <= 0.8x the fake-quant path)"
    "gpu-train|T_GPU_TRAIN|${T_GPU_TRAIN:-450}|every CUDA test (pytest -m cuda tests/, at most T_GPU_TESTS=${T_GPU_TESTS:-150} s), then bench_gpu_train.py: whole steps of ResNet-50 b128, resnet20, transformer-lm, lstm-lm, gcn under AMP, FP32 and each quantized route (fake-quant with Triton / torch.compile / eager quantizers, integer codes, int8 tensor cores), and cptsim train's resnet20 step against its CUDA graph's replay -> \$OUT/cuda-tests-all.txt, \$OUT/gpu-train.json (written after every model; its table: bench_gpu_train.py --from-json FILE), \$OUT/gpu-train.txt, .err"
    "paths|T_PATHS|${T_PATHS:-150}|bench_quant_step.py --device cuda: whole training steps of resnet20, transformer-lm, lstm-lm and gcn by GEMM path (FP32, fake-quant, integer codes, AMP) -> \$OUT/paths-cuda.json. If the codes path is no slower than fake-quant here and in quant, flip its CUDA default (exact_gemm.codes_on)"
)
# the timm networks of never-seen: none in the fit, traced, or an earlier held-out set
NEVER_SEEN=${MODELS:-resnet34:512,regnety_040:384,hrnet_w32:256,ghostnet_100:512,dla60:384,rexnet_100:384,efficientnet_b2:256,mnasnet_100:512,dla34:512,regnetx_016:512,hrnet_w18_small:512,spnasnet_100:512,cspresnet50:384,res2net50_26w_4s:384}

field() {  # field NAME INDEX: a section's name (0), limit variable (1), limit (2) or description (3); nothing if unknown
    local s f
    for s in "${SECTIONS[@]}"; do
        IFS='|' read -r -a f <<<"$s"
        if [ "${f[0]}" = "$1" ]; then echo "${f[$2]}"; return; fi
    done
}

list() {
    local s f
    for s in "${SECTIONS[@]}"; do
        IFS='|' read -r -a f <<<"$s"
        printf '%-11s %-9s %4s s  %s\n' "${f[0]}" "${f[1]}" "${f[2]}" "${f[3]}"
    done
}

if [ $# -eq 0 ] || [ "$1" = "--list" ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
    echo "usage: OUT=DIR bash benchmarks/gpu/session.sh SECTION...   (sections run in the order given)"
    list
    [ $# -eq 0 ] && exit 2
    exit 0
fi
for name in "$@"; do
    if [ -z "$(field "$name" 0)" ]; then
        echo "session.sh: unknown section '$name'; the sections:" >&2; list >&2; exit 2
    fi
done

mkdir -p "$OUT"
# cptsim importable in $PY, a throwaway CPTSIM_HOME, and one line saying what the machine is
export PYTHONUNBUFFERED=1 CPTSIM_HOME=$(mktemp -d)
if ! "$PY" -c 'import cptsim.cli.main' >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/pip.log" 2>&1 || {
        rm -rf /tmp/cptsim_site build
        "$PY" -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/cptsim_site . >>"$OUT/pip.log" 2>&1
        export PYTHONPATH=/tmp/cptsim_site${PYTHONPATH:+:$PYTHONPATH}; }
fi
"$PY" -c 'import cptsim.cli.main, torch; print("cptsim ok; torch", torch.__version__, torch.cuda.get_device_name())'
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader

run_section() {  # run_section NAME LIMIT
    case "$1" in
        cuda-tests)
            timeout "$2" "$PY" -m pytest -q -m cuda tests/test_int_codes.py tests/test_format_scaled_mm.py \
                tests/test_cuda.py -p no:cacheprovider 2>&1 | tail -15 ;;
        calibrate)
            mkdir -p "$OUT/cal"
            timeout "$2" "$PY" -c 'import sys; from cptsim.cli.main import main; sys.argv[0] = "cptsim"; main()' \
                hw calibrate --device cuda --seconds 10 --out "$OUT/cal/host.toml" --json \
                >"$OUT/calibrate.json" 2>"$OUT/calibrate.err"
            echo "calibrate rc=$?"; tail -5 "$OUT/calibrate.err"; cat "$OUT/cal/host-gpu.toml" 2>/dev/null ;;
        heldout)
            timeout "$2" "$PY" benchmarks/gpu/gpu_measure.py --out "$OUT/heldout.json" --budget $(( $2 - 30 )) \
                --sections a,h,f,b --models held-out --formats nchw,nhwc --no-flops
            echo "gpu_measure rc=$?" ;;
        optrace)
            timeout "$2" "$PY" benchmarks/gpu/gpu_optrace.py --out "$OUT" --budget $(( $2 - 15 ))
            echo "gpu_optrace rc=$?"
            # The device tool returns only a few files from $OUT: pack the traces and the calibrated profile into
            # one archive (a call that did not lost 7 traces and host-gpu.toml that way).
            ( cd "$OUT" && tar czf pack.tgz trace-*.json.gz cal 2>/dev/null && rm -rf trace-*.json.gz cal ) || true ;;
        never-seen)
            timeout "$2" "$PY" benchmarks/gpu/gpu_measure.py --out "$OUT/heldout3.json" --budget $(( $2 - 15 )) \
                --sections b --models "$NEVER_SEEN" --formats nchw,nhwc --no-flops --steps 6
            echo "gpu_measure rc=$?" ;;
        quant)
            timeout "$2" "$PY" benchmarks/gpu/gpu_optrace.py --out "$OUT" --sections quant --budget $(( $2 - 10 ))
            echo "gpu_optrace rc=$?" ;;
        gpu-train)
            local tt=${T_GPU_TESTS:-150}
            timeout "$tt" "$PY" -m pytest -q -m cuda tests/ -p no:cacheprovider >"$OUT/cuda-tests-all.txt" 2>&1
            echo "pytest -m cuda rc=$?"; tail -15 "$OUT/cuda-tests-all.txt"
            # what is left of the section's limit; no model starts in its last 120 s (a model's cases take ~that)
            local left=$(( $2 - tt - 10 ))
            timeout "$left" "$PY" benchmarks/bench_gpu_train.py --rounds 5 --budget $(( left - 120 )) \
                --out "$OUT/gpu-train.json" >"$OUT/gpu-train.txt" 2>"$OUT/gpu-train.err"
            echo "bench_gpu_train rc=$?"; tail -5 "$OUT/gpu-train.err"
            "$PY" benchmarks/bench_gpu_train.py --from-json "$OUT/gpu-train.json" 2>&1 | tail -40 ;;
        paths)
            timeout "$2" "$PY" benchmarks/bench_quant_step.py --models resnet20 transformer-lm lstm-lm gcn \
                --rounds 7 --device cuda --json >"$OUT/paths-cuda.json" 2>"$OUT/paths-cuda.err"
            echo "bench_quant_step rc=$?"; tail -3 "$OUT/paths-cuda.err"; head -c 3000 "$OUT/paths-cuda.json"; echo ;;
    esac
}

i=0
for name in "$@"; do
    i=$((i + 1))
    echo "== $i/$# $name (at most $(field "$name" 2) s)"
    t0=$(date +%s)
    run_section "$name" "$(field "$name" 2)"
    echo "$name in $(( $(date +%s) - t0 )) s"
done
ls "$OUT"

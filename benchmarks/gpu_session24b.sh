#!/usr/bin/env bash
# The fourth session's second device call (about 3 minutes): timm networks that no constant of the GPU model has
# seen -- not in the fit, not traced, not in the third session's held-out set -- trained in AMP on the lent GPU,
# NCHW first, then channels-last while time is left: the out-of-sample check of the NCHW batch-norm model fitted on
# the first call's traces. Run from the repo root as OUT=/some/dir bash benchmarks/gpu_session24b.sh; output
# $OUT/heldout3.json (gpu_measure.py's format); benchmarks/bench_gpu_heldout.py prices it.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu24b}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 CPTSIM_HOME=$(mktemp -d) PYTHONPATH=$(pwd)${PYTHONPATH:+:$PYTHONPATH}
MODELS=${MODELS:-resnet34:512,regnety_040:384,hrnet_w32:256,ghostnet_100:512,dla60:384,rexnet_100:384,efficientnet_b2:256,mnasnet_100:512,dla34:512,regnetx_016:512,hrnet_w18_small:512,spnasnet_100:512,cspresnet50:384,res2net50_26w_4s:384}
timeout ${T_MEASURE:-210} "$PY" benchmarks/gpu_measure.py --out "$OUT/heldout3.json" --budget ${BUDGET:-195} \
    --sections b --models "$MODELS" --formats nchw,nhwc --no-flops --steps 6
echo "gpu_measure rc=$?"

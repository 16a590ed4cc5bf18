#!/usr/bin/env bash
# The GPU check of issue 14 (see benchmarks/gpu_check.py): run from the repo root as `bash benchmarks/gpu_check.sh`.
# Uses .venv if it is there and sees a GPU, else the machine's python3 (which must hold torch), into which cptsim is
# installed in place (pip install --no-deps -e .). On a machine without CUDA it prints one line and exits 0.
# GPU_CHECK_ARGS passes options through (e.g. "--device cpu --quick" tests the plumbing on a CPU).
set -u
cd "$(dirname "$0")/.."

pick_python() {
    for py in .venv/bin/python python3; do
        if [ -x "$(command -v "$py")" ] && "$py" -c 'import torch' >/dev/null 2>&1; then
            echo "$py"; return
        fi
    done
}
PY=$(pick_python)
ARGS=${GPU_CHECK_ARGS:-}
if [ -z "$PY" ]; then
    echo "gpu_check: no python with torch found; nothing to check"; exit 0
fi
case " $ARGS " in
    *" --device cpu "*) ;;
    *)
        if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
            echo "gpu_check: no CUDA GPU on this machine (torch.cuda.is_available() is False); nothing to check"
            exit 0
        fi ;;
esac

# cptsim importable from this checkout? If not (a bare GPU machine), install it in place without dependencies.
if ! "$PY" -c 'import cptsim.cli.main, cptsim.planner' >/dev/null 2>&1 \
   || [ "$("$PY" -c 'import cptsim, os; print(os.path.realpath(os.path.dirname(cptsim.__file__)))' 2>/dev/null)" \
        != "$(realpath cptsim)" ]; then
    echo "installing cptsim from $(pwd) into $("$PY" -c 'import sys; print(sys.prefix)') (pip --no-deps -e .)"
    if ! "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e . >/tmp/gpu_check_pip.log 2>&1; then
        echo "pip install -e failed ($(tail -1 /tmp/gpu_check_pip.log)); trying a plain install into /tmp/cptsim_site"
        rm -rf /tmp/cptsim_site build
        "$PY" -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/cptsim_site . \
            >>/tmp/gpu_check_pip.log 2>&1 || { echo "pip install failed:"; tail -5 /tmp/gpu_check_pip.log; exit 1; }
        export PYTHONPATH=/tmp/cptsim_site${PYTHONPATH:+:$PYTHONPATH}
    fi
fi
export PYTHONUNBUFFERED=1 CPTSIM_HOME="${CPTSIM_HOME:-$(mktemp -d)}"
exec "$PY" benchmarks/gpu_check.py $ARGS

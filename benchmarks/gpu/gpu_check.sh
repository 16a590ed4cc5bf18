#!/usr/bin/env bash
# The GPU acceptance check (see benchmarks/gpu/gpu_check.py): run from anywhere as `bash benchmarks/gpu/gpu_check.sh`.
#
# Which python: the project's environment, found or built the way `make` builds it --
#   1. $GPU_CHECK_VENV (default .venv) if its python holds torch;
#   2. else the machine's python3 if it holds torch (a bare GPU machine, often without network: nothing to build),
#      with cptsim installed into it in place (pip install --no-deps -e .);
#   3. else the environment is built as `make test` builds it: `make .venv/.installed` (the Makefile's STAMP
#      target: python3 -m venv, pip install -e '.[test]'), and its python is used.
# On a machine without CUDA it then prints "no CUDA device: nothing to check" and exits 0.
# GPU_CHECK_ARGS passes options through (e.g. "--device cpu --quick" tests the plumbing on a CPU).
set -u
cd "$(dirname "$0")/../.."
VENV=${GPU_CHECK_VENV:-.venv}
ARGS=${GPU_CHECK_ARGS:-}

has_torch() {  # has_torch PYTHON: it runs and imports torch
    [ -n "$1" ] && [ -x "$(command -v "$1")" ] && "$1" -c 'import torch' >/dev/null 2>&1
}

find_python() {  # prints the python to use, or nothing; notes go to stderr
    if has_torch "$VENV/bin/python"; then
        echo "$VENV/bin/python"; return
    fi
    if has_torch python3; then
        echo python3; return
    fi
    if ! command -v make >/dev/null 2>&1; then
        echo "gpu_check: no $VENV, no python3 with torch, and no make to build $VENV (see the Makefile)" >&2
        return
    fi
    echo "gpu_check: no python with torch found; building the project's environment as make does:" \
         "make $VENV/.installed" >&2
    if make VENV="$VENV" "$VENV/.installed" >&2 && has_torch "$VENV/bin/python"; then
        echo "$VENV/bin/python"; return
    fi
    echo "gpu_check: building $VENV failed (make $VENV/.installed, above)" >&2
}

PY=$(find_python)
if [ -z "$PY" ]; then
    echo "gpu_check: no python with torch; nothing checked"; exit 1
fi
case " $ARGS " in
    *" --device cpu "*) ;;
    *)
        if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
            echo "gpu_check: no CUDA device: nothing to check (torch.cuda.is_available() is False in $PY)"
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
exec "$PY" benchmarks/gpu/gpu_check.py $ARGS

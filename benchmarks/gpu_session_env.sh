# Sourced by the prepared device calls (gpu_session23.sh, gpu_session24.sh) after they set OUT and PY and cd to the
# repo root: cptsim importable in $PY (installed in place without dependencies on a bare GPU machine, else into
# /tmp/cptsim_site), a throwaway CPTSIM_HOME, and one line saying what the machine is.
export PYTHONUNBUFFERED=1 CPTSIM_HOME=$(mktemp -d)
if ! "$PY" -c 'import cptsim.cli.main' >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/pip.log" 2>&1 || {
        rm -rf /tmp/cptsim_site build
        "$PY" -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/cptsim_site . >>"$OUT/pip.log" 2>&1
        export PYTHONPATH=/tmp/cptsim_site${PYTHONPATH:+:$PYTHONPATH}; }
fi
"$PY" -c 'import cptsim.cli.main, torch; print("cptsim ok; torch", torch.__version__, torch.cuda.get_device_name())'
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader

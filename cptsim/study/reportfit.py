"""``cptsim report --fit``: the host profile's calibration factors fitted to the measured step times of runs, and how
well the fit predicts what it was not fitted on (held-out runs, and each fitted run left out in turn). The fit
itself is ``cptsim.calibration.fit``'s; this module picks the runs and checks the result."""

from __future__ import annotations

from cptsim.errors import InputError


def fit_runs(run_dirs, holdout, host: str, fit_out, force: bool = False) -> dict:
    """Fit ``host`` to ``run_dirs``, write the fitted profile to ``fit_out`` (``force``: over an existing file) and
    return the fit's document with "holdout", "leave_one_out" (two or more runs) and "written". CUDA runs fit a GPU
    profile instead (``fit_gpu_runs``); CPU and CUDA runs are never fitted together."""
    from cptsim.calibration.fit import RunSteps, fit_host, host_profile, run_device, write_fitted_profile
    from cptsim.run.rundir import RunDir

    cuda = {str(d): run_device(RunDir.open(d)).startswith("cuda") for d in [*run_dirs, *holdout]}
    if any(cuda.values()):
        if not all(cuda.values()):
            raise InputError("--fit got CUDA runs and CPU runs together ("
                             + ", ".join(f"{d}: {'cuda' if c else 'cpu'}" for d, c in cuda.items())
                             + "): a GPU profile is fitted to CUDA runs, a host profile to CPU runs -- fit them apart")
        return fit_gpu_runs(run_dirs, holdout, host, fit_out, force)
    base = host_profile(host)
    fitted = [RunSteps.from_run(RunDir.open(d), base) for d in run_dirs]
    held = [RunSteps.from_run(RunDir.open(d), base) for d in holdout]
    result = fit_host(fitted, base)
    path, prof = write_fitted_profile(result, fit_out, force=force)
    doc = result.to_json()
    doc["holdout"] = [result.evaluate(h) for h in held]
    if len(fitted) > 1:  # leave one run out: fit on the others, predict it
        doc["leave_one_out"] = [fit_host([f for f in fitted if f is not r], base).evaluate(r) for r in fitted]
    doc["written"] = {"path": str(path), "name": prof.name, "hash": prof.content_hash}
    return doc


def fit_gpu_runs(run_dirs, holdout, host: str, fit_out, force: bool = False) -> dict:
    """``fit_runs`` for CUDA runs: the GPU profile that models them (``--host``, else the one their config.json
    names -- the same for every run) fitted to their steady steps (``cptsim.calibration.gpu_runfit``), written to
    ``fit_out``, and the held-out runs priced with it."""
    from cptsim.calibration.gpu_runfit import GPURunSteps, fit_gpu, gpu_profile, write_fitted_gpu_profile
    from cptsim.run.rundir import RunDir

    from .reportgpu import gpu_profile_for_run

    bases = {}
    for d in run_dirs:
        run = RunDir.open(d)
        prof, _, _ = gpu_profile_for_run(run.read_config(), host, run.path)
        bases[(prof.name, prof.content_hash)] = prof
    if len(bases) > 1:
        raise InputError("--fit: the runs ran on GPUs different profiles describe ("
                         + ", ".join(n for n, _ in bases) + "); fit one GPU's runs at a time, or name one with --host")
    base = gpu_profile(next(iter(bases.values())))
    fitted = [GPURunSteps.from_run(RunDir.open(d)) for d in run_dirs]
    held = [GPURunSteps.from_run(RunDir.open(d)) for d in holdout]
    result = fit_gpu(fitted, base)
    path, prof = write_fitted_gpu_profile(result, fit_out, force=force)
    doc = result.to_json()
    doc["holdout"] = [result.evaluate(h) for h in held]
    if len(fitted) > 1:
        doc["leave_one_out"] = [fit_gpu([f for f in fitted if f is not r], base).evaluate(r) for r in fitted]
    doc["written"] = {"path": str(path), "name": prof.name, "hash": prof.content_hash}
    return doc

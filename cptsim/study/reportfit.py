"""``cptsim report --fit``: the host profile's calibration factors fitted to the measured step times of runs, and how
well the fit predicts what it was not fitted on (held-out runs, and each fitted run left out in turn). The fit
itself is ``cptsim.calibration.fit``'s; this module picks the runs and checks the result."""

from __future__ import annotations


def fit_runs(run_dirs, holdout, host: str, fit_out, force: bool = False) -> dict:
    """Fit ``host`` to ``run_dirs``, write the fitted profile to ``fit_out`` (``force``: over an existing file) and
    return the fit's document with "holdout", "leave_one_out" (two or more runs) and "written"."""
    from cptsim.calibration.fit import RunSteps, fit_host, host_profile, write_fitted_profile
    from cptsim.run.rundir import RunDir

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

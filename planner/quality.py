"""What the planner ranks candidates by: the documented proxy score, or a model fitted to measured runs.

``--quality proxy`` (default) ranks by ``cptsim.planner.score`` (early-weighted fidelity). ``--quality db`` ranks by
a model of *measured* final accuracy, fitted to the results database (``cptsim.study.results``: rows written by
``cptsim sweep`` and by pilots) for the very same workload (same workload key: model, data, size, batch, steps,
optimiser). The model, ``monotone-linear/1``::

    acc_hat(s) = a + b1 * z(score(s)) + b2 * z(mean_bits(s)) + b3 * z(cost_rel(s)),   b1, b2, b3 >= 0

z standardises each feature over the measured schedules. The signs are what is known, not fitted freely: accuracy
does not fall when a schedule's proxy score, its mean bits, or its cost rise (quality tracks cost; early precision
matters). The coefficients come from non-negative least squares (scipy.optimize.nnls) on the per-schedule mean
accuracy; the uncertainty of a prediction is the standard deviation over B = 200 bootstrap refits that resample
measured schedules (with all their seeds), plus the seed-to-seed spread measured within schedules, added in
quadrature. With fewer than ``MIN_SCHEDULES`` distinct measured schedules the model is not trusted and the planner
falls back to the proxy, and says so.

Why these features and not more: a few dozen runs is what a user has; three sign-constrained coefficients cannot
chase seed noise far, and all three features exist for every candidate without materialising its bits (the fast
path of ``evaluate`` computes them), so the model ranks the whole space as fast as the proxy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["QUALITY_MODEL", "MIN_SCHEDULES", "QualityModel", "fit_quality", "features", "load_measurements"]

QUALITY_MODEL = "monotone-linear/1"
MIN_SCHEDULES = 5
FEATURE_NAMES = ("score", "mean_bits", "cost_rel")
BOOTSTRAP = 200


def features(score, mean_bits, cost_rel) -> np.ndarray:
    """(n, 3) feature matrix, columns in ``FEATURE_NAMES`` order."""
    return np.column_stack([np.asarray(score, float), np.asarray(mean_bits, float), np.asarray(cost_rel, float)])


def _nnls_fit(X: np.ndarray, y: np.ndarray, mu: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """[a, b1..bk] minimising ||a + Z b - y|| with b >= 0 (a free: centred y takes it out of the constraint)."""
    from scipy.optimize import nnls

    Z = (X - mu) / sd
    yc = y - y.mean()
    zc = Z - Z.mean(axis=0)
    b, _ = nnls(zc, yc)
    a = y.mean() - Z.mean(axis=0) @ b
    return np.concatenate(([a], b))


@dataclass
class QualityModel:
    """A fitted ``monotone-linear/1`` model; ``predict`` gives (mean, std) of final accuracy for features X."""

    coef: np.ndarray               # [a, b_score, b_mean_bits, b_cost_rel] on standardised features
    mu: np.ndarray
    sd: np.ndarray
    boot: np.ndarray               # (B, 4) bootstrap coefficients
    seed_sd: float                 # pooled within-schedule std of accuracy over seeds
    n_runs: int
    n_schedules: int
    schedules: list[str]
    loo_spearman: float | None     # leave-one-schedule-out rank correlation of prediction and measurement

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        Z = (np.asarray(X, float) - self.mu) / self.sd
        mean = self.coef[0] + Z @ self.coef[1:]
        boots = self.boot[:, :1] + self.boot[:, 1:] @ Z.T  # (B, n)
        std = np.sqrt(boots.std(axis=0) ** 2 + self.seed_sd ** 2)
        return mean, std

    def to_json(self) -> dict:
        return {"name": QUALITY_MODEL, "features": list(FEATURE_NAMES), "intercept": float(self.coef[0]),
                "coefficients": dict(zip(FEATURE_NAMES, map(float, self.coef[1:]))),
                "feature_mean": dict(zip(FEATURE_NAMES, map(float, self.mu))),
                "feature_std": dict(zip(FEATURE_NAMES, map(float, self.sd))),
                "seed_std": self.seed_sd, "runs": self.n_runs, "schedules": self.n_schedules,
                "loo_spearman": self.loo_spearman}


def fit_quality(schedules: list[str], X: np.ndarray, acc: np.ndarray, rng_seed: int = 0) -> QualityModel | None:
    """Fit on measured runs: ``schedules[i]`` trained to accuracy ``acc[i]``, features ``X[i]`` (one row per run;
    seeds of one schedule share a schedule text). None when fewer than MIN_SCHEDULES distinct schedules."""
    X, acc = np.asarray(X, float), np.asarray(acc, float)
    names = sorted(set(schedules))
    if len(names) < MIN_SCHEDULES:
        return None
    idx = {n: [i for i, s in enumerate(schedules) if s == n] for n in names}
    Xs = np.array([X[idx[n][0]] for n in names])
    ys = np.array([acc[idx[n]].mean() for n in names])
    resid = np.concatenate([acc[idx[n]] - acc[idx[n]].mean() for n in names])
    dof = len(acc) - len(names)
    seed_sd = float(np.sqrt((resid ** 2).sum() / dof)) if dof > 0 else 0.0
    mu, sd = Xs.mean(axis=0), Xs.std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)  # a constant feature (e.g. every schedule at one cost) carries no information
    coef = _nnls_fit(Xs, ys, mu, sd)
    rng = np.random.default_rng(rng_seed)
    boot = np.empty((BOOTSTRAP, coef.size))
    for b in range(BOOTSTRAP):
        pick = rng.integers(0, len(names), len(names))
        boot[b] = _nnls_fit(Xs[pick], ys[pick], mu, sd)
    loo = None
    if len(names) >= 4:
        from scipy.stats import spearmanr

        pred = np.empty(len(names))
        for i in range(len(names)):
            keep = np.arange(len(names)) != i
            c = _nnls_fit(Xs[keep], ys[keep], mu, sd)
            pred[i] = c[0] + ((Xs[i] - mu) / sd) @ c[1:]
        rho = spearmanr(pred, ys)[0]
        loo = None if not np.isfinite(rho) else float(rho)
    return QualityModel(coef=coef, mu=mu, sd=sd, boot=boot, seed_sd=seed_sd, n_runs=len(acc),
                        n_schedules=len(names), schedules=names, loo_spearman=loo)


def load_measurements(workload, db=None, evidence=None) -> tuple[list[str], list[float], str, str]:
    """(schedule texts, measured test accuracies, workload key, database path) of the database's runs of
    ``workload`` (a planner Workload) that ran its full length; ``evidence`` reads the database
    (``cptsim.planner.evidence``)."""
    from .evidence import need_evidence

    rows, key, path = need_evidence(evidence, "--quality db").measurements(workload.to_json(), db)
    rows = [r for r in rows if r.get("test_acc") is not None]
    return [r["schedule"] for r in rows], [float(r["test_acc"]) for r in rows], key, path

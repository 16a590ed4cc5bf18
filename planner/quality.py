"""What the planner ranks candidates by: the documented proxy score, or a model fitted to measured runs.

``--quality proxy`` (default) ranks by ``cptsim.planner.score`` (early-weighted fidelity). ``--quality db`` ranks by
a model of *measured* final quality, fitted to the results database (``cptsim.study.results``: rows written by
``cptsim sweep`` and by pilots) for the very same workload as a sweep trains it (``measured_workload``: the same
model, data, batch, optimiser and length, with the default validation split held out of the training data). The
measure is the one decisions may see: **validation** accuracy (for a language model, minus its per-token
validation loss, i.e. log perplexity), never the test split -- choosing by test accuracy would report a test
accuracy biased upward by the choice. Runs that recorded no validation measure (swept with ``--val-split 0``, or
before sweeps held one out) are left out, and the plan counts them. The model, ``monotone-linear/1``::

    acc_hat(s) = a + b1 * z(score(s)) + b2 * z(mean_bits(s)) + b3 * z(cost_rel(s)),   b1, b2, b3 >= 0

z standardises each feature over the measured schedules. The signs are what is known, not fitted freely: accuracy
does not fall when a schedule's proxy score, its mean bits, or its cost rise (quality tracks cost; early precision
matters). The coefficients come from non-negative least squares (scipy.optimize.nnls) on the per-schedule mean
accuracy; the uncertainty of a prediction is the standard deviation over B = 200 bootstrap refits that resample
measured schedules (with all their seeds), plus the seed-to-seed spread measured within schedules, added in
quadrature. With fewer than ``MIN_SCHEDULES`` distinct measured schedules the model is not trusted and the planner
falls back to the proxy, and says so.

The model does not extrapolate. It is trusted only inside the range its features were measured over (per feature,
from the lowest to the highest value among the measured schedules: ``QualityModel.in_range``). Outside it a linear
fit says nothing -- fitted to issue 9's runs, whose mean bits span 2.99-3.01 and relative cost 0.30-0.31, it
"predicted" static:8 at 0.9998 +- 0.676, and 8% of its bootstrap refits gave the near-constant cost a positive
weight, which would rank "most expensive within budget" first. So a candidate outside the range gets no prediction and
keeps the place the proxy score gives it: the planner takes the proxy's ranking and lets the model re-order only
the candidates inside the range, among the places they hold. The plan marks the others ``extrapolated``, says how
many there were (and when the chosen one is among them); when no candidate within budget is inside, the plan is
ranked by the proxy altogether and says why.

Why these features and not more: a few dozen runs is what a user has; three sign-constrained coefficients cannot
chase seed noise far, and all three features exist for every candidate without materialising its bits (the fast
path of ``evaluate`` computes them), so the model ranks the whole space as fast as the proxy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["QUALITY_MODEL", "MIN_SCHEDULES", "QualityModel", "Measurements", "fit_quality", "features",
           "load_measurements", "measured_workload"]

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
    lo: np.ndarray | None = None   # per feature: the lowest and highest value among the measured schedules
    hi: np.ndarray | None = None

    def in_range(self, X: np.ndarray) -> np.ndarray:
        """Which rows of X lie inside the measured range of every feature (the model is trusted there only;
        a relative 1e-9 of slack for rounding: the same schedule's features computed twice agree to ~1e-15)."""
        X = np.atleast_2d(np.asarray(X, float))
        if self.lo is None or self.hi is None:
            return np.ones(len(X), bool)
        tol = 1e-9 * np.maximum(1.0, np.maximum(np.abs(self.lo), np.abs(self.hi)))
        return np.all((X >= self.lo - tol) & (X <= self.hi + tol), axis=1)

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
                "loo_spearman": self.loo_spearman,
                "feature_range": None if self.lo is None else
                {n: [float(a), float(b)] for n, a, b in zip(FEATURE_NAMES, self.lo, self.hi)}}


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
                        n_schedules=len(names), schedules=names, loo_spearman=loo, lo=Xs.min(axis=0),
                        hi=Xs.max(axis=0))


@dataclass
class Measurements:
    """What ``--quality db`` fits to: per measured run its schedule and its validation measure (``values``, higher
    is better: validation accuracy, or minus the per-token validation loss of a language model)."""

    schedules: list[str]
    values: list[float]
    measure: dict              # {"key", "name", "higher_is_better"} of the measure as reported
    workload_key: str          # the key the runs were looked up by (the workload as a sweep trains it)
    db: str
    without_validation: int    # finished runs of that key with no validation measure (test split only): not used


def measured_workload(workload) -> dict:
    """The workload's settings as ``cptsim sweep`` trains it (``workload.to_json()`` form): with the default
    validation split held out of the training data (``cptsim.run.config.VAL_SPLIT``), so the run sees
    N - held_out(N) samples per epoch, and an epoch-counted run has that many fewer steps. A text dataset has its
    own validation split: nothing is held out, the workload is the plan's."""
    from cptsim.run.config import VAL_SPLIT, held_out

    d = dict(workload.to_json())
    n = d.get("dataset_size")
    if _is_text(workload.dataset) or not n:
        return d
    n_train = int(n) - held_out(int(n), VAL_SPLIT)
    d["dataset_size"] = n_train
    if d.get("epochs") is not None:  # epochs x steps per epoch of the part trained on (cptsim.run.train.build)
        d["steps"] = int(d["epochs"]) * -(-n_train // int(d["batch_size"]))
    return d


def _is_text(dataset: str) -> bool:
    from cptsim.data.text import TEXT_DATASETS

    return dataset in TEXT_DATASETS


def load_measurements(workload, db=None, evidence=None) -> Measurements:
    """The database's finished runs of ``workload`` (a planner Workload) as a sweep trains it
    (``measured_workload``: a validation split held out) and their validation measure: validation accuracy, or
    for a language model its per-token validation loss (log perplexity; fitted as minus the loss, so that higher
    is better throughout). The test split is never read: a run that recorded no validation measure is counted in
    ``without_validation`` and left out. ``evidence`` reads the database (``cptsim.planner.evidence``)."""
    from .evidence import need_evidence

    rows, key, path = need_evidence(evidence, "--quality db").measurements(measured_workload(workload), db)
    # a per-layer run (issue 27) is not a run of its global schedule: the uniform model cannot take it
    rows = uniform_rows(rows)
    if _is_text(workload.dataset):
        measure = {"key": "val_loss", "name": "validation loss per token (log perplexity)",
                   "higher_is_better": False}
        vals = [(r, _val_loss(r)) for r in rows]
        used = [(r["schedule"], -v) for r, v in vals if v is not None]
    else:
        measure = {"key": "val_acc", "name": "validation accuracy", "higher_is_better": True}
        used = [(r["schedule"], float(r["val_acc"])) for r in rows if _finite(r.get("val_acc"))]
    return Measurements(schedules=[s for s, _ in used], values=[v for _, v in used], measure=measure,
                        workload_key=key, db=path, without_validation=len(rows) - len(used))


def uniform_rows(rows: list[dict]) -> list[dict]:
    """The rows of runs whose every quantized layer followed the row's schedule (not a per-layer plan, whose rules
    the row's ``extra["layers"]`` holds)."""
    return [r for r in rows if not (r.get("extra") or {}).get("layers")]


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)


def _val_loss(row: dict) -> float | None:
    v = row.get("val_loss")
    if not _finite(v):
        v = (row.get("extra") or {}).get("val_loss")  # rows written before the column existed
    return float(v) if _finite(v) else None

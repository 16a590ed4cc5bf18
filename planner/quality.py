"""What the planner ranks candidates by: the documented proxy score, or a model fitted to measured runs.

``--quality proxy`` (default) ranks by ``cptsim.planner.score`` (early-weighted fidelity). ``--quality db`` ranks by
a model of *measured* final quality, fitted to the results database (``cptsim.study.results``: rows written by
``cptsim sweep`` and by pilots) for the very same workload as a sweep trains it (``measured_workload``: the same
model, data, batch, optimiser and length, with the default validation split held out of the training data). The
measure is the one decisions may see: **validation** accuracy (for a language model, minus its per-token
validation loss, i.e. log perplexity), never the test split -- choosing by test accuracy would report a test
accuracy biased upward by the choice. Runs that recorded no validation measure (swept with ``--val-split 0``, or
before sweeps held one out) are left out, and the plan counts them. The model, ``monotone-linear/2``::

    acc_hat(s) = a + b1 z(score(s)) + b2 z(mean_bits(s)) + b3 z(cost_rel(s)) + b4 z(above_floor(s)),   b1..b4 >= 0

z standardises each feature over the measured schedules. The signs are what is known, not fitted freely: accuracy
does not fall when a schedule's proxy score, its mean bits, its cost, or the share of its work above the lowest
width rise (quality tracks cost; early precision matters; a width too low is a cliff, not a slope).

The features, of a uniform schedule and of a per-layer plan alike, on one scale: a per-layer plan is a
set of quantized layers l, each with its own forward bits q_l(t) (``cptsim.cost.layerplan``; a uniform schedule
gives every layer the same), weighted by the layer's share m_l of the quantized layers' forward MACs per sample:

* ``score``: sum_l m_l score(q_l, g) -- the proxy score of each layer's bits (``planner.score``), MAC-weighted;
* ``mean_bits``: sum_l m_l mean_t q_l(t);
* ``cost_rel``: the plan's BitOPs (``cptsim.cost.estimate``, each layer at its own bits) over the baseline's;
* ``above_floor``: sum_l m_l #{t : q_l(t) > floor} / T, the share of the forward work done above ``floor``, the
  lowest forward width any measured run of the workload used (``QualityModel.floor``). It is there for the cliff
  the other three are too smooth to see: on digits at 2-4 bits, 2 bits costs 6 points and 3 bits almost nothing
  (benchmarks/results/perlayer-evidence.txt), so what matters is how much of the work sits at 2 bits, not the mean.
  Monotone: more work at the floor never makes a run better. 1.0 for every schedule that never reaches the floor.
  Measured on those digits runs (benchmarks/bench_perlayer_quality.py) it barely moves the leave-one-schedule-out
  rank correlation: 0.77 with it against 0.78 without (MAC weights), 0.87 against 0.84 (sensitivity weights). It
  stays because it is monotone and free, not because it was shown to matter.

With a per-layer sensitivity measurement (``plan --per-layer --sensitivity``) the refinement refits the model
with the layers weighted by their sensitivity instead of their MACs (the weights the MILP maximises), so a plan that
raises the sensitive layers and lowers the rest reads as the better plan it is: on the transformer-lm runs of
benchmarks/results/perlayer-evidence-lm.txt the leave-one-schedule-out rank correlation is 0.88 with loss-sensitivity
weights against 0.15 with MAC weights (the output head holds ~5% of the MACs and half the sensitivity).

For a uniform schedule each equals the schedule's own figure (score_bits of its bits, their mean, its BitOPs), so a
per-layer run is fitted and predicted with the uniform ones: ``--quality db`` learns from measured per-layer runs
(the row's ``extra["layers"]`` rules, resolved again on the workload's model: ``plan_features``), and the per-layer
refinement (``planner.perlayer.refine``) ranks its plans by the model's prediction where they lie inside the
measured range. The coefficients come from non-negative least squares (scipy.optimize.nnls) on the per-schedule mean
accuracy; the uncertainty of a prediction is the standard deviation over B = 200 bootstrap refits that resample
measured schedules (with all their seeds), plus the seed-to-seed spread measured within schedules, added in
quadrature. With fewer than ``MIN_SCHEDULES`` distinct measured schedules the model is not trusted and the planner
falls back to the proxy, and says so.

The model does not extrapolate. It is trusted only inside the range its features were measured over (per feature,
from the lowest to the highest value among the measured schedules: ``QualityModel.in_range``). Outside it a linear
fit says nothing -- fitted to the quality check's digits-cnn runs at 2-4 bits, whose mean bits span 2.99-3.01 and
relative cost 0.30-0.31, it "predicted" static:8 at 0.9998 +- 0.676, and 8% of its bootstrap refits gave the
near-constant cost a positive weight, which would rank "most expensive within budget" first. So a candidate outside
the range gets no prediction and keeps the place the proxy score gives it: the planner takes the proxy's ranking and
lets the model re-order only the candidates inside the range, among the places they hold. The plan marks the others
``extrapolated``, says how many there were (and when the chosen one is among them); when no candidate within budget
is inside, the plan is ranked by the proxy altogether and says why.

Why these features and not more: a few dozen runs is what a user has; four sign-constrained coefficients cannot
chase seed noise far, and all four exist for every candidate without materialising its bits (the fast path of
``evaluate`` computes the first three; ``above_floor`` is a sum over the step counts it keeps,
``Candidates.steps_log``), so the model ranks the whole space as fast as the proxy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["QUALITY_MODEL", "MIN_SCHEDULES", "QualityModel", "Measurements", "fit_quality", "features",
           "load_measurements", "measured_workload", "PlanBits", "plan_bits", "measured_features"]

QUALITY_MODEL = "monotone-linear/2"
MIN_SCHEDULES = 5
FEATURE_NAMES = ("score", "mean_bits", "cost_rel", "above_floor")
BOOTSTRAP = 200


def features(score, mean_bits, cost_rel, above_floor=None) -> np.ndarray:
    """(n, k) feature matrix, columns in ``FEATURE_NAMES`` order (k = 3 without ``above_floor``)."""
    cols = [score, mean_bits, cost_rel] + ([] if above_floor is None else [above_floor])
    return np.column_stack([np.asarray(c, float) for c in cols])


@dataclass
class PlanBits:
    """A plan's forward bits per quantized layer over the workload's steps: what its features are computed from."""

    weight: np.ndarray   # (L,) each quantized layer's share of the quantized layers' forward MACs per sample
    bits: np.ndarray     # (L, T) forward bits per layer and step
    grad: np.ndarray     # (T,) gradient bits per step (global: gradient bits are not per layer)
    cost_rel: float      # BitOPs over the baseline's

    @property
    def lowest(self) -> int:
        return int(self.bits.min())

    def features(self, floor: int) -> tuple[float, float, float, float]:
        from .score import score_bits

        w = self.weight
        sc = np.atleast_1d(score_bits(self.bits, self.grad[None, :]))
        return (float(w @ sc), float(w @ self.bits.mean(axis=1)), float(self.cost_rel),
                float(w @ (self.bits > floor).mean(axis=1)))


def plan_bits(workload, schedule, layers=None, base_bitops: float | None = None, hardware=None,
              weights: dict | None = None) -> PlanBits:
    """The bits a plan runs on ``workload`` (a planner Workload): ``schedule`` on every quantized layer, or with
    ``layers`` (a ``cptsim.cost.layerplan.ResolvedLayers``, or the rules' text as a results row records it, resolved
    here on the workload's layers) each layer on its own schedule. ``cost_rel`` is the plan's BitOPs
    (``cptsim.cost.estimate``, per layer) over ``base_bitops`` (NaN without it). ``weights``: layer -> sensitivity
    (``cptsim sensitivity``): the layers are weighted by it (``perlayer.layer_weights``) instead of their MACs."""
    from cptsim.cost.layerplan import ResolvedLayers, parse_layer_text

    a = workload.profile.arrays()
    names = list(a.names)
    q = [i for i, x in enumerate(a.quantized) if x]
    qnames = [names[i] for i in q]
    if isinstance(layers, str):
        layers = parse_layer_text(layers).resolve(schedule, qnames, [n for n in names if n not in qnames],
                                                  workload.model) if layers.strip() else None
    if isinstance(layers, ResolvedLayers) and not layers.layers:
        layers = None
    T = workload.steps
    m = a.macs[q, 0]
    weight = m / m.sum() if m.sum() > 0 else np.full(len(q), 1.0 / max(len(q), 1))
    if weights:
        from .score import layer_weights

        weight = layer_weights(qnames, weights)
    if layers is None:
        bits = np.broadcast_to(schedule.bits(T), (len(q), T))
        est = workload.estimate(schedule, hardware) if base_bitops else None
    else:
        from cptsim.cost.model import estimate

        own = {}
        bits = np.array([own.setdefault(s, s.bits(T)) for s in (layers.schedule_of(n) for n in qnames)])
        est = estimate(workload.profile, schedule, hardware, steps=T, batch_size=workload.batch_size,
                       dataset_size=workload.dataset_size, layers=layers,
                       formats=getattr(workload, "formats", None)) if base_bitops else None
    cost_rel = float(est.bitops["total"]) / base_bitops if est is not None else float("nan")
    return PlanBits(weight=weight, bits=np.asarray(bits), grad=np.asarray(schedule.grad_bits(T)), cost_rel=cost_rel)


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
    floor: int | None = None       # above_floor's floor: the lowest forward width of any measured run
    measured: object = None        # the Measurements fitted (a refit with sensitivity weights reads them again)

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
        names = FEATURE_NAMES[:len(self.mu)]
        return {"name": QUALITY_MODEL, "features": list(names), "intercept": float(self.coef[0]),
                "coefficients": dict(zip(names, map(float, self.coef[1:]))),
                "feature_mean": dict(zip(names, map(float, self.mu))),
                "feature_std": dict(zip(names, map(float, self.sd))),
                "seed_std": self.seed_sd, "runs": self.n_runs, "schedules": self.n_schedules,
                "loo_spearman": self.loo_spearman, "floor_bits": self.floor,
                "feature_range": None if self.lo is None else
                {n: [float(a), float(b)] for n, a, b in zip(names, self.lo, self.hi)}}


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
    is better: validation accuracy, or minus the per-token validation loss of a language model). ``layers[i]``: the
    per-layer rules run i ran (the row's ``extra["layers"]``), or None for a uniform run; ``entries[i]`` names the
    run's plan: its schedule, ``SCHEDULE@RULES`` for a per-layer run (seeds of one plan share it)."""

    schedules: list[str]
    values: list[float]
    measure: dict              # {"key", "name", "higher_is_better"} of the measure as reported
    workload_key: str          # the key the runs were looked up by (the workload as a sweep trains it)
    db: str
    without_validation: int    # finished runs of that key with no validation measure (test split only): not used
    layers: list = None        # per run: the per-layer rules' text, or None

    def __post_init__(self):
        if self.layers is None:
            self.layers = [None] * len(self.schedules)

    @property
    def entries(self) -> list[str]:
        return [s if not lr else f"{s}@{lr}" for s, lr in zip(self.schedules, self.layers)]


def measured_workload(workload) -> dict:
    """The workload's settings as ``cptsim sweep`` trains it (``workload.to_json()`` form): with the default
    validation split held out of the training data (``cptsim.run.config.VAL_SPLIT``), so the run sees
    N - held_out(N) samples per epoch, and an epoch-counted run has that many fewer steps. A text dataset has its
    own validation split: nothing is held out, the workload is the plan's."""
    from cptsim.cost.runlength import RunLength
    from cptsim.run.config import VAL_SPLIT, held_out

    d = dict(workload.to_json())
    n = d.get("dataset_size")
    if _is_text(workload.dataset) or not n:
        return d
    n_train = int(n) - held_out(int(n), VAL_SPLIT)
    d["dataset_size"] = n_train
    if d.get("epochs") is not None:  # epochs x steps per epoch of the part trained on (cptsim.run.train.build)
        d["steps"] = RunLength(int(d["batch_size"]), n_train).epoch_steps(int(d["epochs"]))
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
    # a per-layer run keeps its rules: its features are its plan's, not its global schedule's
    if _is_text(workload.dataset):
        measure = {"key": "val_loss", "name": "validation loss per token (log perplexity)",
                   "higher_is_better": False}
        vals = [(r, _val_loss(r)) for r in rows]
        used = [(r, -v) for r, v in vals if v is not None]
    else:
        measure = {"key": "val_acc", "name": "validation accuracy", "higher_is_better": True}
        used = [(r, float(r["val_acc"])) for r in rows if _finite(r.get("val_acc"))]
    return Measurements(schedules=[r["schedule"] for r, _ in used], values=[v for _, v in used], measure=measure,
                        workload_key=key, db=path, without_validation=len(rows) - len(used),
                        layers=[_layers_text(r) for r, _ in used])


def _layers_text(row: dict) -> str | None:
    lr = (row.get("extra") or {}).get("layers")
    return lr if isinstance(lr, str) and lr.strip() else None


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)


def _val_loss(row: dict) -> float | None:
    v = row.get("val_loss")
    if not _finite(v):
        v = (row.get("extra") or {}).get("val_loss")  # rows written before the column existed
    return float(v) if _finite(v) else None


def measured_features(m: Measurements, workload, hardware, base_bitops: float, weights: dict | None = None):
    """The features of each measured run (rows of ``m``, in order) on the planner's ``workload``, the floor they
    share (the lowest forward width of any measured run), and the runs left out because their per-layer rules do
    not resolve on this workload's layers (InputError: e.g. a layer renamed since) as {entry: reason}. Returns
    (X (n, 4) with NaN rows for the left-out runs, floor, left_out)."""
    from cptsim.cost.schedules import parse_schedule
    from cptsim.errors import InputError

    bits: dict[str, PlanBits | None] = {}
    left_out: dict[str, str] = {}
    for e, s, lr in zip(m.entries, m.schedules, m.layers):
        if e in bits:
            continue
        try:
            bits[e] = plan_bits(workload, parse_schedule(s), lr, base_bitops, hardware, weights)
        except InputError as err:
            bits[e], left_out[e] = None, str(err)
    ok = [b for b in bits.values() if b is not None]
    floor = min(b.lowest for b in ok) if ok else None
    feats = {e: (b.features(floor) if b is not None else (np.nan,) * 4) for e, b in bits.items()}
    X = np.array([feats[e] for e in m.entries], dtype=float).reshape(-1, 4)
    return X, floor, left_out


def share_above(cands, floor: int | None) -> np.ndarray:
    """``above_floor`` of every uniform candidate: the share of its steps whose forward bits exceed ``floor``,
    summed over the step counts the fast path keeps (``Candidates.steps_log``: blocks of (candidates, q, g, steps,
    ragged steps)) -- no candidate's bits are materialised. 1.0 everywhere without a floor."""
    out = np.zeros(len(cands))
    if floor is None:
        return out + 1.0
    for idx, q, _g, n, _r in cands.steps_log:
        q, n = np.broadcast_arrays(np.asarray(q), np.asarray(n))
        out[np.asarray(idx)] += (n * (q > floor)).reshape(len(idx), -1).sum(axis=1)
    return out / cands.workload.steps

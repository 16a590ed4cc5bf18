"""Pilot runs: rank a few genuinely different candidates by real short training runs instead of the proxy score.

``pilot=K`` (``run_pilot``) is successive halving over real runs. The pool (``pilot_pool``) is not the top K by
score -- those are near-duplicates (one profile at several cycle counts) -- but the best candidate of each schedule
family in score order, always including the best static schedule and CPT's own schedule (cos-rep, 32 cycles or the
space's nearest) when they fit the budget, up to K. Round r trains every survivor from scratch for s_r steps with
the workload's settings and the candidate's schedule laid over those s_r steps, holding out a fixed
``PILOT_VAL_SPLIT`` of the *training* data as a validation split (the test split is never looked at), and ranks by
validation accuracy at q_max after BatchNorm re-estimation. The better half survives; s doubles; the last one
standing wins. A language model (a text dataset: it has its own validation split, nothing is held out) is
ranked by its validation perplexity instead - the per-token validation loss, lower is better - and a round
separates when the loss gap exceeds twice loss / sqrt(validation tokens) (the per-token loss's spread taken as its
mean; neighbouring tokens are correlated, so this is a lower bound on the error). Runs go to a temporary directory (or ``pilot_dir``), never to the user's runs, and each finished
pilot run is recorded in the results database (source "pilot").

How long is long enough: s_0 defaults to T/4 and at least two epochs of the training part -- measured on digits,
the old default (T/8 = 8 steps) left every pilot at 11-21%, chance level, so its ranking was noise. Each round
records whether it *separated* its candidates: the accuracy gap between the last kept and the first dropped
candidate against twice the binomial standard error of one validation accuracy, sqrt(p (1 - p) / n_val). A round
that did not separate says so in the plan's notes.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from cptsim.errors import InputError

from .evaluate import Candidates
from .evidence import Evidence, need_evidence

__all__ = ["run_pilot", "pilot_pool", "PILOT_VAL_SPLIT"]

# of the training data, held out by cptsim.run.train.validation_split (a fixed subset); the same fraction as
# cptsim.run.config.VAL_SPLIT, which sweeps hold out (not imported here: that module imports torch)
PILOT_VAL_SPLIT = 0.2


def pilot_pool(cands: Candidates, ranked: np.ndarray, k: int) -> list[int]:
    """Up to k genuinely different candidates from ``ranked`` (best first, all within budget): the best static
    schedule and CPT's schedule (cos-rep, the cycle count nearest 32) if within budget, then the best of each
    other schedule family, in ranking order."""
    ranked = [int(i) for i in ranked]
    if not ranked:
        return []
    pool: list[int] = [ranked[0]]
    statics = [i for i in ranked if cands.schedules[i].name == "static"]
    cpt = sorted((i for i in ranked if cands.schedules[i].name == "cos-rep"),
                 key=lambda i: (abs(math.log2(cands.schedules[i].cycles / 32)), ranked.index(i)))
    for extra in (statics[:1], cpt[:1]):
        for i in extra:
            if i not in pool and len(pool) < k:
                pool.append(i)
    families = {cands.schedules[i].name for i in pool}
    for i in ranked:
        if len(pool) >= k:
            break
        if cands.schedules[i].name not in families:
            pool.append(i)
            families.add(cands.schedules[i].name)
    for i in ranked:  # fewer families than k: fill with the next best
        if len(pool) >= k:
            break
        if i not in pool:
            pool.append(i)
    return sorted(pool, key=ranked.index)


def run_pilot(cands: Candidates, pool: list[int], pilot_steps: int | None, pilot_dir: str | None,
              device: str = "cpu", on_event: Callable[[dict], None] | None = None,
              db: str | None = None, evidence: Evidence | None = None) -> tuple[int, dict]:
    """Successive halving over real short training runs of the candidates ``pool`` (indices, best proxy first).

    Round r trains every survivor from scratch for s_r steps (s_0 = ``pilot_steps``, default ``default_steps``;
    doubled each round, at most T) and ranks them by validation accuracy (module docstring). The better half
    (ties: the better rank in ``pool``) survives; the last one standing wins. Returns (position in pool, record).
    ``evidence`` trains the runs and records them (``cptsim.planner.evidence``)."""
    from cptsim.run.config import TrainConfig

    evidence = need_evidence(evidence, "--pilot")

    w = cands.workload
    steps = default_steps(w) if pilot_steps is None else pilot_steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InputError(f"--pilot-steps must be a positive integer, got {pilot_steps!r}")
    steps = min(steps, w.steps)
    if pilot_dir is None:
        root, keep = Path(tempfile.mkdtemp(prefix="cptsim-pilot-")), False
    else:
        root, keep = Path(pilot_dir).expanduser(), True
        if root.exists() and not root.is_dir():
            raise InputError(f"--pilot-dir {root} exists and is not a directory")
        root.mkdir(parents=True, exist_ok=True)
    alive = list(range(len(pool)))
    rounds = []
    lm = is_text(w)
    try:
        r = 0
        while len(alive) > 1:
            runs = []
            for pos in alive:
                s = cands.schedules[pool[pos]]
                cfg = TrainConfig(model=w.model, dataset=w.dataset, data_dir=w.data_dir, schedule=s.to_text(),
                                  steps=steps, batch_size=w.batch_size, lr=w.lr, momentum=w.momentum,
                                  weight_decay=w.weight_decay, lr_schedule=w.lr_schedule,
                                  fp_layers=list(w.fp_layers), seed=w.seed, device=device, augment=w.augment,
                                  val_split=PILOT_VAL_SPLIT, image_size=getattr(w, "image_size", None))
                out = root / f"round{r}-{pos:02d}-{s.name}"
                if on_event:
                    on_event({"event": "start", "round": r, "steps": steps, "schedule": s.to_text()})
                t0 = time.perf_counter()
                run = evidence.train(cfg, str(out))
                metrics = run.read_metrics().records
                last = metrics[-1] if metrics else {}
                acc = float(last.get("val_acc", float("nan")))
                n_val = run.read_config().get("val_size", 0)
                rec = {"schedule": s.to_text(), "proxy_rank": pos + 1, "proxy_score": float(cands.score[pool[pos]]),
                       "steps": steps, "val_acc": acc, "val_size": n_val, "eval_bits": s.q_max,
                       "train_loss": float(last["train_loss"]) if metrics else None,
                       "time_s": round(time.perf_counter() - t0, 3),
                       "run_dir": str(out) if keep else None}
                if lm:  # a language model: per-token validation loss and its perplexity (bits per character)
                    rec["val_loss"] = float(last.get("val_loss", float("nan")))
                    rec["val_ppl"] = float(last.get("val_ppl", float("nan")))
                    if "val_bpc" in last:
                        rec["val_bpc"] = float(last["val_bpc"])
                    rec["val_tokens"] = n_val * int(w.input_shape[0])
                _record(evidence, run, db, rec)
                runs.append((pos, rec))
                if on_event:
                    on_event({"event": "done", "round": r, **rec})
            order = sorted(runs, key=lambda pr: (_badness(pr[1], lm), pr[0]))
            n_keep = math.ceil(len(order) / 2)
            alive = sorted(pos for pos, _ in order[:n_keep])
            kept, dropped = order[n_keep - 1][1], order[n_keep][1]
            if lm:  # lower is better; the per-token loss's spread is taken as its mean (an exponential-like NLL)
                gap = dropped["val_loss"] - kept["val_loss"]
                p, n = kept["val_loss"], max(order[0][1]["val_tokens"], 1)
                se = p / math.sqrt(n) if math.isfinite(p) else float("nan")
            else:
                gap = kept["val_acc"] - dropped["val_acc"]
                p, n = kept["val_acc"], max(order[0][1]["val_size"], 1)
                se = math.sqrt(max(p * (1 - p), 1.0 / n) / n) if math.isfinite(p) else float("nan")
            rounds.append({"round": r, "steps": steps, "runs": [rec for _, rec in runs],
                           "kept": [cands.schedules[pool[p]].to_text() for p in alive],
                           "gap": gap, "two_se": 2 * se, "separated": bool(gap > 2 * se)})
            steps = min(steps * 2, w.steps)
            r += 1
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    winner = alive[0]
    doc = {"k": len(pool), "method": "successive halving",
           "measure": "validation perplexity (per-token loss, lower is better) at q_max after a short run (the text "
                      "dataset's own validation split; the test split is not used)" if lm else
                      f"validation accuracy at q_max after a short run ({PILOT_VAL_SPLIT:.0%} of the training data "
                      "held out; the test split is not used)",
           "pool": [cands.schedules[i].to_text() for i in pool],
           "separated": all(rd["separated"] for rd in rounds),
           "first_steps": rounds[0]["steps"] if rounds else 0, "rounds": rounds,
           "winner": cands.schedules[pool[winner]].to_text(), "dir": str(root) if keep else None}
    return winner, doc


def is_text(w) -> bool:
    """A language-model workload: a text dataset, which has its own validation split (nothing is held out)."""
    from cptsim.data.text import TEXT_DATASETS

    return w.dataset in TEXT_DATASETS


def _badness(rec: dict, lm: bool) -> float:
    """Sort key, best first: a language model's validation loss, else minus the validation accuracy; NaN last."""
    v = rec["val_loss"] if lm else -rec["val_acc"]
    return v if math.isfinite(v) else math.inf


def default_steps(w) -> int:
    """The first round's length: T/4 and at least two epochs of the training part (capped at T)."""
    n = w.dataset_size
    held = 0.0 if is_text(w) else PILOT_VAL_SPLIT  # text: the dataset's own validation split, nothing held out
    epoch = -(-int(n * (1 - held)) // w.batch_size) if n else 0
    return max(1, min(w.steps, max(w.steps // 4, 2 * epoch)))


def _record(evidence: Evidence, run, db, rec: dict) -> None:
    """Put a finished pilot run into the results database; a database that cannot be written costs a note,
    not the plan."""
    try:
        evidence.record(run, db)
    except Exception as e:  # noqa: BLE001 - the pilot's ranking does not depend on the database
        rec["db_error"] = f"{type(e).__name__}: {e}"

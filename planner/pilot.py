"""Pilot runs: rank a few genuinely different candidates by real short training runs instead of the proxy score.

``pilot=K`` (``run_pilot``) is successive halving over real runs. The pool (``pilot_pool``) is not the top K by
score -- those are near-duplicates (one profile at several cycle counts) -- but the best candidate of each schedule
family in score order, always including the best static schedule and CPT's own schedule (cos-rep, 32 cycles or the
space's nearest) when they fit the budget, up to K. Round r trains every survivor from scratch for s_r steps with
the workload's settings and the candidate's schedule laid over those s_r steps, holding out a fixed
``PILOT_VAL_SPLIT`` of the *training* data as a validation split (the test split is never looked at), and ranks by
validation accuracy at q_max after BatchNorm re-estimation. The better half survives; s doubles; the last one
standing wins. A language model (a text dataset: it has its own validation split, nothing is held out) is
ranked by its validation perplexity instead - the per-token validation loss, lower is better - and its rounds are
tested as described below. Runs go to a temporary directory (or ``pilot_dir``), never to the user's runs, and each finished
pilot run is recorded in the results database (source "pilot"). A ``pilot_dir`` may be reused: a finished run of the
same configuration there is taken as it is, anything else keeps its name and the new run gets a fresh one
(``_run_dir``).

How long is long enough: s_0 defaults to T/4 and at least two epochs of the training part -- measured on digits,
the old default (T/8 = 8 steps) left every pilot at 11-21%, chance level, so its ranking was noise. Each round
records whether it *separated* its candidates, by a paired test: the last kept and the first dropped candidate are
evaluated on the very same validation samples (each run records which it got right: ``val_correct`` in its
metrics.jsonl, a bitset), so what tells them apart is only the samples on which they disagree -- b that the kept
one got right and the dropped one wrong, c the other way round. McNemar's exact test: under "equally accurate"
b ~ Binomial(b + c, 1/2); the round separated when the two-sided p-value is below ``ALPHA`` (5%). (The unpaired
check it replaces, the gap against twice the standard error of *one* accuracy, called gaps of ~1.4 sigma
separated.) The round also says what it could resolve: with b + c disagreements, the smallest accuracy gap that
would have reached 5% (none below 6 disagreements). The test is about these two trained models on this split: each
candidate is one seed, so seed-to-seed spread is not in it. A round that did not separate says so in the plan's
notes.

A language model's round is paired too: each run records its validation loss per BPTT window (``val_window_loss``
in metrics.jsonl: the mean loss per token of each sequence of the validation split, in the order of the text), and
the round separated when the mean of the per-window differences, dropped minus kept (the loss gap), exceeds twice
its standard error. Neighbouring tokens are correlated (the same sentence, topic, state), so the error is not the
tokens' spread / sqrt(tokens): it is estimated by batch means over the windows (``window_se``), blocks of 1, 2, 4,
... windows, the largest estimate while at least ``MIN_BLOCKS`` blocks remain (Flyvbjerg & Petersen 1989: the
blocked estimate rises with the block until blocks outlast the correlation, then levels off). Pairing removes
what both candidates find hard in the same text. (The check it replaces, the gap against twice loss /
sqrt(tokens), took the loss as its own spread and the tokens as independent: with the tokens' correlation it
understated the error by sqrt((1 + rho) / (1 - rho)) for an AR(1) loss of lag-1 correlation rho, and called noise
separated. Runs without per-window losses, from an older cptsim, still get it, marked as a lower bound.)
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from cptsim.cost.runlength import RunLength
from cptsim.errors import InputError

from .evaluate import Candidates
from .evidence import Evidence, need_evidence

__all__ = ["run_pilot", "pilot_pool", "PILOT_VAL_SPLIT", "mcnemar", "resolvable_gap", "blocked_se", "window_se"]

# of the training data, held out by cptsim.run.train.validation_split (a fixed subset); the same fraction as
# cptsim.run.config.VAL_SPLIT, which sweeps hold out (not imported here: that module imports torch)
PILOT_VAL_SPLIT = 0.2
ALPHA = 0.05  # a round separated its candidates when McNemar's exact two-sided p-value is below this
MIN_BLOCKS = 32  # a language model's blocked standard error: blocks of 1, 2, 4, ... windows while this many remain
MAX_BLOCK_WINDOWS = 16  # and blocks of at most this many windows (560 words, 1024 characters)


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
    from cptsim.run.config import unpack_correct
    try:
        r = 0
        while len(alive) > 1:
            runs = []
            hits: dict[int, np.ndarray | None] = {}  # per candidate: which validation samples it got right
            windows: dict[int, np.ndarray | None] = {}  # a language model's: its loss per validation window
            for pos in alive:
                s = cands.schedules[pool[pos]]
                cfg = TrainConfig(model=w.model, dataset=w.dataset, data_dir=w.data_dir, schedule=s.to_text(),
                                  steps=steps, batch_size=w.batch_size, lr=w.lr, momentum=w.momentum,
                                  weight_decay=w.weight_decay, lr_schedule=w.lr_schedule,
                                  fp_layers=list(w.fp_layers), seed=w.seed, device=device, augment=w.augment,
                                  val_split=PILOT_VAL_SPLIT, image_size=getattr(w, "image_size", None),
                                  number_format=getattr(w, "number_format", "int"),
                                  grad_format=getattr(w, "grad_format", None))
                out, run = _run_dir(root, cfg, evidence)
                if on_event:
                    on_event({"event": "start", "round": r, "steps": steps, "schedule": s.to_text()})
                t0 = time.perf_counter()
                reused = run is not None
                if run is None:
                    run = evidence.train(cfg, str(out))
                metrics = run.read_metrics().records
                last = metrics[-1] if metrics else {}
                acc = float(last.get("val_acc", float("nan")))
                n_val = run.read_config().get("val_size", 0)
                rec = {"schedule": s.to_text(), "proxy_rank": pos + 1, "proxy_score": float(cands.score[pool[pos]]),
                       "steps": steps, "val_acc": acc, "val_size": n_val, "eval_bits": s.q_max,
                       "train_loss": float(last["train_loss"]) if metrics else None,
                       "time_s": round(time.perf_counter() - t0, 3),
                       "run_dir": str(out) if keep else None, "reused": reused}
                if lm:  # a language model: per-token validation loss and its perplexity (bits per character)
                    rec["val_loss"] = float(last.get("val_loss", float("nan")))
                    rec["val_ppl"] = float(last.get("val_ppl", float("nan")))
                    if "val_bpc" in last:
                        rec["val_bpc"] = float(last["val_bpc"])
                    rec["val_tokens"] = n_val * int(w.input_shape[0])
                    packed_w = last.get("val_window_loss")
                    if isinstance(packed_w, str) and packed_w:
                        from cptsim.data.text import unpack_window_losses

                        windows[pos] = unpack_window_losses(packed_w)
                packed = last.get("val_correct")
                hits[pos] = unpack_correct(packed, int(n_val)) if isinstance(packed, str) and n_val else None
                _record(evidence, run, db, rec)
                runs.append((pos, rec))
                if on_event:
                    on_event({"event": "done", "round": r, **rec})
            order = sorted(runs, key=lambda pr: (_badness(pr[1], lm), pr[0]))
            n_keep = math.ceil(len(order) / 2)
            alive = sorted(pos for pos, _ in order[:n_keep])
            (kept_pos, kept), (dropped_pos, dropped) = order[n_keep - 1], order[n_keep]
            rd = {"round": r, "steps": steps, "runs": [rec for _, rec in runs],
                  "kept": [cands.schedules[pool[p]].to_text() for p in alive]}
            if lm:  # lower is better: the paired, blocked loss-gap test (module docstring)
                rd.update(_loss_gap(kept, dropped, windows.get(kept_pos), windows.get(dropped_pos)))
            else:
                rd.update(_paired(kept, dropped, hits.get(kept_pos), hits.get(dropped_pos)))
            rounds.append(rd)
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
    epoch = RunLength(w.batch_size, int(n * (1 - held))).steps_per_epoch if n else 0
    return max(1, min(w.steps, max(w.steps // 4, 2 * epoch)))


def mcnemar(b: int, c: int) -> tuple[float, float]:
    """McNemar's test of two classifiers on the same samples from their discordant counts: b samples only the first
    got right, c only the second. (exact two-sided p-value: 2 P(X <= min(b, c)) for X ~ Binomial(b + c, 1/2),
    capped at 1; the chi-square statistic with continuity correction, (|b - c| - 1)^2 / (b + c), for reference)."""
    from scipy.stats import binom

    d = b + c
    if d == 0:
        return 1.0, 0.0
    return min(1.0, 2.0 * float(binom.cdf(min(b, c), d, 0.5))), (abs(b - c) - 1) ** 2 / d


def resolvable_gap(d: int, n: int, alpha: float = ALPHA) -> float | None:
    """The smallest accuracy gap (in samples: |b - c|, over ``n``) that McNemar's exact test calls significant at
    ``alpha`` when the two models disagree on ``d`` samples; None when no split of d reaches it (d < 6 at 5%)."""
    from scipy.stats import binom

    k = np.arange(d // 2 + 1)  # the smaller count; p rises with it
    ok = k[2.0 * binom.cdf(k, d, 0.5) < alpha]
    return None if ok.size == 0 else (d - 2 * int(ok.max())) / max(n, 1)


def _paired(kept: dict, dropped: dict, a, b) -> dict:
    """The round's separation test (module docstring): McNemar's exact test on the validation samples the last kept
    and the first dropped candidate disagree on."""
    gap = kept["val_acc"] - dropped["val_acc"]
    if a is None or b is None or len(a) != len(b) or len(a) == 0:
        return {"test": "McNemar (exact)", "gap": gap, "separated": False,
                "why": "the runs recorded no per-sample validation results (val_correct) to pair"}
    n10, n01 = int((a & ~b).sum()), int((~a & b).sum())
    p, stat = mcnemar(n10, n01)
    return {"test": "McNemar (exact)", "gap": gap, "kept_only": n10, "dropped_only": n01,
            "disagreements": n10 + n01, "val_size": int(len(a)), "p_value": p, "chi2": stat,
            "resolvable_gap": resolvable_gap(n10 + n01, len(a)), "separated": bool(p < ALPHA)}


def blocked_se(x, block: int) -> float:
    """The standard error of the mean of the series ``x`` by batch means: the sample standard deviation of the means
    of its consecutive, non-overlapping blocks of ``block`` values (a partial last block left out), over the square
    root of their number. NaN with fewer than two blocks. With ``block`` longer than the series' correlation the
    block means are near independent, and this is the standard error of the mean whatever the correlation within."""
    x = np.asarray(x, dtype=float)
    nb = len(x) // block
    if nb < 2:
        return float("nan")
    means = x[:nb * block].reshape(nb, block).mean(axis=1)
    return float(means.std(ddof=1) / math.sqrt(nb))


def window_se(window_losses) -> tuple[float, int]:
    """(standard error of the mean per-token loss, block length in windows that gave it) from per-window mean
    losses in the order of the text (a language model's BPTT windows: each already the mean of T correlated tokens).

    Batch means over the windows (``blocked_se``), with blocks of 1, 2, 4, ... windows (at most
    ``MAX_BLOCK_WINDOWS``) while at least ``MIN_BLOCKS`` blocks remain; the largest estimate, so that a correlation
    that outlasts one window (the same paragraph, the same topic) is not missed. Fewer than ``MIN_BLOCKS`` windows:
    blocks of one window."""
    x = np.asarray(window_losses, dtype=float)
    best, best_block, block = blocked_se(x, 1), 1, 2
    while block <= MAX_BLOCK_WINDOWS and len(x) // block >= MIN_BLOCKS:
        se = blocked_se(x, block)
        if se > best:
            best, best_block = se, block
        block *= 2
    return best, best_block


def _loss_gap(kept: dict, dropped: dict, a, b) -> dict:
    """A language model's round (module docstring): the loss gap, dropped minus kept, against twice the blocked
    standard error of the per-window differences ``b - a`` (the two runs' per-window validation losses)."""
    gap = dropped["val_loss"] - kept["val_loss"]
    p, n = kept["val_loss"], max(kept.get("val_tokens") or 0, 1)
    naive = p / math.sqrt(n) if math.isfinite(p) else float("nan")  # the old check's error: the loss as its spread
    if a is None or b is None or len(a) != len(b) or len(a) < 2:
        return {"test": "loss gap > 2 x loss / sqrt(tokens) (unpaired, tokens taken as independent: a lower bound on "
                        "the error)", "gap": gap, "two_se": 2 * naive, "separated": bool(gap > 2 * naive),
                "why": "the runs recorded no per-window validation losses (val_window_loss) to pair"}
    d = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)
    se, block = window_se(d)
    return {"test": "paired loss gap > 2 blocked standard errors (batch means over BPTT windows)", "gap": gap,
            "two_se": 2 * se, "windows": int(len(d)), "block_windows": block, "naive_se": naive,
            "separated": bool(math.isfinite(se) and gap > 2 * se)}


def _run_dir(root: Path, cfg, evidence: Evidence):
    """Where the pilot run of ``cfg`` goes: (directory, the finished run already there or None).

    Named by schedule, steps and seed (``cos-rep_3-8_g8_n32-100steps-s0``). A pilot directory may be reused -- a
    second plan into it, or one after a crash: a finished run there of exactly this configuration (the same
    workload, schedule and length; ``Evidence.reuse`` decides) is taken as it is instead of training it again; a
    directory holding anything else (another workload's run, a run cut short) is left alone, and the next free name
    (``...-2``, ``-3``, ...) is used."""
    base = f"{cfg.schedule.replace(':', '_')}-{cfg.steps}steps-s{cfg.seed}"
    reuse = getattr(evidence, "reuse", None)
    for k in range(1, 10_000):
        out = root / (base if k == 1 else f"{base}-{k}")
        if not out.exists() or (out.is_dir() and not any(out.iterdir())):
            return out, None
        if reuse is not None:
            run = reuse(cfg, str(out))
            if run is not None:
                return out, run
    raise InputError(f"--pilot-dir {root}: no free run name for {base}")


def _record(evidence: Evidence, run, db, rec: dict) -> None:
    """Put a finished pilot run into the results database; a database that cannot be written costs a note,
    not the plan."""
    try:
        evidence.record(run, db)
    except Exception as e:  # noqa: BLE001 - the pilot's ranking does not depend on the database
        rec["db_error"] = f"{type(e).__name__}: {e}"

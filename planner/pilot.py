"""Pilot runs: rank the best few candidates by real short training runs instead of the proxy score.

``pilot=K`` replaces the proxy score with evidence (``run_pilot``): the top K candidates by score within budget
train for real for ``pilot_steps`` steps each (their schedule compressed to that run length), the better half by
test accuracy at q_max goes on with twice the steps, and so on until one is left (successive halving). Runs go to
a temporary directory (or ``pilot_dir``), never to the user's runs.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

from cptsim.errors import InputError

from .evaluate import Candidates

__all__ = ["run_pilot"]


def run_pilot(cands: Candidates, pool: list[int], pilot_steps: int | None, pilot_dir: str | None,
              device: str = "cpu", on_event: Callable[[dict], None] | None = None) -> tuple[int, dict]:
    """Successive halving over real short training runs of the candidates ``pool`` (indices, best proxy first).

    Round r trains every survivor from scratch for s_r steps (s_0 = ``pilot_steps``, default T/8; doubled each
    round, at most T) with the workload's settings and the candidate's schedule laid over those s_r steps, and
    measures test accuracy at q_max (the dataset's test split stands in for a validation split). The better half
    (ties: the better proxy rank) survives; the last one standing wins. Returns (position in pool, record)."""
    from cptsim.train import TrainConfig, train

    w = cands.workload
    steps = max(1, w.steps // 8) if pilot_steps is None else pilot_steps
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
    try:
        r = 0
        while len(alive) > 1:
            runs = []
            for pos in alive:
                s = cands.schedules[pool[pos]]
                cfg = TrainConfig(model=w.model, dataset=w.dataset, data_dir=w.data_dir, schedule=s.to_text(),
                                  steps=steps, batch_size=w.batch_size, lr=w.lr, momentum=w.momentum,
                                  weight_decay=w.weight_decay, lr_schedule=w.lr_schedule,
                                  fp_layers=list(w.fp_layers), seed=w.seed, device=device, augment=w.augment)
                out = root / f"round{r}-{pos:02d}-{s.name}"
                if on_event:
                    on_event({"event": "start", "round": r, "steps": steps, "schedule": s.to_text()})
                t0 = time.perf_counter()
                run = train(cfg, str(out), progress=False)
                metrics = run.read_metrics().records
                acc = float(metrics[-1]["test_acc"]) if metrics else float("nan")
                rec = {"schedule": s.to_text(), "proxy_rank": pos + 1, "proxy_score": float(cands.score[pool[pos]]),
                       "steps": steps, "test_acc": acc, "eval_bits": s.q_max,
                       "train_loss": float(metrics[-1]["train_loss"]) if metrics else None,
                       "time_s": round(time.perf_counter() - t0, 3),
                       "run_dir": str(out) if keep else None}
                runs.append((pos, rec))
                if on_event:
                    on_event({"event": "done", "round": r, **rec})
            order = sorted(runs, key=lambda pr: (-(pr[1]["test_acc"] if math.isfinite(pr[1]["test_acc"]) else -1),
                                                 pr[0]))
            alive = sorted(pos for pos, _ in order[:math.ceil(len(order) / 2)])
            rounds.append({"round": r, "steps": steps, "runs": [rec for _, rec in runs],
                           "kept": [cands.schedules[pool[p]].to_text() for p in alive]})
            steps = min(steps * 2, w.steps)
            r += 1
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    winner = alive[0]
    doc = {"k": len(pool), "method": "successive halving",
           "measure": "test accuracy at q_max after a short run (the dataset's test split used as validation)",
           "first_steps": rounds[0]["steps"] if rounds else 0, "rounds": rounds,
           "winner": cands.schedules[pool[winner]].to_text(), "dir": str(root) if keep else None}
    return winner, doc

"""``LocalEvidence``: the real runs the planner's pilot, range test and ``--quality db`` ask for, made on this machine.

The planner is handed this object (``cptsim.planner.evidence.Evidence``) rather than importing the training loop,
so that imports run down the data flow (the planner comes before the run); the study stage, which may import
both, wires them together.
"""

from __future__ import annotations

__all__ = ["LocalEvidence"]


class LocalEvidence:
    """Train with ``cptsim.run.train``, range-test with ``cptsim.study.rangetest``, record and read runs in the
    results database (``cptsim.study.results``)."""

    def train(self, cfg, out: str):
        from cptsim.run.train import train

        return train(cfg, str(out), progress=False)

    # TrainConfig fields that change where and how fast a run ran, not what it computed
    RUNTIME = ("workers", "threads", "checkpoint_every", "keep_checkpoints", "tensorboard")

    def reuse(self, cfg, out: str):
        from dataclasses import asdict
        from pathlib import Path

        from cptsim.errors import InputError
        from cptsim.run.rundir import CONFIG, RunDir

        from .results import run_finished

        if not (Path(out) / CONFIG).is_file():
            return None
        try:
            run = RunDir.open(out)
            have = run.read_config().get("settings", {})
            if not run_finished(run):
                return None
        except (InputError, OSError, ValueError, KeyError, TypeError):
            return None
        want = {k: v for k, v in asdict(cfg).items() if k not in self.RUNTIME}
        return run if all(have.get(k) == v for k, v in want.items()) else None

    def record(self, run, db) -> None:
        from .results import ResultsDB, record_run

        with ResultsDB(db) as rdb:
            record_run(run.path, rdb, source="pilot")

    def range_test(self, settings: dict):
        from .rangetest import RangeTestSettings, run_range_test

        return run_range_test(RangeTestSettings(**settings))

    def measurements(self, workload: dict, db) -> tuple[list[dict], str, str]:
        from .results import ResultsDB, workload_key

        key = workload_key(workload)
        with ResultsDB(db) as rdb:
            return list(rdb.rows(workload_key=key)), key, str(rdb.path)

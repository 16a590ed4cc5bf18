"""What the planner asks of real runs, as an interface it is handed (``Evidence``), not code it imports.

The planner comes before the run in the data flow: it may know what a run *is* (``cptsim.run.config``), never the
loop that trains one. Three of its options need real runs all the same -- ``pilot=K`` trains candidates,
``--min-bits auto`` runs the precision range test, ``quality="db"`` reads the results database of measured runs
-- so whoever calls ``plan``/``select`` with one of them hands in an ``Evidence``: the CLI and the API use
``cptsim.study.evidence.LocalEvidence()``, which trains with ``cptsim.run.train`` on this machine; a test may hand
in a fake, a cluster executor its own.
"""

from __future__ import annotations

from typing import Any, Protocol

from cptsim.errors import InputError

__all__ = ["Evidence", "need_evidence"]


class Evidence(Protocol):
    def train(self, cfg, out: str) -> Any:
        """Train ``cfg`` (a ``cptsim.run.config.TrainConfig``) into a new run directory ``out``; the finished run
        (``read_metrics()``, ``read_config()``, ``path``)."""

    def reuse(self, cfg, out: str) -> Any:
        """The finished run in directory ``out`` if it trained exactly ``cfg`` (where and how fast it ran aside),
        else None. Optional: the pilot trains afresh under another name when it is missing."""

    def record(self, run, db) -> None:
        """Put a finished run into the results database ``db`` (None: the default database; False: none)."""

    def range_test(self, settings: dict) -> Any:
        """Run the precision range test with these settings (``RangeTestSettings`` fields); its result
        (``suggested_q_min``, ``reason``, ``to_json()``)."""

    def measurements(self, workload: dict, db) -> tuple[list[dict], str, str]:
        """(the database rows of this workload (its ``to_json()``), the workload key, the database path)."""


def need_evidence(evidence: Evidence | None, what: str) -> Evidence:
    if evidence is None:
        raise InputError(f"{what} needs real runs: pass evidence=cptsim.study.evidence.LocalEvidence() "
                         "(the command line does)")
    return evidence

"""The tiling search's results kept on disk, so that a second ``cost`` or ``plan`` of a workload searches nothing.

One JSON file per array (``cache_dir()/tiling-<hash of the ArraySpec and the model's version>.json``), mapping a
problem to the (cycles, energy J) of its fastest tiling. A file that cannot be read is ignored (and rewritten);
writes are atomic and merge with what another process wrote meanwhile. The search is deterministic, so a cached
figure is the figure the search would give.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from cptsim.fileio import atomic_write_json, cache_dir
from .tiling import MODEL_VERSION, ArraySpec, Problem, search

_MAX_ENTRIES = 200_000


def _key(p: Problem) -> str:
    return ",".join(repr(float(x)) for x in p)


class _Store:
    def __init__(self, spec: ArraySpec):
        digest = hashlib.sha256(f"{MODEL_VERSION}|{spec!r}".encode()).hexdigest()[:16]
        self.path = cache_dir() / f"tiling-{digest}.json"
        self.data = self._read(self.path)
        self.fresh: dict[str, list[float]] = {}
        self.mem: dict[Problem, tuple[float, float]] = {}

    @staticmethod
    def _read(path: Path) -> dict:
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return d if isinstance(d, dict) else {}

    def get(self, p: Problem, spec: ArraySpec) -> tuple[float, float]:
        got = self.mem.get(p)
        if got is not None:
            return got
        k = _key(p)
        raw = self.data.get(k)
        on_disk = isinstance(raw, list) and len(raw) == 2 and all(isinstance(x, (int, float)) for x in raw)
        # searched in this process already (under another cache directory, say): the same result
        got = _SEEN.get((spec, p))
        if got is None:
            if on_disk:
                got = (float(raw[0]), float(raw[1]))
            else:
                acc = search(p, spec)
                got = (acc.cycles, acc.energy_j)
        if not on_disk:
            self.data[k] = self.fresh[k] = list(got)
        self.mem[p] = _SEEN[(spec, p)] = got
        return got

    def flush(self) -> None:
        if not self.fresh:
            return
        merged = self._read(self.path)
        merged.update(self.fresh)
        if len(merged) > _MAX_ENTRIES:
            merged = dict(self.fresh)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.path, merged)
        except OSError:
            return  # a read-only cache costs the next run its searches, nothing else
        self.fresh = {}


_STORES: dict[tuple, _Store] = {}
_SEEN: dict[tuple, tuple[float, float]] = {}  # (spec, problem) -> result, whatever the cache directory


def store(spec: ArraySpec) -> _Store:
    """The cache of ``spec``'s searches (read from disk once per process and cache directory)."""
    key = (spec, str(cache_dir()))
    if key not in _STORES:
        _STORES[key] = _Store(spec)
    return _STORES[key]

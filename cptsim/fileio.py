"""Whole-file writes that a kill cannot tear: the base layer every stage writes its files through.

A file is written to a temporary file in the same directory, fsync'd, then renamed over the old one, so a kill at
any moment leaves either the old or the new file, never half of one. (It lives below every package, beside
``errors``, because the plan file, profiles, plots, run directories and calibrations all write this way.)
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write a whole file so that a kill leaves the old file or the new one; permissions as a plain open() gives."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())  # mkstemp makes 0600: runs and profiles are meant to be shared
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2) + "\n").encode())


def fsync_dir(path: Path) -> None:
    """Make the renames and unlinks done in directory `path` durable (a rename is in the directory, not the file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def cache_dir() -> Path:
    """cptsim's cache directory: what it measured or built on this machine and may rebuild at any time (the C
    kernels, the CPU's GEMM-path decision, the automatic host profiles). ``$CPTSIM_HOME/cache`` when CPTSIM_HOME is
    set (the tests give each worker its own), else ``$XDG_CACHE_HOME/cptsim``, else ``~/.cache/cptsim``."""
    home = os.environ.get("CPTSIM_HOME")
    if home:
        return Path(home).expanduser() / "cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")).expanduser() / "cptsim"

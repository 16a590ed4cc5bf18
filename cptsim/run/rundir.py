"""The run directory: the one place that reads and writes its files.

    config.json     everything resolved for the run (format cptsim.run/1)
    plan.json       the plan the run executed, if any (copied verbatim)
    profile.json    per-layer MACs measured in this run
    trace.jsonl     one line per executed step (format in DESIGN.md)
    metrics.jsonl   one line per evaluation
    checkpoint-<step>.pt  the last K checkpoints (K = --keep-checkpoints, default 2), oldest pruned
    checkpoints.json      their manifest: step, file, SHA-256, size (format cptsim.checkpoints/1), oldest first
    checkpoint.pt   the newest checkpoint again (a hard link where the filesystem has them), for scripts; resume
                    reads the manifest, and checkpoint.pt alone only in a run of an older cptsim that has no manifest

and, next to the directory (so that a run not created yet can be locked, and the lock is never one of its files):

    .<name>.lock    flock'd by the one process that writes the run (see ``RunLock``); holds who that is

Every whole-file write goes to a temporary file in the same directory, is fsync'd and then renamed over the
old one, so a kill at any moment leaves either the old or the new file, never half of one. The two .jsonl files
are append-only; a kill can leave a partial last line, which readers report and `truncate_after` removes.
The training loop keeps trace.jsonl open (``keep_trace_open``) and hands each line to the kernel in one write of
its own: no open and close per step; once appended, a line survives a kill of the process (it is in the page cache;
like every append here it is not fsync'd).
A checkpoint is durable (file and directory fsync'd) before the manifest names it, and the manifest is durable
before older checkpoints are deleted; resume takes the newest checkpoint whose size and SHA-256 match the
manifest and that loads, so one damaged file costs the steps since the checkpoint before it, not the run.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cptsim.errors import InputError
from cptsim.fileio import atomic_write_bytes, atomic_write_json, fsync_dir  # noqa: F401  (re-exported)

RUN_FORMAT = "cptsim.run/1"

CONFIG = "config.json"
CONFIG_KEYS = {"settings": dict, "schedule": dict, "total_steps": int, "steps_per_epoch": int, "eval_bits": int}
TRACE = "trace.jsonl"
METRICS = "metrics.jsonl"
CHECKPOINT = "checkpoint.pt"
CHECKPOINTS = "checkpoints.json"
CHECKPOINTS_FORMAT = "cptsim.checkpoints/1"
KEEP_CHECKPOINTS = 2
_CHECKPOINT_FILE = re.compile(r"checkpoint-(\d+)\.pt")
PLAN = "plan.json"
PROFILE = "profile.json"


# The atomic writes live in cptsim.fileio, the base layer, because every stage writes files this way.


# ---- one writer per run ------------------------------------------------------------------------------------------

LOCK_ENV = "CPTSIM_RUN_LOCK"  # "<token>:<lock file>": the lock a parent (sweep, --nproc launcher) holds for us


class RunLocked(InputError):
    """Another live process holds the run (exit 2: the second writer writes nothing)."""


# The lock descriptors this process holds. A child made by fork alone (a DataLoader's worker, a forked
# multiprocessing rank) inherits them, and an flock lives while any copy is open: after a SIGKILL of the run's
# process its workers kept the run locked for the seconds they took to notice, and a resume at once was refused
# as "being written by another process". A forked child closes its copies (below); a child the run means to hold
# the lock gets it explicitly (pass_fds, ``RunLock.handoff_env``) and is started inside ``handed_down``, which the
# hook then leaves alone (a subprocess runs Python's at-fork hooks only with a preexec_fn, but then it does).
_HELD: set[int] = set()


def _close_in_forked_child() -> None:
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_forked_child)


class ExclusiveLock:
    """An exclusive ``flock`` on a file, taken without waiting and held until ``release`` or the process's end.

    The kernel drops it when the last descriptor of the open file closes, so a SIGKILLed holder never leaves a
    stale lock. The file records who holds it (pid, host, start time, command) for the error a second writer
    gets. ``fd`` may be handed to a child (``pass_fds``): the child then holds the lock too, and it outlives the
    parent as long as the child runs."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.fd: int | None = None
        self.token: str | None = None

    def try_acquire(self, token: str | None = None) -> bool:
        """True if taken (and the holder recorded, with ``token`` or a new one); False if another open file holds
        it. OSError if the lock file cannot be created."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        self.fd = fd
        _HELD.add(fd)
        self.token = token or secrets.token_hex(8)
        self._record()
        return True

    def _record(self) -> None:
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "command": " ".join([_program(), *sys.argv[1:]])[:300], "token": self.token}
        data = (json.dumps(holder) + "\n").encode()
        # written over the old record, then cut to length: a reader in between sees no valid JSON, never a
        # mixture that parses
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))

    @contextlib.contextmanager
    def handed_down(self):
        """While a child the run means to hold the lock is started (``pass_fds=(lock.fd,)``): the fork hook leaves
        the descriptor open in it (a ``preexec_fn`` makes subprocess run Python's at-fork hooks)."""
        fd = self.fd
        _HELD.discard(fd)
        try:
            yield fd
        finally:
            if self.fd == fd and fd is not None:
                _HELD.add(fd)

    def holder(self, wait_s: float = 2.0) -> dict | None:
        """Who holds the lock, as it recorded itself. The winner records itself just after taking the lock, so
        for a moment the file is empty or still names the previous holder (a killed one leaves its record): wait
        up to ``wait_s`` for a record whose process is alive, and return None rather than name a dead one."""
        deadline = time.monotonic() + wait_s
        while True:
            h = read_holder(self.path)
            if h and _alive(h):
                return h
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)

    def release(self) -> None:
        if self.fd is not None:
            _HELD.discard(self.fd)
            os.close(self.fd)  # the lock goes when the last process holding this open file closes it
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def _program() -> str:
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    return "cptsim" if name in ("main.py", "__main__.py", "cptsim") else name


def _alive(holder: dict) -> bool:
    """Whether a recorded holder's process still runs (assumed so on another host, which we cannot ask)."""
    if holder.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(holder.get("pid")), 0)
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def read_holder(lock_file: Path) -> dict | None:
    """Who holds (or last held) a lock file, as it recorded itself; None if unreadable."""
    try:
        d = json.loads(Path(lock_file).read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def describe_holder(holder: dict | None) -> str:
    if not holder:
        return "another process (it has not recorded itself yet)"
    return (f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('started')}"
            + (f" ({holder['command']})" if holder.get("command") else ""))


def lock_file(run_path: str | os.PathLike) -> Path:
    """Where the lock of a run directory lives: ``.<name>.lock`` next to it (symlinks resolved, so every path to
    one run finds one lock)."""
    p = Path(run_path).resolve()
    return p.parent / f".{p.name}.lock"


class RunLock(ExclusiveLock):
    """The exclusive right to write one run directory (train, resume, a pilot run, the report's files).

    ``RunLock.acquire(run)`` takes it or raises RunLocked naming the holder. A process started to write a run
    that its parent holds (a sweep's training, a ``--nproc`` launcher's torchrun workers) finds the parent's
    token in ``CPTSIM_RUN_LOCK`` (``handoff_env``) and adopts the lock instead of fighting over it: the token
    must be the one the lock file records and the lock must still be held; if nobody holds it any more, the
    adopter takes it itself."""

    def __init__(self, run_path: str | os.PathLike):
        super().__init__(lock_file(run_path))
        self.run_path = Path(run_path)
        self.adopted = False

    @classmethod
    def acquire(cls, run_path: str | os.PathLike) -> "RunLock":
        lock = cls(run_path)
        if lock._adopt():
            return lock
        try:
            taken = lock.try_acquire()
        except OSError as e:
            raise InputError(f"cannot lock {run_path}: {lock.path}: {e.strerror or e}") from None
        if not taken:
            raise RunLocked(f"{run_path} is being written by {describe_holder(lock.holder())}; a second writer "
                            "would corrupt it - wait for that process to end (a killed one releases it at once)")
        return lock

    def _adopt(self) -> bool:
        given = os.environ.get(LOCK_ENV, "")
        token, _, path = given.partition(":")
        if not token or Path(path) != self.path:
            return False
        holder = read_holder(self.path)
        if not holder or holder.get("token") != token:
            return False  # not the lock our parent took: acquire normally (and fail if someone else holds it)
        probe = ExclusiveLock(self.path)
        try:
            free = probe.try_acquire(token)
        except OSError:
            return False
        if free:  # our parent is gone and nobody else took the run: we are its writer now
            self.fd, self.token = probe.fd, token
        else:
            self.token, self.adopted = token, True
        return True

    def handoff_env(self) -> dict:
        """Environment for a child process that is to write this run under this lock."""
        return {LOCK_ENV: f"{self.token}:{self.path}"}


@dataclass
class JsonLines:
    """What a .jsonl file held: the parsed records and whether its last line was cut short."""

    records: list[dict] = field(default_factory=list)
    truncated: bool = False


def _read_jsonl(path: Path) -> JsonLines:
    out = JsonLines()
    if not path.exists():
        return out
    lines = path.read_bytes().split(b"\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError("not an object")
        except ValueError as e:
            if i == len(lines) - 1:  # no newline after it: a write cut short by a kill
                out.truncated = True
                break
            raise InputError(f"{path}: line {i + 1} is not a JSON object ({e})") from None
        out.records.append(rec)
    return out


def _not_a_run_file(p: Path) -> str:
    """What a file given where a run directory belongs is, and what to give instead: a run's own file names its
    directory, a plan (cptsim plan's plan.json) is trained first."""
    if (p.parent / CONFIG).is_file():
        return f"{p} is a file of the run directory {p.parent}, not a run directory: give {p.parent}"
    from .planfile import looks_like_plan

    if looks_like_plan(p):
        return (f"{p} is a plan file, not a run directory: train it with `cptsim train --plan {p} --out DIR`, "
                "then give DIR")
    return f"{p} is a file, not a run directory"


class RunDir:
    """A run directory on disk. `create` for a new run, `open` for an existing one."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._trace_fd: int | None = None  # trace.jsonl held open (keep_trace_open), else opened per line
        self._trace_kept = False

    # ---- lifecycle -------------------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | os.PathLike, config: dict) -> "RunDir":
        """Make a new run directory; refuse to touch one that already holds anything."""
        p = cls.check_new(path)
        p.mkdir(parents=True, exist_ok=True)
        run = cls(p)
        run.write_config(config)
        return run

    @staticmethod
    def check_new(path: str | os.PathLike) -> Path:
        """The path of a run that is yet to start: it must not exist, or be an empty directory."""
        p = Path(path)
        if p.exists() and (not p.is_dir() or any(p.iterdir())):
            raise InputError(f"{p} already exists and is not empty; resume it with --resume {p} or pick another --out")
        return p

    @classmethod
    def open(cls, path: str | os.PathLike) -> "RunDir":
        p = Path(path)
        if p.is_file():
            raise InputError(_not_a_run_file(p))
        if not p.is_dir():
            raise InputError(f"{p} is not a run directory (no such directory)")
        if not (p / CONFIG).is_file():
            raise InputError(f"{p} is not a run directory (no {CONFIG})")
        run = cls(p)
        run.read_config()  # validates the format
        return run

    # ---- config / json files ---------------------------------------------------------------------------------
    def write_config(self, config: dict) -> None:
        atomic_write_json(self.path / CONFIG, {"format": RUN_FORMAT, **config})

    def read_config(self) -> dict:
        """config.json, format-checked (a config from a newer cptsim says so)."""
        path = self.path / CONFIG
        try:
            cfg = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise InputError(f"{path}: cannot read run config ({e})") from None
        check_run_format(cfg, path)
        for key, kind in CONFIG_KEYS.items():
            if not isinstance(cfg.get(key), kind):
                raise InputError(f"{path}: {key!r} is missing or not a {kind.__name__} (edited by hand?)")
        for key in ("model", "dataset"):
            if not isinstance(cfg["settings"].get(key), str):
                raise InputError(f"{path}: settings.{key} is missing or not a string")
        if not isinstance(cfg["schedule"].get("text"), str):
            raise InputError(f"{path}: schedule.text is missing or not a string")
        return cfg

    def update_config(self, key: str, value: Any) -> None:
        """Set one key of config.json (``"host.quantizer_fallbacks"``: a dotted path, objects made as needed) and
        rewrite the file atomically, every other key and its order kept."""
        path = self.path / CONFIG
        cfg = self.read_config()
        *parents, last = key.split(".")
        node = cfg
        for k in parents:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise InputError(f"{path}: {key!r}: {k!r} is not an object")
        node[last] = value
        atomic_write_json(path, cfg)

    def write_json(self, name: str, obj: Any) -> None:
        atomic_write_json(self.path / name, obj)

    def read_json(self, name: str) -> Any | None:
        path = self.path / name
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text())
        except ValueError as e:
            raise InputError(f"{path}: not valid JSON ({e})") from None

    # ---- trace and metrics -----------------------------------------------------------------------------------
    def append_trace(self, record: dict) -> None:
        if not self._trace_kept:
            self._append(TRACE, record)
            return
        if self._trace_fd is None:
            self._trace_fd = os.open(self.path / TRACE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        while data:  # one write() for a line of a few hundred bytes; the loop only for a short write (a full disk)
            data = data[os.write(self._trace_fd, data):]

    def keep_trace_open(self) -> None:
        """Append every further trace line through one descriptor held open (``close_trace`` closes it): a step's
        line costs one write() instead of an open, a write and a close -- the training loop's per-step file work
        on a GPU, where the host has the time of one step to launch the next. A line is written whole before
        ``append_trace`` returns, so a kill loses no line appended before it, as with a line opened per write."""
        self._trace_kept = True

    def close_trace(self) -> None:
        fd, self._trace_fd, self._trace_kept = self._trace_fd, None, False
        if fd is not None:
            os.close(fd)

    def append_metrics(self, record: dict) -> None:
        self._append(METRICS, record)

    def _append(self, name: str, record: dict) -> None:
        with open(self.path / name, "a") as f:
            f.write(json.dumps(record, separators=(",", ":")) + "\n")

    def read_trace(self) -> JsonLines:
        return _read_jsonl(self.path / TRACE)

    def read_metrics(self) -> JsonLines:
        return _read_jsonl(self.path / METRICS)

    def truncate_after(self, step: int) -> None:
        """Forget what ran after the checkpoint taken at `step`: trace lines of steps >= `step`, and evaluations
        recorded after it (an evaluation's "step" is the number of steps done when it ran, so the checkpoint's own
        evaluation, at exactly `step`, stays).

        Rewritten atomically, so a kill during the rewrite leaves the old file, and the next resume does it again.
        """
        if self._trace_fd is not None:  # the file is replaced below: a descriptor held open would write to the old one
            os.close(self._trace_fd)
            self._trace_fd = None
        keep = {TRACE: lambda r: r.get("step", step) < step, METRICS: lambda r: r.get("step", step + 1) <= step}
        for name, wanted in keep.items():
            path = self.path / name
            if not path.exists():
                continue
            kept = [r for r in _read_jsonl(path).records if wanted(r)]
            atomic_write_bytes(path, "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in kept).encode())

    def remove_stale_temp_files(self) -> None:
        """Delete temporary files a killed atomic write left behind (never read by anything, but clutter)."""
        for tmp in self.path.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)

    # ---- checkpoints -----------------------------------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        """checkpoint.pt: the newest checkpoint, for scripts (resume goes by the manifest)."""
        return self.path / CHECKPOINT

    def read_checkpoint_manifest(self) -> list[dict] | None:
        """The manifest's entries, oldest first; None without a manifest; InputError when it is damaged."""
        path = self.path / CHECKPOINTS
        if not path.exists():
            return None
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise InputError(f"{path}: cannot read the checkpoint manifest ({e})") from None
        entries = doc.get("checkpoints") if isinstance(doc, dict) and doc.get("format") == CHECKPOINTS_FORMAT else None
        if not isinstance(entries, list) or not all(_manifest_entry(e) for e in entries):
            raise InputError(f"{path}: not a checkpoint manifest of format {CHECKPOINTS_FORMAT!r}")
        return sorted(entries, key=lambda e: e["step"])

    def _checkpoint_files(self) -> list[dict]:
        """checkpoint-<step>.pt files on disk, oldest first, unverified (no manifest to check them against)."""
        found = []
        for p in self.path.glob("checkpoint-*.pt"):
            m = _CHECKPOINT_FILE.fullmatch(p.name)
            if m:
                found.append({"step": int(m.group(1)), "file": p.name, "sha256": None, "size": None})
        return sorted(found, key=lambda e: e["step"])

    def save_checkpoint(self, state: dict, keep: int = KEEP_CHECKPOINTS) -> dict:
        """Write ``state`` (its "step" names it) as a new checkpoint, then the manifest, then prune to ``keep``.

        Order matters for a kill or a full disk at any point: the new file is durable before the manifest names
        it, the manifest is durable before an old checkpoint is deleted. An OSError (ENOSPC) leaves the previous
        checkpoints and manifest as they were. Returns the new manifest entry."""
        import io

        import torch

        step = int(state["step"])
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
        entry = {"step": step, "file": checkpoint_file(step), "sha256": hashlib.sha256(data).hexdigest(),
                 "size": len(data), "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        atomic_write_bytes(self.path / entry["file"], data)
        fsync_dir(self.path)
        try:
            old = self.read_checkpoint_manifest()
        except InputError:
            old = None
        if old is None:  # no manifest (or a damaged one): keep the files on disk as unverified fallbacks
            old = self._checkpoint_files()
        # Entries at or after this step belong to a timeline a resume abandoned (or are this step's old file).
        kept = ([e for e in old if e["step"] < step] + [entry])[-max(int(keep), 1):]
        atomic_write_json(self.path / CHECKPOINTS, {"format": CHECKPOINTS_FORMAT, "checkpoints": kept})
        fsync_dir(self.path)
        self._replace_latest(entry["file"], data)
        names = {e["file"] for e in kept}
        for p in self.path.glob("checkpoint-*.pt"):
            if _CHECKPOINT_FILE.fullmatch(p.name) and p.name not in names:
                p.unlink(missing_ok=True)
        return entry

    def _replace_latest(self, name: str, data: bytes) -> None:
        """Point checkpoint.pt at the newest checkpoint: a hard link (no second copy on disk), else a copy."""
        tmp = self.path / f".{CHECKPOINT}.{secrets.token_hex(4)}.tmp"
        try:
            os.link(self.path / name, tmp)
        except OSError:  # a filesystem without hard links
            atomic_write_bytes(self.checkpoint_path, data)
            return
        try:
            os.replace(tmp, self.checkpoint_path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def find_checkpoint(self, load: bool = True, map_location: Any = "cpu") -> "CheckpointChoice":
        """The checkpoint a resume continues from: the newest whose size and SHA-256 match the manifest (and,
        with ``load``, that torch loads as a checkpoint of its step); older ones are the fallbacks. Without a
        manifest (a run of an older cptsim), the files themselves, unverified. ``entry`` None: there is none
        (``skipped`` empty: the run never checkpointed; else every one was damaged)."""
        notes = []
        try:
            entries = self.read_checkpoint_manifest()
        except InputError as e:
            notes.append(f"{e}; trying the checkpoint files themselves")
            entries = None
        verified = entries is not None
        if entries is None:
            entries = self._checkpoint_files()
            if not entries and self.checkpoint_path.exists():
                entries = [{"step": None, "file": CHECKPOINT, "sha256": None, "size": None}]
        skipped = []
        for e in reversed(entries):
            data, why = self._verify(e)
            state = None
            if why is None and (load or e["step"] is None):  # an older cptsim's checkpoint.pt: its step is inside
                state, why = _load_state(data, map_location, e["step"])
            if why is None:
                if e["step"] is None:
                    e = {**e, "step": int(state["step"])}
                return CheckpointChoice(e, state, skipped, verified, notes)
            skipped.append((e, why))
        return CheckpointChoice(None, None, skipped, verified, notes)

    def _verify(self, e: dict) -> tuple[bytes | None, str | None]:
        try:
            data = (self.path / e["file"]).read_bytes()
        except FileNotFoundError:
            return None, "is missing"
        except OSError as err:
            return None, f"cannot be read ({err.strerror or err})"
        if e.get("size") is not None and len(data) != e["size"]:
            return None, (f"is truncated ({len(data)} of {e['size']} bytes)" if len(data) < e["size"]
                          else f"has {len(data)} bytes, not the {e['size']} recorded")
        if e.get("sha256") and hashlib.sha256(data).hexdigest() != e["sha256"]:
            return None, "fails its SHA-256 checksum"
        return data, None

    def resume_point(self) -> dict:
        """Which checkpoint `cptsim train --resume` would continue from (sizes and checksums checked, nothing
        loaded), for `cptsim report`: step, file, verified, skipped [{file, step, why}], and a one-line text."""
        c = self.find_checkpoint(load=False)
        skipped = [{"file": e["file"], "step": e["step"], "why": why} for e, why in c.skipped]
        bad = "; ".join(f"{s['file']} {s['why']}" for s in skipped)
        if c.entry is None:
            text = (f"no usable checkpoint ({bad}): --resume would refuse" if skipped
                    else "no checkpoint yet: --resume would start from step 0")
        else:
            e = c.entry
            how = ("size and SHA-256 match checkpoints.json" if c.verified and e.get("sha256")
                   else "unverified: no manifest (written by an older cptsim)")
            text = f"--resume would continue from {e['file']} (step {e['step']}; {how})"
            if skipped:
                text = f"{bad}; {text}"
        if c.notes:
            text = "; ".join(c.notes) + "; " + text
        return {"step": c.entry["step"] if c.entry else None, "file": c.entry["file"] if c.entry else None,
                "verified": bool(c.entry and c.verified and c.entry.get("sha256")), "skipped": skipped,
                "text": text}

    def load_checkpoint(self, map_location: Any = "cpu") -> dict | None:
        """The newest usable checkpoint's state (see ``find_checkpoint``); None if the run has none."""
        choice = self.find_checkpoint(map_location=map_location)
        if choice.entry is None and choice.skipped:
            raise InputError(choice.unusable_message(self.path))
        return choice.state

    # ---- reading a run for `cptsim report` --------------------------------------------------------------------
    def read_executed(self) -> "ExecutedSteps":
        """The trace as the steps that ran: line format checked, each step once (see ``ExecutedSteps``)."""
        self.read_config()
        return _executed(self.read_trace(), self.path / TRACE)

    def read_plan(self) -> dict | None:
        """The plan the run executed (validated), or None for a run given its schedule by hand."""
        plan = self.read_json(PLAN)
        if plan is None:
            return None
        from cptsim.run.planfile import validate_plan

        return validate_plan(plan, str(self.path / PLAN))

    def read_profile(self):
        """The per-layer MAC profile measured in this run (a ``LayerProfile``), or None before its first step."""
        d = self.read_json(PROFILE)
        if d is None:
            return None
        from cptsim.measure.profiler import LayerProfile

        try:
            return LayerProfile.from_json(d)
        except InputError as e:
            raise InputError(f"{self.path / PROFILE}: {e}") from None

    def write_bytes(self, name: str, data: bytes) -> Path:
        """Write a whole file (a report's PNG) atomically into the run directory."""
        atomic_write_bytes(self.path / name, data)
        return self.path / name


def checkpoint_file(step: int) -> str:
    return f"checkpoint-{step:08d}.pt"


def _manifest_entry(e) -> bool:
    return (isinstance(e, dict) and isinstance(e.get("step"), int) and not isinstance(e["step"], bool)
            and e["step"] >= 0 and isinstance(e.get("file"), str) and _CHECKPOINT_FILE.fullmatch(e["file"]) is not None
            and isinstance(e.get("sha256"), str) and isinstance(e.get("size"), int))


def _load_state(data: bytes, map_location: Any, step: int | None) -> tuple[dict | None, str | None]:
    import io

    import torch

    try:
        # weights_only: a checkpoint is data, never code to unpickle.
        state = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises several types for a damaged file
        return None, f"cannot be loaded ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        return None, "is not a cptsim checkpoint (no step)"
    if step is not None and state["step"] != step:
        return None, f"holds step {state['step']}, not the {step} its name says"
    return state, None


@dataclass
class CheckpointChoice:
    """What ``RunDir.find_checkpoint`` found: the entry to resume from (None: none), its loaded state (with
    ``load``), the newer ones passed over and why, whether a manifest vouched for them, and notes."""

    entry: dict | None
    state: dict | None
    skipped: list[tuple[dict, str]] = field(default_factory=list)
    verified: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def step(self) -> int:
        return self.entry["step"] if self.entry else 0

    def fallback_message(self, verb: str = "resuming") -> str | None:
        """One line when newer checkpoints were passed over; None otherwise."""
        if not self.skipped and not self.notes:
            return None
        bad = "; ".join(f"{e['file']}" + (f" (step {e['step']})" if e["step"] is not None else "") + f" {why}"
                        for e, why in self.skipped)
        to = (f"{verb} from {self.entry['file']} (step {self.entry['step']})" if self.entry
              else f"{verb} from step 0")
        return "; ".join(self.notes + ([bad] if bad else [])) + f"; {to}"

    def unusable_message(self, path) -> str:
        bad = "; ".join(f"{e['file']} {why}" for e, why in self.skipped)
        return (f"{path}: no usable checkpoint ({bad}); restore one from a backup, or start the run again with "
                "a new --out")


def run_summary(run: RunDir) -> dict:
    """The headline figures of a run, from its files: steps done, accuracy at q_max, time, mean bits."""
    cfg = run.read_config()
    trace = run.read_trace()
    metrics = run.read_metrics().records
    steps = trace.records
    accs = [m["test_acc"] for m in metrics if isinstance(m.get("test_acc"), (int, float))]
    return {
        "run": str(run.path),
        "model": cfg["settings"]["model"],
        "dataset": cfg["settings"]["dataset"],
        "schedule": cfg["schedule"]["text"],
        "steps_done": len(steps),
        "total_steps": cfg["total_steps"],
        "complete": len(steps) == cfg["total_steps"],
        "trace_truncated": trace.truncated,
        "epochs_done": len(metrics),
        "eval_bits": cfg["eval_bits"],
        "final_test_acc": accs[-1] if accs else None,
        "best_test_acc": max(accs) if accs else None,
        # language models (cptsim.data.text): perplexity at q_max, lower is better; None for classifiers
        "final_test_ppl": metrics[-1].get("test_ppl") if metrics else None,
        "final_val_ppl": metrics[-1].get("val_ppl") if metrics else None,
        "final_test_bpc": metrics[-1].get("test_bpc") if metrics else None,
        "final_train_loss": metrics[-1].get("train_loss") if metrics else None,
        "train_time_s": round(sum(r.get("time_s", 0.0) for r in steps), 3),
        "mean_bits": (sum(r.get("bits", 0) for r in steps) / len(steps)) if steps else None,
    }


# ---- reading a finished (or interrupted) run for `cptsim report` ---------------------------------------------------

REPORT_JSON = "report.json"
REPORT_PNG = "report.png"
TRACE_LINE_FORMAT = "cptsim.trace/1"  # lines carry no "format" today; one that does must name this one
TRACE_KEYS = ("step", "epoch", "batch_size", "bits", "grad_bits")


@dataclass
class ExecutedSteps:
    """The steps a run executed, each once, in step order.

    ``duplicates``: lines dropped because a later line had the same step (a resume re-runs the steps after its
    checkpoint; ``truncate_after`` removes the old lines first, so only a trace edited by hand or written by an
    older cptsim has any). ``missing``: step numbers below the last one that no line holds.
    """

    records: list[dict] = field(default_factory=list)
    truncated: bool = False
    duplicates: int = 0
    missing: list[int] = field(default_factory=list)


def check_run_format(cfg: dict, path: Path) -> None:
    """InputError when config.json names a run format this cptsim cannot read (a newer one says so)."""
    fmt = cfg.get("format") if isinstance(cfg, dict) else None
    if fmt == RUN_FORMAT:
        return
    version = fmt[len("cptsim.run/"):] if isinstance(fmt, str) and fmt.startswith("cptsim.run/") else ""
    if version.isdigit() and int(version) > int(RUN_FORMAT.rsplit("/", 1)[1]):
        raise InputError(f"{path}: run format {fmt!r} was written by a newer cptsim; this one reads {RUN_FORMAT!r}")
    raise InputError(f"{path}: not a cptsim run config (format {fmt!r}, expected {RUN_FORMAT!r})")


def _executed(lines: JsonLines, path: Path) -> ExecutedSteps:
    by_step: dict[int, dict] = {}
    dup = 0
    for i, rec in enumerate(lines.records):
        fmt = rec.get("format")
        if fmt is not None and fmt != TRACE_LINE_FORMAT:
            raise InputError(f"{path}: line {i + 1} has trace format {fmt!r}, written by a newer cptsim; this one "
                             f"reads {TRACE_LINE_FORMAT!r}")
        missing = [k for k in TRACE_KEYS if k not in rec]
        if missing:
            raise InputError(f"{path}: line {i + 1} lacks {', '.join(missing)} (every step line needs "
                             f"{', '.join(TRACE_KEYS)})")
        step = rec["step"]
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InputError(f"{path}: line {i + 1}: step must be an integer >= 0, got {step!r}")
        if step in by_step:
            dup += 1
        by_step[step] = rec  # the later line is the step that ran last
    steps = sorted(by_step)
    gaps = sorted(set(range(steps[-1] + 1)) - set(steps)) if steps else []
    return ExecutedSteps([by_step[s] for s in steps], lines.truncated, dup, gaps)

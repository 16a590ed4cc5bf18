"""The run directory: the one place that reads and writes its files.

    config.json     everything resolved for the run (format cptsim.run/1)
    plan.json       the plan the run executed, if any (copied verbatim)
    profile.json    per-layer MACs measured in this run
    trace.jsonl     one line per executed step (format in DESIGN.md)
    metrics.jsonl   one line per evaluation
    checkpoint.pt   the last checkpoint, replaced atomically

Every whole-file write goes to a temporary file in the same directory, is fsync'd and then renamed over the
old one, so a kill at any moment leaves either the old or the new file, never half of one. The two .jsonl files
are append-only; a kill can leave a partial last line, which readers report and `truncate_after` removes.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputError

RUN_FORMAT = "cptsim.run/1"

CONFIG = "config.json"
CONFIG_KEYS = {"settings": dict, "schedule": dict, "total_steps": int, "steps_per_epoch": int, "eval_bits": int}
TRACE = "trace.jsonl"
METRICS = "metrics.jsonl"
CHECKPOINT = "checkpoint.pt"
PLAN = "plan.json"
PROFILE = "profile.json"


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


class RunDir:
    """A run directory on disk. `create` for a new run, `open` for an existing one."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

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
        self._append(TRACE, record)

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

    # ---- checkpoint ------------------------------------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        return self.path / CHECKPOINT

    def save_checkpoint(self, state: dict) -> None:
        import io

        import torch

        buf = io.BytesIO()
        torch.save(state, buf)
        atomic_write_bytes(self.checkpoint_path, buf.getvalue())

    def load_checkpoint(self, map_location: Any = "cpu") -> dict | None:
        import torch

        if not self.checkpoint_path.exists():
            return None
        try:
            # weights_only: a checkpoint is data, never code to unpickle.
            return torch.load(self.checkpoint_path, map_location=map_location, weights_only=True)
        except Exception as e:  # torch raises several types for a damaged file
            raise InputError(f"{self.checkpoint_path}: cannot load checkpoint ({type(e).__name__}: {e})") from None

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
        from .planner.planfile import validate_plan

        return validate_plan(plan, str(self.path / PLAN))

    def read_profile(self):
        """The per-layer MAC profile measured in this run (a ``LayerProfile``), or None before its first step."""
        d = self.read_json(PROFILE)
        if d is None:
            return None
        from .profiler import LayerProfile

        try:
            return LayerProfile.from_json(d)
        except InputError as e:
            raise InputError(f"{self.path / PROFILE}: {e}") from None

    def write_bytes(self, name: str, data: bytes) -> Path:
        """Write a whole file (a report's PNG) atomically into the run directory."""
        atomic_write_bytes(self.path / name, data)
        return self.path / name


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
        # language models (cptsim.text_data): perplexity at q_max, lower is better; None for classifiers
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

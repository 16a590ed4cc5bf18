"""TensorBoard scalars of a run, through ``torch.utils.tensorboard`` (``pip install 'cptsim[tensorboard]'``).

What is logged, at the global step (tags are stable; extend, never rename):

    precision/bits, precision/grad_bits      the bits the step ran at
    train/loss, train/lr                     the step's loss and learning rate
    cost/bitops                              cumulative executed BitOPs (the trace's own counts)
    cost/energy_j/<hardware>                 cumulative energy of the executed steps MODELLED on a target profile
                                             (the plan's hardware, else bitfusion): the cost model, not a meter
    test/acc, test/loss, train/epoch_loss, train/epoch_acc, val/acc, val/loss    per evaluation

``TensorBoardLogger`` takes trace and metrics lines (the run directory's own records), so ``cptsim train
--tensorboard`` and ``cptsim.RunRecorder(..., tensorboard=DIR)`` log exactly what they write to the run.
"""

from __future__ import annotations

import atexit
import weakref

from cptsim.errors import InputError
from .rundir import RunDir

DEFAULT_HARDWARE = "bitfusion"
_EPOCH_TAGS = {"test_acc": "test/acc", "test_loss": "test/loss", "train_loss": "train/epoch_loss",
               "train_acc": "train/epoch_acc", "val_acc": "val/acc", "val_loss": "val/loss"}


def require_tensorboard():
    """``torch.utils.tensorboard.SummaryWriter``; InputError (exit 2) naming the extra when tensorboard is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise InputError(f"TensorBoard logging needs the tensorboard package ({e}); install it with "
                         "pip install 'cptsim[tensorboard]'") from None
    return SummaryWriter


def summary_writer(log_dir):
    """A ``SummaryWriter`` on ``log_dir`` (see ``require_tensorboard``)."""
    SummaryWriter = require_tensorboard()
    try:
        return SummaryWriter(log_dir=str(log_dir), flush_secs=10)
    except OSError as e:
        raise InputError(f"--tensorboard {log_dir}: cannot write there ({e.strerror or e})") from None


class TensorBoardLogger:
    """Writes a run's trace and metrics lines as TensorBoard scalars (see the module docstring for the tags).

    ``profile`` (a LayerProfile) is what the modelled energy is computed from; without it, ``run`` is asked for
    its profile.json once the first step has written it. ``hardware``: a profile name or path (default: the
    run's plan hardware, else bitfusion)."""

    def __init__(self, log_dir, run: RunDir | None = None, hardware=None, profile=None):
        from cptsim.cost.hardware import load_profile

        self.hw = load_profile(hardware) if hardware is not None else _plan_hardware(run)
        self.log_dir = str(log_dir)
        self.writer = summary_writer(log_dir)
        self.run, self.profile = run, profile
        self.bitops = None  # cumulative; None until the first step (a resumed run starts from its trace)
        self.energy = 0.0
        self._energy_of: dict[tuple[int, int, int], float] = {}
        self._closed = False
        self._finalizer = weakref.finalize(self, _close_writer, self.writer)
        atexit.register(self._finalizer)

    def _step_energy(self, line: dict) -> float | None:
        """Modelled energy of one step on ``self.hw`` (cached per batch size and bits: a run has few kinds)."""
        if self.profile is None and self.run is not None:
            self.profile = self.run.read_profile()
        if self.profile is None:
            return None
        key = (int(line["batch_size"]), int(line["bits"]), int(line["grad_bits"]))
        e = self._energy_of.get(key)
        if e is None:
            from cptsim.cost.model import estimate

            c = estimate(self.profile, {"batch_size": key[0], "bits": key[1], "grad_bits": key[2]}, self.hw,
                         per_layer=False)
            e = self._energy_of[key] = float(c.energy_j["total"])
        return e

    def _start(self, line: dict) -> None:
        """Cumulative sums of a resumed run start from the steps its trace already holds."""
        self.bitops, self.energy = 0, 0.0
        if self.run is None:
            return
        for r in self.run.read_trace().records:
            if isinstance(r.get("step"), int) and r["step"] < line["step"]:
                self.bitops += sum(int(v) for v in (r.get("bitops") or {}).values())
                self.energy += self._step_energy(r) or 0.0

    def step(self, line: dict) -> None:
        """One trace line (the keys of trace.jsonl)."""
        if self._closed:
            return
        if self.bitops is None:
            self._start(line)
        s, w = int(line["step"]), self.writer
        w.add_scalar("precision/bits", line["bits"], s)
        w.add_scalar("precision/grad_bits", line["grad_bits"], s)
        if line.get("loss") is not None:
            w.add_scalar("train/loss", line["loss"], s)
        if line.get("lr") is not None:
            w.add_scalar("train/lr", line["lr"], s)
        self.bitops += sum(int(v) for v in (line.get("bitops") or {}).values())
        w.add_scalar("cost/bitops", self.bitops, s)
        e = self._step_energy(line)
        if e is not None:
            self.energy += e
            w.add_scalar(f"cost/energy_j/{self.hw.name}", self.energy, s)

    def epoch(self, record: dict) -> None:
        """One metrics line (an evaluation); logged at the step it followed."""
        if self._closed:
            return
        s = int(record.get("step", 0))
        for key, tag in _EPOCH_TAGS.items():
            v = record.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.writer.add_scalar(tag, v, s)
        self.writer.flush()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._finalizer()
            atexit.unregister(self._finalizer)


def _plan_hardware(run: RunDir | None):
    """The hardware the run's plan was made for (its file if still there, else by name), else the default."""
    from cptsim.cost.hardware import load_profile

    plan = run.read_json("plan.json") if run is not None else None
    hw = plan.get("hardware") if isinstance(plan, dict) else None
    for cand in ((hw.get("path"), hw.get("name")) if isinstance(hw, dict) else ()):
        if cand:
            try:
                return load_profile(cand)
            except InputError:
                continue
    return load_profile(DEFAULT_HARDWARE)


def _close_writer(writer) -> None:
    try:
        writer.close()
    except Exception:  # the interpreter is going down; the events written so far are flushed or lost either way
        pass


class LoggedRun(RunDir):
    """A RunDir that also sends every trace and metrics line it appends to a TensorBoardLogger: the one hook
    ``cptsim train --tensorboard`` needs in the training loop (``run = logged_run(run, dir)``)."""

    def __init__(self, run: RunDir, logger: TensorBoardLogger):
        super().__init__(run.path)
        self.logger = logger

    def append_trace(self, record: dict) -> None:
        super().append_trace(record)
        self.logger.step(record)

    def append_metrics(self, record: dict) -> None:
        super().append_metrics(record)
        self.logger.epoch(record)


def logged_run(run: RunDir, log_dir) -> RunDir:
    """``run`` itself without ``log_dir``; else the same run directory, logging to TensorBoard as it is written."""
    if not log_dir:
        return run
    return LoggedRun(run, TensorBoardLogger(log_dir, run=run))


def read_scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in a log directory's event files: tag -> [(step, value)] in step order (tests, notebooks)."""
    from pathlib import Path

    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as e:
        raise InputError(f"reading event files needs the tensorboard package ({e})") from None
    out: dict[str, list[tuple[int, float]]] = {}
    files = sorted(Path(log_dir).rglob("events.out.tfevents.*"))
    if not files:
        raise InputError(f"{log_dir}: no TensorBoard event files")
    for f in files:
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            out.setdefault(tag, []).extend((e.step, float(e.value)) for e in acc.Scalars(tag))
    return {k: sorted(v) for k, v in out.items()}

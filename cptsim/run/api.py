"""cptsim in your own training loop: a precision scheduler and a run recorder.

    import cptsim
    precision = cptsim.quantize_model(model)
    sched = cptsim.PrecisionScheduler(precision, "cpt:3-8:g8:n32", total_steps=T)
    rec = cptsim.RunRecorder("runs/mine", model, sched, config={"dataset": "digits", "batch_size": 64})
    for x, y in loader:
        sched.step()                     # this step's forward / gradient bits, like lr_scheduler.step()
        loss = F.cross_entropy(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
        rec.step(loss=loss.item())       # one trace.jsonl line: bits, MACs and BitOPs measured, time
    with sched.evaluating():             # evaluate at q_max (the bits the trained model is meant for)
        acc = ...
    rec.epoch(test_acc=acc)              # one metrics.jsonl line
    rec.close()

``PrecisionScheduler`` is ``cptsim.run.train``'s schedule lookup without the loop: step t of T gets the schedule's
bits for t. Calling ``step()`` more than ``total_steps`` times is an InputError (the schedule has no bits past
its end: make the scheduler for the number of steps you run, or ``load_state_dict`` a longer one).

``RunRecorder`` writes a normal run directory through ``cptsim.run.rundir`` (config.json, profile.json, trace.jsonl,
metrics.jsonl, and plan.json when given a plan), so ``cptsim report`` reads it as it reads a ``cptsim train`` run.
Each step's MACs are counted by forward hooks (``profiler.MacCounter``) from ``sched.step()`` to ``rec.step()``
and costed with the training loop's formula (``cost.step_cost``); the step time is the wall time between the two.
At the first recorded step the step's op list (``cptsim.measure.opcount``: its norms, activations, optimizer update
and launches) is counted once, as ``cptsim train`` counts it for its profile.json, so that a GPU prices the whole
step and not its GEMMs alone (it takes about one training step's time, once per run, outside every step's time).
A recorder holds the run's lock (``runs.RunLock``) until ``close()``; it never resumes: the trace is one process's
uninterrupted record.
"""

from __future__ import annotations

import contextlib
import math
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from cptsim import __version__
from cptsim.errors import InputError
from cptsim.numerics.layers import QUANTIZED_TYPES, PrecisionState, quantized_layer_names, unquantized_layers
from cptsim.cost.schedules import Schedule, parse_schedule

__all__ = ["PrecisionScheduler", "RunRecorder"]


def _precision_of(model: nn.Module) -> PrecisionState | None:
    """The PrecisionState the model's quantized layers share (None: no quantized layer)."""
    states = {id(m.precision): m.precision for m in model.modules() if isinstance(m, QUANTIZED_TYPES)}
    if len(states) > 1:
        raise InputError("the model's quantized layers follow more than one PrecisionState; quantize it with one "
                         "cptsim.quantize_model(model) call")
    return next(iter(states.values()), None)


def _schedule(schedule) -> Schedule:
    if isinstance(schedule, Schedule):
        return schedule
    if isinstance(schedule, str):
        return parse_schedule(schedule)
    raise InputError(f"schedule must be a cptsim Schedule or its text form (e.g. cpt:3-8:g8:n32), got {schedule!r}")


def _positive_int(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InputError(f"{what} must be a positive integer, got {v!r}")
    return v


class PrecisionScheduler:
    """Sets the bits of each training step on a PrecisionState from a schedule, as ``torch.optim.lr_scheduler``
    sets the learning rate: call ``step()`` once at the start of every training step.

    ``precision``: the PrecisionState ``cptsim.quantize_model`` returned (or the quantized model itself).
    ``schedule``: a Schedule or its text form ("cpt:3-8:g8:n32"). ``total_steps``: the run's length T; the
    schedule's cycles are spread over it. ``step()`` past T raises InputError."""

    def __init__(self, precision, schedule, total_steps: int):
        if isinstance(precision, nn.Module):
            found = _precision_of(precision)
            precision = found if found is not None else PrecisionState()
        if not isinstance(precision, PrecisionState):
            raise InputError("PrecisionScheduler needs the PrecisionState cptsim.quantize_model(model) returned "
                             f"(or the quantized model), got {type(precision).__name__}")
        self.precision = precision
        self.schedule = _schedule(schedule)
        self.total_steps = _positive_int(total_steps, "total_steps")
        self._bits = self.schedule.bits(self.total_steps)
        self._grad_bits = self.schedule.grad_bits(self.total_steps)
        self.last_step = -1  # the step whose bits are set now; -1 before the first step()
        self._listeners: list = []

    def step(self) -> tuple[int, int]:
        """Advance to the next training step and set its bits; returns (forward bits, gradient bits)."""
        t = self.last_step + 1
        if t >= self.total_steps:
            raise InputError(f"PrecisionScheduler.step(): the schedule {self.schedule.to_text()} was made for "
                             f"{self.total_steps} steps and step {t + 1} was asked for; create the scheduler with "
                             "total_steps = the number of training steps you run")
        self.last_step = t
        bits = self.get_bits()
        self.precision.set(*bits)
        for fn in self._listeners:
            fn(t)
        return bits

    def get_bits(self, step: int | None = None) -> tuple[int, int]:
        """(forward bits, gradient bits) of ``step`` (default: the current one; before any step(), step 0's)."""
        t = max(self.last_step, 0) if step is None else step
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.total_steps:
            raise InputError(f"step must be an integer in 0..{self.total_steps - 1}, got {step!r}")
        return int(self._bits[t]), int(self._grad_bits[t])

    @property
    def eval_bits(self) -> int:
        return int(self.schedule.q_max)

    @contextlib.contextmanager
    def evaluating(self, bits: int | None = None):
        """Run the block at the evaluation precision (default q_max, as ``cptsim train`` evaluates), then put the
        current step's bits back."""
        saved = (self.precision.bits, self.precision.grad_bits)
        self.precision.set(self.eval_bits if bits is None else bits, self.schedule.g_max)
        try:
            yield self
        finally:
            self.precision.set(*saved)

    def state_dict(self) -> dict:
        return {"last_step": self.last_step, "schedule": self.schedule.to_text(), "total_steps": self.total_steps}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved position; the schedule and run length must be the saved ones."""
        if not isinstance(state, dict) or not {"last_step", "schedule", "total_steps"} <= set(state):
            raise InputError("not a PrecisionScheduler state_dict (needs last_step, schedule, total_steps)")
        if state["schedule"] != self.schedule.to_text() or state["total_steps"] != self.total_steps:
            raise InputError(f"the saved scheduler ran {state['schedule']} over {state['total_steps']} steps; this "
                             f"one runs {self.schedule.to_text()} over {self.total_steps}")
        t = state["last_step"]
        if isinstance(t, bool) or not isinstance(t, int) or not -1 <= t < self.total_steps:
            raise InputError(f"state_dict last_step must be in -1..{self.total_steps - 1}, got {t!r}")
        self.last_step = t
        if t >= 0:
            self.precision.set(*self.get_bits())


def _model_device(model: nn.Module) -> str:
    p = next(model.parameters(), None)
    return str(p.device) if p is not None else "cpu"


def _read_plan(plan) -> dict:
    from cptsim.run.planfile import read_plan, validate_plan

    if isinstance(plan, (str, Path)):
        return read_plan(plan)
    return validate_plan(plan, "plan")


def _input_watcher(rec: "RunRecorder"):
    def hook(module, args):
        rec._see_input(module, args)
    return hook


def _optimizer_kind(optimizer) -> str:
    """The update rule of ``optimizer`` that the op count knows (``opcount.training_optimizer``): adamw, adam, or
    sgd (also for None and other optimizers: the op list then counts an SGD update in its place)."""
    if isinstance(optimizer, torch.optim.AdamW):  # before Adam: newer torch makes AdamW a subclass of it
        return "adamw"
    return "adam" if isinstance(optimizer, torch.optim.Adam) else "sgd"


def _recorded_dataset(model: nn.Module, name: str, dataset) -> str:
    """RunRecorder's dataset: the one given (checked against the model's kind), else the model's kind's embedded
    one when the model is cptsim's (``cptsim.data.default_dataset``), else "custom"."""
    from cptsim.data.defaults import check_pairing, default_dataset, model_kind

    kind = model_kind(name)
    if kind is None and model_kind(model) == "text":  # a cptsim language model under a name of the user's
        kind, name = "text", model
    if dataset is not None:
        if kind is not None:
            check_pairing(name, str(dataset))
        return str(dataset)
    return default_dataset(name) if kind is not None else "custom"


class RunRecorder:
    """Records a training loop you wrote as a cptsim run directory (see the module docstring).

    ``path``: the new run directory (must not exist, or be empty). ``model``: the (quantized) model, whose
    Conv2d / Linear layers are counted. ``scheduler``: its PrecisionScheduler. ``config``: what describes the run
    (model, dataset, batch_size, lr, seed, train_size, input_shape, ... : any JSON values; ``model`` defaults to
    the model's class name, ``dataset`` to the embedded dataset of the model's kind when the model is one of
    cptsim's (a registry name in ``config["model"]``, or a cptsim language model: pydoc-chars; digits for a
    registered image model), else "custom"; a known dataset of the other kind than a known model is an
    InputError); it lands in config.json's settings.
    ``plan``: a plan (dict or plan.json path) the run executes, so the report compares with it.
    ``optimizer``: its learning rate goes into each trace line. ``tensorboard``: a log directory for
    TensorBoard scalars (``cptsim.run.tensorboard``), modelled energy on ``tensorboard_hw``."""

    def __init__(self, path, model: nn.Module, scheduler: PrecisionScheduler, config: dict | None = None,
                 plan=None, optimizer=None, tensorboard=None, tensorboard_hw: str | None = None):
        from cptsim.measure.profiler import MacCounter
        from .rundir import PLAN, RunDir, RunLock

        if not isinstance(model, nn.Module):
            raise InputError(f"RunRecorder needs the torch model being trained, got {type(model).__name__}")
        if not isinstance(scheduler, PrecisionScheduler):
            raise InputError(f"RunRecorder needs a cptsim.PrecisionScheduler, got {type(scheduler).__name__}")
        config = dict(config or {})
        p = Path(path)
        if p.exists() and (not p.is_dir() or any(p.iterdir())):
            raise InputError(f"{p} already exists and is not empty; a RunRecorder records a new run - give it a new "
                             "directory")
        own = _precision_of(model)
        quantized = quantized_layer_names(model)
        if own is not None and own is not scheduler.precision:
            raise InputError("the scheduler drives a PrecisionState the model's quantized layers do not follow; "
                             "give PrecisionScheduler the state cptsim.quantize_model(model) returned")
        self.notes: list[str] = []
        if not quantized:
            note = (f"{type(model).__name__} has no quantized layers (cptsim.quantize_model was not called, or every "
                    "layer is full precision): every step is recorded at its FP32 cost (32-bit BitOPs)")
            warnings.warn(note, stacklevel=2)
            self.notes.append(note)
        plan_doc = _read_plan(plan) if plan is not None else None
        self.model, self.scheduler, self.optimizer = model, scheduler, optimizer
        self._lock = RunLock.acquire(p)
        try:
            sched = scheduler.schedule
            eval_bits = config.pop("eval_bits", sched.q_max)
            steps_per_epoch = config.pop("steps_per_epoch", None)
            model_name = str(config.pop("model", type(model).__name__))
            settings = {"model": model_name, "dataset": _recorded_dataset(model, model_name, config.pop("dataset", None)),
                        "batch_size": config.pop("batch_size", None),
                        "schedule": sched.to_text(), "device": _model_device(model), **config}
            self._config = {
                "settings": settings,
                "schedule": sched.to_json() | {"text": sched.to_text()},
                "total_steps": scheduler.total_steps,
                "steps_per_epoch": int(steps_per_epoch or scheduler.total_steps),
                "epochs": None, "eval_bits": int(eval_bits),
                "input_shape": config.get("input_shape"), "num_classes": config.get("num_classes"),
                "train_size": config.get("train_size"), "test_size": config.get("test_size"),
                "fp_layers": [n for n, m in model.named_modules()
                              if isinstance(m, (nn.Conv2d, nn.Linear)) and n not in quantized],
                "quantized_layers": quantized, "unquantized_layers": unquantized_layers(model), "world_size": 1,
                "recorded_by": "cptsim.RunRecorder (your own training loop; cptsim train --resume cannot continue it)",
                "notes": self.notes,
                "versions": {"cptsim": __version__, "torch": torch.__version__, "python": platform.python_version()},
                "host": {"machine": platform.machine(), "threads": torch.get_num_threads()},
                "argv": sys.argv, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            fmap = scheduler.precision.formats  # quantize_model(model, number_format=...): a float family
            if fmap is not None:
                settings.update(number_format=fmap.family, grad_format=fmap.grad_format)
                used = fmap.used(list(scheduler._bits) + [int(eval_bits)], scheduler._grad_bits)
                self._config["number_format"] = {**fmap.to_json(), "formats": {
                    k: {str(b): n for b, n in v.items()} for k, v in used.items()}}
            self._spe_given = steps_per_epoch is not None
            from cptsim.run.planfile import run_records

            self._config.update(run_records(sched, plan_doc))  # the plan, and what the report measures savings against
            self.run = RunDir.create(p, self._config)
            if plan_doc is not None:
                self.run.write_json(PLAN, plan_doc)
            self.counter = MacCounter(model, settings["model"])
            # a closure, not a bound method: the op count (and profile_model) deep-copy the model, hooks included,
            # and a bound method would copy the whole recorder (its lock, TensorBoard writer, optimizer) with it
            self._shape_hook = model.register_forward_pre_hook(_input_watcher(self))
            self.tb = None
            if tensorboard:
                from .tensorboard import TensorBoardLogger

                self.tb = TensorBoardLogger(tensorboard, run=self.run, hardware=tensorboard_hw)
        except BaseException:
            self._lock.release()
            raise
        self._input: tuple[int, list[int]] | None = None  # (batch, per-sample shape) of the last training forward
        self._example: torch.Tensor | None = None  # a few samples of that forward, until the op list is counted
        self._step, self._epoch, self._epoch_start_step = 0, 0, 0
        self._t0 = self._t_epoch = time.perf_counter()
        self._profiled = False
        self._lr = None
        self._closed = False
        scheduler._listeners.append(self._begin_step)

    # ---- hooks --------------------------------------------------------------------------------------------------
    def _see_input(self, module, args):
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.dim() >= 1 and module.training:
            self._input = (int(x.shape[0]), [int(s) for s in x.shape[1:]])
            if not self._profiled:
                self._example = x.detach()[:4]

    def _count_ops(self):
        """The step's op list, counted once on copies of the model as ``cptsim train`` counts its own
        (``train._step_ops``: full precision, the RNG forked, the bits put back), or None with a note when it
        cannot be (no example batch seen, or the model's step cannot be run from its first input alone)."""
        from .train import OPS_NOT_COUNTED, _step_ops

        x, seen = self._example, self._input
        ops = None
        if x is not None:
            ops = _step_ops(self.model, x, _model_device(self.model), self.scheduler.precision,
                            _optimizer_kind(self.optimizer))
        self._input, self._example = seen, None  # the copies' forwards passed the hooks too
        if ops is None:
            warnings.warn(OPS_NOT_COUNTED, stacklevel=3)
            self.notes.append(OPS_NOT_COUNTED)
        return ops

    def _begin_step(self, t: int) -> None:
        """sched.step(): the step's work starts here (counts and clock)."""
        self.counter.reset()
        self._lr = self.optimizer.param_groups[0].get("lr") if self.optimizer is not None else None
        self._t0 = time.perf_counter()

    # ---- recording ----------------------------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return self.run.path

    def step(self, loss: float | None = None, batch_size: int | None = None, lr: float | None = None) -> dict:
        """Record the training step just run (after ``sched.step()`` and the step's forward/backward/update):
        one trace.jsonl line. ``batch_size`` defaults to the batch the model last saw in training mode. Returns
        the line."""
        from cptsim.cost.model import step_cost
        from cptsim.measure.profiler import PHASES
        from .rundir import PROFILE

        self._check_open()
        dt = time.perf_counter() - self._t0
        t = self._step
        if self.scheduler.last_step != t:
            raise InputError(f"RunRecorder.step() records step {t}, but the scheduler has set the bits of step "
                             f"{self.scheduler.last_step}; call sched.step() once at the start of every training "
                             "step, and rec.step() once at its end")
        if batch_size is None:
            if self._input is None:
                raise InputError("RunRecorder.step(): no training forward was seen since sched.step(); give "
                                 "batch_size=")
            batch_size = self._input[0]
        batch_size = _positive_int(batch_size, "batch_size")
        if loss is not None:
            if isinstance(loss, torch.Tensor):
                loss = loss.item()
            loss = float(loss)
        prec = self.scheduler.precision
        bits, gbits = prec.bits, prec.grad_bits
        fmap = prec.formats
        if fmap is None:
            executed = step_cost(self.counter.step_arrays(), bits, gbits, batch=1)
        else:  # BitOPs at the formats' element bits, as cptsim train counts them
            executed = step_cost(self.counter.step_arrays(), int(fmap.fwd_element_bits[bits]),
                                 int(fmap.grad_element_bits[gbits]), batch=1)
        if not self._profiled:
            shape = self._config.get("input_shape") or (self._input[1] if self._input else None)
            if not shape:
                raise InputError("RunRecorder: the model's input shape is unknown (no training forward seen); give "
                                 "config={'input_shape': [C, H, W]}")
            prof = self.counter.layer_profile(batch_size, shape)
            prof.ops = self._count_ops()
            self.run.write_json(PROFILE, prof.to_json())
            self._profiled = True
            if prof.ops is None:
                self.run.write_config(self._config)  # its notes say why the profile lacks the op list
            changed = {}
            if self._config["settings"].get("batch_size") is None:
                changed["batch_size"] = batch_size
            if not self._config.get("input_shape"):
                self._config["input_shape"] = list(shape)
                changed["input_shape"] = list(shape)
            if changed:
                self._config["settings"].update({k: v for k, v in changed.items() if k == "batch_size"})
                self.run.write_config(self._config)
        if lr is None:
            lr = self._lr  # the optimizer's at sched.step(): the rate this step ran with
        line = {"step": t, "epoch": self._epoch, "batch_size": batch_size, "bits": bits, "grad_bits": gbits,
                "macs": {p: executed["macs"][p] for p in PHASES}, "bitops": {p: executed["bitops"][p] for p in PHASES}}
        if fmap is not None:
            line["formats"] = {"forward": fmap.fwd_names[bits], "gradient": fmap.grad_names[gbits]}
        if lr is not None:
            line["lr"] = float(lr)
        line["time_s"] = round(dt, 6)
        line["loss"] = loss
        self.run.append_trace(line)
        if self.tb is not None:
            self.tb.step(line)
        self._step += 1
        self.counter.reset()
        self._t0 = time.perf_counter()
        return line

    def epoch(self, **metrics: Any) -> dict:
        """Record an evaluation at the end of an epoch: one metrics.jsonl line with ``metrics`` (test_acc,
        test_loss, train_loss, ... : numbers; test_acc is what the report shows). Returns the line."""
        self._check_open()
        for k, v in metrics.items():
            if isinstance(v, torch.Tensor):
                metrics[k] = v.item()
        rec = {"epoch": self._epoch, "step": self._step, "eval_bits": self._config["eval_bits"], **metrics,
               "epoch_time_s": round(time.perf_counter() - self._t_epoch, 4)}
        self.run.append_metrics(rec)
        if self.tb is not None:
            self.tb.epoch(rec)
        if self._epoch == 0 and not self._spe_given and self._step > 0:  # the epoch length is known now
            self._config["steps_per_epoch"] = self._step
            self._config["epochs"] = math.ceil(self.scheduler.total_steps / self._step)
            self.run.write_config(self._config)
        self._epoch += 1
        self._epoch_start_step = self._step
        self.counter.reset()  # an evaluation run since the last step is not training work
        self._t_epoch = time.perf_counter()
        return rec

    def close(self) -> None:
        """Remove the hooks, close TensorBoard, release the run. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.counter.close()
        self._shape_hook.remove()
        if self._begin_step in self.scheduler._listeners:
            self.scheduler._listeners.remove(self._begin_step)
        if self.tb is not None:
            self.tb.close()
        self._lock.release()

    def _check_open(self) -> None:
        if self._closed:
            raise InputError(f"RunRecorder for {self.run.path} is closed")

    def __enter__(self) -> "RunRecorder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

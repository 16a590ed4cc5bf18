"""The cyclic-precision training loop: read it top to bottom.

`train(config, out)` starts a run, `resume(run_dir)` continues one from its last checkpoint. Each step:
look up this step's bits in the schedule, set them on the shared PrecisionState, run one quantized SGD step,
append one trace line. Each epoch: evaluate at q_max, append one metrics line, replace the checkpoint.

Determinism (what makes a resumed run identical to an uninterrupted one):
* the data order of epoch e comes from a generator seeded by (seed, e), not from a stream carried across epochs;
* the only other randomness (stochastic rounding, augmentation in the main process, dropout) draws from torch's
  global RNG, whose state is saved in the checkpoint;
* the schedule and learning rate are pure functions of the global step.
"""

from __future__ import annotations

import math
import os
import platform
import signal
import sys
import time
from dataclasses import asdict, dataclass, field, fields

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader

from . import __version__
from .errors import InputError
from .runs import RunDir

LR_SCHEDULES = ("step", "cosine", "constant")


@dataclass
class TrainConfig:
    """Everything that defines a training run. Defaults: the embedded digits workload with CPT 3-8 / 8."""

    model: str = "digits-cnn"
    dataset: str = "digits"
    data_dir: str | None = None
    schedule: str = "cpt:3-8:g8:n32"
    epochs: int = 15
    steps: int | None = None  # total steps; overrides epochs when given (the run stops mid-epoch if need be)
    batch_size: int = 64
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    lr_schedule: str = "cosine"
    fp_layers: list[str] | None = None  # None: the model's convention (final classifier in FP32)
    seed: int = 0
    device: str = "cpu"
    workers: int = 0
    augment: bool = True

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise InputError(f"unknown training settings: {', '.join(sorted(unknown))}")
        return cls(**d)

    @classmethod
    def from_plan(cls, plan: dict) -> "TrainConfig":
        """The exact workload and schedule a plan (planner/planfile.py) was made for."""
        from .schedules import Schedule

        w = plan["workload"]
        keys = ("model", "dataset", "data_dir", "batch_size", "steps", "lr", "lr_schedule", "momentum",
                "weight_decay", "seed", "fp_layers", "augment")
        settings = {k: w[k] for k in keys if k in w}
        return cls(schedule=Schedule.from_json(plan["schedule"]).to_text(), **settings)


@dataclass
class Workload:
    """The objects a config resolves to."""

    model: nn.Module
    precision: object
    train_loader_for: object  # epoch -> DataLoader
    test_loader: DataLoader
    info: object
    schedule: object
    bits: list[int]
    grad_bits: list[int]
    steps_per_epoch: int
    total_steps: int
    fp_layers: list[str] = field(default_factory=list)
    quantized_layers: list[str] = field(default_factory=list)


def validate(cfg: TrainConfig) -> None:
    if cfg.epochs < 1:
        raise InputError(f"--epochs must be at least 1, got {cfg.epochs}")
    if cfg.steps is not None and cfg.steps < 1:
        raise InputError(f"--steps must be at least 1, got {cfg.steps}")
    if cfg.batch_size < 1:
        raise InputError(f"--batch-size must be at least 1, got {cfg.batch_size}")
    if not (cfg.lr > 0 and math.isfinite(cfg.lr)):
        raise InputError(f"--lr must be a positive number, got {cfg.lr}")
    if cfg.lr_schedule not in LR_SCHEDULES:
        raise InputError(f"unknown --lr-schedule {cfg.lr_schedule!r}; choose one of {', '.join(LR_SCHEDULES)}")
    if cfg.device not in ("cpu", "cuda") and not cfg.device.startswith("cuda:"):
        raise InputError(f"--device must be cpu or cuda, got {cfg.device!r}")
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError("--device cuda asked for, but PyTorch sees no CUDA device on this machine")
    if cfg.workers < 0:
        raise InputError(f"--workers must be >= 0, got {cfg.workers}")


def lr_factor(kind: str, step: int, total: int) -> float:
    """Learning-rate multiplier at a global step: CPT's step decay (x0.1 at 50% and 75%), cosine, or constant."""
    if kind == "step":
        return 0.1 ** ((step >= 0.5 * total) + (step >= 0.75 * total))
    if kind == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * step / total))
    return 1.0


def build(cfg: TrainConfig) -> Workload:
    """Resolve a config into model, data and schedule. Model init draws from the seeded global RNG."""
    from .data import load_datasets
    from .layers import quantize_model, quantized_layer_names, resolve_fp_layers
    from .models import create_model
    from .schedules import parse_schedule

    validate(cfg)
    schedule = parse_schedule(cfg.schedule)
    train_set, test_set, info = load_datasets(cfg.dataset, cfg.data_dir, augment=cfg.augment)
    torch.manual_seed(cfg.seed)
    model = create_model(cfg.model, num_classes=info.num_classes, in_channels=info.input_shape[0],
                         input_shape=tuple(info.input_shape))
    fp_layers = resolve_fp_layers(model, cfg.fp_layers)
    precision = quantize_model(model, fp_layers=fp_layers)
    model.to(cfg.device)

    steps_per_epoch = math.ceil(len(train_set) / cfg.batch_size)  # the ragged last batch is a step too
    total = cfg.steps if cfg.steps is not None else cfg.epochs * steps_per_epoch
    pin = cfg.device.startswith("cuda")

    def train_loader_for(epoch: int) -> DataLoader:
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + epoch)
        return DataLoader(train_set, batch_size=cfg.batch_size, shuffle=True, generator=g,
                          num_workers=cfg.workers, pin_memory=pin, drop_last=False)

    test_loader = DataLoader(test_set, batch_size=max(cfg.batch_size, 256), shuffle=False,
                             num_workers=cfg.workers, pin_memory=pin)
    return Workload(
        model=model, precision=precision, train_loader_for=train_loader_for, test_loader=test_loader, info=info,
        schedule=schedule, bits=schedule.bits(total).tolist(), grad_bits=schedule.grad_bits(total).tolist(),
        steps_per_epoch=steps_per_epoch, total_steps=total, fp_layers=fp_layers,
        quantized_layers=quantized_layer_names(model),
    )


def resolved_config(cfg: TrainConfig, w: Workload) -> dict:
    """What config.json records: the settings, what they resolved to, and the versions that ran them."""
    return {
        "settings": asdict(cfg),
        "schedule": w.schedule.to_json() | {"text": w.schedule.to_text()},
        "total_steps": w.total_steps,
        "steps_per_epoch": w.steps_per_epoch,
        "epochs": math.ceil(w.total_steps / w.steps_per_epoch),
        "eval_bits": w.schedule.q_max,
        "input_shape": list(w.info.input_shape),
        "num_classes": w.info.num_classes,
        "train_size": len(w.train_loader_for(0).dataset),
        "test_size": len(w.test_loader.dataset),
        "fp_layers": w.fp_layers,
        "quantized_layers": w.quantized_layers,
        "versions": {"cptsim": __version__, "torch": torch.__version__, "python": platform.python_version()},
        "host": {"machine": platform.machine(), "threads": torch.get_num_threads()},
        "argv": sys.argv,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


@torch.no_grad()
def evaluate(w: Workload, device: str) -> tuple[float, float]:
    """Test loss and accuracy at q_max (the precision the trained model is meant to be used at)."""
    w.model.eval()
    w.precision.set(w.schedule.q_max, w.schedule.g_max)
    loss_sum, correct, n = 0.0, 0, 0
    for x, y in w.test_loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        logits = w.model(x)
        loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(1) == y).sum().item()
        n += y.numel()
    return loss_sum / n, correct / n


def _fault_step() -> int | None:
    """Test hook: CPTSIM_FAULT_KILL_AT_STEP=k sends this process SIGKILL as step k begins (crash-safety tests)."""
    v = os.environ.get("CPTSIM_FAULT_KILL_AT_STEP")
    return int(v) if v else None


def train(cfg: TrainConfig, out: str, progress: bool = True, plan: dict | None = None) -> RunDir:
    """Start a new run in directory `out` (which must not exist or be empty) and train it to the end.

    With `plan`, the run records the plan it executed (a copy as plan.json, its digest in config.json).
    """
    from .runs import PLAN

    w = build(cfg)
    config = resolved_config(cfg, w)
    if plan is not None:
        from .planner.planfile import plan_digest

        config["plan"] = {"digest": plan_digest(plan), "schedule": plan["schedule"], "budget": plan.get("budget")}
    run = RunDir.create(out, config)
    if plan is not None:
        run.write_json(PLAN, plan)
    return _loop(cfg, w, run, start_step=0, progress=progress)


def resume(run_path: str, progress: bool = True) -> RunDir:
    """Continue a run from its last checkpoint; trace lines after the checkpoint are dropped and re-run."""
    run = RunDir.open(run_path)
    cfg = TrainConfig.from_dict(run.read_config()["settings"])
    w = build(cfg)
    ckpt = run.load_checkpoint(map_location=cfg.device)
    start = 0
    if ckpt is not None:
        w.model.load_state_dict(ckpt["model"])
        start = int(ckpt["step"])
    run.truncate_after(start)
    return _loop(cfg, w, run, start_step=start, progress=progress, ckpt=ckpt)


def _loop(cfg: TrainConfig, w: Workload, run: RunDir, start_step: int, progress: bool, ckpt: dict | None = None):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from rich.console import Console

    from .cost import step_cost
    from .profiler import MacCounter
    from .runs import PROFILE

    device = cfg.device
    model = w.model
    # Counts the MACs each step executes (forward hooks reading shapes; ~0.1% of a resnet20 step).
    counter = MacCounter(model, cfg.model)
    need_profile = run.read_json(PROFILE) is None
    # Weight decay on every parameter, as in CPT's code.
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if ckpt is not None:
        opt.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        if device.startswith("cuda") and ckpt["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
    kill_at = _fault_step()
    T, spe = w.total_steps, w.steps_per_epoch
    if start_step >= T:
        return run  # already complete: nothing to run, nothing to append
    first_epoch = start_step // spe
    n_epochs = math.ceil(T / spe)

    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn()]
    with Progress(*columns, console=Console(stderr=True), disable=not progress, transient=False) as bar:
        task = bar.add_task("train", total=T, completed=start_step, info="")
        step = start_step
        for epoch in range(first_epoch, n_epochs):
            model.train()
            loader = w.train_loader_for(epoch)
            loss_sum, correct, seen = 0.0, 0, 0
            t_epoch = time.perf_counter()
            for x, y in loader:
                if step >= T:
                    break
                if kill_at is not None and step == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                t0 = time.perf_counter()
                bits, gbits = w.bits[step], w.grad_bits[step]
                w.precision.set(bits, gbits)
                lr = cfg.lr * lr_factor(cfg.lr_schedule, step, T)
                for group in opt.param_groups:
                    group["lr"] = lr
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                counter.reset()
                logits = model(x)
                loss = F.cross_entropy(logits, y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                loss_v = loss.item()
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                n = y.numel()
                loss_sum += loss_v * n
                correct += (logits.detach().argmax(1) == y).sum().item()
                seen += n
                executed = step_cost(counter.step_arrays(), bits, gbits, batch=1)  # the cost model's own formula
                if need_profile:
                    run.write_json(PROFILE, counter.layer_profile(n, w.info.input_shape).to_json())
                    need_profile = False
                run.append_trace({"step": step, "epoch": epoch, "batch_size": n, "bits": bits, "grad_bits": gbits,
                                  "macs": executed["macs"], "bitops": executed["bitops"],
                                  "lr": lr, "time_s": round(dt, 6), "loss": loss_v})
                if not math.isfinite(loss_v):
                    raise InputError(
                        f"loss became {loss_v} at step {step} (bits {bits}, grad bits {gbits}); the last good "
                        f"checkpoint is kept in {run.path} - resume with --resume {run.path}, or train again with "
                        "a higher q_min or lower --lr")
                step += 1
                bar.update(task, advance=1, description=f"epoch {epoch + 1}/{n_epochs}",
                           info=f"loss {loss_v:.3f}  bits {bits}/{gbits}")

            counter.enabled = False  # evaluation is not training work
            test_loss, test_acc = evaluate(w, device)
            counter.enabled = True
            run.append_metrics({"epoch": epoch, "step": step, "eval_bits": w.schedule.q_max,
                                "train_loss": loss_sum / max(seen, 1), "train_acc": correct / max(seen, 1),
                                "test_loss": test_loss, "test_acc": test_acc,
                                "epoch_time_s": round(time.perf_counter() - t_epoch, 4)})
            bar.update(task, info=f"test acc {test_acc:.3f} @ {w.schedule.q_max} bits")
            run.save_checkpoint({
                "step": step, "epoch": epoch + 1, "model": model.state_dict(), "optimizer": opt.state_dict(),
                "rng": {"torch": torch.get_rng_state(),
                        "cuda": torch.cuda.get_rng_state_all() if device.startswith("cuda") else None},
            })
            if step >= T:
                break
    return run

"""Cyclic precision training in PyTorch Lightning: ``CPTCallback`` (``pip install 'cptsim[lightning]'``).

    from cptsim.run.integrations.lightning import CPTCallback
    trainer = L.Trainer(max_epochs=15, callbacks=[CPTCallback("cpt:3-8:g8:n32", run_dir="runs/lit")])
    trainer.fit(module, train_loader, val_loader)
    # then: cptsim report runs/lit

What it does, with ``cptsim.run.api`` underneath: at fit start it quantizes the LightningModule's Conv2d / Linear
layers (unless they already are; the last Linear stays FP32, as ``cptsim.quantize_model``), spreads the schedule
over ``trainer.estimated_stepping_batches``, and opens a ``RunRecorder`` on ``run_dir``. Every training batch sets
its bits first and is recorded after (bits, measured MACs and BitOPs, time, loss); validation runs at q_max;
every training epoch's end records one metrics line from ``trainer.callback_metrics`` (``metric``, default
"val_acc", is also written as test_acc, the figure ``cptsim report`` shows). One recorded step per batch: use it
with ``accumulate_grad_batches=1`` and one optimizer.
"""

from __future__ import annotations

from typing import Any

from cptsim.errors import InputError

try:
    from lightning.pytorch import Callback
except ImportError:  # the standalone package, or neither
    try:
        from pytorch_lightning import Callback
    except ImportError as e:
        raise ImportError(f"cptsim.run.integrations.lightning needs PyTorch Lightning ({e}); install it with "
                          "pip install 'cptsim[lightning]'") from None


def _batch_size(batch) -> int | None:
    import torch

    x = batch[0] if isinstance(batch, (list, tuple)) and batch else batch
    if isinstance(x, dict):
        x = next(iter(x.values()), None)
    return int(x.shape[0]) if isinstance(x, torch.Tensor) and x.dim() > 0 else None


def _loss(outputs) -> float | None:
    import torch

    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    if isinstance(outputs, torch.Tensor):
        return float(outputs.detach().item())
    return float(outputs) if isinstance(outputs, (int, float)) else None


class CPTCallback(Callback):
    """Runs a LightningModule's training at a precision schedule and records it as a cptsim run directory.

    ``schedule``: text form or Schedule. ``run_dir``: the new run directory. ``config``: what describes the run
    (model, dataset, train_size, ...: config.json settings). ``plan``: a plan the run executes. ``tensorboard``:
    a TensorBoard log directory (``cptsim.run.tensorboard``). ``fp_layers``: layers kept FP32 when the callback
    quantizes (None: the last Linear). ``metric``: the callback metric recorded as test_acc."""

    def __init__(self, schedule, run_dir, config: dict | None = None, plan=None, tensorboard=None,
                 fp_layers: list[str] | None = None, metric: str = "val_acc"):
        super().__init__()
        if not run_dir:
            raise InputError("CPTCallback needs run_dir=: the new run directory to record into")
        self.schedule, self.run_dir, self.config = schedule, run_dir, dict(config or {})
        self.plan, self.tensorboard, self.fp_layers, self.metric = plan, tensorboard, fp_layers, metric
        self.scheduler = self.recorder = None
        self._eval = None

    # ---- fit ----------------------------------------------------------------------------------------------------
    def on_fit_start(self, trainer, pl_module) -> None:
        from cptsim.run.api import PrecisionScheduler, RunRecorder, _precision_of
        from cptsim.numerics.layers import quantize_model

        if getattr(trainer, "accumulate_grad_batches", 1) != 1:
            raise InputError("CPTCallback records one step per batch: use accumulate_grad_batches=1")
        precision = _precision_of(pl_module)
        if precision is None:
            precision = quantize_model(pl_module, fp_layers=self.fp_layers)
        total = trainer.estimated_stepping_batches
        if not isinstance(total, int) or total < 1:
            raise InputError(f"CPTCallback needs a finite number of training steps (max_epochs or max_steps); "
                             f"Lightning estimates {total}")
        self.scheduler = PrecisionScheduler(precision, self.schedule, total_steps=total)
        config = {"model": type(pl_module).__name__, "dataset": "custom", **self.config}
        opts = trainer.optimizers
        self.recorder = RunRecorder(self.run_dir, pl_module, self.scheduler, config=config, plan=self.plan,
                                    optimizer=opts[0] if opts else None, tensorboard=self.tensorboard)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.scheduler is not None and self.scheduler.last_step + 1 < self.scheduler.total_steps:
            self.scheduler.step()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        rec = self.recorder
        if rec is None or self.scheduler.last_step != rec._step:
            return  # past the schedule's end (Lightning ran more batches than it estimated): nothing to record
        rec.step(loss=_loss(outputs), batch_size=_batch_size(batch))

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self.recorder is None:
            return
        metrics: dict[str, Any] = {}
        for k, v in trainer.callback_metrics.items():
            try:
                metrics[str(k).replace("/", "_")] = float(v)
            except (TypeError, ValueError):
                continue
        if self.metric in trainer.callback_metrics and "test_acc" not in metrics:
            metrics["test_acc"] = float(trainer.callback_metrics[self.metric])
        self.recorder.epoch(**metrics)

    # ---- validation at the evaluation precision -----------------------------------------------------------------
    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        if self.scheduler is not None:
            self._eval = self.scheduler.evaluating()
            self._eval.__enter__()

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if self._eval is not None:
            self._eval.__exit__(None, None, None)
            self._eval = None

    # ---- the end ------------------------------------------------------------------------------------------------
    def on_fit_end(self, trainer, pl_module) -> None:
        self._close()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._close()

    def _close(self) -> None:
        if self.recorder is not None:
            self.recorder.close()

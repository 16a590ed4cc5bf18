"""The workload a plan is made for: model, data, run length, and the measured per-layer profile of its quantized
model (``Workload.build``); ``Workload.estimate`` costs a schedule on it with the one cost model."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from cptsim.errors import InputError
from cptsim.cost.runlength import RunLength
from cptsim.cost.schedules import Schedule

__all__ = ["Workload"]


@dataclass
class Workload:
    """What is being trained: model, data, run length, and the measured per-layer profile of its quantized model.

    ``steps`` is the exact number of optimizer steps; ``dataset_size`` (samples per epoch) makes the ragged last
    batch of every epoch part of the cost, exactly as ``cptsim train`` executes it; ``dataset_size_from`` says
    where that number came from ("data": counted in the data at hand; "--dataset-size": given; "nominal": the
    registry's size of the full dataset, the data not being there to count). Build with ``Workload.build``.
    """

    model: str
    dataset: str
    batch_size: int
    steps: int
    profile: Any  # cptsim.measure.profiler.LayerProfile
    input_shape: tuple[int, ...]
    num_classes: int
    dataset_size: int | None = None
    data_dir: str | None = None
    epochs: int | None = None
    fp_layers: list[str] = field(default_factory=list)
    lr: float = 0.1
    lr_schedule: str = "cosine"
    momentum: float = 0.9
    weight_decay: float = 5e-4
    seed: int = 0
    augment: bool = True
    profile_s: float = 0.0
    dataset_size_from: str | None = None
    image_size: int | None = None  # imagefolder's input side as resolved (cptsim.data.resolve_image_size)
    channels_last: bool = False  # the step's memory format (NHWC): a GPU prices its convolutions and norms by it
    optimizer: str = "sgd"  # sgd | adam | adamw: Adam's update is in the step's op list
    lr_min: float = 0.0  # the cosine's floor, recorded for training
    quant_agg: bool = False  # graph models: the aggregation quantized too (its BitOPs at the step's widths)
    graph_edges: int | None = None  # a graph dataset: the directed edges its model aggregates over (no self-loops)
    # number formats (cptsim.numerics.families): the family the widths name and the gradient format;
    # every estimate of this workload prices them (``formats``), and the run trains in them
    number_format: str = "int"
    grad_format: str | None = None

    @property
    def formats(self):
        """The ``FormatMap`` of ``number_format`` / ``grad_format`` (None: integers, today's costs)."""
        from cptsim.numerics.families import format_map

        key = (self.number_format, self.grad_format)
        cached = self.__dict__.get("_formats")
        if cached is None or cached[0] != key:
            cached = self.__dict__["_formats"] = (key, format_map(*key))
        return cached[1]

    @classmethod
    def build(cls, model: str = "digits-cnn", dataset: str | None = None, data_dir: str | None = None,
              batch_size: int | None = None, epochs: int | None = None, steps: int | None = None,
              dataset_size: int | None = None, fp_layers: list[str] | None = None, lr: float | None = None,
              lr_schedule: str = "cosine", momentum: float = 0.9, weight_decay: float = 5e-4, seed: int = 0,
              augment: bool = True, image_size: int | None = None, channels_last: bool = False,
              optimizer: str | None = None, lr_min: float | None = None, quant_agg: bool = False,
              number_format: str = "int", grad_format: str | None = None) -> "Workload":
        """Resolve the workload without loading data (``dataset_info``), and profile one real training step of the
        model quantized as ``cptsim train`` will quantize it (``fp_layers``: None = the model's convention).

        Give ``epochs`` (steps = epochs x ceil(N / B)) or ``steps``; neither means the recipe's epochs (15; a graph's
        200). batch_size, lr, optimizer, lr_min: None = the dataset's recipe (``cptsim.run.config.recipe``). N is the size of the
        data training will run over: counted in ``data_dir`` (or the embedded set) when it is there
        (``cptsim.data.epoch_size``), else ``dataset_size``, else the dataset's nominal size. A ``dataset_size``
        that contradicts the data found is an InputError: the plan would cost a run other than the one trained.

        A graph (its DataInfo has ``graph_edges``) is one sample, trained full-batch (``batch_size`` 1): its model is
        profiled on a seeded random structure with the graph's own node and edge counts, which is exact, since a
        step's work depends on those counts and the widths, not on which nodes are joined."""
        from cptsim.data import dataset_info, default_dataset, epoch_size
        from cptsim.measure.profiler import profile_named_model
        from cptsim.run.config import TrainConfig, recipe, validate

        if dataset is None:  # the embedded dataset of the model's kind
            dataset = default_dataset(model)
        if epochs is not None and steps is not None:
            raise InputError("give --epochs or --steps, not both")
        r = recipe(dataset, batch_size=batch_size, optimizer=optimizer, lr=lr, lr_min=lr_min)
        batch_size, optimizer, lr, lr_min = r["batch_size"], r["optimizer"], r["lr"], r["lr_min"]
        for flag, v in (("--epochs", epochs), ("--steps", steps), ("--batch-size", batch_size),
                        ("--dataset-size", dataset_size)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise InputError(f"{flag} must be a positive integer, got {v!r}")
        validate(TrainConfig(model=model, dataset=dataset, batch_size=batch_size, lr=lr, lr_schedule=lr_schedule,
                             steps=steps, image_size=image_size, optimizer=optimizer, lr_min=lr_min,
                             quant_agg=quant_agg, number_format=number_format, grad_format=grad_format))
        info = dataset_info(dataset, data_dir, image_size)
        n, n_from = epoch_size(dataset, data_dir, dataset_size)
        if steps is None:
            epochs = r["epochs"] if epochs is None else epochs
            if n is None:
                raise InputError(f"{dataset}: the epoch size is unknown without loading the data; "
                                 "give --dataset-size N or --steps T")
            steps = RunLength(batch_size, n).epoch_steps(epochs)
        shape = tuple(int(s) for s in info.input_shape)
        t0 = time.perf_counter()
        edges = getattr(info, "graph_edges", None)  # a graph: profiled on random structures of its sizes
        prof = profile_named_model(model, shape, info.num_classes, fp_layers, graph_edges=edges, optimizer=optimizer,
                                   quant_agg=quant_agg, channels_last=channels_last)
        resolved = prof.fp_layers
        return cls(model=model, dataset=info.name, batch_size=batch_size, steps=steps, profile=prof,
                   input_shape=shape, num_classes=info.num_classes, dataset_size=n, data_dir=data_dir,
                   epochs=epochs, fp_layers=list(resolved), lr=lr, lr_schedule=lr_schedule, momentum=momentum,
                   weight_decay=weight_decay, seed=seed, augment=augment, profile_s=time.perf_counter() - t0,
                   dataset_size_from=n_from, image_size=shape[-1] if info.name == "imagefolder" else None,
                   channels_last=bool(channels_last), optimizer=optimizer, lr_min=float(lr_min),
                   quant_agg=bool(quant_agg), graph_edges=edges,
                   number_format=str(number_format).strip().lower(), grad_format=grad_format)

    @property
    def run_length(self) -> RunLength:
        """The run's steps and batches: steps per epoch, the ragged last batch and the steps that hold it."""
        return RunLength(self.batch_size, self.dataset_size, self.steps)

    @property
    def ragged(self) -> tuple[int, int] | None:
        """(steps per epoch, samples in the last batch) when the last batch of an epoch is short, else None."""
        return self.run_length.ragged

    def describe(self) -> str:
        ep = ""
        if self.dataset_size:
            # A nominal size is the full dataset's, the data not being at hand to count: say so, since
            # 'cptsim train --plan' will refuse the plan if the data it finds holds another number of samples.
            nominal = ", nominal: not counted" if self.dataset_size_from == "nominal" else ""
            ep = f" ({self.steps * self.batch_size / self.dataset_size:.3g} epochs{nominal})" if self.epochs is None \
                else f" ({self.epochs} epochs of {self.dataset_size}{nominal})"
        return f"{self.model} on {self.dataset}, {self.steps} steps x batch {self.batch_size}{ep}"

    def to_json(self) -> dict:
        """The plan's workload section: what TrainConfig.from_plan reads to run exactly this."""
        return {"model": self.model, "dataset": self.dataset, "data_dir": self.data_dir,
                "batch_size": self.batch_size, "steps": self.steps, "epochs": self.epochs,
                "dataset_size": self.dataset_size, "dataset_size_from": self.dataset_size_from,
                "input_shape": list(self.input_shape),
                "num_classes": self.num_classes, "fp_layers": list(self.fp_layers), "lr": self.lr,
                "lr_schedule": self.lr_schedule, "momentum": self.momentum, "weight_decay": self.weight_decay,
                "seed": self.seed, "augment": self.augment, "image_size": self.image_size,
                # only when set: a plan (and its workload key) for the default NCHW, SGD, ... stays as it was
                **({"channels_last": True} if self.channels_last else {}),
                **({"optimizer": self.optimizer} if self.optimizer != "sgd" else {}),
                **({"lr_min": self.lr_min} if self.lr_min else {}),
                **({"quant_agg": True} if self.quant_agg else {}),
                **({"number_format": self.number_format, "grad_format": self.grad_format}
                   if self.formats is not None else {})}

    def step_costs(self, hardware):
        """The ``cptsim.cost.StepCosts`` of this workload's profile on ``hardware`` (a HardwareProfile object):
        one-step costs per kind of step, computed once per workload and hardware and shared by ``evaluate``'s
        tables and every ``estimate`` of this workload on that hardware. Kept while the profile is this one."""
        from cptsim.cost.model import StepCosts

        cache = self.__dict__.setdefault("_step_costs", {})
        hit = cache.get(id(hardware))
        if hit is None or hit.hardware is not hardware or hit.source is not self.profile:
            hit = cache[id(hardware)] = StepCosts(self.profile, hardware, formats=self.formats)
        return hit

    def estimate(self, schedule: Schedule, hardware, per_layer: bool = False, static_bits: int | None = None,
                 step_kinds: tuple | None = None):
        """``cptsim.cost.estimate`` of this workload run with ``schedule``: the one cost model (the numbers of a
        call without ``step_costs``; a hardware profile object shares this workload's ``step_costs``).
        ``step_kinds``: the schedule's steps by kind when counted already (``Candidates.step_kinds``)."""
        from cptsim.cost.model import estimate

        shared = None if hardware is None or isinstance(hardware, str) else self.step_costs(hardware)
        return estimate(self.profile, schedule, hardware, steps=self.steps, batch_size=self.batch_size,
                        dataset_size=self.dataset_size, per_layer=per_layer, static_bits=static_bits,
                        step_costs=shared, step_kinds=step_kinds, formats=self.formats)

    def estimate_totals(self, schedule: Schedule, hardware, step_kinds: tuple | None = None) -> dict:
        """``cptsim.cost.estimate_totals``: the totals ``estimate`` gives (bitops, energy_j, latency_s), alone."""
        from cptsim.cost.model import estimate_totals

        shared = None if hardware is None or isinstance(hardware, str) else self.step_costs(hardware)
        return estimate_totals(self.profile, schedule, hardware, steps=self.steps, batch_size=self.batch_size,
                               dataset_size=self.dataset_size, step_costs=shared, step_kinds=step_kinds,
                               formats=self.formats)

"""A run's configuration: ``TrainConfig`` (everything that defines a training run) and ``validate``.

Apart from the training loop so that the planner, which must check a workload before it plans for it, can import
what a run is without importing the loop that runs it (imports run down the data flow: the planner comes before
the run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from cptsim.errors import InputError

LR_SCHEDULES = ("step", "cosine", "constant")
OPTIMIZERS = ("sgd", "adam", "adamw")  # built and counted by cptsim.measure.opcount.training_optimizer


@dataclass
class TrainConfig:
    """Everything that defines a training run. Defaults: the embedded digits workload with CPT 3-8 / 8; with no
    ``dataset``, the embedded dataset of the model's kind (``cptsim.data.default_dataset``: pydoc-chars for a
    language model, digits otherwise)."""

    model: str = "digits-cnn"
    dataset: str | None = None  # None: the model's kind's embedded dataset, resolved on construction
    data_dir: str | None = None
    schedule: str = "cpt:3-8:g8:n32"
    epochs: int | None = None  # None: the dataset's recipe (``recipe``): 15, or 200 for a graph
    steps: int | None = None  # total steps; overrides epochs when given (the run stops mid-epoch if need be)
    batch_size: int | None = None  # None: 1 for a graph (full batch: the sample is the whole graph), else 64
    lr: float | None = None  # None: the recipe's, 0.1 (SGD), or 1e-3 for a graph (Adam)
    momentum: float = 0.9
    weight_decay: float = 5e-4
    lr_schedule: str = "cosine"
    # sgd (with momentum, CPT's CIFAR recipe), adam or adamw (cpt_gnn's graph recipe: Adam); the momentum setting is
    # SGD's alone. lr_min: the cosine schedule's floor (torch's CosineAnnealingLR eta_min; cpt_gnn anneals to 0.1 x lr)
    optimizer: str | None = None  # None: the recipe's, sgd, or adam for a graph
    lr_min: float | None = None  # None: the recipe's, 0, or 0.1 x lr for a graph
    # graph models: quantize the message passing's aggregation too (its inputs at the step's bits, the error into it
    # at the gradient bits), as cpt_gnn's quant_agg; off by default, as there (cptsim.numerics.graph_layers)
    quant_agg: bool = False
    fp_layers: list[str] | None = None  # None: the model's convention (final classifier in FP32)
    seed: int = 0
    device: str = "cpu"
    workers: int = 0
    augment: bool = True
    # steps between checkpoints (and one at every epoch's end); None: at epochs' ends, paced so that writing them
    # stays under ~5% of the run's time (cptsim.run.train._CheckpointPacer), and at the last step
    checkpoint_every: int | None = None
    keep_checkpoints: int = 2  # checkpoints kept (newest first): older ones are the fallback for a damaged one
    threads: int | None = None  # CPU threads for torch; None: auto (see cpu_threads)
    # Evaluation (see `evaluate`): the precision the model is evaluated at (None: the schedule's q_max), how many
    # training batches re-estimate BatchNorm statistics and activation ranges at that precision first (0: none),
    # and the fraction of the training set held out as a validation split (0: evaluate on the test split only).
    eval_bits: int | None = None
    recal_batches: int = 16
    val_split: float = 0.0
    channels_last: bool = False  # NHWC activations and weights (faster convolutions on tensor-core GPUs)
    tensorboard: str | None = None  # also log the trace and metrics here as TensorBoard scalars (cptsim.run.tensorboard)
    # imagefolder: side of the square input (None: the images' own size when they share one, else 224); config.json
    # records the size resolved, so a resumed run, the plan and the report see the same input shape.
    image_size: int | None = None
    # a per-layer plan: the layer schedule's JSON (cptsim.cost.layerplan: {"format", "rules": ["GLOB=SPEC", ...]});
    # None: every quantized layer runs the schedule's bits
    layer_schedule: dict | None = None
    # number formats (cptsim.numerics.families): the family the schedule's widths name (int: CPT's
    # integers, the default path; fp | mx | nvfp: float formats, fake-quantized in FP32) and the gradient format
    # (a float family only; None: gradients map through the family like the forward operands)
    number_format: str = "int"
    grad_format: str | None = None

    def __post_init__(self) -> None:
        if self.dataset is None:
            from cptsim.data import default_dataset

            self.dataset = default_dataset(self.model)
        fill_recipe(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise InputError(f"unknown training settings: {', '.join(sorted(unknown))}")
        return cls(**d)

    @classmethod
    def from_plan(cls, plan: dict, **overrides) -> "TrainConfig":
        """The exact workload and schedule a plan (cptsim/run/planfile.py) was made for.

        ``overrides`` replace settings that do not change what the plan costs (seed, lr, momentum, weight_decay,
        lr_schedule, augment, data_dir: a sweep over seeds of one plan) and the run-time ones (device, workers,
        threads, ...). One that would change the cost (``PLAN_FIXED``: model, dataset, schedule, batch size, run
        length, full-precision layers) is an InputError unless it equals the plan's value: re-plan instead."""
        from cptsim.cost.schedules import Schedule

        w = plan["workload"]
        keys = ("model", "dataset", "data_dir", "batch_size", "steps", "lr", "lr_schedule", "momentum",
                "weight_decay", "seed", "fp_layers", "augment", "image_size", "channels_last", "optimizer",
                "lr_min", "quant_agg", "number_format", "grad_format")
        settings = {k: w[k] for k in keys if k in w}
        settings["schedule"] = Schedule.from_json(plan["schedule"]).to_text()
        if isinstance(plan.get("layers"), dict):  # a per-layer plan: its rules, resolved again on the model
            settings["layer_schedule"] = {k: plan["layers"][k] for k in ("format", "rules", "model")
                                          if plan["layers"].get(k) is not None}
        if w.get("epochs") is not None:  # recorded for the reader; the plan's steps decide the run length
            settings["epochs"] = w["epochs"]
        ev = plan.get("evaluation")
        if isinstance(ev, dict) and isinstance(ev.get("recal_batches"), int):  # how the planner expects it judged
            settings["recal_batches"] = ev["recal_batches"]
        planned = settings | {"epochs": w.get("epochs")}
        changed = [k for k in PLAN_FIXED if k in overrides and overrides[k] != planned.get(k)]
        if changed:
            raise InputError("a plan fixes what it costs: " + ", ".join(
                f"--{k.replace('_', '-')} {overrides[k]} differs from the plan's {planned.get(k)}" for k in changed)
                + "; re-plan with those settings instead")
        return cls.from_dict(settings | {k: v for k, v in overrides.items() if k not in PLAN_FIXED})


# ---- the workload key ----------------------------------------------------------------------------------------------
#
# What makes two runs the same workload: seed and schedule are what vary across a sweep; device, threads and
# workers change where and how fast it runs, not what it computes. The key is built here, from the workload as
# resolved (a plan's workload section, a run's config.json), by ``workload_key`` alone: the planner (``plan
# --quality db`` looks runs up by it), a run (config.json records it), a sweep and the results database
# (``cptsim.study.results``) all call it, so one workload has one key.
WORKLOAD_KEYS = ("model", "dataset", "dataset_size", "batch_size", "steps", "lr", "lr_schedule", "momentum",
                 "weight_decay", "fp_layers", "augment")
# Keyed only where they differ from the value every workload had before they were keyed, so that the keys of
# workloads without them (every database written until then) stay what they were.
EVAL_DEFAULTS = {"eval_bits": None, "recal_batches": 16}  # TrainConfig's: the schedule's q_max, 16 batches
# the optimizer (Adam's update is counted work, and another recipe is another workload), the cosine floor and the
# aggregation's quantization (graph models' BitOPs): keyed, like EVAL_DEFAULTS, only away from TrainConfig's default
RECIPE_DEFAULTS = {"optimizer": "sgd", "lr_min": 0, "quant_agg": False,
                   # number formats: keyed only away from int, so an integer run keeps the key it always had
                   "number_format": "int", "grad_format": None}
FOLDER_DATASETS = ("imagefolder",)  # the data are the user's folder: its path and class count are the workload's


def _num(v):
    """Numbers in one spelling (JSON writes floats by repr): an integral float (5.0) as the int 5."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, (int, float)):
        f = float(v)
        if math.isfinite(f) and f == int(f) and abs(f) < 2**53:
            return int(f)
        return f
    return v


def canonical_dataset(name):
    """The registry's own name of a dataset (``synthetic:1,8,8:4`` -> ``synthetic:1,8,8:4:1024``), lower case;
    a name the registry does not know is kept as given (lower case), so an old row still has a key."""
    if not isinstance(name, str):
        return name
    from cptsim.data import nominal_info

    try:
        return nominal_info(name).name
    except InputError:
        return name.strip().lower()


def workload_settings(settings: dict) -> dict:
    """The workload-defining settings of ``settings`` (a plan's workload, a sweep's, or ``run_workload`` of a run's
    config.json), in one normal form: ``WORKLOAD_KEYS`` (missing ones None; ``fp_layers`` the resolved list of
    full-precision layer names, sorted; the dataset by its registry name), and where they matter:
    ``image_size`` (imagefolder's resolved side), ``data_dir`` and ``num_classes`` (imagefolder: the folder is
    the data), ``eval_bits`` and ``recal_batches`` (how a run is evaluated) when not the defaults."""
    if not isinstance(settings, dict):
        raise InputError(f"workload settings must be a dict, got {type(settings).__name__}")
    out: dict = {}
    for k in WORKLOAD_KEYS:
        v = settings.get(k)
        if k == "dataset":
            v = canonical_dataset(v)
        elif k in ("model", "lr_schedule") and isinstance(v, str):
            v = v.strip().lower()
        elif k == "fp_layers" and v is not None:
            v = sorted(str(x) for x in v)
        elif k == "augment" and v is not None:
            v = bool(v)
        else:
            v = _num(v)
        out[k] = v
    folder = out["dataset"] in FOLDER_DATASETS
    if folder and settings.get("image_size") is not None:  # another resolution is another workload; any other
        out["image_size"] = _num(settings["image_size"])    # dataset has one fixed size, whatever --image-size said
    if folder:
        d = settings.get("data_dir")
        out["data_dir"] = str(Path(d).expanduser().resolve()) if d else None
        out["num_classes"] = _num(settings.get("num_classes"))
    for k, default in (EVAL_DEFAULTS | RECIPE_DEFAULTS).items():
        v = settings.get(k)
        v = v.strip().lower() if isinstance(v, str) else _num(v)
        if v is not None and v != default:
            out[k] = v
    return out


def workload_key(settings: dict) -> str:
    """A stable key for a workload: 16 hex digits of sha256 over ``workload_settings(settings)``.

    ``workload_key(plan["workload"])`` and the key of a run trained from that plan agree: both use the
    registry's dataset name, the real dataset size, the exact step count and the resolved full-precision layers."""
    import hashlib
    import json

    canon = json.dumps(workload_settings(settings), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


def run_workload(config: dict) -> dict:
    """The workload settings of a run, from its config.json as ``cptsim.run.train.resolved_config`` writes it
    (resolved values: real steps, size, fp layers, class count, image size)."""
    s = config["settings"]
    return workload_settings({
        "model": s.get("model"), "dataset": s.get("dataset"), "dataset_size": config.get("train_size"),
        "batch_size": s.get("batch_size"), "steps": config.get("total_steps"), "lr": s.get("lr"),
        "lr_schedule": s.get("lr_schedule"), "momentum": s.get("momentum"),
        "weight_decay": s.get("weight_decay"),
        "fp_layers": config.get("fp_layers", s.get("fp_layers")), "augment": s.get("augment"),
        "image_size": s.get("image_size"), "data_dir": s.get("data_dir"), "num_classes": config.get("num_classes"),
        "eval_bits": s.get("eval_bits"), "recal_batches": config.get("recal_batches", s.get("recal_batches")),
        "optimizer": s.get("optimizer"), "lr_min": s.get("lr_min"), "quant_agg": s.get("quant_agg"),
        "number_format": s.get("number_format"), "grad_format": s.get("grad_format"),
    })


# What a run's training loss is per: the unit of its trace.jsonl "loss" and progress bar (metrics.jsonl's losses are
# per token for a language model whatever this says), recorded in config.json "loss_unit" so that a resume goes on
# in the unit the run began with. A language model's sample is a sequence of seq_len tokens: its loss is the mean
# per token (ln(vocab) for a model that knows nothing); before runs recorded the unit it was the sum over the
# sequence's tokens (seq_len times larger), what a language model's run without "loss_unit" began with.
LOSS_PER_TOKEN, LOSS_PER_SEQUENCE, LOSS_PER_SAMPLE = "per_token", "per_sequence", "per_sample"
LOSS_UNITS = (LOSS_PER_TOKEN, LOSS_PER_SEQUENCE, LOSS_PER_SAMPLE)


def new_loss_unit(language_model: bool) -> str:
    """The loss unit a new run records: per token for a language model, per sample otherwise."""
    return LOSS_PER_TOKEN if language_model else LOSS_PER_SAMPLE


def recorded_loss_unit(config: dict, language_model: bool) -> tuple[str, str | None]:
    """(the unit a recorded run's losses are in, a note to say once when its config.json did not record it).

    A language model's run without "loss_unit" began before losses were per token: its trace is per sequence
    (the sum over its tokens), and a resume keeps that unit so that one trace holds one unit."""
    unit = config.get("loss_unit")
    if unit is not None:
        if unit not in LOSS_UNITS:
            raise InputError(f'config.json "loss_unit" must be one of {", ".join(LOSS_UNITS)}, got {unit!r}')
        return unit, None
    if not language_model:
        return LOSS_PER_SAMPLE, None
    return LOSS_PER_SEQUENCE, ("this run began before losses were per token: its trace's losses go on per sequence "
                               "(the sum over a sequence's tokens), the unit it began with (config.json "
                               f'"loss_unit": "{LOSS_PER_SEQUENCE}"); metrics.jsonl stays per token')


def loss_divisor(unit: str, seq_len: int) -> int:
    """What a step's loss summed over its sequences (samples) is divided by, besides their number, to be in
    ``unit``: a sequence's tokens for per-token losses, 1 otherwise."""
    return int(seq_len) if unit == LOSS_PER_TOKEN else 1


# The fraction of the training data that sweeps and the planner's pilot hold out as a validation split: what the
# planner's decisions (pilot ranking, ``--quality db``) are made on, so that the test split is never used for them.
VAL_SPLIT = 0.2


def held_out(n: int, val_split: float) -> int:
    """How many of ``n`` training samples a ``val_split`` holds out (``cptsim.run.train.validation_split``)."""
    return int(round(val_split * n))


def pack_correct(correct) -> str:
    """Per-sample correctness (booleans, in validation-split order) as text: the bits packed 8 to a byte,
    base64 (n / 6 characters). What metrics.jsonl records as ``val_correct``, so that two runs evaluated on
    the same validation split can be compared sample by sample (the pilot's McNemar test)."""
    import base64

    import numpy as np

    return base64.b64encode(np.packbits(np.asarray(correct, dtype=bool)).tobytes()).decode("ascii")


def unpack_correct(text: str, n: int):
    """The inverse of ``pack_correct``: a bool array of ``n`` samples."""
    import base64

    import numpy as np

    return np.unpackbits(np.frombuffer(base64.b64decode(text), dtype=np.uint8))[:n].astype(bool)


# The settings a plan's cost depends on: TrainConfig.from_plan refuses to change them.
PLAN_FIXED = ("model", "dataset", "schedule", "batch_size", "steps", "epochs", "fp_layers", "image_size",
              "channels_last",  # the memory format changes a GPU's time
              "optimizer", "quant_agg", "layer_schedule",
              "number_format", "grad_format")  # the formats price the GEMMs; Adam's update is counted work; a quantized aggregation changes the BitOPs


# The recipe a workload gets where its flags are not given, by the kind of its data: CPT's (SGD with momentum 0.9,
# lr 0.1, cosine to 0, batch 64, 15 epochs for the embedded digits), and for a graph cpt_gnn's ogbn-arxiv recipe
# (full batch, Adam lr 1e-3, cosine annealed to 0.1 x lr; their weight decay, 5e-4, is CPT's too) over 200 epochs,
# Kipf & Welling's GCN length, not cpt_gnn's 500 (give --epochs 500 for theirs).
DEFAULT_BATCH_SIZE = 64
DEFAULT_EPOCHS = 15
DEFAULT_LR = 0.1
GRAPH_RECIPE = {"batch_size": 1, "epochs": 200, "optimizer": "adam", "lr": 1e-3, "lr_min_fraction": 0.1}


def recipe(dataset, batch_size=None, epochs=None, optimizer=None, lr=None, lr_min=None) -> dict:
    """The run's batch size, epochs, optimizer, lr and cosine floor: each as given, or the dataset's kind's default
    (see above). The one place those defaults live: TrainConfig, the planner's Workload, a sweep and the CLI's
    help all read them here."""
    graph = is_graph_dataset(dataset)
    r = GRAPH_RECIPE if graph else {"batch_size": DEFAULT_BATCH_SIZE, "epochs": DEFAULT_EPOCHS, "optimizer": "sgd",
                                    "lr": DEFAULT_LR, "lr_min_fraction": 0.0}
    lr = r["lr"] if lr is None else lr
    if lr_min is None:  # the floor follows the peak typed (cpt_gnn: 0.1 x lr), when it is a number at all
        lr_min = r["lr_min_fraction"] * lr if isinstance(lr, (int, float)) and not isinstance(lr, bool) else 0.0
    return {"batch_size": r["batch_size"] if batch_size is None else batch_size,
            "epochs": r["epochs"] if epochs is None else epochs,
            "optimizer": r["optimizer"] if optimizer is None else optimizer, "lr": lr, "lr_min": lr_min}


def fill_recipe(settings) -> None:
    """Set each of ``settings``' recipe fields (batch_size, epochs, optimizer, lr, lr_min) left None to the recipe
    of its ``dataset``: TrainConfig's and a sweep's (cptsim.study.sweep.SweepSettings) one rule."""
    given = {k: getattr(settings, k) for k in ("batch_size", "epochs", "optimizer", "lr", "lr_min")}
    for k, v in recipe(settings.dataset, **given).items():
        setattr(settings, k, v)


def is_graph_dataset(name) -> bool:
    """Whether ``name`` is a node-classification graph (its DataInfo has ``graph_edges``); False for a name the
    registry does not know (that is reported where the data is loaded)."""
    if not isinstance(name, str):
        return False
    from cptsim.data import nominal_info

    try:
        return getattr(nominal_info(name), "graph_edges", None) is not None
    except InputError:
        return False


def check_world(dataset, world: int) -> None:
    """An InputError when ``world`` processes cannot share the run: a graph trains full-batch, its one sample is
    the whole graph, so there is no batch to split (neighbour-sampled mini-batches are not supported)."""
    if world > 1 and is_graph_dataset(dataset):
        raise InputError(f"{dataset} is a graph, trained full-batch: one step of the whole graph per epoch, no batch to "
                         f"share between {world} processes; train it in one (leave --nproc out)")


def validate(cfg: TrainConfig) -> None:
    """Every setting checked before anything is built or written (a plan file or an old config feeds these too)."""
    for name, v in (("model", cfg.model), ("dataset", cfg.dataset), ("lr-schedule", cfg.lr_schedule),
                    ("device", cfg.device), ("schedule", cfg.schedule)):
        if not isinstance(v, str):
            raise InputError(f"--{name} must be a string, got {v!r}")
    if cfg.data_dir is not None and not isinstance(cfg.data_dir, str):
        raise InputError(f"--data-dir must be a path, got {cfg.data_dir!r}")
    for name, v in (("lr", cfg.lr), ("momentum", cfg.momentum), ("weight-decay", cfg.weight_decay)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise InputError(f"--{name} must be a finite number, got {v!r}")
    for name, v in (("epochs", cfg.epochs), ("batch-size", cfg.batch_size), ("seed", cfg.seed),
                    ("steps", cfg.steps), ("workers", cfg.workers), ("threads", cfg.threads),
                    ("checkpoint-every", cfg.checkpoint_every)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise InputError(f"--{name} must be an integer, got {v!r}")
    if not isinstance(cfg.augment, bool):
        raise InputError(f"augment must be true or false, got {cfg.augment!r}")
    if cfg.epochs < 1:
        raise InputError(f"--epochs must be at least 1, got {cfg.epochs}")
    if cfg.steps is not None and cfg.steps < 1:
        raise InputError(f"--steps must be at least 1, got {cfg.steps}")
    if cfg.batch_size < 1:
        raise InputError(f"--batch-size must be at least 1, got {cfg.batch_size}")
    if cfg.batch_size != 1 and is_graph_dataset(cfg.dataset):
        raise InputError(f"{cfg.dataset} is a graph, trained full-batch: one step of the whole graph per epoch; "
                         f"leave --batch-size out (or give 1), not {cfg.batch_size}")
    if cfg.lr <= 0:
        raise InputError(f"--lr must be a positive number, got {cfg.lr}")
    if not 0 <= cfg.momentum < 1:
        raise InputError(f"--momentum must be in [0, 1), got {cfg.momentum}")
    if cfg.weight_decay < 0:
        raise InputError(f"--weight-decay must be >= 0, got {cfg.weight_decay}")
    if cfg.fp_layers is not None and (not isinstance(cfg.fp_layers, list)
                                      or not all(isinstance(x, str) for x in cfg.fp_layers)):
        raise InputError(f"full-precision layers must be a list of names, got {cfg.fp_layers!r}")
    if not isinstance(cfg.optimizer, str) or cfg.optimizer.strip().lower() not in OPTIMIZERS:
        raise InputError(f"unknown --optimizer {cfg.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
    if isinstance(cfg.lr_min, bool) or not isinstance(cfg.lr_min, (int, float)) or not math.isfinite(cfg.lr_min) \
            or not 0 <= cfg.lr_min < cfg.lr:
        raise InputError(f"--lr-min must be a number in [0, --lr) = [0, {cfg.lr}), got {cfg.lr_min!r}")
    if not isinstance(cfg.quant_agg, bool):
        raise InputError(f"quant_agg must be true or false, got {cfg.quant_agg!r}")
    if cfg.lr_schedule not in LR_SCHEDULES:
        raise InputError(f"unknown --lr-schedule {cfg.lr_schedule!r}; choose one of {', '.join(LR_SCHEDULES)}")
    if cfg.device not in ("cpu", "cuda") and not cfg.device.startswith("cuda:"):
        raise InputError(f"--device must be cpu or cuda, got {cfg.device!r}")
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError("--device cuda asked for, but PyTorch sees no CUDA device on this machine")
    if cfg.checkpoint_every is not None and cfg.checkpoint_every < 1:
        raise InputError(f"--checkpoint-every must be at least 1 step, got {cfg.checkpoint_every}")
    if isinstance(cfg.keep_checkpoints, bool) or not isinstance(cfg.keep_checkpoints, int) \
            or cfg.keep_checkpoints < 1:
        raise InputError(f"--keep-checkpoints must be an integer >= 1, got {cfg.keep_checkpoints!r}")
    if cfg.threads is not None and cfg.threads < 1:
        raise InputError(f"--threads must be at least 1, got {cfg.threads}")
    if cfg.workers < 0:
        raise InputError(f"--workers must be >= 0, got {cfg.workers}")
    if cfg.eval_bits is not None:
        from cptsim.numerics.quant import check_bits

        if isinstance(cfg.eval_bits, bool) or not isinstance(cfg.eval_bits, int):
            raise InputError(f"--eval-bits must be an integer, got {cfg.eval_bits!r}")
        check_bits(cfg.eval_bits, "--eval-bits")
    if isinstance(cfg.recal_batches, bool) or not isinstance(cfg.recal_batches, int) or cfg.recal_batches < 0:
        raise InputError(f"--recal-batches must be an integer >= 0, got {cfg.recal_batches!r}")
    if isinstance(cfg.val_split, bool) or not isinstance(cfg.val_split, (int, float)) \
            or not 0 <= cfg.val_split < 0.5:
        raise InputError(f"--val-split must be a fraction in [0, 0.5), got {cfg.val_split!r}")
    for name, v in (("number-format", cfg.number_format), ("grad-format", cfg.grad_format)):
        if v is not None and not isinstance(v, str):
            raise InputError(f"--{name} must be a name, got {v!r}")
    if cfg.number_format is None:
        raise InputError("--number-format must be a name (int, fp, mx, nvfp), got None")
    from cptsim.numerics.families import format_map

    format_map(cfg.number_format, cfg.grad_format)  # unknown names, --grad-format with the integer family
    if cfg.layer_schedule is not None:
        from cptsim.cost.layerplan import layer_schedule_from_json

        layer_schedule_from_json(cfg.layer_schedule, "layer_schedule")  # its syntax; its layers at build time
    if cfg.image_size is not None:
        from cptsim.data import resolve_image_size

        resolve_image_size(cfg.dataset, cfg.data_dir, cfg.image_size)  # its range; imagefolder's flag only

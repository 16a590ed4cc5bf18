"""What a sweep trains: its workload (``SweepSettings``: `cptsim train` flags, same names and defaults), its entries
(schedule texts, each with its layer rules if it has any), its seeds, the planner's picks at a budget, and the name of
each run's directory. Parsing and checking only: nothing here starts a process or writes a file.

Every run holds out a validation split of its training data by default (``val_split``, ``--val-split``: the same
fixed fraction the planner's pilot holds out, ``cptsim.run.config.VAL_SPLIT``) and the database records its
validation accuracy and loss beside the test ones: the planner's ``--quality db`` fits to the validation measure,
never to the test split. ``--val-split 0`` trains on all the training data (and leaves ``--quality db`` nothing to
fit). A sweep directory written before the split existed held nothing out: it continues only with ``--val-split 0``.

A run may be a per-layer plan: an entry of the sweep is a schedule text, or a schedule text with layer
rules, ``SCHEDULE@RULES`` (``cos-rep:2-4:g8:n8@features.0=4;features.3=+1``, the rules in the compact form of
``cptsim.cost.layerplan``). sweep.json lists the entries; the run is ``OUT/<schedule-slug>-L<hash of the
rules>-s<seed>`` and its training gets the rules as ``--layer`` flags. Its results row keeps the global schedule in
``schedule`` and names the rules in ``extra["layers"]`` (``cptsim.study.results.run_row``); the report shows it as
its own entry beside the uniform runs of the same schedule.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass

from cptsim.errors import InputError

SWEEP_FORMAT = "cptsim.sweep/1"
SWEEP_FILE = "sweep.json"


# ------------------------------------------------------------------------------------------------ settings


@dataclass
class SweepSettings:
    """The workload every run of the sweep trains, as `cptsim train` flags (same names and defaults), plus how to
    run it (device, workers, threads, checkpoint_every: not part of the workload)."""

    model: str = "digits-cnn"
    dataset: str | None = None  # None: the embedded dataset of the model's kind (cptsim.data.default_dataset)
    data_dir: str | None = None
    # None: train's default for the dataset (cptsim.run.config.recipe: a graph's differ)
    epochs: int | None = None
    steps: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    momentum: float = 0.9
    weight_decay: float = 5e-4
    lr_schedule: str = "cosine"
    optimizer: str | None = None
    lr_min: float | None = None
    quant_agg: bool = False
    fp_layers: list[str] | None = None  # None = the model's convention, [] = quantize every layer
    augment: bool = True
    val_split: float = 0.2  # held out of the training data (cptsim.run.config.VAL_SPLIT): what decisions rank by
    device: str = "cpu"
    workers: int = 0
    threads: int | None = None
    checkpoint_every: int | None = None
    image_size: int | None = None  # imagefolder's N x N input (cptsim.data.resolve_image_size); None: its default
    nproc: int | None = None  # data-parallel workers per run (`cptsim train --nproc`: torchrun inside the job)
    # number formats (`cptsim train --number-format F --grad-format G`); None: train's default (integers)
    number_format: str | None = None
    grad_format: str | None = None

    RUNTIME = ("device", "workers", "threads", "checkpoint_every", "nproc")
    # recipe settings added after sweeps were first written: in the workload only away from their defaults, so
    # that an older sweep's workload (and a rerun into its OUT) stays the same
    RECIPE = {"optimizer": "sgd", "lr_min": 0.0, "quant_agg": False}

    def __post_init__(self) -> None:
        if self.dataset is None:
            from cptsim.data import default_dataset

            self.dataset = default_dataset(self.model)
        if self.number_format == "int":  # train's default: named or not, one workload (and no flag to pass)
            self.number_format = None
        from cptsim.run.config import fill_recipe

        fill_recipe(self)

    def workload(self) -> dict:
        """The settings that define what is trained (a rerun into the same OUT must not change them)."""
        w = {k: v for k, v in asdict(self).items() if k not in self.RUNTIME}
        if self.steps is not None:
            w["epochs"] = None  # --steps overrides --epochs: an unused --epochs does not make another workload
        if self.image_size is None:
            del w["image_size"]  # the workloads of sweeps made before --image-size existed stay the same
        for k in ("number_format", "grad_format"):  # likewise: in the workload only when given
            if w[k] is None:
                del w[k]
        for k, default in self.RECIPE.items():
            if w[k] == default:
                del w[k]
        return w

    def validate(self, device_here: bool = True) -> None:
        """The checks `cptsim train` makes (settings, model name, dataset and its folder), before any process is
        started, so a bad flag fails once here rather than once per run. ``device_here`` False: the runs train
        elsewhere (Slurm nodes), so --device cuda is not asked of this machine (a login node has no GPU)."""
        from cptsim.data import dataset_info
        from cptsim.models import create_model, meta_model
        from cptsim.run.config import TrainConfig, validate

        device = self.device
        if not device_here and (device == "cuda" or device.startswith("cuda:")):
            device = "cpu"  # every other check stands; whether the node has the GPU is the job's to find out
        validate(TrainConfig(model=self.model, dataset=self.dataset, data_dir=self.data_dir, epochs=self.epochs,
                             steps=self.steps, batch_size=self.batch_size, lr=self.lr, momentum=self.momentum,
                             weight_decay=self.weight_decay, lr_schedule=self.lr_schedule,
                             optimizer=self.optimizer, lr_min=self.lr_min, quant_agg=self.quant_agg,
                             fp_layers=self.fp_layers, augment=self.augment, val_split=self.val_split,
                             device=device,
                             workers=self.workers, threads=self.threads, checkpoint_every=self.checkpoint_every,
                             image_size=self.image_size))
        if self.nproc is not None and self.nproc < 1:
            raise InputError(f"--nproc must be at least 1, got {self.nproc}")
        if self.number_format is not None or self.grad_format is not None:
            from cptsim.numerics.families import format_map

            format_map(self.number_format or "int", self.grad_format)  # the names, and the pairing, checked once
        info = dataset_info(self.dataset, self.data_dir, self.image_size)
        shape = tuple(int(d) for d in info.input_shape)
        kw = dict(num_classes=info.num_classes, in_channels=shape[0], input_shape=shape,
                  graph=info.graph_edges is not None)
        try:
            meta_model(self.model, **kw)
        except InputError:
            raise
        except Exception:  # noqa: BLE001 - a model that cannot be built on meta: build it for real
            create_model(self.model, **kw)

    def train_flags(self) -> list[str]:
        """`cptsim train` flags for this workload; every value spelled out, so train's defaults cannot drift."""
        f = ["--model", self.model, "--dataset", self.dataset, "--batch-size", str(self.batch_size),
             "--lr", repr(float(self.lr)), "--momentum", repr(float(self.momentum)),
             "--weight-decay", repr(float(self.weight_decay)), "--lr-schedule", self.lr_schedule,
             "--device", self.device, "--workers", str(self.workers)]
        f += ["--steps", str(self.steps)] if self.steps is not None else ["--epochs", str(self.epochs)]
        if self.data_dir is not None:
            f += ["--data-dir", self.data_dir]
        if self.image_size is not None:
            f += ["--image-size", str(self.image_size)]
        if self.fp_layers is not None:
            f += ["--fp-layers", ",".join(self.fp_layers) if self.fp_layers else "none"]
        if not self.augment:
            f.append("--no-augment")
        if self.optimizer != "sgd":
            f += ["--optimizer", self.optimizer]
        if self.lr_min:
            f += ["--lr-min", repr(float(self.lr_min))]
        if self.quant_agg:
            f.append("--quant-agg")
        if self.number_format is not None:
            f += ["--number-format", self.number_format]
        if self.grad_format is not None:
            f += ["--grad-format", self.grad_format]
        f += ["--val-split", repr(float(self.val_split))]
        if self.threads is not None:
            f += ["--threads", str(self.threads)]
        if self.checkpoint_every is not None:
            f += ["--checkpoint-every", str(self.checkpoint_every)]
        return f


def parse_schedule_list(text: str | None) -> list[str]:
    """--schedules "cpt:3-8:g8:n32,static:5,static:3@features.0=4;features.3=-1": canonical entries (schedule texts,
    each with its layer rules if it has any: ``split_entry``), in order, each once."""
    if text is None:
        return []
    out: list[str] = []
    for part in text.split(","):
        if not part.strip():
            continue
        t = canonical_entry(part.strip())
        if t not in out:
            out.append(t)
    if not out:
        raise InputError(f"--schedules {text!r} names no schedule; e.g. --schedules cpt:3-8:g8:n32,static:5")
    return out


# ------------------------------------------------------------------------------------------------ per-layer entries
ENTRY_SEP = "@"


def split_entry(entry: str) -> tuple[str, str | None]:
    """A sweep entry ``SCHEDULE`` or ``SCHEDULE@RULES`` -> (schedule text, compact rules text or None)."""
    sched, sep, rules = str(entry).partition(ENTRY_SEP)
    return sched, (rules if sep else None)


def canonical_entry(text: str, rules: str | None = None) -> str:
    """The canonical entry of ``SCHEDULE[@RULES]`` (``rules``: rules for a text that carries none). An entry whose
    rules are empty is the uniform schedule."""
    from cptsim.cost.layerplan import parse_layer_text
    from cptsim.cost.schedules import parse_schedule

    sched, own = split_entry(text)
    s = parse_schedule(sched.strip()).to_text()
    own = own if own is not None else rules
    if own is None or not own.strip():
        return s
    return f"{s}{ENTRY_SEP}{parse_layer_text(own).to_text()}"


def with_layers(entries: list[str], rules: str | None) -> list[str]:
    """``--layer`` / ``--layer-schedule`` of a sweep: every entry without rules of its own gets ``rules`` (as
    `cptsim train --layer` makes every run per-layer); entries with rules keep theirs. Order kept, each once."""
    if not rules:
        return list(entries)
    return list(dict.fromkeys(canonical_entry(e, rules) for e in entries))


def layer_plan_entry(path: str, settings: "SweepSettings") -> str:
    """``--layer-plan plan.json``: the entry of a plan from `cptsim plan --per-layer` -- its schedule and, when the
    planner kept a per-layer plan, its rules. InputError for a plan made for another workload than the sweep's (its
    rules and its costs would not hold)."""
    from cptsim.run.planfile import read_plan
    from cptsim.cost.schedules import Schedule
    from cptsim.run.config import canonical_dataset

    plan = read_plan(path)
    w = plan.get("workload") or {}
    wrong = []
    for key, mine in (("model", settings.model), ("batch_size", settings.batch_size)):
        if w.get(key) is not None and w.get(key) != mine:
            wrong.append(f"{key} {w.get(key)!r} (the sweep's: {mine!r})")
    if w.get("dataset") is not None and canonical_dataset(w["dataset"]) != canonical_dataset(settings.dataset):
        wrong.append(f"dataset {w['dataset']!r} (the sweep's: {settings.dataset!r})")
    if settings.steps is not None and w.get("steps") is not None and int(w["steps"]) != int(settings.steps):
        wrong.append(f"steps {w['steps']} (the sweep's: {settings.steps})")
    elif settings.steps is None and w.get("epochs") is not None and w["epochs"] != settings.epochs:
        wrong.append(f"epochs {w['epochs']} (the sweep's: {settings.epochs})")
    if wrong:
        raise InputError(f"--layer-plan {path}: planned for another workload: {'; '.join(wrong)}; plan with the "
                         "sweep's workload flags or give the sweep the plan's")
    sched = Schedule.from_json(plan["schedule"]).to_text()
    layers = plan.get("layers")
    rules = ";".join(layers["rules"]) if isinstance(layers, dict) and layers.get("rules") else None
    return canonical_entry(sched, rules)


def check_layers(settings: "SweepSettings", entries: list[str]) -> None:
    """Every entry's layer rules resolved on the workload's model (built on the meta device), before any run
    starts: a glob that matches no quantized layer, bits out of range, a range on a static schedule -- one
    InputError here rather than one failed run per seed."""
    ruled = [(s, r) for s, r in map(split_entry, entries) if r]
    if not ruled:
        return
    from cptsim.cost.layerplan import parse_layer_text
    from cptsim.cost.schedules import parse_schedule
    from cptsim.data import dataset_info
    from cptsim.models import default_fp_layers, meta_model
    from cptsim.numerics.layers import quantizable_layers, resolve_fp_layers

    info = dataset_info(settings.dataset, settings.data_dir, settings.image_size)
    shape = tuple(int(d) for d in info.input_shape)
    try:
        meta = meta_model(settings.model, num_classes=info.num_classes, in_channels=shape[0], input_shape=shape,
                          graph=info.graph_edges is not None)
    except InputError:
        raise
    except Exception:  # noqa: BLE001 - a model that cannot be built on meta: each run's train checks its rules
        return
    keep = default_fp_layers(meta) if settings.fp_layers is None else resolve_fp_layers(meta, settings.fp_layers)
    names = [n for n in quantizable_layers(meta) if n not in keep]
    for sched, rules in ruled:
        parse_layer_text(rules).resolve(parse_schedule(sched), names, list(keep), settings.model)


def parse_seeds(text: str) -> list[int]:
    """--seeds "0,1,2" or "0-4" (or a mix): distinct seeds >= 0, in order."""
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if m is None:
            raise InputError(f"--seeds: {part!r} is not a seed (N) or a range (LOW-HIGH); e.g. --seeds 0,1,2")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise InputError(f"--seeds: range {part!r} runs backwards")
        if hi - lo > 10_000:
            raise InputError(f"--seeds: range {part!r} is too long")
        for s in range(lo, hi + 1):
            if s not in out:
                out.append(s)
    if not out:
        raise InputError(f"--seeds {text!r} names no seed; e.g. --seeds 0,1,2")
    return out


def run_name(schedule_text: str, seed: int) -> str:
    """OUT/<slug>-s<seed>: the schedule text with ':' as '_' (cos-rep:3-8:g8:n32 -> cos-rep_3-8_g8_n32-s0); an entry
    with layer rules adds -L and 8 hex digits of their SHA-256 (globs make poor file names; sweep.json, config.json
    and the results row spell the rules out)."""
    sched, rules = split_entry(schedule_text)
    tag = "" if rules is None else "-L" + hashlib.sha256(rules.encode()).hexdigest()[:8]
    return f"{sched.replace(':', '_')}{tag}-s{seed}"


def planner_schedules(settings: SweepSettings, budgets: list[str], hw: str, top: int, metric: str | None = None,
                      space_flags: dict | None = None) -> list[dict]:
    """The planner's top-``top`` schedules at each budget: {"schedule", "budget", "rank", "score", "vs_baseline"}.

    The workload is planned exactly as `cptsim plan` would plan these flags (``cptsim.planner.plan``)."""
    from cptsim.cost.hardware import load_profile
    from cptsim.planner import Workload, plan
    from cptsim.planner.budget import parse_budget
    from cptsim.planner.space import parse_space

    if top < 1:
        raise InputError(f"--top must be at least 1, got {top}")
    if not budgets:
        raise InputError("--top K needs --budget (one or more cost levels, e.g. --budget 60%,80%)")
    parsed = [parse_budget(b.strip(), metric) for b in budgets]
    space = parse_space(**(space_flags or {}))
    hardware = load_profile(hw)
    workload = Workload.build(model=settings.model, dataset=settings.dataset, data_dir=settings.data_dir,
                              batch_size=settings.batch_size, epochs=None if settings.steps else settings.epochs,
                              steps=settings.steps, fp_layers=settings.fp_layers, lr=settings.lr,
                              lr_schedule=settings.lr_schedule, momentum=settings.momentum,
                              weight_decay=settings.weight_decay, augment=settings.augment,
                              image_size=settings.image_size, optimizer=settings.optimizer,
                              lr_min=settings.lr_min, quant_agg=settings.quant_agg,
                              # the sweep's number formats: the planner prices the formats that will run
                              number_format=settings.number_format or "int", grad_format=settings.grad_format)
    out = []
    for b in parsed:
        p = plan(workload, hardware, b, space, top=top)
        picked = [a for a in p.alternatives if a.get("within_budget", True)][:top]
        for a in picked:
            out.append({"schedule": a["schedule"], "budget": b.spec, "rank": a["rank"], "score": a["score"],
                        "vs_baseline": a["vs_baseline"]})
    return out

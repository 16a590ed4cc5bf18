"""Sweeps: many runs of one workload (schedules x seeds), N processes at a time, each a normal run directory.

A sweep lives in one directory OUT::

    OUT/sweep.json              the workload (as `cptsim train` settings) and every schedule and seed asked for
    OUT/<schedule-slug>-s<seed>/  a run directory, written by its own `cptsim train` process
    OUT/<schedule-slug>-s<seed>.log   that process's stdout and stderr
    OUT/.<name>.lock            the run's lock (cptsim.run.rundir.RunLock): taken by the sweep, handed to the `cptsim train`
                                process that trains the run (it adopts it), so nothing else writes the run meanwhile
    OUT/<name>/result.json      the finished run's result record (cptsim.study.resultfile): the source of truth
    OUT/jobs.json, OUT/.submitit/   with --executor slurm | submitit-local: which job trains which run, and
                                submitit's files (cptsim.study.cluster)

Resumable as a whole: rerunning the same sweep skips finished runs (an evaluation recorded after the last step),
continues interrupted ones with `cptsim train --resume` (from their last checkpoint), and starts missing ones. A
run still held by a live process of an earlier, killed sweep is left alone ("busy"). The workload of OUT is fixed
by its first sweep; a rerun may add schedules or seeds but not change the workload.

Each finished run writes its result record (result.json) into its run directory; a local sweep also puts the same
row into the results database (``cptsim.study.results``) as the run finishes. A sweep of cluster jobs
(``cptsim.study.cluster``) never writes the database from a node: ``index(OUT, db)`` (``cptsim sweep --index``)
builds or updates it from the records, the same rows a local sweep writes. ``sweep_status(OUT)`` shows every run:
done, running, queued, failed, unfinished, not started.

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

``sweep_report(rows)`` summarises rows of one workload: per schedule the mean and spread of accuracy over seeds,
its cost relative to static q_max, the planner's proxy score, and the Spearman rank correlation between score and
measured mean accuracy over schedules, with its seed spread (the correlation computed per seed). For a language
model (rows whose extra holds test_ppl) the measure is test perplexity instead - lower is better, so the
correlation is with minus the perplexity - and the report's ``measure`` says which.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from cptsim.errors import InputError

SWEEP_FORMAT = "cptsim.sweep/1"
SWEEP_FILE = "sweep.json"
REPORT_FORMAT = "cptsim.sweep-report/1"


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


# ------------------------------------------------------------------------------------------------ the runs


@dataclass
class SweepRun:
    schedule: str
    seed: int
    path: Path
    log: Path
    action: str = ""          # skip (finished) | resume | new | busy (held by another live process)
    status: str = "pending"   # pending | running | done | failed | stopped | busy
    returncode: int | None = None
    steps_done: int = 0
    total_steps: int | None = None
    time_s: float = 0.0
    row: dict | None = None
    error: str | None = None
    job_id: str | None = None  # the scheduler's job training it (--executor slurm | submitit-local)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def global_schedule(self) -> str:
        """The run's schedule (``schedule`` is the sweep entry: with ``@RULES`` for a per-layer plan)."""
        return split_entry(self.schedule)[0]

    @property
    def layer_rules(self) -> list[str] | None:
        """A per-layer run's rules, ``GLOB=SPEC`` each (its ``--layer`` flags); None for a uniform run."""
        rules = split_entry(self.schedule)[1]
        return None if rules is None else [r for r in rules.split(";") if r]

    @property
    def lock_path(self) -> Path:
        from cptsim.run.rundir import lock_file

        return lock_file(self.path)  # the run's own lock (cptsim.run.rundir.RunLock), which its training adopts

    def to_json(self) -> dict:
        r = self.row or {}
        return {"name": self.name, "schedule": self.schedule, "layers": split_entry(self.schedule)[1],
                "seed": self.seed, "path": str(self.path),
                "log": str(self.log), "action": self.action, "status": self.status, "returncode": self.returncode,
                "steps_done": self.steps_done, "total_steps": self.total_steps, "time_s": round(self.time_s, 2),
                "test_acc": r.get("test_acc"), "eval_bits": r.get("eval_bits"), "bitops": r.get("bitops"),
                "bitops_rel": r.get("bitops_rel"), "score": r.get("score"), "error": self.error,
                "job_id": self.job_id}


def _sweep_doc(out: Path, settings: SweepSettings, schedules: list[str], seeds: list[int]) -> dict:
    """sweep.json: the workload is fixed by the first sweep into OUT; schedules and seeds accumulate."""
    path = out / SWEEP_FILE
    wanted = settings.workload()
    doc = {"format": SWEEP_FORMAT, "workload": wanted, "schedules": [], "seeds": []}
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise InputError(f"{path}: cannot read ({e})") from None
        if not isinstance(old, dict) or old.get("format") != SWEEP_FORMAT:
            raise InputError(f"{path}: not a cptsim sweep file (format {old.get('format') if isinstance(old, dict) else None!r}, "
                             f"expected {SWEEP_FORMAT!r})")
        have = old.get("workload", {})
        if isinstance(have, dict):  # written before sweeps held out a validation split: nothing was held out
            have = {"val_split": 0.0} | have
        diff = [f"{k} {have.get(k)!r} there, {v!r} now" for k, v in wanted.items() if have.get(k) != v]
        if diff:
            raise InputError(f"{out} holds a sweep of another workload ({'; '.join(diff)}); "
                             "give the same workload flags or pick another --out")
        doc = old
    doc["schedules"] = list(dict.fromkeys(list(doc.get("schedules", [])) + schedules))
    doc["seeds"] = list(dict.fromkeys(list(doc.get("seeds", [])) + seeds))
    return doc


def run_state(run: SweepRun) -> str:
    """new | partial | trained | done, for a run directory of this sweep; InputError if it holds another run.

    done: its result record (result.json) is there and sound; trained: every step ran and was evaluated, but the
    record is missing (a sweep from before records existed, a job killed after training) or damaged (a warning in
    ``run.error``): writing the record is all that is left to do."""
    from .results import run_finished
    from .resultfile import ResultDamaged, read_result
    from cptsim.run.rundir import CONFIG, RunDir

    p = run.path
    if not p.exists() or (p.is_dir() and not any(p.iterdir())):
        return "new"
    if not (p / CONFIG).is_file():
        raise InputError(f"{p} exists but is not a run directory (no {CONFIG}); move it away and rerun the sweep")
    rd = RunDir.open(p)
    cfg = rd.read_config()
    from cptsim.cost.schedules import Schedule

    have = Schedule.from_json(cfg["schedule"]).to_text()
    rec = cfg.get("layers")
    if isinstance(rec, dict) and rec.get("rules"):  # a per-layer run: its entry names its rules
        have = canonical_entry(have, ";".join(rec["rules"]))
    seed = cfg["settings"].get("seed")
    if have != run.schedule or seed != run.seed:
        raise InputError(f"{p} holds {have} seed {seed}, not {run.schedule} seed {run.seed}; move it away")
    run.total_steps = cfg["total_steps"]
    run.steps_done = len(rd.read_trace().records)
    if not run_finished(rd):
        return "partial"
    try:
        if read_result(p) is not None:
            return "done"
    except ResultDamaged as e:
        run.error = f"{e} (written again from the run directory)"
    return "trained"


def prepare(out: str | os.PathLike, settings: SweepSettings, schedules: list[str], seeds: list[int],
            write: bool = True) -> list[SweepRun]:
    """The runs of this sweep, in order (schedule-major), each with its action: new, resume, record (trained, its
    result record to write) or skip (done). Writes OUT/sweep.json unless ``write`` is False (a dry run)."""
    from cptsim.fileio import atomic_write_json

    if not schedules:
        raise InputError("nothing to sweep: give --schedules and/or --top K --budget B")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file, not a directory")
    doc = _sweep_doc(out, settings, schedules, seeds)
    runs = []
    for s in schedules:
        for seed in seeds:
            name = run_name(s, seed)
            runs.append(SweepRun(schedule=s, seed=seed, path=out / name, log=out / f"{name}.log"))
    for r in runs:
        state = run_state(r)
        r.action = {"new": "new", "done": "skip", "partial": "resume", "trained": "record"}[state]
        if state == "done":
            r.status = "done"
    if not write:
        return runs
    try:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / SWEEP_FILE, doc)
    except OSError as e:
        raise InputError(f"--out {out}: cannot write the sweep there ({e.strerror or e})") from None
    return runs


def train_command(settings: SweepSettings, run: SweepRun) -> list[str]:
    """The `cptsim train` process of one run: resume it, or start it with the sweep's workload."""
    from .cluster import TrainJob

    # the one place that spells the command: a local sweep and a cluster job train a run alike
    spec = {"run": str(run.path), "schedule": run.global_schedule, "layers": run.layer_rules, "seed": run.seed,
            "train_flags": settings.train_flags(), "nproc": settings.nproc}
    return TrainJob(spec).command(resume=run.action == "resume")


class _StepCounter:
    """Lines of a growing trace.jsonl, read incrementally (a resume that truncates the file starts it over)."""

    def __init__(self, path: Path):
        self.path, self.pos, self.lines = path, 0, 0

    def count(self) -> int:
        try:
            size = self.path.stat().st_size
        except OSError:
            return self.lines
        if size < self.pos:
            self.pos, self.lines = 0, 0
        if size > self.pos:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                chunk = f.read(size - self.pos)
            self.lines += chunk.count(b"\n")
            self.pos += len(chunk)
        return self.lines


def _child_env(jobs: int) -> dict:
    env = dict(os.environ)
    if jobs > 1 and "OMP_NUM_THREADS" not in env:  # N processes on the CPU must not each take every core
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))
    return env


def execute(runs: list[SweepRun], settings: SweepSettings, jobs: int = 1, db=None,
            on_event: Callable[[str, SweepRun], None] | None = None, poll_s: float = 0.25) -> list[SweepRun]:
    """Train the runs that are not finished, ``jobs`` processes at a time; record every finished run in ``db``.

    Events: ("start" | "progress" | "end", run). SIGINT / SIGTERM stop the sweep: running trainings get SIGINT
    (they checkpoint and stop), no new one starts, and RunStopped is raised once they have exited.
    """
    from cptsim.errors import RunStopped
    from .results import run_finished
    from .resultfile import ResultDamaged, read_result, record_result
    from cptsim.run.rundir import ExclusiveLock, RunDir, RunLock

    if jobs < 1:
        raise InputError(f"--jobs must be at least 1, got {jobs}")
    emit = on_event or (lambda ev, run: None)
    out = runs[0].path.parent if runs else None
    sweep_lock = None
    if out is not None:
        sweep_lock = ExclusiveLock(out / ".sweep.lock")
        if not sweep_lock.try_acquire():
            raise InputError(f"another sweep is running in {out}; wait for it or pick another --out")

    def record(run: SweepRun, write: bool = True) -> None:
        """The run's row: read from its result record (a run done before), else computed from the run directory
        and written as its record; into the database too, the same row the index would make of the record."""
        row = None
        if run.action == "skip":
            try:
                row = read_result(run.path)
            except ResultDamaged:
                row = None
        if row is None:
            rd = RunDir.open(run.path)
            if not run_finished(rd):
                run.status, run.error = "failed", "the process exited 0 but the run has no final evaluation"
                return
            row = record_result(rd, "sweep")
        run.row = row
        run.status = "done"
        run.steps_done = run.row["steps"]
        if db is not None and write:
            run.row["id"] = db.add_run({k: v for k, v in run.row.items() if k != "id"})

    stop = {"requested": False}
    old_handlers = {}

    def _on_signal(signum, frame):
        stop["requested"] = True

    import threading

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            old_handlers[sig] = signal.signal(sig, _on_signal)
    env = _child_env(jobs)
    running: dict[int, tuple[SweepRun, subprocess.Popen, RunLock, _StepCounter, float, object]] = {}
    try:
        for run in runs:  # finished by an earlier sweep: make sure the database holds their rows
            if run.action == "skip":
                record(run, write=db is not None and not db.has_run(run.path))
                emit("end", run)
            elif run.action == "record":  # trained, only its result record is missing: no process needed
                lock = RunLock(run.path)
                if not lock.try_acquire():
                    run.action, run.status = "busy", "busy"
                    run.error = "another process is writing this run"
                else:
                    try:
                        record(run)
                    except InputError as e:
                        run.status, run.error = "failed", str(e)
                    finally:
                        lock.release()
                emit("end", run)
        queue = [r for r in runs if r.action not in ("skip", "record")]
        while queue or running:
            while queue and len(running) < jobs and not stop["requested"]:
                run = queue.pop(0)
                lock = RunLock(run.path)
                if not lock.try_acquire():
                    run.action, run.status = "busy", "busy"
                    run.error = "another process is training this run (from an earlier sweep that was killed?)"
                    emit("end", run)
                    continue
                if run.action == "resume":  # the state may have moved on since prepare() looked
                    try:
                        state = run_state(run)
                        if state in ("done", "trained"):
                            run.action = "skip" if state == "done" else "record"
                            try:
                                record(run)
                            finally:
                                lock.release()
                            emit("end", run)
                            continue
                    except InputError as e:
                        lock.release()
                        run.status, run.error = "failed", str(e)
                        emit("end", run)
                        continue
                log = open(run.log, "ab")
                log.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} {run.action}: "
                          f"{' '.join(train_command(settings, run))}\n".encode())
                log.flush()
                # Its own session: a ^C at the terminal reaches the sweep alone, which passes it on exactly once
                # (a second SIGINT makes `cptsim train` stop without its end-of-step checkpoint).
                proc = subprocess.Popen(train_command(settings, run), stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env | lock.handoff_env(), pass_fds=(lock.fd,),
                                        start_new_session=True)
                run.status = "running"
                running[proc.pid] = (run, proc, lock, _StepCounter(run.path / "trace.jsonl"), time.perf_counter(),
                                     log)
                emit("start", run)
            if stop["requested"] and not stop.get("forwarded"):
                stop["forwarded"] = True
                for run, proc, *_ in running.values():
                    if proc.poll() is None:
                        try:
                            proc.send_signal(signal.SIGINT)
                        except ProcessLookupError:
                            pass
                queue.clear()
            time.sleep(poll_s)
            for pid in list(running):
                run, proc, lock, counter, t0, log = running[pid]
                if run.total_steps is None and (run.path / "config.json").exists():
                    try:
                        run.total_steps = int(json.loads((run.path / "config.json").read_text())["total_steps"])
                    except (OSError, ValueError, KeyError):
                        pass
                run.steps_done = counter.count()
                rc = proc.poll()
                if rc is None:
                    emit("progress", run)
                    continue
                del running[pid]
                log.close()
                run.returncode, run.time_s = rc, time.perf_counter() - t0
                try:
                    if rc == 0:
                        try:
                            record(run)
                        except InputError as e:  # the run's files cannot be read back: that run failed
                            run.status, run.error = "failed", str(e)
                    elif rc == 130 or (stop["requested"] and rc in (-signal.SIGINT, 1)):
                        run.status = "stopped"
                    else:
                        run.status = "failed"
                        run.error = _last_error(run.log) or f"exit code {rc}"
                finally:
                    lock.release()
                emit("end", run)
    finally:
        for run, proc, lock, *_ in running.values():  # only on an exception of our own: do not orphan children
            if proc.poll() is None:
                if not stop.get("forwarded"):
                    proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            lock.release()
        for sig, h in old_handlers.items():
            signal.signal(sig, h)
        if sweep_lock is not None:
            sweep_lock.release()
    if stop["requested"]:
        raise RunStopped("sweep stopped; finished runs are recorded - rerun the same command to continue")
    return runs


def _lock_held(run_path: Path) -> bool:
    """Whether a live process holds the run's lock -- asked without taking it over (the file keeps its holder)."""
    import fcntl

    from cptsim.run.rundir import lock_file

    try:
        fd = os.open(lock_file(run_path), os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def _last_job_line(log: Path) -> str | None:
    """The last line a cluster job wrote about its training's end ("=== job ID: cptsim train exited ...")."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("=== job ") and "exited" in line:
            return line.split(": ", 1)[-1]
    return None


def _last_error(log: Path) -> str | None:
    """The last 'error: ...' line a failed `cptsim train` wrote (its one-line reason)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("error: "):
            return line[len("error: "):]
    return None


# ------------------------------------------------------------------------------------------------ the report


def rows_from_dir(out: str | os.PathLike, warnings: list[str] | None = None) -> list[dict]:
    """The results rows of the finished runs in a sweep directory, read from the run directories themselves: each
    run's result record (result.json); a finished run without one (a sweep from before records existed) from its
    files. A damaged record is skipped -- its run counts as unfinished -- and named in ``warnings``."""
    from .results import run_finished, run_row
    from .resultfile import ResultDamaged, read_result
    from cptsim.run.rundir import CONFIG, RunDir

    out = Path(out)
    if not (out / SWEEP_FILE).is_file():
        raise InputError(f"{out} is not a sweep directory (no {SWEEP_FILE})")
    rows = []
    for p in sorted(out.iterdir()):
        if p.is_dir() and (p / CONFIG).is_file():
            try:
                row = read_result(p)
            except ResultDamaged as e:
                if warnings is not None:
                    warnings.append(f"{e}; skipped, the run counts as unfinished (rerun the sweep to record it)")
                continue
            if row is not None:
                rows.append(row)
                continue
            rd = RunDir.open(p)
            if run_finished(rd):
                rows.append(run_row(rd, "sweep"))
    return rows


def index(out: str | os.PathLike, db) -> dict:
    """Update the results database ``db`` from the run directories of sweep OUT (``rows_from_dir``): a row per
    finished run, replacing the row of the same run directory. Returns {"rows", "added", "warnings"}."""
    warnings: list[str] = []
    rows = rows_from_dir(out, warnings)
    added = 0
    for row in rows:
        added += not db.has_run(row["run_path"])
        row["id"] = db.add_run({k: v for k, v in row.items() if k != "id"})
    return {"rows": rows, "added": added, "warnings": warnings}


# ------------------------------------------------------------------------------------------------ status

STATUSES = ("done", "running", "queued", "failed", "unfinished", "not started")


def sweep_status(out: str | os.PathLike, query_scheduler: bool = True) -> dict:
    """Where every run of sweep OUT stands, from its run directory and (for runs submitted as jobs) the scheduler.

    Per run: done (a sound result record, or a finished run from before records existed), running (its job runs,
    or a process holds its lock), queued (its job waits), failed (its job ended without a result: the scheduler's
    state and the run's last error), unfinished (stopped part way with no job: a rerun resumes it; or its record
    is damaged: a rerun writes it again), not started. Returns {"runs": [...], "counts": {...}, "warnings": [...]}.
    """
    from . import cluster as C
    from .results import run_finished
    from .resultfile import ResultDamaged, read_result
    from cptsim.run.rundir import CONFIG, RunDir

    out = Path(out)
    path = out / SWEEP_FILE
    if not path.is_file():
        raise InputError(f"{out} is not a sweep directory (no {SWEEP_FILE})")
    try:
        doc = json.loads(path.read_text())
        names = [(s, int(seed)) for s in doc["schedules"] for seed in doc["seeds"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"{path}: cannot read ({e})") from None
    jobs = C.read_jobs(out)
    states = C.scheduler_states(out, jobs) if query_scheduler else {}
    warnings: list[str] = []
    runs = []
    for schedule, seed in names:
        name = run_name(schedule, seed)
        p = out / name
        job = jobs["runs"].get(name) or {}
        r = {"name": name, "schedule": schedule, "seed": seed, "path": str(p), "log": str(out / f"{name}.log"),
             "status": "not started", "job_id": job.get("job_id"), "job_state": states.get(name),
             "steps_done": 0, "total_steps": None, "test_acc": None, "val_acc": None, "bitops_rel": None,
             "error": None}
        runs.append(r)
        phase = C.job_phase(states.get(name))
        started = (p / CONFIG).is_file()
        rd = None
        if started:
            try:
                rd = RunDir.open(p)
                r["total_steps"] = rd.read_config()["total_steps"]
                r["steps_done"] = _StepCounter(p / "trace.jsonl").count()  # lines: a long run's trace is not parsed
            except (InputError, KeyError, OSError, ValueError) as e:
                r["status"], r["error"] = "failed", f"cannot read the run directory: {e}"
                continue
            try:
                row = read_result(p)
            except ResultDamaged as e:
                warnings.append(f"{e}; the run counts as unfinished (rerun the sweep to record it)")
                row, r["error"] = None, str(e)
            if row is not None:
                r.update(status="done", test_acc=row.get("test_acc"), val_acc=row.get("val_acc"),
                         bitops_rel=row.get("bitops_rel"))
                continue
            if r["error"] is None and run_finished(rd) and phase != "running":
                r["status"] = "done"  # trained before runs wrote records: the report reads its files
                r["error"] = "no result.json: read from the run directory (rerun the sweep to record it)"
                continue
        if phase in ("queued", "running"):
            r["status"] = phase
            continue
        if started and _lock_held(p):  # a local sweep's training, or a job the scheduler cannot tell us about
            r["status"] = "running"
        elif phase == "ended" and r["error"] is None:
            r["status"] = "failed"
            log = out / f"{name}.log"
            # the training's own last word; else (the job died before it started one) the scheduler's log
            why = _last_error(log) or _last_job_line(log) or \
                f"see {out / C.SUBMITIT_DIR / (str(job.get('job_id')) + '_0_log.err')}"
            r["error"] = f"job {job.get('job_id')} {states.get(name)}: {why}"
        elif started:
            r["status"] = "unfinished"
    counts = {s: sum(r["status"] == s for r in runs) for s in STATUSES}
    return {"format": "cptsim.sweep-status/1", "out": str(out), "executor": jobs.get("executor", "local"),
            "runs": runs, "counts": counts, "warnings": warnings}


def row_layers(row: dict) -> str | None:
    """A results row's layer rules (a per-layer run; ``extra["layers"]``), None for a uniform run."""
    return (row.get("extra") or {}).get("layers") or None


def row_entry(row: dict) -> str:
    """The sweep entry a results row ran: its schedule, with ``@RULES`` for a per-layer run."""
    rules = row_layers(row)
    return row["schedule"] if rules is None else f"{row['schedule']}{ENTRY_SEP}{rules}"


def _std(xs: list[float]) -> float:
    """Sample standard deviation (ddof 1); 0 for one value."""
    n = len(xs)
    if n < 2:
        return 0.0
    m = sum(xs) / n
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))


def _spearman(x: list[float], y: list[float]) -> tuple[float | None, float | None]:
    from scipy.stats import spearmanr

    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return None, None
    r = spearmanr(x, y)
    rho, p = float(r.statistic if hasattr(r, "statistic") else r[0]), float(r.pvalue if hasattr(r, "pvalue") else r[1])
    return (None, None) if math.isnan(rho) else (rho, p)


def sweep_report(rows: list[dict], score_fn: Callable[[str, int], float] | None = None) -> dict:
    """Summarise results rows of ONE workload (see the module docstring for what is computed).

    ``score_fn(schedule_text, total_steps)``: the score to correlate; default the planner's current proxy score
    (``cptsim.study.results.proxy_score``), so a revised score is judged on old runs without re-training. Accuracy
    spread is the sample standard deviation over seeds (ddof 1; 0 for one seed). Cost is BitOPs relative to the
    costliest static baseline among the rows (static q_max of the schedule with the highest q_max), so every
    schedule sits on one axis."""
    from .results import proxy_score, score_name
    from cptsim.cost.schedules import parse_schedule

    if not rows:
        raise InputError("no finished runs to report on")
    keys = {r["workload_key"] for r in rows}
    if len(keys) > 1:
        raise InputError(f"the rows hold {len(keys)} workloads ({', '.join(sorted(keys))}); pick one with --workload")
    if score_fn is None:
        def score_fn(text, steps):
            return proxy_score(parse_schedule(text), steps)
    uniform = [r for r in rows if not row_layers(r)] or rows  # the cost axis: uniform statics where there are any
    statics = [(r["bitops_static"], r["q_max"], r["g_max"]) for r in uniform if r.get("bitops_static")]
    ref = max(statics) if statics else None
    by_sched: dict[str, list[dict]] = {}
    for r in rows:
        by_sched.setdefault(row_entry(r), []).append(r)
    # A language model's measure is its test perplexity (lower is better; test_acc is next-token accuracy)
    lm = all(isinstance((r.get("extra") or {}).get("test_ppl"), (int, float)) for r in rows)
    table = []
    for text, rs in by_sched.items():
        rs = sorted(rs, key=lambda r: r["seed"])
        accs = [float(r["test_acc"]) for r in rs]
        costs = [r["bitops"] / ref[0] for r in rs if ref and r.get("bitops") is not None]
        steps = rs[0]["steps"]
        rules = row_layers(rs[0])
        table.append({
            "schedule": text, "family": rs[0]["family"] + (" per-layer" if rules else ""),
            "layers": rules, "n": len(rs), "seeds": [r["seed"] for r in rs],
            "acc_mean": sum(accs) / len(accs), "acc_std": _std(accs), "accs": accs,
            "eval_bits": sorted({r.get("eval_bits") for r in rs if r.get("eval_bits") is not None}),
            "cost_rel": (sum(costs) / len(costs)) if costs else None,
            "bitops": sum(r["bitops"] for r in rs if r.get("bitops") is not None) / len(rs) if ref else None,
            # the proxy score rates a uniform schedule; a per-layer plan has none (left out of the correlation)
            "score": None if rules else float(score_fn(text, steps)),
            "runs": [r.get("run_path") for r in rs],
        })
        if lm:
            ppls = [float(r["extra"]["test_ppl"]) for r in rs]
            table[-1].update({"ppl_mean": sum(ppls) / len(ppls), "ppl_std": _std(ppls), "ppls": ppls})
            bpcs = [r["extra"].get("test_bpc") for r in rs]
            if all(isinstance(b, (int, float)) for b in bpcs):
                table[-1]["bpc_mean"] = sum(bpcs) / len(bpcs)
    table.sort(key=lambda t: (t["cost_rel"] if t["cost_rel"] is not None else math.inf, t["schedule"]))

    # the correlation is with "better": accuracy, or minus the perplexity
    mean_key, seeds_key, sign = ("ppl_mean", "ppls", -1.0) if lm else ("acc_mean", "accs", 1.0)
    scored = [t for t in table if t["score"] is not None]
    rho, p = _spearman([t["score"] for t in scored], [sign * t[mean_key] for t in scored])
    per_seed = {}
    for seed in sorted({s for t in scored for s in t["seeds"]}):
        pts = [(t["score"], sign * t[seeds_key][t["seeds"].index(seed)]) for t in scored if seed in t["seeds"]]
        r_s, _ = _spearman([a for a, _ in pts], [b for _, b in pts])
        if r_s is not None:
            per_seed[str(seed)] = r_s
    vals = list(per_seed.values())
    notes = []
    if rho is None:
        notes.append("no rank correlation: it needs at least 3 schedules whose scores and "
                     f"{'perplexities' if lm else 'accuracies'} are not all equal")
    costs = [t["cost_rel"] for t in table if t["cost_rel"] is not None]
    return {
        "format": REPORT_FORMAT,
        "workload_key": next(iter(keys)), "workload": rows[0].get("workload"),
        "runs": len(rows), "schedules": table,
        "cost_reference": ({"schedule": f"static:{ref[1]}:g{ref[2]}", "bitops": ref[0]} if ref else None),
        "cost_range": [min(costs), max(costs)] if costs else None,
        "score_name": score_name(),
        "measure": ({"key": "ppl", "name": "test perplexity", "higher_is_better": False} if lm else
                    {"key": "acc", "name": "test accuracy", "higher_is_better": True}),
        "spearman": {"rho": rho, "p_value": p, "n_schedules": len(scored),
                     "per_seed": per_seed, "per_seed_mean": (sum(vals) / len(vals)) if vals else None,
                     "per_seed_std": _std(vals) if vals else None,
                     "what": "Spearman rank correlation between the proxy score and "
                             + ("minus the mean test perplexity (a language model: lower is better)" if lm else
                                "the mean test accuracy")
                             + " over schedules; per seed: the same over the schedules run with that seed"},
        "notes": notes,
    }

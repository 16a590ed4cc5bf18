"""The cyclic-precision training loop: read it top to bottom.

`train(config, out)` starts a run, `resume(run_dir)` continues one from its last checkpoint. Each step
(``_Training``, driven by ``_loop``): look up this step's bits in the schedule, set them on the shared
PrecisionState, run one quantized SGD step, append one trace line. Each epoch: re-estimate BatchNorm statistics at
the evaluation bits, evaluate, append one metrics line, replace the checkpoint (epochs of milliseconds: every few
epochs, ``_CheckpointPacer``). In one process on a GPU the host reads and records step k while the GPU runs step
k+1 (``lagged_reads``), so its per-step work (costs, energy, the trace line) overlaps the GPU's instead of adding
to it; a CPU run reads each step as it ends, and both record the same numbers.

Determinism (what makes a resumed run identical to an uninterrupted one):
* the data order of epoch e is a permutation drawn from a generator seeded by (seed, e), not from a stream
  carried across epochs, so any step of any epoch can be found again without replaying the ones before;
* augmentation (crops, flips) of sample i in epoch e is seeded by (seed, e, i) alone (``SeededAugmentation``),
  whichever DataLoader worker reads it and wherever the loader started;
* the only other randomness (stochastic rounding, dropout) draws from torch's global generators, whose states
  (every rank's, CPU and CUDA) are saved in the checkpoint with every rank's model buffers (an LSTM's carried
  state);
* the schedule and learning rate are pure functions of the global step.

Data parallel (torchrun, see cptsim.run.dist): every rank walks the same global batches; rank r takes the r-th of
`world` near-equal contiguous chunks of each, so each sample is seen exactly once per epoch (no padding), a rank
may get none of a small last batch, and the schedule is indexed by the global step. Gradients are summed across
ranks and divided by the global batch, so the update is that of the global batch. Rank 0 alone writes the run dir.
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

from cptsim import __version__
from cptsim.cost.runlength import RunLength
from cptsim.cost.schedules import aliasing
from cptsim.errors import InputError, RunFailed, RunStopped
from cptsim.measure.opcount import zero_grad
from cptsim.models.loss import class_cross_entropy
from .hostmem import retain_freed_memory, retained
from .rundir import RunDir

from .config import (LR_SCHEDULES, PLAN_FIXED, TrainConfig, check_world, loss_divisor, new_loss_unit,  # noqa: F401
                     recorded_loss_unit, run_workload, validate, workload_key)


@dataclass
class Workload:
    """The objects a config resolves to."""

    model: nn.Module
    precision: object
    train_set: object
    test_loader: DataLoader
    info: object
    schedule: object
    bits: list[int]
    grad_bits: list[int]
    steps_per_epoch: int
    total_steps: int
    fp_layers: list[str] = field(default_factory=list)
    quantized_layers: list[str] = field(default_factory=list)
    val_loader: DataLoader | None = None  # held out of train_set (cfg.val_split), without augmentation
    eval_bits: int = 8                    # cfg.eval_bits, or the schedule's q_max
    recal_set: object = None              # train_set's samples without augmentation (None: train_set has none)
    # a per-layer plan (cptsim.cost.layerplan.ResolvedLayers, None: every layer follows the schedule) and, per
    # distinct layer schedule, (its PrecisionState, its bits per step, the bits it is evaluated at)
    layers: object = None
    layer_states: list = field(default_factory=list)

    def set_bits(self, bits: int, grad_bits: int, step: int | None = None) -> None:
        """Every quantized layer's precision for a training step (``step``) or, with ``step`` None, for
        evaluation at ``bits`` (then a per-layer plan's layers run their own evaluation bits)."""
        self.precision.set(bits, grad_bits)
        for state, per_step, at_eval in self.layer_states:
            state.set(per_step[step] if step is not None else at_eval, grad_bits)

    def set_all(self, bits: int, grad_bits: int) -> None:
        """Every quantized layer at ``bits``, the per-layer plan's ones too (the op count at full precision)."""
        self.precision.set(bits, grad_bits)
        for state, _, _ in self.layer_states:
            state.set(bits, grad_bits)


def lr_factor(kind: str, step: int, total: int, floor: float = 0.0) -> float:
    """Learning-rate multiplier at a global step: CPT's step decay (x0.1 at 50% and 75%), cosine (from 1 down to
    ``floor``, a fraction of the peak: torch's CosineAnnealingLR with eta_min = floor x lr), or constant."""
    if kind == "step":
        return 0.1 ** ((step >= 0.5 * total) + (step >= 0.75 * total))
    if kind == "cosine":
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * step / total))
    return 1.0


def step_lr(cfg: TrainConfig, step: int, total: int) -> float:
    """The learning rate of a global step: ``cfg.lr`` x ``lr_factor``, the cosine's floor at ``cfg.lr_min``."""
    return cfg.lr * lr_factor(cfg.lr_schedule, step, total, cfg.lr_min / cfg.lr)


def is_graph(dataset) -> bool:
    """A node-classification graph split (cptsim.data.graph.GraphSplit): one sample is the whole graph, its
    labels are -100 (cross-entropy's ignore_index) outside the split's mask, and losses and accuracies are per
    labelled node (``dataset.labelled`` of them)."""
    return bool(getattr(dataset, "is_graph", False))


IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index: a graph's nodes outside the split's mask


_DEFAULT_THREADS = torch.get_num_threads()  # torch's own choice, before any build() narrowed it
SMALL_INPUT = 1024  # elements per sample: digits 64 and MNIST 784 are small; CIFAR 3072 is not
# elements of a whole graph (nodes x features) that count as small: a graph is one sample and its step's one
# batch, so it is compared with what a default batch (128) of small inputs holds. karate's 34 x 34 is small,
# Cora's 2708 x 1433 is not.
SMALL_GRAPH = 128 * SMALL_INPUT


def cpu_threads(requested: int | None, input_shape, graph: bool = False) -> int:
    """Threads for torch on the CPU. Auto: one for small inputs (or a small graph), torch's default otherwise.

    Why: the ops of an 8x8 or 28x28 model are far too small to split, and OpenMP's fork/join then costs more than
    the work - on a 2-core machine with another busy process, the default digits run took 75 s of step time with
    2 threads and 6.8 s with 1 (measured side by side, 2026-11-25); the default gcn run on karate (a 34-node
    graph) spent 21 s in its 200 forward + backward passes with 2 threads and 3.0 s with 1 (cProfile, same
    loaded machine, 2026-11-27).
    """
    if requested is not None:
        return requested
    n = 1
    for d in input_shape:
        n *= int(d)
    return 1 if n <= (SMALL_GRAPH if graph else SMALL_INPUT) else _DEFAULT_THREADS


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The sample order of one epoch: a permutation fixed by (seed, epoch) alone."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of one sample's augmentation in one epoch: a function of (seed, epoch, sample index) alone."""
    h = (seed * 0x9E3779B97F4A7C15 + epoch) & 0xFFFFFFFFFFFFFFFF
    h = (h * 0xBF58476D1CE4E5B9 + index) & 0xFFFFFFFFFFFFFFFF
    h ^= h >> 31
    return (h * 0x94D049BB133111EB) & 0x7FFFFFFFFFFFFFFF


class SeededAugmentation(torch.utils.data.Dataset):
    """One epoch's view of a training set whose transforms draw random numbers (crops, flips): sample i is read
    with torch's and Python's generators seeded by ``sample_seed(seed, epoch, i)``, and both put back after.

    Why: a DataLoader worker's generator otherwise runs on from one sample to the next, so a batch's crops depend
    on which worker read it and what it read before; a loader rebuilt at batch ``first`` (a mid-epoch resume)
    drew different crops from the uninterrupted run's. Seeded per sample, any batch can be rebuilt alone, in any
    worker or in the main process, and reading one draws nothing from the training loop's own generators."""

    def __init__(self, dataset, seed: int, epoch: int):
        self.dataset, self.seed, self.epoch = dataset, seed, epoch

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i):
        import random

        s = sample_seed(self.seed, self.epoch, int(i))
        saved = random.getstate()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(s)
            random.seed(s)
            try:
                return self.dataset[i]
            finally:
                random.setstate(saved)


def augments(dataset) -> bool:
    """Whether reading a sample of ``dataset`` may run transforms (torchvision datasets, through any Subsets)."""
    from torch.utils.data import Subset

    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return getattr(dataset, "transform", None) is not None or getattr(dataset, "transforms", None) is not None


def local_share(global_batch: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's part of a global batch: the rank-th of `world` near-equal contiguous chunks (maybe empty)."""
    return torch.tensor_split(global_batch, world)[rank]


def build(cfg: TrainConfig) -> Workload:
    """Resolve a config into model, data and schedule. Model init draws from the seeded global RNG."""
    from cptsim.data import load_datasets
    from cptsim.numerics.layers import quantize_model, quantized_layer_names, resolve_fp_layers
    from cptsim.models import create_model, default_fp_layers
    from cptsim.cost.schedules import parse_schedule

    validate(cfg)
    schedule = parse_schedule(cfg.schedule)
    train_set, test_set, info = load_datasets(cfg.dataset, cfg.data_dir, augment=cfg.augment,
                                              image_size=cfg.image_size)
    if not cfg.device.startswith("cuda"):
        torch.set_num_threads(cpu_threads(cfg.threads, info.input_shape, graph=info.graph_edges is not None))
        retain_freed_memory()  # (cptsim.run.hostmem: a step's blocks stay in the process, not faulted back in)
    torch.manual_seed(cfg.seed)
    model = create_model(cfg.model, num_classes=info.num_classes, in_channels=info.input_shape[0],
                         input_shape=tuple(info.input_shape), graph=info.graph_edges is not None)
    graph = is_graph(train_set)
    if graph:  # the structure is the model's to hold (a buffer that moves with it), the features are the sample
        from cptsim.models.graph import bind_graph

        bind_graph(model, train_set.graph.edge_index)
    # None: the model's own convention, resolved by the registry; else the user's globs, expanded
    fp_layers = default_fp_layers(model) if cfg.fp_layers is None else resolve_fp_layers(model, cfg.fp_layers)
    precision = quantize_model(model, fp_layers=fp_layers, **({"quant_agg": True} if cfg.quant_agg else {}),
                               **_format_kwargs(cfg))
    layers, layer_states = _layer_plan(cfg, model, schedule, fp_layers)
    model.to(cfg.device)
    if not isinstance(cfg.channels_last, bool):
        raise InputError(f"channels_last must be true or false, got {cfg.channels_last!r}")
    if cfg.channels_last:
        model.to(memory_format=torch.channels_last)

    val_loader = None
    # the same training files read without augmentation (the evaluation's transforms): BatchNorm re-estimation
    # and the validation split see what evaluation sees (centre crops, not random resized crops)
    plain = load_datasets(cfg.dataset, cfg.data_dir, augment=False, image_size=cfg.image_size)[0] \
        if cfg.augment and augments(train_set) else None
    recal_set = plain
    valid = getattr(train_set, "valid", None)  # a text dataset's or a graph's own validation split (data.text, .graph)
    if graph and cfg.val_split and valid is None:
        raise InputError(f"{info.name} has no validation nodes to hold out (a graph's validation split is its own "
                         "mask, not a fraction of the training nodes); leave --val-split out")
    if valid is not None:
        val_loader = DataLoader(valid, batch_size=max(cfg.batch_size, 256), shuffle=False)
    elif cfg.val_split:
        train_set, val_set, recal_set = validation_split(cfg, train_set, plain)
        val_loader = DataLoader(val_set, batch_size=max(cfg.batch_size, 256), shuffle=False,
                                num_workers=cfg.workers, pin_memory=cfg.device.startswith("cuda"))
    run = RunLength(cfg.batch_size, len(train_set))  # the ragged last batch is a step too
    steps_per_epoch = run.steps_per_epoch
    total = cfg.steps if cfg.steps is not None else run.epoch_steps(cfg.epochs)
    test_loader = DataLoader(test_set, batch_size=max(cfg.batch_size, 256), shuffle=False,
                             num_workers=cfg.workers, pin_memory=cfg.device.startswith("cuda"))
    return Workload(
        model=model, precision=precision, train_set=train_set, test_loader=test_loader, info=info,
        schedule=schedule, bits=schedule.bits(total).tolist(), grad_bits=schedule.grad_bits(total).tolist(),
        steps_per_epoch=steps_per_epoch, total_steps=total, fp_layers=fp_layers,
        quantized_layers=quantized_layer_names(model), val_loader=val_loader,
        eval_bits=cfg.eval_bits if cfg.eval_bits is not None else schedule.q_max, recal_set=recal_set,
        layers=layers, layer_states=[(st, s.bits(total).tolist(), layers.eval_bits(names[0], cfg.eval_bits))
                                     for st, s, names in layer_states],
    )


def _format_kwargs(cfg: TrainConfig) -> dict:
    """quantize_model's number-format arguments: none for the integer family without a gradient format (the call,
    and the path, of every run before formats existed)."""
    if cfg.number_format.strip().lower() == "int" and cfg.grad_format is None:
        return {}
    return {"number_format": cfg.number_format, "grad_format": cfg.grad_format}


def run_formats(cfg: TrainConfig, w: "Workload") -> dict | None:
    """What config.json records under "number_format": the family, the gradient format and the formats each width
    of this run names ({"forward": {bits: name}, "gradient": {bits: name}}, the evaluation's bits included); None for
    the integer family."""
    fmap = w.precision.formats
    if fmap is None:
        return None
    used = fmap.used(list(w.bits) + [w.eval_bits], w.grad_bits)
    return {**fmap.to_json(), "formats": {k: {str(b): n for b, n in v.items()} for k, v in used.items()}}


def _layer_plan(cfg: TrainConfig, model: nn.Module, schedule, fp_layers):
    """The run's per-layer plan resolved on its model (None without one), and per distinct layer schedule its
    own PrecisionState, bound to its layers: [(state, schedule, layer names)]."""
    if not cfg.layer_schedule:
        return None, []
    from cptsim.cost.layerplan import layer_schedule_from_json
    from cptsim.numerics.families import format_map
    from cptsim.numerics.layers import PrecisionState, assign_precision, quantized_layer_names

    layers = layer_schedule_from_json(cfg.layer_schedule, "layer_schedule").resolve(
        schedule, quantized_layer_names(model), list(fp_layers), cfg.model)
    out = []
    for sched, names in layers.groups():
        state = PrecisionState(formats=format_map(cfg.number_format, cfg.grad_format))
        assign_precision(model, {n: state for n in names})
        out.append((state, sched, names))
    return layers, out


VAL_SPLIT_SEED = 12345  # one fixed held-out set per dataset, whatever the run's seed: runs stay comparable


def validation_split(cfg: TrainConfig, train_set, plain=None):
    """(train part, validation part, train part un-augmented or None) of the training set: a fixed random
    ``cfg.val_split`` of it is held out.

    The validation part is read without augmentation (``plain``: a second, un-augmented view of the same training
    files; None when ``train_set`` does not augment), so that it measures what the test split would, and the
    planner's pilot can rank on it without touching the test split."""
    from torch.utils.data import Subset

    from cptsim.data import load_datasets

    from .config import held_out

    n = len(train_set)
    n_val = held_out(n, cfg.val_split)
    if n_val < 1 or n_val >= n:
        raise InputError(f"--val-split {cfg.val_split} of {n} training samples leaves no validation or no "
                         "training data")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(VAL_SPLIT_SEED))
    val_idx, train_idx = perm[:n_val].sort().values.tolist(), perm[n_val:].sort().values.tolist()
    return (Subset(train_set, train_idx), Subset(plain if plain is not None else train_set, val_idx),
            Subset(plain, train_idx) if plain is not None else None)


def epoch_batches(cfg: TrainConfig, w: Workload, epoch: int, first: int, last: int, rank: int, world: int):
    """Yield (global step index in epoch, global batch size, this rank's (x, y) or None) for steps first..last-1.

    Local batches load through a DataLoader (worker processes, pinned memory) driven by an explicit list of index
    lists; its generator is seeded per epoch so creating it draws nothing from the global RNG. Augmentation is
    seeded per sample (``SeededAugmentation``), so a batch is the same whichever worker reads it and whether the
    loader started at batch 0 or at a resumed run's batch ``first``.
    """
    stream = getattr(w.train_set, "stream_order", None)  # text: contiguous BPTT streams, the same every epoch
    order = stream(cfg.batch_size) if stream is not None else epoch_order(len(w.train_set), cfg.seed, epoch)
    if stream is not None and first == 0 and hasattr(w.model, "reset_state"):
        w.model.reset_state()  # the streams start again; a run resumed mid-epoch keeps its checkpoint's state
    B = cfg.batch_size
    share = getattr(w.train_set, "rank_share", None)  # text: every rank keeps its own rows of the streams
    plan = []
    for i in range(first, last):
        g = order[i * B:(i + 1) * B]
        mine = share(g, rank, world, B) if share is not None else local_share(g, rank, world)
        plan.append((i, g.numel(), mine.tolist()))
    gather = getattr(w.train_set, "gather", None)
    if gather is not None:  # synthetic data: the batch is gathered where it lives (on the GPU), no DataLoader
        for i, n_global, idx in plan:
            yield i, n_global, (gather(idx, cfg.device) if idx else None)
        return
    lists = [idx for _, _, idx in plan if idx]
    data = SeededAugmentation(w.train_set, cfg.seed, epoch) if cfg.augment and augments(w.train_set) else w.train_set
    loader = iter(DataLoader(data, batch_sampler=lists, num_workers=cfg.workers,
                             pin_memory=cfg.device.startswith("cuda"),
                             generator=torch.Generator().manual_seed(cfg.seed * 7919 + epoch)))
    for i, n_global, idx in plan:
        yield i, n_global, (next(loader) if idx else None)


def quantizer_path(device: str) -> str:
    """Which quantizers a run on this device executes: their random draws differ (cptsim.numerics.ckernels), so a run is
    reproduced draw for draw only on the same path."""
    from cptsim.numerics import quant

    return quant.kernel_route(device)


def tf32_flags() -> dict:
    """Whether this process lets FP32 GEMMs run in TF32 on an Ampere-or-later GPU, per library: PyTorch's defaults
    are False for matmuls (cuBLAS: Linear, attention) and True for convolutions (cuDNN). The GPU cost model prices
    FP32 ops on those tiers (``cptsim.cost.hardware.gpu``); a run that changed them is priced with
    ``GPUProfile.allow_tf32_matmul()``."""
    return {"torch.backends.cuda.matmul.allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "torch.backends.cudnn.allow_tf32": bool(torch.backends.cudnn.allow_tf32)}


def _is_text(w: Workload) -> bool:
    return bool(getattr(w.train_set, "is_text", False))


def resolved_config(cfg: TrainConfig, w: Workload, world: int = 1) -> dict:
    """What config.json records: the settings, what they resolved to, and the versions that ran them."""
    from cptsim.numerics.exact_gemm import format_gemm_paths, gemm_paths
    from cptsim.numerics.layers import unquantized_layers
    from cptsim.run.device import device_record

    config = {
        # the image size resolved (imagefolder's own when not given): what a resume, plan and report must see
        "settings": asdict(cfg) | ({"image_size": int(w.info.input_shape[-1])}
                                   if w.info.name == "imagefolder" else {}),
        "schedule": w.schedule.to_json() | {"text": w.schedule.to_text()},
        **({"layers": w.layers.to_json()} if w.layers is not None else {}),
        "total_steps": w.total_steps,
        "steps_per_epoch": w.steps_per_epoch,
        "epochs": math.ceil(w.total_steps / w.steps_per_epoch),
        "eval_bits": w.eval_bits,
        "loss_unit": new_loss_unit(_is_text(w)),  # what the trace's losses are per (cptsim.run.config)
        "recal_batches": cfg.recal_batches,
        "val_size": len(w.val_loader.dataset) if w.val_loader is not None else 0,
        "input_shape": list(w.info.input_shape),
        "num_classes": w.info.num_classes,
        "train_size": len(w.train_set),
        "test_size": len(w.test_loader.dataset),
        "fp_layers": w.fp_layers,
        "quantized_layers": w.quantized_layers,
        # every Conv2d/Linear-like layer left in full precision and why: --fp-layers, a subclass with a forward of
        # its own (timm's Conv2dSame), a layer whose owner never calls its forward
        "unquantized_layers": unquantized_layers(w.model),
        # the format each width named; absent for integers (their runs' config.json stays as it was)
        **({"number_format": run_formats(cfg, w)} if w.precision.formats is not None else {}),
        "world_size": world,
        "versions": {"cptsim": __version__, "torch": torch.__version__, "python": platform.python_version()},
        "host": {"machine": platform.machine(), "threads": torch.get_num_threads(),
                 "quantizers": quantizer_path(cfg.device), **tf32_flags(),
                 # what the C allocator keeps of a step's freed memory (cptsim.run.hostmem); None: its default
                 "malloc": retained(),
                 # torch.optim's update: fused on CUDA, foreach elsewhere; a resume keeps the run's
                 "optimizer_impl": optimizer_impl(cfg.device),
                 # which GEMMs of each quantized layer run exact int8 and which the FP32 fake-quant path
                 "gemm_paths": gemm_paths(w.model, cfg.device) if w.precision.formats is None else
                 format_gemm_paths(w.model, cfg.device, w.precision.formats)},
        # the hardware that ran it, and (a GPU) the profile that describes it: what report models the run with
        "device": device_record(cfg.device),
        "argv": sys.argv,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    # the key its results row gets (cptsim.study.results), and the planner looks its workload up by
    config["workload_key"] = workload_key(run_workload(config))
    return config


def reset_statistics(model: nn.Module) -> list:
    """Forget what the model learnt about its activations: BatchNorm running statistics (switched to a plain
    cumulative average, as ``torch.optim.swa_utils.update_bn`` does) and the quantized layers' running input
    ranges. Returns what ``restore_momenta`` needs to put the BatchNorm momenta back."""
    from cptsim.numerics.layers import QUANTIZED_TYPES

    saved = []
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            m.reset_running_stats()
            saved.append((m, m.momentum))
            m.momentum = None
        elif isinstance(m, QUANTIZED_TYPES):
            m.act_count.zero_()  # the next batch sets the range, later ones average into it
    return saved


def restore_momenta(saved: list) -> None:
    for m, momentum in saved:
        m.momentum = momentum


@torch.no_grad()
def recalibrate(w: Workload, cfg: TrainConfig, epoch: int, device: str) -> dict:
    """Re-estimate BatchNorm statistics and activation ranges at the evaluation precision (``w.eval_bits``) from
    ``cfg.recal_batches`` training batches: forward passes in training mode, no gradient, no weight change. The
    batches are read without augmentation (``w.recal_set``), as evaluation reads its images: statistics of
    random resized crops are not those of the centre crops evaluated.

    Why: the statistics a model carries belong to the precision it last trained at. A schedule that ends at 3 bits
    and is evaluated at 8 carries 3-bit BatchNorm statistics and ranges; measured on MNIST, that alone
    took a model from ~91% to ~24% test accuracy, and re-estimating at 8 bits gave it back (92.5%). The batches
    are the first of a permutation seeded by (seed, epoch), and the global RNG (dropout) is forked so that
    training afterwards draws exactly what it would have drawn without this. Returns its cost."""
    t0 = time.perf_counter()
    k = min(cfg.recal_batches, RunLength(cfg.batch_size, len(w.train_set)).steps_per_epoch)
    if k <= 0:
        return {"batches": 0, "samples": 0, "time_s": 0.0}
    order = torch.randperm(len(w.train_set), generator=torch.Generator().manual_seed(cfg.seed * 7_919 + epoch + 1))
    lists = [order[i * cfg.batch_size:(i + 1) * cfg.batch_size].tolist() for i in range(k)]
    devices = [torch.device(device)] if device.startswith("cuda") else []
    samples = 0
    with torch.random.fork_rng(devices=devices):
        saved = reset_statistics(w.model)
        w.model.train()
        w.set_bits(w.eval_bits, w.schedule.g_max)
        try:
            data = w.recal_set if w.recal_set is not None else w.train_set
            for x, _ in DataLoader(data, batch_sampler=lists, num_workers=cfg.workers):
                w.model(x.to(device, non_blocking=True))
                samples += x.shape[0]
        finally:
            restore_momenta(saved)
    return {"batches": k, "samples": samples, "time_s": round(time.perf_counter() - t0, 4)}


@torch.no_grad()
def evaluate(w: Workload, device: str, loader: DataLoader | None = None,
             per_sample: list | None = None) -> tuple[float, float]:
    """Loss and accuracy on ``loader`` (default: the test split) at ``w.eval_bits`` (the precision the trained
    model is meant to be used at: the schedule's q_max unless --eval-bits says otherwise). ``per_sample``: a list
    that receives each batch's per-sample correctness (a classifier), or a language model's mean loss per BPTT
    window (one tensor, in the order of the text: ``cptsim.data.text.evaluate_lm``)."""
    w.model.eval()
    w.set_bits(w.eval_bits, w.schedule.g_max)
    split = (loader or w.test_loader).dataset
    if getattr(split, "is_text", False):  # per token, the state carried along the text (cptsim.data.text)
        from cptsim.data.text import evaluate_lm

        return evaluate_lm(w.model, split, device, windows=per_sample)
    loss_sum, correct, n = 0.0, 0, 0
    for x, y in (loader or w.test_loader):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        logits = w.model(x)
        loss_sum += class_cross_entropy(logits, y, reduction="sum").item()
        labelled = y != IGNORE_INDEX  # all of them, but a graph's nodes outside the split's mask
        hit = (logits.argmax(1) == y)[labelled]
        correct += hit.sum().item()
        n += hit.numel()
        if per_sample is not None:
            per_sample.append(hit.cpu())
    return loss_sum / n, correct / n


def _fault(name: str) -> int | None:
    """Test hooks (crash-safety tests): CPTSIM_FAULT_KILL_AT_STEP=k sends this process SIGKILL as step k begins,
    CPTSIM_FAULT_SIGINT_AT_STEP=k sends it SIGINT, CPTSIM_FAULT_NAN_AT_STEP=k makes step k's loss NaN.
    CPTSIM_FAULT_RANK=r limits them to rank r; a job torchrun restarted (TORCHELASTIC_RESTART_COUNT > 0) runs
    without them, as a restart after a real fault would."""
    v = os.environ.get(f"CPTSIM_FAULT_{name}_AT_STEP")
    rank = os.environ.get("CPTSIM_FAULT_RANK")
    if rank is not None and rank != os.environ.get("RANK", "0"):
        return None
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") not in ("", "0"):
        return None
    return int(v) if v else None


def _lock_run(path, d, check=None):
    """Rank 0 runs ``check`` and takes the run's lock (or adopts the one its launcher holds, see
    cptsim.run.rundir.RunLock); every rank learns whether it could, so that a refused job stops on all ranks (exit 2)
    and writes nothing."""
    from .rundir import RunLock

    lock, error = None, None
    if d.is_main:
        try:
            if check is not None:
                check()  # before the lock file is touched: a refused new run changes nothing on disk
            lock = RunLock.acquire(path)
        except InputError as e:
            error = e
    if d.any(error is not None):
        raise error or InputError(f"{path}: rank 0 could not take the run's lock; see its message")
    return lock


def train(cfg: TrainConfig, out: str, progress: bool = True, plan: dict | None = None) -> RunDir:
    """Start a new run in directory `out` (which must not exist or be empty) and train it to the end.

    With `plan`, the run records the plan it executed (a copy as plan.json, its digest in config.json).
    The run's lock (cptsim.run.rundir.RunLock) is held from before the directory is created until this returns.
    """
    from cptsim.run import dist
    from .rundir import PLAN

    d = dist.from_env(cfg.device)
    check_world(cfg.dataset, d.world)  # before anything is built or written
    w = build(cfg)
    lock = _lock_run(out, d, check=lambda: RunDir.check_new(out))
    try:
        run = RunDir(out)
        if d.is_main:
            config = resolved_config(cfg, w, d.world)
            from cptsim.run.planfile import run_records

            config.update(run_records(w.schedule, plan))  # the plan, and what the report measures savings against
            run = RunDir.create(out, config)
            if plan is not None:
                run.write_json(PLAN, plan)
        d.barrier()
        alias = aliasing(w.schedule, w.total_steps)
        if alias and d.is_main:  # trained as asked (every check passed), but the bits will not follow the shape
            print(f"warning: {alias}", file=sys.stderr)
        return _loop(cfg, w, run, d, start_step=0, progress=progress)
    finally:
        if lock is not None:
            lock.release()


def resume(run_path: str, progress: bool = True, keep_checkpoints: int | None = None) -> RunDir:
    """Continue a run from its newest intact checkpoint; trace lines after it are dropped and re-run.

    A checkpoint that is missing, truncated, fails its checksum or does not load is passed over for the one
    before it (one line on stderr says so). ``keep_checkpoints`` replaces the run's --keep-checkpoints."""
    from cptsim.run import dist

    run = RunDir.open(run_path)
    recorded = run.read_config()
    cfg = TrainConfig.from_dict(recorded["settings"])
    if isinstance(recorded.get("schedule"), dict):
        # the schedule the run resolved, gradient bits written out: a settings text written before static:32 meant
        # an unquantized error (it meant static:32:g8) resumes as what it ran
        from cptsim.cost.schedules import Schedule

        cfg.schedule = Schedule.from_json(recorded["schedule"]).to_text()
    if keep_checkpoints is not None:
        cfg.keep_checkpoints = keep_checkpoints
    d = dist.from_env(cfg.device)
    check_world(cfg.dataset, d.world)
    w = build(cfg)
    _warn_gemm_path_change(recorded, w, cfg, d)
    lock = _lock_run(run_path, d)
    try:
        choice = run.find_checkpoint(map_location="cpu")
        if choice.entry is None and choice.skipped:
            raise InputError(choice.unusable_message(run_path))
        ckpt, start = choice.state, choice.step
        note = choice.fallback_message()
        if note and d.is_main:
            print(f"warning: {note}", file=sys.stderr)
        if not d.same(start):  # every rank reads the same files; a shared filesystem that disagrees is fatal
            raise RunFailed(f"{run_path}: the ranks found different checkpoints to resume from (is the run "
                            "directory on a filesystem every node sees the same way?)")
        if ckpt is not None:
            if len(ckpt["rng"]["torch"]) != d.world:
                raise InputError(f"{run_path} was checkpointed by {len(ckpt['rng']['torch'])} process(es); resume "
                                 f"it with the same number (--nproc {len(ckpt['rng']['torch'])}), not {d.world}")
            w.model.load_state_dict(rank_model_state(ckpt, d.rank))
        if d.is_main:
            run.remove_stale_temp_files()
            run.truncate_after(start)
        unit, unit_note = recorded_loss_unit(recorded, _is_text(w))
        if unit_note and d.is_main:
            print(f"note: {unit_note}", file=sys.stderr)
            run.update_config("loss_unit", unit)  # recorded now: said once, and the next resume reads it
        d.barrier()
        # the optimizer implementation the run started with (one recorded before there was a choice: this device's)
        impl = (recorded.get("host") or {}).get("optimizer_impl")
        return _loop(cfg, w, run, d, start_step=start, progress=progress, ckpt=ckpt, opt_impl=impl,
                     loss_unit=unit)
    finally:
        if lock is not None:
            lock.release()


def _warn_gemm_path_change(recorded: dict, w: Workload, cfg: TrainConfig, d) -> None:
    """One line on stderr when this process would run other GEMM paths than the run recorded (an exact path on one
    machine, the fake-quant one on another): the resume goes on, but is bit-identical only within a path."""
    from cptsim.numerics.exact_gemm import format_gemm_paths, gemm_paths, path_change

    now = gemm_paths(w.model, cfg.device) if w.precision.formats is None else \
        format_gemm_paths(w.model, cfg.device, w.precision.formats)
    note = path_change((recorded.get("host") or {}).get("gemm_paths"), now)
    if note and d.is_main:
        print(f"warning: {note}", file=sys.stderr)


def rank_states(d, model: nn.Module, device: str) -> dict:
    """What a checkpoint holds of each rank, gathered from every rank in rank order (a collective):

    * ``rng``: ``torch``, every rank's CPU generator state; ``cuda``, every rank's CUDA generator state on a GPU
      (each rank draws its own stochastic-rounding noise and dropout masks, on its own device), else None;
    * ``rank_buffers``: with several ranks, every rank's model buffers. They are rank-local between the
      end-of-epoch broadcasts: an LSTM's hidden state carried along this rank's rows of the text streams, the
      BatchNorm statistics and activation ranges of its own samples. ``model`` holds rank 0's."""
    cuda = d.gather_tensor(torch.cuda.get_rng_state()) if str(device).startswith("cuda") else None
    buffers = None
    if d.active:
        names = {n for n, _ in model.named_buffers()}
        buffers = d.gather_object({k: v.detach().cpu() for k, v in model.state_dict().items() if k in names})
    return {"rng": {"torch": d.gather_rng(), "cuda": cuda}, "rank_buffers": buffers}


def rank_model_state(ckpt: dict, rank: int) -> dict:
    """The state_dict this rank resumes with: the checkpoint's model, with this rank's own buffers."""
    per_rank = ckpt.get("rank_buffers")
    if per_rank is None:  # one process, or a checkpoint of an older cptsim (rank 0's buffers on every rank)
        return ckpt["model"]
    return {**ckpt["model"], **per_rank[rank]}


def restore_rng(ckpt: dict, d, device: str) -> None:
    """Put this rank's generators back as the checkpoint recorded them (see ``rank_states``)."""
    torch.set_rng_state(ckpt["rng"]["torch"][d.rank])
    cuda = ckpt["rng"].get("cuda")
    if str(device).startswith("cuda") and cuda is not None:
        if d.rank < len(cuda):
            torch.cuda.set_rng_state(cuda[d.rank])
        elif d.is_main:  # an older cptsim saved rank 0's alone: this rank keeps its seeded generator
            print(f"warning: the checkpoint holds {len(cuda)} CUDA generator state(s) for {d.world} ranks (an older "
                  "cptsim saved rank 0's only); ranks without one continue from a fresh seed, so this resume is "
                  "not bit-identical to an uninterrupted run", file=sys.stderr)


SYNC_CHECK_WARMUP = 2  # steps not checked: the first ones compile the fused quantizers, which may synchronise


def _compiles() -> int:
    """Graphs torch.compile has built in this process so far (a step that built one is a warm-up step)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    return int(dynamo.counters["stats"]["unique_graphs"]) if dynamo is not None else 0


class _SyncCheck:
    """CPTSIM_SYNC_DEBUG=warn|error on CUDA: count the host-device synchronisations of each training step (trace
    key ``host_syncs``; the target is 1, the step's read of loss and counts -- read one step late, the wait for the
    step's end, which the loop counts itself: torch sees no event wait). ``error`` makes any other one raise
    where it happens (torch.cuda.set_sync_debug_mode). Off (the default), every method is a no-op."""

    def __init__(self, mode: str, first_step: int):
        if mode not in ("", "warn", "error"):
            raise InputError(f"CPTSIM_SYNC_DEBUG must be warn or error, got {mode!r}")
        self.mode, self.first_step = mode, first_step

    def begin(self, step: int):
        if not self.mode or step < self.first_step:
            return None
        import warnings

        ctx = warnings.catch_warnings(record=True)
        caught = ctx.__enter__()
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode(self.mode)
        return ctx, caught

    def allow(self) -> None:
        if self.mode and torch.cuda.get_sync_debug_mode():
            torch.cuda.set_sync_debug_mode("warn")

    def end(self, state) -> int | None:
        if state is None:
            return None
        ctx, caught = state
        torch.cuda.set_sync_debug_mode(0)
        ctx.__exit__(None, None, None)
        # torch's sync warning; not its one-time "Synchronization debug mode is a prototype feature" notice
        return sum("called a synchronizing CUDA operation" in str(w.message) for w in caught)


def _stopped(step: int, total: int, run: RunDir) -> str:
    """What a run stopped on request (^C, SIGTERM) says: not an error -- where it stopped, and how to go on."""
    return (f"stopped after step {step} of {total}, as asked; the checkpoint is saved - continue with: "
            f"cptsim train --resume {run.path}")


class _CheckpointPacer:
    """Whether an epoch's end writes a checkpoint, when no --checkpoint-every was given: yes, unless the last one
    was written so recently that writing another would make checkpoints more than 1/(RATIO + 1) of the run's wall
    time (RATIO x the last write's own time has not passed since it ended). Epochs of seconds or more checkpoint at
    every end as before; epochs of milliseconds (a 34-node graph's single step: the default gcn run wrote 200
    checkpoints of 3.4 MB, 15 of its 70 s) checkpoint every few epochs. A SIGKILL then costs the steps since the
    last one (at most RATIO x a checkpoint's write time, or one epoch); a resume is as exact from any checkpoint.
    Rank 0 writes, so rank 0's clock decides, for every rank (``d.any``)."""

    RATIO = 20.0

    def __init__(self):
        self.last_end, self.cost = time.perf_counter(), 0.0  # the first epoch's end checkpoints

    def due(self, d, forced: bool) -> bool:
        recent = time.perf_counter() - self.last_end < self.RATIO * self.cost
        return d.any(forced or (d.is_main and not recent))

    def wrote(self, seconds: float) -> None:
        self.cost, self.last_end = seconds, time.perf_counter()


class _StopRequest:
    """SIGINT / SIGTERM set a flag; the loop checkpoints at the end of the step and stops (a second ^C is fatal)."""

    def __init__(self):
        self.requested = False
        self._old = {}

    def __enter__(self):
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


# what a run (cptsim train, a RunRecorder) says when ``_step_ops`` could not count its step
OPS_NOT_COUNTED = ("the step's op list (norms, activations, optimizer update, launches) could not be counted: "
                   "profile.json holds the layers' GEMMs only, and a report models this run's time (host or GPU) "
                   "without the step's other ops")


def _step_ops(model: nn.Module, x: torch.Tensor, device: str, precision=None, optimizer: str = "sgd"):
    """The step's op list (``cptsim.measure.opcount``: every kernel, its bytes and launches) for the run's own
    profile.json, so that a report prices the whole step on a GPU, not only its GEMMs. Counted as the planner's
    profile counts it (``profile_model``): at full precision, without the quantizers' own passes, which the cost
    model prices as a native low-precision pipeline, on copies of the model at two batch sizes, with the RNG
    forked and the precision put back: the run's own random streams and bits are untouched. None if it cannot be
    counted (the profile then holds the GEMMs only, as before)."""
    from cptsim.measure.opcount import count_step_ops

    devices = [torch.device(device)] if str(device).startswith("cuda") else []
    w = precision if isinstance(precision, Workload) else None
    if w is not None:
        precision = w.precision
    saved = (precision.bits, precision.grad_bits) if precision is not None else None
    layer_saved = [(st, st.bits, st.grad_bits) for st, _, _ in w.layer_states] if w is not None else []
    try:
        if precision is not None:
            precision.set(32, 32)
            for st, _, _ in layer_saved:
                st.set(32, 32)
        with torch.random.fork_rng(devices=devices):
            return count_step_ops(model, x[: max(1, min(int(x.shape[0]), 4))], optimizer=optimizer)
    except Exception:  # noqa: BLE001 - the run goes on; its profile lacks the op list, as runs always did
        return None
    finally:
        if saved is not None:
            precision.set(*saved)
        for st, b, g in layer_saved:
            st.set(b, g)


def optimizer_impl(device: str) -> str:
    """torch.optim's implementation the loop steps with: ``fused`` on CUDA (SGD, Adam and AdamW's update as one
    kernel per parameter group and dtype, chunked, where ``foreach`` launches one per elementwise op), ``foreach``
    elsewhere (what the op count, cptsim.measure.opcount, counts). The same update rule; the two round differently
    (fused contracts the update into fused multiply-adds: within float32 ulps of foreach, not bit for bit), so a run
    keeps the implementation it started with (config.json ``host.optimizer_impl``)."""
    return "fused" if str(device).startswith("cuda") else "foreach"


def make_optimizer(params: list, cfg: TrainConfig, impl: str = "foreach") -> torch.optim.Optimizer:
    """The run's optimizer (``cptsim.measure.opcount.training_optimizer``'s hyperparameters) in implementation
    ``impl`` (``optimizer_impl``)."""
    from cptsim.measure.opcount import training_optimizer

    opt = training_optimizer(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                             name=cfg.optimizer.strip().lower())
    if impl == "foreach":
        return opt
    if impl != "fused":
        raise InputError(f"optimizer implementation must be foreach or fused, got {impl!r}")
    import inspect

    cls = type(opt)
    takes = inspect.signature(cls.__init__).parameters  # defaults may hold more (AdamW's decoupled_weight_decay)
    return cls(params, **{k: v for k, v in {**opt.defaults, "foreach": None, "fused": True}.items() if k in takes})


class StepCosts:
    """The MACs and BitOPs per phase a trace line records, memoized: they depend only on the step's executed
    shapes (the MAC counter's per-layer MACs and which layers quantize: batch size, sequence length) and on the
    bits, so the cost formula (``cptsim.cost.model.step_cost``) runs once per distinct (shapes, bits, gradient
    bits), not once per step -- a CPT schedule has a few widths, a run a few batch sizes (its last, ragged
    batch). ``fmap``: a float family's FormatMap (BitOPs count its element bits), None for integers."""

    def __init__(self, fmap=None):
        self.fmap = fmap
        self.memo: dict = {}
        self._held: dict = {}  # id(arrays) -> (arrays, its key): a CUDA graph's arrays come back every replay

    def _shape_key(self, arrays) -> bytes:
        got = self._held.get(id(arrays))
        if got is not None and got[0] is arrays:
            return got[1]
        key = arrays.macs.tobytes() + arrays.quantized.tobytes() + bytes(str(arrays.macs.shape), "ascii")
        if len(self._held) < 64:  # holding the object keeps its id from being reused by another
            self._held[id(arrays)] = (arrays, key)
        return key

    def counts(self, arrays, bits, grad_bits: int) -> list[int]:
        """[MACs fwd, dgrad, wgrad, BitOPs fwd, dgrad, wgrad] of one step: ``bits`` the forward width (or, under a
        per-layer plan, a list of each profiled layer's), ``grad_bits`` the gradient's."""
        key = (self._shape_key(arrays), tuple(bits) if isinstance(bits, list) else bits, grad_bits)
        got = self.memo.get(key)
        if got is None:
            got = self.memo[key] = self.formula(arrays, bits, grad_bits)
        return got

    def formula(self, arrays, bits, grad_bits: int) -> list[int]:
        """The cost model's formula itself, at the bits each layer ran at."""
        from cptsim.cost.model import step_cost
        from cptsim.measure.profiler import PHASES

        fmap = self.fmap
        if fmap is not None:  # BitOPs count the formats' element bits (cptsim.cost.model)
            qb = [int(fmap.fwd_element_bits[b]) for b in bits] if isinstance(bits, list) \
                else int(fmap.fwd_element_bits[bits])
            executed = step_cost(arrays, qb, int(fmap.grad_element_bits[grad_bits]), batch=1)
        else:
            executed = step_cost(arrays, bits, grad_bits, batch=1)
        return [executed[k][p] for k in ("macs", "bitops") for p in PHASES]


def quantized_modules(model: nn.Module) -> list:
    """(name, module) of every quantized layer (those with a precision and an activation range)."""
    return [(n, m) for n, m in model.named_modules() if hasattr(m, "precision") and hasattr(m, "act_count")]


def _recorded_route(doc: dict, bits: int) -> str | None:
    """A layer's forward route at ``bits`` as config.json ``host.gemm_paths`` names it: its top-level entry holds
    the route at <= 8 bits, ``widths`` (where routes differ by width) ranges "A-B" above; else above 8 bits every
    GEMM is the fake-quant path."""
    from cptsim.numerics.exact_gemm import FAKE, MAX_BITS

    if bits <= MAX_BITS:
        return doc.get("forward")
    for span, rec in (doc.get("widths") or {}).items():
        lo, _, hi = str(span).partition("-")
        if lo.isdigit() and hi.isdigit() and int(lo) <= bits <= int(hi) and isinstance(rec, dict):
            return rec.get("forward")
    return FAKE


def step_path(layers: list, paths: dict | None, bits: int) -> str:
    """The GEMM route the quantized layers' forwards took at ``bits`` (a CUDA trace line's ``path``): each layer's
    own record of its last forward (``layer.gemm_path``, where its route sets one), else what ``host.gemm_paths``
    (``paths``) names for it at that width; at full precision nothing is quantized (``fp32``). Several routes:
    joined by ``+``, the most used first. ``layers``: ``quantized_modules(model)``."""
    from collections import Counter

    from cptsim.numerics.quant import FULL_PRECISION

    if bits >= FULL_PRECISION:
        return "fp32"
    recorded = (paths or {}).get("layers") or {}
    seen: Counter = Counter()
    for name, m in layers:
        last = m.__dict__.get("gemm_path")
        route = last.get("forward") if isinstance(last, dict) else _recorded_route(recorded.get(name) or {}, bits)
        if isinstance(route, str):
            seen[route] += 1
    return "+".join(r for r, _ in seen.most_common()) or "none"


def quantizer_fallbacks():
    """The quantized layers whose quantizers run a slower path than the fused one (``cptsim.numerics.quant``'s
    ``fallbacks()``, where that exists), as JSON for config.json; None when there are none."""
    from cptsim.numerics import quant

    fn = getattr(quant, "fallbacks", None)
    got = fn() if callable(fn) else None
    if not got:
        return None
    if isinstance(got, dict):
        return {str(k): v for k, v in got.items()}
    return sorted(str(v) for v in got) if isinstance(got, (set, frozenset)) else [v if isinstance(v, (str, dict))
                                                                                   else str(v) for v in got]


def _fallback_names(fallbacks) -> list[str]:
    if isinstance(fallbacks, dict):
        return list(fallbacks)
    return [v.get("layer", v.get("name", str(v))) if isinstance(v, dict) else str(v) for v in fallbacks]


def lagged_reads(device: str, d) -> bool:
    """Whether a step's loss is read one step late: in one process on a GPU, the host reads step k's loss (and
    writes its trace line) while the GPU runs step k+1, instead of waiting for step k to end before launching
    k+1. Elsewhere (a CPU, several processes: their all-reduce reads anyway) each step is read as it ends."""
    return str(device).startswith("cuda") and not d.active


@dataclass
class _Launched:
    """A training step whose work is queued (on a GPU) or done (a CPU), waiting to be read and recorded."""

    step: int
    epoch: int
    n_global: int
    n_loss: int
    bits: int
    grad_bits: int
    lr: float
    counts: list
    stats: object           # [loss sum, correct]: a device tensor, a pinned host copy being filled, or None
    t0: float
    warmup: bool
    graphed: bool
    host_syncs: int | None
    has_batch: bool
    start: object = None    # lagged: the CUDA event recorded as the step's work began
    path: str | None = None
    t_end: float = 0.0      # where the step's time ends (see _Training.launch and _complete)
    energy: tuple | None = None
    loss_sum: float = 0.0
    correct: float = 0.0
    loss: float = 0.0


class _Training:
    """One process's part of a run, as the named steps ``_loop`` takes: ``set_precision``, ``launch`` (forward,
    backward, optimizer), ``record`` (read the step's totals, check them, append its trace line), ``checkpoint``,
    ``evaluate``. On a GPU in one process (``lagged_reads``) a step is recorded while the next one runs: every
    checkpoint and evaluation first ``drain``s the step in flight, so what they save and report is as complete as
    on a CPU."""

    def __init__(self, cfg: TrainConfig, w: Workload, run: RunDir, d, start_step: int, ckpt: dict | None,
                 opt_impl: str | None = None, loss_unit: str | None = None):
        self.cfg, self.w, self.run, self.d = cfg, w, run, d
        self.device, self.model = cfg.device, w.model
        self.cuda = self.device.startswith("cuda")
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.clip = getattr(self.model, "cptsim_grad_clip", None)  # language models clip the gradient norm (5)
        # the optimizer and the clearing of gradients that the step's op count (cptsim.measure.opcount) counts
        self.opt = make_optimizer(self.params, cfg, opt_impl or optimizer_impl(self.device))
        self.graph = is_graph(w.train_set)
        # a language model's sample is a sequence: its loss is summed over the sequence's tokens (the gradient, a
        # mean over sequences, stays so), and the loss it shows and records is divided by them, per token -- in a
        # run that began per sequence (``loss_unit``, config.json's; None: a new run's) it stays per sequence
        unit = new_loss_unit(_is_text(w)) if loss_unit is None else loss_unit
        self.tokens = loss_divisor(unit, getattr(w.train_set, "seq_len", 1))
        torch.manual_seed(cfg.seed * 1_000_003 + 17 + d.rank)  # each rank draws its own rounding noise
        self.epoch_stats = [0.0, 0, 0]  # loss sum, correct, samples of the current epoch so far
        self.epoch_carried = 0.0  # wall seconds of the current epoch before this process took over (mid-epoch resume)
        self.start_step = start_step
        self.saved_step = start_step if ckpt is not None else None  # the newest checkpoint on disk (None: none yet)
        if ckpt is not None:
            self.opt.load_state_dict(ckpt["optimizer"])
            restore_rng(ckpt, d, self.device)
            self.epoch_stats = list(ckpt.get("epoch_stats", self.epoch_stats))
            self.epoch_carried = float(ckpt.get("epoch_time_s", 0.0)) if start_step % w.steps_per_epoch else 0.0
        self.done = start_step >= w.total_steps  # already complete: nothing to run, nothing to append
        if not self.done:
            self._prepare()

    def _prepare(self) -> None:
        from cptsim.measure.profiler import MacCounter
        from .rundir import PROFILE

        cfg, d, device = self.cfg, self.d, self.device
        self.kill_at, self.nan_at, self.int_at = _fault("KILL"), _fault("NAN"), _fault("SIGINT")
        self.costs = StepCosts(self.w.precision.formats)  # None: integers; else a float family's FormatMap
        self.counter = MacCounter(self.model, cfg.model)  # forward hooks reading shapes: ~0.1% of a resnet20 step
        self.modules = dict(self.model.named_modules())
        self.meter = None
        if self.cuda and d.is_main:
            from cptsim.measure.energy import EnergyMeter

            self.meter = EnergyMeter.for_device(device)  # None without NVML or without the GPU's energy counter
        self.sync_check = _SyncCheck(os.environ.get("CPTSIM_SYNC_DEBUG", "") if self.cuda else "",
                                     first_step=self.start_step + SYNC_CHECK_WARMUP)
        self.need_profile = d.is_main and self.run.read_json(PROFILE) is None
        if cfg.tensorboard and d.is_main:  # every trace and metrics line the run appends also goes to TensorBoard
            from .tensorboard import logged_run

            self.run = logged_run(self.run, cfg.tensorboard)
        if d.is_main:
            self.run.keep_trace_open()  # one write() per line, no open and close per step
        self.graphs = None  # one process on a GPU: forward + backward replayed as CUDA graphs (cptsim.run.cudagraph)
        if self.cuda and not d.active:
            from .cudagraph import GraphedSteps, graphs_enabled

            if graphs_enabled():
                self.graphs = GraphedSteps(self.params, self.counter)
        self.pacer = _CheckpointPacer()
        self.lagged = lagged_reads(device, d)
        self.pending: _Launched | None = None  # lagged: the step launched and not yet recorded
        self.host_bufs = None
        if self.lagged and self.cuda:  # two pinned buffers: step k's totals land in one while k-1's are read
            self.host_bufs = [torch.zeros(2, dtype=torch.float64, pin_memory=True) for _ in range(2)]
        self.gemm_paths, self.paths = None, {}  # CUDA: the trace's per-step GEMM route, per (bits, layer bits)
        self.qmods = quantized_modules(self.model)
        if self.cuda and d.is_main:
            from cptsim.numerics.exact_gemm import format_gemm_paths, gemm_paths

            fmap = self.w.precision.formats
            self.gemm_paths = gemm_paths(self.model, device) if fmap is None else \
                format_gemm_paths(self.model, device, fmap)
        self.fallbacks = None  # the quantizer fallbacks config.json records (host.quantizer_fallbacks)
        from cptsim.numerics import quant

        clear = getattr(quant, "clear_fallbacks", None)
        if callable(clear):
            clear()  # this run's fallbacks, not those of an earlier one in the same process
        self.first_launch = True
        self.t_epoch = time.perf_counter()
        self.bar, self.task, self.n_epochs = None, None, math.ceil(self.w.total_steps / self.w.steps_per_epoch)

    def show_progress(self, bar, task) -> None:
        """Where ``record`` and ``evaluate`` report (a rich Progress and its task)."""
        self.bar, self.task = bar, task

    # ---- the steps of one training step ----------------------------------------------------------------------

    def faults(self, step: int) -> None:
        """Test hooks (``_fault``): die or be interrupted as step ``step`` begins."""
        if self.kill_at is not None and step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.int_at is not None and step == self.int_at:
            os.kill(os.getpid(), signal.SIGINT)  # as if ^C arrived during this step

    def set_precision(self, step: int) -> tuple[int, int, float]:
        """This step's bits on every quantized layer and its learning rate on the optimizer: (bits, grad bits, lr)."""
        w = self.w
        bits, gbits = w.bits[step], w.grad_bits[step]
        w.set_bits(bits, gbits, step)
        lr = step_lr(self.cfg, step, w.total_steps)
        for group in self.opt.param_groups:
            group["lr"] = lr
        return bits, gbits, lr

    def _ran_bits(self, arrays, bits):
        # each profiled layer's forward bits as its own PrecisionState held them this step (what it quantized at)
        return [getattr(getattr(self.modules.get(n), "precision", None), "bits", bits) for n in arrays.names]

    def _forward_backward(self, x, y, n_global, poison):
        logits = self.model(x)
        # summed here and divided by the *global* batch (a graph: by its labelled training nodes, the others
        # carry the ignore_index): the gradient of the global batch's mean loss
        loss = class_cross_entropy(logits, y, reduction="sum")  # over rows: see cptsim.models.loss
        if poison:
            loss = loss * float("nan")
        (loss / n_global).backward()
        return torch.stack([loss.detach().double(), (logits.detach().argmax(1) == y).sum().double()])

    def launch(self, step: int, epoch: int, n_global: int, batch) -> _Launched:
        """Set the step's precision, run its forward and backward (eagerly, or as a CUDA graph) and its optimizer
        update. Read synchronously (a CPU, several processes), the step's totals are read between the backward and
        the update, so that a non-finite loss leaves the weights untouched; lagged, they are copied to the host
        without waiting and read while the next step runs (``finish``)."""
        w, d = self.w, self.d
        if self.meter is not None and (not self.lagged or self.pending is None):
            self.meter.start()  # the step's energy: not what the GPU drew since the last step (evaluation, ...)
        t0 = time.perf_counter()
        start = None
        if self.lagged and self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
        caught = self.sync_check.begin(step)
        # warm-up: the process's first CUDA step (lazy initialisation), one that compiled a kernel or that
        # prepared or captured a CUDA graph; marked in the trace, left out of fits and time comparisons
        warmup, compiles = self.cuda and step == self.start_step, _compiles()
        # what the loss is averaged over: the batch's samples, or a graph's labelled training nodes (the
        # trace's batch_size stays the samples, one graph, which is what the step's cost scales with)
        n_loss = w.train_set.labelled if self.graph else n_global
        bits, gbits, lr = self.set_precision(step)
        self.counter.reset()
        zero_grad(self.opt)  # as the op count clears gradients (cptsim.measure.opcount)
        stats, graphed = None, False  # loss sum and correct count: on the device until they are read
        counts = [0] * 6  # MACs, BitOPs per phase: host integers (shapes only, no device read)
        new_path = self.gemm_paths is not None and self._path_key(bits) not in self.paths
        if new_path:  # what the layers record of their route is then this step's, not an earlier width's
            for _, m in self.qmods:
                m.__dict__.pop("gemm_path", None)
        if batch is not None:
            stats, arrays, warm, graphed = self._forward_backward_batch(step, batch, bits, gbits, n_loss)
            warmup = warmup or warm
            # the cost model's formula, at the bits each layer ran at (a per-layer plan: its own)
            counts = self.costs.counts(arrays, self._ran_bits(arrays, bits) if w.layer_states else bits, gbits)
        d.all_reduce_grads(self.params)
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        launched = _Launched(step, epoch, n_global, n_loss, bits, gbits, lr, counts, stats, t0, warmup, graphed,
                             None, batch is not None, start)
        if self.lagged:
            if stats is not None and self.host_bufs is not None:
                buf = self.host_bufs[step % 2]
                buf.copy_(stats, non_blocking=True)  # ordered after the backward on this stream; read next step
                launched.stats = buf
            self.opt.step()
        else:
            self._read(launched)  # the step's one host-device synchronisation, before the update
            self.opt.step()
            # No synchronisation after opt.step(): on a GPU its kernels run while the next batch is prepared,
            # and the next step's read waits for them, so each step's time_s holds the previous step's
            # optimizer update instead of its own (the sum over a run is the same).
            launched.t_end = time.perf_counter()
            launched.energy = self.meter.read() if self.meter is not None else None
        launched.host_syncs = self.sync_check.end(caught)
        launched.warmup = launched.warmup or _compiles() != compiles
        if self.gemm_paths is not None:
            launched.path = self._path(bits)
        if self.d.is_main and self.need_profile and batch is not None:
            self._write_profile(batch)
        if self.first_launch:
            self.first_launch = False
            self.note_fallbacks()
        return launched

    def _forward_backward_batch(self, step: int, batch, bits: int, gbits: int, n_loss: int):
        """(stats, the MAC counter's arrays, warm-up?, replayed as a graph?) of the step's forward and backward."""
        device = self.device
        x, y = batch[0].to(device, non_blocking=True), batch[1].to(device, non_blocking=True)
        if self.cfg.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        poison = self.nan_at is not None and step == self.nan_at
        arrays, graphed, warm = None, False, False
        if self.graphs is not None and not poison:
            stats, arrays, warm = self.graphs.step(
                lambda a, b: self._forward_backward(a, b, n_loss, False), x, y,
                (bits, gbits, n_loss, *(st.bits for st, _, _ in self.w.layer_states)),  # a graph per layer bits
                on_capture=self.sync_check.allow)  # capturing synchronises (torch.cuda.graph): warm-up
            graphed = not warm
        else:
            stats = self._forward_backward(x, y, n_loss, poison)
        return stats, arrays if arrays is not None else self.counter.step_arrays(), warm, graphed

    def _read(self, s: _Launched) -> None:
        """Read a step's totals (summed over ranks) to the host; a non-finite loss stops the run."""
        self.sync_check.allow()  # the read below is the one expected synchronisation: counted, not an error
        if self.lagged:
            vals = s.stats.tolist() if s.stats is not None else [0.0, 0.0]
            loss_sum, correct, c = vals[0], vals[1], list(s.counts)
        else:
            loss_sum, correct, c = self.d.step_totals(s.stats, s.counts)
        s.loss_sum, s.correct, s.counts = loss_sum, correct, c
        s.loss = loss_sum / (s.n_loss * self.tokens)  # per token for a language model, as metrics.jsonl's
        if not math.isfinite(s.loss):
            raise RunFailed(self._non_finite(s))

    def _non_finite(self, s: _Launched) -> str:
        """What a non-finite loss at step ``s`` left, as it is: read at once, the step's update never ran; read
        late, it (and the next step's, when one was launched) did, so the parameters in memory are counted."""
        head = f"loss became {s.loss} at step {s.step} (bits {s.bits}, grad bits {s.grad_bits})"
        tail = (f"resume with --resume {self.run.path} (it will diverge again unless the cause was transient), or "
                "train anew with a higher q_min or a lower --lr")
        if not self.lagged:
            return (f"{head}; nothing of that step was applied or recorded, the last good checkpoint is kept - "
                    f"{tail}")
        # Read late, the loss arrives after the step's update was queued and the next step launched. Holding the
        # update back until the loss is read would be the very synchronisation per step that reading late exists
        # to remove, for a failure that ends the run anyway: the run's files are what must stay good, and they
        # do (nothing after the last read step is recorded; checkpoints are written only after a drain, whose
        # read would have stopped here). So the message says what memory holds instead of preventing it.
        applied = [s.step] + ([self.pending.step] if self.pending is not None and self.pending is not s else [])
        params = list(self.model.named_parameters())
        bad = [n for n, p in params if not bool(torch.isfinite(p.detach()).all())]  # waits for the queued updates
        names = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        state = f"{len(bad)} of {len(params)} parameter tensors hold non-finite values" + (f" ({names})" if bad else "")
        saved = (f"the checkpoint on disk (step {self.saved_step}) is intact" if self.saved_step is not None else
                 "no checkpoint was written yet (a resume starts from step 0)")
        which = (f"the updates of steps {applied[0]} and {applied[1]} had" if len(applied) > 1 else
                 f"the update of step {applied[0]} had")
        return (f"{head}; this loop reads a step's loss while the next one runs, so {which} already been applied in "
                f"memory: {state}. Nothing of it was recorded and {saved} - {tail}")

    def record(self, s: _Launched) -> None:
        """Account for a step that was read: the epoch's totals, its trace line (rank 0), the progress bar."""
        from cptsim.measure.profiler import PHASES

        self.epoch_stats[0] += s.loss_sum
        self.epoch_stats[1] += int(s.correct)
        self.epoch_stats[2] += s.n_loss
        if self.d.is_main:
            c = s.counts
            line = {"step": s.step, "epoch": s.epoch, "batch_size": s.n_global, "bits": s.bits,
                    "grad_bits": s.grad_bits, "macs": dict(zip(PHASES, c[:3])), "bitops": dict(zip(PHASES, c[3:])),
                    "lr": s.lr, "time_s": round(s.t_end - s.t0, 6), "loss": s.loss}
            fmap = self.w.precision.formats
            if fmap is not None:  # the formats this step ran (the mapping: config.json "number_format";
                # not "format": a trace line's own format version has that key)
                line["formats"] = {"forward": fmap.fwd_names[s.bits], "gradient": fmap.grad_names[s.grad_bits]}
            if s.path is not None:  # CUDA: the GEMM route of the quantized layers' forwards at this width
                line["path"] = s.path
            if s.energy is not None:  # NVML: this GPU's energy counter over the step (see cptsim.measure.energy)
                line["energy_j"], line["power_w"] = s.energy
            if s.has_batch and s.graphed:
                line["graph"] = True  # replayed as a CUDA graph (what the CUDA host profile models)
            if s.warmup:
                line["warmup"] = True
            elif s.host_syncs is not None:
                line["host_syncs"] = s.host_syncs
            self.run.append_trace(line)
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=f"epoch {s.epoch + 1}/{self.n_epochs}",
                            info=f"loss {s.loss:.3f}  bits {s.bits}/{s.grad_bits}")

    def finish(self, launched: _Launched) -> None:
        """Record a launched step: at once when read synchronously; lagged, the step launched before it, whose
        end is where this one began on the GPU (waiting for it is the step's one synchronisation)."""
        if not self.lagged:
            self.record(launched)
            return
        prev, self.pending = self.pending, launched
        if prev is not None:
            self._complete(prev, launched.start)

    def drain(self) -> None:
        """Lagged: wait for the step in flight and record it (before a checkpoint, an evaluation, the end)."""
        if self.pending is None:
            return
        s, self.pending = self.pending, None
        end = None
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
        self._complete(s, end)

    def _complete(self, s: _Launched, end) -> None:
        if end is not None:
            end.synchronize()  # step s's work, its optimizer update included, is done (the next step's is queued)
            # the step's time on the GPU's clock: from where its work began to where the next step's began -- the
            # GPU's own time when the host keeps ahead of it, that plus the wait for the host when it does not
            s.t_end = s.t0 + s.start.elapsed_time(end) / 1e3
        else:
            s.t_end = time.perf_counter()
        if s.host_syncs is not None:
            s.host_syncs += 1  # the wait above
        s.energy = self.meter.read() if self.meter is not None else None
        self._read(s)
        self.record(s)

    def _path_key(self, bits: int) -> tuple:
        return (bits, *(st.bits for st, _, _ in self.w.layer_states))

    def _path(self, bits: int) -> str:
        # what ran is known after a step's first (eager) run at these bits; a graph replays the same route
        key = self._path_key(bits)
        got = self.paths.get(key)
        if got is None:
            got = self.paths[key] = step_path(self.qmods, self.gemm_paths, bits)
        return got

    def _write_profile(self, batch) -> None:
        from .rundir import PROFILE

        prof = self.counter.layer_profile(batch[0].shape[0], self.w.info.input_shape)
        prof.channels_last = self.cfg.channels_last  # the GPU model prices the step's memory format
        prof.ops = _step_ops(self.w.model, batch[0], self.device, self.w, self.cfg.optimizer)
        if prof.ops is None:  # the run goes on; a report then says its profile has no op list
            print(f"warning: {OPS_NOT_COUNTED}", file=sys.stderr)
        self.run.write_json(PROFILE, prof.to_json())
        self.need_profile = False

    def note_fallbacks(self) -> None:
        """Quantizers that fell back to a slower path (``quantizer_fallbacks``): named in one warning line and in
        config.json ``host.quantizer_fallbacks``, once per change (rank 0)."""
        if not self.d.is_main:
            return
        got = quantizer_fallbacks()
        if got is None or got == self.fallbacks:
            return
        self.fallbacks = got
        names = _fallback_names(got)
        print(f"warning: {len(names)} quantized layer(s) run a slower quantizer path than the fused one: "
              f"{', '.join(names)} (config.json host.quantizer_fallbacks)", file=sys.stderr)
        self.run.update_config("host.quantizer_fallbacks", got)

    # ---- between steps ---------------------------------------------------------------------------------------

    def checkpoint(self, step: int) -> None:
        """Write the checkpoint of ``step`` steps done (every rank takes part, rank 0 writes)."""
        self.drain()
        d = self.d
        t_write = time.perf_counter()
        ranks = rank_states(d, self.model, self.device)  # a collective: every rank takes part, rank 0 writes
        if d.is_main:
            try:
                self.run.save_checkpoint({"step": step, "model": self.model.state_dict(),
                                          "optimizer": self.opt.state_dict(), **ranks,
                                          "epoch_stats": list(self.epoch_stats),
                                          "epoch_time_s": time.perf_counter() - self.t_epoch},
                                         keep=self.cfg.keep_checkpoints)
            except OSError as e:  # ENOSPC, EIO: the checkpoints before this one and their manifest are untouched
                raise RunFailed(f"cannot write the checkpoint at step {step} ({e.strerror or e}); the earlier "
                                f"checkpoints are intact - make room, then continue with --resume {self.run.path}") \
                    from None
        self.pacer.wrote(time.perf_counter() - t_write)
        self.saved_step = step

    def begin_epoch(self) -> None:
        self.model.train()
        # a run resumed mid-epoch goes on timing its epoch from the wall time the checkpoint carried (the
        # steps re-run after the checkpoint replace the killed ones, in the trace and here)
        self.t_epoch, self.epoch_carried = time.perf_counter() - self.epoch_carried, 0.0

    def evaluate(self, epoch: int, step: int) -> None:
        """The epoch's end: BatchNorm statistics and activation ranges re-estimated at the evaluation bits, the
        test (and validation) split evaluated, one metrics line (rank 0)."""
        w, d, device = self.w, self.d, self.device
        self.counter.enabled = False  # evaluation is not training work
        d.broadcast_buffers(self.model)  # BN statistics and activation ranges: rank 0's, on every rank
        if d.is_main:
            epoch_time = time.perf_counter() - self.t_epoch
            recal = recalibrate(w, self.cfg, epoch, device)
            test_loss, test_acc = evaluate(w, device)
            rec = {"epoch": epoch, "step": step, "eval_bits": w.eval_bits,
                   "train_loss": self.epoch_stats[0] / max(self.epoch_stats[2], 1),
                   "train_acc": self.epoch_stats[1] / max(self.epoch_stats[2], 1),
                   "test_loss": test_loss, "test_acc": test_acc,
                   "epoch_time_s": round(epoch_time, 4), "recal_samples": recal["samples"],
                   "recal_time_s": recal["time_s"]}
            if w.val_loader is not None:
                hits: list = []  # per validation sample: right or wrong (the pilot's paired test reads it)
                rec["val_loss"], rec["val_acc"] = evaluate(w, device, w.val_loader, hits)
                if hits and getattr(w.train_set, "is_text", False):  # its loss per BPTT window (the pilot's)
                    from cptsim.data.text import pack_window_losses

                    rec["val_window_loss"] = pack_window_losses(hits)
                elif hits:
                    from .config import pack_correct

                    rec["val_correct"] = pack_correct(torch.cat(hits).numpy())
            if getattr(w.train_set, "is_text", False):  # per token; perplexity, bits per character
                from cptsim.data.text import lm_metrics

                lm_metrics(rec, w.train_set.seq_len, w.train_set.char_level)
            self.run.append_metrics(rec)
            if self.bar is not None:
                self.bar.update(self.task, info=f"test acc {test_acc:.3f} @ {w.eval_bits} bits")
        self.counter.enabled = True
        self.epoch_stats = [0.0, 0, 0]
        self.note_fallbacks()  # a width first met in this epoch may have compiled (or failed to) a quantizer

    def close(self) -> None:
        """The trace file and the counter's hooks are let go (also when the run stops on an error)."""
        self.run.close_trace()
        self.counter.close()


def _loop(cfg: TrainConfig, w: Workload, run: RunDir, d, start_step: int, progress: bool, ckpt: dict | None = None,
          opt_impl: str | None = None, loss_unit: str | None = None):
    """Train from ``start_step`` to the end: per step, its batch, precision, forward/backward/update and trace
    line; per epoch, evaluation and checkpoint (``_Training``)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    t = _Training(cfg, w, run, d, start_step, ckpt, opt_impl, loss_unit)
    if t.done:
        return run
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn()]
    T, spe = w.total_steps, w.steps_per_epoch
    n_epochs = math.ceil(T / spe)
    step = start_step
    try:
        with _StopRequest() as stop, Progress(*columns, console=Console(stderr=True),
                                              disable=not (progress and d.is_main)) as bar:
            t.show_progress(bar, bar.add_task("train", total=T, completed=start_step, info=""))
            for epoch in range(step // spe, n_epochs):
                t.begin_epoch()
                last = min(spe, T - epoch * spe)
                for i, n_global, batch in epoch_batches(cfg, w, epoch, step - epoch * spe, last, d.rank, d.world):
                    t.faults(step)
                    t.finish(t.launch(step, epoch, n_global, batch))
                    step += 1
                    if i == last - 1:
                        break  # the epoch's end: evaluate and checkpoint below
                    if d.any(stop.requested):
                        t.checkpoint(step)
                        raise RunStopped(_stopped(step, T, t.run))
                    if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                        t.checkpoint(step)
                t.drain()
                t.evaluate(epoch, step)
                stopping = d.any(stop.requested)
                # the last step, a stop and a cadence the user chose always checkpoint; otherwise the pacer says
                if t.pacer.due(d, forced=step >= T or stopping or bool(cfg.checkpoint_every)):
                    t.checkpoint(step)
                if stopping:
                    raise RunStopped(_stopped(step, T, t.run))
                if step >= T:
                    break
    finally:
        t.close()
    return t.run

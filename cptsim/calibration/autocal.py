"""The host profile a report uses: measured on this machine once, automatically, instead of placeholder numbers.

A newcomer's first `cptsim report` compares the measured step times with the host profile's model. The shipped
``host`` profile holds placeholder rates, so without `cptsim hw calibrate` that comparison was off by ~45% and
looked like a broken model. Now, when the user has no host profile of their own (``host.toml`` in the user profile
directory, from `cptsim hw calibrate`), the report measures this machine once (``measure_host``: the rates of
``calibrate.calibrate_host`` and training steps of the reference workloads, about AUTO_SECONDS of timing plus ~1.5 s
to build the workloads and count their ops, with a progress bar on stderr, at the thread count and device the run
used) and keeps the result as ``host-auto-<device>-t<threads>-<machine>.toml`` in cptsim's cache directory
(``auto_profile_dir``: $CPTSIM_HOME/cache, else $XDG_CACHE_HOME/cptsim, ~/.cache/cptsim), where every later report on
this machine finds it. It is a cache, not a profile the user made: it stays out of the user's profile directory,
and deleting it only means measuring again. A run's thread count changes every rate, so there is one file per
thread count a run used. <machine> is a hash of the host name, CPU model, architecture and torch version: a home
directory shared between machines keeps one profile per machine. ``--no-calibrate`` (or CPTSIM_NO_CALIBRATE=1)
keeps the placeholder. `cptsim hw calibrate` measures the same way (``measure_host``) and prints the fit's table.

What the host model holds (cptsim.cost.hardware.host) and why the fit has the shape it has. The microbenchmarks time
the parts of a step -- GEMMs at each tier, a copy's bandwidth, the quantizer passes, dropout's random numbers, a
GELU, attention's per-head matmuls -- and the model prices a run's layers and the step's other ops (its op list:
norms, activations, softmax, dropout, the loss, the optimizer) with them. What no microbenchmark holds is fixed
cost: each op's dispatch and autograd, a quantized layer's Python and quantizer calls, the training loop's own
(precision, MAC counter, the loss read). Those are fitted (``step_overhead``) to whole training steps of five
reference workloads (``REFERENCES``, not the user's model): a CNN, an MLP, a transformer block, a graph
convolution (plain torch gathers and scatters) and a stack of norms and activations without a quantized layer --
the kinds of step the defaults train (digits-cnn, transformer-lm, gcn), each modelled exactly as a report models a
run. Three fixed costs, per kind: a quantized convolution's phase, any other quantized layer's phase, and a
launched op (also a full-precision layer's phase). Before, one figure per layer-phase carried all of it, fitted to
a CNN and an MLP: a transformer runs dozens of ops per layer (dropout alone draws ~10 ns an element on one core, a
fifth of a transformer-lm step) and a CNN a handful, so no single figure served both -- the first report put a
transformer-lm run at -54% and, once the MLP pulled the figure down, digits-cnn at -22%. The workloads' launches
per layer-phase differ (three to eight, and the norm stack's all launches), which is what lets the fit part the
costs; benchmarks/bench_host_first_report.py checks the first report on the three defaults.
"""

from __future__ import annotations

import hashlib
import os
import platform
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from cptsim.errors import InputError

AUTO_SECONDS = 4.0  # the measurement's budget: a few seconds, once per machine, thread count and device
NO_CALIBRATE_ENV = "CPTSIM_NO_CALIBRATE"


def machine_id() -> str:
    """A short hash naming this machine: host name, CPU model, architecture, torch version."""
    import torch

    from .calibrate import _cpu_name

    text = "|".join((socket.gethostname(), _cpu_name() or "", platform.machine(), torch.__version__.split("+")[0]))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def auto_profile_dir() -> Path:
    """cptsim's cache directory, which holds the automatic measurements: $CPTSIM_HOME/cache if CPTSIM_HOME is set,
    else $XDG_CACHE_HOME/cptsim (~/.cache/cptsim)."""
    from cptsim.fileio import cache_dir

    return cache_dir()


def auto_profile_path(device: str = "cpu", threads: int = 1) -> Path:
    """Where the automatic measurement of this machine at ``threads`` threads on ``device`` is kept."""
    return auto_profile_dir() / f"host-auto-{device}-t{int(threads)}-{machine_id()}.toml"


def _run_conditions(run_dir) -> tuple[str, int]:
    """(device kind, CPU threads) a run trained with, from its config.json."""
    import torch

    from cptsim.run.rundir import RunDir

    cfg = RunDir.open(run_dir).read_config()
    device = str((cfg.get("settings") or {}).get("device") or "cpu").split(":")[0]
    threads = (cfg.get("host") or {}).get("threads")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        threads = torch.get_num_threads()
    return device, threads


def report_host(run_dir, host: str = "host", calibrate: bool = True,
                say: Callable[[str], None] | None = None, seconds: float = AUTO_SECONDS,
                progress: bool = True) -> str:
    """The host profile (name or path) to model ``run_dir``'s step times with.

    ``host`` other than "host" (the user chose one) and a user's own host.toml are used as they are. Otherwise the
    automatic measurement of this machine for the run's thread count and device: read if kept, else measured now
    (``say`` gets a line before and after) unless ``calibrate`` is False or CPTSIM_NO_CALIBRATE is set, in which
    case the shipped placeholder ("host") is used."""
    from cptsim.cost.hardware import user_profile_dir

    if host != "host" or (user_profile_dir() / "host.toml").is_file():
        return host
    device, threads = _run_conditions(run_dir)
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return host  # a CUDA run reported on a machine without its GPU: nothing here to measure
    path = auto_profile_path(device, threads)
    if path.is_file() and not _outdated(path, device, calibrate):
        return str(path)
    if not calibrate or os.environ.get(NO_CALIBRATE_ENV, "") not in ("", "0"):
        return host
    measure(path, device, threads, seconds, say, progress=progress)
    return str(path)


def _outdated(path: Path, device: str, calibrate: bool) -> bool:
    """An automatic measurement kept by an older cptsim, to be measured again when measuring is allowed -- once:
    a CPU file that does not price the step's op list (``op_list``: before it, one per-layer figure fitted to a
    CNN and an MLP put a transformer-lm run at -54%) or has no GEMM tiers (no int8 rate, nor the line saying it
    could not be measured), or an int8 tier without the rate of the exact path's sum GEMMs; a CUDA file whose
    per-layer figure came from the reference CNN alone."""
    if not calibrate or os.environ.get(NO_CALIBRATE_ENV, "") not in ("", "0"):
        return False
    try:
        text = path.read_text()
    except OSError:
        return False
    if device != "cpu":  # a per-layer figure fitted to the reference CNN alone (older): a gcn at 2-3x
        return "step of cptsim.calibration.autocal's reference CNN less" in text
    if "op_list = true" not in text or ("int8_gmac_s" not in text and "tiers measured" not in text):
        return True
    # the exact path's sum GEMMs went unpriced (a tier cut short as too slow measures no sums: not then)
    return "int8_gmac_s" in text and "int8_sum_gmac_s" not in text and "would outlast the budget" not in text


def measure(path: Path, device: str, threads: int, seconds: float = AUTO_SECONDS,
            say: Callable[[str], None] | None = None, progress: bool = True) -> Path:
    """Measure this machine at ``threads`` CPU threads on ``device`` (``measure_host``) and write the profile to
    ``path``. A progress bar on stderr (``progress``) shows the part being measured."""
    import time

    import torch

    from .calibrate import write_host_profile

    say = say or (lambda s: None)
    say(f"the host profile was never measured on this machine ({device}, {threads} thread"
        f"{'s' if threads != 1 else ''}): measuring it once, about {seconds + SETUP_SECONDS[device]:g} s (longer "
        f"on a busy machine), into {path}")
    t0 = time.perf_counter()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with _Bar(progress, seconds) as bar:
            measured = measure_host(device, seconds, stage=bar.stage)
            bar.stage("written", 1.0)
    finally:
        torch.set_num_threads(before)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        written, _ = write_host_profile(measured, path)
    except (InputError, OSError) as e:
        raise InputError(f"the automatic host measurement could not be kept: {e}; give --no-calibrate") from None
    say(f"measured in {time.perf_counter() - t0:.1f} s; kept in {written} (a cache: later reports on this machine "
        "at this thread count reuse it; --no-calibrate uses the shipped placeholder, `cptsim hw calibrate` writes "
        "your own host.toml)")
    return written


REFERENCE_SHARE = 0.3  # of the budget: timing the reference workloads' steps
SETUP_SECONDS = {"cpu": 2.0, "cuda": 1.0}  # beyond the budget: building the workloads, counting their op lists


def measure_host(device: str, seconds: float, stage: Callable[[str, float], None] | None = None) -> dict:
    """This machine's host profile figures (``calibrate.calibrate_host``'s rates and microbenchmarks) with the
    fixed costs fitted to the reference workloads (``step_overhead``): what `cptsim hw calibrate` and a report's
    automatic measurement both write. ``seconds`` bounds the timings: each part samples until its share is spent
    and stops after one call where a call outlasts it (``calibrate._median_time``), so a loaded machine overruns
    by a few calls, not by minutes; building the reference workloads and counting their op lists adds ~1.5 s on
    a CPU (the op counter's dispatch mode imports torch._dynamo, most of it). ``stage(name, fraction done)`` is
    called as each part begins (a progress bar). The result has ``references``: the fit's table (workload,
    measured and modelled seconds per step, error)."""
    from .calibrate import calibrate_host

    stage = stage or (lambda name, done: None)
    # calibrate_host's parts add up to ~1.2x its budget (warm-ups, tensors to fill): 0.6 + REFERENCE_SHARE of
    # ``seconds`` land near ``seconds`` in all
    measured = calibrate_host(device=device, seconds=0.6 * seconds,
                              stage=lambda name, done: stage(name, 0.7 * min(done, 1.0)))
    measured["tiny_layer_overhead_s"] = measured["layer_overhead_s"]
    stage("reference training steps", 0.7)
    return step_overhead(measured, device, REFERENCE_SHARE * seconds)


class _Bar:
    """The measurement's progress bar on stderr, in fractions of its budget, naming the part being measured."""

    def __init__(self, enabled: bool, seconds: float):
        self.enabled, self.seconds = enabled, seconds

    def __enter__(self):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("measuring the host"), BarColumn(), TextColumn("{task.description}"),
                                 TimeElapsedColumn(), console=Console(stderr=True), transient=True,
                                 disable=not self.enabled)
        self.progress.__enter__()
        self.task = self.progress.add_task("", total=1.0)
        return self

    def stage(self, name: str, done: float) -> None:
        self.progress.update(self.task, completed=done, description=name)

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)


# ------------------------------------------------------------------------------------------ the reference workloads


@dataclass(frozen=True)
class Reference:
    """A small training workload the host model's fixed costs are fitted to: ``make()`` -> the network,
    ``inputs(net, scale, gen)`` -> (x, labels) of ``scale`` times its base batch (the op list is counted at 1 and
    2; a graph's structure is set on ``net``),
    ``samples`` its samples at scale 1 (a graph's nodes: each node is a row, as a graph run's dense layers see it),
    ``shape`` one sample's shape, ``fp_layers`` the layers kept at full precision."""

    name: str
    what: str
    make: Callable
    inputs: Callable
    samples: int
    shape: tuple
    fp_layers: tuple = ()


def _reference_model():
    """A small CNN on 1x16x16 inputs: three quantized 3x3 convolutions of 32 and 64 channels (the second and third
    of stride 2) with BatchNorm and ReLU, average pooling, an FP32 classifier -- the feature maps and channels a
    CPU trains (digits' 8x8, CIFAR ResNets' later stages), whose convolutions run near the matmul rate."""
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1, stride=2), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def _reference_mlp():
    """Three quantized Linear layers with ReLU and LayerNorm between, on 34 rows of 34 features: the dense
    transforms of a small graph network and of MLPs -- steps whose activations are small, so that a layer's norm
    and activation cost their dispatch, not their bytes."""
    import torch.nn as nn

    return nn.Sequential(nn.Linear(34, 512), nn.ReLU(), nn.LayerNorm(512), nn.Linear(512, 512), nn.ReLU(),
                         nn.LayerNorm(512), nn.Linear(512, 4))


LM_VOCAB, LM_TOKENS, LM_SEQUENCES = 96, 64, 8
LM_SPEC = f"transformer-lm:layers=1,width=128,heads=4,context={LM_TOKENS},dropout=0.1"


def _reference_lm():
    """One transformer block of the registry's transformer-lm (width 128, 4 heads, 64 tokens, a 96-token
    vocabulary) on LM_SEQUENCES sequences: an embedding, causal attention's two activation-by-activation matmuls
    and its softmax and mask, LayerNorms, GELU, dropout, residual adds, the head -- the ops a language model's step
    runs beside its GEMMs, dozens per layer, at a small language model's per-call shapes."""
    from cptsim.models import create_model

    return create_model(LM_SPEC, num_classes=LM_VOCAB, input_shape=(LM_TOKENS,))


def _reference_graph():
    """A two-layer graph convolution in plain torch (not torch_geometric: importing it takes seconds) on a random
    graph of GRAPH_NODES nodes with GRAPH_DEGREE in-edges each: per layer a quantized Linear transform and an
    aggregation -- gather the source rows, weight them, scatter-add them to their targets -- with ReLU, LayerNorm
    and dropout between: the gathers and scatters of a GCN step, which move bytes per edge and launch a few
    kernels each."""
    import torch
    import torch.nn as nn

    class GraphNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin1, self.lin2 = nn.Linear(32, 128), nn.Linear(128, 4)
            self.norm, self.drop = nn.LayerNorm(128), nn.Dropout(0.2)
            self.edges = None  # (source, target, weight) per edge, set with the inputs (_graph_inputs)

        def aggregate(self, h):
            src, dst, w = self.edges
            return torch.zeros_like(h).index_add_(0, dst, h.index_select(0, src) * w[:, None])

        def forward(self, x):
            h = self.drop(self.norm(torch.relu(self.aggregate(self.lin1(x)))))
            return self.aggregate(self.lin2(h))

    return GraphNet()


GRAPH_NODES, GRAPH_DEGREE = 256, 5


def _graph_inputs(net, scale: int, gen):
    """``scale`` disjoint copies of one random graph (so that its counts split per node, as a batch's per sample)."""
    import torch

    n, e = GRAPH_NODES, GRAPH_NODES * GRAPH_DEGREE
    src, dst = torch.randint(n, (e,), generator=gen), torch.randint(n, (e,), generator=gen)
    deg = torch.bincount(dst, minlength=n).clamp(min=1).float()
    w = deg[dst].rsqrt() * deg[src].rsqrt()
    off = torch.arange(scale).repeat_interleave(e) * n
    net.edges = (src.repeat(scale) + off, dst.repeat(scale) + off, w.repeat(scale))
    return torch.randn(scale * n, 32, generator=gen), torch.randint(4, (scale * n,), generator=gen)


def _lm_inputs(net, scale: int, gen):
    import torch

    b = LM_SEQUENCES * scale
    return (torch.randint(LM_VOCAB, (b, LM_TOKENS), generator=gen),
            torch.randint(LM_VOCAB, (b, LM_TOKENS), generator=gen))


def _dense_inputs(batch: int, shape: tuple, classes: int):
    def inputs(net, scale: int, gen):
        import torch

        return torch.randn(batch * scale, *shape, generator=gen), torch.randint(classes, (batch * scale,),
                                                                                 generator=gen)
    return inputs


def _reference_norms():
    """No quantized layer: LayerNorm, GELU, dropout, tanh and ReLU modules on 64 rows of 256, an FP32 Linear head:
    a step of launches and little else, which tells the cost per launched op from the cost per layer-phase (the
    other workloads run three to eight ops per layer-phase, too alike to part the two)."""
    import torch.nn as nn

    return nn.Sequential(nn.LayerNorm(256), nn.GELU(), nn.Dropout(0.1), nn.LayerNorm(256), nn.Tanh(),
                         nn.LayerNorm(256), nn.ReLU(), nn.Dropout(0.1), nn.LayerNorm(256), nn.Linear(256, 16))


REFERENCES = (
    Reference("cnn", "3 quantized 3x3 convs (32, 64, 64 channels) + BatchNorm + ReLU, 1x16x16, batch 32",
              _reference_model, _dense_inputs(32, (1, 16, 16), 10), 32, (1, 16, 16), ("11",)),
    Reference("mlp", "3 quantized Linear + ReLU + LayerNorm, 34 rows of 34", _reference_mlp,
              _dense_inputs(34, (34,), 4), 34, (34,)),
    Reference("transformer", f"1 transformer block (width 128, 4 heads), {LM_SEQUENCES} x {LM_TOKENS} tokens",
              _reference_lm, _lm_inputs, LM_SEQUENCES, (LM_TOKENS,)),
    Reference("graph", f"2 graph convolutions (hidden 128), {GRAPH_NODES} nodes, {GRAPH_DEGREE} in-edges each",
              _reference_graph, _graph_inputs, GRAPH_NODES, (32,)),
    Reference("norms", "LayerNorm, GELU, dropout, tanh, ReLU, no quantized layer, 64 rows of 256",
              _reference_norms, _dense_inputs(64, (256,), 16), 64, (256,), ("9",)),
)
# each workload is timed in this many turns, the workloads one after the other within each turn, and keeps its
# median turn: a shared machine's load comes and goes within seconds, and falls on every workload alike rather
# than on one (a loaded turn of the CNN alone once read as convolutions costing 1.7x)
ROUNDS = 3


@dataclass
class ReferenceStep:
    """One reference workload as the fit sees it: measured seconds per step and the model's parts at the
    measured rates -- ``work_s`` (GEMMs at their tiers, bytes, quantizer and op-list element passes) and what each
    fixed cost multiplies (``counts``: FIXED_COSTS -> executed phases of quantized convolutions and of the other
    quantized layers, launched ops of the op list and full-precision layer-phases)."""

    name: str
    what: str
    measured_s: float
    work_s: float
    counts: dict

    def modelled_s(self, costs: dict) -> float:
        return self.work_s + sum(costs[k] * self.counts.get(k, 0.0) for k in FIXED_COSTS)


# the fixed costs the fit finds (cptsim.cost.hardware.host.layer_kinds, and the op list's launches): the profile's
# conv_overhead_us, layer_overhead_us, op_overhead_us
FIXED_COSTS = ("conv", "layer", "op")


def fit_fixed_costs(refs: list[ReferenceStep]) -> dict:
    """{"conv", "layer", "op": seconds} -- per executed phase of a quantized convolution, of any other quantized
    layer, per launched op (and full-precision layer-phase) -- that make the model's times of ``refs`` closest to
    the measured ones in relative terms: non-negative least squares of (modelled - measured) / measured, which is
    linear in the costs. A cost the workloads cannot tell apart from the others (no workload has a convolution,
    or their launches are proportional to their layer-phases) is not fitted: a launch then costs nothing beyond
    its work (the layer-phases carry it), a convolution what another layer does."""
    import numpy as np
    from scipy.optimize import nnls

    refs = [r for r in refs if r.measured_s > 0]
    costs = dict.fromkeys(FIXED_COSTS, 0.0)
    if not refs:
        return costs
    t = np.array([r.measured_s for r in refs])
    A = np.array([[r.counts.get(k, 0.0) for k in FIXED_COSTS] for r in refs]) / t[:, None]
    b = 1.0 - np.array([r.work_s for r in refs]) / t
    cols = [j for j in range(len(FIXED_COSTS)) if np.any(A[:, j] > 0)]
    for drop in ("op", "conv"):  # what cannot be told apart goes: the launch's cost, then the convolution's own
        if np.linalg.matrix_rank(A[:, cols], tol=1e-9 * float(np.abs(A).max())) == len(cols):
            break
        if FIXED_COSTS.index(drop) in cols:
            cols.remove(FIXED_COSTS.index(drop))
    if cols:
        x, _ = nnls(A[:, cols], b)
        costs.update({FIXED_COSTS[j]: float(v) for j, v in zip(cols, x)})
    if FIXED_COSTS.index("conv") not in cols:
        costs["conv"] = costs["layer"]
    return costs


def step_overhead(measured: dict, device: str, budget_s: float, refs=REFERENCES, timer=None) -> dict:
    """The fixed costs that make the host model reproduce whole training steps, fitted to training steps of the
    reference workloads (``REFERENCES``), each modelled with ``measured``'s rates exactly as a report models a run
    (``cptsim.cost.model.estimate`` with its op list): seconds per executed phase of a quantized convolution
    (``conv_overhead_s``), of any other quantized layer (``layer_overhead_s``) and per launched op of the step's op
    list or phase of a full-precision layer (``op_overhead_s``); ``fit_fixed_costs``. Module docstring: why.

    The workloads are timed in ROUNDS turns, one after the other within each (a shared machine's load then falls
    on all of them, not on one), each the median of its turns (a turn: the median of its steps). Returns ``measured`` updated with those costs,
    ``op_list`` and ``references``: per workload its name, what it is, measured and modelled seconds per step, the
    error and what each cost multiplies (the fit's table); a workload this torch cannot run is listed with its
    error and left out. ``timer`` (tests) replaces the measurement: ``timer(ref, step) -> seconds``.

    On CUDA the host profile models CUDA graph replays, whose op list a GPU profile prices, not the host's: there
    the CNN and the MLP fit the one per-layer-phase figure (``op_list`` False), never below the tiny-layer one."""
    import statistics

    micro = float(measured["layer_overhead_s"])
    cpu = device == "cpu"
    out = dict(measured)
    out["references"] = []
    if micro <= 0:
        return out
    ready, failed = [], []
    for ref in refs if cpu else [r for r in refs if r.name in ("cnn", "mlp")]:
        try:
            ready.append(prepare_reference(measured, device, ref, op_list=cpu))
        except Exception as e:  # noqa: BLE001 - a workload this torch cannot run is left out of the fit, said so
            failed.append({"workload": ref.name, "what": ref.what, "error": str(e).splitlines()[0][:160]})
    if not ready:
        out["references"] = failed
        return out
    import torch

    from .calibrate import _median_time

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    turn = budget_s / (ROUNDS * len(ready))
    times: list[list[float]] = [[] for _ in ready]
    try:
        for _ in range(1 if timer is not None else ROUNDS):
            for i, (ref, step, _, _) in enumerate(ready):
                times[i].append(timer(ref, step) if timer is not None else _median_time(step, turn, sync))
    finally:
        for *_, close in ready:
            close()
    steps = [ReferenceStep(ref.name, ref.what, statistics.median(t), *parts)
             for (ref, _, parts, _), t in zip(ready, times)]
    costs = fit_fixed_costs(steps)
    if not cpu:
        costs = dict.fromkeys(FIXED_COSTS, max(micro, costs["layer"]))
        costs["op"] = 0.0
    out.update({f"{k}_overhead_s": costs[k] for k in FIXED_COSTS})
    out["op_list"] = cpu
    out["references"] = [{"workload": r.name, "what": r.what, "measured_s": r.measured_s,
                          "modelled_s": r.modelled_s(costs),
                          "error_pct": (r.modelled_s(costs) / r.measured_s - 1.0) * 100,
                          "counts": dict(r.counts)} for r in steps] + failed
    return out


def prepare_reference(measured: dict, device: str, ref: Reference, op_list: bool = True):
    """(``ref``, its training step as a callable, (work s, {fixed cost: what it multiplies}) modelled with
    ``measured``'s rates, a callable that lets the step's MAC counter go). The step is ``cptsim train``'s on this
    machine -- the MAC counter's hooks on, the precision set, the counts costed, the loss read, SGD's multi-tensor
    update with momentum and weight decay, a language model's gradient clipped -- on fixed inputs, run once here
    (allocation, the counter's first profile). ``op_list``: count the step's op list and price it (a CPU)."""
    import torch

    from cptsim.measure.profiler import MacCounter
    from cptsim.models.loss import class_cross_entropy
    from cptsim.numerics.layers import quantize_model
    from cptsim.run.train import StepCosts

    gen = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = ref.make()
        precision = quantize_model(net, fp_layers=list(ref.fp_layers))
        net.to(device).train()
        x, y = (v.to(device) for v in ref.inputs(net, 1, gen))
        if isinstance(getattr(net, "edges", None), tuple):
            net.edges = tuple(v.to(device) for v in net.edges)
        ops = _op_list(net, ref, precision, device) if op_list else None
    params = [q for q in net.parameters() if q.requires_grad]
    for q in params:
        q.grad = torch.zeros_like(q)
    momenta = [torch.zeros_like(q) for q in params]
    clip = getattr(net, "cptsim_grad_clip", None)
    counter = MacCounter(net, f"autocal-{ref.name}")
    costs = StepCosts()

    def step() -> None:
        # the training loop's step (cptsim.run.train._Training.launch), with SGD's update written out
        precision.set(8, 8)
        counter.reset()
        torch._foreach_zero_([q.grad for q in params])
        out = net(x)
        loss = class_cross_entropy(out, y, reduction="sum")
        (loss / x.shape[0]).backward()
        stats = torch.stack([loss.detach().double(), (out.detach().argmax(1) == y).sum().double()])
        costs.counts(counter.step_arrays(), 8, 8)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        stats.tolist()
        with torch.no_grad():
            _sgd_update(params, momenta)

    try:
        step()
        prof = counter.layer_profile(ref.samples, list(ref.shape))
        prof.ops = ops
        parts = model_parts(prof, ref.samples, measured, op_list)
    except BaseException:
        counter.close()
        raise
    # the counter's hooks stay on while the step is timed, as in training: the caller closes it
    return ref, step, parts, counter.close


def _sgd_update(params, momenta) -> None:
    """torch.optim.SGD's multi-tensor update (momentum 0.9, weight decay 5e-4, lr 0.01), written out: the reference
    steps time it and ``_op_list`` counts it. Creating a torch.optim optimizer imports torch._dynamo, 1.5 s of a
    report."""
    import torch

    d = torch._foreach_add([q.grad for q in params], params, alpha=5e-4)
    torch._foreach_mul_(momenta, 0.9)
    torch._foreach_add_(momenta, d)
    torch._foreach_add_(params, momenta, alpha=-0.01)


def _op_list(net, ref: Reference, precision, device: str):
    """The reference step's op list as a run's profile.json holds it (``cptsim.measure.opcount``): counted at full
    precision on a copy, at 1x and 2x its batch, with the same hand-written SGD update."""
    import copy

    import torch

    from cptsim.measure.opcount import OpCounter, OpProfile, _bits, _records, optimizer_label
    from cptsim.models.loss import class_cross_entropy

    counts = []
    precision.set(32, 32)
    try:
        for scale in (1, 2):
            work = copy.deepcopy(net)
            x, y = (v.to(device) for v in ref.inputs(work, scale, torch.Generator().manual_seed(1)))
            params = [q for q in work.parameters() if q.requires_grad]
            for q in params:
                q.grad = torch.zeros_like(q)
            momenta = [torch.zeros_like(q) for q in params]
            counter = OpCounter()
            with counter:
                with counter.phase("fwd"):
                    loss = class_cross_entropy(work(x), y)
                with counter.phase("bwd"):
                    loss.backward()
                with counter.phase("opt"), torch.no_grad():
                    _sgd_update(params, momenta)
                    torch._foreach_zero_([q.grad for q in params])
            counts.append(counter)
    finally:
        precision.set(8, 8)
    return OpProfile(records=_records(counts[0], counts[1], ref.samples), batch_sizes=[ref.samples, 2 * ref.samples],
                     element_bits=_bits(net), optimizer=optimizer_label("sgd"))


def model_parts(prof, samples: int, measured: dict, op_list: bool = True) -> tuple[float, dict]:
    """(work seconds, {fixed cost: what it multiplies}) of one step of ``prof`` at ``samples`` on the host model
    with ``measured``'s rates (``op_list``: pricing the step's op list), through ``cptsim.cost.model.estimate`` as
    a report prices a run: the model is linear in its fixed costs, so one estimate without them and one with each
    alone at 1 ms give the parts (without the op list, one per-layer-phase cost: ``layer``)."""
    import tempfile

    from cptsim.cost.model import estimate

    from .calibrate import write_host_profile

    step = [{"step": 0, "batch_size": samples, "bits": 8, "grad_bits": 8}]
    times = {}
    with tempfile.TemporaryDirectory() as d:
        for which in (None, *(FIXED_COSTS if op_list else ("layer",))):
            m = {**measured, "op_list": op_list,
                 **{f"{k}_overhead_s": 1e-3 if k == which else 0.0 for k in FIXED_COSTS}}
            _, host = write_host_profile(m, Path(d) / f"host-{which}.toml")
            times[which] = float(estimate(prof, step, host, per_layer=False).latency_s["total"])
    return times[None], {k: (t - times[None]) / 1e-3 for k, t in times.items() if k is not None}

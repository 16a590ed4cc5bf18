"""The host profile a report uses: measured on this machine once, automatically, instead of placeholder numbers.

A newcomer's first `cptsim report` compares the measured step times with the host profile's model. The shipped
``host`` profile holds placeholder rates, so without `cptsim hw calibrate` that comparison was off by ~45% and
looked like a broken model. Now, when the user has no host profile of their own (``host.toml`` in the user profile
directory, from `cptsim hw calibrate`), the report measures this machine once (``calibrate.calibrate_host`` and two
reference training steps, about AUTO_SECONDS, with a progress bar on stderr, at the thread count and device the run
used) and keeps the result as ``host-auto-<device>-t<threads>-<machine>.toml`` in cptsim's cache directory
(``auto_profile_dir``: $CPTSIM_HOME/cache, else $XDG_CACHE_HOME/cptsim, ~/.cache/cptsim), where every later report on
this machine finds it. It is a cache, not a profile the user made: it stays out of the user's profile directory,
and deleting it only means measuring again. A run's thread count changes every rate, so there is one file per
thread count a run used. <machine> is a hash of the host name, CPU model, architecture and torch version: a home
directory shared between machines keeps one profile per machine. ``--no-calibrate`` (or CPTSIM_NO_CALIBRATE=1)
keeps the placeholder.
"""

from __future__ import annotations

import hashlib
import os
import platform
import socket
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
    a CPU file without GEMM tiers (no int8 rate, nor the line saying it could not be measured), or one whose
    per-layer figure came from the reference CNN alone (it put small-activation steps, a gcn's, at 2-3x)."""
    if not calibrate or os.environ.get(NO_CALIBRATE_ENV, "") not in ("", "0"):
        return False
    try:
        text = path.read_text()
    except OSError:
        return False
    if "step of cptsim.calibration.autocal's reference CNN less" in text:  # the CNN-alone figure's comment
        return True
    return device == "cpu" and "int8_gmac_s" not in text and "tiers measured" not in text


def measure(path: Path, device: str, threads: int, seconds: float = AUTO_SECONDS,
            say: Callable[[str], None] | None = None, progress: bool = True) -> Path:
    """Measure this machine at ``threads`` CPU threads on ``device`` and write the profile to ``path``.

    ``seconds`` bounds the measurement: each part samples until its share is spent and stops after one call where
    a call outlasts it (``calibrate._median_time``), so a loaded machine or a slow GEMM tier overruns by a few calls,
    not by minutes. A progress bar on stderr (``progress``) shows the part being measured."""
    import time

    import torch

    from .calibrate import calibrate_host, write_host_profile

    say = say or (lambda s: None)
    say(f"the host profile was never measured on this machine ({device}, {threads} thread"
        f"{'s' if threads != 1 else ''}): measuring it once, about {seconds:g} s (longer on a busy machine), into "
        f"{path}")
    t0 = time.perf_counter()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with _Bar(progress, seconds) as bar:
            # calibrate_host's parts add up to ~1.2x its budget (warm-ups, tensors to fill): 0.6 + 0.25 of
            # ``seconds`` land near ``seconds`` in all
            measured = calibrate_host(device=device, seconds=0.6 * seconds,
                                      stage=lambda name, done: bar.stage(name, 0.7 * min(done, 1.0)))
            micro = measured["layer_overhead_s"]
            bar.stage("reference training steps", 0.7)
            measured["layer_overhead_s"] = step_overhead(measured, device, 0.25 * seconds)
            bar.stage("written", 1.0)
    finally:
        torch.set_num_threads(before)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        written, _ = write_host_profile(measured, path)
        text = written.read_text().replace(_MICRO_COMMENT, _STEP_COMMENT.format(micro=micro * 1e6))
        from cptsim.fileio import atomic_write_bytes

        atomic_write_bytes(written, text.encode())
    except (InputError, OSError) as e:
        raise InputError(f"the automatic host measurement could not be kept: {e}; give --no-calibrate") from None
    say(f"measured in {time.perf_counter() - t0:.1f} s; kept in {written} (a cache: later reports on this machine "
        "at this thread count reuse it; --no-calibrate uses the shipped placeholder, `cptsim hw calibrate` writes "
        "your own host.toml)")
    return written


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


_MICRO_COMMENT = "per layer-phase, tiny-layer training step"
_STEP_COMMENT = ("per layer-phase: whole SGD steps of cptsim.calibration.autocal's reference CNN and MLP less their "
                 "modelled work (tiny-layer step alone: {micro:.0f} us)")


def _reference_model():
    """A small CNN (three quantized 3x3 convs with BatchNorm, an FP32 classifier) on 1x16x16 inputs: the kind of
    step whose fixed costs (dispatch, autograd, loss, optimizer, the loss read) the microbenchmarks miss."""
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def _reference_mlp():
    """Three quantized Linear layers with ReLU and LayerNorm between, on 34 rows of 34 features: the dense
    transforms of a small graph network (a gcn on karate without its aggregations) and of MLPs -- steps whose
    activations are small, so that a layer's norm and activation cost their dispatch, not their bytes."""
    import torch.nn as nn

    return nn.Sequential(nn.Linear(34, 512), nn.ReLU(), nn.LayerNorm(512), nn.Linear(512, 512), nn.ReLU(),
                         nn.LayerNorm(512), nn.Linear(512, 4))


def step_overhead(measured: dict, device: str, budget_s: float) -> float:
    """Seconds per executed layer-phase that make the host model reproduce whole training steps.

    ``calibrate_host`` times the parts of a step (matmuls, copies, quantizer passes, a tiny layer's dispatch); a
    real step also pays per-step costs none of them holds: the loss, zero_grad, the optimizer update, the read of
    the loss, Python, and the norms and activations beside each layer. This runs full steps of two small reference
    networks (not the user's model): a CNN at batch 64, whose layers' BatchNorm and ReLU move real bytes, and an
    MLP on 34 rows, whose do not; models each with the measured rates and takes the per-layer-phase figure that
    makes both models' errors smallest (least squares of log(modelled / measured)). One network would fit its
    own kind and miss the other's: the CNN's figure alone put a gcn run on karate at +75% on one thread. Never
    below the tiny-layer figure."""
    import numpy as np

    micro = float(measured["layer_overhead_s"])
    refs = [_reference_step(measured, device, _reference_model, (1, 16, 16), 64, ["11"], 0.6 * budget_s),
            _reference_step(measured, device, _reference_mlp, (34,), 34, [], 0.4 * budget_s)]
    refs = [(t, work, phases) for t, work, phases in refs if phases > 0 and t > 0]
    if not refs or micro <= 0:
        return micro
    implied = [max(micro, (t - work) / phases) for t, work, phases in refs]
    grid = np.linspace(min(implied), max(implied), 401)
    err = sum(np.log((work + grid * phases) / t) ** 2 for t, work, phases in refs)
    return float(grid[int(np.argmin(err))])


def _reference_step(measured: dict, device: str, make, shape, batch: int, fp_layers, budget_s: float):
    """(measured seconds, modelled seconds without the overhead term, executed layer-phases) of one SGD step of
    the reference network ``make()`` at ``batch`` samples of ``shape``."""
    import tempfile

    import torch
    import torch.nn.functional as F

    from .calibrate import _median_time, write_host_profile
    from .fit import step_components
    from cptsim.numerics.layers import quantize_model
    from cptsim.measure.profiler import MacCounter

    gen = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = make().to(device)
        precision = quantize_model(net, fp_layers=fp_layers)
        precision.set(8, 8)
        x = torch.randn(batch, *shape, generator=gen).to(device)
        y = torch.randint(4, (batch,), generator=gen).to(device)
        params = [q for q in net.parameters() if q.requires_grad]
        momenta = [torch.zeros_like(q) for q in params]
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

        def step() -> None:
            # torch.optim.SGD's multi-tensor update (momentum 0.9, weight decay 5e-4), written out: creating a
            # torch.optim optimizer imports torch._dynamo, 2.5 s of a report that never trains
            if params[0].grad is not None:
                torch._foreach_zero_([q.grad for q in params])
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            with torch.no_grad():
                d = torch._foreach_add([q.grad for q in params], params, alpha=5e-4)
                torch._foreach_mul_(momenta, 0.9)
                torch._foreach_add_(momenta, d)
                torch._foreach_add_(params, momenta, alpha=-0.01)
            loss.item()

        # the layers' MACs and sizes as a run's trace counts them (not profile_model: its op list, which the host
        # model does not read, took seconds)
        counter = MacCounter(net, "autocal-reference")
        try:
            step()
            prof = counter.layer_profile(batch, list(shape))
        finally:
            counter.close()
        t_step = _median_time(step, budget_s, sync)
    with tempfile.TemporaryDirectory() as d:
        _, host = write_host_profile(measured, Path(d) / "host.toml")
        comp = step_components(prof, [{"batch_size": batch, "bits": 8, "grad_bits": 8}], host)[0]
    micro = float(measured["layer_overhead_s"])
    phases = comp[3] / micro if micro > 0 else 0.0
    return t_step, float(comp[:3].sum()), phases

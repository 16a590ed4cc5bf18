"""The host profile a report uses: measured on this machine once, automatically, instead of placeholder numbers.

A newcomer's first `cptsim report` compares the measured step times with the host profile's model. The shipped
``host`` profile holds placeholder rates, so without `cptsim hw calibrate` that comparison was off by ~45% and
looked like a broken model. Now, when the user has no host profile of their own (``host.toml`` in the user profile
directory, from `cptsim hw calibrate`), the report measures this machine once (``calibrate.calibrate_host``, a few
seconds, at the thread count and device the run used) and keeps the result as
``host-auto-<device>-t<threads>-<machine>.toml`` in the user profile directory, where every later report on this
machine finds it. <machine> is a hash of the host name, CPU model, architecture and torch version: a home directory
shared between machines keeps one profile per machine. ``--no-calibrate`` (or CPTSIM_NO_CALIBRATE=1) keeps the
placeholder.
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


def auto_profile_path(device: str = "cpu", threads: int = 1) -> Path:
    """Where the automatic measurement of this machine at ``threads`` threads on ``device`` is kept."""
    from cptsim.cost.hardware import user_profile_dir

    return user_profile_dir() / f"host-auto-{device}-t{int(threads)}-{machine_id()}.toml"


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
                say: Callable[[str], None] | None = None, seconds: float = AUTO_SECONDS) -> str:
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
    if path.is_file() and not _lacks_tiers(path, device, calibrate):
        return str(path)
    if not calibrate or os.environ.get(NO_CALIBRATE_ENV, "") not in ("", "0"):
        return host
    measure(path, device, threads, seconds, say)
    return str(path)


def _lacks_tiers(path: Path, device: str, calibrate: bool) -> bool:
    """An automatic CPU measurement kept before the host had GEMM tiers (issue 28: no int8 rate), to be measured
    again when measuring is allowed -- once: the new file has the rate, or says it could not measure it."""
    if device != "cpu" or not calibrate or os.environ.get(NO_CALIBRATE_ENV, "") not in ("", "0"):
        return False
    try:
        text = path.read_text()
    except OSError:
        return False
    return "int8_gmac_s" not in text and "tiers measured" not in text


def measure(path: Path, device: str, threads: int, seconds: float = AUTO_SECONDS,
            say: Callable[[str], None] | None = None) -> Path:
    """Measure this machine at ``threads`` CPU threads on ``device`` and write the profile to ``path``."""
    import torch

    from .calibrate import calibrate_host, write_host_profile

    say = say or (lambda s: None)
    say(f"the host profile was never measured on this machine ({device}, {threads} thread"
        f"{'s' if threads != 1 else ''}): measuring it once, about {seconds:g} s ...")
    import time

    t0 = time.perf_counter()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        measured = calibrate_host(device=device, seconds=0.7 * seconds)
        micro = measured["layer_overhead_s"]
        measured["layer_overhead_s"] = step_overhead(measured, device, 0.3 * seconds)
    finally:
        torch.set_num_threads(before)
    try:
        written, _ = write_host_profile(measured, path)
        text = written.read_text().replace(_MICRO_COMMENT, _STEP_COMMENT.format(micro=micro * 1e6))
        from cptsim.fileio import atomic_write_bytes

        atomic_write_bytes(written, text.encode())
    except (InputError, OSError) as e:
        raise InputError(f"the automatic host measurement could not be kept: {e}; give --no-calibrate") from None
    say(f"measured in {time.perf_counter() - t0:.1f} s; kept in {written} (later reports on this machine reuse it; "
        "--no-calibrate uses the shipped placeholder, `cptsim hw calibrate` writes your own host.toml)")
    return written


_MICRO_COMMENT = "per layer-phase, tiny-layer training step"
_STEP_COMMENT = ("per layer-phase: a whole SGD step of cptsim.calibration.autocal's reference CNN less its modelled work "
                 "(tiny-layer step alone: {micro:.0f} us)")


def _reference_model():
    """A small CNN (three quantized 3x3 convs with BatchNorm, an FP32 classifier) on 1x16x16 inputs: the kind of
    step whose fixed costs (dispatch, autograd, loss, optimizer, the loss read) the microbenchmarks miss."""
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def step_overhead(measured: dict, device: str, budget_s: float, batch: int = 64) -> float:
    """Seconds per executed layer-phase that make the host model reproduce a whole training step.

    ``calibrate_host`` times the parts of a step (matmuls, copies, quantizer passes, a tiny layer's dispatch); a
    real step also pays per-step costs none of them holds: the loss, zero_grad, the optimizer update, the read of
    the loss, Python. This runs full SGD steps of a small reference CNN (not the user's model), models the same
    step with the measured rates, and spreads what is left over its layer-phases. Never below the tiny-layer
    figure."""
    import tempfile

    import torch
    import torch.nn.functional as F

    from .calibrate import _median_time, write_host_profile
    from .fit import step_components
    from cptsim.numerics.layers import quantize_model
    from cptsim.measure.profiler import profile_model

    gen = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = _reference_model().to(device)
        precision = quantize_model(net, fp_layers=["11"])
        precision.set(8, 8)
        x = torch.randn(batch, 1, 16, 16, generator=gen).to(device)
        y = torch.randint(10, (batch,), generator=gen).to(device)
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

        def step() -> None:
            opt.zero_grad(set_to_none=False)
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            loss.item()

        t_step = _median_time(step, budget_s, sync)
        prof = profile_model(net, x, model_name="autocal-reference")
    with tempfile.TemporaryDirectory() as d:
        _, host = write_host_profile(measured, Path(d) / "host.toml")
        comp = step_components(prof, [{"batch_size": batch, "bits": 8, "grad_bits": 8}], host)[0]
    micro = float(measured["layer_overhead_s"])
    phases = comp[3] / micro if micro > 0 else 0.0
    if phases <= 0:
        return micro
    return max(micro, (t_step - float(comp[:3].sum())) / phases)

"""Measure the machine cptsim runs on and write it as a ``host`` hardware profile (``cptsim hw calibrate``).

Four figures, each the median of repeated timings within a fixed time budget, with torch on the chosen device:

* FP32 matmul MAC rate over a few conv-as-GEMM shapes (the median across shapes);
* memory bandwidth of a large tensor copy, counting bytes read + bytes written (how callers count ``bytes_moved``);
* element-wise rate of cptsim's quantizers (``cptsim.numerics.quant``: one round-to-nearest and one stochastic pass, 4M elements);
* the fixed cost of one layer-phase: a training step of tiny quantized conv + BN + ReLU layers, per layer-phase;
* on a CPU, the rate of every GEMM tier torch reaches here: int8 ``torch._int_mm`` (VNNI / AMX: what the
  exact path, on by default on a CPU, runs a quantized Linear layer's forward and wgrad on) and bf16 ``torch.mm``
  (for reference: no training GEMM runs in bf16), each the median over INT_SHAPES of per-shape medians, beside the
  FP32 rate. A tier this torch or CPU cannot run is recorded as 0 (not measured), with the reason;
* on a CPU, what the step's other ops cost beyond their bytes (cptsim.cost.hardware.host prices a run's op list):
  dropout's random numbers (``bernoulli_``), a GELU forward and backward, and attention's per-head matmuls (FP32
  ``bmm`` over ATTENTION_SHAPES).

The fixed costs a whole training step pays beyond these (per launched op, per quantized layer-phase) are fitted
to reference workloads' steps by cptsim.calibration.autocal (``measure_host``), which `cptsim hw calibrate` and a
report's automatic measurement run on top of ``calibrate_host``.

On CUDA the figures are those of the GPU executing a training step as ``cptsim train`` runs it there: one CUDA
graph per step (``cptsim.run.cudagraph``), so the host's dispatch is hidden and every term is GPU time, which adds up.
So the MAC rate is that of convolutions forward + backward (cuDNN, TF32 as torch allows it by default), not of an
FP32 matmul; the quantizer rate is that of the fused quantizers; quantizer passes and the tiny-layer step are timed
as CUDA graph replays (eagerly, if capture fails or CPTSIM_CUDA_GRAPHS=0, which is then how training runs too).

On CUDA, power comes from NVML when ``pynvml`` is importable; on a CPU, from the RAPL energy counter when the OS
exposes it. Otherwise power is unknown (0), and the profile reports energy as 0 J.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

from cptsim.measure.energy import nvml_index
from cptsim.errors import InputError
from cptsim.cost.hardware import HardwareProfile, check_profile_file_name, host_profile_text, load_profile, user_profile_dir

# (M, K, N) of conv layers lowered to GEMMs: ResNet-ish 3x3 convs (K = 9 x C_in) over a batch of feature maps.
MATMUL_SHAPES = ((512, 1152, 1024), (1024, 576, 256), (256, 2304, 512))
# On CUDA: 3x3 convolutions (batch, channels in = out, height = width) of CIFAR and ImageNet ResNets, forward +
# backward (dgrad, wgrad), which is what a training step's layer-phases run.
CONV_SHAPES = ((128, 16, 32), (128, 64, 8), (64, 64, 56), (64, 128, 28), (64, 256, 14), (64, 512, 7))
# (M, K, N) of the LM-sized GEMMs the exact path runs: tokens x width x width (transformer-lm's projections at
# batch 16 x 256 tokens, an LSTM's gates), and the conv-as-GEMM shapes above; _int_mm needs M > 16, K and N multiples of 8
INT_SHAPES = ((4096, 128, 384), (4096, 512, 512), (512, 1152, 1024))
# The exact path's row and column sums (cptsim.numerics.exact_gemm.int_linear): int8 GEMMs against 8 columns (rows)
# of ones, whose one narrow side runs them at a third of a square GEMM's rate (65-80 against ~210 GMAC/s on this
# project's EPYC): a forward's row sums (tokens x width x 8), a wgrad's error row sums (8 x tokens) and input column
# sums. (M, K, N), one of each orientation, at transformer-lm's widths and a batch of 64 x 64 tokens.
INT_SUM_SHAPES = ((4096, 512, 8), (8, 4096, 512))
# The exact path's weight pass (exact_gemm.weight_codes) is timed on: gcn's hidden transform; transformer-lm's
# are 128 x 128 .. 512 x 128
WEIGHT_CODES_SHAPE = (512, 512)
ELEMENTWISE_NUMEL = 4 * 1024 * 1024
OTHER_OP_NUMEL = 1024 * 1024  # a transformer-lm step's activations: 64 x 64 tokens x 256 (a 4 MB tensor)
# Attention's matmuls on a CPU, (batch x heads, tokens, head width): one small GEMM per head and sequence, scores
# (T x d @ d x T) and their mix (T x T @ T x d), which run at a fraction of a large GEMM's rate -- timed with their
# operands out of cache, as a step runs them (each consumes what the op before it wrote): 22-30 GMAC/s on this
# project's EPYC where the same bmm in cache runs at 33-39
ATTENTION_SHAPES = ((256, 64, 32), (64, 128, 64), (32, 256, 64))
# On a CPU, the FP32 rate of Linear layers' GEMMs apart from convolutions': a small model's Linear layers over a
# batch of tokens or rows (M, K, N), widths 128-512 -- 33-40 GMAC/s on that EPYC where the conv-as-GEMM shapes
# above reach 46-48 (a narrow K or N leaves the kernel's tiles part empty)
LINEAR_SHAPES = ((4096, 128, 512), (4096, 512, 128), (2048, 256, 256))
FLUSH_BYTES = 8 * 2**20  # written between timed calls of a cold-cache measurement: past a core's L2
COPY_NUMEL = {"cpu": 16 * 1024 * 1024, "cuda": 64 * 1024 * 1024}  # 64 / 256 MB: well past the last-level cache
_RAPL = Path("/sys/class/powercap/intel-rapl:0/energy_uj")


def calibrate_host(device: str = "cpu", seconds: float = 3.0, stage: Callable[[str, float], None] | None = None) -> dict:
    """Measure this machine with torch; returns the rates in SI units plus what measured them.

    ``seconds`` is the total time budget: each measurement samples until its share is spent, and one whose single
    call outlasts its share stops after that call (``_median_time``), so a slow GEMM tier or a loaded machine
    overruns the budget by a few calls, not by repetitions of them. ``stage(name, fraction of the budget done)``
    is called as each measurement begins (a progress bar).
    Keys: device, threads, cpu, gpu, torch_version, matmul_macs_per_s, matmul_by_shape, bandwidth_bytes_per_s,
    elementwise_elems_per_s, layer_overhead_s, power_w (None when unknown), power_source, measured_at, elapsed_s,
    and ``tiers`` (a CPU only, else {}): {"int8": {...}, "bf16": {...}}, each with macs_per_s (0 when not
    measured), by_shape and note.
    """
    import torch

    if device not in ("cpu", "cuda"):
        raise InputError(f"device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("device cuda requested but torch sees no CUDA GPU (torch.cuda.is_available() is False)")
    if not (seconds > 0):
        raise InputError(f"seconds must be a positive number, got {seconds!r}")

    t_start = time.perf_counter()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    power = _PowerMeter(device)
    stage = stage or (lambda name, done: None)

    # Half the budget for matmul (where power is sampled; on a CPU 0.25 FP32 conv-as-GEMM shapes, 0.1 FP32 Linear
    # shapes and 0.15 the int8 / bf16 tiers), a quarter each for bandwidth and the quantizer (on a CPU 0.2 each, and
    # 0.1 for the random-number and transcendental rates of the step's other ops, 0.05 for attention's matmuls).
    by_shape, linear_by_shape = [], []
    tiers: dict = {}
    power.start()
    stage("matmul rate", 0.0)
    if device == "cuda":
        by_shape = _conv_rates(0.5 * seconds, sync)
    else:
        with torch.no_grad():
            for m, k, n in MATMUL_SHAPES:
                a = torch.randn(m, k, device=device)
                b = torch.randn(k, n, device=device)
                t = _median_time(lambda: torch.mm(a, b), 0.25 * seconds / len(MATMUL_SHAPES), sync)
                by_shape.append({"shape": [m, k, n], "macs_per_s": m * k * n / t})
            for m, k, n in LINEAR_SHAPES:
                a, b = torch.randn(m, k), torch.randn(k, n)
                t = _median_time(lambda: torch.mm(a, b), 0.1 * seconds / len(LINEAR_SHAPES), sync)
                linear_by_shape.append({"shape": [m, k, n], "macs_per_s": m * k * n / t})
        stage("int8 / bf16 GEMM tiers", 0.35)
        tiers = cpu_tier_rates(0.15 * seconds, sync)
    power_w, power_source = power.stop()
    stage("memory bandwidth", 0.5)
    with torch.no_grad():
        x = torch.empty(COPY_NUMEL[device], device=device).uniform_()
        y = torch.empty_like(x)
        share = 0.25 if device == "cuda" else 0.2
        t = _median_time(lambda: y.copy_(x), share * seconds, sync)
        bandwidth = 2 * x.numel() * x.element_size() / t
        del x, y

        # cptsim's own quantizers, as training runs them: one round-to-nearest pass (activations, weights) and one
        # stochastic-rounding pass (errors); the rate is per element per quantizer call, averaged over the two.
        # (quantize_activation / quantize_error: the fused quantizers on CUDA, fake_quant / fake_quant_stochastic
        # on a CPU)
        from cptsim.numerics.quant import quantize_activation, quantize_error

        stage("quantizer passes", 0.75)
        q = torch.randn(ELEMENTWISE_NUMEL, device=device)

        def both() -> None:
            lo, hi = torch.aminmax(q)
            quantize_activation(q, lo, hi, 8)
            quantize_error(q, 8)

        t = _median_time(_graphed(both, device), share * seconds, sync)
        elementwise = 2 * ELEMENTWISE_NUMEL / t
        rng = transcendental = attention = 0.0
        if device == "cpu":  # the step's other ops that cost more than their bytes (cptsim.cost.hardware.host)
            stage("random numbers, GELU, attention", 0.95)
            rng, transcendental = other_op_rates(0.1 * seconds, sync)
            attention = attention_rate(0.05 * seconds, sync)

    stage("per-layer overhead", 1.0)
    layer_overhead = _layer_overhead_s(device, 0.15 * seconds, sync)

    return {
        "device": device,
        "threads": torch.get_num_threads(),
        "cpu": _cpu_name(),
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
        "torch_version": torch.__version__.split("+")[0],
        "matmul_macs_per_s": statistics.median(s["macs_per_s"] for s in by_shape),
        "linear_macs_per_s": statistics.median(s["macs_per_s"] for s in linear_by_shape) if linear_by_shape else 0.0,
        "linear_by_shape": linear_by_shape,
        "layer_overhead_s": layer_overhead,
        "matmul_by_shape": by_shape,
        "bandwidth_bytes_per_s": bandwidth,
        "elementwise_elems_per_s": elementwise,
        "rng_elems_per_s": rng,
        "attention_macs_per_s": attention,
        "transcendental_elems_per_s": transcendental,
        "tiers": tiers,
        "power_w": power_w,
        "power_source": power_source,
        "measured_at": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "elapsed_s": time.perf_counter() - t_start,
    }


def other_op_rates(budget_s: float, sync=lambda: None) -> tuple[float, float]:
    """(random-number, transcendental) elements per second on OTHER_OP_NUMEL elements: dropout's draw as a CPU runs
    it (``bernoulli_`` into a tensor the size of its input), and a GELU forward and backward (``gelu_backward``: an
    element of each, as a step runs them); half the budget each."""
    import torch

    with torch.no_grad():
        x = torch.randn(OTHER_OP_NUMEL)
        g = torch.randn(OTHER_OP_NUMEL)
        mask = torch.empty_like(x)
        t_rng = _median_time(lambda: mask.bernoulli_(0.9), budget_s / 2, sync)
        t_gelu = _median_time(lambda: (torch.ops.aten.gelu(x), torch.ops.aten.gelu_backward(g, x)),
                              budget_s / 2, sync)
    return OTHER_OP_NUMEL / t_rng, 2 * OTHER_OP_NUMEL / t_gelu


def attention_rate(budget_s: float, sync=lambda: None) -> float:
    """MAC/s of attention's per-head matmuls, FP32 ``torch.bmm`` over ATTENTION_SHAPES with cold operands
    (``_cold_time``): scores and mix of each, the median over shapes."""
    import torch

    rates = []
    with torch.no_grad():
        for b, t, d in ATTENTION_SHAPES:
            q, k, p = torch.randn(b, t, d), torch.randn(b, d, t), torch.randn(b, t, t)
            sec = _cold_time(lambda: (torch.bmm(q, k), torch.bmm(p, q)), budget_s / len(ATTENTION_SHAPES), sync)
            rates.append(2 * b * t * t * d / sec)
    return statistics.median(rates)


def _cold_time(fn: Callable[[], object], budget_s: float, sync: Callable[[], None], min_samples: int = 3) -> float:
    """Median time of one call of ``fn`` with its operands out of the cache: FLUSH_BYTES written before each call
    (not timed). Samples until ``budget_s`` is spent, timing included, at least ``min_samples``."""
    import torch

    flush = torch.empty(FLUSH_BYTES // 4)
    deadline = time.perf_counter() + budget_s
    fn()  # warm-up: allocation, kernel selection
    sync()
    times: list[float] = []
    while len(times) < min_samples or time.perf_counter() < deadline:
        flush.fill_(1.0)
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return max(statistics.median(times), 1e-12)


def cpu_tier_rates(budget_s: float, sync=lambda: None, shapes=INT_SHAPES) -> dict:
    """The CPU's int8 (``torch._int_mm``) and bf16 (``torch.mm``) GEMM rates over ``shapes`` (M, K, N): per tier
    {"macs_per_s": median over shapes (0 when the tier cannot run here), "by_shape": [...], "note": how}."""
    import torch

    out = {}
    per = budget_s / (2 * max(len(shapes), 1))
    tier_budget = budget_s / 2
    makers = {
        "int8": (lambda m, k, n: (torch.randint(-128, 128, (m, k), dtype=torch.int8),
                                  torch.randint(-128, 128, (k, n), dtype=torch.int8)),
                 lambda a, b: torch._int_mm(a, b), "torch._int_mm int8 x int8 -> int32 (exact)"),
        "bf16": (lambda m, k, n: (torch.randn(m, k).bfloat16(), torch.randn(k, n).bfloat16()),
                 torch.mm, "torch.mm bf16 (for reference: no training GEMM runs in bf16)"),
    }
    for name, (make, op, how) in makers.items():
        rows, note = [], how
        if name == "int8" and not hasattr(torch, "_int_mm"):
            out[name] = {"macs_per_s": 0.0, "by_shape": [], "note": "not measured: this torch has no _int_mm"}
            continue
        try:
            with torch.no_grad():
                for m, k, n in shapes:
                    a, b = make(m, k, n)
                    t = _median_time(lambda: op(a, b), per, sync)
                    rows.append({"shape": [m, k, n], "macs_per_s": m * k * n / t})
                    if 2 * t > tier_budget and len(rows) < len(shapes):
                        # a tier whose one call outlasts half its budget (int8 or bf16 emulated on an AVX2-only
                        # CPU: 0.4 s a call) is rated on the shapes done so far, not for tens of seconds
                        note = f"{how}; {len(rows)} of {len(shapes)} shapes (the rest would outlast the budget)"
                        break
        except RuntimeError as e:  # no kernel for this dtype on this CPU / build
            out[name] = {"macs_per_s": 0.0, "by_shape": [], "note": f"not measured: {str(e).splitlines()[0][:120]}"}
            continue
        out[name] = {"macs_per_s": statistics.median(r["macs_per_s"] for r in rows) if rows else 0.0,
                     "by_shape": rows, "note": note}
        if name == "int8" and rows and note == how:  # (not where the tier was cut short: a slow int8)
            out[name]["sum_macs_per_s"] = _int8_sum_rate(per, sync)
            codes = _weight_codes_rate(per, sync)
            if codes:
                out[name]["weight_codes_elems_per_s"] = codes
    return out


def _weight_codes_rate(budget_s: float, sync=lambda: None) -> float:
    """Elements per second of the exact path's weight pass (``exact_gemm.weight_codes`` at 8 bits on a
    WEIGHT_CODES_SHAPE weight: the per-channel range, Qw(W), its codes, their sums and the transpose in one C call);
    0 where the C kernels are not usable (the eager passes then run, which the quantizer rate and bytes price)."""
    import torch

    from cptsim.numerics import ckernels, exact_gemm

    w = torch.randn(*WEIGHT_CODES_SHAPE)
    if not ckernels.usable(w):
        return 0.0
    return w.numel() / _median_time(lambda: exact_gemm.weight_codes(w, 8), budget_s, sync)


def _int8_sum_rate(budget_s: float, sync=lambda: None) -> float:
    """MAC/s of the exact path's sum GEMMs (INT_SUM_SHAPES): the median over both orientations."""
    import torch

    rates = []
    with torch.no_grad():
        for m, k, n in INT_SUM_SHAPES:
            a = torch.randint(-128, 128, (m, k), dtype=torch.int8)
            b = torch.randint(-128, 128, (k, n), dtype=torch.int8)
            rates.append(m * k * n / _median_time(lambda: torch._int_mm(a, b), budget_s / len(INT_SUM_SHAPES), sync))
    return statistics.median(rates)


def write_gpu_profile(records: dict, host_path: Path) -> tuple[Path, HardwareProfile]:
    """Write this GPU's shape-model profile (``cptsim.calibration.gpu_micro``: measured tiers, SM count, clock,
    bandwidth, fitted GEMM and depthwise constants, per-launch times, NVML power) next to the host profile, as
    ``<host stem>-gpu.toml``."""
    from cptsim.calibration.gpu_micro import calibrated_profile_text
    from cptsim.fileio import atomic_write_bytes

    path = host_path.with_name(f"{host_path.stem}-gpu.toml")
    text = calibrated_profile_text(records, name=path.stem)
    try:
        atomic_write_bytes(path, text.encode("utf-8"))
    except OSError as e:
        raise InputError(f"cannot write {path}: {e.strerror}") from None
    return path, load_profile(str(path))


def default_output_path() -> Path:
    """Where ``cptsim hw calibrate`` writes unless told otherwise: the user's profile dir, host.toml."""
    return user_profile_dir() / "host.toml"


def _layer_overhead_s(device: str, budget_s: float, sync) -> float:
    """Fixed cost of one executed layer-phase: a training step (forward + backward) of two tiny quantized
    conv + BN + ReLU blocks, whose arithmetic is negligible, divided by its 6 layer-phases (fwd, dgrad, wgrad
    of each conv). What it measures is dispatch, autograd and the per-call cost of the quantizers and BN."""
    import torch
    import torch.nn as nn

    from cptsim.numerics.layers import quantize_model

    net = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                        nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU()).to(device)
    quantize_model(net, fp_layers=[]).set(8, 8)
    x = torch.randn(2, 4, 4, 4, device=device, requires_grad=True)

    def step() -> None:
        net(x).sum().backward()

    return _median_time(_graphed(step, device), budget_s, sync) / 6


def _graphed(fn: Callable[[], object], device: str) -> Callable[[], object]:
    """On CUDA (graphs on): ``fn`` captured as a CUDA graph, returned as its replay, as training runs a step there;
    else (a CPU, CPTSIM_CUDA_GRAPHS=0, or a capture that fails) ``fn`` itself."""
    if device != "cuda":
        return fn
    import torch

    from cptsim.run.cudagraph import graphs_enabled

    if not graphs_enabled():
        return fn
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):  # compile, lazy initialisation: on the stream that captures
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            fn()
        return g.replay
    except Exception:
        return fn


def _conv_rates(budget_s: float, sync) -> list[dict]:
    """MAC rate of 3x3 convolutions forward + backward on CUDA (3 x the forward MACs per step), per shape."""
    import torch
    import torch.nn.functional as F

    out = []
    for n, c, hw in CONV_SHAPES:
        x = torch.randn(n, c, hw, hw, device="cuda", requires_grad=True)
        w = torch.randn(c, c, 3, 3, device="cuda", requires_grad=True)
        g = torch.randn(n, c, hw, hw, device="cuda")

        def step() -> None:
            torch.autograd.grad(F.conv2d(x, w, padding=1), (x, w), g)

        t = _median_time(step, budget_s / len(CONV_SHAPES), sync)
        out.append({"shape": [n, c, hw, hw, c], "macs_per_s": 3 * n * c * c * 9 * hw * hw / t})
    return out


def output_path(out: str | os.PathLike | None = None) -> Path:
    """The file ``write_host_profile`` will write: ``out``, or the default; checked before anything is measured."""
    path = Path(out).expanduser() if out is not None else default_output_path()
    if path.suffix != ".toml":
        raise InputError(f"--out must name a .toml file, got {str(path)!r}")
    if path.is_dir():
        raise InputError(f"--out names a directory, not a file: {path}")
    check_profile_file_name(path, "--out")
    return path


def host_profile_toml(measured: dict, name: str = "host") -> str:
    """The text of a ``host`` profile holding the measurements of ``calibrate_host``."""
    dev = measured["device"]
    machine = measured["gpu"] if dev == "cuda" and measured.get("gpu") else measured["cpu"]
    description = f"This machine: {machine} ({dev}, {measured['threads']} threads), measured by cptsim hw calibrate"
    power = measured["power_w"]
    power_note = (f"average during the matmul runs, from {measured['power_source']}" if power
                  else "unknown on this machine (no NVML / RAPL reading): energy is reported as 0 J")
    rate_of = ("3x3 conv forward + backward (cuDNN, torch's default TF32) median over N,C,H,W,K"
               if dev == "cuda" else "fp32 torch.mm median over")
    source = (f"measured on this machine by `cptsim hw calibrate` ({measured['measured_at']}, torch "
              f"{measured['torch_version']}, {dev}, {measured['threads']} threads): {rate_of} "
              f"{', '.join('x'.join(map(str, s['shape'])) for s in measured['matmul_by_shape'])}; tensor copy of "
              f"{COPY_NUMEL[dev] * 4 // 2**20} MB; cptsim.numerics.quant round-to-nearest + stochastic on {ELEMENTWISE_NUMEL} elements")
    params = {
        "device": dev, "calibrated": True, "threads": int(measured["threads"]), "cpu": measured["cpu"] or "unknown",
        "torch_version": measured["torch_version"], "measured_at": measured["measured_at"],
        "matmul_gmac_s": _sig(measured["matmul_macs_per_s"] / 1e9),
        "bandwidth_gb_s": _sig(measured["bandwidth_bytes_per_s"] / 1e9),
        "elementwise_gelem_s": _sig(measured["elementwise_elems_per_s"] / 1e9),
        "layer_overhead_us": _sig(measured.get("layer_overhead_s", 0.0) * 1e6),
        "power_w": _sig(power or 0.0),
    }
    if measured.get("op_list"):  # the step's other ops priced (the reference workloads' fit: autocal)
        params.update({"op_list": True, "op_overhead_us": _sig(measured.get("op_overhead_s", 0.0) * 1e6),
                       "conv_overhead_us": _sig(measured.get("conv_overhead_s",
                                                             measured.get("layer_overhead_s", 0.0)) * 1e6),
                       "rng_gelem_s": _sig(measured.get("rng_elems_per_s", 0.0) / 1e9),
                       "transcendental_gelem_s": _sig(measured.get("transcendental_elems_per_s", 0.0) / 1e9),
                       "attention_gmac_s": _sig(measured.get("attention_macs_per_s", 0.0) / 1e9),
                       "linear_gmac_s": _sig(measured.get("linear_macs_per_s", 0.0) / 1e9)})
    tiers = measured.get("tiers") or {}
    for tier in ("int8", "bf16"):  # added keys (a file without them reads as FP32 only)
        rate = float((tiers.get(tier) or {}).get("macs_per_s") or 0.0)
        if rate > 0:
            params[f"{tier}_gmac_s"] = _sig(rate / 1e9)
            if tiers[tier].get("sum_macs_per_s"):
                params[f"{tier}_sum_gmac_s"] = _sig(tiers[tier]["sum_macs_per_s"] / 1e9)
            if tiers[tier].get("weight_codes_elems_per_s"):
                params["weight_codes_gelem_s"] = _sig(tiers[tier]["weight_codes_elems_per_s"] / 1e9)
            shapes = ", ".join("x".join(map(str, r["shape"])) for r in tiers[tier]["by_shape"])
            source += f"; {tiers[tier]['note']} median over {shapes}"
    comments = {"matmul_gmac_s": "conv fwd+bwd, median over shapes" if dev == "cuda" else "fp32 matmul, median over shapes",
                "bandwidth_gb_s": "copy: bytes read + written per s",
                "elementwise_gelem_s": "quantizer elements per s",
                "layer_overhead_us": _layer_overhead_comment(measured),
                "power_w": power_note,
                "op_list": "the step's other ops priced from the run's op list (cptsim.cost.hardware.host)",
                "op_overhead_us": "per launched op of the op list and full-precision layer-phase: fitted to the "
                                  "reference workloads",
                "conv_overhead_us": "per phase of a quantized convolution besides its GEMM, bytes and quantizer "
                                    "passes: fitted to the reference workloads",
                "rng_gelem_s": "bernoulli_ (dropout's draw) elements per s",
                "transcendental_gelem_s": "GELU forward + backward elements per s (transcendental activations)",
                "attention_gmac_s": "fp32 bmm of attention's per-head scores and mix, operands out of cache, "
                                    "median over (sequences x heads, tokens, head width) "
                                    + ", ".join("x".join(map(str, a)) for a in ATTENTION_SHAPES),
                "linear_gmac_s": "fp32 matmul of Linear-layer shapes, median over "
                                 + ", ".join("x".join(map(str, a)) for a in LINEAR_SHAPES),
                "int8_gmac_s": "torch._int_mm int8, median over shapes: the exact path's tier (on unless "
                               "CPTSIM_EXACT_GEMM=0)",
                "int8_sum_gmac_s": "torch._int_mm of the exact path's row and column sums (against 8 columns of "
                                   "ones), median over " + ", ".join("x".join(map(str, a)) for a in INT_SUM_SHAPES),
                "weight_codes_gelem_s": "exact_gemm.weight_codes (range, Qw(W), codes, sums, transpose in one C "
                                        "call) elements per s on a " + "x".join(map(str, WEIGHT_CODES_SHAPE))
                                        + " weight",
                "bf16_gmac_s": "bf16 torch.mm, median over shapes (reference only: no training GEMM runs in bf16)"}
    header = [f"Written by `cptsim hw calibrate` at {measured['measured_at']}. Re-run it to refresh; "
              "`cptsim report --fit` fits [calibration] to measured runs.",
              "time = macs / matmul rate + bytes / bandwidth + quantizer elements / rate "
              "+ layer_overhead per executed layer-phase"
              + (" + the op list's ops: op_overhead per launch + bytes / bandwidth + random-number and "
                 "transcendental elements at their rates" if measured.get("op_list") else ""),
              "int8 tier: only the GEMMs the exact path (CPTSIM_EXACT_GEMM) routes to torch._int_mm (Linear fwd / "
              "wgrad at <= 8 bits; cptsim.cost.hardware.host); everything else FP32"]
    refs = [r for r in measured.get("references") or [] if "measured_s" in r]
    if refs:
        header.append("fixed costs fitted to training steps of the reference workloads (cptsim.calibration.autocal),"
                      " measured vs modelled ms per step: " + "; ".join(
                          f"{r['workload']} {r['measured_s'] * 1e3:.3g} vs {r['modelled_s'] * 1e3:.3g} "
                          f"({r['error_pct']:+.0f}%)" for r in refs))
    if tiers:  # (autocal reads this line: a CPU file written before the tiers has none, and is measured again)
        header.append("GEMM tiers measured: " + "; ".join(f"{t} {r.get('note', '')}" + (
            f" {_sig(r['macs_per_s'] / 1e9)} GMAC/s" if r.get("macs_per_s") else "") for t, r in tiers.items()))
    if dev == "cuda":
        header.append("CUDA: the rates are GPU time of a step replayed as a CUDA graph (as cptsim train runs it), "
                      "so the terms add up; see cptsim.calibration.calibrate")
    return host_profile_text(name, description, [source], params,
                             {"compute_efficiency": 1.0, "memory_efficiency": 1.0}, header, comments)


def _layer_overhead_comment(measured: dict) -> str:
    tiny = f"tiny-layer step alone: {measured.get('tiny_layer_overhead_s', 0.0) * 1e6:.0f} us"
    if measured.get("op_list"):
        return ("per phase of a quantized layer (not a convolution) besides its GEMM, bytes and quantizer passes: "
                f"fitted to the reference workloads ({tiny})")
    if any("measured_s" in r for r in measured.get("references") or []):
        return f"per layer-phase: fitted to whole training steps of the reference workloads ({tiny})"
    return "per layer-phase, tiny-layer training step"


def write_host_profile(measured: dict, out: str | os.PathLike | None = None) -> tuple[Path, HardwareProfile]:
    """Write the measured profile atomically (temp file + os.replace) and read it back through ``load_profile``.

    The profile's name is the file's stem ("host" by default), so a file in the user's profile dir loads by name.
    """
    from cptsim.fileio import atomic_write_bytes

    path = output_path(out)
    text = host_profile_toml(measured, name=path.stem)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, text.encode("utf-8"))
    except OSError as e:
        raise InputError(f"cannot write {path}: {e.strerror}") from None
    return path, load_profile(str(path))


# ----------------------------------------------------------------------------------------------------------------------


def _median_time(fn: Callable[[], object], budget_s: float, sync: Callable[[], None],
                 min_samples: int = 3, max_samples: int = 200) -> float:
    """Median time of one call of ``fn``, sampling until ``budget_s`` is spent (at least ``min_samples`` where they
    fit in it).

    A sample runs ``fn`` enough times to last ~1 ms before one sync, so launch and sync overheads (on a GPU, tens of
    microseconds against kernels of a few) do not count as work. The budget counts from the warm-up call: a call
    that alone outlasts it (a slow tier, a loaded machine) is timed once, not ``min_samples`` times more, so the
    measurement overruns its budget by a call or two at most.
    """
    deadline = time.perf_counter() + budget_s
    fn()  # warm-up: allocation, kernel selection
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    first = max(time.perf_counter() - t0, 1e-9)
    if time.perf_counter() + first > deadline:
        return max(first, 1e-12)
    inner = int(min(1000, max(1, 1e-3 / first)))
    times: list[float] = []
    left = deadline - time.perf_counter()
    min_samples = max(1, min(min_samples, int(left / (first * inner))))
    while len(times) < min_samples or (time.perf_counter() < deadline and len(times) < max_samples):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / inner)
    return max(statistics.median(times), 1e-12)


class _PowerMeter:
    """Average power over an interval: NVML on CUDA, RAPL on a CPU, or unknown (None)."""

    def __init__(self, device: str):
        self.device = device
        self._samples: list[float] = []

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._handle = self._e0 = None
        if self.device == "cuda":
            try:
                import pynvml  # optional: nvidia-ml-py

                pynvml.nvmlInit()
                import torch

                self._handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index(torch.cuda.current_device()))
                self._e0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)  # mJ since driver load
            except Exception:  # no pynvml, no NVML, or a GPU without the energy counter
                self._e0 = None
        else:
            try:
                self._e0 = int(_RAPL.read_text())  # µJ
            except (OSError, ValueError):
                self._e0 = None

    def stop(self) -> tuple[float | None, str]:
        dt = time.perf_counter() - self._t0
        if self._e0 is None or dt <= 0:
            return None, "unknown"
        try:
            if self.device == "cuda":
                import pynvml

                e1 = pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
                return (e1 - self._e0) * 1e-3 / dt, "NVML total energy counter"
            e1 = int(_RAPL.read_text())
            if e1 < self._e0:  # counter wrapped
                return None, "unknown"
            return (e1 - self._e0) * 1e-6 / dt, "RAPL package energy counter (intel-rapl:0)"
        except Exception:
            return None, "unknown"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _sig(x: float) -> float:
    """Four significant digits: what a microbenchmark median is good for."""
    return float(f"{x:.4g}")

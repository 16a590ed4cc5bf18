"""`cptsim hw calibrate --device cuda`: this GPU's shape-model profile from microbenchmarks.

What a user without published measurements for their card gets: one command that times the kernels the GPU time
model (``cptsim.cost.hardware.gpu_kernels``) is made of, on their GPU, and writes a ``gpu`` profile that prices any
network on it. Each constant is either **measured** here or **inherited** from the shipped fit of the card's
architecture generation, and the file says which:

measured
  * ``sm_count``, ``boost_clock_mhz`` (torch's device properties), the NVML power limit (``power_w``);
  * the tiers: one 8192^3 GEMM per precision torch can run (fp16/bf16, tf32, strict fp32, int8 via
    ``torch._int_mm``, fp8 e4m3 via ``torch._scaled_mm`` where the GPU has it), written as the tier's
    ``peak_ops`` with efficiency 1 (the achieved large-GEMM rate *is* what the model scales from);
  * ``bandwidth_gb_s``: the best of a copy and an add over 1e8 elements (bytes read + written), the stream rate;
  * ``gemm_n0``, ``gemm_k0``: least squares of the shape model on an FP16 GEMM grid (``gpu_fit.fit_kernels``, the
    same function ``benchmarks/gpu/fit_gpu_model.py`` fits the shipped H100 constants with);
  * ``depthwise_efficiency``, ``depthwise_memory_efficiency``, ``nchw_depthwise_factor``: the same fit on
    depthwise convolutions (forward, dgrad, wgrad; NCHW and channels-last);
  * ``kernel_overhead_us``: a chain of 1000 kernels with no work (``add_`` on one element) captured as a CUDA
    graph and replayed: the GPU time of one kernel in a graph, launch gap included, x ``KERNELS_PER_LAUNCH`` (the
    kernels a launch the op counter counts really starts); records without it (an older calibration) get the
    generation's shipped value, said so in the file. Never closed on one network's step: that step's unmodelled
    work would hide in it;
  * ``host_overhead_us``: the host's time to dispatch one op eagerly (2000 x ``add_``), and
    ``host_conv_overhead_us``: the host's time per eager cuDNN convolution call (forward, data and weight
    gradient of a tiny convolution, 200 each: cuDNN's per-call setup);
  * ``power_fraction``: mean NVML power over a channels-last AMP ResNet-50 training loop (torchvision's, random
    data) / the power limit; ``idle_power_w``: NVML power with the CUDA context held and nothing running.

inherited (not identifiable from isolated kernels; the shipped fit of the generation, on whole networks)
  * ``memory_efficiency`` as a fraction of the *stream* rate (a network's small, strided memory-bound kernels
    reach about half of what one large copy does), ``norm_memory_efficiency``, ``nchw_conv_factor``,
    ``nchw_norm_elements_per_clock``, and the NCHW batch-norm shape constants (``nchw_norm_rows_per_clock``,
    ``nchw_norm_backward_rows_per_clock``, ``nchw_norm_channels_per_sm``: measured per kernel from profiler traces
    on the lent H100, not by these microbenchmarks): Hopper (compute capability 9.x) from ``hw_profiles/h100.toml``, anything
    else from the Ampere fit (``gpu_kernels.DEFAULTS`` and ``hw_profiles/rtx3090.toml``).

The microbenchmark records have the format of ``benchmarks/gpu/gpu_measure.py``'s JSON (which imports its timing
helpers from here), so a profile can also be re-derived offline from a saved measurement
(``constants_from_records``; ``benchmarks/gpu/bench_gpu_calibrate.py`` does it for the H100 run in
``benchmarks/results/gpu-shape-model-H100-run1.json``).
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np

# FP16 GEMM grid for the shape constants: square sizes, skinny N / K, transformer- and CNN-like shapes
# (M, N, K) = (rows, output columns, reduction depth), as benchmarks/gpu/gpu_measure.py's GEMM_SHAPES
GEMM_GRID = [(s, s, s) for s in (256, 512, 1024, 2048, 4096, 8192)] + [
    (37824, 768, 768), (37824, 3072, 768), (37824, 768, 3072), (8192, 64, 8192), (64, 8192, 8192),
    (8192, 8192, 64), (512, 4096, 4096), (256, 1000, 2048), (32768, 64, 64), (131072, 64, 576),
    (196608, 384, 196), (768, 768, 37824)]
TIER_N = 8192
# depthwise convolutions (N, C, H, W, K, R, stride, pad, groups, label), as gpu_measure.py's CONV_SHAPES
DEPTHWISE = [(128, 96, 56, 56, 96, 3, 1, 1, 96, "dw3x3_56"), (128, 384, 14, 14, 384, 3, 1, 1, 384, "dw3x3_14"),
             (128, 96, 56, 56, 96, 7, 1, 3, 96, "dw7x7_convnext"), (128, 240, 28, 28, 240, 5, 1, 2, 240, "dw5x5_28")]
STREAM_N = 100_000_000
# kernels a step really starts per launch cptsim's op counter counts (cuDNN's layout transforms, memsets, split-K
# reductions): the median over 10 traced steps of 7 networks on the lent H100 (benchmarks/gpu/fit_gpu_model.py,
# kernels_per_launch, which prints it)
KERNELS_PER_LAUNCH = 1.98
GRAPH_CHAIN = 1000
# the stream efficiency the shipped network fits' memory_efficiency is relative to: copies and adds of 1e8
# elements reach 0.87 of the H100's HBM3 peak (benchmarks/results/gpu-shape-model-H100-run1.json;
# fit_gpu_model.STREAM_EFFICIENCY)
STREAM_EFFICIENCY = 0.87
# (the NCHW batch-norm shape constants are per-kernel measurements of the generation's cuDNN kernels, made on the
# lent H100 from profiler traces, not yet by this microbenchmark run: inherited too)
INHERITED = ("memory_efficiency", "norm_memory_efficiency", "nchw_conv_factor", "nchw_transform_bytes",
             "conv_n_tile", "conv_k_tile_bytes",
             "nchw_norm_elements_per_clock",
             "nchw_norm_rows_per_clock", "nchw_norm_backward_rows_per_clock", "nchw_norm_channels_per_sm")
# fitted on this GPU's kernels where they identify them (else the generation's value, marked so in the file)
MEASURED_SHAPE = ("gemm_n0", "gemm_k0", "nchw_depthwise_factor", "depthwise_efficiency", "depthwise_memory_efficiency",
                  "kernel_overhead_us")


# -- timing -------------------------------------------------------------------------------------------------------

def sync(torch, dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class Clock:
    """CUDA events on a GPU, perf_counter on a CPU (``ms`` waits for the second mark)."""

    def __init__(self, torch, dev):
        self.torch, self.cuda = torch, dev.type == "cuda"

    def mark(self):
        if self.cuda:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def ms(self, a, b) -> float:
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b)
        return (b - a) * 1e3


def bench(torch, dev, fn, target_ms=1.0, reps=5, warmup=2, max_inner=100) -> dict:
    """Median ms per call: warm-up, an inner loop sized to ~target_ms, ``reps`` event-timed repeats."""
    for _ in range(warmup):
        fn()
    sync(torch, dev)
    clk = Clock(torch, dev)
    a = clk.mark()
    fn()
    b = clk.mark()
    one = max(clk.ms(a, b), 1e-3)
    inner = int(max(1, min(max_inner, math.ceil(target_ms / one))))
    ts = []
    for _ in range(reps):
        a = clk.mark()
        for _ in range(inner):
            fn()
        b = clk.mark()
        ts.append(clk.ms(a, b) / inner)
    return {"ms": statistics.median(ts), "ms_min": min(ts), "inner": inner, "reps": reps}


# -- microbenchmarks (records in benchmarks/gpu/gpu_measure.py's format) ------------------------------------------

def gemm_item(torch, dev, M, N, K, dt) -> dict:
    """One GEMM M x K @ K x N in ``dt`` (fp16, bf16, tf32, fp32, int8 via _int_mm, fp8 e4m3 via _scaled_mm)."""
    rec = {"M": M, "N": N, "K": K, "dtype": dt}
    if dt == "int8":
        a = torch.randint(-8, 8, (M, K), device=dev, dtype=torch.int8)
        b = torch.randint(-8, 8, (K, N), device=dev, dtype=torch.int8)
        fn = lambda: torch._int_mm(a, b)  # noqa: E731
        ebytes, obytes = 1, 4
    elif dt == "fp8":
        # e4m3 x e4m3 -> bf16 with per-tensor scales; _scaled_mm wants the second operand column-major
        a = torch.randn(M, K, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(N, K, device=dev).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=dev)
        fn = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
        ebytes, obytes = 1, 2
    else:
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32, "fp32": torch.float32}[dt]
        if dev.type == "cpu" and dtype == torch.float16:
            dtype = torch.bfloat16
        a = torch.randn(M, K, device=dev, dtype=dtype)
        b = torch.randn(K, N, device=dev, dtype=dtype)
        fn = lambda: torch.mm(a, b)  # noqa: E731
        ebytes = obytes = a.element_size()
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dt == "tf32"
    try:
        r = bench(torch, dev, fn)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    rec.update(r)
    rec["torch_dtype"] = str(a.dtype)
    rec["tflops"] = 2 * M * N * K / (r["ms"] * 1e-3) / 1e12
    rec["min_bytes"] = ebytes * (M * K + K * N) + obytes * M * N
    return rec


def conv_item(torch, dev, shape, dt, fmt) -> dict:
    """One convolution's forward, dgrad and wgrad times (aten.convolution / convolution_backward)."""
    N, C, H, W, K, Rk, st, pad, g, label = shape
    dtype = {"fp16": torch.float16, "fp32": torch.float32}[dt]
    if dev.type == "cpu" and dtype == torch.float16:
        dtype = torch.bfloat16
    mf = torch.channels_last if fmt == "nhwc" else torch.contiguous_format
    x = torch.randn(N, C, H, W, device=dev, dtype=dtype).contiguous(memory_format=mf)
    w = torch.randn(K, C // g, Rk, Rk, device=dev, dtype=dtype).contiguous(memory_format=mf)
    conv = torch.ops.aten.convolution
    y = conv(x, w, None, [st, st], [pad, pad], [1, 1], False, [0, 0], g)
    dy = torch.randn_like(y)
    P, Qo = y.shape[2], y.shape[3]
    macs = N * K * P * Qo * (C // g) * Rk * Rk
    rec = {"label": label, "N": N, "C": C, "H": H, "W": W, "K": K, "R": Rk, "stride": st, "pad": pad, "groups": g,
           "dtype": dt, "format": fmt, "P": P, "Q": Qo, "macs": macs,
           "bytes_x": x.numel() * x.element_size(), "bytes_w": w.numel() * w.element_size(),
           "bytes_y": y.numel() * y.element_size(), "torch_dtype": str(dtype),
           "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32}
    cb = torch.ops.aten.convolution_backward
    fns = {"fwd": lambda: conv(x, w, None, [st, st], [pad, pad], [1, 1], False, [0, 0], g),
           "dgrad": lambda: cb(dy, x, w, None, [st, st], [pad, pad], [1, 1], False, [0, 0], g, [True, False, False]),
           "wgrad": lambda: cb(dy, x, w, None, [st, st], [pad, pad], [1, 1], False, [0, 0], g, [False, True, False])}
    for k, fn in fns.items():
        try:
            r = bench(torch, dev, fn, reps=4)
            rec[f"{k}_ms"] = r["ms"]
            rec[f"{k}_tmacs"] = macs / (r["ms"] * 1e-3) / 1e12
        except Exception as e:  # noqa: BLE001 - a shape cuDNN refuses is recorded, not fatal
            rec[f"{k}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return rec


def stream_items(torch, dev, n, dt) -> list[tuple[str, object, int]]:
    """(name, fn, bytes read + written) of the two streaming kernels the bandwidth is measured with."""
    dtype = {"fp16": torch.float16, "fp32": torch.float32}[dt]
    x = torch.randn(n, device=dev, dtype=dtype)
    y = torch.randn(n, device=dev, dtype=dtype)
    out = torch.empty_like(x)
    e = x.element_size()
    return [("copy", lambda: out.copy_(x), 2 * n * e), ("add", lambda: torch.add(x, y, out=out), 3 * n * e)]


# -- whole-step measurements --------------------------------------------------------------------------------------

def resnet20_steps(torch, dev, batch: int = 128, steps: int = 30) -> dict:
    """cptsim's CIFAR ResNet-20, batch ``batch``, FP32 SGD steps: median ms eager and replayed as a CUDA graph, and
    the launches cptsim's op counter counts for that step (``OpProfile.totals()['launches']``)."""
    import torch.nn.functional as F

    from cptsim.measure.profiler import profile_named_model
    from cptsim.models import create_model

    totals = profile_named_model("resnet20", (3, 32, 32), 10).ops.totals()
    net = create_model("resnet20", num_classes=10, in_channels=3).to(dev).train()
    x = torch.randn(batch, 3, 32, 32, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)

    def step():
        opt.zero_grad(set_to_none=False)
        F.cross_entropy(net(x), y).backward()
        opt.step()

    clk = Clock(torch, dev)

    def timed(run) -> float:
        for _ in range(3):
            run()
        sync(torch, dev)
        ts = []
        for _ in range(steps):
            a = clk.mark()
            run()
            b = clk.mark()
            ts.append(clk.ms(a, b))
        return statistics.median(ts)

    rec = {"batch": batch, "launches": float(totals["launches"]), "conv_launches": float(totals["conv_launches"]),
           "eager_ms": timed(step)}
    if dev.type == "cuda":
        rec["graphed_ms"] = timed(graph_replay(torch, step))
    return rec


def graph_replay(torch, step, warmup: int = 3):
    """``step`` captured as a CUDA graph (after ``warmup`` eager calls on a side stream, as capture wants);
    returns the graph's replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    return g.replay


def graph_chain(torch, dev, kernels: int = GRAPH_CHAIN) -> dict:
    """The GPU time of one kernel with no work inside a CUDA graph: ``kernels`` ``add_`` calls on one element
    captured once and replayed (median of 20 replays); what each launch of a graphed step costs beyond its work."""
    t = torch.zeros(1, device=dev)

    def chain():
        for _ in range(kernels):
            t.add_(1)

    replay = graph_replay(torch, chain)
    clk = Clock(torch, dev)
    for _ in range(3):
        replay()
    sync(torch, dev)
    ts = []
    for _ in range(20):
        a = clk.mark()
        replay()
        b = clk.mark()
        ts.append(clk.ms(a, b))
    return {"kernels": kernels, "us_per_kernel": statistics.median(ts) * 1e3 / kernels}


def conv_dispatch(torch, dev, calls: int = 200) -> dict:
    """The host's time per eager cuDNN convolution call: the forward, data-gradient and weight-gradient calls of a
    1x8x8x8 convolution (3x3, 8 channels), ``calls`` each, timed on the host without waiting for the GPU (its work
    is a few microseconds, far below the host's): cuDNN's per-call setup, what an eager step pays per convolution
    launch besides the op dispatch."""
    x = torch.randn(1, 8, 8, 8, device=dev)
    w = torch.randn(8, 8, 3, 3, device=dev)
    conv, cb = torch.ops.aten.convolution, torch.ops.aten.convolution_backward
    y = conv(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    dy = torch.randn_like(y)
    fns = [lambda: conv(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
           lambda: cb(dy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, False, False]),
           lambda: cb(dy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, False])]
    for fn in fns:
        for _ in range(10):
            fn()
    sync(torch, dev)
    h = time.perf_counter()
    for _ in range(calls):
        for fn in fns:
            fn()
    host = time.perf_counter() - h
    sync(torch, dev)
    return {"calls": 3 * calls, "eager_host_us_per_conv": host / (3 * calls) * 1e6}


def dispatch(torch, dev, kernels: int = 2000) -> dict:
    """The host's time to dispatch one small op eagerly (``t.add_(1)`` in a loop, no autograd), per kernel: what
    an eager step's element-wise and GEMM launches cost the host besides cuDNN's convolutions."""
    t = torch.zeros(1, device=dev)
    for _ in range(20):
        t.add_(1)
    sync(torch, dev)
    h = time.perf_counter()
    for _ in range(kernels):
        t.add_(1)
    host = time.perf_counter() - h
    sync(torch, dev)
    return {"kernels": kernels, "eager_host_us_per_kernel": host / kernels * 1e6}


class _Nvml:
    """NVML energy counter and power limit of the current GPU, or nothing (no pynvml, no counter)."""

    def __init__(self, torch):
        self.h = self.nv = None
        try:
            import pynvml as nv

            from cptsim.measure.energy import nvml_index

            nv.nvmlInit()
            self.h = nv.nvmlDeviceGetHandleByIndex(nvml_index(torch.cuda.current_device()))
            self.nv = nv
        except Exception:  # noqa: BLE001 - energy is optional
            self.nv = None

    def energy_j(self) -> float | None:
        try:
            return self.nv.nvmlDeviceGetTotalEnergyConsumption(self.h) * 1e-3 if self.nv else None
        except Exception:  # noqa: BLE001
            return None

    def power_limit_w(self) -> float | None:
        try:
            return self.nv.nvmlDeviceGetEnforcedPowerLimit(self.h) * 1e-3 if self.nv else None
        except Exception:  # noqa: BLE001
            return None

    def max_sm_clock_mhz(self) -> float | None:
        try:
            return float(self.nv.nvmlDeviceGetMaxClockInfo(self.h, self.nv.NVML_CLOCK_SM)) if self.nv else None
        except Exception:  # noqa: BLE001
            return None


def power_loop(torch, dev, nvml: _Nvml, seconds: float) -> dict:
    """Mean power over ``seconds`` of torchvision ResNet-50 AMP training (channels-last, batch 128, random data),
    and idle power with the context held, from the NVML energy counter."""
    import torch.nn.functional as F
    import torchvision

    rec: dict = {}
    sync(torch, dev)
    e0, t0 = nvml.energy_j(), time.perf_counter()
    time.sleep(min(1.5, 0.25 * seconds))
    e1, t1 = nvml.energy_j(), time.perf_counter()
    if e0 is not None and e1 is not None:
        rec["idle_power_w"] = (e1 - e0) / (t1 - t0)
    m = torchvision.models.resnet50().to(dev).to(memory_format=torch.channels_last).train()
    x = torch.randn(128, 3, 224, 224, device=dev).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (128,), device=dev)
    opt = torch.optim.SGD(m.parameters(), lr=1e-4, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(m(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    for _ in range(3):
        step()
    sync(torch, dev)
    e0, t0, n = nvml.energy_j(), time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds or n < 3:
        step()
        n += 1
    sync(torch, dev)
    e1, t1 = nvml.energy_j(), time.perf_counter()
    rec.update({"workload": "torchvision resnet50, AMP fp16, channels_last, batch 128, SGD", "steps": n,
                "seconds": t1 - t0, "step_ms": (t1 - t0) / n * 1e3})
    if e0 is not None and e1 is not None:
        rec["busy_power_w"] = (e1 - e0) / (t1 - t0)
    return rec


def device_features(torch, dev, nvml: _Nvml | None = None) -> dict:
    """Name, compute capability, SM count, boost clock, L2 size and power limit of the GPU torch sees."""
    p = torch.cuda.get_device_properties(dev)
    clock = getattr(p, "clock_rate", None)  # kHz, where this torch exposes it
    clock_mhz = clock / 1e3 if clock else (nvml.max_sm_clock_mhz() if nvml else None)
    return {"name": p.name, "capability": f"{p.major}.{p.minor}", "sm_count": int(p.multi_processor_count),
            "boost_clock_mhz": clock_mhz, "l2_bytes": getattr(p, "L2_cache_size", None),
            "total_memory_bytes": int(p.total_memory), "power_limit_w": nvml.power_limit_w() if nvml else None}


def measure(seconds: float = 40.0, device: str = "cuda", quick: bool = False, say=lambda msg: None) -> dict:
    """Run every microbenchmark this module's docstring lists; returns the records (gpu_measure.py's format) and
    the whole-step measurements. ``quick``: tiny sizes (a smoke test of the plumbing on any device; its figures
    mean nothing). ``seconds`` bounds the power loop, the one part whose length is a choice."""
    import torch

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    torch.backends.cudnn.benchmark = True  # as timm's benchmark and a tuned training run: the fastest algorithm
    res: dict = {"gemm": [], "conv": [], "membw": [], "errors": []}
    nvml = _Nvml(torch) if cuda else None
    res["device"] = device_features(torch, dev, nvml) if cuda else {"name": "cpu", "capability": None,
                                                                       "sm_count": None, "boost_clock_mhz": None}

    def guard(what, fn):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - one failed kernel must not lose the rest of the calibration
            res["errors"].append({"item": what, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            say(f"  {what}: {type(e).__name__}: {str(e)[:150]}")
            return None

    n = 256 if quick else TIER_N
    for dt in ("fp16", "bf16", "tf32", "fp32", "int8", "fp8"):
        if dt in ("int8", "fp8") and not cuda:
            continue
        r = guard(f"tier {dt}", lambda: gemm_item(torch, dev, n, n, n, dt))
        if r:
            res["gemm"].append(r)
            say(f"  tier {dt:5s} {n}^3 GEMM: {r['tflops']:.1f} TFLOPS")
    grid = [(64, 64, 64), (128, 96, 72)] if quick else GEMM_GRID
    for M, N, K in grid:
        if (M, N, K) != (n, n, n):
            r = guard(f"gemm fp16 {M}x{N}x{K}", lambda: gemm_item(torch, dev, M, N, K, "fp16"))
            if r:
                res["gemm"].append(r)
    dws = [(2, 8, 8, 8, 8, 3, 1, 1, 8, "dw_quick")] if quick else DEPTHWISE
    for fmt in ("nchw", "nhwc"):
        for sh in dws:
            r = guard(f"conv {sh[-1]} {fmt}", lambda: conv_item(torch, dev, sh, "fp16", fmt))
            if r:
                res["conv"].append(r)
    sn = 100_000 if quick else STREAM_N
    for dt in ("fp32", "fp16"):
        for name, fn, nbytes in stream_items(torch, dev, sn, dt):
            r = guard(f"stream {name} {dt}", lambda: bench(torch, dev, fn, reps=5, target_ms=0.5))
            if r:
                res["membw"].append({"op": name, "n": sn, "dtype": dt, "nominal_bytes": nbytes, **r,
                                     "gb_per_s": nbytes / (r["ms"] * 1e-3) / 1e9})
    if cuda:
        torch.cuda.empty_cache()
    r = guard("dispatch", lambda: dispatch(torch, dev, 200 if quick else 2000))
    if r:
        res["launch"] = r
    r = guard("conv dispatch", lambda: conv_dispatch(torch, dev, 20 if quick else 200))
    if r:
        res["conv_dispatch"] = r
    if cuda:
        r = guard("graph chain", lambda: graph_chain(torch, dev, 100 if quick else GRAPH_CHAIN))
        if r:
            res["graph_launch"] = r
            say(f"  graphed kernel with no work: {r['us_per_kernel']:.2f} us")
    r = guard("resnet20", lambda: resnet20_steps(torch, dev, batch=8 if quick else 128, steps=3 if quick else 30))
    if r:
        res["resnet20"] = r
        say(f"  resnet20 b{r['batch']} fp32: eager {r['eager_ms']:.2f} ms, graphed {r.get('graphed_ms', float('nan')):.2f} "
            f"ms, {r['launches']:.0f} launches")
    if cuda and nvml.nv is not None:
        r = guard("power", lambda: power_loop(torch, dev, nvml, 1.0 if quick else max(2.0, min(6.0, seconds / 8))))
        if r:
            res["power"] = r
            say(f"  power: busy {r.get('busy_power_w', float('nan')):.0f} W, idle {r.get('idle_power_w', float('nan')):.0f} W")
    res["torch_version"] = torch.__version__.split("+")[0]
    return res


# -- from records to constants (pure; offline-testable on a saved measurement) ----------------------------------

def generation(capability: str | None) -> str:
    """The shipped fit a GPU inherits its network-level constants from: 'hopper' (9.x), else 'ampere'."""
    try:
        major = int(str(capability).split(".")[0])
    except ValueError:
        return "ampere"
    return "hopper" if major >= 9 else "ampere"


def inherited_constants(gen: str) -> dict:
    """The network-level constants of a generation's shipped fit, ``memory_efficiency`` re-expressed as a fraction
    of the stream rate (the calibrated profile's bandwidth is the measured stream rate, not the datasheet's)."""
    from cptsim.cost.hardware import gpu_kernels, load_profile

    p = load_profile("h100" if gen == "hopper" else "rtx3090")
    out = {k: float(p.calibration[k]) if p.calibration.get(k) is not None else float(gpu_kernels.DEFAULTS[k])
           for k in INHERITED if k != "memory_efficiency"}
    out["memory_efficiency"] = min(1.0, float(p.calibration["memory_efficiency"]) / STREAM_EFFICIENCY)
    return out


def tier_rates(records: dict) -> dict:
    """{tier name: measured TFLOPS (or TOPS)} of the largest square GEMM per dtype (fp16/bf16 kept as one 16-bit
    tier, the faster)."""
    best: dict = {}
    for r in records.get("gemm", []):
        if r["M"] == r["N"] == r["K"] and r.get("tflops"):
            key = (r["dtype"], r["M"])
            if key not in best or r["tflops"] > best[key]:
                best[key] = r["tflops"]
    out = {}
    for dt in ("fp16", "bf16", "tf32", "fp32", "int8", "fp8"):
        sizes = [m for (d, m) in best if d == dt]
        if sizes:
            out[dt] = best[(dt, max(sizes))]
    if "bf16" in out:
        out["fp16"] = max(out.get("fp16", 0.0), out.pop("bf16"))
    return out


def profile_text(records: dict, name: str, constants: dict | None = None, sources_extra: str = "") -> str:
    """The TOML of a ``gpu`` profile with the measured tiers, SM count, clock, bandwidth and power of ``records``,
    and ``constants`` in its [calibration] (defaults: the generation's inherited ones)."""
    from cptsim.cost.hardware import _toml_value, parse_profile

    from cptsim.errors import InputError

    dev = records.get("device", {})
    rates = tier_rates(records)
    if "fp16" not in rates or not ({"tf32", "fp32"} & set(rates)):
        raise InputError("no 16-bit and 32-bit GEMM tier could be measured on this GPU")
    stream = max((m["gb_per_s"] for m in records.get("membw", []) if m.get("op") in ("copy", "add")), default=None)
    if not stream:
        raise InputError("the stream bandwidth could not be measured on this GPU")
    gen = generation(dev.get("capability"))
    consts = {**inherited_constants(gen), **(constants or {})}
    from cptsim.cost.hardware import load_profile

    gen_prof = load_profile("h100" if gen == "hopper" else "rtx3090")
    unidentified = [k for k in MEASURED_SHAPE if k not in consts]  # written, not left to a default, and said so
    consts.update({k: gen_prof.kernel_constant(k) for k in unidentified})
    power = records.get("power", {})
    power_w = dev.get("power_limit_w") or 0.0
    busy = power.get("busy_power_w")
    tiers = []
    if "fp8" in rates:  # 8-bit floats and ints share a tier width; the faster of the two runs 1..8-bit GEMMs
        if rates["fp8"] > rates.get("int8", 0.0):
            rates.pop("int8", None)
            tiers.append(("fp8", 8, rates.pop("fp8"), "TFLOPS"))
        else:
            rates.pop("fp8")
    if "int8" in rates:
        tiers.append(("int8", 8, rates.pop("int8"), "TOPS"))
    tiers += [(k, 16 if k == "fp16" else 32, v, "TFLOPS") for k, v in rates.items()]
    fp32_tier = "tf32" if any(t[0] == "tf32" for t in tiers) else "fp32"
    measured_at = records.get("measured_at", "")
    lines = [f"# Written by `cptsim hw calibrate --device cuda` {measured_at}: measured rates, not datasheet peaks",
             "# (cptsim.calibration.gpu_micro says what each constant is measured from, and which are inherited).",
             f"name = {_toml_value(name)}", 'kind = "gpu"',
             f"description = {_toml_value((dev.get('name') or 'this GPU') + ' (measured by cptsim hw calibrate)')}",
             "sources = [", "    " + _toml_value(
                 f"measured on this machine by `cptsim hw calibrate --device cuda` {measured_at} (torch "
                 f"{records.get('torch_version', '?')}): {TIER_N}^3 GEMM per tier, an FP16 GEMM grid and depthwise "
                 "convolutions fitted by gpu_fit.fit_kernels, copy/add of 1e8 elements, a graphed chain of empty "
                 "kernels, eager add_ and cuDNN convolution dispatch, NVML power over ResNet-50 AMP training"
                 + sources_extra) + ",",
             "    " + _toml_value(f"inherited from the shipped {gen} fit (hw_profiles/"
                                  f"{'h100' if gen == 'hopper' else 'rtx3090'}.toml): "
                                  + ", ".join(INHERITED)) + ",", "]", "", "[gpu]",
             f"bandwidth_gb_s = {_sig(stream)}            # measured stream rate (copy / add, bytes read + written)",
             f"sm_count = {int(dev['sm_count'])}" if dev.get("sm_count") else "",
             f"boost_clock_mhz = {_sig(dev['boost_clock_mhz'])}" if dev.get("boost_clock_mhz") else "",
             f"power_w = {_sig(power_w) if power_w else 1.0}" + ("" if power_w else
                                                                   "   # unknown (no NVML): energy is not meaningful"),
             (f"idle_power_w = {_sig(min(power['idle_power_w'], power_w))}   # NVML, CUDA context held"
              if power.get("idle_power_w") and power_w else ""),
             f'fp32_tier = "{fp32_tier}"', "tiers = ["]
    for tname, bits, tflops, unit in tiers:
        lines.append(f"    {{ name = {_toml_value(tname)}, bits = {bits}, peak_ops = {_sig(tflops)}, unit = \"{unit}\", "
                     "efficiency = 1.0 },")
    lines += ["]", "", "[calibration]", "compute_efficiency = 1.0"]
    if busy and power_w:
        lines.append(f"power_fraction = {_sig(min(1.0, busy / power_w))}   # NVML mean over ResNet-50 AMP training "
                     "/ power limit")
    for k in sorted(consts):
        lines.append(f"{k} = {_sig(consts[k])}" + ("   # inherited" if k in INHERITED else
                                                    "   # not identified by the kernels measured: inherited"
                                                    if k in unidentified else "   # measured"))
    text = "\n".join(x for x in lines if x != "") + "\n"
    parse_profile(text.encode("utf-8"), f"{name}.toml")
    return text


def constants_from_records(records: dict, name: str = "calibrated") -> dict:
    """The measured constants of a profile from microbenchmark ``records``: n0 and k0 on the FP16 GEMM grid, the
    depthwise constants on the depthwise convolutions, the per-launch GPU time from the graphed chain of empty
    kernels, the host's per-op and per-convolution times from the dispatch loops."""
    from cptsim.calibration import gpu_fit as F
    from cptsim.cost.hardware import parse_profile

    base = parse_profile(profile_text(records, name).encode("utf-8"), f"{name}.toml")
    consts: dict = {}
    gemm_rows = [r for r in F.kernel_rows(records, min_us=40) if r["label"].startswith("gemm")
                 and r["rec"]["dtype"] == "fp16" and r["rec"]["M"] % 8 == 0 and r["rec"]["K"] % 8 == 0]
    # the shape fit runs at the stream rate: an isolated GEMM's operands stream as a copy does
    kern = F.with_values(base, {"memory_efficiency": 1.0})
    if len(gemm_rows) >= 4:
        consts.update(F.fit_kernels(kern, gemm_rows, ("gemm_n0", "gemm_k0")))
    dw_rows = [r for r in F.kernel_rows(records, min_us=0) if r["label"].startswith("conv dw")]
    if len(dw_rows) >= 3:
        names = ("nchw_depthwise_factor", "depthwise_efficiency", "depthwise_memory_efficiency")
        start = F.with_values(kern, consts)
        fitted = F.fit_kernels(start, dw_rows, names)
        # a constant the kernels do not identify (the fit leaves it where it started: e.g. the depthwise memory
        # rate, when every depthwise kernel measured is compute-bound) stays the generation's, said as such
        consts.update({k: v for k, v in fitted.items() if abs(v - F.get(start, k)) > 1e-6 * max(1.0, abs(v))})
    chain = records.get("graph_launch")
    if chain and chain.get("us_per_kernel"):
        consts["kernel_overhead_us"] = chain["us_per_kernel"] * KERNELS_PER_LAUNCH
    per_op = (records.get("launch") or {}).get("eager_host_us_per_kernel")
    if per_op:
        consts["host_overhead_us"] = per_op
    per_conv = (records.get("conv_dispatch") or {}).get("eager_host_us_per_conv")
    if per_conv:
        consts["host_conv_overhead_us"] = per_conv
    return consts


def calibrated_profile_text(records: dict, name: str) -> str:
    """Records -> the finished profile: measured constants fitted, written over the inherited ones."""
    return profile_text(records, name, constants_from_records(records, name))


def _sig(x: float) -> float:
    return float(f"{float(x):.4g}")


def summary_rows(records: dict) -> list[tuple[str, str]]:
    """(what, value) lines for the calibrate command's table."""
    rows = []
    for k, v in tier_rates(records).items():
        rows.append((f"GEMM tier {k} ({TIER_N}^3)", f"{v:.1f} {'TOPS' if k == 'int8' else 'TFLOPS'}"))
    stream = max((m["gb_per_s"] for m in records.get("membw", [])), default=float("nan"))
    rows.append(("stream bandwidth (copy / add, 1e8)", f"{stream:.0f} GB/s"))
    launch = records.get("launch")
    if launch:
        rows.append(("host dispatch per op (eager add_)", f"{launch['eager_host_us_per_kernel']:.1f} µs"))
    conv = records.get("conv_dispatch")
    if conv:
        rows.append(("host dispatch per cuDNN convolution", f"{conv['eager_host_us_per_conv']:.1f} µs"))
    chain = records.get("graph_launch")
    if chain:
        rows.append(("graphed kernel with no work", f"{chain['us_per_kernel']:.2f} µs"))
    r20 = records.get("resnet20")
    if r20:
        rows.append(("resnet20 b128 FP32 step", f"eager {r20['eager_ms']:.2f} ms, graphed "
                     f"{r20.get('graphed_ms', float('nan')):.2f} ms"))
    p = records.get("power")
    if p:
        rows.append(("power (NVML)", f"busy {p.get('busy_power_w', float('nan')):.0f} W, idle "
                     f"{p.get('idle_power_w', float('nan')):.0f} W"))
    return rows


__all__ = ["measure", "constants_from_records", "calibrated_profile_text", "profile_text", "tier_rates",
           "generation", "inherited_constants", "bench", "gemm_item", "conv_item", "Clock",
           "graph_replay",
           "sync", "summary_rows"]

"""Per-op GPU time of whole training steps, for the networks the cost model misprices most (issue 23), and the
quantized ResNet-50 step against AMP and FP32 with an exactness check of its convolutions (issue 28).

    python benchmarks/gpu/gpu_optrace.py --out DIR [--budget 200] [--quick] [--sections trace,quant]

trace: each workload (timm networks in NCHW/NHWC AMP as benchmarks/gpu/gpu_measure.py ran them held out -- SGD,
  batch as there, cudnn.benchmark left at PyTorch's default -- and cptsim's LSTM/Transformer LMs under AMP) takes 3
  warm-up steps, then 2 steps under torch.profiler (CUDA + CPU activities, shapes recorded). Written per workload
  to DIR/trace-NAME.json.gz: the step's wall time (CUDA events, median of 5 unprofiled steps), the GPU-busy time,
  and for every CPU op that launched kernels: the op, its input shapes, the kernels' names and summed device time
  (aggregated over the 2 steps, divided by 2); and the host's side: per top-level CPU event and autograd node its
  calls and CPU time (``host_ops``), with unprofiled steps' host enqueue time (``host_enqueue_ms``).
  benchmarks/gpu/bench_gpu_optrace.py compares them with the cost model's per-op prediction offline.

quant: torchvision ResNet-50, batch 128, 224x224, eager, NCHW: the step time of AMP (fp16 autocast + GradScaler),
  FP32 (PyTorch defaults: TF32 convolutions, strict FP32 matmuls), and cptsim's quantized layers at 8/8 bits with
  the defaults, with TF32 off, and on cptsim's integer-codes path (quant8_codes: CPTSIM_EXACT_GEMM=1, exact_gemm's
  "Integer codes on TF32"); then one quantized 3x3 convolution of ResNet-50's shapes at 8 bits computed four
  ways -- fake-quantized values with TF32 (what a quantized step runs today, cuDNN's default), fake-quantized values
  in strict FP32, the integer codes with TF32 and the scales applied after (exact products: 8-bit codes fit TF32's
  11-bit significand), and a float64 reference -- with each one's error against the reference; and a 1x1 conv's
  routes as a GEMM of the codes (``pointwise_gemm_routes``: FP16 with FP32 output, int8) against today's conv.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

T0 = time.perf_counter()

TRACE_TIMM = [  # (model, batch, format): the held-out outliers (+ two that the model prices well, as controls)
    ("ghostnet_130", 512, "nchw"), ("hrnet_w18", 256, "nchw"), ("mixnet_s", 512, "nchw"),
    ("dla102", 256, "nchw"), ("gmlp_s16_224", 192, "nchw"), ("resnet50t", 384, "nchw"),
    ("densenet169", 256, "nchw"), ("hrnet_w18", 256, "nhwc"), ("ghostnet_130", 512, "nhwc"),
    ("mixnet_s", 512, "nhwc"),
]
TRACE_WORKLOADS = [("lstm-lm-2x650", "amp"), ("transformer-lm-6x512", "amp"), ("lstm-lm-2x650", "fp32"),
                   ("transformer-lm-6x512", "fp32")]


def say(msg=""):
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def left(args):
    return args.budget - (time.perf_counter() - T0)


def time_steps(torch, step, n):
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return ts


def profile_step(torch, step, steps=2):
    """{ops: [...], gpu_busy_ms, kernels} of ``steps`` profiled steps, per step."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    agg: dict = {}
    busy = 0.0
    nk = 0
    for e in prof.events():
        ks = getattr(e, "kernels", None) or []
        if not ks:
            continue
        names = sorted({k.name[:120] for k in ks})
        dur = sum(k.duration for k in ks)  # us
        busy += dur
        nk += len(ks)
        try:
            shapes = [list(s) if isinstance(s, (list, tuple)) else s for s in (e.input_shapes or [])]
        except Exception:
            shapes = []
        key = json.dumps([e.name, shapes, names])
        a = agg.setdefault(key, {"op": e.name, "shapes": shapes, "kernels": names, "calls": 0, "us": 0.0,
                                 "launches": 0})
        a["calls"] += 1
        a["us"] += dur
        a["launches"] += len(ks)
    ops = sorted(agg.values(), key=lambda a: -a["us"])
    for a in ops:
        a["calls"] /= steps
        a["us"] = round(a["us"] / steps, 2)
        a["launches"] /= steps
    return {"ops": ops, "gpu_busy_ms": busy / steps / 1e3, "kernel_launches": nk / steps,
            "host_ops": host_ops(prof.events(), steps)}


def host_ops(events, steps: int) -> list[dict]:
    """The host's side of the profiled steps, per event name: every top-level CPU event (what the Python code
    dispatched: a forward op, the optimizer's foreach calls, the backward call) and every autograd node the engine
    ran, kernels or not -- calls, CPU time with children (``cpu_us``) and without (``self_cpu_us``), per step.
    What a host time per op kind for eager steps needs (the kernel records above keep no CPU time); the profiler
    inflates CPU time, so ``enqueue_ms`` of unprofiled steps goes beside it."""
    agg: dict = {}
    for e in events:
        if getattr(e, "device_type", None) is not None and "CPU" not in str(e.device_type):
            continue
        top = getattr(e, "cpu_parent", None) is None
        node = str(e.name).startswith("autograd::engine::evaluate_function")
        if not (top or node):
            continue
        a = agg.setdefault(e.name, {"name": e.name, "kind": "autograd" if node else "top", "calls": 0,
                                    "cpu_us": 0.0, "self_cpu_us": 0.0})
        a["calls"] += 1
        a["cpu_us"] += float(e.cpu_time_total)
        a["self_cpu_us"] += float(e.self_cpu_time_total)
    rows = sorted(agg.values(), key=lambda a: -a["cpu_us"])
    for a in rows:
        a["calls"] /= steps
        a["cpu_us"] = round(a["cpu_us"] / steps, 2)
        a["self_cpu_us"] = round(a["self_cpu_us"] / steps, 2)
    return rows


def enqueue_ms(torch, step, n: int = 5) -> dict:
    """Unprofiled steps' host time: the wall time of ``n`` steps issued back to back with no synchronisation inside
    (the host's enqueue, as long as the GPU keeps up) and with the final synchronisation, per step."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return {"host_enqueue_ms": (t1 - t0) / n * 1e3, "wall_ms": (t2 - t0) / n * 1e3}


def sgd_step(torch, opt, amp: bool, loss_of):
    """One training step on the GPU: ``loss_of()`` under fp16 autocast with a GradScaler when ``amp``, else FP32
    (gpu_measure.train_step, the held-out runs' own)."""
    import gpu_measure

    return gpu_measure.train_step(torch, torch.device("cuda"), opt, amp, loss_of)


def timm_step(torch, name, batch, fmt, dev):
    """A timm network's AMP training step as gpu_measure.py's held-out runs took it (SGD, nesterov)."""
    import timm
    import torch.nn.functional as F

    m = timm.create_model(name, pretrained=False).to(dev).train()
    mf = torch.channels_last if fmt == "nhwc" else torch.contiguous_format
    m = m.to(memory_format=mf)
    x = torch.randn(batch, 3, 224, 224, device=dev).contiguous(memory_format=mf)
    y = torch.randint(0, 1000, (batch,), device=dev)
    opt = torch.optim.SGD(m.parameters(), lr=1e-4, momentum=0.9, nesterov=True, weight_decay=0)

    def loss():
        out = m(x)
        return F.cross_entropy(out[0] if isinstance(out, (tuple, list)) else out, y)
    return sgd_step(torch, opt, True, loss)


def workload_step(torch, key, precision, dev):
    """A cptsim workload's training step, gpu_measure.py's own (``workload_train_step``)."""
    import gpu_measure

    w = next(w for w in gpu_measure.WORKLOADS if w[0] == key)
    return gpu_measure.workload_train_step(torch, dev, w, precision)[0]


def section_trace(torch, args, out: Path):
    dev = torch.device("cuda")
    items = [("timm", n, b, f) for n, b, f in TRACE_TIMM] + [("wl", k, p, None) for k, p in TRACE_WORKLOADS]
    if args.quick:
        items = [("timm", "resnet18", 8, "nchw"), ("wl", "lstm-lm-2x650", "amp", None)]
    for kind, name, b, fmt in items:
        if left(args) < 12:
            say(f"skip {name} {fmt or b}: budget")
            continue
        tag = f"{name}-{fmt}" if kind == "timm" else f"{name}-{b}"
        try:
            t = time.perf_counter()
            step = timm_step(torch, name, b, fmt, dev) if kind == "timm" else workload_step(torch, name, b, dev)
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            ts = time_steps(torch, step, 5)
            rec = {"name": name, "format": fmt, "batch": b if kind == "timm" else None,
                   "precision": "amp" if kind == "timm" else b, "step_ms_median": statistics.median(ts),
                   "step_ms_all": ts, "torch": torch.__version__, "device": torch.cuda.get_device_name()}
            rec.update(enqueue_ms(torch, step))
            rec.update(profile_step(torch, step))
            with gzip.open(out / f"trace-{tag}.json.gz", "wt") as f:
                json.dump(rec, f)
            top = ", ".join(f"{o['op']} {o['us'] / 1e3:.1f}" for o in rec["ops"][:4])
            say(f"{tag:28s} step {rec['step_ms_median']:8.2f} ms  gpu busy {rec['gpu_busy_ms']:8.2f} ms  "
                f"launches {rec['kernel_launches']:.0f}  ({time.perf_counter() - t:.0f}s)  top: {top}")
        except Exception as e:  # one network's failure must not stop the others
            say(f"{tag}: FAILED {type(e).__name__}: {str(e)[:200]}")
        finally:
            step = None
            torch.cuda.empty_cache()


def conv_exactness(torch, dev):
    """One quantized 3x3 conv (ResNet-50 layer3 shapes, 8 bits) four ways, errors against float64."""
    import torch.nn.functional as F
    from cptsim.numerics.quant import choose_qparams, quantize_weight

    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.relu(torch.randn(64, 256, 14, 14, generator=g)).to(dev)
    w = (torch.randn(256, 256, 3, 3, generator=g) * 0.05).to(dev)
    bits = 8
    lo, hi = torch.aminmax(x)
    s, zp = choose_qparams(lo, hi, bits)
    kx = torch.clamp(torch.round(x / s) + zp, 0, 2 ** bits - 1) - zp  # integer codes, centred: real = s * kx
    xq = kx * s
    wq = quantize_weight(w, bits)
    lw, hw_ = torch.aminmax(w.reshape(w.shape[0], -1), dim=1)
    sw, zw = choose_qparams(lw, hw_, bits)
    kw = torch.round(wq / sw.view(-1, 1, 1, 1))  # weights: symmetric-or-not, codes recovered from Qw(W)
    kw_back = kw * sw.view(-1, 1, 1, 1)
    res = {"max_abs_code_x": float(kx.abs().max()), "max_abs_code_w": float(kw.abs().max()),
           "weight_codes_roundtrip_max_abs": float((kw_back - wq).abs().max())}
    ref = F.conv2d(xq.double().cpu(), wq.double().cpu(), padding=1).to(dev)
    scale = float(s)
    out = {}
    old_c, old_m = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        out["fake_quant_tf32"] = F.conv2d(xq, wq, padding=1)
        out["codes_tf32"] = F.conv2d(kx, kw, padding=1) * (scale * sw.view(1, -1, 1, 1))
        torch.backends.cudnn.allow_tf32 = False
        out["fake_quant_fp32"] = F.conv2d(xq, wq, padding=1)
        out["codes_fp32"] = F.conv2d(kx, kw, padding=1) * (scale * sw.view(1, -1, 1, 1))
        torch.backends.cudnn.allow_tf32 = True
        ints = F.conv2d(kx, kw, padding=1)
        ints_ref = F.conv2d(kx.double().cpu(), kw.double().cpu(), padding=1).to(dev)
        res["codes_tf32_integer_sums_max_abs_error"] = float((ints.double() - ints_ref).abs().max())
        res["codes_tf32_integer_sums_max"] = float(ints_ref.abs().max())
        # timing: the same conv, fake-quant TF32 vs codes TF32 vs strict FP32 (ms, median of 20)
        tm = {}
        xh, wh = xq.half(), wq.half()
        for nm, fn, tf32 in (("fake_quant_tf32", lambda: F.conv2d(xq, wq, padding=1), True),
                             ("codes_tf32", lambda: F.conv2d(kx, kw, padding=1), True),
                             ("fp32_strict", lambda: F.conv2d(xq, wq, padding=1), False),
                             ("fp16", lambda: F.conv2d(xh, wh, padding=1), True)):
            torch.backends.cudnn.allow_tf32 = tf32
            for _ in range(3):
                fn()
            tm[nm] = statistics.median(time_steps(torch, fn, 20))
        res["conv_ms"] = tm
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old_c, old_m
    mag = float(ref.abs().max())
    for k, v in out.items():
        d = (v.double() - ref).abs()
        res[f"{k}_max_abs_err_rel_to_max"] = float(d.max()) / mag
        res[f"{k}_mean_abs_err_rel_to_max"] = float(d.mean()) / mag
    return res


def pointwise_gemm_routes(torch, dev):
    """Issue 28's next step on a GPU: a ResNet-50 1x1 conv (256 -> 64 channels at 56x56, batch 128; 1x1 convs are
    about half of ResNet-50's FLOPs) at 8 bits, channels-last, as a GEMM of the integer codes (N*H*W, C) x (C, O):
    exact? and how fast, against today's conv. Routes: the fake-quantized TF32 conv (today), the codes TF32 conv
    (cptsim's codes path), the codes as FP16 with FP32 output through ``torch.mm(..., out_dtype=torch.float32)``
    (aten::mm.dtype: FP16 tensor cores, exact for codes < 2**11 if cuBLAS accumulates and writes in FP32), int8
    ``torch._int_mm`` on codes - 128 (offsets not applied: time only), and the plain FP16 conv (AMP's speed)."""
    import torch.nn.functional as F

    from cptsim.numerics.quant import choose_qparams, quantize_weight

    g = torch.Generator(device="cpu").manual_seed(1)
    N, C, H, O, bits = 128, 256, 56, 64, 8
    x = torch.randn(N, C, H, H, generator=g).relu_().to(dev).contiguous(memory_format=torch.channels_last)
    w = (torch.randn(O, C, 1, 1, generator=g) * 0.05).to(dev)
    lo, hi = torch.aminmax(x)
    s, zp = choose_qparams(lo, hi, bits)
    kx = torch.clamp(torch.round(x / s) + zp, 0, 2 ** bits - 1) - zp
    xq = kx * s
    wq = quantize_weight(w, bits)
    lw, hw_ = torch.aminmax(w.reshape(O, -1), dim=1)
    sw = choose_qparams(lw, hw_, bits)[0]
    kw = torch.round(wq / sw.view(-1, 1, 1, 1))
    a16 = kx.permute(0, 2, 3, 1).reshape(-1, C).half()  # channels-last: a view, then one cast
    b16 = kw.reshape(O, C).t().half()
    ints_ref = (kx.permute(0, 2, 3, 1).reshape(-1, C).double().cpu() @ kw.reshape(O, C).t().double().cpu())
    res = {"shape": [N, C, H, H, O]}
    try:
        y = torch.mm(a16, b16, out_dtype=torch.float32)
        res["mm_fp16_out_fp32_integer_max_abs_error"] = float((y.double().cpu() - ints_ref).abs().max())
        res["integer_sums_max"] = float(ints_ref.abs().max())
    except Exception as e:  # noqa: BLE001 - a torch without aten::mm.dtype: say so
        res["mm_fp16_out_fp32"] = f"unavailable: {type(e).__name__}: {str(e)[:120]}"
    ai = (kx + zp - 128).permute(0, 2, 3, 1).reshape(-1, C).to(torch.int8)
    bi = kw.reshape(O, C).clamp(-128, 127).to(torch.int8).t()  # (C, O) column-major, as cuBLASLt takes it
    xh, wh = xq.half(), wq.half()
    routes = {"fake_quant_tf32_conv": (lambda: F.conv2d(xq, wq), True),
              "codes_tf32_conv": (lambda: F.conv2d(kx, kw), True),
              "codes_fp16_mm_out_fp32": (lambda: torch.mm(a16, b16, out_dtype=torch.float32), True),
              "codes_int8_int_mm": (lambda: torch._int_mm(ai, bi), True),
              "fp16_conv": (lambda: F.conv2d(xh, wh), True)}
    tm = {}
    old = torch.backends.cudnn.allow_tf32
    try:
        for nm, (fn, tf32) in routes.items():
            torch.backends.cudnn.allow_tf32 = tf32
            try:
                for _ in range(3):
                    fn()
                tm[nm] = statistics.median(time_steps(torch, fn, 20))
            except Exception as e:  # noqa: BLE001
                tm[nm] = f"failed: {type(e).__name__}: {str(e)[:120]}"
    finally:
        torch.backends.cudnn.allow_tf32 = old
    res["ms"] = tm
    return res


def section_quant(torch, args, out: Path):
    import torch.nn.functional as F
    import torchvision

    from cptsim.numerics.layers import quantize_model

    dev = torch.device("cuda")
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    b = 16 if args.quick else 128
    x = torch.randn(b, 3, 224, 224, device=dev)
    y = torch.randint(0, 1000, (b,), device=dev)

    def make(kind):
        m = torchvision.models.resnet50().to(dev).train()
        pre = None
        if kind.startswith("quant"):
            pre = quantize_model(m)
            pre.set(8, 8)
        opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
        st = sgd_step(torch, opt, kind == "amp", lambda: F.cross_entropy(m(x), y))
        if kind != "quant8_codes":
            return st

        def codes_step():  # cptsim's integer-codes path (exact_gemm, CPTSIM_EXACT_GEMM=1 on CUDA) for this step only
            os.environ["CPTSIM_EXACT_GEMM"] = "1"
            try:
                return st()
            finally:
                os.environ.pop("CPTSIM_EXACT_GEMM", None)
        return codes_step

    steps = {}
    for kind in ("amp", "fp32", "quant8", "quant8_notf32", "quant8_codes"):
        if left(args) < 10:
            say(f"skip quant {kind}: budget")
            continue
        try:
            torch.backends.cudnn.allow_tf32 = kind != "quant8_notf32"
            st = make(kind)
            for _ in range(3):
                st()
            torch.cuda.synchronize()
            steps[kind] = st
        except Exception as e:
            say(f"quant {kind}: FAILED {type(e).__name__}: {str(e)[:200]}")
        finally:
            torch.backends.cudnn.allow_tf32 = True
    times: dict = {k: [] for k in steps}
    for r in range(3 if args.quick else 7):  # alternating rounds, order reversed every round
        order = list(steps) if r % 2 == 0 else list(steps)[::-1]
        for k in order:
            torch.backends.cudnn.allow_tf32 = k != "quant8_notf32"
            times[k] += time_steps(torch, steps[k], 3)
        torch.backends.cudnn.allow_tf32 = True
    res["step_ms_median"] = {k: statistics.median(v) for k, v in times.items()}
    med = res["step_ms_median"]
    if "amp" in med and "quant8" in med:
        res["quant8_over_amp"] = med["quant8"] / med["amp"]
    if "fp32" in med and "quant8" in med:
        res["quant8_over_fp32"] = med["quant8"] / med["fp32"]
    if "quant8_codes" in med and "quant8" in med:  # issue 28: exact on the integers, and how fast against today's
        res["codes_over_quant8"] = med["quant8_codes"] / med["quant8"]
        if "amp" in med:
            res["codes_over_amp"] = med["quant8_codes"] / med["amp"]
    say("resnet50 b%d step ms: %s" % (b, ", ".join(f"{k} {v:.1f}" for k, v in med.items())))
    steps.clear()
    torch.cuda.empty_cache()
    try:
        res["conv_exactness"] = conv_exactness(torch, dev)
        say("conv exactness: " + json.dumps(res["conv_exactness"]))
    except Exception as e:
        say(f"conv exactness: FAILED {type(e).__name__}: {str(e)[:300]}")
    try:
        res["pointwise_routes"] = pointwise_gemm_routes(torch, dev)
        say("1x1 conv routes: " + json.dumps(res["pointwise_routes"]))
    except Exception as e:
        say(f"1x1 conv routes: FAILED {type(e).__name__}: {str(e)[:300]}")
    (out / "quant-resnet50.json").write_text(json.dumps(res, indent=1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=200.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sections", default="quant,trace")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to trace")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    say(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    for s in args.sections.split(","):
        {"trace": section_trace, "quant": section_quant}[s](torch, args, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

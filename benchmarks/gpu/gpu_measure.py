#!/usr/bin/env python
"""Time-boxed GPU measurements for cptsim issue 23 (per-op GPU time model), one JSON file out.

    python benchmarks/gpu/gpu_measure.py --out FILE.json [--budget 330] [--sections a,b,d,c,e,b2]   # on a GPU machine
    python benchmarks/gpu/gpu_measure.py --device cpu --quick --out /tmp/smoke.json                 # CPU smoke test

Run from the cptsim repo root (for section d). Needs torch, timm, numpy; pynvml optional. No network.
The first H100 run is benchmarks/results/gpu-shape-model-H100-run1.{json,log} (timm AMP training img/s, resnet20 steps,
micro-benchmarks, NVML energy); benchmarks/gpu/bench_gpu_zoo.py --source h100-measured compares it with cptsim.
Sections, in the order they run (each item guarded; every item's result or error or "skipped" goes in the JSON,
which is rewritten after every item so a kill still leaves data):
  a  device facts
  b  timm training throughput, AMP fp16 (+GradScaler), NCHW and channels_last, 13 models at timm's 3090 batches
  d  cptsim resnet20 batch 128 FP32 step, eager and CUDA-graphed
  c  per-op microbenchmarks: kernel launch overhead, GEMM grid (fp16/bf16/tf32/fp32/int8), convs fwd/dgrad/wgrad,
     memory-bound ops (achieved bytes/s)
  e  NVML energy of a resnet50 AMP loop + idle power
  b2 resnet50 / vit_base FP32 (default TF32 flags, TF32 on, strict FP32) if time is left
  h  cptsim's own workloads (GCN/SAGE/GAT on an ogbn-arxiv-sized graph, transformer-lm, lstm-lm, CIFAR ResNet-20
     graphed) and timm's ViT-S: step time and NVML joules per step, FP32 and AMP (held out: nothing is fitted on them)
  f  FP8 e4m3 (torch._scaled_mm), int8 (torch._int_mm) and FP16 GEMMs on the same shapes
Budget: the whole run (from process start) stays inside --budget seconds; each section has a latest end time that
reserves the planned minimum of the sections after it, each item is skipped when its estimated cost no longer fits,
and a SIGALRM per item bounds a hung item.
--quick shrinks every size (for a CPU smoke test: --device cpu --quick); its figures mean nothing.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import traceback

T0 = time.perf_counter()
VERSION = "gpu23-measure 1"


def say(msg=""):
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


class ItemTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise ItemTimeout("item time limit reached")


class Run:
    def __init__(self, args):
        self.args = args
        self.deadline = T0 + args.budget
        self.section_end = self.deadline
        self.res = {"meta": {"script": VERSION, "argv": sys.argv, "budget_s": args.budget, "quick": args.quick,
                             "device_arg": args.device, "started_unix": time.time(), "cwd": os.getcwd()},
                    "device": {}, "timm_train": [], "resnet20": [], "launch": [], "gemm": [], "conv": [],
                    "membw": [], "energy": {}, "workloads": [], "fp8": [], "skipped": [], "errors": [],
                    "sections": []}

    # -- bookkeeping ---------------------------------------------------------------------------------------------
    def left(self):
        return min(self.deadline, self.section_end) - time.perf_counter()

    def flush(self):
        self.res["meta"]["elapsed_s"] = round(time.perf_counter() - T0, 2)
        tmp = self.args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.res, f, indent=1, default=str)
        os.replace(tmp, self.args.out)

    def section(self, name, reserve_after):
        """Start a section: it must end reserve_after seconds before the global deadline."""
        self.section_end = self.deadline - reserve_after
        self.res["sections"].append({"name": name, "start_s": round(time.perf_counter() - T0, 2),
                                     "latest_end_s": round(self.section_end - T0, 2)})
        say(f"=== section {name} (has {self.left():.0f}s; {reserve_after:.0f}s kept for later sections)")

    def end_section(self):
        self.res["sections"][-1]["end_s"] = round(time.perf_counter() - T0, 2)
        self.flush()

    def item(self, key, est_s, fn, dest=None, limit_s=None):
        """Run fn() if est_s fits; record result dict (or error/skip) into dest list; returns result or None."""
        if self.left() < est_s:
            self.res["skipped"].append({"item": key, "est_s": round(est_s, 2), "left_s": round(self.left(), 2)})
            say(f"  skip {key} (needs ~{est_s:.1f}s, {self.left():.1f}s left)")
            self.flush()
            return None
        lim = max(1.0, min(self.left(), limit_s if limit_s else 1e9))
        t = time.perf_counter()
        out = None
        signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, lim)
        try:
            out = fn()
        except BaseException as e:  # noqa: BLE001 - nothing may stop the run, but Ctrl-C still should
            if isinstance(e, KeyboardInterrupt):
                raise
            err = {"item": key, "error": f"{type(e).__name__}: {str(e)[:400]}",
                   "trace": traceback.format_exc(limit=3)[-800:]}
            self.res["errors"].append(err)
            say(f"  ERROR {key}: {err['error'][:200]}")
            out = None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        dt = time.perf_counter() - t
        if isinstance(out, dict):
            out.setdefault("item", key)
            out["wall_s"] = round(dt, 3)
            if dest is not None:
                dest.append(out)
        self.flush()
        return out


# ------------------------------------------------------------------------------------------------------------------
SECTIONS = set()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_measure.json")
    ap.add_argument("--budget", type=float, default=330.0, help="hard wall-clock budget in seconds (default 330)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
    ap.add_argument("--steps", type=int, default=8, help="timed training steps per model (default 8)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-cudnn-benchmark", action="store_true", help="leave cudnn.benchmark False (timm sets True)")
    ap.add_argument("--sections", default="a,b,d,c,e,b2", help="sections to run, in this order (default "
                    "a,b,d,c,e,b2; also h: cptsim's graph/LM/CIFAR workloads and a ViT, time and NVML energy; "
                    "f: FP8 / int8 / FP16 GEMMs)")
    ap.add_argument("--models", default=None, help="timm models for section b, NAME:BATCH,... or 'held-out' (HELD_OUT) (default the list)")
    ap.add_argument("--formats", default="nchw,nhwc", help="memory formats of section b; all models run in the "
                    "first before any runs in the next")
    ap.add_argument("--no-flops", action="store_true", help="skip the FLOP count of each timm model")
    args = ap.parse_args()
    global SECTIONS
    SECTIONS = set(args.sections.split(","))
    R = Run(args)
    say(f"{VERSION}: budget {args.budget:.0f}s, device {args.device}, quick={args.quick}, out {args.out}")
    import numpy  # noqa: F401
    import torch
    R.res["meta"]["import_torch_s"] = round(time.perf_counter() - T0, 2)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        say("CUDA not available: nothing to measure on cuda")
        R.res["errors"].append({"item": "init", "error": "torch.cuda.is_available() is False"})
        R.flush()
        return 2
    torch.backends.cudnn.benchmark = not args.no_cudnn_benchmark
    Q = args.quick

    # planned minimum seconds of each section (full run on an H100); a section ends early enough to leave the
    # sections after it (in --sections order) their planned minimum
    plan = {"a": 8, "b": 150, "d": 12, "c": 70, "e": 22, "b2": 30, "h": 90, "f": 10} if not Q else \
        {"a": 2, "b": 20, "d": 5, "c": 20, "e": 6, "b2": 5, "h": 15, "f": 3}
    runners = {
        "a": ("a_device", lambda: (R.item("device_facts", 0.5, lambda: device_facts(R, torch, dev)),
                                   say(f"  {json.dumps(R.res['device'])[:600]}"))),
        "b": ("b_timm_amp", lambda: section_timm(R, torch, dev, args, precisions=["amp"])),
        "d": ("d_resnet20", lambda: section_resnet20(R, torch, dev, args)),
        "c": ("c_microbench", lambda: section_micro(R, torch, dev, args)),
        "e": ("e_energy", lambda: section_energy(R, torch, dev, args)),
        "b2": ("b2_timm_fp32", lambda: section_timm(R, torch, dev, args,
                                                    precisions=["fp32_default", "tf32", "fp32_strict"])),
        "h": ("h_workloads", lambda: section_workloads(R, torch, dev, args)),
        "f": ("f_fp8_gemm", lambda: section_fp8(R, torch, dev, args)),
    }
    order = [x for x in args.sections.split(",") if x]
    unknown = [x for x in order if x not in runners]
    if unknown:
        say(f"unknown sections {unknown}; known: {sorted(runners)}")
        return 2
    for i, key in enumerate(order):
        name, fn = runners[key]
        R.section(name, sum(plan[x] for x in order[i + 1:]))
        fn()
        R.end_section()

    R.res["meta"]["finished"] = True
    R.flush()
    say(f"done: {len(R.res['errors'])} errors, {len(R.res['skipped'])} skipped; wrote {args.out}")
    summary(R)
    return 0


# ------------------------------------------------------------------------------------------------------------------
# timing helpers and the GEMM / convolution microbenchmarks: one implementation, shared with `cptsim hw calibrate
# --device cuda` (cptsim.calibration.gpu_micro), so what calibrate fits on is what this script records
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # this checkout's cptsim
from cptsim.calibration.gpu_micro import Clock, bench, conv_item, gemm_item, graph_replay, sync  # noqa: E402


def device_facts(R, torch, dev):
    d = R.res["device"]
    d.update({"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
              "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
              "matmul_allow_tf32_default": torch.backends.cuda.matmul.allow_tf32,
              "cudnn_allow_tf32_default": torch.backends.cudnn.allow_tf32,
              "float32_matmul_precision": torch.get_float32_matmul_precision(),
              "cudnn_benchmark_used": torch.backends.cudnn.benchmark, "host": platform.node(),
              "cpu_count": os.cpu_count()})
    for k in ("fp32_precision",):
        try:
            d["cudnn_conv_fp32_precision"] = torch.backends.cudnn.conv.fp32_precision
            d["cuda_matmul_fp32_precision"] = torch.backends.cuda.matmul.fp32_precision
        except Exception:  # older/newer torch without the new API
            pass
    try:
        import timm
        d["timm"] = timm.__version__
    except Exception as e:
        d["timm"] = f"unavailable: {e}"
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        d.update({"name": p.name, "sm_count": p.multi_processor_count, "total_memory_bytes": p.total_memory,
                  "capability": f"{p.major}.{p.minor}"})
        for attr in ("L2_cache_size", "l2_cache_size", "max_threads_per_multi_processor", "regs_per_multiprocessor",
                     "shared_memory_per_multiprocessor", "clock_rate", "memory_clock_rate", "memory_bus_width"):
            if hasattr(p, attr):
                d[attr] = getattr(p, attr)
        try:
            q = ("name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit,"
                 "power.max_limit,power.draw,temperature.gpu,pstate,clocks_event_reasons.active")
            out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=10)
            if out.returncode != 0:  # an older driver may not know a field: retry with the basic ones
                q = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit"
                out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=10)
            d["nvidia_smi_query"] = q
            d["nvidia_smi"] = out.stdout.strip() or out.stderr.strip()[:300]
        except Exception as e:
            d["nvidia_smi"] = f"error: {e}"
    else:
        d["name"] = platform.processor() or "cpu"
        d["torch_threads"] = torch.get_num_threads()
    return None


# ------------------------------------------------------------------------------------------------------------------
TIMM_MODELS = [("resnet18", 512), ("resnet50", 256), ("resnet101", 256), ("resnext50_32x4d", 384),
               ("wide_resnet50_2", 384), ("densenet121", 256), ("efficientnet_b0", 384),
               ("mobilenetv3_large_100", 512), ("regnety_016", 512), ("convnext_tiny", 256),
               ("vit_small_patch16_224", 384), ("vit_base_patch16_224", 192), ("mixer_b16_224", 256)]
TIMM_QUICK = [("resnet18", 4), ("mobilenetv3_large_100", 4), ("vit_small_patch16_224", 4)]
FP32_MODELS = [("resnet50", 256), ("vit_base_patch16_224", 192)]
# networks no constant was fitted on (issue 23's held-out check on a lent GPU), one or two per family, at timm's
# RTX 3090 batch sizes; every one is profiled in benchmarks/data/timm/profiles-224.json.gz
HELD_OUT = [("swin_tiny_patch4_window7_224", 256), ("convnext_small", 192), ("densenet169", 256),
            ("efficientnet_b1", 256), ("ghostnet_130", 512), ("mixnet_s", 512), ("resnet50t", 384),
            ("regnetx_032", 384), ("resnext101_32x4d", 192), ("dla102", 256), ("gmlp_s16_224", 192),
            ("hrnet_w18", 256)]


def count_flops(torch, model, x):
    """Forward MACs and fwd+bwd FLOPs per sample (torch.utils.flop_counter; FP32, batch of x)."""
    from torch.utils.flop_counter import FlopCounterMode
    fc = FlopCounterMode(display=False)
    with fc:
        out = model(x)
        if isinstance(out, (tuple, list)):
            out = out[0]
        fwd = fc.get_total_flops()
        out.float().sum().backward()
        tot = fc.get_total_flops()
    model.zero_grad(set_to_none=True)
    n = x.shape[0]
    return {"fwd_macs_per_sample": fwd / 2 / n, "train_flops_per_sample": tot / n}


def timm_step_factory(torch, model, opt, scaler, x, y, precision, dev, clk, marks):
    import torch.nn.functional as F
    amp = precision == "amp"

    def step():
        m0 = clk.mark()
        opt.zero_grad(set_to_none=False)
        with torch.autocast(dev.type, dtype=torch.float16 if dev.type == "cuda" else torch.bfloat16, enabled=amp):
            out = model(x)
            if isinstance(out, (tuple, list)):
                out = out[0]
            loss = F.cross_entropy(out, y)
        m1 = clk.mark()
        scaler.scale(loss).backward() if scaler is not None else loss.backward()
        m2 = clk.mark()
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        m3 = clk.mark()
        marks.append((m0, m1, m2, m3))
    return step


def run_timm(R, torch, dev, args, name, batch, fmt, precision, model_cache):
    import timm
    Q = args.quick
    img = 64 if Q else 224
    kw = {"img_size": img} if (Q and (name.startswith("vit") or name.startswith("mixer"))) else {}
    rec = {"model": name, "format": fmt, "precision": precision, "batch_requested": batch, "img_size": img,
           "optimizer": "SGD(lr=1e-4, momentum=0.9, nesterov=True, wd=0, foreach default)",
           "zero_grad": "set_to_none=False", "grad_scaler": precision == "amp" and dev.type == "cuda",
           "cudnn_benchmark": torch.backends.cudnn.benchmark}
    if precision in ("fp32_default", "tf32", "fp32_strict"):
        mm, cd = {"fp32_default": (False, True), "tf32": (True, True), "fp32_strict": (False, False)}[precision]
        torch.backends.cuda.matmul.allow_tf32 = mm
        torch.backends.cudnn.allow_tf32 = cd
    rec["matmul_allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
    rec["cudnn_allow_tf32"] = torch.backends.cudnn.allow_tf32
    try:
        if name not in model_cache:
            model_cache.clear()
            t = time.perf_counter()
            m = timm.create_model(name, pretrained=False, **kw)
            m = m.to(dev).train()
            model_cache[name] = m
            rec["create_s"] = round(time.perf_counter() - t, 2)
            rec["param_count"] = sum(p.numel() for p in m.parameters())
            try:
                if (R.left() > 20 or Q) and not args.no_flops:
                    xf = torch.randn(2, 3, img, img, device=dev)
                    rec.update(count_flops(torch, m, xf))
            except Exception as e:
                rec["flops_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        model = model_cache[name]
        model = model.to(memory_format=torch.channels_last if fmt == "nhwc" else torch.contiguous_format)
        b = batch
        while b >= 1:
            marks = []
            try:
                x = torch.randn(b, 3, img, img, device=dev)
                if fmt == "nhwc":
                    x = x.contiguous(memory_format=torch.channels_last)
                y = torch.randint(0, 1000, (b,), device=dev)
                opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9, nesterov=True, weight_decay=0)
                scaler = torch.amp.GradScaler("cuda") if (precision == "amp" and dev.type == "cuda") else None
                clk = Clock(torch, dev)
                step = timm_step_factory(torch, model, opt, scaler, x, y, precision, dev, clk, marks)
                tw = time.perf_counter()
                for _ in range(args.warmup):
                    step()
                sync(torch, dev)
                rec["warmup_s"] = round(time.perf_counter() - tw, 3)
                one = (time.perf_counter() - tw) / max(1, args.warmup)
                n = args.steps if not Q else 2
                if R.left() < one * n + 1:
                    n = max(2, int((R.left() - 1) / max(one, 1e-3)))
                    rec["steps_cut_to_fit"] = True
                marks.clear()
                tt = time.perf_counter()
                for _ in range(n):
                    step()
                sync(torch, dev)
                wall = time.perf_counter() - tt
                break
            except torch.OutOfMemoryError:
                del marks
                opt = scaler = x = y = step = None  # noqa: F841
                model.zero_grad(set_to_none=True)
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
                say(f"  OOM at batch {b}, halving")
                rec.setdefault("oom_batches", []).append(b)
                b //= 2
        else:
            raise RuntimeError("OOM down to batch 1")
        st = [clk.ms(m0, m3) for (m0, m1, m2, m3) in marks]
        rec.update({"batch": b, "timed_steps": len(st), "step_ms_median": statistics.median(st),
                    "step_ms_all": [round(s, 3) for s in st],
                    "fwd_ms_median": statistics.median(clk.ms(a, b_) for (a, b_, _, _) in marks),
                    "bwd_ms_median": statistics.median(clk.ms(b_, c) for (_, b_, c, _) in marks),
                    "opt_ms_median": statistics.median(clk.ms(c, d) for (_, _, c, d) in marks),
                    "img_per_s_median": b / (statistics.median(st) / 1e3), "img_per_s_wall": b * len(st) / wall})
        if dev.type == "cuda":
            rec["max_mem_alloc_bytes"] = torch.cuda.max_memory_allocated(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        say(f"  {name:24s} {fmt} {precision:12s} b{b:4d}: {rec['img_per_s_median']:9.1f} img/s "
            f"(step {rec['step_ms_median']:.2f} ms; fwd {rec['fwd_ms_median']:.1f} bwd {rec['bwd_ms_median']:.1f} "
            f"opt {rec['opt_ms_median']:.1f})")
        return rec
    finally:
        torch.backends.cuda.matmul.allow_tf32 = R.res["device"].get("matmul_allow_tf32_default", False)
        torch.backends.cudnn.allow_tf32 = R.res["device"].get("cudnn_allow_tf32_default", True)


def section_timm(R, torch, dev, args, precisions):
    models = TIMM_QUICK if args.quick else (TIMM_MODELS if precisions == ["amp"] else FP32_MODELS)
    if args.models == "held-out" and precisions == ["amp"] and not args.quick:
        models = HELD_OUT
    elif args.models and precisions == ["amp"]:
        models = [(m.split(":")[0], int(m.split(":")[1])) for m in args.models.split(",")]
    fmts = args.formats.split(",") if precisions == ["amp"] else ["nchw"]
    cache = {}
    est = 2.0 if args.quick else 5.0
    for fmt in fmts:  # every model in one format before the next: a cut-off run still has one whole table
        for name, batch in models:
            for prec in precisions:
                r = R.item(f"timm:{name}:{fmt}:{prec}", est,
                           lambda: run_timm(R, torch, dev, args, name, batch, fmt, prec, cache),
                           dest=R.res["timm_train"], limit_s=60)
                if r is not None:  # next item of similar size: keep est near the largest seen
                    est = max(2.0 if args.quick else 4.0, min(20.0, 0.8 * r["wall_s"]))
            if dev.type == "cuda":
                cache.clear()
                torch.cuda.empty_cache()
    cache.clear()


# ------------------------------------------------------------------------------------------------------------------
def cifar_resnet20(torch):
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.sc = None
            if stride != 1 or cin != cout:
                self.sc = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            o = F.relu(self.b1(self.c1(x)))
            o = self.b2(self.c2(o))
            return F.relu(o + (x if self.sc is None else self.sc(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
            self.bn = nn.BatchNorm2d(16)
            layers, cin = [], 16
            for cout, stride in ((16, 1), (32, 2), (64, 2)):
                for i in range(3):
                    layers.append(Block(cin, cout, stride if i == 0 else 1))
                    cin = cout
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(64, 10)

        def forward(self, x):
            x = self.layers(F.relu(self.bn(self.conv(x))))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
    return Net()


def run_resnet20(R, torch, dev, args, graphed, cudnn_bench):
    import torch.nn.functional as F
    src = "cptsim.models.create_model('resnet20', num_classes=10, in_channels=3)"
    try:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        from cptsim.models import create_model
        net = create_model("resnet20", num_classes=10, in_channels=3)
    except Exception as e:
        src = f"local CIFAR ResNet-20 (cptsim import failed: {type(e).__name__}: {str(e)[:150]})"
        net = cifar_resnet20(torch)
    old = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = cudnn_bench
    try:
        net = net.to(dev).train()
        B = 8 if args.quick else 128
        x = torch.randn(B, 3, 32, 32, device=dev)
        y = torch.randint(0, 10, (B,), device=dev)
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)

        def step():
            opt.zero_grad(set_to_none=False)
            F.cross_entropy(net(x), y).backward()
            opt.step()

        n_warm, n = (2, 3) if args.quick else (5, 40)
        rec = {"model_source": src, "batch": B, "precision": "fp32 (cudnn allow_tf32 default)",
               "graphed": graphed, "cudnn_benchmark": cudnn_bench,
               "optimizer": "SGD(lr=0.01, momentum=0.9, wd=5e-4), zero_grad(set_to_none=False)",
               "params": sum(p.numel() for p in net.parameters())}
        if graphed and dev.type == "cuda":
            run = graph_replay(torch, step, n_warm)
        else:
            if graphed:
                rec["note"] = "CUDA graphs need cuda: ran eager"
            run = step
            for _ in range(n_warm):
                run()
        sync(torch, dev)
        clk = Clock(torch, dev)
        ts, hs = [], []
        for _ in range(n):
            h = time.perf_counter()
            a = clk.mark()
            run()
            b = clk.mark()
            hs.append((time.perf_counter() - h) * 1e3)
            ts.append(clk.ms(a, b))   # syncs each step, as a loss read each step would
        tw = time.perf_counter()
        for _ in range(n):
            run()
        sync(torch, dev)
        rec.update({"step_ms_median": statistics.median(ts), "step_ms_min": min(ts),
                    "host_enqueue_ms_median": statistics.median(hs),
                    "step_ms_back_to_back": (time.perf_counter() - tw) * 1e3 / n, "steps": n})
        say(f"  resnet20 b{B} fp32 graphed={graphed} cudnn.benchmark={cudnn_bench}: median {rec['step_ms_median']:.3f} ms"
            f" (back-to-back {rec['step_ms_back_to_back']:.3f} ms, host enqueue {rec['host_enqueue_ms_median']:.3f} ms)")
        return rec
    finally:
        torch.backends.cudnn.benchmark = old


def section_resnet20(R, torch, dev, args):
    for graphed in (False, True):
        for cb in (False, True):
            R.item(f"resnet20:graphed={graphed}:cudnn_benchmark={cb}", 2.0,
                   lambda: run_resnet20(R, torch, dev, args, graphed, cb), dest=R.res["resnet20"], limit_s=30)


# ------------------------------------------------------------------------------------------------------------------
GEMM_SHAPES = [(s, s, s) for s in (64, 128, 256, 512, 1024, 2048, 4096, 8192)] + [
    (1000, 1000, 1000), (3000, 3000, 3000), (4097, 4097, 4097), (777, 1234, 999),
    (37824, 768, 768), (37824, 2304, 768), (37824, 3072, 768), (37824, 768, 3072),      # ViT-B/16 b192 tokens
    (8192, 64, 8192), (64, 8192, 8192), (8192, 8192, 64), (16, 4096, 4096), (512, 4096, 4096),
    (128, 1000, 2048), (256, 1000, 2048), (128, 10, 64), (32768, 64, 64),
    (131072, 16, 144), (131072, 64, 576), (196608, 384, 196), (768, 768, 37824)]       # im2col-like, mixer, wgrad
GEMM_QUICK = [(64, 64, 64), (128, 96, 72), (100, 10, 64)]

# (N, C, H, W, K, R, stride, pad, groups, label)
CONV_SHAPES = [
    (128, 3, 32, 32, 16, 3, 1, 1, 1, "cifar_stem"), (128, 16, 32, 32, 16, 3, 1, 1, 1, "cifar_s1"),
    (128, 32, 16, 16, 32, 3, 1, 1, 1, "cifar_s2"), (128, 64, 8, 8, 64, 3, 1, 1, 1, "cifar_s3"),
    (128, 16, 32, 32, 32, 3, 2, 1, 1, "cifar_down"),
    (128, 3, 224, 224, 64, 7, 2, 3, 1, "r50_stem7x7"), (128, 256, 56, 56, 64, 1, 1, 0, 1, "r50_res2_1x1_reduce"),
    (128, 64, 56, 56, 64, 3, 1, 1, 1, "r50_res2_3x3"), (128, 64, 56, 56, 256, 1, 1, 0, 1, "r50_res2_1x1_expand"),
    (128, 128, 28, 28, 128, 3, 1, 1, 1, "r50_res3_3x3"), (128, 256, 14, 14, 256, 3, 1, 1, 1, "r50_res4_3x3"),
    (128, 512, 7, 7, 512, 3, 1, 1, 1, "r50_res5_3x3"), (128, 1024, 14, 14, 256, 1, 1, 0, 1, "r50_res4_1x1"),
    (128, 128, 56, 56, 128, 3, 2, 1, 1, "r50_3x3_stride2"),
    (128, 96, 56, 56, 96, 3, 1, 1, 96, "dw3x3_56"), (128, 384, 14, 14, 384, 3, 1, 1, 384, "dw3x3_14"),
    (128, 96, 56, 56, 96, 7, 1, 3, 96, "dw7x7_convnext"), (128, 128, 56, 56, 128, 3, 1, 1, 32, "grouped32_resnext_56"),
    (128, 512, 14, 14, 512, 3, 1, 1, 32, "grouped32_resnext_14")]
CONV_QUICK = [(2, 16, 8, 8, 16, 3, 1, 1, 1, "q3x3"), (2, 8, 8, 8, 8, 3, 1, 1, 8, "qdw")]


def membw_items(torch, dev, n, dt):
    """(name, fn, nominal_bytes) for memory-bound ops on n elements of dtype dt."""
    import torch.nn.functional as F
    dtype = {"fp16": torch.float16, "fp32": torch.float32}[dt]
    if dev.type == "cpu" and dtype == torch.float16:
        dtype = torch.bfloat16
    e = torch.tensor([], dtype=dtype).element_size()
    x = torch.randn(n, device=dev, dtype=dtype)
    y = torch.randn(n, device=dev, dtype=dtype)
    out = torch.empty_like(x)
    items = [("copy", lambda: out.copy_(x), 2 * n * e), ("add", lambda: torch.add(x, y, out=out), 3 * n * e),
             ("mul", lambda: torch.mul(x, y, out=out), 3 * n * e), ("relu", lambda: torch.relu(x), 2 * n * e),
             ("relu_", lambda: out.relu_(), 2 * n * e), ("gelu", lambda: F.gelu(x), 2 * n * e),
             ("sum", lambda: x.sum(), n * e)]
    C = 64
    hw = max(1, n // (C * 32))
    side = max(1, int(math.sqrt(hw)))
    B4 = max(2, n // (C * side * side))
    x4 = torch.randn(B4, C, side, side, device=dev, dtype=dtype, requires_grad=True)
    n4 = x4.numel()
    wgt = torch.ones(C, device=dev, dtype=dtype, requires_grad=True)
    bia = torch.zeros(C, device=dev, dtype=dtype, requires_grad=True)
    rm, rv = torch.zeros(C, device=dev, dtype=dtype), torch.ones(C, device=dev, dtype=dtype)
    def bn_fwd():
        with torch.no_grad():
            return F.batch_norm(x4, rm, rv, wgt, bia, True)
    items.append(("batch_norm_fwd_train", bn_fwd, 2 * n4 * e))
    yb = F.batch_norm(x4, rm, rv, wgt, bia, True)
    gb = torch.randn_like(yb)
    items.append(("batch_norm_fwd_bwd_train",
                  lambda: torch.autograd.grad(F.batch_norm(x4, rm, rv, wgt, bia, True), (x4, wgt, bia), gb),
                  5 * n4 * e))
    xp = x[: max(1, n // 49) * 49].view(1, -1, 7, 7)
    items.append(("adaptive_avg_pool_7to1", lambda: F.adaptive_avg_pool2d(xp, 1), xp.numel() * e))
    D = 768
    rows = max(1, n // D)
    x2 = x[: rows * D].view(rows, D)
    lw, lb = torch.ones(D, device=dev, dtype=dtype), torch.zeros(D, device=dev, dtype=dtype)
    items.append(("layer_norm_fwd", lambda: F.layer_norm(x2, (D,), lw, lb), 2 * rows * D * e))
    xs = x[: (n // 1024) * 1024].view(-1, 1024) if n >= 1024 else x.view(1, -1)
    items.append(("softmax_fwd", lambda: torch.softmax(xs, -1), 2 * xs.numel() * e))
    # SGD momentum + wd over 160 fp32 tensors totalling n (ResNet-50 has 161 parameter tensors)
    if dt == "fp32":
        nt = 160
        ps = [torch.randn(max(1, n // nt), device=dev, requires_grad=True) for _ in range(nt)]
        for p in ps:
            p.grad = torch.randn_like(p)
        tot = sum(p.numel() for p in ps)
        for mode in ("foreach", "forloop", "fused"):
            try:
                kw = {"foreach": mode == "foreach"} if mode != "fused" else {"fused": True}
                o = torch.optim.SGD(ps, lr=1e-3, momentum=0.9, weight_decay=1e-4, **kw)
                o.step()
                items.append((f"sgd_momentum_{mode}_160t", o.step, 5 * tot * 4))  # read p,g,buf; write p,buf
            except Exception:
                pass
    return items


def section_micro(R, torch, dev, args):
    Q = args.quick
    cuda = dev.type == "cuda"
    # -- launch overhead
    def launch():
        t = torch.zeros(1, device=dev)
        nk = 200 if Q else 2000
        for _ in range(20):
            t.add_(1)
        sync(torch, dev)
        h = time.perf_counter()
        for _ in range(nk):
            t.add_(1)
        host = time.perf_counter() - h
        sync(torch, dev)
        total = time.perf_counter() - h
        rec = {"kernels": nk, "eager_host_us_per_kernel": host / nk * 1e6, "eager_total_us_per_kernel": total / nk * 1e6}
        h = time.perf_counter()
        for _ in range(50):
            sync(torch, dev)
        rec["sync_roundtrip_us"] = (time.perf_counter() - h) / 50 * 1e6
        if cuda:
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                t.add_(1)
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(g):
                for _ in range(nk):
                    t.add_(1)
            g.replay()
            sync(torch, dev)
            clk = Clock(torch, dev)
            ts = []
            for _ in range(5):
                a = clk.mark()
                g.replay()
                b = clk.mark()
                ts.append(clk.ms(a, b))
            rec["graph_us_per_kernel"] = statistics.median(ts) * 1e3 / nk
            h = time.perf_counter()
            g.replay()
            rec["graph_replay_host_us"] = (time.perf_counter() - h) * 1e6
            sync(torch, dev)
            # eager GPU-side time per kernel (event-timed, host-bound if dispatch is slower than the kernel)
            a = clk.mark()
            for _ in range(nk):
                t.add_(1)
            b = clk.mark()
            rec["eager_gpu_us_per_kernel"] = clk.ms(a, b) * 1e3 / nk
        say(f"  launch: {json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in rec.items()})}")
        return rec
    R.item("launch_overhead", 1.0, launch, dest=R.res["launch"], limit_s=20)

    # -- GEMMs: fp16/bf16 first, then tf32, fp32, int8
    shapes = GEMM_QUICK if Q else GEMM_SHAPES
    for dt in ("fp16", "bf16", "tf32", "fp32", "int8"):
        if dt == "int8" and not cuda:
            R.res["skipped"].append({"item": "gemm:int8", "why": "torch._int_mm needs CUDA"})
            continue
        n_ok = 0
        t = time.perf_counter()
        for (M, N, K) in shapes:
            est = 0.05 if Q else (0.5 if max(M, N, K) >= 8192 and dt in ("fp32",) else 0.15)
            r = R.item(f"gemm:{dt}:{M}x{N}x{K}", est, lambda: gemm_item(torch, dev, M, N, K, dt),
                       dest=R.res["gemm"], limit_s=10)
            n_ok += r is not None
        best = max((g["tflops"] for g in R.res["gemm"] if g["dtype"] == dt), default=0)
        say(f"  gemm {dt}: {n_ok}/{len(shapes)} shapes in {time.perf_counter() - t:.1f}s, best {best:.1f} TFLOPS")

    # -- memory-bound ops (before fp32 convs: cheaper and needed for every network)
    def conv_block(dt):
        t = time.perf_counter()
        n_ok = 0
        for fmt in ("nchw", "nhwc"):
            for sh in (CONV_QUICK if Q else CONV_SHAPES):
                r = R.item(f"conv:{dt}:{fmt}:{sh[-1]}", 0.1 if Q else 0.8, lambda: conv_item(torch, dev, sh, dt, fmt),
                           dest=R.res["conv"], limit_s=15)
                n_ok += r is not None
                if r is not None and not Q:
                    say(f"    conv {dt} {fmt} {sh[-1]:22s} fwd {r.get('fwd_ms', float('nan')):7.3f} ms "
                        f"dgrad {r.get('dgrad_ms', float('nan')):7.3f} wgrad {r.get('wgrad_ms', float('nan')):7.3f}"
                        f"  ({r.get('fwd_tmacs', 0):.1f} TMAC/s fwd)")
        say(f"  conv {dt}: {n_ok} items in {time.perf_counter() - t:.1f}s")

    conv_block("fp16")
    sizes = (10_000, 100_000) if Q else (100_000, 1_000_000, 10_000_000, 100_000_000)
    t = time.perf_counter()
    for dt in ("fp32", "fp16"):
        for n in sizes:
            def one(n=n, dt=dt):
                recs = []
                for name, fn, nbytes in membw_items(torch, dev, n, dt):
                    try:
                        r = bench(torch, dev, fn, reps=5, target_ms=0.5)
                        recs.append({"op": name, "n": n, "dtype": dt, "nominal_bytes": nbytes, **r, "cpu_bf16": dev.type == "cpu" and dt == "fp16",
                                     "gb_per_s": nbytes / (r["ms"] * 1e-3) / 1e9})
                    except Exception as e:
                        recs.append({"op": name, "n": n, "dtype": dt, "error": f"{type(e).__name__}: {str(e)[:200]}"})
                R.res["membw"].extend(recs)
                return {"n": n, "dtype": dt, "ops": len(recs)}
            R.item(f"membw:{dt}:{n}", 0.2 if Q else (3.0 if n >= 10**8 else 1.0), one, limit_s=30)
        if cuda:
            torch.cuda.empty_cache()
    big = [m for m in R.res["membw"] if m.get("n") == max(sizes) and "gb_per_s" in m]
    say(f"  membw: {len(R.res['membw'])} op-size points in {time.perf_counter() - t:.1f}s; at n={max(sizes)}: " +
        ", ".join(f"{m['op']}/{m['dtype']} {m['gb_per_s']:.0f}" for m in big[:20]) + " GB/s")
    conv_block("fp32")


# ------------------------------------------------------------------------------------------------------------------
def section_energy(R, torch, dev, args):
    E = R.res["energy"]
    if dev.type != "cuda":
        E["skipped"] = "NVML needs cuda"
    nv = h = None
    if dev.type == "cuda":
        try:
            import pynvml as nv
            nv.nvmlInit()
            h = nv.nvmlDeviceGetHandleByIndex(dev.index or 0)
            E["power_limit_w"] = nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3
        except Exception as e:
            E["nvml_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            nv = None

    def energy_mj():
        return nv.nvmlDeviceGetTotalEnergyConsumption(h) if nv else None

    def idle():
        sync(torch, dev)
        dur = 0.5 if args.quick else 2.0
        e0, t0 = energy_mj(), time.perf_counter()
        samples = []
        while time.perf_counter() - t0 < dur:
            if nv:
                samples.append(nv.nvmlDeviceGetPowerUsage(h) / 1e3)
            time.sleep(0.1)
        e1, t1 = energy_mj(), time.perf_counter()
        rec = {"seconds": t1 - t0, "power_samples_w": samples}
        if e0 is not None:
            rec["joules"] = (e1 - e0) / 1e3
            rec["mean_power_w"] = rec["joules"] / (t1 - t0)
        E["idle"] = rec
        say(f"  idle: {rec.get('mean_power_w', 'n/a')} W")
        return rec
    R.item("energy:idle", 1.0 if args.quick else 2.5, idle, limit_s=10)

    def loop():
        import timm
        import torch.nn.functional as F
        name, B = ("resnet18", 4) if args.quick else ("resnet50", 256)
        img = 64 if args.quick else 224
        m = timm.create_model(name, pretrained=False).to(dev).train()
        x = torch.randn(B, 3, img, img, device=dev)
        y = torch.randint(0, 1000, (B,), device=dev)
        opt = torch.optim.SGD(m.parameters(), lr=1e-4, momentum=0.9, nesterov=True)
        scaler = torch.amp.GradScaler("cuda") if dev.type == "cuda" else None
        adt = torch.float16 if dev.type == "cuda" else torch.bfloat16

        def step():
            opt.zero_grad(set_to_none=False)
            with torch.autocast(dev.type, dtype=adt):
                loss = F.cross_entropy(m(x), y)
            if scaler:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
        for _ in range(3):
            step()
        sync(torch, dev)
        dur = 1.0 if args.quick else min(15.0, max(3.0, R.left() - 4.0))
        e0, t0 = energy_mj(), time.perf_counter()
        n, samples, last = 0, [], t0
        while time.perf_counter() - t0 < dur:
            step()
            n += 1
            if nv and time.perf_counter() - last > 0.25:
                sync(torch, dev)
                samples.append(nv.nvmlDeviceGetPowerUsage(h) / 1e3)
                last = time.perf_counter()
        sync(torch, dev)
        e1, t1 = energy_mj(), time.perf_counter()
        rec = {"model": name, "batch": B, "format": "nchw", "precision": "amp", "steps": n, "seconds": t1 - t0,
               "step_ms_mean": (t1 - t0) / n * 1e3, "power_samples_w": samples}
        if e0 is not None:
            rec["joules"] = (e1 - e0) / 1e3
            rec["joules_per_step"] = rec["joules"] / n
            rec["mean_power_w"] = rec["joules"] / (t1 - t0)
        E["train_loop"] = rec
        say(f"  energy loop {name} b{B}: {n} steps in {t1 - t0:.1f}s, {rec.get('joules_per_step', 'n/a')} J/step, "
            f"{rec.get('mean_power_w', 'n/a')} W")
        return rec
    R.item("energy:train_loop", 2.0 if args.quick else 8.0, loop, limit_s=40)


# ------------------------------------------------------------------------------------------------------------------
# h. cptsim's own workloads (graph, language, CIFAR) and a timm ViT: step time AND NVML energy per step, FP32 and
# AMP -- networks and energies no constant was fitted on (the held-out check of issue 23 items 4 and 6)
WORKLOADS = [
    # (key, model, dataset-ish input, num_classes, batch, optimizer, precisions, graphed)
    ("gcn-arxiv", "gcn", "synthetic-graph:169343,128,40:14", 40, 1, "adam", ("fp32", "amp"), False),
    ("sage-arxiv", "sage", "synthetic-graph:169343,128,40:14", 40, 1, "adam", ("fp32",), False),
    ("gat-arxiv", "gat", "synthetic-graph:169343,128,40:14", 40, 1, "adam", ("fp32",), False),
    ("transformer-lm-6x512", "transformer-lm:layers=6,width=512,heads=8,context=256", (256,), 10000, 64, "adamw",
     ("fp32", "amp"), False),
    ("lstm-lm-2x650", "lstm-lm:layers=2,hidden=650", (35,), 10000, 128, "sgd", ("fp32", "amp"), False),
    ("resnet20-cifar", "resnet20", (3, 32, 32), 10, 128, "sgd", ("fp32",), True),
    ("timm:vit_small_patch16_224", "timm:vit_small_patch16_224", (3, 224, 224), 1000, 256, "sgd", ("amp",), False),
]
WORKLOADS_QUICK = [
    ("gcn-small", "gcn", "synthetic-graph:2000,16,5:4", 5, 1, "adam", ("fp32",), False),
    ("transformer-lm-tiny", "transformer-lm:layers=1,width=32,heads=2,context=16", (16,), 50, 4, "adamw", ("fp32",),
     False),
    ("resnet20-cifar", "resnet20", (3, 32, 32), 10, 4, "sgd", ("fp32",), False),
]


_GRAPHS: dict = {}


def _workload(torch, dev, w):
    """(model, x, y, input description) of one WORKLOADS entry, on dev."""
    from cptsim.models import create_model

    key, model, data, ncls, batch = w[:5]
    if isinstance(data, str):  # a graph: the whole graph is one sample, trained full batch
        from cptsim.models.graph import bind_graph

        if data not in _GRAPHS:  # generated once (seconds at arxiv's size), shared by gcn / sage / gat
            from cptsim.data import load_datasets
            _GRAPHS[data] = load_datasets(data, None)
        train_set, _, info = _GRAPHS[data]
        x, y = train_set.gather([0], "cpu")
        net = create_model(model, num_classes=info.num_classes, in_channels=info.input_shape[0],
                           input_shape=tuple(info.input_shape))
        bind_graph(net, train_set.graph.edge_index)
        desc = {"dataset": data, "input_shape": list(info.input_shape), "graph_edges": info.graph_edges}
        return net.to(dev), x.to(dev), y.to(dev), desc
    shape = tuple(data)
    net = create_model(model, num_classes=ncls, in_channels=shape[0] if len(shape) == 3 else 1, input_shape=shape)
    if len(shape) == 1:  # token ids; next-token labels
        x = torch.randint(ncls, (batch, shape[0]), device=dev)
        y = torch.randint(ncls, (batch, shape[0]), device=dev)
    else:
        x = torch.randn(batch, *shape, device=dev)
        y = torch.randint(ncls, (batch,), device=dev)
    return net.to(dev), x, y, {"input_shape": list(shape)}


def workload_train_step(torch, dev, w, precision):
    """(step, net, input description) of one WORKLOADS entry on dev: one SGD/Adam/AdamW training step with cptsim's
    training loss, AMP (fp16 autocast + GradScaler on CUDA) when ``precision`` is "amp". benchmarks/gpu/gpu_optrace.py
    traces the same step."""
    from cptsim.models.loss import class_cross_entropy

    optname = w[5]
    net, x, y, desc = _workload(torch, dev, w)
    net.train()
    opt = {"adam": lambda p: torch.optim.Adam(p, lr=1e-3), "adamw": lambda p: torch.optim.AdamW(p, lr=1e-4),
           "sgd": lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9)}[optname](net.parameters())

    def loss_of():
        # cptsim's training loss (over rows: cptsim.models.loss); before the fourth session this was
        # F.cross_entropy(out.float(), y), whose strided softmax took 40% of transformer-lm's AMP step
        return class_cross_entropy(net(x).float(), y)

    return train_step(torch, dev, opt, precision == "amp", loss_of), net, desc


def train_step(torch, dev, opt, amp: bool, loss_of):
    """One training step of ``loss_of()`` with ``opt``: under autocast when ``amp`` (fp16 with a GradScaler on CUDA,
    bf16 elsewhere), else FP32. benchmarks/gpu/gpu_optrace.py builds its steps with it too."""
    scaler = torch.amp.GradScaler("cuda") if (amp and dev.type == "cuda") else None

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast(dev.type, dtype=torch.float16 if dev.type == "cuda" else torch.bfloat16, enabled=amp):
            loss = loss_of()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()

    return step


def run_workload(R, torch, dev, args, w, precision, nv, h):
    key, model, data, ncls, batch, optname, _, graphed = w
    amp = precision == "amp"
    step, net, desc = workload_train_step(torch, dev, w, precision)

    run = step
    rec = {"workload": key, "model": model, "batch": batch, "num_classes": ncls, "optimizer": optname,
           "precision": precision, "graphed": False, **desc,
           "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32, "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
           "params": sum(p.numel() for p in net.parameters())}
    if graphed and dev.type == "cuda" and not amp:
        run = graph_replay(torch, step)
        rec["graphed"] = True
    for _ in range(3):
        run()
    sync(torch, dev)
    clk = Clock(torch, dev)
    ts = []
    for _ in range(2 if args.quick else 10):
        a = clk.mark()
        run()
        b = clk.mark()
        ts.append(clk.ms(a, b))
    rec["step_ms_median"] = statistics.median(ts)
    rec["step_ms_all"] = [round(t, 3) for t in ts]
    # energy: back-to-back steps for a few seconds (the counter's resolution wants > 1 s)
    if nv is not None:
        dur = 1.0 if args.quick else 3.0
        sync(torch, dev)
        e0, t0, n = nv.nvmlDeviceGetTotalEnergyConsumption(h), time.perf_counter(), 0
        while time.perf_counter() - t0 < dur or n < 3:
            run()
            n += 1
        sync(torch, dev)
        e1, t1 = nv.nvmlDeviceGetTotalEnergyConsumption(h), time.perf_counter()
        rec.update({"energy_steps": n, "energy_seconds": t1 - t0, "step_ms_back_to_back": (t1 - t0) / n * 1e3,
                    "joules_per_step": (e1 - e0) / 1e3 / n, "mean_power_w": (e1 - e0) / 1e3 / (t1 - t0)})
    if dev.type == "cuda":
        rec["max_mem_alloc_bytes"] = torch.cuda.max_memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    say(f"  {key:28s} {precision:4s} b{batch:<4d} step {rec['step_ms_median']:8.3f} ms"
        + (f"  {rec['joules_per_step']:.3f} J/step, {rec['mean_power_w']:.0f} W" if "joules_per_step" in rec else "")
        + (" (graphed)" if rec["graphed"] else ""))
    return rec


def section_workloads(R, torch, dev, args):
    nv = h = None
    if dev.type == "cuda":
        try:
            import pynvml as nv
            nv.nvmlInit()
            h = nv.nvmlDeviceGetHandleByIndex(dev.index or 0)
        except Exception as e:
            R.res["errors"].append({"item": "workloads:nvml", "error": f"{type(e).__name__}: {str(e)[:200]}"})
            nv = None
    pick = os.environ.get("GPU_MEASURE_WORKLOADS")  # KEY:PREC,... to rerun some (e.g. ones a cut-off run skipped)
    for w in (WORKLOADS_QUICK if args.quick else WORKLOADS):
        for prec in w[6]:
            if pick and f"{w[0]}:{prec}" not in pick.split(","):
                continue
            R.item(f"workload:{w[0]}:{prec}", 2.0 if args.quick else 8.0,
                   lambda: run_workload(R, torch, dev, args, w, prec, nv, h), dest=R.res["workloads"], limit_s=60)
        if dev.type == "cuda":
            torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------------------------
# f. FP8 (e4m3 x e4m3 -> bf16, torch._scaled_mm) and int8 GEMMs beside FP16 on the same shapes: the 8-bit tiers a
# GPU reaches through torch (issue 26's format tiers)
FP8_SHAPES = [(s, s, s) for s in (1024, 2048, 4096, 8192)] + [(37824, 768, 768), (37824, 3072, 768),
                                                               (16384, 4096, 4096), (4096, 16384, 4096)]


def section_fp8(R, torch, dev, args):
    shapes = [(64, 64, 64)] if args.quick else FP8_SHAPES
    for dt in ("fp8", "int8", "fp16"):
        if dt in ("fp8", "int8") and dev.type != "cuda":
            continue
        for (M, N, K) in shapes:
            r = R.item(f"fp8:{dt}:{M}x{N}x{K}", 0.2, lambda: gemm_item(torch, dev, M, N, K, dt), dest=R.res["fp8"],
                       limit_s=10)
            if r is not None and max(M, N, K) >= 8192:
                say(f"  {dt} {M}x{N}x{K}: {r['tflops']:.0f} TFLOPS")



def summary(R):
    say("summary: timm training img/s (median step)")
    for r in R.res["timm_train"]:
        say(f"  {r['model']:24s} {r['format']} {r['precision']:12s} b{r.get('batch', 0):4d} "
            f"{r.get('img_per_s_median', float('nan')):9.1f}")
    for r in R.res["resnet20"]:
        say(f"  resnet20 graphed={r['graphed']} cudnn.benchmark={r['cudnn_benchmark']}: {r['step_ms_median']:.3f} ms")


if __name__ == "__main__":
    sys.exit(main())

"""Fit the GPU shape model's constants from shipped measurements and check them where the fit did not look (issue 23).

Everything it reads ships with the repository, so the fit is re-run in a test (tests/test_gpu_fit.py) and fails
there if it drifts from the constants in hw_profiles/*.toml:

* Ampere (hw_profiles/rtx3090.toml, and gpu_kernels.DEFAULTS for a GPU described only by its datasheet): every
  constant fitted on timm's published RTX 3090 AMP training tables, NCHW and NHWC (benchmarks/data/timm), the
  networks profiled once by benchmarks/gpu/gpu_zoo_profiles.py; checked by leaving one family out (--lofo).
* Hopper (hw_profiles/h100.toml, h200.toml): the tiers' large-GEMM efficiencies are our H100's measured 8192^3
  GEMMs; the depthwise constants fitted on its depthwise-conv microbenchmarks; the NCHW layout-transform passes
  (``nchw_transform_bytes``) fitted per call on its traced convolutions (benchmarks/results/gpu-optrace-H100, each
  network left out in turn, and checked on its convolution microbenchmarks); the channel padding of narrow
  convolutions (``conv_n_tile``: the most common output-channel tile of the traced cuDNN kernels;
  ``conv_k_tile_bytes``: one MMA instruction's depth), checked per traced call with each network left out; then the
  NCHW factor and the achieved memory bandwidth fitted on its timm training runs
  (benchmarks/results/gpu-shape-model-H100-run*.json); the shape constants n0, k0 are Ampere's (one physics, not
  refitted on 24 rows).
* The GPU time per counted launch (``kernel_overhead_us``, every NVIDIA profile): a kernel's device-time floor
  measured on thousands of traced element-wise kernels x the kernels a counted launch really starts, from the same
  traces -- measured per kernel before any network fit, never closed on one network's step.
* Checks: the H100 predicted from its datasheet with Ampere's constants (what a user gets for a GPU nobody
  measured), CIFAR ResNet-20 at batch 128 (H100 measured here; H200 measured in benchmarks/results/
  gpu_check_H200_run3.txt) graphed and eager.

    python benchmarks/gpu/fit_gpu_model.py             # fits and checks, prints the TOML lines and the tables
    python benchmarks/gpu/fit_gpu_model.py --lofo      # also leave-one-family-out on the RTX 3090 tables (minutes)
    python benchmarks/gpu/fit_gpu_model.py --json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gpu_zoo_profiles import (HERE as _H, family, has_fused_attention, load_profiles, pt112_profiles,  # noqa: E402
                              table_rows)

from cptsim.calibration import gpu_fit as F  # noqa: E402

NHWC_TABLE = _H.parent / "data" / "timm" / "benchmark-train-amp-nhwc-pt112-cu113-rtx3090.csv"
H100_RUNS = [HERE.parent / "results" / f"gpu-shape-model-H100-run{i}.json" for i in (1, 2, 3)]
SHAPE_FIT = ("gemm_n0", "gemm_k0")  # on the H100's GEMM microbenchmarks: one tile physics for both generations
# nchw_norm_elements_per_clock is no longer fitted: since batch norms with recorded shapes are priced by shape in a
# 16-bit step (the AMP tables' and our runs'), these rows barely move it (a free fit wandered to 8.6), yet it still
# prices 32-bit steps' norms and op lists without shapes. It keeps the values fitted when it priced every NCHW norm:
# 1.17 (Ampere), 1.371 (Hopper).
AMPERE_FIT = ("tier:fp16", "nchw_conv_factor", "nchw_depthwise_factor", "depthwise_efficiency",
              "depthwise_memory_efficiency", "memory_efficiency", "norm_memory_efficiency")
HOPPER_DEPTHWISE = ("nchw_depthwise_factor", "depthwise_efficiency", "depthwise_memory_efficiency")
HOPPER_NETWORK = ("nchw_conv_factor", "memory_efficiency", "norm_memory_efficiency")
# GPUs described by their datasheet alone (peaks, SM count, boost clock): Ampere's fitted constants, i.e.
# gpu_kernels.DEFAULTS, and its fitted tier efficiency and memory efficiency, written into their files by --write;
# benchmarks/gpu/bench_gpu_datasheet.py checks them on published ResNet-50 training throughput
DATASHEET = ("a100", "v100", "t4", "rtx4090")
# GPUs priced on the per-tier roofline (no SM count in their sources): Ampere's memory efficiency; the NVIDIA ones
# NVIDIA's measured launch time too (MI300X's ROCm launch floor is not measured: its file says what it assumes)
ROOFLINE = ("b200", "l40s", "mi300x")
NVIDIA_ROOFLINE = ("b200", "l40s")
# Streaming ops (copy, add, activations) reach 0.87 of the H100's HBM3 peak at 1e8 elements (2927 of 3350 GB/s,
# benchmarks/results/gpu-shape-model-H100-run1.json), but a network's memory-bound ops -- small tensors, strided
# copies, reductions -- reach less: memory_efficiency is fitted, from this start.
STREAM_EFFICIENCY = 0.87
# gpu_kernels.DEFAULTS' NCHW batch-norm constants are not fitted on throughput: measured per kernel on the lent H100
# (benchmarks/gpu/bench_gpu_optrace.py --fit), the same cuDNN kernels per SM and clock on every generation; --write
# keeps this comment above them
ROWS_COMMENT = """    # NCHW batch norm by its shape (nchw_batch_norm_seconds): measured per kernel on an H100 (366 cuDNN batch-norm
    # calls of 7 networks in benchmarks/results/gpu-optrace-H100/trace-*-nchw; bench_gpu_optrace.py)"""
TRANSFORM_COMMENT = ("    # NCHW spatial convolutions' layout transforms: not measured on Ampere "
                     "(its fitted nchw_conv_factor stands for them)")
PADDING_COMMENT = ("    # narrow convolutions' channel padding (conv_padding): off on Ampere, whose constants were fitted "
                   "without it")
# measured resnet20 (CIFAR), batch 128, FP32 steps: (GPU, graphed ms, eager ms, where)
RESNET20 = [("h100", 5.03, 11.08, "benchmarks/results/gpu-shape-model-H100-run1.json (cudnn.benchmark on)"),
            ("h200", 5.72, 8.88, "benchmarks/results/gpu_check_H200_run3.txt")]


def profiles() -> dict:
    """The shipped timm profiles as today's PyTorch runs them (fused attention): the H100 runs' networks."""
    from cptsim.measure.profiler import LayerProfile

    return {k: LayerProfile.from_json(v["profile"]) for k, v in load_profiles().items() if "profile" in v}


def profiles_pt112() -> dict:
    """The same networks as timm's RTX 3090 tables ran them, on PyTorch 1.12: attention unfused (two matmuls and
    a softmax over the N x N scores; gpu_zoo_profiles.pt112_profiles)."""
    return pt112_profiles(load_profiles())


def rtx3090_rows(profs: dict) -> list:
    rows = []
    for path, cl in ((None, False), (NHWC_TABLE, True)):
        t = table_rows() if path is None else table_rows(path)
        rows += [F.Row(m, family(m), int(t[m]["train_batch_size"]), float(t[m]["train_samples_per_sec"]), cl)
                 for m in sorted(profs) if m in t and int(t[m]["train_img_size"]) == 224]
    return rows


def h100_rows(profs: dict) -> list:
    rows = []
    for f in H100_RUNS:
        for r in json.loads(f.read_text()).get("timm_train", []):
            if r.get("precision") == "amp" and r["model"] in profs and r.get("img_per_s_median"):
                rows.append(F.Row(r["model"], family(r["model"]), int(r["batch"]), float(r["img_per_s_median"]),
                                  r["format"] == "nhwc"))
    return rows


# one tensor-core MMA instruction's reduction depth in bytes (FP16 m16n8k16, TF32 m16n8k8, INT8 m16n8k32)
MMA_K_BYTES = 32.0
# The traced steps (benchmarks/gpu/bench_gpu_optrace.py's, lent H100): every kernel's device time per op
TRACES = HERE.parent / "results" / "gpu-optrace-H100"
# ops whose kernels carry real work of their own (GEMMs, convolutions, norms, fused or multi-tensor kernels): not
# launch floors
NOT_FLOOR = ("convolution", "mm", "addmm", "bmm", "norm", "lstm", "linear", "matmul", "attention", "_foreach",
             "embedding", "cat")


def load_traces() -> dict:
    import glob
    import gzip

    return {Path(f).name[6:-8]: json.load(gzip.open(f)) for f in sorted(glob.glob(str(TRACES / "trace-*.json.gz")))}


def kernel_floor_us(traces: dict, stream_bytes_s: float = 2.9e12) -> dict:
    """The device time of a kernel with next to no work: the call-weighted median over every traced single-kernel
    element-wise op (fill, copy, add, activations) whose tensors, read and written at 4 bytes an element at the
    stream rate, would take under a tenth of its measured time -- launch, ramp-up and tail, nothing else."""
    per, w, nets = [], [], set()
    for key, t in traces.items():
        for o in t["ops"]:
            if any(x in o["op"] for x in NOT_FLOOR) or o["calls"] <= 0 or o["launches"] != o["calls"]:
                continue
            numel = sum(int(np.prod(s)) for s in o["shapes"] if isinstance(s, list) and s
                        and all(isinstance(x, int) for x in s))
            us = o["us"] / o["calls"]
            if numel * 4 * 3 / stream_bytes_s * 1e6 > 0.1 * us:
                continue
            per.append(us)
            w.append(o["calls"])
            nets.add(key.rsplit("-", 1)[0])
    per, w = np.array(per), np.array(w, dtype=np.float64)
    i = np.argsort(per)
    c = np.cumsum(w[i]) / w.sum()
    return {"us": float(per[i][np.searchsorted(c, 0.5)]), "kernels": int(w.sum()), "ops": len(per),
            "traces": len(traces), "networks": sorted(nets)}


def kernels_per_launch(traces: dict, profs: dict) -> dict:
    """Kernels a step really launches per launch the op counter counts (cuDNN's layout transforms, memsets and
    split-K reductions around a convolution; several kernels per norm or loss): the median, over every traced timm
    step, of the trace's kernels over its network's counted launches (the shipped op list)."""
    ratios = {k: t["kernel_launches"] / profs[k.rsplit("-", 1)[0]].ops.totals()["launches"]
              for k, t in traces.items() if k.rsplit("-", 1)[0] in profs}
    return {"ratio": float(np.median(list(ratios.values()))), "traces": ratios}


def kernel_overhead_from_traces(profs: dict) -> dict:
    """kernel_overhead_us: the GPU time each counted launch adds beyond its bytes and MACs = the floor of one kernel
    (``kernel_floor_us``, thousands of traced kernels of 9 networks) x the kernels per counted launch
    (``kernels_per_launch``, 7 networks). Not fitted to any step's total: a step's unmodelled work cannot hide in
    it. A CUDA graph's gap between kernels is not in an eager trace (gpu_micro's graphed launch chain measures it
    where a GPU is at hand)."""
    traces = load_traces()
    floor = kernel_floor_us(traces)
    kpl = kernels_per_launch(traces, profs)
    return {"kernel_overhead_us": floor["us"] * kpl["ratio"], "floor": floor, "kernels_per_launch": kpl}


def conv_calls(traces: dict) -> list[dict]:
    """Every traced cuDNN convolution call of the timm traces whose output shape is known (the backward op records
    it; a forward op whose input and weight shapes match two backward ops -- the same layer at two strides, merged
    by the profiler -- is left out), depthwise ones left out (their own microbenchmarks): shape, memory format,
    phase (fwd, or bwd = dgrad + wgrad), kernels per call and measured seconds per call."""
    from collections import defaultdict

    out = []
    for key, t in traces.items():
        if not key.endswith(("-nchw", "-nhwc")):
            continue
        grads = defaultdict(list)
        for o in t["ops"]:
            if o["op"] == "aten::convolution_backward":
                go, x, w = o["shapes"][:3]
                grads[(tuple(x), tuple(w))].append(go)
        for o in t["ops"]:
            if o["op"] == "aten::cudnn_convolution":
                x, w = o["shapes"][:2]
                cands = grads.get((tuple(x), tuple(w)), [])
                if len(cands) != 1:
                    continue
                go, phase = cands[0], "fwd"
            elif o["op"] == "aten::convolution_backward":
                (go, x, w), phase = o["shapes"][:3], "bwd"
            else:
                continue
            n, c, h, wd = x
            co, cig, kh, kw = w
            g = c // cig
            gemm = np.array([g, co // g, cig * kh * kw, go[2] * go[3], 0], dtype=np.float64)
            if g > 1 and co // g == 1:
                continue
            out.append({"trace": key, "network": key.rsplit("-", 1)[0], "channels_last": key.endswith("-nhwc"),
                        "phase": phase, "batch": n, "gemm": gemm, "taps": kh * kw, "c_in": cig, "c_out": co // g,
                        # a stem's input is the RGB image, which needs no gradient: its backward is the wgrad alone
                        "stem": c == 3,
                        "numel": np.array([co * cig * kh * kw, c * h * wd, co * go[2] * go[3]], dtype=np.float64),
                        "kernels": o["launches"] / o["calls"], "calls": o["calls"],
                        "seconds": o["us"] / o["calls"] * 1e-6})
    return out


def aligned(call: dict, elements: int = 8) -> bool:
    """Whether a convolution's channels per group are whole 16-byte vectors of FP16 (cuDNN's aligned tensor-core
    kernels); HRNet's 18- and 36-channel branches are not, and run at 8-12 TMAC/s -- an effect seen in that one
    network, so not modelled and kept out of the per-call fit."""
    return call["c_in"] % elements == 0 and call["c_out"] % elements == 0 or call["c_in"] < 8


def call_seconds(hw, call: dict, floor_s: float) -> float:
    """The cost model's time for one traced convolution call, AMP (FP16 tier): the call as a one-layer profile priced
    by ``GPUProfile.shaped_gemm_cost`` -- the call ``cptsim.cost.estimate`` makes -- plus its kernels at the kernel
    floor."""
    from types import SimpleNamespace

    g = call["gemm"]
    macs = np.full((1, 1, 3), g[0] * g[1] * g[2] * g[3] * call["batch"])
    bits = np.full((1, 1, 3), 16)
    nbytes = np.full((1, 1, 3), 2.0 * (call["numel"][0] + call["batch"] * (call["numel"][1] + call["numel"][2])))
    layer = SimpleNamespace(gemm=g[None], is_conv=np.array([True]), channels_last=call["channels_last"],
                            matmul=np.array([False]), numel=call["numel"][None])
    t, _ = hw.shaped_gemm_cost(layer, macs, bits, bits, nbytes, np.array([float(call["batch"])]))
    t = t[0, 0]
    bwd = t[2] if call.get("stem") else t[1] + t[2]
    return float(t[0] if call["phase"] == "fwd" else bwd) + call["kernels"] * floor_s


def conv_call_errors(hw, calls: list[dict], floor_s: float) -> dict:
    """Time-weighted and plain median |log(model / measured)| and the time-weighted mean log error over ``calls``."""
    e = np.array([np.log(call_seconds(hw, c, floor_s) / c["seconds"]) for c in calls])
    w = np.array([c["seconds"] * c["calls"] for c in calls])
    i = np.argsort(np.abs(e))
    cw = np.cumsum(w[i]) / w.sum()
    return {"calls": len(calls), "weighted_median_abs_log": float(np.abs(e)[i][np.searchsorted(cw, 0.5)]),
            "median_abs_log": float(np.median(np.abs(e))), "weighted_mean_log": float(np.sum(w * e) / w.sum())}


def fit_transform(hw, calls: list[dict], floor_s: float) -> float:
    """``nchw_transform_bytes`` by least squares (soft L1) on log(model / measured) over the aligned NCHW spatial
    convolution calls (the only ones it prices)."""
    from scipy.optimize import least_squares

    sel = [c for c in calls if not c["channels_last"] and c["taps"] > 1 and aligned(c)]

    def resid(x):
        h = F.with_values(hw, {"nchw_transform_bytes": float(x[0])})
        return np.array([np.log(call_seconds(h, c, floor_s) / c["seconds"]) for c in sel])

    return float(least_squares(resid, [2.0], bounds=([0.0], [20.0]), loss="soft_l1", f_scale=0.3).x[0])


def conv_call_check(hw, floor_s: float) -> dict:
    """The per-call fit and its checks: fitted on all traced networks' calls; leave-one-network-out (each network's
    calls priced with the value fitted on the others); and a split by network (the first half of the networks
    alphabetically fits, the second half checks). Errors before (no transform term) and after."""
    calls = conv_calls(load_traces())
    nets = sorted({c["network"] for c in calls})
    zero = F.with_values(hw, {"nchw_transform_bytes": 0.0})
    value = fit_transform(zero, calls, floor_s)
    doc = {"value": value, "networks": nets, "lono": {}}
    for n in nets:
        v = fit_transform(zero, [c for c in calls if c["network"] != n], floor_s)
        held = [c for c in calls if c["network"] == n]
        doc["lono"][n] = {"value": v, "before": conv_call_errors(zero, held, floor_s),
                          "after": conv_call_errors(F.with_values(hw, {"nchw_transform_bytes": v}), held, floor_s)}
    half = set(nets[: len(nets) // 2])
    v = fit_transform(zero, [c for c in calls if c["network"] in half], floor_s)
    test = [c for c in calls if c["network"] not in half]
    doc["split"] = {"fit_on": sorted(half), "value": v, "before": conv_call_errors(zero, test, floor_s),
                    "after": conv_call_errors(F.with_values(hw, {"nchw_transform_bytes": v}), test, floor_s)}
    doc["all"] = {"before": conv_call_errors(zero, calls, floor_s),
                  "after": conv_call_errors(F.with_values(hw, {"nchw_transform_bytes": value}), calls, floor_s)}
    return doc


def micro_conv_seconds(hw, rec: dict, phase: int) -> float:
    """The cost model's time for one microbenchmarked convolution phase (gpu_measure.py's "conv" record), as
    ``call_seconds`` prices a traced call: a one-layer profile with its shapes, FP16 or FP32 (cuDNN's TF32)."""
    from types import SimpleNamespace

    g = rec["groups"]
    gemm = np.array([g, rec["K"] // g, rec["C"] // g * rec["R"] ** 2, rec["P"] * rec["Q"], 0.0])
    numel = np.array([rec["K"] * rec["C"] // g * rec["R"] ** 2, rec["C"] * rec["H"] * rec["W"],
                      rec["K"] * rec["P"] * rec["Q"]], dtype=np.float64)
    bits = np.full((1, 1, 3), {"fp16": 16, "fp32": 32}[rec["dtype"]])
    macs = np.zeros((1, 1, 3))
    macs[0, 0, phase] = gemm[0] * gemm[1] * gemm[2] * gemm[3] * rec["N"]
    nbytes = np.full((1, 1, 3), float(rec["bytes_x"] + rec["bytes_w"] + rec["bytes_y"]))
    layer = SimpleNamespace(gemm=gemm[None], is_conv=np.array([True]), channels_last=rec["format"] == "nhwc",
                            matmul=np.array([False]), numel=numel[None])
    t, _ = hw.shaped_gemm_cost(layer, macs, bits, bits, nbytes, np.array([float(rec["N"])]))
    return float(t[0, 0, phase])


def conv_micro_check(hw, min_us: float = 40.0) -> dict:
    """The transform term checked where it was not fitted: the lent H100's convolution microbenchmarks
    (gpu-shape-model-H100-run1.json "conv": ResNet-50, ResNeXt and CIFAR shapes, FP16 and FP32, NCHW and NHWC),
    each phase of at least ``min_us`` (shorter ones time the host's cuDNN call, not the GPU), depthwise ones left
    out. Median |log(model / measured)| per memory format, without and with the term."""
    micro = json.loads(H100_RUNS[0].read_text())
    zero = F.with_values(hw, {"nchw_transform_bytes": 0.0})
    out = {}
    for fmt in ("nchw", "nhwc"):
        before, after = [], []
        for rec in micro.get("conv", []):
            if rec["format"] != fmt or (rec["groups"] > 1 and rec["K"] // rec["groups"] == 1):
                continue
            for i, ph in enumerate(("fwd", "dgrad", "wgrad")):
                ms = rec.get(f"{ph}_ms")
                if ms is None or ms * 1e3 < min_us:
                    continue
                before.append(np.log(micro_conv_seconds(zero, rec, i) / (ms * 1e-3)))
                after.append(np.log(micro_conv_seconds(hw, rec, i) / (ms * 1e-3)))
        out[fmt] = {"phases": len(before), "before_median_abs_log": float(np.median(np.abs(before))),
                    "after_median_abs_log": float(np.median(np.abs(after))),
                    "before_mean_log": float(np.mean(before)), "after_mean_log": float(np.mean(after))}
    return out


def conv_tile_census(traces: dict) -> dict:
    """{output-channel tile width: traced calls} of the cuDNN implicit-GEMM kernels that run the traced spatial,
    non-depthwise convolutions (``tilesizeMxNxK`` in xmma kernel names, ``_MxN_KxS_nhwc`` in CUTLASS ones): the
    tile a narrow convolution's output channels are padded to (``conv_n_tile``: the most common)."""
    import re
    from collections import Counter

    tiles = Counter()
    for t in traces.values():
        for o in t["ops"]:
            if o["op"] not in ("aten::cudnn_convolution", "aten::convolution_backward"):
                continue
            w = o["shapes"][1] if o["op"] == "aten::cudnn_convolution" else o["shapes"][2]
            if w[2] * w[3] == 1 or w[1] == 1:
                continue
            for kn in o["kernels"]:
                m = re.search(r"tilesize(\d+)x(\d+)x(\d+)", kn) or re.search(r"_(\d+)x(\d+)_(\d+)x\d+_nhwc", kn)
                if m:
                    tiles[int(m.group(2))] += int(o["calls"])
    return dict(sorted(tiles.items()))


NARROW_TILES = (1, 16, 32, 64, 128)  # conv_n_tile candidates checked per call (1: no padding)


def narrow_check(hw, floor_s: float) -> dict:
    """Channel padding (``conv_n_tile``, ``conv_k_tile_bytes``) checked per traced spatial convolution call: the
    calls' |log(model / measured)| without padding and with the shipped tiles, overall, on the narrow calls
    (C_in or C_out <= 72) and per network; and, each network left out in turn, the N-tile the other networks'
    calls would choose (robust loss) and the left-out calls' error with it -- whether the tile the kernels' names
    give is also what the calls say, on calls it was not chosen on."""
    calls = [c for c in conv_calls(load_traces()) if c["taps"] > 1]
    nt, kb = hw.kernel_constant("conv_n_tile"), hw.kernel_constant("conv_k_tile_bytes")
    errs = {}
    for tile in NARROW_TILES:
        h = F.with_values(hw, {"conv_n_tile": float(tile), "conv_k_tile_bytes": kb if tile > 1 else 0.0})
        errs[tile] = np.array([np.log(call_seconds(h, c, floor_s) / c["seconds"]) for c in calls])
    before, after = errs[1], errs[int(nt)]
    nets = np.array([c["network"] for c in calls])
    narrow = np.array([min(c["c_in"], c["c_out"]) <= 72 for c in calls])

    def summ(e, m):
        return {"calls": int(m.sum()), "median_abs_log": float(np.median(np.abs(e[m]))),
                "mean_log": float(np.mean(e[m]))}

    def loss(e):
        return float(np.sum(np.log1p(np.abs(e) / 0.3)))  # soft: a few odd calls (a patchify stem) do not steer it

    every = np.ones(len(calls), bool)
    doc = {"n_tile": nt, "k_tile_bytes": kb, "all": {"before": summ(before, every), "after": summ(after, every)},
           "narrow": {"before": summ(before, narrow), "after": summ(after, narrow)}, "lono": {}}
    for n in sorted(set(nets)):
        out = nets == n
        pick = min(NARROW_TILES, key=lambda t: loss(errs[t][~out]))
        doc["lono"][n] = {"tile": pick, "before": summ(before, out), "after": summ(errs[pick], out)}
    held = np.concatenate([errs[d["tile"]][nets == n] for n, d in doc["lono"].items()])
    doc["lono_pooled"] = {"calls": len(held), "before_median_abs_log": float(np.median(np.abs(before))),
                          "after_median_abs_log": float(np.median(np.abs(held)))}
    return doc


def table(hw, profs, rows) -> list[dict]:
    out = []
    for r in rows:
        p = F.predicted_img_s(hw, profs[r.model], r)
        out.append({"model": r.model, "family": r.family, "format": "nhwc" if r.channels_last else "nchw",
                    "batch": r.batch, "measured": r.img_s, "predicted": p, "error": p / r.img_s - 1})
    return out


def summary(rows: list[dict]) -> dict:
    return {fmt: F.error_summary([r["error"] for r in rows if r["format"] == fmt]) for fmt in ("nchw", "nhwc")}


def resnet20_checks(hws: dict) -> list[dict]:
    from cptsim.cost.model import estimate
    from cptsim.cost.schedules import parse_schedule
    from cptsim.measure.profiler import profile_named_model

    prof = profile_named_model("resnet20", (3, 32, 32), 10)
    out = []
    for name, graphed, eager, where in RESNET20:
        hw = hws[name]
        c = estimate(prof, parse_schedule("static:32"), hw, steps=1, batch_size=128, per_layer=False)
        lb = hw.launch_bound(prof.ops, c.latency_s["total"])
        out.append({"gpu": name, "measured_graphed_ms": graphed, "model_graphed_ms": 1e3 * c.latency_s["total"],
                    "measured_eager_ms": eager, "model_eager_ms": 1e3 * lb["eager_step_s"] if lb else None,
                    "bound": lb["bound"] if lb else None, "source": where})
    return out


def _set(text: str, table: str, key: str, value) -> str:
    """``key = value`` in ``[table]`` of a TOML text, the line's comment kept; the key must be there already."""
    import re

    start = re.search(rf"(?m)^\[{table}\]", text).start()  # the table's header line, not a mention in a comment
    end = text.find("\n[", start + 1)
    end = len(text) if end < 0 else end
    body = text[start:end]
    v = f"{value:.4g}" if isinstance(value, float) else json.dumps(value)
    new, n = re.subn(rf"(?m)^{key}( *)= *[^#\n]*?(\s*)(#.*)?$",
                     lambda m: f"{key}{m.group(1)}= {v}" + (f"{m.group(2) or '  '}{m.group(3)}" if m.group(3) else ""),
                     body, count=1)
    if n != 1:
        raise SystemExit(f"[{table}] {key} not found")
    return text[:start] + new + text[end:]


def _set_tiers(text: str, eff: float) -> str:
    import re

    return re.sub(r"efficiency = [0-9.]+ \}", f"efficiency = {eff:.3f} }}", text)


def write(doc: dict) -> None:
    """Put the fitted constants and the measured errors into the shipped TOMLs (rtx3090, h100, h200)."""
    prof_dir = HERE.parents[1] / "hw_profiles"
    amp = doc["ampere"]
    t = (prof_dir / "rtx3090.toml").read_text()
    t = _set_tiers(t, amp["constants"]["tier:fp16"])
    for k, v in amp["constants"].items():
        if not k.startswith("tier:"):
            t = _set(t, "calibration", k, v)
    errs = [abs(r["error"]) for r in amp["table"]]
    t = _set(t, "validation", "n", len(errs))
    t = _set(t, "validation", "median_abs_error", float(np.median(errs)))
    t = _set(t, "validation", "worst_abs_error", float(np.max(errs)))
    (prof_dir / "rtx3090.toml").write_text(t)
    # a GPU described by its datasheet alone gets Ampere's constants (gpu_kernels.DEFAULTS)
    src = HERE.parents[1] / "cptsim" / "cost" / "hardware" / "gpu_kernels.py"
    code = src.read_text()
    import re

    keys = ("gemm_n0", "gemm_k0", "nchw_conv_factor", "nchw_depthwise_factor", "depthwise_efficiency",
            "depthwise_memory_efficiency", "norm_memory_efficiency", "nchw_norm_factor", "nchw_norm_elements_per_clock",
            "nchw_norm_rows_per_clock", "nchw_norm_backward_rows_per_clock", "nchw_norm_channels_per_sm",
            "nchw_transform_bytes", "conv_n_tile", "conv_k_tile_bytes")
    from cptsim.cost.hardware import gpu_kernels

    consts = {k: amp["constants"].get(k, gpu_kernels.DEFAULTS[k]) for k in keys}  # nchw_norm_factor: no longer fitted
    body = "".join(('\n' + ROWS_COMMENT if k == "nchw_norm_rows_per_clock" else "")
                   + ('\n' + TRANSFORM_COMMENT if k == "nchw_transform_bytes" else "")
                   + ('\n' + PADDING_COMMENT if k == "conv_n_tile" else "")
                   + '\n    "%s": %r,' % (k, float("%.4g" % consts[k])) for k in keys)
    code, n = re.subn(r"DEFAULTS = \{[^}]*\}", "DEFAULTS = {" + body + "\n}", code, count=1)
    assert n == 1
    src.write_text(code)
    for name in DATASHEET:  # the rest of what a datasheet profile gets from Ampere's fit
        t = (prof_dir / f"{name}.toml").read_text()
        t = _set_tiers(t, amp["constants"]["tier:fp16"])
        t = _set(t, "calibration", "memory_efficiency", amp["constants"]["memory_efficiency"])
        (prof_dir / f"{name}.toml").write_text(t)
    for name in ROOFLINE:  # profiles on the per-tier roofline take Ampere's achieved memory bandwidth
        t = (prof_dir / f"{name}.toml").read_text()
        t = _set(t, "calibration", "memory_efficiency", amp["constants"]["memory_efficiency"])
        (prof_dir / f"{name}.toml").write_text(t)
    for name in (*DATASHEET, "rtx3090", *NVIDIA_ROOFLINE):  # the launch floor of NVIDIA's runtime, measured on Hopper
        t = (prof_dir / f"{name}.toml").read_text()
        t = _set(t, "calibration", "kernel_overhead_us", doc["hopper"]["constants"]["kernel_overhead_us"])
        (prof_dir / f"{name}.toml").write_text(t)
    hop = doc["hopper"]
    for name in ("h100", "h200"):
        t = (prof_dir / f"{name}.toml").read_text()
        for k, v in hop["constants"].items():
            t = _set(t, "calibration", k, v)
        if name == "h100":
            pass  # its [validation] is the held-out check, written by benchmarks/bench_gpu_heldout.py --write
        else:  # the H200's own check: the resnet20 steps measured there (held out)
            r = next(x for x in doc["resnet20"] if x["gpu"] == "h200")
            errs = [abs(r["model_graphed_ms"] / r["measured_graphed_ms"] - 1)]
            if r["model_eager_ms"] is not None:
                errs.append(abs(r["model_eager_ms"] / r["measured_eager_ms"] - 1))
            t = _set(t, "validation", "n", len(errs))
            t = _set(t, "validation", "median_abs_error", float(np.median(errs)))
            t = _set(t, "validation", "worst_abs_error", float(np.max(errs)))
        (prof_dir / f"{name}.toml").write_text(t)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lofo", action="store_true", help="leave one family out on the RTX 3090 tables")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", action="store_true", help="write the fitted constants and the measured errors into "
                    "hw_profiles/rtx3090.toml, h100.toml and h200.toml, the inherited ones into the other GPU profiles "
                    "and gpu_kernels.DEFAULTS")
    args = ap.parse_args(argv)
    from cptsim.cost.hardware import load_profile

    profs = profiles()
    profs3090 = profiles_pt112()  # timm's tables ran PyTorch 1.12: attention unfused
    doc = {"profiles": len(profs)}
    # kernel level, on the H100's microbenchmarks (an isolated kernel streams at the measured 0.87 of peak)
    micro = json.loads(H100_RUNS[0].read_text())
    kern = F.with_values(load_profile("h100"), {"memory_efficiency": STREAM_EFFICIENCY})
    gemm_rows = [r for r in F.kernel_rows(micro, min_us=40) if r["label"].startswith("gemm")
                 and "4097" not in r["label"]]  # an unaligned 4097^3 GEMM misses the tensor-core path: not modelled
    shape = F.fit_kernels(kern, gemm_rows, SHAPE_FIT)
    doc["kernels"] = {"gemm_rows": len(gemm_rows), "shape": shape}
    # the GPU time per counted launch, from the traced kernels (before any network fit: it enters every row)
    launch = kernel_overhead_from_traces(profs)
    ko = {"kernel_overhead_us": float(f"{launch['kernel_overhead_us']:.3g}")}
    doc["launch"] = launch
    # Ampere: every constant on both RTX 3090 tables
    r3090 = F.with_values(load_profile("rtx3090"), {"memory_efficiency": STREAM_EFFICIENCY, **shape, **ko})
    rows = rtx3090_rows(profs3090)
    amp = {**F.fit(r3090, profs3090, rows, AMPERE_FIT), **shape}
    fitted3090 = F.with_values(r3090, amp)
    doc["ampere"] = {"rows": len(rows), "constants": amp, "in_sample": summary(table(fitted3090, profs3090, rows)),
                     "table": table(fitted3090, profs3090, rows)}
    if args.lofo:
        nchw = [r for r in rows if not r.channels_last]
        lo = F.lofo(r3090, profs3090, nchw, AMPERE_FIT)
        doc["ampere"]["lofo_nchw"] = {"summary": F.error_summary([r["error"] for r in lo]), "rows": lo}
    # Hopper
    h100 = F.with_values(load_profile("h100"), {"memory_efficiency": STREAM_EFFICIENCY, **ko})
    hrows = h100_rows(profs)
    # the H100 as a user would describe it from its datasheet: peaks and SM count, every constant Ampere's
    datasheet = F.with_values(h100, amp)
    for i in range(len(datasheet._tier_eff)):
        datasheet._tier_eff[i] = amp["tier:fp16"]
    doc["h100_datasheet_only"] = summary(table(datasheet, profs, hrows))
    sheet = F.with_values(h100, shape)  # the measured tiers, the kernel-level shape constants
    dw_rows = [r for r in F.kernel_rows(micro, min_us=0) if r["label"].startswith("conv dw")]
    dw = F.fit_kernels(sheet, dw_rows, HOPPER_DEPTHWISE)
    # NCHW spatial convolutions' layout transforms, per traced call (kernels at the stream rate, as the GEMMs)
    convs = conv_call_check(F.with_values(kern, {**shape, **dw}), launch["floor"]["us"] * 1e-6)
    doc["conv_calls"] = convs
    tr = {"nchw_transform_bytes": float(f"{convs['value']:.3g}")}
    convs["microbenchmarks"] = conv_micro_check(F.with_values(kern, {**shape, **dw, **tr}))
    # tensor-core convolutions' channel padding: tiles read off the traced kernels' names and the MMA depth
    census = conv_tile_census(load_traces())
    pad = {"conv_n_tile": float(max(census, key=census.get)), "conv_k_tile_bytes": MMA_K_BYTES}
    doc["narrow"] = narrow_check(F.with_values(kern, {**shape, **dw, **tr, **pad}), launch["floor"]["us"] * 1e-6)
    doc["narrow"]["census"] = census
    net = F.fit(F.with_values(sheet, {**dw, **tr, **pad}), profs, hrows, HOPPER_NETWORK)
    hopper = {**shape, **dw, **tr, **pad, **net, **ko}
    fitted_h100 = F.with_values(sheet, hopper)
    doc["hopper"] = {"rows": len(hrows), "constants": hopper, "in_sample": summary(table(fitted_h100, profs, hrows)),
                     "table": table(fitted_h100, profs, hrows)}
    h200 = F.with_values(load_profile("h200"), hopper)
    doc["resnet20"] = resnet20_checks({"h100": fitted_h100, "h200": h200})
    if args.write:
        write(doc)
    if args.json:
        print(json.dumps(doc, indent=1, default=float))
        return 0
    for key in ("ampere", "hopper"):
        d = doc[key]
        print(f"\n{key}: {d['rows']} rows; fitted constants:")
        for k, v in d["constants"].items():
            print(f"  {k} = {v:.4g}")
        print(f"  in-sample: {json.dumps(d['in_sample'], default=float)}")
        for r in d["table"]:
            print(f"    {r['model']:34} {r['format']} b{r['batch']:<4} measured {r['measured']:8.0f} "
                  f"model {r['predicted']:8.0f}  {100 * r['error']:+5.0f}%")
    if "lofo_nchw" in doc["ampere"]:
        print(f"\nleave one family out (RTX 3090 NCHW): {json.dumps(doc['ampere']['lofo_nchw']['summary'])}")
    cc = doc["conv_calls"]
    print(f"\nnchw_transform_bytes = {cc['value']:.3g}, per traced convolution call (H100, AMP; |log error|: "
          "time-weighted median, median):")
    for what, d in (("all calls", cc["all"]), (f"split: fitted on {', '.join(cc['split']['fit_on'])}, checked on "
                                                "the others", cc["split"])):
        b, a = d["before"], d["after"]
        print(f"  {what}: {b['calls']} calls, {b['weighted_median_abs_log']:.3f} / {b['median_abs_log']:.3f} -> "
              f"{a['weighted_median_abs_log']:.3f} / {a['median_abs_log']:.3f}")
    for fmt, d in cc["microbenchmarks"].items():
        print(f"  not fitted on: the H100's {fmt.upper()} convolution microbenchmarks, {d['phases']} phases >= 40 us: "
              f"median |log error| {d['before_median_abs_log']:.3f} -> {d['after_median_abs_log']:.3f}, mean log "
              f"error {d['before_mean_log']:+.3f} -> {d['after_mean_log']:+.3f}")
    for n, d in cc["lono"].items():
        b, a = d["before"], d["after"]
        print(f"  left out {n:14s} value {d['value']:.3g}: {b['calls']:3d} calls, {b['weighted_median_abs_log']:.3f} / "
              f"{b['median_abs_log']:.3f} -> {a['weighted_median_abs_log']:.3f} / {a['median_abs_log']:.3f}")
    nw = doc["narrow"]
    print(f"\nchannel padding: conv_n_tile = {nw['n_tile']:.0f} (traced kernels' output-channel tiles, calls: "
          f"{nw['census']}), conv_k_tile_bytes = {nw['k_tile_bytes']:.0f}; per traced spatial convolution call "
          "(H100, AMP), median |log error| / mean log error, no padding -> padding:")
    for what in ("all", "narrow"):
        b, a = nw[what]["before"], nw[what]["after"]
        print(f"  {what:8s} {b['calls']:3d} calls: {b['median_abs_log']:.3f} / {b['mean_log']:+.3f} -> "
              f"{a['median_abs_log']:.3f} / {a['mean_log']:+.3f}")
    for n, d in nw["lono"].items():
        b, a = d["before"], d["after"]
        print(f"  left out {n:14s} tile the others pick {d['tile']:3d}: {b['calls']:3d} calls, "
              f"{b['median_abs_log']:.3f} / {b['mean_log']:+.3f} -> {a['median_abs_log']:.3f} / {a['mean_log']:+.3f}")
    lp = nw["lono_pooled"]
    print(f"  every network left out, pooled: {lp['calls']} calls, {lp['before_median_abs_log']:.3f} -> "
          f"{lp['after_median_abs_log']:.3f}")
    la = doc["launch"]
    print(f"\nkernel_overhead_us = {la['kernel_overhead_us']:.3g}: a kernel's floor {la['floor']['us']:.3g} us "
          f"(call-weighted median of {la['floor']['kernels']} traced kernels, {la['floor']['ops']} ops, "
          f"{len(la['floor']['networks'])} networks) x {la['kernels_per_launch']['ratio']:.3g} kernels per counted "
          "launch (median of "
          f"{len(la['kernels_per_launch']['traces'])} traced steps)")
    print(f"\nH100 from its datasheet with Ampere's constants: {json.dumps(doc['h100_datasheet_only'])}")
    for r in doc["resnet20"]:
        print(f"resnet20 b128 FP32 on {r['gpu']}: graphed {r['model_graphed_ms']:.2f} ms vs {r['measured_graphed_ms']}"
              f" measured; eager {r['model_eager_ms'] or float('nan'):.2f} vs {r['measured_eager_ms']} "
              f"({r['bound']}-bound); {r['source']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

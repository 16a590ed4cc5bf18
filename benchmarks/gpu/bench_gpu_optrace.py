"""Per-op GPU time measured on the lent H100 against the cost model's, op kind by op kind (issue 23).

    python benchmarks/gpu/bench_gpu_optrace.py           # each traced step: measured vs modelled batch norms, and the step
    python benchmarks/gpu/bench_gpu_optrace.py --fit     # fit the NCHW batch-norm constants to the traced kernels
    python benchmarks/gpu/bench_gpu_optrace.py --convs   # every traced convolution call: measured vs the shape model
    python benchmarks/gpu/bench_gpu_optrace.py --steps   # per trace: GPU busy vs step, and where the non-GEMM time goes
    python benchmarks/gpu/bench_gpu_optrace.py --host    # per trace: ops that launched kernels by class, step time per op
    python benchmarks/gpu/bench_gpu_optrace.py --json

The traces are benchmarks/gpu/gpu_optrace.py's (run on the lent H100, benchmarks/gpu/session.sh optrace):
two profiled AMP training steps of timm networks -- the held-out outliers GhostNet, HRNet, MixNet, DLA, gMLP, and
ResNet-50-T / DenseNet-169 as controls -- with every CPU op's kernels and their device time.

What they showed: in NCHW under AMP, cuDNN's batch norms take half the step of GhostNet, HRNet, DLA and MixNet
(ghostnet_130 b512: 148 of 247 ms of GPU time; channels-last: 26 ms), and their time follows N x H x W, not the
bytes: a 10-channel norm at 112x112 takes as long as a 32-channel one. cuDNN's NCHW kernels give each channel its own
thread block, walking that channel's positions. ``--fit`` fits ``t = N H W max(C, Cmax) / (Cmax r clock)`` with
``Cmax = channels_per_sm x SMs`` and ``r`` rows per clock (forward, backward) to every traced NCHW batch-norm call,
weighted by its time (the constants in hw_profiles/h100.toml, gpu_kernels.DEFAULTS); the default prints, per
traced network, the measured batch-norm time against the model's from the network's shipped op list
(benchmarks/data/timm/profiles-224.json.gz, its batch norms' shapes), and the whole step.

``--convs`` (fifth session, no GPU: an offline reading of the same traces) prices every traced cuDNN convolution
call -- forward, and backward as dgrad + wgrad -- with the shape model (gpu_kernels.gemm_times, the h100 profile's
constants, FP16 tier, the trace's memory format) and prints measured / modelled time by kernel taps and input
channels. What it shows: 1x1 convolutions are priced about right (ratios 0.75-1.1 up to 256 channels), but 3x3
convolutions with few input channels run far slower than the model says -- 5-7x at 8-64 channels (HRNet's 18- and
36-channel branches run at ~25 TFLOPS of the H100's 989), 2-3x at 64-128, 1.1-1.6x above 128 -- while the op list's
memory-bound ops are priced above what the traces measure. The whole-network fits balance the two (h100's
memory_efficiency came out at 0.48), which is why HRNet-style networks (many narrow 3x3 convs at high resolution)
stay the worst held-out rows, especially in channels-last, where no batch-norm cost hides it. The next step it
points to: per-kernel constants for convolutions (a reduction that runs tap by tap over C_in, with N and K tile
quantisation) fitted on these calls, then the memory-bound efficiency refitted with the convolutions fixed.
Since then the shape model prices a narrow convolution's channel padding to whole tiles (gpu_kernels.conv_padding:
h100's conv_n_tile, conv_k_tile_bytes), which this table includes; benchmarks/gpu/fit_gpu_model.py checks it per
call with each network left out.

``--steps`` (also offline) prints per trace the step time, the GPU-busy time and launches, and splits the non-GEMM,
non-norm kernel time into PyTorch's vectorised element-wise kernels and its strided / non-vectorised ones
(``elementwise_kernel<128, ...>``, ``unrolled_elementwise_kernel``: operands in different layouts, channel slices,
transposes). Two findings the model does not capture yet: (1) the strided kernels take 52 ms of gMLP's 112 ms of
GPU time and 20-25 ms of MixNet's (its split/cat channel groups), at a third or less of the contiguous kernels'
bandwidth -- the op counter does not record strides, so gMLP is priced +41% fast; (2) the eager LSTM-LM is host-bound,
not GPU-bound: 22.5 ms of GPU work in a 49.6 ms step, its ~2,460 small kernels at ~2 us each on the GPU, while the
model prices it GPU-bound at ~54 ms with the h100's fitted 14 us per kernel (kernel_overhead_us, fitted on CIFAR
ResNet-20's graphed step, where it also absorbs the narrow 3x3 convolutions' missing time) and a host at 9.75 us per
launch (an add_ loop; the LSTM's Python-issued forward ops cost ~48 us each). The FP32 row lands near its
measurement by two errors that cancel; under AMP they do not (-27%).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
TRACES = HERE.parent / "results" / "gpu-optrace-H100"
CLOCK_HZ, SMS = 1980e6, 132  # the lent H100 SXM (nvidia-smi: 1980 MHz max SM clock; 132 SMs)


def load_traces() -> dict:
    out = {}
    for f in sorted(glob.glob(str(TRACES / "trace-*.json.gz"))):
        out[Path(f).name[6:-8]] = json.load(gzip.open(f))
    return out


def bn_calls(trace: dict) -> list[tuple]:
    """(backward?, N H W, C, us per call, calls) of each traced batch-norm op on 4-D feature maps."""
    rows = []
    for o in trace["ops"]:
        sh = o["shapes"][0] if o["shapes"] else None
        if "batch_norm" in o["op"] and isinstance(sh, list) and len(sh) == 4:
            n, c, h, w = sh
            rows.append(("backward" in o["op"], n * h * w, c, o["us"] / o["calls"], o["calls"]))
    return rows


def fit(traces: dict) -> dict:
    """The constants of gpu_kernels.nchw_batch_norm_seconds by grid search on the time-weighted squared log error
    over every NCHW call (one channels-in-flight constant for both phases; rows per clock per phase)."""
    calls = [r for k, t in traces.items() if k.endswith("-nchw") for r in bn_calls(t)]
    best = None
    for cps in np.arange(1.0, 2.01, 0.1):
        cmax = cps * SMS
        tot, res = 0.0, {}
        for bwd in (False, True):
            sub = [r for r in calls if r[0] == bwd]
            meas = np.array([r[3] for r in sub])
            w = np.array([r[3] * r[4] for r in sub])
            w /= w.sum()
            rows = np.array([r[1] * max(r[2], cmax) / cmax for r in sub])
            # for a fixed cmax the best rows-per-clock is closed form in log space (weighted mean of log ratios)
            lr = np.log(rows / (CLOCK_HZ * meas * 1e-6))
            r = float(np.exp(np.sum(w * lr)))
            e = np.log(rows / (r * CLOCK_HZ) / (meas * 1e-6))
            tot += float(np.sum(w * e ** 2))
            res["backward" if bwd else "forward"] = {"rows_per_clock": r, "calls": len(sub),
                                                     "weighted_median_abs_log_error": _wmedian(np.abs(e), w)}
        if best is None or tot < best[0]:
            best = (tot, round(float(cps), 2), res)
    return {"channels_per_sm": best[1], **best[2]}


def _wmedian(x, w) -> float:
    i = np.argsort(x)
    c = np.cumsum(w[i])
    return float(x[i][np.searchsorted(c, 0.5)])


def compare(traces: dict) -> list[dict]:
    from gpu_zoo_profiles import load_profiles

    from cptsim.calibration import gpu_fit as F
    from cptsim.cost.hardware import load_profile
    from cptsim.measure.profiler import LayerProfile

    hw = load_profile("h100")
    zoo = load_profiles()
    out = []
    for key, t in traces.items():
        name, fmt = key.rsplit("-", 1)
        if name not in zoo or "profile" not in zoo[name]:
            continue
        prof = LayerProfile.from_json(zoo[name]["profile"])
        n = np.array([float(t["batch"])])
        meas = {"fwd": 0.0, "bwd": 0.0}
        for bwd, _, _, us, k in bn_calls(t):
            meas["bwd" if bwd else "fwd"] += us * k / 1e3
        row = {"trace": key, "batch": t["batch"], "step_ms": t["step_ms_median"], "gpu_busy_ms": t["gpu_busy_ms"],
               "bn_measured_ms": meas}
        bn = hw.nchw_batch_norm_time(prof.ops, n) if fmt == "nchw" else None
        if bn is not None:
            row["bn_modelled_ms"] = {p: float(bn[p][0]) * 1e3 for p in ("fwd", "bwd")}
        row["step_img_s_measured"] = t["batch"] / (t["step_ms_median"] / 1e3)
        row["step_img_s_modelled"] = F.predicted_img_s(hw, prof, F.Row(name, "", int(t["batch"]), 1.0,
                                                                        fmt == "nhwc"))
        out.append(row)
    return out


def conv_calls(traces: dict) -> list[dict]:
    """Every traced cuDNN convolution call of the timm traces (depthwise ones left out: their own model), with its
    shape and measured time, and the shape model's time for it (h100 profile, FP16 tier)."""
    from cptsim.cost.hardware import gpu_kernels as K
    from cptsim.cost.hardware import load_profile

    hw = load_profile("h100")
    consts = {k: hw.kernel_constant(k) for k in K.DEFAULTS}
    i16 = hw._tier_names.index("fp16")
    rate = np.full((1, 1, 3), hw._tier_mac_rate[i16] * hw._tier_eff[i16])
    fp32 = hw._tier_mac_rate[hw._tier_names.index("fp32")]
    bw, sms = hw._bandwidth * hw._meff, float(hw.params["sm_count"])
    out = []
    for key, t in traces.items():
        if not key.endswith(("-nchw", "-nhwc")):
            continue
        # the forward op records input and weight only: its output size from the backward op's. One layer shape run
        # at two strides gives two backward ops with the same input and weight, merged in the forward's record: such
        # a forward op's output size is unknown, and it is left out
        out_shape: dict = {}
        for o in t["ops"]:
            if o["op"] == "aten::convolution_backward":
                go, x, w = o["shapes"][:3]
                out_shape.setdefault((tuple(x), tuple(w)), []).append(go)
        for o in t["ops"]:
            if o["op"] == "aten::cudnn_convolution":
                x, w = o["shapes"][:2]
                cands = out_shape.get((tuple(x), tuple(w)), [])
                go, phase = (cands[0] if len(cands) == 1 else None), "fwd"
            elif o["op"] == "aten::convolution_backward":
                (go, x, w), phase = o["shapes"][:3], "bwd"
            else:
                continue
            if go is None:
                continue
            n_, c, h, wd = x
            co, cig, kh, kw = w
            g = c // cig
            gemm = np.array([[g, co // g, cig * kh * kw, go[2] * go[3], 0]], dtype=float)
            if K.is_depthwise(gemm)[0]:
                continue
            macs = np.full((1, 1, 3), float(n_ * go[2] * go[3] * co * cig * kh * kw))
            nbytes = np.full((1, 1, 3), 2.0 * (n_ * c * h * wd + n_ * co * go[2] * go[3] + co * cig * kh * kw))
            tt = K.gemm_times(gemm, np.array([True]), macs, np.array([float(n_)]), rate, np.ones((1, 1, 3), bool),
                              fp32, nbytes, bw, sms, consts, channels_last=key.endswith("-nhwc"),
                              taps=np.array([float(kh * kw)]), element_bytes=np.full((1, 1, 3), 2.0))[0, 0]
            out.append({"trace": key, "phase": phase, "taps": kh * kw, "c_in": cig, "calls": o["calls"],
                        "measured_s": o["us"] / o["calls"] * 1e-6,
                        # a stem's input (the RGB image) needs no gradient: its backward is the wgrad alone
                        "modelled_s": float(tt[0] if phase == "fwd" else tt[2] if c == 3 else tt[1] + tt[2])})
    return out


def step_split(traces: dict) -> list[dict]:
    """Per trace: step and GPU-busy time, launches, and the non-GEMM, non-norm kernel time split into vectorised and
    strided element-wise kernels (by kernel name)."""
    gemm = ("aten::cudnn_convolution", "aten::convolution_backward", "aten::mm", "aten::addmm", "aten::bmm")
    out = []
    for key, t in traces.items():
        strided = vector = 0.0
        for o in t["ops"]:
            if o["op"] in gemm or "norm" in o["op"]:
                continue
            ks = " ".join(o["kernels"])
            if "elementwise_kernel<128" in ks or "unrolled_elementwise" in ks:
                strided += o["us"]
            else:
                vector += o["us"]
        out.append({"trace": key, "step_ms": t["step_ms_median"], "gpu_busy_ms": t["gpu_busy_ms"],
                    "launches": t["kernel_launches"], "strided_elementwise_ms": strided / 1e3,
                    "other_non_gemm_ms": vector / 1e3})
    return out


# What a traced op is, for the host's side of an eager step: the traces keep each op's kernels and their device time,
# not its CPU time, so this table bounds the host's time per dispatched op (step / ops) rather than measuring it.
HOST_CLASSES = ("conv", "matmul", "foreach", "backward", "cast", "other")
_MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
_CASTS = ("aten::copy_", "aten::_to_copy")


def host_class(op: str) -> str:
    """A traced op's class by its aten name: cuDNN convolution, cuBLAS matmul, optimizer foreach op, an op named as a
    backward, a copy / cast (AMP's autocast casts land here), or any other (element-wise, reductions, norms)."""
    if "convolution" in op or "cudnn" in op:
        return "conv"
    if op in _MATMULS:
        return "matmul"
    if "_foreach" in op:
        return "foreach"
    if "backward" in op:
        return "backward"
    if op in _CASTS:
        return "cast"
    return "other"


def host_split(traces: dict) -> list[dict]:
    """Per trace: step and GPU-busy time, kernels, the ops that launched them per class, and the step's time per such
    op -- the host's time per dispatched op where the GPU idles (busy << step), an upper bound elsewhere."""
    out = []
    for key, t in traces.items():
        calls = dict.fromkeys(HOST_CLASSES, 0.0)
        for o in t["ops"]:
            calls[host_class(o["op"])] += o["calls"]
        n = sum(calls.values())
        out.append({"trace": key, "step_ms": t["step_ms_median"], "gpu_busy_ms": t["gpu_busy_ms"],
                    "kernels": t["kernel_launches"], "ops": n, "calls": calls,
                    "step_us_per_op": t["step_ms_median"] * 1e3 / n,
                    "host_bound": t["gpu_busy_ms"] < 0.5 * t["step_ms_median"]})
    return out


CIN_BANDS = ((0, 8), (8, 32), (32, 64), (64, 128), (128, 256), (256, 1 << 20))


def conv_table(calls: list[dict]) -> list[dict]:
    """Measured and modelled time summed per (phase, taps, input-channel band)."""
    rows = []
    for phase in ("fwd", "bwd"):
        for taps in sorted({c["taps"] for c in calls}):
            for lo, hi in CIN_BANDS:
                sel = [c for c in calls if c["phase"] == phase and c["taps"] == taps and lo < c["c_in"] <= hi]
                if not sel:
                    continue
                m = sum(c["measured_s"] * c["calls"] for c in sel)
                p = sum(c["modelled_s"] * c["calls"] for c in sel)
                rows.append({"phase": phase, "taps": taps, "c_in": [lo, hi], "shapes": len(sel),
                             "measured_ms": m * 1e3, "modelled_ms": p * 1e3, "ratio": m / p})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--convs", action="store_true")
    ap.add_argument("--steps", action="store_true")
    ap.add_argument("--host", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    traces = load_traces()
    if args.steps:
        rows = step_split(traces)
        if args.json:
            print(json.dumps({"steps": rows}, indent=1))
            return 0
        print("lent H100: traced steps, GPU busy vs step, and the non-GEMM, non-norm kernels split by kind")
        print(f"{'trace':30s} {'step ms':>8s} {'busy ms':>8s} {'launches':>8s} {'strided ew ms':>13s} "
              f"{'other ms':>9s}")
        for r in rows:
            print(f"{r['trace']:30s} {r['step_ms']:8.1f} {r['gpu_busy_ms']:8.1f} {r['launches']:8.0f} "
                  f"{r['strided_elementwise_ms']:13.1f} {r['other_non_gemm_ms']:9.1f}")
        return 0
    if args.host:
        rows = host_split(traces)
        if args.json:
            print(json.dumps({"host": rows}, indent=1))
            return 0
        print("lent H100: traced steps, the ops that launched kernels per class, and the step's time per op "
              "(host-bound where GPU busy < half the step)")
        print(f"{'trace':28s} {'step ms':>7s} {'busy ms':>7s} {'kernels':>7s} {'ops':>5s} "
              + " ".join(f"{c:>8s}" for c in HOST_CLASSES) + f" {'us/op':>6s}")
        for r in rows:
            print(f"{r['trace']:28s} {r['step_ms']:7.1f} {r['gpu_busy_ms']:7.1f} {r['kernels']:7.0f} {r['ops']:5.0f} "
                  + " ".join(f"{r['calls'][c]:8.0f}" for c in HOST_CLASSES)
                  + f" {r['step_us_per_op']:6.1f}{'  host-bound' if r['host_bound'] else ''}")
        print("(the traces keep each op's device time, not its CPU time: us/op is the host's time per dispatched op "
              "only where the step is host-bound; views and autograd nodes without kernels are not in the traces)")
        return 0
    if args.convs:
        rows = conv_table(conv_calls(traces))
        if args.json:
            print(json.dumps({"convs": rows}, indent=1))
            return 0
        print("lent H100, AMP: traced cuDNN convolution calls (7 timm networks, NCHW and NHWC), measured vs the shape "
              "model (h100)")
        print(f"{'phase':5s} {'taps':>4s} {'C_in':>10s} {'shapes':>6s} {'meas ms':>8s} {'model ms':>8s} {'ratio':>6s}")
        for r in rows:
            lo, hi = r["c_in"]
            band = f"({lo},{hi}]" if hi < 1 << 20 else f">{lo}"
            print(f"{r['phase']:5s} {r['taps']:4d} {band:>10s} {r['shapes']:6d} {r['measured_ms']:8.1f} "
                  f"{r['modelled_ms']:8.1f} {r['ratio']:6.2f}")
        print("(bwd = dgrad + wgrad of one convolution_backward call; time summed over each band's calls per step)")
        return 0
    doc = {"fit": fit(traces)} if args.fit else {"compare": compare(traces)}
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    if args.fit:
        f = doc["fit"]
        print(f"NCHW batch norm, fitted on the lent H100's traced kernels: channels in flight = "
              f"{f['channels_per_sm']} x SMs")
        for ph in ("forward", "backward"):
            g = f[ph]
            print(f"  {ph:8s} rows per clock {g['rows_per_clock']:.3f}  ({g['calls']} calls; time-weighted median "
                  f"|log error| {g['weighted_median_abs_log_error']:.3f})")
        return 0
    print("lent H100, AMP: batch norms' GPU time measured (traced kernels) vs modelled (h100 profile), and the step")
    print(f"{'trace':24s} {'batch':>5s} {'BN fwd meas':>11s} {'model':>7s} {'BN bwd meas':>11s} {'model':>7s} "
          f"{'img/s meas':>10s} {'model':>7s} {'error':>6s}")
    for r in doc["compare"]:
        m, bm = r["bn_measured_ms"], r.get("bn_modelled_ms")
        err = r["step_img_s_modelled"] / r["step_img_s_measured"] - 1
        mf, mb = (f"{bm['fwd']:.1f}", f"{bm['bwd']:.1f}") if bm else ("-", "-")
        print(f"{r['trace']:24s} {r['batch']:5d} {m['fwd']:11.1f} {mf:>7s} {m['bwd']:11.1f} {mb:>7s} "
              f"{r['step_img_s_measured']:10.0f} {r['step_img_s_modelled']:7.0f} {err:+6.0%}")
    print("(BN modelled: gpu_kernels.nchw_batch_norm_seconds from the shipped op list's batch-norm shapes; "
          "channels-last norms are priced by their bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

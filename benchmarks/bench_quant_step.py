"""Quantized training step vs FP32 training step, side by side in one process.

    python benchmarks/bench_quant_step.py [--model resnet20] [--batch-size 128] [--rounds 15] [--threads N]
                                          [--no-eager] [--no-floor] [--memory-pairs 3] [--json]

Copies of the same model (one swapped to quantized layers at 8/8 bits, one plain FP32) take alternating SGD steps
on the same batch; the figure is median(quantized step) / median(FP32 step), and beside it the median of the
rounds' own ratios. Alternating them, in an order that reverses every round (so that no copy always follows the
same one), keeps a noisy shared machine from favouring either. The quantized model runs cptsim's CPU quantizer
kernels (cptsim.numerics.ckernels) when they are built, which the output says; unless --no-eager, a third copy runs the
eager PyTorch quantizers (CPTSIM_CKERNELS=0 during its steps) in the same rounds, so the kernels' gain is measured
side by side too. A breakdown splits the quantized step's extra time down by op: torch.profiler self-CPU time per
aten op, quantized step minus FP32 step.

The floor (unless --no-floor): a fourth copy runs the quantized layers with every quantizer replaced by a plain
copy into the same buffer -- the activation-sized tensors a quantized step has to write (Qa(x) for the forward
conv, Qa(x) again for wgrad, the quantized error), with no range pass and no arithmetic. Its ratio to FP32 is what
any quantizer that materialises those three tensors costs at least on this machine, so quantized / floor says how
much of the gap the kernels' own passes still take.

Peak memory (``--memory-pairs N``, default 3; 0 skips it): each of FP32 and quantized (and the eager quantizers
unless --no-eager) runs one training step in a fresh process of its own (1 thread), and the figure is its max RSS
(VmHWM) above the RSS just before the step (model, optimizer and batch already built); the order alternates,
medians reported, plus the quantized / FP32 ratio. Measured twice: with glibc's mmap threshold fixed, which makes
the figure the memory the step holds, and with glibc's default, which adds the allocator's heap retention (see
MALLOC_MODES).
GEMM paths (``--models M [M ...]``, issue 28 item 3): for each model, copies with the same weights take alternating
steps on one batch: FP32, the quantized layers on today's FP32 fake-quant GEMMs (CPTSIM_EXACT_GEMM=0), on the exact
int8 GEMMs of cptsim.numerics.exact_gemm (=1: a Linear's forward and wgrad as torch._int_mm on a CPU), and on CUDA
also AMP (fp16 autocast + GradScaler) and the integer-codes path (=1 on CUDA: convs and linears on the integers with
TF32). Models: resnet20 (batch 128, CIFAR shapes), transformer-lm (16 x 256 tokens), lstm-lm (Zaremba medium, 20 x
35), gcn (full batch on synthetic-graph:20000,128,40:14), vocabularies 10,000; the model's default full-precision
layers (its classifier for resnet20 and gcn) as cptsim train keeps them. Beside the measured ratios, on a CPU, the
BOUND of the exact path: the FP32 step with each int8-eligible GEMM's FP32 time replaced by its torch._int_mm time
(the layer calls recorded in one forward, each GEMM shape timed alone, int8 vs FP32, side by side) and the quantizers
costing nothing -- the fastest any exact step with these GEMM rules could be on this machine -- and the same with
dgrad in int8 too (what one weight scale per tensor, not cptsim's per channel, would allow). ``--path-memory N``
adds each path's peak memory: two steps in a fresh process (1 thread, glibc's mmap threshold fixed), N processes per
path in alternating order, medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

from cptsim.numerics.layers import quantize_model
from cptsim.models import create_model
from cptsim.models.loss import class_cross_entropy


def _step(model, opt, x, y) -> float:
    t0 = time.perf_counter()
    # the training loop's loss: a language model's (B, V, T) logits are a transposed view, and F.cross_entropy on
    # that view runs its log-softmax over a strided dimension (a 41M-element copy per step for transformer-lm)
    loss = class_cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return time.perf_counter() - t0


class _CopyQuantizers:
    """While active, cptsim.numerics.ckernels' quantizers are plain copies into the same outputs (the floor, see above)."""

    NAMES = ("fake_quant_rtn_tracked", "fake_quant_rtn", "fake_quant_sr", "fake_quant_rtn_channels")

    def __enter__(self):
        from cptsim.numerics import ckernels

        def copy(x, slot=None):
            x, out = ckernels._dense_in_out(x.detach(), slot)
            return out.copy_(x)

        self.saved = {n: getattr(ckernels, n) for n in self.NAMES}
        # the floor is the fake-quant path's: the exact integer GEMMs (cptsim.numerics.exact_gemm) need real codes
        self.exact_env = os.environ.get("CPTSIM_EXACT_GEMM")
        os.environ["CPTSIM_EXACT_GEMM"] = "0"
        ckernels.fake_quant_rtn_tracked = lambda x, lo, hi, count, qmax, m, slot=None: (copy(x, slot), 0.0, 1.0)
        ckernels.fake_quant_rtn = lambda x, lo, hi, qmax, slot=None: copy(x, slot)
        ckernels.fake_quant_sr = lambda x, qmax, generator=None, slot=None: copy(x, slot)
        ckernels.fake_quant_rtn_channels = lambda w, qmax: copy(w)
        self.module = ckernels
        return self

    def __exit__(self, *exc):
        for n, f in self.saved.items():
            setattr(self.module, n, f)
        if self.exact_env is None:
            os.environ.pop("CPTSIM_EXACT_GEMM", None)
        else:
            os.environ["CPTSIM_EXACT_GEMM"] = self.exact_env


def _self_times(model, opt, x, y) -> dict[str, float]:
    """Self CPU time (ms) per aten op in one training step."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _step(model, opt, x, y)
    return {ev.key: ev.self_cpu_time_total / 1e3 for ev in prof.key_averages()}


def _breakdown(fp, opt_fp, q, opt_q, x, y, top: int = 8) -> dict[str, float]:
    """Where the quantized step's extra time goes: per-op self time, quantized minus FP32 (ms), largest first.

    Median of 3 profiled steps each, so one noisy step does not decide the attribution.
    """
    runs_fp = [_self_times(fp, opt_fp, x, y) for _ in range(3)]
    runs_q = [_self_times(q, opt_q, x, y) for _ in range(3)]
    ops = set().union(*runs_fp, *runs_q)
    diff = {op: statistics.median(r.get(op, 0.0) for r in runs_q) - statistics.median(r.get(op, 0.0) for r in runs_fp)
            for op in ops}
    ranked = sorted(diff.items(), key=lambda kv: -kv[1])[:top]
    return {op: round(ms, 2) for op, ms in ranked}


def _memory_child(model: str, batch_size: int, bits: int, grad_bits: int, quantized: bool) -> None:
    """In a fresh process: one training step; prints the max RSS above the pre-step RSS, in MB."""
    torch.set_num_threads(1)
    from cptsim.numerics import ckernels

    ckernels.library()  # build/load the kernels before the baseline, as a training run has by its first step
    torch.manual_seed(0)
    shape = (1, 8, 8) if model == "digits-cnn" else (3, 32, 32)
    m = create_model(model, num_classes=10, in_channels=shape[0], input_shape=shape)
    if quantized:
        quantize_model(m).set(bits, grad_bits)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch_size, *shape)
    y = torch.randint(0, 10, (batch_size,))
    def status_mb(key: str) -> float:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024  # kB

    # VmHWM, the peak RSS of this process image: ru_maxrss would not do, it carries over the RSS of the parent
    # at fork (the benchmark's own process, with two models, hundreds of MB) across exec
    base = status_mb("VmRSS")
    _step(m, opt, x, y)
    print(json.dumps({"extra_mb": status_mb("VmHWM") - base}))


# glibc's default malloc moves its mmap threshold up to the size of the largest block freed so far, after which
# multi-megabyte tensors come from the heap and what is freed below the heap's top is kept: the peak RSS of one
# step then depends on where big blocks happened to land (identical FP32 steps: 282-357 MB here), not on what the
# step holds. With a fixed threshold (MALLOC_MMAP_THRESHOLD_, glibc's own tunable) every big tensor is its own
# mapping, returned when freed, and the peak RSS is the peak of the tensors alive at once plus a small heap. Both
# are measured; the fixed-threshold figure is the step's memory, the default one what `ps` shows on a given run.
MALLOC_MODES = {"fixed": {"MALLOC_MMAP_THRESHOLD_": "131072"}, "default": {}}


def _memory(a, pairs: int) -> dict:
    import subprocess
    import sys

    def run(quantized: bool, kernels: bool, malloc: dict) -> float:
        env = dict(os.environ, **malloc, CPTSIM_CKERNELS="1" if kernels else "0")
        out = subprocess.run([sys.executable, __file__, "--model", a.model, "--batch-size", str(a.batch_size),
                              "--bits", str(a.bits), "--grad-bits", str(a.grad_bits),
                              "--memory-child", "quant" if quantized else "fp32"],
                             check=True, capture_output=True, text=True, env=env).stdout
        return json.loads(out.strip().splitlines()[-1])["extra_mb"]

    res = {"pairs": pairs}
    for mode, malloc in MALLOC_MODES.items():
        fp, q, e = [], [], []
        for i in range(pairs):
            order = ("fp", "q", "e") if i % 2 == 0 else ("e", "q", "fp")  # alternate who goes first
            for who in order:
                if who == "e" and a.no_eager:
                    continue
                (fp if who == "fp" else q if who == "q" else e).append(run(who != "fp", who == "q", malloc))
        mf, mq = statistics.median(fp), statistics.median(q)
        r = {"fp32_extra_mb": [round(v, 1) for v in fp], "quant_extra_mb": [round(v, 1) for v in q],
             "fp32_extra_mb_median": round(mf, 1), "quant_extra_mb_median": round(mq, 1),
             "extra_pct": round(100 * (mq / mf - 1), 1),
             "extra_pct_paired_median": round(100 * (statistics.median(b / a_ for a_, b in zip(fp, q)) - 1), 1)}
        if e:
            r["eager_quant_extra_mb"] = [round(v, 1) for v in e]
            r["eager_extra_pct"] = round(100 * (statistics.median(e) / mf - 1), 1)
        res[mode] = r
    return res


# ------------------------------------------------------------------------------------------------- GEMM paths (--models)

PATH_SHAPES = {"resnet20": 128, "transformer-lm": (16, 256), "lstm-lm": (20, 35)}
GRAPH = "synthetic-graph:20000,128,40:14"


def _workload(name: str, vocab: int):
    """(a builder of the model, x, y, the loss) for one of the --models."""
    from cptsim.models.loss import class_cross_entropy

    torch.manual_seed(0)
    if name == "gcn" or name.startswith(("gcn:", "sage", "gat")):
        from cptsim.data import load_datasets
        from cptsim.models.graph import bind_graph

        train_set, _, info = load_datasets(GRAPH, None)
        x, y = train_set.gather([0], "cpu")

        def build():
            torch.manual_seed(0)
            m = create_model(name, num_classes=info.num_classes, in_channels=info.input_shape[0],
                             input_shape=tuple(info.input_shape))
            bind_graph(m, train_set.graph.edge_index)
            return m
        return build, x, y, class_cross_entropy
    if name.split(":")[0] in ("transformer-lm", "lstm-lm"):
        batch, T = PATH_SHAPES[name.split(":")[0]]
        x, y = torch.randint(0, vocab, (batch, T)), torch.randint(0, vocab, (batch, T))

        def build():
            torch.manual_seed(0)
            return create_model(name, num_classes=vocab, input_shape=(T,))
        return build, x, y, class_cross_entropy
    batch = PATH_SHAPES.get(name, 128)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))

    def build():
        torch.manual_seed(0)
        return create_model(name, num_classes=10, in_channels=3, input_shape=(3, 32, 32))
    return build, x, y, class_cross_entropy


def _timed(fn, reps: int = 5) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _linear_calls(model, x) -> dict:
    """{(tokens, in, out): calls} of the quantized Linear layers in one forward (an LSTM's hidden-to-hidden layer:
    one call per time step)."""
    from collections import Counter

    calls: Counter = Counter()
    hooks = [m.register_forward_hook(lambda mod, i, o: calls.update(
        [(i[0].numel() // mod.weight.shape[1], mod.weight.shape[1], mod.weight.shape[0])]))
        for m in model.modules() if getattr(m, "_exact_capable", False) and hasattr(m, "precision")]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    return dict(calls)


def _gemm_bound(model, x, fp32_s: float, bits: int, grad_bits: int) -> dict:
    """The exact path's bound (module docstring): each recorded Linear call's three GEMMs timed alone, FP32 vs int8."""
    from cptsim.numerics import exact_gemm

    rows, fp_moved, i8_moved, fp_all, i8_all = [], 0.0, 0.0, 0.0, 0.0
    for (t, k, n), count in sorted(_linear_calls(model, x).items()):
        a, w, g = torch.randn(t, k), torch.randn(n, k), torch.randn(t, n)
        ai, wi = torch.randint(-128, 128, (t, k), dtype=torch.int8), torch.randint(-128, 128, (k, n), dtype=torch.int8)
        gi = torch.randint(-128, 128, (t, n), dtype=torch.int8)
        wti = wi.t().contiguous()
        f = {"fwd": _timed(lambda: torch.mm(a, w.t())), "dgrad": _timed(lambda: torch.mm(g, w)),
             "wgrad": _timed(lambda: torch.mm(g.t(), a))}
        i = {"fwd": _timed(lambda: torch._int_mm(ai, wi)), "dgrad": _timed(lambda: torch._int_mm(gi, wti)),
             "wgrad": _timed(lambda: torch._int_mm(gi.t(), ai))}
        fwd8 = exact_gemm.forward_path(bits, k) == exact_gemm.INT8
        wg8 = exact_gemm.wgrad_path(bits, grad_bits, t) == exact_gemm.INT8
        fp_moved += count * ((f["fwd"] if fwd8 else 0) + (f["wgrad"] if wg8 else 0))
        i8_moved += count * ((i["fwd"] if fwd8 else 0) + (i["wgrad"] if wg8 else 0))
        fp_all += count * sum(f.values())
        i8_all += count * sum(min(i[p], f[p]) for p in f)
        rows.append({"tokens": t, "in": k, "out": n, "calls": count,
                     **{f"fp32_{p}_ms": round(f[p] * 1e3, 3) for p in f},
                     **{f"int8_{p}_ms": round(i[p] * 1e3, 3) for p in i}})
    return {"linear_gemms": rows,
            "fp32_linear_gemm_ms": round(fp_all * 1e3, 1),
            "bound_exact": round((fp32_s - fp_moved + i8_moved) / fp32_s, 3),
            "bound_all_int8": round((fp32_s - fp_all + i8_all) / fp32_s, 3)}


def paths_bench(name: str, vocab: int, rounds: int, bits: int, grad_bits: int, device: str) -> dict:
    from cptsim.models import default_fp_layers

    build, x, y, loss_fn = _workload(name, vocab)
    dev = torch.device(device)
    x, y = x.to(dev), y.to(dev)
    cuda = dev.type == "cuda"
    base = build()
    kinds = ["fp32", "fake", "exact"] + (["amp"] if cuda else [])
    env = {"fake": "0", "exact": "1"}
    copies = {}
    for k in kinds:
        m = build()
        m.load_state_dict(base.state_dict())
        if k in env:
            quantize_model(m, fp_layers=default_fp_layers(m)).set(bits, grad_bits)
        m.to(dev).train()
        copies[k] = (m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9))
    scaler = torch.amp.GradScaler("cuda") if cuda else None

    def step(k) -> float:
        m, opt = copies[k]
        if k in env:
            os.environ["CPTSIM_EXACT_GEMM"] = env[k]
        try:
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.float16, enabled=k == "amp"):
                loss = loss_fn(m(x), y)
            opt.zero_grad(set_to_none=True)
            if k == "amp":
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            if cuda:
                torch.cuda.synchronize()
            return time.perf_counter() - t0
        finally:
            os.environ.pop("CPTSIM_EXACT_GEMM", None)

    times: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(3 + rounds):  # 3 warm-up rounds; the order reverses every round
        for k in (kinds if r % 2 == 0 else kinds[::-1]):
            t = step(k)
            if r >= 3:
                times[k].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    ex = copies["exact"][0]
    paths = [p for mod in ex.modules() if isinstance(p := mod.__dict__.get("gemm_path"), dict)]
    exact_name = "tf32-int-codes" if cuda else "int8-exact"
    res = {"model": name, "device": str(dev), "threads": torch.get_num_threads(), "rounds": rounds,
           "bits": bits, "grad_bits": grad_bits, "input": list(x.shape),
           **{f"{k}_step_ms": round(v * 1e3, 1) for k, v in med.items()},
           **{f"{k}_over_fp32": round(v / med["fp32"], 3) for k, v in med.items() if k != "fp32"},
           "exact_over_fake": round(med["exact"] / med["fake"], 3),
           "exact_over_fp32_paired_median": round(statistics.median(
               e / f for f, e in zip(times["fp32"], times["exact"])), 3),
           "exact_layers": f"{sum(1 for p in paths if p.get('forward') == exact_name)}/{len(paths)} ({exact_name})"}
    if cuda:
        res["exact_over_amp"] = round(med["exact"] / med["amp"], 3)
    else:
        res.update(_gemm_bound(copies["exact"][0], x, med["fp32"], bits, grad_bits))
    return res


def _path_memory_child(name: str, kind: str, vocab: int, bits: int, grad_bits: int) -> None:
    """In a fresh process (1 thread, CPU): two training steps of ``name`` on GEMM path ``kind`` (fp32, fake, exact);
    prints the max RSS above the RSS just before them, in MB."""
    from cptsim.models import default_fp_layers
    from cptsim.numerics import ckernels

    torch.set_num_threads(1)
    ckernels.library()
    os.environ["CPTSIM_EXACT_GEMM"] = "1" if kind == "exact" else "0"
    build, x, y, loss_fn = _workload(name, vocab)
    m = build()
    if kind != "fp32":
        quantize_model(m, fp_layers=default_fp_layers(m)).set(bits, grad_bits)
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)

    def status_mb(key: str) -> float:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024

    base = status_mb("VmRSS")
    for _ in range(2):
        loss = loss_fn(m(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    print(json.dumps({"extra_mb": status_mb("VmHWM") - base}))


def _path_memory(a, name: str) -> dict:
    """Peak memory of each path (``--path-memory N``): N fresh processes per path, the order alternating, medians,
    with glibc's mmap threshold fixed (MALLOC_MODES["fixed"]: the figure is the memory the steps hold)."""
    import subprocess
    import sys

    kinds = ["fp32", "fake", "exact"]
    mb: dict[str, list[float]] = {k: [] for k in kinds}
    for i in range(a.path_memory):
        for k in (kinds if i % 2 == 0 else kinds[::-1]):
            env = dict(os.environ, **MALLOC_MODES["fixed"])
            out = subprocess.run([sys.executable, __file__, "--path-memory-child", name, k, "--vocab", str(a.vocab),
                                  "--bits", str(a.bits), "--grad-bits", str(a.grad_bits)],
                                 check=True, capture_output=True, text=True, env=env).stdout
            mb[k].append(json.loads(out.strip().splitlines()[-1])["extra_mb"])
    return {f"{k}_peak_mb": round(statistics.median(v), 1) for k, v in mb.items()}


def paths_main(a) -> None:
    out = [paths_bench(n, a.vocab, a.rounds, a.bits, a.grad_bits, a.device) for n in a.models]
    if a.path_memory > 0:
        for r in out:
            r.update(_path_memory(a, r["model"]))
    if a.json:
        print(json.dumps(out, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    cuda = a.device.startswith("cuda")
    t = Table(title=f"quantized ({a.bits}/{a.grad_bits}) training steps by GEMM path, {out[0]['threads']} threads, "
                    f"{a.device}: medians of {a.rounds} alternating rounds")
    mem = a.path_memory > 0
    for c in ["model", "FP32 ms", "fake/FP32", "exact/FP32", "exact/fake", "exact layers"] + (
            ["AMP/FP32", "exact/AMP"] if cuda else ["floor/FP32", "floor, dgrad int8"]) + (
            ["peak MB fp32 / fake / exact"] if mem else []):
        t.add_column(c, justify="left" if c == "model" else "right", no_wrap=True)
    for r in out:
        row = [r["model"], f"{r['fp32_step_ms']:.1f}", f"{r['fake_over_fp32']:.3f}", f"{r['exact_over_fp32']:.3f}",
               f"{r['exact_over_fake']:.3f}", r["exact_layers"].split(" ")[0]]
        if cuda:
            row += [f"{r['amp_over_fp32']:.3f}", f"{r['exact_over_amp']:.3f}"]
        else:
            row += [f"{r['bound_exact']:.3f}", f"{r['bound_all_int8']:.3f}"]
        if mem:
            row.append(f"{r['fp32_peak_mb']:.0f} / {r['fake_peak_mb']:.0f} / {r['exact_peak_mb']:.0f}")
        t.add_row(*row)
    Console(width=200).print(t)
    print(f"exact: {'the integer codes on TF32' if cuda else 'int8 torch._int_mm'} (CPTSIM_EXACT_GEMM=1)"
          + ("" if cuda else "; floor: the FP32 step with the exact path's int8 GEMMs at their own measured "
             "torch._int_mm time and the quantizers free -- no exact step with these GEMM rules is faster here; "
             "'dgrad int8': the same with dgrad in int8 too (one weight scale per tensor would allow it)"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--bits", type=int, default=8)
    ap.add_argument("--grad-bits", type=int, default=8)
    ap.add_argument("--memory-pairs", type=int, default=3)
    ap.add_argument("--memory-child", choices=("fp32", "quant"), help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--no-eager", action="store_true", help="skip the eager-quantizer copy")
    ap.add_argument("--no-floor", action="store_true", help="skip the floor copy (quantizers replaced by copies)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--models", nargs="+", help="GEMM-path mode (see above): e.g. resnet20 transformer-lm lstm-lm gcn")
    ap.add_argument("--vocab", type=int, default=10000, help="GEMM-path mode: the LMs' vocabulary")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="GEMM-path mode")
    ap.add_argument("--path-memory", type=int, default=0, metavar="N",
                    help="GEMM-path mode, CPU: peak memory of two steps per path, N fresh processes each (1 thread)")
    ap.add_argument("--path-memory-child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.path_memory_child:
        _path_memory_child(*a.path_memory_child, a.vocab, a.bits, a.grad_bits)
        return
    if a.models:
        paths_main(a)
        return
    if a.memory_child:
        _memory_child(a.model, a.batch_size, a.bits, a.grad_bits, a.memory_child == "quant")
        return

    torch.manual_seed(0)
    shape = (1, 8, 8) if a.model == "digits-cnn" else (3, 32, 32)
    fp = create_model(a.model, num_classes=10, in_channels=shape[0], input_shape=shape)
    q = create_model(a.model, num_classes=10, in_channels=shape[0], input_shape=shape)
    q.load_state_dict(fp.state_dict())
    quantize_model(q).set(a.bits, a.grad_bits)
    opt_fp = torch.optim.SGD(fp.parameters(), lr=0.01, momentum=0.9)
    opt_q = torch.optim.SGD(q.parameters(), lr=0.01, momentum=0.9)
    e = create_model(a.model, num_classes=10, in_channels=shape[0], input_shape=shape)
    e.load_state_dict(fp.state_dict())
    quantize_model(e).set(a.bits, a.grad_bits)
    opt_e = torch.optim.SGD(e.parameters(), lr=0.01, momentum=0.9)
    fl = create_model(a.model, num_classes=10, in_channels=shape[0], input_shape=shape)
    fl.load_state_dict(fp.state_dict())
    quantize_model(fl).set(a.bits, a.grad_bits)
    opt_fl = torch.optim.SGD(fl.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(a.batch_size, *shape)
    y = torch.randint(0, 10, (a.batch_size,))
    from cptsim.numerics import ckernels

    kern = ckernels.status()
    floor = not a.no_floor and kern["in_use"]  # the floor stands in for the kernels: without them it means nothing

    def eager_step() -> float:
        os.environ["CPTSIM_CKERNELS"] = "0"
        try:
            return _step(e, opt_e, x, y)
        finally:
            os.environ.pop("CPTSIM_CKERNELS")

    def floor_step() -> float:
        with _CopyQuantizers():
            return _step(fl, opt_fl, x, y)

    steps = {"fp": lambda: _step(fp, opt_fp, x, y), "q": lambda: _step(q, opt_q, x, y)}
    if not a.no_eager:
        steps["e"] = eager_step
    if floor:
        steps["floor"] = floor_step
    times: dict[str, list[float]] = {k: [] for k in steps}
    for r in range(3 + a.rounds):  # 3 warm-up rounds: allocator, oneDNN primitive caches
        for k in (list(steps) if r % 2 == 0 else list(steps)[::-1]):
            t = steps[k]()
            if r >= 3:
                times[k].append(t)
    t_fp, t_q, t_e = times["fp"], times["q"], times.get("e", [])
    med_fp, med_q = statistics.median(t_fp), statistics.median(t_q)
    res = {
        "model": a.model, "batch_size": a.batch_size, "bits": a.bits, "grad_bits": a.grad_bits,
        "threads": torch.get_num_threads(), "rounds": a.rounds,
        "quantizers": "C kernels (cptsim.numerics.ckernels)" if kern["in_use"] else f"eager ({kern['why_not']})",
        "fp32_step_ms": round(med_fp * 1e3, 2), "quant_step_ms": round(med_q * 1e3, 2),
        "ratio": round(med_q / med_fp, 3),
        "ratio_paired_median": round(statistics.median(q_ / f_ for f_, q_ in zip(t_fp, t_q)), 3),
        "ratio_spread": [round(min(q_ / f_ for f_, q_ in zip(t_fp, t_q)), 3),
                         round(max(q_ / f_ for f_, q_ in zip(t_fp, t_q)), 3)],
    }
    if t_e:
        res["eager_quant_step_ms"] = round(statistics.median(t_e) * 1e3, 2)
        res["ratio_eager"] = round(statistics.median(t_e) / med_fp, 3)
    if floor:
        t_fl = times["floor"]
        res["floor_step_ms"] = round(statistics.median(t_fl) * 1e3, 2)
        res["ratio_floor"] = round(statistics.median(t_fl) / med_fp, 3)
        res["ratio_floor_paired_median"] = round(statistics.median(c / f_ for f_, c in zip(t_fp, t_fl)), 3)
        res["quant_over_floor_paired_median"] = round(statistics.median(q_ / c for c, q_ in zip(t_fl, t_q)), 3)
    res["extra_ms_by_op"] = _breakdown(fp, opt_fp, q, opt_q, x, y)
    if a.memory_pairs > 0:
        res["peak_memory"] = _memory(a, a.memory_pairs)
    if a.json:
        print(json.dumps(res, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{a.model}, batch {a.batch_size}, {res['threads']} threads: quantized ({a.bits}/{a.grad_bits}) vs FP32 step")
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("FP32 step (median)", f"{res['fp32_step_ms']:.1f} ms")
    t.add_row("quantized step (median)", f"{res['quant_step_ms']:.1f} ms")
    t.add_row("quantizers", res["quantizers"])
    t.add_row("[bold]ratio quantized / FP32", f"[bold]{res['ratio']:.3f}x")
    t.add_row("  median of the rounds' ratios (min..max)",
              f"{res['ratio_paired_median']:.3f}x ({res['ratio_spread'][0]:.2f}..{res['ratio_spread'][1]:.2f})")
    if "ratio_eager" in res:
        t.add_row("eager quantizers' step (median), same rounds", f"{res['eager_quant_step_ms']:.1f} ms")
        t.add_row("ratio eager quantized / FP32", f"{res['ratio_eager']:.3f}x")
    if "ratio_floor" in res:
        t.add_row("floor: quantizers as plain copies (median)", f"{res['floor_step_ms']:.1f} ms")
        t.add_row("ratio floor / FP32 (median of the rounds' ratios)",
                  f"{res['ratio_floor']:.3f}x ({res['ratio_floor_paired_median']:.3f}x)")
        t.add_row("  quantized / floor, median of the rounds' ratios", f"{res['quant_over_floor_paired_median']:.3f}x")
    for k, v in res["extra_ms_by_op"].items():
        t.add_row(f"  extra time in {k}", f"{v:+.1f} ms")
    if "peak_memory" in res:
        for mode, label in (("fixed", "fixed mmap threshold"), ("default", "glibc default malloc")):
            pm = res["peak_memory"][mode]
            t.add_row(f"max RSS above pre-step, {label}: FP32 / quantized (medians)",
                      f"{pm['fp32_extra_mb_median']:.0f} / {pm['quant_extra_mb_median']:.0f} MB")
            t.add_row(f"[bold]  extra peak memory, {label}", f"[bold]{pm['extra_pct']:+.1f}%")
            t.add_row("    median of the pairs' ratios", f"{pm['extra_pct_paired_median']:+.1f}%")
            if "eager_extra_pct" in pm:
                t.add_row("    eager quantizers", f"{pm['eager_extra_pct']:+.1f}%")
    Console().print(t)


if __name__ == "__main__":
    main()

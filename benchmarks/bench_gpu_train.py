"""Whole training steps on one GPU, in one process: AMP vs FP32 vs each quantized route, and `cptsim train`'s step
against its own CUDA graph's replay.

    python benchmarks/bench_gpu_train.py [--models resnet50 resnet20 transformer-lm lstm-lm gcn] [--rounds 5]
        [--device cuda] [--batch-size N] [--steps-per-round 3] [--cases amp,fp32,...] [--train-steps 60]
        [--no-train] [--budget SECONDS] [--threads N] [--json] [--out FILE] [--from-json FILE]

Per model, copies with the same initial weights take whole training steps (forward, loss, backward, SGD update
with momentum and weight decay, in torch.optim's implementation `cptsim train` uses there: fused on CUDA, foreach on
a CPU) on one fixed batch, in rounds whose case order reverses every round; each case's figure is the median over
the rounds of its mean step over ``--steps-per-round`` consecutive steps, timed from a synchronised start to a
synchronised end (steady state: the first rounds, which compile kernels and fill caches, are left out).

The cases (a route is chosen when a layer is called, from the environment, so each case sets it before its steps):

    amp         the unquantized model under torch.autocast(float16) with a GradScaler (CUDA only)
    fp32        the unquantized model in FP32 (torch's default TF32 settings: convolutions TF32, matmuls not)
    fq-triton   quantized 8/8 on the fake-quant GEMMs, quantizers as Triton kernels
                (CPTSIM_QUANT_KERNELS=triton CPTSIM_EXACT_GEMM=0)
    fq-compile  the same with the quantizers through torch.compile (CPTSIM_QUANT_KERNELS=compile)
    fq-eager    the same with the eager quantizer formulas (CPTSIM_QUANT_KERNELS=eager; a CPU's own quantizers)
    codes       quantized 8/8, GEMMs on the integer codes (CPTSIM_EXACT_GEMM=1)
    int8        quantized 8/8, GEMMs on int8 tensor cores where exact (CPTSIM_EXACT_GEMM=int8)

Every row says which GEMM routes the quantized layers took (what they record as ``gemm_path``) and which quantizers
fell back to a slower path (``cptsim.numerics.quant.fallbacks``), so that a case whose setting this checkout does
not know shows it ran something else. The ratio column is to AMP (to FP32 where there is no AMP).

Models (the model's default full-precision layers, as `cptsim train` keeps them): torchvision ResNet-50 (ImageNet
shapes, batch 128), resnet20 (CIFAR shapes, 128), transformer-lm (16 x 256 tokens), lstm-lm (Zaremba medium, 20 x
35), gcn (full batch on synthetic-graph:20000,128,40:14); vocabularies 10,000.

`train` (unless --no-train): `cptsim train` itself, resnet20 at batch 128 on synthetic CIFAR-shaped data for
``--train-steps`` steps of ``--train-schedule`` (default static:8:g8), then the CUDA graph that run captured, replayed
alone (and replayed with the run's own optimizer step): the run's median step (trace time_s, warm-up steps out)
against the graph's. On a CPU there is no graph: the run's median step only.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from bench_quant_step import GRAPH, PATH_SHAPES, _workload  # noqa: E402 - the same workloads, one definition

from cptsim.models import create_model, default_fp_layers  # noqa: E402
from cptsim.models.loss import class_cross_entropy  # noqa: E402
from cptsim.numerics.layers import quantize_model  # noqa: E402

MODELS = ("resnet50", "resnet20", "transformer-lm", "lstm-lm", "gcn")
VOCAB = 10000
ROUTE_ENV = ("CPTSIM_QUANT_KERNELS", "CPTSIM_EXACT_GEMM")
# name -> (quantized?, autocast?, the environment its steps run under)
CASES = {
    "amp": (False, True, {}),
    "fp32": (False, False, {}),
    "fq-triton": (True, False, {"CPTSIM_QUANT_KERNELS": "triton", "CPTSIM_EXACT_GEMM": "0"}),
    "fq-compile": (True, False, {"CPTSIM_QUANT_KERNELS": "compile", "CPTSIM_EXACT_GEMM": "0"}),
    "fq-eager": (True, False, {"CPTSIM_QUANT_KERNELS": "eager", "CPTSIM_EXACT_GEMM": "0"}),
    "codes": (True, False, {"CPTSIM_EXACT_GEMM": "1"}),
    "int8": (True, False, {"CPTSIM_EXACT_GEMM": "int8"}),
}
BITS = (8, 8)


def skipped_here(case: str, device: torch.device) -> str | None:
    """Why ``case`` does not run on ``device`` (None: it does)."""
    if device.type == "cuda":
        return None
    if case == "amp":
        return "autocast float16 with a GradScaler needs CUDA"
    if case in ("fq-triton", "fq-compile"):
        return "the quantizer routes CPTSIM_QUANT_KERNELS chooses are a GPU's; a CPU runs its own (fq-eager)"
    return None


def workload(name: str, batch: int | None):
    """(a builder of the model, x, y, the batch size as a label) of one of MODELS."""
    if name == "gcn":  # full batch: bench_quant_step's graph workload as it is
        build, x, y, _ = _workload(name, VOCAB)
        return build, x, y, 1
    torch.manual_seed(0)
    if name in ("transformer-lm", "lstm-lm"):
        b, t = PATH_SHAPES[name]
        b = batch or b
        x, y = torch.randint(0, VOCAB, (b, t)), torch.randint(0, VOCAB, (b, t))
        return (lambda: (torch.manual_seed(0), create_model(name, num_classes=VOCAB, input_shape=(t,)))[1]), x, y, b
    spec = {"resnet50": ("torchvision:resnet50", (3, 224, 224), 1000), "resnet20": ("resnet20", (3, 32, 32), 10)}
    model, shape, classes = spec[name]
    b = batch or 128
    x, y = torch.randn(b, *shape), torch.randint(0, classes, (b,))

    def build():
        torch.manual_seed(0)
        return create_model(model, num_classes=classes, in_channels=shape[0], input_shape=shape)
    return build, x, y, b


class routes_env:
    """The case's route settings in os.environ for the duration (the layers read them at call time)."""

    def __init__(self, env: dict):
        self.env = env

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in ROUTE_ENV}
        for k in ROUTE_ENV:
            os.environ.pop(k, None)
        os.environ.update(self.env)

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def optimizer(params, device: torch.device):
    """SGD as `cptsim train` steps it on this device (cptsim.run.train.optimizer_impl)."""
    from cptsim.run.train import optimizer_impl

    impl = {"fused": True} if optimizer_impl(str(device)) == "fused" else {"foreach": True}
    return torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=5e-4, **impl)


def observed_routes(model) -> dict:
    """{forward route: layers} of the quantized layers' last calls (``gemm_path``, where a route records one)."""
    from collections import Counter

    seen = Counter(m.__dict__["gemm_path"].get("forward") for m in model.modules()
                   if isinstance(m.__dict__.get("gemm_path"), dict))
    return dict(seen)


def fallbacks() -> dict | list | None:
    from cptsim.numerics import quant

    fn = getattr(quant, "fallbacks", None)
    return (fn() or None) if callable(fn) else None


def clear_fallbacks() -> None:
    from cptsim.numerics import quant

    fn = getattr(quant, "clear_fallbacks", None)
    if callable(fn):
        fn()


def model_bench(name: str, a, device: torch.device, cases: list[str]) -> dict:
    build, x, y, batch = workload(name, a.batch_size)
    x, y = x.to(device), y.to(device)
    cuda = device.type == "cuda"
    base = build()
    row = {"model": name, "batch_size": batch, "input": list(x.shape), "cases": {}, "skipped": {}}
    copies = {}
    for case in cases:
        why = skipped_here(case, device)
        if why is not None:
            row["skipped"][case] = why
            continue
        quantized, amp, env = CASES[case]
        m = build()
        m.load_state_dict(base.state_dict())
        if quantized:
            quantize_model(m, fp_layers=default_fp_layers(m)).set(*BITS)
        m.to(device).train()
        scaler = torch.amp.GradScaler("cuda") if amp else None
        copies[case] = (m, optimizer([p for p in m.parameters() if p.requires_grad], device), amp, scaler, env)
    del base

    def steps(case: str, n: int) -> float:
        m, opt, amp, scaler, env = copies[case]
        with routes_env(env):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
                    loss = class_cross_entropy(m(x), y)
                opt.zero_grad(set_to_none=True)
                if scaler is not None:
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
                else:
                    loss.backward()
                    opt.step()
            if cuda:
                torch.cuda.synchronize()
            return (time.perf_counter() - t0) / n

    warm = a.warmup if a.warmup is not None else (2 if cuda else 1)
    times: dict[str, list[float]] = {c: [] for c in copies}
    for case in list(copies):  # the first step alone: a route that cannot run here says so and leaves the table
        clear_fallbacks()
        try:
            steps(case, 1)
        except Exception as e:  # noqa: BLE001 - one case failing must not cost the others' figures
            row["skipped"][case] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            del copies[case], times[case]
            continue
        m = copies[case][0]
        row["cases"][case] = {"env": CASES[case][2], "routes": observed_routes(m), "fallbacks": fallbacks()}
    order = list(copies)
    for r in range(warm + a.rounds):
        for case in (order if r % 2 == 0 else order[::-1]):
            t = steps(case, a.steps_per_round)
            if r >= warm:
                times[case].append(t)
    ref = "amp" if "amp" in times else "fp32" if "fp32" in times else None
    for case, ts in times.items():
        ms = statistics.median(ts) * 1e3
        row["cases"][case].update({"ms": round(ms, 3), "rounds_ms": [round(t * 1e3, 3) for t in ts]})
    if ref is not None:
        for case in times:
            row["cases"][case][f"over_{ref}"] = round(row["cases"][case]["ms"] / row["cases"][ref]["ms"], 3)
    row["reference"] = ref
    del copies
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return row


# `cptsim train` workloads with the shapes of model_bench's (so its step compares with that model's AMP step): the
# CIFAR ResNet on synthetic CIFAR-shaped data and the GCN on the same synthetic graph, both with SGD as there. The
# language models are left out: no dataset of the bench's random 10,000-token vocabulary exists to train on.
TRAIN_MODELS = ("resnet20", "gcn")


def train_vs_graph(a, device: torch.device, model: str = "resnet20") -> dict:
    """`cptsim train` on ``model`` (TRAIN_MODELS) and the CUDA graph it captured, replayed alone."""
    from cptsim.run import train as T

    batch = 1 if model == "gcn" else (a.batch_size or 128)
    made = []
    init = T._Training.__init__

    def keep(self, *args, **kw):  # the run's loop object: its graphs and optimizer outlive the run here
        init(self, *args, **kw)
        made.append(self)

    dataset = GRAPH if model == "gcn" else f"synthetic:3,32,32:10:{batch * a.train_steps}"
    cfg = T.TrainConfig(model=model, dataset=dataset, schedule=a.train_schedule, steps=a.train_steps,
                        batch_size=batch, device=str(device), optimizer="sgd", lr=0.1,
                        recal_batches=0, lr_schedule="constant", keep_checkpoints=1, threads=a.threads)
    T._Training.__init__ = keep
    try:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            run = T.train(cfg, str(Path(tmp) / "run"), progress=False)
            wall = time.perf_counter() - t0
            trace = run.read_trace().records
            config = run.read_config()
    finally:
        T._Training.__init__ = init
    steady = [r for r in trace if not r.get("warmup")] or trace
    graphed = [r for r in steady if r.get("graph")]
    timed = graphed or steady
    out = {"model": model, "batch_size": batch, "schedule": a.train_schedule, "steps": len(trace),
           "steady_steps": len(steady), "graphed_steps": len(graphed), "wall_s": round(wall, 2),
           "median_step_ms": round(statistics.median(r["time_s"] for r in timed) * 1e3, 3),
           "paths": sorted({r["path"] for r in trace if "path" in r}),
           "optimizer_impl": (config.get("host") or {}).get("optimizer_impl", T.optimizer_impl(str(device))),
           "quantizer_fallbacks": (config.get("host") or {}).get("quantizer_fallbacks"),
           "graph_replay_ms": None, "graph_replay_with_optimizer_ms": None, "per_bits": []}
    loop = made[-1] if made else None
    graphs = getattr(loop, "graphs", None)
    if device.type != "cuda" or graphs is None or not graphs.graphs:
        return out
    n = a.replays
    for key, g in graphs.graphs.items():
        bits = key[4]
        mine = [r["time_s"] for r in graphed if r["bits"] == bits]

        def timed_replays(with_opt: bool) -> float:
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(n):
                g.graph.replay()
                if with_opt:
                    loop.opt.step()
            e1.record()
            e1.synchronize()
            return e0.elapsed_time(e1) / n

        timed_replays(True)  # warm
        replay, with_opt = timed_replays(False), timed_replays(True)
        train_ms = round(statistics.median(mine) * 1e3, 3) if mine else None
        out["per_bits"].append({"bits": bits, "grad_bits": key[5], "train_median_ms": train_ms,
                                "replay_ms": round(replay, 3), "replay_with_optimizer_ms": round(with_opt, 3)})
    rows = [p for p in out["per_bits"] if p["train_median_ms"] is not None]
    if rows:  # the graphed steps' median against the replay of the graph most of them ran
        top = max(rows, key=lambda p: sum(1 for r in graphed if r["bits"] == p["bits"]))
        out["graph_replay_ms"] = top["replay_ms"]
        out["graph_replay_with_optimizer_ms"] = top["replay_with_optimizer_ms"]
        out["train_over_replay"] = round(out["median_step_ms"] / top["replay_ms"], 3)
        out["train_over_replay_with_optimizer"] = round(out["median_step_ms"] / top["replay_with_optimizer_ms"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated, from: " + ", ".join(CASES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=None, help="rounds left out first (default 2 on CUDA, 1 on a CPU)")
    ap.add_argument("--steps-per-round", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=None, help="every model's batch (default: each its own)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-train", action="store_true", help="leave out cptsim train's step vs its graph")
    ap.add_argument("--train-steps", type=int, default=60)
    ap.add_argument("--train-models", nargs="+", default=list(TRAIN_MODELS), choices=TRAIN_MODELS,
                    help="the cptsim train runs timed (their step against their graph and the model's AMP step)")
    ap.add_argument("--train-schedule", default="static:8:g8")
    ap.add_argument("--replays", type=int, default=50, help="replays of the run's graph timed together")
    ap.add_argument("--budget", type=float, default=0.0,
                    help="seconds: start no further model past this (0: no limit); the train part runs first")
    ap.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: torch's)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", metavar="FILE", help="also write the JSON here, after every model (a run cut short by a "
                    "time limit keeps what it measured)")
    ap.add_argument("--from-json", metavar="FILE", help="print the table of a --json output and exit")
    a = ap.parse_args()
    if a.from_json:
        doc = json.loads(Path(a.from_json).read_text())
        show(doc, list(CASES))
        return
    if a.threads:
        torch.set_num_threads(a.threads)
    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad:
        ap.error(f"unknown case(s) {', '.join(bad)}; the cases: {', '.join(CASES)}")
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA GPU here")
    t_start = time.perf_counter()
    doc = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "rounds": a.rounds, "steps_per_round": a.steps_per_round,
           "bits": list(BITS), "models": [], "not_run": []}
    # the train part first (short), so that a time limit that cuts the models short never costs it
    runs = [] if a.no_train else [train_vs_graph(a, device, m) for m in a.train_models]
    doc["train_runs"] = runs
    doc["train"] = next((r for r in runs if r["model"] == "resnet20"), runs[0] if runs else None)
    save(doc, a.out)
    for name in a.models:
        if a.budget and time.perf_counter() - t_start > a.budget:
            doc["not_run"].append(name)
            continue
        t0 = time.perf_counter()
        row = model_bench(name, a, device, cases)
        row["seconds"] = round(time.perf_counter() - t0, 1)
        doc["models"].append(row)
        print(f"{name}: {row['seconds']} s", file=sys.stderr)
        save(doc, a.out)
    for r in runs:  # cptsim train's quantized step against the same model's AMP step in the bench
        amp = next((m["cases"].get("amp") for m in doc["models"] if m["model"] == r["model"]), None)
        r["amp_ms"] = amp["ms"] if amp else None
        r["train_over_amp"] = round(r["median_step_ms"] / amp["ms"], 3) if amp and amp.get("ms") else None
    doc["seconds"] = round(time.perf_counter() - t_start, 1)
    save(doc, a.out)
    if a.json:
        print(json.dumps(doc, indent=2))
        return
    show(doc, cases)


def save(doc: dict, path: str | None) -> None:
    if path:
        from cptsim.fileio import atomic_write_json

        atomic_write_json(Path(path), doc)


def show(doc: dict, cases: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"whole training steps on {doc['device']}, quantized {doc['bits'][0]}/{doc['bits'][1]}: ms/step "
                    f"(ratio to AMP, or to FP32 without AMP), medians of {doc['rounds']} rounds")
    t.add_column("model")
    t.add_column("batch", justify="right")
    shown = [c for c in cases if any(c in r["cases"] for r in doc["models"])]
    for c in shown:
        t.add_column(c, justify="right")
    for r in doc["models"]:
        cells = []
        for c in shown:
            got = r["cases"].get(c)
            ratio = got.get(f"over_{r['reference']}") if got else None
            cells.append("-" if got is None else f"{got['ms']:.1f}" + (f" ({ratio:.2f}x)" if ratio is not None else ""))
        t.add_row(r["model"], str(r["batch_size"]), *cells)
    Console(width=220).print(t)
    for r in doc["models"]:
        for c, got in r["cases"].items():
            if got.get("routes") or got.get("fallbacks"):
                print(f"  {r['model']} {c}: routes {got['routes']}" + (f"; fallbacks {got['fallbacks']}"
                                                                       if got.get("fallbacks") else ""))
        for c, why in r["skipped"].items():
            print(f"  {r['model']} {c}: not run ({why})")
    if doc["not_run"]:
        print(f"not run (past --budget): {', '.join(doc['not_run'])}")
    for tr in doc.get("train_runs") or ([doc["train"]] if doc.get("train") else []):
        line = (f"cptsim train {tr['model']} b{tr['batch_size']} {tr['schedule']}: "
                f"median step {tr['median_step_ms']:.3f} ms "
                f"({tr['graphed_steps']} graphed of {tr['steps']} steps, optimizer {tr['optimizer_impl']})")
        if tr["graph_replay_ms"] is not None:
            line += (f"; its graph replays in {tr['graph_replay_ms']:.3f} ms ({tr['train_over_replay']:.3f}x), "
                     f"with the optimizer step {tr['graph_replay_with_optimizer_ms']:.3f} ms "
                     f"({tr['train_over_replay_with_optimizer']:.3f}x)")
        if tr.get("train_over_amp") is not None:
            line += f"; the bench's AMP step {tr['amp_ms']:.3f} ms: train / AMP {tr['train_over_amp']:.3f}x"
        print(line)


if __name__ == "__main__":
    main()

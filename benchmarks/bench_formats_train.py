"""Number formats in training (issue 26, item 5, the digits half): BF16, static FP8, static MXFP8 / MXFP4, CPT-style
MXFP4<->MXFP8 cycles, and INT 4 / 8 / 4-8 on the embedded digits workload (digits-cnn), several seeds each; test
accuracy at the end of training (evaluated at the schedule's q_max, after BatchNorm re-estimation, as every cptsim
run) and the modelled time and energy of each run's executed trace on a B200 profile (hw_profiles/b200.toml: the
GEMMs on the narrowest tier holding both operands' formats; BitOPs at element bits).

Every run is real FP32 fake-quantized training on the CPU (cptsim.run.train, one torch thread per run, runs side by
side in --jobs processes). Float formats: forward RNE, errors stochastically rounded (cptsim.numerics.formats).

    python benchmarks/bench_formats_train.py                      # the table (8 recipes x 3 seeds)
    python benchmarks/bench_formats_train.py --epochs 4 --seeds 0 --json

Columns: recipe, its schedule and family, the formats its widths named, test accuracy mean +- std over the seeds
(and each seed), BitOPs relative to BF16, modelled B200 latency and energy of the whole run, relative to BF16.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

# recipe -> (schedule, number format family, gradient format or None)
RECIPES = {
    "BF16": ("static:16:g16", "fp", None),
    "FP8 (E4M3 / E5M2 grads)": ("static:8:g8", "fp", "fp8e5m2"),
    "MXFP8": ("static:8:g8", "mx", None),
    "MXFP4 (MXFP8 grads)": ("static:4:g8", "mx", None),
    "MX cycles 4-8 (cos-rep n8)": ("cpt:4-8:g8:n8", "mx", None),
    "INT8": ("static:8:g8", "int", None),
    "INT4": ("static:4:g8", "int", None),
    "INT cycles 4-8 (cos-rep n8)": ("cpt:4-8:g8:n8", "int", None),
}
HW = "b200"
KEYS = ("bitops", "latency_s", "energy_j", "gemm_s", "gemm_j", "train_loss")


def _one(args) -> dict:
    recipe, schedule, family, grad, seed, epochs, root, model, steps = args
    import torch

    torch.set_num_threads(1)
    from cptsim.cost.model import estimate
    from cptsim.numerics.families import format_map
    from cptsim.run.rundir import RunDir, run_summary
    from cptsim.run.train import TrainConfig, train

    out = Path(root) / (("" if model == "digits-cnn" else f"{model}-") +
                        f"{recipe.split()[0].replace('/', '_')}-{family}-{schedule.replace(':', '_')}-s{seed}")
    t0 = time.perf_counter()
    cfg = TrainConfig(model=model, schedule=schedule, epochs=epochs, steps=steps, seed=seed,
                      number_format=family, grad_format=grad, threads=1)
    done = (out / "config.json").is_file() and run_summary(RunDir.open(out))["steps_done"] == \
        run_summary(RunDir.open(out))["total_steps"]
    if not done:  # a finished run kept by an earlier call (--keep DIR) is read again, not retrained
        train(cfg, str(out), progress=False)
    wall = time.perf_counter() - t0
    run = RunDir.open(out)
    summary = run_summary(run)
    trace = run.read_trace().records
    fmap = format_map(family, grad)
    cost = estimate(run.read_profile(), trace, HW, per_layer=True, formats=fmap)
    # the quantized layers' GEMMs alone: on digits the step's other ops and launches dominate the B200's time
    gemm = [r for r in cost.per_layer if r["quantized"]]
    formats = run.read_config().get("number_format", {}).get("formats")
    spe = run.read_config()["steps_per_epoch"]
    last = trace[-spe:]  # the last epoch's training loss (sample-weighted): finer than a saturated test accuracy
    return {"recipe": recipe, "schedule": schedule, "family": family, "grad_format": grad, "seed": seed,
            "test_acc": summary["final_test_acc"], "test_ppl": summary.get("final_test_ppl"), "steps": len(trace),
            "train_loss": sum(t["loss"] * t["batch_size"] for t in last) / sum(t["batch_size"] for t in last),
            "bitops": cost.bitops["total"],
            "latency_s": cost.latency_s["total"], "energy_j": cost.energy_j["total"],
            "gemm_s": sum(r["latency_s"]["total"] for r in gemm), "gemm_j": sum(r["energy_j"]["total"] for r in gemm),
            "formats": formats, "host_train_s": summary["train_time_s"], "wall_s": round(wall, 1)}


def _fmt_formats(f: dict | None, family: str, schedule: str) -> str:
    if not f:
        return f"int ({schedule.split(':')[1]})"
    fwd = sorted(set(f["forward"].values()), key=lambda n: (len(n), n))
    return "/".join(fwd) + " | g " + "/".join(sorted(set(f["gradient"].values())))


def gpu_check(out: str | None) -> int:
    """On a CUDA device: every format's quantize on the GPU equals the CPU's bit for bit (round to nearest), and a
    short digits run trains there in MX (CUDA graphs on, cptsim train's default) -- the fake-quant path on a GPU."""
    import torch

    from cptsim.numerics import formats
    from cptsim.run.rundir import RunDir
    from cptsim.run.train import TrainConfig, train

    torch.manual_seed(0)
    x = torch.randn(64, 96) * torch.logspace(-6, 6, 96)
    x[0] = 0
    bad = []
    for name in formats.format_names():
        for dim in (-1, 0):
            c, g = formats.quantize(x, name, dim=dim), formats.quantize(x.cuda(), name, dim=dim).cpu()
            if not torch.equal(c.view(torch.int32), g.view(torch.int32)):
                bad.append(f"{name} dim {dim}: {(c != g).sum().item()} elements differ")
    print(f"quantize CPU == CUDA for {len(formats.format_names())} formats x 2 dims: "
          f"{'yes' if not bad else 'NO: ' + '; '.join(bad)}")
    bad += scaled_mm_check()
    root = Path(out or tempfile.mkdtemp(prefix="cptsim-gpu-"))
    for family in ("int", "mx", "nvfp"):
        t0 = time.perf_counter()
        run_dir = root / f"cuda-{family}"
        train(TrainConfig(model="digits-cnn", schedule="cpt:4-8:g8:n2", steps=40, device="cuda", number_format=family,
                          recal_batches=2), str(run_dir), progress=False)
        tr = RunDir.open(run_dir).read_trace().records
        steady = [t["time_s"] for t in tr if not t.get("warmup")][5:]
        print(f"cuda {family}: loss {tr[0]['loss']:.3f} -> {tr[-1]['loss']:.3f} in {len(tr)} steps, median step "
              f"{1e3 * statistics.median(steady):.2f} ms, graphed {sum(1 for t in tr if t.get('graph'))}, "
              f"wall {time.perf_counter() - t0:.1f} s")
    return 1 if bad else 0


def scaled_mm_check() -> list[str]:
    """The FP8 forward GEMM through torch._scaled_mm on this GPU (cptsim.numerics.exact_gemm, issue 26 item 4):
    whether the device takes it, and its product against the exact one of the same operands, within what FP8 tensor
    cores guarantee (exact_gemm.fp8_product_bound: ~14-bit partial sums, not FP32 accumulation -- an H100 is ~5x
    outside FP32's K ulp of sum |q_x||q_w|; tests/test_format_scaled_mm.py checks the bound on a CPU emulation)."""
    import torch

    from cptsim.numerics import exact_gemm as E
    from cptsim.numerics import formats

    on, why = E.scaled_mm_device("cuda")
    print(f"torch._scaled_mm for fp8e4m3 forward GEMMs on this GPU: {why}")
    if not on:
        return []
    fmt = formats.parse_format("fp8e4m3")
    g = torch.Generator().manual_seed(1)
    x, w = (torch.randn(256, 512, generator=g) * 3).cuda(), torch.randn(384, 512, generator=g).cuda()
    xq, wq = formats.quantize(x, fmt), formats.quantize(w, fmt)
    y = E.scaled_mm_linear(x, xq, w, wq, None, fmt)
    if y is None:
        return ["scaled_mm_linear fell back on CUDA for a 256x512 @ 512x384 GEMM"]
    exact = xq.double() @ wq.double().t()
    mag = xq.abs().double() @ wq.abs().double().t()
    err = (y.double() - exact).abs()
    ok = bool((err <= E.fp8_product_bound(mag, 512)).all())
    fp32 = float((err / (mag * 512 * 2.0 ** -24)).max())
    print(f"  _scaled_mm vs the exact product: within the FP8 accumulation bound {'yes' if ok else 'NO'} (max error "
          f"{float((err / E.fp8_product_bound(mag, 512)).max()):.3g} of it, {fp32:.3g} of FP32's K ulp); "
          f"max |fast - fake| {float((y - xq @ wq.t()).abs().max()):.3g}")
    return [] if ok else ["_scaled_mm product outside the FP8 accumulation bound"]


def step_time(reps: int = 30) -> int:
    """One digits-cnn training step (forward + backward, batch 64, one thread) per family at 4/8 and 8/8 bits,
    the families alternated rep by rep (so a busy neighbour slows each alike); median ms. What the FP32 emulation of
    a format costs on this CPU against the integer path's C kernels."""
    import torch
    import torch.nn.functional as F

    from cptsim.models import create_model
    from cptsim.numerics.layers import quantize_model

    torch.set_num_threads(1)
    x, y = torch.randn(64, 1, 8, 8), torch.randint(0, 10, (64,))
    cases = []
    for family, grad in (("int", None), ("fp", None), ("fp", "fp8e5m2"), ("mx", None), ("nvfp", None)):
        for q in (4, 8):
            torch.manual_seed(0)
            m = create_model("digits-cnn", num_classes=10, in_channels=1, input_shape=(1, 8, 8))
            p = quantize_model(m, number_format=family, grad_format=grad)
            cases.append((f"{family}{'+' + grad if grad else ''} {q}/8", m, p, q))
    times = {c[0]: [] for c in cases}
    for _ in range(reps):
        for name, m, p, q in cases:
            p.set(q, 8)
            t0 = time.perf_counter()
            F.cross_entropy(m(x), y).backward()
            times[name].append(time.perf_counter() - t0)
            m.zero_grad(set_to_none=True)
    base = {q: statistics.median(times[f"int {q}/8"][3:]) for q in (4, 8)}
    print(f"digits-cnn, one training step (fwd + bwd, batch 64, 1 thread), median of {reps - 3} alternated reps")
    for name, ts in times.items():
        med = statistics.median(ts[3:])
        q = int(name.split()[-1].split("/")[0])
        print(f"  {name:22} {1e3 * med:7.2f} ms  {med / base[q]:5.2f}x the int path")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--steps", type=int, default=None, help="train this many steps instead of --epochs")
    ap.add_argument("--model", default="digits-cnn", help="a registry model, on its kind's embedded data "
                    "(transformer-lm: pydoc-chars; the metric is then test perplexity)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--recipes", default=None, help="comma-separated recipe names (prefixes) to run")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", default=None, help="keep the run directories here")
    ap.add_argument("--save-json", default=None, help="also write the JSON document to this file")
    ap.add_argument("--gpu-check", action="store_true", help="the CUDA check (gpu_check) instead of the table")
    ap.add_argument("--step-time", action="store_true", help="time one training step per family (step_time)")
    a = ap.parse_args(argv)
    if a.step_time:
        return step_time()
    if a.gpu_check:
        return gpu_check(a.keep)
    seeds = [int(s) for s in a.seeds.split(",")]
    chosen = {k: v for k, v in RECIPES.items()
              if a.recipes is None or any(k.startswith(p.strip()) for p in a.recipes.split(","))}
    root = a.keep or tempfile.mkdtemp(prefix="cptsim-formats-")
    jobs = [(r, *spec, s, a.epochs, root, a.model, a.steps) for r, spec in chosen.items() for s in seeds]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=a.jobs) as ex:
        rows = list(ex.map(_one, jobs))
    by = {}
    for r in rows:
        by.setdefault(r["recipe"], []).append(r)
    ref = by.get("BF16")
    base = {k: statistics.mean(x[k] for x in ref) for k in KEYS} if ref else None
    table = []
    for recipe, rs in by.items():
        lm = rs[0]["test_ppl"] is not None  # a language model: test perplexity (lower is better), not accuracy
        accs = [x["test_ppl"] / 100 if lm else x["test_acc"] for x in rs]  # (x100 when printed)
        row = {"recipe": recipe, "schedule": rs[0]["schedule"], "family": rs[0]["family"],
               "grad_format": rs[0]["grad_format"], "formats": _fmt_formats(rs[0]["formats"], rs[0]["family"],
                                                                              rs[0]["schedule"]),
               "test_acc_mean": statistics.mean(accs), "test_acc_std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
               "test_acc": accs, **{k: statistics.mean(x[k] for x in rs) for k in KEYS},
               "steps": rs[0]["steps"], "host_train_s": statistics.mean(x["host_train_s"] for x in rs)}
        if base:
            row.update({f"{k}_vs_bf16": row[k] / base[k] for k in KEYS if k != "train_loss"})
        table.append(row)
    runs_lm = rows[0]["test_ppl"] is not None
    doc = {"workload": a.model, "steps": a.steps, "epochs": a.epochs, "seeds": seeds, "hardware": HW,
           "elapsed_s": round(time.perf_counter() - t0, 1), "rows": table, "runs": rows}
    if a.save_json:
        Path(a.save_json).write_text(json.dumps(doc, indent=1) + "\n")
    if a.json:
        print(json.dumps(doc, indent=1))
        return 0
    if a.model == "digits-cnn" and a.steps is None:
        print(f"digits-cnn on digits, {a.epochs} epochs ({table[0]['steps']} steps of 64), seeds {a.seeds}; "
              f"modelled on {HW}; test accuracy (360 test digits) at q_max after BN re-estimation; train loss: the "
              "last epoch's mean, averaged over seeds")
    else:
        print(f"{a.model}, {table[0]['steps']} steps, seeds {a.seeds}; modelled on {HW}; "
              f"{'test perplexity' if runs_lm else 'test accuracy %'} at q_max; train loss: the mean over the last "
              "epoch's worth of steps")
    hdr = (f"{'recipe':30} {'formats (forward | grads)':32} {'test ppl' if runs_lm else 'test acc %':>16} "
           f"{'per seed':>20} {'train loss':>10} "
           f"{'BitOPs':>8} {'B200 time':>10} {'B200 energy':>12} {'GEMM time':>10} {'GEMM energy':>12}")
    print(hdr)
    print("-" * len(hdr))
    for r in table:
        seeds_txt = " ".join(f"{100 * x:.1f}" for x in r["test_acc"])
        rel = (lambda k: f"{100 * r[k + '_vs_bf16']:.0f}%") if base else (lambda k: f"{r[k]:.3g}")
        print(f"{r['recipe']:30} {r['formats']:32} {100 * r['test_acc_mean']:9.2f} +- {100 * r['test_acc_std']:4.2f} "
              f"{seeds_txt:>20} {r['train_loss']:10.4f} {rel('bitops'):>8} {rel('latency_s'):>10} "
              f"{rel('energy_j'):>12} {rel('gemm_s'):>10} "
              f"{rel('gemm_j'):>12}")
    if base:
        print(f"(relative to BF16: {base['bitops']:.3g} BitOPs, {1e3 * base['latency_s']:.1f} ms and "
              f"{base['energy_j']:.3g} J per run modelled in all; GEMM = the quantized layers' fwd/dgrad/wgrad GEMMs "
              f"alone, {1e6 * base['gemm_s']:.0f} us and {1e3 * base['gemm_j']:.3g} mJ for BF16)")
    print(f"elapsed {doc['elapsed_s']} s on this host ({a.jobs} processes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

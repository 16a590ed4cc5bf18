"""The GPU time model against published or measured training throughput of many networks (issue 23).

    python benchmarks/gpu/bench_gpu_zoo.py                              # the issue's 12 models on rtx3090 (timm NCHW)
    python benchmarks/gpu/bench_gpu_zoo.py --source timm-rtx3090-nhwc
    python benchmarks/gpu/bench_gpu_zoo.py --source h100-measured       # our H100 runs vs the datasheet h100 profile
    python benchmarks/gpu/bench_gpu_zoo.py --models resnet50,vit_base_patch16_224:128 --hw my.toml --json
    python benchmarks/gpu/bench_gpu_zoo.py --all [--img-sizes 224|any] [--limit N]   # every usable timm row (slow)

For each model: the published (or measured) training images/s, the images/s cptsim predicts for the same batch,
and the error (predicted / published - 1: negative = predicted too slow). The prediction is what
`cptsim cost --model timm:NAME --input-shape 3,S,S --num-classes 1000 --schedule static:16 --steps 20
--batch-size B --hw PROFILE` gives (img/s = 20 x B / latency), through the same library calls (layer profile of
one training step, then ``cptsim.cost.model.estimate``). Summary: median and worst |error|, count within 25%.

Sources (all shipped in the repository, nothing is downloaded):
  timm-rtx3090-nchw / -nhwc  benchmarks/data/timm/benchmark-train-amp-{nchw,nhwc}-pt112-cu113-rtx3090.csv: timm's
                             published AMP training throughput on an RTX 3090 (see SOURCE.md there); default
                             --hw rtx3090 (hw_profiles/rtx3090.toml, written from the datasheet only).
  h100-measured / -nhwc      H100_RUNS in benchmarks/results: timm AMP training throughput we measured on an
                             H100 80GB HBM3 (SXM) with benchmarks/gpu/gpu_measure.py (median step time); default --hw
                             h100, the shipped datasheet profile nobody fitted to an H100: a datasheet-only
                             prediction for a GPU then measured. Also prints the run's micro-benchmarks beside
                             the profile's peak x efficiency, bandwidth x memory efficiency and kernel overhead,
                             and NVML energy per step beside the model's.
Batch and image size come from the source's row (--models NAME:BATCH overrides the batch). An NHWC source is
priced with `--channels-last` when the cptsim at hand has it (--channels-last auto|yes|no), else as NCHW, and the
table's header says which.

Layer profiles (one CPU training step per model, 5 s to a few minutes each) are cached in --cache-dir, keyed by
model, input size, --fp-layers, torch and timm versions and a hash of the cptsim source that builds profiles,
so a changed profiler never reuses stale entries. --all profiles each model in a child process with --timeout
and reports progress on stderr; it skips rows whose model timm cannot build offline (names unknown to the
installed timm; names timm has deprecated are mapped to their architecture) and rows whose image size is not in
--img-sizes (default 224; 'any' profiles each row at its own size), and says how many rows it used.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMM_DIR = ROOT / "benchmarks" / "data" / "timm"
RESULTS = ROOT / "benchmarks" / "results"
# every H100 run in gpu_measure.py's format, in the order they were made: the shape-model runs, then the
# calibration and held-out runs
H100_RUNS = [RESULTS / f"gpu-shape-model-H100-run{i}.json" for i in (1, 2, 3)] + [
    RESULTS / f for f in ("gpu-calibrate-H100.json", "gpu-heldout-graphs-H100.json", "gpu-heldout-H100-run1.json",
                          "gpu-heldout-H100-run2.json")]
SOURCES = {
    "timm-rtx3090-nchw": ("timm", TIMM_DIR / "benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv", "rtx3090"),
    "timm-rtx3090-nhwc": ("timm", TIMM_DIR / "benchmark-train-amp-nhwc-pt112-cu113-rtx3090.csv", "rtx3090"),
    "h100-measured": ("measured", "nchw", "h100"),
    "h100-measured-nhwc": ("measured", "nhwc", "h100"),
}
# Issue 23's table: the models, in its order; batches are the source rows' (timm's: the largest that fit in 24 GB)
ISSUE_MODELS = ["resnet18", "resnet101", "resnext50_32x4d", "wide_resnet50_2", "densenet121", "efficientnet_b0",
                "mobilenetv3_large_100", "regnety_016", "convnext_tiny", "vit_small_patch16_224",
                "vit_base_patch16_224", "mixer_b16_224"]
STEPS = 20
NUM_CLASSES = 1000
WITHIN = 0.25


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ published rows
def timm_rows(path: Path) -> list[dict]:
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            rows.append({"model": r["model"], "batch": int(r["train_batch_size"]), "img_size": int(r["train_img_size"]),
                         "published_img_s": float(r["train_samples_per_sec"])})
    return rows


def measured_rows(fmt: str, precision: str = "amp") -> tuple[list[dict], list[str]]:
    """AMP training rows of every H100 run (H100_RUNS) in format ``fmt``; a model measured in more
    than one run gets the median of its runs' img/s (median step time each)."""
    files = H100_RUNS
    by = {}
    for f in files:
        d = json.loads(f.read_text())
        for r in d.get("timm_train", []):
            if r.get("format") != fmt or r.get("precision") != precision or "img_per_s_median" not in r:
                continue
            by.setdefault((r["model"], r["batch"], r.get("img_size", 224)), []).append((f.name, r["img_per_s_median"]))
    rows = [{"model": m, "batch": b, "img_size": s, "published_img_s": statistics.median(v for _, v in runs),
             "runs": [n for n, _ in runs]} for (m, b, s), runs in by.items()]
    return rows, [f.name for f in files]


# ------------------------------------------------------------------------------------------------ timm names
def timm_arch(name: str) -> tuple[str | None, str]:
    """(architecture name the installed timm builds, how it was found) or (None, why not)."""
    import timm
    from timm.models import _registry

    names = set(timm.list_models())
    if name in names:
        return name, "listed"
    dep = getattr(_registry, "_deprecated_models", {})
    if name in dep and dep[name]:
        arch = dep[name].split(".")[0]
        if arch in names:
            return arch, f"deprecated name, timm maps it to {dep[name]}"
    return None, f"unknown to timm {timm.__version__}"


def spread_order(n: int) -> list[int]:
    """0..n-1 ordered by the base-2 van der Corput sequence: every prefix is spread evenly over the range."""
    def vdc(i: int) -> float:
        x, f = 0.0, 0.5
        while i:
            x, i, f = x + f * (i & 1), i >> 1, f / 2
        return x
    seen, out = set(), []
    for k in range(n):
        j = min(n - 1, int(vdc(k) * n))
        while j in seen:
            j = (j + 1) % n
        seen.add(j)
        out.append(j)
    return out


# ------------------------------------------------------------------------------------------------ profiles
def _source_hash() -> str:
    """Hash of the cptsim source a layer profile depends on (the imported copy, whichever tree that is)."""
    import cptsim

    pkg = Path(cptsim.__file__).resolve().parent
    h = hashlib.sha256()
    for sub in ("measure", "models", "numerics"):
        for p in sorted((pkg / sub).rglob("*.py")):
            h.update(str(p.relative_to(pkg)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def cache_key(arch: str, img: int, fp_layers: str | None, fused_attention: bool = True) -> str:
    import timm
    import torch

    text = json.dumps([arch, img, NUM_CLASSES, fp_layers, torch.__version__, timm.__version__, _source_hash()]
                      + ([] if fused_attention else ["unfused-attention"]))
    return f"{arch}-{img}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"


def parse_fp_layers(text: str | None):
    try:
        from cli.common import parse_fp_layers as parse  # the cost command's own parser
    except ImportError:
        sys.path.append(str(ROOT))
        from cli.common import parse_fp_layers as parse
    return parse(text)


def make_profile(arch: str, img: int, fp_layers: str | None, fused_attention: bool = True):
    """The layer profile `cptsim cost --model timm:ARCH --input-shape 3,IMG,IMG --num-classes 1000` builds; with
    ``fused_attention=False``, of the step as PyTorch 1.12 ran it (timm's RTX 3090 tables: no fused attention,
    gpu_zoo_profiles.profile_timm)."""
    from timm.layers import set_fused_attn

    from cptsim.measure.profiler import profile_named_model

    set_fused_attn(fused_attention, experimental=False)
    try:
        return profile_named_model(f"timm:{arch}", (3, img, img), NUM_CLASSES, parse_fp_layers(fp_layers))
    finally:
        set_fused_attn(True, experimental=False)


def load_or_profile(arch: str, img: int, fp_layers: str | None, cache_dir: Path | None, timeout: float | None,
                    fused_attention: bool = True):
    """(LayerProfile, seconds spent profiling, from_cache). With ``timeout``, profile in a child process."""
    from cptsim.measure.profiler import LayerProfile

    path = cache_dir / cache_key(arch, img, fp_layers, fused_attention) if cache_dir is not None else None
    if path is not None and path.is_file():
        return LayerProfile.from_json(json.loads(path.read_text())), 0.0, True
    t = time.perf_counter()
    if timeout is None or path is None:
        prof = make_profile(arch, img, fp_layers, fused_attention)
        if path is not None:
            _write(path, prof.to_json())
        return prof, time.perf_counter() - t, False
    cmd = [sys.executable, __file__, "--profile-one", arch, "--img", str(img), "--cache-dir", str(cache_dir)]
    if not fused_attention:
        cmd.append("--unfused-attention")
    if fp_layers is not None:
        cmd += ["--fp-layers", fp_layers]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"profiling took more than {timeout:.0f} s") from None
    if r.returncode != 0 or not path.is_file():
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"profiling failed (exit {r.returncode}): {tail[:300]}")
    return LayerProfile.from_json(json.loads(path.read_text())), time.perf_counter() - t, False


def _write(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------ prediction
def prices_memory_format() -> bool:
    """Whether this cptsim's layer profile carries a memory format (`cost --channels-last`) for the GPU model."""
    import dataclasses

    from cptsim.measure.profiler import LayerProfile

    return "channels_last" in {f.name for f in dataclasses.fields(LayerProfile)}


def predict(prof, hw, schedule: str, batch: int, channels_last: bool = False) -> dict:
    """What `cptsim cost ... --schedule SCHEDULE --steps 20 --batch-size BATCH [--channels-last]` gives: img/s and
    per-step J (the profile does not depend on the memory format; the cost command sets it on the profile)."""
    from cptsim.cost.model import estimate
    from cptsim.cost.schedules import parse_schedule

    if channels_last:
        prof.channels_last = True
    c = estimate(prof, parse_schedule(schedule), hw, steps=STEPS, batch_size=batch, per_layer=False)
    return {"img_s": c.samples / c.latency_s["total"], "step_s": c.latency_s["total"] / c.steps,
            "step_j": c.energy_j["total"] / c.steps if c.energy_j else None}


def summarise(rows: list[dict]) -> dict:
    ok = [r for r in rows if r.get("error") is not None]
    if not ok:
        return {"n": 0}
    errs = sorted(abs(r["error"]) for r in ok)
    worst = max(ok, key=lambda r: abs(r["error"]))
    q90 = errs[min(len(errs) - 1, math.ceil(0.9 * len(errs)) - 1)]
    return {"n": len(ok), "median_abs_error": statistics.median(errs), "p90_abs_error": q90,
            "mean_signed_error": statistics.fmean(r["error"] for r in ok),
            "worst": {"model": worst["model"], "error": worst["error"]},
            "within_25pct": sum(e <= WITHIN for e in errs), "over_predicted": sum(r["error"] > 0 for r in ok)}


# ------------------------------------------------------------------------------------------------ H100 extras
def profile_toml(hw) -> dict | None:
    """The TOML the loaded profile ``hw`` was read from."""
    import tomllib

    p = Path(getattr(hw, "path", "") or "")
    try:
        return tomllib.loads(p.read_text())
    except (OSError, ValueError):
        return None


def micro_vs_profile(hw) -> dict:
    """The H100 run's micro-benchmarks beside what the profile file assumes (read from its TOML)."""
    runs = [json.loads(f.read_text()) for f in H100_RUNS]
    d = next((r for r in runs if r.get("gemm")), None)
    t = profile_toml(hw)
    if d is None or t is None:
        return {}
    gpu, cal = t.get("gpu", {}), t.get("calibration", {})
    tiers = {x["name"]: x for x in gpu.get("tiers", [])}
    ce = cal.get("compute_efficiency", 1.0)
    out = {"device": d["device"].get("name"), "gemm": [], "membw": {}, "launch": {}}
    for dt, tier in (("fp16", "fp16"), ("bf16", "fp16"), ("tf32", "tf32"), ("fp32", "fp32"), ("int8", "int8")):
        g = [x for x in d["gemm"] if x.get("dtype") == dt and "tflops" in x]
        if not g:
            continue
        best = max(g, key=lambda x: x["tflops"])
        big = [x["tflops"] for x in g if min(x["M"], x["N"], x["K"]) >= 4096]
        tr = tiers.get(tier, {})
        out["gemm"].append({"dtype": dt, "best_tflops": best["tflops"],
                            "best_shape": f"{best['M']}x{best['N']}x{best['K']}",
                            "median_large_tflops": statistics.median(big) if big else None,
                            "tier": tier, "peak": tr.get("peak_ops"),
                            "modelled_tflops": tr.get("peak_ops", 0) * tr.get("efficiency", 0) * ce})
    big_n = max((m["n"] for m in d["membw"] if "gb_per_s" in m), default=None)
    for m in d["membw"]:
        if m.get("n") == big_n and "gb_per_s" in m:
            out["membw"][f"{m['op']}/{m['dtype']}"] = m["gb_per_s"]
    out["membw_n"] = big_n
    out["bandwidth_gb_s"] = gpu.get("bandwidth_gb_s")
    out["memory_efficiency"] = cal.get("memory_efficiency")
    if d.get("launch"):
        out["launch"] = {k: v for k, v in d["launch"][0].items() if k.endswith("_us") or "_us_" in k}
    out["kernel_overhead_us"] = cal.get("kernel_overhead_us")
    out["resnet20"] = [{"graphed": r["graphed"], "cudnn_benchmark": r["cudnn_benchmark"], "step_ms": r["step_ms_median"]}
                       for r in d.get("resnet20", [])]
    e = d.get("energy", {})
    if e.get("train_loop"):
        tl = e["train_loop"]
        out["energy"] = {k: tl.get(k) for k in ("model", "batch", "joules_per_step", "mean_power_w", "step_ms_mean")}
        out["energy"]["idle_w"] = e.get("idle", {}).get("mean_power_w")
        out["power_w"], out["idle_power_w"] = gpu.get("power_w"), gpu.get("idle_power_w")
    return out


# ------------------------------------------------------------------------------------------------ main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", choices=sorted(SOURCES), default="timm-rtx3090-nchw")
    ap.add_argument("--models", default=None, help="comma-separated NAME or NAME:BATCH (default: the issue's 12; "
                    "for h100-measured every model measured)")
    ap.add_argument("--all", action="store_true", help="every usable row of the timm table (slow; progress on stderr)")
    ap.add_argument("--img-sizes", default="224", help="with --all: image sizes to use, comma-separated, or 'any'")
    ap.add_argument("--limit", type=int, default=None, help="with --all: at most this many rows (table order, or --spread's)")
    ap.add_argument("--timeout", type=float, default=600.0, help="with --all: seconds per model's profile")
    ap.add_argument("--spread", action="store_true", help="with --all: take the rows in an order whose every "
                    "prefix spreads over the whole table (0, 1/2, 1/4, 3/4, ...), so a --budget cut is a fair sample "
                    "rather than the table's fastest models")
    ap.add_argument("--from-json", default=None, help="print the table of a saved --json output and exit")
    ap.add_argument("--budget", type=float, default=None, help="with --all: stop starting new models after this "
                    "many seconds and report the rows done (cached profiles make a re-run resume)")
    ap.add_argument("--hw", default=None, help="hardware profile, name or .toml (default: the source's GPU)")
    ap.add_argument("--schedule", default="static:16", help="cost schedule (default static:16, what the issue ran)")
    ap.add_argument("--fp-layers", default=None, help="as `cptsim cost --fp-layers` (default: its default, the "
                    "model's convention; 'none' = every layer at the schedule's bits, as AMP runs them)")
    ap.add_argument("--channels-last", choices=("auto", "yes", "no"), default="auto",
                    help="price the step in NHWC, as `cost --channels-last` (auto: for an NHWC source, when this "
                         "cptsim has the option)")
    ap.add_argument("--cache-dir", default=str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                                                / "cptsim" / "zoo-profiles"))
    ap.add_argument("--no-cache", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--profile-one", default=None, help=argparse.SUPPRESS)  # child process of --all
    ap.add_argument("--unfused-attention", action="store_true", help=argparse.SUPPRESS)  # with --profile-one
    ap.add_argument("--img", type=int, default=224, help=argparse.SUPPRESS)
    args = ap.parse_args()
    cache = None if args.no_cache else Path(args.cache_dir)

    if args.from_json:
        print_report(json.loads(Path(args.from_json).read_text()))
        return 0
    if args.profile_one:
        prof = make_profile(args.profile_one, args.img, args.fp_layers, not args.unfused_attention)
        _write(cache / cache_key(args.profile_one, args.img, args.fp_layers, not args.unfused_attention),
               prof.to_json())
        return 0

    from cptsim.cost.hardware import load_profile

    kind, where, default_hw = SOURCES[args.source]
    hw_arg = args.hw or default_hw
    hw = load_profile(hw_arg)
    files = []
    if kind == "timm":
        table = timm_rows(where)
        src_text = f"{where.relative_to(ROOT)} (timm, AMP, RTX 3090)"
    else:
        table, files = measured_rows(where)
        src_text = f"{', '.join(files)} (our H100 measurements, AMP, {where.upper()}, median step)"
    by_name = {}
    for r in table:
        by_name.setdefault(r["model"], r)

    skipped = []
    if args.all:
        if kind != "timm":
            ap.error("--all goes with a timm-* source")
        sizes = None if args.img_sizes == "any" else {int(s) for s in args.img_sizes.split(",")}
        wanted = []
        for r in table:
            if sizes is not None and r["img_size"] not in sizes:
                skipped.append({"model": r["model"], "why": f"img_size {r['img_size']} (use --img-sizes)"})
                continue
            wanted.append(dict(r))
        if args.spread:
            wanted = [wanted[i] for i in spread_order(len(wanted))]
        if args.limit is not None:
            wanted = wanted[:args.limit]
    elif args.models:
        wanted = []
        for item in args.models.split(","):
            name, _, b = item.strip().partition(":")
            base = dict(by_name.get(name) or {"model": name, "batch": None, "img_size": 224, "published_img_s": None})
            if b:
                base["batch"] = int(b)
                if name in by_name and int(b) != by_name[name]["batch"]:
                    base["published_img_s"] = None  # published at another batch: no comparison
            if base["batch"] is None:
                ap.error(f"{name}: not in the source's table; give NAME:BATCH")
            wanted.append(base)
    else:
        wanted = [dict(by_name[m]) for m in ISSUE_MODELS if m in by_name] if kind == "timm" else [dict(r) for r in table]

    nhwc_source = args.source.endswith("nhwc")
    can_cl = prices_memory_format()
    if args.channels_last == "yes" and not can_cl:
        ap.error("--channels-last yes: this cptsim's cost model has no memory-format input")
    channels_last = args.channels_last == "yes" or (args.channels_last == "auto" and nhwc_source and can_cl)
    fmt_note = ("priced in NHWC (--channels-last)" if channels_last else
                "priced in NCHW" + (" although the source ran NHWC: this cptsim has no memory-format input"
                                    if nhwc_source and not can_cl else ""))
    t0 = time.perf_counter()
    rows = []
    n = len(wanted)
    stopped = None
    for i, r in enumerate(wanted, 1):
        if args.budget is not None and time.perf_counter() - t0 > args.budget:
            stopped = i - 1
            say(f"--budget {args.budget:.0f} s spent: stopping after {stopped} of {n} rows")
            break
        arch, how = timm_arch(r["model"])
        r["arch"] = arch
        if arch is None:
            skipped.append({"model": r["model"], "why": how})
            if args.all:
                say(f"[{i}/{n}] {r['model']}: skipped ({how})")
            continue
        if how != "listed":
            r["name_note"] = how
        try:
            # timm's tables ran PyTorch 1.12, without fused attention; our H100 runs PyTorch 2.11, with it
            prof, secs, hit = load_or_profile(arch, r["img_size"], args.fp_layers, cache,
                                              args.timeout if args.all else None, fused_attention=kind != "timm")
            p = predict(prof, hw, args.schedule, r["batch"], channels_last)
        except Exception as e:  # noqa: BLE001 - a model that cannot be built or profiled is reported, not fatal
            why = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
            skipped.append({"model": r["model"], "why": why})
            say(f"[{i}/{n}] {r['model']}: skipped ({why})")
            continue
        r["predicted_img_s"] = p["img_s"]
        r["predicted_step_ms"] = 1e3 * p["step_s"]
        r["predicted_step_j"] = p["step_j"]
        r["error"] = p["img_s"] / r["published_img_s"] - 1 if r.get("published_img_s") else None
        rows.append(r)
        if args.all or not args.json:
            err = f"{100 * r['error']:+.0f}%" if r["error"] is not None else "n/a"
            say(f"[{i}/{n}] {r['model']} b{r['batch']} {r['img_size']}px: published {r['published_img_s'] or 0:.0f}, "
                f"cptsim {p['img_s']:.0f} img/s ({err}); "
                f"{'cached profile' if hit else f'profiled in {secs:.0f} s'}; {time.perf_counter() - t0:.0f} s so far")

    summary = summarise(rows)
    doc = {"source": args.source, "source_files": src_text, "hardware": hw.name, "hardware_arg": hw_arg,
           "hardware_file": str(getattr(hw, "path", "")),
           "hardware_hash": hw.content_hash, "schedule": args.schedule, "fp_layers": args.fp_layers,
           "channels_last": channels_last, "memory_format": fmt_note, "steps": STEPS, "num_classes": NUM_CLASSES, "mode": "all" if args.all else "list",
           "rows_in_table": len(table), "rows": rows, "skipped": skipped, "summary": summary,
           "seconds": time.perf_counter() - t0}
    if args.all:
        doc["usable"] = {"rows_considered": n, "rows_used": len(rows), "rows_tried": n if stopped is None else stopped,
                         "img_sizes": args.img_sizes, "limit": args.limit, "budget_s": args.budget}
    if kind == "measured" and where == "nchw":
        doc["h100_micro_vs_profile"] = micro_vs_profile(hw)
        for r in rows:  # NVML energy of the same loop (AMP, NCHW), when the run measured it
            e = doc["h100_micro_vs_profile"].get("energy")
            if e and e["model"] == r["model"] and e["batch"] == r["batch"] and r.get("predicted_step_j"):
                doc["energy_check"] = {"model": r["model"], "batch": r["batch"], "measured_j_per_step":
                                       e["joules_per_step"], "predicted_j_per_step": r["predicted_step_j"],
                                       "error": r["predicted_step_j"] / e["joules_per_step"] - 1}
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    print_report(doc)
    return 0


def print_report(doc: dict) -> None:
    print(f"GPU time model vs training throughput: {doc['source_files']}")
    print(f"prediction: cptsim cost --model timm:NAME --input-shape 3,S,S --num-classes {doc['num_classes']} "
          f"--schedule {doc['schedule']} --steps {doc['steps']} --batch-size B --hw {doc['hardware_arg']}"
          + (f" --fp-layers {doc['fp_layers']}" if doc["fp_layers"] is not None else "")
          + (" --channels-last" if doc["channels_last"] else "")
          + f"   (profile {doc['hardware']} {doc['hardware_hash']}; {doc['memory_format']})")
    w = max([len(r["model"]) for r in doc["rows"]] + [5])
    col = "measured" if doc["source"].startswith("h100") else "published"
    print(f"{'model':{w}} {'batch':>5} {'size':>4} {col:>10} {'cptsim':>8} {'error':>7}")
    for r in doc["rows"]:
        pub = f"{r['published_img_s']:.0f}" if r.get("published_img_s") else "-"
        err = f"{100 * r['error']:+.0f}%" if r["error"] is not None else "-"
        print(f"{r['model']:{w}} {r['batch']:>5} {r['img_size']:>4} {pub:>10} {r['predicted_img_s']:>8.0f} {err:>7}")
    s = doc["summary"]
    if s.get("n"):
        print(f"{s['n']} models: median |error| {100 * s['median_abs_error']:.1f}%, 90th percentile "
              f"{100 * s['p90_abs_error']:.1f}%, worst {s['worst']['model']} {100 * s['worst']['error']:+.0f}%; "
              f"{s['within_25pct']}/{s['n']} within 25%; {s['over_predicted']} predicted too fast "
              f"(mean signed error {100 * s['mean_signed_error']:+.1f}%)")
    if doc.get("usable"):
        u = doc["usable"]
        lim = "" if u["limit"] is None else f" (the first {u['limit']})"
        cut = "" if u["rows_tried"] == u["rows_considered"] else f", {u['rows_tried']} tried before --budget ran out"
        print(f"--all: {doc['rows_in_table']} rows in the table, {u['rows_considered']} at image size "
              f"{u['img_sizes']}{lim}{cut}, {u['rows_used']} used (built and profiled)")
    if doc["skipped"]:
        size = [x for x in doc["skipped"] if x["why"].startswith("img_size")]
        other = [x for x in doc["skipped"] if not x["why"].startswith("img_size")]
        if size:
            print(f"skipped {len(size)} rows at other image sizes (--img-sizes)")
        if other:
            print(f"skipped {len(other)}: " + "; ".join(f"{x['model']} ({x['why']})" for x in other[:12])
                  + (" ..." if len(other) > 12 else ""))
    m = doc.get("h100_micro_vs_profile")
    if m:
        print(f"\n{m['device']}: micro-benchmarks (gpu-shape-model-H100-run1.json) beside profile {doc['hardware_arg']}")
        for g in m["gemm"]:
            large = f"{g['median_large_tflops']:.0f}" if g["median_large_tflops"] else "-"
            print(f"  GEMM {g['dtype']:5} best {g['best_tflops']:6.1f} T/s ({g['best_shape']}), median of shapes "
                  f">=4096: {large:>4}; profile tier {g['tier']}: peak {g['peak']} x efficiency = "
                  f"{g['modelled_tflops']:.1f}")
        bw = m.get("bandwidth_gb_s")
        me = m.get("memory_efficiency")
        keys = [k for k in ("copy/fp32", "add/fp32", "copy/fp16", "batch_norm_fwd_train/fp16",
                            "batch_norm_fwd_bwd_train/fp16", "layer_norm_fwd/fp16", "softmax_fwd/fp16",
                            "adaptive_avg_pool_7to1/fp16", "sgd_momentum_foreach_160t/fp32",
                            "sgd_momentum_forloop_160t/fp32", "sgd_momentum_fused_160t/fp32") if k in m["membw"]]
        print(f"  memory-bound ops at n={m['membw_n']:,} (GB/s, nominal bytes): "
              + ", ".join(f"{k} {m['membw'][k]:.0f}" for k in keys)
              + (f"; profile: {bw} x {me} = {bw * me:.0f}" if bw and me else ""))
        if m.get("launch"):
            print("  launch: " + ", ".join(f"{k} {v:.1f}" for k, v in m["launch"].items())
                  + f"; profile kernel_overhead_us {m['kernel_overhead_us']}")
        if m.get("resnet20"):
            print("  resnet20 b128 FP32 step (ms): " + ", ".join(
                f"{'graphed' if r['graphed'] else 'eager'}{' cudnn.benchmark' if r['cudnn_benchmark'] else ''} "
                f"{r['step_ms']:.2f}" for r in m["resnet20"]))
    e = doc.get("energy_check")
    if e:
        mm = m["energy"]
        print(f"  NVML energy, {e['model']} b{e['batch']} AMP NCHW loop: {e['measured_j_per_step']:.1f} J/step at "
              f"{mm['mean_power_w']:.0f} W (idle {mm['idle_w']:.0f} W); cptsim {e['predicted_j_per_step']:.1f} J/step "
              f"({100 * e['error']:+.0f}%; profile power_w {m['power_w']}, idle_power_w {m['idle_power_w']})")


if __name__ == "__main__":
    sys.exit(main())

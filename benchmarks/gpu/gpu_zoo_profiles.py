"""Profile timm models once, for the GPU time model's fit and its leave-one-family-out check (issue 23).

A cptsim profile of a 224x224 ImageNet model is a real training step on this CPU (per-layer MACs and GEMM shapes,
the step's op list): seconds per model. The GPU model is fitted and checked against hundreds of published rows,
so the profiles are computed once and shipped (benchmarks/data/timm/profiles-224.json.gz); bench_gpu_zoo.py and
the fit read them. Every layer is quantized-capable (``--fp-layers none``): under AMP every conv and linear runs
in FP16, and at 32 bits the layers run plain.

    python benchmarks/gpu/gpu_zoo_profiles.py                   # the default sample (every family), ~10-20 min
    python benchmarks/gpu/gpu_zoo_profiles.py --models a,b,c    # add these
    python benchmarks/gpu/gpu_zoo_profiles.py --per-family 0    # every usable row of the table (hours)
    python benchmarks/gpu/gpu_zoo_profiles.py --unfused-attention   # attention models as PyTorch 1.12 ran them
    python benchmarks/gpu/gpu_zoo_profiles.py --norm-shapes   # add batch norms' shapes to stored op lists (~10 min)

The tables were measured with PyTorch 1.12 (pt112), which had no fused attention: a transformer's attention ran as
two batched matmuls and a softmax over its N x N scores. Today's timm calls F.scaled_dot_product_attention, so
every model with attention also has a ``profile_unfused_attn``, counted with timm's fused attention switched off;
the fit and the zoo table price the RTX 3090 rows with it (``pt112_profiles``), the H100 runs (PyTorch 2.11)
with the fused one.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TABLE = HERE.parent / "data" / "timm" / "benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv"
OUT = HERE.parent / "data" / "timm" / "profiles-224.json.gz"

# The issue's families; the first pattern a name starts with decides (order matters: seresnext before resnet).
FAMILIES = [
    ("wide_resnet", ("wide_resnet",)),
    ("resnext", ("resnext", "seresnext", "ig_resnext", "swsl_resnext", "ssl_resnext", "gluon_resnext",
                 "gluon_seresnext", "legacy_seresnext", "skresnext", "ecaresnext")),
    ("resnet", ("resnet", "seresnet", "ecaresnet", "gluon_resnet", "legacy_seresnet", "skresnet", "resnetrs",
                "resnetv2", "resnetblur", "resnetaa", "ssl_resnet", "swsl_resnet", "tv_resnet", "wide_resnet")),
    ("densenet", ("densenet", "tv_densenet")),
    ("efficientnet", ("efficientnet", "tf_efficientnet", "gc_efficientnet", "eca_efficientnet")),
    ("mobilenet", ("mobilenet", "tf_mobilenet", "mobilevit", "fbnet", "mnasnet", "lcnet", "tinynet", "ghostnet",
                   "hardcorenas", "semnasnet", "spnasnet", "mixnet", "tf_mixnet")),
    ("regnet", ("regnet",)),
    ("convnext", ("convnext",)),
    ("vit", ("vit_", "deit", "beit", "cait", "xcit", "crossvit", "pit_", "levit", "tnt_", "twins", "swin")),
    ("mixer", ("mixer", "gmixer", "resmlp", "gmlp")),
]
ISSUE_MODELS = ["resnet18", "resnet101", "resnext50_32x4d", "wide_resnet50_2", "densenet121", "efficientnet_b0",
                "mobilenetv3_large_100", "regnety_016", "convnext_tiny", "vit_small_patch16_224",
                "vit_base_patch16_224", "mixer_b16_224", "resnet50"]


def family(name: str) -> str:
    for fam, prefixes in FAMILIES:
        if name.startswith(prefixes):
            return fam
    return "other"


def table_rows(path: Path = TABLE) -> dict[str, dict]:
    with open(path) as f:
        return {r["model"]: r for r in csv.DictReader(f)}


def save_profiles(done: dict, path: Path = OUT) -> None:
    """Write the profile store (what ``load_profiles`` reads) through a temporary file: a kill leaves the old one."""
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt") as f:
        json.dump(done, f, separators=(",", ":"))
    tmp.replace(path)


def load_profiles(path: Path = OUT) -> dict:
    if not path.exists():
        return {}
    with gzip.open(path, "rt") as f:
        return json.load(f)


def profile_timm(name: str, size: int = 224, fused_attention: bool = True):
    """The layer profile of one training step of timm's NAME. ``fused_attention=False``: as the timm of PyTorch
    1.12 ran attention (the RTX 3090 tables, pt112): q @ k^T, softmax, dropout, @ v as separate kernels -- PyTorch
    had no F.scaled_dot_product_attention before 2.0 -- which the op counter then counts as two matmuls and the
    memory-bound ops on the N x N scores, instead of one fused kernel."""
    import timm
    import torch
    from timm.layers import set_fused_attn

    from cptsim.measure.profiler import profile_model
    from cptsim.numerics.layers import quantize_model

    torch.manual_seed(0)
    set_fused_attn(fused_attention, experimental=False)
    try:
        net = timm.create_model(name, pretrained=False, num_classes=1000)
        quantize_model(net, fp_layers=[])
        return profile_model(net, (3, size, size), batch_size=2, model_name=f"timm:{name}")
    finally:
        set_fused_attn(True, experimental=False)


def norm_shapes_timm(name: str, size: int = 224) -> list:
    """[[positions per sample, channels, calls]] of timm's NAME's batch norms, from one forward at batch 1 with a
    hook on every BatchNorm module (timm's BatchNormAct2d is one): what ``count_step_ops`` records for them
    (``OpRecord.norm_shapes``; every batch norm's backward has its forward's shape), for stored profiles counted
    before it recorded them, ~50x faster than recounting the whole step on this CPU. tests/test_gpu_kernels.py
    checks both give the same shapes."""
    import timm
    import torch

    torch.manual_seed(0)
    net = timm.create_model(name, pretrained=False, num_classes=1000).eval()
    return batch_norm_shapes_by_hooks(net, torch.randn(1, 3, size, size))


def batch_norm_shapes_by_hooks(net, x) -> list:
    """The hook count of ``norm_shapes_timm`` on any model and input (module forward hooks, no dispatch mode)."""
    import torch
    from torch.nn.modules.batchnorm import _BatchNorm

    seen: dict = {}

    def hook(m, args, out):
        t = args[0]
        if t.dim() >= 2:
            key = (float(t.numel() // max(1, t.shape[0] * t.shape[1])), float(t.shape[1]))
            seen[key] = seen.get(key, 0.0) + 1.0

    hs = [m.register_forward_hook(hook) for m in net.modules() if isinstance(m, _BatchNorm)]
    try:
        with torch.no_grad():
            net(x)
    finally:
        for h in hs:
            h.remove()
    return [[p, c, k] for (p, c), k in sorted(seen.items())]


def add_norm_shapes(entry: dict, shapes: list) -> int:
    """Write ``shapes`` into the batch-norm records of one entry's stored profile(s) (fused and unfused-attention
    twins: their batch norms are the same), one forward and one backward record each; returns the records changed,
    0 (nothing written) when a phase has more than one batch-norm record (which of them made which call is then
    unknown: the profile keeps pricing them by bytes)."""
    n = 0
    for key in ("profile", "profile_unfused_attn"):
        recs = [r for r in entry.get(key, {}).get("ops", {}).get("records", []) if "batch_norm" in r["op"]]
        phases = [r["phase"] for r in recs]
        if not shapes or len(set(phases)) != len(phases):
            continue
        for r in recs:
            r["norm_shapes"] = shapes
            n += 1
    return n


def has_fused_attention(entry: dict) -> bool:
    """Whether a stored profile counted fused attention (then its pt112 twin is profiled unfused)."""
    from cptsim.measure.profiler import LayerProfile

    p = LayerProfile.from_json(entry["profile"])
    return bool(p.ops and p.ops.summary()["fwd"].get("attention_macs_per_sample", 0) > 0)


def pt112_profiles(raw: dict) -> dict:
    """{model: LayerProfile} as timm's RTX 3090 tables ran them (PyTorch 1.12: attention unfused,
    ``profile_unfused_attn`` where the model has attention; every other model's profile is the same)."""
    from cptsim.measure.profiler import LayerProfile

    return {k: LayerProfile.from_json(v.get("profile_unfused_attn", v["profile"])) for k, v in raw.items()
            if "profile" in v}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-family", type=int, default=10, help="models per family sampled from the 224px rows "
                    "(0: all); the issue's twelve are always included")
    ap.add_argument("--models", default="", help="comma-separated extra model names")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-minutes", type=float, default=30.0, help="stop (and keep what is done) after this")
    ap.add_argument("--max-params", type=float, default=100.0, help="skip models of more million parameters (a "
                    "CPU training step of a 300M-parameter model needs ~15 GB)")
    ap.add_argument("--unfused-attention", action="store_true", help="add, for every stored model whose profile "
                    "counts fused attention, the profile of the same step with attention unfused (as PyTorch 1.12 "
                    "ran it: the RTX 3090 tables), as 'profile_unfused_attn'")
    ap.add_argument("--norm-shapes", action="store_true", help="add the batch norms' shapes (OpRecord.norm_shapes) "
                    "to every stored profile that lacks them, from a recount of its step's ops")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    if args.norm_shapes:
        done = load_profiles()
        t0 = time.perf_counter()
        todo = [n for n, e in sorted(done.items()) if "profile" in e
                and any("batch_norm" in r["op"] and "norm_shapes" not in r for r in e["profile"]["ops"]["records"])]
        for i, name in enumerate(todo):
            if time.perf_counter() - t0 > args.max_minutes * 60:
                print("time is up; keeping what is done", file=sys.stderr)
                break
            t = time.perf_counter()
            try:
                k = add_norm_shapes(done[name], norm_shapes_timm(name))
            except Exception as e:  # noqa: BLE001 - keep the others
                print(f"{name}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
                continue
            print(f"[{i + 1}/{len(todo)}] {name}: {k} records {time.perf_counter() - t:.1f}s", file=sys.stderr)
            if (i + 1) % 10 == 0 or i + 1 == len(todo):
                save_profiles(done)
        return 0
    if args.unfused_attention:
        done = load_profiles()
        for name, entry in sorted(done.items()):
            if "profile" in entry and "profile_unfused_attn" not in entry and has_fused_attention(entry):
                t = time.perf_counter()
                entry["profile_unfused_attn"] = profile_timm(name, fused_attention=False).to_json()
                print(f"{name}: unfused attention profiled in {time.perf_counter() - t:.1f}s", file=sys.stderr)
        save_profiles(done)
        return 0
    rows = {n: r for n, r in table_rows().items()
            if int(r["train_img_size"]) == 224 and float(r["param_count"]) <= args.max_params}
    by_fam: dict[str, list[str]] = {}
    for n in sorted(rows):
        by_fam.setdefault(family(n), []).append(n)
    rng = random.Random(args.seed)
    chosen = [m for m in ISSUE_MODELS if m in rows]
    for fam, names in sorted(by_fam.items()):
        pick = names if args.per_family == 0 else rng.sample(names, min(args.per_family, len(names)))
        chosen += [n for n in pick if n not in chosen]
    chosen += [m for m in args.models.split(",") if m and m not in chosen]
    done = load_profiles()
    t0 = time.perf_counter()
    todo = [m for m in chosen if m not in done]
    print(f"{len(chosen)} models chosen, {len(todo)} to profile", file=sys.stderr)
    for i, name in enumerate(todo):
        if time.perf_counter() - t0 > args.max_minutes * 60:
            print("time is up; keeping what is done", file=sys.stderr)
            break
        t = time.perf_counter()
        try:
            prof = profile_timm(name)
            done[name] = {"family": family(name), "profile": prof.to_json()}
        except Exception as e:  # noqa: BLE001 - a model timm cannot build here is recorded as unusable
            done[name] = {"family": family(name), "error": f"{type(e).__name__}: {str(e)[:200]}"}
        print(f"[{i + 1}/{len(todo)}] {name} ({family(name)}) {time.perf_counter() - t:.1f}s"
              + (f"  ERROR {done[name]['error']}" if "error" in done[name] else ""), file=sys.stderr)
        if (i + 1) % 5 == 0 or i + 1 == len(todo):
            save_profiles(done)
    save_profiles(done)
    print(f"{sum('profile' in v for v in done.values())} profiles in {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

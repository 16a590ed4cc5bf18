"""The GPU time model against measured training throughput: ResNet-50 v1.5 on A100 and V100 (one GPU).

    python benchmarks/gpu/bench_gpu_throughput.py [--json] [--fit] [--profile PATH]

Published img/s: NVIDIA DeepLearningExamples (shared/reference/gpu-throughput.md). Modelled img/s: `cptsim cost`'s
estimate from the shipped hardware profiles and the layer profile (per-layer MACs + the step's op list) of
imagenet-resnet50, 224x224, 1000 classes, each row in the memory format it ran (NVIDIA's AMP rows: NHWC).
Since issue 23 a100 and v100 are written from their datasheets (GPU shape model, Ampere's constants), so these
rows are held-out checks: benchmarks/gpu/bench_gpu_datasheet.py prints them with more published rows and writes the
profiles' [validation]. --fit prints the tier efficiency each row would need (a diagnostic; nothing is fitted
on these rows any more).
By default the profile is tests/data/imagenet-resnet50-profile.json (give --profile '' to measure it afresh:
about a minute on a CPU).
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

from cptsim.calibration.gpu import ROWS, SOURCE, fit_tier_efficiency, modelled_throughput, resnet50_profile
from cptsim.cost.hardware import load_profile

DEFAULT_PROFILE = Path(__file__).resolve().parents[2] / "tests" / "data" / "imagenet-resnet50-profile.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--fit", action="store_true", help="also print the tier efficiency each row identifies")
    ap.add_argument("--profile", default=str(DEFAULT_PROFILE))
    args = ap.parse_args()
    prof = resnet50_profile(args.profile or None)
    rows = []
    nhwc = copy.copy(prof)
    nhwc.channels_last = True
    for r in ROWS:
        hw = load_profile(r.hardware)
        p = nhwc if r.precision == "AMP" else prof  # NVIDIA's AMP configurations run channels-last
        got = modelled_throughput(p, hw, r)
        row = {"hardware": r.hardware, "precision": r.precision, "schedule": r.schedule, "batch_size": r.batch_size,
               "published_img_s": r.published_img_s, "modelled_img_s": got,
               "error_pct": 100 * (got / r.published_img_s - 1)}
        if args.fit:
            row["fit"] = dict(zip(("tier", "efficiency"), fit_tier_efficiency(p, hw, r)))
        rows.append(row)
    if args.json:
        print(json.dumps({"source": SOURCE, "rows": rows}))
        return
    print(f"ResNet-50 v1.5 training throughput, one GPU ({SOURCE})")
    print(f"{'GPU':6} {'precision':9} {'schedule':10} {'batch':>5} {'published':>10} {'modelled':>9} {'error':>7}"
          + ("  fit" if args.fit else ""))
    for row in rows:
        fit = f"  {row['fit']['tier']} efficiency {row['fit']['efficiency']:.3f}" if args.fit else ""
        print(f"{row['hardware']:6} {row['precision']:9} {row['schedule']:10} {row['batch_size']:>5} "
              f"{row['published_img_s']:>10.0f} {row['modelled_img_s']:>9.0f} {row['error_pct']:>+6.1f}%{fit}")


if __name__ == "__main__":
    main()

"""GPU profiles written from a datasheet alone, checked on published ResNet-50 training throughput (issue 23).

    python benchmarks/gpu/bench_gpu_datasheet.py            # the table: published vs modelled img/s, error per row
    python benchmarks/gpu/bench_gpu_datasheet.py --json
    python benchmarks/gpu/bench_gpu_datasheet.py --write    # also write each datasheet profile's [validation]

hw_profiles/a100.toml, v100.toml, t4.toml and rtx4090.toml give the peaks, SM count and boost clock of their
datasheets and nothing fitted to that GPU: the GPU shape model's constants are Ampere's, fitted on timm's RTX 3090
tables (benchmarks/gpu/fit_gpu_model.py). Every row below is therefore a held-out check, never a fit. The fitted
profiles (rtx3090, h100) are checked on the rows here that they were not fitted on (Lambda's runs, and our H100's
TF32 run: their fits saw AMP timm runs only).

The rows: one training step of ResNet-50 v1.5 (224 px, 1000 classes; tests/data/imagenet-resnet50-profile.json,
torchvision's layout), one GPU, synthetic or DALI-fed data, each priced as it ran -- AMP (every conv and linear
in FP16: static:16, q = g = 16) or FP32 (convolutions on TF32 where the GPU has it, PyTorch's default), at the
row's batch and memory format. T4: no published single-T4 training row was found (NVIDIA publishes T4 inference
only); its profile has no [validation] and says so.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PROFILE = ROOT / "tests" / "data" / "imagenet-resnet50-profile.json"

SOURCES = {
    "nvidia": "NVIDIA DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5 README, training performance, "
              "1 GPU (pytorch-21.03 NGC; batch sizes from configs.yml; the AMP configurations run NHWC, TF32 ran "
              "PyTorch 1.9 whose FP32 matmuls used TF32) - shared/reference/gpu-throughput.md",
    "lambda": "Lambda deeplearning-benchmark (github.com/lambdal/deeplearning-benchmark), pytorch/pytorch-train-"
              "throughput-{fp16,fp32}.csv, 'resnet50' column, 1 GPU: DeepLearningExamples' ResNet-50 in the "
              "pytorch:22.09 NGC container, synthetic data, NCHW (no --memory-format), batch from pytorch-train-bs-"
              "{fp16,fp32}.csv and scripts/config_v1/config_pytorch_{24GB,16GB,80GB}.sh (AMP: --amp "
              "--static-loss-scale 256)",
    "measured": "our lent H100, timm resnet50 NCHW TF32 (cudnn.benchmark, SGD; benchmarks/results/gpu-shape-model-H100-run1.json)",
}


@dataclass(frozen=True)
class Row:
    gpu: str            # the shipped profile that prices it
    source: str         # a SOURCES key
    precision: str      # "AMP" or "TF32" / "FP32" (as the source names it)
    batch: int
    channels_last: bool
    img_s: float
    tf32_matmul: bool = False  # the run let FP32 matmuls use TF32 (PyTorch 1.7-1.11's default)
    note: str = ""

    @property
    def bits(self) -> int:
        return 16 if self.precision == "AMP" else 32


_H100 = "'H100 80GB SXM5' (80GB template's batch; fitted on our AMP runs)"
ROWS = (
    Row("a100", "nvidia", "TF32", 256, False, 938.0, tf32_matmul=True, note="A100 80GB SXM4 (DGX A100)"),
    Row("a100", "nvidia", "AMP", 256, True, 2470.0, note="A100 80GB SXM4 (DGX A100)"),
    Row("v100", "nvidia", "FP32", 112, False, 367.0, note="V100 16GB SXM2 (DGX-1)"),
    Row("v100", "nvidia", "AMP", 256, True, 1200.0, note="V100 16GB SXM2 (DGX-1)"),
    Row("a100", "lambda", "TF32", 640, False, 1066.0, note="'A100 80GB SXM4'"),
    Row("a100", "lambda", "AMP", 1280, False, 1582.0, note="'A100 80GB SXM4'"),
    Row("v100", "lambda", "FP32", 128, False, 369.0, note="'LambdaCloud V100 16GB'"),
    Row("v100", "lambda", "AMP", 256, False, 833.0, note="'LambdaCloud V100 16GB'"),
    Row("rtx4090", "lambda", "TF32", 224, False, 721.0, note="'RTX 4090'"),
    Row("rtx4090", "lambda", "AMP", 448, False, 1301.0, note="'RTX 4090'"),
    # the fitted profiles, on rows their fits did not see
    Row("rtx3090", "lambda", "TF32", 224, False, 513.0, note="'RTX 3090' (profile fitted on timm's AMP tables)"),
    Row("rtx3090", "lambda", "AMP", 448, False, 905.0, note="'RTX 3090' (profile fitted on timm's AMP tables)"),
    Row("h100", "lambda", "TF32", 640, False, 1753.0, note=_H100),
    Row("h100", "lambda", "AMP", 1280, False, 2616.0, note=_H100),
    Row("h100", "measured", "TF32", 256, False, 1846.7, note="our H100 (its fit saw the AMP runs only)"),
)
DATASHEET = ("a100", "v100", "t4", "rtx4090")  # written from the datasheet: every row of theirs is held out


def resnet50():
    from cptsim.calibration.gpu import resnet50_profile

    return resnet50_profile(PROFILE)


def predicted_img_s(prof, row: Row, hw=None) -> float:
    """Images per second of one step of ``row`` on its shipped profile (or ``hw``), priced by the cost model's own
    per-step function (cptsim.calibration.gpu_fit.predicted_img_s, which tests check equals ``estimate``)."""
    from cptsim.calibration import gpu_fit as F
    from cptsim.cost.hardware import load_profile

    hw = load_profile(row.gpu) if hw is None else hw
    if row.tf32_matmul:
        hw = hw.allow_tf32_matmul()
    return F.predicted_img_s(hw, prof, F.Row("resnet50", "resnet", row.batch, row.img_s, row.channels_last),
                             bits=row.bits)


def table(prof=None) -> list[dict]:
    prof = resnet50() if prof is None else prof
    out = []
    for r in ROWS:
        p = predicted_img_s(prof, r)
        out.append({"gpu": r.gpu, "source": r.source, "precision": r.precision, "batch": r.batch,
                    "format": "nhwc" if r.channels_last else "nchw", "published": r.img_s, "modelled": p,
                    "error": p / r.img_s - 1.0, "note": r.note, "datasheet_only": r.gpu in DATASHEET})
    return out


def per_gpu(rows: list[dict]) -> dict:
    out = {}
    for g in dict.fromkeys(r["gpu"] for r in rows):
        e = np.abs([r["error"] for r in rows if r["gpu"] == g])
        out[g] = {"n": int(e.size), "median_abs_error": float(np.median(e)), "worst_abs_error": float(e.max())}
    return out


SOURCE_NAMES = {"nvidia": "NVIDIA DeepLearningExamples", "lambda": "Lambda's deeplearning-benchmark",
                "measured": "our H100"}


def validation_against(gpu: str) -> str:
    """What a datasheet profile's [validation] says it was checked on: its rows' sources, precisions, formats."""
    rows = [r for r in ROWS if r.gpu == gpu]
    src = " and ".join(SOURCE_NAMES[s] for s in dict.fromkeys(r.source for r in rows))
    prec = "/".join(dict.fromkeys(r.precision for r in rows))
    fmt = " and ".join(dict.fromkeys("NHWC" if r.channels_last else "NCHW" for r in rows))
    return f"published ResNet-50 v1.5 training throughput, one GPU, {prec}, {fmt}: {src} (bench_gpu_datasheet.py)"


def validation_text(gpu: str, s: dict) -> str:
    return ("[validation]\n"
            "# checked on published measurements this profile was not fitted to (it was written from the datasheet):\n"
            "# python benchmarks/gpu/bench_gpu_datasheet.py prints the rows; tests/test_gpu_time.py re-measures these\n"
            f"against = {json.dumps(validation_against(gpu))}\n"
            f"n = {s['n']}\n"
            f"median_abs_error = {s['median_abs_error']:.4g}\n"
            f"worst_abs_error = {s['worst_abs_error']:.4g}\n"
            'held_out = "yes"\n'
            'op_mixes = ["conv"]\n')


def write(summary: dict) -> None:
    """Write (or replace) the [validation] table of each datasheet profile that has rows."""
    for g in DATASHEET:
        if g not in summary:
            continue
        path = ROOT / "hw_profiles" / f"{g}.toml"
        text = path.read_text()
        text = re.sub(r"\n\[validation\]\n.*\Z", "\n", text, flags=re.S).rstrip("\n") + "\n"
        path.write_text(text + "\n" + validation_text(g, summary[g]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", action="store_true", help="write [validation] into hw_profiles/{a100,v100,rtx4090}.toml")
    args = ap.parse_args(argv)
    rows = table()
    summary = per_gpu(rows)
    if args.write:
        write(summary)
    if args.json:
        print(json.dumps({"sources": SOURCES, "rows": rows, "per_gpu": summary}, indent=1))
        return 0
    print("ResNet-50 v1.5 training throughput, one GPU: published vs modelled (img/s)")
    print(f"{'gpu':8} {'source':8} {'prec':4} {'batch':>5} {'fmt':4} {'published':>9} {'modelled':>8} "
          f"{'error':>7}  note")
    for r in rows:
        print(f"{r['gpu']:8} {r['source']:8} {r['precision']:4} {r['batch']:>5} {r['format']:4} {r['published']:>9.0f} "
              f"{r['modelled']:>8.0f} {100 * r['error']:>+6.1f}%  {r['note']}")
    print("\nper GPU (|error|):")
    for g, s in summary.items():
        kind = "datasheet only, held out" if g in DATASHEET else "fitted profile, rows not in its fit"
        print(f"  {g:8} n={s['n']}  median {100 * s['median_abs_error']:.1f}%  worst {100 * s['worst_abs_error']:.1f}%"
              f"  ({kind})")
    print("  t4       no published single-T4 training row found: not checked")
    print("\nsources:")
    for k, v in SOURCES.items():
        print(f"  {k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

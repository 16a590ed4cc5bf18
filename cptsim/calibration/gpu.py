"""The GPU time model's calibration set (published, measured training throughput) and the fit of its parameters.

``ROWS`` is the table of ../shared/reference/gpu-throughput.md: NVIDIA DeepLearningExamples, PyTorch ResNet-50
v1.5, one GPU, pytorch-21.03 NGC container (commit 7bdfc81d). ``modelled_throughput`` re-derives a row's images
per second from a hardware profile and the layer profile (per-layer MACs + the step's op list) of ResNet-50, with
the same ``cptsim.cost.estimate`` every command uses. ``fit_tier_efficiency`` solves the one parameter a row
identifies -- the achieved efficiency of the tier its GEMMs run on -- with the memory efficiency and the
per-kernel overhead held at their stated values; the results are written into the shipped TOML files by hand,
with a comment (``python benchmarks/gpu/bench_gpu_throughput.py --fit`` prints them).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

__all__ = ["Row", "ROWS", "SOURCE", "modelled_throughput", "fit_tier_efficiency", "resnet50_profile"]

SOURCE = ("NVIDIA DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5 README, training performance "
          "(commit 7bdfc81d, pytorch-21.03 NGC); batch sizes from configs.yml")


@dataclass(frozen=True)
class Row:
    hardware: str
    precision: str
    schedule: str      # what cptsim runs for it: static:32 = the fp32 tier (TF32 on A100), static:16 = AMP
    batch_size: int
    published_img_s: float
    # the run let FP32 matmuls use TF32 (torch.backends.cuda.matmul.allow_tf32): PyTorch's default from 1.7 to
    # 1.11, so in the 21.03 container's PyTorch 1.9; the default has been False since 1.12
    tf32_matmul: bool = False


ROWS = (
    Row("a100", "TF32", "static:32", 256, 938.0, tf32_matmul=True),
    Row("a100", "AMP", "static:16", 256, 2470.0),
    Row("v100", "FP32", "static:32", 112, 367.0),
    Row("v100", "AMP", "static:16", 256, 1200.0),
)

MODEL = "imagenet-resnet50"
INPUT_SHAPE = (3, 224, 224)
NUM_CLASSES = 1000
STEPS = 20
# The rows are costed with `cptsim cost`'s default flags: the model's own full-precision layers (ResNet-50's stem,
# downsample convs and classifier: CPT's convention). AMP casts every conv and linear layer to FP16, and so does
# the GPU time model in an FP16 step (GPUProfile.full_precision_bits): no --fp-layers none needed.
FP_LAYERS: list[str] | None = None  # the model's default convention


def resnet50_profile(path=None):
    """The layer profile (per-layer MACs and op list) of ResNet-50 v1.5, 224x224, 1000 classes, with the model's
    default full-precision layers, as `cptsim cost` builds it with default flags (about a minute on a CPU); with
    ``path``, read from / saved to that profile.json."""
    import json
    from pathlib import Path

    from cptsim.measure.profiler import LayerProfile

    if path is not None and Path(path).is_file():
        return LayerProfile.from_json(json.loads(Path(path).read_text()))
    from cptsim.measure.profiler import profile_named_model

    prof = profile_named_model(MODEL, INPUT_SHAPE, NUM_CLASSES, FP_LAYERS)
    if path is not None:
        Path(path).write_text(json.dumps(prof.to_json()))
    return prof


def modelled_throughput(profile, hardware, row: Row) -> float:
    """Images per second the cost model gives for ``row`` on ``hardware`` (a profile object or name)."""
    from cptsim.cost.hardware import load_profile
    from cptsim.cost.model import estimate
    from cptsim.cost.schedules import parse_schedule

    hardware = load_profile(hardware) if isinstance(hardware, str) else hardware
    if row.tf32_matmul:
        hardware = hardware.allow_tf32_matmul()
    c = estimate(profile, parse_schedule(row.schedule), hardware, steps=STEPS, batch_size=row.batch_size,
                 per_layer=False)
    return c.samples / c.latency_s["total"]


def fit_tier_efficiency(profile, hardware, row: Row, lo: float = 1e-3, hi: float = 1.0) -> tuple[str, float]:
    """(tier name, efficiency) that makes the model give the row's published img/s, by bisection (time falls
    monotonically as the efficiency rises). Returns ``hi`` when even that is too slow."""
    from cptsim.cost.hardware import load_profile
    from cptsim.cost.schedules import parse_schedule

    hw = load_profile(hardware) if isinstance(hardware, str) else hardware
    if row.tf32_matmul:
        hw = hw.allow_tf32_matmul()  # before the copy: modelled_throughput then keeps it (and its efficiencies)
    hw = copy.deepcopy(hw)
    q = int(parse_schedule(row.schedule).bits(1)[0])
    tier = int(hw.tier_index(q, q))
    for _ in range(60):
        mid = (lo + hi) / 2
        hw._tier_eff = np.array(hw._tier_eff, dtype=float)
        hw._tier_eff[tier] = mid
        if modelled_throughput(profile, hw, row) < row.published_img_s:
            lo = mid
        else:
            hi = mid
    return hw.params["tiers"][tier]["name"], hi

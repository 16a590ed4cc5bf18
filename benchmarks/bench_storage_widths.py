"""How CPT's energy and latency saving on the accelerators depends on the width outputs are written to DRAM at.

    python benchmarks/bench_storage_widths.py [--model resnet20] [--schedule cpt:3-8:g8:n32] [--steps 64000] [--json]

Each accelerator profile's ``output_bits`` says the width at which a GEMM's output (the forward activation, the
backward error) is written to DRAM: 32 (Bit Fusion's simulator: oprec = 32), 16 (Stripes' 16-bit fixed-point
neuron storage) or "operand" (quantized on chip to the width the next GEMM reads it at). Operands are read at
their widths in every case and weight gradients are written at 32. The saving is over the static q_max schedule
with the same gradient bits on the same profile (what ``cptsim cost`` prints); BitOPs do not depend on it.

For scale: FracTrain (Fu et al., NeurIPS 2020, the CPT authors' earlier work; CIFAR ResNet-38/74) reports
hardware-measured energy savings of roughly 0.3-0.7 of its BitOPs savings.
"""

from __future__ import annotations

import argparse
import json
import re
from importlib import resources

from cptsim.cli.profile_cmd import build_profile
from cptsim.cost.model import estimate
from cptsim.cost.hardware import parse_profile
from cptsim.cost.schedules import parse_schedule

PROFILES = ("bitfusion", "stripes")
WIDTHS = (32, 16, "operand")


def with_output_bits(name: str, value) -> object:
    """The shipped profile ``name`` with ``output_bits = value`` (through the TOML reader, as a user's file would)."""
    text = (resources.files("cptsim.hw_profiles") / f"{name}.toml").read_text()
    line = f"output_bits = {value if isinstance(value, int) else chr(34) + value + chr(34)}"
    text, n = re.subn(r"(?m)^output_bits\s*=.*$", line, text)
    if n == 0:
        text = re.sub(r"(?m)^(\[(?:bit-fusion|bit-serial|fixed-int)\])$", r"\1\n" + line, text)
    return parse_profile(text.encode(), f"{name}.toml")


def savings(model: str = "resnet20", schedule: str = "cpt:3-8:g8:n32", steps: int = 64000, batch_size: int = 64,
            shape=(3, 32, 32), num_classes: int = 10) -> list[dict]:
    prof = build_profile(model, tuple(shape), num_classes, None)
    sched = parse_schedule(schedule)
    rows = []
    for name in PROFILES:
        for width in (None, *WIDTHS):  # None: the shipped default
            hw = with_output_bits(name, width) if width is not None else parse_profile(
                (resources.files("cptsim.hw_profiles") / f"{name}.toml").read_bytes(), f"{name}.toml")
            c = estimate(prof, sched, hw, steps=steps, batch_size=batch_size, per_layer=False)
            rows.append({"hardware": name, "output_bits": hw.params["output_bits"], "default": width is None,
                         "bitops_saving": 1 - c.vs_static["bitops"], "energy_saving": 1 - c.vs_static["energy_j"],
                         "latency_saving": 1 - c.vs_static["latency_s"]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--schedule", default="cpt:3-8:g8:n32")
    ap.add_argument("--steps", type=int, default=64000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = savings(a.model, a.schedule, a.steps)
    if a.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{a.schedule} on {a.model} (CIFAR, batch 64, {a.steps} steps): saving over static 8 bits")
    print(f"{'hardware':<10} {'output_bits':<12} {'BitOPs':>7} {'energy':>7} {'latency':>8}  energy/BitOPs")
    for r in rows:
        if r["default"]:
            continue
        mark = " (shipped default)" if any(d["default"] and d["hardware"] == r["hardware"]
                                           and d["output_bits"] == r["output_bits"] for d in rows) else ""
        print(f"{r['hardware']:<10} {str(r['output_bits']):<12} {100 * r['bitops_saving']:6.1f}% "
              f"{100 * r['energy_saving']:6.1f}% {100 * r['latency_saving']:7.1f}%  "
              f"{r['energy_saving'] / r['bitops_saving']:.2f}{mark}")


if __name__ == "__main__":
    main()

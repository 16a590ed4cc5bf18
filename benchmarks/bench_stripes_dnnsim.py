"""The stripes profile's array against its designers' simulator's cycle formula, layer by layer.

DNNsim (github isakedo/DNNsim), the Stripes designers' later simulator, computes a convolution's compute cycles
per image as ceil(windows / 16) * ceil(filters / 256) * ceil(channels / 16) * K^2 * P -- 16 tiles x 16 filters x
16 windows x 16 lanes, P the activation's bits, independent of the values. This prints, for every convolution of
CIFAR ResNet-20 at 8 and 4 activation bits (one image), that formula beside the compute cycles of the tiling the
array model picks on the shipped ``stripes`` profile, and the whole forward pass's cycles (DRAM stalls included).

    python benchmarks/bench_stripes_dnnsim.py [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from cptsim.cost.hardware import load_profile
from cptsim.cost.hardware.array import problem_alternatives
from cptsim.cost.hardware.tiling import search
from cptsim.measure.profiler import profile_named_model


def dnnsim_cycles(windows: int, filters: int, channels: int, k: int, p: int) -> int:
    return math.ceil(windows / 16) * math.ceil(filters / 256) * math.ceil(channels / 16) * k * k * p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    hw = load_profile("stripes")
    spec = hw.array_spec()
    prof = profile_named_model("resnet20", (3, 32, 32), 10)
    a = prof.arrays()
    rows = []
    for bits in (8, 4):
        for l, r in enumerate(prof.layers):
            if r.type != "Conv2d":
                continue
            c = r.conv
            (times, p), = problem_alternatives(a, l, 0, 1.0, float(bits), float(bits), float(hw.pack_factor(bits, bits)),
                                               16.0, hw.params["array"]["dataflow"])[0]
            acc = search(p, spec)
            rows.append({"bits": bits, "layer": r.name, "in": c["in_channels"], "out": c["out_channels"],
                         "k": c["kernel"][0], "out_hw": c["out_hw"],
                         "dnnsim": dnnsim_cycles(c["out_hw"][0] * c["out_hw"][1], c["out_channels"],
                                                 c["in_channels"], c["kernel"][0], bits),
                         "cptsim_compute": times * acc.compute_cycles, "cptsim_total": times * acc.cycles})
    if args.json:
        json.dump({"rows": rows}, sys.stdout, indent=1)
        print()
        return 0
    print("resnet20 forward convolutions on stripes, one image: compute cycles, DNNsim's formula vs cptsim's array")
    print(f"{'bits':>4} {'layer':<24} {'in':>3} {'out':>3} {'k':>2} {'DNNsim':>8} {'cptsim':>8} {'ratio':>6} "
          f"{'with DRAM':>10}")
    for r in rows:
        print(f"{r['bits']:>4} {r['layer']:<24} {r['in']:>3} {r['out']:>3} {r['k']:>2} {r['dnnsim']:>8,} "
              f"{r['cptsim_compute']:>8,.0f} {r['cptsim_compute'] / r['dnnsim']:>6.3f} {r['cptsim_total']:>10,.0f}")
    for bits in (8, 4):
        sel = [r for r in rows if r["bits"] == bits]
        print(f"{bits} bits: all {len(sel)} layers, DNNsim {sum(r['dnnsim'] for r in sel):,} cycles, cptsim compute "
              f"{sum(r['cptsim_compute'] for r in sel):,.0f}, with DRAM stalls {sum(r['cptsim_total'] for r in sel):,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

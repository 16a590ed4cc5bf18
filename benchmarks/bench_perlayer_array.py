"""Where an accelerator's array gives speed for low widths, layer by layer, and what a per-layer plan does with it.

CIFAR ResNet-20 (batch 128, 64,000 steps) on the ``bitfusion`` profile. Per quantized layer: its training step's
latency at 4 bits over its latency at 8 bits (gradients at 8) under the array model and under the roofline it
replaced. A 16-channel layer fills 16 of the array's rows at 8 bits and 16 of 64 packed row slots at 4 bits: no
faster. Then the per-layer MILP (``cptsim plan --per-layer``; equal layer weights) under a latency budget of 92% of
static 8 bits around the best uniform schedule: which layers it moves and by how much.

    python benchmarks/bench_perlayer_array.py [--budget 0.92] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from cptsim.cost import estimate
from cptsim.cost.hardware import load_profile
from cptsim.cost.schedules import parse_schedule
from cptsim.planner.perlayer import plan_layers
from cptsim.planner.workload import Workload


def per_layer_latency(w, hw, spec: str) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = estimate(w.profile, parse_schedule(spec), hw, steps=w.steps, batch_size=w.batch_size,
                     dataset_size=w.dataset_size)
    return {r["name"]: r["latency_s"]["total"] for r in c.per_layer}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=0.92, help="latency budget, fraction of static 8 bits")
    ap.add_argument("--base", default="cos-tri:4-7:g8:n1", help="the uniform schedule the offsets are around")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    w = Workload.build("resnet20", dataset="cifar10", steps=64000, batch_size=128)
    hw = load_profile("bitfusion")
    roof = hw.roofline()
    a = w.profile.arrays()
    quant = [n for n, q in zip(a.names, a.quantized) if q]
    conv = {r.name: r.conv for r in w.profile.layers}
    rows = {}
    for model, h in (("array", hw), ("roofline", roof)):
        l4, l8 = per_layer_latency(w, h, "static:4:g8"), per_layer_latency(w, h, "static:8:g8")
        for n in quant:
            rows.setdefault(n, {})[model] = l4[n] / l8[n]
    full = w.estimate(parse_schedule("static:8:g8"), hw).latency_s["total"]
    base = parse_schedule(args.base)
    lp = plan_layers(w, hw, base, "latency", args.budget * full)
    res = {"budget": args.budget, "base": args.base,
           "layers": [{"name": n, "in_channels": (conv[n] or {}).get("in_channels"),
                       "out_channels": (conv[n] or {}).get("out_channels"),
                       "lat_4_over_8_array": rows[n]["array"], "lat_4_over_8_roofline": rows[n]["roofline"],
                       "offset": None if lp is None else lp.offsets.get(n, 0)} for n in quant],
           "plan": None if lp is None else {"rules": lp.resolved.layer_schedule.to_text()
                                            if hasattr(lp.resolved, "layer_schedule") else None,
                                            "score": lp.score, "uniform_score": lp.uniform_score,
                                            "latency_vs_static8": lp.cost / full}}
    if args.json:
        json.dump(res, sys.stdout, indent=1)
        print()
        return 0
    print(f"resnet20 on bitfusion: a layer's step latency at 4 bits / at 8 bits, and the per-layer plan's offset "
          f"around {args.base} within {100 * args.budget:.0f}% of static 8 latency")
    print(f"{'layer':<24} {'in':>4} {'out':>4} {'array':>7} {'roofline':>9} {'offset':>7}")
    for r in res["layers"]:
        off = "-" if r["offset"] is None else f"{r['offset']:+d}"
        print(f"{r['name']:<24} {r['in_channels'] or '':>4} {r['out_channels'] or '':>4} "
              f"{r['lat_4_over_8_array']:>7.3f} {r['lat_4_over_8_roofline']:>9.3f} {off:>7}")
    if res["plan"]:
        p = res["plan"]
        print(f"plan: score {p['score']:.4f} (uniform {p['uniform_score']:.4f}), latency "
              f"{100 * p['latency_vs_static8']:.1f}% of static 8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

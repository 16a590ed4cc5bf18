"""What low precision and CPT 3-8 save on each accelerator, forward pass and whole training step, array model
against the roofline it replaced.

CIFAR ResNet-20 (batch 128, 64,000 steps as CPT trains it), priced with each shipped accelerator profile as it
ships (the array, buffers and tiling search) and with the same file without its array table (the roofline over
total MACs and bytes that every accelerator was priced with before). Prints, per profile and model: a 4-bit
forward pass relative to an 8-bit one, and CPT 3-8 (g8, 32 cycles) relative to static 8 bits, forward only and for
the whole step, in latency and energy.

    python benchmarks/bench_accel_savings.py [--model resnet20] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from cptsim.cost import estimate
from cptsim.cost.hardware import load_profile
from cptsim.measure.profiler import profile_named_model
from cptsim.schedules import make_schedule

PROFILES = ("bitfusion", "stripes", "int8-systolic")


def figures(prof, hw, steps: int, batch: int) -> dict:
    s8 = make_schedule("static", q_min=8, q_max=8, g_bits=8)
    s4 = make_schedule("static", q_min=4, q_max=4, g_bits=8)
    cpt = make_schedule("cos-rep", q_min=3, q_max=8, g_bits=8, cycles=32)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c8, c4, cc = (estimate(prof, s, hw, steps=steps, batch_size=batch) for s in (s8, s4, cpt))
    for metric, key in (("latency", "latency_s"), ("energy", "energy_j")):
        a8, a4, ac = getattr(c8, key), getattr(c4, key), getattr(cc, key)
        out[metric] = {"fwd_4_vs_8": a4["fwd"] / a8["fwd"], "cpt_fwd_vs_8": ac["fwd"] / a8["fwd"],
                       "cpt_step_vs_8": ac["total"] / a8["total"]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--steps", type=int, default=64000)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    prof = profile_named_model(args.model, (3, 32, 32), 10)
    res = {"model": args.model, "steps": args.steps, "batch_size": args.batch_size, "profiles": {}}
    for name in PROFILES:
        res["profiles"][name] = {"array": figures(prof, load_profile(name), args.steps, args.batch_size),
                                 "roofline": figures(prof, load_profile(name).roofline(), args.steps,
                                                     args.batch_size)}
    if args.json:
        json.dump(res, sys.stdout, indent=1)
        print()
        return 0
    print(f"{args.model}, batch {args.batch_size}: cost relative to static 8 bits (g8); 'roofline' = before")
    print(f"{'profile':<14} {'model':<9} {'metric':<8} {'fwd 4b/8b':>10} {'CPT fwd':>8} {'CPT step':>9}")
    for name, d in res["profiles"].items():
        for model in ("roofline", "array"):
            for metric in ("latency", "energy"):
                f = d[model][metric]
                print(f"{name:<14} {model:<9} {metric:<8} {f['fwd_4_vs_8']:>10.3f} {f['cpt_fwd_vs_8']:>8.3f} "
                      f"{f['cpt_step_vs_8']:>9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

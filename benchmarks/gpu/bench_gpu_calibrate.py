"""What `cptsim hw calibrate --device cuda` would write from a saved GPU measurement, and how well that profile
-- microbenchmarks plus the generation's inherited constants, no network fitted on the card -- prices whole networks
measured on the same card (issue 23, item 4).

    python benchmarks/gpu/bench_gpu_calibrate.py                       # the H100 run in benchmarks/results/gpu-shape-model-H100-run1.json
    python benchmarks/gpu/bench_gpu_calibrate.py --records R.json --runs A.json,B.json [--json]

--records: a `cptsim hw calibrate --device cuda --json` output (its "records") or a benchmarks/gpu/gpu_measure.py JSON
(converted: its GEMM grid, depthwise convolutions, stream ops, ResNet-20 steps and NVML loop).
--runs: gpu_measure.py JSONs whose timm AMP training rows are compared (default: the three H100 runs).
Prints the constants, then per network measured vs modelled img/s for the calibrated profile and the shipped one.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

RUNS = [HERE.parent / "results" / f"gpu-shape-model-H100-run{i}.json" for i in (1, 2, 3)]


def records_from_measure(doc: dict) -> dict:
    """gpu_measure.py's JSON -> gpu_micro's record dict (the same GEMM/conv/membw record format)."""
    if "records" in doc:  # a `cptsim hw calibrate --json` output
        return doc["records"]
    from cptsim.measure.profiler import profile_named_model

    dev = doc["device"]
    rec = {"gemm": doc["gemm"], "conv": [c for c in doc["conv"] if c.get("groups", 1) > 1 and c["groups"] == c["C"]],
           "membw": [m for m in doc["membw"] if m.get("op") in ("copy", "add") and m.get("n") == 100_000_000],
           "device": {"name": dev.get("name"), "capability": dev.get("capability"), "sm_count": dev.get("sm_count"),
                      "boost_clock_mhz": dev["clock_rate"] / 1e3 if dev.get("clock_rate") else None,
                      "power_limit_w": doc.get("energy", {}).get("power_limit_w")},
           "torch_version": dev.get("torch", "?").split("+")[0], "measured_at": "(from a gpu_measure.py run)"}
    r20 = {(r["graphed"], r["cudnn_benchmark"]): r for r in doc.get("resnet20", [])}
    if (True, True) in r20 and (False, True) in r20:
        totals = profile_named_model("resnet20", (3, 32, 32), 10).ops.totals()
        rec["resnet20"] = {"batch": 128, "launches": float(totals["launches"]),
                           "conv_launches": float(totals["conv_launches"]),
                           "eager_ms": r20[(False, True)]["step_ms_median"],
                           "graphed_ms": r20[(True, True)]["step_ms_median"]}
    if doc.get("launch"):
        rec["launch"] = doc["launch"][0]
    e = doc.get("energy", {})
    if e.get("train_loop", {}).get("mean_power_w"):
        rec["power"] = {"busy_power_w": e["train_loop"]["mean_power_w"],
                        "idle_power_w": e.get("idle", {}).get("mean_power_w")}
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", default=str(RUNS[0]))
    ap.add_argument("--runs", default=",".join(str(r) for r in RUNS))
    ap.add_argument("--shipped", default="h100", help="the shipped profile to compare with (default h100)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from fit_gpu_model import profiles

    from cptsim.calibration import gpu_fit as F
    from cptsim.calibration.gpu_micro import calibrated_profile_text, constants_from_records
    from cptsim.cost.hardware import load_profile, parse_profile
    from gpu_zoo_profiles import family

    records = records_from_measure(json.loads(Path(args.records).read_text()))
    consts = constants_from_records(records)
    text = calibrated_profile_text(records, "calibrated")
    cal = parse_profile(text.encode(), "calibrated.toml")
    shipped = load_profile(args.shipped)
    profs = profiles()
    rows = []
    for f in args.runs.split(","):
        for r in json.loads(Path(f).read_text()).get("timm_train", []):
            if r.get("precision") == "amp" and r["model"] in profs and r.get("img_per_s_median"):
                row = F.Row(r["model"], family(r["model"]), int(r["batch"]), float(r["img_per_s_median"]),
                            r["format"] == "nhwc")
                rows.append({"model": row.model, "format": r["format"], "batch": row.batch, "measured": row.img_s,
                             "calibrated": F.predicted_img_s(cal, profs[row.model], row),
                             "shipped": F.predicted_img_s(shipped, profs[row.model], row)})
    for r in rows:
        r["error_calibrated"] = r["calibrated"] / r["measured"] - 1
        r["error_shipped"] = r["shipped"] / r["measured"] - 1
    doc = {"constants": consts, "profile": text,
           "calibrated": F.error_summary([r["error_calibrated"] for r in rows]),
           "shipped": F.error_summary([r["error_shipped"] for r in rows]), "rows": rows}
    if args.json:
        print(json.dumps(doc, indent=1, default=float))
        return 0
    print(text)
    print(f"{'model':30} fmt   batch  measured  calibrated       {args.shipped} (shipped)")
    for r in rows:
        print(f"{r['model']:30} {r['format']} {r['batch']:5d} {r['measured']:9.0f} {r['calibrated']:9.0f} "
              f"{100 * r['error_calibrated']:+5.0f}%  {r['shipped']:9.0f} {100 * r['error_shipped']:+5.0f}%")
    for k in ("calibrated", "shipped"):
        s = doc[k]
        print(f"{k:10}: n {s['n']}, median |error| {100 * s['median_abs']:.1f}%, p90 {100 * s['p90_abs']:.1f}%, "
              f"worst {100 * s['worst_abs']:.1f}%, within 25%: {s['within_25pct']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""cptsim's Bit Fusion model against the Bit Fusion authors' own simulator, layer by layer.

The authors publish their simulator's per-layer results (github.com/hsharma35/bitfusion,
results/bitfusion-eyeriss-sim-sweep.csv; the rows are in tests/data/bitfusion_authors/sweep.csv) for their eight
benchmarks at batch 16, on arrays of 16 x 32 .. 16 x 256 Fusion Units and DRAM interfaces of 192 and 4096 bits per
cycle. This rebuilds the same 61 layers (tests/data/bitfusion_authors/layers.csv, from their benchmarks.py) and
prices each with the shipped ``bitfusion`` profile -- before: its roofline over total MACs and bytes (what a
profile without an array table still gets); after: its array, buffers and tiling search -- changing only what the
sweep changes (columns, buffers scaled with them as the CSV's buffer columns say, the interface width). Nothing is
fitted. Prints per network (and with --layers per layer) cycles, memory-wait cycles, DRAM bits and buffer accesses
against the authors'.

    python benchmarks/bench_bitfusion_authors.py [--layers] [--json]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from cptsim.cost.hardware import load_profile
from cptsim.cost.hardware.tiling import Problem, search

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "bitfusion_authors"
BATCH = 16


def layers() -> list[dict]:
    with open(DATA / "layers.csv", newline="") as f:
        return [{k: (v if k in ("network", "layer") else int(v)) for k, v in r.items()} for r in csv.DictReader(f)]


def authors() -> dict:
    """(columns, interface bits, network, layer) -> the authors' row."""
    out = {}
    with open(DATA / "sweep.csv", newline="") as f:
        for r in csv.DictReader(f):
            layer = r["Layer"].rsplit("/", 1)[0]
            out[(int(r["M"]), int(r["Bandwidth (bits/cycle)"]), r["Network"], layer)] = r
    return out


def configs(ref: dict) -> list[tuple[int, int]]:
    return sorted({k[:2] for k in ref}, key=lambda c: (c[1], c[0]))


def problem(hw, row: dict) -> Problem:
    k, o = float(row["kernel"]), float(row["out_size"])
    ip, wp = row["input_bits"], row["weight_bits"]
    return Problem(float(BATCH), o, o, k, k, float(row["stride"]), k * k, float(row["in_channels"]),
                   float(row["out_channels"]), float(hw.pack_factor(wp, ip)), float(ip), float(wp), 32.0,
                   bool(row["im2col"]))


def spec_for(hw, columns: int, interface: int, ref_row: dict):
    base = hw.array_spec()
    scale = columns / base.columns
    assert float(ref_row["WBUF Size (bits)"]) == hw.params["array"]["weight_buffer_bytes"] * scale  # bytes, in truth
    return dataclasses.replace(base, columns=columns, wbuf_bits=base.wbuf_bits * scale,
                               ibuf_bits=base.ibuf_bits * scale, obuf_bits=base.obuf_bits * scale,
                               interface_bits=float(interface))


def roofline(hw, row: dict, columns: int, interface: int) -> tuple[float, float]:
    """(cycles, DRAM bits) of the roofline the profile priced this layer with before the array model: peak MACs
    per cycle at the widths, one read of each operand at its width and one 32-bit write of the output."""
    k, o = row["kernel"], row["out_size"]
    macs = BATCH * o * o * k * k * row["in_channels"] * row["out_channels"]
    i = (o - 1) * row["stride"] + k
    bits = (k * k * row["in_channels"] * row["out_channels"] * row["weight_bits"]
            + BATCH * i * i * row["in_channels"] * row["input_bits"] + BATCH * o * o * row["out_channels"] * 32)
    rate = 16 * columns * float(hw.pack_factor(row["weight_bits"], row["input_bits"]))
    return max(macs / rate, bits / interface), float(bits)


def run(show_layers: bool) -> dict:
    hw = load_profile("bitfusion")
    ref = authors()
    rows = layers()
    out = {"configs": []}
    t0 = time.perf_counter()
    for columns, interface in configs(ref):
        any_ref = ref[(columns, interface, rows[0]["network"], rows[0]["layer"])]
        spec = spec_for(hw, columns, interface, any_ref)
        nets: dict[str, dict] = {}
        per_layer = []
        for row in rows:
            r = ref[(columns, interface, row["network"], row["layer"])]
            acc = search(problem(hw, row), spec)
            rc, rd = roofline(hw, row, columns, interface)
            a = {"cycles": float(r["Cycles"]), "wait": float(r["Memory wait cycles"]),
                 "dram": float(r["DRAM Read"]) + float(r["DRAM Write"]),
                 "buf": sum(float(r[c]) for c in ("WBUF Read", "WBUF Write", "IBUF Read", "IBUF Write",
                                                  "OBUF Read", "OBUF Write"))}
            m = {"cycles": acc.cycles, "wait": acc.stall_cycles, "dram": acc.dram_read_bits + acc.dram_write_bits,
                 "buf": acc.wbuf_read_bits + acc.wbuf_write_bits + acc.ibuf_read_bits + acc.ibuf_write_bits
                 + acc.obuf_read_bits + acc.obuf_write_bits}
            rec = {"network": row["network"], "layer": row["layer"], "authors": a, "cptsim": m,
                   "roofline": {"cycles": rc, "dram": rd}}
            per_layer.append(rec)
            n = nets.setdefault(row["network"], {"authors": dict.fromkeys(a, 0.0), "cptsim": dict.fromkeys(m, 0.0),
                                                 "roofline": {"cycles": 0.0, "dram": 0.0}, "ln": [], "ln_before": []})
            for side, vals in (("authors", a), ("cptsim", m), ("roofline", rec["roofline"])):
                for key, v in vals.items():
                    n[side][key] += v
            n["ln"].append(abs(math.log(m["cycles"] / a["cycles"])))
            n["ln_before"].append(abs(math.log(rc / a["cycles"])))
        lns = [x for n in nets.values() for x in n["ln"]]
        lns_before = [x for n in nets.values() for x in n["ln_before"]]
        summary = {
            "columns": columns, "interface_bits": interface,
            "networks": {k: {"cycles_ratio": v["cptsim"]["cycles"] / v["authors"]["cycles"],
                             "cycles_ratio_before": v["roofline"]["cycles"] / v["authors"]["cycles"],
                             "wait_ratio": (v["cptsim"]["wait"] / v["authors"]["wait"]) if v["authors"]["wait"]
                             else None,
                             "dram_ratio": v["cptsim"]["dram"] / v["authors"]["dram"],
                             "dram_ratio_before": v["roofline"]["dram"] / v["authors"]["dram"],
                             "buffer_ratio": v["cptsim"]["buf"] / v["authors"]["buf"],
                             "median_abs_ln": float(np.median(v["ln"])), "worst_abs_ln": float(max(v["ln"])),
                             "median_abs_ln_before": float(np.median(v["ln_before"])),
                             "worst_abs_ln_before": float(max(v["ln_before"]))}
                         for k, v in nets.items()},
            "layers_median_abs_ln": float(np.median(lns)), "layers_worst_abs_ln": float(max(lns)),
            "layers_median_abs_ln_before": float(np.median(lns_before)),
            "layers_worst_abs_ln_before": float(max(lns_before)),
        }
        if show_layers:
            summary["layers"] = per_layer
        out["configs"].append(summary)
    out["seconds"] = time.perf_counter() - t0
    out["searches"] = len(rows) * len(out["configs"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", action="store_true", help="print every layer too")
    ap.add_argument("--json", action="store_true", help="one JSON object of the figures on stdout")
    args = ap.parse_args(argv)
    res = run(args.layers)
    if args.json:
        json.dump(res, sys.stdout, indent=1)
        print()
        return 0
    for c in res["configs"]:
        print(f"\n16 x {c['columns']} Fusion Units, {c['interface_bits']} bits/cycle "
              f"(ratios are cptsim / authors; 'before' = the roofline)")
        print(f"{'network':<10} {'cycles':>8} {'before':>7} {'|ln| med/worst':>15} {'before':>12} "
              f"{'wait':>7} {'DRAM':>7} {'before':>7} {'buffers':>8}")
        for name, n in c["networks"].items():
            wait = "-" if n["wait_ratio"] is None else f"{n['wait_ratio']:.3f}"
            print(f"{name:<10} {n['cycles_ratio']:>8.3f} {n['cycles_ratio_before']:>7.2f} "
                  f"{n['median_abs_ln']:>7.3f}/{n['worst_abs_ln']:<7.3f} "
                  f"{n['median_abs_ln_before']:>5.2f}/{n['worst_abs_ln_before']:<5.2f} {wait:>7} "
                  f"{n['dram_ratio']:>7.3f} {n['dram_ratio_before']:>7.2f} {n['buffer_ratio']:>8.3f}")
        print(f"all 61 layers: |ln cycles ratio| median {c['layers_median_abs_ln']:.4f}, worst "
              f"{c['layers_worst_abs_ln']:.4f} (before: {c['layers_median_abs_ln_before']:.2f}, "
              f"{c['layers_worst_abs_ln_before']:.2f})")
        for rec in c.get("layers", []):
            a, m = rec["authors"], rec["cptsim"]
            print(f"  {rec['network']:<10} {rec['layer']:<22} cycles {m['cycles']:>12,.0f} / {a['cycles']:>12,.0f}"
                  f"  wait {m['wait']:>11,.0f} / {a['wait']:>11,.0f}  DRAM {m['dram']:>14,.0f} / {a['dram']:>14,.0f}")
    print(f"\n{res['searches']} tiling searches in {res['seconds']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

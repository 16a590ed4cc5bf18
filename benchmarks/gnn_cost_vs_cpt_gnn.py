"""cptsim's BitOPs for cpt_gnn's ogbn-arxiv setting against cpt_gnn's own cost formula (issue 24 item 5).

    python benchmarks/gnn_cost_vs_cpt_gnn.py [--model gcn] [--epochs 500] [--schedule cos-rep:3-8:g8:n8] [--json]

cpt_gnn (Wolfe & Kyrillidis, `wolfecameron/BetterPrecisionSchedules`, cpt_gnn/get_flops.py) costs a run as the
fvcore FLOPs of the full-precision model's forward times, per step, b^2/32^2 + 2 b g/32^2 -- the forward, the
gradient with respect to the input and the one with respect to the weights, each as many MACs as the forward, at
b x b, b x g and b x g bits. fvcore counts one FLOP per MAC of a dense layer and nothing for the sparse aggregation.

Here: (1) their figure, from the forward MACs that torch.utils.flop_counter.FlopCounterMode counts on the
full-precision model (an independent count of the dense work; it too sees no aggregation), on a 2,000-node graph and
scaled by N / 2000 (a dense layer's MACs are exactly linear in N); (2) cptsim's BitOPs of the same run
(`cptsim.cost.estimate` on the profile `cptsim cost` uses), split into the dense layers and the aggregation. Two
differences, both in the table: cptsim counts no gradient for the first layer's input (the features need none),
and it counts the aggregation (nnz x width MACs, forward and error pass) at the 32 bits it runs at.
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gcn")
    ap.add_argument("--dataset", default="ogbn-arxiv")
    ap.add_argument("--epochs", type=int, default=500)
    ap.add_argument("--schedule", default="cos-rep:3-8:g8:n8")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    import numpy as np
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from cptsim.cost.model import estimate
    from cptsim.cost.schedules import parse_schedule
    from cptsim.data import dataset_info
    from cptsim.measure.profiler import profile_named_model
    from cptsim.models import create_model
    from cptsim.models.graph import bind_graph, random_graph

    info = dataset_info(a.dataset)
    n, f = info.input_shape
    sched = parse_schedule(a.schedule)
    steps = a.epochs  # full batch: one step per epoch
    bits, gbits = sched.bits(steps).astype(np.float64), sched.grad_bits(steps).astype(np.float64)

    # (1) cpt_gnn's formula on FlopCounterMode's forward count of the FP32 model
    small = 2000
    torch.manual_seed(0)
    net = create_model(a.model, num_classes=info.num_classes, in_channels=f, input_shape=(small, f), graph=True)
    bind_graph(net, random_graph(small, 10 * small))
    net.eval()
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        net(torch.randn(1, small, f))
    fwd_macs = fc.get_total_flops() / 2 * n / small  # FLOPs = 2 x MACs; dense work is linear in the node count
    theirs = float(fwd_macs * np.sum(bits ** 2 + 2 * bits * gbits))

    # (2) cptsim's estimate, dense layers and aggregation apart
    prof = profile_named_model(a.model, (n, f), info.num_classes, graph_edges=info.graph_edges, optimizer="adam")
    cost = estimate(prof, sched, None, steps=steps, batch_size=1, per_layer=True)
    dense = agg = 0.0
    for layer, row in zip(prof.layers, cost.per_layer):
        total = row["bitops"]["total"]
        if layer.type == "Aggregation":
            agg += total
        else:
            dense += total
    dense_fwd_macs = sum(layer.macs["fwd"] for layer in prof.layers if layer.type != "Aggregation")
    doc = {"model": a.model, "dataset": a.dataset, "nodes": n, "edges": info.graph_edges, "steps": steps,
           "schedule": sched.to_text(), "flopcounter_forward_macs": fwd_macs, "cptsim_dense_forward_macs": dense_fwd_macs,
           "cpt_gnn_bitops": theirs, "cptsim_dense_bitops": dense, "cptsim_aggregation_bitops": agg,
           "cptsim_total_bitops": dense + agg, "aggregation_adds": agg / theirs,
           "cptsim_over_cpt_gnn": (dense + agg) / theirs}
    if a.json:
        print(json.dumps(doc, indent=1))
        return
    print(f"{a.model} on {a.dataset} ({n:,} nodes, {info.graph_edges:,} edges), {steps} full-batch steps of "
          f"{sched.to_text()}")
    print(f"  forward MACs per step: FlopCounterMode {fwd_macs:,.0f}  cptsim dense {dense_fwd_macs:,}")
    print(f"  cpt_gnn's formula (fvcore FLOPs x (b^2 + 2bg)):  {theirs:.4e} BitOPs")
    print(f"  cptsim, dense layers:                            {dense:.4e} BitOPs "
          f"({100 * (dense / theirs - 1):+.2f}%: no gradient for the input features)")
    print(f"  cptsim, aggregation (FP32, left out by theirs):  {agg:.4e} BitOPs (+{100 * agg / theirs:.1f}%)")
    print(f"  cptsim, total:                                   {dense + agg:.4e} BitOPs "
          f"({(dense + agg) / theirs:.3f}x theirs)")


if __name__ == "__main__":
    main()

"""Seconds per full-batch GCN epoch, quantized vs FP32, side by side in one process (issue 24 item 5).

    python benchmarks/bench_gnn_epoch.py [--nodes 169343] [--features 128] [--classes 40] [--deg 14]
                                         [--model gcn] [--rounds 5] [--bits 8] [--quant-agg] [--json]

The graph is ``synthetic-graph:N,F,K:DEG`` (cptsim.data.graph): by default ogbn-arxiv's size, 169,343 nodes with
128 features and 40 classes, and DEG 14, 2,370,802 directed edges against arxiv's 2,315,598 after bidirecting (its
1.17M node pairs). One epoch is one training step on the whole graph, as cpt_gnn trains arxiv: forward, the
cross-entropy over the training mask, backward, Adam. Two copies of the same model -- one swapped to quantized
layers at --bits (weights per channel, inputs per tensor, the error with stochastic rounding at 8 bits), one plain
FP32 -- take alternating steps on the same graph, in an order that reverses every round, so a noisy shared machine
favours neither; the figure is median(quantized epoch) / median(FP32 epoch). Target (issue 24): at most 1.3x.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
import torch.nn.functional as F


def _epoch(model, opt, x, y) -> float:
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=False)
    loss = F.cross_entropy(model(x), y)  # logits [1, C, N]; labels -100 outside the training mask
    loss.backward()
    opt.step()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=169_343)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--classes", type=int, default=40)
    ap.add_argument("--deg", type=int, default=14)
    ap.add_argument("--model", default="gcn")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bits", type=int, default=8)
    ap.add_argument("--quant-agg", action="store_true", help="quantize the aggregation too")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)

    from cptsim.data import load_datasets
    from cptsim.models import create_model, default_fp_layers
    from cptsim.models.graph import bind_graph
    from cptsim.numerics.layers import quantize_model

    name = f"synthetic-graph:{a.nodes},{a.features},{a.classes}:{a.deg}"
    t0 = time.perf_counter()
    train_set, _, info = load_datasets(name, None)
    gen_s = time.perf_counter() - t0
    x, y = train_set.gather([0], "cpu")
    torch.manual_seed(0)
    fp = create_model(a.model, num_classes=info.num_classes, in_channels=info.input_shape[0],
                      input_shape=tuple(info.input_shape))
    bind_graph(fp, train_set.graph.edge_index)
    q = copy.deepcopy(fp)
    precision = quantize_model(q, fp_layers=default_fp_layers(q), **({"quant_agg": True} if a.quant_agg else {}))
    precision.set(a.bits, 8)
    models = {"fp32": fp, "quantized": q}
    opts = {k: torch.optim.Adam(m.parameters(), lr=1e-3, weight_decay=5e-4) for k, m in models.items()}
    for k, m in models.items():  # warm-up: allocator, first-call costs
        m.train()
        _epoch(m, opts[k], x, y)
    times: dict[str, list[float]] = {k: [] for k in models}
    for r in range(a.rounds):
        for k in (("fp32", "quantized") if r % 2 == 0 else ("quantized", "fp32")):
            times[k].append(_epoch(models[k], opts[k], x, y))
    med = {k: statistics.median(v) for k, v in times.items()}
    doc = {"graph": name, "nodes": info.input_shape[0], "features": info.input_shape[1],
           "edges": info.graph_edges, "model": a.model, "bits": a.bits, "quant_agg": a.quant_agg,
           "threads": torch.get_num_threads(), "generate_s": round(gen_s, 2),
           "fp32_epoch_s": round(med["fp32"], 4), "quantized_epoch_s": round(med["quantized"], 4),
           "ratio": round(med["quantized"] / med["fp32"], 3), "rounds": a.rounds,
           "samples": {k: [round(t, 4) for t in v] for k, v in times.items()}}
    if a.json:
        print(json.dumps(doc, indent=1))
        return
    print(f"{a.model} on {name}: {doc['nodes']} nodes, {doc['edges']} edges, {torch.get_num_threads()} threads")
    print(f"  FP32 epoch       {doc['fp32_epoch_s']:.3f} s (median of {a.rounds})")
    print(f"  quantized epoch  {doc['quantized_epoch_s']:.3f} s at {a.bits}/8 bits"
          f"{' (aggregation too)' if a.quant_agg else ''}")
    print(f"  ratio            {doc['ratio']:.3f}x  (target <= 1.3x)")


if __name__ == "__main__":
    main()

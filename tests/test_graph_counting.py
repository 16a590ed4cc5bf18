"""Counting and pricing a graph model's work (issue 24): the sparse aggregation as its own profile entry, by hand
count; what torch's FlopCounterMode sees of it; its kernels in the step's op list; exact profiles of ogbn-arxiv's
size from small graphs; BitOPs and GPU time of the aggregation; Adam and AdamW built and their updates counted."""

from __future__ import annotations

import dataclasses
import json
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

pyg = pytest.importorskip("torch_geometric.nn")
warnings.filterwarnings("ignore", message=".*torch.jit.script.*")

from cptsim.cost.hardware import load_profile  # noqa: E402
from cptsim.cost.model import aggregation_bytes, estimate, step_cost, storage_bits  # noqa: E402
from cptsim.cost.schedules import parse_schedule  # noqa: E402
from cptsim.errors import InputError  # noqa: E402
from cptsim.measure import opcount  # noqa: E402
from cptsim.measure.opcount import (ADAM_BETAS, ADAM_EPS, OpProfile, count_graph_step_ops, count_step_ops,  # noqa: E402
                                    optimizer_label, training_optimizer)
from cptsim.measure.profiler import AGGREGATION, LayerProfile, MacCounter, _profile_graph, profile_model  # noqa: E402

# A fixed graph of N = 5 nodes and E = 7 directed edges, no self-loops (source row 0, target row 1).
N, E = 5, 7
EDGES = torch.tensor([[0, 1, 1, 2, 2, 3, 4],
                      [1, 0, 2, 1, 3, 4, 0]])


class StandInGCN(nn.Module):
    """The default ``gcn`` (cpt_gnn's arxiv QGCN) in PyG's calling convention: GCNConv layers, ReLU, layer norm
    and dropout between; model(x [N, F], edge_index) -> [N, C]."""

    def __init__(self, features: int, hidden: int, classes: int, layers: int = 3):
        super().__init__()
        dims = [features] + [hidden] * (layers - 1) + [classes]
        self.convs = nn.ModuleList(pyg.GCNConv(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x, edge_index):
        h = x
        for i, conv in enumerate(self.convs):
            if i:
                h = F.dropout(h, 0.2, self.training)
            h = conv(h, edge_index)
            if i < len(self.convs) - 1:
                h = F.layer_norm(F.relu(h), h.shape[-1:])
        return h


class Stack(nn.Module):
    """Graph layers one after another, ReLU between."""

    def __init__(self, *convs):
        super().__init__()
        self.convs = nn.ModuleList(convs)

    def forward(self, x, edge_index):
        for i, conv in enumerate(self.convs):
            x = conv(F.relu(x) if i else x, edge_index)
        return x


def _step(model, x=None, edges=EDGES, features=3):
    """One counted training step (forward, cross-entropy, backward) on the fixed graph: the per-graph profile."""
    x = torch.randn(N, features) if x is None else x
    with MacCounter(model) as mc:
        out = model(x, edges)
        F.cross_entropy(out, torch.zeros(out.shape[0], dtype=torch.long)).backward()
        return {r.name: r for r in mc.layer_profile(1, (N, features)).layers}


def _agg(layers):
    return {n: r for n, r in layers.items() if r.type == AGGREGATION}


# ------------------------------------------------------------------------------------------------ hand counts


def test_gcn_aggregation_is_its_own_entry_nnz_with_self_loops_times_width():
    torch.manual_seed(0)
    layers = _step(Stack(pyg.GCNConv(3, 4), pyg.GCNConv(4, 2)))
    # each conv's aggregation follows its dense transform, named after the conv
    assert list(layers) == ["convs.0.lin", "convs.0.aggregate", "convs.1.lin", "convs.1.aggregate"]
    nnz = E + N  # GCNConv adds one self-loop per node
    a0, a1 = layers["convs.0.aggregate"], layers["convs.1.aggregate"]
    # width = the propagated features: GCNConv transforms first (lin), then aggregates at its output width
    assert a0.macs == {"fwd": nnz * 4, "dgrad": nnz * 4, "wgrad": 0}  # dgrad: lin's output needs its gradient
    assert a1.macs == {"fwd": nnz * 2, "dgrad": nnz * 2, "wgrad": 0}
    assert (a0.edges, a0.operand, a0.calls) == (nnz, nnz, 1)  # operand: the per-edge normalisation
    assert a0.numel == {"weight": 0, "input": N * 4, "output": N * 4}
    assert a0.type == "Aggregation" and not a0.quantized and a0.gemm is None
    # PyG's own Linear counts as a Linear: N x 3 x 4 in every phase but the first layer's dgrad (input is data)
    assert layers["convs.0.lin"].macs == {"fwd": N * 12, "dgrad": 0, "wgrad": N * 12}
    assert layers["convs.0.lin"].gemm == {"groups": 1, "n": 4, "k": 3, "rows": N, "rows_per_gemm": 0}


def test_gcn_nnz_is_what_propagate_sees_an_existing_self_loop_is_not_doubled():
    looped = torch.cat([EDGES, torch.tensor([[2], [2]])], dim=1)  # E + 1 edges, one of them a self-loop
    a = _agg(_step(Stack(pyg.GCNConv(3, 4)), edges=looped))["convs.0.aggregate"]
    assert a.edges == E + N  # add_remaining_self_loops keeps node 2's loop and adds the other N - 1


def test_sage_mean_aggregates_before_its_transform_nnz_is_e_and_no_backward_into_the_data():
    layers = _agg(_step(Stack(pyg.SAGEConv(3, 4, aggr="mean"), pyg.SAGEConv(4, 2, aggr="mean"))))
    a0, a1 = layers["convs.0.aggregate"], layers["convs.1.aggregate"]
    # SAGE aggregates its input (width = in_channels) over the E edges (no self-loops; the mean's division by the
    # degree is elementwise, not a MAC); the first layer aggregates the raw features: autograd runs no backward
    assert a0.macs == {"fwd": E * 3, "dgrad": 0, "wgrad": 0}
    assert a1.macs == {"fwd": E * 4, "dgrad": E * 4, "wgrad": 0}
    assert (a0.edges, a0.operand) == (E, 0)  # no per-edge values


def test_gat_aggregation_counts_the_attention_products_and_the_gradient_into_alpha():
    torch.manual_seed(0)
    model = Stack(pyg.GATConv(3, 2, heads=3), pyg.GATConv(6, 2, heads=1, concat=False))
    layers = _agg(_step(model))
    nnz = E + N  # GATConv adds self-loops too
    a0, a1 = layers["convs.0.aggregate"], layers["convs.1.aggregate"]
    # width = heads x channels; fwd: alpha[e,h] x x_j[e,h,c] summed into the target; dgrad: the error back through
    # alpha (transposed); wgrad: d alpha[e,h] = sum_c error[dst(e),h,c] x x_j[e,h,c]
    assert a0.macs == {"fwd": nnz * 6, "dgrad": nnz * 6, "wgrad": nnz * 6}
    assert a1.macs == {"fwd": nnz * 2, "dgrad": nnz * 2, "wgrad": nnz * 2}
    assert a0.operand == nnz * 3 and a1.operand == nnz  # alpha: one value per edge and head


def test_quantized_flag_follows_the_quant_agg_mark_and_step_arrays_carry_it():
    model = Stack(pyg.GCNConv(3, 4), pyg.GCNConv(4, 2))
    model.convs[1].cptsim_quant_agg = True  # what quantize_model(..., quant_agg=True) marks
    layers = _step(model)
    assert not layers["convs.0.aggregate"].quantized and layers["convs.1.aggregate"].quantized
    with MacCounter(model) as mc:
        model(torch.randn(N, 3), EDGES).sum().backward()
        a = mc.step_arrays()
    assert a.aggregation.tolist() == [False, True, False, True]
    assert a.quantized.tolist() == [False, False, False, True]
    assert a.edges.tolist() == [0, E + N, 0, E + N]


def test_a_user_conv_is_counted_as_the_model_itself_and_deep_copies_do_not_count():
    conv = pyg.GCNConv(3, 4)
    with MacCounter(conv) as mc:
        import copy

        copy.deepcopy(conv)(torch.randn(N, 3), EDGES)  # the copy carries the hook; its calls are not ours
        assert mc.step_macs()["fwd"] == 0
        conv(torch.randn(N, 3), EDGES)
        names = [r.name for r in mc.layer_profile(1, (N, 3)).layers]
    assert names == ["lin", "aggregate"] and mc.step_macs()["fwd"] == N * 12 + (E + N) * 4


def test_a_sparse_adjacency_counts_its_stored_entries():
    adj = torch.sparse_coo_tensor(EDGES.flip(0), torch.ones(E), (N, N)).coalesce().to_sparse_csr()
    conv = pyg.GCNConv(3, 4, normalize=False)
    layers = _step(Stack(conv), edges=adj)
    assert layers["convs.0.aggregate"].macs == {"fwd": E * 4, "dgrad": E * 4, "wgrad": 0}


# ------------------------------------------------------------------------------------------------ FlopCounterMode


def test_flop_counter_mode_sees_none_of_the_edge_index_aggregation():
    """torch.utils.flop_counter counts FLOPs only for ops in its registry (mm, addmm, bmm, convolutions, attention).
    The aggregation over an edge_index runs index_select, mul, scatter_add_ / index_add and gather, which have no
    formula there: FlopCounterMode counts the dense transforms exactly and 0 of the sparse work."""
    torch.manual_seed(0)
    model = Stack(pyg.GCNConv(3, 4), pyg.GCNConv(4, 2))
    x = torch.randn(N, 3)
    with FlopCounterMode(display=False) as fc, MacCounter(model) as mc:
        F.cross_entropy(model(x, EDGES), torch.zeros(N, dtype=torch.long)).backward()
        prof = mc.layer_profile(1, (N, 3))
    dense = sum(sum(r.macs.values()) for r in prof.layers if r.type == "Linear")
    agg = sum(sum(r.macs.values()) for r in prof.layers if r.type == AGGREGATION)
    assert fc.get_total_flops() // 2 == dense and agg == 2 * (E + N) * (4 + 2)


def test_flop_counter_mode_on_a_sparse_adjacency_misses_the_forward_and_counts_the_backward_as_dense():
    """With a torch.sparse adjacency, PyG's spmm forward is not counted either, and the gradient's adjᵀ @ error
    reaches FlopCounterMode as an aten.mm of the dense shapes: N x N x width MACs, not nnz x width."""
    adj = torch.sparse_coo_tensor(EDGES.flip(0), torch.ones(E), (N, N)).coalesce()
    conv = pyg.GCNConv(3, 4, normalize=False)
    x = torch.randn(N, 3)
    with FlopCounterMode(display=False) as fwd:
        out = conv(x, adj)
    with FlopCounterMode(display=False) as bwd:
        out.sum().backward()
    lin = N * 3 * 4
    assert fwd.get_total_flops() // 2 == lin  # the transform only
    assert bwd.get_total_flops() // 2 == lin + N * N * 4  # its wgrad + the aggregation's dgrad as a dense N x N mm


# ------------------------------------------------------------------------------------------------ the op list


def test_the_aggregation_kernels_are_in_the_op_list_with_their_bytes_and_apart_from_the_memory_ops():
    torch.manual_seed(0)
    model = StandInGCN(8, 16, 3)
    ops = count_graph_step_ops(model, 8, 40, 160)
    agg = [r for r in ops.records if r.kind == "aggregation"]
    fwd = {r.op.split(".")[1] for r in agg if r.phase == "fwd"}
    bwd = {r.op.split(".")[1] for r in agg if r.phase == "bwd"}
    assert {"index_select", "mul", "scatter_add_"} <= fwd  # gather, weight by the normalisation, scatter-sum
    assert {"gather", "mul", "index_add"} <= bwd  # their transposes
    assert all(r.read_per_sample > 0 and r.launches >= 1 for r in agg if r.op != "aten.new_zeros.default")
    # the dense transforms stay GEMMs; the degree normalisation and layer norms stay memory ops
    assert any(r.kind == "gemm" and "mm" in r.op for r in ops.records)
    assert not any(r.kind == "memory" and r.op.startswith(("aten.index_select", "aten.gather")) for r in ops.records)
    s = ops.summary()
    assert s["fwd"]["aggregation_bytes_per_sample"] == pytest.approx(
        sum(r.read_per_sample + r.write_per_sample for r in agg if r.phase == "fwd"))
    assert s["fwd"]["bytes_per_sample"] == pytest.approx(sum(
        r.read_per_sample + r.write_per_sample for r in ops.records if r.phase == "fwd" and r.kind == "memory"))
    assert s["fwd"]["aggregation_launches"] == sum(r.launches for r in agg if r.phase == "fwd")
    # the op list round-trips through JSON with its new kind
    again = OpProfile.from_json(json.loads(json.dumps(ops.to_json())))
    assert again.to_json() == ops.to_json()


def test_count_step_ops_on_a_graph_model_counts_one_graph_of_the_bound_size():
    torch.manual_seed(0)
    model = StandInGCN(8, 16, 3)
    model.register_buffer("edge_index", torch.zeros(2, 160, dtype=torch.long), persistent=False)  # bind_graph's
    ops = count_step_ops(model, torch.randn(1, 40, 8))
    assert ops.to_json() == count_graph_step_ops(model, 8, 40, 160).to_json()


def test_a_graph_is_counted_exactly_from_small_ones():
    """The profile and the op list come from four small graphs (c = a·N + b·E + c0): the same numbers as a real
    step on a graph of the full size."""
    torch.manual_seed(0)
    model = StandInGCN(8, 16, 3)
    direct = _profile_graph(model, (300, 8), "", "sgd", 1500, direct=True)
    fitted = profile_model(model, (300, 8), graph_edges=1500)
    assert [r.to_json() for r in fitted.layers] == [r.to_json() for r in direct.layers]
    assert fitted.ops.batch_sizes == [1] and direct.ops.batch_sizes == [1, 2]
    d = {(r.op, r.phase, r.kind): r for r in direct.ops.records}
    f = {(r.op, r.phase, r.kind): r for r in fitted.ops.records}
    assert d.keys() == f.keys()
    for k, r in d.items():
        assert (f[k].calls, f[k].launches) == (r.calls, r.launches)
        for field in ("read_per_sample", "read_fixed", "write_per_sample", "write_fixed"):
            assert getattr(f[k], field) == pytest.approx(getattr(r, field), rel=1e-9, abs=1e-6), (k, field)


class Quadratic(nn.Module):
    """A dense N x N product (x xᵀ x, not a module: no MACs, but N² bytes): not per-node or per-edge work."""

    def __init__(self):
        super().__init__()
        self.conv = pyg.GCNConv(4, 3)

    def forward(self, x, edge_index):
        return self.conv(x @ x.t() @ x, edge_index)


def test_a_model_whose_work_is_not_affine_in_the_graph_size_runs_at_its_size_or_is_refused(monkeypatch):
    ops = count_graph_step_ops(Quadratic(), 4, 200, 800)  # small: run on a graph of its own size
    assert ops.batch_sizes == [1, 2]
    assert ops.to_json() == count_graph_step_ops(Quadratic(), 4, 200, 800, direct=True).to_json()
    with pytest.raises(InputError, match="per-node and per-edge"):
        count_graph_step_ops(Quadratic(), 4, 200, 800, direct=False)
    monkeypatch.setattr(opcount, "GRAPH_DIRECT_LIMIT", 999)
    with pytest.raises(InputError, match="bytes of its aten.mm.*per-node and per-edge"):
        count_graph_step_ops(Quadratic(), 4, 200, 800)


def test_ogbn_arxiv_size_profiles_fast_with_the_hand_counted_macs():
    """`cptsim profile --model gcn --dataset ogbn-arxiv`'s numbers: 169,343 nodes of 128 features, hidden 512, 40
    classes, E directed edges (made bidirected, no self-loops), one full-batch step = one sample."""
    nodes, edges = 169_343, 2_315_598
    torch.manual_seed(0)
    prof = profile_model(StandInGCN(128, 512, 40), (nodes, 128), graph_edges=edges)
    check_arxiv_profile(prof, nodes, edges)


def check_arxiv_profile(prof, nodes, edges):
    dense = [r for r in prof.layers if r.type == "Linear"]
    assert sum(r.macs["fwd"] for r in dense) == 169_343 * (128 * 512 + 512 * 512 + 512 * 40)
    assert [r.macs["dgrad"] for r in dense] == [0, nodes * 512 * 512, nodes * 512 * 40]
    nnz = edges + nodes
    agg = [r for r in prof.layers if r.type == AGGREGATION]
    assert [r.name for r in agg] == ["convs.0.aggregate", "convs.1.aggregate", "convs.2.aggregate"]
    assert [r.macs for r in agg] == [{"fwd": nnz * w, "dgrad": nnz * w, "wgrad": 0} for w in (512, 512, 40)]
    assert [r.edges for r in agg] == [nnz] * 3 and prof.input_shape == [nodes, 128]
    assert prof.op_mix() == ["graph", "linear"]
    assert prof.ops.summary()["fwd"]["aggregation_bytes_per_sample"] > nnz * 512 * 4  # at least the gather's


def test_the_registry_gcn_at_ogbn_arxiv_size():
    from cptsim.models import list_models
    from cptsim.measure.profiler import profile_named_model

    if "gcn" not in list_models():
        pytest.skip("the graph models are not registered in this checkout")
    nodes, edges = 169_343, 2_315_598
    check_arxiv_profile(profile_named_model("gcn", (nodes, 128), 40, graph_edges=edges), nodes, edges)


def test_profile_json_keeps_edges_and_the_aggregation_type():
    prof = profile_model(StandInGCN(4, 8, 2), (20, 4), graph_edges=60)
    again = LayerProfile.from_json(json.loads(json.dumps(prof.to_json())))
    assert again.to_json() == prof.to_json()
    a = again.arrays()
    assert a.aggregation.tolist() == [r.type == AGGREGATION for r in prof.layers]
    assert a.edges.tolist() == [80 if r.type == AGGREGATION else 0 for r in prof.layers]


# ------------------------------------------------------------------------------------------------ pricing


@pytest.fixture(scope="module")
def arxiv_like():
    """A GCN on a graph big enough for GPU times to be bandwidth-bound, its middle aggregation quantized."""
    torch.manual_seed(0)
    model = StandInGCN(64, 128, 10)
    model.convs[1].cptsim_quant_agg = True
    return profile_model(model, (2000, 64), graph_edges=16000)


def test_bitops_of_a_graph_profile_are_the_hand_count(arxiv_like):
    q, g = 4, 8
    got = step_cost(arxiv_like.arrays(), q, g, batch=1)["bitops"]
    want = {"fwd": 0, "dgrad": 0, "wgrad": 0}
    for r in arxiv_like.layers:
        quant = r.type == AGGREGATION and r.quantized  # the Linear layers are unquantized here: 32 x 32
        for p, (b1, b2) in (("fwd", (q, q)), ("dgrad", (g, q)), ("wgrad", (g, q))):
            want[p] += r.macs[p] * (b1 * b2 if quant else 32 * 32)
    assert got == want
    agg = [r for r in arxiv_like.layers if r.type == AGGREGATION]
    assert [r.quantized for r in agg] == [False, True, False]


def test_an_accelerator_prices_the_aggregation_as_macs_at_its_widths_with_its_gather_scatter_bytes(arxiv_like):
    # the roofline (a profile without an array table) prices MACs at the widths and a gather's and a scatter's bytes
    hw = load_profile("bitfusion").roofline()
    a = arxiv_like.arrays()
    i = a.names.index("convs.1.aggregate")
    for q in (4, 8):
        cost = estimate(arxiv_like, parse_schedule(f"static:{q}"), hw, steps=1, batch_size=1)
        row = next(r for r in cost.per_layer if r["name"] == "convs.1.aggregate")
        nbytes = aggregation_bytes(a.numel, a.macs, a.quantized, q, 32, 1, a.edges, a.operand,
                                   storage_bits(hw))[i, 0]
        t, _ = hw.gemm_cost(a.macs[i, 0], q, q, nbytes)
        assert row["latency_s"]["fwd"] == pytest.approx(float(t), rel=1e-12)


def test_an_array_prices_the_aggregation_per_node_as_a_gemm_of_its_degree_by_its_width(arxiv_like):
    """On the array, a node's aggregation is its edge values (the input side) times its neighbours' features (the
    weight side, no reuse across nodes): nodes x the fastest tiling of a 1 x ceil(degree) x width GEMM."""
    import math

    from cptsim.cost.hardware.tiling import Problem, search

    hw = load_profile("bitfusion")
    a = arxiv_like.arrays()
    i = a.names.index("convs.1.aggregate")
    edges, width_x_edges = float(a.edges[i]), float(a.macs[i, 0])
    width = width_x_edges / edges
    nodes = float(a.numel[i, 2]) / width
    for q in (4, 8):
        cost = estimate(arxiv_like, parse_schedule(f"static:{q}"), hw, steps=1, batch_size=1)
        row = next(r for r in cost.per_layer if r["name"] == "convs.1.aggregate")
        p = Problem(1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, float(math.ceil(edges / nodes)), float(round(width)),
                    float(hw.pack_factor(q, q)), float(q), float(q), 32.0, False)
        want = nodes * search(p, hw.array_spec()).cycles / 500e6
        assert row["latency_s"]["fwd"] == pytest.approx(want, rel=1e-12)


def test_aggregation_bytes_formula_by_hand():
    # one layer, 10 edges x width 4 (fwd 40 MACs, dgrad 40, GAT-like wgrad 40), 6 nodes, 10 values, FP32
    numel, macs = np.array([[0, 24, 24]]), np.array([[40, 40, 40]])
    b = aggregation_bytes(numel, macs, np.array([False]), 8, 8, 1, np.array([10]), np.array([10]))[0]
    P, Z, V, I, O = 40, 10, 10, 24, 24
    assert b[0] * 8 == P * 32 + 2 * P * 32 + (2 * P * 32 + V * 32) + O * 32 + 2 * Z * 64
    assert b[1] * 8 == P * 32 + 2 * P * 32 + (2 * P * 32 + V * 32) + I * 32 + 2 * Z * 64
    assert b[2] * 8 == P * 32 + P * 32 + V * 32 + 2 * Z * 64
    # no values (SAGE): no weighting pass; a phase that does not run moves nothing
    b = aggregation_bytes(numel, np.array([[40, 0, 0]]), np.array([False]), 8, 8, 2, np.array([10]), np.array([0]))[0]
    assert b[0] * 8 == 2 * (P * 32 + 2 * P * 32 + O * 32 + 2 * Z * 64) and b[1] == b[2] == 0


def _with_edges(prof: LayerProfile, k: int) -> LayerProfile:
    """The profile with every aggregation's edges (and so its MACs and values) k times as many."""
    d = prof.to_json()
    for r in d["layers"]:
        if r["type"] == AGGREGATION:
            r["macs"] = {p: v * k for p, v in r["macs"].items()}
            r["edges"] *= k
            r["operand"] *= k
    return LayerProfile.from_json(d)


def test_gpu_prices_the_aggregation_as_memory_bound_scaling_with_nnz_not_a_gemm_rate(arxiv_like):
    hw = load_profile("h100")
    sched = parse_schedule("static:32")

    def rows(prof, gpu):
        c = estimate(prof, sched, gpu, steps=1, batch_size=1)
        return {r["name"]: r["latency_s"]["total"] for r in c.per_layer}

    base = rows(arxiv_like, hw)
    a = arxiv_like.arrays()
    i = a.names.index("convs.0.aggregate")
    nbytes = aggregation_bytes(a.numel, a.macs, a.quantized, 32, 32, 1, a.edges, a.operand, storage_bits(hw),
                               hw.full_precision_bits(32))[i]
    assert base["convs.0.aggregate"] == pytest.approx(nbytes.sum() / (hw.params["bandwidth_gb_s"] * 1e9
                                                                      * hw.calibration["memory_efficiency"]))
    # ten times every tier's peak: the GEMMs speed up, the aggregation does not
    fast = dataclasses.replace(hw, params={**hw.params, "tiers": [{**t, "peak_ops": t["peak_ops"] * 10}
                                                                   for t in hw.params["tiers"]]})
    quick = rows(arxiv_like, fast)
    assert quick["convs.0.aggregate"] == pytest.approx(base["convs.0.aggregate"], rel=1e-12)
    assert quick["convs.1.lin"] < base["convs.1.lin"]
    # twice the edges: close to twice the time (the node rows written do not grow)
    double = rows(_with_edges(arxiv_like, 2), hw)
    assert 1.8 < double["convs.0.aggregate"] / base["convs.0.aggregate"] < 2.0
    assert double["convs.1.lin"] == base["convs.1.lin"]


# ------------------------------------------------------------------------------------------------ optimizers


def test_training_optimizer_builds_sgd_adam_and_adamw():
    p = [nn.Parameter(torch.ones(3))]
    sgd = training_optimizer(p, 0.1, 0.9, 5e-4)
    assert isinstance(sgd, torch.optim.SGD) and sgd.defaults["momentum"] == 0.9 and sgd.defaults["foreach"]
    for name, cls in (("adam", torch.optim.Adam), ("AdamW", torch.optim.AdamW)):
        opt = training_optimizer(p, 1e-3, 0.9, 0.01, name=name)
        assert type(opt) is cls and opt.defaults["betas"] == ADAM_BETAS and opt.defaults["eps"] == ADAM_EPS
        assert opt.defaults["weight_decay"] == 0.01 and opt.defaults["foreach"]
    with pytest.raises(InputError, match="adamw"):
        training_optimizer(p, 0.1, 0.9, 0.0, name="lamb")
    assert optimizer_label("adam").startswith("adam(") and optimizer_label().startswith("sgd(")


def test_adam_decays_weights_as_l2_and_adamw_decoupled():
    lr, wd = 0.1, 0.5
    # a zero gradient: Adam's L2 makes the gradient wd x w and its first step moves w by lr (m/sqrt(v) = 1);
    # AdamW's decoupled decay shrinks w by (1 - lr x wd) and the Adam step of a zero gradient is 0
    for name, want in (("adam", 2.0 - lr), ("adamw", 2.0 * (1 - lr * wd))):
        w = nn.Parameter(torch.full((2,), 2.0))
        opt = training_optimizer([w], lr, 0.9, wd, name=name)
        w.grad = torch.zeros(2)
        opt.step()
        assert w.detach().tolist() == pytest.approx([want, want], rel=1e-6), name


def test_the_op_count_holds_adams_update_over_the_parameters():
    """Adam's foreach update, per parameter element (4 bytes each): grad + wd·w (read 2, write 1), lerp into the
    first moment (2, 1), the second moment x beta2 (1, 1) and + g² (2, 1), its sqrt (1, 1), / bias correction
    (1, 1), + eps (1, 1), w += step x m / denominator (3, 1), and the gradient zeroed (1, 1): 23 element-passes.
    AdamW decays w in place instead of adding to the gradient (1, 1): 22. SGD with momentum: 13."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    P = sum(p.numel() for p in model.parameters())
    x = torch.randn(2, 8)
    passes = {}
    for name in ("sgd", "adam", "adamw"):
        ops = count_step_ops(model, x, optimizer=name)
        opt = [r for r in ops.records if r.phase == "opt" and r.kind == "memory"]
        assert ops.optimizer == optimizer_label(name)
        assert all(r.read_per_sample == r.write_per_sample == 0 for r in opt)  # the update does not grow with batch
        big = [r for r in opt if r.read_fixed + r.write_fixed >= P * 4]  # over the parameters (not step counters)
        passes[name] = sum(r.read_fixed + r.write_fixed for r in big) / (P * 4)
        if name != "sgd":
            assert {"aten._foreach_lerp_.Scalar", "aten._foreach_addcdiv_.ScalarList"} <= {r.op for r in opt}
    assert passes == {"sgd": 13, "adam": 23, "adamw": 22}
    # and a GPU step prices it: Adam's update costs more than SGD's
    prof = profile_model(model, (8,), batch_size=2, optimizer="adam")
    sgd = profile_model(model, (8,), batch_size=2)
    assert prof.ops.summary()["opt"]["bytes_fixed"] > sgd.ops.summary()["opt"]["bytes_fixed"]

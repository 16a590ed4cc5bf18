"""Graph models (cptsim.models.graph) and their quantization (cptsim.numerics.graph_layers), against plain PyG
references and quantizers written out here."""

import copy
import importlib.util
import io
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cptsim.errors import InputError
from cptsim.models import create_model, list_models, model_info
from cptsim.models.graph import GRAPH_INSTALL_HINT, bind_graph, random_graph
from cptsim.numerics import ckernels
from cptsim.numerics.layers import (QUANTIZED_TYPES, quantize_model, quantized_layer_names, unquantized_layers)
from cptsim.numerics.quant import quantize_error

needs_pyg = pytest.mark.skipif(importlib.util.find_spec("torch_geometric") is None,
                               reason="torch_geometric is not installed")


def _fq(x, lo, hi, bits):
    """Round-to-nearest fake quantization on [lo, hi] widened to 0, written out (the scheme of DESIGN.md)."""
    qmax = 2 ** bits - 1
    lo, hi = torch.clamp(torch.as_tensor(lo).float(), max=0.0), torch.clamp(torch.as_tensor(hi).float(), min=0.0)
    scale = torch.clamp((hi - lo) / qmax, min=1e-12)
    zp = torch.clamp(torch.round(-lo / scale), 0, qmax)
    return (torch.mul(x, scale.reciprocal()).add(zp).round().clamp(0, qmax) - zp) * scale


def _fq_rows(w, bits):
    lo, hi = torch.aminmax(w, dim=1)
    return _fq(w, lo[:, None], hi[:, None], bits)


def _on_grid(values, lo, hi, bits):
    """Every value is (k - zp) * scale for an integer k in 0 .. 2**bits - 1: the grid of [lo, hi] widened to 0."""
    qmax = 2 ** bits - 1
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = (hi - lo) / qmax
    zp = round(-lo / scale)
    k = values.double() / scale + zp
    return bool(((k - k.round()).abs() < 1e-3).all() and k.min() > -1e-3 and k.max() < qmax + 1e-3)


def _is_quantized_pyg_linear(m):
    from torch_geometric.nn.dense.linear import Linear as PygLinear

    return isinstance(m, PygLinear) and isinstance(m, QUANTIZED_TYPES) and type(m).__name__ == "QPygLinear"


def _graph(n=12, e=40, seed=0):
    return random_graph(n, e, seed=seed)


def _gcn_adjacency(edge_index, n):
    """D^-1/2 (A + I) D^-1/2 as a dense matrix, A[dst, src] = 1 per edge (GCN's propagation matrix)."""
    a = torch.zeros(n, n)
    a.index_put_((edge_index[1], edge_index[0]), torch.ones(edge_index.shape[1]), accumulate=True)
    a += torch.eye(n)
    d = a.sum(1).rsqrt()
    return d[:, None] * a * d[None, :]


# ------------------------------------------------------------------------------------------------- registry


def test_graph_models_are_listed_without_importing_torch_geometric():
    code = ("import sys; sys.modules['torch_geometric'] = None\n"
            "import cptsim, cptsim.models as m\n"
            "assert {'gcn', 'sage', 'gat'} <= set(m.list_models())\n"
            "assert m.model_info('gcn:layers=2')['input'] == 'graph'\n"
            "from cptsim.numerics.layers import quantize_model\n"
            "import torch.nn as nn\n"
            "quantize_model(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)))\n"
            "try:\n"
            "    m.create_model('gcn', 3, input_shape=(10, 4))\n"
            "except cptsim.errors.InputError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == GRAPH_INSTALL_HINT


def test_building_a_graph_model_without_torch_geometric_says_how_to_install_it(monkeypatch):
    for name in ("torch_geometric", "torch_geometric.nn"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(InputError, match=r"graph models need torch_geometric: pip install torch_geometric"):
        create_model("sage", num_classes=3, input_shape=(10, 4))


def test_registry_entries():
    names = set(list_models())
    assert {"gcn", "sage", "gat"} <= names
    for name in ("gcn", "sage", "gat"):
        info = model_info(name)
        assert info["input"] == "graph" and info["family"] == name and "options" in info["description"]


@pytest.mark.parametrize("name, shape, match", [
    ("gcn", (3, 32, 32), "gcn is a graph model"),
    ("gat", (35,), "gat is a graph model"),
    ("resnet20", (34, 34), "resnet20 is an image model; a graph dataset"),
    ("lstm-lm", (34, 34), "lstm-lm is a language model; a graph dataset"),
])
def test_graph_and_non_graph_models_refuse_each_others_data(name, shape, match):
    with pytest.raises(InputError, match=match) as err:
        create_model(name, num_classes=4, in_channels=shape[0], input_shape=shape)
    assert "\n" not in str(err.value)


def test_a_shape_agnostic_model_still_takes_a_2d_shape_unless_the_data_is_a_graph():
    assert create_model("token-mlp", num_classes=4, input_shape=(5, 12)) is not None
    with pytest.raises(InputError, match="needs a graph model: gcn, sage or gat"):
        create_model("token-mlp", num_classes=4, input_shape=(5, 12), graph=True)


@pytest.mark.parametrize("spec, match", [
    ("gcn:foo=1", r"unknown option 'foo=1'; options: layers=, hidden=, dropout=, norm="),
    ("gcn:layers", r"unknown option 'layers'"),
    ("sage:heads=2", r"unknown option 'heads=2'"),
    ("gcn:layers=x", r"layers must be an int"),
    ("gcn:layers=0", r"layers=0 is out of range"),
    ("gcn:dropout=1.5", r"dropout=1.5 is out of range"),
    ("gcn:norm=batch", r"norm must be one of graph, node, none"),
    ("gat:heads=4,hidden=30", r"hidden 30 is not a multiple of heads 4"),
])
def test_bad_options_are_one_line_input_errors(spec, match):
    with pytest.raises(InputError, match=match) as err:
        model_info(spec)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------------------------- graphs


def test_random_graph_has_exactly_the_edges_asked_distinct_and_without_self_loops():
    for n, e in ((50, 200), (6, 30), (6, 29), (1, 0), (1000, 5000)):
        ei = random_graph(n, e, seed=3)
        assert ei.shape == (2, e) and ei.dtype == torch.long
        if e:
            assert (ei[0] != ei[1]).all() and ei.min() >= 0 and ei.max() < n
            assert torch.unique(ei[0] * n + ei[1]).numel() == e
    assert torch.equal(random_graph(100, 300, seed=1), random_graph(100, 300, seed=1))
    assert not torch.equal(random_graph(100, 300, seed=1), random_graph(100, 300, seed=2))
    with pytest.raises(InputError, match="at most 30 directed edges"):
        random_graph(6, 31)


@needs_pyg
def test_bound_graph_is_a_non_persistent_buffer_that_moves_with_the_model():
    model = create_model("gcn:hidden=8", num_classes=3, input_shape=(12, 5))
    with pytest.raises(InputError, match="has no graph"):
        model(torch.randn(1, 12, 5))
    bind_graph(model, _graph().int())
    assert model.edge_index.dtype == torch.long and "edge_index" not in model.state_dict()
    model.to("meta")
    assert model.edge_index.device.type == "meta"
    with pytest.raises(InputError, match=r"shape \[2, E\]"):
        bind_graph(model, torch.zeros(3, 4, dtype=torch.long))


@needs_pyg
def test_example_input_binds_a_random_graph_of_the_models_edge_count():
    model = create_model("sage:hidden=8", num_classes=3, input_shape=(20, 5))
    x = model.example_input(2, (20, 5), "cpu")
    assert x.shape == (2, 20, 5) and model.edge_index.shape == (2, 80)  # 4 per node
    other = create_model("sage:hidden=8", num_classes=3, input_shape=(20, 5))
    other.cptsim_default_edges = 33
    other.example_input(1, (20, 5), "cpu")
    assert other.edge_index.shape == (2, 33)
    bound = other.edge_index
    other.example_input(1, (20, 5), "cpu")
    assert other.edge_index is bound  # a bound graph stays


# ------------------------------------------------------------------------------------------------- models


class _CptGnnGCN(nn.Module):
    """cpt_gnn's QGCN forward at full precision, written with plain PyG layers."""

    def __init__(self, dims, dropout):
        super().__init__()
        from torch_geometric.nn import GCNConv

        self.layers = nn.ModuleList(GCNConv(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, edge_index):
        h = x
        for i, layer in enumerate(self.layers):
            if i != 0:
                h = self.dropout(h)
            h = layer(h, edge_index)
            if i < len(self.layers) - 1:
                h = F.layer_norm(F.relu(h), h.shape)
        return h


@needs_pyg
@pytest.mark.parametrize("quant_agg", [False, True])
def test_gcn_at_32_bits_is_cpt_gnns_qgcn_in_plain_pyg(quant_agg):
    torch.manual_seed(0)
    n, f = 15, 6
    model = create_model("gcn", num_classes=4, input_shape=(n, f))
    assert [(c.in_channels, c.out_channels) for c in model.convs] == [(6, 512), (512, 512), (512, 4)]
    assert model.drop.p == 0.2 and model.cptsim_fp_layers == []
    ref = _CptGnnGCN([f, 512, 512, 4], 0.2)
    for conv, layer in zip(model.convs, ref.layers):
        layer.load_state_dict(conv.state_dict())
    ei = _graph(n, 50)
    bind_graph(model, ei)
    quantize_model(model, quant_agg=quant_agg).set(32, 32)
    x = torch.randn(n, f, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    for mode in ("train", "eval"):
        getattr(model, mode)()
        getattr(ref, mode)()
        torch.manual_seed(1)
        y = model(x.unsqueeze(0))
        torch.manual_seed(1)
        y_ref = ref(x_ref, ei)
        assert y.shape == (1, 4, n)
        assert torch.equal(y[0].t(), y_ref)
    y.square().sum().backward()
    y_ref.square().sum().backward()
    assert torch.allclose(x.grad, x_ref.grad, atol=1e-6)
    for conv, layer in zip(model.convs, ref.layers):
        assert torch.allclose(conv.lin.weight.grad, layer.lin.weight.grad, atol=1e-5)


@needs_pyg
@pytest.mark.parametrize("name", ["gcn:hidden=16", "sage:hidden=16,norm=node", "gat:hidden=16,heads=4"])
def test_a_batch_of_b_graphs_is_b_separate_calls(name):
    torch.manual_seed(0)
    n, f, b = 14, 5, 3
    model = create_model(name, num_classes=4, input_shape=(n, f))
    bind_graph(model, _graph(n, 45))
    model.eval()
    x = torch.randn(b, n, f)
    with torch.no_grad():
        y = model(x)
        alone = torch.stack([model(x[k]).t() for k in range(b)])
    assert y.shape == (b, 4, n)
    assert torch.allclose(y, alone, atol=1e-5)


@needs_pyg
def test_option_values_build_the_model_they_name():
    m = create_model("gcn:layers=2,hidden=64,dropout=0.5,norm=none", num_classes=3, input_shape=(10, 7))
    assert [(c.in_channels, c.out_channels) for c in m.convs] == [(7, 64), (64, 3)] and m.drop.p == 0.5
    s = create_model("sage", num_classes=3, input_shape=(10, 7))
    assert [(c.in_channels, c.out_channels, c.aggr) for c in s.convs] == [(7, 512, "mean"), (512, 3, "mean")]
    g = create_model("gat", num_classes=3, input_shape=(10, 7))
    assert [(c.heads, c.out_channels, c.concat, c.dropout) for c in g.convs] == [(8, 8, True, 0.6),
                                                                                 (1, 3, False, 0.6)]
    g4 = create_model("gat:layers=3,heads=4,hidden=32", num_classes=3, input_shape=(10, 7))
    assert [(c.in_channels, c.heads, c.out_channels) for c in g4.convs] == [(7, 4, 8), (32, 4, 8), (32, 1, 3)]


# ------------------------------------------------------------------------------------------------- quantization


@needs_pyg
@pytest.mark.parametrize("kernels", ["1", "0"])
def test_quantized_dense_transform_is_the_fake_quant_reference(kernels, monkeypatch):
    """The GCN layer at q bits: A_hat (Qa(x) Qw(W)^T) + b, with Qa per tensor and Qw per output channel written
    out here, and the aggregation in FP32 (no quant_agg)."""
    monkeypatch.setenv("CPTSIM_CKERNELS", kernels)
    torch.manual_seed(0)
    n, f, q = 12, 6, 4
    model = create_model("gcn:hidden=8", num_classes=3, input_shape=(n, f))
    ei = _graph(n, 40)
    bind_graph(model, ei)
    conv = model.convs[0]
    w, b = conv.lin.weight.detach().clone(), conv.bias.detach().clone()
    quantize_model(model).set(q, 8)
    assert _is_quantized_pyg_linear(conv.lin)
    assert quantized_layer_names(model) == [f"convs.{i}.lin" for i in range(3)]
    x = torch.randn(n, f, requires_grad=True)
    xd = x.detach()
    xw = F.linear(_fq(xd, xd.min(), xd.max(), q), _fq_rows(w, q))
    assert torch.allclose(conv.lin(x), xw, atol=1e-6)
    assert torch.allclose(conv(x, ei), _gcn_adjacency(ei, n) @ xw + b, atol=1e-5)


@needs_pyg
def test_quant_agg_quantizes_the_messages_inputs_on_the_q_bit_grid():
    """GCN: the gathered source features (x_j) are propagate's x at q bits (its own range, per tensor); the degree
    normalisation (edge_weight) stays FP32. GAT: x_j and the attention coefficients alpha, each its own range."""
    torch.manual_seed(0)
    n, q = 16, 3
    for name, quantized in (("gcn:hidden=8", ["x"]), ("gat:hidden=8,heads=2", ["x[0]", "alpha"])):
        model = create_model(name, num_classes=3, input_shape=(n, 5))
        bind_graph(model, _graph(n, 50))
        conv = model.convs[1]
        seen = {}
        conv.register_propagate_forward_pre_hook(  # registered before quant_agg's: sees the FP32 inputs
            lambda m, inp: seen.update(raw=dict(inp[2]), edges=inp[0]))
        conv.register_message_forward_pre_hook(lambda m, inp: seen.update(msg=dict(inp[0])))
        state = quantize_model(model, quant_agg=True)
        assert conv.cptsim_quant_agg is True
        state.set(q, 8)
        model(torch.randn(1, n, 5))
        assert conv.cptsim_agg.slots == quantized
        raw, msg = seen["raw"], seen["msg"]
        x = raw["x"] if isinstance(raw["x"], torch.Tensor) else raw["x"][0]
        x = x.detach()
        assert _on_grid(msg["x_j"], x.min(), x.max(), q)
        assert torch.unique(msg["x_j"]).numel() <= 2 ** q
        # each edge's message gathers its source node's quantized features (self-loops included)
        assert torch.allclose(msg["x_j"], _fq(x, x.min(), x.max(), q)[seen["edges"][0]], atol=1e-6)
        if "alpha" in raw:
            a = raw["alpha"].detach()
            assert _on_grid(msg["alpha"], a.min(), a.max(), q) and torch.unique(msg["alpha"]).numel() <= 2 ** q
        else:  # GCN's normalisation coefficients are untouched
            assert torch.equal(msg["edge_weight"], raw["edge_weight"])
        lo, hi = conv.cptsim_agg.act_lo, conv.cptsim_agg.act_hi
        assert lo.shape == (len(quantized),) and float(lo[0]) == pytest.approx(float(x.min()))


@needs_pyg
def test_quant_agg_quantizes_the_error_into_the_aggregation_with_stochastic_rounding():
    """The error reaching the messages is the aggregation output's error quantized with SR at g bits (gathered to
    each edge's target): the same draws as quantize_error under the same seed. The dense transform is kept FP32
    so that the aggregation's is the only stochastic rounding in the step."""
    torch.manual_seed(0)
    n, g = 10, 4
    model = create_model("gcn:layers=1", num_classes=6, input_shape=(n, 5))
    bind_graph(model, _graph(n, 30))
    conv = model.convs[0]
    grads = {}

    def capture_out(m, inp, out):
        out.register_hook(lambda grad: grads.update(raw=grad.clone()))

    def capture_messages(m, inp, out):
        out.register_hook(lambda grad: grads.update(msg=grad.clone()))

    def keep_index(m, inp):  # each message's target node
        grads["index"] = inp[0]["index"]

    conv.register_propagate_forward_hook(capture_out)  # registered first: sees the error before it is quantized
    conv.register_message_forward_hook(capture_messages)
    conv.register_aggregate_forward_pre_hook(keep_index)
    quantize_model(model, fp_layers=["convs.0.lin"], quant_agg=True).set(32, g)  # no forward quantizer
    y = model(torch.randn(1, n, 5))
    torch.manual_seed(5)
    (y * torch.randn(y.shape, generator=torch.Generator().manual_seed(9))).sum().backward()
    torch.manual_seed(5)
    expect = quantize_error(grads["raw"], g)
    assert not torch.equal(expect, grads["raw"]) and torch.unique(expect).numel() <= 2 ** g
    assert torch.allclose(grads["msg"], expect[grads["index"]], atol=1e-6)


@needs_pyg
def test_quant_agg_on_a_model_without_message_passing_is_an_input_error():
    with pytest.raises(InputError, match="has no message-passing layer"):
        quantize_model(nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2)), quant_agg=True)


@needs_pyg
def test_a_users_own_pyg_model_quantizes():
    from torch_geometric.nn import GATConv, MessagePassing, SAGEConv
    from torch_geometric.nn.dense.linear import Linear as PygLinear

    from cptsim.numerics.graph_layers import AggregationQuantizer

    class Weighted(MessagePassing):  # a user's own layer: its own Linear, messages weighted per edge
        def __init__(self, c):
            super().__init__(aggr="add")
            self.lin = PygLinear(c, c)

        def forward(self, x, edge_index, w):
            return self.propagate(edge_index, x=self.lin(x), w=w)

        def message(self, x_j, w):
            return w.unsqueeze(-1) * x_j

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.sage = SAGEConv(5, 8)
            self.gat = GATConv(8, 4, heads=2)
            self.mine = Weighted(8)
            self.head = nn.Linear(8, 3)

        def forward(self, x, ei):
            h = self.gat(self.sage(x, ei).relu(), ei)
            return self.head(self.mine(h, ei, torch.rand(ei.shape[1])))

    torch.manual_seed(0)
    net = Net()
    state = quantize_model(net, quant_agg=True)
    state.set(4, 8)
    assert quantized_layer_names(net) == ["sage.lin_l", "sage.lin_r", "sage.cptsim_agg", "gat.lin", "gat.cptsim_agg",
                                          "mine.lin", "mine.cptsim_agg"]
    assert all(_is_quantized_pyg_linear(m) for m in (net.sage.lin_l, net.sage.lin_r, net.gat.lin, net.mine.lin))
    assert isinstance(net.mine.cptsim_agg, QUANTIZED_TYPES)
    skipped = {d["name"]: d["reason"] for d in unquantized_layers(net)}
    assert set(skipped) == {"head", "gat.att_src", "gat.att_dst"}
    assert "full precision" in skipped["head"] and "not through a Linear layer" in skipped["gat.att_src"]
    ei = _graph(12, 40)
    y = net(torch.randn(12, 5), ei)
    y.sum().backward()
    assert net.mine.cptsim_agg.slots == ["x", "w"]  # a user's per-edge weight is a message input: quantized
    assert isinstance(net.mine.cptsim_agg, AggregationQuantizer)


@needs_pyg
def test_a_lazy_pyg_linear_is_refused_until_it_has_run():
    from torch_geometric.nn import SAGEConv

    net = nn.Sequential()
    net.add_module("conv", SAGEConv(-1, 4))
    reasons = {d["name"]: d["reason"] for d in unquantized_layers(net)}
    assert "lazily initialised" in reasons["conv.lin_l"]
    with pytest.raises(InputError, match=r"'conv.lin_l' has a lazily initialised weight .* run one forward pass"):
        quantize_model(net, fp_layers=[])
    net.conv(torch.randn(6, 3), _graph(6, 10))
    quantize_model(net, fp_layers=[])
    assert quantized_layer_names(net) == ["conv.lin_l", "conv.lin_r"]


@needs_pyg
@pytest.mark.parametrize("quant_agg", [False, True])
def test_quantized_state_survives_deepcopy_and_a_state_dict_round_trip(quant_agg):
    torch.manual_seed(0)
    n = 14
    ei = _graph(n, 40)

    def build():
        m = create_model("gat:hidden=8,heads=2,dropout=0.3", num_classes=3, input_shape=(n, 5))
        bind_graph(m, ei)
        return m, quantize_model(m, quant_agg=quant_agg)

    model, state = build()
    state.set(5, 6)
    opt = torch.optim.SGD(model.parameters(), 0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(1, n, 5)).square().mean().backward()
        opt.step()
    x = torch.randn(1, n, 5)
    model.eval()
    with torch.no_grad():
        y = model(x)
    twin = copy.deepcopy(model)
    assert twin.convs[0].lin.precision is twin.convs[1].lin.precision is not state
    if quant_agg:
        assert twin.convs[0].cptsim_agg.precision is twin.convs[0].lin.precision
    with torch.no_grad():
        assert torch.equal(twin(x), y)
    sd = model.state_dict()
    assert "convs.0.lin.act_lo" in sd and ("convs.0.cptsim_agg.act_lo" in sd) == quant_agg
    fresh, fresh_state = build()
    fresh.load_state_dict(sd)
    fresh_state.set(5, 6)
    fresh.eval()
    with torch.no_grad():
        assert torch.equal(fresh(x), y)
    moved = copy.deepcopy(model).to("meta")
    assert all(b.device.type == "meta" for b in moved.buffers())
    buf = io.BytesIO()
    torch.save(model, buf)  # a whole-model pickle: the made QPygLinear class pickles by PyG's
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    with torch.no_grad():
        assert torch.equal(loaded(x), y)


@needs_pyg
def test_the_aggregation_keeps_a_running_range_for_eval_and_restarts_it_when_reset():
    from cptsim.numerics.layers import ACT_MOMENTUM

    torch.manual_seed(0)
    n, q = 12, 4
    model = create_model("sage:hidden=8", num_classes=3, input_shape=(n, 5))
    bind_graph(model, _graph(n, 30))
    state = quantize_model(model, quant_agg=True)
    assert quantize_model(model, state, quant_agg=True) is state  # again: nothing added twice
    assert len(model.convs[0]._propagate_forward_pre_hooks) == 1
    state.set(q, 8)
    agg = model.convs[0].cptsim_agg
    seen = []
    model.convs[0].register_message_forward_pre_hook(lambda m, inp: seen.append(inp[0]["x_j"].detach()))
    batches = [torch.randn(1, n, 5) * s for s in (1.0, 3.0)]
    for xb in batches:
        model(xb)
    lo = ACT_MOMENTUM * batches[0].min() + (1 - ACT_MOMENTUM) * batches[1].min()
    hi = ACT_MOMENTUM * batches[0].max() + (1 - ACT_MOMENTUM) * batches[1].max()
    assert float(agg.act_lo[0]) == pytest.approx(float(lo), rel=1e-5) and int(agg.act_count) == 2
    model.eval()
    wide = torch.randn(1, n, 5) * 10
    with torch.no_grad():
        model(wide)
    assert _on_grid(seen[-1], lo, hi, q) and float(seen[-1].max()) <= float(hi) + 1e-5  # clamped to the range
    agg.act_count.zero_()  # what re-estimation before evaluation does: the next batch's own range
    with torch.no_grad():
        model(wide)
    assert _on_grid(seen[-1], wide.min(), wide.max(), q) and int(agg.act_count) == 0


@needs_pyg
def test_quantized_training_step_runs_for_every_graph_model():
    torch.manual_seed(0)
    n = 20
    for name in ("gcn:hidden=16", "sage:hidden=16", "gat:hidden=16,heads=4"):
        model = create_model(name, num_classes=3, input_shape=(n, 6))
        x = model.example_input(1, (n, 6), "cpu")
        quantize_model(model, quant_agg=True).set(3, 6)
        y = torch.randint(3, (1, n))
        y[0, ::2] = -100  # nodes outside the split
        loss = F.cross_entropy(model(x), y, reduction="sum")
        loss.backward()
        assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters())
    assert ckernels is not None


def test_graph_layer_norm_by_reductions_equals_layer_norm():
    """The CUDA path of the whole-graph layer norm (var_mean + rsqrt: F.layer_norm gives a whole graph one thread
    block, ~190 ms per norm at ogbn-arxiv's size on an H100) is F.layer_norm's formula: values and gradients agree
    to float rounding, per graph of a union."""
    import torch.nn.functional as F

    from cptsim.models.graph import _rows_layer_norm, graph_layer_norm

    torch.manual_seed(0)
    h = (torch.randn(3 * 50, 16, dtype=torch.float64) * 3 + 1).requires_grad_(True)
    ref = F.layer_norm(h.reshape(3, -1), (50 * 16,)).view_as(h)
    red = _rows_layer_norm(h.reshape(3, -1), 1e-5).view_as(h)
    assert torch.allclose(red, ref, atol=1e-12)
    assert torch.allclose(graph_layer_norm(h, 3), ref, atol=0)  # the CPU path is F.layer_norm itself
    g = torch.randn_like(h)
    (a,) = torch.autograd.grad(ref, h, g)
    (b,) = torch.autograd.grad(red, h, g)
    assert torch.allclose(a, b, atol=1e-10)
    for part in red.detach().reshape(3, -1):  # each graph: mean 0, variance 1
        assert abs(float(part.mean())) < 1e-12 and abs(float(part.var(correction=0)) - 1) < 1e-4

"""Graph neural networks in the model registry: ``gcn``, ``sage`` and ``gat``, built on PyTorch Geometric.

PyTorch Geometric (``torch_geometric``) is imported only when a graph model is built: ``import cptsim``, the
registry's names and the CLI work without it, and building one without it is an InputError saying how to install
it. ``bind_graph`` and ``random_graph`` need only torch.

One sample is one whole graph (full-batch training). A model takes node features ``x`` of shape [B, N, F] -- B
copies of its bound graph, run as one disjoint union (the trainer passes B = 1, the profiler may pass 2) -- and
returns logits [B, C, N], the class dimension second as ``F.cross_entropy`` wants with labels [B, N]. PyG's usual
``model(x [N, F], edge_index)`` works too and returns [N, C]. The graph structure is bound to the model
(``bind_graph``: a non-persistent buffer, moved by ``.to(device)``, not in the state_dict); ``forward(x,
edge_index=None)`` uses the bound one when none is given. The registry's ``input_shape`` is (N, F); its
``in_channels`` is ignored (F is input_shape[1]).

The models follow Wolfe & Kyrillidis's ``cpt_gnn`` (github.com/wolfecameron/BetterPrecisionSchedules, folder
cpt_gnn, ``models.py``), with PyG layers in place of their DGL ones. Where they differ:

* ``gcn`` = cpt_gnn's ``QGCN`` as run on ogbn-arxiv (``scripts/run_arxiv_scheds.py``: --n-layers 2, i.e. three
  graph convolutions, --n-hidden 512, --dropout 0.2): GCNConv F -> 512 -> 512 -> C; after each but the last, ReLU
  then a full-precision layer norm; dropout 0.2 before each but the first. The layer norm is cpt_gnn's
  ``F.layer_norm(h, h.shape)``: one mean and variance over the whole graph's nodes and features, no learnable
  scale (``norm=graph``; with B graphs, each graph its own); ``norm=node`` is the usual per-node
  ``nn.LayerNorm(hidden)``, ``norm=none`` none. PyG's GCNConv adds self-loops and normalises by the degrees of
  A + I, where cpt_gnn's DGL GraphConv (norm='both') normalises A without self-loops; PyG's GCNConv always
  transforms before it aggregates (A(XW)), cpt_gnn's GraphConv aggregates first when F_in <= F_out.
* ``sage`` = cpt_gnn's ``QGraphSAGE`` (ogbn-products: ``scripts/run_amazon_scheds.py``, hidden 512, dropout 0.2):
  two SAGEConv layers with mean aggregation, ReLU, layer norm, dropout between. Full-batch on the bound graph: cpt_gnn
  samples neighbours (fan-out 32) in mini-batches of 1024 target nodes. PyG's SAGEConv aggregates first, then
  transforms (lin_l with the bias, lin_r on the root), cpt_gnn's transforms the neighbours first when F_in > F_out.
* ``gat`` = the standard Cora GAT of Velickovic et al. (2018), which PyG's own example follows: two GATConv layers,
  the hidden one 8 heads x 8 channels concatenated (``hidden=64`` is the total width, hidden/heads per head, as
  cpt_gnn's ``merge='cat'``), the output one a single head; ELU between; dropout 0.6 on each layer's input and on
  the attention coefficients; self-loops added. cpt_gnn's ``QGAT`` has the same shape (its arxiv runs:
  ``gat:hidden=512,dropout=0.2``). Its attention logits are a quantized Linear on [z_i, z_j]; PyG's GATConv
  computes them as an element-wise product with ``att_src`` / ``att_dst``, which cptsim cannot swap: they stay
  full precision (``unquantized_layers`` says so; 2·heads·C MACs per node against F·heads·C for the transform).

Every dense transform is quantized, the output layer's included: cpt_gnn quantizes all of QGCN's GraphConv layers
("for now -- we apply quantization to all layers"), both of QGraphSAGE's and all of QGAT's linear maps, so
``cptsim_fp_layers`` is empty. The aggregation stays FP32 unless quantized (``quantize_model(..., quant_agg=True)``,
``--quant-agg``; see cptsim.numerics.graph_layers). Weights start as PyG initialises them (glorot, zero bias for
GCN and GAT; cpt_gnn's GAT uses xavier-normal with ReLU gain).

Options go after the name: ``gcn:layers=2,hidden=64,dropout=0.5``, ``sage:norm=node``, ``gat:heads=4,hidden=32``.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from cptsim.errors import InputError
from .registry import FP_LAYERS_ATTR, _Entry, register_model, register_resolver

__all__ = ["GraphNet", "graph_layer_norm", "GCN", "GraphSAGE", "GAT", "GRAPH_FAMILIES", "GRAPH_INSTALL_HINT", "bind_graph", "random_graph",
           "disjoint_union", "is_graph_model", "require_torch_geometric"]

GRAPH_INSTALL_HINT = "graph models need torch_geometric: pip install torch_geometric (or pip install 'cptsim[graph]')"
NORMS = ("graph", "node", "none")
DEFAULT_DEGREE = 4  # edges per node of the random graph example_input binds when the model knows no edge count


def require_torch_geometric():
    """``torch_geometric.nn``, or the InputError that says how to install it."""
    import warnings

    try:
        with warnings.catch_warnings():  # PyG scripts a helper at import: torch 2.10+ warns, nothing for a user to do
            warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.* is deprecated", category=FutureWarning)
            import torch_geometric.nn as pyg_nn
    except ImportError:
        raise InputError(GRAPH_INSTALL_HINT) from None
    return pyg_nn


# ------------------------------------------------------------------------------------------------------ graphs


def _check_count(value, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return value


def random_graph(num_nodes: int, num_edges: int, seed: int = 0) -> torch.Tensor:
    """A seeded random graph structure: ``edge_index`` [2, E] int64 with exactly ``num_edges`` distinct directed
    edges, no self-loops, drawn uniformly; the same (N, E, seed) gives the same graph. Sorted by source node."""
    n = _check_count(num_nodes, "num_nodes", 1)
    e = _check_count(num_edges, "num_edges", 0)
    pairs = n * (n - 1)  # directed edges without self-loops
    if e > pairs:
        raise InputError(f"a graph of {n} nodes has at most {pairs} directed edges without self-loops, not {e}")
    gen = torch.Generator().manual_seed(int(seed))
    if e * 4 >= pairs:  # dense: a random subset of all pairs
        codes = torch.randperm(pairs, generator=gen)[:e]
    else:  # sparse: draw codes until e distinct ones, then keep a random e of them
        codes = torch.empty(0, dtype=torch.long)
        while codes.numel() < e:
            more = torch.randint(pairs, (e - codes.numel() + e // 8 + 16,), generator=gen)
            codes = torch.unique(torch.cat([codes, more]))
        codes = codes[torch.randperm(codes.numel(), generator=gen)[:e]]
    codes = torch.sort(codes).values
    src = codes // max(n - 1, 1)
    r = codes % max(n - 1, 1)
    dst = r + (r >= src).long()  # skip the diagonal
    return torch.stack([src, dst])


def disjoint_union(edge_index: torch.Tensor, copies: int, num_nodes: int) -> torch.Tensor:
    """``copies`` copies of a graph of ``num_nodes`` nodes as one graph: copy k's nodes are k*N .. k*N + N-1, its edges
    follow copy k-1's."""
    if copies == 1:
        return edge_index
    offsets = torch.arange(copies, device=edge_index.device, dtype=edge_index.dtype) * num_nodes
    return (edge_index.unsqueeze(1) + offsets.view(1, -1, 1)).reshape(2, -1)


def bind_graph(model: nn.Module, edge_index: torch.Tensor) -> nn.Module:
    """Bind a graph structure (``edge_index`` [2, E], integer node indices) to ``model``: a non-persistent buffer
    ``edge_index`` on the model's device, which ``forward`` uses when called without one. Returns the model."""
    if not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2:
        shape = tuple(edge_index.shape) if isinstance(edge_index, torch.Tensor) else type(edge_index).__name__
        raise InputError(f"edge_index must be a tensor of shape [2, E], got {shape}")
    if edge_index.is_floating_point() or edge_index.is_complex() or edge_index.dtype == torch.bool:
        raise InputError(f"edge_index must hold integer node indices, got {edge_index.dtype}")
    if edge_index.numel() and int(edge_index.min()) < 0:
        raise InputError("edge_index holds a negative node index")
    ref = next(iter(model.parameters()), None)
    device = ref.device if ref is not None else edge_index.device
    ei = edge_index.to(device=device, dtype=torch.long)
    if "edge_index" in model._buffers:
        model._buffers["edge_index"] = ei
    else:
        model.register_buffer("edge_index", ei, persistent=False)
    return model


# ------------------------------------------------------------------------------------------------------ models


def graph_layer_norm(h: torch.Tensor, graphs: int, eps: float = 1e-5) -> torch.Tensor:
    """cpt_gnn's ``F.layer_norm(h, h.shape)`` over each of ``graphs`` equal parts of ``h``: one mean and variance
    per whole graph, no affine part.

    On CUDA it is computed as ``(h - mean) * rsqrt(var + eps)`` from ``torch.var_mean``: ``F.layer_norm`` gives
    each normalised row one thread block, and here a row is a whole graph (ogbn-arxiv: 169,343 x 512 = 86.7M
    elements), so on our H100 one such norm took 200 ms forward, 354 ms forward + backward, against 0.76 and
    3.5 ms by reductions (benchmarks/results/gpu-layernorm-vs-var-mean-H100.log); a full-batch GCN step on an
    arxiv-sized graph went from 781 ms at 158 W to 86 ms at 488 W, SAGE's (one norm) from 381 to 34 ms
    (gpu-heldout-H100-run1.json, gpu-heldout-graphs-H100.json). Reductions spread over
    the whole GPU. On a CPU ``F.layer_norm`` is the faster (it splits the row among
    threads) and is kept. Both are the same formula (biased variance, eps inside the root); they agree to float
    rounding (tests/test_graph_models.py)."""
    g = h.reshape(graphs, -1)
    if not g.is_cuda:
        return F.layer_norm(g, (g.shape[1],), eps=eps).view_as(h)
    return _rows_layer_norm(g, eps).view_as(h)


def _rows_layer_norm(g: torch.Tensor, eps: float) -> torch.Tensor:
    """Each row of ``g`` normalised to mean 0, variance 1 (biased), as ``F.layer_norm`` without affine, by reductions."""
    var, mean = torch.var_mean(g, dim=1, keepdim=True, correction=0)
    return (g - mean) * torch.rsqrt(var + eps)


class GraphNet(nn.Module):
    """What the graph models share: the bound graph, the [B, N, F] -> [B, C, N] convention, ``example_input`` and
    the between-layer layer norm. Subclasses build ``self.convs`` and define ``_body(x, edge_index, graphs)``."""

    cptsim_default_edges: int | None = None  # E of example_input's random graph (None: 4 per node)

    def __init__(self, hidden: int, norm: str, layers: int):
        super().__init__()
        if norm not in NORMS:
            raise InputError(f"norm must be one of {', '.join(NORMS)}, got {norm!r}")
        self.norm = norm
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers - 1)) if norm == "node" else None
        self.register_buffer("edge_index", None, persistent=False)
        setattr(self, FP_LAYERS_ATTR, [])  # every dense transform quantized, the output layer's too (cpt_gnn)

    def _normalize(self, h: torch.Tensor, i: int, graphs: int) -> torch.Tensor:
        if self.norm == "graph":  # cpt_gnn's F.layer_norm(h, h.shape), over each graph of the union
            return graph_layer_norm(h, graphs)
        if self.norm == "node":
            return self.norms[i](h)
        return h

    def example_input(self, batch: int, shape, device) -> torch.Tensor:
        """Random node features [B, N, F]; binds a seeded random graph of ``cptsim_default_edges`` (else 4 N) edges
        when the model has no graph bound."""
        shape = tuple(shape)
        if len(shape) != 2:
            raise InputError(f"a graph model's input shape is (nodes, features), got {shape}")
        n = int(shape[0])
        if self.edge_index is None:
            e = self.cptsim_default_edges if self.cptsim_default_edges is not None else DEFAULT_DEGREE * n
            bind_graph(self, random_graph(n, min(int(e), n * (n - 1))))
        return torch.randn(batch, *shape, device=device)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor | None = None) -> torch.Tensor:
        ei = self.edge_index if edge_index is None else edge_index
        if ei is None:
            raise InputError(f"{type(self).__name__} has no graph: bind one (cptsim.models.graph.bind_graph(model, "
                             "edge_index)) or call model(x, edge_index)")
        if x.dim() == 2:  # PyG's convention: one graph, [N, F] -> [N, C]
            return self._body(x, ei, 1)
        if x.dim() != 3:
            raise InputError(f"{type(self).__name__} takes node features [B, N, F] or [N, F], got {tuple(x.shape)}")
        B, N, Fdim = x.shape
        out = self._body(x.reshape(B * N, Fdim), disjoint_union(ei, B, N), B)
        return out.view(B, N, -1).transpose(1, 2)  # [B, C, N]

    def _body(self, x: torch.Tensor, edge_index: torch.Tensor, graphs: int) -> torch.Tensor:
        raise NotImplementedError


class GCN(GraphNet):
    """cpt_gnn's QGCN (module docstring): GCNConv layers, ReLU + layer norm + dropout between."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 512, layers: int = 3, dropout: float = 0.2,
                 norm: str = "graph"):
        super().__init__(hidden, norm, layers)
        pyg_nn = require_torch_geometric()
        dims = [in_features] + [hidden] * (layers - 1) + [num_classes]
        self.convs = nn.ModuleList(pyg_nn.GCNConv(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.drop = nn.Dropout(dropout)

    def _body(self, x, edge_index, graphs):
        h = x
        last = len(self.convs) - 1
        for i, conv in enumerate(self.convs):
            if i:
                h = self.drop(h)
            h = conv(h, edge_index)
            if i < last:
                h = self._normalize(F.relu(h), i, graphs)
        return h


class GraphSAGE(GraphNet):
    """cpt_gnn's QGraphSAGE (module docstring), full batch: SAGEConv (mean) layers, ReLU + layer norm + dropout
    between."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 512, layers: int = 2, dropout: float = 0.2,
                 norm: str = "graph"):
        super().__init__(hidden, norm, layers)
        pyg_nn = require_torch_geometric()
        dims = [in_features] + [hidden] * (layers - 1) + [num_classes]
        self.convs = nn.ModuleList(pyg_nn.SAGEConv(a, b, aggr="mean") for a, b in zip(dims[:-1], dims[1:]))
        self.drop = nn.Dropout(dropout)

    _body = GCN._body


class GAT(GraphNet):
    """Velickovic et al.'s GAT (module docstring): GATConv layers of ``heads`` heads concatenated (hidden/heads
    channels each), a single-head output layer, ELU between, dropout on each layer's input and attention."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 64, heads: int = 8, layers: int = 2,
                 dropout: float = 0.6, norm: str = "none"):
        super().__init__(hidden, norm, layers)
        if hidden % heads:
            raise InputError(f"gat: hidden {hidden} is not a multiple of heads {heads}")
        pyg_nn = require_torch_geometric()
        dims = [in_features] + [hidden] * (layers - 1)
        convs = [pyg_nn.GATConv(a, hidden // heads, heads=heads, dropout=dropout) for a in dims[:-1]]
        convs.append(pyg_nn.GATConv(dims[-1], num_classes, heads=1, concat=False, dropout=dropout))
        self.convs = nn.ModuleList(convs)
        self.drop = nn.Dropout(dropout)

    def _body(self, x, edge_index, graphs):
        h = x
        last = len(self.convs) - 1
        for i, conv in enumerate(self.convs):
            h = conv(self.drop(h), edge_index)
            if i < last:
                h = self._normalize(F.elu(h), i, graphs)
        return h


def is_graph_model(model: nn.Module) -> bool:
    return isinstance(model, GraphNet)


# ---------------------------------------------------------------------------------------------- registry entries

_COMMON = {"layers": int, "hidden": int, "dropout": float, "norm": str}
# family -> (class, options, defaults, description)
GRAPH_FAMILIES = {
    "gcn": (GCN, _COMMON, {"layers": 3, "hidden": 512, "dropout": 0.2, "norm": "graph"},
            "GCN (cpt_gnn's arxiv QGCN by default): {layers} GCNConv layers, hidden {hidden}, ReLU + {norm} layer "
            "norm + dropout {dropout} between"),
    "sage": (GraphSAGE, _COMMON, {"layers": 2, "hidden": 512, "dropout": 0.2, "norm": "graph"},
             "GraphSAGE, mean aggregation (cpt_gnn's QGraphSAGE, full batch): {layers} SAGEConv layers, hidden "
             "{hidden}, ReLU + {norm} layer norm + dropout {dropout} between"),
    "gat": (GAT, {**_COMMON, "heads": int}, {"layers": 2, "hidden": 64, "heads": 8, "dropout": 0.6, "norm": "none"},
            "GAT (Velickovic et al.'s Cora GAT): {layers} GATConv layers, {heads} heads x {per_head} = {hidden} "
            "hidden, 1-head output, ELU, dropout {dropout} on inputs and attention"),
}


def _parse_opts(key: str, text: str, allowed: dict) -> dict:
    out = {}
    valid = ", ".join(k + "=" for k in allowed)
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, val = part.partition("=")
        name, val = name.strip(), val.strip()
        if not eq or name not in allowed:
            raise InputError(f"model {key!r}: unknown option {part!r}; options: {valid}")
        kind = allowed[name]
        try:
            v = kind(val)
        except ValueError:
            raise InputError(f"model {key!r}: {name} must be a{'n' if kind is int else ''} {kind.__name__}, "
                             f"got {val!r}") from None
        if name == "norm" and v not in NORMS:
            raise InputError(f"model {key!r}: norm must be one of {', '.join(NORMS)}, got {val!r}")
        if (name == "dropout" and not 0 <= v < 1) or (kind is int and v < 1):
            raise InputError(f"model {key!r}: {name}={val} is out of range")
        out[name] = v
    return out


def _graph_entry(family: str, key: str, opts: str) -> _Entry:
    cls, allowed, defaults, text = GRAPH_FAMILIES[family]
    o = {**defaults, **_parse_opts(key, opts, allowed)}
    if "heads" in o and o["hidden"] % o["heads"]:
        raise InputError(f"model {key!r}: hidden {o['hidden']} is not a multiple of heads {o['heads']}")

    def build(num_classes: int, in_channels: int, input_shape=None) -> nn.Module:
        shape = tuple(input_shape) if input_shape is not None else None
        if shape is None or len(shape) != 2:
            raise InputError(f"{key} is a graph model: it needs a graph dataset (node features (N, F)), not one of "
                             f"input shape {shape}")
        return cls(int(shape[1]), num_classes, **o)

    per_head = o["hidden"] // o["heads"] if "heads" in o else None
    description = text.format(per_head=per_head, **o) + "; options " + ",".join(k + "=" for k in allowed)
    return _Entry(key, build, family=family, input="graph", description=description)


def _register() -> None:
    for family in GRAPH_FAMILIES:
        entry = _graph_entry(family, family, "")
        register_model(family, family=family, input="graph", description=entry.description)(entry.builder)
        register_resolver(lambda raw, family=family: _graph_entry(family, raw.lower(), raw.lower().partition(":")[2]),
                          prefix=family)


_register()

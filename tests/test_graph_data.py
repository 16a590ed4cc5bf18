"""Issue 24 item 3: graph datasets (one sample = the whole graph), none downloaded.

Checked against independent truth: PyG's own ``KarateClub`` and Planetoid reader (``read_planetoid_data``) on a
folder the test writes, PyG's ``to_undirected`` for ogbn-arxiv's bidirecting, numpy's z-score, hand counts of edges;
and the bad inputs (a Planetoid folder missing a file, ogbn-arxiv without its split, a malformed synthetic-graph
name, a pickle that would run code) as one-line InputErrors.
"""

from __future__ import annotations

import os
import pickle
import pickletools
import warnings

import numpy as np
import pytest
import torch

from cptsim.data import DataInfo, dataset_info, dataset_size, epoch_size, list_datasets, load_datasets
from cptsim.data.defaults import check_pairing, dataset_kind, default_dataset, model_kind
from cptsim.data.graph import (GraphSplit, parse_synthetic_graph, read_planetoid, safe_unpickle, synthetic_graph,
                               write_ogbn_arxiv, write_planetoid)
from cptsim.errors import InputError

pyg = pytest.importorskip("torch_geometric")
warnings.filterwarnings("ignore", category=DeprecationWarning)


def one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    return msg


# ---------------------------------------------------------------------------------------------- registry


@pytest.mark.parametrize("name,n,f,c,e", [
    ("karate", 34, 34, 4, 156),
    ("cora", 2708, 1433, 7, 10556),
    ("citeseer", 3327, 3703, 6, 9104),
    ("pubmed", 19717, 500, 3, 88648),
    ("ogbn-arxiv", 169343, 128, 40, 2315598),
    ("synthetic-graph:1000,16,4", 1000, 16, 4, 10000),   # 1000*10//2 pairs, both directions
    ("synthetic-graph:999,8,3:7", 999, 8, 3, 6992),      # 999*7//2 = 3496 pairs
])
def test_shapes_are_known_without_files(name, n, f, c, e):
    info = dataset_info(name)
    assert (info.input_shape, info.num_classes, info.graph_edges) == ((n, f), c, e)
    assert (info.train_size, info.test_size) == (1, 1)  # one sample: the whole graph
    assert dataset_kind(name) == "graph"
    assert epoch_size(name)[0] == 1


def test_registered_names_and_kinds():
    names = list_datasets()
    for name in ("karate", "planetoid", "cora", "citeseer", "pubmed", "ogbn-arxiv"):
        assert name in names
    assert names[0] == "digits"
    assert dataset_kind("digits") == "image" and dataset_kind("pydoc-chars") == "text"
    assert dataset_info("digits").graph_edges is None
    # the image synthetic prefix is untouched by synthetic-graph
    assert dataset_info("synthetic:3,8,8:10:20") == DataInfo("synthetic:3,8,8:10:20", (3, 8, 8), 10, 20, 2)
    assert dataset_info("Synthetic-Graph:1000,16,4").name == "synthetic-graph:1000,16,4:10"
    with pytest.raises(InputError, match="synthetic-graph:N,F,K"):
        dataset_info("graphs-of-cats")
    with pytest.raises(InputError, match="--image-size is for --dataset imagefolder"):
        dataset_info("karate", image_size=32)


# ---------------------------------------------------------------------------------------------- karate


def test_karate_is_pygs_karate_club_with_the_unlabelled_nodes_as_test():
    from torch_geometric.datasets import KarateClub

    ref = KarateClub()[0]
    train, test, info = load_datasets("karate")
    g = train.graph
    assert info == DataInfo("karate", (34, 34), 4, 1, 1, graph_edges=156)
    assert (g.num_nodes, g.num_features, g.num_edges, g.num_classes) == (34, 34, 156, 4)
    assert torch.equal(g.x, ref.x) and torch.equal(g.y, ref.y)
    assert set(map(tuple, g.edge_index.T.tolist())) == set(map(tuple, ref.edge_index.T.tolist()))
    assert torch.equal(g.train_mask, ref.train_mask) and int(g.train_mask.sum()) == 4
    assert torch.equal(g.test_mask, ~ref.train_mask) and not g.val_mask.any()
    assert train.valid is None  # no validation nodes
    assert (train.labelled, test.labelled) == (4, 30)


def test_graph_split_is_one_sample_labelled_at_its_mask():
    train, test, _ = load_datasets("karate")
    assert isinstance(train, GraphSplit) and train.is_graph and len(train) == 1 and len(test) == 1
    x, y = train[0]
    g = train.graph
    assert x.shape == (34, 34) and y.shape == (34,) and y.dtype == torch.int64
    assert torch.equal(y[g.train_mask], g.y[g.train_mask]) and bool((y[~g.train_mask] == -100).all())
    assert int((test[0][1] != -100).sum()) == test.labelled == 30
    xb, yb = train.gather([0], "cpu")
    assert xb.shape == (1, 34, 34) and yb.shape == (1, 34) and torch.equal(yb[0], y)
    assert train.gather(torch.tensor([0]))[0].data_ptr() == xb.data_ptr()  # moved once, no copy per step
    assert train.gather([0, 0])[0].shape == (2, 34, 34)
    with pytest.raises(IndexError):
        train[1]
    with pytest.raises(IndexError):
        train.gather([1])


# ---------------------------------------------------------------------------------------------- Planetoid


def _random_graph(n: int, f: int, c: int, e: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(n, f, generator=g) < 0.1).float()  # sparse binary bag-of-words, as Planetoid's
    y = torch.randint(0, c, (n,), generator=g)
    ei = torch.randint(0, n, (2, e), generator=g)
    ei = torch.cat([ei, ei.flip(0), ei[:, :5], torch.tensor([[3, 7], [3, 7]])], 1)  # both ways, duplicates, loops
    return x, y, ei


def _pyg_planetoid(folder, name):
    from torch_geometric.io import read_planetoid_data

    return read_planetoid_data(str(folder), name)


def _same_as_pyg(g, ref):
    assert torch.equal(g.x, ref.x)
    assert torch.equal(g.edge_index, ref.edge_index)  # same edges, same order (coalesce by column)
    assert torch.equal(g.y, ref.y)
    for m in ("train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(g, m), getattr(ref, m)), m


def test_planetoid_reads_as_pygs_reader(tmp_path):
    n, a = 700, 600  # nodes 0..599 in allx (20 train, 500 val), 600..699 test (listed shuffled, as the originals)
    x, y, ei = _random_graph(n, 30, 5, 1500, seed=1)
    test_index = torch.randperm(100, generator=torch.Generator().manual_seed(2)) + a
    write_planetoid(tmp_path, "tiny", x, y, ei, num_train=20, test_index=test_index, num_classes=5)
    g = read_planetoid(tmp_path)
    _same_as_pyg(g, _pyg_planetoid(tmp_path, "tiny"))
    assert torch.equal(g.x, x) and torch.equal(g.y, y)  # the round trip
    pairs = {(s, t) for s, t in ei.T.tolist() if s != t}  # hand count: distinct directed pairs, no loops
    assert g.num_edges == len(pairs)
    assert (int(g.train_mask.sum()), int(g.val_mask.sum()), int(g.test_mask.sum())) == (20, 500, 100)

    train, test, info = load_datasets("planetoid", tmp_path)
    assert info == DataInfo("planetoid", (700, 30), 5, 1, 1, graph_edges=len(pairs))
    assert dataset_info("planetoid", tmp_path) == info and dataset_size("planetoid", tmp_path) == 1
    assert (train.labelled, train.valid.labelled, test.labelled) == (20, 500, 100)
    assert train.graph.name == "tiny"


def test_planetoid_citeseers_isolated_test_nodes_as_pyg(tmp_path):
    n, a = 700, 600
    x, y, ei = _random_graph(n, 20, 4, 1200, seed=3)
    missing = torch.tensor([603, 650, 651, 698])  # in the test range but not in tx: CiteSeer's isolated nodes
    keep = ~torch.isin(torch.arange(a, n), missing)
    test_index = torch.arange(a, n)[keep]
    test_index = test_index[torch.randperm(len(test_index), generator=torch.Generator().manual_seed(4))]
    write_planetoid(tmp_path / "CiteSeer" / "raw", "citeseer", x, y, ei, num_train=24, test_index=test_index)
    train, test, info = load_datasets("citeseer", tmp_path)  # PyG's layout: <dir>/CiteSeer/raw/ind.citeseer.*
    g = train.graph
    _same_as_pyg(g, _pyg_planetoid(tmp_path / "CiteSeer" / "raw", "citeseer"))
    assert info.input_shape == (700, 20) and g.num_nodes == 700
    assert not g.x[missing].any() and not g.test_mask[missing].any()
    assert test.labelled == 96


def test_planetoid_pickles_use_the_original_global_names(tmp_path):
    x, y, ei = _random_graph(40, 6, 3, 60, seed=5)
    write_planetoid(tmp_path, "small", x, y, ei, num_train=6, test_index=torch.arange(30, 40))
    names = {arg for op, arg, _ in pickletools.genops((tmp_path / "ind.small.x").read_bytes()) if op.name == "GLOBAL"}
    assert "scipy.sparse.csr csr_matrix" in names and "numpy.core.multiarray _reconstruct" in names
    g = read_planetoid(tmp_path, "small")
    # fewer than 500 nodes between train and test: validation stops at the first test node (PyG's reader fails)
    assert int(g.val_mask.sum()) == 30 - 6 and not (g.val_mask & g.test_mask).any()


def test_planetoid_bad_folders_are_one_line_errors(tmp_path):
    x, y, ei = _random_graph(40, 6, 3, 60, seed=6)
    write_planetoid(tmp_path, "small", x, y, ei, num_train=6, test_index=torch.arange(30, 40))
    (tmp_path / "ind.small.graph").unlink()
    with pytest.raises(InputError) as e:
        load_datasets("planetoid", tmp_path)
    assert "lacks ind.small.graph" in one_line(e)
    with pytest.raises(InputError, match="lacks ind.cora.x"):
        load_datasets("cora", tmp_path)
    assert dataset_info("cora", tmp_path).input_shape == (2708, 1433)  # nothing of cora there: nominal shapes
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no Planetoid raw files"):
        load_datasets("planetoid", tmp_path / "empty")
    with pytest.raises(InputError, match="planetoid reads its shapes from the Planetoid raw files in --data-dir"):
        dataset_info("planetoid")
    write_planetoid(tmp_path / "two", "aa", x, y, ei, num_train=6, test_index=torch.arange(30, 40))
    write_planetoid(tmp_path / "two", "bb", x, y, ei, num_train=6, test_index=torch.arange(30, 40))
    with pytest.raises(InputError, match=r"several datasets \(aa, bb\)"):
        load_datasets("planetoid", tmp_path / "two")


class _Evil:
    def __init__(self, call, args):
        self.call, self.args = call, args

    def __reduce__(self):
        return self.call, self.args


@pytest.mark.parametrize("which", ["os.system", "builtins.open", "nested"])
def test_a_crafted_pickle_is_refused_and_runs_nothing(tmp_path, which):
    import builtins
    from collections import defaultdict

    data = tmp_path / "data"
    x, y, ei = _random_graph(40, 6, 3, 60, seed=7)
    write_planetoid(data, "evil", x, y, ei, num_train=6, test_index=torch.arange(30, 40))
    victim = tmp_path / "written"
    if which == "os.system":
        payload = _Evil(os.system, (f"touch {victim}",))
    elif which == "builtins.open":
        payload = _Evil(builtins.open, (str(victim), "w"))
    else:  # the attack hidden inside an otherwise well-formed adjacency dict
        payload = defaultdict(list, {0: [1, 2], 1: _Evil(os.system, (f"touch {victim}",))})
    (data / "ind.evil.graph").write_bytes(pickle.dumps(payload, protocol=2))
    with pytest.raises(InputError) as e:
        load_datasets("planetoid", data)
    msg = one_line(e)
    assert "ind.evil.graph" in msg and "refused" in msg
    assert not victim.exists()
    with pytest.raises(InputError, match="refused"):
        safe_unpickle(data / "ind.evil.graph")
    assert not victim.exists()


# ---------------------------------------------------------------------------------------------- ogbn-arxiv


def _write_arxiv(folder, seed=8):
    g = torch.Generator().manual_seed(seed)
    n, f, c = 60, 8, 5
    x = torch.randn(n, f, generator=g) * 3 + 1
    y = torch.randint(0, c, (n,), generator=g)
    ei = torch.randint(0, n, (2, 150), generator=g)
    ei = torch.cat([ei, ei[:, :10].flip(0), ei[:, 10:13], torch.tensor([[4], [4]])], 1)  # reciprocal, dup, loop
    perm = torch.randperm(n, generator=g)
    write_ogbn_arxiv(folder, x, y, ei, perm[:30], perm[30:42], perm[42:])
    return x, y, ei, perm


def test_ogbn_arxiv_from_ogbs_raw_layout(tmp_path):
    from torch_geometric.utils import remove_self_loops, to_undirected

    x, y, ei, perm = _write_arxiv(tmp_path / "ogbn_arxiv")
    for root in (tmp_path, tmp_path / "ogbn_arxiv"):  # the folder or its parent
        train, test, info = load_datasets("ogbn-arxiv", root)
        g = train.graph
        ref = to_undirected(remove_self_loops(ei)[0], num_nodes=60)  # PyG: both ways, duplicates merged
        assert torch.equal(g.edge_index, ref)
        pairs = {(s, t) for s, t in ei.T.tolist() if s != t}
        assert g.num_edges == len(pairs | {(t, s) for s, t in pairs})  # hand count
        assert info == DataInfo("ogbn-arxiv", (60, 8), int(y.max()) + 1, 1, 1, graph_edges=g.num_edges)
        xn = x.double().numpy()
        z = (xn - xn.mean(0)) / xn.std(0, ddof=1)  # cpt_gnn: (feat - feat.mean(0)) / feat.std(0)
        np.testing.assert_allclose(g.x.numpy(), z, rtol=1e-5, atol=1e-5)
        assert torch.equal(g.y, y)
        assert torch.equal(g.train_mask.nonzero().view(-1), perm[:30].sort()[0])
        assert (train.labelled, train.valid.labelled, test.labelled) == (30, 12, 18)
        assert dataset_size("ogbn-arxiv", root) == 1


def test_ogbn_arxiv_without_its_split_files_is_one_line(tmp_path):
    _write_arxiv(tmp_path)
    for f in ("train", "test"):
        (tmp_path / "split" / "time" / f"{f}.csv.gz").unlink()
    with pytest.raises(InputError) as e:
        load_datasets("ogbn-arxiv", tmp_path)
    msg = one_line(e)
    assert "split/time/train.csv.gz" in msg and "split/time/test.csv.gz" in msg
    assert "valid.csv.gz" not in msg.split("lacks")[1].split("(")[0]
    with pytest.raises(InputError, match="ogbn-arxiv needs --data-dir"):
        load_datasets("ogbn-arxiv")
    assert dataset_info("ogbn-arxiv", tmp_path / "nothing-here").graph_edges == 2315598


# ---------------------------------------------------------------------------------------------- synthetic-graph


def test_synthetic_graph_is_seeded_and_exactly_as_named():
    name = "synthetic-graph:3000,32,5:8"
    train, test, info = load_datasets(name)
    g = train.graph
    assert info == DataInfo(name, (3000, 32), 5, 1, 1, graph_edges=3000 * 8)
    assert g.num_edges == info.graph_edges and g.x.shape == (3000, 32) and g.x.dtype == torch.float32
    src, dst = g.edge_index
    assert not (src == dst).any()
    key = src * 3000 + dst
    assert key.unique().numel() == key.numel()  # no duplicates
    assert torch.equal(key.sort()[0], (dst * 3000 + src).sort()[0])  # bidirected
    assert torch.bincount(g.y).tolist() == [600] * 5  # balanced classes
    assert torch.bincount(g.y[g.train_mask]).tolist() == [20] * 5
    assert (int(g.val_mask.sum()), int(g.test_mask.sum())) == (500, 1000)
    assert not (g.train_mask & g.val_mask).any() and not (g.val_mask & g.test_mask).any()
    assert not (g.train_mask & g.test_mask).any()
    homophily = float((g.y[src] == g.y[dst]).float().mean())
    assert 0.65 < homophily < 0.8  # 70% drawn inside a class, plus a fifth of the uniform rest
    again = synthetic_graph(3000, 32, 5, 8, name=name)
    assert torch.equal(again.x, g.x) and torch.equal(again.edge_index, g.edge_index)
    assert torch.equal(again.train_mask, g.train_mask)


def test_synthetic_graph_is_hard_and_aggregation_helps():
    """Nearest class mean (means from the training nodes): on a node's own features it is poor, on the mean over
    its neighbourhood much better, and still short of perfect."""
    g = synthetic_graph(4000, 64, 5, 10)
    n = g.num_nodes
    deg = torch.bincount(g.edge_index[1], minlength=n).float() + 1
    agg = (g.x.index_add(0, g.edge_index[1], g.x[g.edge_index[0]])) / deg[:, None]

    def accuracy(feat):
        means = torch.stack([feat[g.train_mask & (g.y == c)].mean(0) for c in range(5)])
        pred = torch.cdist(feat[g.test_mask], means).argmin(1)
        return float((pred == g.y[g.test_mask]).float().mean())

    own, mixed = accuracy(g.x), accuracy(agg)
    assert own < 0.45 and mixed > own + 0.25 and mixed < 0.97, (own, mixed)


def test_synthetic_graph_at_ogbn_arxiv_size_is_fast():
    import time

    t = time.perf_counter()
    g = synthetic_graph(169343, 16, 40, 14)
    assert g.num_edges == dataset_info("synthetic-graph:169343,16,40:14").graph_edges == 2 * (169343 * 14 // 2)
    assert time.perf_counter() - t < 10


@pytest.mark.parametrize("name,words", [
    ("synthetic-graph", "expected synthetic-graph:N,F,K[:DEG]"),
    ("synthetic-graph:100,8", "three sizes N,F,K"),
    ("synthetic-graph:100,8,x", "K (classes) must be a positive integer"),
    ("synthetic-graph:100,0,4", "F (features) must be a positive integer"),
    ("synthetic-graph:100,8,4:0", "DEG (average degree) must be a positive integer"),
    ("synthetic-graph:100,8,4:2:3", "expected synthetic-graph:N,F,K[:DEG]"),
    ("synthetic-graph:100,8,1", "at least 2"),
    ("synthetic-graph:10,8,4", "at least 4 K = 16"),
    ("synthetic-graph:40,8,4:30", "too dense"),
    ("synthetic-graph:100000,100000,4", "smaller graph"),
])
def test_malformed_synthetic_graph_names_are_one_line(name, words):
    with pytest.raises(InputError) as e:
        dataset_info(name)
    assert words in one_line(e)
    with pytest.raises(InputError):
        parse_synthetic_graph(name)


# ---------------------------------------------------------------------------------------------- model/data pairing


@pytest.fixture
def gcn_registered(monkeypatch):
    """A graph model in the model registry ("input": "graph"), whether or not cptsim.models has gcn yet."""
    import cptsim.models as models

    real = models.model_info

    def info(name):
        if name.split(":")[0] in ("gcn", "sage", "gat"):
            return {"name": name, "family": "graph", "input": "graph", "description": ""}
        return real(name)

    monkeypatch.setattr(models, "model_info", info)


def test_graph_models_default_to_karate_and_refuse_other_kinds(gcn_registered):
    assert model_kind("gcn") == "graph" and default_dataset("gcn:layers=2") == "karate"
    assert default_dataset("resnet20") == "digits" and default_dataset("lstm-lm") == "pydoc-chars"
    check_pairing("gcn", "karate")
    check_pairing("gcn", "synthetic-graph:100,8,4")
    for dataset in ("digits", "pydoc-chars"):
        with pytest.raises(InputError) as e:
            check_pairing("gcn", dataset)
        assert "gcn is a graph model: it needs a graph dataset" in one_line(e) and "karate" in one_line(e)
    with pytest.raises(InputError) as e:
        check_pairing("resnet20", "cora")
    assert "resnet20 is an image model: the graph dataset cora needs a graph model (gcn" in one_line(e)
    with pytest.raises(InputError) as e:
        check_pairing("lstm-lm", "karate")
    assert "language model" in one_line(e) and "not the graph dataset karate" in one_line(e)
    with pytest.raises(InputError, match="the text dataset pydoc-chars needs a language model"):
        check_pairing("resnet20", "pydoc-chars")  # unchanged


def test_a_built_pyg_model_is_a_graph_model():
    from torch_geometric.nn import GCNConv

    net = torch.nn.Sequential(GCNConv(4, 4))
    assert model_kind(net) == "graph" and default_dataset(net) == "karate"
    assert model_kind(torch.nn.Linear(2, 2)) == "image"

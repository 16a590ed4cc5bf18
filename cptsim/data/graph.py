"""Graph datasets for node classification, in cptsim.data's registry. Nothing is downloaded.

Convention: **one sample is the whole graph** (full-batch training, as cpt_gnn trains ogbn-arxiv). A graph
dataset's ``DataInfo`` has ``input_shape = (N, F)`` (nodes, features per node), ``num_classes = C``,
``train_size = test_size = 1`` and ``graph_edges = E``: the directed edges of ``edge_index`` as the model receives
it (bidirected where the dataset says so, no self-loops: GCNConv adds those itself). A dataset is a graph one when
``info.graph_edges is not None``. Both splits hold the same graph; what differs is which nodes are labelled: a
``GraphSplit``'s labels are -100 (``F.cross_entropy``'s ignore_index) outside its mask.

Datasets (shapes are known without any file, so plan/cost/profile work from the registry alone):

* ``karate`` (the default graph dataset): Zachary's karate club as PyG ships it inside ``torch_geometric``
  (``KarateClub``: 34 nodes, one-hot identity features (34), 4 classes from modularity clustering, 156 directed
  edges; PyG's docs). PyG labels one node per class for training and gives no other split. Here: train = those 4
  nodes, **test = the other 30** (Kipf & Welling's semi-supervised setting: every unlabelled node is predicted),
  **no validation mask** - 30 nodes are too few to spare some for model selection, and a seeded val split would
  leave a test set of a dozen nodes whose accuracy moves in steps of 8%.
* ``planetoid``: ``--data-dir`` holding Planetoid's raw files ``ind.<name>.{x,tx,allx,y,ty,ally,graph,test.index}``
  (the name read from the file names; also found under ``raw/`` or ``<Name>/raw/``, PyG's layout), read as PyG's
  ``torch_geometric.io.read_planetoid_data`` reads them: the standard split (the ``x`` nodes train, the next 500
  validate, ``test.index`` tests), test nodes missing from ``tx`` (CiteSeer's isolated nodes) as zero rows, self
  loops removed and duplicate edges merged (PyG's ``coalesce``, same edge order). Where PyG's reader fails or
  overlaps the splits (a small graph with fewer than 500 nodes between the train and test nodes), the validation
  nodes stop at the first test-range node. ``cora``, ``citeseer``, ``pubmed``: the same reader, with the shapes
  of PyG's ``Planetoid`` docs (Cora 2,708 nodes / 1,433 features / 7 classes / 10,556 edges; CiteSeer
  3,327 / 3,703 / 6 / 9,104; PubMed 19,717 / 500 / 3 / 88,648) when no folder is given.
  The pickles are read with a restricted unpickler (``safe_unpickle``) that admits only the numpy, scipy.sparse
  and builtin types the format uses; anything else is refused, naming the file, before it runs.
  ``write_planetoid`` writes such a folder (tests, evidence runs).
* ``ogbn-arxiv``: ``--data-dir`` in OGB's raw layout (``raw/node-feat.csv.gz``, ``raw/node-label.csv.gz``,
  ``raw/edge.csv.gz``, ``split/time/{train,valid,test}.csv.gz``; the ``ogbn_arxiv`` folder or its parent), read
  with gzip + ``numpy.loadtxt``, no ``ogb`` package. As cpt_gnn's ``train_arxiv.py``: bidirected
  (``dgl.to_bidirected``: both directions, duplicates merged; self-loops are dropped here, arxiv has none) and
  features z-scored per feature over all nodes (``(feat - feat.mean(0)) / feat.std(0)``, torch's unbiased std; a
  constant feature, which would be NaN there, becomes 0 here). Shapes without files (OGB's docs): 169,343 nodes,
  128 features, 40 classes, 1,166,243 directed edges = 1,157,799 node pairs = E 2,315,598 after bidirecting;
  the time split trains 90,941, validates 29,799, tests 48,603. ``write_ogbn_arxiv`` writes the layout.
* ``synthetic-graph:N,F,K[:DEG]``: a seeded stochastic-block-model graph for throughput and scale (``synthetic_graph``):
  K balanced classes, exactly N*DEG//2 distinct undirected edges (so E = 2*(N*DEG//2), known from the name), 70%
  of them drawn inside a class, and Gaussian features around class means set close relative to the noise, so that
  a node's own features say its class poorly and its neighbours' average much better (a GCN well above an MLP and
  well below 100%). Split as Planetoid: 20 labelled nodes per class train, 500 validate, 1000 test (fewer on a small
  graph: ``synthetic_graph_split``).
"""

from __future__ import annotations

import builtins as _builtins
import collections as _collections
import gzip
import io
import math
import os
import pickle
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from cptsim.errors import InputError

from .registry import DataInfo, nominal_info, register_dataset, register_prefix

__all__ = ["Graph", "GraphSplit", "GRAPH_DEFAULT", "GRAPH_DATASETS", "graph_info", "graph_splits",
           "read_planetoid", "write_planetoid", "planetoid_names", "safe_unpickle", "PLANETOID_SUFFIXES",
           "read_ogbn_arxiv", "write_ogbn_arxiv", "OGB_ARXIV_FILES",
           "SYNTHETIC_GRAPH", "SYNTHETIC_GRAPH_FORM", "parse_synthetic_graph", "synthetic_graph",
           "synthetic_graph_edges", "synthetic_graph_split", "karate", "IGNORE", "KARATE_INFO", "PLANETOID_SHAPES",
           "OGB_ARXIV_INFO"]

GRAPH_DEFAULT = "karate"
IGNORE = -100  # F.cross_entropy's ignore_index: the label of a node outside the split's mask
INSTALL = "pip install 'cptsim[graph]'"


# ---------------------------------------------------------------------------------------------- the data types


@dataclass
class Graph:
    """One graph: ``x`` [N, F] float32, ``edge_index`` [2, E] int64 (directed edges source -> target, no
    self-loops), ``y`` [N] int64, boolean masks [N] (``val_mask`` may be all False: no validation nodes)."""

    x: torch.Tensor
    edge_index: torch.Tensor
    y: torch.Tensor
    train_mask: torch.Tensor
    val_mask: torch.Tensor
    test_mask: torch.Tensor
    name: str
    num_classes: int = 0  # 0: y.max() + 1

    def __post_init__(self):
        if not self.num_classes:
            self.num_classes = int(self.y.max()) + 1 if self.y.numel() else 1

    @property
    def num_nodes(self) -> int:
        return int(self.x.shape[0])

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])


class GraphSplit(Dataset):
    """One split of a graph dataset: one sample, the whole graph, labelled at the split's mask only.

    ``split``: "train" | "val" | "test"; ``labelled``: nodes in the mask; ``self[0] = (x [N, F], y [N])`` with
    y = -100 outside the mask. ``gather(indices, device)`` gives the batch ``(x [B, N, F], y [B, N])`` of B copies
    (indices all 0; the trainer asks for B = 1) on ``device`` without a DataLoader; the tensors move there once.
    The train split carries ``valid``, the validation split, where the dataset has validation nodes.
    """

    is_graph = True

    def __init__(self, graph: Graph, split: str):
        masks = {"train": graph.train_mask, "val": graph.val_mask, "test": graph.test_mask}
        if split not in masks:
            raise ValueError(f"split must be one of {', '.join(masks)}, got {split!r}")
        self.graph, self.split = graph, split
        self.mask = masks[split]
        self.labelled = int(self.mask.sum())
        self.y = torch.where(self.mask, graph.y, torch.full_like(graph.y, IGNORE))
        self.valid: GraphSplit | None = None
        self._on: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def name(self) -> str:
        return self.graph.name

    def __len__(self) -> int:
        return 1

    def __getitem__(self, k):
        if int(k) not in (0, -1):
            raise IndexError(f"a graph split has one sample (the whole graph); index {k} is out of range")
        return self.graph.x, self.y

    def gather(self, indices, device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """``(x [B, N, F], y [B, N])`` on ``device`` for B sample indices (all 0): views of tensors moved there
        once (on the first call for that device), no copy per step."""
        dev = torch.device(device)
        key = str(dev)
        if key not in self._on:
            self._on[key] = (self.graph.x.to(dev).unsqueeze(0), self.y.to(dev).unsqueeze(0))
        x, y = self._on[key]
        idx = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        if idx.numel() < 1 or bool((idx != 0).any()):
            raise IndexError(f"a graph split has one sample (the whole graph); asked for {idx.tolist()}")
        b = idx.numel()
        return (x, y) if b == 1 else (x.expand(b, -1, -1), y.expand(b, -1))


def graph_info(name: str, g: Graph) -> DataInfo:
    """The DataInfo of a loaded graph under the registry name ``name``."""
    return DataInfo(name, (g.num_nodes, g.num_features), g.num_classes, 1, 1, graph_edges=g.num_edges)


def graph_splits(g: Graph) -> tuple[GraphSplit, GraphSplit]:
    """(train, test) splits of ``g``; the train split carries ``valid`` when ``g`` has validation nodes."""
    train, test = GraphSplit(g, "train"), GraphSplit(g, "test")
    if bool(g.val_mask.any()):
        train.valid = GraphSplit(g, "val")
    return train, test


def _mask(index: torch.Tensor, n: int) -> torch.Tensor:
    m = torch.zeros(n, dtype=torch.bool)
    m[index] = True
    return m


def _coalesce(row: torch.Tensor, col: torch.Tensor, n: int, by_row: bool = True) -> torch.Tensor:
    """[2, E] edges without self-loops and duplicates, sorted by (row, col) (``by_row``) or (col, row) (PyG's
    ``coalesce(..., sort_by_row=False)``)."""
    keep = row != col
    row, col = row[keep], col[keep]
    key = torch.unique(row * n + col if by_row else col * n + row)
    a, b = key // n, key % n
    return torch.stack([a, b] if by_row else [b, a])


def _need_pyg(what: str):
    try:
        import torch_geometric  # noqa: F401
    except ImportError:
        raise InputError(f"{what} needs torch_geometric: {INSTALL}") from None


_CACHE: dict = {}  # (dataset, folder, file times) -> Graph; a few at a time (ogbn-arxiv is ~100 MB)


def _cached(key, make):
    if key not in _CACHE:
        if len(_CACHE) >= 4:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = make()
    return _CACHE[key]


def _stamp(files) -> tuple:
    return tuple((str(f), os.stat(f).st_mtime_ns, os.stat(f).st_size) for f in files)


# ---------------------------------------------------------------------------------------------- karate

KARATE_INFO = DataInfo("karate", (34, 34), 4, 1, 1, graph_edges=156)


def karate() -> Graph:
    """Zachary's karate club from PyG's ``KarateClub`` (its data is inside the package): train = PyG's 4 labelled
    nodes (one per class), test = the other 30, no validation nodes (see the module docstring)."""
    _need_pyg("the karate dataset (PyG's KarateClub)")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch_geometric.datasets import KarateClub

        data = KarateClub()[0]
    n = int(data.num_nodes)
    ei = _coalesce(data.edge_index[0].long(), data.edge_index[1].long(), n)
    train = data.train_mask.bool().clone()
    return Graph(data.x.float().contiguous(), ei, data.y.long().clone(), train, torch.zeros(n, dtype=torch.bool),
                 ~train, "karate", num_classes=int(data.y.max()) + 1)


def _load_karate(root, augment):
    return graph_splits(karate())


# ---------------------------------------------------------------------------------------------- Planetoid

PLANETOID_SUFFIXES = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
_PLANETOID_FORM = "ind.<name>.{" + ",".join(PLANETOID_SUFFIXES) + "}"
# name -> (N, F, C, E) as PyG's Planetoid docs list them
PLANETOID_SHAPES = {"cora": (2708, 1433, 7, 10556), "citeseer": (3327, 3703, 6, 9104),
                    "pubmed": (19717, 500, 3, 88648)}
PLANETOID_VAL = 500  # the standard split's validation nodes: the 500 after the training ones


def _numpy_core(name: str):
    import importlib

    for mod in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            return getattr(importlib.import_module(mod), name)
        except (ImportError, AttributeError):
            continue
    raise AttributeError(name)


def _numpy_numeric(name: str):
    import importlib

    for mod in ("numpy._core.numeric", "numpy.core.numeric"):
        try:
            return getattr(importlib.import_module(mod), name)
        except (ImportError, AttributeError):
            continue
    raise AttributeError(name)


def _csr_matrix():
    import scipy.sparse

    return scipy.sparse.csr_matrix


def _csr_array():
    import scipy.sparse

    return scipy.sparse.csr_array


def _codecs_encode():
    import _codecs

    return _codecs.encode


# (module, name) as a pickle names it -> the object it stands for. The Planetoid files are Python 2 pickles
# (protocol 2, read with encoding="latin1"): csr_matrix (scipy.sparse.csr) and ndarray (numpy.core.multiarray.
# _reconstruct, numpy.ndarray, numpy.dtype) for the features and labels, collections.defaultdict of __builtin__.list
# for the graph. Python 3 pickles of the same objects name numpy._core, scipy.sparse._csr and _codecs.encode (bytes
# at protocol 2). Nothing else - no callable that reaches the file system, a process, or an import by name.
_ALLOWED = {
    **{(mod, n): (lambda n=n: getattr(_builtins, n))
       for mod in ("builtins", "__builtin__")
       for n in ("list", "dict", "set", "frozenset", "tuple", "object", "int", "float", "complex", "bool", "str",
                 "bytes", "bytearray")},
    ("collections", "defaultdict"): lambda: _collections.defaultdict,
    ("collections", "OrderedDict"): lambda: _collections.OrderedDict,
    ("copy_reg", "_reconstructor"): lambda: __import__("copyreg")._reconstructor,
    ("copyreg", "_reconstructor"): lambda: __import__("copyreg")._reconstructor,
    ("_codecs", "encode"): _codecs_encode,
    ("numpy", "ndarray"): lambda: np.ndarray,
    ("numpy", "dtype"): lambda: np.dtype,
    **{(mod, n): (lambda n=n: _numpy_core(n))
       for mod in ("numpy.core.multiarray", "numpy._core.multiarray") for n in ("_reconstruct", "scalar")},
    **{(mod, "_frombuffer"): (lambda: _numpy_numeric("_frombuffer"))
       for mod in ("numpy.core.numeric", "numpy._core.numeric")},
    **{(mod, "csr_matrix"): _csr_matrix for mod in ("scipy.sparse.csr", "scipy.sparse._csr", "scipy.sparse")},
    **{(mod, "csr_array"): _csr_array for mod in ("scipy.sparse._arrays", "scipy.sparse._csr", "scipy.sparse")},
}


class _Refused(Exception):
    pass


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        make = _ALLOWED.get((module, name))
        if make is None:
            raise _Refused(f"{module}.{name}")
        return make()

    def persistent_load(self, pid):
        raise _Refused(f"a persistent id {pid!r}")


def safe_unpickle(path: Path, what: str = "planetoid"):
    """The object pickled in ``path`` (latin1 for Python 2 pickles), admitting only the numpy, scipy.sparse csr
    and builtin types of the Planetoid format (``_ALLOWED``). Anything else - a ``__reduce__`` that calls
    ``os.system`` or ``open`` - is an InputError naming the file, raised before the call runs."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return _RestrictedUnpickler(f, encoding="latin1").load()
    except _Refused as e:
        raise InputError(f"{what}: {path} is not a Planetoid file: its pickle asks for {e}, which the format never "
                         "uses; refused without loading it") from None
    except OSError as e:
        raise InputError(f"{what}: cannot read {path}: {e.strerror or e}") from None
    except Exception as e:  # noqa: BLE001 - only _ALLOWED's constructors run in load(), so whatever they raise on
        # the file's arguments (LookupError from _codecs.encode's encoding name, RecursionError from nesting, ...)
        # says the file is not a Planetoid pickle
        raise InputError(f"{what}: could not read {path} ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else 'corrupt pickle'})") from None


_SUFFIX_RE = re.compile(r"^ind\.(.+)\.(" + "|".join(re.escape(s) for s in sorted(PLANETOID_SUFFIXES, key=len,
                                                                                    reverse=True)) + r")$")


def _planetoid_files(folder: Path) -> dict[str, set[str]]:
    """name -> the suffixes present in ``folder`` (``ind.<name>.<suffix>`` files)."""
    found: dict[str, set[str]] = {}
    if not folder.is_dir():
        return found
    for e in os.scandir(folder):
        m = _SUFFIX_RE.match(e.name)
        if m and e.is_file():
            found.setdefault(m.group(1), set()).add(m.group(2))
    return found


def _planetoid_folders(root: Path) -> list[Path]:
    """Where Planetoid files may lie: the folder itself, its raw/, and <Name>/raw/ below it (PyG's layout)."""
    cands = [root, root / "raw"]
    if root.is_dir():
        cands += sorted(p / "raw" for p in root.iterdir() if p.is_dir() and p.name != "raw")
    return cands


def planetoid_names(root) -> dict[str, Path]:
    """Planetoid dataset names found under ``root`` (see ``_planetoid_folders``) -> the folder holding them."""
    out: dict[str, Path] = {}
    for folder in _planetoid_folders(Path(root)):
        for name in _planetoid_files(folder):
            out.setdefault(name, folder)
    return out


def _locate_planetoid(what: str, root: Path, name: str | None) -> tuple[Path, str]:
    """(folder, name) of the Planetoid files ``what`` reads under ``root``; InputError naming what is missing."""
    found = planetoid_names(root)
    if name is None:
        if not found:
            raise InputError(f"{what}: {root} holds no Planetoid raw files ({_PLANETOID_FORM})")
        if len(found) > 1:
            raise InputError(f"{what}: {root} holds the Planetoid files of several datasets "
                             f"({', '.join(sorted(found))}); point --data-dir at a folder with one")
        name = next(iter(found))
    key = name.lower()
    if key not in found:
        raise InputError(f"{what}: {root} lacks ind.{key}.x and the other Planetoid raw files of {key} "
                         f"({_PLANETOID_FORM.replace('<name>', key)})")
    folder = found[key]
    missing = [f"ind.{key}.{s}" for s in PLANETOID_SUFFIXES if not (folder / f"ind.{key}.{s}").is_file()]
    if missing:
        raise InputError(f"{what}: {folder} lacks {', '.join(missing)} "
                         f"(Planetoid raw files: {_PLANETOID_FORM.replace('<name>', key)})")
    if key.startswith("nell"):
        raise InputError(f"{what}: {key}'s Planetoid files need PyG's relation-feature expansion, which cptsim's "
                         "reader does not do; use cora, citeseer, pubmed or a folder of that format")
    return folder, key


def _dense(obj, path: Path, what: str) -> np.ndarray:
    if hasattr(obj, "toarray") and hasattr(obj, "shape"):
        obj = obj.toarray()
    if not isinstance(obj, np.ndarray) or obj.ndim != 2:
        raise InputError(f"{what}: {path} does not hold a 2-D matrix (found {type(obj).__name__})")
    try:
        return np.asarray(obj, dtype=np.float32)
    except (TypeError, ValueError):
        raise InputError(f"{what}: {path} holds a matrix of {obj.dtype}, not numbers") from None


def _read_test_index(path: Path, what: str) -> np.ndarray:
    try:
        words = path.read_text(encoding="latin1").split()
        idx = np.array([int(w) for w in words], dtype=np.int64)
    except ValueError as e:
        raise InputError(f"{what}: {path} is not one node index per line ({e})") from None
    except OSError as e:
        raise InputError(f"{what}: cannot read {path}: {e.strerror or e}") from None
    if idx.size == 0:
        raise InputError(f"{what}: {path} is empty")
    return idx


def _graph_edges(graph, path: Path, n: int, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(graph, dict):
        raise InputError(f"{what}: {path} does not hold an adjacency dict (found {type(graph).__name__})")
    rows, cols = [], []
    try:
        for k, nbrs in graph.items():
            nbrs = list(nbrs)
            rows.append(np.full(len(nbrs), int(k), dtype=np.int64))
            cols.append(np.asarray(nbrs, dtype=np.int64).reshape(-1))
    except (TypeError, ValueError):
        raise InputError(f"{what}: {path} is not a dict of node -> list of neighbour nodes") from None
    row = torch.from_numpy(np.concatenate(rows)) if rows else torch.zeros(0, dtype=torch.long)
    col = torch.from_numpy(np.concatenate(cols)) if cols else torch.zeros(0, dtype=torch.long)
    if row.numel() and (int(row.min()) < 0 or int(col.min()) < 0 or max(int(row.max()), int(col.max())) >= n):
        raise InputError(f"{what}: {path} names nodes outside 0..{n - 1} (the nodes of allx and test.index)")
    return row, col


def read_planetoid(root, name: str | None = None, what: str = "planetoid") -> Graph:
    """The Planetoid dataset in ``root`` (``name``: its file prefix, None = the one there), read as PyG's
    ``read_planetoid_data`` reads it (see the module docstring); InputError naming a missing or bad file."""
    root = Path(root).expanduser()
    folder, key = _locate_planetoid(what, root, name)
    files = {s: folder / f"ind.{key}.{s}" for s in PLANETOID_SUFFIXES}
    return _cached(("planetoid", key, _stamp(files.values())), lambda: _read_planetoid(files, key, what))


def _read_planetoid(files: dict[str, Path], key: str, what: str) -> Graph:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy.core / scipy.sparse.csr deprecation notes
        obj = {s: safe_unpickle(files[s], what) for s in PLANETOID_SUFFIXES if s != "test.index"}
    d = {s: _dense(obj[s], files[s], what) for s in ("x", "tx", "allx", "y", "ty", "ally")}
    x, tx, allx, y, ty, ally = (d[s] for s in ("x", "tx", "allx", "y", "ty", "ally"))
    test_index = _read_test_index(files["test.index"], what)
    for a, b in (("x", "y"), ("tx", "ty"), ("allx", "ally")):
        if d[a].shape[0] != d[b].shape[0]:
            raise InputError(f"{what}: {files[a].name} has {d[a].shape[0]} rows but {files[b].name} has "
                             f"{d[b].shape[0]}")
    if not x.shape[1] == tx.shape[1] == allx.shape[1]:
        raise InputError(f"{what}: the feature widths of {key}'s x, tx, allx differ "
                         f"({x.shape[1]}, {tx.shape[1]}, {allx.shape[1]})")
    if not y.shape[1] == ty.shape[1] == ally.shape[1]:
        raise InputError(f"{what}: the label widths of {key}'s y, ty, ally differ "
                         f"({y.shape[1]}, {ty.shape[1]}, {ally.shape[1]})")
    if len(test_index) != tx.shape[0]:
        raise InputError(f"{what}: {files['test.index'].name} names {len(test_index)} nodes but "
                         f"{files['tx'].name} has {tx.shape[0]} rows")
    a = allx.shape[0]
    if len(y) > a:
        raise InputError(f"{what}: {files['x'].name} has {len(y)} training nodes, more than allx's {a}")
    if int(test_index.min()) < a:
        raise InputError(f"{what}: {files['test.index'].name} names node {int(test_index.min())}, which allx "
                         f"already holds (its {a} nodes come first)")
    if len(np.unique(test_index)) != len(test_index):
        raise InputError(f"{what}: {files['test.index'].name} names a node twice")
    # PyG: N = len(allx) + len(tx), or, for CiteSeer (test nodes missing from tx), len(allx) + the test index range;
    # the missing nodes are zero rows with label 0.
    n = max(a + tx.shape[0], int(test_index.max()) + 1)
    feat = np.zeros((n, x.shape[1]), dtype=np.float32)
    feat[:a] = allx
    feat[test_index] = tx
    onehot = np.zeros((n, y.shape[1]), dtype=np.float32)
    onehot[:a] = ally
    onehot[test_index] = ty
    labels = torch.from_numpy(onehot).max(dim=1)[1]
    row, col = _graph_edges(obj["graph"], files["graph"], n, what)
    edge_index = _coalesce(row, col, n, by_row=False)
    train_index = torch.arange(len(y))
    val_index = torch.arange(len(y), min(len(y) + PLANETOID_VAL, a))
    test = torch.from_numpy(test_index)
    return Graph(torch.from_numpy(feat), edge_index, labels, _mask(train_index, n), _mask(val_index, n),
                 _mask(test, n), key, num_classes=int(y.shape[1]))


def write_planetoid(directory, name: str, x, y, edge_index, num_train: int, test_index, num_classes=None) -> Path:
    """Write a graph as Planetoid raw files ``ind.<name>.*`` in ``directory`` (made if missing); returns it.

    ``x`` [N, F] features, ``y`` [N] labels, ``edge_index`` [2, E] (written as the adjacency dict as given; the
    reader drops self-loops and merges duplicates); nodes ``0..num_train-1`` are the labelled ``x`` nodes;
    ``test_index``: the test nodes, in the order ``tx`` lists them, all at or after the non-test nodes ``allx``
    holds (0..min(test_index)-1) and including N-1. Nodes between min(test_index) and N-1 that are not in it are
    left out of ``tx`` (CiteSeer's isolated nodes): they read back as zero rows with label 0. The pickles are
    protocol 2 with the original files' global names (numpy.core.multiarray, scipy.sparse.csr), so they read as
    the Python 2 originals do."""
    import scipy.sparse as sp

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    x = np.asarray(torch.as_tensor(x, dtype=torch.float32).cpu().numpy(), dtype=np.float32)
    y = np.asarray(torch.as_tensor(y).cpu().numpy(), dtype=np.int64).reshape(-1)
    ei = np.asarray(torch.as_tensor(edge_index).cpu().numpy(), dtype=np.int64)
    test_index = np.asarray(torch.as_tensor(test_index).cpu().numpy(), dtype=np.int64).reshape(-1)
    n = x.shape[0]
    c = int(num_classes) if num_classes is not None else int(y.max()) + 1
    a = int(test_index.min())
    if y.shape[0] != n or int(test_index.max()) != n - 1 or not 0 <= num_train <= a:
        raise ValueError("need len(y) == N, max(test_index) == N-1 and num_train <= min(test_index)")
    onehot = np.eye(c, dtype=np.int32)[y]

    def dump(suffix: str, obj):
        data = pickle.dumps(obj, protocol=2)
        for new, old in ((b"numpy._core.multiarray\n", b"numpy.core.multiarray\n"),
                         (b"scipy.sparse._csr\n", b"scipy.sparse.csr\n")):
            data = data.replace(b"c" + new, b"c" + old)
        (directory / f"ind.{name}.{suffix}").write_bytes(data)

    dump("x", sp.csr_matrix(x[:num_train]))
    dump("y", onehot[:num_train])
    dump("allx", sp.csr_matrix(x[:a]))
    dump("ally", onehot[:a])
    dump("tx", sp.csr_matrix(x[test_index]))
    dump("ty", onehot[test_index])
    from collections import defaultdict

    graph = defaultdict(list)
    for s, t in ei.T.tolist():
        graph[s].append(t)
    dump("graph", graph)
    (directory / f"ind.{name}.test.index").write_text("".join(f"{int(i)}\n" for i in test_index))
    return directory


def _planetoid_info(registered: str, file_name: str | None):
    def info(data_dir) -> DataInfo:
        nominal = nominal_info(registered)
        if file_name is None and data_dir is not None and str(data_dir) != "" \
                and not Path(data_dir).expanduser().is_dir():
            raise InputError(f"{registered}: data dir {Path(data_dir).expanduser()} is not a directory (expected "
                             f"Planetoid's raw files {_PLANETOID_FORM})")
        if data_dir is None or str(data_dir) == "" or not Path(data_dir).expanduser().is_dir():
            if file_name is None:
                raise InputError(f"{registered} reads its shapes from the Planetoid raw files in --data-dir "
                                 f"({_PLANETOID_FORM}); without them use cora, citeseer or pubmed, whose shapes "
                                 "are known")
            return nominal
        root = Path(data_dir).expanduser()
        if file_name is not None and file_name not in planetoid_names(root):
            return nominal  # the loader says what is missing
        return graph_info(registered, read_planetoid(root, file_name, registered))

    return info


def _planetoid_loader(registered: str, file_name: str | None):
    def load(root, augment):
        return graph_splits(read_planetoid(root, file_name, registered))

    return load


def _planetoid_size(file_name: str | None):
    def size(root: Path) -> int | None:
        names = planetoid_names(root)
        if file_name is None:
            return 1 if len(names) == 1 else None
        return 1 if file_name in names else None

    return size


# ---------------------------------------------------------------------------------------------- ogbn-arxiv

OGB_ARXIV_FILES = ("raw/node-feat.csv.gz", "raw/node-label.csv.gz", "raw/edge.csv.gz",
                   "split/time/train.csv.gz", "split/time/valid.csv.gz", "split/time/test.csv.gz")
OGB_ARXIV_FOLDER = "ogbn_arxiv"
# OGB's docs: 169,343 nodes, 128 features, 40 classes, 1,166,243 directed edges (1,157,799 node pairs: 8,444
# citations are reciprocated) -> 2,315,598 directed edges bidirected; time split 90,941 / 29,799 / 48,603.
OGB_ARXIV_INFO = DataInfo("ogbn-arxiv", (169343, 128), 40, 1, 1, graph_edges=2315598)
_OGB_NEEDS = (f"OGB's ogbn-arxiv raw layout ({', '.join(OGB_ARXIV_FILES)}): the {OGB_ARXIV_FOLDER} folder or the "
              "folder holding it")


def _ogb_root(root: Path) -> Path:
    """The ogbn_arxiv folder: ``root`` itself when it has raw/ or split/, else ``root/ogbn_arxiv`` if there."""
    if (root / "raw").is_dir() or (root / "split").is_dir():
        return root
    return root / OGB_ARXIV_FOLDER if (root / OGB_ARXIV_FOLDER).is_dir() else root


def _read_csv(path: Path, dtype, what: str, cols: int | None = None) -> np.ndarray:
    try:
        with gzip.open(path, "rt") as f:
            arr = np.loadtxt(f, delimiter=",", dtype=dtype, ndmin=2)
    except (ValueError, OSError, EOFError) as e:
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"{what}: could not read {path} as gzipped CSV ({detail})") from None
    if cols is not None and arr.shape[1] != cols:
        raise InputError(f"{what}: {path} has {arr.shape[1]} columns per line, expected {cols}")
    return arr


def read_ogbn_arxiv(root, what: str = "ogbn-arxiv") -> Graph:
    """ogbn-arxiv from OGB's raw layout under ``root`` (see the module docstring); InputError naming the files
    that are missing or unreadable."""
    base = _ogb_root(Path(root).expanduser())
    files = [base / f for f in OGB_ARXIV_FILES]
    missing = [f for f, p in zip(OGB_ARXIV_FILES, files) if not p.is_file()]
    if missing:
        raise InputError(f"{what}: {base} lacks {', '.join(missing)} (expected {_OGB_NEEDS})")
    return _cached(("ogbn-arxiv", _stamp(files)), lambda: _read_ogbn_arxiv(base, what))


def _read_ogbn_arxiv(base: Path, what: str) -> Graph:
    feat = _read_csv(base / OGB_ARXIV_FILES[0], np.float32, what)
    label = _read_csv(base / OGB_ARXIV_FILES[1], np.int64, what, cols=1).reshape(-1)
    edges = _read_csv(base / OGB_ARXIV_FILES[2], np.int64, what, cols=2)
    n = feat.shape[0]
    if label.shape[0] != n:
        raise InputError(f"{what}: node-label.csv.gz has {label.shape[0]} nodes, node-feat.csv.gz {n}")
    if edges.size and (edges.min() < 0 or edges.max() >= n):
        raise InputError(f"{what}: edge.csv.gz names nodes outside 0..{n - 1}")
    if label.min() < 0:
        raise InputError(f"{what}: node-label.csv.gz has a negative label")
    masks = []
    for f in OGB_ARXIV_FILES[3:]:
        idx = _read_csv(base / f, np.int64, what, cols=1).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise InputError(f"{what}: {f} names nodes outside 0..{n - 1}")
        masks.append(_mask(torch.from_numpy(idx), n))
    x = torch.from_numpy(feat)
    std = x.std(0)
    x = (x - x.mean(0)) / torch.where(std > 0, std, torch.ones_like(std))  # cpt_gnn: (feat - mean(0)) / std(0)
    e = torch.from_numpy(edges.T.copy())
    edge_index = _coalesce(torch.cat([e[0], e[1]]), torch.cat([e[1], e[0]]), n)  # to_bidirected
    return Graph(x.contiguous(), edge_index, torch.from_numpy(label), masks[0], masks[1], masks[2], "ogbn-arxiv",
                 num_classes=int(label.max()) + 1)


def write_ogbn_arxiv(directory, x, y, edge_index, train, valid, test) -> Path:
    """Write OGB's ogbn-arxiv raw layout (``OGB_ARXIV_FILES``) under ``directory`` (made if missing): ``x`` [N, F],
    ``y`` [N], ``edge_index`` [2, E] as given (directed), the split node lists. Returns ``directory``."""
    directory = Path(directory)

    def write(rel: str, rows: np.ndarray, fmt: str):
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.StringIO()
        np.savetxt(buf, rows, fmt=fmt, delimiter=",")
        with gzip.open(path, "wt") as f:
            f.write(buf.getvalue())

    def arr(t, dtype):
        return np.asarray(torch.as_tensor(t).cpu().numpy(), dtype=dtype)

    write(OGB_ARXIV_FILES[0], arr(x, np.float32), "%.9g")
    write(OGB_ARXIV_FILES[1], arr(y, np.int64).reshape(-1, 1), "%d")
    write(OGB_ARXIV_FILES[2], arr(edge_index, np.int64).T, "%d")
    for rel, idx in zip(OGB_ARXIV_FILES[3:], (train, valid, test)):
        write(rel, arr(idx, np.int64).reshape(-1, 1), "%d")
    return directory


def _ogb_info(data_dir) -> DataInfo:
    if data_dir is None or str(data_dir) == "" or not Path(data_dir).expanduser().is_dir():
        return OGB_ARXIV_INFO
    base = _ogb_root(Path(data_dir).expanduser())
    if not any((base / f).is_file() for f in OGB_ARXIV_FILES):
        return OGB_ARXIV_INFO  # nothing of it there: the loader says what is missing
    return graph_info("ogbn-arxiv", read_ogbn_arxiv(data_dir))


def _ogb_size(root: Path) -> int | None:
    base = _ogb_root(root)
    return 1 if all((base / f).is_file() for f in OGB_ARXIV_FILES) else None


def _load_ogb(root, augment):
    return graph_splits(read_ogbn_arxiv(root))


# ---------------------------------------------------------------------------------------------- synthetic-graph

SYNTHETIC_GRAPH = "synthetic-graph"
SYNTHETIC_GRAPH_FORM = ("synthetic-graph:N,F,K[:DEG] (a seeded stochastic-block-model graph: N nodes, F features, "
                        "K classes, average degree DEG, default 10)")
SYNTHETIC_GRAPH_DEG = 10
SYNTHETIC_GRAPH_SEED = 20240624
SYNTHETIC_GRAPH_MAX = 2**31  # elements of x, and edges: far past ogbn-products' size
SYNTHETIC_GRAPH_INTRA = 0.7  # the share of edges drawn inside a class (the rest: between uniform nodes)
SYNTHETIC_GRAPH_SEPARATION = 1.0  # distance between class means, in units of the features' noise std


def parse_synthetic_graph(name: str) -> tuple[int, int, int, int]:
    """(N, F, K, DEG) of a ``synthetic-graph:N,F,K[:DEG]`` name; InputError naming the part that is wrong."""
    parts = name.strip().lower().split(":")
    if parts[0] != SYNTHETIC_GRAPH or len(parts) not in (2, 3):
        raise InputError(f"dataset {name!r}: expected {SYNTHETIC_GRAPH_FORM}, e.g. synthetic-graph:169343,128,40:14")

    def count(text: str, what: str) -> int:
        if not text.strip().isdigit() or int(text) < 1:
            raise InputError(f"dataset {name!r}: {what} must be a positive integer, got {text!r} "
                             f"(expected {SYNTHETIC_GRAPH_FORM})")
        return int(text)

    dims = parts[1].split(",")
    if len(dims) != 3:
        raise InputError(f"dataset {name!r}: expected three sizes N,F,K before the degree, got {parts[1]!r} "
                         f"({SYNTHETIC_GRAPH_FORM})")
    n, f, k = (count(d, w) for d, w in zip(dims, ("N (nodes)", "F (features)", "K (classes)")))
    deg = count(parts[2], "DEG (average degree)") if len(parts) == 3 else SYNTHETIC_GRAPH_DEG
    if k < 2:
        raise InputError(f"dataset {name!r}: K (classes) must be at least 2, got {k}")
    if n < 4 * k:
        raise InputError(f"dataset {name!r}: N must be at least 4 K = {4 * k} nodes (train, val and test nodes of "
                         f"every class), got {n}")
    if deg > (n - 1) // 2:
        raise InputError(f"dataset {name!r}: DEG {deg} is too dense for {n} nodes (at most (N-1)/2 = "
                         f"{(n - 1) // 2}: a sparse graph)")
    if n * f > SYNTHETIC_GRAPH_MAX or n * deg > SYNTHETIC_GRAPH_MAX:
        raise InputError(f"dataset {name!r}: {n} nodes x {f} features or x {deg} edges is more than "
                         f"{SYNTHETIC_GRAPH_MAX} elements; ask for a smaller graph")
    return n, f, k, deg


def synthetic_graph_edges(n: int, deg: int) -> int:
    """E of ``synthetic-graph:N,..:DEG``: N*DEG//2 distinct node pairs, each in both directions."""
    return 2 * (n * deg // 2)


def synthetic_graph_split(n: int, k: int) -> tuple[int, int, int]:
    """(train nodes per class, val nodes, test nodes): Planetoid's 20 / 500 / 1000, fewer on a small graph
    (train min(20, N // 4K) per class; of the rest a third, at most 500, validate, the others, at most 1000, test)."""
    t = min(20, n // (4 * k))
    rest = n - t * k
    val = min(PLANETOID_VAL, rest // 3)
    return t, val, min(1000, rest - val)


def synthetic_graph(n: int, f: int, k: int, deg: int = SYNTHETIC_GRAPH_DEG, seed: int = SYNTHETIC_GRAPH_SEED,
                    device: str | torch.device = "cpu", name: str | None = None) -> Graph:
    """A stochastic-block-model graph, generated with torch on ``device`` (vectorised: ~2 s for ogbn-arxiv's size,
    169k nodes and 1.2M node pairs, with 128 features on one CPU core). The same seed and device give the same
    graph; the registry's loader generates on the CPU (the same graph on every machine) and ``GraphSplit.gather``
    moves it to the training device once.

    Labels: K balanced classes in random order. Edges: pairs (u, v) with u uniform and v, with probability
    ``SYNTHETIC_GRAPH_INTRA``, a uniform node of u's class, else a uniform node; self-pairs dropped, each pair
    kept once, exactly N*DEG//2 of them drawn at random from the distinct ones, then both directions. Features:
    class mean + N(0, 1) noise, the K means random directions at distance ``SYNTHETIC_GRAPH_SEPARATION`` from
    each other on average: one node's features tell its class poorly, the mean over its neighbourhood (mostly
    its class, ~DEG nodes) much better. Split: ``synthetic_graph_split``, seeded."""
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(int(seed))
    y = torch.randperm(n, generator=g, device=dev) % k
    # Edges: oversample candidate pairs, keep the distinct ones, pick exactly m of them at random.
    m = n * deg // 2
    by_class = torch.argsort(y, stable=True)  # nodes of class c at by_class[start[c]:start[c] + size[c]]
    size = torch.bincount(y, minlength=k)
    start = torch.cumsum(size, 0) - size
    keys = torch.zeros(0, dtype=torch.long, device=dev)
    draw = m + m // 8 + 64
    while keys.numel() < m:
        u = torch.randint(0, n, (draw,), generator=g, device=dev)
        pos = (torch.rand(draw, generator=g, device=dev) * size[y[u]]).long().clamp_max(size[y[u]] - 1)
        same = by_class[start[y[u]] + pos]
        other = torch.randint(0, n, (draw,), generator=g, device=dev)
        v = torch.where(torch.rand(draw, generator=g, device=dev) < SYNTHETIC_GRAPH_INTRA, same, other)
        keep = u != v
        a, b = torch.minimum(u, v)[keep], torch.maximum(u, v)[keep]
        keys = torch.unique(torch.cat([keys, a * n + b]))
        draw = max(64, 2 * (m - keys.numel()))
    keys = keys[torch.randperm(keys.numel(), generator=g, device=dev)[:m]]
    a, b = keys // n, keys % n
    edge_index = _coalesce(torch.cat([a, b]), torch.cat([b, a]), n)
    # Features: unit-noise Gaussians around K class means at pairwise distance ~SEPARATION.
    means = torch.randn(k, f, generator=g, device=dev) * (SYNTHETIC_GRAPH_SEPARATION / math.sqrt(2 * f))
    x = means[y] + torch.randn(n, f, generator=g, device=dev)
    # Split: t random nodes of each class train; of the others, val then test nodes at random.
    t, val, test = synthetic_graph_split(n, k)
    order = torch.randperm(n, generator=g, device=dev)
    order = order[torch.argsort(y[order], stable=True)]  # random order within each class
    rank = torch.arange(n, device=dev) - start[y[order]]
    train_nodes = order[rank < t]
    rest = order[rank >= t]
    rest = rest[torch.randperm(rest.numel(), generator=g, device=dev)]
    masks = []
    for idx in (train_nodes, rest[:val], rest[val:val + test]):
        mk = torch.zeros(n, dtype=torch.bool, device=dev)
        mk[idx] = True
        masks.append(mk)
    return Graph(x, edge_index, y.long(), *masks, name or f"{SYNTHETIC_GRAPH}:{n},{f},{k}:{deg}", num_classes=k)


def _synthetic_graph_spec(name: str):
    n, f, k, deg = parse_synthetic_graph(name)
    canonical = f"{SYNTHETIC_GRAPH}:{n},{f},{k}:{deg}"
    info = DataInfo(canonical, (n, f), k, 1, 1, graph_edges=synthetic_graph_edges(n, deg))

    def load(root, augment):
        return graph_splits(synthetic_graph(n, f, k, deg, name=canonical))

    return info, load


# ---------------------------------------------------------------------------------------------- registration

GRAPH_DATASETS = ("karate", "planetoid", "cora", "citeseer", "pubmed", "ogbn-arxiv")


def _register() -> None:
    register_dataset(KARATE_INFO, _load_karate)
    # planetoid's nominal shapes are unknown (read from the files; dataset_info without them is an InputError)
    register_dataset(DataInfo("planetoid", (0, 0), 0, 1, 1, graph_edges=0), _planetoid_loader("planetoid", None),
                     needs_dir=f"a folder holding Planetoid's raw files {_PLANETOID_FORM}",
                     size=_planetoid_size(None), info_from_files=_planetoid_info("planetoid", None))
    for key, (n, f, c, e) in PLANETOID_SHAPES.items():
        register_dataset(DataInfo(key, (n, f), c, 1, 1, graph_edges=e), _planetoid_loader(key, key),
                         needs_dir=f"a folder holding Planetoid's raw files {_PLANETOID_FORM.replace('<name>', key)}",
                         size=_planetoid_size(key), info_from_files=_planetoid_info(key, key))
    register_dataset(OGB_ARXIV_INFO, _load_ogb, needs_dir=_OGB_NEEDS, size=_ogb_size, info_from_files=_ogb_info)
    register_prefix(SYNTHETIC_GRAPH, _synthetic_graph_spec, SYNTHETIC_GRAPH_FORM)


_register()

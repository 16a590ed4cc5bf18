"""Dataset registry. Nothing here ever downloads: data either ships with a package (sklearn digits) or is already
on disk under ``--data-dir``. ``dataset_info`` answers shape questions without loading, so models can be profiled
on machines that lack the data.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from cptsim.errors import InputError

__all__ = ["DataInfo", "list_datasets", "dataset_info", "dataset_size", "epoch_size", "load_datasets",
           "check_given_data_dir",
           "resolve_image_size", "native_image_size", "DIGITS_SPLIT_SEED", "register_dataset", "register_prefix"]

DIGITS_SPLIT_SEED = 0

CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
FASHION_MEAN, FASHION_STD = (0.2860,), (0.3530,)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class DataInfo:
    name: str
    input_shape: tuple[int, ...]  # one sample as the model sees it: (C, H, W) image, (T,) text, (N, F) graph
    num_classes: int
    train_size: int | None  # None where unknown without scanning the data (imagefolder before loading)
    test_size: int | None
    # A graph dataset (cptsim.data.graph; one sample = the whole graph): E, the directed edges of its edge_index as
    # the model receives it (bidirected where the dataset says so, no self-loops). None for every other dataset.
    graph_edges: int | None = None


@dataclass(frozen=True)
class _Spec:
    info: DataInfo
    needs_dir: str | None  # what --data-dir must hold, for error messages; None: no directory needed
    loader: Callable[[Path | None, bool], tuple[Dataset, Dataset]]


_DATASETS: dict[str, _Spec] = {}


def list_datasets() -> list[str]:
    """Registered dataset names, the default (digits) first."""
    return list(_DATASETS)


def _spec(name: str) -> _Spec:
    key = name.strip().lower() if isinstance(name, str) else None
    if key is not None and key.split(":")[0] == SYNTHETIC:
        return _synthetic_spec(key)
    if key is not None and key.split(":")[0] in _PREFIXES:
        info, loader = _PREFIXES[key.split(":")[0]][0](key)
        return _Spec(info, None, loader)
    if key not in _DATASETS:
        forms = [SYNTHETIC_FORM] + [form for _, form in _PREFIXES.values()]
        raise InputError(f"unknown dataset {name!r}; choose from: {', '.join(_DATASETS)}, "
                         f"or {' or '.join(forms)}")
    return _DATASETS[key]


# "prefix:spec" families of generated datasets besides synthetic: prefix -> (resolver, the form for messages)
_PREFIXES: dict[str, tuple[Callable[[str], tuple[DataInfo, Callable]], str]] = {}


def register_prefix(prefix: str, resolver: Callable[[str], tuple[DataInfo, Callable]], form: str) -> None:
    """Register a family of generated datasets named ``prefix:...`` (``synthetic-graph:N,F,K[:DEG]`` comes in
    this way; nothing on disk). ``resolver(lower-case name) -> (info, loader)``: its DataInfo (name: the canonical
    spelling) and ``loader(root, augment) -> (train, test)``; an InputError for a malformed name. ``form``: the
    name's pattern, shown in the unknown-dataset message."""
    _PREFIXES[prefix] = (resolver, form)


def _check_dir(name: str, spec: _Spec, data_dir) -> Path:
    if data_dir is None or str(data_dir) == "":
        raise InputError(f"{name} needs --data-dir pointing at {spec.needs_dir}")
    path = Path(data_dir).expanduser()
    if not path.exists():
        raise InputError(f"{name}: data dir {path} does not exist (expected {spec.needs_dir})")
    if not path.is_dir():
        raise InputError(f"{name}: data dir {path} is not a directory (expected {spec.needs_dir})")
    return path


def check_given_data_dir(data_dir) -> None:
    """Raise InputError when a --data-dir was given that is not an existing directory, whatever the dataset: a
    dataset that needs no folder (digits, synthetic) would ignore it, so a mistyped path would go unnoticed and the
    run, plan or estimate be made for data other than the one meant. None or "" (not given) passes."""
    if data_dir is None or str(data_dir) == "":
        return
    path = Path(data_dir).expanduser()
    if not path.exists():
        raise InputError(f"--data-dir {data_dir}: no such directory")
    if not path.is_dir():
        raise InputError(f"--data-dir {data_dir}: not a directory")


def check_data_dir(name: str, data_dir) -> None:
    """Raise InputError when ``name`` reads files and ``data_dir`` is missing or not a directory (no file read)."""
    spec = _spec(name)
    if spec.needs_dir:
        _check_dir(spec.info.name, spec, data_dir)


def needs_data_dir(name: str) -> bool:
    """Whether ``name``'s data (and so its class count and size) is read from a --data-dir (imagefolder, text)."""
    return bool(_spec(name).needs_dir)


def dataset_info(name: str, data_dir=None, image_size: int | None = None) -> DataInfo:
    """Shape, class count and split sizes without loading the data (imagefolder reads its class folders and the
    headers of a sample of its images: ``image_size``, see ``resolve_image_size``)."""
    spec = _spec(name)
    if image_size is not None and spec.info.name != "imagefolder":
        _check_image_size(spec, image_size)
    if spec.info.name in _INFO:  # text datasets: the files say the vocabulary and the size (cptsim.data.text)
        return _INFO[spec.info.name](data_dir)
    if spec.info.name.startswith(SYNTHETIC + ":"):
        return spec.info
    if spec.info.name == "imagefolder":
        root = _check_dir("imagefolder", spec, data_dir)
        classes, _ = _imagefolder_classes(root)
        n = resolve_image_size(name, data_dir, image_size)
        return replace(spec.info, input_shape=(3, n, n), num_classes=len(classes))
    return spec.info


def dataset_size(name: str, data_dir=None) -> int | None:
    """Training samples per epoch as the data at hand holds them, read cheaply (an idx header, a file count; no
    image is decoded): what a plan or a cost estimate should assume, since it is what training will run over.

    A dataset that needs no folder (digits, synthetic) has its fixed size. Otherwise None when there is nothing
    to count: no --data-dir, a missing folder, or files not laid out as the loader expects (the registry's nominal
    size, ``dataset_info(...).train_size``, is then the only guess)."""
    spec = _spec(name)
    if not spec.needs_dir:
        return dataset_info(name).train_size  # the embedded text corpus counts itself
    if data_dir is None or str(data_dir) == "":
        return None
    root = Path(data_dir).expanduser()
    count = _SIZES.get(spec.info.name)
    return count(root) if count is not None and root.is_dir() else None


_SIZES: dict[str, Callable[[Path], int | None]] = {}  # dataset -> its train split's length, from the files
_INFO: dict[str, Callable[[object], DataInfo]] = {}  # dataset -> its DataInfo read from its files (text: cptsim.data.text)


def epoch_size(name: str, data_dir=None, given: int | None = None) -> tuple[int | None, str | None]:
    """(samples per epoch, where the number comes from) for costing a run: the data at hand counted ("data"),
    else ``given`` ("--dataset-size"), else the nominal size ("nominal"; None when unknown). A ``given`` size
    that contradicts the data at hand is an InputError: the estimate would be for a run other than the one
    training would execute."""
    found = dataset_size(name, data_dir)
    if found is not None:
        if given is not None and given != found:
            where = f"in {data_dir}" if _spec(name).needs_dir else f"in the {_spec(name).info.name} dataset"
            raise InputError(f"--dataset-size {given} contradicts the {found} training samples {where}, which "
                             "'cptsim train' would run over; leave --dataset-size out")
        return found, "data"
    if given is not None:
        return given, "--dataset-size"
    n = dataset_info(name, data_dir).train_size
    return n, ("nominal" if n is not None else None)


def load_datasets(name: str, data_dir=None, augment: bool = True,
                  image_size: int | None = None) -> tuple[Dataset, Dataset, DataInfo]:
    """(train, test, info); info's sizes are those of the datasets returned. ``image_size``: imagefolder's input
    side (``resolve_image_size``); any other dataset has its own fixed size and refuses another."""
    spec = _spec(name)
    root = _check_dir(spec.info.name, spec, data_dir) if spec.needs_dir else None
    info = dataset_info(spec.info.name, data_dir, image_size) if spec.needs_dir or spec.info.name in _INFO \
        else dataset_info(name, None, image_size)
    if spec.info.name == "imagefolder":
        train, test = _load_imagefolder(root, augment, info.input_shape[-1])
    else:
        train, test = spec.loader(root, augment)
    return train, test, replace(info, train_size=len(train), test_size=len(test))


def _register(info: DataInfo, needs_dir: str | None):
    def deco(loader):
        register_dataset(info, loader, needs_dir=needs_dir)
        return loader

    return deco


def register_dataset(info: DataInfo, loader: Callable[[Path | None, bool], tuple[Dataset, Dataset]], *,
                     needs_dir: str | None = None, size: Callable[[Path], int | None] | None = None,
                     info_from_files: Callable[[object], DataInfo] | None = None) -> None:
    """Register a dataset family's dataset (the text corpora in ``cptsim.data.text`` come in this way).

    ``loader(root, augment) -> (train, test)``; ``needs_dir``: what --data-dir must hold (None: nothing, the data
    ships with a package); ``size(root)``: the train split's length read from the files, without loading them;
    ``info_from_files(data_dir)``: the DataInfo read from the files when it depends on them (a corpus's vocabulary).
    """
    _DATASETS[info.name] = _Spec(info, needs_dir, loader)
    if size is not None:
        _SIZES[info.name] = size
    if info_from_files is not None:
        _INFO[info.name] = info_from_files


def nominal_info(name: str) -> DataInfo:
    """The DataInfo a dataset was registered with (before any file is read)."""
    return _spec(name).info


# --------------------------------------------------------------------------------------------------------------
# sklearn digits: 1797 8x8 grey images, shipped inside scikit-learn


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The 1797 images (N, 1, 8, 8) in [0, 1] and their labels, read straight from the file scikit-learn ships:
    ``load_digits`` would import all of scikit-learn and SciPy's statistics first (~1.5 s of every run's start)."""
    import gzip
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("sklearn")  # finds the package without running it
    path = None if spec is None or not spec.submodule_search_locations else \
        Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / "digits.csv.gz"
    if path is not None and path.is_file():
        with gzip.open(path, "rt") as f:
            data = np.loadtxt(f, delimiter=",")
        x, y = data[:, :-1], data[:, -1]
    else:  # a scikit-learn that keeps it elsewhere
        from sklearn.datasets import load_digits

        d = load_digits()
        x, y = d.data, d.target
    return (x.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8), y.astype(np.int64)


def digits_split_indices() -> tuple[np.ndarray, np.ndarray]:
    """Row indices of the train and test split, in the order scikit-learn's ``train_test_split(test_size=0.2,
    stratify=y, random_state=DIGITS_SPLIT_SEED)`` returns them (shipped, so that no run imports scikit-learn's
    model selection; tests/test_data.py checks them against it)."""
    import json
    from pathlib import Path

    d = json.loads((Path(__file__).with_name("digits_split.json")).read_text())
    return np.asarray(d["train"], dtype=np.int64), np.asarray(d["test"], dtype=np.int64)


def _digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    x, y = _digits_arrays()
    tr, te = digits_split_indices()
    return x[tr], x[te], y[tr], y[te]


@_register(DataInfo("digits", (1, 8, 8), 10, 1437, 360), needs_dir=None)
def _load_digits(root, augment):
    x_tr, x_te, y_tr, y_te = _digits_split()
    # Statistics from the train split only, so that nothing about the test images leaks into training.
    mean, std = float(x_tr.mean()), float(x_tr.std())
    x_tr, x_te = (x_tr - mean) / std, (x_te - mean) / std
    return (
        TensorDataset(torch.from_numpy(x_tr), torch.from_numpy(y_tr)),
        TensorDataset(torch.from_numpy(x_te), torch.from_numpy(y_te)),
    )


# --------------------------------------------------------------------------------------------------------------
# torchvision datasets in their on-disk formats (download=False always)


def _transforms(mean, std, train_aug: list | None = None):
    from torchvision import transforms as T

    return T.Compose([*(train_aug or []), T.ToTensor(), T.Normalize(mean, std)])


def _cifar_loader(name: str, cls_name: str, folder: str, files: list[str], mean, std):
    def load(root: Path, augment: bool):
        import torchvision
        from torchvision import transforms as T

        if root.name == folder:  # pointed at the batches folder itself; torchvision wants its parent
            root = root.parent
        _expect_files(name, root, folder, files, "the extracted python-version archive")
        aug = [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()] if augment else []
        cls = getattr(torchvision.datasets, cls_name)
        try:
            train = cls(root=str(root), train=True, download=False, transform=_transforms(mean, std, aug))
            test = cls(root=str(root), train=False, download=False, transform=_transforms(mean, std))
        except RuntimeError:
            # torchvision checks every file's md5 against the official archive's: present but wrong means corrupt.
            # (torchvision's own message suggests download=True, which cptsim never does, so it is not passed on.)
            raise InputError(
                f"{name}: files in {root / folder} are corrupt (they fail torchvision's md5 check); expected the "
                f"official {', '.join(files)} from the python-version archive, unmodified"
            ) from None
        except (OSError, EOFError, pickle.UnpicklingError, KeyError, ValueError) as e:
            raise InputError(f"{name}: could not read {root / folder}: {type(e).__name__}: {e}") from None
        return train, test

    return load


def _expect_files(name: str, root: Path, sub: str, files: list[str], what: str) -> None:
    folder = root / sub
    if not folder.is_dir():
        raise InputError(f"{name}: no {sub}/ folder in {root} (expected {what})")
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        raise InputError(f"{name}: {folder} lacks {', '.join(missing)} (expected {what})")


_CIFAR10_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]
_CIFAR100_FILES = ["train", "test", "meta"]

def _cifar_size(folder: str, files: list[str], n: int) -> Callable[[Path], int | None]:
    # torchvision md5-checks every batch file against the official archive's, so a CIFAR set that loads at all
    # is the official one: its size is known once its files are there.
    def size(root: Path) -> int | None:
        if root.name == folder:
            root = root.parent
        return n if all((root / folder / f).is_file() for f in files) else None

    return size


_SIZES["cifar10"] = _cifar_size("cifar-10-batches-py", _CIFAR10_FILES, 50000)
_SIZES["cifar100"] = _cifar_size("cifar-100-python", _CIFAR100_FILES, 50000)
_register(
    DataInfo("cifar10", (3, 32, 32), 10, 50000, 10000),
    needs_dir="the folder that holds cifar-10-batches-py/",
)(_cifar_loader("cifar10", "CIFAR10", "cifar-10-batches-py", _CIFAR10_FILES, CIFAR10_MEAN, CIFAR10_STD))
_register(
    DataInfo("cifar100", (3, 32, 32), 100, 50000, 10000),
    needs_dir="the folder that holds cifar-100-python/",
)(_cifar_loader("cifar100", "CIFAR100", "cifar-100-python", _CIFAR100_FILES, CIFAR100_MEAN, CIFAR100_STD))


_MNIST_FILES = [
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
]


def _mnist_root(root: Path, cls_name: str) -> Path:
    """The folder torchvision wants (the one holding MNIST/), also when pointed at MNIST/ or MNIST/raw itself."""
    if root.name == "raw" and root.parent.name == cls_name:
        return root.parent.parent
    return root.parent if root.name == cls_name else root


def _mnist_size(cls_name: str) -> Callable[[Path], int | None]:
    # torchvision reads raw idx files unchecked, so subsets are common: the count is the images file's header
    # (two zero bytes, a type byte, the number of dimensions, then one big-endian uint32 per dimension).
    def size(root: Path) -> int | None:
        path = _mnist_root(root, cls_name) / cls_name / "raw" / "train-images-idx3-ubyte"
        try:
            with open(path, "rb") as f:
                head = f.read(8)
        except OSError:
            return None
        return int.from_bytes(head[4:8], "big") if len(head) == 8 and head[:2] == b"\0\0" else None

    return size


def _mnist_loader(name: str, cls_name: str, mean, std):
    def load(root: Path, augment: bool):
        import torchvision

        root = _mnist_root(root, cls_name)
        processed = root / cls_name / "processed"
        legacy = (processed / "training.pt").is_file() and (processed / "test.pt").is_file()  # old torchvision cache
        if not legacy:
            _expect_files(name, root, f"{cls_name}/raw", _MNIST_FILES, "the four uncompressed idx files")
        cls = getattr(torchvision.datasets, cls_name)
        try:
            train = cls(root=str(root), train=True, download=False, transform=_transforms(mean, std))
            test = cls(root=str(root), train=False, download=False, transform=_transforms(mean, std))
        except (RuntimeError, AssertionError, TypeError, ValueError, OSError, KeyError) as e:
            # torchvision's idx reader asserts on a bad header; treat anything it raises as a corrupt file.
            detail = f"{type(e).__name__}: {str(e).splitlines()[0]}" if str(e) else type(e).__name__
            raise InputError(
                f"{name}: could not read the idx files in {root / cls_name / 'raw'} (corrupt or not idx format; "
                f"{detail})"
            ) from None
        return train, test

    return load


_SIZES["mnist"] = _mnist_size("MNIST")
_SIZES["fashion-mnist"] = _mnist_size("FashionMNIST")
_register(
    DataInfo("mnist", (1, 28, 28), 10, 60000, 10000), needs_dir="the folder that holds MNIST/raw/"
)(_mnist_loader("mnist", "MNIST", MNIST_MEAN, MNIST_STD))
_register(
    DataInfo("fashion-mnist", (1, 28, 28), 10, 60000, 10000), needs_dir="the folder that holds FashionMNIST/raw/"
)(_mnist_loader("fashion-mnist", "FashionMNIST", FASHION_MEAN, FASHION_STD))


# --------------------------------------------------------------------------------------------------------------
# ImageNet-style folder tree: <dir>/train/<class>/*, <dir>/val/<class>/*

_IMAGEFOLDER_NEEDS = "a folder with train/<class>/ and val/<class>/ subfolders of images"


def _class_dirs(path: Path) -> list[str]:
    # Same rule as torchvision's find_classes: every sub-directory is a class, sorted.
    return sorted(e.name for e in os.scandir(path) if e.is_dir())


def _imagefolder_classes(root: Path) -> tuple[list[str], list[str]]:
    for split in ("train", "val"):
        if not (root / split).is_dir():
            raise InputError(f"imagefolder: {root} has no {split}/ subfolder (expected {_IMAGEFOLDER_NEEDS})")
    train, val = _class_dirs(root / "train"), _class_dirs(root / "val")
    if not train:
        raise InputError(f"imagefolder: {root / 'train'} has no class subfolders (expected train/<class>/images)")
    extra = sorted(set(val) - set(train))
    if extra:
        raise InputError(f"imagefolder: val/ has classes that train/ lacks: {', '.join(extra[:5])}")
    return train, val


def _imagefolder_size(root: Path) -> int | None:
    """Image files under train/<class>/, counted by name as torchvision's ImageFolder finds them (none opened)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    train = root / "train"
    if not train.is_dir():
        return None
    n = 0
    for cls in _class_dirs(train):
        for _, _, files in os.walk(train / cls, followlinks=True):
            n += sum(1 for f in files if f.lower().endswith(IMG_EXTENSIONS))
    return n


_SIZES["imagefolder"] = _imagefolder_size


def _renumber(ds, classes: list[str]) -> None:
    """Give an ImageFolder train/'s label numbering, so a val/ that lacks a class cannot shift the labels."""
    if ds.classes == classes:
        return
    to_idx = {c: i for i, c in enumerate(classes)}
    ds.samples = [(path, to_idx[ds.classes[t]]) for path, t in ds.samples]
    ds.imgs = ds.samples
    ds.targets = [t for _, t in ds.samples]
    ds.classes, ds.class_to_idx = list(classes), to_idx


IMAGEFOLDER_DEFAULT_SIZE = 224  # ImageNet's crop: images of mixed sizes (or none readable) are brought to this
SMALL_IMAGE = 64  # up to this side, CIFAR's augmentation (whole image shifted and flipped); above, ImageNet's
_SIZE_SAMPLE = 256  # image headers read to find the folder's own size (spread over the files, none decoded)
MAX_IMAGE_SIZE = 4096


def _image_files(root: Path) -> list[Path]:
    from torchvision.datasets.folder import IMG_EXTENSIONS

    files = []
    for split in ("train", "val"):
        if not (root / split).is_dir():
            continue
        for cls in _class_dirs(root / split):
            for top, _, names in os.walk(root / split / cls, followlinks=True):
                files += [Path(top) / f for f in sorted(names) if f.lower().endswith(IMG_EXTENSIONS)]
    return files


def native_image_size(root: Path) -> tuple[int, int] | None:
    """(width, height) the folder's images share, read from the headers of up to ``_SIZE_SAMPLE`` of them spread
    over train/ and val/ (PIL reads the size without decoding); None when they differ or none can be read."""
    from PIL import Image

    files = _image_files(Path(root))
    if not files:
        return None
    stride = max(1, len(files) // _SIZE_SAMPLE)
    sizes = set()
    for f in files[::stride][:_SIZE_SAMPLE] + files[-1:]:
        try:
            with Image.open(f) as im:
                sizes.add(tuple(im.size))
        except (OSError, ValueError):
            continue  # not an image after all: the loader says so when it reaches it
        if len(sizes) > 1:
            return None
    return sizes.pop() if sizes else None


def _check_image_size(spec: _Spec, image_size) -> None:
    if isinstance(image_size, bool) or not isinstance(image_size, int) or not 1 <= image_size <= MAX_IMAGE_SIZE:
        raise InputError(f"--image-size must be an integer from 1 to {MAX_IMAGE_SIZE}, got {image_size!r}")
    if spec.info.name != "imagefolder":
        shape = spec.info.input_shape
        if len(shape) != 3 or shape[1:] != (image_size, image_size):
            raise InputError(f"--image-size is for --dataset imagefolder; {spec.info.name} has a fixed input shape "
                             f"{'x'.join(map(str, shape))}")


def resolve_image_size(name: str, data_dir=None, image_size: int | None = None) -> int | None:
    """The side N of the square images the model sees (resize the shorter side to N, then crop N x N).

    imagefolder: ``image_size`` when given, else the images' own size when they all share one (the shorter side
    of a non-square one), else 224 (ImageNet's). Other datasets: None (their shape is fixed); an ``image_size``
    other than theirs is an InputError."""
    spec = _spec(name)
    if image_size is not None:
        _check_image_size(spec, image_size)
    if spec.info.name != "imagefolder":
        return None
    if image_size is not None:
        return image_size
    native = native_image_size(_check_dir("imagefolder", spec, data_dir))
    return min(native) if native else IMAGEFOLDER_DEFAULT_SIZE


def imagefolder_transforms(size: int, augment: bool) -> tuple[list, list]:
    """(train, eval) PIL transforms to N x N. Small images keep CIFAR's recipe: the whole image, shifted by up
    to N/8 with zero padding and flipped. Larger ones ImageNet's, scaled: random resized crops for training;
    resize to 8/7 N and centre-crop N for evaluation (256 -> 224 at N = 224)."""
    from torchvision import transforms as T

    if size <= SMALL_IMAGE:
        fit = [T.Resize(size), T.CenterCrop(size)]
        aug = [T.RandomCrop(size, padding=max(1, size // 8)), T.RandomHorizontalFlip()]
        return (fit + aug if augment else fit), fit
    fit = [T.Resize(round(size * 8 / 7)), T.CenterCrop(size)]
    return ([T.RandomResizedCrop(size), T.RandomHorizontalFlip()] if augment else fit), fit


@_register(DataInfo("imagefolder", (3, IMAGEFOLDER_DEFAULT_SIZE, IMAGEFOLDER_DEFAULT_SIZE), 0, None, None),
           needs_dir=_IMAGEFOLDER_NEEDS)
def _load_imagefolder(root: Path, augment: bool, size: int | None = None):
    from torchvision.datasets import ImageFolder

    classes, _ = _imagefolder_classes(root)
    size = resolve_image_size("imagefolder", root, size)
    aug, fit = imagefolder_transforms(size, augment)
    out = []
    for split, pre in (("train", aug), ("val", fit)):
        try:
            ds = ImageFolder(str(root / split), transform=_transforms(IMAGENET_MEAN, IMAGENET_STD, pre))
        except (FileNotFoundError, ValueError) as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise InputError(f"imagefolder: no usable images in {root / split}: {first}") from None
        _renumber(ds, classes)
        out.append(ds)
    return out[0], out[1]


# --------------------------------------------------------------------------------------------------------------
# synthetic:C,H,W:K[:N] - random images and labels, for throughput and calibration runs where no dataset exists
# (as NVIDIA's own training benchmarks do). Not a dataset to learn anything from: the labels are random.

SYNTHETIC = "synthetic"
SYNTHETIC_FORM = "synthetic:C,H,W:K[:N] (random tensors: C,H,W sample shape, K classes, N training samples)"
SYNTHETIC_DEFAULT_N = 1024
SYNTHETIC_MAX_ELEMENTS = 2**31  # 8 GB of float32 in one split: far past what a throughput run needs
SYNTHETIC_SEED = 20240601       # one fixed seed: the same spec gives the same tensors on every machine


def parse_synthetic(name: str) -> tuple[tuple[int, int, int], int, int]:
    """((C, H, W), K, N) of a ``synthetic:C,H,W:K[:N]`` name; InputError naming the part that is wrong."""
    parts = name.strip().lower().split(":")
    if parts[0] != SYNTHETIC or len(parts) not in (3, 4):
        raise InputError(f"dataset {name!r}: expected {SYNTHETIC_FORM}, e.g. synthetic:3,32,32:10:50000")

    def count(text: str, what: str) -> int:
        if not text.strip().isdigit() or int(text) < 1:
            raise InputError(f"dataset {name!r}: {what} must be a positive integer, got {text!r} "
                             f"(expected {SYNTHETIC_FORM})")
        return int(text)

    dims = parts[1].split(",")
    if len(dims) != 3:
        raise InputError(f"dataset {name!r}: the sample shape must be three sizes C,H,W, got {parts[1]!r}")
    shape = tuple(count(d, w) for d, w in zip(dims, ("C", "H", "W")))
    classes = count(parts[2], "K (classes)")
    n = count(parts[3], "N (samples)") if len(parts) == 4 else SYNTHETIC_DEFAULT_N
    if n * shape[0] * shape[1] * shape[2] > SYNTHETIC_MAX_ELEMENTS:
        raise InputError(f"dataset {name!r}: {n} samples of {shape} are more than {SYNTHETIC_MAX_ELEMENTS} elements; "
                         "ask for fewer samples")
    return shape, classes, n


def synthetic_test_size(n: int) -> int:
    """The test split's size: a tenth of the training samples (at least 1); evaluation of noise need not be long."""
    return max(1, n // 10)


def _synthetic_spec(name: str) -> _Spec:
    shape, classes, n = parse_synthetic(name)
    canonical = f"{SYNTHETIC}:{','.join(map(str, shape))}:{classes}:{n}"
    info = DataInfo(canonical, shape, classes, n, synthetic_test_size(n))

    def load(root, augment):
        return (SyntheticDataset(shape, classes, n, SYNTHETIC_SEED),
                SyntheticDataset(shape, classes, synthetic_test_size(n), SYNTHETIC_SEED + 1))

    return _Spec(info, None, load)


class SyntheticDataset(TensorDataset):
    """Standard-normal images and uniform labels drawn from a seeded generator (the same on every machine).

    It is an ordinary map-style dataset (per-sample indexing, so any DataLoader, Subset or sampler works), and it
    also gathers whole batches on a device (``gather``): the training loop uses that to skip the DataLoader, so a
    step on a GPU reads its batch from GPU memory with no host work and no host-device copy of the images.
    """

    def __init__(self, shape: tuple[int, int, int], classes: int, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn((n, *shape), generator=g)
        y = torch.randint(0, classes, (n,), generator=g)
        super().__init__(x, y)
        self._on: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def gather(self, indices, device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of these sample indices, on ``device`` (the tensors move there once, on the first call).

        No host-device synchronisation: the index list travels through pinned memory with a non-blocking copy.
        """
        dev = torch.device(device)
        key = str(dev)
        if key not in self._on:
            self._on[key] = (self.tensors[0].to(dev), self.tensors[1].to(dev))
        x, y = self._on[key]
        idx = torch.as_tensor(indices, dtype=torch.long)
        if dev.type == "cuda":
            idx = idx.pin_memory().to(dev, non_blocking=True)
        return x.index_select(0, idx), y.index_select(0, idx)

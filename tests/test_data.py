import os
import pickle
import struct
from collections import Counter

import numpy as np
import pytest
import torch

from cptsim.data import DataInfo, dataset_info, dataset_size, epoch_size, list_datasets, load_datasets
from cptsim.errors import InputError

CIFAR10_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def test_list_datasets_names_the_documented_datasets():
    assert list_datasets() == ["digits", "cifar10", "cifar100", "mnist", "fashion-mnist", "imagefolder",
                               "ptb", "wikitext-2", "wikitext-103", "pydoc-chars", "karate", "planetoid", "cora",
                               "citeseer", "pubmed", "ogbn-arxiv"]


@pytest.mark.parametrize("name,shape,classes,train,test", [
    ("digits", (1, 8, 8), 10, 1437, 360),
    ("cifar10", (3, 32, 32), 10, 50000, 10000),
    ("cifar100", (3, 32, 32), 100, 50000, 10000),
    ("mnist", (1, 28, 28), 10, 60000, 10000),
    ("fashion-mnist", (1, 28, 28), 10, 60000, 10000),
])
def test_dataset_info_needs_no_data_on_disk(name, shape, classes, train, test):
    assert dataset_info(name) == DataInfo(name, shape, classes, train, test)


def test_unknown_dataset_lists_the_choices():
    with pytest.raises(InputError, match="unknown dataset 'svhn'; choose from: digits, cifar10"):
        dataset_info("svhn")
    with pytest.raises(InputError, match="choose from"):
        load_datasets("svhn")


# --------------------------------------------------------------------------------------------------------------
# digits


@pytest.fixture(scope="module")
def digits():
    return load_datasets("digits")


def test_digits_split_is_1437_train_360_test(digits):
    train, test, info = digits
    assert (len(train), len(test)) == (1437, 360)
    assert info == DataInfo("digits", (1, 8, 8), 10, 1437, 360)
    x, y = train.tensors
    assert x.shape == (1437, 1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.int64


def test_digits_split_is_stratified(digits):
    train, test, _ = digits
    tr, te = Counter(train.tensors[1].tolist()), Counter(test.tensors[1].tolist())
    assert set(tr) == set(te) == set(range(10))
    for c in range(10):
        # Each class sends 20% of its samples to test, up to rounding of one sample.
        assert abs(te[c] - 0.2 * (tr[c] + te[c])) <= 1


def test_digits_split_is_deterministic(digits):
    train, test, _ = digits
    train2, test2, _ = load_datasets("digits")
    for a, b in zip(train.tensors + test.tensors, train2.tensors + test2.tensors):
        assert torch.equal(a, b)


def test_digits_are_normalized_with_train_split_statistics(digits):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    train, test, _ = digits
    x_tr, x_te = train.tensors[0], test.tensors[0]
    assert x_tr.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert x_tr.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-4)
    # The test split is mapped with the train statistics, not its own: near zero mean, but not exactly.
    assert 1e-4 < abs(x_te.mean().item()) < 0.1
    # Recompute from the raw 0..16 pixels: same split, scaled to [0, 1], standardised by the train split.
    d = load_digits()
    raw_tr, raw_te = train_test_split(d.data / 16.0, test_size=0.2, stratify=d.target, random_state=0)[:2]
    mean, std = raw_tr.mean(), raw_tr.std()
    np.testing.assert_allclose(x_tr.reshape(-1, 64).numpy(), (raw_tr - mean) / std, atol=1e-5)
    np.testing.assert_allclose(x_te.reshape(-1, 64).numpy(), (raw_te - mean) / std, atol=1e-5)


def test_digits_are_sklearns_split_exactly_without_importing_sklearn():
    """The shipped split indices and the file read straight from scikit-learn's package give exactly what
    load_digits + train_test_split give (the split every digits run has trained on), and loading them in a fresh
    process imports no scikit-learn (its ~1.5 s was in every digits run's start)."""
    import subprocess
    import sys

    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from cptsim.data.registry import DIGITS_SPLIT_SEED, _digits_split

    d = load_digits()
    want = train_test_split(d.data.astype(np.float32) / 16.0, d.target, test_size=0.2, stratify=d.target,
                            random_state=DIGITS_SPLIT_SEED)
    got = _digits_split()
    for a, b in zip(got, want):
        assert np.array_equal(a.reshape(len(b), -1), b.reshape(len(b), -1))
    code = ("import sys; from cptsim.data import load_datasets; load_datasets('digits'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr)


def test_digits_ignore_data_dir_and_augment(digits):
    train, _, _ = load_datasets("digits", data_dir="/nonexistent", augment=False)
    assert torch.equal(train.tensors[0], digits[0].tensors[0])


# --------------------------------------------------------------------------------------------------------------
# CIFAR in its real on-disk format


def _write_cifar(root, n_per_file=4, folder="cifar-10-batches-py", files=None, label_key="labels",
                 meta=("batches.meta", "label_names"), classes=10, seed=0):
    # The official files were pickled by Python 2, whose str keys torchvision reads back as str through
    # pickle.load(encoding="latin1"); a Python 3 pickle with str keys is what that read produces, so the
    # fakes use str keys ("data", "labels"), not b"data".
    rng = np.random.default_rng(seed)
    d = root / folder
    d.mkdir(parents=True)
    for name in files or CIFAR10_FILES:
        entry = {
            "data": rng.integers(0, 256, size=(n_per_file, 3072), dtype=np.uint8),
            label_key: [int(v) for v in rng.integers(0, classes, size=n_per_file)],
        }
        with open(d / name, "wb") as f:
            pickle.dump(entry, f)
    with open(d / meta[0], "wb") as f:
        pickle.dump({meta[1]: [f"class{i}" for i in range(classes)]}, f)
    return d


@pytest.fixture
def skip_md5(monkeypatch):
    # torchvision compares every CIFAR file's md5 with the official archive's, so hand-made files are always
    # "corrupted" to it (see test_fake_cifar_files_fail_the_checksum_as_corrupt). To test that loading works
    # we replace only that md5 comparison, keeping the file-exists half of the check.
    import torchvision.datasets.cifar as tv_cifar

    monkeypatch.setattr(tv_cifar, "check_integrity", lambda fpath, md5=None: os.path.isfile(fpath))


def test_cifar10_loads_from_the_on_disk_format(tmp_path, skip_md5):
    _write_cifar(tmp_path)
    train, test, info = load_datasets("cifar10", data_dir=tmp_path)
    assert (len(train), len(test)) == (20, 4)
    assert info == DataInfo("cifar10", (3, 32, 32), 10, 20, 4)
    x, y = train[0]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and isinstance(y, int)
    # Normalized: uniform uint8 noise lands roughly in [-2, 2.2] after the CIFAR mean/std.
    assert -2.1 < x.min().item() < 0 < x.max().item() < 2.3


def test_cifar10_augment_false_is_deterministic_and_test_split_never_augments(tmp_path, skip_md5):
    _write_cifar(tmp_path)
    train, test, _ = load_datasets("cifar10", data_dir=tmp_path, augment=False)
    assert torch.equal(train[0][0], train[0][0])
    assert torch.equal(test[0][0], test[0][0])
    aug_train, _, _ = load_datasets("cifar10", data_dir=tmp_path, augment=True)
    torch.manual_seed(0)
    views = [aug_train[0][0] for _ in range(8)]
    assert any(not torch.equal(views[0], v) for v in views[1:])


def test_cifar10_accepts_the_batches_folder_itself(tmp_path, skip_md5):
    d = _write_cifar(tmp_path)
    train, _, _ = load_datasets("cifar10", data_dir=d)
    assert len(train) == 20


def test_cifar100_loads_fine_labels(tmp_path, skip_md5):
    _write_cifar(tmp_path, folder="cifar-100-python", files=["train", "test"], label_key="fine_labels",
                 meta=("meta", "fine_label_names"), classes=100)
    train, test, info = load_datasets("cifar100", data_dir=tmp_path)
    assert (len(train), len(test), info.num_classes) == (4, 4, 100)


def test_fake_cifar_files_fail_the_checksum_as_corrupt(tmp_path):
    d = _write_cifar(tmp_path)
    with pytest.raises(InputError, match="corrupt") as e:
        load_datasets("cifar10", data_dir=tmp_path)
    assert str(d) in str(e.value) and "\n" not in str(e.value) and "download=True" not in str(e.value)


def test_cifar10_without_data_dir_says_what_to_point_at():
    with pytest.raises(InputError, match="cifar10 needs --data-dir pointing at the folder that holds "
                                         "cifar-10-batches-py/"):
        load_datasets("cifar10")


def test_missing_data_dir_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_datasets("cifar10", data_dir=tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        load_datasets("cifar10", data_dir=tmp_path / "file")


def test_dir_without_cifar_folder_names_the_expected_folder(tmp_path):
    with pytest.raises(InputError, match="no cifar-10-batches-py/ folder"):
        load_datasets("cifar10", data_dir=tmp_path)


def test_cifar_folder_missing_files_names_them(tmp_path):
    d = _write_cifar(tmp_path)
    (d / "data_batch_3").unlink()
    (d / "batches.meta").unlink()
    with pytest.raises(InputError, match="lacks data_batch_3, batches.meta"):
        load_datasets("cifar10", data_dir=tmp_path)


def test_truncated_cifar_file_is_an_input_error(tmp_path, skip_md5):
    d = _write_cifar(tmp_path)
    (d / "data_batch_2").write_bytes(b"\x80\x04garbage")
    with pytest.raises(InputError, match="could not read"):
        load_datasets("cifar10", data_dir=tmp_path)


# --------------------------------------------------------------------------------------------------------------
# MNIST idx files


def _write_idx(path, array):
    # idx format: magic (0, 0, dtype 0x08 = ubyte, ndim), big-endian uint32 dims, raw bytes.
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def _write_mnist(root, cls_name="MNIST", n=6):
    raw = root / cls_name / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split in ("train", "t10k"):
        _write_idx(raw / f"{split}-images-idx3-ubyte", rng.integers(0, 256, size=(n, 28, 28)))
        _write_idx(raw / f"{split}-labels-idx1-ubyte", rng.integers(0, 10, size=(n,)))
    return raw


@pytest.mark.parametrize("name,cls_name", [("mnist", "MNIST"), ("fashion-mnist", "FashionMNIST")])
def test_mnist_family_loads_idx_files(tmp_path, name, cls_name):
    _write_mnist(tmp_path, cls_name)
    train, test, info = load_datasets(name, data_dir=tmp_path)
    assert info == DataInfo(name, (1, 28, 28), 10, 6, 6)
    x, y = train[0]
    assert x.shape == (1, 28, 28) and x.dtype == torch.float32


def test_mnist_missing_and_corrupt_files(tmp_path):
    with pytest.raises(InputError, match="no MNIST/raw/ folder"):
        load_datasets("mnist", data_dir=tmp_path)
    raw = _write_mnist(tmp_path)
    (raw / "t10k-labels-idx1-ubyte").write_bytes(b"\xff\xff\xff\xff")
    with pytest.raises(InputError, match="corrupt"):
        load_datasets("mnist", data_dir=tmp_path)


# --------------------------------------------------------------------------------------------------------------
# ImageNet-style folder


def _write_imagefolder(root, classes=("cat", "dog", "emu"), per_class=2, splits=("train", "val")):
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in splits:
        for c in classes:
            d = root / split / c
            d.mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, size=(40, 48, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(d / f"{i}.png")


def test_imagefolder_loads_train_and_val(tmp_path):
    _write_imagefolder(tmp_path)
    # the images share one 48x40 size: their short side unless --image-size says otherwise (tests/test_image_size.py)
    assert dataset_info("imagefolder", tmp_path) == DataInfo("imagefolder", (3, 40, 40), 3, None, None)
    assert dataset_info("imagefolder", tmp_path, 224) == DataInfo("imagefolder", (3, 224, 224), 3, None, None)
    train, val, info = load_datasets("imagefolder", data_dir=tmp_path, image_size=224)
    assert info == DataInfo("imagefolder", (3, 224, 224), 3, 6, 6)
    x, y = val[5]
    assert x.shape == (3, 224, 224) and y == 2
    assert train[0][0].shape == (3, 224, 224)


def test_imagefolder_val_missing_a_class_keeps_train_label_numbers(tmp_path):
    _write_imagefolder(tmp_path, splits=("train",))
    _write_imagefolder(tmp_path, classes=("dog", "emu"), splits=("val",))
    _, val, info = load_datasets("imagefolder", data_dir=tmp_path, augment=False)
    assert info.num_classes == 3
    assert sorted(set(val.targets)) == [1, 2]  # dog=1, emu=2 as in train, not 0 and 1
    assert val.classes == ["cat", "dog", "emu"]


def test_imagefolder_errors(tmp_path):
    with pytest.raises(InputError, match="imagefolder needs --data-dir"):
        dataset_info("imagefolder")
    with pytest.raises(InputError, match="no train/ subfolder"):
        load_datasets("imagefolder", data_dir=tmp_path)
    (tmp_path / "train").mkdir()
    with pytest.raises(InputError, match="no val/ subfolder"):
        dataset_info("imagefolder", tmp_path)
    (tmp_path / "val").mkdir()
    with pytest.raises(InputError, match="no class subfolders"):
        dataset_info("imagefolder", tmp_path)
    (tmp_path / "train" / "cat").mkdir()
    (tmp_path / "train" / "cat" / "notes.txt").write_text("not an image")
    with pytest.raises(InputError, match="no usable images in .*train"):
        load_datasets("imagefolder", data_dir=tmp_path)
    (tmp_path / "val" / "cow").mkdir()
    with pytest.raises(InputError, match="val/ has classes that train/ lacks: cow"):
        dataset_info("imagefolder", tmp_path)


def test_input_error_messages_are_one_line(tmp_path):
    for call in (lambda: load_datasets("cifar100"), lambda: load_datasets("mnist", tmp_path),
                 lambda: load_datasets("imagefolder", tmp_path), lambda: dataset_info("nope")):
        with pytest.raises(InputError) as e:
            call()
        assert "\n" not in str(e.value)


# --------------------------------------------------------------------------------------------------------------
# dataset_size / epoch_size: the data at hand, counted without loading it


def test_dataset_size_reads_an_mnist_subset_from_its_idx_header(tmp_path):
    raw = _write_mnist(tmp_path, n=37)
    train, _, _ = load_datasets("mnist", data_dir=tmp_path)
    for where in (tmp_path, tmp_path / "MNIST", raw):  # the same folders the loader accepts
        assert dataset_size("mnist", where) == len(train) == 37


def test_dataset_size_is_none_where_there_is_nothing_to_count(tmp_path):
    assert dataset_size("mnist") is None
    assert dataset_size("mnist", tmp_path / "absent") is None
    assert dataset_size("mnist", tmp_path) is None  # no MNIST/raw/ inside
    assert dataset_size("cifar10", tmp_path) is None
    assert dataset_size("digits") == dataset_size("digits", tmp_path) == 1437  # embedded: always at hand


def test_dataset_size_of_cifar_is_the_official_size_once_its_files_are_there(tmp_path):
    # torchvision md5-checks the batch files, so only the official 50,000-image set can load at all.
    _write_cifar(tmp_path)
    assert dataset_size("cifar10", tmp_path) == dataset_size("cifar10", tmp_path / "cifar-10-batches-py") == 50000


def test_dataset_size_of_an_imagefolder_counts_its_train_images(tmp_path):
    _write_imagefolder(tmp_path, per_class=3)
    (tmp_path / "train" / "cat" / "notes.txt").write_text("not an image")
    train, _, _ = load_datasets("imagefolder", data_dir=tmp_path)
    assert dataset_size("imagefolder", tmp_path) == len(train) == 9


def test_epoch_size_prefers_the_data_and_refuses_a_size_that_contradicts_it(tmp_path):
    _write_mnist(tmp_path, n=37)
    assert epoch_size("mnist", tmp_path) == (37, "data")
    assert epoch_size("mnist", tmp_path, 37) == (37, "data")
    assert epoch_size("mnist", None, 500) == (500, "--dataset-size")
    assert epoch_size("mnist") == (60000, "nominal")
    with pytest.raises(InputError, match=r"--dataset-size 500 contradicts the 37 training samples in"):
        epoch_size("mnist", tmp_path, 500)

"""--image-size: an image folder trains at its own resolution, and plan, cost and the run see the same input shape."""

import json

import numpy as np
import pytest

from cptsim.data import dataset_info, load_datasets, native_image_size, resolve_image_size
from cptsim.errors import InputError
from cli_util import one_line_error, run_cli


def _folder(root, size=(32, 32), per_class=4, classes=("a", "b"), odd_one=None):
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in classes:
            d = root / split / c
            d.mkdir(parents=True)
            for i in range(per_class):
                w, h = odd_one if (odd_one and split == "val" and c == classes[-1] and i == per_class - 1) else size
                Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)).save(d / f"{i}.png")
    return root


def test_a_folder_of_32px_images_trains_at_32px_with_cifar_augmentation(tmp_path):
    from torchvision import transforms as T

    _folder(tmp_path)
    assert native_image_size(tmp_path) == (32, 32)
    assert dataset_info("imagefolder", tmp_path).input_shape == (3, 32, 32)
    train, val, info = load_datasets("imagefolder", tmp_path)
    assert info.input_shape == (3, 32, 32) and train[0][0].shape == (3, 32, 32) and val[0][0].shape == (3, 32, 32)
    crops = [t for t in train.transform.transforms if isinstance(t, T.RandomCrop)]
    assert len(crops) == 1 and crops[0].padding == 4  # CIFAR's recipe, scaled: N/8
    assert not any(isinstance(t, T.RandomResizedCrop) for t in train.transform.transforms)


def test_image_size_resizes_and_picks_the_augmentation_by_size(tmp_path):
    from torchvision import transforms as T

    _folder(tmp_path)
    train, val, info = load_datasets("imagefolder", tmp_path, image_size=16)
    assert info.input_shape == (3, 16, 16) and train[0][0].shape == (3, 16, 16) and val[1][0].shape == (3, 16, 16)
    train, val, info = load_datasets("imagefolder", tmp_path, image_size=96)
    assert train[0][0].shape == (3, 96, 96) and val[0][0].shape == (3, 96, 96)
    assert any(isinstance(t, T.RandomResizedCrop) for t in train.transform.transforms)
    resize = next(t for t in val.transform.transforms if isinstance(t, T.Resize))
    assert resize.size in (110, [110])  # 8/7 of the crop, as 256 -> 224


def test_mixed_sizes_fall_back_to_224_and_non_square_shared_sizes_use_the_short_side(tmp_path):
    _folder(tmp_path / "mixed", odd_one=(40, 40))
    assert native_image_size(tmp_path / "mixed") is None
    assert resolve_image_size("imagefolder", tmp_path / "mixed") == 224
    _folder(tmp_path / "wide", size=(48, 40))
    assert dataset_info("imagefolder", tmp_path / "wide").input_shape == (3, 40, 40)


def test_bad_image_size_is_one_line_input_error(tmp_path):
    _folder(tmp_path)
    for bad in (0, -3, 5000, True):
        with pytest.raises(InputError, match="--image-size must be an integer"):
            dataset_info("imagefolder", tmp_path, bad)
    with pytest.raises(InputError, match="--image-size is for --dataset imagefolder; cifar10 has a fixed"):
        dataset_info("cifar10", image_size=64)
    assert dataset_info("cifar10", image_size=32).input_shape == (3, 32, 32)  # its own size is no change
    line = one_line_error(run_cli("train", "--quiet", "--dataset", "digits", "--image-size", "16", "--steps", "1",
                                  "--out", tmp_path / "r"))
    assert "--image-size is for --dataset imagefolder" in line
    assert not (tmp_path / "r").exists()


def test_plan_cost_and_train_see_the_folder_s_own_size(tmp_path):
    data = _folder(tmp_path / "data")
    r = run_cli("cost", "--model", "resnet20", "--dataset", "imagefolder", "--data-dir", data, "--steps", "4",
                "--hw", "bitfusion", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["workload"]["input_shape"] == [3, 32, 32]
    r = run_cli("cost", "--model", "resnet20", "--dataset", "imagefolder", "--data-dir", data, "--image-size", "16",
                "--steps", "4", "--hw", "bitfusion", "--json")
    assert json.loads(r.stdout)["workload"]["input_shape"] == [3, 16, 16]

    plan = tmp_path / "plan.json"
    r = run_cli("plan", "--budget", "90%", "--model", "resnet20", "--dataset", "imagefolder", "--data-dir", data,
                "--steps", "2", "--batch-size", "4", "--schedules", "cos-rep", "--cycles", "1", "--out", plan,
                "--json")
    assert r.exit_code == 0, r.output
    w = json.loads(plan.read_text())["workload"]
    assert w["input_shape"] == [3, 32, 32] and w["image_size"] == 32

    line = one_line_error(run_cli("train", "--plan", plan, "--image-size", "24", "--out", tmp_path / "x"))
    assert "--image-size 24" in line

    r = run_cli("train", "--plan", plan, "--out", tmp_path / "run", "--quiet", "--recal-batches", "0")
    assert r.exit_code == 0, r.output
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["settings"]["image_size"] == 32 and cfg["input_shape"] == [3, 32, 32]
    prof = json.loads((tmp_path / "run" / "profile.json").read_text())
    assert prof["input_shape"] == [3, 32, 32]


def test_config_records_the_resolved_size_and_a_plan_for_other_images_is_refused(tmp_path):
    data = _folder(tmp_path / "data")
    plan = tmp_path / "plan.json"
    r = run_cli("plan", "--budget", "90%", "--model", "digits-cnn", "--dataset", "imagefolder", "--data-dir", data,
                "--steps", "2", "--batch-size", "4", "--schedules", "cos-rep", "--cycles", "1", "--out", plan)
    assert r.exit_code == 0, r.output
    doc = json.loads(plan.read_text())
    doc["workload"].pop("image_size")  # a plan from before --image-size, made for 224 px
    doc["workload"]["input_shape"] = [3, 224, 224]
    plan.write_text(json.dumps(doc))
    line = one_line_error(run_cli("train", "--plan", plan, "--out", tmp_path / "run"))
    assert "made for input 3x224x224" in line and "give 3x32x32" in line

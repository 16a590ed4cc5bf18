"""torchvision:NAME and timm:NAME models (issue 11 item 5): any classifier of those libraries, never downloaded."""

from __future__ import annotations

import json
import sys

import pytest
import torch
import torch.nn as nn
from click.testing import CliRunner

from cptsim.cli.main import cli
from cptsim.errors import InputError
from cptsim.models import create_model, default_fp_layers, model_info


@pytest.fixture(autouse=True)
def no_downloads(monkeypatch):
    """Any attempt to fetch weights fails the test."""
    def refuse(*a, **k):
        raise AssertionError("a weights download was attempted")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", refuse)
    monkeypatch.setattr(torch.hub, "download_url_to_file", refuse)


def _invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.mark.parametrize("name", ["torchvision:resnet18", "torchvision:mobilenet_v3_small", "timm:resnet18",
                                  "timm:resnext50_32x4d"])
def test_builds_a_classifier_with_the_classes_asked_for(name):
    model = create_model(name, num_classes=7, in_channels=3, input_shape=(3, 32, 32))
    model.train()
    out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 7)
    # CPT's ImageNet convention: the stem conv and the classifier stay full precision
    first, last = default_fp_layers(model)
    assert isinstance(model.get_submodule(first), nn.Conv2d)
    assert isinstance(model.get_submodule(last), nn.Linear) and model.get_submodule(last).out_features == 7


@pytest.mark.parametrize("name", ["torchvision:resnet18", "timm:resnet18"])
def test_other_input_channels_replace_the_stem(name):
    model = create_model(name, num_classes=4, in_channels=1, input_shape=(1, 32, 32))
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 4)


def test_vit_takes_its_image_size_from_the_input_shape():
    for name in ("torchvision:vit_b_32", "timm:vit_tiny_patch16_224"):
        model = create_model(name, num_classes=3, in_channels=3, input_shape=(3, 64, 64))
        assert model(torch.randn(1, 3, 64, 64)).shape == (1, 3)


def test_inception_runs_a_plain_training_step():
    model = create_model("torchvision:googlenet", num_classes=5, input_shape=(3, 64, 64))
    model.train()
    assert isinstance(model(torch.randn(2, 3, 64, 64)), torch.Tensor)  # no auxiliary-logits tuple


def test_model_info_without_building():
    info = model_info("timm:resnext50_32x4d")
    assert info["family"] == "timm" and info["name"] == "timm:resnext50_32x4d" and "random init" in info["description"]
    assert model_info("TorchVision:ResNet50")["name"] == "torchvision:resnet50"


@pytest.mark.parametrize("name, close", [("torchvision:resnet51", "torchvision:resnet50"),
                                         ("timm:resnext50_32x4", "timm:resnext50_32x4d"),
                                         ("timm:efficientnet_b9", "timm:efficientnet_b8")])
def test_unknown_names_list_close_matches(name, close):
    with pytest.raises(InputError, match="close matches: .*" + close):
        create_model(name)


def test_a_detection_model_is_not_offered():
    with pytest.raises(InputError, match="not a classification model"):
        create_model("torchvision:fasterrcnn_resnet50_fpn")


def test_empty_name_after_the_colon():
    with pytest.raises(InputError, match="needs a model name"):
        create_model("timm:")


def test_timm_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # import timm -> ImportError
    with pytest.raises(InputError, match=r"pip install 'cptsim\[timm\]'"):
        create_model("timm:resnet18")
    r = _invoke("cost", "--model", "timm:resnet18", "--input-shape", "3,32,32", "--hw", "a100", "--steps", 1)
    assert r.exit_code == 2 and "pip install" in r.output and "Traceback" not in r.output


def test_cli_unknown_name_is_one_line_exit_2():
    r = _invoke("profile", "--model", "torchvision:resnet51", "--input-shape", "3,32,32")
    assert r.exit_code == 2
    assert "torchvision:resnet50" in r.output and len(r.output.strip().splitlines()) == 1


def test_cost_and_profile_take_a_timm_model():
    r = _invoke("cost", "--model", "timm:resnext50_32x4d", "--input-shape", "3,64,64", "--num-classes", 1000,
                "--hw", "a100,bitfusion", "--steps", 10, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["workload"]["model"] == "timm:resnext50_32x4d"
    assert all(p["latency_s"]["total"] > 0 for p in doc["profiles"])
    r = _invoke("profile", "--model", "torchvision:resnet18", "--input-shape", "3,32,32", "--num-classes", 10,
                "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["model"] == "torchvision:resnet18"


@pytest.mark.slow
def test_issue_acceptance_resnext50_at_224_on_a100():
    r = _invoke("cost", "--model", "timm:resnext50_32x4d", "--input-shape", "3,224,224", "--num-classes", 1000,
                "--hw", "a100", "--steps", 10)
    assert r.exit_code == 0, r.output
    assert "a100" in r.output


def test_imagefolder_with_an_input_shape_needs_no_data_dir():
    r = _invoke("cost", "--model", "mlp", "--dataset", "imagefolder", "--input-shape", "3,16,16", "--num-classes", 5,
                "--hw", "a100", "--steps", 3, "--json")
    assert r.exit_code == 0, r.output
    w = json.loads(r.output)["workload"]
    assert w["dataset"] == "imagefolder" and w["num_classes"] == 5
    r = _invoke("profile", "--model", "mlp", "--dataset", "imagefolder", "--input-shape", "3,16,16",
                "--num-classes", 5, "--json")
    assert r.exit_code == 0, r.output


def test_imagefolder_without_data_dir_still_needs_the_class_count():
    r = _invoke("cost", "--model", "mlp", "--dataset", "imagefolder", "--input-shape", "3,16,16", "--hw", "a100",
                "--steps", 3)
    assert r.exit_code == 2 and "--num-classes" in r.output
    r = _invoke("cost", "--model", "mlp", "--dataset", "imagefolder", "--input-shape", "3,16,16", "--num-classes", 5,
                "--hw", "a100", "--epochs", 1)
    assert r.exit_code == 2 and "--dataset-size" in r.output

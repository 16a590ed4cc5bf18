import time

import pytest
import torch
import torch.nn as nn

from cptsim import models
from cptsim.errors import InputError
from cptsim.models import create_model, default_fp_layers, list_models, model_info


NATURAL_INPUT = {
    "cifar": (2, 3, 32, 32),
    "digits": (2, 1, 8, 8),
    "imagenet": (1, 3, 64, 64),  # any size >= 32 works thanks to the adaptive pool; 224 would only be slower
    "any": (2, 1, 8, 8),
}


def _convs(model):
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]


def test_list_models_names_the_documented_models():
    names = list_models()
    for expected in ["resnet20", "resnet38", "resnet56", "resnet74", "resnet110", "resnet152", "resnet164",
                     "mobilenetv2", "digits-cnn", "imagenet-resnet18", "imagenet-resnet34", "imagenet-resnet50",
                     "mlp", "token-mlp"]:
        assert expected in names
    assert len(names) == len(set(names))


def test_list_models_filters_with_a_glob():
    assert list_models("imagenet-*") == ["imagenet-resnet18", "imagenet-resnet34", "imagenet-resnet50"]


@pytest.mark.parametrize("name", list_models())
def test_model_info_has_the_documented_keys(name):
    info = model_info(name)
    assert set(info) == {"name", "family", "input", "description"}
    assert info["name"] == name
    assert info["input"] in {"cifar", "digits", "imagenet", "any", "text", "graph"}
    assert info["description"]


@pytest.mark.parametrize("name", [n for n in list_models()  # LMs: test_lm.py; graph models: test_graph_models.py
                                  if model_info(n)["input"] not in ("text", "graph")])
def test_every_listed_model_maps_its_natural_input_to_logits(name):
    shape = NATURAL_INPUT[model_info(name)["input"]]
    torch.manual_seed(0)
    model = create_model(name, num_classes=7, in_channels=shape[1], input_shape=shape[1:])
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(*shape))
    assert out.shape == (shape[0], 7)
    assert torch.isfinite(out).all()


def test_model_names_are_case_insensitive():
    assert model_info("ResNet20")["name"] == "resnet20"


@pytest.mark.parametrize("n", [1, 3, 9])
def test_cifar_resnet_depth_6n_plus_2_has_6n_plus_1_convs_plus_two_downsample_convs(n):
    model = create_model(f"resnet{6 * n + 2}")
    convs = _convs(model)
    downsample = [name for name, _ in convs if "downsample" in name]
    assert downsample == ["layer2.0.downsample.0", "layer3.0.downsample.0"]
    assert len(convs) - len(downsample) == 6 * n + 1
    # Depth counts the weighted layers on the main path: the convs plus the classifier.
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(convs) - len(downsample) + len(linears) == 6 * n + 2
    for name in downsample:
        conv = dict(model.named_modules())[name]
        assert conv.kernel_size == (1, 1) and conv.stride == (2, 2)


def test_resnet20_shape_is_the_he_et_al_cifar_form():
    model = create_model("resnet20")
    assert model.conv1.out_channels == 16 and model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert [len(s) for s in (model.layer1, model.layer2, model.layer3)] == [3, 3, 3]
    assert [s[0].conv2.out_channels for s in (model.layer1, model.layer2, model.layer3)] == [16, 32, 64]
    assert [s[0].conv1.stride for s in (model.layer1, model.layer2, model.layer3)] == [(1, 1), (2, 2), (2, 2)]
    assert isinstance(model.fc, nn.Linear) and model.fc.in_features == 64
    # The well-known parameter count of ResNet-20 with 1x1-conv shortcuts (0.27M).
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(272_474, rel=0.01)


def test_any_6n_plus_2_depth_builds_even_if_not_listed():
    assert "resnet26" not in list_models()
    assert len(_convs(create_model("resnet26"))) == 6 * 4 + 1 + 2


@pytest.mark.parametrize("name", ["resnet21", "resnet2", "resnet0", "resnet18", "resnet34"])
def test_bad_cifar_resnet_depth_says_which_depths_are_valid(name):
    with pytest.raises(InputError, match=r"6n\+2.*8, 14, 20"):
        create_model(name)


def test_resnet18_error_points_at_the_imagenet_model():
    with pytest.raises(InputError, match="imagenet-resnet18"):
        create_model("resnet18")


def test_unknown_model_lists_the_choices():
    with pytest.raises(InputError, match="unknown model 'vgg16'.*resnet20.*digits-cnn"):
        create_model("vgg16")
    with pytest.raises(InputError):
        model_info("")


@pytest.mark.parametrize("typo, meant", [("digits_cnn", "digits-cnn"), ("mobilenet_v2", "mobilenetv2"),
                                         ("transformer_lm", "transformer-lm"), ("tokenmlp", "token-mlp"),
                                         ("imagenet-resnet19", "imagenet-resnet18"), ("gcnn", "gcn")])
def test_a_mistyped_built_in_model_name_gets_a_did_you_mean_in_one_line_exit_2(typo, meant):
    from cli_util import one_line_error, run_cli

    with pytest.raises(InputError, match=f"unknown model '{typo}'; did you mean [^?]*\\b{meant}\\b"):
        create_model(typo)
    line = one_line_error(run_cli("cost", "--model", typo, "--steps", "10", "--hw", "bitfusion"))
    assert "did you mean" in line and meant in line.split("did you mean")[1].split("?")[0]
    with pytest.raises(InputError, match=r"unknown model 'vgg16' \(all: "):  # nothing close: no guess
        create_model("vgg16")


@pytest.mark.parametrize("kwargs", [{"num_classes": 0}, {"in_channels": 0}, {"num_classes": 2.5}])
def test_bad_class_or_channel_counts_are_input_errors(kwargs):
    with pytest.raises(InputError):
        create_model("digits-cnn", **kwargs)


def test_in_channels_reaches_the_first_conv():
    assert create_model("resnet20", in_channels=1).conv1.in_channels == 1
    assert create_model("mobilenetv2", in_channels=1).conv1.in_channels == 1
    m = create_model("imagenet-resnet18", in_channels=1)
    assert m.conv1.in_channels == 1
    assert m(torch.randn(1, 1, 64, 64)).shape == (1, 10)


def test_convs_use_kaiming_fan_out_init():
    torch.manual_seed(0)
    conv = create_model("resnet20").layer3[1].conv1  # 64 -> 64, 3x3: 36,864 weights
    fan_out = conv.out_channels * 9
    assert conv.weight.std().item() == pytest.approx((2 / fan_out) ** 0.5, rel=0.05)


def test_models_are_deterministic_under_a_seed():
    torch.manual_seed(3)
    a = create_model("resnet20").state_dict()
    torch.manual_seed(3)
    b = create_model("resnet20").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_mobilenetv2_cifar_strides_and_depthwise_convs():
    model = create_model("mobilenetv2")
    assert model.conv1.stride == (1, 1)
    strided = [m for _, m in _convs(model) if m.stride == (2, 2)]
    assert len(strided) == 3  # 32 -> 16 -> 8 -> 4: stem and second stage stay at stride 1 for 32x32 input
    depthwise = [m for _, m in _convs(model) if m.groups > 1]
    assert len(depthwise) == 17  # one per inverted-residual block
    assert all(m.groups == m.in_channels == m.out_channels for m in depthwise)
    feats = {}
    model.conv2.register_forward_hook(lambda mod, inp, out: feats.setdefault("x", out))
    model.eval()(torch.randn(1, 3, 32, 32))
    assert feats["x"].shape == (1, 1280, 4, 4)


def test_models_contain_no_quantization_code():
    # The quantizer swaps plain nn.Conv2d / nn.Linear in place, so models must be built from exactly those.
    for name in ["resnet20", "mobilenetv2", "digits-cnn", "imagenet-resnet18"]:
        model = create_model(name)
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                assert type(m) in (nn.Conv2d, nn.Linear)


@pytest.mark.parametrize("name", ["resnet20", "resnet164", "mobilenetv2", "digits-cnn", "mlp", "token-mlp"])
def test_cifar_convention_keeps_only_the_final_classifier_full_precision(name):
    model = create_model(name, input_shape=(3, 32, 32))
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert default_fp_layers(model) == ["fc"] == linears[-1:]


@pytest.mark.parametrize("name,downsample", [
    ("imagenet-resnet18", ["layer2.0.downsample.0", "layer3.0.downsample.0", "layer4.0.downsample.0"]),
    ("imagenet-resnet34", ["layer2.0.downsample.0", "layer3.0.downsample.0", "layer4.0.downsample.0"]),
    ("imagenet-resnet50", ["layer1.0.downsample.0", "layer2.0.downsample.0", "layer3.0.downsample.0",
                           "layer4.0.downsample.0"]),
])
def test_imagenet_convention_keeps_first_conv_downsample_convs_and_fc_full_precision(name, downsample):
    model = create_model(name, num_classes=5)
    fp = default_fp_layers(model)
    assert fp == ["conv1", *downsample, "fc"]
    modules = dict(model.named_modules())
    assert all(isinstance(modules[n], nn.Conv2d) for n in fp[:-1]) and isinstance(modules["fc"], nn.Linear)


def test_default_fp_layers_falls_back_to_the_last_linear():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)))
    assert default_fp_layers(model) == ["2.1"]
    assert default_fp_layers(nn.Sequential(nn.Conv2d(1, 1, 3))) == []


def test_default_fp_layers_returns_a_copy():
    model = create_model("resnet20")
    default_fp_layers(model).append("conv1")
    assert default_fp_layers(model) == ["fc"]


def test_mlp_needs_an_input_shape():
    with pytest.raises(InputError, match="input_shape"):
        create_model("mlp")
    model = create_model("mlp", num_classes=3, input_shape=(1, 28, 28))
    assert model.fc1.in_features == 784
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 3)


def test_token_mlp_applies_linear_layers_to_the_last_dim_of_nd_input():
    model = create_model("token-mlp", num_classes=4, input_shape=(5, 12))
    seen = []
    model.fc1.register_forward_hook(lambda mod, inp, out: seen.append((tuple(inp[0].shape), tuple(out.shape))))
    assert model(torch.randn(3, 5, 12)).shape == (3, 4)
    assert seen == [((3, 5, 12), (3, 5, 64))]


def test_register_model_adds_a_name_and_refuses_duplicates(monkeypatch):
    monkeypatch.setattr(models, "_REGISTRY", dict(models._REGISTRY))

    @models.register_model("tiny-test", family="test", input="any", description="one linear layer")
    def _tiny(num_classes, in_channels, input_shape=None):
        return nn.Sequential(nn.Flatten(), nn.Linear(4, num_classes))

    assert "tiny-test" in list_models()
    assert default_fp_layers(create_model("tiny-test", num_classes=2)) == ["1"]
    with pytest.raises(ValueError):
        models.register_model("tiny-test", family="test", input="any", description="again")(_tiny)


def test_digits_cnn_is_small_and_learns_digits_quickly():
    from cptsim.data import load_datasets

    train, test, info = load_datasets("digits")
    torch.manual_seed(0)
    model = create_model("digits-cnn", num_classes=info.num_classes, in_channels=info.input_shape[0])
    assert sum(p.numel() for p in model.parameters()) < 100_000
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x_tr, y_tr = train.tensors
    start = time.perf_counter()
    for _ in range(3):
        model.train()
        perm = torch.randperm(len(x_tr))
        for i in range(0, len(x_tr), 64):
            idx = perm[i:i + 64]
            loss = nn.functional.cross_entropy(model(x_tr[idx]), y_tr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    elapsed = time.perf_counter() - start
    model.eval()
    x_te, y_te = test.tensors
    with torch.no_grad():
        acc = (model(x_te).argmax(1) == y_te).float().mean().item()
    print(f"digits-cnn FP32: {acc:.4f} test accuracy, 3 epochs in {elapsed:.2f}s")
    assert acc >= 0.90, f"digits-cnn reached only {acc:.3f} after 3 epochs ({elapsed:.1f}s)"

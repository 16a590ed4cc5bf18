"""Issue 25 item 7: subclasses of Conv2d/Linear (timm's Conv2dSame, a user's own) were silently left in full
precision (quantize_model swapped exact types only). Now every subclass whose forward is the parent's is quantized,
timm's Conv2dSame and Linear too (their forward is declared equivalent), and the layers left unquantized are listed
in the run's config.json with the reason."""

import copy
import io
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cptsim.numerics.layers import (PrecisionState, QConv2d, QLinear, quantize_model, quantized_layer_names,
                                    unquantized_layers)


class PlainSubConv(nn.Conv2d):
    tag = "mine"


class PlainSubLinear(nn.Linear):
    pass


class OwnForwardConv(nn.Conv2d):
    def forward(self, x):
        return super().forward(x) * 2


def _net():
    torch.manual_seed(0)
    return nn.Sequential(PlainSubConv(1, 4, 3, padding=1), nn.ReLU(), OwnForwardConv(4, 4, 3, padding=1),
                         nn.Flatten(), PlainSubLinear(4 * 8 * 8, 16), nn.Linear(16, 10))


def test_a_subclass_with_the_parents_forward_is_quantized_and_keeps_its_own_class():
    net = _net()
    params = [id(p) for p in net.parameters()]
    quantize_model(net, PrecisionState(4, 8))
    assert quantized_layer_names(net) == ["0", "4"]
    assert isinstance(net[0], QConv2d) and isinstance(net[0], PlainSubConv) and net[0].tag == "mine"
    assert isinstance(net[4], QLinear) and isinstance(net[4], PlainSubLinear)
    assert [id(p) for p in net.parameters()] == params
    # the quantized forward is QConv2d's: the same as an exact nn.Conv2d with the same weights, quantized
    plain = nn.Conv2d(1, 4, 3, padding=1)
    plain.load_state_dict({k: v for k, v in net[0].state_dict().items() if k in plain.state_dict()})
    quantize_model(plain, PrecisionState(4, 8), fp_layers=[])
    x = torch.randn(2, 1, 8, 8)
    assert torch.equal(net[0](x), plain(x))


def test_unquantized_layers_says_which_and_why():
    net = _net()
    quantize_model(net)
    rows = {r["name"]: r for r in unquantized_layers(net)}
    assert set(rows) == {"2", "5"}
    assert "overrides Conv2d.forward" in rows["2"]["reason"] and rows["2"]["type"].endswith("OwnForwardConv")
    assert "full precision" in rows["5"]["reason"]  # the model's convention: the last Linear
    mha = nn.MultiheadAttention(8, 2)
    quantize_model(mha, fp_layers=[])
    assert quantized_layer_names(mha) == []  # its out_proj's forward never runs: swapping it would claim bits
    assert "MultiheadAttention" in unquantized_layers(mha)[0]["reason"]


def test_quantized_subclasses_copy_and_pickle():
    net = _net()
    quantize_model(net)
    twin = copy.deepcopy(net)
    assert type(twin[0]) is type(net[0])
    buf = io.BytesIO()
    torch.save(net, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    x = torch.randn(2, 1, 8, 8)
    assert torch.equal(back(x), net(x))


def test_timm_conv2d_same_and_linear_are_quantized():
    layers = pytest.importorskip("timm.layers")
    from timm.layers.padding import pad_same

    torch.manual_seed(0)
    conv = layers.Conv2dSame(3, 4, 3, stride=2)
    lin = layers.Linear(8, 4)
    ref_conv = nn.Conv2d(3, 4, 3, stride=2)
    ref_conv.load_state_dict(conv.state_dict())
    net = nn.ModuleDict({"conv": conv, "lin": lin, "std": layers.StdConv2d(4, 4, 3)})
    quantize_model(net, PrecisionState(4, 8), fp_layers=[])
    assert set(quantized_layer_names(net)) == {"conv", "lin"}
    assert [r["name"] for r in unquantized_layers(net)] == ["std"]  # weight standardisation: its own forward
    quantize_model(ref_conv, PrecisionState(4, 8), fp_layers=[])
    x = torch.randn(2, 3, 9, 9)
    assert torch.equal(net["conv"](x), ref_conv(pad_same(x, [3, 3], [2, 2])))  # TF 'SAME' padding, then the conv


def test_the_runs_config_lists_the_layers_left_unquantized(tmp_path):
    from cli_util import run_cli

    out = tmp_path / "run"
    r = run_cli("train", "--steps", "1", "--quiet", "--recal-batches", "1", "--out", out)
    assert r.exit_code == 0, r.output
    cfg = json.loads((out / "config.json").read_text())
    assert [u["name"] for u in cfg["unquantized_layers"]] == cfg["fp_layers"]  # digits-cnn: its classifier only
    assert all("full precision" in u["reason"] for u in cfg["unquantized_layers"])


def test_a_timm_model_with_same_padding_trains_quantized_and_says_what_is_not(tmp_path):
    pytest.importorskip("timm")
    from cli_util import run_cli

    out = tmp_path / "run"
    r = run_cli("train", "--model", "timm:tf_mobilenetv3_small_minimal_100", "--steps", "1", "--batch-size", "8",
                "--quiet", "--recal-batches", "1", "--out", out)
    assert r.exit_code == 0, r.output
    cfg = json.loads((out / "config.json").read_text())
    assert "blocks.0.0.conv_dw" in cfg["quantized_layers"]  # a Conv2dSame: left in FP32 before
    assert [u["name"] for u in cfg["unquantized_layers"]] == cfg["fp_layers"] == ["conv_stem", "classifier"]

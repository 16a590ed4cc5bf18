"""Every op of a training step, counted at the dispatcher (cptsim.measure.opcount), and profile.json format /2."""

import json

import torch

from cptsim.numerics.layers import quantize_model
from cptsim.models import create_model
from cptsim.measure.opcount import OP_PHASES, OpProfile, count_step_ops
from cptsim.measure.profiler import LayerProfile, profile_model


def _digits(bits=32):
    m = create_model("digits-cnn", 10, 1)
    quantize_model(m)
    if bits < 32:
        for mod in m.modules():
            if hasattr(mod, "precision"):
                mod.precision.bits = bits
                mod.precision.grad_bits = 8
                break
    return m


def test_every_op_of_forward_backward_and_optimizer_is_counted():
    prof = count_step_ops(_digits(), torch.randn(3, 1, 8, 8))
    ops = {(r.op.split(".")[1], r.phase): r for r in prof.records}
    # normalisation, activation, pooling, loss in forward; their backwards; the optimizer's update
    for name in ("native_batch_norm", "relu_", "max_pool2d_with_indices", "_log_softmax", "nll_loss_forward"):
        assert ops[(name, "fwd")].kind == "memory" and ops[(name, "fwd")].launches >= 1
    for name in ("native_batch_norm_backward", "threshold_backward", "nll_loss_backward"):
        assert ops[(name, "bwd")].kind == "memory"
    assert ops[("convolution", "fwd")].kind == "gemm" and ops[("convolution_backward", "bwd")].kind == "gemm"
    assert any(r.phase == "opt" and r.op.startswith("aten._foreach_") for r in prof.records)
    # views launch nothing and move nothing
    v = ops[("view", "fwd")]
    assert v.kind == "view" and v.launches == 0 and v.read_per_sample == v.write_fixed == 0
    # activations scale with the batch, the optimizer's traffic does not
    relu = ops[("relu_", "fwd")]
    assert relu.read_per_sample > 0 and relu.read_fixed == 0
    s = prof.summary()
    assert s["opt"]["bytes_per_sample"] == 0 and s["opt"]["bytes_fixed"] > 0
    assert set(s) == set(OP_PHASES)


def test_split_into_per_sample_and_fixed_bytes_does_not_depend_on_the_batch():
    a = count_step_ops(_digits(), torch.randn(2, 1, 8, 8)).totals()
    b = count_step_ops(_digits(), torch.randn(5, 1, 8, 8)).totals()
    assert a == b


def test_fake_quantized_model_shows_the_quantizers_passes():
    full = count_step_ops(_digits(32), torch.randn(2, 1, 8, 8)).totals()
    quant = count_step_ops(_digits(4), torch.randn(2, 1, 8, 8)).totals()
    assert quant["launches"] > full["launches"] and quant["bytes_per_sample"] > full["bytes_per_sample"]


def test_profile_model_writes_format_2_with_ops_and_reads_format_1():
    model = _digits()
    prof = profile_model(model, (1, 8, 8), model_name="digits-cnn")
    doc = json.loads(json.dumps(prof.to_json()))
    assert doc["format"] == "cptsim.profile/2" and doc["ops"]["records"]
    back = LayerProfile.from_json(doc)
    assert back.ops.to_json() == prof.ops.to_json()
    assert [r.macs for r in back.layers] == [r.macs for r in prof.layers]
    old = {k: v for k, v in doc.items() if k != "ops"}
    old["format"] = "cptsim.profile/1"
    v1 = LayerProfile.from_json(old)
    assert v1.ops is None and [r.macs for r in v1.layers] == [r.macs for r in prof.layers]
    assert isinstance(back.arrays().ops, OpProfile) and v1.arrays().ops is None


# -- issue 23, item 7d: the counted step is the one `cptsim train` runs -----------------------------------------------


def test_the_counted_step_keeps_and_zeroes_gradients_as_train_does_by_hand_count():
    # gradients kept between steps (set_to_none=False): the backward accumulates into each parameter's gradient,
    # one add_ per parameter, and the optimizer zeroes them with _foreach_zero_, one launch per 48 tensors
    model = create_model("resnet20", 10, 3)
    quantize_model(model)
    n_params = sum(1 for p in model.parameters() if p.requires_grad)
    assert n_params == 21 + 21 * 2 + 2   # 21 convs (19 + 2 downsample, no bias), 21 BNs (weight, bias), the Linear
    prof = count_step_ops(model, torch.randn(2, 3, 32, 32))
    rec = {(r.op, r.phase): r for r in prof.records}
    assert rec[("aten.add_.Tensor", "bwd")].launches == n_params
    assert rec[("aten._foreach_zero_.default", "opt")].launches == -(-n_params // 48)
    assert prof.totals()["launches"] == 268   # issue 23: 201 counted with set_to_none=True, 268 trained


def test_train_and_the_op_counter_share_one_optimizer_and_one_zero_grad():
    import ast
    from pathlib import Path

    from cptsim.measure import opcount
    import cptsim.run.train as train

    assert opcount.ZERO_GRAD_SET_TO_NONE is False
    tree = ast.parse(Path(train.__file__).read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    names = [getattr(c.func, "attr", getattr(c.func, "id", "")) for c in calls]
    assert "zero_grad" in names and "training_optimizer" in names
    # nothing in the training loop clears or builds them another way
    assert not any(isinstance(c.func, ast.Attribute) and c.func.attr == "zero_grad" for c in calls)
    assert not any(isinstance(c.func, ast.Attribute) and c.func.attr == "SGD" for c in calls)
    opt = opcount.training_optimizer([torch.nn.Parameter(torch.ones(2))], 0.1, 0.9, 0.0)
    assert opt.defaults["foreach"] is True

"""Training executes number formats (issue 26, item 4): a quantized layer at a float format's width computes its op
on the registry's quantized operands (cptsim.numerics.formats, itself checked bit for bit against ml_dtypes and
torchao in test_formats.py), its error in the gradient format; the integer family is today's path; a short digits
run trains in MX and says so in config.json; bad format input is one line, exit 2. Kept to a few seconds."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cptsim.numerics import formats
from cptsim.numerics.layers import PrecisionState, quantize_model


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 40, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(40 * 4 * 4, 48),
                         nn.ReLU(), nn.Linear(48, 10))


@pytest.mark.parametrize("family,bits,name", [("mx", 4, "mxfp4"), ("mx", 8, "mxfp8"), ("nvfp", 4, "nvfp4"),
                                              ("fp", 8, "fp8e4m3"), ("mx", 5, "mxfp6"), ("fp", 12, "bf16")])
def test_layer_output_is_the_registry_quantize_of_its_operands(family, bits, name):
    torch.manual_seed(1)
    lin = nn.Linear(70, 33)  # 70 in-features: two whole MX blocks and a partial one
    conv = nn.Conv2d(40, 8, 3, padding=1)  # 40 channels: a whole block of 32 and a partial one
    x, xc = torch.randn(5, 70) * 3, torch.randn(2, 40, 5, 5)
    ref_lin = F.linear(formats.quantize(x, name, dim=-1), formats.quantize(lin.weight, name, dim=1), lin.bias)
    ref_conv = F.conv2d(formats.quantize(xc, name, dim=1), formats.quantize(conv.weight, name, dim=1), conv.bias,
                        padding=1)
    net = nn.Sequential(lin, conv)
    p = quantize_model(net, fp_layers=[], number_format=family)
    p.set(bits, 8)
    assert torch.equal(lin(x), ref_lin)
    assert torch.equal(conv(xc), ref_conv)


def test_error_runs_in_the_gradient_format_with_stochastic_rounding():
    torch.manual_seed(2)
    lin = nn.Linear(64, 40)
    p = quantize_model(nn.Sequential(lin), fp_layers=[], number_format="mx", grad_format="fp8e5m2")
    p.set(4, 8)
    x = torch.randn(6, 64, requires_grad=True)
    g = torch.randn(6, 40)
    y = lin(x)
    torch.manual_seed(7)
    y.backward(g)
    torch.manual_seed(7)
    gq = formats.quantize(g, "fp8e5m2", "stochastic", dim=-1)  # the same draws: one rand call per error
    wq, xq = formats.quantize(lin.weight, "mxfp4", dim=1), formats.quantize(x.detach(), "mxfp4", dim=-1)
    assert torch.equal(x.grad, gq @ wq)  # dgrad on the quantized error and weight (straight through Q(x))
    assert torch.equal(lin.weight.grad, gq.t() @ xq)  # wgrad on the quantized error and input


def test_int_family_is_todays_path_bit_for_bit():
    x = torch.randn(8, 3, 4, 4)
    outs = []
    for kw in ({}, {"number_format": "int"}):
        net = _net()
        p = quantize_model(net, **kw)
        assert p.formats is None
        p.set(4, 8)
        torch.manual_seed(3)
        loss = net(x).square().sum()
        loss.backward()
        outs.append((loss.detach(), [q.grad.clone() for q in net.parameters()]))
    assert torch.equal(outs[0][0], outs[1][0])
    assert all(torch.equal(a, b) for a, b in zip(outs[0][1], outs[1][1]))


def test_attention_matmul_runs_the_format():
    from cptsim.numerics.lm_layers import Matmul

    m = nn.Sequential(Matmul())
    p = quantize_model(m, fp_layers=[], number_format="mx")
    p.set(4, 8)
    a, b = torch.randn(2, 3, 40), torch.randn(2, 40, 5)
    ref = formats.quantize(a, "mxfp4", dim=-1) @ formats.quantize(b, "mxfp4", dim=-2)
    assert torch.equal(m[0](a, b), ref)


@pytest.mark.parametrize("kw,msg", [({"number_format": "mxx"}, "unknown number format family"),
                                    ({"grad_format": "fp8e5m2"}, "needs a float --number-format"),
                                    ({"number_format": "mx", "grad_format": "fp9"}, "unknown number format")])
def test_bad_format_input_is_an_input_error(kw, msg):
    from cptsim.errors import InputError

    with pytest.raises(InputError, match=msg):
        quantize_model(_net(), **kw)


def test_digits_mx_run_trains_and_names_its_formats(tmp_path):
    from shared_runs import cptsim_here

    from cptsim.run.config import run_workload, workload_key
    from cptsim.run.rundir import RunDir

    out = tmp_path / "mx"
    r = cptsim_here("train", "--number-format", "mx", "--schedule", "cpt:4-8:g8:n2", "--steps", "20",
                    "--batch-size", "64", "--recal-batches", "2", "--quiet", "--out", out)
    assert r.exit_code == 0, (r.output, r.exception)
    run = RunDir.open(out)
    cfg = run.read_config()
    nf = cfg["number_format"]
    assert nf["family"] == "mx" and nf["grad_format"] is None
    assert nf["formats"]["forward"] == {"4": "mxfp4", "5": "mxfp6", "6": "mxfp6", "7": "mxfp8", "8": "mxfp8"}
    assert nf["formats"]["gradient"] == {"8": "mxfp8"}
    assert cfg["settings"]["number_format"] == "mx"
    trace = run.read_trace().records
    assert trace[0]["bits"] == 4 and trace[0]["formats"] == {"forward": "mxfp4", "gradient": "mxfp8"}
    # BitOPs at element bits: a 5-bit step ran MXFP6, so it counts what a 6-bit step counts
    five, six = (next(t for t in trace if t["bits"] == b) for b in (5, 6))
    assert five["formats"]["forward"] == "mxfp6" and five["bitops"] == six["bitops"] and five["batch_size"] == 64
    losses = [t["loss"] for t in trace]
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.3  # it trains
    # keyed apart from the same run in integers; an integer run's key ignores the new (default) settings
    as_int = {**cfg, "settings": {**cfg["settings"], "number_format": "int"}}
    old = {**cfg, "settings": {k: v for k, v in cfg["settings"].items() if k not in ("number_format", "grad_format")}}
    assert workload_key(run_workload(cfg)) != workload_key(run_workload(as_int)) == workload_key(run_workload(old))
    # report re-counts the run at the same element bits the trace counted: executed == the trace, and == planned
    import json

    r = cptsim_here("report", out, "--hw", "h100", "--json", "--no-save")
    assert r.exit_code == 0, (r.output, r.exception)
    rep = json.loads(r.output)["runs"][0]
    b = rep["bitops"]
    assert b["trace_check"]["agrees"] and b["within_tolerance"], b
    assert rep["number_format"]["family"] == "mx" and rep["hardware"][0]["name"] == "h100"
    r = cptsim_here("report", out, "--hw", "bitfusion", "--no-save")  # integer-only, named: one line, exit 2
    assert r.exit_code == 2 and "integers only" in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_integer_default_run_records_no_formats(digits_uninterrupted):
    cfg = digits_uninterrupted.read_config()
    assert "number_format" not in cfg and cfg["settings"]["number_format"] == "int"
    assert "formats" not in digits_uninterrupted.read_trace().records[0]


@pytest.mark.parametrize("args,needle", [
    (["train", "--number-format", "posit"], "unknown number format family"),
    (["train", "--grad-format", "fp8e5m2"], "needs a float --number-format"),
    (["train", "--number-format", "mx", "--grad-format", "int8"], "must be a float format"),
    (["plan", "--budget", "50%", "--hw", "bitfusion", "--number-format", "mx"], "computes integers only"),
    (["plan", "--budget", "50%", "--number-format", "fp", "--grad-format", "e9m9"], "unknown number format"),
])
def test_bad_format_flags_are_one_line_and_exit_2(tmp_path, args, needle):
    from shared_runs import cptsim_here

    r = cptsim_here(*args, "--out", tmp_path / ("r" if args[0] == "train" else "p.json"))
    assert r.exit_code == 2, (r.output, r.exception)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr


def test_float_format_run_stopped_and_resumed_equals_the_uninterrupted_one(tmp_path):
    """The float path's stochastic rounding draws from the global generator, which checkpoints carry: a run stopped
    (^C) mid-way and resumed is the uninterrupted run bit for bit, as for integers (test_train.py)."""
    from shared_runs import cptsim_here

    from cptsim.run.rundir import RunDir

    args = ["train", "--number-format", "nvfp", "--grad-format", "fp8e5m2", "--schedule", "cpt:3-8:g8:n2",
            "--steps", "10", "--batch-size", "64", "--recal-batches", "1", "--checkpoint-every", "4", "--quiet"]
    assert cptsim_here(*args, "--out", tmp_path / "ref").exit_code == 0
    r = cptsim_here(*args, "--out", tmp_path / "cut", env_extra={"CPTSIM_FAULT_SIGINT_AT_STEP": "5"})
    assert r.exit_code != 0 and "--resume" in r.stderr
    assert cptsim_here("train", "--resume", tmp_path / "cut", "--quiet").exit_code == 0
    a, b = RunDir.open(tmp_path / "ref"), RunDir.open(tmp_path / "cut")

    def strip(rs):
        return [{k: v for k, v in x.items() if k not in ("time_s", "epoch_time_s", "recal_time_s")} for x in rs]

    assert strip(a.read_trace().records) == strip(b.read_trace().records)
    assert strip(a.read_metrics().records) == strip(b.read_metrics().records)
    ca, cb = a.load_checkpoint(), b.load_checkpoint()
    assert all(torch.equal(ca["model"][k], cb["model"][k]) for k in ca["model"])


def test_conv_blocks_run_along_the_reduction_when_channels_are_short_of_a_block():
    """A depthwise conv's weight (C, 1, 3, 3) and a 3-channel first conv block along each output channel's reduction
    (kh, kw, C_in/groups), not along a size-1 / size-3 channel dimension (every element its own scale); their
    short-channel activations along channels-last rows; 32+ channels stay blocked along channels."""
    torch.manual_seed(3)
    dw, rgb = nn.Conv2d(40, 40, 3, padding=1, groups=40), nn.Conv2d(3, 8, 3, padding=1)
    xd, xr = torch.randn(2, 40, 6, 6), torch.randn(2, 3, 6, 6)
    p = quantize_model(nn.Sequential(dw, rgb), fp_layers=[], number_format="mx")
    p.set(4, 8)

    def k_order(w):  # (O, I, kh, kw) -> (O, kh*kw*I), quantized along it, back
        o, i, kh, kw = w.shape
        q = formats.quantize(w.permute(0, 2, 3, 1).reshape(o, -1), "mxfp4", dim=-1)
        return q.reshape(o, kh, kw, i).permute(0, 3, 1, 2)

    def rows(x):  # (N, C, H, W) -> (N, H, W*C) channels-last rows, quantized along them, back
        n, c, h, w = x.shape
        return formats.quantize(x.permute(0, 2, 3, 1).reshape(n, h, -1), "mxfp4").reshape(n, h, w, c).permute(0, 3, 1, 2)

    wq = k_order(dw.weight)
    assert not torch.equal(wq, formats.quantize(dw.weight, "mxfp4", dim=1))  # the old blocking: per element
    assert torch.equal(dw(xd), F.conv2d(formats.quantize(xd, "mxfp4", dim=1), wq, dw.bias, padding=1, groups=40))
    assert torch.equal(rgb(xr), F.conv2d(rows(xr).contiguous(), k_order(rgb.weight).contiguous(), rgb.bias, padding=1))
    # a channel's 9 taps share one power-of-two scale X: every magnitude is an E2M1 value (0.5 .. 6) times X
    blk = wq[0].abs().flatten()
    r = blk / blk[blk > 0].min() * 2
    assert torch.equal(r, r.round())
    # the error of a 3-channel output blocks along channels-last rows too (stochastic rounding: the same draws)
    from cptsim.numerics.layers import _conv_error

    g = torch.randn(2, 3, 6, 6)
    n, c, h, w = g.shape
    torch.manual_seed(9)
    got = _conv_error(g, formats.parse_format("mxfp4"))
    torch.manual_seed(9)
    want = formats.quantize(g.permute(0, 2, 3, 1).reshape(n, h, -1), "mxfp4", "stochastic")
    assert torch.equal(got, want.reshape(n, h, w, c).permute(0, 3, 1, 2))

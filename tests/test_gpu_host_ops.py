"""The host's side of an eager step, read from the lent H100's traces (benchmarks/gpu/bench_gpu_optrace.py --host).

The traces keep each op's kernels and their device time, not its CPU time, so they cannot give a host time per op
kind; what they do say, and what the GPU model's eager price (``GPUProfile.launch_bound``) rests on, is checked here
against counts made directly from the trace files."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "benchmarks" / "results" / "gpu-optrace-H100"


@pytest.fixture(scope="module")
def optrace():
    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    import bench_gpu_optrace

    return bench_gpu_optrace


def _raw(name: str) -> dict:
    return json.load(gzip.open(TRACES / f"trace-{name}.json.gz"))


def test_host_classes_partition_every_traced_op(optrace):
    rows = {r["trace"]: r for r in optrace.host_split(optrace.load_traces())}
    for name in ("lstm-lm-2x650-amp", "hrnet_w18-nhwc", "transformer-lm-6x512-amp"):
        t = _raw(name)
        assert rows[name]["ops"] == pytest.approx(sum(o["calls"] for o in t["ops"]))
        assert sum(rows[name]["calls"].values()) == pytest.approx(rows[name]["ops"])
        convs = sum(o["calls"] for o in t["ops"] if o["op"] in ("aten::cudnn_convolution",
                                                                  "aten::convolution_backward"))
        assert rows[name]["calls"]["conv"] >= convs
    assert optrace.host_class("aten::_foreach_add_") == "foreach"
    assert optrace.host_class("aten::native_layer_norm_backward") == "backward"
    assert optrace.host_class("aten::addmm") == "matmul"


def test_only_the_lstm_steps_are_host_bound(optrace):
    """Of 14 traced steps only the LSTM-LM's leave the GPU idle most of the step: one network, so no host time per op
    kind can be identified from the traces' step times across networks."""
    rows = optrace.host_split(optrace.load_traces())
    bound = {r["trace"] for r in rows if r["host_bound"]}
    assert bound == {"lstm-lm-2x650-amp", "lstm-lm-2x650-fp32"}
    for r in rows:  # hand check of the flag: GPU busy under half the step
        t = _raw(r["trace"])
        assert r["host_bound"] == (t["gpu_busy_ms"] < 0.5 * t["step_ms_median"])


def test_amp_adds_casts_the_op_counter_does_not_see(optrace):
    """AMP's extra dispatched ops over the same FP32 step are its autocast casts (copies), about 380 per LSTM step."""
    rows = {r["trace"]: r for r in optrace.host_split(optrace.load_traces())}
    amp, fp32 = rows["lstm-lm-2x650-amp"], rows["lstm-lm-2x650-fp32"]
    extra = amp["ops"] - fp32["ops"]
    casts = sum(o["calls"] for o in _raw("lstm-lm-2x650-amp")["ops"] if o["op"] in ("aten::copy_", "aten::_to_copy"))
    casts -= sum(o["calls"] for o in _raw("lstm-lm-2x650-fp32")["ops"] if o["op"] in ("aten::copy_", "aten::_to_copy"))
    assert casts == amp["calls"]["cast"] - fp32["calls"]["cast"]
    assert extra > 300 and casts >= 0.95 * extra


def test_the_next_traces_keep_each_dispatched_op_and_autograd_node_with_its_host_time():
    """gpu_optrace.host_ops, on a CPU profile of a known step: every Linear forward, the backward's autograd nodes and
    the optimizer's call are there once per step, with CPU times that hold their children."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    import gpu_optrace

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(32, 8)

    def step():
        opt.zero_grad(set_to_none=False)
        m(x).square().mean().backward()
        opt.step()

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            step()
    rows = {r["name"]: r for r in gpu_optrace.host_ops(prof.events(), 2)}
    assert rows["aten::linear"]["calls"] == 2 and rows["aten::linear"]["kind"] == "top"  # two Linear layers a step
    nodes = [r for r in rows.values() if r["kind"] == "autograd"]
    assert any("AddmmBackward" in r["name"] for r in nodes)
    for r in rows.values():
        assert r["cpu_us"] >= r["self_cpu_us"] >= 0

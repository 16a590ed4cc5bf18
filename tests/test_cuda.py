"""The CUDA training path: no host-device synchronisation inside a step except its one read, fused quantizers that
agree with the eager ones, unbiased stochastic rounding on the GPU.

What a CPU can check runs everywhere (the step reads no tensor value from the layers, the fused formulas equal the
eager ones, a failed compile falls back); the rest is marked ``cuda`` and skips without a GPU
(``pytest -m cuda`` on a GPU machine; benchmarks/gpu/gpu_check.sh runs it).
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cptsim.numerics import quant

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class _ScalarReads(TorchDispatchMode):
    """Counts reads of a tensor's value by the host (.item(), int(), float(), bool(): aten._local_scalar_dense),
    each of which is a host-device synchronisation when the tensor lives on a GPU."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.n += 1
        return func(*args, **(kwargs or {}))


def test_quantized_layers_read_no_tensor_value_in_training_or_eval():
    from cptsim.models import create_model
    from cptsim.numerics.layers import quantize_model

    model = create_model("resnet20", num_classes=10, in_channels=3, input_shape=(3, 32, 32))
    quantize_model(model).set(4, 8)
    x = torch.randn(4, 3, 32, 32)
    with _ScalarReads() as reads:
        for _ in range(2):  # the first batch sets the ranges, the second averages into them
            model(x).sum().backward()
        model.eval()
        with torch.no_grad():
            model(x)
    assert reads.n == 0


def test_training_steps_read_no_tensor_value_and_totals_once(tmp_path, monkeypatch):
    """Two runs that differ only in length make the same number of scalar reads (evaluation, checkpoint): the steps
    themselves make none, and read loss, accuracy and counts through one Dist.step_totals call each."""
    from cptsim.run import dist
    from cptsim.run.train import TrainConfig, train

    calls = []
    original = dist.Dist.step_totals
    monkeypatch.setattr(dist.Dist, "step_totals", lambda self, *a: calls.append(1) or original(self, *a))
    reads = []
    for steps in (3, 7):
        cfg = TrainConfig(model="digits-cnn", dataset="synthetic:1,8,8:10:512", schedule="cpt:3-8:g8:n2", steps=steps,
                          batch_size=32)
        with _ScalarReads() as r:
            train(cfg, str(tmp_path / f"run{steps}"), progress=False)
        reads.append(r.n)
    assert reads[0] == reads[1]
    assert len(calls) == 10


def test_fused_formulas_equal_the_eager_quantizers_on_cpu():
    torch.manual_seed(0)
    x = torch.randn(64, 33) * 3
    lo, hi = x.min(), x.max()
    for bits in (2, 4, 8):
        qmax = (1 << bits) - 1
        step = float((hi - lo) / qmax)
        assert torch.allclose(quant._fq_fused(x, lo, hi, qmax), quant.fake_quant(x, lo, hi, bits), atol=1e-5 * step)
        w = torch.randn(8, 3, 3, 3)
        assert torch.allclose(quant._fq_channel_fused(w, qmax), quant.fake_quant_per_channel(w, bits), atol=1e-6)


def test_fused_stochastic_rounding_is_unbiased_on_cpu():
    torch.manual_seed(1)
    vals = torch.tensor([0.0, 1.0, 0.3, 0.77, 0.51, 0.05])  # the range [0, 1] is fixed by the first two
    x = vals.repeat(20000)
    q = quant._sr_fused(x, 3).view(-1, len(vals)).mean(0)
    step = 1 / 7
    assert torch.allclose(q, vals, atol=0.02 * step)


def test_a_quantizer_that_fails_to_compile_falls_back_to_eager_and_says_why():
    def broken(*args):
        raise RuntimeError("no triton here")

    f = quant._Fused("test", broken)
    f._compiled = broken
    with pytest.warns(RuntimeWarning, match="no triton here"):
        assert f(torch.zeros(3), 7) is None  # the caller then runs the eager quantizer
    assert f.failed and not f.usable(torch.zeros(3))


def test_quantizers_on_cpu_never_take_the_fused_path():
    x = torch.randn(100)
    assert not quant._FQ.usable(x)
    assert torch.equal(quant.quantize_activation(x, x.min(), x.max(), 4), quant.fake_quant(x, x.min(), x.max(), 4))


# ----------------------------------------------------------------------------------------------------------------------
# on a GPU


@pytest.mark.cuda
@cuda
def test_fused_cuda_quantizers_agree_with_eager():
    torch.manual_seed(0)
    x = torch.randn(128, 16, 32, 32, device="cuda")
    lo, hi = torch.aminmax(x)
    for bits in (3, 4, 8):
        got = quant.quantize_activation(x, lo, hi, bits)
        want = quant.fake_quant(x, lo, hi, bits)
        step = float((hi - lo) / ((1 << bits) - 1))
        # the compiled kernel rounds its arithmetic differently (reciprocal, fused multiply-add): equal to float
        # rounding, except values within that rounding of a tie, which may land one step apart
        diff = (got - want).abs()
        assert diff.max().item() <= step * 1.001
        # (on an H200, 0.2% of the elements differed by 1-2 float32 ulps, up to 2.4e-7 on values up to ~4.5)
        assert (diff > 1e-6 * float(hi - lo)).float().mean().item() < 1e-3
        w = torch.randn(64, 16, 3, 3, device="cuda")
        assert torch.allclose(quant.quantize_weight(w, bits), quant.fake_quant_per_channel(w, bits), atol=1e-5)
    status = quant.fused_status()
    assert status["fake_quant"] is None and status["fake_quant_per_channel"] is None, status


@pytest.mark.cuda
@cuda
def test_stochastic_rounding_on_cuda_is_unbiased():
    torch.manual_seed(0)
    vals = torch.tensor([0.0, 1.0, 0.3, 0.77, 0.51, 0.05, 0.999, 0.5], device="cuda")
    x = vals.repeat(200000)
    for bits in (2, 4):
        q = quant.quantize_error(x, bits).view(-1, len(vals)).mean(0)
        step = 1 / ((1 << bits) - 1)
        # 200000 draws: the standard error of each mean is below step / 900
        assert torch.allclose(q, vals, atol=0.01 * step), (bits, q.tolist())
        levels = torch.unique(quant.quantize_error(x, bits))
        assert len(levels) <= (1 << bits)
    assert quant.fused_status()["fake_quant_stochastic"] is None


@pytest.mark.cuda
@cuda
def test_synthetic_batches_gather_on_the_gpu_without_synchronising():
    from cptsim.data import SyntheticDataset

    ds = SyntheticDataset((3, 8, 8), 10, 64, seed=0)
    ds.gather([0], "cuda")  # first call moves the tensors (a copy, allowed)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        x, y = ds.gather(list(range(10, 42)), "cuda")
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert x.is_cuda and torch.equal(x.cpu(), ds.tensors[0][10:42]) and torch.equal(y.cpu(), ds.tensors[1][10:42])


@pytest.mark.cuda
@cuda
def test_cuda_training_step_synchronises_once(tmp_path, monkeypatch):
    """CPTSIM_SYNC_DEBUG=error: torch raises at any synchronisation inside a step but the read of its totals, which
    the trace counts (host_syncs) on every step past warm-up. CPT 3-8 in three cycles of 8 steps: each (bits, grad
    bits) key runs eagerly in the first cycle, is captured as a CUDA graph in the second, replayed in the third."""
    from cptsim.run.train import TrainConfig, train

    monkeypatch.setenv("CPTSIM_SYNC_DEBUG", "error")
    cfg = TrainConfig(model="resnet20", dataset="synthetic:3,32,32:10:1600", schedule="cpt:3-8:g8:n3", steps=24,
                      batch_size=64, device="cuda")
    run = train(cfg, str(tmp_path / "run"), progress=False)
    trace = run.read_trace().records
    assert len(trace) == 24
    steady = [r for r in trace if not r.get("warmup")]
    assert len(steady) >= 6, [r.get("warmup") for r in trace]
    assert [r.get("host_syncs") for r in steady] == [1] * len(steady)
    assert all(r["loss"] == r["loss"] for r in trace)  # finite


@pytest.mark.cuda
@cuda
def test_cuda_graph_steps_train_as_the_eager_ones_do(tmp_path, monkeypatch):
    """The same run with and without CUDA graphs: the same losses (up to the GPU's non-deterministic reductions),
    the same MAC counts, and the graphed one replays most of its steps."""
    from cptsim.run.train import TrainConfig, train

    traces = {}
    for graphs in ("0", "1"):
        monkeypatch.setenv("CPTSIM_CUDA_GRAPHS", graphs)
        cfg = TrainConfig(model="resnet20", dataset="synthetic:3,32,32:10:1280", schedule="static:4:g8", steps=10,
                          batch_size=128, device="cuda", lr_schedule="constant")
        traces[graphs] = train(cfg, str(tmp_path / f"run{graphs}"), progress=False).read_trace().records
    eager, graphed = traces["0"], traces["1"]
    assert sum(not r.get("warmup") for r in graphed) >= 7
    for a, b in zip(eager, graphed):
        assert a["macs"] == b["macs"] and a["bitops"] == b["bitops"]
        assert abs(a["loss"] - b["loss"]) <= 0.02 * abs(a["loss"]), (a["step"], a["loss"], b["loss"])


@pytest.mark.cuda
@cuda
def test_cuda_trace_has_measured_energy_when_nvml_is_there(tmp_path):
    pytest.importorskip("pynvml")
    from cptsim.measure.energy import EnergyMeter
    from cptsim.run.train import TrainConfig, train

    if EnergyMeter.for_device("cuda") is None:
        pytest.skip("this GPU has no NVML energy counter")
    cfg = TrainConfig(model="digits-cnn", dataset="synthetic:1,8,8:10:256", schedule="cpt:3-8:g8:n2", steps=6,
                      batch_size=64, device="cuda")
    trace = train(cfg, str(tmp_path / "run"), progress=False).read_trace().records
    assert all("energy_j" in r and r["energy_j"] >= 0 and r["power_w"] >= 0 for r in trace)

"""The training loop's named steps (cptsim.run.train._Training): the per-step costs memoized per width equal the
cost formula, a loss read one step late (what a GPU run does) records exactly what a read at once does, the trace
file held open writes the same lines, quantizer fallbacks reach config.json, and the GPU benchmark runs on a CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cptsim.run import train as T
from cptsim.run.rundir import RunDir

ROOT = Path(__file__).resolve().parents[1]


def _strip(records, keys=("time_s", "epoch_time_s", "recal_time_s")):
    return [{k: v for k, v in r.items() if k not in keys} for r in records]


def _cfg(**kw):
    base = dict(model="digits-cnn", dataset="synthetic:1,8,8:10:256", schedule="cpt:3-8:g8:n2", steps=14,
                batch_size=32, recal_batches=1, checkpoint_every=5)
    return T.TrainConfig(**{**base, **kw})


def _counted_step(model_name="digits-cnn", batch=6, shape=(1, 8, 8)):
    """The MAC counter's arrays of one real training step of a quantized model."""
    from cptsim.measure.profiler import MacCounter
    from cptsim.models import create_model, default_fp_layers
    from cptsim.numerics.layers import quantize_model

    torch.manual_seed(0)
    m = create_model(model_name, num_classes=10, in_channels=shape[0], input_shape=shape)
    quantize_model(m, fp_layers=default_fp_layers(m)).set(8, 8)
    counter = MacCounter(m, model_name)
    m(torch.randn(batch, *shape)).sum().backward()
    arrays = counter.step_arrays()
    counter.close()
    return arrays


def test_memoized_step_costs_equal_the_formula_at_every_step_of_a_cpt_schedule():
    from cptsim.cost.model import step_cost
    from cptsim.cost.schedules import parse_schedule
    from cptsim.measure.profiler import PHASES
    from cptsim.numerics.families import format_map

    sched = parse_schedule("cpt:3-8:g6-8:n8")
    n = 400
    bits, gbits = sched.bits(n).tolist(), sched.grad_bits(n).tolist()
    full, ragged = _counted_step(batch=6), _counted_step(batch=5)  # a run's batches, and its short last one
    for fmap in (None, format_map("fp", None)):
        costs = T.StepCosts(fmap)
        for t in range(n):
            arrays = ragged if t == n - 1 else full
            q, g = bits[t], gbits[t]
            if fmap is None:
                want = step_cost(arrays, q, g, batch=1)
            else:  # what the loop always counted for a float family: the formats' element bits
                want = step_cost(arrays, int(fmap.fwd_element_bits[q]), int(fmap.grad_element_bits[g]), batch=1)
            assert costs.counts(arrays, q, g) == [want[k][p] for k in ("macs", "bitops") for p in PHASES], t
        distinct = {(bits[t], gbits[t]) for t in range(n - 1)} | {("ragged", bits[-1], gbits[-1])}
        assert len(costs.memo) == len(distinct)  # the formula ran once per (shapes, width), not per step
    # per-layer widths (a per-layer plan): a list of bits, keyed by its values
    costs = T.StepCosts()
    per_layer = [3 + i % 5 for i in range(len(full.names))]
    want = step_cost(full, per_layer, 8, batch=1)
    assert costs.counts(full, per_layer, 8) == [want[k][p] for k in ("macs", "bitops") for p in PHASES]
    assert costs.counts(full, list(per_layer), 8) is costs.counts(full, per_layer, 8)


@pytest.fixture(scope="module")
def read_at_once(tmp_path_factory):
    out = tmp_path_factory.mktemp("sync") / "run"
    return T.train(_cfg(), str(out), progress=False)


def test_a_loss_read_one_step_late_records_what_a_read_at_once_does(read_at_once, tmp_path, monkeypatch):
    """The GPU path's bookkeeping (record step k while step k+1 runs, drain before checkpoints and evaluations) run on
    a CPU: trace, metrics and every checkpoint equal the synchronous run's, times aside."""
    monkeypatch.setattr(T, "lagged_reads", lambda device, d: True)
    lagged = T.train(_cfg(), str(tmp_path / "run"), progress=False)
    a, b = read_at_once, lagged
    assert _strip(b.read_trace().records) == _strip(a.read_trace().records)
    assert [r["step"] for r in b.read_trace().records] == list(range(14))
    assert _strip(b.read_metrics().records) == _strip(a.read_metrics().records)
    ea = [e["step"] for e in a.read_checkpoint_manifest()]
    assert ea == [e["step"] for e in b.read_checkpoint_manifest()] == [10, 14]
    for step in ea:
        ca = torch.load(a.path / f"checkpoint-{step:08d}.pt", weights_only=True)
        cb = torch.load(b.path / f"checkpoint-{step:08d}.pt", weights_only=True)
        assert ca["epoch_stats"] == cb["epoch_stats"]
        assert all(torch.equal(ca["model"][k], cb["model"][k]) for k in ca["model"])
        assert torch.equal(ca["rng"]["torch"][0], cb["rng"]["torch"][0])
        assert ca["optimizer"]["state"].keys() == cb["optimizer"]["state"].keys()
        sa, sb = ca["optimizer"]["state"], cb["optimizer"]["state"]
        assert all(torch.equal(sa[k]["momentum_buffer"], sb[k]["momentum_buffer"]) for k in sa)


def test_a_non_finite_loss_read_late_stops_at_its_own_step(tmp_path, monkeypatch):
    from cptsim.errors import RunFailed

    monkeypatch.setattr(T, "lagged_reads", lambda device, d: True)
    monkeypatch.setenv("CPTSIM_FAULT_NAN_AT_STEP", "7")
    with pytest.raises(RunFailed, match="at step 7 "):
        T.train(_cfg(), str(tmp_path / "run"), progress=False)
    run = RunDir(tmp_path / "run")
    assert [r["step"] for r in run.read_trace().records] == list(range(7))
    assert [e["step"] for e in run.read_checkpoint_manifest()] == [5]  # the step-10 checkpoint never came


@pytest.mark.parametrize("nan_at, applied, saved", [
    (6, "the updates of steps 6 and 7 had", "the checkpoint on disk (step 5) is intact"),  # step 7 was in flight
    (7, "the update of step 7 had", "the checkpoint on disk (step 5) is intact"),  # the epoch's last: drained
    (3, "the updates of steps 3 and 4 had", "no checkpoint was written yet"),
])
def test_a_non_finite_loss_read_late_says_what_memory_and_disk_hold(tmp_path, monkeypatch, nan_at, applied, saved):
    """Read late, a NaN loss arrives after its step's update (and the next step's, if one was launched) ran: the
    message must not say nothing was applied. Its count of non-finite parameters is checked against the model's
    own parameters after the failure; one frozen tensor (no update reaches it) keeps the count below the total."""
    import re

    from cptsim.errors import RunFailed

    monkeypatch.setattr(T, "lagged_reads", lambda device, d: True)
    monkeypatch.setenv("CPTSIM_FAULT_NAN_AT_STEP", str(nan_at))
    built = {}
    build = T.build

    def keep(cfg):
        w = built["w"] = build(cfg)
        w.model.fc.bias.requires_grad_(False)
        return w

    monkeypatch.setattr(T, "build", keep)
    with pytest.raises(RunFailed) as e:
        T.train(_cfg(), str(tmp_path / "run"), progress=False)
    msg = str(e.value)
    assert "nothing of that step was applied" not in msg
    assert applied in msg and saved in msg and f"--resume {tmp_path / 'run'}" in msg
    params = list(built["w"].model.named_parameters())
    bad = [n for n, p in params if not torch.isfinite(p).all()]
    assert 0 < len(bad) < len(params) and "fc.bias" not in bad
    m = re.search(r"(\d+) of (\d+) parameter tensors hold non-finite values", msg)
    assert m and (int(m.group(1)), int(m.group(2))) == (len(bad), len(params))
    run = RunDir(tmp_path / "run")
    assert [r["step"] for r in run.read_trace().records] == list(range(nan_at))  # nothing of it recorded
    if nan_at > 5:  # the checkpoint on disk holds the finite weights of step 5
        ck = run.load_checkpoint()
        assert ck["step"] == 5 and all(torch.isfinite(v).all() for v in ck["model"].values() if v.is_floating_point())


def test_a_trace_held_open_writes_the_same_lines_and_a_truncation_reopens_it(tmp_path):
    lines = [{"step": i, "epoch": 0, "batch_size": 4, "bits": 3 + i, "grad_bits": 8, "loss": 0.5 / (i + 1)}
             for i in range(5)]
    plain, held = RunDir(tmp_path / "a"), RunDir(tmp_path / "b")
    for r in (plain, held):
        r.path.mkdir()
    held.keep_trace_open()
    for rec in lines:
        plain.append_trace(rec)
        held.append_trace(rec)
    assert (held.path / "trace.jsonl").read_bytes() == (plain.path / "trace.jsonl").read_bytes()
    held.truncate_after(3)  # replaces the file: the next line goes to the new one
    held.append_trace(lines[3])
    held.close_trace()
    assert [r["step"] for r in held.read_trace().records] == [0, 1, 2, 3]


def test_update_config_sets_one_key_and_keeps_the_rest(tmp_path):
    cfg = {"settings": {"model": "m", "dataset": "d"}, "schedule": {"text": "static:8"}, "total_steps": 3,
           "steps_per_epoch": 3, "eval_bits": 8, "host": {"threads": 1}}
    run = RunDir.create(tmp_path / "run", cfg)
    run.update_config("host.quantizer_fallbacks", {"conv1": "compile: recompile limit"})
    run.update_config("extra.deep.key", [1])
    got = run.read_config()
    assert got["host"] == {"threads": 1, "quantizer_fallbacks": {"conv1": "compile: recompile limit"}}
    assert got["extra"] == {"deep": {"key": [1]}}
    assert list(got) == ["format", *cfg, "extra"]
    assert not list(run.path.glob(".*.tmp"))


def test_quantizer_fallbacks_are_named_once_and_recorded_in_config(tmp_path, monkeypatch, capsys):
    from cptsim.numerics import quant

    monkeypatch.setattr(quant, "fallbacks", lambda: {"features.0": "triton: no such kernel"}, raising=False)
    monkeypatch.setattr(quant, "clear_fallbacks", lambda: None, raising=False)
    run = T.train(_cfg(steps=3, checkpoint_every=None), str(tmp_path / "run"), progress=False)
    assert run.read_config()["host"]["quantizer_fallbacks"] == {"features.0": "triton: no such kernel"}
    warned = [line for line in capsys.readouterr().err.splitlines() if "slower quantizer path" in line]
    assert len(warned) == 1 and "features.0" in warned[0]


def test_no_fallbacks_no_key_and_a_cpu_trace_has_no_path(read_at_once):
    cfg = read_at_once.read_config()
    assert "quantizer_fallbacks" not in cfg["host"]
    assert all("path" not in r for r in read_at_once.read_trace().records)


def test_step_path_names_the_routes_the_layers_took(monkeypatch):
    from cptsim.numerics.exact_gemm import FAKE

    class Layer(torch.nn.Module):
        precision, act_count = None, None

    a, b, c = Layer(), Layer(), Layer()
    a.__dict__["gemm_path"] = {"forward": "int8-tc"}
    b.__dict__["gemm_path"] = {"forward": "int8-tc"}
    doc = {"layers": {"c": {"forward": "tf32-int-codes", "widths": {"9-11": {"forward": "fp16-acc32"}}}}}
    layers = [("a", a), ("b", b), ("c", c)]
    assert T.step_path(layers, doc, 32) == "fp32"
    assert T.step_path(layers, doc, 8) == "int8-tc+tf32-int-codes"
    assert T.step_path(layers, doc, 10) == "int8-tc+fp16-acc32"
    assert T.step_path(layers, doc, 14) == f"int8-tc+{FAKE}"


def test_the_optimizer_is_fused_on_cuda_and_the_same_update(monkeypatch):
    assert T.optimizer_impl("cuda:0") == "fused" and T.optimizer_impl("cpu") == "foreach"
    torch.manual_seed(0)
    for name in ("sgd", "adamw"):
        ps = [torch.randn(17, 9), torch.randn(9)]
        runs = {}
        for impl in ("foreach", "fused"):
            params = [p.clone().requires_grad_() for p in ps]
            opt = T.make_optimizer(params, _cfg(optimizer=name, lr=0.05), impl)
            assert bool(opt.defaults.get("fused")) is (impl == "fused")
            g = torch.Generator().manual_seed(1)
            for _ in range(10):
                for p in params:
                    p.grad = torch.randn(p.shape, generator=g)
                opt.step()
            runs[impl] = params
        for a, b in zip(runs["foreach"], runs["fused"]):  # one update rule, rounded in another order
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_gpu_benchmark_runs_on_a_cpu(tmp_path):
    env = dict(os.environ, CPTSIM_HOME=str(tmp_path), PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu_train.py"), "--device", "cpu",
                        "--models", "resnet20", "--rounds", "1", "--batch-size", "2", "--steps-per-round", "1",
                        "--cases", "amp,fp32,fq-eager", "--threads", "1", "--train-steps", "3", "--train-models", "resnet20",
                        "--json"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    row = doc["models"][0]
    assert row["model"] == "resnet20" and row["batch_size"] == 2
    assert "amp" not in row["cases"] and row["skipped"]["amp"]  # no AMP case on a CPU, and it says why
    assert row["cases"]["fp32"]["ms"] > 0 and row["cases"]["fq-eager"]["ms"] > 0
    tr = doc["train"]
    assert tr["steps"] == 3 and tr["median_step_ms"] > 0 and tr["graph_replay_ms"] is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_lagged_loop_trains_as_the_synchronous_one_and_records_its_route(tmp_path, monkeypatch):
    """The same CUDA run read one step late (the default in one process) and read at once: the same counts, losses
    equal up to the GPU's non-deterministic reductions, every line with its GEMM route and a GPU-clock time, and
    the optimizer fused."""
    cfg = dict(model="resnet20", dataset="synthetic:3,32,32:10:1280", schedule="cpt:4-8:g8:n2", steps=12,
               batch_size=128, device="cuda", lr_schedule="constant", recal_batches=1)
    lagged = T.train(T.TrainConfig(**cfg), str(tmp_path / "lagged"), progress=False).read_trace().records
    monkeypatch.setattr(T, "lagged_reads", lambda device, d: False)
    at_once = T.train(T.TrainConfig(**cfg), str(tmp_path / "sync"), progress=False).read_trace().records
    assert [r["step"] for r in lagged] == list(range(12))
    for a, b in zip(at_once, lagged):
        assert a["macs"] == b["macs"] and a["bitops"] == b["bitops"] and a["path"] == b["path"]
        assert abs(a["loss"] - b["loss"]) <= 0.02 * abs(a["loss"]), (a["step"], a["loss"], b["loss"])
        assert b["time_s"] > 0 and isinstance(b["path"], str) and b["path"]

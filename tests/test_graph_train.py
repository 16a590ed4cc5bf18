"""Issue 24 item 4 and its acceptance: graph models train end to end -- full batch (one step per epoch, the whole
graph the one sample), the loss and accuracies per labelled node of each split's mask, cpt_gnn's recipe (Adam, a
cosine floor) as the graph default, a quantized aggregation on request, resumes exact with Adam's state, executed
BitOPs equal to what `cptsim cost` estimates, and one-line errors (exit 2) for the pairings that cannot work."""

import json
import math

import pytest
import torch

from cli_util import one_line_error, run_cli

pytest.importorskip("torch_geometric")

SMALL_GCN = "gcn:layers=2,hidden=16,dropout=0"


def _trace(run):
    return [json.loads(line) for line in (run / "trace.jsonl").read_text().splitlines()]


def _metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# ---- the recipe ------------------------------------------------------------------------------------------------


def test_the_cosine_floor_is_torchs_eta_min():
    """lr_factor with a floor is CosineAnnealingLR's closed form (eta_min + (lr - eta_min)(1 + cos(pi t/T))/2)."""
    from cptsim.run.train import lr_factor

    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=50, eta_min=1e-4)
    for t in range(50):
        assert math.isclose(1e-3 * lr_factor("cosine", t, 50, 0.1), opt.param_groups[0]["lr"], rel_tol=1e-9)
        opt.step()
        sched.step()


def test_a_graph_gets_cpt_gnns_recipe_and_an_image_keeps_cpts():
    from cptsim.run.config import TrainConfig

    g = TrainConfig(model="gcn")
    assert (g.dataset, g.batch_size, g.epochs, g.optimizer, g.lr, g.lr_min) == ("karate", 1, 200, "adam", 1e-3,
                                                                                 pytest.approx(1e-4))
    c = TrainConfig()
    assert (c.dataset, c.batch_size, c.epochs, c.optimizer, c.lr, c.lr_min) == ("digits", 64, 15, "sgd", 0.1, 0.0)
    assert TrainConfig(model="gcn", lr=0.01).lr_min == pytest.approx(1e-3)  # the floor follows the peak typed


def test_the_clis_help_defaults_are_the_recipes():
    from cli.common import DEFAULT_BATCH_SIZE, DEFAULT_EPOCHS
    from cptsim.run.config import recipe

    r = recipe("digits")
    assert (r["batch_size"], r["epochs"]) == (DEFAULT_BATCH_SIZE, DEFAULT_EPOCHS)


def test_default_sgd_workloads_keep_their_keys():
    """The new recipe settings are keyed only away from SGD's defaults: an image workload's key is what it was."""
    from cptsim.run.config import workload_key, workload_settings

    base = {"model": "digits-cnn", "dataset": "digits", "batch_size": 64, "steps": 100, "lr": 0.1}
    assert workload_settings(base | {"optimizer": "sgd", "lr_min": 0.0, "quant_agg": False}) \
        == workload_settings(base)
    assert workload_key(base | {"optimizer": "adam"}) != workload_key(base)
    assert workload_key(base | {"quant_agg": True}) != workload_key(base)


# ---- training ----------------------------------------------------------------------------------------------------


def test_train_gcn_with_no_other_flag_trains_on_karate(tmp_path):
    out = tmp_path / "run"
    r = run_cli("train", "--model", "gcn", "--quiet", "--json", "--out", out)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["settings"]["dataset"] == "karate" and cfg["steps_per_epoch"] == 1
    assert cfg["total_steps"] == 200 and cfg["settings"]["optimizer"] == "adam"
    trace = _trace(out)
    assert len(trace) == 200 and all(line["batch_size"] == 1 for line in trace)
    assert summary["final_test_acc"] is not None
    # karate's two factions are what its four classes mostly follow: far above a guess (1/4)
    assert summary["final_test_acc"] > 0.5, summary


def _gcn_run(tmp_path, name, *extra):
    out = tmp_path / name
    r = run_cli("train", "--model", SMALL_GCN, "--dataset", "synthetic-graph:300,16,3:6", "--epochs", "6",
                "--recal-batches", "1", "--quiet", "--out", out, *extra)
    assert r.exit_code == 0, r.output
    return out


def test_loss_and_accuracy_are_per_labelled_node(tmp_path):
    """Loss and accuracy are means over a split's mask's nodes (not over all nodes, not per graph): the test
    metrics re-computed from the run's last checkpoint and the data, independently of the loop."""
    from cptsim.data import load_datasets
    from cptsim.models import create_model, default_fp_layers
    from cptsim.models.graph import bind_graph
    from cptsim.numerics.layers import quantize_model

    out = _gcn_run(tmp_path, "run", "--schedule", "static:8:g8", "--lr-schedule", "constant")
    train_set, test_set, info = load_datasets("synthetic-graph:300,16,3:6", None)
    g = train_set.graph
    assert train_set.labelled == int(g.train_mask.sum()) < info.input_shape[0]
    m = _metrics(out)[-1]
    # accuracy per test node: the metrics agree with a count over the test mask from the run's own checkpoint
    from cptsim.run.rundir import RunDir

    ckpt = RunDir.open(out).load_checkpoint()
    net = create_model(SMALL_GCN, num_classes=info.num_classes, in_channels=info.input_shape[0],
                       input_shape=tuple(info.input_shape))
    bind_graph(net, g.edge_index)
    precision = quantize_model(net, fp_layers=default_fp_layers(net))
    net.load_state_dict(ckpt["model"])
    net.eval()
    precision.set(8, 8)
    with torch.no_grad():
        logits = net(g.x[None])[0].T  # [N, C]
    pred = logits.argmax(1)
    mask = g.test_mask
    assert m["test_acc"] == pytest.approx((pred[mask] == g.y[mask]).sum().item() / int(mask.sum()), abs=1e-12)
    loss = torch.nn.functional.cross_entropy(logits[mask].double(), g.y[mask]).item()
    assert m["test_loss"] == pytest.approx(loss, rel=1e-5)


def test_resume_with_adam_is_exact(tmp_path):
    """Adam's moments are in the checkpoint: a run killed as its 5th epoch begins and resumed equals one that ran
    through -- the loss of every step and the final weights, bit for bit."""
    import os
    import signal
    import subprocess
    import sys

    from cptsim.run.rundir import RunDir

    whole = _gcn_run(tmp_path, "whole")
    part = tmp_path / "part"
    args = [sys.executable, "-m", "cptsim.cli.main", "train", "--model", SMALL_GCN, "--dataset",
            "synthetic-graph:300,16,3:6", "--epochs", "6", "--recal-batches", "1", "--quiet"]
    r = subprocess.run([*args, "--out", str(part)], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, CPTSIM_FAULT_KILL_AT_STEP="4"))
    assert r.returncode == -signal.SIGKILL, r.stderr
    r = run_cli("train", "--resume", part, "--quiet")
    assert r.exit_code == 0, r.output
    a, b = _trace(whole), _trace(part)
    assert [x["step"] for x in b] == list(range(6))
    assert [(x["loss"], x["bits"], x["lr"]) for x in a] == [(x["loss"], x["bits"], x["lr"]) for x in b]
    wa, wb = RunDir.open(whole).load_checkpoint(), RunDir.open(part).load_checkpoint()
    assert all(torch.equal(wa["model"][k], wb["model"][k]) for k in wa["model"])
    assert wa["optimizer"]["state"] and all(  # Adam's moments, the same
        torch.equal(wa["optimizer"]["state"][i]["exp_avg_sq"], wb["optimizer"]["state"][i]["exp_avg_sq"])
        for i in wa["optimizer"]["state"])


def test_quant_agg_runs_and_counts_the_aggregation_at_the_steps_bits(tmp_path):
    """--quant-agg: the aggregation entries are quantized in the run's profile, and the executed BitOPs of a step
    at q bits are exactly those of the cost model with the aggregation at (q, g) rather than 32 bits."""
    plain = _gcn_run(tmp_path, "plain", "--schedule", "static:4:g8")
    quant = _gcn_run(tmp_path, "quant", "--schedule", "static:4:g8", "--quant-agg")
    prof = json.loads((quant / "profile.json").read_text())
    aggs = [layer for layer in prof["layers"] if layer["type"] == "Aggregation"]
    assert aggs and all(layer["quantized"] for layer in aggs)
    assert _trace(quant)[0]["macs"] == _trace(plain)[0]["macs"]  # the same work ...
    assert _trace(quant)[0]["bitops"]["fwd"] < _trace(plain)[0]["bitops"]["fwd"]  # ... at fewer bits


def test_planetoid_run_executes_the_bitops_cost_estimates(tmp_path):
    from cptsim.data.graph import synthetic_graph, write_planetoid

    g = synthetic_graph(200, 12, 3, 6, seed=3)  # its nodes as a Planetoid file set: 30 labelled, the last 60 test
    data = write_planetoid(tmp_path / "planetoid", "tiny", g.x, g.y, g.edge_index, num_train=30,
                           test_index=torch.arange(140, 200))
    out = tmp_path / "run"
    sched = "cpt:3-8:g8:n2"
    r = run_cli("train", "--model", SMALL_GCN, "--dataset", "planetoid", "--data-dir", data, "--epochs", "8",
                "--schedule", sched, "--recal-batches", "1", "--quiet", "--out", out)
    assert r.exit_code == 0, r.output
    executed = sum(sum(line["bitops"].values()) for line in _trace(out))
    r = run_cli("cost", "--model", SMALL_GCN, "--dataset", "planetoid", "--data-dir", data, "--epochs", "8",
                "--schedule", sched, "--hw", "bitfusion", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["profiles"][0]["bitops"]["total"] == executed


# ---- bad input ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, needle", [
    (("--model", "gcn", "--dataset", "digits"), "graph"),
    (("--model", "digits-cnn", "--dataset", "karate"), "graph"),
    (("--model", "gcn", "--dataset", "pydoc-chars"), "graph"),
    (("--model", "digits-cnn", "--quant-agg", "--steps", "1"), "aggregation"),
    (("--model", "gcn", "--batch-size", "8"), "full-batch"),
    (("--model", "gcn", "--optimizer", "rmsprop"), "optimizer"),
    (("--model", "gcn", "--lr", "0.01", "--lr-min", "0.1"), "--lr-min"),
])
def test_bad_graph_input_is_one_line_and_exit_2(tmp_path, args, needle):
    r = run_cli("train", *args, "--quiet", "--out", tmp_path / "run")
    line = one_line_error(r)
    assert needle in line, line
    assert not (tmp_path / "run").exists()


def test_range_test_on_a_graph_runs_stages_of_full_batch_steps_per_labelled_node():
    """A graph's epoch is one step: the range test's default stage is GRAPH_STAGE_STEPS full-batch steps, and its
    training accuracy counts the training mask's nodes only (karate: 4 of 34, so accuracies are quarters)."""
    from cptsim.study.rangetest import GRAPH_STAGE_STEPS, RangeTestSettings, run_range_test

    r = run_range_test(RangeTestSettings(model=SMALL_GCN, batch_size=1, q_start=6, q_max=8))
    assert [row.steps for row in r.rows] == [GRAPH_STAGE_STEPS] * 3
    assert all(row.samples == GRAPH_STAGE_STEPS * 4 for row in r.rows)
    assert all(row.train_acc * 80 == int(row.train_acc * 80) for row in r.rows)


def test_a_users_own_pyg_model_in_their_own_loop_is_recorded_with_its_aggregation(tmp_path):
    """The own-loop API on a plain PyG model (GCNConv x 2, called as model(x, edge_index)): quantized by
    cptsim.quantize_model, recorded by RunRecorder, its aggregation counted (nnz = E + N self-loops, x width) in the
    trace's MACs and the profile, and `cptsim report` reads the run."""
    from torch_geometric.nn import GCNConv

    import cptsim
    from cptsim.data import load_datasets

    class Mine(torch.nn.Module):
        def __init__(self, f, c):
            super().__init__()
            self.a, self.b = GCNConv(f, 8), GCNConv(8, c)

        def forward(self, x, edge_index):
            return self.b(self.a(x, edge_index).relu(), edge_index)

    train_set, _, info = load_datasets("karate", None)
    g = train_set.graph
    n, f = info.input_shape
    torch.manual_seed(0)
    model = Mine(f, info.num_classes)
    precision = cptsim.quantize_model(model)
    sched = cptsim.PrecisionScheduler(precision, "cpt:3-8:g8:n2", total_steps=4)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    rec = cptsim.RunRecorder(tmp_path / "mine", model, sched, config={"dataset": "karate", "batch_size": 1},
                             optimizer=opt)
    for _ in range(4):
        sched.step()
        out = model(g.x, g.edge_index)
        loss = torch.nn.functional.cross_entropy(out[g.train_mask], g.y[g.train_mask])
        opt.zero_grad()
        loss.backward()
        opt.step()
        rec.step(loss=loss.item(), batch_size=1)
    rec.epoch(test_acc=0.5)
    rec.close()
    prof = json.loads((tmp_path / "mine" / "profile.json").read_text())
    aggs = {layer["name"]: layer for layer in prof["layers"] if layer["type"] == "Aggregation"}
    nnz = info.graph_edges + n
    assert aggs["a.aggregate"]["macs"]["fwd"] == nnz * 8 and aggs["b.aggregate"]["macs"]["fwd"] == nnz * 4
    dense = n * (f * 8 + 8 * info.num_classes)
    assert _trace(tmp_path / "mine")[0]["macs"]["fwd"] == dense + nnz * (8 + 4)
    r = run_cli("report", tmp_path / "mine", "--hw", "bitfusion", "--json")
    assert r.exit_code == 0, r.output


def test_a_planetoid_directory_missing_a_file_and_arxiv_without_its_splits_are_one_line_and_exit_2(tmp_path):
    from cptsim.data.graph import synthetic_graph, write_planetoid

    g = synthetic_graph(60, 4, 2, 4, seed=1)
    data = write_planetoid(tmp_path / "p", "tiny", g.x, g.y, g.edge_index, num_train=10,
                           test_index=torch.arange(40, 60))
    (data / "ind.tiny.ty").unlink()
    line = one_line_error(run_cli("train", "--model", SMALL_GCN, "--dataset", "planetoid", "--data-dir", data,
                                  "--quiet", "--out", tmp_path / "run"))
    assert "ind.tiny.ty" in line, line
    (tmp_path / "arxiv" / "raw").mkdir(parents=True)
    line = one_line_error(run_cli("train", "--model", SMALL_GCN, "--dataset", "ogbn-arxiv", "--data-dir",
                                  tmp_path / "arxiv", "--quiet", "--out", tmp_path / "run"))
    assert "split/time/train.csv.gz" in line, line
    assert not (tmp_path / "run").exists()


def test_a_graph_on_several_processes_is_refused_before_any_worker_starts(tmp_path, monkeypatch):
    """The launcher refuses it (one line, exit 2) before any worker starts or the run directory is made."""
    import sys

    from cptsim.run import dist

    args = ["train", "--model", SMALL_GCN, "--nproc", "2", "--quiet", "--out", str(tmp_path / "r")]
    monkeypatch.setattr(sys, "argv", ["cptsim", *args])  # --nproc re-runs the command line it was given
    monkeypatch.setattr(dist, "launch", lambda *a, **k: pytest.fail("a worker was launched"))
    line = one_line_error(run_cli(*args))
    assert "full-batch" in line and "--nproc" in line, line
    assert not (tmp_path / "r").exists()

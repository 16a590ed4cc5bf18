"""`cptsim sensitivity` and `cptsim plan --per-layer` (issue 27): Hutchinson against an exact Hessian trace, the
one-layer loss increase against a hand-made run, the results database, and a per-layer plan that trains as costed."""

import json

import pytest
import torch

from cli_util import one_line_error, run_cli

from cptsim.study.sensitivity import hutchinson_trace


def test_hutchinson_trace_matches_the_exact_trace_of_a_small_linear_model():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2, bias=False)
    x, y = torch.randn(16, 3), torch.randint(0, 2, (16,))
    batches = [(x, y)]
    # exact: the Hessian of the mean cross entropy w.r.t. the 6 weights, by autograd
    w0 = lin.weight.detach().clone()

    def f(w):
        return torch.nn.functional.cross_entropy(x @ w.reshape(2, 3).T, y)

    exact = float(torch.autograd.functional.hessian(f, w0.reshape(-1)).trace())
    est = hutchinson_trace(lin, {"lin": lin}, batches, samples=4000, seed=1)["lin"]
    assert est == pytest.approx(exact, rel=0.05)


def test_sensitivity_cli_measures_both_methods_and_stores_them(tmp_path):
    db = tmp_path / "r.db"
    r = run_cli("sensitivity", "--warmup", "5", "--samples", "2", "--batches", "1", "--db", db, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [x["name"] for x in doc["layers"]] == ["features.0", "features.3", "features.7"]
    for m in ("hessian", "loss"):
        assert doc["methods"][m]["time_s"] >= 0
        assert sum(doc["methods"][m]["weights"].values()) == pytest.approx(1.0)
    from cptsim.study.results import ResultsDB, sensitivity_weights

    assert sensitivity_weights(ResultsDB(db), "digits-cnn", "loss") == pytest.approx(doc["methods"]["loss"]["weights"])
    assert "q-min" in one_line_error(run_cli("sensitivity", "--q-min", "17"))


def test_the_loss_method_is_the_loss_of_a_run_with_that_layer_alone_at_q_min():
    from cptsim.numerics.layers import PrecisionState
    from cptsim.study.sensitivity import loss_increase, _loss
    from cptsim.models import create_model
    from cptsim.numerics.layers import quantize_model

    torch.manual_seed(0)
    net = create_model("digits-cnn", num_classes=10, in_channels=1, input_shape=(1, 8, 8))
    st = quantize_model(net)
    x, y = torch.randn(32, 1, 8, 8), torch.randint(0, 10, (32,))
    st.set(8, 8)
    net.train()
    net(x)  # one batch: the activation ranges evaluation uses
    net.eval()
    layers = {n: m for n, m in net.named_modules() if n in ("features.0", "features.3", "features.7")}
    ref, inc = loss_increase(net, st, layers, [(x, y)], 2, 8, 8)
    # by hand: a fresh state at 2 bits on features.3 only
    low = PrecisionState()
    low.set(2, 8)
    layers["features.3"].precision = low
    with torch.no_grad():
        hand = float(_loss(net, [(x, y)])) - ref
    layers["features.3"].precision = st
    assert inc["features.3"] == pytest.approx(hand, abs=1e-7) and inc["features.3"] > 0


def test_plan_per_layer_writes_rules_that_train_runs_and_costs_as_planned(tmp_path):
    plan = tmp_path / "p.json"
    r = run_cli("plan", "--budget", "60%", "--steps", "24", "--batch-size", "128", "--per-layer", "--out", plan,
                "--quiet", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(plan.read_text())
    pl = doc["per_layer"]
    assert pl["solver"]["status"] == "optimal" and pl["solver"]["mip_gap"] == 0 if pl["chosen"] else pl["why"]
    if not pl["chosen"]:
        pytest.skip("no per-layer plan beat the uniform one here")
    assert pl["score"] > pl["uniform_score"] and doc["estimate"]["budget_fraction"] <= 1
    run = tmp_path / "run"
    r = run_cli("train", "--plan", plan, "--out", run, "--quiet")
    assert r.exit_code == 0, r.output
    trace = [json.loads(x) for x in (run / "trace.jsonl").read_text().splitlines()]
    assert sum(sum(t["bitops"].values()) for t in trace) == doc["estimate"]["bitops"]["total"]
    assert json.loads((run / "config.json").read_text())["layers"]["layers"] == doc["layers"]["layers"]
    assert "--sensitivity" in one_line_error(run_cli("plan", "--budget", "60%", "--per-layer", "--sensitivity", "nofile",
                                            "--out", tmp_path / "q.json"))


def test_a_sensitivity_is_looked_up_in_its_own_number_format_family(tmp_path):
    """An integer plan never takes a float-format measurement (a layer's sensitivity at MXFP4 is not its sensitivity
    at int4), nor the other way round; a table written before the family column existed reads as integer rows and
    gains the column on the next write."""
    import sqlite3

    from cptsim.study.results import ResultsDB, record_sensitivity, sensitivity_weights

    def doc(key, weights, family=None):
        d = {"workload_key": key, "model": "digits-cnn", "q_min": 2, "q_max": 8, "seed": 0,
             "methods": {"loss": {"weights": weights, "time_s": 0.1}},
             "layers": [{"name": n, "loss": w} for n, w in weights.items()]}
        if family:
            d["number_format"] = {"family": family, "grad_format": None}
        return d

    db = tmp_path / "r.db"
    # the table as issue 27 first wrote it: no number_format column
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE sensitivity (id INTEGER PRIMARY KEY AUTOINCREMENT, workload_key TEXT NOT NULL, "
                "model TEXT NOT NULL, method TEXT NOT NULL, layer TEXT NOT NULL, value REAL, weight REAL, "
                "q_min INTEGER, q_max INTEGER, seed INTEGER, time_s REAL, created TEXT, "
                "UNIQUE (workload_key, method, layer, q_min, q_max, seed))")
    con.execute("INSERT INTO sensitivity (workload_key, model, method, layer, value, weight, q_min, q_max, seed, "
                "time_s, created) VALUES ('k-old', 'digits-cnn', 'loss', 'a', 1, 0.9, 2, 8, 0, 0.1, '2026-01-01')")
    con.execute("INSERT INTO sensitivity (workload_key, model, method, layer, value, weight, q_min, q_max, seed, "
                "time_s, created) VALUES ('k-old', 'digits-cnn', 'loss', 'b', 1, 0.1, 2, 8, 0, 0.1, '2026-01-01')")
    con.commit()
    con.close()
    assert sensitivity_weights(ResultsDB(db), "digits-cnn", "loss") == pytest.approx({"a": 0.9, "b": 0.1})
    assert sensitivity_weights(ResultsDB(db), "digits-cnn", "loss", "mx") is None
    record_sensitivity(ResultsDB(db), doc("k-mx", {"a": 0.2, "b": 0.8}, "mx"))
    assert sensitivity_weights(ResultsDB(db), "digits-cnn", "loss", "mx") == pytest.approx({"a": 0.2, "b": 0.8})
    # the newer MX measurement does not replace the integer one for an integer plan
    assert sensitivity_weights(ResultsDB(db), "digits-cnn", "loss") == pytest.approx({"a": 0.9, "b": 0.1})
    # a second integer workload at the same bits: the mean over the integer ones (as before), never the MX one's
    record_sensitivity(ResultsDB(db), doc("k-int", {"a": 0.4, "b": 0.6}))
    assert sensitivity_weights(ResultsDB(db), "digits-cnn", "loss", "int") == pytest.approx({"a": 0.65, "b": 0.35})
    assert sensitivity_weights(ResultsDB(db), "digits-cnn", "loss", "fp") is None

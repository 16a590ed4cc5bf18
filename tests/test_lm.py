"""Language models: the quantized LSTM and attention layers, lstm-lm / transformer-lm, text datasets, perplexity."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from cptsim.study.evidence import LocalEvidence
from cptsim.data import dataset_info, load_datasets
from cptsim.errors import InputError
import cptsim.numerics.layers
from cptsim.numerics.layers import quantize_model
from cptsim.numerics.lm_layers import LSTMLayer, Matmul, QMatmul
from cptsim.models import create_model, list_models
from cptsim.measure.profiler import MacCounter, profile_model
from cptsim.data.text import TextStream
from cli_util import one_line_error, run_cli

TINY_LSTM = "lstm-lm:layers=2,hidden=24"
TINY_GPT = "transformer-lm:layers=2,width=32,heads=4"


def _lm(name, vocab=40, T=12, bits=32, fp_layers=None):
    torch.manual_seed(0)
    m = create_model(name, num_classes=vocab, in_channels=T, input_shape=(T,))
    p = quantize_model(m, fp_layers=fp_layers)
    p.set(bits, bits if bits != 32 else 32)
    return m


# ------------------------------------------------------------------------------------------------ layers


def test_lstm_at_32_bits_is_torch_lstm_bit_for_bit():
    torch.manual_seed(0)
    ref = nn.LSTM(16, 32, 1)
    mine = LSTMLayer(16, 32)
    with torch.no_grad():
        mine.ih.weight.copy_(ref.weight_ih_l0), mine.ih.bias.copy_(ref.bias_ih_l0)
        mine.hh.weight.copy_(ref.weight_hh_l0), mine.hh.bias.copy_(ref.bias_hh_l0)
    quantize_model(mine, fp_layers=[])  # QLinear at the default 32 bits: no quantizer op at all
    x = torch.randn(9, 5, 16)
    h0, c0 = torch.randn(5, 32), torch.randn(5, 32)
    with torch.backends.mkldnn.flags(enabled=False):  # PyTorch's native CPU LSTM (RNN.cpp)
        want, (hw, cw) = ref(x, (h0[None], c0[None]))
    got, (h, c) = mine(x, (h0, c0))
    assert torch.equal(got, want) and torch.equal(h, hw[0]) and torch.equal(c, cw[0])
    default, _ = ref(x, (h0[None], c0[None]))  # oneDNN, torch's default CPU LSTM: the same to float rounding
    torch.testing.assert_close(got, default, rtol=1e-5, atol=1e-6)


def test_lstm_gate_gemm_macs_are_the_hand_count():
    V, T, H, B = 40, 12, 24, 3
    m = _lm(TINY_LSTM, vocab=V, T=T, bits=8)
    prof = {r.name: r for r in profile_model(m, (T,), batch_size=B).layers}
    per_step = H * 4 * H  # one token through one gate GEMM (input and hidden both H wide)
    for layer in ("layers.0", "layers.1"):
        ih, hh = prof[f"{layer}.ih"], prof[f"{layer}.hh"]
        assert ih.macs == {"fwd": T * per_step, "dgrad": T * per_step, "wgrad": T * per_step}
        # hh: one call per time step; step 0's h is the (zero) initial state, which needs no gradient
        assert hh.calls == T and hh.macs == {"fwd": T * per_step, "dgrad": (T - 1) * per_step,
                                             "wgrad": T * per_step}
        assert ih.quantized and hh.quantized
    assert prof["decoder"].macs["fwd"] == T * H * V and prof["decoder"].quantized  # the LM head: quantized (issue 25)
    assert "embedding" not in prof  # a lookup, not a GEMM


@pytest.mark.parametrize("name", [TINY_LSTM, TINY_GPT])
def test_profiler_macs_equal_flop_counter_on_a_real_step(name):
    T, B = 12, 3
    m = _lm(name, T=T, bits=6)
    m.train()
    x = torch.randint(40, (B, T))
    with MacCounter(m) as counter:
        with FlopCounterMode(display=False) as fwd:
            out = m(x)
        loss = nn.functional.cross_entropy(out, torch.randint(40, (B, T)))
        with FlopCounterMode(display=False) as bwd:
            loss.backward()
        macs = counter.step_macs()
    assert 2 * macs["fwd"] == fwd.get_total_flops()
    assert 2 * (macs["dgrad"] + macs["wgrad"]) == bwd.get_total_flops()


def test_attention_matmuls_are_counted_and_quantized():
    T, B, C, heads = 12, 2, 32, 4
    m = _lm(TINY_GPT, T=T, bits=4)
    scores = m.blocks[0].attn.scores
    assert isinstance(scores, QMatmul) and isinstance(scores, cptsim.numerics.layers.QUANTIZED_TYPES)
    prof = {r.name: r for r in profile_model(m, (T,), batch_size=B).layers}
    for k in ("scores", "mix"):
        r = prof[f"blocks.0.attn.{k}"]
        assert r.quantized and r.macs == {"fwd": heads * T * T * (C // heads)} | {"dgrad": T * T * C, "wgrad": T * T * C}
    # full precision on request, like any layer
    fp = _lm(TINY_GPT, T=T, bits=4, fp_layers=["*.scores", "*.mix", "head"])
    assert type(fp.blocks[0].attn.scores) is Matmul


def test_qmatmul_quantizes_forward_and_error():
    from cptsim.numerics.layers import PrecisionState

    torch.manual_seed(0)
    q = Matmul()
    quantize_model(q, PrecisionState(), fp_layers=[])
    a, b = torch.randn(3, 5, requires_grad=True), torch.randn(5, 4, requires_grad=True)
    assert torch.equal(q(a, b), a @ b)  # 32 bits: plain matmul
    q.precision.set(2, 2)
    y = q(a, b)
    assert not torch.allclose(y, a @ b)
    y.sum().backward()
    assert a.grad is not None and b.grad is not None


@pytest.mark.parametrize("name", [TINY_LSTM, TINY_GPT])
def test_every_parameter_gets_a_gradient_at_low_bits(name):
    m = _lm(name, bits=4)
    m.train()
    out = m(torch.randint(40, (2, 12)))
    nn.functional.cross_entropy(out, torch.randint(40, (2, 12))).backward()
    for n, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n


def test_lstm_state_carries_in_training_and_resets():
    m = _lm(TINY_LSTM, bits=32)
    m.train()
    x = torch.randint(40, (2, 12))
    a = m.forward_state(x)[0]
    m.reset_state()
    torch.manual_seed(1)
    first = m(x)
    torch.manual_seed(1)
    second = m(x)  # starts from the carried state
    assert not torch.allclose(first, second)
    m.reset_state()
    torch.manual_seed(1)
    assert torch.equal(m(x), first)
    assert a.shape == (2, 40, 12)


# ------------------------------------------------------------------------------------------------ registry


def test_registry_and_options():
    assert {"lstm-lm", "transformer-lm"} <= set(list_models())
    m = create_model("lstm-lm", num_classes=10000, in_channels=35, input_shape=(35,))
    assert len(m.layers) == 2 and m.layers[0].hidden_size == 650 and m.drop.p == 0.5
    assert m.decoder.weight.data_ptr() != m.embedding.weight.data_ptr()  # untied
    g = create_model("transformer-lm:layers=3,width=64,heads=2,context=128", num_classes=50, in_channels=64,
                     input_shape=(64,))
    assert len(g.blocks) == 3 and g.context == 128


@pytest.mark.parametrize("model,shape", [("lstm-lm", (1, 8, 8)), ("transformer-lm", (3, 32, 32)),
                                         ("resnet20", (35,)), ("digits-cnn", (64,)),
                                         ("transformer-lm:heads=3", (35,)), ("lstm-lm:wide=3", (35,))])
def test_model_and_data_kinds_must_match(model, shape):
    with pytest.raises(InputError):
        create_model(model, num_classes=10, in_channels=shape[0], input_shape=shape)


# ------------------------------------------------------------------------------------------------ data


def _ptb_dir(root, lines=400):
    words = "the a cat dog sat on mat ran fast slow big small red blue <unk> and".split()
    g = torch.Generator().manual_seed(0)
    for split, n in (("train", lines), ("valid", lines // 8), ("test", lines // 8)):
        text = "\n".join(" ".join(words[i] for i in torch.randint(len(words), (8,), generator=g).tolist())
                         for _ in range(n))
        (root / f"ptb.{split}.txt").write_text(text + "\n")
    return root


def test_stream_order_gives_contiguous_rows():
    ids = torch.arange(1 + 10 * 4)
    s = TextStream(ids, 4, [str(i) for i in range(41)], False, "t")
    assert len(s) == 10
    order = s.stream_order(3).tolist()  # rows of 4, 3, 3 sequences
    assert sorted(order) == list(range(10))
    steps = [order[i:i + 3] for i in range(0, 10, 3)]
    assert steps == [[0, 4, 7], [1, 5, 8], [2, 6, 9], [3]]
    x, y = s[5]
    assert torch.equal(y[:-1], x[1:])


def test_ptb_format_directory_loads_and_counts_without_loading(tmp_path):
    d = _ptb_dir(tmp_path)
    info = dataset_info("ptb", d)
    train, test, loaded = load_datasets("ptb", d)
    assert info.num_classes == len(train.vocab) == 17 and info.input_shape == (35,)  # 16 words and <eos>
    assert info.train_size == len(train) == (400 * 9 - 1) // 35
    assert loaded.num_classes == 17 and len(test) == loaded.test_size and len(train.valid) > 0
    # without the files: the published figures
    nominal = dataset_info("ptb")
    assert nominal.num_classes == 10000 and nominal.input_shape == (35,)


def test_embedded_corpus_needs_nothing():
    info = dataset_info("pydoc-chars")
    assert info.num_classes > 50 and info.train_size > 5000 and info.input_shape == (64,)


@pytest.mark.parametrize("damage,needle", [("missing", "ptb.valid.txt"), ("empty", "is empty")])
def test_bad_text_files_are_one_line(tmp_path, damage, needle):
    d = _ptb_dir(tmp_path)
    if damage == "missing":
        (d / "ptb.valid.txt").unlink()
    else:
        (d / "ptb.test.txt").write_text("  \n")
    with pytest.raises(InputError, match=needle):
        load_datasets("ptb", d)


# ------------------------------------------------------------------------------------------------ end to end

TRAIN = ["train", "--batch-size", "8", "--lr", "1", "--momentum", "0", "--weight-decay", "0", "--quiet",
         "--recal-batches", "2"]


def test_ptb_directory_trains_one_epoch_and_reports_perplexity(tmp_path):
    (tmp_path / "ptb").mkdir()
    d = _ptb_dir(tmp_path / "ptb")
    out = tmp_path / "run"
    r = run_cli(*TRAIN, "--model", "lstm-lm:layers=1,hidden=32", "--dataset", "ptb", "--data-dir", str(d),
                "--epochs", "1", "--schedule", "cpt:5-8:g8:n2", "--out", str(out))
    assert r.exit_code == 0, r.output
    rec = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-1]
    for k in ("val_loss", "val_ppl", "test_loss", "test_ppl", "train_ppl"):
        assert k in rec
    assert rec["test_ppl"] < 17  # below the uniform guess over the 17-token vocabulary
    assert "test_bpc" not in rec  # word level


def test_lm_resume_continues_exactly(tmp_path):
    # the reference and the resumed run in-process; only the killed one needs a process of its own
    args = [*TRAIN, "--model", "lstm-lm:layers=1,hidden=16", "--dataset", "pydoc-chars", "--steps", "4",
            "--schedule", "cpt:5-8:g8:n2", "--checkpoint-every", "2"]
    ref = tmp_path / "ref"
    assert run_cli(*args, "--out", ref).exit_code == 0
    cut = tmp_path / "cut"
    env = dict(os.environ, CPTSIM_FAULT_KILL_AT_STEP="3")
    r = subprocess.run([sys.executable, "-m", "cptsim.cli.main", *args, "--out", str(cut)], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode != 0
    r = run_cli("train", "--resume", cut, "--quiet")
    assert r.exit_code == 0, r.output

    def losses(run):
        return [json.loads(line)["loss"] for line in (run / "trace.jsonl").read_text().splitlines()]

    assert losses(cut) == losses(ref)  # the hidden state came back with the checkpoint


def test_a_run_begun_per_sequence_resumes_in_the_unit_it_began_with(tmp_path):
    """A language model run whose config.json has no "loss_unit" began when the trace's loss was the sum over a
    sequence's tokens; resumed, it goes on in that unit (one trace, one unit), says so once, and records it. The
    units are told apart by what a near-untrained model's loss is: ln(vocab) per token, seq_len times that per
    sequence."""
    out = tmp_path / "run"
    r = run_cli(*TRAIN, "--model", "transformer-lm:layers=1,width=16,heads=2", "--dataset", "pydoc-chars",
                "--steps", "4", "--schedule", "static:8:g8", "--checkpoint-every", "2", "--out", out)
    assert r.exit_code == 0, r.output
    cfg = json.loads((out / "config.json").read_text())
    seq_len, vocab = cfg["input_shape"][0], cfg["num_classes"]
    assert cfg["loss_unit"] == "per_token"
    ref = [json.loads(line)["loss"] for line in (out / "trace.jsonl").read_text().splitlines()]
    for loss in ref:
        assert 0.5 * math.log(vocab) < loss < 1.2 * math.log(vocab)  # per token: about ln(vocab), far below 64x

    # the run as one begun before the unit was recorded: no "loss_unit", its trace per sequence, stopped at step 2
    del cfg["loss_unit"]
    (out / "config.json").write_text(json.dumps(cfg))
    lines = [json.loads(line) | {"loss": line_loss * seq_len}
             for line, line_loss in zip((out / "trace.jsonl").read_text().splitlines(), ref)]
    (out / "trace.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    manifest = json.loads((out / "checkpoints.json").read_text())
    manifest["checkpoints"] = [e for e in manifest["checkpoints"] if e["step"] == 2]
    (out / "checkpoints.json").write_text(json.dumps(manifest))
    (out / "checkpoint-00000004.pt").unlink()

    r = run_cli("train", "--resume", out, "--quiet")
    assert r.exit_code == 0, r.output
    assert r.output.count("began before losses were per token") == 1
    got = [json.loads(line)["loss"] for line in (out / "trace.jsonl").read_text().splitlines()]
    assert len(got) == 4
    for loss in got:  # every step per sequence, the two resumed ones too
        assert 0.5 * seq_len * math.log(vocab) < loss < 1.2 * seq_len * math.log(vocab)
    assert got[2:] == pytest.approx([x * seq_len for x in ref[2:]], rel=1e-9)  # the same steps, exactly resumed
    assert json.loads((out / "config.json").read_text())["loss_unit"] == "per_sequence"


def test_vocabulary_change_on_resume_is_refused(tmp_path):
    d = _ptb_dir(tmp_path)
    out = tmp_path / "run"
    r = run_cli(*TRAIN, "--model", "lstm-lm:layers=1,hidden=8", "--dataset", "ptb", "--data-dir", str(d),
                "--steps", "2", "--schedule", "static:8:g8", "--out", str(out))
    assert r.exit_code == 0, r.output
    with open(d / "ptb.train.txt", "a") as f:
        f.write("zebra quagga\n")
    assert "vocabulary" in one_line_error(run_cli("train", "--resume", out, "--quiet"))


def test_image_model_on_text_is_exit_2(tmp_path):
    r = run_cli("train", "--model", "resnet20", "--dataset", "pydoc-chars", "--steps", "1", "--out", tmp_path / "r")
    assert "language model" in one_line_error(r)  # checked before the 'training ...' banner: one line only
    assert not (tmp_path / "r").exists()


def test_cost_reproduces_cpts_lstm_saving_without_the_files():
    from cptsim.cost.hardware import load_profile
    from cptsim.planner.workload import Workload
    from cptsim.cost.schedules import parse_schedule

    w = Workload.build(model="lstm-lm", dataset="ptb", batch_size=20, epochs=39, fp_layers=[])
    hw = load_profile("bitfusion")
    est = w.estimate(parse_schedule("cpt:5-8:g8:n8"), hw)
    base = w.estimate(parse_schedule("static:8:g8"), hw)
    saving = 1 - est.bitops["total"] / base.bitops["total"]
    assert abs(saving - 0.232) < 0.005  # CPT (ICLR 2021), Table: LSTM on PTB, CPT 5-8/8 vs static 8/8


# ------------------------------------------------------------------------------------------------ speed, ranking


def test_hh_weight_is_quantized_once_per_forward_with_the_same_result(monkeypatch):
    """reuse_quantized_weights: one weight quantization per LSTM layer's hh per forward (not T), the profiler still
    sees T calls, and the output and every gradient equal those of quantizing at each call."""
    import contextlib

    import cptsim.numerics.lm_layers

    T, B = 12, 3
    x, y = torch.randint(40, (B, T)), torch.randint(40, (B, T))

    def step(cached):
        if not cached:
            monkeypatch.setattr(cptsim.numerics.lm_layers, "reuse_quantized_weights", lambda *m: contextlib.nullcontext())
        calls = []
        real = cptsim.numerics.layers.quantize_weight
        monkeypatch.setattr(cptsim.numerics.layers, "quantize_weight", lambda w, b: calls.append(w.shape) or real(w, b))
        # the exact int8 path (the CPU default) quantizes a weight with its codes in one call
        real_codes = cptsim.numerics.exact_gemm.weight_codes
        monkeypatch.setattr(cptsim.numerics.exact_gemm, "weight_codes",
                            lambda w, b: calls.append(w.shape) or real_codes(w, b))
        m = _lm(TINY_LSTM, T=T, bits=6)
        m.train()
        torch.manual_seed(5)  # the same error rounding noise in both
        out = m(x)
        nn.functional.cross_entropy(out, y).backward()
        monkeypatch.undo()
        return out, [p.grad for p in m.parameters()], len(calls)

    out, grads, n = step(cached=True)
    out0, grads0, n0 = step(cached=False)
    assert torch.equal(out, out0) and all(torch.equal(a, b) for a, b in zip(grads, grads0))
    # two layers: ih and hh once each, against hh at every step; and the decoder once (quantized by default)
    assert n == 2 * 2 + 1 and n0 == 2 * (1 + T) + 1
    m = _lm(TINY_LSTM, T=T, bits=6)
    prof = {r.name: r for r in profile_model(m, (T,), batch_size=B).layers}
    assert prof["layers.0.hh"].calls == T
    assert "_wq_cache" not in vars(m.layers[0].hh)  # nothing outlives the forward


def _lm_rows():
    ppls = {"static:4:g8": [9.0, 9.2], "cos-rep:3-8:g8:n2": [7.0, 7.4], "static:8:g8": [6.0, 6.1]}
    bitops = {"static:4:g8": 1e9, "cos-rep:3-8:g8:n2": 2e9, "static:8:g8": 10e9}
    rows = []
    for text, ps in ppls.items():
        q = int(text.split(":")[1].split("-")[-1])
        for seed, p in enumerate(ps):
            rows.append({"workload_key": "k", "workload": {"model": "lstm-lm", "dataset": "pydoc-chars", "steps": 4,
                                                          "batch_size": 8},
                         "schedule": text, "family": text.split(":")[0], "q_max": q, "g_max": 8, "seed": seed,
                         "steps": 4, "bitops": bitops[text], "bitops_static": 10e9 if q == 8 else 5e9,
                         "test_acc": 0.3, "eval_bits": q, "run_path": f"/r/{text}-{seed}",
                         "extra": {"test_ppl": p, "test_bpc": 1.0}})
    return rows


def test_sweep_report_of_a_language_model_is_perplexity_lower_better():
    from cptsim.study import sweep as SW
    from cptsim.study.plots import sweep_figure

    scores = {"static:4:g8": 0.1, "cos-rep:3-8:g8:n2": 0.2, "static:8:g8": 0.3}  # rank = lower perplexity
    rep = SW.sweep_report(_lm_rows(), score_fn=lambda text, steps: scores[text])
    assert rep["measure"]["key"] == "ppl" and rep["measure"]["higher_is_better"] is False
    by = {t["schedule"]: t for t in rep["schedules"]}
    assert by["cos-rep:3-8:g8:n2"]["ppl_mean"] == pytest.approx(7.2)
    assert by["static:4:g8"]["ppl_std"] == pytest.approx(0.1414, abs=1e-3)
    assert rep["spearman"]["rho"] == pytest.approx(1.0)  # score vs minus perplexity
    assert "perplexity" in rep["spearman"]["what"]
    pytest.importorskip("matplotlib")
    assert sweep_figure(rep)[:8] == b"\x89PNG\r\n\x1a\n"


def test_range_test_of_a_language_model_uses_validation_loss():
    from cptsim.study.rangetest import RangeTestSettings, run_range_test, suggest_q_min

    s = RangeTestSettings(model="lstm-lm:layers=1,hidden=16,dropout=0", dataset="pydoc-chars", batch_size=8,
                          lr=1.0, momentum=0.0, weight_decay=0.0, q_start=6, q_max=7, steps_per_stage=2,
                          baseline_batches=1)
    r = run_range_test(s)
    assert r.measure == "val_loss" and r.baseline_val_loss > 0
    prev = r.baseline_val_loss
    for row in r.rows:
        assert row.val_loss > 0 and row.improvement == pytest.approx((prev - row.val_loss) / prev)
        prev = row.val_loss
    doc = r.to_json()
    assert doc["measure"] == "val_loss" and "validation loss" in doc["rule"] and "val_loss" in doc["baseline"]
    assert (r.suggested_q_min, r.conclusive, r.reason) == suggest_q_min(r.rows, r.threshold, "val_loss")


def test_pilot_ranks_language_models_by_validation_perplexity(tmp_path):
    from cptsim.planner.evaluate import evaluate
    from cptsim.planner.pilot import default_steps, is_text, run_pilot
    from cptsim.planner.workload import Workload
    from cptsim.cost.schedules import parse_schedule

    w = Workload.build(model="lstm-lm:layers=1,hidden=16,dropout=0", dataset="pydoc-chars", batch_size=8, steps=3,
                       lr=1.0, momentum=0.0, weight_decay=0.0)
    assert is_text(w) and default_steps(w) == 3  # nothing held out of a text dataset
    cands = evaluate(w, "bitfusion")
    pool = [cands.index(parse_schedule(t)) for t in ("static:8:g8", "cpt:5-8:g8:n1")]
    winner, doc = run_pilot(cands, pool, 2, str(tmp_path / "p"), db=False, evidence=LocalEvidence())
    (rnd,) = doc["rounds"]
    assert "perplexity" in doc["measure"]
    assert all(r["val_ppl"] == pytest.approx(math.exp(r["val_loss"])) and r["val_tokens"] > 0 for r in rnd["runs"])
    best = min(rnd["runs"], key=lambda r: (r["val_loss"], r["proxy_rank"]))
    assert doc["winner"] == best["schedule"] and rnd["gap"] >= 0 and rnd["two_se"] > 0

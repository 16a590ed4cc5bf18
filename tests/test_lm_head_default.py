"""Issue 25 item 2: a language model's output head is quantized by default (the published convention; measured on
the embedded corpus, README "Language models: the head"), so that `cost` reproduces CPT's published LM saving with
no flag; --fp-layers decoder keeps the head in FP32."""

import json

from cli_util import run_cli


def _saving(*extra):
    r = run_cli("cost", "--model", "lstm-lm", "--dataset", "ptb", "--batch-size", "20", "--epochs", "39",
                "--schedule", "cpt:5-8:g8:n8", "--hw", "bitfusion", "--json", *extra)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["profiles"][0]["saving_vs_static"]["bitops"]


def test_lstm_lm_costs_cpts_published_saving_by_default():
    assert abs(_saving() - 0.232) < 0.005  # CPT (ICLR 2021): LSTM on PTB, CPT 5-8/8 vs static 8/8, 23.2%
    assert _saving("--fp-layers", "decoder") < 0.05  # the FP32 head: 1.4%


def test_both_language_models_quantize_their_head_by_default():
    from cptsim.models import create_model, default_fp_layers

    assert default_fp_layers(create_model("lstm-lm:layers=1,hidden=8", num_classes=20, input_shape=(12,))) == []
    assert default_fp_layers(create_model("transformer-lm:layers=1,width=16,heads=2", num_classes=20,
                                          input_shape=(12,))) == []
    assert default_fp_layers(create_model("resnet20")) == ["fc"]  # image models keep their classifier in FP32

"""Issue 25 item 1: with no --dataset, the dataset is the embedded one of the model's kind (pydoc-chars for a
language model, digits for an image model) in every command and in the own-loop API; a dataset of the other kind,
named explicitly, stays an error (exit 2)."""

import json

import pytest
import torch

from cli_util import one_line_error, run_cli

LSTM = "lstm-lm:layers=1,hidden=16,dropout=0"
GPT = "transformer-lm:layers=1,width=16,heads=2,dropout=0"


def test_default_dataset_follows_the_models_kind():
    from cptsim.data import default_dataset

    assert default_dataset("lstm-lm") == "pydoc-chars"
    assert default_dataset(GPT) == "pydoc-chars"
    assert default_dataset("digits-cnn") == "digits"
    assert default_dataset("resnet20") == "digits"
    assert default_dataset("no-such-model") == "digits"  # its own error comes where it is built


@pytest.mark.parametrize("model", ["lstm-lm", "transformer-lm"])
def test_train_a_language_model_with_no_other_flag_resolves_the_text_corpus(model, tmp_path):
    """The defaults of the issue's two commands: both build and pass the model/data check (the meta build), so the
    run starts; a 1-step run of the small variants below shows the whole run through."""
    from cptsim.run.config import TrainConfig

    assert TrainConfig(model=model).dataset == "pydoc-chars"
    assert TrainConfig().dataset == "digits"


@pytest.mark.parametrize("model", [LSTM, GPT])
def test_train_cli_without_dataset_trains_a_language_model(model, tmp_path):
    out = tmp_path / "run"
    r = run_cli("train", "--model", model, "--steps", "2", "--batch-size", "8", "--recal-batches", "1",
                "--quiet", "--out", out)
    assert r.exit_code == 0, r.output
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["settings"]["dataset"] == "pydoc-chars"


def test_plan_cost_profile_without_dataset_use_the_text_corpus(tmp_path):
    r = run_cli("cost", "--model", LSTM, "--schedule", "cpt:5-8:g8:n8", "--steps", "10", "--hw", "bitfusion",
                "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["workload"]["dataset"] == "pydoc-chars"
    r = run_cli("profile", "--model", LSTM, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["input_shape"] == [64]  # pydoc-chars' sequence length
    r = run_cli("plan", "--model", LSTM, "--budget", "100%", "--steps", "10", "--out", tmp_path / "p.json", "--quiet",
                "--cycles", "2", "--schedules", "cpt")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "p.json").read_text())["workload"]["dataset"] == "pydoc-chars"


def test_range_test_and_sweep_settings_default_to_the_models_kind():
    from cptsim.study.rangetest import RangeTestSettings
    from cptsim.study.sweep import SweepSettings

    assert RangeTestSettings(model=LSTM).dataset == "pydoc-chars"
    assert RangeTestSettings().dataset == "digits"
    s = SweepSettings(model=GPT, steps=2)
    assert s.dataset == "pydoc-chars"
    s.validate()  # the model meets its data
    assert SweepSettings().dataset == "digits"


def test_range_test_cli_without_dataset_runs_on_text():
    r = run_cli("range-test", "--model", LSTM, "--steps-per-stage", "1", "--batch-size", "8", "--q-start", "7",
                "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["settings"]["dataset"] == "pydoc-chars"


@pytest.mark.parametrize("args,words", [
    (("train", "--model", LSTM, "--dataset", "digits", "--steps", "1"), "language model"),
    (("cost", "--model", LSTM, "--dataset", "digits", "--steps", "1"), "language model"),
    (("plan", "--model", LSTM, "--dataset", "digits", "--budget", "80%", "--steps", "1"), "language model"),
    (("train", "--model", "digits-cnn", "--dataset", "pydoc-chars", "--steps", "1"), "language model"),
])
def test_an_explicit_mismatch_stays_exit_2(args, words, tmp_path):
    extra = ("--out", tmp_path / "o") if args[0] in ("train", "plan") else ()
    assert words in one_line_error(run_cli(*args, *extra))


def test_run_recorder_defaults_the_dataset_to_the_models_kind(tmp_path):
    import cptsim
    from cptsim.errors import InputError
    from cptsim.models import create_model

    model = create_model(LSTM, num_classes=50, input_shape=(64,))
    precision = cptsim.quantize_model(model)
    sched = cptsim.PrecisionScheduler(precision, "static:8:g8", total_steps=2)
    rec = cptsim.RunRecorder(tmp_path / "a", model, sched, config={"model": "lstm-lm"})
    rec.close()
    assert json.loads((tmp_path / "a" / "config.json").read_text())["settings"]["dataset"] == "pydoc-chars"
    # a cptsim language model under a name of the user's: still a language model
    rec = cptsim.RunRecorder(tmp_path / "b", model, sched)
    rec.close()
    assert json.loads((tmp_path / "b" / "config.json").read_text())["settings"]["dataset"] == "pydoc-chars"
    # a model of the user's own: "custom", as before
    own = torch.nn.Sequential(torch.nn.Linear(4, 2))
    rec = cptsim.RunRecorder(tmp_path / "c", own, cptsim.PrecisionScheduler(cptsim.quantize_model(own),
                                                                            "static:8:g8", total_steps=2))
    rec.close()
    assert json.loads((tmp_path / "c" / "config.json").read_text())["settings"]["dataset"] == "custom"
    with pytest.raises(InputError, match="language model"):
        cptsim.RunRecorder(tmp_path / "d", model, sched, config={"model": "lstm-lm", "dataset": "digits"})

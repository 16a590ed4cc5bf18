"""Issue 25 item 8: a language model's pilot round separates by the loss gap against a *blocked* standard error.

Neighbouring tokens' losses are correlated, so the error of a mean loss is not spread / sqrt(tokens). The pilot takes
it from batch means over BPTT windows (``window_se``): checked here on synthetic per-token losses with a known
correlation -- a stationary AR(1) series, whose mean has the exact variance
    sigma^2 / n * [(1 + phi) / (1 - phi) - 2 phi (1 - phi^n) / (n (1 - phi)^2)]
-- against which the old error, loss / sqrt(tokens) (the loss taken as its own spread: here mu = sigma), is too
small by sqrt((1 - phi) / (1 + phi)). Then the round itself, with fake runs whose per-window validation losses
are chosen, and the real loop's record of them."""

import math

import numpy as np
import pytest
from scipy.signal import lfilter

from cptsim.planner.pilot import blocked_se, window_se
from shared_runs import cptsim_here

T, W = 64, 512  # a character model's BPTT window; windows per series (32768 tokens)


def _ar1_tokens(rng, phi: float, replicates: int, mu: float = 3.0, sigma: float = 3.0) -> np.ndarray:
    """``replicates`` stationary AR(1) series of W * T per-token losses, mean mu, standard deviation sigma."""
    z = rng.standard_normal((replicates, W * T))
    z[:, 0] /= math.sqrt(1 - phi ** 2)  # e_0 ~ N(0, 1): stationary from the first token
    e = lfilter([math.sqrt(1 - phi ** 2)], [1.0, -phi], z, axis=1)
    return mu + sigma * e


def _se_of_mean(sigma: float, phi: float, n: int) -> float:
    return sigma / math.sqrt(n) * math.sqrt((1 + phi) / (1 - phi) - 2 * phi * (1 - phi ** n) / (n * (1 - phi) ** 2))


@pytest.mark.parametrize("phi", [0.0, 0.9, 0.98])
def test_the_blocked_standard_error_matches_the_exact_one_of_an_ar1_loss(phi):
    rng = np.random.default_rng(25)
    x = _ar1_tokens(rng, phi, replicates=200)
    exact = _se_of_mean(3.0, phi, W * T)
    assert x.mean(axis=1).std(ddof=1) == pytest.approx(exact, rel=0.15)  # the simulation is what it says
    windows = x.reshape(len(x), W, T).mean(axis=2)  # what evaluate_lm records: each window's mean loss
    est = np.array([window_se(w)[0] for w in windows])
    # calibrated on average (the largest of the blocked estimates: a few % high, never low) and one by one
    assert 0.97 < est.mean() / exact < 1.10
    assert np.all(np.abs(est / exact - 1) < 0.4)
    # the old error, loss / sqrt(tokens) with the loss (mu) equal to its spread (sigma): too small by the known factor
    naive = 3.0 / math.sqrt(W * T)
    assert naive / exact == pytest.approx(math.sqrt((1 - phi) / (1 + phi)), rel=0.02)
    # batch means over the tokens of a window are the per-token series blocked by T: the same estimate
    assert blocked_se(x[0], T) == pytest.approx(blocked_se(windows[0], 1), rel=1e-9)
    if phi == 0.98:  # a correlation (~100 tokens) that outlasts one window: blocks of one window fall short
        one = np.array([blocked_se(w, 1) for w in windows])
        assert one.mean() / exact < 0.75 and min(window_se(w)[1] for w in windows) > 1


# -- the pilot's round -----------------------------------------------------------------------------------------------


class _FakeRun:
    def __init__(self, path, record, n_val):
        self.path, self._record, self._n_val = path, record, n_val

    def read_metrics(self):
        return type("M", (), {"records": [self._record]})()

    def read_config(self):
        return {"val_size": self._n_val}


class _FakeEvidence:
    """Language-model pilot runs with chosen per-window validation losses: the n-th run trained gets ``losses[n]``
    (None: a run of an older cptsim, which recorded none)."""

    def __init__(self, losses):
        self.losses, self.trained = losses, []

    def train(self, cfg, out):
        from pathlib import Path

        from cptsim.data.text import pack_window_losses, unpack_window_losses

        x = self.losses[len(self.trained)]
        self.trained.append(cfg.schedule)
        Path(out).mkdir(parents=True)
        packed = pack_window_losses([x])
        loss = float(unpack_window_losses(packed).mean())  # the loss is the mean of what was recorded
        rec = {"step": cfg.steps, "val_loss": loss, "val_ppl": math.exp(loss), "val_acc": 0.3, "train_loss": loss}
        if x is not None:
            rec["val_window_loss"] = packed
        return _FakeRun(Path(out), rec, len(x))

    def record(self, run, db):
        pass


@pytest.fixture(scope="module")
def lm_cands():
    from cptsim.cost.schedules import parse_schedule
    from cptsim.planner.evaluate import evaluate
    from cptsim.planner.workload import Workload

    w = Workload.build(model="lstm-lm:layers=1,hidden=16,dropout=0", dataset="pydoc-chars", batch_size=8, steps=3,
                       lr=1.0, momentum=0.0, weight_decay=0.0)
    cands = evaluate(w, "bitfusion")
    return cands, [cands.index(parse_schedule(t)) for t in ("static:8:g8", "cpt:5-8:g8:n1")]


def _round(lm_cands, tmp_path, a, b):
    from cptsim.planner.pilot import run_pilot

    cands, pool = lm_cands
    _, doc = run_pilot(cands, pool, 2, str(tmp_path / "p"), db=False, evidence=_FakeEvidence([a, b]))
    (rd,) = doc["rounds"]
    return rd


N_WIN = 363  # pydoc-chars' validation split: 363 windows of 64 characters


def test_correlated_noise_is_not_called_a_separation(lm_cands, tmp_path):
    """Two candidates whose per-window losses differ by noise correlated from window to window (AR(1), 0.8) and a
    gap of 0.06 nats: twice the old error (2 x 3.0 / sqrt(23232) = 0.039) calls it separated; the blocked error of
    the paired differences does not."""
    rng = np.random.default_rng(8)
    base = 3.0 + 0.3 * rng.standard_normal(N_WIN)
    noise = lfilter([math.sqrt(1 - 0.8 ** 2)], [1.0, -0.8], rng.standard_normal(N_WIN)) * 0.5
    a, b = base, base + 0.06 + noise - noise.mean()  # the dropped run is 0.06 worse on average
    rd = _round(lm_cands, tmp_path, a, b)
    assert rd["gap"] == pytest.approx(0.06, abs=1e-5)
    assert rd["gap"] > 2 * 3.0 / math.sqrt(N_WIN * T)  # what the old check called separated
    assert rd["windows"] == N_WIN and "blocked" in rd["test"]
    assert rd["two_se"] == pytest.approx(2 * window_se(b.astype(np.float32) - a.astype(np.float32))[0], rel=1e-4)
    assert rd["separated"] is False and rd["two_se"] > rd["gap"]
    assert 2 * blocked_se(b - a, 1) < rd["gap"]  # batch means over single windows alone would have been fooled too


def test_a_small_gap_the_same_on_every_window_is_separated(lm_cands, tmp_path):
    """A gap of 0.03 nats on every window, up to small independent noise, over windows of very different difficulty:
    the old unpaired check (0.03 < 0.039) could not tell; the paired one can."""
    rng = np.random.default_rng(9)
    a = 3.0 + 0.5 * rng.standard_normal(N_WIN)
    b = a + 0.03 + 0.05 * rng.standard_normal(N_WIN)
    rd = _round(lm_cands, tmp_path, a, b)
    assert rd["gap"] < 2 * 3.0 / math.sqrt(N_WIN * T)
    assert rd["separated"] is True and rd["two_se"] < 0.01


def test_runs_without_window_losses_fall_back_to_the_old_bound_and_say_so(lm_cands, tmp_path):
    from cptsim.planner.pilot import _loss_gap

    kept = {"val_loss": 3.0, "val_tokens": N_WIN * T}
    rd = _loss_gap(kept, {"val_loss": 3.1}, None, None)
    assert rd["two_se"] == pytest.approx(2 * 3.0 / math.sqrt(N_WIN * T)) and "lower bound" in rd["test"]
    assert "val_window_loss" in rd["why"]


# -- what the loop records -------------------------------------------------------------------------------------------


def test_evaluate_lm_gives_each_window_its_mean_loss_in_text_order():
    import torch

    from cptsim.data import load_datasets
    from cptsim.data.text import evaluate_lm, pack_window_losses, unpack_window_losses
    from cptsim.models import create_model

    train, _ = load_datasets("pydoc-chars", None, augment=False)[:2]
    valid = train.valid
    torch.manual_seed(0)
    model = create_model("lstm-lm:layers=1,hidden=16,dropout=0", num_classes=len(valid.vocab), in_channels=1,
                         input_shape=(valid.seq_len,)).eval()
    got: list = []
    loss, _ = evaluate_lm(model, valid, "cpu", windows=got)
    (per,) = got
    assert per.shape == (len(valid),) and per.dtype == torch.float64
    assert float(per.mean()) == pytest.approx(loss, rel=1e-6)  # every window has T tokens
    # window k is sequence k of the split: the first window of row 0 starts from a zero state
    import torch.nn.functional as F

    x, y = valid[0]
    with torch.no_grad():
        logits, _ = model.forward_state(x[None], None)
    assert float(per[0]) == pytest.approx(float(F.cross_entropy(logits, y[None])), rel=1e-5)
    back = unpack_window_losses(pack_window_losses(got))
    assert np.allclose(back, per.numpy(), rtol=1e-6)


@pytest.mark.slow
def test_a_language_model_run_records_its_validation_loss_per_window(tmp_path):
    from cptsim.data.text import unpack_window_losses
    from cptsim.run.rundir import RunDir

    out = tmp_path / "run"
    r = cptsim_here("train", "--model", "lstm-lm:layers=1,hidden=16,dropout=0", "--dataset", "pydoc-chars",
                    "--batch-size", "8", "--steps", "2", "--recal-batches", "0", "--quiet", "--out", out)
    assert r.exit_code == 0, (r.output[-2000:], r.exception)
    (rec,) = RunDir.open(out).read_metrics().records
    per = unpack_window_losses(rec["val_window_loss"])
    assert len(per) == N_WIN and per.mean() == pytest.approx(rec["val_loss"], rel=1e-5)
    assert "val_correct" not in rec

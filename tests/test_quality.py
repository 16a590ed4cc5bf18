"""The planner's quality decisions, checked against independent truth: a known generating model for the learned
quality model, hand-computed BatchNorm statistics for the evaluation's re-estimation, and the measured runs shipped
in benchmarks/results/quality-digits.db for the score and the pick."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

from cptsim.study.evidence import LocalEvidence
from cptsim.planner.quality import MIN_SCHEDULES, fit_quality, features
from cptsim.planner.score import score_bits
from cptsim.cost.schedules import parse_schedule

SHIPPED_DB = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "quality-digits.db"


# -- the learned quality model -----------------------------------------------------------------------------------------


def test_fit_recovers_a_known_monotone_model_and_its_ranking():
    rng = np.random.default_rng(0)
    n_sched, seeds = 12, 3
    X = np.column_stack([rng.uniform(0.8, 0.95, n_sched), rng.uniform(2, 4, n_sched), rng.uniform(0.7, 1.0, n_sched)])
    truth = 0.5 + 0.4 * X[:, 0] + 0.02 * X[:, 1]  # rises with score and mean bits, flat in cost
    names = [f"s{i}" for i in range(n_sched) for _ in range(seeds)]
    rows = np.repeat(X, seeds, axis=0)
    acc = np.repeat(truth, seeds) + rng.normal(0, 0.002, n_sched * seeds)
    m = fit_quality(names, rows, acc)
    assert m is not None and m.n_schedules == n_sched and m.n_runs == n_sched * seeds
    mean, std = m.predict(X)
    assert np.all(std > 0)
    from scipy.stats import spearmanr

    assert spearmanr(mean, truth)[0] > 0.95  # near-ties may swap under the seed noise
    assert np.max(np.abs(mean - truth)) < 0.01
    assert m.seed_sd == pytest.approx(0.002, rel=0.5)
    assert m.loo_spearman > 0.9


def test_fit_never_lets_accuracy_fall_with_a_feature():
    rng = np.random.default_rng(1)
    X = np.column_stack([rng.uniform(0.8, 0.95, 8), rng.uniform(2, 4, 8), rng.uniform(0.7, 1.0, 8)])
    acc = 0.9 - 0.3 * (X[:, 2] - 0.7)  # noise that happens to fall with cost: the sign constraint ignores it
    m = fit_quality([f"s{i}" for i in range(8)], X, acc)
    assert np.all(m.coef[1:] >= 0) and m.coef[3] == 0


def test_too_few_measured_schedules_fit_nothing():
    X = features([0.9] * 8, [3.0] * 8, [1.0] * 8)
    assert fit_quality([f"s{i % (MIN_SCHEDULES - 1)}" for i in range(8)], X, np.linspace(0.9, 0.95, 8)) is None


def _fake_rows(workload, accuracy_of, seeds=(0, 1), test_of=None, measured=True):
    """Rows of runs of ``workload`` as cptsim.study.results stores them (as a sweep trains it, with its validation
    split held out, unless ``measured`` is False), with validation accuracy ``accuracy_of(schedule)`` and test
    accuracy ``test_of(schedule)`` (default the same)."""
    from cptsim.planner.quality import measured_workload
    from cptsim.study.results import workload_key

    wl = measured_workload(workload) if measured else workload.to_json()
    test_of = test_of or accuracy_of
    rows = []
    for text in ("static:4:g8", "static:5:g8", "static:6:g8", "cos-rep:3-8:g8:n32", "lin-tri:3-8:g8:n1",
                 "cos-rep:4-8:g8:n8", "exp-rep:3-6:g8:n4"):
        s = parse_schedule(text)
        for seed in seeds:
            rows.append({"workload_key": workload_key(wl), "workload": wl, "schedule": s.to_text(),
                         "family": s.name, "q_min": s.q_min, "q_max": s.q_max, "g_min": s.g_min, "g_max": s.g_max,
                         "cycles": s.cycles, "seed": seed, "steps": wl["steps"], "test_acc": test_of(s),
                         **({"val_acc": accuracy_of(s), "val_size": 287} if measured else {}), "source": "sweep", "run_path": f"/fake/{s.to_text()}-{seed}", "created": "2026-11-26"})
    return rows


@pytest.fixture(scope="module")
def digits_workload():
    from cptsim.planner import Workload

    return Workload.build()


def test_plan_quality_db_ranks_by_predicted_accuracy_and_records_it(digits_workload, tmp_path):
    from cptsim.planner import plan
    from cptsim.study.results import ResultsDB

    db = tmp_path / "r.db"
    T = digits_workload.steps
    with ResultsDB(db) as r:  # measured accuracy that follows the mean bits of a schedule
        for row in _fake_rows(digits_workload, lambda s: 0.8 + 0.02 * float(s.bits(T).mean())):
            r.add_run(row)
    p = plan(digits_workload, "bitfusion", "65%", quality="db", db=str(db), evidence=LocalEvidence())
    doc = p.to_json()
    assert p.ranking == "db" and doc["quality"]["name"] == "monotone-linear/2"
    assert doc["quality"]["schedules"] == 7 and doc["quality"]["runs"] == 14
    alts = [a for a in doc["alternatives"] if a["within_budget"]]
    preds = [a["predicted_acc"] for a in alts if a["role"] != "cheapest" and not a["extrapolated"]]
    assert preds[0] == max(preds)  # the chosen one has the best predicted accuracy within budget
    assert all(a["predicted_std"] > 0 for a in alts if not a["extrapolated"])
    assert doc["estimate"]["bitops"]["total"] <= doc["budget_absolute"]


def test_plan_quality_db_falls_back_to_the_proxy_with_too_few_runs(digits_workload, tmp_path):
    from cptsim.planner import plan

    p = plan(digits_workload, "bitfusion", "65%", quality="db", db=str(tmp_path / "empty.db"),
             evidence=LocalEvidence())
    doc = p.to_json()
    assert p.ranking == "proxy" and doc["quality"]["fallback"] == "proxy"
    assert any("--quality db: 0 measured schedule(s)" in n for n in doc["notes"])
    proxy = plan(digits_workload, "bitfusion", "65%")
    assert p.schedule == proxy.schedule


def test_quality_db_fits_the_validation_measure_and_never_the_test_split(digits_workload, tmp_path):
    """Issue 22 item 1. The rows' validation accuracy rises with a schedule's mean bits, their test accuracy falls
    with it: the model must be fitted to the first. Independent truth: with Z standardised over the measured
    schedules the fitted intercept is the mean over schedules of the measure fitted, and the exactly linear
    validation data are reproduced (a positive mean-bits weight). Rows of older sweeps (no validation split, test
    accuracy only) are counted and left out."""
    from cptsim.planner import plan
    from cptsim.planner.quality import measured_workload
    from cptsim.study.results import ResultsDB

    db = tmp_path / "r.db"
    T = digits_workload.steps
    val = lambda s: 0.8 + 0.02 * float(s.bits(T).mean())  # noqa: E731
    test = lambda s: 0.99 - 0.03 * float(s.bits(T).mean())  # noqa: E731
    rows = _fake_rows(digits_workload, val, test_of=test)
    old = _fake_rows(digits_workload, test, measured=False)  # an old sweep: full training set, test only
    for r in old:
        r["run_path"] += "-old"
    with ResultsDB(db) as r:
        for row in rows + old:
            r.add_run(row)
    mw = measured_workload(digits_workload)
    assert mw["dataset_size"] == 1437 - 287 and mw["steps"] == 15 * -(-(1437 - 287) // 64)
    p = plan(digits_workload, "bitfusion", "65%", quality="db", db=str(db), evidence=LocalEvidence())
    q = p.to_json()["quality"]
    assert p.ranking == "db" and q["measure"]["key"] == "val_acc" and q["runs"] == 14
    assert q["runs_without_validation"] == 0  # the old rows are another workload key altogether
    means = {}
    for row in rows:
        means.setdefault(row["schedule"], []).append(row["val_acc"])
    assert q["intercept"] == pytest.approx(np.mean([np.mean(v) for v in means.values()]), abs=1e-9)
    assert q["coefficients"]["mean_bits"] > 0
    # the same rows, but the runs recorded no validation measure: nothing is fitted to their test accuracy
    db2 = tmp_path / "r2.db"
    with ResultsDB(db2) as r:
        for row in rows:
            r.add_run({k: v for k, v in row.items() if k not in ("val_acc", "val_size")})
    p2 = plan(digits_workload, "bitfusion", "65%", quality="db", db=str(db2), evidence=LocalEvidence())
    q2 = p2.to_json()["quality"]
    assert p2.ranking == "proxy" and q2["fallback"] == "proxy" and q2["runs_without_validation"] == 14
    assert any("recorded no validation measure" in n for n in p2.notes)


def test_quality_db_fits_a_language_models_validation_loss_not_its_next_token_accuracy():
    """Issue 22 item 1, language models: the measure is the per-token validation loss (log perplexity), fitted as
    minus the loss so that higher is better; the text dataset has its own validation split, so the workload is
    looked up as planned. Rows without a validation loss (test only) are counted and left out."""
    from types import SimpleNamespace

    from cptsim.planner.quality import load_measurements

    wl = {"model": "lstm", "dataset": "pydoc-chars", "dataset_size": 1000, "batch_size": 8, "steps": 50,
          "epochs": 2}
    rows = [{"schedule": "static:8:g8", "val_loss": 1.5, "test_acc": 0.9},
            {"schedule": "static:6:g8", "val_loss": None, "extra": {"val_loss": 1.7}, "test_acc": 0.95},
            {"schedule": "static:4:g8", "val_loss": None, "extra": {}, "test_acc": 0.99}]
    asked = []

    class Ev:
        def measurements(self, workload, db):
            asked.append(workload)
            return rows, "k", "p"

    w = SimpleNamespace(dataset="pydoc-chars", to_json=lambda: dict(wl))
    m = load_measurements(w, None, Ev())
    assert asked == [wl]  # nothing held out of a text dataset
    assert m.measure["key"] == "val_loss" and not m.measure["higher_is_better"]
    assert m.schedules == ["static:8:g8", "static:6:g8"] and m.values == [-1.5, -1.7]
    assert m.without_validation == 1


def _measured_features(w, texts, base_bitops, floor=None):
    """The four features of each schedule, computed here from their definitions (score_bits of the schedule's
    bits, their mean, its BitOPs over the baseline's, the share of its steps above ``floor``: by default the lowest
    bits any of them runs)."""
    bits = {t: parse_schedule(t).bits(w.steps) for t in texts}
    floor = min(int(q.min()) for q in bits.values()) if floor is None else floor
    out = []
    for t in texts:
        s = parse_schedule(t)
        q, g = bits[t], s.grad_bits(w.steps)
        out.append((float(score_bits(q, g)), float(q.mean()), w.estimate(s, "bitfusion").bitops["total"] / base_bitops,
                    float((q > floor).mean())))
    return np.array(out)


def test_quality_db_never_predicts_outside_the_measured_feature_range(digits_workload, tmp_path):
    """Issue 22 item 2: a candidate whose score, mean bits or relative cost lies outside the range of the measured
    schedules gets no prediction (marked extrapolated) and keeps the place the proxy ranking gives it; the model
    re-orders only the candidates inside, among their places; the plan says how many. The range is computed here
    from the measured schedules themselves."""
    from cptsim.planner import plan
    from cptsim.study.results import ResultsDB

    db = tmp_path / "r.db"
    T = digits_workload.steps
    rows = _fake_rows(digits_workload, lambda s: 0.8 + 0.02 * float(s.bits(T).mean()))
    with ResultsDB(db) as r:
        for row in rows:
            r.add_run(row)
    p = plan(digits_workload, "bitfusion", "65%", quality="db", db=str(db), evidence=LocalEvidence(), top=400)
    doc = p.to_json()
    base = doc["baseline"]["bitops"]["total"]
    X = _measured_features(digits_workload, sorted({r["schedule"] for r in rows}), base)
    lo, hi = X.min(axis=0), X.max(axis=0)
    q = doc["quality"]
    q_floor = 3  # the measured schedules' lowest bits (cos-rep:3-8, lin-tri:3-8, exp-rep:3-6)
    assert q["floor_bits"] == q_floor
    assert p.ranking == "db"
    assert np.allclose([v for v in q["feature_range"].values()], np.column_stack([lo, hi]), rtol=1e-12)
    alts = [a for a in doc["alternatives"] if a["within_budget"] and a["role"] != "cheapest"]
    proxy = [a for a in plan(digits_workload, "bitfusion", "65%", top=400).to_json()["alternatives"]
             if a["within_budget"] and a["role"] != "cheapest"]
    assert len(alts) == len(proxy) == 400
    n_out, preds = 0, []
    for a, b in zip(alts, proxy):
        bits = parse_schedule(a["schedule"]).bits(T)
        x = np.array([a["score"], a["mean_bits"], a["bitops"] / base, (bits > q_floor).mean()])
        inside = bool(np.all((x >= lo - 1e-9) & (x <= hi + 1e-9)))
        assert a["extrapolated"] is (not inside), a["schedule"]
        if inside:
            assert a["predicted_acc"] is not None and a["predicted_std"] > 0
            preds.append(a["predicted_acc"])
        else:
            n_out += 1
            assert a["predicted_acc"] is None and a["predicted_std"] is None
            assert a["schedule"] == b["schedule"]  # the place the proxy gives it
    assert n_out > 0 and len(preds) > 0
    assert preds == sorted(preds, reverse=True)  # the model orders the ones inside
    assert q["extrapolated"] >= n_out and q["in_range"] >= len(preds)
    assert any("outside the range the model was measured over" in n and "keep the proxy score's ranking" in n
               for n in doc["notes"])


def test_quality_db_ranks_by_the_proxy_when_every_candidate_is_outside_the_measured_range(digits_workload,
                                                                                         tmp_path):
    """Issue 22 item 2, the issue's own case: runs of one mean-bits level (forward bits 2-4, mean 3) say nothing
    about schedules of a 3-8 space: the model must not rank them (it did: static:8 at 0.9998 +- 0.676)."""
    from cptsim.planner import plan
    from cptsim.planner.quality import measured_workload
    from cptsim.planner.space import parse_space
    from cptsim.study.results import ResultsDB, workload_key

    wl = measured_workload(digits_workload)
    texts = ["cos-rep:2-4:g8:n1", "cos-rep:2-4:g8:n8", "cos-rep:2-4:g8:n32", "lin-tri:2-4:g8:n1",
             "lin-tri:2-4:g8:n8", "cos-tri:2-4:g8:n4", "lin-rep:2-4:g8:n8"]
    db = tmp_path / "r.db"
    with ResultsDB(db) as r:
        for i, t in enumerate(texts):
            for seed in (0, 1):
                r.add_run({"workload_key": workload_key(wl), "workload": wl, "schedule": t, "seed": seed,
                           "steps": wl["steps"], "test_acc": 0.9, "val_acc": 0.9 + 0.005 * i + 0.001 * seed,
                           "val_size": 287, "source": "sweep", "run_path": f"/fake/{t}-{seed}"})
    space = parse_space(None, None, "3", "8", "8", None, None)
    p = plan(digits_workload, "bitfusion", "65%", space, quality="db", db=str(db), evidence=LocalEvidence())
    q = p.to_json()["quality"]
    assert p.ranking == "proxy" and q["fallback"] == "proxy"
    assert q["feature_range"]["mean_bits"][1] - q["feature_range"]["mean_bits"][0] < 0.05
    assert q["in_range"] == 0 and q["extrapolated"] > 0
    assert p.schedule == plan(digits_workload, "bitfusion", "65%", space).schedule
    assert any("every one of the" in n and "ranked by the proxy score instead" in n for n in p.notes)
    assert all("predicted_acc" not in a for a in p.to_json()["alternatives"])


# -- evaluation at the precision it reports ----------------------------------------------------------------------------


def test_recalibration_sets_batchnorm_statistics_to_those_of_the_evaluation_bits():
    """After recalibrate, BN running stats are the plain average over the recal batches of the batch statistics the
    model produces at the evaluation bits -- computed here independently with forward hooks on a copy."""
    import copy

    from cptsim.run.train import TrainConfig, build, recalibrate

    cfg = TrainConfig(schedule="lin-tri:2-8:g8:n1", epochs=1, recal_batches=3)
    w = build(cfg)
    w.precision.set(2, 8)  # pretend training ended at 2 bits: statistics of 2-bit activations
    w.model.train()
    with torch.no_grad():
        for x, _ in torch.utils.data.DataLoader(w.train_set, batch_size=64):
            w.model(x)
    ref = copy.deepcopy(w.model)
    bns = [(n, m) for n, m in ref.named_modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns
    seen = {n: [] for n, _ in bns}
    hooks = [m.register_forward_hook(lambda mod, inp, out, n=n: seen[n].append(inp[0].detach()))
             for n, m in bns]
    order = torch.randperm(len(w.train_set), generator=torch.Generator().manual_seed(cfg.seed * 7_919 + 0 + 1))
    ref.train()
    next(m for m in ref.modules() if hasattr(m, "precision")).precision.set(8, 8)  # the copy has its own state
    for m in ref.modules():
        if hasattr(m, "act_count"):
            m.act_count.zero_()
    with torch.no_grad():
        for i in range(3):
            x = torch.stack([w.train_set[j][0] for j in order[i * 64:(i + 1) * 64].tolist()])
            ref(x)
    for h in hooks:
        h.remove()

    rng_before = torch.get_rng_state()
    info = recalibrate(w, cfg, epoch=0, device="cpu")
    assert torch.equal(torch.get_rng_state(), rng_before)  # training draws the same numbers afterwards
    assert info["batches"] == 3 and info["samples"] == 192
    mods = dict(w.model.named_modules())
    for n, _ in bns:
        expect = torch.stack([t.mean(dim=(0, 2, 3)) for t in seen[n]]).mean(0)
        assert torch.allclose(mods[n].running_mean, expect, atol=1e-5), n
        assert mods[n].momentum == 0.1  # restored after the cumulative average


def test_a_schedule_ending_low_is_evaluated_with_statistics_of_the_evaluation_bits(tmp_path):
    """The issue's failure, end to end on digits: a one-cycle triangular schedule ends at 2 bits; evaluated at 8 bits
    with its 2-bit statistics it scores far below the same weights evaluated after re-estimation."""
    from cptsim.run.train import TrainConfig, train

    accs = {}
    for recal in (0, 16):
        run = train(TrainConfig(schedule="lin-tri:2-8:g8:n1", epochs=3, recal_batches=recal), str(tmp_path / f"r{recal}"),
                    progress=False)
        accs[recal] = run.read_metrics().records[-1]["test_acc"]
    assert accs[16] >= 0.9 and accs[16] > accs[0]


def test_the_mnist_shaped_workload_gets_a_pick_evaluated_at_its_own_precision():
    """Issue 9's workload, shapes and --dataset-size only: digits-cnn, MNIST 8,000 images, batch 64, 3 epochs,
    budget = CPT's default cos-rep:3-8:g8:n32, space 3-8 / g8. The pick is evaluated with statistics re-estimated
    at its evaluation bits, and the plan says so."""
    from cptsim.planner import Workload, plan
    from cptsim.planner.space import parse_space
    from cptsim.run.train import TrainConfig

    w = Workload.build(dataset="mnist", dataset_size=8000, epochs=3, batch_size=64)
    assert w.steps == 3 * 125
    cpt = parse_schedule("cos-rep:3-8:g8:n32")
    budget = w.estimate(cpt, "bitfusion").bitops["total"]
    p = plan(w, "bitfusion", f"{budget}bitops", parse_space(None, None, "3", "8", "8", None, None))
    doc = p.to_json()
    ev = doc["evaluation"]
    assert ev["bits"] == p.schedule.q_max and ev["recal_batches"] > 0
    cfg = TrainConfig.from_plan(doc)
    assert cfg.recal_batches == ev["recal_batches"] and cfg.eval_bits in (None, p.schedule.q_max)
    final = int(p.schedule.bits(w.steps)[-1])
    assert ev["final_bits"] == final  # the run's own last step, not a stand-in length
    # either the pick ends at the precision it is evaluated at, or its statistics are re-estimated there
    assert final == ev["bits"] or cfg.recal_batches > 0
    assert doc["estimate"]["bitops"]["total"] <= budget


# -- the shipped measurements ------------------------------------------------------------------------------------------


def _shipped(workload_filter):
    if not SHIPPED_DB.exists():
        pytest.skip("benchmarks/results/quality-digits.db not present")
    from cptsim.study.results import ResultsDB

    with ResultsDB(SHIPPED_DB) as db:
        rows = [r for r in db.rows(source="sweep") if workload_filter(r["workload"])]
    by: dict[str, list[float]] = {}
    steps = {}
    for r in rows:
        by.setdefault(r["schedule"], []).append(r["test_acc"])
        steps[r["schedule"]] = r["steps"]
    return by, steps


def test_shipped_runs_rank_like_the_score():
    """Spearman between the shipped score and measured mean accuracy over the equal-cost set (>= 10 schedules)."""
    from scipy.stats import spearmanr

    by, steps = _shipped(lambda w: w["steps"] == 69)  # digits-cnn, 3 epochs: the bits 2-4 study
    names = [n for n in by if len(by[n]) >= 3]  # 14 schedules, all within 71.6-72.9% of static 4's BitOPs
    assert len(names) >= 10
    score = [score_bits(parse_schedule(n).bits(steps[n]), parse_schedule(n).grad_bits(steps[n])) for n in names]
    rho = spearmanr(score, [np.mean(by[n]) for n in names])[0]
    assert rho >= 0.5


def test_shipped_runs_the_pick_is_at_least_as_good_as_cpt_default():
    """The planner's pick at CPT default's cost: mean accuracy >= CPT default's mean minus one std (3 seeds)."""
    from cptsim.planner import Workload, plan
    from cptsim.planner.space import parse_space

    by, _ = _shipped(lambda w: w["steps"] == 69)
    w = Workload.build(epochs=3)  # digits-cnn on digits, batch 64: the workload of the shipped runs
    budget = w.estimate(parse_schedule("cos-rep:2-4:g8:n32"), "bitfusion").bitops["total"]
    p = plan(w, "bitfusion", f"{budget}bitops", parse_space(None, None, "2", "4", "8", None, None))
    pick, cpt = by[p.schedule.to_text()], by["cos-rep:2-4:g8:n32"]
    assert len(pick) >= 3 and len(cpt) >= 3
    assert np.mean(pick) >= np.mean(cpt) - np.std(cpt, ddof=1)
    assert math.isfinite(np.mean(pick))


def test_recalibration_reads_the_training_images_as_evaluation_does_not_augmented(tmp_path):
    """Issue 22 item 8: BatchNorm statistics were re-estimated on augmented batches -- for ImageNet-style
    augmentation, random resized crops, whose statistics are not those of the centre crops evaluated. They come
    from the un-augmented view now: the same statistics whatever the generators' state, equal to those of the
    evaluation transforms of the same images (a validation split held out too)."""
    import numpy as np
    from PIL import Image

    from cptsim.data import load_datasets
    from cptsim.run.train import TrainConfig, build, recalibrate

    rng = np.random.default_rng(0)
    for split, n in (("train", 12), ("val", 2)):
        for c in ("a", "b"):
            (tmp_path / split / c).mkdir(parents=True)
            for i in range(n):
                img = rng.integers(0, 256, (80, 96, 3), dtype=np.uint8)
                img[:, :48] //= 4  # a dark left half: where a crop falls changes the statistics
                Image.fromarray(img).save(tmp_path / split / c / f"{i}.png")
    cfg = TrainConfig(model="resnet20", dataset="imagefolder", data_dir=str(tmp_path), image_size=72,
                      schedule="static:8:g8", steps=1, batch_size=4, recal_batches=100, val_split=0.25)
    w = build(cfg)  # 72 > 64: ImageNet's recipe (RandomResizedCrop) for training, resize + centre crop for eval
    stats = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        recalibrate(w, cfg, epoch=0, device="cpu")
        bn = next(m for m in w.model.modules() if isinstance(m, nn.BatchNorm2d))
        stats.append((bn.running_mean.clone(), bn.running_var.clone()))
    assert torch.equal(stats[0][0], stats[1][0]) and torch.equal(stats[0][1], stats[1][1])
    # the samples it read are the evaluation transforms of the training images it kept
    plain = load_datasets("imagefolder", tmp_path, augment=False, image_size=72)[0]
    kept = w.train_set.indices
    assert len(kept) == 18 and len(w.recal_set) == 18
    for j in (0, 7, 17):
        assert torch.equal(w.recal_set[j][0], plain[kept[j]][0])

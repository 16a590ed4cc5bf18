"""--quality db on the digits per-layer evidence runs (issue 27): leave-one-schedule-out Spearman of the quality model
with and without the above_floor feature, its layers weighted by forward MACs and by loss sensitivity, and each
measured plan's in-sample prediction against its validation accuracy.

    .venv/bin/python benchmarks/bench_perlayer_quality.py OUT

OUT: the --out of `benchmarks/bench_perlayer_evidence.py --workload digits` (its results.db and plan-bitops-loss.json).
"""
import json, sys, numpy as np
from cptsim.planner import Workload
from cptsim.planner.quality import load_measurements, measured_features, fit_quality
from cptsim.study.evidence import LocalEvidence
from cptsim.cost.schedules import parse_schedule
out = sys.argv[1]
w = Workload.build("digits-cnn", dataset="digits", steps=80)
m = load_measurements(w, f"{out}/results.db", LocalEvidence())
base = w.estimate(parse_schedule("static:4:g8"), None).bitops["total"]
wts = json.load(open(f"{out}/plan-bitops-loss.json"))["per_layer"]["weights"]
print("runs", len(m.values), "plans", len(set(m.entries)), "per-layer runs", sum(x is not None for x in m.layers))
for label, ww in (("MAC", None), ("loss-sens", wts)):
    X, floor, left = measured_features(m, w, None, base, ww)
    for k, name in ((3, "3 features"), (4, "4 features (+above_floor)")):
        mod = fit_quality(m.entries, X[:, :k], np.array(m.values))
        print(f"{label:9s} {name:26s} LOO {mod.loo_spearman:.2f} coef {np.round(mod.coef[1:], 4)}")
    mod = fit_quality(m.entries, X, np.array(m.values))
    mean, _ = mod.predict(X)
    seen = set()
    for e, p in zip(m.entries, mean):
        if e in seen: continue
        seen.add(e)
        v = [x for ee, x in zip(m.entries, m.values) if ee == e]
        print(f"   {e[:44]:44s} val {100*np.mean(v):6.2f}  pred {100*p:6.2f}  feats {np.round(X[m.entries.index(e)], 3)}")

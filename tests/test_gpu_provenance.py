"""Every shipped GPU constant says what it was identified on, and none was identified on one network.

A constant fitted to one network's step absorbs whatever that network does that the model does not (h100's
kernel_overhead_us, once fitted on CIFAR ResNet-20's graphed step alone, stood in for its narrow convolutions and
priced every small-kernel step on an H100 slower than on a T4). So each GPU profile's ``sources`` carries one
provenance entry per constant it sets, in a form this test reads:

    "constant KEY[, KEY...]: EVIDENCE - what, where"

EVIDENCE is one of

* ``microbenchmark`` -- measured by a kernel-level microbenchmark (a GEMM per tier, a dispatch loop, a power loop);
* ``kernels N`` -- fitted or measured over N >= 2 kernels (traced calls or microbenchmark shapes);
* ``networks N`` -- fitted over N >= 2 networks;
* ``published`` -- a cited published figure;
* ``identity`` -- the value that changes nothing: 1.0 for a factor, 0 for an added term (its value is checked);
* ``inherited PROFILE`` -- PROFILE's value for the same key (checked equal), whose own provenance must pass;
* ``assumed`` -- stated as an assumption, allowed only in a profile whose times are unchecked (no [validation]).

The keys are every key of the file's [calibration] table, and ``efficiency`` where a tier sets one.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from cptsim.cost.hardware import list_profiles, load_profile

ENTRY = re.compile(r"^constant (?P<keys>[a-z0-9_]+(?:, [a-z0-9_]+)*): (?P<ev>microbenchmark|kernels (?P<k>\d+)|"
                   r"networks (?P<n>\d+)|published|identity|inherited (?P<p>[A-Za-z0-9_.-]+)|assumed) - (?P<text>.+)$",
                   re.S)
GPUS = sorted(n for n in list_profiles() if load_profile(n).kind == "gpu")


def file_keys(name: str) -> dict:
    """{key: value} the profile's file itself sets: its [calibration] keys, and ``efficiency`` (the tiers' list)."""
    doc = tomllib.loads(Path(load_profile(name).path).read_text())
    keys = dict(doc.get("calibration", {}))
    effs = [t["efficiency"] for t in doc["gpu"]["tiers"] if "efficiency" in t]
    if effs:
        keys["efficiency"] = effs
    return keys


def provenance(name: str, override: dict | None = None) -> dict:
    """{key: match} of the profile's provenance entries (its sources, or ``override[name]``); a key given twice, or a
    malformed entry, fails."""
    out = {}
    for s in (override or {}).get(name, load_profile(name).sources):
        if not s.startswith("constant "):
            continue
        m = ENTRY.match(s)
        assert m, f"{name}: provenance entry not in the form 'constant KEYS: EVIDENCE - text': {s[:120]!r}"
        for k in m["keys"].split(", "):
            assert k not in out, f"{name}: {k} has two provenance entries"
            out[k] = m
    return out


def problems(name: str, key: str, seen=(), override: dict | None = None) -> list[str]:
    """Why ``key``'s provenance in profile ``name`` does not hold (empty: it holds), following inheritance;
    ``override``: {profile: sources} read instead of the shipped ones."""
    if (name, key) in seen:
        return [f"{name}.{key}: inheritance loops"]
    prov = provenance(name, override)
    if key not in prov:
        return [f"{name}.{key}: no provenance entry"]
    m = prov[key]
    ev = m["ev"]
    value = file_keys(name).get(key)
    if ev.startswith(("kernels", "networks")):
        count = int(m["k"] or m["n"])
        if count < 2:
            return [f"{name}.{key}: identified on {count} {'kernel' if m['k'] else 'network'} only"]
    elif ev == "identity":
        vals = value if isinstance(value, list) else [value]
        if not (all(v == 1.0 for v in vals) or all(v == 0.0 for v in vals)):
            return [f"{name}.{key}: 'identity' but its value is {value}"]
    elif ev == "assumed":
        if load_profile(name).validation:
            return [f"{name}.{key}: an assumption in a profile whose times are said checked ([validation])"]
    elif ev.startswith("inherited"):
        src = m["p"]
        if src not in GPUS:
            return [f"{name}.{key}: inherited from {src!r}, which is no shipped GPU profile"]
        theirs = file_keys(src).get(key)
        if key != "efficiency" and value is not None and theirs is not None and \
                not value == pytest.approx(theirs, rel=1e-3):
            return [f"{name}.{key} = {value}: inherited from {src}, whose value is {theirs}"]
        return problems(src, key, (*seen, (name, key)), override)
    return []


@pytest.mark.parametrize("name", GPUS)
def test_every_shipped_gpu_constant_names_evidence_beyond_one_network(name):
    keys = file_keys(name)
    prov = provenance(name)
    bad = [p for k in keys for p in problems(name, k)]
    stale = sorted(set(prov) - set(keys))
    assert not bad, bad
    assert not stale, f"{name}: provenance for keys the file does not set: {stale}"


def test_the_check_fails_a_constant_fitted_on_one_network():
    """The rule bites: an entry naming one network, or no entry, is refused -- also through inheritance."""
    h100 = load_profile("h100").sources
    one = [s if not s.startswith("constant kernel_overhead_us") else
           "constant kernel_overhead_us: networks 1 - CIFAR ResNet-20's graphed step" for s in h100]
    assert problems("h100", "kernel_overhead_us", override={"h100": one}) == [
        "h100.kernel_overhead_us: identified on 1 network only"]
    assert problems("a100", "kernel_overhead_us", override={"h100": one}) == [
        "h100.kernel_overhead_us: identified on 1 network only"]
    none = [s for s in h100 if not s.startswith("constant kernel_overhead_us")]
    assert problems("h100", "kernel_overhead_us", override={"h100": none}) == [
        "h100.kernel_overhead_us: no provenance entry"]


def test_no_calibration_comment_contradicts_the_launch_constant():
    """The launch time was once said "5 us as before (not identifiable)" beside a 14.17 fitted on one network."""
    for name in GPUS:
        text = Path(load_profile(name).path).read_text()
        assert "as before (not identifiable" not in text, name


# --------------------------------------------------------------------------------------------------------------
# The data behind the evidence. Every constant a profile says it measured or fitted on the shipped measurements
# (benchmarks/results/: the lent H100's microbenchmarks, heldout run and kernel traces) is recomputed from those
# measurements here, by the scripts' own functions, and compared with the value its file writes, to the digits it
# writes it with; or it is re-fitted by tests/test_gpu_fit.py (named below, with the fit that re-runs it); or it is
# said here why it cannot be (a value kept from a fit the model no longer runs). The counts the provenance declares
# ("kernels 366", "networks 13") are counted in the same data.

import json  # noqa: E402
import sys  # noqa: E402
from types import SimpleNamespace  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))

MEASURED = ("microbenchmark", "kernels", "networks")  # the evidence that names data

# (profile, key) -> (test in tests/test_gpu_fit.py that re-runs its fit, the fit's tuple in fit_gpu_model.py)
REFITTED = {
    **{("h100", k): ("test_the_hopper_constants_are_the_fit_on_the_h100_measurements", "HOPPER_NETWORK")
       for k in ("memory_efficiency", "nchw_conv_factor", "norm_memory_efficiency")},
    **{(p, k): ("test_the_gemm_shape_constants_are_the_fit_on_the_h100s_gemm_microbenchmarks", "SHAPE_FIT")
       for p in ("h100", "rtx3090") for k in ("gemm_n0", "gemm_k0")},
    **{("rtx3090", k): ("test_rtx3090s_constants_are_the_fit_on_both_timm_tables", "AMPERE_FIT")
       for k in ("efficiency", "memory_efficiency", "nchw_conv_factor", "nchw_depthwise_factor", "depthwise_efficiency",
                 "depthwise_memory_efficiency", "norm_memory_efficiency")},
}
_KEPT = "kept at its value from the network fit when it priced every NCHW norm; the fit no longer includes it " \
        "(fit_gpu_model.py: batch norms with shapes are priced by shape), so no data gives it again"
NOT_RECOMPUTABLE = {("h100", "nchw_norm_elements_per_clock"): _KEPT, ("rtx3090", "nchw_norm_elements_per_clock"): _KEPT,
                    ("rtx3090", "nchw_norm_factor"): _KEPT}


@pytest.fixture(scope="module")
def data():
    """The shipped measurements and what the fitting scripts make of them (a few seconds, once)."""
    import bench_gpu_optrace as BO
    import fit_gpu_model as FG

    from cptsim.calibration import gpu_fit as F

    micro = json.loads(FG.H100_RUNS[0].read_text())
    heldout = json.loads((FG.HERE.parent / "results" / "gpu-heldout-H100-run1.json").read_text())
    traces = FG.load_traces()
    profs = FG.profiles()
    h100 = load_profile("h100")
    gemm_rows = [r for r in F.kernel_rows(micro, min_us=40) if r["label"].startswith("gemm")
                 and "4097" not in r["label"]]
    dw_rows = [r for r in F.kernel_rows(micro, min_us=0) if r["label"].startswith("conv dw")]
    # the depthwise fit as fit_gpu_model.py runs it: the measured tiers and shape constants, kernels at the stream rate
    shape = {k: h100.calibration[k] for k in FG.SHAPE_FIT}
    kern = F.with_values(h100, {"memory_efficiency": FG.STREAM_EFFICIENCY, **shape})
    dw = F.fit_kernels(kern, dw_rows, FG.HOPPER_DEPTHWISE)
    floor = FG.kernel_floor_us(traces)
    calls = FG.conv_calls(traces)
    transform = FG.fit_transform(F.with_values(kern, {**dw, "nchw_transform_bytes": 0.0}), calls, floor["us"] * 1e-6)
    census = FG.conv_tile_census(traces)
    bn = BO.fit(BO.load_traces())
    return SimpleNamespace(FG=FG, micro=micro, heldout=heldout, profs=profs, gemm_rows=gemm_rows, dw_rows=dw_rows,
                           dw=dw, floor=floor, kpl=FG.kernels_per_launch(traces, profs), calls=calls,
                           transform=transform, census=census, bn=bn,
                           rtx3090_rows=FG.rtx3090_rows(FG.profiles_pt112()))


def _gemm_tflops(records: list, dtype: str) -> float:
    """The large-GEMM rate: the 8192^3 record of ``dtype``."""
    (r,) = [r for r in records if r["dtype"] == dtype and r["M"] == r["N"] == r["K"] == 8192]
    return r["tflops"]


def _bn(d) -> dict:
    return {"nchw_norm_rows_per_clock": d.bn["forward"]["rows_per_clock"],
            "nchw_norm_backward_rows_per_clock": d.bn["backward"]["rows_per_clock"],
            "nchw_norm_channels_per_sm": d.bn["channels_per_sm"]}


def recomputed(name: str, d) -> dict:
    """{key: value} of profile ``name``'s measured constants, from the data (``efficiency``: one per tier)."""
    p = load_profile(name)
    if name == "rtx3090":
        return _bn(d)
    assert name == "h100", name
    tiers = {t["name"]: t for t in p.params["tiers"]}
    eff = {"fp16": _gemm_tflops(d.micro["gemm"], "fp16"), "tf32": _gemm_tflops(d.micro["gemm"], "tf32"),
           "fp32": _gemm_tflops(d.micro["gemm"], "fp32"), "fp8": _gemm_tflops(d.heldout["fp8"], "fp8")}
    eff = {k: v / tiers[k]["peak_ops"] for k, v in eff.items()}
    eff["int8"] = eff["fp16"]  # the file's stated assumption: torch's _int_mm is not the tuned path; int8 takes fp16's
    return {"efficiency": [eff[t["name"]] for t in p.params["tiers"]],
            "host_overhead_us": d.micro["launch"][0]["eager_host_us_per_kernel"],
            "power_fraction": d.micro["energy"]["train_loop"]["mean_power_w"] / p.params["power_w"],
            "kernel_overhead_us": d.floor["us"] * d.kpl["ratio"],
            **_bn(d), **d.dw, "nchw_transform_bytes": d.transform,
            "conv_n_tile": max(d.census, key=d.census.get),
            "conv_k_tile_bytes": 16 * 2}  # one FP16 m16n8k16 MMA's reduction depth: 16 channels of 2 bytes


def written(name: str, key: str) -> list[str]:
    """The value(s) of ``key`` as the file writes them (``efficiency``: each tier's, in order)."""
    text = Path(load_profile(name).path).read_text()
    if key == "efficiency":
        return re.findall(r"^\s*\{ name = \"[^\"]+\".*?efficiency = ([0-9.]+)", text, re.M)
    return re.findall(rf"^{key}\s*=\s*([0-9.eE+-]+)", text, re.M)


def mismatch(value: float, text: str) -> str | None:
    """Why ``value`` is not what ``text`` writes to its digits (half a unit of its last decimal), or None."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    if abs(value - float(text)) <= 0.5 * 10 ** -decimals * (1 + 1e-9):
        return None
    return f"the data give {value:.6g}, the file writes {text}"


def test_every_constant_measured_on_data_is_recomputed_refitted_or_said_why_not():
    keys = {(n, k) for n in GPUS for k, m in provenance(n).items() if m["ev"].split()[0] in MEASURED}
    assert keys, "no constant names measured evidence"
    fit_source = (REPO / "tests" / "test_gpu_fit.py").read_text()
    from fit_gpu_model import AMPERE_FIT, HOPPER_NETWORK, SHAPE_FIT

    fits = {"HOPPER_NETWORK": HOPPER_NETWORK, "SHAPE_FIT": SHAPE_FIT, "AMPERE_FIT": AMPERE_FIT}
    for n, k in sorted(keys):
        if (n, k) in REFITTED:
            test, fit = REFITTED[(n, k)]
            assert f"def {test}(" in fit_source and fit in fit_source.split(f"def {test}(")[1].split("\ndef ")[0]
            assert (k if k != "efficiency" else "tier:fp16") in fits[fit], (n, k, fit)
        elif (n, k) not in NOT_RECOMPUTABLE:
            assert n in ("h100", "rtx3090"), f"{n}.{k}: measured evidence, but nothing here recomputes it"
    assert set(REFITTED) | set(NOT_RECOMPUTABLE) <= keys  # nothing listed that the files no longer declare


@pytest.mark.parametrize("name", ["h100", "rtx3090"])
def test_each_measured_constant_is_what_its_data_give(name, data):
    mine = recomputed(name, data)
    declared = {k for k, m in provenance(name).items() if m["ev"].split()[0] in MEASURED}
    assert declared - set(mine) <= {k for n, k in REFITTED if n == name} | {k for n, k in NOT_RECOMPUTABLE
                                                                             if n == name}
    bad = []
    for key, value in mine.items():
        texts = written(name, key)
        values = value if isinstance(value, list) else [value]
        assert len(texts) == len(values), (name, key, texts)
        bad += [f"{name}.{key}: {why}" for v, t in zip(values, texts) if (why := mismatch(v, t))]
    assert not bad, bad


def _counted(name: str, key: str, d) -> int | None:
    """What the data count for the evidence of ``key`` ("kernels N" / "networks N"); None: not counted here."""
    fitted = {"nchw_norm_rows_per_clock", "nchw_norm_backward_rows_per_clock", "nchw_norm_channels_per_sm"}
    if key in fitted:
        return sum(d.bn[ph]["calls"] for ph in ("forward", "backward"))
    if key in ("gemm_n0", "gemm_k0"):
        return len(d.gemm_rows)
    if name == "h100":
        return {"nchw_depthwise_factor": len(d.dw_rows), "depthwise_efficiency": len(d.dw_rows),
                "depthwise_memory_efficiency": len(d.dw_rows),
                "nchw_transform_bytes": sum(1 for c in d.calls if not c["channels_last"] and c["taps"] > 1
                                            and d.FG.aligned(c)),
                "conv_n_tile": sum(d.census.values()), "conv_k_tile_bytes": sum(d.census.values()),
                "kernel_overhead_us": d.floor["kernels"],
                **{k: len({r.model for r in d.FG.h100_rows(d.profs)}) for k in
                   ("memory_efficiency", "nchw_conv_factor", "norm_memory_efficiency",
                    "nchw_norm_elements_per_clock")}}.get(key)
    if name == "rtx3090":
        return len({r.model for r in d.rtx3090_rows})
    return None


@pytest.mark.parametrize("name", ["h100", "rtx3090"])
def test_the_counts_the_provenance_declares_are_the_datas(name, data):
    bad = []
    for key, m in provenance(name).items():
        if m["k"] or m["n"]:
            n = _counted(name, key, data)
            assert n is not None, f"{name}.{key}: declares {m['ev']}, counted nowhere here"
            if n != int(m["k"] or m["n"]):
                bad.append(f"{name}.{key}: declares {m['ev']}, the data hold {n}")
    assert not bad, bad


def test_the_data_check_bites():
    """A value one unit of its last written digit off, or written more finely than the data support, is refused."""
    assert mismatch(0.74024, "0.740") is None and mismatch(0.71539, "0.715") is None
    assert mismatch(0.71539, "0.716") and mismatch(0.69302, "0.714") and mismatch(2.795, "2.7")
    assert mismatch(2.795, "2.8") is None
    assert mismatch(64, "64") is None and mismatch(64, "32")

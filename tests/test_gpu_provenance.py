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

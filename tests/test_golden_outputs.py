"""What cptsim prints does not move under a change meant to move nothing (a refactor): `cost --json`, `plan --json`
and `report --json` for fixed workloads on every shipped hardware profile (tests/golden_cases.py) equal the golden
files in tests/data/golden/, made from the code before the refactor -- strings, integers and structure exactly,
floats to 1e-12 relative (room for a reordered sum, none for a changed formula)."""

import json
import math

import pytest

import golden_cases as G

GOLDEN = G.HERE / "data" / "golden"


def _diff(want, got, where="$", out=None, limit=20):
    out = [] if out is None else out
    if len(out) >= limit:
        return out
    if isinstance(want, dict) and isinstance(got, dict):
        for k in sorted(set(want) | set(got)):
            if k not in got or k not in want:
                out.append(f"{where}.{k}: {'missing' if k not in got else 'new'}")
            else:
                _diff(want[k], got[k], f"{where}.{k}", out, limit)
    elif isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            out.append(f"{where}: {len(want)} items, now {len(got)}")
        for i, (a, b) in enumerate(zip(want, got)):
            _diff(a, b, f"{where}[{i}]", out, limit)
    elif isinstance(want, float) or isinstance(got, float):
        if not (isinstance(want, (int, float)) and isinstance(got, (int, float))
                and (want == got or math.isclose(want, got, rel_tol=1e-12, abs_tol=0.0))):
            out.append(f"{where}: {want!r} -> {got!r}")
    elif want != got:
        out.append(f"{where}: {want!r} -> {got!r}")
    return out


@pytest.fixture(autouse=True)
def _fixed_machine(monkeypatch):
    for k, v in G.ENV.items():
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize("name", sorted(G.CASES))
def test_json_output_equals_the_golden_file(name, tmp_path):
    want = json.loads((GOLDEN / f"{name}.json").read_text())
    got = json.loads(json.dumps(G.run_case(name, tmp_path)))  # through JSON, as the golden file went
    bad = _diff(want, got)
    assert not bad, f"{name}: {len(bad)} difference(s) from {GOLDEN / name}.json:\n" + "\n".join(bad)


def test_the_comparison_catches_a_moved_number():
    doc = json.loads((GOLDEN / "cost-digits-cnn-cpt.json").read_text())
    moved = json.loads(json.dumps(doc))
    moved["profiles"][0]["bitops"]["total"] *= 1 + 1e-9
    assert _diff(doc, moved) and not _diff(doc, json.loads(json.dumps(doc)))

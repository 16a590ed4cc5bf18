"""The commands whose --json output must not change under a refactor that is meant to change no number
(tests/test_golden_outputs.py), and how their output is normalised: what a run of the same command on another day
or in another directory legitimately changes (absolute paths, wall times, versions) is dropped, everything else --
every cost, estimate, score, count and label -- is kept.

Regenerate the golden files only when a change is *meant* to move a printed number, and say so in the commit:
    .venv/bin/python tests/golden_cases.py tests/data/golden
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROFILES = sorted(p.stem for p in (HERE.parent / "hw_profiles").glob("*.toml"))
ALL_HW = ",".join(PROFILES)
# profiles that price a float-format (fp8) run: the integer-only accelerators refuse one
FLOAT_HW = ",".join(p for p in PROFILES if p not in ("bitfusion", "stripes", "int8-systolic"))
RUN = HERE / "data" / "pre_layout" / "run"

# name -> cptsim arguments (each prints one JSON document)
CASES = {
    "cost-digits-cnn-cpt": ["cost", "--model", "digits-cnn", "--dataset", "digits", "--schedule", "cpt:3-8:g8:n8",
                            "--steps", "690", "--batch-size", "64", "--hw", ALL_HW],
    "cost-resnet20-cifar10-exp-tri": ["cost", "--model", "resnet20", "--dataset", "cifar10", "--schedule",
                                      "exp-tri-v:4-8:g8:n4", "--steps", "3000", "--batch-size", "128",
                                      "--hw", ALL_HW],
    "cost-lstm-lm-static": ["cost", "--model", "lstm-lm:layers=1,hidden=64", "--dataset", "pydoc-chars",
                            "--schedule", "static:6:g8", "--steps", "200", "--batch-size", "16", "--hw", ALL_HW],
    "cost-transformer-lm-cpt": ["cost", "--model", "transformer-lm:layers=2,width=64,heads=2,context=64",
                                "--dataset", "pydoc-chars", "--schedule", "cos-rep:3-8:g8:n4", "--steps", "120",
                                "--batch-size", "8", "--hw", ALL_HW],
    "cost-gcn-karate-adam": ["cost", "--model", "gcn", "--dataset", "karate", "--schedule", "rex-tri-h:3-8:g8:n2",
                             "--steps", "200", "--optimizer", "adam", "--hw", ALL_HW],
    "cost-mlp-fp8": ["cost", "--model", "mlp", "--dataset", "digits", "--schedule", "static:8:g8", "--steps", "100",
                     "--number-format", "fp", "--hw", FLOAT_HW],
    "plan-digits-latency-bitfusion": ["plan", "--budget", "65%", "--metric", "latency", "--hw", "bitfusion"],
    "plan-digits-energy-h100": ["plan", "--budget", "100%", "--metric", "energy", "--hw", "h100"],
    "plan-digits-bitops-per-layer": ["plan", "--budget", "60%", "--per-layer", "--hw", "stripes"],
    "report-pre-layout-run": ["report", str(RUN), "--hw", ALL_HW, "--no-calibrate", "--no-save"],
}

# the host profile's numbers depend on this machine only through these: the shipped placeholder, not an automatic
# measurement, and the exact int8 path's decision fixed rather than measured
ENV = {"CPTSIM_NO_CALIBRATE": "1", "CPTSIM_EXACT_GEMM": "1"}

# keys whose values differ between two runs of the same command and mean nothing about the numbers
VOLATILE = {"path", "out", "run_path", "created", "created_at", "generated", "generated_at", "written",
            "elapsed_s", "wall_time_s", "search_time_s", "solve_time_s", "time_s_search", "versions", "version",
            "cptsim_version", "torch_version", "hash", "sha256", "content_hash", "plot", "report_json", "seconds",
            "solve_s", "search_s", "elapsed", "time_s", "evaluate_s", "profile_s", "select_s"}
# the solver's own time inside a plan's notes ("MILP optimal, gap 0, 0.005 s")
_SOLVE_TIME = re.compile(r"(MILP [^;]*?, gap [^,]*, )[0-9.e+-]+ s")


def normalise(doc):
    """``doc`` without the volatile keys (anywhere in it) and with this checkout's paths replaced by a marker."""
    root = str(HERE.parent)
    if isinstance(doc, dict):
        return {k: normalise(v) for k, v in doc.items() if k not in VOLATILE}
    if isinstance(doc, list):
        return [normalise(v) for v in doc]
    if isinstance(doc, str):
        return _SOLVE_TIME.sub(r"\1<s>", doc.replace(root, "<repo>"))
    return doc


def run_case(name: str, cwd: Path) -> dict:
    """One case through cptsim's CLI in this process (the plan cases write plan.json into ``cwd``)."""
    from click.testing import CliRunner

    from cptsim.cli.main import cli

    args = list(CASES[name])
    if args[0] == "plan":
        args += ["--out", str(cwd / f"{name}.json")]
    before = os.getcwd()
    os.chdir(cwd)
    try:
        r = CliRunner().invoke(cli, [*args, "--json"])
    finally:
        os.chdir(before)
    if r.exit_code != 0:
        raise AssertionError(f"{name}: exit {r.exit_code}: {r.stderr[-2000:]}")
    return normalise(json.loads(r.stdout))


if __name__ == "__main__":
    import tempfile

    import torch

    torch.set_num_threads(1)
    os.environ.update(ENV)
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("CPTSIM_HOME", tmp)
        for name in (sys.argv[2:] or CASES):
            (out / f"{name}.json").write_text(json.dumps(run_case(name, Path(tmp)), indent=1, sort_keys=True) + "\n")
            print("wrote", out / f"{name}.json")

"""The first report on a fresh machine: its modelled host time against the measured one, for the default runs.

For each default workload -- `cptsim train` (digits-cnn), `cptsim train --model transformer-lm --steps 60` and
`cptsim train --model gcn` -- this trains in a fresh HOME (no kept calibration, no profile of the user's own),
then runs `cptsim report RUN` there, as a newcomer would: the report measures this machine once
(cptsim.calibration.autocal) and models the run's host time with it. Printed per run: the measured host time (sum
of the trace's step times), the modelled one, the error, and what the automatic measurement cost.

    python benchmarks/bench_host_first_report.py                      # the three defaults once (~2 min on 2 cores)
    python benchmarks/bench_host_first_report.py --repeat 3 --json
    python benchmarks/bench_host_first_report.py --compare old=/tmp/old   # also report with another checkout
    python benchmarks/bench_host_first_report.py --same-moment 3     # and the model against steps timed with it

``--compare LABEL=DIR`` (repeatable) reports the very same run directories (same measured steps) with the cptsim
found in DIR too (PYTHONPATH=DIR; DIR holds a ``cptsim`` package with ``cli``, ``planner`` and ``hw_profiles``
inside it, as `git archive COMMIT` extracts with three symlinks added), each in its own copy of the fresh HOME:
the models side by side on one machine under the same load, in turn (the order alternates between rounds).

A shared machine's timings move by 10-30% from minute to minute (the run is measured while it trains, the model's
rates while the report measures): read the spread over ``--repeat``, not one figure. Each run also shows the error
against its typical time, the median step time x its steps, which a few steps slowed by another job's burst do not
move (the report compares the sum).

``--same-moment N`` also checks the model where the load cannot drift between the two sides: this machine's rates
are measured as a report measures them (``autocal.measure_host``), and a default run's training step -- digits-cnn
on 64 digits, transformer-lm on 64 x 64 tokens, built from the registry with the run's defaults on synthetic inputs
-- is timed in N turns, each after a turn of the reference workloads' steps, to which the fixed costs are fitted;
then it is modelled with those (``cost.model.estimate`` of its profile and op list, as a report prices a run).
gcn's step needs torch_geometric and the run's graph: its default run is trained in this process right after a
measurement instead, N times (``gcn_right_after``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cptsim.calibration.calibrate import _cpu_name

DEFAULTS = (
    ("digits-cnn", []),
    ("transformer-lm", ["--model", "transformer-lm", "--steps", "60"]),
    ("gcn", ["--model", "gcn"]),
)


def cptsim(args: list[str], home: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    """`cptsim ARGS` with HOME=home, from ``home`` (not this checkout: `python -m` puts the working directory
    first on the path, where this checkout's cptsim would shadow PYTHONPATH's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CPTSIM_") and k not in ("XDG_CACHE_HOME",
                                                                                            "XDG_CONFIG_HOME")}
    env["HOME"] = str(home)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    else:
        env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, "-m", "cptsim.cli.main", *args], env=env, capture_output=True,
                          text=True, cwd=home)


def first_report(run: Path, home: Path, pythonpath: str | None) -> dict:
    t0 = time.perf_counter()
    p = cptsim(["report", str(run), "--json", "--no-save", "--hw", "h100"], home, pythonpath)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"report failed ({pythonpath or 'this checkout'}):\n{p.stderr[-2000:]}")
    doc = json.loads(p.stdout)
    h = doc["host_time"] if "host_time" in doc else doc["runs"][0]["host_time"]
    m = re.search(r"measured in ([0-9.]+) s", p.stderr)
    typical = typical_time(run)
    return {"measured_s": h["measured_s"], "modelled_s": h["modelled_s"], "error_pct": h["error_pct"],
            "median_step_x_steps_s": typical,
            "error_vs_median_step_pct": (h["modelled_s"] / typical - 1) * 100 if typical else None,
            "calibration_s": float(m.group(1)) if m else None, "report_wall_s": wall, "profile": h.get("path")}


def typical_time(run: Path) -> float:
    """The run's median step time x its steps: its host time without the steps another job's burst slowed."""
    from cptsim.calibration.fit import steady_steps
    from cptsim.run.rundir import RunDir

    steps = RunDir.open(run).read_executed().records
    keep, _ = steady_steps(steps)
    t = [r["time_s"] for r, k in zip(steps, keep) if k]
    return statistics.median(t) * len(t)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="rounds of the three runs (default 1)")
    ap.add_argument("--only", default=None, help="comma-separated labels of DEFAULTS to run")
    ap.add_argument("--compare", action="append", default=[], metavar="LABEL=DIR",
                    help="also report each run with the cptsim in DIR, labelled LABEL (repeatable)")
    ap.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    ap.add_argument("--keep", default=None, help="keep the run directories and homes here")
    ap.add_argument("--same-moment", type=int, default=0, metavar="N",
                    help="also time digits-cnn's and transformer-lm's default steps in N turns between the "
                         "reference workloads' and model them with that measurement (default 0: not)")
    args = ap.parse_args()

    work = Path(args.keep or tempfile.mkdtemp(prefix="cptsim-bench-first-report-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    others = []
    for c in args.compare:
        label, eq, path = c.partition("=")
        if not eq or not label or label == "this" or not Path(path, "cptsim").is_dir():
            raise SystemExit(f"--compare {c!r}: give LABEL=DIR, DIR holding a cptsim package")
        others.append((label, str(Path(path).resolve())))
    rows = []
    say = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr, flush=True))
    for rnd in range(args.repeat):
        for label, train_args in DEFAULTS:
            if only and label not in only:
                continue
            base = work / f"{label}-{rnd}"
            home = base / "home"
            home.mkdir(parents=True)
            say(f"round {rnd + 1}: training {label} in a fresh HOME ...")
            t0 = time.perf_counter()
            p = cptsim(["train", *train_args, "--out", str(base / "run"), "--quiet"], home)
            if p.returncode != 0:
                raise SystemExit(f"train failed:\n{p.stderr[-2000:]}")
            row = {"workload": label, "round": rnd + 1,
                   "command": " ".join(["cptsim train", *train_args]).strip(), "train_wall_s":
                   time.perf_counter() - t0}
            sides = [("this", None)] + others
            if rnd % 2:  # alternate which side reports first: neither always meets the machine's load first
                sides.reverse()
            row["sides"] = {}
            for side, pythonpath in sides:
                h = base / f"home-{side}"
                shutil.copytree(home, h, symlinks=True)
                row["sides"][side] = first_report(base / "run", h, pythonpath)
            rows.append(row)
            say(_line(row))
    same = same_moment(args.same_moment, say) if args.same_moment > 0 else None
    summary = {}
    for label, _ in DEFAULTS:
        sel = [r for r in rows if r["workload"] == label]
        if not sel:
            continue
        summary[label] = {}
        for side in sorted(sel[0]["sides"], key=lambda k: k != "this"):
            e = [r["sides"][side]["error_pct"] for r in sel]
            t = [r["sides"][side]["error_vs_median_step_pct"] for r in sel]
            summary[label][side] = {"error_pct_median": statistics.median(e), "error_pct_range": [min(e), max(e)],
                                    "error_vs_typical_pct_median": statistics.median(t),
                                    "error_vs_typical_pct_range": [min(t), max(t)]}
    result = {"rows": rows, "summary": summary, "compare": dict(others), "same_moment": same,
              "cpu": _cpu_name(), "load_average": os.getloadavg()}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"first report on a fresh HOME, this machine: {_cpu_name()}, {os.cpu_count()} CPUs, load average now "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        for r in rows:
            print(_line(r))
        print("summary: median error over rounds [range]; against the typical time (median step x steps) after /")
        for label, s in summary.items():
            print(f"  {label:15s} " + "   ".join(
                f"{side}: {v['error_pct_median']:+.1f}% [{v['error_pct_range'][0]:+.1f}, {v['error_pct_range'][1]:+.1f}]"
                f" / {v['error_vs_typical_pct_median']:+.1f}% [{v['error_vs_typical_pct_range'][0]:+.1f}, "
                f"{v['error_vs_typical_pct_range'][1]:+.1f}]" for side, v in s.items()))
        if same:
            print(f"same moment: the default steps timed between the reference workloads' ({args.same_moment} "
                  "turns), modelled with that measurement")
            for r in same:
                print(f"  {r['workload']:15s} measured {r['measured_s'] * 1e3:7.2f} ms/step (turns "
                      f"{', '.join(f'{t * 1e3:.1f}' for t in r['turns_s'])})  modelled {r['modelled_s'] * 1e3:7.2f}"
                      f" ms/step  ({r['error_pct']:+.1f}%"
                      + (f", vs typical {r['error_vs_typical_pct']:+.1f}%" if "error_vs_typical_pct" in r else "")
                      + ")")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def same_moment(turns: int, say) -> list[dict]:
    """The defaults' steps against the model, timed between the reference workloads' steps (module docstring)."""
    import torch

    from cptsim.calibration import autocal
    from cptsim.calibration.calibrate import _median_time
    from cptsim.models import create_model

    torch.set_num_threads(1)  # what `cptsim train` picks for these small models on a CPU

    def lm_inputs(net, scale, gen):
        b = 64 * scale
        return torch.randint(103, (b, 64), generator=gen), torch.randint(103, (b, 64), generator=gen)

    defaults = [
        autocal.Reference("digits-cnn", "", lambda: create_model("digits-cnn", num_classes=10, in_channels=1),
                          autocal._dense_inputs(64, (1, 8, 8), 10), 64, (1, 8, 8), ("fc",)),
        autocal.Reference("transformer-lm", "", lambda: create_model("transformer-lm", num_classes=103,
                                                                      input_shape=(64,)), lm_inputs, 64, (64,)),
    ]
    say("same moment: measuring this machine as a report does ...")
    measured = autocal.measure_host("cpu", autocal.AUTO_SECONDS)
    refs = [autocal.prepare_reference(measured, "cpu", r) for r in autocal.REFERENCES]
    runs = [autocal.prepare_reference(measured, "cpu", r) for r in defaults]
    times: dict[str, list[float]] = {r[0].name: [] for r in refs + runs}
    try:
        for _ in range(turns):
            for ref, step, _, _ in refs:
                times[ref.name].append(_median_time(step, 0.1, lambda: None))
            for ref, step, _, _ in runs:
                times[ref.name].append(_median_time(step, 1.0, lambda: None))
    finally:
        for *_, close in refs + runs:
            close()
    # the fixed costs fitted to the reference steps of these very turns (the rates: the measurement's)
    costs = autocal.fit_fixed_costs([autocal.ReferenceStep(ref.name, ref.what, statistics.median(times[ref.name]),
                                                           *parts) for ref, _, parts, _ in refs])
    out = []
    for ref, _, (work, counts), _ in runs:
        modelled = work + sum(costs[k] * counts[k] for k in autocal.FIXED_COSTS)
        t = statistics.median(times[ref.name])
        out.append({"workload": ref.name, "measured_s": t, "turns_s": times[ref.name], "modelled_s": modelled,
                    "error_pct": (modelled / t - 1) * 100})
    out += gcn_right_after(turns, say)
    return out


def gcn_right_after(turns: int, say) -> list[dict]:
    """gcn's default run trained in this process right after this machine is measured as a report measures it, in
    ``turns`` turns, and modelled with that measurement (its own profile and trace, as a report prices it): the
    nearest to a same-moment check a graph step has here (its step needs torch_geometric and the run's graph).
    Steps 3 on (the first allocate); per step, and against the typical step (the median) too."""
    import contextlib
    import importlib.util
    import io
    import tempfile

    import torch

    from cptsim.calibration import autocal
    from cptsim.calibration.calibrate import write_host_profile
    from cptsim.cli.main import cli
    from cptsim.cost.model import estimate
    from cptsim.run.rundir import RunDir
    from cptsim.study.reportmeasure import _exact_on

    if importlib.util.find_spec("torch_geometric") is None:
        return []
    say("same moment: gcn trained right after this machine is measured ...")
    out = []
    for _ in range(turns):
        with tempfile.TemporaryDirectory() as d:
            torch.set_num_threads(1)  # the run's threads (cptsim.run.train.cpu_threads: a small graph), as a report
            _, host = write_host_profile(autocal.measure_host("cpu", autocal.AUTO_SECONDS), Path(d) / "h.toml")
            try:
                with contextlib.redirect_stdout(io.StringIO()):  # (train's summary table)
                    cli(["train", "--model", "gcn", "--quiet", "--out", str(Path(d) / "run")])
            except SystemExit as e:
                if e.code:
                    raise SystemExit(f"gcn's training failed (exit {e.code})") from None
            run = RunDir.open(Path(d) / "run")
            steps = run.read_trace().records[3:]
            host = host.with_exact_gemm(_exact_on(run.read_config()))  # the path the run took, as report does
            modelled = float(estimate(run.read_profile(), steps, host, per_layer=False).latency_s["total"])
            measured = sum(r["time_s"] for r in steps)
            typical = statistics.median(r["time_s"] for r in steps) * len(steps)
            out.append({"workload": "gcn (trained right after)", "measured_s": measured / len(steps),
                        "turns_s": [measured / len(steps)], "modelled_s": modelled / len(steps),
                        "error_pct": (modelled / measured - 1) * 100,
                        "error_vs_typical_pct": (modelled / typical - 1) * 100})
    return out


def _line(r: dict) -> str:
    this = r["sides"]["this"]
    s = (f"{r['workload']:15s} round {r['round']}  `{r['command']}`  measured {this['measured_s']:.2f} s "
         f"(typical {this['median_step_x_steps_s']:.2f} s)")
    for side, c in sorted(r["sides"].items(), key=lambda kv: kv[0] != "this"):
        s += (f"  | {side}: modelled {c['modelled_s']:.2f} s ({c['error_pct']:+.1f}%, vs typical "
              f"{c['error_vs_median_step_pct']:+.1f}%)")
        if c["calibration_s"] is not None:
            s += f", calibration {c['calibration_s']:.1f} s"
    return s


if __name__ == "__main__":
    raise SystemExit(main())

"""`cptsim report`: what a run cost against its plan, and the host estimate against the measured time."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from cptsim.errors import InputError

from .common import check_output_file, emit_json, err, json_option, out, print_table, si, wide_option

_EPILOG = """\b
Examples:
  cptsim report runs/demo                         tables; writes runs/demo/report.json and report.png
  cptsim report runs/a runs/b --plot cmp.png      several runs: comparison table + accuracy-vs-cost plot
  cptsim report runs/demo --hw h100,a100,stripes --json
  cptsim report runs/a --fit --fit-out ~/.config/cptsim/hw_profiles/host-fitted.toml --holdout runs/b

\b
Planned = the plan's estimate (plan.json in the run dir), or the cost model's estimate of a schedule given by
hand. Executed = the trace re-counted with the same cost model. Host time: measured = the sum of the trace's
step times on this machine; modelled = the host profile's estimate (`cptsim hw calibrate`, then --fit).
Energy and latency on other hardware are modelled, never measured: the run did not execute there.
Every saving is against one baseline, named under the table: the plan's (static at its space's q_max, its
gradient bits), or static q_max of the run's own schedule for a run without a plan.
--fit fits the host profile's calibration to every measured step (least squares), writes a new profile to
--fit-out, and predicts each --holdout run with it.
A CUDA run is compared with its GPU's profile (the one config.json names, or --host): per width, as it ran
(fake-quant FP32, integer codes or each layer's tensor-core routes) beside the profile's native tiers, time and
NVML energy; its GPU's row in the target table holds the measurement. --fit on CUDA runs fits that GPU
profile's kernel_overhead_us, memory_efficiency and power_fraction -- only as many as the runs' step kinds
identify (the rest held, and why), and power_fraction only where energy was measured.
"""


def _parse_hw(hw: str | None) -> list[str] | None:
    if hw is None:
        return None
    names = [h.strip() for h in hw.split(",") if h.strip()]
    if not names:
        raise InputError("--hw needs at least one hardware profile name or .toml path")
    from cptsim.cost.hardware import load_profiles

    load_profiles(names)  # each loads, and no profile name comes twice (two rows alike), before any run is read
    return names


def _f(x, fmt="{:.3g}", none="-") -> str:
    return none if x is None else fmt.format(x)


def _pct(x, none="-") -> str:
    return none if x is None else f"{x:+.2f}%"


@click.command("report", epilog=_EPILOG)
@click.argument("run_dirs", nargs=-1, required=True, metavar="RUN_DIR...")
@click.option("--hw", "--hardware", "hw", default=None,
              help="Comma-separated target profiles to model the executed run on "
                   "[default: the plan's hardware, h100, and bitfusion for an integer run (it computes "
                   "integers only)].")
@click.option("--host", "host", default="host", show_default=True,
              help="The profile (name or .toml path) that models the measured step times: a host profile for a CPU "
                   "run (default: this machine, measured once); for a CUDA run a GPU profile (default: the one "
                   "config.json names for the GPU that ran it).")
@click.option("--top", type=int, default=10, show_default=True, help="Layers in the per-layer table.")
@click.option("--plot", "plot_path", default=None,
              help="Also write the plot here: one run's panels, or with several runs the accuracy-vs-cost plot.")
@click.option("--no-save", is_flag=True, help="Do not write report.json / report.png into the run directories.")
@click.option("--fit", is_flag=True, help="Fit the host profile's calibration to the runs' measured step times.")
@click.option("--fit-out", default=None, help="Where --fit writes the fitted host profile (.toml).")
@click.option("--holdout", multiple=True, help="A run to predict with the fitted profile, not fitted on (repeat).")
@click.option("--force", is_flag=True, help="Let --fit-out replace an existing file.")
@click.option("--no-calibrate", is_flag=True,
              help="Model host time with the shipped placeholder host profile instead of measuring this machine "
                   "once (automatic when you have no host profile of your own; see cptsim.calibration.autocal).")
@click.option("--measure-host", "measure_host", type=int, default=0, show_default=True, metavar="N",
              help="Time N steps of the run's model at each of its schedule's widths, static 8 and static 32 "
                   "(alternating, medians) for the measured side of the host-saving table (a CPU run).")
@wide_option
@json_option
def report(run_dirs, hw, host, top, plot_path, no_save, fit, fit_out, holdout, force, no_calibrate, measure_host,
           as_json) -> None:
    """Compare a run's executed cost with its plan, the host estimate with the measured time; plots and fit."""
    from cptsim.study import plots as P
    from cptsim.study import report as R
    from cptsim.run.rundir import REPORT_JSON, REPORT_PNG, RunDir, atomic_write_bytes

    REPORT_ENERGY_PNG = "report-energy.png"  # measured vs modelled GPU energy per epoch (CUDA runs with NVML)

    if top < 0:
        raise InputError(f"--top must be >= 0, got {top}")
    if measure_host < 0:
        raise InputError(f"--measure-host must be >= 0 steps per width, got {measure_host}")
    if (fit_out or holdout) and not fit:
        raise InputError("--fit-out and --holdout go with --fit")
    if fit and not fit_out:
        raise InputError("--fit needs --fit-out PATH.toml: where to write the fitted profile (a host profile for "
                         "CPU runs, a GPU profile for CUDA runs)")
    targets = _parse_hw(hw)
    if plot_path is not None:
        P.require_matplotlib()  # fail before any work
        check_output_file("--plot", plot_path)
    if fit:
        from cptsim.calibration.fit import check_fit_out

        check_fit_out(fit_out, force)

    if host != "host":  # a profile the user named must exist (whether it fits each run: build_report says)
        from cptsim.cost.hardware import load_profile

        load_profile(host)
    reports = [R.build_report(d, targets, host=_host(d, host, no_calibrate), top=top, measure_host=measure_host)
               for d in run_dirs]
    for r in reports:
        for w in r.warnings:
            err.print(f"[yellow]warning:[/] {w}", highlight=False)

    # ---- plots and files --------------------------------------------------------------------------------------
    written: list[str] = []
    can_plot = True
    try:
        P.require_matplotlib()
    except InputError as e:
        can_plot = False
        if not no_save:
            err.print(f"[yellow]warning:[/] no report.png: {e}", highlight=False)
    locks, locked = _lock_runs([r.data["run"]["path"] for r in reports] if not no_save else [])
    for r in reports:
        run = RunDir(r.data["run"]["path"])
        png = P.run_figure(r) if can_plot and (not no_save or (plot_path and len(reports) == 1)) else None
        if not no_save and str(run.path) in locked:
            try:
                run.write_json(REPORT_JSON, R.to_json(r))
                written.append(str(run.path / REPORT_JSON))
                if png is not None:
                    run.write_bytes(REPORT_PNG, png)
                    written.append(str(run.path / REPORT_PNG))
                energy_png = P.energy_figure(r) if can_plot else None  # CUDA runs with NVML energy only
                if energy_png is not None:
                    run.write_bytes(REPORT_ENERGY_PNG, energy_png)
                    written.append(str(run.path / REPORT_ENERGY_PNG))
            except OSError as e:
                err.print(f"[yellow]warning:[/] cannot write the report into {run.path}: {e.strerror or e}")
        if plot_path and len(reports) == 1:
            _write(plot_path, png, atomic_write_bytes)
            written.append(str(plot_path))
    locks.close()
    rows = R.compare(reports) if len(reports) > 1 else None
    if rows and plot_path:
        _write(plot_path, P.comparison_figure(rows), atomic_write_bytes)
        written.append(str(plot_path))

    # ---- calibration fit --------------------------------------------------------------------------------------
    fit_doc = None
    if fit:
        from cptsim.study.reportfit import fit_runs

        fit_doc = fit_runs(run_dirs, holdout, host, fit_out, force)

    if as_json:
        emit_json({"format": R.REPORT_FORMAT, "runs": [R.to_json(r) for r in reports], "comparison": rows,
                   "fit": fit_doc, "files": written})
        return
    for r in reports:
        _print_run(r)
    if rows:
        _print_comparison(rows)
    if fit_doc:
        _print_fit(fit_doc)
    for f in written:
        err.print(f"wrote {f}", highlight=False)


def _host(run_dir, host: str, no_calibrate: bool) -> str:
    """The host profile for one run: this machine measured once (at the run's threads and device) unless the user
    named one, has their own host.toml, or said --no-calibrate (cptsim.calibration.autocal)."""
    from cptsim.calibration.autocal import report_host
    from cptsim.calibration.fit import run_device
    from cptsim.run.rundir import RunDir

    if host == "host" and run_device(RunDir.open(run_dir)).startswith("cuda"):
        return host  # a CUDA run is modelled by its GPU's profile (cptsim.study.reportgpu), nothing to measure here
    return report_host(run_dir, host, calibrate=not no_calibrate,
                       say=lambda s: err.print(s, highlight=False, markup=False))


def _write(path, data: bytes, writer) -> None:
    try:
        writer(Path(path), data)
    except OSError as e:
        raise InputError(f"--plot: cannot write {str(path)!r}: {e.strerror or e}") from None


# ------------------------------------------------------------------------------------------------ tables


R_MODELLED = "modelled (not executed on this hardware)"  # cptsim.study.report.MODELLED (not imported: lazy CLI)


def _print_gpu_time(h) -> None:
    """A CUDA run's measured step times and energy against its GPU's profile (cptsim.study.reportgpu)."""
    g = h["gpu"]
    t = Table(title=f"GPU time: measured on {g['name'] or 'the run GPU (not recorded)'} vs modelled by the "
                    f"{h['profile']} profile, per width (steady steps; {h['warmup_steps_skipped']} warm-up left out)",
              title_justify="left")
    for col in ("bits/grad", "steps", "measured", "modelled", "error", "native", "native error", "native tiers"):
        t.add_column(col, justify="right")
    for w in h["per_width"]:
        tiers = w["native_tiers"]
        t.add_row(f"{w['bits']}/{w['grad_bits']}", str(w["steps"]), f"{w['measured_ms']:.3f} ms",
                  f"{w['modelled_ms']:.3f} ms", _pct(w["error_pct"]), f"{w['native_ms']:.3f} ms",
                  _pct(w["native_error_pct"]), "/".join(tiers.get(p, "-") for p in ("fwd", "dgrad", "wgrad")))
    t.add_row("[bold]all[/bold]", str(sum(w["steps"] for w in h["per_width"])), f"[bold]{h['measured_s']:.4g} s[/bold]",
              f"[bold]{h['modelled_s']:.4g} s[/bold]", f"[bold]{_pct(h['error_pct'])}[/bold]",
              f"{h['native_modelled_s']:.4g} s", _pct(h["native_error_pct"]), "")
    print_table(t, drop=("native tiers", ("native", "native error"), "steps"))
    out.print(f"  ran: {h['ran']}; modelled: the {h['profile']} profile pricing what ran; native: the same widths on "
              "the profile's own tiers (what `cptsim cost` prints: a native low-precision pipeline). Measured: the "
              "mean of the trace's step times per width", highlight=False)
    out.print(f"  GPU profile: {g['why']}", highlight=False)
    if h.get("measured_energy_j") is not None:
        out.print(f"  GPU energy: measured {si(h['measured_energy_j'], 'J')} (NVML, "
                  f"{h.get('measured_avg_power_w', 0):.0f} W average), modelled {si(h['modelled_energy_j'], 'J')} "
                  f"({_pct(h.get('energy_error_pct'))}), native {si(h.get('native_energy_j'), 'J')} "
                  f"({_pct(h.get('native_energy_error_pct'))}); per epoch: "
                  + ", ".join(f"{e['epoch']}: {si(e['measured_energy_j'], 'J')} vs {si(e['modelled_energy_j'], 'J')}"
                              for e in h["per_epoch"][:8]), highlight=False)
    else:
        out.print(f"  GPU energy: {h.get('energy_note')}", highlight=False)
    for n in h["notes"]:
        out.print(f"  note: {n}", highlight=False)


def _lock_runs(paths: list[str]):
    """Take the lock of every run the report writes into (cptsim.run.rundir.RunLock): (an ExitStack holding them, the
    paths locked). A run another process is writing is refused (exit 2, nothing written); one whose lock file
    cannot be made (a read-only place) is reported on without saving, as a failed write always was."""
    from contextlib import ExitStack

    from cptsim.run.rundir import RunLock, RunLocked

    stack, locked = ExitStack(), set()
    for p in paths:
        try:
            stack.enter_context(RunLock.acquire(p))
        except RunLocked as e:
            stack.close()
            raise InputError(f"{e} (cptsim report --no-save reads a run without writing to it)") from None
        except InputError as e:
            err.print(f"[yellow]warning:[/] not writing the report into {p}: {e}", highlight=False)
            continue
        locked.add(p)
    return stack, locked


def _print_run(r) -> None:
    d = r.data
    run, b, h = d["run"], d["bitops"], d["host_time"]
    plan = run["plan"]
    head = (f"[bold]{run['path']}[/bold]: {run['model']} on {run['dataset']}, {run['schedule_label']}; "
            + (f"plan {plan['digest']} (budget {plan['budget']}, hardware {plan['hardware']})" if plan
               else "no plan (schedule given by hand)")
            + f"; {run['steps_done']} of {run['total_steps']} steps"
            + (" [yellow](trace truncated)[/yellow]" if run["trace_truncated"] else ""))
    out.print(head, highlight=False)
    if run.get("resume"):
        out.print(f"  checkpoint: {run['resume']['text']}", style="yellow" if run["resume"]["skipped"] else None,
                  highlight=False, markup=False)

    if b:
        t = Table(title="BitOPs: planned vs executed (hardware-independent)", title_justify="left")
        t.add_column("phase")
        t.add_column("planned", justify="right")
        t.add_column("executed", justify="right")
        t.add_column("difference", justify="right")
        if b["trace_counted"]:
            t.add_column("trace's own count", justify="right")
        for k in ("fwd", "dgrad", "wgrad", "total"):
            cells = [k, si(b["planned"].get(k)), si(b["executed"].get(k)), _pct(b["diff_pct"].get(k))]
            if b["trace_counted"]:
                cells.append(si(b["trace_counted"].get(k)))
            t.add_row(*cells)
        print_table(t, drop=("trace's own count",))
        out.print(f"  planned: {b['planned']['source']}; executed: trace.jsonl re-counted by the same cost model",
                  highlight=False)
        chk = b["trace_check"]
        ok = "[green]within[/green]" if b["within_tolerance"] else "[yellow]outside[/yellow]"
        out.print(f"  executed vs planned: {ok} {b['tolerance_pct']}%"
                  + ("; trace's own counts agree with the re-count" if chk and chk["agrees"] else ""),
                  highlight=False)
        for why in b["reasons"]:
            out.print(f"  - {why}", highlight=False)
        if run.get("number_format"):  # a float run: its widths are nominal, its BitOPs count element bits
            out.print(f"  {run['number_format']['bitops_count']}", highlight=False)

    if h and h.get("kind") == "gpu":
        _print_gpu_time(h)
    elif h:
        t = Table(title=f"host time on this machine: measured vs modelled ({h['profile']} profile"
                        f"{'' if h['calibrated'] else ', PLACEHOLDER numbers: run cptsim hw calibrate'})",
                  title_justify="left")
        t.add_column("epoch", justify="right")
        t.add_column("steps", justify="right")
        t.add_column("measured", justify="right")
        t.add_column("modelled", justify="right")
        t.add_column("error", justify="right")
        t.add_column("wall", justify="right")
        eps = h["per_epoch"]
        shown = eps if len(eps) <= 12 else eps[:5] + [None] + eps[-5:]
        for e in shown:
            if e is None:
                t.add_row("...", "", "", "", "", "")
                continue
            t.add_row(str(e["epoch"]), str(e["steps"]), f"{e['measured_s']:.3f} s", f"{e['modelled_s']:.3f} s",
                      _pct(e["error_pct"]), _f(e["epoch_wall_s"], "{:.2f} s"))
        t.add_row("[bold]all[/bold]", str(sum(e["steps"] for e in eps)), f"[bold]{h['measured_s']:.3f} s[/bold]",
                  f"[bold]{h['modelled_s']:.3f} s[/bold]", f"[bold]{_pct(h['error_pct'])}[/bold]", "")
        print_table(t, drop=("wall", "steps"))
        out.print("  measured: sum of the trace's step times on this machine; modelled: the host profile's estimate "
                  "of the same steps; wall: the epoch's training loop, data loading included, evaluation not (a "
                  "resumed epoch: the time up to its checkpoint and the time after the resume)", highlight=False)
        out.print(f"  median per-step error {_f(h['median_abs_step_error_pct'], '{:.1f}%')}", highlight=False)
        out.print(f"  host time: modelled {h['modelled_s']:.2f} s vs measured {h['measured_s']:.2f} s, error "
                  f"{_pct(h['error_pct'])} (host profile {h['profile']}"
                  f"{'' if h['calibrated'] else ', placeholder numbers'})", highlight=False)
        if h.get("measured_energy_j") is not None:
            out.print(f"  GPU energy: measured {si(h['measured_energy_j'], 'J')} (NVML, "
                      f"{h.get('measured_avg_power_w', 0):.0f} W average), modelled "
                      f"{si(h['modelled_energy_j'], 'J') if h.get('modelled_energy_j') is not None else 'n/a'} "
                      f"({_pct(h.get('energy_error_pct'))}); per epoch: "
                      + ", ".join(f"{e['epoch']}: {si(e['measured_energy_j'], 'J')} vs "
                                  f"{si(e['modelled_energy_j'], 'J') if e.get('modelled_energy_j') is not None else '-'}"
                                  for e in h["per_epoch"][:8]), highlight=False)
        for n in h["notes"]:
            out.print(f"  note: {n}", highlight=False)

    if d["hardware"]:
        ran_here = [x["name"] for x in d["hardware"] if x["label"] != R_MODELLED]
        t = Table(title="target hardware, MODELLED (not executed on this hardware): energy E and latency t"
                        + (f"; {', '.join(ran_here)}: the run's GPU, exec MEASURED there" if ran_here else ""),
                  title_justify="left")
        for col in ("hardware", "kind", "plan from", "E plan", "E exec", "ΔE", "t plan", "t exec", "Δt",
                    "saving plan", "saving exec"):
            t.add_column(col, justify="left" if col in ("hardware", "kind") else "right")

        def saving(vs):
            return (f"{100 * (1 - vs['energy_j']):.1f}/{100 * (1 - vs['latency_s']):.1f}%"
                    if vs and vs.get("energy_j") is not None else "-")

        for x in d["hardware"]:
            pl, ex, df = x["planned"], x["executed"], x["diff_pct"]
            src = "plan.json" if pl["source"] == "plan.json estimate" else "cost model"
            here = x["label"] != R_MODELLED
            t.add_row(x["name"] + (" (measured)" if here else ""), x["kind"], src,
                      si(pl["energy_j"], "J"), si(ex["energy_j"], "J") if ex["energy_j"] is not None else "-",
                      _pct(df["energy_j"]), si(pl["latency_s"], "s"), si(ex["latency_s"], "s"), _pct(df["latency_s"]),
                      saving(x.get("planned_vs_static")),
                      saving(x["vs_static"]))  # the run's GPU: modelled natively, as the plan priced it
        print_table(t, drop=("kind", "plan from", ("E plan", "t plan"), "saving plan", ("ΔE", "Δt")))
        base = d.get("baseline") or {}
        out.print(f"  plan: the plan's own estimate (plan.json), or the cost model's estimate of the planned schedule "
                  f"on that profile; exec: the executed steps; saving E/t: 1 - cost / cost of the same steps at "
                  f"{base.get('label', 'static q_max')} ({base.get('source', '')})", highlight=False)
        for x in d["hardware"]:
            if x["label"] == R_MODELLED:
                continue
            ar, nat, mc = x.get("modelled_as_ran") or {}, x.get("modelled_natively") or {}, \
                x.get("measured_compared") or {}

            def et(f):
                e = "-" if f.get("energy_j") is None else si(f["energy_j"], "J")
                return f"{si(f['latency_s'], 's')} / {e}" if f.get("latency_s") is not None else "-"

            warm = x["executed"]["latency_s"] - mc["latency_s"] if mc.get("latency_s") is not None else None
            out.print(f"  {x['name']} ran the run: exec is MEASURED ({x['executed']['source']}"
                      + (f"; the {nat.get('steps') - ar.get('steps')} warm-up steps took {si(warm, 's')}, which no "
                         "model prices" if warm and nat.get("steps") != ar.get("steps") else "")
                      + f"); over the {ar.get('steps')} steady steps compared above: measured {et(mc)}, modelled as "
                      f"it ran {et(ar)}; modelled natively (all {nat.get('steps')} steps, `cost`'s figure, and the "
                      f"row's saving) {et(nat)}", highlight=False)
        from .timing import sureness_lines

        for x in d["hardware"]:  # how sure each modelled time is, as `cost` says it
            for line in sureness_lines(x["name"], x):
                out.print(f"  {line}", highlight=False, markup=False)  # [validation] is text, not markup

    _print_saving(d.get("host_saving"))

    L = d["layers"]
    if L:
        t = Table(title=f"top {len(L['top'])} of {L['count']} layers by executed BitOPs", title_justify="left")
        for col in ("layer", "type", "bits (fwd / grad)", "BitOPs", "share", "MACs share"):
            t.add_column(col, justify="left" if col in ("layer", "type") else "right")
        for x in L["top"]:
            t.add_row(x["name"], x["type"] or "", f"{x['bits']} / {x['grad_bits']}", si(x["bitops"]),
                      f"{100 * x['share']:.1f}%", f"{100 * x['macs_share']:.1f}%")
        if L["other"]:
            o = L["other"]
            t.add_row(f"({o['layers']} other layers)", "", "", si(o["bitops"]), f"{100 * o['share']:.1f}%", "")
        print_table(t, drop=("MACs share", "type", "bits (fwd / grad)"))

    a = d["accuracy"]
    p = a.get("perplexity")
    if p is not None:  # a language model: perplexity is the measure (token accuracy says little)
        bpc = "" if p["final_bpc"] is None else f", {p['final_bpc']:.3f} bits per character"
        val = "" if p["final_val"] is None else f", validation {p['final_val']:.2f}"
        out.print(f"  perplexity at q_max = {a['eval_bits']} bits (measured, lower is better): final {p['final']:.2f}"
                  f"{bpc}{val}, best {p['best']:.2f} (epoch {p['best_epoch']})", highlight=False)
    elif a["final"] is not None:
        out.print(f"  accuracy at q_max = {a['eval_bits']} bits (measured): final {100 * a['final']:.2f}%, "
                  f"best {100 * a['best']:.2f}% (epoch {a['best_epoch']})", highlight=False)
    else:
        out.print("  accuracy: no evaluation recorded yet", highlight=False)
    out.print("")


def _print_saving(s) -> None:
    """The host-saving table: modelled vs measured saving of the schedule over static 32 and static 8."""
    if not s:
        return
    m = s.get("measured") or {}
    ms = s.get("measured_saving") or {}
    gap = s.get("gap_pts") or {}
    t = Table(title=f"saving of the schedule on this machine: MODELLED ({s['profile']} profile, exact int8 GEMMs "
                    f"{'on' if s['exact_gemm'] else 'off'}"
                    + (f", {100 * s['int8_mac_share']:.0f}% of MACs int8" if s.get("int8_priced") else "")
                    + ") vs MEASURED", title_justify="left")
    for col in ("vs", "model t", "model sav.", "meas. t", "meas. sav.", "gap"):
        t.add_column(col, justify="left" if col == "vs" else "right")
    mo = s["modelled_s"]
    t.add_row("schedule", f"{mo['schedule']:.3f} s", "", _f(m.get("schedule_s"), "{:.3f} s"), "", "")
    for key, label in (("vs_static32", "static 32"), ("vs_static8", "static 8")):
        base = key.split("_")[1]
        t.add_row(label, f"{mo[base]:.3f} s", _f(s["modelled_saving"][key], "{:+.1%}"),
                  _f(m.get(f"{base}_s"), "{:.3f} s"), _f(ms.get(key), "{:+.1%}"),
                  _f(gap.get(key), "{:+.1f} pts"))
    print_table(t)
    if m:
        steps = ", ".join(f"{w}: {v * 1e3:.1f} ms" for w, v in m["step_s"].items())
        out.print(f"  measured per step (bits/grad bits, median of {m['steps_per_width']}): {steps}; the run's own "
                  f"trace {s['measured_trace_s']:.3f} s = {_f(m.get('trace_over_pass'), '{:.2f}')}x the timing "
                  "pass's schedule time", highlight=False)
    spread = m.get("saving_spread") or {}
    if spread:
        out.print("  measured saving: median over the pass's rounds (range "
                  + ", ".join(f"{k[3:].replace('static', 'static ')}: {100 * lo:+.1f}..{100 * hi:+.1f}%"
                              for k, (lo, hi) in spread.items() if lo is not None) + ")", highlight=False)
    gaps = [g for g in gap.values() if g is not None]
    if gaps:
        out.print(f"  gap (measured - modelled saving): {', '.join(f'{g:+.1f}' for g in gap.values() if g is not None)}"
                  " points of %", highlight=False)
    for n in s["notes"]:
        out.print(f"  note: {n}", highlight=False)
    out.print("  saving = 1 - schedule time / static time of the same steps; gap = measured - modelled; fake-quant "
              "steps run every GEMM in FP32, so quantizing saves time here only where the exact path (the CPU "
              "default where int8 measured >= 2x faster here; CPTSIM_EXACT_GEMM=0/1 forces it) runs a quantized Linear layer as int8 (--json: "
              "host_saving.note says more)", highlight=False)


def _print_comparison(rows) -> None:
    t = Table(title="runs compared (accuracy at q_max, measured; cost executed)", title_justify="left")
    # the number format beside the schedule: "static:8" is an integer run in one row and FP8 in the next
    formats = any(r["number_format"] != "int" for r in rows)
    for col in ("run", "model", "schedule", *(("format",) if formats else ()), "steps", "BitOPs", "vs static",
                "time (measured)", "final acc", "best acc"):
        t.add_column(col, justify="left" if col in ("run", "model", "schedule", "format") else "right")
    for r in rows:
        t.add_row(r["run"], r["model"] or "", r["schedule"], *((r["number_format"],) if formats else ()),
                  f"{r['steps_done']}/{r['total_steps']}",
                  si(r["executed_bitops"]), _f(r["relative_to_static"] and 100 * r["relative_to_static"], "{:.1f}%"),
                  _f(r["measured_time_s"], "{:.2f} s"), _f(r["final_acc"] and 100 * r["final_acc"], "{:.2f}%"),
                  _f(r["best_acc"] and 100 * r["best_acc"], "{:.2f}%"))
    print_table(t, drop=("model", "steps", "best acc", "vs static", "time (measured)"))


def _print_gpu_fit(doc) -> None:
    f, b = doc["fitted"], doc["before"]
    out.print(f"[bold]GPU calibration fit[/bold] on {len(doc['fitted_on'])} CUDA run(s) (base profile "
              f"{doc['base']['name']}): " + (", ".join(f"{k} {b[k]:.4g} -> {v:.4g}" for k, v in f.items())
                                              or "nothing fitted"), highlight=False)
    for k, h in doc.get("held", {}).items():
        out.print(f"  held {k} at the base's {h['value']:.4g}: {h['why']}", highlight=False)
    for r in doc["runs"]:
        if r.get("left_out_steps"):
            out.print(f"  {Path(r['run']).name}: {r['left_out_steps']} steady step(s) left out, timed with the "
                      "loop's host work between steps (their trace lines name no GEMM route)", highlight=False)
    rows = ([("fitted", r) for r in doc["runs"]] + [("hold-out", r) for r in doc["holdout"]]
            + [("leave-one-out", r) for r in doc.get("leave_one_out", [])])
    # runs by number, named above the table: a run directory's name can take most of a terminal's width, which
    # left the numbers beside it cut
    key = {}
    for _, r in rows:
        key.setdefault(r["run"], f"#{len(key) + 1}")
    for run, k in key.items():
        out.print(f"  {k} {Path(run).name}", highlight=False)
    t = Table(title="fit quality: modelled vs measured (steady steps)", title_justify="left")
    for col in ("run", "role", "steps", "measured", "modelled", "error", "unfitted", "energy"):
        t.add_column(col, justify="left" if col in ("run", "role") else "right")
    before = {r["run"]: r["error_pct"] for r in doc["runs_before"]}
    for role, r in rows:
        t.add_row(key[r["run"]], role, str(r["steps"]), f"{r['measured_s']:.4g} s", f"{r['modelled_s']:.4g} s",
                  _pct(r["error_pct"]), _pct(r.get("unfitted_error_pct", before.get(r["run"]))),
                  _pct(r.get("energy_error_pct")))
    print_table(t, drop=("steps", "unfitted", "energy"))
    out.print("  measured: sum of the steady steps' times; modelled: the fitted GPU profile pricing them as they ran; "
              "error: modelled vs measured time; unfitted: the base profile's; energy: the fitted profile's energy "
              "error; hold-out / leave-one-out runs were not fitted on", highlight=False)
    out.print(f"  wrote {doc['written']['path']} (profile {doc['written']['name']!r}); use it with "
              f"--host {doc['written']['path']} (a CUDA run) or --hw {doc['written']['path']}", highlight=False)


def _print_fit(doc) -> None:
    if doc.get("kind") == "gpu":
        return _print_gpu_fit(doc)
    f, q = doc["fitted"], doc["fit"]
    out.print(f"[bold]host calibration fit[/bold] on {len(doc['fitted_on'])} run(s), {q['steps']} steps "
              f"(base profile {doc['base_profile']['name']}): compute_efficiency {f['compute_efficiency']:.3g}, "
              f"memory_efficiency {f['memory_efficiency']:.3g}, elementwise {f['elementwise_gelem_s']:.3g} Gelem/s",
              highlight=False)
    t = Table(title="fit quality: modelled vs measured step times", title_justify="left")
    for col in ("run", "role", "steps", "measured", "modelled", "error", "unfitted", "median step", "R²"):
        t.add_column(col, justify="left" if col in ("run", "role") else "right")
    rows = ([("fitted", r) for r in doc["runs"]] + [("hold-out", r) for r in doc["holdout"]]
            + [("leave-one-out", r) for r in doc.get("leave_one_out", [])])
    for role, r in rows:
        t.add_row(Path(r["run"]).name, role, str(r["steps"]), f"{r['measured_s']:.2f} s", f"{r['modelled_s']:.2f} s",
                  _pct(r["total_error_pct"]), _pct(r["base_profile_total_error_pct"]),
                  _f(r["median_abs_step_error_pct"], "{:.1f}%"), _f(r["r2"], "{:.3f}"))
    print_table(t, drop=("unfitted", "steps", "median step", "R²"))
    out.print("  measured: sum of step times; modelled: the fitted profile; unfitted: the error of the profile before "
              "the fit; hold-out / leave-one-out runs were not fitted on (leave-one-out: fitted on the other runs)",
              highlight=False)
    o = doc["overhead_diagnostic"]
    out.print(f"  diagnostic: a constant per-step overhead would explain {1000 * o['step_overhead_s']:.1f} ms/step "
              f"({100 * o['share_of_measured_time']:.0f}% of the measured time; median step error with it "
              f"{o['median_abs_step_error_pct']:.1f}%); host profiles have no such term, so it is not written",
              highlight=False)
    out.print(f"  wrote {doc['written']['path']} (profile {doc['written']['name']!r}); use it with "
              f"--host {doc['written']['path']}, or put it in the user profile dir as host.toml", highlight=False)

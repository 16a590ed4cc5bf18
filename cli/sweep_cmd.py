"""`cptsim sweep`: train schedules x seeds of one workload, N processes at a time; report accuracy vs cost."""

from __future__ import annotations

import time

import click
from rich.table import Table

from cptsim.errors import InputError, RunFailed

from .common import (check_output_file, emit_json, err, json_option, out, parse_fp_layers,
                     print_table, si, wide_option, workload_options)

_EPILOG = """\b
Examples:
  cptsim sweep --schedules cpt:3-8:g8:n32,static:5,static:8 --seeds 0,1,2 --epochs 3 --jobs 2 --out runs/sw1
  cptsim sweep --top 4 --budget 60%,80% --hw bitfusion --seeds 0-2 --epochs 3 --out runs/sw2
  cptsim sweep --report --out runs/sw1 --plot sw1.png      accuracy vs cost, table, rank correlation
  cptsim sweep --report --db results.db --workload KEY --json

\b
Each run is a normal run directory OUT/<schedule>-s<seed> (':' written as '_'), trained by its own
'cptsim train' process (its output in OUT/<schedule>-s<seed>.log). Rerunning the same command skips
finished runs, resumes interrupted ones from their last checkpoint and starts missing ones; schedules
and seeds may be added, the workload may not change. Every finished run's row goes into the results
database: --db PATH, else $CPTSIM_DB, else $XDG_DATA_HOME/cptsim/results.db (~/.local/share/...);
several sweeps may write to one database at once.

\b
--top K --budget B1[,B2...]: the planner's top K schedules at each budget ('cptsim plan' semantics,
the workload flags below, --hw, and the search-space flags --q-min --q-max --g-bits --cycles --families);
with --schedules too, both lists are trained.

\b
--report: per schedule, the mean and standard deviation (over seeds) of the final test accuracy (at
q_max, as measured), its BitOPs relative to the costliest static baseline among the runs, and the
planner's proxy score; and the Spearman rank correlation between score and mean accuracy over the
schedules, with its seed spread (the correlation computed within each seed: mean +- std).
"""


@click.command("sweep", epilog=_EPILOG,
               short_help="Train schedules x seeds of one workload in parallel; report accuracy vs cost.")
@click.option("--schedules", default=None, help='Schedules, comma-separated text forms: "cpt:3-8:g8:n32,static:5".')
@click.option("--seeds", default="0", show_default=True, help='Seeds: "0,1,2" or "0-4".')
@click.option("--jobs", "-j", type=int, default=1, show_default=True, help="Training processes at a time.")
@click.option("--out", "out_dir", default=None, help="Sweep directory (created; rerun to resume).")
@click.option("--db", "db_path", default=None, help="Results database [default: $CPTSIM_DB or ~/.local/share/cptsim].")
@click.option("--no-db", is_flag=True, help="Do not write the results database.")
@click.option("--top", type=int, default=None, help="Also train the planner's top K schedules at each --budget.")
@click.option("--budget", default=None, help="With --top: cost levels, comma-separated (65%, 2.5e17bitops, ...).")
@click.option("--metric", type=click.Choice(["bitops", "energy", "latency"]), default=None,
              help="With --top: what a % budget is a fraction of [default: bitops].")
@click.option("--hw", "--hardware", "hw", default="bitfusion", show_default=True, help="With --top: hardware.")
@click.option("--families", default=None, help="With --top: schedule names to search [default: all 11].")
@click.option("--cycles", default=None, help="With --top: cycle counts to search.")
@click.option("--q-min", default=None, help="With --top: q_min range to search.")
@click.option("--q-max", default=None, help="With --top: q_max range to search.")
@click.option("--g-bits", default=None, help="With --top: gradient bits to search.")
# the workload: the flags (and defaults) of `cptsim train`
@workload_options("model", "dataset", "data_dir", "image_size", "epochs", "steps", "batch_size")
@workload_options("lr")
@click.option("--momentum", type=float, default=0.9, show_default=True)
@click.option("--weight-decay", type=float, default=5e-4, show_default=True)
@click.option("--lr-schedule", type=click.Choice(["step", "cosine", "constant"]), default="cosine", show_default=True)
@workload_options("optimizer", "lr_min", "quant_agg", "fp_layers")
@click.option("--no-augment", is_flag=True, help="Turn off random crop / flip.")
@click.option("--val-split", type=float, default=0.2, show_default=True,
              help="Fraction of the training data held out as a validation split (what 'plan --quality db' fits "
                   "to; the test split is never used for decisions). 0: hold nothing out.")
@click.option("--device", default="cpu", show_default=True)
@click.option("--workers", type=int, default=0, show_default=True, help="DataLoader workers per run.")
@click.option("--threads", type=int, default=None, help="CPU threads per run [default: train's, cores / --jobs].")
@click.option("--checkpoint-every", type=int, default=None, help="Also checkpoint every N steps inside an epoch.")
# the report
@click.option("--report", "report_mode", is_flag=True,
              help="Report on a sweep (--out DIR) or on the database (--db, --workload) instead of training.")
@click.option("--workload", "workload_key", default=None, help="With --report --db: the workload key to report.")
@click.option("--plot", default=None, help="Write the accuracy-vs-cost figure (PNG) here.")
@click.option("--quiet", is_flag=True, help="No progress on stderr.")
@wide_option
@json_option
def sweep(schedules, seeds, jobs, out_dir, db_path, no_db, top, budget, metric, hw, families, cycles, q_min, q_max,
          g_bits, model, dataset, data_dir, image_size, epochs, steps, batch_size, lr, momentum, weight_decay, lr_schedule,
          optimizer, lr_min, quant_agg, fp_layers, no_augment, val_split, device, workers, threads, checkpoint_every, report_mode, workload_key, plot, quiet,
          as_json) -> None:
    """Train a set of precision schedules x seeds on one workload, N processes at a time, each a normal run
    directory; record every finished run in the results database; report accuracy vs cost."""
    from cptsim.study import sweep as SW

    if plot:
        check_output_file("--plot", plot)
    if report_mode:
        return _report(out_dir, db_path, workload_key, plot, as_json)
    if workload_key:
        raise InputError("--workload goes with --report")
    if out_dir is None:
        raise InputError("--out DIR is required: the sweep's directory (rerun with the same --out to resume)")
    if no_db and db_path:
        raise InputError("--no-db and --db contradict each other")
    if jobs < 1:
        raise InputError(f"--jobs must be at least 1, got {jobs}")
    if top is None and (budget or families or cycles or q_min or q_max or g_bits or metric):
        raise InputError("--budget, --metric, --families, --cycles, --q-min, --q-max and --g-bits go with --top K")
    if top is None and not schedules:
        raise InputError("nothing to sweep: give --schedules and/or --top K --budget B")
    settings = SW.SweepSettings(model=model, dataset=dataset, data_dir=data_dir, image_size=image_size,
                                epochs=epochs, steps=steps,
                                batch_size=batch_size, lr=lr,
                                momentum=momentum, weight_decay=weight_decay, optimizer=optimizer, lr_min=lr_min,
                                quant_agg=quant_agg,
                                lr_schedule=lr_schedule, fp_layers=parse_fp_layers(fp_layers),
                                augment=not no_augment, val_split=val_split, device=device, workers=workers, threads=threads,
                                checkpoint_every=checkpoint_every)
    settings.validate()
    seed_list = SW.parse_seeds(seeds)
    texts = SW.parse_schedule_list(schedules)
    picked = []
    show = not (quiet or as_json)
    if top is not None:
        with err.status("planning: profiling the workload and ranking candidates ...") if show else _nothing():
            picked = SW.planner_schedules(settings, [b for b in (budget or "").split(",") if b.strip()], hw, top,
                                          metric, {"schedules": families, "cycles": cycles, "q_min": q_min,
                                                   "q_max": q_max, "g_bits": g_bits})
        for p in picked:
            if p["schedule"] not in texts:
                texts.append(p["schedule"])
        if show:
            for p in picked:
                err.print(f"planner, budget {p['budget']}: #{p['rank']} {p['schedule']} "
                          f"({100 * p['vs_baseline']:.1f}% of static, score {p['score']:.4f})", highlight=False)
    db = None
    if not no_db:
        from cptsim.study.results import ResultsDB

        db = ResultsDB(db_path)
    runs = SW.prepare(out_dir, settings, texts, seed_list)
    t0 = time.perf_counter()
    try:
        if show:
            _execute_with_progress(SW, runs, settings, jobs, db)
        else:
            SW.execute(runs, settings, jobs, db)
    finally:
        if db is not None:
            db.close()
    doc = {"format": SW.SWEEP_FORMAT, "out": out_dir, "db": None if db is None else str(db.path),
           "workload": settings.workload(), "planner": picked, "runs": [r.to_json() for r in runs],
           "wall_time_s": round(time.perf_counter() - t0, 2)}
    rows = [r.row for r in runs if r.row is not None]
    doc["workload_key"] = rows[0]["workload_key"] if rows else None
    doc["report"] = SW.sweep_report(rows) if rows else None
    if plot and doc["report"]:
        _write_plot(doc["report"], plot)
    failed = [r for r in runs if r.status in ("failed", "busy")]
    if as_json:
        emit_json(doc)
    else:
        _print_runs(runs)
        if doc["report"]:
            _print_report(doc["report"])
        out.print(f"{sum(r.status == 'done' for r in runs)} of {len(runs)} runs finished in {out_dir}"
                  + (f"; results in {db.path}" if db is not None else "")
                  + (f"; figure {plot}" if plot and doc["report"] else ""), highlight=False)
    if failed:
        r = failed[0]
        raise RunFailed(f"{len(failed)} of {len(runs)} runs did not finish; first: {r.name}: {r.error} "
                        f"(log {r.log}); rerun the same command to retry them")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _execute_with_progress(SW, runs, settings, jobs, db) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    todo = [r for r in runs if r.action != "skip"]
    skipped = len(runs) - len(todo)
    err.print(f"sweep: {len(runs)} runs ({skipped} finished before, "
              f"{sum(r.action == 'resume' for r in todo)} to resume, {sum(r.action == 'new' for r in todo)} new), "
              f"{jobs} at a time", highlight=False)
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
               TimeElapsedColumn()]
    with Progress(*columns, console=err, transient=False) as bar:
        overall = bar.add_task("[bold]sweep", total=len(runs), completed=skipped, info="")
        tasks: dict[str, int] = {}

        def on_event(ev: str, run) -> None:
            if ev == "start":
                tasks[run.name] = bar.add_task(f"  {run.name}", total=run.total_steps, completed=run.steps_done,
                                               info=run.action)
            elif ev == "progress" and run.name in tasks:
                bar.update(tasks[run.name], total=run.total_steps, completed=run.steps_done)
            elif ev == "end":
                if run.name in tasks:
                    bar.remove_task(tasks.pop(run.name))
                if run.action != "skip":
                    bar.advance(overall)
                    acc = (run.row or {}).get("test_acc")
                    what = f"{100 * acc:.1f}% @ {run.row['eval_bits']} bits" if acc is not None else \
                        f"{run.status}: {run.error or ''}"
                    bar.console.print(f"  {run.name}: {what} ({run.time_s:.0f} s)", highlight=False)

        SW.execute(runs, settings, jobs, db, on_event=on_event)


def _print_runs(runs) -> None:
    t = Table(title="sweep runs", title_justify="left", box=None, header_style="bold underline", padding=(0, 1))
    for c in ("run", "action", "status", "test acc", "eval bits", "BitOPs", "score"):
        t.add_column(c, justify="left" if c in ("run", "action", "status") else "right", no_wrap=True)
    for r in runs:
        row = r.row or {}
        acc = row.get("test_acc")
        t.add_row(r.name, r.action, r.status, "-" if acc is None else f"{100 * acc:.2f}%",
                  str(row.get("eval_bits", "-")), si(row.get("bitops")),
                  "-" if row.get("score") is None else f"{row['score']:.4f}",
                  style=None if r.status == "done" else "red" if r.status in ("failed", "busy") else "yellow")
    print_table(t, drop=("eval bits", "action", "score", "BitOPs"))


def _print_report(rep: dict) -> None:
    ref = rep.get("cost_reference") or {}
    lm = (rep.get("measure") or {}).get("key") == "ppl"  # a language model: perplexity, lower is better
    m, what = ("ppl", "test perplexity (lower is better)") if lm else ("acc", "final test accuracy")
    t = Table(title=f"sweep report: workload {rep['workload_key']}, {rep['runs']} runs", title_justify="left",
              caption=f"{m}: {what} (measured, at q_max), mean and std over seeds; cost: BitOPs as % "
                      f"of {ref.get('schedule', 'static q_max')}; score: {rep['score_name']}",
              caption_justify="left", box=None, header_style="bold underline", padding=(0, 1))
    for c in ("schedule", "family", "seeds", f"{m} mean", f"{m} std", "cost", "score"):
        t.add_column(c, justify="left" if c in ("schedule", "family") else "right", no_wrap=True)
    for s in rep["schedules"]:
        figs = (f"{s['ppl_mean']:.3f}", f"{s['ppl_std']:.3f}") if lm else \
            (f"{100 * s['acc_mean']:.2f}%", f"{100 * s['acc_std']:.2f}")
        t.add_row(s["schedule"], s["family"], str(s["n"]), *figs,
                  "-" if s["cost_rel"] is None else f"{100 * s['cost_rel']:.1f}%", f"{s['score']:.4f}")
    print_table(t, drop=("family", "seeds", "score", f"{m} std"))
    sp = rep["spearman"]
    vs = "minus mean perplexity" if lm else "mean accuracy"
    if sp["rho"] is None:
        out.print(f"Spearman rank correlation (score vs {vs}): n/a", highlight=False)
    else:
        line = (f"Spearman rank correlation, score vs {vs} over {sp['n_schedules']} schedules: "
                f"rho = {sp['rho']:.3f} (p = {sp['p_value']:.3g})")
        if sp["per_seed_mean"] is not None:
            line += (f"; per seed {sp['per_seed_mean']:.3f} +- {sp['per_seed_std']:.3f} "
                     f"over {len(sp['per_seed'])} seeds")
        out.print(line, highlight=False)
    for n in rep.get("notes", []):
        out.print(f"[yellow]note:[/] {n}", highlight=False)


def _write_plot(rep: dict, path) -> None:
    from cptsim.study.plots import sweep_figure
    from cptsim.fileio import atomic_write_bytes

    try:
        atomic_write_bytes(path, sweep_figure(rep))
    except OSError as e:
        raise InputError(f"--plot: cannot write {str(path)!r}: {e.strerror or e}") from None


def _report(out_dir, db_path, workload_key, plot, as_json) -> None:
    from cptsim.study import sweep as SW

    if out_dir and (db_path or workload_key):
        raise InputError("--report reads either a sweep directory (--out DIR) or the database (--db, --workload)")
    if out_dir:
        rows = SW.rows_from_dir(out_dir)
        if not rows:
            raise InputError(f"{out_dir} holds no finished run yet")
    else:
        from cptsim.study.results import ResultsDB

        with ResultsDB(db_path) as db:
            if workload_key is None:
                wl = db.workloads()
                if not wl:
                    raise InputError(f"{db.path} holds no results yet")
                if len(wl) > 1:
                    keys = ", ".join(f"{w['workload_key']} ({w['workload'].get('model')} on "
                                     f"{w['workload'].get('dataset')}, {w['workload'].get('steps')} steps, "
                                     f"{w['runs']} runs)" for w in wl[:5])
                    raise InputError(f"{db.path} holds {len(wl)} workloads; pick one with --workload KEY: {keys}")
                workload_key = wl[0]["workload_key"]
            rows = db.rows(workload_key)
        if not rows:
            raise InputError(f"no results for workload {workload_key!r} in {db_path or 'the results database'}")
    rep = SW.sweep_report(rows)
    if plot:
        _write_plot(rep, plot)
    if as_json:
        emit_json(rep)
        return
    _print_report(rep)
    if plot:
        out.print(f"figure written to {plot}", highlight=False)

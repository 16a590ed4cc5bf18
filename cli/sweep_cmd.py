"""`cptsim sweep`: train schedules x seeds of one workload, N processes at a time or as Slurm jobs; report accuracy
vs cost; show where each run stands; index the runs' result records into the results database."""

from __future__ import annotations

import click
from rich.table import Table

from cptsim.errors import InputError, RunFailed

from .common import (check_output_file, emit_json, err, json_option, layer_schedule_options, out,
                     parse_fp_layers, parse_layer_options, print_table, si, wide_option, workload_options)

_EPILOG = """\b
Examples:
  cptsim sweep --schedules cpt:3-8:g8:n32,static:5,static:8 --seeds 0,1,2 --epochs 3 --jobs 2 --out runs/sw1
  cptsim sweep --top 4 --budget 60%,80% --hw bitfusion --seeds 0-2 --epochs 3 --out runs/sw2
  cptsim sweep --report --out runs/sw1 --plot sw1.png      accuracy vs cost, table, rank correlation
  cptsim sweep --report --db results.db --workload KEY --json
  cptsim sweep --schedules cpt:2-4:g8:n8,static:3 --layer-plan plan.json --seeds 0-2 --out runs/sw4
                                          uniform schedules beside a plan from 'cptsim plan --per-layer'
  cptsim sweep --schedules 'static:3@features.0=4;features.3=2,static:3' --seeds 0-2 --out runs/sw5
  cptsim sweep --schedules cpt:2-4 --layer 'features.0=+1' --seeds 0-2 --dry-run --out runs/sw6
                                          show each run's 'cptsim train' command; train nothing

\b
On a Slurm cluster (submitit; pip install 'cptsim[cluster]'), one job per run, as one job array:
  cptsim sweep --executor slurm --slurm-partition gpu --slurm-time 4:00:00 --slurm-gpus-per-node 1 \
      --slurm-cpus-per-task 8 --slurm-setup 'module load cuda/12.1' --slurm-option account=myproj \
      --schedules cpt:3-8:g8:n32,static:8 --seeds 0-2 --model resnet20 --dataset cifar10 \
      --data-dir /shared/data --device cuda --out /shared/runs/sw3
  cptsim sweep --status --out /shared/runs/sw3         queued / running / done / failed per run
  cptsim sweep --index --out /shared/runs/sw3 --db results.db   result records -> the database
  cptsim sweep --executor slurm ... --dry-run          print the job script, submit nothing

\b
Each run is a normal run directory OUT/<schedule>-s<seed> (':' written as '_'), trained by its own
'cptsim train' process (its output in OUT/<schedule>-s<seed>.log). Rerunning the same command skips
finished runs, resumes interrupted ones from their last checkpoint and starts missing ones; schedules
and seeds may be added, the workload may not change. Every finished run's row goes into the results
database: --db PATH, else $CPTSIM_DB, else $XDG_DATA_HOME/cptsim/results.db (~/.local/share/...);
several sweeps may write to one database at once.

\b
Every finished run also writes its result record, OUT/<run>/result.json: run directories are the
truth, the database an index of them. --executor slurm submits each unfinished run as a job (one
array, --jobs N at a time) that runs the same 'cptsim train' in OUT/<run> on the shared file
system and writes result.json; nodes never write the database (SQLite over NFS is unsafe). The
command returns once the jobs are queued (--wait: until they end, then indexes). Rerunning it
leaves queued and running jobs alone and resubmits only the unfinished runs, which resume from
their last checkpoint. A job nearing --slurm-time checkpoints and is requeued (up to 3 times).
--nproc N: each run data-parallel over N workers (torchrun inside the job's allocation; with
--device cuda a job asks for N GPUs unless --slurm-gpus-per-node says otherwise).
--executor submitit-local runs the same jobs through submitit on this machine, all at once.

\b
Per-layer plans: an entry of --schedules may carry layer rules, SCHEDULE@GLOB=SPEC;GLOB=SPEC
(the 'cptsim train --layer' forms), and --layer-plan PLAN.json (repeatable) adds a plan's schedule with
its rules. --layer GLOB=SPEC (repeatable) and --layer-schedule FILE give the entries that carry no
rules of their own these rules, as 'cptsim train --layer' does. Such a run is OUT/<schedule>-L<hash>-s<seed>;
its row keeps the rules (extra.layers) and the report lists it as its own entry.
--number-format F / --grad-format G are passed to every run's 'cptsim train'.

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


@click.command("sweep", epilog=_EPILOG)  # its short help is in cli/main.py's table
@click.option("--schedules", default=None, help='Schedules, comma-separated text forms: "cpt:3-8:g8:n32,static:5".')
@click.option("--seeds", default="0", show_default=True, help='Seeds: "0,1,2" or "0-4".')
@click.option("--jobs", "-j", type=int, default=None,
              help="Runs at a time: local training processes [default: 1], or the job array's limit on Slurm "
                   "[default: the scheduler's].")
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
@layer_schedule_options
@click.option("--layer-plan", "layer_plans", multiple=True, metavar="PLAN.json",
              help="Also train a plan from 'cptsim plan --per-layer': its schedule with its layer rules "
                   "(repeatable; the plan must be of this workload).")
@workload_options("number_format", "grad_format")
@click.option("--no-augment", is_flag=True, help="Turn off random crop / flip.")
@click.option("--val-split", type=float, default=0.2, show_default=True,
              help="Fraction of the training data held out as a validation split (what 'plan --quality db' fits "
                   "to; the test split is never used for decisions). 0: hold nothing out.")
@click.option("--device", default="cpu", show_default=True)
@click.option("--workers", type=int, default=0, show_default=True, help="DataLoader workers per run.")
@click.option("--threads", type=int, default=None, help="CPU threads per run [default: train's, cores / --jobs].")
@click.option("--checkpoint-every", type=int, default=None, help="Also checkpoint every N steps inside an epoch.")
# where the runs run
@click.option("--executor", type=click.Choice(["local", "slurm", "submitit-local"]), default="local",
              show_default=True,
              help="local: processes on this machine; slurm: one Slurm job per run through submitit; "
                   "submitit-local: those jobs on this machine (to try a setup).")
@click.option("--slurm-partition", default=None, help="Slurm partition (sbatch --partition).")
@click.option("--slurm-time", default=None,
              help="Each job's time limit: minutes or [D-]H:MM:SS (sbatch --time). Required with --executor slurm.")
@click.option("--slurm-gpus-per-node", type=int, default=None,
              help="GPUs per job (sbatch --gpus-per-node) [default: --nproc with --device cuda, else none].")
@click.option("--slurm-cpus-per-task", type=int, default=None, help="CPU cores per job (sbatch --cpus-per-task).")
@click.option("--slurm-setup", multiple=True,
              help="A line of the job script run before the job (repeatable), e.g. 'module load cuda/12.1' or "
                   "'source /shared/venv/bin/activate'.")
@click.option("--slurm-option", multiple=True,
              help="Any other sbatch option as KEY=VALUE, or KEY for a flag (repeatable): account=myproj, "
                   "qos=high, mem=64G, constraint=a100, exclusive.")
@click.option("--nproc", type=int, default=None,
              help="Data-parallel workers per run ('cptsim train --nproc': torchrun inside the job).")
@click.option("--wait", is_flag=True,
              help="With --executor slurm | submitit-local: wait for the jobs to end, then index and report.")
@click.option("--dry-run", is_flag=True,
              help="Show the runs and the 'cptsim train' command each would run (with --executor slurm: the job "
                   "script too); train nothing, submit nothing, write nothing.")
# the report
@click.option("--status", "status_mode", is_flag=True,
              help="Show each run of sweep --out DIR: done, running, queued, failed, unfinished, not started "
                   "(from the run directories and the scheduler).")
@click.option("--index", "index_mode", is_flag=True,
              help="Put the result records of sweep --out DIR into the database (--db): adds new runs, updates "
                   "known ones. A new --db file rebuilds it.")
@click.option("--report", "report_mode", is_flag=True,
              help="Report on a sweep (--out DIR) or on the database (--db, --workload) instead of training.")
@click.option("--workload", "workload_key", default=None, help="With --report --db: the workload key to report.")
@click.option("--plot", default=None, help="Write the accuracy-vs-cost figure (PNG) here.")
@click.option("--quiet", is_flag=True, help="No progress on stderr.")
@wide_option
@json_option
def sweep(schedules, seeds, jobs, out_dir, db_path, no_db, top, budget, metric, hw, families, cycles, q_min, q_max,
          g_bits, model, dataset, data_dir, image_size, epochs, steps, batch_size, lr, momentum, weight_decay, lr_schedule,
          optimizer, lr_min, quant_agg, fp_layers, layer_schedule, layer_rules, layer_plans, number_format,
          grad_format, no_augment, val_split, device, workers, threads, checkpoint_every,
          executor, slurm_partition, slurm_time, slurm_gpus_per_node, slurm_cpus_per_task, slurm_setup, slurm_option,
          nproc, wait, dry_run, status_mode, index_mode, report_mode, workload_key, plot, quiet,
          as_json) -> None:
    """Train a set of precision schedules x seeds on one workload, N processes at a time or as Slurm jobs
    (--executor slurm), each a normal run directory that records its result (result.json); index the results
    into the results database; show where each run stands (--status); report accuracy vs cost."""
    from cptsim.study import cluster as C
    from cptsim.study import sweep as SW

    if plot:
        check_output_file("--plot", plot)
    modes = [f for f, on in (("--report", report_mode), ("--status", status_mode), ("--index", index_mode)) if on]
    if len(modes) > 1:
        raise InputError(f"{' and '.join(modes)}: one at a time")
    if report_mode:
        return _report(out_dir, db_path, workload_key, plot, as_json)
    if workload_key:
        raise InputError("--workload goes with --report")
    if no_db and db_path:
        raise InputError("--no-db and --db contradict each other")
    if status_mode or index_mode:
        if out_dir is None:
            raise InputError(f"{modes[0]} needs --out DIR: the sweep's directory")
        return _status(out_dir, as_json) if status_mode else _index(out_dir, db_path, no_db, as_json)
    if out_dir is None:
        raise InputError("--out DIR is required: the sweep's directory (rerun with the same --out to resume)")
    if jobs is not None and jobs < 1:
        raise InputError(f"--jobs must be at least 1, got {jobs}")
    cluster = C.ClusterSettings(executor=executor, partition=slurm_partition, time_min=C.parse_slurm_time(slurm_time),
                                gpus_per_node=slurm_gpus_per_node, cpus_per_task=slurm_cpus_per_task,
                                setup=list(slurm_setup), options=C.parse_slurm_options(slurm_option),
                                parallel=jobs if executor == "slurm" else None)
    cluster.validate(device, nproc)
    if executor == "local" and wait:
        raise InputError("--wait goes with --executor slurm | submitit-local (a local sweep always waits for its "
                         "runs)")
    if executor == "submitit-local" and jobs is not None:
        raise InputError("--jobs goes with --executor local | slurm (submitit's local executor starts every job "
                         "at once)")
    if top is None and (budget or families or cycles or q_min or q_max or g_bits or metric):
        raise InputError("--budget, --metric, --families, --cycles, --q-min, --q-max and --g-bits go with --top K")
    if top is None and not schedules and not layer_plans:
        raise InputError("nothing to sweep: give --schedules, --layer-plan and/or --top K --budget B")
    settings = SW.SweepSettings(model=model, dataset=dataset, data_dir=data_dir, image_size=image_size,
                                epochs=epochs, steps=steps,
                                batch_size=batch_size, lr=lr,
                                momentum=momentum, weight_decay=weight_decay, optimizer=optimizer, lr_min=lr_min,
                                quant_agg=quant_agg,
                                lr_schedule=lr_schedule, fp_layers=parse_fp_layers(fp_layers),
                                augment=not no_augment, val_split=val_split, device=device, workers=workers, threads=threads,
                                checkpoint_every=checkpoint_every, nproc=nproc, number_format=number_format,
                                grad_format=grad_format)
    settings.validate(device_here=executor != "slurm")
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
    rules = parse_layer_options(layer_schedule, layer_rules)
    if rules is not None:
        if rules.get("model") and rules["model"] != settings.model:
            raise InputError(f"--layer-schedule {layer_schedule}: written for model {rules['model']!r}, not "
                             f"{settings.model!r}")
        texts = SW.with_layers(texts, ";".join(rules["rules"]))
    for path in layer_plans:
        e = SW.layer_plan_entry(path, settings)
        if e not in texts:
            texts.append(e)
    SW.check_layers(settings, texts)
    if executor != "local":
        from pathlib import Path

        cluster.job_name = f"cptsim-{Path(out_dir).resolve().name}"
        return _submit(out_dir, settings, texts, seed_list, cluster, picked, wait, dry_run, db_path, no_db,
                       plot, show, as_json)
    if dry_run:
        return _dry_run_local(out_dir, settings, texts, seed_list, as_json)
    res = SW.run_sweep(out_dir, settings, texts, seed_list, jobs, picked, db_path, no_db,
                       on_event=_ProgressBar(jobs or 1) if show else None)
    doc, runs, failed = res.doc, res.runs, res.failed
    if plot and doc["report"]:
        _write_plot(doc["report"], plot)
    if as_json:
        emit_json(doc)
    else:
        _print_runs(runs)
        if doc["report"]:
            _print_report(doc["report"])
        out.print(f"{sum(r.status == 'done' for r in runs)} of {len(runs)} runs finished in {out_dir}"
                  + (f"; results in {doc['db']}" if doc["db"] is not None else "")
                  + (f"; figure {plot}" if plot and doc["report"] else ""), highlight=False)
    if failed:
        r = failed[0]
        raise RunFailed(f"{len(failed)} of {len(runs)} runs did not finish; first: {r.name}: {r.error} "
                        f"(log {r.log}); rerun the same command to retry them")


def _dry_run_local(out_dir, settings, texts, seeds, as_json) -> None:
    """--dry-run of a local sweep: the runs and the `cptsim train` command each would run; nothing written."""
    from cptsim.study import sweep as SW

    res = SW.dry_run(out_dir, settings, texts, seeds)
    doc, runs, todo = res.doc, res.runs, res.todo
    if as_json:
        emit_json(doc)
        return
    _print_runs(runs)
    out.print(f"would train {len(todo)} of {len(runs)} runs; their commands:", highlight=False)
    for name, cmd in doc["train"].items():  # unwrapped, so that each can be copied and run
        out.print(f"{name}: {cmd}", markup=False, highlight=False, soft_wrap=True)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _ProgressBar:
    """A local sweep's progress on stderr: one bar for the sweep, one per training run (``run_sweep``'s events)."""

    def __init__(self, jobs: int):
        self.jobs, self.bar, self.tasks = jobs, None, {}

    def __call__(self, ev: str, obj) -> None:
        if ev == "prepared":
            self._open(obj)
        elif ev == "executed":
            if self.bar is not None:
                self.bar.stop()
        elif ev == "start":
            run = obj
            self.tasks[run.name] = self.bar.add_task(f"  {run.name}", total=run.total_steps,
                                                     completed=run.steps_done, info=run.action)
        elif ev == "progress" and obj.name in self.tasks:
            self.bar.update(self.tasks[obj.name], total=obj.total_steps, completed=obj.steps_done)
        elif ev == "end":
            run = obj
            if run.name in self.tasks:
                self.bar.remove_task(self.tasks.pop(run.name))
            if run.action != "skip":
                self.bar.advance(self.overall)
                acc = (run.row or {}).get("test_acc")
                what = f"{100 * acc:.1f}% @ {run.row['eval_bits']} bits" if acc is not None else \
                    f"{run.status}: {run.error or ''}"
                self.bar.console.print(f"  {run.name}: {what} ({run.time_s:.0f} s)", highlight=False)

    def _open(self, runs) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        todo = [r for r in runs if r.action != "skip"]
        skipped = len(runs) - len(todo)
        err.print(f"sweep: {len(runs)} runs ({skipped} finished before, "
                  f"{sum(r.action == 'resume' for r in todo)} to resume, {sum(r.action == 'new' for r in todo)} "
                  f"new), {self.jobs} at a time", highlight=False)
        columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[info]}"), TimeElapsedColumn()]
        self.bar = Progress(*columns, console=err, transient=False)
        self.bar.start()
        self.overall = self.bar.add_task("[bold]sweep", total=len(runs), completed=skipped, info="")


def _print_runs(runs) -> None:
    jobs = any(r.job_id for r in runs)
    t = Table(title="sweep runs", title_justify="left", box=None, header_style="bold underline", padding=(0, 1))
    for c in ("run", "action", "status") + (("job",) if jobs else ()) + ("test acc", "eval bits", "BitOPs", "score"):
        t.add_column(c, justify="left" if c in ("run", "action", "status", "job") else "right", no_wrap=True)
    for r in runs:
        row = r.row or {}
        acc = row.get("test_acc")
        t.add_row(r.name, r.action, r.status, *((r.job_id or "-",) if jobs else ()),
                  "-" if acc is None else f"{100 * acc:.2f}%",
                  str(row.get("eval_bits", "-")), si(row.get("bitops")),
                  "-" if row.get("score") is None else f"{row['score']:.4f}",
                  style=None if r.status == "done" else "red" if r.status in ("failed", "busy") else "yellow")
    print_table(t, drop=("eval bits", "action", "score", "BitOPs"))


def _warn(lines) -> None:
    for w in lines:  # file names may hold [brackets]: no rich markup
        err.print(f"warning: {w}", markup=False, highlight=False, soft_wrap=True)  # unwrapped: paths stay whole


def _submit(out_dir, settings, texts, seeds, cluster, picked, wait, dry_run, db_path, no_db, plot, show,
            as_json) -> None:
    """--executor slurm | submitit-local: submit the unfinished runs as jobs; with --wait, wait, index, report."""
    from cptsim.study import cluster as C
    from cptsim.study.sweepsubmit import submit_sweep

    spinner = {}

    def on_event(ev, detail) -> None:
        if not show:
            return
        if ev == "submitted":
            runs, todo = detail["runs"], detail["todo"]
            err.print(f"sweep: {len(runs)} runs: {sum(r.action == 'skip' for r in runs)} done before, "
                      f"{len(todo)} submitted ({cluster.executor}), "
                      f"{sum(r.action == 'wait' for r in runs)} still queued or running", highlight=False)
        elif ev == "waiting":
            spinner["n"] = len(detail["names"])
            spinner["status"] = err.status(f"waiting for {spinner['n']} jobs (^C stops waiting; the jobs go on)")
            spinner["status"].start()
        elif ev == "poll" and "status" in spinner:
            n = {p: sum(C.job_phase(s) == p for s in detail["states"].values()) for p in ("queued", "running")}
            spinner["status"].update(f"jobs: {n['queued']} queued, {n['running']} running, "
                                     f"{spinner['n'] - n['queued'] - n['running']} ended  (^C stops waiting; the "
                                     "jobs go on)")
        elif ev == "waited" and "status" in spinner:
            spinner.pop("status").stop()

    sub = submit_sweep(out_dir, settings, texts, seeds, cluster, picked, wait=wait, dry_run=dry_run,
                       db_path=db_path, no_db=no_db, on_event=on_event)
    doc, runs, todo = sub.doc, sub.runs, sub.todo
    if dry_run:
        if as_json:
            emit_json(doc)
            return
        _print_runs(runs)
        out.print(f"would submit {len(todo)} of {len(runs)} runs" + (
            " as one job array" if len(todo) > 1 else ""), highlight=False)
        if doc["train"]:  # unwrapped, so that it can be copied and run
            out.print(f"the job of {todo[0].name} runs (a job starts --resume instead if its run has begun):",
                      highlight=False)
            out.print(doc["train"], markup=False, highlight=False, soft_wrap=True)
        if doc["script"]:
            out.print("job script (sbatch):", highlight=False)
            out.print(doc["script"], markup=False, highlight=False, soft_wrap=True)
        return
    if not wait:
        if as_json:
            emit_json(doc)
            return
        _print_runs(runs)
        out.print(f"{len(todo)} jobs submitted. Watch: cptsim sweep --status --out {out_dir}; when they are "
                  f"done: cptsim sweep --index --out {out_dir} (into the database), "
                  f"cptsim sweep --report --out {out_dir}", markup=False, highlight=False)
        return
    if plot and doc["report"]:
        _write_plot(doc["report"], plot)
    failed = sub.failed
    if as_json:
        emit_json(doc)
    else:
        _warn(doc["warnings"])
        _print_runs(runs)
        if doc["report"]:
            _print_report(doc["report"])
        out.print(f"{len(runs) - len(failed)} of {len(runs)} runs finished in {out_dir}"
                  + (f"; results indexed into {doc['db']}" if doc.get("db") else ""), highlight=False)
    if failed:
        r = failed[0]
        raise RunFailed(f"{len(failed)} of {len(runs)} runs did not finish; first: {r.name}: {r.status}"
                        f"{': ' + r.error if r.error else ''} (log {r.log}); rerun the same command to resubmit them")


def _status(out_dir, as_json) -> None:
    from cptsim.study import sweep as SW

    st = SW.sweep_status(out_dir)
    _warn(st["warnings"])  # on stderr: stdout stays one JSON document with --json
    if as_json:
        emit_json(st)
        return
    t = Table(title=f"sweep {out_dir} ({st['executor']})", title_justify="left", box=None,
              header_style="bold underline", padding=(0, 1))
    for c in ("run", "status", "steps", "job", "job state", "test acc", "note"):
        t.add_column(c, justify="right" if c in ("steps", "test acc") else "left", no_wrap=c != "note")
    colour = {"done": None, "running": "cyan", "queued": "blue", "failed": "red", "unfinished": "yellow",
              "not started": "dim"}
    for r in st["runs"]:
        steps = f"{r['steps_done']}/{r['total_steps']}" if r["total_steps"] else "-"
        acc = r["test_acc"]
        t.add_row(r["name"], r["status"], steps, r["job_id"] or "-", r["job_state"] or "-",
                  "-" if acc is None else f"{100 * acc:.2f}%", r["error"] or "", style=colour[r["status"]])
    print_table(t, drop=("note", "job state", "job"), wrap=("note",))
    c = st["counts"]
    out.print(", ".join(f"{n} {s}" for s, n in c.items() if n) + f" (of {len(st['runs'])} runs)", highlight=False)


def _index(out_dir, db_path, no_db, as_json) -> None:
    from cptsim.study import sweep as SW
    from cptsim.study.results import ResultsDB

    if no_db:
        raise InputError("--index writes the database: leave out --no-db")
    with ResultsDB(db_path) as db:
        ind = SW.index(out_dir, db)
        path = str(db.path)
    doc = {"out": out_dir, "db": path, "runs": len(ind["rows"]), "added": ind["added"],
           "updated": len(ind["rows"]) - ind["added"], "warnings": ind["warnings"],
           "workload_keys": sorted({r["workload_key"] for r in ind["rows"]})}
    _warn(ind["warnings"])
    if as_json:
        emit_json(doc)
        return
    out.print(f"indexed {doc['runs']} finished runs of {out_dir} into {path} ({doc['added']} new, "
              f"{doc['updated']} updated)", markup=False, highlight=False)


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
                  "-" if s["cost_rel"] is None else f"{100 * s['cost_rel']:.1f}%",
                  "-" if s.get("score") is None else f"{s['score']:.4f}")
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
        warnings: list[str] = []
        rows = SW.rows_from_dir(out_dir, warnings)
        _warn(warnings)  # on stderr: stdout stays one JSON document with --json
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

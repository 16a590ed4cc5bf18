"""`cptsim train`: real cyclic-precision training, recorded in a run directory."""

from __future__ import annotations

import os
import time
from pathlib import Path

import click
from rich.table import Table

from .common import emit_json, err, json_option, layer_schedule_options, parse_fp_layers, parse_layer_options
from .common import workload_options
from .common import out as console

_EPILOG = """\b
Examples:
  cptsim train                                   digits, digits-cnn, CPT 3-8 / 8 bits, 32 cycles (< 1 min on CPU)
  cptsim train --schedule rex-tri-h:4-8:g8:n8 --epochs 30
  cptsim train --model resnet20 --dataset cifar10 --data-dir ~/data --batch-size 128 --steps 64000 --lr-schedule step
  cptsim train --resume runs/NAME                continue a run from its last checkpoint
  cptsim train --plan plan.json                  train exactly what 'cptsim plan' chose
  cptsim train --schedule cpt:3-6 --layer 'features.0=8' --layer 'features.7=+1'
                                                 per-layer precision: features.0 static 8, features.7 at 4-7
  cptsim train --layer-schedule layers.toml      the same rules from a file ([layers] "features.*" = "2-6")
  cptsim train --number-format mx --schedule cpt:4-8:g8:n8
                                                 widths as MX formats: 4 MXFP4, 5-6 MXFP6, 7-8 MXFP8 (FP32 emulation)

\b
The run directory (--out) gets config.json, trace.jsonl (one line per step: bits, loss, time),
metrics.jsonl (one line per epoch: test accuracy at q_max), checkpoint-STEP.pt (each epoch and --checkpoint-every;
the last --keep-checkpoints kept, their SHA-256 in checkpoints.json; checkpoint.pt is the newest). One process
writes a run at a time: a second one is refused (exit 2) while the first holds the lock file .NAME.lock next to it.
Evaluation runs at the schedule's q_max (--eval-bits to change; CPT's code evaluated at whatever bits were
current), after BatchNorm statistics and activation ranges are re-estimated at those bits (--recal-batches).
Schedules: see 'cptsim schedules list' and 'cptsim schedules show --help' for the text form.
"""


def _schedule_text(schedule: str, q_min, q_max, g_bits, cycles) -> str:
    """Combine --schedule text with the bit flags; a flag that contradicts the text is an error, not a guess."""
    from cptsim.errors import InputError
    from cptsim.cost.schedules import parse_schedule

    given = {k: v for k, v in {"q_min": q_min, "q_max": q_max, "g_bits": g_bits, "cycles": cycles}.items()
             if v is not None}
    sched = parse_schedule(schedule, **given)
    checks = {"q_min": sched.q_min, "q_max": sched.q_max, "cycles": sched.cycles}
    for key, value in given.items():
        if key == "g_bits":
            want = parse_schedule(f"static:8:g{value}")
            ok = (want.g_min, want.g_max) == (sched.g_min, sched.g_max)
        elif sched.name == "static" and key in ("q_min", "cycles"):
            ok = True  # static has one precision and no cycles: nothing to contradict
        else:
            ok = checks[key] == value
        if not ok:
            flag = "--" + key.replace("_", "-")
            raise InputError(f"{flag} {value} contradicts --schedule {schedule!r}; give the value in one place")
    return sched.to_text()


def _check_layers(meta, model: str, text: str, fp, layers: dict) -> None:
    """Every per-layer rule resolved on the model (built on the meta device): a glob matching nothing, bits out of
    range or a schedule for another model are refused before anything runs."""
    from cptsim.cost.layerplan import layer_schedule_from_json
    from cptsim.cost.schedules import parse_schedule
    from cptsim.models import default_fp_layers
    from cptsim.numerics.layers import quantizable_layers, resolve_fp_layers

    keep = default_fp_layers(meta) if fp is None else resolve_fp_layers(meta, fp)
    names = [n for n in quantizable_layers(meta) if n not in keep]
    layer_schedule_from_json(layers).resolve(parse_schedule(text), names, keep, model)


def _default_out(model: str, schedule_text: str) -> str:
    return f"runs/{model}-{schedule_text.split(':')[0]}-{time.strftime('%Y%m%d-%H%M%S')}"


def _launch_argv(nproc: int) -> list[str]:
    """The command line the workers of ``--nproc`` run: this one without --nproc and --max-restarts (cheap checks
    only; what the workers would refuse is checked by ``train`` before ``_launch``)."""
    import sys

    from cptsim.errors import InputError

    if nproc < 1:
        raise InputError(f"--nproc must be at least 1, got {nproc}")
    if "WORLD_SIZE" in os.environ:
        raise InputError("--nproc launches workers itself; under torchrun leave it out")
    argv = sys.argv[sys.argv.index("train"):] if "train" in sys.argv else None
    if argv is None:
        raise InputError("--nproc works from the cptsim command line only")
    clean, skip = [], False
    for a in argv:  # drop --nproc N and --max-restarts R (either spelling); the workers must not launch again
        if skip:
            skip = False
            continue
        if a in ("--nproc", "--max-restarts"):
            skip = True
            continue
        if a.startswith(("--nproc=", "--max-restarts=")):
            continue
        clean.append(a)
    return clean


def _check_resumable(resume_dir: str, nproc: int) -> None:
    """What the workers of a resumed job would refuse, checked here first: a run directory whose settings are
    valid, whose data is where they say, and that ``nproc`` processes can share."""
    from cptsim.data import check_data_dir
    from cptsim.run import train as T
    from cptsim.run.config import check_world
    from cptsim.run.rundir import RunDir

    run = RunDir.open(resume_dir)  # not a run: refused before its lock file is made
    cfg = T.TrainConfig.from_dict(run.read_config()["settings"])
    T.validate(cfg)
    check_data_dir(cfg.dataset, cfg.data_dir)
    check_world(cfg.dataset, nproc)


def _launch(argv: list[str], nproc: int, out: str | None, resume_dir: str | None, model: str, schedule: str,
            max_restarts: int = 0, dataset: str | None = None) -> None:
    """Run the command ``argv`` (``_launch_argv``) in `nproc` workers under torchrun's agent (each joins the
    process group from its env). ``train`` has checked the workload before (so a typo costs one line, exit 2, and
    no worker); bad input a worker still meets stops the job without restarts (``cptsim.run.dist.launch``).

    This process holds the run's lock for the whole job, restarts included (rank 0 adopts it). With
    ``max_restarts``, the agent restarts every worker when one dies, and they resume the run (see `train`)."""
    from cptsim.run import dist
    from cptsim.run.rundir import RunDir, RunLock

    from cptsim.run.config import check_world

    clean = list(argv)
    if resume_dir:
        _check_resumable(resume_dir, nproc)
    else:
        check_world(dataset, nproc)
        if out is None:  # resolve the default name once, so every worker writes to the same place
            out = _default_out(model, schedule)
            clean += ["--out", out]
        RunDir.check_new(out)
    with RunLock.acquire(resume_dir or out) as lock:
        code = dist.launch(nproc, clean, max_restarts=max_restarts, lock=lock)
    if code:
        raise SystemExit(code)


def _bad_input_stops_the_job(fn):
    """In a worker of ``--nproc`` (cptsim.run.dist.launch): bad input (an InputError, exit 2) is reported to the
    launcher, which stops the job without restarting it; elsewhere nothing changes."""
    import functools

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            from cptsim.errors import InputError

            if isinstance(e, InputError) and os.environ.get("CPTSIM_BAD_INPUT_FILE"):
                from cptsim.run import dist

                dist.report_bad_input(str(e))  # waits to be stopped; if nobody does, exit 2 as usual
            raise

    return run


# Flags next to --plan, by TrainConfig field: these change how the plan runs, not what it costs, so they override
# the plan (config.json records the values used; the run's plan.json keeps the plan's).
_PLAN_OVERRIDABLE = {"seed": "--seed", "lr": "--lr", "momentum": "--momentum", "weight_decay": "--weight-decay",
                     "lr_schedule": "--lr-schedule", "lr_min": "--lr-min", "augment": "--no-augment",
                     "data_dir": "--data-dir"}
# These would change the planned workload and its cost: refused unless they equal the plan's value.
_PLAN_FIXED_FLAGS = {"model": "--model", "dataset": "--dataset", "batch_size": "--batch-size", "steps": "--steps",
                     "epochs": "--epochs", "fp_layers": "--fp-layers", "image_size": "--image-size",
                     "optimizer": "--optimizer", "quant_agg": "--quant-agg",
                     "number_format": "--number-format", "grad_format": "--grad-format"}
_SCHEDULE_FLAGS = {"schedule": "--schedule", "q_min": "--q-min", "q_max": "--q-max", "g_bits": "--g-bits",
                   "cycles": "--cycles"}


def _plan_config(plan: dict, params: dict, **runtime):
    """TrainConfig.from_plan with the flags typed next to --plan: an override, or an InputError naming every flag
    that would change what the plan costs (one that only repeats the plan's value is fine)."""
    from click.core import ParameterSource

    from cptsim.run import train as T
    from cptsim.errors import InputError
    from cptsim.cost.schedules import Schedule

    ctx = click.get_current_context()
    typed = {name for name in params
             if ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)}
    w = plan["workload"]
    planned = {k: w.get(k) for k in _PLAN_FIXED_FLAGS}
    planned["number_format"] = planned["number_format"] or "int"  # a plan of integers names no format
    plan_sched = Schedule.from_json(plan["schedule"]).to_text()
    wrong = []
    for key, flag in _PLAN_FIXED_FLAGS.items():
        if key in typed:
            value = parse_fp_layers(params[key]) if key == "fp_layers" else params[key]
            if value != planned[key]:
                wrong.append(f"{flag} {params[key]} (the plan's: {planned[key]})")
    sched_typed = [flag for key, flag in _SCHEDULE_FLAGS.items() if key in typed]
    if sched_typed:
        base = params["schedule"] if "schedule" in typed else plan_sched
        try:
            text = _schedule_text(base, *(params[k] if k in typed else None
                                          for k in ("q_min", "q_max", "g_bits", "cycles")))
        except InputError:
            text = None
        if text != plan_sched:
            wrong.append(f"{'/'.join(sched_typed)} (the plan's schedule: {plan_sched})")
    if wrong:
        raise InputError("with --plan, flags that change the planned workload and its cost are refused: "
                         + "; ".join(wrong) + "; re-plan with them, or leave them out")
    overrides = {}
    for key in _PLAN_OVERRIDABLE:
        if key == "augment" and "no_augment" in typed:
            overrides["augment"] = not params["no_augment"]
        elif key in typed:
            overrides[key] = params[key]
    changed = {k: v for k, v in overrides.items() if v != w.get(k)}
    cfg = T.TrainConfig.from_plan(plan, **overrides, **runtime)
    return cfg, changed


def _check_plan_data(plan: dict, cfg) -> None:
    """A plan is costed for a number of samples per epoch; refuse to train it on data of another size (it would
    run a different number of steps, or epochs, than the plan costed)."""
    from cptsim.cost.runlength import RunLength
    from cptsim.data import dataset_size
    from cptsim.errors import InputError

    w = plan["workload"]
    if cfg.dataset == "imagefolder" and w.get("input_shape"):  # an older plan, or images resized since
        from cptsim.data import dataset_info

        shape = list(dataset_info(cfg.dataset, cfg.data_dir, cfg.image_size).input_shape)
        if shape != list(w["input_shape"]):
            raise InputError(f"the plan was made for input {'x'.join(map(str, w['input_shape']))}, but the images "
                             f"in {cfg.data_dir} give {'x'.join(map(str, shape))}; re-plan for these images ('cptsim plan "
                             "--image-size N' picks the size)")
    planned, found = w.get("dataset_size"), dataset_size(cfg.dataset, cfg.data_dir)
    if planned is None or found is None or planned == found:
        return
    b = cfg.batch_size
    where = cfg.data_dir if cfg.data_dir else f"the {cfg.dataset} dataset"
    if w.get("epochs"):
        e = w["epochs"]
        runs = (f" ({e} epochs = {w['steps']} steps of {b}), but {where} holds {found} "
                f"({e} epochs would be {RunLength(b, found).epoch_steps(e)} steps)")
    else:
        runs = (f" ({w['steps']} steps of {b} = {w['steps'] * b / planned:.3g} epochs), but {where} holds {found} "
                f"({w['steps'] * b / found:.3g} epochs in {w['steps']} steps)")
    again = f"--data-dir {cfg.data_dir}" if cfg.data_dir else f"--dataset {cfg.dataset}"
    raise InputError(f"the plan was made for {planned} training samples per epoch{runs}; re-plan with {again}")


def _warn_if_hardware_changed(plan: dict) -> None:
    """A plan's estimate holds for the hardware profile it was made with; say so if that file changed since."""
    from cptsim.errors import InputError
    from cptsim.cost.hardware import load_profile

    hw = plan["hardware"]
    try:
        current = load_profile(hw.get("path") or hw["name"])
    except InputError:
        err.print(f"[yellow]warning:[/] the plan's hardware profile {hw['name']!r} cannot be loaded here; "
                  "its estimate cannot be re-checked")
        return
    if current.content_hash != hw["hash"]:
        err.print(f"[yellow]warning:[/] hardware profile {hw['name']!r} changed since the plan was made "
                  f"(hash {hw['hash']} -> {current.content_hash}); re-plan to refresh the estimate")


_TENSORBOARD = "cptsim.run.tensorboard"


def _tensorboard_option(ctx, param, value):
    """--tensorboard DIR: checked when parsed (a missing package fails before anything is built), kept in ctx.meta
    for ``_tensorboard``: it changes what is logged, never what runs."""
    if value is not None:
        from cptsim.run.tensorboard import require_tensorboard

        require_tensorboard()
    ctx.meta[_TENSORBOARD] = value
    return value


def _tensorboard(cfg):
    """The config with the --tensorboard directory (if any) set."""
    cfg.tensorboard = click.get_current_context().meta.get(_TENSORBOARD)
    return cfg


@click.command("train", epilog=_EPILOG)
@_bad_input_stops_the_job
@workload_options("model", "dataset", "data_dir", "image_size")
@click.option("--schedule", default="cpt", show_default=True, help="Precision schedule, name or text form.")
@click.option("--q-min", type=int, default=None, help="Lower forward bits (default 3, or from the text).")
@click.option("--q-max", type=int, default=None, help="Upper forward bits (default 8, or from the text).")
@click.option("--g-bits", default=None, help='Gradient bits "G" or "GMIN-GMAX" (default 8).')
@click.option("--cycles", type=int, default=None, help="Schedule cycles over the whole run (default 32).")
@workload_options("epochs", "steps", "batch_size")
@workload_options("lr")
@click.option("--momentum", type=float, default=0.9, show_default=True)
@click.option("--weight-decay", type=float, default=5e-4, show_default=True)
@click.option("--lr-schedule", type=click.Choice(["step", "cosine", "constant"]), default="cosine", show_default=True,
              help="step: x0.1 at 50% and 75% of the steps (CPT's recipe); cosine: to --lr-min over the run.")
@workload_options("optimizer", "lr_min", "quant_agg", "fp_layers")
@workload_options("number_format", "grad_format")
@layer_schedule_options
@click.option("--no-augment", is_flag=True, help="Turn off random crop / flip for CIFAR and ImageFolder.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda.")
@click.option("--workers", type=int, default=0, show_default=True, help="DataLoader worker processes.")
@click.option("--threads", type=int, default=None,
              help="CPU threads for torch. Default: 1 for small inputs (digits, MNIST), whose ops are too small to "
                   "split, else torch's default.")
@click.option("--eval-bits", type=int, default=None,
              help="Forward bits the model is evaluated at [default: the schedule's q_max].")
@click.option("--recal-batches", type=int, default=16, show_default=True,
              help="Before every evaluation, re-estimate BatchNorm statistics and activation ranges at the "
                   "evaluation bits from this many training batches (forward only; 0 = off). Without it a schedule "
                   "that ends below q_max is judged with statistics of the wrong precision.")
@click.option("--val-split", type=float, default=0.0, show_default=True,
              help="Hold out this fraction of the training data (a fixed subset) and report validation accuracy "
                   "too (metrics.jsonl val_acc); the pilot uses 0.2.")
@click.option("--out", default=None, help="Run directory to create (must not exist). Default runs/MODEL-SCHEDULE-TIME.")
@click.option("--resume", "resume_dir", default=None, help="Continue this run directory from its last checkpoint.")
@click.option("--plan", "plan_path", default=None,
              help="Train exactly the workload and schedule of a plan.json from 'cptsim plan'. Next to it, --seed, "
                   "--lr, --momentum, --weight-decay, --lr-schedule, --no-augment and --data-dir override the plan "
                   "(recorded in config.json); --model, --dataset, --schedule and its bits, --epochs, --steps, "
                   "--batch-size and --fp-layers would change what the plan costs and are refused (exit 2) unless "
                   "they repeat the plan's value. A plan whose samples per epoch differ from the data found is "
                   "refused too.")
@click.option("--checkpoint-every", type=int, default=None,
              help="Also checkpoint every N steps inside an epoch (default: at the end of each epoch).")
@click.option("--nproc", type=int, default=None,
              help="Data-parallel worker processes on this machine (torchrun; gloo on CPU, NCCL on CUDA). "
                   "--batch-size stays the global batch. Under your own torchrun, leave this out.")
@click.option("--max-restarts", type=click.IntRange(min=0), default=None,
              help="With --nproc: when a worker dies, torchrun restarts them all up to this many times and they "
                   "resume from the last checkpoint (torchrun --max-restarts). Bad input is never restarted: it is "
                   "refused before the workers start, or, when a worker finds it, stops the job (exit 2). "
                   "[default: 0]")
@click.option("--keep-checkpoints", type=click.IntRange(min=1), default=None,
              help="Checkpoints kept, newest first (each with its SHA-256 in checkpoints.json); resume falls back "
                   "to an older one when the newest is damaged. [default: 2; with --resume: the run's own]")
@click.option("--channels-last", is_flag=True,
              help="Channels-last (NHWC) activations and weights: faster convolutions on tensor-core GPUs. Changes "
                   "no cost the plan counts, so it may go next to --plan.")
@click.option("--list-models", is_flag=True, help="List model names and exit.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--tensorboard", default=None, metavar="DIR", expose_value=False, callback=_tensorboard_option,
              help="Also log bits, loss, lr, cumulative BitOPs, modelled energy and test metrics to TensorBoard "
                   "in DIR (pip install 'cptsim[tensorboard]').")
@json_option
def train(model, dataset, data_dir, image_size, schedule, q_min, q_max, g_bits, cycles, epochs, steps, batch_size, lr, momentum,
          weight_decay, lr_schedule, optimizer, lr_min, quant_agg, fp_layers, number_format, grad_format,
          layer_schedule, layer_rules, no_augment, seed, device, workers, out, resume_dir, plan_path,
          threads, eval_bits, recal_batches, val_split, checkpoint_every, nproc, max_restarts, keep_checkpoints,
          channels_last, list_models, quiet, as_json) -> None:
    """Run real quantized training with a cyclic precision schedule and record what ran."""
    from cptsim.run import train as T
    from cptsim.run.rundir import run_summary

    if list_models:
        from cptsim.models import list_models as names

        click.echo("\n".join(names()))
        click.echo("torchvision:NAME  any classifier in torchvision.models (random init)\n"
                   "timm:NAME         any timm architecture (random init; pip install 'cptsim[timm]')")
        return
    t0 = time.perf_counter()
    progress = not (quiet or as_json)
    if resume_dir and plan_path:
        raise click.UsageError("--resume continues a run with its own settings; it takes no --plan")
    # With --nproc this process launches the workers, after the checks below (each branch launches before it
    # trains): bad input is refused here, at once, not by every worker of every restart.
    launch = None if nproc is None else _launch_argv(nproc)
    if max_restarts is not None and nproc is None:
        from cptsim.errors import InputError

        raise InputError("--max-restarts goes with --nproc (under your own torchrun, give torchrun --max-restarts)")
    keep = {} if keep_checkpoints is None else {"keep_checkpoints": keep_checkpoints}
    from cptsim.run import dist as D

    if not resume_dir and D.restart_count() and out is not None and (Path(out) / "config.json").is_file():
        # torchrun restarted the job after a worker died: continue the run its first attempt began (the same
        # command runs again, so a new run's --out is now an existing run)
        resume_dir = out
        if os.environ.get("RANK", "0") == "0":
            err.print(f"restart {D.restart_count()} of the job: resuming {out} from its last checkpoint",
                      highlight=False)
    if resume_dir:
        if launch is not None:
            return _launch(launch, nproc, None, resume_dir, model, schedule, max_restarts or 0)
        run = T.resume(resume_dir, progress=progress, keep_checkpoints=keep_checkpoints)
    elif plan_path:
        from cptsim.run.planfile import read_plan

        if layer_schedule or layer_rules:
            raise click.UsageError("a plan fixes the per-layer precision it costs; re-plan instead of --layer")

        plan = read_plan(plan_path)
        params = {"model": model, "dataset": dataset, "data_dir": data_dir, "schedule": schedule, "q_min": q_min,
                  "q_max": q_max, "g_bits": g_bits, "cycles": cycles, "epochs": epochs, "steps": steps,
                  "batch_size": batch_size, "lr": lr, "momentum": momentum, "weight_decay": weight_decay,
                  "lr_schedule": lr_schedule, "fp_layers": fp_layers, "no_augment": no_augment, "seed": seed,
                  "image_size": image_size, "optimizer": optimizer, "lr_min": lr_min, "quant_agg": quant_agg,
                  "number_format": number_format, "grad_format": grad_format}
        evaluation = {k: v for k, v in (("eval_bits", eval_bits), ("recal_batches", recal_batches),
                                        ("val_split", val_split)) if click.get_current_context().get_parameter_source(
            k) not in (None, click.core.ParameterSource.DEFAULT)}
        # the memory format follows the plan (it changes the cost) unless the flag is given, which must agree
        layout = {"channels_last": True} if channels_last else {}
        cfg, changed = _plan_config(plan, params, device=device, workers=workers, checkpoint_every=checkpoint_every,
                                    threads=threads, **layout, **evaluation, **keep)
        _check_plan_data(plan, cfg)
        if launch is not None:
            return _launch(launch, nproc, out, None, cfg.model, cfg.schedule, max_restarts or 0, cfg.dataset)
        _warn_if_hardware_changed(plan)
        if out is None:
            out = _default_out(cfg.model, cfg.schedule)
        if progress:
            err.print(f"training plan {plan_path}: {cfg.model} on {cfg.dataset} with {cfg.schedule}"
                      f"{_layer_rule_text(cfg.layer_schedule)} -> {out}", highlight=False)
        if changed:
            err.print("overriding the plan: " + ", ".join(
                "--no-augment (the plan augments)" if k == "augment" else
                f"{_PLAN_OVERRIDABLE[k]} {v} (the plan's: {plan['workload'].get(k)})" for k, v in changed.items()),
                highlight=False)
        run = T.train(_tensorboard(cfg), out, progress=progress, plan=plan)
    else:
        from cptsim.data import default_dataset

        dataset = dataset or default_dataset(model)
        text = _schedule_text(schedule, q_min, q_max, g_bits, cycles)
        fp = parse_fp_layers(fp_layers)
        layers = parse_layer_options(layer_schedule, layer_rules)
        cfg = T.TrainConfig(layer_schedule=layers, model=model, dataset=dataset, data_dir=data_dir, schedule=text,
                            epochs=epochs, steps=steps, batch_size=batch_size, lr=lr, momentum=momentum,
                            weight_decay=weight_decay, lr_schedule=lr_schedule, optimizer=optimizer, lr_min=lr_min,
                            quant_agg=quant_agg, fp_layers=fp, seed=seed, device=device, workers=workers,
                            augment=not no_augment, checkpoint_every=checkpoint_every, threads=threads,
                            eval_bits=eval_bits, recal_batches=recal_batches, val_split=val_split,
                            channels_last=channels_last, image_size=image_size, number_format=number_format,
                            grad_format=grad_format, **keep)
        # Cheap checks first, so that a typo is the only line the user sees (the banner below would precede it).
        from cptsim.data import check_data_dir, dataset_info
        from cptsim.errors import InputError
        from cptsim.models import meta_model

        T.validate(cfg)
        info = dataset_info(dataset, data_dir, image_size)
        check_data_dir(dataset, data_dir)
        try:  # on the meta device: no weights are made, only the name and the model/data pairing are checked
            meta = meta_model(model, num_classes=info.num_classes, in_channels=info.input_shape[0],
                              input_shape=tuple(info.input_shape), graph=info.graph_edges is not None)
            if fp:  # and that every --fp-layers pattern names a layer of it
                from cptsim.numerics.layers import resolve_fp_layers

                resolve_fp_layers(meta, fp)
            if layers:  # and that every layer rule fits it
                _check_layers(meta, model, text, fp, layers)
        except InputError:
            raise
        except Exception:  # noqa: BLE001 - a model that cannot be built on meta is checked by the real build
            pass
        if launch is not None:
            return _launch(launch, nproc, out, None, model, text, max_restarts or 0, dataset)
        if out is None:
            out = _default_out(model, text)
        if progress:
            fmt = "" if number_format == "int" and grad_format is None else \
                f" in {number_format} formats" + (f", gradients {grad_format}" if grad_format else "")
            err.print(f"training {model} on {dataset} with {text}{_layer_rule_text(layers)}{fmt} -> {out}  (eval at "
                      f"{f'{eval_bits} bits' if eval_bits else 'q_max'})", highlight=False)
        run = T.train(_tensorboard(cfg), out, progress=progress)
    from cptsim.run import dist

    dist.shutdown()
    if os.environ.get("RANK", "0") != "0":
        return  # rank 0 reports for the job
    summary = run_summary(run) | {"wall_time_s": round(time.perf_counter() - t0, 2)}
    fmt = _number_format(run)
    if fmt is not None:
        summary["number_format"] = fmt
    if as_json:
        emit_json(summary)
        return
    table = Table(title=f"run {summary['run']}", title_justify="left", show_header=False)
    table.add_column("figure")
    table.add_column("value", justify="right")
    acc = summary["final_test_acc"]
    best = summary["best_test_acc"]
    rows = [
        ("model / dataset", f"{summary['model']} / {summary['dataset']}"),
        ("schedule", summary["schedule"] if fmt is None else f"{summary['schedule']} in {fmt['label']}"),
        ("steps", f"{summary['steps_done']} / {summary['total_steps']}"),
        ("epochs evaluated", str(summary["epochs_done"])),
        (f"final test accuracy @ {summary['eval_bits']} bits", "-" if acc is None else f"{100 * acc:.2f}%"),
        ("best test accuracy", "-" if best is None else f"{100 * best:.2f}%"),
        ("mean forward bits" if fmt is None else "mean forward width (the schedule's nominal bits)",
         "-" if summary["mean_bits"] is None else f"{summary['mean_bits']:.2f}"),
        *([] if fmt is None or fmt["mean_element_bits"] is None else [
            # a float family: the schedule's widths are nominal, what BitOPs count is each format's element bits
            ("mean forward element bits (what BitOPs count)", f"{fmt['mean_element_bits']:.2f}")]),
        ("training time (sum of steps)", f"{summary['train_time_s']:.1f} s"),
        ("wall time", f"{summary['wall_time_s']:.1f} s"),
    ]
    if summary.get("final_test_ppl") is not None:  # a language model: perplexity, not accuracy
        rows[4:6] = [(f"final test perplexity @ {summary['eval_bits']} bits", f"{summary['final_test_ppl']:.2f}"),
                     ("final validation perplexity", "-" if summary["final_val_ppl"] is None
                      else f"{summary['final_val_ppl']:.2f}")]
        if summary.get("final_test_bpc") is not None:
            rows.insert(6, ("final test bits per character", f"{summary['final_test_bpc']:.3f}"))
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)


def _layer_rule_text(layers: dict | None) -> str:
    """The banner's words for a per-layer schedule (TrainConfig.layer_schedule): the rules, in the text form
    `--layer` takes and plan.json's layers.text holds."""
    rules = (layers or {}).get("rules") or []
    return f" and layer rule {';'.join(map(str, rules))}" if rules else ""


def _number_format(run) -> dict | None:
    """A float-format run's formats and the bits its BitOPs count (cptsim.study.report.number_format_of), or None."""
    from cptsim.study.report import number_format_of, run_format_map

    fmap = run_format_map(run.read_config())
    if fmap is None:
        return None
    steps = run.read_trace().records
    return number_format_of(fmap, [r["bits"] for r in steps], [r["grad_bits"] for r in steps])

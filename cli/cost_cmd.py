"""`cptsim cost`: what one precision schedule costs over a whole run, on several hardware profiles side by side."""

from __future__ import annotations

import click
from rich.table import Table

from cptsim.errors import InputError

from .common import (batch_size_or_default, emit_json, err, json_option, out, print_table, run_length, si,
                     wide_option)
from .common import workload_options
from .timing import rate_text, sureness_lines, throughput, time_sureness
from .workload import build_profile, profile_flags, resolve_workload

DEFAULT_HW = "h100,a100,bitfusion,stripes,int8-systolic"

_EPILOG = """\b
Examples:
  cptsim cost --model resnet20 --dataset cifar10 --schedule cpt:3-8:g8:n32 --steps 64000
  cptsim cost --schedule rex-tri-h:4-8:g8:n8 --epochs 15 --batch-size 64 --hw h100,bitfusion --json

\b
BitOPs do not depend on the hardware (MACs x operand bits, per phase: fwd b_w·b_a, dgrad b_g·b_w,
wgrad b_g·b_a; full-precision layers at 32 bits). Energy and latency do: a GPU runs every width up to 8 bits
on its int8 tier (H100 has no int4), Bit Fusion's fused bricks speed up 4x per halving of both operands,
a bit-serial array scales with one operand's width, an 8-bit systolic array not at all -- and every profile
also pays DRAM traffic. AMP means AMP: on a GPU, a step at 16 bits or less (static:16 is AMP) runs every conv and
linear layer in FP16, as torch.autocast does, the full-precision layers (--fp-layers, the classifier...) included;
that changes the GPU's time and energy only -- BitOPs keep those layers at 32 bits. FP32 convolutions run on TF32
where the GPU has it (cuDNN's default), FP32 matmuls on strict FP32 (torch.backends.cuda.matmul.allow_tf32 is
False by default). "saving" = 1 - cost / cost of the static q_max run with the same gradient bits.
With a known epoch size the ragged last batch of every epoch is costed exactly; with --data-dir holding the
dataset, the epoch size is that of the data there (a subset costs what training on it costs).
--number-format fp|mx|nvfp makes every width name a float format (mx: 4 MXFP4, 6 MXFP6, 8 MXFP8; a width the family
lacks takes the next wider format): BitOPs count element bits, memory traffic storage bits (MXFP4 4.25, NVFP4 4.5),
and a GPU runs each GEMM on the narrowest tier listing both operands' formats, a format it has no tier for on the
next wider one (FP8 on an A100: FP16). Bit Fusion, Stripes and the int8 array compute integers only and refuse it.
"""


@click.command("cost", epilog=_EPILOG)
@profile_flags
@workload_options("epochs", "steps")
@click.option("--schedule", default="cpt", show_default=True, help="Precision schedule, name or text form.")
@click.option("--dataset-size", type=int, default=None,
              help="Training samples per epoch [default: counted in --data-dir when the data is there (no image "
                   "loaded), else the dataset's full train split]; contradicting the data found is an error.")
@click.option("--hw", "--hardware", "hw", default=DEFAULT_HW, show_default=True,
              help="Comma-separated hardware profiles (names or .toml paths).")
@click.option("--number-format", "number_format", default="int", show_default=True,
              help="Format family the schedule's widths name: int (CPT's integers, today's cost), fp (4 fp4e2m1, "
                   "6 fp6e3m2, 8 fp8e4m3), mx (4 mxfp4, 6 mxfp6, 8 mxfp8), nvfp (4 nvfp4, 8 fp8e4m3); a width the "
                   "family lacks takes the next wider format, 9..16 bf16 (cptsim.numerics.families).")
@click.option("--grad-format", "grad_format", default=None,
              help="Format of every gradient operand (e.g. fp8e5m2, mxfp8); needs a float --number-format.")
@wide_option
@json_option
def cost(model, dataset, data_dir, image_size, input_shape, num_classes, fp_layers, channels_last, optimizer,
         quant_agg, schedule, steps, epochs, batch_size, dataset_size, hw, number_format, grad_format,
         as_json) -> None:
    """Cost one precision schedule over a training run on several hardware profiles: BitOPs, energy, latency,
    and the saving over the static q_max schedule on each."""
    from cptsim.cost.model import estimate
    from cptsim.data import epoch_size
    from cptsim.cost.hardware import load_profiles
    from cptsim.cost.schedules import parse_schedule
    from cptsim.numerics.families import format_map

    fmap = format_map(number_format, grad_format)
    sched = parse_schedule(schedule)
    if steps is not None and epochs is not None:
        raise InputError("give --steps or --epochs, not both")
    epochs_given = epochs is not None
    epochs, steps = run_length(epochs, steps, dataset, model)
    batch_size = batch_size_or_default(batch_size, dataset, model)
    for flag, v in (("--steps", steps), ("--epochs", epochs), ("--batch-size", batch_size),
                    ("--dataset-size", dataset_size)):
        if v is not None and v < 1:
            raise InputError(f"{flag} must be at least 1, got {v}")
    names = [h.strip() for h in hw.split(",") if h.strip()]
    if not names:
        raise InputError("--hw needs at least one hardware profile")
    profiles = load_profiles(names)  # one name twice (two files called bitfusion) is refused: two rows alike
    for p in profiles:
        p.with_formats(fmap)  # an integer-only accelerator refuses float formats before any work
    shape, classes, info = resolve_workload(model, dataset, data_dir, input_shape, num_classes, image_size)
    size_from = "--dataset-size" if dataset_size is not None else None
    if info is not None:
        dataset_size, size_from = epoch_size(info.name, data_dir, dataset_size)
    if epochs is not None and dataset_size is None:
        if not epochs_given:
            raise InputError(f"the run length is {epochs} epochs by default, and the epoch size is unknown: give "
                             "--steps T, or --dataset-size N" + (f" (or --data-dir holding the {dataset} data)"
                                                                 if dataset else " or --dataset"))
        raise InputError("--epochs needs the epoch size: give --dataset-size"
                         + (f" (or --data-dir holding the {dataset} data)" if dataset else " or --dataset"))
    from cptsim.cost.schedules import aliasing
    from cptsim.data import default_input_warning

    # what the table would not show: an input the model was not made for, taken by default; an aliasing schedule
    warnings = [w for w in (default_input_warning(model, dataset, input_shape is not None),) if w]
    with err.status(f"profiling {model}: one training step on input {tuple(shape)} ..."):
        prof = build_profile(model, shape, classes, fp_layers, channels_last, info, dataset, optimizer, quant_agg)
    costs = [estimate(prof, sched, p, steps=steps, epochs=epochs, batch_size=batch_size, dataset_size=dataset_size,
                      per_layer=False, formats=fmap) for p in profiles]
    first = costs[0]
    alias = aliasing(sched, first.steps)
    if alias:
        warnings.append(alias)
    for w in warnings if not as_json else ():  # one line each, unwrapped; --json carries them in its document
        click.echo(f"warning: {w}", err=True)
    workload = {"model": model, "dataset": info.name if info is not None else dataset, "input_shape": list(shape),
                "num_classes": classes, "schedule": sched.to_text(), "steps": first.steps, "samples": first.samples,
                "batch_size": batch_size, "dataset_size": dataset_size,
                "dataset_size_from": size_from, "static_bits": sched.q_max}
    if fmap is not None:
        workload["number_format"], workload["grad_format"] = fmap.family, fmap.grad_format

    mix = prof.op_mix()
    sureness = {p.name: time_sureness(p, prof, mix, c) for p, c in zip(profiles, costs)}
    if as_json:
        rows = []
        for p, c in zip(profiles, costs):
            d = c.to_json()
            d.pop("per_layer")
            rows.append({"hardware": p.name, "kind": p.kind, **d,
                         "saving_vs_static": {k: 1.0 - v for k, v in c.vs_static.items()},
                         "throughput": throughput(c.samples, c.latency_s["total"], dataset_size),
                         **sureness[p.name]})
        emit_json({"workload": {**workload, "op_mix": mix, "channels_last": bool(channels_last)}, "profiles": rows,
                   "warnings": warnings})
        return

    epochs_txt = f", {first.samples / dataset_size:.4g} epochs of {dataset_size}" if dataset_size else ""
    data = workload["dataset"] or "--input-shape"
    t = Table(title=f"{sched.to_text()} on {model}, {data} input {'x'.join(map(str, shape))}: {first.steps} steps x "
                    f"{batch_size}{epochs_txt}; "
                    f"baseline: static {sched.q_max} bits, same gradient bits",
              title_justify="left")
    t.add_column("hardware", no_wrap=True, min_width=max(len(p.name) for p in profiles))
    for col in ("kind", "BitOPs", "vs FP32", "vs static", "energy", "latency", "energy saving",
                "latency saving"):
        t.add_column(col, justify="left" if col == "kind" else "right")
    for p, c in zip(profiles, costs):
        t.add_row(p.name, p.kind, si(c.bitops["total"]), f"{100 * c.relative_to_fp32:.2f}%",
                  f"{100 * c.relative_to_static:.1f}%", si(c.energy_j["total"], "J"), si(c.latency_s["total"], "s"),
                  f"{100 * (1 - c.vs_static['energy_j']):.1f}%", f"{100 * (1 - c.vs_static['latency_s']):.1f}%")
    print_table(t, drop=("vs FP32", "kind", "vs static", "energy", "latency"))
    out.print("saving = 1 - cost / static q_max cost on the same hardware; BitOPs are hardware-independent.",
              highlight=False)
    s = Table(title=f"throughput: {sched.to_text()}, batch {batch_size}", title_justify="left")
    s.add_column("hardware", no_wrap=True, min_width=max(len(p.name) for p in profiles))
    for col in ("samples/s", "time/step", "time/epoch", "run time", "avg power"):
        s.add_column(col, justify="right")
    for p, c in zip(profiles, costs):
        speed = throughput(c.samples, c.latency_s["total"], dataset_size)
        t_run = c.latency_s["total"]
        s.add_row(p.name, rate_text(speed["samples_per_s"]), si(t_run / c.steps, "s"),
                  si(speed["epoch_s"], "s") if speed["epoch_s"] is not None else "-", si(t_run, "s"),
                  si(c.energy_j["total"] / t_run, "W") if t_run > 0 else "-")
    print_table(s, drop=("avg power", "run time", "time/step"))
    if fmap is not None:
        used = first.formats["run"]
        out.print(f"formats ({fmap.family}): " + ", ".join(f"{w} bits {n}" for w, n in used["forward"].items())
                  + "; gradients " + ", ".join(f"{w} bits {n}" for w, n in used["gradient"].items()),
                  highlight=False, markup=False)
        for p, c in zip(profiles, costs):
            tiers = c.formats.get("tiers")
            if tiers:
                out.print(f"{p.name} tiers: " + "; ".join(f"q{r['bits']}/g{r['grad_bits']} fwd {r['fwd']}, dgrad "
                                                          f"{r['dgrad']}, wgrad {r['wgrad']}" for r in tiers),
                          highlight=False, markup=False)
    for p in profiles:
        for line in sureness_lines(p.name, sureness[p.name]):
            out.print(line, highlight=False, markup=False)  # [validation] is text, not markup
    for p in profiles:
        for n in p.notes:
            err.print(f"[yellow]note ({p.name}):[/yellow] {n}", highlight=False)

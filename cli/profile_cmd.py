"""`cptsim profile`: per-layer MACs of one real quantized training step, and what a step costs at given bits."""

from __future__ import annotations

import click
from rich.table import Table

from cptsim.errors import InputError

from .common import batch_size_or_default, emit_json, err, json_option, out, si
from .timing import rate_text, throughput
from .workload import build_profile, profile_flags, resolve_workload

_EPILOG = """\b
Examples:
  cptsim profile                                     digits-cnn on digits (8x8), 8/8 bits, batch 64, h100
  cptsim profile --model resnet20 --dataset cifar10 --bits 4 --hw bitfusion
  cptsim profile --model token-mlp --input-shape 16,64 --num-classes 10 --json

\b
MACs are measured by hooks during one real training step (forward, loss, backward) on a copy of the model,
quantized as training would quantize it: dgrad is 0 where a layer's input needs no gradient (the first layer),
wgrad 0 for frozen weights. MACs are per sample; BitOPs, energy and latency are per step of --batch-size
samples at --bits (weights, activations) and --grad-bits (errors). No dataset needs to be on disk.
"""


def _epoch_samples(info, data_dir) -> int | None:
    if info is None:
        return None
    from cptsim.data import epoch_size

    return epoch_size(info.name, data_dir)[0]


def speed_text(speed: dict) -> str:
    txt = f"{rate_text(speed['samples_per_s'])} samples/s"
    if speed["epoch_s"] is not None:
        txt += f", {si(speed['epoch_s'], 's')} per epoch of {speed['epoch_samples']:,} samples"
    return txt


@click.command("profile", epilog=_EPILOG)
@profile_flags
@click.option("--hw", "--hardware", "hw", default="h100", show_default=True,
              help="Hardware profile (name or .toml path) for energy and latency per step.")
@click.option("--bits", type=int, default=8, show_default=True, help="Forward bits (weights and activations).")
@click.option("--grad-bits", type=int, default=8, show_default=True, help="Gradient (error) bits.")
@json_option
def profile(model, dataset, data_dir, image_size, input_shape, num_classes, fp_layers, channels_last, batch_size,
            optimizer, quant_agg, hw, bits, grad_bits, as_json) -> None:
    """Per-layer MACs (forward, dgrad, wgrad) of a model, measured in one real training step, and the BitOPs,
    energy and latency of one step at the given bits on a hardware profile."""
    from cptsim.cost.model import estimate, step_cost
    from cptsim.cost.hardware import load_profile
    from cptsim.numerics.quant import check_bits

    check_bits(bits, "--bits")
    check_bits(grad_bits, "--grad-bits")
    batch_size = batch_size_or_default(batch_size, dataset, model)
    if batch_size < 1:
        raise InputError(f"--batch-size must be at least 1, got {batch_size}")
    hardware = load_profile(hw)
    shape, classes, info = resolve_workload(model, dataset, data_dir, input_shape, num_classes, image_size)
    from cptsim.data import default_input_warning

    warning = default_input_warning(model, dataset, input_shape is not None)
    if warning and not as_json:
        click.echo(f"warning: {warning}", err=True)  # one line, unwrapped; --json carries it in its document
    with err.status(f"profiling {model}: one training step on input {tuple(shape)} ..."):
        prof = build_profile(model, shape, classes, fp_layers, channels_last, info, dataset, optimizer, quant_agg)
    step = {"batch_size": [batch_size], "bits": [bits], "grad_bits": [grad_bits]}
    cost = estimate(prof, step, hardware)
    speed = throughput(batch_size, cost.latency_s["total"], _epoch_samples(info, data_dir))
    totals = prof.totals()
    grand = sum(totals.values())

    if as_json:
        doc = prof.to_json()
        exact = step_cost(prof.arrays(), bits, grad_bits, batch_size)  # one step's MACs / BitOPs as exact ints
        for layer, row in zip(doc["layers"], cost.per_layer):
            layer["step"] = {"bitops": {k: int(round(v)) for k, v in row["bitops"].items()},
                             "energy_j": row["energy_j"], "latency_s": row["latency_s"]}
        doc["totals"] = {"macs_per_sample": totals}
        doc["warnings"] = [warning] if warning else []
        doc["step"] = {"batch_size": batch_size, "bits": bits, "grad_bits": grad_bits, "hardware": hardware.name,
                       "hardware_hash": hardware.content_hash,
                       "macs": {**exact["macs"], "total": sum(exact["macs"].values())},
                       "bitops": {**exact["bitops"], "total": sum(exact["bitops"].values())},
                       "energy_j": cost.energy_j, "latency_s": cost.latency_s,
                       "relative_to_fp32": cost.relative_to_fp32, "throughput": speed}
        emit_json(doc)
        return

    t = Table(title=f"{model}, input {tuple(shape)}: MACs per sample; one step of {batch_size} at "
                    f"{bits}/{grad_bits} bits on {hardware.name}", title_justify="left")
    # Names first: on a narrow terminal the figures shrink, never the layer names.
    t.add_column("layer", no_wrap=True, min_width=min(30, max(len(r.name) for r in prof.layers)))
    for col in ("type", "quant"):
        t.add_column(col, no_wrap=True)
    for col in ("fwd MAC", "dgrad MAC", "wgrad MAC", "share", "BitOPs/step", "energy/step", "latency/step"):
        t.add_column(col, justify="right")
    for rec, row in zip(prof.layers, cost.per_layer):
        share = sum(rec.macs.values()) / grand if grand else 0.0
        t.add_row(rec.name, rec.type, "yes" if rec.quantized else "fp32",
                  *(si(rec.macs[p]) for p in ("fwd", "dgrad", "wgrad")), f"{100 * share:.1f}%",
                  si(row["bitops"]["total"]), si(row["energy_j"]["total"], "J"), si(row["latency_s"]["total"], "s"))
    other_t = cost.latency_s["total"] - sum(r["latency_s"]["total"] for r in cost.per_layer)
    if prof.ops is not None and other_t > 0:  # a GPU costs the step's other ops and kernel launches too
        other_e = cost.energy_j["total"] - sum(r["energy_j"]["total"] for r in cost.per_layer)
        t.add_row(f"other ops ({int(prof.ops.totals()['launches'])} kernels)", "", "", "", "", "", "", "",
                  si(other_e, "J"), si(other_t, "s"))
    t.add_section()
    t.add_row("total", "", f"{sum(r.quantized for r in prof.layers)}/{len(prof.layers)}",
              *(si(totals[p]) for p in ("fwd", "dgrad", "wgrad")), "100%", si(cost.bitops["total"]),
              si(cost.energy_j["total"], "J"), si(cost.latency_s["total"], "s"))
    out.print(t)
    out.print(f"BitOPs relative to FP32: {100 * cost.relative_to_fp32:.2f}%  "
              f"(quant = quantized at {bits}/{grad_bits} bits; fp32 layers count at 32 bits)", highlight=False)
    out.print(f"throughput on {hardware.name}: {speed_text(speed)}", highlight=False)
    for n in hardware.notes:
        err.print(f"[yellow]note:[/yellow] {n}", highlight=False)

"""`cptsim range-test`: CPT's precision range test, a short real training run that suggests q_min."""

from __future__ import annotations

import click
from rich.table import Table

from .common import batch_size_or_default, emit_json, err, json_option, out, parse_fp_layers, workload_options

_EPILOG = """\b
How it works: one model trains in stages at forward precision q_start, q_start+1, ..., q_max
(--steps-per-stage SGD steps each, default one epoch; gradient bits fixed). Each stage's training
accuracy is compared with the previous stage's (the untrained model's, measured in eval mode at
q_start, for the first); q_min = the first precision whose accuracy improves by more than
--threshold (0.05 = 5 points). If none does, the test is inconclusive and suggests the precision
that improved most (q_max if none improved).
With --number-format fp|mx|nvfp the stages run that family's formats, one stage per distinct
format (mx 2..8: 4 MXFP4, 6 MXFP6, 8 MXFP8; a width the family lacks runs the next wider format).

\b
Examples:
  cptsim range-test                              digits, digits-cnn, 2..8 bits, one epoch per stage
  cptsim range-test --steps-per-stage 50 --threshold 0.1
  cptsim range-test --number-format mx --grad-format mxfp8 --steps-per-stage 50
  cptsim range-test --model resnet20 --dataset cifar10 --data-dir ~/data --steps-per-stage 200 --json
"""


@click.command("range-test", epilog=_EPILOG)  # its short help is in cli/main.py's table
@workload_options("model", "dataset", "data_dir", "image_size", "batch_size", "fp_layers", "number_format",
                  "grad_format")
@click.option("--lr", type=float, default=0.05, show_default=True, help="Constant SGD learning rate.")
@click.option("--q-start", type=int, default=2, show_default=True, help="First (lowest) forward precision tried.")
@click.option("--q-max", type=int, default=8, show_default=True, help="Last (highest) forward precision tried.")
@click.option("--g-bits", type=int, default=8, show_default=True, help="Gradient bits, fixed for the whole test.")
@click.option("--steps-per-stage", type=int, default=None, help="SGD steps at each precision [default: one epoch].")
@click.option("--threshold", type=float, default=0.05, show_default=True,
              help="Training-accuracy improvement (absolute fraction) that marks q_min; for a language model the "
                   "relative fall of the validation loss (0.05 = 5%).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@json_option
def range_test(model, dataset, data_dir, image_size, batch_size, fp_layers, number_format, grad_format, lr, q_start,
               q_max, g_bits, steps_per_stage, threshold, seed, device, quiet, as_json) -> None:
    """Run CPT's precision range test and suggest q_min (the lowest precision of a cyclic schedule)."""
    from cptsim.study.rangetest import RangeTestSettings

    settings = RangeTestSettings(model=model, dataset=dataset, data_dir=data_dir, image_size=image_size,
                                 fp_layers=parse_fp_layers(fp_layers),
                                 batch_size=batch_size_or_default(batch_size, dataset, model), lr=lr,
                                 q_start=q_start, q_max=q_max, g_bits=g_bits, steps_per_stage=steps_per_stage,
                                 threshold=threshold, seed=seed, device=device, number_format=number_format,
                                 grad_format=grad_format)
    settings.validate()  # before the progress bar, so bad input is one clean line
    result = run_with_progress(settings, show=not (quiet or as_json))
    if as_json:
        emit_json(result.to_json())
        return
    print_result(result)


def run_with_progress(settings, show: bool = True):
    """Run the range test with a rich progress bar on stderr (also used by `cptsim plan --min-bits auto`)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from cptsim.study.rangetest import run_range_test

    columns = [TextColumn("[bold]range test"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[info]}"), TimeElapsedColumn()]
    # The bar starts with the first training step: an error while building the workload (unknown model,
    # missing data) must leave stderr with its one line only.
    bar = Progress(*columns, console=err, disable=not show, transient=False)
    task = None

    def on_step(done: int, total: int, info: dict) -> None:
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task("range-test", total=total, info="")
        bar.update(task, completed=done, info=f"{info['bits']} bits  loss {info['loss']:.3f}")

    try:
        return run_range_test(settings, progress=on_step)
    finally:
        if task is not None:
            bar.stop()


def print_result(result) -> None:
    s = result.settings
    thr = f"{100 * result.threshold:g}"
    table = Table(title=f"precision range test: {s.model} on {s.dataset}", title_justify="left",
                  caption=f"{result.steps_per_stage} steps/precision, batch {s.batch_size}, lr {s.lr:g}, "
                          f"g {s.g_bits} bits, threshold {thr}"
                          + ("% of the validation loss" if result.measure == "val_loss" else " pts"),
                  caption_justify="left")
    table.add_column("bits", justify="right")
    fmts = any(r.format for r in result.rows)  # a float family: the format each stage ran
    if fmts:
        table.add_column("format")
    table.add_column("steps", justify="right")
    table.add_column("train acc", justify="right")
    table.add_column("loss", justify="right")
    lm = result.measure == "val_loss"  # a language model: the validation loss is the measure
    if lm:
        table.add_column("val loss", justify="right")
    table.add_column("gain", justify="right")
    table.add_column("", no_wrap=True)
    vl = [f"{result.baseline_val_loss:.3f}"] if lm else []
    f0 = [result.rows[0].format] if fmts else []
    table.add_row(str(s.q_start), *f0, "0", f"{100 * result.baseline_acc:.1f}%", "-", *vl, "",
                  "untrained (eval mode)")
    for r in result.rows:
        chosen = r.bits == result.suggested_q_min
        unit = "%" if lm else " pts"
        mark = "<- q_min" if chosen else (f"> {thr}{unit}" if r.improvement > result.threshold else "")
        vl = ["nan" if r.val_loss is None else f"{r.val_loss:.3f}"] if lm else []
        gain = f"{-100 * r.improvement:+.1f}%" if lm else f"{100 * r.improvement:+.1f} pts"
        table.add_row(str(r.bits), *([r.format] if fmts else []), str(r.steps), f"{100 * r.train_acc:.1f}%",
                      "nan" if r.loss is None else f"{r.loss:.3f}", *vl, gain, mark,
                      style="bold green" if chosen else None)
    out.print(table)
    style = "bold" if result.conclusive else "bold yellow"
    out.print(f"[{style}]q_min = {result.suggested_q_min}[/]: {result.reason}", highlight=False)

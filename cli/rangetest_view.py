"""The precision range test on screen: its progress bar on stderr and its table (`cptsim range-test`, and `cptsim plan
--min-bits auto`, which runs one first)."""

from __future__ import annotations

from rich.table import Table

from .common import err, out


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

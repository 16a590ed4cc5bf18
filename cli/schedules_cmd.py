"""`cptsim schedules`: list the precision schedules, and show bits over steps and their CPT cost."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from cptsim.cost import schedules as S
from cptsim.errors import InputError
from cptsim.study.plots import plot_schedules

from .common import check_output_file, emit_json, err, json_option, out, workload_options

_TEXT_HELP = f"""\b
Schedule text form:  {S.TEXT_FORM}
  cos-rep:3-8:g8:n32      cosine repeated (CPT), forward 3..8 bits, gradient 8, 32 cycles
  cpt:3-8                 `cpt` is an alias of cos-rep
  rex-tri-h:4-8:g6-8:n8   gradient bits cycle 6..8 with the same profile
  static:8   static:32    constant precision (32 = full precision)
Parts after NAME may come in any order, each once. 1..16 bits quantize; 32 is full precision,
allowed only as static:32 or a constant gradient g32. A single :Q on a cyclic name means
QMIN = QMAX = Q. Omitted parts default to 3-8, g8, n32 (static: 8).
"""

_COST_HELP = """\b
Cost (CPT's formula, relative to FP32): mean over steps of (q² + 2·q·g) / (3·32²),
forward W×A at q·q bits plus the two backward GEMMs at q·g, assuming equal MACs.
"vs static" divides by the static q_max schedule with the same gradient bits.
"""


@click.group("schedules", epilog=_TEXT_HELP)
def schedules() -> None:
    """The precision schedules: CPT's cosine schedule, the ten-schedule suite of
    Wolfe & Kyrillidis, and the static baseline."""


@schedules.command("list", epilog=_TEXT_HELP)
@json_option
def list_cmd(as_json: bool) -> None:
    """List the eleven schedules."""
    rows = S.list_schedules()
    if as_json:
        emit_json({"schedules": rows, "aliases": dict(S.ALIASES), "text_form": S.TEXT_FORM})
        return
    table = Table(title="precision schedules", title_justify="left")
    for col in ("name", "kind", "profile", "description", "reference"):
        table.add_column(col, overflow="fold")
    for r in rows:
        name = r["name"] + (f" ({', '.join(r['aliases'])})" if r["aliases"] else "")
        table.add_row(name, r["kind"], r["profile"], r["description"], r["reference"])
    out.print(table)
    aliases = ", ".join(f"{a} = {c}" for a, c in S.ALIASES.items())
    out.print(f"aliases: {aliases}.  text form: {S.TEXT_FORM}  (see 'cptsim schedules show --help')")


def _histogram_text(hist: dict[str, int], total: int, names: dict | None = None) -> str:
    """``bits:share`` per width; with a float family's ``names`` ({bits: format}), ``bits format:share``."""
    names = names or {}
    return " ".join(f"{b}{' ' + names[int(b)] if int(b) in names else ''}:{100.0 * c / total:.0f}%"
                    for b, c in hist.items())


@schedules.command("show", epilog=_TEXT_HELP + "\n" + _COST_HELP,
                   short_help="Bits over steps and CPT cost of one or more schedules.")
@click.argument("specs", metavar="NAME_OR_TEXT...", nargs=-1, required=True)
@click.option("--q-min", type=int, default=S.DEFAULT_Q_MIN, show_default=True,
              help="Lower forward bits, for schedules whose text gives no range.")
@click.option("--q-max", type=int, default=S.DEFAULT_Q_MAX, show_default=True,
              help="Upper forward bits (static: its one precision), for texts that give none.")
@click.option("--g-bits", default=None,
              help='Gradient bits, "G" or "GMIN-GMAX", for texts without a :g part [default: '
                   f'{S.DEFAULT_G_BITS}; static:32 is full precision, its error unquantized too].')
@click.option("--cycles", type=int, default=S.DEFAULT_CYCLES, show_default=True,
              help="Number of cycles, for texts without an :n part.")
@click.option("--steps", type=int, default=64000, show_default=True,
              help="Total training steps (64000 = CPT's CIFAR recipe).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a PNG of bits over steps, one panel per schedule.")
@workload_options("number_format", "grad_format")
@json_option
def show_cmd(specs: tuple[str, ...], q_min: int, q_max: int, g_bits: str, cycles: int, steps: int,
             plot_path: Path | None, number_format: str, grad_format: str | None, as_json: bool) -> None:
    """Show bits over steps and the CPT training cost of one or more schedules.

    Each NAME_OR_TEXT is a schedule name or its full text form. The options fill only the parts a
    text leaves out; parts written in the text win (`show cpt rex-rep:4-8 --q-min 2` shows
    cos-rep 2-8 and rex-rep 4-8).
    """
    if steps < 1:
        raise InputError(f"--steps must be >= 1, got {steps}")
    from cptsim.numerics.families import format_map

    fmap = format_map(number_format, grad_format)  # unknown names: one line, exit 2, before any work
    scheds = [S.parse_schedule(text, q_min=q_min, q_max=q_max, g_bits=g_bits, cycles=cycles) for text in specs]
    infos = [S.describe(s, steps) for s in scheds]
    if fmap is not None:  # a float family: the format each width of each schedule runs in
        for sch, d in zip(scheds, infos):
            d["formats"] = fmap.used(sch.bits(steps), sch.grad_bits(steps))
    if plot_path is not None:
        plot_schedules(scheds, steps, check_output_file("--plot", plot_path), number_format=number_format,
                       grad_format=grad_format)
    if as_json:
        emit_json({"total_steps": steps, "schedules": infos,
                   "plot": str(plot_path) if plot_path is not None else None})
        return
    table = Table(title=f"schedules over {steps} steps (cost: CPT formula)", title_justify="left")
    table.add_column("schedule (text form)", no_wrap=True)
    table.add_column("mean bits", justify="right")
    table.add_column("min/max", justify="right")
    table.add_column("grad bits", justify="right")
    table.add_column("cost vs FP32", justify="right")
    table.add_column("vs static q_max", justify="right")
    table.add_column("share of steps at each bits", overflow="fold")
    for s, d in zip(scheds, infos):
        g = str(s.g_max) if s.g_min == s.g_max else f"{d['mean_grad_bits']:.2f} ({s.g_min}-{s.g_max})"
        table.add_row(d["text"], f"{d['mean_bits']:.2f}", f"{d['min_bits']}/{d['max_bits']}", g,
                      f"{100 * d['relative_cost_fp32']:.2f}%", f"{100 * d['relative_cost_static']:.1f}%",
                      _histogram_text(d["histogram"], steps, (d.get("formats") or {}).get("forward")))
    out.print(table)
    if plot_path is not None:
        err.print(f"wrote {plot_path}")

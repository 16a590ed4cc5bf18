"""What every command shares: JSON output, the consoles, and the exit-code contract."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console

from cptsim.textfmt import si  # noqa: F401 - the commands import it from here

# Tables for people go to stdout; progress bars and notes go to stderr so `--json` stdout stays one document.
out = Console()
err = Console(stderr=True)


def emit_json(obj: Any) -> None:
    """Write exactly one JSON document to stdout."""
    click.echo(json.dumps(obj, indent=2, default=_jsonable))


def _jsonable(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout instead of tables.")

_WIDE = "cptsim.wide"
ELLIPSIS = "…"


def _wide_flag(ctx, param, value):
    ctx.meta[_WIDE] = bool(value)
    return value


wide_option = click.option("--wide", is_flag=True, expose_value=False, callback=_wide_flag,
                           help="Every table column, however wide the terminal [default: columns that do not fit "
                                "are left out, and a line says which].")


def print_table(table, drop: tuple = (), wrap: tuple[str, ...] = ()) -> list[str]:
    """Print a table for people without cutting any cell to "…" (a name cut to "bitfu…" says nothing).

    Cells stay on one line except in the ``wrap`` columns (prose). When the table does not fit the terminal, the
    ``drop`` columns (by header, least needed first) are left out until it does, and a line says which; with
    ``--wide`` (``wide_option``) every column is printed at its full width. Returns the headers left out."""
    import io

    def render(width: int) -> str:
        probe = Console(width=width, file=io.StringIO(), color_system=None, legacy_windows=False)
        probe.print(table)
        return probe.file.getvalue()

    for col in table.columns:
        col.no_wrap = str(col.header) not in wrap
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.meta.get(_WIDE):  # meta is shared by every context of one invocation
        natural = max(len(line.rstrip()) for line in render(10_000).splitlines())
        # Console.print never goes past the console's own width: a console as wide as the table, same stdout
        (Console(width=natural) if natural > out.width else out).print(table, crop=False)
        return []

    def cut() -> bool:
        return ELLIPSIS in render(out.width)

    left_out = []
    for group in drop:  # a header, or a tuple of headers that go together (E plan and t plan)
        if not cut():
            break
        for header in (group,) if isinstance(group, str) else group:
            i = next((i for i, c in enumerate(table.columns) if str(c.header) == header), None)
            if i is not None:
                table.columns.pop(i)
                left_out.append(header)
    out.print(table)
    if left_out:
        out.print(f"  (left out to fit {out.width} columns: {', '.join(left_out)}; --wide shows them)",
                  style="dim", highlight=False)
    return left_out


def die(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def parse_fp_layers(text: str | None) -> list[str] | None:
    """--fp-layers: None = the model's convention, "none" = quantize every layer, else comma-separated globs."""
    if text is None:
        return None
    if text.strip().lower() == "none":
        return []
    return [p.strip() for p in text.split(",") if p.strip()]


def check_output_file(flag: str, path):
    """A file a command will write: its directory must exist and it must not be a directory (checked before work)."""
    from pathlib import Path

    from cptsim.errors import InputError

    p = Path(path)
    if p.is_dir():
        raise InputError(f"{flag} names a directory, not a file: {p}")
    if not p.parent.is_dir():
        raise InputError(f"{flag} {p}: directory {str(p.parent)!r} does not exist")
    return p


# --------------------------------------------------------------------------------------------------------------
# The workload flags: what is trained (or costed) on what. One definition and one default each, shared by every
# command that takes them (train, plan, cost, profile, sweep, range-test), so that a flag means the same thing and
# defaults to the same value wherever it is typed. A command names the ones it takes: ``workload_options(...)``.

DEFAULT_MODEL = "digits-cnn"
# for --help only (importing cptsim.run.config here would load torch for every --help): the image and text defaults
# of cptsim.run.config.recipe, which decides; tests/test_graph_train.py checks that the two agree
DEFAULT_BATCH_SIZE = 64
DEFAULT_EPOCHS = 15  # when neither --epochs nor --steps is given


def _existing_data_dir(ctx, param, value):
    """--data-dir, refused (exit 2) when given and not an existing directory, in every command that takes it."""
    if value:
        from cptsim.data.registry import check_given_data_dir

        check_given_data_dir(value)
    return value


def _workload_option_defs() -> dict:
    return {
        "model": click.option(
            "--model", default=DEFAULT_MODEL, show_default=True,
            help="Model name ('cptsim train --list-models'), or torchvision:NAME / timm:NAME (any classifier there)."),
        "dataset": click.option(
            "--dataset", default=None,
            help="digits (embedded), cifar10, cifar100, mnist, fashion-mnist, imagefolder, ptb, wikitext-2, "
                 "wikitext-103, pydoc-chars (embedded text), synthetic:C,H,W:K[:N] (random tensors, K classes, "
                 "N samples, seeded); graphs: karate (embedded), cora, citeseer, pubmed, planetoid (raw files in "
                 "--data-dir), ogbn-arxiv, synthetic-graph:N,F,K[:DEG]. [default: the model's kind: pydoc-chars for "
                 "a language model, karate for a graph model, digits for an image model]; a dataset of another "
                 "kind is an error. cost, profile and plan read only its shapes and size (nothing is loaded)."),
        "data_dir": click.option(
            "--data-dir", default=None, callback=_existing_data_dir,
            help="Folder holding the dataset (never downloaded); cost and plan count its training samples for the "
                 "epoch size, and imagefolder's classes and image size are read there. It must exist, whatever "
                 "the dataset."),
        "image_size": click.option(
            "--image-size", type=int, default=None,
            help="imagefolder: N x N input (random crop with padding and flips up to 64, random resized crops above) "
                 "[default: the images' own size when they all share one, else 224]; recorded in config.json and "
                 "the plan."),
        "batch_size": click.option(
            "--batch-size", type=int, default=None,
            help=f"Samples per step (the global batch, with train --nproc). [default: {DEFAULT_BATCH_SIZE}; a graph "
                 "dataset: 1, the whole graph, trained full-batch]"),
        "epochs": click.option(
            "--epochs", type=int, default=None,
            help=f"Training epochs [default: {DEFAULT_EPOCHS} unless --steps; a graph: 200 full-batch steps]."),
        "steps": click.option(
            "--steps", type=int, default=None,
            help="Training steps (instead of --epochs; a run may stop mid-epoch)."),
        "fp_layers": click.option(
            "--fp-layers", default=None,
            help="Comma-separated layer names or globs kept in full precision; 'none' quantizes every layer. "
                 "[default: the model's convention: the final classifier (ImageNet ResNets also conv1 and "
                 "downsample); a language model: none, its output head quantized too, as CPT's published LM "
                 "savings count it (on the embedded corpus it cost no perplexity: README); --fp-layers decoder "
                 "(lstm-lm) or head (transformer-lm) keeps it in FP32]"),
        "input_shape": click.option(
            "--input-shape", default=None, help="Per-sample input C,H,W (or T,F); overrides the dataset's."),
        "num_classes": click.option(
            "--num-classes", type=int, default=None, help="Classes; overrides the dataset's (default 10)."),
        "optimizer": click.option(
            "--optimizer", type=click.Choice(["sgd", "adam", "adamw"]), default=None,
            help="sgd (with --momentum; CPT's recipe), adam or adamw; Adam's update is counted in the step's work. "
                 "[default: sgd; a graph: adam, cpt_gnn's recipe]"),
        "lr": click.option(
            "--lr", type=float, default=None,
            help="Peak learning rate. [default: 0.1 (SGD); a graph: 1e-3 (Adam, cpt_gnn's)]"),
        "lr_min": click.option(
            "--lr-min", type=float, default=None,
            help="The cosine schedule's floor (torch's CosineAnnealingLR eta_min; other schedules have none). "
                 "[default: 0; a graph: 0.1 x --lr, as cpt_gnn anneals]"),
        "quant_agg": click.option(
            "--quant-agg", is_flag=True,
            help="Graph models: quantize the message passing's aggregation too -- its inputs at the step's bits, "
                 "the error flowing back into it at the gradient bits (cpt_gnn's quant_agg); counted at those "
                 "widths. [default: the aggregation in FP32, as cpt_gnn]"),
        # number formats (cptsim.numerics.families): what `cost` spells out in its own options
        "number_format": click.option(
            "--number-format", "number_format", default="int", show_default=True,
            help="Format family the schedule's widths name: int (CPT's integers), fp (4 fp4e2m1, 6 fp6e3m2, "
                 "8 fp8e4m3), mx (4 mxfp4, 6 mxfp6, 8 mxfp8), nvfp (4 nvfp4, 8 fp8e4m3); a width the family lacks "
                 "takes the next wider format, 9..16 bf16. Float formats are fake-quantized in FP32."),
        "grad_format": click.option(
            "--grad-format", "grad_format", default=None,
            help="Format of every gradient (error) operand, e.g. fp8e5m2 or mxfp8; needs a float --number-format "
                 "[default: the gradient width through the family]."),
        # profile's and cost's (train has its own --channels-last, which also changes how the run runs)
        "channels_last": click.option(
            "--channels-last", is_flag=True,
            help="The step runs in NHWC memory format (as `train --channels-last`); a GPU profile prices its "
                 "convolutions accordingly. Default NCHW, PyTorch's default."),
    }


WORKLOAD_FLAGS = tuple(_workload_option_defs())


def workload_options(*names: str):
    """Decorator adding the named workload flags (``WORKLOAD_FLAGS``, in that order) to a command."""
    defs = _workload_option_defs()
    unknown = [n for n in names if n not in defs]
    if unknown:
        raise ValueError(f"unknown workload flags {unknown}; known: {', '.join(defs)}")

    def deco(f):
        for name in reversed([n for n in defs if n in names]):
            f = defs[name](f)
        return f

    return deco


def recipe(dataset: str | None, model: str | None = None, **given) -> dict:
    """The workload's batch_size, epochs, optimizer, lr and lr_min: each as typed (``given``; None = not typed), or
    the default of the dataset's kind (the model's kind's embedded dataset when none is named): one definition,
    ``cptsim.run.config.recipe``, for every command."""
    from cptsim.run.config import recipe as resolve

    if dataset is None and model is not None:
        from cptsim.data import default_dataset

        dataset = default_dataset(model)
    return resolve(dataset, **given)


def batch_size_or_default(batch_size: int | None, dataset: str | None, model: str | None = None) -> int:
    """--batch-size as typed, or the default for the dataset: 1 for a graph (full batch), else 64."""
    return recipe(dataset, model, batch_size=batch_size)["batch_size"]


def run_length(epochs: int | None, steps: int | None, dataset: str | None = None,
               model: str | None = None) -> tuple[int | None, int | None]:
    """(epochs, steps) with the shared default: the recipe's epochs when neither is given (15; a graph's 200;
    whether both may be given is the command's business: train's --steps overrides --epochs, cost refuses both)."""
    if epochs is None and steps is None:
        epochs = recipe(dataset, model)["epochs"] if (dataset or model) else DEFAULT_EPOCHS
    return epochs, steps


LAYER_HELP = ("Per-layer precision (cptsim.cost.layerplan): a JSON or TOML file of rules GLOB = SPEC over quantized "
              "layer names, SPEC = QMIN-QMAX (its own range, the schedule's shape), +K/-K (the schedule's range "
              "shifted) or Q (static width); the last matching rule wins, other layers follow --schedule.")


def layer_schedule_options(f):
    """``--layer-schedule FILE`` and ``--layer GLOB=SPEC`` (repeatable): a per-layer plan."""
    f = click.option("--layer", "layer_rules", multiple=True, metavar="GLOB=SPEC",
                     help="One per-layer rule, repeatable, e.g. --layer 'layer1.*=2-6' --layer conv1=8 "
                          "(after the file's rules).")(f)
    f = click.option("--layer-schedule", "layer_schedule", default=None, metavar="FILE", help=LAYER_HELP)(f)
    return f


def parse_layer_options(path: str | None, rules) -> "dict | None":
    """The layer schedule's JSON (TrainConfig.layer_schedule) from the two flags; None without either."""
    from cptsim.cost.layerplan import LayerSchedule, parse_layer_text, read_layer_schedule

    if not path and not rules:
        return None
    doc = read_layer_schedule(path) if path else LayerSchedule(())
    extra = parse_layer_text(list(rules)).rules if rules else ()
    return LayerSchedule(doc.rules + extra, doc.model).to_json()

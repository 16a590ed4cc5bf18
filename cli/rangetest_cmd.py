"""`cptsim range-test`: CPT's precision range test, a short real training run that suggests q_min."""

from __future__ import annotations

import click

from .common import batch_size_or_default, emit_json, json_option, parse_fp_layers, workload_options
from .rangetest_view import print_result, run_with_progress

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

"""The `cptsim` console script.

Exit codes: 0 ok, 2 bad input (one line on stderr, no traceback), 1 anything else,
130 interrupted. Set CPTSIM_DEBUG=1 to see tracebacks.
"""

from __future__ import annotations

import os
import sys

import click

from cptsim import __version__
from cptsim.errors import InputError, RunFailed, RunStopped

from .common import die


class CptsimGroup(click.Group):
    """A click group that turns every bad-input error into one line and exit code 2."""

    def main(self, args=None, prog_name=None, **extra):  # noqa: D401 - click API
        try:
            rv = super().main(args=args, prog_name=prog_name, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:
            click.echo(e.ctx.get_help())
            sys.exit(0)
        except click.UsageError as e:
            hint = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
            die(f"{e.format_message()}{hint}", 2)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except click.Abort:
            die("interrupted", 130)
        except InputError as e:
            die(str(e), 2)
        except RunFailed as e:
            die(str(e), 1)
        except RunStopped as e:
            die(str(e), 130)
        except KeyboardInterrupt as e:
            die(str(e) or "interrupted", 130)
        except Exception as e:  # anything else is our bug or the environment's; say so on one line
            if os.environ.get("CPTSIM_DEBUG"):
                raise
            die(f"{type(e).__name__}: {e} (set CPTSIM_DEBUG=1 for the traceback)", 1)
        sys.exit(rv if isinstance(rv, int) else 0)

    # The main job first (plan -> train -> report), then the building blocks; click would sort them by name.
    ORDER = ("plan", "train", "report", "cost", "sweep", "profile", "schedules", "hw", "range-test")

    def list_commands(self, ctx):
        names = super().list_commands(ctx)
        return [n for n in self.ORDER if n in names] + [n for n in names if n not in self.ORDER]


@click.group(cls=CptsimGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="cptsim")
def cli() -> None:
    """cptsim: plan, run and cost cyclic-precision training (CPT).

    \b
    The main job, in three steps:
      cptsim plan --budget 65%         1. pick the best schedule whose cost on your hardware fits a budget
      cptsim train --plan plan.json    2. train exactly that (quantized, the executed cost recorded per step)
      cptsim report runs/RUN           3. planned vs executed cost, modelled vs measured time, plots

    \b
    Building blocks:
      cptsim cost --schedule cpt ...   what one schedule costs on several hardware profiles
      cptsim schedules list            the eleven precision schedules
      cptsim schedules show cpt ...    bits over steps and their cost
      cptsim train --schedule cpt      train a schedule given by hand (default: digits, small CNN, CPT 3-8/8)
      cptsim sweep                     schedules x seeds in parallel, a results database, accuracy vs cost
      cptsim hw list | show | calibrate  hardware profiles (GPUs, Bit Fusion, bit-serial, int8 array, this host)
    """


def _register() -> None:
    from cptsim.cli import hw_cmd, schedules_cmd, train_cmd
    from cptsim.cli import rangetest_cmd

    cli.add_command(train_cmd.train)
    cli.add_command(schedules_cmd.schedules)
    from cptsim.cli import cost_cmd, profile_cmd

    cli.add_command(profile_cmd.profile)
    cli.add_command(cost_cmd.cost)
    cli.add_command(hw_cmd.hw)
    cli.add_command(rangetest_cmd.range_test)
    from cptsim.cli import report_cmd

    cli.add_command(report_cmd.report)
    from cptsim.cli import plan_cmd

    cli.add_command(plan_cmd.plan)
    from cptsim.cli import sweep_cmd

    cli.add_command(sweep_cmd.sweep)
    from cptsim.cli import sensitivity_cmd

    cli.add_command(sensitivity_cmd.sensitivity)


_register()


def main() -> None:
    cli.main(prog_name="cptsim")


if __name__ == "__main__":
    main()

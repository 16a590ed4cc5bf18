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


def _torchrun_worker() -> bool:
    """This process is one of several workers torchrun started (``cptsim train --nproc``)."""
    try:
        return "TORCHELASTIC_RUN_ID" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def _worker_exit(code) -> None:
    """End a torchrun worker with ``code`` once Python's own clean-up has run, skipping the C++ static destructors:
    at interpreter exit gloo's threads sometimes abort the process ("terminate called without an active
    exception", SIGABRT), which turns a finished rank into a failed job. Everything the worker wrote is flushed
    and closed before this (the process group left, the run's files written atomically, atexit handlers run)."""
    import atexit

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed pipe: nothing left to flush
                pass
        os._exit(status)


class CptsimGroup(click.Group):
    """A click group that turns every bad-input error into one line and exit code 2."""

    def main(self, args=None, prog_name=None, **extra):  # noqa: D401 - click API
        try:
            self._main(args, prog_name, **extra)
        except SystemExit as e:
            if _torchrun_worker():
                _worker_exit(e.code)
            raise

    def _main(self, args=None, prog_name=None, **extra):
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
        except RunStopped as e:  # stopped as asked (^C), with what to do next: a notice, not an error
            click.echo(str(e), err=True)
            sys.exit(130)
        except KeyboardInterrupt as e:
            die(str(e) or "interrupted", 130)
        except Exception as e:  # anything else is our bug or the environment's; say so on one line
            if os.environ.get("CPTSIM_DEBUG"):
                raise
            die(f"{type(e).__name__}: {e} (set CPTSIM_DEBUG=1 for the traceback)", 1)
        sys.exit(rv if isinstance(rv, int) else 0)

    # Each command's module is imported only when that command runs (click's "lazy group"): most of them import
    # torch, which takes seconds, and `cptsim --version` or `cptsim --help` needs none of them. So the group itself
    # knows every command's name, module and one-line help; loading a command gives it that same short help, so
    # the listing reads the same whether or not the command has been loaded. The main job first (plan -> train ->
    # report), then the building blocks; click would sort them by name.
    LAZY = {
        "plan": ("plan_cmd", "plan",
                 "Search precision schedules for the best one that fits a budget; write plan.json."),
        "train": ("train_cmd", "train",
                  "Run real quantized training with a cyclic precision schedule and record what ran."),
        "report": ("report_cmd", "report", "Compare a run's executed cost with its plan, the host estimate with "
                                           "the measured time; plots and fit."),
        "cost": ("cost_cmd", "cost", "Cost one precision schedule on several hardware profiles: BitOPs, energy, "
                                     "latency, and the saving over static q_max."),
        "sweep": ("sweep_cmd", "sweep",
                  "Train schedules x seeds of one workload in parallel or on Slurm; report accuracy vs cost."),
        "profile": ("profile_cmd", "profile", "Per-layer MACs (forward, dgrad, wgrad) of a model, and what one "
                                              "training step costs on a hardware profile."),
        "schedules": ("schedules_cmd", "schedules", "The precision schedules: CPT's cosine schedule, the "
                                                    "ten-schedule suite of Wolfe & Kyrillidis, the static baseline."),
        "hw": ("hw_cmd", "hw", "Hardware profiles: what a GEMM at given bit widths costs on a machine."),
        "range-test": ("rangetest_cmd", "range_test",
                       "CPT's precision range test: short training at rising bits, suggests q_min."),
        "sensitivity": ("sensitivity_cmd", "sensitivity", "Measure per-layer sensitivity to low precision "
                                                          "(Hutchinson Hessian trace and one-layer loss increase)."),
    }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.commands = _LazyCommands(self)

    def list_commands(self, ctx):
        return list(self.LAZY) + [n for n in self.commands if n not in self.LAZY]

    def get_command(self, ctx, cmd_name):
        return self.commands.get(cmd_name)

    def load(self, name: str) -> click.Command:
        import importlib

        module, attr, short_help = self.LAZY[name]
        cmd = getattr(importlib.import_module(f"cptsim.cli.{module}"), attr)
        cmd.short_help = short_help
        return cmd

    def format_commands(self, ctx, formatter):
        # The listing from the table alone, so that `--help` imports no command module.
        rows = [(n, spec[2]) for n, spec in self.LAZY.items()]
        rows += [(n, c.get_short_help_str()) for n, c in self.commands.items() if n not in self.LAZY]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


class _LazyCommands(dict):
    """The group's name -> command map, filled from the group's table on first use of a name, so that
    ``cli.commands["train"]`` works as on an ordinary click group."""

    def __init__(self, group: CptsimGroup):
        super().__init__()
        self._group = group

    def __missing__(self, name):
        if name not in self._group.LAZY:
            raise KeyError(name)
        cmd = self[name] = self._group.load(name)
        return cmd

    def get(self, name, default=None):
        try:
            return self[name]
        except KeyError:
            return default


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


def main() -> None:
    cli.main(prog_name="cptsim")


if __name__ == "__main__":
    main()

"""`cptsim --version` and `cptsim --help` import no command module (they used to import torch and take seconds),
and `--help` still lists every command, in order, with its one-line help."""

import pathlib
import subprocess
import sys

import click
import pytest

CLI_DIR = pathlib.Path(__file__).resolve().parents[1] / "cli"

_PROBE = """
import sys
from cptsim.cli.main import cli
try:
    cli.main([{arg!r}], prog_name="cptsim")
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "numpy", "scipy", "matplotlib") if m in sys.modules)
loaded = sorted(m for m in sys.modules if m.startswith("cptsim.cli.") and m.endswith("_cmd"))
print("HEAVY", heavy, "LOADED", loaded, file=sys.stderr)
"""


@pytest.mark.parametrize("arg", ["--version", "--help"])
def test_version_and_help_import_no_command_module_and_no_torch(arg):
    r = subprocess.run([sys.executable, "-c", _PROBE.format(arg=arg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last == "HEAVY [] LOADED []", last
    if arg == "--version":
        assert r.stdout.strip() == "cptsim, version 0.1.0"


def test_import_cptsim_loads_no_torch():
    r = subprocess.run([sys.executable, "-c", "import sys, cptsim; print('torch' in sys.modules)"],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr


def test_every_command_module_is_in_the_lazy_table():
    from cptsim.cli.main import CptsimGroup

    modules = {p.stem for p in CLI_DIR.glob("*_cmd.py")}
    assert modules == {spec[0] for spec in CptsimGroup.LAZY.values()}


def test_help_lists_every_command_in_order_as_click_would_with_them_all_loaded():
    from click.testing import CliRunner

    from cptsim.cli.main import CptsimGroup, cli

    text = CliRunner().invoke(cli, ["--help"]).output
    listed = [line.split()[0] for line in text.split("Commands:\n")[1].splitlines() if line[:3].strip()]
    assert listed == ["plan", "train", "report", "cost", "sweep", "profile", "schedules", "hw", "range-test",
                      "sensitivity"]

    # Each entry loads to the command of that name, and an ordinary click group holding the loaded commands
    # renders the very same listing.
    eager = click.Group("cptsim")
    for name in listed:
        cmd = cli.get_command(None, name)
        assert isinstance(cmd, click.Command) and cmd.name == name
        assert cmd.get_short_help_str(200) == CptsimGroup.LAZY[name][2]
        eager.add_command(cmd)

    def listing(group):
        ctx = click.Context(group, info_name="cptsim", max_content_width=110, terminal_width=110)
        fmt = ctx.make_formatter()
        click.Group.format_commands(group, ctx, fmt) if group is eager else group.format_commands(ctx, fmt)
        return fmt.getvalue()

    eager.list_commands = lambda ctx: listed
    assert listing(cli) == listing(eager)


def test_an_unknown_command_is_still_one_line_exit_2():
    from cli_util import one_line_error, run_cli

    assert "No such command 'bogus'" in one_line_error(run_cli("bogus"))


def test_a_planetoid_pickle_that_names_an_unknown_codec_is_one_line_exit_2(tmp_path):
    """_codecs.encode is allowed (Python 3 pickles of bytes call it); a file that calls it with an encoding that does
    not exist raised LookupError past the loader's error handling."""
    import _codecs
    import pickle

    import torch

    from cli_util import one_line_error, run_cli
    from cptsim.data.graph import write_planetoid

    g = torch.Generator().manual_seed(1)
    x = (torch.rand(40, 6, generator=g) < 0.2).float()
    y = torch.randint(0, 3, (40,), generator=g)
    ei = torch.randint(0, 40, (2, 60), generator=g)
    write_planetoid(tmp_path, "odd", x, y, ei, num_train=6, test_index=torch.arange(30, 40))

    class Codec:
        def __reduce__(self):
            return _codecs.encode, ("x", "bogus")

    (tmp_path / "ind.odd.graph").write_bytes(pickle.dumps({0: Codec()}, protocol=2))
    msg = one_line_error(run_cli("train", "--model", "gcn", "--dataset", "planetoid", "--data-dir", tmp_path,
                                 "--steps", "1", "--quiet", "--out", tmp_path / "run"))
    assert "ind.odd.graph" in msg and "LookupError" in msg and "bogus" in msg, msg

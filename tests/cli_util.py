"""Helpers the CLI tests share: run the click app in-process, and read a one-line error."""

from click.testing import CliRunner

from cptsim.cli.main import cli


def run_cli(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line_error(r):
    """The single 'error: ...' line of a bad-input exit (code 2)."""
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    return lines[0]

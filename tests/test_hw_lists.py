"""A --hw list names each profile once, and the folder of the user's own profiles is said where users look.

`cost --hw bitfusion,/path/to/copy-of-bitfusion.toml` printed two rows both called bitfusion; the folder `hw list`
reads the user's profiles from was in no help text and not in the README."""

import json
import shutil
from pathlib import Path

import pytest

from cli_util import one_line_error, run_cli

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "hw_profiles"
RUN = REPO / "tests" / "data" / "pre_layout" / "run"


@pytest.fixture
def copy_of_bitfusion(tmp_path):
    p = tmp_path / "copy-of-bitfusion.toml"
    shutil.copy(SHIPPED / "bitfusion.toml", p)
    return p


@pytest.mark.parametrize("command", [
    ("cost", "--steps", "10", "--schedule", "static:8"),
    ("report", RUN, "--no-calibrate", "--no-save"),
])
def test_one_profile_name_twice_in_a_list_is_one_line_exit_2_naming_both_sources(command, copy_of_bitfusion):
    line = one_line_error(run_cli(*command, "--hw", f"h100,bitfusion,{copy_of_bitfusion}"))
    assert "'bitfusion'" in line and str(copy_of_bitfusion) in line and str(SHIPPED / "bitfusion.toml") in line
    line = one_line_error(run_cli(*command, "--hw", "stripes,h100,stripes"))
    assert "'stripes' twice" in line


def test_the_users_own_profile_and_a_file_of_the_same_name_are_refused_together(tmp_path, monkeypatch,
                                                                                  copy_of_bitfusion):
    monkeypatch.setenv("CPTSIM_HOME", str(tmp_path / "home"))
    mine = tmp_path / "home" / "hw_profiles"
    mine.mkdir(parents=True)
    text = copy_of_bitfusion.read_text().replace('name = "bitfusion"', 'name = "mybf"')
    (mine / "mybf.toml").write_text(text)
    (tmp_path / "other.toml").write_text(text)
    line = one_line_error(run_cli("cost", "--steps", "10", "--schedule", "static:8", "--hw",
                                  f"mybf,{tmp_path / 'other.toml'}"))
    assert str(mine / "mybf.toml") in line and str(tmp_path / "other.toml") in line
    r = run_cli("cost", "--steps", "10", "--schedule", "static:8", "--hw", "mybf,bitfusion", "--json")  # distinct
    assert r.exit_code == 0, r.output
    assert [p["hardware"] for p in json.loads(r.stdout)["profiles"]] == ["mybf", "bitfusion"]


def test_hw_help_list_and_the_readme_name_the_users_profile_folder(tmp_path, monkeypatch):
    r = run_cli("hw", "--help")
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    assert "$CPTSIM_HOME/hw_profiles" in text and "~/.config/cptsim/hw_profiles" in text
    assert "$XDG_CONFIG_HOME/cptsim/hw_profiles" in text
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "`$CPTSIM_HOME/hw_profiles`" in readme and "`~/.config/cptsim/hw_profiles`" in readme

    home = tmp_path / "home"
    monkeypatch.setenv("CPTSIM_HOME", str(home))
    r = run_cli("hw", "list", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["user_dir"] == str(home / "hw_profiles")
    r = run_cli("hw", "list", "--wide")
    assert f"your own profiles: {home / 'hw_profiles'} (none there yet" in r.stdout
    monkeypatch.delenv("CPTSIM_HOME")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert json.loads(run_cli("hw", "list", "--json").stdout)["user_dir"] == str(tmp_path / "xdg" / "cptsim" /
                                                                                 "hw_profiles")

"""Issue 25 item 5: benchmarks/gpu/gpu_check.sh finds or builds the project's environment (as `make` does), then says
"no CUDA device: nothing to check" and exits 0 on a machine without a GPU.

The script runs from a copy of the checkout (no .venv) with a PATH whose python3 has no torch. Building a real
environment takes minutes and the network, so ``make`` is a stand-in that records how it was called and makes
``VENV/bin/python`` start this test's own python with a stand-in ``torch`` first on its path, one whose
``cuda.is_available()`` is False (all the script asks of torch, twice a run: the real one's ~2 s import each time
was most of this file's time); that the script asks the real Makefile for a target it has is checked with
``make -n``."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
BASH = shutil.which("bash")

pytestmark = pytest.mark.skipif(torch.cuda.is_available() or BASH is None,
                                reason="a CUDA machine runs the whole check; this tests the no-GPU path")

NO_TORCH_PYTHON = "#!/bin/sh\nexit 1\n"  # a python3 without torch: `python3 -c 'import torch'` fails
FAKE_MAKE = f"""#!/bin/sh
echo "$@" >> "$FAKE_MAKE_LOG"
venv=.venv
for a in "$@"; do case "$a" in VENV=*) venv="${{a#VENV=}}";; esac; done
mkdir -p "$venv/bin" "$venv/stand-in/torch"
printf 'class cuda:\\n    @staticmethod\\n    def is_available():\\n        return False\\n' \\
    > "$venv/stand-in/torch/__init__.py"
printf '#!/bin/sh\\nPYTHONPATH="%s" exec {sys.executable} "$@"\\n' "$(cd "$venv" && pwd)/stand-in" > "$venv/bin/python"
chmod +x "$venv/bin/python"
touch "$venv/.installed"
"""


def _checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    (root / "benchmarks" / "gpu").mkdir(parents=True)
    for f in ("benchmarks/gpu/gpu_check.sh", "Makefile", "pyproject.toml"):
        shutil.copy(REPO / f, root / f)
    return root


def _bin(tmp_path: Path, make: bool) -> Path:
    """A PATH folder: python3 without torch, the stand-in make (or none), and the few tools the script needs."""
    b = tmp_path / "bin"
    b.mkdir()
    tools = {"python3": NO_TORCH_PYTHON, **({"make": FAKE_MAKE} if make else {})}
    for name, text in tools.items():
        (b / name).write_text(text)
        (b / name).chmod(0o755)
    for tool in ("dirname", "mkdir", "touch", "chmod", "printf", "realpath", "mktemp", "tail"):
        where = shutil.which(tool)
        if where:
            (b / tool).symlink_to(where)
    return b


def _run(root: Path, bindir: Path, tmp_path: Path, **env_extra):
    env = {"PATH": str(bindir), "HOME": str(tmp_path), "FAKE_MAKE_LOG": str(tmp_path / "make.log"), **env_extra}
    r = subprocess.run([BASH, str(root / "benchmarks" / "gpu" / "gpu_check.sh")], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=120)
    log = tmp_path / "make.log"
    return r, log.read_text().splitlines() if log.exists() else []


def test_without_a_venv_it_builds_one_as_make_does_then_says_there_is_no_gpu_then_uses_it(tmp_path):
    """One checkout, two runs of the script: the first builds the venv, the second (the venv exists) builds nothing."""
    root = _checkout(tmp_path)
    bindir = _bin(tmp_path, make=True)
    r, made = _run(root, bindir, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert made == ["VENV=.venv .venv/.installed"]  # the Makefile's STAMP target, once
    assert "building the project's environment as make does" in r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("gpu_check: no CUDA device: nothing to check")
    assert "no python with torch" not in r.stdout
    assert (root / ".venv" / ".installed").exists()

    # an existing venv is used and nothing is built
    (tmp_path / "make.log").unlink()
    r, made = _run(root, bindir, tmp_path)
    assert r.returncode == 0 and made == [], r.stdout + r.stderr
    assert "no CUDA device: nothing to check" in r.stdout and "building" not in r.stderr


def test_gpu_check_venv_names_the_environment(tmp_path):
    root = _checkout(tmp_path)
    venv = tmp_path / "elsewhere"
    r, made = _run(root, _bin(tmp_path, make=True), tmp_path, GPU_CHECK_VENV=str(venv))
    assert r.returncode == 0, r.stdout + r.stderr
    assert made == [f"VENV={venv} {venv}/.installed"] and (venv / "bin" / "python").exists()
    assert not (root / ".venv").exists()
    assert f"is False in {venv}/bin/python" in r.stdout


def test_with_no_way_to_a_torch_it_says_so_and_fails(tmp_path):
    r, made = _run(_checkout(tmp_path), _bin(tmp_path, make=False), tmp_path)
    assert r.returncode == 1 and made == []
    assert "no make to build .venv" in r.stderr and "no python with torch; nothing checked" in r.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_the_target_the_script_builds_is_the_makefiles_stamp(tmp_path):
    """`make -n` (prints the recipe, runs nothing): the target exists and builds a venv with the project in it."""
    r = subprocess.run(["make", "-n", "-C", str(REPO), f"VENV={tmp_path}/v", f"{tmp_path}/v/.installed"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"-m venv {tmp_path}/v" in r.stdout and "pip install" in r.stdout and f"touch {tmp_path}/v/.installed" \
        in r.stdout

"""Training runs that several test files check, made once per session by conftest.py's fixtures, and the two ways
the tests run `cptsim`: in a subprocess (what a kill, ^C or a launcher needs: a real process) or in this process
(the same command without the ~5 s of starting Python and torch, where no process behaviour is checked)."""

import os
import subprocess
import sys

# digits-cnn, 24 steps (2 epochs of batch 128), a checkpoint every 5 steps; 4 cycles of 6 steps (the default n32
# would alias over 24 steps, and say so on stderr)
DIGITS = ["train", "--epochs", "2", "--batch-size", "128", "--quiet", "--checkpoint-every", "5",
          "--schedule", "cpt:3-8:g8:n4"]
# the same steps in full precision on the mlp (no BatchNorm): 2 ranks equal 1 up to the order of float sums
MLP_FP = [*DIGITS, "--model", "mlp", "--schedule", "static:32:g32"]


def cptsim(*args, env_extra=None, timeout=400):
    """`cptsim ARGS` in a new Python process."""
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "cptsim.cli.main", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def cptsim_here(*args, env_extra=None):
    """`cptsim ARGS` in this process (click's runner: exit_code, stdout, stderr). Digits and text models train on one
    thread in either (cptsim.run.train.cpu_threads), so a run made here is bit for bit the one a subprocess makes --
    the resume tests compare them with torch.equal."""
    from click.testing import CliRunner

    from cptsim.cli.main import cli

    before = {k: os.environ.get(k) for k in (env_extra or {})}
    os.environ.update(env_extra or {})
    try:
        return CliRunner().invoke(cli, [*map(str, args)])
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

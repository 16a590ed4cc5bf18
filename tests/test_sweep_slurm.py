"""`cptsim sweep --executor slurm | submitit-local`, `--status`, `--index` and the runs' result records (issue 29).

No Slurm is needed: the jobs run through submitit's own LocalExecutor (the same TrainJob a Slurm node runs), and
the Slurm path itself runs against stand-in `sbatch` / `sacct` / `srun` programs on PATH, so the job script that
submitit really hands to sbatch is read back, and the states sacct reports are mapped as on a cluster. The runs
are tiny (digits-cnn, 4 steps): what is tested is the bookkeeping."""

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cptsim.cli.main import cli
from cptsim.study import cluster as C
from cptsim.study import resultfile as RF
from cptsim.study.results import ResultsDB

pytest.importorskip("submitit")

STEPS = "4"
WORKLOAD = ["--steps", STEPS, "--checkpoint-every", "1"]


def _cli(*args, env=None):
    return CliRunner().invoke(cli, [str(a) for a in args], env=env)


def _one_line_error(r, needle):
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr


def _rows(db):
    with ResultsDB(db) as d:
        return {r["run_path"]: {k: v for k, v in r.items() if k != "id"} for r in d.rows()}


# ------------------------------------------------------------------------------------------------ input


def test_slurm_time_takes_slurms_forms_and_options_pass_through():
    assert [C.parse_slurm_time(t) for t in ("90", "1:30:00", "2-0", "1-2:30", "0-0:0:30", "5:30")] == \
        [90, 90, 2880, 1590, 1, 6]  # minutes, a part-minute rounded up
    assert C.parse_slurm_options(["account=proj", "--qos=high", "exclusive", "mem_per_cpu=4G"]) == \
        {"account": "proj", "qos": "high", "exclusive": True, "mem-per-cpu": "4G"}
    for bad in ("4h", "", "0"):
        with pytest.raises(Exception, match="--slurm-time"):
            C.parse_slurm_time(bad)


@pytest.mark.parametrize("args,needle", [
    (["--slurm-partition", "gpu"], "go with --executor slurm"),
    (["--executor", "slurm"], "needs --slurm-time"),
    (["--executor", "slurm", "--slurm-time", "4h"], "--slurm-time"),
    (["--wait"], "--wait goes with --executor"),
    (["--executor", "submitit-local", "--jobs", "2"], "--jobs goes with"),
    (["--executor", "slurm", "--slurm-time", "60", "--slurm-option", "a b"], "--slurm-option"),
    (["--executor", "slurm", "--slurm-time", "60", "--device", "cuda", "--nproc", "4",
      "--slurm-gpus-per-node", "2"], "need as many GPUs"),
    (["--status", "--report"], "one at a time"),
])
def test_bad_cluster_input_is_one_line_and_exit_2(args, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _one_line_error(_cli("sweep", "--schedules", "static:4", "--out", "X", "--db", tmp_path / "r.db", *args), needle)
    assert not (tmp_path / "X").exists()


# ------------------------------------------------------------------------------------------------ result.json


def _row(**kw):
    return {"workload_key": "k" * 16, "workload": {"model": "m"}, "schedule": "static:4:g8", "family": "static",
            "seed": 0, "steps": 4, "test_acc": 0.5, "source": "sweep", "run_path": "/elsewhere", "id": 7} | kw


def test_a_result_record_reads_back_as_the_row_with_the_directory_it_is_in(tmp_path):
    RF.write_result(tmp_path, _row())
    doc = json.loads((tmp_path / "result.json").read_text())
    assert doc["format"] == RF.RESULT_FORMAT and "run_path" not in doc and "id" not in doc
    row = RF.read_result(tmp_path)
    assert row == {k: v for k, v in _row().items() if k != "id"} | {"run_path": str(tmp_path.resolve())}
    assert RF.read_result(tmp_path / "nothing") is None


@pytest.mark.parametrize("damage,needle", [
    (lambda t: t[: len(t) // 2], "not valid JSON"),             # half written (a copy cut short)
    (lambda t: "", "not valid JSON"),
    (lambda t: t.replace(RF.RESULT_FORMAT, "x/1"), "not a cptsim result record"),
    (lambda t: t.replace('"test_acc"', '"acc"'), "'test_acc' is missing"),
    (lambda t: t.replace('"seed": 0', '"seed": "0"'), "'seed'"),
])
def test_a_damaged_result_record_is_refused_naming_the_file(tmp_path, damage, needle):
    RF.write_result(tmp_path, _row())
    p = tmp_path / "result.json"
    p.write_text(damage(p.read_text()))
    with pytest.raises(RF.ResultDamaged, match=needle) as e:
        RF.read_result(tmp_path)
    assert str(p) in str(e.value)


# ------------------------------------------------------------------------------------------------ Slurm, stand-ins


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """sbatch / sacct / srun stand-ins: sbatch keeps every script it is given and answers job ids 4242, 4243, ...;
    sacct answers the states written in ``states`` (JobID|State lines)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    state = tmp_path / "slurm"
    state.mkdir()
    (state / "states").write_text("")
    (bin_ / "sbatch").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        n=$(ls {state} | grep -c '^script')
        cp "$1" {state}/script$n
        echo "Submitted batch job $((4242 + n))"
        """))
    (bin_ / "sacct").write_text(f"#!/bin/sh\necho 'JobID|State|NodeList'\ncat {state}/states\n")
    (bin_ / "srun").write_text("#!/bin/sh\nexit 1\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    return state


SLURM_FLAGS = ["--executor", "slurm", "--slurm-partition", "gpu", "--slurm-time", "1:30:00",
               "--slurm-gpus-per-node", "2", "--slurm-cpus-per-task", "8", "--jobs", "2",
               "--slurm-setup", "module load cuda/12.1", "--slurm-setup", "source /shared/venv/bin/activate",
               "--slurm-option", "account=proj", "--slurm-option", "exclusive"]


def _script_lines(text):
    return text.splitlines()


def test_slurm_job_script_follows_the_flags_and_a_rerun_resubmits_only_the_ended_jobs(tmp_path, fake_slurm):
    out = tmp_path / "sw"
    args = ["sweep", "--schedules", "static:4,cpt:3-8:g8:n2", "--seeds", "0,1", *WORKLOAD, "--nproc", "2",
            "--out", out, "--db", tmp_path / "r.db", *SLURM_FLAGS]
    # --dry-run: the script, nothing submitted, nothing written
    r = _cli(*args, "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    dry = json.loads(r.stdout)
    assert len(dry["submit"]) == 4 and not out.exists() and not list(fake_slurm.glob("script*"))
    # submitted: one sbatch call, a job array of the four runs
    r = _cli(*args, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["submitted"] == ["4242_0", "4242_1", "4242_2", "4242_3"]
    script = (fake_slurm / "script0").read_text()
    assert script == dry["script"]  # --dry-run shows the very script sbatch is given
    lines = _script_lines(script)
    for want in ("#SBATCH --partition=gpu", "#SBATCH --time=90", "#SBATCH --gpus-per-node=2",
                 "#SBATCH --cpus-per-task=8", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --array=0-3%2", "#SBATCH --account=proj", "#SBATCH --exclusive",
                 f"#SBATCH --job-name=cptsim-{out.name}"):
        assert want in lines, (want, script)
    setup = lines.index("# setup")
    assert lines[setup + 1: setup + 3] == ["module load cuda/12.1", "source /shared/venv/bin/activate"]
    cmd = [x for x in lines if "submitit.core._submit" in x]
    assert len(cmd) == 1 and cmd[0].startswith("srun ") and str((out / ".submitit").resolve()) in cmd[0]
    assert sys.executable in cmd[0]  # the nodes run this installation's python (a shared venv)
    # each job trains its run with the sweep's workload and --nproc (torchrun inside the allocation)
    jobs = json.loads((out / "jobs.json").read_text())["runs"]
    assert {n: j["job_id"] for n, j in jobs.items()} == {
        "static_4_g8-s0": "4242_0", "static_4_g8-s1": "4242_1", "cos-rep_3-8_g8_n2-s0": "4242_2",
        "cos-rep_3-8_g8_n2-s1": "4242_3"}
    pkls = sorted((out / ".submitit").glob("4242_*_submitted.pkl"))
    assert len(pkls) == 4
    with open(pkls[0], "rb") as f:
        job = pickle.load(f).function
    argv = job.command(resume=False)
    assert argv[argv.index("--nproc") + 1] == "2" and argv[argv.index("--steps") + 1] == STEPS
    assert job.command(resume=True)[3:6] == ["train", "--resume", job.spec["run"]]
    # the scheduler's word per run: running, queued, and two ended without a result
    (fake_slurm / "states").write_text("4242_0|RUNNING|n1\n4242_1|PENDING|\n4242_2|FAILED|n2\n"
                                       "4242_3|CANCELLED by 1000|n3\n")
    r = _cli("sweep", "--status", "--out", out, "--json")
    assert r.exit_code == 0, r.output
    runs = json.loads(r.stdout)["runs"]
    st = {x["name"]: (x["status"], x["job_state"]) for x in runs}
    # a job that died before its training began: the scheduler's log is where to look
    assert runs[2]["error"] == f"job 4242_2 FAILED: see {out / '.submitit' / '4242_2_0_log.err'}"
    assert st == {"static_4_g8-s0": ("running", "RUNNING"), "static_4_g8-s1": ("queued", "PENDING"),
                  "cos-rep_3-8_g8_n2-s0": ("failed", "FAILED"), "cos-rep_3-8_g8_n2-s1": ("failed", "CANCELLED")}
    # a rerun leaves the running and the queued job alone and resubmits the two that ended
    r = _cli(*args, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["submitted"] == ["4243_0", "4243_1"]
    assert [(x["name"], x["action"], x["job_id"]) for x in doc["runs"]] == [
        ("static_4_g8-s0", "wait", "4242_0"), ("static_4_g8-s1", "wait", "4242_1"),
        ("cos-rep_3-8_g8_n2-s0", "new", "4243_0"), ("cos-rep_3-8_g8_n2-s1", "new", "4243_1")]
    assert "#SBATCH --array=0-1%2" in _script_lines((fake_slurm / "script1").read_text())
    jobs = json.loads((out / "jobs.json").read_text())["runs"]
    assert jobs["static_4_g8-s0"]["job_id"] == "4242_0" and jobs["cos-rep_3-8_g8_n2-s1"]["job_id"] == "4243_1"
    assert jobs["cos-rep_3-8_g8_n2-s1"]["earlier"] == ["4242_3"] and jobs["static_4_g8-s0"]["earlier"] == []


def test_a_cuda_sweep_is_submitted_from_a_login_node_without_a_gpu_asking_a_gpu_per_worker(tmp_path):
    """--device cuda is the nodes' business: this (GPU-less) machine only builds the job script, and each job asks
    for one GPU per --nproc worker unless --slurm-gpus-per-node says otherwise."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a machine with a GPU cannot show that a login node without one is not asked for it")
    args = ["sweep", "--schedules", "static:4", *WORKLOAD, "--device", "cuda", "--out", tmp_path / "sw",
            "--executor", "slurm", "--slurm-time", "60", "--dry-run", "--json"]
    for extra, gpus in (([], "1"), (["--nproc", "2"], "2"), (["--nproc", "2", "--slurm-gpus-per-node", "4"], "4")):
        r = _cli(*args, *extra)
        assert r.exit_code == 0, r.output
        assert f"#SBATCH --gpus-per-node={gpus}" in json.loads(r.stdout)["script"].splitlines()
    _one_line_error(_cli(*args[:-4], "--executor", "local"), "no CUDA device")


def test_without_slurm_the_slurm_executor_says_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun, no sbatch
    monkeypatch.chdir(tmp_path)
    _one_line_error(_cli("sweep", "--schedules", "static:4", *WORKLOAD, "--out", "sw", "--executor", "slurm",
                         "--slurm-time", "60"), "no Slurm on this machine")


def test_a_job_warned_of_its_time_limit_stops_its_training_and_requeues_itself(tmp_path, monkeypatch):
    """As on a node: the job waits on its training when Slurm's USR2 arrives; submitit's handler calls
    TrainJob.checkpoint, which has the training stop (SIGINT: it checkpoints at the end of its step; USR2 itself
    must not kill it) and hands back the same run to requeue, which resumes when it starts again."""
    import threading

    from cptsim.run.rundir import RunLock

    up = tmp_path / "up"
    sleeper = ("import pathlib, signal, sys, time\n"
               "signal.signal(signal.SIGINT, lambda *a: sys.exit(130))\n"
               f"pathlib.Path({str(up)!r}).touch()\n"
               "time.sleep(60)")
    monkeypatch.setattr(C.TrainJob, "command", lambda self, resume: [sys.executable, "-c", sleeper])
    job = C.TrainJob({"run": str(tmp_path / "run"), "log": str(tmp_path / "log"), "schedule": "static:4:g8",
                      "seed": 0, "train_flags": [], "nproc": None})
    got = {}

    def on_usr2(signum, frame):  # what submitit's handler does: checkpoint, requeue, exit
        os.killpg(os.getpgid(job._proc.pid), 0)  # (the training is alive to be signalled)
        got["again"] = job.checkpoint()
        raise SystemExit(-1)

    def slurm_warns():  # once the training is up: USR2 to every process of the job step
        while not up.exists() and time.monotonic() - t0 < 20:
            time.sleep(0.02)
        os.kill(job._proc.pid, signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGUSR2)

    old = signal.signal(signal.SIGUSR2, on_usr2)
    t0 = time.monotonic()
    warner = threading.Thread(target=slurm_warns, daemon=True)
    warner.start()
    try:
        with pytest.raises(SystemExit):
            job()
    finally:
        warner.join()
        signal.signal(signal.SIGUSR2, old)
    assert time.monotonic() - t0 < 20
    assert job._proc.wait(5) == 130  # stopped by the SIGINT, not killed by USR2
    again = got["again"].function
    assert isinstance(again, C.TrainJob) and again.spec == job.spec
    assert pickle.loads(pickle.dumps(again)).spec == job.spec  # what submitit writes for the requeue
    with RunLock.acquire(tmp_path / "run"):  # the job let go of the run
        pass


# ------------------------------------------------------------------------------------------------ submitit local


@pytest.mark.slow
def test_submitit_sweep_of_four_runs_completes_indexes_reports_and_a_killed_job_alone_is_resubmitted(tmp_path):
    out, db = tmp_path / "sw", tmp_path / "r.db"
    args = ["sweep", "--executor", "submitit-local", "--schedules", "static:4,cpt:3-8:g8:n2", "--seeds", "0,1",
            *WORKLOAD, "--out", out, "--no-db", "--wait", "--json"]
    killed = "cos-rep_3-8_g8_n2-s1"
    # 1. four jobs; one of them dies (SIGKILL) as its training begins step 2
    r = _cli(*args, env={"CPTSIM_FAULT_KILL_RUN": f"{killed}:2"})
    assert r.exit_code == 1 and "1 of 4 runs did not finish" in r.stderr, r.output
    doc = json.loads(r.stdout)
    assert len(doc["submitted"]) == 4
    assert {x["name"]: x["status"] for x in doc["runs"]} == {
        "static_4_g8-s0": "done", "static_4_g8-s1": "done", "cos-rep_3-8_g8_n2-s0": "done", killed: "failed"}
    assert not (out / killed / "result.json").exists()
    assert len((out / killed / "trace.jsonl").read_text().splitlines()) == 2
    r = _cli("sweep", "--status", "--out", out, "--json")
    st = {x["name"]: x for x in json.loads(r.stdout)["runs"]}
    assert st[killed]["status"] == "failed" and "-9" in st[killed]["error"], st[killed]
    assert json.loads(r.stdout)["counts"]["done"] == 3
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("static_4_g8-s*/*")}
    # 2. the rerun submits that one job only; it resumes its run from the checkpoint
    r = _cli(*args)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert len(doc["submitted"]) == 1
    assert [(x["name"], x["action"]) for x in doc["runs"]] == [
        ("static_4_g8-s0", "skip"), ("static_4_g8-s1", "skip"), ("cos-rep_3-8_g8_n2-s0", "skip"), (killed, "resume")]
    assert {p: p.stat().st_mtime_ns for p in out.glob("static_4_g8-s*/*")} == stamps  # finished runs untouched
    assert "--resume" in (out / f"{killed}.log").read_text()
    assert len((out / killed / "trace.jsonl").read_text().splitlines()) == int(STEPS)
    assert {x["status"] for x in json.loads(_cli("sweep", "--status", "--out", out, "--json").stdout)["runs"]} == \
        {"done"}
    # 3. indexed into the database: one row per run, the row each result.json records
    r = _cli("sweep", "--index", "--out", out, "--db", db, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["added"] == 4, r.output
    rows = _rows(db)
    assert len(rows) == 4 and {v["source"] for v in rows.values()} == {"sweep"}
    for p in out.glob("*-s?"):
        assert rows[str(p.resolve())] == RF.read_result(p)
    assert json.loads(_cli("sweep", "--index", "--out", out, "--db", db, "--json").stdout)["added"] == 0
    # 4. reported from the run directories and from the database alike
    rep_dir = json.loads(_cli("sweep", "--report", "--out", out, "--json").stdout)
    rep_db = json.loads(_cli("sweep", "--report", "--db", db, "--json").stdout)
    assert rep_dir["runs"] == rep_db["runs"] == 4
    assert rep_dir["schedules"] == rep_db["schedules"]
    # 5. a half-written record: skipped with a warning naming it, its run unfinished, the others still counted
    rec = out / killed / "result.json"
    rec.write_text(rec.read_text()[:100])
    trace = (out / killed / "trace.jsonl").stat().st_mtime_ns
    r = _cli("sweep", "--status", "--out", out, "--json")
    assert r.exit_code == 0, r.output
    assert {x["name"]: x["status"] for x in json.loads(r.stdout)["runs"]}[killed] == "unfinished"
    assert f"warning: {rec}: not valid JSON" in r.stderr
    r = _cli("sweep", "--index", "--out", out, "--db", tmp_path / "partial.db", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["runs"] == 3 and f"warning: {rec}" in r.stderr, r.output
    assert str((out / killed).resolve()) not in _rows(tmp_path / "partial.db")
    r = _cli("sweep", "--report", "--out", out, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["runs"] == 3 and f"warning: {rec}" in r.stderr, r.output
    # ... and the rerun writes it again from the run directory, on this machine, without a job or any training
    r = _cli(*args)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["submitted"] == [] and [x["action"] for x in doc["runs"]] == ["skip"] * 3 + ["record"]
    assert (out / killed / "trace.jsonl").stat().st_mtime_ns == trace
    again = {k: v for k, v in RF.read_result(out / killed).items() if k != "created"}
    assert again == {k: v for k, v in rows[str((out / killed).resolve())].items() if k != "created"}


@pytest.mark.slow
def test_an_index_of_the_run_directories_is_the_database_a_local_sweep_wrote(tmp_path):
    out, db = tmp_path / "sw", tmp_path / "local.db"
    r = _cli("sweep", "--schedules", "static:4,cpt:3-8:g8:n2", "--seeds", "0", *WORKLOAD, "--jobs", "2",
             "--out", out, "--db", db, "--quiet")
    assert r.exit_code == 0, r.output
    r = _cli("sweep", "--index", "--out", out, "--db", tmp_path / "index.db", "--json")
    assert r.exit_code == 0, r.output
    local = _rows(db)
    assert len(local) == 2 and _rows(tmp_path / "index.db") == local

"""Data-parallel plumbing on PyTorch's own engine (torch.distributed; torchrun launches the workers).

The training loop is written once for any number of processes: with one process every collective here is a
no-op. Gradients are summed across ranks by hand -- in DDP-style buckets whose all-reduces start during backward
(``GradBuckets``) -- rather than through DistributedDataParallel, because a rank may hold *no* sample of a ragged
last batch (each sample is seen once per epoch, never padded), and DDP cannot run a step with an empty input
without join(). NCCL on CUDA, gloo on a CPU.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cptsim.errors import InputError


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.active:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def all_reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum every parameter's gradient over the ranks (a rank that ran no sample contributes zeros).

        Overlapped with backward (``GradBuckets``, attached on the first call): each bucket's all-reduce starts as
        soon as backward has accumulated its gradients; this call launches the buckets backward did not (every one
        on a rank that ran no sample, and all of them on the first step), waits, and writes the sums back."""
        if not self.active:
            return
        buckets = getattr(self, "_buckets", None)
        if buckets is None or [id(p) for p in buckets.params] != [id(p) for p in params]:
            if buckets is not None:
                buckets.close()
            buckets = self._buckets = GradBuckets(params)
        buckets.finish()

    def step_totals(self, stats: torch.Tensor | None, counts: list[int]) -> tuple[float, float, list[int]]:
        """(loss sum, correct, counts) of the global batch, read to the host in one transfer.

        ``stats``: this rank's [loss sum, correct] as a float64 tensor on its device, None for a rank with no sample;
        ``counts``: its executed MACs and BitOPs (host integers). With one process the only device read is
        ``stats.tolist()``: the training step's one host-device synchronisation. With several, the counts are summed
        as int64 (exact beyond 2**53) and travel back with the float64 stats as their bit patterns.
        """
        if not self.active:
            vals = stats.tolist() if stats is not None else [0.0, 0.0]
            return vals[0], vals[1], list(counts)
        dev = torch.device(self.device) if str(self.device).startswith("cuda") else torch.device("cpu")
        s = stats.to(dev) if stats is not None else torch.zeros(2, dtype=torch.float64, device=dev)
        c = torch.tensor(counts, dtype=torch.int64).to(dev, non_blocking=True)
        dist.all_reduce(s, op=dist.ReduceOp.SUM)
        dist.all_reduce(c, op=dist.ReduceOp.SUM)
        vals = torch.cat([s.view(torch.int64), c]).tolist()
        loss_sum, correct = torch.tensor(vals[:2], dtype=torch.int64).view(torch.float64).tolist()
        return loss_sum, correct, vals[2:]

    def broadcast_buffers(self, module: torch.nn.Module) -> None:
        """Make every rank's buffers (BatchNorm statistics, activation ranges) rank 0's -- but the state a model
        carries along this rank's own rows of the text streams (the own buffers of a module with ``reset_state``:
        an LSTM's ``carry``). That state is this rank's alone, and its size is its number of rows, which differ
        between ranks after an epoch's short last step (a broadcast of unequal sizes aborts gloo)."""
        if self.active:
            carried = {id(b) for m in module.modules() if hasattr(m, "reset_state") for b in m.buffers(recurse=False)}
            for b in module.buffers():
                if id(b) not in carried:
                    dist.broadcast(b, src=0)

    def gather_rng(self) -> list[torch.Tensor]:
        """Every rank's torch RNG state, in rank order (each rank draws its own stochastic-rounding noise)."""
        return self.gather_tensor(torch.get_rng_state())

    def gather_tensor(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``t`` (the same shape and dtype on every rank), in rank order, on the CPU.

        NCCL gathers device tensors only: a host tensor (an RNG state) travels through this rank's GPU."""
        t = t.detach().cpu()
        if not self.active:
            return [t]
        dev = torch.device(self.device) if dist.get_backend() == "nccl" else torch.device("cpu")
        src = t.to(dev)
        out = [torch.empty_like(src) for _ in range(self.world)]
        dist.all_gather(out, src)
        return [o.cpu() for o in out]

    def gather_object(self, obj) -> list:
        """Every rank's picklable ``obj`` (any size: a model's buffers), in rank order."""
        if not self.active:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def any(self, flag: bool) -> bool:
        """True on every rank if any rank says so (to stop all ranks at the same step)."""
        if not self.active:
            return flag
        dev = self.device if str(self.device).startswith("cuda") else "cpu"  # NCCL reduces device tensors only
        t = torch.tensor([1 if flag else 0], device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def same(self, value: int) -> bool:
        """True on every rank if every rank passed the same integer (e.g. the checkpoint step it resumes from)."""
        if not self.active:
            return True
        dev = self.device if str(self.device).startswith("cuda") else "cpu"
        t = torch.tensor([value, -value], dtype=torch.int64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        hi, neg_lo = t.tolist()
        return hi == -neg_lo

    def barrier(self) -> None:
        if self.active:
            dist.barrier()


BUCKET_CAP_BYTES = 25 * 2**20  # DistributedDataParallel's default bucket size


class GradBuckets:
    """DDP-style gradient buckets, without DDP: parameters in reverse order (backward produces the last layers'
    gradients first) grouped into buckets of about ``cap_bytes``. A hook after each gradient's accumulation counts
    down its bucket; bucket i's flattened all-reduce (async) starts once it and every bucket before it are complete,
    so every rank issues the same collectives in the same order, and the communication runs while backward goes on.
    ``finish()`` launches what backward did not -- all of it on a rank that ran no sample of a ragged last batch
    (zeros), which DistributedDataParallel cannot do without join() -- waits, and copies the sums into ``.grad``.
    Sums are elementwise over the same ranks as one flat all-reduce, so the result is that of one flat buffer."""

    def __init__(self, params: list, cap_bytes: int | None = None):
        import threading

        cap_bytes = cap_bytes or BUCKET_CAP_BYTES
        self.params = list(params)
        self.buckets: list[list] = []
        cur, size = [], 0
        for p in reversed(self.params):
            cur.append(p)
            size += p.numel() * p.element_size()
            if size >= cap_bytes:
                self.buckets.append(cur)
                cur, size = [], 0
        if cur:
            self.buckets.append(cur)
        self._index = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self._lock = threading.Lock()
        self._reset()
        self._handles = [p.register_post_accumulate_grad_hook(self._ready) for p in self.params if p.requires_grad]

    def _reset(self) -> None:
        self._pending = [len(b) for b in self.buckets]
        self._launched = 0
        self._works: list = []

    def _ready(self, p) -> None:  # runs in autograd's thread, once per parameter per backward
        with self._lock:
            self._pending[self._index[id(p)]] -= 1
            while self._launched < len(self.buckets) and self._pending[self._launched] <= 0:
                self._launch()

    def _launch(self) -> None:
        i = self._launched
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.buckets[i]])
        self._works.append((i, flat, dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)))
        self._launched += 1

    def finish(self) -> None:
        """Launch the buckets not started during backward, wait for all, write the sums into ``.grad``."""
        with self._lock:
            while self._launched < len(self.buckets):
                self._launch()
            works = self._works
            self._reset()
        for i, flat, work in works:
            work.wait()
            offset = 0
            for p in self.buckets[i]:
                n = p.numel()
                total = flat[offset:offset + n].view_as(p)
                if p.grad is None:
                    p.grad = total.clone()
                else:
                    p.grad.copy_(total)
                offset += n

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def from_env(device: str) -> Dist:
    """This process's place in the job, from torchrun's environment; joins the process group when there is one."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        if device.startswith("cuda"):
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        attempt = restart_count()
        if attempt and "MASTER_ADDR" in os.environ:
            # torchrun shares its rendezvous store with the workers, and a restarted group finds the previous
            # attempt's keys there (the dead ranks' addresses: "Gloo connectFullMesh failed ... Connection
            # refused"). A prefix per attempt gives every restart a clean namespace.
            from torch.distributed.rendezvous import rendezvous

            store, _, _ = next(rendezvous("env://"))
            dist.init_process_group(backend=backend, store=dist.PrefixStore(f"cptsim/attempt-{attempt}", store),
                                    rank=rank, world_size=world)
        else:
            dist.init_process_group(backend=backend)
    return Dist(rank=rank, world=world, device=device)


def shutdown() -> None:
    """Leave the process group together: a rank that tears gloo down while a peer still talks to it can abort
    ("terminate called without an active exception"), so every rank first waits for all the others."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def restart_count() -> int:
    """How many times torchrun has restarted this job's workers (0 for the first attempt, or without torchrun)."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    except ValueError:
        return 0


# A worker launched by ``launch`` that meets bad input (an InputError: exit 2) writes its message here and waits;
# the launcher stops the whole job without restarts (a restart would only meet the same typo again).
BAD_INPUT_ENV = "CPTSIM_BAD_INPUT_FILE"
BAD_INPUT_WAIT_S = 60.0  # how long such a worker waits to be stopped before it exits 2 by itself


def report_bad_input(message: str, wait_s: float | None = None) -> bool:
    """In a worker that ``launch`` started: hand ``message`` to the launcher, which stops the job (no restart), and
    wait to be stopped. False at once outside such a job, or when the launcher did not stop it within ``wait_s``
    (the caller then exits 2 as usual). The first rank to report wins; the file appears whole (a hard link)."""
    import time

    path = os.environ.get(BAD_INPUT_ENV)
    if not path:
        return False
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(message)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another rank said it first
        finally:
            os.unlink(tmp)
    except OSError:
        return False  # the launcher's folder is gone: nobody to tell
    deadline = time.monotonic() + (BAD_INPUT_WAIT_S if wait_s is None else wait_s)
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return False


def _quiet_elastic_logs(level: int) -> None:
    """Raise the level of torch.distributed's own loggers (each module's logger has its own: no parent covers
    them). ERROR keeps a worker's failure ("failed (exitcode: -9) local_rank: 1") and drops the agent's notes on
    shutting the group down; CRITICAL drops everything."""
    import logging

    for name in list(logging.Logger.manager.loggerDict):
        if name.startswith("torch.distributed"):
            logging.getLogger(name).setLevel(level)


def launch(nproc: int, argv: list[str], max_restarts: int = 0, lock=None) -> int:
    """Run `cptsim <argv>` in `nproc` local worker processes under torchrun's elastic agent; returns the job's exit
    code (0 ok; 2 bad input; 130 interrupted; 1 a worker failed for good).

    The agent runs in this process (``torch.distributed.run.run``, what the ``torchrun`` command runs), so this
    process decides what a failure means. ``max_restarts``: the agent restarts the whole group this many times when
    a worker dies; the restarted workers resume the run from its last checkpoint (cli/train_cmd.py). Bad input is
    not restarted: a worker that meets it reports it (``report_bad_input``) and waits, and this process stops the
    group at once and returns 2 after printing the message once. ``lock``: the run's RunLock, held by this process
    for the whole job; the workers get its token, so that rank 0 adopts it instead of being refused."""
    import logging
    import signal
    import tempfile
    import threading

    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if nproc < 1:
        raise InputError(f"--nproc must be at least 1, got {nproc}")
    if max_restarts < 0:
        raise InputError(f"--max-restarts must be >= 0, got {max_restarts}")
    _quiet_elastic_logs(logging.ERROR)
    args = torchrun.parse_args(["--standalone", f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
                                "-m", "cptsim.cli.main", *argv])
    with tempfile.TemporaryDirectory(prefix="cptsim-launch-") as tmp:
        marker = os.path.join(tmp, "bad-input")
        env = {BAD_INPUT_ENV: marker, **(lock.handoff_env() if lock is not None else {})}
        # torchrun sets OMP_NUM_THREADS=1 for its workers when it is unset, with a banner; set it without one
        env.setdefault("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # the agent's workers inherit this process's environment
        done = threading.Event()

        def watch() -> None:  # a worker reported bad input: stop the agent (its SIGTERM handler stops the group)
            while not done.wait(0.05):
                if os.path.exists(marker) and callable(signal.getsignal(signal.SIGTERM)):
                    _quiet_elastic_logs(logging.CRITICAL)
                    os.kill(os.getpid(), signal.SIGTERM)
                    return

        watcher = threading.Thread(target=watch, name="cptsim-bad-input-watch", daemon=True)
        watcher.start()
        code = 0
        try:
            torchrun.run(args)
        except SignalException as e:
            code = 128 + int(e.sigval)
        except ChildFailedError as e:
            rank, failure = e.get_first_failure()
            code = failure.exitcode if failure.exitcode in (2, 130) else 1
            if code == 1:
                how = (f"signal {signal.Signals(-failure.exitcode).name}" if failure.exitcode < 0
                       else f"exit code {failure.exitcode}")
                print(f"error: worker rank {rank} failed ({how})"
                      + (f" after {max_restarts} restart(s)" if max_restarts else ""), file=sys.stderr)
        finally:
            done.set()
            watcher.join()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        if os.path.exists(marker):
            with open(marker, encoding="utf-8") as f:
                raise InputError(f.read())
        return code

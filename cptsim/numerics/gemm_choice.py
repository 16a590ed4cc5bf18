"""Whether the exact int8 GEMM path is this CPU's default: measured on this machine, once, and kept.

The path (cptsim.numerics.exact_gemm) runs a quantized Linear layer's forward and wgrad GEMMs as int8
``torch._int_mm``. On a CPU with int8 dot-product instructions (AVX512-VNNI, AVX-VNNI, AMX) that is several times
faster than the FP32 matmul of the same shape; on one without them torch falls back to a generic loop that is far
slower: an AVX2-only AMD EPYC took 410 ms against 9.9 ms for FP32 (4096x512 @ 512x128, one thread), which made a
transformer-lm step 8-12 s instead of 0.4-0.6 s on the fake-quant path. That ``torch._int_mm`` exists says nothing
about which of the two a machine is, so the default is measured:

* ``PROBE_SHAPE`` (a transformer block's Linear over 4096 tokens) as ``torch._int_mm`` and as an FP32 ``torch.mm``,
  at the thread count the run uses, alternated, the fastest of up to ``REPEATS`` calls each (a busy neighbour slows a
  call, never speeds one up), again after a pause unless clearly faster; a first ``_int_mm`` call more than
  ``SLOW_CUTOFF`` times the FP32 one, confirmed by a second (a call preempted by a busy neighbour can take a time
  slice longer), decides at once, so a slow machine pays two slow calls (~0.8 s), a fast one ~0.1-0.3 s (up to
  ~0.8 s near the threshold);
* the path is on when ``_int_mm`` is at least ``MIN_SPEEDUP`` times faster. Not merely faster: the path adds passes
  of its own (the operands' int8 codes, the int32 epilogue). With ``_int_mm`` 4-7x faster than FP32 (AVX512-VNNI)
  the whole step measured 0.85-0.88x the fake-quant one on lstm-lm and 0.94-1.00x on transformer-lm
  (benchmarks/bench_quant_step.py, bench_exact_gemm.py): by the GEMMs' share of those steps the path breaks even
  near 1.3x on lstm-lm and near 3x on transformer-lm, and 2x is between;
* the decision is kept in ``gemm-choice.json`` in the cptsim cache directory (``cptsim.fileio.cache_dir``:
  ``$CPTSIM_HOME/cache``, else ``$XDG_CACHE_HOME/cptsim``, else ``~/.cache/cptsim``), one entry per CPU model,
  vector extensions, torch thread count and torch version: later runs, and the host cost model (cptsim.cost.hardware.host), read the same answer.
  Deleting the file measures again. Writers take a lock (ranks of one machine starting together measure once).

The measurement draws its operands from a private generator: a run's random stream is untouched by it.
On CUDA the same file keeps whether the tensor-core routes (cptsim.numerics.gpu_gemm) are the default on a GPU model
(``cuda_choice``, section at the end).
``CPTSIM_EXACT_GEMM=0/1/codes`` (exact_gemm.mode) overrides it and then nothing is measured.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

PROBE_SHAPE = (4096, 512, 128)  # M (tokens), K, N of the probe GEMM
MIN_SPEEDUP = 2.0  # _int_mm must be this many times faster than FP32 for the path to pay (module docstring)
SLOW_CUTOFF = 4.0  # a first _int_mm call this many times the FP32 time: slow beyond any noise, decided at once
# Timed calls of each per round (after the warm-up), and the time after which a round stops early. On a machine
# whose cores other processes share, a call that loses a core for a moment takes several times as long, and with two
# threads on two busy cores (load ~3) a whole round of calls can: there, with _int_mm ~4x faster when undisturbed,
# the fastest of 3 picked the fake-quant path in 3 of 5 measurements, of 10 in 1 of 5. A result short of twice
# MIN_SPEEDUP (and not decided by SLOW_CUTOFF) is measured again after a pause, up to ROUNDS rounds, the fastest call
# of all counting (1 of 8 still there; at one thread 0 of 40). The record says when the machine was busy.
REPEATS = 10
BUDGET_S = 0.2
ROUNDS = 3
PAUSE_S = 0.05
FORMAT = "cptsim.gemm-choice/1"
FILE = "gemm-choice.json"

# flags of /proc/cpuinfo that decide how fast an int8 or FP32 GEMM can be (x86 and Arm spellings)
_EXT_PREFIXES = ("avx", "amx", "fma", "f16c", "sse4", "asimd", "sve", "i8mm", "bf16")
# the int8-relevant extension named in messages: the first of these the CPU has
_INT8_EXT = ("amx_int8", "avx512_vnni", "avx_vnni", "avx512bw", "avx2", "i8mm", "asimddp", "asimd")

_DECIDED: dict = {}  # (cache file, threads) -> record: one lookup per call after the first (layers ask per forward)


def cpu_signature() -> tuple[str, list[str]]:
    """(CPU model, its vector extensions that matter to a GEMM, sorted), from /proc/cpuinfo where there is one."""
    model, ext = "", []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "cpu model", "hardware") and not model:
                    model = value.strip()
                elif key in ("flags", "features") and not ext:
                    ext = sorted({x for x in value.split() if x.startswith(_EXT_PREFIXES)})
    except OSError:
        pass
    return model or platform.processor() or platform.machine() or "unknown", ext


def int8_extension(ext: list[str]) -> str:
    """The extension an int8 GEMM would use, for messages: 'avx512_vnni', 'avx2', ..., or 'no SIMD int8'."""
    return next((e for e in _INT8_EXT if e in ext), "no SIMD int8")


def cache_path() -> Path:
    """Where the decisions are kept (module docstring)."""
    from cptsim.fileio import cache_dir

    return cache_dir() / FILE


def cache_key(cpu: str, ext: list[str], threads: int) -> str:
    return f"{cpu} | {' '.join(ext) or '-'} | {int(threads)} thread(s) | torch {torch.__version__}"


def _seconds(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(threads: int) -> dict:
    """Time PROBE_SHAPE as ``torch._int_mm`` and as FP32 ``torch.mm`` at ``threads`` threads (module docstring):
    ``{"int_mm_s", "fp32_s", "calls"}``, or ``{"error": ...}`` when ``_int_mm`` fails here."""
    M, K, N = PROBE_SHAPE
    g = torch.Generator().manual_seed(0)  # not the global generator: a run's random stream stays as it was
    a = torch.randint(-128, 128, (M, K), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (K, N), generator=g, dtype=torch.int8)
    af, bf = a.float(), b.float()
    before = torch.get_num_threads()
    if threads != before:
        torch.set_num_threads(threads)
    try:
        try:
            torch._int_mm(a[:32], b)  # a small call first: torch picks and builds its kernel on the first one
        except Exception as e:  # noqa: BLE001 - any failure means the path cannot run here
            return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        fp32 = [_seconds(lambda: torch.mm(af, bf)) for _ in range(2)]  # the first one warms up: min() drops it
        ints = [_seconds(lambda: torch._int_mm(a, b))]
        if ints[0] >= SLOW_CUTOFF * min(fp32):
            # a second call confirms it: one call preempted by a busy neighbour can take a time slice (10+ ms) longer
            ints.append(_seconds(lambda: torch._int_mm(a, b)))
            if min(ints) >= SLOW_CUTOFF * min(fp32):
                return {"int_mm_s": min(ints), "fp32_s": min(fp32), "calls": len(ints)}
        for _ in range(ROUNDS):
            start = time.perf_counter()
            for _ in range(REPEATS):
                if time.perf_counter() - start > BUDGET_S:
                    break
                fp32.append(_seconds(lambda: torch.mm(af, bf)))
                ints.append(_seconds(lambda: torch._int_mm(a, b)))
            if min(fp32) >= 2 * MIN_SPEEDUP * min(ints):  # clear of the threshold: noise only slows calls down
                break
            time.sleep(PAUSE_S)
        return {"int_mm_s": min(ints), "fp32_s": min(fp32), "calls": len(ints)}
    finally:
        if threads != before:
            torch.set_num_threads(before)


def decide(int_mm_s: float, fp32_s: float) -> bool:
    """The rule: on when int8 is at least MIN_SPEEDUP times faster than FP32."""
    return int_mm_s * MIN_SPEEDUP <= fp32_s


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g} ms"


def _record(figures: dict, cpu: str, ext: list[str], threads: int) -> dict:
    where = f"on {cpu} {int8_extension(ext)}, {threads} thread{'s' if threads != 1 else ''}"
    base = {"cpu": cpu, "vector_extensions": " ".join(ext), "threads": threads, "torch": torch.__version__,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if "error" in figures:
        return {"on": False, "why": f"torch._int_mm failed {where}: {figures['error']}", **base}
    ti, tf = figures["int_mm_s"], figures["fp32_s"]
    ratio = f"{tf / ti:.2g}x faster" if ti <= tf else f"{ti / tf:.2g}x slower"
    M, K, N = PROBE_SHAPE
    # other processes busy on the cores make the figures noisy: say so where the decision is read (config.json)
    load, cores = _load(), os.cpu_count() or 1
    busy = f"; the machine was busy (load {load:.1f} on {cores} cores): delete {cache_path()} to measure again" \
        if load is not None and load >= cores else ""
    return {"on": decide(ti, tf),
            "why": f"measured: _int_mm {_ms(ti)} vs fp32 {_ms(tf)} ({ratio}) {where}{busy}",
            "rule": f"on when int8 torch._int_mm of {M}x{K} @ {K}x{N} is at least {MIN_SPEEDUP:g}x faster than the "
                    "FP32 matmul (the fastest of a few calls each)",
            "int_mm_ms": round(ti * 1e3, 4), "fp32_ms": round(tf * 1e3, 4), "shape": [M, K, N],
            "calls": figures["calls"], "load": load, "cores": cores, **base}


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # not on every platform
        return None


def _read(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    entries = doc.get("entries") if isinstance(doc, dict) and doc.get("format") == FORMAT else None
    return entries if isinstance(entries, dict) else {}


def _valid(entry) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get("on"), bool) and isinstance(entry.get("why"), str)


class _Lock:
    """An exclusive flock on ``path`` (where fcntl exists; elsewhere none: two first runs may both measure)."""

    def __init__(self, path: Path):
        self.path, self.fd = path, None

    def __enter__(self):
        try:
            import fcntl

            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except (ImportError, OSError):
            if self.fd is not None:
                os.close(self.fd)
            self.fd = None
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)  # closing releases the flock


def _kept(key: str, make) -> dict:
    """The cache file's entry under ``key``, else ``make()`` kept there (under the file's lock), with its source."""
    path = cache_path()
    entry = _read(path).get(key)
    if _valid(entry):
        return {**entry, "source": f"cached in {path}"}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass
    with _Lock(path.with_name(path.name + ".lock")):
        entry = _read(path).get(key)  # another process may have measured while this one waited
        if _valid(entry):
            return {**entry, "source": f"cached in {path}"}
        entry = make()
        out = {**entry, "source": f"measured now, kept in {path}"}
        try:
            from cptsim.fileio import atomic_write_bytes

            entries = _read(path)
            entries[key] = entry
            atomic_write_bytes(path, (json.dumps({"format": FORMAT, "entries": entries}, indent=1) + "\n").encode())
        except OSError as e:
            out["source"] = f"measured now, not kept ({path}: {e.strerror or e})"
    return out


def measured_choice(threads: int | None = None) -> dict:
    """This machine's decision at ``threads`` (default: torch's current count): ``{"on", "why", "source", ...}``
    from this process's memory, else the cache file, else measured now (and kept). ``source`` says which."""
    threads = int(threads or torch.get_num_threads())
    memo = (os.environ.get("CPTSIM_HOME"), os.environ.get("XDG_CACHE_HOME"), threads)  # what cache_path reads
    hit = _DECIDED.get(memo)
    if hit is not None:
        return hit
    cpu, ext = cpu_signature()
    out = _kept(cache_key(cpu, ext, threads), lambda: _record(measure(threads), cpu, ext, threads))
    _DECIDED[memo] = out
    return out


def forget() -> None:
    """Drop this process's remembered decisions (the cache file stays): the next call reads the file again."""
    _DECIDED.clear()
    _CUDA_DECIDED.clear()


# ------------------------------------------------------------------------------------------------------------------
# CUDA: whether the tensor-core routes (cptsim.numerics.gpu_gemm) are the default on this GPU
#
# The same question as above on a GPU: does the route beat the path it replaces? Timed once per GPU model, compute
# capability and torch version, and kept in the same file (the key starts with "cuda |"). Two probes, each the route's
# whole GEMM from the fake-quantized operands (their integers, the int8 codes and offsets, the int8 GEMM, the
# epilogue) against today's GEMM of the same values with TF32 on (the faster of today's two settings: the stricter
# comparison):
#
# * CUDA_MM_PROBE, a ResNet-50 1x1 convolution as a GEMM (128x256x56x56 -> 64 at batch 128: M 401408, K 256, N 64; a
#   quarter of its rows here): the routes are on when the int8 one is at least CUDA_MIN_SPEEDUP times faster.
# * CUDA_CONV_PROBE, a ResNet-50 3x3 convolution (64 channels, 56x56, batch 32): the implicit-GEMM int8 kernel vs the
#   TF32 convolution of the integers (``tf32-int-codes``, exact too, which k x k forwards take otherwise), and the
#   implicit-GEMM int8 wgrad kernel vs the TF32 wgrad of the same integers. Each kernel takes its GEMM of k x k
#   convolutions when it is faster.
#
# The probes themselves are the routes' code (cptsim.numerics.gpu_gemm.cuda_probes, handed in as ``make_probes``:
# this module imports neither gpu_gemm nor exact_gemm); ``timer`` and ``probes`` are parameters so the rule and the
# cache are tested without a GPU.

CUDA_MM_PROBE = (100352, 256, 64)
CUDA_CONV_PROBE = (32, 64, 56, 56, 64, 3)  # N, C, H, W, O, k
CUDA_MIN_SPEEDUP = 1.2
CUDA_REPEATS = 20


def cuda_key(name: str, capability, torch_version: str | None = None) -> str:
    return f"cuda | {name} | sm{capability[0]}{capability[1]} | torch {torch_version or torch.__version__}"


def cuda_seconds(fn, repeats: int = CUDA_REPEATS) -> float:
    """The fastest of ``repeats`` timed calls of ``fn`` on the current CUDA stream, after a warm-up call."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def measure_cuda(device, probes: dict, timer=None) -> dict:
    """Seconds per probe (``cuda_probes``' labels: int8_mm, tf32_mm, implicit_conv, tf32_conv, implicit_wgrad,
    tf32_wgrad); a probe that fails is left out
    with its error under ``"errors"``."""
    timer = cuda_seconds if timer is None else timer
    out: dict = {}
    for label, fn in probes.items():
        try:
            out[label] = timer(fn)
        except Exception as e:  # noqa: BLE001 - a route that cannot run here is a route not taken
            out.setdefault("errors", {})[label] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return out


def cuda_record(figures: dict, name: str, capability) -> dict:
    """The decision from ``measure_cuda``'s figures: on when int8_mm * CUDA_MIN_SPEEDUP <= tf32_mm; the implicit
    conv kernel when it beat the TF32 convolution."""
    base = {"gpu": name, "capability": f"sm{capability[0]}{capability[1]}", "torch": torch.__version__,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **{f"{k}_ms": round(v * 1e3, 4) for k, v in figures.items() if k != "errors"}}
    if figures.get("errors"):
        base["errors"] = figures["errors"]
    ti, tf = figures.get("int8_mm"), figures.get("tf32_mm")
    if ti is None or tf is None:
        return {"on": False, "implicit_conv": False, "implicit_wgrad": False,
                "why": f"the int8 GEMM probe failed on {name}: {(figures.get('errors') or {}).get('int8_mm', '?')}",
                **base}
    on = ti * CUDA_MIN_SPEEDUP <= tf
    beats, conv = {}, ""
    for gemm, what in (("conv", "conv"), ("wgrad", "wgrad")):
        tc, tt = figures.get(f"implicit_{gemm}"), figures.get(f"tf32_{gemm}")
        beats[gemm] = tc is not None and tt is not None and tc < tt
        if tc is not None and tt is not None:
            conv += f"; implicit-GEMM {what} {_ms(tc)} vs TF32 {what} {_ms(tt)}"
    M, K, N = CUDA_MM_PROBE
    return {"on": on, "implicit_conv": beats["conv"], "implicit_wgrad": beats["wgrad"],
            "why": f"measured: int8 route {_ms(ti)} vs TF32 GEMM {_ms(tf)} ({M}x{K} @ {K}x{N}){conv} on {name}",
            "rule": f"on when the int8 route (from the fake-quantized operands) is at least {CUDA_MIN_SPEEDUP:g}x "
                    "faster than the TF32 GEMM of the same values; a k x k convolution's forward / wgrad on its "
                    "implicit-GEMM kernel when that beats the TF32 convolution of the integers",
            **base}


_CUDA_DECIDED: dict = {}


def cuda_choice(device, make_probes=None, timer=None, gpu: tuple | None = None, probes: dict | None = None) -> dict:
    """This GPU's decision (``cuda_record``): from this process's memory, else the cache file, else measured now
    (``make_probes(device)``'s calls, or ``probes``) and kept. Off without measuring where CUDA is not available, and
    while a CUDA graph is being captured (nothing may be timed or read back then; the eager warm-up steps before a
    capture decide). ``gpu``: (name, capability) given instead of read from the device (tests)."""
    if gpu is None:
        if not torch.cuda.is_available():
            return {"on": False, "implicit_conv": False, "implicit_wgrad": False, "why": "CUDA is not available"}
        dev = torch.device(device)
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        gpu = (torch.cuda.get_device_name(idx), torch.cuda.get_device_capability(idx))
        device = torch.device("cuda", idx)
    name, cap = gpu
    key = cuda_key(name, cap)
    memo = (os.environ.get("CPTSIM_HOME"), os.environ.get("XDG_CACHE_HOME"), key)
    hit = _CUDA_DECIDED.get(memo)
    if hit is not None:
        return hit
    if torch.device(device).type == "cuda" and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return {"on": False, "implicit_conv": False, "implicit_wgrad": False,
                "why": "not measured yet (a CUDA graph capture)"}
    if probes is None and make_probes is None:
        return {"on": False, "implicit_conv": False, "implicit_wgrad": False, "why": "nothing to measure"}
    out = _kept(key, lambda: cuda_record(measure_cuda(device, probes if probes is not None else make_probes(device),
                                                      timer), name, cap))
    _CUDA_DECIDED[memo] = out
    return out



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


def measured_choice(threads: int | None = None) -> dict:
    """This machine's decision at ``threads`` (default: torch's current count): ``{"on", "why", "source", ...}``
    from this process's memory, else the cache file, else measured now (and kept). ``source`` says which."""
    threads = int(threads or torch.get_num_threads())
    memo = (os.environ.get("CPTSIM_HOME"), os.environ.get("XDG_CACHE_HOME"), threads)  # what cache_path reads
    hit = _DECIDED.get(memo)
    if hit is not None:
        return hit
    path = cache_path()
    cpu, ext = cpu_signature()
    key = cache_key(cpu, ext, threads)
    entry = _read(path).get(key)
    if _valid(entry):
        out = {**entry, "source": f"cached in {path}"}
    else:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass
        with _Lock(path.with_name(path.name + ".lock")):
            entry = _read(path).get(key)  # another process may have measured while this one waited
            if _valid(entry):
                out = {**entry, "source": f"cached in {path}"}
            else:
                entry = _record(measure(threads), cpu, ext, threads)
                out = {**entry, "source": f"measured now, kept in {path}"}
                try:
                    from cptsim.fileio import atomic_write_bytes

                    entries = _read(path)
                    entries[key] = entry
                    atomic_write_bytes(path, (json.dumps({"format": FORMAT, "entries": entries}, indent=1)
                                              + "\n").encode())
                except OSError as e:
                    out["source"] = f"measured now, not kept ({path}: {e.strerror or e})"
    _DECIDED[memo] = out
    return out


def forget() -> None:
    """Drop this process's remembered decisions (the cache file stays): the next call reads the file again."""
    _DECIDED.clear()

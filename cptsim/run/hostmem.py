"""How a CPU training process keeps the memory its steps free: in the process, not returned to the OS each step.

glibc gives a freed block back to the OS when it was mapped on its own (a block above the mmap threshold) or when
the free top of the heap outgrows the trim threshold; the next step's allocation of that size then faults its pages
back in, and the kernel zeroes each one. glibc's thresholds adapt, and in a loop of nothing but identical steps
they settle: the host model's reference workloads, timed that way (cptsim.calibration.autocal), fault no page a
step. `cptsim train` runs other work between its steps (the data loader's batch, the trace, the counts) and did
not settle: its default transformer-lm run faulted 13,800-18,400 pages a step (55-75 MB, every step, all in the
forward and backward) -- 4-10% of its step time, which the host model, fitted to steps that do not fault, leaves
out, and which buys nothing. Training on a CPU therefore fixes both thresholds (``retain_freed_memory``): blocks up
to glibc's largest mmap threshold (32 MiB on 64-bit) come from the heap and stay there for the next step, and
the heap's free top is kept up to TRIM_THRESHOLD. Measured side by side (transformer-lm, 30 steps, two runs
each): 18,401 / 13,281 faults a step -> 0, median step 274 / 250 -> 212 / 229 ms, the same step timed in a loop in
the same process 190-198 ms; peak RSS 950-960 -> 949 MB (digits-cnn and gcn fault none either way). The process
keeps the memory its largest step used -- which every step uses again anyway. Elsewhere (another C library,
macOS, Windows) nothing is changed and None is returned.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h> parameter numbers
MMAP_THRESHOLD = 32 << 20  # glibc's largest on 64-bit (heap_max_size / 2): larger blocks are still mapped per call
TRIM_THRESHOLD = 1 << 30


_set: str | None = None  # what this process set, for config.json (``retained``)


def retained() -> str | None:
    """What ``retain_freed_memory`` set in this process; None if it was not called or changed nothing."""
    return _set


def retain_freed_memory() -> str | None:
    """Fix glibc's mmap and trim thresholds for this process (module docstring); what was set, or None where this
    is not glibc on Linux (nothing changed)."""
    global _set
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        version = libc.gnu_get_libc_version  # glibc only (musl has a mallopt that does nothing)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    version.restype = ctypes.c_char_p
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return None
    _set = (f"glibc {version().decode()}: mmap threshold {MMAP_THRESHOLD >> 20} MiB, trim threshold "
            f"{TRIM_THRESHOLD >> 20} MiB")
    return _set

"""The CPU quantizers as compiled one-pass kernels (``cptsim/numerics/_qkernels.c``), with the eager ones as the fallback.

Why: on a CPU each in-place pass of the eager quantizers (``cptsim.numerics.quant.fake_quant``: multiply, add, round,
clamp, subtract, multiply; stochastic rounding nine passes and torch's Mersenne-Twister draws) reads and writes
the whole activation or error tensor. A quantized resnet20 step ran 1.37-1.39x an FP32 step that way;
one fused pass per quantizer is what brings it near the convolutions' own time.

How: the C file is compiled on first use with the system C compiler (``$CC``, else ``cc``), into
``kernels`` in cptsim's cache directory (``cptsim.fileio.cache_dir``: ``$CPTSIM_HOME/cache``, else
``$XDG_CACHE_HOME/cptsim``, else ``~/.cache/cptsim``), under a name that hashes the source, the compiler and the
CPU, and loaded with ctypes (which releases the GIL during the call). Compiling takes well under a second. The kernels are used for dense float32 CPU tensors only, and never while a
``TorchDispatchMode`` (``cptsim.measure.opcount``, ``FlopCounterMode``) or ``torch.compile`` is tracing, nor for an input
that needs autograd to see the op: those take the eager functions, as does everything when ``CPTSIM_CKERNELS=0``
or when no compiler is found or the build fails (``status()`` says why; nothing is printed).

What they compute (tests/test_ckernels.py checks both against the eager functions and Random123's answers):

* round-to-nearest: the eager formula operation for operation in float32, so the result is bit-identical;
* stochastic rounding: the eager formula, with the uniform bytes from Philox4x32-10 keyed by 64 bits drawn from
  torch's CPU generator per call (per backward pass inside autograd, one Philox stream per call: see
  ``fake_quant_sr``) -- deterministic under ``torch.manual_seed``, resumable from torch's RNG state, independent of
  the thread count; the same distribution as the eager path, not the same draws.

In CPU training ``cptsim.numerics.layers`` runs each quantized layer as one autograd node on these kernels: the input's range
and running range in the same call as its quantization (``fake_quant_rtn_tracked``), the short-lived outputs in
reused buffers (``scratch``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("_qkernels.c")
# no -ffast-math: it would change results; -ffp-contract=off keeps a*b+c two roundings, as torch's eager ops are
FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
         "-shared", "-fPIC"]

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_why_not: str | None = None  # why the kernels are not in use (None: loaded, or not tried yet)
_tried = False


def enabled() -> bool:
    return os.environ.get("CPTSIM_CKERNELS", "1") != "0"


def _cache_dir() -> Path:
    from cptsim.fileio import cache_dir

    return cache_dir() / "kernels"


def _cpu_id() -> str:
    try:  # -march=native: a build is only good for CPUs with the same features
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), platform.processor())
    except OSError:
        return platform.processor() or platform.machine()


def _compiler() -> str | None:
    cc = os.environ.get("CC") or "cc"
    return shutil.which(cc)


def _build() -> ctypes.CDLL:
    cc = _compiler()
    if cc is None:
        raise OSError(f"no C compiler ({os.environ.get('CC') or 'cc'} not found)")
    src = SOURCE.read_bytes()
    tag = hashlib.sha256(src + " ".join([cc, *FLAGS, _cpu_id(), platform.machine()]).encode()).hexdigest()[:16]
    out = _cache_dir() / f"qkernels-{tag}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        # compile to a private name and rename: processes building at once never load a half-written library
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        try:
            r = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", tmp, "-lm"], capture_output=True, text=True,
                               timeout=120)
            if r.returncode != 0:
                raise OSError(f"{Path(cc).name} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    lib = ctypes.CDLL(str(out))
    f, i64, u32, i32, p = ctypes.c_float, ctypes.c_int64, ctypes.c_uint32, ctypes.c_int, ctypes.c_void_p
    lib.cpt_fq_rtn.argtypes = [p, p, i64, f, f, f, i32]
    lib.cpt_fq_rtn_rows.argtypes = [p, p, i64, i64, f, i32]
    lib.cpt_fq_sr_auto.argtypes = [p, p, i64, f, u32, u32, u32, i32]
    lib.cpt_fq_rtn_tracked.argtypes = [p, p, i64, f, p, p, p, f, f, p, i32]
    lib.cpt_minmax.argtypes = [p, i64, p, i32]
    lib.cpt_uniform_bytes.argtypes = [p, i64, u32, u32, u32]
    lib.cpt_philox4x32_10.argtypes = [p, p, p]
    lib.cpt_codes.argtypes = [p, p, i64, i64, p, p, i32, i32]
    lib.cpt_int_epilogue.argtypes = [p, p, i64, i64, p, p, p, p, p, i32]
    lib.cpt_fq_rows_codes.argtypes = [p, p, p, p, p, p, i64, i64, f, i32]
    lib.cpt_transpose_i8.argtypes = [p, p, i64, i64, i32]
    lib.cpt_fq_sr_codes.argtypes = [p, p, p, i64, f, f, f, u32, u32, u32, i32]
    for fn in (lib.cpt_fq_rtn, lib.cpt_fq_rtn_rows, lib.cpt_fq_sr_auto, lib.cpt_fq_rtn_tracked,
               lib.cpt_minmax, lib.cpt_uniform_bytes, lib.cpt_philox4x32_10, lib.cpt_codes, lib.cpt_int_epilogue,
               lib.cpt_fq_rows_codes, lib.cpt_transpose_i8, lib.cpt_fq_sr_codes):
        fn.restype = None
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded kernels, building them on first use; None when disabled or unavailable (see ``status``)."""
    global _lib, _why_not, _tried
    if not enabled():
        return None
    if _tried:
        return _lib
    with _lock:
        if not _tried:
            try:
                _lib = _build()
            except Exception as e:  # no compiler, a failed build, an unloadable library: the eager path it is
                _why_not = f"{type(e).__name__}: {e}"
            _tried = True
    return _lib


def status() -> dict:
    """Whether the CPU quantizers run compiled, and if not, why."""
    if not enabled():
        return {"in_use": False, "why_not": "CPTSIM_CKERNELS=0"}
    lib = library()
    return {"in_use": lib is not None, "why_not": _why_not}


def _dense(t: torch.Tensor) -> bool:
    return t.is_contiguous() or (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last))


def usable(x: torch.Tensor) -> bool:
    """The kernels can stand in for the eager quantizer on this tensor, here and now.

    Called for every quantizer call, so the cheap tests come first and no Python-level mode stack is walked."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or type(x) not in _PLAIN or x.numel() == 0:
        return False  # (a tensor subclass -- FakeTensor, a wrapper -- has no storage the kernels may write)
    if torch.is_grad_enabled() and x.requires_grad:
        return False  # autograd must see the op (callers inside an autograd.Function or a hook never get here)
    if torch._C._len_torch_dispatch_stack() or torch.compiler.is_compiling():
        return False  # a dispatch mode (cptsim.measure.opcount, FlopCounterMode) must see every aten op; dynamo must trace
    if not enabled():
        return False
    return _lib is not None if _tried else library() is not None


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _range(lo: torch.Tensor, hi: torch.Tensor) -> tuple[float, float]:
    return float(lo), float(hi)  # 0-d CPU tensors: no synchronisation, and cheaper than a stack and tolist


_graph_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)  # -1 outside backward (and if torch lacks it)
_scratch = threading.local()


def scratch(slot: str, like: torch.Tensor) -> torch.Tensor:
    """An uninitialised float32 tensor with ``like``'s shape and (dense) strides, for a kernel output that dies
    inside its caller: the quantized layer's Qa(x) in forward, Qa(x) and the quantized error in backward.

    One buffer per slot name and thread, kept while the size stays the same and dropped at the end of each backward
    pass. Why: a fresh activation-sized tensor per quantizer call (three per layer per step) churns glibc's heap --
    ~10k page faults per resnet20 step at batch 128, which an FP32 step does not have -- and reusing the buffer
    across the layers of one size makes the step ~3% faster side by side (benchmarks/bench_quant_step.py, issue
    13). Exact sizes and the release after backward keep the peak memory where it was (measured the same, +2.4%
    over FP32 with a fixed mmap threshold): at the forward peak only the last quantized layer's input-sized
    buffer is held. The caller must not let the tensor escape (layers._QuantLayerCPU passes it to the op and drops
    it)."""
    st = _scratch.__dict__
    bufs = st.setdefault("bufs", {})
    task = _graph_task_id()
    if task >= 0 and st.get("release_task") != task:  # in backward: drop the buffers when this pass ends
        st["release_task"] = task
        torch.autograd.Variable._execution_engine.queue_callback(bufs.clear)
    n = like.numel()
    buf = bufs.get(slot)
    if buf is None or buf.numel() != n:
        bufs[slot] = None  # the old buffer goes before the new one is allocated
        buf = bufs[slot] = torch.empty(n)
    return buf.as_strided(like.shape, like.stride())


def _dense_in_out(x: torch.Tensor, slot: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """x made dense, and the output with its strides (the kernels walk both in storage order): a fresh tensor, or
    the thread's reusable buffer for ``slot`` (``scratch``)."""
    x = x if _dense(x) else x.contiguous()
    return x, torch.empty_like(x) if slot is None else scratch(slot, x)


def fake_quant_rtn(x: torch.Tensor, lo: torch.Tensor | float, hi: torch.Tensor | float, qmax: int,
                   slot: str | None = None) -> torch.Tensor:
    """``quant.fake_quant_per_tensor`` in one pass: out = (clamp(round(x / s + zp), 0, qmax) - zp) * s."""
    x, out = _dense_in_out(x, slot)
    lo_f, hi_f = (lo, hi) if isinstance(lo, float) else _range(lo, hi)
    _lib.cpt_fq_rtn(x.data_ptr(), out.data_ptr(), x.numel(), lo_f, hi_f, float(qmax), torch.get_num_threads())
    return out


def fake_quant_rtn_tracked(x: torch.Tensor, act_lo: torch.Tensor, act_hi: torch.Tensor, act_count: torch.Tensor,
                           qmax: int, momentum: float, slot: str | None = None
                           ) -> tuple[torch.Tensor, float, float]:
    """An activation in training in one call: ``torch.aminmax(x)``, the running-range update of
    ``layers._QuantMixin._input_range`` on the layer's own buffers (float32 ``act_lo``/``act_hi``, int64
    ``act_count``, 0-d CPU tensors, written in place), and ``fake_quant_rtn`` with the batch range, which it returns
    as floats (the layer keeps them to re-quantize in backward). One C call where the torch ops took ten."""
    x, out = _dense_in_out(x, slot)
    batch = (ctypes.c_float * 2)()
    _lib.cpt_fq_rtn_tracked(x.data_ptr(), out.data_ptr(), x.numel(), float(qmax), act_lo.data_ptr(),
                            act_hi.data_ptr(), act_count.data_ptr(), momentum, 1 - momentum, ctypes.addressof(batch),
                            torch.get_num_threads())
    return out, batch[0], batch[1]


def minmax(x: torch.Tensor) -> tuple[float, float]:
    """The kernels' ``torch.aminmax`` of a whole dense tensor (for the tests)."""
    x = x if _dense(x) else x.contiguous()
    lohi = (ctypes.c_float * 2)()
    _lib.cpt_minmax(x.data_ptr(), x.numel(), ctypes.addressof(lohi), torch.get_num_threads())
    return lohi[0], lohi[1]


def fake_quant_rtn_channels(w: torch.Tensor, qmax: int) -> torch.Tensor:
    """``quant.fake_quant_per_channel`` (axis 0) in one call: each output channel's min/max range, then the pass."""
    w = w.detach().contiguous()
    out = torch.empty_like(w)
    rows = w.shape[0]
    _lib.cpt_fq_rtn_rows(w.data_ptr(), out.data_ptr(), rows, w.numel() // rows, float(qmax), torch.get_num_threads())
    return out


def fake_quant_sr(x: torch.Tensor, qmax: int, generator: torch.Generator | None = None,
                  slot: str | None = None) -> torch.Tensor:
    """``quant.fake_quant_stochastic`` in one call: the tensor's min/max, then one pass with Philox4x32-10 bytes.

    The Philox key: 64 bits from torch's generator per call, except inside a backward pass (with the default
    generator), where the first call draws the key and each later call of the same pass takes the next stream
    (the counter's third word) under it: distinct counters, so independent bytes, for one draw per step instead of
    one per layer (the draw is three small torch ops, ~60 us each time in a quantized step). Which call gets which
    stream follows autograd's order, which is deterministic, so runs stay seeded and resumable."""
    (k0, k1), stream = _key_and_stream(generator)
    x, out = _dense_in_out(x, slot)  # last: no small tensor is born above the output on the heap
    _lib.cpt_fq_sr_auto(x.data_ptr(), out.data_ptr(), x.numel(), float(qmax), k0, k1, stream, torch.get_num_threads())
    return out


def fake_quant_sr_codes(x: torch.Tensor, lo: float, hi: float, qmax: int, slot: str | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """``fake_quant_sr(x, qmax, slot=slot)`` given x's own range (``minmax(x)``: the range fake_quant_sr would
    compute) -- the same key and stream, so bit for bit its output -- and the int8 codes k - 128 of the same levels,
    in x's (dense) storage order: the exact path's quantized error and its wgrad operand in one pass."""
    (k0, k1), stream = _key_and_stream(None)
    x, out = _dense_in_out(x, slot)
    codes = torch.empty(x.shape, dtype=torch.int8).as_strided(x.shape, x.stride())
    _lib.cpt_fq_sr_codes(x.data_ptr(), out.data_ptr(), codes.data_ptr(), x.numel(), lo, hi, float(qmax), k0, k1,
                         stream, torch.get_num_threads())
    return out, codes


def codes(q: torch.Tensor, inv: torch.Tensor, zpa: torch.Tensor) -> torch.Tensor:
    """int8 ``k - 128`` of a fake-quantized 2-D ``q`` (cptsim.numerics.exact_gemm.codes in one pass): ``inv`` and
    ``zpa`` (= zp + 0.5) float32, one element or one per row."""
    q = q if q.is_contiguous() else q.contiguous()
    out = torch.empty(q.shape, dtype=torch.int8)
    inv, zpa = inv.float().contiguous(), zpa.float().contiguous()
    _lib.cpt_codes(q.data_ptr(), out.data_ptr(), q.shape[0], q.shape[1], inv.data_ptr(), zpa.data_ptr(),
                   int(inv.numel() > 1), torch.get_num_threads())
    return out


def fake_quant_rtn_channels_codes(w: torch.Tensor, qmax: int):
    """``fake_quant_rtn_channels(w, qmax)`` (bit for bit) and, from the same rounded levels k, the int8 codes k - 128
    transposed to (in, out) row-major, the codes' sum per output channel (int32), and each channel's scale and zero
    point (float32, as quant.choose_qparams): one pass over the weight and a tiled transpose of the codes."""
    w = w.detach().contiguous()
    rows = w.shape[0]
    cols = w.numel() // rows
    out = torch.empty_like(w)
    codes = torch.empty((rows, cols), dtype=torch.int8)
    sums = torch.empty(rows, dtype=torch.int32)
    scale, zp = torch.empty(rows), torch.empty(rows)
    threads = torch.get_num_threads()
    _lib.cpt_fq_rows_codes(w.data_ptr(), out.data_ptr(), codes.data_ptr(), sums.data_ptr(), scale.data_ptr(),
                           zp.data_ptr(), rows, cols, float(qmax), threads)
    codes_t = torch.empty((cols, rows), dtype=torch.int8)
    _lib.cpt_transpose_i8(codes.data_ptr(), codes_t.data_ptr(), rows, cols, threads)
    return out, codes_t, sums, scale, zp


def int_epilogue(p: torch.Tensor, r: torch.Tensor, o: torch.Tensor, u: torch.Tensor, s: torch.Tensor,
                 b: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    """out = float(p + r o^T + u) * s (+ b): p (M, N) int32 dense, r (M,), o, u (N,) int32, s, b (N,) float32."""
    _lib.cpt_int_epilogue(p.data_ptr(), out.data_ptr(), p.shape[0], p.shape[1], r.data_ptr(), o.data_ptr(),
                          u.data_ptr(), s.data_ptr(), None if b is None else b.data_ptr(), torch.get_num_threads())
    return out


_per_pass = threading.local()  # the backward pass (autograd graph task) whose key is cached, its key, its last stream


def _key_and_stream(generator: torch.Generator | None) -> tuple[tuple[int, int], int]:
    task = _graph_task_id() if generator is None else -1
    if task < 0:  # not in a backward pass, or an explicit generator: a key of its own
        return draw_key(generator), 0
    st = _per_pass.__dict__
    if st.get("task") != task:
        st["task"], st["key"], st["stream"] = task, draw_key(), 0
    else:
        st["stream"] += 1
    return st["key"], st["stream"]


def draw_key(generator: torch.Generator | None = None) -> tuple[int, int]:
    """64 bits from torch's CPU generator: the Philox key of one call."""
    w = torch.empty(2, dtype=torch.int64).random_(generator=generator)  # two draws on [0, 2**63)
    a, b = (int(v) for v in w.tolist())
    return a & 0xFFFFFFFF, b & 0xFFFFFFFF


def uniform_bytes(n: int, key: tuple[int, int], stream: int = 0) -> torch.Tensor:
    """The n bytes ``fake_quant_sr`` adds under this key and stream (for the tests)."""
    out = torch.empty(n, dtype=torch.uint8)
    _lib.cpt_uniform_bytes(out.data_ptr(), n, key[0], key[1], stream)
    return out


def philox4x32_10(ctr: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, ...]:
    """One Philox4x32-10 block (for the known-answer test)."""
    c = (ctr_t := ctypes.c_uint32 * 4)(*ctr)
    k = (ctypes.c_uint32 * 2)(*key)
    o = ctr_t()
    _lib.cpt_philox4x32_10(ctypes.addressof(c), ctypes.addressof(k), ctypes.addressof(o))
    return tuple(o)

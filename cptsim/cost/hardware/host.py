"""The ``host`` kind: the machine cptsim runs on, with rates measured by ``cptsim hw calibrate``.

Tiers: the host measures its FP32 matmul rate and, where torch reaches them on this CPU, int8
``torch._int_mm`` (VNNI / AMX) and bf16 matmul rates. Which tier a GEMM runs on is what really runs, not what could:

* FP32 for every GEMM the exact path does not take -- fake-quantized training computes in FP32 whatever the bits;
* int8 only when the exact path is on (by default on a CPU where ``_int_mm`` measured at least 2x faster than
  FP32, cptsim.numerics.gemm_choice; ``CPTSIM_EXACT_GEMM=0/1`` forces it; cptsim.numerics.exact_gemm), and only for
  the GEMMs that path routes to ``_int_mm``: a quantized Linear layer's forward at bits <= 8 (K = in_features <=
  MAX_K) and its wgrad at bits and gradient bits <= 8 with MIN_WGRAD_TOKENS..MAX_K tokens per call. dgrad,
  convolutions, attention's activation-by-activation products, graph aggregations and full-precision layers stay
  FP32 (``host_gemm_tiers``; tests/test_host_tiers.py checks it against exact_gemm's own routing functions);
* bf16 is measured and shown (``cptsim hw show host``), but no training GEMM runs on it: no GEMM is priced there.

An int8 GEMM also costs the exact path's extra passes, streaming C loops priced as memory traffic at the measured
bandwidth (``exact_extra_bytes``): the int8 codes of the operands (read 4 B, write 1 B per element; forward: the
input and the weight; wgrad: the error) and the int32 epilogue over its output (read 4 B, write 4 B in place;
forward: the output; wgrad: the weight gradient). Its quantizer passes are those of the fake-quant path (the same
calls), priced as before.
"""

from __future__ import annotations

import copy

import numpy as np

from ..formulas import quant_elems
from .base import FULL_PRECISION_BITS, Field, HardwareProfile, register


def host_time_components(macs, mac_rate, bytes_moved, bandwidth, quant_elems, elem_rate, overhead_s):
    """Seconds of each host term, stacked on a new last axis: compute, memory, element-wise, overhead.

    ``macs / rate``, ``bytes / bw``, ``quant_elems / elem_rate`` and ``overhead_s`` for each layer-phase that
    executes. Fake-quantized training runs every GEMM in FP32 whatever the bits (DESIGN.md "Cost model", host), one
    eager PyTorch op after another, so the terms add up (no overlap). The rates are measured on this machine by
    ``cptsim hw calibrate``; `cptsim report --fit` fits a factor per term to measured runs.
    """
    macs = np.asarray(macs, dtype=np.float64)
    return np.stack((macs / mac_rate, np.asarray(bytes_moved, dtype=np.float64) / bandwidth,
                     np.asarray(quant_elems, dtype=np.float64) / elem_rate,
                     np.where(macs > 0, overhead_s, 0.0)), axis=-1)


@register
class HostProfile(HardwareProfile):
    """``host``: the machine cptsim runs on; fake-quantized training runs in FP32, so bits do not change the time.

    time   = macs / (matmul rate x compute_efficiency) + bytes / (bandwidth x memory_efficiency)
             + quant_elems / elementwise rate + layer_overhead for every layer-phase that executes
             (host_time_components, weighted by ``factors()``)
    The overhead term is what makes small layers and small batches cost more than their MACs say: a training step
    of a CIFAR ResNet at batch 32 on a CPU is dominated by per-op costs, not by arithmetic.
    energy = power_w x time            (power_w = 0 means unknown: energy is reported as 0)
    Rates are measured by ``cptsim hw calibrate`` (cptsim.calibration.calibrate); the shipped host.toml is a placeholder.
    GEMM tiers (module docstring): with the exact path on (this machine's default, or a run that recorded
    it: ``with_exact_gemm``) and an int8 rate measured, the Linear GEMMs exact_gemm routes to ``_int_mm`` are priced
    at ``int8_gmac_s`` plus the bytes of the path's extra passes; through ``shaped_gemm_cost``, which ``layer_cost``
    calls while ``shape_model`` is true (it needs the layers' types and shapes). ``time_components`` -- what
    ``report --fit`` fits -- stays the FP32 model.

    On a CUDA device (``device = "cuda"``) the same sum is the overlap model: ``cptsim train`` replays each step as a
    CUDA graph (cptsim.run.cudagraph), so the host's dispatch -- what adds to the GPU's time when ops launch one by one,
    and overlaps it otherwise -- is one launch per step and hidden; what remains is GPU time, whose terms follow one
    another on the device and add up. ``hw calibrate --device cuda`` measures every rate that way (conv forward +
    backward, fused quantizers and the tiny-layer step replayed as graphs), so ``layer_overhead`` is the GPU's
    fixed cost per layer-phase (small kernels), not the host's. Steps that ran without graphs are flagged by the
    report. Measured on an H200: held-out imagenet-resnet18 within 5% after a fit on resnet20
    (benchmarks/results/gpu_check_H200_run2.txt).
    """

    KIND = "host"
    PARAMS = (
        Field("matmul_gmac_s", "positive", "FP32 matmul rate in 1e9 MAC/s"),
        Field("bandwidth_gb_s", "positive", "memory bandwidth in GB/s (bytes read + written per second)"),
        Field("elementwise_gelem_s", "positive", "quantizer element-wise rate in 1e9 elements/s"),
        Field("layer_overhead_us", "nonneg", "fixed time per executed layer-phase in microseconds (op dispatch, "
              "autograd, and the per-layer work that does not scale with MACs)", 0.0),
        Field("power_w", "nonneg", "average power while training in W; 0 = unknown"),
        Field("calibrated", "bool", "true when the numbers were measured on this machine"),
        Field("device", "string", '"cpu" or "cuda"', "cpu"),
        Field("threads", "count", "threads the measurement used", 1),
        Field("cpu", "string", "processor model", "unknown"),
        Field("torch_version", "string", "torch version that measured", "unknown"),
        Field("measured_at", "string", "when it was measured (ISO 8601)", "never"),
        # optional, so that a host.toml measured without them still reads (FP32 only)
        Field("int8_gmac_s", "nonneg", "int8 torch._int_mm rate in 1e9 MAC/s (VNNI/AMX; what the exact path "
              "CPTSIM_EXACT_GEMM runs its int8 GEMMs on, by default on a CPU); 0 = not measured", 0.0),
        Field("bf16_gmac_s", "nonneg", "bf16 matmul rate in 1e9 MAC/s (measured for reference: no training GEMM "
              "runs in bf16); 0 = not measured", 0.0),
    )
    CALIBRATION = (
        Field("compute_efficiency", "positive", "achieved / measured matmul rate, fitted from runs", 1.0),
        Field("memory_efficiency", "positive", "achieved / measured bandwidth, fitted from runs", 1.0),
    )

    def _derive(self) -> None:
        p = self.params
        self._mac_rate = p["matmul_gmac_s"] * 1e9
        self._bandwidth = p["bandwidth_gb_s"] * 1e9
        self._elem_rate = p["elementwise_gelem_s"] * 1e9
        self._overhead_s = p["layer_overhead_us"] * 1e-6
        if p["power_w"] == 0 and not any("power" in n for n in self.notes):
            self.notes.append("power unknown (power_w = 0): energy is reported as 0 J")
        if not p["calibrated"]:
            self.notes.append("placeholder numbers, not measured here: run `cptsim hw calibrate`")
        self._int8_rate = float(p.get("int8_gmac_s") or 0.0) * 1e9
        # the exact path as a run on this machine would take it; decided when first asked (a profile with no int8
        # rate never asks); a report sets the run's own (with_exact_gemm)
        self._exact_gemm: bool | None = None

    @property
    def exact_gemm(self) -> bool:
        """Whether the exact int8 path is on for the runs this profile models: CPTSIM_EXACT_GEMM where set, else
        this machine's decision at the profile's thread count (cptsim.numerics.gemm_choice) -- the one a training
        run here reads, from the same cache file. A profile models this machine, so the decision is this machine's;
        when none is kept yet it is measured now (a fraction of a second, once) rather than guessed, so that a plan
        and the run that follows it price and run the same path."""
        if self._exact_gemm is None:
            from cptsim.numerics.exact_gemm import enabled  # (numerics lies below cost: no cycle)

            self._exact_gemm = enabled(threads=int(self.params.get("threads") or 1))
        return self._exact_gemm

    @exact_gemm.setter
    def exact_gemm(self, on: bool) -> None:
        self._exact_gemm = bool(on)

    # -- tiers -------------------------------------------------------------------------------------------------------

    def with_exact_gemm(self, on: bool) -> "HostProfile":
        """This profile with the exact int8 path on or off (a run's config.json ``host.gemm_paths`` says which
        ran); the default is what a run here would take (``exact_gemm``)."""
        other = copy.copy(self)
        other.notes = list(self.notes)
        other.exact_gemm = bool(on)
        return other

    @property
    def int8_active(self) -> bool:
        """Whether int8 GEMMs are priced: a CPU profile, an int8 rate measured, and the exact path on."""
        return self.params.get("device", "cpu") == "cpu" and self._int8_rate > 0 and self.exact_gemm

    @property
    def shape_model(self) -> bool:
        """True while int8 tiers are priced: the cost model then hands over the profile arrays
        (``shaped_gemm_cost``), which say which layers are Linear layers and how many tokens each call has."""
        return self.int8_active

    def tiers(self) -> list[dict]:
        """The tiers this host measured: name, widths, rate in MAC/s, and which GEMMs run there (now)."""
        p = self.params
        out = [{"name": "fp32", "bits": 32, "macs_per_s": self._mac_rate,
                "runs": "every GEMM of fake-quantized training" + (" not routed to int8" if self.int8_active else "")}]
        if p.get("int8_gmac_s"):
            out.append({"name": "int8", "bits": 8, "macs_per_s": self._int8_rate,
                        "runs": ("Linear forward (bits <= 8) and wgrad (bits, grad bits <= 8, enough tokens)"
                                 if self.int8_active else "nothing now: the exact path (on where this machine "
                                 "measured int8 to pay, or with CPTSIM_EXACT_GEMM=1) routes Linear forward / wgrad "
                                 "here")})
        if p.get("bf16_gmac_s"):
            out.append({"name": "bf16", "bits": 16, "macs_per_s": float(p["bf16_gmac_s"]) * 1e9,
                        "runs": "nothing (measured for reference)"})
        return out

    # -- a training step: what the cost model asks (price_step) ---------------------------------------------------

    def storage_bits(self, formats=None):
        """Fake quantization keeps every tensor in FP32, whatever its width or format: stored at 32 bits."""
        return lambda b: np.full(np.shape(b), FULL_PRECISION_BITS)

    def layer_cost(self, a, macs, b1, b2, bytes_moved, quant_elems, samples):
        """The GEMMs with their tiers (``shaped_gemm_cost``) while int8 ones are priced and the layers' shapes are
        on record, else every GEMM in FP32 (``gemm_cost``)."""
        if self.shape_model and a.gemm is not None:
            return self.shaped_gemm_cost(a, macs, b1, b2, bytes_moved, samples)
        return super().layer_cost(a, macs, b1, b2, bytes_moved, quant_elems, samples)

    def shaped_gemm_cost(self, a, macs, b1, b2, bytes_moved, samples):
        """(time s, energy J), (K, L, 3), of profile arrays ``a``'s GEMMs with their tiers (``host_gemm_tiers``):
        the FP32 terms of ``_cost`` with an int8 GEMM's compute at the int8 rate plus its extra passes' bytes."""
        q, g = _step_bits(a, b1)
        qe = quantizer_elems(a, q, g, samples)
        int8 = host_gemm_tiers(a, q, g, samples)
        comp = self.time_components(macs, np.asarray(bytes_moved) + exact_extra_bytes(a, int8, samples), qe)
        comp[..., 0] = np.where(int8, np.asarray(macs, dtype=np.float64) / self._int8_rate, comp[..., 0])
        t = comp @ self.factors()
        return t, self.params["power_w"] * t

    def _throughput(self, b1, b2):
        # a bare GEMM at (b1, b2): int8 where the exact path would run a Linear layer's forward there
        rate = np.where((np.maximum(b1, b2) <= 8) & self.int8_active, self._int8_rate, self._mac_rate)
        return np.broadcast_to(rate * self._ceff, np.shape(b1)).astype(np.float64)

    def time_components(self, macs, bytes_moved, quant_elems) -> np.ndarray:
        """Uncalibrated seconds per term (..., 4): compute, memory, element-wise, overhead."""
        return host_time_components(macs, self._mac_rate, bytes_moved, self._bandwidth, quant_elems,
                                    self._elem_rate, self._overhead_s)

    def aggregation_components(self, bytes_moved) -> np.ndarray:
        """Uncalibrated seconds per term (..., 4) of graph aggregation phases (``cost.formulas.aggregation_bytes``):
        a gather and a scatter-sum, so memory traffic at the bandwidth plus the per-layer-phase overhead; no GEMM
        term (one MAC per edge and feature, far below the matmul rate's work per byte), no GEMM operand bytes."""
        nbytes = np.asarray(bytes_moved, dtype=np.float64)
        zero = np.zeros_like(nbytes)
        return np.stack((zero, nbytes / self._bandwidth, zero, np.where(nbytes > 0, self._overhead_s, 0.0)),
                        axis=-1)

    def aggregation_cost(self, bytes_moved) -> tuple[np.ndarray, np.ndarray]:
        """(time s, energy J) of graph aggregation phases: ``aggregation_components`` weighted by ``factors()``
        (the cost model calls this for a profile's aggregation layers, as it does a GPU's)."""
        t = self.aggregation_components(bytes_moved) @ self.factors()
        return t, self.params["power_w"] * t

    def factors(self) -> np.ndarray:
        """What this profile's calibration multiplies each term by (compute and memory efficiencies)."""
        return np.array([1.0 / self._ceff, 1.0 / self._meff, 1.0, 1.0])

    def _cost(self, macs, b1, b2, bytes_moved, quant_elems):
        t = self.time_components(macs, bytes_moved, quant_elems) @ self.factors()
        return t, self.params["power_w"] * t

    def describe_bits(self, b1: int, b2: int) -> str:
        if self.int8_active and max(b1, b2) <= 8:
            return "int8 _int_mm (exact path: Linear fwd/wgrad; else fp32)"
        return "fp32 (fake-quant)"


def _step_bits(a, b1) -> tuple[np.ndarray, np.ndarray]:
    """(q, g) per step kind, (K,), back from the fwd / dgrad operand widths the cost model passes: a quantized
    layer's fwd b1 is q and its dgrad b1 is g (32 where no layer is quantized: nothing is routed then)."""
    b1 = np.asarray(b1)
    idx = np.flatnonzero(np.asarray(a.quantized, dtype=bool))
    if b1.ndim < 2 or idx.size == 0:
        lead = b1.shape[:-2] if b1.ndim >= 2 else ()
        return np.full(lead, 32), np.full(lead, 32)
    return b1[..., idx[0], 0], b1[..., idx[0], 1]


def quantizer_elems(a, q, g, samples) -> np.ndarray:
    """(K, L, 3) quantizer element-passes of profile arrays ``a`` per step kind (q, g, samples), each (K,) or a
    scalar: ``cptsim.cost.formulas.quant_elems``. fwd: input (I x n) + weight (W x calls) + a Matmul's second
    operand (B x n) where q < 32; the error (O x n) where g < 32, in dgrad, or in wgrad for a layer without dgrad."""
    return quant_elems(a.numel, a.macs, a.quantized, np.atleast_1d(np.asarray(q)), np.atleast_1d(np.asarray(g)),
                       np.atleast_1d(np.asarray(samples, dtype=np.float64)), a.calls, a.operand)


def exact_linear_layers(a) -> np.ndarray:
    """(L,) bool: the layers the exact path can route to int8 -- quantized Linear layers (a matmul with a weight:
    QLinear, an LM's transforms, a graph layer's dense transform), not attention's activation-by-activation
    products (a second operand) nor aggregations; with a GEMM shape on record."""
    L = len(a.names)
    mm = np.zeros(L, bool) if getattr(a, "matmul", None) is None else np.asarray(a.matmul, dtype=bool)
    opnd = np.zeros(L) if getattr(a, "operand", None) is None else np.asarray(a.operand, dtype=np.float64)
    agg = np.zeros(L, bool) if getattr(a, "aggregation", None) is None else np.asarray(a.aggregation, dtype=bool)
    gemm = getattr(a, "gemm", None)
    shaped = np.zeros(L, bool) if gemm is None else ~np.isnan(np.asarray(gemm, dtype=np.float64)[:, 2])
    return np.asarray(a.quantized, dtype=bool) & mm & (opnd == 0) & ~agg & shaped


def host_gemm_tiers(a, q, g, samples) -> np.ndarray:
    """(K, L, 3) bool: True where the exact path runs the GEMM as int8 ``_int_mm`` (exact path on), per step kind
    (q, g, samples) x layer x phase (fwd, dgrad, wgrad) -- cptsim.numerics.exact_gemm's routing, vectorized:
    forward_path (bits <= MAX_BITS, K = in_features <= MAX_K) and wgrad_path (bits and grad bits <= MAX_BITS,
    MIN_WGRAD_TOKENS <= tokens per call <= MAX_K); dgrad never."""
    from cptsim.numerics import exact_gemm as X

    q = np.atleast_1d(np.asarray(q))[:, None]
    g = np.atleast_1d(np.asarray(g))[:, None]
    n = np.atleast_1d(np.asarray(samples, dtype=np.float64))[:, None]
    lin = exact_linear_layers(a)[None]
    gemm = np.nan_to_num(np.asarray(a.gemm, dtype=np.float64)) if getattr(a, "gemm", None) is not None \
        else np.zeros((len(a.names), 5))
    k = gemm[:, 2][None]
    calls = np.maximum(np.asarray(a.calls, dtype=np.float64), 1.0)[None]
    tokens = gemm[:, 3][None] * n / calls                 # rows per sample, summed over calls -> rows per call
    has = np.asarray(a.macs)[None] > 0
    fwd = lin & (q <= X.MAX_BITS) & (k <= X.MAX_K) & has[..., 0]
    wgrad = (lin & (q <= X.MAX_BITS) & (g <= X.MAX_BITS) & (tokens >= X.MIN_WGRAD_TOKENS)
             & (tokens <= X.MAX_K) & has[..., 2])
    return np.stack((fwd, np.zeros_like(fwd), wgrad), axis=-1)


CODES_BYTES, EPILOGUE_BYTES = 5.0, 8.0  # per element: float32 in, int8 out; int32 in, float32 out in place


def exact_extra_bytes(a, int8: np.ndarray, samples) -> np.ndarray:
    """(K, L, 3) bytes the exact path's extra passes move for an int8 GEMM: fwd the codes of the input
    (I x samples) and of the weight (W x calls) and the epilogue over the output (O x samples); wgrad the codes of
    the error (O x samples) and the epilogue over the weight gradient (W x calls)."""
    numel = np.asarray(a.numel, dtype=np.float64)
    n = np.atleast_1d(np.asarray(samples, dtype=np.float64))[:, None]
    calls = np.asarray(a.calls, dtype=np.float64)[None]
    w, i, o = numel[:, 0][None] * calls, numel[:, 1][None] * n, numel[:, 2][None] * n
    fwd = CODES_BYTES * (i + w) + EPILOGUE_BYTES * o
    wgrad = CODES_BYTES * o + EPILOGUE_BYTES * w
    extra = np.stack((fwd, np.zeros_like(fwd), wgrad), axis=-1)
    return np.where(int8, extra, 0.0)

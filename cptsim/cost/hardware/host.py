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

An int8 GEMM also costs the exact path's row and column sums, int8 GEMMs against 8 columns of ones at their own
measured rate (``int8_sum_gmac_s``, about a third of a square GEMM's; ``exact_sum_macs``), the weight's pass of
an int8 forward as the one C call it is (``weight_codes_gelem_s``: range, Qw(W), codes, sums and transpose, ~1.7 ns
an element here where a quantizer pass and the codes' bytes price 0.75; ``exact_weight_elems``), and its extra passes,
streaming C loops priced as memory traffic at the measured bandwidth (``exact_extra_bytes``): the int8 codes of the
operands (read 4 B, write 1 B per element; forward: the input and the weight; wgrad: the error) and the int32
epilogue over its output (read 4 B, write 4 B in place; forward: the output; wgrad: the weight gradient). Its
quantizer passes are those of the fake-quant path (the same calls), priced as before.

The step beyond its layers (a profile with ``op_list = true``, as `cptsim hw calibrate` and a report's automatic
measurement write it on a CPU; cptsim.calibration.autocal). A CPU runs a training step one eager op after another,
so everything in it adds up, and most of it is not a layer's GEMM:

* the step's other ops -- norms, activations, dropout, softmax, masks, embedding lookups, residual adds, reshaping
  copies, the loss, the optimizer's update, a graph aggregation's gathers and scatters -- are priced from the
  run's op list (``cptsim.measure.opcount``, profile.json's ``ops``), op by op (``host_op_totals``,
  ``op_list_time_components``): ``op_overhead_us`` per launched op (dispatch, autograd) plus its work -- bytes at
  the measured bandwidth for plain memory ops; elements at the measured random-number rate for the ops that draw
  random numbers (dropout's ``bernoulli_``: ~6-10 ns an element on one core, 20x a copy's time, a seventh of a
  transformer-lm step); elements at the measured rate of a GELU, forward and backward, for the transcendental
  activations (GELU, SiLU, tanh, exp and kin: ~3x a copy's time);
* fixed costs by layer kind (``layer_kinds``, ``layer_fixed_s``): a quantized convolution's phase
  (``conv_overhead_us``), any other quantized layer's phase (``layer_overhead_us``: its Python, its quantizer
  calls, its custom autograd function, the exact path's small passes), a full-precision layer's phase one launch;
  a graph aggregation's phases carry none (their gathers and scatters are launches of the op list);
* each layer's FP32 GEMMs at its kind's rate (``layer_mac_rate``): a convolution at the matmul rate (measured on
  conv-as-GEMM shapes), a Linear layer at ``linear_gmac_s`` (a batch of tokens by widths of 128-512: 33-40 GMAC/s
  where the conv shapes reach 46-48 on this project's EPYC), attention's activation-by-activation matmuls at
  ``attention_gmac_s`` (small per-head GEMMs with their operands out of cache, as a step runs them: about half).

Why: before, one figure per layer-phase carried every fixed cost and every op beside the layers, fitted to a CNN
and an MLP. A transformer runs dozens of ops per layer, and dropout's draws, GELU and its attention cost more than
their bytes; a CNN runs a handful -- no one figure serves both: the first report put a transformer-lm run at -54%,
and once the MLP pulled the figure down digits-cnn at -22% (benchmarks/results/host-first-report.txt has the
three defaults before and after). A profile without ``op_list`` (an older file, the shipped placeholder) prices
as it always did.
"""

from __future__ import annotations

import copy

import numpy as np

from ..formulas import quant_elems
from .base import FULL_PRECISION_BITS, Field, HardwareProfile, register

# aten ops (overload packets) priced by their elements at the host's random-number rate: they draw one number an
# element (dropout draws through bernoulli_ on a CPU)
RNG_OPS = frozenset({"bernoulli", "bernoulli_", "native_dropout", "rand", "rand_like", "randn", "randn_like",
                     "normal", "normal_", "uniform", "uniform_", "exponential_", "geometric_", "cauchy_",
                     "log_normal_", "random_", "multinomial"})
# ... and at the rate of a transcendental activation: a polynomial or exp per element, several times a copy's time
TRANSCENDENTAL_OPS = frozenset({
    "gelu", "gelu_", "gelu_backward", "silu", "silu_", "silu_backward", "sigmoid", "sigmoid_", "sigmoid_backward",
    "tanh", "tanh_", "tanh_backward", "exp", "exp_", "expm1", "log", "log_", "log1p", "erf", "erf_", "elu", "elu_",
    "elu_backward", "softplus", "softplus_backward", "mish", "mish_", "mish_backward", "log_sigmoid_forward",
    "log_sigmoid_backward"})
# op-list kinds whose launches the host prices (a GEMM's and a fused attention kernel's launches belong to their layer)
_LAUNCH_KINDS = ("memory", "aggregation")
# the op list's phases -> the cost model's phase columns: forward ops to fwd, backward to dgrad, optimizer to wgrad
_PHASE_COLUMN = {"fwd": 0, "bwd": 1, "opt": 2}


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


def host_op_totals(ops) -> dict[str, np.ndarray]:
    """What the host prices of an op list (``cptsim.measure.opcount.OpProfile``), per phase column (fwd, dgrad,
    wgrad = the list's fwd, bwd, opt), each (3, 2) as [per sample, fixed] (launches (3,)):

    * ``launches``: kernel ops of kinds memory and aggregation (a layer's GEMMs and a fused attention kernel are
      their layers'; views launch nothing);
    * ``bytes``: read + written by the plain memory ops (not RNG_OPS / TRANSCENDENTAL_OPS; an aggregation's bytes
      are its layer's, ``cost.formulas.aggregation_bytes``);
    * ``rng_elems`` / ``transcendental_elems``: elements written by those ops (bytes written / element size), and
      ``rng_bytes`` / ``transcendental_bytes`` their bytes read + written (what prices them where a rate is 0).

    Kept on ``ops`` for as long as its records are the same objects (the cost model asks once per estimate)."""
    recs = ops.records
    cached = ops.__dict__.get("_host_totals")
    if cached is not None and len(cached[0]) == len(recs) and all(a is b for a, b in zip(cached[0], recs)):
        return cached[1]
    esize = max(int(getattr(ops, "element_bits", 32) or 32), 8) / 8.0
    out = {"launches": np.zeros(3), **{k: np.zeros((3, 2)) for k in (
        "bytes", "rng_elems", "rng_bytes", "transcendental_elems", "transcendental_bytes")}}
    for r in recs:
        col = _PHASE_COLUMN.get(r.phase)
        if col is None or r.kind not in _LAUNCH_KINDS:
            continue
        out["launches"][col] += r.launches
        if r.kind != "memory":
            continue
        base = r.op.split(".")[1] if r.op.startswith("aten.") else r.op
        group = "rng" if base in RNG_OPS else "transcendental" if base in TRANSCENDENTAL_OPS else None
        moved = (r.read_per_sample + r.write_per_sample, r.read_fixed + r.write_fixed)
        if group is None:
            out["bytes"][col] += moved
        else:
            out[f"{group}_elems"][col] += (r.write_per_sample / esize, r.write_fixed / esize)
            out[f"{group}_bytes"][col] += moved
    ops.__dict__["_host_totals"] = (tuple(recs), out)
    return out


def op_list_time_components(totals: dict, samples, bandwidth: float, rng_rate: float, transcendental_rate: float,
                            op_overhead_s: float) -> np.ndarray:
    """(K, 3, 4) seconds of the op list's terms per step kind of ``samples`` (K,) and phase column, on the host
    model's four terms: compute (0: GEMMs are the layers'), memory (plain ops' bytes / bandwidth), element-wise
    (random-number elements / their rate + transcendental elements / theirs; an op whose rate was not measured,
    0, is priced by its bytes as a plain op), overhead (launches x ``op_overhead_s``)."""
    n = np.atleast_1d(np.asarray(samples, dtype=np.float64))[:, None]          # (K, 1)

    def per_step(x):                                                           # (3, 2) -> (K, 3)
        return x[None, :, 0] * n + x[None, :, 1]

    nbytes = per_step(totals["bytes"])
    elementwise = np.zeros_like(nbytes)
    for group, rate in (("rng", rng_rate), ("transcendental", transcendental_rate)):
        if rate > 0:
            elementwise = elementwise + per_step(totals[f"{group}_elems"]) / rate
        else:
            nbytes = nbytes + per_step(totals[f"{group}_bytes"])
    overhead = np.broadcast_to(totals["launches"][None] * op_overhead_s, nbytes.shape)
    return np.stack((np.zeros_like(nbytes), nbytes / bandwidth, elementwise, overhead), axis=-1)


@register
class HostProfile(HardwareProfile):
    """``host``: the machine cptsim runs on; fake-quantized training runs in FP32, so bits do not change the time.

    time   = macs / (matmul rate x compute_efficiency) + bytes / (bandwidth x memory_efficiency)
             + quant_elems / elementwise rate + layer_overhead for every layer-phase that executes
             (host_time_components, weighted by ``factors()``)
             + the step's other ops, from the run's op list (``op_list_cost``, module docstring): op_overhead per
             launch + plain ops' bytes / bandwidth + random-number and transcendental elements at their rates
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
        Field("int8_sum_gmac_s", "nonneg", "rate of the exact path's row and column sums, int8 torch._int_mm "
              "against 8 columns of ones, in 1e9 MAC/s; 0 = not measured (not priced)", 0.0),
        Field("weight_codes_gelem_s", "nonneg", "element rate of the exact path's weight pass (one C call: the "
              "per-channel range, Qw(W), its int8 codes, their sums and the transpose) in 1e9 elements/s; 0 = not "
              "measured (priced as a quantizer pass and the codes' bytes)", 0.0),
        Field("bf16_gmac_s", "nonneg", "bf16 matmul rate in 1e9 MAC/s (measured for reference: no training GEMM "
              "runs in bf16); 0 = not measured", 0.0),
        # optional: the step's other ops (module docstring); a file without op_list = true prices the layers only
        Field("op_list", "bool", "whether a step's other ops are priced from the run's op list (norms, "
              "activations, dropout, the loss, the optimizer, a graph's gathers; cptsim.cost.hardware.host); "
              "false in a profile measured before they were", False),
        Field("op_overhead_us", "nonneg", "fixed time per launched op of the step's op list that is not a layer's "
              "GEMM, and per phase of a full-precision layer, in microseconds (dispatch, autograd)", 0.0),
        Field("conv_overhead_us", "nonneg", "fixed time per executed phase of a quantized convolution in "
              "microseconds, where the op list is priced; absent = layer_overhead_us", None),
        Field("rng_gelem_s", "nonneg", "random-number element rate (dropout's bernoulli_) in 1e9 elements/s; "
              "0 = not measured (priced by its bytes)", 0.0),
        Field("transcendental_gelem_s", "nonneg", "element rate of a transcendental activation (GELU, SiLU, tanh, "
              "exp ...) in 1e9 elements/s; 0 = not measured (priced by its bytes)", 0.0),
        Field("attention_gmac_s", "nonneg", "FP32 rate of attention's per-head matmuls (batched small GEMMs, "
              "operands out of cache) in 1e9 MAC/s, where the op list is priced; 0 = not measured (the matmul "
              "rate)", 0.0),
        Field("linear_gmac_s", "nonneg", "FP32 rate of Linear layers' GEMMs (a batch of tokens by widths of 128-512) "
              "in 1e9 MAC/s, where the op list is priced; 0 = not measured (the matmul rate, measured on "
              "conv-as-GEMM shapes)", 0.0),
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
        self._int8_sum_rate = float(p.get("int8_sum_gmac_s") or 0.0) * 1e9
        self._weight_codes_rate = float(p.get("weight_codes_gelem_s") or 0.0) * 1e9
        self._op_overhead_s = float(p.get("op_overhead_us") or 0.0) * 1e-6
        conv = p.get("conv_overhead_us")
        self._conv_overhead_s = self._overhead_s if conv is None else float(conv) * 1e-6
        self._rng_rate = float(p.get("rng_gelem_s") or 0.0) * 1e9
        self._transcendental_rate = float(p.get("transcendental_gelem_s") or 0.0) * 1e9
        self._attention_rate = float(p.get("attention_gmac_s") or 0.0) * 1e9
        self._linear_rate = float(p.get("linear_gmac_s") or 0.0) * 1e9
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
        on record, else every GEMM in FP32."""
        if self.shape_model and a.gemm is not None:
            return self.shaped_gemm_cost(a, macs, b1, b2, bytes_moved, samples)
        if not self.prices_op_list:
            return super().layer_cost(a, macs, b1, b2, bytes_moved, quant_elems, samples)
        t = self.time_components(macs, bytes_moved, quant_elems, layers=a) @ self.factors()
        return t, self.params["power_w"] * t

    def shaped_gemm_cost(self, a, macs, b1, b2, bytes_moved, samples):
        """(time s, energy J), (K, L, 3), of profile arrays ``a``'s GEMMs with their tiers (``host_gemm_tiers``):
        the FP32 terms of ``_cost`` with an int8 GEMM's compute at the int8 rate plus its extra passes' bytes."""
        q, g = _step_bits(a, b1)
        qe = quantizer_elems(a, q, g, samples)
        int8 = host_gemm_tiers(a, q, g, samples)
        coded = self._weight_codes_rate > 0  # the weight's pass of an int8 forward measured as the one call it is
        extra = exact_extra_bytes(a, int8, samples, weight=not coded)
        comp = self.time_components(macs, np.asarray(bytes_moved) + extra, qe, layers=a)
        gemm = np.asarray(macs, dtype=np.float64) / self._int8_rate
        if self._int8_sum_rate > 0:
            gemm = gemm + exact_sum_macs(a, int8, samples) / self._int8_sum_rate
        comp[..., 0] = np.where(int8, gemm, comp[..., 0])
        if coded:
            w = exact_weight_elems(a, int8)
            comp[..., 2] += w / self._weight_codes_rate - w / self._elem_rate
        t = comp @ self.factors()
        return t, self.params["power_w"] * t

    def _throughput(self, b1, b2):
        # a bare GEMM at (b1, b2): int8 where the exact path would run a Linear layer's forward there
        rate = np.where((np.maximum(b1, b2) <= 8) & self.int8_active, self._int8_rate, self._mac_rate)
        return np.broadcast_to(rate * self._ceff, np.shape(b1)).astype(np.float64)

    def time_components(self, macs, bytes_moved, quant_elems, layers=None) -> np.ndarray:
        """Uncalibrated seconds per term (..., 4): compute, memory, element-wise, overhead (``layer_fixed_s`` per
        executed layer-phase of profile arrays ``layers``, whose layer axis is the arrays' second to last).
        Where the op list is priced each layer's GEMMs compute at their kind's rate (``layer_mac_rate``)."""
        return host_time_components(macs, self.layer_mac_rate(layers), bytes_moved, self._bandwidth, quant_elems,
                                    self._elem_rate, self.layer_fixed_s(layers))

    def layer_mac_rate(self, layers=None):
        """FP32 MAC/s of each layer's GEMMs, (L, 1) where the op list is priced and profile arrays ``layers`` say
        which layers are which: a convolution at the matmul rate (measured on conv-as-GEMM shapes), attention's
        activation-by-activation matmuls at ``attention_gmac_s``, any other layer (Linear, an LSTM's gates) at
        ``linear_gmac_s``; a rate not measured (0) is the matmul rate."""
        if layers is None or not self.prices_op_list:
            return self._mac_rate
        kind = layer_kinds(layers)
        conv = _column(layers, "is_conv", bool)
        att = self._attention_rate or self._mac_rate
        lin = self._linear_rate or self._mac_rate
        return np.where(conv, self._mac_rate, np.where(kind == "attention", att, lin))[:, None]

    def layer_fixed_s(self, layers=None):
        """Seconds of fixed cost per executed layer-phase: ``layer_overhead_us``; where the op list is priced
        (``prices_op_list``) and profile arrays ``layers`` say which layers are which, (L, 1) by kind
        (``layer_kinds``) -- a quantized convolution's ``conv_overhead_us``, any other quantized layer's (Linear,
        attention's matmuls, a graph layer's transform) ``layer_overhead_us``, a full-precision layer's one launch
        (``op_overhead_us``: a plain GEMM call, no quantizer, no custom autograd function)."""
        if layers is None or not self.prices_op_list:
            return self._overhead_s
        kind = layer_kinds(layers)
        per = np.where(kind == "conv", self._conv_overhead_s, np.where(kind == "fp", self._op_overhead_s,
                                                                        self._overhead_s))
        return per[:, None]

    @property
    def prices_op_list(self) -> bool:
        """Whether this profile prices a step's op list (``op_list = true``): module docstring."""
        return bool(self.params.get("op_list"))

    def aggregation_components(self, bytes_moved) -> np.ndarray:
        """Uncalibrated seconds per term (..., 4) of graph aggregation phases (``cost.formulas.aggregation_bytes``):
        a gather and a scatter-sum, so memory traffic at the bandwidth; no GEMM term (one MAC per edge and
        feature, far below the matmul rate's work per byte), no GEMM operand bytes. Their fixed cost: the
        per-layer-phase overhead, or, where the op list is priced (``prices_op_list``), their gathers' and
        scatters' launches there."""
        nbytes = np.asarray(bytes_moved, dtype=np.float64)
        zero = np.zeros_like(nbytes)
        fixed = 0.0 if self.prices_op_list else self._overhead_s
        return np.stack((zero, nbytes / self._bandwidth, zero, np.where(nbytes > 0, fixed, 0.0)), axis=-1)

    def op_list_components(self, a, samples) -> np.ndarray | None:
        """Uncalibrated seconds per term (K, 3, 4) of the step's other ops (profile arrays ``a``'s op list) per step
        kind of ``samples`` and phase column; None where they are not priced (no op list, or a profile without
        ``op_list = true``)."""
        ops = getattr(a, "ops", None)
        if ops is None or not self.prices_op_list:
            return None
        return op_list_time_components(host_op_totals(ops), samples, self._bandwidth, self._rng_rate,
                                       self._transcendental_rate, self._op_overhead_s)

    def op_list_cost(self, a, q, g, samples):
        """(time s, energy J), each (K, 3), of the step's other ops (``op_list_components`` weighted by
        ``factors()``); None where they are not priced. The same whatever the bits: fake quantization runs them
        in FP32."""
        n = np.broadcast_to(np.asarray(samples, dtype=np.float64), np.atleast_1d(np.asarray(q)).shape)
        comp = self.op_list_components(a, n)
        if comp is None:
            return None
        t = comp @ self.factors()
        return t, self.params["power_w"] * t

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


def _column(a, name: str, dtype) -> np.ndarray:
    """(L,) per-layer column ``name`` of profile arrays ``a`` as ``dtype``; zeros (False) where ``a`` has none (a
    profile written before it was recorded)."""
    x = getattr(a, name, None)
    return np.zeros(len(a.quantized), dtype) if x is None else np.asarray(x, dtype=dtype)


def layer_kinds(a) -> np.ndarray:
    """(L,) the fixed-cost kind of each layer of profile arrays ``a``: "conv" (a quantized convolution),
    "attention" (a quantized matmul of two activations: a second operand, not a graph aggregation), "layer" (any
    other quantized layer: Linear, a graph layer's transform, an LSTM's gates), "fp" (a full-precision layer)."""
    quantized = np.asarray(a.quantized, dtype=bool)
    conv, agg = _column(a, "is_conv", bool), _column(a, "aggregation", bool)
    attention = (_column(a, "operand", np.float64) > 0) & ~agg & ~conv
    return np.where(~quantized, "fp", np.where(conv, "conv", np.where(attention, "attention", "layer")))


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
    gemm = getattr(a, "gemm", None)
    shaped = np.zeros(len(a.names), bool) if gemm is None else ~np.isnan(np.asarray(gemm, dtype=np.float64)[:, 2])
    plain = (_column(a, "operand", np.float64) == 0) & ~_column(a, "aggregation", bool)
    return np.asarray(a.quantized, dtype=bool) & _column(a, "matmul", bool) & plain & shaped


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


SUM_COLUMNS = 8  # the ones the exact path's sum GEMMs multiply by (cptsim.numerics.exact_gemm._ones)


def exact_sum_macs(a, int8: np.ndarray, samples) -> np.ndarray:
    """(K, L, 3) MACs of the exact path's row and column sums for an int8 GEMM (``exact_gemm.int_linear``: int8
    GEMMs against SUM_COLUMNS columns of ones): fwd the input codes' row sums (I x samples x 8; the weight's column
    sums come with its codes); wgrad the error codes' row sums (O x samples x 8) and the input codes' column sums
    (I x samples x 8)."""
    numel = np.asarray(a.numel, dtype=np.float64)
    n = np.atleast_1d(np.asarray(samples, dtype=np.float64))[:, None]
    i, o = numel[:, 1][None] * n, numel[:, 2][None] * n
    sums = np.stack((SUM_COLUMNS * i, np.zeros_like(i), SUM_COLUMNS * (i + o)), axis=-1)
    return np.where(int8, sums, 0.0)


CODES_BYTES, EPILOGUE_BYTES = 5.0, 8.0  # per element: float32 in, int8 out; int32 in, float32 out in place


def exact_weight_elems(a, int8: np.ndarray) -> np.ndarray:
    """(K, L, 3) weight elements (W x calls, as ``quantizer_elems`` counts the weight's pass) of each int8 forward:
    what the exact path's weight pass (``exact_gemm.weight_codes``) runs over."""
    w = np.asarray(a.numel, dtype=np.float64)[:, 0] * np.asarray(a.calls, dtype=np.float64)
    out = np.zeros(int8.shape)
    out[..., 0] = np.where(int8[..., 0], w[None], 0.0)
    return out


def exact_extra_bytes(a, int8: np.ndarray, samples, weight: bool = True) -> np.ndarray:
    """(K, L, 3) bytes the exact path's extra passes move for an int8 GEMM: fwd the codes of the input
    (I x samples) and of the weight (W x calls; not with ``weight`` False, where the weight's pass is priced at its
    own measured rate) and the epilogue over the output (O x samples); wgrad the codes of the error (O x samples)
    and the epilogue over the weight gradient (W x calls)."""
    numel = np.asarray(a.numel, dtype=np.float64)
    n = np.atleast_1d(np.asarray(samples, dtype=np.float64))[:, None]
    calls = np.asarray(a.calls, dtype=np.float64)[None]
    w, i, o = numel[:, 0][None] * calls, numel[:, 1][None] * n, numel[:, 2][None] * n
    fwd = CODES_BYTES * (i + (w if weight else 0.0)) + EPILOGUE_BYTES * o
    wgrad = CODES_BYTES * o + EPILOGUE_BYTES * w
    extra = np.stack((fwd, np.zeros_like(fwd), wgrad), axis=-1)
    return np.where(int8, extra, 0.0)

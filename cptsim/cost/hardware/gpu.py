"""The ``gpu`` kind: precision tiers with published dense peak rates, and the time of a whole training step.

A training step on a GPU is not only its GEMMs. The time model (``GPUProfile.step_ops_cost`` with the GEMMs of ``gemm_cost``, used by ``cptsim.cost`` when
the layer profile carries the step's op list, ``cptsim.measure.opcount``) is the sum of

* the GEMMs, per layer and phase: a roofline of their MACs at the tier's peak x the tier's ``efficiency`` against
  their own DRAM bytes at bandwidth x ``memory_efficiency``; FP32 convolutions on ``fp32_tier`` (TF32 where the GPU
  has it: cuDNN's default), FP32 matmuls on ``fp32_matmul_tier`` (strict FP32: cuBLAS's default in PyTorch);
* a graph layer's sparse aggregation (gather, weight, scatter-sum): memory-bound, its bytes
  (``cptsim.cost.formulas.aggregation_bytes``) at bandwidth x ``memory_efficiency`` (``aggregation_cost``);
* every other op (batch norm, activations, residual adds, pooling, loss, optimizer update), all memory-bound:
  their bytes at bandwidth x ``memory_efficiency``. Tensors that scale with the batch are stored at the float
  width the step computes in: 32 bits on the FP32/TF32 tier, 16 when the GEMMs run on FP16 (AMP) or an int tier;
  master weights, gradients and optimizer state (the fixed part of the traffic) stay FP32;
* ``kernel_overhead_us`` per kernel launched (launch latency, ramp-up and tail of each kernel), which is what a
  step of small kernels -- a tiny model or a small batch -- is made of.

A profile that gives ``sm_count`` prices each layer's GEMM from its shape instead (``gpu_kernels``: tiles and
waves, reduction depth, depthwise convolutions on CUDA cores, the memory format), its norms at their own achieved
bandwidth, fused attention from its MACs, and says how an eager step compares with its host's dispatch
(``host_overhead_us``, ``launch_bound``). Every constant is one per GPU generation, fitted to measurements that ship
with the repository (benchmarks/gpu/fit_gpu_model.py, benchmarks/gpu/bench_gpu_throughput.py), never per network.

Energy (a model until NVML measurements calibrate it): average power between idle and board power by
utilisation. While a kernel runs the GPU is busy and draws ``power_w x power_fraction``; during per-kernel
overhead it is waiting and draws ``idle_power_w``; so energy = busy time x P_busy + overhead time x P_idle.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np

from ..formulas import fused_attention_share, phase_operands
from . import gpu_kernels
from .base import (_CAL_COMPUTE, _CAL_MEMORY, _MISSING, FULL_PRECISION_BITS, Field, HardwareProfile, StepPrice,
                   _Checker, register, roofline_time)


# FlashAttention-2 (Dao, 2023, Fig. 4-5): 50-73% of an A100's FP16 peak forward, less backward, where large
# GEMMs reach ~80%: a fused attention kernel at ~0.6 of the large-GEMM rate. Not fitted (no table isolates it).
ATTENTION_EFFICIENCY = 0.6


def gpu_tier_index(bmax, narrow_bits, narrow_index, fp32_index):
    """Index of the tier a GEMM with operand widths up to ``bmax`` runs on.

    The smallest tier width >= bmax among the tiers narrower than 32 bits (``narrow_bits`` sorted ascending,
    ``narrow_index`` their positions in the profile's tier list); widths with no such tier (17..32, or 9..16 on a GPU
    without fp16) run on the profile's FP32 tier ``fp32_index``. So cost falls in steps with bits: on an H100,
    which has no int4 tier, a 4-bit GEMM runs at the int8 rate (NVIDIA H100 datasheet; shared/reference/hardware.md).
    """
    narrow_bits = np.asarray(narrow_bits)
    pos = np.searchsorted(narrow_bits, bmax, side="left")
    lookup = np.append(np.asarray(narrow_index, dtype=np.int64), fp32_index)
    return lookup[pos]


# Widths up to this many bits name a float family's low-precision formats (fp4..fp8, MX, NVFP4); wider ones are
# bf16/fp16 (the fp16 tier) or fp32, which run as they always have.
FORMAT_TIER_MAX_BITS = 8


def _float_tier(t: dict) -> bool:
    """A tier that runs floats: it lists a float format, or lists none and its name does not begin with "int"."""
    f = t.get("formats")
    if f is None:
        return not str(t["name"]).lower().startswith("int")
    return any(not n.startswith("int") for n in f)


def _width_tier(t: dict) -> bool:
    """A tier that the integer width path (``gpu_tier_index``) may pick: every tier except those that list only
    float formats (an FP8 tier beside an int8 tier must not move today's integer costs)."""
    f = t.get("formats")
    return f is None or any(n.startswith("int") for n in f)


def _tier_formats(chk: _Checker, v, where: str, bits: int) -> list[str]:
    """A tier's ``formats``: names of the format registry (``cptsim.numerics.formats``) no wider than the tier."""
    from cptsim.errors import InputError
    from cptsim.numerics.formats import parse_format

    if not isinstance(v, list) or not v or not all(isinstance(n, str) for n in v):
        chk.fail(f"{where} must be a non-empty list of format names, e.g. [\"fp8e4m3\", \"fp8e5m2\"], got {v!r}")
    out = []
    for n in v:
        try:
            f = parse_format(n)
        except InputError as e:
            chk.fail(f"{where}: {e}")
        if f.element_bits > bits:
            chk.fail(f"{where}: {f.name} has {f.element_bits}-bit elements, wider than the tier's {bits} bits")
        out.append(f.name)
    return out


@register
class GPUProfile(HardwareProfile):
    """``gpu``: precision tiers with published dense peak rates.

    time   = max(macs / (tier MAC rate x compute_efficiency), bytes / (bandwidth x memory_efficiency))
    energy = power_w x power_fraction x time      (power_fraction 1.0 = board TDP: an upper bound)

    The tier is the narrowest one at least max(b1, b2) bits wide (``gpu_tier_index``). Peak rates are given in
    TOPS / TFLOPS (1e12 ops/s, one MAC = 2 ops, so MAC rate = ops / 2). GEMMs wider than 16 bits (FP32) run on
    the tier PyTorch gives them by default, which differs by op:

    * convolutions (cuDNN) on ``fp32_tier``: default "tf32" where the GPU has it, because
      ``torch.backends.cudnn.allow_tf32`` defaults to True; set ``fp32_tier = "fp32"`` for strict FP32;
    * matmuls -- Linear layers and attention's matmuls (cuBLAS) -- on ``fp32_matmul_tier``: default the strict
      "fp32" tier, because ``torch.backends.cuda.matmul.allow_tf32`` defaults to False (since PyTorch 1.12;
      ``torch.get_float32_matmul_precision() == "highest"``). A run that allowed TF32 matmuls is priced with
      ``allow_tf32_matmul()`` (or ``fp32_matmul_tier = "tf32"`` in the file).
    """

    KIND = "gpu"
    PRICES_OP_LIST = True
    PARAMS = (
        Field("bandwidth_gb_s", "positive", "DRAM bandwidth in GB/s (1e9 bytes/s)"),
        Field("power_w", "positive", "board power (TDP) in W"),
        Field("idle_power_w", "nonneg", "power while idle (between kernels) in W; default: power_w (no idle "
              "model)", None),
        Field("fp32_tier", "string", "name of the tier that runs FP32 convolutions (cuDNN)", None),
        Field("sm_count", "positive", "streaming multiprocessors (datasheet); given, GEMMs are priced from their "
              "shapes: tiles and waves (cptsim.cost.hardware.gpu_kernels)", None),
        Field("fp32_matmul_tier", "string", "name of the tier that runs FP32 matmuls (cuBLAS: Linear, attention); "
              "default the strict FP32 tier (PyTorch's torch.backends.cuda.matmul.allow_tf32 = False)", None),
        Field("boost_clock_mhz", "positive", "boost clock in MHz (datasheet: the clock its FP32 peak is quoted at); "
              "with sm_count, an NCHW step's norms are priced at an element rate per SM and clock", None),
    )
    TIER = (
        Field("name", "string", "tier name, e.g. int8"),
        Field("bits", "bits", "widest operand the tier takes"),
        Field("peak_ops", "positive", "dense peak rate in the tier's unit (1e12 ops/s; 1 MAC = 2 ops)"),
        Field("unit", "string", '"TOPS" or "TFLOPS"'),
        Field("efficiency", "fraction", "achieved / peak rate of this tier's training GEMMs (fitted)", 1.0),
    )
    CALIBRATION = (
        _CAL_COMPUTE,
        _CAL_MEMORY,
        Field("power_fraction", "fraction", "power while busy / TDP (1.0 = TDP, an upper bound)", 1.0),
        Field("kernel_overhead_us", "nonneg", "fixed time per kernel launched, in microseconds", 0.0),
        Field("host_overhead_us", "nonneg", "the host's time per kernel of an eager PyTorch training step (Python, "
              "autograd, dispatch, launch), in microseconds, measured; eager steps of small kernels are bound by "
              "it, CUDA graphs (cptsim train's default on CUDA) are not. With host_conv_overhead_us: per kernel "
              "other than a convolution", None),
        Field("host_conv_overhead_us", "nonneg", "the host's time per convolution kernel of an eager step (cuDNN's "
              "per-call setup), in microseconds; without it convolutions take host_overhead_us like any kernel",
              None),
        Field("attention_efficiency", "fraction", "a fused attention kernel's MAC rate / the tier's GEMM rate "
              "(default 0.6: FlashAttention-2 reaches 50-73% of an A100's peak, Dao 2023)", None),
        # The shape model of each GEMM (cptsim.cost.hardware.gpu_kernels), used when the profile gives sm_count;
        # a constant the file leaves out takes that module's DEFAULTS (the Ampere fit).
        Field("gemm_n0", "nonneg", "output columns at which a GEMM runs at half its large-N rate (fitted)", None),
        Field("gemm_k0", "nonneg", "reduction depth at which a GEMM runs at half its deep-K rate (fitted)", None),
        Field("nchw_conv_factor", "fraction", "an NCHW convolution's tensor-core rate / its channels-last rate "
              "(fitted)", None),
        Field("nchw_depthwise_factor", "fraction", "a depthwise convolution's NCHW rate / its channels-last rate "
              "(fitted)", None),
        Field("depthwise_efficiency", "fraction", "a depthwise convolution's MAC rate / the FP32 tier's peak "
              "(fitted)", None),
        Field("norm_memory_efficiency", "fraction", "batch / layer / group norms' achieved / peak DRAM bandwidth "
              "in a channels-last step (fitted)", None),
        Field("nchw_norm_factor", "fraction", "a batch norm's achieved bandwidth in NCHW / in channels-last (fitted); "
              "used by a profile without boost_clock_mhz", None),
        Field("nchw_norm_elements_per_clock", "positive", "elements a batch / group norm reads or writes per SM per "
              "clock in an NCHW step (fitted): its per-channel reductions are bound by the SMs, not by DRAM, so its "
              "time does not halve at 16 bits and scales with SMs x clock; used with boost_clock_mhz when the op "
              "list has no batch-norm shapes", None),
        Field("nchw_norm_rows_per_clock", "positive", "positions (N x H x W) one thread block of an NCHW batch norm's "
              "forward walks per clock, each channel its own block (gpu_kernels.nchw_batch_norm_seconds; measured)",
              None),
        Field("nchw_norm_backward_rows_per_clock", "positive", "the same for the batch norm's backward", None),
        Field("nchw_norm_channels_per_sm", "positive", "channels an NCHW batch norm has in flight per SM", None),
        Field("depthwise_memory_efficiency", "fraction", "a depthwise convolution's achieved / peak DRAM "
              "bandwidth (fitted)", None),
        Field("nchw_transform_bytes", "nonneg", "passes over its activations (input + output, at peak bandwidth) "
              "that an NCHW step's spatial tensor-core convolution adds for cuDNN's layout transforms (fitted per "
              "call)", None),
        Field("conv_n_tile", "positive", "the narrowest output-channel tile of a tensor-core convolution kernel: "
              "channels are padded up to whole tiles (gpu_kernels.conv_padding; 1 = no padding)", None),
        Field("conv_k_tile_bytes", "nonneg", "bytes of input channels one reduction step of a tensor-core "
              "convolution covers per filter tap (an MMA's depth: 32 = 16 FP16 channels; 0 = no padding)", None),
    )

    @classmethod
    def parse_params(cls, chk: _Checker, table: dict) -> dict:
        params = chk.fields(table, cls.PARAMS, cls.KIND, nested=("tiers",))
        tiers_raw = table.get("tiers", _MISSING)
        if tiers_raw is _MISSING:
            chk.fail('missing key \'gpu.tiers\' (a list of {name, bits, peak_ops, unit} tables, e.g. '
                     '{name = "int8", bits = 8, peak_ops = 624, unit = "TOPS"})')
        if not isinstance(tiers_raw, list) or not tiers_raw:
            chk.fail(f"gpu.tiers must be a non-empty list of {{name, bits, peak_ops, unit}} tables, got {tiers_raw!r}")
        tiers = []
        for i, t in enumerate(tiers_raw):
            where = f"gpu.tiers[{i}]"
            if not isinstance(t, dict):
                chk.fail(f"{where} must be a table {{name, bits, peak_ops, unit}}, got {t!r}")
            tier = chk.fields(t, cls.TIER, where, nested=("formats",))
            if tier["unit"] not in ("TOPS", "TFLOPS"):
                chk.fail(f'{where}.unit must be "TOPS" or "TFLOPS" (1e12 ops/s), got {tier["unit"]!r}')
            if "formats" in t:  # kept only where given, so a file without it reads back as it always did
                tier["formats"] = _tier_formats(chk, t["formats"], f"{where}.formats", tier["bits"])
            tiers.append(tier)
        names = [t["name"] for t in tiers]
        for i, n in enumerate(names):
            if n in names[:i]:
                chk.fail(f"gpu.tiers[{i}].name {n!r} is used twice")
        narrow = [t["bits"] for t in tiers if t["bits"] < FULL_PRECISION_BITS and _width_tier(t)]
        if len(set(narrow)) != len(narrow):
            chk.fail("gpu.tiers: two tiers narrower than 32 bits have the same width (which one would run?); "
                     "a float-format tier (one whose formats list only float formats) may share a width")
        wide = [t["name"] for t in tiers if t["bits"] == FULL_PRECISION_BITS]
        fp32 = params["fp32_tier"]
        if fp32 is None:
            fp32 = "tf32" if "tf32" in wide else (wide[0] if len(wide) == 1 else None)
            if fp32 is None:
                chk.fail("gpu.fp32_tier is needed: name the 32-bit tier that runs FP32 GEMMs "
                         f"(32-bit tiers: {', '.join(wide) or 'none - add one with bits = 32'})")
        elif fp32 not in wide:
            chk.fail(f"gpu.fp32_tier must name a tier with bits = 32 ({', '.join(wide) or 'none defined'}), "
                     f"got {fp32!r}")
        params["fp32_tier"] = fp32
        mm = params["fp32_matmul_tier"]
        if mm is None:
            # the strict FP32 tier: the 32-bit tier named "fp32", else the only 32-bit tier besides "tf32"
            strict = [n for n in wide if n != "tf32"]
            mm = "fp32" if "fp32" in wide else (strict[0] if len(strict) == 1 else fp32)
        elif mm not in wide:
            chk.fail(f"gpu.fp32_matmul_tier must name a tier with bits = 32 ({', '.join(wide) or 'none defined'}), "
                     f"got {mm!r}")
        params["fp32_matmul_tier"] = mm
        params["tiers"] = tiers
        return params

    def _derive(self) -> None:
        tiers = self.params["tiers"]
        self._tier_names = [t["name"] for t in tiers]
        self._tier_mac_rate = np.array([t["peak_ops"] * 1e12 / 2.0 for t in tiers])
        self._tier_eff = np.array([t.get("efficiency", 1.0) for t in tiers])
        self._tier_bits = np.array([t["bits"] for t in tiers], dtype=np.int64)
        order = sorted((t["bits"], i) for i, t in enumerate(tiers)
                       if t["bits"] < FULL_PRECISION_BITS and _width_tier(t))
        self._narrow_bits = np.array([b for b, _ in order], dtype=np.int64)
        self._narrow_index = np.array([i for _, i in order], dtype=np.int64)
        self._fp32_index = self._tier_names.index(self.params["fp32_tier"])
        self._fp32_matmul_index = self._tier_names.index(self.params["fp32_matmul_tier"])
        self._tier_names_arr = np.array(self._tier_names)
        # width order of the tiers (ties: the order in the file), for "the wider of two operands' tiers"
        self._tier_rank = np.empty(len(tiers), dtype=np.int64)
        self._tier_rank[[i for _, i in sorted((t["bits"], i) for i, t in enumerate(tiers))]] = np.arange(len(tiers))
        self._bandwidth = self.params["bandwidth_gb_s"] * 1e9

    def tier_index(self, b1, b2, matmul=None) -> np.ndarray:
        """The tier a GEMM with operands (b1, b2) runs on; an FP32 one on ``fp32_tier`` if a convolution,
        on ``fp32_matmul_tier`` where ``matmul`` is true (a Linear layer or attention matmul). In a view for a
        float format family (``with_formats``), widths up to 8 bits name formats: each operand's format tier
        (``format_tier``), the pair on the wider of the two."""
        i = gpu_tier_index(np.maximum(b1, b2), self._narrow_bits, self._narrow_index, self._fp32_index)
        fw = getattr(self, "_fmt_width_tier", None)
        if fw is not None:
            b1i = np.asarray(b1).astype(np.int64)
            b2i = np.asarray(b2).astype(np.int64)
            small = (b1i <= FORMAT_TIER_MAX_BITS) & (b2i <= FORMAT_TIER_MAX_BITS)
            t1 = fw[np.minimum(b1i, FORMAT_TIER_MAX_BITS)]
            t2 = fw[np.minimum(b2i, FORMAT_TIER_MAX_BITS)]
            wider = np.where(self._tier_rank[t1] >= self._tier_rank[t2], t1, t2)
            i = np.where(small, wider, i)
        if matmul is None:
            return i
        return np.where(np.asarray(matmul, dtype=bool) & (i == self._fp32_index), self._fp32_matmul_index, i)

    # -- number formats: tiers that list the formats they run -----------------------------------------------------

    def tier_formats(self, i: int) -> tuple[str, ...] | None:
        """The formats tier ``i`` lists (``formats`` in the file), or None where it lists none."""
        f = self.params["tiers"][i].get("formats")
        return None if f is None else tuple(f)

    def format_tier(self, fmt) -> int:
        """The tier a GEMM whose operands are both in ``fmt`` (a ``cptsim.numerics.formats.Format`` or name) runs on:
        the narrowest tier that lists it; else (a format this GPU has no tier for: FP8 on an A100, MXFP4 on an
        H100) the narrowest float tier at least as wide as its elements -- the next wider tier, as an int4 GEMM
        runs on an H100's int8 tier. A float tier lists float formats, or lists none and is not named int*.
        Integer formats take the width path (``tier_index``); 16- and 32-bit floats too (bf16/fp16 on the fp16
        tier, fp32 on ``fp32_tier``), as today."""
        from cptsim.numerics.formats import parse_format

        f = parse_format(fmt)
        base = f.name.split(":")[0]
        if f.family == "int" or f.element_bits > FORMAT_TIER_MAX_BITS:
            return int(gpu_tier_index(f.element_bits, self._narrow_bits, self._narrow_index, self._fp32_index))
        tiers = self.params["tiers"]
        listing = [i for i, t in enumerate(tiers) if base in (t.get("formats") or ())]
        if listing:
            return min(listing, key=lambda i: self._tier_rank[i])
        wider = [i for i, t in enumerate(tiers) if _float_tier(t) and t["bits"] >= f.element_bits]
        if not wider:
            return self._fp32_index
        return min(wider, key=lambda i: self._tier_rank[i])

    def runs_natively(self, fmt) -> bool:
        """Whether ``fmt``'s GEMMs run on a tier that lists it (so its operands stay in its storage bits)."""
        from cptsim.numerics.formats import parse_format

        f = parse_format(fmt)
        return f.name.split(":")[0] in (self.tier_formats(self.format_tier(f)) or ())

    def with_formats(self, fmap) -> "GPUProfile":
        """A copy of this profile whose widths up to 8 bits name the formats of ``fmap``
        (``cptsim.numerics.families.FormatMap``): a width's tier is its format's (``format_tier``), the wider of
        the forward and the gradient format's where they differ at one width (conservative: one width, one tier),
        and an operand is stored at its format's storage bits where that tier lists the format, else at the
        tier's width (an upcast, as an int4 tensor on an H100 is stored in int8). None: this profile."""
        if fmap is None:
            return self
        view = dataclasses.replace(self)
        fw = np.zeros(FORMAT_TIER_MAX_BITS + 1, dtype=np.int64)
        store_f = np.array(fmap.fwd_storage_bits[:FORMAT_TIER_MAX_BITS + 1], dtype=np.float64)
        store_g = np.array(fmap.grad_storage_bits[:FORMAT_TIER_MAX_BITS + 1], dtype=np.float64)
        for w in range(1, FORMAT_TIER_MAX_BITS + 1):
            tf, tg = self.format_tier(fmap.fwd_names[w]), self.format_tier(fmap.grad_names[w])
            fw[w] = tf if self._tier_rank[tf] >= self._tier_rank[tg] else tg
            if not self.runs_natively(fmap.fwd_names[w]):
                store_f[w] = self._tier_bits[tf]
            if not self.runs_natively(fmap.grad_names[w]):
                store_g[w] = self._tier_bits[tg]
        fw[0] = fw[1]
        view._fmt_width_tier = fw
        view._fmt_storage = (store_f, store_g)
        view._fmt_map = fmap
        return view

    def format_storage_bits(self, b, grad: bool = False) -> np.ndarray | None:
        """In a format view: the bits an operand of width ``b`` is stored in (its format's storage bits where its
        tier runs it natively, else the tier's width; wider than 8 bits: the tier's width, as today); None
        outside a view."""
        fs = getattr(self, "_fmt_storage", None)
        if fs is None:
            return None
        b = np.asarray(b).astype(np.int64)
        tier_bits = self._tier_bits[self.tier_index(b, b)].astype(np.float64)
        s = fs[1 if grad else 0][np.minimum(b, FORMAT_TIER_MAX_BITS)]
        return np.where(b <= FORMAT_TIER_MAX_BITS, s, tier_bits)

    def allow_tf32_matmul(self) -> "GPUProfile":
        """A copy of this profile for a run whose FP32 matmuls may use TF32
        (``torch.backends.cuda.matmul.allow_tf32 = True``): they run on ``fp32_tier``, as convolutions do."""
        params = copy.deepcopy(self.params)
        if params["fp32_matmul_tier"] == params["fp32_tier"]:
            return self
        params["fp32_matmul_tier"] = params["fp32_tier"]
        return dataclasses.replace(self, params=params, notes=[*self.notes, (
            f"FP32 matmuls priced on {params['fp32_tier']}: the run allowed TF32 matmuls "
            "(torch.backends.cuda.matmul.allow_tf32 = True)")])

    def _throughput(self, b1, b2, matmul=None):
        i = self.tier_index(b1, b2, matmul)
        return self._tier_mac_rate[i] * self._tier_eff[i] * self._ceff

    @property
    def busy_power_w(self) -> float:
        return self.params["power_w"] * self.calibration["power_fraction"]

    @property
    def idle_power_w(self) -> float:
        idle = self.params.get("idle_power_w")
        return self.busy_power_w if idle is None else min(float(idle), self.busy_power_w)

    @property
    def kernel_overhead_s(self) -> float:
        return self.calibration.get("kernel_overhead_us", 0.0) * 1e-6

    def compute_bits(self, b) -> np.ndarray:
        """The float width of a step whose GEMMs have operands up to ``b`` bits, which its activations and errors
        are stored in: 16 when the GEMMs run on a tier of 16 bits or less (AMP; an int pipeline keeps its
        non-GEMM ops in FP16 too), 32 on the FP32/TF32 tier."""
        return np.where(self._tier_bits[self.tier_index(b, b)] <= 16, 16, 32)

    # -- a training step: what the cost model asks (price_step) ---------------------------------------------------

    def price_step(self, a, q, g, samples, formats=None):
        """``HardwareProfile.price_step``, with fused attention kernels priced once: the op list prices them
        (``_attention_time``, from their own MACs and bytes), so their layer entries keep the GEMM time and energy
        of only the share it does not hold (``fused_attention_share``)."""
        t, e, xt, xe = super().price_step(a, q, g, samples, formats)
        share = fused_attention_share(a) if xt is not None else 0.0
        if share:
            keep = np.where(a.sdpa[:, None], 1.0 - share, 1.0)
            t, e = t * keep, e * keep
        return StepPrice(t, e, xt, xe)

    def storage_bits(self, formats=None):
        """A b-bit operand stored at its tier's width (an int4 tensor on an H100 in int8), or in a format view at
        ``format_storage_bits``; GEMM outputs at the float width the step computes in: FP16 by an FP16 (AMP) or
        int GEMM -- an int GEMM's INT32 accumulators are scaled back into the FP16 pipeline its non-GEMM ops run
        in -- FP32 by an FP32/TF32 one (``compute_bits``)."""
        if formats is not None:
            def fmt_store(b):
                return self.format_storage_bits(b)

            def fmt_grad(b):
                return self.format_storage_bits(b, grad=True)

            fmt_store.output = self.compute_bits
            fmt_store.grad = fmt_grad
            return fmt_store
        tier_bits = self._tier_bits

        def gpu_store(b):
            return tier_bits[self.tier_index(b, b)]

        gpu_store.output = self.compute_bits
        return gpu_store

    def layer_cost(self, a, macs, b1, b2, bytes_moved, quant_elems, samples):
        """GEMMs from their shapes where the profile gives an SM count and the layers' shapes are on record
        (``shaped_gemm_cost``), else ``gemm_cost``'s tier roofline, FP32 convolutions and FP32 matmuls each on
        the tier PyTorch's defaults give them. Quantizer passes cost nothing here: an int tier is priced as a
        native int pipeline."""
        if self.shape_model and a.gemm is not None:
            return self.shaped_gemm_cost(a, macs, b1, b2, bytes_moved, samples)
        return super().layer_cost(a, macs, b1, b2, bytes_moved, quant_elems, samples)

    def op_list_cost(self, a, q, g, samples):
        """``step_ops_cost`` of the profile's op list (None without one), in the step's memory format."""
        if a.ops is None:
            return None
        q, g = np.atleast_1d(np.asarray(q)), np.atleast_1d(np.asarray(g))
        n = np.broadcast_to(np.asarray(samples, dtype=np.float64), q.shape)
        return self.step_ops_cost(a.ops, q, g, n, channels_last=bool(a.channels_last))

    def step_tiers(self, kinds) -> list[dict]:
        rows = []
        for q, g in kinds:
            b1, b2 = phase_operands(np.array([True]), q, g)
            tiers = self.tier_index(b1[0], b2[0])
            rows.append({"bits": q, "grad_bits": g, **{p: self._tier_names[int(t)]
                                                       for p, t in zip(("fwd", "dgrad", "wgrad"), tiers)}})
        return rows

    def full_precision_bits(self, q) -> np.ndarray:
        """The width a step's full-precision layers run at here, per step kind of forward bits ``q``: 16 in a step
        that computes in FP16 (``compute_bits``: AMP, or an int pipeline, whose non-GEMM ops are FP16 too), as
        ``torch.autocast`` runs every conv and linear layer in FP16 whatever the model calls full precision; 32
        otherwise."""
        return self.compute_bits(np.asarray(q))

    def _cost(self, macs, b1, b2, bytes_moved, quant_elems):
        # A GEMM keeps the GPU busy: board power (x power_fraction) for its whole time. Its launch is counted with
        # the step's other launches (step_ops_cost). Quantizer passes are not costed here (``quant_elems``): an int
        # tier is costed as a native int pipeline, as the cost model always has.
        return self._cost_by_op(macs, b1, b2, bytes_moved, quant_elems, None)

    def _cost_by_op(self, macs, b1, b2, bytes_moved, quant_elems, matmul):
        t = roofline_time(macs, self._throughput(b1, b2, matmul), bytes_moved, self._bandwidth * self._meff)
        return t, self.busy_power_w * t

    # -- the shape model (gpu_kernels): GEMM time from tiles and waves, depthwise convolutions, memory format ------

    def kernel_constant(self, name: str) -> float:
        """A shape-model constant: the file's calibration value, else gpu_kernels.DEFAULTS."""
        v = self.calibration.get(name)
        return float(gpu_kernels.DEFAULTS[name] if v is None else v)

    @property
    def shape_model(self) -> bool:
        """Whether GEMMs are priced from their shapes: the profile gives the GPU's SM count."""
        return self.params.get("sm_count") is not None

    def shaped_gemm_cost(self, a, macs, b1, b2, bytes_moved, samples) -> tuple[np.ndarray, np.ndarray]:
        """(time s, energy J), (K, L, 3), of the layers' GEMMs of profile arrays ``a`` from their shapes
        (``gpu_kernels.gemm_times``); without an SM count or GEMM shapes, ``gemm_cost``'s tier roofline."""
        mm = None if getattr(a, "matmul", None) is None else a.matmul[:, None]
        if not self.shape_model or getattr(a, "gemm", None) is None:
            return self.gemm_cost(macs, b1, b2, bytes_moved, matmul=mm)
        i = self.tier_index(b1, b2, mm)
        rate = self._tier_mac_rate[i] * self._tier_eff[i] * self._ceff
        tensor = self._tier_names_arr[i] != "fp32"
        fp32_peak = self._tier_mac_rate[self._tier_names.index("fp32")] if "fp32" in self._tier_names else \
            float(self._tier_mac_rate[self._fp32_index])
        consts = {k: self.kernel_constant(k) for k in gpu_kernels.DEFAULTS}
        # FP32 3x3 convs may run Winograd on the CUDA cores (gpu_kernels: the faster of it and the implicit GEMM)
        wino, wino_rate = None, None
        numel = getattr(a, "numel", None)  # a microbenchmark's kernel rows carry shapes only: direct convs
        if a.is_conv is not None and numel is not None and "fp32" in self._tier_names:
            w = gpu_kernels.winograd_convs(a.gemm, numel[:, 1], a.is_conv)
            if w.any():
                j = self._tier_names.index("fp32")
                wino = w[None, :, None] & (self._tier_bits[i] == 32)
                wino_rate = float(self._tier_mac_rate[j] * self._tier_eff[j] * self._ceff)
        # an NCHW step's spatial convolutions on tensor cores: their activations transformed to NHWC and back
        trans = None
        if a.is_conv is not None and numel is not None and not getattr(a, "channels_last", False):
            sp = gpu_kernels.spatial_convs(a.gemm, numel[:, 1], a.is_conv)
            if sp.any():
                act = (numel[:, 1] + numel[:, 2])[None, :, None] * np.asarray(samples, dtype=np.float64).reshape(
                    -1, 1, 1) * self.compute_bits(np.maximum(b1, b2)) / 8.0
                trans = np.where(sp[None, :, None], act, 0.0)
        # tensor-core convolutions' channel padding to whole tiles: needs each conv's taps (from its shapes)
        taps = ebytes = None
        if a.is_conv is not None and numel is not None:
            taps = gpu_kernels.conv_taps(a.gemm, numel[:, 1], a.is_conv)
            ebytes = self._tier_bits[i] / 8.0
        t = gpu_kernels.gemm_times(a.gemm, a.is_conv, macs, samples, rate, tensor, fp32_peak, bytes_moved,
                                   self._bandwidth * self._meff, float(self.params["sm_count"]), consts,
                                   channels_last=bool(getattr(a, "channels_last", False)), winograd=wino,
                                   winograd_rate=wino_rate, transform_bytes=trans, peak_bandwidth=self._bandwidth,
                                   taps=taps, element_bytes=ebytes)
        return t, self.busy_power_w * t

    def step_ops_cost(self, ops, q, g, samples, channels_last: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(time s, energy J), each (K, 3) for K step kinds x the phases (fwd, dgrad, wgrad), of everything in a
        step besides the layers' GEMMs: the memory-bound ops of ``ops`` (a ``cptsim.measure.opcount.OpProfile``) and
        every kernel launch. Forward ops are charged to fwd, backward ops to dgrad, the optimizer to wgrad. With
        the shape model, normalisations run at their own achieved bandwidth (``norm_memory_efficiency``; batch
        norms in an NCHW step no faster than ``nchw_norm_rate``, or at ``nchw_norm_factor`` of it without a clock)."""
        fwd_bits, bwd_bits = self.compute_bits(np.asarray(q)), self.compute_bits(np.maximum(q, g))
        norm, conv_norm, conv_rate, bn_floor = 1.0, 1.0, None, None
        if self.shape_model:
            norm = self.kernel_constant("norm_memory_efficiency") / max(self._meff, 1e-9)
            if not channels_last:
                conv_rate = self.nchw_norm_rate(ops.element_bits)
                conv_norm = 1.0 if conv_rate is not None else self.kernel_constant("nchw_norm_factor")
                bn_floor = self.nchw_batch_norm_time(ops, samples)
                if bn_floor is not None:
                    # measured on FP16 kernels only (AMP steps on the lent H100); a 32-bit step's norms keep the
                    # element rate: priced by shape, CIFAR ResNet-20's FP32 batch norms alone would take longer
                    # than its whole measured graphed step (4.0 ms on the H100), so FP32 runs other kernels
                    half = {"fwd": fwd_bits <= 16, "bwd": bwd_bits <= 16, "opt": fwd_bits <= 16}
                    bn_floor = {p: np.where(half[p], v, -1.0) for p, v in bn_floor.items()}
        t, e = gpu_step_ops_cost(ops.summary(), ops.element_bits, fwd_bits, bwd_bits, samples,
                                 self._bandwidth * self._meff, self.kernel_overhead_s, self.busy_power_w,
                                 self.idle_power_w, norm_factor=norm, conv_norm_factor=conv_norm,
                                 conv_norm_rate=conv_rate, conv_norm_floor=bn_floor)
        at = self._attention_time(ops.summary(), ops.element_bits, fwd_bits, bwd_bits, samples)
        return t + at, e + at * self.busy_power_w

    def aggregation_cost(self, bytes_moved) -> tuple[np.ndarray, np.ndarray]:
        """(time s, energy J) of graph aggregations (``cptsim.cost.formulas.aggregation_bytes``): gather and scatter
        kernels, memory-bound whatever their widths -- their bytes at bandwidth x ``memory_efficiency``, the GPU
        busy throughout; no tier's GEMM rate enters (one MAC per edge and feature is far below any tier's peak per
        byte moved). Their launches are the op list's (kind ``aggregation``)."""
        t = np.asarray(bytes_moved, dtype=np.float64) / (self._bandwidth * self._meff)
        return t, self.busy_power_w * t

    def nchw_batch_norm_time(self, ops, samples) -> dict | None:
        """{phase: (K,) seconds} of an NCHW step's batch norms from their shapes
        (``gpu_kernels.nchw_batch_norm_seconds``: bound by thread blocks per channel, not by bytes); None without a
        boost clock or when the op list has no shapes for its norms (then ``nchw_norm_rate`` bounds them)."""
        clock = self.params.get("boost_clock_mhz")
        shapes = ops.batch_norm_shapes() if hasattr(ops, "batch_norm_shapes") else None
        if clock is None or shapes is None or not self.shape_model:
            return None
        sms, hz = float(self.params["sm_count"]), float(clock) * 1e6
        per = self.kernel_constant("nchw_norm_channels_per_sm")
        return {"fwd": gpu_kernels.nchw_batch_norm_seconds(shapes["fwd"], samples, sms, hz,
                                                           self.kernel_constant("nchw_norm_rows_per_clock"), per),
                "bwd": gpu_kernels.nchw_batch_norm_seconds(
                    shapes["bwd"], samples, sms, hz, self.kernel_constant("nchw_norm_backward_rows_per_clock"), per),
                "opt": gpu_kernels.nchw_batch_norm_seconds(shapes["opt"], samples, sms, hz,
                                                           self.kernel_constant("nchw_norm_rows_per_clock"), per)}

    def nchw_norm_rate(self, element_bits: int) -> float | None:
        """Bytes per second, in ``element_bits``-wide elements, that a batch / group norm of an NCHW step moves at
        most: SMs x boost clock x ``nchw_norm_elements_per_clock`` (its per-channel reductions are bound
        by the SMs, so at 16 bits it moves as many elements per second as at 32, not twice as many -- our H100's
        batch norm ran 1e8 FP16 elements slower than FP32 ones, benchmarks/results/gpu-shape-model-H100-run1.json
        membw); None without a boost clock."""
        clock = self.params.get("boost_clock_mhz")
        if clock is None or not self.shape_model:
            return None
        return (float(self.params["sm_count"]) * float(clock) * 1e6
                * self.kernel_constant("nchw_norm_elements_per_clock") * element_bits / 8.0)

    def launch_bound(self, ops, gpu_step_s: float) -> dict | None:
        """Whether an eager step of ``ops`` (its launches) is bound by the host's dispatch or by the GPU, given the
        modelled GPU time of one step; None without a measured ``host_overhead_us``. With
        ``host_conv_overhead_us``, the convolutions' launches take that and the others ``host_overhead_us``."""
        host_us = self.calibration.get("host_overhead_us")
        if host_us is None or ops is None:
            return None
        tot = ops.totals()
        conv_us = self.calibration.get("host_conv_overhead_us")
        conv = tot.get("conv_launches", 0.0) if conv_us is not None else 0.0
        return launch_bound(tot["launches"] - conv, float(host_us) * 1e-6, gpu_step_s,
                            conv_launches=conv, host_s_per_conv=float(conv_us or 0.0) * 1e-6)

    def _attention_time(self, summary, element_bits, fwd_bits, bwd_bits, samples) -> np.ndarray:
        """(K, 3) seconds of the fused attention kernels (FlashAttention and kin; ``opcount`` counts their MACs):
        their MACs at the step's matmul tier x ``attention_efficiency``, bounded by their bytes."""
        n = np.asarray(samples, dtype=np.float64)
        eff = self.calibration.get("attention_efficiency")
        eff = ATTENTION_EFFICIENCY if eff is None else float(eff)
        out = []
        for phase, bits in (("fwd", fwd_bits), ("bwd", bwd_bits), ("opt", fwd_bits)):
            s = summary[phase]
            macs = s.get("attention_macs_per_sample", 0.0) * n
            if not np.any(macs):
                out.append(np.zeros(n.shape))
                continue
            b = np.asarray(bits)
            i = self.tier_index(b, b, True)
            rate = self._tier_mac_rate[i] * self._tier_eff[i] * self._ceff * eff
            nbytes = s.get("attention_bytes_per_sample", 0.0) * n * np.minimum(b / element_bits, 1.0)
            out.append(np.maximum(macs / rate, nbytes / (self._bandwidth * self._meff)))
        return np.stack(out, axis=-1)

    def describe_bits(self, b1: int, b2: int) -> str:
        return self._tier_names[int(self.tier_index(b1, b2))]


def launch_bound(launches: float, host_s_per_launch: float, gpu_step_s: float, conv_launches: float = 0.0,
                 host_s_per_conv: float = 0.0) -> dict:
    """An eager step cannot finish before the host has issued its launches: eager time = max(GPU time, launches x
    the host's time per launch + convolution launches x the host's time per convolution); a CUDA graph replays the
    step with the host out of the loop (GPU time)."""
    host = launches * host_s_per_launch + conv_launches * host_s_per_conv
    eager = max(gpu_step_s, host)
    return {"gpu_step_s": gpu_step_s, "host_step_s": host, "eager_step_s": eager,
            "bound": "launch (host)" if host > gpu_step_s else "GPU",
            "cuda_graphs_saving": 1.0 - gpu_step_s / eager if eager > 0 else 0.0}


def gpu_step_ops_cost(summary, element_bits, fwd_bits, bwd_bits, samples, bandwidth, overhead_s, busy_w, idle_w,
                      norm_factor: float = 1.0, conv_norm_factor: float = 1.0, conv_norm_rate: float | None = None,
                      conv_norm_floor: dict | None = None):
    """Seconds and joules, (K, 3), of a step's non-GEMM ops per step kind (fwd, bwd -> dgrad, opt -> wgrad).

    ``summary``: ``OpProfile.summary()`` (bytes per sample and fixed, launches, per op phase) measured with
    ``element_bits`` wide tensors; ``fwd_bits`` / ``bwd_bits`` (K,): the width the forward / backward computes in,
    which scales the per-sample (activation and error) bytes; the fixed bytes (weights, gradients, optimizer state:
    FP32 master copies) do not scale. time = bytes / bandwidth + launches x overhead (every launch, GEMMs too);
    the normalisations' per-sample bytes run at ``norm_factor`` x that bandwidth, and those of batch / group /
    instance norms (on feature maps, whose kernels depend on the memory format) at ``conv_norm_factor`` x that, and
    no faster than ``conv_norm_rate`` bytes/s of their ``element_bits``-wide elements, whatever the step's width
    (an NCHW step's norms: bound by the SMs' element rate, ``GPUProfile.nchw_norm_rate``); ``conv_norm_floor``
    ({phase: (K,) s}, ``GPUProfile.nchw_batch_norm_time``): where >= 0, those norms take at least this long and
    ``conv_norm_rate`` does not apply (where < 0 it does).
    """
    n = np.asarray(samples, dtype=np.float64)
    scale = {"fwd": np.asarray(fwd_bits, dtype=np.float64) / element_bits,
             "bwd": np.asarray(bwd_bits, dtype=np.float64) / element_bits, "opt": np.ones_like(n)}
    busy, over = [], []
    for phase in ("fwd", "bwd", "opt"):
        s = summary[phase]
        width = np.minimum(scale[phase], 1.0)
        norm = s.get("norm_bytes_per_sample", 0.0) * n * width
        conv_norm = s.get("conv_norm_bytes_per_sample", 0.0) * n * width
        nbytes = s["bytes_per_sample"] * n * width + s["bytes_fixed"] - norm
        conv_t = conv_norm / (bandwidth * norm_factor * conv_norm_factor)
        rate_t = conv_t
        if conv_norm_rate is not None:
            rate_t = np.maximum(conv_t, s.get("conv_norm_bytes_per_sample", 0.0) * n / conv_norm_rate)
        if conv_norm_floor is not None:  # batch norms by their shapes (where >= 0): their blocks per channel
            f = np.broadcast_to(conv_norm_floor[phase], n.shape)
            conv_t = np.where(f >= 0, np.maximum(conv_t, f), rate_t)
        else:
            conv_t = rate_t
        busy.append(nbytes / bandwidth + (norm - conv_norm) / (bandwidth * norm_factor) + conv_t)
        over.append(np.full(n.shape, s["launches"] * overhead_s))
    busy, over = np.stack(busy, axis=-1), np.stack(over, axis=-1)
    return busy + over, busy * busy_w + over * idle_w

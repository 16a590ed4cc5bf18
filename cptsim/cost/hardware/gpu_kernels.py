"""The time of one GEMM-like kernel on a GPU from its shape: tiles and waves under the roofline.

Pure functions over arrays (numpy), used by the ``gpu`` kind (``gpu.py``) and by the fit that sets its constants
(``benchmarks/gpu/bench_gpu_zoo.py --fit``), so that what is fitted is exactly what ``cost``, ``plan`` and ``report``
compute. The model, per layer and phase (fwd, dgrad, wgrad), with M rows, N output columns and K-deep reductions
per group (``cptsim.measure.profiler.GEMM_KEYS``):

* **Tensor-core GEMMs and convolutions** run at ``peak x efficiency x shape x waves x layout``:

  - ``shape = 1 / ((1 + n0/N) (1 + k0/K))``: a tile narrower than the kernel's widest (N small) or a reduction
    too short to hide its prologue and epilogue (K small) runs below the large-GEMM rate; ``n0``, ``k0`` are
    fitted per GPU generation (a few tens of columns and of reduction steps);
  - ``waves``: output tiles of 128 x 128 spread over the SMs; a last partial wave leaves SMs idle:
    tiles / (ceil(tiles / SMs) x SMs). A GEMM with too few tiles to fill the SMs has its reduction split among
    more (split-K, as cuBLAS and cuDNN do; the weight gradient, N x K reduced over all M rows, most of all);
  - ``layout``: a convolution in NCHW (PyTorch's default memory format) on a tensor-core tier runs at
    ``nchw_conv_factor`` of its channels-last rate (cuDNN's tensor-core kernels are NHWC; it transforms around
    them). Linear layers and matmuls are unaffected.

* **Depthwise convolutions** (one output channel per group) are not GEMMs: they run on CUDA cores, at
  ``depthwise_efficiency`` of the FP32 tier's peak, bounded by their bytes at ``depthwise_memory_efficiency`` of
  the bandwidth (both fitted); NCHW costs them ``nchw_depthwise_factor``.

* **FP32 3x3 convolutions may run Winograd.** For a dense 3x3, stride-1 convolution computed in FP32, cuDNN offers
  Winograd algorithms on the CUDA cores beside its implicit GEMMs (``CUDNN_CONVOLUTION_*_ALGO_WINOGRAD[_NONFUSED]``,
  for the forward, the data gradient and the filter gradient), and picks the fastest (``cudnn.benchmark``, or its
  heuristics). Priced as F(2x2, 3x3), the fused algorithm's transform: 16 multiplications for the 4 outputs a
  direct 3x3 conv computes with 36, i.e. ``WINOGRAD_MAC_REDUCTION`` = 2.25 fewer MACs, a textbook count, not a
  fit. Those MACs run at the FP32 (CUDA-core) tier's rate under the direct conv's shape and wave factors, and the
  layer takes the faster of the two. Where FP32 has no tensor tier (V100) or the CUDA cores match TF32's tensor
  rate (GA102/AD102: RTX 3090 35.6 vs 35.6 TFLOPS, RTX 4090 82.6 vs 82.6) Winograd wins; on an A100 or H100,
  whose TF32 tensor rate is 8x their FP32 rate, it almost never does. 16-bit (AMP) steps run tensor-core implicit
  GEMMs only. Checked, not fitted, on the published FP32/TF32 ResNet-50 rows (bench_gpu_datasheet.py: NVIDIA's
  V100 FP32 -20.0% -> -8.0%, Lambda's -19.1% -> -7.0%, RTX 3090 TF32 -12.1% -> -2.6%, RTX 4090 TF32 -14.3% ->
  -9.6%; A100 and H100 rows unchanged).

* **NCHW spatial convolutions pay for layout transforms.** cuDNN's tensor-core convolution kernels are NHWC; in
  an NCHW step a convolution with a spatial kernel (3x3, 7x7: not a 1x1, which runs as a plain GEMM) is wrapped in
  ``nchwToNhwc`` / ``nhwcToNchw`` kernels that read and write its activations again. Each phase takes
  ``nchw_transform_bytes`` x (its input + output bytes) / peak bandwidth more -- a count of extra passes, fitted per
  call on the traced H100 convolutions (``benchmarks/gpu/fit_gpu_model.py``, ``conv_calls``; left-out networks
  give the same value), not on any network's total.

* **Narrow convolutions compute their channel padding.** cuDNN's tensor-core implicit GEMMs cover a convolution's
  output channels with tiles ``conv_n_tile`` wide and each filter tap's input channels in MMA steps of
  ``conv_k_tile_bytes``; channels that are not whole tiles are padded with zeros the kernel computes at the full
  rate (``conv_padding``: an 18-channel 3x3 conv in FP16 computes 64/18 x 32/18 = 6.3x its MACs forward). Tile
  arithmetic read off the traced kernels' names and the MMA instruction's depth, not fitted; checked per traced call
  with each network left out (``benchmarks/gpu/fit_gpu_model.py``, ``narrow_check``). Grouped convolutions are left
  unpadded (cuDNN packs groups; no traced call says how tightly). Set on Hopper; Ampere's fitted constants,
  identified without it, leave it off (1, 0).

* Every kernel is also bounded by its DRAM bytes at ``memory_efficiency`` x bandwidth (the caller's roofline).

Nothing here is a per-model factor: a network's time is the sum of its kernels' times, each from its own shape.
"""

from __future__ import annotations

import numpy as np

from cptsim.measure.profiler import is_depthwise_gemm

WINOGRAD_MAC_REDUCTION = 2.25  # F(2x2, 3x3): (2 + 3 - 1)^2 = 16 multiplications per 2x2 outputs, vs 2^2 x 3^2 = 36

TILE = 128  # output tile side of a tensor-core GEMM kernel (CUTLASS/cuBLAS's common 128x128 threadblock tile)

# Defaults when a profile has no fitted constants: the Ampere fit (hw_profiles/rtx3090.toml says where they came from)
DEFAULTS = {
    "gemm_n0": 13.2,
    "gemm_k0": 96.3,
    "nchw_conv_factor": 0.9306,
    "nchw_depthwise_factor": 1.0,
    "depthwise_efficiency": 0.05623,
    "depthwise_memory_efficiency": 1.0,
    "norm_memory_efficiency": 1.0,
    "nchw_norm_factor": 0.352,
    "nchw_norm_elements_per_clock": 1.17,
    # NCHW batch norm by its shape (nchw_batch_norm_seconds): measured per kernel on an H100 (366 cuDNN batch-norm
    # calls of 7 networks in benchmarks/results/gpu-optrace-H100/trace-*-nchw; bench_gpu_optrace.py)
    "nchw_norm_rows_per_clock": 0.72,
    "nchw_norm_backward_rows_per_clock": 0.377,
    "nchw_norm_channels_per_sm": 1.5,
    # NCHW spatial convolutions' layout transforms: not measured on Ampere (its fitted nchw_conv_factor stands for them)
    "nchw_transform_bytes": 0.0,
    # narrow convolutions' channel padding (conv_padding): off on Ampere, whose constants were fitted without it
    "conv_n_tile": 1.0,
    "conv_k_tile_bytes": 0.0,
}


def wave_efficiency(tiles, sm_count) -> np.ndarray:
    """tiles / (waves x SMs): the share of the SMs' time that the last, partial wave does not waste."""
    tiles = np.maximum(np.asarray(tiles, dtype=np.float64), 1.0)
    waves = np.ceil(tiles / sm_count)
    return tiles / (waves * sm_count)


def shape_efficiency(n, k, n0, k0) -> np.ndarray:
    """1 / ((1 + n0/N)(1 + k0/K)), for N, K >= 1."""
    n = np.maximum(np.asarray(n, dtype=np.float64), 1.0)
    k = np.maximum(np.asarray(k, dtype=np.float64), 1.0)
    return 1.0 / ((1.0 + n0 / n) * (1.0 + k0 / k))


def phase_dims(gemm: np.ndarray, samples: np.ndarray):
    """Per phase, the (count, M, N, K) of the GEMMs a layer runs in a step of ``samples`` samples.

    ``gemm``: (L, 5) columns groups, n, k, rows (per sample), rows_per_gemm (0: all rows form one GEMM).
    ``samples``: (Kinds,). Returns four arrays (Kinds, L, 3) for phases fwd, dgrad, wgrad:
    fwd  = groups x (M rows, N = n, K = k);
    dgrad = the error times the weight: groups x (M, N = k, K = n);
    wgrad = the error times the input: groups x (M' = n, N = k, K = M), M being the whole reduction.
    """
    g, n, k, rows, rpg = (gemm[:, i][None, :] for i in range(5))
    s = np.asarray(samples, dtype=np.float64)[:, None]
    total_rows = rows * s                                    # (Kinds, L)
    batched = rpg > 0
    m = np.where(batched, rpg, total_rows)
    count = np.where(batched, g * total_rows / np.maximum(rpg, 1.0), g)
    stack = lambda a, b, c: np.stack(np.broadcast_arrays(a, b, c), axis=-1)  # noqa: E731
    count3 = stack(count, count, count)
    m3 = stack(m, m, n)
    n3 = stack(n, k, k)
    k3 = stack(k, n, m)
    return count3, m3, n3, k3


def tensor_core_rate_factor(gemm, samples, sm_count, n0, k0):
    """(Kinds, L, 3) factor on a tier's (peak x efficiency) for each layer-phase GEMM: shape x waves (the memory
    format's factor is ``gemm_times``', which knows the tier)."""
    count, m, n, k = phase_dims(gemm, samples)
    tiles = count * np.ceil(m / TILE) * np.ceil(n / TILE)
    # too few output tiles to fill the SMs: the reduction is split among more (split-K, as cuBLAS and cuDNN do;
    # the weight gradient, reduced over every row, most of all), at most one split per 512 of depth
    split = np.clip(np.floor(sm_count / np.maximum(tiles, 1.0)), 1.0, np.maximum(np.ceil(k / 512.0), 1.0))
    return shape_efficiency(n, k, n0, k0) * wave_efficiency(tiles * split, sm_count)


def is_depthwise(gemm: np.ndarray) -> np.ndarray:
    """(L,) layers whose every group has one output column and more than one group: depthwise convolutions."""
    return is_depthwise_gemm(gemm[:, 0], gemm[:, 1])


def winograd_convs(gemm: np.ndarray, input_numel: np.ndarray, is_conv: np.ndarray) -> np.ndarray:
    """(L,) dense 3x3, stride-1 convolutions ('same' padding): the layers cuDNN can run by Winograd. Read from the
    recorded shapes: one group, and K x rows = 9 x input elements (K = C_in kh kw, rows = H_out W_out = H_in W_in at
    stride 1 with 'same' padding), so kh kw = 9. A strided conv (rows = H_in W_in / s^2) or a 1x1 gives another
    ratio; a 3x3 without padding (rows a little below H_in W_in) is missed, and priced as a direct conv."""
    gemm = np.asarray(gemm, dtype=np.float64)
    known = ~np.isnan(gemm).any(axis=1)
    g = np.where(known[:, None], gemm, 0.0)
    inp = np.asarray(input_numel, dtype=np.float64)
    ratio = np.divide(g[:, 2] * g[:, 3], inp, out=np.zeros_like(inp), where=inp > 0)
    return known & np.asarray(is_conv, dtype=bool) & (g[:, 0] == 1) & (np.abs(ratio - 9.0) < 1e-6)


def spatial_convs(gemm: np.ndarray, input_numel: np.ndarray, is_conv: np.ndarray) -> np.ndarray:
    """(L,) convolutions whose kernel has more than one tap, read from the recorded shapes: K x rows x groups over the
    input's elements is taps / stride^2 (1 for a 1x1 at stride 1, 0.25 at stride 2; 9 or 2.25 for a 3x3; 12.25 for
    a 7x7 at stride 2), so above 1.5 the kernel is spatial (a 3x3 at stride 3 or a 2x2 patchify at stride 2 read as
    a 1x1)."""
    gemm = np.asarray(gemm, dtype=np.float64)
    known = ~np.isnan(gemm).any(axis=1)
    g = np.where(known[:, None], gemm, 0.0)
    inp = np.asarray(input_numel, dtype=np.float64)
    ratio = np.divide(g[:, 0] * g[:, 2] * g[:, 3], inp, out=np.zeros_like(inp), where=inp > 0)
    return known & np.asarray(is_conv, dtype=bool) & (ratio > 1.5)


def conv_taps(gemm: np.ndarray, input_numel: np.ndarray, is_conv: np.ndarray) -> np.ndarray:
    """(L,) filter taps (kh x kw) of each convolution, read from the recorded shapes (1 where unknown or not a conv):
    K x rows x groups / input elements = taps / stride^2 (``spatial_convs``), so the taps are that ratio where it is
    an odd square (stride 1: 1, 9, 25, 49), else 4x it where that is one (stride 2: 2.25 -> 9, 12.25 -> 49), else 1.
    'Same' padding at stride 2 on an odd side (7 -> 4) misses by a little: rounded to the nearest square."""
    gemm = np.asarray(gemm, dtype=np.float64)
    known = ~np.isnan(gemm).any(axis=1) & np.asarray(is_conv, dtype=bool)
    g = np.where(known[:, None], gemm, 0.0)
    inp = np.asarray(input_numel, dtype=np.float64)
    ratio = np.divide(g[:, 0] * g[:, 2] * g[:, 3], inp, out=np.zeros_like(inp), where=inp > 0)
    out = np.ones_like(ratio)
    for scale in (4.0, 1.0):  # stride 1 wins where both read as an odd square
        side = np.sqrt(np.maximum(ratio * scale, 0.0))
        odd = np.round(side)
        hit = (odd % 2 == 1) & (np.abs(side - odd) < 0.2 * odd) & (odd > 1)
        out = np.where(hit, odd ** 2, out)
    # the taps must divide the reduction depth (C_in per group x taps)
    ok = known & (np.mod(g[:, 2], out) == 0)
    return np.where(ok, out, 1.0)


def conv_padding(gemm, taps, element_bytes, n_tile: float, k_tile_bytes: float) -> np.ndarray:
    """(Kinds, L, 3) padded MACs / true MACs of a tensor-core implicit-GEMM convolution, per phase: tile arithmetic.

    cuDNN's implicit GEMMs walk the filter tap by tap, each tap's input channels in reduction steps of one MMA
    instruction's depth (32 bytes: 16 FP16 / 8 TF32 / 32 INT8 channels, ``k_tile_bytes``), and cover the output
    channels with tiles at least ``n_tile`` wide (the narrowest tensor-core tiles in the traced kernels' names, e.g.
    ``tilesize128x32x16``). A channel count that is not a whole number of them is padded: the kernel computes the
    padding's zeros at the full rate. Per phase (C_in, C_out per group):

    * fwd   (N = C_out, K = taps x C_in):   pad(C_out, n_tile) / C_out  x  pad(C_in, k_step) / C_in
    * dgrad (N = C_in,  K = taps x C_out):  pad(C_in, n_tile) / C_in  x  pad(C_out, k_step) / C_out
    * wgrad (M = C_out, N = taps x C_in, K = N H W):  pad(C_out, k_step) / C_out x pad(taps C_in, n_tile) / (taps C_in)

    Grouped convolutions (more than one group) are left at 1 (see below). ``element_bytes`` (Kinds, L, 3): the
    bytes per element of the tier each layer-phase runs on."""
    gemm = np.asarray(gemm, dtype=np.float64)
    taps = np.asarray(taps, dtype=np.float64)
    cout = np.maximum(gemm[:, 1], 1.0)[None, :]
    cin = np.maximum(gemm[:, 2] / taps, 1.0)[None, :]
    eb = np.asarray(element_bytes, dtype=np.float64)
    kstep = np.maximum(k_tile_bytes / np.maximum(eb, 1e-9), 1.0)           # (Kinds, L, 3)
    nt = max(float(n_tile), 1.0)

    def pad(c, t):
        return np.ceil(c / t) * t / c

    fwd = pad(cout, nt) * pad(cin, kstep[..., 0])
    dgrad = pad(cin, nt) * pad(cout, kstep[..., 1])
    wgrad = pad(cout, kstep[..., 2]) * pad(cin * taps[None, :], nt)
    out = np.stack([fwd, dgrad, wgrad], axis=-1)
    # grouped convolutions run cuDNN's grouped kernels, which pack several groups into a tile (a ResNeXt's 4-channel
    # groups are not padded to 64 each); no traced call measures how tightly: left unpadded
    return np.where((gemm[:, 0] > 1)[None, :, None], 1.0, out)


def gemm_times(gemm, is_conv, macs, samples, rate, tensor, fp32_rate, nbytes, bandwidth, sm_count, consts,
               channels_last: bool = False, winograd=None, winograd_rate: float | None = None,
               transform_bytes=None, peak_bandwidth: float | None = None, taps=None,
               element_bytes=None) -> np.ndarray:
    """Seconds of each layer-phase GEMM, (Kinds, L, 3).

    ``gemm`` (L, 5) the layers' forward GEMM shapes (NaN rows: no shape recorded, priced at the tier's rate as
    before); ``is_conv`` (L,); ``macs`` (Kinds, L, 3) executed MACs; ``samples`` (Kinds,); ``rate`` (Kinds, L, 3)
    the tier's MAC/s x its efficiency; ``tensor`` (Kinds, L, 3) whether that tier is a tensor-core one;
    ``fp32_rate`` the FP32 (CUDA-core) tier's MAC/s at peak; ``nbytes`` (Kinds, L, 3) DRAM bytes; ``bandwidth``
    achieved DRAM bytes/s; ``consts`` the fitted constants (``DEFAULTS``' keys). ``winograd`` (Kinds, L, 3) bools:
    the layer-phases that may run Winograd (``winograd_convs`` computed in FP32); ``winograd_rate`` the FP32 tier's
    achieved MAC/s (peak x efficiency), which runs them. ``transform_bytes`` (Kinds, L, 3): the activation bytes
    (input + output) an NCHW step's spatial tensor-core convolutions transform (0 elsewhere), at
    ``peak_bandwidth``."""
    c = {**DEFAULTS, **{k: v for k, v in consts.items() if v is not None}}
    gemm = np.asarray(gemm, dtype=np.float64)
    known = ~np.isnan(gemm).any(axis=1)                                   # (L,)
    g = np.where(known[:, None], gemm, 1.0)
    factor = tensor_core_rate_factor(g, samples, sm_count, c["gemm_n0"], c["gemm_k0"])
    layout = 1.0 if channels_last else np.where(np.asarray(is_conv, dtype=bool)[None, :, None] & tensor,
                                                c["nchw_conv_factor"], 1.0)
    shaped = np.where(known[None, :, None], factor, 1.0)
    factor = np.where(known[None, :, None], factor * layout, 1.0)
    compute = macs / np.maximum(rate * factor, 1e-30)
    if taps is not None and element_bytes is not None and (c["conv_n_tile"] > 1 or c["conv_k_tile_bytes"] > 0):
        # tensor-core convolutions compute their channel padding too (conv_padding)
        conv = (known & np.asarray(is_conv, dtype=bool))[None, :, None] & tensor
        pad = conv_padding(g, taps, element_bytes, c["conv_n_tile"], c["conv_k_tile_bytes"])
        compute = np.where(conv, compute * pad, compute)
    if winograd is not None and winograd_rate and np.any(winograd):
        wino = macs / WINOGRAD_MAC_REDUCTION / np.maximum(winograd_rate * shaped, 1e-30)
        compute = np.where(winograd, np.minimum(compute, wino), compute)
    memory = nbytes / bandwidth
    dw = (known & is_depthwise(g))[None, :, None]
    if dw.any():
        dw_rate = fp32_rate * c["depthwise_efficiency"] * (1.0 if channels_last else c["nchw_depthwise_factor"])
        compute = np.where(dw, macs / dw_rate, compute)
        memory = np.where(dw, nbytes / (bandwidth * c["depthwise_memory_efficiency"]), memory)
    t = np.maximum(compute, memory)
    if transform_bytes is not None and not channels_last and c["nchw_transform_bytes"] > 0 and peak_bandwidth:
        t = t + np.where(dw | ~tensor, 0.0, c["nchw_transform_bytes"] * transform_bytes / peak_bandwidth)
    return t


def nchw_batch_norm_seconds(shapes, samples, sm_count: float, clock_hz: float, rows_per_clock: float,
                            channels_per_sm: float) -> np.ndarray:
    """Seconds of an NCHW step's batch norms of one phase, from their shapes: cuDNN's NCHW kernels
    (``bn_fw_tr_1C11_kernel_NCHW``, ``bn_bw_1C11_kernel_new``) give each channel its own thread block, which walks
    that channel's N x H x W positions at ``rows_per_clock`` per clock; ``channels_per_sm`` x SMs channels are in
    flight at once. So a call takes ``N H W max(C, Cmax) / (Cmax rows_per_clock clock)``: a 10-channel norm takes as
    long as a 160-channel one -- why GhostNet, HRNet, MixNet and DLA (many narrow feature maps at high resolution)
    spend half their NCHW AMP step in batch norms, and 3-5x less in channels-last (a different kernel). Fitted per
    kernel on the lent H100 (bench_gpu_optrace.py: weighted median |log error| 0.065 forward, 0.022 backward).

    ``shapes``: [(positions per sample, channels, calls per step), ...]; ``samples``: (K,) batch sizes."""
    n = np.asarray(samples, dtype=np.float64)
    cmax = max(1.0, channels_per_sm * sm_count)
    rows = sum(p * k * max(c, cmax) / cmax for p, c, k in shapes)
    return n * rows / (rows_per_clock * clock_hz)

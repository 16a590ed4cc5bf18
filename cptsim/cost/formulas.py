"""The per-layer formulas of one training step: operand widths, BitOPs, bytes moved, quantizer element-passes.

Pure, vectorized functions over a profile's per-layer arrays (``cptsim.measure.profiler.ProfileArrays``: L layers x
the three phases fwd / dgrad / wgrad), for one step or for K step kinds at once. They know no hardware kind: a kind
passes in how it stores operands (``storage``) and the width its full-precision layers run at (``fp``), and prices
the result in its ``HardwareProfile.price_step``; ``cptsim.cost.model`` sums the steps of a run.

Operand widths per phase (DESIGN.md "Cost model"), in the order ``HardwareProfile.gemm_cost`` takes them:

    phase  GEMM                 operands (b1, b2)   BitOPs
    fwd    weight x activation  (b_w, b_a)           M_fwd   · b_w · b_a
    dgrad  error x weight       (b_g, b_w)           M_dgrad · b_g · b_w
    wgrad  error x activation   (b_g, b_a)           M_wgrad · b_g · b_a

Quantized layers run at b_w = b_a = q and b_g = g; full-precision layers at 32 on all three operands.
Relative-to-FP32 divides BitOPs by the same MACs at 32·32. AMP means AMP: on a GPU, a step whose GEMMs compute at
16 bits or less (``static:16`` is AMP) runs its full-precision layers -- the stem, the classifier, a downsample
conv -- on the FP16 tier too, as ``torch.autocast`` casts every conv and linear layer; that changes the GPU's
time, bytes and energy (``GPUProfile.full_precision_bits``), not the BitOPs, which keep those layers at 32.

Bytes moved per layer-phase (DRAM traffic; a simple, stated model -- no cache reuse across layers or phases):

    fwd    read weight (W·calls elements) at b_w, read input (I·batch) at b_a,   write output (O·batch) at 32
    dgrad  read error  (O·batch) at b_g,     read weight (W·calls) at b_w,      write input grad (I·batch) at 32
    wgrad  read error  (O·batch) at b_g,     read input  (I·batch) at b_a,      write weight grad (W·calls) at 32

A GPU's GEMMs write the forward output and the input gradient at the float width the step computes in
(``GPUProfile.storage_bits().output`` = ``GPUProfile.compute_bits``): 16 bits for FP16 GEMMs (AMP) and int GEMMs (an
int pipeline keeps its activations and errors in FP16, as its non-GEMM ops), 32 for FP32/TF32 GEMMs. On a GPU, the
step's other ops (batch norm, activations, optimizer...) and its kernel launches come from the profile's op list
(``GPUProfile.op_list_cost``), and so does the time of fused attention kernels (``F.scaled_dot_product_attention``):
their layer entries (type Matmul, ``sdpa``) count MACs and BitOPs everywhere, and GEMM time and energy only for the
share the op list does not price (``fused_attention_share``).

W = weight elements, I / O = input / output elements per sample (summed over the layer's calls). A weightless
layer -- attention's ``Matmul(a, b)``, ``scores = q·kᵀ`` and ``mix = att·v`` -- has its second operand (K, V) where
a layer has its weight: B elements per sample (``operand``), read at b_w in fwd and dgrad (stored like a weight:
quantized at q), and its gradient, written by wgrad (error x a), at the width outputs are written at. A phase with
0 MACs moves 0 bytes. Narrow operands are stored in the container the hardware computes them in (its
``HardwareProfile.storage_bits``): a GPU stores a b-bit tensor at its tier's width (5 bits -> int8 -> 1 byte; A100's
int4 tier packs 4-bit operands at 4 bits; FP32 GEMMs at 32), a fixed-width integer array at multiples of its width,
the host (fake quantization) always at 32, Bit Fusion and the bit-serial array packed at the operand width. Without
a hardware profile the operands are packed at their width (``packed_bits``). An accelerator writes outputs
(activations, input gradients) at its profile's ``output_bits``: 32 on Bit Fusion (its simulator's oprec), 16 on
Stripes (its 16-bit neuron storage), or "operand" -- the width the next GEMM reads them at.

A storage is a function bits -> stored bits; it may carry ``.output`` (bits of the GEMM -> the width its outputs are
written at; without it, 32) and ``.grad`` (the storage of gradient operands, where a float family gives them their
own format; without it, the storage itself).

A graph layer's sparse aggregation (type ``Aggregation``: out = A·X over the nnz edges of the propagation matrix,
``cptsim.measure.profiler.aggregation_macs``) is weightless; its BitOPs are those of the table above with its
features as the activation and A's per-edge values (GCN's normalisation, GAT's alpha) as the weight: FP32 (32 x 32)
unless quantized (``--quant-agg``: fwd q x q, dgrad g x q, wgrad -- GAT's gradient into alpha -- g x q, as attention's
matmuls). Fixed-point accelerators run its MACs at those widths as any other MACs. Its bytes are not a GEMM's but a
gather and a scatter's (``aggregation_bytes``), and a GPU prices it as memory-bound (``GPUProfile.aggregation_cost``).

Quantizer element-passes (costed only by the ``host`` kind, where fake quantization is real work):

    fwd    quantized layers with q < 32: input elements (I·batch) + weight elements (W·calls), or a Matmul's
           second operand (B·batch)
    back   quantized layers with g < 32: error elements (O·batch), quantized once per step and shared by both
           backward GEMMs, so attributed to dgrad -- or to wgrad for a layer without dgrad (the first layer)
"""

from __future__ import annotations

import numpy as np

from cptsim.measure.profiler import ProfileArrays
from .schedules import FULL_PRECISION

__all__ = ["INDEX_BITS", "aggregation_bytes", "bitops", "bytes_moved", "fused_attention_share", "layer_bits",
           "layer_bitops", "packed_bits", "phase_operands", "quant_elems"]

FP = FULL_PRECISION


def _col(x) -> np.ndarray:
    """Per-step-kind values (K,) -> (K, 1) so they broadcast against per-layer (L,) arrays; scalars stay 0-d."""
    a = np.asarray(x)
    return a[..., None] if a.ndim else a


def layer_bits(quantized: np.ndarray, q, g, fp=FP) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(b_w, b_a, b_g) per layer: quantized layers at (q, q, g), full-precision layers at ``fp`` (32; a GPU's time
    model runs them at 16 in an AMP step: ``GPUProfile.full_precision_bits``).

    ``q``, ``g`` (and ``fp``) scalars give (L,) arrays; arrays of K step kinds give (K, L).
    """
    quantized = np.asarray(quantized, dtype=bool)
    qc, gc, fc = _col(q), _col(g), _col(fp)
    b_w = np.where(quantized, qc, fc)
    b_g = np.where(quantized, gc, fc)
    return b_w, b_w, b_g


def phase_operands(quantized: np.ndarray, q, g, fp=FP) -> tuple[np.ndarray, np.ndarray]:
    """(b1, b2), each (..., L, 3): the operand widths of fwd (b_w, b_a), dgrad (b_g, b_w), wgrad (b_g, b_a)."""
    b_w, b_a, b_g = layer_bits(quantized, q, g, fp)
    return np.stack((b_w, b_g, b_g), axis=-1), np.stack((b_a, b_w, b_a), axis=-1)


def bitops(macs: np.ndarray, quantized: np.ndarray, q, g) -> np.ndarray:
    """BitOPs per layer and phase, (..., L, 3): fwd M·b_w·b_a, dgrad M·b_g·b_w, wgrad M·b_g·b_a.

    ``macs`` (L, 3) are the MACs the step executes (scale per-sample MACs by the batch first); the dtype follows
    ``macs`` (int64 stays exact, float64 for sums over long runs).
    """
    b1, b2 = phase_operands(quantized, q, g)
    return np.asarray(macs) * b1 * b2


def layer_bitops(macs: np.ndarray, quantized: np.ndarray, q: np.ndarray, g) -> np.ndarray:
    """``bitops`` of one step whose quantized layers run their own forward bits ``q`` (L,) (a per-layer plan):
    (L, 3) int64, the same formulas (fwd M·b_w·b_a, dgrad M·b_g·b_w, wgrad M·b_g·b_a)."""
    quantized = np.asarray(quantized, dtype=bool)
    b_w = np.where(quantized, np.asarray(q, dtype=np.int64), FP)
    b_g = np.where(quantized, np.int64(g), FP)
    b1, b2 = np.stack((b_w, b_g, b_g), axis=-1), np.stack((b_w, b_w, b_w), axis=-1)
    return (np.asarray(macs, dtype=np.int64) * b1 * b2).astype(np.int64)


def packed_bits(b):
    """The storage of hardware that packs operands at their own width (and of no hardware at all)."""
    return b


def bytes_moved(numel: np.ndarray, macs: np.ndarray, quantized: np.ndarray, q, g, batch, calls=None,
                storage=None, operand=None, fp=FP) -> np.ndarray:
    """DRAM bytes per layer and phase, (..., L, 3), under the model in the module docstring.

    ``numel`` (L, 3): weight total, input and output per sample; ``macs`` (L, 3) only marks which phases run;
    ``batch`` samples in the step (scalar or (K,)); ``calls`` (L,) calls per step (default 1); ``storage`` maps
    operand bits to stored bits (default: packed at the operand width; see ``storage_bits``); ``operand`` (L,):
    a weightless layer's second-operand elements per sample (``ProfileArrays.operand``; default none); ``fp``:
    the width full-precision layers run at (``layer_bits``).
    """
    store = storage or packed_bits
    numel = np.asarray(numel, dtype=np.float64)
    calls = np.ones(numel.shape[0]) if calls is None else np.asarray(calls, dtype=np.float64)
    b_w, b_a, b_g = layer_bits(quantized, q, g, fp)
    s_w, s_a, s_g = store(b_w), store(b_a), getattr(store, "grad", store)(b_g)
    n = _col(np.asarray(batch, dtype=np.float64))
    w = numel[:, 0] * calls
    i = numel[:, 1] * n
    o = numel[:, 2] * n
    # Outputs (activations, input gradients) at 32 bits, unless the storage says the hardware writes them at the
    # width its GEMM computes in (``store.output``: a GPU writes FP16 outputs under AMP); weight gradients at 32.
    out = getattr(store, "output", None)
    o_fwd = FP if out is None else out(np.maximum(b_w, b_a))
    i_dgrad = FP if out is None else out(np.maximum(b_g, b_w))
    # a Matmul's second operand b: read like a weight by fwd (a·b) and dgrad (error·bᵀ), its gradient (aᵀ·error)
    # written by wgrad like an activation gradient
    b = 0.0 if operand is None else np.asarray(operand, dtype=np.float64) * n
    b_grad = FP if out is None else out(np.maximum(b_g, b_a))
    bits = np.stack((w * s_w + b * s_w + i * s_a + o * o_fwd,
                     o * s_g + w * s_w + b * s_w + i * i_dgrad,
                     o * s_g + i * s_a + w * FP + b * b_grad), axis=-1)
    return np.where(np.asarray(macs) > 0, bits / 8.0, 0.0)


INDEX_BITS = 64  # an edge_index entry: int64


def aggregation_bytes(numel: np.ndarray, macs: np.ndarray, quantized: np.ndarray, q, g, batch, edges,
                      operand=None, storage=None, fp=FP) -> np.ndarray:
    """DRAM bytes of graph aggregation layers' phases, (..., L, 3): a gather and a scatter, not a GEMM.

    Per layer and phase, in a step of ``batch`` graphs: P = the phase's MACs (message elements: nnz x width,
    summed over calls), Z = nnz (``edges`` per sample), I / O = the source / result node-feature elements
    (``numel`` input / output), V = A's per-edge values (``operand``: 0 for SAGE's plain sum, nnz for GCN,
    nnz x heads for GAT). Widths: the features at b_a, the error at b_g, the values at b_w, stored as the hardware
    stores them (``storage``); the messages and results at the width the phase writes outputs at (m: ``storage
    .output``, else 32); each index entry at ``INDEX_BITS``. The model is PyG's execution for an ``edge_index``:
    messages materialised between the gather and the scatter (``MessagePassing.propagate``: message, aggregate)::

        fwd   = P·b_a  +  2·P·m  +  [V > 0]·(2·P·m + V·b_w)  +  O·m  +  2·Z·64
                gather    messages    weighting pass             result  source and target indices
                (each edge's source row; written by the gather, read by the scatter; the weighting pass reads
                and rewrites them with the edge values)
        dgrad = P·b_g  +  2·P·m  +  [V > 0]·(2·P·m + V·b_w)  +  I·m  +  2·Z·64
                the same through Aᵀ: each edge gathers its target's error row, the scatter writes the input gradient
        wgrad = P·b_g  +  P·b_a  +  V·32  +  2·Z·64
                the gradient into A's values (GAT's alpha): each edge's error row against its source row

    in bits (returned /8). A phase with 0 MACs moves 0 bytes. A fused sparse kernel (cuSPARSE SpMM, PyG's path
    for a sparse adjacency) would skip the materialised messages: about P·b_a + O·m + the indices in forward.

    The edge values of an aggregation left unquantized are FP32 whatever the step's width (b_v = 32; quantized:
    b_w): GCN's normalisation is computed from the FP32 input's dtype before the transform, GAT's softmax is one of
    autocast's FP32 ops. Weighting 16-bit messages by them promotes the messages, the scatter and the result to
    32 bits (torch's type promotion), so an AMP step's weighted aggregation moves FP32 bytes: on our H100 a GCN
    step on an ogbn-arxiv-sized graph took 89 ms under AMP and 86 ms in FP32 (benchmarks/results/
    gpu-heldout-graphs-H100.json). Above, the weighting pass then writes, and the scatter and the result
    use, m_v = max(m, b_v).
    """
    store = storage or packed_bits
    numel = np.asarray(numel, dtype=np.float64)
    macs = np.asarray(macs, dtype=np.float64)
    n = _col(np.asarray(batch, dtype=np.float64))
    b_w, b_a, b_g = layer_bits(quantized, q, g, fp)
    s_a, s_g = store(b_a), getattr(store, "grad", store)(b_g)
    out = getattr(store, "output", None)
    m_f = FP if out is None else out(np.maximum(b_w, b_a))
    m_d = FP if out is None else out(np.maximum(b_g, b_w))
    z = np.asarray(edges, dtype=np.float64) * n
    v = (0.0 if operand is None else np.asarray(operand, dtype=np.float64)) * n
    has_v = np.asarray(v) > 0
    i, o = numel[:, 1] * n, numel[:, 2] * n
    p_f, p_d, p_w = macs[:, 0] * n, macs[:, 1] * n, macs[:, 2] * n
    idx = 2.0 * z * INDEX_BITS
    b_v = np.where(np.asarray(quantized, dtype=bool), b_w, FP)      # the edge values: FP32 unless quantized
    s_v = store(b_v)
    m_fv = np.where(has_v, np.maximum(m_f, b_v), m_f)              # weighted messages: promoted to the values'
    m_dv = np.where(has_v, np.maximum(m_d, b_v), m_d)
    fwd = p_f * s_a + p_f * m_f + np.where(has_v, p_f * m_f + v * s_v + p_f * m_fv, 0.0) + p_f * m_fv + o * m_fv + idx
    dgrad = p_d * s_g + p_d * m_d + np.where(has_v, p_d * m_d + v * s_v + p_d * m_dv, 0.0) + p_d * m_dv + i * m_dv + idx
    wgrad = p_w * s_g + p_w * s_a + v * FP + idx
    fwd, dgrad, wgrad = np.broadcast_arrays(fwd, dgrad, wgrad)
    bits = np.stack((fwd, dgrad, wgrad), axis=-1)
    return np.where(macs > 0, bits / 8.0, 0.0)


def quant_elems(numel: np.ndarray, macs: np.ndarray, quantized: np.ndarray, q, g, batch, calls=None,
                operand=None) -> np.ndarray:
    """Quantizer element-passes per layer and phase, (..., L, 3) (the model in the module docstring); a
    weightless layer's second operand (``operand``, per sample) is quantized in fwd as its input is."""
    numel = np.asarray(numel, dtype=np.float64)
    macs = np.asarray(macs)
    quantized = np.asarray(quantized, dtype=bool)
    calls = np.ones(numel.shape[0]) if calls is None else np.asarray(calls, dtype=np.float64)
    n = _col(np.asarray(batch, dtype=np.float64))
    b = 0.0 if operand is None else np.asarray(operand, dtype=np.float64) * n
    fwd = np.where(quantized & (_col(q) < FP) & (macs[:, 0] > 0), numel[:, 1] * n + b + numel[:, 0] * calls, 0.0)
    back = np.where(quantized & (_col(g) < FP), numel[:, 2] * n, 0.0)
    has_d, has_w = macs[:, 1] > 0, macs[:, 2] > 0
    dgrad = np.where(has_d, back, 0.0)
    wgrad = np.where(~has_d & has_w, back, 0.0)
    fwd, dgrad, wgrad = np.broadcast_arrays(fwd, dgrad, wgrad)
    return np.stack((fwd, dgrad, wgrad), axis=-1)


def fused_attention_share(a: ProfileArrays) -> float:
    """The share, 0..1, of the MACs of a profile's ``F.scaled_dot_product_attention`` entries (``a.sdpa``, type
    Matmul: ``cptsim.measure.profiler``) that its op list holds as fused attention kernels (kind ``attention``,
    forward MACs). Hardware that prices the op list (a GPU: ``step_ops_cost``) prices those kernels from it, from
    their own MACs and bytes, so the entries' GEMM time and energy are counted only for the rest: all of it where
    the profiling device ran SDPA as plain matmuls (no attention kernel in the op list), none where every call ran
    fused. Their MACs and BitOPs are counted in full on every hardware. 0 without an op list or such entries."""
    sd, ops = a.sdpa, a.ops
    if sd is None or ops is None or not np.any(sd):
        return 0.0
    mine = float(a.macs[sd, 0].sum())
    if mine <= 0:
        return 0.0
    fused = float(ops.summary()["fwd"].get("attention_macs_per_sample", 0.0))
    return min(1.0, fused / mine)

"""How a training step's layers map onto an accelerator's array: one ``tiling.Problem`` per layer and phase.

Pure functions of a profile's arrays (``cptsim.measure.profiler.ProfileArrays``) and the phase's operand widths;
the search itself is ``tiling.search``. The roles: the *input* operand streams through the input buffer (its tile
carries a halo), the *weight-side* operand sits in the weight buffer and is reused across batch and positions, the
outputs are partial sums that live in the output buffer. The reduction goes on the array's rows, packed by the
kind's law (``pf``); output channels go on its columns.

Convolutions (``ProfileArrays.conv``: kernel, stride, input and output sizes; channels and groups from ``gemm``):

* forward: input = activations (b_a), weight side = weights (b_w); reduction over input channels (rows) x taps
  (in time); outputs = output channels (columns) x positions. With ``dataflow = "im2col-first"`` a layer whose
  input needs no gradient (the first) folds the taps into the reduction (im2col), as the Bit Fusion authors run a
  first layer; ``"im2col"`` does it for every layer, ``"channels"`` for none (DNNsim's Stripes). A grouped
  convolution is ``groups`` convolutions of its per-group channels, one after another.
* dgrad: a convolution of the error (b_g, the input operand) with the weights (b_w) whose reduction is over output
  channels x taps and whose outputs are the input channels. A stride-s layer's dgrad is min(s, k)^2 stride-1
  sub-convolutions over the output grid (one per phase of the stride), each with k^2 / min(s, k)^2 taps and a halo
  of ceil(k / s): the same MACs as the forward pass, none spent on the zeros a transposed convolution inserts.
* wgrad: a GEMM whose reduction is batch x output positions (rows) and whose outputs are the weight's elements:
  output channels on the columns with the im2col'd input as the streamed operand, or input channels x taps on the
  columns with the error streamed -- whichever the array runs faster. Weight gradients are written at 32 bits.

Linear layers and attention's matmuls are GEMMs of their recorded shapes (``gemm``): forward rows x k -> n,
dgrad rows x n -> k, wgrad k x rows -> n (an attention matmul's wgrad once per head and sequence). A graph
aggregation is, per node, a GEMM of its (average) degree of edge values by the neighbours' features: no reuse
across nodes, as a gather has none. A layer without a recorded shape is left to the caller (None).

A profile written before convolutions recorded their geometry prices a convolution as its im2col GEMM.
"""

from __future__ import annotations

import math

import numpy as np

from .tiling import Problem

FP_BITS = 32


def _conv_geometry(a, l):
    """(kh, kw, sh, sw, Ho, Wo) of layer l, or None."""
    conv = getattr(a, "conv", None)
    if conv is None or np.isnan(conv[l, 0]):
        return None
    kh, kw, sh, sw, _, _, ho, wo = (float(x) for x in conv[l])
    return kh, kw, sh, sw, ho, wo


def _gemm(a, l):
    g = getattr(a, "gemm", None)
    if g is None or np.isnan(g[l, 0]):
        return None
    groups, n, k, rows, rpg = (float(x) for x in g[l])
    return groups, n, k, rows, rpg


def _gemm_problem(batch, red, cols, pf, in_bits, weight_bits, out_bits) -> Problem:
    """A GEMM as a 1 x 1 convolution of a 1 x 1 output: ``batch`` rows, each reducing ``red`` products into ``cols``
    outputs (how the Bit Fusion authors price a fully connected layer)."""
    return Problem(batch, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, red, cols, pf, in_bits, weight_bits, out_bits, False)


def problem_alternatives(a, l, phase, samples, act_bits, wgt_bits, pf, out_bits, dataflow="im2col-first"):
    """The mappings layer ``l``'s ``phase`` (0 fwd, 1 dgrad, 2 wgrad) of a step of ``samples`` samples may run
    as: a list of alternatives, each a list of (times it runs, Problem); the caller prices each alternative and
    keeps the fastest. None when the profile recorded no shape for the layer.

    ``act_bits``/``wgt_bits``: stored widths of the phase's input-side and weight-side operands (fwd: b_a, b_w;
    dgrad: b_g, b_w; wgrad: b_a, b_g); ``pf``: reduction elements per row per cycle at the phase's widths;
    ``out_bits``: the width partial outputs travel at; ``dataflow``: "channels", "im2col-first" or "im2col"."""
    im2col_all = dataflow == "im2col"
    agg = getattr(a, "aggregation", None)
    calls = float(a.calls[l]) if a.calls is not None else 1.0
    g = _gemm(a, l)
    if agg is not None and agg[l]:
        edges = float(a.edges[l]) if a.edges is not None else 0.0
        width = float(a.macs[l, 0]) / edges if edges > 0 else 0.0
        nodes = float(a.numel[l, 2]) / width if width > 0 else 0.0
        if edges <= 0 or nodes <= 0:
            return None
        deg = math.ceil(edges / nodes)
        p = _gemm_problem(1.0, float(deg), round(width), pf, act_bits, wgt_bits, out_bits if phase < 2 else FP_BITS)
        return [[(samples * nodes, p)]]
    geo = _conv_geometry(a, l)
    if geo is not None and g is not None:
        kh, kw, sh, sw, ho, wo = geo
        groups, n, k, _, _ = g
        oc, taps = n, kh * kw
        ic = k / taps
        first = dataflow == "im2col-first" and float(a.macs[l, 1]) == 0.0
        b = samples * calls
        if phase == 0:
            p = Problem(b, ho, wo, kh, kw, sh, taps, ic, oc, pf, act_bits, wgt_bits, out_bits, first or im2col_all)
            return [[(groups, p)]]
        if phase == 1:
            ph = min(sh, kh) * min(sw, kw)
            p = Problem(b * ph, ho, wo, math.ceil(kh / sh), math.ceil(kw / sw), 1.0, taps / ph, oc, ic, pf,
                        act_bits, wgt_bits, out_bits, im2col_all)
            return [[(groups, p)]]
        red = b * ho * wo
        return [[(groups, _gemm_problem(ic * taps, red, oc, pf, act_bits, wgt_bits, FP_BITS))],
                [(groups, _gemm_problem(oc, red, ic * taps, pf, wgt_bits, act_bits, FP_BITS))]]
    if g is None:
        return None
    groups, n, k, rows, rpg = g
    m = samples * rows  # rows per sample, summed over calls
    if m <= 0:
        return None
    if phase == 0:
        return [[(groups, _gemm_problem(m, k, n, pf, act_bits, wgt_bits, out_bits))]]
    if phase == 1:
        return [[(groups, _gemm_problem(m, n, k, pf, act_bits, wgt_bits, out_bits))]]
    if rpg > 0:  # attention: one GEMM per (batch, head); each reduces over its own sequence
        count, red = m / rpg, rpg
    else:
        count, red = 1.0, m
    return [[(groups * count, _gemm_problem(k, red, n, pf, act_bits, wgt_bits, FP_BITS))],
            [(groups * count, _gemm_problem(n, red, k, pf, wgt_bits, act_bits, FP_BITS))]]

"""Recurrent and attention layers for language models, built so that cptsim's quantization and profiler see them.

Nothing here knows about bits except ``QMatmul``: the LSTM and the Transformer block are made of ordinary
``nn.Linear`` modules (and ``Matmul`` for attention's two activation-by-activation products), and
``cptsim.numerics.layers.quantize_model`` swaps them in place exactly as it swaps a CNN's layers, all sharing one
``PrecisionState``. So the gate GEMMs of the LSTM are quantized exactly like ``QLinear`` (weights per output
channel, inputs per tensor, errors stochastically rounded in backward), and full-precision patterns
(``--fp-layers``) name them like any other layer.

LSTM. ``LSTMLayer`` runs the recurrence step by step: gates_t = hh(h_{t-1}) + ih(x)_t. The hidden-to-hidden
``nn.Linear`` is called once per time step, so the profiler sees (and counts the MACs of) one call per step and each
call quantizes its own input (the range of that step's h); the input-to-hidden ``nn.Linear`` runs once over the
whole (T, B, F) sequence - the recurrence does not feed it - so its activation range is the sequence's and its
MACs are the sum of the T per-step GEMMs. At 32 bits this is the same arithmetic, in the same order, as PyTorch's
native CPU LSTM (``aten/src/ATen/native/RNN.cpp``: FullLayer's one ``linear_ih`` over the sequence, LSTMCell's
``linear_hh(hx).add_(...)``): the test checks bit-for-bit equality with ``torch.nn.LSTM`` given the same weights
(with oneDNN off; PyTorch's oneDNN LSTM, its CPU default, differs from its own native path by ~1 ulp).

Attention. ``CausalSelfAttention`` has QLinear-able q, k, v and output projections; its two products of
activations - scores = q·kᵀ and the weighted values p·v (p the softmax of the scores) - are ``Matmul`` modules,
which the profiler counts with their own MACs (B·heads·T·T·d each) and ``quantize_model`` turns into ``QMatmul``.
What they cost, and why:

* **Quantized, both operands at the forward precision q.** ``QMatmul`` fake-quantizes each operand per tensor
  (min/max, round to nearest, the running range in eval: the rule for every activation input) and the error at
  the gradient precision g with stochastic rounding, like a quantized layer. So in BitOPs the forward counts
  M·q·q, the gradient w.r.t. the first operand (cptsim's ``dgrad`` column) M·g·q and the gradient w.r.t. the
  second (the ``wgrad`` column) M·g·q - the same formula as a layer whose "weight" is an activation at q bits.
  The softmax, the scaling and the mask stay FP32.
* What CPT did: its public code (github.com/GATECH-EIC/CPT) holds only ``cpt_cifar`` and ``cpt_imagenet``
  (Conv2d/Linear quantizers from SBM); the Transformer of the paper's WikiText-103 row is not in it, so there is
  nothing to copy for attention. Quantizing the two matmuls at the same q as every other GEMM is the reading under
  which "all GEMMs at q_t" - the paper's description of its cost - holds, and it keeps the BitOPs accounting honest
  (an FP32 attention would make a cyclic schedule look cheaper than it is at large T).
* Who wants them in FP32 names them: ``--fp-layers '*.scores' '*.mix'`` (then they count at 32 bits).
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from .layers import (ACT_MOMENTUM, PrecisionState, _QuantError, _QuantInput, register_quantized,
                     reuse_quantized_weights)
from .formats import QuantFormatSTE, quantize_error
from .quant import FULL_PRECISION

__all__ = ["LSTMLayer", "Matmul", "QMatmul", "CausalSelfAttention", "TransformerBlock", "matmul_macs"]


# ------------------------------------------------------------------------------------------------------- LSTM


class LSTMLayer(nn.Module):
    """One LSTM layer over a time-major sequence (T, B, F), run step by step through two Linear layers.

    Gate order i, f, g, o and two biases, as ``torch.nn.LSTM`` (its ``weight_ih_l0`` is ``ih.weight``,
    ``weight_hh_l0`` is ``hh.weight``, and so on).
    """

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.ih = nn.Linear(input_size, 4 * hidden_size)
        self.hh = nn.Linear(hidden_size, 4 * hidden_size)

    def zero_state(self, batch: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = like.new_zeros(batch, self.hidden_size)
        return z, z

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None):
        h, c = state if state is not None else self.zero_state(x.shape[1], x)
        # The input projection does not depend on the recurrence: one GEMM over all T steps (RNN.cpp's FullLayer
        # does the same; per-step GEMMs of B rows round differently, by an ulp). The profiler counts its MACs, the
        # sum of the T per-step GEMMs, as one call.
        x_gates = self.ih(x)
        outputs = []
        # hh is called (and counted, and its input quantized) once per time step, but its weight is the same
        # at every step: quantized once per forward (cptsim.numerics.layers.reuse_quantized_weights), not T times.
        with reuse_quantized_weights(self.hh):
            for t in range(x.shape[0]):
                # The order of RNN.cpp's LSTMCell: linear_hh(hx) + linear_ih(input), then the gate nonlinearities.
                gates = self.hh(h) + x_gates[t]
                i, f, g, o = gates.chunk(4, 1)
                i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
                c = f * c + i * g
                h = o * c.tanh()
                outputs.append(h)
        return torch.stack(outputs), (h, c)


# ------------------------------------------------------------------------------------------------------- attention


class Matmul(nn.Module):
    """``a @ b`` of two activations, as a module so the profiler counts it and quantize_model can swap it."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


class QMatmul(Matmul):
    """Matmul at the shared precision: both operands per tensor at q (straight-through), the error at g (SR).

    The two operands keep separate running ranges for eval (``act_lo/hi`` for a, ``b_lo/hi`` for b) under one
    ``act_count``, so BatchNorm re-estimation (which zeroes ``act_count``) re-estimates both.
    """

    precision: PrecisionState

    def _init_quant(self, precision: PrecisionState) -> None:
        self.precision = precision
        for name in ("act_lo", "act_hi", "b_lo", "b_hi"):
            self.register_buffer(name, torch.zeros(()))
        self.register_buffer("act_count", torch.zeros((), dtype=torch.long))

    def _range(self, x: torch.Tensor, lo_name: str, hi_name: str, first: torch.Tensor):
        lo, hi = torch.aminmax(x.detach())
        run_lo, run_hi = getattr(self, lo_name), getattr(self, hi_name)
        if self.training:
            with torch.no_grad():
                run_lo.copy_(torch.where(first, lo, torch.add(run_lo * ACT_MOMENTUM, lo, alpha=1 - ACT_MOMENTUM)))
                run_hi.copy_(torch.where(first, hi, torch.add(run_hi * ACT_MOMENTUM, hi, alpha=1 - ACT_MOMENTUM)))
            return lo, hi
        return torch.where(first, lo, run_lo), torch.where(first, hi, run_hi)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        bits = self.precision.bits
        fmt = self.precision.forward_format()
        if fmt is not None:
            # a float format: a's reduction is its last dimension, b's its second to last (MX / NVFP4 blocks run
            # along them); scaled by each operand's own amax, in eval too (current scaling)
            a = QuantFormatSTE.apply(a, fmt, -1)
            b = QuantFormatSTE.apply(b, fmt, -2)
        elif bits != FULL_PRECISION:
            first = self.act_count == 0
            a = _QuantInput.apply(a, *self._range(a, "act_lo", "act_hi", first), bits)
            b = _QuantInput.apply(b, *self._range(b, "b_lo", "b_hi", first), bits)
            if self.training:
                with torch.no_grad():
                    self.act_count += 1
        y = torch.matmul(a, b)
        g = self.precision.grad_bits
        if g == FULL_PRECISION or not (torch.is_grad_enabled() and y.requires_grad):
            return y
        gfmt = self.precision.gradient_format()
        if gfmt is not None:  # the error of a @ b in the gradient format, blocks along its last dimension
            y.register_hook(partial(quantize_error, fmt=gfmt, dim=-1))
            return y
        return _QuantError.apply(y, g)


register_quantized(Matmul, QMatmul)


def matmul_macs(module: nn.Module, a: torch.Tensor, output: torch.Tensor) -> int:
    """Each output element of a @ b is one dot product of a.shape[-1] terms (batch dims broadcast)."""
    return output.numel() * a.shape[-1]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: Linear q/k/v/out, ``scores`` = q·kᵀ and ``mix`` = softmax·v as Matmuls."""

    def __init__(self, width: int, heads: int, context: int, dropout: float = 0.0):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of heads {heads}")
        self.heads = heads
        self.q, self.k, self.v = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, width)
        self.scores, self.mix = Matmul(), Matmul()
        self.out = nn.Linear(width, width)
        self.drop = nn.Dropout(dropout)
        self.register_buffer("mask", torch.ones(context, context, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        d = C // self.heads

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(B, T, self.heads, d).transpose(1, 2)  # (B, h, T, d)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        att = self.scores(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        att = self.drop(F.softmax(att, dim=-1))
        y = self.mix(att, v).transpose(1, 2).reshape(B, T, C)
        return self.drop(self.out(y))


class TransformerBlock(nn.Module):
    """Pre-LayerNorm GPT block: x + attn(ln1(x)), then x + mlp(ln2(x)) with a 4x GELU MLP (fc1, fc2)."""

    def __init__(self, width: int, heads: int, context: int, dropout: float = 0.0):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, context, dropout)
        self.ln2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))

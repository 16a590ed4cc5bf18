"""Memory layouts element-wise quantizers can walk in storage order: shared by the eager/compiled quantizers
(``cptsim.numerics.quant``) and the Triton kernels (``cptsim.numerics.kernels``), which import it without importing
each other."""

from __future__ import annotations

import torch


def dense(x: torch.Tensor) -> bool:
    """Non-overlapping and dense: the elements fill ``x.numel()`` consecutive places in some order (contiguous,
    channels_last, a transpose), which element-wise code may walk in storage order; ``torch.empty_like`` gives
    such a tensor's strides to its output, as the eager formula's first op does."""
    if x.is_contiguous():
        return True
    expected = 1
    for size, stride in sorted(zip(x.shape, x.stride()), key=lambda d: d[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def rows_contiguous(w: torch.Tensor) -> bool:
    """Each output channel (dimension 0) fills one stretch of memory, channel after channel: contiguous and
    channels_last weights (the order inside a channel does not matter to its range or to an element-wise pass)."""
    return w.dim() <= 1 or (dense(w) and (w.shape[0] == 1 or w.stride(0) * w.shape[0] == w.numel()))

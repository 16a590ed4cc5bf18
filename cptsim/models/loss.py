"""The training loss over a model's logits, one function for the training loop and the op counter that counts it.

Sequence and graph models return logits laid out (B, C, *rest) -- the class dimension second, as ``F.cross_entropy``
takes them -- usually as a transposed view of the head's contiguous (B, *rest, C) output. Handed to
``F.cross_entropy`` in that layout, its log-softmax reduces over a strided dimension: on the lent H100 a
transformer-lm's (64, 10000, 256) logits took 12.0 ms forward and 5.7 ms backward in PyTorch's spatial softmax kernel
(``cunn_SpatialSoftMaxForward``), 40% of its AMP step's GPU time (benchmarks/results/gpu-optrace-H100/
trace-transformer-lm-6x512-amp.json.gz), where the same values as contiguous rows are one bandwidth-bound pass; on
this CPU the loss and its backward take half the time as rows (32 x 64 tokens x 2000 classes: 23 vs 42-57 ms).
So the loss is computed on the rows (B * rest, C) -- for a transposed view ``movedim(1, -1)`` is the contiguous
original and ``reshape`` copies nothing -- with the same value (the same terms; a sum in another order).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def class_cross_entropy(logits: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """``F.cross_entropy(logits, target, reduction=reduction)`` for logits (B, C, *rest) and labels (B, *rest)
    (ignore_index -100 kept), computed over rows (B * rest, C)."""
    if logits.dim() <= 2:
        return F.cross_entropy(logits, target, reduction=reduction)
    c = logits.shape[1]
    return F.cross_entropy(logits.movedim(1, -1).reshape(-1, c), target.reshape(-1), reduction=reduction)

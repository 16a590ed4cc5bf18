"""CUDA graphs for the training step: its forward, loss and backward replayed as one graph (``cptsim.run.train``).

Why: a quantized ResNet-20 step at batch 128 is a few hundred kernels of a few microseconds each. Launched one by
one from Python (dispatch, autograd, the quantizers' compiled wrappers) such a step took 2.9x the FP32 one on an
H200 -- the host's time, not the GPU's (benchmarks/results/gpu_check_H200.txt). A captured graph launches them all
with one call, so the step costs what its kernels cost on the GPU.

What a graph fixes at capture, and how the loop lives with it:

* the input's shape and every Python decision the forward makes (the bits each quantizer uses, which layers
  quantize): one graph per (batch shape, bits, grad bits). A key runs eagerly the first ``WARMUP`` times it occurs
  (which compiles the fused quantizers and creates lazily made state, on the stream the capture will use) and is
  captured the next time; a capture records without running, so the step is then computed by the graph's first
  replay;
* the addresses of what it reads and writes: the batch is copied into the graph's own input tensors; parameters,
  BatchNorm statistics and activation ranges are read and updated in place (training, evaluation and checkpoint
  loading never replace them, they copy into them);
* gradients: captured with every ``param.grad`` unset, the backward writes each gradient into a tensor of the
  graph; after each replay ``param.grad`` points at it again. The optimizer step stays outside the graph (its
  learning rate changes every step) and runs eagerly;
* forward hooks do not run on replay: the MAC counts of a replayed step are those its key recorded at capture;
* randomness (stochastic rounding) draws from torch's CUDA generator, which advances on every replay as it would
  eagerly.

Graphs share one memory pool: each replay's outputs (the totals, the gradients) are consumed -- read, and used by
the optimizer step -- before another graph runs. A failed capture turns graphs off for the rest of the run with one
warning; the step then runs eagerly, as it always does on a CPU, with several processes, or with
CPTSIM_CUDA_GRAPHS=0.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch

WARMUP = 1        # eager runs of a key before it is captured
MAX_GRAPHS = 24   # a schedule's (bits, grad bits) pairs x batch shapes; past this, new keys run eagerly


def graphs_enabled() -> bool:
    """CUDA graphs for single-process CUDA training are on unless CPTSIM_CUDA_GRAPHS=0 (benchmarks compare both)."""
    return os.environ.get("CPTSIM_CUDA_GRAPHS", "1") != "0"


@dataclass
class _Graph:
    graph: "torch.cuda.CUDAGraph"
    x: torch.Tensor
    y: torch.Tensor
    stats: torch.Tensor
    grads: list
    arrays: object  # the MAC counter's arrays of the captured step


class GraphedSteps:
    """Runs ``fn(x, y) -> stats`` (forward, loss, backward of one batch; gradients into ``param.grad``) eagerly,
    captured, or replayed. ``step`` returns (stats, the counter's arrays for this step, warm-up?): warm-up steps are
    those that ran eagerly to prepare a capture or captured one; their time is not the step's steady-state time."""

    def __init__(self, params: list, counter, warmup: int = WARMUP, max_graphs: int = MAX_GRAPHS):
        self.params = params
        self.counter = counter
        self.warmup = warmup
        self.max_graphs = max_graphs
        self.graphs: dict = {}
        self.seen: Counter = Counter()
        self.failed: str | None = None
        self.stream = torch.cuda.Stream()
        self.pool = torch.cuda.graph_pool_handle()
        self.captured = 0

    def step(self, fn: Callable, x: torch.Tensor, y: torch.Tensor, key: tuple, on_capture: Callable = lambda: None):
        key = (tuple(x.shape), x.dtype, x.is_contiguous(memory_format=torch.channels_last), tuple(y.shape), *key)
        g = self.graphs.get(key)
        if g is not None:
            g.x.copy_(x)
            g.y.copy_(y)
            g.graph.replay()
            for p, t in zip(self.params, g.grads):
                if p.grad is not t:
                    p.grad = t
            return g.stats, g.arrays, False
        if self.failed is None and self.seen[key] >= self.warmup and len(self.graphs) < self.max_graphs:
            on_capture()
            g = self._capture(fn, x, y, key)
            if g is not None:
                g.graph.replay()
                return g.stats, g.arrays, True
        self.seen[key] += 1
        # eager, on the capture stream: whatever a first call creates lazily (cuBLAS workspaces, compiled kernels)
        # then exists for that stream before anything is captured on it
        s, cur = self.stream, torch.cuda.current_stream()
        s.wait_stream(cur)
        with torch.cuda.stream(s):
            stats = fn(x, y)
        cur.wait_stream(s)
        return stats, None, True

    def _capture(self, fn, x, y, key) -> _Graph | None:
        old = [p.grad for p in self.params]
        sx, sy = x.clone(), y.clone()
        try:
            for p in self.params:
                p.grad = None  # the captured backward then writes the gradients into tensors of the graph
            self.counter.reset()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                stats = fn(sx, sy)
            g = _Graph(graph, sx, sy, stats, [p.grad for p in self.params], self.counter.step_arrays())
        except Exception as e:  # an op that cannot be captured, out of memory, a driver without graphs: run eagerly
            for p, t in zip(self.params, old):
                p.grad = t
            self.failed = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            warnings.warn(f"cptsim: CUDA graph capture failed ({self.failed}); training steps run eagerly from here",
                          RuntimeWarning, stacklevel=3)
            self.counter.reset()
            return None
        self.graphs[key] = g
        self.captured += 1
        return g

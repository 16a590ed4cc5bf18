"""The ``host`` kind: the machine cptsim runs on, with rates measured by ``cptsim hw calibrate``."""

from __future__ import annotations

import numpy as np

from .base import Field, HardwareProfile, register


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

    def _throughput(self, b1, b2):
        return np.full(np.shape(b1), self._mac_rate * self._ceff)

    def time_components(self, macs, bytes_moved, quant_elems) -> np.ndarray:
        """Uncalibrated seconds per term (..., 4): compute, memory, element-wise, overhead."""
        return host_time_components(macs, self._mac_rate, bytes_moved, self._bandwidth, quant_elems,
                                    self._elem_rate, self._overhead_s)

    def factors(self) -> np.ndarray:
        """What this profile's calibration multiplies each term by (compute and memory efficiencies)."""
        return np.array([1.0 / self._ceff, 1.0 / self._meff, 1.0, 1.0])

    def _cost(self, macs, b1, b2, bytes_moved, quant_elems):
        t = self.time_components(macs, bytes_moved, quant_elems) @ self.factors()
        return t, self.params["power_w"] * t

    def describe_bits(self, b1: int, b2: int) -> str:
        return "fp32 (fake-quant)"

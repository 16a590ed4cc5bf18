"""The ``bit-serial`` kind (Stripes, Judd et al., MICRO 2016): time proportional to the width of the serial operand."""

from __future__ import annotations

import numpy as np

from .base import _PJ, Field, _AcceleratorProfile, register


def bit_serial_lane_cycles_per_mac(b_parallel, b_serial, parallel_bits=16, serial_bits_per_cycle=1):
    """Lane-cycles one MAC occupies on a bit-serial array: ``ceil(b_parallel / P) * ceil(b_serial / s)``.

    Stripes (Judd et al., MICRO 2016): each lane holds a P-bit (16) parallel operand and consumes the other operand
    ``s`` (1) bit per cycle, so run time scales with the serial operand's width. A parallel operand wider than P
    (a 32-bit full-precision one) takes ``ceil(b / P)`` passes.
    """
    par = np.ceil(np.asarray(b_parallel, dtype=np.float64) / parallel_bits)
    ser = np.ceil(np.asarray(b_serial, dtype=np.float64) / serial_bits_per_cycle)
    return par * ser


@register
class BitSerialProfile(_AcceleratorProfile):
    """``bit-serial`` (Stripes-like, Judd et al., MICRO 2016): time proportional to the serial operand's width.

    MACs per cycle = lanes / bit_serial_lane_cycles_per_mac(b1, b2)
    core energy    = pj_per_lane_cycle x macs x bit_serial_lane_cycles_per_mac(b1, b2)

    ``b1`` takes the parallel path (``parallel_bits`` = 16 wide), ``b2`` is streamed one bit per cycle. Callers pass
    the phases in DESIGN.md's order: forward (b_w, b_a) streams the activations as Stripes does; dgrad (b_g, b_w)
    streams the weights and wgrad (b_g, b_a) the activations, with the gradient on the 16-bit parallel path — a GEMM
    may stream either operand, and this way all three phases scale with CPT's cycling precision q while the static
    gradient precision (8 bits) fits the parallel path.
    """

    UNITS_KEY, CORE_PJ_KEY = "lanes", "pj_per_lane_cycle"
    KIND = "bit-serial"
    PARAMS = (
        Field("lanes", "count", "bit-serial lanes (count), each a parallel_bits x 1-bit multiplier-adder"),
        Field("parallel_bits", "count", "width of each lane's parallel operand", 16),
        Field("serial_bits_per_cycle", "count", "bits of the serial operand a lane consumes per cycle", 1),
        Field("pj_per_lane_cycle", "positive", "dynamic energy of one lane per busy cycle, pJ"),
        # Stripes keeps its bit-parallel baseline's (DaDianNao's) 16-bit fixed-point neuron storage: precision
        # changes its compute time, not what memory holds (Judd et al., MICRO 2016; storing at the reduced precision
        # is their separate Proteus, ICS 2016).
        _AcceleratorProfile.output_bits_field(16, "Stripes stores neurons as 16-bit fixed point"),
    ) + _AcceleratorProfile.COMMON

    def _lane_cycles(self, b1, b2):
        p = self.params
        return bit_serial_lane_cycles_per_mac(b1, b2, p["parallel_bits"], p["serial_bits_per_cycle"])

    def _macs_per_cycle(self, b1, b2):
        return self.params["lanes"] / self._lane_cycles(b1, b2)

    def _pack(self, b1, b2):
        # a lane finishes one product every lane_cycles cycles (the serial operand's bits; DNNsim's P)
        return 1.0 / self._lane_cycles(b1, b2)

    def _core_energy_j(self, macs, b1, b2):
        return macs * self._lane_cycles(b1, b2) * self.params["pj_per_lane_cycle"] * _PJ

    def describe_bits(self, b1: int, b2: int) -> str:
        return f"{float(self._lane_cycles(b1, b2)):g} lane-cycles/MAC"

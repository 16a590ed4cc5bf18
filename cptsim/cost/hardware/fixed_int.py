"""The ``fixed-int`` kind: a fixed-width integer MAC array, where every width up to its own costs the same."""

from __future__ import annotations

import numpy as np

from .base import _PJ, Field, _AcceleratorProfile, register


def fixed_int_passes(b1, b2, width_bits=8):
    """Passes of a fixed ``width_bits`` MAC array per MAC: ``ceil(b1 / w) * ceil(b2 / w)``.

    Any width <= w costs exactly one pass (a 3-bit GEMM costs what an 8-bit one does); wider operands are split into
    w-bit slices and every slice pair is one pass (16x16 on an 8-bit array = 4 passes), the usual way fixed-width
    integer arrays run wider arithmetic (cf. the temporal passes in Sharma et al., ISCA 2018).
    """
    b1, b2 = np.asarray(b1, dtype=np.float64), np.asarray(b2, dtype=np.float64)
    return np.ceil(b1 / width_bits) * np.ceil(b2 / width_bits)


@register
class FixedIntProfile(_AcceleratorProfile):
    """``fixed-int``: a fixed-width integer MAC array; every width <= ``width_bits`` costs the same.

    MACs per cycle = mac_units / fixed_int_passes(b1, b2, width_bits)
    core energy    = pj_per_mac x macs x fixed_int_passes(b1, b2, width_bits)
    """

    UNITS_KEY, CORE_PJ_KEY = "mac_units", "pj_per_mac"
    KIND = "fixed-int"
    PARAMS = (
        Field("mac_units", "count", "MAC units in the array (count)"),
        Field("width_bits", "count", "operand width of the MAC units", 8),
        Field("pj_per_mac", "positive", "dynamic energy of one width_bits x width_bits MAC, pJ"),
        _AcceleratorProfile.output_bits_field(32, "32-bit accumulators written back, as Bit Fusion's simulator does"),
    ) + _AcceleratorProfile.COMMON

    def _operand_bits(self, b):
        # narrower operands still fill a whole width_bits container; wider ones, whole slices of it
        w = int(self.params["width_bits"])
        return np.ceil(np.asarray(b) / w) * w

    def _passes(self, b1, b2):
        return fixed_int_passes(b1, b2, self.params["width_bits"])

    def _macs_per_cycle(self, b1, b2):
        return self.params["mac_units"] / self._passes(b1, b2)

    def _pack(self, b1, b2):
        # one product per MAC per pass: wider operands take ceil(b/w) slices each
        return 1.0 / self._passes(b1, b2)

    def _core_energy_j(self, macs, b1, b2):
        return macs * self._passes(b1, b2) * self.params["pj_per_mac"] * _PJ

    def describe_bits(self, b1: int, b2: int) -> str:
        n = int(self._passes(b1, b2))
        return "1 pass" if n == 1 else f"{n} passes"

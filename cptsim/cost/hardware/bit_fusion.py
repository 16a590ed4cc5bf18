"""The ``bit-fusion`` kind (Sharma et al., ISCA 2018): 2-bit BitBricks that fuse to the operand widths."""

from __future__ import annotations

import numpy as np

from .base import _PJ, Field, _AcceleratorProfile, _Checker, register


def brick_factor(b, high_bits=8, low_bits=2):
    """Bit Fusion's per-operand throughput factor: ``floor(high / max(b, low))`` if b <= high, else ``1/ceil(b/high)``.

    A Fusion Unit holds 16 2-bit BitBricks that fuse to one 8b x 8b multiplier, or split into 2 (8x4), 4 (4x4),
    8 (4x2), 16 (2x2) narrower ones (Sharma et al., ISCA 2018, Sec. III; the authors' simulator,
    github.com/hsharma35/bitfusion src/simulator/accelerator.py ``get_perf_factor``). Widths below 2 bits still
    occupy a 2-bit brick. Operands wider than 8 bits are not fused spatially in the paper; we split them into
    ``ceil(b / 8)`` 8-bit slices processed in successive passes (a 16-bit operand = 2 passes, 32-bit = 4).
    """
    b = np.asarray(b, dtype=np.float64)
    narrow = np.floor(high_bits / np.maximum(b, low_bits))
    wide = 1.0 / np.ceil(b / high_bits)
    return np.where(b <= high_bits, narrow, wide)


def bitfusion_macs_per_unit_cycle(b1, b2, high_bits=8, low_bits=2):
    """MACs per Fusion Unit per cycle: ``brick_factor(b1) * brick_factor(b2)``.

    1 at 8x8, 4 at 4x4, 16 at 2x2 (the brick law), 1/4 at 16x16 (four 8x8 passes), 1/16 at 32x32.
    """
    return brick_factor(b1, high_bits, low_bits) * brick_factor(b2, high_bits, low_bits)


@register
class BitFusionProfile(_AcceleratorProfile):
    """``bit-fusion`` (Sharma et al., ISCA 2018): Fusion Units of 2-bit BitBricks that fuse to the operand widths.

    MACs per cycle = fusion_units x bitfusion_macs_per_unit_cycle(b1, b2)   (the brick law, ``brick_factor``)
    core energy    = core_pj_per_unit_cycle x unit-cycles,  unit-cycles = macs / bitfusion_macs_per_unit_cycle
    so the core energy per MAC is 0.46 pJ at 8x8, 0.115 at 4x4, 0.029 at 2x2 with the shipped numbers
    (synthesis data in github.com/hsharma35/bitfusion results/systolic_array_synth.csv).
    """

    UNITS_KEY, CORE_PJ_KEY = "fusion_units", "core_pj_per_unit_cycle"
    KIND = "bit-fusion"
    PARAMS = (
        Field("fusion_units", "count",
              "number of Fusion Units (count; 16 x 32 = 512 in the paper's Eyeriss-matched design)"),
        Field("high_bits", "count", "widest operand one fused unit takes in one pass", 8),
        Field("low_bits", "count", "BitBrick width", 2),
        Field("core_pj_per_unit_cycle", "positive", "dynamic energy of one Fusion Unit per busy cycle, pJ"),
        # The authors' simulator reads activations and weights from DRAM at their operand widths (iprec, wprec)
        # but writes outputs at oprec = 32 (github.com/hsharma35/bitfusion, bitfusion/src/optimizer/optimizer.py,
        # get_stats_fast).
        _AcceleratorProfile.output_bits_field(32, "the Bit Fusion simulator writes outputs at oprec = 32"),
    ) + _AcceleratorProfile.COMMON

    @classmethod
    def parse_params(cls, chk: _Checker, table: dict) -> dict:
        params = super().parse_params(chk, table)
        if params["low_bits"] > params["high_bits"]:
            chk.fail(f"bit-fusion.low_bits must be <= high_bits ({params['high_bits']}), got {params['low_bits']}")
        return params

    def _per_unit(self, b1, b2):
        return bitfusion_macs_per_unit_cycle(b1, b2, self.params["high_bits"], self.params["low_bits"])

    def _pack(self, b1, b2):
        # a Fusion Unit's row takes brick_factor(b1) * brick_factor(b2) reduction elements per cycle
        # (the authors' get_perf_factor); 1/passes for operands wider than high_bits
        return self._per_unit(b1, b2)

    def _macs_per_cycle(self, b1, b2):
        return self.params["fusion_units"] * self._per_unit(b1, b2)

    def _core_energy_j(self, macs, b1, b2):
        return macs / self._per_unit(b1, b2) * self.params["core_pj_per_unit_cycle"] * _PJ

    def describe_bits(self, b1: int, b2: int) -> str:
        f = float(self._per_unit(b1, b2))
        return f"{f:g} MAC/unit/cycle" if f >= 1 else f"{round(1 / f)} passes"

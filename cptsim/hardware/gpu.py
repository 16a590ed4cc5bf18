"""The ``gpu`` kind: precision tiers with published dense peak rates."""

from __future__ import annotations

import numpy as np

from .base import (_CAL_COMPUTE, _CAL_MEMORY, _MISSING, FULL_PRECISION_BITS, Field, HardwareProfile, _Checker,
                   register, roofline_time)


def gpu_tier_index(bmax, narrow_bits, narrow_index, fp32_index):
    """Index of the tier a GEMM with operand widths up to ``bmax`` runs on.

    The smallest tier width >= bmax among the tiers narrower than 32 bits (``narrow_bits`` sorted ascending,
    ``narrow_index`` their positions in the profile's tier list); widths with no such tier (17..32, or 9..16 on a GPU
    without fp16) run on the profile's FP32 tier ``fp32_index``. So cost falls in steps with bits: on an H100,
    which has no int4 tier, a 4-bit GEMM runs at the int8 rate (NVIDIA H100 datasheet; shared/reference/hardware.md).
    """
    narrow_bits = np.asarray(narrow_bits)
    pos = np.searchsorted(narrow_bits, bmax, side="left")
    lookup = np.append(np.asarray(narrow_index, dtype=np.int64), fp32_index)
    return lookup[pos]


@register
class GPUProfile(HardwareProfile):
    """``gpu``: precision tiers with published dense peak rates.

    time   = max(macs / (tier MAC rate x compute_efficiency), bytes / (bandwidth x memory_efficiency))
    energy = power_w x power_fraction x time      (power_fraction 1.0 = board TDP: an upper bound)

    The tier is the narrowest one at least max(b1, b2) bits wide (``gpu_tier_index``). Peak rates are given in
    TOPS / TFLOPS (1e12 ops/s, one MAC = 2 ops, so MAC rate = ops / 2). GEMMs wider than 16 bits (FP32) run on the
    tier named by ``fp32_tier``: default "tf32" where the GPU has it, because PyTorch runs convolutions in TF32 by
    default (``torch.backends.cudnn.allow_tf32 = True``); set ``fp32_tier = "fp32"`` for strict FP32.
    """

    KIND = "gpu"
    PARAMS = (
        Field("bandwidth_gb_s", "positive", "DRAM bandwidth in GB/s (1e9 bytes/s)"),
        Field("power_w", "positive", "board power (TDP) in W"),
        Field("fp32_tier", "string", "name of the tier that runs FP32 GEMMs", None),
    )
    TIER = (
        Field("name", "string", "tier name, e.g. int8"),
        Field("bits", "bits", "widest operand the tier takes"),
        Field("peak_ops", "positive", "dense peak rate in the tier's unit (1e12 ops/s; 1 MAC = 2 ops)"),
        Field("unit", "string", '"TOPS" or "TFLOPS"'),
    )
    CALIBRATION = (
        _CAL_COMPUTE,
        _CAL_MEMORY,
        Field("power_fraction", "fraction", "average power / TDP while training (1.0 = TDP, an upper bound)", 1.0),
    )

    @classmethod
    def parse_params(cls, chk: _Checker, table: dict) -> dict:
        params = chk.fields(table, cls.PARAMS, cls.KIND, nested=("tiers",))
        tiers_raw = table.get("tiers", _MISSING)
        if tiers_raw is _MISSING:
            chk.fail('missing key \'gpu.tiers\' (a list of {name, bits, peak_ops, unit} tables, e.g. '
                     '{name = "int8", bits = 8, peak_ops = 624, unit = "TOPS"})')
        if not isinstance(tiers_raw, list) or not tiers_raw:
            chk.fail(f"gpu.tiers must be a non-empty list of {{name, bits, peak_ops, unit}} tables, got {tiers_raw!r}")
        tiers = []
        for i, t in enumerate(tiers_raw):
            where = f"gpu.tiers[{i}]"
            if not isinstance(t, dict):
                chk.fail(f"{where} must be a table {{name, bits, peak_ops, unit}}, got {t!r}")
            tier = chk.fields(t, cls.TIER, where)
            if tier["unit"] not in ("TOPS", "TFLOPS"):
                chk.fail(f'{where}.unit must be "TOPS" or "TFLOPS" (1e12 ops/s), got {tier["unit"]!r}')
            tiers.append(tier)
        names = [t["name"] for t in tiers]
        for i, n in enumerate(names):
            if n in names[:i]:
                chk.fail(f"gpu.tiers[{i}].name {n!r} is used twice")
        narrow = [t["bits"] for t in tiers if t["bits"] < FULL_PRECISION_BITS]
        if len(set(narrow)) != len(narrow):
            chk.fail("gpu.tiers: two tiers narrower than 32 bits have the same width (which one would run?)")
        wide = [t["name"] for t in tiers if t["bits"] == FULL_PRECISION_BITS]
        fp32 = params["fp32_tier"]
        if fp32 is None:
            fp32 = "tf32" if "tf32" in wide else (wide[0] if len(wide) == 1 else None)
            if fp32 is None:
                chk.fail("gpu.fp32_tier is needed: name the 32-bit tier that runs FP32 GEMMs "
                         f"(32-bit tiers: {', '.join(wide) or 'none - add one with bits = 32'})")
        elif fp32 not in wide:
            chk.fail(f"gpu.fp32_tier must name a tier with bits = 32 ({', '.join(wide) or 'none defined'}), "
                     f"got {fp32!r}")
        params["fp32_tier"] = fp32
        params["tiers"] = tiers
        return params

    def _derive(self) -> None:
        tiers = self.params["tiers"]
        self._tier_names = [t["name"] for t in tiers]
        self._tier_mac_rate = np.array([t["peak_ops"] * 1e12 / 2.0 for t in tiers])
        order = sorted((t["bits"], i) for i, t in enumerate(tiers) if t["bits"] < FULL_PRECISION_BITS)
        self._narrow_bits = np.array([b for b, _ in order], dtype=np.int64)
        self._narrow_index = np.array([i for _, i in order], dtype=np.int64)
        self._fp32_index = self._tier_names.index(self.params["fp32_tier"])
        self._bandwidth = self.params["bandwidth_gb_s"] * 1e9

    def tier_index(self, b1, b2) -> np.ndarray:
        return gpu_tier_index(np.maximum(b1, b2), self._narrow_bits, self._narrow_index, self._fp32_index)

    def _throughput(self, b1, b2):
        return self._tier_mac_rate[self.tier_index(b1, b2)] * self._ceff

    def _cost(self, macs, b1, b2, bytes_moved, quant_elems):
        t = roofline_time(macs, self._throughput(b1, b2), bytes_moved, self._bandwidth * self._meff)
        return t, self.params["power_w"] * self.calibration["power_fraction"] * t

    def describe_bits(self, b1: int, b2: int) -> str:
        return self._tier_names[int(self.tier_index(b1, b2))]

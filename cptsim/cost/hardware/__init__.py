"""Hardware profiles: what a training step costs, in seconds and joules, on one machine.

One module per kind (gpu, bit_fusion, bit_serial, fixed_int, host), each holding its cost formula and its profile
class; the accelerator kinds price a layer on their array through ``array`` (a layer-phase as tiling problems) and
``tiling`` (the tiling search, ``tiling_search`` here; ``tiling_cache`` keeps its results); ``base`` holds what they
share (the base class, the kind registry, TOML checking) and ``files`` finds, reads
and writes profile files. Each kind prices a whole step behind ``HardwareProfile.price_step``, so the cost model
knows no kind. Adding a kind is one module here whose class is decorated with ``@register``: it is imported below
(the five shipped kinds explicitly, any other module of this package found on import). A kind defined outside
this package registers the same way (``register``; ``unregister`` forgets it) before its profiles are loaded.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import (FULL_PRECISION_BITS, MAX_BITS, MIN_BITS, Field, HardwareProfile, StepPrice,
                   check_profile_file_name, kind_class, kinds, register, roofline_time, traffic_energy_j, unregister)
from .gpu import GPUProfile, gpu_tier_index
from .bit_fusion import BitFusionProfile, bitfusion_macs_per_unit_cycle, brick_factor
from .bit_serial import BitSerialProfile, bit_serial_lane_cycles_per_mac
from .fixed_int import FixedIntProfile, fixed_int_passes
from .host import HostProfile, host_time_components
from .tiling import Access, ArraySpec, Problem, search as tiling_search
# _toml_value is private but cptsim.calibration.calibrate writes TOML values with it
from .files import (_toml_value, host_profile_text, list_profiles, load_profile, load_profiles,  # noqa: F401
                    parse_profile, profile_origin, recalibrated_profile_text, user_profile_dir)

_COMMON = {"base", "files"}
for _m in pkgutil.iter_modules(__path__):
    if _m.name not in _COMMON and not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")

KINDS = kinds()

__all__ = [
    "Access", "ArraySpec", "FULL_PRECISION_BITS", "KINDS", "MAX_BITS", "MIN_BITS", "Problem", "BitFusionProfile", "BitSerialProfile", "Field",
    "FixedIntProfile", "GPUProfile", "HardwareProfile", "HostProfile", "bit_serial_lane_cycles_per_mac",
    "bitfusion_macs_per_unit_cycle", "brick_factor", "check_profile_file_name", "fixed_int_passes", "gpu_tier_index",
    "host_profile_text", "host_time_components", "kind_class", "kinds", "list_profiles", "load_profile",
    "parse_profile", "profile_origin", "recalibrated_profile_text", "register", "roofline_time", "StepPrice", "tiling_search", "traffic_energy_j",
    "unregister",
    "user_profile_dir", "load_profiles",
]

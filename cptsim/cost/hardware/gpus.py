"""Which GPU profile describes a GPU, from the name the driver gives it (``torch.cuda.get_device_name``).

A run records its GPU's name (``cptsim.run.device``); ``report`` prices the run on the profile named here. A name
matches a shipped profile only where it is that profile's variant: an H100 PCIe (2.0 TB/s, 350 W) is not the SXM
part ``h100.toml`` describes, and pricing it as one would be off by the bandwidth and power ratio -- such a GPU
matches nothing, and the user names a profile (``--host``) or measures one (``cptsim hw calibrate --device cuda``,
which writes ``host-gpu.toml`` with the GPU's name in its description: that file wins over a shipped profile,
because it was measured on the GPU itself).
"""

from __future__ import annotations

import re
from pathlib import Path

# (profile, the driver's names of the variant it describes). Names as torch.cuda.get_device_name prints them,
# e.g. "NVIDIA H100 80GB HBM3" (the SXM5 part), "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB".
SHIPPED = (
    ("h100", r"\bH100\b(?!.*\b(PCIe|NVL)\b).*\b(HBM3|SXM)"),
    ("h200", r"\bH200\b(?!.*\bNVL\b)"),
    ("a100", r"\bA100[- ]SXM4?[- ]80GB"),
    ("b200", r"\bB200\b"),
    ("l40s", r"\bL40S\b"),
    ("mi300x", r"\bMI300X\b"),
    ("rtx3090", r"\bRTX 3090\b(?! Ti)"),
    ("rtx4090", r"\bRTX 4090\b(?! D)"),
    ("t4", r"\bT4\b"),
    ("v100", r"\bV100[- ]SXM2\b"),
)

CALIBRATED = "host-gpu"
_CALIBRATED_SUFFIX = " (measured by cptsim hw calibrate)"


def shipped_profile_for(gpu_name: str | None) -> str | None:
    """The shipped profile describing a GPU of this driver name, or None."""
    if not gpu_name:
        return None
    for profile, pattern in SHIPPED:
        if re.search(pattern, gpu_name, re.IGNORECASE):
            return profile
    return None


def calibrated_profile_for(gpu_name: str | None, profile_dir: Path | None = None) -> str | None:
    """The path of ``host-gpu.toml`` in the user's profile directory when it was measured on a GPU of this name."""
    if not gpu_name:
        return None
    if profile_dir is None:
        from .files import user_profile_dir

        profile_dir = user_profile_dir()
    path = Path(profile_dir) / f"{CALIBRATED}.toml"
    if not path.is_file():
        return None
    try:
        import tomllib

        desc = str(tomllib.loads(path.read_text()).get("description", ""))
    except (OSError, ValueError):
        return None
    return str(path) if desc.removesuffix(_CALIBRATED_SUFFIX).strip() == gpu_name.strip() else None


def profile_for(gpu_name: str | None, profile_dir: Path | None = None) -> dict:
    """{"profile": name or path or None, "why": one line}: the profile that describes this GPU."""
    cal = calibrated_profile_for(gpu_name, profile_dir)
    if cal:
        return {"profile": cal, "why": f"measured on this GPU ({cal})"}
    shipped = shipped_profile_for(gpu_name)
    if shipped:
        return {"profile": shipped, "why": f"shipped profile {shipped!r} describes {gpu_name!r}"}
    return {"profile": None, "why": f"no shipped profile describes {gpu_name!r}" if gpu_name else "no GPU name"}

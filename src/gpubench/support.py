"""What gpubench supports (Python, CUDA majors, NVIDIA drivers, GPU architectures) and the check
that ``gpubench env`` makes of the driver against the CUDA runtime CuPy uses.

Sources: the minimum drivers are those of NVIDIA's CUDA Toolkit release notes (table "CUDA
Toolkit and Minimum Required Driver Version for CUDA Minor Version Compatibility", Linux x86_64)
and the CUDA Compatibility guide (13.x needs a driver >= 580, 12.x >= 525). The architectures are
those each CUDA major's NVRTC compiles for (gpubench's kernels are compiled at run time): CUDA 13.0
dropped Maxwell, Pascal and Volta (compute capability < 7.5).
"""

from __future__ import annotations

import re
from typing import Any

PYTHON_VERSIONS = ("3.11", "3.12", "3.13")

# CUDA major -> (minimum Linux driver, GPU architectures, compute capabilities, the extra)
CUDA_MAJORS: dict[int, dict[str, str]] = {
    12: {"min_driver": "525.60.13", "architectures": "Maxwell to Blackwell",
         "compute_capability": "5.0 to 12.x (Blackwell needs CUDA 12.8 or newer)", "extra": "cuda12"},
    13: {"min_driver": "580.65.06", "architectures": "Turing to Blackwell",
         "compute_capability": "7.5 and newer", "extra": "cuda13"},
}


def parse_cuda_version(text: str | None) -> tuple[int, int] | None:
    """'13.0' -> (13, 0); None or text that is not MAJOR.MINOR -> None."""
    if not text:
        return None
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", str(text))
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_driver_version(text: str | None) -> tuple[int, ...] | None:
    """'580.65.06' -> (580, 65, 6); '535.104' -> (535, 104); anything else -> None."""
    if not text:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+){0,3})\s*", str(text))
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def driver_check(driver_cuda: str | None, runtime_cuda: str | None,
                 nvidia_driver: str | None = None) -> dict[str, Any] | None:
    """Compare the CUDA version the driver supports ("13.0") with the CUDA runtime CuPy uses.

    Returns:
        None when either CUDA version is unknown. Else {status: "ok", "minor-version-compatibility"
        or "driver-too-old", warning: one line or None, driver_cuda, runtime_cuda, nvidia_driver,
        min_driver: the Linux minimum for the runtime's major, or None}.
    """
    drv, rt = parse_cuda_version(driver_cuda), parse_cuda_version(runtime_cuda)
    if drv is None or rt is None:
        return None
    info = CUDA_MAJORS.get(rt[0])
    min_driver = info["min_driver"] if info else None
    out: dict[str, Any] = {"status": "ok", "warning": None, "driver_cuda": driver_cuda, "runtime_cuda": runtime_cuda,
                           "nvidia_driver": nvidia_driver, "min_driver": min_driver}
    have, need = parse_driver_version(nvidia_driver), parse_driver_version(min_driver)
    below_min = have is not None and need is not None and have < need
    other = [f"[{v['extra']}]" for k, v in sorted(CUDA_MAJORS.items()) if k <= drv[0] and k != rt[0]]
    switch = f", or install gpubench-cuda{other[-1]} (CUDA {drv[0]})" if other else ""
    if drv[0] < rt[0] or below_min:
        shown = f"NVIDIA driver {nvidia_driver} " if nvidia_driver else "the NVIDIA driver "
        need_text = f" (CUDA {rt[0]}.x needs a driver >= {min_driver})" if min_driver else ""
        out["status"] = "driver-too-old"
        out["warning"] = (f"{shown}supports CUDA {driver_cuda}, older than the CUDA {runtime_cuda} runtime CuPy "
                          f"uses{need_text}: CUDA calls will fail; upgrade the driver{switch}")
    elif drv < rt:
        out["status"] = "minor-version-compatibility"
        out["warning"] = (f"the NVIDIA driver supports CUDA {driver_cuda}, older than the CUDA {runtime_cuda} runtime "
                          f"CuPy uses: it runs under CUDA minor version compatibility, without what CUDA "
                          f"{runtime_cuda} added; a driver for CUDA {runtime_cuda} or newer lifts that")
    return out

"""The machine, read through NVML (nvidia-ml-py) and the CUDA runtime (through CuPy).

:func:`capture` returns a JSON-able dict::

    {"host": {hostname, os, python, cpu_count, numa_nodes, mem_total_bytes, mem_available_bytes},
     "versions": {gpubench, numpy, cupy, nvidia-ml-py, click, rich,
                  cuda-toolkit, nvidia-cuda-nvrtc, nvidia-nccl, cuda-bindings},
     "cuda": {driver_version, runtime_version, nvrtc_version, device_count, error, driver_check},
     "nvml": {driver_version, error},
     "gpus": [{index, name, uuid, pci_bus_id, memory_total_bytes, memory_free_bytes,
               pcie_gen, pcie_width, pcie_gen_max, pcie_width_max, pcie_peak_bytes_per_s,
               nvlink_links_up, nvlink_bytes_per_s_per_link, nvlink_peak_bytes_per_s,
               nvlink_peers {other_index: links}, numa_node, cpu_affinity,
               memory_bus_width_bits, memory_clock_max_mhz, memory_peak_bytes_per_s}],
     "topology": {"0,1": "NV18", ...}}          # nvidia-smi topo -m style

The driver adds ``preflight`` (:func:`idle_check`), ``numa`` and ``telemetry`` (docs/conditions.md).
A field the driver does not report is None; an absent driver or library leaves ``gpus`` empty with
the reason in ``cuda.error`` / ``nvml.error``. GPU indices are CUDA runtime ordinals, matched to
NVML devices by PCI bus id.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import platform
import socket
import sys
import time
from typing import Any

from gpubench import __version__
from gpubench.core import kernel_cache
from gpubench.core import limits
from gpubench.core.numa import allowed_cpus, nodes, read_text


def host_memory() -> tuple[int | None, int | None]:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo, None where unknown."""
    m: dict[str, int] = {}
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            k, _, v = line.partition(":")
            parts = v.split()
            if parts and parts[0].isdigit():
                m[k] = int(parts[0]) * 1024
    return m.get("MemTotal"), m.get("MemAvailable")


def host_info() -> dict[str, Any]:
    """The host part of the environment (works with no GPU)."""
    total, avail = host_memory()
    return {"hostname": socket.gethostname(), "os": platform.platform(), "python": sys.version.split()[0],
            "cpu_count": os.cpu_count(), "cpus_usable": len(allowed_cpus()) or None,  # None: the mask is unreadable
            "cpu_model": _cpu_model(), "numa_nodes": len(nodes()) or None, "mem_total_bytes": total,
            "mem_available_bytes": avail}


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


#: The CUDA wheels the cuda12/cuda13 extras install: key -> the distributions that provide it.
CUDA_WHEELS: dict[str, tuple[str, ...]] = {
    "cuda-toolkit": ("cuda-toolkit",), "nvidia-cuda-nvrtc": kernel_cache.NVRTC_WHEELS,
    "nvidia-nccl": ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl"), "cuda-bindings": ("cuda-bindings",)}


def versions() -> dict[str, str | None]:
    """Versions of gpubench and the libraries it measures through where installed, and always the
    CUDA wheels of :data:`CUDA_WHEELS` (None where none is), from the distributions' metadata."""
    version = kernel_cache.dist_version
    out: dict[str, str | None] = {"gpubench": __version__}
    out.update({d: v for d in ("numpy", "cupy-cuda13x", "cupy-cuda12x", "cupy", "nvidia-ml-py", "click", "rich")
                if (v := version(d)) is not None})
    # with CuPy for CUDA 12 installed, its wheels (-cu12) are the ones in use where both majors are
    cu12_first = "cupy-cuda12x" in out and "cupy-cuda13x" not in out
    for key, dists in CUDA_WHEELS.items():
        order = sorted(dists, key=lambda d: not d.endswith("-cu12")) if cu12_first else dists
        out[key] = next((v for v in map(version, order) if v is not None), None)
    return out


def _short(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0] if s else ''}".strip().rstrip(":")


def cuda_info() -> dict[str, Any]:
    """CUDA driver/runtime versions and device count through CuPy; ``error`` says why not."""
    out: dict[str, Any] = {"driver_version": None, "runtime_version": None, "nvrtc_version": None,
                           "device_count": 0, "error": None}
    from importlib.util import find_spec

    if find_spec("cupy") is None:  # not installed: nothing to import
        out["error"] = "CuPy not importable (ModuleNotFoundError: No module named 'cupy')"
        return out
    try:
        import cupy  # noqa: F401
        from cupy.cuda import runtime
    except Exception as e:  # ImportError, or a broken CUDA install
        out["error"] = f"CuPy not importable ({_short(e)})"
        return out
    out["nvrtc_version"] = nvrtc_version()
    try:
        out["runtime_version"] = _fmt_cuda_version(runtime.runtimeGetVersion())
    except Exception as e:
        out["error"] = _short(e)
    try:
        out["driver_version"] = _fmt_cuda_version(runtime.driverGetVersion())
        out["device_count"] = runtime.getDeviceCount()
    except Exception as e:
        from gpubench.core.gpu import no_driver_text

        out["error"] = no_driver_text(_short(e))
    return out


def nvrtc_version() -> str | None:
    """The version, "major.minor", of the NVRTC that compiles gpubench's kernels: as their cache
    recorded it, else ``cupy.cuda.nvrtc.getVersion()``; None where neither can say."""
    cached = kernel_cache.cached_nvrtc_version()
    if cached is not None:
        return cached
    try:
        from cupy.cuda import nvrtc

        major, minor = nvrtc.getVersion()
        return f"{int(major)}.{int(minor)}"
    except Exception:  # no NVRTC library found, or a CuPy without the call
        return None


def _fmt_cuda_version(v: int) -> str | None:
    return f"{v // 1000}.{(v % 1000) // 10}" if v else None


def nvml_call(fn, *args):
    """``fn(*args)``, or None when it raises (a query the driver does not answer)."""
    try:
        return fn(*args)
    except Exception:
        return None


def nvml_handles(nv, gpus) -> list[tuple[dict, Any]]:
    """(entry, NVML handle) of each env ``gpus`` entry NVML knows: by its UUID, else its PCI bus id."""
    out = []
    for g in gpus:
        h = nvml_call(getattr(nv, "nvmlDeviceGetHandleByUUID", None), g["uuid"]) if g.get("uuid") else None
        if h is None and g.get("pci_bus_id"):
            h = nvml_call(getattr(nv, "nvmlDeviceGetHandleByPciBusId", None), g["pci_bus_id"])
        if h is not None:
            out.append((g, h))
    return out


def _dec(x):
    return x.decode() if isinstance(x, bytes) else x


def _norm_bus_id(bus: str | None) -> str | None:
    """'00000000:1B:00.0' -> '0000:1b:00.0' (the form CUDA and sysfs use)."""
    if not bus:
        return None
    bus = bus.lower()
    dom, _, rest = bus.partition(":")
    return f"{int(dom, 16):04x}:{rest}" if rest else bus


def _cuda_bus_ids() -> list[str | None]:
    try:
        from cupy.cuda import runtime

        n = runtime.getDeviceCount()
        return [_norm_bus_id(runtime.deviceGetPCIBusId(i)) for i in range(n)]
    except Exception:
        return []


def gpu_info() -> tuple[list[dict[str, Any]], dict[str, str], dict[str, Any]]:
    """(gpus, topology, nvml_status) through NVML; empty lists with the reason when NVML is absent."""
    status: dict[str, Any] = {"driver_version": None, "error": None}
    try:
        import pynvml as nv

        nv.nvmlInit()
    except Exception as e:
        status["error"] = _short(e)
        return [], {}, status
    try:
        status["driver_version"] = _dec(nvml_call(nv.nvmlSystemGetDriverVersion))
        n = nv.nvmlDeviceGetCount()
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        nvml_bus = [_norm_bus_id(_dec(nv.nvmlDeviceGetPciInfo(h).busId)) for h in handles]
        cuda_bus = _cuda_bus_ids()
        # CUDA ordinal order (respects CUDA_VISIBLE_DEVICES); fall back to NVML order.
        order = [nvml_bus.index(b) for b in cuda_bus if b in nvml_bus] if cuda_bus else list(range(n))
        gpus = [_one_gpu(nv, handles[ni], cuda_idx, nvml_bus[ni]) for cuda_idx, ni in enumerate(order)]
        bus_to_idx = {g["pci_bus_id"]: g["index"] for g in gpus}
        for g in gpus:
            g["nvlink_peers"] = {str(bus_to_idx[b]): c for b, c in g.pop("_nvlink_remote").items() if b in bus_to_idx}
        _nvlink_peers_by_p2p_status(nv, gpus, [handles[i] for i in order])
        topo = {}
        for a, b in itertools.combinations(gpus, 2):  # in index order: a's index below b's
            links = a["nvlink_peers"].get(str(b["index"]), 0)
            topo[f"{a['index']},{b['index']}"] = f"NV{links}" if links else _TOPO_NAMES.get(nvml_call(
                nv.nvmlDeviceGetTopologyCommonAncestor, handles[order[a["index"]]], handles[order[b["index"]]]), "?")
        return gpus, topo, status
    except Exception as e:
        status["error"] = _short(e)
        return [], {}, status
    finally:
        nvml_call(nv.nvmlShutdown)


def _nvlink_peers_by_p2p_status(nv, gpus: list[dict], handles: list) -> None:
    """Fill nvlink_peers where the links' remote PCI ids name no visible GPU (a VM, an NVSwitch):
    pairs whose NVLink P2P status is OK get the device's links up, as nvidia-smi topo -m shows."""
    idx = getattr(nv, "NVML_P2P_CAPS_INDEX_NVLINK", None)
    if idx is None:
        return
    for a, ha in zip(gpus, handles):
        if a["nvlink_peers"] or not a["nvlink_links_up"]:
            continue
        for b, hb in zip(gpus, handles):
            if a is b:
                continue
            if nvml_call(nv.nvmlDeviceGetP2PStatus, ha, hb, idx) == getattr(nv, "NVML_P2P_STATUS_OK", 0):
                a["nvlink_peers"][str(b["index"])] = a["nvlink_links_up"]
                a["nvlink_peers_inferred"] = True


# nvmlGpuTopologyLevel_t -> nvidia-smi topo -m legend
_TOPO_NAMES = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def _one_gpu(nv, h, index: int, bus: str | None) -> dict[str, Any]:
    mem = nvml_call(nv.nvmlDeviceGetMemoryInfo, h)
    gen = nvml_call(nv.nvmlDeviceGetCurrPcieLinkGeneration, h)
    width = nvml_call(nv.nvmlDeviceGetCurrPcieLinkWidth, h)
    gen_max = nvml_call(nv.nvmlDeviceGetMaxPcieLinkGeneration, h)
    width_max = nvml_call(nv.nvmlDeviceGetMaxPcieLinkWidth, h)
    links_up = 0
    remote: dict[str, int] = {}
    version = None
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        state = nvml_call(nv.nvmlDeviceGetNvLinkState, h, link)
        if state != 1:  # NVML_FEATURE_ENABLED
            continue
        links_up += 1
        version = version or nvml_call(nv.nvmlDeviceGetNvLinkVersion, h, link)
        pci = None
        for fn_name in ("nvmlDeviceGetNvLinkRemotePciInfo_v2", "nvmlDeviceGetNvLinkRemotePciInfo"):
            pci = nvml_call(getattr(nv, fn_name, None), h, link)  # None where this nvidia-ml-py lacks it
            if pci is not None:
                break
        if pci is not None:
            rb = _norm_bus_id(_dec(pci.busId))
            if rb is not None:  # an empty remote PCI id names no GPU (nor a GPU without one)
                remote[rb] = remote.get(rb, 0) + 1
    per_link = None
    if links_up:
        # Per-link speed in MB/s: NVML_FI_DEV_NVLINK_GET_SPEED (newer drivers; H200 reports 26562),
        # then NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON, then a table by NVLink version.
        for name, fallback in (("NVML_FI_DEV_NVLINK_GET_SPEED", 164), ("NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON", 90)):
            field = getattr(nv, name, fallback)
            vals = nvml_call(nv.nvmlDeviceGetFieldValues, h, [field])
            if vals and getattr(vals[0], "nvmlReturn", 1) == 0:
                v = vals[0].value
                mbps = getattr(v, "uiVal", 0) or getattr(v, "ulVal", 0) or getattr(v, "ullVal", 0)
                if mbps:
                    per_link = mbps * 1e6
                    break
        if per_link is None and version in limits.NVML_NVLINK_VERSION:
            per_link = limits.NVLINK_GBPS_PER_LINK[limits.NVML_NVLINK_VERSION[version]] * 1e9
    bus_bits = nvml_call(nv.nvmlDeviceGetMemoryBusWidth, h)
    mem_mhz = nvml_call(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_MEM)
    numa = None
    with contextlib.suppress(ValueError):
        numa = int(read_text(f"/sys/bus/pci/devices/{bus}/numa_node") or "") if bus else None
    cpus = read_text(f"/sys/bus/pci/devices/{bus}/local_cpulist") if bus else None
    return {"index": index, "name": _dec(nvml_call(nv.nvmlDeviceGetName, h)),
            "uuid": _dec(nvml_call(nv.nvmlDeviceGetUUID, h)), "pci_bus_id": bus,
            "memory_total_bytes": getattr(mem, "total", None), "memory_free_bytes": getattr(mem, "free", None),
            "pcie_gen": gen, "pcie_width": width, "pcie_gen_max": gen_max, "pcie_width_max": width_max,
            # the link's capability, not its current state: an idle GPU trains its link down
            "pcie_peak_bytes_per_s": limits.pcie_peak_bytes_per_s(gen_max or gen, width_max or width),
            "nvlink_links_up": links_up, "nvlink_version": version, "nvlink_bytes_per_s_per_link": per_link,
            "numa_node": numa, "cpu_affinity": cpus, "memory_bus_width_bits": bus_bits,
            "memory_clock_max_mhz": mem_mhz,
            "memory_peak_bytes_per_s": limits.device_memory_peak_bytes_per_s(bus_bits, mem_mhz),
            "_nvlink_remote": remote}


def capture() -> dict[str, Any]:
    """The whole environment as a JSON-able dict (see module docstring). Never raises."""
    from gpubench.support import driver_check

    cuda = cuda_info()
    gpus, topo, nvml = gpu_info()
    cuda["driver_check"] = driver_check(cuda["driver_version"], cuda["runtime_version"], nvml["driver_version"])
    for g in gpus:
        per_link = g.get("nvlink_bytes_per_s_per_link")
        g["nvlink_peak_bytes_per_s_by_peer"] = {k: limits.nvlink_peak_bytes_per_s(v, per_link)
                                                 for k, v in g.get("nvlink_peers", {}).items()}
    return {"host": host_info(), "versions": versions(), "cuda": cuda, "nvml": nvml, "gpus": gpus, "topology": topo}


def gpu_by_index(env: dict[str, Any], index: int) -> dict[str, Any] | None:
    """The env entry of CUDA device ``index``, or None."""
    return next((g for g in env.get("gpus", []) if g.get("index") == index), None)


HOT_MARGIN_C = 10  # a GPU within this many degrees of its slowdown threshold is called hot
# With no other process, utilisation (over NVML's last sample period, 1/6 s to 1 s: an earlier run's
# tail) is read again after UTIL_REREAD_S and counts from UTIL_BUSY_PCT; with another, any counts.
UTIL_REREAD_S = 1.0
UTIL_BUSY_PCT = 5


def idle_check(gpus: list[dict[str, Any]], devices: tuple[int, ...] | list[int]) -> dict[str, Any]:
    """Is each GPU of the run idle before the first point? Other compute processes, utilisation and
    temperature against the slowdown threshold (hot within :data:`HOT_MARGIN_C`), as DCGM's
    diagnostics check before they start (DCGM #272).

    Returns:
        {"idle": bool | None (None: NVML could not tell), "warnings": [one line each],
         "gpus": [{index, other_processes: [{pid, used_memory_bytes}], utilization_gpu_pct,
                   utilization_memory_pct, temperature_c, slowdown_temp_c, busy: [reasons]}],
         "error": str | None}. Never raises.
    """
    out: dict[str, Any] = {"idle": None, "warnings": [], "gpus": [], "error": None}
    try:
        import pynvml as nv

        nv.nvmlInit()
    except Exception as e:
        out["error"] = _short(e)
        return out
    try:
        me = os.getpid()
        by_index = {g.get("index"): g for g in gpus}
        for d in devices:
            g = by_index.get(d) or {}
            h = nvml_call(nv.nvmlDeviceGetHandleByUUID, g["uuid"]) if g.get("uuid") else None
            if h is None:
                out["gpus"].append({"index": d, "busy": [], "error": "NVML does not know this GPU"})
                continue
            procs = nvml_call(nv.nvmlDeviceGetComputeRunningProcesses, h)
            others = [{"pid": p.pid, "used_memory_bytes": p.usedGpuMemory if isinstance(p.usedGpuMemory, int) else None}
                      for p in (procs or []) if p.pid != me]
            util = nvml_call(nv.nvmlDeviceGetUtilizationRates, h)
            if not others and bool(getattr(util, "gpu", 0)):
                time.sleep(UTIL_REREAD_S)  # the tail of an earlier run, or work of a process NVML hides?
                util = nvml_call(nv.nvmlDeviceGetUtilizationRates, h)
            temp = nvml_call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
            slow = nvml_call(nv.nvmlDeviceGetTemperatureThreshold, h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
            entry = {"index": d, "other_processes": others, "utilization_gpu_pct": getattr(util, "gpu", None),
                     "utilization_memory_pct": getattr(util, "memory", None), "temperature_c": temp,
                     "slowdown_temp_c": slow, "busy": []}
            if others:
                used = sum(p["used_memory_bytes"] or 0 for p in others)
                entry["busy"].append(f"{len(others)} other process(es) on it (pid "
                                     f"{', '.join(str(p['pid']) for p in others[:4])}; {used / 2**30:.1f} GiB)")
            if entry["utilization_gpu_pct"] and (others or entry["utilization_gpu_pct"] >= UTIL_BUSY_PCT):
                entry["busy"].append(f"utilisation {entry['utilization_gpu_pct']}%")
            if temp is not None and slow and temp >= slow - HOT_MARGIN_C:
                entry["busy"].append(f"{temp} C, within {HOT_MARGIN_C} C of its slowdown threshold {slow} C")
            out["gpus"].append(entry)
            if entry["busy"]:
                out["warnings"].append(f"GPU {d} is not idle: " + "; ".join(entry["busy"]))
        out["idle"] = not out["warnings"]
        return out
    except Exception as e:
        out["error"] = _short(e)
        return out
    finally:
        nvml_call(nv.nvmlShutdown)

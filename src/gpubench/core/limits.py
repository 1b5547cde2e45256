"""Physical peak of each link, so a figure can say "88% of PCIe Gen5 x16" and one above it is flagged.

PCIe (per direction, raw after line encoding, before packet/protocol overhead), from the PCI-SIG
base specifications: Gen1 2.5 GT/s and Gen2 5 GT/s per lane with 8b/10b encoding; Gen3 8, Gen4 16,
Gen5 32 GT/s with 128b/130b; Gen6 64 GT/s PAM4 with FLIT mode (taken as 1 byte per 8 transfers
here, FLIT overhead not deducted). Gen5 x16: 32e9 * 16 * 128/130 / 8 = 63.0 GB/s.

NVLink (per direction per link): NVML's NVML_FI_DEV_NVLINK_GET_SPEED field where the driver reports
it (an H200 with driver 580 reports 26562 MB/s, so 18 links = 478.1 GB/s), otherwise by NVLink version:
1.0 20 GB/s, 2.0 25, 3.0 25, 4.0 26.5625, 5.0 53.125 (NVIDIA's architecture whitepapers).

Device memory (D2D, local copies): bus width x memory clock x 2 (double data rate), NVML's
nvmlDeviceGetMemoryBusWidth (bits) and nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM) (MHz); the formula
is NVIDIA's "theoretical bandwidth" (Mark Harris, "How to Implement Performance Metrics in CUDA
C/C++", NVIDIA Technical Blog, 2012). A copy inside one GPU's memory reads and writes each byte, so
a copy figure counted once (nvbandwidth's device_local_copy) is held against half of it.

Collectives (:func:`mark_collective`): busbw (nccl-tests' per-link figure) is held against the GPU's
NVLink links x per-link rate plus its PCIe link, per direction; NVLink SHARP (NVLS) can lift an
all-reduce above that. ``extra.limit_flag``: None, "above_peak" (a timing fault) or "no_op".
"""

from __future__ import annotations

import math
from typing import TypeGuard

_PCIE_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
_PCIE_ENC = {1: 8 / 10, 2: 8 / 10, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 1.0}
NVLINK_GBPS_PER_LINK = {1: 20.0, 2: 25.0, 3: 25.0, 4: 26.5625, 5: 53.125}
# nvmlDeviceGetNvLinkVersion returns nvmlNvlinkVersion_t (1: 1.0, 2: 2.0, 3: 2.2, 4: 3.0, 5: 3.1,
# 6: 4.0, 7: 5.0; an H200 reads 6), mapped here to the NVLink generation above.
NVML_NVLINK_VERSION = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5}


def pcie_peak_bytes_per_s(gen: int | None, width: int | None) -> float | None:
    """Raw per-direction PCIe bandwidth in bytes/s for generation ``gen`` and ``width`` lanes; None when unknown."""
    if not gen or not width or gen not in _PCIE_GTS:
        return None
    return _PCIE_GTS[gen] * 1e9 * width * _PCIE_ENC[gen] / 8


def nvlink_peak_bytes_per_s(links: int, per_link_bytes_per_s: float | None) -> float | None:
    """Per-direction NVLink bandwidth in bytes/s: links x per-link rate; None when unknown."""
    if not links or not per_link_bytes_per_s:
        return None
    return links * per_link_bytes_per_s


def pcie_label(gen: int | None, width: int | None) -> str:
    """E.g. "PCIe Gen5 x16"."""
    return f"PCIe Gen{gen or '?'} x{width or '?'}"


def device_memory_peak_bytes_per_s(bus_width_bits: int | None, mem_clock_mhz: int | None) -> float | None:
    """Raw device memory bandwidth in bytes/s: bus width (bits) / 8 x memory clock (MHz) x 1e6 x 2
    (double data rate; see the module docstring for the source). None when either is unknown."""
    if not bus_width_bits or not mem_clock_mhz:
        return None
    return bus_width_bits / 8 * mem_clock_mhz * 1e6 * 2


def device_copy_peak_bytes_per_s(gpu: dict | None) -> float | None:
    """The limit of a copy inside one GPU's memory counted once (bytes / time): half the device
    memory bandwidth, since each byte is read and written. None when unknown."""
    peak = (gpu or {}).get("memory_peak_bytes_per_s")
    return peak / 2 if peak else None


def links_sum_bytes_per_s(gpu: dict | None) -> float | None:
    """A GPU's links per direction: NVLink links up x per-link rate, plus its PCIe link; None when
    neither is known."""
    g = gpu or {}
    nv = nvlink_peak_bytes_per_s(g.get("nvlink_links_up") or 0, g.get("nvlink_bytes_per_s_per_link"))
    pcie = g.get("pcie_peak_bytes_per_s")
    if not nv and not pcie:
        return None
    return (nv or 0) + (pcie or 0)


def mark(record, peak_bytes_per_s: float | None, source: str | None) -> None:
    """``record.mark_peak`` plus ``extra.peak_source`` (what the limit is: "device memory / 2", ...)
    and ``extra.limit_flag``. Needs samples."""
    record.mark_peak(peak_bytes_per_s)
    record.extra["peak_source"] = source if peak_bytes_per_s else None
    record.extra["limit_flag"] = "above_peak" if record.extra.get("above_peak") else None


NO_OP_ONE_RANK = "one rank, in place: NCCL moves no data; the figure is the call's time, not a bandwidth"


def mark_collective(record, gpu: dict | None, nvls_possible: bool) -> None:
    """The rule for a collective's record: a one-rank in-place one is ``no_op`` (NCCL moves nothing);
    else the limit fields of :func:`mark` against algbw for one rank (a local copy), busbw otherwise."""
    x = record.extra
    if not record.samples_s or x.get("algbw_bytes_per_s") is None:
        return
    nranks = record.params.get("nranks")
    if nranks == 1 and record.params.get("placement") == "in-place":
        x.update(no_op=NO_OP_ONE_RANK, limit_flag="no_op", peak_bytes_per_s=None, pct_of_peak=None,
                 above_peak=False, peak_source=None)
        return
    if nranks == 1:
        peak = device_copy_peak_bytes_per_s(gpu)
        fig = x["algbw_bytes_per_s"]
        src = "one rank, out of place: a local copy; device memory / 2"
    else:
        peak = links_sum_bytes_per_s(gpu)
        fig = x["busbw_bytes_per_s"]
        src = "busbw against the GPU's NVLink + PCIe per direction"
    x["peak_bytes_per_s"] = peak
    x["peak_source"] = src if peak else None
    x["pct_of_peak"] = 100.0 * fig / peak if peak else None
    above = bool(peak and fig > peak)
    x["above_peak"] = above and not (nranks > 1 and nvls_possible)
    x["above_links_nvls"] = above and nranks > 1 and nvls_possible
    x["limit_flag"] = "above_peak" if x["above_peak"] else None


def finalize(records) -> None:
    """Give every record a ``limit_flag`` (None, "above_peak", "no_op") from what its plug-in marked,
    so nothing above a limit reaches a table, the JSON or compare unflagged."""
    for r in records:
        if "limit_flag" not in r.extra:
            r.extra["limit_flag"] = "no_op" if r.extra.get("no_op") else "above_peak" if r.extra.get("above_peak") else None


def _positive(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def saved_figure(record) -> float | None:
    """The rate (B/s) a saved record's limit is held against, recomputed from its samples: the median
    of nbytes / s, times ``busbw_factor`` for a collective of several ranks. None for a record
    without samples or bytes, or a malformed factor."""
    x = record.extra if isinstance(record.extra, dict) else {}
    p = record.params if isinstance(record.params, dict) else {}
    if record.metric not in ("bandwidth", "time") or not record.samples_s or not record.nbytes:
        return None
    try:
        med = record.rate_summary().median
    except (ValueError, TypeError, ZeroDivisionError):
        return None
    nranks = p.get("nranks")
    if "busbw_factor" in x and isinstance(nranks, int) and not isinstance(nranks, bool) and nranks > 1:
        if not _positive(x.get("busbw_factor")):
            return None
        med *= x["busbw_factor"]
    return med if math.isfinite(med) else None


def saved_flag(record) -> str | None:
    """The limit flag of a record read back from a file: "no_op", "above_peak", "nvls" (busbw above
    the links' sum where NVLS could do it) or None. The saved flags are not the only source: a
    figure recomputed from the samples (:func:`saved_figure`) above a saved peak is flagged too
    (a file from before the flag, or edited samples). Malformed values are ignored."""
    x = record.extra if isinstance(record.extra, dict) else {}
    p = record.params if isinstance(record.params, dict) else {}
    if x.get("limit_flag") == "no_op" or (isinstance(x.get("no_op"), str) and x.get("no_op")) \
            or ("collective" in p and p.get("nranks") == 1 and p.get("nranks") is not True
                and p.get("placement") == "in-place"):
        return "no_op"
    if x.get("limit_flag") == "above_peak" or x.get("above_peak") is True or x.get("above_limit") is True:
        return "above_peak"
    nvls = x.get("above_links_nvls") is True
    peak = x.get("peak_bytes_per_s")
    if _positive(peak):
        fig = saved_figure(record)
        if fig is not None and fig > peak:
            return "nvls" if nvls else "above_peak"
    return "nvls" if nvls else None


def saved_pct_of_peak(record) -> float | None:
    """100 x :func:`saved_figure` / the saved ``peak_bytes_per_s``, else the saved ``pct_of_peak``
    when it is a finite number, else None."""
    x = record.extra if isinstance(record.extra, dict) else {}
    peak = x.get("peak_bytes_per_s")
    if _positive(peak):
        fig = saved_figure(record)
        if fig is not None:
            return 100.0 * fig / peak
    pct = x.get("pct_of_peak")
    if isinstance(pct, (int, float)) and not isinstance(pct, bool) and math.isfinite(pct):
        return float(pct)
    return None


def flag_mark(extra: dict) -> str:
    """The mark a table puts after a figure: " (no-op)", " !!" (above a physical limit), " (NVLS?)"."""
    if extra.get("limit_flag") == "no_op":
        return " (no-op)"
    if extra.get("limit_flag") == "above_peak":
        return " !!"
    if extra.get("above_links_nvls"):
        return " (NVLS?)"
    return ""


def notes(records) -> list[str]:
    """The report's lines for flagged figures (none when nothing is flagged)."""
    out = []
    no_op = [r for r in records if r.extra.get("limit_flag") == "no_op"]
    above = [r for r in records if r.extra.get("limit_flag") == "above_peak"]
    nvls = [r for r in records if r.extra.get("above_links_nvls")]
    if no_op:
        out.append(f"(no-op): {len(no_op)} figure(s) measure no data movement ({no_op[0].extra.get('no_op')}).")
    if above:
        srcs = sorted({r.extra.get("peak_source") or "the link's peak" for r in above})
        out.append(f"!!: {len(above)} figure(s) above a physical limit ({'; '.join(srcs)}): a timing fault, "
                   "not a real speed.")
    if nvls:
        out.append(f"(NVLS?): {len(nvls)} busbw figure(s) above the GPU's links' sum; NVLink SHARP (NVLS) can do "
                   "this, and NCCL_NVLS_ENABLE is not 0.")
    return out

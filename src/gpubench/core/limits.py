"""Physical peak of each link, so a figure can say "88% of PCIe Gen5 x16" and one above it is flagged.

PCIe (per direction, raw after line encoding, before packet/protocol overhead), from the PCI-SIG
base specifications: Gen1 2.5 GT/s and Gen2 5 GT/s per lane with 8b/10b encoding; Gen3 8, Gen4 16,
Gen5 32 GT/s with 128b/130b; Gen6 64 GT/s PAM4 with FLIT mode (taken as 1 byte per 8 transfers
here, FLIT overhead not deducted). Gen5 x16: 32e9 * 16 * 128/130 / 8 = 63.0 GB/s, the figure in
the reference measurements of the lent 2x H200 machine.

NVLink (per direction per link): NVML's NVML_FI_DEV_NVLINK_GET_SPEED field where the driver reports
it (an H200 with driver 580 reports 26562 MB/s, so 18 links = 478.1 GB/s), otherwise by NVLink version:
1.0 20 GB/s, 2.0 25, 3.0 25, 4.0 26.5625, 5.0 53.125 (NVIDIA's architecture whitepapers).

Measured copies never reach these raw figures (PCIe TLP headers cost ~10-13%); the "% of peak" is
against the raw line rate and anything above 100% is flagged as impossible.
"""

from __future__ import annotations

_PCIE_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
_PCIE_ENC = {1: 8 / 10, 2: 8 / 10, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 1.0}
NVLINK_GBPS_PER_LINK = {1: 20.0, 2: 25.0, 3: 25.0, 4: 26.5625, 5: 53.125}
# nvmlDeviceGetNvLinkVersion returns nvmlNvlinkVersion_t (1: 1.0, 2: 2.0, 3: 2.2, 4: 3.0, 5: 3.1,
# 6: 4.0, 7: 5.0; an H200 reads 6), mapped here to the NVLink generation above.
NVML_NVLINK_VERSION = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5}


def pcie_peak_bytes_per_s(gen: int | None, width: int | None) -> float | None:
    """Raw per-direction PCIe bandwidth in bytes/s for generation ``gen`` and ``width`` lanes.

    Returns None when either is unknown.
    """
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


def percent_of_peak(bytes_per_s: float, peak_bytes_per_s: float | None) -> float | None:
    """100 * rate / peak, or None when the peak is unknown."""
    if not peak_bytes_per_s:
        return None
    return 100.0 * bytes_per_s / peak_bytes_per_s

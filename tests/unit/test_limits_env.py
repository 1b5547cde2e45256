import sys
from pathlib import Path

import pytest

from gpubench.core import env, limits
from gpubench.core.errors import UsageError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
import edited  # noqa: E402


def test_pcie_peaks():
    assert limits.pcie_peak_bytes_per_s(5, 16) == pytest.approx(63.015e9, rel=1e-4)  # reference: 63.0
    assert limits.pcie_peak_bytes_per_s(4, 16) == pytest.approx(31.5e9, rel=1e-3)
    assert limits.pcie_peak_bytes_per_s(3, 16) == pytest.approx(15.75e9, rel=1e-3)
    assert limits.pcie_peak_bytes_per_s(2, 16) == pytest.approx(8e9)
    assert limits.pcie_peak_bytes_per_s(None, 16) is None
    assert limits.pcie_label(5, 16) == "PCIe Gen5 x16"


def test_nvlink_peak():
    per = limits.NVLINK_GBPS_PER_LINK[4] * 1e9
    assert limits.nvlink_peak_bytes_per_s(18, per) == pytest.approx(478.1e9, rel=1e-3)  # reference: 478.1
    assert limits.nvlink_peak_bytes_per_s(0, per) is None


def test_capture_without_gpu_still_has_host():
    e = env.capture()
    assert e["host"]["hostname"]
    assert e["host"]["cpu_count"] >= 1
    assert e["versions"]["gpubench"]
    assert isinstance(e["gpus"], list)
    if not e["gpus"]:
        assert e["cuda"]["error"] or e["nvml"]["error"] or e["cuda"]["device_count"] == 0


def test_bus_id_normalisation():
    assert env._norm_bus_id("00000000:1B:00.0") == "0000:1b:00.0"
    assert env._norm_bus_id("0000:1b:00.0") == "0000:1b:00.0"
    assert env._norm_bus_id(None) is None


def test_nvml_nvlink_version_enum_maps_to_generation():
    # an H200 reports nvmlNvlinkVersion_t 6 = NVLink 4.0, 26.5625 GB/s per link per direction
    assert limits.NVLINK_GBPS_PER_LINK[limits.NVML_NVLINK_VERSION[6]] == 26.5625


def test_saved_flag_rules():
    from gpubench.core import limits
    from gpubench.core.result import Result

    def rec(d):
        return Result.from_dict(d).records[0]

    assert limits.saved_flag(rec(edited.with_rate(edited.pinned(), 54.0, peak_bytes_per_s=63.0e9))) is None
    assert limits.saved_flag(rec(edited.with_rate(edited.pinned(), 54.0))) is None  # no peak known: nothing to hold against
    assert limits.saved_flag(rec(edited.with_rate(edited.pinned(), 64.0, peak_bytes_per_s=63.0e9))) == "above_peak"
    # NVLS: a busbw above the links' sum the run marked as possible NVLS stays "nvls", not impossible
    d = edited.nccl_one_rank_in_place(1e-5, peak_bytes_per_s=1e9, above_links_nvls=True)
    d["records"][0]["params"].update(nranks=8, placement="out-of-place")
    assert limits.saved_flag(rec(d)) == "nvls"
    # busbw, not algbw, of several ranks is held against the links: factor 2 lifts 0.6 over 1.0
    d = edited.nccl_one_rank_in_place(1.0, peak_bytes_per_s=1.0e9)
    r = d["records"][0]
    r["params"].update(nranks=2, placement="out-of-place")
    r["samples_s"] = [r["nbytes"] / 0.6e9] * 5
    r["extra"]["busbw_factor"] = 2.0
    assert limits.saved_flag(rec(d)) == "above_peak"
    r["extra"]["busbw_factor"] = 1.0
    assert limits.saved_flag(rec(d)) is None
    # malformed values are ignored, never raised on: the loader refuses a peak that is no number, a
    # Record built in memory may still hold one
    with pytest.raises(UsageError, match="/records/0/extra/peak_bytes_per_s is 'x'"):
        rec(edited.with_rate(edited.pinned(), 54.0, peak_bytes_per_s="x"))
    r = rec(edited.with_rate(edited.pinned(), 54.0, limit_flag=["no_op"], above_peak="yes", no_op=7))
    r.extra["peak_bytes_per_s"] = "x"
    assert limits.saved_flag(r) is None

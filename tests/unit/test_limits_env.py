import pytest

from gpubench.core import env, limits


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
    assert limits.percent_of_peak(50e9, 100e9) == 50.0
    assert limits.percent_of_peak(1, None) is None


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

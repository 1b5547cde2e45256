"""The driver check `gpubench env` makes (gpubench.support), with real version numbers."""

from __future__ import annotations

import pytest

from gpubench.support import CUDA_MAJORS, driver_check, parse_cuda_version, parse_driver_version


def test_parse_versions():
    assert parse_cuda_version("13.0") == (13, 0)
    assert parse_cuda_version("12.9") == (12, 9)
    assert parse_cuda_version(None) is None and parse_cuda_version("") is None and parse_cuda_version("13") is None
    assert parse_driver_version("580.65.06") == (580, 65, 6)
    assert parse_driver_version("535.104.05") == (535, 104, 5)
    assert parse_driver_version("n/a") is None and parse_driver_version(None) is None
    # numeric, not text, order: 580.65.06 is newer than 580.9
    assert parse_driver_version("580.65.06") > parse_driver_version("580.9")
    assert parse_driver_version("525.60.13") < parse_driver_version("525.147.05")


def test_minimum_drivers_are_nvidias():
    assert CUDA_MAJORS[12]["min_driver"] == "525.60.13"
    assert CUDA_MAJORS[13]["min_driver"] == "580.65.06"


def test_nothing_is_claimed_without_both_versions():
    assert driver_check(None, "13.2") is None  # CuPy loads but no driver
    assert driver_check("13.0", None) is None
    assert driver_check(None, None, "580.65.06") is None  # NVML only, no CuPy: no runtime to compare


@pytest.mark.parametrize("driver_cuda, runtime_cuda, nvidia", [
    ("13.0", "13.0", "580.65.06"),   # the CUDA 13.0 GA driver and CuPy's 13.0 runtime
    ("13.0", "12.9", "580.82.07"),   # a 580 driver runs CUDA 12 (backward compatibility)
    ("12.8", "12.8", "570.86.15"),
    ("13.2", "13.0", None),          # no NVML reading: still decided from the CUDA versions
])
def test_a_driver_as_new_as_the_runtime_is_ok(driver_cuda, runtime_cuda, nvidia):
    c = driver_check(driver_cuda, runtime_cuda, nvidia)
    assert c["status"] == "ok" and c["warning"] is None


def test_an_older_minor_runs_under_minor_version_compatibility():
    c = driver_check("13.0", "13.2", "580.65.06")  # CuPy 14.2's CUDA 13.2 runtime on the 580 driver
    assert c["status"] == "minor-version-compatibility"
    assert "CUDA 13.0" in c["warning"] and "13.2" in c["warning"] and "minor version compatibility" in c["warning"]
    assert c["min_driver"] == "580.65.06"
    c = driver_check("12.2", "12.9", "535.104.05")
    assert c["status"] == "minor-version-compatibility"


def test_an_older_major_is_too_old_and_names_the_minimum_and_the_other_extra():
    c = driver_check("12.2", "13.0", "535.104.05")  # R535 (CUDA 12.2) under cupy-cuda13x
    assert c["status"] == "driver-too-old"
    w = c["warning"]
    assert "535.104.05" in w and "CUDA 12.2" in w and "13.0" in w
    assert ">= 580.65.06" in w and "gpubench-cuda[cuda12]" in w
    c = driver_check("11.8", "12.0", "520.61.05")  # no older supported extra to switch to
    assert c["status"] == "driver-too-old" and ">= 525.60.13" in c["warning"] and "gpubench-cuda[" not in c["warning"]


def test_a_driver_below_the_majors_minimum_is_too_old_even_when_the_major_matches():
    # a driver below 580.65.06 that reports CUDA 13.0 (as a pre-release driver can)
    c = driver_check("13.0", "13.0", "580.22")
    assert c["status"] == "driver-too-old" and ">= 580.65.06" in c["warning"]


def test_env_says_nothing_false_without_a_gpu():
    from gpubench.core import env as envmod

    env = envmod.capture()
    cuda = env["cuda"]
    if cuda["driver_version"] is None or cuda["runtime_version"] is None:
        assert cuda["driver_check"] is None
    else:  # a GPU machine: the check is made and matches the versions it read
        assert cuda["driver_check"] == driver_check(cuda["driver_version"], cuda["runtime_version"],
                                                    env["nvml"]["driver_version"])


def test_env_report_lists_what_is_supported(run_cli):
    code, out, err = run_cli("env")
    assert code == 0
    assert "Supported" in out and "3.11, 3.12, 3.13" in out
    assert ">= 525.60.13" in out and ">= 580.65.06" in out and "gpubench-cuda[cuda13]" in out

"""Telemetry, NUMA placement, limits and the idle check on a real GPU.

Every check reads what the run measured: telemetry blocks sampled by NVML during the points, the
pages of the host buffers read back with move_pages, the device memory limit from NVML, the idle
check against a second process that really holds the GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gpubench.core import benchmark as driver
from gpubench.core import env as envmod
from gpubench.core.result import Result, json_schema
from gpubench.core.timing import TimingPlan

pytestmark = pytest.mark.gpu


def _copy(directions=("h2d", "d2h", "d2d"), memory=("pinned", "pageable"), **cond):
    from gpubench.plugins.copy.bench import CopySpec, run

    spec = CopySpec(sizes=(64 << 20,), directions=directions, memory=memory, plan=TimingPlan(warmup=1, iters=10))
    with driver.conditions(driver.Conditions(**cond)):
        return run(spec)


def test_telemetry_block_per_record_and_schema():
    result = _copy()
    assert result.env["telemetry"]["enabled"] is True and result.env["telemetry"]["error"] is None
    for r in result.records:
        t = r.telemetry
        assert t is not None and t["n"] >= 2 and t["devices"] == [0]
        assert 100 <= t["sm_clock_mhz"]["min"] <= t["sm_clock_mhz"]["max"] <= 5000
        assert t["power_w"]["median"] > 0 and t["temp_c"]["median"] > 0
        assert t["pcie"]["gen"] >= 1 and t["pcie"]["width"] >= 1
        assert t["pcie_replay_delta"] is None or t["pcie_replay_delta"] >= 0
    d = result.to_dict()
    try:
        import jsonschema
    except ImportError:
        jsonschema = None  # the CPU tests hold every saved result to the schema
    if jsonschema is not None:
        jsonschema.validate(d, json_schema())
    back = Result.from_dict(d)
    assert back.records[0].telemetry == result.records[0].telemetry


def test_no_telemetry_leaves_it_out():
    result = _copy(directions=("h2d",), memory=("pinned",), telemetry=False)
    assert result.env["telemetry"]["enabled"] is False
    assert all(r.telemetry is None for r in result.records)


def test_host_pages_found_on_the_bound_node():
    before = os.sched_getaffinity(0)
    result = _copy(directions=("h2d",))
    assert os.sched_getaffinity(0) == before  # the measuring thread's mask is restored after the run
    binding = result.env["numa"]["bindings"][0]
    for r in result.records:
        h = r.extra["host_numa"]
        assert h["pages_checked"] > 0 and "error" not in h, h
        nodes = {int(n) for n in h["pages"]}
        assert nodes, h
        if binding["node"] is not None:
            assert nodes == {binding["node"]}, (h, binding)


def test_numa_all_tags_each_node():
    from gpubench.core import numa

    have = [n for n, c in numa.nodes().items() if c]
    result = _copy(directions=("h2d",), memory=("pinned",), numa="all")
    assert sorted({r.params["numa_node"] for r in result.records}) == have


def test_d2d_held_against_device_memory():
    result = _copy(directions=("d2d",))
    g = envmod.gpu_by_index(result.env, 0)
    assert g["memory_bus_width_bits"] and g["memory_clock_max_mhz"]
    r = result.records[0]
    assert r.extra["peak_bytes_per_s"] == pytest.approx(g["memory_peak_bytes_per_s"] / 2)
    assert 10 < r.extra["pct_of_peak"] < 100, r.extra
    assert r.extra["limit_flag"] is None


def test_one_rank_in_place_all_gather_is_a_no_op():
    pytest.importorskip("cupy")
    from gpubench.plugins.nccl.bench import NcclSpec, run
    from gpubench.core.errors import UsageError

    try:
        spec = NcclSpec(collective="all-gather", sizes=(1 << 26,), devices=(0,), iters=5, warmup=2, samples=3)
        result = run(spec)
    except UsageError as e:  # no NCCL here
        pytest.skip(f"nccl not runnable here: {e}")
    by = {r.params["placement"]: r for r in result.records}
    assert by["in-place"].extra["limit_flag"] == "no_op"
    assert by["out-of-place"].extra["limit_flag"] in (None, "above_peak")
    assert by["out-of-place"].extra["peak_source"].startswith("one rank, out of place")


def test_idle_check_sees_a_second_process():
    cupy = pytest.importorskip("cupy")
    del cupy
    code = ("import cupy,time\na=cupy.random.rand(4096,4096,dtype=cupy.float32)\nprint('up',flush=True)\n"
            "t=time.time()\nwhile time.time()-t<20:\n    a@a\n    cupy.cuda.Device().synchronize()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "up"
        time.sleep(1.5)
        env = envmod.capture()
        check = envmod.idle_check(env["gpus"], (0,))
        assert check["idle"] is False, check
        assert any(q["pid"] == p.pid for q in check["gpus"][0]["other_processes"]), check
        with pytest.raises(driver.BusyGPU):
            _copy(directions=("h2d",), memory=("pinned",), require_idle=True)
        result = _copy(directions=("h2d",), memory=("pinned",))
        assert result.env["preflight"]["idle"] is False
        assert all((r.telemetry or {}).get("other_processes", 0) >= 1 for r in result.records)
    finally:
        p.kill()
        p.wait()

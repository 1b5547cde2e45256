"""The conditions of a run, without a GPU: the NUMA binding logic against this machine's real topology
(/sys/devices/system/node, sched_setaffinity, move_pages on real pages), the telemetry block's
shape and schema, the report's telemetry lines, the limit flags on saved results, the idle check
without NVML."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import numpy as np
import pytest

from gpubench.core import benchmark as driver
from gpubench.core import env as envmod
from gpubench.core import limits, numa, telemetry
from gpubench.core.errors import UsageError
from gpubench.core.result import Record, Result, json_schema

DATA = Path(__file__).resolve().parents[1] / "data"


# -- NUMA against this machine --------------------------------------------------------------------


def test_cpulist_round_trip():
    assert numa.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert numa.format_cpulist([11, 10, 8, 3, 2, 1, 0]) == "0-3,8,10-11"
    assert numa.format_cpulist([5]) == "5"
    with pytest.raises(ValueError):
        numa.parse_cpulist("3-1")


def test_nodes_are_this_machines():
    have = numa.nodes()
    assert have, "this machine shows no /sys/devices/system/node/node*"
    for n, cpus in have.items():
        text = Path(f"/sys/devices/system/node/node{n}/cpulist").read_text()
        assert cpus == numa.parse_cpulist(text)
    assert set(os.sched_getaffinity(0)) <= {c for cpus in have.values() for c in cpus}


def test_parse_policy():
    first = next(iter(numa.nodes()))
    assert numa.parse_policy(None) == "auto"
    assert numa.parse_policy("ALL") == "all" and numa.parse_policy("none") == "none"
    assert numa.parse_policy(str(first)) == first
    assert numa.parse_policy(f" {first}\t") == first and numa.parse_policy(" all ") == "all"  # as every value
    with pytest.raises(UsageError, match="is not a NUMA node"):
        numa.parse_policy(f"\u00a0{first}")  # only ASCII spaces are dropped
    with pytest.raises(UsageError, match="no NUMA node 4096"):
        numa.parse_policy("4096")
    with pytest.raises(UsageError, match="is not a NUMA node"):
        numa.parse_policy("socket0")


def test_plan_auto_uses_the_gpus_node_then_its_local_cpus():
    have = numa.nodes()
    n0 = next(iter(have))
    allowed = set(os.sched_getaffinity(0))
    b = numa.plan("auto", {"index": 0, "numa_node": n0, "cpu_affinity": None}, True)
    assert len(b) == 1 and b[0].node == n0 and set(b[0].cpus) == set(have[n0]) & allowed
    one = sorted(allowed)[0]
    b = numa.plan("auto", {"index": 0, "numa_node": -1, "cpu_affinity": str(one)}, True)  # a VM's GPU
    assert b[0].cpus == (one,) and "local CPUs" in b[0].reason
    assert b[0].node == (n0 if len(have) == 1 else None)
    b = numa.plan("auto", {"index": 0, "numa_node": None, "cpu_affinity": None}, True)
    assert b[0].cpus is None and "not bound" in b[0].reason
    assert numa.plan("none", {"index": 0, "numa_node": n0}, True)[0].cpus is None


def test_plan_all_one_pass_per_node_and_only_with_host_buffers():
    b = numa.plan("all", None, True)
    assert [x.tag for x in b] == [n for n, c in numa.nodes().items() if set(c) & set(os.sched_getaffinity(0))]
    with pytest.raises(UsageError, match="uses no host buffers"):
        numa.plan("all", None, False)


def test_bound_sets_and_restores_the_mask():
    before = os.sched_getaffinity(0)
    one = sorted(before)[-1]
    with numa.bound(numa.Binding(None, (one,), "test")):
        assert os.sched_getaffinity(0) == {one}
    assert os.sched_getaffinity(0) == before


def test_page_nodes_reads_real_pages():
    a = np.ones(8 << 20, dtype=np.uint8)  # touched
    got = numa.page_nodes(a.ctypes.data, a.nbytes)
    assert got["error"] is None and got["pages_checked"] == numa.MAX_PAGES_CHECKED
    assert {int(n) for n in got["pages"]} <= set(numa.nodes()) and sum(got["pages"].values()) == got["pages_checked"]
    fresh = np.empty(64 << 20, dtype=np.uint8)  # large: mmap'd, not touched yet
    got = numa.page_nodes(fresh.ctypes.data, fresh.nbytes)
    assert got["not_present"] > 0


class _Buf:
    """A host buffer as gpu.HostBuffer looks to the log: ptr, nbytes, kind (real memory)."""

    def __init__(self, n):
        self.array = np.ones(n, dtype=np.uint8)
        self.ptr, self.nbytes, self.kind = self.array.ctypes.data, n, "pageable"


def test_placement_log_counts_freed_and_live_buffers():
    with numa.placement_log() as log:
        a, b = _Buf(1 << 20), _Buf(2 << 20)
        numa.track(a)
        numa.track(b)
        numa.release(a)  # freed during the point: read then
        got = log.take()  # b still alive: read now
    assert got["buffers"] == 2 and got["kinds"] == ["pageable"]
    assert got["pages_checked"] >= 2 and sum(got["pages"].values()) + got["not_present"] == got["pages_checked"]
    assert got["not_present"] == 0  # both were touched (np.ones)
    numa.track(_Buf(4096))  # no log open: ignored, no error


# -- telemetry block -------------------------------------------------------------------------------


def _block(sm=(1410, 1980), reasons=0, others=0, replay=0):
    samples = [(sm[0], 3201, 650.0, 60, reasons), (sm[1], 3201, 690.0, 61, 0), ((sm[0] + sm[1]) // 2, 3201, 700.0, 62, 0)]
    start = [{"gen": 5, "width": 16, "replay": 10, "nvlink": None, "others": others}]
    end = [{"gen": 4, "width": 16, "replay": 10 + replay, "nvlink": None, "others": 0}]
    return telemetry.summarize(samples, start, end, 0.01, [0])


def test_block_shape_and_schema():
    jsonschema = pytest.importorskip("jsonschema")
    b = _block(reasons=0x4 | 0x1 | 0x40)
    assert b["n"] == 3 and b["sm_clock_mhz"] == {"min": 1410, "median": 1695, "max": 1980}
    assert b["power_w"]["max"] == 700.0 and b["reasons"] == ["sw_power_cap", "hw_thermal"]
    assert b["pcie"] == {"gen": 4, "width": 16} and b["pcie_replay_delta"] == 0 and b["nvlink_errors_delta"] is None
    for key in ("n", "interval_s", "sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c", "reasons", "pcie",
                "pcie_replay_delta", "nvlink_errors_delta"):
        assert key in b
    schema = json_schema()
    at = {"device": 0, "direction": "h2d", "memory": "pinned"}
    r = Record(params={**at, "nbytes": 1}, nbytes=1, samples_s=[1e-3], telemetry=b)
    res = Result(command="copy", spec={}, records=[r, Record(params={**at, "nbytes": 2}, nbytes=2, samples_s=[1e-3])])
    d = res.to_dict()
    jsonschema.validate(d, schema)
    back = Result.from_dict(json.loads(json.dumps(d)))
    assert back.records[0].telemetry == b and back.records[1].telemetry is None
    bad = copy.deepcopy(d)
    bad["records"][0]["telemetry"]["reasons"] = ["overheated"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    del bad["records"][0]["telemetry"]["reasons"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    old = copy.deepcopy(d)  # a file from before telemetry: no field at all
    for rec in old["records"]:
        del rec["telemetry"]
    jsonschema.validate(old, schema)
    assert Result.from_dict(old).records[0].telemetry is None


def test_notes_say_something_only_when_something_happened():
    quiet = [Record(params={"i": i}, telemetry=_block(sm=(1980, 1980))) for i in range(10)]
    assert telemetry.notes(quiet) == []
    recs = [Record(params={"i": i}, telemetry=_block(sm=(1410 + i, 1980), reasons=0x4 if i < 3 else 0))
            for i in range(10)]
    recs.append(Record(params={"i": 0, "dir": "d2h"}, telemetry=recs[0].telemetry))  # same point, second record
    (line,) = telemetry.notes(recs)
    assert line.startswith("GPU 0 power-capped during 3 of 10 points; SM clock 1410-1980 MHz")
    (line,) = telemetry.notes([Record(params={}, telemetry=_block(others=2, replay=3))])
    assert "shared with 2 other processes during 1 of 1 points" in line and "3 PCIe replay(s)" in line


# -- limits on saved results ------------------------------------------------------------------------


def test_device_memory_peak_from_nvml_fields():
    # the lent H200: NVML reports a 6016-bit bus and 3201 MHz -> 4.814 TB/s (datasheet: 4.8 TB/s)
    assert limits.device_memory_peak_bytes_per_s(6016, 3201) == pytest.approx(4.8143e12, rel=1e-4)
    assert limits.device_copy_peak_bytes_per_s({"memory_peak_bytes_per_s": 4.8152e12}) == pytest.approx(2.4076e12)
    assert limits.device_memory_peak_bytes_per_s(None, 3201) is None


def _one_rank_all_gather(place: str, seconds: float) -> Record:
    n = 4 << 30
    return Record(params={"collective": "all-gather", "nbytes": n, "placement": place, "nranks": 1},
                  nbytes=n, samples_s=[seconds] * 5,
                  extra={"algbw_bytes_per_s": n / seconds, "busbw_bytes_per_s": 0.0, "time_s": seconds})


def test_a_one_rank_in_place_all_gather_is_a_no_op():
    g = {"index": 0, "memory_peak_bytes_per_s": 4.8152e12, "pcie_peak_bytes_per_s": 63.0e9}
    r = _one_rank_all_gather("in-place", 3.41e-6)  # 1,259,644 GB/s, as a real one-rank run reported (1,260,537.8 GB/s)
    assert r.extra["algbw_bytes_per_s"] > 1e15
    limits.mark_collective(r, g, nvls_possible=False)
    assert r.extra["limit_flag"] == "no_op" and "no data" in r.extra["no_op"]
    out = _one_rank_all_gather("out-of-place", (4 << 30) / 2.0e12)
    limits.mark_collective(out, g, nvls_possible=False)
    assert out.extra["limit_flag"] is None and out.extra["pct_of_peak"] == pytest.approx(83.1, abs=0.1)
    fast = _one_rank_all_gather("out-of-place", (4 << 30) / 3.0e12)  # above device memory / 2: impossible
    limits.mark_collective(fast, g, nvls_possible=False)
    assert fast.extra["limit_flag"] == "above_peak"
    from gpubench.plugins.nccl.command import format_report

    res = Result(command="nccl", spec={"places": ["out-of-place", "in-place"], "nranks": 1, "collective": "all-gather",
                                       "dtype": "float", "iters": 20, "samples": 5}, records=[out, r])
    text = _render(format_report(res) + __import__("gpubench.core.report", fromlist=["x"]).condition_notes(res))
    assert "(no-op)" in text and "measure no data movement" in text


def _render(renderables) -> str:
    from rich.console import Console

    c = Console(width=250, record=True, file=open(os.devnull, "w"))
    for x in renderables:
        c.print(x)
    return c.export_text()


def test_saved_two_rank_nccl_against_the_links():
    d = json.loads((DATA / "nccl-h200x2.json").read_text())
    res = Result.from_dict(d)
    from gpubench.plugins.nccl.bench import mark_collectives

    os.environ["NCCL_NVLS_ENABLE"] = "0"
    try:
        mark_collectives(res.records, res.env, (0,))
        measured = [r for r in res.records if r.samples_s]
        assert measured and all(r.extra["limit_flag"] is None for r in measured)
        links = 18 * 26.562e9 + 63.015e9
        assert measured[-1].extra["peak_bytes_per_s"] == pytest.approx(links, rel=1e-3)
        doctored = copy.deepcopy(measured[-1])
        doctored.extra["busbw_bytes_per_s"] = 1.2 * links
        limits.mark_collective(doctored, envmod.gpu_by_index(res.env, 0), nvls_possible=False)
        assert doctored.extra["limit_flag"] == "above_peak" and limits.flag_mark(doctored.extra) == " !!"
        limits.mark_collective(doctored, envmod.gpu_by_index(res.env, 0), nvls_possible=True)
        assert doctored.extra["limit_flag"] is None and limits.flag_mark(doctored.extra) == " (NVLS?)"
    finally:
        del os.environ["NCCL_NVLS_ENABLE"]


def test_saved_copy_marks_and_finalize():
    res = Result.from_dict(json.loads((DATA / "copy-pinned-h200.json").read_text()))
    limits.finalize(res.records)
    assert all(r.extra["limit_flag"] is None for r in res.records if r.samples_s)  # 55 GB/s of 63: fine
    r = copy.deepcopy(next(r for r in res.records if r.samples_s))
    r.samples_s = [r.nbytes / 70e9] * 3  # 70 GB/s over PCIe Gen5 x16
    limits.mark(r, 63.0e9, "PCIe Gen5 x16")
    assert r.extra["above_peak"] and r.extra["limit_flag"] == "above_peak"
    assert "above a physical limit (PCIe Gen5 x16)" in limits.notes([r])[0]


# -- idle check and the driver without a GPU ------------------------------------------------------


def test_idle_check_never_raises():
    got = envmod.idle_check([{"index": 0, "uuid": "GPU-00000000-0000-0000-0000-000000000000"}], (0,))
    assert set(got) == {"idle", "warnings", "gpus", "error"}
    if got["error"] is None:  # NVML present (a GPU machine): an unknown uuid is reported, not raised
        assert got["gpus"][0].get("error")


class _Toy(driver.Benchmark):
    name = "copy"
    needs_gpu = False
    host_memory = True

    def points(self, spec, devices):
        return [driver.Point("p0", 0), driver.Point("p1", 1)]

    def measure(self, ctx, point):
        buf = _Buf(1 << 20)
        numa.track(buf)
        numa.release(buf)
        r = Record(params={"i": point.key}, nbytes=100, samples_s=[1.0])
        limits.mark(r, 50.0 if point.key else None, "toy link")
        return [r]


def test_driver_without_gpu_no_telemetry_flags_set():
    res = driver.run(_Toy(), spec=type("S", (), {"to_dict": lambda self: {}})())
    assert [r.telemetry for r in res.records] == [None, None]
    assert res.env["telemetry"]["enabled"] is False
    assert [r.extra["limit_flag"] for r in res.records] == [None, "above_peak"]
    assert res.records[0].extra["host_numa"]["buffers"] == 1  # the placement log ran around the point


# -- the options -------------------------------------------------------------------------------------


@pytest.mark.parametrize("cmd", ["copy", "batch", "memcpy2d", "overlap", "p2p", "nccl", "pin"])
def test_condition_options_on_every_gpu_command(run_cli, cmd):
    code, out, _ = run_cli(cmd, "--help")
    assert code == 0 and "--no-telemetry" in out and "--numa" in out and "--require-idle" in out


def test_net_has_no_condition_options(run_cli):
    code, out, _ = run_cli("net", "local", "--help")
    assert code == 0 and "--no-telemetry" not in out


@pytest.mark.parametrize("value,words", [("99", "no NUMA node 99"), ("socket", "is not a NUMA node"),
                                         ("-1", "'-1' is not a NUMA node"), ("-0", "'-0' is not a NUMA node"),
                                         ("", "is not a NUMA node")])
def test_bad_numa_one_line_exit_2(run_cli, value, words):
    code, out, err = run_cli("copy", "--numa", value)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_conditions_reach_the_driver():
    """benchmark_command pops the options into Conditions that driver.run reads."""
    from click.testing import CliRunner

    from gpubench.kit import benchmark_command

    seen = []

    def build_spec(**kw):
        assert not {"no_telemetry", "numa", "require_idle"} & set(kw)
        return type("S", (), {"to_dict": lambda self: {}})()

    def run(spec):
        def go(s, progress):
            seen.append(driver._CONDITIONS.get())
            return Result(command="copy", spec={})
        return go

    cmd = benchmark_command("copy", [], build_spec, lambda r, units="GB": [], help="x", run=run)
    res = CliRunner().invoke(cmd, ["--no-telemetry", "--numa", "none", "--require-idle", "-q"])
    assert res.exit_code == 0, res.output
    assert seen == [driver.Conditions(telemetry=False, numa="none", require_idle=True)]
    assert driver._CONDITIONS.get() == driver.Conditions()  # reset after the command

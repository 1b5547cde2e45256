"""copy on a real GPU: data verified for every memory kind and direction, pinned beats pageable,
no figure above the link peak, the JSON carries samples and environment."""

from __future__ import annotations

import json

import pytest

from gpubench.plugins.copy.bench import CopySpec, run
from gpubench.core.gpu import MEMORY_KINDS
from gpubench.core.result import load, save
from gpubench.core.timing import TimingPlan

pytestmark = pytest.mark.gpu


def test_verify_every_kind_and_direction():
    spec = CopySpec(sizes=(4096, 1 << 20), directions=("h2d", "d2h", "bidir"), memory=MEMORY_KINDS,
                    plan=TimingPlan(warmup=1, iters=3), verify=True)
    result = run(spec)
    assert not result.partial
    assert len(result.records) == 2 * 4 * 5  # sizes x kinds x (h2d, d2h, bidir-h2d, bidir-d2h, bidir-total)
    for r in result.records:
        assert r.error is None, r.error
        assert r.extra["verified"] is True, r.params
        assert len(r.samples_s) == 3 and all(t > 0 for t in r.samples_s)


def test_pinned_beats_pageable_from_16MiB():
    spec = CopySpec(sizes=(16 << 20, 64 << 20), directions=("h2d", "d2h"), memory=("pinned", "pageable"),
                    plan=TimingPlan(warmup=1, iters=5))
    result = run(spec)
    med = {(r.params["direction"], r.params["memory"], r.params["nbytes"]): r.rate_summary().median
           for r in result.records}
    for d in ("h2d", "d2h"):
        for n in (16 << 20, 64 << 20):
            assert med[(d, "pinned", n)] > med[(d, "pageable", n)], (d, n, med)


def test_no_figure_above_link_peak_and_json_round_trip(tmp_path):
    spec = CopySpec(sizes=(1 << 20, 256 << 20), directions=("h2d", "d2h", "bidir"), memory=("pinned",),
                    plan=TimingPlan(warmup=1, iters=5))
    result = run(spec)
    for r in result.records:
        peak = r.extra["peak_bytes_per_s"]
        assert peak, "env must report the PCIe link peak"
        assert r.rate_summary().median <= peak, (r.params, r.rate_summary().median, peak)
        assert r.extra["above_peak"] is False
    path = save(result, tmp_path / "copy.json")
    raw = json.loads(path.read_text())
    assert raw["env"]["gpus"][0]["name"]
    assert raw["records"][0]["samples_s"]
    again = load(path)
    assert [r.samples_s for r in again.records] == [r.samples_s for r in result.records]


def test_several_devices_and_all_at_once(gpu_count):
    if gpu_count < 2:
        pytest.skip("needs 2 GPUs")
    spec = CopySpec(sizes=(64 << 20,), directions=("h2d",), memory=("pinned",), devices=(0, 1),
                    plan=TimingPlan(warmup=1, iters=3))
    result = run(spec)
    devs = {r.params["device"] for r in result.records}
    assert devs == {0, 1, "0@all", "1@all", "all"}
    agg = next(r for r in result.records if r.params["device"] == "all")
    one = next(r for r in result.records if r.params["device"] == 0)
    assert agg.rate_summary().median > one.rate_summary().median


def test_oversized_pinned_point_fails_alone_and_sweep_goes_on():
    """A size that cannot be page-locked gives an error row; the other sizes are measured."""
    from gpubench.core.env import host_memory

    total, _ = host_memory()
    huge = 1 << (2 * total).bit_length()  # over twice the host RAM
    from gpubench.plugins.copy import bench

    from gpubench.core.benchmark import Context

    spec = CopySpec(sizes=(1 << 20,), directions=("h2d",), memory=("pinned",), plan=TimingPlan(warmup=0, iters=2))
    ctx = Context(spec=spec, env={}, devices=(0,), data={"peaks": {0: None}})
    ok = bench._host_records(ctx, bench._Group(0, 1 << 20, "pinned", ("h2d",)))
    assert ok and ok[0].error is None
    with pytest.raises(Exception) as info:
        bench._host_records(ctx, bench._Group(0, huge, "pinned", ("h2d",)))
    from gpubench.core.gpu import is_oom

    assert is_oom(info.value), repr(info.value)


def test_memory_stays_flat_over_repeated_sweeps():
    """100 repetitions of a small sweep leave host RSS and device memory where the first left them."""
    from gpubench.core.gpu import device_free_bytes

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    spec = CopySpec(sizes=(4096, 1 << 20), directions=("h2d", "d2h", "bidir"), memory=MEMORY_KINDS,
                    plan=TimingPlan(warmup=0, iters=2))
    run(spec)
    rss0, dev0 = rss(), device_free_bytes(0)[0]
    for _ in range(100):
        run(spec)
    assert rss() - rss0 < 32 * 2**20
    assert dev0 - device_free_bytes(0)[0] < 16 * 2**20


def test_nvbandwidth_sm_local_and_latency_entries_verify_and_stay_physical():
    """h2d-sm / d2h-sm (copy kernel over page-locked host memory), d2d (device local copy) and
    latency (pointer chase): data verified, SM copies under the PCIe peak, latency a plausible
    PCIe round trip (0.3..20 us per access), pageable memory refused for the SM tests."""
    spec = CopySpec(sizes=(1 << 20, 128 << 20), directions=("h2d-sm", "d2h-sm", "d2d", "latency"),
                    memory=("pinned", "pageable"), plan=TimingPlan(warmup=1, iters=3), verify=True)
    result = run(spec)
    assert not result.partial
    by = {(r.params["direction"], r.params["memory"], r.params["nbytes"]): r for r in result.records}
    for n in (1 << 20, 128 << 20):
        for d in ("h2d-sm", "d2h-sm"):
            r = by[(d, "pinned", n)]
            assert r.error is None and r.extra["verified"] is True, (d, n, r.error)
            assert 0 < r.rate_summary().median <= r.extra["peak_bytes_per_s"], (d, n)
            assert by[(d, "pageable", n)].error.startswith("skipped")
        r = by[("d2d", "device", n)]
        assert r.error is None and r.extra["verified"] is True and r.nbytes == n
        lat = by[("latency", "pinned", n)]
        assert lat.metric == "time" and lat.error is None
        assert 0.3e-6 < lat.time_summary().median < 20e-6, lat.time_summary()
    # device memory moves faster than any PCIe link
    assert by[("d2d", "device", 128 << 20)].rate_summary().median > by[("h2d-sm", "pinned", 128 << 20)].extra[
        "peak_bytes_per_s"]

"""Pure logic of ``gpubench merge``: dask-cuda's statistics on hand-made transfer logs, the pool and
device checks, option parsing, the data generator and the report's layout."""

from __future__ import annotations

import math

import pytest

from gpubench.plugins.merge import bench as m
from gpubench.plugins.merge import cluster as mc
from gpubench.plugins.merge import data as md
from gpubench.plugins.merge import stats as ms
from gpubench.plugins.merge.command import build_spec, format_bytes, format_lines, format_notes, format_time, parse_pool_size
from gpubench.core.errors import UsageError
from gpubench.core.result import Record, Result

GiB = 2**30


# --- hmean / hstd (dask-cuda benchmarks/utils.py) -----------------------------------------------


def test_hmean_by_hand():
    assert ms.hmean([1.0, 2.0, 4.0]) == pytest.approx(3 / (1 + 0.5 + 0.25))
    assert ms.hmean([5.0]) == 5.0
    assert ms.hmean([]) == 0


def test_hstd_by_hand():
    xs = [1.0, 2.0, 4.0]
    inv = [1.0, 0.5, 0.25]
    rmean = sum(inv) / 3
    rvar = sum((v - rmean) ** 2 for v in inv) / 3  # population variance, as numpy's var
    assert ms.hstd(xs) == pytest.approx(math.sqrt(rvar / (3 * rmean**4)))
    assert ms.hstd([7.0, 7.0]) == 0.0
    assert ms.hstd([]) == 0


def test_hmean_hstd_match_numpy_formulas():
    np = pytest.importorskip("numpy")
    a = np.array([3.0e8, 8.1e8, 7.9e8, 1.2e9, 5.5e7])
    assert ms.hmean(list(a)) == pytest.approx(1 / np.mean(1 / a))
    assert ms.hstd(list(a)) == pytest.approx(np.sqrt(np.var(1 / a) / (len(a) * np.mean(1 / a) ** 4)))


# --- pair statistics from transfer_incoming_log ---------------------------------------------------

A, B, C = "tcp://10.0.0.1:4001", "tcp://10.0.0.1:4002", "tcp://10.0.0.2:4001"
INDEX = {A: 0, B: 1, C: 2}


def _e(who, total, bw):
    return {"who": who, "total": total, "bandwidth": bw, "duration": total / bw}


def test_pair_statistics_quantiles_totals_and_direction():
    logs = {
        A: [_e(B, 4_000_000, 100.0), _e(B, 2_000_000, 200.0), _e(B, 3_000_000, 300.0), _e(B, 5_000_000, 400.0)],
        B: [_e(A, 8_000_000, 50.0)],
        C: [],
    }
    pairs = ms.pair_statistics(logs, INDEX, ignore_size=None)
    assert [(p.w1, p.w2) for p in pairs] == [(0, 1), (1, 0)]
    ab = pairs[0]
    # (w1, w2) = (receiver, sender): A received four transfers from B
    assert ab.n == 4 and ab.total_bytes == 14_000_000
    # numpy's linear quantiles of [100, 200, 300, 400]: positions 0.75, 1.5, 2.25
    assert (ab.q25, ab.q50, ab.q75) == pytest.approx((175.0, 250.0, 325.0))
    assert (ab.min, ab.max) == (100.0, 400.0)
    assert ab.hmean == pytest.approx(ms.hmean([100.0, 200.0, 300.0, 400.0]))
    ba = pairs[1]
    assert (ba.n, ba.total_bytes, ba.q50) == (1, 8_000_000, 50.0)


def test_pair_statistics_ignore_size_leaves_small_transfers_out():
    logs = {A: [_e(B, 999, 1.0), _e(B, 1000, 10.0), _e(C, 10, 5.0)]}
    pairs = ms.pair_statistics(logs, INDEX, ignore_size=1000)
    assert len(pairs) == 1
    p = pairs[0]
    assert (p.w1, p.w2, p.n, p.total_bytes, p.q50) == (0, 1, 1, 1000, 10.0)
    assert ms.pair_statistics(logs, INDEX, ignore_size=10**6) == []
    assert len(ms.pair_statistics(logs, INDEX, ignore_size=0)) == 2


def test_pair_statistics_skips_workers_not_in_the_index():
    logs = {A: [_e("tcp://gone:1", 10**7, 1.0)], "tcp://gone:1": [_e(A, 10**7, 1.0)]}
    assert ms.pair_statistics(logs, INDEX, None) == []


def test_address_to_index_groups_hosts_then_devices():
    devices = {"tcp://10.0.0.2:5": 0, "tcp://10.0.0.1:9": 1, "tcp://10.0.0.1:7": 0, "ucx://10.0.0.2:3": 1}
    idx = ms.address_to_index(devices)
    assert idx == {"tcp://10.0.0.1:7": 0, "tcp://10.0.0.1:9": 1, "tcp://10.0.0.2:5": 2, "ucx://10.0.0.2:3": 3}


def test_address_host_forms():
    assert ms._address_host("tcp://127.0.0.1:4000") == "127.0.0.1"
    assert ms._address_host("ucx://[::1]:4000") == "::1"
    assert ms._address_host("inproc://host/1/2") == "host/1/2".rsplit(":", 1)[0]


# --- pool and device checks ----------------------------------------------------------------------


def _spec(**kw):
    return m.MergeSpec(**{"devices": (0, 1), **kw})


def test_pool_that_fits_passes():
    mem = {0: (140 * GiB, 141 * GiB), 1: (140 * GiB, 141 * GiB)}
    mc.check_devices_and_memory(_spec(rmm_pool_bytes=30 * 10**9), 2, mem, scheduler_device=0)


def test_pool_larger_than_free_memory_is_refused_naming_the_gpu():
    mem = {0: (140 * GiB, 141 * GiB), 1: (20 * GiB, 141 * GiB)}
    with pytest.raises(UsageError) as e:
        mc.check_devices_and_memory(_spec(rmm_pool_bytes=30 * 10**9), 2, mem, scheduler_device=0)
    assert "GPU 1" in e.value.message and "free" in e.value.message
    with pytest.raises(UsageError):
        mc.check_devices_and_memory(_spec(rmm_pool_bytes=500 * 10**9), 2, {0: (140 * GiB, 141 * GiB),
                                                                         1: (140 * GiB, 141 * GiB)})


def test_pool_leaves_room_for_the_context_and_the_scheduler_pool():
    pool = 10 * GiB
    just = pool + mc.CONTEXT_MARGIN_BYTES
    mem = {0: (just, 80 * GiB), 1: (just, 80 * GiB)}
    # device 1 has exactly pool + context; device 0 also hosts the scheduler's 1 GB pool and context
    with pytest.raises(UsageError) as e:
        mc.check_devices_and_memory(_spec(rmm_pool_bytes=pool), 2, mem, scheduler_device=0)
    assert "GPU 0" in e.value.message and "scheduler" in e.value.message
    mc.check_devices_and_memory(_spec(rmm_pool_bytes=pool), 2, mem, scheduler_device=None)
    with pytest.raises(UsageError):
        mc.check_devices_and_memory(_spec(rmm_pool_bytes=pool + 1), 2, mem, scheduler_device=None)


def test_pool_fraction_default_and_async():
    total = 100 * GiB
    assert mc.required_device_bytes(_spec(rmm_pool_fraction=0.25), total) == 25 * GiB
    assert mc.required_device_bytes(_spec(), total) == 50 * GiB  # RMM's default: half
    assert mc.required_device_bytes(_spec(rmm_async=True), total) == 0
    assert mc.required_device_bytes(_spec(disable_rmm_pool=True), total) == 0
    with pytest.raises(UsageError):
        mc.check_devices_and_memory(_spec(rmm_pool_fraction=0.9), 2, {0: (60 * GiB, total), 1: (60 * GiB, total)}, None)


def test_device_not_visible_is_refused():
    with pytest.raises(UsageError) as e:
        mc.check_devices_and_memory(_spec(devices=(0, 5)), 2, {0: (GiB * 100, GiB * 100)}, 0)
    assert "device 5" in e.value.message and "2 GPU" in e.value.message


# --- options ---------------------------------------------------------------------------------------


def test_parse_pool_size():
    pytest.importorskip("dask.utils")  # sizes are read by dask.utils.parse_bytes
    assert parse_pool_size(None) == (None, None)
    assert parse_pool_size("30GB") == (30 * 10**9, None)
    assert parse_pool_size("30GiB") == (30 * GiB, None)
    assert parse_pool_size("0.5") == (None, 0.5)
    assert parse_pool_size("1.0") == (None, 1.0)
    for bad in ("1.5", "0.0", "lots", "-3GB"):
        with pytest.raises(UsageError):
            parse_pool_size(bad)


BASE = dict(merge_type="gpu", devices="0,1", protocol="tcp", chunk_size=1000, base_chunks=None, other_chunks=None,
            frac_match=0.3, broadcast_join=False, shuffle_join=False, shuffle_method="tasks", no_shuffle=False,
            set_index=False, rmm_pool_size=None, disable_rmm_pool=False, rmm_async=False, enable_cudf_spill=False,
            enable_tcp_over_ucx=None, enable_nvlink=None, enable_infiniband=None, enable_rdmacm=None, interface=None,
            threads_per_worker=1, runs=3, warmup_runs=1, ignore_size="1MiB", scheduler_address=None,
            scheduler_file=None, timeout_s=600.0)


def _build(**kw):
    return build_spec(**{**BASE, **kw})


def test_build_spec_defaults_follow_dask_cuda():
    s = _build()
    assert s.devices == (0, 1) and s.ignore_size == 2**20 and s.broadcast is None and s.broadcast_label == "default"
    assert _build(protocol="ucxx").protocol == "ucx"
    assert _build(ignore_size="0").ignore_size == 0


def test_shuffle_join_takes_precedence_over_broadcast_join():
    assert _build(broadcast_join=True).broadcast is True
    assert _build(broadcast_join=True, shuffle_join=True).broadcast is False


@pytest.mark.parametrize("kw, needle", [
    (dict(chunk_size=0), "-c/--chunk-size"),
    (dict(frac_match=1.5), "--frac-match"),
    (dict(frac_match=0.0), "--frac-match"),
    (dict(base_chunks=0), "--base-chunks"),
    (dict(runs=0), "--runs"),
    (dict(devices="0,x"), "device 'x'"),
    (dict(devices="0,0"), "repeated"),
    (dict(rmm_async=True, rmm_pool_size="1GB"), "--rmm-async"),
    (dict(merge_type="cpu", rmm_pool_size="1GB"), "-t gpu only"),
    (dict(enable_nvlink=True), "-p ucx only"),
    (dict(merge_type="cpu", protocol="ucx", enable_nvlink=True), "-t gpu only"),
    (dict(scheduler_address="tcp://a:1", scheduler_file="f"), "both given"),
    (dict(timeout_s=0), "--timeout"),
])
def test_bad_options_are_refused_with_one_line(kw, needle):
    if kw.get("rmm_pool_size"):
        pytest.importorskip("dask.utils")  # --rmm-pool-size is read by dask.utils.parse_bytes
    with pytest.raises(UsageError) as e:
        _build(**kw)
    assert needle in e.value.one_line() and "\n" not in e.value.one_line()


# --- the data generator (copied from dask-cuda) ---------------------------------------------------


def test_generate_chunk_build_and_other_frames():
    pytest.importorskip("pandas")
    n, chunks, frac = 1000, 2, 0.3
    builds = [md.generate_chunk((i, n, chunks, "build", frac, False)) for i in range(chunks)]
    others = [md.generate_chunk((i, n, chunks, "other", frac, False)) for i in range(chunks)]
    base_keys = set()
    for i, b in enumerate(builds):
        assert list(b.columns) == ["key", "shuffle", "payload"] and len(b) == n
        assert set(b["key"]) == set(range(i * n, (i + 1) * n))
        assert set(b["shuffle"]) <= set(range(chunks))
        base_keys |= set(b["key"])
    for o in others:
        assert list(o.columns) == ["key", "payload"] and len(o) == n and o["key"].is_unique
        # frac_match of the rows match, balanced over the base partitions: int(n // chunks * frac) each
        assert sum(k in base_keys for k in o["key"]) == chunks * int(n // chunks * frac)
    # the same call gives the same data (seeded on every call)
    assert builds[0].equals(md.generate_chunk((0, n, chunks, "build", frac, False)))


# --- dask-cuda's text formatting -------------------------------------------------------------------


def test_format_bytes_and_time_match_dask():
    du = pytest.importorskip("dask.utils")
    for n in (0, 1, 921, 922, 1023, 2**20, 1.07 * GiB, 3.2e9, 8.1e8 * 1.0, 2**50 * 3):
        assert format_bytes(n) == du.format_bytes(n)
    for t in (5e-6, 1e-3, 0.18739, 1.0, 2.79, 601.0, 7300.0, 200000.0):
        assert format_time(t) == du.format_time(t)


def _result(pairs, samples=(2.0, 4.0), nbytes=3_200_000_000, spec_kw=None, workers=2):
    spec = m.MergeSpec(devices=tuple(range(workers)), **(spec_kw or {})).to_dict()
    tps = [nbytes / s for s in samples]
    ph = [p["hmean"] for p in pairs if p["hmean"] > 0]
    extra = {
        "throughputs_Bps": tps, "throughput_hmean_Bps": ms.hmean(tps), "throughput_hstd_Bps": ms.hstd(tps),
        "bandwidth_hmean_Bps": ms.hmean(ph), "bandwidth_hstd_Bps": ms.hstd(ph),
        "wall_clock_mean_s": sum(samples) / len(samples), "wall_clock_std_s": 1.0, "pairs": pairs,
        "workers": [{"index": i, "address": f"tcp://h:{100 + i}", "device": i} for i in range(workers)],
        "transfers_logged": 9, "transfers_counted": 7, "transfer_log_overflowed": [], "join_check": {"rows": 5},
    }
    rec = Record(params={"base_chunks": 2, "other_chunks": 2, "n_workers": workers}, nbytes=nbytes,
                 samples_s=list(samples), extra=extra)
    return Result(command="merge", spec=spec, records=[rec])


def _pair(w1, w2, total, q=(1.0 * GiB, 2.0 * GiB, 3.0 * GiB)):
    return {"w1": w1, "w2": w2, "n": 3, "hmean": q[1], "hstd": 0.0, "q25": q[0], "q50": q[1], "q75": q[2],
            "min": q[0], "max": q[2], "total_bytes": total}


def test_report_has_dask_cudas_sections_in_order():
    r = _result([_pair(0, 1, 5 * GiB), _pair(1, 0, 0)])
    lines = format_lines(r)
    text = "\n".join(lines)
    heads = ["Merge benchmark", "Rows-per-chunk", "Broadcast", "Protocol", "Device(s)", "RMM Pool", "Frac-match",
             "Data processed", "Number of workers", "Wall clock                | Throughput", "Throughput   ",
             "Bandwidth    ", "Wall clock                | 3.00 s +/- 1.00 s",
             "(w1,w2)                   | 25% 50% 75% (total nbytes)", "Worker index              | Worker address"]
    at = -1
    for h in heads:  # each section starts a line, in dask-cuda's order
        at = next(i for i in range(at + 1, len(lines)) if lines[i].startswith(h))
    assert "Data processed            | 2.98 GiB" in text
    # one row per run: wall clock | throughput (data processed / wall clock)
    assert "2.00 s                    | 1.49 GiB/s" in lines and "4.00 s                    | 762.94 MiB/s" in lines
    assert "(0,1)                     | 1.00 GiB/s 2.00 GiB/s 3.00 GiB/s (5.00 GiB)" in lines
    assert not any(line.startswith("(1,0)") for line in lines)  # pairs with no bytes are not printed
    assert "1                         | tcp://h:101" in lines
    assert all(len(line) <= 80 for line in lines if set(line) <= {"-", "="})


def test_notes_label_totals_and_per_pair_figures_and_explain_an_empty_table():
    r = _result([_pair(0, 1, GiB)])
    notes = " ".join(" ".join(format_notes(r, "GB")).split())
    assert "whole cluster" in notes and "per worker pair" in notes and "not a total" in notes
    assert "warm-up" in notes
    empty = _result([], spec_kw={"merge_type": "cpu", "shuffle_method": "p2p"})
    notes = " ".join(format_notes(empty, "GB"))
    assert "pair table is empty" in notes and "tasks" in notes
    assert "Bandwidth                 | 0 B/s +/- 0 B/s" in format_lines(empty)


def test_report_of_a_run_with_no_timed_result():
    spec = m.MergeSpec(devices=(0, 1)).to_dict()
    r = Result(command="merge", spec=spec, records=[], partial=True, interrupted_by="SIGINT")
    lines = format_lines(r)
    assert lines[-1].startswith("no timed run finished")
    assert any("PARTIAL" in n for n in format_notes(r))


# -- CUDA_VISIBLE_DEVICES against -d (NVML ignores the variable) -------------------------------------


@pytest.mark.parametrize("value", ["", " ", "-1", "-1,0"])
def test_cuda_visible_devices_hiding_every_gpu_is_no_gpu(value):
    from gpubench.plugins.merge.cluster import check_cuda_visible_devices
    from gpubench.core.errors import NoGPUError

    with pytest.raises(NoGPUError) as ei:
        check_cuda_visible_devices((0,), value)
    assert "hides every GPU" in ei.value.one_line()


@pytest.mark.parametrize("value, devices, hidden", [("1", (0,), 0), ("0", (0, 1), 1), ("2,3", (2, 0), 0),
                                                     ("0,-1,1", (0, 1), 1)])
def test_a_device_hidden_by_cuda_visible_devices_is_named(value, devices, hidden):
    from gpubench.plugins.merge.cluster import check_cuda_visible_devices
    from gpubench.core.errors import UsageError

    with pytest.raises(UsageError) as ei:
        check_cuda_visible_devices(devices, value)
    assert f"device {hidden} in -d" in ei.value.one_line() and repr(value) in ei.value.one_line()


@pytest.mark.parametrize("value, devices", [(None, (0, 5)), ("0,1", (1, 0)), ("3,2", (2,)),
                                            ("GPU-8c1e2f3a", (0,)), ("MIG-1234", (7,))])
def test_devices_shown_or_not_comparable_pass(value, devices):
    from gpubench.plugins.merge.cluster import check_cuda_visible_devices

    check_cuda_visible_devices(devices, value)


def test_an_interface_this_host_lacks_is_a_usage_error():
    pytest.importorskip("psutil")  # check_interface reads the interfaces with psutil
    from gpubench.plugins.merge.cluster import check_interface
    from gpubench.core.errors import UsageError

    check_interface("lo")
    with pytest.raises(UsageError) as ei:
        check_interface("nosuch0")
    assert "--interface 'nosuch0' is not a network interface" in ei.value.one_line() and "lo" in ei.value.one_line()


def test_an_interface_without_ipv4_is_a_usage_error(monkeypatch):
    import socket
    from types import SimpleNamespace

    psutil = pytest.importorskip("psutil")

    from gpubench.plugins.merge.cluster import check_interface
    from gpubench.core.errors import UsageError

    fake = {"lo": [SimpleNamespace(family=socket.AF_INET)], "ifb0": [SimpleNamespace(family=socket.AF_INET6)]}
    monkeypatch.setattr(psutil, "net_if_addrs", lambda: fake)
    with pytest.raises(UsageError) as ei:
        check_interface("ifb0")
    assert "has no IPv4 address" in ei.value.one_line() and "use one of lo" in ei.value.one_line()


# --- --rmm-pool-size read as dask-cuda reads it (dask.utils.parse_bytes) -------------------------------


@pytest.mark.parametrize("text, expected", [
    ("30GB", 30 * 10**9), ("30G", 30 * 10**9), ("30 GB", 30 * 10**9), ("1.5GB", 1_500_000_000),
    ("30GiB", 30 * GiB), ("30Gi", 30 * GiB), ("512MiB", 512 * 2**20), ("1000", 1000),
])
def test_pool_size_is_what_dask_parse_bytes_reads(text, expected):
    parse_bytes = pytest.importorskip("dask.utils").parse_bytes

    assert parse_pool_size(text) == (expected, None)
    assert parse_bytes(text) == expected  # the same bytes dask-cuda's LocalCUDACluster would reserve


@pytest.mark.parametrize("bad", ["", "  ", "0", "0B", "-3GB", "lots", "30XB", "1.5", "9" * 400 + "GB"])
def test_pool_size_refuses_what_is_not_a_size(bad):
    pytest.importorskip("dask.utils")
    with pytest.raises(UsageError) as e:
        parse_pool_size(bad)
    assert "--rmm-pool-size" in e.value.one_line() and repr(bad) in e.value.one_line()


def test_configuration_block_prints_the_resolved_pool_bytes():
    r = _result([], spec_kw={"rmm_pool_bytes": 30 * 10**9})
    assert "RMM pool size             | 27.94 GiB (30,000,000,000 B)" in format_lines(r)
    r = _result([], spec_kw={"rmm_pool_bytes": 30 * GiB})
    assert "RMM pool size             | 30.00 GiB (32,212,254,720 B)" in format_lines(r)


def test_frames_are_counted_on_every_worker_with_the_shuffle_copies():
    from gpubench.plugins.merge import cluster as mc
    from gpubench.plugins.merge.bench import MergeSpec
    from gpubench.core.errors import UsageError

    spec = MergeSpec(merge_type="cpu", devices=(0, 1), chunk_size=1_000_000, base_chunks=3, other_chunks=2)
    # (3 x 24 B + 2 x 16 B) x 1e6 rows x 3 copies
    assert mc.worker_need_bytes(spec, 2) == 3 * 1_000_000 * (3 * 24 + 2 * 16)
    room = mc.worker_need_bytes(spec, 2) + mc.WORKER_BASE_BYTES
    mc.check_frames_fit(spec, None, worker_limit=room)
    with pytest.raises(UsageError) as e:
        mc.check_frames_fit(spec, None, worker_limit=room - 1)
    assert "need" in e.value.message and "a worker (its memory limit)" in e.value.message
    # on a GPU the room is the device's, per device
    gspec = MergeSpec(merge_type="gpu", devices=(0,), chunk_size=10**9)
    with pytest.raises(UsageError) as e:
        mc.check_frames_fit(gspec, None, device_free={0: 100 * 2**30})
    assert "GPU 0" in e.value.message and "largest -c/--chunk-size that fits is" in e.value.one_line()

def test_timeout_reads_its_number_as_every_option_does_with_dasks_units():
    from gpubench.core.errors import UsageError
    from gpubench.plugins.merge.command import parse_timeout

    assert parse_timeout("1.5") == 1.5 and parse_timeout("10s") == 10 and parse_timeout("2m") == 120
    assert parse_timeout("5 minutes") == 300 and parse_timeout("+5") == 5 and parse_timeout(" 5 ") == 5
    for bad, fragment in [("١.٥", "is not a finite number"), ("１０s", "is not a finite number"),
                          ("1_0", "is not a finite number"), ("-0", "must be > 0"), ("5x", "is not a duration"),
                          ("m", "is not a duration"), ("inf", "is not a duration"), ("1e308w", "is too large"),
                          (" ", "' ' is not a duration"), ("", "'' is not a duration")]:
        with pytest.raises(UsageError, match=fragment):
            parse_timeout(bad)

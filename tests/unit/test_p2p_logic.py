"""p2p's pure logic: option validation, the order of the pairs, nvbandwidth's SM-copy geometry, the
link peak of each path, and the matrix report / JSON of a result built from known samples."""

from __future__ import annotations

import json

import pytest

from gpubench.plugins.p2p import bench as P
from gpubench.core import kernels as K
from gpubench.plugins.p2p import command as cmd
from gpubench.core.errors import UsageError
from gpubench.core.result import Record, Result, load, save


def _spec(**kw):
    args = dict(devices=None, tests=cmd._DEFAULT_TESTS, nbytes="1GiB", latency_bytes="16", loop_count=None, warmup=1,
                iters=5, verify=True)
    args.update(kw)
    return cmd.build_spec(**args)


def test_defaults():
    s = _spec()
    assert s.nbytes == 1 << 30 and s.latency_bytes == 16 and s.loop_count is None
    # each test follows its tool's copies per sample unless --loop-count says otherwise
    assert P.loop_count(s, "write") == 16 and P.loop_count(s, "bidir") == 16
    assert P.loop_count(s, "off") == 5 and P.loop_count(s, "off-bidir") == 5
    assert P.loop_count(_spec(loop_count=3), "off") == 3 and P.loop_count(_spec(loop_count=3), "write") == 3
    assert s.tests == tuple(P.TESTS) and s.devices is None and s.plan.iters == 5


@pytest.mark.parametrize("kw,needle", [
    (dict(devices="0"), "needs two GPUs"),
    (dict(devices="0,0"), "repeated"),
    (dict(devices="1,x"), "not an integer"),
    (dict(nbytes="0"), "at least 1 byte"),
    (dict(nbytes="1QB"), "not a size"),
    (dict(tests="write,warp"), "test 'warp'"),
    (dict(tests="write,write"), "repeated"),
    (dict(tests=","), "has an empty 1st entry"),
    (dict(iters=0), "-n/--iters"),
    (dict(loop_count=0), "--loop-count"),
])
def test_bad_options(kw, needle):
    with pytest.raises(UsageError) as e:
        _spec(**kw)
    assert needle in e.value.one_line()


def test_spec_itself_refuses_one_device():
    with pytest.raises(UsageError):
        P.P2PSpec(devices=(0,))


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_groups_cover_every_ordered_pair_peer_off_first(n):
    devs = tuple(range(n))
    groups = P.order_groups(tuple(P.TESTS), devs)
    assert len(groups) == len(P.TESTS) * n * (n - 1)
    assert {(g.src, g.dst) for g in groups} == {(i, j) for i in devs for j in devs if i != j}
    kinds = [g.test in P.PEER_OFF_TESTS for g in groups]
    assert kinds == sorted(kinds, reverse=True)  # every peer-off group before any peer-on group


@pytest.mark.parametrize("nbytes,sms", [(1 << 30, 132), (512 << 20, 132), (64 << 20, 108), (1 << 30 | 12345, 132)])
def test_sm_geometry_large_matches_nvbandwidth(nbytes, sms):
    # memcpy.cpp getAdjustedCopySize: total = SMs * 512; elements = total * ((size / 16) / total)
    kind, grid, block, copied = K.sm_copy_geometry(nbytes, sms)
    total = sms * 512
    assert (kind, grid, block) == ("striding", sms, 512)
    assert copied == total * ((nbytes // 16) // total) * 16
    assert 0 < nbytes - copied < total * 16 + 16


@pytest.mark.parametrize("nbytes", [16, 4096, 1 << 20, (1 << 20) + 48, (64 << 20) - 16])
def test_sm_geometry_small(nbytes):
    kind, grid, block, copied = K.sm_copy_geometry(nbytes, 132)
    n16 = nbytes // 16
    assert kind == "simple" and block == min(n16, 1024) and grid == n16 // block
    assert copied == grid * block * 16 <= nbytes


def test_sm_geometry_too_small():
    assert K.sm_copy_geometry(15, 132)[3] == 0


def _env():
    return {
        "gpus": [
            {"index": 0, "pcie_peak_bytes_per_s": 63.0e9, "nvlink_peak_bytes_per_s_by_peer": {"1": 478.1e9}},
            {"index": 1, "pcie_peak_bytes_per_s": 31.5e9, "nvlink_peak_bytes_per_s_by_peer": {"0": 478.1e9}},
            {"index": 2, "pcie_peak_bytes_per_s": 63.0e9, "nvlink_peak_bytes_per_s_by_peer": {}},
        ],
        "topology": {"0,1": "NV18", "0,2": "SYS", "1,2": "SYS"},
    }


def test_link_peak():
    env = _env()
    assert P.link_peak(env, 0, 1, True) == (478.1e9, "NV18")
    assert P.link_peak(env, 1, 0, True) == (478.1e9, "NV18")
    assert P.link_peak(env, 0, 2, True) == (63.0e9, "SYS")  # no NVLink: PCIe peer-to-peer
    assert P.link_peak(env, 0, 1, False) == (31.5e9, "PCIe via host")  # staged: the slower PCIe link
    assert P.link_peak({"gpus": [], "topology": {}}, 0, 1, True) == (None, "?")


def _rec(test, src, dst, seconds, nbytes=1 << 30, part=None, metric="bandwidth", peak=478.1e9, **extra):
    params = {"test": test, "src": src, "dst": dst, "nbytes": nbytes}
    if part:
        params["part"] = part
    r = Record(params=params, metric=metric, nbytes=nbytes, samples_s=list(seconds), reps=16)
    if metric == "bandwidth":
        med = r.rate_summary().median
        r.extra = {"peak_bytes_per_s": peak, "pct_of_peak": 100 * med / peak, "above_peak": med > peak,
                   "peer_access": not test.startswith("off"), "verified": True, **extra}
    else:
        r.extra = {"verified": True, **extra}
    return r


def _result(n=3):
    devs = list(range(n))
    recs = []
    for i in devs:
        for j in devs:
            if i == j:
                continue
            recs.append(_rec("write", i, j, [(1 << 30) / 396e9] * 3))
            for part in ("forward", "reverse"):
                recs.append(_rec("bidir", i, j, [(1 << 30) / 389e9] * 3, part=part))
            recs.append(_rec("bidir", i, j, [(2 << 30) / 778e9] * 3, nbytes=2 << 30, part="total", peak=956.2e9))
            recs.append(_rec("latency", i, j, [2.2e-6] * 3, nbytes=16, metric="time"))
    recs.append(Record(params={"test": "read", "src": 0, "dst": 1, "nbytes": 1 << 30}, nbytes=1 << 30,
                       error="no peer access between GPU 0 and GPU 1 (cudaDeviceCanAccessPeer = 0)"))
    spec = P.P2PSpec(devices=tuple(devs), tests=("write", "read", "bidir", "latency")).to_dict()
    spec["devices"] = devs
    return Result(command="p2p", spec=spec, records=recs,
                  timing={"iters": 3, "warmup_copies": 4, "latency_reps": 100},
                  env={"topology": {"0,1": "NV18", "0,2": "NV18", "1,2": "NV18"},
                       "peer_access": {"0,1": True, "0,2": True, "1,2": True}})


def _text(renderables) -> str:
    from rich.console import Console

    c = Console(width=250, record=True)
    for x in renderables:
        c.print(x)
    return c.export_text()


def test_report_matrices():
    text = _text(cmd.format_report(_result(3)))
    # one matrix per test (bidir: total and forward), each 3 rows of GPUs with 3 columns
    for title in ("write:", "read:", "bidir total:", "bidir forward:", "latency:", "GPU pairs"):
        assert title in text, title
    assert text.count("src \\ dst") == 5
    write_block = text.split("write:")[1].split("read:")[0]
    assert write_block.count("396.0 83%") == 6  # every off-diagonal cell, % of 478.1
    assert "778.0 81%" in text and "2.20" in text and "no peer access" in text
    assert "GPU 0 <-> GPU 2" in text and "NV18" in text


def test_report_flags_above_peak_and_wrong_data():
    res = _result(2)
    res.records[0] = _rec("write", 0, 1, [(1 << 30) / 500e9] * 3, verified=False)
    text = _text(cmd.format_report(res))
    assert "!!" in text and "WRONG DATA" in text


def test_json_round_trip_keeps_src_dst(tmp_path):
    res = _result(2)
    path = save(res, tmp_path / "p2p.json")
    back = load(path)
    assert [r.params for r in back.records] == [r.params for r in res.records]
    raw = json.loads(path.read_text())
    assert all("src" in r["params"] and "dst" in r["params"] for r in raw["records"])
    assert _text(cmd.format_report(back)) == _text(cmd.format_report(res))


def _bidir(test):
    # forward 2 ms and reverse 4 ms per sample of 2 copies of 1 MB; both finished 5 ms after the start
    return P.bidir_records({"test": test, "src": 0, "dst": 1}, 10**6, [[2e-3], [4e-3]], [5e-3], 2, test,
                           {"peer_access": test == "bidir"}, 100e9, 100e9, 1)


def test_bidir_total_is_nvbandwidths_sum_of_directions():
    fwd, rev, tot = _bidir("bidir")
    assert [r.params["part"] for r in (fwd, rev, tot)] == ["forward", "reverse", "total"]
    assert fwd.rate_summary().median == pytest.approx(1e9)  # 1 MB per 1 ms
    assert rev.rate_summary().median == pytest.approx(0.5e9)
    assert tot.nbytes == 2 * 10**6 and tot.rate_summary().median == pytest.approx(1.5e9)  # 1.0 + 0.5
    assert tot.extra["span_samples_s"] == [pytest.approx(2.5e-3)]
    assert "nvbandwidth" in tot.extra["total_rule"] and rev.extra["stream_device"] == 1


def test_off_bidir_total_is_p2pbandwidthlatencytests_bytes_over_span():
    *_, tot = _bidir("off-bidir")
    # 2 directions x 2 copies x 1 MB over the 5 ms until both finished: 0.8 GB/s, under the 1.5 of the sum
    assert tot.rate_summary().median == pytest.approx(0.8e9)
    assert "p2pBandwidthLatencyTest" in tot.extra["total_rule"]
    (summed,) = tot.extra["sum_rule_samples_s"]
    assert 2 * 10**6 / summed == pytest.approx(1.5e9)

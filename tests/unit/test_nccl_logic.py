"""nccl's pure logic: the expected data of every collective (against a numpy simulation of the
collective), the data-type encoding, the wrong-element count, the buffer shift, the spec, records,
the verdict and the report."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpubench.plugins.nccl import collectives as C
from gpubench.plugins.nccl import bench as N
from gpubench.plugins.nccl import over_dask as nccl_dask
from gpubench.plugins.nccl import data as D
from gpubench.plugins.nccl import launch as L
from gpubench.plugins.nccl import command as cmd
from gpubench.core.errors import UsageError
from gpubench.core.result import Result


def _inputs(rank, send_count, op):
    return D.rank_values(np, rank, np.arange(send_count, dtype=np.int64), op).astype(np.float64)


def _simulate(name, n, root, cc, op):
    """What each rank's receive buffer holds after the collective, computed from the definition."""
    ins = [_inputs(r, cc.send_count, op) for r in range(n)]
    red = {"sum": lambda a: np.sum(a, axis=0), "prod": lambda a: np.prod(a, axis=0),
           "max": lambda a: np.max(a, axis=0), "min": lambda a: np.min(a, axis=0),
           "avg": lambda a: np.sum(a, axis=0) / n}[op]
    c = cc.param_count
    out = []
    for r in range(n):
        if name in ("all-reduce", "reduce"):
            out.append(red(np.stack(ins)))
        elif name == "broadcast":
            out.append(ins[root])
        elif name in ("all-gather", "hypercube"):  # hypercube: an all-gather by exchanges
            out.append(np.concatenate([ins[p][:c] for p in range(n)]))
        elif name == "reduce-scatter":
            out.append(red(np.stack([ins[p][r * c:(r + 1) * c] for p in range(n)])))
        elif name == "all-to-all":
            out.append(np.concatenate([ins[p][r * c:(r + 1) * c] for p in range(n)]))
        elif name == "send-recv":
            out.append(ins[(r - 1) % n])
        elif name == "gather":  # only the root's output is checked; what the others hold is not
            out.append(np.concatenate([ins[p][:c] for p in range(n)]))
        elif name == "scatter":
            out.append(ins[root][r * c:(r + 1) * c])
    return out


@pytest.mark.parametrize("name", list(C.COLLECTIVES))
def test_expected_values_match_a_simulation(name):
    """For ranks 1-4 and every reduction op: each rank's expected output is what a plain simulation
    of the collective over the ranks' inputs gives."""
    coll = C.COLLECTIVES[name]
    for n, op in itertools.product([1, 2, 3, 4], list(C.OPS)):
        if coll.ranks_ok(n) is not None:
            continue  # the collective does not run on n ranks
        cc = C.counts(coll, 4096 + 64, 4, n)
        root = n - 1
        want = _simulate(name, n, root, cc, op)
        for r in range(n):
            idx = np.arange(cc.recv_count, dtype=np.int64)
            got = D.expected_values(np, coll, r, n, root, cc.param_count, idx, op, "float")
            np.testing.assert_allclose(got, want[r], rtol=0, atol=1e-12, err_msg=f"{n} ranks, {op}, rank {r}")


def test_integer_avg_truncates_and_values_are_never_all_zero():
    coll = C.collective("all-reduce")
    idx = np.arange(100, dtype=np.int64)
    got = D.expected_values(np, coll, 0, 2, 0, 100, idx, "avg", "int")
    exact = (D.rank_values(np, 0, idx, "avg") + D.rank_values(np, 1, idx, "avg")) // 2
    assert got.dtype == np.int64 and (got == exact).all()
    assert (D.rank_values(np, 3, idx, "sum") > 0).all() and (D.rank_values(np, 3, idx, "prod") > 0).all()


@pytest.mark.parametrize("dt", list(C.DTYPES))
def test_encode_decode_round_trip(dt):
    d = C.DTYPES[dt]
    vals = np.arange(1, 57, dtype=np.float64 if d.kind == "float" else np.int64)
    stored = D.encode(np, vals, d)
    assert stored.dtype == np.dtype(d.numpy) and stored.itemsize == d.size
    assert D.count_wrong(np, stored, vals, d) == 0
    stored[7] = stored[8]  # one element wrong
    assert D.count_wrong(np, stored, vals, d) == 1


def test_bfloat16_is_the_high_half_of_float32():
    d = C.DTYPES["bfloat16"]
    stored = D.encode(np, np.array([1.0, 3.0, 255.0]), d)
    assert list(stored) == [0x3F80, 0x4040, 0x437F]


def test_float_tolerance_accepts_rounding_of_avg_only():
    d = C.DTYPES["half"]
    exp = np.array([17 / 3, 5.0])
    stored = D.encode(np, exp, d)  # rounded to half
    assert D.count_wrong(np, stored, exp, d) == 0
    assert D.count_wrong(np, D.encode(np, exp + 0.25, d), exp, d) == 2


def test_shift_walks_through_the_buffers_like_nccl_tests():
    # nccl-tests startColl: steps = maxbytes / totalnbytes; shift = totalnbytes * (iter % steps)
    assert [L._shift(i, 1 << 24, 1 << 30) for i in (0, 1, 63, 64, 65)] == [0, 1 << 24, 63 << 24, 0, 1 << 24]
    assert [L._shift(i, 1 << 30, 1 << 30) for i in range(3)] == [0, 0, 0]
    assert L._shift(5, 0, 1 << 20) == 0


def _spec(**kw):
    args = dict(collective="all-reduce", devices=None, min_bytes="1M", max_bytes="64M", step_factor=4, dtype="float",
                op="sum", root=0, warmup=1, iters=20, samples=5, check=1, placement="both", cuda_graph=0, timeout=0.0)
    args.update(kw)
    return cmd.build_spec(**args)


def test_build_spec_defaults_and_sweep():
    s = _spec()
    assert s.collective == "all-reduce" and s.sizes == (1 << 20, 1 << 22, 1 << 24, 1 << 26)
    assert s.places == N.PLACES and not s.distributed
    assert _spec(collective="allgather", dtype="bf16", placement="in-place").places == ("in-place",)


def test_cuda_graph_launches_go_into_the_spec_and_are_bounded():
    assert _spec(cuda_graph=10).cuda_graph == 10 and _spec().cuda_graph == 0
    for bad, needle in ((-1, "-G/--cuda-graph -1 must be >= 0"), (10**7, "-G/--cuda-graph 10000000 is too large")):
        with pytest.raises(UsageError) as e:
            _spec(cuda_graph=bad)
        assert needle in e.value.one_line()
    with pytest.raises(UsageError, match="-G"):
        N.NcclSpec(cuda_graph=-2)
    with pytest.raises(UsageError) as e:
        _spec(cuda_graph=2, iters=N.MAX_GRAPH_ITERS + 1)
    assert "-n/--iters 100001 with -G" in e.value.one_line() and "at most 100,000" in e.value.one_line()
    assert _spec(cuda_graph=0, iters=N.MAX_GRAPH_ITERS + 1).iters == N.MAX_GRAPH_ITERS + 1


def test_graph_mode_records_count_every_launched_iteration_and_say_how_they_were_timed():
    spec = N.NcclSpec(sizes=(1 << 20,), iters=20, cuda_graph=10, places=("out-of-place",))
    [r] = N.to_records(spec, [N.Point(1 << 20, 1 << 18, "out-of-place", [1e-5] * 3, 0)], 2)
    assert r.reps == 200
    t = N._timing(spec)
    assert t["cuda_graph"] == 10 and "(iters * cuda_graph)" in t["method"] and "CUDA graphs" in t["method"]
    assert "CUDA graph" not in N._timing(N.NcclSpec())["method"]


@pytest.mark.parametrize("n,per_launch", [(1, 1), (20, 1), (288, 1), (289, 1), (2000, 1), (10, 20), (100, 20),
                                          (3, 1000), (50, 33), (1000, 7)])
def test_queue_bounds_keep_at_most_max_queued_iterations_in_flight(n, per_launch):
    bounded, every, window = L.queue_bounds(n, per_launch)
    assert bounded == (n * per_launch > L.MAX_QUEUED + L._MARK_EVERY)
    assert every >= 1 and window >= 1
    assert every * per_launch * window <= max(L.MAX_QUEUED, per_launch)
    if per_launch == 1:  # the eager path: an event every 32 iterations, 256 in flight
        assert (every, window) == (L._MARK_EVERY, L.MAX_QUEUED // L._MARK_EVERY)


@pytest.mark.parametrize("kw,needle", [
    (dict(collective="allreduse"), "collective 'allreduse'"),
    (dict(dtype="f8"), "data type 'f8'"),
    (dict(op="mulsum"), "reduction op 'mulsum'"),
    (dict(devices="0,0"), "repeated"),
    (dict(devices="a"), "not an integer"),
    (dict(min_bytes="0"), "at least 1 byte"),
    (dict(min_bytes="2G", max_bytes="1G"), "larger than max"),
    (dict(step_factor=1.0), "-f/--step-factor 1 must be > 1"),
    (dict(iters=0), "-n/--iters"),
    (dict(samples=0), "--samples"),
    (dict(root=-1), "root"),
    (dict(timeout=-1.0), "timeout"),
    (dict(check=-1), "check"),
])
def test_build_spec_rejects(kw, needle):
    with pytest.raises(UsageError) as e:
        _spec(**kw)
    assert needle in e.value.one_line()


def test_spec_refuses_both_schedulers_and_devices_with_dask():
    with pytest.raises(UsageError):
        N.NcclSpec(scheduler_address="tcp://a:1", scheduler_file="f")
    with pytest.raises(UsageError):
        N.NcclSpec(scheduler_address="tcp://a:1", devices=(0,))


def test_root_must_be_a_rank():
    N._check_root(N.NcclSpec(collective="broadcast", root=1), 2)
    with pytest.raises(UsageError):
        N._check_root(N.NcclSpec(collective="broadcast", root=2), 2)
    N._check_root(N.NcclSpec(collective="all-reduce", root=5), 2)  # ignored where there is no root


def _result(points, nranks=2, spec=None):
    spec = spec or N.NcclSpec(sizes=(1 << 20, 1 << 30))
    recs = N.to_records(spec, points, nranks)
    return Result(command="nccl", spec={**spec.to_dict(), "nranks": nranks}, records=recs,
                  timing=N._timing(spec))


def test_records_carry_algbw_and_busbw():
    pts = [N.Point(1 << 30, 1 << 28, "out-of-place", [2e-3, 2.1e-3, 1.9e-3], 0)]
    r = N.to_records(N.NcclSpec(sizes=(1 << 30,)), pts, 2)[0]
    assert r.params == {"collective": "all-reduce", "nbytes": 1 << 30, "dtype": "float", "placement": "out-of-place",
                        "nranks": 2, "op": "sum"}
    assert r.nbytes == 1 << 30 and r.extra["time_s"] == pytest.approx(2e-3)
    assert r.extra["algbw_bytes_per_s"] == pytest.approx((1 << 30) / 2e-3)
    assert r.extra["busbw_bytes_per_s"] == pytest.approx(r.extra["algbw_bytes_per_s"])  # 2(n-1)/n = 1 at n = 2
    one = N.to_records(N.NcclSpec(sizes=(1 << 30,)), pts, 1)[0]
    assert one.extra["busbw_bytes_per_s"] == 0.0
    gathered = N.to_records(N.NcclSpec(collective="all-gather", sizes=(1 << 30,)), pts, 4)[0]
    assert gathered.nbytes == 4 * 4 * (1 << 28) and "op" not in gathered.params


def test_combine_ranks_averages_samples_and_sums_wrong():
    a = [{"nbytes": 8, "count": 2, "place": "in-place", "samples_s": [1.0, 2.0], "wrong": 0, "error": None}]
    b = [{"nbytes": 8, "count": 2, "place": "in-place", "samples_s": [3.0, 4.0], "wrong": 2, "error": None}]
    (p,) = nccl_dask.combine_ranks([a, b])
    assert p.samples_s == [2.0, 3.0] and p.wrong == 2
    b[0]["wrong"] = None
    assert nccl_dask.combine_ranks([a, b])[0].wrong is None


def test_combine_ranks_keeps_an_error_without_samples_as_launched_ranks_do():
    a = [{"nbytes": 8, "count": 2, "place": "in-place", "samples_s": [1.0, 2.0], "wrong": 0, "error": None}]
    b = [{"nbytes": 8, "count": 2, "place": "in-place", "samples_s": [], "wrong": None, "error": "out of memory"}]
    (p,) = nccl_dask.combine_ranks([a, b])
    assert p.samples_s == [] and p.error == "out of memory" and p.wrong is None


def test_combine_ranks_refuses_uneven_samples_or_points_naming_the_counts():
    from gpubench.core.errors import MachineError

    a = [{"nbytes": 1 << 20, "count": 2, "place": "in-place", "samples_s": [1.0, 2.0], "wrong": 0, "error": None}]
    b = [{"nbytes": 1 << 20, "count": 2, "place": "in-place", "samples_s": [3.0], "wrong": 0, "error": None}]
    with pytest.raises(MachineError, match=r"different numbers of samples for 1 MiB in-place: \[2, 1\]"):
        nccl_dask.combine_ranks([a, b])
    with pytest.raises(MachineError, match=r"different numbers of points: \[1, 2\]"):
        nccl_dask.combine_ranks([a, a + a])


def test_verdict_expect_busbw_and_wrong():
    pts = [N.Point(1 << 20, 1 << 18, "out-of-place", [1e-4], 0),
           N.Point(1 << 30, 1 << 28, "out-of-place", [4e-3], 0),
           N.Point(1 << 30, 1 << 28, "in-place", [1e-3], 0)]
    res = _result(pts)
    bus = (1 << 30) / 4e-3 / 1e9  # out-of-place at the largest size is the one checked
    assert cmd.verdict(res, None) is None
    assert cmd.verdict(res, bus * 0.99) is None
    msg = cmd.verdict(res, bus * 1.01)
    assert msg and "below --expect-busbw" in msg and "out-of-place" in msg
    bad = _result([N.Point(1 << 30, 1 << 28, "out-of-place", [4e-3], 3)])
    assert "3 wrong" in cmd.verdict(bad, None)


def test_report_has_nccl_tests_columns_and_average():
    pts = [N.Point(1 << 20, 1 << 18, "out-of-place", [1e-4], 0), N.Point(1 << 20, 1 << 18, "in-place", [1e-4], None),
           N.Point(1 << 30, 1 << 28, "out-of-place", [4e-3], 0), N.Point(1 << 30, 1 << 28, "in-place", [4e-3], 0)]
    res = _result(pts)
    from rich.console import Console

    c = Console(width=250, record=True)
    for x in cmd.format_report(res):
        c.print(x)
    text = c.export_text()
    for col in ("size (B)", "count", "redop", "out-of-place time (us)", "in-place time (us)", "busbw GB/s", "#wrong",
                "Avg bus bandwidth", "2(n-1)/n", "N/A", "1073741824", "268435456"):
        assert col in text, col


def test_report_warns_when_dask_workers_differ_in_nccl():
    pts = [N.Point(1 << 20, 1 << 18, "out-of-place", [1e-4], 0)]

    def text_of(workers):
        res = _result(pts)
        res.env = dict(res.env, dask_workers=workers)
        return " ".join(str(x) for x in cmd.format_report(res) if isinstance(x, str))

    same = [{"rank": r, "nccl": {"version": 22809, "env": {"NCCL_NVLS_ENABLE": "0"}}} for r in (0, 1)]
    assert "differ in NCCL" not in text_of(same)
    mixed = [same[0], {"rank": 1, "nccl": {"version": 22803, "env": {"NCCL_NVLS_ENABLE": "0"}}}]
    assert "differ in NCCL" in text_of(mixed)
    env_mixed = [same[0], {"rank": 1, "nccl": {"version": 22809, "env": {}}}]
    assert "differ in NCCL" in text_of(env_mixed)


def test_the_footer_names_the_nccl_version_as_people_write_it_and_escapes_the_variables():
    from pathlib import Path

    from gpubench.core.result import load

    r = load(Path(__file__).resolve().parents[1] / "data" / "nccl-h200x2.json")
    lines = [x for x in cmd.format_report(r) if isinstance(x, str)]
    assert "NCCL 2.28.9 (ncclGetVersion); environment: NCCL_NVLS_ENABLE=0 NCCL_VERSION=2.28.3-1" in lines
    r.env = dict(r.env, nccl={"version": 22809, "env": {"NCCL_SOCKET_IFNAME": "eth0\x1b[31m"}})
    line = next(x for x in cmd.format_report(r) if isinstance(x, str) and x.startswith("NCCL 2.28.9"))
    assert "\x1b" not in line and "NCCL_SOCKET_IFNAME=eth0" in line


def test_an_nccl_error_with_no_text_is_named_by_its_type_not_an_index_error():
    from gpubench.plugins.nccl.comm import as_machine_error

    class NcclError(Exception):  # CuPy's class name, as as_machine_error recognises it
        pass

    assert str(as_machine_error(NcclError(""))) == "NCCL call failed: NcclError"
    assert str(as_machine_error(NcclError("\nunhandled cuda error"))) == "NCCL call failed: unhandled cuda error"

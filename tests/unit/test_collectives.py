"""The collectives table against nccl-tests' formulas (src/<coll>.cu GetCollByteCount / GetBw and
doc/PERFORMANCE.md), written out again here independently for every collective and rank count."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from gpubench.plugins.nccl import collectives as C
from gpubench.core.errors import UsageError

RANKS = range(1, 17)


def _nccl_tests_factor(name: str, n: int) -> float:
    # doc/PERFORMANCE.md: AllReduce 2(n-1)/n; ReduceScatter, AllGather (n-1)/n; Broadcast, Reduce 1;
    # alltoall.cu and sendrecv.cu GetBw: (n-1)/n and 1.
    return {
        "all-reduce": 2.0 * (n - 1) / n,
        "all-gather": (n - 1) / n,
        "reduce-scatter": (n - 1) / n,
        "all-to-all": (n - 1) / n,
        "broadcast": 1.0,
        "reduce": 1.0,
        "send-recv": 1.0,
        "gather": (n - 1) / n,  # gather.cu GatherGetBw
        "scatter": (n - 1) / n,  # scatter.cu ScatterGetBw
        "hypercube": 1.0,  # hypercube.cu HyperCubeGetBw
    }[name]


def test_busbw_factor_matches_nccl_tests():
    wrong = [(name, n, C.busbw_factor(coll, n), _nccl_tests_factor(name, n))
             for name, coll in C.COLLECTIVES.items() for n in RANKS
             if C.busbw_factor(coll, n) != pytest.approx(_nccl_tests_factor(name, n), rel=1e-15)]
    assert wrong == [], "(collective, ranks, gpubench, nccl-tests)"


def test_one_rank_allreduce_has_zero_busbw():
    coll = C.collective("all-reduce")
    alg, bus = C.bandwidths(coll, 1 << 20, 4, 1e-3, 1)
    assert alg == pytest.approx((1 << 22) / 1e-3)
    assert bus == 0.0


def _nccl_tests_counts(name: str, count: int, elt: int, n: int):
    # (sendcount, recvcount, paramcount, sendInplaceOffset, recvInplaceOffset) as the .cu files compute them
    base = (count // n) & ~(16 // elt - 1)
    if name in ("all-reduce", "broadcast", "reduce", "send-recv"):
        return count, count, count, 0, 0
    if name == "all-gather":
        return base, base * n, base, base, 0
    if name == "reduce-scatter":
        return base * n, base, base, 0, base
    if name == "all-to-all":
        return n * base, n * base, base, 0, 0
    if name == "gather":
        return base, base * n, base, base, 0
    if name == "scatter":
        return base * n, base, base, 0, base
    if name == "hypercube":  # ALIGN 4 elements, not 16 bytes
        hb = (count // (4 * n)) * 4
        return hb, hb * n, hb, hb, 0
    raise AssertionError(name)


def test_byte_counts_match_nccl_tests():
    """Every collective x ranks 1-8 x int8/half/float/double x sizes from 8 B to 1 GiB (odd ones too):
    the counts and in-place offsets of nccl-tests' GetCollByteCount, or the collective's refusal of
    that rank count."""
    wrong = []
    for name, coll in C.COLLECTIVES.items():
        for n, dt, size in itertools.product([1, 2, 3, 4, 7, 8], ["int8", "half", "float", "double"],
                                             [8, 1000, 4096, 1 << 20, 3 * (1 << 20) + 5, 1 << 30]):
            d = C.DTYPES[dt]
            case = (name, n, dt, size)
            if coll.ranks_ok(n) is not None:
                with pytest.raises(UsageError, match=f"{name} needs"):
                    C.counts(coll, size, d.size, n)
                continue
            cc = C.counts(coll, size, d.size, n)
            got = (cc.send_count, cc.recv_count, cc.param_count, cc.send_inplace_offset, cc.recv_inplace_offset)
            if got != _nccl_tests_counts(name, size // d.size, d.size, n):
                wrong.append((case, got, _nccl_tests_counts(name, size // d.size, d.size, n)))
            # gathered kinds hand each rank a whole number of 16-byte units
            if coll.size_blocks(n) == n and n > 1 and (cc.param_count * d.size) % 16:
                wrong.append((case, "param bytes not a multiple of 16", cc.param_count * d.size))
    assert wrong == [], wrong[:10]


@pytest.mark.parametrize("name", list(C.COLLECTIVES))
def test_algbw_numerator(name):
    coll = C.COLLECTIVES[name]
    n, elt, t = 4, 4, 2e-3
    cc = C.counts(coll, 1 << 24, elt, n)
    alg, bus = C.bandwidths(coll, cc.param_count, elt, t, n)
    s = cc.param_count * elt * (n if name in ("all-gather", "reduce-scatter", "all-to-all", "gather", "scatter")
                                else n - 1 if name == "hypercube" else 1)
    assert alg == pytest.approx(s / t)
    assert bus == pytest.approx(alg * _nccl_tests_factor(name, n))
    # the size nccl-tests prints: max(send, receive) bytes
    assert C.reported_bytes(coll, 1 << 24, elt, n) == max(cc.send_count, cc.recv_count) * elt


def test_nccl_tests_output_line_reproduced():
    # nccl-tests prints time 3269.24 us for 1073741824 B float all-reduce on 2 ranks and 328.44 GB/s
    # for both algbw and busbw: the formula must give those from the time.
    coll = C.collective("all-reduce")
    cc = C.counts(coll, 1073741824, 4, 2)
    alg, bus = C.bandwidths(coll, cc.param_count, 4, 3269.24e-6, 2)
    assert alg / 1e9 == pytest.approx(328.44, abs=0.01)
    assert bus == alg


def test_bad_time_and_ranks():
    coll = C.collective("all-reduce")
    with pytest.raises(ValueError):
        C.bandwidths(coll, 10, 4, 0.0, 2)
    with pytest.raises(ValueError):
        C.busbw_factor(coll, 0)
    with pytest.raises(ValueError):
        C.counts(coll, 100, 4, 0)


@pytest.mark.parametrize("alias,name", [("allreduce", "all-reduce"), ("all_gather", "all-gather"),
                                        ("ReduceScatter", "reduce-scatter"), ("alltoall", "all-to-all"),
                                        ("sendrecv", "send-recv"), ("bcast", "broadcast"), ("reduce", "reduce"),
                                        ("gather", "gather"), ("Scatter", "scatter")])
def test_aliases(alias, name):
    assert C.collective(alias).name == name


@pytest.mark.parametrize("fn,bad,listed", [(C.collective, "allreduse", "all-reduce"), (C.dtype, "float8", "bfloat16"),
                                           (C.op, "mulsum", "avg")])
def test_unknown_names_list_the_accepted_ones(fn, bad, listed):
    with pytest.raises(UsageError) as e:
        fn(bad)
    assert bad in e.value.one_line() and listed in e.value.one_line()
    assert "\n" not in e.value.one_line()


def test_dtype_values_follow_nccl_h():
    # ncclDataType_t: ncclInt8 0, ncclUint8 1, ncclInt32 2, ncclUint32 3, ncclInt64 4, ncclUint64 5,
    # ncclFloat16 6, ncclFloat32 7, ncclFloat64 8, ncclBfloat16 9; ncclRedOp_t: sum 0 prod 1 max 2 min 3 avg 4
    assert [C.DTYPES[k].nccl for k in ("int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float",
                                       "double", "bfloat16")] == list(range(10))
    assert [C.OPS[k] for k in ("sum", "prod", "max", "min", "avg")] == list(range(5))
    assert C.dtype("fp16").name == "half" and C.dtype("float32").name == "float" and C.dtype("bf16").size == 2


# nccl-tests src/gather.cu and src/scatter.cu (2.19.6), written out by hand for one size:
#   Gather:  sendcount = (count/nranks) & ~(16/eltSize - 1); recvcount = sendcount*nranks;
#            sendInplaceOffset = sendcount; recvInplaceOffset = 0; paramcount = sendcount
#   Scatter: recvcount = (count/nranks) & ~(16/eltSize - 1); sendcount = recvcount*nranks;
#            sendInplaceOffset = 0; recvInplaceOffset = recvcount; paramcount = recvcount
#   GetBw (both): algBw = count * nranks * typesize / sec; busBw = algBw * (nranks-1)/nranks
# For 1 MiB + 100 B of float (count = 262169): count / n rounded down to a multiple of 4 elements.
GATHER_SCATTER = {  # n: (per-rank count, busbw factor)
    1: (262168, 0.0),
    2: (131084, 1 / 2),
    3: (87388, 2 / 3),
    8: (32768, 7 / 8),
}


@pytest.mark.parametrize("n", sorted(GATHER_SCATTER))
def test_gather_and_scatter_counts_and_bandwidth_are_nccl_tests(n):
    per_rank, factor = GATHER_SCATTER[n]
    size, elt, t = (1 << 20) + 100, 4, 1e-3
    g = C.counts(C.collective("gather"), size, elt, n)
    assert (g.send_count, g.recv_count, g.param_count, g.send_inplace_offset, g.recv_inplace_offset) == \
        (per_rank, per_rank * n, per_rank, per_rank, 0)
    sc = C.counts(C.collective("scatter"), size, elt, n)
    assert (sc.send_count, sc.recv_count, sc.param_count, sc.send_inplace_offset, sc.recv_inplace_offset) == \
        (per_rank * n, per_rank, per_rank, 0, per_rank)
    for name in ("gather", "scatter"):
        coll = C.collective(name)
        alg, bus = C.bandwidths(coll, per_rank, elt, t, n)
        assert alg == pytest.approx(per_rank * n * elt / t) and bus == pytest.approx(alg * factor)
        assert C.busbw_factor(coll, n) == pytest.approx(factor)
        assert C.reported_bytes(coll, size, elt, n) == per_rank * n * elt  # nccl-tests' "size" column
        assert coll.rooted and not coll.reduces and coll.checked_in_place
        assert coll.source == f"src/{name}.cu" and coll.nccl_tests == f"{name}_perf"


def test_gather_checks_only_the_root_and_scatter_fills_only_the_root():
    # GatherInitData: only the root's expected buffer holds the gathered data; ScatterInitData:
    # only the root initialises its send data
    g, s = C.collective("gather"), C.collective("scatter")
    assert [g.holds_result(r, 2) for r in range(4)] == [False, False, True, False]
    assert all(g.sends(r, 2) for r in range(4))
    assert [s.sends(r, 1) for r in range(3)] == [False, True, False]
    assert all(s.holds_result(r, 1) for r in range(3))


def _send(*args):
    pass


def _recv(*args):
    pass


def _group_start():
    pass


def _group_end():
    pass


def _named(calls):
    # (function, arguments) -> (the function's name, arguments)
    return [(fn.__name__, args) for fn, args in calls]


def _rank_call(rank, n, root, count=10):
    return C.RankCall(SimpleNamespace(send=_send, recv=_recv), 1000, 5000, count, C.DTYPES["float"], 0, root, rank, n, 77, _group_start, _group_end)


def test_gather_call_is_nccl_tests_grouped_send_recv():
    # GatherRunColl (NCCL < 2.28): group { send(sptr, count, root); on the root: for r: recv(rptr + r*count*elt, r) }
    assert _named(C.collective("gather").call(_rank_call(1, 3, 2))) == [
        ("_group_start", ()), ("_send", (1000, 10, 7, 2, 77)), ("_group_end", ())]
    assert _named(C.collective("gather").call(_rank_call(2, 3, 2))) == [
        ("_group_start", ()), ("_send", (1000, 10, 7, 2, 77)),
        ("_recv", (5000, 10, 7, 0, 77)), ("_recv", (5040, 10, 7, 1, 77)), ("_recv", (5080, 10, 7, 2, 77)),
        ("_group_end", ())]


def test_scatter_call_is_nccl_tests_grouped_send_recv():
    # ScatterRunColl (NCCL < 2.28): group { on the root: for r: send(sptr + r*count*elt, r); recv(rptr, root) }
    assert _named(C.collective("scatter").call(_rank_call(0, 3, 1))) == [
        ("_group_start", ()), ("_recv", (5000, 10, 7, 1, 77)), ("_group_end", ())]
    assert _named(C.collective("scatter").call(_rank_call(1, 3, 1))) == [
        ("_group_start", ()), ("_send", (1000, 10, 7, 0, 77)), ("_send", (1040, 10, 7, 1, 77)),
        ("_send", (1080, 10, 7, 2, 77)), ("_recv", (5000, 10, 7, 1, 77)), ("_group_end", ())]

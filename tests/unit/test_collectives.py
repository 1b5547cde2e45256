"""The collectives table against nccl-tests' formulas (src/<coll>.cu GetCollByteCount / GetBw and
doc/PERFORMANCE.md), written out again here independently for every collective and rank count."""

from __future__ import annotations

import pytest

from gpubench.bench import collectives as C
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
    }[name]


@pytest.mark.parametrize("name", list(C.COLLECTIVES))
@pytest.mark.parametrize("n", RANKS)
def test_busbw_factor_matches_nccl_tests(name, n):
    assert C.busbw_factor(C.COLLECTIVES[name], n) == pytest.approx(_nccl_tests_factor(name, n), rel=1e-15)


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
    raise AssertionError(name)


@pytest.mark.parametrize("name", list(C.COLLECTIVES))
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 8])
@pytest.mark.parametrize("dt", ["int8", "half", "float", "double"])
@pytest.mark.parametrize("size", [8, 1000, 4096, 1 << 20, 3 * (1 << 20) + 5, 1 << 30])
def test_byte_counts_match_nccl_tests(name, n, dt, size):
    d = C.DTYPES[dt]
    cc = C.counts(C.COLLECTIVES[name], size, d.size, n)
    want = _nccl_tests_counts(name, size // d.size, d.size, n)
    assert (cc.send_count, cc.recv_count, cc.param_count, cc.send_inplace_offset, cc.recv_inplace_offset) == want
    # gathered kinds hand each rank a whole number of 16-byte units
    if C.COLLECTIVES[name].size_ranks:
        assert (cc.param_count * d.size) % 16 == 0


@pytest.mark.parametrize("name", list(C.COLLECTIVES))
def test_algbw_numerator(name):
    coll = C.COLLECTIVES[name]
    n, elt, t = 4, 4, 2e-3
    cc = C.counts(coll, 1 << 24, elt, n)
    alg, bus = C.bandwidths(coll, cc.param_count, elt, t, n)
    s = cc.param_count * elt * (n if name in ("all-gather", "reduce-scatter", "all-to-all") else 1)
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
                                        ("sendrecv", "send-recv"), ("bcast", "broadcast"), ("reduce", "reduce")])
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

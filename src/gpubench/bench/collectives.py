"""The NCCL collectives gpubench measures: per collective, its byte counts and its bandwidth formula,
nccl-tests style (one small table entry per collective; the driver in bench/nccl.py does the rest).

Pure Python: no CuPy, no NCCL, so the CLI validates options and the unit tests check every formula
without a GPU.

Sources (nccl-tests 2.19.6, github.com/NVIDIA/nccl-tests):

- byte counts: ``<Coll>GetCollByteCount`` in src/all_reduce.cu, all_gather.cu, reduce_scatter.cu,
  broadcast.cu, reduce.cu, alltoall.cu, sendrecv.cu. ``size`` is the user's size in bytes; ``count =
  size // elt_size``; all-gather, reduce-scatter and all-to-all split it over the ranks and round the
  per-rank count down to a multiple of 16 bytes (``(count / nranks) & ~(16 / eltSize - 1)``).
- bandwidths: ``<Coll>GetBw``: ``algbw = S / t`` with S = ``paramcount * eltSize`` (all-reduce,
  broadcast, reduce, send/recv) or ``paramcount * eltSize * nranks`` (all-gather, reduce-scatter,
  all-to-all); ``busbw = algbw * factor``, the factor derived in doc/PERFORMANCE.md:
  all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all (n-1)/n; broadcast, reduce, send/recv 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from gpubench.core.errors import UsageError


@dataclass(frozen=True)
class CollCounts:
    """Element counts of one collective call, as nccl-tests' GetCollByteCount returns them.

    Attributes:
        send_count: elements each rank sends (its send buffer holds this many).
        recv_count: elements each rank receives (its receive buffer holds this many).
        param_count: the ``count`` argument of the NCCL call.
        send_inplace_offset: in-place runs put rank r's send data at recvbuff + r * this (elements).
        recv_inplace_offset: in-place runs read rank r's result at recvbuff + r * this (elements).
    """

    send_count: int
    recv_count: int
    param_count: int
    send_inplace_offset: int
    recv_inplace_offset: int

    def send_bytes(self, elt_size: int) -> int:
        return self.send_count * elt_size

    def recv_bytes(self, elt_size: int) -> int:
        return self.recv_count * elt_size


def _per_rank_base(count: int, elt_size: int, nranks: int) -> int:
    # (count / nranks) & ~(16 / eltSize - 1): a whole number of 16-byte units per rank
    mask = max(1, 16 // elt_size) - 1
    return (count // nranks) & ~mask


def _same(count: int, elt_size: int, nranks: int) -> CollCounts:
    return CollCounts(count, count, count, 0, 0)


def _allgather(count: int, elt_size: int, nranks: int) -> CollCounts:
    base = _per_rank_base(count, elt_size, nranks)
    return CollCounts(base, base * nranks, base, base, 0)


def _reducescatter(count: int, elt_size: int, nranks: int) -> CollCounts:
    base = _per_rank_base(count, elt_size, nranks)
    return CollCounts(base * nranks, base, base, 0, base)


def _alltoall(count: int, elt_size: int, nranks: int) -> CollCounts:
    base = _per_rank_base(count, elt_size, nranks)
    return CollCounts(base * nranks, base * nranks, base, 0, 0)


@dataclass(frozen=True)
class Collective:
    """One collective's entry.

    Attributes:
        name: gpubench's name (``all-reduce``...).
        nccl_tests: the nccl-tests binary that measures the same thing.
        counts: (count, elt_size, nranks) -> CollCounts.
        size_ranks: whether S (the algbw numerator) is ``param_count * elt_size * nranks`` (True) or
            ``param_count * elt_size`` (False).
        factor: nranks -> busbw / algbw (doc/PERFORMANCE.md).
        factor_text: the factor as a formula, for reports and docs.
        reduces: takes a reduction op.
        rooted: takes a root rank.
    """

    name: str
    nccl_tests: str
    counts: Callable[[int, int, int], CollCounts]
    size_ranks: bool
    factor: Callable[[int], float]
    factor_text: str
    reduces: bool = False
    rooted: bool = False


COLLECTIVES: dict[str, Collective] = {
    c.name: c
    for c in (
        Collective("all-reduce", "all_reduce_perf", _same, False, lambda n: 2 * (n - 1) / n, "2(n-1)/n", reduces=True),
        Collective("all-gather", "all_gather_perf", _allgather, True, lambda n: (n - 1) / n, "(n-1)/n"),
        Collective("reduce-scatter", "reduce_scatter_perf", _reducescatter, True, lambda n: (n - 1) / n, "(n-1)/n",
                   reduces=True),
        Collective("broadcast", "broadcast_perf", _same, False, lambda n: 1.0, "1", rooted=True),
        Collective("reduce", "reduce_perf", _same, False, lambda n: 1.0, "1", reduces=True, rooted=True),
        Collective("all-to-all", "alltoall_perf", _alltoall, True, lambda n: (n - 1) / n, "(n-1)/n"),
        Collective("send-recv", "sendrecv_perf", _same, False, lambda n: 1.0, "1"),
    )
}
# Accepted spellings -> canonical name (nccl-tests' binary stems and short forms).
_ALIASES = {
    "allreduce": "all-reduce", "all_reduce": "all-reduce",
    "allgather": "all-gather", "all_gather": "all-gather",
    "reducescatter": "reduce-scatter", "reduce_scatter": "reduce-scatter",
    "bcast": "broadcast",
    "alltoall": "all-to-all", "all_to_all": "all-to-all",
    "sendrecv": "send-recv", "send_recv": "send-recv", "p2p": "send-recv",
}


@dataclass(frozen=True)
class DType:
    """An NCCL data type: gpubench's name, ncclDataType_t value (nccl.h), bytes per element, kind."""

    name: str
    nccl: int
    size: int
    kind: str  # "int", "uint" or "float"
    numpy: str  # numpy dtype used to hold it (bfloat16 is held as uint16 bits)


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("int8", 0, 1, "int", "int8"),
        DType("uint8", 1, 1, "uint", "uint8"),
        DType("int32", 2, 4, "int", "int32"),
        DType("uint32", 3, 4, "uint", "uint32"),
        DType("int64", 4, 8, "int", "int64"),
        DType("uint64", 5, 8, "uint", "uint64"),
        DType("half", 6, 2, "float", "float16"),
        DType("float", 7, 4, "float", "float32"),
        DType("double", 8, 8, "float", "float64"),
        DType("bfloat16", 9, 2, "float", "uint16"),
    )
}
_DTYPE_ALIASES = {
    "char": "int8", "int": "int32", "float16": "half", "fp16": "half", "f16": "half",
    "float32": "float", "fp32": "float", "f32": "float", "float64": "double", "fp64": "double",
    "f64": "double", "bf16": "bfloat16",
}

# ncclRedOp_t values (nccl.h)
OPS: dict[str, int] = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}


def collective(name: str) -> Collective:
    """The table entry for ``name`` (canonical or an alias such as ``allreduce``).

    Raises:
        UsageError: not a known collective; the message lists the accepted names.
    """
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in COLLECTIVES:
        raise UsageError(f"collective {name!r} not known", f"use one of {', '.join(COLLECTIVES)}")
    return COLLECTIVES[key]


def dtype(name: str) -> DType:
    """The NCCL data type named ``name`` (nccl-tests' names and numpy-style aliases).

    Raises:
        UsageError: not a known type (float8 types are not offered: CuPy's NCCL bindings lack them).
    """
    key = str(name).strip().lower()
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise UsageError(f"data type {name!r} not known", f"use one of {', '.join(DTYPES)}")
    return DTYPES[key]


def op(name: str) -> int:
    """The ncclRedOp_t value of ``name`` (sum, prod, max, min, avg).

    Raises:
        UsageError: any other name (nccl-tests' premultiplied ``mulsum`` is not offered).
    """
    key = str(name).strip().lower()
    if key not in OPS:
        raise UsageError(f"reduction op {name!r} not known", f"use one of {', '.join(OPS)}")
    return OPS[key]


def counts(coll: Collective, size_bytes: int, elt_size: int, nranks: int) -> CollCounts:
    """Element counts of ``coll`` for a user size of ``size_bytes`` (nccl-tests' setupArgs).

    Args:
        size_bytes: the size from -b/-e, in bytes.
        elt_size: bytes per element of the data type.
        nranks: number of ranks (>= 1).

    Raises:
        ValueError: nranks < 1 or elt_size < 1.
    """
    if nranks < 1 or elt_size < 1:
        raise ValueError("nranks and elt_size must be >= 1")
    return coll.counts(size_bytes // elt_size, elt_size, nranks)


def reported_bytes(coll: Collective, size_bytes: int, elt_size: int, nranks: int) -> int:
    """The "size" nccl-tests prints for a point: max(send bytes, receive bytes) of one rank."""
    c = counts(coll, size_bytes, elt_size, nranks)
    return max(c.send_bytes(elt_size), c.recv_bytes(elt_size))


def algbw_bytes(coll: Collective, param_count: int, elt_size: int, nranks: int) -> int:
    """S of ``algbw = S / t`` in bytes: param_count * elt_size, times nranks for the gathered kinds."""
    s = param_count * elt_size
    return s * nranks if coll.size_ranks else s


def busbw_factor(coll: Collective, nranks: int) -> float:
    """busbw / algbw for ``nranks`` ranks (doc/PERFORMANCE.md); 0 for a 1-rank all-reduce."""
    if nranks < 1:
        raise ValueError("nranks must be >= 1")
    return float(coll.factor(nranks))


def bandwidths(coll: Collective, param_count: int, elt_size: int, seconds: float, nranks: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes per second for one call taking ``seconds`` (nccl-tests' GetBw).

    Raises:
        ValueError: seconds <= 0.
    """
    if seconds <= 0:
        raise ValueError(f"non-positive time {seconds!r}")
    alg = algbw_bytes(coll, param_count, elt_size, nranks) / seconds
    return alg, alg * busbw_factor(coll, nranks)

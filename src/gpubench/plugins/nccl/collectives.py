"""The NCCL collectives gpubench measures, one table entry each, as nccl-tests 2.19.6 defines them
in the entry's ``source`` file: byte counts (``<Coll>GetCollByteCount``), algbw size and busbw factor
(``<Coll>GetBw``), one rank's NCCL call(s) (``<Coll>RunColl``), expected output (``<Coll>InitData``).
``algbw = S / t`` (bytes / seconds) with S = ``paramcount * eltSize * size_blocks(nranks)``;
``busbw = algbw * factor`` (doc/PERFORMANCE.md). Pure Python: no CuPy, no NCCL (docs/nccl.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from gpubench.plugins.nccl.data import DataArgs
from gpubench.core.errors import UsageError


@dataclass(frozen=True)
class CollCounts:
    """Element counts of one collective call, as nccl-tests' GetCollByteCount returns them; in place,
    rank r's send data is at recvbuff + r * send_inplace_offset, its result at + r * recv_inplace_offset."""

    send_count: int
    recv_count: int
    param_count: int
    send_inplace_offset: int
    recv_inplace_offset: int


def _same(count: int, elt_size: int, nranks: int) -> CollCounts:
    return CollCounts(count, count, count, 0, 0)


def _blocks(shape: str, align: int = 0) -> Callable[[int, int, int], CollCounts]:
    """GetCollByteCount of a collective over per-rank blocks. ``shape``: the send count, receive
    count, send and receive in-place offsets, each "0", "1" (one block) or "n" (nranks blocks)."""
    def counts(count: int, elt_size: int, nranks: int) -> CollCounts:
        if align:  # hypercube.cu: (count / (ALIGN * nranks)) * ALIGN
            base = (count // (align * nranks)) * align
        else:  # (count / nranks) & ~(16 / eltSize - 1): a whole number of 16-byte units per rank
            base = (count // nranks) & ~(max(1, 16 // elt_size) - 1)
        send, recv, send_off, recv_off = ({"0": 0, "1": 1, "n": nranks}[c] * base for c in shape)
        return CollCounts(send, recv, base, send_off, recv_off)

    return counts


_allgather = _blocks("1n10")
_reducescatter = _blocks("n101")
_alltoall = _blocks("nn00")
_hypercube = _blocks("1n10", align=4)  # hypercube.cu: ALIGN = 4 elements


@dataclass(frozen=True)
class RankCall:
    """What one rank's NCCL call needs (the arguments of nccl-tests' ``<Coll>RunColl``); ``copy``:
    (dst, src, nbytes, stream) -> a device-to-device cudaMemcpyAsync (hypercube)."""

    comm: Any
    send: int
    recv: int
    count: int
    dtype: DType
    op: int
    root: int
    rank: int
    nranks: int
    stream: int
    group_start: Callable[[], Any]
    group_end: Callable[[], Any]
    copy: Callable[[int, int, int, int], Any] | None = None

    @property
    def block_bytes(self) -> int:
        """Bytes from one rank's block to the next in a buffer of ``nranks`` blocks (count x elt)."""
        return self.count * self.dtype.size


Calls = list[tuple[Callable, tuple]]  # (function, arguments) pairs, called in order


def STEP() -> None:  # noqa: N802 - a marker, named like the constant it is used as
    """Marks the end of one step of a collective made of dependent steps (never called)."""
    raise AssertionError("STEP is a marker in a call list, not a call")


def steps(calls: Calls) -> list[Calls]:
    """A rank's calls split at :data:`STEP` markers: the dependent steps, in order."""
    out: list[Calls] = [[]]
    for fn, args in calls:
        if fn is STEP:
            out.append([])
        else:
            out[-1].append((fn, args))
    return [s for s in out if s]


def _grouped(a: RankCall, calls: Calls) -> Calls:
    return [(a.group_start, ()), *calls, (a.group_end, ())]


def _single(method: str, *extra: str) -> Callable[[RankCall], Calls]:
    """RunColl of a collective that is one NCCL call: ``comm.<method>(send, recv, count, datatype,
    <the RankCall fields named in extra: op, root>, stream)``."""
    def call(a: RankCall) -> Calls:
        return [(getattr(a.comm, method), (a.send, a.recv, a.count, a.dtype.nccl, *(getattr(a, f) for f in extra),
                                           a.stream))]

    return call


def _all_to_all_call(a: RankCall) -> Calls:
    """nccl-tests src/alltoall.cu AlltoAllRunColl before NCCL 2.28 (CuPy has no ncclAlltoAll):
    grouped, a send to and a receive from every rank p, its block at p x count elements."""
    calls: Calls = []
    for p in range(a.nranks):
        calls.append((a.comm.send, (a.send + p * a.block_bytes, a.count, a.dtype.nccl, p, a.stream)))
        calls.append((a.comm.recv, (a.recv + p * a.block_bytes, a.count, a.dtype.nccl, p, a.stream)))
    return _grouped(a, calls)


def _send_recv_call(a: RankCall) -> Calls:
    """nccl-tests src/sendrecv.cu: grouped, send to rank+1 and receive from rank-1."""
    return _grouped(a, [(a.comm.send, (a.send, a.count, a.dtype.nccl, (a.rank + 1) % a.nranks, a.stream)),
                        (a.comm.recv, (a.recv, a.count, a.dtype.nccl, (a.rank - 1) % a.nranks, a.stream))])


def _gather_call(a: RankCall) -> Calls:
    """nccl-tests src/gather.cu GatherRunColl for 2.7 <= NCCL < 2.28: grouped, every rank sends its
    block to the root, which receives rank r's block at r x count elements."""
    calls: Calls = [(a.comm.send, (a.send, a.count, a.dtype.nccl, a.root, a.stream))]
    if a.rank == a.root:
        calls += [(a.comm.recv, (a.recv + r * a.block_bytes, a.count, a.dtype.nccl, r, a.stream))
                  for r in range(a.nranks)]
    return _grouped(a, calls)


def _scatter_call(a: RankCall) -> Calls:
    """nccl-tests src/scatter.cu ScatterRunColl for 2.7 <= NCCL < 2.28: grouped, the root sends block
    r (at r x count elements) to rank r, and every rank receives its block from the root."""
    calls: Calls = []
    if a.rank == a.root:
        calls += [(a.comm.send, (a.send + r * a.block_bytes, a.count, a.dtype.nccl, r, a.stream))
                  for r in range(a.nranks)]
    calls.append((a.comm.recv, (a.recv, a.count, a.dtype.nccl, a.root, a.stream)))
    return _grouped(a, calls)


def _hypercube_call(a: RankCall) -> Calls:
    """nccl-tests src/hypercube.cu HyperCubeRunColl: the rank's own block copied into place, then for
    mask = 1, 2, 4 ... < n one grouped step exchanging ``mask`` blocks with ``rank ^ mask``."""
    if a.copy is None:
        raise ValueError("hypercube needs RankCall.copy (a device-to-device copy)")
    calls: Calls = []
    mine = a.recv + a.rank * a.block_bytes
    if a.send != mine:
        calls.append((a.copy, (mine, a.send, a.block_bytes, a.stream)))
    mask = 1
    while mask < a.nranks:
        held = a.rank & ~(mask - 1)
        peer = a.rank ^ mask
        calls += [(STEP, ())] if calls else []
        calls += _grouped(a, [(a.comm.send, (a.recv + held * a.block_bytes, a.count * mask, a.dtype.nccl, peer, a.stream)),
                              (a.comm.recv, (a.recv + (held ^ mask) * a.block_bytes, a.count * mask, a.dtype.nccl, peer,
                                             a.stream))])
        mask <<= 1
    return calls


# Expected outputs (nccl-tests <Coll>InitData's ``expected``): (xp, output indices, DataArgs) ->
# values. Rank p sends DataArgs.sent(xp, p, k) at its input index k (nccl_data.rank_values).


def _expect_reduced(xp, idx, a: DataArgs):
    return a.reduced(xp, idx)


def _expect_every_rank_block(xp, idx, a: DataArgs):
    return a.sent(xp, idx // a.base, idx % a.base)


def _root_only(rank: int, root: int) -> bool:
    return rank == root


def _power_of_two_ranks(n: int) -> str | None:
    # hypercube.cu runs only on a power-of-2 number of ranks; one rank exchanges nothing
    return None if n >= 2 and n & (n - 1) == 0 else f"needs a power-of-2 number of ranks, 2 or more (got {n})"


def _share_of_others(n: int) -> float:
    return (n - 1) / n


@dataclass(frozen=True)
class Collective:
    """One collective's entry: everything that differs between collectives (nccl-tests' testColl:
    GetCollByteCount, InitData, GetBw, RunColl); docs/nccl.md lists each field and its source.
    ``size_blocks``: nranks -> how many ``param_count * elt_size`` blocks S is; ``factor``: nranks
    -> busbw / algbw; ``ranks_ok``: nranks -> why it cannot run on that many ranks, or None.
    """

    name: str
    nccl_tests: str
    source: str
    counts: Callable[[int, int, int], CollCounts]
    size_blocks: Callable[[int], int]
    factor: Callable[[int], float]
    factor_text: str
    call: Callable[[RankCall], Calls]
    expected: Callable[[Any, Any, DataArgs], Any]
    holds_result: Callable[[int, int], bool] = lambda rank, root: True
    sends: Callable[[int, int], bool] = lambda rank, root: True
    checked_in_place: bool = True
    reduces: bool = False
    rooted: bool = False
    aliases: tuple[str, ...] = ()
    ranks_ok: Callable[[int], str | None] = lambda n: None

    def spellings(self) -> tuple[str, ...]:
        """Accepted names, lower case: the name, without or with ``_`` for its hyphens, the
        nccl-tests binary's stem, and the aliases."""
        forms = (self.name, self.name.replace("-", ""), self.name.replace("-", "_"),
                 self.nccl_tests.removesuffix("_perf"), *self.aliases)
        return tuple(dict.fromkeys(forms))


COLLECTIVES: dict[str, Collective] = {
    c.name: c
    for c in (
        Collective("all-reduce", "all_reduce_perf", "src/all_reduce.cu", _same, lambda n: 1, lambda n: 2 * (n - 1) / n,
                   "2(n-1)/n", _single("allReduce", "op"), _expect_reduced, reduces=True),
        Collective("all-gather", "all_gather_perf", "src/all_gather.cu", _allgather, lambda n: n, _share_of_others,
                   "(n-1)/n", _single("allGather"), _expect_every_rank_block),
        Collective("reduce-scatter", "reduce_scatter_perf", "src/reduce_scatter.cu", _reducescatter, lambda n: n,
                   _share_of_others, "(n-1)/n", _single("reduceScatter", "op"),
                   lambda xp, idx, a: a.reduced(xp, a.rank * a.base + idx), reduces=True),
        Collective("broadcast", "broadcast_perf", "src/broadcast.cu", _same, lambda n: 1, lambda n: 1.0, "1",
                   _single("broadcast", "root"), lambda xp, idx, a: a.sent(xp, a.root, idx), rooted=True,
                   aliases=("bcast",)),
        Collective("reduce", "reduce_perf", "src/reduce.cu", _same, lambda n: 1, lambda n: 1.0, "1",
                   _single("reduce", "op", "root"), _expect_reduced, holds_result=_root_only, reduces=True, rooted=True),
        Collective("all-to-all", "alltoall_perf", "src/alltoall.cu", _alltoall, lambda n: n, _share_of_others,
                   "(n-1)/n", _all_to_all_call,
                   lambda xp, idx, a: a.sent(xp, idx // a.base, a.rank * a.base + idx % a.base),
                   checked_in_place=False),
        Collective("send-recv", "sendrecv_perf", "src/sendrecv.cu", _same, lambda n: 1, lambda n: 1.0, "1",
                   _send_recv_call, lambda xp, idx, a: a.sent(xp, (a.rank - 1) % a.nranks, idx), checked_in_place=False,
                   aliases=("p2p",)),
        # gather.cu's GetCollByteCount is all-gather's, scatter.cu's reduce-scatter's
        Collective("gather", "gather_perf", "src/gather.cu", _allgather, lambda n: n, _share_of_others, "(n-1)/n",
                   _gather_call, _expect_every_rank_block, holds_result=_root_only, rooted=True),
        Collective("scatter", "scatter_perf", "src/scatter.cu", _reducescatter, lambda n: n, _share_of_others,
                   "(n-1)/n", _scatter_call, lambda xp, idx, a: a.sent(xp, a.root, a.rank * a.base + idx),
                   sends=_root_only, rooted=True),
        # hypercube.cu: an all-gather by log2(n) exchanges; GetBw's S is count x (n-1), factor 1
        Collective("hypercube", "hypercube_perf", "src/hypercube.cu", _hypercube, lambda n: n - 1, lambda n: 1.0, "1",
                   _hypercube_call, _expect_every_rank_block, ranks_ok=_power_of_two_ranks),
    )
}
# Accepted spellings (lower case) -> canonical name.
_SPELLINGS = {s: c.name for c in COLLECTIVES.values() for s in c.spellings()}


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


def _lookup(what: str, name: str, table: dict, aliases: dict[str, str] | None = None) -> str:
    """The key of ``table`` that ``name`` (any case, spaces around) or its alias names.

    Raises:
        UsageError: neither; the message lists the table's keys.
    """
    key = str(name).strip().lower()
    key = (aliases or {}).get(key, key)
    if key not in table:
        raise UsageError(f"{what} {name!r} not known", f"use one of {', '.join(table)}")
    return key


def collective(name: str) -> Collective:
    """The table entry for ``name`` (canonical or an alias such as ``allreduce``).

    Raises:
        UsageError: not a known collective; the message lists the accepted names.
    """
    return COLLECTIVES[_lookup("collective", name, COLLECTIVES, _SPELLINGS)]


def dtype(name: str) -> DType:
    """The NCCL data type named ``name`` (nccl-tests' names and numpy-style aliases).

    Raises:
        UsageError: not a known type (float8 types are not offered: CuPy's NCCL bindings lack them).
    """
    return DTYPES[_lookup("data type", name, DTYPES, _DTYPE_ALIASES)]


def op(name: str) -> int:
    """The ncclRedOp_t value of ``name`` (sum, prod, max, min, avg).

    Raises:
        UsageError: any other name (nccl-tests' premultiplied ``mulsum`` is not offered).
    """
    return OPS[_lookup("reduction op", name, OPS)]


def counts(coll: Collective, size_bytes: int, elt_size: int, nranks: int) -> CollCounts:
    """Element counts of ``coll`` for a user size of ``size_bytes`` bytes (nccl-tests' setupArgs).

    Raises:
        ValueError: nranks < 1 or elt_size < 1.
        UsageError: the collective does not run on ``nranks`` ranks (its ``ranks_ok``).
    """
    if nranks < 1 or elt_size < 1:
        raise ValueError("nranks and elt_size must be >= 1")
    why = coll.ranks_ok(nranks)
    if why is not None:
        raise UsageError(f"{coll.name} {why}", f"run it on a number of ranks it takes ({coll.source})")
    return coll.counts(size_bytes // elt_size, elt_size, nranks)


def reported_bytes(coll: Collective, size_bytes: int, elt_size: int, nranks: int) -> int:
    """The "size" nccl-tests prints for a point: max(send bytes, receive bytes) of one rank."""
    c = counts(coll, size_bytes, elt_size, nranks)
    return max(c.send_count, c.recv_count) * elt_size


def algbw_bytes(coll: Collective, param_count: int, elt_size: int, nranks: int) -> int:
    """S of ``algbw = S / t`` in bytes: param_count * elt_size, times the entry's size_blocks(nranks)."""
    return param_count * elt_size * coll.size_blocks(nranks)


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

"""Every entry of the collectives table run end to end on the CPU: its ``call`` issues NCCL calls to a
recording communicator, a small model of NCCL (each call as nccl.h defines it, send/recv matched in
order per peer) moves the bytes in a numpy "device memory", and the entry's ``expected``,
``holds_result`` and ``sends`` must then agree with what the model delivered, out of place and in
place, for several rank counts and roots. This checks the parts a GPU run checks (the calls, their
pointers and offsets, the expected data) without a GPU; tests/gpu/test_nccl_gpu.py runs the same
entries through real NCCL."""

from __future__ import annotations

import itertools

from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest

from gpubench.plugins.nccl import collectives as C
from gpubench.plugins.nccl import data as D

BASE = 1 << 16  # address of byte 0 of the model's memory (so no pointer is 0)
_REDUCE = {"sum": lambda a: a.sum(axis=0), "max": lambda a: a.max(axis=0)}


class Model:
    """Device memory of every rank plus the calls of one iteration; :meth:`run` performs them."""

    def __init__(self, nbytes: int):
        self.mem = np.zeros(nbytes, dtype=np.uint8)
        self.log: list[tuple[str, int, tuple]] = []

    def view(self, addr: int, count: int, dt: C.DType) -> np.ndarray:
        elt = dt.size
        return self.mem[addr - BASE: addr - BASE + count * elt].view(dt.numpy)

    def comm(self, rank: int):
        def rec(name):
            return lambda *args: self.log.append((name, rank, args))

        return SimpleNamespace(**{n: rec(n) for n in ("allReduce", "allGather", "reduceScatter", "broadcast",
                                                      "reduce", "send", "recv")})

    def copy(self, rank: int):
        """The rank's device-to-device copy (RankCall.copy), logged like a call."""
        return lambda dst, src, nbytes, stream: self.log.append(("copy", rank, (dst, src, nbytes, stream)))

    def run(self, nranks: int, dt: C.DType, op_name: str) -> None:
        """Perform the logged calls: every read sees the memory as it was before the iteration."""
        before = self.mem.copy()

        def read(addr, count):
            return before[addr - BASE: addr - BASE + count * dt.size].view(dt.numpy)

        by_kind = defaultdict(dict)
        sends, recvs = defaultdict(list), defaultdict(list)
        copies = []
        for name, rank, args in self.log:
            if name == "copy":
                copies.append(args)
            elif name == "send":
                sends[(rank, args[3])].append(args)
            elif name == "recv":
                recvs[(args[3], rank)].append(args)
            else:
                assert rank not in by_kind[name], f"rank {rank} called {name} twice"
                by_kind[name][rank] = args
        red = _REDUCE[op_name]
        for name, calls in by_kind.items():
            assert sorted(calls) == list(range(nranks)), f"{name} not called by every rank"
            count = calls[0][2]
            if name == "allReduce":
                out = red(np.stack([read(calls[p][0], count) for p in range(nranks)]))
                for r in range(nranks):
                    self.view(calls[r][1], count, dt)[...] = out
            elif name == "reduce":
                root = calls[0][5]
                self.view(calls[root][1], count, dt)[...] = red(np.stack([read(calls[p][0], count)
                                                                          for p in range(nranks)]))
            elif name == "broadcast":
                root = calls[0][4]
                for r in range(nranks):
                    self.view(calls[r][1], count, dt)[...] = read(calls[root][0], count)
            elif name == "allGather":
                for r in range(nranks):
                    self.view(calls[r][1], count * nranks, dt)[...] = np.concatenate(
                        [read(calls[p][0], count) for p in range(nranks)])
            elif name == "reduceScatter":
                for r in range(nranks):
                    blocks = [read(calls[p][0] + r * count * dt.size, count) for p in range(nranks)]
                    self.view(calls[r][1], count, dt)[...] = red(np.stack(blocks))
        for dst, src, nbytes, _stream in copies:
            self.mem[dst - BASE: dst - BASE + nbytes] = before[src - BASE: src - BASE + nbytes]
        assert sorted(sends) == sorted(recvs), "every send needs its receive and back"
        for key, ss in sends.items():
            rs = recvs[key]
            assert len(ss) == len(rs), key
            for s, r in zip(ss, rs):  # NCCL matches a pair's sends and receives in order
                assert s[1] == r[1], "send and receive counts differ"
                self.view(r[0], r[1], dt)[...] = read(s[0], s[1])
        self.log.clear()


def _setup(coll, size, n, dt, root, op_name, in_place):
    """A model with n ranks' buffers, initialised as nccl_data.init_data does; returns (model,
    ranks, counts)."""
    cc = C.counts(coll, size, dt.size, n)
    maxbytes = max(cc.send_count, cc.recv_count) * dt.size
    model = Model(2 * n * maxbytes)
    ranks = [SimpleNamespace(rank=r, comm=model.comm(r), send=SimpleNamespace(ptr=BASE + 2 * r * maxbytes),
                             recv=SimpleNamespace(ptr=BASE + (2 * r + 1) * maxbytes)) for r in range(n)]
    for rk in ranks:  # zero the output, fill the inputs of the ranks that send
        model.view(rk.recv.ptr, maxbytes // dt.size, dt)[...] = 0
        if coll.sends(rk.rank, root):
            sptr, _ = D.pointers(rk, cc, dt.size, in_place, 0)
            k = np.arange(cc.send_count, dtype=np.int64)
            model.view(sptr, cc.send_count, dt)[...] = D.encode(np, D.rank_values(np, rk.rank, k, op_name).astype(
                np.float64), dt)
    return model, ranks, cc


def _issue(model, coll, ranks, cc, dt, op_name, root, in_place, n):
    """Every rank's calls, step by step (collectives.STEP): the model performs each step on every
    rank before the next step is issued, as the driver groups them."""
    starts = []
    per_rank = []
    for rk in ranks:
        s, r = D.pointers(rk, cc, dt.size, in_place, 0)
        a = C.RankCall(rk.comm, s, r, cc.param_count, dt, C.OPS[op_name], root, rk.rank, n, 0,
                       lambda: starts.append(1), lambda: starts.append(-1), model.copy(rk.rank))
        per_rank.append(C.steps(coll.call(a)))
    for k in range(max(len(st) for st in per_rank)):
        for st in per_rank:
            for fn, args in (st[k] if k < len(st) else []):
                fn(*args)
        if k < max(len(st) for st in per_rank) - 1:
            model.run(n, dt, op_name)
    assert sum(starts) == 0, "every ncclGroupStart has its ncclGroupEnd"


def _wrong(model, coll, ranks, cc, dt, op_name, root, in_place, n) -> int:
    wrong = 0
    for rk in ranks:
        if not coll.holds_result(rk.rank, root):
            continue
        _, rptr = D.pointers(rk, cc, dt.size, in_place, 0)
        idx = np.arange(cc.recv_count, dtype=np.int64)
        exp = D.expected_values(np, coll, rk.rank, n, root, cc.param_count, idx, op_name, dt.kind)
        wrong += D.count_wrong(np, model.view(rptr, cc.recv_count, dt), exp, dt)
    return wrong


@pytest.mark.parametrize("name", list(C.COLLECTIVES))
def test_entry_delivers_what_it_expects(name):
    """On 1, 2, 3 and 8 ranks, out of place and in place (where nccl-tests checks it), sum and max,
    rooted at the first and the last rank: the table's call delivers what its check expects."""
    coll = C.COLLECTIVES[name]
    dt = C.DTYPES["float"]
    for n, place, op_name in itertools.product([1, 2, 3, 8], ["out-of-place", "in-place"], ["sum", "max"]):
        in_place = place == "in-place"
        if (in_place and not coll.checked_in_place) or coll.ranks_ok(n) is not None:
            continue
        for root in sorted({0, n - 1}):
            model, ranks, cc = _setup(coll, 64 * 9 + 4, n, dt, root, op_name, in_place)
            _issue(model, coll, ranks, cc, dt, op_name, root, in_place, n)
            model.run(n, dt, op_name)
            assert _wrong(model, coll, ranks, cc, dt, op_name, root, in_place, n) == 0, (n, place, op_name, root, cc)


@pytest.mark.parametrize("name", list(C.COLLECTIVES))
def test_check_catches_a_call_that_moved_nothing(name):
    coll = C.COLLECTIVES[name]
    dt = C.DTYPES["float"]
    for n, place in itertools.product([2, 8], ["out-of-place", "in-place"]):
        in_place = place == "in-place"
        if in_place and not coll.checked_in_place:
            continue
        model, ranks, cc = _setup(coll, 64 * 9 + 4, n, dt, 0, "sum", in_place)
        assert _wrong(model, coll, ranks, cc, dt, "sum", 0, in_place, n) > 0, (n, place)

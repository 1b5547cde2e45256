"""nccl's data: the values each rank sends, their encoding in every NCCL data type, the count of
wrong elements, and the initialisation and check on the GPU (nccl-tests InitData / CheckData).
The pure parts take ``xp`` (numpy or cupy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: collectives imports this module
    from gpubench.plugins.nccl.collectives import CollCounts, Collective, DType

CHECK_CHUNK = 1 << 24  # elements checked per step, so the check's temporaries stay small
_TOLERANCE = {"half": 1e-3, "bfloat16": 8e-3, "float": 1e-6, "double": 1e-12}


def rank_values(xp, p, k, op_name: str):
    """The value rank(s) ``p`` send at element index(es) ``k``: ``(k + 3p) mod 7 + 1``; for prod
    ``1 + (k + p) mod 2`` (exact in every type)."""
    if op_name == "prod":
        return 1 + (k + p) % 2
    return (k + 3 * p) % 7 + 1


@dataclass(frozen=True)
class DataArgs:
    """What a collective's ``expected`` function needs besides the output indices (``base``: the
    call's per-rank count)."""

    rank: int
    nranks: int
    root: int
    base: int
    op: str
    kind: str

    def sent(self, xp, p, k):
        """What rank(s) ``p`` sent at index(es) ``k``, as int64 (integer kinds) or float64."""
        return rank_values(xp, p, k, self.op).astype(xp.float64 if self.kind == "float" else xp.int64)

    def reduced(self, xp, k):
        """The reduction over every rank of what each sent at index(es) ``k`` (avg: floor division for integers)."""
        stack = xp.stack([self.sent(xp, p, k) for p in range(self.nranks)])
        if self.op != "avg":
            return getattr(stack, self.op)(axis=0)
        s = stack.sum(axis=0)
        return s // self.nranks if self.kind != "float" else s / self.nranks


def expected_values(xp, coll: Collective, rank: int, nranks: int, root: int, base: int, idx, op_name: str,
                    kind: str):
    """What rank ``rank`` must hold at output element indices ``idx`` after ``coll``: int64 (integer
    kinds) or float64 values, before conversion to the data type."""
    a = DataArgs(rank, nranks, root, base, op_name, kind)
    out = coll.expected(xp, idx.astype(xp.int64), a)
    return out.astype(xp.float64 if kind == "float" else xp.int64)


def encode(xp, values, dt: DType):
    """Values (int64/float64) -> the storage array of ``dt`` (bfloat16: the high 16 bits of float32)."""
    if dt.name == "bfloat16":
        f = values.astype(xp.float32)
        return (f.view(xp.uint32) >> 16).astype(xp.uint16)
    return values.astype(dt.numpy)


def decode(xp, stored, dt: DType):
    """Storage array of ``dt`` -> float64 (float kinds) or the storage itself (integer kinds)."""
    if dt.name == "bfloat16":
        return (stored.astype(xp.uint32) << 16).view(xp.float32).astype(xp.float64)
    if dt.kind == "float":
        return stored.astype(xp.float64)
    return stored


def count_wrong(xp, got_stored, expected, dt: DType) -> int:
    """Elements of ``got_stored`` that differ from ``expected`` (exact for integers; a relative
    tolerance of the type's precision for floats, since avg divides)."""
    if dt.kind == "float":
        got = decode(xp, got_stored, dt)
        tol = _TOLERANCE[dt.name]
        bad = xp.abs(got - expected) > tol * xp.maximum(1.0, xp.abs(expected))
        return int(bad.sum())
    return int((got_stored != encode(xp, expected, dt)).sum())


# -- on the GPU ---------------------------------------------------------------------------------------


def _view(ptr: int, nelems: int, dt: DType, device: int):
    import cupy

    itemsize = cupy.dtype(dt.numpy).itemsize
    mem = cupy.cuda.UnownedMemory(ptr, max(1, nelems * itemsize), None, device)
    return cupy.ndarray((nelems,), dtype=dt.numpy, memptr=cupy.cuda.MemoryPointer(mem, 0))


def pointers(rk: Any, cc: CollCounts, elt: int, in_place: bool, shift: int) -> tuple[int, int]:
    """(send, recv) addresses of rank ``rk`` for one call (nccl-tests startColl: in place, both lie in
    the receive buffer)."""
    if in_place:
        base = rk.recv.ptr + shift
        return base + cc.send_inplace_offset * rk.rank * elt, base + cc.recv_inplace_offset * rk.rank * elt
    return rk.send.ptr + shift, rk.recv.ptr + shift


def init_data(ranks: list, coll: Collective, cc: CollCounts, dt: DType, op_name: str, in_place: bool,
              root: int) -> None:
    """Zero each rank's output and fill the input of the ranks that send (nccl-tests InitData)."""
    import cupy

    elt = dt.size
    for rk in ranks:
        with cupy.cuda.Device(rk.device):
            cupy.cuda.runtime.memset(rk.recv.ptr, 0, max(cc.recv_count, cc.send_count) * elt)
            if coll.sends(rk.rank, root):
                sptr, _ = pointers(rk, cc, elt, in_place, 0)
                for start in range(0, cc.send_count, CHECK_CHUNK):
                    n = min(CHECK_CHUNK, cc.send_count - start)
                    k = cupy.arange(start, start + n, dtype=cupy.int64)
                    vals = rank_values(cupy, rk.rank, k, op_name)
                    vals = vals.astype(cupy.float64 if dt.kind == "float" else cupy.int64)
                    _view(sptr + start * elt, n, dt, rk.device)[...] = encode(cupy, vals, dt)
            cupy.cuda.Device().synchronize()


def check(ranks: list, coll: Collective, cc: CollCounts, dt: DType, op_name: str, in_place: bool,
          nranks: int, root: int) -> int:
    """Wrong elements on this process's ranks that hold a result after one call (nccl-tests CheckData)."""
    import cupy

    elt = dt.size
    wrong = 0
    for rk in ranks:
        if not coll.holds_result(rk.rank, root):
            continue
        _, rptr = pointers(rk, cc, elt, in_place, 0)
        with cupy.cuda.Device(rk.device):
            for start in range(0, cc.recv_count, CHECK_CHUNK):
                n = min(CHECK_CHUNK, cc.recv_count - start)
                idx = cupy.arange(start, start + n, dtype=cupy.int64)
                exp = expected_values(cupy, coll, rk.rank, nranks, root, cc.param_count, idx, op_name, dt.kind)
                wrong += count_wrong(cupy, _view(rptr + start * elt, n, dt, rk.device), exp, dt)
    return wrong

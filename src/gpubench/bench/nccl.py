"""``gpubench nccl``: NCCL collectives through CuPy's bindings, timed as nccl-tests times them.

One process, one communicator per GPU (``NcclCommunicator.initAll``), the ranks' calls grouped
between ``ncclGroupStart``/``ncclGroupEnd`` (nccl-tests ``-g N``); or, with a Dask scheduler, one
rank per worker (the unique id passed through the scheduler; nccl-tests under MPI).

What is timed (nccl-tests 2.19.6 src/common.cu BenchTime; docs/nccl.md): a host clock
(``perf_counter``) started before ``iters`` grouped launches are queued and stopped when every
rank's stream has finished (polled with cudaStreamQuery, as testStreamSynchronize does); the
per-iteration time is that span / iters. With ``cuda_graph`` G > 0 (nccl-tests ``-G``), the
``iters`` iterations are captured once per point into one CUDA graph per rank's stream and a
sample is G launches of those graphs: span / (iters * G). Each iteration moves its buffers by one
operation size within buffers of the largest size (nccl-tests' ``shift``, against cache effects).
Before the timed iterations: ``warmup`` iterations and one more (nccl-tests' "Sync" call), each
followed by a full synchronisation. A sample is one such timed span; the report shows the median over samples;
across processes the per-sample times are averaged (nccl-tests' default ``-a 1``).

algbw = S / t and busbw = algbw * factor come from bench/collectives.py (nccl-tests' GetBw and
doc/PERFORMANCE.md).
"""

from __future__ import annotations

import functools
import signal
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable

from gpubench.bench import collectives as C
from gpubench.core import env as envmod
from gpubench.core import gpu
from gpubench.core.errors import CRITICAL, Interrupted, MachineError, UsageError, check_choices
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result
from gpubench.core.units import format_size

PLACES = ("out-of-place", "in-place")
UNCHECKED_IN_PLACE = ("all-to-all", "send-recv")
CHECK_CHUNK = 1 << 24  # elements checked per step, so the check's temporaries stay small
_TOLERANCE = {"half": 1e-3, "bfloat16": 8e-3, "float": 1e-6, "double": 1e-12}


@dataclass(frozen=True)
class NcclSpec:
    """Parsed options of ``gpubench nccl``.

    Attributes:
        collective: canonical name (a key of collectives.COLLECTIVES).
        sizes: operation sizes in bytes (nccl-tests -b/-e/-f), ascending.
        dtype: a key of collectives.DTYPES.
        op: a key of collectives.OPS (ignored by collectives that do not reduce).
        root: root rank of broadcast and reduce.
        devices: CUDA ordinals for the single-process run, or None for every visible GPU.
        warmup: untimed iterations per size before timing (nccl-tests -w).
        iters: iterations per timed sample (nccl-tests -n).
        samples: timed samples per point; the median is reported.
        check: data checks per point (nccl-tests -c; 0 = none).
        places: subset of PLACES.
        cuda_graph: graph launches per sample (nccl-tests -G; 0 = the iterations launched one by
            one, no graph).
        timeout_s: abort when a wait lasts longer (nccl-tests -T; 0 = never).
        scheduler_address, scheduler_file: an existing Dask cluster; one rank per worker.
    """

    collective: str = "all-reduce"
    sizes: tuple[int, ...] = (2**20, 2**22, 2**24, 2**26, 2**28, 2**30)
    dtype: str = "float"
    op: str = "sum"
    root: int = 0
    devices: tuple[int, ...] | None = None
    warmup: int = 1
    iters: int = 20
    samples: int = 5
    check: int = 1
    places: tuple[str, ...] = PLACES
    cuda_graph: int = 0
    timeout_s: float = 0.0
    scheduler_address: str | None = None
    scheduler_file: str | None = None

    def __post_init__(self):
        C.collective(self.collective)
        C.dtype(self.dtype)
        C.op(self.op)
        if not self.sizes or min(self.sizes) < 1:
            raise UsageError("sizes must be at least 1 byte")
        check_choices("placement", self.places, PLACES)
        if self.root < 0:
            raise UsageError(f"root {self.root} must be >= 0")
        if self.iters < 1 or self.samples < 1 or self.warmup < 0 or self.check < 0 or self.cuda_graph < 0:
            raise UsageError("-n and --samples must be >= 1; -w, -c and -G >= 0")
        if self.timeout_s < 0:
            raise UsageError(f"--timeout {self.timeout_s} must be >= 0 seconds")
        if self.scheduler_address and self.scheduler_file:
            raise UsageError("--scheduler-address and --scheduler-file both given", "use one of them")
        if (self.scheduler_address or self.scheduler_file) and self.devices is not None:
            raise UsageError("-d does not apply with a Dask scheduler", "each worker uses its own GPU")

    @property
    def distributed(self) -> bool:
        return bool(self.scheduler_address or self.scheduler_file)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Point:
    """One measured point before it becomes a Record (also what a Dask worker sends back)."""

    nbytes: int  # nccl-tests' "size": max(send, receive) bytes of one rank
    count: int  # the NCCL call's count argument
    place: str
    samples_s: list[float]
    wrong: int | None  # elements that differ from the expected result (None: not checked)
    error: str | None = None


@functools.lru_cache(maxsize=None)
def _libnccl():
    """The NCCL library CuPy loaded (ctypes), or None. Found in /proc/self/maps, else by its soname
    (which returns the copy already loaded). ncclMemAlloc/ncclMemFree get their argument types."""
    import ctypes

    try:
        with open("/proc/self/maps") as f:
            paths = [ln.split()[-1] for ln in f if "libnccl.so" in ln and "/" in ln]
    except OSError:
        paths = []
    for name in [*dict.fromkeys(paths), "libnccl.so.2"]:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        if hasattr(lib, "ncclMemAlloc"):
            lib.ncclMemAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
            lib.ncclMemFree.argtypes = [ctypes.c_void_p]
        return lib
    return None


class NcclBuffer:
    """``nbytes`` of device memory on the current device from ncclMemAlloc, freed with ncclMemFree
    (NCCL >= 2.19), else cudaMalloc.

    ncclMemAlloc is what nccl-tests allocates its buffers with since 2.19 (src/common.cu
    AllocateBuffs): cuMem memory with exportable handles, which NCCL can register for zero-copy
    transfers when the calls are captured in a CUDA graph (NCCL_GRAPH_REGISTER). It fails to
    register cudaMalloc memory ("failed to IPC register userbuff" with NCCL_DEBUG_SUBSYS=REG), and
    on the 2x H200 a -G 10 all-reduce of 128 MiB out of place then gave 286 instead of nccl-tests'
    294-297 GB/s busbw.

    Attributes:
        ptr: the device address; allocator: "ncclMemAlloc" or "cudaMalloc".

    Raises:
        MachineError: ncclMemAlloc failed (its NCCL error string is in the message).
        CUDARuntimeError: cudaMalloc failed (the fallback).
    """

    def __init__(self, nbytes: int):
        import ctypes

        lib = _libnccl()
        self._lib = lib if lib is not None and hasattr(lib, "ncclMemAlloc") else None
        self.nbytes = nbytes
        if self._lib is None:
            self.allocator = "cudaMalloc"
            self._buf = gpu.DeviceBuffer(nbytes)
            self.ptr = self._buf.ptr
            return
        self.allocator = "ncclMemAlloc"
        p = ctypes.c_void_p()
        rc = self._lib.ncclMemAlloc(ctypes.byref(p), ctypes.c_size_t(nbytes))
        if rc != 0 or not p.value:
            self.ptr = 0
            raise MachineError(f"ncclMemAlloc of {format_size(nbytes)} failed: {_nccl_error(self._lib, rc)}",
                               "free GPU memory or use a smaller -e")
        self.ptr = p.value

    def free(self) -> None:
        if not self.ptr:
            return
        ptr, self.ptr = self.ptr, 0
        if self._lib is None:
            self._buf.free()
        else:
            self._lib.ncclMemFree(ptr)


def _nccl_error(lib, rc: int) -> str:
    import ctypes

    try:
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        return f"{lib.ncclGetErrorString(rc).decode()} (ncclResult {rc})"
    except Exception:
        return f"ncclResult {rc}"


class _Rank:
    """A rank in this process: its communicator, GPU, stream and two buffers of the largest size
    (NcclBuffer: ncclMemAlloc, as nccl-tests)."""

    def __init__(self, rank: int, device: int, comm, maxbytes: int):
        import cupy

        self.rank = rank
        self.device = device
        self.comm = comm
        self.aborted = False
        with cupy.cuda.Device(device):
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self.send = NcclBuffer(maxbytes)
            try:
                self.recv = NcclBuffer(maxbytes)
            except BaseException:
                self.send.free()
                raise

    def free(self) -> None:
        import cupy

        with cupy.cuda.Device(self.device):
            self.send.free()
            self.recv.free()


# -- data: the values each rank sends, and what every rank must receive --------------------------


def _values(xp, p, k, op_name: str):
    """The value rank(s) ``p`` send at element index(es) ``k``: small integers, exact in every type.

    ``(k + 3p) mod 7 + 1`` (1..7); for prod ``1 + (k + p) mod 2`` (1 or 2) so products stay exact.
    """
    if op_name == "prod":
        return 1 + (k + p) % 2
    return (k + 3 * p) % 7 + 1


def _reduce(xp, stack, op_name: str, nranks: int, kind: str):
    if op_name in ("sum", "avg"):
        s = stack.sum(axis=0)
        if op_name == "avg":
            s = s // nranks if kind != "float" else s / nranks
        return s
    if op_name == "prod":
        return stack.prod(axis=0)
    if op_name == "max":
        return stack.max(axis=0)
    return stack.min(axis=0)


def expected_values(xp, coll: C.Collective, rank: int, nranks: int, root: int, base: int, idx, op_name: str,
                    kind: str):
    """What rank ``rank`` must hold at output element indices ``idx`` (int64 array of ``xp``).

    Args:
        xp: numpy or cupy.
        coll: the collective.
        base: the per-rank count (param_count) of the call.
        idx: output indices, int64.
        op_name: reduction op name; kind: "int", "uint" or "float".

    Returns:
        int64 (integer kinds) or float64 values (before conversion to the data type).
    """
    idx = idx.astype(xp.int64)
    ftype = xp.float64 if kind == "float" else xp.int64
    name = coll.name
    if name == "broadcast":
        return _values(xp, root, idx, op_name).astype(ftype)
    if name == "send-recv":
        return _values(xp, (rank - 1) % nranks, idx, op_name).astype(ftype)
    if name == "all-gather":
        return _values(xp, idx // base, idx % base, op_name).astype(ftype)
    if name == "all-to-all":
        return _values(xp, idx // base, rank * base + idx % base, op_name).astype(ftype)
    src_idx = rank * base + idx if name == "reduce-scatter" else idx
    stack = xp.stack([_values(xp, p, src_idx, op_name).astype(ftype) for p in range(nranks)])
    return _reduce(xp, stack, op_name, nranks, kind)


def encode(xp, values, dt: C.DType):
    """Values (int64/float64) -> the storage array of ``dt`` (bfloat16: the high 16 bits of float32)."""
    if dt.name == "bfloat16":
        f = values.astype(xp.float32)
        return (f.view(xp.uint32) >> 16).astype(xp.uint16)
    return values.astype(dt.numpy)


def decode(xp, stored, dt: C.DType):
    """Storage array of ``dt`` -> float64 (float kinds) or the storage itself (integer kinds)."""
    if dt.name == "bfloat16":
        return (stored.astype(xp.uint32) << 16).view(xp.float32).astype(xp.float64)
    if dt.kind == "float":
        return stored.astype(xp.float64)
    return stored


def count_wrong(xp, got_stored, expected, dt: C.DType) -> int:
    """Elements of ``got_stored`` that differ from ``expected`` (exact for integers; a relative
    tolerance of the type's precision for floats, since avg divides)."""
    if dt.kind == "float":
        got = decode(xp, got_stored, dt)
        tol = _TOLERANCE[dt.name]
        bad = xp.abs(got - expected) > tol * xp.maximum(1.0, xp.abs(expected))
        return int(bad.sum())
    return int((got_stored != encode(xp, expected, dt)).sum())


def _view(ptr: int, nelems: int, dt: C.DType, device: int):
    import cupy

    itemsize = cupy.dtype(dt.numpy).itemsize
    mem = cupy.cuda.UnownedMemory(ptr, max(1, nelems * itemsize), None, device)
    return cupy.ndarray((nelems,), dtype=dt.numpy, memptr=cupy.cuda.MemoryPointer(mem, 0))


def _pointers(rk: _Rank, cc: C.CollCounts, elt: int, in_place: bool, shift: int) -> tuple[int, int]:
    """(send, recv) addresses of rank ``rk`` for one call (nccl-tests startColl)."""
    if in_place:
        base = rk.recv.ptr + shift
        return base + cc.send_inplace_offset * rk.rank * elt, base + cc.recv_inplace_offset * rk.rank * elt
    return rk.send.ptr + shift, rk.recv.ptr + shift


def _init_data(ranks: list[_Rank], coll, cc: C.CollCounts, dt: C.DType, op_name: str, in_place: bool,
               nranks: int) -> None:
    """Fill each rank's input region with its values and zero its output (nccl-tests InitData)."""
    import cupy

    elt = dt.size
    for rk in ranks:
        with cupy.cuda.Device(rk.device):
            cupy.cuda.runtime.memset(rk.recv.ptr, 0, max(cc.recv_count, cc.send_count) * elt)
            sptr, _ = _pointers(rk, cc, elt, in_place, 0)
            for start in range(0, cc.send_count, CHECK_CHUNK):
                n = min(CHECK_CHUNK, cc.send_count - start)
                k = cupy.arange(start, start + n, dtype=cupy.int64)
                vals = _values(cupy, rk.rank, k, op_name).astype(cupy.float64 if dt.kind == "float" else cupy.int64)
                _view(sptr + start * elt, n, dt, rk.device)[...] = encode(cupy, vals, dt)
            cupy.cuda.Device().synchronize()


def _check(ranks: list[_Rank], coll, cc: C.CollCounts, dt: C.DType, op_name: str, in_place: bool,
           nranks: int, root: int) -> int:
    """Wrong elements on this process's ranks after one call (nccl-tests CheckData)."""
    import cupy

    elt = dt.size
    wrong = 0
    for rk in ranks:
        if coll.name == "reduce" and rk.rank != root:
            continue  # only the root holds a result
        _, rptr = _pointers(rk, cc, elt, in_place, 0)
        with cupy.cuda.Device(rk.device):
            for start in range(0, cc.recv_count, CHECK_CHUNK):
                n = min(CHECK_CHUNK, cc.recv_count - start)
                idx = cupy.arange(start, start + n, dtype=cupy.int64)
                exp = expected_values(cupy, coll, rk.rank, nranks, root, cc.param_count, idx, op_name, dt.kind)
                wrong += count_wrong(cupy, _view(rptr + start * elt, n, dt, rk.device), exp, dt)
    return wrong


# -- launching and waiting ---------------------------------------------------------------------------


def _calls(ranks: list[_Rank], coll, cc: C.CollCounts, dt: C.DType, op_id: int, root: int, in_place: bool,
           shift: int, nranks: int) -> list[tuple[Callable, tuple]]:
    """The NCCL calls of one iteration on every local rank (nccl-tests startColl), as (function,
    arguments) pairs, grouped between ncclGroupStart/ncclGroupEnd when there are several local
    ranks (nccl-tests -g N). Built once per buffer shift, so that an iteration is only these calls."""
    from cupy.cuda import nccl

    elt = dt.size
    count = cc.param_count
    name = coll.name
    out: list[tuple[Callable, tuple]] = []
    grouped = len(ranks) > 1
    if grouped:
        out.append((nccl.groupStart, ()))
    for rk in ranks:
        s, r = _pointers(rk, cc, elt, in_place, shift)
        st = rk.stream.ptr
        c = rk.comm
        if name == "all-reduce":
            out.append((c.allReduce, (s, r, count, dt.nccl, op_id, st)))
        elif name == "all-gather":
            out.append((c.allGather, (s, r, count, dt.nccl, st)))
        elif name == "reduce-scatter":
            out.append((c.reduceScatter, (s, r, count, dt.nccl, op_id, st)))
        elif name == "broadcast":
            out.append((c.broadcast, (s, r, count, dt.nccl, root, st)))
        elif name == "reduce":
            out.append((c.reduce, (s, r, count, dt.nccl, op_id, root, st)))
        elif name == "all-to-all":  # nccl-tests alltoall.cu before NCCL 2.28: grouped send/recv
            out.append((nccl.groupStart, ()))
            for p in range(nranks):
                out.append((c.send, (s + p * count * elt, count, dt.nccl, p, st)))
                out.append((c.recv, (r + p * count * elt, count, dt.nccl, p, st)))
            out.append((nccl.groupEnd, ()))
        elif name == "send-recv":  # sendrecv.cu: send to rank+1, receive from rank-1
            out.append((nccl.groupStart, ()))
            out.append((c.send, (s, count, dt.nccl, (rk.rank + 1) % nranks, st)))
            out.append((c.recv, (r, count, dt.nccl, (rk.rank - 1) % nranks, st)))
            out.append((nccl.groupEnd, ()))
        else:  # pragma: no cover - the table and this switch are kept together
            raise UsageError(f"collective {name!r} not known")
    if grouped:
        out.append((nccl.groupEnd, ()))
    return out


_MAX_PLANS = 4096


def _launcher(ranks: list[_Rank], coll, cc: C.CollCounts, dt: C.DType, op_id: int, root: int, in_place: bool,
              nranks: int, total: int, maxbytes: int, iters: int) -> Callable[[int], None]:
    """``launch(it)``: iteration ``it``'s calls, its buffers moved by one operation size per
    iteration (nccl-tests' shift). The call lists of iterations 0..iters-1 are built here, before
    any timing, up to _MAX_PLANS distinct shifts (tiny sizes in large buffers have millions);
    past that a call list is built at each use."""
    plans: dict[int, list[tuple[Callable, tuple]]] = {}
    for it in range(min(iters, _MAX_PLANS)):
        shift = _shift(it, total, maxbytes)
        if shift not in plans:
            plans[shift] = _calls(ranks, coll, cc, dt, op_id, root, in_place, shift, nranks)

    def launch(it: int) -> None:
        shift = _shift(it, total, maxbytes)
        calls = plans.get(shift)
        if calls is None:
            calls = _calls(ranks, coll, cc, dt, op_id, root, in_place, shift, nranks)
            if len(plans) < _MAX_PLANS:
                plans[shift] = calls
        with CRITICAL:  # a Ctrl-C between ncclGroupStart and ncclGroupEnd would leave the group open
            for fn, args in calls:
                fn(*args)

    return launch


def wait_all(ranks: list[_Rank], timeout_s: float, events: list | None = None) -> None:
    """Wait for every rank's stream (or, given ``events``, one CUDA event per rank), polling as
    nccl-tests' testStreamSynchronize does, so that the wait has a deadline.

    The poll spins without yielding (cudaStreamQuery releases the GIL, so other Python threads
    still run). nccl-tests yields (std::this_thread::yield) between passes; from Python neither
    time.sleep(0) (a nanosleep, rounded up by Linux's 50 us timer slack) nor os.sched_yield kept up:
    on the 2x H200 each added 40-80 us to a timed sample of -n 20, 0.5-2 % at 64 MiB, where a
    spin matched nccl-tests (probe in the issue-4 notes).

    Raises:
        MachineError: an asynchronous NCCL error, or ``timeout_s`` (> 0) passed; the communicators
            are aborted first, as nccl-tests does.
    """
    t0 = time.perf_counter()
    last_check = t0
    waits = list(zip(ranks, events)) if events is not None else [(rk, rk.stream) for rk in ranks]
    pending = waits
    while pending:
        pending = [(rk, w) for rk, w in pending if not w.done]
        if not pending:
            return
        now = time.perf_counter()
        if now - last_check > 0.01:
            last_check = now
            for rk, _ in pending:
                try:
                    rk.comm.check_async_error()
                except Exception as e:
                    _abort(ranks)
                    raise MachineError(f"NCCL reported an error on rank {rk.rank}: {str(e).splitlines()[0]}") from None
            if timeout_s and now - t0 > timeout_s:
                _abort(ranks)
                raise MachineError(f"NCCL operation did not finish within --timeout {timeout_s:g} s; "
                                   "communicators aborted")


# At most this many iterations are queued ahead of the GPU. Past CUDA's launch-queue depth a launch
# blocks the host inside the driver, where no deadline can reach it: a rank whose peer died would
# then hang in a launch instead of timing out in wait_all.
MAX_QUEUED = 256
_MARK_EVERY = 32  # an event is recorded on each stream every this many iterations


def queue_bounds(n: int, per_launch: int = 1) -> tuple[bool, int, int]:
    """How run_iters bounds the launch queue for ``n`` launches of ``per_launch`` iterations each:
    (bounded, launches between events, events allowed in flight). In flight stay at most
    max(MAX_QUEUED, per_launch) iterations beyond the ones the oldest awaited event covers."""
    every = max(1, _MARK_EVERY // per_launch)
    window = max(1, MAX_QUEUED // (every * per_launch))
    return n * per_launch > MAX_QUEUED + _MARK_EVERY, every, window


def run_iters(ranks: list[_Rank], n: int, launch: Callable[[int], None], timeout_s: float,
              per_launch: int = 1) -> None:
    """Queue ``launch(0..n-1)`` with at most about MAX_QUEUED iterations in flight, without waiting
    for the last ones (the caller's wait_all does). ``per_launch`` is the iterations one launch
    queues (``iters`` for a CUDA graph of them, else 1).

    While n * per_launch <= MAX_QUEUED + _MARK_EVERY, nothing but the launches happens; past that,
    an event recorded every _MARK_EVERY iterations (at least every launch) is waited for (with the
    deadline) once MAX_QUEUED newer iterations are queued behind it (at least one launch), which
    leaves the GPU a full queue and keeps the host's launch loop out of its timing.
    """
    import cupy

    bounded, every, window = queue_bounds(n, per_launch)
    marks: list[list] = []
    for it in range(n):
        if bounded and it and it % every == 0:
            evs = []
            for rk in ranks:
                with cupy.cuda.Device(rk.device):
                    ev = cupy.cuda.Event(block=False, disable_timing=True)
                    ev.record(rk.stream)
                evs.append(ev)
            marks.append(evs)
            if len(marks) > window:
                wait_all(ranks, timeout_s, events=marks.pop(0))
        launch(it)


class CapturedGraphs:
    """One CUDA graph per local rank's stream, captured from the NCCL calls ``issue()`` makes
    (nccl-tests BenchTime with -G; CUDA programming guide, "Creating a Graph Using Stream Capture").

    Two steps, so that the caller holds the object before any CUDA work and its ``finally`` can
    always :meth:`close` it: ``g = CapturedGraphs()`` then ``g.capture(ranks, issue)``.

    :meth:`capture`: every rank's stream begins capture (cudaStreamCaptureModeThreadLocal, as
    nccl-tests), ``issue()`` queues the calls, every capture ends, and only then is each graph
    instantiated and uploaded to its stream (so the timed samples measure the graph, not its first
    upload; nccl-tests does not upload and times one sample that includes it). The order matters:
    instantiating while another stream of this thread is still capturing fails with
    cudaErrorStreamCaptureUnsupported, which CuPy's Stream.end_capture (end and instantiate, one
    stream at a time) runs into with two GPUs.

    The executable graphs hold NCCL resources that ncclCommDestroy waits for, so :meth:`close` must
    run before the communicators are destroyed (a process that left them alive hung at exit on the
    2x H200). Destroying a graph that is still running is allowed: CUDA frees it when it completes.
    Each runtime call and the bookkeeping of what it made are one critical section (core.errors
    CRITICAL), so a Ctrl-C cannot land between a graph's creation and its being recorded for close.
    """

    def __init__(self, runtime=None):
        """``runtime``: CuPy's CUDA runtime module (cupy.cuda.runtime) unless given (the CPU tests
        pass a recorder of the calls)."""
        if runtime is None:
            from cupy.cuda import runtime

        self._rt = runtime
        self.launches: list[tuple[int, int, int]] = []  # (device, graph exec, stream) per rank

    def capture(self, ranks: list[_Rank], issue: Callable[[], None]) -> None:
        """Capture ``issue()``'s calls on every rank's stream (``ranks``: objects with ``device``
        and ``stream.ptr``) into one instantiated, uploaded graph per rank.

        Raises:
            MachineError: a capture was invalidated or a graph could not be instantiated.
            Whatever ``issue()`` or the runtime raised (an NcclError, a CUDARuntimeError,
            KeyboardInterrupt), after every capture was ended and every cudaGraph_t destroyed;
            executable graphs made so far stay in ``launches`` for :meth:`close`.
        """
        rt = self._rt
        prev = rt.getDevice()
        capturing: list[_Rank] = []
        graphs: list[tuple[_Rank, int]] = []
        failure: BaseException | None = None
        try:
            try:
                for rk in ranks:
                    with CRITICAL:
                        rt.setDevice(rk.device)
                        rt.streamBeginCapture(rk.stream.ptr, rt.streamCaptureModeThreadLocal)
                        capturing.append(rk)
                issue()
            except BaseException as e:
                failure = e
            with CRITICAL:  # every capture ends, whatever happened inside it, Ctrl-C included
                for rk in capturing:
                    rt.setDevice(rk.device)
                    try:
                        graphs.append((rk, rt.streamEndCapture(rk.stream.ptr)))
                    except Exception as e:
                        failure = failure or MachineError(
                            f"CUDA-graph capture on GPU {rk.device} failed: {str(e).splitlines()[0]}")
            if failure is None:
                for rk, g in graphs:
                    with CRITICAL:
                        rt.setDevice(rk.device)
                        try:
                            ex = rt.graphInstantiate(g)
                        except Exception as e:
                            failure = MachineError(f"instantiating the CUDA graph of GPU {rk.device} failed: "
                                                   f"{str(e).splitlines()[0]}")
                            break
                        self.launches.append((rk.device, ex, rk.stream.ptr))
                    rt.graphUpload(ex, rk.stream.ptr)
        finally:
            with CRITICAL:  # an executable graph keeps what it needs of its graph
                for _, g in graphs:
                    try:
                        rt.graphDestroy(g)
                    except Exception:
                        pass
                rt.setDevice(prev)
        if failure is not None:
            raise failure

    def launch(self, _k: int = 0) -> None:
        """Launch every rank's graph on its stream (cudaGraphLaunch; asynchronous)."""
        rt = self._rt
        prev = rt.getDevice()
        with CRITICAL:  # one rank's graph launched without its peer's would wait for it for ever
            for dev, ex, stream in self.launches:
                rt.setDevice(dev)
                rt.graphLaunch(ex, stream)
            rt.setDevice(prev)

    def close(self) -> None:
        """Destroy the executable graphs (idempotent; a signal arriving meanwhile is raised after)."""
        with CRITICAL:
            while self.launches:
                _, ex, _ = self.launches.pop()
                try:
                    self._rt.graphExecDestroy(ex)
                except Exception:
                    pass


def _abort(ranks: list[_Rank]) -> None:
    """ncclCommAbort each rank's communicator once (its kernels quit; the communicator is gone)."""
    for rk in ranks:
        if rk.aborted:
            continue
        rk.aborted = True
        try:
            rk.comm.abort()
        except Exception:
            pass


def _shift(it: int, total_bytes: int, maxbytes: int) -> int:
    """nccl-tests startColl: each iteration moves by one operation size, wrapping inside the buffers."""
    steps = maxbytes // total_bytes if total_bytes else 1
    return total_bytes * (it % max(1, steps))


def _timed_samples(spec: NcclSpec, ranks: list[_Rank], one: Callable[[int], None],
                   barrier: Callable[[], None]) -> list[float]:
    """spec.samples per-iteration times in seconds: span / iters, or with -G G the iterations
    captured into graphs once and each sample G graph launches, span / (iters * G) (nccl-tests
    BenchTime)."""
    graphs = CapturedGraphs() if spec.cuda_graph else None
    try:
        if graphs is not None:
            graphs.capture(ranks, lambda: [one(it) for it in range(spec.iters)])
            n, per_launch, launch = spec.cuda_graph, spec.iters, graphs.launch
        else:
            n, per_launch, launch = spec.iters, 1, one
        samples = []
        for _ in range(spec.samples):
            barrier()
            t0 = time.perf_counter()
            run_iters(ranks, n, launch, spec.timeout_s, per_launch)
            wait_all(ranks, spec.timeout_s)
            samples.append((time.perf_counter() - t0) / (n * per_launch))
        return samples
    finally:
        if graphs is not None:
            graphs.close()


def _checked_call(spec: NcclSpec, ranks: list[_Rank], one: Callable[[int], None]) -> None:
    """The call whose output is checked, run to completion: launched directly, or with -G captured
    into a graph of one iteration and launched, as nccl-tests checks in graph mode."""
    if not spec.cuda_graph:
        one(0)
        wait_all(ranks, spec.timeout_s)
        return
    graphs = CapturedGraphs()
    try:
        graphs.capture(ranks, lambda: one(0))
        graphs.launch()
        wait_all(ranks, spec.timeout_s)
    finally:
        graphs.close()


DRAIN_S = 10.0


def drain(ranks: list[_Rank], timeout_s: float) -> None:
    """After an interrupt or a fault: let the queued work finish (at most DRAIN_S seconds, or -T if
    shorter) before graphs, buffers and communicators are freed under it; past that the
    communicators are aborted (wait_all does), which stops NCCL's kernels. Never raises (a second
    Ctrl-C meanwhile is noted and ignored by the CLI's handler)."""
    if all(rk.aborted for rk in ranks):
        return
    try:
        wait_all(ranks, min(DRAIN_S, timeout_s) if timeout_s else DRAIN_S)
    except BaseException:
        pass


def measure_points(spec: NcclSpec, ranks: list[_Rank], nranks: int, barrier: Callable[[], None],
                   progress: ProgressSink, on_point: Callable[[Point], None] | None = None) -> list[Point]:
    """Measure every (size, placement) of ``spec`` on this process's ``ranks``.

    Args:
        ranks: the local ranks (all of them in one process, or one per Dask worker).
        nranks: ranks in the communicator.
        barrier: called before each timed sample (a no-op in one process; an NCCL barrier across
            processes, as nccl-tests' Barrier).

    Returns:
        One Point per (size, placement), in order.

    Raises:
        whatever a point raised (MachineError, KeyboardInterrupt, ...), after :func:`drain`.
    """
    coll = C.collective(spec.collective)
    dt = C.dtype(spec.dtype)
    op_id = C.op(spec.op)
    maxbytes = max(spec.sizes)
    points: list[Point] = []
    try:
        for size in spec.sizes:
            cc = C.counts(coll, size, dt.size, nranks)
            total = max(cc.send_count, cc.recv_count) * dt.size
            for place in spec.places:
                progress.advance(f"{coll.name} {format_size(size)} {place}")
                in_place = place == "in-place"
                if cc.param_count == 0:
                    points.append(Point(total, 0, place, [], None,
                                        error=f"{format_size(size)} gives 0 elements per rank for {nranks} ranks"))
                    continue

                one = _launcher(ranks, coll, cc, dt, op_id, spec.root, in_place, nranks, total, maxbytes,
                                max(spec.iters, spec.warmup, 1))

                # never time on uninitialised memory: the inputs hold the check's values (nccl-tests
                # initialises before timing when it checks)
                _init_data(ranks, coll, cc, dt, spec.op, in_place, nranks)
                run_iters(ranks, spec.warmup, one, spec.timeout_s)
                wait_all(ranks, spec.timeout_s)
                one(0)  # nccl-tests BenchTime's "Sync" call
                wait_all(ranks, spec.timeout_s)
                samples = _timed_samples(spec, ranks, one, barrier)
                wrong = None
                # nccl-tests does not check in-place all-to-all and send/recv ("We don't support in-place
                # alltoall/sendrecv": the send and receive regions overlap), and prints N/A for them.
                if spec.check and not (in_place and coll.name in UNCHECKED_IN_PLACE):
                    wrong = 0
                    for _ in range(spec.check):
                        _init_data(ranks, coll, cc, dt, spec.op, in_place, nranks)
                        barrier()
                        _checked_call(spec, ranks, one)
                        wrong += _check(ranks, coll, cc, dt, spec.op, in_place, nranks, spec.root)
                        if wrong:
                            break
                p = Point(total, cc.param_count, place, samples, wrong)
                points.append(p)
                if on_point:
                    on_point(p)
    except BaseException:  # an interrupt or a fault: nothing is freed under queued work
        drain(ranks, spec.timeout_s)
        raise
    return points


# -- results -------------------------------------------------------------------------------------------


def to_records(spec: NcclSpec, points: list[Point], nranks: int) -> list[Record]:
    """Records from points: metric bandwidth with nbytes = S of algbw = S / t; busbw in extra."""
    coll = C.collective(spec.collective)
    dt = C.dtype(spec.dtype)
    factor = C.busbw_factor(coll, nranks)
    out = []
    for p in points:
        params: dict[str, Any] = {"collective": coll.name, "nbytes": p.nbytes, "dtype": dt.name,
                                  "placement": p.place, "nranks": nranks}
        if coll.reduces:
            params["op"] = spec.op
        if coll.rooted:
            params["root"] = spec.root
        s_bytes = C.algbw_bytes(coll, p.count, dt.size, nranks)
        r = Record(params=params, metric="bandwidth", nbytes=s_bytes, samples_s=list(p.samples_s),
                   reps=spec.iters * (spec.cuda_graph or 1), error=p.error)
        extra: dict[str, Any] = {"count": p.count, "busbw_factor": factor, "wrong": p.wrong,
                                 "busbw_formula": f"algbw * {coll.factor_text}"}
        if p.samples_s and s_bytes:
            med = r.time_summary().median
            alg, bus = C.bandwidths(coll, p.count, dt.size, med, nranks)
            extra.update({"time_s": med, "algbw_bytes_per_s": alg, "busbw_bytes_per_s": bus})
        r.extra = extra
        out.append(r)
    return out


def select_devices(spec: NcclSpec) -> tuple[int, ...]:
    """-d checked against the visible GPUs, or every visible GPU; the root must be one of the ranks.

    Raises:
        NoGPUError / UsageError.
    """
    gpu.require_gpu()
    devices = gpu.resolve_devices(spec.devices) if spec.devices is not None else tuple(range(gpu.device_count()))
    _check_root(spec, len(devices))
    return devices


def _check_root(spec: NcclSpec, nranks: int) -> None:
    coll = C.collective(spec.collective)
    if coll.rooted and spec.root >= nranks:
        raise UsageError(f"root {spec.root} is not a rank: {nranks} rank(s)", f"use -r 0..{nranks - 1}")


def _nccl():
    """cupy.cuda.nccl, or a one-line error saying how to get NCCL."""
    try:
        from cupy.cuda import nccl
    except Exception as e:  # pragma: no cover - depends on the install
        raise UsageError(f"CuPy's NCCL bindings are not importable ({type(e).__name__})",
                         "pip install 'gpubench-cuda[cuda13]' (or [cuda12]): it brings nvidia-nccl-cu13") from None
    if not getattr(nccl, "available", True) or not hasattr(nccl, "NcclCommunicator"):
        raise UsageError("NCCL is not available to CuPy (libnccl.so.2 not found)",
                         "pip install 'gpubench-cuda[cuda13]' (or [cuda12]): it brings nvidia-nccl-cu13")
    return nccl


def preflight(spec: NcclSpec, devices: tuple[int, ...]) -> None:
    """Two buffers of the largest size per GPU must fit.

    Raises:
        UsageError: they do not; the message says which -e would.
    """
    need = 2 * max(spec.sizes)
    margin = 1024 * 2**20  # NCCL's own buffers and the CUDA context
    for d in devices:
        free, _ = gpu.device_free_bytes(d)
        if need + margin > free:
            raise UsageError(f"-e {format_size(max(spec.sizes))} needs {format_size(need)} on GPU {d}, which has "
                             f"{format_size(free)} free", f"use -e {format_size(max(0, free - margin) // 2)} or less")


def _timing(spec: NcclSpec, allocator: str | None = None) -> dict:
    return {
        "buffers": allocator,
        "clock": "perf_counter",
        "method": ("nccl-tests BenchTime: host clock around "
                   + (f"{spec.cuda_graph} launches of per-rank CUDA graphs of iters grouped iterations"
                      if spec.cuda_graph else "iters grouped launches")
                   + " and the wait for every rank's stream; per-iteration time = span / "
                   + ("(iters * cuda_graph)" if spec.cuda_graph else "iters")
                   + "; buffers shifted by one size per iteration; median over samples; averaged over processes"),
        "warmup": spec.warmup, "iters": spec.iters, "samples": spec.samples, "cuda_graph": spec.cuda_graph,
    }


def _nccl_env(nccl_mod) -> dict:
    import os

    try:
        version = nccl_mod.get_version()
    except Exception:
        version = None
    return {"version": version,
            "env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}}


def run(spec: NcclSpec, progress: ProgressSink | None = None) -> Result:
    """Run the sweep in this process (one communicator per selected GPU) or on a Dask cluster.

    Returns:
        A Result with one record per (size, placement); see :func:`to_records`.

    Raises:
        NoGPUError / UsageError: no GPU, a GPU not visible, a root that is not a rank, NCCL missing,
            the sizes do not fit.
        MachineError: an NCCL or CUDA fault, or --timeout passed.
    """
    if spec.distributed:
        return run_on_dask(spec, progress)
    cupy = gpu.require_gpu()  # a missing CuPy is a setup problem (exit 2), not a fault

    progress = progress or ProgressSink()
    devices = select_devices(spec)
    nccl = _nccl()
    preflight(spec, devices)
    env = envmod.capture()
    try:
        comms = nccl.NcclCommunicator.initAll(list(devices))
    except Exception as e:
        raise MachineError(f"ncclCommInitAll on GPUs {list(devices)} failed: {str(e).splitlines()[0]}") from None
    ranks: list[_Rank] = []
    points: list[Point] = []
    interrupted = None
    progress.start(len(spec.sizes) * len(spec.places), spec.collective)
    try:
        for r, (d, c) in enumerate(zip(devices, comms)):
            ranks.append(_Rank(r, d, c, max(spec.sizes)))
        measure_points(spec, ranks, len(devices), lambda: None, progress, on_point=points.append)
    except KeyboardInterrupt:
        interrupted = "SIGINT"
    except Interrupted as e:
        interrupted = signal.Signals(e.signum).name
    except cupy.cuda.runtime.CUDARuntimeError as e:
        raise gpu.machine_error("NCCL run", e) from None
    except Exception as e:
        if type(e).__name__ == "NcclError":
            raise MachineError(f"NCCL call failed: {str(e).splitlines()[0]}") from None
        raise
    finally:
        progress.done()
        for rk in ranks:
            try:
                rk.free()
            except Exception:
                pass
        for c in comms:
            try:
                c.destroy()
            except Exception:
                pass
    return Result(
        command="nccl",
        spec={**spec.to_dict(), "devices": list(devices), "nranks": len(devices)},
        timing=_timing(spec, ranks[0].send.allocator if ranks else None),
        env={**env, "nccl": _nccl_env(nccl)},
        records=to_records(spec, points, len(devices)),
        partial=interrupted is not None,
        interrupted_by=interrupted,
    )


# -- across nodes: one rank per worker of an existing Dask cluster --------------------------------------


def _worker_unique_id():
    from cupy.cuda import nccl

    return nccl.get_unique_id()


def _worker_run(spec: NcclSpec, uid: tuple, rank: int, nranks: int, topic: str) -> dict:
    """Runs on a Dask worker: one rank on the worker's current GPU; returns its points as dicts.

    After the communicator is up and after each point it logs an event on ``topic`` (rank, points
    done), which the client watches to name a rank that stopped answering.
    """
    import socket

    import cupy
    from cupy.cuda import nccl
    from distributed import get_worker

    worker = get_worker()

    def tell(done: int) -> None:
        worker.log_event(topic, {"rank": rank, "points": done})

    device = cupy.cuda.Device().id
    comm = nccl.NcclCommunicator(nranks, uid, rank)
    tell(0)
    rk = _Rank(rank, device, comm, max(spec.sizes))
    flag = cupy.zeros(1, dtype=cupy.float32)
    done: list[Point] = []

    def barrier():
        comm.allReduce(flag.data.ptr, flag.data.ptr, 1, C.DTYPES["float"].nccl, C.OPS["sum"], rk.stream.ptr)
        wait_all([rk], spec.timeout_s)

    def on_point(p: Point) -> None:
        done.append(p)
        tell(len(done))

    try:
        points = measure_points(spec, [rk], nranks, barrier, ProgressSink(), on_point=on_point)
    except BaseException:
        _abort([rk])  # a peer left or timed out: the communicator cannot be destroyed cleanly
        raise
    finally:
        rk.free()
    comm.destroy()
    return {"rank": rank, "host": socket.gethostname(), "device": device, "allocator": rk.send.allocator,
            "nccl": _nccl_env(nccl), "points": [asdict(p) for p in points]}


class StallWatch:
    """Names the rank whose progress stopped: each rank logs (rank, points done) as it goes; if no
    rank has logged anything new for ``timeout_s``, the ranks with the fewest points are the ones
    the others wait for.

    ``events`` is a callable returning [(time, {"rank": r, "points": n}), ...] (``client.get_events``).
    """

    def __init__(self, events: Callable[[], Any], workers: list[str], timeout_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.events, self.workers, self.timeout_s, self.clock = events, workers, timeout_s, clock
        self.progress = {r: -1 for r in range(len(workers))}  # -1: communicator not up yet
        self.last_change = clock()

    def __call__(self) -> None:
        """Raises MachineError when nothing moved for timeout_s, naming the lagging ranks."""
        changed = False
        for _t, msg in self.events():
            r, n = msg.get("rank"), msg.get("points", -1)
            if r in self.progress and n > self.progress[r]:
                self.progress[r] = n
                changed = True
        now = self.clock()
        if changed:
            self.last_change = now
            return
        if self.timeout_s and now - self.last_change > self.timeout_s:
            low = min(self.progress.values())
            lag = [r for r, n in self.progress.items() if n == low]
            where = "before the communicator was up" if low < 0 else f"after {low} point(s)"
            names = ", ".join(f"rank {r} ({self.workers[r]})" for r in lag)
            raise MachineError(f"{names} stopped answering {where}: nothing moved for --timeout "
                               f"{self.timeout_s:g} s", "the rank's worker log says why; raise -T for a slow link")


def combine_ranks(per_rank: list[list[dict]]) -> list[Point]:
    """Points of every rank -> one list: per-sample times averaged over ranks (nccl-tests ``-a 1``),
    wrong counts summed (a rank's None counts as unchecked)."""
    out = []
    for pts in zip(*per_rank):
        first = pts[0]
        samples = [sum(p["samples_s"][k] for p in pts) / len(pts) for k in range(len(first["samples_s"]))]
        wrongs = [p["wrong"] for p in pts]
        wrong = None if any(w is None for w in wrongs) else sum(wrongs)
        err = next((p["error"] for p in pts if p.get("error")), None)
        out.append(Point(first["nbytes"], first["count"], first["place"], samples, wrong, err))
    return out


def connect_timeout(timeout_s: float) -> float:
    """Seconds to wait for the Dask scheduler: Dask's own distributed.comm.timeouts.connect (30 s
    unless configured, e.g. DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT=120s), or -T when that is
    shorter (0 = no -T)."""
    import dask.config
    from dask.utils import parse_timedelta

    dask_s = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), default="seconds")
    return min(dask_s, timeout_s) if timeout_s else dask_s


def run_on_dask(spec: NcclSpec, progress: ProgressSink | None = None) -> Result:
    """One rank per worker of an existing Dask cluster; the NCCL unique id comes from rank 0's worker
    through the scheduler. Workers use their current GPU (dask-cuda gives each worker one).

    Every wait is watched (core.scheduler.wait_watching): a worker that leaves the cluster, a rank
    whose task fails (a peer gone: its NCCL wait times out after -T and aborts the communicator), or
    no rank moving for -T seconds (StallWatch) ends the run with exit 3 naming the worker and rank.

    Raises:
        UsageError: dask.distributed not installed, the scheduler cannot be reached, no workers.
        MachineError: a worker failed, left or stalled.
    """
    progress = progress or ProgressSink()
    try:
        from distributed import Client
    except ImportError:
        raise UsageError("--scheduler-address/--scheduler-file need dask.distributed",
                         "pip install 'gpubench-cuda[dask]'") from None
    from gpubench.core.scheduler import check_scheduler_address, error_line, scheduler_file_address, wait_watching

    if spec.scheduler_address:
        check_scheduler_address(spec.scheduler_address)
    else:
        scheduler_file_address(spec.scheduler_file)  # distributed waits forever for a missing one
    try:
        connect = connect_timeout(spec.timeout_s)
        client = Client(spec.scheduler_address, timeout=connect) if spec.scheduler_address else \
            Client(scheduler_file=spec.scheduler_file, timeout=connect)
    except (OSError, ValueError) as e:
        where = spec.scheduler_address or spec.scheduler_file
        raise UsageError(f"cannot reach the Dask scheduler at {where!r}: {str(e).splitlines()[0]}") from None
    try:
        workers = sorted(client.scheduler_info()["workers"])
        if not workers:
            raise UsageError("the Dask cluster has no workers")
        nranks = len(workers)
        _check_root(spec, nranks)
        progress.start(1, f"{spec.collective} on {nranks} Dask workers")
        index = {w: r for r, w in enumerate(workers)}
        topic = f"gpubench-nccl-{uuid.uuid4().hex}"
        futures = []
        try:
            uid_f = client.submit(_worker_unique_id, workers=[workers[0]], pure=False)
            wait_watching(client, [uid_f], index, spec.timeout_s or 3600, "getting the NCCL unique id on rank 0",
                          hint="raise -T")
            uid = uid_f.result()
            futures = [client.submit(_worker_run, spec, uid, r, nranks, topic, workers=[w],
                                     allow_other_workers=False, pure=False) for r, w in enumerate(workers)]
            stall = StallWatch(lambda: client.get_events(topic), workers, spec.timeout_s)
            # no overall deadline: a run of many sizes may be long; StallWatch stops one that stalls
            wait_watching(client, futures, index, float("inf"), f"{spec.collective} on {nranks} Dask workers",
                          on_poll=stall)
            results = [f.result() for f in futures]
        except BaseException as e:
            for f in futures:
                f.cancel()
            if isinstance(e, (MachineError, UsageError, KeyboardInterrupt, Interrupted)) or \
                    not isinstance(e, Exception):
                raise
            raise MachineError(f"the Dask cluster failed during the run: {error_line(e)[:200]}") from None
        progress.advance()
        results.sort(key=lambda d: d["rank"])
        points = combine_ranks([d["points"] for d in results])
    finally:
        progress.done()
        client.close()
    env = envmod.capture()
    env["dask_workers"] = [{"address": w, "host": d["host"], "device": d["device"], "rank": d["rank"],
                            "nccl": d.get("nccl")} for w, d in zip(workers, results)]
    env["nccl"] = results[0].get("nccl")  # rank 0's NCCL version and NCCL_* variables; each worker's above
    return Result(
        command="nccl",
        spec={**spec.to_dict(), "nranks": nranks},
        timing=_timing(spec, results[0].get("allocator")),
        env=env,
        records=to_records(spec, points, nranks),
    )

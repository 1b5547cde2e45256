"""nccl's communicators and buffers: the ranks of this process (communicator, GPU, stream, two
buffers from ncclMemAlloc), waiting for them with a deadline, aborting them, and mapping CUDA and
NCCL faults to gpubench's errors. CuPy is imported inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Callable

from gpubench.core import gpu
from gpubench.plugins.nccl.collectives import DTYPES, OPS
from gpubench.core.errors import MachineError, UsageError, first_line
from gpubench.core.units import format_size


@functools.lru_cache(maxsize=None)
def _libnccl():
    """The NCCL library CuPy loaded (ctypes, found in /proc/self/maps, else by its soname), or None
    where none loads or it has no ncclMemAlloc (NCCL < 2.19)."""
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
        if not hasattr(lib, "ncclMemAlloc"):
            return None
        lib.ncclMemAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.ncclMemFree.argtypes = [ctypes.c_void_p]
        return lib
    return None


class NcclBuffer:
    """``nbytes`` of device memory on the current device from ncclMemAlloc (NCCL >= 2.19, as
    nccl-tests src/common.cu AllocateBuffs), else cudaMalloc; ``allocator`` says which.

    Raises:
        MachineError: ncclMemAlloc failed (its NCCL error string is in the message).
        CUDARuntimeError: cudaMalloc failed (the fallback).
    """

    def __init__(self, nbytes: int):
        import ctypes

        self._lib = _libnccl()
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


class Rank:
    """A rank in this process: its communicator, GPU, stream and two buffers of the largest size."""

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


def wait_all(ranks: list[Rank], timeout_s: float, events: list | None = None) -> None:
    """Wait for every rank's stream (or, given ``events``, one CUDA event per rank), polling without
    yielding as nccl-tests' testStreamSynchronize does, so that the wait has a deadline.

    Raises:
        MachineError: an asynchronous NCCL error, or ``timeout_s`` (> 0) passed; the communicators
            are aborted first, as nccl-tests does.
    """
    t0 = last_check = time.perf_counter()
    pending = list(zip(ranks, events)) if events is not None else [(rk, rk.stream) for rk in ranks]
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
                    abort(ranks)
                    raise MachineError(f"NCCL reported an error on rank {rk.rank}: {first_line(e)}") from None
            if timeout_s and now - t0 > timeout_s:
                abort(ranks)
                raise MachineError(f"NCCL operation did not finish within --timeout {timeout_s:g} s; "
                                   "communicators aborted")


def make_barrier(ranks: list[Rank], timeout_s: float) -> Callable[[], None]:
    """nccl-tests' Barrier across processes: a one-element float sum all-reduce on every rank, then
    :func:`wait_all`."""
    import cupy
    from cupy.cuda import nccl

    flags = []
    for rk in ranks:
        with cupy.cuda.Device(rk.device):
            flags.append(cupy.zeros(1, dtype=cupy.float32))

    def barrier() -> None:
        if len(ranks) > 1:
            nccl.groupStart()
        for rk, f in zip(ranks, flags):
            rk.comm.allReduce(f.data.ptr, f.data.ptr, 1, DTYPES["float"].nccl, OPS["sum"], rk.stream.ptr)
        if len(ranks) > 1:
            nccl.groupEnd()
        wait_all(ranks, timeout_s)

    return barrier


def abort(ranks: list[Rank]) -> None:
    """ncclCommAbort each rank's communicator once (its kernels quit; the communicator is gone)."""
    for rk in ranks:
        if rk.aborted:
            continue
        rk.aborted = True
        with contextlib.suppress(Exception):
            rk.comm.abort()


def nccl_module():
    """cupy.cuda.nccl, or a one-line error saying how to get NCCL."""
    hint = "pip install 'gpubench-cuda[cuda13]' (or [cuda12]): it brings nvidia-nccl-cu13"
    try:
        from cupy.cuda import nccl
    except Exception as e:  # pragma: no cover - depends on the install
        raise UsageError(f"CuPy's NCCL bindings are not importable ({type(e).__name__})", hint) from None
    if not getattr(nccl, "available", True) or not hasattr(nccl, "NcclCommunicator"):
        raise UsageError("NCCL is not available to CuPy (libnccl.so.2 not found)", hint)
    return nccl


def nccl_env(nccl_mod) -> dict:
    import os

    try:
        version = nccl_mod.get_version()
    except Exception:
        version = None
    return {"version": version,
            "env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}}


def as_machine_error(e: BaseException) -> MachineError | None:
    """The one-line MachineError for a CUDA runtime or NCCL fault ``e`` (exit 3), or None."""
    if type(e).__name__ == "NcclError":  # CuPy's
        return MachineError(f"NCCL call failed: {first_line(e)}")
    import cupy

    if isinstance(e, cupy.cuda.runtime.CUDARuntimeError):
        return gpu.machine_error("NCCL run", e)
    return None

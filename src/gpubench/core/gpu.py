"""CUDA helpers shared by GPU benchmarks: finding devices, host buffers of each kind, the spin gate.

CuPy is imported inside functions only, so importing this module costs nothing.
"""

from __future__ import annotations

import ctypes
from typing import Any

from gpubench.core import numa
from gpubench.core.errors import MachineError, NoGPUError, UsageError, first_line

# cudaMemcpyKind
H2D, D2H, D2D, DEFAULT = 1, 2, 3, 4
# cudaHostAlloc / cudaHostRegister flags (CUDA runtime API reference)
HOST_ALLOC_PORTABLE = 0x01
HOST_ALLOC_WRITE_COMBINED = 0x04
HOST_REGISTER_PORTABLE = 0x01

MEMORY_KINDS = ("pinned", "pageable", "write-combined", "registered")


def require_gpu() -> Any:
    """Import CuPy and check that at least one CUDA device is visible; return the cupy module. Raises NoGPUError: CuPy
    is missing, or the runtime sees no device (no driver, insufficient driver, CUDA_VISIBLE_DEVICES empty)."""
    try:
        import cupy
        from cupy.cuda import runtime
    except Exception as e:
        raise NoGPUError(f"CuPy is not importable: {type(e).__name__}; pip install 'gpubench-cuda[cuda13]' (or [cuda12])") from None
    try:
        n = runtime.getDeviceCount()
    except Exception as e:
        raise NoGPUError(no_driver_text(first_line(e))) from None
    if n < 1:
        raise NoGPUError("the CUDA runtime reports 0 devices")
    return cupy


def no_driver_text(text: str) -> str:
    """A CUDA runtime error line, or what it means where it says "insufficient driver" and the
    NVIDIA driver's user-space library (libcuda.so.1) cannot be loaded: no driver at all."""
    if "InsufficientDriver" not in text:
        return text
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no NVIDIA driver is installed: libcuda and NVML cannot be loaded"
    return text


def gpu_available() -> bool:
    """True when CuPy imports and the CUDA runtime sees at least one device (never raises)."""
    try:
        require_gpu()
    except NoGPUError:
        return False
    return True


def device_count() -> int:
    """Number of visible CUDA devices (after require_gpu)."""
    from cupy.cuda import runtime

    return runtime.getDeviceCount()


def resolve_devices(devices: tuple[int, ...] | None, *, minimum: int = 1) -> tuple[int, ...]:
    """Check requested ordinals against the visible devices; None means (0,). Raises NoGPUError: no device visible;
    UsageError: an ordinal >= the visible count, or fewer than ``minimum`` devices."""
    require_gpu()
    n = device_count()
    devs = devices if devices is not None else tuple(range(minimum)) if minimum > 1 else (0,)
    for d in devs:
        if d >= n:
            raise UsageError(f"device {d} is not visible: this machine shows {n} CUDA device(s)",
                             f"use ids 0..{n - 1}; CUDA_VISIBLE_DEVICES renumbers them")
    if len(devs) < minimum:
        raise UsageError(f"this needs {minimum} GPUs; {len(devs)} selected, {n} visible")
    return devs


def is_oom(e: BaseException) -> bool:
    """True when ``e`` is an allocation failure (device or pinned host) rather than a fault."""
    text = str(e)
    return (isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"
            or "cudaErrorMemoryAllocation" in text or "out of memory" in text.lower())


def machine_error(what: str, e: BaseException) -> MachineError:
    """Wrap a CUDA/CuPy exception into a one-line MachineError naming ``what`` failed."""
    return MachineError(f"{what} failed: {first_line(e)}")


def device_free_bytes(device: int) -> tuple[int, int]:
    """(free, total) device memory in bytes of CUDA device ``device`` (cudaMemGetInfo)."""
    import cupy

    with cupy.cuda.Device(device):
        return cupy.cuda.runtime.memGetInfo()


class HostBuffer:
    """``nbytes`` of host memory of one kind, with a numpy uint8 view and its address: "pinned" (cudaHostAlloc,
    portable), "write-combined" (cudaHostAllocWriteCombined), "pageable" (a numpy array), "registered" (a numpy array
    page-locked with cudaHostRegister). Raises MemoryError / CUDARuntimeError: the allocation or registration failed."""

    def __init__(self, nbytes: int, kind: str):
        import numpy as np
        from cupy.cuda import runtime

        self.nbytes = nbytes
        self.kind = kind
        self._runtime = runtime
        self._host_ptr = None
        self._registered = False
        if kind in ("pinned", "write-combined"):
            flags = HOST_ALLOC_PORTABLE | (HOST_ALLOC_WRITE_COMBINED if kind == "write-combined" else 0)
            self._host_ptr = runtime.hostAlloc(nbytes, flags)
            buf = (ctypes.c_uint8 * nbytes).from_address(self._host_ptr)
            # typeshed's ctypes.Array lacks the __buffer__ it has at runtime
            self.array = np.frombuffer(buf, dtype=np.uint8)  # type: ignore[call-overload]
            self.ptr = self._host_ptr
        elif kind in ("pageable", "registered"):
            self.array = np.empty(nbytes, dtype=np.uint8)
            self.ptr = self.array.ctypes.data
            if kind == "registered":
                runtime.hostRegister(self.ptr, nbytes, HOST_REGISTER_PORTABLE)
                self._registered = True
        else:
            raise UsageError(f"host memory kind {kind!r} not known", f"use one of {', '.join(MEMORY_KINDS)}")
        numa.track(self)  # the driver's placement log reads where its pages are (core/numa.py)

    def free(self) -> None:
        """Release the memory (unregister / cudaFreeHost). Safe to call twice."""
        if self.array is not None:
            numa.release(self)
        if self._registered:
            self._registered = False
            self._runtime.hostUnregister(self.ptr)
        self.array = None
        if self._host_ptr is not None:
            ptr, self._host_ptr = self._host_ptr, None
            self._runtime.freeHost(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()


class DeviceBuffer:
    """``nbytes`` of device memory on the current device through cudaMalloc (not CuPy's pool), freed with :meth:`free`,
    so a sweep returns each size's memory before the next. Raises CUDARuntimeError: cudaErrorMemoryAllocation when it
    does not fit."""

    def __init__(self, nbytes: int):
        from cupy.cuda import runtime

        self._runtime = runtime
        self.nbytes = nbytes
        self.ptr = runtime.malloc(nbytes)

    def free(self) -> None:
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            self._runtime.free(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()


_PATTERN_LEN = 1_048_573  # a prime, so the pattern does not line up with power-of-two sizes


def pattern(nbytes: int, seed: int = 0):
    """A deterministic pseudo-random uint8 numpy array of ``nbytes`` (never zeros only)."""
    import numpy as np

    return np.resize(Pattern(nbytes, seed).base, nbytes)


class Pattern:
    """The bytes of :func:`pattern` (``nbytes``, ``seed``) written and checked in chunks of about
    :data:`CHUNK_BYTES`, so a buffer under test is the only full-size copy in host memory. Byte ``i``
    is ``base[i % len(base)]``, ``base`` being the seeded random block."""

    CHUNK_BYTES = 64 * _PATTERN_LEN  # about 64 MiB, a whole number of periods

    def __init__(self, nbytes: int, seed: int = 0):
        import numpy as np

        self.nbytes = nbytes
        self.base = np.random.default_rng(seed).integers(0, 256, size=min(nbytes, _PATTERN_LEN), dtype=np.uint8)

    def chunks(self, nbytes: int | None = None):
        """(offset, bytes) of the first ``nbytes`` (default all), chunk by chunk (uint8 arrays)."""
        import numpy as np

        n = self.nbytes if nbytes is None else nbytes
        period = len(self.base)
        if period == 0:
            return
        step = max(period, (self.CHUNK_BYTES // period) * period)
        block = np.resize(self.base, min(step, n))
        for off in range(0, n, step):
            yield off, block[: min(step, n - off)]

    def fill(self, dst, invert: bool = False) -> None:
        """Write the pattern (or its complement, a poison the copy must overwrite) into the uint8
        array ``dst`` (its first ``len(dst)`` bytes)."""
        import numpy as np

        for off, c in self.chunks(len(dst)):
            if invert:
                np.invert(c, out=dst[off:off + len(c)])
            else:
                dst[off:off + len(c)] = c

    def matches(self, got) -> bool:
        """True when the uint8 array ``got`` holds the pattern's first ``len(got)`` bytes."""
        import numpy as np

        return all(np.array_equal(got[off:off + len(c)], c) for off, c in self.chunks(len(got)))

    def matches_device(self, dev_ptr: int, nbytes: int | None = None) -> bool:
        """True when ``nbytes`` (default all) of device memory at ``dev_ptr`` hold the pattern;
        read back through one host buffer of at most one chunk."""
        import numpy as np
        from cupy.cuda import runtime

        n = self.nbytes if nbytes is None else nbytes
        staging = None
        for off, c in self.chunks(n):
            if staging is None:
                staging = np.empty(len(c), dtype=np.uint8)
            view = staging[:len(c)]
            runtime.memcpy(view.ctypes.data, dev_ptr + off, len(c), D2H)
            if not np.array_equal(view, c):
                return False
        return True


_SPIN_SRC = r"""
extern "C" __global__ void gpubench_spin(volatile int* flag, unsigned long long timeout_ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    while (*flag == 0) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > timeout_ns) break;
    }
}
"""
_spin_kernels: dict[int, Any] = {}


class SpinGate:
    """Holds a stream with a kernel that spins on a flag in pinned host memory (nvbandwidth's blocking kernel), so many
    asynchronous copies are queued before the first one starts. The kernel gives up after ``timeout_s`` seconds. Only
    for work that does not block the host. Raises CUDARuntimeError / CompileException: the kernel cannot be built or
    launched."""

    def __init__(self, stream, timeout_s: float = 10.0):
        import cupy
        import numpy as np

        dev = cupy.cuda.Device().id
        if dev not in _spin_kernels:
            from gpubench.core import kernel_cache

            _spin_kernels[dev] = kernel_cache.load(_SPIN_SRC).get_function("gpubench_spin")
        self._kernel = _spin_kernels[dev]
        self._stream = stream
        self._flag_mem = cupy.cuda.alloc_pinned_memory(4)
        self._flag = np.frombuffer(self._flag_mem, dtype=np.int32, count=1)
        self._args = (np.uint64(self._flag_mem.ptr), np.uint64(int(timeout_s * 1e9)))

    def hold(self) -> None:
        self._flag[0] = 0
        with self._stream:
            self._kernel((1,), (1,), self._args)

    def release(self) -> None:
        self._flag[0] = 1

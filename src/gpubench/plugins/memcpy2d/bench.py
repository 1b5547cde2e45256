"""``gpubench memcpy2d``: a window of W bytes x H rows copied out of rows with a pitch, four ways
(``2d``, ``row-loop``, ``contiguous``, ``cupy-slice``). The source holds H rows of ``src_pitch``
bytes; the destination H rows of ``dst_pitch`` bytes between two guards of :data:`GUARD` bytes,
checked to stay untouched outside the window (layout and timing: docs/memcpy2d.md).

Figures: bandwidth = W x H / seconds (window bytes moved once, as nvbandwidth counts copies; the
pitch padding is not counted); time per row = seconds / H; relative to 2d = 2d's median / this one's.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from gpubench.core import benchmark as driver
from gpubench.core import env as envmod
from gpubench.core import gpu, limits
from gpubench.core.benchmark import DEVICE_MARGIN_BYTES, Benchmark, Context, Point
from gpubench.core.bounds import check_bounds, device_field
from gpubench.core.errors import UsageError, check_choices
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result, time_ratios
from gpubench.core.timing import SEGMENT, HostClock, TimingPlan, measure, time_repeated, time_segments
from gpubench.core.units import format_size

STRATEGIES = ("2d", "row-loop", "contiguous", "cupy-slice")
DIRECTIONS = ("h2d", "d2h", "d2d")
HOST_KINDS = ("pinned", "pageable")
GUARD = 4096  # bytes before and after the destination rows, checked to stay untouched
MAX_PITCH = 2**31 - 1  # cudaDevAttrMaxPitch on current NVIDIA GPUs; checked again on the device
MAX_BUFFER = 1 << 40  # a pitch x rows beyond 1 TiB cannot be a buffer on any machine here
MAX_LOOP_ROWS = 1 << 18  # row-loop issues one Python call per row; beyond this a sample takes seconds
CUDA_DEV_ATTR_MAX_PITCH = 11  # cudaDevAttrMaxPitch


@dataclass(frozen=True)
class Memcpy2dSpec:
    """Parsed options of ``gpubench memcpy2d``; a sample moves the whole window once."""

    points: tuple[tuple[int, int, int, int], ...]  # (width, height, src_pitch, dst_pitch) in bytes / rows
    strategies: tuple[str, ...] = STRATEGIES
    directions: tuple[str, ...] = DIRECTIONS
    memory: tuple[str, ...] = ("pinned",)  # host memory kinds for h2d / d2h (d2d uses device memory only)
    device: int = device_field()
    plan: TimingPlan = field(default_factory=TimingPlan)
    gate: bool = True  # queue page-locked / device copies behind the spin gate

    def __post_init__(self):
        """Raises UsageError: no window, a size below 1, W larger than a pitch, a pitch above MAX_PITCH or pitch x
        rows beyond MAX_BUFFER, a strategy, direction or memory kind not known (or none), a device ordinal outside
        0 to 2**31 - 1."""
        check_bounds(self)
        if not self.points:
            raise UsageError("no window to measure")
        for width, height, src_pitch, dst_pitch in self.points:
            for name, v in (("--width", width), ("-H/--height", height), ("--src-pitch", src_pitch),
                            ("--dst-pitch", dst_pitch)):
                if not isinstance(v, int):
                    raise UsageError(f"{name} {v!r} must be a whole number")
                if v < 1:
                    raise UsageError(f"{name} {v} must be >= 1")
            for name, p in (("--src-pitch", src_pitch), ("--dst-pitch", dst_pitch)):
                if width > p:
                    raise UsageError(f"--width {format_size(width)} is wider than {name} {format_size(p)}",
                                     "a row's window must fit in its pitch: W <= pitch")
                if p > MAX_PITCH:
                    raise UsageError(f"{name} {format_size(p)} is over CUDA's maximum pitch of {MAX_PITCH} bytes")
                if p * height > MAX_BUFFER:
                    raise UsageError(f"{name} {format_size(p)} x {height} rows = {format_size(p * height)} does not "
                                     f"fit in a buffer (limit {format_size(MAX_BUFFER)})",
                                     "lower --height or the pitch")
        check_choices("strategy", self.strategies, STRATEGIES)
        check_choices("direction", self.directions, DIRECTIONS)
        check_choices("memory kind", self.memory, HOST_KINDS)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["points"] = [list(p) for p in self.points]  # tuples -> JSON arrays, as they load back
        return d


def buffer_sizes(width: int, height: int, src_pitch: int, dst_pitch: int) -> tuple[int, int]:
    """(source bytes, destination bytes incl. the two guards) for one window."""
    return src_pitch * height, GUARD + dst_pitch * height + GUARD


def expected_destination(src, baseline, width: int, height: int, src_pitch: int, dst_pitch: int, *,
                         contiguous: bool = False):
    """The destination after a correct copy: a new uint8 numpy array, ``baseline`` (the destination's
    prior contents) with the window of ``src`` (the whole source) written; ``contiguous``: W x H bytes
    from src[0] to the window's start."""
    out = baseline.copy()
    if contiguous:
        out[GUARD:GUARD + width * height] = src[:width * height]
        return out
    rows = out[GUARD:GUARD + dst_pitch * height].reshape(height, dst_pitch)
    rows[:, :width] = src[:src_pitch * height].reshape(height, src_pitch)[:, :width]
    return out


@dataclass(frozen=True)
class _Group:
    point: tuple[int, int, int, int]
    memory: str  # "pinned" / "pageable" for h2d, d2h; "device" for d2d
    directions: tuple[str, ...]


def _params(spec: Memcpy2dSpec, g: _Group, direction: str, strategy: str) -> dict:
    w, h, sp, dp = g.point
    return {"device": spec.device, "direction": direction, "strategy": strategy, "memory": g.memory, "width": w,
            "height": h, "src_pitch": sp, "dst_pitch": dp}


_KINDS = {"h2d": gpu.H2D, "d2h": gpu.D2H, "d2d": gpu.D2D}


@dataclass
class _Copy:
    """One direction of one window: its source and destination buffers (host or device) and stream."""

    spec: Memcpy2dSpec
    direction: str
    w: int
    h: int
    sp: int
    dp: int
    src_n: int
    dst_n: int
    src: gpu.HostBuffer | gpu.DeviceBuffer
    dst: gpu.HostBuffer | gpu.DeviceBuffer
    kind: int
    stream: Any  # a cupy.cuda.Stream
    gated: bool

    @property
    def win_ptr(self) -> int:
        return self.dst.ptr + GUARD


def _two_d(c: _Copy, extra: dict):
    """One cudaMemcpy2DAsync of the window, reps per sample (time_repeated)."""
    from cupy.cuda import runtime

    one = functools.partial(runtime.memcpy2DAsync, c.win_ptr, c.dp, c.src.ptr, c.sp, c.w, c.h, c.kind, c.stream.ptr)
    return time_repeated(c.stream, c.gated, one, c.spec.plan)


def _contiguous(c: _Copy, extra: dict):
    """One copy of width x height bytes, packed (the ceiling)."""
    from cupy.cuda import runtime

    one = functools.partial(runtime.memcpyAsync, c.win_ptr, c.src.ptr, c.w * c.h, c.kind, c.stream.ptr)
    return time_repeated(c.stream, c.gated, one, c.spec.plan)


def _row_loop(c: _Copy, extra: dict):
    """One cudaMemcpyAsync per row, gated in segments of SEGMENT rows (time_segments); over
    MAX_LOOP_ROWS rows the point is skipped (returns the reason)."""
    from cupy.cuda import runtime

    if c.h > MAX_LOOP_ROWS:
        return f"skipped: {c.h} rows is over {MAX_LOOP_ROWS} one-row copies per sample"
    memcpy_async = runtime.memcpyAsync
    sptr = c.stream.ptr
    win_ptr, src_ptr, w, dp, sp, kind = c.win_ptr, c.src.ptr, c.w, c.dp, c.sp, c.kind

    def enqueue(seg):
        for r in seg:
            memcpy_async(win_ptr + r * dp, src_ptr + r * sp, w, kind, sptr)

    samples, _timer = time_segments(c.stream, c.gated, enqueue, c.h, c.spec.plan, extra)
    return samples, 1


def _cupy_slice(c: _Copy, extra: dict):
    """A CuPy slice assignment of the window, host-timed to the stream's end (not gated)."""
    import cupy

    extra["gated"] = False
    stream, w = c.stream, c.w

    def view(buf, n: int):  # the buffer's first n bytes: numpy for host memory, CuPy for device memory
        if isinstance(buf, gpu.HostBuffer):
            return buf.array[:n]
        memptr = cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(buf.ptr, n, buf), 0)
        return cupy.ndarray((n,), dtype=cupy.uint8, memptr=memptr)

    src = view(c.src, c.src_n).reshape(c.h, c.sp)
    dst = view(c.dst, c.dst_n)[GUARD:GUARD + c.dp * c.h].reshape(c.h, c.dp)
    if c.direction == "d2h":
        def step() -> None:
            with stream:
                dst[:, :w] = cupy.asnumpy(src[:, :w], stream=stream)
            stream.synchronize()
    elif c.direction == "h2d":
        def step() -> None:
            with stream:
                dst[:, :w] = cupy.asarray(src[:, :w])
            stream.synchronize()
    else:
        def step() -> None:
            with stream:
                dst[:, :w] = src[:, :w]
            stream.synchronize()

    return measure(step, HostClock(), c.spec.plan), 1


# -s/--strategy value -> (copy, extra) -> (seconds per copy per sample, copies per sample), or a skip
# reason; "contiguous" lands packed (checked against the packed expectation)
STRATEGY_TABLE: dict[str, Callable[[_Copy, dict], tuple[list[float], int] | str]] = {
    "2d": _two_d, "row-loop": _row_loop, "contiguous": _contiguous, "cupy-slice": _cupy_slice}
assert tuple(STRATEGY_TABLE) == STRATEGIES


def _group_records(spec: Memcpy2dSpec, g: _Group, peak: float | None, d2d_peak: float | None = None) -> list[Record]:
    """Every direction x strategy of one window, the strategies taken from STRATEGY_TABLE; each
    copy's destination is checked inside the window and outside it (untouched)."""
    import cupy
    import numpy as np
    from cupy.cuda import runtime

    w, h, sp, dp = g.point
    src_n, dst_n = buffer_sizes(w, h, sp, dp)
    src_pat = gpu.pattern(src_n, seed=src_n + w)
    baseline = gpu.pattern(dst_n, seed=dst_n + w + 1)[::-1].copy()  # a different sequence than the source
    out: list[Record] = []
    bufs: list = []
    try:
        dev_a = gpu.DeviceBuffer(max(src_n, dst_n))
        bufs.append(dev_a)
        # the other side: host memory (h2d / d2h) or a second device buffer (d2d)
        far: gpu.HostBuffer | gpu.DeviceBuffer = (gpu.DeviceBuffer(dst_n) if g.memory == "device"
                                                  else gpu.HostBuffer(max(src_n, dst_n), g.memory))
        bufs.append(far)
        stream = cupy.cuda.Stream(non_blocking=True)
        gated = spec.gate and g.memory != "pageable"
        check = np.empty(max(src_n, dst_n), dtype=np.uint8)

        def put(buf, data) -> None:
            if isinstance(buf, gpu.HostBuffer):
                buf.array[:data.size] = data
            else:
                runtime.memcpy(buf.ptr, data.ctypes.data, data.size, gpu.H2D)

        def destination(buf):
            stream.synchronize()
            if isinstance(buf, gpu.HostBuffer):
                return buf.array[:dst_n]
            runtime.memcpy(check.ctypes.data, buf.ptr, dst_n, gpu.D2H)
            return check[:dst_n]

        for direction in g.directions:
            src, dst = (far, dev_a) if direction == "h2d" else (dev_a, far)
            c = _Copy(spec, direction, w, h, sp, dp, src_n, dst_n, src, dst, _KINDS[direction], stream, gated)
            expect = {k: expected_destination(src_pat, baseline, w, h, sp, dp, contiguous=k)
                      for k in {st == "contiguous" for st in spec.strategies}}
            for strategy in spec.strategies:
                packed = strategy == "contiguous"
                params = _params(spec, g, direction, strategy)
                # d2d: a copy inside device memory reads and writes each byte (core/limits.py)
                extra = {"gated": gated, "peak_bytes_per_s": peak if direction != "d2d" else d2d_peak}
                stream.synchronize()
                put(src, src_pat)
                put(dst, baseline)
                got_times = STRATEGY_TABLE[strategy](c, extra)
                if isinstance(got_times, str):
                    out.append(Record(params=params, nbytes=w * h, extra={"skipped": True}, error=got_times))
                    continue
                samples, reps = got_times
                inside, outside = _compare(destination(dst), expect[packed], w, h, dp, contiguous=packed)
                extra.update(verified=inside, untouched=outside)
                out.append(Record(params=params, metric="bandwidth", nbytes=w * h, samples_s=list(samples),
                                  reps=reps, extra=extra))
        stream.synchronize()
    finally:
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()
        for b in reversed(bufs):
            b.free()
    return out


def _compare(got, expected, width: int, height: int, dst_pitch: int, *, contiguous: bool) -> tuple[bool, bool]:
    """(window correct, everything outside it untouched) for ``got`` and ``expected``, uint8 numpy arrays
    of the destination's size (see buffer_sizes)."""
    import numpy as np

    inside = np.zeros(got.size, dtype=bool)
    if contiguous:
        inside[GUARD:GUARD + width * height] = True
    else:
        inside[GUARD:GUARD + dst_pitch * height].reshape(height, dst_pitch)[:, :width] = True
    same = got == expected
    return bool(same[inside].all()), bool(same[~inside].all())


def add_derived(records: list[Record]) -> None:
    """Fill extra with time per row (us), time relative to ``2d`` (2d's median / this median; >1 is
    faster than 2d) and % of the link's peak. Mutates ``records``."""
    window = ("device", "direction", "memory", "width", "height", "src_pitch", "dst_pitch")
    for r, ratio in time_ratios(records, "2d", lambda r: tuple(r.params[k] for k in window)):
        r.extra["time_per_row_us"] = r.time_summary().median / r.params["height"] * 1e6
        r.extra["relative_to_2d"] = ratio
        r.mark_peak(r.extra.get("peak_bytes_per_s"))


class Memcpy2d(Benchmark):
    """The memcpy2d plug-in: a point is (window, memory kind) with its directions and strategies."""

    name = "memcpy2d"
    host_memory = True  # host buffers: the driver binds to the GPU's NUMA node first

    def points(self, spec: Memcpy2dSpec, devices: tuple[int, ...]) -> list[Point]:
        host_dirs = tuple(d for d in spec.directions if d != "d2d")
        groups: list[_Group] = []
        for p in spec.points:
            if host_dirs:
                groups += [_Group(p, m, host_dirs) for m in spec.memory]
            if "d2d" in spec.directions:
                groups.append(_Group(p, "device", ("d2d",)))
        return [Point(f"{format_size(g.point[0])} x {g.point[1]} rows ({g.memory})", g, devices=(spec.device,))
                for g in groups]

    def preflight(self, spec: Memcpy2dSpec, points, devices) -> None:
        """Every window's pitches against the device's maximum, then its buffers against free memory;
        raises UsageError: a pitch above the device's maximum, or buffers larger than its free memory."""
        import cupy
        from cupy.cuda import runtime

        with cupy.cuda.Device(spec.device):
            try:
                max_pitch = runtime.deviceGetAttribute(CUDA_DEV_ATTR_MAX_PITCH, spec.device)
            except Exception:
                max_pitch = MAX_PITCH
            free, _ = gpu.device_free_bytes(spec.device)
        _, avail = envmod.host_memory()
        for w, h, sp, dp in spec.points:
            for name, p in (("--src-pitch", sp), ("--dst-pitch", dp)):
                if p > max_pitch:
                    raise UsageError(f"{name} {format_size(p)} is over GPU {spec.device}'s maximum pitch of "
                                     f"{max_pitch} bytes")
            s, d = buffer_sizes(w, h, sp, dp)
            need = s + d if "d2d" in spec.directions else max(s, d)
            if need + DEVICE_MARGIN_BYTES > free:
                raise UsageError(f"a {format_size(w)} x {h}-row window with pitches {format_size(sp)} / "
                                 f"{format_size(dp)} needs {format_size(need)} on GPU {spec.device}, which has "
                                 f"{format_size(free)} free", "lower --height or the pitches")
            if avail is not None and 4 * max(s, d) > avail:
                raise UsageError(f"a {format_size(w)} x {h}-row window needs about {format_size(4 * max(s, d))} of "
                                 f"host memory; {format_size(avail)} is available", "lower --height or the pitches")

    @contextlib.contextmanager
    def setup(self, ctx: Context):
        ctx.data["peak"] = (envmod.gpu_by_index(ctx.env, ctx.spec.device) or {}).get("pcie_peak_bytes_per_s")
        ctx.data["d2d_peak"] = limits.device_copy_peak_bytes_per_s(envmod.gpu_by_index(ctx.env, ctx.spec.device))
        yield ctx

    def measure(self, ctx: Context, point: Point) -> list[Record]:
        import cupy

        with cupy.cuda.Device(ctx.spec.device):
            return _group_records(ctx.spec, point.key, ctx.data["peak"], ctx.data.get("d2d_peak"))

    def failed(self, ctx: Context, point: Point, message: str) -> list[Record]:
        g: _Group = point.key
        return [Record(params=_params(ctx.spec, g, d, s), nbytes=g.point[0] * g.point[1], error=message)
                for d in g.directions for s in ctx.spec.strategies]

    def derive(self, ctx: Context, records: list[Record]) -> None:
        add_derived(records)

    def timing(self, ctx: Context) -> dict:
        return {
            "clock": "cuda-event (2d, row-loop, contiguous), perf_counter + stream sync (cupy-slice)",
            "method": f"page-locked and device copies queued behind a spin kernel (2d / contiguous: reps per "
                      f"sample; row-loop: segments of {SEGMENT} rows, summed); pageable: no gate",
            "guard_bytes": GUARD,
            **ctx.spec.plan.to_dict(),
        }


BENCHMARK = Memcpy2d()


def run(spec: Memcpy2dSpec, progress: ProgressSink | None = None) -> Result:
    """Measure each window in each direction with each strategy through :func:`gpubench.core.benchmark.run`
    (NoGPUError, UsageError, MachineError as it raises them): a record per (direction, strategy, memory,
    window); a row-loop over more than MAX_LOOP_ROWS rows has ``error`` "skipped: ..."."""
    return driver.run(BENCHMARK, spec, progress)

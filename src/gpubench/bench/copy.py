"""``gpubench copy``: host<->device copy bandwidth over a size sweep, per host-memory kind.

What is timed (see docs/copy.md): one ``cudaMemcpyAsync`` of ``nbytes`` between a host buffer of
the given kind and a cudaMalloc'd device buffer, on a non-blocking stream, between two CUDA events
recorded on that stream. For page-locked kinds (pinned, write-combined, registered) a spinning
kernel holds the stream while ``reps`` copies are queued (nvbandwidth's method), so the host's
launch cost is not in the figure; pageable copies are staged by the driver through the host and
block the host, so they are timed one per sample with no gate. Allocation, pinning, filling and
first touch happen before the timed region.

Figures: bandwidth of a sample = nbytes / (elapsed / reps), in B/s; the report shows the median
and p25-p75 over samples. bidir runs H2D and D2H at the same time on two streams released together:
per direction = nbytes / that stream's elapsed time while a copy twice as long runs the other way
(as nvbandwidth's bidirectional tests); total = 2 * nbytes / the time until two equal copies end.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from gpubench.core import env as envmod
from gpubench.core import gpu
from gpubench.core.errors import UsageError
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result
from gpubench.core.sweep import run_groups
from gpubench.core.timing import CudaEventClock, TimingPlan, choose_reps, measure
from gpubench.core.units import format_size

DIRECTIONS = ("h2d", "d2h", "bidir")
DEVICE_MARGIN_BYTES = 512 * 2**20  # left free on the GPU for the CUDA context and the spin kernel


@dataclass(frozen=True)
class CopySpec:
    """Parsed options of ``gpubench copy``.

    Attributes:
        sizes: bytes per copy, ascending.
        directions: subset of DIRECTIONS.
        memory: host memory kinds, subset of gpu.MEMORY_KINDS.
        devices: CUDA ordinals, or None for device 0.
        plan: warm-ups and iterations.
        verify: check the data after the copies.
        max_pinned_bytes: cap on page-locked host memory held at once; None = half of MemTotal.
    """

    sizes: tuple[int, ...]
    directions: tuple[str, ...] = ("h2d", "d2h")
    memory: tuple[str, ...] = ("pinned", "pageable")
    devices: tuple[int, ...] | None = None
    plan: TimingPlan = field(default_factory=TimingPlan)
    verify: bool = False
    max_pinned_bytes: int | None = None

    def __post_init__(self):
        for d in self.directions:
            if d not in DIRECTIONS:
                raise UsageError(f"direction {d!r} not known", f"use {', '.join(DIRECTIONS)}")
        for m in self.memory:
            if m not in gpu.MEMORY_KINDS:
                raise UsageError(f"memory kind {m!r} not known", f"use {', '.join(gpu.MEMORY_KINDS)}")
        if not self.sizes:
            raise UsageError("no sizes to measure")

    def to_dict(self) -> dict:
        return asdict(self)  # the plan (a dataclass) becomes a dict too


@dataclass(frozen=True)
class _Group:
    device: int | str  # an ordinal, or "all" for every selected device at once
    nbytes: int
    memory: str


def _label(g: _Group) -> str:
    return f"GPU {g.device} {g.memory} {format_size(g.nbytes)}"


def bytes_needed(spec: CopySpec) -> tuple[int, int, int]:
    """(device bytes, host bytes, page-locked host bytes) one point of the largest size needs."""
    n = max(spec.sizes)
    units = 3 if "bidir" in spec.directions else 1  # bidir adds a pair of twice the size
    device = units * n
    host = (2 * units + (1 if spec.verify else 0)) * n  # buffers + the patterns (+ the check copy)
    locked = units * n if any(m != "pageable" for m in spec.memory) else 0
    return device, host, locked


def preflight(spec: CopySpec, devices: tuple[int, ...]) -> None:
    """Check the sweep fits before allocating anything.

    Raises:
        UsageError: the largest size does not fit in a GPU's free memory, in available host
            memory, or under the page-locked cap.
    """
    dev_need, host_need, locked_need = bytes_needed(spec)
    for d in devices:
        free, _total = gpu.device_free_bytes(d)
        if dev_need + DEVICE_MARGIN_BYTES > free:
            raise UsageError(
                f"-e {format_size(max(spec.sizes))} needs {format_size(dev_need)} on GPU {d}, "
                f"which has {format_size(free)} free",
                f"use -e {format_size(max(0, free - DEVICE_MARGIN_BYTES) // (dev_need // max(spec.sizes)))} or less",
            )
    total, avail = envmod.host_memory()
    if avail is not None and host_need > avail:
        raise UsageError(
            f"-e {format_size(max(spec.sizes))} needs {format_size(host_need)} of host memory; "
            f"{format_size(avail)} is available"
        )
    cap = spec.max_pinned_bytes if spec.max_pinned_bytes is not None else (total // 2 if total else None)
    if cap is not None and locked_need > cap:
        raise UsageError(
            f"-e {format_size(max(spec.sizes))} would page-lock {format_size(locked_need)}, over the cap "
            f"of {format_size(cap)}",
            "pinning too much slows the whole host; lower -e or raise --max-pinned",
        )


class _Pair:
    """A host buffer of one kind and a device buffer of the same size (allocated, not yet filled)."""

    def __init__(self, nbytes: int, kind: str):
        self.nbytes = nbytes
        self.host = gpu.HostBuffer(nbytes, kind)
        try:
            self.dev = gpu.DeviceBuffer(nbytes)
        except BaseException:
            self.host.free()
            raise

    def fill(self, pat) -> "_Pair":
        """Write the pattern into the host buffer and copy it to the device buffer (untimed)."""
        from cupy.cuda import runtime

        self.host.array[:] = pat
        runtime.memcpy(self.dev.ptr, self.host.ptr, self.nbytes, gpu.H2D)
        return self

    def free(self):
        self.dev.free()
        self.host.free()


def _device_equals(dev_ptr: int, pat) -> bool:
    import numpy as np
    from cupy.cuda import runtime

    out = np.empty(pat.size, dtype=np.uint8)
    runtime.memcpy(out.ctypes.data, dev_ptr, pat.size, gpu.D2H)
    return bool(np.array_equal(out, pat))


class _MultiClock:
    """Event clocks on several streams released together: the first stream's start event gates the
    others (cudaStreamWaitEvent), so all copies start when the gate opens. ``stop()`` (or
    ``mark_end()`` before the gate opens, then ``elapsed()``) returns the time until the last stream
    ends; ``last`` holds each stream's own elapsed seconds."""

    name = "cuda-event"

    def __init__(self, streams):
        self.clocks = [CudaEventClock(s) for s in streams]
        self.last: list[float] = []
        self.history: list[list[float]] = []

    def start(self):
        first = self.clocks[0]
        first.start()
        for c in self.clocks[1:]:
            c.stream.wait_event(first._start)
            c.start()

    def mark_end(self):
        """Record every stream's end event without waiting (before the gate opens)."""
        for c in self.clocks:
            c.mark_end()

    def stop(self):
        self.mark_end()
        return self.elapsed()

    def elapsed(self):
        """Wait for every end event; seconds until the last one (``last``: each stream's)."""
        first = self.clocks[0]
        self.last = []
        for c in self.clocks:
            c._end.synchronize()
            self.last.append(first._cupy.cuda.get_elapsed_time(first._start, c._end) / 1e3)
        self.history.append(self.last)
        return max(self.last)


def _copy_records(device, nbytes, kind, spec: CopySpec, peak) -> list[Record]:
    import cupy
    from cupy.cuda import runtime

    gated = kind != "pageable"
    out: list[Record] = []
    a = _Pair(nbytes, kind)  # allocate first: a size that does not fit fails before any work
    b = None
    try:
        pat = gpu.pattern(nbytes, seed=nbytes)
        a.fill(pat)
        stream = cupy.cuda.Stream(non_blocking=True)
        gate = gpu.SpinGate(stream) if gated else None

        def params(direction):
            return {"device": device, "direction": direction, "memory": kind, "nbytes": nbytes}

        for direction in spec.directions:
            if direction in ("h2d", "d2h"):
                src, dst, k = (a.host.ptr, a.dev.ptr, gpu.H2D) if direction == "h2d" else (a.dev.ptr, a.host.ptr, gpu.D2H)
                if direction == "d2h" and spec.verify:
                    a.host.array[:] = ~pat  # poison: the copies must overwrite it

                def step(src=src, dst=dst, k=k):
                    runtime.memcpyAsync(dst, src, nbytes, k, stream.ptr)

                clock = CudaEventClock(stream)
                # one untimed copy, then one timed copy to pick copies per sample
                step()
                stream.synchronize()
                t1 = measure(step, clock, TimingPlan(warmup=0, iters=1), gate=gate)[0]
                reps = choose_reps(t1) if gated else 1
                samples = measure(step, clock, spec.plan, reps=reps, gate=gate)
                verified = None
                if spec.verify:
                    stream.synchronize()
                    verified = _device_equals(a.dev.ptr, pat) if direction == "h2d" else bool((a.host.array == pat).all())
                out.append(_record(params(direction), nbytes, samples, reps, gated, verified, peak))
            else:  # bidir
                if b is None:
                    pat2 = gpu.pattern(2 * nbytes, seed=nbytes + 1)
                    b = _Pair(2 * nbytes, kind).fill(pat2)  # the interfering copy is twice as long
                out.extend(_bidir_records(a, b, pat, pat2, stream, gate, spec, params, peak))
        stream.synchronize()
    finally:
        a.free()
        if b is not None:
            b.free()
    return out


def _bidir_records(a: _Pair, b: _Pair, pat, pat2, stream, gate, spec: CopySpec, params, peak) -> list[Record]:
    """The three bidirectional figures, each from copies released together on two streams.

    - bidir-h2d: H2D of nbytes timed while a D2H of 2 x nbytes runs on the other stream, so the
      timed copy is interfered with from start to end (nvbandwidth's host_to_device_bidirectional
      test doubles the interfering copy for the same reason, testcases_ce.cpp);
    - bidir-d2h: the same with the directions swapped;
    - bidir-total: H2D and D2H of nbytes each at once; 2 x nbytes / time until both end.
    """
    import cupy
    from cupy.cuda import runtime

    n = a.nbytes
    s2 = cupy.cuda.Stream(non_blocking=True)
    gated = gate is not None
    out = []

    def concurrent(copies, check):
        """copies: (dst, src, nbytes, kind) for stream 1 then stream 2. Returns per-stream and
        total per-copy samples."""
        (d1, s1_, n1, k1), (d2, s2_, n2, k2) = copies

        def both():
            runtime.memcpyAsync(d1, s1_, n1, k1, stream.ptr)
            runtime.memcpyAsync(d2, s2_, n2, k2, s2.ptr)

        clock = _MultiClock([stream, s2])
        both()
        stream.synchronize()
        s2.synchronize()
        t1 = measure(both, clock, TimingPlan(warmup=0, iters=1), gate=gate)[0]
        reps = choose_reps(t1) if gated else 1
        clock.history.clear()
        total = measure(both, clock, spec.plan, reps=reps, gate=gate)
        per = clock.history[-len(total):]
        verified = None
        if spec.verify:
            stream.synchronize()
            s2.synchronize()
            verified = check()
        return [p[0] / reps for p in per], [p[1] / reps for p in per], total, reps, verified

    def poison(buf: _Pair, p):
        if spec.verify:
            buf.host.array[:] = ~p

    # H2D timed, D2H of twice the size interfering
    poison(b, pat2)
    first, _, _, reps, ok = concurrent(
        [(a.dev.ptr, a.host.ptr, n, gpu.H2D), (b.host.ptr, b.dev.ptr, 2 * n, gpu.D2H)],
        lambda: _device_equals(a.dev.ptr, pat) and bool((b.host.array == pat2).all()))
    out.append(_record(params("bidir-h2d"), n, first, reps, gated, ok, peak))
    # D2H timed, H2D of twice the size interfering
    poison(a, pat)
    first, _, _, reps, ok = concurrent(
        [(a.host.ptr, a.dev.ptr, n, gpu.D2H), (b.dev.ptr, b.host.ptr, 2 * n, gpu.H2D)],
        lambda: bool((a.host.array == pat).all()) and _device_equals(b.dev.ptr, pat2))
    out.append(_record(params("bidir-d2h"), n, first, reps, gated, ok, peak))
    # both directions, equal sizes: the total
    _, _, total, reps, ok = concurrent(
        [(a.dev.ptr, a.host.ptr, n, gpu.H2D), (b.host.ptr, b.dev.ptr, n, gpu.D2H)],
        lambda: _device_equals(a.dev.ptr, pat) and bool((b.host.array[:n] == pat2[:n]).all()))
    out.append(_record(params("bidir-total"), 2 * n, total, reps, gated, ok, 2 * peak if peak else None))
    return out


def _record(params, nbytes, samples, reps, gated, verified, peak) -> Record:
    r = Record(params=params, metric="bandwidth", nbytes=nbytes, samples_s=list(samples), reps=reps,
               extra={"gated": gated, "verified": verified})
    r.mark_peak(peak)
    return r


def _all_devices_records(devices, nbytes, kind, spec: CopySpec, peaks) -> list[Record]:
    """Every selected GPU copying at once (page-locked kinds only): per GPU and aggregate."""
    import cupy
    from cupy.cuda import runtime

    pairs, streams, gates = [], [], []
    out: list[Record] = []
    try:
        pat = None
        for d in devices:
            with cupy.cuda.Device(d):
                pairs.append(_Pair(nbytes, kind))
                pat = gpu.pattern(nbytes, seed=nbytes) if pat is None else pat
                pairs[-1].fill(pat)
                s = cupy.cuda.Stream(non_blocking=True)
                streams.append(s)
                gates.append(gpu.SpinGate(s))
        for direction in [x for x in spec.directions if x in ("h2d", "d2h")]:
            clocks = []
            for d, s in zip(devices, streams):
                with cupy.cuda.Device(d):
                    clocks.append(CudaEventClock(s))
            per: list[list[float]] = [[] for _ in devices]
            agg: list[float] = []
            k = gpu.H2D if direction == "h2d" else gpu.D2H

            def sample(reps):
                for d, g, c in zip(devices, gates, clocks):
                    with cupy.cuda.Device(d):
                        g.hold()
                        c.start()
                for d, p, s in zip(devices, pairs, streams):
                    with cupy.cuda.Device(d):
                        src, dst = (p.host.ptr, p.dev.ptr) if k == gpu.H2D else (p.dev.ptr, p.host.ptr)
                        for _ in range(reps):
                            runtime.memcpyAsync(dst, src, nbytes, k, s.ptr)
                        clocks[devices.index(d)].mark_end()
                for g in gates:
                    g.release()
                return [c.elapsed() for c in clocks]

            first = sample(1)
            reps = choose_reps(max(first))
            for _ in range(spec.plan.warmup):
                sample(reps)
            total_t = 0.0
            while True:
                ts = sample(reps)
                for i, t in enumerate(ts):
                    per[i].append(t / reps)
                agg.append(max(ts) / reps)
                total_t += max(ts)
                n = len(agg)
                if spec.plan.iters is not None:
                    if n >= spec.plan.iters:
                        break
                elif n >= spec.plan.max_iters or (n >= spec.plan.min_iters and total_t >= spec.plan.min_time):
                    break
            for i, d in enumerate(devices):
                p = {"device": f"{d}@all", "direction": direction, "memory": kind, "nbytes": nbytes}
                out.append(_record(p, nbytes, per[i], reps, True, None, peaks.get(d)))
            p = {"device": "all", "direction": direction, "memory": kind, "nbytes": nbytes}
            total_peak = sum(peaks.get(d) or 0 for d in devices) or None
            r = _record(p, nbytes * len(devices), agg, reps, True, None, total_peak)
            r.extra["aggregate"] = "sum of bytes over the time until the last GPU finished"
            out.append(r)
    finally:
        for d, p in zip(devices, pairs):
            with cupy.cuda.Device(d):
                p.free()
    return out


def run(spec: CopySpec, progress: ProgressSink | None = None) -> Result:
    """Run the copy sweep.

    Args:
        spec: the parsed options.
        progress: progress callback (silent when None).

    Returns:
        A Result whose records are one per (device, direction, memory kind, size); per-direction
        records for bidir ("bidir-h2d", "bidir-d2h", "bidir-total"); with several devices also
        device "all" (aggregate) and "N@all" (GPU N while all copy).

    Raises:
        NoGPUError: no CUDA device visible.
        UsageError: a device not visible, or the sweep does not fit (see preflight).
        MachineError: a CUDA fault other than an allocation failure.
    """
    cupy = gpu.require_gpu()  # a missing CuPy is a setup problem (exit 2), not a fault

    devices = gpu.resolve_devices(spec.devices)
    preflight(spec, devices)
    env = envmod.capture()
    peaks = {}
    for d in devices:
        g = envmod.gpu_by_index(env, d) or {}
        peaks[d] = g.get("pcie_peak_bytes_per_s")

    groups = [_Group(d, n, m) for d in devices for n in spec.sizes for m in spec.memory]
    if len(devices) > 1:
        groups += [_Group("all", n, m) for n in spec.sizes for m in spec.memory if m != "pageable"]

    def measure_group(g: _Group):
        try:
            if g.device == "all":
                return _all_devices_records(devices, g.nbytes, g.memory, spec, peaks)
            with cupy.cuda.Device(g.device):
                return _copy_records(g.device, g.nbytes, g.memory, spec, peaks[g.device])
        except cupy.cuda.runtime.CUDARuntimeError as e:
            if gpu.is_oom(e):
                raise
            raise gpu.machine_error(f"copy on GPU {g.device} ({g.memory}, {format_size(g.nbytes)})", e) from None

    def on_alloc_error(g: _Group, e: BaseException):
        dirs = [x for x in spec.directions for x in ((x,) if x != "bidir" else ("bidir-h2d", "bidir-d2h", "bidir-total"))]
        msg = f"allocation of {format_size(g.nbytes)} {g.memory} failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        return [Record(params={"device": g.device, "direction": d, "memory": g.memory, "nbytes": g.nbytes},
                       nbytes=g.nbytes, error=msg) for d in dirs]

    records, interrupted = run_groups(groups, measure_group, on_alloc_error, progress or ProgressSink(), _label)
    return Result(
        command="copy",
        spec=spec.to_dict(),
        timing={
            "clock": "cuda-event",
            "method": "cudaMemcpyAsync on a non-blocking stream between CUDA events; page-locked kinds "
            "gated by a spin kernel with reps copies per sample (nvbandwidth's method); pageable one copy per sample",
            **spec.plan.to_dict(),
        },
        env=env,
        records=records,
        partial=interrupted is not None,
        interrupted_by=interrupted,
    )

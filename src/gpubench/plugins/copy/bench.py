"""``gpubench copy``: host<->device copy bandwidth over a size sweep, per host-memory kind
(docs/copy.md): ``cudaMemcpyAsync`` of ``nbytes`` between CUDA events, page-locked kinds gated by a
spin kernel while ``reps`` copies are queued (nvbandwidth's method), pageable ones one per sample.
bidir follows nvbandwidth's bidirectional tests (total = 2 * nbytes / the time until both end); the
other nvbandwidth tests (SM copies, device local copy, latency) are entries of TESTS.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field
from typing import Callable

from gpubench.core import benchmark as driver
from gpubench.core import env as envmod
from gpubench.core import gpu, kernels, limits
from gpubench.core.benchmark import Benchmark, Context, Point
from gpubench.core.errors import UsageError, check_choices
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result
from gpubench.core.timing import (SPAN, GatedTimer, Lane, LaneTimes, TimingPlan, choose_reps, policy_seconds,
                                  sample_loop)
from gpubench.core.units import format_size

GATE_TIMEOUT_S = 10.0  # copy's spin gate gives up after this (SpinGate's default)
LATENCY_ACCESSES = 10_000  # pointer-chase steps per sample (one launch); nvbandwidth does 1M over all SMs
WARMUP_COPIES = 4  # SM tests: nvbandwidth memcpy.cpp WARMUP_COUNT, queued behind the gate


@dataclass(frozen=True)
class Test:
    """One entry of copy's table: a ``--direction`` value (``key``), the nvbandwidth test it matches,
    how it is measured, whether it needs a host buffer (False: ``d2d``) or page-locked host memory,
    the buffers of ``nbytes`` it needs, and the directions of its records (default: the key)."""

    key: str
    nvbandwidth: str
    measure: Callable
    host: bool = True
    locked_only: bool = False
    device_units: int = 1
    host_units: int = 1
    records: tuple[str, ...] = ()

    def directions(self) -> tuple[str, ...]:
        return self.records or (self.key,)


@dataclass(frozen=True)
class CopySpec:
    """Parsed options of ``gpubench copy``."""

    sizes: tuple[int, ...]  # bytes per copy, ascending
    directions: tuple[str, ...] = ("h2d", "d2h")  # keys of TESTS
    memory: tuple[str, ...] = ("pinned", "pageable")  # host memory kinds (gpu.MEMORY_KINDS)
    devices: tuple[int, ...] | None = None  # CUDA ordinals; None: device 0
    plan: TimingPlan = field(default_factory=TimingPlan)
    verify: bool = False  # check the data after the copies
    max_pinned_bytes: int | None = None  # cap on page-locked host memory held at once; None: half of MemTotal

    def __post_init__(self):
        """Raises UsageError: a memory kind or direction not known (or none), no sizes."""
        check_choices("memory kind", self.memory, gpu.MEMORY_KINDS)
        check_choices("direction", self.directions, TESTS)
        if not self.sizes:
            raise UsageError("no sizes to measure")

    def to_dict(self) -> dict:
        return asdict(self)  # the plan (a dataclass) becomes a dict too


@dataclass(frozen=True)
class _Group:
    device: int | str  # an ordinal, or "all" for every selected device at once
    nbytes: int
    memory: str  # a host memory kind, or "device" for the device-only tests
    tests: tuple[str, ...]

    @property
    def ordinal(self) -> int:
        """The CUDA ordinal of a one-GPU group (every group but "all")."""
        if isinstance(self.device, int):
            return self.device
        raise ValueError(f"the group of device {self.device!r} has no single ordinal")


def _groups(spec: CopySpec, devices: tuple[int, ...]) -> list[_Group]:
    host_tests = tuple(d for d in spec.directions if TESTS[d].host)
    dev_tests = tuple(d for d in spec.directions if not TESTS[d].host)
    out = []
    for d in devices:
        for n in spec.sizes:
            if host_tests:
                out += [_Group(d, n, m, host_tests) for m in spec.memory]
            if dev_tests:
                out.append(_Group(d, n, "device", dev_tests))
    if len(devices) > 1:
        multi = tuple(x for x in spec.directions if x in ("h2d", "d2h"))
        if multi:
            out += [_Group("all", n, m, multi) for n in spec.sizes for m in spec.memory if m != "pageable"]
    return out


class _Pair:
    """A host buffer of one kind and a device buffer of the same size (allocated, not yet filled)."""

    def __init__(self, nbytes: int, kind: str):
        self.nbytes = nbytes
        with contextlib.ExitStack() as undo:  # a failed device allocation frees the host buffer
            self.host = undo.enter_context(gpu.HostBuffer(nbytes, kind))
            self.dev = gpu.DeviceBuffer(nbytes)
            undo.pop_all()

    def fill(self, pat: gpu.Pattern) -> "_Pair":
        """Write the pattern into the host buffer and copy it to the device buffer (untimed)."""
        from cupy.cuda import runtime

        pat.fill(self.host.array)
        runtime.memcpy(self.dev.ptr, self.host.ptr, self.nbytes, gpu.H2D)
        return self

    def free(self):
        self.dev.free()
        self.host.free()


def _record(params, nbytes, samples, reps, gated, verified, peak) -> Record:
    r = Record(params=params, metric="bandwidth", nbytes=nbytes, samples_s=list(samples), reps=reps,
               extra={"gated": gated, "verified": verified})
    r.mark_peak(peak)
    return r


def _params(pt_group: _Group, direction: str) -> dict:
    return {"device": pt_group.device, "direction": direction, "memory": pt_group.memory,
            "nbytes": pt_group.nbytes}


def timed(timer: GatedTimer, enqueue_k: Callable[[int], None] | None, plan: TimingPlan, *, policy: str = SPAN,
          warm: int = 0) -> tuple[list[LaneTimes], int]:
    """One untimed step, one probe sample that picks the steps per sample (choose_reps, gated lanes
    only), then :func:`sample_loop` over ``plan`` on the ``policy`` time; ``enqueue_k(k)`` queues k steps
    on every lane (None: each lane's own enqueue, no untimed step), ``warm`` untimed steps go behind the
    gate first. Returns (the kept LaneTimes, steps per sample).
    """
    if enqueue_k is not None:
        enqueue_k(1)
        for ln in timer.lanes:
            ln.stream.synchronize()

    def sample(k: int, warm: int = 0) -> LaneTimes:
        return timer.sample(None if enqueue_k is None else lambda: enqueue_k(k), reps=k, warm=warm)

    probe = sample(1)
    reps = choose_reps(policy_seconds(probe, policy)) if timer.gated else 1
    got: list[LaneTimes] = []

    def take() -> float:
        t = sample(reps, warm)
        got.append(t)
        return policy_seconds(t, policy) / reps

    n = len(sample_loop(take, plan, reps))
    return got[len(got) - n:], reps


def _bidir_records(ctx: Context, g: _Group, bufs: dict, direction: str) -> list[Record]:
    """The three bidirectional figures, each from copies released together on two streams.

    - bidir-h2d: H2D of nbytes timed while a D2H of 2 x nbytes runs on the other stream, so the
      timed copy is interfered with from start to end (nvbandwidth's host_to_device_bidirectional
      test doubles the interfering copy for the same reason, testcases_ce.cpp): USE_FIRST_BW;
    - bidir-d2h: the same with the directions swapped;
    - bidir-total: H2D and D2H of nbytes each at once; 2 x nbytes / time until both end (TOTAL_BW).
    """
    import cupy
    from cupy.cuda import runtime

    spec: CopySpec = ctx.spec
    a: _Pair = bufs["pair"]
    pat: gpu.Pattern = bufs["pattern"]
    n = g.nbytes
    gated = bufs["gated"]
    peak = ctx.data["peaks"].get(g.device)
    if "pair2" not in bufs:
        bufs["pattern2"] = gpu.Pattern(2 * n, seed=n + 1)
        bufs["pair2"] = _Pair(2 * n, g.memory).fill(bufs["pattern2"])  # the interfering copy is twice as long
    b: _Pair = bufs["pair2"]
    pat2: gpu.Pattern = bufs["pattern2"]
    stream = bufs["stream"]
    s2 = cupy.cuda.Stream(non_blocking=True)
    # stream 1 is held by the gate; its start event releases stream 2
    timer = GatedTimer([Lane(stream, g.ordinal, gated=gated, gate_timeout_s=GATE_TIMEOUT_S),
                        Lane(s2, g.ordinal, gated=False)])

    out = []
    # (direction, buffer and pattern poisoned first, the two copies, time policy, bytes, peak, check)
    cases = (
        ("bidir-h2d", (b, pat2), ((a.dev.ptr, a.host.ptr, n, gpu.H2D), (b.host.ptr, b.dev.ptr, 2 * n, gpu.D2H)),
         "first", n, peak, lambda: pat.matches_device(a.dev.ptr) and pat2.matches(b.host.array)),
        ("bidir-d2h", (a, pat), ((a.host.ptr, a.dev.ptr, n, gpu.D2H), (b.dev.ptr, b.host.ptr, 2 * n, gpu.H2D)),
         "first", n, peak, lambda: pat.matches(a.host.array) and pat2.matches_device(b.dev.ptr)),
        ("bidir-total", None, ((a.dev.ptr, a.host.ptr, n, gpu.H2D), (b.host.ptr, b.dev.ptr, n, gpu.D2H)),
         SPAN, 2 * n, 2 * peak if peak else None,
         lambda: pat.matches_device(a.dev.ptr) and pat2.matches(b.host.array[:n])),
    )
    for direction, poisoned, copies, policy, nbytes, rec_peak, check in cases:
        if poisoned is not None and spec.verify:
            poisoned[1].fill(poisoned[0].host.array, invert=True)
        (d1, s1_, n1, k1), (d2, s2_, n2, k2) = copies

        def both(reps: int) -> None:  # called in this pass of the loop only
            for _ in range(reps):
                runtime.memcpyAsync(d1, s1_, n1, k1, stream.ptr)
                runtime.memcpyAsync(d2, s2_, n2, k2, s2.ptr)

        times, reps = timed(timer, both, spec.plan, policy=SPAN)
        verified = None
        if spec.verify:
            stream.synchronize()
            s2.synchronize()
            verified = check()
        out.append(_record(_params(g, direction), nbytes, [policy_seconds(t, policy) / reps for t in times], reps,
                           gated, verified, rec_peak))
    return out


def _one_way_records(ctx: Context, g: _Group, bufs: dict, direction: str) -> list[Record]:
    """One direction between the point's host and device buffers, on one lane: a CE copy (h2d, d2h),
    or nvbandwidth's host_to_device_memcpy_sm / device_to_host_memcpy_sm (its copy kernel on the GPU
    reading or writing page-locked host memory through UVA, 4 untimed copies behind the gate, bytes =
    what the kernel really moves: nvbandwidth's truncation, kernels.sm_copy_geometry)."""
    from cupy.cuda import runtime

    spec: CopySpec = ctx.spec
    a: _Pair = bufs["pair"]
    pat: gpu.Pattern = bufs["pattern"]
    stream = bufs["stream"]
    to_dev, sm = direction.startswith("h2d"), direction.endswith("-sm")
    src, dst = (a.host.ptr, a.dev.ptr) if to_dev else (a.dev.ptr, a.host.ptr)
    if sm:
        kernel, copied = kernels.sm_copy_enqueue(g.ordinal, dst, src, g.nbytes)
        if copied == 0:
            return [Record(params=_params(g, direction), nbytes=g.nbytes, error=f"skipped: {format_size(g.nbytes)} "
                           "is below one 16-byte element per thread of the copy kernel", extra={"skipped": True})]

        def enqueue(reps: int) -> None:
            kernel(stream, reps)
    else:
        copied, kind = g.nbytes, gpu.H2D if to_dev else gpu.D2H

        def enqueue(reps: int) -> None:
            for _ in range(reps):
                runtime.memcpyAsync(dst, src, copied, kind, stream.ptr)

    if not to_dev and spec.verify:
        pat.fill(a.host.array, invert=True)  # poison: the copies must overwrite it
    gated = sm or bufs["gated"]
    timer = GatedTimer([Lane(stream, g.ordinal, gated=gated, gate_timeout_s=GATE_TIMEOUT_S, enqueue=enqueue)])
    times, reps = timed(timer, enqueue, spec.plan, warm=WARMUP_COPIES if sm else 0)
    verified = None
    if spec.verify:
        stream.synchronize()
        verified = pat.matches_device(a.dev.ptr, copied) if to_dev else pat.matches(a.host.array[:copied])
    r = _record(_params(g, direction), copied, [t.span / reps for t in times], reps, gated, verified,
                ctx.data["peaks"].get(g.device))
    if sm:
        r.extra["kernel"] = kernels.sm_copy_geometry(g.nbytes, kernels.num_sms(g.ordinal))[0]
    return [r]


def _latency_records(ctx: Context, g: _Group, bufs: dict, direction: str) -> list[Record]:
    """nvbandwidth's host_device_latency_sm: one GPU thread follows a chain of pointers laid 128
    bytes apart over the page-locked host buffer (kernels.chase_layout); a sample is one launch of
    LATENCY_ACCESSES steps by one block, the block rotating over the SMs as nvbandwidth's loop
    does; the figure is seconds per access (nvbandwidth prints ns)."""
    import cupy

    spec: CopySpec = ctx.spec
    a: _Pair = bufs["pair"]
    params = _params(g, "latency")
    if g.nbytes < kernels.LATENCY_NODE_BYTES:
        return [Record(params=params, nbytes=g.nbytes, error="skipped: the latency chain needs at least 8 bytes",
                       extra={"skipped": True})]
    kernels.chase_layout(a.host.array)
    bufs["chased"] = True  # the pattern is gone from the host buffer
    chase = kernels.ptr_chase_enqueue(g.ordinal, a.host.ptr)
    stream = cupy.cuda.Stream(non_blocking=True)
    timer = GatedTimer([Lane(stream, g.ordinal, gated=False)])
    count = [0]

    def take() -> float:
        count[0] += 1
        return timer.time(lambda: chase(stream, LATENCY_ACCESSES, count[0])) / LATENCY_ACCESSES

    samples = sample_loop(take, spec.plan, LATENCY_ACCESSES)
    return [Record(params=params, metric="time", nbytes=kernels.LATENCY_NODE_BYTES, samples_s=samples,
                   reps=LATENCY_ACCESSES, extra={"gated": False, "accesses_per_sample": LATENCY_ACCESSES,
                                                 "stride_bytes": kernels.LATENCY_STRIDE * kernels.LATENCY_NODE_BYTES})]


def _d2d_records(ctx: Context, g: _Group, bufs: dict, direction: str) -> list[Record]:
    """nvbandwidth's device_local_copy: a CE copy between two buffers of one GPU, gated, bytes
    counted once (nbytes / time, as nvbandwidth counts copies)."""
    import cupy
    from cupy.cuda import runtime

    spec: CopySpec = ctx.spec
    n = g.nbytes
    with gpu.DeviceBuffer(n) as a, gpu.DeviceBuffer(n) as b:
        kernels.fill(g.ordinal, a.ptr, n, seed=n & 0xFFFFFFFF)
        stream = cupy.cuda.Stream(non_blocking=True)
        timer = GatedTimer([Lane(stream, g.ordinal, gate_timeout_s=GATE_TIMEOUT_S)])

        def enqueue(reps: int) -> None:
            for _ in range(reps):
                runtime.memcpyAsync(b.ptr, a.ptr, n, gpu.D2D, stream.ptr)

        times, reps = timed(timer, enqueue, spec.plan)
        verified = kernels.count_wrong(g.ordinal, b.ptr, n, seed=n & 0xFFFFFFFF) == 0 if spec.verify else None
        r = _record(_params(g, "d2d"), n, [t.span / reps for t in times], reps, True, verified, None)
        # each byte is read and written in the same memory: held against half its bandwidth
        limits.mark(r, limits.device_copy_peak_bytes_per_s(envmod.gpu_by_index(ctx.env, g.ordinal)),
                    "device memory bandwidth / 2 (read + write)")
        return [r]


def _host_records(ctx: Context, g: _Group) -> list[Record]:
    """Every host test of one (device, size, memory kind), sharing one buffer pair."""
    import cupy

    out: list[Record] = []
    a = _Pair(g.nbytes, g.memory)  # allocate first: a size that does not fit fails before any work
    bufs: dict = {"pair": a, "gated": g.memory != "pageable"}
    try:
        bufs["pattern"] = gpu.Pattern(g.nbytes, seed=g.nbytes)
        a.fill(bufs["pattern"])
        bufs["stream"] = cupy.cuda.Stream(non_blocking=True)
        for key in g.tests:
            t = TESTS[key]
            if t.locked_only and g.memory == "pageable":
                out += [Record(params=_params(g, d), nbytes=g.nbytes, error="skipped: needs page-locked host "
                               "memory (the GPU reads it directly)", extra={"skipped": True}) for d in t.directions()]
                continue
            if bufs.pop("chased", False):
                a.fill(bufs["pattern"])  # the latency chain overwrote the pattern
            out += t.measure(ctx, g, bufs, key)
        bufs["stream"].synchronize()
    finally:
        a.free()
        if "pair2" in bufs:
            bufs["pair2"].free()
    return out


def _all_devices_records(ctx: Context, g: _Group) -> list[Record]:
    """Every selected GPU copying at once (page-locked kinds only): per GPU (each lane's own events,
    nvbandwidth's VECTOR_BW) and aggregate (the sum of bytes over the longest lane's time)."""
    import cupy
    from cupy.cuda import runtime

    spec: CopySpec = ctx.spec
    devices, nbytes, kind, peaks = ctx.devices, g.nbytes, g.memory, ctx.data["peaks"]
    pairs: list[_Pair] = []
    out: list[Record] = []
    try:
        pat = gpu.Pattern(nbytes, seed=nbytes)
        lanes = []
        for d in devices:
            with cupy.cuda.Device(d):
                pairs.append(_Pair(nbytes, kind).fill(pat))
                lanes.append(Lane(cupy.cuda.Stream(non_blocking=True), d, gate_timeout_s=GATE_TIMEOUT_S))
        # each GPU released by its own gate: independent GPUs copying at once
        timer = GatedTimer(lanes, linked=False)
        for direction in g.tests:
            k = gpu.H2D if direction == "h2d" else gpu.D2H
            for p, ln in zip(pairs, lanes):
                src, dst = (p.host.ptr, p.dev.ptr) if k == gpu.H2D else (p.dev.ptr, p.host.ptr)
                ln.enqueue = (lambda reps, src=src, dst=dst, s=ln.stream:
                              [runtime.memcpyAsync(dst, src, nbytes, k, s.ptr) for _ in range(reps)])
            times, reps = timed(timer, None, spec.plan)
            out += [_record(dict(_params(g, direction), device=f"{d}@all"), nbytes,
                            [policy_seconds(t, "each", i) / reps for t in times], reps, True, None, peaks.get(d))
                    for i, d in enumerate(devices)]
            total_peak = sum(peaks.get(d) or 0 for d in devices) or None
            r = _record(_params(g, direction), nbytes * len(devices), [t.span / reps for t in times], reps, True, None,
                        total_peak)
            r.extra["aggregate"] = "sum of bytes over the time until the last GPU finished"
            out.append(r)
    finally:
        for d, p in zip(devices, pairs):
            with cupy.cuda.Device(d):
                p.free()
    return out


TESTS: dict[str, Test] = {t.key: t for t in (
    Test("h2d", "host_to_device_memcpy_ce", _one_way_records),
    Test("d2h", "device_to_host_memcpy_ce", _one_way_records),
    Test("bidir", "host_to_device_bidirectional_memcpy_ce", _bidir_records, device_units=3, host_units=3,
         records=("bidir-h2d", "bidir-d2h", "bidir-total")),
    Test("h2d-sm", "host_to_device_memcpy_sm", _one_way_records, locked_only=True),
    Test("d2h-sm", "device_to_host_memcpy_sm", _one_way_records, locked_only=True),
    Test("d2d", "device_local_copy", _d2d_records, host=False, device_units=2, host_units=0),
    Test("latency", "host_device_latency_sm", _latency_records, locked_only=True, device_units=0),
)}


class Copy(Benchmark):
    """The copy plug-in: points are (device, size, memory kind) with the tests of TESTS."""

    name = "copy"
    host_memory = True  # host buffers: the driver binds to the GPU's NUMA node first

    def points(self, spec: CopySpec, devices: tuple[int, ...]) -> list[Point]:
        out = []
        for g in _groups(spec, devices):
            tests = [TESTS[t] for t in g.tests]
            n = g.nbytes
            dev = max(t.device_units for t in tests) * n
            host = max(t.host_units for t in tests) * n
            locked = host if g.memory not in ("pageable", "device") else 0
            on = devices if g.device == "all" else (g.ordinal,)
            out.append(Point(f"GPU {g.device} {g.memory} {format_size(n)}", g, device_bytes=dev,
                             host_bytes=host * len(on), locked_bytes=locked * len(on), devices=on))
        return out

    def too_big_hint(self, spec: CopySpec) -> str:
        return "lower -e/--max-bytes"

    @contextlib.contextmanager
    def setup(self, ctx: Context):
        ctx.data["peaks"] = {d: (envmod.gpu_by_index(ctx.env, d) or {}).get("pcie_peak_bytes_per_s")
                             for d in ctx.devices}
        yield ctx

    def measure(self, ctx: Context, point: Point) -> list[Record]:
        import cupy

        g: _Group = point.key
        if g.device == "all":
            return _all_devices_records(ctx, g)
        with cupy.cuda.Device(g.device):
            if g.memory == "device":
                return [r for t in g.tests for r in TESTS[t].measure(ctx, g, {}, t)]
            return _host_records(ctx, g)

    def failed(self, ctx: Context, point: Point, message: str) -> list[Record]:
        g: _Group = point.key
        return [Record(params=_params(g, d), nbytes=g.nbytes, error=message)
                for t in g.tests for d in TESTS[t].directions()]

    def timing(self, ctx: Context) -> dict:
        return {
            "clock": "cuda-event",
            "method": "cudaMemcpyAsync on a non-blocking stream between CUDA events; page-locked kinds "
            "gated by a spin kernel with reps copies per sample (nvbandwidth's method); pageable one copy per sample",
            **ctx.spec.plan.to_dict(),
        }


BENCHMARK = Copy()


def run(spec: CopySpec, progress: ProgressSink | None = None) -> Result:
    """Run the copy sweep through :func:`gpubench.core.benchmark.run` (NoGPUError, UsageError,
    MachineError as it raises them): a record per (device, direction, memory kind, size); bidir's per
    direction ("bidir-h2d", "bidir-d2h", "bidir-total"); with several devices also "all" (aggregate)
    and "N@all" (GPU N while all copy); ``d2d`` records have memory "device", ``latency`` ones are times."""
    return driver.run(BENCHMARK, spec, progress)

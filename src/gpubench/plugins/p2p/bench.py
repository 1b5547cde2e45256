"""``gpubench p2p``: GPU-to-GPU copies for every ordered pair of the selected GPUs (docs/p2p.md).
``write`` / ``read`` / ``bidir`` / ``sm`` follow nvbandwidth's device_to_device tests, ``latency``
and the peer-off tests (staged through the host) p2pBandwidthLatencyTest. Every sample is
nvbandwidth's doMemcpyCore; its figure is ``nbytes * reps / elapsed``.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field
from typing import Callable

from gpubench.core import benchmark as driver
from gpubench.core import env as envmod
from gpubench.core import gpu, kernels
from gpubench.core.benchmark import DEVICE_MARGIN_BYTES, Benchmark, Context, Point
from gpubench.core.bounds import MAX_COUNT, bounded, check_bounds
from gpubench.core.errors import MachineError, UsageError, check_choices, first_line
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result
from gpubench.core.timing import GatedTimer, Lane, TimingPlan, choose_reps
from gpubench.core.units import format_size

TESTS = ("write", "read", "bidir", "sm", "latency", "off", "off-bidir", "off-latency")
PEER_OFF_TESTS = ("off", "off-bidir", "off-latency")
LATENCY_TESTS = ("latency", "off-latency")
BIDIR_TESTS = ("bidir", "off-bidir")

NVB_LOOP_COUNT = 16  # nvbandwidth --loopCount default
MAX_LOOP_COUNT = MAX_COUNT  # copies per sample given by --loop-count; beyond it is a typo
OFF_REPEAT = 5  # p2pBandwidthLatencyTest outputBandwidthMatrix / outputBidirectionalBandwidthMatrix: repeat = 5
WARMUP_COPIES = 4  # nvbandwidth memcpy.cpp WARMUP_COUNT, queued behind the gate before the start event
LATENCY_REPS = 100  # p2pBandwidthLatencyTest outputLatencyMatrix: repeat = 100
SAMPLE_TARGET_S = 0.2  # copies per sample are cut so a sample of slow (peer-off) copies lasts about this
OFF_GATE_TIMEOUT_S = 2.0  # the gate gives up on its own after this, so a host-blocking copy cannot hang

# cudaError_t values (CUDA runtime API, driver_types.h)
_PEER_ALREADY_ENABLED = 704
_PEER_NOT_ENABLED = 705


@dataclass(frozen=True)
class P2PSpec:
    """Parsed options of ``gpubench p2p``. ``loop_count`` None: 16 copies per sample with peer access on
    (nvbandwidth --loopCount) and 5 with it off (p2pBandwidthLatencyTest's repeat)."""

    devices: tuple[int, ...] | None = None  # two or more; None: every visible GPU
    tests: tuple[str, ...] = tuple(TESTS)  # in the order given
    nbytes: int = bounded(2**30, "-b/--nbytes", lo=1, unit="bytes")  # per bandwidth copy
    latency_bytes: int = bounded(16, "--latency-bytes", lo=1, unit="bytes")  # p2pBandwidthLatencyTest: one int4
    loop_count: int | None = bounded(None, "--loop-count", lo=1, hi=MAX_LOOP_COUNT)
    plan: TimingPlan = field(default_factory=lambda: TimingPlan(warmup=1, iters=5))  # iters must be set
    verify: bool = True  # fill the source, poison the destination, check it after the copies

    def __post_init__(self):
        """Raises UsageError: fewer than two devices, a test not known (or none), no fixed sample count, a field
        outside its bound."""
        check_bounds(self)
        if self.devices is not None and len(self.devices) < 2:
            named = ",".join(map(str, self.devices))
            raise UsageError(f"p2p needs two GPUs; -d {named!r} names {len(self.devices)}", "e.g. -d 0,1")
        check_choices("test", self.tests, TESTS)
        if self.plan.iters is None:  # the plan checks its own ranges
            raise UsageError("p2p needs a fixed number of samples (-n >= 1)")

    def to_dict(self) -> dict:
        return asdict(self)  # the plan (a dataclass) becomes a dict too


@dataclass(frozen=True)
class _Group:
    test: str
    src: int
    dst: int


def order_groups(tests: tuple[str, ...], devices: tuple[int, ...]) -> list[_Group]:
    """Every (test, src, dst) for ordered pairs src != dst; peer-off tests first, so peer access is
    enabled only once, after them (enabling and disabling it per pair costs ~100 ms each)."""
    pairs = [(i, j) for i in devices for j in devices if i != j]
    return [_Group(t, i, j) for t in sorted(tests, key=lambda t: t not in PEER_OFF_TESTS) for (i, j) in pairs]


def link_peak(env: dict, src: int, dst: int, peer_access: bool) -> tuple[float | None, str]:
    """(per-direction peak in B/s, label) of the path a copy from ``src`` to ``dst`` takes.

    With peer access: NVLink (env ``nvlink_peak_bytes_per_s_by_peer``) when the pair has links, else
    PCIe. Without it the copy is staged through the host, so the slower PCIe link of the two bounds it.
    """
    a = envmod.gpu_by_index(env, src) or {}
    b = envmod.gpu_by_index(env, dst) or {}
    topo = (env.get("topology") or {}).get(f"{min(src, dst)},{max(src, dst)}", "?")
    pcie = [p for p in (a.get("pcie_peak_bytes_per_s"), b.get("pcie_peak_bytes_per_s")) if p]
    pcie_peak = min(pcie) if pcie else None
    if not peer_access:
        return pcie_peak, "PCIe via host"
    return (a.get("nvlink_peak_bytes_per_s_by_peer") or {}).get(str(dst)) or pcie_peak, topo


class _Peers:
    """Peer access between pairs of GPUs, turned on or off both ways; remembers what it enabled."""

    def __init__(self):
        self.enabled: set[tuple[int, int]] = set()
        # set once a peer-off bandwidth copy blocked the host past the gate's timeout: the later
        # peer-off bandwidth groups of the run are then timed without the gate from the start
        self.off_blocks_host = False

    def can(self, i: int, j: int) -> bool:
        from cupy.cuda import runtime

        return bool(runtime.deviceCanAccessPeer(i, j)) and bool(runtime.deviceCanAccessPeer(j, i))

    def set(self, i: int, j: int, on: bool) -> None:
        import cupy
        from cupy.cuda import runtime

        for a, b in ((i, j), (j, i)):
            with cupy.cuda.Device(a):
                try:
                    (runtime.deviceEnablePeerAccess if on else runtime.deviceDisablePeerAccess)(b)
                except runtime.CUDARuntimeError as e:
                    if getattr(e, "status", None) not in (_PEER_ALREADY_ENABLED, _PEER_NOT_ENABLED):
                        raise
            (self.enabled.add if on else self.enabled.discard)((a, b))

    def restore(self) -> None:
        """Disable what this run enabled (best effort: never masks the run's own error)."""
        for a, b in sorted(self.enabled):
            with contextlib.suppress(Exception):
                self.set(a, b, False)
        self.enabled.clear()


def _lane(device: int, enqueue, gate_timeout_s: float) -> Lane:
    """One stream of ``device`` doing one kind of copy; ``enqueue(stream, k)`` queues k copies."""
    import cupy

    with cupy.cuda.Device(device):
        stream = cupy.cuda.Stream(non_blocking=True)
    return Lane(stream, device, enqueue=lambda k: enqueue(stream, k), gate_timeout_s=gate_timeout_s)


def _run_lanes(lanes: list[Lane], reps: int, plan: TimingPlan, warm: int = WARMUP_COPIES):
    """Warm-up samples, then plan.iters samples of the lanes released together (the core's
    GatedTimer: nvbandwidth's doMemcpyCore). Returns (per-lane lists, span list, max queue s)."""
    timer = GatedTimer(lanes)
    for _ in range(plan.warmup):
        timer.sample(reps=reps, warm=warm)
    got = [timer.sample(reps=reps, warm=warm) for _ in range(plan.iters or 1)]
    return ([list(x) for x in zip(*(t.per_lane for t in got))], [t.span for t in got],
            max(0.0, *(t.queued_s for t in got)))


def _ce_enqueue(dst_ptr: int, dst_dev: int, src_ptr: int, src_dev: int, nbytes: int, peer_api: bool):
    from cupy.cuda import runtime

    if peer_api:
        def enqueue(stream, k):
            for _ in range(k):
                runtime.memcpyPeerAsync(dst_ptr, dst_dev, src_ptr, src_dev, nbytes, stream.ptr)
    else:
        def enqueue(stream, k):
            for _ in range(k):
                runtime.memcpyAsync(dst_ptr, src_ptr, nbytes, gpu.DEFAULT, stream.ptr)
    return enqueue


def loop_count(spec: P2PSpec, test: str) -> int:
    """Copies per sample for ``test``: --loop-count if given, else the followed tool's default."""
    return spec.loop_count or (OFF_REPEAT if test in PEER_OFF_TESTS else NVB_LOOP_COUNT)


def bidir_records(base: dict, copied: int, per: list[list[float]], spans: list[float], reps: int, test: str,
                  extra: dict, peak: float | None, peak_rev: float | None, rev_device: int) -> list[Record]:
    """The forward, reverse and total bandwidth records of a bidirectional test.

    ``per``: [forward, reverse] seconds per sample of ``reps`` copies of ``copied`` bytes, each from
    its own stream's events; ``spans``: seconds until both finished; peaks in B/s. Samples are
    seconds per copy (per copy pair for the total, nbytes 2 * copied). The total: bidir (nvbandwidth)
    2 * copied / (bw_forward + bw_reverse); off-bidir (p2pBandwidthLatencyTest
    outputBidirectionalBandwidthMatrix) both directions' bytes over the span. The other rule's
    samples go in extra ("span_samples_s" or "sum_rule_samples_s").
    """
    fwd = [t / reps for t in per[0]]
    rev = [t / reps for t in per[1]]
    span = [s / reps for s in spans]
    summed = [2 * copied / (copied / a + copied / b) for a, b in zip(fwd, rev)]
    both_peak = (peak + peak_rev) if (peak and peak_rev) else None
    if test == "off-bidir":
        total, rule, other = span, "both directions' bytes over the time until both finished " \
                                   "(p2pBandwidthLatencyTest)", {"sum_rule_samples_s": summed}
    else:
        total, rule, other = summed, "sum of the two directions' bandwidths per sample (nvbandwidth)", \
            {"span_samples_s": span}
    return [
        _bw_record({**base, "nbytes": copied, "part": "forward"}, copied, fwd, reps,
                   {**extra, "peak_bytes_per_s": peak}),
        _bw_record({**base, "nbytes": copied, "part": "reverse"}, copied, rev, reps,
                   {**extra, "peak_bytes_per_s": peak_rev, "stream_device": rev_device}),
        _bw_record({**base, "nbytes": copied, "part": "total"}, 2 * copied, total, reps,
                   {**extra, "peak_bytes_per_s": both_peak, "total_rule": rule, **other}),
    ]


def _bw_record(params, nbytes, per_copy_s, reps, extra) -> Record:
    r = Record(params=params, metric="bandwidth", nbytes=nbytes, samples_s=list(per_copy_s), reps=reps, extra=extra)
    r.mark_peak(extra.get("peak_bytes_per_s"))
    return r


@dataclass(frozen=True)
class _PairBuffers:
    """One (src i, dst j) point's filled buffers, for a test's lane builder."""

    i: int
    j: int
    n: int
    seed: int
    src: gpu.DeviceBuffer
    dst: gpu.DeviceBuffer
    alloc: Callable[[int, int], gpu.DeviceBuffer]
    gate_timeout: float
    off: bool
    base: dict


def _one_way(b: _PairBuffers, reader: bool):
    """One CE copy src -> dst on the source's stream (write: pushed) or the destination's (read:
    pulled); with peer access off through cudaMemcpyPeerAsync (staged through the host)."""
    lane_dev = b.j if reader else b.i
    lanes = [_lane(lane_dev, _ce_enqueue(b.dst.ptr, b.j, b.src.ptr, b.i, b.n, b.off), b.gate_timeout)]
    return lanes, [(b.j, b.dst.ptr, b.n, b.seed)], b.n


def _both_ways(b: _PairBuffers, pull: bool):
    """Both directions at once: each pulled by its destination's stream (nvbandwidth's bidir read)
    or pushed by each source through the peer API (p2pBandwidthLatencyTest's bidirectional test)."""
    i, j, n = b.i, b.j, b.n
    src2 = b.alloc(j, n)
    dst2 = b.alloc(i, n)
    kernels.fill(j, src2.ptr, n, b.seed + 1)
    kernels.fill(i, dst2.ptr, n, (b.seed + 1) ^ 0x5A5A)
    lanes = [_lane(j if pull else i, _ce_enqueue(b.dst.ptr, j, b.src.ptr, i, n, not pull), b.gate_timeout),
             _lane(i if pull else j, _ce_enqueue(dst2.ptr, i, src2.ptr, j, n, not pull), b.gate_timeout)]
    return lanes, [(j, b.dst.ptr, n, b.seed), (i, dst2.ptr, n, b.seed + 1)], n


def _sm_read(b: _PairBuffers):
    """nvbandwidth's copy kernel on the destination GPU reading the peer's memory."""
    enqueue, copied = kernels.sm_copy_enqueue(b.j, b.dst.ptr, b.src.ptr, b.n)
    if copied == 0:
        return [Record(params={**b.base, "nbytes": b.n}, nbytes=b.n,
                       error=f"{format_size(b.n)} is too small for the copy kernel (16 bytes at least)")]
    return [_lane(b.j, enqueue, b.gate_timeout)], [(b.j, b.dst.ptr, copied, b.seed)], copied


# test -> (the point's buffers) -> (lanes, checks, bytes per copy), or error records; a check is
# (device, address, bytes, seed) of a destination to count wrong bytes in
LANES: dict[str, Callable[[_PairBuffers], tuple[list[Lane], list[tuple[int, int, int, int]], int] | list[Record]]] = {
    "write": lambda b: _one_way(b, reader=False),
    "read": lambda b: _one_way(b, reader=True),
    "bidir": lambda b: _both_ways(b, pull=True),
    "sm": _sm_read,
    "latency": lambda b: _one_way(b, reader=False),
    "off": lambda b: _one_way(b, reader=False),
    "off-bidir": lambda b: _both_ways(b, pull=False),
    "off-latency": lambda b: _one_way(b, reader=False),
}


def _error_records(spec: P2PSpec, g: _Group, error: str, extra: dict | None = None) -> list[Record]:
    """The records of a point that did not run: one per part of its test."""
    n = spec.latency_bytes if g.test in LATENCY_TESTS else spec.nbytes
    parts = ("forward", "reverse", "total") if g.test in BIDIR_TESTS else (None,)
    return [Record(params={"test": g.test, "src": g.src, "dst": g.dst, "nbytes": n, **({"part": p} if p else {})},
                   nbytes=n, error=error, extra=dict(extra or {})) for p in parts]


def _measure_group(g: _Group, spec: P2PSpec, env: dict, peers: _Peers) -> list[Record]:
    import cupy

    i, j, test = g.src, g.dst, g.test
    off = test in PEER_OFF_TESTS
    base = {"test": test, "src": i, "dst": j}
    can = peers.can(i, j)
    if not off and not can:
        return _error_records(spec, g, f"no peer access between GPU {i} and GPU {j} (cudaDeviceCanAccessPeer = 0)",
                              {"peer_access_capable": False})
    peers.set(i, j, on=not off)
    peak, link = link_peak(env, i, j, peer_access=not off)
    gate_timeout = OFF_GATE_TIMEOUT_S if off else 10.0
    n = spec.latency_bytes if test in LATENCY_TESTS else spec.nbytes
    bufs: list[tuple[int, gpu.DeviceBuffer]] = []

    def alloc(dev, size):
        with cupy.cuda.Device(dev):
            b = gpu.DeviceBuffer(size)
        bufs.append((dev, b))
        return b

    seed = (1000 * i + j) & 0xFFFF
    try:
        src = alloc(i, n)
        dst = alloc(j, n)
        # never time on zeros: fill the source with a pattern, poison the destination
        kernels.fill(i, src.ptr, n, seed)
        kernels.fill(j, dst.ptr, n, seed ^ 0x5A5A)
        built = LANES[test](_PairBuffers(i, j, n, seed, src, dst, alloc, gate_timeout, off, base))
        if isinstance(built, list):
            return built
        lanes, checks, copied = built

        def ungate() -> None:
            for ln in lanes:
                ln.gate = None

        if test in LATENCY_TESTS:
            reps = LATENCY_REPS
        else:
            if off and peers.off_blocks_host:
                ungate()
            # nvbandwidth's loop count, cut so a sample of slow copies stays about SAMPLE_TARGET_S
            probe, _, probe_queued = _run_lanes(lanes, 1, TimingPlan(warmup=0, iters=1), warm=0)
            reps = choose_reps(max(probe[0]), target=SAMPLE_TARGET_S, cap=loop_count(spec, test))
            if lanes[0].gate is not None and probe_queued >= 0.9 * gate_timeout:
                # queueing one copy already outlasted the gate: every gated sample would wait for
                # its timeout (2 s) and be thrown away, so time this point without the gate
                ungate()
                if off:
                    peers.off_blocks_host = True
        gated = lanes[0].gate is not None
        per, spans, queued = _run_lanes(lanes, reps, spec.plan)
        gate_expired = not gated or queued >= 0.9 * gate_timeout
        if gated and gate_expired:
            # the copies blocked the host while the gate held the stream: measure again without the
            # gate (events then time the copies as the host queues them; launch cost included)
            ungate()
            per, spans, queued = _run_lanes(lanes, reps, spec.plan)
        for ln in lanes:
            ln.stream.synchronize()
        wrong = sum(kernels.count_wrong(d, p, size, s) for d, p, size, s in checks) if spec.verify else None
        extra = {"peer_access": not off, "peer_access_capable": can, "link": link,
                 "verified": None if wrong is None else wrong == 0, "wrong_bytes": wrong,
                 "gate_expired": gate_expired, "gated": not gate_expired, "stream_device": lanes[0].device}
        if gate_expired:
            extra["note"] = ("queueing the copies blocked the host while the spin kernel held the stream, so "
                             "they were timed without it; the figure includes launch time")
        if test in LATENCY_TESTS:
            return [Record(params={**base, "nbytes": n}, metric="time", nbytes=n,
                           samples_s=[t / reps for t in per[0]], reps=reps, extra=extra)]
        if test in BIDIR_TESTS:
            peak_rev, _ = link_peak(env, j, i, peer_access=not off)
            return bidir_records(base, copied, per, spans, reps, test, extra, peak, peak_rev, lanes[1].device)
        extra["peak_bytes_per_s"] = peak
        if test == "sm":
            extra["kernel"] = kernels.sm_copy_geometry(n, kernels.num_sms(j))[0]
            extra["requested_nbytes"] = n
        return [_bw_record({**base, "nbytes": copied}, copied, [t / reps for t in per[0]], reps, extra)]
    finally:
        for dev, b in bufs:
            with cupy.cuda.Device(dev):
                b.free()


class P2P(Benchmark):
    """The p2p plug-in: a point is (test, src, dst) for every ordered pair; peer-off tests first."""

    name = "p2p"
    host_memory = True  # host buffers: the driver binds to the GPU's NUMA node first

    def devices(self, spec: P2PSpec) -> tuple[int, ...]:
        """-d checked against the visible GPUs, or every visible GPU; raises NoGPUError (none visible) or
        UsageError (fewer than two GPUs, or an id that is not visible)."""
        gpu.require_gpu()
        n = gpu.device_count()
        if spec.devices is None:
            if n < 2:
                raise UsageError(f"p2p needs two GPUs; this machine shows {n} CUDA device",
                                 "CUDA_VISIBLE_DEVICES may hide the others")
            return tuple(range(n))
        return gpu.resolve_devices(spec.devices, minimum=2)

    def points(self, spec: P2PSpec, devices: tuple[int, ...]) -> list[Point]:
        return [Point(f"{g.test} GPU {g.src} -> GPU {g.dst}", g, devices=(g.src, g.dst))
                for g in order_groups(spec.tests, devices)]

    def preflight(self, spec: P2PSpec, points, devices) -> None:
        """Each GPU must hold two buffers of -b (bidirectional tests); the message says which size fits."""
        per_dev = (2 if any(t in BIDIR_TESTS for t in spec.tests) else 1) * spec.nbytes
        for d in devices:
            free, _total = gpu.device_free_bytes(d)
            if per_dev + DEVICE_MARGIN_BYTES > free:
                fit = max(0, free - DEVICE_MARGIN_BYTES) // (per_dev // spec.nbytes)
                raise UsageError(f"-b {format_size(spec.nbytes)} needs {format_size(per_dev)} on GPU {d}, which has "
                                 f"{format_size(free)} free", f"use -b {format_size(fit)} or less")

    @contextlib.contextmanager
    def setup(self, ctx: Context):
        peers = _Peers()
        ctx.data["peers"] = peers
        ctx.env["peer_access"] = {f"{i},{j}": peers.can(i, j) for i in ctx.devices for j in ctx.devices if i < j}
        try:
            yield ctx
        finally:
            peers.restore()

    def measure(self, ctx: Context, point: Point) -> list[Record]:
        import cupy

        g: _Group = point.key
        try:
            return _measure_group(g, ctx.spec, ctx.env, ctx.data["peers"])
        except cupy.cuda.compiler.CompileException as e:
            raise MachineError(f"the copy kernels did not compile: {first_line(e)}") from None

    def failed(self, ctx: Context, point: Point, message: str) -> list[Record]:
        return _error_records(ctx.spec, point.key, message)

    def spec_dict(self, ctx: Context) -> dict:
        return {**ctx.spec.to_dict(), "devices": list(ctx.devices)}

    def timing(self, ctx: Context) -> dict:
        return {
            "clock": "cuda-event",
            "method": "nvbandwidth doMemcpyCore: streams held by a spin kernel, 4 warm-up copies, start "
                      "events (aligned across streams), reps copies, end events, release; per-copy seconds = "
                      "elapsed / reps; latency: p2pBandwidthLatencyTest, 100 copies per sample",
            "warmup_copies": WARMUP_COPIES,
            "latency_reps": LATENCY_REPS,
            **ctx.spec.plan.to_dict(),
        }


BENCHMARK = P2P()


def run(spec: P2PSpec, progress: ProgressSink | None = None) -> Result:
    """Measure every selected test for every ordered pair of GPUs through :func:`gpubench.core.benchmark.run`
    (NoGPUError, UsageError, MachineError as it raises them): a record per (test, src, dst), parts
    forward, reverse and total for bidirectional tests; extra holds the link, its peak, % of it, the
    peer-access state and the verification."""
    return driver.run(BENCHMARK, spec, progress)

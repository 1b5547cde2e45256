"""``gpubench p2p``: GPU-to-GPU copies for every ordered pair of the selected GPUs.

Methods (see docs/p2p.md), matched to the reference tools:

- ``write`` / ``read`` (nvbandwidth device_to_device_memcpy_write_ce / _read_ce): peer access enabled
  both ways; ``cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault)`` on a non-blocking stream of the
  source GPU (write, the copy engine pushes) or of the destination GPU (read, it pulls).
- ``bidir`` (nvbandwidth device_to_device_bidirectional_memcpy_read_ce): both directions at once,
  each pulled by its destination's stream; per direction = its own events; total = the sum of the
  two directions' bandwidths per sample (nvbandwidth's rule). The time until both finished is kept
  too (``extra.span_samples_s``, p2pBandwidthLatencyTest's rule).
- ``sm`` (nvbandwidth device_to_device_memcpy_read_sm): nvbandwidth's copy kernel, run on the
  destination GPU, reading the peer's memory; sizes truncated as nvbandwidth does.
- ``latency`` / ``off-latency`` (p2pBandwidthLatencyTest): 100 copies of 16 bytes (one int4) per
  sample, pushed by the source's stream, time per copy.
- ``off`` / ``off-bidir`` / ``off-latency``: peer access disabled (``cudaDeviceDisablePeerAccess``);
  ``cudaMemcpyPeerAsync`` then stages through host memory (p2pBandwidthLatencyTest "P2P=Disabled",
  5 copies per sample as its ``repeat``; off-bidir pushes both ways as that test does, and its total
  is that test's: both directions' bytes over the time until both finished).

Every sample (nvbandwidth's doMemcpyCore): a spinning kernel holds each stream, 4 untimed warm-up
copies are queued, the start event is recorded (other streams wait on the first one's), ``reps``
copies are queued, end events recorded, then the streams are released together. The figure of a
sample is ``nbytes * reps / elapsed``; the report shows the median over samples.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from gpubench.core import env as envmod
from gpubench.core import gpu
from gpubench.core.errors import MachineError, UsageError, check_choices
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result
from gpubench.core.sweep import run_groups
from gpubench.core.timing import CudaEventClock, TimingPlan, choose_reps
from gpubench.core.units import format_size

TESTS: dict[str, str] = {
    "write": "CE copy pushed by the source GPU, peer access on (nvbandwidth d2d write CE)",
    "read": "CE copy pulled by the destination GPU, peer access on (nvbandwidth d2d read CE)",
    "bidir": "both directions at once, each pulled by its destination (nvbandwidth d2d bidir read CE)",
    "sm": "copy kernel on the destination GPU reading the peer's memory (nvbandwidth d2d read SM)",
    "latency": "time of one 16-byte copy, peer access on (p2pBandwidthLatencyTest P2P writes)",
    "off": "copy with peer access disabled, staged through the host (p2pBandwidthLatencyTest)",
    "off-bidir": "both directions at once with peer access disabled (p2pBandwidthLatencyTest)",
    "off-latency": "time of one 16-byte copy with peer access disabled (p2pBandwidthLatencyTest)",
}
PEER_OFF_TESTS = ("off", "off-bidir", "off-latency")
LATENCY_TESTS = ("latency", "off-latency")
BIDIR_TESTS = ("bidir", "off-bidir")

NVB_LOOP_COUNT = 16  # nvbandwidth --loopCount default
OFF_REPEAT = 5  # p2pBandwidthLatencyTest outputBandwidthMatrix / outputBidirectionalBandwidthMatrix: repeat = 5
WARMUP_COPIES = 4  # nvbandwidth memcpy.cpp WARMUP_COUNT, queued behind the gate before the start event
LATENCY_REPS = 100  # p2pBandwidthLatencyTest outputLatencyMatrix: repeat = 100
SM_THREADS_PER_BLOCK = 512  # nvbandwidth common.h numThreadPerBlock
SM_SMALL_BUFFER = 64 * 2**20  # nvbandwidth smallBufferThreshold (64 MiB): below it the simple kernel
DEVICE_MARGIN_BYTES = 512 * 2**20
SAMPLE_TARGET_S = 0.2  # copies per sample are cut so a sample of slow (peer-off) copies lasts about this
OFF_GATE_TIMEOUT_S = 2.0  # the gate gives up on its own after this, so a host-blocking copy cannot hang

# cudaError_t values (CUDA runtime API, driver_types.h)
_PEER_ALREADY_ENABLED = 704
_PEER_NOT_ENABLED = 705


@dataclass(frozen=True)
class P2PSpec:
    """Parsed options of ``gpubench p2p``.

    Attributes:
        devices: CUDA ordinals (two or more), or None for every visible GPU.
        tests: subset of TESTS, in the order given.
        nbytes: bytes per bandwidth copy (default 1 GiB).
        latency_bytes: bytes per latency copy (p2pBandwidthLatencyTest: one int4, 16 bytes).
        loop_count: copies per sample; None: 16 with peer access on (nvbandwidth --loopCount) and 5 with
            it off (p2pBandwidthLatencyTest's repeat), the tool each test follows.
        plan: warm-up samples and timed samples (``iters`` must be set).
        verify: fill the source with a pattern, poison the destination, check it after the copies.
    """

    devices: tuple[int, ...] | None = None
    tests: tuple[str, ...] = tuple(TESTS)
    nbytes: int = 2**30
    latency_bytes: int = 16
    loop_count: int | None = None
    plan: TimingPlan = field(default_factory=lambda: TimingPlan(warmup=1, iters=5))
    verify: bool = True

    def __post_init__(self):
        check_choices("test", self.tests, TESTS)
        if self.devices is not None and len(self.devices) < 2:
            raise UsageError(f"p2p needs two GPUs; -d names {len(self.devices)}", "e.g. -d 0,1")
        if self.plan.iters is None or self.plan.iters < 1:
            raise UsageError("p2p needs a fixed number of samples (-n >= 1)")
        if self.nbytes < 1 or self.latency_bytes < 1 or (self.loop_count is not None and self.loop_count < 1):
            raise UsageError("sizes and --loop-count must be >= 1")

    def to_dict(self) -> dict:
        return asdict(self)  # the plan (a dataclass) becomes a dict too


@dataclass(frozen=True)
class _Group:
    test: str
    src: int
    dst: int


def _label(g: _Group) -> str:
    return f"{g.test} GPU {g.src} -> GPU {g.dst}"


def order_groups(tests: tuple[str, ...], devices: tuple[int, ...]) -> list[_Group]:
    """Every (test, src, dst) for ordered pairs src != dst; peer-off tests first, so peer access is
    enabled only once, after them (enabling and disabling it per pair costs ~100 ms each)."""
    pairs = [(i, j) for i in devices for j in devices if i != j]
    off = [t for t in tests if t in PEER_OFF_TESTS]
    on = [t for t in tests if t not in PEER_OFF_TESTS]
    return [_Group(t, i, j) for t in off for (i, j) in pairs] + [_Group(t, i, j) for t in on for (i, j) in pairs]


def sm_copy_geometry(nbytes: int, num_sms: int) -> tuple[str, int, int, int]:
    """How nvbandwidth's copyKernel splits a copy (kernels.cu, memcpy.cpp getAdjustedCopySize).

    Returns:
        (kernel, grid, block, copied_bytes): "simple" below 64 MiB (block = min(uint4s, 1024),
        grid = uint4s // block), else "striding" (grid = SMs, block = 512, the copy truncated to a
        multiple of SMs * 512 uint4s). copied_bytes is what the kernel really moves; 0 if too small.
    """
    n16 = nbytes // 16
    if nbytes < SM_SMALL_BUFFER:
        if n16 == 0:
            return "simple", 0, 0, 0
        block = min(n16, 1024)
        grid = n16 // block
        return "simple", grid, block, grid * block * 16
    total = num_sms * SM_THREADS_PER_BLOCK
    elems = total * (n16 // total)
    return "striding", num_sms, SM_THREADS_PER_BLOCK, elems * 16


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
    if peer_access:
        nv = (a.get("nvlink_peak_bytes_per_s_by_peer") or {}).get(str(dst))
        if nv:
            return nv, topo
        return pcie_peak, topo
    return pcie_peak, "PCIe via host"


_KERNELS_SRC = r"""
__device__ __forceinline__ uint4 gb_ldcg(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ void gb_stcg(uint4* p, uint4 v) {
    asm volatile("st.global.cg.v4.u32 [%0], {%1,%2,%3,%4};"
                 :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
// nvbandwidth kernels.cu simpleCopyKernel (__ldcg/__stcg written as PTX for NVRTC)
extern "C" __global__ void gb_simple_copy(unsigned long long loopCount, uint4* dst, const uint4* src) {
    for (unsigned int i = 0; i < loopCount; i++) {
        const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
        gb_stcg(dst + idx, gb_ldcg(src + idx));
    }
}
// nvbandwidth kernels.cu stridingMemcpyKernel
extern "C" __global__ void gb_striding_copy(unsigned int totalThreadCount, unsigned long long loopCount,
                                            uint4* dst, const uint4* src, unsigned long long chunkSizeInElement) {
    unsigned long long from = blockDim.x * blockIdx.x + threadIdx.x;
    unsigned long long bigChunkSizeInElement = chunkSizeInElement / 12;
    dst += from;
    src += from;
    uint4* dstBigEnd = dst + (bigChunkSizeInElement * 12) * totalThreadCount;
    uint4* dstEnd = dst + chunkSizeInElement * totalThreadCount;
    for (unsigned int i = 0; i < loopCount; i++) {
        uint4* cdst = dst;
        const uint4* csrc = src;
        while (cdst < dstBigEnd) {
            uint4 p0 = *csrc; csrc += totalThreadCount;
            uint4 p1 = *csrc; csrc += totalThreadCount;
            uint4 p2 = *csrc; csrc += totalThreadCount;
            uint4 p3 = *csrc; csrc += totalThreadCount;
            uint4 p4 = *csrc; csrc += totalThreadCount;
            uint4 p5 = *csrc; csrc += totalThreadCount;
            uint4 p6 = *csrc; csrc += totalThreadCount;
            uint4 p7 = *csrc; csrc += totalThreadCount;
            uint4 p8 = *csrc; csrc += totalThreadCount;
            uint4 p9 = *csrc; csrc += totalThreadCount;
            uint4 p10 = *csrc; csrc += totalThreadCount;
            uint4 p11 = *csrc; csrc += totalThreadCount;
            *cdst = p0; cdst += totalThreadCount;
            *cdst = p1; cdst += totalThreadCount;
            *cdst = p2; cdst += totalThreadCount;
            *cdst = p3; cdst += totalThreadCount;
            *cdst = p4; cdst += totalThreadCount;
            *cdst = p5; cdst += totalThreadCount;
            *cdst = p6; cdst += totalThreadCount;
            *cdst = p7; cdst += totalThreadCount;
            *cdst = p8; cdst += totalThreadCount;
            *cdst = p9; cdst += totalThreadCount;
            *cdst = p10; cdst += totalThreadCount;
            *cdst = p11; cdst += totalThreadCount;
        }
        while (cdst < dstEnd) {
            *cdst = *csrc; cdst += totalThreadCount; csrc += totalThreadCount;
        }
    }
}
__device__ __forceinline__ unsigned char gb_pattern(unsigned long long i, unsigned int seed) {
    unsigned int x = (unsigned int)i * 2654435761u ^ seed;
    x ^= x >> 13; x *= 0x5bd1e995u; x ^= x >> 15;
    return (unsigned char)x;
}
extern "C" __global__ void gb_fill(unsigned char* p, unsigned long long n, unsigned int seed) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        p[i] = gb_pattern(i, seed);
}
extern "C" __global__ void gb_count_wrong(const unsigned char* p, unsigned long long n, unsigned int seed,
                                          unsigned long long* wrong) {
    unsigned long long bad = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        bad += (p[i] != gb_pattern(i, seed));
    if (bad) atomicAdd(wrong, bad);
}
"""
_modules: dict[int, object] = {}


def _module():
    """The kernels above as a cupy.RawModule for the current device (compiled once per device)."""
    import cupy

    dev = cupy.cuda.Device().id
    if dev not in _modules:
        _modules[dev] = cupy.RawModule(code=_KERNELS_SRC)
    return _modules[dev]


def _num_sms(device: int) -> int:
    from cupy.cuda import runtime

    return runtime.deviceGetAttribute(runtime.cudaDevAttrMultiProcessorCount, device)


def _fill(device: int, ptr: int, nbytes: int, seed: int) -> None:
    import cupy
    import numpy as np

    with cupy.cuda.Device(device):
        k = _module().get_function("gb_fill")
        k((_num_sms(device) * 4,), (256,), (np.uint64(ptr), np.uint64(nbytes), np.uint32(seed)))
        cupy.cuda.Device().synchronize()


def _count_wrong(device: int, ptr: int, nbytes: int, seed: int) -> int:
    import cupy
    import numpy as np

    with cupy.cuda.Device(device):
        wrong = cupy.zeros(1, dtype=cupy.uint64)
        k = _module().get_function("gb_count_wrong")
        k((_num_sms(device) * 4,), (256,), (np.uint64(ptr), np.uint64(nbytes), np.uint32(seed), wrong))
        return int(wrong.get()[0])


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
                    if on:
                        runtime.deviceEnablePeerAccess(b)
                    else:
                        runtime.deviceDisablePeerAccess(b)
                except runtime.CUDARuntimeError as e:
                    if getattr(e, "status", None) not in (_PEER_ALREADY_ENABLED, _PEER_NOT_ENABLED):
                        raise
            if on:
                self.enabled.add((a, b))
            else:
                self.enabled.discard((a, b))

    def restore(self) -> None:
        """Disable what this run enabled (best effort: never masks the run's own error)."""
        for a, b in sorted(self.enabled):
            try:
                self.set(a, b, False)
            except Exception:
                pass
        self.enabled.clear()


class _Lane:
    """One stream doing one kind of copy: its device, a gate, an event clock, and how to enqueue."""

    def __init__(self, device: int, enqueue, gate_timeout_s: float):
        import cupy

        self.device = device
        self.enqueue = enqueue  # enqueue(stream, k): queue k copies (or one kernel looping k times)
        with cupy.cuda.Device(device):
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self.gate = gpu.SpinGate(self.stream, timeout_s=gate_timeout_s)
            self.clock = CudaEventClock(self.stream)
            self.span_end = cupy.cuda.Event()


def _sample(lanes: list[_Lane], reps: int, warm: int) -> tuple[list[float], float, float]:
    """One nvbandwidth-style sample over all lanes at once.

    Returns:
        (per-lane elapsed seconds, seconds until every lane finished, host seconds spent queueing).
    """
    import cupy

    t0 = time.perf_counter()
    first = lanes[0]
    try:
        for ln in lanes:
            with cupy.cuda.Device(ln.device):
                if ln.gate is not None:
                    ln.gate.hold()
                if warm:
                    ln.enqueue(ln.stream, warm)
        with cupy.cuda.Device(first.device):
            first.clock.start()
        for ln in lanes[1:]:
            with cupy.cuda.Device(ln.device):
                ln.stream.wait_event(first.clock._start)
                ln.clock.start()
        for ln in lanes:
            with cupy.cuda.Device(ln.device):
                ln.enqueue(ln.stream, reps)
                ln.clock.mark_end()
        with cupy.cuda.Device(first.device):
            for ln in lanes[1:]:
                first.stream.wait_event(ln.clock._end)
            first.span_end.record(first.stream)
        queued = time.perf_counter() - t0
    finally:
        for ln in lanes:
            if ln.gate is not None:
                ln.gate.release()
    per = []
    for ln in lanes:
        with cupy.cuda.Device(ln.device):
            per.append(ln.clock.elapsed())
    with cupy.cuda.Device(first.device):
        first.span_end.synchronize()
        span = cupy.cuda.get_elapsed_time(first.clock._start, first.span_end) / 1e3
    return per, span, queued


def _run_lanes(lanes: list[_Lane], reps: int, plan: TimingPlan, warm: int = WARMUP_COPIES):
    """Warm-up samples, then plan.iters samples. Returns (per-lane lists, span list, max queue s)."""
    for _ in range(plan.warmup):
        _sample(lanes, reps, warm)
    per: list[list[float]] = [[] for _ in lanes]
    spans: list[float] = []
    queued = 0.0
    for _ in range(plan.iters or 1):
        p, s, q = _sample(lanes, reps, warm)
        for i, t in enumerate(p):
            per[i].append(t)
        spans.append(s)
        queued = max(queued, q)
    return per, spans, queued


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


def _sm_enqueue(device: int, dst_ptr: int, src_ptr: int, nbytes: int):
    import numpy as np

    sms = _num_sms(device)
    kind, grid, block, copied = sm_copy_geometry(nbytes, sms)
    import cupy

    with cupy.cuda.Device(device):
        mod = _module()
        if kind == "simple":
            fn = mod.get_function("gb_simple_copy")

            def enqueue(stream, k):
                fn((grid,), (block,), (np.uint64(k), np.uint64(dst_ptr), np.uint64(src_ptr)), stream=stream)
        else:
            fn = mod.get_function("gb_striding_copy")
            total = grid * block
            chunk = copied // 16 // total

            def enqueue(stream, k):
                fn((grid,), (block,), (np.uint32(total), np.uint64(k), np.uint64(dst_ptr), np.uint64(src_ptr),
                                       np.uint64(chunk)), stream=stream)
    return enqueue, copied


def loop_count(spec: P2PSpec, test: str) -> int:
    """Copies per sample for ``test``: --loop-count if given, else the followed tool's default."""
    if spec.loop_count is not None:
        return spec.loop_count
    return OFF_REPEAT if test in PEER_OFF_TESTS else NVB_LOOP_COUNT


def bidir_records(base: dict, copied: int, per: list[list[float]], spans: list[float], reps: int, test: str,
                  extra: dict, peak: float | None, peak_rev: float | None, rev_device: int) -> list[Record]:
    """The forward, reverse and total records of a bidirectional test.

    Args:
        base: params shared by the three records (test, src, dst).
        copied: bytes per copy in each direction.
        per: [forward, reverse] elapsed seconds per sample, each from its own stream's events.
        spans: seconds per sample from the common start until both directions finished.
        reps: copies per sample in each direction.
        test: "bidir" or "off-bidir".
        extra: fields shared by the records; peak / peak_rev: link peaks (B/s) per direction.

    Returns:
        Three bandwidth Records (part forward, reverse, total); samples are seconds per copy (per
        copy pair for the total, whose nbytes is 2 * copied).

    The total follows the tool the test mirrors:
        - bidir (nvbandwidth): the sum of the two directions' bandwidths per sample, kept as the
          equivalent seconds 2 * copied / (bw_forward + bw_reverse);
        - off-bidir (p2pBandwidthLatencyTest outputBidirectionalBandwidthMatrix):
          2 * copied * reps / span, the bytes of both directions over the time until both finished.
          Peer-off copies are staged through the host and block it while queued, so the directions
          only partly overlap and the sum of the directions would count time they did not share.
        Both are recorded: the other rule's samples go in extra ("span_samples_s" or
        "sum_rule_samples_s").
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


def _choose(lanes, plan_reps_cap: int, warm: int) -> tuple[int, float]:
    """Copies per sample: nvbandwidth's loop count, cut so a sample of slow copies stays ~0.2 s.

    Returns:
        (copies per sample, host seconds the probe copy took to queue).
    """
    per, _, queued = _run_lanes(lanes, 1, TimingPlan(warmup=0, iters=1), warm=0)
    return choose_reps(max(per[0]), target=SAMPLE_TARGET_S, cap=plan_reps_cap), queued


def _measure_group(g: _Group, spec: P2PSpec, env: dict, peers: _Peers) -> list[Record]:
    import cupy

    i, j, test = g.src, g.dst, g.test
    off = test in PEER_OFF_TESTS
    base = {"test": test, "src": i, "dst": j}
    can = peers.can(i, j)
    if not off and not can:
        n = spec.latency_bytes if test in LATENCY_TESTS else spec.nbytes
        parts = ("forward", "reverse", "total") if test in BIDIR_TESTS else (None,)
        return [Record(params={**base, "nbytes": n, **({"part": p} if p else {})}, nbytes=n,
                       error=f"no peer access between GPU {i} and GPU {j} (cudaDeviceCanAccessPeer = 0)",
                       extra={"peer_access_capable": False}) for p in parts]
    peers.set(i, j, on=not off)
    peak, link = link_peak(env, i, j, peer_access=not off)
    common = {"peer_access": not off, "peer_access_capable": can, "link": link}
    gate_timeout = OFF_GATE_TIMEOUT_S if off else 10.0
    n = spec.latency_bytes if test in LATENCY_TESTS else spec.nbytes
    bufs: list[gpu.DeviceBuffer] = []

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
        _fill(i, src.ptr, n, seed)
        _fill(j, dst.ptr, n, seed ^ 0x5A5A)
        if test in BIDIR_TESTS:
            src2 = alloc(j, n)
            dst2 = alloc(i, n)
            _fill(j, src2.ptr, n, seed + 1)
            _fill(i, dst2.ptr, n, (seed + 1) ^ 0x5A5A)
            if test == "bidir":  # each direction pulled by its destination's stream (nvbandwidth read)
                lanes = [_Lane(j, _ce_enqueue(dst.ptr, j, src.ptr, i, n, False), gate_timeout),
                         _Lane(i, _ce_enqueue(dst2.ptr, i, src2.ptr, j, n, False), gate_timeout)]
            else:  # pushed by each source (p2pBandwidthLatencyTest bidirectional)
                lanes = [_Lane(i, _ce_enqueue(dst.ptr, j, src.ptr, i, n, True), gate_timeout),
                         _Lane(j, _ce_enqueue(dst2.ptr, i, src2.ptr, j, n, True), gate_timeout)]
            checks = [(j, dst.ptr, n, seed), (i, dst2.ptr, n, seed + 1)]
            copied = n
        elif test == "sm":
            enqueue, copied = _sm_enqueue(j, dst.ptr, src.ptr, n)
            if copied == 0:
                return [Record(params={**base, "nbytes": n}, nbytes=n,
                               error=f"{format_size(n)} is too small for the copy kernel (16 bytes at least)")]
            lanes = [_Lane(j, enqueue, gate_timeout)]
            checks = [(j, dst.ptr, copied, seed)]
        else:
            reader = test == "read"
            lane_dev = j if reader else i
            lanes = [_Lane(lane_dev, _ce_enqueue(dst.ptr, j, src.ptr, i, n, off), gate_timeout)]
            checks = [(j, dst.ptr, n, seed)]
            copied = n

        if test in LATENCY_TESTS:
            reps = LATENCY_REPS
        else:
            if off and peers.off_blocks_host:
                for ln in lanes:
                    ln.gate = None
            reps, probe_queued = _choose(lanes, loop_count(spec, test), WARMUP_COPIES)
            if lanes[0].gate is not None and probe_queued >= 0.9 * gate_timeout:
                # queueing one copy already outlasted the gate: every gated sample would wait for
                # its timeout (2 s) and be thrown away, so time this point without the gate
                for ln in lanes:
                    ln.gate = None
                if off:
                    peers.off_blocks_host = True
        gated = lanes[0].gate is not None
        per, spans, queued = _run_lanes(lanes, reps, spec.plan)
        gate_expired = not gated or queued >= 0.9 * gate_timeout
        if gated and gate_expired:
            # the copies blocked the host while the gate held the stream: measure again without the
            # gate (events then time the copies as the host queues them; launch cost included)
            for ln in lanes:
                ln.gate = None
            per, spans, queued = _run_lanes(lanes, reps, spec.plan)
        for ln in lanes:
            ln.stream.synchronize()
        verified = None
        wrong = None
        if spec.verify:
            wrong = sum(_count_wrong(d, p, size, s) for d, p, size, s in checks)
            verified = wrong == 0
        extra = {**common, "verified": verified, "wrong_bytes": wrong, "gate_expired": gate_expired,
                 "gated": not gate_expired, "stream_device": lanes[0].device}
        if gate_expired:
            extra["note"] = ("queueing the copies blocked the host while the spin kernel held the stream, so "
                             "they were timed without it; the figure includes launch time")
        out: list[Record] = []
        if test in LATENCY_TESTS:
            r = Record(params={**base, "nbytes": n}, metric="time", nbytes=n,
                       samples_s=[t / reps for t in per[0]], reps=reps, extra=extra)
            out.append(r)
        elif test in BIDIR_TESTS:
            peak_rev, _ = link_peak(env, j, i, peer_access=not off)
            out += bidir_records(base, copied, per, spans, reps, test, extra, peak, peak_rev, lanes[1].device)
        else:
            extra["peak_bytes_per_s"] = peak
            if test == "sm":
                extra["kernel"] = sm_copy_geometry(n, _num_sms(j))[0]
                extra["requested_nbytes"] = n
            out.append(_bw_record({**base, "nbytes": copied}, copied, [t / reps for t in per[0]], reps, extra))
        return out
    finally:
        for dev, b in bufs:
            with cupy.cuda.Device(dev):
                b.free()


def preflight(spec: P2PSpec, devices: tuple[int, ...]) -> None:
    """Check each GPU can hold two buffers of -b (bidirectional tests) before allocating.

    Raises:
        UsageError: a GPU has too little free memory; the message says which size would fit.
    """
    per_dev = (2 if any(t in BIDIR_TESTS for t in spec.tests) else 1) * spec.nbytes
    for d in devices:
        free, _total = gpu.device_free_bytes(d)
        if per_dev + DEVICE_MARGIN_BYTES > free:
            fit = max(0, free - DEVICE_MARGIN_BYTES) // (per_dev // spec.nbytes)
            raise UsageError(
                f"-b {format_size(spec.nbytes)} needs {format_size(per_dev)} on GPU {d}, which has "
                f"{format_size(free)} free", f"use -b {format_size(fit)} or less")


def select_devices(spec: P2PSpec) -> tuple[int, ...]:
    """The GPUs to use: -d checked against the visible ones, or every visible GPU.

    Raises:
        NoGPUError: no GPU visible.
        UsageError: fewer than two GPUs, or an id that is not visible.
    """
    gpu.require_gpu()
    n = gpu.device_count()
    if spec.devices is None:
        if n < 2:
            raise UsageError(f"p2p needs two GPUs; this machine shows {n} CUDA device",
                             "CUDA_VISIBLE_DEVICES may hide the others")
        return tuple(range(n))
    return gpu.resolve_devices(spec.devices, minimum=2)


def run(spec: P2PSpec, progress: ProgressSink | None = None) -> Result:
    """Measure every selected test for every ordered pair of GPUs.

    Returns:
        A Result with one record per (test, src, dst) (bidirectional tests: parts forward, reverse,
        total); params hold "test", "src", "dst", "nbytes" (and "part"). extra holds the link, its
        peak, % of it, the peer-access state, and the verification.

    Raises:
        NoGPUError / UsageError: no GPU, fewer than two, or -b does not fit.
        MachineError: a CUDA fault other than an allocation failure.
    """
    cupy = gpu.require_gpu()  # a missing CuPy is a setup problem (exit 2), not a fault

    devices = select_devices(spec)
    preflight(spec, devices)
    env = envmod.capture()
    peers = _Peers()
    access = {f"{i},{j}": peers.can(i, j) for i in devices for j in devices if i < j}

    def measure_group(g: _Group):
        try:
            return _measure_group(g, spec, env, peers)
        except cupy.cuda.runtime.CUDARuntimeError as e:
            if gpu.is_oom(e):
                raise
            raise gpu.machine_error(f"p2p {g.test} GPU {g.src} -> GPU {g.dst}", e) from None
        except cupy.cuda.compiler.CompileException as e:
            raise MachineError(f"the copy kernels did not compile: {str(e).splitlines()[0]}") from None

    def on_alloc_error(g: _Group, e: BaseException):
        n = spec.latency_bytes if g.test in LATENCY_TESTS else spec.nbytes
        msg = f"allocation of {format_size(n)} failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        parts = ("forward", "reverse", "total") if g.test in BIDIR_TESTS else (None,)
        return [Record(params={"test": g.test, "src": g.src, "dst": g.dst, "nbytes": n,
                               **({"part": p} if p else {})}, nbytes=n, error=msg) for p in parts]

    try:
        records, interrupted = run_groups(order_groups(spec.tests, devices), measure_group, on_alloc_error,
                                          progress or ProgressSink(), _label)
    finally:
        peers.restore()
    return Result(
        command="p2p",
        spec={**spec.to_dict(), "devices": list(devices)},
        timing={
            "clock": "cuda-event",
            "method": "nvbandwidth doMemcpyCore: streams held by a spin kernel, 4 warm-up copies, start "
                      "events (aligned across streams), reps copies, end events, release; per-copy seconds = "
                      "elapsed / reps; latency: p2pBandwidthLatencyTest, 100 copies per sample",
            "warmup_copies": WARMUP_COPIES,
            "latency_reps": LATENCY_REPS,
            **spec.plan.to_dict(),
        },
        env={**env, "peer_access": access},
        records=records,
        partial=interrupted is not None,
        interrupted_by=interrupted,
    )

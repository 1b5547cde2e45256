"""``gpubench overlap``: H2D -> kernel -> D2H over N bytes, each stage alone, ``serial`` on one
stream and ``overlapped`` (C chunks, chunk c on stream c mod K), timed with CUDA events behind the
spin gate (docs/overlap.md). The kernel does ``work`` dependent FMAs per float32 element, y =
f^work(x), f(v) = fmaf(v, a, b), checked against y = a^n x + b (1 - a^n) / (1 - a). Figures:
speed-up = serial median / overlapped median; ratio to the longest stage = overlapped median /
max(stage medians) (NVIDIA blog "How to Overlap Data Transfers in CUDA C/C++", Harris 2012).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Any

from gpubench.core import benchmark as driver
from gpubench.core import env as envmod
from gpubench.core import gpu
from gpubench.core.benchmark import DEVICE_MARGIN_BYTES, Benchmark, Context, Point
from gpubench.core.bounds import Bound, bounded, check_bounds, device_field
from gpubench.core.errors import UsageError
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result
from gpubench.core.timing import GatedTimer, Lane, SumClock, TimingPlan, drop_stalled_gate, measure, time_repeated
from gpubench.core.units import format_size

STAGES = ("h2d", "kernel", "d2h")
MAX_WORK = 1 << 20
MAX_STREAMS = 64
MAX_CHUNKS = 1024
WORK = Bound("--work", lo=0, hi=MAX_WORK)  # each entry of the list
ELEMENT_BYTES = 4  # float32
FMA_A = 1.0 - 2.0**-12  # f(v) = a v + b keeps v in [0, 1] for x in [0, 1]: fixed point b / (1 - a) = 1
FMA_B = 2.0**-12
THREADS = 256

_KERNEL_SRC = r"""
extern "C" __global__ void gpubench_fma(const float* __restrict__ x, float* __restrict__ y,
                                        unsigned long long n, int work, float a, float b) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = x[i];
        for (int k = 0; k < work; ++k) v = fmaf(v, a, b);
        y[i] = v;
    }
}
"""


@dataclass(frozen=True)
class OverlapSpec:
    """Parsed options of ``gpubench overlap``; the plan is per stage."""

    nbytes: int  # N, bytes moved each way (a whole number of float32 elements)
    works: tuple[int, ...] = (0, 1024, 4096)  # dependent FMAs per element, one group each
    streams: int = bounded(4, "--streams", lo=1, hi=MAX_STREAMS)  # K streams of the overlapped run
    chunks: int = bounded(4, "--chunks", lo=1, hi=MAX_CHUNKS)  # C chunks (>= K), given round-robin to the streams
    device: int = device_field()
    plan: TimingPlan = field(default_factory=TimingPlan)

    def __post_init__(self):
        """Raises UsageError: nbytes below 4 or not a multiple of 4, streams or chunks out of range, fewer chunks
        than streams or elements than chunks, no work value or one outside 0..MAX_WORK, a device ordinal outside 0
        to 2**31 - 1."""
        check_bounds(self)
        nbytes, streams, chunks = self.nbytes, self.streams, self.chunks
        if nbytes < ELEMENT_BYTES or nbytes % ELEMENT_BYTES:
            raise UsageError(f"--size {nbytes} bytes is not a whole number of float32 elements",
                             "give a multiple of 4 bytes")
        if chunks < streams:
            raise UsageError(f"--chunks {chunks} is fewer than --streams {streams}", "some streams would have no work")
        if nbytes // ELEMENT_BYTES < chunks:
            raise UsageError(f"--size {nbytes} bytes has fewer float32 elements than --chunks {chunks}")
        if not self.works:
            raise UsageError("no --work value to measure")
        for w in self.works:
            WORK.check(w)

    def to_dict(self) -> dict:
        return asdict(self)  # the plan (a dataclass) becomes a dict too


def chunk_bounds(n_elems: int, chunks: int) -> list[tuple[int, int]]:
    """(start, stop) element ranges of ``chunks`` nearly equal chunks covering range(n_elems)."""
    return [(c * n_elems // chunks, (c + 1) * n_elems // chunks) for c in range(chunks)]


def expected_output(x, work: int):
    """The kernel's output for input x (float32 numpy array) in float32: a^n x + b (1 - a^n)/(1 - a)."""
    import numpy as np

    an = FMA_A**work
    return (x * np.float32(an) + np.float32(FMA_B * (1.0 - an) / (1.0 - FMA_A))).astype(np.float32)


def tolerance(work: int) -> float:
    """Largest |computed - closed form| allowed after ``work`` FMAs.

    Each fmaf rounds once (at most 2^-24 absolute, since |v| <= 1) and an earlier error shrinks by
    a < 1 each step, so the total is at most 2^-24 x sum_k a^k <= 2^-24 x min(work, 1 / (1 - a)).
    Doubled for margin, plus 4 x 2^-24 for the closed form's own float32 rounding.
    """
    steps = min(work, int(round(1.0 / (1.0 - FMA_A))))
    return 2.0 * (steps + 1) * 2.0**-24 + 4 * 2.0**-24


def _params(spec: OverlapSpec, work: int, stage: str) -> dict:
    return {"device": spec.device, "work": work, "streams": spec.streams, "chunks": spec.chunks,
            "nbytes": spec.nbytes, "stage": stage}


@functools.cache
def _kernel(device: int):
    """The FMA kernel for one CUDA device (built once per device)."""
    import cupy

    return cupy.RawKernel(_KERNEL_SRC, "gpubench_fma")


def _group_records(spec: OverlapSpec, work: int) -> list[Record]:
    import cupy
    import numpy as np
    from cupy.cuda import runtime

    n = spec.nbytes
    n_elems = n // ELEMENT_BYTES
    x = (gpu.pattern(n_elems, seed=n_elems).astype(np.float32) / np.float32(255.0))
    want = expected_output(x, work)
    tol = tolerance(work)
    kernel = _kernel(cupy.cuda.Device().id)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    bufs: list = []
    out: list[Record] = []
    try:
        for alloc in (lambda: gpu.HostBuffer(n, "pinned"),) * 2 + (lambda: gpu.DeviceBuffer(n),) * 2:
            bufs.append(alloc())
        h_in, h_out, d_in, d_out = bufs
        h_in.array.view(np.float32)[:] = x
        h_out_f = h_out.array.view(np.float32)
        streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(spec.streams)]
        s0 = streams[0]
        a, b = np.float32(FMA_A), np.float32(FMA_B)

        def copier(dst, src, kind):  # a copy of elements lo..hi on a stream
            return lambda stream, lo=0, hi=n_elems: runtime.memcpyAsync(dst.ptr + lo * 4, src.ptr + lo * 4,
                                                                        (hi - lo) * 4, kind, stream.ptr)

        h2d, d2h = copier(d_in, h_in, gpu.H2D), copier(h_out, d_out, gpu.D2H)

        def run_kernel(stream, lo=0, hi=n_elems):
            m = hi - lo
            blocks = max(1, min((m + THREADS - 1) // THREADS, sms * 8))
            with stream:
                kernel((blocks,), (THREADS,), (np.uint64(d_in.ptr + lo * 4), np.uint64(d_out.ptr + lo * 4),
                                               np.uint64(m), np.int32(work), a, b))

        def pipeline(stream, lo=0, hi=n_elems):
            h2d(stream, lo, hi)
            run_kernel(stream, lo, hi)
            d2h(stream, lo, hi)

        def sync() -> None:
            for s in streams:
                s.synchronize()

        def check() -> tuple[bool, float | None]:
            sync()
            err = float(np.max(np.abs(h_out_f - want)))
            if not np.isfinite(err):  # a NaN left by poison(): some chunk never arrived
                return False, None
            return bool(err <= tol), err

        def poison():
            sync()
            h_out_f[:] = np.nan
            runtime.memset(d_out.ptr, 0xFF, n)  # 0xFFFFFFFF is a NaN: a chunk not computed shows

        pipeline(s0)  # one untimed pass fills d_in / d_out and builds the kernel
        s0.synchronize()

        meds: dict[str, float] = {}
        for stage, fn in (("h2d", h2d), ("kernel", run_kernel), ("d2h", d2h)):
            samples, reps = time_repeated(s0, True, lambda: fn(s0), spec.plan)
            extra: dict[str, Any] = {"gated": True}
            if stage == "kernel":
                med = float(np.median(samples))
                extra["gflops"] = 2.0 * work * n_elems / med / 1e9 if work else 0.0
                extra["flops_per_byte"] = 2.0 * work / ELEMENT_BYTES
            out.append(Record(params=_params(spec, work, stage), metric="time", nbytes=n, samples_s=list(samples),
                              reps=reps, extra=extra))
            meds[stage] = out[-1].time_summary().median

        # serial: the three stages on one stream
        poison()
        timer = GatedTimer([Lane(s0)])
        clock = SumClock()

        def step_serial(timer=timer):
            clock.add(timer.time(lambda: pipeline(s0)))

        samples = measure(step_serial, clock, spec.plan)
        ok, err = check()
        out.append(Record(params=_params(spec, work, "serial"), metric="time", nbytes=n, samples_s=list(samples),
                          extra={"gated": True, "verified": ok, "max_abs_error": err, "tolerance": tol}))
        serial_med = out[-1].time_summary().median

        # overlapped: C chunks round-robin over K streams
        poison()
        bounds = chunk_bounds(n_elems, spec.chunks)
        # stream 0 is held by the gate; its start event releases the others
        mtimer = GatedTimer([Lane(s0)] + [Lane(s, gated=False) for s in streams[1:]])

        def overlapped():
            for c, (lo, hi) in enumerate(bounds):
                pipeline(streams[c % len(streams)], lo, hi)

        clock = SumClock()

        def step_over(mtimer=mtimer):
            clock.add(mtimer.time(overlapped))

        clock.start()
        step_over()  # trial: a stalled gate shows here
        extra = {"gated": True}
        drop_stalled_gate(mtimer, extra)
        samples = measure(step_over, clock, spec.plan)
        ok, err = check()
        longest = max(meds.values())
        over = Record(params=_params(spec, work, "overlapped"), metric="time", nbytes=n, samples_s=list(samples),
                      extra=extra)
        over_med = over.time_summary().median
        over.extra.update(
            verified=ok, max_abs_error=err, tolerance=tol,
            speedup_vs_serial=serial_med / over_med,
            ratio_to_longest_stage=over_med / longest,
            longest_stage=max(meds, key=meds.__getitem__),
            sum_of_stages_s=sum(meds.values()),
        )
        out.append(over)
        out[-2].extra["sum_of_stages_s"] = sum(meds.values())
        sync()
    finally:
        for buf in reversed(bufs):
            buf.free()
    return out


class Overlap(Benchmark):
    """The overlap plug-in: a point is one --work value (the stages alone, serial, overlapped)."""

    name = "overlap"
    host_memory = True  # host buffers: the driver binds to the GPU's NUMA node first

    def points(self, spec: OverlapSpec, devices: tuple[int, ...]) -> list[Point]:
        return [Point(f"work {w}", w, devices=(spec.device,)) for w in spec.works]

    def preflight(self, spec: OverlapSpec, points, devices) -> None:
        """2 x N must fit in the GPU's free memory and about 5 x N in the host's (UsageError)."""
        free, _ = gpu.device_free_bytes(spec.device)
        if 2 * spec.nbytes + DEVICE_MARGIN_BYTES > free:
            raise UsageError(f"--size {format_size(spec.nbytes)} needs {format_size(2 * spec.nbytes)} on GPU "
                             f"{spec.device}, which has {format_size(free)} free", "lower --size")
        _, avail = envmod.host_memory()
        if avail is not None and 5 * spec.nbytes > avail:
            raise UsageError(f"--size {format_size(spec.nbytes)} needs about {format_size(5 * spec.nbytes)} of "
                             f"host memory; {format_size(avail)} is available", "lower --size")

    def measure(self, ctx: Context, point: Point) -> list[Record]:
        import cupy

        with cupy.cuda.Device(ctx.spec.device):
            return _group_records(ctx.spec, point.key)

    def derive(self, ctx: Context, records: list[Record]) -> None:
        """Hold the copies alone (stages h2d and d2h, N bytes per time) against the GPU's PCIe link
        per direction (core/limits, docs/conditions.md), as copy's are: a figure above it gets
        ``limit_flag`` "above_peak" and the report marks it."""
        from gpubench.core import limits

        g = envmod.gpu_by_index(ctx.env, ctx.spec.device) or {}
        peak = g.get("pcie_peak_bytes_per_s")
        source = limits.pcie_label(g.get("pcie_gen"), g.get("pcie_width"))
        for r in records:
            if r.params.get("stage") in ("h2d", "d2h") and r.samples_s and not r.error and r.nbytes:
                limits.mark(r, peak, source)

    def failed(self, ctx: Context, point: Point, message: str) -> list[Record]:
        return [Record(params=_params(ctx.spec, point.key, st), metric="time", nbytes=ctx.spec.nbytes, error=message)
                for st in (*STAGES, "serial", "overlapped")]

    def timing(self, ctx: Context) -> dict:
        return {
            "clock": "cuda-event",
            "method": "every sample queued behind a spin kernel; stages alone with reps per sample; serial on one "
                      "stream; overlapped over K streams released by one start event, timed to the last end event",
            "kernel": f"y = f^work(x), f(v) = fmaf(v, {FMA_A!r}, {FMA_B!r}), float32, grid-stride, {THREADS} threads",
            **ctx.spec.plan.to_dict(),
        }


BENCHMARK = Overlap()


def run(spec: OverlapSpec, progress: ProgressSink | None = None) -> Result:
    """Measure each --work value through :func:`gpubench.core.benchmark.run` (NoGPUError, UsageError,
    MachineError as it raises them): records (metric "time", nbytes = N) per work value and stage in
    (h2d, kernel, d2h, serial, overlapped); the overlapped one holds speedup_vs_serial and
    ratio_to_longest_stage."""
    return driver.run(BENCHMARK, spec, progress)

"""``gpubench batch``: N pieces of S bytes moved H2D or D2H, four ways (``separate``, ``packed``,
``batched-api``, ``contiguous``), each checked for the right data; the layout and what is timed are
docs/batch.md's. Piece ``i`` lives on the host at slot ``perm[i]`` and on the device at slot ``i``.

Figures: bandwidth = N x S / seconds (bytes moved once, as nvbandwidth and bandwidthTest count
copies); time per piece = seconds / N; speed-up = separate's median time / this one's.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field
from typing import Callable

from gpubench.core import benchmark as driver
from gpubench.core import env as envmod
from gpubench.core import gpu
from gpubench.core.benchmark import Benchmark, Context, Point
from gpubench.core.bounds import check_bounds, device_field
from gpubench.core.errors import MachineError, UsageError, check_choices
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result, time_ratios
from gpubench.core.timing import (SEGMENT, GatedTimer, HostClock, Lane, SumClock, TimingPlan, drop_stalled_gate,
                                  kept, measure, time_repeated, time_segments)
from gpubench.core.units import format_size

STRATEGIES = ("separate", "packed", "batched-api", "contiguous")
DIRECTIONS = ("h2d", "d2h")
HOST_KINDS = ("pinned", "pageable")
MAX_COUNT = 1 << 20  # pieces per transfer: more would make one Python-issued sample take seconds
BATCH_API_MIN_VERSION = 12080  # cudaMemcpyBatchAsync appeared in CUDA 12.8


@dataclass(frozen=True)
class BatchSpec:
    """Parsed options of ``gpubench batch``; a sample moves all N pieces once."""

    points: tuple[tuple[int, int], ...]  # (count N, piece_bytes S) pairs
    strategies: tuple[str, ...] = STRATEGIES
    directions: tuple[str, ...] = DIRECTIONS
    memory: tuple[str, ...] = HOST_KINDS  # host memory of the pieces
    device: int = device_field()
    plan: TimingPlan = field(default_factory=TimingPlan)
    gate: bool = True  # queue page-locked copies behind the spin gate (False: time the host's issue rate too)

    def __post_init__(self):
        """Raises UsageError: no points, a count below 1 or above MAX_COUNT, a piece below 1 byte, a strategy,
        direction or memory kind not known (or none), a device ordinal outside 0 to 2**31 - 1."""
        check_bounds(self)
        if not self.points:
            raise UsageError("no piece sizes to measure")
        for count, piece in self.points:
            if count < 1:
                raise UsageError(f"--count {count} must be >= 1")
            if count > MAX_COUNT:
                shown = count if count < 10**20 else f"a {len(str(count))}-digit number of"
                raise UsageError(f"{shown} pieces of {format_size(piece)} is over the limit of {MAX_COUNT} per "
                                 "transfer", "raise --piece or lower --count / --total")
            if piece < 1:
                raise UsageError(f"--piece {piece} must be at least 1 byte")
        check_choices("strategy", self.strategies, STRATEGIES)
        check_choices("direction", self.directions, DIRECTIONS)
        check_choices("memory kind", self.memory, HOST_KINDS)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["points"] = [list(p) for p in self.points]  # tuples -> JSON arrays, as they load back
        return d


def batch_api() -> tuple[object | None, str | None]:
    """Find cudaMemcpyBatchAsync: (cuda.bindings.runtime module, None) or (None, why not).

    Needs cuda-bindings with the function, a runtime >= 12.8 and a driver >= 12.8. The call's
    signature is the same in 12.8 and 13.0 from Python, but 12.x returns (err, failIdx) and 13.x
    returns (err,) (CUDA 13.0 dropped failIdx).
    """
    try:
        from cuda.bindings import runtime as cudart
    except Exception as e:  # ImportError, or a broken install
        return None, f"cuda-bindings is not importable ({type(e).__name__}); pip install 'gpubench-cuda[cuda13]' (or [cuda12])"
    if not hasattr(cudart, "cudaMemcpyBatchAsync"):
        return None, "this cuda-bindings has no cudaMemcpyBatchAsync (needs 12.8 or newer)"
    try:
        rt = int(cudart.cudaRuntimeGetVersion()[1])
        drv = int(cudart.cudaDriverGetVersion()[1])
    except Exception as e:
        return None, f"cannot read the CUDA version through cuda-bindings ({type(e).__name__})"
    if rt < BATCH_API_MIN_VERSION:
        return None, f"cuda-bindings runtime is CUDA {rt // 1000}.{rt % 1000 // 10}; cudaMemcpyBatchAsync needs 12.8"
    if drv < BATCH_API_MIN_VERSION:
        return None, f"the driver supports CUDA {drv // 1000}.{drv % 1000 // 10}; cudaMemcpyBatchAsync needs 12.8"
    return cudart, None


class BatchCall:
    """One prepared cudaMemcpyBatchAsync of ``nbytes`` per copy between the address lists, with one
    attribute set for every copy (``host_is_src``: H2D), on a cupy.cuda.Stream (never the legacy NULL
    stream). Calling it raises MachineError when the runtime refuses the call.
    """

    def __init__(self, cudart, dsts, srcs, nbytes: int, host_is_src: bool, device: int, stream):
        self.cudart = cudart
        self.dsts = list(dsts)
        self.srcs = list(srcs)
        self.sizes = [nbytes] * len(self.dsts)
        a = cudart.cudaMemcpyAttributes()
        a.srcAccessOrder = cudart.cudaMemcpySrcAccessOrder.cudaMemcpySrcAccessOrderStream
        host = cudart.cudaMemLocationType.cudaMemLocationTypeHost
        dev = cudart.cudaMemLocationType.cudaMemLocationTypeDevice
        a.srcLocHint.type, a.srcLocHint.id = (host, 0) if host_is_src else (dev, device)
        a.dstLocHint.type, a.dstLocHint.id = (dev, device) if host_is_src else (host, 0)
        self.attrs = [a]
        self.stream = cudart.cudaStream_t(stream.ptr)
        cudart.cudaSetDevice(device)

    def __call__(self) -> None:
        res = self.cudart.cudaMemcpyBatchAsync(self.dsts, self.srcs, self.sizes, len(self.sizes),
                                               self.attrs, [0], 1, self.stream)
        err = res[0] if isinstance(res, tuple) else res
        if err != self.cudart.cudaError_t.cudaSuccess:
            idx = res[1] if isinstance(res, tuple) and len(res) > 1 else None  # 12.x only: failIdx
            where = f" at copy {idx}" if isinstance(idx, int) and idx < len(self.sizes) else ""
            raise MachineError(f"cudaMemcpyBatchAsync failed{where}: {getattr(err, 'name', err)}")


@dataclass(frozen=True)
class _Group:
    count: int
    piece: int
    memory: str


def _params(spec: BatchSpec, direction: str, strategy: str, g: _Group) -> dict:
    return {"device": spec.device, "direction": direction, "strategy": strategy, "memory": g.memory,
            "count": g.count, "piece_bytes": g.piece}


def _record(params, nbytes, samples, reps, extra) -> Record:
    return Record(params=params, metric="bandwidth", nbytes=nbytes, samples_s=list(samples), reps=reps,
                  extra=dict(extra))


class _Pieces:
    """One (count, piece, memory kind) point's buffers and data, shared by the strategies: ``prepare``
    puts the source data in place and poisons the destination, ``arrived`` checks it."""

    def __init__(self, spec: BatchSpec, g: _Group, peak: float | None, api):
        import cupy
        import numpy as np

        self.spec, self.g, self.peak = spec, g, peak
        self.cudart, self.api_reason = api
        n, s = g.count, g.piece
        self.n, self.s, self.total = n, s, n * s
        total = self.total
        self.pat = gpu.pattern(total, seed=total + s)
        self.perm = perm = np.random.default_rng(n * 7919 + s).permutation(n)
        pat2d = self.pat.reshape(n, s)
        # H2D: device slot i receives host slot perm[i]; D2H: host slot perm[i] receives device slot i.
        self.scattered_dev = pat2d[perm].ravel()  # device contents after a scattered H2D of pat
        self.scattered_host = pat2d[np.argsort(perm)].ravel()  # host contents after a scattered D2H of pat
        with contextlib.ExitStack() as undo:  # a failed allocation frees the ones before it
            self.host = undo.enter_context(gpu.HostBuffer(total, g.memory))
            self.dev = undo.enter_context(gpu.DeviceBuffer(total))
            self.staging = gpu.HostBuffer(total, "pinned")
            undo.pop_all()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.gated = spec.gate and g.memory != "pageable"
        self.host2d = self.host.array.reshape(n, s)
        self.staging2d = self.staging.array.reshape(n, s)
        self.check = np.empty(total, dtype=np.uint8)
        self.host_off = [int(self.host.ptr + int(perm[i]) * s) for i in range(n)]
        self.dev_off = [int(self.dev.ptr + i * s) for i in range(n)]

    def prepare(self, direction: str, contiguous: bool = False) -> tuple:
        """Put the source data in place and poison the destination with ~expected; returns (h2d,
        expected), what the destination holds after the copy (the pieces scattered, or the pattern as
        is for a ``contiguous`` copy)."""
        from cupy.cuda import runtime

        h2d = direction == "h2d"
        expected = self.pat if contiguous else self.scattered_dev if h2d else self.scattered_host
        self.stream.synchronize()
        dev_data = ~expected if h2d else self.pat
        self.host.array[:] = self.pat if h2d else ~expected
        runtime.memcpy(self.dev.ptr, dev_data.ctypes.data, self.total, gpu.H2D)
        return h2d, expected

    def arrived(self, h2d: bool, expected) -> bool:
        import numpy as np
        from cupy.cuda import runtime

        self.stream.synchronize()
        if h2d:
            runtime.memcpy(self.check.ctypes.data, self.dev.ptr, self.total, gpu.D2H)
        return bool(np.array_equal(self.check if h2d else self.host.array, expected))

    def params(self, direction: str, strategy: str) -> dict:
        return _params(self.spec, direction, strategy, self.g)

    def base_extra(self) -> dict:
        return {"gated": self.gated, "peak_bytes_per_s": self.peak}

    def free(self) -> None:
        for b in (self.staging, self.dev, self.host):
            b.free()


def _separate(pt: _Pieces, direction: str) -> list[Record]:
    """One cudaMemcpyAsync per piece, gated in segments of SEGMENT (time_segments)."""
    from cupy.cuda import runtime

    h2d, expected = pt.prepare(direction)
    kind = gpu.H2D if h2d else gpu.D2H
    pairs = list(zip(pt.dev_off, pt.host_off)) if h2d else list(zip(pt.host_off, pt.dev_off))
    sp = pt.stream.ptr
    memcpy_async = runtime.memcpyAsync
    s = pt.s

    def enqueue(seg, pairs=pairs, sp=sp, kind=kind):
        for i in seg:
            d, src = pairs[i]
            memcpy_async(d, src, s, kind, sp)

    extra = pt.base_extra()
    samples, timer = time_segments(pt.stream, pt.gated, enqueue, pt.n, pt.spec.plan, extra)
    extra["segment_copies"] = SEGMENT if timer.gated else pt.n
    extra["verified"] = pt.arrived(h2d, expected)
    return [_record(pt.params(direction, "separate"), pt.total, samples, 1, extra)]


def _contiguous(pt: _Pieces, direction: str) -> list[Record]:
    """One copy of N x S bytes between the same buffers: the ceiling."""
    from cupy.cuda import runtime

    h2d, expected = pt.prepare(direction, contiguous=True)
    kind = gpu.H2D if h2d else gpu.D2H
    src, dst = (pt.host.ptr, pt.dev.ptr) if h2d else (pt.dev.ptr, pt.host.ptr)
    total, stream = pt.total, pt.stream

    def one(src=src, dst=dst, kind=kind):
        runtime.memcpyAsync(dst, src, total, kind, stream.ptr)

    samples, reps = time_repeated(stream, pt.gated, one, pt.spec.plan)
    extra = dict(pt.base_extra(), verified=pt.arrived(h2d, expected))
    return [_record(pt.params(direction, "contiguous"), total, samples, reps, extra)]


def _packed(pt: _Pieces, direction: str) -> list[Record]:
    """A host gather into pinned staging then one gated copy (D2H: the copy then a scatter); two
    records: the copy alone (``packed``) and gather + copy (``packed+gather``)."""
    import numpy as np
    from cupy.cuda import runtime

    h2d, expected = pt.prepare(direction)
    timer = GatedTimer([Lane(pt.stream)])  # the copy is always from pinned staging
    host_clock = HostClock()
    clock = SumClock()
    parts: list[tuple[float, float]] = []
    dev, staging, total, stream = pt.dev, pt.staging, pt.total, pt.stream
    host2d, staging2d, perm = pt.host2d, pt.staging2d, pt.perm

    def step(h2d=h2d):
        if h2d:
            host_clock.start()
            np.take(host2d, perm, axis=0, out=staging2d)
            tg = host_clock.stop()
            tc = timer.time(lambda: runtime.memcpyAsync(dev.ptr, staging.ptr, total, gpu.H2D, stream.ptr))
        else:
            tc = timer.time(lambda: runtime.memcpyAsync(staging.ptr, dev.ptr, total, gpu.D2H, stream.ptr))
            host_clock.start()
            host2d[perm] = staging2d
            tg = host_clock.stop()
        parts.append((tg, tc))
        clock.add(tg + tc)

    totals = measure(step, clock, pt.spec.plan)
    used = kept(parts, len(totals))
    gather = [p[0] for p in used]
    copy = [p[1] for p in used]
    what = "gather into pinned staging" if h2d else "scatter from pinned staging"
    extra = dict(pt.base_extra(), gated=True, verified=pt.arrived(h2d, expected), host_step=what,
                 host_step_samples_s=gather)
    params = pt.params(direction, "packed")
    return [_record(params, total, copy, 1, extra),
            _record(dict(params, strategy="packed+gather"), total, totals, 1, dict(extra, copy_samples_s=copy))]


def _batched_api(pt: _Pieces, direction: str) -> list[Record]:
    """One cudaMemcpyBatchAsync of the N pieces; where it is missing the record says why."""
    params = pt.params(direction, "batched-api")
    if pt.cudart is None:
        return [Record(params=params, nbytes=pt.total, error=f"skipped: {pt.api_reason}", extra={"skipped": True})]
    h2d, expected = pt.prepare(direction)
    dsts, srcs = (pt.dev_off, pt.host_off) if h2d else (pt.host_off, pt.dev_off)
    call = BatchCall(pt.cudart, dsts, srcs, pt.s, h2d, pt.spec.device, pt.stream)
    timer = GatedTimer([Lane(pt.stream, gated=pt.gated)])
    clock = SumClock()

    def step(call=call, timer=timer):
        clock.add(timer.time(call))

    try:
        step()  # trial: errors and a stalled gate show here
    except MachineError as e:
        return [Record(params=params, nbytes=pt.total, error=e.message, extra={"skipped": True})]
    extra = pt.base_extra()
    drop_stalled_gate(timer, extra)
    samples = measure(step, clock, pt.spec.plan)
    extra["verified"] = pt.arrived(h2d, expected)
    return [_record(params, pt.total, samples, 1, extra)]


# -s/--strategy value -> (point's pieces, direction) -> records; packed's add "packed+gather"
STRATEGY_TABLE: dict[str, Callable[[_Pieces, str], list[Record]]] = {
    "separate": _separate, "packed": _packed, "batched-api": _batched_api, "contiguous": _contiguous}
assert tuple(STRATEGY_TABLE) == STRATEGIES


def _group_records(spec: BatchSpec, g: _Group, peak: float | None, api) -> list[Record]:
    """Every direction x strategy of one point, the strategies taken from STRATEGY_TABLE."""
    pt = _Pieces(spec, g, peak, api)
    out: list[Record] = []
    try:
        for direction in spec.directions:
            for strategy in spec.strategies:
                out += STRATEGY_TABLE[strategy](pt, direction)
        pt.stream.synchronize()
    finally:
        pt.free()
    return out


def add_derived(records: list[Record]) -> None:
    """Fill each measured record's extra with time per piece (us), speed-up over ``separate`` (same
    direction, memory, count, piece) and % of the link's peak. Mutates ``records``."""
    point = ("device", "direction", "memory", "count", "piece_bytes")
    for r, ratio in time_ratios(records, "separate", lambda r: tuple(r.params[k] for k in point)):
        r.extra["time_per_piece_us"] = r.time_summary().median / r.params["count"] * 1e6
        r.extra["speedup_vs_separate"] = ratio
        r.mark_peak(r.extra.get("peak_bytes_per_s"))


class Batch(Benchmark):
    """The batch plug-in: a point is (count, piece, memory kind); every direction and strategy."""

    name = "batch"
    host_memory = True  # host buffers: the driver binds to the GPU's NUMA node first

    def points(self, spec: BatchSpec, devices: tuple[int, ...]) -> list[Point]:
        out = []
        for c, p in spec.points:
            total = c * p
            for m in spec.memory:
                # host: the pieces, pinned staging, pattern, expected, check copy
                out.append(Point(f"{c} x {format_size(p)} {m}", _Group(c, p, m), device_bytes=total,
                                 host_bytes=5 * total, locked_bytes=total * (2 if m == "pinned" else 1),
                                 devices=(spec.device,)))
        return out

    def too_big_hint(self, spec: BatchSpec) -> str:
        return "lower --count or --piece"

    @contextlib.contextmanager
    def setup(self, ctx: Context):
        spec: BatchSpec = ctx.spec
        ctx.data["peak"] = (envmod.gpu_by_index(ctx.env, spec.device) or {}).get("pcie_peak_bytes_per_s")
        ctx.data["api"] = batch_api() if "batched-api" in spec.strategies else (None, "not selected")
        yield ctx

    def measure(self, ctx: Context, point: Point) -> list[Record]:
        import cupy

        with cupy.cuda.Device(ctx.spec.device):
            return _group_records(ctx.spec, point.key, ctx.data["peak"], ctx.data["api"])

    def failed(self, ctx: Context, point: Point, message: str) -> list[Record]:
        spec: BatchSpec = ctx.spec
        g: _Group = point.key
        strategies = [x for st in spec.strategies for x in ((st, "packed+gather") if st == "packed" else (st,))]
        return [Record(params=_params(spec, d, st, g), nbytes=g.count * g.piece, error=message)
                for d in spec.directions for st in strategies]

    def derive(self, ctx: Context, records: list[Record]) -> None:
        add_derived(records)

    def timing(self, ctx: Context) -> dict:
        return {
            "clock": "cuda-event (copies), perf_counter (host gather/scatter)",
            "method": f"separate from page-locked memory: cudaMemcpyAsync queued behind a spin kernel in "
                      f"segments of {SEGMENT}, each timed with events, summed per sample; pageable: no gate; "
                      "packed: host gather (perf_counter) + one gated copy (events); batched-api: one gated "
                      "cudaMemcpyBatchAsync; contiguous: gated copies of N x S bytes, reps per sample",
            "batch_api": ctx.data["api"][1] or "available",
            **ctx.spec.plan.to_dict(),
        }


BENCHMARK = Batch()


def run(spec: BatchSpec, progress: ProgressSink | None = None) -> Result:
    """Measure every (point, memory kind) group through :func:`gpubench.core.benchmark.run` (NoGPUError,
    UsageError, MachineError as it raises them): a record per (direction, strategy, memory, count,
    piece), ``packed`` adds ``packed+gather``; a skipped ``batched-api`` has ``error`` "skipped: ..."."""
    return driver.run(BENCHMARK, spec, progress)

"""``gpubench batch``: N pieces of S bytes moved H2D or D2H, four ways, each checked for the right data.

Layout (docs/batch.md): piece ``i`` lives on the host at slot ``perm[i]`` (a fixed pseudo-random
permutation, so the pieces are scattered as a real program's are) and on the device at slot ``i``.

Strategies:

- ``separate``: one ``cudaMemcpyAsync`` per piece. From page-locked memory the copies are queued
  behind :class:`gpubench.core.gpu.SpinGate` in segments of at most :data:`SEGMENT` copies (the
  driver's queue is finite; a full queue would block the host while the gate holds the stream), and
  each segment is timed with CUDA events; a sample is the sum over segments. What is timed is what
  the copy engines spend on N small copies, not the host's issue rate (``--no-gate`` times that).
  Pageable copies are staged by the driver and block the host, so they run with no gate.
- ``packed``: a host gather of the pieces into a pinned staging buffer (``numpy.take``, timed with
  :class:`HostClock`), then one copy of N x S bytes (CUDA events); D2H is one copy then a host
  scatter. Two records: ``packed`` (the copy alone) and ``packed+gather`` (gather + copy per sample).
- ``batched-api``: one ``cudaMemcpyBatchAsync`` of the N pieces (CUDA 12.8+, reached through
  cuda-bindings). Where it is missing the record says why (``error`` = "skipped: ...").
- ``contiguous``: one copy of N x S bytes between the same buffers: the ceiling.

Figures: effective bandwidth = N x S / seconds per transfer of all pieces (bytes moved once, as
nvbandwidth and bandwidthTest count copies); time per piece = seconds / N; speed-up = separate's
median time / this strategy's median time, same direction and host-memory kind.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from gpubench.core import env as envmod
from gpubench.core import gpu
from gpubench.core.errors import MachineError, UsageError, check_choices
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result, time_ratios
from gpubench.core.sweep import run_groups
from gpubench.core.timing import CudaEventClock, HostClock, TimingPlan, choose_reps, measure
from gpubench.core.units import format_size

STRATEGIES = ("separate", "packed", "batched-api", "contiguous")
DIRECTIONS = ("h2d", "d2h")
HOST_KINDS = ("pinned", "pageable")
SEGMENT = 128  # copies queued behind one hold of the gate (well under the driver's queue depth)
GATE_TIMEOUT_S = 2.0  # the spin kernel gives up after this; an enqueue this slow means a stall
MAX_COUNT = 1 << 20  # pieces per transfer: more would make one Python-issued sample take seconds
DEVICE_MARGIN_BYTES = 512 * 2**20
BATCH_API_MIN_VERSION = 12080  # cudaMemcpyBatchAsync appeared in CUDA 12.8


@dataclass(frozen=True)
class BatchSpec:
    """Parsed options of ``gpubench batch``.

    Attributes:
        points: (count, piece_bytes) pairs: N pieces of S bytes each.
        strategies: subset of STRATEGIES.
        directions: subset of DIRECTIONS.
        memory: host memory of the pieces, subset of HOST_KINDS.
        device: CUDA ordinal.
        plan: warm-ups and iterations (a sample moves all N pieces once).
        gate: queue page-locked copies behind the spin gate (False: time the host's issue rate too).
    """

    points: tuple[tuple[int, int], ...]
    strategies: tuple[str, ...] = STRATEGIES
    directions: tuple[str, ...] = DIRECTIONS
    memory: tuple[str, ...] = HOST_KINDS
    device: int = 0
    plan: TimingPlan = field(default_factory=TimingPlan)
    gate: bool = True

    def __post_init__(self):
        if not self.points:
            raise UsageError("no piece sizes to measure")
        for count, piece in self.points:
            if count < 1 or count > MAX_COUNT:
                raise UsageError(f"--count {count} is out of range", f"use 1..{MAX_COUNT}")
            if piece < 1:
                raise UsageError(f"--piece {piece} must be at least 1 byte")
        for name, got, allowed in (("strategy", self.strategies, STRATEGIES),
                                   ("direction", self.directions, DIRECTIONS),
                                   ("memory kind", self.memory, HOST_KINDS)):
            check_choices(name, got, allowed)
        if self.device < 0:
            raise UsageError(f"device {self.device} is negative", "device ids start at 0")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["points"] = [list(p) for p in self.points]  # tuples -> JSON arrays, as they load back
        return d


# ---------------------------------------------------------------------------------------------
# Timing helpers shared by batch, memcpy2d and overlap.


class SumClock:
    """A clock whose sample is the sum of sub-timings added during the step (``add``).

    Lets :func:`gpubench.core.timing.measure` drive samples made of several gated segments or of a
    host part plus a device part, so warm-up and the iteration rule stay the core's.
    """

    name = "sum"

    def __init__(self) -> None:
        self.total = 0.0

    def start(self) -> None:
        self.total = 0.0

    def add(self, seconds: float) -> None:
        self.total += seconds

    def stop(self) -> float:
        return self.total


class GatedTimer:
    """Times enqueued device work on ``stream`` with CUDA events, optionally behind a SpinGate.

    ``time(enqueue)`` holds the stream (when gated), records the start event, calls ``enqueue``,
    records the end event, releases (nvbandwidth's order), and returns the seconds between the
    events. If ``enqueue`` took longer than half the
    gate's timeout the driver's queue was full and the gate gave up: ``stalled`` becomes True and
    the caller should time without the gate.

    Args:
        stream: a cupy.cuda.Stream.
        gated: use the gate (page-locked or device memory only).
    """

    def __init__(self, stream, gated: bool):
        self.clock = CudaEventClock(stream)
        self.gate = gpu.SpinGate(stream, timeout_s=GATE_TIMEOUT_S) if gated else None
        self.stalled = False

    def time(self, enqueue: Callable[[], None]) -> float:
        gate = self.gate
        if gate is not None:
            gate.hold()
        t0 = time.perf_counter()
        try:
            self.clock.start()
            enqueue()
            self.clock.mark_end()  # queued behind the gate with the work
        finally:
            enqueue_s = time.perf_counter() - t0
            if gate is not None:
                gate.release()
        t = self.clock.elapsed()
        if gate is not None and enqueue_s > 0.5 * GATE_TIMEOUT_S:
            self.stalled = True
        return t

    def drop_gate(self) -> None:
        self.gate = None


GATE_DROPPED = "the driver's queue filled while the gate held; timed ungated"


def drop_stalled_gate(timer: GatedTimer, extra: dict) -> None:
    """After an untimed trial: if the gate stalled, time without it from now on and say so in extra."""
    if timer.stalled:
        timer.drop_gate()
        extra["gated"] = False
        extra["gate_dropped"] = GATE_DROPPED


def time_repeated(stream, gated: bool, one: Callable[[], None], plan: TimingPlan) -> tuple[list[float], int]:
    """Samples of one enqueue ``one`` (one copy or kernel): a first gated call sets how many calls a
    sample queues behind the gate (choose_reps, so launch gaps stay out of the events); ungated, one.

    Returns:
        (seconds per call of each sample, calls per sample).
    """
    timer = GatedTimer(stream, gated)
    t1 = timer.time(one)
    reps = choose_reps(t1) if timer.gate is not None else 1
    clock = SumClock()

    def step():
        clock.add(timer.time(lambda: [one() for _ in range(reps)]) / reps)

    return measure(step, clock, plan), reps


def time_segments(stream, gated: bool, enqueue: Callable[[range], None], n: int, plan: TimingPlan,
                  extra: dict) -> tuple[list[float], GatedTimer]:
    """Samples of ``n`` small copies queued one by one (``enqueue(range)`` queues those copies):
    gated, in segments of SEGMENT per hold of the gate, a sample being the sum of its segments. An
    untimed trial comes first; a gate that stalled in it is dropped (drop_stalled_gate, noted in extra).

    Returns:
        (seconds per sample, the timer: its ``gate`` is None when the copies were timed ungated).
    """
    timer = GatedTimer(stream, gated)
    segs = segments(n, SEGMENT) if gated else [range(n)]
    clock = SumClock()

    def step():
        for seg in segs:
            clock.add(timer.time(lambda seg=seg: enqueue(seg)))

    clock.start()
    step()  # untimed trial; shows a stalled gate before the timed samples
    drop_stalled_gate(timer, extra)
    return measure(step, clock, plan), timer


def segments(n: int, size: int) -> list[range]:
    """Split range(n) into consecutive ranges of at most ``size`` (size >= 1)."""
    return [range(i, min(n, i + size)) for i in range(0, n, size)]


def kept(parts: list, n: int) -> list:
    """The last ``n`` entries of a list that also recorded the warm-up samples."""
    return parts[len(parts) - n:] if n else []


# ---------------------------------------------------------------------------------------------
# cudaMemcpyBatchAsync through cuda-bindings


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
    """One prepared cudaMemcpyBatchAsync: pointer lists and one attribute set for every copy.

    Args:
        cudart: cuda.bindings.runtime.
        dsts, srcs: destination / source addresses (ints), one per copy.
        nbytes: bytes per copy.
        host_is_src: True for H2D (the source is host memory), False for D2H.
        device: CUDA ordinal of the device side.
        stream: cupy.cuda.Stream to enqueue on (never the legacy NULL stream).

    Raises:
        MachineError: the runtime refused the call (``__call__``).
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


# ---------------------------------------------------------------------------------------------


def bytes_needed(spec: BatchSpec) -> tuple[int, int, int]:
    """(device bytes, host bytes, page-locked host bytes) that the largest point needs at once."""
    total = max(c * p for c, p in spec.points)
    # host: the pieces, pinned staging, pattern, expected, check copy
    locked = total * (2 if "pinned" in spec.memory else 1)
    return total, 5 * total, locked


def preflight(spec: BatchSpec) -> None:
    """Check the largest point fits on the GPU and the host before allocating.

    Raises:
        UsageError: it does not fit.
    """
    dev_need, host_need, _ = bytes_needed(spec)
    free, _total = gpu.device_free_bytes(spec.device)
    if dev_need + DEVICE_MARGIN_BYTES > free:
        raise UsageError(f"count x piece = {format_size(dev_need)} does not fit on GPU {spec.device} "
                         f"({format_size(free)} free)", "lower --count or --piece")
    _total_host, avail = envmod.host_memory()
    if avail is not None and host_need > avail:
        raise UsageError(f"count x piece = {format_size(dev_need)} needs {format_size(host_need)} of host "
                         f"memory; {format_size(avail)} is available", "lower --count or --piece")


@dataclass(frozen=True)
class _Group:
    count: int
    piece: int
    memory: str


def _label(g: _Group) -> str:
    return f"{g.count} x {format_size(g.piece)} {g.memory}"


def _params(spec: BatchSpec, direction: str, strategy: str, g: _Group) -> dict:
    return {"device": spec.device, "direction": direction, "strategy": strategy, "memory": g.memory,
            "count": g.count, "piece_bytes": g.piece}


def _record(params, nbytes, samples, reps, extra) -> Record:
    return Record(params=params, metric="bandwidth", nbytes=nbytes, samples_s=list(samples), reps=reps,
                  extra=dict(extra))


def _group_records(spec: BatchSpec, g: _Group, peak: float | None, api) -> list[Record]:
    import cupy
    import numpy as np
    from cupy.cuda import runtime

    cudart, api_reason = api
    n, s = g.count, g.piece
    total = n * s
    pat = gpu.pattern(total, seed=total + s)
    perm = np.random.default_rng(n * 7919 + s).permutation(n)
    pat2d = pat.reshape(n, s)
    # H2D: device slot i receives host slot perm[i]; D2H: host slot perm[i] receives device slot i.
    scattered_dev = pat2d[perm].ravel()  # device contents after a scattered H2D of pat
    scattered_host = np.empty_like(pat2d)
    scattered_host[perm] = pat2d  # host contents after a scattered D2H of a device holding pat
    scattered_host = scattered_host.ravel()

    host = gpu.HostBuffer(total, g.memory)
    dev = staging = None
    out: list[Record] = []
    try:
        dev = gpu.DeviceBuffer(total)
        staging = gpu.HostBuffer(total, "pinned")
        stream = cupy.cuda.Stream(non_blocking=True)
        gated = spec.gate and g.memory != "pageable"
        host2d = host.array.reshape(n, s)
        staging2d = staging.array.reshape(n, s)
        check = np.empty(total, dtype=np.uint8)
        host_off = [int(host.ptr + int(perm[i]) * s) for i in range(n)]
        dev_off = [int(dev.ptr + i * s) for i in range(n)]

        def dev_put(data):
            runtime.memcpy(dev.ptr, data.ctypes.data, total, gpu.H2D)

        def dev_equals(expected) -> bool:
            runtime.memcpy(check.ctypes.data, dev.ptr, total, gpu.D2H)
            return bool(np.array_equal(check, expected))

        for direction in spec.directions:
            h2d = direction == "h2d"
            kind = gpu.H2D if h2d else gpu.D2H
            base_extra = {"gated": gated, "peak_bytes_per_s": peak}

            def prepare(expected):
                """Put the source data in place and poison the destination with ~expected."""
                stream.synchronize()
                if h2d:
                    host.array[:] = pat
                    dev_put(~expected)
                else:
                    dev_put(pat)
                    host.array[:] = ~expected

            def arrived(expected) -> bool:
                stream.synchronize()
                return dev_equals(expected) if h2d else bool(np.array_equal(host.array, expected))

            for strategy in spec.strategies:
                params = _params(spec, direction, strategy, g)
                if strategy == "separate":
                    expected = scattered_dev if h2d else scattered_host
                    prepare(expected)
                    pairs = list(zip(dev_off, host_off)) if h2d else list(zip(host_off, dev_off))
                    sp = stream.ptr
                    memcpy_async = runtime.memcpyAsync

                    def enqueue(seg, pairs=pairs, sp=sp, kind=kind):
                        for i in seg:
                            d, src = pairs[i]
                            memcpy_async(d, src, s, kind, sp)

                    extra = dict(base_extra)
                    samples, timer = time_segments(stream, gated, enqueue, n, spec.plan, extra)
                    extra["segment_copies"] = SEGMENT if timer.gate is not None else n
                    extra["verified"] = arrived(expected)
                    out.append(_record(params, total, samples, 1, extra))
                elif strategy == "contiguous":
                    prepare(pat)
                    src, dst = (host.ptr, dev.ptr) if h2d else (dev.ptr, host.ptr)

                    def one(src=src, dst=dst, kind=kind):
                        runtime.memcpyAsync(dst, src, total, kind, stream.ptr)

                    samples, reps = time_repeated(stream, gated, one, spec.plan)
                    extra = dict(base_extra, gated=gated, verified=arrived(pat))
                    out.append(_record(params, total, samples, reps, extra))
                elif strategy == "packed":
                    expected = scattered_dev if h2d else scattered_host
                    prepare(expected)
                    timer = GatedTimer(stream, True)  # the copy is always from pinned staging
                    host_clock = HostClock()
                    clock = SumClock()
                    parts: list[tuple[float, float]] = []

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

                    totals = measure(step, clock, spec.plan)
                    used = kept(parts, len(totals))
                    gather = [p[0] for p in used]
                    copy = [p[1] for p in used]
                    ok = arrived(expected)
                    what = "gather into pinned staging" if h2d else "scatter from pinned staging"
                    extra = dict(base_extra, gated=True, verified=ok, host_step=what, host_step_samples_s=gather)
                    out.append(_record(params, total, copy, 1, extra))
                    p2 = dict(params, strategy="packed+gather")
                    extra2 = dict(base_extra, gated=True, verified=ok, host_step=what,
                                  host_step_samples_s=gather, copy_samples_s=copy)
                    out.append(_record(p2, total, totals, 1, extra2))
                elif strategy == "batched-api":
                    if cudart is None:
                        out.append(Record(params=params, nbytes=total, error=f"skipped: {api_reason}",
                                          extra={"skipped": True}))
                        continue
                    expected = scattered_dev if h2d else scattered_host
                    prepare(expected)
                    dsts, srcs = (dev_off, host_off) if h2d else (host_off, dev_off)
                    call = BatchCall(cudart, dsts, srcs, s, h2d, spec.device, stream)
                    timer = GatedTimer(stream, gated)
                    clock = SumClock()

                    def step(call=call, timer=timer):
                        clock.add(timer.time(call))

                    try:
                        step()  # trial: errors and a stalled gate show here
                    except MachineError as e:
                        out.append(Record(params=params, nbytes=total, error=e.message, extra={"skipped": True}))
                        continue
                    extra = dict(base_extra)
                    drop_stalled_gate(timer, extra)
                    samples = measure(step, clock, spec.plan)
                    extra["verified"] = arrived(expected)
                    out.append(_record(params, total, samples, 1, extra))
        stream.synchronize()
    finally:
        for b in (staging, dev, host):
            if b is not None:
                b.free()
    return out


def add_derived(records: list[Record]) -> None:
    """Fill each measured record's extra with time per piece (us), speed-up over ``separate`` (same
    direction, memory, count, piece) and % of the link's peak. Mutates ``records``."""
    for r, ratio in time_ratios(records, "separate", _point_key):
        r.extra["time_per_piece_us"] = r.time_summary().median / r.params["count"] * 1e6
        r.extra["speedup_vs_separate"] = ratio
        r.mark_peak(r.extra.get("peak_bytes_per_s"))


def _point_key(r: Record) -> tuple:
    p = r.params
    return (p["device"], p["direction"], p["memory"], p["count"], p["piece_bytes"])


def run(spec: BatchSpec, progress: ProgressSink | None = None) -> Result:
    """Measure every (point, memory kind) group: all directions and strategies.

    Returns:
        A Result with one record per (direction, strategy, memory, count, piece); ``packed`` adds a
        ``packed+gather`` record. Records of a skipped ``batched-api`` carry ``error`` "skipped: ...".

    Raises:
        NoGPUError: no CUDA device visible.
        UsageError: the device is not visible, or the largest point does not fit.
        MachineError: a CUDA fault other than an allocation failure.
    """
    cupy = gpu.require_gpu()  # a missing CuPy is a setup problem (exit 2), not a fault

    gpu.resolve_devices((spec.device,))
    preflight(spec)
    env = envmod.capture()
    peak = (envmod.gpu_by_index(env, spec.device) or {}).get("pcie_peak_bytes_per_s")
    api = batch_api() if "batched-api" in spec.strategies else (None, "not selected")
    groups = [_Group(c, p, m) for c, p in spec.points for m in spec.memory]

    def measure_group(g: _Group):
        try:
            with cupy.cuda.Device(spec.device):
                return _group_records(spec, g, peak, api)
        except cupy.cuda.runtime.CUDARuntimeError as e:
            if gpu.is_oom(e):
                raise
            raise gpu.machine_error(f"batch on GPU {spec.device} ({_label(g)})", e) from None

    def on_alloc_error(g: _Group, e: BaseException):
        msg = f"allocation of {g.count} x {format_size(g.piece)} {g.memory} failed: {gpu.first_line(e)}"
        strategies = [x for st in spec.strategies for x in ((st, "packed+gather") if st == "packed" else (st,))]
        return [Record(params=_params(spec, d, st, g), nbytes=g.count * g.piece, error=msg)
                for d in spec.directions for st in strategies]

    records, interrupted = run_groups(groups, measure_group, on_alloc_error, progress or ProgressSink(), _label)
    add_derived(records)
    return Result(
        command="batch",
        spec=spec.to_dict(),
        timing={
            "clock": "cuda-event (copies), perf_counter (host gather/scatter)",
            "method": f"separate from page-locked memory: cudaMemcpyAsync queued behind a spin kernel in "
                      f"segments of {SEGMENT}, each timed with events, summed per sample; pageable: no gate; "
                      "packed: host gather (perf_counter) + one gated copy (events); batched-api: one gated "
                      "cudaMemcpyBatchAsync; contiguous: gated copies of N x S bytes, reps per sample",
            "batch_api": api[1] or "available",
            **spec.plan.to_dict(),
        },
        env=env,
        records=records,
        partial=interrupted is not None,
        interrupted_by=interrupted,
    )

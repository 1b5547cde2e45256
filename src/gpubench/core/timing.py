"""The one timing core: host clocks (:class:`HostClock`, :class:`SumClock`), the gated core for
device work (:class:`GatedTimer`, nvbandwidth's doMemcpyCore in memcpy.cpp; CUDA events, resolution
about 0.5 us per the CUDA programming guide) and the sampling loop (:func:`sample_loop`).

A *sample* is ``reps`` back-to-back steps; its value is the elapsed time divided by ``reps``
(seconds per step).
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Protocol, cast

from gpubench.core.bounds import MAX_MIN_TIME_S, MAX_REPEATS, bounded, check_bounds
from gpubench.core.stats import median_noise


class Clock(Protocol):
    """A clock: ``start()`` then ``stop()`` returns the elapsed seconds."""

    name: str

    def start(self) -> None: ...

    def stop(self) -> float: ...


class Gate(Protocol):
    """Holds a stream before a sample and releases it after every step is queued."""

    def hold(self) -> None: ...

    def release(self) -> None: ...


class HostClock:
    """Wall-clock timing of host work with ``time.perf_counter`` (seconds)."""

    name = "perf_counter"

    def __init__(self) -> None:
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> float:
        return time.perf_counter() - self._t0


@dataclass(frozen=True)
class TimingPlan:
    """How a point is timed (:func:`sample_loop`'s rule); stored in every result. ``min_time``,
    ``max_time``: seconds; ``max_noise``: percent, or None for no goal."""

    warmup: int = bounded(2, "-w/--warmup", lo=0, hi=MAX_REPEATS)
    iters: int | None = bounded(None, "-n/--iters", lo=1, hi=MAX_REPEATS)
    min_time: float = bounded(0.1, "--min-time", lo=0, above=True, hi=MAX_MIN_TIME_S, unit="seconds")
    min_iters: int = 10
    max_iters: int = 1000
    max_noise: float | None = bounded(None, "--max-noise", lo=0, above=True, hi=100, unit="percent")
    max_time: float = bounded(5.0, "--max-time", lo=0, above=True, hi=86_400, unit="seconds")

    def __post_init__(self):
        """Raises UsageError: a field outside its bound (:func:`gpubench.core.bounds.check_bounds`)."""
        check_bounds(self)

    def to_dict(self) -> dict:
        return asdict(self)


# Why a point's sampling stopped (a record's extra["stopped_by"]):
ITERS = "iters"          # -n/--iters: exactly that many samples
MIN_TIME = "min_time"    # no noise goal: --min-time of measured time and the minimum samples
NOISE = "noise"          # the noise goal was reached (after --min-time)
MAX_TIME = "max_time"    # the wall-time cap, before the noise goal was reached
MAX_ITERS = "max_iters"  # the sample cap, before the goal (or before --min-time)
STOP_REASONS = (ITERS, MIN_TIME, NOISE, MAX_TIME, MAX_ITERS)
CAPPED = (MAX_TIME, MAX_ITERS)


@dataclass(frozen=True)
class Stop:
    """How one :func:`sample_loop` ended: why (one of STOP_REASONS), timed samples, the median's
    noise in percent (None under 6 samples), measured seconds (samples x reps), wall seconds of the
    timed samples, the plan's max_noise."""

    stopped_by: str
    n: int
    noise_pct: float | None
    measured_s: float
    wall_s: float
    goal_pct: float | None = None


_collect = threading.local()


@contextlib.contextmanager
def collect_stops() -> Iterator[list[Stop]]:
    """Collect the :class:`Stop` of every :func:`sample_loop` run in this thread inside the block
    (the driver opens one per point)."""
    stack = getattr(_collect, "stack", None)
    if stack is None:
        stack = _collect.stack = []
    got: list[Stop] = []
    stack.append(got)
    try:
        yield got
    finally:
        stack.pop()


def _pct(x: float | None) -> float | None:
    return None if x is None else 100.0 * x


def take_sample(step: Callable[[], None], clock: Clock, reps: int = 1, gate: Gate | None = None) -> float:
    """Time ``reps`` calls of ``step`` as one sample with a host clock; returns seconds per call.
    Behind a gate, a clock with ``mark_end()`` records its end before the gate opens and is read with
    ``elapsed()`` after (nvbandwidth's order, as :class:`GatedTimer` does for device work)."""
    if gate is not None:
        gate.hold()
    marked = False
    try:
        clock.start()
        for _ in range(reps):
            step()
        if gate is not None and hasattr(clock, "mark_end"):
            clock.mark_end()
            marked = True
    finally:
        if gate is not None:
            gate.release()
    return (cast(Any, clock).elapsed() if marked else clock.stop()) / reps


def sample_loop(take: Callable[[], float], plan: TimingPlan, reps: int = 1) -> list[float]:
    """The iteration rule every benchmark shares: ``plan.warmup`` untimed calls of ``take``, then
    exactly ``plan.iters`` samples ("iters"); else at least ``min_iters`` samples and ``min_time``
    seconds of measured time (``sum(samples) * reps``), the end without a noise goal ("min_time"),
    with one on until the median's noise (:func:`gpubench.core.stats.median_noise`) is at most
    ``max_noise`` percent ("noise") or ``max_time`` wall seconds have passed ("max_time"); never
    more than ``max_iters`` ("max_iters"). Returns seconds per step; how the loop ended goes to
    :func:`collect_stops`. nvbench's stopping rule (nvbench/detail/stdrel_criterion.cxx,
    measure_cold.cu), with the noise measured as the precision of the median.
    """
    for _ in range(plan.warmup):
        take()
    samples: list[float] = []
    ordered: list[float] = []
    goal = None if plan.max_noise is None else plan.max_noise / 100.0
    total = 0.0
    t0 = time.perf_counter()
    while True:
        t = take()
        samples.append(t)
        bisect.insort(ordered, t)
        total += t * reps
        n = len(samples)
        if plan.iters is not None:
            if n >= plan.iters:
                why = ITERS
                break
            continue
        if n >= plan.min_iters and total >= plan.min_time:
            if goal is None:
                why = MIN_TIME
                break
            noise = median_noise(ordered)
            if noise is not None and noise <= goal:
                why = NOISE
                break
            if time.perf_counter() - t0 >= plan.max_time:
                why = MAX_TIME
                break
        if n >= plan.max_iters:
            why = MAX_ITERS
            break
    stop = Stop(why, len(samples), _pct(median_noise(ordered)), total, time.perf_counter() - t0, plan.max_noise)
    for got in getattr(_collect, "stack", None) or ():
        got.append(stop)
    return samples


def annotate(records: list, stops: list[Stop]) -> None:
    """Write ``noise_pct`` (percent, None under 6 samples) and ``stopped_by`` (one of STOP_REASONS)
    into each measured record's ``extra``. One loop owns every record; k loops own a multiple of k
    records in consecutive equal blocks; else each record takes the first unused loop with its
    number of samples (none matched: ``noise_pct`` only)."""
    if not stops:
        return
    measured = [r for r in records if getattr(r, "samples_s", None)]
    if not measured:
        return
    owner: list[Stop | None]
    if len(stops) == 1:
        owner = [stops[0]] * len(measured)
    elif len(measured) % len(stops) == 0:
        block = len(measured) // len(stops)
        owner = [stops[i // block] for i in range(len(measured))]
    else:
        free = list(stops)
        owner = []
        for r in measured:
            hit = next((s for s in free if s.n == len(r.samples_s)), None)
            if hit is not None:
                free.remove(hit)
            owner.append(hit)
    for r, st in zip(measured, owner):
        r.extra["noise_pct"] = _pct(median_noise(sorted(r.samples_s)))
        if st is not None:
            r.extra["stopped_by"] = st.stopped_by


def stopping_note(timing: dict, records: list) -> str:
    """One line under a table: the rule the points were sampled by and how many stopped on a cap
    before the noise goal ("n, noise" cells: samples, and the median's noise in %)."""
    if timing.get("iters"):
        rule = f"{timing['iters']} samples per point (-n)"
    elif timing.get("max_noise") is not None:
        rule = (f"samples until the median's noise is <= {timing['max_noise']:g}% after {timing.get('min_time'):g} s "
                f"of measured time, capped at {timing.get('max_time'):g} s of sampling")
    else:
        rule = f"samples until {timing.get('min_time'):g} s of measured time (no noise goal)"
    capped = sum(1 for r in records if r.extra.get("stopped_by") in CAPPED and timing.get("max_noise") is not None)
    line = (f"n, noise: {rule}, at least {timing.get('min_iters', 10)}; noise = half-width of the median's 95% "
            "confidence interval, % of the median.")
    if capped:
        line += f" {capped} point(s) stopped on a cap before the goal (marked cap)."
    return line


def stop_cell(extra: dict, n: int) -> str:
    """A table cell for how a point was sampled: 'n=40 ±0.12%', with ' cap' when sampling ended on
    --max-time or the sample cap (the noise goal, if any, was not reached); '-' without samples."""
    if not n:
        return "-"
    noise = extra.get("noise_pct")
    cell = f"n={n}" + ("" if noise is None else f" ±{noise:.2g}%" if noise < 1 else f" ±{noise:.1f}%")
    if extra.get("stopped_by") in CAPPED:
        cell += " cap"
    return cell


def measure(step: Callable[[], None], clock: Clock, plan: TimingPlan, *, reps: int = 1,
            gate: Gate | None = None) -> list[float]:
    """Warm up, then take samples of ``step`` per ``plan`` (:func:`sample_loop` of :func:`take_sample`);
    returns seconds per step."""
    return sample_loop(lambda: take_sample(step, clock, reps, gate), plan, reps)


def choose_reps(seconds_per_step: float, target: float = 100e-6, cap: int = 32) -> int:
    """Steps per sample so a sample lasts about ``target`` seconds, between 1 and ``cap`` (nvbandwidth
    times 16 per sample)."""
    if seconds_per_step <= 0:
        return cap
    return max(1, min(cap, int(round(target / seconds_per_step))))


# -- the gated core for one or many streams (nvbandwidth's doMemcpyCore, memcpy.cpp)

GATE_TIMEOUT_S = 2.0  # a lane's spin kernel gives up after this; queueing this slow means a stall
FIRST, SPAN, EACH = "first", "span", "each"


class SumClock:
    """A clock whose sample is the sum of sub-timings added during the step (``add``): several
    gated segments, or a host part plus a device part, timed as one sample by :func:`measure`."""

    name = "sum"

    def __init__(self) -> None:
        self.total = 0.0

    def start(self) -> None:
        self.total = 0.0

    def add(self, seconds: float) -> None:
        self.total += seconds

    def stop(self) -> float:
        return self.total


class Lane:
    """One stream's part of a gated sample: its device (None: the current one), whether a
    :class:`gpubench.core.gpu.SpinGate` holds it (page-locked or device memory only: a pageable copy
    behind a held stream deadlocks), ``enqueue(k)`` queueing k steps, the gate's timeout in seconds."""

    def __init__(self, stream, device: int | None = None, *, gated: bool = True,
                 enqueue: Callable[[int], object] | None = None, gate_timeout_s: float = GATE_TIMEOUT_S):
        import cupy

        from gpubench.core import gpu

        self.device = cupy.cuda.Device().id if device is None else device
        self.stream = stream
        self.enqueue = enqueue
        with cupy.cuda.Device(self.device):
            self.gate = gpu.SpinGate(stream, timeout_s=gate_timeout_s) if gated else None
            self.start = cupy.cuda.Event()
            self.end = cupy.cuda.Event()


_NO_LANE_ENQUEUE = ("a Lane made without an enqueue cannot queue its own steps: give GatedTimer.sample "
                    "an enqueue and no warm steps, or give every Lane an enqueue")


@dataclass
class LaneTimes:
    """One sample of a :class:`GatedTimer`, in seconds (not divided by reps): each lane's time (from
    the first lane's start on its device, else its own), the span until every lane ended
    (nvbandwidth's TOTAL_BW time), host seconds spent queueing."""

    per_lane: list[float]
    span: float
    queued_s: float


class GatedTimer:
    """nvbandwidth's copy core for one or many streams, on one or many devices (memcpy.cpp,
    doMemcpyCore; its blocking kernel in kernels.cu): the gated streams held, start events (with
    ``linked``, every lane waits for the first lane's), the work, end events (and a span event for
    several devices) queued, then the gates open and the events are waited for, so the host's
    launch cost stays out of the figure. ``stalled``: a sample's queueing took over half the gate's
    timeout; time ungated from then on (:meth:`drop_gates`)."""

    def __init__(self, lanes: list[Lane], *, linked: bool = True):
        if not lanes:
            raise ValueError("GatedTimer needs at least one lane")
        self.lanes = lanes
        self.linked = linked
        self.stalled = False
        first = lanes[0]
        self._span_end = None
        if linked and any(ln.device != first.device for ln in lanes):
            import cupy

            with cupy.cuda.Device(first.device):
                self._span_end = cupy.cuda.Event()

    @property
    def gated(self) -> bool:
        return any(ln.gate is not None for ln in self.lanes)

    def drop_gates(self) -> None:
        for ln in self.lanes:
            ln.gate = None

    def sample(self, enqueue: Callable[[], None] | None = None, reps: int = 1, warm: int = 0) -> LaneTimes:
        """One sample of ``enqueue`` (None: each lane's ``enqueue(reps)``) after ``warm`` untimed steps per lane. Raises
        cupy.cuda.runtime.CUDARuntimeError: a CUDA fault; ValueError: a lane without an ``enqueue`` has to queue its own
        steps (``warm``, or no ``enqueue`` given here)."""
        import cupy

        lanes = self.lanes
        first = lanes[0]
        t0 = time.perf_counter()
        try:
            for ln in lanes:
                with cupy.cuda.Device(ln.device):
                    if ln.gate is not None:
                        ln.gate.hold()
                    if warm:
                        if ln.enqueue is None:
                            raise ValueError(_NO_LANE_ENQUEUE)
                        ln.enqueue(warm)
            with cupy.cuda.Device(first.device):
                first.start.record(first.stream)
            for ln in lanes[1:]:
                with cupy.cuda.Device(ln.device):
                    if self.linked:
                        ln.stream.wait_event(first.start)
                    ln.start.record(ln.stream)
            try:
                if enqueue is not None:
                    enqueue()
                else:
                    for ln in lanes:
                        with cupy.cuda.Device(ln.device):
                            if ln.enqueue is None:
                                raise ValueError(_NO_LANE_ENQUEUE)
                            ln.enqueue(reps)
            finally:
                for ln in lanes:
                    with cupy.cuda.Device(ln.device):
                        ln.end.record(ln.stream)  # queued behind the gate with the work
                if self._span_end is not None:
                    with cupy.cuda.Device(first.device):
                        for ln in lanes[1:]:
                            first.stream.wait_event(ln.end)
                        self._span_end.record(first.stream)
                queued = time.perf_counter() - t0
        finally:
            for ln in lanes:
                if ln.gate is not None:
                    ln.gate.release()
        if self.gated and queued > 0.5 * GATE_TIMEOUT_S:
            self.stalled = True
        per = []
        for ln in lanes:
            with cupy.cuda.Device(ln.device):
                ln.end.synchronize()
                ref = first.start if ln.device == first.device else ln.start
                per.append(cupy.cuda.get_elapsed_time(ref, ln.end) / 1e3)
        if self._span_end is not None:
            with cupy.cuda.Device(first.device):
                self._span_end.synchronize()
                span = cupy.cuda.get_elapsed_time(first.start, self._span_end) / 1e3
        else:
            span = max(per)
        return LaneTimes(per, span, queued)

    def time(self, enqueue: Callable[[], None]) -> float:
        """One sample of ``enqueue``; seconds until every lane ended (the span)."""
        return self.sample(enqueue).span


def policy_seconds(times: LaneTimes, policy: str, lane: int = 0) -> float:
    """The seconds a bandwidth figure divides by, per nvbandwidth's BandwidthValue (memcpy.cpp): ``first``
    (USE_FIRST_BW), ``span`` (TOTAL_BW), ``each`` (VECTOR_BW, lane ``lane``'s). Raises ValueError: an unknown policy, or
    ``sum``."""
    if policy not in (FIRST, SPAN, EACH):
        raise ValueError(f"policy {policy!r} has no single time; use {FIRST}, {SPAN} or {EACH}")
    return times.span if policy == SPAN else times.per_lane[lane if policy == EACH else 0]


# -- samples made of many gated enqueues (batch, memcpy2d, overlap)

SEGMENT = 128  # copies queued behind one hold of the gate (well under the driver's queue depth)

GATE_DROPPED = "the driver's queue filled while the gate held; timed ungated"


def drop_stalled_gate(timer: GatedTimer, extra: dict) -> None:
    """After an untimed trial: if the gate stalled, time without it from now on and say so in extra."""
    if timer.stalled:
        timer.drop_gates()
        extra["gated"] = False
        extra["gate_dropped"] = GATE_DROPPED


def time_repeated(stream, gated: bool, one: Callable[[], None], plan: TimingPlan) -> tuple[list[float], int]:
    """(seconds per call of each sample, calls per sample) of one enqueue ``one``: a first gated call
    sets the calls per sample (choose_reps); ungated, one."""
    timer = GatedTimer([Lane(stream, gated=gated)])
    t1 = timer.time(one)
    reps = choose_reps(t1) if timer.gated else 1
    clock = SumClock()

    def step():
        clock.add(timer.time(lambda: [one() for _ in range(reps)]) / reps)

    return measure(step, clock, plan), reps


def time_segments(stream, gated: bool, enqueue: Callable[[range], None], n: int, plan: TimingPlan,
                  extra: dict) -> tuple[list[float], GatedTimer]:
    """(seconds per sample, the timer) of ``n`` small copies (``enqueue(range)`` queues some), gated
    in segments of SEGMENT, after an untimed trial whose stalled gate is dropped (drop_stalled_gate)."""
    timer = GatedTimer([Lane(stream, gated=gated)])
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

"""The one timing core: host clocks, the gated core for device work, and the sampling loop.

- :class:`HostClock` (``time.perf_counter``) and :class:`SumClock` (a sample made of parts) time
  host work: sockets, Dask graphs, a host gather, CUDA runtime calls that return when done.
- :class:`GatedTimer` over :class:`Lane` s times device work with CUDA events, for one stream or
  many, on one device or many: nvbandwidth's doMemcpyCore (memcpy.cpp). Every gated lane's stream
  is held by a spinning kernel (:class:`gpubench.core.gpu.SpinGate`, nvbandwidth's blocking
  kernel) while its steps are queued, the end events are recorded before the gates open, and
  then the host waits: the host's launch cost stays out of the figure, and so does its delay
  between releasing and recording the end. The elapsed time is ``cudaEventElapsedTime``
  (resolution about 0.5 us per the CUDA programming guide). What a figure divides by follows
  nvbandwidth's BandwidthValue: the first lane's time, the span until all end, each lane's own,
  or the sum of the lanes' bandwidths (:func:`policy_seconds`; the sum, SUM_BW, is p2p's bidir
  total, computed from the lanes' times in ``bench.p2p.bidir_records``).
- :func:`sample_loop` is the iteration rule every benchmark shares: with ``iters`` given, exactly
  that many samples; otherwise samples until ``min_time`` seconds of measured time and at least
  ``min_iters`` samples, or ``max_iters`` samples; ``warmup`` untimed samples first.

A *sample* is ``reps`` back-to-back steps; its value is the elapsed time divided by ``reps``
(seconds per step).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable, Protocol


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
    """How a point is timed; stored in every result.

    Attributes:
        warmup: untimed samples before the timed ones.
        iters: exact number of timed samples, or None to choose by ``min_time``.
        min_time: seconds of measured time to reach when ``iters`` is None.
        min_iters, max_iters: bounds on the chosen number of samples.
    """

    warmup: int = 2
    iters: int | None = None
    min_time: float = 0.1
    min_iters: int = 10
    max_iters: int = 1000

    def to_dict(self) -> dict:
        return asdict(self)


def take_sample(step: Callable[[], None], clock: Clock, reps: int = 1, gate: Gate | None = None) -> float:
    """Time ``reps`` calls of ``step`` as one sample with a host clock; returns seconds per call.
    Behind a gate, a clock with ``mark_end`` records its end before the gate opens (nvbandwidth's
    order, as :class:`GatedTimer` does for device work)."""
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
    return (clock.elapsed() if marked else clock.stop()) / reps


def sample_loop(take: Callable[[], float], plan: TimingPlan, reps: int = 1) -> list[float]:
    """The iteration rule every benchmark shares: ``plan.warmup`` untimed calls of ``take``, then
    timed ones until ``plan.iters`` samples, or until ``plan.min_time`` seconds of measured time
    and at least ``plan.min_iters`` samples, or ``plan.max_iters`` samples.

    Args:
        take: takes one sample and returns its seconds per step.
        plan: warm-ups and iteration rule.
        reps: steps per sample (measured time is ``sum(samples) * reps``).

    Returns:
        Samples in seconds per step.
    """
    for _ in range(plan.warmup):
        take()
    samples: list[float] = []
    total = 0.0
    while True:
        t = take()
        samples.append(t)
        total += t * reps
        n = len(samples)
        if plan.iters is not None:
            if n >= plan.iters:
                break
        elif n >= plan.max_iters or (n >= plan.min_iters and total >= plan.min_time):
            break
    return samples


def measure(
    step: Callable[[], None],
    clock: Clock,
    plan: TimingPlan,
    *,
    reps: int = 1,
    gate: Gate | None = None,
) -> list[float]:
    """Warm up, then take samples of ``step`` per ``plan`` (:func:`sample_loop` of :func:`take_sample`).

    Args:
        step: one unit of work (e.g. one cudaMemcpyAsync); enqueues or does the work.
        clock: the clock that times it.
        plan: warm-ups and iteration rule.
        reps: steps per sample.
        gate: optional stream gate (see module docstring).

    Returns:
        Samples in seconds per step (list of float, length = number of timed samples).
    """
    return sample_loop(lambda: take_sample(step, clock, reps, gate), plan, reps)


def choose_reps(seconds_per_step: float, target: float = 100e-6, cap: int = 32) -> int:
    """Steps per sample so a sample lasts about ``target`` seconds, between 1 and ``cap``.

    Used with a gate so short copies are timed many at once (nvbandwidth times 16 per sample).
    """
    if seconds_per_step <= 0:
        return cap
    return max(1, min(cap, int(round(target / seconds_per_step))))


# ---------------------------------------------------------------------------------------------
# The gated core for one or many streams (nvbandwidth's doMemcpyCore, memcpy.cpp).

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
    """One stream's part of a gated sample.

    Args:
        stream: the cupy.cuda.Stream that does the work.
        device: its CUDA ordinal (None: the current device; work is queued with that device current).
        gated: hold the stream with a :class:`gpubench.core.gpu.SpinGate` while the work is queued
            (page-locked or device memory only: a pageable copy behind a held stream deadlocks).
        enqueue: ``enqueue(k)`` queues k steps of this lane's work (used by :meth:`GatedTimer.sample`
            when no common ``enqueue`` is given, and for the untimed ``warm`` steps).
        gate_timeout_s: seconds before the spin kernel gives up on its own.
    """

    def __init__(self, stream, device: int | None = None, *, gated: bool = True,
                 enqueue: Callable[[int], None] | None = None, gate_timeout_s: float = GATE_TIMEOUT_S):
        import cupy

        from gpubench.core import gpu

        self.device = cupy.cuda.Device().id if device is None else device
        self.stream = stream
        self.enqueue = enqueue
        with cupy.cuda.Device(self.device):
            self.gate = gpu.SpinGate(stream, timeout_s=gate_timeout_s) if gated else None
            self.start = cupy.cuda.Event()
            self.end = cupy.cuda.Event()


@dataclass
class LaneTimes:
    """One sample of a :class:`GatedTimer`, in seconds (not divided by reps).

    Attributes:
        per_lane: each lane's elapsed time: from the first lane's start event to its end event for
            a lane on the first lane's device, from its own start event otherwise (CUDA times
            events of one device only).
        span: from the first start until every lane has ended (nvbandwidth's TOTAL_BW time); for
            lanes not linked, the longest lane's own time.
        queued_s: host seconds spent queueing the sample's work behind the gates.
    """

    per_lane: list[float]
    span: float
    queued_s: float


class GatedTimer:
    """nvbandwidth's copy core for one or many streams, on one or many devices.

    A sample: every gated lane's stream is held by a spin kernel; ``warm`` untimed steps are queued
    per lane; the first lane records its start event; with ``linked`` every other lane waits for
    that event (cudaStreamWaitEvent) and records its own; the timed work is queued; every lane
    records its end event; for lanes on several devices the first lane waits for every end and
    records a span event; then the gates open and the events are waited for. So the host's launch
    cost and its delay between releasing and recording stay out of the figure (nvbandwidth
    memcpy.cpp, doMemcpyCore; its blocking kernel in kernels.cu).

    Args:
        lanes: the streams, the first one the reference.
        linked: lanes start together on the first lane's start event (False: each lane is released
            by its own gate only, as independent GPUs copying at once).

    Attributes:
        stalled: a sample's queueing took over half the gate's timeout: the driver's queue filled
            while the gate held and the spin kernel may have given up; time ungated from then on
            (:meth:`drop_gates`).
    """

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
        """Take one sample.

        Args:
            enqueue: queues the timed work of every lane at once; None: each lane's ``enqueue(reps)``.
            reps: steps per lane when ``enqueue`` is None.
            warm: untimed steps queued per lane behind the gate before the start events.

        Returns:
            LaneTimes (seconds, not divided by reps).

        Raises:
            cupy.cuda.runtime.CUDARuntimeError: a CUDA fault.
        """
        import cupy

        lanes = self.lanes
        first = lanes[0]
        multi = len(lanes) > 1
        t0 = time.perf_counter()
        try:
            for ln in lanes:
                with cupy.cuda.Device(ln.device):
                    if ln.gate is not None:
                        ln.gate.hold()
                    if warm:
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
            span = max(per) if multi else per[0]
        return LaneTimes(per, span, queued)

    def time(self, enqueue: Callable[[], None]) -> float:
        """One sample of ``enqueue``; seconds until every lane ended (the span)."""
        return self.sample(enqueue).span


def policy_seconds(times: LaneTimes, policy: str, lane: int = 0) -> float:
    """The seconds a bandwidth figure divides by, per nvbandwidth's BandwidthValue (memcpy.cpp):

    - ``first`` (USE_FIRST_BW): the first lane's time (the timed copy while others interfere);
    - ``span`` (TOTAL_BW): until every lane ended (total bytes over that time);
    - ``each`` (VECTOR_BW): lane ``lane``'s own time (one figure per lane);
    - ``sum`` (SUM_BW) is a sum of per-lane bandwidths, not one lane's time: p2p's bidir total
      computes it from the lanes' times (``bench.p2p.bidir_records``).

    Raises:
        ValueError: an unknown policy, or ``sum``.
    """
    if policy == FIRST:
        return times.per_lane[0]
    if policy == SPAN:
        return times.span
    if policy == EACH:
        return times.per_lane[lane]
    raise ValueError(f"policy {policy!r} has no single time; use {FIRST}, {SPAN} or {EACH}")


# ---------------------------------------------------------------------------------------------
# Samples made of many gated enqueues (batch, memcpy2d, overlap).

SEGMENT = 128  # copies queued behind one hold of the gate (well under the driver's queue depth)

GATE_DROPPED = "the driver's queue filled while the gate held; timed ungated"


def drop_stalled_gate(timer: GatedTimer, extra: dict) -> None:
    """After an untimed trial: if the gate stalled, time without it from now on and say so in extra."""
    if timer.stalled:
        timer.drop_gates()
        extra["gated"] = False
        extra["gate_dropped"] = GATE_DROPPED


def time_repeated(stream, gated: bool, one: Callable[[], None], plan: TimingPlan) -> tuple[list[float], int]:
    """Samples of one enqueue ``one`` (one copy or kernel): a first gated call sets how many calls a
    sample queues behind the gate (choose_reps, so launch gaps stay out of the events); ungated, one.

    Returns:
        (seconds per call of each sample, calls per sample).
    """
    timer = GatedTimer([Lane(stream, gated=gated)])
    t1 = timer.time(one)
    reps = choose_reps(t1) if timer.gated else 1
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
        (seconds per sample, the timer: ``timer.gated`` is False when the copies were timed ungated).
    """
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

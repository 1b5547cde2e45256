"""One timer interface, two clocks, and the sampling loop every benchmark uses.

Clocks (both return seconds from ``stop()``):

- :class:`HostClock`: ``time.perf_counter`` around host work (sockets, Dask graphs).
- :class:`CudaEventClock`: a pair of CUDA events recorded on the stream that does the work; the
  elapsed time is ``cudaEventElapsedTime`` (resolution about 0.5 us per the CUDA programming guide).

A *sample* is ``reps`` back-to-back steps between one ``start()`` and one ``stop()``; its value is
the elapsed time divided by ``reps`` (seconds per step). Optional *gate*: an object with ``hold()``
and ``release()`` (see :class:`gpubench.core.gpu.SpinGate`). ``hold()`` runs before ``start()`` and
blocks the stream with a spinning kernel so that every step is queued before the first one runs;
a clock that can record its end without waiting (``mark_end()``, as CudaEventClock) records it
before ``release()``, and waits for it after. This is nvbandwidth's method (its blocking kernel in
memcpy.cpp: the end event is queued, then the kernel is released): the host's launch cost stays
out of the figure, and so does the host's delay between releasing and recording the end.

Iterations: with ``iters`` given, exactly that many samples. Otherwise samples are taken until
``min_time`` seconds of measured time and at least ``min_iters`` samples, or ``max_iters`` samples.
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


class CudaEventClock:
    """CUDA events recorded on ``stream`` (a ``cupy.cuda.Stream``); ``stop()`` waits for the end event.

    Args:
        stream: the stream that does the timed work.

    Raises:
        cupy.cuda.runtime.CUDARuntimeError: from the CUDA runtime, on a faulty device.
    """

    name = "cuda-event"

    def __init__(self, stream) -> None:
        import cupy

        self._cupy = cupy
        self.stream = stream
        self._start = cupy.cuda.Event()
        self._end = cupy.cuda.Event()

    def start(self) -> None:
        self._start.record(self.stream)

    def mark_end(self) -> None:
        """Record the end event without waiting (for clocks on several streams)."""
        self._end.record(self.stream)

    def elapsed(self) -> float:
        """Wait for the end event and return seconds since the start event."""
        self._end.synchronize()
        return self._cupy.cuda.get_elapsed_time(self._start, self._end) / 1e3

    def stop(self) -> float:
        self.mark_end()
        return self.elapsed()


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
    """Time ``reps`` calls of ``step`` as one sample; returns seconds per call. Behind a gate, a
    clock with ``mark_end`` records its end before the gate opens (see the module's docstring)."""
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


def measure(
    step: Callable[[], None],
    clock: Clock,
    plan: TimingPlan,
    *,
    reps: int = 1,
    gate: Gate | None = None,
) -> list[float]:
    """Warm up, then take samples of ``step`` per ``plan``.

    Args:
        step: one unit of work (e.g. one cudaMemcpyAsync); enqueues or does the work.
        clock: the clock that times it.
        plan: warm-ups and iteration rule.
        reps: steps per sample.
        gate: optional stream gate (see module docstring).

    Returns:
        Samples in seconds per step (list of float, length = number of timed samples).
    """
    for _ in range(plan.warmup):
        take_sample(step, clock, reps, gate)
    samples: list[float] = []
    total = 0.0
    while True:
        t = take_sample(step, clock, reps, gate)
        samples.append(t)
        total += t * reps
        n = len(samples)
        if plan.iters is not None:
            if n >= plan.iters:
                break
        elif n >= plan.max_iters or (n >= plan.min_iters and total >= plan.min_time):
            break
    return samples


def choose_reps(seconds_per_step: float, target: float = 100e-6, cap: int = 32) -> int:
    """Steps per sample so a sample lasts about ``target`` seconds, between 1 and ``cap``.

    Used with a gate so short copies are timed many at once (nvbandwidth times 16 per sample).
    """
    if seconds_per_step <= 0:
        return cap
    return max(1, min(cap, int(round(target / seconds_per_step))))

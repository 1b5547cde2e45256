import time

import pytest

from gpubench.core.timing import HostClock, TimingPlan, choose_reps, measure, take_sample


def test_host_clock_measures_a_sleep():
    c = HostClock()
    c.start()
    time.sleep(0.02)
    t = c.stop()
    assert 0.015 < t < 0.5


def test_measure_exact_iters_and_warmup():
    calls = []
    samples = measure(lambda: calls.append(1), HostClock(), TimingPlan(warmup=3, iters=7), reps=2)
    assert len(samples) == 7
    assert len(calls) == (3 + 7) * 2


def test_measure_auto_stops_on_min_time():
    plan = TimingPlan(warmup=0, iters=None, min_time=0.03, min_iters=3, max_iters=10_000)
    samples = measure(lambda: time.sleep(0.005), HostClock(), plan)
    assert 3 <= len(samples) <= 12
    assert sum(samples) >= 0.03


def test_measure_auto_respects_max_iters():
    plan = TimingPlan(warmup=0, iters=None, min_time=100.0, min_iters=1, max_iters=5)
    assert len(measure(lambda: None, HostClock(), plan)) == 5


class RecordingGate:
    """A gate that writes "hold"/"release" into ``events`` (the order is what the tests check)."""

    def __init__(self, events: list):
        self.events = events

    def hold(self):
        self.events.append("hold")

    def release(self):
        self.events.append("release")


def test_gate_wraps_each_sample():
    events = []
    take_sample(lambda: events.append("step"), HostClock(), reps=2, gate=RecordingGate(events))
    assert events == ["hold", "step", "step", "release"]


def test_choose_reps():
    assert choose_reps(1e-6) == 32
    assert choose_reps(10e-6) == 10
    assert choose_reps(1.0) == 1
    assert choose_reps(0) == 32


def test_behind_a_gate_an_event_clock_records_its_end_before_the_gate_opens():
    """nvbandwidth's order: the end event is queued with the copies, then the blocking kernel is
    released; recording it after the release would time the host's delay in between."""
    events = []
    Gate = lambda: RecordingGate(events)  # noqa: E731

    class EventLikeClock:
        name = "cuda-event"

        def start(self):
            events.append("start")

        def mark_end(self):
            events.append("mark_end")

        def elapsed(self):
            events.append("elapsed")
            return 2.0

        def stop(self):
            raise AssertionError("stop() records after the release")

    assert take_sample(lambda: events.append("step"), EventLikeClock(), reps=2, gate=Gate()) == 1.0
    assert events == ["hold", "start", "step", "step", "mark_end", "release", "elapsed"]
    events.clear()

    def boom():
        raise RuntimeError("copy failed")

    with pytest.raises(RuntimeError):
        take_sample(boom, EventLikeClock(), reps=1, gate=Gate())
    assert events == ["hold", "start", "release"]  # the gate opens; nothing waits on an unrecorded end

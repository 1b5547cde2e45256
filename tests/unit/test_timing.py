import time

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


def test_gate_wraps_each_sample():
    events = []

    class Gate:
        def hold(self):
            events.append("hold")

        def release(self):
            events.append("release")

    take_sample(lambda: events.append("step"), HostClock(), reps=2, gate=Gate())
    assert events == ["hold", "step", "step", "release"]


def test_choose_reps():
    assert choose_reps(1e-6) == 32
    assert choose_reps(10e-6) == 10
    assert choose_reps(1.0) == 1
    assert choose_reps(0) == 32

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


# ---- stopping by noise (sample_loop with a goal), and what the records say ----

import itertools  # noqa: E402

import numpy as np  # noqa: E402

from gpubench.core import timing  # noqa: E402
from gpubench.core.result import Record  # noqa: E402


def _source(values):
    it = itertools.cycle(values)
    return lambda: next(it)


def _loop(take, plan, reps=1):
    with timing.collect_stops() as stops:
        samples = timing.sample_loop(take, plan, reps)
    (stop,) = stops
    return samples, stop


def test_a_quiet_source_stops_on_noise_right_after_min_time_and_min_iters():
    plan = TimingPlan(warmup=0, min_time=0.0001, min_iters=10, max_noise=0.5, max_time=60)
    samples, stop = _loop(_source([1.000e-3, 1.001e-3, 0.999e-3]), plan)
    assert stop.stopped_by == "noise" and len(samples) == 10 == stop.n
    assert stop.noise_pct <= 0.5 and stop.goal_pct == 0.5


def test_min_time_is_reached_before_the_noise_goal_is_read():
    plan = TimingPlan(warmup=0, min_time=0.05, min_iters=10, max_noise=50, max_time=60)
    samples, stop = _loop(_source([1e-3]), plan)
    assert stop.stopped_by == "noise" and len(samples) == 50  # 50 x 1 ms = the 0.05 s asked


def test_a_noisy_source_samples_until_the_goal():
    rng = np.random.default_rng(1)
    vals = list(np.exp(rng.normal(0, 0.05, 5000)))
    plan = TimingPlan(warmup=0, min_time=1e-9, min_iters=10, max_noise=0.5, max_iters=100_000, max_time=60)
    samples, stop = _loop(_source(vals), plan)
    assert stop.stopped_by == "noise" and 100 < len(samples) < 5000
    assert stop.noise_pct <= 0.5
    from gpubench.core.stats import median_noise

    assert 100 * median_noise(sorted(samples[:-1])) > 0.5  # one sample earlier it was not reached


def test_a_source_that_never_gets_there_stops_on_the_time_cap_and_says_so():
    rng = np.random.default_rng(2)

    def take():
        time.sleep(0.002)
        return float(np.exp(rng.normal(0, 0.5)))  # 50% spread: 0.1% needs ~10^5 samples

    plan = TimingPlan(warmup=0, min_time=1e-9, min_iters=10, max_noise=0.1, max_iters=100_000, max_time=0.1)
    t0 = time.perf_counter()
    samples, stop = _loop(take, plan)
    assert stop.stopped_by == "max_time" and stop.noise_pct > 0.1
    assert 0.1 <= stop.wall_s < 5 and time.perf_counter() - t0 < 5


def test_the_sample_cap_ends_a_point_before_the_goal_and_min_time_still_comes_first():
    rng = np.random.default_rng(3)
    vals = list(np.exp(rng.normal(0, 0.5, 1000)))
    plan = TimingPlan(warmup=0, min_time=1e-9, min_iters=10, max_noise=0.1, max_iters=40, max_time=60)
    samples, stop = _loop(_source(vals), plan)
    assert stop.stopped_by == "max_iters" and len(samples) == 40
    # a cap shorter than --min-time does not cut it: min-time and the minimum samples first
    plan = TimingPlan(warmup=0, min_time=0.03, min_iters=3, max_noise=0.001, max_time=1e-6)
    noisy = iter(vals)
    samples, stop = _loop(lambda: (time.sleep(0.005), 0.005 * next(noisy))[1], plan)
    assert stop.stopped_by == "max_time" and sum(samples) >= 0.03


def test_without_a_goal_the_rule_is_the_fixed_one_and_iters_is_exact():
    samples, stop = _loop(_source([1e-3]), TimingPlan(warmup=0, min_time=0.02, min_iters=10))
    assert stop.stopped_by == "min_time" and len(samples) == 20
    samples, stop = _loop(_source([1e-3]), TimingPlan(warmup=0, iters=7, max_noise=0.5))
    assert stop.stopped_by == "iters" and len(samples) == 7
    samples, stop = _loop(_source([1e-3]), TimingPlan(warmup=0, min_time=100, min_iters=1, max_iters=12))
    assert stop.stopped_by == "max_iters" and len(samples) == 12


def test_stops_are_collected_only_inside_the_block():
    timing.sample_loop(_source([1e-3]), TimingPlan(warmup=0, iters=3))  # nobody collecting: fine
    with timing.collect_stops() as outer:
        timing.sample_loop(_source([1e-3]), TimingPlan(warmup=0, iters=3))
        with timing.collect_stops() as inner:
            timing.sample_loop(_source([1e-3]), TimingPlan(warmup=0, iters=4))
    assert [s.n for s in outer] == [3, 4] and [s.n for s in inner] == [4]


def _rec(n, v=1e-3):
    return Record({"i": n}, nbytes=1, samples_s=[v * (1 + 0.001 * (i % 7)) for i in range(n)])


def test_annotate_gives_each_record_its_noise_and_its_loops_reason():
    one = timing.Stop("noise", 10, 0.1, 0.01, 0.01, 0.5)
    recs = [_rec(10), _rec(10), _rec(10)]  # copy's bidir: one loop, three figures
    timing.annotate(recs, [one])
    assert [r.extra["stopped_by"] for r in recs] == ["noise"] * 3
    assert all(r.extra["noise_pct"] is not None and r.extra["noise_pct"] < 1 for r in recs)
    # two loops, four figures: consecutive blocks in order (one direction after the other)
    a, b = timing.Stop("noise", 10, 0.1, 0.01, 0.01, 0.5), timing.Stop("max_time", 30, 0.9, 0.03, 0.3, 0.5)
    recs = [_rec(10), _rec(10), _rec(30), _rec(30)]
    timing.annotate(recs, [a, b])
    assert [r.extra["stopped_by"] for r in recs] == ["noise", "noise", "max_time", "max_time"]
    # an uneven split: matched by sample count; an error record is left alone
    recs = [_rec(10), _rec(30), Record({"i": 9}, error="allocation failed")]
    recs.append(_rec(5))
    timing.annotate(recs, [a, b])
    assert [r.extra.get("stopped_by") for r in recs] == ["noise", "max_time", None, None]
    assert recs[3].extra["noise_pct"] is None  # 5 samples: no 95% interval
    assert "noise_pct" not in recs[2].extra


def test_stop_cell_and_note():
    assert timing.stop_cell({"noise_pct": 0.123, "stopped_by": "noise"}, 40) == "n=40 ±0.12%"
    assert timing.stop_cell({"noise_pct": 2.46, "stopped_by": "max_time"}, 900) == "n=900 ±2.5% cap"
    assert timing.stop_cell({}, 0) == "-"
    recs = [_rec(10)]
    recs[0].extra["stopped_by"] = "max_time"
    line = timing.stopping_note({"max_noise": 0.5, "min_time": 0.01, "max_time": 0.3, "min_iters": 10}, recs)
    assert "<= 0.5% after 0.01 s" in line and "1 point(s) stopped on a cap before the goal" in line
    assert "no noise goal" in timing.stopping_note({"min_time": 0.1}, recs)


@pytest.mark.parametrize("args,needle", [
    (dict(max_noise=0.0), "--max-noise 0 must be > 0 percent"),
    (dict(max_noise=float("nan")), "--max-noise nan is not a finite number"),
    (dict(max_noise=101.0), "--max-noise 101 is too large (at most 100 percent)"),
    (dict(max_time=0.0), "--max-time 0 must be > 0 seconds"),
    (dict(max_time=float("inf")), "--max-time inf is not a finite number"),
    (dict(min_time=float("inf")), "--min-time inf is not a finite number"),
    (dict(min_time=3601.0), "--min-time 3601 is too large (at most 3,600 seconds)"),
    (dict(warmup=-1), "-w/--warmup -1 must be >= 0"),
    (dict(iters=0), "-n/--iters 0 must be >= 1"),
    (dict(iters=10**6 + 1), "-n/--iters 1000001 is too large (at most 1,000,000)"),
])
def test_a_plan_outside_its_bounds_names_the_option_and_value(args, needle):
    from gpubench.core.errors import UsageError

    kw = dict(warmup=2, iters=None, min_time=0.1) | args
    with pytest.raises(UsageError) as e:
        TimingPlan(**kw)
    assert e.value.one_line() == needle


def test_the_options_reach_the_plan_of_every_command_through_its_build_spec():
    from gpubench.plugins.copy import command as copy_cmd
    from gpubench.plugins.batch.command import command as batch

    spec = copy_cmd.command.build_spec(only="pinned", memory=None, directions="h2d", min_bytes="4K",
                                       max_bytes="4K", step_factor=4.0, devices=None, warmup=2, iters=None,
                                       min_time=0.01, max_noise=0.5, max_time=0.3, verify=False, max_pinned=None)
    assert (spec.plan.max_noise, spec.plan.max_time, spec.plan.min_time) == (0.5, 0.3, 0.01)
    defaults = {p.name: p.default for p in copy_cmd.command.params}
    assert (defaults["max_noise"], defaults["min_time"], defaults["max_time"]) == (0.5, 0.01, 0.1)
    assert {p.name: p.default for p in batch.params}["max_noise"] is None  # others: the fixed rule unless asked

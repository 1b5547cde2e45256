"""The one driver (core/benchmark.run) on a real host-timed plug-in: allocation failures become
error rows and the sweep goes on, a machine fault keeps the finished points as a partial result,
interrupts keep what was measured, and the generic preflight refuses what cannot fit."""

from __future__ import annotations

import signal
import time
from dataclasses import asdict, dataclass, field

import pytest

from gpubench.core import benchmark as driver
from gpubench.core.benchmark import Benchmark, Point, check_fits
from gpubench.core.errors import MachineError, UsageError
from gpubench.core.result import Record
from gpubench.core.signals import Interrupted, clear_signals, note_signal
from gpubench.core.timing import HostClock, TimingPlan, measure


@dataclass(frozen=True)
class SleepSpec:
    sizes: tuple[int, ...]
    fail_at: int | None = None  # raise this kind of error at this size
    error: str = ""
    plan: TimingPlan = field(default_factory=lambda: TimingPlan(warmup=0, iters=2))

    def to_dict(self) -> dict:
        return asdict(self)


class Sleep(Benchmark):
    """A host benchmark: one step sleeps nbytes microseconds (real time, real clock)."""

    name = "sleep"
    needs_gpu = False

    def points(self, spec, devices):
        return [Point(f"{n} us", n, host_bytes=n) for n in spec.sizes]

    def measure(self, ctx, point):
        n = point.key
        if n == ctx.spec.fail_at:
            if ctx.spec.error == "oom":
                raise MemoryError(f"cannot allocate {n} bytes")
            if ctx.spec.error == "fault":
                raise MachineError(f"cudaErrorIllegalAddress at {n}")
            if ctx.spec.error == "sigint":
                raise KeyboardInterrupt
            if ctx.spec.error == "sigterm":
                raise Interrupted(signal.SIGTERM)
            if ctx.spec.error == "noted":
                note_signal(signal.SIGINT)  # the handler ran, but its exception was swallowed
        samples = measure(lambda: time.sleep(n * 1e-6), HostClock(), ctx.spec.plan)
        return [Record(params={"n": n}, metric="time", nbytes=n, samples_s=samples)]

    def failed(self, ctx, point, message):
        return [Record(params={"n": point.key}, nbytes=point.key, error=message)]


def test_a_clean_run_measures_every_point_with_real_time():
    r = driver.run(Sleep(), SleepSpec(sizes=(100, 2000)))
    assert r.command == "sleep" and not r.partial and [x.params["n"] for x in r.records] == [100, 2000]
    assert all(len(x.samples_s) == 2 for x in r.records)
    assert r.records[1].time_summary().median >= 2000e-6  # time.sleep never returns early
    assert list(r.spec["sizes"]) == [100, 2000] and r.env  # the environment was captured


def test_allocation_failure_row_and_sweep_goes_on():
    r = driver.run(Sleep(), SleepSpec(sizes=(1, 2, 3), fail_at=2, error="oom"))
    assert [x.params["n"] for x in r.records] == [1, 2, 3] and not r.partial
    assert r.records[1].error == "allocation of 2 us failed: cannot allocate 2 bytes"
    assert r.records[2].error is None and r.records[2].samples_s


def test_a_machine_fault_keeps_the_finished_points_as_a_partial_result():
    with pytest.raises(MachineError) as e:
        driver.run(Sleep(), SleepSpec(sizes=(1, 2, 3), fail_at=3, error="fault"))
    part = e.value.partial_result
    assert part is not None and part.partial and part.failed_by == "cudaErrorIllegalAddress at 3"
    assert [x.params["n"] for x in part.records] == [1, 2]


def test_a_fault_at_the_first_point_has_nothing_to_keep():
    with pytest.raises(MachineError) as e:
        driver.run(Sleep(), SleepSpec(sizes=(1, 2), fail_at=1, error="fault"))
    assert e.value.partial_result is None


@pytest.mark.parametrize("how,name", [("sigint", "SIGINT"), ("sigterm", "SIGTERM")])
def test_an_interrupt_keeps_measured_points(how, name):
    r = driver.run(Sleep(), SleepSpec(sizes=(1, 2, 3, 4), fail_at=3, error=how))
    assert r.partial and r.interrupted_by == name and [x.params["n"] for x in r.records] == [1, 2]


def test_a_swallowed_interrupt_still_stops_the_sweep():
    try:
        r = driver.run(Sleep(), SleepSpec(sizes=(1, 2, 3, 4), fail_at=2, error="noted"))
    finally:
        clear_signals()
    assert r.interrupted_by == "SIGINT" and [x.params["n"] for x in r.records] == [1, 2]


def test_other_errors_propagate():
    class Broken(Sleep):
        def measure(self, ctx, point):
            raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        driver.run(Broken(), SleepSpec(sizes=(1,)))


def test_generic_preflight_names_the_point_and_what_there_is():
    with pytest.raises(UsageError) as e:
        check_fits([Point("tiny", 1, host_bytes=1), Point("huge 1 PiB", 2, host_bytes=1 << 50)], None, "lower -e")
    msg = e.value.one_line()
    assert msg.startswith("huge 1 PiB needs 1024 TiB of host memory;") and msg.endswith("(lower -e)")
    with pytest.raises(UsageError) as e:
        check_fits([Point("locked", 1, locked_bytes=1 << 30)], 1 << 20, "lower -e")
    assert "would page-lock 1 GiB, over the cap of 1 MiB" in e.value.one_line()


def test_a_fault_after_a_noted_ctrl_c_is_the_interrupt():
    """Workers stopping because of the user's Ctrl-C are not a machine fault: exit 130, points kept."""

    class FaultAfterCtrlC(Sleep):
        def measure(self, ctx, point):
            if point.key == 2:
                note_signal(signal.SIGINT)
                raise MachineError("worker 0 died during run 2")
            return super().measure(ctx, point)

    try:
        r = driver.run(FaultAfterCtrlC(), SleepSpec(sizes=(1, 2, 3)))
    finally:
        clear_signals()
    assert r.partial and r.interrupted_by == "SIGINT" and r.failed_by is None
    assert [x.params["n"] for x in r.records] == [1]


def test_first_line_of_an_error_is_its_first_text_line_or_its_type_name():
    from gpubench.core.errors import first_line

    assert first_line(RuntimeError("cudaErrorMemoryAllocation: out of memory\ndetail")) == \
        "cudaErrorMemoryAllocation: out of memory"
    assert first_line(RuntimeError("")) == "RuntimeError"
    assert first_line(OSError("  \n  ")) == "OSError"

"""The sweep driver: allocation failures become error rows, interruption keeps what was measured."""

import signal

from gpubench.core.signals import Interrupted
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record
from gpubench.core.sweep import run_groups


def _rec(g):
    return [Record(params={"n": g}, nbytes=g, samples_s=[1e-3])]


def _err(g, e):
    return [Record(params={"n": g}, nbytes=g, error=str(e))]


def test_allocation_failure_row_and_sweep_goes_on():
    def measure(g):
        if g == 2:
            raise MemoryError("cannot allocate 2 bytes")
        return _rec(g)

    records, stop = run_groups([1, 2, 3], measure, _err, ProgressSink())
    assert stop is None
    assert [r.params["n"] for r in records] == [1, 2, 3]
    assert records[1].error == "cannot allocate 2 bytes" and records[2].error is None


def test_other_errors_propagate():
    def measure(g):
        raise RuntimeError("cudaErrorIllegalAddress")

    try:
        run_groups([1], measure, _err, ProgressSink())
    except RuntimeError as e:
        assert "Illegal" in str(e)
    else:
        raise AssertionError("a fault must not be swallowed")


def test_sigint_keeps_measured_points():
    def measure(g):
        if g == 3:
            raise KeyboardInterrupt
        return _rec(g)

    records, stop = run_groups([1, 2, 3, 4], measure, _err, ProgressSink())
    assert stop == "SIGINT"
    assert [r.params["n"] for r in records] == [1, 2]


def test_sigterm_named():
    def measure(g):
        raise Interrupted(signal.SIGTERM)

    records, stop = run_groups([1], measure, _err, ProgressSink())
    assert (records, stop) == ([], "SIGTERM")


def test_a_swallowed_interrupt_still_stops_the_sweep():
    """A KeyboardInterrupt lost in a gc callback ("Exception ignored") was noted by the handler;
    the driver stops at the next point and keeps what was measured."""
    from gpubench.core.signals import clear_signals, note_signal

    def measure(g):
        if g == 2:
            note_signal(signal.SIGINT)  # the handler ran, but its exception was swallowed
        return _rec(g)

    try:
        records, stop = run_groups([1, 2, 3, 4], measure, _err, ProgressSink())
    finally:
        clear_signals()
    assert stop == "SIGINT"
    assert [r.params["n"] for r in records] == [1, 2]

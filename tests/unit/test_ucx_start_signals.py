"""merge_cluster._start_holding_signals on a real IO loop thread (distributed's LoopRunner) with
real signals sent to this process: inside CRITICAL a SIGINT waits for the start to end, or for the
grace to pass, and the start's own deadline still holds."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

pytest.importorskip("distributed")

from gpubench.plugins.merge.cluster import _start_holding_signals, holding_signals  # noqa: E402
from gpubench.core import signals  # noqa: E402


@pytest.fixture
def loop():
    from distributed.utils import LoopRunner

    runner = LoopRunner(asynchronous=False)
    runner.start()
    previous = signals.install()
    yield runner.loop
    signals.restore(previous)
    runner.stop(timeout=2)


def _sigint_after(seconds: float) -> None:
    threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT)).start()


def _sleeper(seconds: float, done: list):
    async def start():
        await asyncio.sleep(seconds)
        done.append(True)
    return start


def test_a_sigint_during_the_start_is_raised_once_the_start_has_ended(loop, capsys):
    done: list = []
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with holding_signals():
            _sigint_after(0.2)
            _start_holding_signals(loop, _sleeper(1.0, done), timeout_s=30, grace_s=10)
            assert done == [True]  # the start ran to its end before the interrupt
    assert 1.0 <= time.monotonic() - t0 < 5
    assert "stopping once the ucx cluster has started (at most 10 s" in capsys.readouterr().err


def test_a_start_still_going_after_the_grace_is_cut_short(loop):
    done: list = []
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with holding_signals():
            _sigint_after(0.2)
            _start_holding_signals(loop, _sleeper(30, done), timeout_s=60, grace_s=0.5)
    assert time.monotonic() - t0 < 5 and done == []


def test_the_start_deadline_holds_with_no_signal(loop):
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        with holding_signals():
            _start_holding_signals(loop, _sleeper(30, []), timeout_s=0.5, grace_s=10)
    assert time.monotonic() - t0 < 5
    assert not signals.signal_noted()


def test_a_start_that_fails_after_a_signal_ends_as_interrupted(loop):
    """The signal reaches the workers too (a worker's /bin/sh wrapper can die of it before its trap:
    "Nanny failed to start"): that failure is the user's stop, exit 130, not a machine fault."""
    async def start():
        await asyncio.sleep(0.6)
        raise RuntimeError("Nanny failed to start.")

    with pytest.raises(KeyboardInterrupt):
        with holding_signals():
            _sigint_after(0.1)
            _start_holding_signals(loop, start, timeout_s=30, grace_s=10)


def test_a_start_that_fails_with_no_signal_raises_its_error(loop):
    async def start():
        raise RuntimeError("Nanny failed to start.")

    with pytest.raises(RuntimeError, match="Nanny failed"):
        with holding_signals():
            _start_holding_signals(loop, start, timeout_s=30, grace_s=10)

"""The order of CUDA-graph calls in nccl -G (bench.nccl.CapturedGraphs), checked against a recorder
of the runtime calls: no graph is instantiated while another stream still captures, and no graph
is left alive when the communicators are destroyed (either order can hang the GPU), so the order
and the clean-up on every failure are what these tests pin down. Nothing here measures anything."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest

from gpubench.plugins.nccl import graphs as N
from gpubench.core.errors import MachineError
from gpubench.core.signals import clear_signals


class Recorder:
    """Stands in for cupy.cuda.runtime: records calls; ``fail`` maps (call, device) -> exception."""

    streamCaptureModeThreadLocal = 1

    def __init__(self, fail=None, signal_in=()):
        self.calls: list[tuple] = []
        self.fail = fail or {}
        self.signal_in = set(signal_in)  # (call, device): a SIGINT arrives while this call runs
        self.device = 7
        self.live_execs: set[int] = set()
        self.live_graphs: set[int] = set()

    def _do(self, name, dev, result=None):
        self.calls.append((name, dev))
        exc = self.fail.get((name, dev))
        if exc is not None:
            raise exc
        self._maybe_signal(name, dev)
        return result

    def _maybe_signal(self, name, dev):
        if (name, dev) in self.signal_in:
            self.signal_in.discard((name, dev))
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs before this call returns

    def getDevice(self):
        return self.device

    def setDevice(self, d):
        self.device = d

    def streamBeginCapture(self, stream, mode):
        assert mode == self.streamCaptureModeThreadLocal
        self._do("begin", self.device)

    def streamEndCapture(self, stream):
        g = self._do("end", self.device, 100 + self.device)
        self.live_graphs.add(g)
        return g

    def graphInstantiate(self, g):
        assert self.device == g - 100, "instantiated on another device"
        begun = sum(c[0] == "begin" for c in self.calls)
        ended = sum(c[0] == "end" for c in self.calls)
        if begun != ended:  # what CUDA answers with cudaErrorStreamCaptureUnsupported
            raise RuntimeError("cudaErrorStreamCaptureUnsupported: a stream of this thread is capturing")
        e = self._do("instantiate", self.device, 200 + self.device)
        self.live_execs.add(e)
        return e

    def graphUpload(self, e, stream):
        self._do("upload", self.device)

    def graphDestroy(self, g):
        self.live_graphs.discard(g)
        self.calls.append(("destroy-graph", g - 100))
        self._maybe_signal("destroy-graph", g - 100)

    def graphExecDestroy(self, e):
        self.live_execs.discard(e)
        self.calls.append(("destroy-exec", e - 200))
        self._maybe_signal("destroy-exec", e - 200)

    def capturing(self):
        return sum(c[0] == "begin" for c in self.calls) - sum(c[0] == "end" for c in self.calls)

    def graphLaunch(self, e, stream):
        assert self.device == e - 200 and stream == 1000 + self.device
        self.calls.append(("launch", self.device))


RANKS = [SimpleNamespace(device=d, stream=SimpleNamespace(ptr=1000 + d)) for d in (0, 1)]


def _issue(rt, exc=None):
    def issue():
        rt.calls.append(("issue", None))
        if exc is not None:
            raise exc
    return issue


def _capture_and_close(rt, issue):
    """What the nccl code does: hold the object, capture, close in finally."""
    g = N.CapturedGraphs(runtime=rt)
    try:
        g.capture(RANKS, issue)
    finally:
        g.close()


def test_every_capture_ends_before_any_graph_is_instantiated_and_graphs_launch_on_their_gpu():
    rt = Recorder()
    g = N.CapturedGraphs(runtime=rt)
    assert rt.calls == []  # nothing is made before the caller holds the object
    g.capture(RANKS, _issue(rt))
    names = [c for c in rt.calls if c[0] != "destroy-graph"]
    assert names == [("begin", 0), ("begin", 1), ("issue", None), ("end", 0), ("end", 1),
                     ("instantiate", 0), ("upload", 0), ("instantiate", 1), ("upload", 1)]
    assert not rt.live_graphs and rt.live_execs == {200, 201} and rt.device == 7
    rt.calls.clear()
    g.launch()
    assert rt.calls == [("launch", 0), ("launch", 1)] and rt.device == 7
    g.close()
    g.close()
    assert not rt.live_execs and [c[0] for c in rt.calls[2:]] == ["destroy-exec", "destroy-exec"]


@pytest.mark.parametrize("exc", [ValueError("bad call"), KeyboardInterrupt()])
def test_a_failure_while_capturing_ends_every_capture_and_leaves_nothing(exc):
    rt = Recorder()
    with pytest.raises(type(exc)):
        _capture_and_close(rt, _issue(rt, exc))
    assert ("end", 0) in rt.calls and ("end", 1) in rt.calls
    assert not any(c[0] == "instantiate" for c in rt.calls)
    assert not rt.live_graphs and not rt.live_execs and rt.device == 7


def test_a_failure_beginning_the_second_capture_ends_the_first():
    rt = Recorder(fail={("begin", 1): RuntimeError("cudaErrorStreamCaptureUnsupported")})
    with pytest.raises(RuntimeError):
        _capture_and_close(rt, _issue(rt))
    assert ("end", 0) in rt.calls and ("end", 1) not in rt.calls and ("issue", None) not in rt.calls
    assert not rt.live_graphs


def test_an_invalidated_capture_is_a_machine_error_and_the_other_graph_is_destroyed():
    rt = Recorder(fail={("end", 1): RuntimeError("cudaErrorStreamCaptureInvalidated: x\nmore")})
    with pytest.raises(MachineError, match="CUDA-graph capture on GPU 1 failed: cudaErrorStreamCaptureInvalidated"):
        _capture_and_close(rt, _issue(rt))
    assert not rt.live_graphs and not rt.live_execs


@pytest.mark.parametrize("where,exc", [(("instantiate", 1), RuntimeError("out of memory")),
                                       (("upload", 1), KeyboardInterrupt())])
def test_a_failure_after_the_first_graph_was_instantiated_destroys_it(where, exc):
    """An executable graph left alive keeps ncclCommDestroy waiting for ever."""
    rt = Recorder(fail={where: exc})
    with pytest.raises(MachineError if isinstance(exc, RuntimeError) else KeyboardInterrupt):
        _capture_and_close(rt, _issue(rt))
    assert not rt.live_execs and not rt.live_graphs and rt.device == 7


@pytest.fixture
def cli_handlers():
    """The CLI's SIGINT handler (defers inside critical sections), restored afterwards."""
    from gpubench.core import signals

    old = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signals.on_signal)
    clear_signals()
    yield
    signal.signal(signal.SIGINT, old)
    clear_signals()


@pytest.mark.parametrize("where", [("begin", 0), ("begin", 1), ("end", 0), ("end", 1), ("instantiate", 0),
                                   ("instantiate", 1), ("upload", 0), ("upload", 1), ("destroy-graph", 0),
                                   ("destroy-graph", 1), ("destroy-exec", 0), ("destroy-exec", 1)])
def test_a_ctrl_c_at_any_runtime_call_leaves_no_capture_open_and_no_graph_alive(cli_handlers, where):
    """A Ctrl-C handled right after a runtime call returns keeps what the call made, so it is
    cleaned up (an executable graph left alive would keep ncclCommDestroy waiting for ever)."""
    rt = Recorder(signal_in=[where])
    with pytest.raises(KeyboardInterrupt):
        _capture_and_close(rt, _issue(rt))
    assert rt.capturing() == 0 and not rt.live_graphs and not rt.live_execs and rt.device == 7
    assert not rt.signal_in, "the signal was never sent: the window was not reached"

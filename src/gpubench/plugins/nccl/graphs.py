"""nccl -G: one CUDA graph per local rank's stream, captured from the ranks' NCCL calls, launched
together and destroyed before the communicators (nccl-tests BenchTime with -G)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Callable

from gpubench.core.errors import MachineError, first_line
from gpubench.core.signals import CRITICAL

if TYPE_CHECKING:
    from gpubench.plugins.nccl.comm import Rank


class CapturedGraphs:
    """One CUDA graph per local rank's stream, captured from the NCCL calls ``issue()`` makes
    (nccl-tests BenchTime with -G; CUDA programming guide, "Creating a Graph Using Stream Capture").
    :meth:`close` must run before the communicators are destroyed (the graphs hold NCCL resources).
    """

    def __init__(self, runtime=None):
        """``runtime``: cupy.cuda.runtime unless given."""
        if runtime is None:
            from cupy.cuda import runtime

        self._rt = runtime
        self.launches: list[tuple[int, int, int]] = []  # (device, graph exec, stream) per rank

    def capture(self, ranks: list[Rank], issue: Callable[[], None]) -> None:
        """Capture ``issue()``'s calls on every rank's stream into one instantiated, uploaded graph per
        rank; every capture ends before any graph is instantiated.

        Raises:
            MachineError: a capture was invalidated or a graph could not be instantiated.
            Whatever ``issue()`` or the runtime raised, after every capture was ended.
        """
        rt = self._rt
        prev = rt.getDevice()
        capturing: list[Rank] = []
        graphs: list[tuple[Rank, int]] = []
        failure: BaseException | None = None
        try:
            try:
                for rk in ranks:
                    with CRITICAL:
                        rt.setDevice(rk.device)
                        rt.streamBeginCapture(rk.stream.ptr, rt.streamCaptureModeThreadLocal)
                        capturing.append(rk)
                issue()
            except BaseException as e:
                failure = e
            with CRITICAL:  # every capture ends, whatever happened inside it, Ctrl-C included
                for rk in capturing:
                    rt.setDevice(rk.device)
                    try:
                        graphs.append((rk, rt.streamEndCapture(rk.stream.ptr)))
                    except Exception as e:
                        failure = failure or MachineError(
                            f"CUDA-graph capture on GPU {rk.device} failed: {first_line(e)}")
            if failure is None:
                for rk, g in graphs:
                    with CRITICAL:
                        rt.setDevice(rk.device)
                        try:
                            ex = rt.graphInstantiate(g)
                        except Exception as e:
                            failure = MachineError(f"instantiating the CUDA graph of GPU {rk.device} failed: "
                                                   f"{first_line(e)}")
                            break
                        self.launches.append((rk.device, ex, rk.stream.ptr))
                    rt.graphUpload(ex, rk.stream.ptr)
        finally:
            with CRITICAL:  # an executable graph keeps what it needs of its graph
                for _, g in graphs:
                    with contextlib.suppress(Exception):
                        rt.graphDestroy(g)
                rt.setDevice(prev)
        if failure is not None:
            raise failure

    def launch(self, _k: int = 0) -> None:
        """Launch every rank's graph on its stream (cudaGraphLaunch; asynchronous)."""
        rt = self._rt
        prev = rt.getDevice()
        with CRITICAL:  # one rank's graph launched without its peer's would wait for it for ever
            for dev, ex, stream in self.launches:
                rt.setDevice(dev)
                rt.graphLaunch(ex, stream)
            rt.setDevice(prev)

    def close(self) -> None:
        """Destroy the executable graphs (idempotent; a signal arriving meanwhile is raised after)."""
        with CRITICAL:
            while self.launches:
                _, ex, _ = self.launches.pop()
                with contextlib.suppress(Exception):
                    self._rt.graphExecDestroy(ex)


class GraphOwner:
    """Every CapturedGraphs of one run, so that the run's teardown closes any still open before the
    communicators are destroyed."""

    def __init__(self) -> None:
        self._made: list[CapturedGraphs] = []

    def new(self) -> CapturedGraphs:
        g = CapturedGraphs()
        self._made.append(g)
        return g

    def close_all(self) -> None:
        while self._made:
            self._made.pop().close()

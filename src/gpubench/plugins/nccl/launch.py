"""nccl's launching and timing: the calls of one iteration (nccl-tests startColl), the bounded launch
queue, the timed samples (nccl-tests BenchTime), the checked call and the drain."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Callable

from gpubench.plugins.nccl import collectives as C
from gpubench.plugins.nccl.comm import Rank, wait_all
from gpubench.plugins.nccl.data import pointers
from gpubench.plugins.nccl.graphs import CapturedGraphs
from gpubench.core.signals import CRITICAL

if TYPE_CHECKING:
    from gpubench.plugins.nccl.bench import NcclSpec


def _calls(ranks: list[Rank], coll: C.Collective, cc: C.CollCounts, dt: C.DType, op_id: int, root: int,
           in_place: bool, shift: int, nranks: int) -> C.Calls:
    """The NCCL calls of one iteration on every local rank (nccl-tests startColl), as (function,
    arguments) pairs, grouped when there are several local ranks (nccl-tests -g N), step by step."""
    from cupy.cuda import nccl, runtime

    def copy(dst: int, src: int, nbytes: int, stream: int) -> None:
        runtime.memcpyAsync(dst, src, nbytes, runtime.memcpyDeviceToDevice, stream)

    per_rank = []
    for rk in ranks:
        s, r = pointers(rk, cc, dt.size, in_place, shift)
        per_rank.append(C.steps(coll.call(C.RankCall(rk.comm, s, r, cc.param_count, dt, op_id, root, rk.rank, nranks,
                                                     rk.stream.ptr, nccl.groupStart, nccl.groupEnd, copy))))
    out: C.Calls = []
    for k in range(max(len(st) for st in per_rank)):  # step k on every local rank before step k + 1
        step = [c for st in per_rank if k < len(st) for c in st[k]]
        out += [(nccl.groupStart, ()), *step, (nccl.groupEnd, ())] if len(ranks) > 1 else step
    return out


_MAX_PLANS = 4096


def launcher(ranks: list[Rank], coll: C.Collective, cc: C.CollCounts, dt: C.DType, op_id: int, root: int,
             in_place: bool, nranks: int, total: int, maxbytes: int, iters: int) -> Callable[[int], None]:
    """``launch(it)``: iteration ``it``'s calls, its buffers moved by one operation size per
    iteration (nccl-tests' shift). The call lists are built here, before any timing, up to _MAX_PLANS."""
    plans: dict[int, C.Calls] = {}

    def plan(it: int) -> C.Calls:
        shift = _shift(it, total, maxbytes)
        calls = plans.get(shift)
        if calls is None:
            calls = _calls(ranks, coll, cc, dt, op_id, root, in_place, shift, nranks)
            if len(plans) < _MAX_PLANS:
                plans[shift] = calls
        return calls

    for it in range(min(iters, _MAX_PLANS)):
        plan(it)

    def launch(it: int) -> None:
        calls = plan(it)
        with CRITICAL:  # a Ctrl-C between ncclGroupStart and ncclGroupEnd would leave the group open
            for fn, args in calls:
                fn(*args)

    return launch


# At most this many iterations are queued ahead of the GPU: past CUDA's launch-queue depth a launch
# blocks the host inside the driver, where no deadline can reach it.
MAX_QUEUED = 256
_MARK_EVERY = 32  # an event is recorded on each stream every this many iterations


def queue_bounds(n: int, per_launch: int = 1) -> tuple[bool, int, int]:
    """How run_iters bounds the launch queue for ``n`` launches of ``per_launch`` iterations each:
    (bounded, launches between events, events allowed in flight). Past MAX_QUEUED + _MARK_EVERY
    iterations, the event recorded every _MARK_EVERY is waited for once MAX_QUEUED newer are queued."""
    every = max(1, _MARK_EVERY // per_launch)
    window = max(1, MAX_QUEUED // (every * per_launch))
    return n * per_launch > MAX_QUEUED + _MARK_EVERY, every, window


def run_iters(ranks: list[Rank], n: int, launch: Callable[[int], None], timeout_s: float,
              per_launch: int = 1) -> None:
    """Queue ``launch(0..n-1)`` (``per_launch`` iterations each) with at most about MAX_QUEUED
    iterations in flight (:func:`queue_bounds`), without waiting for the last ones."""
    import cupy

    bounded, every, window = queue_bounds(n, per_launch)
    marks: list[list] = []
    for it in range(n):
        if bounded and it and it % every == 0:
            evs = []
            for rk in ranks:
                with cupy.cuda.Device(rk.device):
                    ev = cupy.cuda.Event(block=False, disable_timing=True)
                    ev.record(rk.stream)
                evs.append(ev)
            marks.append(evs)
            if len(marks) > window:
                wait_all(ranks, timeout_s, events=marks.pop(0))
        launch(it)


def _shift(it: int, total_bytes: int, maxbytes: int) -> int:
    """nccl-tests startColl: each iteration moves by one operation size, wrapping inside the buffers."""
    steps = maxbytes // total_bytes if total_bytes else 1
    return total_bytes * (it % max(1, steps))


def timed_samples(spec: NcclSpec, ranks: list[Rank], one: Callable[[int], None], barrier: Callable[[], None],
                  new_graphs: Callable[[], CapturedGraphs] = CapturedGraphs) -> list[float]:
    """spec.samples per-iteration times in seconds: span / iters, or with -G G the iterations
    captured into graphs once and each sample G graph launches, span / (iters * G) (nccl-tests BenchTime)."""
    graphs = new_graphs() if spec.cuda_graph else None
    try:
        if graphs is not None:
            def issue() -> None:
                for it in range(spec.iters):
                    one(it)

            graphs.capture(ranks, issue)
            launch: Callable[[int], None] = graphs.launch
            n, per_launch = spec.cuda_graph, spec.iters
        else:
            n, per_launch, launch = spec.iters, 1, one
        samples = []
        for _ in range(spec.samples):
            barrier()
            t0 = time.perf_counter()
            run_iters(ranks, n, launch, spec.timeout_s, per_launch)
            wait_all(ranks, spec.timeout_s)
            samples.append((time.perf_counter() - t0) / (n * per_launch))
        return samples
    finally:
        if graphs is not None:
            graphs.close()


def checked_call(spec: NcclSpec, ranks: list[Rank], one: Callable[[int], None],
                 new_graphs: Callable[[], CapturedGraphs] = CapturedGraphs) -> None:
    """The call whose output is checked, run to completion (with -G, through a graph of one iteration)."""
    if not spec.cuda_graph:
        one(0)
        wait_all(ranks, spec.timeout_s)
        return
    graphs = new_graphs()
    try:
        graphs.capture(ranks, lambda: one(0))
        graphs.launch()
        wait_all(ranks, spec.timeout_s)
    finally:
        graphs.close()


DRAIN_S = 10.0


def drain(ranks: list[Rank], timeout_s: float) -> None:
    """After an interrupt or a fault: let the queued work finish (at most DRAIN_S seconds, or -T if
    shorter) before it is freed; past that the communicators are aborted. Never raises."""
    if all(rk.aborted for rk in ranks):
        return
    with contextlib.suppress(BaseException):
        wait_all(ranks, min(DRAIN_S, timeout_s) if timeout_s else DRAIN_S)

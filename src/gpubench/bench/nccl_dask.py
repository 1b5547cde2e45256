"""nccl across processes: one rank per worker of an existing Dask cluster (nccl-tests under MPI).
The NCCL unique id comes from rank 0's worker through the scheduler; each worker measures with the
same point loop as one process (bench/nccl.measure_points); the client watches for a worker that
leaves, fails or stalls, and combines the ranks' samples."""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict
from typing import Any, Callable

from gpubench.bench import collectives as C
from gpubench.bench.nccl import NcclSpec, Point, _check_root, _timing, measure_points, to_records
from gpubench.bench.nccl_comm import Rank, abort, nccl_env, wait_all
from gpubench.core import env as envmod
from gpubench.core.errors import MachineError, UsageError
from gpubench.core.signals import Interrupted
from gpubench.core.report import ProgressSink
from gpubench.core.result import Result


def _worker_unique_id():
    from cupy.cuda import nccl

    return nccl.get_unique_id()


def _worker_run(spec: NcclSpec, uid: tuple, rank: int, nranks: int, topic: str) -> dict:
    """Runs on a Dask worker: one rank on the worker's current GPU; returns its points as dicts.

    After the communicator is up and after each point it logs an event on ``topic`` (rank, points
    done), which the client watches to name a rank that stopped answering.
    """
    import socket

    import cupy
    from cupy.cuda import nccl
    from distributed import get_worker

    worker = get_worker()

    def tell(done: int) -> None:
        worker.log_event(topic, {"rank": rank, "points": done})

    device = cupy.cuda.Device().id
    comm = nccl.NcclCommunicator(nranks, uid, rank)
    tell(0)
    rk = Rank(rank, device, comm, max(spec.sizes))
    flag = cupy.zeros(1, dtype=cupy.float32)
    done: list[Point] = []

    def barrier():
        comm.allReduce(flag.data.ptr, flag.data.ptr, 1, C.DTYPES["float"].nccl, C.OPS["sum"], rk.stream.ptr)
        wait_all([rk], spec.timeout_s)

    def on_point(p: Point) -> None:
        done.append(p)
        tell(len(done))

    try:
        points = measure_points(spec, [rk], nranks, barrier, ProgressSink(), on_point=on_point)
    except BaseException:
        abort([rk])  # a peer left or timed out: the communicator cannot be destroyed cleanly
        raise
    finally:
        rk.free()
    comm.destroy()
    return {"rank": rank, "host": socket.gethostname(), "device": device, "allocator": rk.send.allocator,
            "nccl": nccl_env(nccl), "points": [asdict(p) for p in points]}


class StallWatch:
    """Names the rank whose progress stopped: each rank logs (rank, points done) as it goes; if no
    rank has logged anything new for ``timeout_s``, the ranks with the fewest points are the ones
    the others wait for.

    ``events`` is a callable returning [(time, {"rank": r, "points": n}), ...] (``client.get_events``).
    """

    def __init__(self, events: Callable[[], Any], workers: list[str], timeout_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.events, self.workers, self.timeout_s, self.clock = events, workers, timeout_s, clock
        self.progress = {r: -1 for r in range(len(workers))}  # -1: communicator not up yet
        self.last_change = clock()

    def __call__(self) -> None:
        """Raises MachineError when nothing moved for timeout_s, naming the lagging ranks."""
        changed = False
        for _t, msg in self.events():
            r, n = msg.get("rank"), msg.get("points", -1)
            if r in self.progress and n > self.progress[r]:
                self.progress[r] = n
                changed = True
        now = self.clock()
        if changed:
            self.last_change = now
            return
        if self.timeout_s and now - self.last_change > self.timeout_s:
            low = min(self.progress.values())
            lag = [r for r, n in self.progress.items() if n == low]
            where = "before the communicator was up" if low < 0 else f"after {low} point(s)"
            names = ", ".join(f"rank {r} ({self.workers[r]})" for r in lag)
            raise MachineError(f"{names} stopped answering {where}: nothing moved for --timeout "
                               f"{self.timeout_s:g} s", "the rank's worker log says why; raise -T for a slow link")


def combine_ranks(per_rank: list[list[dict]]) -> list[Point]:
    """Points of every rank -> one list: per-sample times averaged over ranks (nccl-tests ``-a 1``),
    wrong counts summed (a rank's None counts as unchecked)."""
    out = []
    for pts in zip(*per_rank):
        first = pts[0]
        samples = [sum(p["samples_s"][k] for p in pts) / len(pts) for k in range(len(first["samples_s"]))]
        wrongs = [p["wrong"] for p in pts]
        wrong = None if any(w is None for w in wrongs) else sum(wrongs)
        err = next((p["error"] for p in pts if p.get("error")), None)
        out.append(Point(first["nbytes"], first["count"], first["place"], samples, wrong, err))
    return out


def connect_timeout(timeout_s: float) -> float:
    """Seconds to wait for the Dask scheduler: Dask's own distributed.comm.timeouts.connect (30 s
    unless configured, e.g. DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT=120s), or -T when that is
    shorter (0 = no -T)."""
    import dask.config
    from dask.utils import parse_timedelta

    dask_s = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), default="seconds")
    return min(dask_s, timeout_s) if timeout_s else dask_s


def run_on_dask(spec: NcclSpec, progress: ProgressSink | None = None) -> Result:
    """One rank per worker of an existing Dask cluster; the NCCL unique id comes from rank 0's worker
    through the scheduler. Workers use their current GPU (dask-cuda gives each worker one).

    Every wait is watched (core.scheduler.wait_watching): a worker that leaves the cluster, a rank
    whose task fails (a peer gone: its NCCL wait times out after -T and aborts the communicator), or
    no rank moving for -T seconds (StallWatch) ends the run with exit 3 naming the worker and rank.

    Raises:
        UsageError: dask.distributed not installed, the scheduler cannot be reached, no workers.
        MachineError: a worker failed, left or stalled.
    """
    progress = progress or ProgressSink()
    try:
        from distributed import Client
    except ImportError:
        raise UsageError("--scheduler-address/--scheduler-file need dask.distributed",
                         "pip install gpubench[dask]") from None
    from gpubench.core.scheduler import check_scheduler_address, error_line, scheduler_file_address, wait_watching

    if spec.scheduler_address:
        check_scheduler_address(spec.scheduler_address)
    else:
        scheduler_file_address(spec.scheduler_file)  # distributed waits forever for a missing one
    try:
        connect = connect_timeout(spec.timeout_s)
        client = Client(spec.scheduler_address, timeout=connect) if spec.scheduler_address else \
            Client(scheduler_file=spec.scheduler_file, timeout=connect)
    except (OSError, ValueError) as e:
        where = spec.scheduler_address or spec.scheduler_file
        raise UsageError(f"cannot reach the Dask scheduler at {where!r}: {str(e).splitlines()[0]}") from None
    try:
        workers = sorted(client.scheduler_info()["workers"])
        if not workers:
            raise UsageError("the Dask cluster has no workers")
        nranks = len(workers)
        _check_root(spec, nranks)
        progress.start(1, f"{spec.collective} on {nranks} Dask workers")
        index = {w: r for r, w in enumerate(workers)}
        topic = f"gpubench-nccl-{uuid.uuid4().hex}"
        futures = []
        try:
            uid_f = client.submit(_worker_unique_id, workers=[workers[0]], pure=False)
            wait_watching(client, [uid_f], index, spec.timeout_s or 3600, "getting the NCCL unique id on rank 0",
                          hint="raise -T")
            uid = uid_f.result()
            futures = [client.submit(_worker_run, spec, uid, r, nranks, topic, workers=[w],
                                     allow_other_workers=False, pure=False) for r, w in enumerate(workers)]
            stall = StallWatch(lambda: client.get_events(topic), workers, spec.timeout_s)
            # no overall deadline: a run of many sizes may be long; StallWatch stops one that stalls
            wait_watching(client, futures, index, float("inf"), f"{spec.collective} on {nranks} Dask workers",
                          on_poll=stall)
            results = [f.result() for f in futures]
        except BaseException as e:
            for f in futures:
                f.cancel()
            if isinstance(e, (MachineError, UsageError, KeyboardInterrupt, Interrupted)) or \
                    not isinstance(e, Exception):
                raise
            raise MachineError(f"the Dask cluster failed during the run: {error_line(e)[:200]}") from None
        progress.advance()
        results.sort(key=lambda d: d["rank"])
        points = combine_ranks([d["points"] for d in results])
    finally:
        progress.done()
        client.close()
    env = envmod.capture()
    env["dask_workers"] = [{"address": w, "host": d["host"], "device": d["device"], "rank": d["rank"],
                            "nccl": d.get("nccl")} for w, d in zip(workers, results)]
    env["nccl"] = results[0].get("nccl")  # rank 0's NCCL version and NCCL_* variables; each worker's above
    return Result(
        command="nccl",
        spec={**spec.to_dict(), "nranks": nranks},
        timing=_timing(spec, results[0].get("allocator")),
        env=env,
        records=to_records(spec, points, nranks),
    )

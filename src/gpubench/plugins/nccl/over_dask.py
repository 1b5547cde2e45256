"""nccl across processes: one rank per worker of an existing Dask cluster (nccl-tests under MPI),
run by the driver on the client. Each worker measures every point back to back, logging each
finished point on the run's event topic; the client combines the ranks' samples point by point.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import asdict
from typing import Any, Callable, Iterator, Sequence

from gpubench.plugins.nccl.bench import (Nccl, NcclSpec, Point, _check_root, _timing, combined_point, measure_point,
                                         point_keys, point_label, to_records)
from gpubench.plugins.nccl.comm import Rank, abort, make_barrier, nccl_env
from gpubench.plugins.nccl.graphs import GraphOwner
from gpubench.core import benchmark as driver
from gpubench.core.benchmark import Benchmark, Context
from gpubench.core.errors import MachineError, UsageError, first_line
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result
from gpubench.core.units import format_size


def _worker_unique_id():
    from cupy.cuda import nccl

    return nccl.get_unique_id()


def _worker_run(spec: NcclSpec, uid: tuple, rank: int, nranks: int, topic: str) -> dict:
    """Runs on a Dask worker: one rank on the worker's current GPU, every point of ``spec`` in turn;
    returns the info, "rank", and "points". Logs {"rank", "points": n} on ``topic`` as it goes,
    with "info" once the buffers are up and "point" after each point.
    """
    import socket

    import cupy
    from cupy.cuda import nccl
    from distributed import get_worker

    from gpubench.plugins.nccl.launch import drain

    worker = get_worker()

    def tell(**msg) -> None:
        worker.log_event(topic, {"rank": rank, **msg})

    device = cupy.cuda.Device().id
    comm = nccl.NcclCommunicator(nranks, uid, rank)
    tell(points=0)
    rk = Rank(rank, device, comm, max(spec.sizes))
    info = {"host": socket.gethostname(), "device": device, "allocator": rk.send.allocator, "nccl": nccl_env(nccl)}
    tell(points=0, info=info)
    barrier = make_barrier([rk], spec.timeout_s)
    graphs = GraphOwner()
    done: list[dict] = []
    try:
        for size, place in point_keys(spec):
            done.append(asdict(measure_point(spec, [rk], nranks, barrier, size, place, graphs.new)))
            tell(points=len(done), point=done[-1])
    except BaseException:  # nothing is freed under queued work
        drain([rk], spec.timeout_s)
        abort([rk])  # a peer left or timed out: the communicator cannot be destroyed cleanly
        raise
    finally:
        graphs.close_all()
        rk.free()
    comm.destroy()
    return {**info, "rank": rank, "points": done}


class StallWatch:
    """Names the rank whose progress stopped: if no rank has logged anything new for ``timeout_s``,
    the ranks with the fewest points. ``events``: a callable returning [(time, {"rank", "points"}), ...].
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
    """Points of every rank -> one list, the samples averaged over ranks (nccl-tests ``-a 1``).

    Raises:
        MachineError: the ranks returned different numbers of points, or of samples for one point.
    """
    if len({len(pts) for pts in per_rank}) > 1:
        raise MachineError(f"the Dask ranks returned different numbers of points: {[len(p) for p in per_rank]}")
    out = []
    for pts in zip(*per_rank):
        first = pts[0]
        try:
            out.append(combined_point(first["nbytes"], first["count"], first["place"], pts, 1))
        except ValueError:
            raise MachineError(f"the Dask ranks returned different numbers of samples for {format_size(first['nbytes'])} "
                               f"{first['place']}: {[len(p['samples_s']) for p in pts]}") from None
    return out


def connect_timeout(timeout_s: float) -> float:
    """Seconds to wait for the Dask scheduler: Dask's distributed.comm.timeouts.connect, or -T when shorter."""
    import dask.config
    from dask.utils import parse_timedelta

    dask_s = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), default="seconds")
    return min(dask_s, timeout_s) if timeout_s else dask_s


# -- the client's side ------------------------------------------------------------------------------


class _Arrived(Exception):
    """Ends a watched wait early: the point waited for has come from every rank."""


@contextlib.contextmanager
def _cluster_faults() -> Iterator[None]:
    """Any other failure of the cluster (a Dask or comm error) becomes one MachineError line."""
    from gpubench.launch.scheduler import error_line

    try:
        yield
    except (MachineError, UsageError, _Arrived):
        raise
    except Exception as e:
        raise MachineError(f"the Dask cluster failed during the run: {error_line(e)[:200]}") from None


class _Ranks:
    """The client's view of one run's ranks (rank r on workers[r]): their futures, the events they
    logged, the points and info each has reported."""

    def __init__(self, client, workers: list[str], spec: NcclSpec):
        self.client, self.workers, self.spec = client, workers, spec
        self.index = {w: r for r, w in enumerate(workers)}
        self.what = f"{spec.collective} on {len(workers)} Dask workers"
        self.topic = f"gpubench-nccl-{uuid.uuid4().hex}"
        self.events: list = []  # (time, message), appended by the client's event loop as they come
        self.futures: list = []
        self.points: list[dict[int, dict]] = [{} for _ in workers]  # rank -> point index -> point
        self.info: list[dict | None] = [None for _ in workers]
        self.returned = False
        self._read = 0
        self.stall = StallWatch(lambda: list(self.events), workers, spec.timeout_s)

    def start(self) -> None:
        """Subscribe to the topic, get the unique id from rank 0's worker, submit one rank per worker.

        Raises:
            MachineError: getting the id failed or passed -T.
        """
        from gpubench.launch.scheduler import results_within, wait_watching

        # before the ranks start: a subscription sees only the events logged after it
        self.client.subscribe_topic(self.topic, self.events.append)
        uid_f = self.client.submit(_worker_unique_id, workers=[self.workers[0]], pure=False)
        watched = (self.client, [uid_f], self.index, self.spec.timeout_s or 3600, "getting the NCCL unique id on rank 0")
        wait_watching(*watched, hint="raise -T")
        uid, = results_within(*watched, hint="raise -T")
        n = len(self.workers)
        self.futures = [self.client.submit(_worker_run, self.spec, uid, r, n, self.topic, workers=[w],
                                           allow_other_workers=False, pure=False) for r, w in enumerate(self.workers)]

    def _have(self, i: int) -> bool:
        """Whether every rank has logged point ``i`` (the events logged since the last look read first)."""
        new = self.events[self._read:]
        self._read += len(new)
        for _t, msg in new:
            r = msg.get("rank") if isinstance(msg, dict) else None
            if not isinstance(r, int) or not 0 <= r < len(self.workers):
                continue
            if "point" in msg:
                self.points[r][msg["points"] - 1] = msg["point"]
            if "info" in msg:
                self.info[r] = msg["info"]
        return all(i in p for p in self.points)

    def wait_for(self, i: int, until_returned: bool) -> list[dict]:
        """Every rank's report of point ``i``, once every rank has logged it, or (with
        ``until_returned``) once every rank's task has returned.

        Raises:
            MachineError: a worker left, a rank's task failed or stalled, or point i is missing.
        """
        from gpubench.launch.scheduler import results_within, wait_watching

        def poll() -> None:
            self.stall()
            if not until_returned and self._have(i):
                raise _Arrived

        if until_returned or not self._have(i):
            try:
                # no overall deadline: StallWatch stops a point that stalls
                wait_watching(self.client, self.futures, self.index, float("inf"), self.what, on_poll=poll)
            except _Arrived:
                pass
            except MachineError:
                # the point may have come in with the fault: it is kept, the fault stops the next
                if until_returned or not self._have(i):
                    raise
            else:  # every rank's task returned: its points and info are the ranks' own account
                self.returned = True
                for d in results_within(self.client, self.futures, self.index, self.spec.timeout_s or 3600,
                                        self.what, hint="raise -T"):
                    self.info[d["rank"]] = d
                    self.points[d["rank"]].update(enumerate(d.get("points") or []))
        if not self._have(i):
            missing = [r for r, p in enumerate(self.points) if i not in p]
            raise MachineError(f"rank(s) {', '.join(map(str, missing))} returned without point {i + 1} "
                               f"during {self.what}")
        return [p[i] for p in self.points]

    def close(self) -> None:
        """Cancel the ranks' tasks that did not return and unsubscribe."""
        if not self.returned:
            for f in self.futures:
                f.cancel()
        with contextlib.suppress(Exception):
            self.client.unsubscribe_topic(self.topic)

    def env(self) -> dict:
        """The Result's env additions: each worker's rank, host, GPU, NCCL; rank 0's NCCL."""
        workers = [{"address": w, "host": (d or {}).get("host"), "device": (d or {}).get("device"), "rank": r,
                    "nccl": (d or {}).get("nccl")} for r, (w, d) in enumerate(zip(self.workers, self.info))]
        return {"dask_workers": workers, "nccl": (self.info[0] or {}).get("nccl")}


class NcclDask(Benchmark):
    """The nccl plug-in for one rank per Dask worker, run by the driver on the client (no GPU there).
    A point is (index, size, placement)."""

    name = Nccl.name
    needs_gpu = False  # the client only schedules; each worker uses its own GPU
    derive = Nccl.derive  # the collective limit rule, with no local GPU (ctx.devices is empty)

    def points(self, spec: NcclSpec, devices: tuple[int, ...]) -> list[driver.Point]:
        return [driver.Point(label=point_label(spec, size, place), key=(i, size, place))
                for i, (size, place) in enumerate(point_keys(spec))]

    def preflight(self, spec: NcclSpec, points: Sequence[driver.Point], devices: tuple[int, ...]) -> None:
        """dask.distributed must be installed and the scheduler's address or file must be one.

        Raises:
            UsageError: dask.distributed missing, a malformed address, a missing or bad scheduler file.
        """
        try:
            import distributed  # noqa: F401
        except ImportError:
            raise UsageError("--scheduler-address/--scheduler-file need dask.distributed",
                             "pip install 'gpubench-cuda[dask]'") from None
        from gpubench.launch.scheduler import check_scheduler_address, scheduler_file_address

        if spec.scheduler_address:
            check_scheduler_address(spec.scheduler_address)
        else:
            scheduler_file_address(spec.scheduler_file or "")  # distributed waits forever for a missing one

    @contextlib.contextmanager
    def setup(self, ctx: Context) -> Iterator[Context]:
        """The client, the workers as ranks and their tasks started; afterwards their info in ``ctx.env``.

        Raises:
            UsageError: the scheduler cannot be reached, no workers, a root that is not a rank.
            MachineError: getting the unique id failed.
        """
        from distributed import Client

        spec = ctx.spec
        try:
            client = Client(spec.scheduler_address, scheduler_file=spec.scheduler_file,
                            timeout=connect_timeout(spec.timeout_s))
        except (OSError, ValueError) as e:
            where = spec.scheduler_address or spec.scheduler_file
            raise UsageError(f"cannot reach the Dask scheduler at {where!r}: {first_line(e)}") from None
        ranks: _Ranks | None = None
        try:
            workers = sorted(client.scheduler_info()["workers"])
            if not workers:
                raise UsageError("the Dask cluster has no workers")
            _check_root(spec, len(workers))
            ranks = _Ranks(client, workers, spec)
            ctx.data.update(ranks=ranks, npoints=len(point_keys(spec)))
            with _cluster_faults():
                ranks.start()
            yield ctx
        finally:
            if ranks is not None:
                ranks.close()
                ctx.env.update(ranks.env())
            client.close()

    def measure(self, ctx: Context, point: driver.Point) -> list[Record]:
        """Point ``i`` from every rank, its samples averaged over the ranks (nccl-tests -a 1).

        Raises:
            MachineError: a worker left, a rank failed or stalled, or the cluster failed.
        """
        i = point.key[0]
        ranks: _Ranks = ctx.data["ranks"]
        with _cluster_faults():
            reports = ranks.wait_for(i, until_returned=i == ctx.data["npoints"] - 1)
        return to_records(ctx.spec, combine_ranks([[d] for d in reports]), len(ranks.workers))

    def spec_dict(self, ctx: Context) -> dict:
        return ctx.spec.to_dict(nranks=len(ctx.data["ranks"].workers))

    def timing(self, ctx: Context) -> dict:
        return _timing(ctx.spec, (ctx.data["ranks"].info[0] or {}).get("allocator"))


BENCHMARK = NcclDask()


def run_on_dask(spec: NcclSpec, progress: ProgressSink | None = None) -> Result:
    """One rank per worker of an existing Dask cluster, through the driver; workers use their current GPU.

    Raises:
        UsageError: dask.distributed not installed, the scheduler cannot be reached, no workers.
        MachineError: a worker failed, left or stalled; ``partial_result`` holds the finished points.
    """
    return driver.run(BENCHMARK, spec, progress)

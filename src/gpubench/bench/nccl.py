"""``gpubench nccl``: NCCL collectives through CuPy's bindings, timed as nccl-tests times them.

One process, one communicator per GPU (``NcclCommunicator.initAll``), the ranks' calls grouped
between ``ncclGroupStart``/``ncclGroupEnd`` (nccl-tests ``-g N``); or, with a Dask scheduler, one
rank per worker (the unique id passed through the scheduler; nccl-tests under MPI).

What is timed (nccl-tests 2.19.6 src/common.cu BenchTime; docs/nccl.md): a host clock
(``perf_counter``) started before ``iters`` grouped launches are queued and stopped when every
rank's stream has finished (polled with cudaStreamQuery, as testStreamSynchronize does); the
per-iteration time is that span / iters. With ``cuda_graph`` G > 0 (nccl-tests ``-G``), the
``iters`` iterations are captured once per point into one CUDA graph per rank's stream and a
sample is G launches of those graphs: span / (iters * G). Each iteration moves its buffers by one
operation size within buffers of the largest size (nccl-tests' ``shift``, against cache effects).
Before the timed iterations: ``warmup`` iterations and one more (nccl-tests' "Sync" call), each
followed by a full synchronisation. A sample is one such timed span; the report shows the median over samples;
across processes the per-sample times are averaged (nccl-tests' default ``-a 1``).

What differs between collectives (byte counts, algbw and busbw formula, the NCCL call, the
expected data, which ranks are checked) is the collective's entry in bench/collectives.py; this
module is the public face (spec, run, records) and iterates entries. The rest lives by job:
nccl_comm (communicators, buffers, waits, faults), nccl_launch (the calls of an iteration, the
launch queue, the timed samples), nccl_graphs (-G), nccl_data (initialisation and check) and
nccl_dask (one rank per Dask worker).
"""

from __future__ import annotations

import signal
from dataclasses import asdict, dataclass
from typing import Any, Callable

from gpubench.bench import collectives as C
from gpubench.bench import nccl_data as D
from gpubench.bench import nccl_launch as L
from gpubench.bench.nccl_comm import Rank, as_machine_error, nccl_env, nccl_module, wait_all
from gpubench.core import env as envmod
from gpubench.core import gpu
from gpubench.core.errors import MachineError, UsageError, check_choices
from gpubench.core.signals import Interrupted
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result
from gpubench.core.units import format_size

PLACES = ("out-of-place", "in-place")


@dataclass(frozen=True)
class NcclSpec:
    """Parsed options of ``gpubench nccl``.

    Attributes:
        collective: canonical name (a key of collectives.COLLECTIVES).
        sizes: operation sizes in bytes (nccl-tests -b/-e/-f), ascending.
        dtype: a key of collectives.DTYPES.
        op: a key of collectives.OPS (ignored by collectives that do not reduce).
        root: root rank of broadcast and reduce.
        devices: CUDA ordinals for the single-process run, or None for every visible GPU.
        warmup: untimed iterations per size before timing (nccl-tests -w).
        iters: iterations per timed sample (nccl-tests -n).
        samples: timed samples per point; the median is reported.
        check: data checks per point (nccl-tests -c; 0 = none).
        places: subset of PLACES.
        cuda_graph: graph launches per sample (nccl-tests -G; 0 = the iterations launched one by
            one, no graph).
        timeout_s: abort when a wait lasts longer (nccl-tests -T; 0 = never).
        scheduler_address, scheduler_file: an existing Dask cluster; one rank per worker.
    """

    collective: str = "all-reduce"
    sizes: tuple[int, ...] = (2**20, 2**22, 2**24, 2**26, 2**28, 2**30)
    dtype: str = "float"
    op: str = "sum"
    root: int = 0
    devices: tuple[int, ...] | None = None
    warmup: int = 1
    iters: int = 20
    samples: int = 5
    check: int = 1
    places: tuple[str, ...] = PLACES
    cuda_graph: int = 0
    timeout_s: float = 0.0
    scheduler_address: str | None = None
    scheduler_file: str | None = None

    def __post_init__(self):
        C.collective(self.collective)
        C.dtype(self.dtype)
        C.op(self.op)
        if not self.sizes or min(self.sizes) < 1:
            raise UsageError("sizes must be at least 1 byte")
        check_choices("placement", self.places, PLACES)
        if self.root < 0:
            raise UsageError(f"root {self.root} must be >= 0")
        if self.iters < 1 or self.samples < 1 or self.warmup < 0 or self.check < 0 or self.cuda_graph < 0:
            raise UsageError("-n and --samples must be >= 1; -w, -c and -G >= 0")
        if self.timeout_s < 0:
            raise UsageError(f"--timeout {self.timeout_s} must be >= 0 seconds")
        if self.scheduler_address and self.scheduler_file:
            raise UsageError("--scheduler-address and --scheduler-file both given", "use one of them")
        if (self.scheduler_address or self.scheduler_file) and self.devices is not None:
            raise UsageError("-d does not apply with a Dask scheduler", "each worker uses its own GPU")

    @property
    def distributed(self) -> bool:
        return bool(self.scheduler_address or self.scheduler_file)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Point:
    """One measured point before it becomes a Record (also what a Dask worker sends back)."""

    nbytes: int  # nccl-tests' "size": max(send, receive) bytes of one rank
    count: int  # the NCCL call's count argument
    place: str
    samples_s: list[float]
    wrong: int | None  # elements that differ from the expected result (None: not checked)
    error: str | None = None


def measure_points(spec: NcclSpec, ranks: list[Rank], nranks: int, barrier: Callable[[], None],
                   progress: ProgressSink, on_point: Callable[[Point], None] | None = None) -> list[Point]:
    """Measure every (size, placement) of ``spec`` on this process's ``ranks``.

    Args:
        ranks: the local ranks (all of them in one process, or one per Dask worker).
        nranks: ranks in the communicator.
        barrier: called before each timed sample (a no-op in one process; an NCCL barrier across
            processes, as nccl-tests' Barrier).

    Returns:
        One Point per (size, placement), in order.

    Raises:
        whatever a point raised (MachineError, KeyboardInterrupt, ...), after nccl_launch.drain.
    """
    coll = C.collective(spec.collective)
    dt = C.dtype(spec.dtype)
    op_id = C.op(spec.op)
    maxbytes = max(spec.sizes)
    points: list[Point] = []
    try:
        for size in spec.sizes:
            cc = C.counts(coll, size, dt.size, nranks)
            total = max(cc.send_count, cc.recv_count) * dt.size
            for place in spec.places:
                progress.advance(f"{coll.name} {format_size(size)} {place}")
                in_place = place == "in-place"
                if cc.param_count == 0:
                    points.append(Point(total, 0, place, [], None,
                                        error=f"{format_size(size)} gives 0 elements per rank for {nranks} ranks"))
                    continue

                one = L.launcher(ranks, coll, cc, dt, op_id, spec.root, in_place, nranks, total, maxbytes,
                                 max(spec.iters, spec.warmup, 1))

                # never time on uninitialised memory: the inputs hold the check's values (nccl-tests
                # initialises before timing when it checks)
                D.init_data(ranks, coll, cc, dt, spec.op, in_place, spec.root)
                L.run_iters(ranks, spec.warmup, one, spec.timeout_s)
                wait_all(ranks, spec.timeout_s)
                one(0)  # nccl-tests BenchTime's "Sync" call
                wait_all(ranks, spec.timeout_s)
                samples = L.timed_samples(spec, ranks, one, barrier)
                wrong = None
                # N/A where nccl-tests does not check in place (the entry's checked_in_place)
                if spec.check and (coll.checked_in_place or not in_place):
                    wrong = 0
                    for _ in range(spec.check):
                        D.init_data(ranks, coll, cc, dt, spec.op, in_place, spec.root)
                        barrier()
                        L.checked_call(spec, ranks, one)
                        wrong += D.check(ranks, coll, cc, dt, spec.op, in_place, nranks, spec.root)
                        if wrong:
                            break
                p = Point(total, cc.param_count, place, samples, wrong)
                points.append(p)
                if on_point:
                    on_point(p)
    except BaseException:  # an interrupt or a fault: nothing is freed under queued work
        L.drain(ranks, spec.timeout_s)
        raise
    return points


# -- results -------------------------------------------------------------------------------------------


def to_records(spec: NcclSpec, points: list[Point], nranks: int) -> list[Record]:
    """Records from points: metric bandwidth with nbytes = S of algbw = S / t; busbw in extra."""
    coll = C.collective(spec.collective)
    dt = C.dtype(spec.dtype)
    factor = C.busbw_factor(coll, nranks)
    out = []
    for p in points:
        params: dict[str, Any] = {"collective": coll.name, "nbytes": p.nbytes, "dtype": dt.name,
                                  "placement": p.place, "nranks": nranks}
        if coll.reduces:
            params["op"] = spec.op
        if coll.rooted:
            params["root"] = spec.root
        s_bytes = C.algbw_bytes(coll, p.count, dt.size, nranks)
        r = Record(params=params, metric="bandwidth", nbytes=s_bytes, samples_s=list(p.samples_s),
                   reps=spec.iters * (spec.cuda_graph or 1), error=p.error)
        extra: dict[str, Any] = {"count": p.count, "busbw_factor": factor, "wrong": p.wrong,
                                 "busbw_formula": f"algbw * {coll.factor_text}"}
        if p.samples_s and s_bytes:
            med = r.time_summary().median
            alg, bus = C.bandwidths(coll, p.count, dt.size, med, nranks)
            extra.update({"time_s": med, "algbw_bytes_per_s": alg, "busbw_bytes_per_s": bus})
        r.extra = extra
        out.append(r)
    return out


def select_devices(spec: NcclSpec) -> tuple[int, ...]:
    """-d checked against the visible GPUs, or every visible GPU; the root must be one of the ranks.

    Raises:
        NoGPUError / UsageError.
    """
    gpu.require_gpu()
    devices = gpu.resolve_devices(spec.devices) if spec.devices is not None else tuple(range(gpu.device_count()))
    _check_root(spec, len(devices))
    return devices


def _check_root(spec: NcclSpec, nranks: int) -> None:
    coll = C.collective(spec.collective)
    if coll.rooted and spec.root >= nranks:
        raise UsageError(f"root {spec.root} is not a rank: {nranks} rank(s)", f"use -r 0..{nranks - 1}")


def preflight(spec: NcclSpec, devices: tuple[int, ...]) -> None:
    """Two buffers of the largest size per GPU must fit.

    Raises:
        UsageError: they do not; the message says which -e would.
    """
    need = 2 * max(spec.sizes)
    margin = 1024 * 2**20  # NCCL's own buffers and the CUDA context
    for d in devices:
        free, _ = gpu.device_free_bytes(d)
        if need + margin > free:
            raise UsageError(f"-e {format_size(max(spec.sizes))} needs {format_size(need)} on GPU {d}, which has "
                             f"{format_size(free)} free", f"use -e {format_size(max(0, free - margin) // 2)} or less")


def _timing(spec: NcclSpec, allocator: str | None = None) -> dict:
    return {
        "buffers": allocator,
        "clock": "perf_counter",
        "method": ("nccl-tests BenchTime: host clock around "
                   + (f"{spec.cuda_graph} launches of per-rank CUDA graphs of iters grouped iterations"
                      if spec.cuda_graph else "iters grouped launches")
                   + " and the wait for every rank's stream; per-iteration time = span / "
                   + ("(iters * cuda_graph)" if spec.cuda_graph else "iters")
                   + "; buffers shifted by one size per iteration; median over samples; averaged over processes"),
        "warmup": spec.warmup, "iters": spec.iters, "samples": spec.samples, "cuda_graph": spec.cuda_graph,
    }


def run(spec: NcclSpec, progress: ProgressSink | None = None) -> Result:
    """Run the sweep in this process (one communicator per selected GPU) or on a Dask cluster.

    Returns:
        A Result with one record per (size, placement); see :func:`to_records`.

    Raises:
        NoGPUError / UsageError: no GPU, a GPU not visible, a root that is not a rank, NCCL missing,
            the sizes do not fit.
        MachineError: an NCCL or CUDA fault, or --timeout passed.
    """
    if spec.distributed:
        return run_on_dask(spec, progress)
    gpu.require_gpu()  # a missing CuPy is a setup problem (exit 2), not a fault

    progress = progress or ProgressSink()
    devices = select_devices(spec)
    nccl = nccl_module()
    preflight(spec, devices)
    env = envmod.capture()
    try:
        comms = nccl.NcclCommunicator.initAll(list(devices))
    except Exception as e:
        raise MachineError(f"ncclCommInitAll on GPUs {list(devices)} failed: {str(e).splitlines()[0]}") from None
    ranks: list[Rank] = []
    points: list[Point] = []
    interrupted = None
    progress.start(len(spec.sizes) * len(spec.places), spec.collective)
    try:
        for r, (d, c) in enumerate(zip(devices, comms)):
            ranks.append(Rank(r, d, c, max(spec.sizes)))
        measure_points(spec, ranks, len(devices), lambda: None, progress, on_point=points.append)
    except KeyboardInterrupt:
        interrupted = "SIGINT"
    except Interrupted as e:
        interrupted = signal.Signals(e.signum).name
    except Exception as e:
        fault = as_machine_error(e)
        if fault is None:
            raise
        raise fault from None
    finally:
        progress.done()
        for rk in ranks:
            try:
                rk.free()
            except Exception:
                pass
        for c in comms:
            try:
                c.destroy()
            except Exception:
                pass
    return Result(
        command="nccl",
        spec={**spec.to_dict(), "devices": list(devices), "nranks": len(devices)},
        timing=_timing(spec, ranks[0].send.allocator if ranks else None),
        env={**env, "nccl": nccl_env(nccl)},
        records=to_records(spec, points, len(devices)),
        partial=interrupted is not None,
        interrupted_by=interrupted,
    )


def run_on_dask(spec: NcclSpec, progress: ProgressSink | None = None) -> Result:
    """One rank per worker of an existing Dask cluster: see :func:`gpubench.bench.nccl_dask.run_on_dask`
    (imported here when called, since it imports this module)."""
    from gpubench.bench import nccl_dask

    return nccl_dask.run_on_dask(spec, progress)

"""``gpubench nccl``: NCCL collectives through CuPy's bindings, timed as nccl-tests 2.19.6 times them
(src/common.cu BenchTime; docs/nccl.md "What is timed"): one process with one communicator per GPU
(``NcclCommunicator.initAll``, as nccl-tests ``-g N``); per-iteration time = span / iters (with
``-G`` G: span / (iters * G)), seconds.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Sequence

from gpubench.plugins.nccl import collectives as C
from gpubench.plugins.nccl import data as D
from gpubench.plugins.nccl import launch as L
from gpubench.plugins.nccl.comm import Rank, as_machine_error, nccl_env, nccl_module, wait_all
from gpubench.plugins.nccl.graphs import CapturedGraphs, GraphOwner
from gpubench.core import benchmark as driver
from gpubench.core import gpu
from gpubench.core.benchmark import Benchmark, Context
from gpubench.core.bounds import MAX_COUNT, MAX_DEVICE_ORDINAL, MAX_GBPS, MAX_REPEATS, MAX_TIMEOUT_S, bounded, check_bounds
from gpubench.core.errors import MachineError, UsageError, check_choices, first_line
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result
from gpubench.core.units import format_size

PLACES = ("out-of-place", "in-place")
MAX_GRAPH_ITERS = 100_000  # iterations (graph nodes per GPU, at least) captured into one graph


@contextlib.contextmanager
def local_ranks(ctx: Context, comms: list, first: int = 0) -> Iterator[list[Rank]]:
    """This process's ranks, rank ``first + i`` on ``ctx.devices[i]`` and ``comms[i]``, with the graph
    owner, in ``ctx.data``; released on the way out in the order NCCL needs (CUDA graphs first: they
    hold NCCL resources that ncclCommDestroy waits for), errors then ignored.

    Raises:
        MachineError: a stream or a buffer failed.
    """
    ranks: list[Rank] = []
    graphs = GraphOwner()
    ctx.data.update(ranks=ranks, graphs=graphs, allocator=None)
    try:
        with _as_machine_errors(allocation_passes=False):
            for i, (d, c) in enumerate(zip(ctx.devices, comms)):
                ranks.append(Rank(first + i, d, c, max(ctx.spec.sizes)))
        ctx.data["allocator"] = ranks[0].send.allocator if ranks else None
        yield ranks
    finally:
        graphs.close_all()
        L.drain(ranks, ctx.spec.timeout_s)
        for rk in ranks:
            with contextlib.suppress(Exception):
                rk.free()
        for i, c in enumerate(comms):
            if i < len(ranks) and getattr(ranks[i], "aborted", False):
                continue
            with contextlib.suppress(Exception):
                c.destroy()


@dataclass(frozen=True)
class NcclSpec:
    """Parsed options of ``gpubench nccl`` (nccl-tests' names); its constructor checks them.

    ``collective``, ``dtype``: stored canonical; ``sizes``: bytes, ascending; ``devices``: None for
    every visible GPU; ``cuda_graph``: graph launches per sample (0 = no graph); ``timeout_s``:
    seconds (0 = never); ``expect_busbw_gbps``: GB/s at the largest size; ``average``: nccl-tests -a.

    Raises:
        UsageError: a bad value, in the words of the CLI option that sets it.
    """

    collective: str = "all-reduce"
    sizes: tuple[int, ...] = (2**20, 2**22, 2**24, 2**26, 2**28, 2**30)
    dtype: str = "float"
    op: str = "sum"
    root: int = bounded(0, "-r/--root", lo=0, hi=MAX_DEVICE_ORDINAL)
    devices: tuple[int, ...] | None = None
    warmup: int = bounded(1, "-w/--warmup", lo=0, hi=MAX_REPEATS)
    iters: int = bounded(20, "-n/--iters", lo=1, hi=MAX_REPEATS)
    samples: int = bounded(5, "--samples", lo=1, hi=MAX_REPEATS)
    check: int = bounded(1, "-c/--check", lo=0, hi=MAX_COUNT)
    places: tuple[str, ...] = PLACES
    cuda_graph: int = bounded(0, "-G/--cuda-graph", lo=0, hi=MAX_REPEATS)
    timeout_s: float = bounded(0.0, "-T/--timeout", lo=0, hi=MAX_TIMEOUT_S, unit="seconds")
    scheduler_address: str | None = None
    scheduler_file: str | None = None
    expect_busbw_gbps: float | None = bounded(None, "--expect-busbw", lo=0, above=True, hi=MAX_GBPS, unit="GB/s")
    gpus_per_proc: int | None = bounded(None, "-g/--gpus-per-proc", lo=1, hi=1024)
    average: int = bounded(1, "-a/--average", lo=0, hi=3)  # its meaning said first, in __post_init__
    rendezvous: str | None = None

    def __post_init__(self):
        if self.average not in (0, 1, 2, 3):  # beside its Bound: what each value means
            raise UsageError(f"-a/--average {self.average} is not 0, 1, 2 or 3",
                             "0 = rank 0's time, 1 = mean, 2 = minimum, 3 = maximum (nccl-tests -a)")
        check_bounds(self)
        object.__setattr__(self, "collective", C.collective(self.collective).name)
        object.__setattr__(self, "dtype", C.dtype(self.dtype).name)
        C.op(self.op)
        object.__setattr__(self, "op", self.op.strip().lower())
        if not self.sizes or min(self.sizes) < 1:
            raise UsageError("sizes must be at least 1 byte")
        check_choices("placement", self.places, PLACES)
        if self.cuda_graph and self.iters > MAX_GRAPH_ITERS:
            raise UsageError(f"-n/--iters {self.iters} with -G: the -n iterations are captured into one CUDA graph "
                             "per GPU", f"at most {MAX_GRAPH_ITERS:,} with -G; raise -G for longer samples")
        if self.gpus_per_proc is not None and self.devices is not None and len(self.devices) != self.gpus_per_proc:
            raise UsageError(f"-g {self.gpus_per_proc} with -d listing {len(self.devices)} GPU(s)",
                             "give -d the GPUs of one process, or leave one of them out")
        if self.rendezvous is not None:
            from gpubench.launch.ranks import parse_rendezvous

            parse_rendezvous(self.rendezvous)
        from gpubench.launch.scheduler import check_cluster_options

        check_cluster_options(self.scheduler_address, self.scheduler_file)
        if self.scheduler_address and self.scheduler_file:
            raise UsageError("--scheduler-address and --scheduler-file both given", "use one of them")
        if (self.scheduler_address or self.scheduler_file) and self.devices is not None:
            raise UsageError("-d does not apply with a Dask scheduler", "each worker uses its own GPU")

    @property
    def distributed(self) -> bool:
        return bool(self.scheduler_address or self.scheduler_file)

    def to_dict(self, **resolved) -> dict:
        """The Result's ``spec``: the fields, then ``resolved``, then ``expect_busbw_gbps`` when given."""
        d = asdict(self)
        expect = d.pop("expect_busbw_gbps")
        d.update(resolved)
        if expect is not None:
            d["expect_busbw_gbps"] = expect
        return d


@dataclass
class Point:
    """One measured point before it becomes a Record (also what a Dask worker sends back)."""

    nbytes: int  # nccl-tests' "size": max(send, receive) bytes of one rank
    count: int  # the NCCL call's count argument
    place: str
    samples_s: list[float]
    wrong: int | None  # elements that differ from the expected result (None: not checked)
    error: str | None = None


_COMBINE: dict[int, Callable[[list[float]], float]] = {0: lambda c: c[0], 1: lambda c: sum(c) / len(c), 2: min,
                                                       3: max}  # -a 0..3, rank 0 first


def combine(per_rank: list[list[float]], average: int) -> list[float]:
    """Each sample's time over the ranks, by nccl-tests' -a (src/common.cu Allreduce of deltaSec):
    0 rank 0's own, 1 the mean, 2 the minimum, 3 the maximum. ``per_rank[r][k]``: seconds.

    Raises:
        ValueError: ranks with different sample counts, or an unknown ``average``.
    """
    if any(len(s) != len(per_rank[0]) for s in per_rank):
        raise ValueError("ranks returned different numbers of samples")
    if average not in _COMBINE:
        raise ValueError(f"average {average} is not 0..3")
    return [_COMBINE[average](list(sample)) for sample in zip(*per_rank)]


def combined_point(nbytes: int, count: int, place: str, reports: Sequence[dict], average: int) -> Point:
    """One point from every rank's report of it ({"samples_s", "wrong", "error"}, rank 0 first): the
    samples combined by -a, the wrong counts summed (a rank's None: unchecked), the first error kept.

    Raises:
        ValueError: the ranks have different numbers of samples.
    """
    err = next((x["error"] for x in reports if x.get("error")), None)
    wrongs = [x["wrong"] for x in reports]
    samples = combine([x["samples_s"] for x in reports], average) if not err and reports[0]["samples_s"] else []
    return Point(nbytes, count, place, samples, None if any(w is None for w in wrongs) else sum(wrongs), err)


def point_keys(spec: NcclSpec) -> list[tuple[int, str]]:
    """The (size in bytes, placement) of every point, in the order they are measured."""
    return [(size, place) for size in spec.sizes for place in spec.places]


def point_label(spec: NcclSpec, size: int, place: str) -> str:
    """What the progress bar shows for a point, e.g. ``all-reduce 64.0 MiB out-of-place``."""
    return f"{spec.collective} {format_size(size)} {place}"


def unmeasured_point(spec: NcclSpec, size: int, place: str, nranks: int, error: str) -> Point:
    """The Point of a (size, placement) that gave no samples, with its sizes and ``error``."""
    coll, elt = C.collective(spec.collective), C.dtype(spec.dtype).size
    return Point(C.reported_bytes(coll, size, elt, nranks), C.counts(coll, size, elt, nranks).param_count, place, [],
                 None, error=error)


def measure_point(spec: NcclSpec, ranks: list[Rank], nranks: int, barrier: Callable[[], None], size: int,
                  place: str, new_graphs: Callable[[], CapturedGraphs] = CapturedGraphs) -> Point:
    """Measure one (size in bytes, placement) on this process's ``ranks`` (nccl-tests BenchTime for
    one size); ``barrier`` is called before each timed sample and check (nccl-tests' Barrier).

    Raises:
        MachineError, NcclError, CUDARuntimeError, KeyboardInterrupt: with work possibly still
            queued; the caller drains before freeing.
    """
    coll = C.collective(spec.collective)
    dt = C.dtype(spec.dtype)
    op_id = C.op(spec.op)
    cc = C.counts(coll, size, dt.size, nranks)
    total = max(cc.send_count, cc.recv_count) * dt.size
    in_place = place == "in-place"
    if cc.param_count == 0:
        return unmeasured_point(spec, size, place, nranks, f"{format_size(size)} gives 0 elements per rank for "
                                f"{nranks} ranks")

    one = L.launcher(ranks, coll, cc, dt, op_id, spec.root, in_place, nranks, total, max(spec.sizes),
                     max(spec.iters, spec.warmup, 1))
    D.init_data(ranks, coll, cc, dt, spec.op, in_place, spec.root)
    L.run_iters(ranks, spec.warmup, one, spec.timeout_s)
    wait_all(ranks, spec.timeout_s)
    one(0)  # nccl-tests BenchTime's "Sync" call
    wait_all(ranks, spec.timeout_s)
    samples = L.timed_samples(spec, ranks, one, barrier, new_graphs)
    wrong = None
    # N/A where nccl-tests does not check in place (the entry's checked_in_place)
    if spec.check and (coll.checked_in_place or not in_place):
        wrong = 0
        for _ in range(spec.check):
            D.init_data(ranks, coll, cc, dt, spec.op, in_place, spec.root)
            barrier()
            L.checked_call(spec, ranks, one, new_graphs)
            wrong += D.check(ranks, coll, cc, dt, spec.op, in_place, nranks, spec.root)
            if wrong:
                break
    return Point(total, cc.param_count, place, samples, wrong)


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


def mark_collectives(records: list[Record], env: dict, devices: Sequence[int]) -> None:
    """:func:`gpubench.core.limits.mark_collective` on each record, against the first GPU's links."""
    import os

    from gpubench.core import env as envmod
    from gpubench.core import limits

    g = envmod.gpu_by_index(env, devices[0]) if devices else None
    nvls = os.environ.get("NCCL_NVLS_ENABLE", "") != "0" and bool((g or {}).get("nvlink_links_up"))
    for r in records:
        limits.mark_collective(r, g, nvls)


def _check_root(spec: NcclSpec, nranks: int) -> None:
    coll = C.collective(spec.collective)
    if coll.rooted and spec.root >= nranks:
        raise UsageError(f"root {spec.root} is not a rank: {nranks} rank(s)", f"use -r 0..{nranks - 1}")


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


# -- the plug-in ---------------------------------------------------------------------------------------


class Nccl(Benchmark):
    """The nccl plug-in, one process: a point is one (size, placement); one communicator per GPU."""

    name = "nccl"

    def devices(self, spec: NcclSpec) -> tuple[int, ...]:
        """-d checked against the visible GPUs, or every visible GPU.

        Raises:
            UsageError: a GPU that is not visible, a root that is not a rank.
        """
        if spec.devices is not None:
            devices = gpu.resolve_devices(spec.devices)
        elif spec.gpus_per_proc is not None:
            devices = gpu.resolve_devices(tuple(range(spec.gpus_per_proc)))
        else:
            devices = tuple(range(gpu.device_count()))
        _check_root(spec, len(devices))
        return devices

    def points(self, spec: NcclSpec, devices: tuple[int, ...]) -> list[driver.Point]:
        """One point per (size, placement); each holds the two buffers of the largest size per GPU."""
        need = 2 * max(spec.sizes)
        return [driver.Point(label=point_label(spec, size, place), key=(size, place), device_bytes=need,
                             devices=devices) for size, place in point_keys(spec)]

    def preflight(self, spec: NcclSpec, points: Sequence[driver.Point], devices: tuple[int, ...]) -> None:
        """NCCL must be importable and two buffers of the largest size must fit on every GPU.

        Raises:
            UsageError: NCCL missing, or the sizes do not fit.
        """
        nccl_module()
        need = 2 * max(spec.sizes)
        margin = 1024 * 2**20  # NCCL's own buffers and the CUDA context
        for d in devices:
            free, _ = gpu.device_free_bytes(d)
            if need + margin > free:
                raise UsageError(f"-e {format_size(max(spec.sizes))} needs {format_size(need)} on GPU {d}, which "
                                 f"has {format_size(free)} free",
                                 f"use -e {format_size(max(0, free - margin) // 2)} or less")

    @contextlib.contextmanager
    def setup(self, ctx: Context) -> Iterator[Context]:
        """Communicators, ranks and the graph owner in ``ctx.data``; NCCL's version and variables in ``ctx.env``.

        Raises:
            MachineError: ncclCommInitAll, a stream or a buffer failed.
        """
        nccl = nccl_module()
        ctx.env["nccl"] = nccl_env(nccl)
        try:
            comms = nccl.NcclCommunicator.initAll(list(ctx.devices))
        except Exception as e:
            raise MachineError(f"ncclCommInitAll on GPUs {list(ctx.devices)} failed: {first_line(e)}") \
                from None
        with local_ranks(ctx, comms):
            yield ctx

    def measure(self, ctx: Context, point: driver.Point) -> list[Record]:
        """One (size, placement) on every rank: :func:`measure_point`, then its record.

        Raises:
            MachineError: an NCCL or CUDA fault, or --timeout passed (after the drain).
        """
        size, place = point.key
        ranks = ctx.data["ranks"]
        try:
            with _as_machine_errors():
                p = measure_point(ctx.spec, ranks, len(ranks), lambda: None, size, place, ctx.data["graphs"].new)
        except BaseException:  # an interrupt or a fault: nothing is freed under queued work
            L.drain(ranks, ctx.spec.timeout_s)
            raise
        return to_records(ctx.spec, [p], len(ranks))

    def failed(self, ctx: Context, point: driver.Point, message: str) -> list[Record]:
        size, place = point.key
        nranks = len(ctx.devices)
        return to_records(ctx.spec, [unmeasured_point(ctx.spec, size, place, nranks, message)], nranks)

    def derive(self, ctx: Context, records: list[Record]) -> None:
        mark_collectives(records, ctx.env, ctx.devices)

    def spec_dict(self, ctx: Context) -> dict:
        return ctx.spec.to_dict(devices=list(ctx.devices), nranks=len(ctx.devices))

    def timing(self, ctx: Context) -> dict:
        return _timing(ctx.spec, ctx.data.get("allocator"))


@contextlib.contextmanager
def _as_machine_errors(allocation_passes: bool = True) -> Iterator[None]:
    """A CUDA runtime or NCCL fault raised inside becomes its one-line MachineError (exit 3); with
    ``allocation_passes`` an allocation failure passes as it is, for the driver to record."""
    try:
        yield
    except Exception as e:
        fault = None if allocation_passes and gpu.is_oom(e) else as_machine_error(e)
        if fault is None:
            raise
        raise fault from None


BENCHMARK = Nccl()


def run(spec: NcclSpec, progress: ProgressSink | None = None) -> Result:
    """Run the sweep in this process, one communicator per selected GPU, through the driver.

    Returns:
        A Result with one record per (size, placement); ``partial`` when a signal stopped it.

    Raises:
        NoGPUError, UsageError, MachineError: as the driver and the plug-in's steps say.
    """
    if spec.distributed:
        raise UsageError("a spec with a Dask scheduler runs through gpubench.plugins.nccl.over_dask.run_on_dask")
    return driver.run(BENCHMARK, spec, progress)

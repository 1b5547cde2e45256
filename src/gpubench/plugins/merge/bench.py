"""``gpubench merge``: a distributed inner join of two random dataframes on a Dask(-CUDA) cluster,
as dask-cuda 26.10's ``benchmarks/local_cudf_merge.py``: the same data, join, timing and figures
(docs/merge.md, "What is timed", "Figures and their source"); only the transfer logs are cleared
just before each timed join and read just after it.

Figures: data processed = rows x bytes per row over both frames, bytes; throughput = data processed
/ wall clock, B/s (``hmean``/``hstd``); bandwidth = ``hmean``/``hstd`` over the worker pairs'
harmonic means of ``total / max(duration, 1 ms)``, B/s per pair. Dask, dask-cuda, cuDF, RMM and
UCXX are imported inside functions only.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterator, Mapping

from gpubench.plugins.merge import cluster as merge_cluster
from gpubench.plugins.merge.cluster import (big_number, clear_transfer_log, close_all, open_client, rmm_setup,
                                            take_transfer_log, worker_device)
from gpubench.plugins.merge.data import compute_watching, join_check, random_ddf
from gpubench.plugins.merge.stats import address_to_index, hmean, hstd, pair_statistics
from gpubench.core import benchmark as driver
from gpubench.core.benchmark import Benchmark, Context, Point
from gpubench.core.bounds import MAX_REPEATS, MAX_TIMEOUT_S, bounded, check_bounds
from gpubench.core.options import machine_threads
from gpubench.core.errors import MachineError, UsageError
from gpubench.core.gpu import is_oom
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result
from gpubench.launch.scheduler import check_cluster_options, error_line, run_on_workers, wait_watching
from gpubench.core.signals import Interrupted, last_signal, raise_if_signalled, signal_exception, signal_noted

TYPES = ("gpu", "cpu")
PROTOCOLS = ("tcp", "ucx")
SHUFFLE_METHODS = ("tasks", "p2p", "disk")
MAX_KEY = 2**63 - 1  # the frames' keys are int64


@dataclass(frozen=True)
class MergeSpec:
    """Parsed options of ``gpubench merge`` (dask-cuda's names and meanings).

    ``devices``: one worker each; ``base_chunks``, ``other_chunks``: None = the number of workers;
    ``broadcast``: None = Dask decides; ``rmm_pool_bytes`` (bytes) or ``rmm_pool_fraction`` (of the
    device's memory), both None = RMM's default; UCX transports None = automatic; ``ignore_size``:
    bytes; ``timeout_s``: seconds, the longest any one step of a run may take.
    """

    merge_type: str = "gpu"
    devices: tuple[int, ...] = (0,)
    protocol: str = "tcp"
    chunk_size: int = bounded(1_000_000, "-c/--chunk-size", lo=1, hi=MAX_KEY)
    base_chunks: int | None = bounded(None, "--base-chunks", lo=1, hi=MAX_KEY)
    other_chunks: int | None = bounded(None, "--other-chunks", lo=1, hi=MAX_KEY)
    frac_match: float = bounded(0.3, "--frac-match", lo=0, above=True, hi=1.0)
    broadcast: bool | None = None
    shuffle_method: str = "tasks"
    no_shuffle: bool = False
    set_index: bool = False
    rmm_pool_bytes: int | None = None
    rmm_pool_fraction: float | None = None
    disable_rmm_pool: bool = False
    rmm_async: bool = False
    enable_cudf_spill: bool = False
    enable_tcp_over_ucx: bool | None = None
    enable_nvlink: bool | None = None
    enable_infiniband: bool | None = None
    enable_rdmacm: bool | None = None
    interface: str | None = None
    threads_per_worker: int = bounded(1, "--threads-per-worker", lo=1, hi=machine_threads)
    runs: int = bounded(3, "--runs", lo=1, hi=MAX_REPEATS)
    warmup_runs: int = bounded(1, "--warmup-runs", lo=0, hi=MAX_REPEATS)
    ignore_size: int = bounded(2**20, "--ignore-size", lo=0, unit="bytes")
    scheduler_address: str | None = None
    scheduler_file: str | None = None
    timeout_s: float = bounded(600.0, "--timeout", lo=0, above=True, hi=MAX_TIMEOUT_S, unit="seconds")

    def __post_init__(self):
        check_bounds(self)
        for flag, value, known in (("-t/--type", self.merge_type, TYPES), ("-p/--protocol", self.protocol, PROTOCOLS),
                                   ("--shuffle-method", self.shuffle_method, SHUFFLE_METHODS)):
            if value not in known:
                raise UsageError(f"{flag} {value!r} not known", "use " + (" or " if len(known) == 2 else ", ").join(known))
        # keys run up to 2 x -c x partitions (dask-cuda's layout) and must stay int64
        chunks = max(self.base_chunks or len(self.devices), self.other_chunks or len(self.devices), 1)
        if 2 * self.chunk_size * chunks > MAX_KEY:
            raise UsageError(f"-c/--chunk-size {big_number(self.chunk_size)} with {big_number(chunks)} partitions "
                             f"numbers keys past int64 (2 x rows x partitions must stay below 2^63)",
                             f"the largest -c for {big_number(chunks)} partitions is {MAX_KEY // (2 * chunks):,}")
        threads, workers = machine_threads(), max(1, len(self.devices))
        if self.threads_per_worker > max(1, threads // workers):
            raise UsageError(f"--threads-per-worker {self.threads_per_worker} is too large",
                             f"at most {max(1, threads // workers):,}: {threads:,} threads this machine lets one "
                             f"user run (threads-max, RLIMIT_NPROC), shared by {workers} worker(s)")
        check_cluster_options(self.scheduler_address, self.scheduler_file)
        if self.scheduler_address and self.scheduler_file:
            raise UsageError("--scheduler-address and --scheduler-file both given", "give one of them")
        pool_given = self.rmm_pool_bytes is not None or self.rmm_pool_fraction is not None
        if self.rmm_async and pool_given:
            raise UsageError("--rmm-async and --rmm-pool-size cannot be used together",
                             "the async allocator grows as needed (as in dask-cuda)")
        if self.disable_rmm_pool and pool_given:
            raise UsageError("--disable-rmm-pool and --rmm-pool-size cannot be used together")
        if self.merge_type == "cpu":
            for flag, on in (("--rmm-pool-size", pool_given), ("--rmm-async", self.rmm_async),
                             ("--disable-rmm-pool", self.disable_rmm_pool),
                             ("--enable-cudf-spill", self.enable_cudf_spill)):
                if on:
                    raise UsageError(f"{flag} applies to -t gpu only", "drop it, or use -t gpu")
        for flag, v in (("tcp-over-ucx", self.enable_tcp_over_ucx), ("nvlink", self.enable_nvlink),
                        ("infiniband", self.enable_infiniband), ("rdmacm", self.enable_rdmacm)):
            if v is None:
                continue
            if self.protocol != "ucx":
                raise UsageError(f"--enable-{flag}/--disable-{flag} applies to -p ucx only")
            if self.merge_type != "gpu":
                raise UsageError(f"--enable-{flag}/--disable-{flag} applies to -t gpu only",
                                 "on -t cpu UCX picks its transports itself")

    @property
    def external(self) -> bool:
        """True when an existing cluster is used."""
        return bool(self.scheduler_address or self.scheduler_file)

    @property
    def broadcast_label(self) -> str:
        """dask-cuda's "Broadcast" value: True, False or "default"."""
        return "default" if self.broadcast is None else str(self.broadcast)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["devices"] = list(self.devices)
        return d


# -- One run: dask-cuda's bench_once -------------------------------------------------------------------


def bench_once(client, spec: MergeSpec, n_workers: int, workers: Mapping[str, int], what: str,
               keep_result: bool = False):
    """Generate both frames, then time their join (dask-cuda's bench_once); returns (the run's raw
    record for :func:`summary_record`: data processed in bytes, the join's wall clock in s, its
    transfers by receiving worker's address and the workers whose log filled up; the persisted join
    when keep_result, else None). MachineError: see wait_watching.
    """
    gpu = spec.merge_type == "gpu"
    ddf_base = random_ddf(spec.chunk_size, spec.base_chunks or n_workers, spec.frac_match, "build", gpu,
                          spec.no_shuffle).persist()
    ddf_other = random_ddf(spec.chunk_size, spec.other_chunks or n_workers, spec.frac_match, "other", gpu).persist()
    wait_watching(client, ddf_base, workers, spec.timeout_s, f"{what} (generating the base frame)")
    wait_watching(client, ddf_other, workers, spec.timeout_s, f"{what} (generating the other frame)")
    rows_base, rows_other = compute_watching(client, [ddf_base.shape[0], ddf_other.shape[0]], workers,
                                             spec.timeout_s, f"{what} (counting rows)")
    data_processed = rows_base * sum(t.itemsize for t in ddf_base.dtypes)
    data_processed += rows_other * sum(t.itemsize for t in ddf_other.dtypes)

    maxlens = run_on_workers(client, clear_transfer_log, workers, f"{what} (clearing the transfer logs)",
                             timeout_s=spec.timeout_s)
    t0 = time.perf_counter()
    joined = ddf_base.merge(ddf_other, on=["key"], how="inner", broadcast=spec.broadcast)
    if spec.set_index:
        joined = joined.set_index("key")
    joined = joined.persist()
    seconds = wait_watching(client, joined, workers, spec.timeout_s, f"{what} (join)") - t0
    logs = run_on_workers(client, take_transfer_log, workers, f"{what} (reading the transfer logs)",
                          timeout_s=spec.timeout_s)
    full = [a for a, entries in logs.items() if maxlens.get(a) and len(entries) >= maxlens[a]]
    del ddf_base, ddf_other
    rec = Record(params=_params(spec, n_workers), metric="bandwidth", nbytes=int(data_processed), samples_s=[seconds],
                 reps=1, extra={"transfers": logs, "transfer_log_overflowed": full})
    return rec, (joined if keep_result else None)


# -- The points (runs) and the records -----------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One point of the loop: ``kind`` "warm-up" (untimed) or "run" (timed), 0-based ``index`` ``of`` how many."""

    kind: str
    index: int
    of: int

    @property
    def label(self) -> str:
        """"warm-up 1/1", "run 2/3"."""
        return f"{self.kind} {self.index + 1}/{self.of}"

    @property
    def timed(self) -> bool:
        return self.kind == "run"

    @property
    def last(self) -> bool:
        """The last timed run: its join is kept and checked."""
        return self.timed and self.index == self.of - 1


def _params(spec: MergeSpec, n_workers: int) -> dict:
    return {"type": spec.merge_type, "protocol": spec.protocol, "chunk_size": spec.chunk_size,
            "base_chunks": spec.base_chunks or n_workers, "other_chunks": spec.other_chunks or n_workers,
            "frac_match": spec.frac_match, "broadcast": spec.broadcast_label, "n_workers": n_workers,
            "shuffle_method": spec.shuffle_method}


def summary_record(spec: MergeSpec, runs: list[Record], cluster: Mapping[str, Any]) -> Record:
    """The one record of a merge Result, from the timed runs' records, as dask-cuda's report reads
    it: nbytes = data processed per run (bytes), samples_s = each run's wall clock (s); rates in
    ``extra`` are B/s. ``cluster``: what setup found ("index", "workers", "rmm", "scheduler_address").
    """
    index = cluster["index"]
    nbytes = runs[0].nbytes
    seconds = [r.samples_s[0] for r in runs]
    throughputs = [r.nbytes / r.samples_s[0] for r in runs]
    logs: dict[str, list[dict]] = {}
    for r in runs:
        for a, entries in r.extra["transfers"].items():
            logs.setdefault(a, []).extend(entries)
    pairs = pair_statistics(logs, index, spec.ignore_size)
    pair_hmeans = [p.hmean for p in pairs if p.hmean > 0]
    mean_s = math.fsum(seconds) / len(seconds)
    extra = {
        "data_processed_bytes": nbytes, "throughputs_Bps": throughputs,
        "throughput_hmean_Bps": hmean(throughputs), "throughput_hstd_Bps": hstd(throughputs),
        "bandwidth_hmean_Bps": hmean(pair_hmeans), "bandwidth_hstd_Bps": hstd(pair_hmeans),
        "wall_clock_mean_s": mean_s,
        "wall_clock_std_s": math.sqrt(math.fsum((s - mean_s) ** 2 for s in seconds) / len(seconds)),
        "pairs": [asdict(p) for p in pairs], "transfers_logged": sum(len(v) for v in logs.values()),
        "transfers_counted": sum(p.n for p in pairs),
        "transfer_log_overflowed": sorted({a for r in runs for a in r.extra["transfer_log_overflowed"]}),
        "workers": cluster["workers"], "rmm": cluster["rmm"], "scheduler_address": cluster["scheduler_address"],
        "join_check": runs[-1].extra.get("join_check"),
    }
    return Record(params=_params(spec, len(index)), metric="bandwidth", nbytes=nbytes, samples_s=seconds, reps=1,
                  extra=extra)


# -- The plug-in ---------------------------------------------------------------------------------------


def _require_dask() -> None:
    """Raise a UsageError naming what to install when Dask's distributed or dataframe parts are missing."""
    for mod, pkg in (("distributed", "dask[distributed]"), ("pandas", "pandas"),
                     ("dask.dataframe", "dask[dataframe] (it needs pyarrow)")):
        try:
            __import__(mod)
        except Exception as e:
            raise_if_signalled()  # a Ctrl-C inside the import can come back wrapped
            raise UsageError(f"merge needs {pkg}, which cannot be imported ({error_line(e)[:120]})",
                             "pip install 'gpubench-cuda[dask]'") from None


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for dist in ("dask", "distributed", "pandas", "pyarrow", "dask-cuda", "cudf-cu13", "cudf-cu12",
                 "dask-cudf-cu13", "rmm-cu13", "rmm-cu12", "ucxx-cu13", "ucxx-cu12",
                 "distributed-ucxx-cu13", "distributed-ucxx-cu12", "libucx-cu13", "libucx-cu12"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    return out


class Merge(Benchmark):
    """The merge plug-in, one instance per run: a point is one run of dask-cuda's bench_once on the
    cluster ``setup`` starts (or attaches to) and closes. A signal while the run starts is kept
    (``stopped``) and raised by the first point; one while the cluster closes is ``closing_signal``.
    """

    name = "merge"
    # preflight checks -t gpu on a local cluster through NVML instead
    needs_gpu = False

    def __init__(self) -> None:
        self.closing_signal: str | None = None
        self.stopped: BaseException | None = None  # KeyboardInterrupt or Interrupted

    @contextlib.contextmanager
    def _starting(self) -> Iterator[None]:
        """A step of the run's start: an interrupt inside it, or an error raised once a signal was
        noted, is kept in ``stopped`` (the first one); other errors propagate."""
        try:
            yield
        except (KeyboardInterrupt, Interrupted) as e:
            self.stopped = self.stopped or e
        except Exception:
            signum = last_signal()  # None: no signal noted
            if signum is None:
                raise
            self.stopped = self.stopped or signal_exception(signum)

    def points(self, spec: MergeSpec, devices: tuple[int, ...]) -> list[Point]:
        """The warm-up runs, then the timed runs (no bytes declared: preflight checks the pool)."""
        runs = [Run(kind, i, n) for kind, n in (("warm-up", spec.warmup_runs), ("run", spec.runs)) for i in range(n)]
        return [Point(r.label, r) for r in runs]

    def preflight(self, spec: MergeSpec, points, devices) -> None:
        """Dask importable; on a local cluster, the frames, and for -t gpu the GPU, the devices and
        the RMM pool, before any worker starts.

        Raises:
            UsageError: an --interface this host lacks, Dask missing, a device not visible or
                hidden, a pool or frames that do not fit.
            NoGPUError: -t gpu on a local cluster and NVML shows no GPU.
        """
        with self._starting():
            if spec.interface is not None and not spec.external:
                merge_cluster.check_interface(spec.interface)
            _require_dask()
            if spec.external:
                return
            if spec.merge_type == "gpu":
                merge_cluster.preflight(spec)
            else:
                from distributed.worker_memory import parse_memory_limit

                from gpubench.core.env import host_memory

                # each worker's memory limit as LocalCluster sets it (bytes; None: no limit)
                limit = parse_memory_limit("auto", 1, len(spec.devices), logger=logging.getLogger("gpubench"))
                merge_cluster.check_frames_fit(spec, host_memory()[1], worker_limit=limit)

    def environment(self, spec: MergeSpec) -> dict:
        """The driver's; ``{}`` when the run was stopped before or in it."""
        env: dict = {}
        if self.stopped is None:
            with self._starting():
                env = super().environment(spec)
        return env

    @contextlib.contextmanager
    def setup(self, ctx: Context) -> Iterator[Context]:
        """The cluster and its client, the workers found and RMM set up; closed on every path.
        UsageError, MachineError: merge_cluster.open_client's and rmm_setup's."""
        spec: MergeSpec = ctx.spec
        client = cluster = None
        with contextlib.ExitStack() as config:
            try:
                if self.stopped is None:
                    with self._starting():
                        import dask

                        config.enter_context(dask.config.set({"dataframe.shuffle.method": spec.shuffle_method}))
                        ctx.env.setdefault("versions", {}).update(_versions())
                        client, cluster = open_client(spec)
                        # the workers, numbered as dask-cuda numbers them, and RMM set up on them (-t gpu)
                        devices = run_on_workers(client, worker_device, {}, "asking the workers for their GPU",
                                                 timeout_s=spec.timeout_s)
                        index = address_to_index(devices)
                        ctx.data.update(
                            client=client, index=index, scheduler_address=client.scheduler.address,
                            workers=[{"index": i, "address": a, "device": devices[a]} for a, i in index.items()],
                            rmm=rmm_setup(client, spec, index) if spec.merge_type == "gpu" else "not used (-t cpu)")
                yield ctx
            finally:
                stopped = close_all(client, cluster)
                if isinstance(stopped, Interrupted):
                    self.closing_signal = signal.Signals(stopped.signum).name
                elif stopped is not None:
                    self.closing_signal = "SIGINT"

    def measure(self, ctx: Context, point: Point) -> list[Record]:
        """One run (:func:`bench_once`); a timed run gives its raw record, the last one with the join check.

        Raises:
            MachineError: a worker died, a task failed, a timeout, or the run ran out of memory.
            KeyboardInterrupt, Interrupted: the one kept while the run started (``stopped``).
        """
        if self.stopped is not None:  # the start was interrupted: the driver ends the run here
            raise self.stopped
        run: Run = point.key
        spec: MergeSpec = ctx.spec
        client, index = ctx.data["client"], ctx.data["index"]
        try:
            rec, joined = bench_once(client, spec, len(index), index, point.label, keep_result=run.last)
            if not run.timed:
                return []
            if joined is not None:
                rec.extra["join_check"] = None  # a noted signal that stops the check keeps the run
                try:
                    rec.extra["join_check"] = join_check(client, joined, index, spec.timeout_s)
                except (KeyboardInterrupt, Interrupted):
                    if not signal_noted():
                        raise
            return [rec]
        except Exception as e:
            if is_oom(e):
                raise MachineError(f"{point.label} ran out of memory: {error_line(e)[:160]}",
                                   "use a smaller -c, or a larger --rmm-pool-size") from None
            raise

    def derive(self, ctx: Context, records: list[Record]) -> None:
        """Fold the timed runs' records into the one record of dask-cuda's report, in place."""
        if records:
            records[:] = [summary_record(ctx.spec, records, ctx.data)]

    def timing(self, ctx: Context) -> dict:
        spec: MergeSpec = ctx.spec
        return {
            "clock": "perf_counter",
            "method": "per run: both frames generated and persisted untimed; then perf_counter around "
                      "building the join's graph, persist and wait (dask-cuda's local_cudf_merge)",
            "warmup_runs": spec.warmup_runs, "runs": spec.runs, "shuffle_method": spec.shuffle_method,
            "transfer_log": "cleared before each timed join and read after it",
        }


BENCHMARK = Merge()  # the registry's instance; run() takes a fresh one per run


def run(spec: MergeSpec, progress: ProgressSink | None = None) -> Result:
    """Run the merge benchmark through the driver; ``progress`` is advanced once per run. The Result
    has one Record, none when no timed run finished; ``partial`` with ``interrupted_by`` when
    SIGINT/SIGTERM stopped the run (the finished runs are kept). NoGPUError, UsageError,
    MachineError: as the driver and the steps above say."""
    bench = Merge()
    result = driver.run(bench, spec, progress)
    if bench.closing_signal is not None and not result.partial:
        result.partial = True
        result.interrupted_by = bench.closing_signal
    return result

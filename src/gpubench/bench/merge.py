"""``gpubench merge``: a distributed inner join of two random dataframes on a Dask(-CUDA) cluster.

This reproduces dask-cuda 26.10's ``dask_cuda/benchmarks/local_cudf_merge.py`` (with its
``common.py`` and ``utils.py``): the same data generation (:func:`generate_chunk`, copied), the same
join (``ddf_base.merge(ddf_other, on=["key"], how="inner", broadcast=...)`` then ``persist`` and
``wait``), the same timing and the same figures. See docs/merge.md.

What is timed (as dask-cuda): per run, both frames are generated and persisted first (the base frame
is shuffled into ``base_chunks`` partitions by ``set_index("shuffle")``); then ``perf_counter``
brackets building the join's graph, ``persist`` and ``wait`` until every output partition sits in a
worker's memory. Warm-up runs (``warmup_runs``, default 1) are the same and are not kept.

Figures (dask-cuda's definitions, ``utils.py``):

- data processed (bytes) = rows(base) * bytes per row(base) + rows(other) * bytes per row(other),
  bytes per row being the sum of the column itemsizes (2 int64 columns each: 16 B).
- throughput of a run = data processed / wall clock (B/s), for the whole cluster, not per GPU;
  summarised by the harmonic mean ``hmean`` and ``hstd`` below.
- per worker pair (w1, w2): the bandwidths (``total / max(duration, 1 ms)``, computed by
  distributed) of the transfers worker w1 received from worker w2, read from w1's
  ``transfer_incoming_log``, leaving out transfers of fewer than ``ignore_size`` bytes;
  their 25/50/75 % quantiles (numpy's linear rule), harmonic mean and total bytes.
- bandwidth = ``hmean`` (and ``hstd``) over the pairs' harmonic means: a per-pair figure, not a total.

Unlike dask-cuda, the transfer logs are cleared just before each timed join and read just after it,
so the pair table holds only the transfers of the timed joins (dask-cuda's also holds the warm-up
run's and the data generation's).

Dask, dask-cuda, cuDF, RMM and UCXX are imported inside functions only.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

from gpubench.core import env as envmod
from gpubench.core.errors import MachineError, NoGPUError, UsageError
from gpubench.core.signals import Interrupted
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result
from gpubench.core.scheduler import error_line, run_on_workers, wait_watching
from gpubench.core.stats import _percentile
from gpubench.core.sweep import run_groups
from gpubench.core.units import format_size

TYPES = ("gpu", "cpu")
PROTOCOLS = ("tcp", "ucx")
SHUFFLE_METHODS = ("tasks", "p2p", "disk")
# Left free on each GPU beyond the RMM pool: the CUDA context (~0.5 GiB on H100/H200) plus cuDF's and
# UCX's own allocations outside the pool.
CONTEXT_MARGIN_BYTES = 1 * 2**30
# dask-cuda's benchmark also makes a 1 GB pool in the scheduler (the client process for a local cluster).
SCHEDULER_POOL_BYTES = 10**9
# Entries kept in each worker's transfer_incoming_log (distributed's default is 1000).
TRANSFER_LOG_LENGTH = 100_000
CLOSE_TIMEOUT_S = 30


@dataclass(frozen=True)
class MergeSpec:
    """Parsed options of ``gpubench merge`` (dask-cuda's names and meanings).

    Attributes:
        merge_type: "gpu" (cuDF partitions on a LocalCUDACluster) or "cpu" (pandas partitions on a
            plain distributed LocalCluster).
        devices: CUDA devices, one worker each; for "cpu" only their count matters (workers).
        protocol: "tcp" or "ucx" (UCXX through distributed-ucxx).
        chunk_size: rows per partition of each frame.
        base_chunks, other_chunks: partitions of each frame; None = the number of workers.
        frac_match: fraction of the other frame's rows whose key is in the base frame, in (0, 1].
        broadcast: True (--broadcast-join), False (--shuffle-join) or None (Dask decides).
        shuffle_method: Dask's dataframe.shuffle.method: "tasks" (dask-cuda's default), "p2p", "disk".
        no_shuffle: do not shuffle the base frame by set_index (dask-cuda's --no-shuffle).
        set_index: set_index("key") on the result (dask-cuda's -s/--set-index).
        rmm_pool_bytes: per-worker RMM pool in bytes, or None.
        rmm_pool_fraction: per-worker RMM pool as a fraction of the device's total memory, or None.
            When both are None the pool is RMM's default, half of the device's memory.
        disable_rmm_pool: RMM without a pool.
        rmm_async: RMM's CudaAsyncMemoryResource instead of a pool.
        enable_cudf_spill: cuDF's built-in spilling.
        enable_tcp_over_ucx, enable_nvlink, enable_infiniband, enable_rdmacm: UCX transports
            (None = automatic), passed to LocalCUDACluster.
        interface: network interface for the workers and scheduler, or None.
        threads_per_worker: Dask threads per worker.
        runs: timed runs; warmup_runs: untimed runs before them.
        ignore_size: transfers smaller than this many bytes are left out of the pair table.
        scheduler_address, scheduler_file: use an existing cluster instead of starting one.
        timeout_s: the longest a cluster start, a data generation or a join may take.
    """

    merge_type: str = "gpu"
    devices: tuple[int, ...] = (0,)
    protocol: str = "tcp"
    chunk_size: int = 1_000_000
    base_chunks: int | None = None
    other_chunks: int | None = None
    frac_match: float = 0.3
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
    threads_per_worker: int = 1
    runs: int = 3
    warmup_runs: int = 1
    ignore_size: int = 2**20
    scheduler_address: str | None = None
    scheduler_file: str | None = None
    timeout_s: float = 600.0

    def __post_init__(self):
        if self.merge_type not in TYPES:
            raise UsageError(f"-t/--type {self.merge_type!r} not known", "use gpu or cpu")
        if self.protocol not in PROTOCOLS:
            raise UsageError(f"-p/--protocol {self.protocol!r} not known", "use tcp or ucx")
        if self.shuffle_method not in SHUFFLE_METHODS:
            raise UsageError(f"--shuffle-method {self.shuffle_method!r} not known",
                             f"use {', '.join(SHUFFLE_METHODS)}")
        if self.chunk_size < 1:
            raise UsageError(f"-c/--chunk-size {self.chunk_size} must be at least 1 row")
        for name, v in (("--base-chunks", self.base_chunks), ("--other-chunks", self.other_chunks)):
            if v is not None and v < 1:
                raise UsageError(f"{name} {v} must be at least 1 partition")
        if not (0.0 < self.frac_match <= 1.0):
            raise UsageError(f"--frac-match {self.frac_match} must be in (0, 1]", "e.g. 0.3")
        if not self.devices:
            raise UsageError("-d/--devices names no device", "e.g. -d 0,1")
        if self.runs < 1:
            raise UsageError(f"--runs {self.runs} must be at least 1")
        if self.warmup_runs < 0:
            raise UsageError(f"--warmup-runs {self.warmup_runs} must be >= 0")
        if self.threads_per_worker < 1:
            raise UsageError(f"--threads-per-worker {self.threads_per_worker} must be at least 1")
        if self.ignore_size < 0:
            raise UsageError(f"--ignore-size {self.ignore_size} must be >= 0 bytes")
        if not (self.timeout_s > 0):
            raise UsageError(f"--timeout {self.timeout_s} must be > 0 seconds")
        if self.scheduler_address and self.scheduler_file:
            raise UsageError("--scheduler-address and --scheduler-file both given", "give one of them")
        if self.rmm_pool_fraction is not None and not (0.0 < self.rmm_pool_fraction <= 1.0):
            raise UsageError(f"--rmm-pool-size {self.rmm_pool_fraction} as a fraction must be in (0, 1]")
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
        """True when an existing cluster is used (--scheduler-address / --scheduler-file)."""
        return bool(self.scheduler_address or self.scheduler_file)

    @property
    def broadcast_label(self) -> str:
        """dask-cuda's "Broadcast" value: True, False or "default"."""
        return "default" if self.broadcast is None else str(self.broadcast)

    @property
    def ucx_transport_selection(self) -> str:
        """dask-cuda's ucx_transport_selection: not-applicable, automatic or manual."""
        if self.protocol != "ucx":
            return "not-applicable"
        if all(v is None for v in (self.enable_tcp_over_ucx, self.enable_infiniband, self.enable_nvlink)):
            return "automatic"
        return "manual"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["devices"] = list(self.devices)
        return d


# ---------------------------------------------------------------------------------------------
# Data generation: dask-cuda 26.10 benchmarks/local_cudf_merge.py generate_chunk, unchanged in
# substance (Copyright (c) 2019-2026, NVIDIA CORPORATION & AFFILIATES, Apache-2.0), after
# https://gist.github.com/rjzamora/0ffc35c19b5180ab04bbf7c793c45955.
# ---------------------------------------------------------------------------------------------


def generate_chunk(input: tuple) -> Any:
    """One partition of the "build" (base) or "other" frame, as dask-cuda makes it.

    Args:
        input: (i_chunk, local_size, num_chunks, chunk_type, frac_match, gpu): the partition's
            index, its rows, the frame's partitions, "build" or "other" (None = "build"), the
            fraction of matching keys (None = 1.0), and True for cuDF/CuPy, False for pandas/numpy.

    Returns:
        A cudf or pandas DataFrame of ``local_size`` rows: "build" has int64 columns key (unique,
        ``[local_size*i_chunk, local_size*(i_chunk+1))``), shuffle (a random partition number) and
        payload; "other" has int64 key (``frac_match`` of the rows match base keys, balanced over
        the base partitions) and payload.

    The random state is seeded with 2**32 - 1 on every call (dask-cuda's choice, "a seed that
    triggers max amount of comm in the two-GPU case"), so the data is the same for every run.
    """
    i_chunk, local_size, num_chunks, chunk_type, frac_match, gpu = input
    if gpu:
        import cudf as xdf
        import cupy as xp
        import dask_cudf  # noqa: F401  (registers the cudf dataframe backend)
    else:
        import numpy as xp
        import pandas as xdf

    xp.random.seed(2**32 - 1)
    chunk_type = chunk_type or "build"
    frac_match = frac_match or 1.0
    if chunk_type == "build":
        start = local_size * i_chunk
        stop = start + local_size
        parts_array = xp.arange(num_chunks, dtype="int64")
        suffle_array = xp.repeat(parts_array, math.ceil(local_size / num_chunks))
        return xdf.DataFrame(
            {
                "key": xp.arange(start, stop=stop, dtype="int64"),
                "shuffle": xp.random.permutation(suffle_array)[:local_size],
                "payload": xp.random.permutation(xp.arange(local_size, dtype="int64")),
            }
        )
    sub_local_size = local_size // num_chunks
    sub_local_size_use = max(int(sub_local_size * frac_match), 1)
    arrays = []
    for i in range(num_chunks):
        bgn = (local_size * i) + (sub_local_size * i_chunk)
        end = bgn + sub_local_size
        ar = xp.arange(bgn, stop=end, dtype="int64")
        arrays.append(xp.random.permutation(ar)[:sub_local_size_use])
    key_array_match = xp.concatenate(tuple(arrays), axis=0)
    missing_size = local_size - key_array_match.shape[0]
    start = local_size * num_chunks + local_size * i_chunk
    stop = start + missing_size
    key_array_no_match = xp.arange(start, stop=stop, dtype="int64")
    key_array_combine = xp.concatenate((key_array_match, key_array_no_match), axis=0)
    return xdf.DataFrame(
        {
            "key": xp.random.permutation(key_array_combine),
            "payload": xp.random.permutation(xp.arange(local_size, dtype="int64")),
        }
    )


def random_ddf(chunk_size: int, num_chunks: int, frac_match: float, chunk_type: str, gpu: bool,
               no_shuffle: bool = False):
    """A Dask DataFrame of ``num_chunks`` partitions from :func:`generate_chunk` (dask-cuda's
    get_random_ddf): the build frame is shuffled by ``set_index("shuffle")`` into
    ``num_chunks`` partitions unless ``no_shuffle``, which drops the shuffle column instead."""
    import dask.dataframe as dd

    meta = generate_chunk((0, 4, 1, chunk_type, None, gpu))
    ddf = dd.from_map(
        generate_chunk,
        [(i, chunk_size, num_chunks, chunk_type, frac_match, gpu) for i in range(num_chunks)],
        meta=meta,
        divisions=[None] * (num_chunks + 1),
    )
    if chunk_type == "build":
        if not no_shuffle:
            return ddf.set_index("shuffle", divisions=tuple(range(num_chunks)) + (num_chunks,))
        del ddf["shuffle"]
    return ddf


# ---------------------------------------------------------------------------------------------
# dask-cuda's statistics (benchmarks/utils.py: hmean, hstd, bandwidth_statistics,
# peer_to_peer_bandwidths, address_to_index), on plain lists so they can be checked by hand.
# ---------------------------------------------------------------------------------------------


def hmean(xs: Sequence[float]) -> float:
    """Harmonic mean, 1 / mean(1/x); 0 (an int, so it prints "0 B/s" as in dask-cuda) for no values."""
    if not len(xs):
        return 0
    return 1.0 / (math.fsum(1.0 / x for x in xs) / len(xs))


def hstd(xs: Sequence[float]) -> float:
    """dask-cuda's "harmonic standard deviation": sqrt(var(1/x) / (n * mean(1/x)**4)), with the
    population variance (numpy's var, ddof=0); 0 for no values."""
    n = len(xs)
    if not n:
        return 0
    inv = [1.0 / x for x in xs]
    rmean = math.fsum(inv) / n
    rvar = math.fsum((v - rmean) ** 2 for v in inv) / n
    return math.sqrt(rvar / (n * rmean**4))


@dataclass(frozen=True)
class PairStats:
    """Transfers one worker (w1) received from another (w2), as dask-cuda's BandwidthStats.

    Attributes:
        w1, w2: worker indices (receiver, sender).
        n: transfers counted (those of at least ignore_size bytes).
        hmean, hstd, q25, q50, q75, min, max: bandwidth of those transfers, B/s.
        total_bytes: bytes of those transfers.
    """

    w1: int
    w2: int
    n: int
    hmean: float
    hstd: float
    q25: float
    q50: float
    q75: float
    min: float
    max: float
    total_bytes: int

    def to_dict(self) -> dict:
        return asdict(self)


def pair_statistics(
    logs: Mapping[str, Iterable[Mapping[str, Any]]],
    address_to_index: Mapping[str, int],
    ignore_size: int | None,
) -> list[PairStats]:
    """Per worker-pair bandwidth statistics from the workers' incoming-transfer logs.

    Args:
        logs: receiving worker's address -> its transfer_incoming_log entries, each with "who"
            (the sender's address), "total" (bytes) and "bandwidth" (B/s).
        address_to_index: worker address -> index (see :func:`address_to_index`).
        ignore_size: entries with fewer bytes are left out (None keeps all), as in dask-cuda.

    Returns:
        One PairStats per (receiver, sender) with at least one counted transfer, sorted by
        (w1, w2). Quantiles use linear interpolation (numpy's default, as dask-cuda's np.quantile).
        Senders that are not in ``address_to_index`` (a worker that left) are skipped.
    """
    out: list[PairStats] = []
    for receiver, entries in logs.items():
        if receiver not in address_to_index:
            continue
        bws: dict[str, list[float]] = {}
        totals: dict[str, int] = {}
        for e in entries:
            if ignore_size is not None and e["total"] < ignore_size:
                continue
            bws.setdefault(e["who"], []).append(float(e["bandwidth"]))
            totals[e["who"]] = totals.get(e["who"], 0) + int(e["total"])
        for sender, xs in bws.items():
            if sender not in address_to_index:
                continue
            s = sorted(xs)
            out.append(PairStats(
                w1=address_to_index[receiver], w2=address_to_index[sender], n=len(s),
                hmean=hmean(s), hstd=hstd(s),
                q25=_percentile(s, 25), q50=_percentile(s, 50), q75=_percentile(s, 75),
                min=s[0], max=s[-1], total_bytes=totals[sender],
            ))
    return sorted(out, key=lambda p: (p.w1, p.w2))


def address_to_index(devices: Mapping[str, int]) -> dict[str, int]:
    """Worker address -> index, workers on one host numbered together and by device within it
    (dask-cuda's address_to_index).

    Args:
        devices: worker address -> its first CUDA_VISIBLE_DEVICES entry, -1 when it has none.
    """
    order = sorted(devices, key=lambda a: (_address_host(a), devices[a]))
    return {a: i for i, a in enumerate(order)}


def _address_host(address: str) -> str:
    """'tcp://10.0.0.1:1234' -> '10.0.0.1'; '[::1]' forms keep their brackets' content."""
    rest = address.split("://", 1)[-1]
    if rest.startswith("["):
        return rest[1:].split("]", 1)[0]
    return rest.rsplit(":", 1)[0]


# ---------------------------------------------------------------------------------------------
# Checks before any worker starts
# ---------------------------------------------------------------------------------------------


def required_device_bytes(spec: MergeSpec, total_bytes: int) -> int:
    """Bytes of device memory one worker's RMM pool takes at start: the pool given, a fraction of
    ``total_bytes``, RMM's default (half of the device's memory) or 0 (no pool / async)."""
    if spec.rmm_async or spec.disable_rmm_pool:
        return 0
    if spec.rmm_pool_bytes is not None:
        return spec.rmm_pool_bytes
    if spec.rmm_pool_fraction is not None:
        return int(total_bytes * spec.rmm_pool_fraction)
    return total_bytes // 2


def check_devices_and_memory(
    spec: MergeSpec,
    visible: int,
    memory: Mapping[int, tuple[int, int]],
    scheduler_device: int | None = 0,
) -> None:
    """Refuse devices that are not there and pools that do not fit, before any worker starts.

    Args:
        spec: the options (devices, pool).
        visible: number of GPUs the machine shows.
        memory: device -> (free, total) bytes, for every device in spec.devices.
        scheduler_device: the device on which the client process makes the scheduler's 1 GB pool
            and its CUDA context (dask-cuda's setup), or None when it makes none there.

    Raises:
        UsageError: a device id >= visible, or a device whose free memory is smaller than the pool
            plus CONTEXT_MARGIN_BYTES (plus the scheduler's pool and context on scheduler_device).
    """
    for d in spec.devices:
        if d >= visible:
            raise UsageError(
                f"device {d} in -d {','.join(map(str, spec.devices))} is not visible: this machine shows "
                f"{visible} GPU(s)", f"use ids 0..{visible - 1}" if visible else "no GPU is visible")
    for d in spec.devices:
        free, total = memory[d]
        need = required_device_bytes(spec, total) + CONTEXT_MARGIN_BYTES
        if d == scheduler_device and not spec.external:
            need += SCHEDULER_POOL_BYTES + CONTEXT_MARGIN_BYTES
        if need > free:
            pool = required_device_bytes(spec, total)
            raise UsageError(
                f"RMM pool of {format_size(pool)} per worker does not fit on GPU {d}: "
                f"{format_size(free)} free of {format_size(total)}, and {format_size(need - pool)} "
                f"must stay free for the CUDA context" + (" and the scheduler's 1 GB pool"
                                                            if d == scheduler_device else ""),
                f"use --rmm-pool-size {format_size(max(free - (need - pool), 0))} or less, or a fraction like 0.5",
            )


def _nvml_memory(devices: Sequence[int]) -> tuple[int, dict[int, tuple[int, int]]]:
    """(GPUs visible to NVML, device -> (free, total) bytes) without creating a CUDA context.

    Raises:
        NoGPUError: NVML cannot be loaded or shows no GPU.
    """
    try:
        import pynvml as nv

        nv.nvmlInit()
    except Exception as e:
        raise NoGPUError(f"NVML: {type(e).__name__}") from None
    try:
        n = nv.nvmlDeviceGetCount()
        if n < 1:
            raise NoGPUError("NVML shows 0 GPUs")
        mem = {}
        for d in devices:
            if d < n:
                info = nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(d))
                mem[d] = (int(info.free), int(info.total))
        return n, mem
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass


def _scheduler_device() -> int:
    """The physical GPU that is CUDA device 0 of this process (first of CUDA_VISIBLE_DEVICES)."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


def check_cuda_visible_devices(devices: Sequence[int], value: str | None) -> None:
    """Refuse -d devices that this process's CUDA_VISIBLE_DEVICES hides.

    -d names physical GPUs, as dask-cuda's does (its workers get CUDA_VISIBLE_DEVICES rotated from
    the list), so dask-cuda would start workers on a GPU the user hid from this process; gpubench
    refuses instead. NVML, which the other checks use, ignores CUDA_VISIBLE_DEVICES. Entries that
    are not integers (GPU-UUIDs, MIG names) cannot be matched to -d and are not checked.

    Args:
        devices: the -d ids.
        value: the environment variable's value, None when it is not set.

    Raises:
        NoGPUError: the variable is set but lists no GPU ("", "-1").
        UsageError: a -d id that is not in it.
    """
    if value is None:
        return
    entries = [e.strip() for e in value.split(",")]
    # CUDA stops at the first invalid entry: "0,-1,1" shows GPU 0 only
    shown: list[int] = []
    for e in entries:
        if not e.isdigit():
            if e and not e.lstrip("-").isdigit():
                return  # a UUID or MIG name: not comparable with -d
            break
        shown.append(int(e))
    if not shown:
        raise NoGPUError(f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU")
    hidden = [d for d in devices if d not in shown]
    if hidden:
        raise UsageError(f"device {hidden[0]} in -d {','.join(map(str, devices))} is hidden by "
                         f"CUDA_VISIBLE_DEVICES={value!r}",
                         f"-d names physical GPUs (dask-cuda's meaning): use {','.join(map(str, shown))} "
                         "or unset CUDA_VISIBLE_DEVICES")


def preflight(spec: MergeSpec) -> dict[int, tuple[int, int]]:
    """Check, for a local -t gpu cluster, the devices and the pool against NVML and
    CUDA_VISIBLE_DEVICES; returns the memory.

    Raises:
        NoGPUError, UsageError: see check_cuda_visible_devices and check_devices_and_memory.
    """
    check_cuda_visible_devices(spec.devices, os.environ.get("CUDA_VISIBLE_DEVICES"))
    visible, mem = _nvml_memory(spec.devices)
    check_devices_and_memory(spec, visible, mem, _scheduler_device())
    return mem


# ---------------------------------------------------------------------------------------------
# Functions run on the workers (client.run passes the worker as dask_worker)
# ---------------------------------------------------------------------------------------------


def _quiet_shutdown_logs() -> None:
    """On a worker: a closing worker's heartbeat can fail with "ConnectionPool is closed", which
    tornado logs as a traceback ("Exception in callback Worker.heartbeat") after the run, on Ctrl-C
    most of all. gpubench closes the cluster itself, so those loggers are told to keep quiet."""
    import logging

    for name in ("tornado.application", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _worker_device() -> int:
    """First entry of the worker's CUDA_VISIBLE_DEVICES, -1 without one (dask-cuda's get_worker_device)."""
    try:
        device, *_ = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
        return int(device)
    except (KeyError, ValueError):
        return -1


def _clear_transfer_log(dask_worker=None) -> int:
    """Empty the worker's transfer_incoming_log; returns its maximum length."""
    dask_worker.transfer_incoming_log.clear()
    return dask_worker.transfer_incoming_log.maxlen or 0


def _take_transfer_log(dask_worker=None) -> list[dict]:
    """The worker's incoming transfers since the last clear: who, total (B), bandwidth (B/s),
    duration (s), start (s, the worker's clock)."""
    return [
        {"who": e["who"], "total": int(e["total"]), "bandwidth": float(e["bandwidth"]),
         "duration": float(e["duration"]), "start": float(e["start"])}
        for e in list(dask_worker.transfer_incoming_log)
    ]


def _has_rmm_plugin(dask_worker=None) -> bool:
    return any("RMMSetup" in k for k in dask_worker.plugins.keys())


def _setup_rmm(pool_size=None, disable_rmm_pool=False, rmm_async=False, dask_worker=None) -> str:
    """Make the worker's RMM memory resource as dask-cuda's benchmark setup_memory_pool does and
    route CuPy's allocations through it; returns a description.

    Args:
        pool_size: bytes (int), a fraction of the device's total memory (float), or None (RMM's
            default: half of the device's memory).
    """
    import cupy
    import rmm
    from rmm.allocators.cupy import rmm_cupy_allocator

    if pool_size is not None:
        from dask_cuda.utils import parse_device_memory_limit

        pool_size = parse_device_memory_limit(pool_size, alignment_size=256)
    if rmm_async:
        rmm.mr.set_current_device_resource(rmm.mr.CudaAsyncMemoryResource())
        desc = "async"
    else:
        rmm.reinitialize(pool_allocator=not disable_rmm_pool, initial_pool_size=pool_size)
        desc = "none" if disable_rmm_pool else f"pool {pool_size if pool_size is not None else 'default'}"
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    return desc


# ---------------------------------------------------------------------------------------------
# The cluster
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_ucx_env() -> Iterator[None]:
    # distributed-ucxx sets UCX_MEMTYPE_CACHE, which UCX then warns about on every process start.
    old = os.environ.get("UCX_WARN_UNUSED_ENV_VARS")
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("UCX_WARN_UNUSED_ENV_VARS", None)


def _import_ucxx() -> None:
    try:
        import distributed_ucxx  # noqa: F401
    except Exception as e:
        raise UsageError(
            f"-p ucx needs distributed-ucxx, which cannot be imported ({type(e).__name__}: "
            f"{(str(e).splitlines() or [''])[0][:80]})",
            "pip install 'gpubench-cuda[ucx-cu13]' (or [ucx-cu12]); UCX-Py is discontinued",
        ) from None


def _is_oom_text(text: str) -> bool:
    t = text.lower()
    return "out of memory" in t or "out_of_memory" in t or "bad_alloc" in t or "memoryerror" in t


@contextlib.contextmanager
def _workers_ignore_sigint() -> Iterator[None]:
    """Ignore SIGINT while worker processes are spawned, so they inherit SIG_IGN (kept across
    exec, and CPython installs no KeyboardInterrupt handler over an ignored SIGINT). A Ctrl-C at
    the terminal reaches the whole process group; without this every worker prints its own
    KeyboardInterrupt traceback while gpubench itself stops the cluster and keeps what it measured.
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def check_interface(name: str) -> None:
    """Refuse a --interface this host does not have (distributed only says so once the cluster is
    starting, as a RuntimeError).

    Raises:
        UsageError: ``name`` is not an interface of this host with an IPv4 address (distributed
            binds to the interface's IPv4 address); the line lists those that have one.
    """
    import socket

    import psutil

    addrs = psutil.net_if_addrs()
    usable = sorted(n for n, a in addrs.items() if any(x.family == socket.AF_INET for x in a))
    if name not in addrs:
        raise UsageError(f"--interface {name!r} is not a network interface of this host",
                         f"use one of {', '.join(usable)}")
    if name not in usable:
        raise UsageError(f"--interface {name!r} has no IPv4 address, which Dask binds to",
                         f"use one of {', '.join(usable)}")


@contextlib.contextmanager
def cluster_client(spec: MergeSpec) -> Iterator[tuple[Any, Any]]:
    """Start (or attach to) the cluster and yield (client, cluster); cluster is None when external.

    A local cluster is closed on the way out whatever happened, within CLOSE_TIMEOUT_S, which
    stops its worker processes (each Nanny kills its worker).

    Raises:
        UsageError: an external scheduler that cannot be reached or has no workers; a missing
            scheduler file; -p ucx without distributed-ucxx; -t gpu without dask-cuda.
        MachineError: the local cluster could not start.
    """
    import logging

    import dask
    from distributed import Client, LocalCluster

    if spec.protocol == "ucx":
        _import_ucxx()
    if spec.interface is not None and not spec.external:
        check_interface(spec.interface)
    cluster = None
    client = None
    # The workers inherit this config through their Nanny (a local cluster only).
    cfg = {"distributed.admin.low-level-log-length": TRANSFER_LOG_LENGTH}
    try:
        with dask.config.set(cfg), _quiet_ucx_env(), warnings.catch_warnings():
            if spec.external:
                from gpubench.core.scheduler import check_scheduler_address, scheduler_file_address

                if spec.scheduler_address:
                    check_scheduler_address(spec.scheduler_address)
                else:
                    scheduler_file_address(spec.scheduler_file)  # distributed waits forever for a missing one
                where = spec.scheduler_address or spec.scheduler_file
                try:
                    if spec.scheduler_address:
                        client = Client(spec.scheduler_address, timeout=min(spec.timeout_s, 10))
                    else:
                        client = Client(scheduler_file=spec.scheduler_file, timeout=min(spec.timeout_s, 10))
                except (OSError, TimeoutError, ValueError) as e:
                    raise UsageError(f"cannot reach the scheduler at {where}: {error_line(e)}",
                                     "check the address (e.g. tcp://HOST:8786) and that it runs") from None
                try:
                    client.wait_for_workers(1, timeout=min(spec.timeout_s, 60))
                except (OSError, TimeoutError) as e:
                    raise UsageError(f"the scheduler at {where} has no workers ({error_line(e)})") from None
            else:
                common = dict(
                    n_workers=len(spec.devices), threads_per_worker=spec.threads_per_worker,
                    protocol=spec.protocol, interface=spec.interface, dashboard_address=None,
                    death_timeout=spec.timeout_s,  # bounds each worker's start (Nanny)
                    # A lost worker makes the others log tracebacks; the error we raise names it.
                    silence_logs=logging.CRITICAL,
                )
                try:
                    # dask-cuda's benchmark hides this one too: the pool is made after the start.
                    warnings.filterwarnings("ignore", message=".*NVLink.*rmm_pool_size.*", category=UserWarning)
                    if spec.merge_type == "gpu":
                        try:
                            from dask_cuda import LocalCUDACluster
                        except Exception as e:
                            raise UsageError(f"-t gpu needs dask-cuda, which cannot be imported "
                                             f"({error_line(e)[:100]})",
                                             "pip install 'gpubench-cuda[rapids-cu13]' (or [rapids-cu12]), or use -t cpu") from None
                        with _workers_ignore_sigint():
                            cluster = LocalCUDACluster(
                                CUDA_VISIBLE_DEVICES=",".join(map(str, spec.devices)),
                                device_memory_limit=None,
                                enable_cudf_spill=spec.enable_cudf_spill,
                                enable_tcp_over_ucx=spec.enable_tcp_over_ucx,
                                enable_infiniband=spec.enable_infiniband,
                                enable_nvlink=spec.enable_nvlink,
                                enable_rdmacm=spec.enable_rdmacm,
                                **common,
                            )
                    else:
                        with _workers_ignore_sigint():
                            cluster = LocalCluster(processes=True, **common)
                except (UsageError, KeyboardInterrupt):
                    raise
                except Exception as e:
                    raise MachineError(f"the {spec.merge_type} cluster over {spec.protocol} did not start: "
                                       f"{error_line(e)[:160]}") from None
                client = Client(cluster, timeout=min(spec.timeout_s, 60))
        yield client, cluster
    finally:
        _close_all(client, cluster)


def _close_all(client, cluster) -> None:
    """Close the client, then the cluster, even when a Ctrl-C or SIGTERM lands in the middle: the
    interrupted close is tried once more (the CLI notes and ignores later signals) so no worker
    process is left, then the interrupt is raised again for the caller to keep the result."""
    pending: BaseException | None = None
    for what, close in (("client", lambda: client.close(timeout=10)),
                        ("cluster", lambda: cluster.close(timeout=CLOSE_TIMEOUT_S))):
        if (client if what == "client" else cluster) is None:
            continue
        for _attempt in range(2):
            try:
                close()
                break
            except (KeyboardInterrupt, Interrupted) as e:
                pending = pending or e
            except Exception:
                break
    if pending is not None:
        raise pending


def compute_watching(client, values: Sequence[Any], workers: Mapping[str, int], timeout_s: float, what: str) -> list:
    """dask.compute of small lazy values (lengths, sums) on the cluster, watched as wait_watching."""
    futs = client.compute(list(values))
    wait_watching(client, futs, workers, timeout_s, what)
    return [f.result() for f in futs]


# ---------------------------------------------------------------------------------------------
# One run and the driver
# ---------------------------------------------------------------------------------------------


@dataclass
class RunOutcome:
    """One timed (or warm-up) run: bytes processed, seconds, and the transfers of its join.

    Attributes:
        data_processed: bytes (see module docstring).
        seconds: wall clock of the join.
        logs: receiving worker's address -> transfers logged during the join.
        log_full: workers whose log reached its maximum length (older entries were lost).
    """

    data_processed: int
    seconds: float
    logs: dict[str, list[dict]]
    log_full: list[str]


def bench_once(client, spec: MergeSpec, n_workers: int, workers: Mapping[str, int], what: str,
               keep_result: bool = False):
    """Generate both frames, then time their join (dask-cuda's bench_once).

    Returns:
        (RunOutcome, joined) where joined is the persisted join when keep_result, else None.

    Raises:
        MachineError: see wait_watching.
    """
    gpu = spec.merge_type == "gpu"
    base_chunks = spec.base_chunks or n_workers
    other_chunks = spec.other_chunks or n_workers
    ddf_base = random_ddf(spec.chunk_size, base_chunks, spec.frac_match, "build", gpu, spec.no_shuffle).persist()
    ddf_other = random_ddf(spec.chunk_size, other_chunks, spec.frac_match, "other", gpu).persist()
    wait_watching(client, ddf_base, workers, spec.timeout_s, f"{what} (generating the base frame)")
    wait_watching(client, ddf_other, workers, spec.timeout_s, f"{what} (generating the other frame)")
    rows_base, rows_other = compute_watching(client, [ddf_base.shape[0], ddf_other.shape[0]], workers,
                                             spec.timeout_s, f"{what} (counting rows)")
    data_processed = rows_base * sum(t.itemsize for t in ddf_base.dtypes)
    data_processed += rows_other * sum(t.itemsize for t in ddf_other.dtypes)

    maxlens = run_on_workers(client, _clear_transfer_log, workers, f"{what} (clearing the transfer logs)")
    t0 = time.perf_counter()
    joined = ddf_base.merge(ddf_other, on=["key"], how="inner", broadcast=spec.broadcast)
    if spec.set_index:
        joined = joined.set_index("key")
    joined = joined.persist()
    seconds = wait_watching(client, joined, workers, spec.timeout_s, f"{what} (join)") - t0
    logs = run_on_workers(client, _take_transfer_log, workers, f"{what} (reading the transfer logs)")
    full = [a for a, entries in logs.items() if maxlens.get(a) and len(entries) >= maxlens[a]]
    del ddf_base, ddf_other
    return RunOutcome(int(data_processed), seconds, logs, full), (joined if keep_result else None)


def join_check(client, joined, workers: Mapping[str, int], timeout_s: float) -> dict[str, int]:
    """Rows of the join and sums of its columns (computed after the timed runs), to compare with
    pandas on the same data: {"rows", "key_sum", "payload_x_sum", "payload_y_sum"}."""
    df = joined.reset_index() if "key" not in joined.columns else joined
    rows, k, px, py = compute_watching(
        client, [df.shape[0], df["key"].sum(), df["payload_x"].sum(), df["payload_y"].sum()], workers,
        timeout_s, "the join check")
    return {"rows": int(rows), "key_sum": int(k), "payload_x_sum": int(px), "payload_y_sum": int(py)}


def _require_dask() -> None:
    """Raise a UsageError naming what to install when Dask's distributed or dataframe parts are missing."""
    for mod, pkg in (("distributed", "dask[distributed]"), ("pandas", "pandas"),
                     ("dask.dataframe", "dask[dataframe] (it needs pyarrow)")):
        try:
            __import__(mod)
        except Exception as e:
            raise UsageError(f"merge needs {pkg}, which cannot be imported ({error_line(e)[:120]})",
                             "pip install 'gpubench-cuda[dask]'") from None


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for dist in ("dask", "distributed", "pandas", "pyarrow", "dask-cuda", "cudf-cu13", "cudf-cu12",
                 "dask-cudf-cu13", "rmm-cu13", "rmm-cu12", "ucxx-cu13", "ucxx-cu12",
                 "distributed-ucxx-cu13", "distributed-ucxx-cu12", "libucx-cu13", "libucx-cu12"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


def run(spec: MergeSpec, progress: ProgressSink | None = None) -> Result:
    """Run the merge benchmark.

    Args:
        spec: the parsed options.
        progress: advanced once per run (warm-ups included); silent when None.

    Returns:
        A Result with one Record: params identify the configuration, metric "bandwidth", nbytes =
        data processed per run (bytes), samples_s = wall clock of each timed run (s); extra holds
        the throughputs (B/s), their hmean/hstd, the pair table (B/s), the bandwidth hmean/hstd,
        the workers (index -> address) and the join check.

    Raises:
        NoGPUError: -t gpu with no GPU visible.
        UsageError: a device not visible, a pool that does not fit, an unreachable scheduler.
        MachineError: the cluster did not start, a worker died, a task failed, a timeout.
    """
    _require_dask()
    progress = progress or ProgressSink()
    if spec.merge_type == "gpu" and not spec.external:
        preflight(spec)
    env = envmod.capture()
    env.setdefault("versions", {}).update(_versions())

    outcomes: list[RunOutcome] = []
    info: dict[str, Any] = {}
    check_box: dict[str, Any] = {}
    try:
        _drive(spec, progress, outcomes, info, check_box)
    except MachineError as e:
        if outcomes:  # keep the timed runs that finished (printed and saved by the command, exit 3)
            e.partial_result = _result(spec, env, outcomes, info, check_box.get("check"), None, e.one_line())
        raise
    except (KeyboardInterrupt, Interrupted) as e:
        # a signal outside the runs (while the cluster closed, say): keep what was measured
        if not outcomes:
            raise
        sig = "SIGINT" if isinstance(e, KeyboardInterrupt) else signal.Signals(e.signum).name
        return _result(spec, env, outcomes, info, check_box.get("check"), sig, None)
    return _result(spec, env, outcomes, info, check_box.get("check"), check_box.get("interrupted"), None)


def _drive(spec: MergeSpec, progress: ProgressSink, outcomes: list, info: dict, box: dict) -> None:
    """The cluster and the runs of :func:`run`; fills ``outcomes``, ``info`` and ``box`` (the join
    check, the interrupting signal) as it goes, so a fault keeps what came before it."""
    import dask

    box["check"] = None
    box["interrupted"] = None
    with dask.config.set({"dataframe.shuffle.method": spec.shuffle_method}):
        with cluster_client(spec) as (client, cluster):
            devices = run_on_workers(client, _worker_device, {}, "asking the workers for their GPU")
            if cluster is not None:  # our own workers only; an external cluster's logs are its owner's
                run_on_workers(client, _quiet_shutdown_logs, {}, "quieting the workers' shutdown logs")
            index = address_to_index(devices)
            n_workers = len(index)
            info["workers"] = [{"index": i, "address": a, "device": devices[a]} for a, i in index.items()]
            info["n_workers"] = n_workers
            info["base_chunks"] = spec.base_chunks or n_workers
            info["other_chunks"] = spec.other_chunks or n_workers
            info["scheduler_address"] = client.scheduler.address
            info["address_to_index"] = dict(index)
            info["rmm"] = _rmm_setup(client, spec, index) if spec.merge_type == "gpu" else "not used (-t cpu)"
            groups = [("warm-up", i) for i in range(spec.warmup_runs)] + [("run", i) for i in range(spec.runs)]

            def label(g):
                return f"{g[0]} {g[1] + 1}/{spec.warmup_runs if g[0] == 'warm-up' else spec.runs}"

            def measure(g):
                last = g == ("run", spec.runs - 1)
                out, joined = bench_once(client, spec, n_workers, index, label(g), keep_result=last)
                if g[0] == "run":
                    outcomes.append(out)
                if joined is not None:
                    box["check"] = join_check(client, joined, index, spec.timeout_s)
                return []

            def on_alloc_error(g, e):
                raise MachineError(f"{label(g)} ran out of memory: {error_line(e)[:160]}",
                                   "use a smaller -c, or a larger --rmm-pool-size") from None

            _, box["interrupted"] = run_groups(groups, measure, on_alloc_error, progress, label)


def _result(spec: MergeSpec, env: dict, outcomes: list, info: dict, check: dict | None,
            interrupted: str | None, failed_by: str | None) -> Result:
    """The Result of the timed runs in ``outcomes`` (partial when a signal or a fault cut them short)."""
    return Result(
        command="merge",
        spec=spec.to_dict(),
        timing={
            "clock": "perf_counter",
            "method": "per run: both frames generated and persisted untimed; then perf_counter around "
                      "building the join's graph, persist and wait (dask-cuda's local_cudf_merge)",
            "warmup_runs": spec.warmup_runs,
            "runs": spec.runs,
            "shuffle_method": spec.shuffle_method,
            "transfer_log": "cleared before each timed join and read after it",
        },
        env=env,
        records=[_record(spec, outcomes, info, check)] if outcomes else [],
        partial=interrupted is not None or failed_by is not None,
        interrupted_by=interrupted,
        failed_by=failed_by,
    )


def _rmm_setup(client, spec: MergeSpec, workers: Mapping[str, int]) -> str:
    """Set up RMM on the workers and the scheduler as dask-cuda's setup_memory_pools does."""
    if spec.external and any(run_on_workers(client, _has_rmm_plugin, workers, "looking for RMMSetup").values()):
        return "already set up on the external cluster (RMMSetup plugin); pool options not applied"
    pool = spec.rmm_pool_bytes if spec.rmm_pool_bytes is not None else spec.rmm_pool_fraction
    kw = dict(pool_size=pool, disable_rmm_pool=spec.disable_rmm_pool, rmm_async=spec.rmm_async)
    try:
        descs = run_on_workers(client, _setup_rmm, workers, "RMM setup", **kw)
    except MachineError as e:
        if _is_oom_text(e.message):
            raise UsageError(f"the RMM pool did not fit on a worker's GPU: {e.message[:200]}",
                             "use a smaller --rmm-pool-size") from None
        raise
    # dask-cuda also makes a 1 GB pool in the scheduler "due to occasional deserialization of CUDA
    # objects"; for a local cluster that is this process, on its CUDA device 0.
    try:
        client.run_on_scheduler(_setup_rmm, **{**kw, "pool_size": None if (spec.rmm_async or spec.disable_rmm_pool)
                                               else SCHEDULER_POOL_BYTES})
        sched = ""
    except Exception as e:
        if not spec.external:
            raise MachineError(f"RMM setup on the scheduler failed: {error_line(e)[:200]}") from None
        sched = f"; scheduler: not set up ({error_line(e)[:80]})"
    return "; ".join(sorted(set(descs.values()))) + sched


def _record(spec: MergeSpec, outcomes: list[RunOutcome], info: dict, check: dict | None) -> Record:
    params = {
        "type": spec.merge_type, "protocol": spec.protocol, "chunk_size": spec.chunk_size,
        "base_chunks": info.get("base_chunks"), "other_chunks": info.get("other_chunks"),
        "frac_match": spec.frac_match, "broadcast": spec.broadcast_label, "n_workers": info.get("n_workers"),
        "shuffle_method": spec.shuffle_method,
    }
    if not outcomes:
        return Record(params=params, metric="bandwidth", error="no run finished")
    nbytes = outcomes[0].data_processed
    seconds = [o.seconds for o in outcomes]
    throughputs = [o.data_processed / o.seconds for o in outcomes]
    logs: dict[str, list[dict]] = {}
    for o in outcomes:
        for a, entries in o.logs.items():
            logs.setdefault(a, []).extend(entries)
    index = info.get("address_to_index", {})
    pairs = pair_statistics(logs, index, spec.ignore_size)
    pair_hmeans = [p.hmean for p in pairs if p.hmean > 0]
    all_logged = sum(len(v) for v in logs.values())
    counted = sum(p.n for p in pairs)
    extra = {
        "data_processed_bytes": nbytes,
        "throughputs_Bps": throughputs,
        "throughput_hmean_Bps": hmean(throughputs),
        "throughput_hstd_Bps": hstd(throughputs),
        "bandwidth_hmean_Bps": hmean(pair_hmeans),
        "bandwidth_hstd_Bps": hstd(pair_hmeans),
        "wall_clock_mean_s": math.fsum(seconds) / len(seconds),
        "wall_clock_std_s": math.sqrt(math.fsum((s - math.fsum(seconds) / len(seconds)) ** 2 for s in seconds)
                                      / len(seconds)),
        "pairs": [p.to_dict() for p in pairs],
        "transfers_logged": all_logged,
        "transfers_counted": counted,
        "transfer_log_overflowed": sorted({a for o in outcomes for a in o.log_full}),
        "workers": info.get("workers", []),
        "rmm": info.get("rmm"),
        "scheduler_address": info.get("scheduler_address"),
        "join_check": check,
    }
    return Record(params=params, metric="bandwidth", nbytes=nbytes, samples_s=seconds, reps=1, extra=extra)

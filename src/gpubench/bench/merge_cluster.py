"""merge's cluster: the checks before any worker starts (devices, RMM pool, CUDA_VISIBLE_DEVICES,
--interface), starting or attaching to the cluster (a distributed LocalCluster, dask-cuda's
LocalCUDACluster, or an external scheduler) and closing it on every path, the RMM setup of the
workers and the scheduler (dask-cuda's setup_memory_pools), and the functions run on the workers.

Dask, dask-cuda, RMM, CuPy and UCXX are imported inside functions only.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from gpubench.core.errors import MachineError, NoGPUError, UsageError
from gpubench.core.scheduler import error_line, run_on_workers
from gpubench.core.signals import Interrupted
from gpubench.core.units import format_size

if TYPE_CHECKING:  # types only: bench/merge imports this module
    from gpubench.bench.merge import MergeSpec

# Left free on each GPU beyond the RMM pool: the CUDA context (~0.5 GiB on H100/H200) plus cuDF's and
# UCX's own allocations outside the pool.
CONTEXT_MARGIN_BYTES = 1 * 2**30
# dask-cuda's benchmark also makes a 1 GB pool in the scheduler (the client process for a local cluster).
SCHEDULER_POOL_BYTES = 10**9
# Entries kept in each worker's transfer_incoming_log (distributed's default is 1000).
TRANSFER_LOG_LENGTH = 100_000
CLOSE_TIMEOUT_S = 30


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


def quiet_shutdown_logs() -> None:
    """On a worker: a closing worker's heartbeat can fail with "ConnectionPool is closed", which
    tornado logs as a traceback ("Exception in callback Worker.heartbeat") after the run, on Ctrl-C
    most of all. gpubench closes the cluster itself, so those loggers are told to keep quiet."""
    import logging

    for name in ("tornado.application", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def worker_device() -> int:
    """First entry of the worker's CUDA_VISIBLE_DEVICES, -1 without one (dask-cuda's get_worker_device)."""
    try:
        device, *_ = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
        return int(device)
    except (KeyError, ValueError):
        return -1


def clear_transfer_log(dask_worker=None) -> int:
    """Empty the worker's transfer_incoming_log; returns its maximum length."""
    dask_worker.transfer_incoming_log.clear()
    return dask_worker.transfer_incoming_log.maxlen or 0


def take_transfer_log(dask_worker=None) -> list[dict]:
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



def open_client(spec: MergeSpec) -> tuple[Any, Any]:
    """Start (or attach to) the cluster and connect a client.

    Returns:
        (client, cluster): cluster is None when the cluster is external. Close both with
        :func:`close_all` (a local cluster's close stops its worker processes: each Nanny kills
        its worker). When the start fails or is interrupted, whatever had started is closed here.

    Raises:
        UsageError: an external scheduler that cannot be reached or has no workers; a missing
            scheduler file; -p ucx without distributed-ucxx; -t gpu without dask-cuda; an
            --interface this host lacks.
        MachineError: the local cluster could not start.
    """
    import dask
    from distributed import Client

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
                client = _connect(spec)
                try:
                    client.wait_for_workers(1, timeout=min(spec.timeout_s, 60))
                except (OSError, TimeoutError) as e:
                    where = spec.scheduler_address or spec.scheduler_file
                    raise UsageError(f"the scheduler at {where} has no workers ({error_line(e)})") from None
            else:
                cluster = _start_local_cluster(spec)
                client = Client(cluster, timeout=min(spec.timeout_s, 60))
    except BaseException:
        stopped = close_all(client, cluster)
        if stopped is not None:
            raise stopped from None
        raise
    return client, cluster


def _connect(spec: MergeSpec) -> Any:
    """A client of the external scheduler (--scheduler-address / --scheduler-file).

    Raises:
        UsageError: the address is malformed, the scheduler file is missing, or the scheduler
            cannot be reached.
    """
    from distributed import Client

    from gpubench.core.scheduler import check_scheduler_address, scheduler_file_address

    if spec.scheduler_address:
        check_scheduler_address(spec.scheduler_address)
    else:
        scheduler_file_address(spec.scheduler_file or "")  # distributed waits forever for a missing one
    try:
        if spec.scheduler_address:
            return Client(spec.scheduler_address, timeout=min(spec.timeout_s, 10))
        return Client(scheduler_file=spec.scheduler_file, timeout=min(spec.timeout_s, 10))
    except (OSError, TimeoutError, ValueError) as e:
        where = spec.scheduler_address or spec.scheduler_file
        raise UsageError(f"cannot reach the scheduler at {where}: {error_line(e)}",
                         "check the address (e.g. tcp://HOST:8786) and that it runs") from None


def _start_local_cluster(spec: MergeSpec) -> Any:
    """A LocalCUDACluster (-t gpu, one worker per -d GPU) or a LocalCluster of worker processes
    (-t cpu, one per -d entry), each worker's start bounded by --timeout.

    Raises:
        UsageError: -t gpu without dask-cuda.
        MachineError: the cluster did not start.
    """
    import logging

    from distributed import LocalCluster

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
                return LocalCUDACluster(
                    CUDA_VISIBLE_DEVICES=",".join(map(str, spec.devices)),
                    device_memory_limit=None,
                    enable_cudf_spill=spec.enable_cudf_spill,
                    enable_tcp_over_ucx=spec.enable_tcp_over_ucx,
                    enable_infiniband=spec.enable_infiniband,
                    enable_nvlink=spec.enable_nvlink,
                    enable_rdmacm=spec.enable_rdmacm,
                    **common,
                )
        with _workers_ignore_sigint():
            return LocalCluster(processes=True, **common)
    except (UsageError, KeyboardInterrupt):
        raise
    except Exception as e:
        raise MachineError(f"the {spec.merge_type} cluster over {spec.protocol} did not start: "
                           f"{error_line(e)[:160]}") from None


def close_all(client, cluster) -> BaseException | None:
    """Close the client, then the cluster (within CLOSE_TIMEOUT_S), even when a Ctrl-C or SIGTERM
    lands in the middle: the interrupted close is tried once more (the CLI notes and ignores later
    signals) so no worker process is left. Other errors of a close are ignored.

    Returns:
        The first interrupt (KeyboardInterrupt or Interrupted) that landed while closing, for the
        caller to act on once everything is closed; None when none did.
    """
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
    return pending


def rmm_setup(client, spec: MergeSpec, workers: Mapping[str, int]) -> str:
    """Set up RMM on the workers and the scheduler as dask-cuda's setup_memory_pools does.

    Returns:
        What was set up, e.g. "pool 4000000000" (the workers' descriptions, then the scheduler's
        failure on an external cluster), or why nothing was (an RMMSetup plugin already there).

    Raises:
        UsageError: the pool did not fit on a worker's GPU.
        MachineError: the setup failed on a worker, or on the scheduler of a local cluster.
    """
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

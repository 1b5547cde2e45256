"""merge's cluster: the checks before any worker starts, starting or attaching to the cluster and
closing it on every path, the RMM setup (dask-cuda's setup_memory_pools), and the functions run
on the workers. Dask, dask-cuda, RMM, CuPy and UCXX are imported inside functions only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import warnings
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from gpubench.core.errors import MachineError, NoGPUError, UsageError
from gpubench.core.report import err_line
from gpubench.launch.scheduler import check_scheduler_address, error_line, run_on_workers, scheduler_file_address
from gpubench.core.signals import CRITICAL, Interrupted, raise_if_signalled, signal_noted
from gpubench.core.units import format_size

if TYPE_CHECKING:  # types only: bench/merge imports this module
    from gpubench.plugins.merge.bench import MergeSpec

CONTEXT_MARGIN_BYTES = 1 * 2**30  # left free on each GPU beyond the RMM pool (the CUDA context, cuDF, UCX)
SCHEDULER_POOL_BYTES = 10**9  # dask-cuda's benchmark's pool in the scheduler
TRANSFER_LOG_LENGTH = 100_000  # entries kept in each worker's transfer_incoming_log
CLOSE_TIMEOUT_S = 10  # a local cluster's close; then its leftover workers are killed (KILL_GRACE_S)
CLIENT_CLOSE_TIMEOUT_S = 5
FAILED_START_CLOSE_S = 3  # a start that failed or ran out of time: a short close, then the kill
KILL_GRACE_S = 2  # SIGTERM to SIGKILL for a worker that outlived its cluster's close
# After a failed start, how long to keep sweeping for workers (a spawn under way can land late).
FAILED_START_SETTLE_S = 1.0


# -- Checks before any worker starts -------------------------------------------------------------------


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


def check_devices_and_memory(spec: MergeSpec, visible: int, memory: Mapping[int, tuple[int, int]],
                             scheduler_device: int | None = 0) -> dict[int, int]:
    """Refuse devices that are not there and pools that do not fit, before any worker starts.
    ``memory``: device -> (free, total) bytes; ``scheduler_device``: where the client makes the
    scheduler's 1 GB pool, or None. Returns device -> bytes one worker may use (free less what must
    stay free).

    Raises:
        UsageError: a device id >= visible, or a device whose free memory is smaller than the pool
            plus CONTEXT_MARGIN_BYTES (plus the scheduler's pool and context on scheduler_device).
    """
    for d in spec.devices:
        if d >= visible:
            raise UsageError(
                f"device {d} in -d {','.join(map(str, spec.devices))} is not visible: this machine shows "
                f"{visible} GPU(s)", f"use ids 0..{visible - 1}" if visible else "no GPU is visible")
    room = {}
    for d in spec.devices:
        free, total = memory[d]
        pool = required_device_bytes(spec, total)
        need = pool + CONTEXT_MARGIN_BYTES
        if d == scheduler_device and not spec.external:
            need += SCHEDULER_POOL_BYTES + CONTEXT_MARGIN_BYTES
        room[d] = free - (need - pool)
        if need > free:
            raise UsageError(
                f"RMM pool of {format_size(pool)} per worker does not fit on GPU {d}: "
                f"{format_size(free)} free of {format_size(total)}, and {format_size(need - pool)} "
                f"must stay free for the CUDA context" + (" and the scheduler's 1 GB pool"
                                                            if d == scheduler_device else ""),
                f"use --rmm-pool-size {format_size(max(room[d], 0))} or less, or a fraction like 0.5",
            )
    return room


def _nvml_memory(devices: Sequence[int]) -> tuple[int, dict[int, tuple[int, int]]]:
    """(GPUs visible to NVML, device -> (free, total) bytes) without creating a CUDA context.
    NoGPUError: NVML cannot be loaded or shows no GPU."""
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
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()


def check_cuda_visible_devices(devices: Sequence[int], value: str | None) -> None:
    """Refuse -d devices (physical GPUs) that CUDA_VISIBLE_DEVICES (``value``, None when unset)
    hides; UUIDs and MIG names are not checked.

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
    """Check, for a local -t gpu cluster, the devices, the pool and the frames against NVML and
    CUDA_VISIBLE_DEVICES (NoGPUError, UsageError: the checks' own); returns the memory."""
    from gpubench.core.env import host_memory

    check_cuda_visible_devices(spec.devices, os.environ.get("CUDA_VISIBLE_DEVICES"))
    visible, mem = _nvml_memory(spec.devices)
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()  # the scheduler's GPU: CUDA device 0
    room = check_devices_and_memory(spec, visible, mem, int(first) if first.isdigit() else 0)
    check_frames_fit(spec, host_memory()[1], device_free=room)
    return mem


# -- Memory of the frames (both local cluster kinds), before any worker starts -------------------------

# Bytes per row as generate_chunk makes them (int64 columns): base key, shuffle, payload; other key, payload.
BASE_ROW_BYTES = 3 * 8
OTHER_ROW_BYTES = 2 * 8
# Copies of both frames a worker may hold at its peak. Measured peak (-t cpu): 2.2x with 2 workers, 2.75x with 1.
FRAME_COPIES = 3
WORKER_BASE_BYTES = 256 * 2**20  # a worker process before it holds data (measured 193 MiB RSS)
PARTITION_HOST_BYTES = 2**20  # this process per partition of the two frames (measured 0.55 MiB)


def worker_need_bytes(spec: MergeSpec, n_workers: int) -> int:
    """Bytes one worker may need at its peak: FRAME_COPIES x both frames as generated, -c rows x
    (base chunks x BASE_ROW_BYTES + other chunks x OTHER_ROW_BYTES)."""
    bc, oc = spec.base_chunks or n_workers, spec.other_chunks or n_workers
    return FRAME_COPIES * spec.chunk_size * (bc * BASE_ROW_BYTES + oc * OTHER_ROW_BYTES)


def big_number(v: int) -> str:
    """``v`` as digits, or "(a N-digit number)" from 10^15 on."""
    return f"{v}" if v < 10**15 else f"(a {len(str(v))}-digit number)"


def _refuse_frames(spec: MergeSpec, n_workers: int, room: int, where: str) -> UsageError:
    """Frames that need more than ``room`` bytes per worker: the error names the option furthest
    over and the largest value of it that fits."""
    c, bc, oc = spec.chunk_size, spec.base_chunks or n_workers, spec.other_chunks or n_workers
    per_row = room // FRAME_COPIES
    cands = [("-c/--chunk-size", c, per_row // (bc * BASE_ROW_BYTES + oc * OTHER_ROW_BYTES))]
    if spec.base_chunks is not None:
        cands.append(("--base-chunks", bc, max(0, (per_row // c - oc * OTHER_ROW_BYTES) // BASE_ROW_BYTES)))
    if spec.other_chunks is not None:
        cands.append(("--other-chunks", oc, max(0, (per_row // c - bc * BASE_ROW_BYTES) // OTHER_ROW_BYTES)))
    flag, value, largest = max(cands, key=lambda t: t[1] / t[2] if t[2] > 0 else float("inf"))
    return UsageError(
        f"{flag} {big_number(value)}: both frames ({bc} x -c rows x {BASE_ROW_BYTES} B + {oc} x -c rows x "
        f"{OTHER_ROW_BYTES} B) and the shuffle's copies (x{FRAME_COPIES}) need "
        f"{format_size(worker_need_bytes(spec, n_workers))} on every worker; {where} has "
        f"{format_size(max(room, 0))}",
        f"the largest {flag} that fits is {largest:,}" if largest >= 1 else
        "even 1 does not fit; lower the other sizes")


def check_frames_fit(spec: MergeSpec, host_available: int | None, device_free: Mapping[int, int] | None = None,
                     worker_limit: int | None = None) -> None:
    """Refuse a local run whose frames cannot fit, before any worker starts. Bytes:
    ``host_available`` (None: unknown), ``device_free`` (-t gpu: device -> what one worker may use),
    ``worker_limit`` (-t cpu: each worker's memory limit, None for none).

    Raises:
        UsageError: the frames do not fit on a worker (naming the option and the largest value that
            fits), the workers do not fit on the host, or the partitions' tasks in this process.
    """
    n = len(spec.devices)
    bc, oc = spec.base_chunks or n, spec.other_chunks or n
    if spec.merge_type == "cpu" and host_available is not None and n * WORKER_BASE_BYTES > host_available:
        raise UsageError(f"-d/--devices: {n:,} workers need {format_size(n * WORKER_BASE_BYTES)} of host memory "
                         f"for their processes alone; {format_size(host_available)} is available",
                         f"at most {host_available // WORKER_BASE_BYTES:,} workers")
    if host_available is not None and (bc + oc) * PARTITION_HOST_BYTES > host_available:
        most = host_available // PARTITION_HOST_BYTES
        given = [(f, v) for f, v, g in (("--base-chunks", bc, spec.base_chunks), ("--other-chunks", oc, spec.other_chunks))
                 if g is not None]
        flag, v = max(given, key=lambda t: t[1]) if given else ("-d/--devices", n)
        raise UsageError(f"{flag} {big_number(v)}: {bc + oc:,} partitions "
                         f"need about {format_size((bc + oc) * PARTITION_HOST_BYTES)} in this process for their "
                         f"tasks; {format_size(host_available)} is available",
                         f"at most {most:,} partitions of both frames together")
    rooms = [(room, f"GPU {d}") for d, room in sorted((device_free or {}).items())]
    if spec.merge_type != "gpu":
        rooms = [(worker_limit - WORKER_BASE_BYTES, "a worker (its memory limit)")] if worker_limit is not None else []
        if host_available is not None:
            rooms.append((host_available // n - WORKER_BASE_BYTES, f"the host's available memory / {n} workers"))
    for room, where in rooms:
        if worker_need_bytes(spec, n) > room:
            raise _refuse_frames(spec, n, room, where)


# -- Functions run on the workers (client.run passes the worker as dask_worker) ------------------------


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
    duration (s), start (s)."""
    return [{"who": e["who"], "total": int(e["total"]), "bandwidth": float(e["bandwidth"]),
             "duration": float(e["duration"]), "start": float(e["start"])}
            for e in list(dask_worker.transfer_incoming_log)]


def _has_rmm_plugin(dask_worker=None) -> bool:
    return any("RMMSetup" in k for k in dask_worker.plugins.keys())


def _setup_rmm(pool_size=None, disable_rmm_pool=False, rmm_async=False, dask_worker=None) -> str:
    """Make the worker's RMM memory resource as dask-cuda's benchmark setup_memory_pool does and
    route CuPy's allocations through it; returns a description. ``pool_size``: bytes, a fraction,
    or None (RMM's default)."""
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


# -- The cluster ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_ucx_env(spec: MergeSpec) -> Iterator[None]:
    """Environment for the cluster's start: UCX's unused-variable warning off; UCX_NET_DEVICES=lo
    for a local -p ucx -t cpu cluster without --interface, unless the user set it."""
    new = {"UCX_WARN_UNUSED_ENV_VARS": os.environ.get("UCX_WARN_UNUSED_ENV_VARS", "n")}
    if (spec.protocol == "ucx" and spec.merge_type == "cpu" and not spec.external and spec.interface is None
            and "UCX_NET_DEVICES" not in os.environ):
        new["UCX_NET_DEVICES"] = "lo"
    old = {k: os.environ.get(k) for k in new}
    os.environ.update(new)
    try:
        yield
    finally:
        for k, was in old.items():
            if was is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = was


@contextlib.contextmanager
def _workers_ignore_sigint() -> Iterator[None]:
    """Worker processes spawned inside this block start with SIGINT ignored, through a /bin/sh
    wrapper (``trap '' INT; exec python "$@"``) as multiprocessing's spawn executable."""
    import multiprocessing.spawn as mp_spawn
    import shlex
    import tempfile

    if not os.access("/bin/sh", os.X_OK):
        yield
        return
    old = mp_spawn.get_executable()
    with tempfile.TemporaryDirectory(prefix="gpubench-workers-", ignore_cleanup_errors=True) as folder:
        wrapper = os.path.join(folder, "python-sigint-ignored")
        with open(wrapper, "w") as f:
            f.write(f"#!/bin/sh\ntrap '' INT\nexec {shlex.quote(os.fsdecode(old))} \"$@\"\n")
        os.chmod(wrapper, 0o700)
        mp_spawn.set_executable(wrapper)
        try:
            yield
        finally:
            mp_spawn.set_executable(old)


def check_interface(name: str) -> None:
    """Refuse (UsageError) a --interface that is not an interface of this host with an IPv4 address."""
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


def resolve_lazy_modules() -> int:
    """Load, in the calling thread, every module of sys.modules that is still a LazyLoader
    placeholder; returns how many there were (LazyLoader is not thread-safe before Python 3.12.3,
    CPython gh-114763)."""
    import importlib.util

    lazy = getattr(importlib.util, "_LazyModule", None)
    if lazy is None:
        return 0
    found = [m for m in list(sys.modules.values()) if type(m) is lazy]
    for m in found:
        with contextlib.suppress(Exception):
            getattr(m, "__file__", None)
    return len(found)


def open_client(spec: MergeSpec) -> tuple[Any, Any]:
    """Start (or attach to) the cluster and connect a client; returns (client, cluster), cluster
    None for an external one, else a :class:`LocalHandle`. Close both with :func:`close_all`.

    Raises:
        UsageError: an external scheduler whose address is malformed, whose file is missing, that cannot
            be reached or has no workers; a missing package.
        MachineError: the local cluster did not start within --timeout, or failed to start.
    """
    import dask
    from distributed import Client

    if spec.protocol == "ucx":
        try:
            import distributed_ucxx  # noqa: F401
        except Exception as e:
            raise UsageError(f"-p ucx needs distributed-ucxx, which cannot be imported ({type(e).__name__}: "
                             f"{(str(e).splitlines() or [''])[0][:80]})",
                             "pip install 'gpubench-cuda[ucx-cu13]' (or [ucx-cu12]); UCX-Py is discontinued") from None
    resolve_lazy_modules()  # in this thread, before any IO loop thread runs distributed's code
    client = cluster = None
    cfg = {"distributed.admin.low-level-log-length": TRANSFER_LOG_LENGTH}
    try:
        with dask.config.set(cfg), _quiet_ucx_env(spec), warnings.catch_warnings():
            if spec.external:
                where = spec.scheduler_address or spec.scheduler_file
                if spec.scheduler_address:
                    check_scheduler_address(spec.scheduler_address)
                else:
                    scheduler_file_address(spec.scheduler_file or "")  # distributed waits forever for a missing one
                try:
                    client = Client(spec.scheduler_address, scheduler_file=spec.scheduler_file,
                                    timeout=min(spec.timeout_s, 10))
                except (OSError, TimeoutError, ValueError) as e:
                    raise UsageError(f"cannot reach the scheduler at {where}: {error_line(e)}",
                                     "check the address (e.g. tcp://HOST:8786) and that it runs") from None
                try:
                    client.wait_for_workers(1, timeout=min(spec.timeout_s, 60))
                except (OSError, TimeoutError) as e:
                    raise UsageError(f"the scheduler at {where} has no workers ({error_line(e)})") from None
            else:
                # -p ucx: a Ctrl-C or SIGTERM waits for the start and the client's connection
                with holding_signals() if spec.protocol == "ucx" else contextlib.nullcontext():
                    cluster = _start_local_cluster(spec)
                    try:
                        client = Client(cluster.scheduler_address, loop=cluster.loop,
                                        timeout=min(spec.timeout_s, 60))
                    except (OSError, TimeoutError) as e:
                        raise MachineError(f"cannot connect to the local cluster's scheduler: "
                                           f"{error_line(e)[:160]}") from None
    except BaseException:
        stopped = close_all(client, cluster)
        if stopped is not None:
            raise stopped from None
        raise
    return client, cluster


def _spawned_children(before: frozenset = frozenset()) -> list:
    """This process's multiprocessing-spawned descendants not in ``before`` (pids), not the resource tracker."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if p.pid not in before and "spawn_main" in cmd and "resource_tracker" not in cmd:
            out.append(p)
    return out


def kill_leftovers(before: frozenset) -> int:
    """SIGTERM, then after KILL_GRACE_S SIGKILL, every worker process this process spawned since
    ``before`` (pids) that is still there; returns how many there were."""
    import psutil

    procs = _spawned_children(before)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _gone, alive = psutil.wait_procs(procs, timeout=KILL_GRACE_S)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=KILL_GRACE_S)
    return len(procs)


class LocalHandle:
    """A local cluster (asynchronous) started on gpubench's own IO loop thread (``loop``)."""

    def __init__(self, cluster, runner, before: frozenset):
        self.cluster = cluster
        self.runner = runner
        self.loop = runner.loop
        self.before = before
        self.scheduler_address = cluster.scheduler_address if cluster is not None else None
        self._closed = False

    def close(self, timeout: float = CLOSE_TIMEOUT_S, settle_s: float = 0.0) -> None:
        """Close the cluster within ``timeout`` seconds, kill any worker process it left, stop the
        loop, then (``settle_s`` > 0) sweep again, up to three times."""
        from distributed.utils import sync

        if self._closed:
            return
        quiet_closing_logs()
        try:
            if self.cluster is not None:
                with contextlib.suppress(Exception):
                    sync(self.loop, self.cluster.close, timeout, callback_timeout=timeout + 1)
        finally:
            self._closed = True
            quiet_closing_logs()  # again: the close put distributed's own level back
            kill_leftovers(self.before)
            with contextlib.suppress(Exception):
                self.runner.stop(timeout=2)
            for _ in range(3 if settle_s > 0 else 0):  # bounded: the stopped loop spawns no more
                time.sleep(settle_s)
                if not kill_leftovers(self.before):
                    break


UCX_QUIET_LEVEL = "CRITICAL"
WORKER_PRELOAD = "gpubench.plugins.merge.worker_setup"


def worker_preload() -> list[str]:
    """dask's ``distributed.worker.preload`` for gpubench's own workers, with its worker setup added."""
    import dask

    configured = dask.config.get("distributed.worker.preload", []) or []
    configured = [configured] if isinstance(configured, str) else list(configured)
    return configured if WORKER_PRELOAD in configured else [*configured, WORKER_PRELOAD]


def quiet_closing_logs() -> None:
    """Raise this process's UCXX logger (unless the user set UCXPY_LOG_LEVEL), distributed's and
    tornado's callback logger to CRITICAL."""
    if "UCXPY_LOG_LEVEL" not in os.environ:
        logging.getLogger("ucx").setLevel(UCX_QUIET_LEVEL)
    for name in ("distributed", "distributed_ucxx", "tornado.application"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker with its standard error on /dev/null (its leaked
    semaphore notes of killed workers are not about the measurement)."""
    from multiprocessing import resource_tracker

    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)  # the tracker inherits this process's fd 2 when it is spawned
        resource_tracker.ensure_running()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _quiet_distributed_finalizers() -> None:
    """Drop the unraisable-exception tracebacks of distributed's and UCXX's objects; others go to
    the hook before."""
    previous = sys.unraisablehook
    if getattr(previous, "_gpubench_quiet_distributed", False):
        return

    def hook(u) -> None:
        mod = str(getattr(u.object, "__module__", None) or type(u.object).__module__)
        if mod.startswith(("distributed", "ucxx")):
            return
        previous(u)

    hook._gpubench_quiet_distributed = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def _start_local_cluster(spec: MergeSpec) -> LocalHandle:
    """A LocalCUDACluster (-t gpu, one worker per -d GPU) or a LocalCluster of worker processes
    (-t cpu, one per -d entry), started within --timeout on gpubench's own IO loop thread.

    Raises:
        UsageError: -t gpu without dask-cuda.
        MachineError: the cluster did not start (within --timeout).
    """
    import dask
    from distributed import LocalCluster
    from distributed.utils import LoopRunner, sync

    common = dict(
        n_workers=len(spec.devices), threads_per_worker=spec.threads_per_worker,
        protocol=spec.protocol, interface=spec.interface, dashboard_address=None,
        host=None if spec.interface else "127.0.0.1",
        scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
        silence_logs=logging.CRITICAL, asynchronous=True,
    )
    # dask-cuda's benchmark hides this one too: the pool is made after the start.
    warnings.filterwarnings("ignore", message=".*NVLink.*rmm_pool_size.*", category=UserWarning)
    if spec.merge_type == "gpu":
        try:
            from dask_cuda import LocalCUDACluster
        except Exception as e:
            raise UsageError(f"-t gpu needs dask-cuda, which cannot be imported "
                             f"({error_line(e)[:100]})",
                             "pip install 'gpubench-cuda[rapids-cu13]' (or [rapids-cu12]), or use -t cpu") from None
        make, own = LocalCUDACluster, dict(
            CUDA_VISIBLE_DEVICES=",".join(map(str, spec.devices)), device_memory_limit=None,
            enable_cudf_spill=spec.enable_cudf_spill, enable_tcp_over_ucx=spec.enable_tcp_over_ucx,
            enable_infiniband=spec.enable_infiniband, enable_nvlink=spec.enable_nvlink,
            enable_rdmacm=spec.enable_rdmacm)
    else:
        make, own = LocalCluster, dict(processes=True)

    before = frozenset(p.pid for p in _spawned_children())
    _quiet_resource_tracker()
    _quiet_distributed_finalizers()
    logging.getLogger("distributed_ucxx").setLevel(logging.CRITICAL)  # as silence_logs does distributed's
    runner = LoopRunner(asynchronous=False)
    runner.start()
    # what the loop's tasks leave unhandled follows from a stop gpubench made and reports itself
    runner.loop.asyncio_loop.set_exception_handler(lambda loop, context: None)
    box: list = []

    async def start():
        # dask's own worker environment and preloads, with UCXPY_LOG_LEVEL and the worker setup added
        environ = {"UCXPY_LOG_LEVEL": UCX_QUIET_LEVEL, **(dask.config.get("distributed.nanny.environ", {}) or {})}
        with dask.config.set({"distributed.nanny.environ": environ,  # the Nannies start in the await
                              "distributed.worker.preload": worker_preload()}):
            cluster = make(**common, **own)  # on the loop's thread, so the constructor starts nothing itself
            box.append(cluster)
            return await cluster

    try:
        with _workers_ignore_sigint():
            if spec.protocol == "ucx":
                _start_holding_signals(runner.loop, start, spec.timeout_s)
            else:
                sync(runner.loop, start, callback_timeout=spec.timeout_s)
    except BaseException as e:
        LocalHandle(box[0] if box else None, runner, before).close(
            timeout=FAILED_START_CLOSE_S, settle_s=FAILED_START_SETTLE_S)
        if isinstance(e, (KeyboardInterrupt, Interrupted, UsageError)):
            raise
        if isinstance(e, TimeoutError):  # asyncio's is the builtin one on Python >= 3.11
            raise MachineError(f"the {spec.merge_type} cluster over {spec.protocol} did not start within "
                               f"--timeout {spec.timeout_s:g} s", "raise --timeout; the host may be busy") from None
        raise MachineError(f"the {spec.merge_type} cluster over {spec.protocol} did not start: "
                           f"{error_line(e)[:160]}") from None
    quiet_closing_logs()
    return LocalHandle(box[0], runner, before)


@contextlib.contextmanager
def holding_signals() -> Iterator[None]:
    """``with CRITICAL:``, and an error raised inside once a signal was noted becomes that
    signal's exception (the user's stop, exit 130 / 143, not a machine fault)."""
    try:
        with CRITICAL:
            yield
    except Exception:
        raise_if_signalled()
        raise


UCX_START_GRACE_S = 20.0  # the longest a -p ucx start may go on after a Ctrl-C or SIGTERM


def _start_holding_signals(loop, start, timeout_s: float, grace_s: float = UCX_START_GRACE_S) -> None:
    """Run the coroutine function ``start`` on ``loop`` to its end, within ``timeout_s``; a signal
    noted meanwhile is raised here only when the start is still going ``grace_s`` after it (a UCXX
    cluster closed while it starts can crash this process with SIGSEGV).

    Raises:
        TimeoutError: ``timeout_s`` passed.
        KeyboardInterrupt, Interrupted: the signal noted ``grace_s`` before, with the start not done.
    """
    import asyncio
    import concurrent.futures

    fut = asyncio.run_coroutine_threadsafe(start(), loop.asyncio_loop)
    deadline = time.monotonic() + timeout_s
    signalled_at = None
    while True:
        with contextlib.suppress(concurrent.futures.TimeoutError):
            fut.result(timeout=0.1)
            return
        now = time.monotonic()
        if signalled_at is None and signal_noted():
            signalled_at = now
            err_line(f"gpubench: stopping once the ucx cluster has started (at most {grace_s:g} s: "
                     f"UCXX crashes when a start is cut short)")
        if now > deadline or (signalled_at is not None and now - signalled_at > grace_s):
            fut.cancel()
            if now > deadline:
                raise TimeoutError(f"the start took longer than {timeout_s:g} s")
            raise_if_signalled()  # signalled_at is set once a signal is noted, and noted ones stay


def close_all(client, cluster) -> KeyboardInterrupt | Interrupted | None:
    """Close the client, then the cluster, even when a Ctrl-C or SIGTERM lands in the middle (the
    interrupted close is tried once more; other errors of a close are ignored); returns the first
    interrupt that landed while closing, or None."""
    pending: KeyboardInterrupt | Interrupted | None = None
    if cluster is not None:
        quiet_closing_logs()
    for obj, timeout in ((client, CLIENT_CLOSE_TIMEOUT_S), (cluster, CLOSE_TIMEOUT_S)):
        if obj is None:
            continue
        for _attempt in range(2):
            try:
                obj.close(timeout=timeout)
                break
            except (KeyboardInterrupt, Interrupted) as e:
                pending = pending or e
            except Exception:
                break
    return pending


def rmm_setup(client, spec: MergeSpec, workers: Mapping[str, int]) -> str:
    """Set up RMM on the workers and the scheduler as dask-cuda's setup_memory_pools does; returns
    what was set up, e.g. "pool 4000000000", or why nothing was.

    Raises:
        UsageError: the pool did not fit on a worker's GPU.
        MachineError: the setup failed on a worker, or on the scheduler of a local cluster.
    """
    if spec.external and any(run_on_workers(client, _has_rmm_plugin, workers, "looking for RMMSetup",
                                            timeout_s=spec.timeout_s).values()):
        return "already set up on the external cluster (RMMSetup plugin); pool options not applied"
    pool = spec.rmm_pool_bytes if spec.rmm_pool_bytes is not None else spec.rmm_pool_fraction
    kw: dict[str, Any] = dict(pool_size=pool, disable_rmm_pool=spec.disable_rmm_pool, rmm_async=spec.rmm_async)
    try:
        descs = run_on_workers(client, _setup_rmm, workers, "RMM setup", timeout_s=spec.timeout_s, **kw)
    except MachineError as e:
        if any(w in e.message.lower() for w in ("out of memory", "out_of_memory", "bad_alloc", "memoryerror")):
            raise UsageError(f"the RMM pool did not fit on a worker's GPU: {e.message[:200]}",
                             "use a smaller --rmm-pool-size") from None
        raise
    # dask-cuda also makes a 1 GB pool in the scheduler (for a local cluster, this process)
    try:
        client.run_on_scheduler(_setup_rmm, **{**kw, "pool_size": None if (spec.rmm_async or spec.disable_rmm_pool)
                                               else SCHEDULER_POOL_BYTES})
        sched = ""
    except Exception as e:
        if not spec.external:
            raise MachineError(f"RMM setup on the scheduler failed: {error_line(e)[:200]}") from None
        sched = f"; scheduler: not set up ({error_line(e)[:80]})"
    return "; ".join(sorted(set(descs.values()))) + sched

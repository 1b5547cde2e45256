"""``gpubench nccl`` under a launcher (mpirun, srun, torchrun): one process per GPU, or -g N GPUs
per process, as nccl-tests' all_reduce_perf under MPI. After each point every rank's per-sample
times go to rank 0, which combines them with nccl-tests' -a rule and keeps every rank's figures in
``extra.per_rank``.
"""

from __future__ import annotations

import contextlib
import os
import statistics
from typing import Iterator

from gpubench.plugins.nccl import bench as N
from gpubench.plugins.nccl import launch as L
from gpubench.plugins.nccl import log as nccl_log
from gpubench.plugins.nccl.comm import abort, make_barrier, nccl_env, nccl_module
from gpubench.core import benchmark as driver
from gpubench.core import gpu
from gpubench.launch import ranks as R
from gpubench.core.benchmark import Context
from gpubench.core.errors import MachineError, UsageError, first_line
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result

AVERAGES = {0: "rank 0", 1: "mean", 2: "minimum", 3: "maximum"}
ROLL_CALL_S = 5.0  # after a fault, how long the ranks wait for each other to learn who is missing
DEFAULT_GROUP_TIMEOUT_S = 300.0  # the group's deadline when -T is 0 (never): the gathers still end


def slowest(per_rank: list[dict]) -> dict | None:
    """The rank with the longest median time among ``per_rank`` entries, with ``above_median``: its
    time / the median rank's time - 1. None when fewer than two ranks have a time."""
    timed = [p for p in per_rank if p.get("time_s")]
    if len(timed) < 2:
        return None
    worst = max(timed, key=lambda p: p["time_s"])
    med = statistics.median(p["time_s"] for p in timed)
    return {**worst, "above_median": worst["time_s"] / med - 1 if med else 0.0}


def gpu_identity(device: int) -> dict:
    """{"device", "uuid" (GPU-xxxxxxxx-...), "pci_bus_id" (0000:1b:00.0), "name"} of a CUDA ordinal."""
    import cupy

    out: dict = {"device": device, "uuid": None, "pci_bus_id": None, "name": None}
    with contextlib.suppress(Exception):
        props = cupy.cuda.runtime.getDeviceProperties(device)
        out["name"] = props.get("name", b"").decode(errors="replace") if isinstance(props.get("name"), bytes) else props.get("name")
        out["uuid"] = _uuid_text(props.get("uuid"))
        out["pci_bus_id"] = (f"{props.get('pciDomainID', 0):04x}:{props.get('pciBusID', 0):02x}:"
                             f"{props.get('pciDeviceID', 0):02x}.0")
    if out["uuid"] is None and out["pci_bus_id"]:  # NVML knows the GPU at that PCI address
        with contextlib.suppress(Exception):
            import pynvml as nv

            nv.nvmlInit()
            got = nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByPciBusId(out["pci_bus_id"]))
            out["uuid"] = _uuid_text(got.decode() if isinstance(got, bytes) else got)
    return out


def _uuid_text(u) -> str | None:
    """A GPU UUID as NVML writes it (GPU-xxxxxxxx-xxxx-...) from 16 bytes or a text form; None otherwise."""
    if isinstance(u, (bytes, bytearray)) and len(u) == 16:
        h = bytes(u).hex()
    elif isinstance(u, str):
        h = u.strip().removeprefix("GPU-").replace("-", "").lower()
        if len(h) != 32 or any(c not in "0123456789abcdef" for c in h):
            return None
    else:
        return None
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def uid_to_wire(uid) -> dict:
    """NCCL's unique id (CuPy's get_unique_id: 128 bytes, or a tuple of ints in older CuPy) as JSON."""
    if isinstance(uid, (bytes, bytearray)):
        return {"bytes": list(uid)}
    return {"ints": [int(x) for x in uid]}


def uid_from_wire(d: dict):
    """The inverse of :func:`uid_to_wire`: the id in the type NcclCommunicator takes."""
    return bytes(d["bytes"]) if "bytes" in d else tuple(d["ints"])


class NcclRanks(N.Nccl):
    """The nccl plug-in on one rank of a launched job; the group is the job's."""

    def __init__(self, group: R.Group, log: nccl_log.Capture):
        self.group = group
        self.log = log

    def devices(self, spec: N.NcclSpec) -> tuple[int, ...]:
        """-d, or the local rank's GPUs: local_rank x g .. local_rank x g + g - 1.

        Raises:
            UsageError: the node's ranks need more GPUs than are visible, a GPU of -d that is not
                visible, a root that is not a rank.
        """
        me = self.group.me
        g = len(spec.devices) if spec.devices is not None else spec.gpus_per_proc or 1
        if spec.devices is not None:
            devs = gpu.resolve_devices(spec.devices)
        else:
            visible = gpu.device_count()
            # every rank of the node sees the same shortfall, so each one refuses at once
            local = me.local_size if me.local_size is not None else me.local_rank + 1
            if local * g > visible:
                raise UsageError(f"{local} ranks on {me.host} with {g} GPU(s) each need GPUs "
                                 f"0..{local * g - 1}, but {visible} are visible",
                                 "start at most as many ranks per node as GPUs / -g, or pick GPUs with -d")
            devs = tuple(range(me.local_rank * g, me.local_rank * g + g))
        N._check_root(spec, self.group.size * g)
        return devs

    @contextlib.contextmanager
    def setup(self, ctx: Context) -> Iterator[Context]:
        """The unique id (rank 0's, broadcast; or NCCL_COMM_ID's), one communicator per local GPU,
        each GPU's stream and buffers, the NCCL barrier; the every-rank table in ctx.env["ranks"].

        Raises:
            MachineError: NCCL init failed, or a rank did not answer the broadcast.
        """
        nccl = nccl_module()
        group = self.group
        g = len(ctx.devices)
        nranks = group.size * g
        ctx.env["nccl"] = nccl_env(nccl)
        if self.log.path is not None:  # the two variables gpubench set for its log are not the user's
            for k in ("NCCL_DEBUG", "NCCL_DEBUG_FILE"):
                ctx.env["nccl"]["env"].pop(k, None)
        ids = [gpu_identity(d) for d in ctx.devices]
        table = group.allgather({"rank": group.rank, "host": group.me.host, "local_rank": group.me.local_rank,
                                 "node": group.me.node, "pid": os.getpid(), "gpus": ids})
        if any(len(t["gpus"]) != g for t in table):
            raise UsageError("the ranks drive different numbers of GPUs (-g / -d)", "give every rank the same -g")
        ctx.env["ranks"] = table
        ctx.env["nodes"] = len(group.hosts)
        ctx.env["launch"] = {"launcher": group.me.launcher, "transport": group.transport, "processes": group.size,
                             "gpus_per_proc": g, "nranks": nranks, "nodes": len(group.hosts),
                             "bootstrap": "NCCL_COMM_ID" if os.environ.get("NCCL_COMM_ID") else "unique id broadcast"}
        if os.environ.get("NCCL_COMM_ID"):
            uid = nccl.get_unique_id()  # NCCL's own bootstrap: the id is the address, the same on every rank
        else:
            uid = uid_from_wire(group.bcast(uid_to_wire(nccl.get_unique_id()) if group.rank == 0 else None))
        comms = []
        try:
            import cupy

            nccl.groupStart()
            try:
                for i, d in enumerate(ctx.devices):
                    with cupy.cuda.Device(d):
                        comms.append(nccl.NcclCommunicator(nranks, uid, group.rank * g + i))
            finally:
                nccl.groupEnd()
        except Exception as e:
            raise MachineError(f"ncclCommInitRank on rank {group.rank} ({group.me.host}) failed: "
                               f"{first_line(e)}") from None
        ctx.data["nranks"] = nranks
        with N.local_ranks(ctx, comms, group.rank * g) as ranks:
            with N._as_machine_errors(allocation_passes=False):
                ctx.data["barrier"] = make_barrier(ranks, ctx.spec.timeout_s)
            yield ctx

    def _fault(self, ctx: Context, e: MachineError) -> MachineError:
        """After a fault on this rank: abort, then a roll call names the missing ranks."""
        abort(ctx.data.get("ranks") or [])
        ctx.data["faulted"] = True
        try:
            self.group.allgather({"fault": e.message}, timeout=ROLL_CALL_S)
        except MachineError as roll:
            return MachineError(f"{e.message}; {roll.message}", "the other ranks aborted their communicators")
        return e

    def measure(self, ctx: Context, point: driver.Point) -> list[Record]:
        """One (size, placement) on every rank at once; rank 0 gathers and combines the samples (-a)."""
        size, place = point.key
        ranks = ctx.data["ranks"]
        spec = ctx.spec
        try:
            with N._as_machine_errors():
                p = N.measure_point(spec, ranks, ctx.data["nranks"], ctx.data["barrier"], size, place,
                                    ctx.data["graphs"].new)
        except BaseException as e:  # nothing is freed under queued work
            L.drain(ranks, spec.timeout_s)
            if isinstance(e, MachineError):
                raise self._fault(ctx, e) from None
            raise
        mine = {"samples_s": p.samples_s, "wrong": p.wrong, "error": p.error}
        got = self.group.gather(mine)
        if got is None:  # not rank 0: its own figures, not shown
            return N.to_records(spec, [p], ctx.data["nranks"])
        rec = N.to_records(spec, [N.combined_point(p.nbytes, p.count, p.place, got, spec.average)],
                           ctx.data["nranks"])[0]
        rec.extra["per_rank"] = [{"rank": r, "host": t["host"], "gpus": t["gpus"], "samples_s": x["samples_s"],
                                  "time_s": statistics.median(x["samples_s"]) if x["samples_s"] else None,
                                  "wrong": x["wrong"]} for r, (x, t) in enumerate(zip(got, ctx.env["ranks"]))]
        rec.extra["average"] = AVERAGES[spec.average]
        return [rec]

    def derive(self, ctx: Context, records: list[Record]) -> None:
        """Every rank's NCCL INFO log, parsed and gathered: ctx.env["nccl_log"] on rank 0."""
        mine = self.log.read()
        try:
            got = self.group.gather(mine.to_dict() if mine else None,
                                    timeout=ROLL_CALL_S if ctx.data.get("faulted") else None)
        except MachineError:
            got = None
        if got is not None:
            ctx.env["nccl_log"] = {"per_rank": got, "captured": self.log.reason is None, "reason": self.log.reason,
                                   "summary": nccl_log.summary_line(got, ctx.data.get("nranks") or len(got))}

    def spec_dict(self, ctx: Context) -> dict:
        return ctx.spec.to_dict(devices=list(ctx.devices), nranks=ctx.data.get("nranks", len(ctx.devices)),
                                processes=self.group.size)

    def timing(self, ctx: Context) -> dict:
        t = N._timing(ctx.spec, ctx.data.get("allocator"))
        t["method"] = t["method"].replace("averaged over processes",
                                          f"combined over processes by -a {ctx.spec.average} ({AVERAGES[ctx.spec.average]})")
        return t


def run_ranks(spec: N.NcclSpec, progress: ProgressSink | None = None) -> Result:
    """This rank's part of a launched run: the Result, on rank 0 with the combined records.

    Raises:
        UsageError: bad launcher variables, no GPU for this local rank, no way to reach rank 0.
        MachineError: a rank died or hung (named), an NCCL or CUDA fault; partial_result as the driver sets.
    """
    log = nccl_log.capture()  # before NCCL's first call in this process
    me = R.discover()
    timeout = spec.timeout_s or DEFAULT_GROUP_TIMEOUT_S
    group = R.join(me, spec.rendezvous, timeout=timeout)
    try:
        result = driver.run(NcclRanks(group, log), spec, progress)
        group.barrier()
        return result
    finally:
        group.close()
        log.remove()

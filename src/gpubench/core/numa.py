"""NUMA placement of host memory (docs/conditions.md): bind the measuring thread to the GPU's CPUs
before host buffers are allocated and touched, as nvbandwidth does (``nvmlDeviceSetCpuAffinity``
before each ``cuMemHostAlloc``, memcpy.cpp ``HostBuffer::HostBuffer``), with ``os.sched_setaffinity``,
and record where the buffers' pages really are (``move_pages(2)`` with ``nodes`` = NULL, through
``syscall`` with ctypes). Topology comes from /sys/devices/system/node.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import os
import platform
import re
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from gpubench.core import safe
from gpubench.core.errors import UsageError
from gpubench.core.options import ASCII_SPACE

NODE_ROOT = "/sys/devices/system/node"
MAX_PAGES_CHECKED = 256
# move_pages syscall numbers (Linux: arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/unistd.h)
SYS_MOVE_PAGES = {"x86_64": 279, "aarch64": 239, "ppc64le": 301}
POLICIES = ("auto", "none", "all")


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format). Raises ValueError: not a cpulist."""
    out: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            lo, hi = int(a), int(b)
            if hi < lo:
                raise ValueError(f"bad cpulist range {part!r}")
            out.extend(range(lo, hi + 1))
        else:
            out.append(int(part))
    return sorted(set(out))


def format_cpulist(cpus: Sequence[int]) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8'."""
    parts = []
    for _, run in itertools.groupby(enumerate(sorted(set(cpus))), lambda t: t[1] - t[0]):  # consecutive CPUs
        first, *rest = [c for _, c in run]
        parts.append(f"{first}-{rest[-1]}" if rest else str(first))
    return ",".join(parts)


def read_text(path: str) -> str | None:
    """The text of file ``path`` stripped, None where it cannot be read."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def nodes(root: str = NODE_ROOT) -> dict[int, list[int]]:
    """{node: its CPUs} for every node under ``root`` (nodes without CPUs map to [])."""
    out: dict[int, list[int]] = {}
    try:
        names = os.listdir(root)
    except OSError:
        return out
    for name in names:
        if name.startswith("node") and name[4:].isdigit():
            try:
                out[int(name[4:])] = parse_cpulist(read_text(f"{root}/{name}/cpulist") or "")
            except ValueError:
                out[int(name[4:])] = []
    return dict(sorted(out.items()))


_NODE_TEXT = re.compile(r"[0-9]{1,9}")  # ASCII digits, no sign ("-0" is no node); MAX_NUMNODES is at most 1024


def parse_policy(text: str | int | None, root: str = NODE_ROOT) -> str | int:
    """``--numa`` -> "auto", "none", "all" or a node number checked against ``root``. Raises UsageError: not one of
    those, or a node this machine does not have or that has no CPUs."""
    if text is None:
        return "auto"
    t = str(text).strip(ASCII_SPACE).lower()  # as every value: ASCII spaces around it dropped
    if t in POLICIES:
        return t
    if not _NODE_TEXT.fullmatch(t):  # int() also takes "٠", "０", "0_0", "+0" and "-0": not node numbers as sysfs writes them
        raise UsageError(f"--numa {safe.term(repr(text), 80)} is not a NUMA node, none, all or auto",
                         "e.g. --numa 0, --numa none, --numa all")
    node = int(t)
    have = nodes(root)
    if node not in have:
        raise UsageError(f"--numa {node}: this machine has no NUMA node {node}",
                         f"nodes here: {', '.join(map(str, have)) or 'none found'}")
    if not have[node]:
        raise UsageError(f"--numa {node}: node {node} has no CPUs (a memory-only node)",
                         f"nodes with CPUs: {', '.join(str(n) for n, c in have.items() if c)}")
    return node


@dataclass(frozen=True)
class Binding:
    """Where the measuring thread runs for a pass of the points: the node (or None), the CPUs of the
    mask set (None: left as it is), how they were chosen, and with ``--numa all`` the node written
    into each record's params as ``numa_node``."""

    node: int | None
    cpus: tuple[int, ...] | None
    reason: str
    tag: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "cpus": format_cpulist(self.cpus) if self.cpus else None, "reason": self.reason}


def allowed_cpus() -> list[int]:
    """The CPUs this thread may run on now."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return []


def _use_it_with() -> str:
    """The hint of a --numa that does not apply: the commands whose plug-ins allocate host buffers."""
    from gpubench.core import registry

    names = [p.name for p in registry.plugins().values() if p.host_memory]
    listed = ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else "".join(names) or "a host-memory command"
    return f"leave --numa out, or use it with {listed}"


def check_applies(policy: str | int, name: str, *, host_memory: bool, binds: bool) -> None:
    """Refuse, before the GPU check, a ``--numa`` the run could not honour: "all" without host buffers, a node or "all"
    where the work runs in other processes (``binds`` False: Dask workers). Raises UsageError: as above."""
    if policy in ("auto", "none"):
        return
    if not binds:
        raise UsageError(f"--numa {policy}: {name} runs its work in Dask worker processes, which --numa does not "
                         "bind (a LocalCUDACluster binds each worker to its GPU's CPUs itself)",
                         _use_it_with())
    if policy == "all" and not host_memory:
        raise UsageError("--numa all measures host memory from each NUMA node; this command uses no host buffers",
                         _use_it_with())


def plan(policy: str | int, gpu: dict | None, host_memory: bool, root: str = NODE_ROOT) -> list[Binding]:
    """The bindings the driver runs the points under (one, or one per node for "all"); ``gpu``: the env entry of the
    run's first GPU, or None. "auto" takes the GPU's node's CPUs, else its ``local_cpulist``, each within the CPUs this
    process may use. Raises UsageError: "all" for a benchmark without host buffers."""
    have = nodes(root)
    allowed = set(allowed_cpus())

    def usable(cpus: list[int]) -> list[int]:  # those this process may use (all when unknown)
        return sorted(set(cpus) & allowed) if allowed else cpus

    if policy == "none":
        return [Binding(None, None, "--numa none: not bound")]
    if policy == "all":
        check_applies(policy, "", host_memory=host_memory, binds=True)
        out = [Binding(n, tuple(mine), f"--numa all: node {n}", tag=n)
               for n, cpus in have.items() if (mine := usable(cpus))]
        return out or [Binding(None, None, "--numa all: no node with usable CPUs found; not bound")]
    if isinstance(policy, int):
        mine = usable(have.get(policy, []))
        if not mine:
            raise UsageError(f"--numa {policy}: none of node {policy}'s CPUs may be used by this process",
                             f"allowed CPUs: {format_cpulist(sorted(allowed))}")
        return [Binding(policy, tuple(mine), f"--numa {policy}")]
    # auto
    if gpu is None:
        return [Binding(None, None, "auto: no GPU; not bound")]
    node = gpu.get("numa_node")
    if isinstance(node, int) and node >= 0 and have.get(node):
        mine = usable(have[node])
        if mine:
            return [Binding(node, tuple(mine), f"auto: GPU {gpu.get('index')}'s NUMA node {node}")]
    local = gpu.get("cpu_affinity")
    if local:
        try:
            cpus = parse_cpulist(local)
        except ValueError:
            cpus = []
        mine = usable(cpus)
        if mine:
            only = next(iter(have)) if len(have) == 1 else None
            return [Binding(only, tuple(mine), f"auto: GPU {gpu.get('index')}'s local CPUs (its NUMA node is "
                                               f"{'unknown' if node in (None, -1) else node})")]
    return [Binding(None, None, f"auto: GPU {gpu.get('index')}'s NUMA node and local CPUs unknown; not bound")]


@contextlib.contextmanager
def bound(b: Binding) -> Iterator[Binding]:
    """Set this thread's CPU mask to ``b.cpus`` while the block runs, then restore it."""
    if not b.cpus:
        yield b
        return
    before = allowed_cpus()
    os.sched_setaffinity(0, b.cpus)
    try:
        yield b
    finally:
        if before:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, before)


@functools.cache
def _syscall():
    return ctypes.CDLL(None, use_errno=True).syscall


def page_nodes(ptr: int, nbytes: int, max_pages: int = MAX_PAGES_CHECKED) -> dict[str, Any]:
    """Where the pages of [ptr, ptr + nbytes) are, through move_pages(2) with nodes = NULL: {"pages":
    {"0": 256}, "pages_checked": 256 (evenly spread, at most ``max_pages``), "not_present": 0
    (-ENOENT), "error": None}."""
    out: dict[str, Any] = {"pages": {}, "pages_checked": 0, "not_present": 0, "error": None}
    nr = SYS_MOVE_PAGES.get(platform.machine())
    if nr is None or nbytes <= 0 or not ptr:
        out["error"] = "move_pages not available here" if nr is None else "empty buffer"
        return out
    ps = os.sysconf("SC_PAGE_SIZE")
    first = ptr - ptr % ps
    npages = (ptr + nbytes - first + ps - 1) // ps
    k = min(npages, max_pages)
    idx = sorted({(i * (npages - 1)) // max(1, k - 1) for i in range(k)}) if k > 1 else [0]
    pages = (ctypes.c_void_p * len(idx))(*[first + i * ps for i in idx])
    status = (ctypes.c_int * len(idx))()
    rc = _syscall()(ctypes.c_long(nr), ctypes.c_long(0), ctypes.c_ulong(len(idx)), pages, None, status,
                    ctypes.c_int(0))
    if rc != 0:
        out["error"] = f"move_pages failed: {os.strerror(ctypes.get_errno())}"
        return out
    out["pages_checked"] = len(idx)
    for s in status:
        if s >= 0:
            out["pages"][str(s)] = out["pages"].get(str(s), 0) + 1
        elif s == -2:  # ENOENT: not present
            out["not_present"] += 1
    return out


class PlacementLog:
    """The host buffers seen during one point and where their pages were."""

    def __init__(self):
        self.live: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self.seen: list[dict[str, Any]] = []

    def note(self, buf) -> None:
        """Read ``buf``'s pages now (before it is freed) and keep them."""
        ptr, nbytes = getattr(buf, "ptr", 0), getattr(buf, "nbytes", 0)
        if ptr and nbytes:
            self.seen.append({"kind": getattr(buf, "kind", None), "nbytes": nbytes, **page_nodes(ptr, nbytes)})
            self.live.discard(buf)

    def take(self) -> dict[str, Any] | None:
        """The point's placement (buffers still alive are read now), and start over; None when no
        host buffer was seen. Shape: {"buffers", "pages": {node: n}, "pages_checked", "not_present",
        "kinds": [...]}."""
        for b in list(self.live):
            self.note(b)
        seen, self.seen = self.seen, []
        if not seen:
            return None
        pages: Counter[str] = sum((Counter(s["pages"]) for s in seen), Counter())
        errors = sorted({s["error"] for s in seen if s["error"]})
        return {"buffers": len(seen), "pages": dict(sorted(pages.items())),
                "pages_checked": sum(s["pages_checked"] for s in seen),
                "not_present": sum(s["not_present"] for s in seen),
                "kinds": sorted({s["kind"] for s in seen if s["kind"]}),
                **({"error": errors[0]} if errors else {})}


_ACTIVE: list[PlacementLog] = []  # the driver's log while a point runs (one at most)


@contextlib.contextmanager
def placement_log() -> Iterator[PlacementLog]:
    """Open a log that host buffers allocated while it is open report to (see :func:`track`)."""
    log = PlacementLog()
    _ACTIVE.append(log)
    try:
        yield log
    finally:
        _ACTIVE.remove(log)


def track(buf) -> None:
    """Called by a host buffer once allocated: remember it in the open log, if any."""
    if _ACTIVE:
        _ACTIVE[-1].live.add(buf)


def release(buf) -> None:
    """Called by a host buffer before it is freed: read where its pages were, if a log is open."""
    if _ACTIVE and buf in _ACTIVE[-1].live:
        _ACTIVE[-1].note(buf)


def notes(records: Sequence[Any], env: dict) -> list[str]:
    """The report's NUMA lines: which node/CPUs the host side ran on where the machine has more than
    one node, and a warning where pages were found off the bound node."""
    info = env.get("numa") or {}
    out = []
    off = 0
    for r in records:
        h = (getattr(r, "extra", None) or {}).get("host_numa") or {}
        node = h.get("bound_node")
        if node is not None and any(int(n) != node and c for n, c in (h.get("pages") or {}).items()):
            off += 1
    if ((env.get("host") or {}).get("numa_nodes") or 1) > 1:
        bs = info.get("bindings") or []
        if bs:
            out.append("Host side bound to " + "; ".join(
                f"NUMA node {b['node']} (CPUs {b['cpus']})" if b.get("node") is not None else "no node"
                for b in bs) + f" ({info.get('policy')}).")
    if off:
        out.append(f"WARNING: {off} record(s) had host pages off the bound NUMA node (extra.host_numa in the JSON).")
    return out

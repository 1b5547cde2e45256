"""Dask scheduler addresses and files, checked before ``distributed.Client`` sees them (each mistake
is one line, exit 2), and waits on a running cluster that notice a lost worker or a failed task.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from typing import Mapping

from gpubench.core.errors import MachineError, UsageError, first_line

_HINT = "give the file written by `dask scheduler --scheduler-file`"


def scheduler_file_address(path: str) -> str:
    """The scheduler address written in the Dask scheduler file ``path``.

    Raises:
        UsageError: the file is missing, unreadable or over 256 MiB, is not JSON, or holds no
            "address" string.
    """
    from gpubench.core.result import read_bounded

    if not os.path.exists(path):
        raise UsageError(f"--scheduler-file {path!r} does not exist", _HINT)
    raw = read_bounded(path, "a Dask scheduler file")
    try:
        cfg = json.loads(raw)
    except ValueError:  # UnicodeDecodeError included
        cfg = None
    address = cfg.get("address") if isinstance(cfg, dict) else None
    if not isinstance(address, str) or not address:
        raise UsageError(f"--scheduler-file {path!r} is not a Dask scheduler file (no \"address\" in it)", _HINT)
    return address


_ADDRESS_HINT = "e.g. tcp://HOST:8786"


def check_cluster_options(address: str | None, path: str | None) -> None:
    """--scheduler-address / --scheduler-file as given, before anything is imported: not blank, and
    an address without control characters, at most 300 characters.

    Raises:
        UsageError: one line naming the option and the value (escaped) and what is accepted.
    """
    from gpubench.core import safe

    if address is not None:
        shown = safe.term(repr(address), 80)
        if not address.strip():
            raise UsageError(f"--scheduler-address {shown} is empty", _ADDRESS_HINT + ", or leave it out for a local cluster")
        if len(address) > 300 or any(ord(c) < 0x21 or ord(c) == 0x7F for c in address):
            raise UsageError(f"--scheduler-address {shown} is not an address (spaces, control characters or over "
                             "300 characters)", _ADDRESS_HINT)
    if path is not None and not path.strip():
        raise UsageError(f"--scheduler-file {path!r} is empty", _HINT + ", or leave it out for a local cluster")


def check_scheduler_address(address: str) -> None:
    """Check that ``address`` (tcp://HOST:PORT, ucx://HOST:PORT, HOST:PORT) names a host and port.

    Raises:
        UsageError: a malformed address, or a port out of range.
    """
    from distributed.comm import get_address_host_port

    check_cluster_options(address, None)
    try:
        host, port = get_address_host_port(address)
    except ValueError as e:
        raise UsageError(f"--scheduler-address {address!r} is not an address ({first_line(e)[:100]})",
                         _ADDRESS_HINT) from None
    if not str(host).strip("[]"):  # tcp://:8786 has no host: the connect waited out its timeout
        raise UsageError(f"--scheduler-address {address!r} names no host", _ADDRESS_HINT)
    if not 0 < port < 65536:
        raise UsageError(f"--scheduler-address {address!r}: port {port} out of range", _ADDRESS_HINT)


# -- Watching a running cluster (merge, nccl across Dask workers) ------------------------------

POLL_S = 0.5  # how often a wait on the cluster checks that every worker is still there


def error_line(e: BaseException) -> str:
    """``"TypeName: first line of the message"`` (or the type alone) for a one-line error."""
    s = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {s}" if s else type(e).__name__


IDENTITY_TIMEOUT_S = 30  # one query of the scheduler's worker list
CONFIRM_S = 1.0  # a worker missing from the list is looked for again after this long before it is called lost


@functools.lru_cache(maxsize=1)
def _identity_lists_every_worker() -> dict:
    """The keyword of Scheduler.identity that asks for every worker (dask/distributed#9045)."""
    import inspect

    try:
        from distributed import Scheduler

        return {"n_workers": -1} if "n_workers" in inspect.signature(Scheduler.identity).parameters else {}
    except (ImportError, TypeError, ValueError):
        return {"n_workers": -1}


def _worker_addresses(client, timeout_s: float = IDENTITY_TIMEOUT_S) -> set[str]:
    """The addresses of the workers the scheduler knows now, asked of the scheduler itself.

    Raises:
        MachineError: the scheduler did not answer within ``timeout_s`` or the connection failed.
    """
    try:
        info = client.sync(client.scheduler.identity, **_identity_lists_every_worker(), callback_timeout=timeout_s)
    except (OSError, TimeoutError) as e:
        raise MachineError(f"the scheduler did not answer within {timeout_s:g} s ({error_line(e)[:120]})",
                           "the host may be overloaded, or the scheduler went away") from None
    return set(info.get("workers", {}))


def check_workers(client, workers: Mapping[str, int], what: str) -> None:
    """Raise a MachineError naming every worker of ``workers`` that is no longer in the cluster
    (looked for once more, CONFIRM_S later)."""
    now = _worker_addresses(client)
    lost = set(workers) - now
    if lost:
        time.sleep(CONFIRM_S)
        now = _worker_addresses(client)
        lost = set(workers) - now
    if lost:
        names = ", ".join(f"worker {workers.get(a, '?')} ({a})" for a in sorted(lost, key=lambda a: workers.get(a, 0)))
        new = sorted(now - set(workers))
        tail = f"; replaced by {', '.join(new)}" if new else ""
        raise MachineError(f"{names} died during {what}{tail}",
                           "the run was stopped; the worker's log or dmesg may say why, e.g. an out-of-memory kill")


RUN_TIMEOUT_S = 60  # the longest one function run on every worker (client.run) may take


@contextlib.contextmanager
def _named_failures(client, workers: Mapping[str, int], what: str, late: str, hint: str, where: str):
    """A time-out or failure inside becomes a MachineError naming a lost worker if one left, else
    ``what`` + ``late`` (with ``hint``) or the failure's first line."""
    try:
        yield
    except (KeyboardInterrupt, MachineError, UsageError):
        raise
    except TimeoutError:
        check_workers(client, workers, what)
        raise MachineError(f"{what}: {late}", hint) from None
    except Exception as e:
        check_workers(client, workers, what)
        raise MachineError(f"{what} failed on {where}: {error_line(e)[:200]}") from None


def run_on_workers(client, fn, workers: Mapping[str, int], what: str, timeout_s: float = RUN_TIMEOUT_S,
                   **kwargs) -> dict:
    """client.run(fn) on every worker, within ``timeout_s``.

    Raises:
        MachineError: a worker left (named), the function failed, or a worker did not answer in time.
    """
    with _named_failures(client, workers, what, f"a worker did not answer within {timeout_s:g} s",
                         "the host may be overloaded; a worker may be stuck", "the workers"):
        return client.run(fn, callback_timeout=timeout_s, **kwargs)


def wait_watching(client, collection, workers: Mapping[str, int], timeout_s: float, what: str,
                  hint: str = "raise --timeout or use a smaller -c", on_poll=None) -> float:
    """Wait for a persisted collection (or a list of futures) while checking every POLL_S that no
    worker left and no task failed; ``on_poll`` is called after each poll and may raise.

    Returns:
        time.perf_counter() when the wait returned, before the last check of the workers.

    Raises:
        MachineError: a worker left (names it), a task failed or was cancelled, or ``timeout_s`` ran out.
    """
    from distributed import futures_of, wait

    deadline = time.monotonic() + timeout_s
    futs = futures_of(collection)
    while True:
        try:
            wait(futs, timeout=POLL_S)
            done = True
        except TimeoutError:
            done = False
        finished_at = time.perf_counter()
        check_workers(client, workers, what)
        for f in futs:
            if f.status == "error":
                raise MachineError(f"{what} failed on the cluster: {error_line(f.exception())[:200]}")
            if f.status == "cancelled":
                raise MachineError(f"{what} was cancelled on the cluster (a worker or the scheduler went away)")
        if done:
            break
        if on_poll is not None:
            on_poll()
        if time.monotonic() > deadline:
            raise MachineError(f"{what} did not finish within --timeout {timeout_s:g} s", hint)
    return finished_at


def results_within(client, futs, workers: Mapping[str, int], timeout_s: float, what: str,
                   hint: str = "raise --timeout; a worker may be stuck") -> list:
    """The results of finished futures, in the order of ``futs``, fetched within ``timeout_s`` seconds in all.

    Raises:
        MachineError: a worker left (names it), a task failed, or the results did not come back in time.
    """
    deadline = time.monotonic() + timeout_s
    with _named_failures(client, workers, what, f"the results did not come back from the workers within {timeout_s:g} s",
                         hint, "the cluster"):
        return [f.result(timeout=max(deadline - time.monotonic(), 0.001)) for f in futs]


"""Processes for the rank tests: mpiexec (the MPICH wheel of the test extra), torchrun-style
environments started by hand, their output read line by line with the time of each, and the
clean-up that ends every process a test started. Needs psutil: a test module importing this one
first calls pytest.importorskip("psutil").
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

def mpiexec() -> str:
    """mpiexec beside this Python (the mpich wheel of the test extra), else on PATH; a skip with the
    reason outside CI when there is none or mpi4py does not import."""
    here = Path(sys.executable).with_name("mpiexec")
    exe = str(here) if here.exists() else shutil.which("mpiexec")
    why = None
    if exe is None:
        why = "no mpiexec (pip install '.[test]' brings the mpich wheel)"
    else:
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            why = "mpi4py does not import (pip install '.[test]')"
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return exe

def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMI", "SLURM_", "TORCHELASTIC", "MPI_LOCAL", "HYDRA"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env

def _free_port() -> int:
    """A TCP port free on 127.0.0.1 now, drawn below the kernel's ephemeral range (32768-60999 by
    default): a port handed to another process's connect() or bind(0) between this pick and the
    rank's own bind would be in use by then, and none of those is ever one of these. Drawn from
    the system's randomness: every xdist worker seeds `random` alike."""
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    pick = random.SystemRandom()
    for _ in range(200):
        port = pick.randint(20000, max(low, 20001) - 1)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port between 20000 and {low}")

def _alive(pids) -> list[int]:
    out = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


HOST = socket.gethostname()

class Lines:
    """A process's merged stdout/stderr read in a thread, each line with its monotonic time."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lines: list[tuple[float, str]] = []
        self._t = threading.Thread(target=self._pump, daemon=True)
        self._t.start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line))

    def wait_for(self, pattern: str, timeout: float = 120.0) -> float:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for t, line in list(self.lines):
                if re.search(pattern, line):
                    return t
            assert self.proc.poll() is None or self._t.is_alive(), self.text()
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r} within {timeout} s:\n{self.text()[-3000:]}")

    def first(self, pattern: str) -> float | None:
        return next((t for t, line in self.lines if re.search(pattern, line)), None)

    def text(self) -> str:
        self._t.join(5)
        return "".join(line for _, line in self.lines)

def _start(args: list[str], env: dict) -> subprocess.Popen:
    """``args`` in a session of its own, output piped, stdin empty: mpiexec forwards its stdin to
    rank 0, so an inherited one (pytest -s) changes how a stopped rank 0's job ends."""
    return subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)

def _mpi_ranks(top: int, n: int = 3, timeout: float = 60.0) -> dict[int, int]:
    """rank -> pid of the Python processes the launcher's daemon started under mpiexec ``top``: MPICH's
    hydra (PMI_RANK) or Open MPI's prterun/prted/orted (OMPI_COMM_WORLD_RANK). The net workers, also
    Python and with those variables in their environment, are children of the ranks, not of it."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = {}
        for c in psutil.Process(top).children(recursive=True):
            try:
                parent, env = c.parent().name(), c.environ()
                if "hydra" in parent and "PMI_RANK" in env:
                    got[int(env["PMI_RANK"])] = c.pid
                elif parent.startswith(("prte", "orted", "mpirun", "mpiexec")) and "OMPI_COMM_WORLD_RANK" in env:
                    got[int(env["OMPI_COMM_WORLD_RANK"])] = c.pid
            except psutil.Error:
                pass
        if len(got) == n:
            return got
        time.sleep(0.05)
    raise AssertionError("mpiexec did not start the ranks")

def _family(pids) -> list[int]:
    """``pids`` and every descendant alive now."""
    out = set(pids)
    for p in pids:
        try:
            out |= {c.pid for c in psutil.Process(p).children(recursive=True)}
        except psutil.Error:
            pass
    return sorted(out)

def _wait_gone(pids, timeout: float) -> list[int]:
    end = time.monotonic() + timeout
    while time.monotonic() < end and _alive(pids):
        time.sleep(0.1)
    return _alive(pids)

def _wait_all(procs, timeout: float) -> list[float | None]:
    """The monotonic time each of ``procs`` ended (None: still running after ``timeout``)."""
    end = time.monotonic() + timeout
    ended: list[float | None] = [None] * len(procs)
    while time.monotonic() < end and None in ended:
        for i, p in enumerate(procs):
            if ended[i] is None and p.poll() is not None:
                ended[i] = time.monotonic()
        time.sleep(0.05)
    return ended

def _cleanup(procs, stopped: int | None) -> None:
    if stopped is not None:
        for sig in (signal.SIGKILL, signal.SIGCONT):
            try:
                os.kill(stopped, sig)
            except ProcessLookupError:
                pass
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait(10)

def _torchrun_env(rank: int, port: int) -> dict:
    return _env(RANK=str(rank), WORLD_SIZE="3", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port))


GPUBENCH = [sys.executable, "-m", "gpubench"]

def _gpubench(args, env, timeout=60):
    """``python -m gpubench ARGS`` with ``env``, to its end."""
    return subprocess.run([*GPUBENCH, *args], env=env, capture_output=True, text=True, timeout=timeout)

def _runs_net_workers(pid: int) -> bool:
    """True once ``pid`` runs net's stream workers (its first test has begun)."""
    try:
        return any("net/worker.py" in " ".join(c.cmdline()) for c in psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return False

def _wait_test_running(pid: int, timeout: float = 90.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if _runs_net_workers(pid):
            return
        time.sleep(0.02)
    raise AssertionError("rank 0 never started its first test")

"""``gpubench net``'s data path, shared by the client and the server: connected TCP streams moved
by worker processes (:mod:`gpubench.plugins.net.worker`; why: docs/net.md "Data path"), their byte
counters in a shared memory file, their CPU time, and each socket's ``TCP_INFO``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import mmap
import os
import select
import socket
import struct
import subprocess
import sys
import tempfile
import time

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")

# Workers still running, killed at this process's exit (a stopped one never reads its stop pipe)
_LIVE: set = set()


@atexit.register
def _end_live_workers() -> None:
    for p in list(_LIVE):
        with contextlib.suppress(OSError):
            if p.poll() is None:
                p.kill()


# Worker processes per stream set (beyond it streams share them), each holding about WORKER_BYTES
MAX_WORKERS = 16
WORKER_BYTES = 6 * 2**20


def _memory_file(name: str) -> int:
    """A file descriptor of an empty memory file (``memfd_create``, else a temporary file) to close."""
    try:
        return os.memfd_create(name)
    except (AttributeError, OSError):
        f = tempfile.TemporaryFile(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        fd = os.dup(f.fileno())
        f.close()
        return fd


def payload_file(nbytes: int) -> int:
    """A memory file's descriptor (to close) holding ``nbytes`` random bytes, the source of ``os.sendfile``."""
    fd = _memory_file("gpubench-net-payload")
    block = os.urandom(min(nbytes, 2**20))
    left = nbytes
    while left > 0:
        left -= os.write(fd, block[: min(left, len(block))])
    return fd


# struct tcp_info, include/uapi/linux/tcp.h (Linux 6.x, 232 bytes up to snd_wnd): (byte offset,
# struct format) of the fields read; rtt in microseconds, snd_cwnd in segments.
TCP_INFO_LEN = 232
TCP_INFO_FIELDS: dict[str, tuple[int, str]] = {
    "snd_mss": (16, "I"),
    "rtt_us": (68, "I"),
    "rttvar_us": (72, "I"),
    "snd_cwnd": (80, "I"),
    "total_retrans": (100, "I"),
    "bytes_acked": (120, "Q"),
    "bytes_received": (128, "Q"),
    "bytes_sent": (200, "Q"),
    "bytes_retrans": (208, "Q"),
}


def parse_tcp_info(raw: bytes) -> dict[str, int]:
    """The fields of :data:`TCP_INFO_FIELDS` that ``raw`` (getsockopt's bytes) reaches, plus
    ``cwnd_bytes`` = snd_cwnd x snd_mss (iperf3's src/tcp_info.c ``get_snd_cwnd``)."""
    out: dict[str, int] = {}
    for name, (off, fmt) in TCP_INFO_FIELDS.items():
        size = struct.calcsize(fmt)
        if len(raw) >= off + size:
            out[name] = struct.unpack_from("=" + fmt, raw, off)[0]
    if "snd_cwnd" in out and "snd_mss" in out:
        out["cwnd_bytes"] = out["snd_cwnd"] * out["snd_mss"]
    return out


def tcp_info(sock: socket.socket) -> dict[str, int] | None:
    """``parse_tcp_info`` of ``sock``'s TCP_INFO, or None where the platform has none."""
    opt = getattr(socket, "TCP_INFO", None)
    if opt is None:
        return None
    try:
        return parse_tcp_info(sock.getsockopt(socket.IPPROTO_TCP, opt, TCP_INFO_LEN))
    except OSError:
        return None


def set_window(sock: socket.socket, nbytes: int) -> None:
    """-w: SO_SNDBUF and SO_RCVBUF of ``sock`` in bytes (0: leave the kernel's autotuning)."""
    if nbytes > 0:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, nbytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, nbytes)


def window_of(sock: socket.socket) -> dict[str, int]:
    """The socket's buffer sizes as the kernel reports them (bytes; Linux: twice what was set)."""
    try:
        return {"sndbuf": sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
                "rcvbuf": sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)}
    except OSError:
        return {}


class WorkerError(Exception):
    """A worker process could not start or died; the message is one line."""


class StreamSet:
    """Connected TCP sockets (owned from now on) that send or receive (``role``) through worker
    processes (one per stream, at most :data:`MAX_WORKERS`); ``rate`` target bytes/s per stream (0: as
    fast as possible). Use: ``start()``, ``go()``, ``counts()`` at any time, ``stop()``,
    ``close()`` (safe at any point, and again).
    """

    def __init__(self, socks: list[socket.socket], role: str, *, buffer: int, copy: bool = False,
                 rate: float = 0.0):
        self.socks = list(socks)
        self.role, self.buffer, self.copy, self.rate = role, buffer, copy, float(rate)
        self.nworkers = min(len(self.socks), MAX_WORKERS)
        self.procs: list[subprocess.Popen] = []
        self._shm_fd: int | None = None
        self._shm: mmap.mmap | None = None
        self._go_r: int | None = None
        self._go_w: int | None = None
        self._stop_r: int | None = None
        self._stop_w: int | None = None
        self._payload: int | None = None
        self.t_stop: float | None = None
        self.cpu_seconds: float | None = None  # user + system s of the workers, go to end (after stop)
        self._final_counts: list[int] | None = None
        self.worker_failures: list[str] = []

    def start(self, timeout: float = 20.0) -> None:
        """Start the workers and wait (``timeout`` seconds) until each is ready; they wait for :meth:`go`.
        Raises WorkerError: a worker cannot be started, dies or is not ready in time."""
        n = len(self.socks)
        if not n:
            return
        size = 16 * n + 16 * self.nworkers
        self._shm_fd = _memory_file("gpubench-net-counters")
        os.ftruncate(self._shm_fd, size)
        self._shm = mmap.mmap(self._shm_fd, size)
        self._go_r, self._go_w = os.pipe()
        self._stop_r, self._stop_w = os.pipe()
        ready_r, ready_w = os.pipe()
        if self.role == "send" and self._payload is None:
            self._payload = payload_file(self.buffer)
        payload = -1 if self._payload is None else self._payload
        for w in range(self.nworkers):
            slots = list(range(w, n, self.nworkers))
            fds = [self.socks[k].fileno() for k in slots]
            passed = [*fds, self._shm_fd, self._go_r, self._stop_r, ready_w, *([payload] if payload >= 0 else [])]
            arg = {"role": self.role, "copy": self.copy, "buffer": self.buffer, "rate": self.rate, "fds": fds,
                   "slots": slots, "nslots": n, "worker": w, "shm": self._shm_fd, "go": self._go_r,
                   "stop": self._stop_r, "ready": ready_w, "payload": payload}
            try:
                p = subprocess.Popen([sys.executable, "-I", "-S", WORKER, json.dumps(arg)], pass_fds=passed,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     start_new_session=True)
            except OSError as e:
                os.close(ready_r)
                os.close(ready_w)
                raise WorkerError(f"cannot start a {self.role} worker process: {e.strerror or e}") from None
            self.procs.append(p)
            _LIVE.add(p)
        os.close(ready_w)  # the workers hold it now: EOF here means every one of them ended
        try:
            got, deadline = 0, time.monotonic() + timeout
            while got < len(self.procs):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([ready_r], [], [], left)[0]:
                    raise WorkerError(f"{len(self.procs) - got} {self.role} worker process(es) not ready "
                                      f"within {timeout:g} s")
                chunk = os.read(ready_r, 64)
                if not chunk:
                    raise WorkerError(f"a {self.role} worker process ended before it was ready")
                got += len(chunk)
        finally:
            os.close(ready_r)

    def go(self) -> None:
        """Release the workers (each reads one byte of the go pipe)."""
        if self._go_w is not None and self.procs:
            os.write(self._go_w, b"g" * len(self.procs))

    def _words(self, fmt: str, start: int, count: int) -> list:
        if self._shm is None:
            return [0] * count
        return list(struct.unpack_from(f"={count}{fmt}", self._shm, start))

    def counts(self) -> list[int]:
        """Bytes each stream moved so far (sent: handed to the kernel; received: taken from it)."""
        if self._final_counts is not None:
            return list(self._final_counts)
        return self._words("Q", 0, len(self.socks))

    def states(self) -> list[int]:
        """Per stream: 0 running, -1 closed by the peer, an errno after an error."""
        return self._words("q", 8 * len(self.socks), len(self.socks))

    def all_ended(self) -> bool:
        """True when no stream is running any more (every one closed or failed)."""
        return bool(self.socks) and all(s != 0 for s in self.states())

    def errors(self) -> list[tuple[int, str]]:
        """(stream, error text) of the streams that ended with an error."""
        return [(k, os.strerror(s)) for k, s in enumerate(self.states()) if s > 0]

    def stop(self, timeout: float = 3.0, grace: float = 0.5) -> None:
        """End the workers and read their CPU seconds (again: nothing). The stop pipe is closed; a
        sender still running after ``grace`` seconds has its sockets' write side shut (ending a long
        sendfile); a worker still running after ``timeout`` seconds is killed."""
        if self.t_stop is not None:
            return
        self.t_stop = time.perf_counter()
        for fd in (self._stop_w, self._go_w):  # a worker still waiting for go reads EOF and ends
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._stop_w = self._go_w = None
        deadline = time.monotonic() + timeout
        if self.role == "send" and self.procs:
            soon = time.monotonic() + min(grace, timeout)
            for p in self.procs:
                try:
                    p.wait(max(0.0, soon - time.monotonic()))
                except subprocess.TimeoutExpired:
                    break
            if any(p.poll() is None for p in self.procs):
                for s in self.socks:
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_WR)
        for w, p in enumerate(self.procs):
            try:
                _, err = p.communicate(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
            _LIVE.discard(p)
            if p.returncode != 0:
                last = (err or b"").decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
                self.worker_failures.append(f"{self.role} worker {w} exited with {p.returncode}: {last[0][:200]}")
        n = len(self.socks)
        if self._shm is not None:
            self._final_counts = self._words("Q", 0, n)
            words = self._words("d", 16 * n, 2 * self.nworkers)
            self.cpu_seconds = sum(words[0::2])

    def tcp_infos(self) -> list[dict | None]:
        """TCP_INFO of each stream's socket now (:func:`tcp_info`)."""
        return [tcp_info(s) if s.fileno() >= 0 else None for s in self.socks]

    def close(self) -> None:
        """Stop the workers if they run, close the sockets and the shared memory; again is harmless."""
        self.stop()
        for s in self.socks:
            if self.role == "send":
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_WR)
            with contextlib.suppress(OSError):
                s.close()
        for name in ("_go_r", "_stop_r", "_payload", "_shm_fd"):
            fd = getattr(self, name)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, None)
        if self._shm is not None:
            with contextlib.suppress(BufferError, ValueError):
                self._shm.close()
            self._shm = None

"""``gpubench net``: multi-stream TCP throughput between two hosts (iperf-like), server and client.

What is timed (see docs/net.md): the client opens ``streams`` TCP connections and writes ``buffer``
bytes at a time on each as fast as it can; the *server* (the receiver) counts the bytes each stream's
``recv_into`` returns and, every ``interval`` seconds of its own ``time.perf_counter`` clock, sends
the per-stream byte counts of that interval to the client. The first ``omit`` seconds are reported
but not counted (TCP slow start, as iperf3's ``--omit``). Figures are bytes *received*, so data
still in socket buffers when the test ends is never counted.

Formulas: an interval's rate = its bytes / its measured seconds. The total of a stream (or of all
streams) = bytes of the counted intervals / the sum of their measured seconds; this is the
duration-weighted mean of the interval rates, so it always lies between the smallest and the
largest counted interval rate (never above what the intervals show). Gbit/s = 8 * B/s / 1e9.

Control protocol (version 1), one JSON object per line, each side capping what it reads:

1. client -> server on the control connection (<= MAX_HEADER_BYTES)::

       {"gpubench_net": 1, "role": "control", "streams": 4, "seconds": 10, "omit": 0,
        "interval": 1.0, "buffer": 131072}

2. server -> client: ``{"ok": true, "cookie": "<hex>", ...the accepted request...}`` or
   ``{"ok": false, "error": "<one line>"}`` and the server closes (bad request, caps, busy).
3. client -> server: ``streams`` data connections, each first sending
   ``{"gpubench_net": 1, "role": "data", "cookie": "<hex>", "stream": k}``; then raw payload.
4. server -> client (control): ``{"start": true}`` once every stream is connected; one
   ``{"interval": i, "omit": bool, "start_s": a, "end_s": b, "bytes": [per stream]}`` per
   interval; ``{"done": true}`` at the end (or ``{"ok": false, "error": ...}`` on abort).
5. the client stops writing and closes; the server drains until EOF (bounded) and serves the next.

The server runs one test at a time (others get ``busy``), times out silent peers, refuses
requests over :class:`Caps`, bounds its threads (handshakes + streams) and its memory (a fixed
receive buffer per stream), and binds to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import signal
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from gpubench.core import env as envmod
from gpubench.core.errors import MachineError, UsageError
from gpubench.core.signals import Interrupted
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result

PROTOCOL_VERSION = 1
DEFAULT_PORT = 5301
DEFAULT_BIND = "127.0.0.1"
MAX_HEADER_BYTES = 4096  # a request line from a client
MAX_LINE_BYTES = 64 * 1024  # a line from the server (an interval holds <= 128 counts)
RECV_BYTES = 256 * 1024  # the server's receive buffer per stream: memory <= 128 * 256 KiB


@dataclass(frozen=True)
class Caps:
    """What a server accepts; a request outside these is refused with a one-line reason.

    Attributes:
        max_streams: parallel TCP streams per test.
        max_seconds: omit + seconds, the whole test, in seconds.
        max_omit: leading seconds left out of the figures.
        max_buffer: bytes per write on the client.
        min_interval, max_interval: reporting interval in seconds.
        max_intervals: (omit + seconds) / interval, so a test's report stays small (at most
            128 streams x 3600 intervals of counts).
    """

    max_streams: int = 128
    max_seconds: float = 3600.0
    max_omit: float = 600.0
    max_buffer: int = 64 * 2**20
    min_interval: float = 0.1
    max_interval: float = 60.0
    max_intervals: int = 3600


CAPS = Caps()


@dataclass(frozen=True)
class Request:
    """What a client asks a server for.

    Attributes:
        streams: parallel TCP connections (iperf's -P).
        seconds: counted seconds, after the omitted ones (iperf's -t).
        omit: leading seconds measured but not counted (iperf3's --omit).
        interval: seconds per reported interval (iperf's -i).
        buffer: bytes per write on the client (iperf's -l).
    """

    streams: int = 1
    seconds: float = 10.0
    omit: float = 0.0
    interval: float = 1.0
    buffer: int = 128 * 1024

    def header(self) -> dict[str, Any]:
        """The control line a client sends."""
        return {"gpubench_net": PROTOCOL_VERSION, "role": "control", **asdict(self)}


class RequestError(ValueError):
    """A request the server refuses; the message is the one line sent back."""


def _number(d: dict, key: str, *, integer: bool = False) -> float:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        kind = "an integer" if integer else "a number"
        raise RequestError(f"{key} must be {kind}, got {json.dumps(v)[:40]}")
    if not math.isfinite(v):
        raise RequestError(f"{key} must be finite")
    return v


def check_request(d: Any, caps: Caps = CAPS) -> Request:
    """Validate a control request (a parsed JSON line) against the caps.

    Args:
        d: the parsed header; must be a dict with the fields of :meth:`Request.header`.
        caps: the limits.

    Returns:
        The accepted Request.

    Raises:
        RequestError: one line naming the bad field and what is accepted.
    """
    if not isinstance(d, dict):
        raise RequestError("request must be a JSON object")
    version = d.get("gpubench_net")
    if version != PROTOCOL_VERSION:
        raise RequestError(f"protocol version {json.dumps(version)[:20]} not supported (this server speaks {PROTOCOL_VERSION})")
    if d.get("role") != "control":
        raise RequestError('role must be "control" for a new test')
    streams = _number(d, "streams", integer=True)
    seconds = _number(d, "seconds")
    omit = _number(d, "omit")
    interval = _number(d, "interval")
    buffer = _number(d, "buffer", integer=True)
    if not 1 <= streams <= caps.max_streams:
        raise RequestError(f"streams {streams} out of range: 1 to {caps.max_streams}")
    if not 0 < seconds <= caps.max_seconds:
        raise RequestError(f"seconds {seconds:g} out of range: more than 0, at most {caps.max_seconds:g}")
    if not 0 <= omit <= caps.max_omit:
        raise RequestError(f"omit {omit:g} out of range: 0 to {caps.max_omit:g} seconds")
    if omit + seconds > caps.max_seconds:
        raise RequestError(f"omit + seconds = {omit + seconds:g} is over {caps.max_seconds:g} seconds")
    if not caps.min_interval <= interval <= caps.max_interval:
        raise RequestError(f"interval {interval:g} out of range: {caps.min_interval:g} to {caps.max_interval:g} seconds")
    if not 1 <= buffer <= caps.max_buffer:
        raise RequestError(f"buffer {buffer} out of range: 1 to {caps.max_buffer} bytes")
    n = len(schedule(omit, seconds, interval))
    if n > caps.max_intervals:
        raise RequestError(f"{n} intervals of {interval:g} s is over {caps.max_intervals}; use a longer interval")
    return Request(streams=int(streams), seconds=float(seconds), omit=float(omit), interval=float(interval),
                   buffer=int(buffer))


def schedule(omit: float, seconds: float, interval: float) -> list[tuple[float, bool]]:
    """Interval ends (seconds after the start) and whether each is omitted.

    The omitted part [0, omit) and the counted part [omit, omit + seconds) are each cut into
    intervals of ``interval`` seconds, the last of each part shortened to fit, so that no interval
    straddles the omit boundary. E.g. omit 1.5, seconds 2, interval 1 ->
    [(1.0, True), (1.5, True), (2.5, False), (3.5, False)].
    """
    out: list[tuple[float, bool]] = []
    for start, length, omitted in ((0.0, omit, True), (omit, seconds, False)):
        if length <= 0:
            continue
        n = max(1, math.ceil(length / interval - 1e-9))
        for i in range(1, n + 1):
            out.append((start + min(i * interval, length), omitted))
    return out


# ---------------------------------------------------------------------------------------------
# Line I/O with limits


class ProtocolError(Exception):
    """The peer broke the protocol, went silent, or closed; the message is one line."""


class LineReader:
    """Reads newline-terminated JSON lines from a socket, never holding more than ``limit`` bytes.

    Args:
        sock: a connected socket.
        limit: the longest line accepted, in bytes, newline included.
    """

    def __init__(self, sock: socket.socket, limit: int):
        self.sock = sock
        self.limit = limit
        self._buf = bytearray()

    def readline(self, timeout: float, stop: threading.Event | None = None) -> bytes:
        """The next line (without the newline), waiting at most ``timeout`` seconds in all.

        Args:
            timeout: seconds for the whole line.
            stop: when given and set, give up within half a second.

        Raises:
            ProtocolError: the line is longer than the limit, the peer closed first, the time ran
                out, ``stop`` was set, or a socket error.
        """
        deadline = time.monotonic() + timeout
        while True:
            if stop is not None and stop.is_set():
                raise ProtocolError("server stopping")
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                return line
            if len(self._buf) >= self.limit:
                raise ProtocolError(f"line longer than {self.limit} bytes")
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProtocolError(f"nothing complete received within {timeout:g} s")
            self.sock.settimeout(min(left, 0.5))
            try:
                chunk = self.sock.recv(self.limit - len(self._buf))
            except socket.timeout:
                continue
            except OSError as e:
                raise ProtocolError(f"connection error: {e.strerror or e}") from None
            if not chunk:
                raise ProtocolError("connection closed" + (" mid-line" if self._buf else ""))
            self._buf += chunk

    def readjson(self, timeout: float, stop: threading.Event | None = None) -> Any:
        """The next line parsed as JSON.

        Raises:
            ProtocolError: as :meth:`readline`, or the line is not JSON.
        """
        line = self.readline(timeout, stop)
        try:
            return json.loads(line)
        except (ValueError, UnicodeDecodeError):
            raise ProtocolError(f"not a JSON line: {line[:40]!r}") from None


def send_json(sock: socket.socket, obj: Any, timeout: float = 5.0) -> None:
    """Send one JSON line. Raises OSError (incl. socket.timeout) when the peer does not take it."""
    sock.settimeout(timeout)
    sock.sendall(json.dumps(obj, separators=(",", ":")).encode() + b"\n")


def _refuse(sock: socket.socket, message: str) -> None:
    """Send an error line without waiting, then close; never raises."""
    try:
        sock.setblocking(False)
        sock.send(json.dumps({"ok": False, "error": message}).encode() + b"\n")
    except OSError:
        pass
    _close(sock)


def _close(sock: socket.socket | None) -> None:
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


# ---------------------------------------------------------------------------------------------
# Server


class _Test:
    """One running test on the server: its request, its streams' sockets and byte counters."""

    def __init__(self, req: Request, peer_ip: str):
        self.req = req
        self.peer_ip = peer_ip
        self.cookie = secrets.token_hex(16)
        self.counts = [0] * req.streams  # bytes received per stream; one writer each
        self.socks: list[socket.socket | None] = [None] * req.streams
        self.lock = threading.Lock()
        self.all_attached = threading.Event()
        self.all_ended = threading.Event()
        self.closing = threading.Event()
        self.attached = 0
        self.alive = 0

    def attach(self, k: Any, sock: socket.socket, ip: str) -> str | None:
        """Register data stream ``k``; returns why it is refused, or None."""
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < self.req.streams:
            return f"stream must be an integer 0 to {self.req.streams - 1}"
        if ip != self.peer_ip:
            return "data streams must come from the control connection's address"
        with self.lock:
            if self.closing.is_set():
                return "test is over"
            if self.socks[k] is not None:
                return f"stream {k} already connected"
            self.socks[k] = sock
            self.attached += 1
            self.alive += 1
            if self.attached == self.req.streams:
                self.all_attached.set()
        return None

    def receive(self, k: int, sock: socket.socket) -> None:
        """Count the bytes of stream ``k`` until EOF, an error, or the test closes."""
        buf = memoryview(bytearray(RECV_BYTES))
        sock.settimeout(0.5)
        try:
            while True:
                try:
                    n = sock.recv_into(buf)
                except socket.timeout:
                    if self.closing.is_set():
                        break
                    continue
                except OSError:
                    break
                if n == 0:
                    break
                self.counts[k] += n
        finally:
            with self.lock:
                self.alive -= 1
                if self.alive == 0:
                    self.all_ended.set()

    def close(self) -> None:
        self.closing.set()
        with self.lock:
            socks = [s for s in self.socks if s is not None]
        for s in socks:
            _close(s)


@dataclass
class ServerStats:
    """What a server did: tests completed, aborted, and connections refused."""

    tests_done: int = 0
    tests_aborted: int = 0
    refused: int = 0


class NetServer:
    """The receiving side: accepts one test at a time and reports its intervals to the client.

    Args:
        bind: address to listen on; 127.0.0.1 (loopback only) unless the user says otherwise.
        port: TCP port; 0 picks a free one (see :attr:`address` after :meth:`open`).
        caps: limits on a request.
        log: called with one line per event (test done, refusal); silent when None.
        header_timeout: seconds a new connection has to send its request line.
        setup_timeout: seconds a client has to connect all its data streams.
        drain_timeout: seconds to wait for the client to close its streams after the end.
        stall_timeout: seconds without a byte on any stream after which a test is aborted (a
            client that vanished without closing, e.g. a host that lost power).
        max_handshakes: connections whose request line is awaited at once; a further one waits
            up to ``slot_wait`` seconds for a free slot, then is refused busy.
    """

    def __init__(self, bind: str = DEFAULT_BIND, port: int = DEFAULT_PORT, *, caps: Caps = CAPS,
                 log: Callable[[str], None] | None = None, header_timeout: float = 5.0,
                 setup_timeout: float = 5.0, drain_timeout: float = 5.0, stall_timeout: float = 10.0,
                 max_handshakes: int = 64,
                 slot_wait: float = 1.0):
        self.bind = bind
        self.port = port
        self.caps = caps
        self.log = log or (lambda line: None)
        self.header_timeout = header_timeout
        self.setup_timeout = setup_timeout
        self.drain_timeout = drain_timeout
        self.stall_timeout = stall_timeout
        self._stats_lock = threading.Lock()
        self.slot_wait = slot_wait
        self.stats = ServerStats()
        self._slots = threading.BoundedSemaphore(max_handshakes)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._active: _Test | None = None
        self._listener: socket.socket | None = None
        self._threads: set[threading.Thread] = set()
        self._max_tests: int | None = None
        self.address: tuple[str, int] | None = None

    def open(self) -> tuple[str, int]:
        """Bind and listen. Returns (address, port) actually bound.

        Raises:
            UsageError: the address is not one of this host's, or the port is taken or not allowed.
        """
        try:
            infos = socket.getaddrinfo(self.bind, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except (socket.gaierror, UnicodeError) as e:  # UnicodeError: a name IDNA cannot encode (a label over 63)
            raise UsageError(f"--bind {self.bind!r} is not an address ({getattr(e, 'strerror', None) or e})",
                             "e.g. 127.0.0.1, 0.0.0.0, ::1") from None
        family, _, _, _, sockaddr = infos[0]
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(sockaddr)
            s.listen(1024)  # a burst of connections waits in the kernel, not refused
        except OSError as e:
            s.close()
            raise UsageError(f"cannot listen on {self.bind} port {self.port}: {e.strerror or e}",
                             "choose another --port or --bind") from None
        self._listener = s
        addr = s.getsockname()
        self.address = (addr[0], addr[1])
        return self.address

    def _count(self, what: str) -> None:
        with self._stats_lock:
            setattr(self.stats, what, getattr(self.stats, what) + 1)

    def stop(self) -> None:
        """Ask the server to stop; :meth:`serve_forever` returns within about half a second."""
        self._stop.set()

    @property
    def busy(self) -> bool:
        """True while a test holds the server."""
        return self._active is not None

    def serve_forever(self, max_tests: int | None = None) -> ServerStats:
        """Accept connections until :meth:`stop`, a signal, or ``max_tests`` tests have ended.

        KeyboardInterrupt and Interrupted (SIGTERM) propagate after the server has closed its
        listener, aborted the running test and waited (at most 3 s) for its threads.
        """
        if self._listener is None:
            self.open()
        self._max_tests = max_tests
        lst = self._listener
        lst.settimeout(0.25)
        try:
            while not self._stop.is_set():
                try:
                    conn, peer = lst.accept()
                except socket.timeout:
                    continue
                except OSError as e:
                    if self._stop.is_set():
                        break
                    self.log(f"accept failed: {e.strerror or e}")
                    time.sleep(0.05)  # e.g. out of file descriptors: do not spin
                    continue
                # queue briefly for a handshake slot (refusals are quick, so slots free up fast);
                # the kernel's listen backlog holds the connections behind this one meanwhile
                if not self._slots.acquire(timeout=self.slot_wait):
                    self._count("refused")
                    _refuse(conn, "busy: too many connections at once; try again later")
                    continue
                t = threading.Thread(target=self._handle, args=(conn, peer), daemon=True, name="gpubench-net")
                with self._lock:
                    self._threads.add(t)
                try:
                    t.start()
                except RuntimeError:  # "can't start new thread": the host is out of threads
                    with self._lock:
                        self._threads.discard(t)
                    self._slots.release()
                    self._count("refused")
                    _refuse(conn, "busy: the server cannot take more connections now")
        finally:
            self._stop.set()
            try:
                lst.close()
            except OSError:
                pass
            test = self._active
            if test is not None:
                test.close()
            deadline = time.monotonic() + 3.0
            with self._lock:
                threads = list(self._threads)
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
        return self.stats

    # -- one connection ------------------------------------------------------------------------

    def _handle(self, conn: socket.socket, peer) -> None:
        who = f"{peer[0]}:{peer[1]}"
        slot = True
        try:
            try:
                header = LineReader(conn, MAX_HEADER_BYTES).readjson(self.header_timeout, self._stop)
            except ProtocolError as e:
                msg = str(e)
                if msg.startswith("nothing complete"):
                    msg = f"no request line within {self.header_timeout:g} s"
                elif msg.startswith("line longer"):
                    msg = f"request longer than {MAX_HEADER_BYTES} bytes"
                self._refused(conn, who, msg)
                return
            role = header.get("role") if isinstance(header, dict) else None
            if role == "data":
                self._slots.release()
                slot = False
                self._data(conn, who, peer[0], header)
                return
            try:
                req = check_request(header, self.caps)
            except RequestError as e:
                self._refused(conn, who, str(e))
                return
            with self._lock:
                if self._active is not None or self._stop.is_set():
                    test = None
                else:
                    test = self._active = _Test(req, peer[0])
            if test is None:
                self._refused(conn, who, "server stopping" if self._stop.is_set()
                              else "busy: a test is running; try again when it ends")
                return
            self._slots.release()
            slot = False
            try:
                self._run_test(conn, who, test)
            finally:
                test.close()
                with self._lock:
                    self._active = None
                done = self.stats.tests_done + self.stats.tests_aborted
                if self._max_tests is not None and done >= self._max_tests:
                    self._stop.set()
        except Exception as e:  # never let one connection take the server down
            self.log(f"{who}: internal error: {type(e).__name__}: {e}")
        finally:
            if slot:
                self._slots.release()
            _close(conn)
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _refused(self, conn: socket.socket, who: str, message: str) -> None:
        self._count("refused")
        self.log(f"refused {who}: {message}")
        _refuse(conn, message)

    def _data(self, conn: socket.socket, who: str, ip: str, header: dict) -> None:
        with self._lock:
            test = self._active
        if header.get("gpubench_net") != PROTOCOL_VERSION:
            self._refused(conn, who, f"protocol version not supported (this server speaks {PROTOCOL_VERSION})")
            return
        cookie = header.get("cookie")
        if test is None or not isinstance(cookie, str) or not secrets.compare_digest(
            cookie.encode("utf-8", "replace"), test.cookie.encode()
        ):
            self._refused(conn, who, "data stream for no running test")
            return
        k = header.get("stream")
        why = test.attach(k, conn, ip)
        if why:
            self._refused(conn, who, why)
            return
        test.receive(k, conn)

    def _run_test(self, conn: socket.socket, who: str, test: _Test) -> None:
        req = test.req
        tag = (f"test from {who}: {req.streams} stream(s), {req.seconds:g} s"
               + (f" after {req.omit:g} s omitted" if req.omit else "") + f", {req.buffer} B writes")
        try:
            send_json(conn, {"ok": True, "version": PROTOCOL_VERSION, "cookie": test.cookie, **asdict(req)})
            why = self._wait_streams(conn, test)
            if why:
                self._abort(conn, who, tag, why)
                return
            counted_bytes, counted_s = self._measure(conn, test)
        except _Abort as e:
            self._abort(conn, who, tag, str(e))
            return
        except OSError as e:
            self._abort(conn, who, tag, f"control connection failed: {e.strerror or e}")
            return
        self._count("tests_done")
        rate = counted_bytes / counted_s if counted_s > 0 else 0.0
        self.log(f"{tag}: {counted_bytes} B in {counted_s:.3f} s = {rate * 8 / 1e9:.2f} Gbit/s ({rate / 1e9:.3f} GB/s)")
        test.all_ended.wait(self.drain_timeout)  # let the client close first: no reset mid-write

    def _abort(self, conn: socket.socket, who: str, tag: str, why: str) -> None:
        self._count("tests_aborted")
        self.log(f"{tag}: aborted: {why}")
        try:
            send_json(conn, {"ok": False, "error": why}, timeout=1.0)
        except OSError:
            pass

    def _peer_gone(self, conn: socket.socket, wait: float) -> bool:
        """Wait up to ``wait`` s for the control connection; True when the client closed or sent anything."""
        conn.settimeout(max(wait, 0.001))
        try:
            conn.recv(1)
        except socket.timeout:
            return False
        except OSError:
            return True
        return True  # EOF, or bytes the protocol does not allow here

    def _wait_streams(self, conn: socket.socket, test: _Test) -> str | None:
        deadline = time.monotonic() + self.setup_timeout
        while not test.all_attached.is_set():
            if self._stop.is_set():
                return "server stopping"
            if time.monotonic() > deadline:
                return f"only {test.attached} of {test.req.streams} stream(s) connected within {self.setup_timeout:g} s"
            if self._peer_gone(conn, 0.05):
                return "client closed the control connection"
        return None

    def _measure(self, conn: socket.socket, test: _Test) -> tuple[int, float]:
        req = test.req
        ends = schedule(req.omit, req.seconds, req.interval)
        # the clock and the byte counts start before "start" goes out: a client's first bytes can be
        # counted by the receiving threads before this thread runs again, and were then in no interval
        t0 = time.perf_counter()
        prev = list(test.counts)
        send_json(conn, {"start": True})
        t_prev = t0
        counted_bytes, counted_s = 0, 0.0
        seen, seen_at = sum(prev), t0
        for i, (end, omitted) in enumerate(ends):
            while True:
                now = time.perf_counter()
                left = t0 + end - now
                if left <= 0:
                    break
                if self._stop.is_set():
                    raise _Abort("server stopping")
                if test.all_ended.is_set():
                    raise _Abort("client closed every data stream before the end")
                total = sum(test.counts)
                if total != seen:
                    seen, seen_at = total, now
                elif now - seen_at > self.stall_timeout:
                    raise _Abort(f"no data on any stream for {self.stall_timeout:g} s")
                if self._peer_gone(conn, min(left, 0.2)):
                    raise _Abort("client closed the control connection")
            now = time.perf_counter()
            snap = list(test.counts)
            got = [a - b for a, b in zip(snap, prev)]
            send_json(conn, {"interval": i, "omit": omitted, "start_s": t_prev - t0, "end_s": now - t0, "bytes": got})
            if not omitted:
                counted_bytes += sum(got)
                counted_s += now - t_prev
            prev, t_prev = snap, now
        send_json(conn, {"done": True})
        return counted_bytes, counted_s


class _Abort(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Client


@dataclass(frozen=True)
class NetSpec:
    """Parsed options of ``gpubench net client`` / ``net local``.

    Attributes:
        host: the server's name or address.
        port: the server's TCP port.
        request: streams, seconds, omit, interval, buffer.
        mode: "client" or "local" (server started in this process on loopback).
        connect_timeout: seconds to connect and to get each reply before the test starts.
    """

    host: str
    port: int
    request: Request = field(default_factory=Request)
    mode: str = "client"
    connect_timeout: float = 10.0

    def to_dict(self) -> dict:
        """The options as asked: net local asks for any free port (0); the one it got is in the
        result's timing ("server_port"), so two local runs do not differ by their random ports."""
        port = 0 if self.mode == "local" else self.port
        return {"host": self.host, "port": port, "mode": self.mode, **asdict(self.request)}


@dataclass
class Interval:
    """One reporting interval as the server measured it.

    Attributes:
        start_s, end_s: seconds after the start, on the server's clock.
        omit: True for the leading intervals left out of the figures.
        bytes: bytes received per stream during the interval.
    """

    start_s: float
    end_s: float
    omit: bool
    bytes: list[int]

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


def _connect(host: str, port: int, timeout: float) -> socket.socket:
    try:
        s = socket.create_connection((host, port), timeout=timeout)
    except (socket.gaierror, UnicodeError) as e:  # UnicodeError: a name IDNA cannot encode (a label over 63)
        raise UsageError(f"host {host!r} not found ({getattr(e, 'strerror', None) or e})") from None
    except socket.timeout:
        raise MachineError(f"cannot connect to {host} port {port}: no answer within {timeout:g} s") from None
    except OSError as e:
        raise MachineError(f"cannot connect to {host} port {port}: {e.strerror or e}",
                           "is `gpubench net server` running there, on that --port and --bind?") from None
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _payload(nbytes: int) -> memoryview:
    """A buffer of random bytes (a 1 MiB random block repeated): never zeros, nothing to compress."""
    block = os.urandom(min(nbytes, 2**20))
    reps = -(-nbytes // len(block))
    return memoryview((block * reps)[:nbytes])


class _Sender(threading.Thread):
    def __init__(self, sock: socket.socket, payload: memoryview, go: threading.Event, stop: threading.Event):
        super().__init__(daemon=True, name="gpubench-net-send")
        self.sock, self.payload, self.go, self.stop_ = sock, payload, go, stop
        self.sent = 0
        self.error: str | None = None

    def run(self) -> None:
        while not self.go.wait(0.1):
            if self.stop_.is_set():
                return
        view = self.payload
        n = len(view)
        self.sock.settimeout(1.0)
        off = 0
        while not self.stop_.is_set():
            try:
                k = self.sock.send(view[off:])
            except socket.timeout:
                continue
            except OSError as e:
                if not self.stop_.is_set():
                    self.error = e.strerror or str(e)
                return
            self.sent += k
            off = (off + k) % n


def _server_error(host: str, port: int, msg: Any) -> MachineError:
    return MachineError(f"server {host} port {port}: {str(msg)[:200]}")


def run(spec: NetSpec, progress: ProgressSink | None = None) -> Result:
    """Run one test against a server and return its Result.

    Args:
        spec: the parsed options.
        progress: advanced once per interval received (silent when None).

    Returns:
        A Result with one record per stream and one for the total (stream "total"); see
        :func:`build_records`. On Ctrl-C / SIGTERM the intervals received so far, marked partial.

    Raises:
        UsageError: the host name does not resolve.
        MachineError: cannot connect, the server refused the test (e.g. busy, over its caps), or
            the server or the network failed during the test.
    """
    progress = progress or ProgressSink()
    req = spec.request
    host, port = spec.host, spec.port
    intervals: list[Interval] = []
    interrupted: str | None = None
    stop, go = threading.Event(), threading.Event()
    senders: list[_Sender] = []
    data: list[socket.socket] = []
    ctl = _connect(host, port, spec.connect_timeout)
    try:
        reader = LineReader(ctl, MAX_LINE_BYTES)
        try:
            send_json(ctl, req.header(), timeout=spec.connect_timeout)
            reply = reader.readjson(spec.connect_timeout)
        except (OSError, ProtocolError) as e:
            raise _server_error(host, port, f"no reply to the request ({e})") from None
        if not isinstance(reply, dict) or reply.get("ok") is not True:
            err = reply.get("error") if isinstance(reply, dict) else reply
            raise _server_error(host, port, f"refused the test: {err}")
        cookie = reply.get("cookie")
        payload = _payload(req.buffer)
        for k in range(req.streams):
            s = _connect(host, port, spec.connect_timeout)
            data.append(s)
            try:
                send_json(s, {"gpubench_net": PROTOCOL_VERSION, "role": "data", "cookie": cookie, "stream": k})
            except OSError as e:
                raise _server_error(host, port, f"data stream {k} failed: {e.strerror or e}") from None
            senders.append(_Sender(s, payload, go, stop))
        for t in senders:
            t.start()
        n_intervals = len(schedule(req.omit, req.seconds, req.interval))
        progress.start(n_intervals, "waiting for the server")
        try:
            msg = reader.readjson(spec.connect_timeout + 5.0)
            if not (isinstance(msg, dict) and msg.get("start") is True):
                raise _server_error(host, port, msg.get("error") if isinstance(msg, dict) else msg)
            go.set()
            while True:
                msg = reader.readjson(req.interval + 10.0)
                if not isinstance(msg, dict):
                    raise _server_error(host, port, f"unexpected reply {str(msg)[:40]}")
                if msg.get("done") is True:
                    break
                if "interval" not in msg:
                    raise _server_error(host, port, msg.get("error", f"unexpected reply {str(msg)[:40]}"))
                iv = _parse_interval(msg, req.streams)
                if iv is None:
                    raise _server_error(host, port, f"malformed interval {str(msg)[:60]}")
                intervals.append(iv)
                rate = sum(iv.bytes) / iv.seconds if iv.seconds > 0 else 0.0
                progress.advance(f"{iv.end_s:.1f} s: {rate * 8 / 1e9:.2f} Gbit/s" + (" (omitted)" if iv.omit else ""))
        except ProtocolError as e:
            raise _server_error(host, port, f"stopped answering during the test ({e})") from None
        except KeyboardInterrupt:
            interrupted = "SIGINT"
        except Interrupted as e:
            interrupted = signal.Signals(e.signum).name
        finally:
            progress.done()
    finally:
        stop.set()
        for t in senders:
            t.join(2.0)
        for s in data:
            _close(s)
        _close(ctl)
    errors = [f"stream {i}: {t.error}" for i, t in enumerate(senders) if t.error]
    if errors and interrupted is None:
        raise _server_error(host, port, f"data stream failed: {errors[0]}")
    return build_result(spec, intervals, [t.sent for t in senders], interrupted)


def _parse_interval(msg: dict, streams: int) -> Interval | None:
    b = msg.get("bytes")
    a, e = msg.get("start_s"), msg.get("end_s")
    if not (isinstance(b, list) and len(b) == streams
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in b)):
        return None
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in (a, e)) or e < a:
        return None
    return Interval(start_s=float(a), end_s=float(e), omit=bool(msg.get("omit")), bytes=list(b))


# ---------------------------------------------------------------------------------------------
# Figures


def totals(intervals: list[Interval], stream: int | None = None) -> tuple[int, float]:
    """(bytes, seconds) over the counted (not omitted) intervals, of one stream or of all (None).

    The total rate is bytes / seconds: the duration-weighted mean of the counted intervals' rates.
    """
    nbytes, secs = 0, 0.0
    for iv in intervals:
        if iv.omit:
            continue
        nbytes += iv.bytes[stream] if stream is not None else sum(iv.bytes)
        secs += iv.seconds
    return nbytes, secs


def build_records(request: Request, intervals: list[Interval], sent: list[int] | None = None) -> list[Record]:
    """One Record per stream, then one for the total (params stream = "total").

    Each record: metric "bandwidth", nbytes = the write size (``request.buffer``), and per counted
    interval with bytes > 0 one sample = interval seconds * buffer / interval bytes, i.e. the
    seconds per buffer's worth of data received, so nbytes / sample = that interval's rate in B/s.
    extra holds the raw figures: ``interval_bytes``, ``interval_start_s``, ``interval_end_s``,
    ``interval_omit`` (all intervals), ``counted_bytes``, ``counted_seconds``, ``bytes_per_s``,
    ``gbit_per_s`` (8 * B/s / 1e9), ``gb_per_s`` (B/s / 1e9), ``zero_intervals`` (counted intervals
    that received nothing; they have no sample but are in the total) and ``sent_bytes``.
    """
    out = []
    streams = request.streams
    base = {"streams": streams, "buffer_nbytes": request.buffer}
    for k in [*range(streams), None]:
        per = [iv.bytes[k] if k is not None else sum(iv.bytes) for iv in intervals]
        nbytes, secs = totals(intervals, k)
        samples = [iv.seconds * request.buffer / b for iv, b in zip(intervals, per) if not iv.omit and b > 0]
        rate = nbytes / secs if secs > 0 else 0.0
        extra = {
            "interval_bytes": per,
            "interval_start_s": [iv.start_s for iv in intervals],
            "interval_end_s": [iv.end_s for iv in intervals],
            "interval_omit": [iv.omit for iv in intervals],
            "counted_bytes": nbytes,
            "counted_seconds": secs,
            "bytes_per_s": rate,
            "gbit_per_s": rate * 8 / 1e9,
            "gb_per_s": rate / 1e9,
            "zero_intervals": sum(1 for iv, b in zip(intervals, per) if not iv.omit and b == 0),
        }
        if sent is not None:
            extra["sent_bytes"] = sent[k] if k is not None else sum(sent)
        err = None if samples else "no bytes received in a counted interval"
        out.append(Record(params={**base, "stream": k if k is not None else "total"}, metric="bandwidth",
                          nbytes=request.buffer, samples_s=samples, reps=1, error=err, extra=extra))
    return out


def build_result(spec: NetSpec, intervals: list[Interval], sent: list[int] | None = None,
                 interrupted: str | None = None) -> Result:
    """The Result of a test from the intervals the server reported (see :func:`build_records`)."""
    return Result(
        command="net",
        spec=spec.to_dict(),
        timing={
            "clock": "perf_counter (server, the receiver)",
            "server_port": spec.port,
            "interval_s": spec.request.interval,
            "omit_s": spec.request.omit,
            "method": "bytes received per stream per interval, counted by the server; total = counted "
                      "bytes / counted seconds (intervals after --omit)",
            "protocol_version": PROTOCOL_VERSION,
        },
        env={"host": envmod.host_info(), "versions": envmod.versions()},
        records=build_records(spec.request, intervals, sent),
        partial=interrupted is not None,
        interrupted_by=interrupted,
    )


def run_local(request: Request, progress: ProgressSink | None = None) -> Result:
    """Run a server on 127.0.0.1 (a free port) in this process and one test against it.

    Raises:
        MachineError: as :func:`run`.
    """
    server = NetServer(DEFAULT_BIND, 0, max_handshakes=request.streams + 8)
    _, port = server.open()
    t = threading.Thread(target=server.serve_forever, kwargs={"max_tests": 1}, daemon=True, name="gpubench-net-server")
    t.start()
    try:
        return run(NetSpec(host=DEFAULT_BIND, port=port, request=request, mode="local"), progress)
    finally:
        server.stop()
        t.join(5.0)

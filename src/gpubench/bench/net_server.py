"""``gpubench net server``: the receiving side, a long-running service (not a benchmark: it runs
outside the driver of :mod:`gpubench.core.benchmark`).

It counts the bytes each stream's ``recv_into`` returns and, every ``interval`` seconds of its own
``time.perf_counter`` clock, sends the per-stream byte counts of that interval to the client (the
protocol: :mod:`gpubench.bench.net_protocol`). It runs one test at a time (others get ``busy``),
times out silent peers, refuses requests over :class:`~gpubench.bench.net_protocol.Caps`, bounds
its threads (handshakes + streams) and its memory (a fixed receive buffer per stream), and binds
to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from gpubench.bench.net_protocol import (
    CAPS,
    DEFAULT_BIND,
    DEFAULT_PORT,
    MAX_HEADER_BYTES,
    PROTOCOL_VERSION,
    Caps,
    LineReader,
    ProtocolError,
    Request,
    RequestError,
    check_request,
    close_socket,
    refuse,
    schedule,
    send_json,
)
from gpubench.core.errors import UsageError

RECV_BYTES = 256 * 1024  # the receive buffer per stream: memory <= 128 * 256 KiB


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
            close_socket(s)


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
        assert lst is not None  # open() made it
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
                    refuse(conn, "busy: too many connections at once; try again later")
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
                    refuse(conn, "busy: the server cannot take more connections now")
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
            close_socket(conn)
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _refused(self, conn: socket.socket, who: str, message: str) -> None:
        self._count("refused")
        self.log(f"refused {who}: {message}")
        refuse(conn, message)

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
        assert isinstance(k, int)  # attach() refused any k that is not a stream index
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
    """A running test ends early; the message is the line its client gets."""

"""``gpubench net server``: the far end of a test (:mod:`gpubench.plugins.net.protocol`), a
long-running service outside the driver; its data moved by :mod:`gpubench.plugins.net.stream`'s
workers. Its limits and behaviour: docs/net.md "The server: limits and behaviour"."""

from __future__ import annotations

import contextlib
import errno
import resource
import secrets
import selectors
import socket
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable

from gpubench.plugins.net.protocol import (
    CAPS,
    DEFAULT_BIND,
    DEFAULT_PORT,
    MAX_HEADER_BYTES,
    Request,
    RequestError,
    check_request,
    check_version,
    parse_line,
    close_socket,
    refuse,
    send_json,
)
from gpubench.plugins.net.lines import server_line, test_words
from gpubench.plugins.net.stream import StreamSet, WorkerError, set_window
from gpubench.core.errors import UsageError
from gpubench.core.result import RepeatedKey

RECV_BYTES = 1 << 20  # the receive buffer per worker process (worker.py)


class _Test:
    """One running test on the server: its request and its data sockets per direction."""

    def __init__(self, req: Request, peer_ip: str):
        self.req, self.peer_ip, self.cookie = req, peer_ip, secrets.token_hex(16)
        self.socks: dict[str, list[socket.socket | None]] = {d: [None] * req.streams for d in req.directions()}
        self.lock = threading.Lock()
        self.all_attached, self.closing = threading.Event(), threading.Event()
        self.attached = 0
        self.needed = req.streams * len(self.socks)
        self.sets: dict[str, StreamSet] = {}

    def attach(self, header: dict, sock: socket.socket, ip: str) -> None:
        """Register a data stream (the test owns ``sock`` from now on). Raises RequestError: why it is refused."""
        k, d = header.get("stream"), header.get("direction", "c2s")
        if d not in self.socks:
            raise RequestError(f"direction must be one of {', '.join(self.socks)} for this test")
        if type(k) is not int or not 0 <= k < self.req.streams:
            raise RequestError(f"stream must be an integer 0 to {self.req.streams - 1}")
        if ip != self.peer_ip:
            raise RequestError("data streams must come from the control connection's address")
        with self.lock:
            if self.closing.is_set():
                raise RequestError("test is over")
            if self.socks[d][k] is not None:
                raise RequestError(f"stream {k} ({d}) already connected")
            sock.setblocking(True)
            set_window(sock, self.req.window)
            self.socks[d][k] = sock
            self.attached += 1
            if self.attached == self.needed:
                self.all_attached.set()

    def close(self) -> None:
        """End the workers and close every data socket; again is harmless."""
        self.closing.set()
        with self.lock:
            sets = list(self.sets.values())
            socks = [s for ss in self.socks.values() for s in ss if s is not None]
        for st in sets:
            st.close()
        for s in socks:
            close_socket(s)


@dataclass
class ServerStats:
    """What a server did: tests completed, aborted, and connections refused."""

    tests_done: int = 0
    tests_aborted: int = 0
    refused: int = 0


class _Pending:
    __slots__ = ("sock", "peer", "buf", "deadline")

    def __init__(self, sock: socket.socket, peer, deadline: float):
        self.sock, self.peer, self.buf, self.deadline = sock, peer, bytearray(), deadline


class NetServer:
    """The far end of a test: accepts one test at a time, moves its data, reports its intervals.
    ``port`` 0 picks a free one (:attr:`address` after :meth:`open`); ``log`` gets a line per event.
    Seconds: ``header_timeout`` for a request line, ``setup_timeout`` for the data streams to connect,
    ``drain_timeout`` for the client to close them, ``stall_timeout`` without a byte before an abort.
    ``max_pending`` connections may wait for their request line (one more: the oldest goes).
    """

    def __init__(self, bind: str = DEFAULT_BIND, port: int = DEFAULT_PORT, *, log: Callable[[str], None] | None = None,
                 header_timeout: float = 2.0, setup_timeout: float = 5.0, drain_timeout: float = 5.0,
                 stall_timeout: float = 10.0, max_pending: int = 512):
        self.bind, self.port, self.log = bind, port, log or (lambda line: None)
        self.header_timeout, self.setup_timeout = header_timeout, setup_timeout
        self.drain_timeout, self.stall_timeout = drain_timeout, stall_timeout
        self.max_pending = max(1, max_pending)
        self._stats_lock, self._lock = threading.Lock(), threading.Lock()
        self.stats = ServerStats()
        self._stop = threading.Event()
        self._active: _Test | None = None
        self._listener: socket.socket | None = None
        self._threads: set[threading.Thread] = set()
        self._serving: threading.Thread | None = None
        self._max_tests: int | None = None
        self.pending_peak = 0
        self.address: tuple[str, int] | None = None
        self._windowed = False  # the listener holds a test's -w buffers (renewed once the test ends)

    def open(self) -> tuple[str, int]:
        """Bind and listen. Returns (address, port) actually bound. Raises UsageError as :func:`bind_listener`."""
        s = self._listener = bind_listener(self.bind, self.port)
        with contextlib.suppress(ValueError, OSError):  # the soft open-files limit: the waiting connections and a test
            want = self.max_pending + 2 * CAPS.max_streams + 64
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            target = want if hard == resource.RLIM_INFINITY else min(want, hard)
            if soft != resource.RLIM_INFINITY and soft < target:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        self.address = s.getsockname()[:2]
        return self.address

    def start(self, max_tests: int | None = None) -> tuple[str, int]:
        """Open (when not yet open) and serve in a background thread; returns (address, port).
        Raises UsageError: as :meth:`open`."""
        address = self.address or self.open()
        self._serving = threading.Thread(target=self.serve_forever, kwargs={"max_tests": max_tests}, daemon=True,
                                         name="gpubench-net-server")
        self._serving.start()
        return address

    def close(self, timeout: float = 5.0) -> ServerStats:
        """Stop and wait (at most ``timeout`` s) for the thread :meth:`start` began; returns the stats."""
        self.stop()
        t = self._serving
        begun = time.monotonic()
        deadline = begun + timeout
        while t is not None:
            try:
                t.join(max(0.0, deadline - time.monotonic()))
                break
            except RuntimeError:
                # "cannot join thread before it is started" (a Ctrl-C inside Thread.start()):
                # a thread that runs sees the stop within 0.1 s; wait 1 s at most.
                if time.monotonic() > min(deadline, begun + 1.0):
                    break
                time.sleep(0.01)
        return self.stats

    def _count(self, what: str) -> None:
        with self._stats_lock:
            setattr(self.stats, what, getattr(self.stats, what) + 1)

    def stop(self) -> None:
        """Ask the server to stop; :meth:`serve_forever` returns within about a quarter second."""
        self._stop.set()

    @property
    def busy(self) -> bool:
        """True while a test holds the server."""
        return self._active is not None

    def serve_forever(self, max_tests: int | None = None) -> ServerStats:
        """Accept connections until :meth:`stop`, a signal, or ``max_tests`` tests have ended; this
        thread reads the request lines, a test runs in a thread of its own. KeyboardInterrupt and
        Interrupted propagate once the listener and waiting connections are closed and the running
        test aborted (waited for 3 s at most)."""
        if self._listener is None:
            self.open()
        self._max_tests = max_tests
        lst = self._listener
        assert lst is not None  # open() made it
        lst.setblocking(False)
        sel = selectors.DefaultSelector()
        sel.register(lst, selectors.EVENT_READ, None)
        pending: dict[socket.socket, _Pending] = {}  # oldest first (insertion order)
        try:
            while not self._stop.is_set():
                if self._windowed and self._active is None:
                    self._renew_listener(sel, pending)
                for key, _ in sel.select(0.1):
                    if key.data is None:
                        # the listener: open() made it; _renew_listener replaces it, never with None
                        assert self._listener is not None
                        self._accept(self._listener, sel, pending)
                    else:
                        self._read_pending(key.data, sel, pending)
                now = time.monotonic()
                while pending:
                    p = next(iter(pending.values()))
                    if p.deadline > now:
                        break
                    self._drop(p, sel, pending, f"no request line within {self.header_timeout:g} s")
        finally:
            self._stop.set()
            for p in list(pending.values()):
                self._drop(p, sel, pending, "server stopping", count=False)
            sel.close()
            if self._listener is not None:
                with contextlib.suppress(OSError):
                    self._listener.close()
            test = self._active
            if test is not None:
                test.closing.set()
            deadline = time.monotonic() + 3.0
            with self._lock:
                threads = list(self._threads)
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
        return self.stats

    def _renew_listener(self, sel, pending) -> None:
        """A fresh listener on the same address (autotuned buffers) after a -w test, the old one's
        queue accepted first; if the address cannot be bound again, the server stops (logged)."""
        old = self._listener
        assert old is not None
        family, sockaddr = old.family, old.getsockname()
        self._accept(old, sel, pending)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(old)
        old.close()
        self._windowed = False
        try:
            new = _listen(family, sockaddr)
        except OSError as e:
            self.log(f"cannot listen again on {sockaddr[0]} port {sockaddr[1]} after a -w test: {e.strerror or e}; "
                     "stopping")
            self._listener = old  # closed: the loop below ends
            self._stop.set()
            return
        new.setblocking(False)
        sel.register(new, selectors.EVENT_READ, None)
        self._listener = new

    def _accept(self, lst: socket.socket, sel, pending) -> None:
        for _ in range(64):  # then read what is pending, and come back
            try:
                conn, peer = lst.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self.log(f"accept failed: {e.strerror or e}")
                if e.errno in (errno.EMFILE, errno.ENFILE) and pending:  # out of descriptors: the oldest waiter goes
                    self._drop(next(iter(pending.values())), sel, pending, "busy: too many connections waiting")
                else:
                    time.sleep(0.05)
                return
            if len(pending) >= self.max_pending:
                self._drop(next(iter(pending.values())), sel, pending,
                           "busy: too many connections waiting to send their request")
            conn.setblocking(False)
            p = _Pending(conn, peer, time.monotonic() + self.header_timeout)
            pending[conn] = p
            self.pending_peak = max(self.pending_peak, len(pending))
            sel.register(conn, selectors.EVENT_READ, p)

    def _drop(self, p: _Pending, sel, pending, why: str, *, count: bool = True) -> None:
        pending.pop(p.sock, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            sel.unregister(p.sock)
        if count:
            self._refused(p.sock, p.peer, why)
        else:
            refuse(p.sock, why)

    def _read_pending(self, p: _Pending, sel, pending) -> None:
        try:
            chunk = p.sock.recv(MAX_HEADER_BYTES - len(p.buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:  # closed before a full line
            pending.pop(p.sock, None)
            sel.unregister(p.sock)
            close_socket(p.sock)
            return
        p.buf += chunk
        nl = p.buf.find(b"\n")
        if nl < 0:
            if len(p.buf) >= MAX_HEADER_BYTES:
                self._drop(p, sel, pending, f"request longer than {MAX_HEADER_BYTES} bytes")
            return
        pending.pop(p.sock, None)
        sel.unregister(p.sock)
        try:
            self._dispatch(p.sock, p.peer, bytes(p.buf[:nl]), sel, pending)
        except RequestError as e:
            self._refused(p.sock, p.peer, str(e))
        except Exception as e:  # never let one connection take the server down
            self.log(f"{p.peer[0]}:{p.peer[1]}: internal error: {type(e).__name__}: {e}")
            close_socket(p.sock)

    def _dispatch(self, conn: socket.socket, peer, line: bytes, sel, pending) -> None:
        """A data stream joins the running test, a control line starts one in a thread of its own.
        Raises RequestError: the refusal line to send back."""
        try:
            header = parse_line(line)
        except RepeatedKey as e:
            raise RequestError(f"the request repeats the key {e.args[0]!r}") from None
        except ValueError:
            raise RequestError(f"not a JSON line: {line[:40]!r}") from None
        if isinstance(header, dict) and header.get("role") == "data":
            return self._data(conn, peer, header)
        req = check_request(header, CAPS)
        with self._lock:
            idle = self._active is None
        if idle and self._windowed:  # the last test's -w must not reach this one's streams
            self._renew_listener(sel, pending)
        with self._lock:
            if self._active is not None or self._stop.is_set():
                raise RequestError("server stopping" if self._stop.is_set()
                                   else "busy: a test is running; try again when it ends")
            test = self._active = _Test(req, peer[0])
        t = threading.Thread(target=self._test_thread, args=(conn, peer, test), daemon=True, name="gpubench-net-test")
        with self._lock:
            self._threads.add(t)
        try:
            t.start()
        except RuntimeError:  # "can't start new thread": the host is out of threads
            with self._lock:
                self._threads.discard(t)
                self._active = None
            raise RequestError("busy: the server cannot take more connections now") from None

    def _refused(self, conn: socket.socket, peer, message: str) -> None:
        self._count("refused")
        self.log(f"refused {peer[0]}:{peer[1]}: {message}")
        refuse(conn, message)

    def _data(self, conn: socket.socket, peer, header: dict) -> None:
        """Raises RequestError: another version, no running test with this cookie, or as :meth:`_Test.attach`."""
        check_version(header)
        with self._lock:
            test = self._active
        cookie = header.get("cookie")
        if test is None or not isinstance(cookie, str) or not secrets.compare_digest(
            cookie.encode("utf-8", "replace"), test.cookie.encode()
        ):
            raise RequestError("data stream for no running test")
        test.attach(header, conn, peer[0])

    def _test_thread(self, conn: socket.socket, peer, test: _Test) -> None:
        who = f"{peer[0]}:{peer[1]}"
        try:
            conn.setblocking(True)
            self._run_test(conn, who, test)
        except Exception as e:  # never let one test take the server down
            self.log(f"{who}: internal error: {type(e).__name__}: {e}")
        finally:
            test.close()
            close_socket(conn)
            with self._lock:
                self._active = None
                self._threads.discard(threading.current_thread())
            done = self.stats.tests_done + self.stats.tests_aborted
            if self._max_tests is not None and done >= self._max_tests:
                self._stop.set()

    def _run_test(self, conn: socket.socket, who: str, test: _Test) -> None:
        req = test.req
        tag = f"test from {who}"
        self.log(f"{tag}: {test_words(asdict(req))}")
        try:
            # the listener gets the test's -w before the reply (the data streams connect after it): Linux sizes
            # the SYN-ACK's window from it (tcp_openreq_init_rwin; iperf3's iperf_tcp_listen does the same);
            # _renew_listener replaces the listener after the test
            if self._listener is not None and req.window > 0:
                set_window(self._listener, req.window)
                self._windowed = True
            send_json(conn, {"ok": True, "version": 2, "cookie": test.cookie, **asdict(req)})
            self._wait_streams(conn, test)
            with test.lock:
                if test.closing.is_set():
                    raise _Abort("server stopping")
                for d, role in (("c2s", "recv"), ("s2c", "send")):
                    if d in test.socks:
                        test.sets[d] = StreamSet([s for s in test.socks[d] if s is not None], role, buffer=req.buffer,
                                                 copy=req.copy, rate=req.bitrate / 8)
            for st in test.sets.values():
                st.start()
            counted = self._measure(conn, test)
            self._finish(conn, test)
        except (WorkerError, _Abort, OSError) as e:
            why = f"control connection failed: {e.strerror or e}" if isinstance(e, OSError) else str(e)
            self._count("tests_aborted")
            self.log(f"{tag}: aborted: {why}")
            with contextlib.suppress(OSError):
                send_json(conn, {"ok": False, "error": why}, timeout=1.0)
            return
        self._count("tests_done")
        for d, role in (("c2s", "received"), ("s2c", "sent")):  # both halves of --bidir
            if d in counted:
                nbytes, secs = counted[d]
                self.log(f"{tag}: {server_line(d, role, nbytes, secs, req.omit)}")

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

    def _wait_streams(self, conn: socket.socket, test: _Test) -> None:
        """Raises _Abort: the server stops, the client closed, or not every stream connected in time."""
        deadline = time.monotonic() + self.setup_timeout
        while not test.all_attached.is_set():
            if self._stop.is_set() or test.closing.is_set():
                raise _Abort("server stopping")
            if time.monotonic() > deadline:
                raise _Abort(f"only {test.attached} of {test.needed} stream(s) connected within "
                             f"{self.setup_timeout:g} s")
            if self._peer_gone(conn, 0.05):
                raise _Abort("client closed the control connection")

    def _measure(self, conn: socket.socket, test: _Test) -> dict[str, tuple[int, float]]:
        """Run the schedule, the counts per interval to the client (c2s). Returns, per direction,
        the counted intervals' bytes (received, or sent for s2c) and seconds, for the log."""
        req = test.req
        rx, tx = test.sets.get("c2s"), test.sets.get("s2c")
        sets = list(test.sets.values())
        ends = req.intervals()
        if rx is not None:
            rx.go()  # receivers first: the client's first bytes must find them
        # the clock and the counts start before "start" goes out: the client's first bytes are in an interval
        t0 = time.perf_counter()
        prev = rx.counts() if rx is not None else []
        send_json(conn, {"start": True})
        if tx is not None:
            tx.go()
        t_prev = t0
        counted_bytes, counted_s = 0, 0.0
        sent_prev, sent_counted = 0, 0
        seen, seen_at = -1, t0
        for i, (end, omitted) in enumerate(ends):
            while True:
                now = time.perf_counter()
                left = t0 + end - now
                if left <= 0:
                    break
                if self._stop.is_set() or test.closing.is_set():
                    raise _Abort("server stopping")
                if any(s.all_ended() for s in sets):
                    raise _Abort("client closed every data stream before the end")
                total = sum(sum(s.counts()) for s in sets)
                if total != seen:
                    seen, seen_at = total, now
                elif now - seen_at > self.stall_timeout:
                    raise _Abort(f"no data on any stream for {self.stall_timeout:g} s")
                if self._peer_gone(conn, min(left, 0.2)):
                    raise _Abort("client closed the control connection")
            now = time.perf_counter()
            snap = rx.counts() if rx is not None else []
            got = [a - b for a, b in zip(snap, prev)]
            send_json(conn, {"interval": i, "omit": omitted, "start_s": t_prev - t0, "end_s": now - t0, "bytes": got})
            sent = sum(tx.counts()) if tx is not None else 0
            if not omitted:
                counted_bytes += sum(got)
                counted_s += now - t_prev
                sent_counted += sent - sent_prev
            prev, t_prev, sent_prev = snap, now, sent
        send_json(conn, {"done": True})
        out = {}
        if rx is not None:
            out["c2s"] = (counted_bytes, counted_s)
        if tx is not None:
            out["s2c"] = (sent_counted, counted_s)
        return out

    def _finish(self, conn: socket.socket, test: _Test) -> None:
        """After "done": TCP_INFO of the senders, the client's close awaited, the workers ended, the end line."""
        tx = test.sets.get("s2c")
        tcp = tx.tcp_infos() if tx is not None else []
        deadline = time.monotonic() + self.drain_timeout
        while time.monotonic() < deadline and not all(s.all_ended() for s in test.sets.values()):
            if self._stop.is_set():
                break
            time.sleep(0.01)
        for s in test.sets.values():
            s.stop()
        cpu = {role: (test.sets[d].cpu_seconds if d in test.sets else None)
               for d, role in (("c2s", "recv"), ("s2c", "send"))}
        sent = tx.counts() if tx is not None else []
        with contextlib.suppress(OSError):
            send_json(conn, {"end": True, "cpu_s": cpu, "tcp": tcp, "sent": sent}, timeout=2.0)


class _Abort(Exception):
    """A running test ends early; the message is the line its client gets."""


def _listen(family: int, sockaddr, backlog: int = 1024) -> socket.socket:
    """A listening TCP socket on ``sockaddr``. Raises OSError (the socket closed) when it cannot bind."""
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(sockaddr)
        s.listen(backlog)
    except OSError:
        s.close()
        raise
    return s


def bind_listener(bind: str, port: int, backlog: int = 1024) -> socket.socket:
    """A socket listening on ``bind`` port ``port`` (net's servers, TCP and UCX).
    Raises UsageError: the address is not one of this host's, or the port is taken or not allowed."""
    try:
        infos = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:  # UnicodeError: a name IDNA cannot encode (a label over 63)
        raise UsageError(f"--bind {bind!r} is not an address ({getattr(e, 'strerror', None) or e})",
                         "e.g. 127.0.0.1, 0.0.0.0, ::1") from None
    family, _, _, _, sockaddr = infos[0]
    try:
        return _listen(family, sockaddr, backlog)
    except OSError as e:
        raise UsageError(f"cannot listen on {bind} port {port}: {e.strerror or e}",
                         "choose another --port or --bind") from None

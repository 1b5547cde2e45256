"""``gpubench net``'s control protocol: what a client may ask (:class:`Request` within :class:`Caps`,
checked by :data:`LIMITS`), the interval schedule, and line I/O with limits.

Version 2, one JSON object per line, each side capping what it reads (MAX_HEADER_BYTES, MAX_LINE_BYTES):

1. client: ``{"gpubench_net": 2, "role": "control", "streams": 4, "seconds": 10, ...}`` (:meth:`Request.header`).
2. server: ``{"ok": true, "cookie": "<hex>", ...the accepted request...}``, or ``{"ok": false, "error":
   "<one line>"}`` and it closes (bad request, caps, busy).
3. client: ``streams`` data connections per direction, each first sending ``{"gpubench_net": 2, "role":
   "data", "cookie": "<hex>", "stream": k, "direction": "c2s"}``; then payload (c2s) or nothing (s2c).
4. server: ``{"start": true}`` once every stream is connected; per interval ``{"interval": i, "omit": bool,
   "start_s": a, "end_s": b, "bytes": [per c2s stream, [] without c2s]}``; ``{"done": true}`` at the
   end (``{"ok": false, "error": ...}`` on abort). The client counts s2c itself from reading "start".
5. the client closes its data connections; the server ends its workers and sends ``{"end": true,
   "cpu_s": {"send": x, "recv": y}, "tcp": [TCP_INFO per s2c stream or null], "sent": [bytes per s2c
   stream]}``, then serves the next test.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from gpubench.core.result import RepeatedKey, no_repeated_keys

PROTOCOL_VERSION = 2
DEFAULT_PORT = 5301
DEFAULT_BIND = "127.0.0.1"
MAX_HEADER_BYTES = 4096  # a request line from a client
MAX_LINE_BYTES = 256 * 1024  # a line from the server (an interval: <= 128 counts; the end: <= 128 TCP_INFOs)
MAX_WIRE_INT = 2**63 - 1  # the largest integer either side takes from the other (a byte count)
DIRECTIONS = ("c2s", "s2c", "both")


@dataclass(frozen=True)
class Caps:
    """What a server accepts; a request outside these is refused with a one-line reason."""

    max_streams: int = 128  # parallel TCP streams per test
    min_seconds: float = 0.1  # the shortest counted time (-t): one shortest interval
    max_seconds: float = 3600.0  # omit + seconds, the whole test
    max_omit: float = 600.0  # leading seconds left out of the figures
    max_buffer: int = 64 * 2**20  # bytes per write on the sender
    min_interval: float = 0.1  # reporting interval, seconds
    max_interval: float = 60.0
    max_intervals: int = 3600  # (omit + seconds) / interval
    max_window: int = 512 * 2**20  # -w, bytes of SO_SNDBUF / SO_RCVBUF per data socket
    max_bitrate: int = 10**13  # -b, bits/s per stream


#: A stream that received nothing in counted intervals adding up to this many seconds is stalled
#: (a hung receiver or a dead path), not a hiccup of a loaded host; net nodes fails the link.
STALL_S = 1.0

CAPS = Caps()


@dataclass(frozen=True)
class Request:
    """What a client asks a server for (iperf's option letters in brackets)."""

    streams: int = 1  # parallel TCP connections (-P)
    seconds: float = 10.0  # counted seconds, after the omitted ones (-t)
    omit: float = 0.0  # leading seconds measured but not counted (iperf3's --omit)
    interval: float = 1.0  # seconds per reported interval (-i)
    buffer: int = 128 * 1024  # bytes per write on the sender (-l)
    direction: str = "c2s"  # "c2s" (the client sends), "s2c" (-R) or "both" (--bidir: ``streams`` each way)
    window: int = 0  # SO_SNDBUF and SO_RCVBUF of every data socket in bytes, 0: the kernel's autotuning (-w)
    bitrate: int = 0  # target bits/s per stream, 0: as fast as it goes (iperf3's -b)
    # copy False: zero copy, sendfile from a memory file and receive with MSG_TRUNC; True: send from
    # and receive into a buffer (iperf2, iperf3 without -Z)
    copy: bool = False

    def directions(self) -> tuple[str, ...]:
        """The directions data flows in: ("c2s",), ("s2c",) or ("c2s", "s2c")."""
        return ("c2s", "s2c") if self.direction == "both" else (self.direction,)

    def header(self) -> dict[str, Any]:
        """The control line a client sends."""
        return {"gpubench_net": PROTOCOL_VERSION, "role": "control", **asdict(self)}

    def intervals(self) -> list[tuple[float, bool]]:
        """The test's interval ends and whether each is omitted (:func:`schedule`)."""
        return schedule(self.omit, self.seconds, self.interval)


class RequestError(ValueError):
    """A request the server refuses; the message is the one line sent back."""


@dataclass(frozen=True)
class Limit:
    """One check of a request against the caps."""

    key: str  # names the check, for gpubench.plugins.net.command.OPTION_WORDING
    broken: Callable[[Request, Caps], bool]  # True when the request breaks the limit
    reason: Callable[[Request, Caps], str]  # the one line the server sends back


def _finite(field: str) -> Limit:
    return Limit(f"{field}-finite", lambda r, c: not math.isfinite(getattr(r, field)), lambda r, c: f"{field} must be finite")


# In order: the first broken one is reported; later checks may assume the earlier ones hold.
LIMITS: tuple[Limit, ...] = (
    Limit("streams", lambda r, c: not 1 <= r.streams <= c.max_streams,
          lambda r, c: f"streams {r.streams} out of range: 1 to {c.max_streams}"),
    _finite("seconds"),
    _finite("omit"),
    _finite("interval"),
    Limit("seconds", lambda r, c: not c.min_seconds <= r.seconds <= c.max_seconds,
          lambda r, c: f"seconds {r.seconds:g} out of range: {c.min_seconds:g} to {c.max_seconds:g}"),
    Limit("omit", lambda r, c: not 0 <= r.omit <= c.max_omit,
          lambda r, c: f"omit {r.omit:g} out of range: 0 to {c.max_omit:g} seconds"),
    Limit("total", lambda r, c: r.omit + r.seconds > c.max_seconds,
          lambda r, c: f"omit + seconds = {r.omit + r.seconds:g} is over {c.max_seconds:g} seconds"),
    Limit("interval", lambda r, c: not c.min_interval <= r.interval <= c.max_interval,
          lambda r, c: f"interval {r.interval:g} out of range: {c.min_interval:g} to {c.max_interval:g} seconds"),
    Limit("buffer", lambda r, c: not 1 <= r.buffer <= c.max_buffer,
          lambda r, c: f"buffer {r.buffer} out of range: 1 to {c.max_buffer} bytes"),
    Limit("window", lambda r, c: not (r.window == 0 or 1024 <= r.window <= c.max_window),
          lambda r, c: f"window {r.window} out of range: 0 (the kernel's) or 1024 to {c.max_window} bytes"),
    Limit("bitrate", lambda r, c: not 0 <= r.bitrate <= c.max_bitrate,
          lambda r, c: f"bitrate {r.bitrate} out of range: 0 (unlimited) to {c.max_bitrate} bit/s"),
    Limit("intervals", lambda r, c: len(r.intervals()) > c.max_intervals,
          lambda r, c: f"{len(r.intervals())} intervals of {r.interval:g} s is over {c.max_intervals}; "
                       f"use a longer interval"),
)


def first_broken(req: Request, caps: Caps = CAPS) -> Limit | None:
    """The first limit of :data:`LIMITS` that ``req`` breaks, or None when it is within ``caps``."""
    return next((limit for limit in LIMITS if limit.broken(req, caps)), None)


def wire_int(v: Any) -> bool:
    """True for a JSON integer both sides take: an int, not a bool, 0 <= v <= MAX_WIRE_INT."""
    return type(v) is int and 0 <= v <= MAX_WIRE_INT


def shown(v: Any, limit: int = 40) -> str:
    """``v`` as JSON, cut to ``limit`` characters (and its length), for a one-line message."""
    try:
        text = json.dumps(v)
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _number(d: dict, key: str, *, integer: bool = False, default: Any = None) -> int | float:
    """``d[key]`` (``default`` when missing) as the JSON number the protocol wants: an int (not a
    bool) of at most :data:`MAX_WIRE_INT` for ``integer``, else an int or float, finite.
    Raises RequestError: missing, the wrong type, or too large."""
    v = d.get(key, default)
    if integer:
        if type(v) is not int:
            raise RequestError(f"{key} must be an integer, got {shown(v)}")
        if abs(v) > MAX_WIRE_INT:
            raise RequestError(f"{key} {shown(v)} is too large")
        return v
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise RequestError(f"{key} must be a number, got {shown(v)}")
    try:
        f = float(v)
    except OverflowError:  # an integer of hundreds of digits
        raise RequestError(f"{key} {shown(v)} is too large") from None
    if not math.isfinite(f):
        raise RequestError(f"{key} must be finite")
    return f


def check_request(d: Any, caps: Caps = CAPS) -> Request:
    """The accepted Request of a control request ``d`` (a parsed JSON line) within ``caps``.
    Raises RequestError: one line naming the bad field and what is accepted."""
    if not isinstance(d, dict):
        raise RequestError("request must be a JSON object")
    check_version(d)
    if d.get("role") != "control":
        raise RequestError('role must be "control" for a new test')
    direction = d.get("direction", "c2s")
    if direction not in DIRECTIONS:
        raise RequestError(f"direction must be one of {', '.join(DIRECTIONS)}, got {shown(direction)}")
    copy = d.get("copy", False)
    if type(copy) is not bool:
        raise RequestError(f"copy must be true or false, got {shown(copy)}")
    req = Request(streams=int(_number(d, "streams", integer=True)), seconds=_number(d, "seconds"),
                  omit=_number(d, "omit"), interval=_number(d, "interval"),
                  buffer=int(_number(d, "buffer", integer=True)), direction=direction,
                  window=int(_number(d, "window", integer=True, default=0)),
                  bitrate=int(_number(d, "bitrate", integer=True, default=0)), copy=copy)
    limit = first_broken(req, caps)
    if limit is not None:
        raise RequestError(limit.reason(req, caps))
    return req


def check_version(d: dict) -> None:
    """Raises RequestError when ``d``'s "gpubench_net" is not the integer :data:`PROTOCOL_VERSION`."""
    version = d.get("gpubench_net")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise RequestError(f"protocol version {shown(version, 20)} not supported (this server speaks {PROTOCOL_VERSION})")


def is_loopback(address: str) -> bool:
    """True for "localhost" and a loopback address (127.0.0.0/8, ::1, bracketed or not)."""
    import ipaddress

    try:
        return address == "localhost" or ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def schedule(omit: float, seconds: float, interval: float) -> list[tuple[float, bool]]:
    """Interval ends (seconds after the start) and whether each is omitted: [0, omit) and [omit,
    omit + seconds) each cut into ``interval`` seconds, the last of each shortened to fit. E.g.
    omit 1.5, seconds 2, interval 1 -> [(1.0, True), (1.5, True), (2.5, False), (3.5, False)].
    """
    out: list[tuple[float, bool]] = []
    for start, length, omitted in ((0.0, omit, True), (omit, seconds, False)):
        if length <= 0:
            continue
        n = max(1, math.ceil(length / interval - 1e-9))
        for i in range(1, n + 1):
            out.append((start + min(i * interval, length), omitted))
    return out


class ProtocolError(Exception):
    """The peer broke the protocol, went silent, or closed; the message is one line."""


class LineReader:
    """Reads newline-terminated JSON lines from a socket, lines of ``limit`` bytes at most (newline included)."""

    def __init__(self, sock: socket.socket, limit: int):
        self.sock, self.limit, self._buf = sock, limit, bytearray()

    def readline(self, timeout: float) -> bytes:
        """The next line (without the newline), waiting at most ``timeout`` seconds in all.
        Raises ProtocolError: too long, closed, out of time, or a socket error."""
        deadline = time.monotonic() + timeout
        while True:
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

    def readjson(self, timeout: float) -> Any:
        """The next line parsed as JSON. Raises ProtocolError as :meth:`readline`, or the line is not JSON."""
        line = self.readline(timeout)
        try:
            return parse_line(line)
        except RepeatedKey as e:
            raise ProtocolError(f"a JSON line that repeats the key {e.args[0]!r}: {line[:40]!r}") from None
        except (ValueError, UnicodeDecodeError):
            raise ProtocolError(f"not a JSON line: {line[:40]!r}") from None


def parse_line(line: bytes) -> Any:
    """One protocol line as JSON (UTF-8 only). Raises ValueError: not UTF-8 JSON, nested too deeply, or
    RepeatedKey: an object names a key twice (which one counts is not JSON's to say)."""
    try:
        return json.loads(line.decode("utf-8"), object_pairs_hook=no_repeated_keys)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def send_json(sock: socket.socket, obj: Any, timeout: float = 5.0) -> None:
    """Send one JSON line. Raises OSError (incl. socket.timeout) when the peer does not take it."""
    sock.settimeout(timeout)
    sock.sendall(json.dumps(obj, separators=(",", ":")).encode() + b"\n")


def refuse(sock: socket.socket, message: str) -> None:
    """Send an error line (at most 300 characters) without waiting, then close; never raises."""
    with contextlib.suppress(OSError):
        sock.setblocking(False)
        sock.send(json.dumps({"ok": False, "error": message[:300]}).encode() + b"\n")
    close_socket(sock)


def close_socket(sock: socket.socket | None) -> None:
    """Shut down and close ``sock`` (None: nothing); never raises."""
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()

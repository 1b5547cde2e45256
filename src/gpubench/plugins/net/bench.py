"""``gpubench net client`` / ``net local``: multi-stream TCP throughput (iperf-like) through the
driver (:func:`gpubench.core.benchmark.run`); a point is one interval of the schedule.

Timing (docs/net.md): every ``interval`` seconds of its ``time.perf_counter`` clock the receiver
(c2s: the server; s2c: the client) reads the bytes each stream took; the first ``omit`` seconds
are not counted. An interval's rate = its bytes / its seconds; a total = counted bytes / counted
seconds; Gbit/s = 8 x B/s / 1e9; CPU per Gbit = (sender + receiver CPU s) / (8 x all bytes / 1e9).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, TypeGuard

from gpubench.plugins.net.protocol import (
    DEFAULT_BIND,
    MAX_LINE_BYTES,
    MAX_WIRE_INT,
    PROTOCOL_VERSION,
    STALL_S,
    LineReader,
    ProtocolError,
    Request,
    close_socket,
    is_loopback,
    send_json,
    shown,
    wire_int,
)
from gpubench.plugins.net.lines import LiveLines, hostport, test_words
from gpubench.plugins.net.server import RECV_BYTES, NetServer
from gpubench.plugins.net.stream import MAX_WORKERS, TCP_INFO_FIELDS, WORKER_BYTES, StreamSet, WorkerError, set_window, window_of
from gpubench.core import benchmark as driver
from gpubench.core import safe
from gpubench.core.benchmark import Benchmark, Context, Point
from gpubench.core.errors import MachineError, UsageError
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result
from gpubench.core.signals import Interrupted


@dataclass(frozen=True)
class NetSpec:
    """Parsed options of ``gpubench net client`` / ``net local`` (checked by the command)."""

    host: str  # the server's name or address
    port: int  # the server's TCP port (net local: 0, any free one; the one it got: timing "server_port")
    request: Request = field(default_factory=Request)
    mode: str = "client"  # or "local": a server started in this process on loopback
    connect_timeout: float = 10.0  # seconds to connect and to get each reply before the test starts
    family: int = 0  # 0 (any), 4 or 6 (-4 / -6)
    cport: int | None = None  # first local port of the data streams (--cport; stream n uses cport + n)

    def to_dict(self) -> dict:
        """The options as asked (net local: port 0)."""
        port = 0 if self.mode == "local" else self.port
        return {"host": self.host, "port": port, "mode": self.mode, "family": self.family, "cport": self.cport,
                **asdict(self.request)}


@dataclass
class Interval:
    """One reporting interval as the receiver measured it."""

    start_s: float  # seconds after the start, on the receiver's clock
    end_s: float
    omit: bool  # True for the leading intervals left out of the figures
    bytes: list[int]  # received per stream during the interval

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s

    def record(self, index: int, direction: str = "c2s") -> Record:
        """The interval as the driver's record of its point (regrouped by :meth:`Net.derive`)."""
        return Record(params={"interval": index, "direction": direction}, nbytes=sum(self.bytes),
                      samples_s=[self.seconds],
                      extra={"start_s": self.start_s, "end_s": self.end_s, "omit": self.omit, "bytes": self.bytes})

    @classmethod
    def of(cls, rec: Record) -> "Interval":
        """The interval a :meth:`record` holds."""
        e = rec.extra
        return cls(start_s=e["start_s"], end_s=e["end_s"], omit=e["omit"], bytes=e["bytes"])


def connect(host: str, port: int, timeout: float, *, family: int = 0, local_port: int | None = None,
            window: int = 0) -> socket.socket:
    """A TCP connection to (host, port), TCP_NODELAY on; ``family`` 0 or socket.AF_INET/AF_INET6,
    ``local_port`` --cport, ``window`` -w set before connecting (bytes; 0: autotuning).
    Raises UsageError: the host does not resolve or ``local_port`` is taken; MachineError: cannot connect."""
    try:
        infos = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:  # UnicodeError: a name IDNA cannot encode (a label over 63)
        fams: dict[int, str] = {socket.AF_INET: " as IPv4", socket.AF_INET6: " as IPv6"}
        raise UsageError(f"host {host!r} not found{fams.get(family, '')} ({getattr(e, 'strerror', None) or e})") from None
    last: BaseException | None = None
    for fam, kind, proto, _, addr in infos:
        s = socket.socket(fam, kind, proto)
        try:
            set_window(s, window)
            if local_port is not None:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("::" if fam == socket.AF_INET6 else "0.0.0.0", local_port))
                except OSError as e:
                    raise UsageError(f"--cport: cannot use local port {local_port}: {e.strerror or e}",
                                     "choose another --cport, or leave it out") from None
            s.settimeout(timeout)
            s.connect(addr)
        except UsageError:
            s.close()
            raise
        except socket.timeout:
            s.close()
            raise MachineError(f"cannot connect to {host} port {port}: no answer within {timeout:g} s") from None
        except OSError as e:
            s.close()
            last = e
            continue
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s
    why = getattr(last, "strerror", None) or last
    raise MachineError(f"cannot connect to {host} port {port}: {why}",
                       "is `gpubench net server` running there, on that --port and --bind?")


def _refusal(reply: Any, what: str, wanted: str = "ok=true") -> str:
    """Why a reply is not the one asked for: the server's error line, else what it sent."""
    err = reply.get("error") if isinstance(reply, dict) else None
    if isinstance(err, str) and err.strip():
        return f"{what}: {err}"
    return f"sent a reply without {wanted} or an error: {shown(reply, 80)}"


def _server_error(host: str, port: int, msg: Any) -> MachineError:
    """A fault line naming the server (what it said escaped by core.safe.term)."""
    return MachineError(f"server {host} port {port}: {safe.term(msg, 200)}")


class ServerLied(MachineError):
    """The server sent something a real server cannot (a count over what was sent, a bad interval)."""


def _finite_number(v: Any) -> TypeGuard[int | float]:
    return type(v) in (int, float) and (type(v) is float or abs(v) <= MAX_WIRE_INT) and math.isfinite(v)


def _bad_count(x: Any, name: str) -> str | None:
    """Why ``x`` (``name``) is not a count of bytes: None when it is an integer 0 to MAX_WIRE_INT."""
    return None if wire_int(x) else f"{name} {safe.term(shown(x))} is not an integer 0 to {MAX_WIRE_INT}"


def parse_interval(msg: Any, index: int, req: Request, prev_end: float, ceiling: list[int] | None) -> Interval:
    """The server's interval ``index`` (bytes it received per c2s stream), checked against the
    schedule, ``prev_end`` (end_s of the previous one) and ``ceiling`` (per stream, bytes the
    client sent that earlier intervals did not count, plus one write; None: nothing flows c2s).
    Raises ServerLied: a wrong index, omit flag, time or count list, or a count over the ceiling."""
    def lie(what: str) -> ServerLied:
        return ServerLied(f"server sent a bad interval {index}: {what}")

    if not isinstance(msg, dict) or type(msg.get("interval")) is not int or msg["interval"] != index:
        raise lie(f"expected interval {index}, got {safe.term(shown(msg if not isinstance(msg, dict) else msg.get('interval')))}")
    end_sched, omitted = req.intervals()[index]
    if msg.get("omit") is not omitted:
        raise lie(f"omit must be {json.dumps(omitted)}")
    a, e = msg.get("start_s"), msg.get("end_s")
    if not (_finite_number(a) and _finite_number(e)):
        raise lie("start_s and end_s must be finite numbers")
    a, e = float(a), float(e)
    if abs(a - prev_end) > 1e-6 or e < a:
        raise lie(f"{a:g}-{e:g} s does not follow the previous interval's end {prev_end:g} s")
    if e < end_sched - 1e-3 or e > end_sched + req.interval + 60.0:
        raise lie(f"ends at {e:g} s, the schedule says {end_sched:g} s")
    b = msg.get("bytes")
    want = req.streams if ceiling is not None else 0
    if not isinstance(b, list) or len(b) != want:
        raise lie(f"bytes must be a list of {want} counts")
    for k, x in enumerate(b):
        if why := _bad_count(x, f"stream {k}'s count"):
            raise lie(why)
        if ceiling is not None and x > ceiling[k]:
            raise lie(f"stream {k} received {x} bytes, more than the client had sent ({ceiling[k]} at most)")
    return Interval(start_s=a, end_s=e, omit=omitted, bytes=list(b))


def parse_end(msg: Any, req: Request, wall_s: float, received: list[int] | None) -> dict:
    """The server's end line, checked: CPU seconds per role (at most (``wall_s`` + 5) x streams),
    and per s2c stream TCP_INFO and bytes sent (not fewer than ``received``; None: no s2c). Returns
    {"cpu_s": {"send": float | None, "recv": float | None}, "tcp": [dict | None], "sent": [int]}.
    Raises ServerLied: not an end line, or a value out of its bounds."""
    def lie(what: str) -> ServerLied:
        return ServerLied(f"server sent a bad end line: {what}")

    if not isinstance(msg, dict) or msg.get("end") is not True:
        raise lie(f"got {safe.term(shown(msg, 60))}")
    cpu = msg.get("cpu_s")
    if not isinstance(cpu, dict):
        raise lie("cpu_s must be an object")
    bound = (wall_s + 5.0) * req.streams
    out_cpu: dict[str, float | None] = {}
    for role in ("send", "recv"):
        v = cpu.get(role)
        if v is not None and not (_finite_number(v) and 0 <= v <= bound):
            raise lie(f"cpu_s.{role} {safe.term(shown(v))} is not 0 to {bound:g} seconds")
        out_cpu[role] = None if v is None else float(v)
    n = req.streams if received is not None else 0
    tcp, sent = msg.get("tcp"), msg.get("sent")
    if not (isinstance(tcp, list) and len(tcp) == n and isinstance(sent, list) and len(sent) == n):
        raise lie(f"tcp and sent must be lists of {n}")
    fields = (*TCP_INFO_FIELDS, "cwnd_bytes")
    for k, t in enumerate(tcp):
        if t is not None and not isinstance(t, dict):
            raise lie(f"tcp[{k}] must be an object or null")
        for name in fields:
            if t and name in t and (why := _bad_count(t[name], f"tcp[{k}].{name}")):
                raise lie(why)
    infos = [None if t is None else {n: t[n] for n in fields if n in t} for t in tcp]
    for k, x in enumerate(sent):
        if why := _bad_count(x, f"sent[{k}]"):
            raise lie(why)
        if received is not None and x < received[k]:
            raise lie(f"stream {k}: sent {x} bytes, fewer than the {received[k]} received")
    return {"cpu_s": out_cpu, "tcp": infos, "sent": list(sent)}


class _Session:
    """One test seen from the client: the control connection, the data streams and their workers."""

    def __init__(self, host: str, port: int, req: Request, connect_timeout: float, family: int = 0,
                 cport: int | None = None):
        self.host, self.port, self.req, self.connect_timeout = host, port, req, connect_timeout
        self.family, self.cport = family, cport
        self.schedule = req.intervals()
        self.expected = len(self.schedule)
        self.received = 0
        self.socks: dict[str, list[socket.socket]] = {d: [] for d in req.directions()}
        self.sets: dict[str, StreamSet] = {}
        self.ctl: socket.socket | None = None
        self.reader: LineReader | None = None
        self.t0: float | None = None
        self.s2c_end = self.server_end = 0.0  # end_s of the last s2c interval (counted here), of the server's last line
        self.counted_c2s = [0] * req.streams
        self.rx_prev = [0] * req.streams
        self.end: dict | None = None
        self.end_missing: str | None = None
        self.tcp_local: list[dict | None] = []
        self.window: dict[str, int] = {}
        # called with each interval as it arrives (direction -> Interval), before the test's end
        self.on_intervals: Callable[[dict[str, Interval]], None] | None = None

    def open(self) -> None:
        """Ask for the test, connect its streams, start the workers, release them at "start".
        Raises UsageError: no such host, --cport taken; MachineError: cannot connect, refused, no worker."""
        host, port, req = self.host, self.port, self.req
        self.ctl = connect(host, port, self.connect_timeout, family=self.family)
        self.reader = LineReader(self.ctl, MAX_LINE_BYTES)
        try:
            send_json(self.ctl, req.header(), timeout=self.connect_timeout)
            reply = self.reader.readjson(self.connect_timeout)
        except (OSError, ProtocolError) as e:
            raise _server_error(host, port, f"no reply to the request ({e})") from None
        if not isinstance(reply, dict) or reply.get("ok") is not True:
            raise _server_error(host, port, _refusal(reply, "refused the test"))
        cookie = reply.get("cookie")
        if not (isinstance(cookie, str) and 0 < len(cookie) <= 64):
            raise ServerLied(f"server {host} port {port}: the reply has no valid cookie")
        changed = [k for k, v in asdict(req).items() if k in reply and reply[k] != v]
        if changed:
            name = changed[0]
            raise ServerLied(f"server {host} port {port}: its reply changes {name} from {shown(getattr(req, name))} "
                             f"to {shown(reply[name])}")
        for n, (d, k) in enumerate(itertools.product(req.directions(), range(req.streams))):
            s = connect(host, port, self.connect_timeout, family=self.family, window=req.window,
                        local_port=None if self.cport is None else self.cport + n)
            self.socks[d].append(s)
            try:
                send_json(s, {"gpubench_net": PROTOCOL_VERSION, "role": "data", "cookie": cookie, "stream": k,
                              "direction": d})
            except OSError as e:
                raise _server_error(host, port, f"data stream {k} ({d}) failed: {e.strerror or e}") from None
        self.window = window_of(next(iter(self.socks.values()))[0])
        try:
            for d, role in (("c2s", "send"), ("s2c", "recv")):
                if d in self.socks:
                    st = self.sets[d] = StreamSet(self.socks[d], role, buffer=req.buffer, copy=req.copy,
                                                  rate=req.bitrate / 8)
                    st.start()
        except WorkerError as e:
            raise MachineError(f"net client: {e}") from None
        msg = self._read(self.connect_timeout + 5.0)
        if not (isinstance(msg, dict) and msg.get("start") is True):
            raise _server_error(host, port, _refusal(msg, "did not start the test", "start=true"))
        self.t0 = time.perf_counter()
        for d in ("s2c", "c2s"):  # receivers first
            if d in self.sets:
                self.sets[d].go()

    def _read(self, timeout: float) -> Any:
        assert self.reader is not None, "the net test has not started (_Session.open first)"
        try:
            return self.reader.readjson(timeout)
        except ProtocolError as e:
            raise _server_error(self.host, self.port, f"stopped answering during the test ({e})") from None

    def _reply(self, timeout: float) -> dict:
        """The next line during the test. Raises MachineError on an abort line or anything else."""
        msg = self._read(timeout)
        if not isinstance(msg, dict):
            raise _server_error(self.host, self.port, f"unexpected reply {shown(msg)}")
        if msg.get("ok") is False:
            err = msg.get("error")
            raise _server_error(self.host, self.port, f"aborted the test: {err}" if isinstance(err, str) and err.strip()
                                else "aborted the test without saying why")
        return msg

    def next_intervals(self) -> dict[str, Interval]:
        """The next interval of each direction: s2c counted here, c2s as the server reports it;
        after the last one, :meth:`finish`.
        Raises MachineError: the server stopped answering, aborted, ended early or lied; a stream failed."""
        t0 = self.t0
        assert t0 is not None, "the net test has not started (_Session.open first)"
        i = self.received
        end, omitted = self.schedule[i]
        out: dict[str, Interval] = {}
        rx = self.sets.get("s2c")
        if rx is not None:
            left = t0 + end - time.perf_counter()
            if left > 0:
                time.sleep(left)
            now = time.perf_counter() - t0
            snap = rx.counts()
            out["s2c"] = Interval(self.s2c_end, now, omitted, [a - b for a, b in zip(snap, self.rx_prev)])
            self.rx_prev, self.s2c_end = snap, now
        left = max(0.0, t0 + end - time.perf_counter())
        msg = self._reply(left + self.req.interval + 10.0)
        if msg.get("done") is True:
            raise _server_error(self.host, self.port, f"ended the test after {i} of {self.expected} intervals")
        tx = self.sets.get("c2s")
        ceiling = None
        if tx is not None:
            ceiling = [a - b + self.req.buffer for a, b in zip(tx.counts(), self.counted_c2s)]
        iv = parse_interval(msg, i, self.req, self.server_end, ceiling)
        self.server_end = iv.end_s
        if tx is not None:
            out["c2s"] = iv
            self.counted_c2s = [a + b for a, b in zip(self.counted_c2s, iv.bytes)]
        self.received += 1
        if self.on_intervals is not None:  # the last one too, before the drain and the end line
            self.on_intervals(out)
        if self.received == self.expected:
            self.finish()
        return out

    def finish(self) -> None:
        """After the last interval: "done", TCP_INFO of the senders, the streams closed, the end line.
        Raises MachineError: a line other than "done"; a data stream failed; ServerLied: a bad end line."""
        t0, reader = self.t0, self.reader
        assert t0 is not None and reader is not None, "the net test has not started (_Session.open first)"
        msg = self._reply(self.req.interval + 10.0)
        if msg.get("done") is not True:
            raise ServerLied(f"server {self.host} port {self.port}: sent more than the {self.expected} intervals asked for")
        tx, rx = self.sets.get("c2s"), self.sets.get("s2c")
        if tx is not None:
            self.tcp_local = tx.tcp_infos()
        for st in self.sets.values():
            st.close()
        wall = time.perf_counter() - t0
        try:
            end = reader.readjson(5.0 + 5.0)
        except ProtocolError as e:
            self.end_missing = str(e)
        else:
            self.end = parse_end(end, self.req, wall, rx.counts() if rx is not None else None)
        close_socket(self.ctl)
        failed = [f"stream {k}: {why}" for k, why in tx.errors()] if tx is not None else []
        failed += [w for st in self.sets.values() for w in st.worker_failures]
        if failed:
            raise _server_error(self.host, self.port, f"data stream failed: {failed[0]}")

    def facts(self, direction: str) -> "DirectionFacts":
        """What is known of ``direction`` besides its intervals (the s2c sender is the server)."""
        here = self.sets[direction].cpu_seconds if direction in self.sets else None
        end = self.end
        there = end["cpu_s"]["recv" if direction == "c2s" else "send"] if end is not None else None
        if direction == "c2s":
            return DirectionFacts(sent=self.sets["c2s"].counts() if "c2s" in self.sets else None,
                                  tcp=self.tcp_local, sender_cpu_s=here, receiver_cpu_s=there)
        return DirectionFacts(sent=end["sent"] if end is not None else None, tcp=end["tcp"] if end is not None else [],
                              sender_cpu_s=there, receiver_cpu_s=here)

    def close(self) -> None:
        """Stop the workers and close every connection; safe at any moment, and again."""
        for st in self.sets.values():
            st.close()
        for ss in self.socks.values():
            for s in ss:
                close_socket(s)
        close_socket(self.ctl)


def totals(intervals: list[Interval], stream: int | None = None) -> tuple[int, float]:
    """(bytes, seconds) over the counted (not omitted) intervals, of one stream or of all (None)."""
    counted = [iv for iv in intervals if not iv.omit]
    return (sum(iv.bytes[stream] if stream is not None else sum(iv.bytes) for iv in counted),
            sum((iv.seconds for iv in counted), 0.0))


@dataclass
class DirectionFacts:
    """What is known of one direction's test besides its intervals (None where unknown)."""

    sent: list[int] | None = None  # bytes each stream's sender handed to the kernel
    tcp: list[dict | None] = field(default_factory=list)  # TCP_INFO of each sending socket (stream.parse_tcp_info)
    # user + system seconds of that side's worker processes, from their start signal to their end
    sender_cpu_s: float | None = None
    receiver_cpu_s: float | None = None


def build_records(request: Request, intervals: list[Interval], sent: list[int] | None = None,
                  direction: str = "c2s", facts: DirectionFacts | None = None) -> list[Record]:
    """One Record per stream of ``direction``, then the total (stream "total"): nbytes = the write
    size, per counted interval with bytes one sample = seconds x buffer / bytes (nbytes / sample =
    B/s). ``extra`` (docs/net.md "Results (JSON)"): gbit_per_s = 8 x B/s / 1e9, gb_per_s = B/s / 1e9;
    on the total stalled_streams (empty counted intervals of :data:`STALL_S` or more) and
    cpu_s_per_gbit = (sender + receiver CPU s) / (8 x all_bytes / 1e9).
    """
    facts = facts or DirectionFacts(sent=sent)
    sent = facts.sent
    out = []
    streams = request.streams
    base = {"streams": streams, "buffer_nbytes": request.buffer, "direction": direction, "protocol": "tcp",
            "memory": "host"}
    tcp = facts.tcp if len(facts.tcp) == streams else [None] * streams
    stalled = []
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
        if k is not None:
            if sum(iv.seconds for iv, b in zip(intervals, per) if not iv.omit and b == 0) >= STALL_S:
                stalled.append(k)
            info = tcp[k] or {}
            extra.update({"retransmits": info.get("total_retrans"), "cwnd_bytes": info.get("cwnd_bytes"),
                          "rtt_us": info.get("rtt_us"), "snd_mss": info.get("snd_mss")})
        else:
            known = [r for r in (t.get("total_retrans") for t in tcp if t) if r is not None]
            all_bytes = sum(per)
            cpu = [c for c in (facts.sender_cpu_s, facts.receiver_cpu_s) if c is not None]
            extra.update({
                "retransmits": sum(known) if len(known) == streams else None,
                "sender_cpu_s": facts.sender_cpu_s,
                "receiver_cpu_s": facts.receiver_cpu_s,
                "all_bytes": all_bytes,
                "stalled_streams": stalled,
                "cpu_s_per_gbit": (sum(cpu) / (all_bytes * 8 / 1e9)) if len(cpu) == 2 and all_bytes > 0 else None,
            })
        err = None if samples else "no bytes received in a counted interval"
        out.append(Record(params={**base, "stream": k if k is not None else "total"}, metric="bandwidth",
                          nbytes=request.buffer, samples_s=samples, reps=1, error=err, extra=extra))
    return out


def interval_points(req: Request, host_bytes: int) -> list[Point]:
    """One point per interval of ``req``'s schedule, each holding ``host_bytes`` of host memory."""
    ends = req.intervals()
    starts = [0.0, *(end for end, _ in ends)]
    return [Point(f"{start:.1f}-{end:.1f} s" + (" (omitted)" if omitted else ""), i, host_bytes=host_bytes)
            for i, (start, (end, omitted)) in enumerate(zip(starts, ends))]


class Net(Benchmark):
    """The net client plug-in; ``live``: where the interval lines go as the test runs, or None."""

    name = "net"
    needs_gpu = False

    def __init__(self, live: LiveLines | None = None):
        self.live = live

    def environment(self, spec: NetSpec) -> dict:
        """The host, the versions (no GPU facts: no CuPy import) and the nodes: 1 on loopback, else 2."""
        from gpubench.core import env as envmod

        nodes = 1 if spec.mode == "local" or is_loopback(spec.host) else 2
        return {"host": envmod.host_info(), "versions": envmod.versions(), "nodes": nodes}

    def points(self, spec: NetSpec, devices: tuple[int, ...]) -> list[Point]:
        req = spec.request
        # the payload file, and per worker its memory and buffer (net local: both sides)
        workers = min(req.streams, MAX_WORKERS) * len(req.directions()) * (2 if spec.mode == "local" else 1)
        host = req.buffer + workers * (WORKER_BYTES + RECV_BYTES)
        return interval_points(req, host)

    def too_big_hint(self, spec: NetSpec) -> str:
        return "lower -l/--length"

    @contextlib.contextmanager
    def setup(self, ctx: Context):
        """Start the local server (net local), connect, start the workers; a signal meanwhile: :meth:`measure`."""
        spec: NetSpec = ctx.spec
        with contextlib.ExitStack() as stack:
            ctx.data["port"] = spec.port
            ctx.data["session"] = None
            try:
                host, port = spec.host, spec.port
                if spec.mode == "local":  # a server on loopback (a free port) in a thread, for one test
                    server = NetServer(spec.host, 0)  # loopback: "::1" with -6, else DEFAULT_BIND
                    stack.callback(server.close, 5.0)
                    host, port = server.start(max_tests=1)
                ctx.data["port"] = port
                family = {4: socket.AF_INET, 6: socket.AF_INET6}.get(spec.family, 0)
                session = ctx.data["session"] = _Session(host, port, spec.request, spec.connect_timeout, family,
                                                         spec.cport)
                stack.callback(session.close)
                session.open()
                if self.live is not None:  # the header line, then a line per interval as it arrives
                    live = self.live
                    where = (f"loopback {hostport(host, port)}" if spec.mode == "local"
                             else f"connected to {hostport(spec.host, port)}")
                    live.line(f"gpubench net: {where}: {test_words(asdict(spec.request), session.window)}")
                    session.on_intervals = lambda ivs: live.intervals(
                        {d: (iv.start_s, iv.end_s, iv.omit, iv.bytes) for d, iv in ivs.items()})
            except (KeyboardInterrupt, Interrupted) as e:
                ctx.data["interrupted"] = e
            yield ctx

    def measure(self, ctx: Context, point: Point) -> list[Record]:
        """The next interval of each direction. Raises MachineError: as next_intervals, or no end line."""
        stopped = ctx.data.pop("interrupted", None)
        if stopped is not None:
            raise stopped
        session: _Session = ctx.data["session"]
        ivs = session.next_intervals()
        recs = [iv.record(point.key, d) for d, iv in ivs.items()]
        if session.end_missing is not None:
            e = _server_error(session.host, session.port,
                              f"sent no end line after the test ({session.end_missing}); the intervals are kept, "
                              "the CPU times and TCP_INFO it carries are not known")
            e.point_records = recs
            raise e
        return recs

    def failed(self, ctx: Context, point: Point, message: str) -> list[Record]:
        """Raises MachineError, always: a memory failure while receiving is this host's fault."""
        raise MachineError(f"net client ({point.label}): {message}")

    def derive(self, ctx: Context, records: list[Record]) -> None:
        """Regroup the intervals into records per direction (:func:`build_records`)."""
        session: _Session | None = ctx.data.get("session")
        out: list[Record] = []
        for d in ctx.spec.request.directions():
            ivs = [Interval.of(r) for r in records if r.params.get("direction", "c2s") == d]
            if not ivs:
                continue
            facts = session.facts(d) if session is not None else DirectionFacts()
            out += build_records(ctx.spec.request, ivs, direction=d, facts=facts)
        records[:] = out

    def timing(self, ctx: Context) -> dict:
        req = ctx.spec.request
        session: _Session | None = ctx.data.get("session")
        sets = session.sets if session is not None else {}
        return {
            "clock": "perf_counter of the receiver (c2s: the server's; s2c: the client's)",
            "server_port": ctx.data["port"],
            "interval_s": req.interval,
            "omit_s": req.omit,
            "method": "bytes received per stream per interval, counted by the receiver; total = counted "
                      "bytes / counted seconds (intervals after --omit)",
            "data_path": {d: {"client_workers": st.nworkers, "zero_copy": not st.copy} for d, st in sets.items()},
            "socket_buffers": session.window if session is not None else {},
            "server_end_line": session.end_missing if session is not None else None,
            "protocol_version": PROTOCOL_VERSION,
        }


BENCHMARK = Net()


def run(spec: NetSpec, progress: ProgressSink | None = None, live: LiveLines | None = None) -> Result:
    """Run one test against a server (``net local``: one started here) through the driver. Returns a
    Result: per direction one record per stream and the total (:func:`build_records`); on Ctrl-C /
    SIGTERM the intervals received so far, marked partial. Raises UsageError: the host does not
    resolve, --cport is taken; MachineError: cannot connect, refused, or a failure during the test
    (``partial_result`` keeps the intervals received; :class:`ServerLied` for impossible figures)."""
    return driver.run(BENCHMARK if live is None else Net(live), spec, progress)


def run_local(request: Request, progress: ProgressSink | None = None) -> Result:
    """Run a server on loopback (a free port) in this process and one test against it, as :func:`run`."""
    return run(NetSpec(host=DEFAULT_BIND, port=0, request=request, mode="local"), progress)

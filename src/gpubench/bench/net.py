"""``gpubench net client`` / ``net local``: multi-stream TCP throughput (iperf-like), the sending
side as a plug-in of the one driver (:func:`gpubench.core.benchmark.run`).

What is timed (see docs/net.md): the client opens ``streams`` TCP connections and writes ``buffer``
bytes at a time on each as fast as it can; the *server* (the receiver,
:mod:`gpubench.bench.net_server`) counts the bytes each stream's ``recv_into`` returns and, every
``interval`` seconds of its own ``time.perf_counter`` clock, sends the per-stream byte counts of
that interval to the client (:mod:`gpubench.bench.net_protocol`). The first ``omit`` seconds are
reported but not counted (TCP slow start, as iperf3's ``--omit``). Figures are bytes *received*,
so data still in socket buffers when the test ends is never counted.

Formulas: an interval's rate = its bytes / its measured seconds. The total of a stream (or of all
streams) = bytes of the counted intervals / the sum of their measured seconds; this is the
duration-weighted mean of the interval rates, so it always lies between the smallest and the
largest counted interval rate (never above what the intervals show). Gbit/s = 8 * B/s / 1e9.

Through the driver: a point is one interval of the server's schedule. ``setup`` starts the
server (``net local``), connects, asks for the test, connects the streams and releases the
senders once the server says start; ``measure`` receives the next interval (the last one also
the server's "done"); ``derive`` turns the intervals into one record per stream and one for the
total. So an interrupt keeps the intervals received, and a fault during the test keeps them too
(``partial``, exit 3).
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

from gpubench.bench.net_protocol import (
    DEFAULT_BIND,
    MAX_LINE_BYTES,
    PROTOCOL_VERSION,
    LineReader,
    ProtocolError,
    Request,
    close_socket,
    send_json,
)
from gpubench.bench.net_server import RECV_BYTES, NetServer
from gpubench.core import benchmark as driver
from gpubench.core.benchmark import Benchmark, Context, Point
from gpubench.core.errors import MachineError, UsageError
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result


@dataclass(frozen=True)
class NetSpec:
    """Parsed options of ``gpubench net client`` / ``net local`` (checked by the command's
    :func:`gpubench.commands.net.build_request`; a Request is within the caps there).

    Attributes:
        host: the server's name or address.
        port: the server's TCP port (``net local``: 0, any free one; the one it got is in the
            result's timing, "server_port").
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

    def record(self, index: int) -> Record:
        """The interval as the driver's record of its point (regrouped by :meth:`Net.derive`)."""
        return Record(params={"interval": index}, nbytes=sum(self.bytes), samples_s=[self.seconds],
                      extra={"start_s": self.start_s, "end_s": self.end_s, "omit": self.omit, "bytes": self.bytes})

    @classmethod
    def of(cls, rec: Record) -> "Interval":
        """The interval a :meth:`record` holds."""
        e = rec.extra
        return cls(start_s=e["start_s"], end_s=e["end_s"], omit=e["omit"], bytes=e["bytes"])


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


def _parse_interval(msg: dict, streams: int) -> Interval | None:
    b = msg.get("bytes")
    a, e = msg.get("start_s"), msg.get("end_s")
    if not (isinstance(b, list) and len(b) == streams
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in b)):
        return None
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in (a, e)) or e < a:
        return None
    return Interval(start_s=float(a), end_s=float(e), omit=bool(msg.get("omit")), bytes=list(b))


class _Session:
    """One test seen from the client: the control connection, the data streams and their senders.

    Args:
        host, port: the server.
        req: the test asked for.
        connect_timeout: seconds to connect and for each reply before the test starts.
    """

    def __init__(self, host: str, port: int, req: Request, connect_timeout: float):
        self.host, self.port, self.req, self.connect_timeout = host, port, req, connect_timeout
        self.expected = len(req.intervals())
        self.received = 0
        self.stop, self.go = threading.Event(), threading.Event()
        self.senders: list[_Sender] = []
        self.data: list[socket.socket] = []
        self.ctl: socket.socket | None = None
        self.reader: LineReader | None = None

    @property
    def sent(self) -> list[int]:
        """Bytes each stream handed to the kernel."""
        return [t.sent for t in self.senders]

    def open(self) -> None:
        """Ask for the test, connect its streams, and release the senders when the server starts it.

        Raises:
            UsageError: the host name does not resolve.
            MachineError: cannot connect, the server refused the test (e.g. busy, over its caps),
                or did not start it.
        """
        host, port, req = self.host, self.port, self.req
        self.ctl = _connect(host, port, self.connect_timeout)
        self.reader = LineReader(self.ctl, MAX_LINE_BYTES)
        try:
            send_json(self.ctl, req.header(), timeout=self.connect_timeout)
            reply = self.reader.readjson(self.connect_timeout)
        except (OSError, ProtocolError) as e:
            raise _server_error(host, port, f"no reply to the request ({e})") from None
        if not isinstance(reply, dict) or reply.get("ok") is not True:
            err = reply.get("error") if isinstance(reply, dict) else reply
            raise _server_error(host, port, f"refused the test: {err}")
        cookie = reply.get("cookie")
        payload = _payload(req.buffer)
        for k in range(req.streams):
            s = _connect(host, port, self.connect_timeout)
            self.data.append(s)
            try:
                send_json(s, {"gpubench_net": PROTOCOL_VERSION, "role": "data", "cookie": cookie, "stream": k})
            except OSError as e:
                raise _server_error(host, port, f"data stream {k} failed: {e.strerror or e}") from None
            self.senders.append(_Sender(s, payload, self.go, self.stop))
        for t in self.senders:
            t.start()
        msg = self._read(self.connect_timeout + 5.0)
        if not (isinstance(msg, dict) and msg.get("start") is True):
            raise _server_error(host, port, msg.get("error") if isinstance(msg, dict) else msg)
        self.go.set()

    def _read(self, timeout: float) -> Any:
        try:
            return self.reader.readjson(timeout)
        except ProtocolError as e:
            raise _server_error(self.host, self.port, f"stopped answering during the test ({e})") from None

    def _reply(self) -> Any:
        """The next line during the test: an interval (a dict with "interval") or "done".

        Raises:
            MachineError: silence, a closed connection, an abort line or anything else.
        """
        msg = self._read(self.req.interval + 10.0)
        if not isinstance(msg, dict):
            raise _server_error(self.host, self.port, f"unexpected reply {str(msg)[:40]}")
        if msg.get("done") is not True and "interval" not in msg:
            raise _server_error(self.host, self.port, msg.get("error", f"unexpected reply {str(msg)[:40]}"))
        return msg

    def next_interval(self) -> Interval:
        """Receive the next interval; after the last one, the server's "done", then stop sending.

        Raises:
            MachineError: the server stopped answering, aborted the test (e.g. "server stopping"),
                sent a malformed interval or ended early; a data stream failed during the test.
        """
        msg = self._reply()
        if msg.get("done") is True:
            raise _server_error(self.host, self.port, f"ended the test after {self.received} of "
                                                      f"{self.expected} intervals")
        iv = _parse_interval(msg, self.req.streams)
        if iv is None:
            raise _server_error(self.host, self.port, f"malformed interval {str(msg)[:60]}")
        self.received += 1
        if self.received == self.expected:
            if self._reply().get("done") is not True:
                raise _server_error(self.host, self.port, f"sent more than the {self.expected} intervals asked for")
            self.close()
            errors = [f"stream {i}: {t.error}" for i, t in enumerate(self.senders) if t.error]
            if errors:
                raise _server_error(self.host, self.port, f"data stream failed: {errors[0]}")
        return iv

    def close(self) -> None:
        """Stop the senders (2 s each at most) and close every connection; again is harmless."""
        self.stop.set()
        for t in self.senders:
            t.join(2.0)
        for s in self.data:
            close_socket(s)
        close_socket(self.ctl)


@contextlib.contextmanager
def _local_server(streams: int) -> Iterator[int]:
    """A NetServer on 127.0.0.1 (a free port) in a thread of this process for one test; yields its port."""
    server = NetServer(DEFAULT_BIND, 0, max_handshakes=streams + 8)
    _, port = server.open()
    t = threading.Thread(target=server.serve_forever, kwargs={"max_tests": 1}, daemon=True, name="gpubench-net-server")
    t.start()
    try:
        yield port
    finally:
        server.stop()
        t.join(5.0)


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


# ---------------------------------------------------------------------------------------------
# The plug-in


class Net(Benchmark):
    """The net client plug-in: a point is one interval of the server's schedule (see the module)."""

    name = "net"
    description = "Multi-stream TCP throughput between two hosts (server, client, local)."
    needs_gpu = False

    def environment(self, spec: NetSpec) -> dict:
        """What net records of the machine: the host and the versions (no GPU facts: a TCP test
        uses no GPU, and finding them costs CuPy's import and CUDA/NVML queries before the client
        connects)."""
        from gpubench.core import env as envmod

        return {"host": envmod.host_info(), "versions": envmod.versions()}

    def points(self, spec: NetSpec, devices: tuple[int, ...]) -> list[Point]:
        req = spec.request
        # held at once: the payload, and in net local the server's receive buffer per stream
        host = req.buffer + (req.streams * RECV_BYTES if spec.mode == "local" else 0)
        out, start = [], 0.0
        for i, (end, omitted) in enumerate(req.intervals()):
            out.append(Point(f"{start:.1f}-{end:.1f} s" + (" (omitted)" if omitted else ""), i, host_bytes=host))
            start = end
        return out

    def too_big_hint(self, spec: NetSpec) -> str:
        return "lower -l/--length"

    @contextlib.contextmanager
    def setup(self, ctx: Context):
        spec: NetSpec = ctx.spec
        with contextlib.ExitStack() as stack:
            port = stack.enter_context(_local_server(spec.request.streams)) if spec.mode == "local" else spec.port
            ctx.data["port"] = port
            session = ctx.data["session"] = _Session(spec.host, port, spec.request, spec.connect_timeout)
            stack.callback(session.close)
            session.open()
            yield ctx

    def measure(self, ctx: Context, point: Point) -> list[Record]:
        return [ctx.data["session"].next_interval().record(point.key)]

    def failed(self, ctx: Context, point: Point, message: str) -> list[Record]:
        """Net allocates nothing per point: a memory failure while receiving is this host's fault.

        Raises:
            MachineError: always (the driver keeps the intervals received so far).
        """
        raise MachineError(f"net client ({point.label}): {message}")

    def derive(self, ctx: Context, records: list[Record]) -> None:
        """Regroup the intervals received into one record per stream and one for the total
        (:func:`build_records`); none received, no records."""
        if records:
            records[:] = build_records(ctx.spec.request, [Interval.of(r) for r in records], ctx.data["session"].sent)

    def timing(self, ctx: Context) -> dict:
        req = ctx.spec.request
        return {
            "clock": "perf_counter (server, the receiver)",
            "server_port": ctx.data["port"],
            "interval_s": req.interval,
            "omit_s": req.omit,
            "method": "bytes received per stream per interval, counted by the server; total = counted "
                      "bytes / counted seconds (intervals after --omit)",
            "protocol_version": PROTOCOL_VERSION,
        }


BENCHMARK = Net()


def run(spec: NetSpec, progress: ProgressSink | None = None) -> Result:
    """Run one test against a server (``net local``: one started here) through the driver.

    Args:
        spec: the parsed options.
        progress: advanced once per interval (silent when None).

    Returns:
        A Result with one record per stream and one for the total (stream "total"); see
        :func:`build_records`. On Ctrl-C / SIGTERM the intervals received so far, marked partial
        (none received: no records).

    Raises:
        UsageError: the host name does not resolve.
        MachineError: cannot connect, the server refused the test (e.g. busy, over its caps), or
            the server or the network failed during the test (``partial_result`` then keeps the
            intervals received).
    """
    return driver.run(BENCHMARK, spec, progress)


def run_local(request: Request, progress: ProgressSink | None = None) -> Result:
    """Run a server on 127.0.0.1 (a free port) in this process and one test against it.

    Raises:
        MachineError: as :func:`run`.
    """
    return run(NetSpec(host=DEFAULT_BIND, port=0, request=request, mode="local"), progress)

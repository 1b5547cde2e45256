"""``gpubench net client|local --protocol ucx``: UCX bandwidth (one point per interval of TCP's
schedule, sends completed per interval: tag_bw) and latency (one point per message size, 8 B
doubling to ``-l``; a sample = a batch's seconds / (2 x its round trips): tag_lat) through the
driver; the method: docs/net.md "UCX". Records: bandwidth as TCP's ``total``; latency ``metric``
"time", ``stream`` "latency", ``nbytes`` the size; both with params ``protocol`` "ucx", ``memory``,
``api`` and ``extra.transports``."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from gpubench.core import benchmark as driver
from gpubench.core import safe
from gpubench.core.benchmark import Context, Point
from gpubench.core.errors import MachineError
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result
from gpubench.core.signals import Interrupted
from gpubench.plugins.net import ucx
from gpubench.plugins.net.bench import DirectionFacts, Interval, Net, build_records, connect, interval_points
from gpubench.plugins.net.protocol import DEFAULT_BIND, Request, close_socket, is_loopback, shown
from gpubench.plugins.net.ucx_server import UCX_PROTOCOL_VERSION, Control, UcxServer, limit_to_loopback

LATENCY_MIN_BYTES = 8  # the sweep's first size (tag_lat's default -s 8)
BATCH_TARGET_S = 0.005  # a latency batch's length: round trips per batch = this / the last round trip


@dataclass(frozen=True)
class UcxSpec:
    """Parsed options of ``net client|local --protocol ucx`` (bounds checked by the command)."""

    host: str
    port: int
    mode: str = "client"  # or "local": a server process started here on loopback
    memory: tuple[str, str] = ("host", "host")  # (send, receive) buffers
    device: int = 0
    api: str = "tag"
    nbytes: int = 1 << 20  # -l: bytes per message (latency: the sweep's largest)
    in_flight: int = 32
    seconds: float = 10.0
    omit: float = 0.0
    interval: float = 1.0
    latency: bool = False
    wait: str = "poll"  # --wait: both sides spin on UCX progress (poll) or wait on its events (sleep)
    connect_timeout: float = 10.0
    protocol: str = "ucx"

    @property
    def request(self) -> Request:
        """The interval schedule as TCP's (one stream of ``nbytes`` writes)."""
        return Request(streams=1, seconds=self.seconds, omit=self.omit, interval=self.interval, buffer=self.nbytes)

    def memory_text(self) -> str:
        return self.memory[0] if self.memory[0] == self.memory[1] else ",".join(self.memory)

    def sizes(self) -> list[int]:
        """The latency sweep: 8 B doubling to ``nbytes``, ``nbytes`` last (also when not a power of 2)."""
        out, s = [], min(LATENCY_MIN_BYTES, self.nbytes)
        while s < self.nbytes:
            out.append(s)
            s *= 2
        return [*out, self.nbytes]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["memory"] = self.memory_text()
        if self.mode == "local":
            d["port"] = 0
        d.update(streams=1, buffer=self.nbytes, direction="c2s")
        return d


class _Client:
    """The client's test: the control connection, the UCX side, net local's server."""

    def __init__(self, spec: UcxSpec):
        self.spec = spec
        self.ctl: Any = None
        self.side: Any = None
        self.server: UcxServer | None = None
        self.host, self.port = spec.host, spec.port
        self.sent = 0  # sends completed so far
        self.t0: float | None = None
        self.info: dict[str, str] = {}
        self.end: dict | None = None

    def open(self) -> None:
        """Connect, ask for the test, exchange worker addresses, make the endpoint, wire it up.
        Raises MachineError: cannot connect, refused, or UCX cannot reach the server's worker."""
        spec = self.spec
        if spec.mode == "local":  # each test in a process of its own, as ucx_perftest's server
            self.server = UcxServer(DEFAULT_BIND, 0, device=spec.device)
            self.host, self.port = self.server.start(max_tests=1)
        if is_loopback(self.host):
            limit_to_loopback()
        sock = connect(self.host, self.port, spec.connect_timeout)
        self.ctl = Control(sock, 1 << 20, f"server {self.host} port {self.port}")
        self.side = ucx.Side(spec.api, spec.memory[0], spec.device, spec.wait)
        self.ctl.send({"gpubench_net_ucx": UCX_PROTOCOL_VERSION, "mode": "lat" if spec.latency else "bw",
                       "api": spec.api, "nbytes": spec.nbytes, "in_flight": spec.in_flight,
                       "memory": spec.memory[1], "wait": spec.wait, "address": self.side.address().hex(),
                       "pinned": ucx.host_buffers(spec.memory)})
        reply = self.ctl.read(spec.connect_timeout)
        if not (isinstance(reply, dict) and reply.get("ok") is True):
            err = reply.get("error") if isinstance(reply, dict) else None
            raise MachineError(f"server {self.host} port {self.port}: refused the test: "
                               f"{safe.term(err if isinstance(err, str) else shown(reply), 200)}")
        addr = reply.get("address")
        try:
            peer = bytes.fromhex(addr) if isinstance(addr, str) else b""
        except ValueError:
            peer = b""
        if not peer:
            raise MachineError(f"server {self.host} port {self.port}: its reply has no worker address")
        self.side.connect(peer)
        self.side.wireup(initiator=True, deadline_s=spec.connect_timeout, check=self.check)

    def check(self) -> None:
        """Between messages: a line from the server now is an abort (or it closed)."""
        msg = self.ctl.poll()
        if msg is not None:
            err = msg.get("error") if isinstance(msg, dict) else None
            raise ucx.PeerGone(f"server {self.host} port {self.port}: "
                           + (f"aborted the test: {safe.term(err, 200)}" if isinstance(err, str) else
                              f"sent {safe.term(shown(msg), 80)} during the test"))

    def finish(self, sent: int) -> dict:
        """Tell the server the test ended; its end line, checked.
        Raises MachineError: no end line, an abort, a count that is not ``sent``, or data that differ."""
        self.ctl.send({"stop": True, "sent": sent})
        msg = self.ctl.read(30.0)
        where = f"server {self.host} port {self.port}"
        if not (isinstance(msg, dict) and msg.get("end") is True):
            err = msg.get("error") if isinstance(msg, dict) else None
            raise MachineError(f"{where}: " + (f"aborted the test: {safe.term(err, 200)}" if isinstance(err, str)
                                               else f"sent no end line ({safe.term(shown(msg), 80)})"))
        got, check, cpu, info = msg.get("received"), msg.get("check"), msg.get("cpu_s"), msg.get("info")
        if type(got) is not int or (not self.spec.latency and got != sent):
            raise MachineError(f"{where}: received {safe.term(shown(got), 40)} message(s), {sent} were sent")
        if check is not None:
            raise MachineError(f"{where}: data check failed: {safe.term(check, 200)}")
        self.info["server"] = info[:60000] if isinstance(info, str) else ""
        cpu_ok = isinstance(cpu, (int, float)) and not isinstance(cpu, bool) and 0 <= cpu < 1e7
        self.end = {"received": got, "server_cpu_s": float(cpu) if cpu_ok and cpu is not None else None,
                    "server_host_pinned": msg.get("host_pinned") is True,
                    "server": ucx.parse_endpoint_info(self.info["server"], self.spec.api)}
        return self.end

    def close(self) -> None:
        if self.side is not None:
            self.side.close()
        if self.ctl is not None:
            close_socket(self.ctl.sock)
        if self.server is not None:
            self.server.close()


def transports(client_text: str, server: dict | None, spec: UcxSpec, nbytes: int) -> dict:
    """``extra.transports``: per endpoint (client, server) its lanes and the protocol row that
    ``nbytes`` messages from its memory use; None for the server of a bandwidth test (it only receives)."""
    client = ucx.parse_endpoint_info(client_text, spec.api)
    out = {"client": {"lanes": client["lanes"], "carried_by": ucx.carried_by(client, nbytes, spec.memory[0])}}
    if server is not None:
        out["server"] = {"lanes": server["lanes"][:32],
                         "carried_by": ucx.carried_by(server, nbytes, spec.memory[1]) if spec.latency else None}
    return out


class UcxNet(Net):
    """The UCX client plug-in (see the module); ``live`` as :class:`Net`'s."""

    def environment(self, spec: Any) -> dict:
        ucx_env = {k: v for k, v in os.environ.items() if k.startswith("UCX_")}
        return {**super().environment(spec), "ucx_env": ucx_env}

    def points(self, spec: Any, devices: tuple[int, ...]) -> list[Point]:
        host = spec.nbytes * 2
        if spec.latency:
            return [Point(f"{s} B", s, host_bytes=host) for s in spec.sizes()]
        return interval_points(spec.request, host)

    @contextlib.contextmanager
    def setup(self, ctx: Context):
        """Start the local server (net local), connect, wire up; a signal meanwhile: :meth:`measure`."""
        spec: UcxSpec = ctx.spec
        client = ctx.data["client"] = _Client(spec)
        try:
            try:
                client.open()
                n = spec.nbytes
                pin = ucx.host_buffers(spec.memory)
                ctx.data["out"] = ucx.alloc(n, spec.memory[0], spec.device, ucx.pattern(n), pinned=pin)
                ctx.data["back"] = ucx.alloc(n, spec.memory[0], spec.device, pinned=pin) if spec.latency else None
                if self.live is not None:
                    where = "loopback" if spec.mode == "local" else "connected to"
                    what = "latency (ping-pong), 8 B to" if spec.latency else f"{spec.in_flight} in flight,"
                    self.live.line(f"gpubench net --protocol ucx: {where} {client.host}:{client.port}: {spec.api} API, "
                                     f"{what} {n} B messages, memory {spec.memory[0]} -> {spec.memory[1]}; "
                                     + (f"{spec.seconds:g} s for the sweep" if spec.latency else
                                        f"{spec.seconds:g} s counted after {spec.omit:g} s omitted, "
                                        f"{spec.interval:g} s intervals"))
            except (KeyboardInterrupt, Interrupted) as e:
                ctx.data["interrupted"] = e
            yield ctx
        finally:
            client.close()

    def measure(self, ctx: Context, point: Point) -> list[Record]:
        stopped = ctx.data.pop("interrupted", None)
        if stopped is not None:
            raise stopped
        return (self._latency if ctx.spec.latency else self._interval)(ctx, ctx.data["client"], point)

    def _interval(self, ctx: Context, client: _Client, point: Point) -> list[Record]:
        spec: UcxSpec = ctx.spec
        side = client.side
        schedule = spec.request.intervals()
        if client.t0 is None:
            client.t0 = time.perf_counter()
            side.start_sending(ctx.data["out"], spec.in_flight)
        t0 = client.t0
        end_s, omit = schedule[point.key]
        start_s = ctx.data.get("prev_end", 0.0)
        got = side.send_for(t0 + end_s, client.check)
        client.sent += got
        now_s = time.perf_counter() - t0
        ctx.data["prev_end"] = now_s
        if "client" not in client.info:
            client.info["client"] = side.info()  # protocols are chosen at the first send: now known
        rec = Interval(start_s=start_s, end_s=now_s, omit=omit, bytes=[got * spec.nbytes]).record(point.key)
        if self.live is not None:
            self.live.intervals({"c2s": (start_s, now_s, omit, [got * spec.nbytes])})
        if point.key == len(schedule) - 1:
            self._finish(client, [rec])
        return [rec]

    def _finish(self, client: _Client, recs: list[Record]) -> None:
        """After the last point: drain the window, the server's end line. A fault keeps ``recs``."""
        try:
            if not client.spec.latency:
                client.sent += client.side.finish_sending(client.check)
            client.finish(client.sent)
        except MachineError as e:
            e.point_records = recs
            raise

    def _latency(self, ctx: Context, client: _Client, point: Point) -> list[Record]:
        spec: UcxSpec = ctx.spec
        size = point.key
        out, back = ctx.data["out"][:size], ctx.data["back"][:size]
        side = client.side
        per_size = spec.seconds / len(spec.sizes())

        def batch(k: int) -> float:
            client.ctl.send({"size": size, "iters": k + 1})
            return side.ping(out, back, k + 1, client.check)  # the first round trip is not timed: k timed

        samples: list[float] = []
        k, trips = 4, 0
        batch(k)  # warm-up: registration, protocol selection
        if "client" not in client.info:
            client.info["client"] = side.info()
        t_end = time.perf_counter() + per_size
        while not samples or time.perf_counter() < t_end:
            secs = batch(k)
            samples.append(secs / (2 * k))
            trips += k
            k = max(1, min(100_000, int(BATCH_TARGET_S / max(secs / k, 1e-7))))
        bad = ucx.first_mismatch(back, out)
        if bad is not None:
            raise MachineError(f"net --latency: byte {bad} of the {size} B message came back changed")
        if self.live is not None:
            med = sorted(samples)[len(samples) // 2]
            self.live.line(f"[LAT] {size:>10} B  {med * 1e6:10.2f} us one-way (median of {len(samples)} batches, "
                           f"{trips} round trips)")
        rec = Record(params={"stream": "latency", "streams": 1, "nbytes": size, "direction": "c2s"},
                     metric="time", nbytes=size, samples_s=samples, reps=1,
                     extra={"round_trips": trips, "batches": len(samples)})
        if size == spec.nbytes:
            self._finish(client, [rec])
        return [rec]

    def failed(self, ctx: Context, point: Point, message: str) -> list[Record]:
        raise MachineError(f"net --protocol ucx ({point.label}): {message}")

    def derive(self, ctx: Context, records: list[Record]) -> None:
        """Bandwidth: the intervals as TCP's ``total`` record; every record gets the UCX params and transports."""
        spec: UcxSpec = ctx.spec
        client: _Client | None = ctx.data.get("client")
        end = client.end if client is not None else None
        if not spec.latency and records:
            ivs = [Interval.of(r) for r in records]
            cpu = end.get("server_cpu_s") if end else None
            facts = DirectionFacts(sent=[client.sent * spec.nbytes] if client is not None else None,
                                   receiver_cpu_s=cpu)
            records[:] = [r for r in build_records(spec.request, ivs, direction="c2s", facts=facts)
                          if r.params["stream"] == "total"]
            for r in records:
                r.extra.pop("retransmits", None)
                r.extra["in_flight"] = spec.in_flight
                r.extra["messages"] = [b // spec.nbytes for b in r.extra["interval_bytes"]]
        info = client.info.get("client", "") if client is not None else ""
        for r in records:
            r.params.update(protocol="ucx", memory=spec.memory_text(), api=spec.api)
            r.extra["transports"] = transports(info, end.get("server") if end else None, spec, r.nbytes)
            r.extra["data_checked"] = end is not None

    def timing(self, ctx: Context) -> dict:
        spec: UcxSpec = ctx.spec
        client: _Client | None = ctx.data.get("client")
        if spec.latency:
            method = ("ping-pong (tag_lat): per size, batches of round trips; one-way latency = batch "
                      "seconds / (2 x round trips); the first round trip of each batch is not timed")
        else:
            method = (f"tag_bw: {spec.in_flight} sends of -l bytes kept in flight from one buffer; bytes = "
                      "sends completed per interval on the client's clock; total = counted bytes / counted seconds")
        end = client.end if client is not None else None
        out_buf = ctx.data.get("out")
        pin = ucx.host_buffers(spec.memory)
        sides = {"client": (spec.memory[0], None if out_buf is None else pin and ucx.is_pinned(out_buf)),
                 "server": (spec.memory[1], None if end is None else end.get("server_host_pinned"))}
        # per side: "cuda", or host memory page-locked (cudaHostAlloc) or pageable (ucx.host_buffers)
        buffers = {k: m if m == "cuda" else "host, page-locked" if pinned else "host, pageable" if pinned is False
                   else "host" for k, (m, pinned) in sides.items()}
        return {"clock": "perf_counter of the client", "method": method, "wait": spec.wait, "interval_s": spec.interval,
                "buffers": buffers,
                "omit_s": spec.omit, "server_port": client.port if client is not None else spec.port,
                "endpoint_error_handling": False,
                "endpoint_info": {k: v[:20000] for k, v in (client.info.items() if client else [])}}


def run(spec: UcxSpec, progress: ProgressSink | None = None, live: Any = None) -> Result:
    """One UCX test through the driver: a Result (the module's records; on Ctrl-C / SIGTERM what
    was measured, marked partial).
    Raises UsageError: UCXX missing, ``-m cuda`` without a GPU; MachineError: a failure with the server."""
    ucx.require_ucx()
    ucx.require_cuda(spec.memory if spec.mode == "local" else (spec.memory[0], "host"), spec.device)
    return driver.run(UcxNet(live), spec, progress)



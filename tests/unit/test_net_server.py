"""gpubench net server under abuse, in process, over loopback with real sockets and real transfers:
silent, malformed, oversized and greedy clients, 200 clients at once, a client that vanishes,
a stranger's data stream, and a stop in the middle of a test. After each, the server serves the
next test and its threads return to where they were."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from gpubench.bench.net import NetSpec, run
from gpubench.bench.net_protocol import PROTOCOL_VERSION, LineReader, Request
from gpubench.bench.net_server import NetServer
from gpubench.core.errors import MachineError

QUICK = Request(streams=2, seconds=0.2, interval=0.1, buffer=64 * 1024)


class Served:
    """A NetServer on 127.0.0.1 (a free port) in a thread, with short timeouts and a log."""

    def __init__(self, **kw):
        self.lines: list[str] = []
        opts = dict(header_timeout=0.5, setup_timeout=1.0, drain_timeout=1.0, stall_timeout=1.0)
        opts.update(kw)
        self.server = NetServer("127.0.0.1", 0, log=self.lines.append, **opts)
        self.host, self.port = self.server.open()
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def connect(self) -> socket.socket:
        return socket.create_connection((self.host, self.port), timeout=5)

    def test(self, req: Request = QUICK):
        return run(NetSpec(self.host, self.port, req, connect_timeout=5.0))

    def wait_idle(self, timeout: float = 5.0) -> float:
        """Seconds until no test runs and no connection is being handled."""
        t0 = time.monotonic()
        while self.server.busy or self.server._threads:
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"server still busy after {timeout} s: {self.lines[-3:]}")
            time.sleep(0.02)
        return time.monotonic() - t0

    def close(self):
        self.server.stop()
        self.thread.join(5)
        assert not self.thread.is_alive()


@pytest.fixture
def srv():
    s = Served()
    yield s
    s.close()


def _reply(sock: socket.socket, timeout: float = 5.0) -> dict:
    return LineReader(sock, 65536).readjson(timeout)


def _check_next_test_works(srv: Served) -> None:
    res = srv.test()
    total = res.records[-1]
    assert total.params["stream"] == "total" and total.extra["counted_bytes"] > 0
    srv.wait_idle()


def _server_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("gpubench-net"))


def test_default_bind_is_loopback_only():
    s = NetServer(port=0)
    addr, port = s.open()
    try:
        assert addr == "127.0.0.1"
        # the kernel's own table: the only listener on this port is 127.0.0.1 (0100007F)
        with open("/proc/net/tcp") as f:
            rows = [line.split() for line in f.readlines()[1:]]
        listening = [r[1] for r in rows if r[3] == "0A" and int(r[1].split(":")[1], 16) == port]
        assert listening == [f"0100007F:{port:04X}"]
    finally:
        s._listener.close()


def test_a_real_test_reports_every_interval(srv):
    res = srv.test(Request(streams=3, seconds=0.6, omit=0.2, interval=0.2, buffer=32 * 1024))
    assert [r.params["stream"] for r in res.records] == [0, 1, 2, "total"]
    total = res.records[-1]
    assert total.extra["interval_omit"] == [True, False, False, False]
    assert total.extra["counted_seconds"] == pytest.approx(total.extra["interval_end_s"][-1] - total.extra["interval_end_s"][0])
    assert total.extra["counted_seconds"] == pytest.approx(0.6, abs=0.3)
    assert total.extra["counted_bytes"] == sum(r.extra["counted_bytes"] for r in res.records[:3])
    assert total.extra["sent_bytes"] >= sum(total.extra["interval_bytes"])
    srv.wait_idle()
    assert srv.server.stats.tests_done == 1
    assert any("Gbit/s" in line for line in srv.lines)


def test_a_silent_client_is_timed_out_and_the_server_goes_on(srv):
    with srv.connect() as s:
        t0 = time.monotonic()
        reply = _reply(s)
        waited = time.monotonic() - t0
    assert reply == {"ok": False, "error": "no request line within 0.5 s"}
    assert 0.4 < waited < 3.0
    _check_next_test_works(srv)


@pytest.mark.parametrize("payload, fragment", [
    (b"hello\n", "not a JSON line"),
    (b"\xff\xfe\x00\n", "not a JSON line"),
    (b"[1, 2]\n", "JSON object"),
    (b"{}\n", "protocol version"),
    (json.dumps({"gpubench_net": 99, "role": "control"}).encode() + b"\n", "protocol version 99"),
    (json.dumps({**Request().header(), "streams": "many"}).encode() + b"\n", "streams must be an integer"),
    (json.dumps({"gpubench_net": PROTOCOL_VERSION, "role": "data", "cookie": "00", "stream": 0}).encode() + b"\n",
     "data stream for no running test"),
    (json.dumps({"gpubench_net": PROTOCOL_VERSION, "role": "shell"}).encode() + b"\n", "role"),
    (json.dumps({"gpubench_net": PROTOCOL_VERSION, "role": "data", "cookie": "\u00e9\u4e2d", "stream": 0}).encode()
     + b"\n", "data stream for no running test"),
    (json.dumps({"gpubench_net": PROTOCOL_VERSION, "role": "data", "cookie": ["x"], "stream": 0}).encode() + b"\n",
     "data stream for no running test"),
])
def test_a_malformed_request_is_refused_with_one_line(srv, payload, fragment):
    with srv.connect() as s:
        s.sendall(payload)
        reply = _reply(s)
    assert reply["ok"] is False and fragment in reply["error"]
    _check_next_test_works(srv)


def test_an_oversized_request_is_refused_after_4096_bytes(srv):
    with srv.connect() as s:
        def flood():
            try:
                s.sendall(b"x" * (32 * 2**20))  # 32 MiB, no newline
            except OSError:
                pass

        t = threading.Thread(target=flood, daemon=True)
        t.start()
        reply = _reply(s)
        assert reply == {"ok": False, "error": "request longer than 4096 bytes"}
        t.join(5)
        assert not t.is_alive()  # the server closed: the flood could not go on
    _check_next_test_works(srv)


@pytest.mark.parametrize("ask, fragment", [
    ({"streams": 10_000}, "streams 10000 out of range: 1 to 128"),
    ({"seconds": 365 * 24 * 3600}, "at most 3600"),
    ({"buffer": 2**40}, "buffer 1099511627776 out of range"),
])
def test_a_greedy_request_is_refused(srv, ask, fragment):
    with srv.connect() as s:
        s.sendall(json.dumps({**Request().header(), **ask}).encode() + b"\n")
        reply = _reply(s)
    assert reply["ok"] is False and fragment in reply["error"]
    _check_next_test_works(srv)


def test_a_greedy_client_gets_one_line_through_the_client_too(srv):
    with pytest.raises(MachineError, match="refused the test: streams 129 out of range"):
        srv.test(Request(streams=129, seconds=0.2, interval=0.2))


def test_200_clients_at_once_one_test_at_a_time_the_rest_busy():
    srv = Served(setup_timeout=5.0)  # the winner's stream may queue behind the burst
    try:
        _200_at_once(srv)
    finally:
        srv.close()


def _200_at_once(srv):
    base = _server_threads()
    n = 200
    barrier = threading.Barrier(n)
    outcomes: list = [None] * n
    req = Request(streams=1, seconds=0.3, interval=0.3, buffer=16 * 1024)

    def one(i):
        barrier.wait()
        try:
            outcomes[i] = srv.test(req)
        except MachineError as e:
            outcomes[i] = e.message

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    done = [o for o in outcomes if not isinstance(o, str)]
    refused = [o for o in outcomes if isinstance(o, str)]
    assert done, "no client got its test run"
    assert all("busy" in m for m in refused), sorted(set(refused))[:3]
    assert len(done) + len(refused) == n
    # one test at a time: the completed tests never overlapped, so each moved real data
    assert all(o.records[-1].extra["counted_bytes"] > 0 for o in done)
    assert srv.server.stats.tests_done == len(done)
    srv.wait_idle()
    assert _server_threads() <= base
    _check_next_test_works(srv)


def test_a_client_that_vanishes_mid_test_frees_the_server_at_once(srv):
    ctl, reader, data = _raw_test(srv, Request(streams=2, seconds=60, interval=1.0))
    for d in data:
        d.sendall(b"z" * 100_000)
    assert srv.server.busy
    for s in [*data, ctl]:
        s.close()  # gone without a word
    assert srv.wait_idle() < 3.0  # not the 60 s asked for
    assert srv.server.stats.tests_aborted == 1
    assert any("aborted" in line for line in srv.lines)
    _check_next_test_works(srv)


def _raw_test(srv: Served, req: Request):
    """Start a test by hand: returns (control socket, its reader, data sockets) after "start"."""
    ctl = srv.connect()
    ctl.sendall(json.dumps(req.header()).encode() + b"\n")
    reader = LineReader(ctl, 65536)
    ok = reader.readjson(5)
    assert ok["ok"] is True
    data = []
    for k in range(req.streams):
        d = srv.connect()
        d.sendall(json.dumps({"gpubench_net": 1, "role": "data", "cookie": ok["cookie"], "stream": k}).encode() + b"\n")
        data.append(d)
    assert reader.readjson(5) == {"start": True}
    return ctl, reader, data


def test_a_client_that_goes_silent_without_closing_is_dropped_after_the_stall_timeout(srv):
    ctl, reader, data = _raw_test(srv, Request(streams=2, seconds=60, interval=0.2))
    try:
        for d in data:
            d.sendall(b"z" * 10_000)
        t0 = time.monotonic()
        msgs = []
        while True:  # intervals, then the abort line
            m = reader.readjson(10)
            msgs.append(m)
            if "interval" not in m:
                break
        assert m == {"ok": False, "error": "no data on any stream for 1 s"}
        assert 0.9 < time.monotonic() - t0 < 3.0
        assert sum(sum(x["bytes"]) for x in msgs[:-1]) == 20_000, msgs  # every byte sent was counted
        srv.wait_idle()
    finally:
        for s in [*data, ctl]:
            s.close()
    _check_next_test_works(srv)


def test_a_strangers_data_stream_is_refused_during_a_test(srv):
    result: dict = {}
    t = threading.Thread(target=lambda: result.setdefault("r", srv.test(Request(streams=1, seconds=1.0, interval=0.5))),
                         daemon=True)
    t.start()
    t0 = time.monotonic()
    while not srv.server.busy and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    with srv.connect() as s:
        s.sendall(json.dumps({"gpubench_net": 1, "role": "data", "cookie": "f" * 32, "stream": 0}).encode() + b"\n")
        reply = _reply(s)
    assert reply == {"ok": False, "error": "data stream for no running test"}
    t.join(10)
    assert result["r"].records[-1].extra["counted_bytes"] > 0  # the real test was not disturbed


def test_stop_during_a_test_ends_it_quickly_and_the_client_says_so():
    s = Served()
    err: dict = {}

    def client():
        try:
            s.test(Request(streams=2, seconds=30, interval=0.5))
        except MachineError as e:
            err["e"] = e.message

    t = threading.Thread(target=client, daemon=True)
    t.start()
    t0 = time.monotonic()
    while not s.server.busy and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    time.sleep(0.3)
    t1 = time.monotonic()
    s.close()
    t.join(10)
    assert time.monotonic() - t1 < 3.0
    assert "server stopping" in err["e"]


def test_stop_releases_connections_waiting_for_their_request_at_once():
    s = Served(header_timeout=30.0)
    socks = [s.connect() for _ in range(5)]
    time.sleep(0.2)
    t0 = time.monotonic()
    s.close()
    assert time.monotonic() - t0 < 2.0  # not the 30 s header timeout
    replies = [_reply(x) for x in socks]
    for x in socks:
        x.close()
    assert all(r == {"ok": False, "error": "server stopping"} for r in replies)


def test_threads_and_connections_stay_bounded_under_many_silent_clients():
    s = Served(max_handshakes=8, slot_wait=0.05, header_timeout=0.5)
    try:
        base = _server_threads()
        socks = [s.connect() for _ in range(40)]  # silent: each holds a handshake until timed out
        time.sleep(0.2)
        assert _server_threads() - base <= 8
        replies = [_reply(x) for x in socks]
        for x in socks:
            x.close()
        assert all(r["ok"] is False for r in replies)
        assert {r["error"] for r in replies} <= {"no request line within 0.5 s",
                                                 "busy: too many connections at once; try again later"}
        s.wait_idle()
        assert _server_threads() <= base
        _check_next_test_works(s)
    finally:
        s.close()

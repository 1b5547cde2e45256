"""gpubench net server under abuse, in process, over loopback with real sockets and real transfers:
silent, malformed, oversized and greedy clients, 200 clients at once, 300 idle sockets, a client
that vanishes (in every direction), a stranger's data stream, and a stop in the middle of a test;
and a lying server against the client. After each, the server serves the next test and its
threads return to where they were."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from dataclasses import asdict

import pytest

from gpubench.plugins.net.bench import NetSpec, run
from gpubench.plugins.net.protocol import PROTOCOL_VERSION, LineReader, Request
from gpubench.plugins.net.server import NetServer
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
    # 1 s, paced: a 0.2 s test (QUICK) can end before a loaded host's stream workers send a byte
    res = srv.test(Request(streams=2, seconds=1.0, interval=0.5, buffer=64 * 1024, bitrate=1_000_000_000))
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
    # true and 2.0 are not the integer 2; a 400-digit count still gets its reply
    (json.dumps({**Request().header(), "gpubench_net": True}).encode() + b"\n", "protocol version true"),
    (json.dumps({**Request().header(), "gpubench_net": 2.0}).encode() + b"\n", "protocol version 2.0"),
    (json.dumps({**Request().header(), "streams": 10**400}).encode() + b"\n", "is too large"),
    (json.dumps({**Request().header(), "buffer": 1.0}).encode() + b"\n", "buffer must be an integer, got 1.0"),
    (json.dumps(Request().header()).encode("utf-16") + b"\n", "not a JSON line"),  # UTF-8 only
    (b"[" * 2000 + b"]" * 2000 + b"\n", "not a JSON line"),  # deeper than the parser goes
    # a key named twice: which value counts is not JSON's to say (the result loader refuses it too)
    (json.dumps(Request().header()).encode()[:-1] + b', "streams": 2}\n', "repeats the key 'streams'"),
    (json.dumps({"gpubench_net": True, "role": "data", "cookie": "00", "stream": 0}).encode() + b"\n",
     "protocol version true"),
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
        s.sendall(b"x" * 8192)  # past the limit at once: a flood thread starting late under load is not timed out

        def flood():
            try:
                s.sendall(b"x" * (32 * 2**20))  # 32 MiB more, no newline
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
    ({"seconds": 365 * 24 * 3600}, "0.1 to 3600"),
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
    srv = Served(setup_timeout=5.0, header_timeout=5.0)  # the winner's lines may queue behind the burst
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
    assert all("busy" in m for m in refused), sorted(set(m for m in refused if "busy" not in m))[:3]
    assert len(done) + len(refused) == n
    # A completed test moved data, or its total says it did not (no figure is made of it). Seen
    # once in CI: the winner's sender (a thread of this process, behind 199 others at the barrier
    # on 2 busy cores) began writing only after the server's 0.3 s had been counted. The server
    # counts from the "start" it sends (as iperf3's from TEST_START), so that is a late sender,
    # not overlapping tests: those are ruled out by tests_done below and the "busy" refusals.
    for o in done:
        total = o.records[-1]
        assert total.params["stream"] == "total"
        assert (total.extra["counted_bytes"] > 0 and total.error is None) or \
            (total.extra["counted_bytes"] == 0 and total.error == "no bytes received in a counted interval"), total
    srv.wait_idle()  # the server counts a test after its last reply: the client may return first
    assert srv.server.stats.tests_done == len(done)
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
        for direction in req.directions():
            d = d if direction == req.directions()[0] else srv.connect()
            d.sendall(json.dumps({"gpubench_net": PROTOCOL_VERSION, "role": "data", "cookie": ok["cookie"], "stream": k,
                                  "direction": direction}).encode() + b"\n")
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
        s.sendall(json.dumps({"gpubench_net": PROTOCOL_VERSION, "role": "data", "cookie": "f" * 32, "stream": 0}).encode()
                  + b"\n")
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
    s = Served(max_pending=8, header_timeout=0.5)
    try:
        base = _server_threads()
        socks = [s.connect() for _ in range(40)]  # silent: each waits until timed out or pushed out
        time.sleep(0.2)
        assert _server_threads() == base  # waiting connections cost no thread
        replies = [_reply(x) for x in socks]
        for x in socks:
            x.close()
        errors = [r["error"] for r in replies if r["ok"] is False]
        assert len(errors) == 40
        assert set(errors) == {"no request line within 0.5 s", "busy: too many connections waiting to send their request"}
        assert errors.count("no request line within 0.5 s") == 8  # the last 8 waited their full time
        assert s.server.pending_peak == 8
        s.wait_idle()
        assert _server_threads() <= base
        _check_next_test_works(s)
    finally:
        s.close()


@pytest.mark.parametrize("max_pending", [512, 64])
def test_300_idle_sockets_do_not_starve_a_real_client(max_pending):
    """300 connections that never send a request do not make a real client's test fail ("no reply
    to the request within 10 s"): they wait in one selector (no thread each), the oldest goes when
    the cap is reached, and each has a deadline for its line (2 s by default)."""
    s = Served(max_pending=max_pending, header_timeout=10.0)  # the idle ones would hold out for 10 s
    idle = []
    try:
        for _ in range(300):
            idle.append(s.connect())
        time.sleep(0.3)
        t0 = time.monotonic()
        res = run(NetSpec(s.host, s.port, QUICK, connect_timeout=3.0))
        assert res.records[-1].extra["counted_bytes"] > 0
        assert time.monotonic() - t0 < 8.0  # served while the idle ones still wait (10 s), not after them
        assert s.server.pending_peak <= max_pending
    finally:
        for x in idle:
            x.close()
        s.close()


# -- reverse and bidir keep every protection --------------------------------------------------


@pytest.mark.parametrize("direction", ["s2c", "both"])
def test_reverse_and_bidir_tests_report_every_interval(srv, direction):
    req = Request(streams=2, seconds=0.6, omit=0.2, interval=0.2, buffer=32 * 1024, direction=direction)
    res = srv.test(req)
    dirs = req.directions()
    assert [(r.params["direction"], r.params["stream"]) for r in res.records] == [
        (d, k) for d in dirs for k in (0, 1, "total")]
    for total in (r for r in res.records if r.params["stream"] == "total"):
        e = total.extra
        assert e["interval_omit"] == [True, False, False, False] and e["counted_bytes"] > 0
        assert e["sent_bytes"] >= sum(e["interval_bytes"])  # the sender's count (the server's, for s2c)
        assert e["sender_cpu_s"] > 0 and e["receiver_cpu_s"] > 0 and e["cpu_s_per_gbit"] > 0
        assert e["retransmits"] is not None and e["retransmits"] >= 0
    srv.wait_idle()
    assert srv.server.stats.tests_done == 1


@pytest.mark.parametrize("direction", ["c2s", "s2c", "both"])
def test_the_server_logs_a_rate_for_each_direction_it_served(srv, direction):
    req = Request(streams=2, seconds=0.4, omit=0.2, interval=0.2, buffer=32 * 1024, direction=direction, bitrate=10**9)
    res = srv.test(req)
    srv.wait_idle()
    log = [line for line in srv.lines if line.startswith("test from")]
    assert "2 stream(s)" in log[0] and "paced at 1 Gbit/s per stream" in log[0] and "window: kernel" in log[0]
    want = {"c2s": "c2s (client -> server) received", "s2c": "s2c (server -> client) sent"}
    done = log[1:]
    assert len(done) == len(req.directions()), srv.lines
    for d, line in zip(req.directions(), done):
        m = re.search(re.escape(want[d]) + r" \S+ \S+ in (\d+\.\d+) s after 0.2 s omitted = (\d+\.\d\d) Gbit/s", line)
        assert m, line
        gbps = float(m.group(2))
        # two streams paced at 1 Gbit/s each, due times counted from the start: a sender starved
        # in the omitted 0.2 s catches up in the counted 0.4 s, so those carry at most what was
        # due by their end, (0.2 + 0.4) / 0.4 of the paced rate
        assert 0 < gbps <= 2 * (0.2 + 0.4) / 0.4 * 1.05
        if d == "c2s":  # the server received what the client reports
            total = next(r for r in res.records if r.params["stream"] == "total" and r.params["direction"] == d)
            assert gbps == pytest.approx(total.extra["gbit_per_s"], abs=0.006)


@pytest.mark.parametrize("direction", ["s2c", "both"])
def test_a_busy_server_refuses_a_second_test_in_any_direction(srv, direction):
    result: dict = {}
    first = Request(streams=1, seconds=1.0, interval=0.5, direction=direction)
    t = threading.Thread(target=lambda: result.setdefault("r", srv.test(first)), daemon=True)
    t.start()
    t0 = time.monotonic()
    while not srv.server.busy and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    with pytest.raises(MachineError, match="busy: a test is running"):
        srv.test(Request(streams=1, seconds=0.2, interval=0.2, direction="s2c"))
    t.join(10)
    assert result["r"].records[-1].extra["counted_bytes"] > 0


@pytest.mark.parametrize("direction", ["s2c", "both"])
def test_a_reverse_client_that_vanishes_frees_the_server_at_once(srv, direction):
    ctl, reader, data = _raw_test(srv, Request(streams=2, seconds=60, interval=1.0, direction=direction))
    time.sleep(0.3)
    assert srv.server.busy
    for x in [*data, ctl]:
        x.close()
    assert srv.wait_idle() < 3.0
    assert srv.server.stats.tests_aborted == 1
    _check_next_test_works(srv)


def test_a_reverse_client_that_stops_reading_is_dropped_after_the_stall_timeout(srv):
    ctl, reader, data = _raw_test(srv, Request(streams=1, seconds=60, interval=0.2, direction="s2c", window=4096))
    try:
        t0 = time.monotonic()
        while True:  # never read the data: the server's sends fill the buffers and stop
            m = reader.readjson(15)
            if "interval" not in m:
                break
        assert m == {"ok": False, "error": "no data on any stream for 1 s"}
        assert time.monotonic() - t0 < 6.0
        srv.wait_idle()
    finally:
        for x in [*data, ctl]:
            x.close()
    _check_next_test_works(srv)


def test_a_reverse_test_holds_its_stream_count_and_cookie(srv):
    """The s2c streams are checked like c2s ones: a direction not in the test, a stream index out
    of range and a second connection for the same stream are refused."""
    ctl = srv.connect()
    req = Request(streams=1, seconds=5, interval=1.0, direction="s2c")
    ctl.sendall(json.dumps(req.header()).encode() + b"\n")
    reader = LineReader(ctl, 65536)
    ok = reader.readjson(5)
    cookie = ok["cookie"]
    try:
        for header, fragment in [({"stream": 0, "direction": "c2s"}, "direction must be one of s2c"),
                                 ({"stream": 1, "direction": "s2c"}, "stream must be an integer 0 to 0"),
                                 ({"stream": True, "direction": "s2c"}, "stream must be an integer")]:
            with srv.connect() as x:
                x.sendall(json.dumps({"gpubench_net": PROTOCOL_VERSION, "role": "data", "cookie": cookie, **header}).encode()
                          + b"\n")
                assert fragment in _reply(x)["error"]
    finally:
        ctl.close()
    srv.wait_idle()
    _check_next_test_works(srv)


# -- a lying server: the client takes nothing it cannot bound ----------------------------------


class LyingServer:
    """A fake gpubench net server on loopback that follows the protocol up to "start" and then
    sends ``lines`` (JSON values, or raw bytes lines)."""

    def __init__(self, lines, reply=None):
        self.lines = lines
        self.reply = reply  # sent instead of the ok reply, when given
        self.lst = socket.socket()
        self.lst.bind(("127.0.0.1", 0))
        self.lst.listen(64)
        self.port = self.lst.getsockname()[1]
        self.t = threading.Thread(target=self._serve, daemon=True)
        self.t.start()

    def _serve(self):
        socks = []
        try:
            ctl, _ = self.lst.accept()
            socks.append(ctl)
            req = LineReader(ctl, 4096).readjson(5)
            if self.reply is not None:
                ctl.sendall(json.dumps(self.reply).encode() + b"\n")
                time.sleep(3)
                return
            ctl.sendall(json.dumps({"ok": True, "cookie": "ab" * 16, **req}).encode() + b"\n")
            n = req["streams"] * (2 if req["direction"] == "both" else 1)
            for _ in range(n):
                d, _ = self.lst.accept()
                socks.append(d)
            ctl.sendall(b'{"start": true}\n')
            for line in self.lines:
                ctl.sendall(line if isinstance(line, bytes) else json.dumps(line).encode() + b"\n")
            time.sleep(3)
        except OSError:
            pass
        finally:
            for x in socks:
                x.close()
            self.lst.close()


LIE_REQUEST = Request(streams=1, seconds=0.4, interval=0.2, buffer=1024)


def _lie(lines, req=LIE_REQUEST):
    liar = LyingServer(lines)
    t0 = time.monotonic()
    with pytest.raises(MachineError) as e:
        run(NetSpec("127.0.0.1", liar.port, req, connect_timeout=3.0))
    return e.value, time.monotonic() - t0


def test_a_400_digit_byte_count_is_refused_with_a_clear_line():
    """A 400-digit byte count from the server is named (exit 3), never an OverflowError ("int too
    large to convert to float") through the catch-all."""
    err, _ = _lie([{"interval": 0, "omit": False, "start_s": 0.0, "end_s": 0.2, "bytes": [10**400]}])
    assert err.exit_code == 3
    assert "server sent a bad interval 0: stream 0's count 1000000000000000000000000000000000000000..." in err.one_line()


def test_10000_intervals_beyond_the_schedule_end_the_run_at_once():
    """10,000 intervals beyond the schedule end the run at once (within 10 s), not after a minute."""
    lines = [{"interval": i, "omit": False, "start_s": 0.2 * i, "end_s": 0.2 * (i + 1), "bytes": [0]}
             for i in range(10_000)]
    err, took = _lie(lines)
    assert took < 10
    assert "server sent a bad interval" in err.one_line() or "more than the" in err.one_line()


def test_intervals_sent_ahead_of_time_are_refused():
    lines = [{"interval": 0, "omit": False, "start_s": 0.0, "end_s": 0.001, "bytes": [0]}]
    err, took = _lie(lines)
    assert "ends at 0.001 s, the schedule says 0.2 s" in err.one_line() and took < 5


def test_a_server_claiming_more_than_was_sent_is_refused():
    err, _ = _lie([{"interval": 0, "omit": False, "start_s": 0.0, "end_s": 0.2, "bytes": [2**62]}])
    assert "more than the client had sent" in err.one_line()


def test_a_servers_error_line_reaches_the_terminal_escaped():
    err, _ = _lie([{"ok": False, "error": "\x1b[2J\x1b]8;;http://evil\x07click\r\nfake line [bold]x[/]"}])
    line = err.one_line()
    assert "\x1b" not in line and "\r" not in line and "\n" not in line
    assert "\\x1b[2J" in line and "\\r\\n" in line


def test_a_reverse_test_against_a_lying_end_line_is_refused():
    req = Request(streams=1, seconds=0.2, interval=0.2, buffer=1024, direction="s2c")
    lines = [{"interval": 0, "omit": False, "start_s": 0.0, "end_s": 0.2, "bytes": []}, {"done": True},
             {"end": True, "cpu_s": {"send": 1e300, "recv": None}, "tcp": [None], "sent": [0]}]
    err, _ = _lie(lines, req)
    assert "server sent a bad end line: cpu_s.send" in err.one_line()


def test_done_without_an_end_line_keeps_the_intervals_and_exits_3():
    """"done" and then no end line (the server closes) is a fault, never exit 0 with a note. The end line
    carries the server's CPU times, TCP_INFO and bytes sent, and a real server always sends it: the
    intervals are kept (printed, saved partial) and the run is a fault, exit 3, saying so."""
    lines = [{"interval": 0, "omit": False, "start_s": 0.0, "end_s": 0.2, "bytes": [0]},
             {"interval": 1, "omit": False, "start_s": 0.2, "end_s": 0.4, "bytes": [0]}, {"done": True}]
    err, took = _lie(lines)
    assert err.exit_code == 3 and took < 20
    assert "sent no end line after the test" in err.one_line() and "the intervals are kept" in err.one_line()
    res = err.partial_result
    assert res is not None and res.partial and res.failed_by == err.one_line()
    total = [r for r in res.records if r.params["stream"] == "total"][0]
    assert total.extra["interval_end_s"] == [0.2, 0.4]  # the last interval too, not only those before it
    assert total.extra["sender_cpu_s"] is not None and total.extra["receiver_cpu_s"] is None


@pytest.mark.parametrize("reply,needle", [
    ({"ok": 1}, 'sent a reply without ok=true or an error: {"ok": 1}'),
    ({"ok": False}, 'sent a reply without ok=true or an error: {"ok": false}'),
    ({"ok": False, "error": None}, 'sent a reply without ok=true or an error: {"ok": false, "error": null}'),
    ({"ok": False, "error": "busy: a test is running"}, "refused the test: busy: a test is running"),
    ([1, 2], "sent a reply without ok=true or an error: [1, 2]"),
])
def test_a_reply_that_is_neither_ok_nor_an_error_is_worded_as_such(reply, needle):
    """A reply such as {"ok": 1} is quoted as neither ok nor an error, never "refused the test: None"."""
    liar = LyingServer([], reply=reply)
    with pytest.raises(MachineError) as e:
        run(NetSpec("127.0.0.1", liar.port, LIE_REQUEST, connect_timeout=3.0))
    assert needle in e.value.one_line() and "None" not in e.value.one_line(), e.value.one_line()


# -- small windows (-w 4-8 KiB) -------------------------------------------------------------------


def test_a_small_window_is_set_before_the_handshake_and_the_next_test_gets_the_kernels_again(srv):
    """-w 4KiB c2s: the listener holds the buffers before the streams connect (as iperf3 re-creates
    its listener), and is replaced once the test ends. SO_RCVBUF set on the accepted socket, after
    the handshake offered a window (and scale) for the default buffer, would make the 8 KiB buffer
    drop the 64 KiB loopback segments and stall the stream on retransmission timeouts."""
    default = socket.socket()
    want = default.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    default.close()
    res = srv.test(Request(streams=1, seconds=1.0, interval=0.5, buffer=128 * 1024, window=4096))
    total = res.records[-1]
    assert all(b > 2**20 for b in total.extra["interval_bytes"]), total.extra["interval_bytes"]
    srv.wait_idle()
    deadline = time.monotonic() + 3
    while srv.server._listener.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) != want:
        assert time.monotonic() < deadline, "the listener kept the last test's -w buffer"
        time.sleep(0.05)
    _check_next_test_works(srv)
    # a test that asks for a window right after one that did not, and the other way round
    for window in (8192, 0, 8192):
        res = srv.test(Request(streams=2, seconds=0.4, interval=0.2, buffer=64 * 1024, window=window))
        assert res.records[-1].extra["counted_bytes"] > 2**20
        srv.wait_idle()


def test_a_sender_inside_one_long_sendfile_stops_at_once_without_a_kill():
    """A peer whose receive buffer shrank under an offered window takes a little per retransmission
    timeout: one sendfile of 128 KiB is many writes inside the kernel, each waiting its 0.2 s
    SO_SNDTIMEO anew, and outlasted StreamSet.stop's 3 s, so the worker was killed (-9) and the run
    failed. stop() now shuts the write side after 0.5 s, which ends the call (EPIPE, read as the
    stop): no failure, no error, and the bytes the call moved are counted."""
    from gpubench.plugins.net.stream import StreamSet, set_window

    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    c = socket.socket()
    set_window(c, 4096)
    c.connect(lst.getsockname())
    r, _ = lst.accept()
    set_window(r, 4096)  # after the handshake: the stall a late buffer makes
    lst.close()

    def drain():
        while True:
            try:
                if not r.recv(1 << 16):
                    return
            except OSError:
                return

    threading.Thread(target=drain, daemon=True).start()
    st = StreamSet([c], "send", buffer=128 * 1024)
    try:
        st.start()
        st.go()
        time.sleep(1.5)
        t0 = time.monotonic()
        st.stop()
        took = time.monotonic() - t0
        assert st.worker_failures == [] and st.errors() == [], (st.worker_failures, st.errors())
        assert took < 2.0, took
    finally:
        st.close()
        r.close()


def test_close_after_a_signal_inside_thread_start_does_not_raise():
    """A Ctrl-C inside NetServer.start()'s Thread.start() (`net local -P 128`, SIGINT the moment the
    server listens) leaves a thread that has not said it started; close() waits for it (1 s at most)
    instead of raising "cannot join thread before it is started" (exit 3)."""
    server = NetServer("127.0.0.1", 0)
    server.open()
    server._serving = threading.Thread(target=server.serve_forever, daemon=True)  # start() cut short
    t0 = time.monotonic()
    server.close(5.0)
    assert time.monotonic() - t0 < 3.0
    # and a thread that starts while close() waits is joined: it sees the stop and ends
    server2 = NetServer("127.0.0.1", 0)
    server2.open()
    t = server2._serving = threading.Thread(target=server2.serve_forever, daemon=True)
    threading.Timer(0.3, t.start).start()
    server2.close(5.0)
    assert t.ident is not None and not t.is_alive()


def test_an_ok_reply_that_changes_the_test_is_refused_at_once():
    """A server whose ok reply says streams 99 for a 1-stream request is caught at once, not seconds
    later as "stopped answering". The reply echoes the request as
    the server parsed it; a changed field is a lie named at once (exit 3)."""
    req = LIE_REQUEST
    liar = LyingServer([], reply={"ok": True, "version": 2, "cookie": "ab" * 16, **asdict(req), "streams": 99})
    t0 = time.monotonic()
    with pytest.raises(MachineError) as e:
        run(NetSpec("127.0.0.1", liar.port, req, connect_timeout=3.0))
    assert e.value.exit_code == 3 and time.monotonic() - t0 < 2.0
    assert "its reply changes streams from 1 to 99" in e.value.one_line()

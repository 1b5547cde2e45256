"""gpubench net, pure logic: request checks and caps, the interval schedule, line reading limits,
and the figures (total = counted bytes / counted seconds, never above the intervals)."""

from __future__ import annotations

import socket
import threading

import pytest

from gpubench.bench.net import Interval, build_records, totals
from gpubench.bench.net_protocol import CAPS, LineReader, ProtocolError, Request, RequestError, check_request, schedule
from gpubench.commands.net import build_request
from gpubench.core.errors import UsageError


def _req(**kw):
    d = Request().header()
    d.update(kw)
    return d


def test_check_request_accepts_the_header_a_client_sends():
    r = Request(streams=4, seconds=2.5, omit=1.0, interval=0.5, buffer=1 << 20)
    assert check_request(r.header()) == r


@pytest.mark.parametrize("header, fragment", [
    ([1, 2], "JSON object"),
    ("x", "JSON object"),
    (_req(gpubench_net=2), "protocol version 2"),
    ({k: v for k, v in _req().items() if k != "gpubench_net"}, "protocol version null"),
    (_req(role="data"), "role"),
    (_req(streams=10_000), "streams 10000 out of range: 1 to 128"),
    (_req(streams=0), "streams 0"),
    (_req(streams=True), "streams must be an integer"),
    (_req(streams=2.0), "streams must be an integer"),
    (_req(streams="4"), "streams must be an integer"),
    (_req(seconds=365 * 24 * 3600), "at most 3600"),
    (_req(seconds=0), "seconds 0 out of range"),
    (_req(seconds=-1), "seconds -1"),
    (_req(seconds=float("nan")), "finite"),
    (_req(seconds=None), "seconds must be a number"),
    (_req(omit=-1), "omit -1"),
    (_req(omit=600, seconds=3100), "over 3600"),
    (_req(interval=0.01), "interval 0.01"),
    (_req(interval=120), "interval 120"),
    (_req(buffer=64 * 2**20 + 1), "buffer 67108865 out of range"),
    (_req(buffer=0), "buffer 0"),
    (_req(seconds=361, interval=0.1), "3610 intervals of 0.1 s is over 3600"),
])
def test_check_request_refuses_with_one_line_naming_the_field(header, fragment):
    with pytest.raises(RequestError) as e:
        check_request(header)
    msg = str(e.value)
    assert fragment in msg
    assert "\n" not in msg and len(msg) < 200


def test_caps_are_the_documented_ones():
    assert (CAPS.max_streams, CAPS.max_seconds, CAPS.max_buffer, CAPS.max_intervals) == (128, 3600.0, 64 * 2**20, 3600)


@pytest.mark.parametrize("omit, seconds, interval, expected", [
    (0, 3, 1, [(1, False), (2, False), (3, False)]),
    (0, 2.5, 1, [(1, False), (2, False), (2.5, False)]),
    (1.5, 2, 1, [(1, True), (1.5, True), (2.5, False), (3.5, False)]),
    (0, 0.3, 1, [(0.3, False)]),
    (2, 1, 1, [(1, True), (2, True), (3, False)]),
    (0, 1, 0.1, [(round(0.1 * i, 10), False) for i in range(1, 11)]),
])
def test_schedule_splits_omitted_and_counted_parts(omit, seconds, interval, expected):
    got = schedule(omit, seconds, interval)
    assert [o for _, o in got] == [o for _, o in expected]
    assert [e for e, _ in got] == pytest.approx([e for e, _ in expected])
    assert got[-1][0] == pytest.approx(omit + seconds)


# -- line reading ------------------------------------------------------------------------------


def test_line_reader_splits_lines_that_arrive_together_and_apart():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b'{"x": 1}\n{"y"')
        r = LineReader(b, 64)
        assert r.readjson(1.0) == {"x": 1}
        a.sendall(b': 2}\n')
        assert r.readjson(1.0) == {"y": 2}


def test_line_reader_refuses_a_line_over_the_limit_without_reading_it_all():
    a, b = socket.socketpair()
    with a, b:
        t = threading.Thread(target=lambda: a.sendall(b"x" * 100_000), daemon=True)
        t.start()
        r = LineReader(b, 4096)
        with pytest.raises(ProtocolError, match="longer than 4096"):
            r.readline(2.0)
        assert len(r._buf) <= 4096
        b.close()
        a.close()
        t.join(2.0)


def test_line_reader_times_out_on_silence_and_reports_eof_and_garbage():
    a, b = socket.socketpair()
    with a, b:
        with pytest.raises(ProtocolError, match="within 0.2 s"):
            LineReader(b, 64).readline(0.2)
        a.sendall(b"\xff\xfe\n")
        with pytest.raises(ProtocolError, match="not a JSON line"):
            LineReader(b, 64).readjson(1.0)
        a.sendall(b"half")
        a.close()
        with pytest.raises(ProtocolError, match="closed mid-line"):
            LineReader(b, 64).readline(1.0)


# -- figures -------------------------------------------------------------------------------------


def _intervals():
    # 2 streams; first interval omitted; the third interval is 0.5 s long; stream 1 stalls once
    return [
        Interval(0.0, 1.0, True, [5_000, 1_000]),
        Interval(1.0, 2.0, False, [4_000, 2_000]),
        Interval(2.0, 2.5, False, [3_000, 0]),
        Interval(2.5, 3.5, False, [1_000, 1_000]),
    ]


def test_totals_count_only_the_counted_intervals():
    ivs = _intervals()
    assert totals(ivs) == (11_000, pytest.approx(2.5))
    assert totals(ivs, 0) == (8_000, pytest.approx(2.5))
    assert totals(ivs, 1) == (3_000, pytest.approx(2.5))


def test_records_per_stream_and_total_follow_the_intervals():
    req = Request(streams=2, seconds=2.5, omit=1.0, interval=1.0, buffer=500)
    recs = build_records(req, _intervals(), sent=[9_000, 5_000])
    assert [r.params["stream"] for r in recs] == [0, 1, "total"]
    s0, s1, tot = recs
    # per-interval rates recovered from the samples: nbytes / sample = interval bytes / interval seconds
    assert [s0.nbytes / x for x in s0.samples_s] == pytest.approx([4_000, 6_000, 1_000])
    # the stalled interval has no sample but counts in the total and is flagged
    assert [s1.nbytes / x for x in s1.samples_s] == pytest.approx([2_000, 1_000])
    assert s1.extra["zero_intervals"] == 1 and s0.extra["zero_intervals"] == 0
    assert tot.extra["counted_bytes"] == 11_000 == s0.extra["counted_bytes"] + s1.extra["counted_bytes"]
    assert tot.extra["bytes_per_s"] == pytest.approx(11_000 / 2.5)
    assert tot.extra["gbit_per_s"] == pytest.approx(8 * 11_000 / 2.5 / 1e9)
    assert tot.extra["gb_per_s"] == pytest.approx(11_000 / 2.5 / 1e9)
    assert tot.extra["interval_bytes"] == [6_000, 6_000, 3_000, 2_000]
    assert tot.extra["interval_omit"] == [True, False, False, False]
    assert tot.extra["sent_bytes"] == 14_000
    # never above what the intervals show
    for r in recs:
        rates = [b / (e - s) for b, s, e, o in zip(r.extra["interval_bytes"], r.extra["interval_start_s"],
                                                   r.extra["interval_end_s"], r.extra["interval_omit"]) if not o]
        assert min(rates) <= r.extra["bytes_per_s"] <= max(rates)


def test_a_stream_that_received_nothing_is_an_error_record_not_a_zero_rate():
    req = Request(streams=1, seconds=1.0)
    (s0, tot) = build_records(req, [Interval(0.0, 1.0, False, [0])])
    assert s0.samples_s == [] and s0.error and tot.error
    assert tot.extra["bytes_per_s"] == 0.0


# -- command-layer checks name the option ----------------------------------------------------


@pytest.mark.parametrize("args, fragment", [
    ((0, 1.0, 0.0, 1.0, "128KiB"), "-P/--parallel 0"),
    ((10_000, 1.0, 0.0, 1.0, "128KiB"), "-P/--parallel 10000"),
    ((1, 31_536_000.0, 0.0, 1.0, "128KiB"), "-t/--time 3.1536e+07"),
    ((1, 0.0, 0.0, 1.0, "128KiB"), "-t/--time 0"),
    ((1, float("inf"), 0.0, 1.0, "128KiB"), "-t/--time inf"),
    ((1, 1.0, -1.0, 1.0, "128KiB"), "-O/--omit -1"),
    ((1, 3000.0, 601.0, 1.0, "128KiB"), "-O/--omit 601"),
    ((1, 3001.0, 600.0, 1.0, "128KiB"), "over 3600"),
    ((1, 1.0, 0.0, 0.0, "128KiB"), "-i/--interval 0"),
    ((1, 1.0, 0.0, 1.0, "1GiB"), "-l/--length '1GiB'"),
    ((1, 1.0, 0.0, 1.0, "lots"), "-l/--length 'lots'"),
    ((1, 3600.0, 0.0, 0.1, "1M"), "36000 intervals of -i 0.1 s is over 3600"),
])
def test_build_request_names_the_option(args, fragment):
    with pytest.raises(UsageError) as e:
        build_request(*args)
    assert fragment in e.value.one_line()
    assert e.value.exit_code == 2


def test_build_request_builds_what_the_server_accepts():
    r = build_request(8, 5.0, 1.0, 0.5, "1MiB")
    assert r == Request(streams=8, seconds=5.0, omit=1.0, interval=0.5, buffer=2**20)
    assert check_request(r.header()) == r

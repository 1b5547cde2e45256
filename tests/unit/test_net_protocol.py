"""gpubench net, pure logic: request checks and caps, the interval schedule, line reading limits,
and the figures (total = counted bytes / counted seconds, never above the intervals)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from gpubench.plugins.net.bench import DirectionFacts, Interval, ServerLied, build_records, parse_end, parse_interval, totals
from gpubench.plugins.net.stream import TCP_INFO_FIELDS, parse_tcp_info
from gpubench.plugins.net.protocol import CAPS, LineReader, ProtocolError, Request, RequestError, check_request, schedule
from gpubench.plugins.net.command import build_client_spec, build_local_spec, build_request, parse_bitrate
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
    (_req(gpubench_net=1), "protocol version 1"),
    # JSON true and 2.0 compare equal to an int in Python; neither is a version
    (_req(gpubench_net=True), "protocol version true"),
    (_req(gpubench_net=2.0), "protocol version 2.0"),
    (_req(streams=10**400), "streams 1000000000000000000000000000000000000000... (401 characters) is too large"),
    (_req(buffer=-10**400), "is too large"),
    (_req(seconds=10**400), "is too large"),
    (_req(window=True), "window must be an integer"),
    (_req(window=100), "window 100 out of range"),
    (_req(window=2**40), "window 1099511627776 out of range"),
    (_req(bitrate=-1), "bitrate -1 out of range"),
    (_req(bitrate=1.5e9), "bitrate must be an integer"),
    (_req(direction="up"), "direction must be one of c2s, s2c, both"),
    (_req(direction=None), "direction must be one of"),
    (_req(copy=1), "copy must be true or false, got 1"),
    ({k: v for k, v in _req().items() if k != "gpubench_net"}, "protocol version null"),
    (_req(role="data"), "role"),
    (_req(streams=10_000), "streams 10000 out of range: 1 to 128"),
    (_req(streams=0), "streams 0"),
    (_req(streams=True), "streams must be an integer"),
    (_req(streams=2.0), "streams must be an integer"),
    (_req(streams="4"), "streams must be an integer"),
    (_req(seconds=365 * 24 * 3600), "0.1 to 3600"),
    (_req(seconds=0), "seconds 0 out of range"),
    (_req(seconds=1e-9), "seconds 1e-09 out of range: 0.1 to 3600"),  # ran 1 ns and reported nothing
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
        a.sendall(b'{"ok": true, "ok": false}\n')
        with pytest.raises(ProtocolError, match="repeats the key 'ok'"):
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


def test_a_stream_silent_for_a_second_of_counted_time_is_stalled():
    """STALL_S (1 s): the empty counted intervals of one stream add up; omitted ones do not count."""
    req = Request(streams=2, seconds=2.0, omit=1.0, interval=1.0, buffer=500)
    ivs = [Interval(0.0, 1.0, True, [0, 1_000]), Interval(1.0, 1.5, False, [0, 1_000]),
           Interval(1.5, 2.0, False, [0, 1_000]), Interval(2.0, 3.0, False, [500, 0])]
    assert build_records(req, ivs)[-1].extra["stalled_streams"] == [0, 1]
    ivs[1] = Interval(1.0, 1.5, False, [10, 1_000])  # stream 0 now silent for 0.5 s only
    assert build_records(req, ivs)[-1].extra["stalled_streams"] == [1]


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
    assert tot.extra["stalled_streams"] == []  # 0.5 s without data: a hiccup, not a stall
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
    r = build_request(2, 1.0, 0.0, 1.0, "64KiB", bidir=True, window="4MiB", bitrate="2.5G", copy=True)
    assert (r.direction, r.window, r.bitrate, r.copy) == ("both", 4 * 2**20, 2_500_000_000, True)
    assert check_request(r.header()) == r
    assert build_request(1, 1.0, 0.0, 1.0, "1K", reverse=True).directions() == ("s2c",)


@pytest.mark.parametrize("text, bits", [(None, 0), ("0", 0), ("500M", 500_000_000), ("10G", 10**10), ("1.5g", 1_500_000_000),
                                        ("100k", 100_000), ("7", 7), ("1T", 10**12), ("2Gbit/s", 2 * 10**9),
                                        ("+10M", 10**7)])  # a leading + as on every number
def test_bitrate_is_read_as_iperf3_reads_it(text, bits):
    assert parse_bitrate(text) == bits


@pytest.mark.parametrize("kw, fragment", [
    (dict(bitrate="fast"), "-b/--bitrate 'fast' is not a bit rate"),
    (dict(bitrate="+-5M"), "-b/--bitrate '+-5M' is not a bit rate"),
    (dict(bitrate="-5M"), "-b/--bitrate '-5M' is not a bit rate"),
    (dict(bitrate="1" + "0" * 40), "is not a bit rate"),
    (dict(bitrate="0.5"), "-b/--bitrate '0.5' is not a whole number of bit/s"),
    (dict(bitrate="0.0001K"), "-b/--bitrate '0.0001K' is not a whole number of bit/s"),
    (dict(bitrate="0.9"), "-b/--bitrate '0.9' is not a whole number of bit/s"),
    (dict(bitrate="20T"), "-b/--bitrate 20000000000000 bit/s out of range"),
    (dict(window="100"), "-w/--window 100 bytes out of range"),
    (dict(window="4GiB"), "-w/--window '4GiB' is over 512 MiB"),
    (dict(window="9000000T"), "-w/--window '9000000T' is over 512 MiB"),  # however far over: its own cap
    (dict(window="big"), "-w/--window 'big' is not a size"),
    (dict(reverse=True, bidir=True), "-R/--reverse and --bidir exclude each other"),
])
def test_new_options_name_the_bad_value(kw, fragment):
    with pytest.raises(UsageError) as e:
        build_request(1, 1.0, 0.0, 1.0, "128KiB", **kw)
    assert fragment in e.value.one_line() and e.value.exit_code == 2


def test_cport_and_family_are_checked_before_connecting():
    spec = build_client_spec("h", 5301, 4, 1.0, 0.0, 1.0, "1K", bidir=True, cport=60000, ipv6=True)
    assert spec.cport == 60000 and spec.family == 6
    with pytest.raises(UsageError, match="--cport 65530 out of range"):  # 8 data streams: 65530..65537
        build_client_spec("h", 5301, 4, 1.0, 0.0, 1.0, "1K", bidir=True, cport=65530)
    with pytest.raises(UsageError, match="--cport 0 out of range"):
        build_client_spec("h", 5301, 1, 1.0, 0.0, 1.0, "1K", cport=0)
    with pytest.raises(UsageError, match="-4 and -6 exclude each other"):
        build_local_spec(1, 1.0, 0.0, 1.0, "1K", ipv4=True, ipv6=True)
    assert build_local_spec(1, 1.0, 0.0, 1.0, "1K", ipv6=True).host == "::1"


# -- TCP_INFO ------------------------------------------------------------------------------------


def test_tcp_info_fields_are_read_at_linux_tcp_h_offsets():
    import struct

    raw = bytearray(232)
    values = {}
    for i, (name, (off, fmt)) in enumerate(TCP_INFO_FIELDS.items()):
        values[name] = 1000 + i
        struct.pack_into("=" + fmt, raw, off, values[name])
    got = parse_tcp_info(bytes(raw))
    assert {k: got[k] for k in values} == values
    assert got["cwnd_bytes"] == values["snd_cwnd"] * values["snd_mss"]
    # an older kernel fills less: only the fields it reached
    short = parse_tcp_info(bytes(raw[:104]))
    assert "total_retrans" in short and "bytes_acked" not in short and "bytes_sent" not in short


def test_tcp_info_of_a_real_connection_counts_what_was_sent():
    from gpubench.plugins.net.stream import tcp_info

    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    c = socket.create_connection(lst.getsockname())
    s, _ = lst.accept()
    with lst, c, s:
        c.sendall(b"x" * 100_000)
        got = 0
        while got < 100_000:
            got += len(s.recv(65536))
        time.sleep(0.05)  # the ACKs
        info = tcp_info(c)
        if info is None:
            pytest.skip("no TCP_INFO on this platform")
        assert info["bytes_acked"] >= 100_000 and info["snd_mss"] > 0 and info["cwnd_bytes"] > 0
        assert info["total_retrans"] == 0 and info["bytes_sent"] >= 100_000


# -- a lying server: the client bounds what it takes --------------------------------------------

LIE_REQ = Request(streams=2, seconds=2.0, omit=0.0, interval=1.0, buffer=1000)


def _iv(**kw):
    d = {"interval": 0, "omit": False, "start_s": 0.0, "end_s": 1.001, "bytes": [10, 20]}
    d.update(kw)
    return d


def test_an_honest_interval_is_taken():
    iv = parse_interval(_iv(), 0, LIE_REQ, 0.0, [10_000, 10_000])
    assert iv.bytes == [10, 20] and iv.seconds == pytest.approx(1.001)
    assert parse_interval(_iv(bytes=[]), 0, LIE_REQ, 0.0, None).bytes == []  # s2c: the server received nothing


@pytest.mark.parametrize("msg, fragment", [
    (_iv(bytes=[10**400, 1]), "stream 0's count 1000000000000000000000000000000000000000... (401 characters) "
                              "is not an integer"),
    (_iv(bytes=[2**63, 1]), "is not an integer 0 to"),
    (_iv(bytes=[-1, 1]), "is not an integer"),
    (_iv(bytes=[1.5, 1]), "is not an integer"),
    (_iv(bytes=[True, 1]), "is not an integer"),
    (_iv(bytes=[10_001, 1]), "stream 0 received 10001 bytes, more than the client had sent (10000 at most)"),
    (_iv(bytes=[1, 2, 3]), "bytes must be a list of 2 counts"),
    (_iv(interval=5), "expected interval 0, got 5"),
    (_iv(interval=True), "expected interval 0, got true"),
    (_iv(omit=True), "omit must be false"),
    (_iv(end_s=float("inf")), "finite"),
    (_iv(end_s=10**400), "finite"),
    (_iv(start_s=0.5), "does not follow"),
    (_iv(end_s=0.2), "the schedule says 1 s"),
    (_iv(end_s=1e9), "the schedule says 1 s"),
    ("junk", "expected interval 0"),
])
def test_a_lying_interval_is_refused_with_a_clear_line(msg, fragment):
    with pytest.raises(ServerLied) as e:
        parse_interval(msg, 0, LIE_REQ, 0.0, [10_000, 10_000])
    line = e.value.one_line()
    assert fragment in line and len(line) < 300 and "\n" not in line and e.value.exit_code == 3


def _end(**kw):
    d = {"end": True, "cpu_s": {"send": 0.5, "recv": None}, "tcp": [{"total_retrans": 3, "snd_mss": 1448}, None],
         "sent": [100, 200]}
    d.update(kw)
    return d


def test_an_honest_end_line_is_taken_and_unknown_tcp_fields_dropped():
    got = parse_end(_end(tcp=[{"total_retrans": 3, "evil": "x"}, None]), LIE_REQ, 2.0, [100, 150])
    assert got == {"cpu_s": {"send": 0.5, "recv": None}, "tcp": [{"total_retrans": 3}, None], "sent": [100, 200]}


@pytest.mark.parametrize("msg, fragment", [
    (_end(cpu_s={"send": 1e9, "recv": None}), "cpu_s.send 1000000000.0 is not 0 to 14 seconds"),
    (_end(cpu_s={"send": -1, "recv": None}), "cpu_s.send -1"),
    (_end(cpu_s={"send": float("nan"), "recv": None}), "cpu_s.send NaN"),
    (_end(cpu_s="lots"), "cpu_s must be an object"),
    (_end(tcp=[{"total_retrans": 10**400}, None]), "tcp[0].total_retrans 1000000000000000000000000000000000000000..."),
    (_end(tcp=[1, None]), "tcp[0] must be an object or null"),
    (_end(sent=[10**30, 1]), "sent[0] 1000000000000000000000000000000 is not an integer"),
    (_end(sent=[99, 200]), "stream 0: sent 99 bytes, fewer than the 100 received"),
    (_end(sent=[1]), "tcp and sent must be lists of 2"),
    (_end(end=False), "got"),
])
def test_a_lying_end_line_is_refused_with_a_clear_line(msg, fragment):
    with pytest.raises(ServerLied) as e:
        parse_end(msg, LIE_REQ, 2.0, [100, 150])
    assert fragment in e.value.one_line()


def test_totals_carry_cpu_retransmits_and_cpu_per_gbit():
    req = Request(streams=2, seconds=2.5, omit=1.0, interval=1.0, buffer=500)
    facts = DirectionFacts(sent=[9_000, 5_000], tcp=[{"total_retrans": 2, "cwnd_bytes": 10, "rtt_us": 5, "snd_mss": 1},
                                                    {"total_retrans": 1}], sender_cpu_s=0.25, receiver_cpu_s=0.5)
    s0, s1, tot = build_records(req, _intervals(), direction="s2c", facts=facts)
    assert s0.params["direction"] == "s2c" and s0.extra["retransmits"] == 2 and s0.extra["cwnd_bytes"] == 10
    assert s1.extra["cwnd_bytes"] is None
    assert tot.extra["retransmits"] == 3 and tot.extra["all_bytes"] == 17_000
    assert tot.extra["cpu_s_per_gbit"] == pytest.approx(0.75 / (8 * 17_000 / 1e9))
    _, _, unknown = build_records(req, _intervals(), facts=DirectionFacts(sender_cpu_s=0.25))
    assert unknown.extra["cpu_s_per_gbit"] is None and unknown.extra["retransmits"] is None

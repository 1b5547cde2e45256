"""``gpubench net`` (server, client, local): multi-stream TCP throughput, options and report."""

from __future__ import annotations

import math
import sys

import click

from gpubench.commands.common import common_options, finish
from gpubench.core import report
from gpubench.core.errors import UsageError
from gpubench.core.signals import Interrupted
from gpubench.core.units import format_rate, format_size, parse_size

# Kept equal to gpubench.bench.net (not imported here, so `gpubench net --help` stays light).
DEFAULT_PORT = 5301
DEFAULT_BIND = "127.0.0.1"


@click.group("net", context_settings={"help_option_names": ["-h", "--help"]})
def command():
    """Multi-stream TCP throughput between two hosts (iperf-like).

    Run `gpubench net server` on one host and `gpubench net client HOST` on the other; the client
    sends, the server counts what it receives each interval. `gpubench net local` runs both here
    over loopback. Gbit/s = 1e9 bit/s; GB/s = 1e9 B/s.
    """


def _test_options(f):
    f = click.option("-l", "--length", "length", default="128KiB", show_default=True,
                     help="Bytes per write on each stream (64MiB at most).")(f)
    f = click.option("-i", "--interval", type=float, default=1.0, show_default=True,
                     help="Seconds per reported interval (0.1 to 60).")(f)
    f = click.option("-O", "--omit", type=float, default=0.0, show_default=True,
                     help="Leading seconds measured but left out of the figures (TCP slow start).")(f)
    f = click.option("-t", "--time", "seconds", type=float, default=10.0, show_default=True,
                     help="Counted seconds, after --omit (omit + time <= 3600).")(f)
    f = click.option("-P", "--parallel", "streams", type=int, default=1, show_default=True,
                     help="Parallel TCP streams (1 to 128).")(f)
    return f


def build_request(streams: int, seconds: float, omit: float, interval: float, length: str):
    """Validate the test options against the server caps (no network needed) and build a Request.

    Raises:
        UsageError: a value out of range, naming the option and the accepted range.
    """
    from gpubench.bench.net import CAPS, Request, RequestError, check_request, schedule

    c = CAPS
    if not 1 <= streams <= c.max_streams:
        raise UsageError(f"-P/--parallel {streams} out of range", f"use 1 to {c.max_streams} streams")
    for name, v in (("-t/--time", seconds), ("-O/--omit", omit), ("-i/--interval", interval)):
        if not math.isfinite(v):
            raise UsageError(f"{name} {v} is not a number of seconds")
    if not 0 < seconds <= c.max_seconds:
        raise UsageError(f"-t/--time {seconds:g} out of range", f"use more than 0 and at most {c.max_seconds:g} seconds")
    if not 0 <= omit <= c.max_omit:
        raise UsageError(f"-O/--omit {omit:g} out of range", f"use 0 to {c.max_omit:g} seconds")
    if omit + seconds > c.max_seconds:
        raise UsageError(f"--omit {omit:g} + --time {seconds:g} is over {c.max_seconds:g} seconds")
    if not c.min_interval <= interval <= c.max_interval:
        raise UsageError(f"-i/--interval {interval:g} out of range", f"use {c.min_interval:g} to {c.max_interval:g} seconds")
    buffer = parse_size(length, what="-l/--length")
    if buffer > c.max_buffer:
        raise UsageError(f"-l/--length {length!r} is over {format_size(c.max_buffer)}", "use 64MiB or less")
    n = len(schedule(omit, seconds, interval))
    if n > c.max_intervals:
        raise UsageError(f"{n} intervals of -i {interval:g} s is over {c.max_intervals}", "use a longer --interval")
    req = Request(streams=streams, seconds=float(seconds), omit=float(omit), interval=float(interval), buffer=buffer)
    try:
        return check_request(req.header())
    except RequestError as e:  # pragma: no cover - the checks above mirror check_request
        raise UsageError(str(e)) from None


def _check_port(port: int, *, allow_zero: bool) -> int:
    lo = 0 if allow_zero else 1
    if not lo <= port <= 65535:
        raise UsageError(f"--port {port} out of range", f"use {lo} to 65535" + (" (0: any free port)" if allow_zero else ""))
    return port


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@command.command("server")
@click.option("-B", "--bind", default=DEFAULT_BIND, show_default=True,
              help="Address to listen on; 0.0.0.0 or :: to accept other hosts.")
@click.option("-p", "--port", type=int, default=DEFAULT_PORT, show_default=True, help="TCP port; 0 picks a free one.")
@click.option("-1", "--one-off", is_flag=True, help="Serve one test, then exit.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
@click.option("--debug", is_flag=True, help="Show tracebacks of errors.")
def server(bind, port, one_off, quiet, debug):
    """Receive tests from `gpubench net client` until Ctrl-C or SIGTERM.

    One test at a time (others are told busy); a connection that sends no request within 5 s is
    dropped; requests over the caps (128 streams, 3600 s, 64 MiB writes) are refused.
    Listens on loopback only unless --bind says otherwise.
    """
    from gpubench.bench.net import NetServer

    _check_port(port, allow_zero=True)

    def log(line: str) -> None:
        if not quiet:
            click.echo(line)
            sys.stdout.flush()  # a server's log is read live (pipes are block-buffered)

    srv = NetServer(bind, port, log=log)
    addr, real_port = srv.open()
    scope = " (loopback only; --bind 0.0.0.0 to serve other hosts)" if addr.startswith("127.") or addr == "::1" else ""
    log(f"gpubench net server: listening on {_hostport(addr, real_port)}{scope}")
    try:
        stats = srv.serve_forever(max_tests=1 if one_off else None)
    except (KeyboardInterrupt, Interrupted):
        s = srv.stats
        log(f"gpubench net server: stopped; {s.tests_done} test(s) done, {s.tests_aborted} aborted, {s.refused} refused")
        raise
    log(f"gpubench net server: done; {stats.tests_done} test(s) done, {stats.tests_aborted} aborted, {stats.refused} refused")
    return 0


@command.command("client")
@click.argument("host")
@click.option("-p", "--port", type=int, default=DEFAULT_PORT, show_default=True, help="The server's TCP port.")
@_test_options
@common_options
def client(host, port, streams, seconds, omit, interval, length, json_path, units, quiet, debug):
    """Send to a `gpubench net server` on HOST and report the throughput it received.

    Per-interval and per-stream figures in Gbit/s and GB/s; the total is the bytes received in the
    counted intervals (after --omit) over their seconds.
    """
    from gpubench.bench import net as bench

    req = build_request(streams, seconds, omit, interval, length)
    _check_port(port, allow_zero=False)
    spec = bench.NetSpec(host=host, port=port, request=req)
    with report.progress(not quiet) as prog:
        result = bench.run(spec, prog)
    return finish(result, format_report(result, units), json_path=json_path, quiet=quiet)


@command.command("local")
@_test_options
@common_options
def local(streams, seconds, omit, interval, length, json_path, units, quiet, debug):
    """Run a server and a client on this machine over loopback (127.0.0.1): a quick check.

    Loopback measures the host's memory and TCP stack, not a network card.
    """
    from gpubench.bench import net as bench

    req = build_request(streams, seconds, omit, interval, length)
    with report.progress(not quiet) as prog:
        result = bench.run_local(req, prog)
    return finish(result, format_report(result, units), json_path=json_path, quiet=quiet)


def _gbit(rate_bytes_per_s: float) -> str:
    return f"{rate_bytes_per_s * 8 / 1e9:.2f}"


def format_report(result, units: str = "GB") -> list:
    """Per-interval table, per-stream table with the total, and notes (rich renderables)."""
    from gpubench.core.stats import Summary

    spec = result.spec
    recs = {r.params["stream"]: r for r in result.records}
    total = recs.get("total")
    streams = [k for k in recs if k != "total"]
    out: list = []
    if total is None:
        return ["no records"]
    ex = total.extra
    starts, ends, omits = ex["interval_start_s"], ex["interval_end_s"], ex["interval_omit"]
    where = "loopback, this machine" if spec.get("mode") == "local" else _hostport(spec["host"], spec["port"])
    title = (f"TCP throughput to {where}: {len(streams)} stream(s), {format_size(spec['buffer'])} writes, "
             f"{spec['seconds']:g} s counted" + (f" after {spec['omit']:g} s omitted" if spec.get("omit") else ""))
    per_stream_cols = len(streams) <= 8
    cols = ["interval (s)", "total Gbit/s", f"total {units}/s"]
    cols += [f"stream {k} Gbit/s" for k in streams] if per_stream_cols else ["slowest stream Gbit/s", "fastest stream Gbit/s"]
    t = report.table(title, cols)
    for i, (a, b, om) in enumerate(zip(starts, ends, omits)):
        dt = b - a
        row = [f"{a:6.2f}-{b:6.2f}" + (" (omitted)" if om else "")]
        tot = ex["interval_bytes"][i] / dt if dt > 0 else 0.0
        row += [_gbit(tot), format_rate(tot, units)]
        rates = [recs[k].extra["interval_bytes"][i] / dt if dt > 0 else 0.0 for k in streams]
        row += [_gbit(r) for r in rates] if per_stream_cols else [_gbit(min(rates)), _gbit(max(rates))]
        t.add_row(*row)
    out.append(t)

    s = report.table("Per stream, counted intervals", ["stream", "received", "seconds", "Gbit/s", f"{units}/s",
                                                       "intervals Gbit/s min / median / max"])
    for k in [*streams, "total"]:
        r = recs[k]
        e = r.extra
        spread = "-"
        rates = [b / (en - st) for b, st, en, om in zip(e["interval_bytes"], starts, ends, omits) if not om and en > st]
        if rates:
            sm = Summary.of(rates)
            spread = f"{_gbit(sm.min)} / {_gbit(sm.median)} / {_gbit(sm.max)}"
        s.add_row(str(k), format_size(e["counted_bytes"]), f"{e['counted_seconds']:.3f}", _gbit(e["bytes_per_s"]),
                  format_rate(e["bytes_per_s"], units), spread)
    out.append(s)
    out.append(f"Figures are bytes the server received, per interval of its clock. Total = bytes in the counted "
               f"intervals / their seconds (the duration-weighted mean of the interval rates, never above the "
               f"fastest interval). Gbit/s = 1e9 bit/s; {units}/s = {'1e9' if units == 'GB' else '2^30'} B/s; "
               f"sizes in binary units.")
    if spec.get("mode") == "local":
        out.append("Loopback measures this host's memory and TCP stack, not a network card.")
    zeros = [str(k) for k in streams if recs[k].extra.get("zero_intervals")]
    if zeros:
        out.append(f"Stream(s) {', '.join(zeros)} received nothing in some counted interval(s): stalled.")
    if result.partial:
        out.append(f"PARTIAL: interrupted by {result.interrupted_by}; only the intervals above were received.")
    return out

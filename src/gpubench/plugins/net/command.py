"""``gpubench net`` (server, client, local): multi-stream TCP throughput, options and report;
``client`` and ``local`` run :mod:`gpubench.plugins.net.bench` through the driver."""

from __future__ import annotations

import contextlib
import re
import signal
import sys
from fractions import Fraction
from typing import Any

import click

from gpubench.plugins.net.lines import gbit, hostport
from gpubench.plugins.net.protocol import DEFAULT_BIND, DEFAULT_PORT  # the standard library only: --help stays light
from gpubench import kit
from gpubench.kit import StrictFloat, StrictInt, benchmark_command, common_options
from gpubench.core import report, safe
from gpubench.core.errors import UsageError
from gpubench.core.signals import Interrupted
from gpubench.core.units import format_rate, format_size, parse_size


class LauncherGroup(click.Group):
    """``gpubench net``: under a launcher of 2 or more ranks, ``gpubench net [OPTIONS]`` is ``net nodes``."""

    def parse_args(self, ctx, args):
        if (not args or args[0].startswith("-")) and not any(a in ("-h", "--help") for a in args[:1]) \
                and _launched_ranks() > 1:
            args = ["nodes", *args]
        elif args and args[0].startswith("-") and args[0] not in ("-h", "--help"):
            _not_launched(self, args)  # click would say only "No such option '-P'"
        return super().parse_args(ctx, args)


def _timeout_bound():
    """-T/--timeout's Bound, declared on :class:`gpubench.plugins.net.fleet.NetFleetSpec`."""
    from gpubench.core.bounds import field_bound
    from gpubench.plugins.net.fleet import NetFleetSpec

    return field_bound(NetFleetSpec, "timeout")


def _to_bound():
    """--to's Bound: a rank, 0 to MAX_RANKS - 1 (the launcher's size is checked once known)."""
    from gpubench.core.bounds import Bound
    from gpubench.launch.ranks import MAX_RANKS

    return Bound("--to", lo=0, hi=MAX_RANKS - 1)


def _check_values(params: dict, req=None) -> None:
    """net nodes' checks that need no launcher: the test options (unless ``req`` was built), -T, and
    the sign of --to. Raises UsageError naming the first bad value."""
    if req is None:
        build_request(*(params[k] for k in ("streams", "seconds", "omit", "interval", "length")))
    _timeout_bound().check(params["timeout"])
    to = params["to"]
    if to is not None and to < 0:
        raise UsageError(f"--to {to} out of range", "use a rank, 0 to the number of ranks - 1")


def _not_launched(group: click.Group, args: list[str]) -> None:
    """``gpubench net -P 4`` outside a launcher. Raises UsageError, when the option is one of ``net
    nodes``', saying this form runs between a launcher's ranks and what to run here instead."""
    import shlex

    def knows(cmd: click.Command | None, name: str) -> bool:
        return cmd is not None and any(name in p.opts or name in p.secondary_opts for p in cmd.params)

    names = [a.split("=", 1)[0] if a.startswith("--") else a[:2] for a in args if a.startswith("-")]  # -P4: -P
    nodes = group.commands.get("nodes")
    if nodes is None or not knows(nodes, names[0]):
        return
    with nodes.make_context("gpubench net", list(args)) as ctx:  # a bad value is named first, as net nodes names it
        _check_values(ctx.params)
    shown = safe.term(shlex.join(args), 200)
    here = (f"here: gpubench net local {shown} (loopback), or gpubench net client HOST {shown} against a net "
            "server; " if all(knows(group.commands.get("local"), n) for n in names) else "")
    raise UsageError(f"gpubench net {shown}: with no sub-command, net runs between the ranks of a launcher "
                     "(mpirun, srun, torchrun), and none started this process",
                     f"{here}between nodes: mpirun -n 4 --map-by node gpubench net {shown}")


def _launched_ranks() -> int:
    import os

    from gpubench.launch import ranks

    try:
        me = ranks.discover(os.environ)
    except Exception:  # a malformed launcher environment: the sub-command reports it
        return 0
    return me.size if me.under_launcher else 0


@click.group("net", cls=LauncherGroup, context_settings={"help_option_names": ["-h", "--help"]})
def command():
    """Multi-stream TCP throughput between two hosts (iperf-like), or UCX (--protocol ucx).

    Run `gpubench net server` on one host and `gpubench net client HOST` on the other; the client
    sends (-R: the server sends; --bidir: both), the receiver counts what it receives each
    interval. `gpubench net local` runs both here over loopback. With --protocol ucx (both sides)
    UCX bandwidth or --latency as ucx_perftest's tag_bw / tag_lat. Gbit/s = 1e9 bit/s; GB/s = 1e9 B/s.
    """


def _cap(option: str, name: str, lo: str | float = 0, unit: str = "seconds") -> Any:
    """The Bound of a net option from the protocol's caps: upper ``name``, lower ``lo`` (a cap's name or a number)."""
    from gpubench.core.bounds import Bound
    from gpubench.plugins.net.protocol import CAPS

    return Bound(option, lo=getattr(CAPS, lo) if isinstance(lo, str) else lo, hi=getattr(CAPS, name), unit=unit)


def _in_flight() -> Any:
    """--in-flight's Bound: 1 to MAX_IN_FLIGHT messages."""
    from gpubench.core.bounds import Bound
    from gpubench.plugins.net.ucx import MAX_IN_FLIGHT

    return Bound("--in-flight", lo=1, hi=MAX_IN_FLIGHT)


def _device() -> Any:
    """-d/--device's Bound: a CUDA ordinal (a C int)."""
    from gpubench.core.bounds import Bound, MAX_DEVICE_ORDINAL

    return Bound("-d/--device", lo=0, hi=MAX_DEVICE_ORDINAL)


def _port(option: str, lo: int) -> StrictInt:
    """A TCP port option's type: ``lo`` to 65535 (the server takes 0: any free port)."""
    from gpubench.core.bounds import Bound

    return StrictInt(bound=lambda: Bound(option, lo=lo, hi=65535))


TEST_OPTIONS = [
    click.option("-P", "--parallel", "streams", type=StrictInt(bound=lambda: _cap("-P/--parallel", "max_streams", 1, unit="streams")), default=1, show_default=True,
                 help="Parallel TCP streams (1 to 128)."),
    click.option("-t", "--time", "seconds", type=StrictFloat(bound=lambda: _cap("-t/--time", "max_seconds", "min_seconds")), default=10.0, show_default=True,
                 help="Counted seconds, after --omit (omit + time <= 3600)."),
    click.option("-O", "--omit", type=StrictFloat(bound=lambda: _cap("-O/--omit", "max_omit")), default=0.0, show_default=True,
                 help="Leading seconds measured but left out of the figures (TCP slow start)."),
    click.option("-i", "--interval", type=StrictFloat(bound=lambda: _cap("-i/--interval", "max_interval", "min_interval")), default=1.0, show_default=True,
                 help="Seconds per reported interval (0.1 to 60)."),
    click.option("-l", "--length", "length", default=None,
                 help="Bytes per write on each stream, or per UCX message (64MiB at most; default 128KiB, "
                      "--protocol ucx: 1MiB; with --latency the largest size of the sweep)."),
    click.option("-R", "--reverse", is_flag=True, help="The server sends, the client receives (iperf's -R)."),
    click.option("--bidir", is_flag=True, help="Both directions at once, -P streams each way (iperf3's --bidir)."),
    click.option("-w", "--window", default=None,
                 help="SO_SNDBUF/SO_RCVBUF of every data socket, e.g. 4MiB (default: the kernel's autotuning)."),
    click.option("-b", "--bitrate", default=None,
                 help="Target bits/s per stream, e.g. 500M, 10G (K/M/G/T = 10^3..10^12; 0 = unlimited)."),
    click.option("--copy", is_flag=True,
                 help="Send from and receive into buffers (one copy each way, as iperf2) instead of zero copy."),
    click.option("-4", "--ipv4", "ipv4", is_flag=True, help="IPv4 only."),
    click.option("-6", "--ipv6", "ipv6", is_flag=True, help="IPv6 only (net local: over ::1)."),
]

LATENCY_OPTION = click.option("--latency", is_flag=True,
                              help="--protocol ucx: ping-pong one-way latency over 8 B doubling to -l (tag_lat), "
                                   "-t seconds for the whole sweep.")
# --protocol ucx (docs/net.md "UCX"); the values are checked in build_ucx_spec
UCX_OPTIONS = [
    click.option("--protocol", type=click.Choice(["tcp", "ucx"]), default="tcp", show_default=True,
                 help="tcp (iperf-like streams) or ucx (UCX through UCXX, as ucx_perftest)."),
    click.option("-m", "--memory", default="host", show_default=True,
                 help="--protocol ucx: buffers in host or cuda memory; SEND,RECV for each side (e.g. cuda,host)."),
    click.option("-d", "--device", type=StrictInt(bound=_device), default=0, show_default=True,
                 help="--protocol ucx: the GPU of -m cuda."),
    click.option("--api", type=click.Choice(["tag", "stream"]), default="tag", show_default=True,
                 help="--protocol ucx: UCX's tag-matching API (distributed-ucxx's) or its stream API."),
    click.option("--in-flight", type=StrictInt(bound=_in_flight), default=32, show_default=True,
                 help="--protocol ucx: messages kept in flight (ucx_perftest tag_bw's window: 32; 1 to 1024)."),
    click.option("--wait", type=click.Choice(["poll", "sleep"]), default="poll", show_default=True,
                 help="--protocol ucx: both sides spin on UCX's progress (ucx_perftest's default) or sleep on "
                      "its events when idle (its -E sleep: leaves the CPU to the peer on a small host)."),
    LATENCY_OPTION,
]

CLIENT_OPTIONS = [
    click.argument("host"),
    click.option("-p", "--port", type=_port("-p/--port", 1), default=DEFAULT_PORT, show_default=True, help="The server's TCP port."),
    click.option("--cport", type=_port("--cport", 1), default=None,
                 help="Local port of the first data stream; stream n uses cport + n (iperf3's --cport)."),
    *TEST_OPTIONS,
    *UCX_OPTIONS,
]


def _not_seconds(name: str, v: float) -> tuple[str, None]:
    return f"{name} {v} is not a number of seconds", None


# How the command words each limit of protocol.LIMITS: key -> (request, caps, -l as given) -> (message, hint)
OPTION_WORDING = {
    "streams": lambda r, c, length: (f"-P/--parallel {r.streams} out of range", f"use 1 to {c.max_streams} streams"),
    "seconds-finite": lambda r, c, length: _not_seconds("-t/--time", r.seconds),
    "omit-finite": lambda r, c, length: _not_seconds("-O/--omit", r.omit),
    "interval-finite": lambda r, c, length: _not_seconds("-i/--interval", r.interval),
    "seconds": lambda r, c, length: (f"-t/--time {r.seconds:g} out of range",
                                     f"use {c.min_seconds:g} to {c.max_seconds:g} seconds"),
    "omit": lambda r, c, length: (f"-O/--omit {r.omit:g} out of range", f"use 0 to {c.max_omit:g} seconds"),
    "total": lambda r, c, length: (f"--omit {r.omit:g} + --time {r.seconds:g} is over {c.max_seconds:g} seconds", None),
    "interval": lambda r, c, length: (f"-i/--interval {r.interval:g} out of range",
                                      f"use {c.min_interval:g} to {c.max_interval:g} seconds"),
    # parse_size already refused a length below 1 byte
    "buffer": lambda r, c, length: (f"-l/--length {length!r} is over {format_size(c.max_buffer)}",
                                    f"use {format_size(c.max_buffer).replace(' ', '')} or less"),
    "intervals": lambda r, c, length: (f"{len(r.intervals())} intervals of -i {r.interval:g} s is over "
                                       f"{c.max_intervals}", "use a longer --interval"),
    "window": lambda r, c, length: (f"-w/--window {r.window} bytes out of range",
                                    f"use 1KiB to {format_size(c.max_window).replace(' ', '')}"),
    "bitrate": lambda r, c, length: (f"-b/--bitrate {r.bitrate} bit/s out of range",
                                     f"use 0 (unlimited) to {c.max_bitrate:.0e} bit/s per stream"),
}

_RATE = re.compile(r"\s*\+?(\d+(?:\.\d+)?)\s*([kmgt]?)\s*(?:bit/s|bps|b)?\s*", re.IGNORECASE | re.ASCII)  # not "١٢"
_RATE_MULT = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_bitrate(text: str | None) -> int:
    """-b: bits/s per stream, iperf3's way (K/M/G/T are powers of 1000). None or "0": unlimited (0).
    Raises UsageError: not a rate; the line names the value and shows the accepted forms."""
    if text is None:
        return 0
    m = _RATE.fullmatch(str(text))
    if not m or len(m.group(1)) > 30:
        raise UsageError(f"-b/--bitrate {str(text)[:40]!r} is not a bit rate", "e.g. 500M, 10G, 2.5G, 0 for unlimited")
    exact = Fraction(m.group(1)) * _RATE_MULT[m.group(2).lower()]  # exact: 0.5 must not round to 0 (unlimited)
    if exact.denominator != 1:
        raise UsageError(f"-b/--bitrate {str(text)[:40]!r} is not a whole number of bit/s",
                         "e.g. 500M, 10G, 2.5G, 0 for unlimited")
    return int(exact)


def build_request(streams: int, seconds: float, omit: float, interval: float, length: str, reverse: bool = False,
                  bidir: bool = False, window: str | None = None, bitrate: str | None = None, copy: bool = False):
    """Check the test options against the server's caps (:data:`gpubench.plugins.net.protocol.LIMITS`,
    worded by :data:`OPTION_WORDING`) and build a Request.
    Raises UsageError: a value out of range, naming the option and the accepted range."""
    from gpubench.plugins.net.protocol import CAPS, Request, first_broken

    length = "128KiB" if length is None else length
    try:
        buffer, bad_length = parse_size(length, what="-l/--length", most=CAPS.max_buffer), None
    except UsageError as e:  # reported where -l's checks come: after those of -P, -t, -O, -i
        buffer, bad_length = 1, e
    if reverse and bidir:
        raise UsageError("-R/--reverse and --bidir exclude each other", "--bidir already sends both ways")
    win = 0 if window is None else parse_size(window, what="-w/--window", most=CAPS.max_window)
    req = Request(streams=streams, seconds=float(seconds), omit=float(omit), interval=float(interval), buffer=buffer,
                  direction="both" if bidir else "s2c" if reverse else "c2s", window=win,
                  bitrate=parse_bitrate(bitrate), copy=bool(copy))
    limit = first_broken(req, CAPS)
    if bad_length is not None and (limit is None or limit.key in ("buffer", "intervals")):
        raise bad_length
    if limit is not None:
        word = OPTION_WORDING.get(limit.key)
        raise UsageError(*word(req, CAPS, length)) if word else UsageError(limit.reason(req, CAPS))
    return req


def _family(ipv4: bool, ipv6: bool) -> int:
    if ipv4 and ipv6:
        raise UsageError("-4 and -6 exclude each other", "give one, or neither for either family")
    return 4 if ipv4 else 6 if ipv6 else 0


def tcp_only_given(streams: int = 1, reverse: bool = False, bidir: bool = False, window: str | None = None,
                   bitrate: str | None = None, copy: bool = False, ipv4: bool = False, ipv6: bool = False,
                   cport: int | None = None, **_: Any) -> list[str]:
    """The TCP-only options given at other than their defaults (refused with --protocol ucx); others ignored."""
    given = {"-P/--parallel": streams != 1, "-R/--reverse": reverse, "--bidir": bidir, "-w/--window": window is not None,
             "-b/--bitrate": bitrate is not None, "--copy": copy, "-4/-6": ipv4 or ipv6, "--cport": cport is not None}
    return [name for name, on in given.items() if on]


_TCP_KEYS = ("reverse", "bidir", "window", "bitrate", "copy")


def build_client_spec(host: str, port: int, streams: int, seconds: float, omit: float, interval: float, length: str,
                      *, cport: int | None = None, ipv4: bool = False, ipv6: bool = False, protocol: str = "tcp",
                      **opts: Any):
    """The NetSpec of `net client HOST` (UcxSpec with --protocol ucx). ``opts``: :func:`build_request`'s
    reverse, bidir, window, bitrate, copy, and the UCX options of :func:`build_ucx_spec` (refused by
    :func:`check_tcp` without --protocol ucx). Raises UsageError: a bad option."""
    return _build_spec("client", host, port, cport, protocol, ipv4, ipv6,
                       dict(streams=streams, seconds=seconds, omit=omit, interval=interval, length=length), opts)


def build_local_spec(streams: int, seconds: float, omit: float, interval: float, length: str, *, ipv4: bool = False,
                     ipv6: bool = False, protocol: str = "tcp", **opts: Any):
    """The NetSpec of `net local` (UcxSpec with --protocol ucx; ``opts`` as :func:`build_client_spec`'s).
    Raises UsageError: a bad option."""
    return _build_spec("local", DEFAULT_BIND, 0, None, protocol, ipv4, ipv6,
                       dict(streams=streams, seconds=seconds, omit=omit, interval=interval, length=length), opts)


def _build_spec(mode: str, host: str, port: int, cport: int | None, protocol: str, ipv4: bool, ipv6: bool,
                test: dict[str, Any], opts: dict[str, Any]):
    from gpubench.plugins.net.bench import NetSpec

    test.update({k: opts.pop(k) for k in _TCP_KEYS if k in opts})
    if protocol == "ucx":
        port = _check_port(port, allow_zero=False) if mode == "client" else port
        return build_ucx_spec(host, port, mode, test["seconds"], test["omit"], test["interval"], test["length"],
                              tcp_only_given(**test, ipv4=ipv4, ipv6=ipv6, cport=cport), **opts)
    check_tcp(opts)
    req = build_request(**test)
    family = _family(ipv4, ipv6)
    if mode == "local":
        return NetSpec(host="::1" if family == 6 else DEFAULT_BIND, port=0, request=req, mode="local", family=family)
    port = _check_port(port, allow_zero=False)
    if cport is not None:
        last = cport + req.streams * len(req.directions()) - 1
        if not 1 <= cport <= 65535 or last > 65535:
            raise UsageError(f"--cport {cport} out of range",
                             f"the data streams use cport to cport + {last - cport}: use 1 to {65535 - (last - cport)}")
    return NetSpec(host=host, port=port, request=req, family=family, cport=cport)


# the UCX options: (the option's name, its default)
_UCX_OPTIONS = {"memory": ("-m/--memory", "host"), "device": ("-d/--device", 0), "api": ("--api", "tag"),
                "in_flight": ("--in-flight", 32), "latency": ("--latency", False), "wait": ("--wait", "poll")}


def check_tcp(ucx: dict) -> None:
    """Refuse the UCX options with --protocol tcp (each at a value other than its default)."""
    for k, v in ucx.items():
        name, default = _UCX_OPTIONS[k]
        if v != default and not (k == "memory" and str(v).strip().lower() == "host"):
            raise UsageError(f"{name} applies to --protocol ucx only", "add --protocol ucx, or leave it out")


def build_ucx_spec(host: str, port: int, mode: str, seconds: float, omit: float, interval: float, length: str | None,
                   tcp_given: list[str], memory: str = "host", device: int = 0, api: str = "tag",
                   in_flight: int = 32, latency: bool = False, wait: str = "poll", check_machine: bool = True):
    """The UcxSpec of `net client|local --protocol ucx`: the schedule and -l checked as TCP's, the
    UCX options, then (``check_machine``) UCXX and for -m cuda a GPU.
    Raises UsageError: a TCP-only option (``tcp_given``), a bad value, UCXX missing, -m cuda without a GPU."""
    from gpubench.plugins.net.ucx import parse_memory
    from gpubench.plugins.net.ucx_bench import UcxSpec

    if tcp_given:
        raise UsageError(f"{tcp_given[0]} applies to --protocol tcp only", "leave it out with --protocol ucx")
    req = build_request(1, seconds, omit, interval, "1MiB" if length is None else length)
    mem = parse_memory(memory)
    _in_flight().check(in_flight)
    _device().check(device)
    ctx = click.get_current_context(silent=True)
    given = ctx is not None and ctx.get_parameter_source("device") not in (None, click.core.ParameterSource.DEFAULT)
    if given and "cuda" not in mem:  # -d picks the GPU of cuda buffers: with host memory it would be ignored
        raise UsageError(f"-d/--device {device} applies to -m cuda; -m {memory} uses host memory only",
                         "leave -d out, or give -m cuda (or cuda,host / host,cuda)")
    spec = UcxSpec(host=host, port=port, mode=mode, memory=mem, device=device, api=api, nbytes=req.buffer,
                   in_flight=in_flight, seconds=req.seconds, omit=req.omit, interval=req.interval, latency=latency,
                   wait=wait)
    if check_machine:
        from gpubench.plugins.net import ucx

        ucx.require_ucx()
        # net local: both sides are here; net client: the receive side is the server's, which checks its own
        ucx.require_cuda(mem if mode == "local" else (mem[0], "host"), device)
    return spec


def _check_port(port: int, *, allow_zero: bool) -> int:
    lo = 0 if allow_zero else 1
    if not lo <= port <= 65535:
        raise UsageError(f"--port {port} out of range", f"use {lo} to 65535" + (" (0: any free port)" if allow_zero else ""))
    return port


@command.command("server")
@click.option("-B", "--bind", default=DEFAULT_BIND, show_default=True,
              help="Address to listen on; 0.0.0.0 or :: to accept other hosts.")
@click.option("-p", "--port", type=_port("-p/--port", 0), default=DEFAULT_PORT, show_default=True, help="TCP port; 0 picks a free one.")
@click.option("-1", "--one-off", is_flag=True, help="Serve one test, then exit.")
@click.option("--protocol", type=click.Choice(["tcp", "ucx"]), default="tcp", show_default=True,
              help="Serve TCP tests, or UCX tests (`net client --protocol ucx`).")
@click.option("-d", "--device", type=StrictInt(bound=_device), default=0, show_default=True,
              help="--protocol ucx: the GPU of -m cuda buffers.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors and warnings.")
@kit.DEBUG_OPTION
def server(bind, port, one_off, protocol, device, quiet, debug):
    """Receive tests from `gpubench net client` until Ctrl-C or SIGTERM.

    One test at a time (others are told busy); a connection that sends no request within 2 s is
    dropped, and at most 512 wait at once (the oldest goes first); requests over the caps (128
    streams, 3600 s, 64 MiB writes) are refused.
    Listens on loopback only unless --bind says otherwise.
    """
    _check_port(port, allow_zero=True)

    def log(line: str) -> None:
        if not quiet:
            click.echo(safe.term(line, 1000))  # a log line can quote what a peer sent
            sys.stdout.flush()  # a server's log is read live (pipes are block-buffered)

    if protocol == "ucx":
        from gpubench.core.bounds import Bound
        from gpubench.plugins.net.ucx_server import UcxServer

        Bound("-d/--device", lo=0, hi=2**31 - 1).check(device)
        srv, name = UcxServer(bind, port, device=device, log=log), "gpubench net server (ucx)"

        def counts() -> str:
            return f"{srv.done} test(s) done, {srv.aborted} aborted"
    else:
        from gpubench.plugins.net.server import NetServer

        if device != 0:
            raise UsageError("-d/--device applies to --protocol ucx only", "add --protocol ucx, or leave it out")
        srv, name = NetServer(bind, port, log=log), "gpubench net server"

        def counts() -> str:
            s = srv.stats
            return f"{s.tests_done} test(s) done, {s.tests_aborted} aborted, {s.refused} refused"
    addr, real_port = srv.open()
    scope = " (loopback only; --bind 0.0.0.0 to serve other hosts)" if addr.startswith("127.") or addr == "::1" else ""
    log(f"{name}: listening on {hostport(addr, real_port)}{scope}")
    try:
        srv.serve_forever(max_tests=1 if one_off else None)
    except (KeyboardInterrupt, Interrupted):
        log(f"{name}: stopped; {counts()}")
        raise
    finally:
        srv.close()
    log(f"{name}: done; {counts()}")
    return 0


def _net_run(spec):
    """net's run for client and local: with the report shown, live interval lines for a progress bar."""
    from gpubench.plugins.net import bench as net
    from gpubench.plugins.net.lines import LiveLines

    def write(line: str) -> None:  # to the human report's stream, escaped, flushed at once (a pipe is block-buffered)
        out = report.human_stream()
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: the result is still saved
            out.write(safe.term(line, 1000) + "\n")
            out.flush()

    def run(s, progress):
        ctx = click.get_current_context(silent=True)
        own = ctx is not None and ctx.command.name in ("client", "local")  # not a suite's step
        mod = net
        if getattr(s, "protocol", "tcp") == "ucx":
            from gpubench.plugins.net import ucx_bench as mod
        if not own or not isinstance(progress, report.RichProgress) or progress.quiet:
            return mod.run(s, progress)
        return mod.run(s, report.ProgressSink(), live=LiveLines(write, s.request.direction == "both"))

    return run


CLIENT_HELP = """Send to a `gpubench net server` on HOST and report the throughput it received.

    Per-interval and per-stream figures in Gbit/s and GB/s; the total is the bytes received in the
    counted intervals (after --omit) over their seconds.
    """

LOCAL_HELP = """Run a server and a client on this machine over loopback (127.0.0.1): a quick check.

    Loopback measures the host's memory and TCP stack, not a network card.
    """


def _gbit3(rate_bytes_per_s: float) -> str:
    """Gbit/s in 3 or 4 digits (iperf3's precision), for the per-stream columns: 9.18, 10.3, 123."""
    v = rate_bytes_per_s * 8 / 1e9
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _cpu(v) -> str:
    return "-" if v is None else f"{v:.2f} s"


def transport_lines(transports: dict, receives_only: str | None = None) -> list[str]:
    """One line per endpoint: its lanes (transport/device: role) and what carried the messages.
    ``receives_only``: the side that never sends in this test ("server" in bandwidth tests), whose
    endpoint has no table of its own for these messages: the sender's protocol carried them."""
    out = []
    for side in ("client", "server"):
        t = transports.get(side)
        if not t:
            out.append(f"{side} endpoint: transports not known")
            continue
        lanes = ", ".join(f"{ln['transport']}/{ln['device']} ({ln['roles']})" for ln in t.get("lanes", [])) or "none listed"
        row = t.get("carried_by")
        via = (f"; these messages: {row['protocol']} over {row['via']}"
               + (" (UCX's choice before the receiver's reply, which may change it)" if row.get("remote_decides") else "")
               if row else "; it receives: the sender's protocol carried these messages" if side == receives_only else "")
        out.append(safe.term(f"{side} endpoint lanes: {lanes}{via}", 600))
    return out


def _ucx_report(result, units: str = "GB") -> list:
    """``--protocol ucx``'s report: the header, the interval table and total (or a row per latency
    size), the transports, the notes (every string from UCX or the server escaped)."""
    from rich.text import Text

    spec = result.spec
    where = "loopback, this machine" if spec.get("mode") == "local" else hostport(str(spec.get("host")), spec.get("port", 0))
    recs = result.records
    out: list = []
    if not recs:
        return [report.partial_note(result, "intervals")] if result.partial else ["no records"]
    what = "latency (ping-pong)" if spec.get("latency") else f"bandwidth, {spec.get('in_flight')} messages in flight"
    out.append(Text(safe.term(f"gpubench net --protocol ucx, {where}: {spec.get('api')} API, {what}, "
                              f"{format_size(spec.get('nbytes', 0))} messages, memory {spec.get('memory')}", 400)))
    if spec.get("latency"):
        t = report.table("One-way latency per message size (half the round trip)",
                         ["size", "median us", "min us", "max us", "round trips", f"{units}/s"])
        for r in recs:
            if not r.samples_s:
                continue
            s = sorted(r.samples_s)
            med = s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2
            t.add_row(format_size(r.nbytes), f"{med * 1e6:.2f}", f"{s[0] * 1e6:.2f}", f"{s[-1] * 1e6:.2f}",
                      str(r.extra.get("round_trips", "-")), format_rate(r.nbytes / med, units))
        out.append(t)
    else:
        r = recs[0]
        ex = r.extra
        starts, ends, omits, got = ex["interval_start_s"], ex["interval_end_s"], ex["interval_omit"], ex["interval_bytes"]
        t = report.table("Intervals: bytes of the sends completed", ["interval s", "messages", "Gbit/s", f"{units}/s"],
                         caption="* omitted (-O): measured, not counted" if any(omits) else None)
        for a, b, om, n in zip(starts, ends, omits, got):
            rate = n / (b - a) if b > a else 0.0
            t.add_row(f"{a:.2f}-{b:.2f}" + ("*" if om else ""), str(n // max(1, r.nbytes)), gbit(rate),
                      format_rate(rate, units))
        out.append(t)
        out.append(f"Total: {format_size(ex['counted_bytes'])} in {ex['counted_seconds']:.3f} s = "
                   f"{format_rate(ex['bytes_per_s'], units)} {units}/s ({gbit(ex['bytes_per_s'])} Gbit/s), "
                   f"the counted intervals' bytes over their seconds")
    out += transport_lines(recs[0].extra.get("transports", {}), None if spec.get("latency") else "server")
    buffers = result.timing.get("buffers")
    if isinstance(buffers, dict) and "cuda" in buffers.values() and any("host" in str(v) for v in buffers.values()):
        out.append(safe.term(f"Buffers: client {buffers.get('client')}, server {buffers.get('server')} "
                             "(host memory is page-locked when the other side is GPU memory, as ucx_perftest's "
                             "are registered with UCX; where CuPy sees no GPU it stays pageable).", 400))
    checked = all(r.extra.get("data_checked") for r in recs)
    out.append("Data: the receiver's buffer matched the sent pattern after the last message." if checked and
               not spec.get("latency") else "Data: every size's last echo matched what was sent." if checked else
               "Data: not checked (the test did not reach its end).")
    out.append(f"{units}/s = {'1e9' if units == 'GB' else '2^30'} B/s (ucx_perftest prints MB/s of 2^20 B/s); "
               "sizes in binary units. docs/net.md \"UCX\" says how this is measured and how to read it "
               "against ucx_perftest.")
    if result.partial:
        out.append(report.partial_note(result, "intervals" if not spec.get("latency") else "sizes"))
    return out


def format_report(result, units: str = "GB") -> list:
    """Per direction the interval and stream tables and the CPU line, then notes."""
    from rich.text import Text

    if result.spec.get("protocol") == "ucx":
        return _ucx_report(result, units)

    from gpubench.core.stats import Summary
    from gpubench.plugins.net.lines import DIRECTION_WORDS, summary_lines, test_words

    spec = result.spec
    by_dir: dict[str, dict] = {}
    for r in result.records:
        by_dir.setdefault(r.params.get("direction", "c2s"), {})[r.params["stream"]] = r
    out: list = []
    if not any("total" in recs for recs in by_dir.values()):  # a run stopped before the first interval arrived
        return [report.partial_note(result, "intervals")] if result.partial else ["no records"]
    where = "loopback, this machine" if spec.get("mode") == "local" else hostport(str(spec["host"]), spec["port"])
    try:
        asked = test_words(spec, (result.timing or {}).get("socket_buffers"))
    except (KeyError, TypeError, ValueError):  # a file from an older gpubench: what it has
        asked = f"{spec.get('streams')} stream(s)"
    out.append(Text(safe.term(f"gpubench net, {where}: {asked}", 2000)))  # plain text: no rich markup in a host
    for d, recs in by_dir.items():
        total = recs.get("total")
        if total is None:
            continue
        streams = [k for k in recs if k != "total"]
        ex = total.extra
        starts, ends, omits = ex["interval_start_s"], ex["interval_end_s"], ex["interval_omit"]
        per_stream_cols = len(streams) <= 8
        # narrow columns (a stream's head is its number), so 8 streams fit 100 columns
        title = (f"Intervals, {DIRECTION_WORDS.get(d, d)}: Gbit/s in all and "
                 + ("per stream (0, 1, ...)" if per_stream_cols else "of the slowest and fastest stream"))
        cols = ["interval s", "Gbit/s", f"{units}/s"]
        cols += [str(k) for k in streams] if per_stream_cols else ["slowest", "fastest"]
        t = report.table(title, cols, caption="* omitted (-O): measured, not counted" if any(omits) else None)
        for i, (a, b, om) in enumerate(zip(starts, ends, omits)):
            dt = b - a
            row = [f"{a:.2f}-{b:.2f}" + ("*" if om else "")]
            tot = ex["interval_bytes"][i] / dt if dt > 0 else 0.0
            row += [gbit(tot), format_rate(tot, units)]
            rates = [recs[k].extra["interval_bytes"][i] / dt if dt > 0 else 0.0 for k in streams]
            row += [_gbit3(r) for r in rates] if per_stream_cols else [_gbit3(min(rates)), _gbit3(max(rates))]
            t.add_row(*row)
        out.append(t)

        st = report.table(f"Per stream, counted intervals, {DIRECTION_WORDS.get(d, d)} (min / med / max: "
                          "of the intervals)",
                          ["stream", "received", "seconds", "Gbit/s", f"{units}/s", "min / med / max", "retr", "cwnd"])
        for k in [*streams, "total"]:
            r = recs[k]
            e = r.extra
            spread = "-"
            rates = [b / (en - s0) for b, s0, en, om in zip(e["interval_bytes"], starts, ends, omits) if not om and en > s0]
            if rates:
                sm = Summary.of(rates)
                spread = f"{gbit(sm.min)} / {gbit(sm.median)} / {gbit(sm.max)}"
            retrans = e.get("retransmits")
            cwnd = e.get("cwnd_bytes")
            st.add_row(str(k), format_size(e["counted_bytes"]), f"{e['counted_seconds']:.3f}", gbit(e["bytes_per_s"]),
                       format_rate(e["bytes_per_s"], units), spread, "-" if retrans is None else str(retrans),
                       "-" if cwnd is None else format_size(cwnd))
        out.append(st)
        sender_side, receiver_side = ("client", "server") if d == "c2s" else ("server", "client")
        per = ex.get("cpu_s_per_gbit")
        out.append(f"CPU ({DIRECTION_WORDS.get(d, d)}): sender ({sender_side}) {_cpu(ex.get('sender_cpu_s'))}, "
                   f"receiver ({receiver_side}) {_cpu(ex.get('receiver_cpu_s'))}"
                   + (f"; {per:.4f} CPU-s per Gbit moved" if per is not None else ""))
    zero_copy = not spec.get("copy", False)
    out.append(f"Figures are bytes the receiver counted, per interval of its clock. Total = bytes in the counted "
               f"intervals / their seconds (the duration-weighted mean of the interval rates, never above the "
               f"fastest interval). Gbit/s = 1e9 bit/s; {units}/s = {'1e9' if units == 'GB' else '2^30'} B/s; "
               f"sizes in binary units. CPU = user + system seconds of the worker processes that moved the data. "
               + ("Zero copy: sendfile from a memory file, received with MSG_TRUNC (not copied to user memory)."
                  if zero_copy else "--copy: send() from a buffer, recv_into a reused buffer."))
    if spec.get("mode") == "local":
        out.append("Loopback measures this host's memory and TCP stack, not a network card.")
    zeros = [f"{k} ({d})" for d, recs in by_dir.items() for k, r in recs.items()
             if k != "total" and r.extra.get("zero_intervals")]
    if zeros:
        out.append(f"Stream(s) {', '.join(zeros)} received nothing in some counted interval(s): stalled.")
    if result.partial:
        out.append(report.partial_note(result, "intervals"))
    # last, as iperf3 ends: [SUM] sender, [SUM] receiver (Text: rich would take "[c2s]" for markup)
    out += [Text(line) for line in summary_lines(by_dir)]
    return out


command.add_command(benchmark_command("client", CLIENT_OPTIONS, build_client_spec, format_report, help=CLIENT_HELP,
                                      run=_net_run, conditions=False))
command.add_command(benchmark_command("local", [*TEST_OPTIONS, *UCX_OPTIONS], build_local_spec, format_report, help=LOCAL_HELP,
                                      run=_net_run, conditions=False))


NODES_HELP = """Under a launcher (mpirun, srun, torchrun): TCP throughput between the ranks, or UCX
    with --protocol ucx (host or GPU memory, -m).

    Start one rank per node. Every rank runs a net server; tests run in rounds in which no node
    is in two tests: ring neighbours (default), two rings that tell a slow node from a slow link
    (--pairs rings), every ordered pair (--pairs all, the circle method), or all ranks to one
    (--to RANK). Rank 0 prints the sender x receiver Gbit/s matrix; a link below the fleet rule's
    bound against the matrix median is flagged (exit 1), and the slow sender, receiver or link named.
    """


def _nodes_command() -> click.Command:
    """The ``nodes`` sub-command (docs/fleet.md "The network between nodes")."""

    def callback(streams, seconds, omit, interval, length, pairs, to, bind, rendezvous, timeout, json_path, units,
                 quiet, debug, reverse=False, bidir=False, window=None, bitrate=None, copy=False, ipv4=False,
                 ipv6=False, protocol="tcp", **ucx):
        from gpubench.plugins.net import fleet as net_fleet
        from gpubench.launch import ranks
        from gpubench.core.errors import MachineError, RegressionFound, from_the_command_line

        with from_the_command_line():  # the options alone: every rank refuses them alike, and rank 0 alone says so
            if rendezvous is not None:
                ranks.parse_rendezvous(rendezvous)
            if ipv4 or ipv6:
                raise UsageError("-4/-6 are for net client and net local", "under a launcher, choose the family with -B/--bind")
            ctx = click.get_current_context()
            if to is not None and ctx.get_parameter_source("pairs") not in (None, click.core.ParameterSource.DEFAULT):
                # --to is one round of many-to-one; --pairs was silently ignored beside it
                raise UsageError(f"--to {to} and --pairs {pairs} are two schedules", "give one of them")
            test = dict(streams=streams, seconds=seconds, omit=omit, interval=interval, length=length, reverse=reverse,
                        bidir=bidir, window=window, bitrate=bitrate, copy=copy)
            if protocol == "ucx":
                ucx_spec = build_ucx_spec("", 0, "client", seconds, omit, interval, length, tcp_only_given(**test), **ucx,
                                          check_machine=False)
                req = ucx_spec.request
            else:
                check_tcp(ucx)
                ucx_spec, req = None, build_request(**test)
            _check_values({"timeout": timeout, "to": to}, req)  # before the launcher's checks
            me = ranks.discover()
            if not me.under_launcher:
                raise UsageError("gpubench net nodes runs under a launcher (mpirun, srun, torchrun) or with RANK, "
                                 "WORLD_SIZE, MASTER_ADDR and MASTER_PORT set",
                                 "e.g. mpirun -n 4 gpubench net nodes; between two hosts: net server / net client")
            if me.size == 1:  # nothing between nodes to measure: an empty matrix and exit 0 would pass a check
                raise UsageError(f"gpubench net nodes needs 2 or more ranks; the launcher ({me.launcher}) started 1",
                                 "start one rank per node (mpirun -n 4 --map-by node, srun -N 4 --ntasks-per-node=1); "
                                 "on one host: gpubench net local")
            if to is not None and me.size and not 0 <= to < me.size:
                raise UsageError(f"--to {to} out of range", f"use a rank 0 to {me.size - 1}")
            spec = net_fleet.NetFleetSpec(req, pairs, to, bind, connect_timeout=min(timeout, 10.0), timeout=timeout,
                                          ucx=ucx_spec)
        net_fleet.check_machine(spec)  # this rank's own machine: said by the rank that lacks it
        group = ranks.join(me, rendezvous, timeout=timeout)
        try:
            result = net_fleet.run(group, spec, keep_partial=True)
            if result is None:
                code = 0
            else:  # rank 0 reports before the close, whose end the others wait for
                code = kit.finish(result, net_fleet.format_report(result, units), json_path=json_path, quiet=quiet)
                if result.partial:  # interrupted: kept the rounds that ended; told to the others
                    group.close(quiet=True, interrupted=Interrupted(signal.Signals[result.interrupted_by].value))
                    return code
                why = net_fleet.verdict(result)
                if why:
                    raise RegressionFound(why)
        except MachineError as e:  # a rank lost: rank 0 shows and saves the rounds that ended first
            if e.partial_result is not None:
                kit.finish(e.partial_result, net_fleet.format_report(e.partial_result, units), json_path=json_path,
                           quiet=quiet)
            group.close(quiet=True)
            raise
        except BaseException:
            group.close(quiet=True)  # the end is still said (rank 0 confirms it), but the error on its way wins
            raise
        group.close(quiet=False)  # exit 0 only once rank 0 confirmed the end (raises naming the rank that did not)
        return code

    callback.__doc__ = NODES_HELP
    f = common_options(callback, written_by_rank_0=True)
    opts = [*TEST_OPTIONS, *[o for o in UCX_OPTIONS if o is not LATENCY_OPTION],
            click.option("--pairs", type=click.Choice(["ring", "rings", "all"]), default="ring", show_default=True,
                         help="ring: rank i to i+1 (2 rounds, 3 for an odd count); rings: that ring and a second of "
                              "stride s, so a slow node is told from a slow link (4 rounds, 5 for an odd count); "
                              "all: every ordered pair (2(n-1) rounds)."),
            click.option("--to", "to", type=StrictInt(bound=_to_bound), default=None, help="Many-to-one: every other rank sends to RANK at once."),
            click.option("-B", "--bind", type=kit.Text(), default="0.0.0.0", show_default=True,
                         help="Address each rank's server listens on (a specific one is also told to the peers)."),
            click.option("--rendezvous", default=None, help="HOST:PORT of rank 0's store (default: the launcher's)."),
            click.option("-T", "--timeout", type=StrictFloat(bound=_timeout_bound), default=60.0, show_default=True,
                         help="Seconds to wait for the other ranks: to join, and from a round's start to its end "
                              "(at least the round's length: -O + -t + -i + 10 s + 5 s, 10 s more over UCX); a rank "
                              "later than that is named."),
            ]
    for opt in reversed(opts):
        f = opt(f)
    return click.command("nodes", help=NODES_HELP)(f)


command.add_command(_nodes_command())  # under a launcher

"""``gpubench net`` under a launcher: net's test (TCP, or ``--protocol ucx``'s) between ranks, one
rank per node, in rounds computed alike on every rank (:func:`schedule`) where no node is in two
tests; rank 0 gathers one record per link and a sender x receiver matrix of Gbit/s, a link flagged
slow by the fleet rule (:func:`gpubench.validation.fleet.flag`). The method: docs/fleet.md "The
network between nodes"."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from gpubench.plugins.net.protocol import STALL_S, Request
from gpubench.core.bounds import MAX_TIMEOUT_S, bounded, check_bounds
from gpubench.core.errors import GpubenchError, MachineError, UsageError
from gpubench.core.result import Record, Result
from gpubench.core.signals import Interrupted

PAIRS = ("ring", "rings", "all")
# A round's allowance beyond omit + seconds + one interval for a healthy test (docs/fleet.md)
ROUND_MARGIN_S = 5.0
# --protocol ucx adds its start: the receiver's test process and the sender's UCP context and endpoint
UCX_START_S = 10.0
# net's client waits this long past an interval line's due time before it calls the server stalled
# (bench.py _Session.next_intervals); a round's deadline covers it
CLIENT_STALL_S = 10.0
# the report prints the matrix up to this many nodes, every link up to this many (then the flagged)
MATRIX_SHOWN = 32
LINKS_SHOWN = 64


@dataclass(frozen=True)
class NetFleetSpec:
    """Options of ``gpubench net`` under a launcher."""

    request: Request = field(default_factory=Request)  # -P, -t, -O, -i, -l of each test
    pairs: str = "ring"  # "ring", "rings" or "all" (:func:`schedule`)
    to: int | None = None  # many-to-one: every other rank sends to this rank at once (pairs unused)
    bind: str = "0.0.0.0"  # each rank's server's address; a specific one is told to the peers (:func:`advertised`)
    connect_timeout: float = 10.0  # seconds to connect and for each reply before a test starts
    # -T: seconds a rank waits for the others at the first barrier; see :attr:`round_timeout`
    timeout: float = bounded(60.0, "-T/--timeout", lo=0, above=True, hi=MAX_TIMEOUT_S, unit="seconds")
    ucx: Any = None  # --protocol ucx: each test's UcxSpec (host and port set per link); None: TCP

    def __post_init__(self):
        """Raises UsageError: a field outside its bound."""
        check_bounds(self)

    @property
    def protocol(self) -> str:
        return "tcp" if self.ucx is None else "ucx"

    def to_dict(self) -> dict:
        out = {"mode": "fleet", "pairs": None if self.to is not None else self.pairs, "to": self.to,
               "bind": self.bind, "protocol": self.protocol, **asdict(self.request)}
        if self.ucx is not None:
            u = self.ucx
            out.update(memory=u.memory_text(), device=u.device, api=u.api, in_flight=u.in_flight, wait=u.wait)
        return out

    @property
    def round_work(self) -> float:
        """Seconds a round's tests may take: omit + seconds + interval + the allowances above."""
        r = self.request
        return r.omit + r.seconds + r.interval + CLIENT_STALL_S + ROUND_MARGIN_S + (UCX_START_S if self.ucx else 0)

    @property
    def round_timeout(self) -> float:
        """Seconds from a round's start to the barrier that ends it: max(timeout, round_work)."""
        return max(self.timeout, self.round_work)


Edge = tuple[int, int]  # (sender, receiver), ranks


def circle_rounds(members: Sequence[int]) -> list[list[tuple[int, int]]]:
    """Round-robin tournament by the circle method (Kirkman 1847; E. Lucas, *Recreations
    mathematiques* II, 1883): n - 1 rounds (n even) of n/2 disjoint pairs, every unordered pair
    exactly once; an odd n gets a bye (n rounds, one member idle in each).
    """
    players: list[int | None] = list(members)
    if len(players) % 2:
        players.append(None)
    n = len(players)
    out = []
    for _ in range(n - 1):
        pairs = [(players[i], players[n - 1 - i]) for i in range(n // 2)]
        out.append([(a, b) for a, b in pairs if a is not None and b is not None])
        players = [players[0], players[-1], *players[1:-1]]
    return [r for r in out if r]


def stride(n: int) -> int | None:
    """The stride s of the second ring of ``rings`` among n members (i -> i + s mod n), or None
    when none fits (n <= 4, and n = 6). s is co-prime with n, not +-1, not 2, and 2 s != 2 mod n
    (why: docs/fleet.md, ``--pairs rings``); among those the closest to n / 2, the smaller on a tie.
    """
    fits = [s for s in range(3, n - 1) if math.gcd(s, n) == 1 and (2 * s - 2) % n]
    return min(fits, key=lambda s: (abs(2 * s - n), s)) if fits else None


def _both_ways(members: Sequence[int]) -> list[list[Edge]]:
    """Every ordered pair: each round of :func:`circle_rounds` twice, a -> b, then b -> a."""
    return [half for r in circle_rounds(members) for half in (list(r), [(b, a) for a, b in r])]


def _cycle_rounds(order: Sequence[int]) -> list[list[Edge]]:
    """The cycle order[0] -> ... -> order[0] in rounds: even edges, odd edges, an odd length's last alone."""
    n = len(order)
    edges = [(order[k], order[(k + 1) % n]) for k in range(n)]
    last = n - 1 if n % 2 else n
    out = [edges[0:last:2], edges[1:last:2]]
    return out + ([[edges[-1]]] if n % 2 else [])


def rings_rounds(members: Sequence[int]) -> list[list[Edge]]:
    """``--pairs rings``: the ring (i sends to i + 1) and a second ring of stride :func:`stride`,
    in 4 rounds for an even count and 5 for an odd one (the two rings' odd edges in one round).
    2 to 4 members: every ordered pair; 6 members: the second ring is the first reversed (s = -1).
    """
    members = list(members)
    n = len(members)
    if n <= 4:
        return _both_ways(members)
    s = stride(n) or n - 1
    first = _cycle_rounds(members)
    # start the second ring where its odd edge (a - s -> a) shares no member with the first's
    # (position n - 1 -> 0), so the two fit in one round
    a = next(a for a in range(n) if not {(a - s) % n, a} & {n - 1, 0}) if n % 2 else 0
    second = _cycle_rounds([members[(a + k * s) % n] for k in range(n)])
    if n % 2:
        return [first[0], first[1], first[2] + second[2], second[0], second[1]]
    return first + second


def schedule(members: Sequence[int], pairs: str = "ring", to: int | None = None) -> list[list[Edge]]:
    """The rounds of directed tests (sender, receiver) among ``members`` (ranks, in order).
    Raises UsageError: ``to`` is not one of the members, or ``pairs`` is not known."""
    members = list(members)
    if to is not None:
        if to not in members:
            raise UsageError(f"--to {to} is not a rank taking part", f"use one of {_ranks_text(members)}")
        return [[(m, to) for m in members if m != to]] if len(members) > 1 else []
    rounds = {"ring": lambda m: _cycle_rounds(m) if len(m) > 1 else [], "rings": rings_rounds,
              "all": _both_ways}.get(pairs)
    if rounds is not None:
        return rounds(members)
    raise UsageError(f"--pairs {pairs!r} not known", f"use {' or '.join(PAIRS)}")


def _ranks_text(members: Sequence[int]) -> str:
    if members and list(members) == list(range(members[0], members[0] + len(members))):
        return f"{members[0]} to {members[-1]}"
    return ", ".join(map(str, members))


def check_machine(spec: NetFleetSpec) -> None:
    """With UCX, UCXX and for ``-m cuda`` the GPU here. Raises UsageError naming what is missing."""
    if spec.ucx is None:
        return
    from gpubench.plugins.net import ucx

    ucx.require_ucx()
    ucx.require_cuda(spec.ucx.memory, spec.ucx.device)


def serve(stack: contextlib.ExitStack, spec: NetFleetSpec) -> int:
    """One of net's servers (NetServer, or UcxServer with ``spec.ucx``) on ``spec.bind``, any free
    port, serving in a thread until ``stack`` closes. Returns its TCP port.
    Raises UsageError: ``bind`` is not an address of this host (net's server says which)."""
    srv: Any
    if spec.ucx is None:
        from gpubench.plugins.net.server import NetServer

        # a test opens one control and ``streams`` data connections; a few more may wait
        srv = NetServer(spec.bind, 0, max_pending=spec.request.streams + 8)
    else:
        from gpubench.plugins.net.ucx_server import UcxServer

        srv = UcxServer(spec.bind, 0, device=spec.ucx.device)
    _, port = srv.start()
    stack.callback(srv.close, 5.0)
    return port


def run_client(host: str, port: int, spec: NetFleetSpec) -> Record:
    """One net test from here to ``host:port`` (TCP, or UCX with ``spec.ucx``): its "total" record.
    Raises GpubenchError: what net raised; KeyboardInterrupt or Interrupted: a signal."""
    from dataclasses import replace

    from gpubench.core.signals import raise_if_signalled
    from gpubench.plugins.net import bench as net

    if spec.ucx is not None:
        from gpubench.plugins.net import ucx_bench

        res = ucx_bench.run(replace(spec.ucx, host=host, port=port, connect_timeout=spec.connect_timeout))
    else:
        res = net.run(net.NetSpec(host=host, port=port, request=spec.request, connect_timeout=spec.connect_timeout))
    if res.interrupted_by:  # the test kept what it measured; the rank stops here (its group tells the others)
        raise_if_signalled()
    totals = [r for r in res.records if r.params.get("stream") == "total"]
    if not totals:
        raise MachineError(f"net test to {host} port {port} returned no total "
                           f"({res.failed_by or res.interrupted_by or 'no intervals'})")
    return totals[0]


def advertised(bind: str, env: Mapping[str, str] | None = None) -> str:
    """The address peers are told to connect to: a specific ``bind``, else the source address
    toward ``MASTER_ADDR`` (a connected UDP socket), else the host name's, else 127.0.0.1."""
    if bind not in ("0.0.0.0", "::", ""):
        return bind
    source: Mapping[str, str] = os.environ if env is None else env
    master = source.get("MASTER_ADDR")
    if master:
        with contextlib.suppress(OSError, ValueError, UnicodeError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master, int(source.get("MASTER_PORT") or 9)))
            return s.getsockname()[0]
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def link_params(spec: NetFleetSpec, src: int, dst: int) -> dict:
    """A link record's params: the ranks, and what net's other records carry (protocol, memory)."""
    out = {"src": src, "dst": dst, "stream": "total", "direction": "c2s", "protocol": spec.protocol}
    if spec.ucx is not None:
        out.update(memory=spec.ucx.memory_text(), api=spec.ucx.api)
    else:
        out["memory"] = "host"
    return out


def _link_record(src: int, dst: int, total: Record, streams: int, params: dict | None = None) -> Record:
    """The link's record from its test's total; a stalled stream (:data:`STALL_S`) fails it."""
    ex = total.extra
    stalled = ex.get("stalled_streams") or []
    error = total.error or (f"stream(s) {', '.join(map(str, stalled))} of {streams} received nothing for "
                            f"{STALL_S:g} s or more of the counted time (stalled)" if stalled else None)
    return Record(params=params or {"src": src, "dst": dst, "stream": "total"}, metric="bandwidth", nbytes=total.nbytes,
                  samples_s=[] if error else list(total.samples_s), reps=total.reps, error=error,
                  extra={k: ex[k] for k in ("gbit_per_s", "bytes_per_s", "counted_bytes", "counted_seconds",
                                            "interval_bytes", "zero_intervals", "stalled_streams", "sent_bytes",
                                            "messages", "transports", "data_checked")
                         if k in ex})


def _run_mine(round_: list[Edge], me: int, peers: dict[int, dict], spec: NetFleetSpec, senders: list[int]
              ) -> list[Record]:
    out = []
    for a, b in round_:
        if a != me:
            continue
        info = peers[b]
        port = info["ports"][senders.index(a) if spec.to is not None else 0]
        try:
            out.append(_link_record(a, b, run_client(info["addr"], port, spec), spec.request.streams,
                                    link_params(spec, a, b)))
        except GpubenchError as e:
            out.append(Record(params=link_params(spec, a, b), nbytes=spec.request.buffer,
                              error=e.one_line()[:300]))
    return out


def run(group, spec: NetFleetSpec, members: Sequence[int] | None = None, keep_partial: bool = False
        ) -> Result | None:
    """The net test between ranks: every rank of ``group`` (a :class:`gpubench.launch.ranks.Group`)
    calls this with the same spec; ``members`` the ranks that take part (default all). Returns on
    rank 0 a Result (spec mode "fleet"): one record per link, params src, dst and stream "total",
    extra "gbit_per_s", "src_host", "dst_host", "round"; ``timing["matrix"]`` = {"hosts": [label per
    member], "gbps": sender x receiver Gbit/s}; with ``keep_partial``, interrupted or a rank lost: the
    rounds that ended, marked partial. Other ranks: None. Raises UsageError: ``--to`` names a rank not
    taking part; MachineError: a rank missed a round's deadline; KeyboardInterrupt, Interrupted: a
    signal during the rounds (on rank 0 without ``keep_partial``)."""
    members = sorted(range(group.size) if members is None else members)
    rounds = schedule(members, spec.pairs, spec.to)
    me = group.rank
    taking_part = me in members
    senders = [m for m in members if m != spec.to]
    count = (len(senders) if me == spec.to else 1) if taking_part else 0
    links: list[Record] = []  # rank 0's: every finished round's links, gathered at its end
    stopped: BaseException | None = None
    with contextlib.ExitStack() as servers:
        ports = [serve(servers, spec) for _ in range(count)]
        mine = {"rank": me, "host": getattr(group.me, "host", socket.gethostname()),
                "addr": advertised(spec.bind), "ports": ports}
        everyone = group.allgather(mine)
        peers = {d["rank"]: d for d in everyone if d and d["rank"] in members}
        t0 = time.time()
        group.barrier(timeout=spec.timeout, what="start of the net rounds")
        try:
            for k, round_ in enumerate(rounds):
                started = time.monotonic()
                records = []
                for rec in _run_mine(round_, me, peers, spec, senders):
                    rec.extra["round"] = k
                    records.append(rec.to_dict())
                # the round's end: every rank is due round_timeout after it began; rank 0 confirms the receipt
                left = started + spec.round_timeout - time.monotonic()
                got = group.gather(records, timeout=max(left, 0.5), waited=spec.round_timeout, confirm=True,
                                   what=f"end of net round {k + 1} of {len(rounds)} (due {spec.round_timeout:g} s "
                                        "after its start)")
                links.extend(Record.from_dict(d) for part in got or [] for d in (part or []))
        except (KeyboardInterrupt, Interrupted) as e:
            if me != 0 or not keep_partial:
                raise
            stopped = e
        except MachineError as e:  # a rank lost: rank 0 still holds the rounds that ended
            if me == 0 and keep_partial and links:
                e.partial_result = build_result(spec, members, peers, rounds, links, time.time() - t0)
                e.partial_result.partial, e.partial_result.failed_by = True, e.one_line()
            raise
        elapsed = time.time() - t0
    if me != 0:
        return None
    result = build_result(spec, members, peers, rounds, links, elapsed)
    if stopped is not None:
        result.partial = True
        result.interrupted_by = signal.Signals(getattr(stopped, "signum", signal.SIGINT)).name
    return result


def _gbit(link: Record) -> float | None:
    """A link's Gbit/s; None where its test failed."""
    g = link.extra.get("gbit_per_s")
    return float(g) if link.error is None and isinstance(g, (int, float)) else None


def matrix(members: Sequence[int], links: Sequence[Record]) -> list[list[float | None]]:
    """Sender x receiver Gbit/s (members' order); None where no test ran or it failed."""
    pos = {m: i for i, m in enumerate(members)}
    out: list[list[float | None]] = [[None] * len(members) for _ in members]
    for r in links:
        out[pos[r.params["src"]]][pos[r.params["dst"]]] = _gbit(r)
    return out


def build_result(spec: NetFleetSpec, members: Sequence[int], peers: dict[int, dict], rounds: list[list[Edge]],
                 links: list[Record], elapsed_s: float) -> Result:
    """Rank 0's Result of the gathered link records (see :func:`run`)."""
    hosts = [str(peers.get(m, {}).get("host", f"rank {m}")) for m in members]
    labels = [h if hosts.count(h) == 1 else f"{h}#{m}" for h, m in zip(hosts, members)]  # "#rank": a shared host
    label = dict(zip(members, labels))
    links.sort(key=lambda r: (r.extra.get("round", 0), r.params["src"], r.params["dst"]))
    for r in links:
        r.extra["src_host"] = label[r.params["src"]]
        r.extra["dst_host"] = label[r.params["dst"]]
    req = spec.request
    timing = {
        "clock": "perf_counter (each receiving rank's server)" if spec.ucx is None else
                 "perf_counter (each sending rank)",
        "interval_s": req.interval,
        "omit_s": req.omit,
        "method": ("net's test per link (bytes received per interval, counted by the receiver); rounds "
                   if spec.ucx is None else "net --protocol ucx's test per link (sends completed per interval, "
                   f"{spec.ucx.in_flight} in flight; the receiver's count checked at the end); rounds ")
                  + "started by a barrier, no node in two tests of a round",
        "rounds": [[list(e) for e in r] for r in rounds],
        "ranks": list(members),
        "addresses": {str(m): peers[m]["addr"] for m in members if m in peers},
        "seconds": round(elapsed_s, 3),
        "matrix": {"hosts": labels, "gbps": matrix(members, links)},
    }
    from gpubench.core import env as envmod

    env = {"host": envmod.host_info(), "versions": envmod.versions(), "nodes": len({str(peers.get(m, {}).get("host", m)) for m in members})}
    return Result(command="net", spec=spec.to_dict(), timing=timing, env=env, records=links)


def link_flags(result: Result) -> list[tuple[Record, str, float | None]]:
    """(link record, flag, matrix median) per link: "fail" without a figure, "slow" by the fleet rule, or "ok"."""
    from gpubench.validation.fleet import flags, median

    measured = [r.error is None and "gbit_per_s" in r.extra for r in result.records]
    values = [r.extra["gbit_per_s"] if ok else None for r, ok in zip(result.records, measured)]
    present = [v for v in values if v is not None]
    med = median(present) if present else None
    return [(r, f if ok else "fail", med) for r, f, ok in zip(result.records, flags(values), measured)]


def culprits(result: Result) -> list:
    """The verdicts on the links of a net-between-nodes Result (:func:`gpubench.plugins.net.culprits.infer`)."""
    from gpubench.plugins.net.culprits import infer

    figures: dict[Edge, float | None] = {}
    labels: dict[int, str] = {}
    for r in result.records:
        a, b = int(r.params["src"]), int(r.params["dst"])
        figures[(a, b)] = _gbit(r)
        labels.setdefault(a, str(r.extra.get("src_host", f"rank {a}")))
        labels.setdefault(b, str(r.extra.get("dst_host", f"rank {b}")))
    return infer(figures, labels)


def slow_summary(result: Result) -> list[str]:
    """Plain lines naming the slow and failed links, then the verdicts (host names raw: the caller escapes them)."""
    flagged = [(r, f, m) for r, f, m in link_flags(result) if f != "ok"]
    if not flagged:
        return []
    lines = []
    for r, f, med in flagged:
        what = (f"{r.extra['gbit_per_s']:.2f} Gbit/s, {r.extra['gbit_per_s'] / med:.0%} of the median "
                f"{med:.2f}" if f == "slow" and med else f"failed: {r.error}")
        lines.append(f"{f.upper()} link {r.extra.get('src_host')} -> {r.extra.get('dst_host')} "
                     f"(rank {r.params['src']} -> {r.params['dst']}): {what}")
    return lines + [c.line() for c in culprits(result)]


def format_report(result: Result, units: str = "GB") -> list:
    """The matrix (sender rows, receiver columns, Gbit/s), the per-link table, the flagged links."""
    from gpubench.core import report, safe
    from gpubench.validation.fleet import RULE_TEXT, median

    m = result.timing.get("matrix") or {}
    hosts, gbps = m.get("hosts") or [], m.get("gbps") or []
    spec = result.spec
    how = f"--to {spec['to']}" if spec.get("to") is not None else f"--pairs {spec.get('pairs')}"
    if spec.get("protocol") == "ucx":
        from gpubench.core.units import format_size

        proto = "UCX"
        what = (f"({how}, {spec.get('api')} API, -m {spec.get('memory')}, {format_size(spec.get('buffer', 0))} "
                f"messages, {spec.get('seconds'):g} s)")
    else:
        proto, what = "TCP", f"({how}, -P {spec.get('streams')}, {spec.get('seconds'):g} s)"
    out: list = []
    if len(hosts) <= MATRIX_SHOWN:
        t = report.table(f"{proto} Gbit/s between nodes {safe.term_markup(what)}: sender rows, receiver columns",
                         ["from \\ to", *[safe.term_markup(h) for h in hosts]])
        for h, row in zip(hosts, gbps):
            t.add_row(safe.term_markup(h), *["-" if v is None else f"{v:.2f}" for v in row])
        out.append(t)
    else:
        out.append(f"{proto} Gbit/s between {len(hosts)} nodes {safe.term(what)}: the sender x receiver matrix is in the JSON "
                   "(timing.matrix).")
    flagged_only = len(result.records) > LINKS_SHOWN
    s = report.table("Links" + (" flagged (every link is in the JSON)" if flagged_only else ""),
                     ["round", "sender", "receiver", "Gbit/s", f"{units}/s", "flag"])
    for r, f, med in link_flags(result):
        if flagged_only and f == "ok":
            continue
        g = r.extra.get("gbit_per_s")
        s.add_row(str(r.extra.get("round", "")), safe.term_markup(r.extra.get("src_host")),
                  safe.term_markup(r.extra.get("dst_host")), "-" if g is None else f"{g:.2f}",
                  "-" if g is None else f"{g / 8 / (1 if units == 'GB' else 1.073741824):.3f}",
                  f if f == "ok" else f"[red]{f.upper()}[/red]" + (f": {safe.term_markup(r.error, 80)}" if r.error else ""))
    out.append(s)
    values = [v for row in gbps for v in row if v is not None]
    if values:
        out.append(f"Matrix median {median(values):.2f} Gbit/s over {len(values)} link(s). {RULE_TEXT}")
    for line in slow_summary(result):
        out.append(safe.term_markup(line))
    if spec.get("protocol") == "ucx":
        out.append("Figures are bytes of the sends completed per interval on the sending rank's clock, the "
                   "receiver's count checked at the end (net --protocol ucx's method, docs/net.md \"UCX\"); "
                   "Gbit/s = 1e9 bit/s; each link's transports are in the JSON (extra.transports).")
    else:
        out.append("Figures are bytes the receiving rank's server counted per interval (net's method, docs/net.md); "
                   "Gbit/s = 1e9 bit/s.")
    return out


def verdict(result: Result) -> str | None:
    """One line naming the slow or failed links, or None when every link is ok."""
    from gpubench.core import safe
    from gpubench.plugins.net.culprits import named

    bad = [(r, f) for r, f, _ in link_flags(result) if f != "ok"]
    if not bad:
        return None
    names = ", ".join(f"{safe.term(r.extra.get('src_host'))}->{safe.term(r.extra.get('dst_host'))} ({f})"
                      for r, f in bad[:8])
    who = named(culprits(result))
    return (f"{len(bad)} link(s) flagged: {names}" + (" ..." if len(bad) > 8 else "")
            + (f"; {'; '.join(safe.term(c.short(), 200) for c in who[:8])}" if who else ""))

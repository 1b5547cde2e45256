"""The terminal report of ``net client|local --protocol ucx`` (rich renderables; every string that
came from UCX or the server escaped through :mod:`gpubench.core.safe`)."""

from __future__ import annotations

from gpubench.core import report, safe
from gpubench.core.units import format_rate, format_size
from gpubench.plugins.net.lines import gbit, hostport


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


def ucx_report(result, units: str = "GB") -> list:
    """The header, the interval table and total (or a row per latency size), the transports, the notes."""
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

"""net's one-line forms, iperf3's way, shared by the client's live lines, its report and the
server's log. Nothing here prints; standard library and gpubench.core only."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from gpubench.core.units import format_size

# at most this many streams per direction get a live line each; above it, the [SUM] line only
PER_STREAM_LINES = 4

DIRECTION_WORDS = {"c2s": "client -> server", "s2c": "server -> client"}


def gbit(bytes_per_s: float) -> str:
    """Gbit/s with two decimals (1e9 bit/s)."""
    return f"{bytes_per_s * 8 / 1e9:.2f}"


def hostport(host: str, port: int) -> str:
    """``host:port``, the host in brackets when it is an IPv6 address."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bitrate_text(bits_per_s: int) -> str:
    """-b as iperf3 writes it: 2000000000 -> "2 Gbit/s", 1500000 -> "1.5 Mbit/s"."""
    for unit, mult in (("T", 10**12), ("G", 10**9), ("M", 10**6), ("K", 10**3)):
        if bits_per_s >= mult:
            return f"{bits_per_s / mult:.4g} {unit}bit/s"
    return f"{bits_per_s} bit/s"


def window_text(window: int, got: dict | None = None) -> str:
    """The header's window: the kernel's autotuning, or -w and what the kernel made of it."""
    if not window:
        return "window: kernel autotuning"
    text = f"window -w {format_size(window)}"
    if got and got.get("sndbuf") and got.get("rcvbuf"):
        text += f" (kernel: SO_SNDBUF {format_size(got['sndbuf'])}, SO_RCVBUF {format_size(got['rcvbuf'])})"
    return text


def test_words(spec: dict, window_got: dict | None = None) -> str:
    """What was asked, in one line (a Result's spec, or a Request's fields)."""
    direction = spec.get("direction", "c2s")
    dirs = "both ways (--bidir)" if direction == "both" else DIRECTION_WORDS.get(direction, direction)
    omit, bitrate = spec.get("omit") or 0, spec.get("bitrate") or 0
    pacing = f"paced at {bitrate_text(bitrate)} per stream" if bitrate else "unpaced"
    return (f"{spec['streams']} stream(s) {dirs}, {format_size(spec['buffer'])} writes, "
            f"{window_text(spec.get('window') or 0, window_got)}, {pacing}, "
            f"{'--copy' if spec.get('copy') else 'zero copy'}; {spec['seconds']:g} s counted"
            + (f" after {omit:g} s omitted" if omit else "") + f", {spec['interval']:g} s intervals")


def tag(stream: int | None, direction: str, bidir: bool) -> str:
    """``[  0]`` for a stream, ``[SUM]`` for their sum, and ``[c2s]`` / ``[s2c]`` after it under --bidir."""
    head = "[SUM]" if stream is None else f"[{stream:3d}]"
    return head + (f"[{direction}]" if bidir else "")


def column_line(bidir: bool) -> str:
    """The column heads above the interval lines (iperf3's ``[ ID] Interval Transfer Bitrate``)."""
    return f"{'[ ID]' + ('[dir]' if bidir else ''):<{10 if bidir else 5}} {'  interval':<15}  {'transfer':>10}  {'bitrate':>14}"


def rate_line(label: str, start: float, end: float, nbytes: int, seconds: float | None = None,
              note: str = "") -> str:
    """One line: ``[SUM]   0.00-1.00   s    10.2 GiB    87.85 Gbit/s  note`` (bytes / seconds or end - start)."""
    secs = end - start if seconds is None else seconds
    rate = nbytes / secs if secs > 0 else 0.0
    line = f"{label} {start:6.2f}-{end:<6.2f} s  {format_size(nbytes):>10}  {gbit(rate):>7} Gbit/s"
    return line + (f"  {note}" if note else "")


def summary_lines(by_direction: dict[str, dict[Any, Any]]) -> list[str]:
    """The end's ``[SUM]`` lines per direction (``by_direction``: direction -> {stream or "total":
    Record}): the sender's (bytes over the whole test) with the retransmits, then the receiver's."""
    bidir = len(by_direction) > 1
    out = [column_line(bidir)]
    for d, recs in by_direction.items():
        total = recs.get("total")
        if total is None:
            continue
        e = total.extra
        starts, ends, omits = e["interval_start_s"], e["interval_end_s"], e["interval_omit"]
        if not ends:
            continue
        label = tag(None, d, bidir)
        sender_side, receiver_side = ("client", "server") if d == "c2s" else ("server", "client")
        sent = e.get("sent_bytes")
        retr = e.get("retransmits")
        retr_text = f"{retr} retr" if retr is not None else "- retr"
        if sent is not None:
            whole = ", omitted s too" if any(omits) else ""
            out.append(rate_line(label, starts[0], ends[-1], sent, note=f"{retr_text}  sender ({sender_side}{whole})"))
        else:
            out.append(f"{label} sender ({sender_side}): not known (no end line)")
        counted = [i for i, o in enumerate(omits) if not o]
        first = starts[counted[0]] if counted else ends[-1]
        out.append(rate_line(label, first, ends[-1], e["counted_bytes"], e["counted_seconds"],
                             note=f"{'':6}  receiver ({receiver_side})"))
    return out


def server_line(direction: str, role: str, nbytes: int, seconds: float, omitted: float = 0.0) -> str:
    """The server's log line of one direction: ``c2s (client -> server) received 9.3 GiB in 3.001 s
    = 26.61 Gbit/s (3.33 GB/s)``; role "received" or "sent"."""
    rate = nbytes / seconds if seconds > 0 else 0.0
    after = f" after {omitted:g} s omitted" if omitted else ""
    return (f"{direction} ({DIRECTION_WORDS.get(direction, direction)}) {role} {format_size(nbytes)} in "
            f"{seconds:.3f} s{after} = {gbit(rate)} Gbit/s ({rate / 1e9:.3f} GB/s)")


class LiveLines:
    """The client's lines as the test runs, one ``write`` call each."""

    def __init__(self, write: Callable[[str], None], bidir: bool = False):
        self._write = write
        self.bidir = bidir
        self._heads = False

    def line(self, text: str) -> None:
        """One line: the header, or any other (net --protocol ucx --latency: one per message size)."""
        self._write(text)

    def intervals(self, by_direction: dict[str, tuple[float, float, bool, Sequence[int]]]) -> None:
        """One interval of each direction: direction -> (start_s, end_s, omitted, bytes per stream); a line
        per stream (up to :data:`PER_STREAM_LINES` streams), then ``[SUM]``."""
        if not self._heads:
            self._heads = True
            self._write(column_line(self.bidir))
        for d in ("c2s", "s2c"):
            if d in by_direction:
                start, end, omit, per = by_direction[d]
                streams = list(enumerate(per)) if 1 < len(per) <= PER_STREAM_LINES else []
                for k, nbytes in [*streams, (None, sum(per))]:
                    self._write(rate_line(tag(k, d, self.bidir), start, end, nbytes, note="(omitted)" if omit else ""))

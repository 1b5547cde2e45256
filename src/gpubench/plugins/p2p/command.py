"""``gpubench p2p`` options and report (nvbandwidth-style matrices: row = source GPU, column = destination)."""

from __future__ import annotations

import click

from gpubench.kit import benchmark_command

from gpubench.core.options import split_list
from gpubench.core import report
from gpubench.core.units import format_rate, format_size, parse_size

_DEFAULT_TESTS = "write,read,bidir,sm,latency,off,off-bidir,off-latency"


HELP = """GPU<->GPU copy matrix: copy engine with peer access on (write, read, bidirectional) and off
    (staged through the host), an SM copy kernel, and small-copy latency.

    Methods follow nvbandwidth (bandwidth) and p2pBandwidthLatencyTest (latency, peer access off);
    each cell is the median over samples, with % of the link's peak (NVLink or PCIe, from env).
    """

# p2p times a fixed number of samples (-n 5, no --min-time) and shows no spread by default, so its
# -w / -n / --spread are its own rather than the shared groups
OPTIONS = [
    click.option("-d", "--devices", default=None,
                 help="CUDA devices, at least two, e.g. 0,1 [default: every visible GPU]."),
    click.option("-t", "--tests", default=_DEFAULT_TESTS, show_default=True,
                 help="Comma list of write, read, bidir, sm, latency, off, off-bidir, off-latency."),
    click.option("-b", "--nbytes", default="1GiB", show_default=True,
                 help="Bytes per bandwidth copy (1GiB, 512M, bytes)."),
    click.option("--latency-bytes", default="16", show_default=True,
                 help="Bytes per latency copy (p2pBandwidthLatencyTest copies one int4 = 16 bytes)."),
    click.option("--loop-count", type=int, default=None,
                 help="Copies per sample [default: 16 with peer access on (nvbandwidth --loopCount), 5 with it "
                      "off (p2pBandwidthLatencyTest's repeat); fewer when a sample would pass 0.2 s]."),
    click.option("-w", "--warmup", type=int, default=1, show_default=True, help="Untimed samples per point."),
    click.option("-n", "--iters", type=int, default=5, show_default=True,
                 help="Timed samples per point (median shown)."),
    click.option("--verify/--no-verify", default=True, show_default=True,
                 help="Check on the GPU that every destination byte arrived as sent."),
    click.option("--spread", type=click.Choice(["none", "iqr", "range"]), default="none", show_default=True,
                 help="Spread shown beside each median: none, p25-p75 or min-max."),
]


def build_spec(devices, tests, nbytes, latency_bytes, loop_count, warmup, iters, verify):
    """Parse the options into a P2PSpec (no GPU needed); the spec checks the names and counts; raises UsageError: any
    bad value, named in the message."""
    from gpubench.plugins.p2p.bench import TESTS, P2PSpec
    from gpubench.core.options import parse_devices
    from gpubench.core.timing import TimingPlan

    devs = parse_devices(devices)
    names = split_list(tests, "-t/--tests", ",".join(list(TESTS)[:2]), "test")
    return P2PSpec(devices=devs, tests=names, nbytes=parse_size(nbytes, what="-b/--nbytes"),
                   latency_bytes=parse_size(latency_bytes, what="--latency-bytes"), loop_count=loop_count,
                   plan=TimingPlan(warmup=warmup, iters=iters, min_time=TimingPlan.min_time), verify=verify)


_TITLES = {
    "write": "CE write (pushed by the source), peer access on",
    "read": "CE read (pulled by the destination), peer access on",
    "bidir": "bidirectional CE read, total of both directions, peer access on",
    "sm": "SM copy kernel on the destination reading the source, peer access on",
    "off": "CE copy, peer access off (staged through the host)",
    "off-bidir": "bidirectional CE, total of both directions, peer access off",
    "latency": "latency of one small copy, peer access on",
    "off-latency": "latency of one small copy, peer access off",
}


def _cell(r, units: str, spread: str) -> str:
    if r is None:
        return ""
    if r.error:
        return "no peer access" if "cudaDeviceCanAccessPeer" in r.error else "failed"
    if r.metric == "time":
        s = r.time_summary()
        cell = f"{s.median * 1e6:.2f}"
        if spread != "none":
            lo, hi = (s.p25, s.p75) if spread == "iqr" else (s.min, s.max)
            cell += f" ({lo * 1e6:.2f}-{hi * 1e6:.2f})"
    else:
        s = r.rate_summary()
        cell = report.rate_cell(s, units, spread) if spread != "none" else format_rate(s.median, units)
        pct = r.extra.get("pct_of_peak")
        if pct is not None:
            cell += f" {report.peak_cell(pct)}"
    if r.extra.get("verified") is False:
        cell += " WRONG DATA"
    if r.extra.get("gate_expired"):
        cell += " *"
    return cell


def format_report(result, units: str = "GB", spread: str = "none") -> list:
    """One matrix per test (row = source GPU, column = destination), then the pairs' links (rich renderables)."""
    out: list = []
    devices = list(result.spec.get("devices") or sorted({r.params["src"] for r in result.records}))
    tests = [t for t in result.spec.get("tests", []) if any(r.params.get("test") == t for r in result.records)]
    index = {(r.params["test"], r.params.get("part"), r.params["src"], r.params["dst"]): r for r in result.records}
    for test in tests:
        parts = ("total", "forward") if test.endswith("bidir") else (None,)
        for part in parts:
            recs = [index.get((test, part, i, j)) for i in devices for j in devices if i != j]
            sample = next((r for r in recs if r is not None), None)
            if sample is None:
                continue
            latency = sample.metric == "time"
            unit = "us" if latency else f"{units}/s"
            size = format_size(sample.params["nbytes"])
            title = _TITLES.get(test, test)
            if part == "forward":
                title = title.replace("total of both directions", "source -> destination while the reverse runs")
            t = report.table(f"{test}{' ' + part if part else ''}: {title} - {size}, {unit}"
                             f"{'' if latency else ', % of link peak'}",
                             ["src \\ dst"] + [f"GPU {j}" for j in devices])
            for i in devices:
                t.add_row(f"GPU {i}", *["-" if i == j else _cell(index.get((test, part, i, j)), units, spread)
                                        for j in devices])
            out.append(t)
    if len(devices) > 1:
        t = report.table("GPU pairs", ["pair", "link", "peer access", "link peak per direction"])
        access = result.env.get("peer_access", {})
        for a, b in ((a, b) for a in devices for b in devices if a < b):
            link = (result.env.get("topology") or {}).get(f"{a},{b}", "?")
            peak = next((r.extra["peak_bytes_per_s"] for r in result.records
                         if r.params.get("src") == a and r.params.get("dst") == b and r.extra.get("peer_access")
                         and r.params.get("part") in (None, "forward") and r.extra.get("peak_bytes_per_s")), None)
            t.add_row(f"GPU {a} <-> GPU {b}", link, {True: "yes", False: "no"}.get(access.get(f"{a},{b}"), "?"),
                      f"{format_rate(peak, units)} {units}/s" if peak else "?")
        out.append(t)
    notes = [f"{units}/s = {'1e9' if units == 'GB' else '2^30'} B/s; median of {result.timing.get('iters')} samples, "
             f"each {result.timing.get('warmup_copies')} untimed + up to "
             f"{result.spec.get('loop_count') or '16 (peer-off: 5)'} timed "
             "copies between CUDA events, streams released together by a spin kernel (nvbandwidth's method).",
             "bidir total = sum of the two directions' bandwidths (nvbandwidth); off-bidir total = both "
             "directions' bytes over the time until both finished (p2pBandwidthLatencyTest); latency = time per copy "
             f"of {result.spec.get('latency_bytes')} B, {result.timing.get('latency_reps')} copies per sample "
             "(p2pBandwidthLatencyTest)."]
    if any(r.extra.get("above_peak") for r in result.records):
        notes.append("!! marks a figure above the link's physical peak: a timing fault, not a real speed.")
    if any(r.extra.get("gate_expired") for r in result.records):
        notes.append("* the copies blocked the host while being queued, so they were timed without the spin "
                     "kernel and the figure includes launch time.")
    if any(r.extra.get("verified") is False for r in result.records):
        notes.append("WRONG DATA: bytes that did not arrive as sent.")
    elif any(r.extra.get("verified") for r in result.records):
        notes.append("verified: every destination byte arrived as sent.")
    notes += [f"{r.params['test']} GPU {r.params['src']} -> GPU {r.params['dst']}: {r.error}"
              for r in result.records if r.error and "cudaDeviceCanAccessPeer" not in r.error]
    if result.partial:
        notes.append(report.partial_note(result, "cells"))
    return out + notes


command = benchmark_command("p2p", OPTIONS, build_spec, format_report, help=HELP, display=("spread",))

"""``gpubench batch`` options and report."""

from __future__ import annotations

import click

from gpubench.kit import StrictInt, benchmark_command, spread_option, timing_options

from gpubench.core.options import csv_list
from gpubench.core import report
from gpubench.core.errors import UsageError
from gpubench.core.timing import TimingPlan
from gpubench.core.units import format_rate, format_size, parse_size

SWEEP_PIECES = ("1KiB", "4KiB", "16KiB", "64KiB", "256KiB", "1MiB")
SWEEP_TOTAL = "16MiB"


HELP = """Many small copies vs one packed copy vs cudaMemcpyBatchAsync vs one contiguous copy.

    N pieces of S bytes, scattered on the host, go H2D or D2H: one cudaMemcpyAsync each
    (separate), gathered into pinned staging then one copy (packed), one cudaMemcpyBatchAsync
    (batched-api, CUDA 12.8+ through cuda-bindings), or one copy of N x S (contiguous, the
    ceiling). Every strategy's data is checked. GB/s = N x S / time; see docs/batch.md.
    """


def _count():
    """--count's Bound as the parser names it past a 64-bit integer (BatchSpec holds every point's count to it)."""
    from gpubench.core.bounds import Bound
    from gpubench.plugins.batch.bench import MAX_COUNT

    return Bound("--count", lo=1, hi=MAX_COUNT)


OPTIONS = [
    click.option("--count", type=StrictInt(bound=_count), default=None,
                 help="Pieces per transfer [default: 4096, or --total / --piece]."),
    click.option("--piece", default=None,
                 help="Bytes per piece; a comma list sweeps (e.g. 1KiB,4KiB,64KiB) [default: 4KiB]."),
    click.option("--total", default=None,
                 help="Hold count x piece at this many bytes across a sweep (count = total / piece)."),
    click.option("--sweep", is_flag=True, help=f"Piece sizes {','.join(SWEEP_PIECES)} at a total of {SWEEP_TOTAL} "
                                               "(unless --piece / --total say otherwise)."),
    click.option("-s", "--strategy", "strategies", default="separate,packed,batched-api,contiguous",
                 show_default=True, help="Comma list of separate, packed, batched-api, contiguous."),
    click.option("--direction", "directions", default="h2d,d2h", show_default=True, help="Comma list of h2d, d2h."),
    click.option("-m", "--memory", default="pinned,pageable", show_default=True,
                 help="Host memory holding the pieces: comma list of pinned, pageable."),
    click.option("-d", "--device", type=int, default=0, show_default=True, help="CUDA device."),
    *timing_options(what="timed transfers"),
    click.option("--no-gate", is_flag=True, help="Do not queue page-locked copies behind the spin kernel: the "
                                                 "figure then includes the host's cost of issuing each copy."),
    spread_option(),
]


def build_spec(count, piece, total, sweep, strategies, directions, memory, device, warmup, iters, min_time,
               no_gate=False):
    """Parse the options into a BatchSpec (no GPU needed); the spec checks the ranges and names; raises UsageError:
    any bad value, named in the message."""
    from gpubench.plugins.batch.bench import BatchSpec

    if sweep:
        piece = piece if piece is not None else ",".join(SWEEP_PIECES)
        if total is None and count is None:
            total = SWEEP_TOTAL
    pieces = [parse_size(p, what="--piece") for p in csv_list(piece if piece is not None else "4KiB", "--piece")]
    if len(set(pieces)) != len(pieces):
        raise UsageError(f"--piece {piece!r} repeats a size")
    if count is not None and total is not None:
        raise UsageError(f"--count {count} and --total {total!r} both given", "give one of them")
    if count is not None:
        points = [(count, p) for p in pieces]
    elif total is not None:
        tot = parse_size(total, what="--total")
        points = []
        for p in pieces:
            if tot % p:
                raise UsageError(f"--total {total!r} is not a whole number of {format_size(p)} pieces",
                                 "give a total that each piece size divides")
            points.append((tot // p, p))
    else:
        points = [(4096, p) for p in pieces]
    return BatchSpec(points=tuple(points), strategies=csv_list(strategies, "--strategy"),
                     directions=csv_list(directions, "--direction"), memory=csv_list(memory, "--memory"),
                     device=device, plan=TimingPlan(warmup=warmup, iters=iters, min_time=min_time), gate=not no_gate)


_DIR_TITLES = {"h2d": "H2D (host to device)", "d2h": "D2H (device to host)"}
_ORDER = ("separate", "batched-api", "packed", "packed+gather", "contiguous")


def format_report(result, units: str = "GB", spread: str = "iqr") -> list:
    """One table per (direction, count, piece): a row per (strategy, memory) with GB/s, us per
    piece, speed-up over separate and % of the link's peak. Returns rich renderables."""
    recs = result.records
    out: list = []
    points = list(dict.fromkeys((r.params["direction"], r.params["count"], r.params["piece_bytes"]) for r in recs))
    spread_name = "p25-p75" if spread == "iqr" else "min-max"
    for direction, count, piece in points:
        rows = [r for r in recs if (r.params["direction"], r.params["count"], r.params["piece_bytes"])
                == (direction, count, piece)]
        rows.sort(key=lambda r: (_ORDER.index(r.params["strategy"]) if r.params["strategy"] in _ORDER else 99,
                                 r.params["memory"]))
        t = report.table(
            f"{_DIR_TITLES.get(direction, direction)} - {count} x {format_size(piece)} = "
            f"{format_size(count * piece)} - GPU {result.spec.get('device', 0)}",
            ["strategy", "host memory", f"{units}/s ({spread_name})", "us / piece", "vs separate", "% peak", "check"],
        )
        for r in rows:
            name, mem = r.params["strategy"], r.params["memory"]
            if r.error:
                t.add_row(name, mem, r.error[:90], "", "", "", "")
                continue
            sp = r.extra.get("speedup_vs_separate")
            t.add_row(name, mem, report.rate_cell(r.rate_summary(), units, spread),
                      f"{r.extra.get('time_per_piece_us', 0):.3f}", f"{sp:.2f}x" if sp else "-",
                      report.peak_cell(r.extra.get("pct_of_peak")),
                      {True: "ok", False: "WRONG DATA", None: "-"}[r.extra.get("verified")])
        out.append(t)
    notes = [f"{units}/s = {'1e9' if units == 'GB' else '2^30'} B/s of pieces moved (count x piece / time); "
             f"median over samples ({result.timing.get('warmup')} warm-up(s)); sizes in binary units."]
    if result.spec.get("gate", True):
        notes.append("separate / batched-api / packed / contiguous from page-locked memory: copies queued behind a "
                     "spin kernel, timed with CUDA events (the copy engines' time, not the host's issue rate; "
                     "--no-gate includes it). pageable: no gate.")
    else:
        notes.append("--no-gate: each figure includes the host's cost of issuing the copies.")
    if any(r.params.get("strategy") == "packed+gather" for r in recs):
        notes.append("packed: the copy alone; packed+gather: host gather (H2D) or scatter (D2H) through pinned "
                     "staging, timed with perf_counter, plus the copy.")
    notes += [f"batched-api {s}" for s in sorted({r.error for r in recs if r.extra.get("skipped") and r.error})]
    if any(r.extra.get("gate_dropped") for r in recs):
        notes.append("Some rows were timed without the gate: the driver's queue filled while the gate held.")
    if any(r.extra.get("above_peak") for r in recs):
        notes.append("!! marks a figure above the link's physical peak: a timing fault, not a real speed.")
    if any(r.extra.get("verified") is False for r in recs):
        notes.append("WRONG DATA: a strategy delivered bytes that differ from what was sent.")
    elif any(r.extra.get("verified") for r in recs):
        notes.append("check: every strategy's pieces arrived intact, in the right places.")
    if result.partial:
        notes.append(report.partial_note(result))
    peaks = {r.extra.get("peak_bytes_per_s") for r in recs if r.extra.get("peak_bytes_per_s")}
    if peaks:
        notes.append("% peak: of the raw PCIe line rate per direction, " +
                     ", ".join(format_rate(p, units) + f" {units}/s" for p in sorted(peaks)) + ".")
    return out + notes


command = benchmark_command("batch", OPTIONS, build_spec, format_report, help=HELP, display=("spread",))

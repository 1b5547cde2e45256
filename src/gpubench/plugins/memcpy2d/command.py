"""``gpubench memcpy2d`` options and report."""

from __future__ import annotations

import re

import click

from gpubench.kit import benchmark_command, spread_option, timing_options

from gpubench.core.options import csv_list
from gpubench.core import report
from gpubench.core.errors import UsageError
from gpubench.core.timing import TimingPlan
from gpubench.core.units import format_rate, format_size, parse_size

SWEEP_WIDTHS = ("64", "256", "1KiB", "4KiB", "16KiB", "64KiB")
SWEEP_TOTAL = "4MiB"
_FACTOR_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*x\s*$", re.IGNORECASE | re.ASCII)  # not "١x"


HELP = """Pitched 2-D copies: cudaMemcpy2DAsync vs one copy per row vs one contiguous copy vs a CuPy slice.

    A window of W bytes x H rows is copied out of rows of --src-pitch bytes into rows of
    --dst-pitch bytes. The window is checked, and so is every byte around it in the destination.
    GB/s = W x H / time (the pitch padding is not counted); see docs/memcpy2d.md.
    """

OPTIONS = [
    click.option("-W", "--width", default=None, help="Window bytes per row; a comma list sweeps [default: 4096]."),
    click.option("-H", "--height", type=int, default=None, help="Rows [default: 8192, or --total / width]."),
    click.option("--total", default=None,
                 help="Hold width x rows at this many bytes across a sweep (rows = total / width)."),
    click.option("--sweep", is_flag=True, help=f"Widths {','.join(SWEEP_WIDTHS)} bytes at a total of {SWEEP_TOTAL} "
                                               "(unless --width / --total say otherwise)."),
    click.option("--src-pitch", default="4x", show_default=True,
                 help="Source row pitch: bytes (16KiB) or a multiple of the width (4x)."),
    click.option("--dst-pitch", default="1x", show_default=True,
                 help="Destination row pitch: bytes or a multiple of the width (1x = rows packed)."),
    click.option("-s", "--strategy", "strategies", default="2d,row-loop,contiguous,cupy-slice", show_default=True,
                 help="Comma list of 2d, row-loop, contiguous, cupy-slice."),
    click.option("--direction", "directions", default="h2d,d2h,d2d", show_default=True,
                 help="Comma list of h2d, d2h, d2d."),
    click.option("-m", "--memory", default="pinned", show_default=True,
                 help="Host memory for h2d / d2h: comma list of pinned, pageable."),
    click.option("-d", "--device", type=int, default=0, show_default=True, help="CUDA device."),
    *timing_options(),
    click.option("--no-gate", is_flag=True,
                 help="Do not queue copies behind the spin kernel (the host's issue cost is then timed)."),
    spread_option(),
]


def parse_pitch(text: str, width: int, what: str) -> int:
    """A pitch in bytes: a size ("16KiB") or a multiple of the width ("4x"); raises UsageError: not a size
    or multiple, zero, or a multiple giving a fraction of a byte."""
    m = _FACTOR_RE.match(str(text))
    if m:
        f = float(m.group(1))
        if f <= 0:
            raise UsageError(f"{what} {text!r} must be a positive multiple of the width", "e.g. 4x")
        v = f * width
        if v != int(v):
            raise UsageError(f"{what} {text!r} x width {width} is not a whole number of bytes")
        return int(v)
    return parse_size(text, what=what)


def build_spec(width, height, total, sweep, src_pitch, dst_pitch, strategies, directions, memory, device, warmup,
               iters, min_time, no_gate=False):
    """Parse the options into a Memcpy2dSpec (no GPU needed); the spec checks the geometry and names; raises
    UsageError: any bad value, named in the message (W > pitch, sizes below 1, pitches that do not fit a buffer,
    unknown names)."""
    from gpubench.plugins.memcpy2d.bench import Memcpy2dSpec

    if sweep:
        width = width if width is not None else ",".join(SWEEP_WIDTHS)
        if total is None and height is None:
            total = SWEEP_TOTAL
    widths = [parse_size(x, what="--width") for x in csv_list(width if width is not None else "4096", "--width")]
    if len(set(widths)) != len(widths):
        raise UsageError(f"--width {width!r} repeats a size")
    if height is not None and total is not None:
        raise UsageError(f"--height {height} and --total {total!r} both given", "give one of them")
    tot = parse_size(total, what="--total") if total is not None else None
    points = []
    for w in widths:
        if height is not None:
            h = height
        elif tot is not None:
            if tot % w:
                raise UsageError(f"--total {total!r} is not a whole number of {w}-byte rows",
                                 "give a total that each width divides")
            h = tot // w
        else:
            h = 8192
        points.append((w, h, parse_pitch(src_pitch, w, "--src-pitch"), parse_pitch(dst_pitch, w, "--dst-pitch")))
    return Memcpy2dSpec(points=tuple(points), strategies=csv_list(strategies, "--strategy"),
                        directions=csv_list(directions, "--direction"), memory=csv_list(memory, "--memory"),
                        device=device, plan=TimingPlan(warmup=warmup, iters=iters, min_time=min_time), gate=not no_gate)


def check_cell(verified: bool | None, untouched: bool | None) -> str:
    """'ok', 'WRONG DATA', 'OVERWROTE', both, or '-' when nothing was checked."""
    if verified is None and untouched is None:
        return "-"
    bad = [w for w, v in (("WRONG DATA", verified), ("OVERWROTE", untouched)) if v is False]
    return " ".join(bad) if bad else "ok"


_DIR_TITLES = {"h2d": "H2D (host to device)", "d2h": "D2H (device to host)", "d2d": "D2D (device to device)"}
_ORDER = ("2d", "row-loop", "contiguous", "cupy-slice")


def format_report(result, units: str = "GB", spread: str = "iqr") -> list:
    """One table per (direction, memory, pitches): a row per (width, strategy). Returns renderables."""
    recs = result.records
    out: list = []
    tables = list(dict.fromkeys((r.params["direction"], r.params["memory"]) for r in recs))
    spread_name = "p25-p75" if spread == "iqr" else "min-max"
    for direction, memory in tables:
        rows = [r for r in recs if (r.params["direction"], r.params["memory"]) == (direction, memory)]
        rows.sort(key=lambda r: (r.params["width"], r.params["height"],
                                 _ORDER.index(r.params["strategy"]) if r.params["strategy"] in _ORDER else 99))
        where = f"{memory} host memory" if memory != "device" else "device memory"
        t = report.table(f"{_DIR_TITLES.get(direction, direction)} - {where} - GPU {result.spec.get('device', 0)}",
                         ["window", "pitch src/dst", "strategy", f"{units}/s ({spread_name})", "us / row",
                          "vs 2d", "% peak", "check"])
        for r in rows:
            p = r.params
            win = f"{format_size(p['width'])} x {p['height']}"
            pitch = f"{format_size(p['src_pitch'])} / {format_size(p['dst_pitch'])}"
            if r.error:
                t.add_row(win, pitch, p["strategy"], r.error[:80], "", "", "", "")
                continue
            rel = r.extra.get("relative_to_2d")
            check = check_cell(r.extra.get("verified"), r.extra.get("untouched"))
            t.add_row(win, pitch, p["strategy"], report.rate_cell(r.rate_summary(), units, spread),
                      f"{r.extra.get('time_per_row_us', 0):.3f}", f"{rel:.2f}x" if rel else "-",
                      report.peak_cell(r.extra.get("pct_of_peak")), check)
        out.append(t)
    notes = [f"{units}/s = {'1e9' if units == 'GB' else '2^30'} B/s of window bytes (W x H / time; pitch padding "
             f"not counted); median over samples ({result.timing.get('warmup')} warm-up(s)); sizes in binary units.",
             "vs 2d: 2d's median time / this one's (above 1x is faster than cudaMemcpy2DAsync).",
             "2d, row-loop, contiguous: CUDA events, page-locked and device copies queued behind a spin kernel; "
             "cupy-slice: perf_counter around the CuPy line and a stream synchronize (CuPy does host work in it)."]
    if any(r.extra.get("verified") is False or r.extra.get("untouched") is False for r in recs):
        notes.append("WRONG DATA: the window differs from the source; OVERWROTE: bytes outside the window changed.")
    elif any(r.extra.get("verified") for r in recs):
        notes.append("check: every window arrived intact and every byte around it in the destination was untouched.")
    if any(r.extra.get("gate_dropped") for r in recs):
        notes.append("Some rows were timed without the gate: the driver's queue filled while the gate held.")
    if any(r.extra.get("above_peak") for r in recs):
        notes.append("!! marks a figure above the link's physical peak: a timing fault, not a real speed.")
    peaks = {r.extra.get("peak_bytes_per_s") for r in recs if r.extra.get("peak_bytes_per_s")}
    if peaks:
        notes.append("% peak: of the raw PCIe line rate per direction, " +
                     ", ".join(format_rate(p, units) + f" {units}/s" for p in sorted(peaks)) + ".")
    if result.partial:
        notes.append(report.partial_note(result))
    return out + notes


command = benchmark_command("memcpy2d", OPTIONS, build_spec, format_report, help=HELP, display=("spread",))

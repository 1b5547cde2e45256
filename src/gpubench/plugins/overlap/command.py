"""``gpubench overlap`` options and report."""

from __future__ import annotations

import click

from gpubench.kit import benchmark_command

from gpubench.core.options import parse_number, split_list
from gpubench.core import report
from gpubench.core.errors import UsageError
from gpubench.core.timing import TimingPlan
from gpubench.core.units import format_rate, format_size, parse_size

DEFAULT_WORKS = (0, 1024, 4096)
SWEEP_WORKS = (0, 64, 256, 1024, 4096, 16384)


HELP = """Copy/compute overlap: H2D -> kernel -> D2H on one stream vs C chunks over K streams.

    Each stage is timed alone, then the three serially on one stream, then overlapped. The
    kernel does --work dependent FMAs per float32 element, so you can see when overlap pays.
    The output is checked. See docs/overlap.md.
    """

# -w / -n / --min-time count samples per figure, so their help is overlap's own, not timing_options'
OPTIONS = [
    click.option("--size", default="256MiB", show_default=True, help="Bytes moved each way (float32 elements)."),
    click.option("--work", "works", default=None,
                 help="Dependent FMAs per element in the kernel; a comma list sweeps [default: 0,1024,4096]."),
    click.option("--sweep", is_flag=True, help=f"--work {','.join(map(str, SWEEP_WORKS))}."),
    click.option("--streams", type=int, default=4, show_default=True, help="Streams K of the overlapped run."),
    click.option("--chunks", type=int, default=None,
                 help="Chunks C (>= K), round-robin over the streams [default: K]."),
    click.option("-d", "--device", type=int, default=0, show_default=True, help="CUDA device."),
    click.option("-w", "--warmup", type=int, default=2, show_default=True, help="Untimed samples per figure."),
    click.option("-n", "--iters", type=int, default=None,
                 help="Timed samples per figure [default: enough for --min-time]."),
    click.option("--min-time", type=float, default=0.1, show_default=True,
                 help="Seconds of timed runs per figure when -n is not given."),
]


def _work():
    from gpubench.plugins.overlap.bench import WORK

    return WORK


def parse_works(text: str) -> tuple[int, ...]:
    """A comma list of integers (split_list, each by parse_number; OverlapSpec checks their range, :data:`WORK`);
    raises UsageError: empty, an empty entry, not an integer, or repeated."""
    out: list[int] = []
    for x in split_list(text, "--work", "0,1024"):
        v = int(parse_number(x, "--work", bound=_work))
        if v in out:
            raise UsageError(f"--work {text!r} repeats {v}")
        out.append(v)
    return tuple(out)


def build_spec(size, works, sweep, streams, chunks, device, warmup, iters, min_time):
    """Parse the options into an OverlapSpec (no GPU needed); the spec checks the shape and ranges; raises UsageError:
    any bad value, named in the message."""
    from gpubench.plugins.overlap.bench import OverlapSpec

    nbytes = parse_size(size, what="--size")
    ws = (SWEEP_WORKS if sweep else DEFAULT_WORKS) if works is None else parse_works(works)
    return OverlapSpec(nbytes=nbytes, works=tuple(ws), streams=streams,
                       chunks=chunks if chunks is not None else streams, device=device,
                       plan=TimingPlan(warmup=warmup, iters=iters, min_time=min_time))


def format_report(result, units: str = "GB") -> list:
    """One table: a row per --work with each stage's time alone, serial and overlapped totals,
    speed-up and the ratio to the longest stage. Returns rich renderables."""
    recs = result.records
    by = {(r.params["work"], r.params["stage"]): r for r in recs}
    works = list(dict.fromkeys(r.params["work"] for r in recs))
    spec = result.spec
    t = report.table(
        f"H2D -> kernel -> D2H over {format_size(spec.get('nbytes', 0))} - {spec.get('chunks')} chunks on "
        f"{spec.get('streams')} streams - GPU {spec.get('device', 0)}",
        ["work (FMA/elem)", "H2D ms", "kernel ms", "D2H ms", "serial ms", "overlapped ms", "speed-up",
         "vs longest stage", "check"],
    )
    for w in works:
        row = [str(w)]
        bad = None
        for st in ("h2d", "kernel", "d2h", "serial", "overlapped"):
            r = by.get((w, st))
            if r is None or r.error:
                bad = bad or (r.error if r is not None else "missing")
                row.append("-")
            else:
                row.append(f"{r.time_summary().median * 1e3:.3f}")
        over = by.get((w, "overlapped"))
        ser = by.get((w, "serial"))
        if bad or over is None:
            row += ["-", "-", (bad or "")[:60]]
        else:
            sp = over.extra.get("speedup_vs_serial")
            ratio = over.extra.get("ratio_to_longest_stage")
            ok = over.extra.get("verified") and (ser is None or ser.extra.get("verified"))
            row += [f"{sp:.2f}x" if sp else "-",
                    f"{ratio:.2f} ({over.extra.get('longest_stage')})" if ratio else "-",
                    "ok" if ok else "WRONG DATA"]
        t.add_row(*row)
    out: list = [t]
    h2d = [by[(w, "h2d")] for w in works if (w, "h2d") in by and by[(w, "h2d")].samples_s]
    d2h = [by[(w, "d2h")] for w in works if (w, "d2h") in by and by[(w, "d2h")].samples_s]
    notes = [f"Times are medians over samples in ms, CUDA events, every sample queued behind a spin kernel "
             f"({result.timing.get('warmup')} warm-up(s)).",
             "speed-up = serial / overlapped; vs longest stage = overlapped / the slowest stage alone "
             "(1.00 is the best overlap can do when H2D and D2H use separate copy engines)."]
    if h2d and d2h:
        from gpubench.core import limits

        def copy_rate(r) -> str:  # marked " !!" when above the PCIe link (Overlap.derive, core/limits)
            pct = r.extra.get("pct_of_peak")
            return (f"{format_rate(r.rate_summary().median, units)}{limits.flag_mark(r.extra)} {units}/s"
                    + (f" ({pct:.0f}% of {r.extra.get('peak_source')})" if isinstance(pct, (int, float)) else ""))

        notes.append(f"copies alone: H2D {copy_rate(h2d[0])}, D2H {copy_rate(d2h[0])}.")
    kern = [by[(w, "kernel")] for w in works if (w, "kernel") in by and by[(w, "kernel")].samples_s and w]
    if kern:
        notes.append("kernel: " + ", ".join(f"work {r.params['work']}: {r.extra.get('gflops', 0):.0f} GFLOP/s"
                                            for r in kern) + " (2 flops per FMA).")
    if any(r.extra.get("verified") is False for r in recs):
        notes.append("WRONG DATA: the output differs from the closed form beyond the float32 rounding bound.")
    elif any(r.extra.get("verified") for r in recs):
        notes.append("check: serial and overlapped outputs match a^n x + b(1 - a^n)/(1 - a) within float32 rounding.")
    if any(r.extra.get("gate_dropped") for r in recs):
        notes.append("Some runs were timed without the gate: the driver's queue filled while the gate held.")
    if result.partial:
        notes.append(report.partial_note(result, "rows"))
    return out + notes


command = benchmark_command("overlap", OPTIONS, build_spec, format_report, help=HELP)

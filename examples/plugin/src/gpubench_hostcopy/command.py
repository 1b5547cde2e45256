"""``gpubench hostcopy``'s options, spec from options, report and click command."""

from __future__ import annotations

from gpubench.core import report
from gpubench.core.result import Result
from gpubench.core.units import format_rate, format_size, parse_size, size_sweep
from gpubench.kit import benchmark_command, spread_option, sweep_options, timing_options

HELP = """Host-to-host copy bandwidth with numpy over a size sweep (no GPU).

    One numpy copyto between two touched host buffers per sample, timed with perf_counter;
    GB/s = 1e9 bytes per second, counted once; the median with its p25-p75.
    """

OPTIONS = [
    *sweep_options(min_bytes="4KiB", max_bytes="64MiB"),
    *timing_options(warmup=2, what="timed copies"),
    spread_option(),
]


def build_spec(min_bytes, max_bytes, step_factor, warmup, iters, min_time):
    """The options as a HostCopySpec (each bad value named in a UsageError)."""
    from gpubench.core.timing import TimingPlan
    from gpubench_hostcopy.bench import HostCopySpec

    sizes = size_sweep(parse_size(min_bytes, what="-b/--min-bytes"), parse_size(max_bytes, what="-e/--max-bytes"),
                       step_factor)
    return HostCopySpec(sizes=tuple(sizes), plan=TimingPlan(warmup=warmup, iters=iters, min_time=min_time))


def format_report(result: Result, units: str = "GB", spread: str = "iqr") -> list:
    """One table: size, median rate and its spread, samples."""
    t = report.table("hostcopy: host-to-host copy (numpy copyto)",
                     ["size", f"{units}/s", "p25-p75" if spread == "iqr" else "min-max", "n"])
    for r in result.records:
        if r.error or not r.samples_s:
            t.add_row(format_size(r.nbytes), f"failed: {(r.error or 'no samples')[:40]}", "", "")
            continue
        s = r.rate_summary()
        lo, hi = (s.p25, s.p75) if spread == "iqr" else (s.min, s.max)
        t.add_row(format_size(r.nbytes), format_rate(s.median, units),
                  f"{format_rate(lo, units)}-{format_rate(hi, units)}", str(s.n))
    out: list = [t, f"{units}/s = nbytes / seconds of one copy, counted once; host-timed (perf_counter)."]
    if result.partial:
        out.append(report.partial_note(result))
    return out


command = benchmark_command("hostcopy", OPTIONS, build_spec, format_report, help=HELP, display=("spread",),
                            conditions=False)

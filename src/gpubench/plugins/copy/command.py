"""``gpubench copy`` options and report."""

from __future__ import annotations

import click

from gpubench.kit import benchmark_command, spread_option, sweep_options, timing_options

from gpubench.core.options import csv_list, parse_devices
from gpubench.core import report
from gpubench.core.errors import UsageError
from gpubench.core.timing import TimingPlan, stop_cell, stopping_note
from gpubench.core.units import format_rate, format_size, parse_size, size_sweep


HELP = """Host<->device copy bandwidth (H2D, D2H, bidir) over a size sweep.

    By default pinned and pageable host memory are shown side by side with the speed-up.
    GB/s = 1e9 bytes per second; the median of the samples with its p25-p75.
    """

OPTIONS = [
    click.option("--pinned", "only", flag_value="pinned", help="Measure page-locked (cudaHostAlloc) host memory only."),
    click.option("--pageable", "only", flag_value="pageable", help="Measure plain (pageable) host memory only."),
    click.option("-m", "--memory", "memory", default=None,
                 help="Host memory kinds, comma list of pinned, pageable, write-combined, registered "
                      "[default: pinned,pageable]."),
    click.option("--direction", "directions", default="h2d,d2h", show_default=True,
                 help="Comma list of h2d, d2h, bidir (both at once on two streams), and nvbandwidth's h2d-sm, "
                      "d2h-sm (a copy kernel on the GPU), d2d (device local copy), latency (pointer chase "
                      "over host memory)."),
    *sweep_options(min_bytes="4KiB", max_bytes="1GiB"),
    click.option("-d", "--devices", default=None,
                 help="CUDA devices, e.g. 0 or 0,1 (each measured, then all at once) [default: 0]."),
    # the noise goal, measured on the H200 against the fixed rule it replaced (docs/timing.md)
    *timing_options(min_time=0.01, max_noise=0.5, max_time=0.1),
    click.option("--verify", is_flag=True, help="Fill with a pattern and check it arrived after the copies."),
    click.option("--max-pinned", default=None, help="Cap on page-locked host memory [default: half of host RAM]."),
    spread_option(),
]


def build_spec(only, memory, directions, min_bytes, max_bytes, step_factor, devices, warmup, iters, min_time,
               verify, max_pinned):
    """Parse the options into a CopySpec (no GPU needed); the spec checks the names; raises UsageError: any bad value,
    named in the message."""
    from gpubench.plugins.copy.bench import CopySpec

    if only and memory:
        raise UsageError(f"--{only} and --memory {memory!r} both given", "use one of them")
    kinds = (only,) if only else csv_list(memory, "-m/--memory") if memory is not None else ("pinned", "pageable")
    dirs = csv_list(directions, "--direction")
    sizes = size_sweep(parse_size(min_bytes, what="-b/--min-bytes"), parse_size(max_bytes, what="-e/--max-bytes"),
                       step_factor)
    plan = TimingPlan(warmup=warmup, iters=iters, min_time=min_time)
    cap = parse_size(max_pinned, what="--max-pinned") if max_pinned is not None else None
    return CopySpec(sizes=tuple(sizes), directions=dirs, memory=kinds, devices=parse_devices(devices), plan=plan,
                    verify=verify, max_pinned_bytes=cap)


_DIR_TITLES = {
    "h2d": "H2D (host to device)",
    "d2h": "D2H (device to host)",
    "bidir-h2d": "bidir: H2D while D2H runs",
    "bidir-d2h": "bidir: D2H while H2D runs",
    "bidir-total": "bidir: total of both directions",
    "h2d-sm": "H2D by the GPU's SMs (copy kernel reading host memory)",
    "d2h-sm": "D2H by the GPU's SMs (copy kernel writing host memory)",
    "d2d": "D2D: device local copy (bytes counted once)",
    "latency": "host memory latency from the GPU (pointer chase, ns per access)",
}


def format_report(result, units: str = "GB", spread: str = "iqr") -> list:
    """Tables per (device, direction): size rows, a column per memory kind with % of the link peak,
    and pinned/pageable when both were measured. Returns rich renderables."""
    from gpubench.core.env import gpu_by_index
    from gpubench.core.limits import pcie_label

    out: list = []
    recs = result.records
    kinds = [*result.spec.get("memory", []),
             *(["device"] if any(r.params.get("memory") == "device" for r in recs) else [])]
    devices = list(dict.fromkeys(r.params["device"] for r in recs))
    directions = list(dict.fromkeys(r.params["direction"] for r in recs))
    index = {(r.params["device"], r.params["direction"], r.params["memory"], r.params["nbytes"]): r for r in recs}
    sizes = sorted({r.params["nbytes"] for r in recs})
    spread_name = "p25-p75" if spread == "iqr" else "min-max"
    for dev in devices:
        g = gpu_by_index(result.env, dev) if isinstance(dev, int) else None
        link = f" - {g.get('name')}, {pcie_label(g.get('pcie_gen_max'), g.get('pcie_width_max'))}" if g else ""
        for direction in directions:
            here = [k for k in kinds if any((dev, direction, k, n) in index for n in sizes)]
            if not here:
                continue
            latency = direction == "latency"
            ratio = "pinned" in here and "pageable" in here and not latency
            cols = ["size", *[c for k in here for c in (f"{k} {'ns' if latency else f'{units}/s'} ({spread_name})",
                                                        "% peak", "n, noise")], *(["pinned/pageable"] if ratio else [])]
            label = f"GPU {dev}" if isinstance(dev, int) else ("all GPUs at once" if dev == "all" else f"GPU {dev.split('@')[0]} while all copy")
            t = report.table(f"{_DIR_TITLES.get(direction, direction)} - {label}{link}", cols)
            for n in sizes:
                row = [format_size(n)]
                med = {}
                for k in here:
                    r = index.get((dev, direction, k, n))
                    if r is None:
                        row += ["", "", ""]
                        continue
                    if r.error:
                        row += [r.error[:56] if r.error.startswith("skipped") else f"failed: {r.error[:48]}", ""]
                    elif latency:
                        t_ = r.time_summary()
                        lo, hi = (t_.p25, t_.p75) if spread == "iqr" else (t_.min, t_.max)
                        row += [f"{t_.median * 1e9:.1f} ({lo * 1e9:.1f}-{hi * 1e9:.1f})", ""]
                    else:
                        s = r.rate_summary()
                        med[k] = s.median
                        cell = report.rate_cell(s, units, spread) + (" WRONG DATA" if r.extra.get("verified") is False
                                                                     else "")
                        row += [cell, report.peak_cell(r.extra.get("pct_of_peak"))]
                    row.append(stop_cell(r.extra, len(r.samples_s)))
                if ratio:
                    row.append(f"{med['pinned'] / med['pageable']:.2f}x" if "pinned" in med and "pageable" in med else "")
                t.add_row(*row)
            out.append(t)
    peaks = {r.extra.get("peak_bytes_per_s") for r in recs if r.extra.get("peak_bytes_per_s")
             and not r.extra.get("peak_source")}
    dev_peaks = {r.extra["peak_bytes_per_s"] for r in recs if r.extra.get("peak_bytes_per_s") and r.extra.get("peak_source")}
    notes = [f"{units}/s = {'1e9' if units == 'GB' else '2^30'} B/s; sizes in binary units; median over "
             f"samples, timed with CUDA events ({result.timing.get('warmup')} warm-up(s)).",
             stopping_note(result.timing, recs)]
    if peaks:
        notes.append("% peak: of the raw PCIe line rate per direction " +
                     ", ".join(format_rate(p, units) + f" {units}/s" for p in sorted(peaks)) + ".")
    if dev_peaks:
        notes.append("% peak of d2d: of half the device memory bandwidth (bus width x memory clock x 2, from NVML; "
                     "each byte is read and written) " +
                     ", ".join(format_rate(p, units) + f" {units}/s" for p in sorted(dev_peaks)) + ".")
    if any(r.extra.get("above_peak") for r in recs):
        notes.append("!! marks a figure above the link's physical peak: a timing fault, not a real speed.")
    if any(r.extra.get("verified") is False for r in recs):
        notes.append("WRONG DATA: --verify found bytes that did not arrive as sent.")
    elif any(r.extra.get("verified") for r in recs):
        notes.append("--verify: every checked copy arrived intact.")
    if result.partial:
        notes.append(report.partial_note(result))
    return out + notes


command = benchmark_command("copy", OPTIONS, build_spec, format_report, help=HELP, display=("spread",))

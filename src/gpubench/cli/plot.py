"""``gpubench plot`` options."""

from __future__ import annotations

import dataclasses

import click

from gpubench.core.bounds import MAX_GBPS, Bound
from gpubench.core.errors import UsageError
from gpubench.kit import DEBUG_OPTION, StrictFloat, StrictInt, Text, wrote

DPI = Bound("--dpi", lo=10, hi=1000)  # pixels per inch
PEAK = Bound("--peak", lo=0, above=True, hi=MAX_GBPS)  # in --units/s


@click.command("plot")
@click.argument("results", nargs=-1, required=True, type=click.Path(dir_okay=True))
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False),
              help="PNG file to write, e.g. out.png (written atomically).")
@click.option("--units", type=click.Choice(["GB", "GiB"]), default="GB", show_default=True,
              help="Bandwidth units: GB/s = 1e9 B/s, GiB/s = 2^30 B/s.")
@click.option("--size", "size", default=None,
              help="Figure size WIDTHxHEIGHT in inches, e.g. 12x7 [default: from the panels].")
@click.option("--dpi", type=StrictInt(bound=lambda: DPI), default=100, show_default=True, help="Pixels per inch.")
@click.option("--peak", "peaks", type=StrictFloat(bound=lambda: PEAK), multiple=True,
              help="Draw a dashed peak line at this bandwidth (in --units/s), labelled 'user'; repeatable. "
                   "Peaks saved in the results are drawn anyway. Refused where no panel has a bandwidth axis.")
@click.option("--title", type=Text(), default=None, help="Title over the whole figure.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors and warnings.")
@DEBUG_OPTION
def command(results, output, units, size, dpi, peaks, title, quiet, debug):
    """Plot saved results into one PNG, each command the way it reads best: copy as lines against
    size per direction (one colour per memory kind); batch, memcpy2d and overlap as bars per strategy
    at one size; nccl busbw and algbw against size; p2p as annotated matrices on a shared scale; net
    per stream and in total against time; merge per worker pair. Several files are overlaid, one
    colour per file. No GPU and no display needed.
    """
    from gpubench.analysis import plot as plotmod
    from gpubench.core.result import check_output_path

    if not output.lower().endswith(".png"):
        raise UsageError(f"-o {output!r} must end in .png", "e.g. -o out.png")
    check_output_path(output, "-o")
    DPI.check(dpi)
    for p in peaks:
        dataclasses.replace(PEAK, unit=f"{units}/s").check(p)
    size_in = plotmod.parse_figsize(size)
    if size_in and dpi * min(size_in) < 100:
        raise UsageError(f"--size {size} at --dpi {dpi} is under 100 pixels a side", "raise --size or --dpi, e.g. --size 8x5")
    if size_in and dpi * max(size_in) > 20000:
        raise UsageError(f"--size {size} at --dpi {dpi} is over 20000 pixels a side", "lower --size or --dpi")
    loaded = [(p, plotmod.load(p)) for p in results]  # the first unreadable file's UsageError
    path = plotmod.render(loaded, output, units=units, size_in=size_in, dpi=dpi, peaks_gbps=peaks, title=title)
    wrote(path, quiet=quiet)
    return 0

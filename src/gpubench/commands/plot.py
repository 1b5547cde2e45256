"""``gpubench plot`` options."""

from __future__ import annotations

import click

from gpubench.core.errors import UsageError


@click.command("plot")
@click.argument("results", nargs=-1, required=True, type=click.Path(dir_okay=True))
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False),
              help="PNG file to write, e.g. out.png.")
@click.option("--units", type=click.Choice(["GB", "GiB"]), default="GB", show_default=True,
              help="Bandwidth units: GB/s = 1e9 B/s, GiB/s = 2^30 B/s.")
@click.option("--size", "size", default=None,
              help="Figure size WIDTHxHEIGHT in inches, e.g. 12x7 [default: 9.5x5 per panel, 2 panels a row].")
@click.option("--dpi", type=int, default=100, show_default=True, help="Pixels per inch.")
@click.option("--peak", "peaks", type=float, multiple=True,
              help="Draw a dashed peak line at this bandwidth (in --units/s); repeatable. Peaks saved in the "
                   "results are drawn anyway.")
@click.option("--title", default=None, help="Title over the whole figure.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
@click.option("--debug", is_flag=True, help="Show tracebacks of errors.")
def command(results, output, units, size, dpi, peaks, title, quiet, debug):
    """Plot saved results into a PNG: bandwidth against size (log2 axis, one line per mode, dashed
    link peak), heatmaps for p2p matrices, bars per worker pair for merge. Several results are
    overlaid. No GPU and no display needed.
    """
    from gpubench import plot as plotmod
    from gpubench.core.result import check_output_path, load

    if not output.lower().endswith(".png"):
        raise UsageError(f"-o {output!r} must end in .png", "e.g. -o out.png")
    check_output_path(output, "-o")
    if not (10 <= dpi <= 1000):
        raise UsageError(f"--dpi {dpi} must be between 10 and 1000")
    for p in peaks:
        if not (p > 0):
            raise UsageError(f"--peak {p} must be a bandwidth > 0")
    size_in = plotmod.parse_figsize(size, 1) if size else None
    loaded = [(p, load(p)) for p in results]
    path = plotmod.render(loaded, output, units=units, size_in=size_in, dpi=dpi, peaks_gbps=peaks, title=title)
    if not quiet:
        click.echo(f"wrote {path}")
    return 0

"""``gpubench report`` options."""

from __future__ import annotations

import click

from gpubench.core.errors import UsageError
from gpubench.kit import DEBUG_OPTION, Text, wrote


@click.command("report")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=True))
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False),
              help="HTML file to write, e.g. report.html (written atomically).")
@click.option("--units", type=click.Choice(["GB", "GiB"]), default="GB", show_default=True,
              help="Bandwidth units: GB/s = 1e9 B/s, GiB/s = 2^30 B/s.")
@click.option("--title", type=Text(), default=None, help="Heading of the page [default: gpubench report].")
@click.option("--baseline", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="A saved result to compare each input of its command with (no comparison without it).")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors and warnings.")
@DEBUG_OPTION
def command(inputs, output, units, title, baseline, quiet, debug):
    """One self-contained HTML page (no network, plots inline) of saved results, suite bundles or
    their folders, and fleet bundles: verdicts and flags first (partial, above peak, throttled,
    failed), the environment, the fleet table, each suite's expectations, with --baseline FILE a
    comparison of each input of its command against it, and each result's table and plot.
    Readable without JavaScript; prints well. No GPU needed.
    """
    from gpubench.analysis import html as htmlreport
    from gpubench.core.result import check_output_path

    if not output.lower().endswith((".html", ".htm")):
        raise UsageError(f"-o {output!r} must end in .html", "e.g. -o report.html")
    check_output_path(output, "-o")
    path = htmlreport.write(list(inputs), output, units=units, title=title, baseline=baseline)
    wrote(path, quiet=quiet)
    return 0

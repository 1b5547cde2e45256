"""``gpubench metrics`` options."""

from __future__ import annotations

import sys

import click

from gpubench.core.errors import UsageError
from gpubench.kit import DEBUG_OPTION, wrote


@click.command("metrics")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=True))
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False),
              help="OpenMetrics file to write, e.g. /var/lib/node_exporter/textfile/gpubench.prom "
                   "(written atomically, so a scraper never reads half of it); - for standard output.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors and warnings.")
@DEBUG_OPTION
def command(inputs, output, quiet, debug):
    """Saved results, suite bundles or their folders as OpenMetrics text for Prometheus
    (node_exporter's textfile collector): each figure's median and p25/p75 band labelled by host,
    GPU UUID, command and the figure's params; the expectations' outcomes and the suite's verdict;
    PCIe replays and NVLink errors during the run; PCIe link generation and width; when each result
    was made. docs/metrics.md lists the families. No GPU needed.
    """
    from gpubench.analysis import html as inputs_reader
    from gpubench.analysis import metrics
    from gpubench.core.result import STDOUT, check_output_path, write_bytes_atomic

    if output != STDOUT:
        if not output.endswith(".prom"):
            raise UsageError(f"-o {output!r} must end in .prom (node_exporter's textfile collector reads "
                             "only *.prom)", "e.g. -o gpubench.prom, or -o - for standard output")
        check_output_path(output, "-o")
    read = inputs_reader.read_inputs(list(inputs))
    fams = metrics.build([it.result for it in read.items], [b for _, b in read.bundles])
    text = fams.text()
    from gpubench.core.report import err_line
    from gpubench.core.signals import note_complete

    if fams.replaced:
        err_line(f"gpubench: warning: {fams.replaced} series given more than once: the newest result's value "
                 "is kept (within one result, its last record's)")
    if output == STDOUT:
        sys.stdout.buffer.write(text)
        sys.stdout.flush()
        note_complete()
        return 0
    path = write_bytes_atomic(text, output, "the metrics", "-o")
    wrote(path, f" ({sum(len(s) for _, _, s in fams.fams.values())} series)", quiet=quiet)
    return 0

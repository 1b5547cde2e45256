"""``gpubench compare`` options and output."""

from __future__ import annotations

import sys

import click

from gpubench.core.errors import RegressionFound, UsageError


@click.command("compare")
@click.argument("base", type=click.Path(dir_okay=True))
@click.argument("new", nargs=-1, required=True, type=click.Path(dir_okay=True))
@click.option("--threshold", "threshold_pct", type=float, default=1.0, show_default=True,
              help="Changes of at most this many percent count as 'same'.")
@click.option("--alpha", type=float, default=0.01, show_default=True,
              help="Significance level of the Mann-Whitney U test on the samples.")
@click.option("--fail-on-regression", is_flag=True,
              help="Exit 1 when a figure is worse by more than --threshold and beyond noise, or when a "
                   "figure with data in BASE has none in NEW. Figures worse with too few samples to "
                   "test are warned about, not failed.")
@click.option("--format", "fmt", type=click.Choice(["table", "markdown", "json"]), default="table",
              show_default=True, help="table for a terminal, markdown for a pull-request comment, json for tools.")
@click.option("--units", type=click.Choice(["GB", "GiB"]), default="GB", show_default=True,
              help="Bandwidth units: GB/s = 1e9 B/s, GiB/s = 2^30 B/s.")
@click.option("--debug", is_flag=True, help="Show tracebacks of errors.")
def command(base, new, threshold_pct, alpha, fail_on_regression, fmt, units, debug):
    """Compare saved results: BASE.json against NEW.json (and more, each against BASE).

    Figures are paired by their parameters (size, direction, memory kind, devices...). For each:
    the two medians, the change in %, and a verdict (better / worse / same) from a Mann-Whitney U
    test on the raw samples; bandwidth is higher-is-better, time lower-is-better. Figures found on
    one side only are listed. No GPU is needed.
    """
    check_options(threshold_pct, alpha)
    from gpubench import compare as cmpmod
    from gpubench.core.result import load

    results = [(p, load(p)) for p in (base, *new)]
    cmpmod.check_same_command(results)
    (bname, b), rest = results[0], results[1:]
    cmps = [cmpmod.compare(b, r, base_name=bname, new_name=n, threshold_pct=threshold_pct, alpha=alpha)
            for n, r in rest]
    display(cmps, fmt, threshold_pct=threshold_pct, alpha=alpha, units=units)
    if fail_on_regression:
        worse = [r for c in cmps for r in c.regressions()]
        missing = sum(len(c.missing()) for c in cmps)
        why = []
        untested = sum(len(c.untested_worse()) for c in cmps)
        if worse:
            why.append(f"{len(worse)} figure(s) worse by more than {threshold_pct:g}% beyond noise")
        if missing:
            why.append(f"{missing} figure(s) with data in the base have none in the new result")
        note = (f"{untested} figure(s) worse by more than {threshold_pct:g}% could not be tested at alpha "
                f"{alpha:g} (too few samples: 3 against 3 give p >= 0.1); not counted as regressions; take "
                "more samples (-n, --samples, --runs) to test them") if untested else ""
        if why:  # one line on stderr for a failing exit: the note joins the error
            raise RegressionFound("; ".join(why + ([note] if note else [])))
        if note:
            print(f"gpubench: warning: {note}", file=sys.stderr)
    return 0


def check_options(threshold_pct: float, alpha: float) -> None:
    """Raises UsageError for a negative or non-finite threshold or an alpha outside (0, 1)."""
    import math

    if not math.isfinite(threshold_pct) or threshold_pct < 0:
        raise UsageError(f"--threshold {threshold_pct} must be a percentage >= 0", "e.g. --threshold 2")
    if not (0 < alpha < 1):
        raise UsageError(f"--alpha {alpha} must be between 0 and 1", "e.g. --alpha 0.01")


def display(cmps, fmt: str, *, threshold_pct: float, alpha: float, units: str) -> None:
    """Print comparisons in the chosen format on stdout."""
    import json

    from gpubench import compare as cmpmod
    from gpubench.core import report

    if fmt == "json":
        click.echo(json.dumps(cmpmod.format_json(cmps, threshold_pct=threshold_pct, alpha=alpha), indent=1))
    elif fmt == "markdown":
        click.echo("\n".join(cmpmod.format_markdown(cmps, threshold_pct=threshold_pct, alpha=alpha, units=units)))
    else:
        report.display(cmpmod.format_table(cmps, threshold_pct=threshold_pct, alpha=alpha, units=units))

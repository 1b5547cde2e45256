"""``gpubench compare`` options and output."""

from __future__ import annotations

import sys

import click

from gpubench.core.bounds import Bound
from gpubench.core.errors import RegressionFound, UsageError
from gpubench.kit import DEBUG_OPTION, StrictFloat


#: a change of 10,000x is no longer a threshold
THRESHOLD = Bound("--threshold", lo=0, hi=1e6, unit="percent")
#: the Mann-Whitney test's significance level, a probability strictly between 0 and 1
ALPHA = Bound("--alpha", lo=0, above=True, hi=1, below=True)


@click.command("compare")
@click.argument("base", type=click.Path(dir_okay=True))
@click.argument("new", nargs=-1, required=True, type=click.Path(dir_okay=True))
@click.option("--threshold", "threshold_pct", type=StrictFloat(bound=lambda: THRESHOLD), default=1.0, show_default=True,
              help="Changes of at most this many percent count as 'same'.")
@click.option("--alpha", type=StrictFloat(bound=lambda: ALPHA), default=0.01, show_default=True,
              help="Significance level of the Mann-Whitney U test on the samples.")
@click.option("--ignore-param", "ignore", multiple=True, metavar="NAME",
              help="Pair figures that differ only in this param (repeatable): merge -p tcp against ucx "
                   "(protocol), net -P 2 against -P 4 (streams), two memory kinds (memory).")
@click.option("--fail-on-regression", is_flag=True,
              help="Exit 1 when a figure is slower by more than --threshold and beyond noise (p < --alpha), "
                   "slower by more than --threshold with too few samples to decide at --alpha, "
                   "or when a figure with data in BASE has none in NEW.")
@click.option("--strict", is_flag=True,
              help="With --fail-on-regression, also exit 1 on an inconclusive figure (changed by more than "
                   "--threshold, but the test does not reach significance).")
@click.option("--format", "fmt", type=click.Choice(["table", "markdown", "json"]), default="table",
              show_default=True, help="table for a terminal, markdown for a pull-request comment, json for tools.")
@click.option("--units", type=click.Choice(["GB", "GiB"]), default="GB", show_default=True,
              help="Bandwidth units: GB/s = 1e9 B/s, GiB/s = 2^30 B/s.")
@click.option("-q", "--quiet", is_flag=True,
              help="Print nothing but errors and warnings (with --fail-on-regression: the exit code and its one line).")
@DEBUG_OPTION
def command(base, new, threshold_pct, alpha, ignore, fail_on_regression, strict, fmt, units, quiet, debug):
    """Compare saved results: BASE.json against NEW.json (and more, each against BASE).

    Figures are paired by their parameters (size, direction, memory kind, devices...). For each:
    the medians, n per side, the change (Hodges-Lehmann) with its confidence interval, the
    Mann-Whitney p, and a verdict: same (within --threshold), faster / slower (beyond it and
    p < --alpha), inconclusive (beyond it, not significant), undecidable (beyond it, and the
    sample sizes cannot reach --alpha: the row says how many would). Bandwidth is higher-is-better,
    time lower-is-better. Figures found on one side only are listed. No GPU is needed.
    """
    THRESHOLD.check(threshold_pct)
    ALPHA.check(alpha)
    if strict and not fail_on_regression:
        raise UsageError("--strict needs --fail-on-regression", "add --fail-on-regression")
    from gpubench.analysis import compare as cmpmod
    from gpubench.core.result import load

    results = [(p, load(p)) for p in (base, *new)]
    cmpmod.check_same_command(results)
    (bname, b), rest = results[0], results[1:]
    cmps = [cmpmod.compare(b, r, base_name=bname, new_name=n, threshold_pct=threshold_pct, alpha=alpha,
                           ignore=tuple(dict.fromkeys(ignore))) for n, r in rest]
    if not quiet:
        display(cmps, fmt, threshold_pct=threshold_pct, alpha=alpha, units=units)
    if fail_on_regression:
        raise_on_regression(cmps, strict=strict, threshold_pct=threshold_pct, alpha=alpha)
    return 0


def raise_on_regression(cmps, *, strict: bool, threshold_pct: float, alpha: float) -> None:
    """The gate of --fail-on-regression: RegressionFound (exit 1, one line naming the worst figure)
    on a slower, undecidably slower or missing figure; with ``strict`` also on an inconclusive one
    (else a warning line on stderr)."""
    from gpubench.analysis import compare as cmpmod
    from gpubench.core import safe

    def rows(get) -> list:
        return [(c, r) for c in cmps for r in get(c)]

    def worst(pairs) -> str:
        row = cmpmod.worst([r for _, r in pairs])
        if row is None:
            return "-"
        cmp = next(c for c, r in pairs if r is row)
        return safe.term(cmpmod.figure_text(row, cmpmod.differing_params(cmp.rows)), 160)

    slower = rows(lambda c: c.regressions())
    undecided = rows(lambda c: c.undecidable(slower_only=True))
    missing = sum(len(c.missing()) for c in cmps)
    inconclusive = sum(len(c.inconclusive()) for c in cmps)
    hint = cmpmod.more_samples_hint(cmps[0].command) if cmps else ""
    why = []
    if slower:
        why.append(f"{len(slower)} figure(s) slower by more than {threshold_pct:g}% beyond noise (p < {alpha:g}); "
                   f"worst {worst(slower)}")
    if undecided:
        why.append(f"{len(undecided)} figure(s) slower by more than {threshold_pct:g}% that the samples cannot decide "
                   f"at p < {alpha:g} ({undecided[0][1].why}); worst {worst(undecided)}; take {hint}")
    if missing:
        why.append(f"{missing} figure(s) with data in the base have none in the new result")
    note = (f"{inconclusive} figure(s) changed by more than {threshold_pct:g}% without reaching p < {alpha:g} "
            f"(inconclusive); to decide them, take {hint}") if inconclusive else ""
    if strict and inconclusive:
        why.append(note)
        note = ""
    if why:  # one line on stderr for a failing exit: the note joins the error
        raise RegressionFound("; ".join(why + ([note] if note else [])))
    if note:
        print(f"gpubench: warning: {note}; not failed (--strict fails on them)", file=sys.stderr)


def display(cmps, fmt: str, *, threshold_pct: float, alpha: float, units: str) -> None:
    """Print comparisons in the chosen format on stdout."""
    import json

    from gpubench.analysis import compare as cmpmod
    from gpubench.core import report

    if fmt == "json":
        click.echo(json.dumps(cmpmod.format_json(cmps, threshold_pct=threshold_pct, alpha=alpha), indent=1))
    elif fmt == "markdown":
        click.echo("\n".join(cmpmod.format_markdown(cmps, threshold_pct=threshold_pct, alpha=alpha, units=units)))
    else:
        report.display(cmpmod.format_table(cmps, threshold_pct=threshold_pct, alpha=alpha, units=units))

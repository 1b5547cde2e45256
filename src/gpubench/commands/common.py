"""Options every command shares, and the steps every command ends with (render, save, exit code)."""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Callable, Sequence

import click

from gpubench.core import report
from gpubench.core.errors import MachineError
from gpubench.core.result import STDOUT, Result, check_output_path, save


def common_options(f: Callable) -> Callable:
    """Add --json PATH, --units GB|GiB, -q/--quiet and --debug to a command."""

    @click.option("--json", "json_path", type=click.Path(dir_okay=False, allow_dash=True), default=None,
                  help="Save the result (samples, spec, environment) to this JSON file; '-' writes it to "
                       "stdout and the report to stderr.")
    @click.option("--units", type=click.Choice(["GB", "GiB"]), default="GB", show_default=True,
                  help="Bandwidth units: GB/s = 1e9 B/s, GiB/s = 2^30 B/s.")
    @click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
    @click.option("--debug", is_flag=True, help="Show tracebacks of errors.")
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        to_stdout = kwargs.get("json_path") == STDOUT
        if kwargs.get("json_path") is not None and not to_stdout:  # --json "" is a mistake, not "don't save"
            check_output_path(kwargs["json_path"])
        with report.human_to_stderr(to_stdout):
            return f(*args, **kwargs)

    return wrapper


def finish(result: Result, renderables: list, *, json_path: str | None, quiet: bool) -> int:
    """Print the report, save the JSON if asked, and return the exit code (130/143 when interrupted)."""
    from gpubench.core.registry import INVOCATION

    from gpubench.core.signals import CRITICAL

    if not result.argv:
        result.argv = list(INVOCATION)
    with CRITICAL:  # a Ctrl-C now is acted on once what was measured is shown and saved
        report.display(renderables, quiet=quiet)
        if json_path:
            save(result, json_path)
            if not quiet and json_path != STDOUT:
                report.console().print(f"saved {json_path}" + (" (partial)" if result.partial else ""))
    if result.partial and result.failed_by:
        return 3  # the caller re-raises the MachineError, whose line says what failed
    if result.partial:
        sig = result.interrupted_by or "SIGINT"
        measured = [r for r in result.records if r.samples_s]
        print(f"gpubench: interrupted by {sig}; kept what was measured: {len(measured)} point(s), "
              f"{sum(len(r.samples_s) for r in measured)} sample(s)", file=sys.stderr)
        return 143 if sig == "SIGTERM" else 130
    return 0


def run_keeping_partial(run: Callable[[], Result], report: Callable[[Result], list], *, json_path: str | None,
                        quiet: bool) -> int:
    """``run()`` then :func:`finish`; when the run fails with a MachineError that carries what was
    measured (``partial_result``), print and save that first (marked partial, ``failed_by``), then
    re-raise the error (exit 3)."""
    try:
        result = run()
    except MachineError as e:
        if e.partial_result is not None:
            finish(e.partial_result, report(e.partial_result), json_path=json_path, quiet=quiet)
        raise
    return finish(result, report(result), json_path=json_path, quiet=quiet)


# -- shared option groups: declared once, composed by each command ----------------------------------


def timing_options(*, warmup: int = 2, what: str = "timed copies") -> list[Callable]:
    """-w/--warmup, -n/--iters and --min-time (checked by :func:`timing_plan`)."""
    return [
        click.option("-w", "--warmup", type=int, default=warmup, show_default=True, help="Untimed samples per point."),
        click.option("-n", "--iters", type=int, default=None,
                     help="Timed samples per point [default: enough for --min-time]."),
        click.option("--min-time", type=float, default=0.1, show_default=True,
                     help=f"Seconds of {what} per point when -n is not given."),
    ]


def sweep_options(*, min_bytes: str, max_bytes: str, factor: float = 4.0, what: str = "copy") -> list[Callable]:
    """-b/--min-bytes, -e/--max-bytes, -f/--step-factor: nccl-tests' size sweep."""
    return [
        click.option("-b", "--min-bytes", default=min_bytes, show_default=True,
                     help=f"Smallest {what} (4KiB, 1M, 1GB, bytes)."),
        click.option("-e", "--max-bytes", default=max_bytes, show_default=True, help=f"Largest {what}."),
        click.option("-f", "--step-factor", type=float, default=factor, show_default=True,
                     help="Multiply the size by this each step."),
    ]


def spread_option() -> Callable:
    """--spread iqr|range: the spread shown beside each median (a display option)."""
    return click.option("--spread", type=click.Choice(["iqr", "range"]), default="iqr", show_default=True,
                        help="Spread shown beside the median: p25-p75 or min-max.")


OUTPUT_PARAMS = ("json_path", "units", "quiet", "debug")


def benchmark_command(name: str, options: Sequence[Callable], build_spec: Callable, report: Callable[..., list],
                      *, help: str, display: Sequence[str] = (), run: Callable | None = None,
                      after: Callable | None = None) -> click.Command:
    """The click command of a measuring benchmark, generated from its declared options.

    The callback is the same for every benchmark: the options that are not output (--json,
    --units, -q, --debug) or display (``display``) go to ``build_spec`` by name (the one place that
    validates them, no GPU needed); ``gpubench.bench.<name>.run`` runs the spec through the driver
    with a progress bar; ``report(result, units=..., **display options)`` renders it; the result
    is saved and the exit code returned (:func:`run_benchmark`). The bench module is imported
    only when the command runs, so ``--help`` stays light.

    Args:
        name: the command and its bench module's name.
        options: click option decorators, top to bottom as --help lists them.
        build_spec: options -> Spec; raises UsageError naming a bad value.
        report: (result, units=..., **display) -> renderables.
        help: the command's help text.
        display: option names that only change how the result is shown.
        run: spec -> the run function to use (default ``gpubench.bench.<name>.run``), e.g. a
            distributed path chosen by an option.
        after: (result, spec, code) -> exit code, called once the result is shown and saved (an
            expectation such as --expect-busbw raises RegressionFound there).

    The returned command carries ``build_spec``, ``bench_name``, ``display``, ``report``,
    ``select_run`` and ``after`` so ``suite`` can run it through the driver without a JSON round
    trip and apply the command's own verdict.
    """

    def select_run(spec) -> Callable:
        if run is not None:
            return run(spec)
        return importlib.import_module(f"gpubench.bench.{name}").run

    def callback(**kwargs):
        out = {k: kwargs.pop(k) for k in OUTPUT_PARAMS}
        shown = {k: kwargs.pop(k) for k in display}
        spec = build_spec(**kwargs)
        result_box: list = []

        def run_fn(s, progress):
            result_box.append(select_run(s)(s, progress))
            return result_box[-1]

        code = run_benchmark(run_fn, spec, lambda r: report(r, units=out["units"], **shown),
                             json_path=out["json_path"], quiet=out["quiet"])
        if after is not None and result_box:
            code = after(result_box[-1], spec, code)
        return code

    callback.__doc__ = help
    f = common_options(callback)
    for opt in reversed(list(options)):
        f = opt(f)
    cmd = click.command(name, help=help)(f)
    cmd.build_spec = build_spec  # type: ignore[attr-defined]
    cmd.bench_name = name  # type: ignore[attr-defined]
    cmd.display = tuple(display)  # type: ignore[attr-defined]
    cmd.report = report  # type: ignore[attr-defined]
    cmd.select_run = select_run  # type: ignore[attr-defined]
    cmd.after = after  # type: ignore[attr-defined]
    return cmd


def run_benchmark(run: Callable, spec, report_fn: Callable[[Result], list], *, json_path: str | None,
                  quiet: bool) -> int:
    """The ending every measuring command shares: ``run(spec, progress)`` through the driver with a
    progress bar, then :func:`run_keeping_partial` (a machine fault's finished points are printed
    and saved, marked partial, before exit 3)."""

    def go() -> Result:
        with report.progress(not quiet) as prog:
            return run(spec, prog)

    return run_keeping_partial(go, report_fn, json_path=json_path, quiet=quiet)

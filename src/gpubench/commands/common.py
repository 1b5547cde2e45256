"""Options every command shares, and the steps every command ends with (render, save, exit code)."""

from __future__ import annotations

import functools
import sys
from typing import Callable

import click

from gpubench.core import report
from gpubench.core.errors import MachineError, UsageError
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
    from gpubench import cli

    if not result.argv:
        result.argv = list(cli.INVOCATION)
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


MAX_COUNT = 10**9  # any count option; beyond it is a typo, not a measurement
MAX_REPEATS = 10**6  # warm-ups, iterations and samples per point


def positive_int(name: str, value: int | None, *, allow_zero: bool = False, maximum: int = MAX_COUNT) -> int | None:
    """Check an integer option; None passes through.

    Raises:
        UsageError: negative, zero when not allowed, or above ``maximum``.
    """
    if value is None:
        return None
    if value < 0 or (value == 0 and not allow_zero):
        raise UsageError(f"{name} {value} must be {'>= 0' if allow_zero else '>= 1'}")
    if value > maximum:
        shown = value if value < 10**12 else f"(a {len(str(value))}-digit number)"
        raise UsageError(f"{name} {shown} is too large", f"at most {maximum:,}")
    return value


def csv_list(text: str, what: str, allowed: tuple[str, ...] | None = None, kind: str = "value") -> tuple[str, ...]:
    """Split a comma list option ("h2d,d2h") into unique items, checked against ``allowed``.

    Args:
        text: the option's value.
        what: the option's name for messages ("--direction").
        allowed: the accepted items, or None for any.
        kind: what an item is, for messages ("direction").

    Raises:
        UsageError: an empty list, a repeated item, or an item not in ``allowed``.
    """
    items = tuple(x.strip() for x in str(text).split(",") if x.strip())
    if not items:
        raise UsageError(f"{what} {text!r} is empty")
    if len(set(items)) != len(items):
        raise UsageError(f"{what} {text!r} repeats a value", "name each once")
    if allowed is not None:
        for x in items:
            if x not in allowed:
                raise UsageError(f"{kind} {x!r} not known", f"use {', '.join(allowed)}")
    return items


def timing_plan(warmup: int, iters: int | None, min_time: float):
    """Check -w/--warmup, -n/--iters and --min-time and build a TimingPlan.

    Raises:
        UsageError: a negative warm-up, iterations below 1, or a min time that is not > 0.
    """
    from gpubench.core.timing import TimingPlan

    positive_int("-w/--warmup", warmup, allow_zero=True, maximum=MAX_REPEATS)
    positive_int("-n/--iters", iters, maximum=MAX_REPEATS)
    if not (min_time > 0):
        raise UsageError(f"--min-time {min_time} must be > 0 seconds")
    return TimingPlan(warmup=warmup, iters=iters, min_time=min_time)


def device_id(device: int) -> int:
    """Check a single -d/--device ordinal (no GPU needed). Raises UsageError when negative."""
    if device < 0:
        raise UsageError(f"-d/--device {device} is negative", "device ids start at 0")
    return device

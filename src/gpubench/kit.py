"""Options every command shares, and the steps every command ends with (render, save, exit code)."""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any, Callable, Sequence

import click

from gpubench.core import report
from gpubench.core.errors import MachineError, UsageError, from_the_command_line, note_debug
from gpubench.core.result import STDOUT, Result, check_output_name, check_output_target, save
from gpubench.core.units import STEP_FACTOR


#: every command's --debug: eager, so its traceback also shows for an option that fails to parse after it
DEBUG_OPTION = click.option("--debug", is_flag=True, is_eager=True, callback=note_debug, help="Show tracebacks of errors.")

def common_options(f: Callable, written_by_rank_0: bool = False) -> Callable:
    """Add --json PATH, --units GB|GiB, -q/--quiet and --debug to a command. ``written_by_rank_0``:
    rank 0 alone writes --json; the other ranks check only the name's form."""

    @click.option("--json", "json_path", type=click.Path(dir_okay=False, allow_dash=True), default=None,
                  help="Save the result (samples, spec, environment) to this JSON file; '-' writes it to "
                       "stdout and the report to stderr.")
    @click.option("--units", type=click.Choice(["GB", "GiB"]), default="GB", show_default=True,
                  help="Bandwidth units: GB/s = 1e9 B/s, GiB/s = 2^30 B/s.")
    @click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors and warnings.")
    @DEBUG_OPTION
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        path = kwargs.get("json_path")
        if path == STDOUT:
            check_stdout_open()
        elif path is not None:  # --json "" is a mistake, not "don't save"
            from gpubench.launch.ranks import speaks_for_the_job

            check = check_output_name if written_by_rank_0 and not speaks_for_the_job() else check_output_target
            check(path, "--json")
        with report.human_to_stderr(path == STDOUT):
            return f(*args, **kwargs)

    return wrapper


def check_stdout_open() -> None:
    """Before a run with ``--json -``: standard output must be open. Raises UsageError: stdout is closed."""
    import io
    import os

    closed = sys.stdout is None or getattr(sys.stdout, "gpubench_closed_at_start", False)
    if not closed:
        try:
            os.fstat(sys.stdout.fileno())
        except (AttributeError, io.UnsupportedOperation):
            pass  # a StringIO (tests, an embedding program): writable
        except (OSError, ValueError):
            closed = True
    if closed:
        raise UsageError("--json -: standard output is closed", "give --json FILE, or run with stdout open")


def finish(result: Result, renderables: list, *, json_path: str | None, quiet: bool) -> int:
    """Print the report, save the JSON if asked, and return the exit code (130/143 when interrupted, with a point
    measured; docs/errors.md). Raises Interrupted: an interrupted run that measured nothing (its signal number)."""
    from gpubench.core.registry import INVOCATION

    from gpubench.core.signals import CRITICAL, Interrupted, note_complete

    if result.partial and not result.failed_by and not any(r.samples_s for r in result.records):
        import signal

        raise Interrupted(signal.Signals[result.interrupted_by or "SIGINT"].value)
    if not result.argv:
        result.argv = list(INVOCATION)
    with CRITICAL:  # a Ctrl-C now is acted on once what was measured is shown and saved
        lost = None
        try:
            report.display(list(renderables) + report.condition_notes(result), quiet=quiet)
        except report.ReportLost as e:  # the report's reader went away (`| head`): the result is still saved
            lost = e
        if json_path:
            save(result, json_path)
            if json_path != STDOUT and lost is None:
                report.saved(json_path, note=" (partial)" if result.partial else "", quiet=quiet)
        if lost is not None:
            raise lost
        if not result.partial:
            note_complete()  # a signal from here on ends the command, and its line says the result is whole
    if result.partial and result.failed_by:
        return 3  # the caller re-raises the MachineError, whose line says what failed
    if result.partial:
        sig = result.interrupted_by or "SIGINT"
        measured = [r for r in result.records if r.samples_s]
        report.err_line(f"gpubench: interrupted by {sig}; kept what was measured: {len(measured)} point(s), "
                        f"{sum(len(r.samples_s) for r in measured)} sample(s)")
        return 143 if sig == "SIGTERM" else 130
    return 0


def timing_options(*, warmup: int = 2, what: str = "timed copies", min_time: float = 0.1,
                   max_noise: float | None = None, max_time: float = 5.0) -> list[Callable]:
    """-w/--warmup, -n/--iters, --min-time, --max-noise and --max-time (the fields of the spec's
    :class:`~gpubench.core.timing.TimingPlan`; the last two are applied to the spec's plan by
    :func:`stopping_build_spec`, so a command's build_spec does not see them)."""
    goal = f"{max_noise:g}" if max_noise is not None else "off"
    return [
        click.option("-w", "--warmup", type=int, default=warmup, show_default=True, help="Untimed samples per point."),
        click.option("-n", "--iters", type=int, default=None,
                     help="Timed samples per point, exactly [default: by --min-time and --max-noise]."),
        click.option("--min-time", type=float, default=min_time, show_default=True,
                     help=f"Seconds of {what} per point, at least, when -n is not given."),
        click.option("--max-noise", type=float, default=max_noise,
                     help="After --min-time, sample until the median's noise (the half-width of its 95% "
                          "confidence interval, in % of the median) is at most this; 0 < PCT <= 100 "
                          f"[default: {goal}]."),
        click.option("--max-time", type=float, default=max_time, show_default=True,
                     help="Cap on the wall seconds a point samples while it waits for --max-noise (not a "
                          "hang deadline); a point stopped by it is marked 'cap'."),
    ]


STOP_PARAMS = ("max_noise", "max_time")


def stopping_build_spec(build_spec: Callable) -> Callable:
    """``build_spec`` that also takes ``max_noise`` and ``max_time`` and sets them on the spec's plan
    (None keeps the plan's time cap), which checks them (UsageError)."""
    import dataclasses

    @functools.wraps(build_spec)
    def build(**kwargs):
        stop = {k: kwargs.pop(k) for k in STOP_PARAMS if k in kwargs}
        spec = build_spec(**kwargs)
        plan = getattr(spec, "plan", None)
        if not stop or plan is None or not dataclasses.is_dataclass(spec) or isinstance(spec, type):
            return spec
        max_time = stop.get("max_time")
        plan = dataclasses.replace(plan, max_noise=stop.get("max_noise"),
                                   max_time=plan.max_time if max_time is None else max_time)
        return dataclasses.replace(spec, plan=plan)

    return build


def sweep_options(*, min_bytes: str, max_bytes: str, factor: float = 4.0, what: str = "copy") -> list[Callable]:
    """-b/--min-bytes, -e/--max-bytes, -f/--step-factor: nccl-tests' size sweep."""
    return [
        click.option("-b", "--min-bytes", default=min_bytes, show_default=True,
                     help=f"Smallest {what} (4KiB, 1M, 1GB, bytes)."),
        click.option("-e", "--max-bytes", default=max_bytes, show_default=True, help=f"Largest {what}."),
        click.option("-f", "--step-factor", type=StrictFloat(bound=lambda: STEP_FACTOR), default=factor,
                     show_default=True,
                     help="Multiply the size by this each step."),
    ]


def spread_option() -> Callable:
    """--spread iqr|range: the spread shown beside each median (a display option)."""
    return click.option("--spread", type=click.Choice(["iqr", "range"]), default="iqr", show_default=True,
                        help="Spread shown beside the median: p25-p75 or min-max.")


OUTPUT_PARAMS = ("json_path", "units", "quiet", "debug")


def _numa_option(ctx, param, value):
    from gpubench.core import numa

    return numa.parse_policy(value)


def condition_options() -> list[Callable]:
    """--no-telemetry, --numa NODE|none|all|auto, --require-idle (docs/conditions.md)."""
    return [
        click.option("--no-telemetry", "no_telemetry", is_flag=True,
                     help="Do not sample GPU clocks, power, temperature and throttle reasons during each point."),
        click.option("--numa", "numa", default="auto", show_default=True, callback=_numa_option,
                     help="Bind the host side to a NUMA node before host memory is allocated: auto (the GPU's "
                          "node, as nvbandwidth), a node number, none, or all (measure from every node)."),
        click.option("--require-idle", "require_idle", is_flag=True,
                     help="Refuse to start (exit 3) when the GPU has other processes, is busy or is hot."),
    ]


CONDITION_PARAMS = ("no_telemetry", "numa", "require_idle")


def benchmark_command(name: str, options: Sequence[Callable], build_spec: Callable, report: Callable[..., list],
                      *, help: str, display: Sequence[str] = (), run: Callable | None = None,
                      after: Callable | None = None, conditions: bool = True,
                      gathers_ranks: bool = False) -> click.Command:
    """The click command of a measuring benchmark, generated from its declared options: those that
    are not output or ``display`` go to ``build_spec`` by name; the spec runs through ``run(spec)``
    (default: its plug-in's ``bench`` module's ``run``, imported only then); ``report(result,
    units=..., **display)`` renders it; ``after(result, spec, code)`` may change the exit code.
    ``conditions``: add :func:`condition_options`; ``gathers_ranks``: the command joins the
    launcher's ranks itself (the others :func:`warn_ranks_alone`).

    The command carries ``build_spec``, ``bench_name``, ``display``, ``report``, ``select_run`` and
    ``after`` so ``suite`` can run it through the driver.
    """

    def select_run(spec) -> Callable:
        if run is not None:
            return run(spec)
        from gpubench.core import registry

        return importlib.import_module(registry.get(name).bench or "").run

    build_spec = stopping_build_spec(build_spec)

    def callback(**kwargs):
        from gpubench.core import benchmark

        out = {k: kwargs.pop(k) for k in OUTPUT_PARAMS}
        shown = {k: kwargs.pop(k) for k in display}
        cond = {k: kwargs.pop(k) for k in CONDITION_PARAMS if k in kwargs}
        with from_the_command_line():  # the options alone: every rank of a launcher refuses them alike
            spec = build_spec(**kwargs)
        note = quiet_keeps_nothing(out["quiet"], out["json_path"])
        if not gathers_ranks:
            warn_ranks_alone(name, out["json_path"])
        with benchmark.conditions(benchmark.Conditions(telemetry=not cond.get("no_telemetry", False),
                                                       numa=cond.get("numa", "auto"),
                                                       require_idle=cond.get("require_idle", False))):
            code, result = run_benchmark(lambda s, progress: select_run(s)(s, progress), spec,
                                         lambda r: report(r, units=out["units"], **shown),
                                         json_path=out["json_path"], quiet=out["quiet"], note=note)
        return code if after is None else after(result, spec, code)

    callback.__doc__ = help
    f = common_options(callback, written_by_rank_0=gathers_ranks)
    for opt in reversed(list(options) + (condition_options() if conditions else [])):
        f = opt(f)
    cmd = click.command(name, help=help)(f)
    for k, v in dict(build_spec=build_spec, bench_name=name, display=tuple(display), report=report,
                     select_run=select_run, after=after).items():
        setattr(cmd, k, v)
    return cmd


QUIET_NOTE = "-q without --json: this run's figures were neither shown nor kept; add --json FILE to keep them"


def quiet_keeps_nothing(quiet: bool, json_path: str | None) -> str | None:
    """:data:`QUIET_NOTE` where -q was given on the command line without --json (on rank 0 only
    under a launcher), else None."""
    ctx = click.get_current_context(silent=True)
    if not quiet or json_path is not None or ctx is None:
        return None
    if ctx.get_parameter_source("quiet") not in (click.core.ParameterSource.COMMANDLINE,
                                                 click.core.ParameterSource.ENVIRONMENT):
        return None  # set by the command itself (nccl's ranks other than 0)
    from gpubench.launch import ranks

    try:
        if ranks.discover().rank != 0:
            return None
    except UsageError:
        pass
    return QUIET_NOTE


def warn_ranks_alone(name: str, json_path: str | None) -> None:
    """Under a launcher of more than one rank, a command that does not join the ranks says so on
    stderr (each rank runs alone and writes --json). A launcher environment that does not parse
    is left to the commands that use it."""
    from gpubench.core.safe import term
    from gpubench.launch import ranks

    try:
        me = ranks.discover()
    except UsageError:
        return
    if not me.under_launcher or me.size == 1:
        return
    ctx = click.get_current_context(silent=True)
    shown = " ".join(ctx.command_path.split()[1:]) if ctx is not None else ""
    of = f"each of the {me.size} ranks" if me.size else "each rank"
    line = (f"{shown or name} does not gather ranks: under {me.launcher}, {of} runs it alone and prints its own "
            f"result (this is {me.label()})")
    if json_path and json_path != "-":
        line += f"; every rank writes --json {json_path} and the last write stays"
    report.err_line(f"gpubench: warning: {term(line, limit=2000)}; `gpubench suite` under the launcher "
                    "gathers every node into one report (docs/cluster.md)")


def wrote(path: object, note: str = "", quiet: bool = False) -> None:
    """A command whose output is the file it wrote (plot, report, metrics) is done: its result is
    complete (:func:`gpubench.core.signals.note_complete`: a signal from here on says so, as after a
    benchmark's --json in :func:`finish`), then the line ``wrote PATH``."""
    from gpubench.core.signals import note_complete

    note_complete()
    report.saved(path, "wrote", note, quiet=quiet)


def run_benchmark(run: Callable, spec, report_fn: Callable[[Result], list], *, json_path: str | None,
                  quiet: bool, note: str | None = None) -> tuple[int, Result]:
    """The ending every measuring command shares: ``run(spec, progress)`` through the driver with a
    progress bar, then :func:`finish`; returns (the exit code, the Result). A MachineError's
    ``partial_result`` is printed and saved (marked partial) before the error is re-raised (exit 3)."""
    try:
        with report.progress(not quiet) as prog:
            result = run(spec, prog)
    except MachineError as e:
        if e.partial_result is not None:
            finish(e.partial_result, report_fn(e.partial_result), json_path=json_path, quiet=quiet)
        raise
    code = finish(result, report_fn(result), json_path=json_path, quiet=quiet)
    if note:  # after the run: an error line before it stays the only line
        report.err_line(f"gpubench: warning: {note}")
    return code, result


class _Strict:
    """A click number type read by :func:`gpubench.core.options.parse_number` as ``kind``; its range
    is the Spec's (:mod:`gpubench.core.bounds`), or ``bound()``'s for an option that fills no Spec
    field. A bad value raises gpubench's UsageError (one line, exit 2)."""

    kind: type = int

    def __init__(self, digit_groups: bool = False, bounds_in: tuple[str, ...] = (),
                 bound: Callable[[], Any] | None = None):
        self.digit_groups = digit_groups
        self.bounds_in = bounds_in  # modules whose Specs declare the options' bounds
        self.bound = bound

    def convert(self, value, param, ctx):
        from gpubench.core.bounds import declared
        from gpubench.core.options import parse_number

        if value is None:
            return None
        name = _opt_name(param)
        with from_the_command_line():
            return parse_number(value, name, self.kind, digit_groups=self.digit_groups,
                                bound=self.bound or (lambda: declared(self.bounds_in, name)))


class StrictInt(_Strict, click.types.IntParamType):
    """click's INT: ASCII digits only (with ``digit_groups``, "_" between groups as in 50_000_000)."""


class StrictFloat(_Strict, click.types.FloatParamType):
    """click's FLOAT: ASCII digits, finite (no inf, nan, 1e400)."""

    kind = float


class Text(click.types.StringParamType):
    """click's TEXT, refusing an empty or blank value (docs/errors.md: an empty value is never read
    as the option's default)."""

    def convert(self, value, param, ctx):
        value = super().convert(value, param, ctx)
        if isinstance(value, str) and not value.strip():
            with from_the_command_line():
                raise UsageError(f"{_opt_name(param)} {value!r} is empty", "leave the option out for its default")
        return value


def _opt_name(param) -> str:
    opts = list(getattr(param, "opts", None) or [])
    return "/".join(opts) if opts else str(getattr(param, "name", "value"))


def harden_numeric_options(cmd: click.Command, name: str | None = None) -> click.Command:
    """Give every int and float parameter of ``cmd`` (a group's subcommands too) the strict types
    above, bound by the plug-in's Spec (its ``bench`` module) or the timing plan; in place, idempotent."""
    from gpubench.core import registry

    name = name or cmd.name or ""
    own = registry.find(name.split()[0])
    groups = own is not None and own.digit_groups
    specs = ("gpubench.core.timing", *([own.bench] if own is not None and own.bench else ()))
    if isinstance(cmd, click.Group):
        for sub_name, sub in cmd.commands.items():
            harden_numeric_options(sub, f"{name} {sub_name}")
        return cmd
    for p in cmd.params:
        t = p.type
        if isinstance(t, (StrictInt, StrictFloat)) or isinstance(t, click.types._NumberRangeBase):
            continue
        if type(t) is click.types.IntParamType:
            p.type = StrictInt(digit_groups=groups, bounds_in=specs)
        elif type(t) is click.types.FloatParamType:
            p.type = StrictFloat(bounds_in=specs)
    return cmd


def default_spec(command: click.Command, **options):
    """The Spec a generated command builds from its options' defaults with ``options`` changed (by parameter name): a
    suite step with its command line's checks and defaults. Raises TypeError: an option the command does not have (a
    plug-in's mistake); UsageError: a bad value (build_spec's or the Spec's line)."""
    with command.make_context(command.name, []) as ctx:
        params = dict(ctx.params)
    unknown = set(options) - set(params)
    if unknown:
        raise TypeError(f"gpubench {command.name} has no option(s) {', '.join(sorted(unknown))}")
    params.update(options)
    for k in (*OUTPUT_PARAMS, *CONDITION_PARAMS, *getattr(command, "display")):
        params.pop(k, None)
    return getattr(command, "build_spec")(**params)

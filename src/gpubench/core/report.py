"""Rendering: rich tables and the progress bar; measurement code never prints."""

from __future__ import annotations

import errno
import functools
import os
import sys
from contextlib import contextmanager, suppress
from typing import Any, Iterator

from gpubench.core import safe
from gpubench.core.stats import Summary
from gpubench.core.units import format_rate


_HUMAN_TO_STDERR = [False]  # True while stdout carries a JSON result (--json -): see human_to_stderr


@contextmanager
def human_to_stderr(enabled: bool = True) -> Iterator[None]:
    """While active (and ``enabled``), :func:`console` and :func:`display` write to stderr, so stdout
    carries nothing but the JSON result of ``--json -``."""
    before = _HUMAN_TO_STDERR[0]
    _HUMAN_TO_STDERR[0] = before or enabled
    try:
        yield
    finally:
        _HUMAN_TO_STDERR[0] = before


def human_stream():
    """Where the human report goes now: stdout, or stderr inside :func:`human_to_stderr` (``--json -``)."""
    return sys.stderr if _HUMAN_TO_STDERR[0] else sys.stdout


def err_line(text: str) -> None:
    """Write ``text`` and its newline to stderr in one write (whole up to PIPE_BUF, so two ranks'
    lines cannot run together), then flush."""
    with suppress(OSError, ValueError):  # a closed pipe: nothing more can reach it
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def is_terminal(stream) -> bool:
    """Whether ``stream`` is a person's terminal: a tty, except under Open MPI (each rank gets a
    0-column pty whatever mpirun's stdout is), unless ``FORCE_COLOR`` (https://force-color.org/)
    or ``TTY_COMPATIBLE=1`` asks for colour as rich reads them."""
    # rich's own order (Console.is_terminal): TTY_COMPATIBLE 0/1, then FORCE_COLOR, then isatty
    if os.environ.get("TTY_COMPATIBLE") in ("0", "1"):
        return os.environ["TTY_COMPATIBLE"] == "1"
    if os.environ.get("FORCE_COLOR") is not None:
        return os.environ["FORCE_COLOR"] != ""
    return _sized_terminal(stream)


def _sized_terminal(stream) -> bool:
    """A tty with a size of its own (not a rank's pty under Open MPI): decides the width and whether
    a live progress bar is drawn."""
    try:
        return stream.isatty() and "OMPI_COMM_WORLD_RANK" not in os.environ
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class ReportLost(BrokenPipeError):
    """The reader of the report went away (EPIPE) while it was written: a write fault, exit 3."""


@functools.cache
def _console_class():
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            """rich ends the process with exit 1 here, which gpubench's exit codes read as a
            regression: the rest goes to /dev/null (as rich does) and ReportLost is raised."""
            with suppress(OSError, ValueError, AttributeError):  # the stream this console writes (stdout or stderr)
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, self.file.fileno())
                os.close(null)
            raise ReportLost(errno.EPIPE, os.strerror(errno.EPIPE))

    return _Console


def console(stderr: bool = False):
    """A rich Console on stdout (or stderr, or inside :func:`human_to_stderr`), without colour when
    not a terminal (:func:`is_terminal`); a reader gone raises :class:`ReportLost`."""
    stderr = stderr or _HUMAN_TO_STDERR[0]
    stream = sys.stderr if stderr else sys.stdout
    # off a sized terminal rich would wrap at 80 columns and squeeze wide tables: 200 columns instead
    return _console_class()(stderr=stderr, highlight=False, soft_wrap=False,
                            width=None if _sized_terminal(stream) else 200, force_terminal=is_terminal(stream))


def saved(path: object, verb: str = "saved", note: str = "", quiet: bool = False) -> None:
    """Say where a file was written: one line ``"{verb} {path}{note}"`` on :func:`console`'s stream,
    the path escaped (:func:`gpubench.core.safe.term`) and never wrapped."""
    if quiet:
        return
    from rich.text import Text

    console().print(Text(f"{verb} {safe.term(path, 4096)}{note}"), soft_wrap=True)


def table(title: str, columns: list[str], caption: str | None = None):
    """A rich Table with right-aligned columns after the first."""
    from rich.table import Table

    # min_width keeps the title on one line above a narrow table
    t = Table(title=title, caption=caption, title_justify="left", caption_justify="left", min_width=len(title) + 2)
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right", no_wrap=True)
    return t


def kv_table(title: str, rows: list[tuple[str, str]]):
    """A two-column key/value table, values left-aligned and wrapped."""
    from rich.table import Table

    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column("", no_wrap=True, style="bold")
    t.add_column("", overflow="fold")
    for k, v in rows:
        t.add_row(k, v)
    return t


def rate_cell(rate: Summary, units: str = "GB", spread: str = "iqr") -> str:
    """'55.41 (55.38-55.44)': median bandwidth (``rate``: bytes per second) with p25-p75
    (spread="iqr") or min-max ("range")."""
    lo, hi = (rate.p25, rate.p75) if spread == "iqr" else (rate.min, rate.max)
    return f"{format_rate(rate.median, units)} ({format_rate(lo, units)}-{format_rate(hi, units)})"


def peak_cell(pct: float | None) -> str:
    """'88%' of the physical peak; '!! 104%' when above it (impossible: a timing fault)."""
    if pct is None:
        return "-"
    if pct > 100.0:
        return f"!! {pct:.0f}% > peak"
    return f"{pct:.0f}%"


_SHORT_CELL = 24  # columns whose cells are all this short are never squeezed or cut


def _fit(t) -> int:
    """Keep figures whole: short columns (numbers, sizes, names) get a minimum width of their
    longest cell and never wrap; long text columns fold. Returns the width the table needs with
    every short column whole and each long column at least 20 wide."""
    need = 1
    for col in t.columns:
        cells = [str(x) for x in getattr(col, "_cells", [])] + [str(col.header)]
        longest = max((len(line) for c in cells for line in c.splitlines() or [""]), default=0)
        if longest <= _SHORT_CELL:
            col.min_width = max(col.min_width or 0, longest)
            col.no_wrap = True
            need += longest + 3
        else:
            col.no_wrap = False
            col.overflow = "fold"
            need += min(longest, 20) + 3
    return need


def display(renderables, quiet: bool = False) -> None:
    """Print renderables (tables, strings) to stdout (stderr under ``--json -``) unless quiet; a
    table too wide for the terminal is printed at the width it needs, never with figures cut."""
    if quiet:
        return
    from rich.table import Table

    c = console()
    for r in renderables:
        if isinstance(r, Table) and (need := _fit(r)) > c.width:
            wide = console()
            wide.width = need
            wide.print(r)
        else:
            c.print(r)


class ProgressSink:
    """A silent progress callback: ``start(total, label)``, ``advance(label)``, ``done()``."""

    def start(self, total: int, label: str = "") -> None:
        pass

    def advance(self, label: str = "") -> None:
        pass

    def done(self) -> None:
        pass

    def warn(self, message: str) -> None:
        """A warning before or during the run (a busy GPU): one line on stderr, escaped."""
        err_line(f"gpubench: warning: {safe.term(message)}")


class RichProgress(ProgressSink):
    """A transient rich progress bar on stderr, shown only on a terminal."""

    def __init__(self, enabled: bool = True):
        self.quiet = not enabled
        self.enabled = enabled and _sized_terminal(sys.stderr)  # no live bar in a log, coloured or not
        self._p: Any = None  # rich.progress.Progress while shown
        self._task: Any = None

    def start(self, total: int, label: str = "") -> None:
        if not self.enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           console=console(stderr=True), transient=True)
        self._p.start()
        self._task = self._p.add_task(label, total=total)

    def advance(self, label: str = "") -> None:
        if self._p is not None:
            self._p.update(self._task, advance=1, description=label)

    def warn(self, message: str) -> None:
        if self.quiet:
            return
        if self._p is not None:
            self._p.console.print(f"gpubench: warning: {safe.term_markup(message)}")
        else:
            super().warn(message)

    def done(self) -> None:
        if self._p is not None:
            self._p.stop()
            self._p = None


@contextmanager
def progress(enabled: bool) -> Iterator[ProgressSink]:
    """Context manager yielding a progress sink that is always stopped."""
    p = RichProgress(enabled)
    try:
        yield p
    finally:
        p.done()


def partial_note(result, what: str = "points") -> str:
    """The report's line for a partial result: what stopped it (a fault's line, or the signal)."""
    why = f"stopped by a fault ({result.failed_by})" if result.failed_by else f"interrupted by {result.interrupted_by}"
    return f"PARTIAL: {why}; only the {what} above were measured."


def condition_notes(result) -> list[str]:
    """The lines every measuring command's report ends with about the conditions it measured under
    (idle check, telemetry, NUMA, limit flags), each only when something happened."""
    from gpubench.core import limits, numa, telemetry

    out = []
    pre = (result.env or {}).get("preflight") or {}
    for w in pre.get("warnings") or []:
        out.append(f"Before the run: {safe.term_markup(w)} (env.preflight in the JSON).")
    out += telemetry.notes(result.records)
    out += numa.notes(result.records, result.env or {})
    out += limits.notes([r for r in result.records if r.extra.get("limit_flag") == "no_op"
                         or r.extra.get("above_links_nvls") or r.extra.get("peak_source")])
    return out

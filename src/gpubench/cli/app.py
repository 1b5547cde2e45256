"""The ``gpubench`` command line: a click group whose commands (the registry's plug-ins) are
imported only when they run; ``--help`` reads only their descriptors.

Exit codes: 0 success; 1 a failed expectation or regression; 2 a usage error (bad option, no GPU);
3 a machine or library fault; 130 / 143 interrupted by SIGINT / SIGTERM (what was measured is kept).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import traceback
from typing import Iterator

import click

from gpubench import __version__
from gpubench.cli.interrupt import interrupted_line
from gpubench.core import signals
from gpubench.core.errors import DEBUG, GpubenchError
from gpubench.core import registry
from gpubench.core.registry import INVOCATION, load_command
from gpubench.core.signals import Interrupted


@contextlib.contextmanager
def _past_click() -> Iterator[None]:
    """A KeyboardInterrupt inside becomes :class:`Interrupted` (SIGINT), which click lets through to main."""
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted(signal.SIGINT) from None


class LazyGroup(click.Group):
    """A click Group that imports a command's module only when the command is run or its help shown
    (click docs, "Lazily Loading Subcommands"); an interrupt reaches :func:`main` past click."""

    def make_context(self, *args, **kwargs):
        with _past_click():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with _past_click():
            return super().invoke(ctx)

    def list_commands(self, ctx):
        return list(registry.plugins())

    def get_command(self, ctx, name):
        if registry.find(name) is None:
            return None
        from gpubench.kit import harden_numeric_options

        return harden_numeric_options(load_command(name), name)  # every numeric option bounded

    def resolve_command(self, ctx, args):
        """click's, with the closest command names suggested for a mistyped one ("cpoy")."""
        name = args[0] if args else ""
        if args and not name.startswith("-") and registry.find(name) is None:
            import difflib

            from gpubench.core import safe

            near = difflib.get_close_matches(name, list(registry.plugins()), n=3, cutoff=0.6)
            hint = f" Did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
            ctx.fail(f"No such command {safe.term(repr(name), 80)}.{hint}")
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx, formatter):
        from gpubench.core import safe

        rows = [(name, safe.term(p.help, 120)) for name, p in registry.plugins().items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="gpubench")
def cli():
    """gpubench: how fast data moves on GPU machines.

    Every measuring command prints a table and saves its result with --json PATH;
    compare, plot, report and suite work on saved results. Every command exits
    0 (ok), 1 (expectation failed), 2 (bad input or no GPU), 3 (machine fault),
    130/143 (interrupted; what was measured is kept).
    """


def _one_line(text: str) -> str:
    """``text`` made one inert line by :func:`gpubench.core.safe.term`."""
    from gpubench.core import safe

    return safe.term(text, 4000)


def _speaks_for_the_job() -> bool:
    """Whether this process prints an error that the command line alone caused (not ranks 1.. of a launcher)."""
    from gpubench.launch.ranks import speaks_for_the_job

    return speaks_for_the_job()


def _writing_stdout(e: BaseException) -> bool:
    """Whether ``e`` was raised where stdout was being written (the innermost frame holds ``sys.stdout``)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    held = tb.tb_frame.f_locals.values()
    return any(v is sys.stdout or getattr(v, "file", None) is sys.stdout for v in held)


def main(argv: list[str] | None = None, *, early: list[int] | None = None, held: tuple[int, ...] = ()) -> None:
    """Run the group and turn every error into one line: the process's run (``argv`` None) or one
    in this process (``argv`` given: the caller's signal handlers come back after it). ``early``:
    the signals :func:`gpubench.cli.main` noted before this point; ``held``: those it holds."""
    args = sys.argv[1:] if argv is None else argv
    INVOCATION[:] = [str(a) for a in args]
    DEBUG.clear()  # the parsed --debug of this run (an in-process run follows another)
    if sys.stdout is None:  # started with stdout closed (`>&-`): the report goes nowhere, as asked;
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        sys.stdout.gpubench_closed_at_start = True  # type: ignore[attr-defined]  # --json - is refused
    previous = signals.install(held)
    try:
        if early:  # noted while the command line was imported; raised here, as if it had landed now
            signals.note_signal(early[0])
            raise signals.signal_exception(early[0])
        rc = cli.main(args=args, prog_name="gpubench", standalone_mode=False)
        code = rc if isinstance(rc, int) else 0
    except click.exceptions.NoArgsIsHelpError as e:  # click >= 8.2
        click.echo(e.ctx.get_help())
        code = 0
    except click.UsageError as e:
        where = e.ctx.command_path if e.ctx else "gpubench"
        if _speaks_for_the_job():
            click.echo(f"{where}: error: {_one_line(e.format_message())}", err=True)
        code = 2
    except click.exceptions.Exit as e:
        code = e.exit_code
    except click.Abort:  # click's, on an EOF in a prompt
        click.echo(interrupted_line(signal.SIGINT), err=True)
        code = 130
    except SystemExit:  # click ends a broken pipe (EPIPE) with sys.exit(1), which would read as "regression"
        pacified = getattr(click.core, "_PacifyFlushWrapper", ())  # what click wraps the streams in then
        if not isinstance(sys.stdout, pacified) and not isinstance(sys.stderr, pacified):
            raise
        with contextlib.suppress(OSError, ValueError):  # stderr may be the pipe that broke
            click.echo("gpubench: error: could not write the report to standard output: "
                       f"{os.strerror(errno.EPIPE)}", err=True)
        code = 3
    except GpubenchError as e:
        if DEBUG:
            traceback.print_exc()
        if not getattr(e, "every_rank", False) or _speaks_for_the_job():
            click.echo(f"gpubench: error: {_one_line(e.one_line())}", err=True)
        code = e.exit_code
    except KeyboardInterrupt:  # a command's interrupt that kept nothing: one line (a run that kept what
        click.echo(interrupted_line(signal.SIGINT), err=True)  # it measured said so in kit.finish)
        code = 130
    except Interrupted as e:
        click.echo(interrupted_line(e.signum), err=True)
        code = 128 + e.signum
    except Exception as e:  # a bug or an unexpected library fault: one line unless --debug
        if DEBUG:
            traceback.print_exc()
        lost = getattr(sys.modules.get("gpubench.core.report"), "ReportLost", ())  # raised only once it is loaded
        if isinstance(e, lost) or isinstance(e, OSError) and _writing_stdout(e):  # a full disk, a broken pipe
            line = f"could not write the report to standard output: {e.strerror or e}"
        else:
            first = (str(e).strip().splitlines() or [""])[0]
            line = f"{type(e).__name__}: {_one_line(first)} (run with --debug for the traceback)"
        click.echo(f"gpubench: error: {line}", err=True)
        code = 3
    finally:
        signals.restore(None if argv is None else previous)  # in-process: the caller's handlers come back
    noted = signals.last_signal()
    if code == 0 and noted is not None:  # an interrupt swallowed on its way (a library's `except
        click.echo(interrupted_line(noted), err=True)  # BaseException`, a __del__): still the user's stop
        code = 128 + noted
    if argv is None:
        signals.exit_process(code)
    signals.clear_signals()  # in-process: a signal noted by this command is not the next one's
    sys.exit(code)

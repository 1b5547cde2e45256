"""The ``gpubench`` command line: a click group whose commands are imported only when they run.

Each command lives in ``gpubench.commands.<name>`` and defines ``command``. ``gpubench --help``
lists them from the table below without importing them (nor cupy, nor dask).

Exit codes: 0 success; 1 a failed expectation or regression; 2 a usage error (bad option, no GPU);
3 a machine or library fault; 130 / 143 interrupted by SIGINT / SIGTERM (what was measured is kept).
"""

from __future__ import annotations

import importlib
import signal
import sys
import traceback

import click

from gpubench import __version__
from gpubench.core.errors import (GpubenchError, Interrupted, clear_signals, defer_signal, in_critical_section,
                                   note_signal, signal_exception, signal_noted)

# name -> (module, one-line help). Order is the order of `gpubench --help`.
COMMANDS: dict[str, tuple[str, str]] = {
    "copy": ("gpubench.commands.copy", "Host<->device copy bandwidth: pinned vs pageable, H2D, D2H, bidir."),
    "env": ("gpubench.commands.env", "The machine: GPUs, driver, CUDA, PCIe, NVLink, topology, NUMA."),
    "p2p": ("gpubench.commands.p2p", "GPU<->GPU copy matrix: peer access on/off, read/write, bidir, SM copy, latency."),
    "nccl": ("gpubench.commands.nccl", "NCCL collectives (all-reduce, all-gather, ...): algbw and busbw as nccl-tests."),
    "merge": ("gpubench.commands.merge", "Dask(-CUDA) cuDF merge over tcp or ucx: dask-cuda's local_cudf_merge."),
    "net": ("gpubench.commands.net", "Multi-stream TCP throughput between two hosts (server, client, local)."),
    "batch": ("gpubench.commands.batch", "Many small copies vs packed vs cudaMemcpyBatchAsync vs one contiguous copy."),
    "memcpy2d": ("gpubench.commands.memcpy2d", "Pitched 2-D copies vs a row-by-row loop vs one contiguous copy vs CuPy slices."),
    "overlap": ("gpubench.commands.overlap", "Copy/compute overlap: H2D -> kernel -> D2H on one stream vs chunks on N streams."),
    "compare": ("gpubench.commands.compare", "Compare saved results: per-figure change and a noise-aware verdict."),
    "plot": ("gpubench.commands.plot", "PNG of saved results: bandwidth vs size, p2p heatmaps, merge pairs."),
    "suite": ("gpubench.commands.suite", "Node validation: env, copy, batch, p2p, nccl; expectations from TOML."),
}


class LazyGroup(click.Group):
    """A click Group that imports a command's module only when the command is run or its help shown
    (click docs, "Lazily Loading Subcommands")."""

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module = importlib.import_module(COMMANDS[name][0])
        return module.command

    def format_commands(self, ctx, formatter):
        rows = [(name, help_) for name, (_, help_) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="gpubench")
def cli():
    """gpubench: how fast data moves on GPU machines.

    Every command prints a table, saves its result with --json PATH, and exits
    0 (ok), 1 (expectation failed), 2 (bad input or no GPU), 3 (machine fault),
    130/143 (interrupted; what was measured is kept).
    """


_AGAIN = ("gpubench: already stopping: saving what was measured and closing what the run started "
          "(Ctrl-\\ quits at once and keeps nothing)")


def _on_signal(signum, frame):
    """SIGINT and SIGTERM: raise KeyboardInterrupt / Interrupted; inside a critical section, when it
    ends; a second signal while the first one's cleanup runs is noted and ignored, so the cleanup
    does not lose the result."""
    if signal_noted():
        note_signal(signum)
        print(_AGAIN, file=sys.stderr)
        return
    note_signal(signum)
    if in_critical_section():  # raised when the launches under way are all queued
        defer_signal(signum)
        return
    raise signal_exception(signum)


_sigint = _sigterm = _on_signal


def _one_line(text: str) -> str:
    """``text`` with control and other unprintable characters escaped (a newline or carriage return in
    a file name the user gave, say), so an error is always one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _unraisable(u) -> None:
    """An interrupt swallowed inside a __del__ or gc callback is noted (note_signal) and acted on
    by the sweep driver; do not print it as an "Exception ignored" traceback."""
    if isinstance(u.exc_value, (KeyboardInterrupt, Interrupted)):
        return
    sys.__unraisablehook__(u)


INVOCATION: list[str] = []  # this run's arguments, saved in each result's "argv"


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script: runs the group and turns every error into one line."""
    args = sys.argv[1:] if argv is None else argv
    INVOCATION[:] = [str(a) for a in args]
    debug = "--debug" in args
    clear_signals()
    sys.unraisablehook = _unraisable
    old = signal.signal(signal.SIGTERM, _sigterm)
    old_int = signal.getsignal(signal.SIGINT)
    if old_int is signal.default_int_handler:  # leave an ignored SIGINT (a background job) ignored
        signal.signal(signal.SIGINT, _sigint)
    try:
        rc = cli.main(args=args, prog_name="gpubench", standalone_mode=False)
        code = rc if isinstance(rc, int) else 0
    except click.exceptions.NoArgsIsHelpError as e:  # click >= 8.2
        click.echo(e.ctx.get_help())
        code = 0
    except click.UsageError as e:
        where = e.ctx.command_path if e.ctx else "gpubench"
        click.echo(f"{where}: error: {_one_line(e.format_message())}", err=True)
        code = 2
    except click.exceptions.Exit as e:
        code = e.exit_code
    except click.Abort:
        click.echo("gpubench: interrupted", err=True)
        code = 130
    except GpubenchError as e:
        if debug:
            traceback.print_exc()
        click.echo(f"gpubench: error: {_one_line(e.one_line())}", err=True)
        code = e.exit_code
    except KeyboardInterrupt:
        click.echo("gpubench: interrupted", err=True)
        code = 130
    except Interrupted as e:
        click.echo("gpubench: terminated", err=True)
        code = 128 + e.signum
    except Exception as e:  # a bug or an unexpected library fault: one line unless --debug
        if debug:
            traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0]
        click.echo(f"gpubench: error: {type(e).__name__}: {_one_line(first)} (run with --debug for the traceback)",
                   err=True)
        code = 3
    finally:
        if argv is None:
            # the process's own run: the exit code is decided and the result saved; a Ctrl-C during
            # interpreter teardown (Dask's atexit hooks) must not turn exit 3 into a KeyboardInterrupt
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        else:  # called in-process (tests): give the caller its handlers back
            signal.signal(signal.SIGTERM, old)
            signal.signal(signal.SIGINT, old_int)
    sys.exit(code)

"""The command line: the click group (:mod:`gpubench.cli.app`) and the commands that work on saved
results (compare, plot, report, suite). The only layer that turns errors into exit codes.

:func:`main` is the process's one entry point (the console script and ``python -m gpubench``). Its
first statements hold SIGINT and SIGTERM, so a signal at any moment after them ends with exit
130 / 143 and one line; for that this module imports nothing at import time but the C module
``_signal`` (the click group is loaded when first used, :func:`__getattr__`).
"""

import _signal  # the C module: the Python-level ``signal`` spends milliseconds building its enums
import sys

__all__ = ["cli", "main"]

#: A pipe's file descriptor that :func:`main` writes one byte to and closes once SIGINT and SIGTERM
#: are held (for a supervisor or a test); removed from the environment first.
STARTED_FD = "GPUBENCH_STARTED_FD"


def main(argv: list[str] | None = None) -> None:
    """Run the command line and end the process (``argv`` None: ``sys.argv``), or, with ``argv``,
    run it in this process (tests, an embedding program) with the caller's signal handlers kept.
    SIGINT (where not ignored) and SIGTERM (where default) are noted from the first statement on."""
    if argv is not None:
        from gpubench.cli.app import main as run_in_process

        run_in_process(argv)
        return
    early: list[int] = []

    def hold(signum, frame):
        early.append(signum)

    held = []
    if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:  # an ignored SIGINT stays ignored
        _signal.signal(_signal.SIGINT, hold)
        held.append(_signal.SIGINT)
    if _signal.getsignal(_signal.SIGTERM) == _signal.SIG_DFL:
        _signal.signal(_signal.SIGTERM, hold)
        held.append(_signal.SIGTERM)
    _say_started()
    try:
        from gpubench.cli.app import main as run

        run(early=early, held=tuple(held))
    except KeyboardInterrupt:
        _stopped(_signal.SIGINT)
    except BaseException as e:
        signals = sys.modules.get("gpubench.core.signals")
        if signals is None or not isinstance(e, signals.Interrupted):
            raise
        _stopped(e.signum)
    finally:
        # a Ctrl-C caught while exec'd code ran leaves CPython's "unhandled KeyboardInterrupt" flag
        # set (under -m the process would end by SIGINT); evaluating a string resets it
        # (pythonrun.c run_eval_code_obj)
        exec("pass")


def _say_started() -> None:
    """Write one byte to the pipe :data:`STARTED_FD` names, if any, and close it."""
    import os
    import stat

    value = os.environ.pop(STARTED_FD, None)
    if value is None or not value.isdigit() or int(value) <= 2:
        return
    fd = int(value)
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):  # never a byte into a file or a terminal
            os.write(fd, b"\n")
            os.close(fd)
    except OSError:
        pass


def _stopped(signum: int) -> None:
    """An interrupt the command line did not turn into its exit code: one line, exit 128 + ``signum``."""
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    _signal.signal(_signal.SIGTERM, _signal.SIG_IGN)
    from gpubench.cli.interrupt import interrupted_line

    try:
        sys.stderr.write(interrupted_line(signum) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # stderr closed or gone: nothing more can reach it
        pass
    signals = sys.modules.get("gpubench.core.signals")
    if signals is not None:
        signals.exit_process(128 + signum)
    sys.exit(128 + signum)


def __getattr__(name: str):
    """``gpubench.cli.cli``, the click group, imported when first asked for."""
    if name == "cli":
        from gpubench.cli.app import cli

        return cli
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

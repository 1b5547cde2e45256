"""One small error hierarchy; the CLI's top-level handler maps each to an exit code.

- :class:`UsageError` (exit 2): the user's mistake, e.g. a bad option value or no GPU visible.
- :class:`MachineError` (exit 3): a fault of the machine or of a library (CUDA, NCCL, Dask).
- :class:`RegressionFound` (exit 1): ``compare --fail-on-regression`` / ``suite`` found a failure.

Every error carries one line of message and an optional hint; neither contains a traceback.
"""

from __future__ import annotations

import threading

NO_GPU_COMMANDS = ("env", "compare", "plot", "net", "merge -t cpu", "suite --check")


class GpubenchError(Exception):
    """Base of gpubench's errors.

    Args:
        message: one line naming what is wrong (the bad value, the failing call).
        hint: optional one line saying what would be accepted or what to do.
    """

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        """The message and hint joined into the single line printed to stderr."""
        if self.hint:
            return f"{self.message} ({self.hint})"
        return self.message


class UsageError(GpubenchError):
    """A bad option value or a request this machine cannot serve; exit code 2."""

    exit_code = 2


def check_choices(name: str, got, allowed) -> None:
    """Check an option's list of choices (strategies, directions, tests...).

    Raises:
        UsageError: ``got`` is empty ("no NAME selected"), or holds a value not in ``allowed``; the
            line lists the accepted values.
    """
    hint = f"use {', '.join(allowed)}"
    if not got:
        raise UsageError(f"no {name} selected", hint)
    for x in got:
        if x not in allowed:
            raise UsageError(f"{name} {x!r} not known", hint)


class NoGPUError(UsageError):
    """No CUDA device is visible; exit code 2.

    Args:
        detail: what the CUDA runtime or CuPy said, kept short.
    """

    def __init__(self, detail: str = ""):
        msg = "no CUDA device is visible"
        if detail:
            msg += f" ({detail})"
        super().__init__(
            msg + f"; commands that work without a GPU: {', '.join(NO_GPU_COMMANDS)}"
        )


class MachineError(GpubenchError):
    """A fault of the machine or a library (CUDA, NCCL, Dask) during a run; exit code 3.

    Attributes:
        partial_result: what the run had measured before the fault (a Result with partial=True and
            failed_by set), for the command to print and save before exiting; None when nothing was.
    """

    exit_code = 3
    partial_result = None


class RegressionFound(GpubenchError):
    """A comparison or expectation failed; exit code 1."""

    exit_code = 1


class Interrupted(BaseException):
    """Raised by gpubench's SIGTERM handler so a run stops as on Ctrl-C; carries the signal number.

    A BaseException, like KeyboardInterrupt, so ``except Exception`` in measurement code lets it pass.
    """

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


# Signals received by this process (the CLI's handlers note them before raising). A
# KeyboardInterrupt raised while Python runs a __del__ or a gc callback (distributed installs
# one) is printed as "Exception ignored" and lost; the sweep driver asks here between points, so
# such a Ctrl-C still stops the run.
_pending_signals: list[int] = []


def note_signal(signum: int) -> None:
    """Remember that ``signum`` (SIGINT or SIGTERM) arrived."""
    _pending_signals.append(signum)


def signal_noted() -> bool:
    """True when a SIGINT or SIGTERM already arrived during this command."""
    return bool(_pending_signals)


def clear_signals() -> None:
    """Forget noted signals (at the start of a command)."""
    _pending_signals.clear()
    _deferred.clear()


def signal_exception(signum: int) -> BaseException:
    """The exception a signal stops a command with: KeyboardInterrupt for SIGINT, else Interrupted."""
    import signal as _signal

    return KeyboardInterrupt() if signum == _signal.SIGINT else Interrupted(signum)


def raise_if_signalled() -> None:
    """Raise KeyboardInterrupt (SIGINT) or Interrupted (SIGTERM) if a noted signal was swallowed."""
    if _pending_signals:
        raise signal_exception(_pending_signals[-1])


# Critical sections: launches that must all happen or none (every local rank's part of one NCCL
# iteration or CUDA-graph launch). A rank whose kernels were queued while its peer's were not waits
# for the peer for ever, so the CLI's handlers defer a signal that arrives inside one until it ends.
_critical = [0]  # depth of the main thread's open sections
_deferred: list[int] = []
_MAIN = threading.main_thread().ident


def in_critical_section() -> bool:
    """True inside ``with CRITICAL:``."""
    return _critical[0] > 0


def defer_signal(signum: int) -> None:
    """Raise ``signum``'s exception when the current critical section ends (called by the CLI's
    handlers; the signal must be noted with note_signal as well)."""
    _deferred.append(signum)


class _CriticalSection:
    """``with CRITICAL:`` - SIGINT/SIGTERM arriving inside are raised (KeyboardInterrupt,
    Interrupted) when the outermost section ends, not in the middle of it. Nests. Only the main
    thread's sections count: Python runs signal handlers there alone, so a section in another
    thread must not delay the main thread's Ctrl-C. A deferred signal is dropped (it stays noted,
    see note_signal) when the section ends with an exception of its own: that one propagates."""

    __slots__ = ()

    def __enter__(self):
        if threading.get_ident() == _MAIN:
            _critical[0] += 1

    def __exit__(self, et, ev, tb):
        if threading.get_ident() != _MAIN:
            return False
        _critical[0] -= 1
        if _critical[0] == 0 and _deferred:
            s = _deferred[-1]
            _deferred.clear()
            if et is None:
                raise signal_exception(s)
        return False


CRITICAL = _CriticalSection()

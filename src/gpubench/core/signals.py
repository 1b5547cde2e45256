"""Signals and critical sections: how SIGINT and SIGTERM stop a run without losing what it measured
(KeyboardInterrupt / :class:`Interrupted` in the main thread, deferred inside ``with CRITICAL:``;
a second signal during cleanup is noted and ignored; the command exits 130 / 143).
"""

from __future__ import annotations

import contextlib
import os
import signal as _signal
import sys
import threading


class Interrupted(BaseException):
    """Raised by gpubench's SIGTERM handler so a run stops as on Ctrl-C; carries the signal number.
    A BaseException, so ``except Exception`` in measurement code lets it pass."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


# Signals received (noted before raising), so a Ctrl-C lost in a __del__ still stops the run
_pending_signals: list[int] = []


def note_signal(signum: int) -> None:
    """Remember that ``signum`` (SIGINT or SIGTERM) arrived."""
    _pending_signals.append(signum)


def signal_noted() -> bool:
    """True when a SIGINT or SIGTERM already arrived during this command."""
    return bool(_pending_signals)


def last_signal() -> int | None:
    """The last SIGINT or SIGTERM noted during this command, or None."""
    return _pending_signals[-1] if _pending_signals else None


def clear_signals() -> None:
    """Forget noted signals and a finished result (at the start of a command)."""
    _pending_signals.clear()
    _deferred.clear()
    _complete.clear()


# Set once the command's complete result was shown and saved (kit.finish)
_complete: list[bool] = []


def note_complete() -> None:
    """Remember that this command's complete result was shown and saved."""
    _complete.append(True)


def result_complete() -> bool:
    """True once this command's complete result was shown and saved."""
    return bool(_complete)


def signal_exception(signum: int) -> BaseException:
    """The exception a signal stops a command with: KeyboardInterrupt for SIGINT, else Interrupted."""
    return KeyboardInterrupt() if signum == _signal.SIGINT else Interrupted(signum)


def raise_if_signalled() -> None:
    """Raise KeyboardInterrupt (SIGINT) or Interrupted (SIGTERM) if a noted signal was swallowed."""
    if _pending_signals:
        raise signal_exception(_pending_signals[-1])


# Critical sections (a rank whose kernels were queued while its peer's were not waits for ever)
_critical = [0]  # depth of the main thread's open sections
_deferred: list[int] = []
_MAIN = threading.main_thread().ident


class _CriticalSection:
    """``with CRITICAL:`` - SIGINT/SIGTERM arriving inside are raised when the outermost section of
    the main thread ends. A deferred signal is dropped (it stays noted) when the section ends with
    an exception of its own."""

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


_AGAIN = ("gpubench: already stopping: saving what was measured and closing what the run started "
          "(Ctrl-\\ quits at once and keeps nothing)")


def on_signal(signum, frame) -> None:
    """SIGINT and SIGTERM: raise KeyboardInterrupt / Interrupted; inside a critical section, when it
    ends; a second signal while the first one's cleanup runs is noted and ignored."""
    if signal_noted():
        note_signal(signum)
        from gpubench.core.report import err_line  # one write: every rank of a launcher may print it

        err_line(_AGAIN)
        return
    note_signal(signum)
    if _critical[0] > 0:  # inside ``with CRITICAL:``: raised when the launches under way are all queued
        _deferred.append(signum)
        return
    raise signal_exception(signum)


def _unraisable(u) -> None:
    """An interrupt swallowed inside a __del__ or gc callback is noted and acted on by the driver;
    do not print it as an "Exception ignored" traceback."""
    if isinstance(u.exc_value, (KeyboardInterrupt, Interrupted)):
        return
    sys.__unraisablehook__(u)


def install(held: tuple[int, ...] = ()) -> tuple:
    """Install the handlers for one command (an ignored SIGINT stays ignored; ``held``: signals the
    start-up guard holds, replaced as Python's default handler is); returns the previous (SIGTERM,
    SIGINT) handlers, for :func:`restore`."""
    clear_signals()
    sys.unraisablehook = _unraisable
    old = _signal.signal(_signal.SIGTERM, on_signal)
    old_int = _signal.getsignal(_signal.SIGINT)
    if old_int is _signal.default_int_handler or _signal.SIGINT in held:
        _signal.signal(_signal.SIGINT, on_signal)
    return old, old_int


def restore(previous: tuple | None) -> None:
    """After the command: give an in-process caller its handlers back (``previous`` from install),
    or (None) ignore both signals so interpreter teardown cannot change the decided exit code."""
    term, intr = (_signal.SIG_IGN, _signal.SIG_IGN) if previous is None else previous
    _signal.signal(_signal.SIGTERM, term)
    _signal.signal(_signal.SIGINT, intr)


#: Modules whose interpreter-exit finalizers can crash the process (NVIDIA-NeMo/Curator#2073,
#: apache/arrow#36346).
TEARDOWN_CRASHES = ("ucxx", "pyarrow._s3fs")


def exit_process(code: int) -> None:
    """End the command-line process with ``code``: ``sys.exit``, or, once a module of
    :data:`TEARDOWN_CRASHES` is loaded, flush the streams and logs and ``os._exit``."""
    if not any(m in sys.modules for m in TEARDOWN_CRASHES):
        sys.exit(code)
    import logging

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more can reach it
            stream.flush()
    logging.shutdown()
    os._exit(code)

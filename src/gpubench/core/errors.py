"""One small error hierarchy; the CLI's top-level handler maps each to an exit code.

- :class:`UsageError` (exit 2): the user's mistake, e.g. a bad option value or no GPU visible.
- :class:`MachineError` (exit 3): a fault of the machine or of a library (CUDA, NCCL, Dask).
- :class:`RegressionFound` (exit 1): ``compare --fail-on-regression`` / ``suite`` found a failure.

Every error carries one line of message and an optional hint; neither contains a traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

#: [True] once a command's ``--debug`` was parsed (:func:`note_debug`): the top-level handler then
#: prints tracebacks. The parsed flag, not a word of argv: ``--expect --debug`` names a file.
DEBUG: list[bool] = []


def note_debug(ctx: Any, param: Any, value: bool) -> bool:
    """``--debug``'s click callback (an eager option, parsed before the others): notes the flag in :data:`DEBUG`."""
    if value:
        DEBUG[:] = [True]
    return value


class GpubenchError(Exception):
    """Base of gpubench's errors: one line naming what is wrong, and an optional one-line hint."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        """The message and hint joined into the single line printed to stderr."""
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageError(GpubenchError):
    """A bad option value or a request this machine cannot serve; exit code 2. ``every_rank``: it
    comes from the command line alone, so only rank 0 prints it."""

    exit_code = 2
    every_rank = False


@contextlib.contextmanager
def from_the_command_line() -> Iterator[None]:
    """Mark a UsageError raised inside ``every_rank``: it comes from the command line alone, not
    from this machine, so every rank of a launcher raises it alike and rank 0 alone says it."""
    try:
        yield
    except UsageError as e:
        e.every_rank = True
        raise


def check_choices(name: str, got, allowed) -> None:
    """Check an option's list of choices. Raises UsageError: ``got`` is empty, or holds a value not in ``allowed``."""
    hint = f"use {', '.join(allowed)}"
    if not got:
        raise UsageError(f"no {name} selected", hint)
    for x in got:
        if x not in allowed:
            raise UsageError(f"{name} {x!r} not known", hint)


class NoGPUError(UsageError):
    """No CUDA device is visible (``detail``: what the CUDA runtime or CuPy said); exit code 2."""

    def __init__(self, detail: str = ""):
        from gpubench.core.registry import no_gpu_commands

        msg = "no CUDA device is visible" + (f" ({detail})" if detail else "")
        super().__init__(msg + f"; commands that work without a GPU: {', '.join(no_gpu_commands())}")


class MachineError(GpubenchError):
    """A fault of the machine or a library (CUDA, NCCL, Dask) during a run; exit code 3.

    Attributes:
        partial_result: what the run had measured before the fault, for the command to print and
            save before exiting; None when nothing was.
        point_records: records of the point being measured that were complete at the fault.
    """

    exit_code = 3
    partial_result: Any = None  # a gpubench.core.result.Result, set by the driver
    point_records: Any = ()  # a list of gpubench.core.result.Record, set by a plug-in


class RegressionFound(GpubenchError):
    """A comparison or expectation failed; exit code 1 (GpubenchError's)."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's text, or its type name where the text is empty."""
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__

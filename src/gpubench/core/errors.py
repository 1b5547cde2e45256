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
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageError(GpubenchError):
    """A bad option value or a request this machine cannot serve; exit code 2.

    ``every_rank`` is set where the error comes from the command line alone (its options, read
    the same way by every rank of a launcher), so only rank 0 prints it."""

    exit_code = 2
    every_rank = False


@contextlib.contextmanager
def from_the_command_line() -> Iterator[None]:
    """A UsageError raised inside comes from the command line alone (an option's text, its
    declared bound, a name's form), not from this machine: every rank of a launcher raises it
    alike, so it is marked ``every_rank`` and rank 0 alone says it. What depends on the machine
    (its GPUs, NUMA nodes, folders, addresses) stays outside, said by the rank that lacks it."""
    try:
        yield
    except UsageError as e:
        e.every_rank = True
        raise


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
        from gpubench.core.registry import no_gpu_commands

        msg = "no CUDA device is visible" + (f" ({detail})" if detail else "")
        super().__init__(msg + f"; commands that work without a GPU: {', '.join(no_gpu_commands())}")


class MachineError(GpubenchError):
    """A fault of the machine or a library (CUDA, NCCL, Dask) during a run; exit code 3.

    Attributes:
        partial_result: what the run had measured before the fault (a Result with partial=True and
            failed_by set), for the command to print and save before exiting; None when nothing was.
        point_records: records of the point being measured that were complete when the fault was
            found (a plug-in sets it, e.g. net's last interval before a missing end line); the
            driver keeps them with the finished points.
    """

    exit_code = 3
    partial_result: Any = None  # a gpubench.core.result.Result, set by the driver
    point_records: Any = ()  # a list of gpubench.core.result.Record, set by a plug-in


class RegressionFound(GpubenchError):
    """A comparison or expectation failed; exit code 1 (GpubenchError's)."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's text (CUDA errors carry the code and its description), or its
    type name where the text is empty: the one way an error from a library becomes a line of a
    gpubench message."""
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__

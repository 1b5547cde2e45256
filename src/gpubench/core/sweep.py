"""The driver loop over a benchmark's groups of points: progress, per-point allocation failures,
and interruption (SIGINT / SIGTERM) that keeps what was measured.
"""

from __future__ import annotations

import signal
from typing import Callable, Iterable, Sequence, TypeVar

from gpubench.core.signals import Interrupted, raise_if_signalled
from gpubench.core.gpu import is_oom
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record

G = TypeVar("G")


def run_groups(
    groups: Sequence[G],
    measure: Callable[[G], Iterable[Record]],
    on_alloc_error: Callable[[G, BaseException], Iterable[Record]],
    progress: ProgressSink,
    label: Callable[[G], str] = str,
) -> tuple[list[Record], str | None]:
    """Measure each group in turn.

    Args:
        groups: units of work (e.g. one size and memory kind) in order.
        measure: returns the records of one group; may raise.
        on_alloc_error: records to keep when a group's allocation fails (device or pinned host
            memory); the sweep then goes on with the next group.
        progress: advanced once per group.
        label: text shown in the progress bar.

    Returns:
        (records, interrupted_by): interrupted_by is "SIGINT" or "SIGTERM" when the run was
        interrupted (records then hold what was measured before), else None.

    Raises:
        Whatever ``measure`` raises that is not an allocation failure.
    """
    records: list[Record] = []
    progress.start(len(groups), label(groups[0]) if groups else "")
    try:
        for g in groups:
            raise_if_signalled()
            progress.advance(label(g))
            try:
                records.extend(measure(g))
            except (KeyboardInterrupt, Interrupted):
                raise
            except Exception as e:
                if not is_oom(e):
                    raise
                records.extend(on_alloc_error(g, e))
        raise_if_signalled()
    except KeyboardInterrupt:
        return records, "SIGINT"
    except Interrupted as e:
        return records, signal.Signals(e.signum).name
    finally:
        progress.done()
    return records, None

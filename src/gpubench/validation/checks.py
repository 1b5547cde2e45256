"""What a plug-in's ``fleet_checks`` hook builds its rows from: one figure of one node, named and in
its unit, which the fleet compares across nodes (:func:`gpubench.validation.fleet.checks_of`)."""

from __future__ import annotations

import statistics
from typing import Any, Callable, Iterable


def median_rate_gbps(rec) -> float | None:
    """The median of a record's rates nbytes / seconds in GB/s (1e9 B/s); None without bytes."""
    rates = [rec.nbytes / t for t in rec.samples_s if t > 0] if rec.nbytes > 0 else []
    return statistics.median(rates) / 1e9 if rates else None


def size_text(n: int) -> str:
    """A size as the check names show it ("1GiB")."""
    from gpubench.core.units import format_size

    return format_size(n).replace(" ", "")


def largest(records: Iterable, key: Callable) -> dict:
    """The bandwidth record of the largest ``nbytes`` per ``key(record)`` (None: left out)."""
    best: dict = {}
    for r in records:
        if r.error is not None or r.metric != "bandwidth" or (k := key(r)) is None:
            continue
        if k not in best or r.params.get("nbytes", 0) > best[k].params.get("nbytes", 0):
            best[k] = r
    return best


def row(check: str, command: str, rec, value: float | None, unit: str = "GB/s", gpu: Any = None) -> dict:
    """One check: name, command, the record's params, GPU (CUDA index or None), value and unit (GB/s, Gbit/s)."""
    return {"check": check, "gpu": gpu, "value": value, "unit": unit, "command": command, "params": dict(rec.params)}

"""merge's statistics, after dask-cuda 26.10's ``benchmarks/utils.py``: ``hmean`` / ``hstd``, the per
worker-pair bandwidths of the incoming-transfer logs and the worker numbering. On plain lists and
dicts; bandwidths in B/s, sizes in bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from gpubench.core.stats import _percentile


def hmean(xs: Sequence[float]) -> float:
    """Harmonic mean, 1 / mean(1/x); 0 (an int, so it prints "0 B/s" as in dask-cuda) for no values."""
    if not len(xs):
        return 0
    return 1.0 / (math.fsum(1.0 / x for x in xs) / len(xs))


def hstd(xs: Sequence[float]) -> float:
    """dask-cuda's "harmonic standard deviation": sqrt(var(1/x) / (n * mean(1/x)**4)), with the
    population variance (numpy's var, ddof=0); 0 for no values."""
    n = len(xs)
    if not n:
        return 0
    inv = [1.0 / x for x in xs]
    rmean = math.fsum(inv) / n
    rvar = math.fsum((v - rmean) ** 2 for v in inv) / n
    return math.sqrt(rvar / (n * rmean**4))


@dataclass(frozen=True)
class PairStats:
    """Transfers worker w1 received from w2, as dask-cuda's BandwidthStats: bandwidths in B/s."""

    w1: int
    w2: int
    n: int
    hmean: float
    hstd: float
    q25: float
    q50: float
    q75: float
    min: float
    max: float
    total_bytes: int


def pair_statistics(logs: Mapping[str, Iterable[Mapping[str, Any]]], address_to_index: Mapping[str, int],
                    ignore_size: int | None) -> list[PairStats]:
    """Per worker-pair bandwidth statistics from the workers' incoming-transfer logs (receiver's
    address -> entries with "who", "total" bytes, "bandwidth" B/s); entries under ``ignore_size``
    bytes left out. One PairStats per (receiver, sender), sorted; quantiles as numpy's linear rule.
    """
    out: list[PairStats] = []
    for receiver, entries in logs.items():
        if receiver not in address_to_index:
            continue
        by_sender: dict[str, list] = {}
        for e in entries:
            if ignore_size is None or e["total"] >= ignore_size:
                by_sender.setdefault(e["who"], []).append(e)
        for sender, es in by_sender.items():
            if sender not in address_to_index:
                continue
            s = sorted(float(e["bandwidth"]) for e in es)
            out.append(PairStats(
                w1=address_to_index[receiver], w2=address_to_index[sender], n=len(s),
                hmean=hmean(s), hstd=hstd(s),
                q25=_percentile(s, 25), q50=_percentile(s, 50), q75=_percentile(s, 75),
                min=s[0], max=s[-1], total_bytes=sum(int(e["total"]) for e in es),
            ))
    return sorted(out, key=lambda p: (p.w1, p.w2))


def address_to_index(devices: Mapping[str, int]) -> dict[str, int]:
    """Worker address -> index, by host, then by device (-1: none) within it (dask-cuda's address_to_index)."""
    order = sorted(devices, key=lambda a: (_address_host(a), devices[a]))
    return {a: i for i, a in enumerate(order)}


def _address_host(address: str) -> str:
    """'tcp://10.0.0.1:1234' -> '10.0.0.1'; '[::1]' forms keep their brackets' content."""
    rest = address.split("://", 1)[-1]
    if rest.startswith("["):
        return rest[1:].split("]", 1)[0]
    return rest.rsplit(":", 1)[0]

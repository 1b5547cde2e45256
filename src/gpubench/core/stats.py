"""Statistics of samples: one :class:`Summary` type used by every benchmark and by compare.

Percentiles use linear interpolation between order statistics (numpy's default, "linear", which is
Hyndman & Fan definition 7). The standard deviation is the sample one (ddof=1); with one sample it is 0.
cv is stdev / mean (the coefficient of variation), 0 when the mean is 0.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence


def _percentile(sorted_x: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile of an ascending sequence, q in [0, 100] (numpy 'linear')."""
    n = len(sorted_x)
    if n == 1:
        return float(sorted_x[0])
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return float(sorted_x[lo] + (sorted_x[hi] - sorted_x[lo]) * frac)


@dataclass(frozen=True)
class Summary:
    """Summary of n samples (any unit; the caller knows which: seconds or GB/s).

    Attributes:
        n: number of samples.
        median, mean, min, max, p25, p75: in the samples' unit.
        stdev: sample standard deviation (ddof=1), 0 for n == 1.
        cv: stdev / mean, 0 when the mean is 0.
    """

    n: int
    median: float
    mean: float
    min: float
    max: float
    p25: float
    p75: float
    stdev: float
    cv: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> "Summary":
        """Summarise samples.

        Raises:
            ValueError: no samples, or a sample that is NaN or infinite.
        """
        xs = sorted(float(x) for x in samples)
        if not xs:
            raise ValueError("no samples to summarise")
        if any(not math.isfinite(x) for x in xs):
            raise ValueError("samples must be finite")
        n = len(xs)
        mean = math.fsum(xs) / n
        stdev = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
        return cls(
            n=n,
            median=_percentile(xs, 50),
            mean=mean,
            min=xs[0],
            max=xs[-1],
            p25=_percentile(xs, 25),
            p75=_percentile(xs, 75),
            stdev=stdev,
            cv=stdev / mean if mean else 0.0,
        )

    def to_dict(self) -> dict:
        """The summary as a plain dict for JSON."""
        return asdict(self)


def rates(nbytes: float, seconds: Sequence[float]) -> list[float]:
    """Bandwidth of each sample in bytes per second: nbytes / seconds.

    Args:
        nbytes: bytes moved in one sample.
        seconds: per-sample times in seconds, each > 0.

    Raises:
        ValueError: a time that is zero or negative.
    """
    out = []
    for t in seconds:
        if t <= 0:
            raise ValueError(f"non-positive time sample {t!r}")
        out.append(nbytes / t)
    return out

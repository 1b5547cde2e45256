"""Statistics of samples: one :class:`Summary` type used by every benchmark and by compare.

Percentiles use linear interpolation between order statistics (numpy's default, "linear", which is
Hyndman & Fan definition 7). The standard deviation is the sample one (ddof=1); with one sample it is 0.
cv is stdev / mean (the coefficient of variation), 0 when the mean is 0.
"""

from __future__ import annotations

import functools
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
    """Summary of n samples, in the samples' unit (seconds or B/s; module docstring for stdev, cv)."""

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
        """Summarise samples. Raises ValueError: no samples, or a sample that is NaN or infinite."""
        xs = sorted(float(x) for x in samples)
        if not xs:
            raise ValueError("no samples to summarise")
        if any(not math.isfinite(x) for x in xs):
            raise ValueError("samples must be finite")
        n = len(xs)
        mean = math.fsum(xs) / n
        stdev = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
        return cls(n=n, median=_percentile(xs, 50), mean=mean, min=xs[0], max=xs[-1], p25=_percentile(xs, 25),
                   p75=_percentile(xs, 75), stdev=stdev, cv=stdev / mean if mean else 0.0)

    def to_dict(self) -> dict:
        """The summary as a plain dict for JSON."""
        return asdict(self)


def rates(nbytes: float, seconds: Sequence[float]) -> list[float]:
    """Bandwidth of each sample in bytes per second: nbytes / seconds. Raises ValueError: a time that is zero or
    negative."""
    if not (seconds and min(seconds) > 0):  # the common case passes in one pass at C speed
        for t in seconds:
            if t <= 0:
                raise ValueError(f"non-positive time sample {t!r}")
    return [nbytes / t for t in seconds]


MEDIAN_CONFIDENCE = 0.95  # coverage of the interval whose half-width is the "noise" of a median
_EXACT_CI_MAX_N = 400  # exact binomial ranks up to this many samples, the normal approximation beyond


def _z(confidence: float) -> float:
    """Two-sided standard normal quantile z with P(|Z| <= z) = confidence (bisection on erf)."""
    lo, hi = 0.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if math.erf(mid / math.sqrt(2.0)) < confidence:
            lo = mid
        else:
            hi = mid
    return hi


@functools.lru_cache(maxsize=None)
def median_ci_rank(n: int, confidence: float = MEDIAN_CONFIDENCE) -> int:
    """The rank k of the lower order statistic of the distribution-free confidence interval of the
    median: [x_(k), x_(n+1-k)] (1-based) covers the population median with probability
    1 - 2 P(B <= k - 1) >= ``confidence``, B ~ Binomial(n, 1/2); k the largest such rank, 0 when none
    exists (n <= 5 at 95%). Exact for n <= 400, beyond k = floor((n + 1)/2 - z sqrt(n)/2).

    Source: W. J. Conover, "Practical Nonparametric Statistics", 3rd ed. (1999), section 3.2; M.
    Hollander and D. A. Wolfe, "Nonparametric Statistical Methods", 2nd ed. (1999), section 3.6.

    Raises:
        ValueError: n < 0 or a confidence outside (0, 1).
    """
    if n < 0 or not (0.0 < confidence < 1.0):
        raise ValueError(f"median_ci_rank needs n >= 0 and confidence in (0, 1), got {n}, {confidence}")
    tail = (1.0 - confidence) / 2.0
    if n <= _EXACT_CI_MAX_N:
        # largest k with sum_{i < k} C(n, i) <= tail * 2^n, in exact integers
        limit = tail * (2 ** n)
        k, acc, c = 0, 0, 1
        for i in range(0, n // 2 + 1):
            if acc + c > limit:
                break
            acc += c
            k = i + 1
            c = c * (n - i) // (i + 1)
    else:
        k = max(0, int(math.floor((n + 1) / 2.0 - _z(confidence) * math.sqrt(n) / 2.0)))
    return k


def median_noise(sorted_x: Sequence[float], confidence: float = MEDIAN_CONFIDENCE) -> float | None:
    """The *noise* of the median of ascending samples: the half-width of the median's
    distribution-free confidence interval (:func:`median_ci_rank`) relative to the median,
    ``(x_(n+1-k) - x_(k)) / 2 / median``, a fraction (0.005 = 0.5%); None when no interval of that
    coverage exists or the median is 0."""
    n = len(sorted_x)
    k = median_ci_rank(n, confidence)
    if k == 0:
        return None
    med = _percentile(sorted_x, 50)
    if med == 0:
        return None
    return abs(float(sorted_x[n - k]) - float(sorted_x[k - 1])) / 2.0 / abs(med)

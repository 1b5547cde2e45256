"""Compare saved results figure by figure (equal ``params``): the change with its interval
(:func:`hodges_lehmann`), the test (:func:`mann_whitney_u`), the verdict (:func:`judge`), and what
differs (machine, options, telemetry, limit flags). Values: B/s per sample for "bandwidth" (higher
is better), seconds for "time" (lower is better). docs/compare.md explains every figure.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Sequence, cast

from gpubench.core import registry, safe
from gpubench.core.errors import UsageError
from gpubench.core.plugin import Plugin
from gpubench.core.result import Record, Result
from gpubench.core.stats import _z

DEFAULT_ALPHA = 0.01
DEFAULT_THRESHOLD_PCT = 1.0
HIGHER_IS_BETTER = {"bandwidth": True, "time": False}
SAME, FASTER, SLOWER, INCONCLUSIVE = "same", "faster", "slower", "inconclusive"
UNDECIDABLE = "undecidable"  # beyond the threshold, and these sample sizes cannot reach p < alpha
VERDICTS = (SAME, FASTER, SLOWER, INCONCLUSIVE, UNDECIDABLE)


@dataclass(frozen=True)
class MWU:
    """Outcome of a Mann-Whitney U test: U of the first sample (ties count 1/2), its normal score
    z (tie and continuity corrected), the two-sided p, the method ("exact", "exact (ties)",
    "asymptotic") and p_min, the smallest p these sample sizes can give."""

    u: float
    z: float
    p: float
    method: str = "asymptotic"
    p_min: float = 0.0


EXACT_MAX = 8  # scipy.stats.mannwhitneyu(method="auto"): exact when a sample has <= 8 values and no ties


def _u_counts(n1: int, n2: int, k: int | None = None) -> Any:
    """Number of orderings of n1 + n2 distinct values giving each U = 0 .. k (default n1 n2), the
    exact null distribution of U, as a numpy array; O(min(n1, n2) k) time, O(k) memory.

    The counts are the coefficients of the Gaussian binomial coefficient
    [m + n choose m]_q = prod_{i=1..m} (1 - q^(n+i)) / (1 - q^i), m = min(n1, n2), n = max(n1, n2)
    (G. E. Andrews, "The Theory of Partitions" (1976), theorem 3.1), built factor by factor and
    truncated at degree k. Exact integers (int64) while C(n1 + n2, n1) < 2^62, else float64.
    """
    import numpy as np

    m, n = min(n1, n2), max(n1, n2)
    k = m * n if k is None else min(k, m * n)
    exact = math.comb(m + n, m) < 2**62
    c: Any = np.zeros(k + 1, dtype=np.int64 if exact else np.float64)
    c[0] = 1
    for i in range(1, m + 1):
        if i > 1:  # / (1 - q^i): c[u] += c[u - i] for u ascending
            rows = -(-(k + 1) // i)
            buf = np.zeros(rows * i, dtype=c.dtype)
            buf[: k + 1] = c
            c = np.cumsum(buf.reshape(rows, i), axis=0).reshape(-1)[: k + 1]
        else:
            c = np.cumsum(c)
        s = n + i
        if s <= k:  # * (1 - q^(n+i)): c[u] -= c[u - n - i], from the values before this step
            c[s:] -= c[: k + 1 - s].copy()
    return c


@functools.lru_cache(maxsize=1024)
def _u_at_most(n1: int, n2: int, k: int) -> int | float:
    """Number of orderings of n1 + n2 distinct values with U <= k (:func:`_u_counts`)."""
    return _u_counts(n1, n2, k).sum().item()


def _exact_p(u1: float, n1: int, n2: int) -> float:
    """Two-sided exact p: 2 * P(U <= min(u1, n1 n2 - u1)), capped at 1."""
    k = int(math.floor(min(u1, n1 * n2 - u1) + 1e-9))
    return min(1.0, 2.0 * _u_at_most(n1, n2, k) / math.comb(n1 + n2, n1))


EXACT_TIES_MAX_SPLITS = 50_000  # with ties: the exact permutation distribution while C(n1+n2, n1) <= this
EXACT_TIES_MAX_CELLS = 4_000_000  # ... and its dynamic programme (:func:`_exact_ties_ok`) fills at most this many


def _exact_ties_ok(n: int, n1: int) -> bool:
    """Whether the exact permutation distribution with ties is used for ``n1`` of ``n`` pooled values."""
    j = min(n1, n - n1)
    return n * (j + 1) * (2 * n * j + 1) <= EXACT_TIES_MAX_CELLS and math.comb(n, n1) <= EXACT_TIES_MAX_SPLITS


@functools.lru_cache(maxsize=4096)
def _tie_deviations(n1: int, groups: tuple[int, ...]) -> tuple[tuple[float, ...], tuple[int, ...], int]:
    """For a tie pattern (the tie groups' sizes in rank order): the distinct |U - n1 n2 / 2| values the
    splits of the pooled values reach, ascending, the number of splits at or beyond each, and the number
    of splits; from the permutation distribution of the rank sum given the ties, by dynamic programming
    over the values' doubled midranks (counted on the smaller side)."""
    import numpy as np

    ranks: list[int] = []  # ascending doubled midranks: (start + 1 + start + g) / 2, doubled
    for start, g in zip(itertools.accumulate(groups, initial=0), groups):
        ranks += [2 * start + g + 1] * g
    n2 = len(ranks) - n1
    j = min(n1, n2)
    total = sum(ranks[len(ranks) - j:]) if j else 0
    dp = np.zeros((j + 1, total + 1), dtype=np.int64)
    dp[0, 0] = 1
    for r in ranks:
        # take value with doubled rank r: ways(i, t) += ways(i - 1, t - r), i descending
        if r <= total:
            dp[1:, r:] += dp[:-1, : total + 1 - r].copy()
    mu = n1 * n2 / 2.0
    base = j * (j + 1) / 2.0
    by_dev: dict[float, int] = {}
    for t, c in enumerate(dp[j].tolist()):
        if c:
            d = abs(t / 2.0 - base - mu)
            by_dev[d] = by_dev.get(d, 0) + c
    devs = sorted(by_dev)
    beyond = list(itertools.accumulate(by_dev[d] for d in reversed(devs)))[::-1]
    return tuple(devs), tuple(beyond), beyond[0] if beyond else 0


def min_p(n1: int, n2: int) -> float:
    """The smallest two-sided p of the test for these sizes (complete separation, no ties)."""
    if n1 == 0 or n2 == 0:
        return 1.0
    if min(n1, n2) <= EXACT_MAX:
        return min(1.0, 2.0 / math.comb(n1 + n2, n1))
    n = n1 + n2
    sigma = math.sqrt(n1 * n2 / 12.0 * (n + 1))
    return min(1.0, math.erfc(max(n1 * n2 / 2.0 - 0.5, 0.0) / sigma / math.sqrt(2.0)))


SAMPLES_SEARCH_MAX = 100_000  # samples_needed looks no further for the other side's size


@functools.lru_cache(maxsize=1024)
def samples_needed(m: int, n: int, alpha: float) -> tuple[int, int | None]:
    """The sample sizes that can reach p < ``alpha`` (:func:`min_p`): (k, n2), k the smallest size
    of both sides, n2 (>= ``n``) the smallest new side beside the base's ``m`` (None: none up to
    SAMPLES_SEARCH_MAX). E.g. alpha 0.01: 5 vs 5, or 3 vs 9."""
    k = 1
    while min_p(k, k) >= alpha:
        k += 1
    lo, hi = max(n, 1), SAMPLES_SEARCH_MAX
    if m < 1 or min_p(m, hi) >= alpha:
        return k, None
    while lo < hi:  # min_p(m, .) falls as the other side grows
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if min_p(m, mid) >= alpha else (lo, mid)
    return k, lo


def _ranks(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """Average (mid)ranks, 1-based, of ``values`` and the sizes of the tie groups, in rank order."""
    import numpy as np

    r, sizes = _midranks(np.asarray(values, dtype=float)[None, :])
    return r[0].tolist(), [s for s in sizes[0].tolist() if s]


def _midranks(P):
    """Midranks (1-based) along each row of the G x N numpy array ``P``, and the size of each tie
    group at the sorted position where it starts (0 at the others), in rank order."""
    import numpy as np

    G, N = P.shape
    order = np.argsort(P, axis=1, kind="stable")
    S = np.take_along_axis(P, order, axis=1)
    pos = np.broadcast_to(np.arange(N), (G, N))
    start = np.ones((G, N), dtype=bool)
    start[:, 1:] = S[:, 1:] != S[:, :-1]
    end = np.ones((G, N), dtype=bool)
    end[:, :-1] = start[:, 1:]
    first = np.maximum.accumulate(np.where(start, pos, 0), axis=1)
    last = np.flip(np.minimum.accumulate(np.flip(np.where(end, pos, N), axis=1), axis=1), axis=1)
    R = np.empty((G, N))
    np.put_along_axis(R, order, (first + last) / 2.0 + 1.0, axis=1)
    return R, np.where(start, last - first + 1, 0)


def mann_whitney_u(x: Sequence[float], y: Sequence[float]) -> MWU:
    """Two-sided Mann-Whitney U test of ``x`` against ``y``: exact without ties and a sample of at
    most EXACT_MAX values (:func:`_exact_p`); with ties, where :func:`_exact_ties_ok`, exact given
    the ties (:func:`_tie_deviations`); else the normal approximation with tie and continuity
    corrections (docs/compare.md gives the formulas); every value tied: z = 0, p = 1.

    Sources: Mann and Whitney, Ann. Math. Statist. 18 (1947) 50-60; the tie-corrected variance from
    E. L. Lehmann, "Nonparametrics" (1975), eq. (1.35); as ``scipy.stats.mannwhitneyu`` with
    ``method="asymptotic"`` and, for the exact branch, ``method="exact"``.

    Raises:
        ValueError: an empty sample.
    """
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("Mann-Whitney U needs two non-empty samples")
    allv = [float(v) for v in x] + [float(v) for v in y]
    n = n1 + n2
    ranks, groups = _ranks(allv)
    u1 = math.fsum(ranks[:n1]) - n1 * (n1 + 1) / 2.0
    tie_term = float(sum(t ** 3 - t for t in groups))
    var = n1 * n2 / 12.0 * ((n + 1) - (tie_term / (n * (n - 1)) if n > 1 else 0.0))
    return _mwu(u1, var, n1, n2, min_p(n1, n2), len(groups) < n, groups)


def _mwu(u1: float, var: float, n1: int, n2: int, pmin: float, ties: bool, groups: Sequence[float]) -> MWU:
    """The test of :func:`mann_whitney_u` from U1, its tie-corrected variance and the tie-group sizes."""
    if var <= 0:
        return MWU(u1, 0.0, 1.0, "asymptotic", pmin)
    mu = n1 * n2 / 2.0
    z = math.copysign(max(abs(u1 - mu) - 0.5, 0.0) / math.sqrt(var), u1 - mu)
    if not ties and min(n1, n2) <= EXACT_MAX:
        return MWU(u1, z, _exact_p(u1, n1, n2), "exact", pmin)
    if ties and _exact_ties_ok(n1 + n2, n1):  # the share of the splits whose U is at least as far from mu as u1
        devs, beyond, total = _tie_deviations(n1, tuple(int(g) for g in groups if g))
        i = bisect.bisect_left(devs, abs(u1 - mu) - 1e-9)
        return MWU(u1, z, min(1.0, (beyond[i] if i < len(devs) else 0) / total), "exact (ties)", pmin)
    return MWU(u1, z, min(1.0, math.erfc(abs(z) / math.sqrt(2.0))), "asymptotic", pmin)


# ---- the change and its confidence interval: Hodges-Lehmann with the Moses interval ----

EXACT_CI_MAX_PAIRS = 400  # the Moses rank from the exact null distribution of U up to m n pairs
BRUTE_MAX_PAIRS = 40_000  # pairwise differences listed and sorted up to this many; selected beyond


@functools.lru_cache(maxsize=4096)
def moses_rank(m: int, n: int, alpha: float) -> int:
    """C_alpha of the Moses interval: the largest C with P(U <= C - 1) <= alpha / 2 under the null,
    so that [D_(C), D_(mn + 1 - C)] of the mn ordered pairwise differences covers the shift with
    probability >= 1 - alpha. Exact for m n <= EXACT_CI_MAX_PAIRS; beyond,
    C = floor(mn/2 - z_(alpha/2) sqrt(mn (m + n + 1) / 12)) (Hollander & Wolfe 1999, section 4.3).
    0: no interval at that level exists (3 against 3 at 99%).
    """
    if m * n <= EXACT_CI_MAX_PAIRS:
        cum = _u_counts(m, n).cumsum().tolist()  # orderings with U <= u, u = 0 .. mn
        c = next((u for u, acc in enumerate(cum) if 2 * acc > alpha * cum[-1]), len(cum))
        return min(c, (m * n) // 2)
    c = math.floor(m * n / 2.0 - _z(1.0 - alpha) * math.sqrt(m * n * (m + n + 1) / 12.0))
    return max(0, min(c, (m * n) // 2))


SELECT_MAX_CANDIDATES = 1 << 16  # pairs listed at once by the selection (at least m + n)


def _kth_differences(lx: list[float], ly: list[float], ks: Sequence[int]) -> list[float]:
    """The k-th smallest (1-based) of the m n differences ly_j - lx_i, for each k in ``ks``.

    Up to BRUTE_MAX_PAIRS pairs: listed and sorted. Beyond, per k, a bisection on the value t
    (counting the differences <= t with searchsorted) narrows (lo, hi] to at most
    max(m + n, SELECT_MAX_CANDIDATES) pairs, which are listed and selected (np.partition): O(m + n)
    memory. (Monahan's selection, ACM TOMS 10 (1984) 265-270, narrows by rank instead.)"""
    m, n = len(lx), len(ly)
    if m * n <= BRUTE_MAX_PAIRS:
        d = [b - a for b in ly for a in lx]
        d.sort()
        return [d[k - 1] for k in ks]
    import numpy as np

    ax = np.sort(np.asarray(lx, dtype=float))
    ay = np.sort(np.asarray(ly, dtype=float))
    cap = max(m + n, SELECT_MAX_CANDIDATES)

    def count_le(t: float) -> int:
        return int(m * n - np.searchsorted(ax, ay - t, side="left").sum())

    def spread(lo: float, hi: float) -> tuple[float, float]:
        # the smallest and the largest difference in (lo, hi]
        start = np.searchsorted(ax, ay - hi, side="left")
        stop = np.searchsorted(ax, ay - lo, side="left")
        ok = stop > start
        return float((ay[ok] - ax[stop[ok] - 1]).min()), float((ay[ok] - ax[start[ok]]).max())

    d_lo, d_hi = float(ay[0] - ax[-1]), float(ay[-1] - ax[0])
    counted = {d_lo - 1e-12 * (1.0 + abs(d_lo)): 0, d_hi + 1e-12 * (1.0 + abs(d_hi)): m * n}  # t -> count(t)
    out = []
    for k in ks:
        lo = max(t for t, c in counted.items() if c < k)
        hi = min(t for t, c in counted.items() if c >= k)
        same: float | None = None
        span: tuple[float, float] | None = None
        for _ in range(2200):  # bounded: a double halves at most ~2100 times
            if counted[hi] - counted[lo] <= cap:
                break
            mid = lo + (hi - lo) / 2.0
            if span is not None:
                # the last step split nothing: halve the differences left, not the empty gap
                if span[0] == span[1]:  # one difference repeated more than cap times: the k-th
                    same = span[0]
                    break
                inner = span[0] + (span[1] - span[0]) / 2.0
                if lo < inner < hi:
                    mid = inner
                span = None
            if mid <= lo or mid >= hi:
                break
            c = counted[mid] = count_le(mid)
            stalled = c in (counted[lo], counted[hi])  # no difference between mid and one end
            if c >= k:
                hi = mid
            else:
                lo = mid
            if stalled:
                span = spread(lo, hi)
        if same is not None:
            out.append(same)
        elif counted[hi] - counted[lo] <= cap:
            # the pairs in (lo, hi]: for y_j, the x with y_j - hi <= x < y_j - lo (count_le's rule)
            start = np.searchsorted(ax, ay - hi, side="left")
            stop = np.searchsorted(ax, ay - lo, side="left")
            runs = stop - start
            js = np.repeat(np.arange(n), runs)
            first = np.cumsum(runs) - runs  # where each run begins in the list
            xi = np.arange(int(runs.sum())) - np.repeat(first - start, runs)
            cand = ay[js] - ax[xi]
            r = k - counted[lo] - 1
            out.append(float(np.partition(cand, r)[r]))
        else:
            # (lo, hi] cannot be split: its differences are one value; the largest <= hi is it
            idx = np.searchsorted(ax, ay - hi, side="left")
            ok = idx < m
            out.append(float((ay[ok] - ax[idx[ok]]).max()))
    return out


CHANGE_PCT_MAX = 1e308  # a change beyond it (a ratio over 1e306) is not a float: it is given as this
_LOG_RATIO_MAX = math.log(1e306)


def _pct(d: float) -> float:
    """The change in percent of a log ratio ``d``: 100 (exp(d) - 1), or CHANGE_PCT_MAX beyond it."""
    return CHANGE_PCT_MAX if d > _LOG_RATIO_MAX else 100.0 * math.expm1(d)


@dataclass(frozen=True)
class Shift:
    """The Hodges-Lehmann change of ``new`` against ``base`` and its Moses interval at
    ``confidence`` (1 - alpha), in percent; the interval None when these sizes give none."""

    change_pct: float
    ci_low_pct: float | None
    ci_high_pct: float | None
    confidence: float


def hodges_lehmann(base: Sequence[float], new: Sequence[float], alpha: float = DEFAULT_ALPHA) -> Shift:
    """The Hodges-Lehmann estimate of the ratio new / base and its distribution-free interval.

    On the log scale (values > 0: B/s or seconds) the two-sample location shift is
    ``HL = median_ij(log y_j - log x_i)`` (Hodges and Lehmann, Ann. Math. Statist. 34 (1963)
    598-611; Hollander & Wolfe, "Nonparametric Statistical Methods", 2nd ed. (1999), section 4.2),
    and the interval ``[D_(C), D_(mn+1-C)]`` of the ordered differences with C = :func:`moses_rank`
    covers it with probability >= 1 - alpha (Moses; Hollander & Wolfe section 4.3).

    Raises:
        ValueError: an empty sample or a value that is not > 0.
    """
    m, n = len(base), len(new)
    if not m or not n:
        raise ValueError("hodges_lehmann needs two non-empty samples")
    if min(min(base), min(new)) <= 0:
        raise ValueError("hodges_lehmann needs values > 0")
    mn = m * n
    c = moses_rank(m, n, alpha)
    ks = [(mn + 1) // 2, mn // 2 + 1]  # the middle one, or the middle two
    if c:
        ks += [c, mn + 1 - c]
    got = _kth_differences([math.log(v) for v in base], [math.log(v) for v in new], ks)
    hl = (got[0] + got[1]) / 2.0
    return Shift(_pct(hl), _pct(got[2]) if c else None, _pct(got[3]) if c else None, 1.0 - alpha)


def figure_values(record: Record, source: str = "result") -> list[float]:
    """The values a figure is judged on: rates nbytes / s in B/s for "bandwidth", seconds for "time".

    Raises:
        UsageError: an unknown metric, a bandwidth record that moves no bytes, or a sample that is
            not a finite positive number of seconds.
    """
    if record.metric not in HIGHER_IS_BETTER:
        raise UsageError(f"{safe.term(source)}: record {safe.term(record.params)} has metric "
                         f"{safe.term(repr(record.metric))}", "known metrics: bandwidth, time")
    samples = record.samples_s
    if not (samples and min(samples) > 0 and math.isfinite(sum(samples))):  # else all finite and > 0 (C speed)
        for t in samples:
            if not (math.isfinite(t) and t > 0):
                raise UsageError(f"{safe.term(source)}: record {safe.term(record.params)} has a sample of {t!r} seconds",
                                 "samples must be finite and > 0")
    if record.metric == "time":
        return list(samples)
    if record.nbytes <= 0:
        raise UsageError(f"{safe.term(source)}: bandwidth record {safe.term(record.params)} moves "
                         f"{record.nbytes} bytes")
    return record.rates()


def _median(xs: Sequence[float]) -> float:
    """The median of finite values (the middle two halved first where their sum would overflow)."""
    s = sorted(xs)
    n = len(s)
    if n % 2:
        return float(s[n // 2])
    a, b = s[n // 2 - 1], s[n // 2]
    m = (a + b) / 2.0
    return m if math.isfinite(m) else a / 2.0 + b / 2.0


@dataclass
class Row:
    """One figure of a comparison: medians in B/s ("bandwidth") or seconds ("time"); status
    "paired", "only-base", "only-new" or "no-data"; change, interval (%) and p only when paired."""

    params: dict[str, Any]
    metric: str
    status: str
    base_median: float | None = None
    new_median: float | None = None
    n_base: int = 0
    n_new: int = 0
    change_pct: float | None = None
    ci_low_pct: float | None = None
    ci_high_pct: float | None = None
    p: float | None = None
    verdict: str = ""
    why: str = ""
    note: str = ""
    telemetry: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["unit"] = "B/s" if self.metric == "bandwidth" else "s"
        d["better"] = "higher" if HIGHER_IS_BETTER.get(self.metric, True) else "lower"
        return d


def _gain(r: Row) -> float:
    """A paired row's change as a gain in %: > 0 is faster whatever the metric's direction."""
    c = r.change_pct or 0.0
    return c if HIGHER_IS_BETTER.get(r.metric, True) else -c


@dataclass(frozen=True)
class Judgement:
    """The verdict on one figure (:func:`judge`): the change, its interval, the test, the verdict."""

    shift: Shift
    test: MWU
    verdict: str
    why: str
    base_median: float
    new_median: float


def judge(base: Sequence[float], new: Sequence[float], metric: str, *, threshold_pct: float,
          alpha: float = DEFAULT_ALPHA) -> Judgement:
    """Verdict on one figure from its two samples of values (B/s or seconds, > 0): "same" when the
    change is within ``threshold_pct``; beyond it "faster" / "slower" when p < ``alpha``;
    "undecidable" when these sample sizes cannot reach p < alpha (:func:`samples_needed`); else
    "inconclusive"."""
    shift = hodges_lehmann(base, new, alpha)
    t = mann_whitney_u(new, base)
    return _verdict(shift, t, metric, threshold_pct, alpha, len(base), len(new), _median(base), _median(new))


def _verdict(shift: Shift, t: MWU, metric: str, threshold_pct: float, alpha: float, m: int, n: int,
             base_median: float, new_median: float) -> Judgement:
    change = shift.change_pct
    gain = change if HIGHER_IS_BETTER[metric] else -change
    if abs(change) <= threshold_pct:
        verdict, why = SAME, f"|change| {abs(change):.2f}% <= threshold {threshold_pct:g}%"
    elif t.p < alpha:
        verdict = FASTER if gain > 0 else SLOWER
        why = f"p = {_p_text(t.p)} < alpha {alpha:g}"
    elif t.p_min >= alpha:
        k, n2 = samples_needed(m, n, alpha)
        verdict = UNDECIDABLE
        why = (f"{m} vs {n} samples cannot reach p < {alpha:g} (best {t.p_min:.3g}): it takes {k} vs {k}"
               + (f" or {m} vs {n2}" if n2 is not None and n2 != k else ""))
    else:
        verdict, why = INCONCLUSIVE, f"p = {_p_text(t.p)} >= alpha {alpha:g}: the change may be noise"
    return Judgement(shift, t, verdict, why, base_median, new_median)


def plugin_of(command: str) -> Plugin | type[Plugin]:
    """The plug-in of ``command``, or the Plugin class (its fields' defaults) where none is installed."""
    return registry.find(command) or Plugin


def more_samples_hint(command: str) -> str:
    """What to run to give ``command``'s figures more samples, as words that follow "take"."""
    return plugin_of(command).more_samples


def _plugin_notes(base: Result, new: Result) -> list[str]:
    """The lines the plug-in of ``base.command`` adds to compare's notes (its ``compare_notes``)."""

    def lines(got) -> None:
        if not isinstance(got, list) or not all(isinstance(x, str) for x in got):
            raise TypeError(f"it gave {type(got).__name__}, not a list of strings")

    plugin = registry.find(base.command)
    return registry.call_hook(plugin, "compare_notes", base, new, check=lines, default=[]) if plugin is not None else []


def undecided_lines(cmp: "Comparison") -> list[str]:
    """A sentence each on the undecidable and the inconclusive figures of ``cmp``."""
    out = []
    for verdict, rows in ((UNDECIDABLE, cmp.undecidable()), (INCONCLUSIVE, cmp.inconclusive())):
        if rows:
            head = (f"1 figure {verdict}: {rows[0].why}. To decide it" if len(rows) == 1 else
                    f"{len(rows)} figures {verdict}; the first: {rows[0].why}. To decide them")
            out.append(f"{head}, take {more_samples_hint(cmp.command)}.")
    return out


BATCH_MAX_SIZE = 16  # figures with at most this many samples a side are judged in numpy batches
BATCH_MIN_FIGURES = 32  # of the same sizes; fewer, one by one


def judge_many(items: Sequence[tuple[Sequence[float], Sequence[float], str]], *, threshold_pct: float,
               alpha: float = DEFAULT_ALPHA) -> list[Judgement]:
    """:func:`judge` of each (base, new, metric): the same results, with numpy for many small figures at once."""
    out: list[Judgement | None] = [None] * len(items)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (b, n_, _) in enumerate(items):
        if len(b) <= BATCH_MAX_SIZE and len(n_) <= BATCH_MAX_SIZE:
            groups.setdefault((len(b), len(n_)), []).append(i)
    for (m, n), idx in groups.items():
        if len(idx) < BATCH_MIN_FIGURES:
            continue
        for lo in range(0, len(idx), 20_000):
            part = idx[lo:lo + 20_000]
            for i, j in zip(part, _judge_block([items[i] for i in part], m, n, threshold_pct, alpha)):
                out[i] = j
    for i, got in enumerate(out):
        if got is None:
            b, n_, metric = items[i]
            out[i] = judge(b, n_, metric, threshold_pct=threshold_pct, alpha=alpha)
    return out  # type: ignore[return-value]


def _judge_block(items, m: int, n: int, threshold_pct: float, alpha: float) -> list[Judgement]:
    import numpy as np

    X = np.array([it[0] for it in items], dtype=float)  # base, G x m
    Y = np.array([it[1] for it in items], dtype=float)  # new, G x n
    if (X <= 0).any() or (Y <= 0).any():
        raise ValueError("hodges_lehmann needs values > 0")
    G, mn = len(items), m * n
    D = (np.log(Y)[:, :, None] - np.log(X)[:, None, :]).reshape(G, mn)
    D.sort(axis=1)
    hl = (D[:, (mn + 1) // 2 - 1] + D[:, mn // 2]) / 2.0
    c = moses_rank(m, n, alpha)
    # Mann-Whitney: the first sample is the new one, as judge calls it
    N = m + n
    R, sizes = _midranks(np.concatenate([Y, X], axis=1))
    u1 = R[:, :n].sum(axis=1) - n * (n + 1) / 2.0
    tie_term = (sizes.astype(float) ** 3 - sizes).sum(axis=1)
    var = n * m / 12.0 * ((N + 1) - tie_term / (N * (N - 1)))
    ties = (sizes > 1).any(axis=1)
    pmin = min_p(n, m)
    u1l, varl, hll = u1.tolist(), var.tolist(), hl.tolist()  # Python floats, not numpy scalars
    tiesl = cast("list[bool]", ties.tolist())
    lol: list[float | None] = D[:, c - 1].tolist() if c else [None] * G
    hil: list[float | None] = D[:, mn - c].tolist() if c else [None] * G
    group_sizes = sizes.tolist() if ties.any() and _exact_ties_ok(N, n) else None
    res = []
    for g in range(G):
        t = _mwu(u1l[g], varl[g], n, m, pmin, tiesl[g], group_sizes[g] if group_sizes is not None else ())
        lo, hi = lol[g], hil[g]
        shift = Shift(_pct(hll[g]), None if lo is None else _pct(lo), None if hi is None else _pct(hi), 1.0 - alpha)
        res.append(_verdict(shift, t, items[g][2], threshold_pct, alpha, m, n, _median(items[g][0]),
                            _median(items[g][1])))
    return res


def _p_text(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


# ---- telemetry and limit flags, read defensively (the fields may be absent or malformed) ----

def _telemetry(record: Record) -> Any:
    """The record's telemetry block, else one an older file kept in extra["telemetry"]."""
    if record.telemetry is not None:
        return record.telemetry
    return record.extra.get("telemetry") if isinstance(record.extra, dict) else None


def _finite(v: Any) -> float | None:
    """``v`` as a float when it is a finite int or float (bool excluded), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        x = float(v)
    except OverflowError:  # an int beyond 1.8e308
        return None
    return x if math.isfinite(x) else None


def _num(block: Any, key: str, stat: str = "median") -> float | None:
    """``block[key][stat]`` (or ``block[key]`` when that is not an object) as a finite float, else None."""
    if not isinstance(block, dict):
        return None
    v = block.get(key)
    if isinstance(v, dict):
        v = v.get(stat)
    return _finite(v)


def _count(v: float) -> str:
    """A telemetry figure as a whole number: "1980", or "1.7e+308" for a huge one."""
    return f"{v:.0f}" if abs(v) < 1e7 else f"{v:.3g}"


def _reasons(t: dict) -> set[str]:
    """The clock-event reasons (strings) of a telemetry block's ``reasons`` list."""
    r = t.get("reasons")
    return {x for x in r if isinstance(x, str)} if isinstance(r, list) else set()


def _pcie_link(t: dict) -> tuple[int, int] | None:
    """(gen, width) of a telemetry block's ``pcie``: both ints (bool excluded), else None."""
    p = t.get("pcie")
    g, w = (p.get("gen"), p.get("width")) if isinstance(p, dict) else (None, None)
    return (g, w) if type(g) is int and type(w) is int else None


def telemetry_diff(rb: Record, rn: Record) -> list[str]:
    """What the GPU's state did differently while the two records were measured, from each record's
    ``telemetry`` block ({"sm_clock_mhz": {"min", "median", "max"}, ..., "reasons": [str], "pcie": {"gen",
    "width"} | null}, docs/conditions.md): medians that moved beyond the table's bounds, reasons seen on one side only, a different PCIe link or number of other processes, replays or NVLink
    errors on the new side; where only one side has a block, what it says happened. Raw strings."""
    tb, tn = _telemetry(rb), _telemetry(rn)
    if isinstance(tb, dict) != isinstance(tn, dict):  # one side only (a baseline from before telemetry)
        side, t = ("new", tn) if isinstance(tn, dict) else ("base", tb)
        events = _events(t)
        return [f"{side}: {', '.join(events)} (no telemetry in {'base' if side == 'new' else 'new'})"] if events else []
    if not isinstance(tb, dict) or not isinstance(tn, dict):
        return []
    out = []
    for key, label, unit, rel, absd in (("sm_clock_mhz", "SM clock", "MHz", 0.02, None),
                                        ("mem_clock_mhz", "memory clock", "MHz", 0.02, None),
                                        ("power_w", "power", "W", 0.05, None),
                                        ("temp_c", "temperature", "C", None, 5.0)):
        a, b = _num(tb, key), _num(tn, key)
        if a is None or b is None:
            continue
        # finite a, b: b - a may be inf (1.7e308 - -1.7e308), which compares, never raises
        moved = (rel is not None and a and abs(b - a) / abs(a) > rel) or (absd is not None and abs(b - a) >= absd)
        if moved:
            out.append(f"{label} {_count(a)}->{_count(b)} {unit}")
    ra, rb_ = _reasons(tb), _reasons(tn)
    if rb_ - ra:
        out.append("new only: " + ", ".join(sorted(rb_ - ra)))
    if ra - rb_:
        out.append("base only: " + ", ".join(sorted(ra - rb_)))
    pa, pb = _pcie_link(tb), _pcie_link(tn)
    if pa is not None and pb is not None and pa != pb:
        out.append(f"PCIe Gen{pa[0]} x{pa[1]}->Gen{pb[0]} x{pb[1]}")
    a, b = _num(tb, "other_processes") or 0, _num(tn, "other_processes") or 0
    if a != b:  # another process on the GPU during the point (a second job)
        out.append(f"other processes on the GPU {_count(a)}->{_count(b)}")
    return out + _link_errors(tn, " (new)")


def _link_errors(t: dict, suffix: str = "") -> list[str]:
    """PCIe replays and NVLink errors counted in a telemetry block, each "label count" + ``suffix``."""
    counted = ((label, _num(t, key)) for key, label in (("pcie_replay_delta", "PCIe replays"),
                                                        ("nvlink_errors_delta", "NVLink errors")))
    return [f"{label} {_count(v)}{suffix}" for label, v in counted if v]


def _events(t: dict) -> list[str]:
    """What one side's telemetry block says happened: reasons, other processes, PCIe replays, NVLink errors."""
    out = sorted(_reasons(t))
    n = _num(t, "other_processes")
    if n:
        out.append(f"{_count(n)} other process(es) on the GPU")
    return out + _link_errors(t)


_LIMIT_TEXT = {"above_peak": "above a physical limit", "no_op": "no-op (moves no data: one rank, in place)",
               "nvls": "busbw above the links' sum (NVLS?)"}


def limit_flags(record: Record, side: str) -> list[str]:
    """Limit flags of a record naming the side: the saved limit rule (:func:`limits.saved_flag`), then extra.flags."""
    from gpubench.core import limits

    flag = _LIMIT_TEXT.get(limits.saved_flag(record) or "")
    out = [f"{side} {flag}"] if flag else []
    flags = record.extra.get("flags") if isinstance(record.extra, dict) else None
    if isinstance(flags, list):
        out += [f"{side}: {f}" for f in flags[:5] if isinstance(f, str) or _finite(f) is not None]
    return out


@dataclass
class Comparison:
    """``new`` against ``base``: the env differences and one Row per figure (base order, then new-only)."""

    base_name: str
    new_name: str
    command: str
    env_diff: list[tuple[str, str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        c = dict.fromkeys((*VERDICTS, "only-base", "only-new", "no-data"), 0)
        for r in self.rows:
            c[r.verdict if r.status == "paired" else r.status] += 1
        return c

    def regressions(self) -> list[Row]:
        """Figures slower beyond the threshold and the noise (p < alpha)."""
        return [r for r in self.rows if r.verdict == SLOWER]

    def inconclusive(self) -> list[Row]:
        """Figures changed by more than the threshold whose test does not reach p < alpha."""
        return [r for r in self.rows if r.verdict == INCONCLUSIVE]

    def undecidable(self, slower_only: bool = False) -> list[Row]:
        """Figures changed by more than the threshold that their sample sizes cannot decide at
        alpha (:func:`samples_needed`); ``slower_only``: those whose change is a slowdown."""
        return [r for r in self.rows if r.verdict == UNDECIDABLE and not (slower_only and _gain(r) >= 0)]

    def missing(self) -> list[Row]:
        """Figures the base has data for and the new result lacks (absent, or an error row)."""
        return [r for r in self.rows if r.status == "only-base" and r.base_median is not None
                or r.status == "no-data" and r.base_median is not None and r.new_median is None]

    def metrics(self) -> set[str]:
        return {r.metric for r in self.rows}

    def to_dict(self) -> dict:
        return {
            "base": self.base_name,
            "new": self.new_name,
            "command": self.command,
            "env_diff": [{"what": w, "base": b, "new": n} for w, b, n in self.env_diff],
            "notes": self.notes,
            "counts": self.counts(),
            "rows": [r.to_dict() for r in self.rows],
        }


def env_facts(env: dict) -> dict[str, str]:
    """The machine facts a comparison header shows, as text: GPUs, driver, CUDA, PCIe link, versions, host."""
    host = env.get("host") or {}
    cuda = env.get("cuda") or {}
    gpus = env.get("gpus") or []
    facts = {
        "hostname": str(host.get("hostname", "-")),
        "GPUs": ", ".join(str(g.get("name")) for g in gpus) or "-",
        "GPU count": str(cuda.get("device_count", len(gpus)) or "-"),
        "PCIe link (now)": ", ".join(f"Gen{g.get('pcie_gen') or '?'} x{g.get('pcie_width') or '?'}" for g in gpus) or "-",
        "NVIDIA driver": str((env.get("nvml") or {}).get("driver_version") or "-"),
        **{label: str(cuda.get(k) or "-") for label, k in (("CUDA driver", "driver_version"),
                                                           ("CUDA runtime", "runtime_version"),
                                                           ("NVRTC", "nvrtc_version"))},
        **{label: str(host.get(k, "-")) for label, k in (("CPU", "cpu_model"), ("OS", "os"), ("python", "python"))},
    }
    for k, v in sorted((env.get("versions") or {}).items()):
        facts[k] = "-" if v is None else str(v)  # a wheel not installed reads as one an older file did not record
    nccl = env.get("nccl")
    if isinstance(nccl, dict):  # nccl results: the library and the NCCL_* variables it read
        facts["NCCL"] = nccl_version_text(nccl.get("version"))
        facts["NCCL_* variables"] = " ".join(f"{k}={v}" for k, v in sorted((nccl.get("env") or {}).items())) or "-"
    return facts


def nccl_version_text(code) -> str:
    """NCCL's version code (``ncclGetVersion``) as people write it: 22809 -> "2.28.9" (nccl.h:
    major * 10000 + minor * 100 + patch from 2.9, major * 1000 + ... before); anything else as it is."""
    if isinstance(code, bool) or not isinstance(code, int):
        return "-" if code in (None, "") else str(code)
    if code >= 20900:
        major, rest = divmod(code, 10000)
    elif code >= 1000:
        major, rest = divmod(code, 1000)
    else:
        return str(code)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def env_diff(base: Result, new: Result) -> list[tuple[str, str, str]]:
    """(what, base value, new value) for each machine fact, gpubench version or option that differs."""
    a, b = env_facts(base.env), env_facts(new.env)
    out = [(k, a.get(k, "-"), b.get(k, "-")) for k in list(a) + [k for k in b if k not in a] if a.get(k, "-") != b.get(k, "-")]
    if base.gpubench_version != new.gpubench_version:
        out.append(("gpubench (result)", base.gpubench_version, new.gpubench_version))
    for k in sorted((set(base.spec) | set(new.spec)) - set(plugin_of(new.command).incidental_options)):
        va, vb = base.spec.get(k), new.spec.get(k)
        if (k not in base.spec or k not in new.spec) and (va if k in base.spec else vb) == \
                registry.added(new.command, "added_options").get(k, _MISSING):
            continue  # an option an older gpubench did not have, at the value that means "off"
        if va != vb:
            out.append((f"option {k}", _short(va), _short(vb)))
    for k in TIMING_FACTS:  # how the figures were taken, where a command records it
        va, vb = base.timing.get(k), new.timing.get(k)
        if va != vb:
            out.append((f"timing {k}", _short(va), _short(vb)))
    return out


def _filled(params: dict, added: dict[str, Any]) -> dict:
    """``params`` with each added param it lacks at its older-behaviour value."""
    return params if all(k in params for k in added) else {**added, **params}


TIMING_FACTS = ("buffers",)  # timing keys that change what a figure means (nccl: the buffers' allocator)


def _short(v: Any, width: int = 60) -> str:
    import json

    s = json.dumps(v, sort_keys=True) if not isinstance(v, str) else v
    return s if len(s) <= width else s[: width - 3] + "..."


def check_same_command(results: Sequence[tuple[str, Result]]) -> str:
    """The command all results share.

    Raises:
        UsageError: results of different commands.
    """
    base_name, base = results[0]
    for name, r in results[1:]:
        if r.command != base.command:
            raise UsageError(
                f"{safe.term(name)} is a {safe.term(repr(r.command))} result and {safe.term(base_name)} a "
                f"{safe.term(repr(base.command))} result",
                "compare results of the same command",
            )
    return base.command


def compare(base: Result, new: Result, *, base_name: str = "base", new_name: str = "new",
            threshold_pct: float = DEFAULT_THRESHOLD_PCT, alpha: float = DEFAULT_ALPHA,
            ignore: Sequence[str] = ()) -> Comparison:
    """Compare ``new`` against ``base``, figure by figure (:func:`judge`), in time linear in the
    number of records. ``threshold_pct``: changes at or under it are "same"; ``alpha``: level of
    the test and 1 - the interval's confidence; ``ignore``: params left out of a figure's identity
    (--ignore-param).

    Raises:
        UsageError: different commands; a record with an unknown metric or impossible samples;
            an ignored name that is no param of either result; two records of one file that only
            an ignored param told apart.
    """
    check_same_command([(base_name, base), (new_name, new)])
    cmp = Comparison(base_name, new_name, base.command, env_diff(base, new))
    cmp.notes.extend(_ignored_notes(base, new, ignore))
    for name, r in ((base_name, base), (new_name, new)):
        if r.partial:
            cmp.notes.append(f"{name} is partial ({partial_why(r, 100)})")
    cmp.notes.extend(_plugin_notes(base, new))
    added = registry.added(base.command, "added_params")  # a record without one pairs as if it had that value
    lacking = [name for name, r in ((base_name, base), (new_name, new))
               if added and any(any(k not in rec.params for k in added) for rec in r.records)]
    for name in lacking:
        cmp.notes.append(f"{name} has records without param(s) {', '.join(sorted(added))} (written by an older "
                         "gpubench); they pair as " + ", ".join(f"{k} {_short(v)}" for k, v in sorted(added.items()))
                         + ", what that gpubench measured")
    new_params, new_keys, new_index = _indexed(new, new_name, added, ignore)
    base_params, base_keys, base_index = _indexed(base, base_name, added, ignore)
    pending: list[tuple[list[float], list[float], str]] = []
    paired: list[Row] = []
    for rb, pb, k in zip(base.records, base_params, base_keys):
        rn = new.records[new_index[k]] if k in new_index else None
        if rn is None:
            cmp.rows.append(_unpaired("only-base", pb, rb, str(rb.error or ""), limit_flags(rb, "base"),
                                      [(rb, "base", base_name)]))
            continue
        if rb.metric != rn.metric:
            raise UsageError(f"figure {safe.term(rb.params)}: metric {safe.term(repr(rb.metric))} in "
                             f"{safe.term(base_name)} but {safe.term(repr(rn.metric))} in {safe.term(new_name)}")
        flags = limit_flags(rb, "base") + limit_flags(rn, "new")
        if rb.error or rn.error or not rb.samples_s or not rn.samples_s:
            cmp.rows.append(_unpaired("no-data", pb, rb, str(rb.error or rn.error or "no samples"), flags,
                                      [(rb, "base", base_name), (rn, "new", new_name)]))
            continue
        vb, vn = figure_values(rb, base_name), figure_values(rn, new_name)
        pending.append((vb, vn, rb.metric))
        row = Row(pb, rb.metric, "paired", n_base=len(vb), n_new=len(vn), telemetry=telemetry_diff(rb, rn),
                  flags=flags)
        paired.append(row)
        cmp.rows.append(row)
        if len(pending) >= JUDGE_CHUNK:  # judged in chunks: the samples are not held twice for every figure
            _fill(paired, pending, threshold_pct, alpha)
            pending, paired = [], []
    _fill(paired, pending, threshold_pct, alpha)
    for k, rn, pn in zip(new_keys, new.records, new_params):
        if k not in base_index:
            cmp.rows.append(_unpaired("only-new", pn, rn, str(rn.error or ""), limit_flags(rn, "new"),
                                      [(rn, "new", new_name)]))
    if base.records and new.records and all(r.status in ("only-base", "only-new") for r in cmp.rows):
        cmp.notes.append(_nothing_pairs(base, new, ignore, added))
    return cmp


def _indexed(r: Result, name: str, added: dict[str, Any], ignore: Sequence[str]) -> tuple[list, list, dict]:
    """Each record's params as they pair (``added`` filled in, ``ignore`` left out), their keys
    (:func:`_key`) and key -> record index.

    Raises:
        UsageError: two records of ``r`` with one key (:func:`_repeated`).
    """
    params = [_filled(rec.params, added) for rec in r.records]
    if ignore:
        params = [{k: v for k, v in p.items() if k not in ignore} for p in params]
    keys = [_key(p) for p in params]
    index: dict[tuple, int] = {}
    for j, k in enumerate(keys):
        if k in index:
            raise _repeated(name, r.records[j], index[k], j, ignore)
        index[k] = j
    return params, keys, index


def _values(r: Result, name: str, added: dict[str, Any] | None = None) -> list:
    """The values of param ``name`` in ``r``'s records, in first-seen order (``added`` filled in)."""
    params = (_filled(rec.params, added or {}) for rec in r.records)
    return list(dict.fromkeys(p[name] for p in params if name in p))


def _values_text(vals: list) -> str:
    return ", ".join(_short(v, 30) for v in vals[:4]) + (f" (+{len(vals) - 4} more)" if len(vals) > 4 else "") or "-"


def _ignored_notes(base: Result, new: Result, ignore: Sequence[str]) -> list[str]:
    """A note per ignored param: its values on each side.

    Raises:
        UsageError: a name that no record of either result has as a param.
    """
    known = {k for r in (base, new) for rec in r.records for k in rec.params}
    notes = []
    for name in ignore:
        if name not in known:
            raise UsageError(f"--ignore-param {safe.term(repr(name), 60)} is not a param of these results",
                             f"their params: {safe.term(', '.join(sorted(known)), 200) or 'none'}")
        notes.append(f"pairs across {name}: base {_values_text(_values(base, name))}, "
                     f"new {_values_text(_values(new, name))}")
    return notes


def _nothing_pairs(base: Result, new: Result, ignore: Sequence[str], added: dict[str, Any]) -> str:
    """Why no figure paired: the params whose values differ between the sides, and the option."""
    names = sorted({k for r in (base, new) for rec in r.records for k in _filled(rec.params, added)} - set(ignore))
    sides = {n: (set(map(repr, _values(base, n, added))), set(map(repr, _values(new, n, added)))) for n in names}
    differ = [n for n in names if sides[n][0] != sides[n][1]]
    if not differ:
        return "no figure pairs: each side's figures are its own"
    whole = [n for n in differ if not sides[n][0] & sides[n][1]]
    pick = whole or differ
    said = "; ".join(f"{n}: base {_values_text(_values(base, n, added))}, new "
                     f"{_values_text(_values(new, n, added))}" for n in pick[:3])
    return (f"no figure pairs: the results differ in {said}; --ignore-param {pick[0]} pairs figures that "
            "differ only there")


def partial_why(r: Result, clip: int | None = None) -> str:
    """Why a partial result ended: "stopped by a fault: ..." (clipped to ``clip``) or "interrupted by SIGNAL"."""
    return f"stopped by a fault: {r.failed_by[:clip]}" if r.failed_by else f"interrupted by {r.interrupted_by or 'a signal'}"


def _repeated(name: str, rec: Record, first: int, again: int, ignore: Sequence[str] = ()) -> UsageError:
    """The error for two records of one file with the same params (one would be dropped unseen)."""
    if ignore:
        return UsageError(f"{safe.term(name)}: /records/{again} and /records/{first} differ only in "
                          f"{safe.term(', '.join(ignore), 100)}, which --ignore-param leaves out",
                          "ignore only a param that differs between the files, not within one")
    return UsageError(f"{safe.term(name)}: /records/{again} has the same params as /records/{first} "
                      f"({safe.term(rec.params, 200)}), so the two cannot be told apart",
                      "compare results whose records each have their own params (one run per file)")


JUDGE_CHUNK = 10_000  # figures judged together (judge_many)


def _fill(rows: list[Row], pending: list, threshold_pct: float, alpha: float) -> None:
    for row, j in zip(rows, judge_many(pending, threshold_pct=threshold_pct, alpha=alpha)):
        row.base_median, row.new_median = j.base_median, j.new_median
        row.change_pct, row.ci_low_pct, row.ci_high_pct = j.shift.change_pct, j.shift.ci_low_pct, j.shift.ci_high_pct
        row.p, row.verdict, row.why = j.test.p, j.verdict, j.why


def _key(params: dict) -> tuple:
    """A record's identity from its params, equal exactly when :meth:`Record.key` is (1, 1.0 and true differ)."""
    return tuple([(k, type(v).__name__, repr(v) if type(v) is float else v) for k, v in sorted(params.items())])


def _unpaired(status: str, params: dict, r: Record, note: str, flags: list[str], sides) -> Row:
    """A row not judged ("only-base", "only-new", "no-data") of ``r``'s metric, with the median and
    sample count of each (record, "base" or "new", file name) of ``sides`` that has samples and no error."""
    row = Row(dict(params), r.metric, status, note=note, flags=flags)
    for rec, side, source in sides:
        if rec.samples_s and not rec.error:
            setattr(row, f"{side}_median", _median(figure_values(rec, source)))
            setattr(row, f"n_{side}", len(rec.samples_s))
    return row


# ---- formatting: every string from a file is made inert where it is rendered (safe.term for rich
# Text, safe.markdown for markdown) ----

MAX_TABLE_ROWS = 500  # the terminal table lists at most this many rows; beyond, the ones not "same"


def differing_params(rows: Sequence[Row]) -> list[str]:
    """Param names whose value differs between rows (absent counts as differing), first-seen order."""
    def differs(k: str) -> bool:
        first = rows[0].params.get(k, _MISSING)
        return any((v := r.params.get(k, _MISSING)) != first or type(v) is not type(first) for r in rows[1:])

    return [k for k in dict.fromkeys(k for r in rows for k in r.params) if differs(k)]


_MISSING = object()


def _param_cell(key: str, value: Any) -> str:
    from gpubench.core.units import format_size

    if value is None:
        return "-"
    if key in ("nbytes", "size", "piece", "piece_bytes") and isinstance(value, int) and not isinstance(value, bool) \
            and 0 <= value < 2**63:
        return format_size(value)
    return str(value)


def _unit(metric: str, units: str) -> str:
    return f"{units}/s" if metric == "bandwidth" else "us"


def _value_cell(v: float | None, metric: str, units: str, with_unit: bool = False) -> str:
    """A median as the table shows it: us for "time", GB/s or GiB/s for "bandwidth"; 3 digits from 10^7."""
    from gpubench.core.units import format_rate, to_rate

    if v is None:
        return "-"
    if metric == "time":
        us = v * 1e6
        if not math.isfinite(us):  # v over 1.8e302 s: the exponent shifted by 6 in the text
            mant, exp = f"{v:.2e}".split("e")
            text = f"{float(mant):g}e+{int(exp) + 6}"
        else:
            text = f"{us:.3g}" if us < 100 or us >= 1e7 else f"{us:.0f}"
    else:
        text = format_rate(v, units) if to_rate(v, units) < 1e7 else f"{to_rate(v, units):.3g}"
    return f"{text} {_unit(metric, units)}" if with_unit else text


def _pct_cell(c: float | None) -> str:
    """A change in percent: "+1.23%"; from 10^7 % on 3 significant digits; ">+1e+308%" for CHANGE_PCT_MAX."""
    if c is None:
        return "-"
    if c >= CHANGE_PCT_MAX:
        return f">+{CHANGE_PCT_MAX:g}%"
    return f"{c:+.3g}%" if abs(c) >= 1e7 else f"{c:+.2f}%"


def medians_part(r: Row, threshold_pct: float) -> float | None:
    """The change of the medians (new / base - 1, %) of a paired row when it parts from the
    Hodges-Lehmann change by more than ``threshold_pct`` points, else None (:data:`MEDIANS_NOTE`)."""
    if r.status != "paired" or r.change_pct is None or not r.base_median or r.new_median is None:
        return None
    med = (r.new_median / r.base_median - 1.0) * 100.0
    return med if math.isfinite(med) and abs(med - r.change_pct) > threshold_pct else None


MEDIANS_NOTE = ("† the change of the medians parts from the change: the change is the Hodges-Lehmann estimate, the median "
                "of all base x new sample ratios, which weighs every sample; the ratio of the two medians reads "
                "one value a side. They part when the samples are skewed or spread; the verdict uses the change.")


def table_rows(cmp: Comparison, units: str = "GB", alpha: float = DEFAULT_ALPHA,
               rows: Sequence[Row] | None = None,
               threshold_pct: float = DEFAULT_THRESHOLD_PCT) -> tuple[list[str], list[list[str]]]:
    """Column names and raw text cells of a comparison table for ``rows`` (columns: those of all rows)."""
    keys = list(dict.fromkeys(k for r in cmp.rows for k in r.params))  # shown: those that differ, else the first
    keys = keys if len(cmp.rows) <= 1 else differing_params(cmp.rows) or keys[:1]
    metrics = cmp.metrics()
    mixed = len(metrics) > 1
    unit_label = "" if mixed else f" {_unit(next(iter(metrics)), units)}" if metrics else ""
    conf = f"{100 * (1 - alpha):g}%"
    cols = [str(k) for k in keys] + [f"base{unit_label}", f"new{unit_label}", "n base/new", "change",
                                     f"{conf} interval", "p", "verdict"]
    tele = any(r.telemetry for r in cmp.rows)
    flagged = any(r.flags for r in cmp.rows)
    if tele:
        cols.append("telemetry (base->new)")
    if flagged:
        cols.append("flags")
    body = []
    for r in (cmp.rows if rows is None else rows):
        cells = [_param_cell(k, r.params.get(k)) for k in keys]
        cells += [_value_cell(r.base_median, r.metric, units, mixed), _value_cell(r.new_median, r.metric, units, mixed),
                  f"{r.n_base or '-'}/{r.n_new or '-'}"]
        if r.status == "paired":
            med = medians_part(r, threshold_pct)
            change = _pct_cell(r.change_pct) + ("" if med is None else f" (medians {_pct_cell(med)})†")
            ci = "none (too few)" if r.ci_low_pct is None else f"{_pct_cell(r.ci_low_pct)} .. {_pct_cell(r.ci_high_pct)}"
            cells += [change, ci, _p_text(r.p) if r.p is not None else "-", r.verdict]
        else:
            label = {"only-base": "only in base", "only-new": "only in new", "no-data": "no data"}[r.status]
            cells += ["-", "-", "-", label + (f": {r.note[:60]}" if r.note else "")]
        if tele:
            cells.append("; ".join(r.telemetry) or "-")
        if flagged:
            cells.append("; ".join(r.flags) or "-")
        body.append(cells)
    return cols, body


def worst(rows: Sequence[Row]) -> Row | None:
    """The paired row of ``rows`` that lost the most (the smallest gain, :func:`_gain`), or None."""
    paired = [r for r in rows if r.status == "paired" and r.change_pct is not None]
    return min(paired, key=_gain) if paired else None


def figure_text(row: Row, keys: Sequence[str] | None = None) -> str:
    """A figure in words, its params (``keys``, default all) and change: "nbytes 1 GiB, direction
    h2d: -12.30%" (raw text: the caller escapes it)."""
    ks = list(row.params) if keys is None else [k for k in keys if k in row.params]
    label = ", ".join(f"{k} {_param_cell(k, row.params[k])}" for k in ks)
    return f"{label}: {_pct_cell(row.change_pct)}" if label else _pct_cell(row.change_pct)


def summary_line(cmp: Comparison) -> str:
    c = cmp.counts()
    paired = sum(c[v] for v in VERDICTS)
    s = (f"{paired} figure(s) paired: {c[FASTER]} faster, {c[SLOWER]} slower, {c[SAME]} same, "
         f"{c[INCONCLUSIVE]} inconclusive" + (f", {c[UNDECIDABLE]} undecidable" if c[UNDECIDABLE] else ""))
    bad = worst(cmp.regressions() + cmp.undecidable(slower_only=True))
    if bad is not None:
        s += f" (worst: {figure_text(bad, differing_params(cmp.rows))})"
    extra = [f"{c[k]} {what}" for k, what in (("only-base", "only in base"), ("only-new", "only in new"),
                                               ("no-data", "without data")) if c[k]]
    return s + ("; " + ", ".join(extra) if extra else "") + "."


def method_lines(threshold_pct: float, alpha: float, units: str, metrics: set[str]) -> list[str]:
    """How the verdicts were reached, and the unit and direction of only the metrics compared."""
    lines = [f"verdict: same when |change| <= {threshold_pct:g}%; beyond it faster or slower when the two-sided "
             f"Mann-Whitney U test on the raw samples gives p < {alpha:g}, else inconclusive, or undecidable "
             "when the sample sizes cannot reach that p whatever the values. change: "
             f"Hodges-Lehmann estimate of new/base - 1 with its {100 * (1 - alpha):g}% distribution-free (Moses) "
             "interval; base and new are medians; n = samples per side."]
    if "bandwidth" in metrics:
        lines.append(f"bandwidth in {units}/s ({'1e9' if units == 'GB' else '2^30'} B/s): higher is better "
                     "(faster = more bandwidth).")
    if "time" in metrics:
        lines.append("time in us: lower is better (faster = less time).")
    return lines


_STYLE = {SLOWER: "red", FASTER: "green", INCONCLUSIVE: "yellow", UNDECIDABLE: "yellow"}


def format_table(cmps: Sequence[Comparison], *, threshold_pct: float, alpha: float, units: str = "GB") -> list:
    """Rich renderables: per comparison, the env differences and the figure table."""
    from rich.text import Text

    from gpubench.core import report

    def T(s: object) -> Text:
        return Text(safe.term(s))

    out: list = []
    metrics: set[str] = set().union(*(cmp.metrics() for cmp in cmps))
    for cmp in cmps:
        title = safe.term_markup(f"{cmp.command}: {safe.term(cmp.new_name)} vs base {safe.term(cmp.base_name)}")
        if cmp.env_diff:
            t = report.table(f"What differs - {title}", ["", "base", "new"])
            for w, b, n in cmp.env_diff:
                t.add_row(T(w), T(b), T(n))
            out.append(t)
        else:
            out.append(Text(f"Same machine and options: {safe.term(cmp.command)}: {safe.term(cmp.new_name)} vs base "
                            f"{safe.term(cmp.base_name)}"))
        out.extend(T(f"note: {n}") for n in cmp.notes)
        rows = cmp.rows
        if len(rows) > MAX_TABLE_ROWS:
            rows = [r for r in rows if r.verdict != SAME][:MAX_TABLE_ROWS]
        hidden = len(cmp.rows) - len(rows)
        cols, shown = table_rows(cmp, units, alpha, rows, threshold_pct)
        verdict_col = cols.index("verdict")
        t = report.table(title, [safe.term_markup(c) for c in cols])
        for cells in shown:
            t.add_row(*(T(c) for c in cells), style=_STYLE.get(cells[verdict_col]))
        out.append(t)
        if hidden:
            out.append(Text(f"{hidden} of {len(cmp.rows)} rows not listed (same, or beyond the first {MAX_TABLE_ROWS} "
                            "others); --format markdown or json list every figure."))
        if any("†" in x for cells in shown for x in cells):
            out.append(Text(MEDIANS_NOTE))
        out.append(T(summary_line(cmp)))  # it names the worst figure by its params, strings from the file
        out.extend(T(x) for x in undecided_lines(cmp))
    out.extend(Text(x) for x in method_lines(threshold_pct, alpha, units, metrics))
    return out


def format_markdown(cmps: Sequence[Comparison], *, threshold_pct: float, alpha: float, units: str = "GB") -> list[str]:
    """Lines of GitHub markdown (for a pull-request comment): the same columns as the table."""
    md = safe.markdown
    lines: list[str] = []
    metrics: set[str] = set().union(*(cmp.metrics() for cmp in cmps))
    for cmp in cmps:
        c = cmp.counts()
        lines.append(f"### gpubench {md(cmp.command)}: {md(cmp.new_name)} vs base {md(cmp.base_name)}")
        lines.append("")
        head = "".join(f"**{c[v]} {text} " for v, text in _MARKDOWN_HEADS if c[v])
        lines.append(head + md(summary_line(cmp)))
        lines.append("")
        if cmp.env_diff:
            lines += ["| what differs | base | new |", "| --- | --- | --- |"]
            lines += [f"| {md(w)} | {md(b)} | {md(n)} |" for w, b, n in cmp.env_diff]
        else:
            lines.append("Same machine and options.")
        lines.append("")
        for n in cmp.notes:
            lines += [f"> note: {md(n)}", ""]
        shown = sorted((r for r in cmp.rows if r.status in ("paired", "no-data")), key=_markdown_order)
        one_side = [r for r in cmp.rows if r.status in ("only-base", "only-new")]
        cols, body = table_rows(cmp, units, alpha, shown, threshold_pct)
        lines += _markdown_table(cols, body) if body else []
        if any("†" in x for cells in body for x in cells):
            lines += [md(MEDIANS_NOTE, limit=10_000), ""]
        if one_side:
            c_base, c_new = c["only-base"], c["only-new"]
            lines += ["<details>", f"<summary>{c_base} figure(s) only in base, {c_new} only in new</summary>", ""]
            lines += _markdown_table(*table_rows(cmp, units, alpha, one_side, threshold_pct))
            lines += ["</details>", ""]
        lines += [md(x, limit=10_000) for x in undecided_lines(cmp)] + ([""] if undecided_lines(cmp) else [])
    # our own text, escaped for markdown all the same (no clipping: it is not from a file)
    lines.append("<sub>" + " ".join(md(x, limit=10_000) for x in method_lines(threshold_pct, alpha, units, metrics))
                 + "</sub>")
    return lines


_ORDER = {SLOWER: 0, INCONCLUSIVE: 2, FASTER: 4, SAME: 6}
# the bold counts a markdown comparison opens with, in this order where not 0
_MARKDOWN_HEADS = ((SLOWER, "figure(s) slower.**"),
                   (UNDECIDABLE, "undecidable** (changed beyond the threshold; too few samples to decide)."),
                   (INCONCLUSIVE, "inconclusive** (changed beyond the threshold, not significant)."))


def _markdown_order(r: Row) -> tuple[int, float]:
    """Rows a reviewer must see first: slower, undecidable slowdowns, inconclusive, undecidable
    gains, faster, without data, same; the biggest loss first within each."""
    if r.status != "paired":
        return 5, 0.0
    return _ORDER.get(r.verdict, 1 if _gain(r) < 0 else 3), _gain(r)


def _markdown_table(cols: list[str], body: list[list[str]]) -> list[str]:
    """A GitHub table of ``cols`` and ``body`` cells, verdicts other than "same" in bold."""
    md = safe.markdown
    verdict_col = cols.index("verdict")
    lines = ["| " + " | ".join(md(x) for x in cols) + " |",
             "| " + " | ".join("---" if i < verdict_col - 6 or i >= verdict_col else "---:" for i in range(len(cols)))
             + " |"]
    for cells in body:
        out = [md(x) for x in cells]
        if cells[verdict_col] in (SLOWER, FASTER, INCONCLUSIVE, UNDECIDABLE):
            out[verdict_col] = f"**{out[verdict_col]}**"
        lines.append("| " + " | ".join(out) + " |")
    return lines + [""]


def format_json(cmps: Sequence[Comparison], *, threshold_pct: float, alpha: float) -> dict:
    """A JSON-able dict: the method, then each comparison (medians in B/s or seconds, changes in %)."""
    return {
        "schema": "gpubench.analysis.compare",
        "schema_version": 3,
        "method": {"test": "mann-whitney-u two-sided: exact for small samples (with ties: the exact "
                           "permutation distribution), else the normal approximation with tie and "
                           "continuity corrections",
                   "change": "hodges-lehmann estimate of new/base - 1 (median of pairwise log ratios), percent",
                   "interval": f"moses distribution-free interval at {1 - alpha:g} confidence (hollander & wolfe 4.3)",
                   "verdicts": {SAME: "|change| <= threshold", FASTER: "beyond the threshold, better, p < alpha",
                                SLOWER: "beyond the threshold, worse, p < alpha",
                                INCONCLUSIVE: "beyond the threshold, p >= alpha",
                                UNDECIDABLE: "beyond the threshold; the sample sizes cannot reach p < alpha"},
                   "alpha": alpha, "threshold_pct": threshold_pct,
                   "values": {"bandwidth": "B/s per sample, higher is better", "time": "seconds, lower is better"}},
        "comparisons": [c.to_dict() for c in cmps],
        "regressions": sum(len(c.regressions()) for c in cmps),
        "inconclusive": sum(len(c.inconclusive()) for c in cmps),
        "undecidable_slower": sum(len(c.undecidable(slower_only=True)) for c in cmps),
    }

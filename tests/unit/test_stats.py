import math

import numpy as np
import pytest

from gpubench.core.stats import Summary, rates


@pytest.mark.parametrize("seed,n", [(0, 1), (1, 2), (2, 5), (3, 10), (4, 101)])
def test_summary_matches_numpy(seed, n):
    x = np.random.default_rng(seed).lognormal(size=n)
    s = Summary.of(list(x))
    assert s.n == n
    assert s.median == pytest.approx(np.median(x))
    assert s.mean == pytest.approx(np.mean(x))
    assert s.min == x.min() and s.max == x.max()
    assert s.p25 == pytest.approx(np.percentile(x, 25))
    assert s.p75 == pytest.approx(np.percentile(x, 75))
    expected_sd = np.std(x, ddof=1) if n > 1 else 0.0
    assert s.stdev == pytest.approx(expected_sd)
    assert s.cv == pytest.approx(expected_sd / np.mean(x))


def test_summary_known_values():
    s = Summary.of([4, 1, 3, 2])
    assert (s.median, s.p25, s.p75, s.min, s.max) == (2.5, 1.75, 3.25, 1, 4)
    assert s.stdev == pytest.approx(math.sqrt(5 / 3))


def test_summary_rejects_empty_and_nan():
    with pytest.raises(ValueError):
        Summary.of([])
    with pytest.raises(ValueError):
        Summary.of([1.0, float("nan")])


def test_rates():
    assert rates(1e9, [0.5, 2.0]) == [2e9, 5e8]
    with pytest.raises(ValueError):
        rates(1, [0.0])


# ---- the median's distribution-free confidence interval (the "noise" of the stopping rule) ----

from gpubench.core.stats import median_ci_rank, median_noise  # noqa: E402


def _binom_cdf(k: int, n: int) -> float:
    return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n


@pytest.mark.parametrize("n", [1, 5, 6, 7, 10, 11, 25, 50, 100, 399, 400])
def test_median_ci_rank_is_the_largest_rank_with_the_coverage(n):
    k = median_ci_rank(n)
    if k == 0:
        assert 1 - 2 * _binom_cdf(0, n) < 0.95  # even [x_(1), x_(n)] covers less than 95%
        return
    assert 1 - 2 * _binom_cdf(k - 1, n) >= 0.95  # [x_(k), x_(n+1-k)] covers at least 95%
    assert 1 - 2 * _binom_cdf(k, n) < 0.95  # and k + 1 would not


def test_median_ci_rank_by_hand_and_its_normal_approximation():
    assert [median_ci_rank(n) for n in (5, 6, 10, 100)] == [0, 1, 2, 40]  # n = 10: P(B <= 1) = 11/1024
    for n in (401, 1000, 5000):  # beyond the exact table: within one rank of the exact answer
        exact = max(k for k in range(n // 2 + 1) if _binom_cdf(k - 1, n) <= 0.025) if n <= 1000 else None
        if exact is not None:
            assert abs(median_ci_rank(n) - exact) <= 1


def test_median_noise_by_hand():
    xs = [float(v) for v in range(1, 11)]  # n = 10: k = 2, the interval [x_(2), x_(9)] = [2, 9]
    assert median_noise(xs) == pytest.approx((9 - 2) / 2 / 5.5)
    assert median_noise([1.0] * 5) is None  # no 95% interval from 5 samples
    assert median_noise([0.0] * 10) is None


def test_median_noise_shrinks_with_samples_and_covers_the_true_median():
    rng = np.random.default_rng(3)
    small = median_noise(sorted(rng.lognormal(0, 0.05, 20)))
    large = median_noise(sorted(rng.lognormal(0, 0.05, 2000)))
    assert large < small / 5  # about 1/sqrt(n)
    hits = 0
    for _ in range(400):
        xs = sorted(rng.lognormal(0, 0.1, 30))  # true median 1
        k = median_ci_rank(30)
        hits += xs[k - 1] <= 1.0 <= xs[30 - k]
    assert hits / 400 >= 0.93

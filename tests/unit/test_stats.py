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

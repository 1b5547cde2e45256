"""gpu.Pattern without a GPU: the chunked fill writes exactly pattern()'s bytes (also across chunk
and period boundaries), its complement as poison, and matches() catches one wrong byte."""

from __future__ import annotations

import numpy as np
import pytest

from gpubench.core import gpu


@pytest.fixture
def small_chunks(monkeypatch):
    # 3 periods per chunk, so a few MiB cross several chunk boundaries
    monkeypatch.setattr(gpu.Pattern, "CHUNK_BYTES", 3 * gpu._PATTERN_LEN)


@pytest.mark.parametrize("n", [1, 4096, gpu._PATTERN_LEN - 1, gpu._PATTERN_LEN + 7, 10 * gpu._PATTERN_LEN + 123])
def test_fill_equals_pattern_and_poison_is_its_complement(n, small_chunks):
    p = gpu.Pattern(n, seed=n)
    buf = np.zeros(n, dtype=np.uint8)
    p.fill(buf)
    assert np.array_equal(buf, gpu.pattern(n, seed=n)) and p.matches(buf)
    p.fill(buf, invert=True)
    assert np.array_equal(buf, ~gpu.pattern(n, seed=n)) and not p.matches(buf)


def test_one_wrong_byte_in_the_last_chunk_is_caught(small_chunks):
    n = 7 * gpu._PATTERN_LEN + 5
    p = gpu.Pattern(n, seed=3)
    buf = np.empty(n, dtype=np.uint8)
    p.fill(buf)
    buf[-1] ^= 1
    assert not p.matches(buf)
    buf[-1] ^= 1
    assert p.matches(buf) and p.matches(buf[:1000])  # a prefix checks against the pattern's prefix


def test_chunks_cover_the_bytes_once_in_order(small_chunks):
    n = 5 * gpu._PATTERN_LEN + 17
    offs = [(off, len(c)) for off, c in gpu.Pattern(n).chunks()]
    assert offs[0][0] == 0 and sum(k for _, k in offs) == n
    assert all(a + k == b for (a, k), (b, _) in zip(offs, offs[1:]))
    assert max(k for _, k in offs) <= gpu.Pattern.CHUNK_BYTES

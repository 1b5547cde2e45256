"""overlap on a real GPU: serial and overlapped outputs are right; at default settings the
overlapped run is never slower than the serial one beyond noise."""

from __future__ import annotations

import pytest

from gpubench.plugins.overlap.bench import OverlapSpec, run
from gpubench.core.timing import TimingPlan

pytestmark = pytest.mark.gpu


def test_output_checked_small():
    spec = OverlapSpec(nbytes=(4 << 20) + 12, works=(0, 3, 100), streams=3, chunks=7,
                       plan=TimingPlan(warmup=1, iters=3))
    result = run(spec)
    assert len(result.records) == 3 * 5
    for r in result.records:
        assert r.error is None, r.error
        assert all(t > 0 for t in r.samples_s)
        if r.params["stage"] in ("serial", "overlapped"):
            assert r.extra["verified"] is True, (r.params, r.extra)


def test_overlap_not_slower_than_serial_at_defaults():
    spec = OverlapSpec(nbytes=256 << 20, plan=TimingPlan(warmup=2, iters=10))
    result = run(spec)
    for r in result.records:
        if r.params["stage"] == "overlapped":
            assert r.extra["verified"] is True
            # noise: 5% of the serial time
            assert r.extra["speedup_vs_serial"] > 0.95, (r.params, r.extra)
            # nothing beats the slowest stage by more than noise
            assert r.extra["ratio_to_longest_stage"] > 0.95, (r.params, r.extra)

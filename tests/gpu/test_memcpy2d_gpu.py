"""memcpy2d on a real GPU: the window arrives and nothing around it changes, for every strategy,
direction and host memory; cudaMemcpy2DAsync beats the row loop."""

from __future__ import annotations

import pytest

from gpubench.plugins.memcpy2d.bench import Memcpy2dSpec, run
from gpubench.core.timing import TimingPlan

pytestmark = pytest.mark.gpu


def test_window_and_guards_every_strategy():
    spec = Memcpy2dSpec(points=((4096, 256, 16384, 4096), (64, 1000, 192, 128), (1000, 33, 1000, 3000)),
                        memory=("pinned", "pageable"), plan=TimingPlan(warmup=1, iters=3))
    result = run(spec)
    assert not result.partial
    # per point: (h2d, d2h) x 2 memory x 4 strategies + d2d x 4 strategies
    assert len(result.records) == 3 * (2 * 2 * 4 + 4)
    for r in result.records:
        assert r.error is None, (r.params, r.error)
        assert r.extra["verified"] is True, r.params
        assert r.extra["untouched"] is True, r.params
        assert all(t > 0 for t in r.samples_s)


def test_2d_beats_row_loop():
    spec = Memcpy2dSpec(points=((4096, 4096, 16384, 4096),), strategies=("2d", "row-loop"),
                        plan=TimingPlan(warmup=1, iters=5))
    result = run(spec)
    t = {(r.params["direction"], r.params["strategy"]): r.time_summary().median for r in result.records}
    for d in ("h2d", "d2h", "d2d"):
        assert t[(d, "2d")] < t[(d, "row-loop")], (d, t)

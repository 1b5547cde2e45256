"""batch on a real GPU: every strategy delivers the right pieces to the right places; packed and
contiguous beat separate at 4 KiB pieces; a skipped batched-api says why; JSON round trip."""

from __future__ import annotations

import pytest

from gpubench.plugins.batch.bench import BatchSpec, batch_api, run
from gpubench.core.result import load, save
from gpubench.core.timing import TimingPlan

pytestmark = pytest.mark.gpu


def test_every_strategy_verified():
    spec = BatchSpec(points=((256, 4096), (33, 1000)), plan=TimingPlan(warmup=1, iters=3))
    result = run(spec)
    assert not result.partial
    # 2 points x 2 memory x 2 directions x (separate, packed, packed+gather, batched-api, contiguous)
    assert len(result.records) == 2 * 2 * 2 * 5
    api, why = batch_api()
    for r in result.records:
        if r.params["strategy"] == "batched-api" and api is None:
            assert r.error and r.error.startswith("skipped: ") and why in r.error
            continue
        assert r.error is None, (r.params, r.error)
        assert r.extra["verified"] is True, r.params
        assert len(r.samples_s) == 3 and all(t > 0 for t in r.samples_s)
        assert r.extra["time_per_piece_us"] > 0


def test_packed_and_contiguous_beat_separate_at_4KiB():
    spec = BatchSpec(points=((4096, 4096),), strategies=("separate", "packed", "contiguous"),
                     plan=TimingPlan(warmup=1, iters=5))
    result = run(spec)
    t = {(r.params["direction"], r.params["memory"], r.params["strategy"]): r.time_summary().median
         for r in result.records}
    for d in ("h2d", "d2h"):
        for m in ("pinned", "pageable"):
            assert t[(d, m, "packed")] < t[(d, m, "separate")], (d, m, t)
            assert t[(d, m, "contiguous")] < t[(d, m, "separate")], (d, m, t)


def test_no_gate_and_json_round_trip(tmp_path):
    spec = BatchSpec(points=((512, 4096),), strategies=("separate", "contiguous"), memory=("pinned",),
                     directions=("h2d",), plan=TimingPlan(warmup=1, iters=3), gate=False)
    result = run(spec)
    assert all(r.extra["verified"] for r in result.records)
    assert all(r.extra["gated"] is False for r in result.records)
    again = load(save(result, tmp_path / "batch.json"))
    assert [r.samples_s for r in again.records] == [r.samples_s for r in result.records]
    assert again.records[0].extra["speedup_vs_separate"] == pytest.approx(1.0)

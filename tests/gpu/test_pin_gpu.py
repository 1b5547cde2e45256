"""pin on a real GPU: every operation and phase measured, times positive and growing with the size,
the driver's JSON carrying them."""

from __future__ import annotations

import pytest

from gpubench.plugins.pin.bench import PinSpec, run
from gpubench.core.timing import TimingPlan

pytestmark = pytest.mark.gpu


def test_every_operation_and_phase_is_measured_and_larger_pins_cost_more():
    spec = PinSpec(sizes=(1 << 20, 64 << 20), plan=TimingPlan(warmup=1, iters=3))
    result = run(spec)
    assert not result.partial and len(result.records) == 3 * 2 * 2
    by = {(r.params["operation"], r.params["phase"], r.nbytes): r for r in result.records}
    for r in result.records:
        assert r.error is None and len(r.samples_s) == 3 and all(t > 0 for t in r.samples_s), r.params
    for op in ("host-alloc", "host-register"):
        first = "alloc" if op == "host-alloc" else "register"
        # locking 64x the pages takes longer than locking 1 MiB
        assert by[(op, first, 64 << 20)].time_summary().median > by[(op, first, 1 << 20)].time_summary().median

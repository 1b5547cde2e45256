"""plot draws real merge results (bars per worker pair) and net results (rate per interval)."""

from pathlib import Path

import pytest

from gpubench import plot
from gpubench.core.result import load

DATA = Path(__file__).resolve().parent.parent / "data"


def test_merge_and_net_panels_from_real_results(tmp_path):
    pytest.importorskip("matplotlib")
    merge = load(DATA / "merge-cpu.json")
    net = load(DATA / "net-local.json")
    panels = plot.build_panels([("merge", merge), ("net", net)])
    kinds = {p.kind: p for p in panels}
    assert set(kinds) == {"pairs", "intervals"}
    pairs = plot._pair_summaries(kinds["pairs"].series[0][1], "GB")
    assert set(pairs) == {"(0,1)", "(1,0)"}
    for s in pairs.values():
        assert 0 < s.p25 <= s.median <= s.p75
    assert {label for label, _ in kinds["intervals"].series} == {"stream=0 [net]", "stream=1 [net]", "stream=total [net]"}
    out = plot.render([("merge", merge), ("net", net)], tmp_path / "mn.png", size_in=(8, 3), dpi=50)
    from PIL import Image

    with Image.open(out) as im:
        assert im.size == (400, 150)

"""benchmarks/stopping_vs_today.py's judgement of saved runs (no GPU: the runs are written here,
each record's samples drawn so the run-to-run spread of a point's median is known)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "stopping_vs_today.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("stopping_vs_today", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


POINTS = [(m, d, n) for m in ("pinned", "pageable") for d in ("h2d", "d2h") for n in (4096, 1 << 20, 1 << 26)]


def _write_run(path: Path, medians_s: dict, n: int = 50) -> None:
    """One saved copy result: each point's samples are median * (1 + small symmetric offsets)."""
    offs = np.linspace(-0.01, 0.01, n)
    recs = [{"params": {"memory": m, "direction": d, "nbytes": nb}, "nbytes": nb, "reps": 1,
             "samples_s": sorted(float(medians_s[(m, d, nb)] * (1 + o)) for o in offs),
             "extra": {"stopped_by": "noise"}} for (m, d, nb) in POINTS]
    path.write_text(json.dumps({"records": recs}))


def _folder(tmp_path: Path, spreads: dict[str, dict[str, float]], rounds: int, walls: dict[str, float]) -> Path:
    """Saved runs whose point medians take, over the rounds, values evenly spread over +-spread/2
    of 1 ms (so (max - min) / median is the spread), per rule and memory kind."""
    runs = []
    for rnd in range(rounds):
        for rule, by_kind in spreads.items():
            frac = (rnd / (rounds - 1) - 0.5)
            med = {p: 1e-3 * (1 + by_kind[p[0]] * frac) for p in POINTS}
            f = f"{rule}-{rnd}.json"
            _write_run(tmp_path / f, med)
            runs.append({"rule": rule, "round": rnd, "file": f, "wall_s": walls[rule] + 0.01 * rnd})
    (tmp_path / "runs.json").write_text(json.dumps({"rules": {r: "" for r in spreads}, "runs": runs}))
    return tmp_path


def test_half_the_spread_of_pinned_points_is_lower_there_and_the_pageable_ones_stay_the_same(bench, tmp_path):
    f = _folder(tmp_path, {"fixed": {"pinned": 0.04, "pageable": 0.10},
                           "default": {"pinned": 0.02, "pageable": 0.10}}, rounds=6,
                walls={"fixed": 13.0, "default": 10.0})
    v = bench.verdict(bench.analyse(f), "fixed")["default"]
    assert v["rounds"] == 6 and v["faster_in_every_round"] and v["wall_ratio_mean"] == pytest.approx(10.025 / 13.025)
    pin = v["spread"]["pinned"]
    # the medians of rates (nbytes / t) move by the same fraction as t to first order
    assert pin["points"] == 6 and pin["ratio"] == pytest.approx(0.5, rel=0.02) and pin["verdict"] == "lower"
    assert pin["median_pct"] == pytest.approx(2.0, rel=0.02) and pin["base_median_pct"] == pytest.approx(4.0, rel=0.02)
    page = v["spread"]["pageable"]
    assert page["ratio"] == pytest.approx(1.0) and page["ci95"][0] <= 1 <= page["ci95"][1]
    assert page["verdict"] == "not higher"


def test_identical_runs_are_not_higher_and_twice_the_spread_everywhere_is_higher(bench, tmp_path):
    (tmp_path / "a").mkdir()
    same = _folder(tmp_path / "a", {"fixed": {"pinned": 0.03, "pageable": 0.08},
                                    "default": {"pinned": 0.03, "pageable": 0.08}}, rounds=4,
                   walls={"fixed": 10.0, "default": 10.0})
    v = bench.verdict(bench.analyse(same), "fixed")["default"]
    assert v["spread"]["all"]["ratio"] == pytest.approx(1.0) and v["spread"]["all"]["verdict"] == "not higher"
    assert not v["faster_in_every_round"]
    (tmp_path / "b").mkdir()
    worse = _folder(tmp_path / "b", {"fixed": {"pinned": 0.02, "pageable": 0.05},
                                     "default": {"pinned": 0.04, "pageable": 0.10}}, rounds=4,
                    walls={"fixed": 10.0, "default": 9.0})
    w = bench.verdict(bench.analyse(worse), "fixed")["default"]["spread"]["all"]
    assert w["ratio"] == pytest.approx(2.0, rel=0.03) and w["ci95"][0] > 1 and w["verdict"] == "higher"


def test_the_interval_is_the_same_for_the_same_saved_runs_and_a_zero_baseline_is_infinite(bench):
    pairs = [(1.0 + i % 3, 0.5 + i % 5) for i in range(20)]
    assert bench._median_ratio_ci(pairs) == bench._median_ratio_ci(pairs)
    r, lo, hi = bench._median_ratio_ci(pairs)
    assert lo <= r <= hi
    assert math.isinf(bench._median_ratio_ci([(0.0, 1.0), (0.0, 2.0)])[0])

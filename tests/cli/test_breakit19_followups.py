"""Break-it pass over issue 19 (brk19): compare verdicts, limit flags on saved results, hostile
telemetry and idle-check blocks, --numa values. Each test failed before its fix.

Inputs are real results from tests/data with their samples or blocks edited, written with
json.dumps (no indent: hand-made inputs, which the session's schema check leaves alone).
"""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
import synth  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data"
BUG_LINE = "run with --debug for the traceback"
GIB = 2**30


def one_line(err: str) -> str:
    assert "Traceback" not in err and BUG_LINE not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpubench: error: "), err
    return lines[0]


def pinned(n: int = 1) -> dict:
    """The real pinned copy result cut to its last ``n`` records (1 GiB d2h last)."""
    d = json.loads(synth.REAL_PINNED.read_text())
    d["records"] = d["records"][-n:]
    return d


def write(tmp_path: Path, name: str, d: dict) -> str:
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(d))
    return str(p)


def with_rate(d: dict, gbps: float, **extra) -> dict:
    d = copy.deepcopy(d)
    r = d["records"][0]
    r["samples_s"] = [r["nbytes"] / (gbps * 1e9 * f) for f in (1.0, 1.01, 0.99, 1.002, 0.998, 1.003)]
    r["extra"].update(extra)
    return d


def nccl_one_rank_in_place(seconds: float, **extra) -> dict:
    """The real nccl result's first in-place record made a one-rank run (the issue's no-op case)."""
    d = json.loads((DATA / "nccl-h200x2.json").read_text())
    r = copy.deepcopy(next(r for r in d["records"] if r["params"]["placement"] == "in-place"))
    r["params"]["nranks"] = 1
    r["samples_s"] = [seconds * f for f in (1.0, 1.01, 0.99, 1.002, 0.998)]
    rate = r["nbytes"] / seconds
    r["extra"].update(algbw_bytes_per_s=rate, busbw_bytes_per_s=rate, **extra)
    d["records"] = [r]
    return d


def legend_texts(fig) -> list[str]:
    fig = fig[0] if isinstance(fig, tuple) else fig
    return [t.get_text() for sf in fig.subfigs for lg in sf.legends for t in lg.get_texts()]


def html_text(path: str) -> str:
    import html

    t = Path(path).read_text()
    t = re.sub(r"<img[^>]*>", "", t)
    t = re.sub(r"<style.*?</style>", "", t, flags=re.S)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", t)))


# ---- area 2: nothing above a physical limit prints plain from a saved file ----

LIMIT_CASES = {
    # the case: one rank, in place, saved with limit_flag "no_op" (and above_peak false)
    "no-op saved": lambda: nccl_one_rank_in_place(3.41e-6, no_op="one rank, in place: NCCL moves no data",
                                                   limit_flag="no_op", above_peak=False, peak_bytes_per_s=None),
    # the same from a file written before limit_flag existed: the params say it
    "no-op older file": lambda: nccl_one_rank_in_place(3.41e-6),
    # limit_flag "above_peak" without the older boolean
    "limit_flag only": lambda: with_rate(pinned(), 100.0, peak_bytes_per_s=63.0e9, pct_of_peak=158.7,
                                         limit_flag="above_peak"),
    # samples edited above the saved peak, the saved flags stale
    "stale flag": lambda: with_rate(pinned(), 100.0, peak_bytes_per_s=63.0e9, pct_of_peak=50.0,
                                    above_peak=False, limit_flag=None),
}


@pytest.mark.parametrize("case", list(LIMIT_CASES))
def test_compare_flags_a_saved_figure_beyond_its_limit(run_cli, tmp_path, case):
    new = LIMIT_CASES[case]()
    base = copy.deepcopy(new)
    base["records"][0]["samples_s"] = [t * 1.05 for t in base["records"][0]["samples_s"]]
    b, n = write(tmp_path, "base", base), write(tmp_path, "new", new)
    for fmt in ("table", "markdown", "json"):
        code, out, err = run_cli("compare", b, n, "--format", fmt)
        assert code == 0, err
        if fmt == "json":
            flags = json.loads(out)["comparisons"][0]["rows"][0]["flags"]
            assert any(f.startswith("new ") and ("no-op" in f or "above a physical limit" in f) for f in flags), flags
        else:
            assert "no-op" in out or "above a physical limit" in out, out


@pytest.mark.parametrize("case", list(LIMIT_CASES))
def test_report_flags_a_saved_figure_beyond_its_limit(run_cli, tmp_path, case):
    src = write(tmp_path, "r", LIMIT_CASES[case]())
    out = str(tmp_path / "r.html")
    code, _, err = run_cli("report", src, "-o", out, "-q")
    assert code == 0, err
    text = html_text(out)
    assert "Nothing flagged" not in text and "No flags" not in text, text[:600]
    assert "above peak" in text or "no-op" in text
    if case == "stale flag":  # the % of peak is the samples', not the stale saved 50%
        assert "159%" in text and " 50% " not in text


def test_plot_marks_a_saved_figure_beyond_its_limit():
    from gpubench import plot
    from gpubench.core.result import Result

    for case, labels in (("no-op saved", plot.NO_OP_LABEL), ("stale flag", plot.ABOVE_LABEL),
                         ("limit_flag only", plot.ABOVE_LABEL)):
        res = Result.from_dict(LIMIT_CASES[case]())
        texts = legend_texts(plot.figure([(case, res)]))
        assert labels in texts, (case, texts)


def test_plot_bars_mark_a_figure_above_its_limit():
    from gpubench import plot
    from gpubench.core.result import Result

    d = json.loads((DATA / "batch-h200.json").read_text())
    d["records"][0]["extra"].update(peak_bytes_per_s=1e9, above_peak=False)
    texts = legend_texts(plot.figure([("batch", Result.from_dict(d))]))
    assert plot.ABOVE_LABEL in texts, texts


def test_saved_flag_rules():
    from gpubench.core import limits
    from gpubench.core.result import Result

    def rec(d):
        return Result.from_dict(d).records[0]

    assert limits.saved_flag(rec(with_rate(pinned(), 54.0, peak_bytes_per_s=63.0e9))) is None
    assert limits.saved_flag(rec(with_rate(pinned(), 54.0))) is None  # no peak known: nothing to hold against
    assert limits.saved_flag(rec(with_rate(pinned(), 64.0, peak_bytes_per_s=63.0e9))) == "above_peak"
    # NVLS: a busbw above the links' sum the run marked as possible NVLS stays "nvls", not impossible
    d = nccl_one_rank_in_place(1e-5, peak_bytes_per_s=1e9, above_links_nvls=True)
    d["records"][0]["params"].update(nranks=8, placement="out-of-place")
    assert limits.saved_flag(rec(d)) == "nvls"
    # busbw, not algbw, of several ranks is held against the links: factor 2 lifts 0.6 over 1.0
    d = nccl_one_rank_in_place(1.0, peak_bytes_per_s=1.0e9)
    r = d["records"][0]
    r["params"].update(nranks=2, placement="out-of-place")
    r["samples_s"] = [r["nbytes"] / 0.6e9] * 5
    r["extra"]["busbw_factor"] = 2.0
    assert limits.saved_flag(rec(d)) == "above_peak"
    r["extra"]["busbw_factor"] = 1.0
    assert limits.saved_flag(rec(d)) is None
    # malformed values are ignored, never raised on
    d = with_rate(pinned(), 54.0, peak_bytes_per_s="x", limit_flag=["no_op"], above_peak="yes", no_op=7)
    assert limits.saved_flag(rec(d)) is None

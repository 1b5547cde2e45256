"""report: the HTML page's content, read as text (the browser test renders it: tests/cli/
test_report_browser.py). The fleet bundle is constructed here in the shape the fleet work writes
(htmlreport.check_fleet's docstring), since no run of it is in tests/data yet."""

from __future__ import annotations

import copy
import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
import synth  # noqa: E402

from gpubench.analysis import html as htmlreport  # noqa: E402
from gpubench.core.errors import UsageError  # noqa: E402
from gpubench.core.result import load, save  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data"
ALL_FIXTURES = sorted(str(p) for p in DATA.glob("*.json"))


def fleet_object() -> dict:
    """A fleet of 3 hosts x 2 GPUs (one rank missing), checked on H2D copy bandwidth."""
    rows = []
    for rank, host in enumerate(("node-a", "node-b", "node-c")):
        for gpu in (0, 1):
            value = 53.1 if (host, gpu) != ("node-b", 1) else 41.7
            flag = "ok" if value > 50 else "slow"
            rows.append({"host": host, "rank": rank, "gpu": gpu, "uuid": f"GPU-{host}-{gpu}", "check": "copy h2d 1 GiB",
                         "value": value, "unit": "GB/s", "fleet_median": 53.1, "expect": 50.0, "flag": flag})
    rows.append({"host": "node-d", "rank": 3, "gpu": None, "uuid": None, "check": "copy h2d 1 GiB", "value": None,
                 "unit": "GB/s", "fleet_median": 53.1, "expect": 50.0, "flag": "missing"})
    return {"kind": "gpubench-fleet", "version": 1,
            "rule": {"name": "median-10pct", "text": "a GPU more than 10% below the fleet median is slow"},
            "missing": [{"rank": 3, "host": "node-d"}], "rows": rows,
            "links": {"hosts": ["node-a", "node-b", "node-c"],
                      "gbps": [[None, 23.4, 23.1], [23.5, None, 11.2], [23.0, 11.4, None]]}}


def fleet_bundle(tmp_path: Path) -> Path:
    from gpubench.validation import suite

    res = load(DATA / "copy-pinned-h200.json")
    b = suite.Bundle(steps=[suite.Step("copy", "copy", "ok", result=res, path="suite-x-copy.json")], env=res.env)
    d = b.to_dict()
    d["fleet"] = fleet_object()
    p = tmp_path / "suite-fleet.json"
    p.write_text(json.dumps(d))
    return p


class Text(HTMLParser):
    """Visible text, tags seen and every URL-bearing attribute."""

    def __init__(self):
        super().__init__()
        self.text, self.tags, self.urls = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for k, v in attrs:
            if k in ("src", "href", "action", "poster", "data") and v:
                self.urls.append(v)

    def handle_data(self, data):
        self.text.append(data)


def parse(html: str) -> Text:
    t = Text()
    t.feed(html)
    return t


@pytest.fixture(scope="module")
def page() -> str:
    return htmlreport.build(htmlreport.read_inputs(ALL_FIXTURES), created="2026-12-01T00:00:00+00:00")


def test_the_page_is_self_contained_and_has_no_script(page):
    t = parse(page)
    assert "script" not in t.tags and "link" not in t.tags and "iframe" not in t.tags
    assert all(u.startswith(("data:image/png;base64,", "#r")) for u in t.urls), [u[:40] for u in t.urls]
    assert "default-src 'none'; img-src data:" in page
    assert not re.search(r"https?://", page.replace("http-equiv", ""))
    assert "@media print" in page


def test_every_result_has_its_table_and_plot(page):
    t = parse(page)
    text = " ".join(t.text)
    for name in ALL_FIXTURES:
        assert f": {Path(name).name}" in text
    assert sum(u.startswith("data:image/png") for u in t.urls) == len(ALL_FIXTURES)


def test_the_figures_of_the_input_are_in_the_tables(page):
    from gpubench.core.units import UNITS

    res = load(DATA / "nccl-h200x2.json")
    r = next(r for r in res.records if r.params["nbytes"] == 2**30 and r.params["placement"] == "out-of-place")
    median = r.rate_summary().median / UNITS["GB"]
    assert f"<td class=num>{median:.1f}</td>" in page  # algbw of the 1 GiB all-reduce as the table prints it
    p2p = load(DATA / "p2p-h200x2.json")
    write = next(r for r in p2p.records if r.params.get("test") == "write" and r.params["src"] == 0)
    assert f"{write.rate_summary().median / 1e9:.1f}" in page


def test_the_net_table_shows_each_streams_gbit_per_s():
    res = load(DATA / "net-local.json")
    html = htmlreport.records_table(res, "GB")
    assert "<th>overall Gbit/s</th>" in html
    for r in res.records:
        assert f"<td class=num>{htmlreport._fmt(r.extra['gbit_per_s'])}</td>" in html
    copy_table = htmlreport.records_table(load(DATA / "copy-pinned-h200.json"), "GB")
    assert "Gbit/s" not in copy_table  # only where a record carries the figure


def test_results_are_compared_only_against_a_baseline_asked_for(page):
    assert "Comparison:" not in page and "against base" not in page  # two copy results, no --baseline
    base = str(DATA / "copy-all-h200.json")
    with_base = htmlreport.build(htmlreport.read_inputs(ALL_FIXTURES, baseline=base), created="2026-12-01T00:00:00+00:00")
    assert "Comparison: copy" in with_base
    assert "copy-pinned-h200.json against base copy-all-h200.json (baseline)" in with_base
    assert "Mann-Whitney" in with_base
    assert with_base.count("<h3>") - page.count("<h3>") == 2  # each copy input (the baseline's own file too)


@pytest.mark.parametrize("name,says", [
    ("net-local.json", "is a result of net and no input is"),
])
def test_a_baseline_of_no_input_command_or_without_figures_is_refused(tmp_path, name, says):
    from gpubench.core.errors import UsageError
    from gpubench.core.result import Result

    with pytest.raises(UsageError, match=says):
        htmlreport.read_inputs([str(DATA / "copy-all-h200.json")], baseline=str(DATA / name))
    env = tmp_path / "env.json"
    save(Result("env", {}, env={}), env)
    with pytest.raises(UsageError, match=r"has no figures \(its command: env\)"):
        htmlreport.read_inputs([str(DATA / "copy-all-h200.json")], baseline=str(env))


def test_flags_partial_above_peak_throttled_failed(tmp_path):
    res = synth.copy_like(5, peak=40e9)
    for r in res.records:
        r.mark_peak(40e9)
    res.records[0].extra["throttled"] = True
    res.records[1].error = "cudaErrorLaunchFailure"
    res.records[1].samples_s = []
    res.partial, res.interrupted_by = True, "SIGINT"
    p = tmp_path / "flagged.json"
    save(res, p)
    html = htmlreport.build(htmlreport.read_inputs([str(p)]))
    text = " ".join(parse(html).text)
    assert "partial (interrupted by SIGINT)" in text
    assert re.search(r"\d+ point\(s\) above peak", text)
    assert "1 point(s) throttled" in text and "1 point(s) failed" in text
    assert "failed: cudaErrorLaunchFailure" in text


def test_the_fleet_table_highlights_outliers_and_shows_the_links(tmp_path):
    html = htmlreport.build(htmlreport.read_inputs([str(fleet_bundle(tmp_path))]))
    assert "Fleet: " in html and "median-10pct" in html
    rows = re.findall(r'<tr class="(\w+)"><td>(node-\w)</td><td>\d</td><td>([\d-]+)</td>', html)
    flagged = {(host, gpu): cls for cls, host, gpu in rows}
    assert flagged == {("node-b", "1"): "warn", ("node-d", "-"): "gone"}
    assert "rank 3 on node-d" in html
    assert "<table class=matrix>" in html and "11.2" in html and "23.5" in html
    assert ">1 slow<" in html and ">1 missing<" in html and ">5 ok<" in html and ">0 fail<" in html


def test_a_folder_of_a_bundle_and_its_step_files_shows_each_result_once(tmp_path):
    b = fleet_bundle(tmp_path)
    step = tmp_path / "suite-x-copy.json"
    save(load(DATA / "copy-pinned-h200.json"), step)
    inputs = htmlreport.read_inputs([str(tmp_path)])
    assert [it.name for it in inputs.items] == [f"{b.name}: copy"] and len(inputs.fleets) == 1


def test_strings_from_files_are_escaped(tmp_path):
    res = synth.copy_like(6)
    evil = "<img src=x onerror=alert(1)>\x1b[2J</td><script>"
    res.records[0].params["memory"] = evil
    res.argv = [evil]
    res.env = {"host": {"hostname": evil}}
    p = tmp_path / "evil.result"  # not *.json: no schema check of a file that is odd on purpose
    p.write_text(json.dumps(res.to_dict()))
    f = fleet_object()
    f["rows"][0]["host"] = evil
    f["rule"]["text"] = evil
    q = tmp_path / "fleet.json"
    q.write_text(json.dumps({"fleet": f}))
    html = htmlreport.build(htmlreport.read_inputs([str(p), str(q)]))
    t = parse(html)
    assert "script" not in t.tags and "img" in t.tags
    assert all(u.startswith(("data:", "#")) for u in t.urls)
    assert "&lt;img src=x onerror=alert(1)&gt;\\x1b[2J&lt;/td&gt;&lt;script&gt;" in html
    assert "\x1b" not in html


def test_a_host_that_is_a_string_is_refused_naming_the_field(tmp_path):
    # the shared loader (core/result.py) refuses it before the report sees it: exit 2, not a crash
    res = synth.copy_like(7)
    res.env = {"host": "not an object", "gpus": "nope"}
    p = tmp_path / "odd.result"
    p.write_text(json.dumps(res.to_dict()))
    with pytest.raises(UsageError, match="/env/host"):
        htmlreport.build(htmlreport.read_inputs([str(p)]))


@pytest.mark.parametrize("change,needle", [
    (lambda f: f.update(version=True), r"fleet\.version is True"),
    (lambda f: f["rows"][0].update(value=float("inf")), r"fleet\.rows\[0\]\.value is inf"),
    (lambda f: f["rows"][0].update(rank="0"), r"fleet\.rows\[0\]\.rank is '0'"),
    (lambda f: f["links"].update(gbps=[[1.0]]), r"fleet\.links\.gbps is '1 rows'"),
    (lambda f: f.update(kind="other"), r"fleet\.kind is 'other'"),
    # present and empty but of the wrong type: refused as a wrong type is, not read as absent
    (lambda f: f.update(rows={}), r"fleet\.rows is \{\}"),
    (lambda f: f.update(missing=""), r"fleet\.missing is ''"),
    (lambda f: f["links"].update(hosts={}), r"fleet\.links is"),
    (lambda f: f.update(missing=[{"rank": "x", "host": None}]), r"fleet\.missing\[0\]\.rank is 'x'"),
    (lambda f: f.update(missing=[{"rank": -1, "host": "h"}]), r"fleet\.missing\[0\]\.rank is -1"),
    (lambda f: f.update(missing=[{"rank": 1, "host": 5}]), r"fleet\.missing\[0\]\.host is 5"),
    (lambda f: f["rows"][0].update(rank=-1), r"fleet\.rows\[0\]\.rank is -1"),
    # beyond the bound the message names it (1e300 is finite)
    (lambda f: f["rows"][0].update(value=1e300), r"value is 1e\+300; expected a number between -1e300 and 1e300"),
    (lambda f: f["rows"][0].update(expect=10**310), r"expect is \d+.*expected a number between -1e300 and 1e300"),
    (lambda f: f["links"].update(gbps=[[None, 1e300, None], [None] * 3, [None] * 3]), r"gbps\[0\]\[1\] is 1e\+300; expected a number "),
])
def test_a_malformed_fleet_is_refused_naming_the_field(change, needle):
    f = copy.deepcopy(fleet_object())
    change(f)
    with pytest.raises(UsageError, match=needle):
        htmlreport.check_fleet(f, "x.json")


def test_write_is_atomic_and_refuses_a_fifo(tmp_path):
    import os

    out = tmp_path / "r.html"
    htmlreport.write([str(DATA / "merge-cpu.json")], out)
    assert out.read_text().startswith("<!DOCTYPE html>")
    fifo = tmp_path / "f.html"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="not a regular file|is a named pipe"):
        htmlreport.write([str(DATA / "merge-cpu.json")], fifo)


def test_a_long_result_table_is_cut_and_says_so():
    from gpubench.core.result import Record, Result

    recs = [Record(params={"direction": "h2d", "nbytes": 4096 * (i + 1)}, nbytes=4096 * (i + 1),
                   samples_s=[1e-6, 1.1e-6]) for i in range(600)]
    html = htmlreport.records_table(Result("copy", {}, records=recs), "GB")
    assert html.count("<tr") == 501 and "First 500 of 600 rows shown." in html


def test_fleet_section_names_the_slow_sender():
    f = {"rule": {"name": "median-mad", "text": "..."}, "rows": [], "missing": [],
         "links": {"hosts": ["n0", "n1"], "gbps": [[None, 1.0], [9.0, None]],
                   "culprits": [{"kind": "sender", "ranks": [0], "confidence": 1.0, "says": "n0 (rank 0) sends <slowly> (1.00)"}]}}
    page = htmlreport._fleet_section("b.json", f)
    assert "<li class=bad>n0 (rank 0) sends &lt;slowly&gt; (1.00)</li>" in page

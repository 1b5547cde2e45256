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
    from gpubench.analysis import plot
    from gpubench.core.result import Result

    for case, labels in (("no-op saved", plot.NO_OP_LABEL), ("stale flag", plot.ABOVE_LABEL),
                         ("limit_flag only", plot.ABOVE_LABEL)):
        res = Result.from_dict(LIMIT_CASES[case]())
        texts = legend_texts(plot.figure([(case, res)]))
        assert labels in texts, (case, texts)


def test_plot_bars_mark_a_figure_above_its_limit():
    from gpubench.analysis import plot
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


# ---- area 1: compare verdicts ----

@pytest.mark.parametrize("side", ["base", "new"])
def test_compare_refuses_two_records_with_the_same_params(run_cli, tmp_path, side):
    """A repeated figure was dropped unseen: a 50% slower repeat in NEW passed --fail-on-regression."""
    good = pinned()
    dup = copy.deepcopy(good)
    slow = copy.deepcopy(dup["records"][0])
    slow["samples_s"] = [t * 2 for t in slow["samples_s"]]
    dup["records"].append(slow)
    files = {"base": write(tmp_path, "good", good), "new": write(tmp_path, "dup", dup)}
    if side == "base":
        files = {"base": files["new"], "new": files["base"]}
    code, out, err = run_cli("compare", files["base"], files["new"], "--fail-on-regression")
    assert code == 2, (out, err)
    line = one_line(err)
    assert "/records/1 has the same params as /records/0" in line and "dup.json" in line


def test_hodges_lehmann_and_moses_interval_by_hand():
    """5 vs 5, new = 0.76 x base: HL exactly -24%; at 99% C = 1 (P(U <= 0) = 1/252 <= 0.005 <
    P(U <= 1) = 2/252), so the interval is [D_(1), D_(25)], the extreme pairwise ratios
    0.76 x 0.99/1.01 and 0.76 x 1.01/0.99; exact p = 2/252. And the overlapping 5 vs 5 of the
    issue's kind: HL the 13th of the 25 sorted log-ratios, p = 14/252 by enumerating the 252 splits."""
    import itertools
    import math

    from gpubench.analysis import compare as C

    f = (1.0, 1.01, 0.99, 1.005, 0.995)
    base = [55e9 * x for x in f]
    j = C.judge(base, [0.76 * v for v in base], "bandwidth", threshold_pct=1.0)
    assert j.shift.change_pct == pytest.approx(-24.0, abs=1e-9)
    assert j.shift.ci_low_pct == pytest.approx(100 * (0.76 * 0.99 / 1.01 - 1), abs=1e-9)
    assert j.shift.ci_high_pct == pytest.approx(100 * (0.76 * 1.01 / 0.99 - 1), abs=1e-9)
    assert j.test.p == pytest.approx(2 / 252) and j.verdict == "slower"

    b, n = [55, 40, 60, 45, 50], [38, 42, 36, 47, 34]
    j = C.judge([x * 1e9 for x in b], [x * 1e9 for x in n], "bandwidth", threshold_pct=1.0)
    d = sorted(math.log(y / x) for y in n for x in b)
    assert j.shift.change_pct == pytest.approx(100 * math.expm1(d[12]))
    assert (j.shift.ci_low_pct, j.shift.ci_high_pct) == pytest.approx((100 * math.expm1(d[0]), 100 * math.expm1(d[24])))
    pool = b + n

    def u(xs, ys):
        return sum((a > c) + 0.5 * (a == c) for a in xs for c in ys)

    u0 = u(n, b)
    hits = sum(abs(u([pool[i] for i in s], [pool[i] for i in range(10) if i not in s]) - 12.5) >= abs(u0 - 12.5)
               for s in itertools.combinations(range(10), 5))
    assert j.test.p == pytest.approx(hits / 252) and hits == 14
    assert j.verdict == "inconclusive"


# ---- area 3: telemetry and idle-check blocks: what the published schema refuses, the loader refuses ----

EV = "\x1b[31mRED\x1b]8;;http://evil\x07link\x1b]8;;\x07\x1b[0m"
HT = "<img src=x onerror=alert(1)>"
GOOD_TELEMETRY = {"n": 12, "interval_s": 0.01, "devices": [0], "sm_clock_mhz": {"min": 1410, "median": 1980, "max": 1980},
                  "mem_clock_mhz": {"min": 3201, "median": 3201, "max": 3201},
                  "power_w": {"min": 120.5, "median": 300.0, "max": 400.25}, "temp_c": {"min": 40, "median": 45, "max": 50},
                  "reasons": ["sw_power_cap"], "pcie": {"gen": 5, "width": 16}, "pcie_replay_delta": 0,
                  "nvlink_errors_delta": None, "other_processes": 0}
GOOD_ENV = {"preflight": {"idle": False, "warnings": ["GPU 0 is not idle: utilisation 99%"], "error": None,
                          "gpus": [{"index": 0, "busy": ["utilisation 99%"], "other_processes": [],
                                    "utilization_gpu_pct": 99, "utilization_memory_pct": 3, "temperature_c": 40,
                                    "slowdown_temp_c": 90}]},
            "numa": {"policy": "auto", "bindings": [{"node": 0, "cpus": "0-1", "reason": "auto: GPU 0's node 0"}]},
            "telemetry": {"enabled": True, "interval_s": 0.01, "error": None}}

CONDITION_MUTATIONS = [
    ("records/0/telemetry/reasons", [EV]), ("records/0/telemetry/reasons", [HT]),
    ("records/0/telemetry/reasons", ["sw_power_cap", "sw_power_cap"]), ("records/0/telemetry/reasons", "sw_power_cap"),
    ("records/0/telemetry/reasons", [{"a": [1]}]), ("records/0/telemetry/sm_clock_mhz", "fast"),
    ("records/0/telemetry/sm_clock_mhz", {"median": 1980}), ("records/0/telemetry/power_w", {"min": "1", "median": 2, "max": 3}),
    ("records/0/telemetry/pcie", {"gen": HT, "width": 16}), ("records/0/telemetry/pcie", "Gen5 x16"),
    ("records/0/telemetry/n", "x"), ("records/0/telemetry/n", -1), ("records/0/telemetry/interval_s", 0),
    ("records/0/telemetry/pcie_replay_delta", 1.5), ("records/0/telemetry/other_processes", -1),
    ("records/0/telemetry/devices", [EV]), ("records/0/telemetry/bogus", 1), ("records/0/telemetry", {}),
    ("env/preflight/idle", "no"), ("env/preflight/warnings", [5]), ("env/preflight/gpus", {"0": 1}),
    ("env/preflight/gpus/0/utilization_gpu_pct", "99%"), ("env/preflight/gpus/0/busy", EV), ("env/preflight", {}),
    ("env/numa/bindings/0/node", "0"), ("env/numa/policy", 5), ("env/numa", {"policy": "auto"}),
    ("env/telemetry/enabled", "yes"), ("env/telemetry", {"enabled": False}),
]


def conditions_result() -> dict:
    d = pinned()
    d["records"][0]["telemetry"] = copy.deepcopy(GOOD_TELEMETRY)
    d["env"].update(copy.deepcopy(GOOD_ENV))
    return d


def _put(d, pointer: str, value):
    keys = pointer.split("/")
    for k in keys[:-1]:
        d = d[int(k)] if isinstance(d, list) else d[k]
    d[int(keys[-1]) if isinstance(d, list) else keys[-1]] = value


def test_good_condition_blocks_pass_schema_and_loader(run_cli, tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    from gpubench.core.result import Result, json_schema

    d = conditions_result()
    jsonschema.validate(d, json_schema())
    Result.from_dict(d, source="ok.json")
    f = write(tmp_path, "ok", d)
    code, out, err = run_cli("compare", f, f)
    assert code == 0, err


@pytest.mark.parametrize("pointer,value", CONDITION_MUTATIONS, ids=[f"{p}={v!r}"[:60] for p, v in CONDITION_MUTATIONS])
def test_hostile_condition_blocks_are_refused_naming_the_pointer(run_cli, tmp_path, pointer, value):
    """The loader checked a telemetry block only as an object and env.preflight / numa / telemetry
    not at all, while the published schema refuses these; compare, report and plot read them."""
    jsonschema = pytest.importorskip("jsonschema")
    from gpubench.core.result import json_schema

    d = conditions_result()
    _put(d, pointer, value)
    assert list(jsonschema.validators.validator_for(json_schema())(json_schema()).iter_errors(d)), \
        "the schema accepts this mutation: not a useful case"
    bad, good = write(tmp_path, "bad", d), write(tmp_path, "good", conditions_result())
    top = "/" + "/".join(pointer.split("/")[:3])
    for argv in (("compare", good, bad), ("report", bad, "-o", str(tmp_path / "r.html")),
                 ("plot", bad, "-o", str(tmp_path / "p.png"))):
        code, out, err = run_cli(*argv)
        assert code == 2, (argv[0], out, err)
        line = one_line(err)
        assert line.startswith(f"gpubench: error: {bad}: {top}"), (argv[0], line)
        assert "\x1b" not in line and "\x07" not in line


def test_report_flags_throttling_sharing_and_a_busy_gpu_from_the_conditions(run_cli, tmp_path):
    """The report's "throttled" flag read only an extra key that issue 19's telemetry never writes:
    a power-capped, thermally throttled point on a shared GPU after a failed idle check said
    "Nothing flagged: ... nothing throttled". The idle check's warning (from the file) is escaped."""
    d = conditions_result()
    d["records"][0]["telemetry"].update(reasons=["sw_power_cap", "hw_thermal"], other_processes=1)
    d["env"]["preflight"]["warnings"] = [f"GPU 0 is not idle: {EV} {HT} a|b"]
    src = write(tmp_path, "capped", d)
    out = str(tmp_path / "r.html")
    code, _, err = run_cli("report", src, "-o", out, "-q")
    assert code == 0, err
    raw = Path(out).read_text()
    assert "<img src=x" not in raw and "\x1b" not in raw and "\x07" not in raw
    text = html_text(out)
    assert "Nothing flagged" not in text and "No flags" not in text
    assert "throttled" in text and "GPU shared with another process" in text
    assert "before the run: GPU 0 is not idle" in text

    quiet = conditions_result()  # sync_boost is not a slowdown; no other process; the GPU idle
    quiet["records"][0]["telemetry"].update(reasons=["sync_boost"], other_processes=0)
    quiet["env"]["preflight"].update(idle=True, warnings=[])
    quiet["env"]["preflight"]["gpus"][0]["busy"] = []
    code, _, err = run_cli("report", write(tmp_path, "quiet", quiet), "-o", out, "-q")
    assert code == 0, err
    assert "Nothing flagged" in html_text(out)


# ---- area 4: --numa values: one-line refusals, before the GPU check ----

@pytest.mark.parametrize("value", ["٠", "١", "０", "0_0", "+0", " ٠ ", "99999999999999999999", "\x1b[31m0", "0\u202e"])
def test_numa_takes_ascii_node_numbers_only(run_cli, value):
    """int() read "٠" (Arabic-Indic zero), "０" (fullwidth), "0_0" and "+0" as node 0, so
    `--numa ٠` bound to node 0 and `--numa ١` was refused as "--numa 1", a value nobody typed."""
    code, out, err = run_cli("copy", "-b", "4K", "-e", "4K", "-n", "1", "--numa", value)
    assert code == 2
    line = one_line(err)
    assert "is not a NUMA node, none, all or auto" in line, line
    assert "\x1b" not in line and "\u202e" not in line


@pytest.mark.parametrize("argv", [["nccl", "all-reduce", "-b", "1M", "-e", "1M"], ["pin"]])
def test_numa_all_without_host_buffers_is_refused_before_the_gpu_check(run_cli, argv):
    """It was refused only after the GPU check and the idle check: on a machine without a GPU the
    user saw "no CUDA device", on a busy one --require-idle's exit 3, for a command-line mistake."""
    code, out, err = run_cli(*argv, "--numa", "all")
    assert code == 2
    assert "--numa all measures host memory from each NUMA node; this command uses no host buffers" in one_line(err)


@pytest.mark.parametrize("value", ["0", "all"])
def test_numa_on_work_in_dask_workers_is_refused_not_ignored(run_cli, tmp_path, value):
    """merge (and nccl on a Dask scheduler) run their work in worker processes: --numa 0 / all
    was accepted and silently did nothing (no binding, nothing in env.numa)."""
    from gpubench.core import numa

    if not numa.nodes().get(0):
        pytest.skip("this machine has no NUMA node 0 with CPUs (no /sys/devices/system/node)")
    out = tmp_path / "m.json"
    code, _, err = run_cli("merge", "-t", "cpu", "-c", "1000", "--numa", value, "--json", str(out))
    assert code == 2 and not out.exists()
    assert f"--numa {value}: merge runs its work in Dask worker processes" in one_line(err)


def test_numa_none_and_auto_still_run_merge(run_cli, tmp_path):
    out = tmp_path / "m.json"
    code, _, err = run_cli("merge", "-t", "cpu", "-c", "1000", "--numa", "none", "-q", "--json", str(out))
    assert code == 0, err
    assert json.loads(out.read_text())["command"] == "merge"


def test_compare_shows_a_shared_gpu_and_a_new_runs_events_against_an_older_baseline(run_cli, tmp_path):
    """The issue's load case (a second process on the GPU) never reached compare: other_processes
    was not compared, and against a baseline saved before telemetry existed the column was empty
    even for a power-capped new run."""
    old = pinned()  # the real file: no telemetry block
    base = conditions_result()
    base["records"][0]["telemetry"].update(reasons=[], other_processes=0)
    new = conditions_result()
    new["records"][0]["telemetry"].update(reasons=["sw_power_cap"], other_processes=1)
    b, o, n = write(tmp_path, "base", base), write(tmp_path, "old", old), write(tmp_path, "new", new)
    code, out, err = run_cli("compare", b, n, "--format", "json")
    assert code == 0, err
    tele = json.loads(out)["comparisons"][0]["rows"][0]["telemetry"]
    assert "other processes on the GPU 0->1" in tele and "new only: sw_power_cap" in tele, tele
    code, out, err = run_cli("compare", o, n, "--format", "markdown")
    assert code == 0, err
    assert "new: sw\\_power\\_cap, 1 other process(es) on the GPU (no telemetry in base)" in out, out


def test_overlap_copies_alone_are_held_against_the_pcie_link():
    """docs/conditions.md lists overlap under the PCIe limit, but overlap set none: its report's
    "copies alone: H2D ... GB/s" printed a figure above PCIe Gen5 x16 plainly, and the JSON had no
    limit_flag to say otherwise. The driver's derive and finalize steps, on records as overlap makes
    them (metric time, nbytes = N), with the env of a Gen5 x16 GPU."""
    from types import SimpleNamespace

    from gpubench.plugins.overlap.bench import BENCHMARK
    from gpubench.plugins.overlap.command import format_report
    from gpubench.core import limits
    from gpubench.core.benchmark import Context
    from gpubench.core.result import Record, Result

    n = 256 * 2**20
    env = {"gpus": [{"index": 0, "pcie_gen": 5, "pcie_width": 16,
                     "pcie_peak_bytes_per_s": limits.pcie_peak_bytes_per_s(5, 16)}]}

    def rec(stage, gbps):
        return Record(params={"device": 0, "work": 0, "streams": 4, "chunks": 16, "nbytes": n, "stage": stage},
                      metric="time", nbytes=n, samples_s=[n / (gbps * 1e9)] * 5, extra={"gated": True})

    records = [rec("h2d", 120.0), rec("kernel", 2000.0), rec("d2h", 55.0), rec("serial", 30.0), rec("overlapped", 40.0)]
    records[-1].extra.update(speedup_vs_serial=1.3, ratio_to_longest_stage=1.1, longest_stage="h2d", verified=True)
    BENCHMARK.derive(Context(spec=SimpleNamespace(device=0), env=env, devices=(0,)), records)
    limits.finalize(records)
    by = {r.params["stage"]: r for r in records}
    assert by["h2d"].extra["limit_flag"] == "above_peak" and by["d2h"].extra["limit_flag"] is None
    assert by["d2h"].extra["pct_of_peak"] == pytest.approx(55e9 / limits.pcie_peak_bytes_per_s(5, 16) * 100)
    assert "limit_flag" not in by["kernel"].extra or by["kernel"].extra["limit_flag"] is None
    res = Result(command="overlap", spec={"nbytes": n, "chunks": 16, "streams": 4, "device": 0},
                 timing={"warmup": 2}, env=env, records=records)
    text = " ".join(str(getattr(x, "plain", x)) for x in format_report(res))
    assert "H2D 120.0 !! GB/s" in text, text
    assert limits.saved_flag(Result.from_dict(res.to_dict()).records[0]) == "above_peak"

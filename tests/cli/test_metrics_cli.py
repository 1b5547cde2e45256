"""gpubench metrics and suite --metrics: OpenMetrics text that prometheus_client's own parser reads
back to the figures of the results (medians and the p25/p75 band computed here from the raw
samples), hostile strings from result files kept inside their label values, the newest of two runs
kept, expectation outcomes and the suite's verdict; bad paths refused before anything is read."""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

import pytest

parser = pytest.importorskip("prometheus_client.openmetrics.parser")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
import edited  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data"


def families(text: str) -> dict:
    """name -> {frozenset(labels.items()): value}, parsed by prometheus_client's OpenMetrics parser
    (which refuses a text that does not end in # EOF, a bad escape or a repeated series)."""
    out: dict = {}
    for fam in parser.text_string_to_metric_families(text):
        assert fam.type == "gauge", fam
        for s in fam.samples:
            out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return out


def one(fams: dict, name: str, **labels) -> float:
    got = [v for k, v in fams[name].items() if set(labels.items()) <= k]
    assert len(got) == 1, (name, labels, got)
    return got[0]


def test_each_point_gives_its_median_and_quartiles_in_base_units(run_cli, tmp_path):
    out = tmp_path / "m.prom"
    code, _, err = run_cli("metrics", DATA / "copy-pinned-h200.json", DATA / "merge-cpu.json", "-o", out, "-q")
    assert (code, err) == (0, "")
    fams = families(out.read_text())
    for name in ("copy-pinned-h200.json", "merge-cpu.json"):
        d = json.loads((DATA / name).read_text())
        for r in d["records"]:
            rates = sorted(r["nbytes"] / s for s in r["samples_s"])
            labels = {k: str(v) for k, v in r["params"].items()}
            fam = f"gpubench_{d['command']}_bandwidth_bytes_per_second"
            assert one(fams, fam, stat="median", **labels) == pytest.approx(statistics.median(rates), rel=1e-12)
            lo, hi = one(fams, fam, stat="p25", **labels), one(fams, fam, stat="p75", **labels)
            assert rates[0] <= lo <= statistics.median(rates) <= hi <= rates[-1]
            assert one(fams, f"gpubench_{d['command']}_samples", **labels) == len(r["samples_s"])
            assert one(fams, fam, stat="median", **labels) and one(fams, fam, stat="median", host="vm", **labels)
    assert one(fams, "gpubench_result_partial", command="copy") == 0


def test_a_time_figure_is_in_seconds_and_a_failed_point_is_flagged(run_cli, tmp_path):
    d = edited.pinned(2)
    d["records"][0].update(metric="time", nbytes=0)
    d["records"][1].update(samples_s=[], error="cudaErrorLaunchFailure")
    src = edited.write(tmp_path, "mixed", d)
    code, out, err = run_cli("metrics", src, "-o", "-")
    assert code == 0, err
    fams = families(out)
    med = one(fams, "gpubench_copy_time_seconds", stat="median")
    assert med == pytest.approx(statistics.median(d["records"][0]["samples_s"]))
    assert one(fams, "gpubench_copy_point_failed") == 1
    assert "# UNIT gpubench_copy_time_seconds seconds" in out


def test_hostile_strings_stay_inside_their_label_values(run_cli, tmp_path):
    d = edited.pinned(1)
    host = 'evil"} 1\ngpubench_fake 9\n\\x\x1b[31m'
    d["env"]["host"]["hostname"] = host
    d["env"]["nvml"]["driver_version"] = '580"\n# EOF'
    src = edited.write(tmp_path, "hostile", d)
    code, out, err = run_cli("metrics", src, "-o", "-")
    assert code == 0, err
    fams = families(out)
    assert "gpubench_fake" not in fams
    # shown as a terminal shows untrusted text (core/safe.py): -o - may be a terminal
    assert dict(next(iter(fams["gpubench_copy_samples"])))["host"] == 'evil"} 1\\ngpubench_fake 9\\n\\x\\x1b[31m'
    assert dict(next(iter(fams["gpubench_result_created_seconds"])))["driver_version"] == '580"\\n# EOF'
    assert "\x1b" not in out and out.splitlines().count("# EOF") == 1 and out.endswith("# EOF\n")


@pytest.mark.parametrize("param, label", [("memory", "memory"), ("stat", "param_stat"), ("host", "param_host"),
                                          ("__x", "param___x"), ("a-b.c", "param_a_b_c"), ("2d", "param_2d")])
def test_a_param_that_clashes_or_is_no_label_name_is_prefixed(param, label):
    from gpubench.analysis.metrics import label_name

    assert label_name(param) == label


def test_the_newest_of_two_runs_is_kept_for_a_shared_series(run_cli, tmp_path):
    old, new = edited.pinned(1), edited.with_rate(edited.pinned(1), 10.0)
    old["created"], new["created"] = "2026-01-01T00:00:00+00:00", "2026-02-01T00:00:00+00:00"
    a, b = edited.write(tmp_path, "new", new), edited.write(tmp_path, "old", old)
    code, out, err = run_cli("metrics", a, b, "-o", "-")
    assert code == 0
    # counted per series: 3 stats, the samples, when it was made, partial
    assert re.search(r"warning: 6 series given more than once: the newest", err), err
    fams = families(out)
    assert one(fams, "gpubench_copy_bandwidth_bytes_per_second", stat="median") == pytest.approx(10e9, rel=0.01)
    assert one(fams, "gpubench_result_created_seconds") == 1769904000.0


@pytest.mark.parametrize("target, needle", [
    ("out.txt", r"-o '.*out\.txt' must end in \.prom"),
    ("missing/out.prom", r"folder .*missing.* does not exist"),
])
def test_a_path_that_cannot_take_the_metrics_is_refused_before_reading(run_cli, tmp_path, target, needle):
    code, out, err = run_cli("metrics", tmp_path / "no-such-result.json", "-o", tmp_path / target)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and re.search(needle, err), err
    assert not list(tmp_path.iterdir())


EXPECT = """
[[expect]]
name = "net \\" total"
command = "net"
where = { stream = "total" }
min_gbps = 1

[[expect]]
command = "net"
where = { stream = 0 }
min_gbps = 1000
"""


def test_suite_check_writes_the_outcomes_and_the_verdict(run_cli, tmp_path):
    toml = tmp_path / "e.toml"
    toml.write_text(EXPECT)
    out = tmp_path / "suite.prom"
    code, _, err = run_cli("suite", "--check", DATA / "net-local.json", "--expect", toml, "--metrics", out, "-q")
    assert code == 1, err
    fams = families(out.read_text())
    assert one(fams, "gpubench_expectation_status", expectation='net " total', status="pass") == 1
    assert one(fams, "gpubench_expectation_status", status="fail") == 1
    assert one(fams, "gpubench_expectation_value", expectation='net " total', unit="GB/s") > 1
    assert one(fams, "gpubench_suite_verdict", verdict="failed") == 1
    assert "gpubench_net_bandwidth_bytes_per_second" in fams


def test_suite_metrics_path_is_checked_before_the_run(run_cli, tmp_path):
    code, _, err = run_cli("suite", "--check", DATA / "net-local.json", "--expect", tmp_path / "none.toml",
                           "--metrics", tmp_path / "x.json")
    assert code == 2 and re.fullmatch(r"gpubench: error: --metrics '.*x\.json' must end in \.prom .*\n", err), err


def test_the_health_counters_of_each_gpu_are_exported_and_a_missing_one_left_out(run_cli, tmp_path):
    d = edited.pinned(1)
    # a count given as a boolean (retired pages' double_bit here) is left out, as the suite's rules skip it
    after = {"pcie_replays": 12, "nvlinks_up": "unsupported", "ecc": {"volatile": {"corrected": 1, "uncorrected": 0},
                                                                      "aggregate": {"corrected": 9, "uncorrected": 2}},
             "remapped_rows": {"corrected": 0, "uncorrected": 0, "pending": True, "failed": False},
             "retired_pages": {"double_bit": True}}
    d["env"]["health"] = {"gpus": [{"index": 0, "uuid": "GPU-x", "before": None, "after": after}],
                          "xid_events": [{"index": 0, "xid": 79}, {"index": 0, "xid": 48}], "error": None}
    src = edited.write(tmp_path, "health", d)
    code, out, err = run_cli("metrics", src, "-o", "-")
    assert code == 0, err
    fams = families(out)
    got = {dict(k)["counter"]: v for k, v in fams["gpubench_gpu_health_counter"].items()}
    assert got == {"pcie_replays": 12, "ecc_volatile_corrected": 1, "ecc_volatile_uncorrected": 0,
                   "ecc_aggregate_uncorrected": 2, "remapped_rows_pending": 1, "remapped_rows_failed": 0}
    assert one(fams, "gpubench_gpu_xid_events", gpu_uuid="GPU-x", command="copy") == 2


def test_suite_metrics_may_name_its_folder_by_host_and_rank(run_cli, tmp_path):
    """`{host}` and `{rank}` are replaced before the path is checked, also in its folders (without a
    launcher: 0 and this host), so a folder per host is accepted and written into."""
    import socket

    from gpubench.cli.suite import _host

    (tmp_path / _host(socket.gethostname()) / "0").mkdir(parents=True)
    toml = tmp_path / "e.toml"
    toml.write_text('[[expect]]\ncommand = "copy"\nmin_gbps = 1\n')
    code, _, err = run_cli("suite", "--check", DATA / "copy-pinned-h200.json", "--expect", toml, "--metrics",
                           str(tmp_path / "{host}" / "{rank}" / "m.prom"), "-q")
    assert code == 0, err
    assert (tmp_path / _host(socket.gethostname()) / "0" / "m.prom").read_text().endswith("# EOF\n")


def test_a_written_output_is_a_complete_result_for_a_later_signal(run_cli, tmp_path, monkeypatch):
    """Once metrics, report or plot has written its file, the command's result is complete: a
    signal from then on says "after the run; its result is complete", not "interrupted" with
    nothing kept (the line a benchmark's --json gets). Read as the command ends, before the
    in-process run forgets it."""
    from gpubench.cli.interrupt import interrupted_line
    from gpubench.core import signals

    lines: list[str] = []
    forget = signals.clear_signals
    monkeypatch.setattr(signals, "clear_signals", lambda: (lines.append(interrupted_line(15)), forget()))
    pinned = DATA / "copy-pinned-h200.json"
    for argv in (["metrics", pinned, "-o", tmp_path / "m.prom"], ["report", pinned, "-o", tmp_path / "r.html"],
                 ["plot", pinned, "-o", tmp_path / "p.png"]):
        code, _out, err = run_cli(*argv)
        assert code == 0, err
        assert lines[-1] == "gpubench: interrupted by SIGTERM after the run; its result is complete", (argv, lines)

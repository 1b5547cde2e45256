"""gpubench compare as a user meets it: exit codes, formats, refusal of files that are not results
(too large, too many values, not JSON, pipes without a writer, devices, broken links), with memory
bounded; saved figures beyond a physical limit flagged, repeated records refused, telemetry and a
shared GPU shown."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
import edited  # noqa: E402
import synth  # noqa: E402

from gpubench.cli.app import main  # noqa: E402
from gpubench.core.result import SCHEMA_VERSION, save  # noqa: E402

PINNED, ALL = str(synth.REAL_PINNED), str(synth.REAL_ALL)


def run(capsys, *args):
    with pytest.raises(SystemExit) as e:
        main(["compare", *args])
    out, err = capsys.readouterr()
    return e.value.code, out, err


@pytest.fixture
def drop(tmp_path):
    """Base and a run with a real 5% bandwidth drop (samples drawn around a 5% lower median)."""
    base, new = tmp_path / "base.json", tmp_path / "new.json"
    save(synth.copy_like(11), base)
    save(synth.copy_like(12, scale=0.95), new)
    return str(base), str(new)


def test_same_file_is_same_everywhere_and_exits_0(capsys):
    rc, out, err = run(capsys, PINNED, PINNED, "--fail-on-regression")
    assert rc == 0, err
    assert "20 figure(s) paired: 0 faster, 0 slower, 20 same, 0 inconclusive." in out
    assert "Same machine and options" in out


def test_five_percent_drop_fails_with_threshold_2(capsys, drop):
    rc, out, err = run(capsys, *drop, "--fail-on-regression", "--threshold", "2")
    assert rc == 1
    assert "6 slower" in out
    assert err.strip() == ("gpubench: error: 6 figure(s) slower by more than 2% beyond noise (p < 0.01); "
                           "worst direction d2h, nbytes 1 MiB: -5.07%")


def test_five_percent_drop_passes_with_threshold_10_or_without_the_flag(capsys, drop):
    rc, out, _ = run(capsys, *drop, "--fail-on-regression", "--threshold", "10")
    assert rc == 0 and "0 slower, 6 same" in out
    rc, out, _ = run(capsys, *drop, "--threshold", "2")
    assert rc == 0 and "6 slower" in out


def test_markdown_output(capsys, drop):
    rc, out, _ = run(capsys, *drop, "--threshold", "2", "--format", "markdown")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("### gpubench copy: ") and lines[0].endswith("base.json")
    assert "| direction | nbytes | base GB/s | new GB/s | n base/new | change | 99% interval | p | verdict |" in lines
    assert sum("**slower**" in x for x in lines) == 6
    assert lines[-1].startswith(r"<sub>verdict: same when \|change\| &lt;= 2%") and lines[-1].endswith("</sub>")


def test_json_output_and_gib_units(capsys, drop):
    rc, out, _ = run(capsys, *drop, "--format", "json", "--threshold", "2")
    d = json.loads(out)
    assert d["regressions"] == 6
    row = d["comparisons"][0]["rows"][0]
    assert row["params"] == {"device": 0, "direction": "h2d", "memory": "pinned", "nbytes": 2**20}
    assert row["verdict"] == "slower" and row["base_median"] > row["new_median"]
    assert row["n_base"] == row["n_new"] == 50 and row["ci_high_pct"] < 0 < row["ci_high_pct"] - row["ci_low_pct"]
    assert row["unit"] == "B/s" and row["better"] == "higher"
    rc, out, _ = run(capsys, *drop, "--units", "GiB")
    assert "base GiB/s" in out


def test_more_files_each_against_the_first(capsys, tmp_path, drop):
    same = tmp_path / "same.json"
    save(synth.copy_like(13), same)
    rc, out, err = run(capsys, drop[0], drop[1], str(same), "--format", "json", "--threshold", "2",
                       "--fail-on-regression")
    assert rc == 1
    d = json.loads(out)
    assert [c["new"] for c in d["comparisons"]] == [drop[1], str(same)]
    assert [c["counts"]["slower"] for c in d["comparisons"]] == [6, 0]


def test_real_results_list_one_sided_figures(capsys):
    rc, out, _ = run(capsys, PINNED, ALL)
    assert rc == 0
    assert "10 only in base, 90 only in new" in out
    assert "only in new" in out and "option memory" in out


def _refused(capsys, path, *more):
    rc, out, err = run(capsys, str(path), *more)
    assert rc == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("gpubench") and ": error: " in err and "Traceback" not in err
    return err


def test_copy_against_merge_exits_2(capsys, tmp_path):
    m = tmp_path / "merge.json"
    save(synth.merge_like(1), m)
    err = _refused(capsys, PINNED, str(m))
    assert "'merge' result" in err and "'copy' result" in err


@pytest.mark.parametrize("content,needle", [
    (b"", "is empty"),
    (b"   \n", "is empty"),
    (b'{"schema": "gpubench.result", "schema_version": 1, "command": "co', "not valid JSON"),
    (b"[1, 2, 3]", "not a gpubench result"),
    (b"\x89PNG\r\n\x1a\n\x00\x00garbage\xff\xfe", "not valid JSON"),
    (b'{"name": "something else"}', "not a gpubench result"),
    (json.dumps({"schema": "gpubench.result", "schema_version": SCHEMA_VERSION + 1, "command": "copy"}).encode(),
     "newer than this gpubench reads"),
    (json.dumps({"schema": "gpubench.result", "schema_version": "one", "command": "copy"}).encode(),
     "unknown schema version"),
    (json.dumps({"schema": "gpubench.result", "schema_version": 1, "command": "copy",
                 "records": [{"params": {}, "samples_s": ["fast"]}]}).encode(), "/records/0/samples_s/0 is 'fast'"),
])
def test_files_that_are_not_results_exit_2(capsys, tmp_path, content, needle):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    err = _refused(capsys, PINNED, str(bad))
    assert needle in err and "bad.json" in err


def test_truncated_real_result_exits_2(capsys, tmp_path):
    cut = tmp_path / "cut.json"
    cut.write_bytes(synth.REAL_PINNED.read_bytes()[:5000])
    assert "not valid JSON" in _refused(capsys, str(cut), PINNED)


def test_missing_and_folder_exit_2(capsys, tmp_path):
    assert "cannot read" in _refused(capsys, PINNED, str(tmp_path / "nope.json"))
    assert "cannot read" in _refused(capsys, str(tmp_path), PINNED)


def test_nan_sample_exits_2(capsys, tmp_path):
    d = json.loads(synth.REAL_PINNED.read_text())
    d["records"][0]["samples_s"][0] = -1.0
    p = tmp_path / "neg.json"
    p.write_text(json.dumps(d))
    assert "/records/0/samples_s/0 is -1.0 (expected a finite number >= 0)" in _refused(capsys, PINNED, str(p))


@pytest.mark.parametrize("opt,needle", [(["--threshold", "-1"], "--threshold -1 must be >= 0 percent"), (["--alpha", "1.5"], "--alpha 1.5 must be < 1"),
                                        (["--alpha", "-0"], "--alpha -0 must be > 0"),  # not "write 0"
                                        (["--alpha", "1e400"], "--alpha 1e400 must be < 1"),
                                        (["--format", "html"], "html")])
def test_bad_options_exit_2(capsys, opt, needle):
    assert needle in _refused(capsys, PINNED, PINNED, *opt)


def test_one_file_only_exits_2(capsys):
    rc, _, err = run(capsys, PINNED)
    assert rc == 2 and "Missing argument" in err


def _scaled(tmp_path, name, factor, keep=None):
    """A copy of a shipped result with every sample time multiplied by factor (keep: records kept)."""
    doc = json.loads((synth.DATA / name).read_text())
    doc["records"] = doc["records"][:keep] if keep is not None else doc["records"]
    for r in doc["records"]:
        r["samples_s"] = [t * factor for t in r["samples_s"]]
    out = tmp_path / f"scaled-{name}"
    out.write_text(json.dumps(doc))
    return str(out)


@pytest.mark.parametrize("name", ["nccl-h200x2.json", "p2p-h200x2.json"])
def test_half_the_bandwidth_fails_the_gate_with_five_samples(capsys, tmp_path, name):
    base = str(synth.DATA / name)
    code, out, err = run(capsys, base, _scaled(tmp_path, name, 2.0), "--fail-on-regression")
    assert code == 1, (out, err)
    assert "slower by more than 1%" in err


def test_a_new_result_without_the_figures_fails_the_gate(capsys, tmp_path):
    base = str(synth.DATA / "nccl-h200x2.json")
    code, out, err = run(capsys, base, _scaled(tmp_path, "nccl-h200x2.json", 1.0, keep=2), "--fail-on-regression")
    assert code == 1 and "have none in the new result" in err, (out, err)
    code, _, _ = run(capsys, base, _scaled(tmp_path, "nccl-h200x2.json", 1.0, keep=2))
    assert code == 0  # without the flag it is a report, not a failure


def test_a_drop_too_few_samples_cannot_decide_fails_the_gate_and_says_how_many_would(capsys, tmp_path):
    base = str(synth.DATA / "merge-cpu.json")  # 3 runs: no test can reach p < 0.01
    half = _scaled(tmp_path, "merge-cpu.json", 2.0)
    code, out, err = run(capsys, base, half, "--fail-on-regression")
    assert code == 1, (out, err)
    assert err.strip() == ("gpubench: error: 1 figure(s) slower by more than 1% that the samples cannot decide at "
                           "p < 0.01 (3 vs 3 samples cannot reach p < 0.01 (best 0.1): it takes 5 vs 5 or 3 vs 9); "
                           "worst -50.00%; take more runs: --runs N")
    assert "undecidable" in out and "1 figure undecidable: 3 vs 3 samples cannot reach p < 0.01" in out
    code, out, _ = run(capsys, base, half, "--format", "markdown")
    assert "**1 undecidable**" in out and "it takes 5 vs 5 or 3 vs 9" in out
    # a gain the samples cannot decide does not fail; nor does an inconclusive figure without --strict
    code, out, err = run(capsys, half, base, "--fail-on-regression")
    assert code == 0 and err == "" and "undecidable" in out
    code, _, err = run(capsys, base, half, "--strict")
    assert code == 2 and "--strict needs --fail-on-regression" in err


def test_inconclusive_drops_warn_but_fail_the_gate_only_with_strict(capsys, tmp_path):
    """Six samples a side that overlap: p >= 0.01 although 6 vs 6 could reach it."""
    from gpubench.core.result import Record, Result

    def net(rates):
        return Result("net", {}, records=[Record({"stream": 0}, nbytes=10**9, samples_s=[1 / r for r in rates])])

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    save(net([9.4, 9.5, 9.6, 9.7, 9.8, 9.9]), a)
    save(net([7.1, 7.2, 9.45, 9.55, 9.65, 9.75]), b)
    code, out, err = run(capsys, str(a), str(b), "--fail-on-regression")
    assert code == 0, (out, err)
    assert "without reaching p < 0.01 (inconclusive)" in err and "not failed (--strict fails on them)" in err
    assert "take more intervals" in err and "inconclusive" in out
    code, out, err = run(capsys, str(a), str(b), "--fail-on-regression", "--strict")
    assert code == 1 and err.startswith("gpubench: error: 1 figure(s) changed by more than 1%"), err
    code, out, _ = run(capsys, str(a), str(b), "--format", "markdown")
    assert "**1 inconclusive**" in out


def test_five_net_intervals_against_five_at_minus_24_percent_are_inconclusive_in_every_format(capsys, tmp_path):
    """5 intervals against 5 at -24% (p = 0.032): inconclusive in the table, the markdown and the
    JSON, never "same"."""
    from gpubench.core.result import Record, Result

    def net(rates):
        return Result("net", {}, records=[Record({"stream": 0}, nbytes=10**9, samples_s=[1 / r for r in rates])])

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    save(net([9.40, 9.55, 9.60, 9.70, 9.85]), a)
    save(net([7.10, 7.20, 7.30, 9.45, 9.50]), b)
    for fmt in ("table", "markdown"):
        code, out, err = run(capsys, str(a), str(b), "--format", fmt)
        assert code == 0 and "inconclusive" in out and "0 same" in out, out
        assert "5/5" in out and "0.032" in out
    code, out, _ = run(capsys, str(a), str(b), "--format", "json")
    row = json.loads(out)["comparisons"][0]["rows"][0]
    assert row["verdict"] == "inconclusive" and row["n_base"] == 5 and row["p"] == pytest.approx(8 / 252)


def test_a_net_result_of_an_older_gpubench_pairs_with_a_fresh_net_local_run(capsys, tmp_path):
    """tests/data/net-local.json predates the records' "direction" param: against a real run of
    today's net local with the same streams its figures pair (none one-sided, so
    --fail-on-regression finds no "missing" figure); a -R (s2c) run still pairs with nothing."""
    base = str(synth.DATA / "net-local.json")
    for extra, paired in (([], 3), (["-R"], 0)):
        new = tmp_path / f"new{len(extra)}.json"
        with pytest.raises(SystemExit) as e:
            main(["net", "local", "-P", "2", "-t", "1", "-i", "0.5", *extra, "--json", str(new), "-q"])
        assert e.value.code == 0
        capsys.readouterr()
        code, out, err = run(capsys, base, str(new), "--format", "json")
        doc = json.loads(out)["comparisons"][0]
        assert sum(r["status"] == "paired" for r in doc["rows"]) == paired, doc["rows"]
        assert any("pair as direction c2s" in n for n in doc["notes"])
        code, out, err = run(capsys, base, str(new), "--fail-on-regression")
        if paired:  # slower or not on this machine, nothing is missing
            assert "have none in the new result" not in err and "only in" not in out, (out, err)
        else:
            assert code == 1 and "3 figure(s) with data in the base have none in the new result" in err


# ---- files that are not results: refused in one line, with memory bounded, without hanging ----

PINNED_PATH = str(Path(__file__).resolve().parents[1] / "data" / "copy-pinned-h200.json")


def _one_error_line(err: str) -> str:
    """The single stderr line of an error (fails when there are more, or a traceback)."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gpubench") and ": error: " in lines[0], err
    return lines[0]


def _refused_matching(run_cli, *argv, needle: str) -> str:
    """Exit 2 with one error line matching the regular expression ``needle``."""
    code, out, err = run_cli(*argv)
    assert code == 2, (argv, code, out, err)
    line = _one_error_line(err)
    assert re.search(needle, line), (needle, line)
    return line


MAX_RSS_MB = 200

# The peak RSS of this process's own memory (VmHWM). Not ru_maxrss: Linux carries the pre-exec
# high-water mark of the forking parent (here pytest, often above 200 MB) into it.
_MEASURED = (
    "import sys\n"
    "from gpubench.cli.app import main\n"
    "try:\n"
    "    main(sys.argv[1:])\n"
    "finally:\n"
    "    hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
    "    print('MAXRSS_KB', hwm)\n"
)

def compare_measured(*files: str, timeout: float = 60):
    """Run compare in a fresh process; return (exit code, stderr, peak RSS in MB)."""
    p = subprocess.run([sys.executable, "-c", _MEASURED, "compare", *files], capture_output=True, text=True,
                       timeout=timeout)
    m = re.search(r"MAXRSS_KB (\d+)", p.stdout)
    assert m, (p.stdout, p.stderr)
    return p.returncode, p.stderr, int(m.group(1)) / 1024

def test_a_1gb_garbage_file_is_refused_by_its_size_without_reading_it(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:  # sparse: 1 GiB on paper, nothing on disk
        f.truncate(2**30)
        f.seek(0)
        f.write(b"\x89garbage\xff")
    code, err, rss_mb = compare_measured(PINNED_PATH, str(big))
    assert code == 2
    assert re.search(r"big\.json is 1073741824 bytes, too large", _one_error_line(err))
    assert rss_mb < MAX_RSS_MB, rss_mb

def test_garbage_under_the_size_limit_is_read_once_with_bounded_memory(tmp_path):
    junk = tmp_path / "junk.json"
    junk.write_bytes(b"\xffgarbage" * (4 * 2**20))  # 32 MiB, not JSON, not UTF-8
    code, err, rss_mb = compare_measured(str(junk), PINNED_PATH)
    assert code == 2
    assert "junk.json is not valid JSON" in _one_error_line(err)
    assert rss_mb < MAX_RSS_MB, rss_mb

@pytest.mark.parametrize("unit", [b"0,", b"[],"])
def test_many_tiny_json_values_are_refused_before_parsing(tmp_path, unit):
    # 24-36 MB of text that json.loads would turn into 0.1-0.3 GB ("0,") or 0.7 GB ("[],")
    many = tmp_path / "many.json"
    many.write_bytes(b"[" + unit * 12_000_000 + b"0]")
    code, err, rss_mb = compare_measured(str(many), PINNED_PATH)
    assert code == 2
    assert re.search(r"many\.json holds about \d+ JSON values, more than the 8000000", _one_error_line(err))
    assert rss_mb < MAX_RSS_MB, rss_mb

def test_broken_symlink_is_unreadable(run_cli, tmp_path):
    link = tmp_path / "gone.json"
    link.symlink_to(tmp_path / "deleted-result.json")
    _refused_matching(run_cli, "compare", PINNED_PATH, str(link), needle=r"cannot read .*gone\.json: No such file")

def test_named_pipe_with_no_writer_does_not_hang(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    code, err, _ = compare_measured(PINNED_PATH, str(fifo), timeout=30)  # open() must not wait for a writer
    assert code == 2
    assert "pipe.json is a named pipe that nothing had written to" in _one_error_line(err)

def test_device_file_is_refused_without_reading(run_cli):
    # /dev/zero has no end: it is refused as a device, without reading it up to the size limit
    _refused_matching(run_cli, "compare", "/dev/zero", PINNED_PATH, needle="cannot read /dev/zero: a device or socket")

def test_process_substitution_pipe_still_reads(tmp_path):
    # a pipe with a writer is read: `gpubench compare <(ssh host cat r.json) r.json`
    p = subprocess.run(["bash", "-c", f'"{sys.executable}" -m gpubench compare <(cat "{PINNED_PATH}") "{PINNED_PATH}"'],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "20 figure(s) paired: 0 faster, 0 slower, 20 same, 0 inconclusive." in p.stdout

def test_file_name_with_a_newline_stays_one_line(run_cli, tmp_path):
    # the message quotes the name; its newline is shown escaped so the error stays one line
    _refused_matching(run_cli, "compare", PINNED_PATH, str(tmp_path / "two\nlines.json"), needle=r"two\\nlines\.json")


# ---- saved limit flags, repeated records, telemetry in the comparison ----



def _strict_error_line(err: str) -> str:
    """The single "gpubench: error: " line of an error; no traceback, no request for a bug report."""
    assert "Traceback" not in err and "run with --debug for the traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpubench: error: "), err
    return lines[0]


@pytest.mark.parametrize("case", list(edited.LIMIT_CASES))
def test_compare_flags_a_saved_figure_beyond_its_limit(run_cli, tmp_path, case):
    new = edited.LIMIT_CASES[case]()
    base = copy.deepcopy(new)
    base["records"][0]["samples_s"] = [t * 1.05 for t in base["records"][0]["samples_s"]]
    b, n = edited.write(tmp_path, "base", base), edited.write(tmp_path, "new", new)
    for fmt in ("table", "markdown", "json"):
        code, out, err = run_cli("compare", b, n, "--format", fmt)
        assert code == 0, err
        if fmt == "json":
            flags = json.loads(out)["comparisons"][0]["rows"][0]["flags"]
            assert any(f.startswith("new ") and ("no-op" in f or "above a physical limit" in f) for f in flags), flags
        else:
            assert "no-op" in out or "above a physical limit" in out, out

@pytest.mark.parametrize("side", ["base", "new"])
def test_compare_refuses_two_records_with_the_same_params(run_cli, tmp_path, side):
    """Two records with the same params are refused, in either file, naming both: a repeated figure
    (here a 50% slower repeat) is never dropped unseen, so it cannot pass --fail-on-regression."""
    good = edited.pinned()
    dup = copy.deepcopy(good)
    slow = copy.deepcopy(dup["records"][0])
    slow["samples_s"] = [t * 2 for t in slow["samples_s"]]
    dup["records"].append(slow)
    files = {"base": edited.write(tmp_path, "good", good), "new": edited.write(tmp_path, "dup", dup)}
    if side == "base":
        files = {"base": files["new"], "new": files["base"]}
    code, out, err = run_cli("compare", files["base"], files["new"], "--fail-on-regression")
    assert code == 2, (out, err)
    line = _strict_error_line(err)
    assert "/records/1 has the same params as /records/0" in line and "dup.json" in line

def test_compare_shows_a_shared_gpu_and_a_new_runs_events_against_an_older_baseline(run_cli, tmp_path):
    """compare shows a second process on the GPU (other_processes 0 -> 1) and the new run's throttle
    reasons; against a baseline that has no telemetry block the new run's events are still shown."""
    old = edited.pinned()  # the real file: no telemetry block
    base = edited.conditions_result()
    base["records"][0]["telemetry"].update(reasons=[], other_processes=0)
    new = edited.conditions_result()
    new["records"][0]["telemetry"].update(reasons=["sw_power_cap"], other_processes=1)
    b, o, n = edited.write(tmp_path, "base", base), edited.write(tmp_path, "old", old), edited.write(tmp_path, "new", new)
    code, out, err = run_cli("compare", b, n, "--format", "json")
    assert code == 0, err
    tele = json.loads(out)["comparisons"][0]["rows"][0]["telemetry"]
    assert "other processes on the GPU 0->1" in tele and "new only: sw_power_cap" in tele, tele
    code, out, err = run_cli("compare", o, n, "--format", "markdown")
    assert code == 0, err
    assert "new: sw\\_power\\_cap, 1 other process(es) on the GPU (no telemetry in base)" in out, out


def test_quiet_compare_prints_nothing_and_keeps_the_verdict_and_exit_code(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "gpubench", "compare", "tests/data/copy-pinned-h200.json",
                        "tests/data/copy-all-h200.json", "-q", "--fail-on-regression"], capture_output=True, text=True,
                       timeout=120)
    assert r.stdout == ""
    assert r.returncode == 1 and r.stderr.startswith("gpubench: error: ") and len(r.stderr.splitlines()) == 1


# ---- pairing across a named param, and the pull-request markdown ----

def _merge(tmp_path, name, protocol, factor):
    d = json.loads((synth.DATA / "merge-cpu.json").read_text())
    for r in d["records"]:
        r["params"]["protocol"] = protocol
        r["samples_s"] = [x * factor for x in r["samples_s"]]
    d["spec"]["protocol"] = protocol
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return str(p)


def test_results_that_differ_in_one_param_say_so_and_pair_with_ignore_param(capsys, tmp_path):
    tcp, ucx = _merge(tmp_path, "tcp.json", "tcp", 1.0), _merge(tmp_path, "ucx.json", "ucx", 1.02)
    code, out, _ = run(capsys, tcp, ucx)
    assert code == 0 and "0 figure(s) paired" in out
    assert ("no figure pairs: the results differ in protocol: base tcp, new ucx; --ignore-param protocol pairs "
            "figures that differ only there") in out.replace("\n", " ")
    code, out, _ = run(capsys, tcp, ucx, "--ignore-param", "protocol", "--format", "json")
    (c,) = json.loads(out)["comparisons"]
    assert code == 0 and c["notes"] == ["pairs across protocol: base tcp, new ucx"]
    (row,) = c["rows"]
    assert row["status"] == "paired" and "protocol" not in row["params"] and row["verdict"] == "undecidable"
    code, out, err = run(capsys, tcp, ucx, "--ignore-param", "protcol")
    assert code == 2 and err.strip() == ("gpubench: error: --ignore-param 'protcol' is not a param of these results "
                                         "(their params: base_chunks, broadcast, chunk_size, frac_match, n_workers, other_chunks, "
                                         "protocol, shuffle_method, type)")


def test_ignoring_a_param_that_tells_records_of_one_file_apart_is_refused(capsys):
    code, _, err = run(capsys, str(synth.DATA / "copy-pinned-h200.json"), str(synth.DATA / "copy-pinned-h200.json"),
                       "--ignore-param", "nbytes")
    assert code == 2 and len(err.splitlines()) == 1
    assert "differ only in nbytes, which --ignore-param leaves out" in err
    assert "ignore only a param that differs between the files, not within one" in err


def test_markdown_puts_what_changed_first_and_folds_one_sided_figures(capsys, tmp_path):
    from gpubench.core.result import Record, Result

    def net(streams):
        recs = [Record({"stream": s}, nbytes=10**9, samples_s=[1 / (r * k) for r in (9.4, 9.5, 9.6, 9.7, 9.8, 9.9)])
                for s, k in streams.items()]
        return Result("net", {}, records=recs)

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    save(net({0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}), a)
    save(net({0: 1.0, 1: 0.8, 2: 1.0, 3: 0.5, 5: 1.0}), b)  # 1 and 3 slower (3 the worst), 4 gone, 5 new
    code, out, _ = run(capsys, str(a), str(b), "--format", "markdown")
    lines = out.splitlines()
    body = [x for x in lines if x.startswith("| ") and ("slower" in x or "same" in x)]
    assert [x.split(" | ")[0] for x in body] == ["| 3", "| 1", "| 0", "| 2"]  # worst first, same last
    assert "(worst: stream 3: -50.00%)" in out
    i = lines.index("<details>")
    assert lines[i + 1] == "<summary>1 figure(s) only in base, 1 only in new</summary>"
    assert any(x.startswith("| 4 |") for x in lines[i:]) and any(x.startswith("| 5 |") for x in lines[i:])
    assert not any(x.startswith("| 4 |") for x in lines[:i])


def test_a_change_that_parts_from_the_medians_shows_both_and_says_why(capsys, tmp_path):
    """Skewed samples: the medians move +2.8% while the Hodges-Lehmann change is far smaller."""
    from gpubench.core.result import Record, Result

    def net(rates):
        return Result("net", {}, records=[Record({"stream": 0}, nbytes=10**9, samples_s=[1 / r for r in rates])])

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    save(net([10.0, 10.0, 10.0, 10.0, 10.0, 10.28, 10.28, 10.28, 10.28]), a)
    save(net([10.0, 10.0, 10.0, 10.0, 10.28, 10.28, 10.28, 10.28, 10.28]), b)
    for fmt in ("table", "markdown"):
        code, out, _ = run(capsys, str(a), str(b), "--format", fmt)
        assert code == 0 and "(medians +2.80%)†" in out, out
        assert "† the change of the medians parts from the change: the change is the Hodges-Lehmann estimate" in \
            out.replace("\n", " ").replace("\\", "")

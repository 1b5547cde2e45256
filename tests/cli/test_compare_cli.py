"""gpubench compare as a user meets it: exit codes, formats, refusal of files that are not results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
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
    assert err.strip() == "gpubench: error: 6 figure(s) slower by more than 2% beyond noise (p < 0.01)"


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


@pytest.mark.parametrize("opt,needle", [(["--threshold", "-1"], "--threshold -1.0"), (["--alpha", "1.5"], "--alpha 1.5"),
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


def test_inconclusive_drops_warn_but_fail_the_gate_only_with_strict(capsys, tmp_path):
    base = str(synth.DATA / "merge-cpu.json")  # 3 runs: no test can reach p < 0.01
    half = _scaled(tmp_path, "merge-cpu.json", 2.0)
    code, out, err = run(capsys, base, half, "--fail-on-regression")
    assert code == 0, (out, err)
    assert "without reaching p < 0.01 (inconclusive)" in err and "not failed (--strict fails on them)" in err
    assert "inconclusive" in out and "3 vs 3 samples cannot reach p < 0.01" in out
    assert "take more runs: --runs N" in err and "more)" not in out
    code, out, err = run(capsys, base, half, "--fail-on-regression", "--strict")
    assert code == 1 and err.startswith("gpubench: error: 1 figure(s) changed by more than 1%"), err
    code, out, _ = run(capsys, base, half, "--format", "markdown")
    assert "**1 inconclusive**" in out
    code, _, err = run(capsys, base, half, "--strict")
    assert code == 2 and "--strict needs --fail-on-regression" in err


def test_the_issue_net_case_is_inconclusive_in_every_format(capsys, tmp_path):
    """5 intervals against 5 at -24% (p = 0.032): the table and the markdown called it "same"."""
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
    today's net local with the same streams its figures pair (they used to be all one-sided, and
    --fail-on-regression failed on 3 "missing" figures); a -R (s2c) run still pairs with nothing."""
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

"""gpubench compare as a user meets it: exit codes, formats, refusal of files that are not results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
import synth  # noqa: E402

from gpubench.cli import main  # noqa: E402
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
    assert "20 figure(s) paired: 0 better, 0 worse, 20 same." in out
    assert "Same machine and options" in out


def test_five_percent_drop_fails_with_threshold_2(capsys, drop):
    rc, out, err = run(capsys, *drop, "--fail-on-regression", "--threshold", "2")
    assert rc == 1
    assert "6 worse" in out
    assert err.strip() == "gpubench: error: 6 figure(s) worse by more than 2% beyond noise"


def test_five_percent_drop_passes_with_threshold_10_or_without_the_flag(capsys, drop):
    rc, out, _ = run(capsys, *drop, "--fail-on-regression", "--threshold", "10")
    assert rc == 0 and "0 worse, 6 same" in out
    rc, out, _ = run(capsys, *drop, "--threshold", "2")
    assert rc == 0 and "6 worse" in out


def test_markdown_output(capsys, drop):
    rc, out, _ = run(capsys, *drop, "--threshold", "2", "--format", "markdown")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("### gpubench copy: `") and lines[0].endswith("base.json`")
    assert "| direction | nbytes | base GB/s | new GB/s | change | p | verdict |" in lines
    assert sum("**worse**" in x for x in lines) == 6
    assert lines[-1].startswith("<sub>verdict: two-sided Mann-Whitney U test")


def test_json_output_and_gib_units(capsys, drop):
    rc, out, _ = run(capsys, *drop, "--format", "json", "--threshold", "2")
    d = json.loads(out)
    assert d["regressions"] == 6
    row = d["comparisons"][0]["rows"][0]
    assert row["params"] == {"device": 0, "direction": "h2d", "memory": "pinned", "nbytes": 2**20}
    assert row["verdict"] == "worse" and row["base_median"] > row["new_median"]
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
    assert [c["counts"]["worse"] for c in d["comparisons"]] == [6, 0]


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
    assert "worse by more than 1%" in err


def test_a_new_result_without_the_figures_fails_the_gate(capsys, tmp_path):
    base = str(synth.DATA / "nccl-h200x2.json")
    code, out, err = run(capsys, base, _scaled(tmp_path, "nccl-h200x2.json", 1.0, keep=2), "--fail-on-regression")
    assert code == 1 and "have none in the new result" in err, (out, err)
    code, _, _ = run(capsys, base, _scaled(tmp_path, "nccl-h200x2.json", 1.0, keep=2))
    assert code == 0  # without the flag it is a report, not a failure


def test_untested_drops_warn_but_do_not_fail_the_gate(capsys, tmp_path):
    base = str(synth.DATA / "merge-cpu.json")
    code, out, err = run(capsys, base, _scaled(tmp_path, "merge-cpu.json", 2.0), "--fail-on-regression")
    assert code == 0, (out, err)
    assert "could not be tested" in err and "worse (untested)" in out
    code, out, _ = run(capsys, base, _scaled(tmp_path, "merge-cpu.json", 2.0), "--format", "markdown")
    assert "untested (too few samples)" in out

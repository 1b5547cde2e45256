import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from readonly import OLD, read_only_folder  # noqa: E402

from gpubench.core.errors import MachineError, UsageError
from gpubench.core.result import SCHEMA_VERSION, Record, Result, check_output_path, check_output_target, load, save


def _result():
    r = Record(params={"device": 0, "direction": "h2d", "memory": "pinned", "nbytes": 4096}, nbytes=4096,
               samples_s=[1e-6, 2e-6, 3e-6], reps=4, extra={"gated": True})
    return Result(command="copy", spec={"sizes": [4096]}, timing={"clock": "cuda-event"},
                  env={"host": {"hostname": "x"}}, records=[r])


def test_round_trip(tmp_path):
    res = _result()
    p = save(res, tmp_path / "r.json")
    back = load(p)
    assert back.to_dict() == res.to_dict()
    assert back.records[0].rate_summary().median == pytest.approx(4096 / 2e-6)
    raw = json.loads(p.read_text())
    assert raw["schema"] == "gpubench.result" and raw["schema_version"] == SCHEMA_VERSION


def test_save_is_atomic_and_keeps_old_file_on_failure(tmp_path, monkeypatch):
    p = tmp_path / "r.json"
    save(_result(), p)
    before = p.read_text()
    bad = _result()
    bad.records[0].samples_s = [float("nan")]  # json refuses NaN: the write must fail before rename
    with pytest.raises(ValueError):
        save(bad, p)
    assert p.read_text() == before
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []


def test_save_to_read_only_folder(tmp_path):
    # as root too: a read-only mount or the immutable attribute, not permission bits (readonly.py)
    with read_only_folder(tmp_path) as (d, how):
        with pytest.raises(MachineError, match=r"could not save result to .*r\.json.*(Read-only|not permitted)"):
            save(_result(), d / "r.json")
        with pytest.raises(MachineError, match="could not save result"):
            save(_result(), d / "old.json")  # replacing the earlier file fails too, and keeps it
        assert (d / "old.json").read_text() == OLD, how
        assert sorted(x.name for x in d.iterdir()) == ["old.json"], how  # no temporary file left
        with pytest.raises(UsageError, match="cannot write there"):
            check_output_target(d / "new.json", "--json")
        with pytest.raises(UsageError, match="old.json' exists and cannot be written"):
            check_output_target(d / "old.json", "--json")


def test_save_failure_is_one_clear_error(tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder")
    with pytest.raises(MachineError, match="could not save result to"):
        save(_result(), blocker / "r.json")


def test_check_output_path(tmp_path):
    assert check_output_path(tmp_path / "a.json").name == "a.json"
    with pytest.raises(UsageError, match="does not exist"):
        check_output_path(tmp_path / "nope" / "a.json")
    with pytest.raises(UsageError, match="is a folder"):
        check_output_path(tmp_path)


@pytest.mark.parametrize("content,match", [
    ("", "empty"), ("{", "not valid JSON"), ("[1, 2]", "not a gpubench result"),
    ('{"schema": "other"}', "not a gpubench result"),
    ('{"schema": "gpubench.result", "schema_version": 99, "command": "copy"}', "newer"),
    ('{"schema": "gpubench.result", "schema_version": "x", "command": "copy"}', "unknown schema"),
    ('{"schema": "gpubench.result", "schema_version": 1}', "malformed"),
    ('{"schema": "gpubench.result", "schema_version": 1, "command": "copy", "records": [{"x": 1}]}', "/records/0/x is 1"),
])
def test_load_refuses(tmp_path, content, match):
    p = tmp_path / "x.json"
    p.write_text(content)
    with pytest.raises(UsageError, match=match):
        load(p)


def test_load_missing_and_binary(tmp_path):
    with pytest.raises(UsageError, match="cannot read"):
        load(tmp_path / "missing.json")
    p = tmp_path / "bin.json"
    p.write_bytes(os.urandom(4096))
    with pytest.raises(UsageError):
        load(p)


def test_mark_peak_flags_a_figure_above_the_link():
    r = Record(params={}, nbytes=100, samples_s=[1.0, 1.0, 1.0])  # 100 B/s
    r.mark_peak(200.0)
    assert r.extra == {"peak_bytes_per_s": 200.0, "pct_of_peak": 50.0, "above_peak": False}
    r.mark_peak(50.0)
    assert r.extra["above_peak"] is True and r.extra["pct_of_peak"] == 200.0
    r.mark_peak(None)
    assert r.extra["pct_of_peak"] is None and r.extra["above_peak"] is False


def test_saved_file_has_ordinary_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        p = save(_result(), tmp_path / "r.json")
    finally:
        os.umask(old)
    assert (p.stat().st_mode & 0o777) == 0o644


def test_time_ratios_against_the_baseline_strategy():
    from gpubench.core.result import time_ratios

    def rec(strategy, n, t):
        return Record(params={"strategy": strategy, "n": n}, nbytes=1, samples_s=[t, t, t])

    recs = [rec("separate", 1, 4.0), rec("packed", 1, 1.0), rec("packed", 2, 1.0),
            Record(params={"strategy": "separate", "n": 3}, error="failed")]
    got = {(r.params["strategy"], r.params["n"]): v for r, v in time_ratios(recs, "separate", lambda r: r.params["n"])}
    assert got == {("separate", 1): 1.0, ("packed", 1): 4.0, ("packed", 2): None}

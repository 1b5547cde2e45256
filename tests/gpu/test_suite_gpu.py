"""suite on a real GPU: a small run saves a bundle with env and copy, checks expectations, exits 0 / 1."""

from __future__ import annotations

import pytest

from gpubench.validation import suite
from gpubench.cli.app import main
from gpubench.plugins.copy import hooks as copy_hooks
from gpubench.validation import steps

pytestmark = pytest.mark.gpu


def _run(capsys, *args):
    with pytest.raises(SystemExit) as e:
        main(["suite", *args])
    out, err = capsys.readouterr()
    return e.value.code, out, err


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(copy_hooks, "SIZES", ("64KiB", "16MiB", 16.0))
    planned = steps.planned
    monkeypatch.setattr(steps, "planned", lambda place: [(p, s) for p, s in planned(place) if p.name == "copy"])


def test_small_suite_passes_and_saves_a_bundle(capsys, tmp_path, small, gpu_count):
    exp = tmp_path / "e.toml"
    exp.write_text('[[expect]]\ncommand = "copy"\nwhere = { device = 0, direction = "h2d", nbytes = 16777216 }\n'
                   "min_gbps = 1\n")
    rc, out, err = _run(capsys, "--expect", str(exp), "-o", str(tmp_path), "-q")
    assert rc == 0, err
    (bundle_path,) = [
        p for p in tmp_path.glob("suite-*.json") if not p.name.endswith(("-copy.json", "-env.json"))]
    b = suite.load_checkable(bundle_path)
    assert [s.name for s in b.steps] == ["env", "copy pinned"]
    copy = b.steps[1].result
    assert {r.params["device"] for r in copy.records if isinstance(r.params["device"], int)} == set(range(gpu_count))
    assert all(r.error is None and r.samples_s for r in copy.records)
    assert [o.status for o in b.outcomes] == ["pass"]


def test_impossible_expectation_exits_1(capsys, tmp_path, small):
    exp = tmp_path / "e.toml"
    exp.write_text('[[expect]]\ncommand = "copy"\nwhere = { device = 0, direction = "d2h", nbytes = 16777216 }\n'
                   "min_gbps = 100000\n")
    rc, out, err = _run(capsys, "--expect", str(exp), "-o", str(tmp_path))
    assert rc == 1 and "1 expectation(s) not met" in err and "FAIL" in out

"""gpubench suite as a user meets it: --check against saved results, exit codes, no GPU, an
unwritable -o named before the GPU check."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
import synth  # noqa: E402

from gpubench.validation import suite  # noqa: E402
from gpubench.cli.app import main  # noqa: E402
from gpubench.core.errors import NoGPUError  # noqa: E402
from gpubench.core.gpu import require_gpu  # noqa: E402
from gpubench.core.result import load  # noqa: E402

EXAMPLE = str(Path(__file__).resolve().parents[2] / "src" / "gpubench" / "profiles" / "h200x2.toml")
PINNED = str(synth.REAL_PINNED)

# The real H200 pinned copy run: h2d 1 GiB 54.35 GB/s, d2h 1 GiB 54.41, h2d 1 MiB 42.22.
GOOD = """
[[expect]]
name = "H2D 1 GiB"
command = "copy"
where = { direction = "h2d", memory = "pinned", nbytes = 1073741824 }
min_gbps = 52.5
[[expect]]
command = "copy"
where = { direction = "d2h", nbytes = 1048576 }
min_gbps = 39
[[expect]]
command = "nccl"
where = { nbytes = 1073741824 }
min_gbps = 300
"""


def run(capsys, *args):
    with pytest.raises(SystemExit) as e:
        main(["suite", *args])
    out, err = capsys.readouterr()
    return e.value.code, out, err


def _toml(tmp_path, text, name="e.toml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_check_passes_on_the_real_result(capsys, tmp_path):
    rc, out, err = run(capsys, "--check", PINNED, "--expect", _toml(tmp_path, GOOD))
    assert rc == 0, err
    assert "PASSED: 2 pass, 0 fail, 0 missing, 1 skipped." in out
    assert "no nccl result given" in out


def test_check_strict_fails_on_skipped(capsys, tmp_path):
    rc, out, err = run(capsys, "--check", PINNED, "--expect", _toml(tmp_path, GOOD), "--strict")
    assert rc == 1 and "1 expectation(s) not met" in err


def test_check_fails_a_figure_under_its_bound(capsys, tmp_path):
    rc, out, err = run(capsys, "--check", PINNED, "--expect", _toml(tmp_path, GOOD.replace("52.5", "60")))
    assert rc == 1
    assert err.strip() == "gpubench: error: suite failed: 1 expectation(s) not met"
    assert "FAILED: 1 pass, 1 fail" in out and ">= 60 GB/s" in out and "54.35" in out


def test_example_expectations_on_the_real_gpu0_result(capsys):
    # the real result covers GPU 0 only: GPU 0 figures pass, GPU 1 figures are missing (-> exit 1)
    rc, out, _ = run(capsys, "--check", PINNED, "--expect", EXAMPLE)
    assert rc == 1
    assert "6 pass, 0 fail, 2 missing" in out


def test_check_a_bundle(capsys, tmp_path):
    b = suite.Bundle(env=synth.real_env())
    b.steps = [suite.Step("copy pinned", "copy", "ok", seconds=1.0, result=load(synth.REAL_PINNED)),
               suite.Step("nccl all-reduce", "nccl", "skipped", "needs 2 GPUs, 1 visible")]
    p = suite.save_bundle(b, tmp_path / "bundle.json")
    rc, out, _ = run(capsys, "--check", str(p), "--expect", _toml(tmp_path, GOOD))
    assert rc == 0 and "needs 2 GPUs, 1 visible" in out


def test_check_needs_expect_and_readable_files(capsys, tmp_path):
    rc, _, err = run(capsys, "--check", PINNED)
    assert rc == 2 and "--check needs --expect" in err
    rc, _, err = run(capsys, "--check", str(tmp_path / "none.json"), "--expect", _toml(tmp_path, GOOD))
    assert rc == 2 and "cannot read" in err
    (tmp_path / "arr.json").write_text("[]")
    rc, _, err = run(capsys, "--check", str(tmp_path / "arr.json"), "--expect", _toml(tmp_path, GOOD))
    assert rc == 2 and "not a gpubench result" in err and err.count("\n") == 1


def test_bad_expectations_exit_2_before_any_gpu_lookup(capsys, tmp_path):
    rc, _, err = run(capsys, "--expect", _toml(tmp_path, "[[expect]]\ncommand='copy'\nmin_gbps=0\n"))
    assert rc == 2 and "min_gbps = 0 must be a number > 0" in err
    rc, _, err = run(capsys, "--expect", str(tmp_path / "missing.toml"))
    assert rc == 2 and "cannot read" in err


def test_output_must_not_be_a_file(capsys, tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    rc, _, err = run(capsys, "-o", str(f))
    assert rc == 2 and "is a file" in err  # click.Path(file_okay=False) says so first
    rc, _, err = run(capsys, "-o", "/dev/full")  # a device: not a folder, nor called a file
    assert rc == 2 and "'/dev/full' is not a folder" in err and len(err.strip().splitlines()) == 1, err


def test_a_missing_output_folder_is_not_created_when_the_run_cannot_start(capsys, tmp_path):
    if not _no_gpu():
        pytest.skip("a GPU is visible: the suite would run")
    rc, _, err = run(capsys, "-o", str(tmp_path / "new" / "dir"))
    assert rc == 2 and "no CUDA device" in err
    assert not (tmp_path / "new").exists()  # refused before anything is created


def _no_gpu() -> bool:
    try:
        require_gpu()
        return False
    except NoGPUError:
        return True


@pytest.mark.skipif(not _no_gpu(), reason="a GPU is visible here")
def test_suite_without_gpu_exits_2_with_the_standard_line(capsys, tmp_path):
    rc, out, err = run(capsys, "--expect", EXAMPLE, "-o", str(tmp_path))
    assert rc == 2
    assert err.startswith("gpubench: error: no CUDA device is visible") and all(c in err for c in ("compare", "plot", "report", "suite --check"))
    assert list(tmp_path.iterdir()) == []




@pytest.mark.parametrize("sub", ["", "new/deeper"])
def test_suite_names_an_unwritable_output_before_the_gpu(run_cli, tmp_path, sub):
    """A read-only mount (or immutable folder, as root) as -o, or a folder to be made under one: one
    line naming -o, exit 2, whether or not the machine has a GPU; nothing is created."""
    from readonly import OLD, read_only_folder

    with read_only_folder(tmp_path) as (d, how):
        target = d / sub if sub else d
        code, out, err = run_cli("suite", "-o", str(target))
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, (how, code, err)
        assert lines[0].startswith("gpubench: error: -o ") and "cannot write there" in lines[0], lines[0]
        assert "CUDA" not in lines[0]
        assert (d / "old.json").read_text() == OLD and sorted(x.name for x in d.iterdir()) == ["old.json"]


def test_the_failed_count_is_of_expectations_not_of_the_rows_they_matched(capsys, tmp_path):
    """One expectation that matches two records and fails on both is one expectation not met."""
    exp = tmp_path / "e.toml"
    exp.write_text('[[expect]]\nname = "impossible"\ncommand = "copy"\nwhere = { direction = "h2d" }\n'
                   "min_gbps = 1e9\n")
    rc, out, err = run(capsys, "--check", "tests/data/copy-pinned-h200.json", "--expect", str(exp))
    assert rc == 1 and err.strip().endswith("suite failed: 1 expectation(s) not met"), err

"""--numa as a user meets it: node numbers in ASCII digits only, `all` refused where a command has
no host buffers and `0` / `all` where the work runs in Dask worker processes, each one line and exit
2 before any GPU check; none and auto still run."""

from __future__ import annotations

import json

import pytest

def one_line(err: str) -> str:
    """The single "gpubench: error: " line of an error; no traceback, no request for a bug report."""
    assert "Traceback" not in err and "run with --debug for the traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpubench: error: "), err
    return lines[0]


@pytest.mark.parametrize("value", ["٠", "١", "０", "0_0", "+0", " ٠ ", "99999999999999999999", "\x1b[31m0", "0\u202e"])
def test_numa_takes_ascii_node_numbers_only(run_cli, value):
    """Node numbers are ASCII digits: "٠" (Arabic-Indic zero), "０" (fullwidth), "0_0" and "+0", which
    int() reads as numbers, are refused as typed (never as a value nobody typed, such as "--numa 1"
    for "١"), with no escape or bidi control character of the value in the line."""
    code, out, err = run_cli("copy", "-b", "4K", "-e", "4K", "-n", "1", "--numa", value)
    assert code == 2
    line = one_line(err)
    assert "is not a NUMA node, none, all or auto" in line, line
    assert "\x1b" not in line and "\u202e" not in line

@pytest.mark.parametrize("argv", [["nccl", "all-reduce", "-b", "1M", "-e", "1M"], ["pin"]])
def test_numa_all_without_host_buffers_is_refused_before_the_gpu_check(run_cli, argv):
    """A command-line mistake, refused before the GPU check and the idle check: neither "no CUDA
    device" (no GPU) nor --require-idle's exit 3 (a busy GPU) stands in for it."""
    code, out, err = run_cli(*argv, "--numa", "all")
    assert code == 2
    assert "--numa all measures host memory from each NUMA node; this command uses no host buffers" in one_line(err)

@pytest.mark.parametrize("value", ["0", "all"])
def test_numa_on_work_in_dask_workers_is_refused_not_ignored(run_cli, tmp_path, value):
    """merge (and nccl on a Dask scheduler) run their work in worker processes, which this process's
    binding does not reach: --numa 0 / all is refused, never accepted and ignored."""
    from gpubench.core import numa

    if not numa.nodes().get(0):
        pytest.skip("this machine has no NUMA node 0 with CPUs (no /sys/devices/system/node)")
    out = tmp_path / "m.json"
    code, _, err = run_cli("merge", "-t", "cpu", "-c", "1000", "--numa", value, "--json", str(out))
    assert code == 2 and not out.exists()
    assert f"--numa {value}: merge runs its work in Dask worker processes" in one_line(err)

def test_numa_none_and_auto_still_run_merge(run_cli, tmp_path):
    pytest.importorskip("distributed")
    pytest.importorskip("pandas")
    pytest.importorskip("dask.dataframe")
    out = tmp_path / "m.json"
    code, _, err = run_cli("merge", "-t", "cpu", "-c", "1000", "--numa", "none", "-q", "--json", str(out))
    assert code == 0, err
    assert json.loads(out.read_text())["command"] == "merge"

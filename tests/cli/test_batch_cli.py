"""gpubench batch as a user meets it: bad input is one line and exit 2, before any GPU lookup."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpubench.core.gpu import gpu_available


BAD = [
    (["--count", "0"], "--count 0 must be >= 1"),
    (["--count", "-5"], "--count -5"),
    (["--count", "many"], "many"),
    (["--piece", "0"], "at least 1 byte"),
    (["--piece", "4KiB,zz"], "'zz' is not a size"),
    (["--piece", "3KiB", "--total", "16MiB"], "not a whole number"),
    (["--count", "4", "--total", "1MiB"], "both given"),
    (["-s", "separate,teleport"], "teleport"),
    (["--direction", "sideways"], "sideways"),
    (["-m", "pinned,gold"], "gold"),
    (["-d", "-1"], "-d/--device -1 must be >= 0"),
    (["-n", "0"], "-n/--iters"),
    (["--min-time", "0"], "--min-time"),
    (["--json", "/nonexistent-dir/x.json"], "does not exist"),
]


@pytest.mark.parametrize("args,needle", BAD)
def test_bad_input_one_line_exit_2(run_cli, args, needle):
    code, out, err = run_cli("batch", *args)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err


@pytest.mark.skipif(gpu_available(), reason="a GPU is visible")
def test_without_gpu_one_line_exit_2(run_cli):
    code, out, err = run_cli("batch", "--sweep")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device is visible" in lines[0]


def test_command_modules_import_no_cupy():
    code = ("import sys\n"
            "import gpubench.plugins.batch.command, gpubench.plugins.memcpy2d.command, gpubench.plugins.overlap.command\n"
            "import gpubench.plugins.batch.bench, gpubench.plugins.memcpy2d.bench, gpubench.plugins.overlap.bench\n"
            "print('HEAVY', [m for m in ('cupy', 'cuda.bindings', 'dask') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout

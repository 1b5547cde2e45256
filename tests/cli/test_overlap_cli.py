"""gpubench overlap: bad sizes, work, streams and chunks are one line, exit 2."""

from __future__ import annotations

import pytest

from gpubench.core.gpu import gpu_available


BAD = [
    (["--size", "10"], "multiple of 4"),
    (["--size", "0"], "at least 1 byte"),
    (["--work", "-1"], "--work -1 must be >= 0"),
    (["--work", "9" * 25], "--work " + "9" * 25 + " is too large (at most 1,048,576)"),
    (["--streams", "9" * 25], "is too large (at most 64)"),
    (["--work", "lots"], "'lots' is not an integer"),
    (["--streams", "0"], "--streams 0"),
    (["--streams", "8", "--chunks", "2"], "fewer than --streams"),
    (["--chunks", "5000"], "--chunks 5000"),
    (["-n", "0"], "-n/--iters"),
]


@pytest.mark.parametrize("args,needle", BAD)
def test_bad_input_one_line_exit_2(run_cli, args, needle):
    code, out, err = run_cli("overlap", *args)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err


@pytest.mark.skipif(gpu_available(), reason="a GPU is visible")
def test_without_gpu_one_line_exit_2(run_cli):
    code, out, err = run_cli("overlap", "--sweep")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "no CUDA device is visible" in err

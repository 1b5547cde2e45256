"""gpubench memcpy2d: W > pitch, zero or negative sizes and pitches that do not fit are one line, exit 2."""

from __future__ import annotations

import pytest

from gpubench.core.gpu import gpu_available


BAD = [
    (["-W", "8KiB", "--src-pitch", "4KiB"], "--width 8 KiB is wider than --src-pitch 4 KiB"),
    (["-W", "4096", "--dst-pitch", "2KiB"], "wider than --dst-pitch"),
    (["-W", "0"], "at least 1 byte"),
    (["-W", "-1"], "not a size"),
    (["-H", "0"], "-H/--height 0"),
    (["-H", "-7"], "-H/--height -7"),
    (["--src-pitch", "0x"], "positive multiple"),
    (["--dst-pitch", "１x"], "--dst-pitch '１x' is not a size"),  # float() reads fullwidth digits
    (["--src-pitch", "١.٥x"], "--src-pitch '١.٥x' is not a size"),
    (["--src-pitch", "4GiB"], "maximum pitch"),
    (["-H", "1073741824", "--src-pitch", "2000MiB"], "does not fit"),
    (["--total", "1MiB", "-W", "3000"], "3000-byte rows"),
    (["-s", "2d,3d"], "'3d'"),
    (["--direction", "h2h"], "'h2h'"),
    (["-m", "write-combined"], "write-combined"),
]


@pytest.mark.parametrize("args,needle", BAD)
def test_bad_input_one_line_exit_2(run_cli, args, needle):
    code, out, err = run_cli("memcpy2d", *args)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err


@pytest.mark.skipif(gpu_available(), reason="a GPU is visible")
def test_without_gpu_one_line_exit_2(run_cli):
    code, out, err = run_cli("memcpy2d")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "no CUDA device is visible" in err

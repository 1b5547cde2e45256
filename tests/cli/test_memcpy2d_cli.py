"""gpubench memcpy2d: W > pitch, zero or negative sizes and pitches that do not fit are one line, exit 2."""

from __future__ import annotations

import pytest

from gpubench.cli import main
from gpubench.core.errors import NoGPUError
from gpubench.core.gpu import require_gpu


def run_main(capsys, *args):
    with pytest.raises(SystemExit) as e:
        main(list(args))
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def have_gpu() -> bool:
    try:
        require_gpu()
        return True
    except NoGPUError:
        return False

BAD = [
    (["-W", "8KiB", "--src-pitch", "4KiB"], "--width 8 KiB is wider than --src-pitch 4 KiB"),
    (["-W", "4096", "--dst-pitch", "2KiB"], "wider than --dst-pitch"),
    (["-W", "0"], "at least 1 byte"),
    (["-W", "-1"], "not a size"),
    (["-H", "0"], "-H/--height 0"),
    (["-H", "-7"], "-H/--height -7"),
    (["--src-pitch", "0x"], "positive multiple"),
    (["--src-pitch", "4GiB"], "maximum pitch"),
    (["-H", "1073741824", "--src-pitch", "2000MiB"], "does not fit"),
    (["--total", "1MiB", "-W", "3000"], "3000-byte rows"),
    (["-s", "2d,3d"], "'3d'"),
    (["--direction", "h2h"], "'h2h'"),
    (["-m", "write-combined"], "write-combined"),
]


@pytest.mark.parametrize("args,needle", BAD)
def test_bad_input_one_line_exit_2(capsys, args, needle):
    code, out, err = run_main(capsys, "memcpy2d", *args)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err


@pytest.mark.skipif(have_gpu(), reason="a GPU is visible")
def test_without_gpu_one_line_exit_2(capsys):
    code, out, err = run_main(capsys, "memcpy2d")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "no CUDA device is visible" in err

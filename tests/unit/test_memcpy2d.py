"""memcpy2d without a GPU: geometry validation, pitch parsing, the expected destination and the
window / guard check (on numpy copies done row by row, as cudaMemcpy2D defines them), the report."""

from __future__ import annotations

import numpy as np
import pytest
from rich.console import Console

from gpubench.plugins.memcpy2d import bench
from gpubench.plugins.memcpy2d.command import build_spec, check_cell, format_report, parse_pitch
from gpubench.core.errors import UsageError
from gpubench.core.result import Record, Result


def spec(**kw):
    args = dict(width=None, height=None, total=None, sweep=False, src_pitch="4x", dst_pitch="1x",
                strategies="2d,row-loop,contiguous,cupy-slice", directions="h2d,d2h,d2d", memory="pinned", device=0,
                warmup=2, iters=None, min_time=0.1)
    args.update(kw)
    return build_spec(**args)


def test_defaults_match_the_reference_shape():
    s = spec()
    assert s.points == ((4096, 8192, 16384, 4096),)  # 4096 B x 8192 rows from a 16 KiB pitch
    assert s.directions == ("h2d", "d2h", "d2d") and s.memory == ("pinned",)


def test_sweep_fixed_total_and_pitch_multiples():
    s = spec(sweep=True)
    assert [p[0] for p in s.points] == [64, 256, 1024, 4096, 16384, 65536]
    for w, h, sp, dp in s.points:
        assert w * h == 4 << 20 and sp == 4 * w and dp == w


def test_explicit_pitches():
    s = spec(width="1000", height=10, src_pitch="16KiB", dst_pitch="1024")
    assert s.points == ((1000, 10, 16384, 1024),)


@pytest.mark.parametrize("kw,needle", [
    (dict(width="8KiB", src_pitch="4KiB"), "wider than --src-pitch"),
    (dict(width="4096", dst_pitch="4000"), "wider than --dst-pitch"),
    (dict(dst_pitch="0.5x"), "wider than --dst-pitch"),
    (dict(width="0"), "at least 1 byte"),
    (dict(width="-64"), "not a size"),
    (dict(height=0), "-H/--height 0"),
    (dict(height=-2), "-H/--height -2"),
    (dict(src_pitch="0x"), "positive multiple"),
    (dict(src_pitch="0"), "at least 1 byte"),
    (dict(src_pitch="3GiB"), "maximum pitch"),
    (dict(height=1 << 30, src_pitch="2047MiB"), "does not fit"),
    (dict(width="3", src_pitch="1.5x"), "not a whole number of bytes"),
    (dict(total="4MiB", width="3000"), "3000-byte rows"),
    (dict(total="4MiB", height=5), "both given"),
    (dict(strategies="2d,3d"), "'3d'"),
    (dict(directions="h2h"), "'h2h'"),
    (dict(memory="registered"), "memory kind 'registered' not known"),
    (dict(width="64,64"), "is repeated in --width"),
])
def test_bad_geometry_and_names(kw, needle):
    with pytest.raises(UsageError) as e:
        spec(**kw)
    assert needle in e.value.one_line()


def test_parse_pitch():
    assert parse_pitch("4x", 4096, "--src-pitch") == 16384
    assert parse_pitch("1.5X", 64, "--src-pitch") == 96
    assert parse_pitch("16KiB", 4096, "--src-pitch") == 16384


def _copy_2d(dst, dst_off, dpitch, src, spitch, w, h):
    """What cudaMemcpy2D does (CUDA runtime API reference): row r's W bytes from src + r * spitch
    to dst + r * dpitch."""
    for r in range(h):
        dst[dst_off + r * dpitch: dst_off + r * dpitch + w] = src[r * spitch: r * spitch + w]


@pytest.mark.parametrize("w,h,sp,dp", [(4, 3, 8, 4), (64, 17, 192, 128), (1, 1, 1, 1), (100, 5, 100, 300)])
def test_expected_destination_and_checks(w, h, sp, dp):
    src = np.random.default_rng(1).integers(0, 256, sp * h, dtype=np.uint8)
    src_n, dst_n = bench.buffer_sizes(w, h, sp, dp)
    assert src_n == sp * h and dst_n == dp * h + 2 * bench.GUARD
    base = np.random.default_rng(2).integers(0, 256, dst_n, dtype=np.uint8)
    exp = bench.expected_destination(src, base, w, h, sp, dp)
    got = base.copy()
    _copy_2d(got, bench.GUARD, dp, src, sp, w, h)
    assert np.array_equal(got, exp)
    assert bench._compare(got, exp, w, h, dp, contiguous=False) == (True, True)
    # a row that never arrived
    bad = got.copy()
    bad[bench.GUARD + (h - 1) * dp: bench.GUARD + (h - 1) * dp + w] = base[bench.GUARD + (h - 1) * dp:][:w] ^ 0xFF
    assert bench._compare(bad, exp, w, h, dp, contiguous=False)[0] is False
    # a byte written past the window: in the guard after the rows
    over = got.copy()
    over[bench.GUARD + dp * h] ^= 0xFF
    assert bench._compare(over, exp, w, h, dp, contiguous=False) == (True, False)
    # and in the guard before
    under = got.copy()
    under[bench.GUARD - 1] ^= 0xFF
    assert bench._compare(under, exp, w, h, dp, contiguous=False) == (True, False)
    if dp > w:  # a row tail between windows
        tail = got.copy()
        tail[bench.GUARD + w] ^= 0xFF
        assert bench._compare(tail, exp, w, h, dp, contiguous=False) == (True, False)


def test_contiguous_expected_destination():
    w, h, sp, dp = 8, 4, 32, 16
    src = np.arange(sp * h, dtype=np.uint8)
    base = np.zeros(bench.buffer_sizes(w, h, sp, dp)[1], dtype=np.uint8)
    exp = bench.expected_destination(src, base, w, h, sp, dp, contiguous=True)
    assert np.array_equal(exp[bench.GUARD:bench.GUARD + w * h], src[:w * h])
    assert not exp[:bench.GUARD].any() and not exp[bench.GUARD + w * h:].any()
    assert bench._compare(exp, exp, w, h, dp, contiguous=True) == (True, True)


def test_check_cell():
    assert check_cell(True, True) == "ok"
    assert check_cell(False, True) == "WRONG DATA"
    assert check_cell(True, False) == "OVERWROTE"
    assert check_cell(False, False) == "WRONG DATA OVERWROTE"
    assert check_cell(None, None) == "-"


def _rec(strategy, seconds, direction="h2d", memory="pinned", w=4096, h=8192, **extra):
    p = {"device": 0, "direction": direction, "strategy": strategy, "memory": memory, "width": w, "height": h,
         "src_pitch": 4 * w, "dst_pitch": w}
    return Record(params=p, nbytes=w * h, samples_s=list(seconds),
                  extra={"verified": True, "untouched": True, "peak_bytes_per_s": 63e9, **extra})


def test_derived_and_report():
    recs = [_rec("2d", [0.000614, 0.000614]), _rec("row-loop", [0.0123, 0.0123]),
            _rec("contiguous", [0.0006, 0.0006]), _rec("cupy-slice", [0.02, 0.02], untouched=False),
            _rec("2d", [0.0007], direction="d2d", memory="device", peak_bytes_per_s=None),
            Record(params={"device": 0, "direction": "d2d", "strategy": "row-loop", "memory": "device", "width": 64,
                           "height": 1 << 20, "src_pitch": 256, "dst_pitch": 64}, nbytes=64 << 20,
                   error="skipped: 1048576 rows is over 262144 one-row copies per sample", extra={"skipped": True})]
    bench.add_derived(recs)
    assert recs[1].extra["relative_to_2d"] == pytest.approx(0.000614 / 0.0123)
    assert recs[0].extra["time_per_row_us"] == pytest.approx(0.000614 / 8192 * 1e6)
    assert recs[4].extra["pct_of_peak"] is None
    result = Result(command="memcpy2d", spec=spec().to_dict(), timing={"warmup": 2}, records=recs)
    c = Console(width=250, record=True, file=open("/dev/null", "w"))
    for x in format_report(result):
        c.print(x)
    text = c.export_text()
    assert "H2D (host to device) - pinned host memory" in text and "D2D (device to device) - device memory" in text
    assert "54.65" in text  # 32 MiB / 614 us: the reference figure's shape
    assert "0.05x" in text  # row-loop vs 2d
    assert "OVERWROTE" in text and "skipped: 1048576 rows" in text

"""overlap without a GPU: options, chunking, the closed form the output is checked against and its
tolerance (against a float32 emulation of the kernel), and the report from real Records."""

from __future__ import annotations

import numpy as np
import pytest
from rich.console import Console

from gpubench.plugins.overlap import bench
from gpubench.plugins.overlap.command import DEFAULT_WORKS, SWEEP_WORKS, build_spec, format_report, parse_works
from gpubench.core.errors import UsageError
from gpubench.core.result import Record, Result


def spec(**kw):
    args = dict(size="256MiB", works=None, sweep=False, streams=4, chunks=None, device=0, warmup=2, iters=None,
                min_time=0.1)
    args.update(kw)
    return build_spec(**args)


def test_defaults():
    s = spec()
    assert s.nbytes == 256 << 20 and s.works == DEFAULT_WORKS and s.streams == 4 and s.chunks == 4
    assert spec(sweep=True).works == SWEEP_WORKS
    assert spec(sweep=True, works="7").works == (7,)
    assert spec(chunks=16).chunks == 16


@pytest.mark.parametrize("kw,needle", [
    (dict(size="10"), "multiple of 4"),
    (dict(size="0"), "at least 1 byte"),
    (dict(size="-4"), "not a size"),
    (dict(works="-1"), "out of range"),
    (dict(works="1,x"), "'x' is not an integer"),
    (dict(works="5,5"), "repeats"),
    (dict(works=","), "empty"),
    (dict(streams=0), "--streams 0"),
    (dict(streams=65), "--streams 65"),
    (dict(streams=8, chunks=4), "fewer than --streams"),
    (dict(chunks=0), "--chunks 0"),
    (dict(size="8", chunks=4, streams=1), "fewer float32 elements"),
    (dict(device=-1), "negative"),
    (dict(iters=0), "-n/--iters"),
    (dict(min_time=-1.0), "--min-time"),
])
def test_bad_options(kw, needle):
    with pytest.raises(UsageError) as e:
        spec(**kw)
    assert needle in e.value.one_line()


def test_parse_works():
    assert parse_works(" 0, 16 ,1024") == (0, 16, 1024)


@pytest.mark.parametrize("n,c", [(10, 3), (64, 4), (7, 7), (1000003, 16)])
def test_chunks_cover_the_data_once(n, c):
    b = bench.chunk_bounds(n, c)
    assert len(b) == c and b[0][0] == 0 and b[-1][1] == n
    assert all(hi0 == lo1 for (_, hi0), (lo1, _) in zip(b, b[1:]))
    sizes = [hi - lo for lo, hi in b]
    assert max(sizes) - min(sizes) <= 1


def _emulate(x, work):
    """The kernel in float32: v = v * a + b, work times (two roundings per step; fmaf has one, so
    this is a stricter test of the tolerance)."""
    v = x.copy()
    a, b = np.float32(bench.FMA_A), np.float32(bench.FMA_B)
    for _ in range(work):
        v = v * a + b
    return v


@pytest.mark.parametrize("work", [0, 1, 7, 100, 1000, 5000])
def test_closed_form_within_tolerance_of_the_kernel(work):
    x = (np.random.default_rng(work).integers(0, 256, 4096).astype(np.float32) / np.float32(255))
    got = _emulate(x, work)
    want = bench.expected_output(x, work)
    assert want.dtype == np.float32
    assert float(np.max(np.abs(got - want))) <= bench.tolerance(work)
    assert float(np.max(got)) <= 1.0 + 1e-6 and float(np.min(got)) >= 0.0


def test_check_tells_work_counts_apart():
    """The check catches a kernel that did one FMA too few (small work) or 1% too few (large work):
    the float32 bound grows with work, so it cannot resolve a single FMA out of thousands."""
    x = np.linspace(0, 1, 1001, dtype=np.float32)
    for n, m in ((1, 0), (2, 1), (64, 63), (1024, 1014), (4096, 4000)):
        diff = np.abs(bench.expected_output(x, n) - bench.expected_output(x, m))
        assert float(diff.max()) > 5 * bench.tolerance(n), (n, m)


def _rec(stage, seconds, work=0, **extra):
    p = {"device": 0, "work": work, "streams": 4, "chunks": 4, "nbytes": 256 << 20, "stage": stage}
    return Record(params=p, metric="time", nbytes=256 << 20, samples_s=list(seconds), extra=dict(extra))


def test_report():
    recs = [_rec("h2d", [0.00492]), _rec("kernel", [0.00015]), _rec("d2h", [0.0049]),
            _rec("serial", [0.0100], verified=True),
            _rec("overlapped", [0.0062], verified=True, speedup_vs_serial=0.0100 / 0.0062,
                 ratio_to_longest_stage=0.0062 / 0.00492, longest_stage="h2d"),
            _rec("h2d", [0.00492], work=4096), _rec("kernel", [0.0082], work=4096, gflops=67000.0),
            _rec("d2h", [0.0049], work=4096), _rec("serial", [0.018], work=4096, verified=True),
            _rec("overlapped", [0.011], work=4096, verified=False, speedup_vs_serial=0.018 / 0.011,
                 ratio_to_longest_stage=0.011 / 0.0082, longest_stage="kernel")]
    result = Result(command="overlap", spec=spec().to_dict(), timing={"warmup": 2}, records=recs)
    c = Console(width=250, record=True, file=open("/dev/null", "w"))
    for x in format_report(result):
        c.print(x)
    text = c.export_text()
    assert "over 256 MiB - 4 chunks on 4 streams" in text
    assert "1.61x" in text and "1.26 (h2d)" in text and "1.34 (kernel)" in text
    assert "4.920" in text and "10.000" in text
    assert "WRONG DATA" in text
    assert "H2D 54.56 GB/s" in text  # 256 MiB / 4.92 ms
    assert "67000 GFLOP/s" in text

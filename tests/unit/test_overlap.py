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
    (dict(works="-1"), "--work -1 must be >= 0"),
    (dict(works="1,x"), "'x' is not an integer"),
    (dict(works="5,5"), "is repeated in --work"),
    (dict(works=","), "empty"),
    (dict(streams=0), "--streams 0"),
    (dict(streams=65), "--streams 65"),
    (dict(streams=8, chunks=4), "fewer than --streams"),
    (dict(chunks=0), "--chunks 0"),
    (dict(size="8", chunks=4, streams=1), "fewer float32 elements"),
    (dict(device=-1), "-d/--device -1 must be >= 0"),
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


def test_overlap_copies_alone_are_held_against_the_pcie_link():
    """overlap's copies alone are held against the PCIe link (docs/conditions.md lists overlap under
    the PCIe limit): an H2D figure above PCIe Gen5 x16 gets limit_flag above_peak in the record, "!!"
    in the report's "copies alone" line and the flag back from the saved file. The driver's derive
    and finalize steps, on records as overlap makes them (metric time, nbytes = N), with the env of
    a Gen5 x16 GPU."""
    from types import SimpleNamespace

    from gpubench.plugins.overlap.bench import BENCHMARK
    from gpubench.plugins.overlap.command import format_report
    from gpubench.core import limits
    from gpubench.core.benchmark import Context
    from gpubench.core.result import Record, Result

    n = 256 * 2**20
    env = {"gpus": [{"index": 0, "pcie_gen": 5, "pcie_width": 16,
                     "pcie_peak_bytes_per_s": limits.pcie_peak_bytes_per_s(5, 16)}]}

    def rec(stage, gbps):
        return Record(params={"device": 0, "work": 0, "streams": 4, "chunks": 16, "nbytes": n, "stage": stage},
                      metric="time", nbytes=n, samples_s=[n / (gbps * 1e9)] * 5, extra={"gated": True})

    records = [rec("h2d", 120.0), rec("kernel", 2000.0), rec("d2h", 55.0), rec("serial", 30.0), rec("overlapped", 40.0)]
    records[-1].extra.update(speedup_vs_serial=1.3, ratio_to_longest_stage=1.1, longest_stage="h2d", verified=True)
    BENCHMARK.derive(Context(spec=SimpleNamespace(device=0), env=env, devices=(0,)), records)
    limits.finalize(records)
    by = {r.params["stage"]: r for r in records}
    assert by["h2d"].extra["limit_flag"] == "above_peak" and by["d2h"].extra["limit_flag"] is None
    assert by["d2h"].extra["pct_of_peak"] == pytest.approx(55e9 / limits.pcie_peak_bytes_per_s(5, 16) * 100)
    assert "limit_flag" not in by["kernel"].extra or by["kernel"].extra["limit_flag"] is None
    res = Result(command="overlap", spec={"nbytes": n, "chunks": 16, "streams": 4, "device": 0},
                 timing={"warmup": 2}, env=env, records=records)
    text = " ".join(str(getattr(x, "plain", x)) for x in format_report(res))
    assert "H2D 120.0 !! GB/s" in text, text
    assert limits.saved_flag(Result.from_dict(res.to_dict()).records[0]) == "above_peak"

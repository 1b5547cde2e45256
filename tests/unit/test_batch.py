"""batch without a GPU: option validation into BatchSpec, the derived figures and the report,
from real Record/Result objects."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from gpubench.plugins.batch import bench
from gpubench.core import timing
from gpubench.plugins.batch.command import SWEEP_PIECES, build_spec, format_report
from gpubench.core.errors import UsageError
from gpubench.core.result import Record, Result


def spec(**kw):
    args = dict(count=None, piece=None, total=None, sweep=False, strategies="separate,packed,batched-api,contiguous",
                directions="h2d,d2h", memory="pinned,pageable", device=0, warmup=2, iters=None, min_time=0.1)
    args.update(kw)
    return build_spec(**args)


def test_defaults_are_4096_pieces_of_4KiB():
    s = spec()
    assert s.points == ((4096, 4096),)
    assert s.strategies == bench.STRATEGIES and s.memory == ("pinned", "pageable") and s.gate is True


def test_sweep_holds_the_total():
    s = spec(sweep=True)
    assert [p for _, p in s.points] == [1024, 4096, 16384, 65536, 262144, 1048576]
    assert len(s.points) == len(SWEEP_PIECES)
    assert {c * p for c, p in s.points} == {16 << 20}


def test_count_with_piece_list():
    s = spec(count=100, piece="1KiB,64KiB")
    assert s.points == ((100, 1024), (100, 65536))


@pytest.mark.parametrize("kw,needle", [
    (dict(count=0), "--count 0"),
    (dict(count=-3), "--count -3"),
    (dict(piece="0"), "at least 1 byte"),
    (dict(piece="-4KiB"), "not a size"),
    (dict(piece="4KiB,4KiB"), "is repeated in"),
    (dict(piece="3KiB", total="16MiB"), "not a whole number of 3 KiB pieces"),
    (dict(count=10, total="1MiB"), "both given"),
    (dict(piece="1", total="4MiB"), "over the limit"),
    (dict(strategies="separate,magic"), "'magic'"),
    (dict(directions="d2d"), "'d2d'"),
    (dict(memory="write-combined"), "memory kind 'write-combined' not known"),
    (dict(device=-1), "-d/--device -1 must be >= 0"),
    (dict(iters=0), "-n/--iters"),
    (dict(warmup=-1), "-w/--warmup"),
    (dict(min_time=0), "--min-time"),
])
def test_bad_options_raise_usage_error(kw, needle):
    with pytest.raises(UsageError) as e:
        spec(**kw)
    assert needle in e.value.one_line()


def test_spec_rejects_bad_values_directly():
    with pytest.raises(UsageError):
        bench.BatchSpec(points=())
    with pytest.raises(UsageError):
        bench.BatchSpec(points=((bench.MAX_COUNT + 1, 8),))
    with pytest.raises(UsageError):
        bench.BatchSpec(points=((8, 8),), strategies=())


def test_spec_dict_is_json():
    d = spec(sweep=True).to_dict()
    assert json.loads(json.dumps(d))["points"][0] == [16384, 1024]


def test_segments_cover_every_index_once():
    segs = timing.segments(300, 128)
    assert [len(s) for s in segs] == [128, 128, 44]
    assert [i for s in segs for i in s] == list(range(300))
    assert timing.segments(5, 128) == [range(0, 5)]


def test_sum_clock_and_kept():
    c = timing.SumClock()
    c.start()
    c.add(0.25)
    c.add(0.5)
    assert c.stop() == 0.75
    c.start()
    assert c.stop() == 0.0
    assert timing.kept([1, 2, 3, 4], 2) == [3, 4]
    assert timing.kept([1, 2], 0) == []


def test_batch_api_returns_module_or_reason():
    mod, why = bench.batch_api()
    assert (mod is None) != (why is None)
    if mod is None:
        assert isinstance(why, str) and why


def _rec(strategy, memory, seconds, direction="h2d", count=4096, piece=4096, **extra):
    params = {"device": 0, "direction": direction, "strategy": strategy, "memory": memory, "count": count,
              "piece_bytes": piece}
    return Record(params=params, nbytes=count * piece, samples_s=list(seconds),
                  extra={"verified": True, "peak_bytes_per_s": 63e9, **extra})


def _result(records):
    return Result(command="batch", spec=spec().to_dict(), timing={"warmup": 2}, records=records)


def test_derived_speedup_and_time_per_piece():
    recs = [_rec("separate", "pinned", [0.012, 0.0125, 0.0118]),
            _rec("contiguous", "pinned", [0.0003, 0.0003, 0.0003]),
            _rec("separate", "pageable", [0.04, 0.04, 0.04]),
            _rec("packed", "pageable", [0.004, 0.004, 0.004]),
            Record(params={"device": 0, "direction": "h2d", "strategy": "batched-api", "memory": "pinned",
                           "count": 4096, "piece_bytes": 4096}, nbytes=4096 * 4096,
                   error="skipped: cuda-bindings is not importable", extra={"skipped": True})]
    bench.add_derived(recs)
    sep, cont, psep, pk, skipped = recs
    assert sep.extra["speedup_vs_separate"] == pytest.approx(1.0)
    assert cont.extra["speedup_vs_separate"] == pytest.approx(0.012 / 0.0003)
    assert pk.extra["speedup_vs_separate"] == pytest.approx(10.0)  # against pageable separate, not pinned
    assert sep.extra["time_per_piece_us"] == pytest.approx(0.012 / 4096 * 1e6)
    rate = 4096 * 4096 / 0.0003
    assert cont.extra["pct_of_peak"] == pytest.approx(100 * rate / 63e9)
    assert cont.extra["above_peak"] is False
    assert "speedup_vs_separate" not in skipped.extra


def test_figure_above_peak_is_flagged():
    r = _rec("contiguous", "pinned", [1e-6])
    bench.add_derived([r])
    assert r.extra["above_peak"] is True


def _text(renderables) -> str:
    c = Console(width=250, record=True, file=open("/dev/null", "w"))
    for x in renderables:
        c.print(x)
    return c.export_text()


def test_report_rows_notes_and_skip_reason():
    recs = [_rec("separate", "pinned", [0.012, 0.012, 0.012]),
            _rec("packed", "pinned", [0.0004, 0.0004, 0.0004]),
            _rec("packed+gather", "pinned", [0.004, 0.004, 0.004]),
            _rec("contiguous", "pinned", [0.0003, 0.0003, 0.0003]),
            Record(params={"device": 0, "direction": "h2d", "strategy": "batched-api", "memory": "pinned",
                           "count": 4096, "piece_bytes": 4096}, nbytes=4096 * 4096,
                   error="skipped: cuda-bindings is not importable (ImportError)", extra={"skipped": True}),
            _rec("separate", "pinned", [0.012], direction="d2h", verified=False)]
    bench.add_derived(recs)
    text = _text(format_report(_result(recs)))
    assert "H2D (host to device) - 4096 x 4 KiB = 16 MiB" in text
    assert "D2H (device to host)" in text
    # 16 MiB / 0.012 s = 1.40 GB/s; 16 MiB / 0.0003 s = 55.9 GB/s
    assert "1.40 (1.40-1.40)" in text and "55.92" in text
    assert "40.00x" in text  # contiguous vs separate
    assert "2.930" in text  # 0.012 s / 4096 pieces in us
    assert "skipped: cuda-bindings is not importable" in text
    assert "WRONG DATA" in text
    lines = text.splitlines()
    order = [next(i for i, l in enumerate(lines) if l.strip("│ ").startswith(s)) for s in
             ("separate", "batched-api", "packed ", "packed+gather", "contiguous")]
    assert order == sorted(order)


def test_report_in_gib_units():
    recs = [_rec("contiguous", "pinned", [0.0003])]
    bench.add_derived(recs)
    text = _text(format_report(_result(recs), units="GiB"))
    assert "GiB/s" in text and "52.08" in text  # 16 MiB / 0.3 ms = 52.08 GiB/s

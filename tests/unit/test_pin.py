"""pin without a GPU: options into PinSpec (one line per bad value), the report and the JSON of a
real Record/Result, the plug-in's points and their bytes for the driver's preflight."""

from __future__ import annotations

import pytest
from rich.console import Console

from gpubench.plugins.pin import bench as pin
from gpubench.core.errors import UsageError
from gpubench.core.result import Record, Result, load, save


def test_build_spec_defaults_and_sweep():
    spec = pin.build_spec("host-alloc,malloc", "4KiB", "1MiB", 4.0, 0, 1, None, 0.1)
    assert spec.sizes == (4096, 16384, 65536, 262144, 1 << 20)
    assert spec.operations == ("host-alloc", "malloc") and spec.plan.warmup == 1


@pytest.mark.parametrize("args,words", [
    (dict(operations="host-alloc,bogus"), "operation 'bogus' not known"),
    (dict(operations="malloc,malloc"), "malloc is repeated in --op"),
    (dict(min_bytes="2GiB", max_bytes="1GiB"), "-b"),
    (dict(device=-1), "-d/--device -1 must be >= 0"),
    (dict(iters=0), "-n/--iters 0"),
])
def test_bad_options_name_the_value(args, words):
    base = dict(operations="host-alloc", min_bytes="4KiB", max_bytes="1MiB", step_factor=4.0, device=0, warmup=1,
                iters=None, min_time=0.1)
    with pytest.raises(UsageError) as e:
        pin.build_spec(**{**base, **args})
    assert words in e.value.one_line()


def test_points_declare_what_the_preflight_checks():
    spec = pin.build_spec("host-alloc,host-register,malloc", "1MiB", "4MiB", 4.0, 0, 1, None, 0.1)
    pts = pin.BENCHMARK.points(spec, (0,))
    assert [p.label for p in pts] == ["host-alloc 1 MiB", "host-alloc 4 MiB", "host-register 1 MiB",
                                      "host-register 4 MiB", "malloc 1 MiB", "malloc 4 MiB"]
    big = {p.key.operation: p for p in pts if p.key.nbytes == 4 << 20}
    assert big["host-alloc"].locked_bytes == 4 << 20 and big["host-alloc"].device_bytes == 0
    assert big["malloc"].device_bytes == 4 << 20 and big["malloc"].locked_bytes == 0


def test_report_and_json_round_trip(tmp_path):
    recs = []
    for op, (a, b, _) in pin.OPERATIONS.items():
        recs.append(Record(params={"device": 0, "operation": op, "nbytes": 1 << 20, "phase": a}, metric="time",
                           nbytes=1 << 20, samples_s=[100e-6, 110e-6, 120e-6]))
        recs.append(Record(params={"device": 0, "operation": op, "nbytes": 1 << 20, "phase": b}, metric="time",
                           nbytes=1 << 20, samples_s=[50e-6, 55e-6, 60e-6]))
    recs.append(Record(params={"device": 0, "operation": "malloc", "nbytes": 1 << 30, "phase": "alloc"},
                       metric="time", nbytes=1 << 30, error="allocation of malloc 1 GiB failed: out of memory"))
    result = Result(command="pin", spec={"device": 0}, timing={"warmup": 1}, records=recs)
    pin.BENCHMARK.derive(None, result.records)
    assert result.records[0].extra["bytes_per_s"] == pytest.approx((1 << 20) / 110e-6)
    console = Console(record=True, width=140)
    for r in pin.format_report(result):
        console.print(r)
    text = console.export_text()
    assert "host-alloc: cudaHostAlloc" in text and "110.0 (105.0-115.0)" in text and "9.53" in text
    assert "failed: allocation of malloc 1 GiB failed" in text
    back = load(save(result, tmp_path / "pin.json"))
    assert back.records[0].extra["bytes_per_s"] == pytest.approx((1 << 20) / 110e-6)


def test_cli_bad_op_is_one_line_exit_2(run_cli):
    code, out, err = run_cli("pin", "--op", "nope")
    assert code == 2 and err.strip().splitlines() == [
        "gpubench: error: operation 'nope' not known (use host-alloc, host-register, malloc)"]

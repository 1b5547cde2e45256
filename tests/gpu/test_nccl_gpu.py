"""nccl on real GPUs: every collective and placement checks 0 wrong elements, every data type and
op too, a one-rank all-reduce has busbw 0, the check does catch missing
data, and --expect-busbw fails with exit 1. Small sizes so the run is short."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _nccl():
    from cupy.cuda import nccl

    if not getattr(nccl, "available", False):
        pytest.skip("NCCL is not available to CuPy")


def _spec(**kw):
    from gpubench.bench.nccl import NcclSpec

    args = dict(sizes=(1024, 64 << 10, 1 << 20), warmup=1, iters=5, samples=2, check=1)
    args.update(kw)
    return NcclSpec(**args)


@pytest.mark.parametrize("coll", ["all-reduce", "all-gather", "reduce-scatter", "broadcast", "reduce", "all-to-all",
                                  "send-recv"])
def test_every_collective_checks_zero_wrong(coll, gpu_count):
    from gpubench.bench import nccl as N

    res = N.run(_spec(collective=coll, root=gpu_count - 1))
    assert res.spec["nranks"] == gpu_count
    assert len(res.records) == 3 * 2
    for r in res.records:
        assert r.error is None, r.error
        if coll in N.UNCHECKED_IN_PLACE and r.params["placement"] == "in-place":
            assert r.extra["wrong"] is None  # N/A, as nccl-tests
        else:
            assert r.extra["wrong"] == 0, r.params
        assert len(r.samples_s) == 2 and all(t > 0 for t in r.samples_s)
        assert r.extra["busbw_bytes_per_s"] == pytest.approx(r.extra["algbw_bytes_per_s"] * r.extra["busbw_factor"])


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double",
                                   "bfloat16"])
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "avg"])
def test_dtypes_and_ops(dtype, op):
    from gpubench.bench import nccl as N

    res = N.run(_spec(sizes=(64 << 10,), dtype=dtype, op=op, samples=1, places=("out-of-place",)))
    assert [r.extra["wrong"] for r in res.records] == [0]


def test_one_rank_allreduce_busbw_is_zero():
    from gpubench.bench import nccl as N

    (r,) = N.run(_spec(devices=(0,), sizes=(1 << 20,), places=("out-of-place",))).records
    assert r.extra["busbw_bytes_per_s"] == 0.0 and r.extra["algbw_bytes_per_s"] > 0 and r.extra["wrong"] == 0


def test_check_catches_missing_data(monkeypatch):
    from gpubench.bench import nccl as N

    calls = {"n": 0}

    def launch_nothing():
        # no collective runs, so the outputs stay at the zeros the check's initialisation wrote
        calls["n"] += 1

    # every iteration's call list becomes one call that does nothing
    monkeypatch.setattr(N, "_calls", lambda *a, **k: [(launch_nothing, ())])
    res = N.run(_spec(sizes=(64 << 10,), samples=1, places=("out-of-place",)))
    monkeypatch.undo()
    assert calls["n"] > 0
    # nccl-tests' #wrong is summed over the ranks: every element of every rank's output is wrong
    r = res.records[0]
    assert r.extra["wrong"] == r.extra["count"] * r.params["nranks"]


def test_cli_expect_busbw_fails_with_exit_1(tmp_path):
    out = tmp_path / "n.json"
    p = subprocess.run([sys.executable, "-m", "gpubench", "nccl", "-b", "1M", "-e", "4M", "-n", "5", "--samples", "2",
                        "--expect-busbw", "100000", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stderr
    assert "below --expect-busbw" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    d = json.loads(out.read_text())  # the result is saved before the verdict
    assert d["command"] == "nccl" and d["records"]
    ok = subprocess.run([sys.executable, "-m", "gpubench", "nccl", "-b", "1M", "-e", "1M", "-n", "5", "--samples", "2",
                         "--expect-busbw", "0.001"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "Avg bus bandwidth" in ok.stdout


def test_root_not_a_rank_exits_2(gpu_count):
    p = subprocess.run([sys.executable, "-m", "gpubench", "nccl", "broadcast", "-r", str(gpu_count)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "root" in p.stderr

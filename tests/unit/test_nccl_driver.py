"""nccl through the one driver (core/benchmark.run): when a later point's NCCL call fails, the
points finished before it are kept as a partial result (failed_by set, exit 3 in the CLI).

The driver, the Nccl plug-in (setup, measure, the drain, the teardown) and nccl_launch's
launcher, launch loop and timed samples are the real ones. Where a GPU with NCCL is visible the
whole stack is real and the failing call is a real NCCL call with an invalid data type; where none
is, the layer under them stands in: the GPU lookup, the communicators, each rank's stream and
buffers (a stream that is always done), the data initialisation and check, and the NCCL calls.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from gpubench.plugins.nccl import bench as N
from gpubench.plugins.nccl import data as D
from gpubench.plugins.nccl import launch as L
from gpubench.core import gpu
from gpubench.core.errors import MachineError

FAULT_AT = 1 << 16  # the first size whose NCCL call fails
INVALID_DTYPE = 255  # not an ncclDataType_t: NCCL answers ncclInvalidArgument


def _gpu_with_nccl() -> bool:
    if not gpu.gpu_available():
        return False
    try:
        from cupy.cuda import nccl
    except Exception:
        return False
    return bool(getattr(nccl, "available", False))


class NcclError(RuntimeError):
    """Stands in for CuPy's NcclError (the plug-in knows it by its type's name, as CuPy's)."""


class _Stream:
    ptr = 0
    done = True  # nothing is ever left queued


class _Comm:
    def __init__(self):
        self.destroyed = False

    def check_async_error(self):
        pass

    def abort(self):
        pass

    def destroy(self):
        self.destroyed = True


class _Rank:
    """A rank with a stream that is always done and buffers that are only numbers."""

    def __init__(self, rank, device, comm, maxbytes):
        self.rank, self.device, self.comm, self.aborted = rank, device, comm, False
        self.stream = _Stream()
        self.send = SimpleNamespace(ptr=1 << 40, allocator="stand-in")
        self.recv = SimpleNamespace(ptr=2 << 40, allocator="stand-in")
        self.freed = False

    def free(self):
        self.freed = True


def _stand_in_gpu_and_nccl(monkeypatch) -> dict:
    """The layer under the plug-in on a machine without a GPU; returns what was made, to check."""
    made: dict = {"comms": [], "ranks": [], "calls": 0}
    fake_cupy = SimpleNamespace(cuda=SimpleNamespace(runtime=SimpleNamespace(CUDARuntimeError=type("Never", (Exception,), {}))))
    monkeypatch.setattr(gpu, "require_gpu", lambda: fake_cupy)
    monkeypatch.setattr(gpu, "device_count", lambda: 1)
    monkeypatch.setattr(gpu, "device_free_bytes", lambda d: (64 << 30, 80 << 30))

    def init_all(devices):
        made["comms"] = [_Comm() for _ in devices]
        return made["comms"]

    fake_nccl = SimpleNamespace(NcclCommunicator=SimpleNamespace(initAll=init_all), get_version=lambda: 22809)
    monkeypatch.setattr(N, "nccl_module", lambda: fake_nccl)

    def rank(*args):
        made["ranks"].append(_Rank(*args))
        return made["ranks"][-1]

    monkeypatch.setattr(N, "Rank", rank)
    monkeypatch.setattr(D, "init_data", lambda *a, **k: None)
    monkeypatch.setattr(D, "check", lambda *a, **k: 0)

    def count():
        made["calls"] += 1

    monkeypatch.setattr(L, "_calls", lambda *a, **k: [(count, ())])
    return made


def _real_bad_call(ranks):
    """An all-reduce of a data type NCCL does not have: CuPy raises NcclError (ncclInvalidArgument)."""
    rk = ranks[0]
    rk.comm.allReduce(rk.send.ptr, rk.recv.ptr, 1, INVALID_DTYPE, 0, rk.stream.ptr)


def _stand_in_bad_call(ranks):
    raise NcclError("NCCL_ERROR_INVALID_ARGUMENT: invalid argument (run with NCCL_DEBUG=WARN for details)")


@pytest.fixture
def fault_at(monkeypatch) -> dict | None:
    """NCCL calls fail from FAULT_AT bytes on; returns the stand-ins' record (None: real GPU and NCCL)."""
    pytest.importorskip("cupy")  # the plug-in's setup imports CuPy even around the stand-ins
    real = _gpu_with_nccl()
    made = None if real else _stand_in_gpu_and_nccl(monkeypatch)
    calls = L._calls
    bad_call = _real_bad_call if real else _stand_in_bad_call

    def calls_failing_from_fault_at(ranks, coll, cc, dt, *rest):
        if cc.param_count * dt.size >= FAULT_AT:
            return [(bad_call, (ranks,))]
        return calls(ranks, coll, cc, dt, *rest)

    monkeypatch.setattr(L, "_calls", calls_failing_from_fault_at)
    return made


def test_a_later_nccl_fault_keeps_the_finished_points(fault_at):
    made = fault_at
    spec = N.NcclSpec(sizes=(4096, 16384, FAULT_AT, 4 * FAULT_AT), devices=(0,), warmup=1, iters=3, samples=2,
                      check=1, places=("out-of-place", "in-place"))
    with pytest.raises(MachineError) as e:
        N.run(spec)
    err = e.value
    assert "NCCL call failed" in err.one_line() and "invalid argument" in err.one_line().lower()
    part = err.partial_result
    assert part is not None and part.partial and part.interrupted_by is None
    assert part.failed_by == err.one_line()
    # the two sizes before FAULT_AT, both placements, in order, each measured and checked
    assert [(r.params["nbytes"], r.params["placement"]) for r in part.records] == [
        (4096, "out-of-place"), (4096, "in-place"), (16384, "out-of-place"), (16384, "in-place")]
    for r in part.records:
        assert r.error is None and len(r.samples_s) == 2 and all(t > 0 for t in r.samples_s)
        assert r.extra["wrong"] == 0 and r.reps == 3
    assert part.spec["nranks"] == 1 and part.spec["devices"] == [0] and "expect_busbw_gbps" not in part.spec
    assert part.timing["iters"] == 3 and "BenchTime" in part.timing["method"]
    assert "version" in part.env["nccl"]
    if made is not None:  # the teardown ran: buffers freed, communicators destroyed
        assert made["calls"] > 0
        assert all(rk.freed for rk in made["ranks"]) and all(c.destroyed for c in made["comms"])


def test_the_command_prints_and_saves_the_finished_points_then_exits_3(fault_at, run_cli, tmp_path):
    out = tmp_path / "n.json"
    code, stdout, stderr = run_cli("nccl", "-d", "0", "-b", "4K", "-e", "256K", "-n", "3", "--samples", "2",
                                   "--placement", "out-of-place", "--json", out)
    assert code == 3, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpubench: error: NCCL call failed"), stderr
    assert "PARTIAL: stopped by a fault (NCCL call failed" in stdout and "(partial)" in stdout
    d = json.loads(out.read_text())
    assert d["partial"] is True and d["failed_by"].startswith("NCCL call failed")
    assert [r["params"]["nbytes"] for r in d["records"]] == [4096, 16384]


def test_the_report_of_a_fault_says_so():
    from gpubench.plugins.nccl import command as cmd
    from gpubench.core.result import Result

    spec = N.NcclSpec(sizes=(1 << 20,), places=("out-of-place",))
    res = Result(command="nccl", spec=spec.to_dict(nranks=2), timing=N._timing(spec), partial=True,
                 failed_by="NCCL call failed: unhandled system error",
                 records=N.to_records(spec, [N.Point(1 << 20, 1 << 18, "out-of-place", [1e-4], 0)], 2))
    notes = [x for x in cmd.format_report(res) if isinstance(x, str)]
    assert any(n.startswith("PARTIAL: stopped by a fault (NCCL call failed: unhandled system error)") for n in notes)


def test_expect_busbw_is_in_the_saved_spec_only_when_given():
    spec = N.NcclSpec(sizes=(1 << 20,), expect_busbw_gbps=100.0)
    assert spec.to_dict(nranks=2)["expect_busbw_gbps"] == 100.0 and list(spec.to_dict(nranks=2))[-2:] == [
        "nranks", "expect_busbw_gbps"]
    assert "expect_busbw_gbps" not in N.NcclSpec().to_dict()

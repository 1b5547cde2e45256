"""The watch over ``nccl --scheduler-address`` (one rank per Dask worker), on a real LocalCluster.

The ranks' work is replaced by plain Python functions (no GPU here): what is tested is the client's
side, which must end the run within a bounded time and name the worker or rank when a worker
leaves, a rank's task fails, or a rank stops making progress. Nothing here measures anything.
The GPU run of the same path (real NCCL ranks, a worker killed mid-run) is
tests/gpu/test_nccl_dask_gpu.py.
"""

from __future__ import annotations

import threading
import time

import pytest

distributed = pytest.importorskip("distributed")

from gpubench.plugins.nccl import over_dask as nccl  # noqa: E402
from gpubench.core.errors import MachineError  # noqa: E402


@pytest.fixture
def cluster(monkeypatch):
    """Two in-process workers (inproc://, so the stand-in ranks below need no pickling; the address
    check, which knows only network addresses, is skipped for it)."""
    from distributed import LocalCluster

    from gpubench.launch import scheduler

    monkeypatch.setattr(scheduler, "check_scheduler_address", lambda address: None)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None,
                      scheduler_port=0) as c:
        yield c


def _spec(cluster, timeout_s=2.0):
    return nccl.NcclSpec(sizes=(1024,), timeout_s=timeout_s, scheduler_address=cluster.scheduler_address)


def _fake_uid():
    return ("uid",)


# The stand-in ranks run on in-process workers, so module state is shared with the test; the
# function is pickled by reference (a module-level name), the state is not pickled at all.
STATE = {"points": 0, "then": "stall"}
STOP = threading.Event()


def _fake_rank(spec, uid, rank, nranks, topic):
    """Logs STATE["points"] points (rank 0 one more), then rank 1 fails or stalls; rank 0 waits, as
    NCCL would, until the test ends."""
    from distributed import get_worker

    w = get_worker()
    for n in range(STATE["points"] if rank == 1 else STATE["points"] + 1):
        w.log_event(topic, {"rank": rank, "points": n})
    if rank == 1 and STATE["then"] == "fail":
        raise RuntimeError("NCCL error: unhandled system error (run with NCCL_DEBUG=INFO)\nsecond line")
    while not STOP.is_set():
        time.sleep(0.05)
    return {"rank": rank, "host": "h", "device": rank, "points": []}


def _stand_in_ranks(monkeypatch, worker_run):
    """Every rank runs ``worker_run``; yields STATE to configure. The workers are let go at the end."""
    monkeypatch.setattr(nccl, "_worker_unique_id", _fake_uid)
    monkeypatch.setattr(nccl, "_worker_run", worker_run)
    STOP.clear()
    yield STATE
    STOP.set()


@pytest.fixture
def ranks(monkeypatch):
    """The stand-in ranks that log progress only (_fake_rank)."""
    yield from _stand_in_ranks(monkeypatch, _fake_rank)


def _bounded(spec, limit_s=30.0) -> dict:
    """run_on_dask in a daemon thread: {"result": ...} or {"error": what it raised}; fails the test
    (instead of hanging the suite) if it has not ended within limit_s."""
    box: dict = {}

    def target():
        try:
            box["result"] = nccl.run_on_dask(spec)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), f"run_on_dask did not end within {limit_s} s"
    return box


def _run_bounded(spec, limit_s=30.0):
    """What run_on_dask raised (None if it returned), within limit_s."""
    return _bounded(spec, limit_s).get("error")


def _machine_error(spec) -> str:
    err = _run_bounded(spec)
    assert isinstance(err, MachineError), repr(err)
    return err.one_line()


def test_a_stalled_rank_is_named_within_the_timeout(cluster, ranks):
    ranks.update(points=1, then="stall")
    t0 = time.monotonic()
    msg = _machine_error(_spec(cluster, timeout_s=2.0))
    took = time.monotonic() - t0
    assert "rank 1 (" in msg and "rank 0" not in msg, msg
    assert "after 0 point(s)" in msg and "--timeout 2 s" in msg, msg
    assert took < 2.0 + 5, took


def test_a_failing_rank_ends_the_run_at_once_with_its_first_line(cluster, ranks):
    ranks.update(points=0, then="fail")
    t0 = time.monotonic()
    msg = _machine_error(_spec(cluster, timeout_s=60.0))
    assert "NCCL error: unhandled system error" in msg and "second line" not in msg, msg
    assert time.monotonic() - t0 < 10  # not the 60 s of -T: the failure is seen on the next poll


def test_a_worker_that_leaves_is_named(cluster, ranks):
    ranks.update(points=0, then="stall")
    addresses = sorted(cluster.scheduler.workers)
    leaving = next(w for w in cluster.workers.values() if w.address == addresses[1])

    def close_later():
        time.sleep(1.0)
        cluster.loop.add_callback(leaving.close)

    threading.Thread(target=close_later, daemon=True).start()
    t0 = time.monotonic()
    msg = _machine_error(_spec(cluster, timeout_s=60.0))
    assert f"worker 1 ({addresses[1]}) died" in msg, msg
    assert time.monotonic() - t0 < 15


def test_stall_watch_names_the_ranks_with_fewest_points():
    now = [0.0]
    events: list = []
    w = nccl.StallWatch(lambda: list(events), ["tcp://a:1", "tcp://b:2", "tcp://c:3"], 10.0, clock=lambda: now[0])
    events += [(0, {"rank": 0, "points": 0}), (0, {"rank": 1, "points": 0})]
    w()
    now[0] = 9.0
    w()  # rank 2 never came up, but 10 s have not passed since the last change
    events.append((9, {"rank": 0, "points": 1}))
    now[0] = 15.0
    w()  # rank 0 moved at 15: the clock restarts
    now[0] = 25.5
    with pytest.raises(MachineError) as ei:
        w()
    msg = ei.value.one_line()
    assert "rank 2 (tcp://c:3) stopped answering before the communicator was up" in msg, msg
    assert "rank 0" not in msg and "rank 1" not in msg


def test_stall_watch_with_no_timeout_never_raises():
    now = [0.0]
    w = nccl.StallWatch(lambda: [], ["tcp://a:1"], 0.0, clock=lambda: now[0])
    now[0] = 1e9
    w()


def test_scheduler_connect_timeout_is_dasks_own_capped_by_T():
    import dask.config

    from gpubench.plugins.nccl.over_dask import connect_timeout

    with dask.config.set({"distributed.comm.timeouts.connect": "45s"}):
        assert connect_timeout(0) == 45 and connect_timeout(300) == 45 and connect_timeout(10) == 10
    with dask.config.set({"distributed.comm.timeouts.connect": "2 minutes"}):
        assert connect_timeout(0) == 120


# -- the client runs the driver: points arrive one by one, the finished ones survive a fault ---------


def _reported_point(rank, size, place):
    return {"nbytes": size, "count": size // 4, "place": place, "samples_s": [1e-5 * (rank + 1), 3e-5 * (rank + 1)],
            "wrong": 0, "error": None}


def _reporting_rank(spec, uid, rank, nranks, topic):
    """Logs each point as a real rank does (nccl_dask._worker_run's events); with STATE["then"] ==
    "fail", rank 1 fails after STATE["points"] points and rank 0 waits for it, as NCCL would."""
    from distributed import get_worker

    from gpubench.plugins.nccl.bench import point_keys

    w = get_worker()
    w.log_event(topic, {"rank": rank, "points": 0})
    w.log_event(topic, {"rank": rank, "points": 0, "info": {"host": "h", "device": rank, "allocator": "stand-in",
                                                          "nccl": {"version": 22809, "env": {}}}})
    done = []
    for size, place in point_keys(spec):
        if STATE["then"] == "fail" and len(done) == STATE["points"]:
            if rank == 1:
                raise RuntimeError("NCCL error: remote process exited or there was a network error")
            while not STOP.is_set():
                time.sleep(0.05)
        done.append(_reported_point(rank, size, place))
        w.log_event(topic, {"rank": rank, "points": len(done), "point": done[-1]})
    return {"rank": rank, "host": "h", "device": rank, "allocator": "stand-in",
            "nccl": {"version": 22809, "env": {}}, "points": done}


@pytest.fixture
def reporting_ranks(monkeypatch):
    """The stand-in ranks that report points (_reporting_rank)."""
    yield from _stand_in_ranks(monkeypatch, _reporting_rank)


def _sweep(cluster, timeout_s=60.0):
    return nccl.NcclSpec(sizes=(1024, 4096), timeout_s=timeout_s, scheduler_address=cluster.scheduler_address)


def test_every_point_comes_through_the_driver(cluster, reporting_ranks):
    reporting_ranks.update(points=0, then="finish")
    box = _bounded(_sweep(cluster))
    assert "error" not in box, repr(box.get("error"))
    res = box["result"]
    assert not res.partial and res.spec["nranks"] == 2 and "devices" in res.spec
    assert [(r.params["nbytes"], r.params["placement"]) for r in res.records] == [
        (1024, "out-of-place"), (1024, "in-place"), (4096, "out-of-place"), (4096, "in-place")]
    assert res.records[0].samples_s == pytest.approx([1.5e-5, 4.5e-5])  # averaged over the ranks (-a 1)
    assert [w["rank"] for w in res.env["dask_workers"]] == [0, 1] and res.env["nccl"]["version"] == 22809
    assert res.timing["buffers"] == "stand-in"


def test_a_failing_rank_keeps_the_points_every_rank_finished(cluster, reporting_ranks):
    reporting_ranks.update(points=3, then="fail")
    err = _run_bounded(_sweep(cluster))
    assert isinstance(err, MachineError), repr(err)
    assert "remote process exited" in err.one_line()
    part = err.partial_result
    assert part is not None and part.partial and part.failed_by == err.one_line()
    assert [(r.params["nbytes"], r.params["placement"]) for r in part.records] == [
        (1024, "out-of-place"), (1024, "in-place"), (4096, "out-of-place")]
    assert all(r.extra["wrong"] == 0 and len(r.samples_s) == 2 for r in part.records)
    assert [w["host"] for w in part.env["dask_workers"]] == ["h", "h"]

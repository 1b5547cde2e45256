"""scheduler.results_within on a real distributed LocalCluster: the fetch of a finished future's
result is bounded, so a worker stopped between the wait and the fetch stops the step within its time
instead of holding it for ever (CI: merge held past 120 s against --timeout 30)."""

from __future__ import annotations

import time

import psutil
import pytest

distributed = pytest.importorskip("distributed")


@pytest.fixture
def cluster():
    from distributed import Client, LocalCluster

    c = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                     host="127.0.0.1")
    client = Client(c)
    yield client
    for w in psutil.Process().children(recursive=True):
        try:
            w.resume()
        except psutil.Error:
            pass
    client.close(timeout=5)
    c.close(timeout=10)


def _worker_process():
    for c in psutil.Process().children(recursive=True):
        cmd = " ".join(c.cmdline())
        if "spawn_main" in cmd and "resource_tracker" not in cmd:
            return c
    raise AssertionError("no worker process")


def test_results_come_back_from_a_live_worker(cluster):
    from gpubench.launch.scheduler import results_within, wait_watching

    workers = {a: i for i, a in enumerate(cluster.scheduler_info()["workers"])}
    futs = [cluster.submit(pow, 2, k, pure=False) for k in range(4)]
    wait_watching(cluster, futs, workers, 30, "test")
    assert results_within(cluster, futs, workers, 30, "test") == [1, 2, 4, 8]


def test_a_worker_stopped_after_the_wait_stops_the_fetch_within_its_time(cluster):
    from gpubench.core.errors import MachineError
    from gpubench.launch.scheduler import results_within, wait_watching

    workers = {a: i for i, a in enumerate(cluster.scheduler_info()["workers"])}
    fut = cluster.submit(bytes, 1 << 20, pure=False)  # the result stays on the worker
    wait_watching(cluster, [fut], workers, 30, "test")
    _worker_process().suspend()
    t0 = time.monotonic()
    with pytest.raises(MachineError) as e:
        results_within(cluster, [fut], workers, 2.0, "run 3/9 (counting rows)")
    wall = time.monotonic() - t0
    assert "run 3/9 (counting rows): the results did not come back from the workers within 2 s" in e.value.message
    assert wall < 2.0 + 5, wall  # the limit, and check_workers' round trip to the live scheduler

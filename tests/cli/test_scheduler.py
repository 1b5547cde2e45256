"""launch/scheduler on a real distributed LocalCluster.

- results_within: the fetch of a finished future's result is bounded, so a worker stopped between
  the wait and the fetch stops the step within its time instead of holding it for ever (and merge
  within its --timeout).
- check_workers: a worker that left is named with the step it left in; a healthy worker is never
  called dead, even when the client's cached view of the scheduler is empty.
"""

from __future__ import annotations

import time

import pytest

distributed = pytest.importorskip("distributed")


@pytest.fixture
def cluster():
    psutil = pytest.importorskip("psutil")
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
    import psutil  # the cluster fixture skipped where it is missing

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


# ---- check_workers: a worker that left is named, a healthy one never ----

def test_check_workers_reads_the_scheduler_not_the_clients_cache(monkeypatch):
    """client.scheduler_info() returns the client's cached identity when its refresh fails with an
    OSError (distributed logs "Unable to query scheduler for identity" and keeps the cache), and the
    periodic refresh fills that cache with n_workers=0: no workers. check_workers asks the scheduler
    itself, so a busy scheduler never makes a healthy worker look dead. Here the periodic refresh's
    empty identity is in the cache and the refresh fails as distributed's does on an OSError; the
    workers must still be seen."""
    from distributed import Client, LocalCluster

    from gpubench.launch import scheduler

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as c, \
            Client(c) as client:
        workers = {a: i for i, a in enumerate(client.scheduler_info(n_workers=-1)["workers"])}
        assert len(workers) == 2
        client.sync(client._update_scheduler_info)  # the periodic refresh: n_workers=0
        if scheduler._identity_lists_every_worker():  # distributed#9045 on: the refresh lists no worker
            assert client._scheduler_identity["workers"] == {}
        # (before it, as in the lowest dask the constraints pin, every identity lists every worker)

        async def refresh_fails(n_workers=0):  # distributed's path on OSError: log and keep the cache
            return None

        monkeypatch.setattr(client, "_update_scheduler_info", refresh_fails)
        for _ in range(20):
            scheduler.check_workers(client, workers, "a run")  # never "worker 0 ..., worker 1 ... died"

def test_check_workers_still_names_a_worker_that_left():
    from distributed import Client, LocalCluster

    from gpubench.launch import scheduler
    from gpubench.core.errors import MachineError

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as c, \
            Client(c) as client:
        workers = {a: i for i, a in enumerate(sorted(client.scheduler_info(n_workers=-1)["workers"]))}
        gone = sorted(workers)[1]
        client.retire_workers([gone], close_workers=True)
        t0 = time.monotonic()
        with pytest.raises(MachineError) as e:
            scheduler.check_workers(client, workers, "run 1/1 (join)")
        assert f"worker 1 ({gone}) died during run 1/1 (join)" in e.value.message
        assert time.monotonic() - t0 < 10

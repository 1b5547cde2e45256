"""``gpubench merge`` at bad moments and with hostile values (issue 18): bounds checked before any
cluster starts, a --timeout that holds with the CPUs saturated, SIGINT/SIGTERM at every moment of
a run, no dashboard warning with port 8787 taken, loopback-only listeners, and the worker check
that must not call a healthy worker dead. Real LocalClusters, real signals, real busy loops."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("distributed")
pytest.importorskip("pandas")
pytest.importorskip("dask.dataframe")
psutil = pytest.importorskip("psutil")

BIG = "9" * 400


def _has_ucxx() -> bool:
    try:
        import distributed_ucxx  # noqa: F401
        return True
    except Exception:
        return False


PROTOCOLS = ["tcp", pytest.param("ucx", marks=pytest.mark.skipif(not _has_ucxx(), reason="distributed-ucxx "
                                                                   "not installed"))]


def _workers_of(pid: int | None = None) -> list:
    """Dask worker processes (multiprocessing spawn children) under ``pid`` (default: this process)."""
    root = psutil.Process(pid) if pid else psutil.Process()
    out = []
    for c in root.children(recursive=True):
        try:
            cmd = " ".join(c.cmdline())
        except psutil.Error:
            continue
        if "spawn_main" in cmd and "resource_tracker" not in cmd and c.status() != psutil.STATUS_ZOMBIE:
            out.append(c)
    return out


# --- item 1: bounds, before any cluster starts ------------------------------------------------------


@pytest.mark.parametrize("args, needle", [
    (["-c", "2147483648"], "-c/--chunk-size 2147483648: both frames"),
    (["-c", BIG], "-c/--chunk-size (a 400-digit number) is too large"),
    (["--base-chunks", "2147483648"], "--base-chunks 2147483648: 2,147,483,649 partitions"),
    (["--base-chunks", BIG], "--base-chunks (a 400-digit number) is too large"),
    (["--other-chunks", "2147483648"], "--other-chunks 2147483648: 2,147,483,649 partitions"),
    (["--other-chunks", BIG], "--other-chunks (a 400-digit number) is too large"),
    (["-c", "4611686018427387904", "--base-chunks", "2"], "numbers keys past int64"),
    (["--runs", "2147483648"], "--runs 2147483648 is too large (at most 1,000,000)"),
    (["--runs", BIG], "--runs (a 400-digit number) is too large"),
    (["--warmup-runs", "2147483648"], "--warmup-runs 2147483648 is too large (at most 1,000,000)"),
    (["--threads-per-worker", BIG], "--threads-per-worker (a 400-digit number) is too large (at most"),
    (["--threads-per-worker", "2147483648"], "--threads-per-worker 2147483648 is too large (at most"),
    (["--timeout", "inf"], "--timeout 'inf' is not a duration"),
    (["--timeout", "nan"], "--timeout 'nan' is not a duration"),
    (["--timeout", "1e400"], "--timeout '1e400' is not a duration"),
    (["--timeout", BIG], "is not a duration"),
    (["--timeout", "1e12"], "--timeout 1000000000000 is too long (at most 9,223,372,036 s)"),
    (["--timeout", "0"], "--timeout 0 must be > 0 seconds"),
    (["--frac-match", "nan"], "--frac-match 'nan' is not a finite number"),
    (["--frac-match", "1.5"], "--frac-match 1.5 is too large (at most 1)"),
    (["-c", "١٢"], "-c/--chunk-size '١٢' is not an integer"),
    (["--runs", "١"], "--runs '١' is not an integer"),
    (["--scheduler-address", ""], "--scheduler-address '' is empty"),
    (["--scheduler-address", "tcp://:8786"], "--scheduler-address 'tcp://:8786' names no host"),
    (["--scheduler-file", ""], "--scheduler-file '' is empty"),
    (["-d", ",".join(map(str, range(100_000)))], "-d/--devices names 100,000 devices, more than one machine has "
                                                 "(at most 1,024"),
])
def test_a_value_too_large_is_refused_in_one_line_before_any_cluster(run_cli, args, needle):
    before = {p.pid for p in _workers_of()}
    code, out, err = run_cli("merge", "-t", "cpu", *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err
    assert {p.pid for p in _workers_of()} <= before  # no worker was started


@pytest.mark.parametrize("above", ["10**26", "limit + 1", "limit * 1000"])
def test_every_too_large_thread_count_names_the_machines_own_limit(run_cli, above):
    """Whether the value passes int64 or not, the line names the limit this machine has (threads-max,
    RLIMIT_NPROC), not the width of a C integer; with two workers it is shared and says so."""
    from gpubench.core.options import machine_threads

    limit = machine_threads()
    value = eval(above, {"limit": limit})  # noqa: S307 - the three expressions above
    code, _out, err = run_cli("merge", "-t", "cpu", "--threads-per-worker", str(value))
    assert code == 2 and f"at most {limit:,})" in err and "9,223,372" not in err, err
    code, _out, err = run_cli("merge", "-t", "cpu", "-d", "0,1", "--threads-per-worker", str(limit))
    assert code == 2 and f"at most {max(1, limit // 2):,}: {limit:,} threads this machine lets one user run" in err, err
    assert "shared by 2 worker(s)" in err


def test_the_memory_refusal_names_the_largest_chunk_size_that_fits(run_cli):
    """-c past the workers' memory: one line with the largest -c that fits; that -c passes the same
    check while twice as many rows do not (the arithmetic, not a guess; a fixed worker limit, since
    the host's available memory moves while other work runs)."""
    from gpubench.plugins.merge import cluster as mc
    from gpubench.plugins.merge.bench import MergeSpec
    from gpubench.core.errors import UsageError

    code, _out, err = run_cli("merge", "-t", "cpu", "-d", "0,1", "-c", "2147483648")
    assert code == 2 and "on every worker" in err and "the largest -c/--chunk-size that fits is" in err, err
    limit = 8 * 2**30
    with pytest.raises(UsageError) as e:
        mc.check_frames_fit(MergeSpec(merge_type="cpu", devices=(0, 1), chunk_size=2147483648), None,
                            worker_limit=limit)
    largest = int(e.value.one_line().rsplit("that fits is ", 1)[1].split(")")[0].replace(",", ""))
    assert largest == (limit - mc.WORKER_BASE_BYTES) // 3 // (2 * 24 + 2 * 16)
    mc.check_frames_fit(MergeSpec(merge_type="cpu", devices=(0, 1), chunk_size=largest), None, worker_limit=limit)
    with pytest.raises(UsageError):
        mc.check_frames_fit(MergeSpec(merge_type="cpu", devices=(0, 1), chunk_size=largest + 1), None,
                            worker_limit=limit)


def test_frames_are_counted_on_every_worker_with_the_shuffle_copies():
    from gpubench.plugins.merge import cluster as mc
    from gpubench.plugins.merge.bench import MergeSpec
    from gpubench.core.errors import UsageError

    spec = MergeSpec(merge_type="cpu", devices=(0, 1), chunk_size=1_000_000, base_chunks=3, other_chunks=2)
    # (3 x 24 B + 2 x 16 B) x 1e6 rows x 3 copies
    assert mc.worker_need_bytes(spec, 2) == 3 * 1_000_000 * (3 * 24 + 2 * 16)
    room = mc.worker_need_bytes(spec, 2) + mc.WORKER_BASE_BYTES
    mc.check_frames_fit(spec, None, worker_limit=room)
    with pytest.raises(UsageError) as e:
        mc.check_frames_fit(spec, None, worker_limit=room - 1)
    assert "need" in e.value.message and "a worker (its memory limit)" in e.value.message
    # on a GPU the room is the device's, per device
    gspec = MergeSpec(merge_type="gpu", devices=(0,), chunk_size=10**9)
    with pytest.raises(UsageError) as e:
        mc.check_frames_fit(gspec, None, device_free={0: 100 * 2**30})
    assert "GPU 0" in e.value.message and "largest -c/--chunk-size that fits is" in e.value.one_line()


def test_unicode_digits_in_timeout_read_as_python_reads_them():
    from gpubench.plugins.merge.command import parse_timeout

    assert parse_timeout("١.٥") == 1.5 and parse_timeout("10s") == 10 and parse_timeout("2m") == 120 and parse_timeout("5 minutes") == 300


# --- item 2: the deadline holds with the CPUs saturated ----------------------------------------------


@pytest.fixture
def saturated_cpus():
    """Four busy loops (two per core on the 2-core CI machine) for the test's duration."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4)]
    time.sleep(0.5)
    yield loops
    for p in loops:
        p.kill()
    for p in loops:
        p.wait()


@pytest.mark.parametrize("timeout", ["1.5", "١.٥"])
def test_timeout_holds_with_the_cpus_saturated(run_cli, saturated_cpus, timeout):
    """merge -t cpu -c 2000 --runs 1 --warmup-runs 0 --timeout 1.5 with 4 busy loops: it used to hang
    past 120 s in the cluster start. Now every step (the start included) is bounded by --timeout,
    and a close by 3-10 s plus the kill of leftover workers. Imports are done first (under this
    load they take tens of seconds, which is not the deadline's business)."""
    import distributed  # noqa: F401
    import dask.dataframe  # noqa: F401

    from gpubench.plugins.merge import bench as merge  # noqa: F401

    load = os.getloadavg()[0]
    t0 = time.monotonic()
    code, out, err = run_cli("merge", "-t", "cpu", "-c", "2000", "--runs", "1", "--warmup-runs", "0",
                             "--timeout", timeout, "-q")
    wall = time.monotonic() - t0
    print(f"wall {wall:.1f} s, exit {code}, load {load:.1f}: {err.strip()[-200:]}")
    # at most ~6 steps of 1.5 s each had it started (0 then), or 1.5 s and a close if not
    assert wall < 6 * 1.5 + 15, (wall, err)
    assert code in (0, 3), err
    if code == 3:
        assert "within --timeout 1.5 s" in err and "Traceback" not in err
    deadline = time.monotonic() + 5
    while _workers_of() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _workers_of() == []


def test_a_stuck_worker_stops_the_run_within_the_timeout(tmp_path):
    """A worker stopped (SIGSTOP) mid-run answers nothing: the run ends with exit 3 within
    --timeout (30 s: the cluster's start on a loaded 2-core host must fit in it too) plus a bounded
    margin, and no process is left (the stopped one is killed)."""
    out = tmp_path / "m.json"
    p = subprocess.Popen([sys.executable, "-m", "gpubench", "merge", "-t", "cpu", "-d", "0,1", "-c", "20_000",
                          "--runs", "1000", "--warmup-runs", "0", "--timeout", "30", "--json", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(_workers_of(p.pid)) < 2 and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.2)
        while not out.exists() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.5)  # not there yet: it appears only at the end
            if time.monotonic() > deadline - 100:  # ~20 s after the workers came up: runs under way
                break
        victim = _workers_of(p.pid)[0]
        victim.suspend()
        t0 = time.monotonic()
        _o, err = p.communicate(timeout=120)
        wall = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    print(f"ended {wall:.1f} s after the worker stopped: {err.strip()[-300:]}")
    assert p.returncode == 3, err
    assert wall < 30 + 30, wall  # one --timeout, the close, the kill (a busy 2-core host)
    assert "Traceback" not in err
    assert not psutil.pid_exists(victim.pid) or victim.status() == psutil.STATUS_ZOMBIE
    if out.exists():  # a timed run had finished before the worker stopped (not always, on a loaded host)
        data = json.loads(out.read_text())
        assert data["partial"] is True and data["failed_by"]


# --- items 6, 10, 12: a signal at every moment ----------------------------------------------------


def _signalled_run(tmp_path, protocol: str, at: float, sig=signal.SIGINT) -> tuple:
    out = tmp_path / f"m-{protocol}-{at}.json"
    p = subprocess.Popen([sys.executable, "-m", "gpubench", "merge", "-t", "cpu", "-d", "0,1", "-p", protocol,
                          "-c", "20_000", "--runs", "3", "--json", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    time.sleep(at)
    try:
        os.killpg(p.pid, sig)  # the whole group, as a terminal's Ctrl-C
    except ProcessLookupError:
        pass
    try:
        o, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    left = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = [q for q in psutil.process_iter(["cmdline"]) if q.info["cmdline"]
                and str(out) in " ".join(q.info["cmdline"])]
        if not left:
            break
        time.sleep(0.2)
    return p.returncode, o, err, out, left


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_sigint_at_every_half_second_of_the_first_8_s(tmp_path, protocol):
    """SIGINT to the process group at 0.5, 1.0 ... 8.0 s after `merge -t cpu` starts: imports, the
    cluster start, the runs, the close, the report. Each: exit 130 (or 0 when the run had already
    ended), no traceback from gpubench or any worker, the result kept when a run had finished, no
    process left. It used to be lost between about 2 and 4 s (the start ignored SIGINT)."""
    seen = {}
    for k in range(1, 17):
        at = 0.5 * k
        code, o, err, out, left = _signalled_run(tmp_path, protocol, at)
        seen[at] = code
        assert code in (130, 0), (at, code, err)
        # UCXX's listener logs a traceback ("UCXPY  ERROR Unexpected error in listener handler",
        # "Listener object is being destroyed") when a peer resets in its handshake while the
        # cluster closes; gpubench's workers start with UCXPY_LOG_LEVEL=CRITICAL and its own "ucx"
        # logger goes quiet at the close (merge_cluster.quiet_closing_logs), so none may show.
        for bad in ("Traceback", "KeyboardInterrupt", "MessageTruncatedError", "UCXXConnectionResetError",
                    "Exception ignored", "Port 8787", "UCXPY"):
            assert bad not in err, (at, err)
        assert left == [], (at, left)
        if code == 130 and out.exists():
            assert json.loads(out.read_text())["partial"] in (True, False)
        if code == 0:
            assert json.loads(out.read_text())["partial"] is False
    print(protocol, seen)
    assert list(seen.values()).count(130) >= 8  # most of the steps land before the run ends


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_sigint_during_the_cluster_start_exits_130(tmp_path, protocol):
    """The moment the old Ctrl-C test never reached: SIGINT as soon as the first worker process
    exists (the cluster is starting). Exit 130, no traceback, no process left."""
    out = tmp_path / "m.json"
    p = subprocess.Popen([sys.executable, "-m", "gpubench", "merge", "-t", "cpu", "-d", "0,1", "-p", protocol,
                          "-c", "20_000", "--runs", "3", "--json", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not _workers_of(p.pid) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.02)
    workers = _workers_of(p.pid)
    assert workers, "no worker process was seen"
    os.killpg(p.pid, signal.SIGINT)
    o, err = p.communicate(timeout=90)
    assert p.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert not out.exists()  # nothing was measured: nothing to keep
    time.sleep(1)
    assert not any(psutil.pid_exists(w.pid) and w.status() != psutil.STATUS_ZOMBIE for w in workers)


@pytest.mark.parametrize("at", [1.5, 4.0, 7.0])
def test_sigterm_at_any_moment_exits_143(tmp_path, at):
    code, o, err, out, left = _signalled_run(tmp_path, "tcp", at, signal.SIGTERM)
    assert code in (143, 0), (at, code, err)
    assert "Traceback" not in err and left == []


# --- item 7 and 11: no dashboard warning, loopback only ------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_port_8787_taken_no_warning_and_only_loopback_listeners(protocol, tmp_path):
    """With 8787 held by a listening socket: no "Port 8787 is already in use" warning, -q prints
    nothing, and every socket the process tree listens on is on 127.0.0.1 (none on 0.0.0.0/::)."""
    holder = socket.socket()
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 8787))
        holder.listen()
    except OSError:
        holder.close()
        holder = None  # someone else already listens on 8787: it is taken either way
    try:
        p = subprocess.Popen([sys.executable, "-m", "gpubench", "merge", "-t", "cpu", "-d", "0,1", "-p", protocol,
                              "-c", "20_000", "--runs", "2", "--warmup-runs", "0", "-q"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        listening = set()
        while p.poll() is None:
            try:
                tree = {p.pid} | {c.pid for c in psutil.Process(p.pid).children(recursive=True)}
                listening |= {(c.laddr.ip, c.laddr.port) for c in psutil.net_connections("inet")
                              if c.pid in tree and c.status == psutil.CONN_LISTEN}
            except psutil.Error:
                pass
            time.sleep(0.1)
        o, err = p.communicate()
    finally:
        if holder is not None:
            holder.close()
    assert p.returncode == 0, err
    assert o == "" and err == ""
    assert listening, "the cluster's listeners were not seen"
    wide = sorted(a for a in listening if a[0] not in ("127.0.0.1", "::1"))
    if protocol == "ucx" and wide and all(ip in ("0.0.0.0", "::") for ip, _ in wide):
        pytest.xfail(f"UCXX's listener (ucxx.create_listener, 0.52) takes a port but no address and binds "
                     f"INADDR_ANY: {wide}; UCX's own transports stay on lo")
    assert wide == []


# --- the flake: a healthy worker called dead -------------------------------------------------------


def test_check_workers_reads_the_scheduler_not_the_clients_cache(monkeypatch):
    """client.scheduler_info() returns the client's cached identity when its refresh fails with an
    OSError (distributed logs "Unable to query scheduler for identity" and keeps the cache), and the
    periodic refresh fills that cache with n_workers=0: no workers. check_workers read it, so a busy
    scheduler made every worker look dead ("both workers died", test_cpu_merge_runs_on_a_local_cluster
    [ucx] in CI). Here the periodic refresh's empty identity is in the cache and the refresh fails as
    distributed's does on an OSError; the workers must still be seen."""
    from distributed import Client, LocalCluster

    from gpubench.launch import scheduler

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as c, \
            Client(c) as client:
        workers = {a: i for i, a in enumerate(client.scheduler_info(n_workers=-1)["workers"])}
        assert len(workers) == 2
        client.sync(client._update_scheduler_info)  # the periodic refresh: n_workers=0
        assert client._scheduler_identity["workers"] == {}

        async def refresh_fails(n_workers=0):  # distributed's path on OSError: log and keep the cache
            return None

        monkeypatch.setattr(client, "_update_scheduler_info", refresh_fails)
        for _ in range(20):
            scheduler.check_workers(client, workers, "a run")  # raised "worker 0 ..., worker 1 ... died"


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


def test_distributed_ucxx_logger_quiet_on_own_workers_and_here():
    """distributed_ucxx's log_errors logs to "distributed_ucxx.ucxx", outside the "distributed"
    loggers silence_logs quiets, and Python's last-resort handler printed it as a bare traceback
    (CI: CancelledError in a ucx write, Ctrl-C 6 s into `merge -p ucx`). On gpubench's own workers
    (the worker preload, with tornado's and asyncio's) and in this process it is CRITICAL from the
    start; a user's preload stays."""
    import logging

    import dask

    from gpubench.plugins.merge import cluster as mc
    from gpubench.plugins.merge.bench import MergeSpec

    logging.getLogger("distributed_ucxx").setLevel(logging.NOTSET)
    with dask.config.set({"distributed.worker.preload": ["distributed.comm"]}):
        assert mc.worker_preload() == ["distributed.comm", mc.WORKER_PRELOAD]
        client, cluster = mc.open_client(MergeSpec(merge_type="cpu", devices=(0, 1), protocol="tcp"))
    try:
        on_workers = client.run(lambda: logging.getLogger("distributed_ucxx.ucxx").isEnabledFor(logging.ERROR))
        others = client.run(lambda: [logging.getLogger(n).getEffectiveLevel() for n in ("tornado.application",
                                                                                        "asyncio")])
        here = logging.getLogger("distributed_ucxx.ucxx").isEnabledFor(logging.ERROR)
        preloads = client.run(lambda dask_worker: [p.name for p in dask_worker.preloads])
    finally:
        mc.close_all(client, cluster)
    assert len(on_workers) == 2 and not any(on_workers.values()), on_workers
    assert not here
    assert all(v == [logging.CRITICAL] * 2 for v in others.values()), others  # heartbeat tracebacks
    assert all(p == ["distributed.comm", mc.WORKER_PRELOAD] for p in preloads.values()), preloads
    with dask.config.set({"distributed.worker.preload": mc.WORKER_PRELOAD}):
        assert mc.worker_preload() == [mc.WORKER_PRELOAD]


@pytest.mark.skipif(not _has_ucxx(), reason="distributed-ucxx is not installed")
def test_ucxx_logger_quiet_on_own_workers_unless_the_user_set_it(monkeypatch):
    """gpubench's own workers start with UCXPY_LOG_LEVEL=CRITICAL (dask's distributed.nanny.environ,
    which dask-cuda's LocalCUDACluster leaves alone) and this process's "ucx" logger is CRITICAL
    once the close began; a UCXPY_LOG_LEVEL the user set is what the workers get instead."""
    import logging

    from gpubench.plugins.merge import cluster as mc
    from gpubench.plugins.merge.bench import MergeSpec

    for user in (None, "INFO"):
        if user is None:
            monkeypatch.delenv("UCXPY_LOG_LEVEL", raising=False)
        else:
            monkeypatch.setenv("UCXPY_LOG_LEVEL", user)
        logging.getLogger("ucx").setLevel(logging.WARNING)
        client, cluster = mc.open_client(MergeSpec(merge_type="cpu", devices=(0, 1), protocol="ucx"))
        try:
            env = client.run(os.getenv, "UCXPY_LOG_LEVEL")  # os.environ.get would ship this process's environ
            levels = client.run(logging.getLogger("ucx").getEffectiveLevel)
        finally:
            mc.close_all(client, cluster)
        assert set(env.values()) == {user or "CRITICAL"}, env
        assert set(levels.values()) == {logging.getLevelName(user or "CRITICAL")}, levels
        assert logging.getLogger("ucx").level == (logging.WARNING if user else logging.CRITICAL)

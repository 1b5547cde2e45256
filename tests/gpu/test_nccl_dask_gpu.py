"""``gpubench nccl --scheduler-file`` on a real Dask cluster: one worker process per GPU, each seeing
one GPU (CUDA_VISIBLE_DEVICES), one NCCL rank per worker. Needs two GPUs and dask.distributed.

- the data check reports 0 wrong over both ranks and busbw is reported, launched one by one and
  as CUDA graphs (-G) captured in each worker;
- a worker killed (SIGKILL) mid-run ends the run with exit 3 naming the dead worker, within the
  watch's polling time, and the surviving worker is not left hanging in NCCL past -T.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

distributed = pytest.importorskip("distributed")

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.update(extra)
    return env


@pytest.fixture
def two_worker_cluster(tmp_path, gpu_count):
    """A scheduler and two no-nanny workers (GPU 0 and GPU 1); yields (scheduler file, workers'
    Popen objects by GPU). Everything is killed at the end."""
    if gpu_count < 2:
        pytest.skip("needs two GPUs")
    sfile = tmp_path / "scheduler.json"
    procs = []
    common = dict(stdout=subprocess.DEVNULL, stderr=open(tmp_path / "cluster.log", "w"), cwd=tmp_path)
    procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--port", "0",
                                   "--no-dashboard", "--scheduler-file", str(sfile)], env=_env(), **common))
    deadline = time.monotonic() + 60
    while not sfile.exists():
        assert time.monotonic() < deadline, "the scheduler did not start"
        time.sleep(0.2)
    workers = {}
    for dev in (0, 1):
        workers[dev] = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(sfile), "--no-nanny",
             "--nthreads", "1", "--no-dashboard", "--name", f"gpu{dev}", "--memory-limit", "0"],
            env=_env(CUDA_VISIBLE_DEVICES=str(dev)), **common)
        procs.append(workers[dev])
    from distributed import Client

    with Client(scheduler_file=str(sfile), timeout=60) as c:
        c.wait_for_workers(2, timeout=90)
    yield sfile, workers
    for p in procs:
        p.kill()
        p.wait(30)


def _gpubench(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "gpubench", *args], capture_output=True, text=True,
                          env=_env(), timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("graph", ["0", "5"])
def test_one_rank_per_worker_checks_zero_wrong(two_worker_cluster, tmp_path, graph):
    sfile, _ = two_worker_cluster
    out = tmp_path / "nccl-dask.json"
    p = _gpubench("nccl", "--scheduler-file", str(sfile), "-b", "64M", "-e", "256M", "-f", "4", "-c", "1",
                  "-G", graph, "--json", str(out))
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    assert doc["timing"]["cuda_graph"] == int(graph)
    assert doc["spec"]["nranks"] == 2
    assert sorted(w["rank"] for w in doc["env"]["dask_workers"]) == [0, 1]
    assert doc["env"]["nccl"]["version"] and all(w["nccl"]["version"] for w in doc["env"]["dask_workers"])
    recs = doc["records"]
    assert len(recs) == 4  # 2 sizes x 2 placements
    for r in recs:
        assert r["extra"]["wrong"] == 0, r
        assert r["extra"]["busbw_bytes_per_s"] > 10e9, r  # NVLink: hundreds of GB/s; broken: ~0
    print(p.stdout)


def test_a_killed_worker_ends_the_run_with_exit_3_naming_it(two_worker_cluster):
    sfile, workers = two_worker_cluster
    # 1 GiB all-reduce x 2000 iterations x 5 samples: ~30 s on NVLink, so the kill lands mid-run
    cmd = [sys.executable, "-m", "gpubench", "nccl", "--scheduler-file", str(sfile), "-b", "1G", "-e", "1G",
           "-n", "2000", "-c", "0", "-T", "10"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    time.sleep(12)  # the workers import CuPy, build the communicator, start timing
    assert p.poll() is None, p.communicate()
    killed_at = time.monotonic()
    workers[1].send_signal(signal.SIGKILL)
    out, err = p.communicate(timeout=60)
    took = time.monotonic() - killed_at
    assert p.returncode == 3, (p.returncode, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "died" in lines[0] and "worker" in lines[0], err
    assert took < 10, took  # the watch polls every 0.5 s; -T is 10 s
    # the surviving rank aborts its communicator after -T (10 s) and its worker answers again
    from distributed import Client

    with Client(scheduler_file=str(sfile), timeout=30) as c:
        deadline = time.monotonic() + 40
        while True:
            busy = sum(len(v) for v in c.processing().values())
            if busy == 0:
                break
            assert time.monotonic() < deadline, f"the surviving rank is still busy: {c.processing()}"
            time.sleep(1)
        assert c.submit(lambda: 42, pure=False).result(timeout=30) == 42

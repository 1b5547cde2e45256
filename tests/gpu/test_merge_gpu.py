"""``gpubench merge -t gpu`` on a GPU machine: checks before any worker starts, and small cuDF merges
over tcp and ucx on a LocalCUDACluster whose join is checked against cuDF in this process on the
same data. Needs dask-cuda, cudf and (for ucx) distributed-ucxx; skipped where they are missing."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.gpu

CHUNK = 1_000_000


def gb(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "gpubench", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _importable(name: str) -> bool:
    try:
        __import__(name)
        return True
    except Exception:
        return False


needs_rapids = pytest.mark.skipif(not (_importable("dask_cuda") and _importable("cudf")),
                                  reason="dask-cuda and cudf are not importable")
# merge checks its devices and pool after it has found Dask (distributed, dataframe: the GPU machine
# may lack them) and, for -t gpu, starts its workers with dask-cuda: without them the run is refused
# for the missing package, not for the pool, so the test has nothing to check there.
needs_distributed = pytest.mark.skipif(
    not (_importable("distributed") and _importable("dask.dataframe") and _importable("dask_cuda")),
    reason="dask[distributed,dataframe] and dask-cuda are not all importable")


@needs_distributed
def test_pool_larger_than_the_gpu_is_refused_before_any_worker():
    t0 = time.monotonic()
    r = gb("merge", "-d", "0", "--rmm-pool-size", "500GB")
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "does not fit on GPU 0" in err[0] and "free" in err[0]
    assert time.monotonic() - t0 < 30  # refused by the check, not after a cluster start


@needs_distributed
def test_device_not_visible_is_refused(gpu_count):
    r = gb("merge", "-d", f"0,{gpu_count + 3}")
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and f"device {gpu_count + 3}" in err[0] and "not visible" in err[0]


def cudf_reference(chunk_size: int, chunks: int, frac_match: float) -> dict:
    """The same frames as the workers make (CuPy's random state), joined by cuDF in this process."""
    import cudf

    from gpubench.plugins.merge.data import generate_chunk

    base = cudf.concat([generate_chunk((i, chunk_size, chunks, "build", frac_match, True))
                        for i in range(chunks)]).drop(columns="shuffle")
    other = cudf.concat([generate_chunk((i, chunk_size, chunks, "other", frac_match, True))
                         for i in range(chunks)])
    j = base.merge(other, on="key", how="inner")
    return {"rows": len(j), "key_sum": int(j["key"].sum()), "payload_x_sum": int(j["payload_x"].sum()),
            "payload_y_sum": int(j["payload_y"].sum())}


@needs_rapids
@pytest.mark.parametrize("protocol", ["tcp", "ucx"])
def test_gpu_merge_on_a_local_cuda_cluster(protocol, gpu_count, tmp_path):
    if protocol == "ucx" and not _importable("distributed_ucxx"):
        pytest.skip("distributed-ucxx is not importable")
    devices = "0,1" if gpu_count >= 2 else "0"
    n = len(devices.split(","))
    out = tmp_path / "merge.json"
    r = gb("merge", "-t", "gpu", "-d", devices, "-p", protocol, "-c", str(CHUNK), "--rmm-pool-size", "4GB",
           "--runs", "2", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "Merge type                | gpu" in r.stdout and f"Protocol                  | {protocol}" in r.stdout
    d = json.loads(out.read_text())
    [rec] = d["records"]
    ex = rec["extra"]
    assert rec["nbytes"] == 2 * n * CHUNK * 16
    assert len(rec["samples_s"]) == 2 and all(s > 0 for s in rec["samples_s"])
    assert [w["device"] for w in ex["workers"]] == [int(x) for x in devices.split(",")]
    assert ex["rmm"].startswith("pool")
    if n == 2:
        assert ex["pairs"], "two GPU workers joining must move data between them"
        assert {(p["w1"], p["w2"]) for p in ex["pairs"]} <= {(0, 1), (1, 0)}
    assert ex["join_check"] == cudf_reference(CHUNK, n, 0.3)

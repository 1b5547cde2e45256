"""p2p on real GPUs: every test runs on every ordered pair with the data verified, peer access on
beats off over NVLink, nothing above the link peak, peer access is left as found, one GPU exits 2.
Small sizes so the run is short; the full-size figures are for the lead's crosscheck."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpubench.plugins.p2p import bench as P
from gpubench.core.timing import TimingPlan

pytestmark = pytest.mark.gpu


@pytest.fixture
def two(gpu_count):
    if gpu_count < 2:
        pytest.skip("needs two GPUs")
    return (0, 1)


def _run(devices, tests=tuple(P.TESTS), nbytes=8 << 20, iters=3):
    return P.run(P.P2PSpec(devices=devices, tests=tests, nbytes=nbytes, plan=TimingPlan(warmup=1, iters=iters)))


def test_every_test_every_pair_verified(two):
    res = _run(two)
    assert not res.partial
    by_test = {}
    for r in res.records:
        by_test.setdefault(r.params["test"], []).append(r)
        assert {"test", "src", "dst", "nbytes"} <= set(r.params)
        if r.error:
            assert "cudaDeviceCanAccessPeer" in r.error, r.error
            continue
        assert r.extra["verified"] is True and r.extra["wrong_bytes"] == 0, r.params
        assert len(r.samples_s) == 3 and all(t > 0 for t in r.samples_s)
        assert not r.extra.get("above_peak"), (r.params, r.rate_summary().median if r.metric != "time" else None)
    for t in P.TESTS:
        parts = 3 if t in P.BIDIR_TESTS else 1
        assert len(by_test[t]) == 2 * parts, t
    lat = [r for r in by_test["latency"] if not r.error]
    assert all(r.metric == "time" and r.nbytes == 16 and r.reps == 100 for r in lat)


def test_peer_on_beats_peer_off_over_nvlink(two):
    res = _run(two, tests=("write", "off"), nbytes=64 << 20, iters=5)
    if not str(res.env.get("topology", {}).get("0,1", "")).startswith("NV"):
        pytest.skip("GPUs 0 and 1 are not NVLink peers")
    med = {(r.params["test"], r.params["src"]): r.rate_summary().median for r in res.records}
    for src in (0, 1):
        assert med[("write", src)] > 2 * med[("off", src)], med


def test_peer_access_left_as_found(two):
    from cupy.cuda import runtime

    if not (runtime.deviceCanAccessPeer(0, 1) and runtime.deviceCanAccessPeer(1, 0)):
        pytest.skip("no peer access")
    _run(two, tests=("write",), nbytes=1 << 20)
    import cupy

    with cupy.cuda.Device(0):
        runtime.deviceEnablePeerAccess(1)  # raises cudaErrorPeerAccessAlreadyEnabled if the run left it on
        runtime.deviceDisablePeerAccess(1)


def test_cli_json(two, tmp_path):
    out = tmp_path / "p2p.json"
    p = subprocess.run([sys.executable, "-m", "gpubench", "p2p", "-d", "0,1", "-b", "16M", "-t", "write,read,latency",
                        "-n", "2", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    d = json.loads(out.read_text())
    assert d["command"] == "p2p" and d["spec"]["devices"] == [0, 1]
    assert {(r["params"]["test"], r["params"]["src"], r["params"]["dst"]) for r in d["records"]} == \
        {(t, a, b) for t in ("write", "read", "latency") for a, b in ((0, 1), (1, 0))}
    assert "src \\ dst" in p.stdout


def test_one_gpu_exits_2():
    e = dict(os.environ, CUDA_VISIBLE_DEVICES="0")
    p = subprocess.run([sys.executable, "-m", "gpubench", "p2p"], capture_output=True, text=True, timeout=120, env=e)
    assert p.returncode == 2 and "needs two GPUs" in p.stderr and len(p.stderr.strip().splitlines()) == 1

"""`gpubench net --protocol ucx -m cuda` on a GPU machine: bandwidth and latency from and into GPU
memory over loopback, the data checked, and the transports that carried it named (cuda_copy,
cuda_ipc...). Skips where no GPU is visible or UCXX is not installed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(importlib.util.find_spec("ucxx") is None, reason="UCXX is not installed")]


def gb(*args):
    return subprocess.run([sys.executable, "-m", "gpubench", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("memory", ["cuda", "cuda,host", "host,cuda"])
def test_ucx_bandwidth_from_and_into_gpu_memory_is_checked_and_names_a_cuda_transport(tmp_path, memory):
    out = tmp_path / "u.json"
    p = gb("net", "local", "--protocol", "ucx", "-m", memory, "-l", "4MiB", "-t", "1", "-i", "0.5", "--json", str(out))
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())
    [rec] = res["records"]
    host_side = {"cuda,host": "server", "host,cuda": "client"}.get(memory)
    if host_side:  # the host side of a mixed test is page-locked, as ucx_perftest's UCX-registered buffers
        assert res["timing"]["buffers"][host_side] == "host, page-locked", res["timing"]["buffers"]
    assert rec["params"]["memory"] == memory and rec["extra"]["data_checked"] is True
    assert rec["extra"]["gb_per_s"] > 0
    t = rec["extra"]["transports"]
    lanes = " ".join(ln["transport"] for side in ("client", "server") for ln in t[side]["lanes"])
    assert "cuda" in lanes, t
    via = t["client"]["carried_by"]["via"]  # the sender's protocol carried the data; the receiver only lists lanes
    assert ("cuda" in via) == memory.startswith("cuda"), t
    assert t["server"]["carried_by"] is None


def test_ucx_latency_from_gpu_memory(tmp_path):
    out = tmp_path / "lat.json"
    p = gb("net", "local", "--protocol", "ucx", "-m", "cuda", "--latency", "-l", "64KiB", "-t", "1", "--json", str(out))
    assert p.returncode == 0, p.stderr
    recs = json.loads(out.read_text())["records"]
    assert recs[0]["nbytes"] == 8 and recs[-1]["nbytes"] == 64 * 1024
    assert all(r["metric"] == "time" and r["samples_s"] for r in recs)


def test_ucx_device_not_visible_is_exit_2_before_anything_listens():
    p = gb("net", "local", "--protocol", "ucx", "-m", "cuda", "-d", "999", "-t", "1")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_ucx_nodes_between_two_ranks_on_one_gpu_measure_gpu_memory_and_both_exit_0(tmp_path):
    """`net nodes --protocol ucx -m cuda` with two torchrun-style ranks on this GPU: both links
    measured over a cuda transport, and every rank exits 0 (rank 0 serves the rendezvous store until
    the other rank read the end, torch's TCPStore where torch imports)."""
    import os
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "n.json"
    procs = [subprocess.Popen([sys.executable, "-m", "gpubench", "net", "nodes", "--protocol", "ucx", "-m", "cuda",
                               "-B", "127.0.0.1", "-l", "4MiB", "-t", "1", "-i", "0.5", "--json", str(out)],
                              env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": str(port)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    ends = [p.communicate(timeout=180) for p in procs]
    # rank 0 may flag a link slow by the fleet rule (exit 1); rank 1 ends 0 once rank 0 confirmed the end
    assert procs[0].returncode in (0, 1) and procs[1].returncode == 0, [e[-1500:] for _, e in ends]
    assert "(fail)" not in ends[0][1]
    links = json.loads(out.read_text())["records"]
    assert len(links) == 2 and all(r["error"] is None and r["params"]["memory"] == "cuda" for r in links)
    assert all("cuda" in r["extra"]["transports"]["client"]["carried_by"]["via"] for r in links), links

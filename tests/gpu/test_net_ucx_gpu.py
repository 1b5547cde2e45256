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
    [rec] = json.loads(out.read_text())["records"]
    assert rec["params"]["memory"] == memory and rec["extra"]["data_checked"] is True
    assert rec["extra"]["gb_per_s"] > 0
    vias = [rec["extra"]["transports"][side]["carried_by"] or {} for side in ("client", "server")]
    lanes = " ".join(ln["transport"] for side in ("client", "server") for ln in rec["extra"]["transports"][side]["lanes"])
    assert "cuda" in lanes, rec["extra"]["transports"]
    assert all(v.get("via") for v in vias), vias


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

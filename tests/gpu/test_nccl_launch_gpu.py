"""gpubench nccl under mpirun -n 1 and torchrun --nproc-per-node 1 on a GPU machine: the launcher
path runs, rank 0 writes one JSON with every rank's figures, GPU UUID and PCI bus id, and NCCL's
transport line. (benchmarks/nccl_launchers.sh puts the figures beside the plain run's.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
SRC = Path(__file__).resolve().parents[2] / "src"


def _run(cmd: list[str], tmp_path: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0")}
    env.pop("NCCL_DEBUG", None)
    env.pop("NCCL_DEBUG_FILE", None)
    out = tmp_path / "r.json"
    p = subprocess.run(cmd + ["nccl", "-b", "1M", "-e", "4M", "-f", "4", "--samples", "3", "--json", str(out)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "NCCL transport: NCCL " in p.stdout, p.stdout
    return json.loads(out.read_text())


def _check(res: dict, launcher: str) -> None:
    assert res["env"]["launch"]["launcher"] == launcher
    for r in res["records"]:
        pr = r["extra"]["per_rank"]
        assert len(pr) == 1 and pr[0]["gpus"][0]["uuid"].startswith("GPU-") and pr[0]["gpus"][0]["pci_bus_id"]
        assert r["extra"]["average"] == "mean" and pr[0]["samples_s"] == r["samples_s"]
    assert res["env"]["nccl_log"]["per_rank"][0]["version"]
    assert "NCCL_DEBUG" not in res["env"]["nccl"]["env"]


def test_mpirun_one_rank(tmp_path):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("no mpirun on this machine")
    openmpi = "Open MPI" in subprocess.run([mpirun, "--version"], capture_output=True, text=True).stdout
    extra = ["--allow-run-as-root"] if openmpi and os.geteuid() == 0 else []
    res = _run([mpirun, "-n", "1", *extra, sys.executable, "-m", "gpubench"], tmp_path)
    _check(res, "openmpi" if openmpi else "pmi")


def test_torchrun_one_rank(tmp_path):
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("no torchrun on this machine")
    _check(_run([torchrun, "--nproc-per-node", "1", "-m", "gpubench"], tmp_path), "torchrun")


def test_more_ranks_than_gpus_on_a_node_exit_2_on_every_rank(tmp_path):
    """One rank more than the node's GPUs: every rank refuses at once naming the GPUs it needs (exit 2),
    none waits for the rank that stopped (that wait ends in exit 3 after the all-gather's deadline)."""
    cupy = pytest.importorskip("cupy")
    visible = cupy.cuda.runtime.getDeviceCount()
    mpirun, torchrun = shutil.which("mpirun"), shutil.which("torchrun")
    if mpirun is not None:
        openmpi = "Open MPI" in subprocess.run([mpirun, "--version"], capture_output=True, text=True).stdout
        extra = ["--allow-run-as-root", "--oversubscribe"] if openmpi and os.geteuid() == 0 else []
        cmd = [mpirun, "-n", str(visible + 1), *extra, sys.executable, "-m", "gpubench"]
    elif torchrun is not None:
        cmd = [torchrun, "--nproc-per-node", str(visible + 1), "-m", "gpubench"]
    else:
        pytest.skip("neither mpirun nor torchrun on this machine")
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    p = subprocess.run(cmd + ["nccl", "-b", "1M", "-e", "1M"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0, p.stdout + p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "are visible" in ln]
    assert len(lines) == visible + 1 and f"need GPUs 0..{visible}, but {visible} are visible" in lines[0], p.stderr
    assert "did not answer" not in p.stderr, p.stderr

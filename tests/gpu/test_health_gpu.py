"""env.health on a real GPU: a copy run saves its GPU's counters read before and after, every one
an integer, true/false, "unsupported" or an object of those (never absent), and a healthy GPU shows
no uncorrected ECC error, no failed remap and no XID during the run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


def test_a_copy_run_saves_its_gpus_health_before_and_after(tmp_path):
    out = tmp_path / "c.json"
    p = subprocess.run([sys.executable, "-m", "gpubench", "copy", "-b", "1MiB", "-e", "1MiB", "-q", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    h = json.loads(out.read_text())["env"]["health"]
    print(json.dumps(h, indent=1))  # what this GPU reads, for the record
    assert h["error"] is None and len(h["gpus"]) == 1
    g = h["gpus"][0]
    assert set(g["before"]) == set(g["after"]) == {
        "pcie_replays", "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max", "nvlinks_up",
        "nvlink_errors", "ecc", "remapped_rows", "retired_pages"}
    assert isinstance(g["after"]["pcie_gen_max"], int) and isinstance(g["after"]["pcie_width_max"], int)
    assert g["after"]["pcie_replays"] >= g["before"]["pcie_replays"]
    ecc = g["after"]["ecc"]
    assert ecc == "unsupported" or ecc["volatile"]["uncorrected"] == 0
    remap = g["after"]["remapped_rows"]
    assert remap == "unsupported" or remap["failed"] is False
    assert h["xid_events"] in ("unsupported", [])

"""Real results from tests/data with their samples or blocks edited, for the tests of how saved
figures are flagged and how hostile condition blocks are refused.

Edited results are written with json.dumps (no indent: hand-made inputs, which the session's schema
check in tests/conftest.py leaves alone).
"""

from __future__ import annotations

import copy
import html
import json
import re
from pathlib import Path

import synth

DATA = Path(__file__).resolve().parent


def pinned(n: int = 1) -> dict:
    """The real pinned copy result cut to its last ``n`` records (1 GiB d2h last)."""
    d = json.loads(synth.REAL_PINNED.read_text())
    d["records"] = d["records"][-n:]
    return d


def write(tmp_path: Path, name: str, d: dict) -> str:
    """``d`` saved as ``tmp_path/name.json``; its path."""
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(d))
    return str(p)


def with_rate(d: dict, gbps: float, **extra) -> dict:
    """``d`` with its first record's samples at ``gbps`` GB/s (a little spread) and ``extra`` set."""
    d = copy.deepcopy(d)
    r = d["records"][0]
    r["samples_s"] = [r["nbytes"] / (gbps * 1e9 * f) for f in (1.0, 1.01, 0.99, 1.002, 0.998, 1.003)]
    r["extra"].update(extra)
    return d


def nccl_one_rank_in_place(seconds: float, **extra) -> dict:
    """The real nccl result's first in-place record made a one-rank run (NCCL moves no data)."""
    d = json.loads((DATA / "nccl-h200x2.json").read_text())
    r = copy.deepcopy(next(r for r in d["records"] if r["params"]["placement"] == "in-place"))
    r["params"]["nranks"] = 1
    r["samples_s"] = [seconds * f for f in (1.0, 1.01, 0.99, 1.002, 0.998)]
    rate = r["nbytes"] / seconds
    r["extra"].update(algbw_bytes_per_s=rate, busbw_bytes_per_s=rate, **extra)
    d["records"] = [r]
    return d


# Saved figures beyond a physical limit, each as a file may hold it.
LIMIT_CASES = {
    # one rank, in place, saved with limit_flag "no_op" (and above_peak false)
    "no-op saved": lambda: nccl_one_rank_in_place(3.41e-6, no_op="one rank, in place: NCCL moves no data",
                                                   limit_flag="no_op", above_peak=False, peak_bytes_per_s=None),
    # the same in a file without limit_flag: the params say it
    "no-op older file": lambda: nccl_one_rank_in_place(3.41e-6),
    # limit_flag "above_peak" without the older boolean
    "limit_flag only": lambda: with_rate(pinned(), 100.0, peak_bytes_per_s=63.0e9, pct_of_peak=158.7,
                                         limit_flag="above_peak"),
    # samples edited above the saved peak, the saved flags stale
    "stale flag": lambda: with_rate(pinned(), 100.0, peak_bytes_per_s=63.0e9, pct_of_peak=50.0,
                                    above_peak=False, limit_flag=None),
}

# Payloads for strings that reach a terminal (ANSI, OSC 8) and a page (HTML).
EV = "\x1b[31mRED\x1b]8;;http://evil\x07link\x1b]8;;\x07\x1b[0m"
HT = "<img src=x onerror=alert(1)>"

GOOD_TELEMETRY = {"n": 12, "interval_s": 0.01, "devices": [0], "sm_clock_mhz": {"min": 1410, "median": 1980, "max": 1980},
                  "mem_clock_mhz": {"min": 3201, "median": 3201, "max": 3201},
                  "power_w": {"min": 120.5, "median": 300.0, "max": 400.25}, "temp_c": {"min": 40, "median": 45, "max": 50},
                  "reasons": ["sw_power_cap"], "pcie": {"gen": 5, "width": 16}, "pcie_replay_delta": 0,
                  "nvlink_errors_delta": None, "other_processes": 0}
GOOD_ENV = {"preflight": {"idle": False, "warnings": ["GPU 0 is not idle: utilisation 99%"], "error": None,
                          "gpus": [{"index": 0, "busy": ["utilisation 99%"], "other_processes": [],
                                    "utilization_gpu_pct": 99, "utilization_memory_pct": 3, "temperature_c": 40,
                                    "slowdown_temp_c": 90}]},
            "numa": {"policy": "auto", "bindings": [{"node": 0, "cpus": "0-1", "reason": "auto: GPU 0's node 0"}]},
            "telemetry": {"enabled": True, "interval_s": 0.01, "error": None}}


def conditions_result() -> dict:
    """The pinned result with a valid telemetry block on its record and preflight, numa and
    telemetry blocks in its env."""
    d = pinned()
    d["records"][0]["telemetry"] = copy.deepcopy(GOOD_TELEMETRY)
    d["env"].update(copy.deepcopy(GOOD_ENV))
    return d


def html_text(path: str) -> str:
    """The visible text of an HTML report (no images, no style), whitespace collapsed."""
    t = Path(path).read_text()
    t = re.sub(r"<img[^>]*>", "", t)
    t = re.sub(r"<style.*?</style>", "", t, flags=re.S)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", t)))


def legend_texts(fig) -> list[str]:
    """Every legend entry of a plot figure (or of the figure of a (figure, sections) pair)."""
    fig = fig[0] if isinstance(fig, tuple) else fig
    return [t.get_text() for sf in fig.subfigs for lg in sf.legends for t in lg.get_texts()]

"""Results built from samples drawn from known distributions (seeded), for compare/plot/suite tests.

Bandwidth samples: rate = median_gbps * scale * exp(N(0, cv)) GB/s (log-normal, so the true median
is exactly median_gbps * scale); a sample's seconds = nbytes / rate.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gpubench.core.result import Record, Result

DATA = Path(__file__).resolve().parent
REAL_PINNED = DATA / "copy-pinned-h200.json"  # gpubench copy --pinned on the 2x H200 machine
REAL_ALL = DATA / "copy-all-h200.json"        # gpubench copy -m pinned,pageable,write-combined,registered --direction h2d,d2h,bidir --verify


def real_env() -> dict:
    return json.loads(REAL_PINNED.read_text())["env"]


def log_normal_seconds(rng, nbytes: int, median_gbps: float, cv: float, n: int) -> list[float]:
    rates = median_gbps * 1e9 * np.exp(rng.normal(0.0, cv, n))
    return [float(nbytes / r) for r in rates]


def copy_like(seed: int, *, scale: float = 1.0, cv: float = 0.01, n: int = 50,
              sizes=(2**20, 2**26, 2**30), median_gbps=(42.0, 53.0, 55.0), command: str = "copy",
              peak: float | None = 63.0e9) -> Result:
    """A copy-shaped Result: h2d and d2h pinned on device 0 at each size."""
    rng = np.random.default_rng(seed)
    recs = []
    for nbytes, med in zip(sizes, median_gbps):
        for direction in ("h2d", "d2h"):
            recs.append(Record(
                params={"device": 0, "direction": direction, "memory": "pinned", "nbytes": nbytes},
                metric="bandwidth", nbytes=nbytes, samples_s=log_normal_seconds(rng, nbytes, med * scale, cv, n),
                extra={"peak_bytes_per_s": peak}))
    return Result(command=command, spec={"memory": ["pinned"]}, timing={"clock": "cuda-event"},
                  env=real_env(), records=recs)


def p2p_like(seed: int, n_gpus: int = 2, cv: float = 0.01, n: int = 20) -> Result:
    """A p2p-shaped matrix Result: src/dst params, peer on and off, plus a latency (time) matrix."""
    rng = np.random.default_rng(seed)
    recs = []
    nbytes = 2**30
    for peer, med in (("on", 396.0), ("off", 37.7)):
        for s in range(n_gpus):
            for d in range(n_gpus):
                if s != d:
                    recs.append(Record(params={"src": s, "dst": d, "peer": peer, "nbytes": nbytes},
                                       nbytes=nbytes, samples_s=log_normal_seconds(rng, nbytes, med, cv, n)))
    for s in range(n_gpus):
        for d in range(n_gpus):
            if s != d:
                t = 2.2e-6 * np.exp(rng.normal(0, cv, n))
                recs.append(Record(params={"src": s, "dst": d, "peer": "on", "test": "latency"}, metric="time",
                                   nbytes=4, samples_s=[float(x) for x in t]))
    return Result(command="p2p", spec={}, env=real_env(), records=recs)


def merge_like(seed: int, protocol: str = "ucx", n: int = 30) -> Result:
    """A merge-shaped Result: one merge of 2 workers, n runs as its samples (merge's params)."""
    rng = np.random.default_rng(seed)
    med = 80.0 if protocol == "ucx" else 0.8
    params = {"type": "cpu", "protocol": protocol, "chunk_size": 50_000, "base_chunks": 2, "other_chunks": 2,
              "frac_match": 0.3, "broadcast": "default", "n_workers": 2, "shuffle_method": "tasks"}
    recs = [Record(params=params, nbytes=2**26, samples_s=log_normal_seconds(rng, 2**26, med, 0.1, n))]
    return Result(command="merge", spec={"protocol": protocol}, env=real_env(), records=recs)

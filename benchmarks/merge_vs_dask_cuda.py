"""Run ``gpubench merge`` beside dask-cuda's own ``python -m dask_cuda.benchmarks.local_cudf_merge``
with the same options, for each protocol, and print the wall-clock ratio.

On the GPU machine (both tools start their own LocalCUDACluster, one after the other)::

    PYTHONPATH=src python3 benchmarks/merge_vs_dask_cuda.py -d 0,1 -c 50_000_000 --rmm-pool-size 30GB --runs 3

On a CPU machine dask-cuda's benchmark runs ``-t cpu`` only against an existing cluster, so
``--local-cpu-cluster N`` starts a plain distributed LocalCluster of N workers per protocol here and
hands its address to both (``--scheduler-address``)::

    python benchmarks/merge_vs_dask_cuda.py -t cpu --local-cpu-cluster 2 -c 1_000_000 --runs 3

Both reports are printed as they come, then a table: protocol, dask-cuda's mean wall clock (its
"Wall clock | mean +/- sd" line), gpubench's (from its --json), gpubench / dask-cuda, and whether that
is within --tolerance (default 10 %). Exit status 0 when every protocol is within it, 1 otherwise,
2 when a tool failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time

_TIME_RE = [
    (re.compile(r"^(\d+(?:\.\d+)?) us$"), lambda m: float(m[1]) * 1e-6),
    (re.compile(r"^(\d+(?:\.\d+)?) ms$"), lambda m: float(m[1]) * 1e-3),
    (re.compile(r"^(\d+(?:\.\d+)?) s$"), lambda m: float(m[1])),
    (re.compile(r"^(\d+)m (\d+)s$"), lambda m: int(m[1]) * 60 + int(m[2])),
    (re.compile(r"^(\d+)hr (\d+)m$"), lambda m: int(m[1]) * 3600 + int(m[2]) * 60),
]


def parse_time(text: str) -> float:
    """Seconds from dask.utils.format_time's text ("2.79 s", "187.39 ms", "11m 3s")."""
    t = text.strip()
    for rx, conv in _TIME_RE:
        m = rx.match(t)
        if m:
            return conv(m)
    raise ValueError(f"not a dask time: {text!r}")


def dask_cuda_wall_clock(stdout: str) -> float:
    """Mean wall clock (s) from dask-cuda's "Wall clock | mean +/- sd" line."""
    for line in stdout.splitlines():
        key, sep, value = line.partition("|")
        if sep and key.strip() == "Wall clock" and "+/-" in value:
            return parse_time(value.split("+/-")[0])
    raise ValueError("dask-cuda's output has no 'Wall clock | mean +/- sd' line")


def run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    sys.stdout.write(p.stdout)
    if p.returncode != 0:
        sys.stdout.write(p.stderr[-3000:])
    sys.stdout.flush()
    return p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--protocols", default="tcp,ucx", help="comma list of tcp, ucx")
    ap.add_argument("-t", "--type", default="gpu", choices=["gpu", "cpu"])
    ap.add_argument("-d", "--devs", default="0,1")
    ap.add_argument("-c", "--chunk-size", default="1_000_000")
    ap.add_argument("--rmm-pool-size", default=None)
    ap.add_argument("--runs", default="3")
    ap.add_argument("--scheduler-address", default=None, help="an existing cluster for both tools")
    ap.add_argument("--local-cpu-cluster", type=int, default=0, metavar="N",
                    help="start a distributed LocalCluster of N workers per protocol for both (-t cpu)")
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--timeout", type=float, default=900, help="seconds per tool run")
    a = ap.parse_args()

    common = ["-t", a.type, "-c", a.chunk_size, "--runs", a.runs]
    if a.rmm_pool_size:
        common += ["--rmm-pool-size", a.rmm_pool_size]
    rows = []
    failed = False
    for proto in [p.strip() for p in a.protocols.split(",") if p.strip()]:
        cluster = None
        address = a.scheduler_address
        if a.local_cpu_cluster:
            from distributed import LocalCluster

            cluster = LocalCluster(n_workers=a.local_cpu_cluster, threads_per_worker=1, protocol=proto,
                                   dashboard_address=None, silence_logs=logging.ERROR)
            address = cluster.scheduler_address
        where = ["--scheduler-address", address] if address else ["-d", a.devs]
        try:
            t0 = time.monotonic()
            dc = run([sys.executable, "-m", "dask_cuda.benchmarks.local_cudf_merge", "-p", proto, *common, *where],
                     a.timeout)
            dc_s = time.monotonic() - t0
            fd, out = tempfile.mkstemp(suffix=".json")
            os.close(fd)
            t0 = time.monotonic()
            gb = run([sys.executable, "-m", "gpubench", "merge", "-p", proto, *common, *where, "--json", out],
                     a.timeout)
            gb_s = time.monotonic() - t0
            if dc.returncode != 0 or gb.returncode != 0:
                print(f"{proto}: dask-cuda exited {dc.returncode}, gpubench exited {gb.returncode}")
                failed = True
                continue
            ref = dask_cuda_wall_clock(dc.stdout)
            with open(out) as f:
                rec = json.load(f)["records"][0]
            os.unlink(out)
            ours = rec["extra"]["wall_clock_mean_s"]
            rows.append((proto, ref, ours, ours / ref, dc_s, gb_s))
        finally:
            if cluster is not None:
                cluster.close()
    print()
    print(f"{'protocol':<9} {'dask-cuda wall clock':>21} {'gpubench wall clock':>20} {'ratio':>7}  "
          f"{'within ' + format(a.tolerance, '.0%'):>11}  (whole tool runs: dask-cuda s / gpubench s)")
    ok = True
    for proto, ref, ours, ratio, dc_s, gb_s in rows:
        inside = abs(ratio - 1) <= a.tolerance
        ok &= inside
        print(f"{proto:<9} {ref * 1e3:>18.1f} ms {ours * 1e3:>17.1f} ms {ratio:>7.3f}  {'yes' if inside else 'NO':>11}"
              f"  ({dc_s:.0f} / {gb_s:.0f})")
    if failed:
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

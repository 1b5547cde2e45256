"""The rank group's barrier (gpubench.launch.ranks.Group.barrier): time per barrier as ranks grow.

    PYTHONPATH=src python3 benchmarks/rank_barrier.py                         # 8, 16, 32 ranks; mpi and store
    PYTHONPATH=src python3 benchmarks/rank_barrier.py --ranks 8,64 --transport store --barriers 50

Each case starts N copies of this script on loopback: under ``mpiexec -n N`` (MPICH's beside this
Python, else the one on PATH; the group then runs over mpi4py), or with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set as torchrun would (the group then runs over a rendezvous store
that rank 0 serves: torch's TCPStore where torch imports, else gpubench's own). Every rank joins,
passes one barrier, then times ``--barriers`` more; rank 0 prints the median and the largest.

The barrier is the net rounds' and the fleet's: it goes through rank 0 (each rank tells rank 0,
rank 0 answers each), 2(N - 1) messages, so its cost grows linearly with N. Run the script on two
trees to set two designs side by side. Every rank is a process on this machine, so past the
number of cores the figure is mostly the machine's scheduling. Prints only; no pass rule.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path


def as_rank(barriers: int) -> int:
    from gpubench.launch import ranks

    g = ranks.join(ranks.discover(), timeout=120)
    g.barrier()
    took = []
    for _ in range(barriers):
        t0 = time.monotonic()
        g.barrier()
        took.append(time.monotonic() - t0)
    if g.rank == 0:
        print("RESULT " + json.dumps({"n": g.size, "transport": g.transport,
                                      "median_ms": 1e3 * statistics.median(took), "max_ms": 1e3 * max(took)}),
              flush=True)
    g.close()
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(n: int, transport: str, barriers: int, timeout: float) -> dict:
    me = [sys.executable, __file__, "--as-rank", "--barriers", str(barriers)]
    if transport == "mpi":
        here = Path(sys.executable).with_name("mpiexec")
        exe = str(here) if here.exists() else shutil.which("mpiexec")
        if not exe:
            return {"error": "no mpiexec: pip install mpich mpi4py"}
        outs = [subprocess.run([exe, "-n", str(n), *me], capture_output=True, text=True, timeout=timeout).stdout]
    else:
        port = _free_port()
        procs = [subprocess.Popen(me, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env={**os.environ, "RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r),
                                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
                 for r in range(n)]
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    for text in outs:
        for line in text.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[7:])
    return {"error": (" ".join(outs).strip().splitlines() or ["no output"])[-1][:200]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="8,16,32", help="comma list of rank counts (default 8,16,32)")
    ap.add_argument("--transport", default="mpi,store", help="comma list of mpi, store (default both)")
    ap.add_argument("--barriers", type=int, default=20, help="barriers timed per case (default 20)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds one case may take (default 300)")
    ap.add_argument("--as-rank", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.as_rank:
        return as_rank(a.barriers)
    print(f"{'ranks':>5} {'transport':>15} {'median ms':>10} {'max ms':>8} {'load':>5}")
    for n in [int(x) for x in a.ranks.split(",")]:
        for t in a.transport.split(","):
            got = one(n, t, a.barriers, a.timeout)
            if "error" in got:
                print(f"{n:>5} {t:>15} failed: {got['error']}", flush=True)
                continue
            print(f"{n:>5} {got['transport']:>15} {got['median_ms']:>10.1f} {got['max_ms']:>8.1f} "
                  f"{os.getloadavg()[0]:>5.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A test entry point on the real rank group (core/ranks): discover, join, gather, bcast,
allgather, barrier; with --victim R rank R stops before the last barrier (it sleeps, and the test
kills or stops it), and the others must leave through the group's deadline with exit 3; with
--victim-at close it stops after the last barrier (rank 0 after printing its RESULT), before its close.

Rank 0 prints one JSON line ``RESULT {...}``; a rank that fails prints ``FAULT <rank> <line>``
and exits 3. Run under mpiexec, or with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from gpubench.launch import ranks
from gpubench.core.errors import GpubenchError


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--victim", type=int, default=-1)
    ap.add_argument("--victim-at", choices=["barrier", "close"], default="barrier")
    ap.add_argument("--pidfile", default=None)
    ap.add_argument("--close-s", type=float, default=None,
                    help="the close's wait (ranks.CLOSE_S) for this run: the same rule, a shorter wait")
    a = ap.parse_args()
    if a.close_s is not None:
        ranks.CLOSE_S = a.close_s
    me = ranks.discover()
    g = None
    try:
        g = ranks.join(me, timeout=a.timeout)
        pids = g.allgather(os.getpid())
        gathered = g.gather({"rank": g.rank, "host": g.me.host, "local_rank": g.me.local_rank,
                             "local_size": g.me.local_size, "node": g.me.node, "launcher": g.me.launcher})
        value = g.bcast({"from": g.rank, "t": (1, 2)} if g.rank == 0 else None)
        every = g.allgather(g.rank * 10)
        if g.rank == 0 and a.pidfile:
            with open(a.pidfile + ".tmp", "w") as f:
                json.dump(pids, f)
            os.replace(a.pidfile + ".tmp", a.pidfile)
        if g.rank == a.victim and a.victim_at == "barrier":
            time.sleep(600)
        t0 = time.monotonic()
        g.barrier()
        if g.rank == 0:
            print("RESULT " + json.dumps({"size": g.size, "transport": g.transport, "gathered": gathered,
                                          "bcast": value, "allgather": every, "pids": pids,
                                          "barrier_s": time.monotonic() - t0}), flush=True)
        if g.rank == a.victim and a.victim_at == "close":
            time.sleep(600)
        g.close()
        return 0
    except GpubenchError as e:
        print(f"FAULT {me.rank} {e.one_line()}", flush=True)
        if g is not None:
            g.close()
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())

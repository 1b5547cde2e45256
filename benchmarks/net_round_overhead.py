"""gpubench net between ranks: the overhead of a round, beyond the test's own seconds.

    PYTHONPATH=src python3 benchmarks/net_round_overhead.py                     # 16 and 32 ranks, ring and rings
    PYTHONPATH=src python3 benchmarks/net_round_overhead.py --ranks 8,16,32 --pairs ring,rings --runs 3

Each run is ``mpiexec -n N python -m gpubench net nodes -t SECONDS -P 1 -O 0 -i SECONDS --pairs P
--json FILE`` on loopback (MPICH's mpiexec beside this Python, else the one on PATH), a fresh
job each time; runs of the schedules take turns, so a change of load falls on each.

Figures, from the saved result:

- rounds: ``len(timing.rounds)``.
- rounds s: ``timing.seconds``, rank 0's wall clock from the barrier that starts the first round
  to the barrier that ends the last.
- overhead/round s: (rounds s - rounds x (-O + -t)) / rounds: what a round costs beyond the
  counted and omitted seconds: the barrier, connecting the control and data streams, starting
  net's worker processes on both sides, the end lines, and the wait for the slowest pair.
- job s: the whole mpiexec, start-up of N Python processes included.

Medians over ``--runs``. The machine's load average is printed with each run (a 2-core machine
shared with other work moves these figures by tens of percent). Prints only; no pass rule.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def mpiexec() -> str:
    here = Path(sys.executable).with_name("mpiexec")
    exe = str(here) if here.exists() else shutil.which("mpiexec")
    if not exe:
        sys.exit("no mpiexec: pip install mpich mpi4py")
    return exe


def one(n: int, pairs: str, seconds: float, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "r.json"
        t0 = time.monotonic()
        p = subprocess.run([mpiexec(), "-n", str(n), sys.executable, "-m", "gpubench", "net", "nodes",
                            "-t", f"{seconds:g}", "-P", "1", "-O", "0", "-i", f"{seconds:g}", "--pairs", pairs,
                            "-T", "120", "--json", str(out), "-q"],
                           capture_output=True, text=True, timeout=timeout)
        job = time.monotonic() - t0
        if not out.exists():
            return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:200]}
        t = json.loads(out.read_text())["timing"]
    rounds = len(t["rounds"])
    got = {"rounds": rounds, "seconds": t["seconds"], "job": job,
           "overhead": (t["seconds"] - rounds * seconds) / rounds, "load": os.getloadavg()[0]}
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="16,32", help="comma list of rank counts (default 16,32)")
    ap.add_argument("--pairs", default="ring,rings", help="comma list of schedules (default ring,rings)")
    ap.add_argument("--runs", type=int, default=2, help="runs of each (default 2)")
    ap.add_argument("--seconds", type=float, default=1.0, help="-t of each test (default 1)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one job may take (default 600)")
    a = ap.parse_args()
    ranks = [int(x) for x in a.ranks.split(",")]
    pairs = a.pairs.split(",")
    table: dict[tuple[int, str], list[dict]] = {}
    for n in ranks:
        for k in range(a.runs):
            for p in pairs if k % 2 == 0 else reversed(pairs):
                got = one(n, p, a.seconds, a.timeout)
                table.setdefault((n, p), []).append(got)
                print(f"# n={n} {p} run {k + 1}: {json.dumps(got)}", flush=True)

    def med(rows: list[dict], key: str) -> str:
        vals = [r[key] for r in rows if r.get(key) is not None]
        return f"{statistics.median(vals):.2f}" if vals else "-"

    print(f"\n{'ranks':>5} {'pairs':>6} {'rounds':>6} {'rounds s':>9} {'overhead/round s':>17} "
          f"{'job s':>7} {'load':>5}  (medians of {a.runs}, -t {a.seconds:g} -P 1)")
    for (n, p), rows in table.items():
        ok = [r for r in rows if "error" not in r]
        if not ok:
            print(f"{n:>5} {p:>6} failed: {rows[0]['error']}")
            continue
        print(f"{n:>5} {p:>6} {ok[0]['rounds']:>6} {med(ok, 'seconds'):>9} {med(ok, 'overhead'):>17} "
              f"{med(ok, 'job'):>7} {med(ok, 'load'):>5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

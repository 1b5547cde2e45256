"""Time `gpubench plot` of the p2p fixture (target: drawn in under 2 s on the CPU machine).

    python benchmarks/plot_speed.py [-n 5] [--limit 2.0] [FILE ...]

For each file (default tests/data/p2p-h200x2.json), prints the median and max of n in-process
draws (load + figure + PNG encode, matplotlib already imported, as `gpubench plot` spends it after
start-up), wall-clock and CPU time (time.process_time: what the draw costs, whatever else the
shared 2-core machine runs), and of n whole `python -m gpubench plot` runs (start-up and imports
included). Exits 1 if a file's median draw, in CPU time, is over the limit; the wall time is
printed beside it with `uptime`'s load, since on a loaded machine it measures the others too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*", default=[str(ROOT / "tests/data/p2p-h200x2.json")])
    ap.add_argument("-n", type=int, default=5)
    ap.add_argument("--limit", type=float, default=2.0)
    args = ap.parse_args()
    import matplotlib  # noqa: F401  (imported once, as by the command before it draws)

    from gpubench.analysis import plot

    plot.png_bytes([("warm", plot.load(args.files[0]))])  # font cache and first-draw costs
    worst = 0.0
    for f in args.files:
        draws, cpus, runs = [], [], []
        for _ in range(args.n):
            t0, c0 = time.perf_counter(), time.process_time()
            data = plot.png_bytes([(f, plot.load(f))])
            draws.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.n):
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-m", "gpubench", "plot", f, "-o", f"{tmp}/out.png", "-q"], check=True)
                runs.append(time.perf_counter() - t0)
        cpu = statistics.median(cpus)
        worst = max(worst, cpu)
        load = os.getloadavg()[0]
        print(f"{Path(f).name}: draw median {cpu:.2f} s CPU, {statistics.median(draws):.2f} s wall (max "
              f"{max(draws):.2f}) ({len(data)} bytes of PNG); whole command median {statistics.median(runs):.2f} s, "
              f"max {max(runs):.2f} s wall over {args.n} runs; load average {load:.1f} on {os.cpu_count()} CPUs")
    return 0 if worst < args.limit else 1


if __name__ == "__main__":
    sys.exit(main())

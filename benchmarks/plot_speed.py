"""Time `gpubench plot` of the p2p fixture (target: drawn in under 2 s on the CPU machine).

    python benchmarks/plot_speed.py [-n 5] [--limit 2.0] [FILE ...]

For each file (default tests/data/p2p-h200x2.json), prints the median and max of n in-process
draws (load + figure + PNG encode, matplotlib already imported, as `gpubench plot` spends it after
start-up) and of n whole `python -m gpubench plot` runs (start-up and imports included); exits 1
if a file's median in-process draw is over the limit. Run it beside `uptime`: the machine is shared.
"""

from __future__ import annotations

import argparse
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

    from gpubench import plot

    plot.png_bytes([("warm", plot.load(args.files[0]))])  # font cache and first-draw costs
    worst = 0.0
    for f in args.files:
        draws, runs = [], []
        for _ in range(args.n):
            t0 = time.perf_counter()
            data = plot.png_bytes([(f, plot.load(f))])
            draws.append(time.perf_counter() - t0)
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.n):
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-m", "gpubench", "plot", f, "-o", f"{tmp}/out.png", "-q"], check=True)
                runs.append(time.perf_counter() - t0)
        med = statistics.median(draws)
        worst = max(worst, med)
        print(f"{Path(f).name}: draw median {med:.2f} s, max {max(draws):.2f} s ({len(data)} bytes of PNG); "
              f"whole command median {statistics.median(runs):.2f} s, max {max(runs):.2f} s over {args.n} runs")
    return 0 if worst < args.limit else 1


if __name__ == "__main__":
    sys.exit(main())

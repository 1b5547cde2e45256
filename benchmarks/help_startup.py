"""Time `gpubench --help` start-up (target: under 0.5 s on the CPU machine, no cupy imported).

    python benchmarks/help_startup.py [-n 10]

Prints the median and max wall time of `python -m gpubench --help` over n runs, and which heavy
modules (cupy, dask, ...) an in-process `--help` imported; exits 1 if the median is over 0.5 s or
a heavy module was imported.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

HEAVY = ("cupy", "dask", "distributed", "cudf", "ucxx", "matplotlib", "pynvml")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=10)
    ap.add_argument("--limit", type=float, default=0.5)
    args = ap.parse_args()
    times = []
    for _ in range(args.n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "gpubench", "--help"], check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    code = ("import sys\nfrom gpubench.cli.app import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            f"print('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    heavy = [line[6:] for line in out.splitlines() if line.startswith("HEAVY=")]
    med = statistics.median(times)
    print(f"gpubench --help: median {med * 1e3:.0f} ms, max {max(times) * 1e3:.0f} ms over {args.n} runs; "
          f"heavy modules imported: {heavy[0] if heavy and heavy[0] else 'none'}")
    return 0 if med < args.limit and not (heavy and heavy[0]) else 1


if __name__ == "__main__":
    sys.exit(main())

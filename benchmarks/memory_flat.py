"""Memory stays flat: repeat a small copy sweep many times in one process and check that host RSS
and device memory in use end where the first repetition left them.

    PYTHONPATH=src python3 benchmarks/memory_flat.py [--reps 1000] [--tolerance-mib 16]

Prints RSS and device memory after the first and the last repetition; exits 1 if either grew by
more than the tolerance.
"""

from __future__ import annotations

import argparse
import sys


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def device_used_bytes(device: int = 0) -> int:
    from gpubench.core.gpu import device_free_bytes

    free, total = device_free_bytes(device)
    return total - free


def main() -> int:
    from gpubench.plugins.copy.bench import CopySpec, run
    from gpubench.core.gpu import MEMORY_KINDS
    from gpubench.core.timing import TimingPlan

    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--tolerance-mib", type=float, default=16)
    args = ap.parse_args()
    spec = CopySpec(sizes=(4096, 65536, 1 << 20), directions=("h2d", "d2h", "bidir"), memory=MEMORY_KINDS,
                    plan=TimingPlan(warmup=0, iters=2), verify=True)
    first = None
    for i in range(args.reps):
        run(spec)
        if i == 0:
            first = (rss_bytes(), device_used_bytes())
    last = (rss_bytes(), device_used_bytes())
    grow = [(b - a) / 2**20 for a, b in zip(first, last)]
    print(f"after 1 rep: RSS {first[0] / 2**20:.1f} MiB, device used {first[1] / 2**20:.1f} MiB; "
          f"after {args.reps}: RSS {last[0] / 2**20:.1f} MiB (+{grow[0]:.1f}), device {last[1] / 2**20:.1f} MiB (+{grow[1]:.1f})")
    return 0 if max(grow) <= args.tolerance_mib else 1


if __name__ == "__main__":
    sys.exit(main())

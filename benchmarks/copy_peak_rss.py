"""Peak host memory of `gpubench copy`, test by test, against the process's own baseline and the
buffers each test must hold (and nvbandwidth's, run beside it, where its binary is given).

    PYTHONPATH=src python3 benchmarks/copy_peak_rss.py [--size 512MiB] [--nvbandwidth PATH]

Each run is a fresh process (its peak is the kernel's ru_maxrss of that child, in KiB). The
baseline is a process that imports gpubench's command line and makes the CUDA context CuPy makes;
a test must hold its page-locked host buffer (one of --size; bidir two). Prints one row per test:
peak, peak - baseline, the buffers, and what is left over (gpubench's own cost). Exits 1 if a test
holds more than --slack-mib beyond its baseline and buffers.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

TESTS = {  # --direction: (nvbandwidth test, host buffers the test holds)
    "h2d": ("host_to_device_memcpy_ce", 1),
    "d2h": ("device_to_host_memcpy_ce", 1),
    "h2d-sm": ("host_to_device_memcpy_sm", 1),
    "d2h-sm": ("device_to_host_memcpy_sm", 1),
    "d2d": ("device_local_copy", 0),
    "latency": ("host_device_latency_sm", 1),
}


def peak_kib(argv: list[str]) -> int:
    """ru_maxrss of one child run to its end (a wrapper process per run, so each peak is its own)."""
    code = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
            "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True).stdout
    rc, kib = out.split()
    if rc != "0":
        raise SystemExit(f"{' '.join(argv)} exited {rc}")
    return int(kib)


def main() -> int:
    from gpubench.core.units import parse_size

    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="512MiB")
    ap.add_argument("--nvbandwidth", help="path of an nvbandwidth binary to run beside gpubench")
    ap.add_argument("--slack-mib", type=float, default=64.0)
    args = ap.parse_args()
    size = parse_size(args.size)
    base = peak_kib([sys.executable, "-c", "import gpubench.cli.app, cupy; cupy.cuda.Device(0).use(); cupy.zeros(1)"])
    print(f"baseline (imports + CUDA context): {base / 1024:.0f} MiB; buffer {size / 2**20:.0f} MiB")
    print(f"{'test':10} {'peak MiB':>9} {'- base':>8} {'buffers':>8} {'left':>6} {'nvbandwidth MiB':>16}")
    worst = 0.0
    for direction, (nvb_test, nbuf) in TESTS.items():
        peak = peak_kib([sys.executable, "-m", "gpubench", "copy", "-m", "pinned", "--direction", direction,
                         "-b", args.size, "-e", args.size, "-q"])
        left = (peak - base) / 1024 - nbuf * size / 2**20
        worst = max(worst, left)
        nvb = ""
        if args.nvbandwidth:
            nvb = f"{peak_kib([args.nvbandwidth, '-t', nvb_test, '-b', str(size // 2**20)]) / 1024:.0f}"
        print(f"{direction:10} {peak / 1024:9.0f} {(peak - base) / 1024:8.0f} {nbuf * size / 2**20:8.0f} "
              f"{left:6.0f} {nvb:>16}")
    print(f"most left over beyond the baseline and the buffers: {worst:.0f} MiB (at most {args.slack_mib:g})")
    return 0 if worst <= args.slack_mib else 1


if __name__ == "__main__":
    sys.exit(main())

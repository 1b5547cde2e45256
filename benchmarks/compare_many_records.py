"""`gpubench compare` of a result with many records against itself: time and peak memory.

Checks that compare stays linear in the number of records (docs/compare.md). Run on any machine,
no GPU:

    PYTHONPATH=src python3 benchmarks/compare_many_records.py [--records 200000] [--samples 8]
        [--format table|markdown|json]

It writes the file (copy-shaped records, `--samples` log-normal samples each, so each figure's two
sides tie sample for sample), then runs `python -m gpubench compare FILE FILE --format ...` in a fresh
process with stdout to /dev/null and prints the wall time and the child's peak RSS
(getrusage RUSAGE_CHILDREN), beside the same for a 1,000-record file to show the growth is linear.

Measured on the 2-core CPU machine shared with other work (load average 14-15, so read the CPU
seconds; 2026-12-01): 1,000 records 0.53 s CPU (1.7 s wall), 200,000 records (59.7 MB) 25.0 s CPU
(80 s wall), peak RSS 889 MB; of the CPU time about 7 s is loading the two files.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path


def write_result(path: Path, records: int, samples: int, seed: int = 1) -> int:
    rng = random.Random(seed)
    recs = []
    for i in range(records):
        nbytes = 4096 << (i % 19)
        med = nbytes / 50e9
        # copy's params only (the loader refuses others); unique per record: 19 sizes x 2 directions a device
        recs.append({"params": {"device": i // 38, "direction": "h2d" if i // 19 % 2 else "d2h", "memory": "pinned",
                                "nbytes": nbytes},
                     "metric": "bandwidth", "nbytes": nbytes,
                     "samples_s": [float(f"{med * rng.lognormvariate(0, 0.01):.6g}") for _ in range(samples)],
                     "reps": 1, "error": None, "extra": {}})
    doc = {"schema": "gpubench.result", "schema_version": 1, "command": "copy", "gpubench_version": "0.1.0",
           "created": "2026-12-01T00:00:00+00:00", "argv": ["copy"], "spec": {}, "timing": {}, "env": {},
           "partial": False, "interrupted_by": None, "records": recs}
    path.write_text(json.dumps(doc))
    return path.stat().st_size


def measure(path: Path, fmt: str) -> tuple[float, float, int, float]:
    """(wall seconds, peak RSS of the compare process in MB, exit code, its CPU seconds), in a fresh
    process. CPU seconds are what to read on a loaded machine: wall time there includes waiting."""
    script = ("import resource, subprocess, sys, time\n"
              "t0 = time.perf_counter()\n"
              "p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
              "w = time.perf_counter() - t0\n"
              "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
              "print(w, u.ru_maxrss / 1024, p.returncode, u.ru_utime + u.ru_stime)\n"
              "sys.stderr.write(p.stderr.decode()[-500:])\n")
    out = subprocess.run([sys.executable, "-c", script, sys.executable, "-m", "gpubench", "compare", str(path),
                          str(path), "--format", fmt], capture_output=True, text=True, check=True)
    if out.stderr.strip():
        print(out.stderr.strip(), file=sys.stderr)
    w, rss, rc, cpu = out.stdout.split()
    return float(w), float(rss), int(rc), float(cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--format", default="table", choices=["table", "markdown", "json"])
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        for n in (1_000, a.records):
            p = Path(d) / f"r{n}.json"
            size = write_result(p, n, a.samples)
            w, rss, rc, cpu = measure(p, a.format)
            print(f"{n:>8} records, {a.samples} samples each, {size / 1e6:6.1f} MB: compare against itself "
                  f"--format {a.format}: {w:6.2f} s wall, {cpu:6.2f} s CPU, peak RSS {rss:7.1f} MB, exit {rc}")
            os.unlink(p)


if __name__ == "__main__":
    main()

"""Cross-check `gpubench copy` against independent ways of timing the same copy, in one process.

Runs on a GPU machine: `PYTHONPATH=src python3 benchmarks/crosscheck_copy.py [--sizes 256MiB,1GiB]`.
Prints GB/s medians per method and the ratio gpubench / method. Where nvbandwidth is on PATH it is
run too (host_to_device_memcpy_ce, device_to_host_memcpy_ce) and its figures are printed beside.
The methods differ only in what surrounds the copy, so a gap between them locates a timing fault.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess


def _median_gbps(nbytes, seconds):
    return nbytes / statistics.median(seconds) / 1e9


def plain_events(nbytes, kind, iters, stream_kind, host_kind):
    """One copy between two events per sample; CuPy's allocators; null or non-blocking stream."""
    import cupy
    import numpy as np
    from cupy.cuda import runtime

    if host_kind == "pinned":
        mem = cupy.cuda.alloc_pinned_memory(nbytes)
        host = np.frombuffer(mem, dtype=np.uint8, count=nbytes)
    else:
        host = np.empty(nbytes, dtype=np.uint8)
    host[:] = 7
    dev = cupy.empty(nbytes, dtype=cupy.uint8)
    stream = cupy.cuda.Stream.null if stream_kind == "null" else cupy.cuda.Stream(non_blocking=True)
    src, dst, k = (host.ctypes.data, dev.data.ptr, 1) if kind == "h2d" else (dev.data.ptr, host.ctypes.data, 2)
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    out = []
    for i in range(iters + 3):
        e0.record(stream)
        runtime.memcpyAsync(dst, src, nbytes, k, stream.ptr)
        e1.record(stream)
        e1.synchronize()
        if i >= 3:
            out.append(cupy.cuda.get_elapsed_time(e0, e1) / 1e3)
    return _median_gbps(nbytes, out)


def loop16(nbytes, kind, iters):
    """nvbandwidth's shape: spin kernel holds the stream, 16 copies between the events."""
    import cupy
    import numpy as np
    from cupy.cuda import runtime

    from gpubench.core.gpu import SpinGate

    mem = cupy.cuda.alloc_pinned_memory(nbytes)
    host = np.frombuffer(mem, dtype=np.uint8, count=nbytes)
    host[:] = 7
    dev = cupy.empty(nbytes, dtype=cupy.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)
    gate = SpinGate(stream)
    src, dst, k = (host.ctypes.data, dev.data.ptr, 1) if kind == "h2d" else (dev.data.ptr, host.ctypes.data, 2)
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    out = []
    for i in range(iters + 1):
        gate.hold()
        e0.record(stream)
        for _ in range(16):
            runtime.memcpyAsync(dst, src, nbytes, k, stream.ptr)
        e1.record(stream)
        gate.release()
        e1.synchronize()
        if i >= 1:
            out.append(cupy.cuda.get_elapsed_time(e0, e1) / 1e3 / 16)
    return _median_gbps(nbytes, out)


def gpubench_figure(nbytes, kind, memory, iters):
    from gpubench.plugins.copy.bench import CopySpec, run
    from gpubench.core.timing import TimingPlan

    r = run(CopySpec(sizes=(nbytes,), directions=(kind,), memory=(memory,), plan=TimingPlan(iters=iters)))
    return r.records[0].rate_summary().median / 1e9


def nvbandwidth():
    exe = shutil.which("nvbandwidth")
    if not exe:
        return {}
    out = {}
    for t in ("host_to_device_memcpy_ce", "device_to_host_memcpy_ce"):
        text = subprocess.run([exe, "-t", t], capture_output=True, text=True, timeout=300).stdout
        m = re.search(r"SUM " + t + r"\s+([\d.]+)", text)
        out[t] = float(m.group(1)) / len(re.findall(r"^\s*0\s", text, re.M) or [1]) if m else None
    return out


def main():
    from gpubench.core.units import format_size, parse_size

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="256MiB,1GiB")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    for s in args.sizes.split(","):
        n = parse_size(s)
        for kind in ("h2d", "d2h"):
            rows = {
                "gpubench pinned": gpubench_figure(n, kind, "pinned", args.iters),
                "events, null stream, cupy pinned": plain_events(n, kind, args.iters, "null", "pinned"),
                "events, non-blocking stream, cupy pinned": plain_events(n, kind, args.iters, "nb", "pinned"),
                "spin gate + 16 copies per sample": loop16(n, kind, max(5, args.iters // 4)),
                "gpubench pageable": gpubench_figure(n, kind, "pageable", args.iters),
                "events, null stream, numpy pageable": plain_events(n, kind, args.iters, "null", "pageable"),
                "events, non-blocking, numpy pageable": plain_events(n, kind, args.iters, "nb", "pageable"),
            }
            base = rows["gpubench pinned"]
            for name, v in rows.items():
                print(f"{format_size(n):>8} {kind}  {name:<42} {v:8.2f} GB/s   gpubench pinned / this = {base / v:.3f}")
    for t, v in nvbandwidth().items():
        print(f"nvbandwidth {t}: {v}")


if __name__ == "__main__":
    main()

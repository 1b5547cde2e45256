#!/usr/bin/env python3
"""Run gpubench p2p and nccl beside nvbandwidth and nccl-tests' all_reduce_perf (where they are on
PATH) on the same GPUs and print gpubench / reference ratios.

    PYTHONPATH=src python3 benchmarks/crosscheck_p2p_nccl.py [--reference REFERENCE.json] [-G 10]

Compared figures (GPU 0 -> GPU 1 where a matrix):
- nvbandwidth device_to_device_memcpy_write_ce / _read_ce / _bidirectional_memcpy_read_ce (total)
  vs gpubench p2p write / read / bidir total at the same size (nvbandwidth's default 512 MiB).
  nvbandwidth labels its read matrix by the reading GPU, so its read (1, 0) cell is gpubench's (0 -> 1).
- all_reduce_perf -g N (float sum, out of place) busbw per size vs gpubench nccl at the same sizes
  and the same -e (nccl-tests offsets buffers within the largest size).
- with --reference: figures stored earlier from the reference tools on this machine, vs gpubench
  now; the p2pBandwidthLatencyTest ones against a gpubench run at that tool's 160,000,000-byte
  copies. The file is one JSON object: a key starting "nvbandwidth" ({"device_to_device_memcpy_write_ce_0_1",
  "device_to_device_memcpy_read_ce_0_1", "device_to_device_bidirectional_memcpy_read_ce_total_0_1": GB/s}),
  "p2pBandwidthLatencyTest" ({"unidir_p2p_disabled_0_1", "bidir_p2p_disabled_0_1": GB/s,
  "latency_p2p_writes_us_0_1", "latency_p2p_disabled_us_0_1": us}) and a key starting "nccl_tests"
  ({"busbw_out_of_place_GBps_by_bytes": {"<bytes>": GB/s}}); any of them may be left out.
A ratio within 0.99..1.01 is marked ok.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile


PBLT_BYTES = 40_000_000 * 4  # p2pBandwidthLatencyTest numElems (ints) x sizeof(int)


def run(cmd: list[str], timeout: int = 1800) -> subprocess.CompletedProcess:
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def gpubench(args: list[str], out: str) -> dict:
    p = run([sys.executable, "-m", "gpubench", *args, "--json", out, "-q"])
    if p.returncode not in (0, 1):
        sys.exit(f"gpubench {' '.join(args)} failed ({p.returncode}): {p.stderr.strip()}")
    with open(out) as f:
        return json.load(f)


def p2p_figures(res: dict) -> dict:
    """{(test, part, src, dst): median GB/s or us} from a gpubench p2p result."""
    import statistics

    out = {}
    for r in res["records"]:
        if r.get("error") or not r["samples_s"]:
            continue
        p = r["params"]
        if r["metric"] == "time":
            v = statistics.median(r["samples_s"]) * 1e6
        else:
            v = statistics.median(r["nbytes"] / t for t in r["samples_s"]) / 1e9
        out[(p["test"], p.get("part"), p["src"], p["dst"])] = v
    return out


def nccl_figures(res: dict) -> dict:
    """{nbytes: busbw GB/s} of the out-of-place records."""
    return {r["params"]["nbytes"]: r["extra"]["busbw_bytes_per_s"] / 1e9 for r in res["records"]
            if r["params"]["placement"] == "out-of-place" and "busbw_bytes_per_s" in r["extra"]}


def nvbandwidth(tests: list[str], size_mib: int) -> dict:
    """{testcase name: matrix of floats (None where N/A)} from ``nvbandwidth -j``."""
    args = ["nvbandwidth", "-j", "-b", str(size_mib)]
    for t in tests:
        args += ["-t", t]
    p = run(args)
    if p.returncode != 0:
        print(f"nvbandwidth failed: {p.stderr.strip()[:200]}")
        return {}
    text = p.stdout[p.stdout.find("{"):]
    d = json.loads(text)
    out = {}
    for tc in d.get("nvbandwidth", {}).get("testcases", []):
        m = tc.get("bandwidth_matrix")
        if m:
            out[tc["name"]] = [[_num(x) for x in row] for row in m]
    return out


def _num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def all_reduce_perf(ngpus: int, b: str, e: str, f: int, graph: int = 0) -> dict:
    """{size: out-of-place busbw GB/s} parsed from all_reduce_perf's table (-G graph when > 0)."""
    p = run(["all_reduce_perf", "-g", str(ngpus), "-b", b, "-e", e, "-f", str(f), "-G", str(graph)])
    if p.returncode != 0:
        print(f"all_reduce_perf failed: {p.stderr.strip()[:200]}")
        return {}
    out = {}
    for line in p.stdout.splitlines():
        parts = line.split()
        # size count type redop root time algbw busbw #wrong time algbw busbw #wrong
        if len(parts) >= 9 and parts[0].isdigit() and re.match(r"^[\d.]+$", parts[7]):
            out[int(parts[0])] = float(parts[7])
    return out


def show(rows: list[tuple[str, float | None, float | None]]) -> None:
    print(f"\n{'figure':58s} {'gpubench':>10s} {'reference':>10s} {'ratio':>7s}")
    for name, mine, ref in rows:
        if mine is None or ref is None:
            print(f"{name:58s} {mine if mine is not None else '-':>10} {ref if ref is not None else '-':>10}")
            continue
        ratio = mine / ref
        flag = "ok" if 0.99 <= ratio <= 1.01 else "OFF"
        print(f"{name:58s} {mine:10.2f} {ref:10.2f} {ratio:7.3f} {flag}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", help="a JSON of stored reference-tool figures to compare with as well (see above)")
    ap.add_argument("--p2p-size-mib", type=int, default=512, help="copy size, nvbandwidth's default 512")
    ap.add_argument("-b", default="1M")
    ap.add_argument("-e", default="1G")
    ap.add_argument("-f", type=int, default=4)
    ap.add_argument("-G", type=int, default=0, help="CUDA-graph launches, for both tools (nccl-tests -G)")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="gpubench-crosscheck-")
    p2p = p2p_figures(gpubench(["p2p", "-d", "0,1", "-t", "write,read,bidir", "-b", f"{args.p2p_size_mib}M"],
                               os.path.join(tmp, "p2p.json")))
    # p2pBandwidthLatencyTest's own size (40 M ints) and copies per sample (5, gpubench's peer-off
    # default): its peer-off bidirectional figure depends on both (docs/p2p.md)
    pblt = p2p_figures(gpubench(["p2p", "-d", "0,1", "-t", "off,off-bidir,off-latency,latency",
                                 "-b", str(PBLT_BYTES)], os.path.join(tmp, "p2p-pblt.json")))
    ncres = gpubench(["nccl", "-b", args.b, "-e", args.e, "-f", str(args.f), "-G", str(args.G),
                      "--placement", "out-of-place"],
                     os.path.join(tmp, "nccl.json"))
    nccl = nccl_figures(ncres)
    ngpus = ncres["spec"]["nranks"]
    rows: list[tuple[str, float | None, float | None]] = []

    if shutil.which("nvbandwidth"):
        nv = nvbandwidth(["device_to_device_memcpy_write_ce", "device_to_device_memcpy_read_ce",
                          "device_to_device_bidirectional_memcpy_read_ce"], args.p2p_size_mib)
        w = nv.get("device_to_device_memcpy_write_ce")
        r = nv.get("device_to_device_memcpy_read_ce")
        bt = nv.get("device_to_device_bidirectional_memcpy_read_ce_total")
        rows.append(("p2p write 0->1 vs nvbandwidth write CE (0,1)", p2p.get(("write", None, 0, 1)), w and w[0][1]))
        rows.append(("p2p read 0->1 vs nvbandwidth read CE (1,0)", p2p.get(("read", None, 0, 1)), r and r[1][0]))
        rows.append(("p2p bidir total 0<->1 vs nvbandwidth bidir read total", p2p.get(("bidir", "total", 0, 1)),
                     bt and bt[0][1]))
    else:
        print("nvbandwidth not on PATH: skipped")
    if shutil.which("all_reduce_perf"):
        ref = all_reduce_perf(ngpus, args.b, args.e, args.f, args.G)
        g = f" -G {args.G}" if args.G else ""
        for size in sorted(set(ref) & set(nccl)):
            rows.append((f"nccl{g} all-reduce busbw {size} B vs all_reduce_perf -g {ngpus}{g}", nccl[size],
                         ref[size]))
    else:
        print("all_reduce_perf not on PATH: skipped")

    if args.reference:
        with open(args.reference) as f:
            ref = json.load(f)
        nvb = next((v for k, v in ref.items() if k.startswith("nvbandwidth")), {})
        pbl = ref.get("p2pBandwidthLatencyTest", {})
        nct = next((v for k, v in ref.items() if k.startswith("nccl_tests")), {})
        rows += [
            ("p2p write 0->1 vs stored nvbandwidth write CE", p2p.get(("write", None, 0, 1)),
             nvb.get("device_to_device_memcpy_write_ce_0_1")),
            ("p2p read 0->1 vs stored nvbandwidth read CE", p2p.get(("read", None, 0, 1)),
             nvb.get("device_to_device_memcpy_read_ce_0_1")),
            ("p2p bidir total vs stored nvbandwidth bidir read total", p2p.get(("bidir", "total", 0, 1)),
             nvb.get("device_to_device_bidirectional_memcpy_read_ce_total_0_1")),
            ("p2p off 0->1 vs stored p2pBandwidthLatencyTest P2P disabled", pblt.get(("off", None, 0, 1)),
             pbl.get("unidir_p2p_disabled_0_1")),
            ("p2p off-bidir total vs stored p2pBLT bidir disabled", pblt.get(("off-bidir", "total", 0, 1)),
             pbl.get("bidir_p2p_disabled_0_1")),
            ("p2p latency us 0->1 vs stored p2pBLT P2P writes", pblt.get(("latency", None, 0, 1)),
             pbl.get("latency_p2p_writes_us_0_1")),
            ("p2p off-latency us 0->1 vs stored p2pBLT P2P disabled", pblt.get(("off-latency", None, 0, 1)),
             pbl.get("latency_p2p_disabled_us_0_1")),
        ]
        for size, bus in sorted((int(k), v) for k, v in nct.get("busbw_out_of_place_GBps_by_bytes", {}).items()):
            rows.append((f"nccl all-reduce busbw {size} B vs stored nccl-tests", nccl.get(size), bus))
    show(rows)
    print(f"\nresults kept in {tmp}")


if __name__ == "__main__":
    main()

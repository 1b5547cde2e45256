"""gpubench net --protocol ucx beside ucx_perftest -t tag_bw on one machine: GB/s and the ratio.

    PYTHONPATH=src python3 benchmarks/net_vs_ucx_perftest.py                  # 5 rounds, 1 MiB and 64 MiB, host
    PYTHONPATH=src python3 benchmarks/net_vs_ucx_perftest.py --rounds 8 --seconds 4 --sizes 1MiB,64MiB
    PYTHONPATH=src python3 benchmarks/net_vs_ucx_perftest.py --memory cuda     # GPU: cuda to cuda
    PYTHONPATH=src python3 benchmarks/net_vs_ucx_perftest.py --wait sleep      # both sleep on UCX events

Each round runs, per size, one ``gpubench net local --protocol ucx -m MEM -l SIZE -t SECONDS -O OMIT``
(a fresh server process and client process) and one ``ucx_perftest`` pair (server ``ucx_perftest -p
PORT``, client ``ucx_perftest 127.0.0.1 -p PORT -t tag_bw -m MEM -s SIZE -n ITERS -w WARMUP``); the
tool that goes first alternates from round to round, so a change of load falls on both. Both use
the same message size, memory type, wait mode (``--wait``: gpubench's ``--wait``, ucx_perftest's
``-E``; both poll by default) and window (tag_bw's 32 sends in flight; gpubench's
--in-flight default), and the same UCX settings: ucx_perftest runs with every ``UCX_*`` variable
gpubench's client had (its JSON's ``env.ucx_env``: what UCXX sets on import, UCX_RNDV_THRESH=8192
among them, and UCX_NET_DEVICES=lo), plus ``--tls`` as UCX_TLS for both where given.

Figures:

- gpubench: the ``total`` record's ``gb_per_s``: bytes of the sends completed in the counted
  intervals (after -O) / their seconds.
- ucx_perftest: its "overall" bandwidth column (MB/s of 2^20 B over every timed iteration, warm-up
  left out), x 2^20 / 1e9. ITERS is chosen so that its timed part lasts about SECONDS at the rate
  gpubench just measured (at least 20), WARMUP = ITERS x OMIT / SECONDS (at least 2).
- The table holds medians over the rounds, each round's pair of figures, and the ratio of medians;
  the load average before and after, and the transports gpubench's endpoints reported.

Buffers: gpubench's host buffers are numpy arrays (malloc'd anonymous memory); ucx_perftest
allocates its own through UCX (``UCX_ALLOC_PRIO``, sysv shared memory first), which cma reads more
slowly at large sizes on the 2-core VM (64 MiB: 1.0-1.2 GB/s against 1.5-2.0 with
``UCX_ALLOC_PRIO=heap``). ``--perftest-heap`` runs ucx_perftest with malloc'd buffers, as gpubench's.

Installs nothing; ucx_perftest is found on PATH or in the libucx wheel (libucx/bin, its libraries in
libucx/lib). Runtime: rounds x sizes x 2 x (seconds + omit + ~2 s start-up).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def _size(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*(|K|M|G)(i?B)?", text.strip(), re.IGNORECASE)
    if not m:
        raise SystemExit(f"--sizes: {text!r} is not a size (e.g. 1MiB, 65536)")
    return int(m.group(1)) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[m.group(2).lower()]


def find_perftest() -> tuple[str, dict]:
    """(the ucx_perftest path, environment additions it needs). Exits 2 when there is none."""
    path = shutil.which("ucx_perftest")
    if path:
        return path, {}
    try:
        import libucx
    except ImportError:
        raise SystemExit("ucx_perftest not found: pip install libucx-cu13 (its bin/ucx_perftest), or put UCX's on PATH")
    root = os.path.dirname(libucx.__file__)
    exe = os.path.join(root, "bin", "ucx_perftest")
    if not os.path.exists(exe):
        raise SystemExit(f"ucx_perftest not in {root}/bin: install UCX's tools")
    lib = os.path.join(root, "lib")
    return exe, {"LD_LIBRARY_PATH": lib + os.pathsep + os.environ.get("LD_LIBRARY_PATH", "")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_gpubench(size: int, memory: str, seconds: float, omit: float, env: dict, wait: str = "poll") -> tuple[float, dict]:
    """(GB/s, the result's JSON) of one net local --protocol ucx run."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        cmd = [sys.executable, "-m", "gpubench", "net", "local", "--protocol", "ucx", "-m", memory, "-l", str(size),
               "-t", str(seconds), "-O", str(omit), "-i", str(min(1.0, seconds)), "--wait", wait, "-q", "--json", out]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds * 4 + 60)
        if p.returncode != 0:
            raise SystemExit(f"gpubench failed ({p.returncode}): {p.stderr.strip()[-500:]}")
        with open(out) as f:
            res = json.load(f)
    total = next(r for r in res["records"] if r["params"].get("stream") == "total")
    return total["extra"]["gb_per_s"], res


def run_perftest(exe: str, env: dict, size: int, memory: str, iters: int, warmup: int, timeout: float,
                 wait: str = "poll") -> float:
    """GB/s (1e9 B/s) of one ucx_perftest tag_bw pair: its "overall" MB/s (2^20 B/s) x 2^20 / 1e9."""
    port = free_port()
    server = subprocess.Popen([exe, "-p", str(port), "-E", wait], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)  # the server's socket listens
        p = subprocess.run([exe, "127.0.0.1", "-p", str(port), "-t", "tag_bw", "-m", memory, "-s", str(size),
                            "-n", str(iters), "-w", str(warmup), "-E", wait, "-f"], env=env, capture_output=True, text=True,
                           timeout=timeout)
        server.wait(timeout=10)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    lines = [ln.split() for ln in p.stdout.splitlines() if ln.strip() and ln.split()[0].isdigit()]
    if p.returncode != 0 or not lines:
        raise SystemExit(f"ucx_perftest failed ({p.returncode}): {(p.stderr or p.stdout).strip()[-500:]}")
    # iterations, 50%ile, avg lat, overall lat, avg MB/s, overall MB/s, avg msg/s, overall msg/s
    return float(lines[-1][5]) * 2**20 / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="1MiB,64MiB")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--omit", type=float, default=0.5)
    ap.add_argument("--memory", default="host", choices=["host", "cuda"])
    ap.add_argument("--tls", default=None, help="UCX_TLS for both tools (default: UCX's choice)")
    ap.add_argument("--wait", default="poll", choices=["poll", "sleep"],
                    help="both tools spin on UCX progress (poll, their default) or sleep on its events (gpubench "
                         "--wait sleep, ucx_perftest -E sleep)")
    ap.add_argument("--perftest-heap", action="store_true",
                    help="ucx_perftest's buffers from malloc (UCX_ALLOC_PRIO=heap), as gpubench's numpy ones, "
                         "instead of its default sysv shared memory")
    a = ap.parse_args()
    exe, extra = find_perftest()
    env = dict(os.environ)
    if a.tls:
        env["UCX_TLS"] = a.tls
    sizes = [_size(s) for s in a.sizes.split(",")]
    load0 = os.getloadavg()
    t_start = time.time()
    rows = {s: {"gpubench": [], "perftest": []} for s in sizes}
    carried: dict[int, str] = {}
    ucx_env: dict = {}  # the UCX_* variables of gpubench's last client (the first round runs gpubench first)
    for rnd in range(a.rounds):
        for s in sizes:
            order = ["gpubench", "perftest"] if rnd % 2 == 0 else ["perftest", "gpubench"]
            est = statistics.median(rows[s]["gpubench"]) * 1e9 if rows[s]["gpubench"] else 2e9
            for tool in order:
                if tool == "gpubench":
                    gbps, res = run_gpubench(s, a.memory, a.seconds, a.omit, env, a.wait)
                    rows[s]["gpubench"].append(gbps)
                    ucx_env = res["env"].get("ucx_env", {})
                    t = res["records"][0]["extra"].get("transports", {})
                    row = (t.get("client") or {}).get("carried_by") or {}
                    carried[s] = f"the sender's protocol {row.get('protocol')} over {row.get('via')}"
                else:
                    pt_env = {**env, **extra, **ucx_env, **({"UCX_ALLOC_PRIO": "heap"} if a.perftest_heap else {})}
                    iters = max(20, int(a.seconds * est / s))
                    warm = max(2, int(iters * a.omit / a.seconds))
                    rows[s]["perftest"].append(run_perftest(exe, pt_env, s, a.memory, iters, warm,
                                                            timeout=a.seconds * 6 + 60, wait=a.wait))
            print(f"round {rnd + 1} {s} B: gpubench {rows[s]['gpubench'][-1]:.3f} GB/s, "
                  f"ucx_perftest {rows[s]['perftest'][-1]:.3f} GB/s", file=sys.stderr, flush=True)
    load1 = os.getloadavg()
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t_start))}, {a.rounds} rounds, -t {a.seconds:g} "
          f"-O {a.omit:g}, -m {a.memory}, wait {a.wait}{', UCX_TLS=' + a.tls if a.tls else ''}"
          f"{', ucx_perftest with UCX_ALLOC_PRIO=heap' if a.perftest_heap else ''}; load average "
          f"{load0[0]:.2f} before, {load1[0]:.2f} after; {time.time() - t_start:.0f} s\n")
    print("| size | gpubench GB/s | ucx_perftest GB/s | gpubench / ucx_perftest | rounds (gpubench / ucx_perftest) |")
    print("| --- | --- | --- | --- | --- |")
    for s in sizes:
        g, p = statistics.median(rows[s]["gpubench"]), statistics.median(rows[s]["perftest"])
        each = ", ".join(f"{x:.2f}/{y:.2f}" for x, y in zip(rows[s]["gpubench"], rows[s]["perftest"]))
        print(f"| {s // 2**20} MiB | {g:.3f} | {p:.3f} | {g / p:.2f} | {each} |" if s >= 2**20 else
              f"| {s} B | {g:.3f} | {p:.3f} | {g / p:.2f} | {each} |")
    for s in sizes:
        print(f"\n{s} B, gpubench's endpoints: {carried.get(s)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

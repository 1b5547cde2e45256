"""Run `gpubench net` beside iperf3 with the same streams, duration, omit and write size; print both
receiver-side totals and the ratio gpubench / iperf3.

Loopback (both servers started here, on free ports):

    PYTHONPATH=src python3 benchmarks/net_vs_iperf3.py -P 4 -t 5 -O 1

Two hosts (start `gpubench net server --bind 0.0.0.0` and `iperf3 -s` on HOST first):

    PYTHONPATH=src python3 benchmarks/net_vs_iperf3.py --host HOST -P 8 -t 10 -O 2

iperf3's figure is its `end.sum_received.bits_per_second` (the receiver's, omitted seconds left
out), gpubench's the "total" record's `gbit_per_s` (also received bytes after --omit). Where
iperf3 is not on PATH only gpubench is run. Each tool runs `--repeat` times, alternating.
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpubench_once(host: str, port: int, a) -> float:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "net.json")
        p = subprocess.run([sys.executable, "-m", "gpubench", "net", "client", host, "--port", str(port),
                            "-P", str(a.parallel), "-t", str(a.time), "-O", str(a.omit), "-l", a.length,
                            "-q", "--json", out], capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"gpubench net client failed: {p.stderr.strip()}")
        with open(out) as f:
            d = json.load(f)
    return next(r for r in d["records"] if r["params"]["stream"] == "total")["extra"]["gbit_per_s"]


def iperf3_once(host: str, port: int, a) -> float:
    p = subprocess.run(["iperf3", "-c", host, "-p", str(port), "-P", str(a.parallel), "-t", str(a.time),
                        "-O", str(a.omit), "-l", a.length.replace("i", "").replace("B", ""), "-J"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"iperf3 failed: {p.stdout[-300:]} {p.stderr.strip()}")
    return json.loads(p.stdout)["end"]["sum_received"]["bits_per_second"] / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default=None, help="a remote host running both servers; default: loopback")
    ap.add_argument("--port", type=int, default=5301, help="gpubench server port on --host")
    ap.add_argument("--iperf3-port", type=int, default=5201, help="iperf3 server port on --host")
    ap.add_argument("-P", "--parallel", type=int, default=4)
    ap.add_argument("-t", "--time", type=int, default=5, help="whole seconds (iperf3 reads an integer)")
    ap.add_argument("-O", "--omit", type=int, default=1, help="whole seconds (iperf3 reads an integer)")
    ap.add_argument("-l", "--length", default="128K", help="write size; K/M binary, as iperf3 reads it")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    if not re.fullmatch(r"\d+[KM]?", a.length.replace("i", "").replace("B", "")):
        raise SystemExit("-l: use a plain size such as 128K or 1M (iperf3 must read it the same way)")
    have_iperf3 = shutil.which("iperf3") is not None
    procs = []
    host = a.host or "127.0.0.1"
    gport, iport = a.port, a.iperf3_port
    try:
        if a.host is None:
            gport = _free_port()
            procs.append(subprocess.Popen([sys.executable, "-m", "gpubench", "net", "server", "--port", str(gport), "-q"],
                                          stderr=subprocess.DEVNULL))
            if have_iperf3:
                iport = _free_port()
                procs.append(subprocess.Popen(["iperf3", "-s", "-B", "127.0.0.1", "-p", str(iport)],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(1.0)
        g, i = [], []
        for _ in range(a.repeat):
            g.append(gpubench_once(host, gport, a))
            if have_iperf3:
                i.append(iperf3_once(host, iport, a))
        where = a.host or "loopback"
        print(f"{where}: -P {a.parallel} -t {a.time} -O {a.omit} -l {a.length}, {a.repeat} run(s) each, Gbit/s received")
        print(f"  gpubench net : median {statistics.median(g):8.2f}  runs {', '.join(f'{x:.2f}' for x in g)}")
        if have_iperf3:
            print(f"  iperf3       : median {statistics.median(i):8.2f}  runs {', '.join(f'{x:.2f}' for x in i)}")
            print(f"  ratio gpubench / iperf3 = {statistics.median(g) / statistics.median(i):.3f}")
        else:
            print("  iperf3 not on PATH: only gpubench was run")
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()

"""gpubench net beside iperf3 and iperf2 on loopback: throughput and CPU seconds per Gbit.

    PYTHONPATH=src python3 benchmarks/net_vs_iperf3.py                 # 5 rounds, 3 s, 1/4/16 streams
    PYTHONPATH=src python3 benchmarks/net_vs_iperf3.py --rounds 8 --seconds 5 --streams 1,4,16

Every run starts a fresh server process and one client process of one tool on 127.0.0.1 (a free
port), same streams (-P), same seconds (-t, nothing omitted) and 128 KiB writes (-l); the tools
take turns within a round (the first one rotates from round to round), so a load change on the
machine falls on all of them. Installs nothing: a tool missing from PATH is left out with the
command that installs it.

Figures:

- Gbit/s: what each tool reports as *received* where it can: gpubench the "total" record's
  ``gbit_per_s`` (bytes the server received / seconds), iperf3 ``end.sum_received.bits_per_second``
  (``-J``); iperf2 its client's CSV lines (``-y C``: the sum over the streams' lines, or the SUM line
  where the version prints one): bytes written over the test, above what was received by at most
  one socket buffer per stream (~4 MiB / 3 s = 0.01 Gbit/s each).
- CPU-s/Gbit: user + system seconds of both processes of the run, client and server, from
  ``resource.getrusage(RUSAGE_CHILDREN)`` before and after (children are counted once waited for),
  over the Gbit moved (Gbit/s x seconds). Everything a process spends is in: its start-up (Python's
  for gpubench, about 0.15 s per process, and its worker processes'), the control connection, and
  the data path. gpubench runs with Python's bytecode cache on (as installed by pip), whatever
  PYTHONDONTWRITEBYTECODE says.
- The table shows medians over the rounds; ratios are ratios of medians.

iperf3 runs with ``-Z`` (sendfile, zero copy on the sender) and gpubench with its default zero copy
(sendfile; the receiver discards with MSG_TRUNC); ``--copy`` runs gpubench with --copy and iperf3
without -Z instead (one copy each way, as iperf2 always does).

Runtime: rounds x stream counts x tools x (seconds + ~1 s): the defaults took 171-192 s here (about 3 minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

INSTALL = {
    "iperf3": "apt-get install -y iperf3 (Debian/Ubuntu), dnf install iperf3 (Fedora/RHEL), brew install iperf3",
    "iperf": "apt-get install -y iperf (Debian/Ubuntu), dnf install iperf (Fedora/RHEL), brew install iperf",
}


# gpubench's processes run as an installed copy would: with Python's bytecode cache (pip compiles it
# at install). PYTHONDONTWRITEBYTECODE=1 in the environment would make every gpubench process
# compile its modules again, ~0.07 CPU-s each, charged to gpubench's CPU per Gbit.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    """True when something listens on 127.0.0.1:port (read from /proc/net/tcp: no connection is
    made, which would use up a one-off server's test)."""
    try:
        with open("/proc/net/tcp") as f:
            rows = [line.split() for line in f.readlines()[1:]]
    except OSError:
        return True
    return any(r[3] == "0A" and int(r[1].split(":")[1], 16) == port for r in rows)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class Run:
    """One tool's run: a server process and a client process on a free port."""

    def __init__(self, tool: str, streams: int, a):
        self.tool, self.streams, self.a = tool, streams, a

    def commands(self, port: int, out: str) -> tuple[list[str], list[str]]:
        a, p, n, t = self.a, str(port), str(self.streams), str(self.a.seconds)
        if self.tool == "gpubench":
            gb = [sys.executable, "-m", "gpubench", "net"]
            copy = ["--copy"] if a.copy else []
            return ([*gb, "server", "--port", p, "-1", "-q"],
                    [*gb, "client", "127.0.0.1", "--port", p, "-P", n, "-t", t, "-l", "128KiB", *copy, "-q",
                     "--json", out])
        if self.tool == "iperf3":
            z = [] if a.copy else ["-Z"]
            return (["iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", p],
                    ["iperf3", "-c", "127.0.0.1", "-p", p, "-P", n, "-t", t, "-l", "128K", *z, "-J"])
        return (["iperf", "-s", "-B", "127.0.0.1", "-p", p],
                ["iperf", "-c", "127.0.0.1", "-p", p, "-P", n, "-t", t, "-l", "128K", "-y", "C"])

    def gbit(self, stdout: str, out: str) -> float:
        if self.tool == "gpubench":
            with open(out) as f:
                d = json.load(f)
            return next(r for r in d["records"] if r["params"]["stream"] == "total")["extra"]["gbit_per_s"]
        if self.tool == "iperf3":
            return json.loads(stdout)["end"]["sum_received"]["bits_per_second"] / 1e9
        # iperf 2.1.8 -y C: one line per stream (id 1..P), a SUM line (id -1) only in some versions
        lines = [line.split(",") for line in stdout.strip().splitlines() if line.count(",") >= 8]
        total = [x for x in lines if x[5] == "-1"]
        return (float(total[-1][8]) if total else sum(float(x[8]) for x in lines)) / 1e9

    def once(self) -> tuple[float, float]:
        """(Gbit/s, CPU seconds of server + client)."""
        port = _free_port()
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "net.json")
            srv_cmd, cli_cmd = self.commands(port, out)
            cpu0 = _children_cpu()
            srv = subprocess.Popen(srv_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
            try:
                deadline = time.monotonic() + 20
                while not _listening(port):
                    if srv.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"{self.tool} server did not start: {' '.join(srv_cmd)}")
                    time.sleep(0.01)
                p = subprocess.run(cli_cmd, capture_output=True, text=True, timeout=self.a.seconds + 60, env=ENV)
                if p.returncode != 0:
                    raise SystemExit(f"{self.tool} client failed ({p.returncode}): {(p.stderr or p.stdout)[-300:]}")
                gbit = self.gbit(p.stdout, out)
            finally:
                if self.tool == "iperf" and srv.poll() is None:
                    srv.send_signal(signal.SIGTERM)
                try:
                    srv.wait(10)
                except subprocess.TimeoutExpired:
                    srv.kill()
                    srv.wait()
            return gbit, _children_cpu() - cpu0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="rounds; each tool runs once per round and stream count")
    ap.add_argument("--seconds", type=int, default=3, help="whole seconds per run (iperf reads an integer)")
    ap.add_argument("--streams", default="1,4,16", help="comma-separated stream counts")
    ap.add_argument("--copy", action="store_true", help="gpubench --copy and iperf3 without -Z")
    a = ap.parse_args()
    if a.rounds < 1 or not 1 <= a.seconds <= 3600:
        raise SystemExit("--rounds must be >= 1 and --seconds 1 to 3600")
    try:
        counts = [int(x) for x in a.streams.split(",")]
    except ValueError:
        raise SystemExit(f"--streams {a.streams!r}: use numbers separated by commas, e.g. 1,4,16") from None
    tools = ["gpubench"]
    for t in ("iperf3", "iperf"):
        if shutil.which(t):
            tools.append(t)
        else:
            print(f"{t} is not on PATH, left out; to get it: {INSTALL[t]}", file=sys.stderr)
    t_start = time.monotonic()
    load0 = os.getloadavg()
    res: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for r in range(a.rounds):
        for n in counts:
            order = tools[r % len(tools):] + tools[: r % len(tools)]
            for tool in order:
                g, cpu = Run(tool, n, a).once()
                res.setdefault((tool, n), []).append((g, cpu))
                print(f"round {r + 1} P={n} {tool}: {g:.2f} Gbit/s, {cpu:.2f} CPU-s", file=sys.stderr)
    wall = time.monotonic() - t_start
    load1 = os.getloadavg()

    def med_gbit(tool, n):
        return statistics.median(g for g, _ in res[(tool, n)])

    def med_cpu(tool, n):
        return statistics.median(c / (g * a.seconds) for g, c in res[(tool, n)] if g > 0)

    versions = []
    for t, cmd in (("iperf3", ["iperf3", "--version"]), ("iperf", ["iperf", "-v"])):
        if t in tools:
            p = subprocess.run(cmd, capture_output=True, text=True)
            versions.append(((p.stdout or p.stderr).strip().splitlines() or [t])[0])
    names = {"gpubench": "gpubench", "iperf3": "iperf3" + ("" if a.copy else " -Z"), "iperf": "iperf2"}
    print(f"Loopback, {os.cpu_count()} CPUs, {a.rounds} rounds x {a.seconds} s, 128 KiB writes, tools alternated; "
          f"gpubench {'--copy' if a.copy else 'zero copy'}{'; ' + ', '.join(versions) if versions else ''}. "
          f"Load average before {load0[0]:.2f}, after {load1[0]:.2f}; {wall:.0f} s in all.\n")
    head = ["streams"] + [f"{names[t]} Gbit/s" for t in tools]
    head += [f"gpubench / {names[t]}" for t in tools[1:]]
    head += [f"{names[t]} CPU-s/Gbit" for t in tools]
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    verdict = []
    for n in counts:
        g = {t: med_gbit(t, n) for t in tools}
        c = {t: med_cpu(t, n) for t in tools}
        row = [str(n)] + [f"{g[t]:.1f}" for t in tools]
        row += [f"{g['gpubench'] / g[t]:.2f}" if g[t] > 0 else "-" for t in tools[1:]]
        row += [f"{c[t]:.4f}" for t in tools]
        print("| " + " | ".join(row) + " |")
        for t in tools[1:]:
            verdict.append(f"P={n}: gpubench {'>=' if g['gpubench'] >= g[t] else '<'} {names[t]} in Gbit/s")
        if "iperf3" in tools:
            verdict.append(f"P={n}: gpubench CPU-s/Gbit {'<=' if c['gpubench'] <= c['iperf3'] else '>'} "
                           f"{names['iperf3']}'s")
    print()
    for line in verdict:
        print(f"- {line}")


if __name__ == "__main__":
    main()

"""`gpubench net` as a user meets it: help, bad options, `net local` with its report and JSON, and a
`net server` process on loopback abused from outside (memory measured from /proc), a client killed
mid-test, and the server stopped by SIGTERM / SIGINT; small windows (-w 4-8 KiB) that still measure."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest


def gb(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "gpubench", *args], capture_output=True, text=True, timeout=timeout)


def _one_line_error(p, code):
    assert p.returncode == code, (p.returncode, p.stdout[-500:], p.stderr[-500:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpubench"), p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    return lines[0]


@pytest.mark.parametrize("args", [["net", "--help"], ["net", "server", "--help"], ["net", "client", "--help"],
                                  ["net", "local", "--help"]])
def test_help(args):
    p = gb(*args)
    assert p.returncode == 0 and "Usage:" in p.stdout


@pytest.mark.parametrize("args, fragment", [
    (["local", "-P", "0"], "-P/--parallel 0"),
    (["local", "-P", "10000"], "-P/--parallel 10000"),
    (["local", "-t", "31536000"], "-t/--time"),
    (["local", "-t", "0"], "-t/--time 0"),
    (["local", "-t", "nan"], "-t/--time 'nan' is not a finite number"),
    (["local", "-t", "soon"], "soon"),
    (["local", "-O", "-1"], "-O/--omit -1"),
    (["local", "-i", "0.01"], "-i/--interval 0.01"),
    (["local", "-l", "1GiB"], "-l/--length '1GiB'"),
    (["local", "-l", "0"], "-l/--length"),
    (["local", "--units", "MB"], "MB"),
    (["client"], "HOST"),
    (["client", "127.0.0.1", "--port", "70000"], "--port 70000"),
    (["client", "127.0.0.1", "--port", "0"], "--port 0"),
    (["client", "no-such-host.invalid", "-t", "1"], "no-such-host.invalid"),
    (["server", "--port", "-5"], "--port -5"),
    (["server", "--bind", "not an address"], "not an address"),
    (["server", "--bind", "192.0.2.1", "--port", "0"], "cannot listen on 192.0.2.1"),
    (["local", "-b", "fast"], "-b/--bitrate 'fast' is not a bit rate"),
    (["local", "-b", "١٢"], "-b/--bitrate '١٢' is not a bit rate"),  # float() reads Arabic-Indic digits
    (["local", "-b", "１２M"], "-b/--bitrate '１２M' is not a bit rate"),
    (["local", "-b", "20T"], "-b/--bitrate 20000000000000 bit/s out of range"),
    (["local", "-w", "10"], "-w/--window 10 bytes out of range"),
    (["local", "-w", "lots"], "-w/--window 'lots' is not a size"),
    (["local", "-R", "--bidir"], "-R/--reverse and --bidir exclude each other"),
    (["local", "-4", "-6"], "-4 and -6 exclude each other"),
    (["client", "127.0.0.1", "--cport", "70000"], "--cport 70000 out of range"),
    (["client", "127.0.0.1", "-P", "8", "--bidir", "--cport", "65530"], "--cport 65530 out of range"),
    (["client", "127.0.0.1", "-6", "-t", "1"], "not found as IPv6"),
])
def test_bad_input_is_one_line_exit_2(args, fragment):
    line = _one_line_error(gb("net", *args), 2)
    assert fragment in line


@pytest.mark.parametrize("args, here", [(["-P", "4"], True), (["-P4", "-t", "2"], True), (["--pairs", "all"], False)])
def test_the_launcher_form_outside_a_launcher_says_what_it_is_and_what_to_run(args, here):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI_", "PMIX_", "SLURM_"))
           and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")}
    p = subprocess.run([sys.executable, "-m", "gpubench", "net", *args], capture_output=True, text=True, timeout=60,
                       env=env)
    line = _one_line_error(p, 2)
    shown = " ".join(args)
    assert "No such option" not in line and "runs between the ranks of a launcher" in line
    assert f"mpirun -n 4 --map-by node gpubench net {shown}" in line
    assert (f"gpubench net local {shown}" in line) is here


@pytest.mark.parametrize("args, line", [
    (["-P", "0"], "-P/--parallel 0 out of range (use 1 to 128 streams)"),
    (["-t", "0.01"], "-t/--time 0.01 out of range (use 0.1 to 3600 seconds)"),
    (["-T", "0"], "-T/--timeout 0 must be > 0 seconds"),
    (["--to", "-1"], "--to -1 out of range (use a rank, 0 to the number of ranks - 1)"),
])
def test_the_launcher_form_outside_a_launcher_names_a_bad_value_before_suggesting_it(args, line):
    """A form it would suggest to run must be one that runs: a bad value is named as net nodes
    names it, with or without the sub-command, launcher or not."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI_", "PMIX_", "SLURM_"))
           and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")}
    for form in (["net"], ["net", "nodes"]):
        p = subprocess.run([sys.executable, "-m", "gpubench", *form, *args], capture_output=True, text=True,
                           timeout=60, env=env)
        assert _one_line_error(p, 2) == f"gpubench: error: {line}", (form, p.stderr)


def test_an_unknown_option_of_net_is_still_unknown():
    line = _one_line_error(gb("net", "--no-such"), 2)
    assert "No such option" in line and "--no-such" in line  # click's wording varies by release


def test_client_with_no_server_is_one_line_exit_3():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    line = _one_line_error(gb("net", "client", "127.0.0.1", "--port", str(port), "-t", "1"), 3)
    assert f"cannot connect to 127.0.0.1 port {port}" in line


def test_local_reports_and_saves_consistent_figures(tmp_path):
    out = tmp_path / "net.json"
    p = gb("net", "local", "-P", "2", "-t", "0.6", "-O", "0.3", "-i", "0.3", "--json", str(out))
    assert p.returncode == 0, p.stderr
    for text in ("gpubench net, loopback", "Intervals, client -> server", "omitted (-O)", "Gbit/s",
                 "Per stream", "total", "GB/s"):
        assert text in p.stdout
    # the omitted first interval, starred; its end is the measured one (0.31 on a loaded host)
    assert re.search(r"│ 0\.00-0\.[34]\d\* ", p.stdout), p.stdout
    d = json.loads(out.read_text())
    assert d["command"] == "net" and d["spec"]["mode"] == "local" and d["spec"]["streams"] == 2
    recs = {r["params"]["stream"]: r for r in d["records"]}
    assert set(recs) == {0, 1, "total"}
    tot = recs["total"]["extra"]
    assert tot["interval_omit"] == [True, False, False]
    # measured, not nominal, seconds: the server wakes a little after each boundary (more on a loaded CI box)
    assert tot["counted_seconds"] == pytest.approx(tot["interval_end_s"][-1] - tot["interval_end_s"][0])
    assert tot["counted_seconds"] == pytest.approx(0.6, abs=0.3)
    counted = [b for b, o in zip(tot["interval_bytes"], tot["interval_omit"]) if not o]
    assert tot["counted_bytes"] == sum(counted) == recs[0]["extra"]["counted_bytes"] + recs[1]["extra"]["counted_bytes"]
    assert tot["counted_bytes"] > 0
    rates = [b / (e - s) for b, s, e, o in zip(tot["interval_bytes"], tot["interval_start_s"], tot["interval_end_s"],
                                               tot["interval_omit"]) if not o]
    assert min(rates) <= tot["bytes_per_s"] <= max(rates)  # never above what the intervals show
    assert tot["gbit_per_s"] == pytest.approx(tot["bytes_per_s"] * 8 / 1e9)
    assert tot["sent_bytes"] >= sum(tot["interval_bytes"])
    # the printed total is the saved one
    row = next(line for line in p.stdout.splitlines() if re.match(r"\W*total\s", line))
    assert f"{tot['gbit_per_s']:.2f}" in row


def _sum_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("[SUM]")]


def test_live_lines_reach_a_pipe_while_the_test_runs_and_a_sum_line_ends_it():
    p = subprocess.Popen([sys.executable, "-m", "gpubench", "net", "local", "-P", "2", "-t", "1.5", "-i", "0.3", "-O", "0.3"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        for line in p.stdout:  # a pipe: block-buffered unless each line is flushed
            seen.append(line)
            if line.startswith("[SUM]"):
                break
        running = p.poll() is None  # the first interval's line came before the 1.8 s test ended
        rest, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert running, "".join(seen) + err
    out = "".join(seen) + rest
    assert p.returncode == 0, err
    header = next(line for line in out.splitlines() if line.startswith("gpubench net: loopback"))
    assert "2 stream(s) client -> server" in header and "window: kernel autotuning" in header and "unpaced" in header
    live = [line for line in out.splitlines() if re.match(r"\[(  \d|SUM)\]\s+\d", line)]
    # per interval (6): stream 0, stream 1, [SUM]; the first interval omitted
    assert [line[:5] for line in live[:18]] == ["[  0]", "[  1]", "[SUM]"] * 6, live
    assert all("(omitted)" in line for line in live[:3]) and not any("(omitted)" in line for line in live[3:18])
    sums = _sum_lines(out)
    assert "sender (client, omitted s too)" in sums[-2] and "receiver (server)" in sums[-1]
    assert out.index("Intervals, client -> server") < out.index(sums[-2])  # the report, then the [SUM] lines
    # the receiver's [SUM] is the report's total
    total = next(line for line in out.splitlines() if re.match(r"\W*total\s", line))
    assert re.search(r"(\d+\.\d\d) Gbit/s", sums[-1]).group(1) in total


def test_many_streams_live_is_the_sum_line_and_the_tables_fit_100_columns(tmp_path):
    p = gb("net", "local", "-P", "8", "-t", "0.6", "-i", "0.3", "-O", "0.3", "-b", "2G", "-w", "1MiB")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert not any(line.startswith("[  0]") for line in lines)  # 8 streams: no per-stream live lines
    assert len([line for line in _sum_lines(p.stdout) if "Gbit/s" in line and "sender" not in line
                and "receiver" not in line]) == 3
    head = next(line for line in lines if line.startswith("gpubench net, loopback"))
    assert "paced at 2 Gbit/s per stream" in head and "window -w 1 MiB (kernel: SO_SNDBUF" in head
    table = [line for line in lines if line[:1] in "┏┃┡│└"]
    assert table and max(len(line) for line in table) <= 100, max(table, key=len)
    heads = next(line for line in table if "interval s" in line)
    assert all(f" {k} " in heads for k in range(8))  # a column per stream


def test_live_lines_follow_the_report_to_stderr_under_json_dash_and_quiet_prints_nothing(tmp_path):
    p = gb("net", "local", "-P", "2", "-t", "0.4", "-i", "0.2", "--json", "-")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["command"] == "net"  # stdout: the JSON alone
    assert "gpubench net: loopback" in p.stderr and len(_sum_lines(p.stderr)) == 2 + 2
    q = gb("net", "local", "-P", "2", "-t", "0.4", "-i", "0.2", "-q", "--json", str(tmp_path / "q.json"))
    assert q.returncode == 0 and q.stdout == "" and q.stderr == "", (q.stdout, q.stderr)


def test_bidir_live_lines_and_sums_name_each_direction():
    p = gb("net", "local", "-P", "1", "-t", "0.4", "-i", "0.2", "--bidir")
    assert p.returncode == 0, p.stderr
    sums = _sum_lines(p.stdout)
    assert [line[:10] for line in sums] == ["[SUM][c2s]", "[SUM][s2c]"] * 2 + ["[SUM][c2s]"] * 2 + ["[SUM][s2c]"] * 2
    assert "sender (client)" in sums[-4] and "receiver (server)" in sums[-3]
    assert "sender (server)" in sums[-2] and "receiver (client)" in sums[-1]


# -- a server process -------------------------------------------------------------------------


class ServerProc:
    def __init__(self, *extra):
        self.p = subprocess.Popen([sys.executable, "-m", "gpubench", "net", "server", "--port", "0", *extra],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = self.p.stdout.readline()
        m = re.search(r"listening on (\S+):(\d+)", first)
        assert m, first + self.p.stderr.read()
        self.addr, self.port = m.group(1), int(m.group(2))
        self.lines: list[str] = [first]
        self._t = threading.Thread(target=self._pump, daemon=True)
        self._t.start()

    def _pump(self):
        for line in self.p.stdout:
            self.lines.append(line)

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.p.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def threads(self) -> int:
        return len(os.listdir(f"/proc/{self.p.pid}/task"))

    def client(self, *args, timeout=60):
        return gb("net", "client", "127.0.0.1", "--port", str(self.port), *args, timeout=timeout)

    def stop(self, sig=signal.SIGTERM):
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            self.p.wait(10)
        finally:
            if self.p.poll() is None:
                self.p.kill()
                self.p.wait()
        self._t.join(2)
        return self.p.returncode, self.p.stderr.read()


@pytest.fixture
def server():
    s = ServerProc()
    yield s
    s.stop(signal.SIGKILL)


def _listening_addresses(port: int) -> list[str]:
    out = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                rows = [line.split() for line in f.readlines()[1:]]
        except OSError:
            continue
        out += [r[1].split(":")[0] for r in rows if r[3] == "0A" and int(r[1].split(":")[1], 16) == port]
    return out


def test_server_listens_on_loopback_only_by_default(server):
    assert server.addr == "127.0.0.1"
    assert "loopback only" in server.lines[0]
    assert _listening_addresses(server.port) == ["0100007F"]


@pytest.mark.parametrize("flags, dirs", [(["-R"], ["s2c"]), (["--bidir"], ["c2s", "s2c"]),
                                         (["--copy", "-w", "1MiB", "-b", "2G"], ["c2s"])])
def test_local_in_every_direction_saves_cpu_and_tcp_figures(tmp_path, flags, dirs):
    out = tmp_path / "net.json"
    p = gb("net", "local", "-P", "2", "-t", "0.6", "-i", "0.3", *flags, "--json", str(out))
    assert p.returncode == 0, p.stderr
    d = json.loads(out.read_text())
    totals = {r["params"]["direction"]: r["extra"] for r in d["records"] if r["params"]["stream"] == "total"}
    assert sorted(totals) == sorted(dirs)
    for direction, e in totals.items():
        assert e["counted_bytes"] > 0 and e["sender_cpu_s"] > 0 and e["receiver_cpu_s"] > 0
        assert e["cpu_s_per_gbit"] == pytest.approx((e["sender_cpu_s"] + e["receiver_cpu_s"]) / (8 * e["all_bytes"] / 1e9))
        assert e["retransmits"] is not None
        assert f"CPU ({'client -> server' if direction == 'c2s' else 'server -> client'}): sender" in p.stdout
    if "-b" in flags:  # paced: 2 streams x 2 Gbit/s at most, measured by the receiver
        assert totals["c2s"]["gbit_per_s"] < 4.4
    if "-w" in flags:
        assert d["timing"]["socket_buffers"]["sndbuf"] >= 2**20  # Linux stores twice what was set
    assert d["timing"]["data_path"][dirs[0]]["zero_copy"] is ("--copy" not in flags)


def test_server_serves_reverse_and_bidir_tests(server, tmp_path):
    for flags in (["-R"], ["--bidir"]):
        p = server.client("-P", "2", "-t", "0.4", "-i", "0.2", *flags, "--json", str(tmp_path / "r.json"))
        assert p.returncode == 0, p.stderr
        d = json.loads((tmp_path / "r.json").read_text())
        assert all(r["extra"]["counted_bytes"] > 0 for r in d["records"] if r["params"]["stream"] == "total")
    assert sum("test(s) done" in line or "sent" in line or "received" in line for line in server.lines) >= 2


def test_server_serves_a_client_and_stops_on_sigterm(server, tmp_path):
    p = server.client("-P", "2", "-t", "0.5", "--json", str(tmp_path / "c.json"))
    assert p.returncode == 0, p.stderr
    d = json.loads((tmp_path / "c.json").read_text())
    assert d["spec"]["mode"] == "client" and d["records"][-1]["extra"]["counted_bytes"] > 0
    t0 = time.monotonic()
    rc, err = server.stop(signal.SIGTERM)
    assert rc == 143 and time.monotonic() - t0 < 3
    assert "interrupted by SIGTERM" in err and "Traceback" not in err
    assert any("1 test(s) done" in line for line in server.lines)


def _wait_for_the_test(server, seen: int, client: subprocess.Popen) -> None:
    """Until the server logs the client's test (a loaded host may take seconds to start the client),
    then 0.5 s more: its streams are under way."""
    deadline = time.monotonic() + 30
    while len(server.lines) == seen and time.monotonic() < deadline and client.poll() is None:
        time.sleep(0.05)
    assert len(server.lines) > seen, "the server never logged the client's test"
    time.sleep(0.5)


def test_server_stops_on_ctrl_c_during_a_test(server):
    seen = len(server.lines)
    c = subprocess.Popen([sys.executable, "-m", "gpubench", "net", "client", "127.0.0.1", "--port", str(server.port),
                          "-t", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_the_test(server, seen, c)
        t0 = time.monotonic()
        rc, err = server.stop(signal.SIGINT)
        assert rc == 130 and time.monotonic() - t0 < 3
        assert "interrupted" in err and "Traceback" not in err
        out, cerr = c.communicate(timeout=15)
        assert c.returncode == 3 and "server stopping" in cerr and "Traceback" not in cerr
    finally:
        if c.poll() is None:
            c.kill()
            c.wait()


def test_a_killed_client_frees_the_server_for_the_next(server):
    seen = len(server.lines)
    c = subprocess.Popen([sys.executable, "-m", "gpubench", "net", "client", "127.0.0.1", "--port", str(server.port),
                          "-P", "2", "-t", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for_the_test(server, seen, c)
    c.kill()
    c.wait()
    t0 = time.monotonic()
    p = server.client("-t", "0.5")
    assert p.returncode == 0, p.stderr  # not "busy" for the 60 s the killed client asked for
    # well under those 60 s; the margin is for a new client's start on a loaded 2-core host (17 s seen)
    assert time.monotonic() - t0 < 40
    assert any("aborted" in line for line in server.lines)


def test_server_memory_and_threads_stay_bounded_under_abuse(server):
    server.client("-t", "0.5")  # warm: first test's imports and buffers
    rss0, threads0 = server.rss_bytes(), server.threads()

    def silent():
        s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        s.settimeout(10)
        try:
            s.recv(4096)  # waits for the server's timeout reply
        except OSError:
            pass
        s.close()

    def flood():
        s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        try:
            s.sendall(os.urandom(1 << 20) * 16)  # 16 MiB, no newline
        except OSError:
            pass
        s.close()

    def greedy(i):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        ask = {"gpubench_net": 1, "role": "control", "streams": 10_000 if i % 2 else 1,
               "seconds": 31_536_000 if i % 3 else 1, "omit": 0, "interval": 1, "buffer": 1 << 20}
        s.sendall(json.dumps(ask).encode() + b"\n")
        try:
            s.recv(4096)
        except OSError:
            pass
        s.close()

    jobs = ([threading.Thread(target=silent) for _ in range(60)]
            + [threading.Thread(target=flood) for _ in range(20)]
            + [threading.Thread(target=greedy, args=(i,)) for i in range(200)])
    peak_threads = 0
    for j in jobs:
        j.start()
    while any(j.is_alive() for j in jobs):
        peak_threads = max(peak_threads, server.threads())
        time.sleep(0.05)
    assert peak_threads <= threads0 + 64 + 1  # handshakes are bounded
    p = server.client("-P", "2", "-t", "0.5")
    assert p.returncode == 0, p.stderr  # still serving
    grown = server.rss_bytes() - rss0
    print(f"server RSS grew by {grown / 2**20:.1f} MiB; threads peaked at {peak_threads} (from {threads0})")
    assert grown < 32 * 2**20, f"server RSS grew by {grown / 2**20:.1f} MiB"
    deadline = time.monotonic() + 5
    while server.threads() > threads0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.threads() <= threads0


def test_local_interrupted_keeps_the_intervals_received(tmp_path):
    out = tmp_path / "p.json"
    p = subprocess.Popen([sys.executable, "-m", "gpubench", "net", "local", "-t", "20", "-i", "0.25", "--json", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    head = []
    for line in p.stdout:  # until the fourth live interval line: intervals were received
        head.append(line)
        if sum(h.startswith("[SUM]") for h in head) == 4:
            break
    p.send_signal(signal.SIGINT)
    # read on through the same file object (communicate() reads the raw pipe and would lose what the
    # line iterator had already buffered)
    stdout = "".join(head) + p.stdout.read()
    stderr = p.stderr.read()
    p.wait(15)
    assert p.returncode == 130, stderr
    assert "PARTIAL: interrupted by SIGINT" in stdout and "Traceback" not in stderr
    d = json.loads(out.read_text())
    assert d["partial"] is True and d["interrupted_by"] == "SIGINT"
    tot = d["records"][-1]["extra"]
    assert 1 <= len(tot["interval_bytes"]) < 80 and tot["counted_bytes"] == sum(tot["interval_bytes"])


def _workers_alive(tag: str) -> list[int]:
    """Worker processes of this tree's worker.py still running whose environment holds ``tag``
    (``TEST_TAG=<tag>``, inherited from the run that started them: not another test's workers)."""
    from gpubench.plugins.net.stream import WORKER

    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if WORKER.encode() not in f.read():
                        continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if f"{TEST_TAG}={tag}".encode() in f.read().split(b"\0"):
                        out.append(int(pid))
            except OSError:
                pass
    return out


TEST_TAG = "GPUBENCH_TEST_TAG"


def _listening_inodes() -> set[str]:
    out = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                out |= {r.split()[9] for r in f.readlines()[1:] if r.split()[3] == "0A"}
        except OSError:
            pass
    return out


def _wait_listening(pid: int, timeout: float = 20.0) -> bool:
    """Wait until process ``pid`` holds a listening TCP socket (net local's server is up: the
    client is about to connect its streams)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            return False  # ended
        mine = set()
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:  # closed meanwhile
                continue
            if link.startswith("socket:["):
                mine.add(link[8:-1])
        if mine & _listening_inodes():
            return True
        time.sleep(0.005)
    return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_local_128_streams_interrupted_while_setting_up_exits_130_or_143(tmp_path, sig, sampled):
    """`net local -P 128 -t 2 --json n.json` with SIGINT or SIGTERM while its 128 streams connect is
    never exit 3 "RuntimeError: cannot join thread before it is started" with no JSON. Signalled at
    three moments drawn anew each run: 0 to 0.1 s after the local server listens (connecting), 0.1
    to 0.6 s after it (starting 256 worker processes, the first intervals), and 0 to 0.2 s after
    gpubench says its signal guard is in place (GPUBENCH_STARTED_FD: the interpreter's own start-up
    before it cannot be guarded); each run must exit 130 / 143 with no traceback, keep a partial
    JSON or say it kept nothing, and leave no worker process behind."""
    from gpubench.cli import STARTED_FD

    code = 130 if sig == signal.SIGINT else 143
    moments = [(True, round(sampled.uniform(0.0, 0.1), 3)), (True, round(sampled.uniform(0.1, 0.6), 3)),
               (False, round(sampled.uniform(0.0, 0.2), 3))]
    for after_listen, delay in moments:
        out = tmp_path / f"n{after_listen}{delay}.json"
        tag = f"{os.getpid()}-{sig}-{after_listen}-{delay}"
        r, w = os.pipe()
        try:
            p = subprocess.Popen([sys.executable, "-m", "gpubench", "net", "local", "-P", "128", "-t", "2", "--json",
                                  str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, pass_fds=(w,),
                                 env={**os.environ, TEST_TAG: tag, STARTED_FD: str(w)})
        finally:
            os.close(w)
        with os.fdopen(r, "rb", buffering=0) as started:
            assert started.read(1) == b"\n", p.communicate(timeout=30)  # EOF only if it ended first
        if after_listen:
            assert _wait_listening(p.pid), p.communicate(timeout=30)
        time.sleep(delay)
        p.send_signal(sig)
        stdout, stderr = p.communicate(timeout=30)
        moment = f"{delay} s after {'the server listens' if after_listen else 'its signal guard'}"
        assert p.returncode == code, (moment, p.returncode, stderr[-400:])
        assert "Traceback" not in stderr and "cannot join" not in stderr, (moment, stderr[-400:])
        # the one rule (kit.finish): a file with what was measured, said on stderr, or none
        kept = "kept what was measured" in stderr
        assert out.exists() == kept and f"interrupted by {sig.name}" in stderr, (moment, stderr[-400:])
        if kept:
            d = json.loads(out.read_text())
            assert d["partial"] is True and d["interrupted_by"] == sig.name, moment
        deadline = time.monotonic() + 5
        while _workers_alive(tag) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _workers_alive(tag), f"worker processes left after a signal {moment}"


@pytest.mark.parametrize("window", ["4KiB", "8KiB"])
@pytest.mark.parametrize("direction", [[], ["-R"]])
def test_net_local_with_a_window_of_a_few_kib_measures(run_cli, tmp_path, window, direction):
    """`net local -w 4KiB` (c2s and -R) measures: no worker is killed and every interval moves more
    than 1 MiB (the server sets its buffer before the handshake: see test_net_server's window
    tests; iperf3 -w 4K moves ~2 Gbit/s on this loopback)."""
    out = tmp_path / "n.json"
    code, _out, err = run_cli("net", "local", "-w", window, "-t", "1", "-i", "0.5", *direction, "--json", str(out), "-q")
    assert code == 0, err
    d = json.loads(out.read_text())
    total = [r for r in d["records"] if r["params"]["stream"] == "total"][0]
    assert all(b > 2**20 for b in total["extra"]["interval_bytes"]), total["extra"]["interval_bytes"]


# -- --protocol ucx ------------------------------------------------------------------------------
# Real UCX over loopback (two processes: the client here, the server a process of its own), small
# messages and short runs. Without UCXX (a base install) these skip; the bad-input ones that need
# no UCX still run.

needs_ucx = pytest.mark.skipif(__import__("importlib.util").util.find_spec("ucxx") is None,
                               reason="UCXX is not installed (pip install 'gpubench-cuda[ucx-cu13]')")


def _no_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() < 1
    except Exception:
        return True


@pytest.mark.parametrize("args, fragment", [
    (["local", "--protocol", "ucx", "-m", "bogus"], "-m/--memory 'bogus' is not a memory type"),
    (["local", "--protocol", "ucx", "--bidir"], "--bidir applies to --protocol tcp only"),
    (["local", "--protocol", "ucx", "-w", "1MiB"], "-w/--window applies to --protocol tcp only"),
    (["client", "127.0.0.1", "--protocol", "ucx", "--cport", "6000"], "--cport applies to --protocol tcp only"),
    (["local", "--protocol", "ucx", "--in-flight", "0"], "--in-flight 0"),
    (["local", "--latency"], "--latency applies to --protocol ucx only"),
    (["local", "--protocol", "quic"], "quic"),
    (["local", "--wait", "sleep"], "--wait applies to --protocol ucx only"),
    (["server", "--protocol", "ucx", "-d", "-1"], "-d/--device -1"),
    (["nodes", "--protocol", "ucx", "-P", "4"], "-P/--parallel applies to --protocol tcp only"),
    (["nodes", "-m", "cuda"], "-m/--memory applies to --protocol ucx only"),
    (["nodes", "--protocol", "ucx", "--in-flight", "2000"], "--in-flight 2000"),
    (["nodes", "--protocol", "ucx", "--latency"], "No such option '--latency'"),
    # -d picks the GPU of cuda buffers: given with host memory only, it would be ignored
    (["local", "--protocol", "ucx", "-m", "host", "-d", "1"], "-d/--device 1 applies to -m cuda"),
    (["nodes", "--protocol", "ucx", "-d", "0"], "-d/--device 0 applies to -m cuda"),
])
def test_ucx_bad_input_is_one_line_exit_2(args, fragment):
    line = _one_line_error(gb("net", *args), 2)
    assert fragment in line


@pytest.mark.skipif(not _no_gpu(), reason="a GPU is visible: -m cuda would run")
def test_ucx_memory_cuda_without_a_gpu_is_exit_2_naming_what_to_do_before_anything_listens():
    line = _one_line_error(gb("net", "local", "--protocol", "ucx", "-m", "cuda,host", "-t", "1"), 2)
    assert "-m/--memory cuda needs a GPU" in line and "-m host" in line


def test_ucx_missing_is_exit_2_naming_what_to_install(tmp_path):
    fake = tmp_path / "ucxx"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('libucx.so.0: cannot open shared object file')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    for form in (["local", "-t", "1"], ["server", "--port", "0"]):
        p = subprocess.run([sys.executable, "-m", "gpubench", "net", *form, "--protocol", "ucx"], capture_output=True,
                           text=True, timeout=60, env=env)
        line = _one_line_error(p, 2)
        assert "needs UCXX" in line and "pip install 'gpubench-cuda[ucx-cu13]'" in line
        assert "listening" not in p.stdout


@needs_ucx
def test_ucx_local_measures_checks_the_data_and_names_the_transports(tmp_path):
    out = tmp_path / "u.json"
    p = gb("net", "local", "--protocol", "ucx", "-l", "256KiB", "-t", "0.6", "-O", "0.2", "-i", "0.2", "--json", str(out))
    assert p.returncode == 0, p.stderr
    assert "gpubench net --protocol ucx, loopback" in p.stdout and "client endpoint lanes:" in p.stdout
    assert "server endpoint lanes:" in p.stdout and "receiver's buffer matched the sent pattern" in p.stdout
    res = json.loads(out.read_text())
    [rec] = res["records"]
    assert rec["params"] == {"stream": "total", "streams": 1, "buffer_nbytes": 256 * 1024, "direction": "c2s",
                             "protocol": "ucx", "memory": "host", "api": "tag"}
    ex = rec["extra"]
    assert ex["gb_per_s"] > 0 and ex["data_checked"] is True and ex["in_flight"] == 32
    assert ex["interval_omit"][0] is True and len(rec["samples_s"]) == sum(not o for o in ex["interval_omit"])
    assert ex["counted_bytes"] % (256 * 1024) == 0
    t = ex["transports"]["client"]  # what carried 256 KiB messages: the sender's protocol, a transport UCX has here
    assert t["lanes"] and t["carried_by"]["via"], t
    assert any(name in t["carried_by"]["via"] for name in ("cma", "sysv", "posix", "tcp", "xpmem", "knem"))
    assert ex["transports"]["server"]["lanes"] and ex["transports"]["server"]["carried_by"] is None  # it receives
    assert "it receives: the sender's protocol carried these messages" in p.stdout
    assert res["spec"]["protocol"] == "ucx" and res["spec"]["memory"] == "host" and res["spec"]["port"] == 0


@needs_ucx
def test_ucx_latency_sweeps_8_bytes_to_l_one_record_per_size_with_the_stream_api(tmp_path):
    out = tmp_path / "lat.json"
    p = gb("net", "local", "--protocol", "ucx", "--latency", "--api", "stream", "-l", "20", "-t", "0.2",
           "--json", str(out))
    assert p.returncode == 0, p.stderr
    assert "One-way latency per message size" in p.stdout
    recs = json.loads(out.read_text())["records"]
    assert [r["nbytes"] for r in recs] == [8, 16, 20]
    assert all(r["metric"] == "time" and r["samples_s"] and r["params"]["api"] == "stream"
               and r["params"]["stream"] == "latency" and r["extra"]["round_trips"] >= 1 for r in recs)


class UcxServerProc(ServerProc):
    def __init__(self):
        super().__init__("--protocol", "ucx")


@needs_ucx
def test_ucx_server_serves_client_over_loopback_and_outlives_a_killed_client(tmp_path):
    s = UcxServerProc()
    try:
        assert s.addr == "127.0.0.1" and "loopback only" in s.lines[0]
        assert _listening_addresses(s.port) == ["0100007F"]
        c = subprocess.Popen([sys.executable, "-m", "gpubench", "net", "client", "127.0.0.1", "--port", str(s.port),
                              "--protocol", "ucx", "-t", "30", "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.time() + 30
        while not any("ucx tag bandwidth" in line for line in s.lines) and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        # every socket listening in the server's processes (its UCX worker's too) is on loopback
        listening = _listening_of([s.p.pid, *_children(s.p.pid)])
        assert listening and set(listening) <= {"0100007F"}, listening
        c.kill()
        c.communicate(timeout=10)
        p = s.client("--protocol", "ucx", "-l", "64KiB", "-t", "0.3", "-i", "0.3", "--wait", "sleep",
                     "--json", str(tmp_path / "c.json"), timeout=60)
        assert p.returncode == 0, p.stderr
        res = json.loads((tmp_path / "c.json").read_text())
        assert res["spec"]["mode"] == "client" and res["timing"]["wait"] == "sleep"
        assert res["records"][0]["extra"]["gb_per_s"] > 0 and res["records"][0]["extra"]["data_checked"]
        deadline = time.time() + 10
        while sum("data checked" in line for line in s.lines) < 1 and time.time() < deadline:
            time.sleep(0.1)
        assert sum("aborted" in line for line in s.lines) == 1, s.lines
        assert sum("data checked" in line for line in s.lines) == 1, s.lines
        if _no_gpu():  # cuda asked for the server's side, which has no GPU: refused by the server, exit 3
            p = s.client("--protocol", "ucx", "-m", "host,cuda", "-t", "0.3", timeout=60)
            line = _one_line_error(p, 3)
            assert "refused the test: on the server: -m/--memory cuda needs a GPU" in line
    finally:
        s.stop(signal.SIGKILL)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _listening_of(pids: list[int]) -> list[str]:
    """The local addresses (as /proc/net/tcp writes them) of the TCP sockets ``pids`` listen on."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes.add(link[8:-1])
        except OSError:
            continue
    out = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as f:
            for row in (line.split() for line in f.readlines()[1:]):
                if row[3] == "0A" and row[9] in inodes:
                    out.append(row[1].split(":")[0])
    return out


def _ucx_server_children(marker: str) -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read():
                    out.append(int(pid))
        except OSError:
            continue
    return out


@needs_ucx
@pytest.mark.parametrize("how", ["kill", "ctrl-c", "kill-latency"])
def test_ucx_local_a_server_killed_is_exit_3_and_ctrl_c_is_130_both_keep_the_intervals(tmp_path, how):
    """Below the rendezvous threshold (8 KiB) for --latency: above it the client reads the server's
    memory with cma and UCX ends it when the server dies (docs/net.md)."""
    marker = f"GPUBENCH_UCX_TEST_{os.getpid()}_{how}"
    out = tmp_path / "k.json"
    mode = ["--latency", "-l", "4KiB", "-t", "30"] if how == "kill-latency" else ["-l", "64KiB", "-t", "30", "-i", "0.25"]
    p = subprocess.Popen([sys.executable, "-m", "gpubench", "net", "local", "--protocol", "ucx", *mode,
                          "--json", str(out)], env={**os.environ, marker: "1"},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:  # the live lines: the test runs once the first interval's (size's) is out
        if line.startswith("[SUM]") or line.startswith("[LAT]"):
            break
    time.sleep(1.5 if how != "kill-latency" else 0.2)
    if how.startswith("kill"):
        [server] = [pid for pid in _ucx_server_children(marker) if pid != p.pid]
        os.kill(server, signal.SIGKILL)
    else:
        p.send_signal(signal.SIGINT)
    t = time.time()
    _, err = p.communicate(timeout=30)
    assert time.time() - t < 5  # no stall deadline to wait for: the server's end is seen at once
    assert p.returncode == (130 if how == "ctrl-c" else 3), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert out.exists(), err
    res = json.loads(out.read_text())
    assert res["partial"] is True and res["records"]
    if how == "kill-latency":
        assert [r["nbytes"] for r in res["records"]] == [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096][
            :len(res["records"])]
    else:
        assert res["records"][0]["extra"]["interval_bytes"]
    time.sleep(0.5)
    assert _ucx_server_children(marker) == []  # nothing left running

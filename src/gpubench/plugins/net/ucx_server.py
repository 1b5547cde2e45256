"""``gpubench net server --protocol ucx``: the far end of a UCX test (:mod:`gpubench.plugins.net.ucx`).

Control protocol (version 1), one JSON object per line on a TCP connection to the server's
``--bind``/``--port`` (127.0.0.1 unless asked otherwise); UCX data never crosses it:

1. client -> server: ``{"gpubench_net_ucx": 1, "mode": "bw" | "lat", "api": "tag" | "stream",
   "nbytes": L, "in_flight": W, "memory": "host" | "cuda" (the server's buffers), "wait": "poll" |
   "sleep", "address": hex, "pinned": bool}`` (``pinned``: page-locked host buffers; absent: false)
   (``address``: the client's UCP worker address).
2. server -> client: ``{"ok": true, "address": hex}`` (its worker address; both sides make their
   endpoint from the other's) or ``{"ok": false, "error": "<one line>"}`` and it closes.
3. one 8-byte UCX message each way (wire-up); then
   - bw: the client sends; the server keeps ``W`` receives posted until the client's
     ``{"stop": true, "sent": n}`` and then until it has received ``n``;
   - lat: per ``{"size": s, "iters": k}`` the server echoes ``k`` messages of ``s`` bytes; then
     ``{"stop": true, "sent": 0}``.
4. server -> client: ``{"end": true, "received": n, "check": null | "<why the data is wrong>",
   "cpu_s": x, "info": "<ucp_ep_print_info of its endpoint>", "host_pinned": bool}``, or ``{"ok": false, "error": ...}``
   when it aborts (the client stopped moving data for :data:`ucx.STALL_S`, closed, or lied).

One test at a time: a client that connects while a test runs waits in the listen backlog.
"""

from __future__ import annotations

import json
import os
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable

from gpubench.core.errors import MachineError, UsageError
from gpubench.plugins.net import ucx
from gpubench.plugins.net.protocol import (DEFAULT_BIND, LineReader, ProtocolError, close_socket, is_loopback,
                                           refuse, send_json)

UCX_PROTOCOL_VERSION = 1
MAX_REQUEST_BYTES = 64 * 1024  # a request line (a worker address with CUDA transports is a few KiB)
MAX_NBYTES = 1 << 30  # bytes per message
MAX_ITERS = 10**8
REQUEST_TIMEOUT_S = 5.0


def limit_to_loopback() -> None:
    """UCX's network transports on the loopback device only (``UCX_NET_DEVICES=lo``) unless the
    user set UCX_NET_DEVICES, where the control connection is on loopback."""
    os.environ.setdefault("UCX_NET_DEVICES", "lo")


class Control:
    """The control connection: JSON lines each way; :meth:`poll` never blocks."""

    def __init__(self, sock: socket.socket, limit: int, peer: str = "peer"):
        self.sock, self.reader, self.peer = sock, LineReader(sock, limit), peer

    def send(self, obj: Any) -> None:
        try:
            send_json(self.sock, obj)
        except OSError as e:
            raise MachineError(f"{self.peer}: control connection lost ({e.strerror or e})") from None

    def read(self, timeout: float) -> Any:
        try:
            return self.reader.readjson(timeout)
        except ProtocolError as e:
            raise MachineError(f"{self.peer}: {e}") from None

    def poll(self) -> Any:
        """A complete line when one has arrived, else None. Raises ucx.PeerGone: closed, or not JSON."""
        if b"\n" not in self.reader._buf:
            r, _, _ = select.select([self.sock], [], [], 0)
            if not r:
                return None
        try:
            return self.reader.readjson(0.5)
        except ProtocolError as e:
            raise ucx.PeerGone(f"{self.peer}: {e}") from None


def _cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def check_request(d: Any) -> dict:
    """A client's request, checked. Raises UsageError naming the first bad field."""
    if not isinstance(d, dict) or d.get("gpubench_net_ucx") != UCX_PROTOCOL_VERSION:
        got = d.get("gpubench_net_ucx") if isinstance(d, dict) else None
        raise UsageError(f"UCX control protocol version {got!r:.20}, this server speaks {UCX_PROTOCOL_VERSION}")

    def want(key, ok, what):
        v = d.get(key)
        if not ok(v):
            raise UsageError(f"bad {key}: {what}")
        return v

    def integer(lo, hi):
        return lambda v: type(v) is int and lo <= v <= hi

    return {
        "mode": want("mode", lambda v: v in ("bw", "lat"), "bw or lat"),
        "api": want("api", lambda v: v in ucx.APIS, " or ".join(ucx.APIS)),
        "nbytes": want("nbytes", integer(1, MAX_NBYTES), f"1 to {MAX_NBYTES} bytes"),
        "in_flight": want("in_flight", integer(1, ucx.MAX_IN_FLIGHT), f"1 to {ucx.MAX_IN_FLIGHT}"),
        "memory": want("memory", lambda v: v in ucx.MEMORY_TYPES, " or ".join(ucx.MEMORY_TYPES)),
        "wait": want("wait", lambda v: v in ucx.WAIT_MODES, " or ".join(ucx.WAIT_MODES)) if "wait" in d else "poll",
        # host buffers page-locked (ucx.host_buffers); absent from older clients: pageable
        "pinned": want("pinned", lambda v: type(v) is bool, "true or false") if "pinned" in d else False,
        "address": want("address", lambda v: isinstance(v, str) and 0 < len(v) <= MAX_REQUEST_BYTES
                        and all(c in "0123456789abcdef" for c in v), "hex digits"),
    }


class UcxServer:
    """Serves UCX tests one at a time, each in a process of its own, on ``bind`` (loopback: UCX held
    to ``lo`` too) and ``port`` (0: a free one); ``device`` the GPU of ``-m cuda`` buffers; ``log``
    one line per event."""

    def __init__(self, bind: str = DEFAULT_BIND, port: int = 0, *, device: int = 0,
                 log: Callable[[str], None] | None = None):
        self.bind, self.port, self.device = bind, port, device
        self.child: subprocess.Popen | None = None
        self.log = log or (lambda line: None)
        self.sock: socket.socket | None = None
        self.done = self.aborted = 0
        self._serving: threading.Thread | None = None
        self._stop_r = self._stop_w = -1

    def open(self) -> tuple[str, int]:
        """Bind and listen. Raises UsageError: not an address here, or the port is taken."""
        from gpubench.plugins.net.server import bind_listener

        ucx.require_ucx()  # before anything listens: a missing UCXX is exit 2
        s = bind_listener(self.bind, self.port, 8)
        if is_loopback(self.bind):
            limit_to_loopback()
        self.sock = s
        addr = s.getsockname()
        return addr[0], addr[1]

    def start(self, max_tests: int | None = None) -> tuple[str, int]:
        """Open and serve in a background thread until :meth:`close`; returns (address, port).
        Raises UsageError: as :meth:`open`."""
        address = self.open()
        self._stop_r, self._stop_w = os.pipe()  # the write end closed: serve_forever returns within its 1 s select
        self._serving = threading.Thread(target=self.serve_forever, args=(max_tests, self._stop_r), daemon=True,
                                         name="gpubench-net-ucx-server")
        self._serving.start()
        return address

    def serve_forever(self, max_tests: int | None = None, parent_fd: int | None = None) -> None:
        """Accept and serve until ``max_tests`` tests ended (None: forever), or ``parent_fd`` is at EOF."""
        assert self.sock is not None
        served = 0
        while max_tests is None or served < max_tests:
            watch = [self.sock] + ([parent_fd] if parent_fd is not None else [])
            r, _, _ = select.select(watch, [], [], 1.0)
            if parent_fd is not None and parent_fd in r and not os.read(parent_fd, 1):
                return
            if self.sock not in r:
                continue
            conn, peer = self.sock.accept()
            served += 1
            self.serve_in_child(conn, f"{peer[0]}:{peer[1]}")

    def serve_in_child(self, conn: socket.socket, who: str) -> None:
        """One test in a process of its own (the connection inherited; its log lines relayed):
        without peer error handling UCX ends a process whose peer dies mid-transfer."""
        import tempfile

        import gpubench

        arg = json.dumps({"fd": conn.fileno(), "who": who, "device": self.device})
        root = os.path.dirname(os.path.dirname(os.path.abspath(gpubench.__file__)))  # first on the path: this copy
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        with tempfile.TemporaryFile() as err:
            try:
                self.child = subprocess.Popen([sys.executable, "-m", "gpubench.plugins.net.ucx_server", arg],
                                              pass_fds=(conn.fileno(),), env=env, stdin=subprocess.DEVNULL,
                                              stdout=subprocess.PIPE, stderr=err)
            except OSError as e:
                self._give_up(conn, who, f"server cannot start the test's process: {e.strerror or e}",
                              f"refused: cannot start its process ({e.strerror or e})")
                return
            finally:
                close_socket(conn) if self.child is None else conn.close()
            child = self.child
            assert child.stdout is not None
            try:
                for raw in child.stdout:
                    self.log(raw.decode("utf-8", "replace").rstrip("\n"))
                code = child.wait()
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
                child.stdout.close()
                self.child = None
            if code == 0:
                self.done += 1
                return
            self.aborted += 1
            if code != 3:  # 3: the process said why itself
                err.seek(0)
                tail = [ln for ln in err.read()[-4000:].decode("utf-8", "replace").splitlines() if ln.strip()]
                why = f"signal {-code}" if code < 0 else f"exit {code}"
                self.log(f"test from {who}: aborted: its process died ({why})" + (f": {tail[0][:300]}" if tail else ""))

    def serve_one(self, conn: socket.socket, who: str) -> bool:
        """One test on an accepted control connection, here; never raises. Returns whether it ended."""
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ctl = Control(conn, MAX_REQUEST_BYTES, f"client {who}")
        try:
            try:
                req = check_request(ctl.read(REQUEST_TIMEOUT_S))
            except (UsageError, MachineError) as e:
                return self._give_up(conn, who, e.message, f"refused: {e.message}")
            self.log(f"test from {who}: ucx {req['api']} {'bandwidth' if req['mode'] == 'bw' else 'latency'}, "
                     f"{req['nbytes']} B messages, {req['in_flight']} in flight, into {req['memory']} memory")
            try:
                line = self._run(ctl, req)
            except UsageError as e:  # what the client asked for cannot be had here (-m ...,cuda without a GPU)
                return self._give_up(conn, who, f"on the server: {e.message}", f"refused: {e.message}")
            except (ucx.PeerGone, MachineError) as e:
                return self._give_up(conn, who, f"aborted: {e.message}", f"aborted: {e.message}")
            self.done += 1
            self.log(f"test from {who}: {line}")
            return True
        finally:
            close_socket(conn)

    def _give_up(self, conn: socket.socket, who: str, told: str, logged: str) -> bool:
        """Refuse ``conn`` with ``told``, log ``logged``, count an abort; returns False."""
        refuse(conn, told)
        self.log(f"test from {who}: {logged}")
        self.aborted += 1
        return False

    def _run(self, ctl: Control, req: dict) -> str:
        ucx.require_cuda(("host", req["memory"]), self.device)  # UsageError: no GPU here for the server's side
        side = ucx.Side(req["api"], req["memory"], self.device, req["wait"])
        try:
            side.connect(bytes.fromhex(req["address"]))
            ctl.send({"ok": True, "address": side.address().hex()})
            side.wireup(initiator=False, deadline_s=REQUEST_TIMEOUT_S, check=ctl.poll)
            n = req["nbytes"]
            want = ucx.pattern(n)
            buf = ucx.alloc(n, req["memory"], self.device, pinned=req["pinned"])
            cpu0 = _cpu()
            if req["mode"] == "bw":
                sent: list[int] = []
                polled = [0.0]

                def stop(got: int) -> bool:
                    now = time.perf_counter()
                    if not sent and now - polled[0] >= 0.02:  # a select() per 20 ms, not per message
                        polled[0] = now
                        msg = ctl.poll()
                        if msg is not None:
                            if not (isinstance(msg, dict) and msg.get("stop") is True and type(msg.get("sent")) is int
                                    and 0 <= msg["sent"] <= 2**62):
                                raise ucx.PeerGone("the client sent something other than a stop line")
                            sent.append(msg["sent"])
                    return bool(sent) and got >= sent[0]

                got = side.recv_until(buf, req["in_flight"], stop)
                check = None
                if got:
                    bad = ucx.first_mismatch(buf, ucx.alloc(n, req["memory"], self.device, want))
                    check = None if bad is None else f"byte {bad} of the last message differs from the pattern"
            else:
                got, check = self._echo(ctl, side, buf, n)
            info = side.info()
            ctl.send({"end": True, "received": got, "check": check, "cpu_s": _cpu() - cpu0, "info": info[:60000],
                      "host_pinned": req["pinned"] and ucx.is_pinned(buf)})
            return f"received {got} message(s) of {n} B" + (f"; DATA WRONG: {check}" if check else "; data checked")
        finally:
            side.close()

    def _echo(self, ctl: Control, side, buf, nbytes: int) -> tuple[int, str | None]:
        """Echo the client's batches until its stop line; returns (messages echoed, None)."""
        echoed = 0
        while True:
            msg = ctl.read(30.0)
            if isinstance(msg, dict) and msg.get("stop") is True:
                return echoed, None
            if not (isinstance(msg, dict) and type(msg.get("size")) is int and 1 <= msg["size"] <= nbytes
                    and type(msg.get("iters")) is int and 1 <= msg["iters"] <= MAX_ITERS):
                raise MachineError("the client sent a bad latency batch line")
            side.pong(buf[: msg["size"]], msg["iters"], check=ctl.poll)
            echoed += msg["iters"]

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread :meth:`start` began (``timeout`` s at most), kill a test's process still running."""
        if self._serving is not None:
            os.close(self._stop_w)
            self._serving.join(timeout)
        if self.child is not None and self.child.poll() is None:
            self.child.kill()
            self.child.wait()
        close_socket(self.sock)
        self.sock = None
        if self._serving is not None:
            os.close(self._stop_r)
            self._serving = None


def main(argv: list[str]) -> int:
    """A test's process: ``argv[0]`` = JSON {"fd", "who", "device"}, one test on the inherited control
    connection ``fd``, its log lines on stdout. Returns the exit status: 0 done, 3 refused or aborted."""
    arg = json.loads(argv[0])
    conn = socket.socket(fileno=int(arg["fd"]))
    srv = UcxServer(device=int(arg.get("device", 0)), log=lambda line: print(line, flush=True))
    return 0 if srv.serve_one(conn, str(arg.get("who", "?"))) else 3


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent's Ctrl-C ends it through the control connection
    sys.exit(main(sys.argv[1:]))

"""``gpubench net --protocol ucx``'s engine: one UCX worker and endpoint through UCXX's core API
(``ucxx._lib.libucxx``), driven by polling from the calling thread as ucx_perftest drives UCP
(libucx's src/tools/perf/lib/ucp_tests.cc: tag_bw, tag_lat); the method: docs/net.md "UCX".
Endpoints are made from worker addresses exchanged over the TCP control connection, without UCX's
peer error handling (ucx_perftest's default): a dead peer is found by :data:`STALL_S`. UCXX and
CuPy are imported inside functions only."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import time
from collections import deque
from typing import Any, Callable

from gpubench.core.errors import MachineError, UsageError

MEMORY_TYPES = ("host", "cuda")
APIS = ("tag", "stream")
MAX_IN_FLIGHT = 1024
WAIT_MODES = ("poll", "sleep")
SLEEP_MS = 5  # --wait sleep: the longest one wait on the worker's events (the loop's clock granularity)
STALL_S = 10.0  # no message completes for this long while the peer should be moving data: a fault
DATA_TAG = 0x1337A880  # ucx_perftest's tag (ucp_tests.cc); the data messages
WIREUP_TAG = 0x1337A881
INSTALL_HINT = "pip install 'gpubench-cuda[ucx-cu13]' (or [ucx-cu12]): UCXX and libucx"


def parse_memory(text: str) -> tuple[str, str]:
    """``-m/--memory``: one type for both sides, or ``SEND,RECV``: (send, receive), each "host" or "cuda".
    Raises UsageError: a type not in :data:`MEMORY_TYPES`, or more than two."""
    parts = [p.strip().lower() for p in str(text).split(",")]
    if len(parts) > 2 or any(p not in MEMORY_TYPES for p in parts):
        raise UsageError(f"-m/--memory {str(text)[:40]!r} is not a memory type",
                         "use host or cuda, or SEND,RECV such as cuda,host")
    return (parts[0], parts[-1])


def require_ucx() -> None:
    """Import UCXX (with its libucx) here, before anything listens.
    Raises UsageError: UCXX or libucx cannot be imported (names what to install)."""
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")  # UCXX sets UCX_MEMTYPE_CACHE, which UCX 1.21 does not know
    try:
        import ucxx._lib.libucxx  # noqa: F401
    except Exception as e:
        raise UsageError(f"--protocol ucx needs UCXX, which cannot be imported ({type(e).__name__}: "
                         f"{(str(e).splitlines() or [''])[0][:80]})", INSTALL_HINT) from None


def require_cuda(memory: tuple[str, str], device: int) -> None:
    """For ``-m cuda`` (either side): CuPy and a visible GPU ``device``. Raises UsageError: none."""
    if "cuda" not in memory:
        return
    from gpubench.core import gpu

    try:
        gpu.require_gpu()
    except UsageError as e:
        raise UsageError(f"-m/--memory cuda needs a GPU: {e.message}",
                         "use -m host on a machine without a GPU; for CUDA: pip install 'gpubench-cuda[cuda13]'") from None
    gpu.resolve_devices((device,))


def pattern(nbytes: int):
    """The payload: a numpy uint8 array of ``nbytes``, byte i = 1 + (i * 7) % 251 (never 0)."""
    import numpy as np

    return (1 + np.arange(nbytes, dtype=np.uint64) * 7 % 251).astype(np.uint8)


def first_mismatch(got, want) -> int | None:
    """The first byte index where two buffers (numpy or CuPy, same length) differ, or None."""
    import importlib

    xp = importlib.import_module("cupy" if type(got).__module__.startswith("cupy") else "numpy")
    bad = xp.nonzero(got != want)[0]
    return None if bad.size == 0 else int(bad[0])


def alloc(nbytes: int, memory: str, device: int = 0, fill=None, pinned: bool = False):
    """A uint8 buffer of ``nbytes`` in ``memory`` ("host": numpy; "cuda": CuPy on ``device``),
    zeroed, or a copy of ``fill``. With ``pinned``, host memory is page-locked (cudaHostAlloc)
    where CuPy sees a GPU, else pageable (:func:`is_pinned`)."""
    import numpy as np

    if memory == "cuda":
        import cupy

        with cupy.cuda.Device(device):
            buf = cupy.zeros(nbytes, dtype=cupy.uint8) if fill is None else cupy.asarray(fill)
            cupy.cuda.runtime.deviceSynchronize()
        return buf
    if pinned:
        try:
            import cupy

            with cupy.cuda.Device(device):
                out = np.frombuffer(cupy.cuda.alloc_pinned_memory(nbytes), np.uint8, nbytes)  # CuPy's own recipe
        except Exception:  # noqa: BLE001 - no CuPy, no GPU, no driver: pageable memory, said by is_pinned
            pass
        else:
            out[...] = 0 if fill is None else fill
            return out
    return np.zeros(nbytes, dtype=np.uint8) if fill is None else np.array(fill, copy=True)


def is_pinned(buf) -> bool:
    """Whether a host buffer (numpy) is page-locked (cudaPointerGetAttributes); False for GPU memory."""
    if type(buf).__module__.startswith("cupy"):
        return False
    try:
        import cupy

        return int(cupy.cuda.runtime.pointerGetAttributes(buf.ctypes.data).type) == 1  # cudaMemoryTypeHost
    except Exception:  # noqa: BLE001 - no CuPy, no driver, memory CUDA does not know: not page-locked
        return False


def host_buffers(memory: tuple[str, str]) -> bool:
    """Whether the host side of a test is page-locked: when the other side is GPU memory, as
    ucx_perftest's buffers are registered with UCX (ucp_mem_map)."""
    return "cuda" in memory


_LANE = re.compile(r"lane\[(\d+)\]:\s+\d+:([\w-]+)/([\w:-]+(?:\.[A-Za-z_][\w-]*)*)(?:\.\d+)?\s.*?->\s*\S+\s*(.*)$")
# a table's head: "from host memory", or with the buffer's device known "from cuda/GPU0"
# (ucp_proto_select_param_str, libucp's src/ucp/proto/proto_select.c)
_TABLE_HEAD = re.compile(r"\|\s*\S.*\|\s*(tagged message by ucp_tag_send\*|stream message[^|(]*?)(\([^)|]*\))?"
                         r"\s*from ([a-z][\w-]*)(?:/([^\s|]+)| memory)\s*\|")
_ROW = re.compile(r"^#?\s*\|\s*(\d+[KMGT]?)(?:\.\.(\d+[KMGT]?|inf))?\s*\|\s*(.*?)\s*\|\s*(\S.*?)\s*\|\s*$")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _size(text: str) -> float:
    if text == "inf":
        return float("inf")
    m = re.fullmatch(r"(\d+)([KMGT]?)", text)
    return int(m.group(1)) * _UNITS[m.group(2)] if m else float("nan")


def parse_endpoint_info(text: str, api: str = "tag") -> dict:
    """What ``ucp_ep_print_info`` printed, as data: {"lanes": [{"lane": int, "transport": str,
    "device": str, "roles": str}], "protocols": [{"memory": str, "device": str (where named, e.g.
    "GPU0"), "first": int, "last": int | None (inf), "protocol": str, "via": str}]}, from the table of
    ``api``'s plain sends per memory type (the first variant where there is none), a row per
    message-size range; ``"remote_decides": True`` where UCX marks the row "(?)" (the receiver's
    reply may change it)."""
    lanes: list[dict] = []
    tables: dict[tuple[str, str], list[dict]] = {}  # (memory, variant) -> rows, in the order printed
    devices: dict[str, str] = {}  # memory -> the device its table names (GPU0), where one does
    rows: list[dict] | None = None
    for line in text.splitlines():
        m = _LANE.search(line)
        if m:
            roles = re.sub(r"\bseg\s+\d+\s*", "", m.group(4)).split()
            lanes.append({"lane": int(m.group(1)), "transport": m.group(2)[:40], "device": m.group(3)[:40],
                          "roles": " ".join(roles)[:120]})
            continue
        h = _TABLE_HEAD.search(line)
        if h:
            kind = "tag" if h.group(1).startswith("tagged") else "stream"
            variant = (h.group(2) or "").strip()
            rows = tables.setdefault((h.group(3), variant), []) if kind == api else None
            if h.group(4) and h.group(3) not in devices:
                devices[h.group(3)] = h.group(4)[:40]
            continue
        r = _ROW.match(line.strip())
        if rows is not None and r:
            last = _size(r.group(2) or r.group(1))
            row = {"first": int(_size(r.group(1))), "last": None if last == float("inf") else int(last),
                   "protocol": r.group(3).replace("(?) ", "")[:120], "via": r.group(4)[:120]}
            if r.group(3).startswith("(?)"):  # UCX's mark: the peer's reply may change the choice
                row["remote_decides"] = True
            rows.append(row)
    protocols = []
    for memory in dict.fromkeys(mem for mem, _ in tables):
        variants = [v for mem, v in tables if mem == memory]
        chosen = "" if "" in variants else variants[0]
        where = {"device": devices[memory]} if memory in devices else {}
        protocols += [{"memory": memory, **where, **row} for row in tables[(memory, chosen)]]
    return {"lanes": lanes[:64], "protocols": protocols[:256]}


def carried_by(info: dict, nbytes: int, memory: str = "host") -> dict | None:
    """The protocol row of :func:`parse_endpoint_info` that ``nbytes`` messages from ``memory`` use."""
    for row in info.get("protocols", []):
        if row["memory"] == memory and row["first"] <= nbytes and (row["last"] is None or nbytes <= row["last"]):
            return row
    return None


def endpoint_info(ep_handle: int) -> str:
    """``ucp_ep_print_info`` of a UCP endpoint (UCXX's ``UCXEndpoint.handle``) as text; "" without libucp."""
    try:
        ucp = ctypes.CDLL("libucp.so.0")  # already loaded by UCXX: the same library
        libc = ctypes.CDLL(None)
    except OSError:
        return ""
    fn, fmemopen = getattr(ucp, "ucp_ep_print_info", None), getattr(libc, "fmemopen", None)
    if fn is None or fmemopen is None:
        return ""
    fmemopen.restype = ctypes.c_void_p
    fmemopen.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    buf = ctypes.create_string_buffer(1 << 18)
    fp = fmemopen(buf, len(buf) - 1, b"w")
    if not fp:
        return ""
    try:
        fn(ctypes.c_void_p(ep_handle), ctypes.c_void_p(fp))
    finally:
        libc.fclose(ctypes.c_void_p(fp))
    return buf.value.decode("utf-8", "replace")


class PeerGone(MachineError):
    """The peer closed the control connection, sent an abort, or stopped moving data."""


class Side:
    """One end: a UCP context (tag and stream features), a worker progressed from this thread, and
    after :meth:`connect` one endpoint to the peer. ``wait``: "poll" (spin on progress,
    ucx_perftest's default) or "sleep" (wait on the worker's events, its ``-E sleep``).
    Raises UsageError: UCXX not importable (:func:`require_ucx`); MachineError: UCX cannot make a context or worker."""

    def __init__(self, api: str = "tag", memory: str = "host", device: int = 0, wait: str = "poll"):
        require_ucx()
        import ucxx._lib.libucxx as ucx_api
        from ucxx._lib.arr import Array

        self._u, self._Array = ucx_api, Array
        self.api, self.memory, self.device = api, memory, device
        if memory == "cuda":
            import cupy

            cupy.cuda.Device(device).use()  # UCX's cuda transports take the current context
        features = (ucx_api.Feature.TAG, ucx_api.Feature.STREAM) + ((ucx_api.Feature.WAKEUP,) if wait == "sleep" else ())
        try:
            self.ctx = ucx_api.UCXContext(feature_flags=features)
            self.worker = ucx_api.UCXWorker(self.ctx)
            if wait == "sleep":
                self.worker.init_blocking_progress_mode()
        except Exception as e:
            raise MachineError(f"UCX: cannot start a worker: {e}") from None
        event = self.worker.progress_worker_event
        self.progress: Callable[[], Any] = self.worker.progress if wait == "poll" else (lambda: event(SLEEP_MS))
        self.ep: Any = None

    def address(self) -> bytes:
        """This worker's UCP address (what the peer's endpoint is made from)."""
        return bytes(self.worker.address.tobytes())

    def connect(self, peer_address: bytes) -> None:
        """Make the endpoint to the peer's worker address (no peer error handling: the module)."""
        u = self._u
        try:
            self.ep = u.UCXEndpoint.create_from_worker_address(
                self.worker, u.UCXAddress.create_from_buffer(peer_address), endpoint_error_handling=False)
        except Exception as e:
            raise MachineError(f"UCX: cannot reach the peer's worker address: {e}") from None

    def info(self) -> str:
        return endpoint_info(self.ep.handle) if self.ep is not None else ""

    def array(self, buf) -> Any:
        return self._Array(buf)

    def _poster(self, kind: str, arr, tag: int) -> Callable[[], Any]:
        """A no-argument function that posts one send or receive of ``arr`` with the test's API."""
        if self.api == "stream":
            fn = self.ep.stream_send if kind == "send" else self.ep.stream_recv
            return lambda: fn(arr)
        fn, t = (self.ep.tag_send if kind == "send" else self.ep.tag_recv), self._u.UCXXTag(tag)
        return lambda: fn(arr, t)

    def wait(self, reqs: list, deadline_s: float, check: Callable[[], None] | None = None) -> None:
        """Progress until every request completes (each checked), ``check`` called every 50 ms.
        Raises PeerGone: not done within ``deadline_s`` seconds, or as ``check``; MachineError: one failed."""
        end = time.perf_counter() + deadline_s
        next_check = 0.0
        progress = self.progress
        while not all(r.completed for r in reqs):
            progress()
            now = time.perf_counter()
            if now >= next_check:
                next_check = now + 0.05
                if check is not None:
                    check()
                if now > end:
                    raise PeerGone(f"UCX: {len(reqs)} message(s) did not complete within {deadline_s:g} s")
        for r in reqs:
            _checked(r)

    def wireup(self, initiator: bool, deadline_s: float, check=None) -> None:
        """One 8-byte message each way, so every lane is connected before the clock starts."""
        import numpy as np

        out, back = self.array(np.ones(8, dtype=np.uint8)), self.array(np.zeros(8, dtype=np.uint8))
        reqs = [self._poster("send", out, WIREUP_TAG)(), self._poster("recv", back, WIREUP_TAG)()]
        self.wait(reqs if initiator else reqs[::-1], deadline_s, check)

    def start_sending(self, buf, in_flight: int) -> None:
        """Post ``in_flight`` sends of ``buf`` (the window :meth:`send_for` keeps full)."""
        self._post = self._poster("send", self.array(buf), DATA_TAG)
        self._window: deque = deque(self._post() for _ in range(in_flight))
        self._last_done = time.perf_counter()  # the last completion, across send_for calls (the stall clock)

    def _pump(self, window: deque, post: Callable[[], Any], stop: Callable[[int, float], bool],
              check: Callable[[], None] | None, stalled: str) -> int:
        """Progress, reposting each completed request of ``window`` (oldest first), until ``stop(completed,
        now)`` (asked at each completion batch and every 16 progress calls); returns the requests completed.
        Raises PeerGone: none completed for :data:`STALL_S` (``stalled``, its {} the seconds), or as
        ``check`` (every 50 ms); MachineError: one failed."""
        progress, clock = self.progress, time.perf_counter
        next_check = clock() + 0.05
        done = spins = 0
        while True:
            progress()
            n = 0
            while window[0].completed:
                _checked(window.popleft())
                n += 1
                window.append(post())
            spins += 1
            if n or spins & 15 == 0:
                now = clock()
                if n:
                    done += n
                    self._last_done = now
                if stop(done, now):
                    return done
                if now >= next_check:
                    next_check = now + 0.05
                    if check is not None:
                        check()
                    if now - self._last_done > STALL_S:
                        raise PeerGone("UCX: " + stalled.format(STALL_S))

    def send_for(self, until: float, check: Callable[[], None]) -> int:
        """Keep the window full until ``time.perf_counter() >= until``; returns the sends completed.
        Raises PeerGone: nothing completed for :data:`STALL_S`, or as ``check``; MachineError: a send failed."""
        return self._pump(self._window, self._post, lambda done, now: now >= until, check,
                          "no send completed for {:g} s (the receiver stopped?)")

    def finish_sending(self, check=None) -> int:
        """Wait for the window's last sends (:data:`STALL_S` after the last completion); returns how many."""
        left = list(self._window)
        self._window.clear()
        self.wait(left, max(0.5, STALL_S - (time.perf_counter() - self._last_done)), check)
        return len(left)

    def recv_until(self, buf, in_flight: int, stop: Callable[[int], bool]) -> int:
        """Keep ``in_flight`` receives into ``buf`` posted until ``stop(received)``; returns the messages received.
        Raises PeerGone: as ``stop`` raises, or nothing arrived for :data:`STALL_S` while ``stop`` said go on."""
        post = self._poster("recv", self.array(buf), DATA_TAG)
        self._leftover: deque = deque(post() for _ in range(in_flight))  # at the end: receives never matched
        self._last_done = time.perf_counter()
        return self._pump(self._leftover, post, lambda got, now: stop(got), None,
                          "no message arrived for {:g} s (the sender stopped?)")

    def _trips(self, out, back, iters: int, echo: bool, check: Callable[[], None] | None) -> float:
        """``iters`` round trips: send ``out`` and receive into ``back`` (``echo``: receive, then send it
        back). Returns the seconds of round trips 2..iters (the first waits for the peer to read the
        batch's line). Raises PeerGone: a message not arrived within :data:`STALL_S`, or as ``check`` (every 50 ms)."""
        send, recv = self._poster("send", self.array(out), DATA_TAG), self._poster("recv", self.array(back), DATA_TAG)
        progress, clock = self.progress, time.perf_counter
        t0 = 0.0
        for i in range(iters):
            if i == 1:
                t0 = clock()
            r = recv()
            s = None if echo else send()
            spins = 0
            while not r.completed:
                progress()
                spins += 1
                if spins & 4095 == 0:  # inside a long wait: the control connection every ~50 ms, the stall deadline
                    now = clock()
                    if spins == 4096:
                        wait_from, next_check = now, now + 0.05
                    if now >= next_check:
                        next_check = now + 0.05
                        if check is not None:
                            check()
                        if now - wait_from > STALL_S:
                            raise PeerGone(f"UCX: round trip {i} of {iters} not back within {STALL_S:g} s "
                                           "(the peer stopped?)")
            _checked(r)
            s = send() if s is None else s
            while not s.completed:
                progress()
            _checked(s)
        return clock() - t0

    def ping(self, out, back, iters: int, check: Callable[[], None] | None = None) -> float:
        """``iters`` (>= 2) round trips: send ``out``, receive into ``back`` (same size); as :meth:`_trips`."""
        return self._trips(out, back, iters, False, check)

    def pong(self, buf, iters: int, check: Callable[[], None] | None = None) -> None:
        """``iters`` times: receive into ``buf`` and send it back; as :meth:`_trips`."""
        self._trips(buf, buf, iters, True, check)

    def close(self) -> None:
        """Close the endpoint; UCXX frees the endpoint and worker with their objects."""
        with contextlib.suppress(Exception):
            if self.ep is not None:
                self.ep.close_blocking(period=10**8, max_attempts=1)  # at most ~0.1 s
        self.ep = None


def _checked(req) -> None:
    try:
        req.check_error()
    except Exception as e:
        raise MachineError(f"UCX: a transfer failed: {e}") from None

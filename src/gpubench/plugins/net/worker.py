"""One data-moving process of ``gpubench net``: sends on, or receives from, a few TCP streams.
Run by :class:`gpubench.plugins.net.stream.StreamSet` as ``python -I -S worker.py ARGS`` with the
sockets inherited; the standard library only (docs/net.md "Data path"). ARGS, one JSON object:

- ``role`` "send" or "recv"; ``copy`` false: zero copy (``os.sendfile`` from ``payload``, a file
  descriptor holding ``buffer`` random bytes, and ``recv_into(buf, n, MSG_TRUNC)``, which on TCP skips
  the copy to user memory: Linux net/ipv4/tcp.c ``tcp_recvmsg_locked``), true: ``send`` and ``recv_into``.
- ``buffer`` bytes per write (-l); ``rate`` target bytes/s per stream (0: unpaced), due times counted
  from the go byte (no drift).
- ``fds`` the sockets, ``slots`` each one's index in the shared counters of ``nslots``; ``worker`` its index.
- ``shm`` a memory file: per slot an unsigned 64-bit byte count (``counts[slot]``) and a signed 64-bit
  state (``state[nslots + slot]``: 0 running, -1 closed by the peer, else an errno); per worker a double
  of its CPU seconds (user + system from the go byte, ``cpu[2 * nslots + worker]``) and then a 64-bit
  "ended" flag, written when it ends.
- ``ready`` a pipe's write end (one byte once it can move data); ``go`` a pipe's read end (one byte
  to start, EOF: stop); ``stop`` a pipe's read end whose EOF (the parent closed it, or died) stops it.
"""

import errno
import heapq
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import time


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _stopped(stop_fd: int) -> bool:
    return bool(select.select([stop_fd], [], [], 0)[0])


def _blocking_one(role, copy, s, fd, slot, payload, nbytes, buf, rbytes, flags, counts, state, stop_fd) -> None:
    """One unpaced stream: blocking calls, the stop pipe looked at every 16 calls or after a
    0.2 s SO_SNDTIMEO / SO_RCVTIMEO; an EPIPE after the stop (StreamSet.stop shut the socket) is the stop."""
    s.setblocking(True)
    tv = struct.pack("ll", 0, 200_000)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO if role == "send" else socket.SO_RCVTIMEO, tv)
    sendfile = os.sendfile
    k = 0
    try:
        if role == "send":
            while True:
                try:
                    n = s.send(buf) if copy else sendfile(fd, payload, 0, nbytes)
                except (BlockingIOError, InterruptedError):
                    n = 0
                counts[slot] += n
                k += 1
                if (n == 0 or k & 15 == 0) and _stopped(stop_fd):
                    return
        else:
            while True:
                try:
                    n = s.recv_into(buf, rbytes, flags)
                except (BlockingIOError, InterruptedError):
                    if _stopped(stop_fd):
                        return
                    continue
                if n == 0:
                    state[slot] = -1
                    return
                counts[slot] += n
                k += 1
                if k & 15 == 0 and _stopped(stop_fd):
                    return
    except OSError as e:
        if role == "send" and e.errno == errno.EPIPE and _stopped(stop_fd):
            return  # the parent shut the write side to end a long call after it asked to stop
        state[slot] = e.errno or errno.EIO


def main(arg: dict) -> None:
    # Ctrl-C in a terminal reaches the whole process group; the parent stops workers via the pipe
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import mmap

    role, copy, nbytes, rate = arg["role"], bool(arg["copy"]), int(arg["buffer"]), float(arg["rate"])
    fds, slots, nslots, worker = arg["fds"], arg["slots"], int(arg["nslots"]), int(arg["worker"])
    shm = mmap.mmap(arg["shm"], 0)
    counts = memoryview(shm).cast("B")[: 8 * nslots].cast("Q")
    state = memoryview(shm).cast("B")[8 * nslots: 16 * nslots].cast("q")
    cpu_at = 16 * nslots + 16 * worker
    stop_fd = arg["stop"]
    socks = {}
    poller = select.poll()
    poller.register(stop_fd, select.POLLIN)
    want = select.POLLOUT if role == "send" else select.POLLIN
    for fd, slot in zip(fds, slots):
        s = socket.socket(fileno=fd)
        s.setblocking(False)
        socks[fd] = (s, slot)
        poller.register(fd, want)
    payload = arg["payload"]
    if role == "send" and copy:
        buf = memoryview(os.pread(payload, nbytes, 0))
    else:
        # receive: MSG_TRUNC writes nothing into the buffer; a copy receives into 256 KiB (or -l)
        size = (max(nbytes, 1 << 18) if copy else 1 << 20) if role == "recv" else 1
        buf = memoryview(bytearray(size))
    os.write(arg["ready"], b"r")
    os.close(arg["ready"])
    if not os.read(arg["go"], 1):
        return
    cpu0 = _cpu()
    t0 = time.monotonic()
    waiting: list[tuple[float, int]] = []  # (due monotonic time, fd) of paced streams ahead of their schedule
    sendfile, MSG_TRUNC = os.sendfile, socket.MSG_TRUNC
    rbytes = len(buf)
    flags = 0 if copy else MSG_TRUNC

    ended = set()

    def finish(fd: int, code: int) -> None:
        state[socks[fd][1]] = code
        poller.unregister(fd)
        ended.add(fd)

    running = True
    if len(socks) == 1 and rate <= 0:
        (fd, (s, slot)), = socks.items()
        _blocking_one(role, copy, s, fd, slot, payload, nbytes, buf, rbytes, flags, counts, state, stop_fd)
        running = False
    while running and len(ended) < len(socks):
        timeout = 500.0
        if waiting:
            now = time.monotonic()
            while waiting and waiting[0][0] <= now:
                _, fd = heapq.heappop(waiting)
                if fd not in ended:
                    poller.modify(fd, want)
            if waiting:
                timeout = min(timeout, (waiting[0][0] - now) * 1000.0)
        for fd, ev in poller.poll(timeout):
            if fd == stop_fd:
                running = False
                break
            if fd in ended:
                continue
            s, slot = socks[fd]
            try:
                if role == "send":
                    while True:
                        n = s.send(buf) if copy else sendfile(fd, payload, 0, nbytes)
                        counts[slot] += n
                        if rate > 0:
                            due = t0 + counts[slot] / rate
                            if due > time.monotonic():
                                poller.modify(fd, 0)
                                heapq.heappush(waiting, (due, fd))
                                break
                else:
                    while True:
                        n = s.recv_into(buf, rbytes, flags)
                        if n == 0:
                            finish(fd, -1)
                            break
                        counts[slot] += n
            except (BlockingIOError, InterruptedError):
                pass
            except OSError as e:
                finish(fd, e.errno or errno.EIO)
    struct.pack_into("d", shm, cpu_at, _cpu() - cpu0)
    struct.pack_into("q", shm, cpu_at + 8, 1)
    shm.flush()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))

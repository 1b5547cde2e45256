"""`gpubench net nodes` under real launchers (mpiexec from the MPICH wheel, torchrun-style
environments started by hand) on loopback: a rank stopped (SIGSTOP) mid-round is named within one
round plus max(-T, the round's length), and it is the stopped receiver that is named, never its
healthy sender; a rank 0 stopped while it only receives fails the job, named by the survivor; two
groups on one MASTER_PORT never mix; another program on the port, a stopped net worker, one rank,
two schedules and a bad --rendezvous each end cleanly with the reason.

Every test ends every process it started in a finally. Outside CI these skip, with the reason,
where mpiexec, mpi4py or psutil is missing; under CI=true a missing mpiexec or mpi4py fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

psutil = pytest.importorskip("psutil")

from rank_procs import (GPUBENCH, HOST, Lines, _alive, _cleanup, _env, _family, _free_port, _gpubench,  # noqa: E402
                        _mpi_ranks, _start, _torchrun_env, _wait_all, _wait_gone, _wait_test_running, mpiexec)


def test_net_nodes_with_one_rank_is_refused():
    """`mpiexec -n 1 gpubench net nodes` is refused (it needs 2 or more ranks), not two empty tables
    and exit 0."""
    p = subprocess.run([mpiexec(), "-n", "1", *GPUBENCH, "net", "nodes", "-t", "1", "-O", "0"], env=_env(),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "needs 2 or more ranks" in p.stderr, p.stderr

# Ring of 3: round 1 is 0 -> 1 alone. Rank 1 (the receiver) has nothing to send, so it is at the
# round's end barrier at once; it is stopped while rank 0's test to it runs. Rank 0's net client
# then waits net's own stall allowance (an interval + 10 s past the due reply) before it leaves
# the test; the round deadline covers that allowance (net_fleet.NetFleetSpec.round_work), so the
# rank named is rank 1, the stopped receiver, never rank 0, its healthy sender, under mpiexec too.
STALL_ARGS = ["net", "nodes", "-T", "6", "-t", "2", "-i", "0.5", "-P", "1", "-b", "2G"]

STALL_BOUND_S = 60.0

def _check_named(text: str) -> None:
    assert re.search(rf"rank 1 on {re.escape(HOST)} did not answer", text), text[-3000:]
    assert not re.search(r"rank 0 on \S+ did not answer", text), text[-3000:]
    assert "Traceback" not in text, text[-3000:]

def test_mpiexec_net_nodes_names_the_stopped_receiver_not_its_sender():
    top = _start([mpiexec(), "-n", "3", *GPUBENCH, *STALL_ARGS], _env())
    out = Lines(top)
    victim = None
    try:
        ranks = _mpi_ranks(top.pid)
        _wait_test_running(ranks[0])
        victim = ranks[1]
        psutil.Process(victim).suspend()
        t_stop = time.monotonic()
        family = _family([top.pid, *ranks.values()])
        (t_end,) = _wait_all([top], STALL_BOUND_S + 30)
        text = out.text() if t_end is not None else "".join(line for _, line in out.lines)
        assert t_end is not None and t_end - t_stop < STALL_BOUND_S, text[-3000:]
        assert top.returncode != 0
        _check_named(text)
        assert _wait_gone(family, 15) == [], [psutil.Process(p).cmdline() for p in _alive(family)]
    finally:
        _cleanup([top], victim)

def test_torchrun_style_net_nodes_names_the_stopped_receiver_not_its_sender():
    port = _free_port()
    procs = [_start([*GPUBENCH, *STALL_ARGS], _env(RANK=str(r), WORLD_SIZE="3", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                                                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
             for r in range(3)]
    outs = [Lines(p) for p in procs]
    try:
        _wait_test_running(procs[0].pid)
        psutil.Process(procs[1].pid).suspend()
        t_stop = time.monotonic()
        family = _family([procs[0].pid, procs[2].pid])
        ended = _wait_all([procs[0], procs[2]], STALL_BOUND_S + 30)
        texts = [o.text() if p.poll() is not None else "".join(line for _, line in o.lines)
                 for o, p in ((outs[0], procs[0]), (outs[2], procs[2]))]
        assert None not in ended and max(ended) - t_stop < STALL_BOUND_S, (ended, texts)
        assert [procs[0].returncode, procs[2].returncode] == [3, 3], texts
        for t in texts:
            _check_named(t)
        assert _wait_gone(family, 10) == []
    finally:
        _cleanup(procs, procs[1].pid)


# ---- a stopped rank is named in time ----

# -T 6, -t 2, -i 0.5: a round's length is 2 + 0.5 + net_fleet.CLIENT_STALL_S (10) +
# net_fleet.ROUND_MARGIN_S (5) = 17.5 s, so each round must end within max(6, 17.5) = 17.5 s of its
# start. Rank 2 is stopped while rank 0 runs the first test (0 -> 1; rank 2 idle, already at the
# round's end barrier); it is missed at the end of round 2 (1 -> 2): the rest of round 1 (about
# 2.5 s; rank 0's test is healthy) plus 17.5 s after the stop.
NET_ARGS = ["net", "nodes", "-T", "6", "-t", "2", "-i", "0.5", "-P", "1", "-b", "2G"]

NET_BOUND_S = 2.5 + 17.5 + 8.0  # the rest of round 1, round 2's deadline, load and close

NAMED = rf"rank 2 on {re.escape(HOST)} did not answer the (end of net round \d of 3|barrier|all-gather)"

def test_mpiexec_net_nodes_names_a_stopped_rank_in_time():
    exe = mpiexec()
    top = _start([exe, "-n", "3", sys.executable, "-m", "gpubench", *NET_ARGS], _env())
    out = Lines(top)
    victim = None
    try:
        ranks = _mpi_ranks(top.pid)
        _wait_test_running(ranks[0])
        victim = ranks[2]
        os.kill(victim, signal.SIGSTOP)
        t_stop = time.monotonic()
        family = _family([top.pid, *ranks.values()])
        _wait_all([top], NET_BOUND_S + 40)
        text = out.text() if top.poll() is not None else "".join(line for _, line in out.lines)
        named = out.first(NAMED)
        assert named is not None, text[-3000:]
        assert named - t_stop < NET_BOUND_S, (named - t_stop, text[-3000:])
        assert top.poll() is not None and top.returncode != 0, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
        assert _wait_gone(family, 15) == [], [psutil.Process(p).cmdline() for p in _alive(family)]
    finally:
        _cleanup([top], victim)

def test_torchrun_style_net_nodes_names_a_stopped_rank_in_time():
    port = _free_port()
    procs = [_start([sys.executable, "-m", "gpubench", *NET_ARGS], _torchrun_env(r, port)) for r in range(3)]
    outs = [Lines(p) for p in procs]
    try:
        _wait_test_running(procs[0].pid)
        os.kill(procs[2].pid, signal.SIGSTOP)
        t_stop = time.monotonic()
        family = _family([procs[0].pid, procs[1].pid])
        _wait_all(procs[:2], NET_BOUND_S + 40)
        texts = [o.text() if p.poll() is not None else "".join(line for _, line in o.lines)
                 for o, p in zip(outs[:2], procs[:2])]
        assert [p.returncode for p in procs[:2]] == [3, 3], texts
        for o, t in zip(outs[:2], texts):
            named = o.first(NAMED)
            assert named is not None, t[-1500:]
            # each survivor names it within the bound (a sender stuck on the stopped receiver
            # leaves its test within net's own reply limit, then finds the abort notice)
            assert named - t_stop < NET_BOUND_S + 10.0, (named - t_stop, t[-1500:])
            assert "Traceback" not in t
        assert min(o.first(NAMED) for o in outs[:2]) - t_stop < NET_BOUND_S, texts
        assert _wait_gone(family, 10) == []
    finally:
        _cleanup(procs, procs[2].pid)


# ---- rank 0 stopped while it only receives ----

# Ring of 2: round 2 is 1 -> 0, so rank 0 only receives: it sends its end-of-round message at once
# and has nothing more to send until the final gather. Stopped there (its receiving worker runs),
# rank 1 must name rank 0 at the end of round 2 (19.5 s after its start) or at the final gather,
# whose receipt it waits -T + 5 s for (about 15 s of rank 1's stalled test + 9 s here), and never
# exit 0. The stop must land inside the 4 s receive: a worker first seen more than RECV0_FRESH_S
# after it started (a loaded host scanning late) is too late, and the job is started again.
RECV0_ARGS = ["net", "nodes", "-T", "4", "-t", "4", "-i", "0.5", "-P", "1", "-b", "2G"]
RECV0_BOUND_S = 19.5 + 4 + 5 + 20.0  # a round's length, the receipt's wait, load

# each rank's exit status on mpiexec's output (mpiexec itself reports the killed rank's)
SAY_EXIT = ["sh", "-c", '"$@"; rc=$?; echo "EXIT $PMI_RANK $rc"; exit $rc', "sh"]

def _gpubench_ranks(top: int, n: int, timeout: float = 60.0) -> dict[int, int]:
    """rank -> pid of the gpubench processes under ``top`` (below SAY_EXIT's shell, whose command
    line holds "-m gpubench" too; not the workers)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = {}
        for c in psutil.Process(top).children(recursive=True):
            try:
                if c.cmdline()[1:3] == ["-m", "gpubench"] and "PMI_RANK" in c.environ():
                    got[int(c.environ()["PMI_RANK"])] = c.pid
            except psutil.Error:
                pass
        if len(got) == n:
            return got
        time.sleep(0.05)
    raise AssertionError("mpiexec did not start the ranks")

RECV0_FRESH_S = 1.5  # at most this old when seen: the stop then lands with 2.5 s of the receive left


def _receiving_for(pid: int) -> float | None:
    """Seconds ``pid``'s net server has run a receiving worker (a test to it has begun), or None."""
    try:
        ages = [time.time() - c.create_time() for c in psutil.Process(pid).children(recursive=True)
                if '"role": "recv"' in " ".join(c.cmdline())]
    except psutil.Error:
        return None
    return min(ages) if ages else None


def _rank_0_stopped_in_its_receive(attempts: int = 3):
    """Start the job and SIGSTOP rank 0 within RECV0_FRESH_S of its receiving worker's start;
    (mpiexec, its output, rank 0's pid, when stopped). A start whose worker was seen late is ended
    and the job started again, at most ``attempts`` times."""
    for _ in range(attempts):
        top = _start([mpiexec(), "-n", "2", *SAY_EXIT, *GPUBENCH, *RECV0_ARGS], _env())
        out = Lines(top)
        ranks = _gpubench_ranks(top.pid, 2)
        end = time.monotonic() + 90
        age = None
        while top.poll() is None and time.monotonic() < end:
            age = _receiving_for(ranks[0])
            if age is not None:
                break
            time.sleep(0.02)
        if age is not None and age <= RECV0_FRESH_S:
            os.kill(ranks[0], signal.SIGSTOP)
            return top, out, ranks[0], time.monotonic()
        _cleanup([top], None)
    raise AssertionError(f"rank 0's receiving worker was never seen within {RECV0_FRESH_S} s of its start "
                         f"in {attempts} runs: " + "".join(line for _, line in out.lines)[-2000:])

def test_mpiexec_net_nodes_rank_0_stopped_while_it_only_receives_is_named_and_fails_the_job():
    top, out, victim, t_stop = _rank_0_stopped_in_its_receive()  # round 2: rank 1's test to rank 0 runs
    try:
        # gpubench's part: the survivor names rank 0 and exits, 3 not 0 (checked below)
        out.wait_for(r"EXIT 1 \d+", RECV0_BOUND_S + 30)
        # the launcher's part: hydra's clean-up of the stopped rank 0 after the survivor's exit 3
        # ends the job in most runs, not all (a stopped process is not always reached); a batch
        # system's time limit ends such a job, as the SIGKILL here does after a grace
        (t_end,) = _wait_all([top], 30)
        if t_end is None:
            os.kill(victim, signal.SIGKILL)
            (t_end,) = _wait_all([top], 30)
        text = out.text() if t_end is not None else "".join(line for _, line in out.lines)
        assert t_end is not None, text[-3000:]
        named = [line for _, line in out.lines if re.search(rf"rank 0 on {re.escape(HOST)} did not answer", line)]
        assert len(named) == 1, text[-3000:]
        t_named = out.first(rf"rank 0 on {re.escape(HOST)} did not answer")
        print(f"rank 0 named {t_named - t_stop:.1f} s after its stop; mpiexec exit {top.returncode}")
        assert t_named - t_stop < RECV0_BOUND_S, (t_named - t_stop, text[-3000:])
        assert re.search(r"EXIT 1 3\b", text), text[-3000:]  # the survivor: exit 3, not 0
        assert top.returncode != 0, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
    finally:
        _cleanup([top], victim)


# ---- one MASTER_PORT, other programs, stopped workers, schedules ----

CLASH_ARGS = ["net", "nodes", "-T", "15", "-t", "1", "-O", "0", "-i", "0.5", "-P", "1", "-b", "2G"]

def test_two_groups_on_one_master_port_fail_clearly_and_never_mix():
    """Two groups of 3 on one MASTER_PORT never mix: a rank index is claimed once per store, so a
    second claimant is refused naming the clash and, while the group has not formed, its refusal
    aborts the group it ran into (which may hold an intruder); no rank of one group reads another's
    messages or tests another's servers. Whatever the race, every process ends, no one exits 0
    unless it was one of three ranks of one group that measured every link (with no FAIL or busy
    link in its report), and each failure names the port clash, or (a rank that came after its
    group's store had closed for the clash) says it found no store while another names the clash."""
    port = _free_port()
    procs, outs = [], []
    try:
        for g in "AB":
            for r in range(3):
                env = _env(RANK=str(r), WORLD_SIZE="3", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port))
                procs.append(_start([*GPUBENCH, *CLASH_ARGS], env))
                outs.append(Lines(procs[-1]))
        ended = _wait_all(procs, 90)
        texts = [o.text() if p.poll() is not None else "".join(line for _, line in o.lines) for o, p in zip(outs, procs)]
        assert None not in ended, texts
        # a group that formed measured every link: its ranks exit 0, or its rank 0 exits 1 because the
        # matrix flagged a link slow (the measured verdict; loopback on a busy 2-core CI host, where a
        # 3-link median flags easily, e.g. 'vm#1->vm#2 (slow)' from the group that won the port)
        measured = [i for i, p in enumerate(procs)
                    if p.returncode == 0 or (p.returncode == 1 and re.search(r"link\(s\) flagged: .*\(slow\)", texts[i])
                                             and "TCP Gbit/s between nodes" in texts[i])]
        assert len(measured) in (0, 3), ([p.returncode for p in procs], texts)
        if measured:
            reports = [texts[i] for i in measured if "TCP Gbit/s between nodes" in texts[i]]
            assert len(reports) == 1 and "FAIL" not in reports[0] and "busy" not in reports[0], texts
        clash = r"Address already in use|already joined the rendezvous store|also joined the rendezvous store"
        named = [i for i, t in enumerate(texts) if re.search(clash, t)]
        for i, p in enumerate(procs):
            if i not in measured:
                # a rank that started after its group's rank 0 stopped for the clash (a slow start on a
                # loaded host) finds no store at all, or loses it while it waits for rank 0's answer
                # to the join; a rank 0 that started after the first store closed serves the port
                # itself and waits out -T for ranks already refused by that store, and a rank that
                # joined it waits with it: each says so, and another process named the clash
                late = re.search(r"cannot reach rank 0's rendezvous store|"
                                 r"which serves the rendezvous store, did not answer|"
                                 r"did not answer the join within 15 s", texts[i]) and named
                assert i in named or late, ([p.returncode for p in procs], texts)
            assert "Traceback" not in texts[i], texts[i]
    finally:
        for p in procs:
            _cleanup([p], None)

@pytest.mark.parametrize("reply", [b"HTTP/1.1 400 Bad Request\r\n\r\n", b'{"ok": true, "v": "x", "k": 5}\n'])
def test_another_program_on_master_port_is_named_not_a_traceback(reply):
    """A rank whose MASTER_PORT is served by another program (an HTTP server, JSON of another shape)
    exits 3 with one line saying the store's port is not gpubench's: no JSONDecodeError, no
    ValueError."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]

    def answer():
        try:
            while True:
                c, _ = srv.accept()
                while c.recv(4096):
                    c.sendall(reply)
        except OSError:
            pass

    threading.Thread(target=answer, daemon=True).start()
    try:
        p = _gpubench(["net", "nodes", "-t", "1", "-T", "5"],
                      _env(RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)), timeout=60)
    finally:
        srv.close()
    assert p.returncode == 3, p.stderr
    assert "the rendezvous store's port is not gpubench's" in p.stderr and "Error:" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr

def test_a_stopped_net_worker_is_not_left_behind_when_its_rank_exits():
    """A receiving worker process of rank 0's server stopped mid-test (a hung process of the data
    path, not the rank): the link is FAIL (its stalled stream, though the paced others carry 3 of
    its 4 Gbit/s), mpiexec ends, and the stopped worker is not left behind (it runs in its own
    session, where neither mpiexec nor a terminal would reach it)."""
    top = _start([mpiexec(), "-n", "3", *GPUBENCH, "net", "nodes", "--to", "0", "-P", "4", "-b", "1G", "-t", "4", "-O", "0",
                  "-T", "8"], _env())
    out = Lines(top)
    victim = None
    try:
        end = time.monotonic() + 60
        while victim is None and time.monotonic() < end:
            for c in psutil.Process(top.pid).children(recursive=True):
                try:
                    if "net/worker.py" in " ".join(c.cmdline()) and c.environ().get("PMI_RANK") == "0":
                        victim = c
                        break
                except psutil.Error:
                    pass
            time.sleep(0.02)
        assert victim is not None, out.text()[-2000:]
        family = _family([top.pid])
        victim.suspend()
        (t_end,) = _wait_all([top], 90)
        text = out.text() if t_end is not None else "".join(line for _, line in out.lines)
        assert t_end is not None, text[-3000:]
        assert "FAIL link" in text and "Traceback" not in text, text[-3000:]
        assert _wait_gone(family + [victim.pid], 10) == [], [(p, psutil.Process(p).status()) for p in _alive(family)]
    finally:
        if victim is not None:
            try:
                victim.kill()
            except psutil.Error:
                pass
        _cleanup([top], None)

def test_to_and_pairs_together_are_refused():
    """--to 1 --pairs all names two schedules: refused (exit 2), not one run alone; --to 5 of 3 ranks
    is out of range."""
    p = _gpubench(["net", "nodes", "--to", "1", "--pairs", "all", "-t", "1"],
                  _env(RANK="0", WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port())), timeout=30)
    assert p.returncode == 2 and "two schedules" in p.stderr and "Traceback" not in p.stderr, p.stderr
    p = _gpubench(["net", "nodes", "--to", "5", "-t", "1"],
                  _env(RANK="0", WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port())), timeout=30)
    assert p.returncode == 2 and "--to 5 out of range" in p.stderr, p.stderr

def test_a_bad_rendezvous_is_refused_under_mpi_too():
    """--rendezvous is checked under mpiexec too, where the ranks meet through MPI and do not use it:
    127.0.0.1:0 is refused (exit 2)."""
    p = subprocess.run([mpiexec(), "-n", "2", *GPUBENCH, "net", "nodes", "-t", "1", "-O", "0", "--rendezvous",
                        "127.0.0.1:0"], env=_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--rendezvous '127.0.0.1:0' is not HOST:PORT" in p.stderr, p.stdout + p.stderr


# ---- a signal to one rank: it stops at once and the others name it, as interrupted ----

@pytest.mark.parametrize("victim, sig, code", [(1, signal.SIGTERM, 143), (0, signal.SIGINT, 130)])
def test_a_rank_stopped_by_a_signal_says_so_and_every_other_rank_names_it_at_once(victim, sig, code):
    """torchrun-style, 3 ranks: SIGTERM (or Ctrl-C's SIGINT) to one rank while the rounds run. It
    exits 143 (130) with its one line, and tells the others: each stops at its next wait with
    "rank N on HOST stopped: interrupted by SIGTERM" (exit 3), within seconds, not at the round's
    deadline as a rank that "did not answer"; none exits 0 (rank 0 interrupted included)."""
    port = _free_port()
    args = ["net", "nodes", "-q", "-T", "20", "-t", "2", "-i", "0.5", "-P", "1", "-b", "2G"]
    procs = [_start([sys.executable, "-m", "gpubench", *args], _torchrun_env(r, port)) for r in range(3)]
    outs = [Lines(p) for p in procs]
    try:
        _wait_test_running(procs[0].pid)
        procs[victim].send_signal(sig)
        t_sig = time.monotonic()
        ended = _wait_all(procs, 30)
        texts = [o.text() if p.poll() is not None else "".join(line for _, line in o.lines) for o, p in zip(outs, procs)]
        assert None not in ended, texts
        assert procs[victim].returncode == code, texts
        assert f"interrupted by {sig.name}" in texts[victim] and "did not answer" not in texts[victim], texts
        for r in range(3):
            if r == victim:
                continue
            assert procs[r].returncode == 3, texts
            assert f"rank {victim} on {HOST} stopped: interrupted by {sig.name}" in texts[r], texts
            assert "did not answer" not in texts[r] and "Traceback" not in texts[r], texts
        # the round deadline here is about 20 s: every rank is out well before it
        assert max(ended) - t_sig < 10, (max(ended) - t_sig, texts)
    finally:
        _cleanup(procs, None)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_to_mpiexec_keeps_the_rounds_that_ended(tmp_path, sig, code):
    """mpiexec -n 2 (a ring of 2: 0 -> 1, then 1 -> 0), SIGINT or SIGTERM to mpiexec once round 2
    runs: rank 0 saves the partial result of round 1 (its link 0 -> 1, marked interrupted) and
    says so; the job's exit is the signal's."""
    out_json = tmp_path / "nodes.json"
    top = _start([mpiexec(), "-n", "2", *GPUBENCH, "net", "nodes", "-B", "127.0.0.1", "-t", "2", "-i", "0.5",
                  "-T", "20", "--json", str(out_json)], _env())
    out = Lines(top)
    try:
        ranks = _mpi_ranks(top.pid, 2)
        end = time.monotonic() + 60
        while _receiving_for(ranks[0]) is None and time.monotonic() < end:  # round 2: rank 0 receives
            time.sleep(0.02)
        assert _receiving_for(ranks[0]) is not None, out.text()[-2000:]
        top.send_signal(sig)
        assert _wait_all([top], 30) != [None], "".join(line for _, line in out.lines)[-2000:]
        text = out.text()
        assert top.returncode == code, text[-2000:]
        assert f"interrupted by {sig.name}; kept what was measured: 1 point(s)" in text, text[-2000:]
        assert "Traceback" not in text, text[-2000:]
        saved = json.loads(out_json.read_text())
        assert saved["partial"] is True and saved["interrupted_by"] == sig.name, saved
        assert [(r["params"]["src"], r["params"]["dst"]) for r in saved["records"]] == [(0, 1)], saved["records"]
    finally:
        _cleanup([top], None)


def _two_ranks(port: int) -> list[dict]:
    """The environments of ranks 0 and 1 of a torchrun-style job of 2 on this host."""
    return [_env(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(port)) for r in (0, 1)]


def _run_two_ranks(argv: list[str], port: int, cwds=(None, None)) -> tuple[list[int], list[str], list[str]]:
    """``argv`` as ranks 0 and 1 (:func:`_two_ranks`), each in its folder of ``cwds``, to their end:
    (exit codes, stdouts, stderrs)."""
    env = _two_ranks(port)
    procs = [subprocess.Popen(argv, env=env[r], cwd=cwds[r], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        _cleanup(procs, None)
    return [p.returncode for p in procs], [o for o, _ in outs], [e for _, e in outs]


def test_a_rank_lost_after_a_round_ended_keeps_that_round_on_rank_0(tmp_path):
    """Torchrun-style, 2 ranks (0 -> 1, then 1 -> 0): rank 1 killed once round 2 runs. Rank 0 names
    it (exit 3) and first shows and saves round 1's link, marked partial with the fault."""
    port = _free_port()
    out_json = tmp_path / "r.json"
    env = _two_ranks(port)
    procs = [_start([*GPUBENCH, "net", "nodes", "-B", "127.0.0.1", "-t", "1", "-i", "0.5", "-T", "8",
                     "--json", str(out_json)], env[r]) for r in (0, 1)]
    out = Lines(procs[0])
    try:
        end = time.monotonic() + 60
        while _receiving_for(procs[0].pid) is None and time.monotonic() < end:  # round 2: rank 0 receives
            time.sleep(0.02)
        assert _receiving_for(procs[0].pid) is not None, out.text()[-2000:]
        procs[1].kill()
        assert _wait_all(procs[:1], 60) != [None], "".join(line for _, line in out.lines)[-2000:]
        text = out.text()
    finally:
        _cleanup(procs, None)
    assert procs[0].returncode == 3 and "rank 1 on" in text and "Traceback" not in text, text[-2000:]
    saved = json.loads(out_json.read_text())
    assert saved["partial"] is True and "rank 1" in saved["failed_by"], saved
    assert [(r["params"]["src"], r["params"]["dst"]) for r in saved["records"]] == [(0, 1)], saved["records"]


# the rank signals itself as soon as its close returned: rank 0 had confirmed the end
_SIGNAL_AFTER_CLOSE = """
import os, signal, sys
from gpubench.launch import ranks
close = ranks.Group.close
def close_then_signalled(self, *args, **kwargs):
    close(self, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
ranks.Group.close = close_then_signalled
sys.argv = ["gpubench", *sys.argv[1:]]
from gpubench.cli import main
main()
"""


def test_a_signal_after_the_confirmed_end_says_the_result_is_complete_on_every_rank(tmp_path):
    """Torchrun-style, 2 ranks, each sent SIGTERM once its close returned (rank 0 confirmed the
    end): rank 0's file is whole, and each rank's one line says the result is complete (143)."""
    port = _free_port()
    out_json = tmp_path / "r.json"
    codes, _outs, errs = _run_two_ranks([sys.executable, "-c", _SIGNAL_AFTER_CLOSE, "net", "nodes", "-B", "127.0.0.1",
                                         "-t", "0.5", "-i", "0.25", "-q", "--json", str(out_json)], port)
    assert codes == [143, 143], errs
    assert errs == ["gpubench: interrupted by SIGTERM after the run; its result is complete\n"] * 2, errs
    assert json.loads(out_json.read_text())["partial"] is False


def test_the_json_folder_is_needed_on_rank_0s_node_only(tmp_path):
    """Rank 0 alone writes --json: `--json sub/x.json` where sub/ exists in rank 0's working folder
    and not in rank 1's runs, and rank 0 saves the matrix (rank 1 checks only the name's form). Both links
    are held at 200 Mbit/s, which loopback reaches under any load, so no slow-link verdict fails the run."""
    port = _free_port()
    homes = [tmp_path / "r0", tmp_path / "r1"]
    (homes[0] / "sub").mkdir(parents=True)
    homes[1].mkdir()
    codes, outs, errs = _run_two_ranks([*GPUBENCH, "net", "nodes", "-B", "127.0.0.1", "-t", "0.5", "-i", "0.25", "-q",
                                        "-b", "200M", "--json", "sub/x.json"], port, cwds=homes)
    assert codes == [0, 0], (outs, errs)
    assert len(json.loads((homes[0] / "sub" / "x.json").read_text())["records"]) == 2
    assert not (homes[1] / "sub").exists()


def test_a_rank_0_signalled_while_it_waits_in_the_join_tells_the_ranks_already_there():
    """torchrun-style, 3 ranks of which rank 1 never comes: rank 0, waiting in the join (a store
    request of its own in flight), gets SIGTERM. It exits 143 and rank 2 exits 3 naming it as
    interrupted, at once, not at the join's deadline (-T 20) as a store that did not answer."""
    port = _free_port()
    args = ["net", "nodes", "-q", "-T", "20", "-t", "1"]
    procs = [_start([sys.executable, "-m", "gpubench", *args], _torchrun_env(r, port)) for r in (0, 2)]
    outs = [Lines(p) for p in procs]
    try:
        time.sleep(3.0)  # both joined; rank 0 waits for rank 1 in the join's all-gather
        procs[0].send_signal(signal.SIGTERM)
        t_sig = time.monotonic()
        ended = _wait_all(procs, 30)
        texts = [o.text() if p.poll() is not None else "".join(line for _, line in o.lines) for o, p in zip(outs, procs)]
        assert None not in ended and max(ended) - t_sig < 10, texts
        assert [p.returncode for p in procs] == [143, 3], texts
        assert "rank 0 on" in texts[1] and "stopped: interrupted by SIGTERM" in texts[1], texts
        assert "Traceback" not in texts[0] + texts[1], texts
    finally:
        _cleanup(procs, None)


@pytest.mark.parametrize("bad, line", [
    (["-P", "0"], "gpubench: error: -P/--parallel 0 out of range (use 1 to 128 streams)"),
    (["--json", ""], "gpubench: error: --json needs a file name, got '' (e.g. out.json)"),
])
def test_a_bad_option_under_mpiexec_is_said_once_by_rank_0(bad, line):
    """Every rank refuses the same options alike: rank 0 alone says so (one line), all exit 2."""
    p = subprocess.run([mpiexec(), "-n", "2", *GPUBENCH, "net", "nodes", "-B", "127.0.0.1", *bad], env=_env(),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.strip().splitlines() == [line]


needs_ucx = pytest.mark.skipif(__import__("importlib.util").util.find_spec("ucxx") is None,
                               reason="UCXX is not installed (pip install 'gpubench-cuda[ucx-cu13]')")


@needs_ucx
def test_mpiexec_net_nodes_over_ucx_gives_the_link_matrix_with_each_links_transports(tmp_path):
    """`mpiexec -n 2 gpubench net nodes --protocol ucx` on loopback: both links measured with net's
    UCX test, the data checked, the transports and the UCX params on each link record."""
    out = tmp_path / "u.json"
    p = subprocess.run([mpiexec(), "-n", "2", *GPUBENCH, "net", "nodes", "--protocol", "ucx", "-B", "127.0.0.1",
                        "-l", "256KiB", "-t", "0.6", "-i", "0.3", "--json", str(out)], env=_env(),
                       capture_output=True, text=True, timeout=120)
    # two processes spinning on a shared 2-core host move very different rates (27 against 103
    # Gbit/s under load): the fleet rule may flag one link slow (exit 1), never a failed one
    assert p.returncode == 0 or (p.returncode == 1 and "(slow)" in p.stderr and "(fail)" not in p.stderr), \
        p.stdout[-2000:] + p.stderr[-2000:]
    assert "UCX Gbit/s between nodes" in p.stdout and "-m host" in p.stdout
    res = json.loads(out.read_text())
    assert res["spec"]["protocol"] == "ucx" and res["spec"]["memory"] == "host" and res["spec"]["buffer"] == 256 * 1024
    links = res["records"]
    assert sorted((r["params"]["src"], r["params"]["dst"]) for r in links) == [(0, 1), (1, 0)]
    for r in links:
        assert r["error"] is None and r["extra"]["gbit_per_s"] > 0 and r["extra"]["data_checked"] is True
        assert r["params"]["protocol"] == "ucx" and r["params"]["memory"] == "host" and r["params"]["api"] == "tag"
        assert r["extra"]["transports"]["client"]["carried_by"]["via"], r["extra"]["transports"]

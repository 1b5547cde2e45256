"""core/ranks.discover: each launcher's variables, the order, nesting, and contradictions (exit 2
naming the variable); the Slurm helpers (job and step ids are not rank counts); a group of one;
rendezvous addresses (an IPv6 zone, ASCII ports only); the wording of an abort notice."""

from __future__ import annotations

import json
import time

import pytest

from gpubench.launch import ranks
from gpubench.core.errors import MachineError, UsageError


def test_no_launcher_is_one_process():
    r = ranks.discover({})
    assert (r.rank, r.size, r.local_rank, r.launcher) == (0, 1, 0, "none")
    g = ranks.join(r)
    assert (g.rank, g.size, g.transport) == (0, 1, "single")
    assert g.gather({"a": (1, 2)}) == [{"a": [1, 2]}]
    assert g.allgather(3) == [3] and g.bcast("x") == "x"
    g.barrier()
    g.close()


def test_open_mpi():
    r = ranks.discover({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "16",
                        "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "8"})
    assert (r.rank, r.size, r.local_rank, r.local_size, r.node, r.launcher) == (5, 16, 1, 8, None, "openmpi")


def test_pmix_takes_size_from_slurm_or_leaves_it_to_mpi():
    r = ranks.discover({"PMIX_RANK": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_PROCID": "3"})
    assert (r.rank, r.size, r.local_rank, r.launcher) == (3, 4, 1, "pmix")
    r = ranks.discover({"PMIX_RANK": "2"})
    assert (r.rank, r.size, r.local_rank, r.launcher) == (2, 0, -1, "pmix")


def test_hydra_and_intel_mpi():
    r = ranks.discover({"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "3"})
    assert (r.rank, r.size, r.local_rank, r.local_size, r.launcher) == (2, 3, 2, 3, "pmi")


def test_slurm_step():
    env = {"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
           "SLURM_STEP_ID": "0", "SLURM_NNODES": "2", "SLURM_STEP_TASKS_PER_NODE": "8(x2)"}
    r = ranks.discover(env)
    assert (r.rank, r.size, r.local_rank, r.local_size, r.node, r.launcher) == (9, 16, 1, 8, 1, "slurm")


def test_slurm_batch_script_is_not_a_launch():
    # sbatch's script has SLURM_PROCID=0 and the job's SLURM_NTASKS, but no srun step
    assert ranks.discover({"SLURM_PROCID": "0", "SLURM_NTASKS": "16"}).launcher == "none"
    assert ranks.discover({"SLURM_PROCID": "0", "SLURM_NTASKS": "16",
                           "SLURM_STEP_ID": str(0xFFFFFFFB)}).launcher == "none"


def test_torchrun_and_its_nesting_under_srun():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
           "MASTER_ADDR": "n0", "MASTER_PORT": "29500"}
    r = ranks.discover(env)
    assert (r.rank, r.size, r.local_rank, r.local_size, r.node, r.launcher) == (3, 4, 1, 2, 1, "torchrun")
    # srun (one agent per node) then torchrun: torchrun's workers win over SLURM_PROCID
    nested = {**env, "TORCHELASTIC_RUN_ID": "j1", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0",
              "SLURM_LOCALID": "0", "SLURM_NODEID": "1"}
    assert ranks.discover(nested).launcher == "torchrun"
    assert ranks.discover(nested).rank == 3
    # without torchrun's mark the documented order holds: Slurm before a plain RANK
    del nested["TORCHELASTIC_RUN_ID"]
    assert ranks.discover(nested).launcher == "slurm"


def test_order_open_mpi_before_slurm():
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
           "SLURM_STEP_ID": "0"}
    assert ranks.discover(env).launcher == "openmpi"


@pytest.mark.parametrize("env, name", [
    ({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK"),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK=2"),
    ({"OMPI_COMM_WORLD_RANK": "0"}, "OMPI_COMM_WORLD_SIZE"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "0"}, "OMPI_COMM_WORLD_SIZE=0"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, "OMPI_COMM_WORLD_LOCAL_RANK=3"),
    ({"PMI_RANK": "-1", "PMI_SIZE": "2"}, "PMI_RANK=-1"),
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "5"}, "MPI_LOCALNRANKS=5"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0"}, "SLURM_NTASKS"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_NODEID": "2", "SLURM_NNODES": "2"},
     "SLURM_NODEID=2"),
    ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK=4"),
    ({"RANK": "0"}, "WORLD_SIZE"),
    ({"WORLD_SIZE": "2"}, "RANK"),
    ({"RANK": "0", "WORLD_SIZE": "two"}, "WORLD_SIZE"),
])
def test_contradictions_name_the_variable(env, name):
    with pytest.raises(UsageError) as e:
        ranks.discover(env)
    assert name in e.value.one_line() and e.value.exit_code == 2


def test_slurm_tasks_per_node_and_first_host():
    assert ranks.slurm_tasks_on_node("4(x2),3", 0) == 4
    assert ranks.slurm_tasks_on_node("4(x2),3", 1) == 4
    assert ranks.slurm_tasks_on_node("4(x2),3", 2) == 3
    assert ranks.slurm_tasks_on_node("4(x2),3", 3) is None
    assert ranks.slurm_tasks_on_node("bad", 0) is None
    assert ranks.slurm_first_host("gpu[07-09,12],login1") == "gpu07"
    assert ranks.slurm_first_host("a1,b2") == "a1"


def test_rendezvous_addresses():
    me = ranks.Rank(1, 2, 1, 2, 0, "h", "torchrun")
    assert ranks.rendezvous_address(me, "n0:1234", {}) == ("n0", 1234)
    assert ranks.rendezvous_address(me, "[::1]:80", {}) == ("::1", 80)
    assert ranks.rendezvous_address(me, None, {"MASTER_ADDR": "n1"}) == ("n1", 29500)
    assert ranks.rendezvous_address(me, None, {"MASTER_ADDR": "n1", "MASTER_PORT": "7"}) == ("n1", 7)
    assert ranks.rendezvous_address(me, None, {}) is None
    sl = ranks.Rank(1, 2, 0, 1, 1, "h", "slurm")
    assert ranks.rendezvous_address(sl, None, {"SLURM_STEP_NODELIST": "g[3-4]", "SLURM_JOB_ID": "1234"}) == ("g3", 29734)
    for bad in ("n0", "n0:0", "n0:99999", ":5", "a:b"):
        with pytest.raises(UsageError, match="HOST:PORT"):
            ranks.parse_rendezvous(bad)
    with pytest.raises(UsageError, match="MASTER_PORT"):
        ranks.rendezvous_address(me, None, {"MASTER_ADDR": "n1", "MASTER_PORT": "http"})
    for blank in ("", " "):  # set but empty is a typo to name, not torchrun's default port (another group's, maybe)
        with pytest.raises(UsageError, match=f"MASTER_PORT='{blank}' is not an integer"):
            ranks.rendezvous_address(me, None, {"MASTER_ADDR": "n1", "MASTER_PORT": blank})
    # a host name the resolver cannot encode is a usage error naming it, not an IDNA exception
    for bad in ("a..b", "x" * 64 + ".example"):
        with pytest.raises(UsageError, match=r"--rendezvous host .* is not a host name"):
            ranks.rendezvous_address(me, f"{bad}:29500", {})
        with pytest.raises(UsageError, match=r"MASTER_ADDR host .* is not a host name"):
            ranks.rendezvous_address(me, None, {"MASTER_ADDR": bad})
    # a half-bracketed address or a URL is a usage error too (it was a failed lookup, exit 3); a
    # bracketed IPv6 address is read without its brackets
    for bad in ("[::1", "::1]", "http://n1", "n 1"):
        with pytest.raises(UsageError, match=r"MASTER_ADDR host .* is not a host name or address"):
            ranks.rendezvous_address(me, None, {"MASTER_ADDR": bad})
    assert ranks.rendezvous_address(me, None, {"MASTER_ADDR": "[::1]", "MASTER_PORT": "7"}) == ("::1", 7)


def test_several_ranks_without_a_way_to_meet():
    me = ranks.Rank(1, 2, 1, 2, 0, "h", "torchrun")
    with pytest.raises(UsageError) as e:
        ranks.join(me, env={})
    assert "MASTER_ADDR" in e.value.one_line() and "--rendezvous" in e.value.one_line()


def test_json_only():
    g = ranks.join(ranks.discover({}))
    with pytest.raises(TypeError, match="JSON"):
        g.gather(object())


def test_rendezvous_takes_an_ipv6_zone_and_only_ascii_ports():
    from gpubench.core.errors import UsageError
    from gpubench.launch.ranks import parse_rendezvous

    assert parse_rendezvous("[fe80::1%eth0]:29500") == ("fe80::1%eth0", 29500)
    with pytest.raises(UsageError):
        parse_rendezvous("node01:\uff12\uff19\uff15\uff10\uff10")

def test_slurm_job_and_step_ids_are_not_rank_counts():
    from gpubench.launch.ranks import discover, rendezvous_address

    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "98765432",
           "SLURM_JOB_NODELIST": "gpu[07-08]"}
    me = discover(env)
    assert rendezvous_address(me, None, env) == ("gpu07", 29500 + 98765432 % 1000)

def test_an_abort_notice_naming_this_rank_says_it_was_late_not_that_it_did_not_answer():
    """A rank late at a barrier (its test outlasted the deadline) that reads an abort notice naming
    itself says that rank 2 gave up waiting for it, after the seconds rank 2 waited (not -T), never
    that it did not answer; a notice naming another rank names that rank, the step, the seconds and
    who found it."""
    import json

    from gpubench.launch.ranks import Group, Rank

    g = Group(Rank(0, 3, 0, 3, 0, "node0", "torchrun"), timeout=6.0)
    g.ranks = [Rank(r, 3, r, 3, 0, f"node{r}", "torchrun") for r in range(3)]
    e = g._aborted(json.dumps({"missing": [0], "by": 2, "what": "end of net round 1 of 3", "s": 17.5}))
    assert "did not answer" not in e.message, e.message
    assert "rank 2 gave up waiting for this rank (rank 0 on node0)" in e.message and "17.5 s" in e.message
    e = Group(Rank(1, 3, 1, 3, 0, "node1", "torchrun"), timeout=6.0)
    e.ranks = g.ranks
    err = e._aborted(json.dumps({"missing": [2], "by": 0, "what": "gather", "s": 17.5}))
    assert "rank 2 on node2 did not answer the gather within 17.5 s" in err.message and "(found by rank 0)" in err.message


# ---- the launcher table decides whether mpi4py's MPI can join the launcher's job ----

MPICH_WHEEL = ("MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25 20:45:26 UTC 2026\nMPICH ABI:          18:2:6\n"
               "MPICH Device:       ch4:ucx ofi\nMPICH configure:    --with-device=ch4:ucx,ofi --with-pm=hydra:gforker\n")
MPICH_PMIX = MPICH_WHEEL.replace("--with-pm=hydra:gforker", "--with-pmix=/usr --with-pm=no")
OPEN_MPI_5 = "Open MPI v5.0.3, package: Open MPI builder Distribution, ident: 5.0.3, repo rev: v5.0.3, Apr 08, 2024"
OPEN_MPI_4 = "Open MPI v4.1.6, package: Debian OpenMPI, ident: 4.1.6, repo rev: v4.1.6, Sep 30, 2023"


def test_mpi_library_reads_the_family_version_and_pmix_from_the_library_text():
    lib = ranks.mpi_library(MPICH_WHEEL)
    assert (lib.family, lib.name, lib.major, lib.pmix) == ("mpich", "MPICH 5.0.2", 5, False)
    assert ranks.mpi_library(MPICH_PMIX).pmix is True
    lib = ranks.mpi_library(OPEN_MPI_5)
    assert (lib.family, lib.name, lib.major, lib.pmix) == ("openmpi", "Open MPI v5.0.3", 5, True)
    assert ranks.mpi_library("Intel(R) MPI Library 2021.13 for Linux* OS\n").family == "mpich"
    assert ranks.mpi_library("").family is None and ranks.mpi_library("SomeMPI 1.0").family is None


@pytest.mark.parametrize("launcher, env, text, refused", [
    ("openmpi", {"OMPI_COMM_WORLD_RANK": "0"}, MPICH_WHEEL, "which cannot join an Open MPI job"),
    ("openmpi", {"OMPI_COMM_WORLD_RANK": "0"}, OPEN_MPI_5, None),
    ("pmix", {"PMIX_RANK": "0"}, MPICH_WHEEL, "built without PMIx"),
    ("pmix", {"PMIX_RANK": "0"}, MPICH_PMIX, None),
    ("pmix", {"PMIX_RANK": "0"}, OPEN_MPI_4, None),
    ("pmix", {"PMIX_RANK": "0"}, "Intel(R) MPI Library 2021.13 for Linux* OS", None),  # cannot tell: MPI_Init decides
    ("pmi", {"PMI_RANK": "0", "HYDI_CONTROL_FD": "7"}, MPICH_WHEEL, None),
    ("pmi", {"PMI_RANK": "0", "HYDI_CONTROL_FD": "7"}, OPEN_MPI_4, "cannot join a job of MPICH's Hydra"),
    ("pmi", {"PMI_RANK": "0"}, OPEN_MPI_5, "joins PMIx jobs only"),
    ("pmi", {"PMI_RANK": "0"}, OPEN_MPI_4, None),  # srun --mpi=pmi2 with an Open MPI 4 built --with-pmi
    ("openmpi", {"OMPI_COMM_WORLD_RANK": "0"}, "", None),  # no library text: nothing refused
])
def test_the_launcher_table_refuses_an_mpi_library_that_cannot_join_its_job(launcher, env, text, refused):
    """Each MPI row of LAUNCHER_TABLE says which MPI library can join its job; a library that
    cannot is one UsageError (exit 2) naming the variable, the launcher and the library, with what
    to use, before MPI_Init (which aborted in MPICH, or warned in 3 lines and ran a world of one)."""
    row = ranks.launcher_of(launcher)
    assert row is not None and row.mpi is not None
    err = ranks.mpi_refusal(row, env, ranks.mpi_library(text))
    if refused is None:
        assert err is None, err.one_line()
        return
    assert err is not None and err.exit_code == 2
    line = err.one_line()
    assert refused in line and f"{row.rank}='0'" in line and row.mpi.job in line and "\n" not in line, line
    assert ranks.mpi_library(text).name in line


def test_every_mpi_launcher_row_has_its_mpi_job_and_the_others_none():
    assert {row.name for row in ranks.LAUNCHER_TABLE if row.mpi is not None} == {"openmpi", "pmix", "pmi"}


# ---- launcher values are plain digits ----

@pytest.mark.parametrize("env, named", [
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": " 1"}, "OMPI_COMM_WORLD_SIZE=' 1' has spaces around its digits"),
    ({"RANK": "0", "WORLD_SIZE": "1 "}, "WORLD_SIZE='1 ' has spaces around its digits"),
    ({"PMI_RANK": "\t0", "PMI_SIZE": "2"}, "PMI_RANK='\\t0' has spaces around its digits"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0 ", "SLURM_NTASKS": "2"}, "SLURM_STEP_ID='0 '"),
])
def test_launcher_values_with_spaces_around_their_digits_are_refused(env, named):
    with pytest.raises(UsageError) as e:
        ranks.discover(env)
    assert named in e.value.one_line() and e.value.exit_code == 2, e.value.one_line()


@pytest.mark.parametrize("env, named", [
    ({"RANK": "-0", "WORLD_SIZE": "2"}, "RANK='-0' has a minus sign on zero"),
    ({"PMI_RANK": "-00", "PMI_SIZE": "2"}, "PMI_RANK='-00' has a minus sign on zero"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "-0"},
     "OMPI_COMM_WORLD_LOCAL_RANK='-0'"),
])
def test_launcher_values_with_a_minus_sign_on_zero_are_refused(env, named):
    """A signed zero is not the plain digits a launcher writes (int() reads it as rank 0)."""
    with pytest.raises(UsageError) as e:
        ranks.discover(env)
    assert named in e.value.one_line() and e.value.exit_code == 2, e.value.one_line()


def test_master_port_with_spaces_is_refused():
    me = ranks.Rank(1, 2, 1, 2, 0, "h", "torchrun")
    with pytest.raises(UsageError, match="MASTER_PORT=' 29500' has spaces around its digits"):
        ranks.rendezvous_address(me, None, {"MASTER_ADDR": "n1", "MASTER_PORT": " 29500"})


# ---- the farewell rule and the deadlines, on two ranks in threads over gpubench's store ----

def _two_ranks(timeout: float = 5.0) -> tuple:
    import socket
    import threading

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    out: dict = {}

    def join(r: int) -> None:
        out[r] = ranks.join(ranks.Rank(r, 2, r, 2, 0, f"node{r}", "torchrun"), timeout=timeout, env=env)

    threads = [threading.Thread(target=join, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out[0], out[1]


def _in_thread(fn):
    import threading

    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, box


def test_a_rank_leaves_close_only_once_rank_0_confirmed_the_end(monkeypatch):
    """The farewell rule: a healthy close of rank 1 returns once rank 0 has confirmed the end; a
    rank 0 that never closes (it hangs at the end, the others had only sent to it) is named by
    rank 1's close (MachineError, exit 3), not passed over as a quiet end (exit 0)."""
    from gpubench.core.errors import MachineError

    monkeypatch.setattr(ranks, "CLOSE_S", 1.0)
    monkeypatch.setattr(ranks, "CONFIRM_S", 0.5)
    g0, g1 = _two_ranks()
    t, box = _in_thread(g0.close)
    g1.close()  # both close: confirmed
    t.join(10)
    assert "error" not in box, box

    g0, g1 = _two_ranks()
    try:
        with pytest.raises(MachineError) as e:
            g1.close()
        assert "rank 0 on node0 did not answer the end of the run (rank 0's confirmation) within 1.5 s" in e.value.message
        assert e.value.exit_code == 3
    finally:
        g0.close()


def test_a_close_with_an_error_on_its_way_lets_that_error_win(monkeypatch):
    """close() in a finally while another error propagates does not replace it with its own."""
    monkeypatch.setattr(ranks, "CLOSE_S", 0.5)
    monkeypatch.setattr(ranks, "CONFIRM_S", 0.2)
    g0, g1 = _two_ranks()
    try:
        with pytest.raises(KeyError):
            try:
                raise KeyError("first")
            finally:
                g1.close()
    finally:
        g0.close()


def test_a_confirmed_gather_names_a_root_that_stopped_while_the_others_sent(monkeypatch):
    """gather(confirm=True): the root's receipt is waited for (timeout + CONFIRM_S), so a silent
    root is named by the sender; with the root there, the sender returns once it has every part."""
    from gpubench.core.errors import MachineError

    monkeypatch.setattr(ranks, "CLOSE_S", 1.0)
    monkeypatch.setattr(ranks, "CONFIRM_S", 0.5)
    g0, g1 = _two_ranks()
    t, box = _in_thread(lambda: g0.gather({"r": 0}, confirm=True, what="final gather"))
    assert g1.gather({"r": 1}, confirm=True, what="final gather") is None
    t.join(10)
    assert box.get("value") == [{"r": 0}, {"r": 1}], box
    with pytest.raises(MachineError, match=r"rank 0 on node0 did not answer the final gather \(rank 0's receipt\) "
                                           r"within 1\.5 s"):
        g1.gather({"r": 1}, timeout=1.0, confirm=True, what="final gather")
    g1.close()
    with pytest.raises(MachineError) as e:  # rank 0 learns it was given up on
        g0.close()
    assert "rank 1 gave up waiting for this rank" in e.value.message, e.value.message


def test_a_collective_past_its_deadline_looks_at_every_silent_rank_in_one_request(monkeypatch):
    """Rank 0 of a hand-set world of 5000 with no other rank: the join waits its deadline, then
    one request looks at every silent rank (not one request each), and the error names them in
    one line."""
    from gpubench.core.errors import MachineError

    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    asked: list = []
    real = ranks._Store._ask

    def counting(self, req, wait_s):
        asked.append(req["op"])
        return real(self, req, wait_s)

    monkeypatch.setattr(ranks._Store, "_ask", counting)
    with pytest.raises(MachineError) as e:
        ranks.join(ranks.Rank(0, 5000, 0, 1, 0, "node0", "torchrun"), timeout=0.5,
                   env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    assert "and 4991 more did not answer the join within 0.5 s" in e.value.message
    assert len(asked) < 20 and asked.count("peek") == 1, (len(asked), asked[:10])


def test_a_store_last_look_is_one_request_of_constant_size_whatever_the_world_size(monkeypatch):
    """The last look past a collective's deadline names a prefix and this rank, not a key per
    silent rank: a world of 1048576 (MAX_RANKS) sends a request of a few hundred bytes, and the
    messages there (a late rank's, another destination's) are told apart by source and destination."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sent: list = []
    real = ranks._Store._ask

    def measuring(self, req, wait_s):
        import json

        sent.append((req["op"], len(json.dumps(req))))
        return real(self, req, wait_s)

    monkeypatch.setattr(ranks._Store, "_ask", measuring)
    store = ranks._Store("127.0.0.1", port, True, 5.0)
    try:
        g = ranks._StoreGroup(ranks.Rank(0, ranks.MAX_RANKS, 0, 1, 0, "node0", "torchrun"), 1.0, store, "gpubench", "p")
        store.set("p/a1/7/*", '"seven"')        # a late rank's broadcast part
        store.set("p/a1/9/0", '"nine"')         # a late part for this rank
        store.set("p/a1/9/3", '"not mine"')     # for another rank
        store.set("p/a10/5/*", '"other tag"')   # another collective
        got = g._peek("a1", list(range(1, ranks.MAX_RANKS)))
        assert got == {7: '"seven"', 9: '"nine"'}, got
        assert [op for op, _ in sent].count("peek") == 1 and max(n for op, n in sent if op == "peek") < 300, sent
        store.set("p/abort/*", '{"missing": [2], "by": 1}')
        with pytest.raises(ranks._Abort):
            g._peek("a1", [2, 3])
    finally:
        store.close(0.0)


def _fake_torch(monkeypatch, data: dict) -> None:
    """torch.distributed.TCPStore as a dict shared by every instance (one server, many clients);
    each instance counts its checks, each taking 0.1 ms."""
    import sys
    import time
    import types

    class SharedTCPStore:
        def __init__(self, *a, **k):
            self.checks = 0

        def set(self, k, v):
            data[k] = v.encode() if isinstance(v, str) else v

        def add(self, k, n):
            data[k] = str(int(data.get(k, b"0")) + n).encode()
            return int(data[k])

        def check(self, keys):
            self.checks += 1
            time.sleep(0.0001)
            return all(k in data for k in keys)

        def get(self, k):
            return data[k]

    dist = types.ModuleType("torch.distributed")
    dist.TCPStore = SharedTCPStore  # type: ignore[attr-defined]
    torch = types.ModuleType("torch")
    torch.distributed = dist  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)


def test_torch_store_last_look_is_bounded_by_its_deadline_whatever_the_world_size(monkeypatch):
    """torch's TCPStore checks key by key: its last look stops at the deadline (the sources not
    looked at count as not there) instead of a check per key of a million silent ranks."""
    import time

    _fake_torch(monkeypatch, {"p/a1/1/*": b'"one"'})
    store = ranks._TorchStore("127.0.0.1", 1, 2, True, 5.0)
    g = ranks._StoreGroup(ranks.Rank(0, ranks.MAX_RANKS, 0, 1, 0, "node0", "torchrun"), 1.0, store, "torch", "p")
    t0 = time.monotonic()
    got = g._peek("a1", list(range(1, ranks.MAX_RANKS)))
    took = time.monotonic() - t0
    assert got == {1: '"one"'}, got
    assert took < ranks.LAST_LOOK_S + 3.0 and store._store.checks < 2 * (ranks.MAX_RANKS - 1), (took, store._store.checks)


def test_torch_store_server_serves_on_until_every_rank_read_the_end(monkeypatch):
    """Rank 0's process serves torch's TCPStore and ends with it: its close waits until every other
    rank counted itself out (so the end's confirmation it set last is read before the store goes),
    and no longer once they have; a rank that never leaves costs at most the linger."""
    import time

    data: dict = {}
    _fake_torch(monkeypatch, data)
    node = ranks.Rank(0, 3, 0, 1, 0, "node0", "torchrun")
    server = ranks._StoreGroup(node, 5.0, ranks._TorchStore("127.0.0.1", 1, 3, True, 5.0), "torch", "p")
    clients = [ranks._StoreGroup(ranks.Rank(r, 3, 0, 1, 0, "node0", "torchrun"), 5.0,
                                 ranks._TorchStore("127.0.0.1", 1, 3, False, 5.0), "torch", "p") for r in (1, 2)]
    t, box = _in_thread(server._shut)
    time.sleep(0.3)
    assert t.is_alive()  # nobody left yet: rank 0 still serves
    clients[0]._shut()
    time.sleep(0.2)
    assert t.is_alive()
    t0 = time.monotonic()
    clients[1]._shut()
    t.join(5.0)
    assert not t.is_alive() and time.monotonic() - t0 < 1.0 and data["p/left"] == b"2"
    lone = ranks._StoreGroup(node, 0.4, ranks._TorchStore("127.0.0.1", 1, 3, True, 5.0), "torch", "q")
    t0 = time.monotonic()
    lone._shut()  # -T 0.4: the linger is min(10 s, -T)
    assert 0.35 < time.monotonic() - t0 < 2.0


def test_rank_0_store_close_does_not_linger_once_every_rank_disconnected():
    """Rank 0 serves the store until every rank has disconnected (at most the linger): a client's
    close closes its reader too, so the socket really closes and rank 0 does not wait the whole
    linger (min(10 s, -T)) after every healthy run."""
    import time

    g0, g1 = _two_ranks(timeout=10.0)
    t, box = _in_thread(g0.close)
    g1.close()
    t0 = time.monotonic()
    t.join(30)
    assert "error" not in box, box
    assert time.monotonic() - t0 < 5.0


class _Board(ranks.Group):
    """An in-process transport for the group's collectives: every rank is a thread, messages are
    kept on one shared board (tag, src, dest) and counted."""

    def __init__(self, me, board, timeout=5.0):
        super().__init__(me, timeout)
        self.board = board

    def _send_all(self, tag, text, dests, deadline):
        with self.board["cv"]:
            for d in dests:
                self.board["msgs"][(tag, self.rank, d)] = text
                self.board["sent"] += 1
            self.board["cv"].notify_all()

    def _recv(self, tag, src, deadline, aborts=True):
        import time as _t
        with self.board["cv"]:
            while True:
                msgs = self.board["msgs"]
                if (tag, src, self.rank) in msgs:
                    return msgs.pop((tag, src, self.rank))
                abort = next((k for k in msgs if k[0] == "abort" and k[2] == self.rank), None) if aborts else None
                if abort is not None:
                    raise ranks._Abort(msgs.pop(abort))
                left = deadline - _t.monotonic()
                if left <= 0:
                    raise TimeoutError
                self.board["cv"].wait(left)


def _board_ranks(n, absent=(), timeout=5.0, call=lambda g: g.allgather(g.rank * 10)):
    import threading

    board = {"msgs": {}, "sent": 0, "cv": threading.Condition()}
    members = [_Board(ranks.Rank(r, n, r, n, 0, f"node{r}", "torchrun"), board, timeout) for r in range(n)]
    for g in members:
        g.ranks = [m.me for m in members]
    out: dict = {}

    def one(g):
        try:
            out[g.rank] = call(g)
        except MachineError as e:
            out[g.rank] = e.message

    threads = [threading.Thread(target=one, args=(g,)) for g in members if g.rank not in absent]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out, board["sent"]


@pytest.mark.parametrize("n", [2, 3, 8, 33])
def test_an_all_gather_and_a_barrier_of_n_ranks_take_2_n_minus_1_messages_through_rank_0(n):
    """Each rank sends to rank 0, which answers each: 2(n - 1) messages (a store serves that many
    requests), not one from every rank to every other, n(n - 1), which at 1,000 ranks would be a
    million requests to rank 0's store per barrier."""
    out, sent = _board_ranks(n)
    assert out == {r: [10 * q for q in range(n)] for r in range(n)}
    assert sent == 2 * (n - 1)
    out, sent = _board_ranks(n, call=lambda g: g.barrier())
    assert out == {r: None for r in range(n)} and sent == 2 * (n - 1)


def test_a_rank_missing_at_an_all_gather_is_named_by_rank_0_and_through_it_by_every_other():
    out, _ = _board_ranks(5, absent={3}, timeout=0.5, call=lambda g: g.barrier(what="end of net round 1 of 4"))
    assert set(out) == {0, 1, 2, 4}
    assert out[0] == "rank 3 on node3 did not answer the end of net round 1 of 4 within 0.5 s (died or hangs)"
    for r in (1, 2, 4):
        assert out[r] == out[0] + " (found by rank 0)"


def test_rank_0_missing_at_an_all_gather_is_named_by_the_others_after_rank_0_s_own_wait(monkeypatch):
    """The others wait CONFIRM_S longer than rank 0 would, so that rank 0 names a missing rank first."""
    import time as _t

    monkeypatch.setattr(ranks, "CONFIRM_S", 0.7)

    t0 = _t.monotonic()
    out, _ = _board_ranks(3, absent={0}, timeout=0.3)
    took = _t.monotonic() - t0
    for r in (1, 2):
        assert out[r].startswith(f"rank 0 on node0 did not answer the all-gather within {0.3 + ranks.CONFIRM_S:g} s "
                                 "(died or hangs)"), out[r]  # or told so by the other
    assert 0.7 + 0.3 <= took < 0.7 + 10


@pytest.mark.parametrize("junk", [b"[1]\n", b'"str"\n', b'{"op": "add", "k": "x", "v": 1e400}\n',
                                  b'{"op": "peek", "ks": 5, "p": "a", "e": 5}\n', b'{"op": "get", "ks": ["x"], "t": NaN}\n',
                                  b"\xff\xfe\n", b"not json\n", b"[" * 3000 + b"\n"])
def test_the_store_closes_a_connection_that_sends_junk_and_serves_on(junk):
    """Rank 0's store (gpubench's own) takes one JSON request object a line; anything else on its
    port (another program, a scanner) has that connection closed, no thread's traceback on rank
    0's stderr, and the store serves the group on."""
    import socket
    import threading

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    raised: list = []
    old_hook = threading.excepthook
    threading.excepthook = lambda args: raised.append(args.exc_value)
    store = ranks._Store("127.0.0.1", port, True, 5.0)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            c.sendall(junk)
            assert c.recv(100) == b""  # closed, nothing answered
        store.set("k", "v", 5.0)
        assert store.get_any(["k"], 5.0) == ("k", "v")
    finally:
        store.close(0.0)
        threading.excepthook = old_hook
    assert raised == []


def test_the_store_reads_no_request_line_beyond_its_limit(monkeypatch):
    """A line with no end is read at most _MAX_LINE + 1 bytes into memory, then the connection is
    closed: a host that reaches the port cannot make rank 0 hold what it sends."""
    import socket

    monkeypatch.setattr(ranks, "_MAX_LINE", 1 << 16)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = ranks._Store("127.0.0.1", port, True, 5.0)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            sent = 0
            with pytest.raises(OSError):  # reset by the closed peer, long before 64 MiB went
                while sent < 64 << 20:
                    sent += c.send(b"x" * (1 << 16))
                c.recv(1)
                raise ConnectionResetError
        assert sent < 16 << 20, sent
        store.set("k", "v", 5.0)
        assert store.get_any(["k"], 5.0) == ("k", "v")
    finally:
        store.close(0.0)


def test_the_store_serves_each_rank_and_a_few_more_connections_and_a_newcomer_takes_a_silent_ones_place():
    """Each connection may hold a request line of up to _MAX_LINE in rank 0's memory, so rank 0's
    store serves at most its clients' count at once (a rank each, and a few more). When every slot
    is taken, a newcomer takes the place of the oldest connection that has sent no whole request
    line (idle or trickling: not a rank), so such connections cannot keep a rank from joining; a
    newcomer finding every slot held by clients that spoke is closed at once."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = ranks._Store("127.0.0.1", port, True, 5.0, max_clients=3)  # this client is one
    store.set("k", "v", 5.0)  # this client has spoken
    conns = []
    try:
        idle = socket.create_connection(("127.0.0.1", port), timeout=5)
        trickle = socket.create_connection(("127.0.0.1", port), timeout=5)
        trickle.sendall(b'{"op": "get", ')  # no end of line: still silent
        conns += [idle, trickle]
        time.sleep(0.2)  # both are served before the next one comes
        rank = socket.create_connection(("127.0.0.1", port), timeout=5)
        conns.append(rank)
        assert idle.recv(10) == b""  # the oldest silent one made room
        rank.sendall(b'{"op": "get", "ks": ["k"]}\n')
        assert json.loads(rank.makefile("rb").readline()) == {"ok": True, "k": "k", "v": "v"}
        trickle.sendall(b'"ks": ["k"]}\n')  # its line ends: it spoke, and is served
        assert json.loads(trickle.makefile("rb").readline())["v"] == "v"
        flood = socket.create_connection(("127.0.0.1", port), timeout=5)
        conns.append(flood)
        assert flood.recv(10) == b""  # every slot is held by a client that spoke
        assert store.get_any(["k"], 5.0) == ("k", "v")
    finally:
        for c in conns:
            c.close()
        store.close(0.0)


def test_the_store_closes_a_connection_that_sends_nothing_within_its_first_request_deadline(monkeypatch):
    """A connection to rank 0's store that sends no request line within STORE_FIRST_REQUEST_S is
    closed and frees its slot; a client that spoke is served however long it then waits."""
    import socket

    monkeypatch.setattr(ranks, "STORE_FIRST_REQUEST_S", 0.3)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = ranks._Store("127.0.0.1", port, True, 5.0, max_clients=2)
    store.set("k", "v", 5.0)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as idle:
            t0 = time.monotonic()
            assert idle.recv(10) == b""
            assert 0.2 < time.monotonic() - t0 < 4.0
        time.sleep(0.5)  # past the deadline: the store's own client (it spoke) is still served
        assert store.get_any(["k"], 5.0) == ("k", "v")
    finally:
        store.close(0.0)

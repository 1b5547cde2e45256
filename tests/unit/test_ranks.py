"""core/ranks.discover: each launcher's variables, the order, nesting, and contradictions (exit 2
naming the variable); the Slurm helpers (job and step ids are not rank counts); a group of one;
rendezvous addresses (an IPv6 zone, ASCII ports only); the wording of an abort notice."""

from __future__ import annotations

import pytest

from gpubench.launch import ranks
from gpubench.core.errors import UsageError


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

"""Break-it pass 13 (brk13): rank discovery, net nodes and the rendezvous store, for real.

Every case here failed before its fix (the commit that adds it says how). Processes are real
(mpiexec from the MPICH wheel, torchrun-style environments started by hand), and every test ends
every process it started in a finally.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import psutil
import pytest

from test_deadlines_issue13 import HOST, Lines, _cleanup, _family, _mpi_ranks, _start, _wait_all, _wait_gone
from test_ranks_launch import _alive, _env, _free_port, mpiexec

GPUBENCH = [sys.executable, "-m", "gpubench"]


def _gpubench(args, env, timeout=60):
    return subprocess.run([*GPUBENCH, *args], env=env, capture_output=True, text=True, timeout=timeout)


# ---- 1. rank discovery: one line, exit 2, no traceback ------------------------------------------

@pytest.mark.parametrize("env, named", [
    # Python's int() reads these as numbers; no launcher writes them
    ({"RANK": "\u0661", "WORLD_SIZE": "\u0663"}, "RANK="),          # Arabic-Indic 1 and 3
    ({"RANK": "0", "WORLD_SIZE": "1_0"}, "WORLD_SIZE='1_0' is not an integer"),
    ({"RANK": "+0", "WORLD_SIZE": "2"}, "RANK='+0' is not an integer"),
    # a 30-digit world size made join loop past its deadline (-T 4: still running after 120 s)
    ({"RANK": "0", "WORLD_SIZE": "9" * 30, "MASTER_ADDR": "127.0.0.1"}, "WORLD_SIZE=999999999999... (30 digits) is above"),
    ({"RANK": "0", "WORLD_SIZE": str(2 ** 31), "MASTER_ADDR": "127.0.0.1"}, "WORLD_SIZE=2147483648 is above 1048576"),
    # MASTER_PORT: was "MASTER_PORT 'x:0' is not HOST:PORT", a value the user never wrote
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}, "MASTER_PORT='0' is not a TCP port"),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "\uff12\uff19\uff15\uff10\uff10"},
     "MASTER_PORT="),
])
def test_bad_launcher_values_are_refused(env, named):
    p = _gpubench(["net", "nodes", "-t", "1", "-O", "0", "-T", "4"], _env(**env), timeout=30)
    err = p.stdout + p.stderr
    assert p.returncode == 2, err
    assert named in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_rendezvous_takes_an_ipv6_zone_and_only_ascii_ports():
    from gpubench.core.errors import UsageError
    from gpubench.core.ranks import parse_rendezvous

    assert parse_rendezvous("[fe80::1%eth0]:29500") == ("fe80::1%eth0", 29500)
    with pytest.raises(UsageError):
        parse_rendezvous("node01:\uff12\uff19\uff15\uff10\uff10")


def test_slurm_job_and_step_ids_are_not_rank_counts():
    from gpubench.core.ranks import discover, rendezvous_address

    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "98765432",
           "SLURM_JOB_NODELIST": "gpu[07-08]"}
    me = discover(env)
    assert rendezvous_address(me, None, env) == ("gpu07", 29500 + 98765432 % 1000)


def test_net_nodes_with_one_rank_is_refused():
    """mpiexec -n 1 gpubench net nodes printed two empty tables and exited 0."""
    p = subprocess.run([mpiexec(), "-n", "1", *GPUBENCH, "net", "nodes", "-t", "1", "-O", "0"], env=_env(),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "needs 2 or more ranks" in p.stderr, p.stderr

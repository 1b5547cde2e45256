"""nccl under a launcher, the parts that need no GPU: nccl-tests' -a over per-rank times, the
slowest rank, NCCL's INFO log read back, and the report lines under the table."""

from __future__ import annotations

import pytest

from gpubench.plugins.nccl import log as nccl_log
from gpubench.plugins.nccl.bench import combine
from gpubench.plugins.nccl.ranks import slowest


def test_average_modes_follow_nccl_tests():
    per_rank = [[1.0, 4.0], [2.0, 2.0], [6.0, 3.0]]
    assert combine(per_rank, 0) == [1.0, 4.0]  # rank 0's own
    assert combine(per_rank, 1) == [3.0, 3.0]  # sum / ranks
    assert combine(per_rank, 2) == [1.0, 2.0]
    assert combine(per_rank, 3) == [6.0, 4.0]
    assert combine([], 1) == []
    with pytest.raises(ValueError, match="numbers of samples"):
        combine([[1.0], [1.0, 2.0]], 1)
    with pytest.raises(ValueError):
        combine(per_rank, 4)


def test_slowest_rank_against_the_median():
    s = slowest([{"rank": 0, "host": "a", "time_s": 1.0}, {"rank": 1, "host": "b", "time_s": 1.5},
                 {"rank": 2, "host": "c", "time_s": 1.0}])
    assert s["rank"] == 1 and s["host"] == "b" and s["above_median"] == pytest.approx(0.5)
    assert slowest([{"rank": 0, "host": "a", "time_s": 1.0}]) is None


LOG = """\
vm:100:100 [0] NCCL INFO Bootstrap: Using eth0:10.0.0.2<0>
vm:100:100 [0] NCCL INFO NCCL version 2.28.3+cuda13.0
vm:100:120 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so.
vm:100:120 [0] NCCL INFO NET/IB : No device found.
vm:100:120 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>
vm:100:120 [0] NCCL INFO Using network Socket
vm:100:120 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
vm:100:120 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read
vm:100:120 [0] NCCL INFO Channel 00/0 : 1[1] -> 0[0] [send] via NET/Socket/0
garbage line without the marker
"""


def test_info_log_parsed():
    log = nccl_log.parse(LOG.splitlines())
    assert log.version == "2.28.3+cuda13.0"
    assert log.network == "Socket" and log.plugin == "none"
    assert log.interfaces == ["Socket [0]eth0:10.0.0.2<0>"]
    assert log.paths == {"0->1": ["P2P/CUMEM/read"], "1->0": ["NET/Socket/0"]}
    line = nccl_log.summary_line([log.to_dict(), None], 2)
    assert line.startswith("NCCL 2.28.3+cuda13.0; network Socket (no net plugin loaded) over Socket [0]eth0")
    assert "NET/Socket/0 x1" in line and "P2P/CUMEM/read x1" in line
    plug = nccl_log.parse(["h:1:1 [0] NCCL INFO NET/Plugin: Loaded net plugin FastSocket (v7)",
                           "h:1:1 [0] NCCL INFO Using network FastSocket"])
    assert nccl_log.summary_line([plug.to_dict()], 1) == \
        "NCCL ?; network FastSocket (plugin FastSocket (v7)); 1 rank: no peer paths"
    assert nccl_log.summary_line([None], 1) == "NCCL's INFO log was not captured"


# NCCL 2.28.9 on the lent H200 (no IB device), from the GPU run of benchmarks/nccl_launchers.sh
H200_LOG = """vm:736:736 [0] NCCL INFO ENV/Plugin: Could not find: libnccl-env.so
vm:736:736 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
vm:736:736 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so
vm:736:736 [0] NCCL INFO NET/IB : No device found.
vm:736:736 [0] NCCL INFO NET/IB : Using [RO]; OOB eth0:192.0.2.2<0>
vm:736:736 [0] NCCL INFO Failed to initialize NET plugin IB
vm:736:736 [0] NCCL INFO NET/Socket : Using [0]eth0:192.0.2.2<0>
vm:736:736 [0] NCCL INFO Initialized NET plugin Socket
vm:736:736 [0] NCCL INFO Assigned NET plugin Socket to comm
vm:736:736 [0] NCCL INFO Using network Socket
vm:736:736 [0] NCCL INFO Channel 00/64 : 0
"""


def test_h200_log_drops_the_failed_ib_plugin():
    log = nccl_log.parse(H200_LOG.splitlines())
    assert (log.version, log.network, log.plugin) == ("2.28.9+cuda13.0", "Socket", "none")
    assert log.interfaces == ["Socket [0]eth0:192.0.2.2<0>"] and log.paths == {}
    assert nccl_log.summary_line([log.to_dict()], 1) == (
        "NCCL 2.28.9+cuda13.0; network Socket (no net plugin loaded) over Socket [0]eth0:192.0.2.2<0>; "
        "1 rank: no peer paths")


def test_capture_respects_the_users_nccl_debug(tmp_path):
    env = {"NCCL_DEBUG": "WARN"}
    c = nccl_log.capture(env)
    assert c.path is None and "NCCL_DEBUG" in c.reason and env == {"NCCL_DEBUG": "WARN"}
    env = {}
    c = nccl_log.capture(env)
    try:
        assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_FILE"] == c.path and "%" not in c.path
        with open(c.path, "w") as f:
            f.write(LOG)
        assert c.read().network == "Socket"
    finally:
        c.remove()


def test_report_lines_escape_peer_strings():
    from gpubench.plugins.nccl.command import _launch_lines
    from gpubench.core.result import Record, Result

    rec = Record(params={"collective": "all-reduce", "nbytes": 1024, "dtype": "float", "placement": "out-of-place",
                         "nranks": 2}, metric="bandwidth", nbytes=1024, samples_s=[1e-5], reps=1,
                 extra={"per_rank": [{"rank": 0, "host": "a", "time_s": 1e-5, "gpus": [{"device": 0, "pci_bus_id": "0000:1b:00.0"}]},
                                     {"rank": 1, "host": "b\x1b[31m", "time_s": 2e-5,
                                      "gpus": [{"device": 0, "pci_bus_id": "0000:2b:00.0"}]}]})
    res = Result(command="nccl", spec={"average": 1}, timing={}, records=[rec],
                 env={"launch": {"launcher": "pmi", "processes": 2, "nodes": 2, "gpus_per_proc": 1, "nranks": 2,
                                 "transport": "mpi", "bootstrap": "unique id broadcast"},
                      "nccl_log": {"summary": "NCCL 2.28.3; network Socket\x07", "captured": True}})
    lines = _launch_lines(res)
    assert lines[0].startswith("Launched by pmi: 2 process(es) on 2 node(s)")
    assert "rank 1 on b" in lines[1] and "\x1b" not in lines[1] and "+33.3% against the median rank" in lines[1]
    assert lines[2].startswith("NCCL transport: NCCL 2.28.3; network Socket") and "\x07" not in lines[2]


def test_unique_id_survives_the_json_group():
    import json

    from gpubench.plugins.nccl.ranks import uid_from_wire, uid_to_wire

    raw = bytes(range(128))
    assert uid_from_wire(json.loads(json.dumps(uid_to_wire(raw)))) == raw
    old = tuple(range(-64, 64))
    assert uid_from_wire(json.loads(json.dumps(uid_to_wire(old)))) == old


@pytest.mark.parametrize("given", [bytes(range(16)), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f",
                                   "000102030405060708090A0B0C0D0E0F"])
def test_a_gpu_uuid_reads_as_nvml_writes_it_from_bytes_or_text(given):
    from gpubench.plugins.nccl.ranks import _uuid_text

    assert _uuid_text(given) == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"


@pytest.mark.parametrize("given", [None, b"short", "GPU-xyz", 7])
def test_a_gpu_uuid_that_is_not_one_is_none(given):
    from gpubench.plugins.nccl.ranks import _uuid_text

    assert _uuid_text(given) is None


@pytest.mark.parametrize("local_rank", [0, 1, 2])
def test_every_rank_of_a_node_with_too_few_gpus_refuses_alike(monkeypatch, local_rank):
    """Three ranks on a node with two GPUs: every one of them, not only the rank past the last GPU,
    refuses with the same line (none waits in the all-gather for a rank that stopped)."""
    from types import SimpleNamespace

    from gpubench.core.errors import UsageError
    from gpubench.launch.ranks import Rank
    from gpubench.plugins.nccl import bench as N
    from gpubench.plugins.nccl import ranks as nccl_ranks

    monkeypatch.setattr(nccl_ranks.gpu, "device_count", lambda: 2)
    me = Rank(rank=4 + local_rank, size=6, local_rank=local_rank, local_size=3, node=1, host="node1",
              launcher="openmpi")
    plugin = nccl_ranks.NcclRanks(SimpleNamespace(me=me, size=6), nccl_log.Capture(None, "not captured"))
    with pytest.raises(UsageError) as e:
        plugin.devices(N.NcclSpec())
    assert e.value.message == "3 ranks on node1 with 1 GPU(s) each need GPUs 0..2, but 2 are visible"
    monkeypatch.setattr(nccl_ranks.gpu, "device_count", lambda: 3)
    assert plugin.devices(N.NcclSpec()) == (local_rank,)

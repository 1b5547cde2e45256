"""The UCX engine of `gpubench net --protocol ucx` without a transfer: -m's forms, the payload,
what ucp_ep_print_info prints read as data, the latency sweep, and the server's checks of a request."""

from __future__ import annotations

import pytest

from gpubench.core.errors import UsageError
from gpubench.plugins.net import ucx
from gpubench.plugins.net.ucx_bench import UcxSpec
from gpubench.plugins.net.ucx_server import check_request

EP_INFO = """#
# UCP endpoint
#
#               peer: <no debug data>
#                 lane[0]:  2:sysv/memory.0 md[2]           -> md[2]/sysv/sysdev[255] seg 4294967295 am
#                 lane[1]:  4:cma/memory.0 md[4]            -> md[4]/cma/sysdev[255] seg 4294967295 rma_bw#0
#                 lane[2]:  6:tcp/lo.0 md[1]      -> md[1]/tcp/sysdev[255] rma_bw#1 am_bw#0
#                 lane[3]:  1:cuda_copy/cuda.0 md[0] -> md[0]/cuda_copy/sysdev[255] seg 0 rma_bw#2
#
# +--------------------------------+----------------------------------------------------------------------+
# | ucp_context_0 intra-node cfg#0 | tagged message by ucp_tag_send*(fast-completion) from host memory    |
# +--------------------------------+--------------------------------------------------------+-------------+
# |                          0..92 | eager short                                            | tcp/lo      |
# +--------------------------------+--------------------------------------------------------+-------------+
# | ucp_context_0 intra-node cfg#0 | tagged message by ucp_tag_send* from host memory        |
# +--------------------------------+-------------------------------------------+-------------+
# |                          0..92 | eager short                               | sysv/memory |
# |                       93..8191 | eager copy-in copy-out                    | sysv/memory |
# |                        8K..inf | (?) rendezvous zero-copy read from remote | cma/memory  |
# +--------------------------------+-------------------------------------------+-------------+
# | ucp_context_0 intra-node cfg#0 | tagged message by ucp_tag_send* from cuda/GPU0            |
# +--------------------------------+-------------------------------------------+-------------+
# |                          0..1M | rendezvous pipeline cuda_copy             | cuda_copy/cuda |
# |                        1M..inf | rendezvous zero-copy                      | cuda_ipc/cuda |
# +--------------------------------+-------------------------------------------+-------------+
"""


@pytest.mark.parametrize("text, want", [("host", ("host", "host")), ("cuda", ("cuda", "cuda")),
                                        ("cuda,host", ("cuda", "host")), (" HOST , cuda ", ("host", "cuda"))])
def test_memory_is_one_type_for_both_sides_or_send_comma_recv(text, want):
    assert ucx.parse_memory(text) == want


@pytest.mark.parametrize("text", ["bogus", "", "host,cuda,host", "cuda-managed", "host;cuda"])
def test_memory_refuses_what_ucx_perftest_would_not_take_here(text):
    with pytest.raises(UsageError, match="is not a memory type"):
        ucx.parse_memory(text)


def test_the_payload_is_never_zero_so_a_zeroed_receive_buffer_shows_what_did_not_arrive():
    p = ucx.pattern(10_000)
    assert p.dtype.name == "uint8" and p.size == 10_000 and int(p.min()) >= 1
    assert ucx.first_mismatch(p, p.copy()) is None
    q = p.copy()
    q[777] = 0
    assert ucx.first_mismatch(q, p) == 777


def test_endpoint_info_gives_each_lane_and_the_plain_send_protocol_per_size_and_memory():
    info = ucx.parse_endpoint_info(EP_INFO)
    assert [(ln["transport"], ln["device"], ln["roles"]) for ln in info["lanes"]] == [
        ("sysv", "memory", "am"), ("cma", "memory", "rma_bw#0"), ("tcp", "lo", "rma_bw#1 am_bw#0"),
        ("cuda_copy", "cuda", "rma_bw#2")]
    # the fast-completion variant (tcp here) is not the one a plain tag send uses
    assert ucx.carried_by(info, 8)["via"] == "sysv/memory"
    assert ucx.carried_by(info, 8192) == {"memory": "host", "first": 8192, "last": None, "remote_decides": True,
                                          "protocol": "rendezvous zero-copy read from remote", "via": "cma/memory"}
    assert "remote_decides" not in ucx.carried_by(info, 100)  # no "(?)" on that row
    assert ucx.carried_by(info, 2**20 - 1, "cuda")["via"] == "cuda_copy/cuda"
    assert ucx.carried_by(info, 64 * 2**20, "cuda")["via"] == "cuda_ipc/cuda"
    assert ucx.carried_by(info, 64 * 2**20, "cuda")["device"] == "GPU0"  # "from cuda/GPU0": no " memory"
    assert "device" not in ucx.carried_by(info, 8)
    assert ucx.parse_endpoint_info("") == {"lanes": [], "protocols": []}
    assert ucx.parse_endpoint_info(EP_INFO, api="stream")["protocols"] == []


def test_the_latency_sweep_doubles_from_8_bytes_and_ends_at_l():
    assert UcxSpec("h", 1, nbytes=64).sizes() == [8, 16, 32, 64]
    assert UcxSpec("h", 1, nbytes=100).sizes() == [8, 16, 32, 64, 100]
    assert UcxSpec("h", 1, nbytes=3).sizes() == [3]


GOOD = {"gpubench_net_ucx": 1, "mode": "bw", "api": "tag", "nbytes": 1024, "in_flight": 32, "memory": "host",
        "address": "00ff"}


@pytest.mark.parametrize("change, fragment", [
    ({"gpubench_net_ucx": 2}, "version"), ({"mode": "both"}, "bad mode"), ({"api": "am"}, "bad api"),
    ({"nbytes": 0}, "bad nbytes"), ({"nbytes": 2**31}, "bad nbytes"), ({"nbytes": 1.5}, "bad nbytes"),
    ({"in_flight": 5000}, "bad in_flight"), ({"memory": "rocm"}, "bad memory"), ({"address": "zz"}, "bad address"),
    ({"pinned": "yes"}, "bad pinned"), ({"pinned": 1}, "bad pinned"),
    ({"address": ""}, "bad address"),
])
def test_the_server_refuses_a_bad_request_naming_the_field(change, fragment):
    assert check_request(GOOD)["nbytes"] == 1024
    with pytest.raises(UsageError, match=fragment):
        check_request({**GOOD, **change})


def test_host_buffers_are_page_locked_only_beside_gpu_memory_and_pageable_where_cupy_sees_no_gpu():
    assert ucx.host_buffers(("cuda", "host")) and ucx.host_buffers(("host", "cuda")) and ucx.host_buffers(("cuda", "cuda"))
    assert not ucx.host_buffers(("host", "host"))
    buf = ucx.alloc(4096, "host", pinned=True, fill=ucx.pattern(4096))  # no GPU here: pageable, same contents
    assert ucx.first_mismatch(buf, ucx.pattern(4096)) is None
    assert ucx.is_pinned(buf) is _gpu_visible() and not ucx.is_pinned(ucx.alloc(4096, "host"))
    assert check_request(dict(GOOD))["pinned"] is False  # an older client's request: pageable


def _gpu_visible() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False

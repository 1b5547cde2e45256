"""The fleet rule, the net schedules, the checks read from saved results and the fleet object, as
pure functions on records (the real runs are in tests/cli/test_fleet_launch.py)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from gpubench.validation import fleet
from gpubench.validation import suite
from gpubench.plugins.net import fleet as net_fleet
from gpubench.core.errors import UsageError
from gpubench.core.result import Record, Result, load

DATA = Path(__file__).resolve().parents[1] / "data"


# ---- the rule ----

def test_median_and_mad():
    assert fleet.median([3, 1, 2]) == 2
    assert fleet.median([4, 1, 3, 2]) == 2.5
    assert fleet.mad([1, 2, 3, 4, 100]) == 1  # |x - 3| = 2 1 0 1 97 -> median 1
    with pytest.raises(ValueError):
        fleet.median([])


def test_modified_z_is_iglewicz_hoaglin():
    xs = [10.0, 10.2, 9.8, 10.1, 9.9, 5.0]
    m, d = fleet.median(xs), fleet.mad(xs)
    assert fleet.modified_z(5.0, xs) == pytest.approx(0.6745 * (5.0 - m) / d)
    assert fleet.modified_z(3.0, [5, 5, 5, 3]) == -math.inf


@pytest.mark.parametrize("value, values, want", [
    (2.0, [10, 10, 2], "slow"),                       # MAD 0: everyone else identical
    (9.8, [10, 9.9, 9.8], "ok"),                      # within 5 % of the median
    (9.0, [10, 11, 9, 10.5], "ok"),                   # 10 % below, but the fleet is that noisy
    (9.0, [10.0, 10.01, 9.99, 10.02, 9.98, 9.0], "slow"),  # 10 % below a tight fleet
    (0.2, [20, 22, 25, 24, 0.2, 0.2], "slow"),        # two outliers inflate the MAD: the gross bound
    (1.0, [10, 1], "slow"),                           # below half the median of two (5.5)
    (8.0, [10, 8], "ok"),                             # two nodes: the MAD score cannot pick one
    (5.0, [5], "ok"),                                 # alone: nothing to compare with
    (12.0, [10, 10, 12], "ok"),                       # faster is never slow
])
def test_flag(value, values, want):
    assert fleet.flag(value, values) == want


# ---- schedules ----

def _check_rounds(rounds):
    for r in rounds:
        nodes = [x for e in r for x in e]
        assert len(nodes) == len(set(nodes)), r  # no node twice in a round


@pytest.mark.parametrize("n", range(2, 10))
def test_all_pairs_every_ordered_pair_once(n):
    rounds = net_fleet.schedule(list(range(n)), "all")
    _check_rounds(rounds)
    edges = [e for r in rounds for e in r]
    assert sorted(edges) == sorted(itertools.permutations(range(n), 2))
    # circle method: n-1 rounds for even n, n for odd n, each played in both directions
    assert len(rounds) == 2 * (n - 1 if n % 2 == 0 else n)


@pytest.mark.parametrize("n", range(2, 10))
def test_ring(n):
    rounds = net_fleet.schedule(list(range(n)), "ring")
    _check_rounds(rounds)
    edges = sorted(e for r in rounds for e in r)
    assert edges == sorted(((i, (i + 1) % n) for i in range(n)) if n > 2 else [(0, 1), (1, 0)])
    assert len(rounds) == (2 if n % 2 == 0 else 3)


@pytest.mark.parametrize("n", [*range(2, 40), 64, 999, 1000, 10_000])
def test_rings_every_node_sends_to_two_and_receives_from_two_in_four_or_five_rounds(n):
    rounds = net_fleet.schedule(list(range(n)), "rings")
    _check_rounds(rounds)
    edges = [e for r in rounds for e in r]
    assert len(edges) == len(set(edges))
    if n <= 4:  # no second ring differs from the first: every ordered pair
        assert sorted(edges) == sorted(itertools.permutations(range(n), 2)) and len(rounds) == (2 if n == 2 else 6)
        return
    s = net_fleet.stride(n) or n - 1
    assert sorted(edges) == sorted([(i, (i + 1) % n) for i in range(n)] + [(i, (i + s) % n) for i in range(n)])
    assert math.gcd(s, n) == 1 and s not in (1, 2) and (n == 6 or (s != n - 1 and (2 * s - 2) % n))
    assert len(rounds) == (4 if n % 2 == 0 else 5)


def test_rings_stride_is_far_in_rank_order():
    assert [net_fleet.stride(n) for n in (5, 6, 7, 8, 12, 1000)] == [3, None, 3, 3, 5, 499]


def test_many_to_one_and_members():
    assert net_fleet.schedule([0, 2, 5], to=5) == [[(0, 5), (2, 5)]]
    assert net_fleet.schedule([0, 2, 5], "ring") == [[(0, 2)], [(2, 5)], [(5, 0)]]
    with pytest.raises(UsageError, match="--to 3 is not a rank taking part"):
        net_fleet.schedule([0, 1, 2], to=3)
    assert net_fleet.schedule([0, 2, 5, 7], "rings") == net_fleet.schedule([0, 2, 5, 7], "all")
    with pytest.raises(UsageError, match="--pairs 'star'"):
        net_fleet.schedule([0, 1], "star")
    assert net_fleet.schedule([4], "ring") == [] and net_fleet.schedule([4], "all") == []


def test_advertised_address():
    assert net_fleet.advertised("10.1.2.3", {}) == "10.1.2.3"
    assert net_fleet.advertised("0.0.0.0", {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1234"}) == "127.0.0.1"


# ---- checks read from saved results ----

def test_checks_of_copy_p2p_nccl_merge_net():
    copy = fleet.checks_of(load(DATA / "copy-pinned-h200.json"))
    assert [c["check"] for c in copy] == ["copy d2h pinned 1GiB", "copy h2d pinned 1GiB"]
    assert all(c["gpu"] == 0 and c["unit"] == "GB/s" and 40 < c["value"] < 60 for c in copy)
    p2p = fleet.checks_of(load(DATA / "p2p-h200x2.json"))
    assert {c["check"] for c in p2p} >= {"p2p write GPU0->GPU1", "p2p read GPU1->GPU0"}
    nccl = fleet.checks_of(load(DATA / "nccl-h200x2.json"))
    assert [c["check"] for c in nccl] == ["nccl all-reduce busbw 1GiB 2 GPUs"] and nccl[0]["value"] > 100
    merge = fleet.checks_of(load(DATA / "merge-cpu.json"))
    assert merge[0]["check"] == "merge cpu throughput" and merge[0]["value"] > 0
    net = fleet.checks_of(load(DATA / "net-local.json"))
    assert net[0]["unit"] == "Gbit/s" and net[0]["check"].startswith("net loopback")


def test_expectations_attach_and_fail():
    res = load(DATA / "copy-pinned-h200.json")
    exps = suite.parse_expectations({"expect": [
        {"command": "copy", "where": {"direction": "h2d", "nbytes": 2**30}, "min_gbps": 1000.0},
        {"command": "copy", "where": {"direction": "d2h", "nbytes": 2**30}, "min_gbps": 1.0},
        {"command": "copy", "where": {"direction": "h2d", "nbytes": 4096}, "min_gbps": 1000.0, "name": "small"},
    ]})
    checks = fleet.attach_expectations(fleet.checks_of(res), suite.evaluate(exps, [res]))
    by = {c["check"]: c for c in checks}
    assert by["copy h2d pinned 1GiB"]["expect"] == 1000.0 and by["copy h2d pinned 1GiB"]["expect_status"] == "fail"
    assert by["copy d2h pinned 1GiB"]["expect_status"] == "pass"
    assert by["expect 3: small"]["expect_status"] == "fail"  # a figure the fleet does not track, still a row


# ---- the fleet object ----

def _payload(rank, host, values, gpus=2):
    checks = [{"check": "copy h2d pinned 1GiB", "gpu": g, "value": v, "unit": "GB/s", "command": "copy",
               "params": {}, "expect": None, "expect_status": None} for g, v in zip(range(gpus), values)]
    return {"rank": rank, "host": host, "gpus": [{"index": g, "uuid": f"GPU-{rank}-{g}"} for g in range(gpus)],
            "checks": checks}


def _links(values):
    """A net-between-nodes Result over three nodes with these ring Gbit/s."""
    recs = []
    for (a, b), g in zip([(0, 1), (1, 2), (2, 0)], values):
        recs.append(Record(params={"src": a, "dst": b, "stream": "total"}, nbytes=1, samples_s=[1.0],
                           extra={"gbit_per_s": g, "src_host": f"n{a}", "dst_host": f"n{b}", "round": a}))
    m = net_fleet.matrix([0, 1, 2], recs)
    return Result(command="net", spec={"mode": "fleet", "pairs": "ring", "to": None, "streams": 1, "seconds": 1.0},
                  timing={"matrix": {"hosts": ["n0", "n1", "n2"], "gbps": m}}, records=recs)


def test_build_fleet_shape_and_flags():
    payloads = [_payload(0, "n0", [55.0, 55.2]), _payload(1, "n1", [55.1, 30.0]), None, _payload(3, "n3", [55.3, 55.0])]
    links = _links([20.0, 0.2, 21.0])
    f = fleet.build_fleet(payloads, ["n0", "n1", "n2", "n3"], links)
    assert f["kind"] == "gpubench-fleet" and f["version"] == 1 and set(f["rule"]) == {"name", "text"}
    assert f["missing"] == [{"rank": 2, "host": "n2"}]
    keys = {"host", "rank", "gpu", "uuid", "check", "value", "unit", "fleet_median", "expect", "expect_op", "flag"}
    assert all(set(r) == keys for r in f["rows"])
    slow = [(r["host"], r["gpu"], r["uuid"]) for r in f["rows"] if r["flag"] == "slow"]
    assert ("n1", 1, "GPU-1-1") in slow and ("n1", None, None) in slow  # GPU 1 of n1, and the link n1 -> n2
    assert [r["check"] for r in f["rows"] if r["flag"] == "slow" and r["gpu"] is None] == ["net to n2 (rank 2)"]
    assert [r["rank"] for r in f["rows"] if r["flag"] == "missing"] == [2]
    assert {k: v for k, v in f["links"].items() if k != "culprits"} == {
        "hosts": ["n0", "n1", "n2"], "gbps": [[None, 20.0, None], [None, None, 0.2], [21.0, None, None]]}
    # the ring cannot tell n1 sending from n2 receiving or the path: said, with the link
    (c,) = f["links"]["culprits"]
    assert c["kind"] == "unresolved" and c["ranks"] == [1, 2] and c["confidence"] == 1.0
    line = fleet.verdict(f)
    assert "n1 (rank 1) GPU 1" in line and "n2 (rank 2)" in line and "missing" in line
    assert line.endswith("; named: n1 -> n2 (rank 1 -> 2) is slow (sender, receiver or path) (1.00)")


def _render(renderables) -> str:
    from gpubench.core import report

    c = report.console()
    c.width = 220
    with c.capture() as cap:
        for r in renderables:
            c.print(r)
    return cap.get()


def test_expect_column_shows_the_deciding_bound_with_its_unit():
    """Two [[expect]] tables match every link (min 1000 and min 5 GB/s) and a link runs at 10 GB/s:
    the row fails against 1000, so its expect is 1000 GB/s = 8000 Gbit/s (not the last table's
    5 x 8 = 40), and the table says ">= 8000.0 Gbit/s"."""
    recs = [Record(params={"src": a, "dst": b, "stream": "total"}, nbytes=10 * 10**9, samples_s=[1.0],
                   extra={"gbit_per_s": 80.0, "src_host": f"n{a}", "dst_host": f"n{b}", "round": a})
            for a, b in [(0, 1), (1, 2), (2, 0)]]
    links = Result(command="net", spec={"mode": "fleet", "pairs": "ring", "to": None, "streams": 1, "seconds": 1.0},
                   timing={"matrix": {"hosts": ["n0", "n1", "n2"], "gbps": net_fleet.matrix([0, 1, 2], recs)}},
                   records=recs)
    for order in ([1000.0, 5.0], [5.0, 1000.0]):
        exps = suite.parse_expectations({"expect": [{"command": "net", "where": {"stream": "total"}, "min_gbps": g}
                                                    for g in order]})
        f = fleet.build_fleet([_payload(r, f"n{r}", [50.0]) for r in range(3)], ["n0", "n1", "n2"], links,
                              suite.evaluate(exps, [links]))
        net_rows = [r for r in f["rows"] if r["check"].startswith("net to ")]
        assert len(net_rows) == 3
        assert all(r["flag"] == "fail" and r["expect"] == 8000.0 and r["expect_op"] == ">=" for r in net_rows)
        text = _render(fleet.format_report(f))
        assert ">= 8000.0 Gbit/s" in text and "40.00" not in text
    # both pass: the strictest (the least margin) is shown
    exps = suite.parse_expectations({"expect": [{"command": "net", "where": {"stream": "total"}, "min_gbps": g}
                                                for g in (5.0, 9.0, 2.0)]})
    f = fleet.build_fleet([_payload(0, "n0", [50.0])], ["n0", "n1", "n2"], links, suite.evaluate(exps, [links]))
    assert {(r["expect"], r["flag"]) for r in f["rows"] if r["check"].startswith("net to ")} == {(72.0, "ok")}


def test_node_check_expect_is_the_failing_bound():
    res = load(DATA / "copy-pinned-h200.json")
    exps = suite.parse_expectations({"expect": [
        {"command": "copy", "where": {"direction": "h2d", "nbytes": 2**30}, "min_gbps": 1000.0},
        {"command": "copy", "where": {"direction": "h2d", "nbytes": 2**30}, "min_gbps": 1.0},
        {"command": "copy", "where": {"direction": "d2h", "nbytes": 2**30}, "max_us": 1.0},
    ]})
    by = {c["check"]: c for c in fleet.attach_expectations(fleet.checks_of(res), suite.evaluate(exps, [res]))}
    h2d = by["copy h2d pinned 1GiB"]
    assert (h2d["expect"], h2d["expect_op"], h2d["expect_status"]) == (1000.0, ">=", "fail")


def test_everything_ok_passes():
    f = fleet.build_fleet([_payload(0, "a", [50.0, 50.5]), _payload(1, "b", [50.2, 50.1])], ["a", "b"])
    assert fleet.verdict(f) is None and all(r["flag"] == "ok" for r in f["rows"])


def test_hostile_host_names_are_shown_inert():
    from gpubench.core import report

    evil = "\x1b[2J[bold red]pwn[/]\n| x"
    f = fleet.build_fleet([_payload(0, evil, [50.0, 10.0]), _payload(1, "b", [50.0, 50.0])], [evil, "b"])
    line = fleet.verdict(f)
    assert "\x1b" not in line and "\n" not in line
    c = report.console()
    with c.capture() as cap:
        for r in fleet.format_report(f):
            c.print(r)
    text = cap.get()
    assert "\x1b[2J" not in text and "[bold red]pwn[/]" in text  # markup shown as written


def test_net_report_names_the_slow_sender():
    links = _links([20.0, 0.2, 21.0])
    lines = net_fleet.slow_summary(links)
    assert lines and lines[0].startswith("SLOW link n1 -> n2 (rank 1 -> 2)")
    assert net_fleet.verdict(links).startswith("1 link(s) flagged: n1->n2 (slow)")
    # all pairs where node 1 sends slowly: every flagged link has n1
    recs = [Record(params={"src": a, "dst": b, "stream": "total"}, nbytes=1, samples_s=[1.0],
                   extra={"gbit_per_s": 0.2 if a == 1 else 20.0 + a + b, "src_host": f"n{a}", "dst_host": f"n{b}"})
            for a, b in itertools.permutations(range(3), 2)]
    res = Result(command="net", spec={}, records=recs)
    assert net_fleet.slow_summary(res)[-1].startswith("SLOW SENDER n1 (rank 1): every link out at 1%, 1% of the median")
    assert net_fleet.verdict(res).endswith("; n1 (rank 1) sends slowly (1.00)")


def test_a_link_with_a_stalled_stream_fails_at_a_healthy_rate():
    """net nodes: a link whose test had a stream stalled (a hung receiving worker) is FAIL with the
    streams named, though the other streams carried it to the median; its rate stays in extra."""
    healthy = Record(params={"stream": "total"}, nbytes=1, samples_s=[1.0],
                     extra={"gbit_per_s": 20.0, "stalled_streams": []})
    stalled = Record(params={"stream": "total"}, nbytes=1, samples_s=[1.0],
                     extra={"gbit_per_s": 19.0, "stalled_streams": [2]})
    recs = [net_fleet._link_record(a, b, t, 4) for (a, b), t in zip([(0, 1), (1, 2), (2, 0)], [healthy, stalled, healthy])]
    for r, (a, b) in zip(recs, [(0, 1), (1, 2), (2, 0)]):
        r.extra.update(src_host=f"n{a}", dst_host=f"n{b}")
    res = Result(command="net", spec={}, records=recs)
    assert [f for _, f, _ in net_fleet.link_flags(res)] == ["ok", "fail", "ok"]
    assert recs[1].samples_s == [] and recs[1].extra["gbit_per_s"] == 19.0
    assert net_fleet.slow_summary(res)[0] == ("FAIL link n1 -> n2 (rank 1 -> 2): failed: stream(s) 2 of 4 received "
                                              "nothing for 1 s or more of the counted time (stalled)")
    assert net_fleet.verdict(res).startswith("1 link(s) flagged: n1->n2 (fail)")


def test_flags_agree_with_flag_one_by_one():
    import random

    rng = random.Random(3)
    for k in range(200):
        vals = [rng.choice([10.0, 9.9, 10.1, 5.0, 9.0, 0.2]) * (1 + rng.gauss(0, 0.01 * (k % 5))) for _ in range(k % 9 + 1)]
        vals += [None] if k % 7 == 0 else []
        assert fleet.flags(vals) == [fleet.flag(v, vals) if v is not None else "ok" for v in vals]


def test_round_deadline_is_minus_T_but_never_shorter_than_the_round():
    from gpubench.plugins.net import fleet as net_fleet
    from gpubench.plugins.net.protocol import Request

    s = net_fleet.NetFleetSpec(Request(seconds=10.0, interval=1.0), timeout=15.0)
    # the round covers net's client stall allowance too, so a stopped receiver, not its healthy
    # sender, is the rank named
    assert s.round_work == 10.0 + 1.0 + net_fleet.CLIENT_STALL_S + net_fleet.ROUND_MARGIN_S == 26.0
    assert s.round_timeout == 26.0  # the round is longer than -T
    assert net_fleet.NetFleetSpec(Request(seconds=10.0, interval=1.0), timeout=60.0).round_timeout == 60.0
    assert net_fleet.NetFleetSpec(Request(seconds=2.0, omit=1.0, interval=0.5), timeout=1.0).round_timeout == 18.5


def test_skipped_steps_are_listed_once_per_step_and_reason_with_their_ranks():
    from gpubench.validation import fleet
    from gpubench.validation.suite import Step

    steps = [Step(f"copy [rank {r}]", "copy", "skipped", "no CUDA device is visible") for r in range(10)]
    steps += [Step("net between nodes", "net", "skipped", "one node"), Step("env [rank 0]", "env", "ok"),
              Step("pin [rank 3]", "pin", "skipped", "[red]x[/red]")]
    assert fleet.skipped_lines(steps) == [
        "skipped: copy on ranks 0, 1, 2, 3, 4, 5, 6, 7 (+2 more): no CUDA device is visible",
        "skipped: net between nodes: one node",
        "skipped: pin on rank 3: \\[red]x\\[/red]",
    ]


def test_the_roll_call_names_a_rank_that_stopped_on_a_signal_not_the_rank_it_was_waiting_for():
    """Over the store: rank 1 of 3 stops on SIGTERM and tells the group while rank 0 gathers the
    roll from rank 1: rank 0 names rank 1 as interrupted, with its host, not an internal message."""
    import signal
    import socket

    from gpubench.core.errors import MachineError
    from gpubench.core.signals import Interrupted
    from gpubench.launch import ranks
    from gpubench.validation.fleet import Roll

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stores = [ranks._Store("127.0.0.1", port, r == 0, 5.0) for r in range(2)]
    who = [ranks.Rank(r, 3, r, 3, 0, f"node{r}", "torchrun") for r in range(3)]
    groups = [ranks._StoreGroup(who[r], 5.0, stores[r], "gpubench", "p") for r in range(2)]
    for g in groups:
        g.ranks = who
    try:
        groups[1]._interrupted(Interrupted(signal.SIGTERM))
        with pytest.raises(MachineError) as e:
            Roll(groups[0], 5.0).sync({"rank": 0})
        assert e.value.message == "rank 1 on node1 stopped: interrupted by SIGTERM"
    finally:
        for st in reversed(stores):
            st.close(0.0)

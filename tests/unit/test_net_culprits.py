"""Who is slow between nodes (gpubench.plugins.net.culprits), on a model of a fleet: n nodes with
a sending and a receiving capacity each and a capacity per link, every test of the ``--pairs
rings`` schedule giving min(sender, link, receiver) x (1 + noise) Gbit/s, as records of a real
run, read by the code that reads a real run's result (``net.fleet.culprits``, ``verdict``, the
report). Pure: no sockets. The table of how often each case is named right under noise is
printed (``pytest -s``), with its seed."""

from __future__ import annotations

import random
import time
from typing import Callable

import pytest

from gpubench.core.result import Record, Result
from gpubench.plugins.net import fleet as net_fleet
from gpubench.plugins.net.culprits import Culprit, infer, named

NOMINAL = 100.0  # Gbit/s of a healthy part
SLOW = 0.5  # a slow part's capacity, as a fraction of NOMINAL
SEED = 20261203
SIZES = (8, 64, 1000, 10_000)
NOISE = 0.02  # a few percent: each figure x (1 + N(0, 0.02))
TRIALS = {8: 100, 64: 50, 1000: 8, 10_000: 2}

Model = tuple[dict, dict, dict, set]  # sender caps, receiver caps, link caps, the truth {(kind, ranks)}


def _one_sender(n, edges, rng) -> Model:
    a = rng.randrange(n)
    return {a: SLOW}, {}, {}, {("sender", (a,))}


def _one_receiver(n, edges, rng) -> Model:
    a = rng.randrange(n)
    return {}, {a: SLOW}, {}, {("receiver", (a,))}


def _one_link(n, edges, rng) -> Model:
    e = rng.choice(edges)
    return {}, {}, {e: SLOW}, {("link", e)}


def _adjacent_nodes(n, edges, rng) -> Model:
    a = rng.randrange(n)
    b = (a + 1) % n
    return {a: SLOW, b: SLOW}, {a: SLOW, b: SLOW}, {}, {("node", (a,)), ("node", (b,))}


def _sender_then_receiver(n, edges, rng) -> Model:
    a = rng.randrange(n)
    b = (a + 1) % n
    return {a: SLOW}, {b: SLOW}, {}, {("sender", (a,)), ("receiver", (b,))}


def _uniformly_slow(n, edges, rng) -> Model:
    every = {i: SLOW for i in range(n)}
    return every, dict(every), {}, set()  # relative to each other nothing is slow: --expect's bound catches it


def _healthy(n, edges, rng) -> Model:
    return {}, {}, {}, set()


CASES: dict[str, Callable] = {
    "one slow sender": _one_sender,
    "one slow receiver": _one_receiver,
    "one slow link": _one_link,
    "two slow nodes adjacent in the ring": _adjacent_nodes,
    "slow sender next to slow receiver": _sender_then_receiver,
    "uniformly slow fleet": _uniformly_slow,
    "healthy fleet": _healthy,
}


def _edges(n: int) -> list[tuple[int, int]]:
    return [e for r in net_fleet.schedule(list(range(n)), "rings") for e in r]


def _result(n: int, edges, model: Model, noise: float, rng: random.Random) -> Result:
    """A net-between-nodes Result as rank 0 gathers it: one "total" record per link."""
    send, recv, link, _ = model
    records = []
    for k, (a, b) in enumerate(edges):
        cap = NOMINAL * min(send.get(a, 1.0), recv.get(b, 1.0), link.get((a, b), 1.0))
        g = cap * (1.0 + rng.gauss(0.0, noise)) if noise else cap
        records.append(Record(params={"src": a, "dst": b, "stream": "total"}, nbytes=g * 1e9 / 8,
                              samples_s=[1.0], extra={"gbit_per_s": g, "bytes_per_s": g * 1e9 / 8, "round": k,
                                                      "src_host": f"node{a}", "dst_host": f"node{b}"}))
    return Result(command="net", spec={"mode": "fleet", "pairs": "rings"}, records=records)


def _said(verdicts: list[Culprit]) -> set:
    return {(c.kind, c.ranks) for c in named(verdicts)}


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("case", list(CASES))
def test_each_case_is_named_exactly_without_noise(case, n):
    rng = random.Random(SEED)
    edges = _edges(n)
    model = CASES[case](n, edges, rng)
    verdicts = net_fleet.culprits(_result(n, edges, model, 0.0, rng))
    assert _said(verdicts) == model[3]
    assert all(c.confidence == 1.0 for c in verdicts)  # no spread: the rule's bound is a step


def test_named_right_under_noise_at_8_to_10000_nodes():
    """Prints how often each case is named exactly (every culprit at confidence >= 0.99, nothing
    else) with 2 % Gaussian noise on every figure; each case must be named right in all but 10 %
    of the trials (at least one) at every size. Seeded: the same table every run."""
    rng = random.Random(SEED)
    t0 = time.perf_counter()
    table: dict[str, dict[int, tuple[int, int]]] = {}
    for n in SIZES:
        edges = _edges(n)
        for case, make in CASES.items():
            right = 0
            for _ in range(TRIALS[n]):
                model = make(n, edges, rng)
                right += _said(net_fleet.culprits(_result(n, edges, model, NOISE, rng))) == model[3]
            table.setdefault(case, {})[n] = (right, TRIALS[n])
    took = time.perf_counter() - t0
    print(f"\nnamed right under {NOISE:.0%} Gaussian noise, slow parts at {SLOW:.0%} "
          f"(seed {SEED}, {took:.1f} s); --pairs rings, rounds: "
          + ", ".join(f"n={n}: {len(net_fleet.schedule(list(range(n)), 'rings'))}" for n in SIZES))
    print(f"{'case':<38}" + "".join(f"{'n=' + str(n):>14}" for n in SIZES))
    for case, row in table.items():
        print(f"{case:<38}" + "".join(f"{f'{r}/{t} {r / t:.0%}':>14}" for r, t in row.values()))
    bad = {(case, n): rt for case, row in table.items() for n, rt in row.items() if rt[0] < rt[1] - max(1, rt[1] // 10)}
    assert not bad, bad


def test_report_and_exit_line_name_the_slow_sender():
    """At 8 nodes through build_result, the report and the exit line of a real run."""
    rng = random.Random(SEED)
    edges = _edges(8)
    res = _result(8, edges, ({5: SLOW}, {}, {}, set()), NOISE, rng)
    peers = {i: {"host": f"node{i}", "addr": f"10.0.0.{i + 1}"} for i in range(8)}
    spec = net_fleet.NetFleetSpec(pairs="rings")
    full = net_fleet.build_result(spec, list(range(8)), peers, net_fleet.schedule(list(range(8)), "rings"),
                                  res.records, 10.0)
    assert net_fleet.slow_summary(full)[-1].startswith("SLOW SENDER node5 (rank 5): every link out at")
    assert net_fleet.verdict(full).endswith("; node5 (rank 5) sends slowly (1.00)")


def test_ring_alone_cannot_tell_sender_receiver_or_path():
    figs = {(0, 1): 10.0, (1, 2): 2.0, (2, 3): 10.1, (3, 0): 9.9}
    (c,) = infer(figs, {i: f"n{i}" for i in range(4)})
    assert c.kind == "unresolved" and c.ranks == (1, 2) and c.confidence == 1.0
    assert c.suspects == ("n1 sending", "n2 receiving", "the path between")
    assert "cannot tell them apart; --pairs rings can" in c.line()


def test_a_failed_test_counts_as_low():
    edges = _edges(8)
    figs: dict = {e: 10.0 for e in edges}
    for e in edges:
        if e[0] == 2:
            figs[e] = None
    assert {(c.kind, c.ranks) for c in infer(figs)} == {("sender", (2,))}


def test_a_chance_outlier_among_many_links_is_shown_not_named():
    """One link 3.8 sigma low among 2,000: the rule flags it (its cut is 3.5 sigma), but 2,000
    healthy links give such a figure by chance 15 % of the time: shown, not named."""
    rng = random.Random(7)
    edges = _edges(1000)
    figs = {e: 100.0 * (1 + rng.gauss(0, 0.02)) for e in edges}
    figs[edges[10]] = 100.0 * (1 - 3.8 * 0.02)
    got = infer(figs)
    (c,) = [c for c in got if c.ranks == edges[10]]
    assert c.kind == "link" and c.confidence < 0.99 and named(got) == []


def test_metrics_name_the_slow_node_with_its_confidence():
    """`gpubench metrics` of a rings result: each verdict is a gauge of its confidence labelled with
    the node's host and rank (and for a link the receiving end), so an alert can name the node."""
    from prometheus_client.openmetrics import parser

    from gpubench.analysis import metrics

    rng = random.Random(SEED)
    edges = _edges(8)
    hosts = {2: 'evil"}\nnode2', 5: "node5"}
    res = _result(8, edges, ({2: SLOW}, {}, {(3, 4): SLOW}, set()), 0.0, rng)
    for r in res.records:
        for end, key in (("src", "src_host"), ("dst", "dst_host")):
            r.extra[key] = hosts.get(r.params[end], r.extra[key])
    got = {}
    for fam in parser.text_string_to_metric_families(metrics.build([res]).text().decode()):
        for s in fam.samples:
            if s.name == "gpubench_net_culprit_confidence":
                got[(s.labels["kind"], s.labels["host"], s.labels["rank"], s.labels["peer_host"],
                     s.labels["peer_rank"])] = s.value
    assert got == {("sender", 'evil"}\\nnode2', "2", "", ""): 1.0, ("link", "node3", "3", "node4", "4"): 1.0}


def test_metrics_of_a_net_result_between_two_hosts_have_no_verdict():
    from gpubench.analysis import metrics

    res = Result(command="net", spec={"mode": "client"}, records=[])
    assert b"culprit" not in metrics.build([res]).text()

"""What the fleet asks of net: the loopback step of a node without GPUs and its figure."""

from __future__ import annotations

from typing import Any

from gpubench.core.plugin import FleetStage, StageContext, StageOutcome, StepPlace, SuiteStep
from gpubench.validation.checks import row

# the loopback test of a fleet node without GPUs: 2 streams, 3 s after 1 s omitted, 0.5 s intervals
LOOPBACK: dict[str, Any] = {"streams": 2, "seconds": 3.0, "omit": 1.0, "interval": 0.5}


def suite_steps(place: StepPlace) -> list[SuiteStep]:
    """On a fleet node without GPUs, ``net local`` over loopback; nothing elsewhere."""
    if not place.fleet or place.devices:
        return []
    from gpubench.plugins.net.protocol import Request

    def run(req, progress=None):
        from gpubench.plugins.net import bench

        return bench.run_local(req)

    return [SuiteStep("net loopback", Request(**LOOPBACK), order=45, min_gpus=0, each_rank=True, run=run)]


def fleet_checks(result) -> list[dict]:
    """The loopback total of each stream count (not the links between nodes: the fleet's own step)."""
    return [row(f"net loopback -P {r.params.get('streams')}", result.command, r, r.extra["gbit_per_s"], unit="Gbit/s")
            for r in result.records
            if r.params.get("stream") == "total" and "gbit_per_s" in r.extra and "src" not in r.params]


# The network step of the fleet suite: net's two-ring test between the nodes (docs/fleet.md), short
NET_STREAMS, NET_SECONDS, NET_OMIT, NET_INTERVAL = 4, 3.0, 1.0, 0.5
NET_PAIRS = "rings"


class BetweenNodes(FleetStage):
    """net's two-ring test between the nodes; net's expectations are judged on these links."""

    name = "net between nodes"
    order = 20
    judges = "the network step"

    def run(self, ctx: StageContext) -> StageOutcome | None:
        from gpubench.core.errors import MachineError
        from gpubench.plugins.net import fleet as net_fleet
        from gpubench.plugins.net.protocol import Request

        if ctx.stopped is not None:
            return StageOutcome("skipped", ctx.stopped)
        if len(ctx.leaders) < 2:
            return StageOutcome("skipped", "one node")
        rounds = len(net_fleet.schedule(ctx.leaders, NET_PAIRS))
        ctx.say(f"fleet: the network between {len(ctx.leaders)} nodes (--pairs {NET_PAIRS}, {rounds} rounds, "
                f"-P {NET_STREAMS}, {NET_SECONDS:g} s)")
        spec = net_fleet.NetFleetSpec(Request(streams=NET_STREAMS, seconds=NET_SECONDS, omit=NET_OMIT,
                                              interval=NET_INTERVAL), pairs=NET_PAIRS, timeout=ctx.timeout)
        try:
            links = net_fleet.run(ctx.group, spec, ctx.leaders)
        except MachineError as e:
            return StageOutcome("error", e.one_line(), fault=e)
        return StageOutcome("ok", result=links) if links is not None else StageOutcome("skipped", "")

    def rows(self, result, outcomes) -> tuple[dict | None, list[dict]]:
        """The link matrix and a row per link, flagged by the fleet rule or "fail" (an expectation failed)."""
        from gpubench.plugins.net.fleet import culprits, link_flags
        from gpubench.validation.fleet import deciding_bound

        mat = result.timing.get("matrix") or {}
        links = {"hosts": list(mat.get("hosts") or []), "gbps": [list(r) for r in mat.get("gbps") or []],
                 "culprits": [c.to_dict() for c in culprits(result)]}
        by_link: dict[tuple, list] = {}
        for o in outcomes:
            if o.params:
                by_link.setdefault(tuple(sorted(o.params.items())), []).append(o)
        rows = []
        for r, f, med in link_flags(result):
            mine = by_link.get(tuple(sorted(r.params.items())), [])
            if any(o.status == "fail" for o in mine):
                f = "fail"
            b, op = deciding_bound(mine, "Gbit/s")
            rows.append({"host": str(r.extra.get("src_host")), "rank": int(r.params["src"]), "gpu": None,
                         "uuid": None, "check": f"net to {r.extra.get('dst_host')} (rank {r.params['dst']})",
                         "value": r.extra.get("gbit_per_s") if r.error is None else None, "unit": "Gbit/s",
                         "fleet_median": med, "expect": b, "expect_op": op, "flag": f})
        return links, rows

    def report(self, result) -> list:
        from gpubench.plugins.net import fleet as net_fleet

        return net_fleet.format_report(result)


def fleet_stage() -> FleetStage:
    return BetweenNodes()


def metrics(result) -> list[tuple[str, str, dict[str, str], float]]:
    """``gpubench metrics``' gauges of a test between nodes: each culprit verdict as
    ``gpubench_net_culprit_confidence`` (0 to 1), labelled kind, host, rank, peer_host, peer_rank
    ("" for a node's verdict). Nothing for other net results."""
    if not isinstance(result.spec, dict) or result.spec.get("mode") != "fleet":
        return []
    from gpubench.plugins.net.fleet import culprits

    out = []
    for c in culprits(result):
        ends = list(zip(c.hosts, c.ranks))
        (host, rank), peer = ends[0], ends[1] if len(ends) > 1 else ("", "")
        out.append(("culprit_confidence", "net between nodes: a verdict on a slow node or link, its confidence "
                    "(0 to 1; named at 0.99 or above, docs/fleet.md)",
                    {"kind": c.kind, "host": str(host), "rank": str(rank), "peer_host": str(peer[0]),
                     "peer_rank": str(peer[1])}, float(c.confidence)))
    return out

"""Who is slow between nodes: from the links' figures, the node that sends slowly, the node that
receives slowly, or the link that is slow between two healthy nodes, each with a confidence.

Boolean network tomography (N. Duffield, "Simple network performance tomography", IMC 2003): a test
i -> j's figure is about min(S_i, L_ij, R_j); a link is *low* when the fleet rule flags it
(:func:`gpubench.validation.fleet.flags`) or its test failed. The rule in full: docs/fleet.md.
Confidence (docs/fleet.md), with sigma = MAD / 0.6745 about the median m and Phi the standard
normal distribution function: 1 - min(1, K x prod_k Phi((x_k - m) / sigma)) over the verdict's low
figures x_k (a failed test 0; K the places it could appear: Bonferroni), times Phi((c - t) / sigma)
for the clearing figures c above the slow bound t (a link: both ends, the product; a node: 1 -
prod (1 - Phi) over its peers); a node slow both ways: the product of its two. sigma = 0: Phi a step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

Edge = tuple[int, int]


@dataclass(frozen=True)
class Culprit:
    """One verdict."""

    # "sender" (the node sends slowly), "receiver", "node" (both), "link" (slow between two healthy
    # nodes), "unresolved" (a low link whose parts the schedule cannot tell apart)
    kind: str
    ranks: tuple[int, ...]  # (rank,) for a node's verdict, (sender, receiver) for a link's
    hosts: tuple[str, ...]  # the label of each rank
    confidence: float  # 0 to 1 (module docstring)
    # each low link's figure over the median of every link (0 for a failed test), out-links first
    fractions: tuple[float, ...]
    suspects: tuple[str, ...] = ()  # for "unresolved", the parts it may be ("node1 sending", "the path")

    def where(self) -> str:
        """The node or link, e.g. "node7 (rank 7)" or "node1 -> node2 (rank 1 -> 2)" (raw host names)."""
        if len(self.ranks) == 1:
            return f"{self.hosts[0]} (rank {self.ranks[0]})"
        return f"{self.hosts[0]} -> {self.hosts[1]} (rank {self.ranks[0]} -> {self.ranks[1]})"

    def line(self) -> str:
        """One plain line (host names raw: the caller escapes them)."""
        pct = ", ".join(f"{f:.0%}" for f in self.fractions)
        what = {"sender": f"SLOW SENDER {self.where()}: every link out at {pct} of the median",
                "receiver": f"SLOW RECEIVER {self.where()}: every link in at {pct} of the median",
                "node": f"SLOW NODE {self.where()}, both ways: every link out and in at {pct} of the median",
                "link": f"SLOW LINK {self.where()} between two healthy nodes: {pct} of the median",
                "unresolved": f"SLOW {self.where()}: {pct} of the median; {' or '.join(self.suspects)} "
                              "(this schedule cannot tell them apart; --pairs rings can)"}[self.kind]
        return f"{what}; confidence {self.confidence:.2f}"

    def short(self) -> str:
        """A few words for an exit line: "node7 (rank 7) sends slowly (0.99)"."""
        verb = {"sender": "sends slowly", "receiver": "receives slowly", "node": "is slow both ways",
                "link": "is a slow link", "unresolved": "is slow (sender, receiver or path)"}[self.kind]
        return f"{self.where()} {verb} ({self.confidence:.2f})"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "ranks": list(self.ranks), "hosts": list(self.hosts),
                "confidence": round(self.confidence, 4), "fractions": [round(f, 4) for f in self.fractions],
                "suspects": list(self.suspects), "says": self.short()}


def infer(figures: Mapping[Edge, float | None], labels: Mapping[int, str] | None = None) -> list[Culprit]:
    """The verdicts (module docstring) from every tested link's figure: ``figures`` (sender,
    receiver) -> Gbit/s, None where its test failed; ``labels`` rank -> host label (default "rank N").
    Returns nodes first (by rank), then links (by sender, receiver); [] when nothing is low."""
    from gpubench.validation.fleet import flags, slow_bound

    labels = labels or {}
    edges = list(figures)
    measured = [float(v) for v in figures.values() if v is not None]
    if not measured:
        return []
    low = {e for e, f in zip(edges, flags([figures[e] for e in edges])) if f == "slow" or figures[e] is None}
    if not low:
        return []
    m, sigma, _t = slow_bound(measured)

    def value(e: Edge) -> float:
        v = figures[e]
        return 0.0 if v is None else float(v)

    def phi(x: float, ref: float, scale: float = 1.0) -> float:  # Phi((x - ref) / (scale sigma)), a step when sigma is 0
        if sigma > 0:  # Phi(z) = erfc(-z / sqrt 2) / 2
            return 0.5 * math.erfc(-(x - ref) / (scale * sigma) / math.sqrt(2.0))
        return 0.0 if x < ref else 0.5 if x == ref else 1.0

    def not_noise(xs: Sequence[float], places: int) -> float:
        return 1.0 - min(1.0, places * math.prod(phi(x, m) for x in xs))

    def cleared(others: Sequence[Edge], x: float) -> float:  # the best other test through that end is truly above x
        return max((phi(value(e) - x, 0.0, math.sqrt(2.0)) for e in others), default=0.0)

    out: dict[int, list[Edge]] = {}
    inn: dict[int, list[Edge]] = {}
    for e in edges:
        out.setdefault(e[0], []).append(e)
        inn.setdefault(e[1], []).append(e)
    nodes = sorted(set(out) | set(inn))
    send = {i for i in nodes if len(out.get(i, [])) >= 2 and all(e in low for e in out[i])}
    recv = {j for j in nodes if len(inn.get(j, [])) >= 2 and all(e in low for e in inn[j])}

    # the fewest parts: drop a node verdict whose every low link has a kept verdict at its other end,
    # the one with the most links so explained first
    def covered_by_others(side: str, x: int) -> int:
        mine = out[x] if side == "S" else inn[x]
        return sum((e[1] in recv) if side == "S" else (e[0] in send) for e in mine)

    for side, x in sorted([("S", i) for i in send] + [("R", j) for j in recv],
                          key=lambda sx: (-covered_by_others(*sx), sx[0], sx[1])):
        mine = out[x] if side == "S" else inn[x]
        if covered_by_others(side, x) == len(mine):
            (send if side == "S" else recv).discard(x)

    def label(r: int) -> str:
        return str(labels.get(r, f"rank {r}"))

    n_nodes, n_links = len(nodes), len(edges)
    verdicts: list[Culprit] = []

    def node_confidence(mine: list[Edge], peer_links: Callable[[Edge], list[Edge]]) -> float:
        return not_noise([value(e) for e in mine], n_nodes) * (
            1.0 - math.prod(1.0 - cleared([f for f in peer_links(e) if f != e], value(e)) for e in mine))

    conf_s = {i: node_confidence(out[i], lambda e: inn[e[1]]) for i in send}
    conf_r = {j: node_confidence(inn[j], lambda e: out[e[0]]) for j in recv}
    for i in nodes:
        mine = (out[i] if i in send else []) + (inn[i] if i in recv else [])
        if mine:
            kind = "node" if i in send and i in recv else "sender" if i in send else "receiver"
            confidence = conf_s.get(i, 1.0) * conf_r.get(i, 1.0)
            verdicts.append(Culprit(kind, (i,), (label(i),), confidence, tuple(value(e) / m for e in mine)))
    for e in sorted(low):
        a, b = e
        if a in send or b in recv:
            continue
        others_out = [f for f in out[a] if f != e]
        others_in = [f for f in inn[b] if f != e]
        clear_s = any(f not in low for f in others_out)
        clear_r = any(f not in low for f in others_in)
        base = not_noise([value(e)], n_links)
        if clear_s and clear_r:
            verdicts.append(Culprit("link", e, (label(a), label(b)),
                                    base * cleared(others_out, value(e)) * cleared(others_in, value(e)),
                                    (value(e) / m,)))
        else:
            suspects = ([] if clear_s else [f"{label(a)} sending"]) + ([] if clear_r else [f"{label(b)} receiving"])
            verdicts.append(Culprit("unresolved", e, (label(a), label(b)), base, (value(e) / m,),
                                    (*suspects, "the path between")))
    return verdicts


def named(verdicts: Sequence[Culprit]) -> list[Culprit]:
    """The verdicts the exit lines name: at :data:`gpubench.validation.fleet.NAMED_CONFIDENCE` or above."""
    from gpubench.validation.fleet import NAMED_CONFIDENCE

    return [c for c in verdicts if c.confidence >= NAMED_CONFIDENCE]

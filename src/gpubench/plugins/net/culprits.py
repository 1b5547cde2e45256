"""Who is slow between nodes: from the links' figures, the node that sends slowly, the node that
receives slowly, or the link that is slow between two healthy nodes, each with a confidence.

The model (boolean network tomography: N. Duffield, "Simple network performance tomography",
IMC 2003, and "Network tomography of binary network performance characteristics", IEEE Trans.
Information Theory 52(12), 2006): a test i -> j runs through three parts, node i's sending side
S_i, the path L_ij and node j's receiving side R_j, and its figure is about the least of their
capacities, min(S_i, L_ij, R_j), times the noise of the measurement. A link is *low* when the
fleet rule flags it against the median of every link (:func:`gpubench.validation.fleet.flags`),
or its test failed; a part is *cleared* when a test through it is not low (a good test proves each
of its parts good, Duffield's rule). So:

- node i **sends slowly** when it sent two or more tests and every one is low (S_i is not
  cleared); it **receives slowly** when every test (two or more) it received is low; both: a
  **slow node**. A node's verdict that another explains entirely (every one of its low links also
  had a named node at its other end) is dropped: the fewest parts that explain every low link
  (Duffield's smallest consistent failure set).
- a low link i -> j that no named node explains, with S_i cleared (another test from i is not
  low) and R_j cleared (another test into j is not low), is a **slow link** between two healthy
  nodes.
- a low link with an end that no test clears and that is no candidate (with the ring's one test
  in each direction, a node has no second test) is **unresolved**: its sender, its receiver or
  the path, which the schedule cannot tell apart (``--pairs rings`` gives every node two tests
  each way).

Confidence (derived here, not taken from the sources above): the noise of a healthy figure is
taken as Gaussian with the fleet's own scale, sigma = MAD / 0.6745 of every link's figure (the
rule's estimate), about the median m; Phi is the standard normal distribution function.

- that the verdict's low figures are not noise: 1 - min(1, K x prod_k Phi((x_k - m) / sigma)), where
  x_k are its low figures (a failed test counts 0) and K the places such a pattern could have
  appeared by chance (the number of links for a link verdict, of nodes for a node's): a Bonferroni
  bound on the chance that healthy parts read this low somewhere in the fleet, so one healthy link
  among 20,000 that the rule's 3.5 sigma cut flags by chance gets a confidence near 0;
- times, that the other ends are not the cause: a clearing figure c (the best other test through
  that end) gives Phi((c - t) / sigma), the chance it is truly above the rule's slow bound t
  (:func:`gpubench.validation.fleet.slow_bound`); a link verdict needs both ends cleared (the
  product), a node verdict at least one of its peers cleared (1 - prod (1 - Phi)), since one
  slow part that explains two low links is a smaller explanation than two parts that each
  explain one;
- a slow node (both ways): the product of its two verdicts' confidences.

With sigma = 0 (every other figure equal) Phi is a step: the verdict is certain or 0.
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


def _phi(z: float) -> float:
    """The standard normal distribution function."""
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def infer(figures: Mapping[Edge, float | None], labels: Mapping[int, str] | None = None) -> list[Culprit]:
    """The verdicts (module docstring) from every tested link's figure.

    Args:
        figures: (sender, receiver) -> Gbit/s of each tested link; None where its test failed.
        labels: rank -> host label (default "rank N").

    Returns:
        Nodes first (by rank), then links (by sender, receiver); [] when nothing is low.
    """
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
        return _phi((x - ref) / (scale * sigma)) if sigma > 0 else (0.0 if x < ref else 0.5 if x == ref else 1.0)

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
    """The verdicts at :data:`gpubench.validation.fleet.NAMED_CONFIDENCE` (0.99) or above: those
    the exit lines name; the others are shown in the report with their confidence."""
    from gpubench.validation.fleet import NAMED_CONFIDENCE

    return [c for c in verdicts if c.confidence >= NAMED_CONFIDENCE]

"""Expectations on the GPUs' health counters (``env.health``, core/health.py): each key of an
expectations file's ``[health]`` table (docs/suite.md) becomes an expectation of the command
``"health"``, checked against every GPU whose counters a result holds. A counter the GPU does not
have, or a result without counters, gives a "skipped" outcome naming why, never a pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from gpubench.core import safe
from gpubench.core.errors import UsageError

UNSUPPORTED = "unsupported"
RESET = "reset"  # a counter read lower after the runs than before: the GPU or its driver was reset


@dataclass(frozen=True)
class Rule:
    """One ``[health]`` key: the counter it reads (the expectation's ``figure`` is "health.COUNTER"),
    whether it bounds from above or below, and the TOML value's type."""

    key: str
    counter: str
    bound: str  # "max_count" or "min_count"
    flag: bool = False  # the TOML value is true/false (true: the counter must be 0)
    what: str = ""


RULES = {r.key: r for r in (
    Rule("max_pcie_replays", "pcie_replays", "max_count", what="PCIe replays during the runs"),
    Rule("pcie_gen", "pcie_gen", "min_count", what="PCIe generation (highest read)"),
    Rule("pcie_width", "pcie_width", "min_count", what="PCIe width (highest read)"),
    Rule("nvlinks_up", "nvlinks_up", "min_count", what="NVLinks up (lowest read)"),
    Rule("max_nvlink_errors", "nvlink_errors", "max_count", what="NVLink errors during the runs"),
    Rule("max_ecc_uncorrected", "ecc_uncorrected", "max_count", what="uncorrected ECC errors (volatile)"),
    Rule("no_remap_failure", "remap_failures", "max_count", flag=True, what="reads with a failed row remap"),
    Rule("max_xid_events", "xid_events", "max_count", what="XID events during the runs"),
)}
COUNTERS = {r.counter: r for r in RULES.values()}
MAX_COUNT = 10**12


def parse(table: Any, source: str, first_index: int) -> list[dict]:
    """The ``[health]`` table as expectation tables, numbered from ``first_index``.

    Raises:
        UsageError: not a table, an unknown key, a value of the wrong type (an integer 0..10**12, or
            true/false for no_remap_failure).
    """
    if not isinstance(table, dict) or not table:
        raise UsageError(f"{source}: [health] must be a table of counter bounds", "e.g. [health] max_pcie_replays = 0")
    out = []
    for i, (key, value) in enumerate(table.items()):
        rule = RULES.get(key) if isinstance(key, str) else None
        if rule is None:
            raise UsageError(f"{source}: [health] has unknown key {safe.term(repr(key), 80)}",
                             f"known: {', '.join(RULES)}")
        if rule.flag:
            if type(value) is not bool:
                raise UsageError(f"{source}: [health] {key} = {safe.term(repr(value), 60)} must be true or false")
            if not value:
                continue  # false asks for nothing
            bound = 0
        else:
            if type(value) is not int or not 0 <= value <= MAX_COUNT:
                shown = f"(a {len(str(abs(value)))}-digit integer)" if type(value) is int and abs(value) > 10**15 \
                    else repr(value)
                raise UsageError(f"{source}: [health] {key} = {safe.term(shown, 60)} must be an integer 0..{MAX_COUNT:,}")
            bound = value
        out.append({"command": "health", "figure": f"health.{rule.counter}", rule.bound: bound,
                    "name": f"{key} = {'true' if rule.flag else value}", "_index": first_index + i})
    return out


def _delta(before: Any, after: Any) -> Any:
    if before == UNSUPPORTED or after == UNSUPPORTED:
        return UNSUPPORTED
    if type(before) is not int or type(after) is not int:
        return None
    return RESET if after < before else after - before  # NVML's counters only grow while the driver stays loaded


def _link_errors(c: Any) -> Any:
    if not isinstance(c, dict):
        return c  # "unsupported" or None
    vals = [v for link in c.values() if isinstance(link, dict) for v in link.values()]
    return sum(v for v in vals if type(v) is int) if vals else 0


def _path(c: dict | None, *keys: str) -> Any:
    v: Any = c
    for k in keys:
        if v == UNSUPPORTED:
            return UNSUPPORTED
        v = v.get(k) if isinstance(v, dict) else None
    return v


@dataclass
class _Gpu:
    """What the results read of one GPU."""

    host: str
    index: Any
    uuid: Any
    pairs: list  # (before, after) counter dicts
    xids: int | str | None = 0

    def label(self) -> dict[str, Any]:
        return {"host": self.host, "device": self.index, "uuid": self.uuid}


def _gpus(results: Iterable[Any]) -> list[_Gpu]:
    by: dict[tuple, _Gpu] = {}
    for res in results:
        h = res.env.get("health") if isinstance(res.env, dict) else None
        if not isinstance(h, dict):
            continue
        host = ((res.env.get("host") or {}).get("hostname") if isinstance(res.env.get("host"), dict) else None) or ""
        xids = h.get("xid_events")
        for g in h.get("gpus") or []:
            if not isinstance(g, dict):
                continue
            key = (host, g.get("uuid") or g.get("index"))
            gpu = by.setdefault(key, _Gpu(host, g.get("index"), g.get("uuid"), []))
            gpu.pairs.append((g.get("before") or {}, g.get("after") or {}))
            if isinstance(xids, list):  # events seen count even where another run could not watch
                n = sum(1 for x in xids if isinstance(x, dict) and x.get("index") == g.get("index"))
                gpu.xids = gpu.xids + n if isinstance(gpu.xids, int) else (n or gpu.xids)
            elif gpu.xids == 0:  # a run that could not watch: no count of 0 can be claimed
                gpu.xids = UNSUPPORTED if xids == UNSUPPORTED else None
    return list(by.values())


def _sum(vals: Sequence[Any]) -> Any:
    if any(v == UNSUPPORTED for v in vals):
        return UNSUPPORTED
    if RESET in vals:
        return RESET
    nums = [v for v in vals if type(v) is int]
    return sum(nums) if nums else None


def _extreme(vals: Sequence[Any], pick: Callable) -> Any:
    nums = [v for v in vals if type(v) is int]
    return pick(nums) if nums else UNSUPPORTED if UNSUPPORTED in vals else None


def measure(counter: str, gpu: _Gpu) -> Any:
    """The value a rule on ``counter`` judges for ``gpu``: an int, "unsupported" or None."""
    reads = [c for pair in gpu.pairs for c in pair]
    if counter in ("pcie_replays", "nvlink_errors"):
        get = _link_errors if counter == "nvlink_errors" else (lambda v: v)
        return _sum([_delta(get(b.get(counter)), get(a.get(counter))) for b, a in gpu.pairs])
    if counter in ("pcie_gen", "pcie_width", "nvlinks_up"):
        return _extreme([c.get(counter) for c in reads], min if counter == "nvlinks_up" else max)
    if counter == "ecc_uncorrected":
        return _extreme([_path(c, "ecc", "volatile", "uncorrected") for c in reads], max)
    if counter == "remap_failures":
        vals = [_path(c, "remapped_rows", "failed") for c in reads]
        if any(v is True for v in vals):
            return sum(1 for v in vals if v is True)
        return 0 if any(v is False for v in vals) else (UNSUPPORTED if UNSUPPORTED in vals else None)
    if counter == "xid_events":
        return gpu.xids
    return None


def outcomes(e: Any, results: Sequence[Any], outcome: Callable) -> list:
    """The outcomes of the health expectation ``e``, one per GPU, by ``outcome(e, status, params, value, note)``."""
    rule = COUNTERS.get(e.figure.partition(".")[2])
    gpus = _gpus(results)
    if rule is None:
        return [outcome(e, "fail", None, None, f"no health counter {e.figure!r}")]
    if not gpus:
        return [outcome(e, "skipped", None, None, "no result holds GPU health counters (env.health)")]
    out = []
    lo, hi = e.bounds
    for g in gpus:
        v = measure(rule.counter, g)
        name = f"GPU {g.index}" + (f" ({g.uuid})" if g.uuid else "")
        if v == RESET:
            out.append(outcome(e, "fail", g.label(), None, f"{name}: {rule.what} went backwards between the reads "
                               "before and after the runs: the GPU or its driver was reset during them"))
            continue
        if v == UNSUPPORTED or v is None:
            why = "not supported by this GPU" if v == UNSUPPORTED else "not read"
            out.append(outcome(e, "skipped", g.label(), None, f"{name}: {rule.what}: {why}"))
            continue
        ok = (lo is None or v >= lo) and (hi is None or v <= hi)
        out.append(outcome(e, "pass" if ok else "fail", g.label(), float(v),
                           "" if ok else f"{name}: {rule.what} {v}, {e.bound_text()}"))
    return out

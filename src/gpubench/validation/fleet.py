"""Fleet validation: ``gpubench suite`` under a launcher (srun, mpirun, torchrun), every node measured,
one bundle and a fleet report written by rank 0, the slow node, GPU or link named (docs/fleet.md).

The rule (:func:`flag`), for figures where higher is better (GB/s, Gbit/s): a figure is **slow**
when it is below ``RATIO`` (0.95) x the fleet median of that check AND it is an outlier by the
modified z-score of Iglewicz and Hoaglin (1993, "How to Detect and Handle Outliers", ASQC Basic
References in Quality Control 16), M = 0.6745 (x - median) / MAD < -3.5; or the MAD is 0; or the
figure is below ``GROSS`` (0.5) x the median. A figure outside the TOML expectation is **fail**; a
rank that did not answer within the deadline is **missing**. Any of the three fails the suite.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import statistics
import time
from typing import Any, Callable, Sequence

from gpubench.core import registry, report, safe
from gpubench.core.bounds import MAX_TIMEOUT_S, Bound
from gpubench.core.errors import MachineError, RegressionFound
from gpubench.core.plugin import FleetStage, StageContext, StepPlace
from gpubench.core.result import Result, write_json_atomic
from gpubench.core.signals import raise_if_signalled
from gpubench.validation import steps, suite

RATIO = 0.95
Z_LIMIT = 3.5
GROSS = 0.5
MAD_SCALE = 0.6745  # Phi^-1(0.75): makes MAD a consistent estimator of sigma for normal data
RULE_NAME = "median-mad"
RULE_TEXT = (f"Slow: below {RATIO:g} x the fleet median of the check AND (modified z-score "
             f"{MAD_SCALE} (x - median) / MAD below -{Z_LIMIT:g} [Iglewicz & Hoaglin 1993], or MAD = 0, "
             f"or below {GROSS:g} x the median).")
NAMED_CONFIDENCE = 0.99  # a verdict on the network (net's culprits) this sure is named in the exit lines
DEFAULT_TIMEOUT_S = 900.0
NODE_TIMEOUT = Bound("--node-timeout", lo=0, above=True, hi=MAX_TIMEOUT_S, unit="seconds")


# ---- The rule (pure) ----


median = statistics.median  # ValueError (StatisticsError) when empty


def mad(xs: Sequence[float]) -> float:
    """Median absolute deviation from the median (unscaled)."""
    m = median(xs)
    return median([abs(x - m) for x in xs])


def modified_z(x: float, xs: Sequence[float]) -> float:
    """Iglewicz & Hoaglin's M = 0.6745 (x - median) / MAD; +-inf when MAD is 0 and x differs."""
    m, d = median(xs), mad(xs)
    if d == 0:
        return 0.0 if x == m else math.copysign(math.inf, x - m)
    return MAD_SCALE * (x - m) / d


def _judge(x: float | None, m: float, d: float) -> str:
    """"slow" or "ok" for figure ``x`` against a check's median ``m`` and MAD ``d`` (the module's rule)."""
    if x is None or not math.isfinite(x) or m <= 0 or not x < RATIO * m:
        return "ok"
    if x < GROSS * m or d == 0:  # modified_z is -inf when MAD is 0 and x < m
        return "slow"
    return "slow" if MAD_SCALE * (x - m) / d < -Z_LIMIT else "ok"


def flag(value: float, values: Sequence[float]) -> str:
    """"slow" or "ok" for a higher-is-better figure against the fleet's figures of the same check."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return _judge(value, median(vals), mad(vals)) if len(vals) >= 2 else "ok"


def flags(values: Sequence[float | None]) -> list[str]:
    """:func:`flag` of every figure of one check ("ok" for None or non-finite), median and MAD computed once."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if len(vals) < 2:
        return ["ok"] * len(values)
    m, d = median(vals), mad(vals)
    return [_judge(v, m, d) for v in values]


def slow_bound(values: Sequence[float]) -> tuple[float, float, float]:
    """(median m, noise sigma, bound t) of one check's figures: a figure below t is slow by the
    rule, t = min(RATIO m, max(m - Z_LIMIT sigma, GROSS m)), sigma = MAD / MAD_SCALE. ValueError:
    no finite figure."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    m = median(vals)
    sigma = mad(vals) / MAD_SCALE
    return m, sigma, min(RATIO * m, max(m - Z_LIMIT * sigma, GROSS * m))


# ---- Checks of one node's results (pure) ----


def checks_of(result) -> list[dict]:
    """The fleet's figures in one Result, as its plug-in's ``fleet_checks`` gives them: dicts with
    "check", "command", "params", "gpu" (CUDA index or None), "value", "unit" ("GB/s" or "Gbit/s")."""
    def checks(got) -> None:
        for c in got if isinstance(got, list) else [got]:
            if not (isinstance(c, dict) and isinstance(c.get("check"), str) and isinstance(c.get("unit"), str)
                    and (c.get("value") is None or isinstance(c.get("value"), (int, float)))
                    and isinstance(c.get("params", {}), dict)):
                raise TypeError(f"it gave {c!r:.60}, not a check (a dict of check, value, unit, params)")

    own = registry.find(result.command)
    return registry.call_hook(own, "fleet_checks", result, check=checks, default=[]) if own is not None else []


def deciding_bound(outcomes, unit: str) -> tuple[float | None, str | None]:
    """The bound with the least margin among the outcomes of one figure (the failed ones if any failed):
    (bound in ``unit``, ">=" or "<="; "Gbit/s" converts a GB/s bound x8), or (None, None)."""
    judged = [o for o in outcomes if o.status in ("pass", "fail")]
    if any(o.status == "fail" for o in judged):
        judged = [o for o in judged if o.status == "fail"]
    # (margin, bound, side) of every bound; the first of the least margins decides
    margins = [(-math.inf if o.value is None else (o.value - b if op == ">=" else b - o.value), b, op)
               for o in judged for b, op in zip(o.expectation.bounds, (">=", "<=")) if b is not None]
    if not margins:
        return None, None
    _, b, op = min(margins, key=lambda m: m[0])
    return b * (8.0 if unit == "Gbit/s" else 1.0), op


def attach_expectations(checks: list[dict], outcomes) -> list[dict]:
    """``checks``, each marked with the deciding bound of the outcomes that judged its record
    ("expect", "expect_op", "expect_status"), plus a check of its own for each outcome that matches none."""
    for c in checks:
        for k in ("expect", "expect_op", "expect_status"):
            c.setdefault(k, None)
    extra = []
    judged: dict[int, list] = {}
    for o in outcomes:
        e = o.expectation
        if o.status == "skipped":
            continue
        hit = [i for i, c in enumerate(checks)
               if c["command"] == e.command and o.params is not None and c["params"] == o.params]
        for i in hit:
            judged.setdefault(i, []).append(o)
            if checks[i]["expect_status"] != "fail":
                checks[i]["expect_status"] = o.status
        if not hit:
            gpu = o.params.get("device") if o.params else None
            b, op = deciding_bound([o], e.unit)
            if b is None:  # missing: no figure to judge, the bound as written: the minimum, else the maximum
                lo, hi = e.bounds
                b, op = (lo, ">=") if lo is not None else (hi, "<=") if hi is not None else (None, None)
            extra.append({"check": f"expect {e.index}: {e.label()}", "gpu": gpu if isinstance(gpu, int) else None,
                          "value": o.value, "unit": e.unit, "command": e.command, "params": o.params or {},
                          "expect": b, "expect_op": op, "expect_status": o.status, "note": o.note})
    for i, os_ in judged.items():
        checks[i]["expect"], checks[i]["expect_op"] = deciding_bound(os_, checks[i]["unit"])
    return checks + extra


# ---- The fleet object (pure, on gathered payloads) ----


def _row_flag(c: dict, values: list[float]) -> str:
    if c.get("expect_status") in ("fail", "missing") or c.get("value") is None:
        return "fail"
    if c.get("unit") == "us":  # lower is better: no fleet rule here, the TOML decides
        return "ok"
    return flag(c["value"], values)


def build_fleet(payloads: Sequence[dict | None], hosts: Sequence[str], links: Any = None,
                link_outcomes: Sequence = ()) -> dict:
    """The bundle's ``fleet`` object (shape: :func:`gpubench.validation.suite.check_fleet`) from each
    rank's :func:`node_payload` (None: missing) and the judging stage's Result (``links``) with its outcomes."""
    present = [p for p in payloads if p is not None]
    missing = [{"rank": r, "host": str(hosts[r]) if r < len(hosts) else "?"} for r, p in enumerate(payloads)
               if p is None]
    by_check: dict[str, list[float]] = {}
    for p in present:
        for c in p["checks"]:
            if c.get("value") is not None:
                by_check.setdefault(c["check"], []).append(c["value"])
    medians = {k: median(vals) for k, vals in by_check.items()}
    rows = []
    for p in present:
        for c in p["checks"]:
            uuid = next((g.get("uuid") for g in p.get("gpus") or [] if g.get("index") == c.get("gpu")), None)
            rows.append({"host": str(p["host"]), "rank": int(p["rank"]), "gpu": c.get("gpu"),
                         "uuid": uuid if isinstance(uuid, str) else None, "check": c["check"],
                         "value": c.get("value"), "unit": c["unit"], "fleet_median": medians.get(c["check"]),
                         "expect": c.get("expect"), "expect_op": c.get("expect_op"),
                         "flag": _row_flag(c, by_check.get(c["check"], []))})
    names = list(dict.fromkeys(c["check"] for p in present for c in p["checks"]))
    rows += [{"host": m["host"], "rank": m["rank"], "gpu": None, "uuid": None, "check": name, "value": None, "unit": "",
              "fleet_median": medians.get(name), "expect": None, "expect_op": None, "flag": "missing"}
             for m in missing for name in names or ["(no answer)"]]
    link_obj: dict[str, Any] = {"hosts": [], "gbps": []}
    stage = stage_of(links) if links is not None else None
    if stage is not None:
        got, link_rows = stage.rows(links, link_outcomes)
        link_obj = got or link_obj
        rows += link_rows
    return {"kind": suite.FLEET_KIND, "version": suite.FLEET_VERSION, "rule": {"name": RULE_NAME, "text": RULE_TEXT},
            "missing": missing, "rows": rows, "links": link_obj}


def verdict(fleet: dict, step_errors: Sequence[str] = ()) -> str | None:
    """One line naming the failed nodes and GPUs (host names escaped for a terminal), or None."""
    bad = [r for r in fleet["rows"] if r["flag"] != "ok"]
    if not bad and not step_errors:
        return None
    where: dict[str, set] = {}
    for r in bad:
        key = f"{safe.term(r['host'], 80)} (rank {r['rank']})"
        where.setdefault(key, set())
        if r["gpu"] is not None:
            where[key].add(f"GPU {r['gpu']}")
        elif r["check"].startswith("net to "):
            where[key].add(f"link {safe.term(r['check'][4:], 120)}")
    names = [k + (f" {', '.join(sorted(v))}" if v else "") for k, v in where.items()]
    parts = []
    if bad:
        kinds = sorted({r["flag"] for r in bad})
        parts.append(f"{len(bad)} figure(s) {'/'.join(kinds)} on " + "; ".join(names[:16])
                     + (" ..." if len(names) > 16 else ""))
    if step_errors:
        parts.append("step(s) failed: " + ", ".join(safe.term(s, 120) for s in step_errors[:8]))
    said = [c["says"] for c in (fleet.get("links") or {}).get("culprits") or []
            if isinstance(c, dict) and isinstance(c.get("says"), str) and isinstance(c.get("confidence"), (int, float))
            and c["confidence"] >= NAMED_CONFIDENCE]
    if bad and said:  # who the flagged links point to (the rows name each link's sender)
        parts.append("named: " + "; ".join(safe.term(x, 200) for x in said[:8]) + (" ..." if len(said) > 8 else ""))
    return "fleet failed: " + "; ".join(parts)


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) >= 1 else f"{v:.3g}"


def _expect_cell(r: dict) -> str:
    """The deciding bound with its side and the row's unit, e.g. ">= 8000.0 Gbit/s"; "-" for none."""
    if r.get("expect") is None:
        return "-"
    op = r.get("expect_op") if r.get("expect_op") in (">=", "<=") else ""
    return " ".join(x for x in (op, _num(r["expect"]), safe.term_markup(str(r.get("unit") or ""), 20)) if x)


def format_report(fleet: dict, links=None, show_ok: bool = True) -> list:
    """Rich renderables: the fleet table, the judging stage's report (net: the link matrix), the rule."""
    out: list = []
    t = report.table(f"Fleet: {len({(r['host'], r['rank']) for r in fleet['rows']})} rank(s), "
                     f"{len(fleet['missing'])} missing",
                     ["host", "rank", "GPU", "check", "value", "unit", "fleet median", "expect", "flag"])
    for r in [x for x in fleet["rows"] if show_ok or x["flag"] != "ok"]:
        fl = r["flag"]
        t.add_row(safe.term_markup(r["host"], 60), str(r["rank"]), "-" if r["gpu"] is None else str(r["gpu"]),
                  safe.term_markup(r["check"], 80), _num(r["value"]), r["unit"], _num(r["fleet_median"]),
                  _expect_cell(r), fl if fl == "ok" else f"[red]{fl.upper()}[/red]")
    out.append(t)
    stage = stage_of(links) if links is not None else None
    if stage is not None:
        out += stage.report(links)
    out.append(RULE_TEXT + " FAIL: outside the --expect bound or not measured; MISSING: no answer.")
    for m in fleet["missing"]:
        out.append(f"[red]MISSING[/red] rank {m['rank']} on {safe.term_markup(m['host'], 80)}: did not answer in time")
    return out


# ---- Gathering that outlives a silent rank ----


ROLL_SLACK_S = 10.0  # how long past --node-timeout a rank waits for rank 0's list of the silent ranks


class Roll:
    """Rank 0's roll call: gathers that keep what arrived when a rank stops answering (``silent``:
    the ranks that did not answer a sync in time, marked gone in the group)."""

    def __init__(self, group, timeout: float):
        self.group, self.timeout = group, float(timeout)
        self.silent: set[int] = set()

    def sync(self, obj: Any = None) -> list | None:
        """Every answering rank's ``obj`` on rank 0 (index = rank, None for a silent one); None elsewhere.

        Raises:
            MachineError: on a rank but 0, rank 0 did not begin within ``timeout`` or did not send
                the list of the silent ranks within ``timeout`` + ROLL_SLACK_S after that.
        """
        g = self.group
        if g.size == 1:
            return [json.loads(json.dumps(obj))]
        if g.rank != 0:
            g.bcast(None, timeout=self.timeout)  # rank 0 is gathering: its deadline runs from now at the latest
            g.gather(obj, timeout=self.timeout)
            self.silent = set(g.bcast(None, timeout=self.timeout + ROLL_SLACK_S))
            g.lost(self.silent)
            return None
        deadline = time.monotonic() + self.timeout
        g.bcast(True, timeout=self.timeout)
        tag = g._tag("g")
        out: list = [None] * g.size
        out[0] = json.loads(json.dumps(obj))
        for r in range(1, g.size):
            if r in self.silent:
                continue
            try:
                out[r] = json.loads(g.receive(tag, r, deadline))
            except TimeoutError:
                self.silent.add(r)
            except MachineError:  # another rank's abort notice (named by the group), a closed store
                raise
            except Exception as e:
                raise MachineError(f"gathering from rank {r} failed: {type(e).__name__}: {str(e)[:200]}") from None
        g.bcast(sorted(self.silent), timeout=self.timeout)
        g.lost(self.silent)
        return out

    def missing_line(self) -> str:
        """One line naming the silent ranks and their hosts (peer host names escaped for a terminal)."""
        g = self.group
        hosts = [r.host for r in g.ranks] if len(g.ranks) == g.size else []
        who = ", ".join(f"rank {r} on {safe.term(hosts[r], 80) if r < len(hosts) else '?'}" for r in sorted(self.silent)[:8])
        more = f" and {len(self.silent) - 8} more" if len(self.silent) > 8 else ""
        return (f"fleet failed: {who}{more} did not answer within {self.timeout:g} s (--node-timeout); "
                "rank 0 reports the rest of the fleet")


def skipped_lines(steps: Sequence[Any]) -> list[str]:
    """A line per skipped step and reason of a fleet bundle, with its ranks: "skipped: copy on
    ranks 0, 1: no CUDA device is visible" (escaped for rich's markup)."""
    by: dict[tuple[str, str], list[str]] = {}
    for s in steps:
        if s.status == "skipped":
            name, _, rank = s.name.partition(" [rank ")
            by.setdefault((name, s.reason or ""), []).append(rank.rstrip("]"))
    out = []
    for (name, why), ranks_ in by.items():
        shown = [r for r in ranks_ if r]
        more = f" (+{len(shown) - 8} more)" if len(shown) > 8 else ""
        where = f" on rank{'s' if len(shown) > 1 else ''} {', '.join(shown[:8])}{more}" if shown else ""
        out.append(safe.term_markup(f"skipped: {name}{where}: {why or 'no reason given'}"))
    return out


# ---- The run (every rank calls run_fleet) ----


def file_host(name: str | None = None) -> str:
    """A host name (this one's by default) as a file name takes it: [A-Za-z0-9_-], at most 64."""
    name = socket.gethostname() if name is None else name
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:64] or "host"


def _gpu_count() -> int:
    try:
        from gpubench.core import gpu

        gpu.require_gpu()
        return gpu.device_count()
    except Exception:  # no CuPy, no driver, no device: the CPU steps
        return 0


def _node_steps(bundle, me, n_gpu: int, out, stamp: str, with_merge: bool, host_tag: str) -> None:
    """This rank's own steps into ``bundle`` (only its own GPU's unless it is its node's local rank 0)."""
    place = StepPlace(devices=tuple(range(n_gpu)), fleet=True, gpu=max(me.local_rank, 0) % n_gpu if n_gpu else None)
    whole = steps.run_planned(bundle, place, n_gpu, {"--merge"} if with_merge else set(),
                              lambda command: out / f"suite-{host_tag}-r{me.rank}-{stamp}-{command}.json", quiet=True,
                              each_rank_only=me.local_rank > 0)
    if not whole:  # a signal stopped a step: this rank stops, and the group's close tells the others
        raise_if_signalled()
        raise KeyboardInterrupt


def stages() -> list[tuple[str, Any]]:
    """(command, FleetStage) of every installed plug-in that declares a fleet stage, in order."""
    out = [(p.name, stage) for p in registry.plugins().values() if (stage := _stage(p)) is not None]
    return sorted(out, key=lambda cs: (cs[1].order, cs[0]))


def _stage(p) -> Any:
    """``p``'s FleetStage, or None (none declared, or its hook failed: said once)."""
    def stage(got) -> None:
        if not isinstance(got, FleetStage) or not isinstance(got.order, int) or not isinstance(got.name, str):
            raise TypeError(f"it gave {type(got).__name__}, not a FleetStage")

    return registry.call_hook(p, "fleet_stage", check=stage)


def stage_of(result) -> Any:
    """The fleet stage of the plug-in that wrote ``result``, or None."""
    own = registry.find(result.command)
    return _stage(own) if own is not None else None


def judged_between_nodes() -> dict[str, Any]:
    """command -> the stage whose result its expectations are judged on (net: the links between nodes)."""
    return {c: s for c, s in stages() if s.judges}


def node_payload(me, bundle, expectations, gpus: list[dict]) -> dict:
    """What a rank sends rank 0: its identity, GPUs, steps (with results) and checks."""
    checks = [c for res in bundle.results() for c in checks_of(res)]
    node_exp = [e for e in expectations or [] if e.command not in judged_between_nodes()]
    outcomes = suite.evaluate(node_exp, bundle.results(), bundle.skipped(), bundle.failed()) if node_exp else []
    bundle.outcomes = outcomes
    checks = attach_expectations(checks, outcomes)
    for c in checks:
        c["params"] = dict(c.get("params") or {})
    return {"rank": me.rank, "host": me.host, "local_rank": me.local_rank,
            "gpus": [{"index": g.get("index"), "uuid": g.get("uuid"), "pci_bus_id": g.get("pci_bus_id")}
                     for g in gpus],
            "checks": checks, "steps": [s.to_dict() for s in bundle.steps],
            "outcomes": [o.to_dict() for o in outcomes]}


def run_fleet(*, expectations, expect_file: str | None, out, with_merge: bool, strict: bool, quiet: bool,
              timeout: float = DEFAULT_TIMEOUT_S, rendezvous: str | None = None,
              node_done: Callable[[Any, Any], None] | None = None) -> int:
    """``gpubench suite`` under a launcher: every rank calls this (docs/fleet.md); 0 when every
    figure is ok. ``node_done(bundle, rank)`` is called on each rank once its own steps ran, and on
    rank 0 again after the steps across nodes.

    Raises:
        RegressionFound: on rank 0, a figure slow, failed or missing, or a step failed (exit 1);
            on another rank, a rank was missing (exit 1).
        UsageError / MachineError: the group could not be formed (join's).
    """
    from rich.markup import escape

    from gpubench.core import env as envmod
    from gpubench.launch import ranks

    NODE_TIMEOUT.check(timeout)
    group = ranks.join(ranks.discover(), rendezvous, timeout=min(timeout, 120.0))
    console = report.console(stderr=True)

    def say(text: str) -> None:
        if not quiet and group.rank == 0:
            console.print(text)

    try:
        me = group.me
        stamp = time.strftime("%Y%m%d-%H%M%S")
        host_tag = file_host(me.host)
        n_gpu = _gpu_count()
        t0 = time.perf_counter()
        env = envmod.capture() if n_gpu else {"host": envmod.host_info(), "versions": envmod.versions()}
        bundle = suite.Bundle(env=env)
        bundle.steps.append(suite.Step("env", "env", "ok", seconds=time.perf_counter() - t0,
                                       result=Result(command="env", spec={}, env=env, argv=list(registry.INVOCATION))))
        broken: MachineError | None = None
        roll = Roll(group, timeout)
        turns = max((r.local_size or 1) for r in group.ranks) if len(group.ranks) == group.size else 1
        say(f"fleet: {group.size} rank(s) on {len({r.host for r in group.ranks})} host(s), "
            f"{'GPU' if n_gpu else 'CPU'} steps, {turns} turn(s) per host")
        for k in range(turns):
            if me.local_rank == k or (turns == 1 and k == 0):
                _node_steps(bundle, me, n_gpu, out, stamp, with_merge, host_tag)
            if turns > 1:
                roll.sync(None)
        gpus: list[dict] = [g for g in env.get("gpus") or [] if isinstance(g, dict)]
        payload = node_payload(me, bundle, expectations, gpus)
        if node_done is not None:
            bundle.expect_file = expect_file
            node_done(bundle, me)
        payloads = roll.sync(payload)
        ctx = StageContext(group, sorted(r.rank for r in group.ranks if r.local_rank == 0), n_gpu, timeout, say)
        staged: list[tuple[str, Any, Any]] = []  # (command, stage, outcome) of the stages that applied
        for command, stage in stages():
            failed_first = next((s.name for _c, s, o in staged if o.fault is not None), None)
            ctx.stopped = (f"after {failed_first} failed" if failed_first else
                           f"rank(s) {', '.join(map(str, sorted(roll.silent)))} did not answer" if roll.silent else None)
            got = stage.run(ctx)
            if got is None:
                continue
            staged.append((command, stage, got))
            if got.fault is not None and broken is None:
                broken = got.fault if isinstance(got.fault, MachineError) else MachineError(str(got.fault))
        if group.rank != 0:
            if roll.silent:  # rank 0 reports the fleet; this rank names who is missing and fails too
                raise RegressionFound(roll.missing_line())
            if broken is not None:  # a stage across nodes lost a rank: this rank says so
                raise broken
            return 0
        hosts = [r.host for r in group.ranks] if len(group.ranks) == group.size else [me.host] * group.size
        judged = judged_between_nodes()
        links, link_outcomes, stage_outcomes = None, [], []
        for command, stage, got in staged:
            if payloads and payloads[0] is not None:
                payloads[0]["checks"] += got.checks  # the whole fleet's figure, on rank 0's row
            if command in judged:
                judged_here = _judged_on_stage(expectations or [], command, stage, got, "")
                stage_outcomes += judged_here
                if got.status == "ok" and got.result is not None:
                    links, link_outcomes = got.result, judged_here
        for command, stage in judged.items():  # a judging stage that did not apply at all
            if not any(c == command for c, _s, _g in staged):
                stage_outcomes += _judged_on_stage(expectations or [], command, stage, None, f"{stage.judges} did not run")
        fleet = build_fleet(payloads or [], hosts, links, link_outcomes)
        answered = [p for p in payloads or [] if p is not None]
        steps = [{**s, "name": f"{s['name']} [rank {p['rank']}]"} for p in answered for s in p["steps"]]
        outcomes = [o for p in answered for o in p["outcomes"]] + [o.to_dict() for o in stage_outcomes]
        doc = {"schema_version": suite.BUNDLE_VERSION, "created": bundle.created, "steps": steps, "env": env,
               "argv": list(registry.INVOCATION),
               "expectations": {"file": expect_file, "strict": strict, "outcomes": outcomes}}
        full = suite.Bundle.from_dict(doc, "fleet bundle")
        full.fleet = fleet
        for command, stage, got in staged:
            full.steps.append(suite.Step(stage.name, command, got.status, got.reason, got.seconds or 0.0, got.result))
        if node_done is not None and staged:  # rank 0's file gets the steps across nodes (their verdicts) too
            bundle.steps += full.steps[-len(staged):]
            bundle.outcomes = list(bundle.outcomes) + stage_outcomes
            node_done(bundle, me)
        path = write_json_atomic(full.to_dict(), out / f"suite-fleet-{host_tag}-{stamp}.json", "bundle")
        renderables = format_report(fleet, links, show_ok=len(fleet["rows"]) <= 64)
        if broken is not None:
            renderables.append(f"[red]stopped:[/red] {safe.term_markup(broken.one_line())}")
        errors = [f"{s.name}: {s.reason}" for s in full.steps if s.status == "error"]
        why = verdict(fleet, errors)
        skipped = [o for o in full.outcomes if o.status == "skipped"] if strict else []
        if skipped:
            names = sorted({f"{o.expectation.index}: {safe.term(o.expectation.label(), 80)} ({o.expectation.command})"
                            for o in skipped})
            line = (f"{len(skipped)} expectation outcome(s) skipped, failed by --strict: " + ", ".join(names[:8])
                    + (" ..." if len(names) > 8 else ""))
            why = f"{why}; {line}" if why else f"fleet failed: {line}"
        renderables += skipped_lines(full.steps)
        n_rows = len(fleet["rows"])
        renderables.append(escape(why) if why else
                           f"PASSED: {n_rows} figure(s) ok on {group.size} rank(s)." if n_rows else
                           f"NOTHING CHECKED: no figure was measured on {group.size} rank(s).")
        report.display(renderables, quiet=quiet)
        report.saved(path, quiet=quiet)
        if why:
            raise RegressionFound(why)
        return 0
    finally:
        group.close()


# ---- --check on a saved fleet bundle (pure): the live run's judgement again ----


def check_saved(bundle, expectations) -> list:
    """The expectations judged on a saved fleet bundle as :func:`run_fleet` judged them live (per rank,
    then those of a command with a judging fleet stage against that stage's step only)."""
    judged = judged_between_nodes()
    per_rank: dict[int, list] = {}
    stage_steps: dict[str, Any] = {}
    for s in bundle.steps:
        m = re.fullmatch(r"(.*) \[rank (\d+)\]", s.name, re.S)
        if m:
            per_rank.setdefault(int(m.group(2)), []).append(s)
        elif s.command in judged and s.name == judged[s.command].name:
            stage_steps[s.command] = s
    node_exp = [e for e in expectations if e.command not in judged]
    out: list = []
    if node_exp:
        for r in sorted(per_rank):
            own = suite.Bundle(steps=per_rank[r])
            out += suite.evaluate(node_exp, own.results(), own.skipped(), own.failed())
    for command, stage in judged.items():
        out += _judged_on_stage(expectations, command, stage, stage_steps.get(command),
                                f"the bundle has no step {stage.name!r}")
    return out


def _judged_on_stage(expectations, command: str, stage, step, absent: str) -> list:
    """The expectations of ``command`` judged on its fleet stage's ``step`` (None: it did not
    apply, skipped with ``absent``), or skipped with why there is no result."""
    exp = [e for e in expectations if e.command == command]
    if step is not None and step.status == "ok" and step.result is not None:
        return suite.evaluate(exp, [step.result])
    why = (f"{stage.judges} failed" if step is not None and step.status == "error"
           else f"{stage.judges} did not run ({step.reason})" if step is not None else absent)
    return suite.evaluate(exp, [], skipped={command: why})


def saved_verdict(fleet_obj: dict, source: str) -> tuple[list[str], str | None]:
    """What the live run said of its fleet that no TOML decides: (report lines with rich markup,
    one line naming the missing ranks and slow nodes or None)."""
    rows = [r for r in fleet_obj.get("rows") or [] if r.get("flag") in ("slow", "missing")]
    lines = [f"[red]MISSING[/red] rank {safe.term_markup(str(m.get('rank')), 12)} on "
             f"{safe.term_markup(str(m.get('host')), 80)}: did not answer in time ({safe.term_markup(source, 200)})"
             for m in fleet_obj.get("missing") or []]
    if not rows and not lines:
        return lines, None
    clean = [{"host": str(r.get("host")), "rank": r.get("rank"), "gpu": r.get("gpu"), "check": str(r.get("check")),
              "flag": r["flag"]} for r in rows]
    if not clean:  # missing ranks listed, their rows not: still a failure
        clean = [{"host": str(m.get("host")), "rank": m.get("rank"), "gpu": None, "check": "", "flag": "missing"}
                 for m in fleet_obj.get("missing") or []]
    why = verdict({"rows": clean, "links": fleet_obj.get("links") if isinstance(fleet_obj.get("links"), dict) else {}})
    return lines, why


def under_launcher(env=None) -> bool:
    """True when a launcher started this process with more than one rank (or an unsaid world size)."""
    from gpubench.launch import ranks

    me = ranks.discover(os.environ if env is None else env)
    return me.under_launcher and me.size != 1

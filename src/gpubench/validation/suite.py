"""Node validation: run a set of benchmarks, keep every result in one bundle (``schema:
"gpubench.bundle"``, version 1), check TOML expectations (docs/suite.md) against the records of
their command: bandwidth bounds in GB/s (1e9 B/s) against nbytes / seconds, time bounds in
microseconds; outcomes "pass", "fail", "missing" (no record matches), "skipped" (no result).
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from gpubench import __version__
from gpubench.core import registry, report, safe
from gpubench.core import result as R
from gpubench.core.errors import UsageError, first_line
from gpubench.core.result import MAX_DEPTH, Record, Result
from gpubench.core.stats import Summary
from gpubench.core.units import format_size
from gpubench.validation import health

BUNDLE_SCHEMA = "gpubench.bundle"
BUNDLE_VERSION = 1
BOUNDS = ("min_gbps", "max_gbps", "min_us", "max_us", "min_count", "max_count")
UNITS = {"bandwidth": "GB/s", "time": "us", "count": ""}  # an expectation's kind -> its unit
FIGURES = ("median", "p25", "p75", "min", "max")
_KEYS = {"name", "command", "where", "figure", "source", "nodes", *BOUNDS}
MAX_NODES = 2**20  # the largest world size a launcher may give (launch/ranks.py)
MAX_EXPECT_BYTES = 4 * 2**20  # about two seconds of tomllib
MAX_EXPECTATIONS = 10_000
MAX_OUTCOMES = 100_000  # rows of the expectations table (one per expectation and matching record)
_TABLE_HEADER = re.compile(rb"^[ \t]*\[\[", re.MULTILINE)  # an [[array-of-tables]] header line
MAX_BOUND = 1e12  # GB/s or microseconds: beyond any link (1 EB/s) or any sensible time bound (11 days)


@dataclass(frozen=True)
class Expectation:
    """One threshold from an expectations file (``index``: its 1-based position): bounds in GB/s
    (1e9 B/s), microseconds, or a count (the health counters), None where unbounded."""

    index: int
    command: str
    where: dict[str, Any]
    figure: str = "median"
    min_gbps: float | None = None
    max_gbps: float | None = None
    min_us: float | None = None
    max_us: float | None = None
    name: str = ""
    min_count: float | None = None
    max_count: float | None = None
    source: str = ""  # where the bound comes from (a profile's published figure)
    nodes: int | None = None  # the nodes the figure needs: a result spanning fewer is skipped

    @property
    def kind(self) -> str:
        """"bandwidth" when bounded in GB/s, "count" when bounded as a count, else "time"."""
        if self.min_gbps is not None or self.max_gbps is not None:
            return "bandwidth"
        return "count" if self.min_count is not None or self.max_count is not None else "time"

    @property
    def unit(self) -> str:
        """"GB/s", "us", or "" for a count."""
        return UNITS[self.kind]

    def label(self) -> str:
        return self.name or " ".join(f"{k}={v}" for k, v in self.where.items()) or "(every record)"

    @property
    def bounds(self) -> tuple[float | None, float | None]:
        """(min, max) in the expectation's unit: GB/s, microseconds or a count (None: no bound)."""
        return {"bandwidth": (self.min_gbps, self.max_gbps), "count": (self.min_count, self.max_count)}.get(
            self.kind, (self.min_us, self.max_us))

    def bound_text(self) -> str:
        parts = [f"{op} {b:g}" for op, b in zip((">=", "<="), self.bounds) if b is not None]
        return " and ".join(parts) + (f" {self.unit}" if self.unit else "")

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None and v != ""}


def _toml_loads(text: str, source: str) -> dict:
    import tomllib  # the standard library's from Python 3.11, which gpubench requires

    try:
        return tomllib.loads(text)
    except RecursionError:  # tomllib recurses per nested array or inline table
        raise UsageError(f"{source} nests arrays or tables too deep to read",
                         f"at most {MAX_DEPTH} levels; an expectations file nests 3") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{source} is not valid TOML: {safe.term(first_line(e), 200)}") from None
    except ValueError as e:  # an integer past Python's int conversion limit (4,300 digits): no TOML error
        raise UsageError(f"{source} holds a number too long to read: {safe.term(first_line(e), 120)}",
                         "no expectation needs more than 20 digits") from None


def _scalar_ok(v: Any) -> bool:
    """A JSON scalar a params value can equal: str, bool, None, a 64-bit int, a finite float."""
    if v is None or isinstance(v, (str, bool)):
        return True
    if type(v) is int:
        return -2**63 <= v <= 2**63 - 1
    return type(v) is float and math.isfinite(v)


def check_expectation(e: Any, index: int, where_: str, known_commands: Sequence[str] | None = None
                      ) -> Expectation:
    """Check one expectation table (from TOML, or from a bundle's outcomes) and build it; ``where_``
    names it in messages ("FILE: expectation 3"), ``known_commands`` None accepts any.

    Raises:
        UsageError: an unknown key or command, ``where`` not a table of scalars, no bound or bounds
            of both kinds, a bound that is not a finite number in (0, 1e12], min above max, a figure
            not known, a name that is not a string.
    """
    if not isinstance(e, dict):
        raise UsageError(f"{where_} is not a table")
    unknown = set(e) - _KEYS
    if unknown:
        raise UsageError(f"{where_} has unknown key(s) {safe.term(', '.join(sorted(map(str, unknown))), 200)}",
                         f"known: {', '.join(sorted(_KEYS))}")
    cmd = e.get("command")
    if not isinstance(cmd, str) or not cmd:
        raise UsageError(f"{where_} needs command = \"...\" (e.g. \"copy\")")
    if known_commands is not None and cmd not in known_commands and cmd != "health":
        raise UsageError(f"{where_}: command {safe.term(repr(cmd), 80)} not known",
                         f"use one of {', '.join(known_commands)}")
    w = e.get("where", {})
    if not isinstance(w, dict) or not all(isinstance(k, str) and _scalar_ok(v) for k, v in w.items()):
        raise UsageError(f"{where_}: where must be a table of params and single values (strings, booleans, "
                         "integers that fit 64 bits, finite numbers)",
                         'e.g. where = { direction = "h2d", nbytes = 1073741824 }')
    bounds: dict[str, float] = {}
    for b in BOUNDS:
        if b in e:
            v = e[b]
            if b.endswith("_count"):  # a health counter's bound: a whole count, 0 allowed
                if type(v) is not int or not 0 <= v <= health.MAX_COUNT or cmd != "health":
                    raise UsageError(f"{where_}: {b} = {safe.term(repr(v), 60)} must be an integer "
                                     f"0..{health.MAX_COUNT:,} of a health expectation",
                                     "write counter bounds in the [health] table")
                bounds[b] = v  # kept an int: it is saved in bundles and read back as one
                continue
            ok = (type(v) is float and math.isfinite(v)) or (type(v) is int and abs(v) <= MAX_BOUND)
            if not ok or not 0 < v <= MAX_BOUND:
                shown = f"(a {len(str(abs(v)))}-digit integer)" if type(v) is int and abs(v) > 10**15 else repr(v)
                raise UsageError(f"{where_}: {b} = {safe.term(shown, 60)} must be a number > 0",
                                 f"at most {MAX_BOUND:g}")
            bounds[b] = float(v)
    kinds = {{"gbps": "GB/s", "us": "us", "count": "count"}[b.rpartition("_")[2]] for b in bounds}
    if not bounds:
        raise UsageError(f"{where_} has no bound", f"give one of {', '.join(BOUNDS)}")
    if len(kinds) > 1:
        raise UsageError(f"{where_} mixes {' and '.join(sorted(kinds, key=str.lower))} bounds", "one expectation checks one kind of figure")
    if (cmd == "health") != ("count" in kinds):
        raise UsageError(f"{where_}: a health expectation bounds a count (min_count, max_count) and only it does",
                         "write counter bounds in the [health] table (docs/suite.md)")
    for lo, hi in (("min_gbps", "max_gbps"), ("min_us", "max_us"), ("min_count", "max_count")):
        if lo in bounds and hi in bounds and bounds[lo] > bounds[hi]:
            raise UsageError(f"{where_}: {lo} {bounds[lo]:g} is above {hi} {bounds[hi]:g}")
    fig = e.get("figure", "median")
    if cmd == "health":
        if not isinstance(fig, str) or fig.partition(".")[2] not in health.COUNTERS or not fig.startswith("health."):
            raise UsageError(f"{where_}: figure {safe.term(repr(fig), 80)} is no health counter",
                             f"use health.{', health.'.join(health.COUNTERS)}")
    elif not isinstance(fig, str) or not (fig in FIGURES or (fig.startswith("extra.") and len(fig) > 6)):
        raise UsageError(f"{where_}: figure {safe.term(repr(fig), 80)} not known",
                         f"use {', '.join(FIGURES)} or extra.KEY")
    for k in ("name", "source"):
        if not isinstance(e.get(k, ""), str):
            raise UsageError(f"{where_}: {k} must be a string")
    nodes = e.get("nodes")
    if nodes is not None and (type(nodes) is not int or not 1 <= nodes <= MAX_NODES):
        raise UsageError(f"{where_}: nodes = {safe.term(repr(nodes), 60)} must be an integer 1..{MAX_NODES:,}",
                         "the number of nodes the figure needs")
    return Expectation(index, cmd, dict(w), fig, name=e.get("name", ""), source=e.get("source", ""), nodes=nodes,
                       **bounds)


def parse_expectations(doc: dict, source: str = "expectations", known_commands: Sequence[str] | None = None
                       ) -> list[Expectation]:
    """Check a parsed TOML document and build its expectations (:func:`check_expectation` each).
    UsageError: no ``[[expect]]`` tables, more than MAX_EXPECTATIONS, or a table refused."""
    source = safe.term(source, 200)
    extra = set(doc) - {"expect", "health", "profile"}
    if extra:
        raise UsageError(f"{source}: unknown top-level key(s) {safe.term(', '.join(sorted(extra)), 200)}",
                         "an expectations file holds [[expect]] tables, a [health] table and a [profile] table")
    profile = doc.get("profile", {})
    if not isinstance(profile, dict) or set(profile) - {"description", "source"} or \
            not all(isinstance(v, str) for v in profile.values()):
        raise UsageError(f"{source}: [profile] holds description and source, both strings")
    items = doc.get("expect", [])
    if not isinstance(items, list) or not (items or "health" in doc):
        raise UsageError(f"{source} has no [[expect]] tables", "see docs/suite.md for the format")
    n = len(items) + (len(doc["health"]) if isinstance(doc.get("health"), dict) else 0)
    if n > MAX_EXPECTATIONS:
        raise UsageError(f"{source} holds {n:,} expectations", f"at most {MAX_EXPECTATIONS:,}")
    out = [check_expectation(e, i, f"{source}: expectation {i}", known_commands) for i, e in enumerate(items, 1)]
    if "health" in doc:
        for t in health.parse(doc["health"], source, len(items) + 1):
            i = t.pop("_index")
            out.append(check_expectation(t, i, f"{source}: [health] {t['name'].split(' = ')[0]}", known_commands))
    return out


def load_expectations(path: str | os.PathLike, known_commands: Sequence[str] | None = None) -> list[Expectation]:
    """Read and check an expectations TOML file. UsageError: unreadable, not TOML, or not a valid one."""
    name = safe.term(str(path), 200)
    raw = R.read_bounded(path, "an expectations file")  # bounded; a named pipe does not block
    if len(raw) > MAX_EXPECT_BYTES:
        raise UsageError(f"{name} is {len(raw):,} bytes, too large for an expectations file",
                         f"at most {MAX_EXPECT_BYTES:,} bytes ({MAX_EXPECTATIONS:,} expectations)")
    opened = len(_TABLE_HEADER.findall(raw)) + raw.count(b"{")  # refused before tomllib spends seconds
    if opened > 2 * MAX_EXPECTATIONS + 16:
        raise UsageError(f"{name} holds about {opened:,} tables", f"at most {MAX_EXPECTATIONS:,} expectations")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{name} is not UTF-8 text", "expected a TOML expectations file") from None
    doc = _toml_loads(text, name)
    R.check_depth(R.object_depth(doc), name, "an expectations file")
    return parse_expectations(doc, name, known_commands)


@dataclass
class Outcome:
    """The check of one expectation against one record (params None: against nothing): status
    "pass", "fail", "missing" or "skipped", the value in GB/s or microseconds, why in ``note``."""

    expectation: Expectation
    status: str
    params: dict[str, Any] | None = None
    value: float | None = None
    note: str = ""

    def to_dict(self) -> dict:
        return {"expectation": self.expectation.to_dict(), "status": self.status, "params": self.params,
                "value": self.value, "unit": self.expectation.unit, "note": self.note}


def figure_value(e: Expectation, r: Record) -> float:
    """The checked figure of a record: GB/s (1e9 B/s) or microseconds. ValueError: the record's
    metric does not suit the bound, or the figure cannot be computed."""
    if e.figure.startswith("extra."):
        key = e.figure[6:]
        v = r.extra.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"record has no number extra[{key!r}]")
        return v / 1e9 if e.kind == "bandwidth" else v * 1e6
    if r.metric != e.kind:
        raise ValueError(f"record metric is {r.metric!r}, bound is for {e.kind}")
    if not r.samples_s:
        raise ValueError("record has no samples")
    if any(not (math.isfinite(t) and t > 0) for t in r.samples_s):
        raise ValueError("record has a sample that is not a positive time")
    if e.kind == "bandwidth":
        if r.nbytes <= 0:
            raise ValueError("bandwidth record moves no bytes")
        s = Summary.of([r.nbytes / t / 1e9 for t in r.samples_s])
    else:
        s = Summary.of([t * 1e6 for t in r.samples_s])
    return getattr(s, e.figure)


def nodes_of(res: Result) -> int:
    """How many nodes a result's figures span: its env's ``nodes``, else its launch's, else 1."""
    for v in (res.env.get("nodes"), (res.env.get("launch") or {}).get("nodes")
              if isinstance(res.env.get("launch"), dict) else None):
        if type(v) is int and v >= 1:
            return v
    return 1


def evaluate(expectations: Sequence[Expectation], results: Sequence[Result],
             skipped: dict[str, str] | None = None, failed: dict[str, str] | None = None) -> list[Outcome]:
    """Check every expectation against the records of its command: outcomes in expectation order,
    one per matching record. ``skipped``/``failed``: command -> why its step did not run / failed."""
    skipped = skipped or {}
    failed = failed or {}
    by_cmd: dict[str, list[Record]] = {}
    nodes: dict[str, int] = {}  # command -> the most nodes one of its results spans
    for res in results:
        by_cmd.setdefault(res.command, []).extend(res.records)
        nodes[res.command] = max(nodes.get(res.command, 1), nodes_of(res))
    index: dict[str, tuple[dict, dict]] = {}  # command -> (added_params, {param: {_hkey(value): [record index]}})
    out: list[Outcome] = []

    def room(n: int) -> None:  # before the work of n more rows, not after it
        if len(out) + n > MAX_OUTCOMES:
            raise UsageError(f"the expectations match more than {MAX_OUTCOMES:,} records",
                             "narrow their where tables; each match is one row of the report")

    def add(o: Outcome) -> None:
        room(1)
        out.append(o)

    for e in expectations:
        if e.command == "health":
            for o in health.outcomes(e, results, Outcome):
                add(o)
            continue
        if e.command in failed:
            add(Outcome(e, "fail", note=f"{e.command} failed: {failed[e.command]}"))
            continue
        spans = nodes.get(e.command, 1)
        if e.nodes is not None and e.command in nodes and spans < e.nodes:
            add(Outcome(e, "skipped", note=f"needs {e.nodes} nodes; the {e.command} results span {spans}"))
            continue
        records = by_cmd.get(e.command)
        if records is None:
            add(Outcome(e, "skipped", note=skipped.get(e.command, f"no {e.command} result given")))
            continue
        if e.command not in index:  # built on first use
            added = registry.added(e.command, "added_params")
            by: dict[str, dict[tuple, list[int]]] = {}
            for i, r in enumerate(records):
                for k, v in {**added, **r.params}.items():
                    by.setdefault(k, {}).setdefault(_hkey(v), []).append(i)
            index[e.command] = (added, by)
        added, by = index[e.command]
        have = by.keys()
        absent = [k for k in e.where if k not in have]
        if absent:
            add(Outcome(e, "missing", note=f"no {e.command} record has param(s) {', '.join(absent)}; "
                                           f"params are {', '.join(sorted(have))}"))
            continue
        hits = _matching(records, by, added, e.where)
        if not hits:
            add(Outcome(e, "missing", note="no {} record has {}".format(
                e.command, " ".join(f"{k}={v}" for k, v in e.where.items()))))
            continue
        room(len(hits))
        for r in hits:
            if r.error:
                add(Outcome(e, "fail", dict(r.params), note=f"point failed: {r.error}"))
                continue
            try:
                v = figure_value(e, r)
            except ValueError as err:
                add(Outcome(e, "fail", dict(r.params), note=str(err)))
                continue
            lo, hi = e.bounds
            add(Outcome(e, "pass" if (lo is None or v >= lo) and (hi is None or v <= hi) else "fail", dict(r.params), v))
    return out


def _hkey(v: Any) -> tuple:
    """A hashable key under which equal params values meet: a bool only matches a bool, 1 matches 1.0."""
    if isinstance(v, bool) or v is None:
        return ("b", v)
    if isinstance(v, (int, float)):
        return ("n", v)
    return ("s", v) if isinstance(v, str) else ("o", repr(v))


def _matching(records: Sequence[Record], by: dict[str, dict[tuple, list[int]]], added: dict[str, Any],
              where: dict[str, Any]) -> list[Record]:
    """The records whose params (``added`` filling absent ones) hold every ``where`` value
    (:func:`_hkey`), in file order: those of the shortest (param, value) list of ``by``, checked."""
    if not where:
        return list(records)
    want = {k: _hkey(v) for k, v in where.items()}
    first = min((by.get(k, {}).get(h, []) for k, h in want.items()), key=len)
    params = ({**added, **records[i].params} for i in first)
    return [records[i] for i, p in zip(first, params) if all(k in p and _hkey(p[k]) == h for k, h in want.items())]


def failures(outcomes: Sequence[Outcome], strict: bool = False) -> list[Outcome]:
    """Outcomes that fail the suite: fail and missing, and skipped when ``strict``."""
    bad = {"fail", "missing"} | ({"skipped"} if strict else set())
    return [o for o in outcomes if o.status in bad]


# ---- the bundle ----

@dataclass
class Step:
    """One benchmark of a suite run: its name, status ("ok", "skipped", "error"), why, time, result."""

    name: str
    command: str
    status: str
    reason: str = ""
    seconds: float = 0.0
    result: Result | None = None
    path: str | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "command": self.command, "status": self.status, "reason": self.reason,
                "seconds": round(self.seconds, 3), "path": self.path,
                "result": self.result.to_dict() if self.result else None}


@dataclass
class Bundle:
    """Every step of a suite run with its result, the environment and the expectation outcomes."""

    steps: list[Step] = field(default_factory=list)
    env: dict = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    expect_file: str | None = None
    outcomes: list[Outcome] = field(default_factory=list)
    strict: bool = False  # the run's --strict: report and suite --check judge the bundle as it did
    created: str = field(
        default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    fleet: dict | None = None  # a fleet bundle's "fleet" object (docs/fleet.md), checked on load

    def results(self) -> list[Result]:
        return [s.result for s in self.steps if s.result is not None]

    def skipped(self) -> dict[str, str]:
        return {s.command: s.reason for s in self.steps if s.status == "skipped"}

    def failed(self) -> dict[str, str]:
        return {s.command: s.reason for s in self.steps if s.status == "error"}

    def to_dict(self) -> dict:
        return {
            "schema": BUNDLE_SCHEMA,
            "schema_version": BUNDLE_VERSION,
            "gpubench_version": __version__,
            "created": self.created,
            "argv": self.argv,
            "env": self.env,
            "steps": [s.to_dict() for s in self.steps],
            "expectations": {"file": self.expect_file, "strict": self.strict,
                             "outcomes": [o.to_dict() for o in self.outcomes]},
            **({"fleet": self.fleet} if self.fleet is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: dict, source: str = "bundle") -> "Bundle":
        """Check a parsed bundle field by field and build it. UsageError: a newer bundle version, or
        the first bad field named by its JSON Pointer."""
        name = safe.term(source, 200)
        R.check_schema_version(name, d.get("schema_version"), BUNDLE_VERSION, "bundle ")
        steps = d.get("steps")
        if not isinstance(steps, list):
            raise R.bad_field(source, "/steps", steps, "an array of steps")
        argv = d.get("argv") or []
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise R.bad_field(source, "/argv", argv, "an array of strings")
        b = cls(env=R.check_env(d.get("env"), source, "/env"), argv=list(argv),
                created=R.check_str(d.get("created", ""), source, "/created") or "")
        for i, st in enumerate(steps):
            p = f"/steps/{i}"
            if not isinstance(st, dict):
                raise R.bad_field(source, p, st, "a step object")
            step_name = R.check_str(st.get("name"), source, p + "/name", nonempty=True)
            command = R.check_command(st.get("command", step_name), source, p + "/command")
            res = st.get("result")
            b.steps.append(Step(
                name=step_name, command=command,  # type: ignore[arg-type]
                status=R.check_str(st.get("status", "ok"), source, p + "/status",  # type: ignore[arg-type]
                                   choices=("ok", "skipped", "error")),
                reason=R.check_str(st.get("reason"), source, p + "/reason", allow_none=True) or "",
                seconds=R.check_number(st.get("seconds") or 0.0, source, p + "/seconds"),
                result=Result.from_dict(res, source=source, pointer=p + "/result") if res is not None else None,
                path=R.check_str(st.get("path"), source, p + "/path", allow_none=True)))
        exp = d.get("expectations") or {}
        if not isinstance(exp, dict):
            raise R.bad_field(source, "/expectations", exp, "an object")
        b.expect_file = R.check_str(exp.get("file"), source, "/expectations/file", allow_none=True)
        strict = exp.get("strict", False)
        if not isinstance(strict, bool):
            raise R.bad_field(source, "/expectations/strict", strict, "true or false")
        b.strict = strict
        outcomes = exp.get("outcomes") or []
        if not isinstance(outcomes, list) or len(outcomes) > MAX_OUTCOMES:
            raise R.bad_field(source, "/expectations/outcomes", outcomes, f"an array of at most {MAX_OUTCOMES:,} outcomes")
        for i, o in enumerate(outcomes):
            p = f"/expectations/outcomes/{i}"
            if not isinstance(o, dict):
                raise R.bad_field(source, p, o, "an outcome object")
            e = o.get("expectation")
            if not isinstance(e, dict):
                raise R.bad_field(source, p + "/expectation", e, "an expectation object")
            index = R.check_int(e.get("index", i + 1), source, p + "/expectation/index", 1, MAX_EXPECTATIONS)
            body = {k: val for k, val in e.items() if k != "index"}
            exp_ = check_expectation(body, index, f"{name}: {p}/expectation")
            params = o.get("params")
            if params is not None and (not isinstance(params, dict) or not all(_scalar_ok(x) for x in params.values())):
                raise R.bad_field(source, p + "/params", params, "an object of scalars or null")
            value = o.get("value")
            b.outcomes.append(Outcome(
                exp_, status=R.check_str(o.get("status"), source, p + "/status",  # type: ignore[arg-type]
                                         choices=("pass", "fail", "missing", "skipped")),
                params=params, value=None if value is None else R.check_number(value, source, p + "/value"),
                note=R.check_str(o.get("note"), source, p + "/note", allow_none=True) or ""))
        if d.get("fleet") is not None:
            b.fleet = check_fleet(d["fleet"], name)
        return b


def save_bundle(bundle: Bundle, path: str | os.PathLike) -> Path:
    """Write the bundle atomically (core.result.write_json_atomic). Raises MachineError on a failed write."""
    return R.write_json_atomic(bundle.to_dict(), path, "bundle")


def load_checkable(path: str | os.PathLike) -> Bundle:
    """Read a suite bundle or a single saved result (wrapped into a one-step bundle). UsageError:
    unreadable, not JSON, neither a bundle nor a result, or a newer schema."""
    name = str(path)
    d = R.read_json(path, "a suite bundle or a file saved by --json")
    if isinstance(d, dict) and d.get("schema") == BUNDLE_SCHEMA:
        return Bundle.from_dict(d, name)
    res = Result.from_dict(d, source=name)
    return Bundle(steps=[Step(res.command, res.command, "ok", result=res, path=name)], env=res.env)


# ---- rendering ----

def fmt_value(v: float) -> str:
    """A measured figure as the tables show it: 1 decimal from 100, 2 from 1, else 3 significant digits."""
    return f"{v:.1f}" if v >= 100 else f"{v:.2f}" if v >= 1 else f"{v:.3g}"


def outcome_rows(outcomes: Sequence[Outcome]) -> list[list[str]]:
    """Text cells (safe.term): #, command, figure, also-matched params, bound, measured, status (with note)."""
    rows = []
    for o in outcomes:
        e = o.expectation
        fig = e.label() + ("" if e.figure == "median" else f" [{e.figure}]")
        status = o.status.upper() if o.status in ("fail", "missing") else o.status
        if o.note:
            status += f": {o.note}"
        also = " ".join(f"{k}={format_size(v) if k == 'nbytes' and type(v) is int and v >= 0 else v}"
                        for k, v in (o.params or {}).items() if k not in e.where)
        rows.append([safe.term(x) for x in
                     (str(e.index), e.command, fig, also, e.bound_text(),
                      "-" if o.value is None else fmt_value(o.value), status)])
    return rows


def format_report(bundle: Bundle, strict: bool = False) -> list:
    """Rich renderables: the steps table (when steps ran here), the expectations table, a verdict line."""
    from rich.text import Text

    out: list = []
    if any(s.status != "ok" or s.seconds for s in bundle.steps):
        t = report.table("Suite steps", ["step", "status", "seconds", "figures", "note / saved to"])
        for s in bundle.steps:
            n = len(s.result.records) if s.result else 0
            t.add_row(Text(safe.term(s.name)), Text(safe.term(s.status)), f"{s.seconds:.1f}", str(n),
                      Text(safe.term(s.reason or (s.path or ""))))
        out.append(t)
    if bundle.outcomes:
        t = report.table(f"Expectations ({safe.term_markup(bundle.expect_file)})",
                         ["#", "command", "figure", "record", "bound", "measured", "status"])
        for cells in outcome_rows(bundle.outcomes):
            style = "red" if cells[-1].startswith(("FAIL", "MISSING")) else None
            t.add_row(*[Text(c) for c in cells], style=style)
        out.append(t)
        out.append(Text(verdict_line(bundle, strict)))
    elif bundle.expect_file is None:
        out.append("no --expect file: nothing checked.")
    return out


def verdict_line(bundle: Bundle, strict: bool = False) -> str:
    """"FAILED: ..." when an expectation failed or is missing (skipped too when strict) or a step had an
    error; "PASSED: ..." when at least one passed; else "NOTHING CHECKED: ..."; with the counts."""
    strict = strict or bundle.strict
    c = Counter(o.status for o in bundle.outcomes)
    bad = len(failures(bundle.outcomes, strict))
    errors = [s.name for s in bundle.steps if s.status == "error"]
    head = "FAILED" if bad or errors else "PASSED" if c["pass"] else "NOTHING CHECKED"
    s = f"{head}: {c['pass']} pass, {c['fail']} fail, {c['missing']} missing, {c['skipped']} skipped"
    if strict and c["skipped"]:
        s += " (skipped counts as failed: --strict)"
    if errors:
        s += f"; step(s) with errors: {safe.term(', '.join(errors))}"
    return s + "."


# ---- a saved fleet object (written by the fleet suite, gpubench.validation.fleet), read and checked

FLEET_KIND = "gpubench-fleet"
FLEET_VERSION = 1
FLEET_FLAGS = ("ok", "slow", "fail", "missing")


def _fleet_bad(source: str, where: str, value: Any, want: str) -> UsageError:
    return UsageError(f"{source}: fleet.{where} is {safe.term(repr(value), 40)}; expected {want}")


def _num_or_none(v: Any) -> bool:
    if isinstance(v, int) and not isinstance(v, bool):
        return abs(v) < 10**300
    return v is None or (isinstance(v, float) and math.isfinite(v) and abs(v) < 1e300)


def _rank_ok(x: Any) -> bool:
    """A rank or GPU index of a fleet object: an int 0..2**31 (not a bool)."""
    return type(x) is int and 0 <= x <= 2**31


_NUMBER = (_num_or_none, "a number between -1e300 and 1e300, or null")
# each field checked, in order, of a fleet row and of a missing rank: (test, what it should be)
_ROW_FIELDS = {"value": _NUMBER, "fleet_median": _NUMBER, "expect": _NUMBER, "rank": (_rank_ok, "an integer 0..2**31"),
               "gpu": (lambda x: x is None or _rank_ok(x), "an integer 0..2**31 or null"),
               "flag": (lambda x: x in FLEET_FLAGS, " or ".join(FLEET_FLAGS))}
_MISSING_FIELDS = {"rank": _ROW_FIELDS["rank"], "host": (lambda x: isinstance(x, (str, type(None))), "a string or null")}


def _check_fields(obj: dict, fields: dict, source: str, where: str) -> None:
    for k, (ok, want) in fields.items():
        if not ok(obj.get(k)):
            raise _fleet_bad(source, f"{where}.{k}", obj.get(k), want)


def check_fleet(f: Any, source: str) -> dict:
    """Check a fleet object (written by ``suite`` under a launcher) and return it.

    Shape (version 1)::

        {"kind": "gpubench-fleet", "version": 1, "rule": {"name": str, "text": str},
         "missing": [{"rank": int, "host": str}],
         "rows": [{"host": str, "rank": int, "gpu": int|null, "uuid": str|null, "check": str,
                   "value": float|null, "unit": str, "fleet_median": float|null, "expect": float|null,
                   "expect_op": ">="|"<="|null, "flag": "ok"|"slow"|"fail"|"missing"}],
         "links": {"hosts": [str], "gbps": [[float|null]] (Gbit/s)}}

    Raises:
        UsageError: a field of the wrong type, a flag not in the list, a newer version, a links
            matrix that is not hosts x hosts; one line naming the field.
    """
    if not isinstance(f, dict) or f.get("kind") != FLEET_KIND:
        raise _fleet_bad(source, "kind", f.get("kind") if isinstance(f, dict) else f, repr(FLEET_KIND))
    v = f.get("version")
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise _fleet_bad(source, "version", v, "1")
    if v > FLEET_VERSION:
        raise UsageError(f"{source}: fleet version {v} is newer than this gpubench reads ({FLEET_VERSION})",
                         "upgrade gpubench")
    def part(key: str, empty: Any) -> Any:  # absent or null: empty
        return empty if f.get(key) is None else f[key]

    rule = part("rule", {})
    if not isinstance(rule, dict):
        raise _fleet_bad(source, "rule", rule, "an object with name and text")
    rows = part("rows", [])
    if not isinstance(rows, list):
        raise _fleet_bad(source, "rows", rows, "a list")
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise _fleet_bad(source, f"rows[{i}]", r, "an object")
        _check_fields(r, _ROW_FIELDS, source, f"rows[{i}]")
    missing = part("missing", [])
    if not isinstance(missing, list) or not all(isinstance(m, dict) for m in missing):
        raise _fleet_bad(source, "missing", missing, "a list of {rank, host}")
    for i, m in enumerate(missing):
        _check_fields(m, _MISSING_FIELDS, source, f"missing[{i}]")
    links = part("links", {})
    if not isinstance(links, dict):
        raise _fleet_bad(source, "links", links, "an object with hosts and gbps")
    hosts, gbps = ([] if links.get(k) is None else links[k] for k in ("hosts", "gbps"))
    if not isinstance(hosts, list) or not isinstance(gbps, list):
        raise _fleet_bad(source, "links", links, "hosts and gbps lists")
    if gbps and (len(gbps) != len(hosts) or any(not isinstance(row, list) or len(row) != len(hosts) for row in gbps)):
        raise _fleet_bad(source, "links.gbps", f"{len(gbps)} rows", f"{len(hosts)} x {len(hosts)} (one per host)")
    for i, row in enumerate(gbps):
        for j, x in enumerate(row):
            if not _num_or_none(x):
                raise _fleet_bad(source, f"links.gbps[{i}][{j}]", x, _NUMBER[1])
    return f

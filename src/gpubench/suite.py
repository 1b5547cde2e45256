"""Node validation: run a set of benchmarks, keep every result in one bundle, check expectations.

Expectations (TOML, read with :mod:`tomllib`; the format is documented in docs/suite.md)::

    [[expect]]
    name = "H2D pinned 1 GiB, GPU 0"          # optional label
    command = "copy"                          # which result the figure comes from
    where = { device = 0, direction = "h2d", memory = "pinned", nbytes = 1073741824 }
    min_gbps = 53.0                           # and/or max_gbps; or min_us / max_us for times
    figure = "median"                         # optional: "median" (default), "p25", "p75", "min", "max",
                                              # or "extra.KEY" (a number in B/s or seconds in record.extra)

Every record of ``command`` whose params contain all of ``where`` is checked (one row each).
Bandwidth bounds are in GB/s (1e9 B/s) against nbytes / seconds; time bounds in microseconds.

Outcomes: "pass"; "fail" (a figure outside its bound, a failed point, or a step that errored);
"missing" (results of the command exist but no record matches ``where``); "skipped" (no result of
that command: the step did not run here, e.g. p2p on one GPU). fail and missing fail the suite
(exit 1); skipped too with ``strict``.

The bundle (``schema: "gpubench.bundle"``, version 1) holds every step's status and full result,
the environment, and the outcomes; :func:`load_checkable` reads a bundle or a single result.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from gpubench import __version__
from gpubench.core.errors import UsageError
from gpubench.core.result import Record, Result

BUNDLE_SCHEMA = "gpubench.bundle"
BUNDLE_VERSION = 1
BOUNDS = ("min_gbps", "max_gbps", "min_us", "max_us")
FIGURES = ("median", "p25", "p75", "min", "max")
_KEYS = {"name", "command", "where", "figure", *BOUNDS}


@dataclass(frozen=True)
class Expectation:
    """One threshold from an expectations file.

    Attributes:
        index: 1-based position in the file (named in messages).
        command: the command whose results hold the figure.
        where: params a record must contain (exact values).
        figure: which statistic of the samples, or "extra.KEY".
        min_gbps, max_gbps: bandwidth bounds in GB/s (1e9 B/s), or None.
        min_us, max_us: time bounds in microseconds, or None.
        name: optional label.
    """

    index: int
    command: str
    where: dict[str, Any]
    figure: str = "median"
    min_gbps: float | None = None
    max_gbps: float | None = None
    min_us: float | None = None
    max_us: float | None = None
    name: str = ""

    @property
    def kind(self) -> str:
        """"bandwidth" when bounded in GB/s, else "time"."""
        return "bandwidth" if self.min_gbps is not None or self.max_gbps is not None else "time"

    def label(self) -> str:
        if self.name:
            return self.name
        return " ".join(f"{k}={v}" for k, v in self.where.items()) or "(every record)"

    def bound_text(self) -> str:
        if self.kind == "bandwidth":
            lo, hi, unit = self.min_gbps, self.max_gbps, "GB/s"
        else:
            lo, hi, unit = self.min_us, self.max_us, "us"
        parts = []
        if lo is not None:
            parts.append(f">= {lo:g}")
        if hi is not None:
            parts.append(f"<= {hi:g}")
        return " and ".join(parts) + f" {unit}"

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None and v != ""}


def _toml_loads(text: str, source: str) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            raise UsageError("reading TOML needs Python 3.11 or the tomli package", "pip install tomli") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{source} is not valid TOML: {str(e).splitlines()[0]}") from None


def parse_expectations(doc: dict, source: str = "expectations", known_commands: Sequence[str] | None = None
                       ) -> list[Expectation]:
    """Check a parsed TOML document and build its expectations.

    Raises:
        UsageError: no ``[[expect]]`` tables, an unknown key, a command not known, ``where`` not a
            table of scalars, no bound or bounds of both kinds, a bound that is not a positive number,
            min above max, or a figure not known.
    """
    extra = set(doc) - {"expect"}
    if extra:
        raise UsageError(f"{source}: unknown top-level key(s) {', '.join(sorted(extra))}",
                         "an expectations file holds [[expect]] tables")
    items = doc.get("expect")
    if not isinstance(items, list) or not items:
        raise UsageError(f"{source} has no [[expect]] tables", "see docs/suite.md for the format")
    out = []
    for i, e in enumerate(items, 1):
        where_ = f"{source}: expectation {i}"
        if not isinstance(e, dict):
            raise UsageError(f"{where_} is not a table")
        unknown = set(e) - _KEYS
        if unknown:
            raise UsageError(f"{where_} has unknown key(s) {', '.join(sorted(unknown))}",
                             f"known: {', '.join(sorted(_KEYS))}")
        cmd = e.get("command")
        if not isinstance(cmd, str) or not cmd:
            raise UsageError(f"{where_} needs command = \"...\" (e.g. \"copy\")")
        if known_commands is not None and cmd not in known_commands:
            raise UsageError(f"{where_}: command {cmd!r} not known", f"use one of {', '.join(known_commands)}")
        w = e.get("where", {})
        if not isinstance(w, dict) or any(isinstance(v, (dict, list)) for v in w.values()):
            raise UsageError(f"{where_}: where must be a table of params and single values",
                             'e.g. where = { direction = "h2d", nbytes = 1073741824 }')
        bounds = {}
        for b in BOUNDS:
            if b in e:
                v = e[b]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                    raise UsageError(f"{where_}: {b} = {v!r} must be a number > 0")
                bounds[b] = float(v)
        gb = any(b.endswith("gbps") for b in bounds)
        us = any(b.endswith("_us") for b in bounds)
        if not bounds:
            raise UsageError(f"{where_} has no bound", f"give one of {', '.join(BOUNDS)}")
        if gb and us:
            raise UsageError(f"{where_} mixes GB/s and us bounds", "one expectation checks one kind of figure")
        for lo, hi in (("min_gbps", "max_gbps"), ("min_us", "max_us")):
            if lo in bounds and hi in bounds and bounds[lo] > bounds[hi]:
                raise UsageError(f"{where_}: {lo} {bounds[lo]:g} is above {hi} {bounds[hi]:g}")
        fig = e.get("figure", "median")
        if not isinstance(fig, str) or not (fig in FIGURES or (fig.startswith("extra.") and len(fig) > 6)):
            raise UsageError(f"{where_}: figure {fig!r} not known", f"use {', '.join(FIGURES)} or extra.KEY")
        name = e.get("name", "")
        if not isinstance(name, str):
            raise UsageError(f"{where_}: name must be a string")
        out.append(Expectation(i, cmd, dict(w), fig, name=name, **bounds))
    return out


def load_expectations(path: str | os.PathLike, known_commands: Sequence[str] | None = None) -> list[Expectation]:
    """Read and check an expectations TOML file.

    Raises:
        UsageError: unreadable, not TOML, or not a valid expectations file (see parse_expectations).
    """
    from gpubench.core.result import read_bounded

    name = str(path)
    raw = read_bounded(path, "an expectations file")  # bounded; a named pipe does not block
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{name} is not UTF-8 text", "expected a TOML expectations file") from None
    return parse_expectations(_toml_loads(text, name), name, known_commands)


@dataclass
class Outcome:
    """The check of one expectation against one record (or against nothing).

    Attributes:
        expectation: what was checked.
        status: "pass", "fail", "missing" or "skipped".
        params: the record's params (None when no record).
        value: measured figure in GB/s (bandwidth) or microseconds (time), None when none.
        note: why it failed or was skipped.
    """

    expectation: Expectation
    status: str
    params: dict[str, Any] | None = None
    value: float | None = None
    note: str = ""

    def to_dict(self) -> dict:
        return {"expectation": self.expectation.to_dict(), "status": self.status, "params": self.params,
                "value": self.value, "unit": "GB/s" if self.expectation.kind == "bandwidth" else "us",
                "note": self.note}


def figure_value(e: Expectation, r: Record) -> float:
    """The checked figure of a record: GB/s (1e9 B/s) or microseconds.

    Raises:
        ValueError: the record's metric does not suit the bound, or the figure cannot be computed.
    """
    from gpubench.core.stats import Summary

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


def _within(e: Expectation, v: float) -> bool:
    lo, hi = (e.min_gbps, e.max_gbps) if e.kind == "bandwidth" else (e.min_us, e.max_us)
    return (lo is None or v >= lo) and (hi is None or v <= hi)


def evaluate(expectations: Sequence[Expectation], results: Sequence[Result],
             skipped: dict[str, str] | None = None, failed: dict[str, str] | None = None) -> list[Outcome]:
    """Check every expectation against the records of its command.

    Args:
        expectations: from :func:`load_expectations`.
        results: results to look in (several of one command are all searched).
        skipped: command -> why its step did not run (its expectations become "skipped").
        failed: command -> the error that stopped its step (its expectations become "fail").

    Returns:
        Outcomes in expectation order, one per matching record.
    """
    skipped = skipped or {}
    failed = failed or {}
    by_cmd: dict[str, list[Record]] = {}
    for res in results:
        by_cmd.setdefault(res.command, []).extend(res.records)
    out: list[Outcome] = []
    for e in expectations:
        if e.command in failed:
            out.append(Outcome(e, "fail", note=f"{e.command} failed: {failed[e.command]}"))
            continue
        recs = by_cmd.get(e.command)
        if recs is None:
            why = skipped.get(e.command, f"no {e.command} result given")
            out.append(Outcome(e, "skipped", note=why))
            continue
        have = {k for r in recs for k in r.params}
        absent = [k for k in e.where if k not in have]
        if absent:
            out.append(Outcome(e, "missing", note=f"no {e.command} record has param(s) {', '.join(absent)}; "
                                                  f"params are {', '.join(sorted(have))}"))
            continue
        hits = [r for r in recs if all(k in r.params and _eq(r.params[k], v) for k, v in e.where.items())]
        if not hits:
            out.append(Outcome(e, "missing", note="no {} record has {}".format(e.command, " ".join(f"{k}={v}" for k, v in e.where.items()))))
            continue
        for r in hits:
            if r.error:
                out.append(Outcome(e, "fail", dict(r.params), note=f"point failed: {r.error}"))
                continue
            try:
                v = figure_value(e, r)
            except ValueError as err:
                out.append(Outcome(e, "fail", dict(r.params), note=str(err)))
                continue
            out.append(Outcome(e, "pass" if _within(e, v) else "fail", dict(r.params), v))
    return out


def _eq(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


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
    created: str = field(
        default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))

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
            "expectations": {"file": self.expect_file, "outcomes": [o.to_dict() for o in self.outcomes]},
        }

    @classmethod
    def from_dict(cls, d: dict, source: str = "bundle") -> "Bundle":
        """Raises UsageError: a newer bundle version or a malformed one (each result is checked by
        Result.from_dict)."""
        v = d.get("schema_version")
        if not isinstance(v, int) or v < 1:
            raise UsageError(f"{source} has an unknown bundle schema version {v!r}")
        if v > BUNDLE_VERSION:
            raise UsageError(f"{source} has bundle schema version {v}, newer than this gpubench reads "
                             f"({BUNDLE_VERSION})", "upgrade gpubench")
        steps = d.get("steps")
        if not isinstance(steps, list):
            raise UsageError(f"{source} is a malformed gpubench bundle: steps is not a list")
        b = cls(env=d.get("env") or {}, argv=list(d.get("argv") or []), created=str(d.get("created", "")))
        for i, s in enumerate(steps):
            if not isinstance(s, dict) or not isinstance(s.get("name"), str):
                raise UsageError(f"{source} is a malformed gpubench bundle: step {i + 1}")
            res = s.get("result")
            b.steps.append(Step(
                name=s["name"], command=str(s.get("command", s["name"])), status=str(s.get("status", "ok")),
                reason=str(s.get("reason") or ""), seconds=float(s.get("seconds") or 0.0),
                result=Result.from_dict(res, source=f"{source} step {s['name']}") if res is not None else None,
                path=s.get("path")))
        exp = d.get("expectations") or {}
        b.expect_file = exp.get("file")
        try:
            for o in exp.get("outcomes") or []:
                e = dict(o["expectation"])
                b.outcomes.append(Outcome(
                    Expectation(**{k: e[k] for k in e if k in Expectation.__dataclass_fields__}),
                    status=str(o["status"]), params=o.get("params"), value=o.get("value"), note=str(o.get("note") or "")))
        except (KeyError, TypeError) as err:
            raise UsageError(f"{source} is a malformed gpubench bundle: expectation outcome ({err})") from None
        return b


def save_bundle(bundle: Bundle, path: str | os.PathLike) -> Path:
    """Write the bundle atomically (core.result.write_json_atomic). Raises MachineError on a failed write."""
    from gpubench.core.result import write_json_atomic

    return write_json_atomic(bundle.to_dict(), path, "bundle")


def load_checkable(path: str | os.PathLike) -> Bundle:
    """Read a suite bundle or a single saved result (wrapped into a one-step bundle).

    Raises:
        UsageError: unreadable, empty, not JSON, neither a bundle nor a result, or a newer schema.
    """
    from gpubench.core.result import read_json

    name = str(path)
    d = read_json(path, "a suite bundle or a file saved by --json")
    if isinstance(d, dict) and d.get("schema") == BUNDLE_SCHEMA:
        return Bundle.from_dict(d, name)
    res = Result.from_dict(d, source=name)
    return Bundle(steps=[Step(res.command, res.command, "ok", result=res, path=name)], env=res.env)


# ---- rendering ----

def _value_text(o: Outcome) -> str:
    if o.value is None:
        return "-"
    v = o.value
    return f"{v:.1f}" if v >= 100 else f"{v:.2f}" if v >= 1 else f"{v:.3g}"


def _params_text(o: Outcome) -> str:
    from gpubench.core.units import format_size

    if not o.params:
        return ""
    shown = []
    for k, v in o.params.items():
        if k in o.expectation.where:
            continue
        shown.append(f"{k}={format_size(v) if k == 'nbytes' and isinstance(v, int) else v}")
    return " ".join(shown)


def outcome_rows(outcomes: Sequence[Outcome]) -> list[list[str]]:
    """Text cells: #, command, figure, also-matched params, bound, measured, status (with note)."""
    rows = []
    for o in outcomes:
        e = o.expectation
        fig = e.label() + ("" if e.figure == "median" else f" [{e.figure}]")
        status = o.status.upper() if o.status in ("fail", "missing") else o.status
        if o.note:
            status += f": {o.note}"
        rows.append([str(e.index), e.command, fig, _params_text(o), e.bound_text(), _value_text(o), status])
    return rows


def format_report(bundle: Bundle, strict: bool = False) -> list:
    """Rich renderables: the steps table (when steps ran here), the expectations table, a verdict line."""
    from gpubench.core import report

    out: list = []
    if any(s.status != "ok" or s.seconds for s in bundle.steps):
        t = report.table("Suite steps", ["step", "status", "seconds", "figures", "note / saved to"])
        for s in bundle.steps:
            n = len(s.result.records) if s.result else 0
            t.add_row(s.name, s.status, f"{s.seconds:.1f}", str(n), s.reason or (s.path or ""))
        out.append(t)
    if bundle.outcomes:
        t = report.table(f"Expectations ({bundle.expect_file})",
                         ["#", "command", "figure", "record", "bound", "measured", "status"])
        for cells in outcome_rows(bundle.outcomes):
            style = "red" if cells[-1].startswith(("FAIL", "MISSING")) else None
            t.add_row(*cells, style=style)
        out.append(t)
        out.append(verdict_line(bundle, strict))
    elif bundle.expect_file is None:
        out.append("no --expect file: nothing checked.")
    return out


def verdict_line(bundle: Bundle, strict: bool = False) -> str:
    c = {k: 0 for k in ("pass", "fail", "missing", "skipped")}
    for o in bundle.outcomes:
        c[o.status] += 1
    bad = len(failures(bundle.outcomes, strict))
    errors = [s.name for s in bundle.steps if s.status == "error"]
    head = "FAILED" if bad or errors else "PASSED"
    s = f"{head}: {c['pass']} pass, {c['fail']} fail, {c['missing']} missing, {c['skipped']} skipped"
    if strict and c["skipped"]:
        s += " (skipped counts as failed: --strict)"
    if errors:
        s += f"; step(s) with errors: {', '.join(errors)}"
    return s + "."

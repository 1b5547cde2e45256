"""One self-contained HTML page of saved results, suite bundles, comparisons and a fleet
(docs/report.md describes the page in order).

No script, no link, nothing fetched: plots are PNGs inline as ``data:`` URIs under a
Content-Security-Policy. Every string from a file passes through :func:`gpubench.core.safe.html`
once, where it is written. Bandwidth = nbytes / seconds per sample (median, p25-p75), in GB/s
(1e9 B/s) or GiB/s; time in microseconds; busbw = algbw x busbw_factor (nccl-tests).
"""

from __future__ import annotations

import base64
import collections
import datetime as _dt
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from gpubench import __version__
from gpubench.analysis import compare as cmpmod
from gpubench.analysis import plot
from gpubench.core import limits, safe
from gpubench.core.errors import UsageError
from gpubench.core.result import Record, Result, check_input_name, read_json, write_bytes_atomic
from gpubench.core.telemetry import SLOWDOWN_REASONS
from gpubench.core.units import UNITS, format_size
from gpubench.validation import suite
from gpubench.validation.suite import FLEET_FLAGS, FLEET_KIND, check_fleet
from gpubench.validation.suite import fmt_value as _fmt

MAX_ROWS = 500  # rows of one table shown; the rest is counted, not drawn

h = safe.html


@dataclass
class Item:
    """One result to show: its display name and the Result."""

    name: str
    result: Result


@dataclass
class Inputs:
    """Everything read from the command line."""

    items: list[Item] = field(default_factory=list)
    bundles: list[tuple[str, Any]] = field(default_factory=list)  # (name, suite.Bundle)
    fleets: list[tuple[str, dict]] = field(default_factory=list)  # (name, checked fleet object)
    sources: list[str] = field(default_factory=list)
    baseline: Item | None = None  # --baseline: the result each input of its command is compared with


# ---- reading ----

def _add_file(inputs: Inputs, path: Path, name: str, seen_steps: set[str]) -> None:
    d = read_json(path, "a result, a suite bundle or a fleet bundle")
    if isinstance(d, dict) and isinstance(d.get("fleet"), dict):
        inputs.fleets.append((name, check_fleet(d["fleet"], name)))
    elif isinstance(d, dict) and d.get("kind") == FLEET_KIND:
        inputs.fleets.append((name, check_fleet(d, name)))
        return
    if isinstance(d, dict) and d.get("schema") == suite.BUNDLE_SCHEMA:
        try:
            b = suite.Bundle.from_dict(d, name)
        except (OverflowError, RecursionError, TypeError, ValueError, AttributeError) as e:
            raise UsageError(f"{name} is a malformed gpubench bundle: {type(e).__name__}") from None
        inputs.bundles.append((name, b))
        for s in b.steps:
            if s.result is not None:
                inputs.items.append(Item(f"{name}: {s.name}", s.result))
                if s.path:
                    seen_steps.add(os.path.basename(str(s.path)))
        return
    if isinstance(d, dict) and d.get("schema") is None and "fleet" in d:
        return
    res = plot.result_of(d, name)
    if path.name in seen_steps:
        return  # a bundle's step result, already shown with its bundle
    inputs.items.append(Item(name, res))


def read_inputs(paths: Sequence[str], baseline: str | None = None) -> Inputs:
    """Read results, bundles, bundle folders (their ``*.json``) and fleet objects, and the
    ``baseline`` result (--baseline) when given.

    Raises:
        UsageError: a path that does not exist, an empty folder, an unreadable or malformed file;
            a baseline that is not a measured result, or whose command no input has.
    """
    inputs = Inputs()
    seen_steps: set[str] = set()
    for p in paths:
        check_input_name(p, "a result, bundle or folder")
        path = Path(p)
        if path.is_dir():
            files = sorted(f for f in path.glob("*.json") if f.is_file())  # a FIFO would block the read
            if not files:
                raise UsageError(f"{p} is a folder with no .json file", "give results, bundles or their folder")

            def is_bundle(f: Path) -> bool:  # bundles first, so their steps' own files are not shown twice
                try:
                    return f.read_bytes()[:4096].find(suite.BUNDLE_SCHEMA.encode()) >= 0
                except OSError:
                    return False

            for f in sorted(files, key=lambda f: not is_bundle(f)):
                _add_file(inputs, f, str(f), seen_steps)
        elif path.exists() or path.is_symlink():
            _add_file(inputs, path, str(p), seen_steps)
        else:
            raise UsageError(f"{p} does not exist", "give result files, suite bundles or their folder")
        inputs.sources.append(str(p))
    if not inputs.items and not inputs.fleets and not inputs.bundles:
        raise UsageError("nothing to report: no result, bundle or fleet in the inputs")
    for it, short in zip(inputs.items, plot.display_names([it.name for it in inputs.items])):
        it.name = short
    if baseline is not None:
        inputs.baseline = _baseline(baseline, inputs)
    inputs.bundles = list(zip(plot.display_names([n for n, _ in inputs.bundles]), [b for _, b in inputs.bundles]))
    inputs.fleets = list(zip(plot.display_names([n for n, _ in inputs.fleets]), [f for _, f in inputs.fleets]))
    return inputs


# ---- flags ----

def record_flags(r: Record) -> list[str]:
    """Short flags of one record: failed, above peak / no-op (:func:`limits.saved_flag`), throttled,
    sharing the GPU with another process (telemetry), verification failed."""
    out = ["failed"] if r.error else []
    flag = {"above_peak": "above peak", "no_op": "no-op (moves no data)", "nvls": "above links (NVLS?)"}.get(
        limits.saved_flag(r) or "")
    if flag:
        out.append(flag)
    tele = r.telemetry if isinstance(r.telemetry, dict) else {}
    throttled = r.extra.get("throttled") is True or any(  # extra's throttle flags, or a slowdown reason in telemetry
        "throttle" in k and k != "throttled" and v and not isinstance(v, (int, float)) for k, v in r.extra.items())
    if throttled or any(x in SLOWDOWN_REASONS for x in cmpmod._reasons(tele)):
        out.append("throttled")
    others = tele.get("other_processes")
    if isinstance(others, int) and not isinstance(others, bool) and others > 0:
        out.append("GPU shared with another process")
    if r.extra.get("verified") is False:
        out.append("verification failed")
    return out


def result_flags(res: Result) -> list[str]:
    """Flags of a whole result, each one line: partial, and counts of flagged records."""
    out = [f"partial ({cmpmod.partial_why(res)})"] if res.partial else []
    pre = res.env.get("preflight") if isinstance(res.env, dict) else None
    if isinstance(pre, dict) and isinstance(pre.get("warnings"), list):
        out += [f"before the run: {w}" for w in pre["warnings"][:8]]  # the idle check's (GPU not idle)
    counts = collections.Counter(f for r in res.records for f in record_flags(r))  # first-seen order
    return out + [f"{n} point(s) {f}" for f, n in counts.items()]


# ---- tables ----

def _table(cols: Sequence[str], rows: Sequence[Sequence[str]], *, classes: Sequence[str] | None = None,
           caption: str | None = None, numeric_from: int = 1, raw_cells: bool = False, header: bool = True,
           total: int | None = None) -> str:
    """An HTML table; cells are escaped here unless ``raw_cells`` (already-built HTML)."""
    out = ["<table>"]
    if caption:
        out.append(f"<caption>{h(caption)}</caption>")
    if header:
        out.append("<thead><tr>" + "".join(f"<th>{h(c)}</th>" for c in cols) + "</tr></thead>")
    out.append("<tbody>")
    for i, row in enumerate(rows[:MAX_ROWS]):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        cells = "".join(f'<td{" class=num" if j >= numeric_from else ""}>{c if raw_cells else h(c)}</td>'
                        for j, c in enumerate(row))
        out.append(f"<tr{cls}>{cells}</tr>")
    out.append("</tbody></table>")
    total = len(rows) if total is None else total
    if total > min(len(rows), MAX_ROWS):
        out.append(f"<p class=note>First {min(len(rows), MAX_ROWS)} of {total} rows shown.</p>")
    return "\n".join(out)


def records_table(res: Result, units: str) -> str:
    """The figures of one result: the params that vary, median, p25-p75, n, % of peak, flags."""
    recs = res.records
    keys = plot._mode_keys(recs, set()) or (list(recs[0].params)[:3] if recs else [])
    nccl = cmpmod.plugin_of(res.command).plot_kind == "collective"  # algbw and busbw columns
    metrics = {r.metric for r in recs}
    unit = f"{units}/s" if metrics == {"bandwidth"} else "us" if metrics == {"time"} else f"{units}/s or us"
    gbit = any(isinstance(r.extra.get("gbit_per_s"), (int, float)) for r in recs[:MAX_ROWS])  # net's own Gbit/s
    cols = keys + ([f"algbw {unit}", f"busbw {unit}"] if nccl else [f"median {unit}"]) + \
        ["p25-p75", "n"] + (["overall Gbit/s"] if gbit else []) + ["% of peak", "flags"]
    rows, classes = [], []
    for r in recs[:MAX_ROWS]:  # the rest is counted, not computed
        cells = [format_size(r.params[k]) if k in ("nbytes", "piece_bytes", "width") and isinstance(r.params.get(k), int)
                 and not isinstance(r.params.get(k), bool) else str(r.params.get(k, "-")) for k in keys]
        flags = record_flags(r)
        if r.samples_s and not r.error and (r.metric == "time" or r.nbytes > 0):
            s = plot.values(r, units)
            cells.append(_fmt(s.median))
            if nccl:
                f = r.extra.get("busbw_factor")
                cells.append(_fmt(s.median * f) if isinstance(f, (int, float)) else "-")
            cells += [f"{_fmt(s.p25)}-{_fmt(s.p75)}", str(s.n)]
        else:
            cells += ["-"] * (3 if nccl else 2) + ["0"]
        if gbit:
            g = r.extra.get("gbit_per_s")
            cells.append(_fmt(g) if isinstance(g, (int, float)) and not isinstance(g, bool) and math.isfinite(g)
                         else "-")
        pct = limits.saved_pct_of_peak(r)
        cells.append(f"{pct:.0f}%" if pct is not None else "-")
        cells.append(", ".join(f"failed: {r.error}" if f == "failed" else f for f in flags))
        rows.append(cells)
        classes.append("bad" if {"above peak", "failed", "verification failed"} & set(flags) else "warn" if flags else "")
    return _table(cols, rows, classes=classes, numeric_from=len(keys), total=len(recs))


def _plot(results: Sequence[tuple[str, Result]], units: str, alt: str) -> str:
    try:
        png = plot.png_bytes(list(results), units=units, dpi=90, max_cols=2)
    except UsageError as e:
        return f"<p class=note>No plot: {h(e.message)}</p>"
    return (f'<figure><img alt="{h(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
            f"<figcaption>{h(alt)}</figcaption></figure>")


def _env_section(inputs: Inputs) -> str:
    by_facts: dict[tuple, list[str]] = {}  # env_facts' order is fixed: equal facts, equal tuples
    for it in inputs.items:
        env = it.result.env if isinstance(it.result.env, dict) else {}
        try:
            facts = cmpmod.env_facts(env)
        except (AttributeError, TypeError, ValueError):
            facts = {"environment": "malformed in this file"}
        by_facts.setdefault(tuple(facts.items()), []).append(it.name)
    if not by_facts:
        return ""
    seen = [(dict(k), names) for k, names in by_facts.items()]
    # one table: a row per fact, a column per distinct environment; facts that differ are marked
    keys = list(dict.fromkeys(k for facts, _ in seen for k, v in facts.items() if v not in ("-", "")))
    head = "".join(f"<th>{h(', '.join(Path(n).name for n in names[:4]))}"
                   f"{h(f' and {len(names) - 4} more') if len(names) > 4 else ''}</th>" for _, names in seen)
    body = []
    for k in keys:
        vals = [facts.get(k, "-") for facts, _ in seen]
        cls = " class=differs" if len(set(vals)) > 1 else ""
        body.append(f"<tr{cls}><th>{h(k)}</th>" + "".join(f"<td>{h(v)}</td>" for v in vals) + "</tr>")
    note = ("<p class=note>One column per distinct environment (the results named above it); "
            "rows that differ between them are marked.</p>" if len(seen) > 1 else "")
    return ("<section id=env><h2>Environment</h2>" + note + "<table class=env><thead><tr><th></th>" + head +
            "</tr></thead><tbody>" + "".join(body) + "</tbody></table></section>")


def _fleet_section(name: str, f: dict) -> str:
    rule = f.get("rule") or {}
    rows = f.get("rows") or []
    counts = {k: sum(1 for r in rows if r.get("flag") == k) for k in FLEET_FLAGS}
    out = [f"<section class=fleet><h2>Fleet: {h(name)}</h2>",
           f"<p>Rule <b>{h(rule.get('name', '-'))}</b>: {h(rule.get('text', ''))}</p>",
           "<p class=verdict>" + " ".join(f"<span class={k}>{counts[k]} {k}</span>" for k in FLEET_FLAGS) + "</p>"]

    def num(v: Any) -> str:
        return "-" if v is None else _fmt(float(v))

    cells, classes = [], []
    for r in rows:
        cells.append([str(r.get("host", "-")), str(r.get("rank", "-")), "-" if r.get("gpu") is None else str(r["gpu"]),
                      str(r.get("uuid") or "-"), str(r.get("check", "-")), num(r.get("value")), str(r.get("unit", "")),
                      num(r.get("fleet_median")), num(r.get("expect")), str(r.get("flag")).upper()
                      if r.get("flag") != "ok" else "ok"])
        classes.append({"ok": "", "slow": "warn", "fail": "bad", "missing": "gone"}[r.get("flag")])
    out.append(_table(["host", "rank", "GPU", "UUID", "check", "value", "unit", "fleet median", "expect", "flag"],
                      cells, classes=classes, numeric_from=5))
    missing = f.get("missing") or []
    if missing:
        out.append("<p class=bad>Missing ranks (no result): " +
                   ", ".join(f"rank {h(m.get('rank'))} on {h(m.get('host'))}" for m in missing) + "</p>")
    links = f.get("links") or {}
    hosts, gbps = links.get("hosts") or [], links.get("gbps") or []
    if hosts and gbps:
        top = max([x for row in gbps for x in row if x is not None] or [1.0])

        def cell(x: Any) -> str:  # darker = faster
            if x is None:
                return "<td class='num gone'>-</td>"
            frac = max(0.0, min(1.0, float(x) / top)) if top else 0.0
            return f"<td class=num style='background:rgba(31,119,180,{0.12 + 0.6 * frac:.2f})'>{_fmt(float(x))}</td>"

        body = [f"<tr><th>{h(host)}</th>{''.join(map(cell, row))}</tr>" for host, row in zip(hosts, gbps)]
        out.append("<table class=matrix><caption>Links between hosts (Gbit/s, row sends to column; "
                   "darker = faster)</caption><thead><tr><th></th>" + "".join(f"<th>{h(x)}</th>" for x in hosts) +
                   "</tr></thead><tbody>" + "".join(body) + "</tbody></table>")
    said = [c for c in links.get("culprits") or [] if isinstance(c, dict) and isinstance(c.get("says"), str)]
    if said:  # net's verdicts: the slow sender, receiver or link, each with its confidence
        out.append("<p>Who is slow (confidence 0.99 or more is named):</p><ul>" + "".join(
            f"<li class={'bad' if isinstance(c.get('confidence'), (int, float)) and c['confidence'] >= 0.99 else 'warn'}>"
            f"{h(c['says'])}</li>" for c in said) + "</ul>")
    out.append("</section>")
    return "\n".join(out)


def _bundle_section(name: str, b) -> str:
    out = [f"<section class=bundle><h2>Suite: {h(name)}</h2>"]
    rows = [[s.name, s.status, f"{s.seconds:.1f}", str(len(s.result.records) if s.result else 0), s.reason or ""]
            for s in b.steps]
    out.append(_table(["step", "status", "seconds", "figures", "note"], rows,
                      classes=["bad" if s.status == "error" else "warn" if s.status == "skipped" else "" for s in b.steps],
                      numeric_from=2))
    if b.outcomes:
        cells = suite.outcome_rows(b.outcomes)
        out.append(_table(["#", "command", "figure", "record", "bound", "measured", "status"], cells,
                          classes=["bad" if c[-1].startswith(("FAIL", "MISSING")) else "" for c in cells],
                          caption=f"Expectations ({b.expect_file})", numeric_from=4))
        line = suite.verdict_line(b)
        out.append(f"<p class='verdict {_line_class(line)}'>{h(line)}</p>")
    out.append("</section>")
    return "\n".join(out)


def _line_class(verdict_line: str) -> str:
    return "bad" if verdict_line.startswith("FAILED") else "ok" if verdict_line.startswith("PASSED") else "warn"


def _baseline(path: str, inputs: Inputs) -> Item:
    """The --baseline result: a measured result of a command that an input has.

    Raises:
        UsageError: naming the file and what it is.
    """
    shown = safe.term(path, 200)
    d = read_json(path, "a gpubench result")
    if not isinstance(d, dict) or d.get("schema") != "gpubench.result":
        raise UsageError(f"--baseline {shown} is not a gpubench result", "give one result file saved by --json")
    res = plot.result_of(d, path)
    if not res.records:  # env's: the machine, no figure
        raise UsageError(f"--baseline {shown} has no figures (its command: {safe.term(res.command, 40)})",
                         "give a measured result (copy, nccl, net...)")
    if not any(it.result.command == res.command for it in inputs.items):
        raise UsageError(f"--baseline {shown} is a result of {safe.term(res.command, 40)} and no input is",
                         "give inputs of the same command")
    return Item(os.path.basename(path) + " (baseline)", res)


def comparisons(inputs: Inputs) -> list[tuple[str, list]]:
    """(command, [Comparison]): each input of the --baseline's command against it; none without one."""
    base = inputs.baseline
    if base is None:
        return []
    command, cmps = base.result.command, []
    for it in inputs.items:
        if it.result.command != command:
            continue
        try:
            cmps.append(cmpmod.compare(base.result, it.result, base_name=base.name, new_name=it.name))
        except UsageError as e:  # records that cannot be paired: said, not fatal to the page
            cmps.append(cmpmod.Comparison(base.name, it.name, command, notes=[f"not compared: {e.message}"]))
    return [(command, cmps)]


def _compare_section(command: str, cmps: list, inputs: Inputs, units: str) -> str:
    out = [f"<section class=compare><h2>Comparison: {h(command)}</h2>"]
    for cmp in cmps:
        c = cmp.counts()
        out.append(f"<h3>{h(cmp.new_name)} against base {h(cmp.base_name)}</h3>")
        bad = c["slower"] or cmp.undecidable(slower_only=True)
        out.append(f"<p class='verdict {'bad' if bad else 'ok'}'>{h(cmpmod.summary_line(cmp))}</p>")
        if cmp.env_diff:
            out.append(_table(["what differs", "base", "new"], [list(x) for x in cmp.env_diff], numeric_from=99))
        else:
            out.append("<p>Same machine and options.</p>")
        for n in cmp.notes:
            out.append(f"<p class=note>note: {h(n)}</p>")
        cols, body = cmpmod.table_rows(cmp, units)
        verdict_class = {"slower": "bad", "faster": "good", "inconclusive": "warn", "undecidable": "warn"}
        vcol = cols.index("verdict")  # telemetry and flags columns may follow it
        first_figure = vcol - 6  # params, then base, new, n, change, interval, p
        paired = [(row, cells) for row, cells in zip(cmp.rows, body) if row.status == "paired"]
        other = [(row, cells) for row, cells in zip(cmp.rows, body) if row.status != "paired"]
        if paired:
            out.append(_table(cols, [c for _, c in paired], classes=[verdict_class.get(c[vcol], "") for _, c in paired],
                              numeric_from=first_figure, caption="Figures in both"))
        if other:
            out.append(f"<details><summary>{len(other)} figure(s) in one result only or without data</summary>" +
                       _table(cols, [c for _, c in other], numeric_from=first_figure) + "</details>")
    metrics = {r.metric for c in cmps for r in c.rows}
    lines = cmpmod.method_lines(cmpmod.DEFAULT_THRESHOLD_PCT, cmpmod.DEFAULT_ALPHA, units, metrics)
    out.append(f"<p class=note>{h(' '.join(lines))}</p>")
    members = [(it.name, it.result) for it in inputs.items if it.result.command == command]
    out.append(_plot(members, units, f"{command}: {len(members)} results overlaid, one colour per file"))
    out.append("</section>")
    return "\n".join(out)


def _result_section(i: int, it: Item, units: str) -> str:
    res = it.result
    flags = result_flags(res)
    timing = res.timing if isinstance(res.timing, dict) else {}
    meta = [["command", res.command], ["created", res.created], ["gpubench", res.gpubench_version],
            ["command line", " ".join(str(a) for a in res.argv) or "-"],
            ["clock", str(timing.get("clock", "-"))], ["method", str(timing.get("method", "-"))]]
    out = [f"<section class=result id=r{i}><h2>{h(res.command)}: {h(it.name)}</h2>",
           _table(["", ""], meta, numeric_from=99, header=False)]
    if flags:
        out.append("<ul class=flags>" + "".join(f"<li class=bad>{h(f)}</li>" for f in flags) + "</ul>")
    else:
        out.append("<p class='verdict ok'>No flags: complete, nothing above peak, nothing throttled or failed.</p>")
    out.append(_plot([(it.name, res)], units, f"{res.command}: {it.name}"))
    out.append(records_table(res, units))
    out.append("</section>")
    return "\n".join(out)


CSS = """
:root { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: #111; }
body { max-width: 1400px; margin: 1.5em auto; padding: 0 1em; line-height: 1.35; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { border-bottom: 2px solid #ccc; padding-bottom: 0.15em; }
table { border-collapse: collapse; margin: 0.6em 0 1em; font-size: 0.86em; }
caption { text-align: left; font-weight: 600; padding: 0.2em 0; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; vertical-align: top; }
th { background: #f0f0f0; } td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.bad td, li.bad, p.bad, .verdict.bad, span.fail { background: #fde0dc; color: #8a1100; }
tr.warn td, span.slow, .verdict.warn, li.warn { background: #fff3cd; color: #6b4e00; }
tr.gone td, td.gone, span.missing { background: #e8e8e8; color: #555; }
tr.good td { background: #e3f4e1; } tr.differs th, tr.differs td { background: #fff3cd; }
table.env td { max-width: 28em; overflow-wrap: anywhere; } .verdict.ok, span.ok { background: #e3f4e1; color: #174d12; }
.verdict { padding: 0.3em 0.6em; display: inline-block; } .verdict span { padding: 0.1em 0.4em; margin-right: 0.3em; }
ul.flags { padding-left: 1.2em; } ul.flags li { margin: 0.15em 0; padding: 0.1em 0.4em; }
p.note { color: #444; font-size: 0.9em; }
figure { margin: 0.5em 0 1.5em; } figure img { max-width: 100%; height: auto; border: 1px solid #ddd; }
figcaption { font-size: 0.85em; color: #444; }
nav ul { columns: 2; } code { font-size: 0.92em; }
@media print {
  body { max-width: none; margin: 0; font-size: 10pt; } nav { display: none; }
  section { break-before: auto; } figure, tr, caption { break-inside: avoid; } h2, h3, caption { break-after: avoid; }
  thead { display: table-header-group; } details { display: block; }
  figure img { max-width: 100%; border: none; }
  tr.bad td, tr.warn td, tr.gone td, tr.good td, td, .verdict, span { -webkit-print-color-adjust: exact;
    print-color-adjust: exact; }
  @page { size: A4 landscape; margin: 12mm; }
}
"""


def build(inputs: Inputs, *, units: str = "GB", title: str | None = None, created: str | None = None) -> str:
    """The whole HTML page as text: ``units`` "GB" or "GiB", ``title`` the heading (default
    "gpubench report"), ``created`` the ISO 8601 time shown as "written" (default now, UTC)."""
    created = created or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    heading = title or "gpubench report"
    cmps = comparisons(inputs)
    flags = [("bad", f"{it.name}: {line}") for it in inputs.items for line in result_flags(it.result)]
    flags += [(_line_class(line), f"{name}: {line}") for name, b in inputs.bundles if b.outcomes
              for line in [suite.verdict_line(b)]]
    for name, f in inputs.fleets:
        rows = f.get("rows") or []
        bad = [r for r in rows if r.get("flag") != "ok"]
        flags.append(("bad" if bad or f.get("missing") else "ok",
                      f"{name}: fleet rule {(f.get('rule') or {}).get('name', '-')}: {len(bad)} of {len(rows)} "
                      f"row(s) flagged, {len(f.get('missing') or [])} rank(s) missing"))
    for command, cs in cmps:
        for c in cs:
            n = c.counts()
            flags.append(("bad" if n["slower"] or c.undecidable(slower_only=True)
                          else "warn" if n["inconclusive"] or n["undecidable"] else "ok",
                          f"{command}: {c.new_name} vs {c.base_name}: {n['slower']} slower, {n['faster']} faster, "
                          f"{n['same']} same, {n['inconclusive']} inconclusive, {n['undecidable']} undecidable"))
    parts = [
        "<!DOCTYPE html>", "<html lang=en><head><meta charset=utf-8>",
        "<meta http-equiv=Content-Security-Policy content=\"default-src 'none'; img-src data:; "
        "style-src 'unsafe-inline'\">",
        "<meta name=viewport content='width=device-width, initial-scale=1'>",
        f"<title>{h(heading)}</title><style>{CSS}</style></head><body>",
        f"<h1>{h(heading)}</h1>",
        f"<p class=note>Written {h(created)} by gpubench {h(__version__)} from "
        f"{h(', '.join(inputs.sources))}. Bandwidth in {h(units)}/s ({'1e9' if units == 'GB' else '2^30'} B/s) "
        "as nbytes / seconds per sample, median with p25-p75; time in microseconds.</p>",
        "<section id=verdicts><h2>Verdicts and flags</h2>",
    ]
    if flags:
        parts.append("<ul class=flags>" + "".join(f"<li class={c}>{h(t)}</li>" for c, t in flags) + "</ul>")
    else:
        parts.append("<p class='verdict ok'>Nothing flagged: every result complete, no point above its peak, "
                     "throttled or failed.</p>")
    parts.append("</section>")
    if inputs.items:
        rows, classes = [], []
        for i, it in enumerate(inputs.items):
            fl = result_flags(it.result)
            ok = sum(1 for r in it.result.records if r.samples_s and not r.error)
            rows.append([f"<a href='#r{i}'>{h(it.name)}</a>", h(it.result.command), h(it.result.created),
                         f"{ok} of {len(it.result.records)}", h("; ".join(fl) or "ok")])
            classes.append("bad" if fl else "")
        parts.append("<section id=results>" + _table(["result", "command", "created", "points measured", "flags"],
                                                      rows, classes=classes, numeric_from=3, raw_cells=True,
                                                      caption="Results") + "</section>")
    parts.append(_env_section(inputs))
    parts += [_fleet_section(name, f) for name, f in inputs.fleets]
    parts += [_bundle_section(name, b) for name, b in inputs.bundles]
    parts += [_compare_section(command, cs, inputs, units) for command, cs in cmps]
    parts += [_result_section(i, it, units) for i, it in enumerate(inputs.items)]
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p)


def write(paths: Sequence[str], out: str | os.PathLike, *, units: str = "GB", title: str | None = None,
          baseline: str | None = None) -> Path:
    """Read ``paths`` and write the report to ``out`` atomically (temporary file + rename).

    Raises:
        UsageError: bad inputs (see :func:`read_inputs`), ``out`` not a regular file, matplotlib
            not installed.
        MachineError: the file cannot be written.
    """
    if units not in UNITS:
        raise UsageError(f"units {units!r} not known", "use GB or GiB")
    plot.require_matplotlib("report")  # its plots are drawn inline
    inputs = read_inputs(paths, baseline)
    text = build(inputs, units=units, title=title)
    return write_bytes_atomic(text.encode("utf-8"), out, "the report", "-o")

"""Plot saved results as one PNG (matplotlib's Agg backend: no display needed), each command's
records drawn the way they read best (docs/plot.md): sweep, bars, collective, matrix, intervals, pairs.

Values: bandwidth = nbytes / seconds per sample (:meth:`Record.rates`), shown in GB/s (1e9 B/s) or
GiB/s; busbw = algbw x the record's ``busbw_factor`` (nccl-tests' doc/PERFORMANCE.md); time in
microseconds. Every string taken from a file passes through :func:`gpubench.core.safe.mpl`.
"""

from __future__ import annotations

import io
import math
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from gpubench.analysis.compare import _unit, plugin_of
from gpubench.core import limits, safe
from gpubench.core.errors import UsageError
from gpubench.core.options import ASCII_SPACE
from gpubench.core.result import DRAWN_ARRAYS, Record, Result, read_json, write_bytes_atomic
from gpubench.core.stats import Summary
from gpubench.core.units import UNITS, format_size

# legend entries that explain marks rather than name a series (tests tell them apart by these)
BAND_LABEL = "band: p25-p75 of the samples"
WHISKER_LABEL = "whiskers: p25-p75 of the samples"
ABOVE_LABEL = "above the link's peak (a timing fault)"
NO_OP_LABEL = "no-op: moves no data (one rank, in place)"
EXPLAIN_LABELS = (BAND_LABEL, WHISKER_LABEL, ABOVE_LABEL, NO_OP_LABEL)

# params that can be a sweep's x axis, in bytes (memcpy2d's is the row width)
SIZE_KEYS = ("nbytes", "piece_bytes", "piece", "size", "width")
# params that can move with the x axis: memcpy2d's --sweep grows height and pitches with the width
_COMPANIONS = {"width": ("height", "src_pitch", "dst_pitch")}
_LINESTYLES = ["-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 3))]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X"]
_HATCHES = ["", "//", "..", "xx", "\\\\", "oo", "--"]
# p2p tests in the order nvbandwidth lists them (peer access on, then off)
_P2P_ORDER = ("write", "read", "bidir", "sm", "latency", "off", "off-bidir", "off-latency")
_PART_ORDER = ("forward", "reverse", "total")
# panel size (inches) per kind, and panels per row
_PANEL = {"sweep": (6.0, 4.2, 3), "bars": (11.0, 4.8, 1), "collective": (6.5, 4.2, 2), "matrix": (3.4, 2.9, 4),
          "intervals": (9.0, 4.2, 1), "pairs": (8.0, 4.2, 1)}


S = safe.mpl  # every label goes through it: one line, no mathtext
LEGEND_WIDTH = 60  # characters a legend line holds: a longer label (a hostile file's) wraps, the axes keep their room


def legend_label(label: object) -> str:
    """A series' legend entry: :data:`S`, wrapped at :data:`LEGEND_WIDTH` characters."""
    return "\n".join(textwrap.wrap(S(label), LEGEND_WIDTH, drop_whitespace=False)) or S(label)


def load(path: str | Path) -> Result:
    """A saved result, checked by the loader (:func:`gpubench.core.result.check_record` holds what is drawn).

    Raises:
        UsageError: unreadable, not JSON, nested too deeply, not a result, or numbers that cannot be drawn.
    """
    return result_of(read_json(path), str(path))


def result_of(d: Any, name: str) -> Result:
    """The Result in the parsed JSON ``d``.

    Raises:
        UsageError: not a result, or numbers that cannot be drawn.
    """
    try:
        return Result.from_dict(d, source=name)
    except (OverflowError, RecursionError) as e:
        raise UsageError(f"{name} is a malformed gpubench result: {type(e).__name__}") from None


# ---- what a record shows ----

def size_key(r: Record) -> str | None:
    """The param holding the swept size in bytes (nbytes, batch's piece_bytes, memcpy2d's width), or None."""
    for k in SIZE_KEYS:
        v = r.params.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return k
    return None


def _merge_pair_stats(r: Record, scale: float = 1.0) -> dict[str, Summary]:
    """merge's per worker-pair bandwidth (extra["pairs"], B/s as dask-cuda's table) as Summaries
    keyed "(w1,w2)", in B/s / ``scale``."""
    out = {}
    for p in r.extra.get("pairs") or []:
        try:
            out[f"({p['w1']},{p['w2']})"] = Summary(
                n=int(p["n"]), median=float(p["q50"]) / scale, mean=float(p["hmean"]) / scale,
                min=float(p["min"]) / scale, max=float(p["max"]) / scale, p25=float(p["q25"]) / scale,
                p75=float(p["q75"]) / scale, stdev=float(p["hstd"]) / scale,
                cv=float(p["hstd"]) / float(p["hmean"]) if p["hmean"] else 0.0)
        except (KeyError, TypeError, ValueError, OverflowError):
            continue
    return out


def require_matplotlib(command: str) -> None:
    """Before anything is drawn: matplotlib (the ``plot`` extra) is installed.

    Raises:
        UsageError: it is not (exit 2, naming the extra).
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(f"{command} needs matplotlib, which is not installed",
                         "pip install 'gpubench-cuda[plot]'") from None


def _kind(r: Record, command: str) -> str:
    if "src" in r.params and "dst" in r.params:
        return "matrix"
    if "pair" in r.params or _merge_pair_stats(r):
        return "pairs"
    if all(isinstance(r.extra.get(k), list) and r.extra.get(k) for k in DRAWN_ARRAYS):  # net's
        return "intervals"
    kind = plugin_of(command).plot_kind  # how the command's sized records read best ("sweep" without a plug-in)
    if size_key(r) or kind == "bars" and r.params:
        return "collective" if kind == "collective" else "sweep"
    return "other"


def values(r: Record, units: str = "GB", scale_by: float = 1.0) -> Summary:
    """Summary of a record's plotted values: GB/s or GiB/s (times ``scale_by``: busbw) or microseconds."""
    if r.metric == "time":
        return Summary.of([t * 1e6 for t in r.samples_s])
    scale = UNITS[units] / scale_by
    return Summary.of([x / scale for x in r.rates()])


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def _mode_keys(records: Sequence[Record], skip: set[str]) -> list[str]:
    """Param names (other than ``skip``) whose values differ between records, first-seen order."""
    keys = dict.fromkeys(k for r in records for k in r.params if k not in skip)
    return [k for k in keys if len({repr(r.params.get(k)) for r in records}) > 1]


def _value_text(k: str, v: Any) -> str:
    if k in SIZE_KEYS and isinstance(v, int) and not isinstance(v, bool):
        return format_size(v)
    if k == "device":
        return f"GPU {v}"
    return str(v)


# params whose values name themselves ("h2d", "pinned", "in-place", "ucx"); others show as key=value
_SELF_NAMED = {"direction", "memory", "strategy", "placement", "protocol", "test", "part", "stage", "collective",
               "device", "stream", "type", "op", "dtype", "peer"} | set(SIZE_KEYS)


def _fixed_text(records: Sequence[Record], skip: set[str]) -> str:
    """The params every record shares (other than ``skip``), as "k v" text for a title."""
    if not records:
        return ""
    first = records[0].params
    out = [_value_text(k, v) if k in SIZE_KEYS or k == "device" else f"{k} {_value_text(k, v)}" for k, v in first.items()
           if k not in skip and not isinstance(v, (dict, list)) and all(r.params.get(k) == v for r in records)]
    if "count" in first and "piece_bytes" in first and all(
            (r.params.get("count"), r.params.get("piece_bytes")) == (first["count"], first["piece_bytes"]) for r in records):
        out = [o for o in out if not o.startswith("count ") and o != _value_text("piece_bytes", first["piece_bytes"])]
        out.insert(0, f"{first['count']} pieces of {_value_text('piece_bytes', first['piece_bytes'])}")
    return ", ".join(out)


def _tied_to_x(records: Sequence[Record], xkey: str) -> set[str]:
    """Companions of ``xkey`` whose value is fixed by x across ``records`` (no separate lines)."""
    tied = set()
    for k in _COMPANIONS.get(xkey, ()):
        seen: dict = {}
        if all(seen.setdefault(r.params.get(xkey), r.params.get(k)) == r.params.get(k) for r in records):
            tied.add(k)
    return tied


# ---- the model: sections of panels of series ----

@dataclass
class Series:
    """One drawn line or bar set: its legend label, records, the file it came from, its mode."""

    label: str
    records: list[Record]
    source: str
    mode: str


@dataclass
class Panel:
    """One axes: its kind, metric, title, series, and what its x axis shows."""

    kind: str
    metric: str
    title: str
    series: list[Series] = field(default_factory=list)
    command: str = ""
    xkey: str | None = None
    scale_by: str | None = None  # nccl: "busbw" or "algbw"
    cat_key: str | None = None   # bars: the param on the x axis


@dataclass
class Section:
    """The panels of one command and kind, drawn together: a title, a grid of panels, one legend."""

    kind: str
    command: str
    title: str
    panels: list[Panel]
    envs: dict[str, dict] = field(default_factory=dict)  # file -> env, for NVML peaks
    max_cols: int = 4
    many: bool = False  # several files overlaid: one colour per file
    panel_in: tuple[float, float] | None = None  # a panel's size where it grows with its content

    @property
    def cols(self) -> int:
        return max(1, min(_PANEL[self.kind][2], self.max_cols, len(self.panels)))

    def groups(self) -> list[list[int]]:
        """Panel indices per metric (a matrix section's metrics each start a row)."""
        out: dict[str, list[int]] = {}
        for i, p in enumerate(self.panels):
            out.setdefault(p.metric, []).append(i)
        return list(out.values())

    @property
    def rows(self) -> int:
        return sum(math.ceil(len(g) / self.cols) for g in self.groups())

    def size_in(self) -> tuple[float, float]:
        w, h, _ = _PANEL[self.kind]
        if self.panel_in:
            w, h = self.panel_in
        legend = 2.6 if self.kind in ("sweep", "collective", "bars", "pairs", "intervals") else 1.0
        return self.cols * w + legend, self.rows * h + 0.5


def display_names(names: Sequence[str]) -> list[str]:
    """Short unique names for files: the file name, or more of its path where two share one."""
    parts = [Path(n).parts or (n,) for n in names]
    for depth in range(1, max((len(p) for p in parts), default=1) + 1):
        shown = ["/".join(p[-depth:]) for p in parts]
        if len(set(shown)) == len(shown):
            return shown
    return [f"{s} ({i + 1})" for i, s in enumerate(shown)]


def _series(items: Sequence[tuple[str, Record]], keys: Sequence[str], many: bool, fallback: str) -> list[Series]:
    out: dict[tuple[str, str], Series] = {}
    for src, r in items:
        mode = " ".join(_value_text(k, v) if k in _SELF_NAMED else f"{k}={_value_text(k, v)}"
                        for k in keys if (v := r.params.get(k)) is not None) or fallback
        label = f"{mode} · {src}" if many else mode
        out.setdefault((src, mode), Series(label, [], src, mode)).records.append(r)
    return list(out.values())


def _p2p_order(r: Record) -> tuple:
    t, p = r.params.get("test"), r.params.get("part")
    return (_P2P_ORDER.index(t) if t in _P2P_ORDER else len(_P2P_ORDER), str(t),
            _PART_ORDER.index(p) if p in _PART_ORDER else -1 if p is None else len(_PART_ORDER), str(p))


def build_sections(results: Sequence[tuple[str, Result]]) -> list[Section]:
    """Group the records of every result into sections of panels (see the module docstring).

    Raises:
        UsageError: no record with samples to plot.
    """
    names = display_names([n for n, _ in results])
    many = len(results) > 1
    groups: dict[tuple[str, str, str], list[tuple[str, Record]]] = {}
    envs: dict[str, dict] = {}
    for name, (_, res) in zip(names, results):
        envs[name] = res.env if isinstance(res.env, dict) else {}
        for r in res.records:
            if not r.samples_s or r.error or (r.metric != "time" and r.nbytes <= 0) or not all(
                    math.isfinite(t) and t > 0 for t in r.samples_s):
                continue  # nothing to draw
            k = _kind(r, res.command)
            if k != "other":  # matrices of both metrics share one section (a colour scale each)
                groups.setdefault((k, res.command, "" if k == "matrix" else r.metric), []).append((name, r))
    sections: list[Section] = []
    for (kind, command, metric), items in groups.items():
        build = {"sweep": _sweep_section, "collective": _collective_section, "matrix": _matrix_section,
                 "intervals": _intervals_section, "pairs": _pairs_section}[kind]
        sources = list(dict.fromkeys(n for n, _ in items))
        sec = build(command, metric, items, len(sources) > 1)
        sec.envs = envs
        sec.many = len(sources) > 1
        if many and not sec.many:
            sec.title += f" · {sources[0]}"  # the file, named once in the title
        sections.append(sec)
    if not sections:
        raise UsageError("nothing to plot: no record with samples and a size, a src/dst pair, a worker pair "
                         "or per-interval figures", "plot reads copy, batch, memcpy2d, overlap, p2p, nccl, merge "
                         "and net results")
    return sections


def _sweep_section(command: str, metric: str, items, many: bool) -> Section:
    recs = [r for _, r in items]
    xkey = size_key(recs[0]) or "nbytes"
    sizes = {r.params.get(xkey) for r in recs}
    what = "bandwidth" if metric == "bandwidth" else "time"
    if plugin_of(command).plot_kind == "bars" and len(sizes) <= 1:
        cat: str | None = "stage" if any("stage" in r.params for r in recs) else "strategy"
        if not any(cat in r.params for r in recs):
            cat = next(iter(_mode_keys(recs, {xkey})), None)
        keys = _mode_keys(recs, {xkey, cat or "", *_tied_to_x(recs, xkey)})
        fixed = _fixed_text(recs, {cat or "", *keys})
        title = f"{command}: {what} per {cat or 'point'}" + (f" ({fixed})" if fixed else "")
        p = Panel("bars", metric, title, _series(items, keys, many, command), command, xkey, cat_key=cat)
        return Section("bars", command, title, [p])
    facet = "direction" if len({r.params.get("direction") for r in recs}) > 1 else None
    panels = []
    facets = list(dict.fromkeys(r.params.get(facet) if facet else None for r in recs))
    for v in facets:
        sub = [(n, r) for n, r in items if not facet or r.params.get(facet) == v]
        srecs = [r for _, r in sub]
        keys = _mode_keys(recs, {xkey, facet or "", *_tied_to_x(srecs, xkey)})
        title = str(v) if facet else f"{command}: {what} vs size"
        panels.append(Panel("sweep", metric, title, _series(sub, keys, many, command), command, xkey))
    fixed = _fixed_text(recs, {xkey, facet or "", *_mode_keys(recs, {xkey})})
    title = f"{command}: {what} vs size" + (" per direction" if facet else "") + (f" ({fixed})" if fixed else "")
    return Section("sweep", command, title, panels)


def _collective_section(command: str, metric: str, items, many: bool) -> Section:
    recs = [r for _, r in items]
    panels = []
    colls = list(dict.fromkeys((r.params.get("collective"), r.params.get("nranks")) for r in recs))
    for coll, nranks in colls:
        sub = [(n, r) for n, r in items if (r.params.get("collective"), r.params.get("nranks")) == (coll, nranks)]
        keys = _mode_keys([r for _, r in sub], {"nbytes", "collective", "nranks"})
        head = f"{coll or command}, {nranks} ranks" if nranks else f"{coll or command}"
        # (title, scale_by, fallback label) per panel: busbw = algbw (2-rank all-reduce, broadcast...) is one
        if metric == "time":
            views: list[tuple[str, str | None, str]] = [("time", None, "time")]
        elif all(float(r.extra.get("busbw_factor") or 1.0) == 1.0 for _, r in sub):
            views = [("busbw = algbw", "algbw", str(coll))]
        else:
            views = [(bw, bw, str(coll)) for bw in ("busbw", "algbw")]
        panels += [Panel("collective", metric, f"{head}: {what}", _series(sub, keys, many, fallback), command,
                         "nbytes", scale_by=by) for what, by, fallback in views]
    fixed = _fixed_text(recs, {"nbytes", "placement", "collective", "nranks"})
    heads = "; ".join(f"{c}, {n} ranks" if n else str(c) for c, n in colls)
    title = f"nccl {heads}" + (f" ({fixed})" if fixed else "") + ": busbw and algbw vs size"
    return Section("collective", command, title, panels)


def _matrix_section(command: str, metric: str, items, many: bool) -> Section:
    """Matrices of both metrics: one panel per (file, test, part, other params, metric)."""
    per: dict[tuple, tuple[str, str, list[Record]]] = {}
    for src, r in sorted(items, key=lambda it: _p2p_order(it[1])):
        test, part = r.params.get("test"), r.params.get("part")
        other = {k: v for k, v in r.params.items() if k not in ("src", "dst", "test", "part", "nbytes")}
        key = (src, test, part, tuple(sorted((k, repr(v)) for k, v in other.items())), r.metric)
        if key not in per:
            size = r.extra.get("requested_nbytes") if isinstance(r.extra.get("requested_nbytes"), int) else r.nbytes
            if part == "total" and r.params.get("nbytes"):
                size = r.params["nbytes"]  # a bidir total moves both directions' bytes: name one direction's
            words = [str(test) if test is not None else command] + ([str(part)] if part else [])
            words += [str(v) for v in other.values()]
            title = " ".join(words) + f" · {format_size(size)}" + (f" · {src}" if many else "")
            per[key] = (title, src, [])
        per[key][2].append(r)
    panels = [Panel("matrix", rs[0].metric, title, [Series(title, rs, src, title)], command)
              for title, src, rs in per.values()]
    metrics = {p.metric for p in panels}
    n = max(len({r.params["src"] for _, _, rs in per.values() for r in rs} |
                {r.params["dst"] for _, _, rs in per.values() for r in rs}), 1)
    what = ("bandwidth (brighter = faster)" if metrics == {"bandwidth"} else "latency (brighter = lower)"
            if metrics == {"time"} else "bandwidth and latency (brighter = better)")
    end = plugin_of(command).matrix_ends  # what the rows and columns are
    sec = Section("matrix", command, f"{command}: {what}, source {end} (rows) to destination {end} (columns)",
                  sorted(panels, key=lambda p: p.metric != "bandwidth"))
    if n > 4:  # cells of about half an inch, so 3-digit values stay legible
        sec.panel_in = (0.5 * n + 1.4, 0.5 * n + 1.0)
    return sec


def _intervals_section(command: str, metric: str, items, many: bool) -> Section:
    recs = [r for _, r in items]
    streams = {r.params.get("streams") for r in recs if r.params.get("streams") is not None}
    # one panel per direction (net --bidir: c2s and s2c), each with its own streams and total
    directions = list(dict.fromkeys(r.params.get("direction") for r in recs))
    panels = []
    for d in directions:
        series = _series([(src, r) for src, r in items if r.params.get("direction") == d], ["stream"], many, "total")
        for sr in series:  # "stream 0", "total"; the total first, so in overlays it takes the solid line
            if sr.mode != "total":
                sr.mode = f"stream {sr.mode}"
                sr.label = f"{sr.mode} · {sr.source}" if many else sr.mode
        series.sort(key=lambda sr: sr.mode != "total")
        panels.append(Panel("intervals", metric, f"direction {d}" if len(directions) > 1 else "", series, command))
    fixed = f"{', '.join(str(s) for s in sorted(streams, key=str))} streams" if streams else ""
    if len(directions) > 1:
        fixed = ", ".join(x for x in (fixed, "a panel per direction") if x)
    title = f"{command}: received rate per interval" + (f" ({fixed})" if fixed else "")
    for p in panels:
        p.title = p.title or title
    return Section("intervals", command, title, panels)


def _pairs_section(command: str, metric: str, items, many: bool) -> Section:
    recs = [r for _, r in items]
    keys = _mode_keys(recs, {"pair"})
    fixed = _fixed_text(recs, {"pair", *keys, "chunk_size", "base_chunks", "other_chunks", "frac_match",
                               "broadcast", "n_workers"})
    title = f"{command}: bandwidth per worker pair" + (f" ({fixed})" if fixed else "")
    return Section("pairs", command, title, [Panel("pairs", metric, title, _series(items, keys, many, command),
                                                   command)])


# ---- styles: one colour per file when several, else per mode ----

def _styles(sections_series: Sequence[Series], many: bool) -> dict[tuple[str, str], tuple]:
    """(colour, linestyle, marker, hatch) per (source, mode): colour by file when several, else by mode."""
    import matplotlib

    sources = list(dict.fromkeys(s.source for s in sections_series))
    modes = list(dict.fromkeys(s.mode for s in sections_series))
    colour_keys = sources if many else modes
    cmap = matplotlib.colormaps["tab10" if len(colour_keys) <= 10 else "tab20"]
    out = {}
    for s in sections_series:
        ci = colour_keys.index(s.source if many else s.mode)
        si = modes.index(s.mode) if many else (ci // cmap.N)
        mi = modes.index(s.mode)  # a marker per mode: lines that coincide still show each mode
        out[(s.source, s.mode)] = (cmap(ci % cmap.N), _LINESTYLES[si % len(_LINESTYLES)],
                                   _MARKERS[mi % len(_MARKERS)], _HATCHES[si % len(_HATCHES)])
    return out


# ---- peaks ----

@dataclass(frozen=True)
class Peak:
    """A peak line: bytes per second, the link's name and where the figure came from."""

    bytes_per_s: float
    link: str
    source: str  # "measured link", "NVML" or "user"

    def label(self, units: str) -> str:
        return f"{self.link} peak {self.bytes_per_s / UNITS[units]:.1f} {units}/s ({self.source})"


def _pcie_name(env: dict, device: Any) -> str:
    for g in env.get("gpus") or []:
        if isinstance(g, dict) and g.get("index") == device:
            gen, width = g.get("pcie_gen_max") or g.get("pcie_gen"), g.get("pcie_width_max") or g.get("pcie_width")
            if gen and width:
                return f"PCIe Gen{safe.term(gen, 4)} x{safe.term(width, 4)}"
    return "link"


def peaks_for(records: Sequence[Series], envs: dict[str, dict], user_bps: Sequence[float]) -> list[Peak]:
    """The peak lines of a panel: those saved in its records ("measured link"), else from the env's
    NVML PCIe figure ("NVML", h2d and d2h only), then ``--peak`` ("user")."""
    out: dict[float, Peak] = {}
    nvml: dict[float, Peak] = {}
    for s in records:
        env = envs.get(s.source) or {}
        for r in s.records:
            p = r.extra.get("peak_bytes_per_s")
            if isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p) and p > 0:
                saved = r.extra.get("link")
                link = saved if isinstance(saved, str) else _pcie_name(env, r.params.get("device"))
                out.setdefault(float(p), Peak(float(p), link, "measured link"))
            elif r.params.get("direction") in ("h2d", "d2h") and "device" in r.params:
                for g in env.get("gpus") or []:
                    if isinstance(g, dict) and g.get("index") == r.params["device"]:
                        v = g.get("pcie_peak_bytes_per_s")
                        if isinstance(v, (int, float)) and math.isfinite(v) and v > 0:
                            nvml.setdefault(float(v), Peak(float(v), _pcie_name(env, r.params["device"]), "NVML"))
    if not out:
        out = nvml
    for p in user_bps:
        out.setdefault(float(p), Peak(float(p), "--peak", "user"))
    return sorted(out.values(), key=lambda p: p.bytes_per_s)


def _draw_peaks(ax, peaks: Sequence[Peak], units: str, top: float = 0.0) -> float:
    """Draw the peak lines; returns the highest of ``top`` and the peaks, in ``units``/s."""
    for p in peaks:
        v = p.bytes_per_s / UNITS[units]
        ax.axhline(v, linestyle=(0, (6, 3)), color="0.3" if p.source != "user" else "tab:red", lw=1)
        ax.annotate(S(p.label(units)), (0.01, v), xycoords=("axes fraction", "data"), textcoords="offset points",
                    xytext=(0, 3), fontsize=8, color="0.25" if p.source != "user" else "tab:red")
    return max([top] + [p.bytes_per_s / UNITS[units] for p in peaks])


# ---- drawing ----

def _size_ticks(ax, sizes: Sequence[int]) -> None:
    ticks = sorted(set(sizes))
    if len(ticks) > 10:
        ticks = ticks[:: math.ceil(len(ticks) / 10)]
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks)
    ax.set_xticklabels([format_size(t).replace(" ", "") for t in ticks], rotation=40, fontsize=8)
    ax.minorticks_off()


def _swept_size(r: Record, xkey: str | None) -> int:
    v = r.params.get(xkey) if xkey else None
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return v
    k = size_key(r)
    return r.params[k] if k else r.nbytes


X_NAMES = {"nbytes": "size per copy", "width": "row width", "piece_bytes": "bytes per piece"}


def _draw_lines(ax, panel: Panel, styles, units: str, peaks: Sequence[Peak], legend: dict) -> None:
    factor_of = (lambda r: float(r.extra.get("busbw_factor") or 1.0)) if panel.scale_by == "busbw" else (lambda r: 1.0)
    ns: list[int] = []
    sizes: list[int] = []
    top = 0.0
    for i, s in enumerate(panel.series):
        recs = sorted(s.records, key=lambda r: _swept_size(r, panel.xkey))
        xs = [_swept_size(r, panel.xkey) for r in recs]
        ss = [values(r, units, factor_of(r)) for r in recs]
        colour, ls, marker, _ = styles[(s.source, s.mode)]
        # earlier series drawn wider and below: lines that coincide (pinned, registered) both show
        line, = ax.plot(xs, [v.median for v in ss], color=colour, linestyle=ls, marker=marker,
                        markersize=max(3.5, 7 - 1.2 * i), lw=max(1.2, 3.4 - 0.6 * i), zorder=2 + 0.01 * i,
                        label=S(s.label))
        ax.fill_between(xs, [v.p25 for v in ss], [v.p75 for v in ss], color=colour, alpha=0.2, lw=0)
        legend.setdefault(legend_label(s.label), line)
        flags = [limits.saved_flag(r) for r in recs]  # saved, or re-derived from the samples and the peak
        for flag, label, style in (("above_peak", ABOVE_LABEL, {"marker": "x", "color": "red", "markersize": 9, "mew": 2}),
                                   ("no_op", NO_OP_LABEL, {"marker": "s", "color": "black", "mfc": "none",
                                                           "markersize": 10, "mew": 1.5})):
            at = [(x, v.median) for x, v, f in zip(xs, ss, flags) if f == flag]
            if at:
                mark, = ax.plot(*zip(*at), linestyle="none", label=f"_{flag}", **style)
                legend.setdefault(label, mark)
        ns += [v.n for v in ss]
        sizes += xs
        top = max([top] + [v.p75 for v in ss])
    _size_ticks(ax, sizes)
    ax.set_xlabel(S(plugin_of(panel.command).x_name or X_NAMES.get(panel.xkey or "", "size")
                    + " (log2 axis)"))
    what = panel.scale_by or ("bandwidth" if panel.metric == "bandwidth" else "time")
    ax.set_ylabel(f"{what} ({_unit(panel.metric, units)}), median")
    if panel.metric == "time":
        ax.set_yscale("log")
    else:
        top = _draw_peaks(ax, peaks, units, top)
        ax.set_ylim(0, top * 1.12 if top > 0 else 1)
        ax.gpubench_top = top
    ax.grid(True, which="major", alpha=0.3)
    n = f"{min(ns)}" if min(ns) == max(ns) else f"{min(ns)}-{max(ns)}"
    ax.set_title(f"n = {n} samples per point", loc="right", fontsize=7, color="0.3")
    from matplotlib.patches import Patch

    legend.setdefault(BAND_LABEL, Patch(facecolor="0.5", alpha=0.3, label=BAND_LABEL))


def _draw_bars(ax, panel: Panel, styles, units: str, peaks: Sequence[Peak], legend: dict,
               summaries: Callable[[Series], dict[str, Summary]] | None = None, xlabel: str | None = None) -> None:
    """Grouped bars: x = categories (strategy, stage or worker pair), one bar per series."""
    import numpy as np

    def by_cat(s: Series) -> dict[str, Summary]:
        return {str(r.params.get(panel.cat_key or "", "-")): values(r, units) for r in s.records}

    get = summaries or by_cat
    per = [(s, get(s)) for s in panel.series]
    cats = list(dict.fromkeys(c for _, d in per for c in d))
    k = max(len(per), 1)
    width = min(0.8 / k, 0.45)
    x = np.arange(len(cats))
    top = 0.0
    labels: list[tuple[float, Summary]] = []  # written once the y range is known (below)
    for i, (s, d) in enumerate(per):
        colour, _, _, hatch = styles[(s.source, s.mode)]
        med = [d[c].median if c in d else np.nan for c in cats]
        lo = [d[c].median - d[c].p25 if c in d else 0 for c in cats]
        hi = [d[c].p75 - d[c].median if c in d else 0 for c in cats]
        xs = x + (i - (k - 1) / 2) * width
        bars = ax.bar(xs, med, width, yerr=[lo, hi], capsize=2, color=colour, hatch=hatch, edgecolor="white"
                      if not hatch else "0.2", lw=0.5, label=S(s.label), error_kw={"lw": 0.8, "ecolor": "0.15"})
        legend.setdefault(legend_label(s.label), bars)
        # a bar above its physical limit gets the red cross the lines get (saved or re-derived flag)
        above = set() if summaries else {str(r.params.get(panel.cat_key or "", "-")) for r in s.records
                                         if limits.saved_flag(r) == "above_peak"}
        for xi, c in zip(xs, cats):
            if c in d:
                top = max(top, d[c].p75)
                labels.append((xi, d[c]))
                if c in above:
                    mark, = ax.plot([xi], [d[c].median], "x", color="red", markersize=9, mew=2, label="_above")
                    legend.setdefault(ABOVE_LABEL, mark)
    ax.set_xticks(x, [S(c) for c in cats], fontsize=9)
    ax.set_xlabel(S(xlabel or panel.cat_key or "point"))
    unit = _unit(panel.metric, units)
    ax.set_ylabel(f"{'bandwidth' if panel.metric == 'bandwidth' else 'time'} ({unit}), median")
    if panel.metric == "bandwidth":
        top = _draw_peaks(ax, peaks, units, top)
    ax.set_ylim(0, top * 1.3 if top > 0 else 1)
    # the median and n over a short bar; inside a tall one (from its top down), where it cannot
    # cross a peak line drawn just above the bars
    for xi, v in labels:
        inside = v.median > 0.45 * ax.get_ylim()[1]
        ax.annotate(f"{_fmt(v.median)}  n={v.n}", (xi, v.median if inside else v.p75), textcoords="offset points",
                    xytext=(0, -3 if inside else 2), ha="center", va="top" if inside else "bottom", fontsize=7,
                    rotation=90, color="white" if inside else "0.2")
    ax.grid(True, axis="y", alpha=0.3)
    from matplotlib.lines import Line2D

    legend.setdefault(WHISKER_LABEL, Line2D([], [], color="0.15", marker="|", markersize=10, lw=0.8))


def _pair_summaries(recs: Sequence[Record], units: str) -> dict[str, Summary]:
    """Per-pair Summaries in ``units``/s: from records with a "pair" param, or merge's extra."""
    out: dict[str, Summary] = {}
    for r in recs:
        if "pair" in r.params:
            out[str(r.params["pair"])] = values(r, units)
        out.update(_merge_pair_stats(r, UNITS[units]))
    return out


def _draw_intervals(ax, panel: Panel, styles, units: str, peaks: Sequence[Peak], legend: dict, many: bool) -> None:
    """net: each stream's and the total's rate per interval as steps over [start, end), from 0."""
    scale = UNITS[units]
    t_end = 0.0
    top = 0.0
    omitted = False
    for s in panel.series:
        total = s.mode == "total"
        for r in s.records:
            e = r.extra
            xs, ys = [], []
            for b, t0, t1, *o in zip(e["interval_bytes"], e["interval_start_s"], e["interval_end_s"],
                                     e.get("interval_omit") or [False] * len(e["interval_bytes"])):
                rate = b / (t1 - t0) / scale if t1 > t0 else float("nan")
                xs += [t0, t1]
                ys += [rate, rate]
                t_end = max(t_end, t1)
                top = max(top, rate if math.isfinite(rate) else 0)
                if o and o[0]:
                    ax.axvspan(t0, t1, color="0.85", lw=0, zorder=0)
                    omitted = True
            colour, ls, marker, _ = styles[(s.source, s.mode)]
            if not many and total:
                colour, ls = "black", "-"
            line, = ax.plot(xs, ys, color=colour, linestyle=ls if many else "-", lw=2.4 if total else 1.3,
                            label=S(s.label))
            legend.setdefault(legend_label(s.label), line)
    ax.set_xlim(0, t_end * 1.02 if t_end else 1)
    top = _draw_peaks(ax, peaks, units, top)
    ax.set_ylim(0, top * 1.15 if top else 1)
    ax.set_xlabel("time since the start (s)")
    ax.set_ylabel(f"received ({units}/s), per interval")
    factor = 8 * UNITS[units] / 1e9
    sec = ax.secondary_yaxis("right", functions=(lambda v: v * factor, lambda v: v / factor))
    sec.set_ylabel("Gbit/s")
    ax.grid(True, alpha=0.3)
    ax.set_title("n = 1 value per interval: bytes counted by the receiver / interval length", loc="right",
                 fontsize=7, color="0.3")
    if omitted:
        from matplotlib.patches import Patch

        legend.setdefault("omitted (--omit): not counted", Patch(facecolor="0.85"))


def _draw_matrices(sf, panels: Sequence[Panel], axes, units: str, spare=None, cols: int = 4) -> None:
    """Every matrix of one metric on one colour scale from 0 (brighter = better), each cell annotated."""
    import matplotlib
    import numpy as np

    metric = panels[0].metric
    mats = []
    for panel in panels:
        recs = panel.series[0].records
        devs = sorted({r.params["src"] for r in recs} | {r.params["dst"] for r in recs}, key=str)
        idx = {d: i for i, d in enumerate(devs)}
        m = np.full((len(devs), len(devs)), np.nan)
        pct = np.full_like(m, np.nan)
        above = np.zeros(m.shape, bool)
        for r in recs:
            i, j = idx[r.params["src"]], idx[r.params["dst"]]
            m[i, j] = values(r, units).median
            p = limits.saved_pct_of_peak(r)
            if p is not None:
                pct[i, j] = p
            above[i, j] = limits.saved_flag(r) == "above_peak"
        mats.append((devs, m, pct, above))
    finite = np.concatenate([m[np.isfinite(m)] for _, m, _, _ in mats]) if mats else np.array([])
    top = float(finite.max()) if finite.size else 1.0
    cmap = matplotlib.colormaps["viridis" if metric == "bandwidth" else "viridis_r"].with_extremes(bad="0.9")
    norm = matplotlib.colors.Normalize(vmin=0, vmax=top)
    unit = _unit(metric, units)
    im = None
    for k, (ax, panel, (devs, m, pct, above)) in enumerate(zip(axes, panels, mats)):
        im = ax.imshow(np.ma.masked_invalid(m), cmap=cmap, norm=norm, aspect="equal")
        small = len(devs) <= 4
        end = plugin_of(panel.command).matrix_ends
        labels = [f"{end} {safe.mpl(d, 8)}" if small else safe.mpl(d, 8) for d in devs]
        ax.set_xticks(range(len(devs)), labels, fontsize=8)
        ax.set_yticks(range(len(devs)), labels, fontsize=8)
        if k >= len(axes) - cols:  # axis names once per row and column: the grid reads the same
            ax.set_xlabel("destination" if small else f"destination {end}", fontsize=8)
        if k % cols == 0:
            ax.set_ylabel("source" if small else f"source {end}", fontsize=8)
        ax.set_title(S(panel.title), fontsize=9)
        for i in range(len(devs)):
            for j in range(len(devs)):
                v = m[i, j]
                if not np.isfinite(v):
                    ax.text(j, i, "-", ha="center", va="center", fontsize=9, color="0.4")
                    continue
                r, g, b, _ = cmap(norm(v))
                dark = 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.5
                text = _fmt(v) + (f" {unit}" if small else "")
                if small and np.isfinite(pct[i, j]):
                    text += f"\n{pct[i, j]:.0f}% of peak"
                if above[i, j]:
                    text += "\nABOVE PEAK"
                ax.text(j, i, text, ha="center", va="center", fontsize=8 if small else 7,
                        color="red" if above[i, j] else ("white" if dark else "black"))
    if im is not None:
        what = "bandwidth" if metric == "bandwidth" else "latency"
        label = f"{what} ({unit}), median"
        if spare is not None:  # an empty cell of the group's last row holds the scale: no layout shift
            spare.set_visible(True)
            spare.axis("off")
            sf.colorbar(im, cax=spare.inset_axes([0.05, 0.05, 0.07, 0.9]), label=label)
        else:
            sf.colorbar(im, ax=list(axes), label=label, shrink=0.9, aspect=30)


_FIGSIZE = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)[xX]([0-9]+(?:\.[0-9]*)?|\.[0-9]+)", re.ASCII)


def parse_figsize(text: str | None) -> tuple[float, float] | None:
    """Figure size in inches from "WxH" (e.g. "12x7"); None for None (a size from the panels).

    Raises:
        UsageError: not two finite positive numbers up to 100 joined by "x".
    """
    if text is None:
        return None
    m = _FIGSIZE.fullmatch(text.strip(ASCII_SPACE))  # spaces around a value are dropped, as for every value
    if m is None:  # ASCII digits only, as every number (no "١٢x7", "1_2x7", "+12x7")
        raise UsageError(f"--size {text!r} is not WIDTHxHEIGHT in inches", "e.g. --size 12x7") from None
    w, h = float(m.group(1)), float(m.group(2))
    if not (0 < w <= 100 and 0 < h <= 100):
        raise UsageError(f"--size {text!r}: width and height must be in (0, 100] inches")
    return w, h


def figure(results: Sequence[tuple[str, Result]], *, units: str = "GB", size_in: tuple[float, float] | None = None,
           dpi: int = 100, peaks_gbps: Sequence[float] = (), title: str | None = None, max_cols: int = 4):
    """Draw (file name, Result) pairs into a matplotlib Figure (no pyplot): (figure, sections).
    ``size_in``: inches (None: from the panels); ``peaks_gbps``: user peak lines in ``units``/s.

    Raises:
        UsageError: nothing to plot; ``--peak`` with no bandwidth axis to draw it on.
    """
    from matplotlib.figure import Figure

    sections = build_sections(results)
    for sec in sections:
        sec.max_cols = max_cols
    if peaks_gbps and not any(s.kind != "matrix" and p.metric == "bandwidth" for s in sections for p in s.panels):
        kinds = sorted({f"{s.command} {'matrices' if s.kind == 'matrix' else 'times'}" for s in sections})
        raise UsageError(f"--peak: these results have no bandwidth axis to draw a peak on ({', '.join(kinds)})",
                         "leave --peak out for these results")
    sizes = [s.size_in() for s in sections]
    w = max(sw for sw, _ in sizes)
    h = sum(sh for _, sh in sizes) + (0.5 if title else 0)
    fig = Figure(figsize=size_in or (w, h), dpi=dpi, layout="constrained")
    if title:
        fig.suptitle(S(title), fontsize=12)
    subfigs = fig.subfigures(len(sections), 1, height_ratios=[sh for _, sh in sizes], squeeze=False)[:, 0]
    user_bps = [p * UNITS[units] for p in peaks_gbps]
    for sf, sec in zip(subfigs, sections):
        sf.suptitle(S(sec.title), fontsize=11, x=0.01, ha="left")
        grid = sf.subplots(sec.rows, sec.cols, squeeze=False)  # each panel its own y scale (copy's d2d, bidir-total)
        groups: list[list] = []
        spares = []
        row = 0
        for g in sec.groups():  # each group starts a row; spare axes of a row are hidden
            cells = [ax for r in grid[row:row + math.ceil(len(g) / sec.cols)] for ax in r]
            row += math.ceil(len(g) / sec.cols)
            for ax in cells[len(g):]:
                ax.set_visible(False)
            groups.append(cells[:len(g)])
            spares.append(cells[len(g)] if len(cells) > len(g) else None)
        if sec.kind == "matrix":
            for g, gaxes, spare in zip(sec.groups(), groups, spares):
                _draw_matrices(sf, [sec.panels[i] for i in g], gaxes, units, spare, sec.cols)
            continue
        axes = groups[0]
        styles = _styles([s for p in sec.panels for s in p.series], sec.many)
        legend: dict = {}
        for ax, panel in zip(axes, sec.panels):
            peaks = peaks_for(panel.series, sec.envs, user_bps) if panel.metric == "bandwidth" else []
            if sec.kind in ("sweep", "collective"):
                _draw_lines(ax, panel, styles, units, peaks, legend)
            elif sec.kind == "bars":
                _draw_bars(ax, panel, styles, units, peaks, legend)
            elif sec.kind == "pairs":
                _draw_bars(ax, panel, styles, units, peaks, legend,
                           summaries=lambda s: _pair_summaries(s.records, units), xlabel="worker pair (w1, w2)")
            else:
                _draw_intervals(ax, panel, styles, units, peaks, legend, sec.many)
            if sec.kind == "collective" or sec.kind in ("sweep", "intervals") and len(sec.panels) > 1:
                ax.set_title(S(panel.title), fontsize=10, loc="left")  # intervals: per direction, on one y scale
        if sec.kind == "intervals" and len(sec.panels) > 1:
            top = max(ax.get_ylim()[1] for ax in axes)
            for ax in axes:
                ax.set_ylim(0, top)
        sf.legend(list(legend.values()), list(legend.keys()), loc="outside right upper", fontsize=8,
                  handlelength=3.2, frameon=False)
    return fig, sections


def png_bytes(results: Sequence[tuple[str, Result]], **kwargs) -> bytes:
    """The PNG of :func:`figure` as bytes (same arguments)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig, _ = figure(results, **kwargs)
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=kwargs.get("dpi", 100))
    return buf.getvalue()


def render(results: Sequence[tuple[str, Result]], out: str | Path, *, units: str = "GB",
           size_in: tuple[float, float] | None = None, dpi: int = 100, peaks_gbps: Sequence[float] = (),
           title: str | None = None) -> Path:
    """Draw the results into the PNG ``out``, written atomically.

    Raises:
        UsageError: nothing to plot, matplotlib missing, a ``--peak`` that cannot be drawn.
        MachineError: the PNG cannot be written (full disk, read-only folder).
    """
    require_matplotlib("plot")
    data = png_bytes(results, units=units, size_in=size_in, dpi=dpi, peaks_gbps=peaks_gbps, title=title)
    return write_bytes_atomic(data, out, "the plot", "-o")

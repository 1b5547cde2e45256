"""Plot saved results as one PNG (matplotlib, Agg backend: no display needed).

Panels, chosen from the records' params:

- **sweep**: records with an ``nbytes`` param; bandwidth (GB/s, median with a p25-p75 band) or
  time (us, log axis) against size on a log2 x axis; one line per mode, a mode being the other
  params that vary (e.g. direction + memory kind); several results overlaid, labelled by file.
  A dashed line marks each link peak found in ``record.extra["peak_bytes_per_s"]`` (or --peak).
- **matrix**: records with ``src`` and ``dst`` device params (p2p): one heatmap per mode and result,
  each cell the median figure, annotated.
- **pairs**: records with a ``pair`` param (merge's worker pairs): bars of the median per pair with
  p25-p75 error bars, grouped by result and mode.

Values: bandwidth = nbytes / seconds per sample (GB/s = 1e9 B/s, or GiB/s); time in microseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from gpubench.core.errors import UsageError
from gpubench.core.result import Record, Result
from gpubench.core.stats import Summary
from gpubench.core.units import UNITS, format_size

PANEL_W_IN, PANEL_H_IN = 9.5, 5.0


@dataclass
class Panel:
    """One subplot: its kind ("sweep", "matrix", "pairs", "intervals"), title, and the
    (label, records) it draws."""

    kind: str
    metric: str
    title: str
    series: list[tuple[str, list[Record]]] = field(default_factory=list)
    command: str = ""  # the results' command, for axis names


def _merge_pair_stats(r: Record) -> dict[str, Summary]:
    """merge's per worker-pair bandwidth (extra["pairs"]: q25/q50/q75 of B/s per transfer, as
    dask-cuda's table) as Summaries keyed "(w1,w2)"; {} when the record has none."""
    out = {}
    for p in r.extra.get("pairs") or []:
        try:
            out[f"({p['w1']},{p['w2']})"] = Summary(
                n=int(p["n"]), median=float(p["q50"]), mean=float(p["hmean"]), min=float(p["min"]),
                max=float(p["max"]), p25=float(p["q25"]), p75=float(p["q75"]), stdev=float(p["hstd"]),
                cv=float(p["hstd"]) / float(p["hmean"]) if p["hmean"] else 0.0)
        except (KeyError, TypeError, ValueError):
            continue
    return out


def _has_intervals(r: Record) -> bool:
    """net's records: per-interval bytes with start and end times in extra."""
    e = r.extra
    return all(isinstance(e.get(k), list) and e.get(k) for k in ("interval_bytes", "interval_start_s", "interval_end_s"))


# params that can be a sweep's x axis, in bytes (memcpy2d's is the row width)
SIZE_KEYS = ("nbytes", "piece_bytes", "piece", "size", "width")


def size_key(r: Record) -> str | None:
    """The param holding the swept size in bytes (nbytes, batch's piece_bytes, memcpy2d's width), or None."""
    for k in SIZE_KEYS:
        v = r.params.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return k
    return None


# params that can move with the x axis: memcpy2d's --sweep grows height and pitches with the width
_COMPANIONS = {"width": ("height", "src_pitch", "dst_pitch")}


def _tied_to_x(records: Sequence[Record], xkey: str) -> set[str]:
    """Companions of ``xkey`` whose value is fixed by x across ``records`` (one value per x): they
    say nothing the x axis does not, so they make no separate lines. A companion that takes two
    values at one x (several heights at one width) stays a mode."""
    tied = set()
    for k in _COMPANIONS.get(xkey, ()):
        seen: dict = {}
        if all(seen.setdefault(r.params.get(xkey), r.params.get(k)) == r.params.get(k) for r in records):
            tied.add(k)
    return tied


def _kind(r: Record) -> str:
    if "src" in r.params and "dst" in r.params:
        return "matrix"
    if "pair" in r.params or _merge_pair_stats(r):
        return "pairs"
    if _has_intervals(r):
        return "intervals"
    if size_key(r):
        return "sweep"
    return "other"


def _mode_keys(records: Sequence[Record], skip: set[str]) -> list[str]:
    """Param names (other than ``skip``) whose values differ between records, first-seen order."""
    keys: list[str] = []
    for r in records:
        for k in r.params:
            if k not in skip and k not in keys:
                keys.append(k)
    return [k for k in keys if len({repr(r.params.get(k)) for r in records}) > 1]


def _mode_label(r: Record, keys: Sequence[str]) -> str:
    parts = []
    for k in keys:
        v = r.params.get(k)
        if v is None:
            continue
        if k in SIZE_KEYS and isinstance(v, int):
            parts.append(format_size(v))
        elif k == "device":
            parts.append(f"GPU {v}")
        else:
            parts.append(str(v))
    return " ".join(parts)


def _usable(r: Record) -> bool:
    return bool(r.samples_s) and not r.error and (r.metric == "time" or r.nbytes > 0) and all(
        math.isfinite(t) and t > 0 for t in r.samples_s)


def values(r: Record, units: str = "GB") -> Summary:
    """Summary of a record's plotted values: GB/s (or GiB/s) for bandwidth, microseconds for time."""
    if r.metric == "time":
        return Summary.of([t * 1e6 for t in r.samples_s])
    scale = UNITS[units]
    return Summary.of([x / scale for x in r.rates()])


def build_panels(results: Sequence[tuple[str, Result]]) -> list[Panel]:
    """Group the records of every result into panels.

    Raises:
        UsageError: no record with samples to plot.
    """
    many = len(results) > 1
    groups: dict[tuple[str, str, str], list[tuple[str, Record]]] = {}
    for name, res in results:
        for r in res.records:
            if not _usable(r):
                continue
            k = _kind(r)
            if k == "other":
                continue
            groups.setdefault((k, r.metric, res.command), []).append((name, r))
    panels: list[Panel] = []
    for (kind, metric, command), items in groups.items():
        recs = [r for _, r in items]
        if kind == "sweep":
            xkey = size_key(recs[0]) or "nbytes"
            keys = _mode_keys(recs, {xkey, *_tied_to_x(recs, xkey)})
            series: dict[str, list[Record]] = {}
            for name, r in items:
                label = _mode_label(r, keys) or command
                if many:
                    label = f"{label} [{Path(name).stem}]"
                series.setdefault(label, []).append(r)
            panels.append(Panel(kind, metric, f"{command}: {'bandwidth' if metric == 'bandwidth' else 'time'} vs size",
                                list(series.items()), command))
        elif kind == "matrix":
            keys = _mode_keys(recs, {"src", "dst"})
            per: dict[str, list[Record]] = {}
            for name, r in items:
                label = (_mode_label(r, keys) or _mode_label(r, [k for k in r.params if k not in ("src", "dst")])
                         or command)
                if many:
                    label = f"{label} [{Path(name).stem}]"
                per.setdefault(label, []).append(r)
            for label, rs in per.items():
                panels.append(Panel(kind, metric, f"{command}: {label}", [(label, rs)]))
        elif kind == "intervals":
            series = {}
            for name, r in items:
                label = " ".join(f"{k}={v}" for k, v in r.params.items() if k == "stream") or command
                if many:
                    label = f"{label} [{Path(name).stem}]"
                series.setdefault(label, []).append(r)
            panels.append(Panel(kind, metric, f"{command}: throughput per interval", list(series.items())))
        else:  # pairs
            keys = _mode_keys(recs, {"pair"})
            per = {}
            for name, r in items:
                label = _mode_label(r, keys) or command
                if many:
                    label = f"{label} [{Path(name).stem}]"
                per.setdefault(label, []).append(r)
            panels.append(Panel(kind, metric, f"{command}: per worker pair", list(per.items())))
    if not panels:
        raise UsageError("nothing to plot: no record with samples and a size, a src/dst pair, a worker pair "
                         "or per-interval figures", "plot reads copy, batch, memcpy2d, p2p, nccl, merge and net results")
    return panels


def _unit_label(metric: str, units: str) -> str:
    return f"{units}/s" if metric == "bandwidth" else "us"


# a sweep's x axis by command, else by its size param
X_NAMES = {"nccl": "size (nccl-tests' size, bytes per rank)", "nbytes": "size per copy",
           "width": "row width (bytes)"}


def _draw_sweep(ax, panel: Panel, units: str, peaks_extra: Sequence[float]) -> None:
    styles = _series_styles(panel)
    for label, recs in panel.series:
        recs = sorted(recs, key=lambda r: r.params[size_key(r)])
        xs = [r.params[size_key(r)] for r in recs]
        ss = [values(r, units) for r in recs]
        color, linestyle, marker = styles[label]
        line, = ax.plot(xs, [s.median for s in ss], color=color, linestyle=linestyle, marker=marker,
                        markersize=3, lw=1.3, label=label)
        ax.fill_between(xs, [s.p25 for s in ss], [s.p75 for s in ss], color=line.get_color(), alpha=0.2, lw=0)
    ax.set_xscale("log", base=2)
    xkey = size_key(panel.series[0][1][0])
    xname = X_NAMES.get(panel.command) or X_NAMES.get(xkey, "bytes per piece")
    ax.set_xlabel(xname + " (log2)")
    ax.set_ylabel(f"{'bandwidth' if panel.metric == 'bandwidth' else 'time'} ({_unit_label(panel.metric, units)}), median")
    if panel.metric == "time":
        ax.set_yscale("log")
    else:
        peaks = {float(r.extra["peak_bytes_per_s"]) for _, rs in panel.series for r in rs
                 if isinstance(r.extra.get("peak_bytes_per_s"), (int, float)) and r.extra["peak_bytes_per_s"] > 0}
        peaks |= {float(p) for p in peaks_extra}
        for p in sorted(peaks):
            v = p / UNITS[units]
            ax.axhline(v, linestyle="--", color="0.35", lw=1)
            ax.annotate(f"link peak {v:.1f} {units}/s", (0.01, v), xycoords=("axes fraction", "data"),
                        textcoords="offset points", xytext=(0, 3), fontsize=8, color="0.3")
        ax.set_ylim(bottom=0)
    ticks = sorted({r.params[size_key(r)] for _, rs in panel.series for r in rs})
    if len(ticks) > 12:
        step = math.ceil(len(ticks) / 12)
        ticks = ticks[::step]
    ax.set_xticks(ticks)
    ax.set_xticklabels([format_size(t).replace(" ", "") for t in ticks], rotation=45, fontsize=8)
    ax.grid(True, which="major", alpha=0.3)
    # handles long enough to tell the dash patterns apart (pinned and registered share a colour)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0,
              ncol=1 if len(panel.series) <= 14 else 2, handlelength=4)


_LINESTYLES = ["-", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1))]
_MARKERS = ["o", "s", "^", "D", "v", "x"]


def _series_styles(panel: Panel) -> dict[str, tuple]:
    """Colour by the first word of a series label (e.g. direction), line style by the second
    (e.g. memory kind), marker by the result it came from, so 20 lines stay readable."""
    firsts, seconds, srcs = [], [], []
    out = {}
    for label, _ in panel.series:
        base, _, src = label.partition(" [")
        words = base.split(" ", 1)
        a, b = words[0], words[1] if len(words) > 1 else ""
        for v, seen in ((a, firsts), (b, seconds), (src, srcs)):
            if v not in seen:
                seen.append(v)
        out[label] = (a, b, src)
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if len(firsts) <= 10 else "tab20"]
    return {label: (cmap(firsts.index(a) % cmap.N), _LINESTYLES[seconds.index(b) % len(_LINESTYLES)],
                    _MARKERS[srcs.index(src) % len(_MARKERS)]) for label, (a, b, src) in out.items()}


def _draw_matrix(ax, panel: Panel, units: str) -> None:
    import numpy as np

    (_, recs), = panel.series
    devs = sorted({r.params["src"] for r in recs} | {r.params["dst"] for r in recs}, key=str)
    idx = {d: i for i, d in enumerate(devs)}
    m = np.full((len(devs), len(devs)), np.nan)
    for r in recs:
        m[idx[r.params["src"]], idx[r.params["dst"]]] = values(r, units).median
    finite = m[np.isfinite(m)]
    top = float(finite.max()) if finite.size else 1.0
    im = ax.imshow(np.ma.masked_invalid(m), cmap="viridis", vmin=0, vmax=top)  # from 0: colours show magnitude
    ax.figure.colorbar(im, ax=ax, label=_unit_label(panel.metric, units))
    ax.set_xticks(range(len(devs)), [f"GPU {d}" for d in devs])
    ax.set_yticks(range(len(devs)), [f"GPU {d}" for d in devs])
    ax.set_xlabel("destination")
    ax.set_ylabel("source")
    mid = top / 2
    for i in range(len(devs)):
        for j in range(len(devs)):
            if np.isfinite(m[i, j]):
                ax.text(j, i, f"{m[i, j]:.3g}", ha="center", va="center", fontsize=9,
                        color="black" if m[i, j] > mid else "white")


def _pair_summaries(recs: Sequence[Record], units: str) -> dict[str, Summary]:
    """Per-pair Summaries in ``units``/s: from records with a "pair" param, or merge's extra."""
    out: dict[str, Summary] = {}
    scale = UNITS[units]
    for r in recs:
        if "pair" in r.params:
            out[str(r.params["pair"])] = values(r, units)
        for pair, s in _merge_pair_stats(r).items():
            out[pair] = Summary(s.n, s.median / scale, s.mean / scale, s.min / scale, s.max / scale,
                                s.p25 / scale, s.p75 / scale, s.stdev / scale, s.cv)
    return out


def _draw_intervals(ax, panel: Panel, units: str) -> None:
    """net: each stream's (and the total's) rate per interval against the interval's end time;
    omitted intervals drawn hollow."""
    scale = UNITS[units]
    for label, recs in panel.series:
        for r in recs:
            e = r.extra
            ends = e["interval_end_s"]
            rates = [b / (t1 - t0) / scale if t1 > t0 else float("nan")
                     for b, t0, t1 in zip(e["interval_bytes"], e["interval_start_s"], ends)]
            line, = ax.plot(ends, rates, marker="o", label=label)
            omit = e.get("interval_omit") or []
            xs = [t for t, o in zip(ends, omit) if o]
            ys = [v for v, o in zip(rates, omit) if o]
            if xs:
                ax.plot(xs, ys, "o", markerfacecolor="white", color=line.get_color())
    ax.set_xlabel("time (s), end of interval; hollow = omitted")
    ax.set_ylabel(f"{units}/s received")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)


def _draw_pairs(ax, panel: Panel, units: str) -> None:
    import numpy as np

    pairs: list[str] = []
    for _, recs in panel.series:
        for p in _pair_summaries(recs, units):
            if p not in pairs:
                pairs.append(p)
    k = len(panel.series)
    width = 0.8 / max(k, 1)
    x = np.arange(len(pairs))
    for i, (label, recs) in enumerate(panel.series):
        by = _pair_summaries(recs, units)
        med = [by[p].median if p in by else np.nan for p in pairs]
        lo = [by[p].median - by[p].p25 if p in by else 0 for p in pairs]
        hi = [by[p].p75 - by[p].median if p in by else 0 for p in pairs]
        ax.bar(x + (i - (k - 1) / 2) * width, med, width, yerr=[lo, hi], capsize=3, label=label)
    ax.set_xticks(x, pairs, rotation=30, fontsize=8)
    ax.set_xlabel("worker pair (w1, w2)")
    ax.set_ylabel(f"{_unit_label(panel.metric, units)}, median (p25-p75)")
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)


def parse_figsize(text: str | None, n_panels: int) -> tuple[float, float]:
    """Figure size in inches from "WxH" (e.g. "12x7"), or a default that grows with the panels.

    Raises:
        UsageError: not two positive numbers joined by "x".
    """
    if text is None:
        cols = 1 if n_panels == 1 else 2
        rows = math.ceil(n_panels / cols)
        return PANEL_W_IN * cols, PANEL_H_IN * rows
    try:
        w, h = (float(v) for v in text.lower().split("x"))
    except ValueError:
        raise UsageError(f"--size {text!r} is not WIDTHxHEIGHT in inches", "e.g. --size 12x7") from None
    if not (0 < w <= 100 and 0 < h <= 100):
        raise UsageError(f"--size {text!r}: width and height must be in (0, 100] inches")
    return w, h


def render(results: Sequence[tuple[str, Result]], out: str | Path, *, units: str = "GB",
           size_in: tuple[float, float] | None = None, dpi: int = 100, peaks_gbps: Sequence[float] = (),
           title: str | None = None) -> Path:
    """Draw the results into a PNG of exactly ``size_in`` inches x ``dpi`` pixels.

    Args:
        results: (name, Result) pairs; several are overlaid (names label the lines).
        out: the PNG path.
        units: "GB" or "GiB" for bandwidth axes.
        size_in: (width, height) in inches; None picks one from the number of panels.
        dpi: pixels per inch.
        peaks_gbps: extra peak lines, in ``units``/s.

    Raises:
        UsageError: nothing to plot.
        MachineError: the PNG cannot be written.
    """
    try:
        import matplotlib
    except ImportError:
        raise UsageError("plot needs matplotlib, which is not installed", "pip install 'gpubench[plot]'") from None

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    from gpubench.core.errors import MachineError

    panels = build_panels(results)
    w, h = size_in or parse_figsize(None, len(panels))
    cols = 1 if len(panels) == 1 else 2
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(w, h), dpi=dpi, squeeze=False, layout="constrained")
    try:
        peaks_bps = [p * UNITS[units] for p in peaks_gbps]
        for ax, panel in zip(axes.flat, panels):
            ax.set_title(panel.title, fontsize=10, loc="left")
            if panel.kind == "sweep":
                _draw_sweep(ax, panel, units, peaks_bps)
            elif panel.kind == "matrix":
                _draw_matrix(ax, panel, units)
            elif panel.kind == "intervals":
                _draw_intervals(ax, panel, units)
            else:
                _draw_pairs(ax, panel, units)
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        if title:  # a tab or newline in --title has no glyph: drawn as a space
            fig.suptitle("".join(c if c.isprintable() else " " for c in title))
        try:
            fig.savefig(out, dpi=dpi, format="png")
        except OSError as e:
            raise MachineError(f"could not write {str(out)!r}: {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return Path(out)

"""plot: every kind drawn from the fixtures in tests/data and checked for what a person checks:
axis labels with units, legend entries equal to the series drawn, no two series of one
colour and style, a matrix of equal cells still showing its value, peaks named by their source."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
import edited  # noqa: E402
import synth  # noqa: E402

from gpubench.analysis import plot  # noqa: E402
from gpubench.core.errors import UsageError  # noqa: E402
from gpubench.core.result import Record, Result, save  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data"


def fixture(name: str) -> tuple[str, Result]:
    return (str(DATA / name), plot.load(DATA / name))


def drawn(results, **kw):
    fig, sections = plot.figure(results, **kw)
    fig.canvas.draw() if hasattr(fig.canvas, "draw") else None
    return fig, sections


def visible_axes(fig):
    """The data axes of a figure (not colorbars or the hidden spare cells)."""
    out = []
    for sf in fig.subfigs:
        for ax in sf.axes:
            if ax.get_visible() and ax.get_label() != "<colorbar>" and ax.get_xlabel() != "" or \
                    ax.get_visible() and ax.images:
                out.append(ax)
    return out


def series_artists(ax):
    """(label, colour, style) of each named line and bar set on an axes."""
    import matplotlib.colors as mc

    out = []
    for line in ax.get_lines():
        if not line.get_label().startswith("_"):
            out.append((line.get_label(), mc.to_hex(line.get_color()), str(line.get_linestyle()),
                        str(line.get_marker())))
    for cont in ax.containers:
        label = cont.get_label()
        if label and not label.startswith("_") and hasattr(cont, "patches"):
            p = cont.patches[0]
            out.append((label, mc.to_hex(p.get_facecolor()), p.get_hatch() or "", "bar"))
    return out


def legend_texts(fig):
    return [t.get_text() for sf in fig.subfigs for lg in sf.legends for t in lg.get_texts()]


def check_legend_and_styles(fig):
    drawn_labels = set()
    for ax in visible_axes(fig):
        arts = series_artists(ax)
        styles = [a[1:] for a in arts]
        assert len(styles) == len(set(styles)), f"two series share colour and style on {ax.get_title()}: {arts}"
        drawn_labels |= {a[0] for a in arts}
    texts = legend_texts(fig)
    named = [t for t in texts if t not in plot.EXPLAIN_LABELS and not t.startswith("omitted")]
    assert set(named) == drawn_labels and len(named) == len(set(named)), (named, drawn_labels)
    return texts


def test_copy_is_faceted_by_direction_with_one_colour_per_memory_kind():
    fig, (sec,) = drawn([fixture("copy-all-h200.json")])
    assert sec.kind == "sweep" and [p.title for p in sec.panels] == ["h2d", "d2h", "bidir-h2d", "bidir-d2h",
                                                                     "bidir-total"]
    axes = visible_axes(fig)
    assert len(axes) == 5
    for ax in axes:
        assert "GB/s" in ax.get_ylabel() and "size per copy" in ax.get_xlabel()
        arts = series_artists(ax)
        assert sorted(a[0] for a in arts) == sorted(["pinned", "pageable", "write-combined", "registered"])
        assert len({a[1] for a in arts}) == 4  # a colour per memory kind
        assert ax.get_ylim()[0] == 0
        assert ax.get_title(loc="right") == "n = 5-100 samples per point" or "samples per point" in \
            ax.get_title(loc="right")
    texts = check_legend_and_styles(fig)
    assert plot.BAND_LABEL in texts  # the shaded band is explained


def test_an_overlay_is_one_colour_per_file_and_the_legend_names_the_file():
    fig, (sec,) = drawn([fixture("copy-pinned-h200.json"), fixture("copy-all-h200.json")])
    h2d = visible_axes(fig)[0]
    arts = series_artists(h2d)
    by_file = {}
    for label, colour, *_ in arts:
        by_file.setdefault(label.split(" · ")[1], set()).add(colour)
    assert set(by_file) == {"copy-pinned-h200.json", "copy-all-h200.json"}
    assert all(len(c) == 1 for c in by_file.values())  # one colour per file
    assert by_file["copy-pinned-h200.json"] != by_file["copy-all-h200.json"]
    check_legend_and_styles(fig)


def test_batch_at_one_size_is_bars_per_strategy_with_whiskers_and_n():
    fig, (sec,) = drawn([fixture("batch-h200.json")])
    assert sec.kind == "bars" and "4096 pieces of 4 KiB" in sec.title
    (ax,) = visible_axes(fig)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["separate", "packed", "packed+gather", "batched-api",
                                                            "contiguous"]
    assert "bandwidth (GB/s)" in ax.get_ylabel()
    arts = series_artists(ax)
    assert sorted(a[0] for a in arts) == ["d2h pageable", "d2h pinned", "h2d pageable", "h2d pinned"]
    notes = [t.get_text() for t in ax.texts]
    assert sum("n=" in t for t in notes) == 20  # every bar says how many samples stand behind it
    texts = check_legend_and_styles(fig)
    assert plot.WHISKER_LABEL in texts
    # the record's peak is labelled by its source
    assert any("PCIe Gen5 x16 peak 63.0 GB/s (measured link)" == t.get_text() for t in ax.texts)
    # no bar's label crosses the peak line (a tall bar's is written inside it)
    fig.canvas.draw()
    peak_y = ax.transData.transform((0, 63.0))[1]
    for t in ax.texts:
        if "n=" in t.get_text():
            box = t.get_window_extent()
            assert not box.y0 < peak_y < box.y1, t.get_text()


def overlap_result() -> Result:
    recs = []
    for work in (0, 64):
        for stage, t in (("h2d", 1e-3), ("kernel", 2e-3 if work else 1e-4), ("d2h", 1e-3), ("serial", 4e-3),
                         ("overlapped", 2.2e-3)):
            recs.append(Record(params={"device": 0, "work": work, "streams": 4, "chunks": 8, "nbytes": 2**26,
                                       "stage": stage}, metric="time", nbytes=2**26,
                               samples_s=[t, t * 1.01, t * 0.99, t * 1.02]))
    return Result("overlap", {}, records=recs)


def test_overlap_is_bars_per_stage_in_microseconds():
    fig, (sec,) = drawn([("ov.json", overlap_result())])
    (ax,) = visible_axes(fig)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["h2d", "kernel", "d2h", "serial", "overlapped"]
    assert "time (us)" in ax.get_ylabel()
    assert sorted(a[0] for a in series_artists(ax)) == ["work=0", "work=64"]
    check_legend_and_styles(fig)


def test_nccl_names_busbw_and_algbw_and_the_collective_and_rank_count():
    _, res = fixture("nccl-h200x2.json")
    for r in res.records:
        r.extra["busbw_factor"] = 1.5  # as for 4 ranks: two panels
    fig, (sec,) = drawn([("x.json", res)])
    assert "all-reduce, 2 ranks" in sec.title
    axes = visible_axes(fig)
    assert [ax.get_title(loc="left") for ax in axes] == ["all-reduce, 2 ranks: busbw", "all-reduce, 2 ranks: algbw"]
    assert axes[0].get_ylabel().startswith("busbw (GB/s)") and axes[1].get_ylabel().startswith("algbw (GB/s)")
    assert "nccl-tests" in axes[0].get_xlabel()
    check_legend_and_styles(fig)


def test_nccl_with_busbw_equal_to_algbw_draws_one_panel_saying_so():
    """2 ranks: all-reduce's busbw factor 2(n-1)/n is 1, so two panels would hold the same figures."""
    fig, (sec,) = drawn([fixture("nccl-h200x2.json")])
    (ax,) = visible_axes(fig)
    assert ax.get_title(loc="left") == "all-reduce, 2 ranks: busbw = algbw"
    check_legend_and_styles(fig)


def test_nccl_busbw_is_algbw_times_the_factor():
    _, res = fixture("nccl-h200x2.json")
    for r in res.records:
        r.extra["busbw_factor"] = 1.5
    fig, _ = drawn([("x.json", res)])
    axes = visible_axes(fig)
    for lb, la in zip(axes[0].get_lines(), axes[1].get_lines()):
        assert list(lb.get_ydata()) == pytest.approx([1.5 * v for v in la.get_ydata()])


def test_net_is_per_stream_and_total_from_zero():
    fig, (sec,) = drawn([fixture("net-local.json")])
    (ax,) = visible_axes(fig)
    assert ax.get_xlim()[0] == 0 and ax.get_ylim()[0] == 0
    assert "time since the start (s)" == ax.get_xlabel() and "GB/s" in ax.get_ylabel()
    assert sorted(a[0] for a in series_artists(ax)) == ["stream 0", "stream 1", "total"]
    check_legend_and_styles(fig)


def test_net_bidir_is_a_panel_per_direction_on_one_scale():
    import copy

    _, res = fixture("net-local.json")
    s2c = copy.deepcopy([r for r in res.records if r.params.get("direction", "c2s") == "c2s"])
    for r in s2c:  # the server -> client half moved a quarter of the bytes
        r.params["direction"] = "s2c"
        r.extra["interval_bytes"] = [b // 4 for b in r.extra["interval_bytes"]]
    for r in res.records:
        r.params.setdefault("direction", "c2s")
    res.records += s2c
    fig, (sec,) = drawn([("bidir.json", res)])
    axes = visible_axes(fig)
    assert [ax.get_title(loc="left") for ax in axes] == ["direction c2s", "direction s2c"]
    tops = []
    for ax, d in zip(axes, ("c2s", "s2c")):
        assert sorted(a[0] for a in series_artists(ax)) == ["stream 0", "stream 1", "total"]
        total = next(r for r in res.records if r.params["direction"] == d and r.params["stream"] == "total")
        e = total.extra
        want = [b / (t1 - t0) / 1e9 for b, t0, t1 in zip(e["interval_bytes"], e["interval_start_s"], e["interval_end_s"])]
        line = next(line for line in ax.get_lines() if line.get_label() == "total")
        assert list(line.get_ydata())[::2] == pytest.approx(want)  # this panel's direction, not the other's
        tops.append(ax.get_ylim())
    assert tops[0] == tops[1]  # one scale: the slower direction looks slower
    assert "a panel per direction" in sec.title
    check_legend_and_styles(fig)


def test_net_takes_a_user_peak_labelled_user():
    fig, _ = drawn([fixture("net-local.json")], peaks_gbps=[10.0])
    (ax,) = visible_axes(fig)
    assert "--peak peak 10.0 GB/s (user)" in [t.get_text() for t in ax.texts]


def test_merge_is_bars_per_worker_pair():
    fig, (sec,) = drawn([fixture("merge-cpu.json")])
    (ax,) = visible_axes(fig)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["(0,1)", "(1,0)"]
    assert ax.get_xlabel() == "worker pair (w1, w2)" and "GB/s" in ax.get_ylabel()
    assert [t.get_text().split("n=")[1] for t in ax.texts if "n=" in t.get_text()] == ["2", "1"]
    check_legend_and_styles(fig)


def test_p2p_is_one_figure_of_matrices_on_a_shared_scale_latency_reversed():
    fig, (sec,) = drawn([fixture("p2p-h200x2.json")])
    assert sec.kind == "matrix" and len(sec.panels) == 12
    titles = [p.title for p in sec.panels]
    assert titles[:4] == ["write · 1 GiB", "read · 1 GiB", "bidir forward · 1 GiB", "bidir reverse · 1 GiB"]
    assert "sm · 1 GiB" in titles  # the requested size, as the other panels (not "1023 MiB")
    assert titles[-2:] == ["latency · 16 B", "off-latency · 16 B"]
    images = [ax.images[0] for sf in fig.subfigs for ax in sf.axes if ax.images]
    assert len(images) == 12
    bw = [im for im in images if im.cmap.name == "viridis"]
    lat = [im for im in images if im.cmap.name == "viridis_r"]  # lower latency is brighter
    assert len(bw) == 10 and len(lat) == 2
    assert len({(im.norm.vmin, im.norm.vmax) for im in bw}) == 1  # one scale for every bandwidth matrix
    assert len({(im.norm.vmin, im.norm.vmax) for im in lat}) == 1
    cbars = {im.colorbar.ax.get_ylabel() for im in images if im.colorbar is not None}
    assert sorted(cbars) == ["bandwidth (GB/s), median", "latency (us), median"]  # one scale bar per metric


def test_a_2x2_matrix_of_equal_cells_still_shows_its_value():
    recs = [Record(params={"test": "write", "src": s, "dst": d, "nbytes": 2**30}, nbytes=2**30,
                   samples_s=[2**30 / 400e9] * 5) for s in (0, 1) for d in (0, 1)]
    fig, _ = drawn([("eq.json", Result("p2p", {}, records=recs))])
    (ax,) = [ax for sf in fig.subfigs for ax in sf.axes if ax.images]
    texts = [t.get_text() for t in ax.texts]
    assert len(texts) == 4 and all(t.startswith("400 GB/s") for t in texts)
    # the text is readable on its cell: dark text on the bright (top of scale) colour
    import matplotlib.colors as mc

    assert all(mc.to_hex(t.get_color()) == "#000000" for t in ax.texts)


@pytest.mark.parametrize("n", [2, 6])
def test_a_net_node_matrix_names_ranks_not_gpus(n):
    """net's node x node result (src/dst are ranks, one per node) is drawn as a matrix as p2p's is,
    with its rows and columns named as ranks: it was labelled "GPU 0", "source GPU"."""
    recs = [Record(params={"src": s, "dst": (s + 1) % n, "stream": "total"}, nbytes=131072,
                   samples_s=[131072 / 5e9] * 4) for s in range(n)]
    fig, (sec,) = drawn([("fleet.json", Result("net", {"mode": "fleet"}, records=recs))])
    assert sec.kind == "matrix" and "source rank (rows) to destination rank (columns)" in sec.title
    (ax,) = [ax for sf in fig.subfigs for ax in sf.axes if ax.images]
    words = [t.get_text() for t in ax.get_xticklabels() + ax.get_yticklabels()] + [ax.get_xlabel(), ax.get_ylabel()]
    assert not any("GPU" in w for w in words), words
    if n == 2:
        assert [t.get_text() for t in ax.get_xticklabels()] == ["rank 0", "rank 1"]


def test_p2p_draws_inside_the_figure_size_it_says(tmp_path):
    from PIL import Image

    out = plot.render([fixture("p2p-h200x2.json")], tmp_path / "p.png", dpi=50)
    _, sections = plot.figure([fixture("p2p-h200x2.json")])
    w, h = sections[0].size_in()
    with Image.open(out) as im:
        assert im.size == (round(w * 50), round(h * 50))


@pytest.mark.parametrize("size,dpi,expect", [("12x7", 100, (1200, 700)), ("6x4", 50, (300, 200))])
def test_png_has_the_asked_size(tmp_path, size, dpi, expect):
    from PIL import Image

    out = tmp_path / "out.png"
    plot.render([fixture("copy-pinned-h200.json")], out, size_in=plot.parse_figsize(size), dpi=dpi, peaks_gbps=[63.0])
    with Image.open(out) as im:
        assert im.size == expect
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_user_peak_is_refused_where_no_bandwidth_axis_exists():
    with pytest.raises(UsageError, match="no bandwidth axis"):
        plot.figure([("ov.json", overlap_result())], peaks_gbps=[50.0])
    only_latency = [r for r in fixture("p2p-h200x2.json")[1].records if r.metric == "time"]
    with pytest.raises(UsageError, match="p2p matrices"):
        plot.figure([("l.json", Result("p2p", {}, records=only_latency))], peaks_gbps=[50.0])


def test_nvml_peak_from_the_env_when_records_carry_none():
    res = synth.copy_like(1, peak=None)
    res.env = {"gpus": [{"index": 0, "pcie_gen": 4, "pcie_width": 16, "pcie_peak_bytes_per_s": 31.5e9}]}
    fig, _ = drawn([("c.json", res)])
    texts = [t.get_text() for ax in visible_axes(fig) for t in ax.texts]
    assert "PCIe Gen4 x16 peak 31.5 GB/s (NVML)" in texts


def test_above_peak_points_are_marked_and_explained():
    res = synth.copy_like(2, peak=40e9)
    for r in res.records:
        r.mark_peak(40e9)
    fig, _ = drawn([("c.json", res)])
    assert plot.ABOVE_LABEL in legend_texts(fig)


def test_mathtext_in_a_title_a_file_name_or_a_param_is_shown_not_parsed(tmp_path):
    res = synth.copy_like(3)
    for r in res.records:
        r.params["memory"] = r"$\foo$ pinned"
    path = tmp_path / "$\\bar$.json"
    save(res, path)
    out = plot.render([(str(path), plot.load(path)), fixture("copy-pinned-h200.json")], tmp_path / "m.png",
                      title=r"$\frac{1}{0$", dpi=30)
    assert out.stat().st_size > 1000
    fig, _ = plot.figure([(str(path), plot.load(path))], title=r"$\foo$")
    assert fig._suptitle.get_text() == r"\$\foo\$"


def test_nothing_to_plot_is_a_usage_error():
    with pytest.raises(UsageError, match="nothing to plot"):
        plot.build_sections([("env.json", Result("env", {}))])


def test_memcpy2d_sweep_is_one_line_per_strategy_though_height_and_pitches_move_with_the_width():
    from gpubench.plugins.memcpy2d.command import build_spec

    spec = build_spec(width=None, height=None, total=None, sweep=True, src_pitch="4x", dst_pitch="1x",
                      strategies="2d,row-loop", directions="h2d", memory="pinned", device=0, warmup=2, iters=None,
                      min_time=0.1)
    points = spec.points
    recs = [Record(params={"device": 0, "direction": "h2d", "strategy": s, "memory": "pinned", "width": w,
                           "height": h, "src_pitch": sp, "dst_pitch": dp},
                   metric="bandwidth", nbytes=w * h, samples_s=[1e-5, 1.1e-5])
            for s in ("2d", "row-loop") for (w, h, sp, dp) in points]
    (sec,) = plot.build_sections([("m.json", Result("memcpy2d", {}, records=recs))])
    assert sec.kind == "sweep"
    (p,) = sec.panels
    assert sorted(s.label for s in p.series) == ["2d", "row-loop"]
    assert all(len(s.records) == len(points) for s in p.series)
    fig, _ = drawn([("m.json", Result("memcpy2d", {}, records=recs))])
    assert "row width" in visible_axes(fig)[0].get_xlabel()


def test_memcpy2d_at_one_window_is_bars_per_strategy():
    recs = [Record(params={"device": 0, "direction": d, "strategy": s, "memory": "pinned", "width": 256,
                           "height": 64, "src_pitch": 1024, "dst_pitch": 256}, nbytes=256 * 64,
                   samples_s=[t, t * 1.1]) for s, t in (("2d", 1e-5), ("row-loop", 4e-5)) for d in ("h2d", "d2h")]
    (sec,) = plot.build_sections([("m.json", Result("memcpy2d", {}, records=recs))])
    assert sec.kind == "bars" and sec.panels[0].cat_key == "strategy"


def test_display_names_are_unique():
    assert plot.display_names(["a/x.json", "b/x.json", "c/y.json"]) == ["a/x.json", "b/x.json", "c/y.json"]
    assert plot.display_names(["a/x.json", "c/y.json"]) == ["x.json", "y.json"]


def test_each_facet_has_its_own_y_scale_so_a_slow_direction_is_not_flattened():
    res = synth.copy_like(4, median_gbps=(10.0, 20.0, 30.0))
    for r in res.records:  # d2h (the second facet) much faster than h2d, as d2d is beside h2d
        if r.params["direction"] == "d2h":
            r.samples_s = [t / 5 for t in r.samples_s]
    fig, _ = drawn([("c.json", res)])
    h2d, d2h = visible_axes(fig)[:2]
    highest = {ax: max(max(line.get_ydata()) for line in ax.get_lines() if not line.get_label().startswith("_"))
               for ax in (h2d, d2h)}
    assert highest[d2h] > 4 * highest[h2d]
    for ax in (h2d, d2h):
        assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= highest[ax]
    assert h2d.get_ylim()[1] < highest[d2h]  # h2d is drawn on its own scale, not d2h's


# ---- saved figures beyond a physical limit ----

def test_plot_marks_a_saved_figure_beyond_its_limit():
    from gpubench.analysis import plot
    from gpubench.core.result import Result

    for case, labels in (("no-op saved", plot.NO_OP_LABEL), ("stale flag", plot.ABOVE_LABEL),
                         ("limit_flag only", plot.ABOVE_LABEL)):
        res = Result.from_dict(edited.LIMIT_CASES[case]())
        texts = edited.legend_texts(plot.figure([(case, res)]))
        assert labels in texts, (case, texts)

def test_plot_bars_mark_a_figure_above_its_limit():
    from gpubench.analysis import plot
    from gpubench.core.result import Result

    d = json.loads((edited.DATA / "batch-h200.json").read_text())
    d["records"][0]["extra"].update(peak_bytes_per_s=1e9, above_peak=False)
    texts = edited.legend_texts(plot.figure([("batch", Result.from_dict(d))]))
    assert plot.ABOVE_LABEL in texts, texts


def test_a_figure_size_drops_ascii_spaces_around_it_as_every_value_does():
    assert plot.parse_figsize(" 12x7\t") == (12.0, 7.0)
    for bad in ("12 x 7", "\u00a012x7"):
        with pytest.raises(UsageError, match="is not WIDTHxHEIGHT"):
            plot.parse_figsize(bad)


def test_long_series_labels_wrap_in_the_legend_and_leave_the_axes_their_room(tmp_path):
    """Labels of 120 characters (a hostile or careless file's params) wrap at LEGEND_WIDTH: the
    layout still fits, with no matplotlib warning on the user's terminal."""
    import warnings

    res = synth.copy_like(3, sizes=(4096,), median_gbps=(4.1,))  # one point, one panel: the narrowest figure
    h2d, d2h = res.records
    res.records = [h2d, dataclasses.replace(d2h, params={**h2d.params, "memory": "\x1b[31mxxx" * 40})]
    path = tmp_path / "long.json"
    save(res, path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig, _ = drawn([(str(path), plot.load(path))])
        plot.png_bytes([(str(path), plot.load(path))])
    long = [t for t in legend_texts(fig) if "xxx" in t]
    assert long and all(max(map(len, t.split("\n"))) <= plot.LEGEND_WIDTH and "\n" in t for t in long), long

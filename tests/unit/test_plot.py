"""plot: panels chosen from params, PNGs written with the asked size and read back."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
import synth  # noqa: E402

from gpubench import plot  # noqa: E402
from gpubench.cli import main  # noqa: E402
from gpubench.core.errors import UsageError  # noqa: E402
from gpubench.core.result import Result, load, save  # noqa: E402


def png_size(path: Path) -> tuple[int, int]:
    import matplotlib.image as mpimg

    img = mpimg.imread(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return img.shape[1], img.shape[0]


def test_panels_for_a_copy_sweep_one_line_per_mode():
    (p,) = plot.build_panels([("a.json", load(synth.REAL_ALL))])
    assert p.kind == "sweep" and p.metric == "bandwidth"
    labels = [label for label, _ in p.series]
    assert len(labels) == 20 and "h2d pinned" in labels and "bidir-total registered" in labels
    assert all(len(rs) == 5 for _, rs in p.series)  # 4 KiB .. 256 MiB


def test_overlay_labels_name_the_file():
    panels = plot.build_panels([("x/pinned.json", load(synth.REAL_PINNED)), ("y/all.json", load(synth.REAL_ALL))])
    (p,) = panels
    labels = [label for label, _ in p.series]
    assert "h2d pinned [pinned]" in labels and "h2d pinned [all]" in labels


def test_matrix_and_time_panels():
    panels = plot.build_panels([("p2p.json", synth.p2p_like(1, n_gpus=3))])
    kinds = sorted((p.kind, p.metric, p.title) for p in panels)
    assert kinds == [("matrix", "bandwidth", "p2p: off"), ("matrix", "bandwidth", "p2p: on"),
                     ("matrix", "time", "p2p: on latency")]


def test_nothing_to_plot_is_a_usage_error():
    with pytest.raises(UsageError, match="nothing to plot"):
        plot.build_panels([("env.json", Result("env", {}))])


@pytest.mark.parametrize("size,dpi,expect", [("12x7", 100, (1200, 700)), ("6x4", 50, (300, 200))])
def test_png_has_the_asked_size(tmp_path, size, dpi, expect):
    out = tmp_path / "out.png"
    w, h = plot.parse_figsize(size, 1)
    plot.render([("a", load(synth.REAL_PINNED))], out, size_in=(w, h), dpi=dpi, peaks_gbps=[63.0])
    assert png_size(out) == expect


def test_cli_writes_every_kind_of_panel(tmp_path, capsys):
    p2p, merge_tcp, merge_ucx = tmp_path / "p2p.json", tmp_path / "tcp.json", tmp_path / "ucx.json"
    save(synth.p2p_like(1), p2p)
    save(synth.merge_like(1, "tcp"), merge_tcp)
    save(synth.merge_like(2, "ucx"), merge_ucx)
    out = tmp_path / "all.png"
    with pytest.raises(SystemExit) as e:
        main(["plot", str(synth.REAL_PINNED), str(p2p), str(merge_tcp), str(merge_ucx), "-o", str(out), "--dpi", "40"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    # 1 sweep + 3 p2p matrices + 1 merge pairs panel = 5 panels -> 2 columns x 3 rows of 9.5 x 5 in
    assert png_size(out) == (int(2 * 9.5 * 40), int(3 * 5.0 * 40))


@pytest.mark.parametrize("args,needle", [
    (["-o", "out.jpg"], "must end in .png"),
    (["-o", "out.png", "--size", "big"], "--size 'big'"),
    (["-o", "out.png", "--dpi", "0"], "--dpi 0"),
    (["-o", "out.png", "--peak", "-3"], "--peak -3.0"),
    (["-o", "/no/such/folder/out.png"], "does not exist"),
])
def test_cli_bad_options_exit_2(tmp_path, capsys, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["plot", str(synth.REAL_PINNED), *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle in err and err.count("\n") == 1
    assert not (tmp_path / "out.png").exists()


def test_memcpy2d_windows_plot_against_the_row_width(tmp_path):
    from gpubench.core.result import Record

    recs = []
    for strategy, t in (("2d", 1e-5), ("row-loop", 4e-5)):
        for w in (256, 4096):
            recs.append(Record(params={"device": 0, "direction": "h2d", "strategy": strategy, "memory": "pinned",
                                       "width": w, "height": 64, "src_pitch": 8192, "dst_pitch": 8192},
                               metric="bandwidth", nbytes=w * 64, samples_s=[t, t * 1.1, t * 0.9]))
    (p,) = plot.build_panels([("m.json", Result("memcpy2d", {}, records=recs))])
    assert p.kind == "sweep" and sorted(label for label, _ in p.series) == ["2d", "row-loop"]
    assert all([r.params["width"] for r in rs] == [256, 4096] for _, rs in p.series)
    out = tmp_path / "m.png"
    plot.render([("m", Result("memcpy2d", {}, records=recs))], out, size_in=(6, 4), dpi=50)
    assert png_size(out) == (300, 200)


def test_a_memcpy2d_sweep_is_one_line_per_strategy_though_height_and_pitches_move_with_the_width():
    from gpubench.commands.memcpy2d import build_spec
    from gpubench.core.result import Record

    # the CLI's --sweep with its default pitches (4x source, 1x destination)
    spec = build_spec(width=None, height=None, total=None, sweep=True, src_pitch="4x", dst_pitch="1x",
                      strategies="2d,row-loop", directions="h2d", memory="pinned", device=0, warmup=2, iters=None,
                      min_time=0.1)
    points = spec.points
    assert len({h for _, h, _, _ in points}) > 1 or len({sp for _, _, sp, _ in points}) > 1  # they do move
    recs = [Record(params={"device": 0, "direction": "h2d", "strategy": s, "memory": "pinned", "width": w,
                           "height": h, "src_pitch": sp, "dst_pitch": dp},
                   metric="bandwidth", nbytes=w * h, samples_s=[1e-5, 1.1e-5])
            for s in ("2d", "row-loop") for (w, h, sp, dp) in points]
    (p,) = plot.build_panels([("m.json", Result("memcpy2d", {}, records=recs))])
    assert sorted(label for label, _ in p.series) == ["2d", "row-loop"]
    assert all(len(rs) == len(points) for _, rs in p.series)
    # two heights at one width stay apart
    recs2 = [Record(params={"strategy": "2d", "width": 256, "height": h, "src_pitch": 256, "dst_pitch": 256},
                    metric="bandwidth", nbytes=256 * h, samples_s=[1e-5]) for h in (8, 64)]
    (p2,) = plot.build_panels([("m.json", Result("memcpy2d", {}, records=recs2))])
    assert sorted(label for label, _ in p2.series) == ["64", "8"]

"""plot and report on bad input and bad output targets: one line on
stderr naming the bad value, exit 2, nothing written; a full disk leaves an earlier file whole and
no temporary or empty file behind. Also the flags a report takes from saved results: figures
beyond a physical limit, throttling, a shared or busy GPU."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
import edited  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data"
PINNED = DATA / "copy-pinned-h200.json"
P2P = DATA / "p2p-h200x2.json"


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def refused(run_cli, *argv, needle: str) -> str:
    code, out, err = run_cli(*argv)
    assert code == 2, (argv, code, out, err)
    line = one_line(err)
    assert re.search(needle, line), (needle, line)
    return line


def broken(tmp_path: Path, change) -> Path:
    d = json.loads(PINNED.read_text())
    change(d)
    # not *.json: the session's schema check (tests/conftest.py) reads those, and this one holds NaN
    p = tmp_path / "bad.result"
    p.write_text(json.dumps(d))  # allow_nan: NaN and Infinity are written as such
    return p


# ---- options ----

@pytest.mark.parametrize("peak", ["inf", "nan", "-3", "0", "-inf", "1e300", "1000001", "1e400"])
def test_plot_refuses_a_peak_that_is_not_a_finite_positive_bandwidth(run_cli, tmp_path, peak):
    """Every refusal names --peak's own range (a value that overflows a double included), never a double's."""
    line = refused(run_cli, "plot", PINNED, "-o", tmp_path / "o.png", "--peak", peak,
                   needle=r"--peak .* (must be > 0 GB/s|is not a finite number|is too large)")
    assert "must be > 0" in line or "at most 1,000,000" in line, line
    assert not (tmp_path / "o.png").exists()


def test_plot_refuses_a_peak_with_no_bandwidth_axis_to_draw_it_on(run_cli, tmp_path):
    d = json.loads(P2P.read_text())
    d["records"] = [r for r in d["records"] if r["metric"] == "time"]
    p = tmp_path / "lat.json"
    p.write_text(json.dumps(d))
    refused(run_cli, "plot", p, "-o", tmp_path / "o.png", "--peak", "50", needle="no bandwidth axis .*p2p matrices")
    assert not (tmp_path / "o.png").exists()


@pytest.mark.parametrize("args,needle", [
    (["-o", "out.jpg"], "must end in .png"),
    (["-o", "out.png", "--size", "big"], "--size 'big'"),
    (["-o", "out.png", "--size", "\u0661\u0662x\u0667"], "is not WIDTHxHEIGHT"),
    (["-o", "out.png", "--size", "1_2x7"], "is not WIDTHxHEIGHT"),
    (["-o", "out.png", "--size", "+12x7"], "is not WIDTHxHEIGHT"),
    (["-o", "out.png", "--size", "12 x 7"], "is not WIDTHxHEIGHT"),
    (["-o", "out.png", "--size", "100x100", "--dpi", "1000"], "over 20000 pixels"),
    (["-o", "out.png", "--dpi", "0"], "--dpi 0"),
    (["-o", "/no/such/folder/out.png"], "does not exist"),
])
def test_plot_bad_options_exit_2(run_cli, tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    refused(run_cli, "plot", PINNED, *args, needle=re.escape(needle))
    assert not (tmp_path / "out.png").exists()


def test_plot_takes_mathtext_in_the_title_a_file_name_and_a_param(run_cli, tmp_path):
    d = json.loads(PINNED.read_text())
    for r in d["records"]:
        r["params"]["memory"] = "$\\foo$"
    p = tmp_path / "$x^$.json"
    p.write_text(json.dumps(d))
    code, out, err = run_cli("plot", p, PINNED, "-o", tmp_path / "o.png", "--title", "$\\foo$", "--dpi", "30")
    assert code == 0, err
    assert (tmp_path / "o.png").stat().st_size > 1000


def test_a_one_rank_nccl_result_is_plotted_and_reported(run_cli, tmp_path):
    """One rank's busbw factor is 0 (nccl-tests: 2(n-1)/n and the like) and its in-place points
    are no-ops: the file a one-GPU machine writes is drawn, not refused."""
    one = DATA / "nccl-h200x1.json"
    for command, out in (("plot", tmp_path / "n.png"), ("report", tmp_path / "n.html")):
        code, _out, err = run_cli(command, one, "-o", out)
        assert code == 0, (command, err)
        assert out.stat().st_size > 1000


# ---- malformed numbers in a result: exit 2 naming the field's JSON Pointer, the loader's line (chosen over skipping the point) ----

@pytest.mark.parametrize("change,field", [
    (lambda d: d["records"][3].update(nbytes=float("inf")), r"/records/3/nbytes is inf"),
    (lambda d: d["records"][0].update(nbytes=10 ** 400), r"/records/0/nbytes is \(a 401-digit integer\)"),
    (lambda d: d["records"][1]["samples_s"].__setitem__(2, float("nan")), r"/records/1/samples_s/2 is nan"),
    (lambda d: d["records"][1]["samples_s"].__setitem__(0, 0), r"/records/1/samples_s/0 is 0"),
    (lambda d: d["records"][2].update(reps=float("inf")), r"/records/2/reps is inf"),
    (lambda d: d["records"][2]["extra"].update(peak_bytes_per_s=float("nan")),
     r"/records/2/extra/peak_bytes_per_s is nan"),
])
@pytest.mark.parametrize("command", ["plot", "report"])
def test_malformed_numbers_are_refused_naming_the_field(run_cli, tmp_path, change, field, command):
    bad = broken(tmp_path, change)
    out = tmp_path / ("o.png" if command == "plot" else "o.html")
    refused(run_cli, command, bad, "-o", out, needle=field)
    assert not out.exists()


def test_an_nbytes_written_1e400_is_refused_as_inf(run_cli, tmp_path):
    text = PINNED.read_text().replace('"nbytes":4096,"samples_s"', '"nbytes":1e400,"samples_s"', 1)
    assert "1e400" in text
    p = tmp_path / "big.result"
    p.write_text(text)
    refused(run_cli, "plot", p, "-o", tmp_path / "o.png", needle=r"/nbytes is inf \(expected an integer")


@pytest.mark.parametrize("command,suffix", [("plot", "png"), ("report", "html")])
def test_json_nested_1000_levels_is_refused(run_cli, tmp_path, command, suffix):
    p = tmp_path / "deep.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    try:
        refused(run_cli, command, p, "-o", tmp_path / f"o.{suffix}", needle="nested too deeply|nests [0-9]+ levels deep|not valid JSON")
    finally:
        p.unlink()  # the session's schema check reads every .json left behind


# ---- output targets that are not regular files ----

def _targets(tmp_path: Path, suffix: str) -> dict[str, Path]:
    out = {}
    fifo = tmp_path / f"fifo{suffix}"
    os.mkfifo(fifo)
    out["fifo"] = fifo
    sock = tmp_path / f"sock{suffix}"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    out["socket"] = sock
    link = tmp_path / f"link-to-fifo{suffix}"
    link.symlink_to(fifo)
    out["symlink to a fifo"] = link
    chain = tmp_path / f"link-to-link{suffix}"
    chain.symlink_to(link)
    out["two symlinks to a fifo"] = chain
    if os.geteuid() == 0:
        dev = tmp_path / f"mynull{suffix}"
        os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))  # a character device, as /dev/null
        out["device"] = dev
        out["symlink to a device"] = tmp_path / f"link-to-dev{suffix}"
        out["symlink to a device"].symlink_to(dev)
    out["folder"] = tmp_path / f"folder{suffix}"
    out["folder"].mkdir()
    return out


@pytest.mark.parametrize("command,suffix", [("plot", ".png"), ("report", ".html")])
def test_output_targets_that_are_not_regular_files_are_refused_before_work(run_cli, tmp_path, command, suffix):
    if os.geteuid() != 0 and os.environ.get("CI") == "true":
        pytest.fail("CI runs as root: the device case must run")
    for kind, named in _targets(tmp_path, suffix).items():
        before = os.lstat(named)
        line = refused(run_cli, command, PINNED, "-o", named, needle=r"not a regular file|is a folder|is a directory|is a named pipe|is a socket|is a character device|is a block device|a save would replace it")
        after = os.lstat(named)
        assert (before.st_mode, before.st_ino) == (after.st_mode, after.st_ino), (kind, line)
    assert not list(tmp_path.glob(".gpubench-*"))


# ---- atomic writes: a full disk never truncates an earlier file or leaves an empty one ----

@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 KiB tmpfs: a real full disk (needs root; CI runs as root)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot mount a tmpfs in CI: {r.stderr.strip()}")
        pytest.skip(f"cannot mount a tmpfs here (not root?): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("command,name,inputs", [
    ("plot", "copy.png", [PINNED, DATA / "copy-all-h200.json"]),
    ("report", "r.html", [DATA / "copy-all-h200.json", PINNED]),
])
def test_a_full_disk_keeps_the_earlier_file_whole(tiny_disk, command, name, inputs):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    target = tiny_disk / name
    earlier = b"an earlier file, kept whole\n" * 100
    target.write_bytes(earlier)
    # the new PNG or page is larger than what is left on the 64 KiB disk
    r = subprocess.run([sys.executable, "-m", "gpubench", command, *map(str, inputs), "-o", str(target)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 3, (r.returncode, r.stderr)
    line = one_line(r.stderr)
    assert "No space left on device" in line and str(target) in line
    assert target.read_bytes() == earlier
    assert sorted(p.name for p in tiny_disk.iterdir()) == [name]  # no temporary, no 0-byte file


def test_plot_replaces_an_earlier_png_atomically_through_a_symlink(run_cli, tmp_path):
    real = tmp_path / "real.png"
    real.write_bytes(b"old")
    link = tmp_path / "link.png"
    link.symlink_to(real)
    code, out, err = run_cli("plot", PINNED, "-o", link, "--dpi", "30")
    assert code == 0, err
    assert link.is_symlink() and real.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert oct(real.stat().st_mode & 0o777) != oct(0o600)  # an ordinary file, not mkstemp's 0600


# ---- report inputs ----

def test_report_bad_inputs(run_cli, tmp_path):
    refused(run_cli, "report", PINNED, "-o", tmp_path / "r.txt", needle=r"must end in \.html")
    refused(run_cli, "report", tmp_path / "missing.json", "-o", tmp_path / "r.html", needle="does not exist")
    (tmp_path / "empty").mkdir()
    refused(run_cli, "report", tmp_path / "empty", "-o", tmp_path / "r.html", needle="no .json file")
    bad_fleet = tmp_path / "fleet.json"
    bad_fleet.write_text(json.dumps({"fleet": {"kind": "gpubench-fleet", "version": 1,
                                               "rows": [{"host": "a", "rank": 0, "flag": "meh"}]}}))
    refused(run_cli, "report", bad_fleet, "-o", tmp_path / "r.html", needle=r"fleet\.rows\[0\]\.flag is 'meh'")
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({"fleet": {"kind": "gpubench-fleet", "version": 9}}))
    refused(run_cli, "report", newer, "-o", tmp_path / "r.html", needle="fleet version 9 is newer")
    assert not (tmp_path / "r.html").exists()


def test_help_of_report_and_plot(run_cli):
    for cmd in ("plot", "report"):
        code, out, err = run_cli(cmd, "--help")
        assert code == 0 and "-o, --output" in out


@pytest.mark.skipif(shutil.which("mount") is None, reason="no mount(8)")
def test_tiny_disk_fixture_is_really_small(tiny_disk):
    with pytest.raises(OSError):
        (tiny_disk / "x").write_bytes(b"0" * 200_000)


# ---- report: saved limit flags and the conditions of a run ----

@pytest.mark.parametrize("case", list(edited.LIMIT_CASES))
def test_report_flags_a_saved_figure_beyond_its_limit(run_cli, tmp_path, case):
    src = edited.write(tmp_path, "r", edited.LIMIT_CASES[case]())
    out = str(tmp_path / "r.html")
    code, _, err = run_cli("report", src, "-o", out, "-q")
    assert code == 0, err
    text = edited.html_text(out)
    assert "Nothing flagged" not in text and "No flags" not in text, text[:600]
    assert "above peak" in text or "no-op" in text
    if case == "stale flag":  # the % of peak is the samples', not the stale saved 50%
        assert "159%" in text and " 50% " not in text

def test_report_flags_throttling_sharing_and_a_busy_gpu_from_the_conditions(run_cli, tmp_path):
    """The report's flags come from the conditions the run recorded: a power-capped, thermally
    throttled point on a shared GPU after a failed idle check is flagged throttled and shared, with
    the idle check's warning (from the file) escaped; a quiet run says "Nothing flagged"."""
    d = edited.conditions_result()
    d["records"][0]["telemetry"].update(reasons=["sw_power_cap", "hw_thermal"], other_processes=1)
    d["env"]["preflight"]["warnings"] = [f"GPU 0 is not idle: {edited.EV} {edited.HT} a|b"]
    src = edited.write(tmp_path, "capped", d)
    out = str(tmp_path / "r.html")
    code, _, err = run_cli("report", src, "-o", out, "-q")
    assert code == 0, err
    raw = Path(out).read_text()
    assert "<img src=x" not in raw and "\x1b" not in raw and "\x07" not in raw
    text = edited.html_text(out)
    assert "Nothing flagged" not in text and "No flags" not in text
    assert "throttled" in text and "GPU shared with another process" in text
    assert "before the run: GPU 0 is not idle" in text

    quiet = edited.conditions_result()  # sync_boost is not a slowdown; no other process; the GPU idle
    quiet["records"][0]["telemetry"].update(reasons=["sync_boost"], other_processes=0)
    quiet["env"]["preflight"].update(idle=True, warnings=[])
    quiet["env"]["preflight"]["gpus"][0]["busy"] = []
    code, _, err = run_cli("report", edited.write(tmp_path, "quiet", quiet), "-o", out, "-q")
    assert code == 0, err
    assert "Nothing flagged" in edited.html_text(out)


# ---- a folder holding a FIFO, a figure too small ----

def _gpubench_from_src(*args, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(DATA.parents[1] / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "gpubench", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)

def test_report_of_a_folder_holding_a_fifo_does_not_block(tmp_path):
    folder = tmp_path / "fdir"
    folder.mkdir()
    (folder / "copy.json").write_text((DATA / "copy-pinned-h200.json").read_text())
    os.mkfifo(folder / "f.json")  # opening it for reading would wait for a writer for ever
    p = _gpubench_from_src("report", folder, "-o", tmp_path / "r.html", timeout=120)
    assert p.returncode == 0, p.stderr[-800:]
    assert (tmp_path / "r.html").stat().st_size > 0

def test_plot_size_below_100_pixels_is_refused(run_cli, tmp_path):
    code, out, err = run_cli("plot", DATA / "net-local.json", "-o", tmp_path / "p.png", "--size", "0.001x0.001")
    assert code == 2 and "under 100 pixels" in err and "Traceback" not in err, err


@pytest.mark.parametrize("command,out", [("plot", "p.png"), ("report", "r.html")])
def test_plot_and_report_without_matplotlib_name_the_extra_with_exit_2(tmp_path, command, out):
    code = ("import sys\nsys.modules['matplotlib'] = None  # not installed\n"
            "from gpubench.cli.app import main\nmain(sys.argv[1:])\n")
    r = subprocess.run([sys.executable, "-c", code, command, "tests/data/copy-pinned-h200.json", "-o",
                        str(tmp_path / out)], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (f"gpubench: error: {command} needs matplotlib, which is not installed "
                                "(pip install 'gpubench-cuda[plot]')"), r.stderr
    assert not (tmp_path / out).exists()

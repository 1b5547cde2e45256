"""Cases from the break-it pass over the merged main (issue 18), each a test that failed before its fix."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data"
ROOT = Path(__file__).resolve().parents[2]


def _gpubench(*args, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "gpubench", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_a_sample_too_short_for_a_finite_rate_is_refused_naming_it(run_cli, tmp_path):
    d = json.loads((DATA / "copy-pinned-h200.json").read_text())
    d["records"][0]["samples_s"][0] = 5e-324  # nbytes / 5e-324 is inf: plot and report raised ValueError
    f = tmp_path / "tiny.json"
    f.write_text(json.dumps(d))
    for argv in (("plot", f, "-o", tmp_path / "p.png"), ("report", f, "-o", tmp_path / "r.html"),
                 ("compare", f, DATA / "copy-pinned-h200.json")):
        code, out, err = run_cli(*argv)
        assert code == 2, (argv, code, err)
        assert "/records/0/samples_s/0" in err and len(err.strip().splitlines()) == 1, err


def test_report_of_a_folder_holding_a_fifo_does_not_block(tmp_path):
    folder = tmp_path / "fdir"
    folder.mkdir()
    (folder / "copy.json").write_text((DATA / "copy-pinned-h200.json").read_text())
    os.mkfifo(folder / "f.json")  # opening it for reading would wait for a writer for ever
    p = _gpubench("report", folder, "-o", tmp_path / "r.html", timeout=120)
    assert p.returncode == 0, p.stderr[-800:]
    assert (tmp_path / "r.html").stat().st_size > 0


def test_plot_size_below_100_pixels_is_refused(run_cli, tmp_path):
    code, out, err = run_cli("plot", DATA / "net-local.json", "-o", tmp_path / "p.png", "--size", "0.001x0.001")
    assert code == 2 and "under 100 pixels" in err and "Traceback" not in err, err


# --- D8: the shared validator wants what the schema requires ----------------------------------------


def _mutated(tmp_path, name, change):
    d = json.loads((DATA / "copy-pinned-h200.json").read_text())
    change(d)
    f = tmp_path / name
    f.write_text(json.dumps(d))
    return f


def test_a_result_without_records_or_with_env_null_is_refused_by_every_loader(run_cli, tmp_path):
    """Before: a file without ``records`` read as a run that measured nothing (compare passed, plot
    drew nothing, suite --check checked nothing), ``env: null`` as {}. Now each is exit 2 naming
    the field's JSON Pointer, in every command that loads results."""
    cases = [(_mutated(tmp_path, "norecords.json", lambda d: d.pop("records")), "/records is missing"),
             (_mutated(tmp_path, "envnull.json", lambda d: d.update(env=None)), "/env is null"),
             (_mutated(tmp_path, "specnull.json", lambda d: d.update(spec=None)), "/spec is null"),
             (_mutated(tmp_path, "noextra.json", lambda d: d["records"][0].pop("extra")),
              "/records/0/extra is missing")]
    expect = tmp_path / "e.toml"
    expect.write_text('[[expect]]\ncommand = "copy"\nmin_gbps = 1\n')
    for f, needle in cases:
        for argv in (("compare", f, DATA / "copy-pinned-h200.json"), ("compare", DATA / "copy-pinned-h200.json", f),
                     ("plot", f, "-o", tmp_path / "p.png"), ("report", f, "-o", tmp_path / "r.html"),
                     ("suite", "--check", f, "--expect", expect)):
            code, out, err = run_cli(*argv)
            lines = err.strip().splitlines()
            assert code == 2 and len(lines) == 1 and f"{f.name}: {needle}" in lines[0], (argv, code, err)


# --- D9 / D10 / -d: merge's options refused before any Dask import ---------------------------------

_NO_DASK_PROBE = """
import json, sys
from gpubench.cli.app import main
try:
    main(json.loads(sys.stdin.read()))
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("distributed", "dask.dataframe", "pandas", "cupy") if m in sys.modules)
print("EXIT", code, "HEAVY", ",".join(heavy) or "-")
"""


def _probe(*argv):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", _NO_DASK_PROBE], input=json.dumps(argv), capture_output=True, text=True,
                       timeout=120, env=env)  # argv on stdin: one 600 kB argument is over the kernel's limit
    return p.stdout.strip().splitlines()[-1], p.stderr


def test_an_interface_this_host_lacks_is_refused_before_dask_is_imported():
    """D10: `merge --interface bogus0` took 10 s to refuse on a loaded host: the refusal waited for
    distributed, pandas, dask.dataframe (and CuPy through dask.array) to import."""
    pytest.importorskip("psutil")
    last, err = _probe("merge", "-t", "cpu", "--interface", "bogus0")
    assert last == "EXIT 2 HEAVY -", (last, err)
    assert "--interface 'bogus0' is not a network interface of this host" in err


@pytest.mark.parametrize("argv,needle", [
    (["-c", "١٢"], "-c/--chunk-size '١٢' is not an integer"),  # int() reads Arabic-Indic digits as 12
    (["--base-chunks", "１２"], "--base-chunks '１２' is not an integer"),
    (["--frac-match", "٠.٥"], "--frac-match '٠.٥' is not a finite number"),
    (["--scheduler-address", ""], "--scheduler-address '' is empty"),  # started a local cluster
    (["-d", ",".join(map(str, range(100_000)))], "-d/--devices names 100,000 devices"),  # 94 s
])
def test_merge_options_refused_in_one_line_before_any_work(argv, needle):
    last, err = _probe("merge", "-t", "cpu", *argv)
    assert last == "EXIT 2 HEAVY -" and needle in err and len(err.strip().splitlines()) == 1, (last, err)


def test_merge_chunk_sizes_keep_dask_cudas_digit_groups():
    from gpubench.cli.app import cli

    import click

    cmd = cli.get_command(click.Context(cli), "merge")
    ctx = cmd.make_context("merge", ["-t", "cpu", "-c", "50_000_000", "--runs", "1_0"])
    assert ctx.params["chunk_size"] == 50_000_000 and ctx.params["runs"] == 10


# --- suite -o onto a read-only mount: the output is named before the missing GPU ------------------


@pytest.mark.parametrize("sub", ["", "new/deeper"])
def test_suite_names_an_unwritable_output_before_the_gpu(run_cli, tmp_path, sub):
    """A read-only mount (or immutable folder, as root) as -o, or a folder to be made under one: one
    line naming -o, exit 2, whether or not the machine has a GPU; nothing is created."""
    sys.path.insert(0, str(DATA))
    from readonly import OLD, read_only_folder

    with read_only_folder(tmp_path) as (d, how):
        target = d / sub if sub else d
        code, out, err = run_cli("suite", "-o", str(target))
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, (how, code, err)
        assert lines[0].startswith("gpubench: error: -o ") and "cannot write there" in lines[0], lines[0]
        assert "CUDA" not in lines[0]
        assert (d / "old.json").read_text() == OLD and sorted(x.name for x in d.iterdir()) == ["old.json"]


# --- D4: net local -w 4-8KiB measures instead of ending with a killed sender ------------------------


@pytest.mark.parametrize("window", ["4KiB", "8KiB"])
@pytest.mark.parametrize("direction", [[], ["-R"]])
def test_net_local_with_a_window_of_a_few_kib_measures(run_cli, tmp_path, window, direction):
    """`net local -w 4KiB` (c2s) ended with "send worker 0 exited with -9" in 3 runs of 4, after 64 KiB
    in the first second: the server's buffer was set after the handshake (see test_net_server's
    window tests). iperf3 -w 4K moves ~2 Gbit/s on this loopback; every interval must move data."""
    out = tmp_path / "n.json"
    code, _out, err = run_cli("net", "local", "-w", window, "-t", "1", "-i", "0.5", *direction, "--json", str(out), "-q")
    assert code == 0, err
    d = json.loads(out.read_text())
    total = [r for r in d["records"] if r["params"]["stream"] == "total"][0]
    assert all(b > 2**20 for b in total["extra"]["interval_bytes"]), total["extra"]["interval_bytes"]


# --- the third break-it pass (2026-12-01, 17:30): options parsed by click's own INT/FLOAT ----------


@pytest.mark.parametrize("argv,needle", [
    (["net", "local", "-P", "٣"], "-P/--parallel '٣' is not an integer"),  # net was left out of the strict parser
    (["net", "local", "-t", "٣"], "-t/--time '٣' is not a finite number"),
    (["net", "local", "-i", "٠.٢"], "-i/--interval '٠.٢' is not a finite number"),
    (["net", "local", "-P", "inf"], "-P/--parallel 'inf' is not an integer"),  # click: "not a valid integer"
    (["net", "local", "-P", ""], "-P/--parallel '' is not an integer"),
    (["net", "server", "-1", "-p", "٣"], "-p/--port '٣' is not an integer"),  # bound port 3 and served
    (["net", "local", "-P", "\u00a04"], "-P/--parallel '\\xa04' is not an integer"),  # str.strip() ate U+00A0
    (["merge", "-t", "cpu", "-c", "\u00a05"], "-c/--chunk-size '\\xa05' is not an integer"),
    (["suite", "--check", "x.json", "--expect", "e.toml", "--node-timeout", "-1"],
     "--node-timeout -1 out of range"),
])
def test_every_numeric_option_takes_ascii_digits_only(run_cli, argv, needle):
    code, out, err = run_cli(*argv)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, (code, err)


def test_a_repeated_key_is_refused_not_read_as_the_last_value(run_cli, tmp_path):
    """`{..., "records": [...], "records": []}` loaded as an empty result (Python's json keeps the
    last value); now one line, exit 2, naming the key, in every loader."""
    good = tmp_path / "good.json"
    code, _, err = run_cli("net", "local", "-t", "0.3", "-i", "0.3", "-q", "--json", str(good))
    assert code == 0, err
    text = good.read_text().rstrip()
    assert text.endswith("}")
    bad = tmp_path / "dup.json"
    bad.write_text(text[:-1] + ', "records": []}')
    for argv in (["compare", str(bad), str(good)], ["report", str(bad), "-o", str(tmp_path / "r.html")],
                 ["plot", str(bad), "-o", str(tmp_path / "p.png")]):
        code, _, err = run_cli(*argv)
        assert code == 2 and "repeats the key 'records'" in err and len(err.strip().splitlines()) == 1, (argv, err)

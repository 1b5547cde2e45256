"""The command line as a user meets it: help, version, exit codes, one-line errors, no GPU, devices
beyond the visible ones, a missing CuPy named with its extra, the command line kept in the result."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpubench.core.registry import plugins
from gpubench.core.signals import Interrupted
from gpubench.core.gpu import gpu_available


def gb(*args, env=None, timeout=120):
    e = dict(os.environ)
    if env:
        e.update(env)
    return subprocess.run([sys.executable, "-m", "gpubench", *args], capture_output=True, text=True,
                          timeout=timeout, env=e)


def test_help_lists_every_command_and_imports_no_heavy_module():
    code = ("import sys; from gpubench.cli.app import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit as e:\n    rc = e.code\n"
            "heavy = [m for m in ('cupy', 'dask', 'distributed', 'cudf', 'ucxx', 'matplotlib', 'pynvml') if m in sys.modules]\n"
            "print('HEAVY', heavy, 'RC', rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    for name in plugins():
        assert name in out
    assert "HEAVY [] RC 0" in out


@pytest.mark.parametrize("name", list(plugins()))
def test_each_command_help(name):
    r = gb(name, "--help")
    assert r.returncode == 0, r.stderr
    assert "Usage:" in r.stdout
    assert "Traceback" not in r.stderr


def test_version():
    from gpubench import __version__

    r = gb("--version")
    assert r.returncode == 0 and __version__ in r.stdout


def test_unknown_command_one_line():
    r = gb("nosuch")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "nosuch" in r.stderr


BAD = [
    (["-b", "0"], "at least 1 byte"),
    (["-b", "-5"], "-5"),
    (["-b", "12xb"], "12xb"),
    (["-b", "1G", "-e", "1M"], "larger than max"),
    (["-f", "1"], "-f/--step-factor 1 must be > 1"),
    (["-f", "1e400"], "-f/--step-factor 1e400 is too large (at most 9.22337e+18)"),
    (["-f", "1e19"], "-f/--step-factor 1e+19 is too large (at most 9.22337e+18)"),
    (["-f", "abc"], "abc"),
    (["-d", "0,0"], "repeated"),
    (["-d", "-1"], "negative"),
    (["-d", "x"], "not an integer"),
    (["-m", "gold"], "gold"),
    (["--direction", "up"], "up"),
    (["-n", "0"], "-n/--iters"),
    (["--pinned", "-m", "pageable"], "both given"),
    (["--units", "MB"], "MB"),
    (["--json", "/nonexistent-dir/x.json"], "does not exist"),
]


@pytest.mark.parametrize("args,needle", BAD)
def test_copy_bad_input_is_one_line_exit_2(args, needle):
    r = gb("copy", *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert needle in lines[0]
    assert "Traceback" not in r.stderr


@pytest.mark.skipif(gpu_available(), reason="a GPU is visible")
def test_copy_without_gpu_one_line():
    r = gb("copy", "--pinned")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "no CUDA device is visible" in lines[0] and "env" in lines[0]


def test_copy_device_hidden_by_cuda_visible_devices():
    """An empty CUDA_VISIBLE_DEVICES hides every GPU: the same one line, exit 2."""
    r = gb("copy", "-d", "0", env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1
    assert "no CUDA device is visible" in r.stderr


def test_env_prints_and_saves(tmp_path):
    out = tmp_path / "env.json"
    r = gb("env", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "Host" in r.stdout
    if not gpu_available():
        assert "No CUDA device is visible" in r.stdout
    data = json.loads(out.read_text())
    assert data["command"] == "env" and data["env"]["host"]["hostname"]


def test_env_quiet_prints_nothing():
    r = gb("env", "-q")
    assert r.returncode == 0 and r.stdout == ""


def test_debug_shows_traceback_and_keeps_exit_code():
    r = gb("copy", "-b", "0", "--debug")
    assert r.returncode == 2
    assert "Traceback" in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("gpubench: error: -b/--min-bytes")


@pytest.mark.parametrize("args", [["-n", "10" * 40], ["-w", "2000000"]])
def test_absurd_repeat_counts_are_refused(args):
    r = gb("copy", *args)
    assert r.returncode == 2 and "too large" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("signum,exc", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Interrupted)])
def test_a_signal_inside_a_critical_section_is_raised_when_it_ends(signum, exc):
    """Every rank's launch of one iteration (or CUDA graph) happens, or none: the CLI's handlers
    defer a signal that arrives in between until the section ends."""
    from gpubench.core import signals
    from gpubench.core.signals import CRITICAL, clear_signals

    old_int, old_term = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, signals.on_signal)
    signal.signal(signal.SIGTERM, signals.on_signal)
    clear_signals()
    done = []
    try:
        with pytest.raises(exc):
            with CRITICAL:
                with CRITICAL:  # nested: raised only when the outer one ends
                    os.kill(os.getpid(), signum)
                    time.sleep(0.05)  # the handler runs here
                    done.append("inner")
                done.append("outer")
        assert done == ["inner", "outer"]
        clear_signals()
        with pytest.raises(exc):  # outside a section: at once
            os.kill(os.getpid(), signum)
            time.sleep(0.05)
            done.append("never")
        assert "never" not in done
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
        clear_signals()


def test_a_critical_section_in_another_thread_does_not_delay_the_main_threads_ctrl_c():
    import threading

    from gpubench.core import signals
    from gpubench.core.signals import CRITICAL, clear_signals

    old_int = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signals.on_signal)
    clear_signals()
    inside, leave = threading.Event(), threading.Event()

    def hold():
        with CRITICAL:
            inside.set()
            leave.wait(5)

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    try:
        assert inside.wait(5)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # raised here, in the main thread, at once
    finally:
        leave.set()
        t.join(5)
        signal.signal(signal.SIGINT, old_int)
        clear_signals()


# ---- devices beyond the visible ones, a missing CuPy, the saved command line ----

NO_GPU = "no CUDA device is visible"


def _one_error_line(err: str) -> str:
    """The single stderr line of an error (fails when there are more, or a traceback)."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gpubench") and ": error: " in lines[0], err
    return lines[0]


def _refused_matching(run_cli, *argv, needle: str) -> str:
    """Exit 2 with one error line matching the regular expression ``needle``."""
    code, out, err = run_cli(*argv)
    assert code == 2, (argv, code, out, err)
    line = _one_error_line(err)
    assert re.search(needle, line), (needle, line)
    return line


def _gb_from_src(*args, env=None, timeout=60, preexec_fn=None, cwd=None):
    """``python -m gpubench`` in a fresh process, this checkout's src/ first on PYTHONPATH (so it also
    runs from another cwd)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2] / "src"),
                                                    e.get("PYTHONPATH")]))
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "gpubench", *args], capture_output=True, text=True,
                          timeout=timeout, env=e, preexec_fn=preexec_fn, cwd=cwd)


@pytest.mark.parametrize("argv", [
    ["copy", "-d", "0,63"], ["p2p", "-d", "0,63"], ["nccl", "-d", "0,63", "-b", "1K", "-e", "1K"],
    ["batch", "-d", "63"], ["memcpy2d", "-d", "63"], ["overlap", "-d", "63"], ["merge", "-d", "63"],
])
def test_more_devices_than_visible(run_cli, argv):
    if argv[0] == "merge":
        pytest.importorskip("distributed")  # without it merge stops at the missing extra first
    _refused_matching(run_cli, *argv, needle=f"{NO_GPU}|not visible")

@pytest.mark.parametrize("argv", [["batch"], ["memcpy2d"], ["overlap"], ["merge", "-d", "0"], ["suite", "-o", "."]])
def test_cuda_visible_devices_hiding_the_device(argv, tmp_path):
    p = _gb_from_src(*argv, env={"CUDA_VISIBLE_DEVICES": ""}, cwd=tmp_path)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert NO_GPU in _one_error_line(p.stderr)
    assert list(tmp_path.iterdir()) == []  # nothing saved

_WITHOUT_CUPY = ("import sys\nsys.modules['cupy'] = None\nsys.modules['cupy.cuda'] = None\n"
                 "from gpubench.cli.app import main\nmain(sys.argv[1:])\n")

@pytest.mark.parametrize("name", ["copy", "p2p", "nccl", "batch", "memcpy2d", "overlap"])
def test_a_missing_cupy_is_a_setup_error_naming_the_extra(name):
    p = subprocess.run([sys.executable, "-c", _WITHOUT_CUPY, name], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")})
    assert p.returncode == 2, p.stderr
    assert "CuPy is not importable" in _one_error_line(p.stderr) and "gpubench-cuda[cuda13]" in p.stderr

def test_saved_results_keep_the_command_line(tmp_path):
    out = tmp_path / "n.json"
    p = _gb_from_src("net", "local", "-t", "1", "-P", "1", "--json", str(out), timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text())["argv"] == ["net", "local", "-t", "1", "-P", "1", "--json", str(out)]


def test_a_mistyped_command_gets_the_closest_names_and_exit_2():
    r = gb("cpoy")
    assert r.returncode == 2 and r.stderr.strip() == "gpubench: error: No such command 'cpoy'. Did you mean 'copy'?"
    r = gb("x\x1b[2J")
    assert r.returncode == 2 and "\x1b" not in r.stderr and "Did you mean" not in r.stderr


def test_debug_is_the_parsed_flag_not_a_word_of_the_command_line():
    """`--debug` given as another option's value (`suite --expect --debug` names a file) shows no
    traceback: one line, exit 2; the flag itself is eager, so it also shows the traceback of an
    option that fails to parse before it on the line."""
    r = gb("suite", "--expect", "--debug")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == ["gpubench: error: cannot read --debug: No such file or directory"]
    r = gb("copy", "-n", "x", "--debug")
    assert r.returncode == 2 and "Traceback" in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("gpubench: error: -n/--iters 'x' is not an integer")

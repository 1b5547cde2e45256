"""The command line as a user meets it: help, version, exit codes, one-line errors, no GPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

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
    (["-f", "1"], "greater than 1"),
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

"""SIGINT / SIGTERM at any moment from gpubench's first statement on, through both entry points: the
installed ``gpubench`` console script (``gpubench.cli:main``) and ``python -m gpubench``. Each ends
with exit 130 / 143 and one line on stderr, never a traceback, never exit 0.

The signal is sent 0 to 0.8 s after the child says it holds the signals (``GPUBENCH_STARTED_FD``:
gpubench.cli.main writes a byte to that pipe right after its first statements), so a signal can
land in the import of the command line, the option parsing, the start of the run and the run
itself; what comes before (the interpreter's start-up: ``site`` and site-packages' ``.pth`` files,
about 30 ms here, 10 without rapids-dask-dependency's ``.pth``) runs no gpubench code and is not what
this tests. Also: an ignored SIGINT stays ignored; an interrupt inside exec-compiled code still exits
130 under ``-m``; an interrupt some library swallows still ends the run with 130, never 0. ``net local -t 3`` cannot end
within the window (a 3 s test on loopback after the connection), so exit 0 always means the
interrupt was lost.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpubench.cli import STARTED_FD

SCRIPT = Path(sys.executable).with_name("gpubench")  # the console script installed beside this Python
# seconds after the child said it is guarded: one delay drawn anew each run from each span (the
# import of the command line, the option parsing and the start of the run, the run itself)
DELAY_SPANS = ((0.0, 0.05), (0.05, 0.3), (0.3, 0.8))
RUN = ("net", "local", "-t", "3")
# the line of an interrupt that kept nothing, or of one that kept what was measured (kit.finish)
LINE = {signal.SIGINT: r"gpubench: interrupted by SIGINT(; kept what was measured: .*)?",
        signal.SIGTERM: r"gpubench: interrupted by SIGTERM(; kept what was measured: .*)?"}


def _entry(name: str) -> list[str]:
    if name == "console script":
        if not SCRIPT.exists():
            pytest.skip(f"no console script at {SCRIPT} (gpubench is not installed in this environment)")
        return [str(SCRIPT)]
    return [sys.executable, "-m", "gpubench"]


def _default_sigint() -> None:
    """In the child before exec: SIGINT back to its default action (a test run in the background
    inherits it ignored, and gpubench leaves an ignored SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _ignored_sigint() -> None:
    """In the child before exec: SIGINT ignored, as a shell starts a background job (``cmd &``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _signalled(argv: list[str], sig: int, delay: float, *, preexec=_default_sigint,
               then: int | None = None) -> tuple[int, str]:
    """Start ``argv``, wait for its byte on the start pipe, wait ``delay`` s, send ``sig`` (and,
    with ``then``, 0.5 s later, once it is seen still running, ``then``): (exit code, stderr)."""
    r, w = os.pipe()
    try:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, pass_fds=(w,), env={**os.environ, STARTED_FD: str(w)},
                             preexec_fn=preexec, start_new_session=True)
    finally:
        os.close(w)
    try:
        with os.fdopen(r, "rb", buffering=0) as started:
            ready = select.select([started], [], [], 30)[0]  # a loaded 2-core host: up to ~2 s
            said = started.read(1) if ready else b""
        assert said == b"\n", f"{argv} did not say it was guarded (exit code {p.poll()})"
        if delay:
            select.select([], [], [], delay)
        assert p.poll() is None, f"{argv} ended {delay} s in, before the signal (exit code {p.returncode})"
        p.send_signal(sig)
        if then is not None:
            select.select([], [], [], 0.5)
            assert p.poll() is None, f"{argv} ended of {signal.Signals(sig).name} (exit code {p.returncode})"
            p.send_signal(then)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
    return p.returncode, err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("entry", ["console script", "python -m"])
def test_a_signal_at_any_moment_after_the_first_statement_exits_128_plus_it_with_one_line(entry, sig, sampled):
    argv = _entry(entry) + list(RUN)
    seen = []
    for delay in [round(sampled.uniform(lo, hi), 3) for lo, hi in DELAY_SPANS]:
        code, err = _signalled(argv, sig, delay)
        lines = err.strip().splitlines()
        seen.append((delay, code, lines))
        assert code == 128 + sig, (entry, delay, code, err)
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, (entry, delay, err)
        assert len(lines) == 1 and re.fullmatch(LINE[sig], lines[0]), (entry, delay, err)
    print(entry, signal.Signals(sig).name, seen)


def test_the_entry_point_imports_nothing_heavy_before_its_guard():
    """The console script runs ``from gpubench.cli import main`` before anything: that import is
    gpubench's two smallest modules (no click, no rich, no command line), so the guard in main()
    runs before any import that takes time. python -m gpubench calls the same main."""
    from importlib import metadata

    (ep,) = [e for e in metadata.entry_points(group="console_scripts") if e.name == "gpubench"]
    assert ep.value == "gpubench.cli:main"
    code = ("import sys; import gpubench.cli as c; "
            "print(sorted(m for m in sys.modules if m.startswith(('gpubench', 'click', 'rich'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['gpubench', 'gpubench.cli']", out


@pytest.mark.parametrize("entry", ["console script", "python -m"])
def test_an_ignored_sigint_stays_ignored(entry):
    """Started with SIGINT ignored (a shell's background job): a SIGINT at any moment changes
    nothing; the SIGTERM 0.5 s later ends the run (143), so the SIGINT was not acted on."""
    argv = _entry(entry) + list(RUN)
    for delay in (0.0, 0.2):
        code, err = _signalled(argv, signal.SIGINT, delay, preexec=_ignored_sigint, then=signal.SIGTERM)
        assert code == 143, (entry, delay, code, err)
        assert re.fullmatch(LINE[signal.SIGTERM], err.strip()), (entry, delay, err)


# Run before anything else (PYTHONPATH): the first command the group loads raises KeyboardInterrupt
# from code compiled from a string, as a Ctrl-C landing while a dataclass or namedtuple builds its
# methods (exec) does. That sets CPython's "unhandled KeyboardInterrupt" flag even though gpubench
# catches it, and under -m Py_RunMain then ends the process by SIGINT instead of with exit 130
# unless gpubench.cli.main resets the flag (its ``exec("pass")``).
_EXEC_INTERRUPT = """
import gpubench.core.registry as registry

def load_command(name):
    exec("raise KeyboardInterrupt")

registry.load_command = load_command
"""


@pytest.mark.parametrize("entry", ["console script", "python -m"])
def test_an_interrupt_inside_exec_compiled_code_still_exits_130(entry, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(_EXEC_INTERRUPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run(_entry(entry) + list(RUN), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       env=env, timeout=60, preexec_fn=_default_sigint)
    assert p.returncode == 130, (entry, p.returncode, p.stderr)
    assert p.stderr.splitlines() == ["gpubench: interrupted by SIGINT"], p.stderr


# Run before anything else (PYTHONPATH): listing the commands (--help) takes a real SIGINT, which a
# library's ``except BaseException`` swallows.
_SWALLOWED = """
import os, signal
import gpubench.core.registry as registry

plugins = registry.plugins

def swallowing():
    try:
        os.kill(os.getpid(), signal.SIGINT)  # its handler runs (and raises) before the next line
        for _ in range(1000):
            pass
    except BaseException:
        pass
    return plugins()

registry.plugins = swallowing
"""


def test_an_interrupt_swallowed_on_its_way_still_ends_the_run_with_130(tmp_path):
    """A SIGINT that some library's ``except BaseException`` swallows while the command runs: the
    command completes, but the exit code is 130 with the one line, never 0."""
    (tmp_path / "sitecustomize.py").write_text(_SWALLOWED)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run(_entry("console script") + ["--help"], stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, env=env, timeout=60, preexec_fn=_default_sigint)
    assert "Commands" in p.stdout, p.stdout  # the swallowed interrupt let --help finish
    assert p.returncode == 130, (p.returncode, p.stderr)
    assert p.stderr.splitlines() == ["gpubench: interrupted by SIGINT"], p.stderr

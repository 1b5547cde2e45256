"""Issue 18, item 8: --json targets that are not regular files are refused before the run, exit 2,
one line: device nodes (``mknod mynull c 1 3``; /dev/null, which as root an atomic save would
replace), FIFOs, sockets, each also through a symbolic link; file-descriptor links (/dev/stdout,
/dev/fd/1, /proc/self/fd/1), whose rename would replace whatever file the descriptor has open.
``--json -`` stays stdout; with stdout closed it is one clean line. Every check is
core.result.check_output_target (plot's -o and suite's -o use the same).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpubench.core.errors import MachineError, UsageError
from gpubench.core.result import Result, check_output_target, save

SRC = str(Path(__file__).resolve().parents[2] / "src")


def gb(*args, cwd=None, **kw):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "gpubench", *args], capture_output=True, text=True, timeout=60,
                          env=env, cwd=cwd, **kw)


def one_line(err: str) -> str:
    assert "Traceback" not in err and "run with --debug" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpubench: error: "), err
    return lines[0]


def _targets(d: Path) -> dict[str, tuple[Path, str]]:
    """name -> (path, what the line says it is)."""
    out = {}
    try:
        os.mknod(d / "mynull", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        out["mknod"] = (d / "mynull", "a character device")
        (d / "link-mynull").symlink_to(d / "mynull")
        out["link to mknod"] = (d / "link-mynull", "a character device (through the link")
    except PermissionError:
        pass  # not root: /dev/null below still covers a device
    os.mkfifo(d / "fifo")
    out["fifo"] = (d / "fifo", "a named pipe (FIFO)")
    (d / "link-fifo").symlink_to(d / "fifo")
    out["link to fifo"] = (d / "link-fifo", "a named pipe (FIFO) (through the link")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(d / "sock"))
    s.close()
    out["socket"] = (d / "sock", "a socket")
    (d / "link-sock").symlink_to(d / "sock")
    out["link to socket"] = (d / "link-sock", "a socket (through the link")
    out["/dev/null"] = (Path("/dev/null"), "a character device")
    (d / "link-null").symlink_to("/dev/null")
    out["link to /dev/null"] = (d / "link-null", "a character device (through the link to /dev/null)")
    (d / "link-link-null").symlink_to(d / "link-null")
    out["link to link to /dev/null"] = (d / "link-link-null", "a character device (through the link")
    for fd in ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"):
        out[fd] = (Path(fd), "is a file-descriptor link")
    (d / "link-stdout").symlink_to("/dev/stdout")
    out["link to /dev/stdout"] = (d / "link-stdout", "is a file-descriptor link")
    return out


def _snapshot(p: Path):
    st = os.lstat(p)
    return (st.st_mode, st.st_ino, st.st_rdev)


def test_every_non_regular_target_is_refused_by_check_output_target(tmp_path):
    for name, (p, says) in _targets(tmp_path).items():
        with pytest.raises(UsageError, match="") as e:
            check_output_target(p, "--json")
        assert says in e.value.one_line(), (name, e.value.one_line())
        with pytest.raises(UsageError) as e:
            check_output_target(p, "-o")
        assert e.value.one_line().startswith(f"-o '{p}'"), e.value.one_line()


def test_env_json_onto_non_regular_targets_is_exit_2_and_leaves_them(tmp_path):
    # a log file as stdout: /dev/stdout resolved to it and the save replaced the log
    log = tmp_path / "log.txt"
    for name, (p, says) in _targets(tmp_path).items():
        before = _snapshot(p) if not str(p).startswith(("/dev/fd", "/proc", "/dev/stdout")) else None
        with open(log, "w") as out:
            r = subprocess.run([sys.executable, "-m", "gpubench", "env", "--json", str(p)], stdout=out,
                               stderr=subprocess.PIPE, text=True, timeout=60,
                               env={**os.environ, "PYTHONPATH": SRC})
        assert r.returncode == 2, (name, r.stderr)
        assert says in one_line(r.stderr), (name, r.stderr)
        if before is not None:
            assert _snapshot(p) == before, name  # not replaced by a regular file
        assert log.read_text() == "", name  # refused before the run: no report, the log kept
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_target_that_becomes_a_device_during_the_run_is_not_replaced(tmp_path):
    target = tmp_path / "r.json"
    check_output_target(target)  # fine before the run
    os.mkfifo(target)  # ... then something put a FIFO there
    with pytest.raises(MachineError, match="became a device, pipe, socket or folder"):
        save(Result(command="env", spec={}), target)
    assert stat.S_ISFIFO(os.lstat(target).st_mode)


def test_json_dash_is_still_stdout(tmp_path):
    r = gb("env", "--json", "-", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["command"] == "env"
    assert list(tmp_path.iterdir()) == []


def test_env_json_dash_with_stdout_closed_is_one_clean_line(tmp_path):
    p = subprocess.run(["bash", "-c", f'"{sys.executable}" -m gpubench env --json - >&-'], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "PYTHONPATH": SRC}, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert "--json -: standard output is closed" in one_line(p.stderr)
    # without --json -, a closed stdout just discards the report
    p = subprocess.run(["bash", "-c", f'"{sys.executable}" -m gpubench env >&-'], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHONPATH": SRC}, cwd=tmp_path)
    assert p.returncode == 0 and p.stderr == "", p.stderr

"""--json targets that are not regular files are refused before the run, exit 2,
one line: device nodes (``mknod mynull c 1 3``; /dev/null, which as root an atomic save would
replace), FIFOs, sockets, each also through a symbolic link; file-descriptor links (/dev/stdout,
/dev/fd/1, /proc/self/fd/1), whose rename would replace whatever file the descriptor has open.
``--json -`` stays stdout; with stdout closed it is one clean line. Every check is
core.result.check_output_target (plot's -o and suite's -o use the same).

Also refused before the run: a folder that does not exist, a file used as a folder, a read-only
target (the earlier file kept), a name too long for the save's temporary name; a full disk is
exit 3 with the earlier file whole; a symbolic link keeps the link and replaces its target.
"""

from __future__ import annotations

import json
import os
import re
import resource
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpubench.core.errors import MachineError, UsageError
from gpubench.core.result import Result, check_output_target, save

SRC = str(Path(__file__).resolve().parents[2] / "src")


def gb(*args, cwd=None, extra_env=None, **kw):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")])),
           **(extra_env or {})}
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


# ---- --json: a missing folder, a file as folder, a read-only target, a full disk, long names, links ----

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from readonly import OLD, read_only_folder  # noqa: E402


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


@pytest.mark.parametrize("argv", [["env"], ["net", "local", "-t", "0.1"]])
def test_json_into_a_missing_folder_is_refused_before_the_run(run_cli, tmp_path, argv):
    target = tmp_path / "no-such-folder" / "r.json"
    _refused_matching(run_cli, *argv, "--json", str(target), needle="no-such-folder.* does not exist")
    assert not target.parent.exists()

@pytest.mark.parametrize("argv", [["env"], ["net", "local", "-t", "0.1"]])
@pytest.mark.parametrize("name", ["newdir/", "newdir/..", "."])
def test_json_naming_a_folder_with_a_trailing_slash_is_refused_and_nothing_is_written(run_cli, tmp_path, argv, name):
    target = f"{tmp_path}/{name}"
    code, out, err = run_cli(*argv, "--json", target)
    assert code == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "newdir").exists() and list(tmp_path.iterdir()) == []


def test_json_inside_a_file_is_refused_and_the_file_kept(run_cli, tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("keep me")
    _refused_matching(run_cli, "env", "--json", str(f / "r.json"), needle="notes.txt")
    assert f.read_text() == "keep me"

@pytest.mark.parametrize("name", ["old.json", "new.json"])
def test_json_onto_a_read_only_target(run_cli, tmp_path, name):
    # as root too: a read-only mount or the immutable attribute (tests/data/readonly.py); refused
    # before the run (net local would run its 30 s first), the earlier file kept
    with read_only_folder(tmp_path) as (d, how):
        target = d / name
        for argv in (["env"], ["net", "local", "-t", "30"]):
            code, out, err = run_cli(*argv, "--json", str(target))
            assert code == 2, (how, code, out, err)
            line = _one_error_line(err)
            assert str(target) in line and ("cannot be written" in line or "cannot write there" in line), line
        assert (d / "old.json").read_text() == OLD
        assert sorted(x.name for x in d.iterdir()) == ["old.json"]

def _small_file_limit():
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.RLIM_INFINITY))

def test_full_disk_keeps_the_earlier_file_intact(tmp_path):
    # RLIMIT_FSIZE makes every write past 1 KiB fail with EFBIG, as a full disk fails with ENOSPC
    # (CPython ignores SIGXFSZ, so the write returns the error instead of killing the process)
    old = tmp_path / "env.json"
    before = json.dumps({"earlier": "result"})
    old.write_text(before)
    # no bytecode written under the limit: a .pyc is cut at 1 KiB without an error (importlib's
    # _write_atomic does not check a short write), and every later process would fail to import it
    p = gb("env", "--json", str(old), preexec_fn=_small_file_limit, extra_env={"PYTHONDONTWRITEBYTECODE": "1"})
    assert p.returncode == 3, (p.stdout, p.stderr)
    line = _one_error_line(p.stderr)
    assert "could not save" in line and "env.json" in line
    assert old.read_text() == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["env.json"]  # no temporary file left

@pytest.mark.parametrize("target", ["", "/sys/gpubench-x.json", "/proc/gpubench-x.json"])
def test_json_targets_that_cannot_be_written_are_refused_before_the_run(run_cli, target):
    # refused before net local runs its -t seconds
    code, _out, err = run_cli("net", "local", "-t", "30", "--json", target)
    assert code == 2, err
    assert "--json" in _one_error_line(err)

def test_json_names_near_the_limit_save_and_over_it_are_refused_before_the_run(run_cli, tmp_path):
    near = tmp_path / ("a" * 245 + ".json")  # 250 bytes: the save's temporary name must still fit
    code, _out, err = run_cli("env", "--json", str(near))
    assert code == 0, err
    assert json.loads(near.read_text())["command"] == "env"
    code, _out, err = run_cli("net", "local", "-t", "30", "--json", str(tmp_path / ("b" * 300)))
    assert code == 2 and "file name is 300 bytes" in _one_error_line(err)

def test_json_through_a_symlink_replaces_its_target_and_keeps_the_link(run_cli, tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    code, _out, err = run_cli("env", "--json", str(link))
    assert code == 0, err
    assert link.is_symlink() and json.loads(target.read_text())["command"] == "env"


# ---- the line that says where a file was written shows the path as data ----

HOSTILE_NAME = "j\x1b[31mx[bold]\nFAKE"


@pytest.mark.parametrize("argv,verb", [
    (["env", "--json", HOSTILE_NAME + ".json"], "saved"),
    (["report", "-o", HOSTILE_NAME + ".html", "tests/data/copy-pinned-h200.json"], "wrote"),
    (["plot", "-o", HOSTILE_NAME + ".png", "tests/data/copy-pinned-h200.json"], "wrote"),
])
def test_the_saved_line_shows_control_characters_and_markup_of_a_path_escaped(tmp_path, argv, verb):
    if argv[0] == "plot":
        pytest.importorskip("matplotlib")
    data = str(Path(SRC).parent / "tests" / "data" / "copy-pinned-h200.json")
    argv = [data if a == "tests/data/copy-pinned-h200.json" else a for a in argv]
    r = gb(*argv, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    said = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith(verb + " ")]
    assert said == [f"{verb} j\\x1b[31mx[bold]\\nFAKE{Path(argv[2]).suffix}"], (r.stdout, r.stderr)
    assert "\x1b" not in r.stdout + r.stderr and "FAKE" not in "".join(
        line for line in (r.stdout + r.stderr).splitlines() if not line.startswith(verb + " "))
    assert (tmp_path / argv[2]).exists()  # the file itself has the name asked for


@pytest.mark.parametrize("argv", [
    ["compare", "tests/data/copy-all-h200.json", "tests/data/copy-all-h200.json"],
    ["compare", "tests/data/copy-all-h200.json", "tests/data/copy-all-h200.json", "--format", "markdown"],
    ["env"],
])
def test_a_report_into_a_pipe_closed_by_its_reader_is_one_line_exit_3_not_1(argv):
    """`gpubench compare ... | head -1`: the reader goes before the report is written; that is the
    broken pipe of a write fault (exit 3, one line), never exit 1, which says a regression."""
    root = Path(SRC).parent
    p = subprocess.Popen([sys.executable, "-m", "gpubench", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=root, env={**os.environ, "PYTHONPATH": SRC})
    p.stdout.close()  # the reader is gone before a line is written
    err = p.stderr.read()
    assert p.wait(timeout=60) == 3, err
    assert one_line(err) == "gpubench: error: could not write the report to standard output: Broken pipe"


def test_a_measured_result_is_saved_when_the_reports_reader_is_gone(tmp_path):
    """`gpubench net local --json r.json | head -1`: the live lines and the report go nowhere once
    the reader left, the run goes on and its result is saved whole; exit 3 says the report was lost."""
    out = tmp_path / "r.json"
    p = subprocess.Popen([sys.executable, "-m", "gpubench", "net", "local", "-t", "1", "-i", "0.5", "--json", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": SRC})
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=60) == 3, err
    assert one_line(err) == "gpubench: error: could not write the report to standard output: Broken pipe"
    from gpubench.core.result import load

    r = load(out)
    assert not r.partial and any(rec.samples_s for rec in r.records)


def test_json_to_stdout_is_whole_when_the_reports_reader_on_stderr_is_gone():
    """`--json -` sends the report to stderr: with stderr's reader gone, the JSON on stdout is still
    written whole (the lost stream, not stdout, is the one sent to /dev/null)."""
    p = subprocess.Popen([sys.executable, "-m", "gpubench", "net", "local", "-t", "1", "-i", "0.5", "--json", "-"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": SRC})
    p.stderr.close()
    out = p.stdout.read()
    assert p.wait(timeout=60) == 3
    d = json.loads(out)
    assert d["partial"] is False and any(r["samples_s"] for r in d["records"])


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
@pytest.mark.parametrize("argv", [
    ["compare", "tests/data/merge-cpu.json", "tests/data/merge-cpu.json"],  # rich's table
    ["compare", "tests/data/merge-cpu.json", "tests/data/merge-cpu.json", "--format", "markdown"],  # click.echo
    ["env"],
])
def test_a_report_onto_a_full_stdout_is_one_line_naming_it_exit_3(argv):
    """A report that meets a full disk (or a broken pipe) behind stdout is a machine fault named in
    one line, not a bare OSError."""
    root = Path(SRC).parent
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "gpubench", *argv], stdout=full, stderr=subprocess.PIPE, text=True,
                           timeout=60, cwd=root, env={**os.environ, "PYTHONPATH": SRC})
    assert r.returncode == 3, r.stderr
    assert one_line(r.stderr) == ("gpubench: error: could not write the report to standard output: "
                                  "No space left on device")

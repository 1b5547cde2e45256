"""``--json -``: the result on stdout (for jq and pipes), the human report on stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _gpubench(*args, cwd):
    return subprocess.run([sys.executable, "-m", "gpubench", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env={**os.environ, "PYTHONPATH": SRC})


def test_env_json_dash_is_json_on_stdout_and_the_report_on_stderr(tmp_path):
    p = _gpubench("env", "--json", "-", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)  # nothing but the JSON on stdout
    assert data["schema"] == "gpubench.result" and data["command"] == "env"
    assert "host" in data["env"] and "driver_check" in data["env"]["cuda"]
    assert "Host" in p.stderr and "Supported" in p.stderr  # the report moved to stderr
    assert not (tmp_path / "-").exists()  # no file named "-"
    assert "saved" not in p.stderr


def test_json_dash_pipes_into_python_json_tool(tmp_path):
    env = {**os.environ, "PYTHONPATH": SRC}
    gb = subprocess.Popen([sys.executable, "-m", "gpubench", "env", "--json", "-"], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, cwd=tmp_path, env=env)
    tool = subprocess.run([sys.executable, "-m", "json.tool"], stdin=gb.stdout, capture_output=True, text=True,
                          timeout=120)
    gb.stdout.close()
    assert gb.wait(timeout=120) == 0 and tool.returncode == 0, tool.stderr
    assert '"command": "env"' in tool.stdout


def test_a_measurement_with_json_dash_in_process(run_cli):
    code, out, err = run_cli("net", "local", "-P", "2", "-t", "0.6", "-O", "0.2", "-i", "0.3", "--json", "-")
    assert code == 0, err
    data = json.loads(out)
    assert data["command"] == "net" and data["records"] and all(r["samples_s"] for r in data["records"])
    assert "net" in err.lower() and "saved" not in err


def test_quiet_json_dash_prints_only_the_json(run_cli):
    code, out, err = run_cli("env", "-q", "--json", "-")
    assert code == 0 and err == ""
    assert json.loads(out)["command"] == "env"


def test_report_goes_back_to_stdout_after_a_json_dash_run(run_cli):
    run_cli("env", "--json", "-")
    code, out, err = run_cli("env")
    assert code == 0 and "Host" in out and "Host" not in err


def test_a_file_named_dash_is_still_writable_as_dot_slash(tmp_path, monkeypatch, run_cli):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli("env", "--json", "./-")
    assert code == 0, err
    assert json.loads((tmp_path / "-").read_text())["command"] == "env"
    assert "Host" in out and "saved ./-" in out


def test_json_to_a_device_or_a_fifo_is_refused_and_left_alone(run_cli, tmp_path):
    """An atomic save renames over its target: a device node or a FIFO named by --json would be
    replaced by a regular file (as root, /dev/full was). Such a target is refused before the run."""
    import os
    import stat

    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    for target, kind in ((str(fifo), "a named pipe (FIFO)"), ("/dev/null", "a character device")):
        code, out, err = run_cli("env", "-q", "--json", target)
        assert code == 2 and err.strip().splitlines() == [
            f"gpubench: error: --json {target!r} is {kind}: a save would replace it "
            "(give a regular file's name, e.g. out.json, or --json - for stdout)"], err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and stat.S_ISCHR(os.stat("/dev/null").st_mode)

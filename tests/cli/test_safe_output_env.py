"""In env: strings the environment report shows come from the machine and from
files (the hostname, /proc/cpuinfo's model name, GPU names and bus ids from NVML, driver strings,
errors) and are shown inert: no ANSI, OSC 8, CR/LF or rich markup reaches the terminal.

One test sets a real hostname holding the payloads in a new UTS namespace (``unshare -u``, root);
the others hand the report an environment with a payload in every string field.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PAYLOADS = {
    "ansi-clear": "\x1b[2J",
    "ansi-colour": "\x1b[31mRED",
    "osc8": "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\",
    "cr": "fake\rline",
    "lf": "x\nNVIDIA driver   999",
    "markup-bold": "[bold red]LOUD[/bold red]",
    "markup-link": "[link=http://evil.example/]click[/link]",
    "markup-close": "[/]",
}
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _env_with(payload: str) -> dict:
    from gpubench.core import env as envmod

    env = envmod.capture()
    for k in ("hostname", "os", "cpu_model", "python"):
        env["host"][k] = payload
    env["versions"][payload] = payload
    env["cuda"]["driver_version"] = payload
    env["cuda"]["error"] = payload
    env["nvml"]["driver_version"] = payload
    env["gpus"] = [{"index": i, "name": payload, "pci_bus_id": payload, "cpu_affinity": payload,
                    "memory_total_bytes": 2**30, "memory_free_bytes": 2**29, "numa_node": 0,
                    "nvlink_links_up": 0} for i in range(2)]
    env["topology"] = {"0,1": payload}
    return env


@pytest.mark.parametrize("name", list(PAYLOADS))
def test_env_report_shows_every_field_inert(run_cli, monkeypatch, name):
    from gpubench.core import env as envmod

    payload = PAYLOADS[name]
    fake = _env_with(payload)
    monkeypatch.setattr(envmod, "capture", lambda *a, **k: fake)
    code, out, err = run_cli("env")
    assert code == 0, err
    assert "\x1b" not in out and "\r" not in out, repr(out[:400])
    assert "NVIDIA driver   999" not in out.splitlines()
    if name.startswith("markup"):
        assert payload in out  # as written: not interpreted ([/] raised MarkupError, exit 3)


def test_a_real_hostname_with_payloads_is_shown_inert():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to set a hostname in a new UTS namespace")
    host = "a\x1b[31mX\x1b]8;;http://e/\x1b\\[bold]y[/]\rz"
    code = ("import socket, sys; socket.sethostname(sys.argv[1]); "
            "from gpubench.cli.app import main; main(['env'])")
    p = subprocess.run(["unshare", "-u", sys.executable, "-c", code, host], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHONPATH": SRC})
    if p.returncode != 0 and "Operation not permitted" in p.stderr:
        pytest.skip("unshare -u is not permitted here")
    assert p.returncode == 0, p.stderr
    assert "\x1b" not in p.stdout and "\r" not in p.stdout
    assert "a\\x1b[31mX\\x1b]8;;http://e/\\x1b\\[bold]y[/]\\rz" in p.stdout

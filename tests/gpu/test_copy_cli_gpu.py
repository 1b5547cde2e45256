"""copy's command line on a GPU machine: limits checked before allocating, interruption keeps results."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.gpu


def gb(*args, **kw):
    return subprocess.run([sys.executable, "-m", "gpubench", *args], capture_output=True, text=True, timeout=300, **kw)


def test_max_bytes_over_free_memory_is_refused():
    r = gb("copy", "--pinned", "-b", "1GiB", "-e", "1TiB")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "free" in r.stderr


def test_device_not_visible(gpu_count):
    r = gb("copy", "--pinned", "-d", str(gpu_count + 5))
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "not visible" in r.stderr


def test_pinned_cap_is_enforced():
    r = gb("copy", "--pinned", "-b", "1GiB", "-e", "1GiB", "--max-pinned", "256MiB")
    assert r.returncode == 2 and "cap" in r.stderr


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_keeps_partial_result(tmp_path, sig, code):
    out = tmp_path / "partial.json"
    p = subprocess.Popen([sys.executable, "-m", "gpubench", "copy", "--pinned", "-b", "4KiB", "-e", "1GiB", "-f", "2",
                          "--min-time", "0.5", "--json", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    time.sleep(6)
    t0 = time.monotonic()
    p.send_signal(sig)
    stdout, stderr = p.communicate(timeout=60)
    assert time.monotonic() - t0 < 10
    assert p.returncode == code, stderr
    data = json.loads(out.read_text())
    assert data["partial"] is True and data["interrupted_by"] == signal.Signals(sig).name
    measured = [r for r in data["records"] if r["samples_s"]]
    assert measured, "points measured before the signal must be kept"
    assert "PARTIAL" in stdout
    assert "Traceback" not in stderr

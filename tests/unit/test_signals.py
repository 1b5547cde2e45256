"""gpubench.core.signals: how the command-line process ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

# the process signals itself right after `saved PATH` is printed: the report and the file are whole
_SIGNAL_AFTER_SAVE = """
import os, signal, sys
from gpubench.core import report
saved, signum = report.saved, int(sys.argv[1])
def saved_then_signalled(*args, **kwargs):
    saved(*args, **kwargs)
    os.kill(os.getpid(), signum)
report.saved = saved_then_signalled
sys.argv = ["gpubench", *sys.argv[2:]]
from gpubench.cli import main
main()
"""


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_after_the_result_is_saved_says_the_result_is_complete(tmp_path, sig, code):
    """A signal once `saved PATH` is printed: the exit is the signal's, and its one line says the
    result is complete, not the line of a run that kept nothing; the file stays whole."""
    out = tmp_path / "n.json"
    p = subprocess.run([sys.executable, "-c", _SIGNAL_AFTER_SAVE, str(int(sig)), "net", "local", "-t", "0.4", "-i", "0.2",
                        "--json", str(out)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(SRC)})
    assert p.returncode == code, (p.returncode, p.stderr)
    assert p.stderr == f"gpubench: interrupted by {sig.name} after the run; its result is complete\n", p.stderr
    assert json.loads(out.read_text())["partial"] is False

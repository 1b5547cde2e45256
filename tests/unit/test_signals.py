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

# a process that made a multiprocessing queue (named semaphores, registered with the resource
# tracker, as a Nanny's start does) and then ends through exit_process once a module with a crashing
# teardown is loaded (os._exit)
_LEFT_QUEUE = """
import multiprocessing, sys
q = multiprocessing.get_context("spawn").Queue()
sys.modules["pyarrow._s3fs"] = sys  # stands for the loaded module: exit_process then skips teardown
from gpubench.core.signals import exit_process
print("ready", flush=True)
exit_process(3)
"""


def test_exit_past_a_crashing_teardown_keeps_the_code_and_leaves_no_semaphore_warning():
    p = subprocess.run([sys.executable, "-c", _LEFT_QUEUE], capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 3 and p.stdout == "ready\n", (p.returncode, p.stdout, p.stderr)
    assert p.stderr == "", p.stderr  # multiprocessing's resource tracker: "leaked semaphore objects"


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_after_the_result_is_saved_says_the_result_is_complete(tmp_path, sig, code):
    """The signal lands once `saved PATH` is printed (the report and the file are whole): the exit is
    the signal's, and its one line says the result is complete, not the line of a run that kept
    nothing; the file stays whole."""
    out = tmp_path / "n.json"
    p = subprocess.Popen([sys.executable, "-m", "gpubench", "net", "local", "-t", "0.4", "-i", "0.2", "--json", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env={**os.environ, "PYTHONPATH": str(SRC)})
    for line in p.stdout:
        if line.startswith("saved "):
            os.killpg(p.pid, sig)
            break
    _out, err = p.communicate(timeout=60)
    if p.returncode == 0:  # the process had already ended: nothing to see this time
        pytest.skip("the run ended before the signal")
    assert p.returncode == code and err == f"gpubench: interrupted by {sig.name} after the run; its result is complete\n", err
    assert json.loads(out.read_text())["partial"] is False

"""gpubench.core.signals: how the command-line process ends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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

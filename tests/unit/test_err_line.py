"""report.err_line: a line and its newline reach stderr in one write(2), so lines that several ranks
print at once under a launcher cannot run together (print() makes two writes). Checked with strace
on a real child process where strace is installed."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest


def _writes_to_stderr(code: str, tmp_path) -> list[str]:
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    log = tmp_path / "st.txt"
    p = subprocess.run(["strace", "-f", "-e", "trace=write", "-o", str(log), sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0 and "ptrace" in p.stderr:
        pytest.skip(f"strace cannot trace here: {p.stderr.strip()[:100]}")
    return [ln for ln in log.read_text().splitlines() if "write(2," in ln]


def test_err_line_is_one_write(tmp_path):
    writes = _writes_to_stderr("from gpubench.core.report import err_line; err_line('gpubench: warning: ' + 'x' * 600)",
                               tmp_path)
    assert len(writes) == 1, writes
    assert "xxxx" in writes[0] and writes[0].rstrip().endswith(("= 620", "= 621")), writes  # text and newline


def test_print_to_stderr_is_two_writes_which_is_why(tmp_path):
    writes = _writes_to_stderr("import sys; print('gpubench: warning: ' + 'x' * 600, file=sys.stderr)", tmp_path)
    assert len(writes) == 2, writes


def test_err_line_hands_the_stream_one_string_with_its_newline(monkeypatch):
    import io

    from gpubench.core.report import err_line

    calls = []

    class Counting(io.StringIO):
        def write(self, s):
            calls.append(s)
            return super().write(s)

    monkeypatch.setattr(sys, "stderr", Counting())
    err_line("gpubench: warning: two ranks")
    assert calls == ["gpubench: warning: two ranks\n"]


def test_err_line_on_a_closed_stderr_says_nothing_and_does_not_raise():
    p = subprocess.run([sys.executable, "-c", "import sys; sys.stderr.close(); "
                        "from gpubench.core.report import err_line; err_line('x'); print('ok')"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr

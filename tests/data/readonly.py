"""A folder that nobody can write, root included (CI runs as root, where chmod stops no one).

Tried in order: a tmpfs mounted read-only (``mount -t tmpfs``, then ``mount -o remount,ro``; needs
CAP_SYS_ADMIN, which root has outside a restricted container), then the immutable attribute
(``chattr +i``, where the file system supports it: ext4, xfs, btrfs). Skips with the reason when
neither works. Each holds one earlier file, ``old.json``, whose bytes must survive.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path

import pytest

OLD = '{"earlier": "result"}\n'


def _run(*argv) -> bool:
    if shutil.which(argv[0]) is None:
        return False
    return subprocess.run(list(argv), capture_output=True, timeout=30).returncode == 0


@contextlib.contextmanager
def read_only_folder(tmp_path: Path):
    """Yield (folder, how): ``how`` is "ro-mount" or "immutable"; the folder holds old.json."""
    d = tmp_path / "ro"
    d.mkdir()
    if _run("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)):
        try:
            (d / "old.json").write_text(OLD)
            if _run("mount", "-o", "remount,ro", str(d)):
                yield d, "ro-mount"
                return
        finally:
            _run("umount", "-l", str(d))
    (d / "old.json").write_text(OLD)
    if _run("chattr", "+i", str(d / "old.json")) and _run("chattr", "+i", str(d)):
        try:
            yield d, "immutable"
        finally:
            _run("chattr", "-i", str(d))
            _run("chattr", "-i", str(d / "old.json"))
        return
    pytest.skip("no read-only target can be made here: mount -o ro needs CAP_SYS_ADMIN and chattr +i "
                "a file system that supports it")

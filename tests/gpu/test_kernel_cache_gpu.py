"""gpubench's kernels kept as cubins (core/kernel_cache.py), on a GPU: a second run loads them
without NVRTC and records the NVRTC that compiled them; a broken or unwritable cache still runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

# a copy run in this process, then: is libnvrtc mapped, and the result's NVRTC version
RUN = """
import json, sys
from gpubench.cli import main
try:
    main(["copy", "-m", "pinned", "--direction", "h2d-sm,d2h", "-b", "4MiB", "-e", "4MiB", "-q", "--json", sys.argv[1]])
except SystemExit as e:
    assert not e.code, e.code
maps = open("/proc/self/maps").read()
print(json.dumps({"nvrtc_loaded": "libnvrtc" in maps,
                  "nvrtc_version": json.load(open(sys.argv[1]))["env"]["cuda"]["nvrtc_version"]}))
"""


def _run(tmp_path, cache, name: str) -> dict:
    env = {**os.environ, "GPUBENCH_CACHE_DIR": str(cache)}
    p = subprocess.run([sys.executable, "-c", RUN, str(tmp_path / f"{name}.json")], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_second_run_loads_the_kernels_without_nvrtc_and_names_the_nvrtc_that_compiled_them(tmp_path):
    cache = tmp_path / "cache"
    first = _run(tmp_path, cache, "first")
    assert first["nvrtc_loaded"] and first["nvrtc_version"]
    assert len(list(cache.glob("kernels-*.cubin"))) == 2 and len(list(cache.glob("nvrtc-*.json"))) == 1
    assert not list(cache.glob(".*tmp"))
    second = _run(tmp_path, cache, "second")
    assert second == {"nvrtc_loaded": False, "nvrtc_version": first["nvrtc_version"]}


def test_a_broken_cubin_is_compiled_again_and_an_unwritable_cache_is_passed_over(tmp_path):
    cache = tmp_path / "cache"
    _run(tmp_path, cache, "first")
    for f in cache.glob("kernels-*.cubin"):
        f.write_bytes(b"not a cubin")
    assert _run(tmp_path, cache, "again")["nvrtc_loaded"]
    assert all(f.read_bytes() != b"not a cubin" for f in cache.glob("kernels-*.cubin"))
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    got = _run(tmp_path, blocked / "cache", "unwritable")  # its folder cannot be made
    assert got["nvrtc_loaded"] and got["nvrtc_version"]

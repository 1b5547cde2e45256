"""The source passes the checks CI holds it to: ruff's rules (pyproject.toml [tool.ruff]) over src,
tests, benchmarks and examples, and mypy (pyproject.toml [tool.mypy]) over every module of src/gpubench with
no module left unchecked."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str) -> str:
    pytest.importorskip(name)
    return str(Path(sys.executable).with_name(name))


def test_ruff_finds_nothing():
    r = subprocess.run([_tool("ruff"), "check", "src", "tests", "benchmarks", "examples"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_mypy_finds_nothing_and_skips_no_module():
    overrides = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"].get("overrides", [])
    assert not [o for o in overrides if o.get("ignore_errors")], "a module is left unchecked"
    r = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]

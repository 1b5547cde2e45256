"""Shared fixtures. Tests marked ``gpu`` skip cleanly where no CUDA device is visible."""

from __future__ import annotations

import pytest


@pytest.fixture
def run_cli(capsys):
    """Run ``gpubench ARGS`` in-process through cli.main; returns (exit code, stdout, stderr)."""
    from gpubench.cli import main

    def run(*args):
        with pytest.raises(SystemExit) as e:
            main([str(a) for a in args])
        out = capsys.readouterr()
        return e.value.code, out.out, out.err

    return run


def _gpu_reason() -> str | None:
    from gpubench.core.errors import NoGPUError
    from gpubench.core.gpu import require_gpu

    try:
        require_gpu()
    except NoGPUError as e:
        return e.message
    return None


def pytest_collection_modifyitems(config, items):
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture
def gpu_count() -> int:
    """Number of visible CUDA devices (the test is marked gpu, so at least 1)."""
    from gpubench.core.gpu import device_count

    return device_count()

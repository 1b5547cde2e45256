"""merge._require_dask: an import that fails after a Ctrl-C was noted (Python wraps a KeyboardInterrupt
raised in __set_name__ as RuntimeError) is the user's stop, not a missing package."""

from __future__ import annotations

import sys

import pytest

from gpubench.plugins.merge import bench as merge
from gpubench.core import signals
from gpubench.core.errors import UsageError


@pytest.fixture
def broken_distributed(monkeypatch, tmp_path):
    (tmp_path / "distributed.py").write_text("raise RuntimeError(\"Error calling __set_name__ on 'cached_property'\")\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "distributed", raising=False)
    yield
    sys.modules.pop("distributed", None)
    signals.clear_signals()


def test_a_failed_import_after_a_sigint_is_the_interrupt(broken_distributed):
    signals.note_signal(2)
    with pytest.raises(KeyboardInterrupt):
        merge._require_dask()


def test_a_failed_import_with_no_signal_names_the_package(broken_distributed):
    with pytest.raises(UsageError, match="merge needs dask\\[distributed\\]"):
        merge._require_dask()

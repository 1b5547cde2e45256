"""merge_cluster.resolve_lazy_modules: a LazyLoader placeholder in sys.modules (CuPy's cupy.testing)
is loaded in the calling thread, so distributed's error logging never runs that import on its IO
loop thread (where the import can crash the process with SIGSEGV, as on a Ctrl-C during `merge -p
ucx`'s start)."""

from __future__ import annotations

import importlib.util
import sys
import threading

from gpubench.plugins.merge.cluster import resolve_lazy_modules


def _lazy(tmp_path, name: str, body: str):
    path = tmp_path / f"{name}.py"
    path.write_text(body)
    spec = importlib.util.spec_from_file_location(name, path)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_a_placeholder_is_loaded_in_the_calling_thread(tmp_path):
    name = "gpubench_lazy_probe"
    mod = _lazy(tmp_path, name, "import threading\nLOADED_IN = threading.current_thread().name\n")
    try:
        assert type(mod) is importlib.util._LazyModule  # nothing ran yet
        assert resolve_lazy_modules() >= 1
        assert type(mod) is not importlib.util._LazyModule
        assert mod.LOADED_IN == threading.current_thread().name
        assert name not in [k for k, m in sys.modules.items() if type(m) is importlib.util._LazyModule]
    finally:
        sys.modules.pop(name, None)


def test_a_placeholder_whose_load_fails_is_left_and_nothing_raises(tmp_path):
    name = "gpubench_lazy_broken"
    _lazy(tmp_path, name, "raise RuntimeError('broken on purpose')\n")
    try:
        resolve_lazy_modules()  # does not raise
    finally:
        sys.modules.pop(name, None)

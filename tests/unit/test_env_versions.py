"""What every result records of the CUDA stack it ran on: the CUDA wheels' versions (from the
installed distributions' metadata, null where not installed) and NVRTC's version (from CuPy,
without importing CuPy where it is not installed); the published schema and the loader accept
both, and results written before them still load."""

from __future__ import annotations

import builtins
import json
import sys
import types
from importlib import metadata
from pathlib import Path

import pytest

from gpubench.core import env
from gpubench.core.result import Result

DATA = Path(__file__).resolve().parents[1] / "data"
WHEELS = ("cuda-toolkit", "nvidia-cuda-nvrtc", "nvidia-nccl", "cuda-bindings")


def _installed(monkeypatch, dists: dict[str, str]) -> None:
    """importlib.metadata as if exactly ``dists`` (name -> version) were installed, plus click and rich."""
    def version(name):
        if name in dists:
            return dists[name]
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", version)


def test_every_cuda_wheel_has_its_key_and_none_where_it_is_not_installed(monkeypatch):
    _installed(monkeypatch, {"numpy": "2.0.0", "click": "8.2.0", "rich": "13.0.0"})
    v = env.versions()
    assert tuple(env.CUDA_WHEELS) == WHEELS
    assert {k: v[k] for k in WHEELS} == dict.fromkeys(WHEELS)
    assert "cupy-cuda13x" not in v and v["numpy"] == "2.0.0"


def test_the_cuda_13_wheels_are_read_under_one_name_each(monkeypatch):
    _installed(monkeypatch, {"cupy-cuda13x": "14.0.0", "cuda-toolkit": "13.0.2", "nvidia-cuda-nvrtc": "13.0.88",
                             "nvidia-nccl-cu13": "2.28.9", "cuda-bindings": "13.0.3"})
    v = env.versions()
    assert {k: v[k] for k in WHEELS} == {"cuda-toolkit": "13.0.2", "nvidia-cuda-nvrtc": "13.0.88",
                                         "nvidia-nccl": "2.28.9", "cuda-bindings": "13.0.3"}


def test_with_cupy_for_cuda_12_its_wheels_are_the_ones_read(monkeypatch):
    # both majors' NVRTC and NCCL wheels installed (a venv that had both extras): CuPy's major decides
    _installed(monkeypatch, {"cupy-cuda12x": "14.0.0", "cuda-toolkit": "12.9.1", "nvidia-cuda-nvrtc": "13.0.88",
                             "nvidia-cuda-nvrtc-cu12": "12.9.86", "nvidia-nccl-cu13": "2.28.9",
                             "nvidia-nccl-cu12": "2.27.7", "cuda-bindings": "12.9.2"})
    v = env.versions()
    assert (v["nvidia-cuda-nvrtc"], v["nvidia-nccl"]) == ("12.9.86", "2.27.7")


def test_cupy_is_not_imported_where_it_is_not_installed(monkeypatch):
    import importlib.util

    real_find_spec, real_import = importlib.util.find_spec, builtins.__import__
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cupy" else real_find_spec(name, *a))

    def no_cupy(name, *a, **k):
        assert not name.startswith("cupy"), "CuPy was imported"
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_cupy)
    c = env.cuda_info()
    assert c["nvrtc_version"] is None and c["runtime_version"] is None
    assert "CuPy not importable" in c["error"]


@pytest.mark.parametrize("answer,expected", [((13, 0), "13.0"), ((12, 9), "12.9"), (RuntimeError("no libnvrtc"), None)])
def test_nvrtc_version_is_cupys_getversion(monkeypatch, answer, expected):
    def get_version():
        if isinstance(answer, Exception):
            raise answer
        return answer

    nvrtc = types.SimpleNamespace(getVersion=get_version)
    cuda = types.ModuleType("cupy.cuda")
    cuda.nvrtc = nvrtc  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nvrtc", nvrtc)
    assert env.nvrtc_version() == expected


def test_env_records_both_and_the_schema_and_loader_accept_them():
    jsonschema = pytest.importorskip("jsonschema")
    from gpubench.core.result import json_schema

    e = env.capture()
    assert set(WHEELS) <= set(e["versions"]) and "nvrtc_version" in e["cuda"]
    d = Result(command="env", spec={}, env=e).to_dict()
    for nvrtc in ("13.0", None):
        d["env"]["cuda"]["nvrtc_version"] = nvrtc
        d["env"]["versions"].update(dict.fromkeys(WHEELS))
        assert list(jsonschema.Draft202012Validator(json_schema()).iter_errors(d)) == []
        assert Result.from_dict(json.loads(json.dumps(d))).env["cuda"]["nvrtc_version"] == nvrtc


def test_results_written_before_the_fields_still_load_and_compare_the_same():
    from gpubench.analysis.compare import env_diff

    old = Result.from_dict(json.loads((DATA / "copy-pinned-h200.json").read_text()))
    assert "nvrtc_version" not in old.env["cuda"] and "cuda-toolkit" not in old.env["versions"]
    new = Result.from_dict(json.loads((DATA / "copy-pinned-h200.json").read_text()))
    new.env["versions"].update(dict.fromkeys(WHEELS))
    new.env["cuda"]["nvrtc_version"] = None
    assert env_diff(old, new) == []  # nothing recorded and not installed read alike
    new.env["versions"]["cuda-toolkit"] = "13.0.2"
    new.env["cuda"]["nvrtc_version"] = "13.0"
    assert {(k, a, b) for k, a, b in env_diff(old, new)} == {("cuda-toolkit", "-", "13.0.2"), ("NVRTC", "-", "13.0")}

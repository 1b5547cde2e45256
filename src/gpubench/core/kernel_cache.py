"""gpubench's CUDA kernels as cubins kept on disk, so that a run loads them without NVRTC (CuPy's
own cache key loads libnvrtc, about 30 MiB, in every process: cupy/cuda/compiler.py
``_compile_with_cache_cuda``). On a miss the source is compiled as RawModule would
(``compile_using_nvrtc``) and kept in :func:`cache_dir` as ``kernels-KEY.cubin``, with
``nvrtc-ENV.json`` (``{"nvrtc": "13.0"}``); a cache that cannot be written or read is passed over.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

# NVRTC's options: those CuPy's RawModule passes (compiler.py adds the arch and the rest itself)
NVRTC_OPTIONS = ("-ftz=true",)
# the NVRTC wheels (CUDA 13 first, then 12), whose versions are part of the key
NVRTC_WHEELS = ("nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu13", "nvidia-cuda-nvrtc-cu12")


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$GPUBENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpubench``, else ``~/.cache/gpubench``."""
    e = os.environ if env is None else env
    if e.get("GPUBENCH_CACHE_DIR"):
        return Path(e["GPUBENCH_CACHE_DIR"])
    return Path(e.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpubench"


def _hash(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def env_key(compute_capability: str, driver: int, cupy_version: str, nvrtc_wheels: tuple[str | None, ...]) -> str:
    """What a cubin depends on besides its source: the options, the GPU's compute capability, the
    CUDA driver's version, CuPy's version and the NVRTC wheels' (None where not installed)."""
    return _hash(" ".join(NVRTC_OPTIONS), compute_capability, str(driver), cupy_version, repr(nvrtc_wheels))


def dist_version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, None where it is not installed."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _current_env_key() -> str:
    """:func:`env_key` of the current device (CUDA runtime calls; NVRTC is not loaded)."""
    import cupy
    from cupy.cuda import runtime

    return env_key(cupy.cuda.Device().compute_capability, runtime.driverGetVersion(), cupy.__version__,
                   tuple(dist_version(d) for d in NVRTC_WHEELS))


def cached_nvrtc_version() -> str | None:
    """The version of the NVRTC that compiled the cached kernels of the current device's
    environment, "major.minor"; None where nothing is cached (or CUDA cannot say). Loads no NVRTC."""
    try:
        got = json.loads((cache_dir() / f"nvrtc-{_current_env_key()}.json").read_text()).get("nvrtc")
    except Exception:  # no cache yet, no CUDA, a broken file: the caller asks NVRTC itself
        return None
    return got if isinstance(got, str) and len(got) <= 16 else None


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load(source: str) -> Any:
    """``source`` as a cupy.RawModule for the current device: its cubin from the cache when there, else compiled with
    NVRTC and kept. Raises CompileException: the source does not compile; CUDADriverError: the GPU cannot load it."""
    import cupy
    from cupy.cuda import compiler

    try:
        key = _current_env_key()
        folder = cache_dir()
    except Exception:  # no CUDA runtime to ask: RawModule raises the real error
        return cupy.RawModule(code=source, options=NVRTC_OPTIONS)
    cubin = folder / f"kernels-{_hash(source, key)}.cubin"
    if cubin.is_file():
        try:
            mod = cupy.RawModule(path=str(cubin))
            mod.module  # noqa: B018 - RawModule loads on first use: load it here, inside the try
            return mod
        except Exception:  # truncated or foreign: compiled again below
            pass
    binary, _ = compiler.compile_using_nvrtc(source, NVRTC_OPTIONS)
    try:
        from cupy.cuda import nvrtc

        major, minor = nvrtc.getVersion()
        folder.mkdir(parents=True, exist_ok=True)
        _write(cubin, binary if isinstance(binary, bytes) else str(binary).encode())
        _write(folder / f"nvrtc-{key}.json", json.dumps({"nvrtc": f"{major}.{minor}"}).encode())
        return cupy.RawModule(path=str(cubin))
    except OSError:  # a read-only or full cache: this run compiles in memory
        return cupy.RawModule(code=source, options=NVRTC_OPTIONS)

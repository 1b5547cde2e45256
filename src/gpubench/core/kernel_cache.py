"""gpubench's CUDA kernels as cubins kept on disk, so that a run loads them without NVRTC.

CuPy's ``RawModule(code=...)`` has a disk cache of its own, but its key asks NVRTC for its version
and compiles an empty program first (cupy/cuda/compiler.py ``_compile_with_cache_cuda``), so every
process loads libnvrtc: about 30 MiB of host memory that a copy test holds beside its buffers.
Here the key is made of what the compiled code depends on that can be read without NVRTC, and a
cached cubin is loaded with ``cuModuleLoad`` (``RawModule(path=...)``). On a miss the source is
compiled as RawModule would compile it (``cupy.cuda.compiler.compile_using_nvrtc``, the same
options) and kept, with the version of the NVRTC that compiled it.

Files, in :func:`cache_dir`: ``kernels-KEY.cubin`` per source, ``nvrtc-ENV.json`` per environment
(``{"nvrtc": "13.0"}``). Each is written to a temporary name and renamed, so a reader never sees
half of one. A cache that cannot be written or a file that does not load is passed over: the run
then compiles in its own memory.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

# NVRTC's options: those CuPy's RawModule passes (compiler.py adds the arch,
# --device-as-default-execution-space and, from NVRTC 12.8, --pch itself)
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
    """What a cubin depends on besides its source: the options, the GPU's compute capability
    ("90"), the CUDA driver's version (cudaDriverGetVersion), CuPy's version and the NVRTC wheels'
    (None each where not installed: a system CUDA's NVRTC)."""
    return _hash(" ".join(NVRTC_OPTIONS), compute_capability, str(driver), cupy_version, repr(nvrtc_wheels))


def _current_env_key() -> str:
    """:func:`env_key` of the current device (CUDA runtime calls; NVRTC is not loaded)."""
    from importlib import metadata

    import cupy
    from cupy.cuda import runtime

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return env_key(cupy.cuda.Device().compute_capability, runtime.driverGetVersion(), cupy.__version__,
                   tuple(version(d) for d in NVRTC_WHEELS))


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
    """``source`` as a cupy.RawModule for the current device: its cubin from the cache when there,
    else compiled with NVRTC and kept.

    Raises:
        CompileException: the source does not compile; CUDADriverError: the GPU cannot load it.
    """
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

"""The registry: every command's :class:`~gpubench.core.plugin.Plugin`, found through the entry-point
group ``gpubench.plugins``.

gpubench's own commands are entry points of its distribution (pyproject.toml), a third party's are
entry points of theirs (examples/plugin/); both are read the same way. Run from a source tree that
is not installed (``PYTHONPATH=src``), no installed distribution declares gpubench's own, and they
are read from the tree's pyproject.toml, the declaration pip would have installed.

Reading the registry imports each plug-in's descriptor module only (plain data: no CuPy, Dask or
matplotlib), so ``gpubench --help`` stays light; a command's own modules are imported when it runs
or its help is shown (click's "Lazily Loading Subcommands").
"""

from __future__ import annotations

import importlib
import sys
from typing import Iterator

from gpubench.core.plugin import Plugin

GROUP = "gpubench.plugins"
_LOADED: dict[str, Plugin] | None = None
#: plug-ins that did not load: (entry point "name = value", why), each said once on stderr
BROKEN: list[tuple[str, str]] = []


def _load(value: str) -> object:
    module, _, attr = value.partition(":")
    obj: object = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj


OWN = "gpubench."  # the entry points of gpubench's own commands name its modules


def _entry_points() -> list[tuple[str, str]]:
    """(name, "module:attr") of every entry point of the group, by name."""
    from importlib.metadata import entry_points

    found = [(ep.name, ep.value) for ep in entry_points(group=GROUP)]
    if not any(value.startswith(OWN) for _name, value in found):
        found = _source_tree_entry_points() + found
    return sorted(found)


def _source_tree_entry_points() -> list[tuple[str, str]]:
    """gpubench's own entry points read from the pyproject.toml of the source tree it runs from
    (src/gpubench -> the project root); none where there is no such file."""
    import tomllib
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "pyproject.toml"
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    table = doc.get("project", {}).get("entry-points", {}).get(GROUP, {})
    return [(k, v) for k, v in table.items() if isinstance(v, str) and v.startswith(OWN)]


def plugins() -> dict[str, Plugin]:
    """Every command, by name (the order of ``gpubench --help``).

    A plug-in whose entry point does not load, or that names a command already taken, is left
    out and said once on stderr (``BROKEN``); the others still work.
    """
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    got: dict[str, Plugin] = {}
    for name, value in _entry_points():
        if name in got:
            _broken(f"{name} = {value}", f"the command {name!r} is taken")
            continue
        try:
            p = _load(value)
        except Exception as e:  # a third party's broken plug-in must not break every command
            _broken(f"{name} = {value}", f"{type(e).__name__}: {e}")
            continue
        if not isinstance(p, Plugin) or p.name != name:
            _broken(f"{name} = {value}", "it is not a gpubench.core.plugin.Plugin named " + repr(name))
            continue
        got[name] = p
    _LOADED = got
    return _LOADED


def _broken(what: str, why: str) -> None:
    from gpubench.core.safe import term

    BROKEN.append((what, why))
    sys.stderr.write(f"gpubench: warning: plug-in {term(what, 200)} left out: {term(why, 300)}\n")


def get(name: str) -> Plugin:
    """The plug-in of ``name``.

    Raises:
        KeyError: no such command.
    """
    return plugins()[name]


def measuring() -> Iterator[Plugin]:
    """The plug-ins whose runs write Results (every command but compare, plot, report, suite)."""
    return (p for p in plugins().values() if p.writes_results)


def load_command(name: str):
    """The click command of ``name``: the ``command`` of its plug-in's command module (imported
    now; :func:`gpubench.kit.benchmark_command` makes one from a benchmark's declared options).

    Raises:
        KeyError: ``name`` is not registered.
    """
    return importlib.import_module(get(name).command).command


def no_gpu_commands() -> tuple[str, ...]:
    """The commands (or their forms) that work without a GPU, in registry order."""
    return tuple(p.name if p.gpu == "no" else p.gpu for p in plugins().values() if p.gpu != "yes")


# This process's command line (saved in each result's "argv"); set by the CLI's entry point.
INVOCATION: list[str] = []

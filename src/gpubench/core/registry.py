"""The registry: every command's :class:`~gpubench.core.plugin.Plugin`, found through the entry-point
group ``gpubench.plugins`` (from a source tree that is not installed, gpubench's own are read from
its pyproject.toml). Only descriptor modules are imported, so ``gpubench --help`` stays light.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Iterator

from gpubench.core.plugin import Plugin, resolve
from gpubench.core.safe import term

GROUP = "gpubench.plugins"
OWN_DISTRIBUTION = "gpubench-cuda"
_LOADED: dict[str, Plugin] = {}  # name -> its plug-in, as each is loaded
_ALL = False  # every entry point loaded
_TRIED: set[tuple[str, str]] = set()


@functools.lru_cache(maxsize=1)
def _entry_points() -> tuple[tuple[str, str, bool], ...]:
    """(name, "module:attr", gpubench's own) of every entry point of the group: gpubench's own
    first (they keep their names), then the others by name."""
    from importlib.metadata import entry_points

    found = []
    for ep in entry_points(group=GROUP):
        dist = getattr(ep, "dist", None)
        own = dist is not None and (dist.metadata["Name"] or "").lower() == OWN_DISTRIBUTION
        found.append((ep.name, ep.value, own))
    if not any(own for _n, _v, own in found):
        found = _source_tree_entry_points() + found
    return tuple(sorted(found, key=lambda e: (not e[2], e[0], e[1])))


def _source_tree_entry_points() -> list[tuple[str, str, bool]]:
    """gpubench's own entry points read from the pyproject.toml of the source tree it runs from
    (src/gpubench -> the project root); none where there is no such file."""
    import tomllib
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "pyproject.toml"
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if doc.get("project", {}).get("name") != OWN_DISTRIBUTION:
        return []
    table = doc.get("project", {}).get("entry-points", {}).get(GROUP, {})
    return [(k, v, True) for k, v in table.items() if isinstance(v, str)]


def _take(name: str, value: str) -> None:
    """Load one entry point into _LOADED, or say once why it is left out."""
    if (name, value) in _TRIED:
        return
    _TRIED.add((name, value))
    if name in _LOADED:
        _broken(f"{name} = {value}", f"the command {name!r} is taken by {_LOADED[name].command}")
        return
    try:
        p = resolve(value)
    except (Exception, SystemExit) as e:  # a third party's broken plug-in must not break every command
        _broken(f"{name} = {value}", f"{type(e).__name__}: {e}")
        return
    if not isinstance(p, Plugin):
        _broken(f"{name} = {value}", f"it is a {type(p).__name__}, not a gpubench.core.plugin.Plugin")
    elif p.name != name:
        _broken(f"{name} = {value}", f"its Plugin is named {p.name!r}, not {name!r}")
    else:
        _LOADED[name] = p


def plugins() -> dict[str, Plugin]:
    """Every command, by name; a plug-in that does not load, is not a Plugin of that name or names a
    command already taken is left out and said once on stderr."""
    global _ALL
    if not _ALL:
        for name, value, _own in _entry_points():
            _take(name, value)
        _ALL = True
    return dict(sorted(_LOADED.items()))


def find(name: str) -> Plugin | None:
    """The plug-in of ``name``, loading only the entry points of that name; None when none has it."""
    if name not in _LOADED and not _ALL:
        for n, value, _own in _entry_points():
            if n == name:
                _take(n, value)
    return _LOADED.get(name)


def added(command: str, what: str) -> dict:
    """The installed plug-in's ``added_options`` or ``added_params`` (``what``); empty for a command
    not installed here."""
    own = find(command)
    return dict(getattr(own, what)) if own is not None else {}


def _broken(what: str, why: str) -> None:
    sys.stderr.write(f"gpubench: warning: plug-in {term(what, 200)} left out: {term(why, 300)}\n")


def warn_hook(plugin: Plugin, hook: str, e: BaseException) -> None:
    """Say once on stderr that ``plugin``'s ``hook`` failed and what it gave is left out."""
    key = (plugin.name, hook)
    if key in _HOOKS_SAID:
        return
    _HOOKS_SAID.add(key)
    sys.stderr.write(f"gpubench: warning: plug-in {term(plugin.name, 60)}: its {hook} hook failed "
                     f"({term(type(e).__name__ + ': ' + str(e), 300)}); left out\n")


_HOOKS_SAID: set[tuple[str, str]] = set()


def call_hook(plugin: Plugin, attr: str, *args, check=None, default=None):
    """``plugin``'s hook ``attr`` called with ``args``, its answer held to ``check`` (raises TypeError);
    ``default`` where the plug-in declares no such hook, or it failed (said once, :func:`warn_hook`)."""
    if getattr(plugin, attr) is None:
        return default
    try:
        got = plugin.hook(attr)(*args)  # type: ignore[misc]
        if check is not None:
            check(got)
    except Exception as e:  # KeyboardInterrupt and Interrupted are BaseExceptions: they pass
        warn_hook(plugin, attr, e)
        return default
    return got


def get(name: str) -> Plugin:
    """The plug-in of ``name``. Raises KeyError: no such command."""
    p = find(name)
    if p is None:
        raise KeyError(name)
    return p


def measuring() -> Iterator[Plugin]:
    """The plug-ins whose runs write Results (every command but compare, plot, report, suite)."""
    return (p for p in plugins().values() if p.writes_results)


def load_command(name: str):
    """The click command of ``name``: the ``command`` of its plug-in's command module, imported now. Raises KeyError:
    ``name`` is not registered; RuntimeError: the plug-in's command module does not import or has no click command."""
    import click

    p = get(name)
    try:
        cmd = getattr(importlib.import_module(p.command), "command", None)
    except (Exception, SystemExit) as e:
        raise RuntimeError(f"plug-in {name}: its command module {p.command} does not import "
                           f"({type(e).__name__}: {e})") from None
    if not isinstance(cmd, click.Command):
        raise RuntimeError(f"plug-in {name}: {p.command}.command is a {type(cmd).__name__}, not a click command")
    return cmd


def no_gpu_commands() -> tuple[str, ...]:
    """The commands (or their forms) that work without a GPU, in registry order."""
    return tuple(p.name if p.gpu == "no" else p.gpu for p in plugins().values() if p.gpu != "yes")


# This process's command line (saved in each result's "argv"); set by the CLI's entry point.
INVOCATION: list[str] = []

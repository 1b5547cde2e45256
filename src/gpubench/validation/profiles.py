"""Expectation profiles shipped with gpubench: ``--expect NAME`` reads ``gpubench/profiles/NAME.toml``,
an expectations file (docs/suite.md) with a ``[profile]`` table (``description``, ``source``)."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any

from gpubench.core import safe
from gpubench.core.errors import UsageError

NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}\Z")


def _folder() -> Any:
    return resources.files("gpubench") / "profiles"


def names() -> list[str]:
    """The shipped profiles' names, sorted."""
    return sorted(p.name[:-5] for p in _folder().iterdir() if p.name.endswith(".toml"))


def resolve(value: str) -> str:
    """The expectations file ``--expect VALUE`` names: VALUE itself when it is (or looks like) a
    file, else the shipped profile VALUE. UsageError: VALUE is empty, or names no file and no profile.
    """
    if not value.strip():  # Path("") is ".", which exists: never read as a file
        raise UsageError(f"--expect {safe.term(repr(value), 80)} is empty",
                         f"a TOML file or a profile ({', '.join(names())}); leave --expect out for none")
    if Path(value).exists() or "/" in value or value.endswith(".toml") or not NAME.match(value):
        return value
    if value in names():
        return str(_folder() / f"{value}.toml")
    raise UsageError(f"--expect {safe.term(repr(value), 80)} is no file and no profile",
                     f"profiles: {', '.join(names())}; or give a TOML file")


def describe() -> list[tuple[str, dict, list]]:
    """(name, its [profile] table, its expectations) of every profile, for ``suite --profiles``."""
    import tomllib

    from gpubench.validation.suite import parse_expectations

    docs = {name: tomllib.loads((_folder() / f"{name}.toml").read_text(encoding="utf-8")) for name in names()}
    return [(name, doc.get("profile", {}), parse_expectations(doc, f"profile {name}")) for name, doc in docs.items()]

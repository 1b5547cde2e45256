"""How NCCL moved the data, read from NCCL's own INFO log of the run (``NCCL_DEBUG=INFO`` into a
private temporary file, unless the user set NCCL_DEBUG or NCCL_DEBUG_FILE; the INFO lines are
written during init and connection set-up, never in a timed iteration). The strings are escaped
(core.safe) wherever they are shown.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field

_VERSION = re.compile(r"NCCL INFO NCCL version (\S+)")
_NETWORK = re.compile(r"NCCL INFO (?:Using network|Using NET plugin|Assigned NET plugin) (\S+)")
_PLUGIN_LOADED = re.compile(r"NCCL INFO NET/Plugin: Loaded (?:net|coll)? ?plugin (.+?)\s*$")
_PLUGIN_NONE = re.compile(r"NCCL INFO NET/Plugin: (?:Could not find|No plugin found|Plugin load returned)")
_NET_FAILED = re.compile(r"NCCL INFO Failed to initialize NET plugin (\S+)")
_IFACE = re.compile(r"NCCL INFO NET/(\w+) ?: Using (.+?)\s*$")
_FIELDS = (("version", _VERSION), ("network", _NETWORK), ("plugin", _PLUGIN_LOADED))
_CHANNEL = re.compile(r"NCCL INFO Channel \d+/\d+ : (\d+)\[[^\]]*\] -> (\d+)\[[^\]]*\](?: \[(send|receive)\])? via (\S+)")


@dataclass
class NcclLog:
    """What one rank's INFO log says. ``paths``: {"a->b": sorted transports} over every channel."""

    version: str | None = None
    network: str | None = None
    plugin: str | None = None  # the loaded plugin's name, "none" when NCCL said none was found
    interfaces: list[str] = field(default_factory=list)
    paths: dict[str, list[str]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def parse(lines) -> NcclLog:
    """An NcclLog from NCCL INFO lines (an iterable of str)."""
    out = NcclLog()
    paths: dict[str, set[str]] = {}
    failed: set[str] = set()
    for ln in lines:
        if "NCCL INFO" not in ln:
            continue
        if m := _CHANNEL.search(ln):
            paths.setdefault(f"{m.group(1)}->{m.group(2)}", set()).add(m.group(4))
            continue
        m, name = next(((m, name) for name, rx in _FIELDS if (m := rx.search(ln))), (None, ""))
        if m:
            setattr(out, name, m.group(1))
            continue
        if _PLUGIN_NONE.search(ln) and out.plugin is None:
            out.plugin = "none"
            continue
        if m := _NET_FAILED.search(ln):  # e.g. IB with no usable device: the interfaces it listed are not used
            failed.add(m.group(1))
            continue
        m = _IFACE.search(ln)
        if m and m.group(1) != "Plugin":
            text = f"{m.group(1)} {m.group(2)}"
            if text not in out.interfaces:
                out.interfaces.append(text)
    out.paths = {k: sorted(v) for k, v in sorted(paths.items())}
    out.interfaces = [i for i in out.interfaces if i.split(" ", 1)[0] not in failed]
    return out


class Capture:
    """The log file of this process, or why there is none (``reason``)."""

    def __init__(self, path: str | None, reason: str | None):
        self.path, self.reason = path, reason

    def read(self) -> NcclLog | None:
        if self.path is None:
            return None
        try:
            with open(self.path, errors="replace") as f:
                return parse(f)
        except OSError:
            return None

    def remove(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def capture(env=os.environ) -> Capture:
    """Point NCCL's INFO log at a private temporary file, before NCCL is first called in this
    process; the user's NCCL_DEBUG / NCCL_DEBUG_FILE win (``reason`` says so)."""
    if env.get("NCCL_DEBUG") or env.get("NCCL_DEBUG_FILE"):
        return Capture(None, "NCCL_DEBUG or NCCL_DEBUG_FILE is set by the user: NCCL's log was left as asked")
    fd, path = tempfile.mkstemp(prefix=f"gpubench-nccl-{os.getpid()}-", suffix=".log")
    os.close(fd)
    env["NCCL_DEBUG"] = "INFO"
    env["NCCL_DEBUG_FILE"] = path  # no %h/%p in the name: NCCL would expand them
    return Capture(path, None)


def summary_line(logs: list[dict | None], nranks: int) -> str:
    """One line from every rank's parsed log (NcclLog.to_dict or None): version, network and
    plugin, interfaces, and the transports between ranks. Not escaped."""
    got = [d for d in logs if d]
    if not got:
        return "NCCL's INFO log was not captured"
    version = next((d["version"] for d in got if d.get("version")), None)
    network = next((d["network"] for d in got if d.get("network")), None)
    plugins = sorted({d["plugin"] for d in got if d.get("plugin")})
    ifaces = sorted({i for d in got for i in d.get("interfaces", [])})
    paths = Counter(t for d in got for ts in (d.get("paths") or {}).values() for t in ts)
    parts = [f"NCCL {version or '?'}"]
    if network:
        plug = ("no net plugin loaded" if plugins in ([], ["none"]) else "plugin " + ", ".join(p for p in plugins if p != "none"))
        net = f"network {network} ({plug})"
        if ifaces:
            net += " over " + ", ".join(ifaces[:4]) + (f" and {len(ifaces) - 4} more" if len(ifaces) > 4 else "")
        parts.append(net)
    if paths:
        parts.append("paths between ranks (channels): " + ", ".join(f"{t} x{n}" for t, n in sorted(paths.items())))
    elif nranks == 1:
        parts.append("1 rank: no peer paths")
    else:
        parts.append("no channel paths in the log")
    return "; ".join(parts)

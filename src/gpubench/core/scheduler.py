"""Dask scheduler addresses and files, checked before ``distributed.Client`` sees them.

``Client(scheduler_file=PATH)`` waits forever for a missing file and raises UnboundLocalError or
TypeError for one that is not a scheduler file; a Client that fails on a malformed address is left
to the garbage collector, whose close() can block the process (distributed 2024-2026, client.py
``_start`` and ``__del__``). The commands that take --scheduler-address / --scheduler-file check
them here first, so each of those mistakes is one line, exit 2.
"""

from __future__ import annotations

import json
import os

from gpubench.core.errors import UsageError

_HINT = "give the file written by `dask scheduler --scheduler-file`"


def scheduler_file_address(path: str) -> str:
    """The scheduler address written in the Dask scheduler file ``path``.

    Raises:
        UsageError: the file is missing, unreadable or over 256 MiB, is not JSON, or holds no
            "address" string.
    """
    from gpubench.core.result import read_bounded

    if not os.path.exists(path):
        raise UsageError(f"--scheduler-file {path!r} does not exist", _HINT)
    raw = read_bounded(path, "a Dask scheduler file")
    try:
        cfg = json.loads(raw)
    except ValueError:  # UnicodeDecodeError included
        cfg = None
    address = cfg.get("address") if isinstance(cfg, dict) else None
    if not isinstance(address, str) or not address:
        raise UsageError(f"--scheduler-file {path!r} is not a Dask scheduler file (no \"address\" in it)", _HINT)
    return address


def check_scheduler_address(address: str) -> None:
    """Check that ``address`` (tcp://HOST:PORT, ucx://HOST:PORT, HOST:PORT) names a host and port.

    Raises:
        UsageError: a malformed address (no port, an unknown scheme, an unclosed IPv6 bracket), or a
            port out of range.
    """
    from distributed.comm import get_address_host_port

    try:
        _host, port = get_address_host_port(address)
    except ValueError as e:
        raise UsageError(f"--scheduler-address {address!r} is not an address ({str(e).splitlines()[0][:100]})",
                         "e.g. tcp://HOST:8786") from None
    if not 0 < port < 65536:
        raise UsageError(f"--scheduler-address {address!r}: port {port} out of range", "e.g. tcp://HOST:8786")

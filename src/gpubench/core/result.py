"""The result model: what every command returns and ``--json`` saves; atomic save and checked load.

The JSON layout (schema version 1, docs/results.md) is :meth:`Result.to_dict`; its JSON Schema is
``gpubench/schemas/result-v1.schema.json`` (:func:`json_schema`). Loading a newer schema version is
refused; older versions are upgraded through ``_MIGRATIONS``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import math
import os
import re
import stat as _stat
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpubench import __version__
from gpubench.core import safe
from gpubench.core.errors import MachineError, UsageError, first_line, from_the_command_line
from gpubench.core.stats import Summary, rates
from gpubench.core.timing import STOP_REASONS

SCHEMA = "gpubench.result"
SCHEMA_VERSION = 1
# version -> function upgrading a dict of that version to version + 1
_MIGRATIONS: dict[int, Any] = {}
MAX_LOAD_BYTES = 64 * 2**20
MAX_JSON_ITEMS = 8_000_000  # JSON values a file may hold (commas and opening brackets counted)
MAX_DEPTH = 64  # nesting a file may hold (a result nests 5 levels; a bundle 8), checked before parsing
MAX_RECORDS = 1_000_000  # records in one result
MAX_INT = 2**63 - 1  # the largest count any field holds: bytes, steps, indices (a signed 64-bit int)
_MIN_INT = -MAX_INT - 1
MAX_REPS = 10**9  # steps per sample (core.options.MAX_COUNT)


@dataclass
class Record:
    """One measured point.

    Attributes:
        params: what identifies the point (compare pairs records on these), JSON scalars only.
        metric: "bandwidth" (nbytes / seconds, higher is better) or "time" (lower is better).
        nbytes: bytes moved per step (0 for a pure time).
        samples_s: per-step seconds of every timed sample; reps: steps per sample.
        error: one line when the point could not be measured (then samples_s is empty).
        telemetry: the GPU's state while the point ran (gpubench.core.telemetry), or None.
    """

    params: dict[str, Any]
    metric: str = "bandwidth"
    nbytes: int = 0
    samples_s: list[float] = field(default_factory=list)
    reps: int = 1
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    telemetry: dict[str, Any] | None = None

    def key(self) -> tuple:
        """Hashable identity of the point, from its params."""
        return tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in self.params.items()))

    def time_summary(self) -> Summary:
        """Summary of the per-step seconds. Raises ValueError when there are no samples."""
        return Summary.of(self.samples_s)

    def rates(self) -> list[float]:
        """Each sample's bandwidth in bytes per second, ``nbytes / seconds`` (:func:`stats.rates`). Raises ValueError:
        nbytes is 0, or a sample that is not > 0."""
        if not self.nbytes:
            raise ValueError("record moves no bytes")
        return rates(self.nbytes, self.samples_s)

    def rate_summary(self) -> Summary:
        """Summary of per-sample bandwidth in bytes per second (:meth:`rates`). Raises ValueError: no samples, nbytes is
        0, or a sample that is not > 0."""
        return Summary.of(self.rates())

    def mark_peak(self, peak_bytes_per_s: float | None) -> None:
        """Record the link's physical peak (B/s) in extra with the median's % of it, and flag a
        median above it ("above_peak": a timing fault, never a real speed). Needs samples."""
        med = self.rate_summary().median
        peak = peak_bytes_per_s
        self.extra["peak_bytes_per_s"] = peak
        self.extra["pct_of_peak"] = 100.0 * med / peak if peak else None
        self.extra["above_peak"] = bool(peak and med > peak)

    def to_dict(self) -> dict:
        """The JSON dict, its fields in the layout's order (the dataclass's)."""
        return dict(vars(self))

    @classmethod
    def from_dict(cls, d: dict, *, source: str = "result", pointer: str = "") -> "Record":
        """Build a Record from its JSON dict, checked by :func:`check_record` (UsageError)."""
        return check_record(d, source, pointer)


def time_ratios(records: list[Record], baseline: str, key) -> list[tuple[Record, float | None]]:
    """For each record with samples: (record, baseline median time / its median time), where the
    baseline is the record whose params["strategy"] is ``baseline`` and whose ``key(record)`` is the
    same; None when there is no baseline. A ratio above 1 is faster than the baseline.
    """
    base = {key(r): r.time_summary().median for r in records
            if r.params.get("strategy") == baseline and r.samples_s}
    return [(r, b / r.time_summary().median if (b := base.get(key(r))) else None) for r in records if r.samples_s]


_RESULT_HEAD = ("schema_version", "command", "gpubench_version", "created", "argv", "spec", "timing", "env",
                "partial", "interrupted_by")


@dataclass
class Result:
    """A command's whole outcome: spec, timing, environment and records.

    Attributes:
        partial: True when the run stopped before the end (a signal, or a machine fault).
        interrupted_by: "SIGINT" / "SIGTERM" when a signal stopped it.
        failed_by: the error line when a machine fault stopped it (the run then exits 3).
        created: ISO 8601 UTC time of creation.
    """

    command: str
    spec: dict[str, Any]
    timing: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    records: list[Record] = field(default_factory=list)
    partial: bool = False
    interrupted_by: str | None = None
    failed_by: str | None = None
    argv: list[str] = field(default_factory=list)
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    gpubench_version: str = __version__
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        """The JSON dict, its fields in the layout's order (failed_by only when set)."""
        return {"schema": SCHEMA, **{k: getattr(self, k) for k in _RESULT_HEAD},
                **({"failed_by": self.failed_by} if self.failed_by else {}),
                "records": [r.to_dict() for r in self.records]}

    @classmethod
    def from_dict(cls, d: dict, *, source: str = "result", pointer: str = "") -> "Result":
        """Build a Result from the parsed JSON ``d`` (at JSON Pointer ``pointer`` of file ``source``),
        upgraded and checked by :func:`check_result` (UsageError)."""
        return check_result(d, source, pointer)


def _write_target(path: str | os.PathLike) -> Path:
    """The file a save to ``path`` replaces: a symbolic link's target (the link is kept), else path."""
    return Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)


def _link_hops(path: str | os.PathLike, limit: int = 40) -> list[str]:
    """Every name a path goes through while its final symbolic links are followed (``path`` first)."""
    hops = [os.fspath(path)]
    cur = hops[0]
    for _ in range(limit):
        try:
            if not os.path.islink(cur):
                break
            nxt = os.readlink(cur)
        except OSError:
            break
        cur = os.path.join(os.path.dirname(cur), nxt)
        hops.append(cur)
    return hops


_FD_LINK = re.compile(r"^/(?:proc/(?:self|thread-self|\d+)(?:/task/\d+)?/fd|dev/fd)(?:/|$)")


def check_output_name(path: str | os.PathLike, what: str = "--json") -> None:
    """The checks of the name alone (no file system): empty, a folder's, over 255 bytes. Raises UsageError: as
    :func:`check_output_target`."""
    shown = safe.term(repr(str(path)), 300)
    with from_the_command_line():
        if not str(path).strip():
            raise UsageError(f"{what} needs a file name, got {shown}", "e.g. out.json")
        if str(path).endswith(("/", os.sep)) or Path(path).name in ("", ".", ".."):  # "new/": a folder, not a file
            raise UsageError(f"{what} {shown} names a folder", "give a file name, e.g. out.json")
        name_len = len(os.fsencode(Path(path).name))
        if name_len > 255:
            raise UsageError(f"{what}: the file name is {name_len} bytes long", "a file name has at most 255 bytes")


def check_output_target(path: str | os.PathLike, what: str = "--json") -> Path:
    """Check, before a run, that ``path`` can be replaced by a regular file written atomically, and return it as a Path:
    the one check of every output gpubench writes; ``what`` is the option. Refused besides :func:`check_output_name`'s:
    a missing or unwritable folder (tried with a temporary file), a folder, anything not a regular file (through links),
    a file-descriptor link, an existing file this user cannot write. Raises UsageError: one line naming the option, the
    path and what would be accepted."""
    shown = safe.term(repr(str(path)), 300)
    check_output_name(path, what)
    regular = "give a regular file's name, e.g. out.json" + (", or --json - for stdout" if what == "--json" else "")
    for hop in _link_hops(path):
        if _FD_LINK.match(os.path.abspath(hop)):
            raise UsageError(f"{what} {shown} is a file-descriptor link ({safe.term(hop, 200)}): saving there would "
                             "replace the file the descriptor has open", regular)
    try:
        p = _write_target(path)
        parent = p.parent if str(p.parent) else Path(".")
        try:
            st = os.stat(p)  # through every link
        except FileNotFoundError:
            st = None
        if st is not None and _stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{what} {shown} is a folder", "give a file name, e.g. out.json")
        if not parent.is_dir():
            raise UsageError(f"{what} {shown}: folder {safe.term(repr(str(parent)), 300)} does not exist")
        if st is not None and not _stat.S_ISREG(st.st_mode):
            kind = ("a character device" if _stat.S_ISCHR(st.st_mode) else "a block device" if _stat.S_ISBLK(st.st_mode)
                    else "a named pipe (FIFO)" if _stat.S_ISFIFO(st.st_mode) else "a socket"
                    if _stat.S_ISSOCK(st.st_mode) else "not a regular file")
            via = f" (through the link to {safe.term(str(p), 200)})" if os.path.islink(path) else ""
            raise UsageError(f"{what} {shown} is {kind}{via}: a save would replace it", regular)
        if st is not None and not os.access(p, os.W_OK):
            raise UsageError(f"{what} {shown} exists and cannot be written (read-only, or another "
                             "user's file)", "remove it or give another name")
        fd, probe = tempfile.mkstemp(prefix=".gpubench-probe-", suffix=".tmp", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except UsageError:
        raise
    except OSError as e:
        raise UsageError(f"{what} {shown}: cannot write there ({e.strerror or type(e).__name__})") from None
    return Path(path)


check_output_path = check_output_target  # the name the plot and report commands call


def write_json_atomic(data: dict, path: str | os.PathLike, what: str = "result") -> Path:
    """Write ``data`` as JSON atomically (:func:`_replace_atomically`); a symbolic link's target is replaced, the link
    kept. Raises ValueError: data holds NaN or infinity (not JSON); nothing is written; MachineError: the write failed
    (full disk, read-only target...); the message names the path."""
    p = _write_target(path)
    text = json.dumps(data, indent=1, allow_nan=False)
    try:  # checked before the run; checked again here, as the target may have changed since
        st = os.stat(p)
    except OSError:
        st = None
    if st is not None and not _stat.S_ISREG(st.st_mode):
        raise MachineError(f"could not save {what} to {str(p)!r}: it became a device, pipe, socket or folder "
                           "during the run; nothing was replaced")
    return _replace_atomically((text + "\n").encode(), p, f"could not save {what} to {str(p)!r}")


def _replace_atomically(data: bytes, p: Path, failed: str) -> Path:
    """``data`` into a temporary file beside ``p``, mode 0666 less the umask, fsync, then rename over
    ``p``. On failure the temporary file is removed, ``p`` is left as it was, and MachineError says
    ``failed`` with the reason."""
    parent = p.parent if str(p.parent) else Path(".")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".gpubench-", suffix=".tmp", dir=parent)
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        tmp = None
    except OSError as e:
        raise MachineError(f"{failed}: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return p


def write_bytes_atomic(data: bytes, path: str | os.PathLike, what: str = "file", option: str = "-o") -> Path:
    """Write ``data`` to ``path`` atomically, as :func:`write_json_atomic` does for JSON. Raises UsageError: the target
    is not a regular file (:func:`check_output_target`; ``option`` names it); MachineError: the write failed; the
    message names ``what`` and the path."""
    check_output_target(path, option)
    p = _write_target(path)
    return _replace_atomically(data, p, f"could not write {what} to {str(p)!r}")


STDOUT = "-"  # --json - : the result goes to standard output (a file named "-" is ./-)


def write_json_stdout(data: dict) -> None:
    """Write ``data`` as JSON to standard output, with the same text a file gets. Raises ValueError: data holds NaN or
    infinity (not JSON); nothing is written; MachineError: stdout is closed or its reader went away (a broken pipe)."""
    text = json.dumps(data, indent=1, allow_nan=False)
    if sys.stdout is None:  # started with standard output closed (`gpubench env --json - >&-`)
        raise MachineError("could not write the result to standard output: it is closed")
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except (OSError, ValueError) as e:
        raise MachineError(f"could not write the result to standard output: {getattr(e, 'strerror', None) or e}") from None


def save(result: Result, path: str | os.PathLike) -> Path:
    """Write ``result`` as JSON atomically (see :func:`write_json_atomic`); to standard output when ``path`` is "-"
    (:data:`STDOUT`). Raises MachineError: the write failed (full disk, read-only target...); the message names the
    path."""
    if str(path) == STDOUT:
        write_json_stdout(result.to_dict())
        return Path(STDOUT)
    return write_json_atomic(result.to_dict(), path, "result")


SCHEMA_FILE = "result-v1.schema.json"  # in gpubench/schemas/, shipped in the wheel


PARAMS_COMMENT = "params of the plug-in "  # marks the schema's entry for one plug-in's params


def shipped_schema() -> dict:
    """The JSON Schema file shipped in the package (draft 2020-12), as it is: what :func:`save`
    writes, with the params of gpubench's own plug-ins."""
    from importlib import resources

    return json.loads((resources.files("gpubench") / "schemas" / SCHEMA_FILE).read_text(encoding="utf-8"))


def schema_with(plugins) -> dict:
    """The shipped schema with one ``allOf`` entry per plug-in of ``plugins`` that declares
    :attr:`~gpubench.core.plugin.Plugin.params_schema` (in place of the shipped file's own)."""
    schema = shipped_schema()
    entries = [e for e in schema.get("allOf", []) if not str(e.get("$comment", "")).startswith(PARAMS_COMMENT)]
    for p in sorted(plugins, key=lambda p: p.name):
        if not p.params_schema:
            continue
        params = {"type": "object", "properties": dict(p.params_schema["properties"]),
                  "required": list(p.params_schema.get("required", [])), "additionalProperties": False}
        entries.append({"$comment": PARAMS_COMMENT + p.name,
                        "if": {"properties": {"command": {"const": p.name}}, "required": ["command"]},
                        "then": {"properties": {"records": {"items": {"properties": {"params": params}}}}}})
    schema["allOf"] = entries
    return schema


def json_schema() -> dict:
    """The JSON Schema (draft 2020-12) of what :func:`save` writes for the plug-ins installed here."""
    from gpubench.core import registry

    return schema_with(registry.plugins().values())


def check_input_name(path: str | os.PathLike, what: str = "a gpubench result") -> None:
    """Refuse an empty input name before it becomes a Path: ``Path("")`` is the current folder. Raises UsageError:
    ``path`` is empty or blank."""
    if not str(path).strip():
        raise UsageError(f"a file name is empty: {str(path)!r}", f"give {what}, e.g. result.json")


def read_bounded(path: str | os.PathLike, what: str = "a gpubench result") -> bytes:
    """The bytes of ``path``, at most MAX_LOAD_BYTES (64 MiB), never blocking on a named pipe. Raises UsageError: an
    empty name (``Path("")`` is the current folder), unreadable, a device or socket, larger than MAX_LOAD_BYTES, or a
    named pipe that nothing had written to (it is not waited for); one line naming the file."""
    check_input_name(path, what)
    p = Path(path)
    name = str(p)
    try:
        st = p.stat()
        if _stat.S_ISCHR(st.st_mode) or _stat.S_ISBLK(st.st_mode) or _stat.S_ISSOCK(st.st_mode):
            raise UsageError(f"cannot read {name}: a device or socket, not a file")
        if st.st_size > MAX_LOAD_BYTES:
            raise UsageError(f"{name} is {st.st_size} bytes, too large for {what}")
        fifo = _stat.S_ISFIFO(st.st_mode)
        if fifo:  # <(cmd) works; a named pipe nobody writes to reads as empty, no wait
            fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
            os.set_blocking(fd, True)
            f = os.fdopen(fd, "rb")
        else:
            f = open(p, "rb")
        with f:
            raw = f.read(MAX_LOAD_BYTES + 1)
    except OSError as e:
        raise UsageError(f"cannot read {name}: {e.strerror or e}") from None
    if fifo and not raw:  # not "empty" or "no [[expect]] tables": nothing was there to read
        raise UsageError(f"{name} is a named pipe that nothing had written to",
                         f"give {what} as a file, or start its writer first")
    if len(raw) > MAX_LOAD_BYTES:
        raise UsageError(f"{name} is over {MAX_LOAD_BYTES} bytes, too large for {what}")
    return raw


def read_json(path: str | os.PathLike, expected: str = "a file saved by --json") -> Any:
    """Read a JSON file of at most MAX_LOAD_BYTES (64 MiB) and about MAX_JSON_ITEMS values. Raises UsageError:
    unreadable, a device or socket, too large, too many values, nested deeper than MAX_DEPTH (64), empty (a named pipe
    with no writer too) or not JSON; one line naming the file."""
    name = safe.term(str(Path(path)), 200)
    raw = read_bounded(path)
    if not raw.strip():
        raise UsageError(f"{name} is empty", f"expected {expected}")
    items = raw.count(b",") + raw.count(b"[") + raw.count(b"{")
    if items > MAX_JSON_ITEMS:
        raise UsageError(f"{name} holds about {items} JSON values, more than the {MAX_JSON_ITEMS} "
                         f"a gpubench file may hold", f"expected {expected}")
    check_depth(json_depth(raw), name)
    try:
        return json.loads(raw, object_pairs_hook=no_repeated_keys)
    except RecursionError:  # not reached after check_depth; kept so no input is ever exit 3
        check_depth(MAX_DEPTH + 1, name)
    except RepeatedKey as e:
        raise UsageError(f"{name} repeats the key {safe.term(repr(e.args[0]), 80)} in one object",
                         f"expected {expected}; a second value would silently replace the first") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"{name} is not valid JSON ({first_line(e)[:80]})") from None


class RepeatedKey(ValueError):
    """A JSON object names one key twice; ``args[0]`` is the key."""


def no_repeated_keys(pairs: list) -> dict:
    """json's object_pairs_hook for every JSON gpubench reads (files, net's requests): a dict, unless a key
    repeats (RFC 8259 §4 leaves its meaning open). Raises RepeatedKey."""
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set = set()
        for k, _ in pairs:
            if k in seen:
                raise RepeatedKey(k)
            seen.add(k)
    return d


def load(path: str | os.PathLike) -> Result:
    """Read a saved result, refusing files that are not gpubench results. Raises UsageError: unreadable, too large, too
    deep, not JSON, not a result, a newer schema, or a field of the wrong type or out of range (:func:`check_result`);
    one line naming it."""
    return Result.from_dict(read_json(path), source=str(path))


# -- the one validator of loaded files: the published schema, plus no Infinity, NaN or 1e400, no
# integer beyond 64 bits, no bool for an integer; a bad field is one UsageError naming its JSON
# Pointer (RFC 6901). Written out: jsonschema is no runtime dependency and ~50x slower.


def pointer_join(pointer: str, key: object) -> str:
    """``pointer`` + one reference token, escaped as RFC 6901 says ("~" -> "~0", "/" -> "~1")."""
    return f"{pointer}/{str(key).replace('~', '~0').replace('/', '~1')}"


def _shown(v: object) -> str:
    """A found value for a message: JSON-like, cut short, control characters escaped."""
    if isinstance(v, bool) or v is None:
        text = json.dumps(v)
    elif isinstance(v, int) and abs(v) >= 10**15:
        text = f"(a {len(str(abs(v)))}-digit integer)"
    elif isinstance(v, int):
        text = str(v)
    elif isinstance(v, (float, str)):
        text = repr(v)
    elif isinstance(v, (dict, list)):
        text = "an object" if isinstance(v, dict) else "an array"
    else:
        text = type(v).__name__
    return safe.term(text, 60)


def bad_field(source: str, pointer: str, value: object, accepted: str) -> UsageError:
    """The one error of a bad field: "FILE: /records/3/nbytes is inf; expected an integer 0..N"."""
    return UsageError(f"{safe.term(source, 200)}: {safe.term(pointer or '/', 120)} is {_shown(value)}",
                      f"expected {accepted}")


def missing_field(source: str, pointer: str, accepted: str) -> UsageError:
    """The error of a required field that is absent: "FILE: /records is missing; expected ..."."""
    return UsageError(f"{safe.term(source, 200)}: {safe.term(pointer or '/', 120)} is missing", f"expected {accepted}")


def _require(d: dict, fields: dict[str, str], source: str, pointer: str) -> None:
    """Every key of ``fields`` (name -> what it holds) is present in ``d``: the schema's ``required``."""
    if fields.keys() <= d.keys():
        return
    for k, what in fields.items():
        if k not in d:
            raise missing_field(source, pointer_join(pointer, k), what)


def check_int(v: object, source: str, pointer: str, lo: int = 0, hi: int = MAX_INT) -> int:
    """``v`` as an int in lo..hi (a JSON integer; not a bool, not a float such as 1e400)."""
    if type(v) is not int or not (lo <= v <= hi):
        raise bad_field(source, pointer, v, f"an integer {lo}..{hi}")
    return v


def check_number(v: object, source: str, pointer: str, lo: float = 0.0, hi: float = 1.8e308,
                 lo_open: bool = False) -> float:
    """``v`` as a finite float in [lo, hi] (or (lo, hi] with ``lo_open``); an int is accepted when
    a float holds it (not a 400-digit one), a bool is not."""
    ok = False
    if type(v) is float or (type(v) is int and _MIN_INT <= v <= MAX_INT):
        x = float(v)
        ok = math.isfinite(x) and (x > lo if lo_open else x >= lo) and x <= hi
    if not ok:
        rng = f"{'>' if lo_open else '>='} {lo:g}" + (f" and <= {hi:g}" if hi < 1e308 else "")
        raise bad_field(source, pointer, v, f"a finite number {rng}")
    return float(v)  # type: ignore[arg-type]


def check_str(v: object, source: str, pointer: str, *, allow_none: bool = False, nonempty: bool = False,
              choices: tuple | None = None) -> str | None:
    """``v`` as a string (or None with ``allow_none``), optionally non-empty or one of ``choices``."""
    if v is None and allow_none:
        return None
    if not isinstance(v, str) or (nonempty and not v) or (choices is not None and v not in choices):
        what = f"one of {', '.join(map(str, choices))}" if choices else "a non-empty string" if nonempty else "a string"
        raise bad_field(source, pointer, v, what + (" or null" if allow_none else ""))
    return v


def check_obj(v: object, source: str, pointer: str, *, allow_none: bool = False) -> dict:
    """``v`` as a JSON object (None -> {} with ``allow_none``), its values checked by :func:`check_values`."""
    if v is None and allow_none:
        return {}
    if not isinstance(v, dict):
        raise bad_field(source, pointer, v, "an object" + (" or null" if allow_none else ""))
    check_values(v, source, pointer)
    return v


def check_values(v: object, source: str, pointer: str) -> None:
    """Every number inside ``v`` (an open part: spec, timing, extra, env) is finite and fits 64 bits: walked
    without JSON Pointers, and walked again with them only to name the first bad number."""
    todo: list[Any] = [v]  # JSON values of any type: each is told apart by its type() below
    for x in todo:
        t = type(x)
        if t is dict:
            todo.extend(x.values())
        elif t is list:
            todo.extend(x)
        elif (t is float and x - x != 0.0) or (t is int and not _MIN_INT <= x <= MAX_INT):  # x - x: nan for inf, nan
            break
    else:
        return
    named: list[tuple[Any, str]] = [(v, pointer)]
    while named:
        x, ptr = named.pop()
        t = type(x)
        if t is float and not math.isfinite(x):
            raise bad_field(source, ptr, x, "a finite number")
        if t is int and not _MIN_INT <= x <= MAX_INT:
            raise bad_field(source, ptr, x, "an integer that fits 64 bits")
        if t is dict:
            named.extend((val, pointer_join(ptr, k)) for k, val in x.items())
        elif t is list:
            named.extend((val, f"{ptr}/{i}") for i, val in enumerate(x))


_SCALARS = (str, int, float, bool, type(None))


def check_schema_version(where: str, version: object, newest: int, kind: str = "") -> int:
    """``version`` as an int from 1 to ``newest`` (a result's or a bundle's ``schema_version``). Raises UsageError: not
    an integer >= 1 ("unknown"), or newer than ``newest`` ("upgrade gpubench")."""
    if type(version) is not int or version < 1:
        raise UsageError(f"{where} has an unknown {kind}schema version {_shown(version)}")
    if version > newest:
        raise UsageError(f"{where} has {kind}schema version {version}, newer than this gpubench reads "
                         f"({newest})", "upgrade gpubench")
    return version


MIN_SAMPLE_S = 1e-12  # shortest sample of a record that moves bytes, seconds: every rate is finite


# the schema's $defs/record "required" (telemetry is optional: files from before it lack it)
_RECORD_REQUIRED = {"params": "an object of parameters", "metric": "bandwidth or time",
                    "nbytes": "an integer number of bytes", "samples_s": "an array of seconds",
                    "reps": "an integer >= 1", "error": "a string or null", "extra": "an object"}
# the schema's top-level "required", besides schema, schema_version and command (checked first)
_RESULT_REQUIRED = {"gpubench_version": "a string", "created": "an ISO 8601 time", "argv": "an array of strings",
                    "spec": "an object", "timing": "an object", "env": "an object", "partial": "true or false",
                    "interrupted_by": "null, SIGINT or SIGTERM", "records": "an array of records"}
# the schema's "created" pattern
_CREATED = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})\Z")


_RECORD_KEYS = frozenset(_RECORD_REQUIRED) | {"telemetry"}
_METRICS = ("bandwidth", "time")


def check_record(d: object, source: str = "result", pointer: str = "") -> "Record":
    """Check one record (the schema's ``$defs/record``) and build it. Raises UsageError: naming the first bad field,
    then a missing required one."""
    if not isinstance(d, dict):
        raise bad_field(source, pointer, d, "a record object")
    if not d.keys() <= _RECORD_KEYS:
        k = min(d.keys() - _RECORD_KEYS, key=str)
        raise bad_field(source, pointer_join(pointer, k), d[k],
                        "no such field (a record has params, metric, nbytes, samples_s, reps, error, extra, telemetry)")
    if "params" not in d:
        raise missing_field(source, f"{pointer}/params", "an object of parameters")
    params = d["params"]
    if not isinstance(params, dict):
        raise bad_field(source, f"{pointer}/params", params, "an object of parameters")
    for v in params.values():
        t = type(v)
        if not (t is str or v is None or t is bool or (t is float and v - v == 0.0)
                or (t is int and _MIN_INT <= v <= MAX_INT)):  # name the first value that is no scalar, else no number
            for k, x in params.items():
                if not isinstance(x, _SCALARS):
                    raise bad_field(source, pointer_join(f"{pointer}/params", k), x, "a string, number, boolean or null")
            check_values(params, source, f"{pointer}/params")
    metric = check_str(d.get("metric", "bandwidth"), source, f"{pointer}/metric", choices=_METRICS)
    nbytes = check_int(d.get("nbytes", 0), source, f"{pointer}/nbytes")
    reps = check_int(d.get("reps", 1), source, f"{pointer}/reps", 1, MAX_REPS)
    sp = f"{pointer}/samples_s"
    samples = d.get("samples_s", [])
    if not isinstance(samples, list):
        raise bad_field(source, sp, samples, "an array of seconds")
    floor = MIN_SAMPLE_S if nbytes else 0.0  # nbytes / seconds must be a finite rate: 5e-324 s makes it inf
    if samples and not (set(map(type, samples)) == {float} and math.isfinite(sum(samples)) and min(samples) >= floor):
        # not all floats in range (or a sum that overflows): each checked by itself, an int taken as a float
        samples = [check_number(x, source, f"{sp}/{i}") for i, x in enumerate(samples)]
        if min(samples) < floor:
            i = samples.index(min(samples))
            raise bad_field(source, f"{sp}/{i}", samples[i], f"seconds >= {MIN_SAMPLE_S:g} (a sample that moves "
                            "bytes; no clock gpubench uses resolves less than a nanosecond)")
    if samples and not nbytes and metric == "bandwidth" and "nbytes" in d and "metric" in d:  # else: named missing below
        raise bad_field(source, f"{pointer}/nbytes", nbytes,
                        "at least 1 in a bandwidth record with samples (a sample's rate is nbytes / seconds)")
    error = check_str(d.get("error"), source, f"{pointer}/error", allow_none=True)
    extra = check_obj(d.get("extra", {}), source, f"{pointer}/extra")
    if extra.get("noise_pct") is not None:  # the fields of extra the schema declares: timing's facts
        check_number(extra["noise_pct"], source, f"{pointer}/extra/noise_pct")
    if "stopped_by" in extra:
        check_str(extra["stopped_by"], source, f"{pointer}/extra/stopped_by", choices=STOP_REASONS)
    _check_drawn(extra, source, f"{pointer}/extra")
    _require(d, _RECORD_REQUIRED, source, pointer)
    tele = d.get("telemetry")
    telemetry = None if tele is None else dict(check_telemetry(tele, source, f"{pointer}/telemetry"))
    return Record(params=dict(params), metric=metric, nbytes=nbytes, samples_s=list(samples),  # type: ignore[arg-type]
                  reps=reps, error=error, extra=dict(extra), telemetry=telemetry)


# what plot, report and compare draw or scale by, besides the samples (check_values has held every
# number in extra finite), each >= 0: a peak (0 or null: unknown) and a collective's busbw factor
# (0 for one rank) or null, net's per-interval bytes and times, merge's per-pair statistics or null
DRAWN_SCALARS = ("peak_bytes_per_s", "busbw_factor")
DRAWN_ARRAYS = ("interval_bytes", "interval_start_s", "interval_end_s")
PAIR_STATS = ("n", "q25", "q50", "q75", "hmean", "hstd", "min", "max")


def _check_drawn(extra: dict, source: str, pointer: str) -> None:
    """Hold the figures of ``extra`` that are drawn (:data:`DRAWN_SCALARS`, :data:`DRAWN_ARRAYS`,
    :data:`PAIR_STATS` of ``pairs``) to >= 0. Raises UsageError: naming the first one out of range."""
    for k in DRAWN_SCALARS:
        if extra.get(k) is not None:
            check_number(extra[k], source, f"{pointer}/{k}")
    for k in DRAWN_ARRAYS:
        if k in extra:
            vs = extra[k]
            if not isinstance(vs, list):
                raise bad_field(source, f"{pointer}/{k}", vs, "an array of numbers >= 0")
            for j, v in enumerate(vs):
                if type(v) not in (int, float) or v < 0:
                    check_number(v, source, f"{pointer}/{k}/{j}")
    pairs = extra.get("pairs")
    for j, pair in enumerate(pairs if isinstance(pairs, list) else []):
        for k in PAIR_STATS if isinstance(pair, dict) else ():
            if pair.get(k) is not None:
                check_number(pair[k], source, f"{pointer}/pairs/{j}/{k}")


# a params schema's JSON types -> the Python types json.loads gives for them (a bool is no number)
_PARAM_TYPES: dict[str, frozenset] = {
    "integer": frozenset({int}), "number": frozenset({int, float}), "string": frozenset({str}),
    "boolean": frozenset({bool}), "null": frozenset({type(None)}),
}
_PARAM_WORDS = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "true or false",
                "null": "null"}


def _rules_of(params: dict) -> tuple[frozenset, dict[str, tuple]]:
    """The rules of a params schema: (required names, {name: (its Python types, their words, minimum, maximum)})."""
    rules = {}
    for k, v in params.get("properties", {}).items():
        t = v.get("type", list(_PARAM_TYPES))
        kinds = tuple(t) if isinstance(t, list) else (t,)
        rules[k] = (frozenset().union(*(_PARAM_TYPES.get(x, frozenset()) for x in kinds)),
                    " or ".join(_PARAM_WORDS.get(x, str(x)) for x in kinds), v.get("minimum"), v.get("maximum"))
    return frozenset(params.get("required", ())), rules


@functools.lru_cache(maxsize=64)
def params_rules(command: str) -> tuple[frozenset, dict[str, tuple]] | None:
    """The params rules (:func:`_rules_of`) of ``command``'s records: the shipped schema's entry (the one "params of
    the plug-in NAME"), else the installed plug-in's ``params_schema``; None where neither says."""
    for e in shipped_schema().get("allOf", []):
        if e.get("$comment") == PARAMS_COMMENT + command:
            return _rules_of(e["then"]["properties"]["records"]["items"]["properties"]["params"])
    from gpubench.core import registry

    plugin = registry.find(command)
    if plugin is None or not plugin.params_schema:
        return None
    return _rules_of(dict(plugin.params_schema))


def check_params(params: dict, rules: tuple[frozenset, dict[str, tuple]], source: str, pointer: str) -> None:
    """A record's params against its command's rules (required, no other, type, minimum / maximum). Raises UsageError:
    naming the first param that is not the command's, or of the wrong type or range, then a missing one, by its JSON
    Pointer."""
    required, allowed = rules
    keys = params.keys()
    if not keys <= allowed.keys():
        k = sorted(map(str, keys - allowed.keys()))[0]
        raise bad_field(source, pointer_join(pointer, k), params[k],
                        f"no such param (this command's records have {', '.join(sorted(allowed))})")
    for k, v in params.items():
        types, words, lo, hi = allowed[k]
        if type(v) not in types:
            raise bad_field(source, pointer_join(pointer, k), v, words)
        if type(v) is not str and (lo is not None and v < lo or hi is not None and v > hi):
            rng = f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"{lo}..{hi}"
            raise bad_field(source, pointer_join(pointer, k), v, f"a number {rng}")
    if not required <= keys:
        raise missing_field(source, pointer_join(pointer, sorted(required - keys)[0]),
                            f"the param (this command's records have {', '.join(sorted(required))})")


def check_command(v: object, source: str, pointer: str) -> str:
    """``v`` as the name of the command that made a result (:data:`gpubench.core.plugin.NAME`),
    installed here or not; else UsageError."""
    from gpubench.core.plugin import NAME

    if not isinstance(v, str) or not NAME.match(v):
        raise bad_field(source, pointer, v, "a command name (lower case letters, digits, '-' and '_', a letter first)")
    return v


def _check_bool(v: object, source: str, pointer: str, allow_none: bool = False) -> None:
    if type(v) is not bool and not (allow_none and v is None):
        raise bad_field(source, pointer, v, "true, false or null" if allow_none else "true or false")


def _strings(v: object, source: str, pointer: str) -> None:
    """Check the array of strings ``v``."""
    for i, x in enumerate(_check_list(v, source, pointer, "an array of strings")):
        check_str(x, source, f"{pointer}/{i}")


# a field's kind in a part's table (_check_part): a name here, or a check(v, source, pointer) of its own
_KINDS: dict[str, Any] = {
    "str": lambda v, s, p: check_str(v, s, p, allow_none=True), "str!": check_str, "int!": check_int,
    "int": lambda v, s, p: v is None or check_int(v, s, p), "i64": lambda v, s, p: v is None or check_int(v, s, p, _MIN_INT),
    "i64!": lambda v, s, p: check_int(v, s, p, _MIN_INT), "num": lambda v, s, p: v is None or check_number(v, s, p),
    "bool": _check_bool, "bool?": lambda v, s, p: _check_bool(v, s, p, allow_none=True), "strs": _strings,
}


def _check_fields(obj: dict, fields: dict[str, Any], source: str, pointer: str) -> dict:
    """The present fields of ``obj`` checked in the order of ``fields``: name -> kind (:data:`_KINDS`, or a check of
    its own), or (kind, what it holds) for a field the schema requires, named missing after the checks."""
    missing = None
    for k, kind in fields.items():
        check = kind[0] if type(kind) is tuple else kind
        if k in obj:
            (_KINDS[check] if type(check) is str else check)(obj[k], source, f"{pointer}/{k}")
        elif missing is None and check is not kind:
            missing = missing_field(source, f"{pointer}/{k}", kind[1])
    if missing is not None:
        raise missing
    return obj


def _check_part(v: object, fields: dict[str, Any], source: str, pointer: str) -> dict:
    """``v`` as an object (:func:`check_obj`) of ``fields`` (:func:`_check_fields`)."""
    return _check_fields(check_obj(v, source, pointer), fields, source, pointer)


def _array_of(fields: dict[str, Any], what: str) -> Any:
    """The kind of an array of parts of ``fields``."""
    return lambda v, s, p: [_check_part(x, fields, s, f"{p}/{i}") for i, x in enumerate(_check_list(v, s, p, what))]


def _map_of(kind: str) -> Any:
    """The kind of an object of any names whose values are of ``kind``."""
    return lambda v, s, p: [_KINDS[kind](x, s, pointer_join(p, k)) for k, x in check_obj(v, s, p).items()]


@functools.lru_cache(maxsize=1)
def telemetry_reasons() -> tuple[str, ...]:
    """The clock-event reason names a telemetry block may hold: the published schema's enum."""
    return tuple(shipped_schema()["$defs"]["telemetry"]["properties"]["reasons"]["items"]["enum"])


def _check_stat3(v: object, source: str, pointer: str) -> None:
    if v is not None and (type(v) is not dict or v.keys() != {"min", "median", "max"}):
        raise bad_field(source, pointer, v, "null or an object of min, median and max")
    for s in ("min", "median", "max") if v is not None else ():
        check_number(v[s], source, f"{pointer}/{s}", lo=-1.8e308)  # type: ignore[index]


def _check_reasons(v: object, source: str, pointer: str) -> None:
    known, seen = telemetry_reasons(), set()
    for i, x in enumerate(_check_list(v, source, pointer, "an array of clock-event reasons")):
        if type(x) is not str or x not in known:
            raise bad_field(source, f"{pointer}/{i}", x, "one of " + ", ".join(known))
        if x in seen:
            raise bad_field(source, f"{pointer}/{i}", x, "a reason not listed before it (each is listed once)")
        seen.add(x)


def _check_pcie(v: object, source: str, pointer: str) -> None:
    if v is not None and (type(v) is not dict or v.keys() != {"gen", "width"}):
        raise bad_field(source, pointer, v, "null or an object of gen and width")
    for k in ("gen", "width") if v is not None else ():
        check_int(v[k], source, f"{pointer}/{k}", _MIN_INT)  # type: ignore[index]


# the schema's $defs/telemetry (docs/conditions.md)
_TELEMETRY: dict[str, Any] = {
    "n": ("int!", "an integer >= 0 (sample sets)"),
    "interval_s": (lambda v, s, p: check_number(v, s, p, lo_open=True), "a number > 0 (seconds)"),
    "devices": lambda v, s, p: [check_int(x, s, f"{p}/{i}")
                                for i, x in enumerate(_check_list(v, s, p, "an array of CUDA ordinals"))],
    **dict.fromkeys(("sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c"), (_check_stat3, "null or {min, median, max}")),
    "reasons": (_check_reasons, "an array of clock-event reasons"), "pcie": (_check_pcie, "null or {gen, width}"),
    "pcie_replay_delta": ("i64", "an integer or null"), "nvlink_errors_delta": ("i64", "an integer or null"),
    "other_processes": "int",
}


def check_telemetry(t: object, source: str, pointer: str) -> dict:
    """Check a record's ``telemetry`` block (:data:`_TELEMETRY`). Raises UsageError: the first bad field, by its JSON
    Pointer, then a missing required one."""
    t = check_obj(t, source, pointer)
    for k in t:
        if k not in _TELEMETRY:
            raise bad_field(source, pointer_join(pointer, k), t[k], "no such field (a telemetry block has "
                            + ", ".join(sorted(_TELEMETRY)) + ")")
    return _check_fields(t, _TELEMETRY, source, pointer)


DRIVER_CHECK_STATUS = ("ok", "minor-version-compatibility", "driver-too-old")  # gpubench.support.driver_check
_DRIVER_CHECK = {"status": (lambda v, s, p: check_str(v, s, p, choices=DRIVER_CHECK_STATUS), "a string or null"),
                 "warning": ("str", "a string or null"), "driver_cuda": ("str!", "a string or null"),
                 "runtime_cuda": ("str!", "a string or null"), "nvidia_driver": ("str", "a string or null"),
                 "min_driver": ("str", "a string or null")}
_GPU_FIELDS = {"name": "str", "uuid": "str", "pci_bus_id": "str", "memory_total_bytes": "int",
               "memory_free_bytes": "int", "pcie_gen": "int", "pcie_width": "int", "pcie_gen_max": "int",
               "pcie_width_max": "int", "pcie_peak_bytes_per_s": "num", "nvlink_links_up": "int",
               "nvlink_version": "int", "nvlink_bytes_per_s_per_link": "num",
               "numa_node": lambda v, s, p: v is None or check_int(v, s, p, -1), "cpu_affinity": "str"}


def _check_gpus(v: object, source: str, pointer: str) -> None:
    """``env.gpus``: each an index (>= 0) and :data:`_GPU_FIELDS`."""
    for i, g in enumerate(_check_list(v, source, pointer, "an array of GPUs")):
        check_int(check_obj(g, source, f"{pointer}/{i}").get("index"), source, f"{pointer}/{i}/index")
        _check_part(g, _GPU_FIELDS, source, f"{pointer}/{i}")


def _check_counter(v: object, source: str, pointer: str, depth: int = 0) -> None:
    """A health counter: an integer >= 0, a bool, "unsupported", null, or an object of those, two deep."""
    if v is None or v == "unsupported" or type(v) is bool:
        return
    if type(v) is int:
        check_int(v, source, pointer)
        return
    if isinstance(v, dict) and depth < 2:
        for k, x in v.items():
            _check_counter(x, source, pointer_join(pointer, k), depth + 1)
        return
    raise bad_field(source, pointer, v, 'an integer >= 0, true or false, "unsupported" or null'
                    + (", or an object of those" if depth < 2 else ""))


def _check_counters(v: object, source: str, pointer: str) -> None:
    for k, c in check_obj(v, source, pointer, allow_none=True).items():
        _check_counter(c, source, pointer_join(pointer, k))


def _check_xids(v: object, source: str, pointer: str) -> None:
    if v is not None and v != "unsupported":
        _array_of({"index": "int", "xid": "int"}, 'an array of events, "unsupported" or null')(v, source, pointer)


_PREFLIGHT_GPU = {"index": ("i64!", "an integer"), "busy": ("strs", "an array of strings"),
                  "other_processes": _array_of({}, "an array of processes"),
                  **dict.fromkeys(("utilization_gpu_pct", "utilization_memory_pct", "temperature_c", "slowdown_temp_c"),
                                  "i64")}
# env: part -> its fields (the schema's $defs/env; docs/results.md): core/env.py writes host, versions, cuda, nvml,
# gpus and topology, the driver preflight (core/env.idle_check), numa, telemetry and health (core/health.py)
_ENV_PARTS: dict[str, Any] = {
    "host": {"hostname": "str", "os": "str", "python": "str", "cpu_count": "int", "cpus_usable": "int",
             "cpu_model": "str", "numa_nodes": "int", "mem_total_bytes": "int", "mem_available_bytes": "int"},
    "cuda": {"driver_version": "str", "runtime_version": "str", "nvrtc_version": "str", "device_count": "int",
             "error": "str", "driver_check": lambda v, s, p: v is None or _check_part(v, _DRIVER_CHECK, s, p)},
    "nvml": {"driver_version": "str", "error": "str"},
    "versions": _map_of("str"),
    "gpus": _check_gpus,
    "topology": _map_of("str!"),
    "preflight": {"idle": ("bool?", "true, false or null"), "warnings": ("strs", "an array of strings"),
                  "error": ("str", "a string or null"),
                  "gpus": (_array_of(_PREFLIGHT_GPU, "an array of GPUs"), "an array of GPUs")},
    "numa": {"policy": ("str!", "a string"),
             "bindings": (_array_of({"node": ("i64", "a node number or null"), "cpus": ("str", "a CPU list or null"),
                                     "reason": ("str!", "a string")}, "an array of bindings"), "an array of bindings")},
    "telemetry": {"enabled": ("bool", "true or false"), "interval_s": ("num", "a number or null"),
                  "error": ("str", "a string or null")},
    "nodes": lambda v, s, p: check_int(v, s, p, 1),
    "health": {"gpus": _array_of({"index": "int", "uuid": "str", "before": _check_counters, "after": _check_counters},
                                 "an array of GPUs"),
               "xid_events": _check_xids, "error": "str"},
}


def check_env(env: object, source: str, pointer: str) -> dict:
    """Check a result's ``env`` (the schema's ``$defs/env``). Raises UsageError: the first bad field, by its JSON
    Pointer."""
    env = check_obj(env, source, pointer)
    for part, fields in _ENV_PARTS.items():
        if part in env:
            if isinstance(fields, dict):
                _check_part(env[part], fields, source, f"{pointer}/{part}")
            else:
                fields(env[part], source, f"{pointer}/{part}")
    return env


def _check_list(v: object, source: str, pointer: str, what: str) -> list:
    if type(v) is not list:
        raise bad_field(source, pointer, v, what)
    return v


def check_result(d: object, source: str = "result", pointer: str = "") -> "Result":
    """Check a parsed result (schema version 1 after migration) field by field and build it. Raises UsageError: not a
    gpubench result; an unknown or newer schema version; or the first bad field, named by its JSON Pointer with what
    would be accepted (present fields are checked first, then the required ones that are missing)."""
    where = safe.term(source, 200) + (f" at {pointer}" if pointer else "")
    if not isinstance(d, dict) or d.get("schema") != SCHEMA:
        raise UsageError(f"{where} is not a gpubench result", "expected a file saved by --json")
    version = check_schema_version(where, d.get("schema_version"), SCHEMA_VERSION)
    while version < SCHEMA_VERSION:
        d = _MIGRATIONS[version](d)
        version += 1
    assert isinstance(d, dict)
    if "command" not in d:
        raise UsageError(f"{where} is a malformed gpubench result: it names no command")
    command = check_command(d["command"], source, pointer_join(pointer, "command"))
    argv = d.get("argv", [])
    _strings(argv, source, pointer_join(pointer, "argv"))
    partial = d.get("partial", False)
    if not isinstance(partial, bool):
        raise bad_field(source, pointer_join(pointer, "partial"), partial, "true or false")
    rp = pointer_join(pointer, "records")
    records = _check_list(d.get("records", []), source, rp, "an array of records")
    if len(records) > MAX_RECORDS:
        raise bad_field(source, rp, records, f"at most {MAX_RECORDS:,} records (it holds {len(records):,})")
    spec = check_obj(d.get("spec", {}), source, pointer_join(pointer, "spec"))
    timing = check_obj(d.get("timing", {}), source, pointer_join(pointer, "timing"))
    env = check_env(d.get("env", {}), source, pointer_join(pointer, "env"))
    checked = [check_record(r, source, f"{rp}/{i}") for i, r in enumerate(records)]
    rules = params_rules(command)
    if rules is not None:
        for i, r in enumerate(checked):
            check_params(r.params, rules, source, f"{rp}/{i}/params")
    interrupted_by = check_str(d.get("interrupted_by"), source, pointer_join(pointer, "interrupted_by"),
                               allow_none=True, choices=("SIGINT", "SIGTERM"))
    failed_by = check_str(d.get("failed_by"), source, pointer_join(pointer, "failed_by"), allow_none=True,
                          nonempty=True)
    created = check_str(d.get("created", ""), source, pointer_join(pointer, "created"))
    if "created" in d and not _CREATED.match(created):  # type: ignore[arg-type]
        raise bad_field(source, pointer_join(pointer, "created"), created, "an ISO 8601 time, e.g. 2026-11-30T01:00:00+00:00")
    version_text = check_str(d.get("gpubench_version", ""), source, pointer_join(pointer, "gpubench_version"))
    unknown = set(d) - set(_RESULT_REQUIRED) - {"schema", "schema_version", "command", "failed_by"}
    if unknown:
        k = sorted(map(str, unknown))[0]
        raise bad_field(source, pointer_join(pointer, k), d[k], "no such field (see the published schema, "
                        "gpubench/schemas/result-v1.schema.json)")
    _require(d, _RESULT_REQUIRED, source, pointer)
    if (failed_by is not None or interrupted_by is not None) and not partial:
        # the schema's allOf: a run stopped by a fault or a signal is partial
        which = "failed_by" if failed_by is not None else "interrupted_by"
        raise bad_field(source, pointer_join(pointer, "partial"), partial, f"true, as {which} is set")
    return Result(command=command, spec=dict(spec), timing=dict(timing), env=dict(env), records=checked,
                  partial=partial, interrupted_by=interrupted_by, failed_by=failed_by, argv=list(argv),
                  created=created, gpubench_version=version_text)  # type: ignore[arg-type]


# JSON strings (with their escapes), removed before brackets are counted; unrolled to stay linear
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON text ``raw`` (0 for a scalar), counted on
    the text with strings removed, in O(len(raw)) with NumPy; an upper bound for malformed text."""
    import numpy as np

    text = _JSON_STRING.sub(b'""', raw) if b'"' in raw else raw
    brackets = text.translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    a = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((a == 0x5B) | (a == 0x7B), 1, -1).astype(np.int64)  # [ { open; ] } close
    return max(0, int(np.cumsum(steps).max()))


def check_depth(depth: int, name: str, what: str = "a gpubench file") -> None:
    """Refuse nesting beyond :data:`MAX_DEPTH` (64), before any parser recurses into it."""
    if depth > MAX_DEPTH:
        raise UsageError(f"{safe.term(name, 200)} nests {depth} levels deep, more than the {MAX_DEPTH} "
                         f"{what} may", "a result nests 5 levels, a suite bundle 8")


def object_depth(obj: object) -> int:
    """The nesting depth of a parsed object (dicts and lists), walked without recursion."""
    best = 0
    stack = [(obj, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, (dict, list)):
            best = max(best, d)
            stack.extend((v, d + 1) for v in (x.values() if isinstance(x, dict) else x))
    return best

"""The result model: what every command returns and ``--json`` saves; atomic save and checked load.

JSON layout (schema version 1)::

    {
      "schema": "gpubench.result",        # marks a gpubench file
      "schema_version": 1,
      "command": "copy",                  # the command that made it
      "gpubench_version": "0.1.0",
      "created": "2026-11-30T01:00:00+00:00",
      "argv": ["copy", "--pinned"],
      "spec": {...},                      # the parsed options
      "timing": {...},                    # clock, warm-ups, iteration rule, method notes
      "env": {...},                       # gpubench.core.env.capture()
      "partial": false,                   # true when stopped early; "interrupted_by" names the signal,
                                          # "failed_by" (present only then) the machine fault
      "records": [                        # one per measured point
        {"params": {"direction": "h2d", "memory": "pinned", "device": 0, "nbytes": 4096},
         "metric": "bandwidth",           # "bandwidth" (higher is better) or "time" (lower is better)
         "nbytes": 4096,                  # bytes moved per step; a sample's rate = nbytes / sample
         "samples_s": [1.2e-06, ...],     # raw per-step seconds, every timed sample
         "reps": 16,                      # steps per sample
         "error": null,                   # or one line: why this point has no samples
         "extra": {},                     # command-specific derived values
         "telemetry": {...}}              # GPU state during the point (core/telemetry.py) or null
      ]
    }

The JSON Schema of this layout is ``gpubench/schemas/result-v1.schema.json`` (:func:`json_schema`).
Raw bytes and seconds are kept so GB/s or GiB/s can be derived later. History of the schema:
version 1 (gpubench 0.1.0) is the first. Loading a newer version is refused; older versions are
upgraded through ``_MIGRATIONS``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import stat as _stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpubench import __version__
from gpubench.core.errors import MachineError, UsageError
from gpubench.core.stats import Summary, rates

SCHEMA = "gpubench.result"
SCHEMA_VERSION = 1
# version -> function upgrading a dict of that version to version + 1
_MIGRATIONS: dict[int, Any] = {}
MAX_LOAD_BYTES = 64 * 2**20
# JSON values a file may hold (counted as commas and opening brackets, strings included, so an
# overestimate). A result of a million samples is about 20 MB and a million values; a file of
# 64 MiB of "0," or "[]," would parse into 1-5 GB of Python objects, so it is refused before parsing.
MAX_JSON_ITEMS = 8_000_000


@dataclass
class Record:
    """One measured point.

    Attributes:
        params: what identifies the point (compare pairs records on these), JSON scalars only.
        metric: "bandwidth" (nbytes / seconds, higher is better) or "time" (lower is better).
        nbytes: bytes moved per step (0 for a pure time).
        samples_s: per-step seconds of every timed sample.
        reps: steps per sample.
        error: one line when the point could not be measured (then samples_s is empty).
        extra: derived or command-specific values.
        telemetry: the GPU's state while the point ran (gpubench.core.telemetry), None when off or
            unavailable.
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
        """Each sample's bandwidth in bytes per second, ``nbytes / seconds`` (:func:`stats.rates`),
        the one place the division is written for every report, comparison, plot and check.

        Raises:
            ValueError: nbytes is 0, or a sample that is not > 0.
        """
        if not self.nbytes:
            raise ValueError("record moves no bytes")
        return rates(self.nbytes, self.samples_s)

    def rate_summary(self) -> Summary:
        """Summary of per-sample bandwidth in bytes per second (:meth:`rates`).

        Raises:
            ValueError: no samples, nbytes is 0, or a sample that is not > 0.
        """
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
        return {
            "params": self.params,
            "metric": self.metric,
            "nbytes": self.nbytes,
            "samples_s": self.samples_s,
            "reps": self.reps,
            "error": self.error,
            "extra": self.extra,
            "telemetry": self.telemetry,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Record":
        return cls(
            params=dict(d["params"]),
            metric=d.get("metric", "bandwidth"),
            nbytes=int(d.get("nbytes", 0)),
            samples_s=[float(x) for x in d.get("samples_s", [])],
            reps=int(d.get("reps", 1)),
            error=d.get("error"),
            extra=dict(d.get("extra", {})),
            telemetry=dict(d["telemetry"]) if d.get("telemetry") is not None else None,
        )


def time_ratios(records: list[Record], baseline: str, key) -> list[tuple[Record, float | None]]:
    """For each record with samples: (record, baseline median time / its median time), where the
    baseline is the record whose params["strategy"] is ``baseline`` and whose ``key(record)`` is the
    same; None when there is no baseline. A ratio above 1 is faster than the baseline.
    """
    base = {key(r): r.time_summary().median for r in records
            if r.params.get("strategy") == baseline and r.samples_s}
    out = []
    for r in records:
        if r.samples_s:
            b = base.get(key(r))
            out.append((r, b / r.time_summary().median if b else None))
    return out


@dataclass
class Result:
    """A command's whole outcome: spec, timing, environment and records.

    Attributes:
        command: command name ("copy", ...).
        spec: the parsed options as a JSON-able dict.
        timing: how the records were timed (clock, warm-ups, iteration rule, method).
        env: the machine, from :func:`gpubench.core.env.capture`.
        records: measured points.
        partial: True when the run stopped before the end (a signal, or a machine fault).
        interrupted_by: "SIGINT" / "SIGTERM" when a signal stopped it.
        failed_by: the error line when a machine fault stopped it (the run then exits 3).
        argv: the command line.
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
    created: str = field(
        default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    )
    gpubench_version: str = __version__
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "schema_version": self.schema_version,
            "command": self.command,
            "gpubench_version": self.gpubench_version,
            "created": self.created,
            "argv": self.argv,
            "spec": self.spec,
            "timing": self.timing,
            "env": self.env,
            "partial": self.partial,
            "interrupted_by": self.interrupted_by,
            **({"failed_by": self.failed_by} if self.failed_by else {}),
            "records": [r.to_dict() for r in self.records],
        }

    @classmethod
    def from_dict(cls, d: dict, *, source: str = "result") -> "Result":
        """Build a Result from a dict, upgrading older schema versions.

        Raises:
            UsageError: not a gpubench result, a newer or unknown schema version, or a malformed one.
        """
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            raise UsageError(f"{source} is not a gpubench result", "expected a file saved by --json")
        version = d.get("schema_version")
        if not isinstance(version, int) or version < 1:
            raise UsageError(f"{source} has an unknown schema version {version!r}")
        if version > SCHEMA_VERSION:
            raise UsageError(
                f"{source} has schema version {version}, newer than this gpubench reads ({SCHEMA_VERSION})",
                "upgrade gpubench",
            )
        while version < SCHEMA_VERSION:
            d = _MIGRATIONS[version](d)
            version += 1
        try:
            return cls(
                command=str(d["command"]),
                spec=dict(d.get("spec", {})),
                timing=dict(d.get("timing", {})),
                env=dict(d.get("env", {})),
                records=[Record.from_dict(r) for r in d.get("records", [])],
                partial=bool(d.get("partial", False)),
                interrupted_by=d.get("interrupted_by"),
                failed_by=d.get("failed_by"),
                argv=list(d.get("argv", [])),
                created=str(d.get("created", "")),
                gpubench_version=str(d.get("gpubench_version", "")),
                schema_version=SCHEMA_VERSION,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise UsageError(f"{source} is a malformed gpubench result: {e}") from None


def _write_target(path: str | os.PathLike) -> Path:
    """The file a save to ``path`` replaces: a symbolic link's target (the link is kept), else path."""
    return Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)


def check_output_target(path: str | os.PathLike, what: str = "--json") -> None:
    """Refuse an output target that exists and is not a regular file: a device (``mknod x c 1 3``,
    /dev/null), a FIFO, a socket or a folder, also at the end of a chain of symbolic links. An atomic
    save renames a new file over the target, which would replace the device or pipe.

    Args:
        path: the file to be written.
        what: the option that named it, for the message ("--json", "-o").

    Raises:
        UsageError: the target (after following links) exists and is not a regular file.
    """
    p = _write_target(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return
    except OSError as e:
        raise UsageError(f"{what} {str(path)!r}: cannot check it ({e.strerror or type(e).__name__})") from None
    if _stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{what} {str(path)!r} is a folder", "give a file name, e.g. out.json")
    if not _stat.S_ISREG(st.st_mode):  # a save would rename a new file over it
        raise UsageError(f"{what} {str(path)!r} is not a regular file (a device, pipe or socket)",
                         "give a file name, e.g. out.json, or --json - for stdout" if what == "--json"
                         else "give the name of a file")


def check_output_path(path: str | os.PathLike, option: str = "--json") -> Path:
    """Check, before a run, that ``path`` can be written: its folder exists and a file can be
    created in it (tried: a temporary file is made and removed, which also catches read-only file
    systems and /sys or /proc, where the permission bits say yes).

    Args:
        path: the file to be written.
        option: the option that named it, for messages ("--json", "-o").

    Raises:
        UsageError: an empty name or one over 255 bytes; the folder does not exist, is not a folder,
            or cannot be written; path is a folder, or exists and is not a regular file (a device
            such as /dev/full or /dev/null, a FIFO: the save would replace it); path exists and
            this user cannot write it.
    """
    if not str(path).strip():
        raise UsageError(f"{option} needs a file name, got {str(path)!r}", "e.g. out.json")
    name_len = len(os.fsencode(Path(path).name))
    if name_len > 255:
        raise UsageError(f"{option}: the file name is {name_len} bytes long", "a file name has at most 255 bytes")
    try:
        p = _write_target(path)
        parent = p.parent if str(p.parent) else Path(".")
        if p.is_dir():
            raise UsageError(f"{option} {str(path)!r} is a folder", "give a file name, e.g. out.json")
        if not parent.is_dir():
            raise UsageError(f"{option} {str(path)!r}: folder {str(parent)!r} does not exist")
        check_output_target(path, option)
        if p.exists() and not os.access(p, os.W_OK):
            raise UsageError(f"{option} {str(path)!r} exists and cannot be written (read-only, or another "
                             "user's file)", "remove it or give another name")
        fd, probe = tempfile.mkstemp(prefix=".gpubench-probe-", suffix=".tmp", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except UsageError:
        raise
    except OSError as e:
        raise UsageError(f"{option} {str(path)!r}: cannot write there ({e.strerror or type(e).__name__})") from None
    return Path(path)


def write_json_atomic(data: dict, path: str | os.PathLike, what: str = "result") -> Path:
    """Write ``data`` as JSON atomically: a temporary file in the same folder, fsync, rename.

    An earlier file at ``path`` stays intact if anything fails. A symbolic link is followed: the file
    it points to is replaced, the link kept.

    Raises:
        ValueError: data holds NaN or infinity (not JSON); nothing is written.
        MachineError: the write failed (full disk, read-only target...); the message names the path.
    """
    p = _write_target(path)
    parent = p.parent if str(p.parent) else Path(".")
    text = json.dumps(data, indent=1, allow_nan=False)
    tmp = None
    try:
        # a short temporary name: the target's own name may already be near the 255-byte limit
        fd, tmp = tempfile.mkstemp(prefix=".gpubench-", suffix=".tmp", dir=parent)
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; a result is an ordinary file
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        tmp = None
    except OSError as e:
        raise MachineError(f"could not save {what} to {str(p)!r}: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return p


def write_bytes_atomic(data: bytes, path: str | os.PathLike, what: str = "file", option: str = "-o") -> Path:
    """Write ``data`` to ``path`` atomically, as :func:`write_json_atomic` does for JSON (a PNG, an
    HTML report): a temporary file in the same folder, fsync, rename. On any failure (a full disk)
    the temporary file is removed and an earlier file at ``path`` is left as it was.

    Raises:
        UsageError: the target is not a regular file (:func:`check_output_target`; ``option`` names it).
        MachineError: the write failed; the message names ``what`` and the path.
    """
    check_output_target(path, option)
    p = _write_target(path)
    parent = p.parent if str(p.parent) else Path(".")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".gpubench-", suffix=".tmp", dir=parent)
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        tmp = None
    except OSError as e:
        raise MachineError(f"could not write {what} to {str(p)!r}: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return p


STDOUT = "-"  # --json - : the result goes to standard output (a file named "-" is ./-)


def write_json_stdout(data: dict) -> None:
    """Write ``data`` as JSON to standard output, with the same text a file gets.

    Raises:
        ValueError: data holds NaN or infinity (not JSON); nothing is written.
        MachineError: stdout is closed or its reader went away (a broken pipe).
    """
    import sys

    text = json.dumps(data, indent=1, allow_nan=False)
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except (OSError, ValueError) as e:
        raise MachineError(f"could not write the result to standard output: {getattr(e, 'strerror', None) or e}") from None


def save(result: Result, path: str | os.PathLike) -> Path:
    """Write ``result`` as JSON atomically (see :func:`write_json_atomic`); to standard output when
    ``path`` is "-" (:data:`STDOUT`).

    Raises:
        MachineError: the write failed (full disk, read-only target...); the message names the path.
    """
    if str(path) == STDOUT:
        write_json_stdout(result.to_dict())
        return Path(STDOUT)
    return write_json_atomic(result.to_dict(), path, "result")


SCHEMA_FILE = "result-v1.schema.json"  # in gpubench/schemas/, shipped in the wheel


def json_schema() -> dict:
    """The JSON Schema (draft 2020-12) of what :func:`save` writes, from the installed package."""
    from importlib import resources

    return json.loads((resources.files("gpubench") / "schemas" / SCHEMA_FILE).read_text(encoding="utf-8"))


def read_bounded(path: str | os.PathLike, what: str = "a gpubench result") -> bytes:
    """The bytes of ``path``, at most MAX_LOAD_BYTES (64 MiB), never blocking on a named pipe.

    Raises:
        UsageError: unreadable, a device or socket, or larger than MAX_LOAD_BYTES; one line naming
            the file. A named pipe that nobody writes to reads as empty.
    """
    p = Path(path)
    name = str(p)
    try:
        st = p.stat()
        if _stat.S_ISCHR(st.st_mode) or _stat.S_ISBLK(st.st_mode) or _stat.S_ISSOCK(st.st_mode):
            raise UsageError(f"cannot read {name}: a device or socket, not a file")
        size = st.st_size
        if size > MAX_LOAD_BYTES:
            raise UsageError(f"{name} is {size} bytes, too large for {what}")
        if _stat.S_ISFIFO(st.st_mode):  # <(cmd) works; a named pipe nobody writes to reads as empty, no wait
            fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
            os.set_blocking(fd, True)
            f = os.fdopen(fd, "rb")
        else:
            f = open(p, "rb")
        with f:
            raw = f.read(MAX_LOAD_BYTES + 1)
    except OSError as e:
        raise UsageError(f"cannot read {name}: {e.strerror or e}") from None
    if len(raw) > MAX_LOAD_BYTES:
        raise UsageError(f"{name} is over {MAX_LOAD_BYTES} bytes, too large for {what}")
    return raw


def read_json(path: str | os.PathLike, expected: str = "a file saved by --json") -> Any:
    """Read a JSON file of at most MAX_LOAD_BYTES (64 MiB) and about MAX_JSON_ITEMS values, so
    garbage cannot exhaust memory (parsing costs up to ~20x the text for tiny values).

    Raises:
        UsageError: unreadable, a device or socket, too large, too many values, empty (a named pipe
            with no writer too) or not JSON; one line naming the file.
    """
    name = str(Path(path))
    raw = read_bounded(path)
    if not raw.strip():
        raise UsageError(f"{name} is empty", f"expected {expected}")
    items = raw.count(b",") + raw.count(b"[") + raw.count(b"{")
    if items > MAX_JSON_ITEMS:
        raise UsageError(f"{name} holds about {items} JSON values, more than the {MAX_JSON_ITEMS} "
                         f"a gpubench file may hold", f"expected {expected}")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"{name} is not valid JSON ({str(e).splitlines()[0][:80]})") from None


def load(path: str | os.PathLike) -> Result:
    """Read a saved result, refusing files that are not gpubench results.

    Raises:
        UsageError: unreadable, too large, not JSON, not a result, or a newer schema.
    """
    return Result.from_dict(read_json(path), source=str(path))

"""Checks of option values that benchmarks' specs share (no GPU needed): counts, comma lists,
the timing plan, a device ordinal. Each raises UsageError with one line naming the bad value and
what would be accepted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from gpubench.core.errors import UsageError

MAX_COUNT = 10**9  # any count option; beyond it is a typo, not a measurement
MAX_REPEATS = 10**6  # warm-ups, iterations and samples per point
ASCII_SPACE = " \t\n\r\f\v"  # what an option value is stripped of (str.strip() also takes U+00A0)


def positive_int(name: str, value: int | None, *, allow_zero: bool = False, maximum: int = MAX_COUNT) -> int | None:
    """Check an integer option; None passes through.

    Raises:
        UsageError: negative, zero when not allowed, or above ``maximum``.
    """
    if value is None:
        return None
    if value < 0 or (value == 0 and not allow_zero):
        raise UsageError(f"{name} {value} must be {'>= 0' if allow_zero else '>= 1'}")
    if value > maximum:
        shown = value if value < 10**12 else f"(a {len(str(value))}-digit number)"
        raise UsageError(f"{name} {shown} is too large", f"at most {maximum:,}")
    return value


def _ordinal(i: int) -> str:
    return f"{i}{'th' if 10 <= i % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(i % 10, 'th')}"


def split_list(text: object, what: str, example: str, kind: str = "value") -> tuple[str, ...]:
    """Split a comma list option ("0,1", "h2d,d2h", "4K,8K") into its entries: the one rule of
    every comma list of every command.

    Each entry is stripped of ASCII white space; the list must name at least one entry, and no
    entry may be empty ("0,,1", "pinned,", ",") or repeated as written (callers that parse the
    entries also refuse two spellings of one value, such as "1" and "01").

    Args:
        text: the option's value (str() of it is used).
        what: the option's name for messages ("-d/--devices").
        example: an accepted value for messages ("0,1").
        kind: what an entry is, for messages ("device").

    Returns:
        The entries, in the order given.

    Raises:
        UsageError: an empty list, an empty entry (named by position) or a repeated entry.
    """
    from gpubench.core import safe

    raw = str(text)
    shown = safe.term(repr(raw), 80)
    items = tuple(x.strip(ASCII_SPACE) for x in raw.split(","))
    if items == ("",):
        raise UsageError(f"{what} {shown} is empty", f"e.g. {what.split('/')[-1]} {example}")
    for i, x in enumerate(items):
        if not x:
            raise UsageError(f"{what} {shown} has an empty {_ordinal(i + 1)} entry",
                             f"separate entries with one comma, e.g. {example}")
    for i, x in enumerate(items):
        if x in items[:i]:
            raise UsageError(f"{kind} {safe.term(x, 40)} is repeated in {what} {shown}", "name each once")
    return items


def csv_list(text: str, what: str, allowed: tuple[str, ...] | None = None, kind: str = "value") -> tuple[str, ...]:
    """Split a comma list option ("h2d,d2h") into unique items (:func:`split_list`), checked
    against ``allowed``.

    Args:
        text: the option's value.
        what: the option's name for messages ("--direction").
        allowed: the accepted items, or None for any.
        kind: what an item is, for messages ("direction").

    Raises:
        UsageError: an empty list, an empty or repeated item, or an item not in ``allowed``.
    """
    from gpubench.core import safe

    items = split_list(text, what, ",".join(allowed[:2]) if allowed else "a,b", kind)
    if allowed is not None:
        for x in items:
            if x not in allowed:
                raise UsageError(f"{kind} {safe.term(repr(x), 60)} not known", f"use {', '.join(allowed)}")
    return items


MAX_SECONDS = 86_400.0  # --min-time / --max-time: a day per point is a typo, not a measurement


def timing_plan(warmup: int, iters: int | None, min_time: float, max_noise: float | None = None,
                max_time: float | None = None):
    """Check -w/--warmup, -n/--iters, --min-time, --max-noise and --max-time and build a TimingPlan.

    Args:
        max_noise: the noise goal in percent, or None for none (stop at --min-time).
        max_time: wall seconds a point may sample while it waits for the goal (None: the plan's default).

    Raises:
        UsageError: a negative warm-up, iterations below 1, a min or max time that is not a finite
            number of seconds in (0, 86400], a noise goal that is not a percentage in (0, 100].
    """
    from gpubench.core.timing import TimingPlan

    positive_int("-w/--warmup", warmup, allow_zero=True, maximum=MAX_REPEATS)
    positive_int("-n/--iters", iters, maximum=MAX_REPEATS)
    if not (min_time > 0):
        raise UsageError(f"--min-time {min_time} must be > 0 seconds")
    if not (min_time <= MAX_SECONDS):
        raise UsageError(f"--min-time {min_time} is too long", f"at most {MAX_SECONDS:g} seconds")
    if max_noise is not None and not (0 < max_noise <= 100 and math.isfinite(max_noise)):
        raise UsageError(f"--max-noise {max_noise} must be a percentage > 0 and <= 100", "e.g. --max-noise 0.5")
    if max_time is not None and not (0 < max_time <= MAX_SECONDS):
        raise UsageError(f"--max-time {max_time} must be > 0 and at most {MAX_SECONDS:g} seconds",
                         "e.g. --max-time 5")
    return TimingPlan(warmup=warmup, iters=iters, min_time=min_time, max_noise=max_noise,
                      max_time=TimingPlan.max_time if max_time is None else float(max_time))


def device_id(device: int) -> int:
    """Check a single -d/--device ordinal (no GPU needed). Raises UsageError when negative."""
    if device < 0:
        raise UsageError(f"-d/--device {device} is negative", "device ids start at 0")
    return device


#: Entries a -d list may hold. -d names CUDA devices of one machine (merge -t cpu: one worker process
#: each): the largest single hosts have 16 GPUs, 7 MIG instances each is 112; 1,024 leaves room and
#: bounds the parse (100,000 ids took 94 s to reach the memory refusal, the repeat check being
#: quadratic).
MAX_DEVICE_LIST = 1024


def parse_devices(text: str | None) -> tuple[int, ...] | None:
    """Parse ``-d`` ("0", "0,1") into CUDA ordinals without looking at the GPU.

    Returns None for None (the option not given: the default device).

    Raises:
        UsageError: more than :data:`MAX_DEVICE_LIST` entries (counted before any is parsed), an
            empty list or entry (:func:`split_list`), an entry that is not
            an integer, a negative id, or a repeated id.
    """
    if text is None:
        return None
    text = str(text)
    n = text.count(",") + 1
    if n > MAX_DEVICE_LIST:
        raise UsageError(f"-d/--devices names {n:,} devices, more than one machine has",
                         f"at most {MAX_DEVICE_LIST:,}, e.g. -d 0,1")
    out: list[int] = []
    for p in split_list(text, "-d/--devices", "0,1", "device"):
        if not re.fullmatch(r"-?[0-9]{1,10}", p):  # ASCII digits: int() also reads "١" and "1_0"
            raise UsageError(f"device {p[:40]!r} in -d {text[:80]!r} is not an integer",
                             "e.g. -d 0 or -d 0,1; ids are at most 2147483647")
        v = int(p)
        if v > 2**31 - 1:
            raise UsageError(f"device {v} in -d is too large", "CUDA ordinals are at most 2147483647")
        if v < 0 or p.startswith("-"):
            raise UsageError(f"device {p} in -d {text[:80]!r} is negative", "device ids start at 0")
        if v in out:
            raise UsageError(f"device {v} is repeated in -d {text[:80]!r}", "name each GPU once")
        out.append(v)
    return tuple(out)


# -- bounds of every numeric option, checked when the command line is parsed -----------------------
#
# Python's int() and float() read more than a command line should mean: Unicode digits ("١٢" is
# 12, "١.٥" 1.5), underscores ("1_000"), "inf", "nan", "1e400" (inf) and integers of any length.
# Every numeric option of every command (net checks its own in its Spec) is parsed by
# parse_number below through commands.common.harden_numeric_options: ASCII digits only, a finite
# value, and at most the largest value the option can mean (OPTION_MAXIMA, derived from what the
# machine or the protocol allows). The lower bounds stay with each Spec, whose lines name them.

MAX_DEVICE_ORDINAL = 2**31 - 1  # cudaSetDevice(int), ncclCommInitRank's rank and root: a C int
MAX_MIN_TIME_S = 3600.0  # seconds of samples per point: an hour per point is a soak, not a sweep
MAX_TIMEOUT_S = 7 * 86400.0  # a deadline beyond a week is no deadline (0 means none where allowed)
MAX_GBPS = 1e6  # GB/s: no link moves a petabyte per second (NVLink 5 x18 is 0.9 TB/s per direction)
MAX_INT64 = 2**63 - 1

#: option (click's parameter name) -> the largest accepted value, for every command; a plug-in's
#: ``option_maxima`` overrides an entry for its own options (merge's --runs, compare's --threshold).
OPTION_MAXIMA: dict[str, float | Callable[[], float]] = {
    "warmup": MAX_REPEATS, "iters": MAX_REPEATS, "samples": MAX_REPEATS, "cuda_graph": MAX_REPEATS,
    "loop_count": MAX_COUNT, "check": MAX_COUNT,
    # batch --count, memcpy2d -H, overlap --streams/--chunks: their Specs bound them tighter, with
    # the reason (pieces per transfer, the buffer size, streams per GPU)
    "device": MAX_DEVICE_ORDINAL, "root": MAX_DEVICE_ORDINAL,
    "min_time": MAX_MIN_TIME_S, "timeout": MAX_TIMEOUT_S,
    "step_factor": float(MAX_INT64),  # a factor beyond the largest size gives the same two sizes
    "expect_busbw": MAX_GBPS,
}
DEFAULT_INT_MAX = MAX_INT64  # any other integer option: what a signed 64-bit C argument holds
DEFAULT_FLOAT_MAX = 1.7976931348623157e308  # any other float option: finite

_ASCII_INT = re.compile(r"[+-]?[0-9]+\Z")
# Python's int() grammar with ASCII digits only: groups separated by one underscore ("50_000_000")
_GROUPED_INT = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*\Z")
_ASCII_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")



def _max_text(hi: float, kind: type) -> str:
    return f"{int(hi):,}" if kind is int or (float(hi).is_integer() and hi < 1e15) else f"{hi:g}"


def _shown_text(text: str) -> str:
    from gpubench.core import safe

    if len(text) > 40 and text.lstrip("+-").isdigit():
        return f"(a {len(text.lstrip('+-'))}-digit number)"
    return safe.term(repr(text) if not _ASCII_FLOAT.match(text) else text, 60)



def parse_number(text: object, name: str, kind: type = int, maximum: float | None = None, *,
                 digit_groups: bool = False) -> int | float:
    """Parse one numeric option strictly and check its upper bound.

    Args:
        text: the value as given (a str), or an int/float default.
        name: the option as messages name it ("-n/--iters").
        kind: int or float.
        maximum: the largest accepted value (default: DEFAULT_INT_MAX / DEFAULT_FLOAT_MAX).
        digit_groups: an integer may separate groups of digits with "_" ("50_000_000", as
            Python's int() reads it; a plug-in's ``digit_groups``).

    Returns:
        The int or float.

    Raises:
        UsageError: not written with ASCII digits (Unicode digits, underscores, words), not
            finite (inf, nan, 1e400), a zero with a minus sign ("-0", "-0.0"), or above ``maximum``; the line names the value and the
            largest accepted.
    """
    hi = maximum if maximum is not None else (DEFAULT_INT_MAX if kind is int else DEFAULT_FLOAT_MAX)
    if isinstance(text, bool) or not isinstance(text, (int, float, str)):
        raise UsageError(f"{name} {text!r} is not a number")
    if isinstance(text, str):
        s = text.strip(ASCII_SPACE)  # str.strip() also takes U+00A0 and other Unicode spaces
        if kind is int:
            if not (_GROUPED_INT if digit_groups else _ASCII_INT).match(s):
                raise UsageError(f"{name} {_shown_text(text)} is not an integer",
                                 "use the digits 0-9, e.g. 1_000_000 or 1000000" if digit_groups
                                 else "use the digits 0-9, e.g. 4")
            s = s.replace("_", "")
            if len(s.lstrip("+-")) > 30:
                raise UsageError(f"{name} {_shown_text(s)} is too large", f"at most {_max_text(hi, kind)}")
            value: int | float = int(s)
        else:
            if not _ASCII_FLOAT.match(s):
                raise UsageError(f"{name} {_shown_text(text)} is not a finite number",
                                 f"use the digits 0-9 with an optional '.' and exponent, at most {_max_text(hi, kind)}")
            value = float(s)
            if not math.isfinite(value):  # digits that overflow a double (1e400, 400 digits)
                raise UsageError(f"{name} {_shown_text(s)} is too large", f"at most {_max_text(hi, kind)}")
        if value == 0 and s.startswith("-"):  # "-0": int() reads 0, parse_size refuses the sign
            raise UsageError(f"{name} {_shown_text(s)} has a minus sign", "write 0")
    else:
        value = kind(text)
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{name} {_shown_text(str(text))} is not a finite number", f"at most {_max_text(hi, kind)}")
    if value > hi:
        raise UsageError(f"{name} {_shown_text(str(text).strip())} is too large", f"at most {_max_text(hi, kind)}")
    return value


def option_maximum(command: str, name: str) -> float | None:
    """The largest value of ``command``'s option ``name``: its plug-in's ``option_maxima``, else
    OPTION_MAXIMA (an entry may be a function of the machine, called here), else None for the
    default of its type. ``command`` may be "net server": its first word is the plug-in."""
    from gpubench.core import registry

    own = registry.find(command.split()[0]) if command else None
    hi = own.option_maxima.get(name) if own is not None and name in own.option_maxima else OPTION_MAXIMA.get(name)
    return hi() if callable(hi) else hi


def max_wait_seconds() -> float:
    """The longest wait Python's locks, events and thread joins accept (``threading.TIMEOUT_MAX``,
    about 292 years on Linux): beyond it a wait raises OverflowError, so it bounds any --timeout."""
    import threading

    return float(threading.TIMEOUT_MAX)


def finite_seconds(name: str, value: float, *, maximum: float | None = None) -> float:
    """Check a duration option: a finite number of seconds, > 0 and at most ``maximum`` (default
    :func:`max_wait_seconds`).

    Raises:
        UsageError: not a number, NaN, infinite, <= 0, or above ``maximum``; the line names the
            value and the largest accepted.
    """
    top = max_wait_seconds() if maximum is None else maximum
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{name} {value!r} is not a number of seconds", "e.g. 600")
    try:
        v = float(value)
    except OverflowError:  # a 400-digit int
        v = math.inf
    if math.isnan(v) or v <= 0:
        raise UsageError(f"{name} {value!r} must be > 0 seconds", "e.g. 600")
    if v > top:
        shown = value if v < 1e15 else f"(a {len(str(int(value)))}-digit number)" if isinstance(value, int) else value
        raise UsageError(f"{name} {shown} is too long", f"at most {top:,.0f} s")
    return v


def machine_threads() -> int:
    """How many threads this machine lets one user run: the kernel's threads-max and the soft
    RLIMIT_NPROC (Linux counts threads against it), whichever is smaller; 2**31 - 1 where neither
    is known. Bounds thread-count options (a Dask worker's thread pool)."""
    import resource

    limits = [2**31 - 1]
    try:
        with open("/proc/sys/kernel/threads-max") as f:
            limits.append(int(f.read().strip()))
    except (OSError, ValueError):
        pass
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NPROC)
        if soft != resource.RLIM_INFINITY and soft > 0:
            limits.append(int(soft))
    except (OSError, ValueError, AttributeError):
        pass
    return min(limits)

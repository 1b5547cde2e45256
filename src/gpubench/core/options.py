"""Checks of option values that benchmarks' specs share (no GPU needed): counts, comma lists,
the timing plan, a device ordinal. Each raises UsageError with one line naming the bad value and
what would be accepted.
"""

from __future__ import annotations

from gpubench.core.errors import UsageError

MAX_COUNT = 10**9  # any count option; beyond it is a typo, not a measurement
MAX_REPEATS = 10**6  # warm-ups, iterations and samples per point


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


def csv_list(text: str, what: str, allowed: tuple[str, ...] | None = None, kind: str = "value") -> tuple[str, ...]:
    """Split a comma list option ("h2d,d2h") into unique items, checked against ``allowed``.

    Args:
        text: the option's value.
        what: the option's name for messages ("--direction").
        allowed: the accepted items, or None for any.
        kind: what an item is, for messages ("direction").

    Raises:
        UsageError: an empty list, a repeated item, or an item not in ``allowed``.
    """
    items = tuple(x.strip() for x in str(text).split(",") if x.strip())
    if not items:
        raise UsageError(f"{what} {text!r} is empty")
    if len(set(items)) != len(items):
        raise UsageError(f"{what} {text!r} repeats a value", "name each once")
    if allowed is not None:
        for x in items:
            if x not in allowed:
                raise UsageError(f"{kind} {x!r} not known", f"use {', '.join(allowed)}")
    return items


def timing_plan(warmup: int, iters: int | None, min_time: float):
    """Check -w/--warmup, -n/--iters and --min-time and build a TimingPlan.

    Raises:
        UsageError: a negative warm-up, iterations below 1, or a min time that is not > 0.
    """
    from gpubench.core.timing import TimingPlan

    positive_int("-w/--warmup", warmup, allow_zero=True, maximum=MAX_REPEATS)
    positive_int("-n/--iters", iters, maximum=MAX_REPEATS)
    if not (min_time > 0):
        raise UsageError(f"--min-time {min_time} must be > 0 seconds")
    return TimingPlan(warmup=warmup, iters=iters, min_time=min_time)


def device_id(device: int) -> int:
    """Check a single -d/--device ordinal (no GPU needed). Raises UsageError when negative."""
    if device < 0:
        raise UsageError(f"-d/--device {device} is negative", "device ids start at 0")
    return device


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
    import math

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

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
    import math

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
    extra = {} if max_time is None else {"max_time": float(max_time)}
    return TimingPlan(warmup=warmup, iters=iters, min_time=min_time, max_noise=max_noise, **extra)


def device_id(device: int) -> int:
    """Check a single -d/--device ordinal (no GPU needed). Raises UsageError when negative."""
    if device < 0:
        raise UsageError(f"-d/--device {device} is negative", "device ids start at 0")
    return device

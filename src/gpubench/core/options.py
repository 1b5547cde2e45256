"""How option values are read (no GPU needed): comma lists, device lists and numbers as written on
the command line; a bad value is one UsageError line. Ranges are the Specs' (:mod:`gpubench.core.bounds`).
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable
from typing import Any

from gpubench.core import safe
from gpubench.core.bounds import MAX_DEVICE_ORDINAL
from gpubench.core.errors import UsageError

ASCII_SPACE = " \t\n\r\f\v"  # what an option value is stripped of (str.strip() also takes U+00A0)


def _ordinal(i: int) -> str:
    return f"{i}{'th' if 10 <= i % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(i % 10, 'th')}"


def split_list(text: object, what: str, example: str, kind: str = "value") -> tuple[str, ...]:
    """Split a comma list option ("0,1", "h2d,d2h") into its entries stripped of ASCII white space, in order: the one
    rule of every comma list. ``what``, ``example``, ``kind``: the option, an accepted value and what an entry is, for
    messages. Raises UsageError: an empty list, an empty entry (named by position) or a repeated entry."""
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
    """:func:`split_list`'s entries, each checked against ``allowed`` (None: any). Raises UsageError: as
    :func:`split_list`, or an item not in ``allowed``."""
    items = split_list(text, what, ",".join(allowed[:2]) if allowed else "a,b", kind)
    if allowed is not None:
        for x in items:
            if x not in allowed:
                raise UsageError(f"{kind} {safe.term(repr(x), 60)} not known", f"use {', '.join(allowed)}")
    return items


MAX_DEVICE_LIST = 1024  # entries a -d list may hold (16 GPUs of 7 MIG instances each is 112)


def parse_devices(text: str | None) -> tuple[int, ...] | None:
    """Parse ``-d`` ("0", "0,1") into CUDA ordinals without looking at the GPU; None for None. Raises UsageError: more
    than :data:`MAX_DEVICE_LIST` entries, a bad list (:func:`split_list`), an entry that is not an integer, a negative
    id, or a repeated id."""
    if text is None:
        return None
    text = str(text)
    n = text.count(",") + 1
    if n > MAX_DEVICE_LIST:
        raise UsageError(f"-d/--devices names {n:,} devices, more than one machine has",
                         f"at most {MAX_DEVICE_LIST:,}, e.g. -d 0,1")
    out: list[int] = []
    for p in split_list(text, "-d/--devices", "0,1", "device"):
        if not re.fullmatch(r"[+-]?[0-9]{1,10}", p):  # ASCII digits, as parse_number: int() also reads "١" and "1_0"
            raise UsageError(f"device {p[:40]!r} in -d {text[:80]!r} is not an integer",
                             f"e.g. -d 0 or -d 0,1; ids are at most {MAX_DEVICE_ORDINAL}")
        v = int(p)
        if v > MAX_DEVICE_ORDINAL:
            raise UsageError(f"device {v} in -d is too large", f"CUDA ordinals are at most {MAX_DEVICE_ORDINAL}")
        if v == 0 and p.startswith("-"):  # as parse_number words "-0"
            raise UsageError(f"device {p} in -d {text[:80]!r} has a minus sign", "write 0")
        if v < 0:
            raise UsageError(f"device {p} in -d {text[:80]!r} is negative", "device ids start at 0")
        if v in out:
            raise UsageError(f"device {v} is repeated in -d {text[:80]!r}", "name each GPU once")
        out.append(v)
    return tuple(out)


# int() and float() also read Unicode digits, "1_000", "inf", "nan" and "1e400": numeric options use parse_number

DEFAULT_INT_MAX = 2**63 - 1  # an integer option: what a signed 64-bit C argument holds
DEFAULT_FLOAT_MAX = 1.7976931348623157e308  # a float option: finite

_ASCII_INT = re.compile(r"[+-]?[0-9]+\Z")
# Python's int() grammar with ASCII digits only: groups separated by one underscore ("50_000_000")
_GROUPED_INT = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*\Z")
_ASCII_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")


def _max_text(hi: float, kind: type) -> str:
    return f"{int(hi):,}" if kind is int or (float(hi).is_integer() and hi < 1e15) else f"{hi:g}"


def _shown_text(text: str) -> str:
    if len(text) > 40 and text.lstrip("+-").isdigit():
        return f"(a {len(text.lstrip('+-'))}-digit number)"
    return safe.term(repr(text) if not _ASCII_FLOAT.match(text) else text, 60)


def underflowed(text: str) -> bool:
    """Whether a number written as ``text`` that reads as 0 was not 0 (a nonzero digit before its
    exponent: "1e-400" underflows a double to 0, "0e-400" is 0)."""
    return any(c.isdecimal() and int(c) for c in text.lower().split("e")[0])


def too_small(name: str, shown: str, zero_ok: bool = False, least: str | None = None) -> UsageError:
    """The error of a value that underflows to 0 (:func:`underflowed`), for option ``name``; ``least``
    the option's own lower bound in words (:meth:`gpubench.core.bounds.Bound.at_least`), if it has one."""
    return UsageError(f"{name} {shown} is too small to tell from 0",
                      f"use a value of {least}" if least else "use a value of at least 1e-300" + (", or 0" if zero_ok else ""))


def parse_number(text: object, name: str, kind: type = int, maximum: float | None = None, *,
                 digit_groups: bool = False, bound: Callable[[], Any] | None = None) -> int | float:
    """Parse one numeric option (``kind`` int or float) strictly and check its upper bound (``maximum``, default
    DEFAULT_INT_MAX / DEFAULT_FLOAT_MAX). ``digit_groups``: "50_000_000" is read; ``bound``: returns the option's
    declared :class:`gpubench.core.bounds.Bound` (or None), asked only for a value out of range, so that line names the
    option's own limit. Raises UsageError: not ASCII digits, not finite, a non-zero value a double reads as 0 (1e-400),
    a zero with a minus sign, or above ``maximum``."""
    hi = maximum if maximum is not None else (DEFAULT_INT_MAX if kind is int else DEFAULT_FLOAT_MAX)

    def at_most() -> str:  # the option's own upper bound where it declares one
        own = bound() if bound is not None else None
        return (own.at_most() if own is not None else None) or f"at most {_max_text(hi, kind)}"

    def too_large(shown: str) -> UsageError:
        own = bound() if bound is not None else None
        if own is not None and own.largest() is not None:
            return own.too_large(shown)
        return UsageError(f"{name} {shown} is too large", at_most())

    def zero_allowed() -> bool:  # never suggest 0 where the option's declared bound refuses it
        own = bound() if bound is not None else None
        if own is None:
            return True
        try:
            own.check(0.0)
        except UsageError:
            return False
        return True

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
                raise too_large(_shown_text(s))
            value: int | float = int(s)
        else:
            if not _ASCII_FLOAT.match(s):
                raise UsageError(f"{name} {_shown_text(text)} is not a finite number",
                                 f"use the digits 0-9 with an optional '.' and exponent, {at_most()}")
            value = float(s)
            if not math.isfinite(value):  # digits that overflow a double (1e400, 400 digits)
                raise too_large(_shown_text(s))
            if value == 0 and underflowed(s):
                own = bound() if bound is not None else None  # its own floor where that is above 0 ("at least 0.1 s")
                least = own.at_least() if own is not None and own.lo is not None and own.lo > 0 else None
                raise too_small(name, _shown_text(s), zero_allowed(), least)
        if value == 0 and s.startswith("-"):  # "-0": int() reads 0, parse_size refuses the sign
            own = bound() if bound is not None else None
            if own is not None:
                own.check(-0.0)  # where 0 is out of the option's range, that range ("-n/--iters -0 must be >= 1")
            raise UsageError(f"{name} {_shown_text(s)} has a minus sign", "write 0")
    else:
        value = kind(text)
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{name} {_shown_text(str(text))} is not a finite number", at_most())
    if value > hi:
        raise too_large(_shown_text(str(text).strip()))
    return value


def machine_threads() -> int:
    """How many threads this machine lets one user run: the smaller of the kernel's threads-max and
    the soft RLIMIT_NPROC; 2**31 - 1 where neither is known."""
    import resource

    limits = [2**31 - 1]
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/sys/kernel/threads-max") as f:
            limits.append(int(f.read().strip()))
    with contextlib.suppress(OSError, ValueError, AttributeError):
        soft, _hard = resource.getrlimit(resource.RLIMIT_NPROC)
        if soft != resource.RLIM_INFINITY and soft > 0:
            limits.append(int(soft))
    return min(limits)

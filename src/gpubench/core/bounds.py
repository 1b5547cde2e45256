"""The one bound of each number a command takes, declared on the Spec field that holds it with
:func:`bounded` and checked by :func:`check_bounds` (docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import Any

from gpubench.core.errors import UsageError

MAX_COUNT = 10**9  # any count option; beyond it is a typo, not a measurement
MAX_REPEATS = 10**6  # warm-ups, iterations and samples per point
MAX_DEVICE_ORDINAL = 2**31 - 1  # cudaSetDevice(int), ncclCommInitRank's rank and root: a C int
MAX_MIN_TIME_S = 3600.0  # seconds of samples per point: an hour per point is a soak, not a sweep
MAX_TIMEOUT_S = 7 * 86400.0  # a deadline beyond a week is no deadline (0 means none where allowed)
MAX_GBPS = 1e6  # GB/s: no link moves a petabyte per second (NVLink 5 x18 is 0.9 TB/s per direction)


def _shown(v: float) -> str:
    """A value as given: an int in full (its digits counted past 15), a float by %g where that is
    the value, else in full."""
    if isinstance(v, int):
        return str(v) if abs(v) < 10**15 else f"(a {len(str(abs(v)))}-digit number)"
    short = f"{v:g}"
    return short if float(short) == v else repr(v)


def _limit(v: float) -> str:
    """A bound as messages name it: a whole number with thousands separators, else by %g."""
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:,.0f}" if float(v).is_integer() and abs(v) < 1e15 else f"{v:g}"


@dataclasses.dataclass(frozen=True)
class Bound:
    """The accepted range of one number for ``option`` ("-n/--iters"): ``lo`` and ``hi`` (None: none;
    ``hi`` may be a function of the machine), ``lo`` itself refused with ``above``, ``hi`` with
    ``below``; ``unit`` follows the bounds in messages."""

    option: str
    lo: float | None = None
    hi: float | Callable[[], float] | None = None
    above: bool = False
    unit: str = ""
    below: bool = False

    def check(self, value: Any) -> Any:
        """``value`` when it is None or within the bound. Raises UsageError: not a number (a bool counts as none), not
        finite, below ``lo`` or above ``hi``."""
        if value is None:
            return None
        unit = f" {self.unit}" if self.unit else ""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UsageError(f"{self.option} {value!r} is not a number")
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"{self.option} {value} is not a finite number")
        if self.lo is not None and (value <= self.lo if self.above else value < self.lo):
            raise UsageError(f"{self.option} {_shown(value)} must be {'>' if self.above else '>='} "
                             f"{_limit(self.lo)}{unit}")
        hi = self.largest()
        if hi is not None and (value >= hi if self.below else value > hi):
            raise self.too_large(_shown(value))
        return value

    def largest(self) -> float | None:
        """``hi``, read from the machine where it is a function."""
        return self.hi() if callable(self.hi) else self.hi

    def at_least(self) -> str | None:
        """The lower bound as messages name it ("at least 0.1 seconds", "more than 0"), or None: no ``lo``."""
        if self.lo is None:
            return None
        return f"{'more than' if self.above else 'at least'} {_limit(self.lo)}{f' {self.unit}' if self.unit else ''}"

    def at_most(self) -> str | None:
        """The upper bound as messages name it ("at most 1,000,000 percent", "< 1 s"), or None: no ``hi``."""
        hi = self.largest()
        if hi is None:
            return None
        return f"{'<' if self.below else 'at most'} {_limit(hi)}{f' {self.unit}' if self.unit else ''}"

    def too_large(self, shown: str) -> UsageError:
        """The error of a value above ``hi`` shown as ``shown`` ("(a 400-digit number)")."""
        if self.below and self.largest() is not None:
            return UsageError(f"{self.option} {shown} must be {self.at_most()}")
        return UsageError(f"{self.option} {shown} is too large", self.at_most())


def bounded(default: Any, option: str, *, lo: float | None = None, hi: float | Callable[[], float] | None = None,
            above: bool = False, unit: str = "") -> Any:
    """A dataclass field with ``default`` whose values :func:`check_bounds` holds to a :class:`Bound`
    (the arguments are its attributes)."""
    return dataclasses.field(default=default, metadata={"bound": Bound(option, lo, hi, above, unit)})


def field_bound(cls: Any, name: str) -> Bound:
    """The Bound declared on field ``name`` of the dataclass ``cls``. Raises KeyError: the field declares none."""
    return next(f for f in dataclasses.fields(cls) if f.name == name).metadata["bound"]


def declared(modules: Iterable[str], option: str) -> Bound | None:
    """The Bound declared for ``option`` on a field of a dataclass defined in one of ``modules``
    (imported here), or None: the bound of a value too large to reach its Spec."""
    import importlib
    import inspect

    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception:  # a plug-in whose optional packages are missing: its type's own bound then
            continue
        for cls in vars(module).values():
            if inspect.isclass(cls) and dataclasses.is_dataclass(cls):
                for f in dataclasses.fields(cls):
                    b = f.metadata.get("bound")
                    if b is not None and b.option == option:
                        return b
    return None


def check_bounds(spec: Any) -> None:
    """Check every field of the dataclass instance ``spec`` declared with :func:`bounded`, in order. Raises UsageError:
    the first value outside its bound (:meth:`Bound.check`)."""
    for f in dataclasses.fields(spec):
        b = f.metadata.get("bound")
        if b is not None:
            b.check(getattr(spec, f.name))


def device_field() -> Any:
    """The field of a Spec's one CUDA ordinal, ``-d/--device`` (0 by default, a C int)."""
    return bounded(0, "-d/--device", lo=0, hi=MAX_DEVICE_ORDINAL)

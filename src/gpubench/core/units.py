"""Sizes in and out, and the GB / GiB rule.

Sizes given by the user may be binary ("64KiB") or decimal ("64KB"). Rules, chosen to match how
nccl-tests and dask-cuda read their own options:

- ``"4KiB"``, ``"1MiB"``, ``"1GiB"``: binary (1024-based).
- ``"4KB"``, ``"1MB"``, ``"30GB"``: decimal (1000-based), as ``--rmm-pool-size 30GB`` means in dask-cuda.
- ``"4K"``, ``"1M"``, ``"1G"`` (no "B"): binary, as nccl-tests' ``-b 8 -e 128M`` means.
- a plain integer: bytes. A trailing "B" alone is allowed ("4096B").

Bandwidth is printed in GB/s (1e9 B/s) by default or GiB/s (2**30 B/s) with ``--units GiB``.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from fractions import Fraction

from gpubench.core.bounds import Bound
from gpubench.core.errors import UsageError

_BINARY = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_DECIMAL = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_SIZE_RE = re.compile(r"^\s*\+?([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(I?)(B?)\s*$", re.IGNORECASE | re.ASCII)  # not "١K"

UNITS = {"GB": 1e9, "GiB": float(2**30)}
MAX_BYTES = 2**63 - 1  # the largest size a signed 64-bit count (CUDA, NumPy) can hold
MAX_SWEEP_POINTS = 1000  # sizes in one -b/-e/-f sweep; more is a typo in -f (1.0001), not a study
# -f/--step-factor: above 1; past MAX_BYTES it adds nothing (a sweep is -b and -e alone from 2**63 on)
STEP_FACTOR = Bound("-f/--step-factor", lo=1, above=True, hi=float(MAX_BYTES))


def parse_size(text: str | int, *, what: str = "size", most: int | None = None) -> int:
    """Parse a size (``"4KiB"``, ``"1M"``, ``"30GB"``, ``"4096"`` or an int) into bytes (>= 1); ``what`` names the
    option in messages, ``most`` its own upper bound where it has a fixed one. Raises UsageError: not a size, not >= 1,
    not a whole number of bytes, over ``most`` (named, however far over), or over MAX_BYTES."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        s = str(text)
        m = _SIZE_RE.match(s)
        if not m:
            raise UsageError(f"{what} {s!r} is not a size",
                             "use bytes or a number with K, M, G, T; KiB/K = 1024, KB = 1000, e.g. 4KiB, 1M, 30GB")
        number, prefix, binary_i, b = m.groups()
        prefix = prefix.upper()
        if binary_i and not prefix:
            raise UsageError(f"{what} {s!r} is not a size", "e.g. 4KiB, 1M, 30GB")
        mult = _DECIMAL[prefix] if prefix and b and not binary_i else _BINARY[prefix]
        exact = Fraction(number) * mult  # exact: a float would overflow on a long number or round it
        if exact.denominator != 1:
            raise UsageError(f"{what} {s!r} is not a whole number of bytes")
        value = int(exact)
    if value <= 0:
        raise UsageError(f"{what} {text!r} must be at least 1 byte")
    if most is not None and value > most:
        raise UsageError(f"{what} {str(text)[:40]!r} is over {format_size(most)}",
                         f"use {format_size(most).replace(' ', '')} or less")
    if value > MAX_BYTES:
        raise UsageError(f"{what} {str(text)[:40]!r} is over {MAX_BYTES} bytes (8 EiB), more than any machine holds")
    return value


def format_size(nbytes: int) -> str:
    """Format a byte count (>= 0) in binary units: 4096 -> "4 KiB", 1536 -> "1.5 KiB"."""
    if nbytes < 1024:
        return f"{nbytes} B"
    for unit, mult in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= mult:
            try:
                v = nbytes / mult
            except OverflowError:  # an int with more digits than a float holds (a fuzzed --height)
                return f"{Decimal(nbytes):.3E} B"
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.3g} {unit}"
    return f"{nbytes} B"  # pragma: no cover


def check_units(units: str) -> float:
    """Return bytes per unit for ``"GB"`` (1e9) or ``"GiB"`` (2**30). Raises UsageError: any other text."""
    try:
        return UNITS[units]
    except KeyError:
        raise UsageError(f"units {units!r} not known", "use GB or GiB") from None


def to_rate(bytes_per_second: float, units: str = "GB") -> float:
    """Convert B/s into GB/s (1e9) or GiB/s (2**30)."""
    return bytes_per_second / check_units(units)


def format_rate(bytes_per_second: float, units: str = "GB") -> str:
    """Format a bandwidth like "55.41" (no unit; the column header carries it)."""
    v = to_rate(bytes_per_second, units)
    if v >= 100:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    if v >= 0.001 or v == 0:
        return f"{v:.3f}"
    return f"{v:.3g}"  # a tiny rate keeps its digits instead of printing as 0.000


def size_sweep(min_bytes: int, max_bytes: int, step_factor: float) -> list[int]:
    """Sizes in bytes from min to max multiplying by step_factor, as nccl-tests' -b/-e/-f; max always included. Raises
    UsageError: min > max, step_factor outside :data:`STEP_FACTOR`, or more than MAX_SWEEP_POINTS sizes."""
    if min_bytes > max_bytes:
        raise UsageError(f"min size {format_size(min_bytes)} is larger than max size {format_size(max_bytes)}",
                         "give -b <= -e")
    STEP_FACTOR.check(step_factor)
    if math.log(max_bytes / min_bytes) / math.log(step_factor) > MAX_SWEEP_POINTS:
        raise UsageError(f"step factor {step_factor!r} from {format_size(min_bytes)} to {format_size(max_bytes)} "
                         f"gives more than {MAX_SWEEP_POINTS} sizes", "use a larger -f, e.g. -f 2")
    sizes: list[int] = []
    s = float(min_bytes)
    while s <= max_bytes:
        v = int(round(s))
        if not sizes or v != sizes[-1]:
            sizes.append(v)
        s *= step_factor
    if sizes[-1] != max_bytes:
        sizes.append(max_bytes)
    return sizes

"""The one bound of each number: declared on a Spec's field, checked by its constructor."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpubench.core.bounds import Bound, bounded, check_bounds, device_field, field_bound
from gpubench.core.errors import UsageError


def _line(bound: Bound, value) -> str:
    with pytest.raises(UsageError) as e:
        bound.check(value)
    return e.value.one_line()


def test_a_value_within_the_bound_or_none_passes_unchanged():
    b = Bound("-n/--iters", lo=1, hi=10)
    assert b.check(1) == 1 and b.check(10) == 10 and b.check(None) is None
    assert Bound("--min-time", lo=0, above=True).check(1e-9) == 1e-9


@pytest.mark.parametrize("bound,value,line", [
    (Bound("-n/--iters", lo=1), 0, "-n/--iters 0 must be >= 1"),
    (Bound("--min-time", lo=0, above=True, unit="seconds"), 0.0, "--min-time 0 must be > 0 seconds"),
    (Bound("-w/--warmup", lo=0, hi=10**6), 10**6 + 1, "-w/--warmup 1000001 is too large (at most 1,000,000)"),
    (Bound("-T/--timeout", hi=604800.0, unit="seconds"), 1e9, "-T/--timeout 1e+09 is too large (at most 604,800 seconds)"),
    (Bound("--frac-match", lo=0, above=True, hi=1.0), 1.5, "--frac-match 1.5 is too large (at most 1)"),
    (Bound("--alpha", lo=0, above=True, hi=1, below=True), 1, "--alpha 1 must be < 1"),
    (Bound("-c", hi=5), 10**30, "-c (a 31-digit number) is too large (at most 5)"),
    (Bound("-c", lo=0), float("nan"), "-c nan is not a finite number"),
    (Bound("-c", lo=0), float("-inf"), "-c -inf is not a finite number"),
    (Bound("-c", lo=0), True, "-c True is not a number"),
    (Bound("-c", lo=0), "3", "-c '3' is not a number"),
])
def test_a_value_outside_is_one_line_naming_option_value_and_bound(bound, value, line):
    assert _line(bound, value) == line


@pytest.mark.parametrize("bound,value,line", [
    (Bound("-T/--timeout", lo=0, hi=604800.0, unit="seconds"), 604800.5,
     "-T/--timeout 604800.5 is too large (at most 604,800 seconds)"),
    (Bound("--expect-busbw", lo=0, above=True, hi=1e6, unit="GB/s"), 1000001.0,
     "--expect-busbw 1000001.0 is too large (at most 1,000,000 GB/s)"),
    (Bound("-t/--time", lo=0.1, unit="seconds"), 0.0999999, "-t/--time 0.0999999 must be >= 0.1 seconds"),
])
def test_a_value_just_past_its_bound_is_shown_with_the_digits_that_put_it_there(bound, value, line):
    assert _line(bound, value) == line


def test_an_upper_bound_may_be_read_from_the_machine_when_checked():
    seen = []
    b = Bound("--threads", lo=1, hi=lambda: seen.append(1) or 8)
    assert b.check(8) == 8 and seen == [1]
    assert _line(b, 9) == "--threads 9 is too large (at most 8)"


@dataclass(frozen=True)
class _Spec:
    runs: int = bounded(3, "--runs", lo=1, hi=100)
    device: int = device_field()
    free: int = -5  # no bound declared: not checked

    def __post_init__(self):
        check_bounds(self)


def test_a_spec_checks_every_bounded_field_in_order_and_only_those():
    assert _Spec().runs == 3 and _Spec(free=-10**9).free == -10**9
    with pytest.raises(UsageError, match=r"^--runs 0 must be >= 1$"):
        _Spec(runs=0, device=-1)
    with pytest.raises(UsageError, match=r"^-d/--device -1 must be >= 0$"):
        _Spec(device=-1)
    with pytest.raises(UsageError, match=r"^-d/--device 2147483648 is too large$"):
        _Spec(device=2**31)


def test_a_field_bound_is_found_by_name_and_only_where_declared():
    assert field_bound(_Spec, "runs") == Bound("--runs", 1, 100)
    with pytest.raises(KeyError):
        field_bound(_Spec, "free")

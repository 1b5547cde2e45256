import pytest

from gpubench.core.errors import UsageError
from gpubench.core.units import check_units, format_rate, format_size, parse_size, size_sweep, to_rate


@pytest.mark.parametrize("text,expected", [
    ("4096", 4096), (4096, 4096), ("4KiB", 4096), ("4K", 4096), ("4k", 4096), ("4KB", 4000),
    ("1M", 2**20), ("1MiB", 2**20), ("1MB", 10**6), ("1G", 2**30), ("1GiB", 2**30), ("1GB", 10**9),
    ("30GB", 30 * 10**9), ("1.5KiB", 1536), ("4096B", 4096), (" 64 KiB ", 65536), ("1T", 2**40), ("4Ki", 4096),
    ("+4K", 4096),  # a leading + is read on sizes as on numbers (docs/errors.md)
])
def test_parse_size_good(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["0", "-5", "12xb", "", "KiB", "1.3B", "1.0000001K", "1e9", "--1", "0KiB", "++4K", "+-4K", "+0"])
def test_parse_size_bad(text):
    with pytest.raises(UsageError) as info:
        parse_size(text, what="-b")
    assert "-b" in info.value.message
    assert "\n" not in info.value.one_line()


def test_parse_size_rejects_bool_and_negative_int():
    with pytest.raises(UsageError):
        parse_size(-1)


@pytest.mark.parametrize("n,text", [(0, "0 B"), (1023, "1023 B"), (4096, "4 KiB"), (1536, "1.5 KiB"),
                                    (2**30, "1 GiB"), (3 * 2**20, "3 MiB"), (10**9, "954 MiB")])
def test_format_size(n, text):
    assert format_size(n) == text


def test_units_and_rates():
    assert check_units("GB") == 1e9 and check_units("GiB") == 2**30
    with pytest.raises(UsageError):
        check_units("MB")
    assert to_rate(55.41e9, "GB") == pytest.approx(55.41)
    assert to_rate(2**30, "GiB") == 1.0
    assert format_rate(55.4123e9) == "55.41"
    assert format_rate(396.45e9) == "396.4"
    assert format_rate(0.5e9) == "0.500"


def test_size_sweep():
    assert size_sweep(4096, 65536, 4) == [4096, 16384, 65536]
    assert size_sweep(4096, 4096, 2) == [4096]
    assert size_sweep(1000, 5000, 2) == [1000, 2000, 4000, 5000]  # max always included
    assert size_sweep(1, 3, 1.5) == [1, 2, 3]
    with pytest.raises(UsageError, match="larger than"):
        size_sweep(2**30, 2**20, 2)
    with pytest.raises(UsageError, match=r"-f/--step-factor 1 must be > 1"):
        size_sweep(1, 10, 1)
    with pytest.raises(UsageError, match=r"-f/--step-factor 1e\+19 is too large") as e:
        size_sweep(1, 10, 1e19)  # the bound its option's parser names is the one held
    assert e.value.hint == "at most 9.22337e+18"


def test_tiny_rate_keeps_digits():
    assert format_rate(0) == "0.000"
    assert format_rate(4.98e5) == "0.000498"  # 498 kB/s is not 0
    assert format_rate(2.5e6) == "0.003"


def test_a_size_past_its_options_own_cap_names_that_cap_however_far_over():
    assert parse_size("64MiB", what="-l/--length", most=64 << 20) == 64 << 20
    for text in ("128MiB", "9000000T", "9" * 40):
        with pytest.raises(UsageError, match=r"-l/--length .* is over 64 MiB") as e:
            parse_size(text, what="-l/--length", most=64 << 20)
        assert e.value.hint == "use 64MiB or less"

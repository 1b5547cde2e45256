"""Every numeric option of every command (net checks its own) is
bounded before any work: ASCII digits only (Python's int() and float() read "١٢" as 12 and
"1_000" as 1000), finite (no inf, nan, 1e400), at most what the option can mean; one line naming
the value and the largest accepted, exit 2. Also: copy -m '' is refused (never read as the
default), and nccl-tests binary names as a collective get the list of accepted names.

The parameters are read from the commands themselves, so an option added later is covered.

And the sweeps: a min size above the max, a step factor that would make more than 1000 sizes,
sizes beyond any machine or above its memory; repeated and negative device ids.
"""

from __future__ import annotations

import re

import click
import pytest

from gpubench.kit import StrictFloat, StrictInt
from gpubench.core.bounds import MAX_DEVICE_ORDINAL, MAX_MIN_TIME_S, MAX_REPEATS, MAX_TIMEOUT_S
from gpubench.core.options import parse_number
from gpubench.core.registry import plugins

HUGE = "9" * 400
PINNED = "tests/data/copy-pinned-h200.json"


def _numeric_options():
    from gpubench.cli.app import cli

    ctx = click.Context(cli)
    out = []
    for name in plugins():
        cmd = cli.get_command(ctx, name)
        for p in cmd.params:
            if isinstance(p, click.Option) and isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType)):
                out.append((name, p))
    return out


OPTIONS = _numeric_options()
IDS = [f"{c} {p.opts[-1]}" for c, p in OPTIONS]


def _argv(command: str, opt: str, value: str) -> list[str]:
    argv = [command, opt, value]
    if command == "compare":
        argv += [PINNED, PINNED]
    if command == "plot":
        argv += ["-o", "x.png", PINNED]
    return argv


def test_every_numeric_option_is_hardened():
    assert len(OPTIONS) >= 30
    for c, p in OPTIONS:
        assert isinstance(p.type, (StrictInt, StrictFloat)), (c, p.opts)


HOSTILE = [
    ("١٢", r"'١٢' is not (an integer|a finite number)"),  # Arabic-Indic digits
    ("１２", r"is not (an integer|a finite number)"),  # full-width digits
    ("1_000", r"'1_000' is not (an integer|a finite number)"),
    ("inf", r"(is not an integer|'inf' is not a finite number)"),
    ("nan", r"(is not an integer|'nan' is not a finite number)"),
    ("1e400", r"(is not an integer|1e400 is too large \(at most|1e400 must be < )"),
    (HUGE, r"\(a 400-digit number\) (is too large \(at most [0-9,.e+]+( [a-zA-Z/]+)?\)|must be < [0-9])"),
]


@pytest.mark.parametrize("command,param", OPTIONS, ids=IDS)
def test_hostile_numbers_are_one_line_exit_2(run_cli, tmp_path, monkeypatch, command, param):
    """Unicode digits, digit groups, inf, nan, overflow and a 400-digit number: exit 2, one line naming
    the option and what it accepts, never the number's 400 digits."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tests" / "data").mkdir(parents=True)
    import shutil
    from pathlib import Path

    shutil.copy(Path(__file__).resolve().parents[1] / "data" / "copy-pinned-h200.json", tmp_path / PINNED)
    opt = param.opts[-1]
    for value, needle in HOSTILE:
        if value == "1_000" and getattr(param.type, "digit_groups", False):
            # merge's integers are read as dask-cuda's argparse type=int reads them: 50_000_000 is a
            # chunk size in both tools' docs; Unicode digits stay refused (the cases above)
            assert param.type.convert(value, param, None) == 1000
            continue
        code, out, err = run_cli(*_argv(command, opt, value))
        assert code == 2, (command, opt, value, out, err)
        lines = err.splitlines()
        assert len(lines) == 1 and "Traceback" not in err, err
        assert lines[0].startswith(f"gpubench: error: {'/'.join(param.opts)} "), lines[0]
        assert re.search(needle, lines[0]), lines[0]
        assert HUGE not in lines[0]


@pytest.mark.parametrize("argv,line", [
    (["copy", "-w", str(MAX_REPEATS + 1)], "-w/--warmup 1000001 is too large (at most 1,000,000)"),
    (["copy", "--min-time", "3601"], "--min-time 3601 is too large (at most 3,600 seconds)"),
    (["copy", "--min-time", "1e9"], "--min-time 1e+09 is too large (at most 3,600 seconds)"),
    (["pin", "-d", str(MAX_DEVICE_ORDINAL + 1)], "-d/--device 2147483648 is too large (at most 2,147,483,647)"),
    (["nccl", "-r", "2147483648"], "-r/--root 2147483648 is too large (at most 2,147,483,647)"),
    (["nccl", "-T", "1e9"], "-T/--timeout 1e+09 is too large (at most 604,800 seconds)"),
    (["nccl", "--expect-busbw", "1e7"], "--expect-busbw 1e+07 is too large (at most 1,000,000 GB/s)"),
    (["nccl", "-G", "2147483648"], "-G/--cuda-graph 2147483648 is too large (at most 1,000,000)"),
    (["compare", "--threshold", "1e7", PINNED, PINNED], "--threshold 1e+07 is too large (at most 1,000,000 percent)"),
])
def test_the_largest_accepted_value_is_named(run_cli, argv, line):
    code, out, err = run_cli(*argv)
    assert code == 2 and err.strip() == f"gpubench: error: {line}", err


@pytest.mark.parametrize("argv,line", [
    (["compare", "--threshold", "1e400", PINNED, PINNED], "--threshold 1e400 is too large (at most 1,000,000 percent)"),
    (["suite", "--check", PINNED, "--node-timeout", "1e400"],
     "--node-timeout 1e400 is too large (at most 604,800 seconds)"),
    (["net", "nodes", "-T", "1e400"], "-T/--timeout 1e400 is too large (at most 604,800 seconds)"),
    (["net", "local", "-t", "1e400"], "-t/--time 1e400 is too large (at most 3,600 seconds)"),
    (["net", "client", "h", "-O", "1e999"], "-O/--omit 1e999 is too large (at most 600 seconds)"),
    (["net", "local", "-i", "1e400"], "-i/--interval 1e400 is too large (at most 60 seconds)"),
    (["plot", PINNED, "-o", "p.png", "--peak", "1e400"], "--peak 1e400 is too large (at most 1,000,000)"),
    (["compare", "--threshold", "inf", PINNED, PINNED], "--threshold 'inf' is not a finite number (use the digits "
     "0-9 with an optional '.' and exponent, at most 1,000,000 percent)"),
])
def test_a_value_beyond_a_double_names_the_options_own_limit(run_cli, argv, line):
    """An option that fills no Spec field (compare, suite, net's protocol caps, net nodes' -T)
    still names its own limit, not the double's, for a value that overflows to infinity."""
    code, out, err = run_cli(*argv)
    assert code == 2 and err.strip() == f"gpubench: error: {line}", err


@pytest.mark.parametrize("argv", [["copy", "--min-time", str(MAX_MIN_TIME_S)], ["nccl", "-T", str(MAX_TIMEOUT_S)],
                                  ["copy", "-w", " 3 "], ["copy", "-n", "+3"], ["copy", "--min-time", ".5"],
                                  ["copy", "--min-time", "1e-3"], ["nccl", "-r", "0"]])
def test_ordinary_values_still_pass_the_option_check(run_cli, argv):
    from gpubench.core.gpu import gpu_available

    if gpu_available():
        pytest.skip("a GPU is visible: these would measure")
    code, out, err = run_cli(*argv)
    assert code == 2 and "no CUDA device is visible" in err, err


def test_parse_number_on_its_own():
    assert parse_number("12", "-n") == 12 and parse_number("1.5e1", "-t", float) == 15.0
    assert parse_number(7, "-n") == 7  # a default
    # a double reads 1e-400 as 0: --threshold 1e-400 became 0 without a word
    with pytest.raises(Exception, match=r"--threshold 1e-400 is too small to tell from 0"):
        parse_number("1e-400", "--threshold", float)
    assert parse_number("0e5", "-t", float) == 0.0 and parse_number("1e-300", "-t", float) == 1e-300
    for bad in ("١٢", "1_0", "0x10", "1 2", "", "--", "True"):
        with pytest.raises(Exception, match="is not an integer"):
            parse_number(bad, "-n")
    # merge's integers (dask-cuda's argparse type=int): "_" between ASCII digit groups only
    assert parse_number("50_000_000", "-c", digit_groups=True) == 50_000_000
    for bad in ("١٢", "1__0", "_1", "1_", "1_٢"):
        with pytest.raises(Exception, match="is not an integer"):
            parse_number(bad, "-c", digit_groups=True)


@pytest.mark.parametrize("argv,needle", [
    (["copy", "-d", "١"], "device '١' in -d '١' is not an integer"),
    (["copy", "-d", "0,1_0"], "device '1_0' in -d '0,1_0' is not an integer"),
    (["p2p", "-d", f"0,{HUGE}"], "is not an integer"),
    (["copy", "-b", "١K"], "-b/--min-bytes '١K' is not a size"),
    (["nccl", "-e", "１M"], "-e/--max-bytes '１M' is not a size"),
    (["copy", "-m", ""], "-m/--memory '' is empty"),
    (["nccl", "all_reduce_perf"], "collective 'all_reduce_perf' not known (use one of all-reduce, all-gather"),
    (["nccl", "alltoall_perf"], "collective 'alltoall_perf' not known (use one of"),
])
def test_lists_sizes_memory_and_collective_names(run_cli, argv, needle):
    code, out, err = run_cli(*argv)
    assert code == 2 and needle in err and len(err.splitlines()) == 1, err
    assert HUGE not in err


# ---------------------------------------------------------------------------------------------
# sweeps that collapse or exceed memory, repeated and negative devices: one line, exit 2
# ---------------------------------------------------------------------------------------------

NO_GPU = "no CUDA device is visible"


def _one_error_line(err: str) -> str:
    """The single stderr line of an error (fails when there are more, or a traceback)."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gpubench") and ": error: " in lines[0], err
    return lines[0]


def _refused_matching(run_cli, *argv, needle: str) -> str:
    """Exit 2 with one error line matching the regular expression ``needle``."""
    code, out, err = run_cli(*argv)
    assert code == 2, (argv, code, out, err)
    line = _one_error_line(err)
    assert re.search(needle, line), (needle, line)
    return line


@pytest.mark.parametrize("argv,needle", [
    (["nccl", "-b", "1G", "-e", "1M"], "min size 1 GiB is larger than max size 1 MiB"),
    (["nccl", "all-gather", "-b", "1M", "-e", "8"], "larger than max size 8 B"),
    (["batch", "--piece", "4KiB", "--total", "1KiB"], "not a whole number of 4 KiB pieces"),
    # a step factor barely above 1 would make millions of sizes (minutes of looping, gigabytes of list)
    (["copy", "-b", "1", "-e", "1T", "-f", "1.0001"], "more than 1000 sizes"),
    (["nccl", "-f", "1.0000001"], "more than 1000 sizes"),
    # sizes beyond any machine, 400 digits included (a float overflows on them): named, no traceback
    (["copy", "-b", "99999999999T", "-e", "99999999999T"], r"-b/--min-bytes .* over \d+ bytes \(8 EiB\)"),
    (["nccl", "-b", HUGE, "-e", HUGE], r"-b/--min-bytes .* over \d+ bytes"),
    (["copy", "-b", "4KiB", "-e", HUGE], r"-e/--max-bytes .* over \d+ bytes"),
    (["batch", "--piece", HUGE], r"--piece .* over \d+ bytes"),
    (["overlap", "--size", HUGE], r"--size .* over \d+ bytes"),
    # a row count with 400 digits: its buffer size is too large to format as a float
    (["memcpy2d", "-H", HUGE], r"-H/--height \(a 400-digit number\) is too large \(at most 9,223,372,036,854,775,807\)"),
    (["memcpy2d", "-H", "2147483648"], "does not fit in a buffer"),
])
def test_sweep_limits_that_collapse_are_one_line(run_cli, argv, needle):
    _refused_matching(run_cli, *argv, needle=needle)

BIG = "99999999999999999999999"  # beyond int64: parsed before any Spec holds it


@pytest.mark.parametrize("argv,needle", [
    (["net", "local", "-P", BIG], r"-P/--parallel \S+ is too large \(at most 128 streams\)"),
    (["net", "client", "h", "-p", BIG], r"-p/--port \S+ is too large \(at most 65,535\)"),
    (["net", "server", "-p", BIG], r"-p/--port \S+ is too large \(at most 65,535\)"),
    (["net", "client", "h", "--cport", BIG], r"--cport \S+ is too large \(at most 65,535\)"),
    (["net", "nodes", "--to", BIG], r"--to \S+ is too large \(at most 1,048,575\)"),
    (["plot", "--dpi", BIG, "-o", "x.png", "x.json"], r"--dpi \S+ is too large \(at most 1,000\)"),
    (["plot", "--dpi", "5", "-o", "x.png", "x.json"], r"--dpi 5 must be >= 10"),
    (["merge", "-t", "cpu", "-c", "9999999999999999999"], r"at most 9,223,372,036,854,775,807\)"),
    # a limit checked with others in the Spec is still named by the parser past a 64-bit integer
    (["net", "local", "--protocol", "ucx", "--in-flight", BIG], r"--in-flight \S+ is too large \(at most 1,024\)"),
    (["net", "local", "--protocol", "ucx", "--in-flight", "-0"], r"--in-flight -0 must be >= 1$"),
    (["net", "local", "--protocol", "ucx", "-d", BIG], r"-d/--device \S+ is too large \(at most 2,147,483,647\)"),
    (["overlap", "--streams", BIG], r"--streams \S+ is too large \(at most 64\)"),
    (["overlap", "--chunks", BIG], r"--chunks \S+ is too large \(at most 1,024\)"),
    (["overlap", "--work", f"0,{BIG}"], r"--work \S+ is too large \(at most 1,048,576\)"),
    (["nccl", "-a", BIG], r"-a/--average \S+ is too large \(at most 3\)"),
    (["batch", "--count", BIG], r"--count \S+ is too large \(at most 1,048,576\)"),
    (["net", "local", "-l", "9000000T"], r"-l/--length '9000000T' is over 64 MiB \(use 64MiB or less\)"),
    # 0 is suggested only where the option takes it
    (["net", "local", "-t", "1e-400"], r"-t/--time 1e-400 is too small to tell from 0 \(use a value of at least 0.1 seconds\)$"),  # its own floor
    (["net", "local", "-i", "1e-400"], r"-i/--interval 1e-400 .*least [^,]*\)$"),
    (["net", "local", "-O", "1e-400"], r"-O/--omit 1e-400 .*, or 0\)$"),
])
def test_a_number_beyond_its_type_names_the_options_own_range(run_cli, argv, needle):
    _refused_matching(run_cli, *argv, needle=needle)


@pytest.mark.parametrize("argv", [
    ["copy", "-b", "8T", "-e", "8T"],
    ["copy", "--pinned", "-b", "4T", "-e", "8T"],
    ["nccl", "-b", "4T", "-e", "8T"],
    ["nccl", "reduce-scatter", "-b", "8T", "-e", "8T"],
    ["batch", "--piece", "1T", "--count", "4096"],
])
def test_min_and_max_both_above_memory_are_refused_before_any_work(run_cli, argv):
    # no GPU: the no-GPU line; with a GPU: the preflight names the size and the free memory
    _refused_matching(run_cli, *argv, needle=f"{NO_GPU}| free|fit|host memory|page-lock")

@pytest.mark.parametrize("argv,needle", [
    (["copy", "-d", "0,1,0"], "device 0 is repeated"),
    (["p2p", "-d", "1,0,1"], "device 1 is repeated"),
    (["nccl", "-d", "0,1,0"], "device 0 is repeated"),
    (["merge", "-d", "0,1,0"], "device 0 is repeated"),
    (["nccl", "-d", "-1"], "device -1 .* is negative"),
    (["p2p", "-d", "0,-1"], "device -1 .* is negative"),
    (["merge", "-d", "-1"], "device -1 .* is negative"),
    (["memcpy2d", "-d", "-1"], "-d/--device -1 must be >= 0"),
    (["overlap", "-d", "-1"], "-d/--device -1 must be >= 0"),
])
def test_repeated_and_negative_devices(run_cli, argv, needle):
    _refused_matching(run_cli, *argv, needle=needle)


# ---- one rule for every comma list and every zero: no empty entry, no sign on zero ----

@pytest.mark.parametrize("argv,needle", [
    (["copy", "-d", ""], r"-d/--devices '' is empty"),  # never read as the default device
    (["copy", "-d", ","], r"-d/--devices ',' has an empty 1st entry"),
    (["copy", "-d", "0,1,,"], r"-d/--devices '0,1,,' has an empty 3rd entry"),
    (["nccl", "-d", " "], r"-d/--devices ' ' is empty"),
    (["merge", "-t", "cpu", "-d", "0,"], r"-d/--devices '0,' has an empty 2nd entry"),
    (["batch", "-d", ""], r"-d/--device '' is not an integer"),
    (["copy", "-m", "pinned,"], r"-m/--memory 'pinned,' has an empty 2nd entry"),
    (["copy", "--direction", ",h2d"], r"--direction ',h2d' has an empty 1st entry"),
    (["batch", "--piece", "4K,,8K"], r"--piece '4K,,8K' has an empty 2nd entry"),
    (["memcpy2d", "-W", "4K,,8K"], r"--width '4K,,8K' has an empty 2nd entry"),
    (["overlap", "--work", "0,,1024"], r"--work '0,,1024' has an empty 2nd entry"),
    (["p2p", "-t", "write,"], r"-t/--tests 'write,' has an empty 2nd entry"),
    (["pin", "--op", "pin,,unpin"], r"--op 'pin,,unpin' has an empty 2nd entry"),
    (["copy", "-m", "pinned,pinned"], r"value pinned is repeated in -m/--memory 'pinned,pinned'"),
    (["overlap", "--work", "-0"], r"--work -0 has a minus sign \(write 0\)"),
    (["copy", "-d", "-0"], r"device -0 in -d '-0' has a minus sign \(write 0\)"),
    # an empty file or folder name is refused, never read as the current folder (Path("") is ".")
    (["suite", "-o", "", "--check", "x.json", "--expect", "gcp-a2"], r"-o/--output-dir '' is empty"),
    (["suite", "--expect", ""], r"--expect '' is empty"),
    (["suite", "--check", "", "--expect", "gcp-a2"], r"a file name is empty: ''"),
    (["compare", "", "x.json"], r"a file name is empty: ''"),
    (["report", " ", "-o", "r.html"], r"a file name is empty: ' '"),
    (["report", "x.json", "-o", "r.html", "--title", ""], r"--title '' is empty"),
    (["plot", "x.json", "-o", "p.png", "--title", " "], r"--title ' ' is empty"),
    (["merge", "-t", "cpu", "-d", "0,-0"], r"device -0 in -d '0,-0' has a minus sign"),
    (["copy", "-b", "-0"], r"-b/--min-bytes '-0'"),
    (["copy", "-w", "-0"], r"-w/--warmup -0 has a minus sign"),
    (["nccl", "--timeout", "-0.0"], r"-0.0 (has a minus sign|must be)"),
    # where the range refuses 0, the line gives the range, never "write 0"
    (["copy", "-n", "-0"], r"^gpubench: error: -n/--iters -0 must be >= 1$"),
    (["copy", "--min-time", "-0"], r"^gpubench: error: --min-time -0 must be > 0 seconds$"),
    (["copy", "--min-time", "1e-400"], r"--min-time 1e-400 is too small to tell from 0 \(use a value of at least 1e-300\)$"),
    (["nccl", "-T", "1e-400"], r"-T/--timeout 1e-400 is too small to tell from 0 \(use a value of at least 1e-300, or 0\)$"),
])
def test_every_comma_list_refuses_an_empty_entry_and_every_zero_its_sign(run_cli, argv, needle):
    _refused_matching(run_cli, *argv, needle=needle)


def test_a_device_list_reads_each_entry_as_every_integer_option_does():
    from gpubench.core.options import parse_devices

    assert parse_devices("+1") == (1,) and parse_devices(" 0 , +2") == (0, 2)  # a '+' as -P +2 takes it
    for bad, needle in [("١", "is not an integer"), ("1_0", "is not an integer"), ("-0", "has a minus sign"),
                        ("-1", "is negative"), ("+-1", "is not an integer")]:
        with pytest.raises(Exception, match=needle):
            parse_devices(bad)


def test_split_list_keeps_the_order_and_strips_ascii_space_only():
    from gpubench.core.options import split_list

    assert split_list(" 0, 1 ,2", "-d", "0,1") == ("0", "1", "2")
    assert split_list("\u00a0h2d", "--direction", "h2d") == ("\u00a0h2d",)
    for bad, needle in [("", "is empty"), ("a,,b", "empty 2nd entry"), ("a,b,a", "a is repeated"),
                        (",", "empty 1st entry"), ("a,b,c,", "empty 4th entry")]:
        with pytest.raises(Exception, match=needle):
            split_list(bad, "-x", "a,b")


# ---- options parsed by click's own INT/FLOAT: ASCII digits only ----

@pytest.mark.parametrize("argv,needle", [
    (["net", "local", "-P", "٣"], "-P/--parallel '٣' is not an integer"),  # net's options too
    (["net", "local", "-t", "٣"], "-t/--time '٣' is not a finite number"),
    (["net", "local", "-i", "٠.٢"], "-i/--interval '٠.٢' is not a finite number"),
    (["net", "local", "-P", "inf"], "-P/--parallel 'inf' is not an integer"),  # click: "not a valid integer"
    (["net", "local", "-P", ""], "-P/--parallel '' is not an integer"),
    (["net", "server", "-1", "-p", "٣"], "-p/--port '٣' is not an integer"),  # never port 3
    (["net", "local", "-P", "\u00a04"], "-P/--parallel '\\xa04' is not an integer"),  # U+00A0 is not stripped
    (["merge", "-t", "cpu", "-c", "\u00a05"], "-c/--chunk-size '\\xa05' is not an integer"),
    (["suite", "--check", "x.json", "--expect", "e.toml", "--node-timeout", "-1"],
     "--node-timeout -1 must be > 0 seconds"),
])
def test_every_numeric_option_takes_ascii_digits_only(run_cli, argv, needle):
    code, out, err = run_cli(*argv)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, (code, err)

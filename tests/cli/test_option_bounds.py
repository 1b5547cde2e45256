"""Issue 18, item 1: every numeric option of every command (net checks its own) is
bounded before any work: ASCII digits only (Python's int() and float() read "١٢" as 12 and
"1_000" as 1000), finite (no inf, nan, 1e400), at most what the option can mean; one line naming
the value and the largest accepted, exit 2. Also: copy -m '' is refused (it silently meant the
default), and nccl-tests binary names as a collective get the list of accepted names.

The parameters are read from the commands themselves, so an option added later is covered.
"""

from __future__ import annotations

import re

import click
import pytest

from gpubench.kit import StrictFloat, StrictInt
from gpubench.core.options import MAX_DEVICE_ORDINAL, MAX_MIN_TIME_S, MAX_REPEATS, MAX_TIMEOUT_S, parse_number
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


@pytest.mark.parametrize("value,needle", [
    ("١٢", r"'١٢' is not (an integer|a finite number)"),  # Arabic-Indic digits
    ("１２", r"is not (an integer|a finite number)"),  # full-width digits
    ("1_000", r"'1_000' is not (an integer|a finite number)"),
    ("inf", r"(is not an integer|'inf' is not a finite number)"),
    ("nan", r"(is not an integer|'nan' is not a finite number)"),
    ("1e400", r"(is not an integer|1e400 is too large \(at most)"),
    (HUGE, r"\(a 400-digit number\) is too large \(at most [0-9,.e+]+\)"),
])
@pytest.mark.parametrize("command,param", OPTIONS, ids=IDS)
def test_hostile_numbers_are_one_line_exit_2(run_cli, tmp_path, monkeypatch, command, param, value, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tests" / "data").mkdir(parents=True)
    import shutil
    from pathlib import Path

    shutil.copy(Path(__file__).resolve().parents[1] / "data" / "copy-pinned-h200.json", tmp_path / PINNED)
    opt = param.opts[-1]
    if value == "1_000" and getattr(param.type, "digit_groups", False):
        # merge's integers are read as dask-cuda's argparse type=int reads them: 50_000_000 is a
        # chunk size in both tools' docs; Unicode digits stay refused (the cases above)
        assert param.type.convert(value, param, None) == 1000
        return
    code, out, err = run_cli(*_argv(command, opt, value))
    assert code == 2, (command, opt, value, out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"gpubench: error: {'/'.join(param.opts)} "), lines[0]
    assert re.search(needle, lines[0]), lines[0]
    assert HUGE not in lines[0]


@pytest.mark.parametrize("argv,line", [
    (["copy", "-w", str(MAX_REPEATS + 1)], "-w/--warmup 1000001 is too large (at most 1,000,000)"),
    (["copy", "--min-time", "3601"], "--min-time 3601 is too large (at most 3,600)"),
    (["copy", "--min-time", "1e9"], "--min-time 1e9 is too large (at most 3,600)"),
    (["pin", "-d", str(MAX_DEVICE_ORDINAL + 1)], "-d/--device 2147483648 is too large (at most 2,147,483,647)"),
    (["nccl", "-r", "2147483648"], "-r/--root 2147483648 is too large (at most 2,147,483,647)"),
    (["nccl", "-T", "1e9"], "-T/--timeout 1e9 is too large (at most 604,800)"),
    (["nccl", "--expect-busbw", "1e7"], "--expect-busbw 1e7 is too large (at most 1,000,000)"),
    (["nccl", "-G", "2147483648"], "-G/--cuda-graph 2147483648 is too large (at most 1,000,000)"),
    (["compare", "--threshold", "1e7", PINNED, PINNED], "--threshold 1e7 is too large (at most 1,000,000)"),
])
def test_the_largest_accepted_value_is_named(run_cli, argv, line):
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

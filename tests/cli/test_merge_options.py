"""merge's options as a user meets them: every bad value is one line and exit 2 before any Dask
import or cluster start (ASCII digits only, bounds that name the machine's own limits, the largest
chunk size that fits the workers' memory); dask-cuda's digit groups (50_000_000) still read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


_NO_DASK_PROBE = """
import json, sys
from gpubench.cli.app import main
try:
    main(json.loads(sys.stdin.read()))
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("distributed", "dask.dataframe", "pandas", "cupy") if m in sys.modules)
print("EXIT", code, "HEAVY", ",".join(heavy) or "-")
"""

def _probe(*argv):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", _NO_DASK_PROBE], input=json.dumps(argv), capture_output=True, text=True,
                       timeout=120, env=env)  # argv on stdin: one 600 kB argument is over the kernel's limit
    return p.stdout.strip().splitlines()[-1], p.stderr

def test_an_interface_this_host_lacks_is_refused_before_dask_is_imported():
    """`merge --interface bogus0` is refused before distributed, pandas, dask.dataframe (and CuPy
    through dask.array) are imported, which take seconds on a loaded host."""
    pytest.importorskip("psutil")
    last, err = _probe("merge", "-t", "cpu", "--interface", "bogus0")
    assert last == "EXIT 2 HEAVY -", (last, err)
    assert "--interface 'bogus0' is not a network interface of this host" in err

@pytest.mark.parametrize("argv,needle", [
    (["-c", "١٢"], "-c/--chunk-size '١٢' is not an integer"),  # int() would read Arabic-Indic digits as 12
    (["--base-chunks", "１２"], "--base-chunks '１２' is not an integer"),
    (["--frac-match", "٠.٥"], "--frac-match '٠.٥' is not a finite number"),
    (["--timeout", "1e-400"], "--timeout 1e-400 is too small to tell from 0"),  # not "--timeout 0 must be > 0"
    # gpubench's numbers are ASCII digits (dask's parse_bytes reads any script's)
    (["--timeout", "١٢"], "--timeout '١٢' is not a finite number"),
    (["--timeout", "1٢m"], "--timeout '1٢' is not a finite number"),
    (["-t", "gpu", "--rmm-pool-size", "١GB"], "--rmm-pool-size '١GB' is not a size"),
    (["-t", "gpu", "--rmm-pool-size", "٠.٥"], "--rmm-pool-size '٠.٥' is not a size"),
    (["--scheduler-address", ""], "--scheduler-address '' is empty"),  # not a local cluster
    (["-d", ",".join(map(str, range(100_000)))], "-d/--devices names 100,000 devices"),  # at once, not after minutes
])
def test_merge_options_refused_in_one_line_before_any_work(argv, needle):
    last, err = _probe("merge", "-t", "cpu", *argv)
    assert last == "EXIT 2 HEAVY -" and needle in err and len(err.strip().splitlines()) == 1, (last, err)

def test_merge_chunk_sizes_keep_dask_cudas_digit_groups():
    from gpubench.cli.app import cli

    import click

    cmd = cli.get_command(click.Context(cli), "merge")
    ctx = cmd.make_context("merge", ["-t", "cpu", "-c", "50_000_000", "--runs", "1_0"])
    assert ctx.params["chunk_size"] == 50_000_000 and ctx.params["runs"] == 10


BIG = "9" * 400

def _workers_of(pid: int | None = None) -> list:
    """Dask worker processes (multiprocessing spawn children) under ``pid`` (default: this process)."""
    psutil = pytest.importorskip("psutil")
    root = psutil.Process(pid) if pid else psutil.Process()
    out = []
    for c in root.children(recursive=True):
        try:
            cmd = " ".join(c.cmdline())
        except psutil.Error:
            continue
        if "spawn_main" in cmd and "resource_tracker" not in cmd and c.status() != psutil.STATUS_ZOMBIE:
            out.append(c)
    return out

@pytest.mark.parametrize("args, needle", [
    (["-c", "2147483648"], "-c/--chunk-size 2147483648: both frames"),
    (["-c", BIG], "-c/--chunk-size (a 400-digit number) is too large"),
    (["--base-chunks", "2147483648"], "--base-chunks 2147483648: 2,147,483,649 partitions"),
    (["--base-chunks", BIG], "--base-chunks (a 400-digit number) is too large"),
    (["--other-chunks", "2147483648"], "--other-chunks 2147483648: 2,147,483,649 partitions"),
    (["--other-chunks", BIG], "--other-chunks (a 400-digit number) is too large"),
    (["-c", "4611686018427387904", "--base-chunks", "2"], "numbers keys past int64"),
    (["--runs", "2147483648"], "--runs 2147483648 is too large (at most 1,000,000)"),
    (["--runs", BIG], "--runs (a 400-digit number) is too large"),
    (["--warmup-runs", "2147483648"], "--warmup-runs 2147483648 is too large (at most 1,000,000)"),
    (["--threads-per-worker", BIG], "--threads-per-worker (a 400-digit number) is too large (at most"),
    (["--threads-per-worker", "2147483648"], "--threads-per-worker 2147483648 is too large (at most"),
    (["--timeout", "inf"], "--timeout 'inf' is not a duration"),
    (["--timeout", "nan"], "--timeout 'nan' is not a duration"),
    (["--timeout", "1e400"], "--timeout 1e400 is too large (at most 604,800 seconds)"),
    (["--timeout", BIG], "--timeout (a 400-digit number) is too large"),
    (["--timeout", "1_0"], "--timeout '1_0' is not a finite number"),  # as -t/--time reads it, docs/errors.md
    (["--timeout", "+5x"], "--timeout '+5x' is not a duration"),
    (["--timeout", "1e12"], "--timeout 1e12 is too large (at most 604,800 seconds)"),
    (["--timeout", "0"], "--timeout 0 must be > 0 seconds"),
    (["--frac-match", "nan"], "--frac-match 'nan' is not a finite number"),
    (["--frac-match", "1.5"], "--frac-match 1.5 is too large (at most 1)"),
    (["-c", "١٢"], "-c/--chunk-size '١٢' is not an integer"),
    (["--runs", "١"], "--runs '١' is not an integer"),
    (["--scheduler-address", ""], "--scheduler-address '' is empty"),
    (["--scheduler-address", "tcp://:8786"], "--scheduler-address 'tcp://:8786' names no host"),
    (["--scheduler-file", ""], "--scheduler-file '' is empty"),
    (["-d", ",".join(map(str, range(100_000)))], "-d/--devices names 100,000 devices, more than one machine has "
                                                 "(at most 1,024"),
])
def test_a_value_too_large_is_refused_in_one_line_before_any_cluster(run_cli, args, needle):
    before = {p.pid for p in _workers_of()}
    code, out, err = run_cli("merge", "-t", "cpu", *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err
    assert {p.pid for p in _workers_of()} <= before  # no worker was started

@pytest.mark.parametrize("above", ["10**26", "limit + 1", "limit * 1000"])
def test_every_too_large_thread_count_names_the_machines_own_limit(run_cli, above):
    """Whether the value passes int64 or not, the line names the limit this machine has (threads-max,
    RLIMIT_NPROC), not the width of a C integer; with two workers it is shared and says so."""
    from gpubench.core.options import machine_threads

    limit = machine_threads()
    value = eval(above, {"limit": limit})  # noqa: S307 - the three expressions above
    code, _out, err = run_cli("merge", "-t", "cpu", "--threads-per-worker", str(value))
    assert code == 2 and f"at most {limit:,})" in err and "9,223,372" not in err, err
    code, _out, err = run_cli("merge", "-t", "cpu", "-d", "0,1", "--threads-per-worker", str(limit))
    assert code == 2 and f"at most {max(1, limit // 2):,}: {limit:,} threads this machine lets one user run" in err, err
    assert "shared by 2 worker(s)" in err

def test_the_memory_refusal_names_the_largest_chunk_size_that_fits(run_cli):
    """-c past the workers' memory: one line with the largest -c that fits; that -c passes the same
    check while twice as many rows do not (the arithmetic, not a guess; a fixed worker limit, since
    the host's available memory moves while other work runs)."""
    pytest.importorskip("distributed")  # merge stops at a missing dask[distributed] first
    from gpubench.plugins.merge import cluster as mc
    from gpubench.plugins.merge.bench import MergeSpec
    from gpubench.core.errors import UsageError

    code, _out, err = run_cli("merge", "-t", "cpu", "-d", "0,1", "-c", "2147483648")
    assert code == 2 and "on every worker" in err and "the largest -c/--chunk-size that fits is" in err, err
    limit = 8 * 2**30
    with pytest.raises(UsageError) as e:
        mc.check_frames_fit(MergeSpec(merge_type="cpu", devices=(0, 1), chunk_size=2147483648), None,
                            worker_limit=limit)
    largest = int(e.value.one_line().rsplit("that fits is ", 1)[1].split(")")[0].replace(",", ""))
    assert largest == (limit - mc.WORKER_BASE_BYTES) // 3 // (2 * 24 + 2 * 16)
    mc.check_frames_fit(MergeSpec(merge_type="cpu", devices=(0, 1), chunk_size=largest), None, worker_limit=limit)
    with pytest.raises(UsageError):
        mc.check_frames_fit(MergeSpec(merge_type="cpu", devices=(0, 1), chunk_size=largest + 1), None,
                            worker_limit=limit)

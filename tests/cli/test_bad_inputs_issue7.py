"""Issue 7, item 7: the bad inputs that can be checked without a GPU. Each ends with one line on
stderr naming the bad value and an exit code of 2 (3 for a save that fails after the run), never a
traceback, a hang or an unbounded read.

Cases already covered elsewhere are not repeated here: copy -b > -e, -d 0,0 and -d -1 for copy and
batch, CUDA_VISIBLE_DEVICES="" for copy, p2p and nccl (test_cli_core.py, test_batch_cli.py,
test_p2p_nccl_cli.py); compare fed an empty file, a truncated JSON, a JSON array, a newer schema, a
missing file and a folder (test_compare_cli.py); --json into a missing folder for copy and batch.

The tests hold with a GPU as well: sizes that cannot fit are then refused by the preflight before
any allocation, and device ids beyond the visible ones are named as not visible.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from readonly import OLD, read_only_folder  # noqa: E402

NO_GPU = "no CUDA device is visible"
PINNED = str(Path(__file__).resolve().parents[1] / "data" / "copy-pinned-h200.json")
MAX_RSS_MB = 200


def one_line(err: str) -> str:
    """The single stderr line of an error (fails when there are more, or a traceback)."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gpubench") and ": error: " in lines[0], err
    return lines[0]


def refused(run_cli, *argv, needle: str) -> str:
    code, out, err = run_cli(*argv)
    assert code == 2, (argv, code, out, err)
    line = one_line(err)
    assert re.search(needle, line), (needle, line)
    return line


def gb(*args, env=None, timeout=60, preexec_fn=None, cwd=None):
    """``python -m gpubench`` in a fresh process (for CUDA_VISIBLE_DEVICES and resource limits)."""
    e = dict(os.environ)
    # the source tree first, so an uninstalled checkout (PYTHONPATH=src) also runs from another cwd
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2] / "src"),
                                                    e.get("PYTHONPATH")]))
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "gpubench", *args], capture_output=True, text=True,
                          timeout=timeout, env=e, preexec_fn=preexec_fn, cwd=cwd)


# ---------------------------------------------------------------------------------------------
# sweep limits that collapse
# ---------------------------------------------------------------------------------------------

HUGE = "9" * 400  # 400 digits: a float overflows on it


@pytest.mark.parametrize("argv,needle", [
    (["nccl", "-b", "1G", "-e", "1M"], "min size 1 GiB is larger than max size 1 MiB"),
    (["nccl", "all-gather", "-b", "1M", "-e", "8"], "larger than max size 8 B"),
    (["batch", "--piece", "4KiB", "--total", "1KiB"], "not a whole number of 4 KiB pieces"),
    # a step factor barely above 1 made millions of sizes (minutes of looping, gigabytes of list)
    (["copy", "-b", "1", "-e", "1T", "-f", "1.0001"], "more than 1000 sizes"),
    (["nccl", "-f", "1.0000001"], "more than 1000 sizes"),
    # sizes beyond any machine: parse_size raised OverflowError on 400 digits (a traceback line)
    (["copy", "-b", "99999999999T", "-e", "99999999999T"], r"-b/--min-bytes .* over \d+ bytes \(8 EiB\)"),
    (["nccl", "-b", HUGE, "-e", HUGE], r"-b/--min-bytes .* over \d+ bytes"),
    (["copy", "-b", "4KiB", "-e", HUGE], r"-e/--max-bytes .* over \d+ bytes"),
    (["batch", "--piece", HUGE], r"--piece .* over \d+ bytes"),
    (["overlap", "--size", HUGE], r"--size .* over \d+ bytes"),
    # a row count with 400 digits: formatting its buffer size overflowed a float
    (["memcpy2d", "-H", HUGE], r"-H/--height \(a 400-digit number\) is too large \(at most 9,223,372,036,854,775,807\)"),
    (["memcpy2d", "-H", "2147483648"], "does not fit in a buffer"),
])
def test_sweep_limits_that_collapse_are_one_line(run_cli, argv, needle):
    refused(run_cli, *argv, needle=needle)


@pytest.mark.parametrize("argv", [
    ["copy", "-b", "8T", "-e", "8T"],
    ["copy", "--pinned", "-b", "4T", "-e", "8T"],
    ["nccl", "-b", "4T", "-e", "8T"],
    ["nccl", "reduce-scatter", "-b", "8T", "-e", "8T"],
    ["batch", "--piece", "1T", "--count", "4096"],
])
def test_min_and_max_both_above_memory_are_refused_before_any_work(run_cli, argv):
    # no GPU: the no-GPU line; with a GPU: the preflight names the size and the free memory
    refused(run_cli, *argv, needle=f"{NO_GPU}| free|fit|host memory|page-lock")


# ---------------------------------------------------------------------------------------------
# devices: repeated, negative, more than visible, hidden by CUDA_VISIBLE_DEVICES
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv,needle", [
    (["copy", "-d", "0,1,0"], "device 0 is repeated"),
    (["p2p", "-d", "1,0,1"], "device 1 is repeated"),
    (["nccl", "-d", "0,1,0"], "device 0 is repeated"),
    (["merge", "-d", "0,1,0"], "device 0 is repeated"),
    (["nccl", "-d", "-1"], "device -1 .* is negative"),
    (["p2p", "-d", "0,-1"], "device -1 .* is negative"),
    (["merge", "-d", "-1"], "device -1 .* is negative"),
    (["memcpy2d", "-d", "-1"], "-d/--device -1 is negative"),
    (["overlap", "-d", "-1"], "-d/--device -1 is negative"),
])
def test_repeated_and_negative_devices(run_cli, argv, needle):
    refused(run_cli, *argv, needle=needle)


@pytest.mark.parametrize("argv", [
    ["copy", "-d", "0,63"], ["p2p", "-d", "0,63"], ["nccl", "-d", "0,63", "-b", "1K", "-e", "1K"],
    ["batch", "-d", "63"], ["memcpy2d", "-d", "63"], ["overlap", "-d", "63"], ["merge", "-d", "63"],
])
def test_more_devices_than_visible(run_cli, argv):
    refused(run_cli, *argv, needle=f"{NO_GPU}|not visible")


@pytest.mark.parametrize("argv", [["batch"], ["memcpy2d"], ["overlap"], ["merge", "-d", "0"], ["suite", "-o", "."]])
def test_cuda_visible_devices_hiding_the_device(argv, tmp_path):
    p = gb(*argv, env={"CUDA_VISIBLE_DEVICES": ""}, cwd=tmp_path)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert NO_GPU in one_line(p.stderr)
    assert list(tmp_path.iterdir()) == []  # nothing saved


# ---------------------------------------------------------------------------------------------
# compare: files that are not results, with memory bounded
# ---------------------------------------------------------------------------------------------

# The peak RSS of this process's own memory (VmHWM). Not ru_maxrss: Linux carries the pre-exec
# high-water mark of the forking parent (here pytest, often above 200 MB) into it.
_MEASURED = (
    "import sys\n"
    "from gpubench.cli.app import main\n"
    "try:\n"
    "    main(sys.argv[1:])\n"
    "finally:\n"
    "    hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
    "    print('MAXRSS_KB', hwm)\n"
)


def compare_measured(*files: str, timeout: float = 60):
    """Run compare in a fresh process; return (exit code, stderr, peak RSS in MB)."""
    p = subprocess.run([sys.executable, "-c", _MEASURED, "compare", *files], capture_output=True, text=True,
                       timeout=timeout)
    m = re.search(r"MAXRSS_KB (\d+)", p.stdout)
    assert m, (p.stdout, p.stderr)
    return p.returncode, p.stderr, int(m.group(1)) / 1024


def test_a_1gb_garbage_file_is_refused_by_its_size_without_reading_it(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:  # sparse: 1 GiB on paper, nothing on disk
        f.truncate(2**30)
        f.seek(0)
        f.write(b"\x89garbage\xff")
    code, err, rss_mb = compare_measured(PINNED, str(big))
    assert code == 2
    assert re.search(r"big\.json is 1073741824 bytes, too large", one_line(err))
    assert rss_mb < MAX_RSS_MB, rss_mb


def test_garbage_under_the_size_limit_is_read_once_with_bounded_memory(tmp_path):
    junk = tmp_path / "junk.json"
    junk.write_bytes(b"\xffgarbage" * (4 * 2**20))  # 32 MiB, not JSON, not UTF-8
    code, err, rss_mb = compare_measured(str(junk), PINNED)
    assert code == 2
    assert "junk.json is not valid JSON" in one_line(err)
    assert rss_mb < MAX_RSS_MB, rss_mb


@pytest.mark.parametrize("unit", [b"0,", b"[],"])
def test_many_tiny_json_values_are_refused_before_parsing(tmp_path, unit):
    # 24-36 MB of text that json.loads would turn into 0.1-0.3 GB ("0,") or 0.7 GB ("[],")
    many = tmp_path / "many.json"
    many.write_bytes(b"[" + unit * 12_000_000 + b"0]")
    code, err, rss_mb = compare_measured(str(many), PINNED)
    assert code == 2
    assert re.search(r"many\.json holds about \d+ JSON values, more than the 8000000", one_line(err))
    assert rss_mb < MAX_RSS_MB, rss_mb


def test_broken_symlink_is_unreadable(run_cli, tmp_path):
    link = tmp_path / "gone.json"
    link.symlink_to(tmp_path / "deleted-result.json")
    refused(run_cli, "compare", PINNED, str(link), needle=r"cannot read .*gone\.json: No such file")


def test_named_pipe_with_no_writer_does_not_hang(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    code, err, _ = compare_measured(PINNED, str(fifo), timeout=30)  # it blocked in open() forever
    assert code == 2
    assert "pipe.json is empty" in one_line(err)


def test_device_file_is_refused_without_reading(run_cli):
    # /dev/zero has no end: it was read up to the size limit before being refused
    refused(run_cli, "compare", "/dev/zero", PINNED, needle="cannot read /dev/zero: a device or socket")


def test_process_substitution_pipe_still_reads(tmp_path):
    # what the pipe fix must keep: `gpubench compare <(ssh host cat r.json) r.json`
    p = subprocess.run(["bash", "-c", f'"{sys.executable}" -m gpubench compare <(cat "{PINNED}") "{PINNED}"'],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "20 figure(s) paired: 0 faster, 0 slower, 20 same, 0 inconclusive." in p.stdout


def test_file_name_with_a_newline_stays_one_line(run_cli, tmp_path):
    # the message quotes the name; its newline is shown escaped so the error stays one line
    refused(run_cli, "compare", PINNED, str(tmp_path / "two\nlines.json"), needle=r"two\\nlines\.json")


# ---------------------------------------------------------------------------------------------
# --json: a missing folder, a read-only target, a full disk
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["env"], ["net", "local", "-t", "0.1"]])
def test_json_into_a_missing_folder_is_refused_before_the_run(run_cli, tmp_path, argv):
    target = tmp_path / "no-such-folder" / "r.json"
    refused(run_cli, *argv, "--json", str(target), needle="no-such-folder.* does not exist")
    assert not target.parent.exists()


def test_json_inside_a_file_is_refused_and_the_file_kept(run_cli, tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("keep me")
    refused(run_cli, "env", "--json", str(f / "r.json"), needle="notes.txt")
    assert f.read_text() == "keep me"


@pytest.mark.parametrize("name", ["old.json", "new.json"])
def test_json_onto_a_read_only_target(run_cli, tmp_path, name):
    # as root too: a read-only mount or the immutable attribute (tests/data/readonly.py); refused
    # before the run (net local would run its 30 s first), the earlier file kept
    with read_only_folder(tmp_path) as (d, how):
        target = d / name
        for argv in (["env"], ["net", "local", "-t", "30"]):
            code, out, err = run_cli(*argv, "--json", str(target))
            assert code == 2, (how, code, out, err)
            line = one_line(err)
            assert str(target) in line and ("cannot be written" in line or "cannot write there" in line), line
        assert (d / "old.json").read_text() == OLD
        assert sorted(x.name for x in d.iterdir()) == ["old.json"]


def _small_file_limit():
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.RLIM_INFINITY))


def test_full_disk_keeps_the_earlier_file_intact(tmp_path):
    # RLIMIT_FSIZE makes every write past 1 KiB fail with EFBIG, as a full disk fails with ENOSPC
    # (CPython ignores SIGXFSZ, so the write returns the error instead of killing the process)
    old = tmp_path / "env.json"
    before = json.dumps({"earlier": "result"})
    old.write_text(before)
    p = gb("env", "--json", str(old), preexec_fn=_small_file_limit)
    assert p.returncode == 3, (p.stdout, p.stderr)
    line = one_line(p.stderr)
    assert "could not save" in line and "env.json" in line
    assert old.read_text() == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["env.json"]  # no temporary file left


# ---------------------------------------------------------------------------------------------
# setup mistakes and output targets found by a new user
# ---------------------------------------------------------------------------------------------

_WITHOUT_CUPY = ("import sys\nsys.modules['cupy'] = None\nsys.modules['cupy.cuda'] = None\n"
                 "from gpubench.cli.app import main\nmain(sys.argv[1:])\n")


@pytest.mark.parametrize("name", ["copy", "p2p", "nccl", "batch", "memcpy2d", "overlap"])
def test_a_missing_cupy_is_a_setup_error_naming_the_extra(name):
    p = subprocess.run([sys.executable, "-c", _WITHOUT_CUPY, name], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")})
    assert p.returncode == 2, p.stderr
    assert "CuPy is not importable" in one_line(p.stderr) and "gpubench-cuda[cuda13]" in p.stderr


@pytest.mark.parametrize("target", ["", "/sys/gpubench-x.json", "/proc/gpubench-x.json"])
def test_json_targets_that_cannot_be_written_are_refused_before_the_run(run_cli, target):
    # net local would run for its -t seconds before finding out
    code, _out, err = run_cli("net", "local", "-t", "30", "--json", target)
    assert code == 2, err
    assert "--json" in one_line(err)


def test_saved_results_keep_the_command_line(tmp_path):
    out = tmp_path / "n.json"
    p = gb("net", "local", "-t", "1", "-P", "1", "--json", str(out), timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text())["argv"] == ["net", "local", "-t", "1", "-P", "1", "--json", str(out)]


def test_json_names_near_the_limit_save_and_over_it_are_refused_before_the_run(run_cli, tmp_path):
    near = tmp_path / ("a" * 245 + ".json")  # 250 bytes: the save's temporary name must still fit
    code, _out, err = run_cli("env", "--json", str(near))
    assert code == 0, err
    assert json.loads(near.read_text())["command"] == "env"
    code, _out, err = run_cli("net", "local", "-t", "30", "--json", str(tmp_path / ("b" * 300)))
    assert code == 2 and "file name is 300 bytes" in one_line(err)


def test_json_through_a_symlink_replaces_its_target_and_keeps_the_link(run_cli, tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    code, _out, err = run_cli("env", "--json", str(link))
    assert code == 0, err
    assert link.is_symlink() and json.loads(target.read_text())["command"] == "env"

"""p2p and nccl as a user meets them: help, bad input (exit 2, one line, before any GPU lookup),
and no GPU (exit 2, one line). Run through ``python -m gpubench`` as a user would."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpubench.core.gpu import gpu_available


def gb(*args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "gpubench", *args], capture_output=True, text=True, timeout=120,
                          env=e)


def _one_line_error(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("gpubench: error:") and "Traceback" not in p.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.mark.parametrize("cmd", ["p2p", "nccl"])
def test_help(cmd):
    p = gb(cmd, "--help")
    assert p.returncode == 0 and "--json" in p.stdout


def test_nccl_help_names_every_collective_and_nccl_tests_options():
    out = gb("nccl", "--help").stdout
    for word in ("all-reduce", "all-gather", "reduce-scatter", "broadcast", "reduce", "all-to-all", "send-recv",
                 "gather_perf", "scatter_perf", "--expect-busbw", "--cuda-graph", "--check", "--scheduler-address", "--scheduler-file", "NCCL_NVLS_ENABLE"):
        assert word in out, word


@pytest.mark.parametrize("args,needles", [
    (["p2p", "-d", "0,0"], ["device 0 is repeated"]),
    (["p2p", "-d", "0"], ["needs two GPUs"]),
    (["p2p", "-b", "0"], ["-b/--nbytes", "at least 1 byte"]),
    (["p2p", "-t", "write,telepathy"], ["test 'telepathy'", "off-bidir"]),
    (["nccl", "-d", "0,0"], ["device 0 is repeated"]),
    (["nccl", "-b", "0"], ["-b/--min-bytes", "at least 1 byte"]),
    (["nccl", "allreduse"], ["collective 'allreduse'", "all-reduce"]),
    (["nccl", "-t", "float8"], ["data type 'float8'", "bfloat16"]),
    (["nccl", "-o", "mulsum"], ["reduction op 'mulsum'", "avg"]),
    (["nccl", "-n", "0"], ["-n/--iters"]),
    (["nccl", "--expect-busbw", "-3"], ["--expect-busbw"]),
])
def test_bad_input_exits_2_with_one_line(args, needles):
    # bad values are refused before any GPU is looked at, so this holds with or without a GPU
    _one_line_error(gb(*args), *needles)


@pytest.mark.skipif(gpu_available(), reason="a GPU is visible")
@pytest.mark.parametrize("args", [["p2p"], ["p2p", "-d", "0,9"], ["nccl"], ["nccl", "-d", "0,9"]])
def test_no_gpu_exits_2_with_one_line(args):
    _one_line_error(gb(*args), "no CUDA device")


def test_hidden_gpus_exit_2():
    # CUDA_VISIBLE_DEVICES="" hides every GPU, whatever the machine has
    _one_line_error(gb("p2p", env={"CUDA_VISIBLE_DEVICES": ""}))
    _one_line_error(gb("nccl", "-b", "1K", "-e", "1K", env={"CUDA_VISIBLE_DEVICES": ""}))


@pytest.mark.parametrize("coll", ["gather", "scatter", "Gather", "SCATTER"])
def test_nccl_accepts_gather_and_scatter_before_looking_for_a_gpu(coll):
    # accepted: the run gets as far as the GPU lookup, which CUDA_VISIBLE_DEVICES="" makes fail
    p = gb("nccl", coll, "-r", "1", "-b", "1K", "-e", "1K", env={"CUDA_VISIBLE_DEVICES": ""})
    _one_line_error(p)
    assert "not known" not in p.stderr


def test_nccl_gather_takes_the_root_option():
    from gpubench.plugins.nccl import command as cmd

    spec = cmd.build_spec("gather", None, "1M", "1M", 4, "float", "sum", 3, 1, 20, 5, 1, "both", 0, 0.0)
    assert (spec.collective, spec.root) == ("gather", 3)
    assert cmd.build_spec("scatter", None, "1M", "1M", 4, "float", "sum", 0, 1, 20, 5, 1, "both", 0,
                          0.0).collective == "scatter"
    _one_line_error(gb("nccl", "scatter", "-r", "-1"), "-r/--root -1")

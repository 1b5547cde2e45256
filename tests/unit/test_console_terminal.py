"""When gpubench's output is a person's terminal (colour, the terminal's width, a progress bar),
checked on real pseudo-terminals and pipes: under Open MPI a rank's stdout is a pty of mpirun's
own whatever mpirun writes to, so it is treated as a log unless colour is asked for."""

from __future__ import annotations

import os
import sys

import pytest

from gpubench.core import report

CLEAN = ("OMPI_COMM_WORLD_RANK", "FORCE_COLOR", "TTY_COMPATIBLE")


@pytest.fixture
def pty_file():
    master, slave = os.openpty()
    f = os.fdopen(slave, "w")
    yield f
    f.close()
    os.close(master)


@pytest.fixture
def pipe_file():
    r, w = os.pipe()
    f = os.fdopen(w, "w")
    yield f
    f.close()
    os.close(r)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for k in CLEAN:
        monkeypatch.delenv(k, raising=False)


@pytest.mark.parametrize("env, expect", [
    ({}, True),
    ({"OMPI_COMM_WORLD_RANK": "0"}, False),                      # Open MPI's pty: a log
    ({"OMPI_COMM_WORLD_RANK": "0", "FORCE_COLOR": "1"}, True),    # colour asked for
    ({"OMPI_COMM_WORLD_RANK": "0", "TTY_COMPATIBLE": "1"}, True),
    ({"TTY_COMPATIBLE": "0"}, False),
    ({"FORCE_COLOR": ""}, False),                                 # rich: empty means not forced
])
def test_a_pty_is_a_terminal_except_a_ranks_under_open_mpi(pty_file, monkeypatch, env, expect):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert report.is_terminal(pty_file) is expect
    monkeypatch.setattr(sys, "stdout", pty_file)
    c = report.console()
    assert c.is_terminal is expect
    if "OMPI_COMM_WORLD_RANK" in env:
        assert c.width == 200  # the rank's pty has 0 columns; rich would wrap at 80


def test_a_pipe_is_a_log_unless_colour_is_forced_and_then_keeps_a_logs_width(pipe_file, monkeypatch):
    assert report.is_terminal(pipe_file) is False
    monkeypatch.setattr(sys, "stdout", pipe_file)
    c = report.console()
    assert c.is_terminal is False and c.width == 200
    monkeypatch.setenv("FORCE_COLOR", "1")
    c = report.console()
    assert c.is_terminal is True and c.width == 200


def test_a_closed_stream_is_no_terminal(pipe_file):
    pipe_file.close()
    assert report.is_terminal(pipe_file) is False


def test_a_progress_bar_is_drawn_on_a_persons_terminal_only(pty_file, pipe_file, monkeypatch):
    """FORCE_COLOR colours a pipe (CI logs) but draws no live bar there, as before colour could be
    forced; a rank's pty under Open MPI gets none either."""
    monkeypatch.setattr(sys, "stderr", pty_file)
    assert report.RichProgress().enabled
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    assert not report.RichProgress().enabled
    monkeypatch.delenv("OMPI_COMM_WORLD_RANK")
    monkeypatch.setattr(sys, "stderr", pipe_file)
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert not report.RichProgress().enabled

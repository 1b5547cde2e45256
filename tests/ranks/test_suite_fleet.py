"""`gpubench suite` in fleet mode under real launchers: no rank is waited for forever, and a
stopped rank is named in time.

3 ranks under `mpiexec -n 3` (MPICH from PyPI, mpi4py) and 3 started with a torchrun-style
environment (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT; the store is torch's TCPStore where torch
imports, else gpubench's JSON-lines store). With rank 1 stopped (SIGSTOP) once the group formed,
rank 0 reports it missing and saves the bundle, and every surviving process ends (exit 1, naming
rank 1 and its host) within --node-timeout plus the steps and a bounded close: under mpiexec no
survivor waits in MPI_Finalize for the stopped rank, and over the store no survivor exits 0
without naming it; nothing is left. A fleet on one host keeps its skipped expectations and honours
--strict.

Outside CI these skip, with the reason, where mpiexec, mpi4py or psutil is missing; under CI=true
a missing mpiexec or mpi4py fails.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

psutil = pytest.importorskip("psutil")

from rank_procs import (GPUBENCH, HOST, Lines, _alive, _cleanup, _env, _family, _free_port, _mpi_ranks,  # noqa: E402
                        _start, _torchrun_env, _wait_all, _wait_gone, mpiexec)


NODE_TIMEOUT = 8.0

# After the stop: rank 0 waits NODE_TIMEOUT for the silent rank; the others' own steps (net
# loopback, about 4 s each, up to three turns under mpiexec on one host), rank 0's report and the
# bounded close (rank 0's farewell) come on top, within 40 s.
SUITE_BOUND_S = NODE_TIMEOUT + 40.0

# From rank 0's "saved" line to the end of every survivor: the close is bounded (ranks.CLOSE_S
# at most after a fault, and in practice rank 0's farewell at once).
AFTER_SAVED_S = 20.0

def test_mpiexec_suite_stopped_rank_every_survivor_ends(tmp_path):
    exe = mpiexec()
    top = _start([exe, "-n", "3", sys.executable, "-m", "gpubench", "suite", "-o", str(tmp_path),
                  "--node-timeout", f"{NODE_TIMEOUT:g}"], _env())
    out = Lines(top)
    victim = None
    try:
        out.wait_for(r"^fleet: 3 rank\(s\)")
        ranks = _mpi_ranks(top.pid)
        victim = ranks[1]
        os.kill(victim, signal.SIGSTOP)
        t_stop = time.monotonic()
        family = _family([top.pid, *ranks.values()])
        (t_end,) = _wait_all([top], SUITE_BOUND_S + 30)
        text = out.text() if t_end is not None else "".join(line for _, line in out.lines)
        assert t_end is not None, f"mpiexec still running {SUITE_BOUND_S + 30:g} s after the stop:\n{text[-3000:]}"
        saved = out.first(r"saved .*suite-fleet-")
        assert saved is not None, text[-3000:]
        assert t_end - t_stop < SUITE_BOUND_S, (t_end - t_stop, text[-3000:])
        assert t_end - saved < AFTER_SAVED_S, (t_end - saved, text[-3000:])
        # rank 0 names it in the report; rank 2 names it too, with its host
        assert f"MISSING rank 1 on {HOST}" in text, text[-3000:]
        assert re.search(rf"fleet failed: rank 1 on {re.escape(HOST)} did not answer within {NODE_TIMEOUT:g} s", text), \
            text[-3000:]
        assert "Traceback" not in text, text[-3000:]
        assert top.returncode != 0
        bundle = next(tmp_path.glob("suite-fleet-*.json"))
        import json

        assert json.loads(bundle.read_text())["fleet"]["missing"] == [{"rank": 1, "host": HOST}]
        # mpiexec ends the stopped rank once the others left; nothing of the job is left
        assert _wait_gone(family, 15) == [], [psutil.Process(p).cmdline() for p in _alive(family)]
    finally:
        _cleanup([top], victim)

def test_torchrun_style_suite_stopped_rank_every_survivor_ends(tmp_path):
    """Over the store (no launcher to end anything): ranks 0 and 2 both exit 1 naming rank 1 and
    its host, within the bound; their processes and children are gone; rank 1 is still stopped."""
    port = _free_port()
    procs = [_start([sys.executable, "-m", "gpubench", "suite", "-o", str(tmp_path), "--node-timeout",
                     f"{NODE_TIMEOUT:g}"], _torchrun_env(r, port)) for r in range(3)]
    outs = [Lines(p) for p in procs]
    try:
        outs[0].wait_for(r"^fleet: 3 rank\(s\)")
        os.kill(procs[1].pid, signal.SIGSTOP)
        t_stop = time.monotonic()
        family = _family([procs[0].pid, procs[2].pid])
        ended = _wait_all([procs[0], procs[2]], SUITE_BOUND_S + 30)
        texts = [o.text() if p.poll() is not None else "".join(line for _, line in o.lines) for o, p in zip(outs, procs)]
        assert None not in ended, (ended, texts[0][-1500:], texts[2][-1500:])
        took = max(ended) - t_stop
        assert took < SUITE_BOUND_S, (took, texts[0][-1500:], texts[2][-1500:])
        assert [procs[0].returncode, procs[2].returncode] == [1, 1], (texts[0][-1500:], texts[2][-1500:])
        assert f"MISSING rank 1 on {HOST}" in texts[0], texts[0][-1500:]
        assert f"fleet failed: rank 1 on {HOST} did not answer within {NODE_TIMEOUT:g} s" in texts[2], texts[2][-1500:]
        saved = outs[0].first(r"saved .*suite-fleet-")
        assert saved is not None
        assert max(ended) - saved < AFTER_SAVED_S, max(ended) - saved
        assert all("Traceback" not in t for t in texts), texts
        assert _wait_gone(family, 10) == []
        assert psutil.Process(procs[1].pid).status() == psutil.STATUS_STOPPED
    finally:
        _cleanup(procs, procs[1].pid)



# ---- a fleet on one host: skipped expectations and --strict; one rank is no fleet ----

EXPECT = """
[[expect]]
name = "between nodes \\u001b[31m<b>x</b>"
command = "net"
min_gbps = 0.001

[[expect]]
command = "copy"
min_gbps = 1
"""

@pytest.mark.parametrize("strict", [False, True])
def test_fleet_suite_keeps_skipped_expectations_and_honours_strict(tmp_path, strict):
    """A fleet of two ranks on one host (mpiexec -n 2, CPU steps): expectations that could not run (net links between
    nodes: none here; copy: no GPU) stay in the bundle's outcomes as skipped, and --strict fails
    them (exit 1, the name shown inert), as in the one-node suite; without --strict, exit 0. The
    node writes its --metrics file, {rank} in its name replaced, with its own outcome (copy)."""
    import json

    toml = tmp_path / "fleet.toml"
    toml.write_text(EXPECT)
    out = tmp_path / "res"
    p = subprocess.run([mpiexec(), "-n", "2", *GPUBENCH, "suite", "-o", str(out), "--node-timeout", "30", "--expect",
                        str(toml), "--metrics", str(tmp_path / "node-{rank}.prom"),
                        *(["--strict"] if strict else [])], env=_env(), capture_output=True, text=True, timeout=120)
    text = p.stdout + p.stderr
    assert "Traceback" not in text, text
    bundle = json.loads(next(out.glob("suite-fleet-*.json")).read_text())
    got = sorted((o["expectation"]["command"], o["status"]) for o in bundle["expectations"]["outcomes"])
    assert got == [("copy", "skipped"), ("copy", "skipped"), ("net", "skipped")], got  # copy: one per rank
    if strict:
        assert p.returncode == 1, text
        assert "skipped, failed by --strict" in p.stderr and "\\x1b[31m<b>x</b>" in p.stderr, p.stderr
        assert "\x1b" not in text
    else:
        assert p.returncode == 0, text
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    def statuses(rank: int) -> tuple[list, dict]:
        fams = {f.name: f.samples for f in text_string_to_metric_families((tmp_path / f"node-{rank}.prom").read_text())}
        return [(s.labels["command"], s.labels["status"]) for s in fams["gpubench_expectation_status"]], fams

    # each rank's own outcome (copy); rank 0's file also has the step across nodes (net, one node here)
    got, fams = statuses(0)
    assert got == [("copy", "skipped"), ("net", "skipped")], got
    assert "gpubench_net_bandwidth_bytes_per_second" in fams
    assert statuses(1)[0] == [("copy", "skipped")]


def test_suite_under_a_one_rank_launcher_is_the_one_node_suite():
    """`mpiexec -n 1 gpubench suite` is the suite without a launcher: on a machine without a GPU
    both exit 2 with the same one line, and neither writes a bundle."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        plain = subprocess.run([*GPUBENCH, "suite", "-o", f"{d}/a"], env=_env(), capture_output=True, text=True,
                               timeout=120)
        one = subprocess.run([mpiexec(), "-n", "1", *GPUBENCH, "suite", "-o", f"{d}/b"], env=_env(),
                             capture_output=True, text=True, timeout=120)
        assert (plain.returncode, one.returncode) == (2, 2), (plain.stderr, one.stderr)
        assert one.stderr.strip() == plain.stderr.strip() and len(plain.stderr.strip().splitlines()) == 1, \
            (plain.stderr, one.stderr)
        assert not list(Path(d).rglob("*.json"))

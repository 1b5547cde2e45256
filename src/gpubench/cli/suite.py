"""``gpubench suite``: a node-validation run (env, copy, batch, p2p, nccl, merge when asked), one JSON
bundle of every result, expectations checked from a TOML file; ``--check`` does the checking on saved
results without a GPU."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Sequence

import click

from gpubench.core import registry, report, safe
from gpubench.core.errors import MachineError, RegressionFound, UsageError, from_the_command_line
from gpubench.core.plugin import StepPlace
from gpubench.core.result import Result, check_output_path, check_output_target, write_bytes_atomic
from gpubench.kit import DEBUG_OPTION, StrictFloat
from gpubench.validation import fleet, profiles, steps, suite
from gpubench.validation.fleet import file_host as _host


@click.command("suite")
@click.option("--expect", "expect_file", type=click.Path(dir_okay=False), default=None, metavar="FILE.toml|PROFILE",
              help="TOML file of expectations (thresholds per figure; see docs/suite.md), or the name of a "
                   "shipped profile (--profiles lists them).")
@click.option("--profiles", "list_profiles", is_flag=True,
              help="List the shipped expectation profiles, each bound with its source, and exit.")
@click.option("-o", "--output-dir", "out_dir", type=click.Path(file_okay=False), default=".", show_default=True,
              help="Folder for the bundle (suite-HOST-TIME.json) and each step's result.")
@click.option("--check", "check_files", multiple=True, type=click.Path(dir_okay=True),
              help="Check --expect against saved bundles or results instead of running (no GPU needed); repeatable.")
@click.option("--merge", "with_merge", is_flag=True, help="Also run the Dask-CUDA merge (slow: starts a cluster).")
@click.option("--strict", is_flag=True, help="Count expectations whose command did not run as failed.")
@click.option("--node-timeout", type=StrictFloat(bound=lambda: fleet.NODE_TIMEOUT), default=900.0, show_default=True,
              help="Under a launcher: seconds to wait for a node before reporting it missing (docs/fleet.md).")
@click.option("--metrics", "metrics_file", type=click.Path(dir_okay=False), default=None, metavar="FILE.prom",
              help="Also write the bundle as OpenMetrics text for Prometheus' textfile collector (gpubench "
                   "metrics). Under a launcher each rank writes its own: {rank} and {host} in FILE are "
                   "replaced by the rank and its host name.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors and warnings.")
@DEBUG_OPTION
def command(expect_file, list_profiles, out_dir, check_files, with_merge, strict, node_timeout, metrics_file, quiet,
            debug):
    """Validate a node: env, then every installed command's steps (pinned copy H2D and D2H, batch,
    p2p and NCCL all-reduce with several GPUs, merge with --merge, and any plug-in's); save one
    JSON bundle of every result; check the expectations; print a pass/fail table. Exit 1 when an
    expectation or a step fails.

    With --check FILE, check the expectations against saved bundles or results (no GPU).
    """
    if list_profiles:
        _show_profiles(profiles.describe())
        return 0
    with from_the_command_line():
        fleet.NODE_TIMEOUT.check(node_timeout)  # also with --check and off a launcher
    if not str(out_dir).strip():  # Path("") is the current folder: never read as the default
        raise UsageError(f"-o/--output-dir {out_dir!r} is empty", "give a folder, or leave -o out for the current one")
    known = sorted(p.name for p in registry.measuring())
    if expect_file is not None:
        expect_file = profiles.resolve(expect_file)
    if metrics_file is not None:  # the path this rank writes ({rank} and {host} may name folders)
        from gpubench.launch import ranks

        metrics_file = _node_path(metrics_file, ranks.discover())
        if not metrics_file.endswith(".prom"):  # checked before anything runs
            raise UsageError(f"--metrics {metrics_file!r} must end in .prom (node_exporter's textfile collector "
                             "reads only *.prom)", "e.g. --metrics /var/lib/node_exporter/textfile/gpubench.prom")
        check_output_path(metrics_file, "--metrics")
    expectations = suite.load_expectations(expect_file, known) if expect_file else None
    if check_files:
        if expectations is None:
            raise UsageError("--check needs --expect FILE.toml", "the expectations to check")
        bundles = [suite.load_checkable(p) for p in check_files]
        strict = strict or any(b.strict for b in bundles)  # a bundle's own --strict holds when it is checked again
        bundle = suite.Bundle(steps=[s for b in bundles for s in b.steps], expect_file=expect_file,
                              env=bundles[0].env, strict=strict)
        # a fleet bundle is judged on its own (fleet.check_saved); the other files together: a step
        # skipped or failed keeps that status only when no other file has the command
        plain = suite.Bundle(steps=[s for b in bundles if b.fleet is None for s in b.steps])
        if plain.steps:
            have = {s.command for s in plain.steps if s.status == "ok" and s.result is not None}
            skipped = {c: r for c, r in plain.skipped().items() if c not in have}
            failed = {c: r for c, r in plain.failed().items() if c not in have}
            bundle.outcomes = suite.evaluate(expectations, plain.results(), skipped, failed)
        fleet_lines, fleet_why = [], []
        for path, b in zip(check_files, bundles):
            if b.fleet is not None:
                bundle.outcomes += fleet.check_saved(b, expectations)
                lines, why = fleet.saved_verdict(b.fleet, str(path))
                fleet_lines += lines
                if why:
                    fleet_why.append(why)
        failed_why = _finish(bundle, strict, quiet, show_steps=False, extra=fleet_lines, also_failed=fleet_why)
        if metrics_file is not None:
            _write_metrics(metrics_file, bundle, quiet)
        if failed_why:
            raise RegressionFound(failed_why)
        return 0
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o {out_dir!r} is not a folder", "give a folder; it is created if missing")
    from gpubench.core import gpu

    if fleet.under_launcher():  # srun / mpirun / torchrun: every node, one fleet report (docs/fleet.md)
        return fleet.run_fleet(expectations=expectations, expect_file=expect_file, out=_made(out, out_dir),
                               with_merge=with_merge, strict=strict, quiet=quiet, timeout=node_timeout,
                               node_done=None if metrics_file is None else
                               lambda b, me: _write_metrics(_node_path(metrics_file, me), b, True, keep_going=True))
    # the output checked before the GPU, creating nothing: the nearest folder that exists must take a file
    probe_dir = out
    while not probe_dir.exists() and probe_dir.parent != probe_dir:
        probe_dir = probe_dir.parent
    if probe_dir.is_dir():
        check_output_target(probe_dir / "suite-probe.json", "-o")
    gpu.require_gpu()  # before creating anything
    check_output_target(_made(out, out_dir) / "suite-probe.json", "-o")
    bundle = run_steps(out, with_merge=with_merge, quiet=quiet)
    bundle.expect_file = expect_file
    bundle.strict = strict
    bundle.argv = list(registry.INVOCATION)
    if expectations is not None:
        bundle.outcomes = suite.evaluate(expectations, bundle.results(), bundle.skipped(), bundle.failed())
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = suite.save_bundle(bundle, out / f"suite-{_host()}-{stamp}.json")
    failed_why = _finish(bundle, strict, quiet, show_steps=True, saved=str(path))
    if metrics_file is not None:
        _write_metrics(metrics_file, bundle, quiet)
    partial = [s for s in bundle.steps if s.status == "ok" and s.result is not None and s.result.partial]
    if partial:
        sig = partial[0].result.interrupted_by or "SIGINT"
        print(f"gpubench: suite interrupted by {sig} during {partial[0].name}; bundle kept: {safe.term(path, 4096)}",
              file=sys.stderr)
        return 143 if sig == "SIGTERM" else 130
    if failed_why:
        raise RegressionFound(failed_why)
    return 0


def _show_profiles(described) -> None:
    """``--profiles``: each profile's description and source, then its bounds with their sources."""
    from rich.text import Text

    out: list = []
    for name, head, expectations in described:
        t = report.table(f"{name}: {head.get('description', '')}",
                         ["#", "command", "figure", "bound", "nodes", "source"],
                         caption=f"source: {head.get('source', '')}")
        for e in expectations:
            where = " ".join(f"{k}={v}" for k, v in e.where.items())
            t.add_row(*[Text(c) for c in (str(e.index), e.command, e.label() + (f" [{where}]" if e.name and where
                                                                                      else ""),
                                          e.bound_text(), str(e.nodes or 1), e.source or "(the profile's)")])
        out.append(t)
    out.append(Text("Use one with --expect NAME (docs/suite.md)."))
    report.display(out)


def _node_path(path: str, me) -> str:
    """--metrics FILE of one rank of a fleet run: ``{rank}`` and ``{host}`` (:func:`_host`) replaced."""
    return path.replace("{rank}", str(me.rank)).replace("{host}", _host(me.host))


def _write_metrics(path: str, bundle, quiet: bool, keep_going: bool = False) -> None:
    """Write ``bundle`` as OpenMetrics text to ``path``, atomically. With ``keep_going`` (a node of
    a fleet run) a failed write is a warning; else it raises MachineError (exit 3)."""
    from gpubench.analysis import metrics

    try:
        written = write_bytes_atomic(metrics.build(bundle.results(), [bundle]).text(), path, "the metrics",
                                     "--metrics")
    except MachineError as e:
        if not keep_going:
            raise
        report.err_line(f"gpubench: warning: {e.one_line()}")
        return
    report.saved(written, "wrote", quiet=quiet)


def _made(out: Path, out_dir: str) -> Path:
    """``out`` (-o ``out_dir``), created with its parents where missing."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"-o {out_dir!r}: cannot create the folder ({e.strerror or type(e).__name__})") from None
    return out


def _finish(bundle, strict: bool, quiet: bool, *, show_steps: bool, saved: str | None = None,
            extra: Sequence = (), also_failed: Sequence[str] = ()) -> str | None:
    """Display the report; return the one-line reason the suite failed, or None when it passed
    (``also_failed``: reasons that fail it whatever the expectations say; ``extra``: lines shown after)."""
    from rich.text import Text

    renderables = suite.format_report(bundle, strict)
    if not show_steps:
        renderables = [r for r in renderables if getattr(r, "title", None) != "Suite steps"]
    if also_failed:
        def failed(r):
            for head in ("PASSED:", "NOTHING CHECKED:"):
                if isinstance(r, Text) and r.plain.startswith(head):
                    return Text("FAILED:" + r.plain[len(head):])
            return r

        renderables = [failed(r) for r in renderables]
    renderables += list(extra) + [Text(safe.term(w, 2000)) for w in also_failed]
    report.display(renderables, quiet=quiet)
    if saved:
        report.saved(saved, quiet=quiet)
    bad = suite.failures(bundle.outcomes, strict)
    errors = [s.name for s in bundle.steps if s.status == "error"]
    if not bad and not errors and not also_failed:
        return None
    what = []
    if bad:
        what.append(f"{len({o.expectation.index for o in bad})} expectation(s) not met")  # not rows: one may match many
    if errors:
        what.append(f"step(s) failed: {', '.join(errors)}")
    return "; ".join((["suite failed: " + "; ".join(what)] if what else []) + list(also_failed))


def run_steps(out: Path, *, with_merge: bool, quiet: bool):
    """Run env and every step the installed plug-ins declare into a suite.Bundle (a step's error
    is recorded and the next one runs; an interruption stops the run)."""
    from gpubench.core import env as envmod
    from gpubench.core import gpu

    stamp = time.strftime("%Y%m%d-%H%M%S")
    console = report.console(stderr=True)

    def say(text: str) -> None:
        if not quiet:
            from rich.text import Text

            console.print(Text(safe.term(text, 2000)))  # an error line may quote a file's strings

    t0 = time.perf_counter()
    env = envmod.capture()
    bundle = suite.Bundle(env=env)
    bundle.steps.append(suite.Step("env", "env", "ok", seconds=time.perf_counter() - t0,
                                   result=Result(command="env", spec={}, env=env)))
    n = gpu.device_count()
    steps.run_planned(bundle, StepPlace(devices=tuple(range(n))), n, {"--merge"} if with_merge else set(),
                      lambda command: out / f"suite-{_host()}-{stamp}-{command}.json", quiet=quiet, say=say)
    return bundle

"""``gpubench suite``: a node-validation run (env, copy, batch, p2p, nccl, merge when asked), one JSON
bundle of every result, expectations checked from a TOML file; ``--check`` does the checking on saved
results without a GPU."""

from __future__ import annotations

import importlib.util
import socket
import sys
import time
from pathlib import Path

import click

from gpubench.core.errors import GpubenchError, RegressionFound, UsageError

# Steps after env and copy: (name, command, extra argv, minimum GPUs, needs --merge). Each runs through
# its command's own CLI (options validated there, result saved with --json) when its module exists.
# "{devices}" is replaced by the visible devices, e.g. "0,1".
CLI_STEPS: tuple[tuple[str, str, tuple[str, ...], int, bool], ...] = (
    ("batch", "batch", (), 1, False),
    ("p2p", "p2p", ("-d", "{devices}"), 2, False),
    ("nccl all-reduce", "nccl", ("-b", "1M", "-e", "1G", "-f", "4"), 2, False),
    ("merge ucx", "merge", ("-d", "{devices}", "-p", "ucx"), 1, True),
)
COPY_SIZES = ("4KiB", "1GiB", 4.0)  # min, max, step factor of the suite's pinned copy sweep


@click.command("suite")
@click.option("--expect", "expect_file", type=click.Path(dir_okay=False), default=None,
              help="TOML file of expectations (thresholds per figure; see docs/suite.md).")
@click.option("-o", "--output-dir", "out_dir", type=click.Path(file_okay=False), default=".", show_default=True,
              help="Folder for the bundle (suite-HOST-TIME.json) and each step's result.")
@click.option("--check", "check_files", multiple=True, type=click.Path(dir_okay=True),
              help="Check --expect against saved bundles or results instead of running (no GPU needed); repeatable.")
@click.option("--merge", "with_merge", is_flag=True, help="Also run the Dask-CUDA merge (slow: starts a cluster).")
@click.option("--strict", is_flag=True, help="Count expectations whose command did not run as failed.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
@click.option("--debug", is_flag=True, help="Show tracebacks of errors.")
def command(expect_file, out_dir, check_files, with_merge, strict, quiet, debug):
    """Validate a node: env, pinned copy (H2D and D2H), and where available batch, p2p and NCCL
    all-reduce (several GPUs), merge with --merge; save one JSON bundle of every result; check
    the expectations; print a pass/fail table. Exit 1 when an expectation fails.

    With --check FILE, check the expectations against saved bundles or results (no GPU).
    """
    from gpubench import suite
    from gpubench.core.registry import REGISTRY

    known = sorted(REGISTRY)
    expectations = suite.load_expectations(expect_file, known) if expect_file else None
    if check_files:
        if expectations is None:
            raise UsageError("--check needs --expect FILE.toml", "the expectations to check")
        bundles = [suite.load_checkable(p) for p in check_files]
        bundle = suite.Bundle(steps=[s for b in bundles for s in b.steps], expect_file=expect_file,
                              env=bundles[0].env)
        # steps skipped or failed in a bundle keep that status only when no other file has the command
        have = {s.command for s in bundle.steps if s.result is not None}
        skipped = {c: r for c, r in bundle.skipped().items() if c not in have}
        failed = {c: r for c, r in bundle.failed().items() if c not in have}
        bundle.outcomes = suite.evaluate(expectations, bundle.results(), skipped, failed)
        failed_why = _finish(bundle, strict, quiet, show_steps=False)
        if failed_why:
            raise RegressionFound(failed_why)
        return 0
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o {out_dir!r} is a file, not a folder", "give a folder; it is created if missing")
    from gpubench.core import gpu
    from gpubench.core.result import check_output_path

    gpu.require_gpu()  # before creating anything
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"-o {out_dir!r}: cannot create the folder ({e.strerror or type(e).__name__})") from None
    check_output_path(out / "suite-probe.json")
    bundle = run_steps(out, with_merge=with_merge, quiet=quiet)
    bundle.expect_file = expect_file
    from gpubench.core.registry import INVOCATION

    bundle.argv = list(INVOCATION)
    if expectations is not None:
        bundle.outcomes = suite.evaluate(expectations, bundle.results(), bundle.skipped(), bundle.failed())
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = suite.save_bundle(bundle, out / f"suite-{_host()}-{stamp}.json")
    failed_why = _finish(bundle, strict, quiet, show_steps=True, saved=str(path))
    partial = [s for s in bundle.steps if s.result is not None and s.result.partial]
    if partial:
        sig = partial[0].result.interrupted_by or "SIGINT"
        print(f"gpubench: suite interrupted by {sig} during {partial[0].name}; bundle kept: {path}", file=sys.stderr)
        return 143 if sig == "SIGTERM" else 130
    if failed_why:
        raise RegressionFound(failed_why)
    return 0


def _host() -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in socket.gethostname()) or "host"


def _finish(bundle, strict: bool, quiet: bool, *, show_steps: bool, saved: str | None = None) -> str | None:
    """Display the report; return the one-line reason the suite failed, or None when it passed."""
    from gpubench import suite
    from gpubench.core import report

    renderables = suite.format_report(bundle, strict)
    if not show_steps:
        renderables = [r for r in renderables if not _is_steps_table(r)]
    if saved:
        renderables.append(f"saved {saved}")
    report.display(renderables, quiet=quiet)
    bad = suite.failures(bundle.outcomes, strict)
    errors = [s.name for s in bundle.steps if s.status == "error"]
    if not bad and not errors:
        return None
    what = []
    if bad:
        what.append(f"{len(bad)} expectation(s) not met")
    if errors:
        what.append(f"step(s) failed: {', '.join(errors)}")
    return "suite failed: " + "; ".join(what)


def _is_steps_table(r) -> bool:
    return getattr(r, "title", None) == "Suite steps"


def module_exists(command: str) -> bool:
    """True when gpubench.commands.<command> can be imported (the command has landed)."""
    return importlib.util.find_spec(f"gpubench.commands.{command}") is not None


def run_cli_step(command: str, argv: list[str], json_path: Path):
    """Run one gpubench command in this process through its own CLI, quietly, saving to json_path.

    Returns:
        The saved Result.

    Raises:
        GpubenchError: what the command raised; MachineError when it returns a non-zero code
            other than an interruption (130/143, then the saved partial result is returned).
    """
    import importlib

    from gpubench.core.errors import MachineError
    from gpubench.core.result import load

    mod = importlib.import_module(f"gpubench.commands.{command}")
    try:
        rc = mod.command.main(args=[*argv, "--json", str(json_path), "-q"], prog_name=f"gpubench {command}",
                              standalone_mode=False)
    except click.ClickException as e:
        raise UsageError(f"gpubench {command} {' '.join(argv)}: {e.format_message()}") from None
    rc = rc if isinstance(rc, int) else 0
    if rc not in (0, 130, 143) and not json_path.exists():
        raise MachineError(f"gpubench {command} exited {rc} without a result")
    return load(json_path)


def run_steps(out: Path, *, with_merge: bool, quiet: bool):
    """Run env, copy and the available CLI steps; a step's error is recorded and the next one runs;
    an interruption stops the run after saving what was measured.

    Returns:
        A suite.Bundle with every step (ok, skipped with a reason, or error with its one line).
    """
    from gpubench import suite
    from gpubench.core import env as envmod
    from gpubench.core import gpu, report
    from gpubench.core.result import Result, save

    stamp = time.strftime("%Y%m%d-%H%M%S")
    bundle = suite.Bundle()
    console = report.console(stderr=True)

    def say(text: str) -> None:
        if not quiet:
            console.print(text)

    t0 = time.perf_counter()
    env = envmod.capture()
    bundle.env = env
    bundle.steps.append(suite.Step("env", "env", "ok", seconds=time.perf_counter() - t0,
                                   result=Result(command="env", spec={}, env=env)))
    n = gpu.device_count()
    devices = ",".join(str(i) for i in range(n))

    def record(name: str, command: str, fn) -> bool:
        """Run fn() -> Result; save it; return False when interrupted (stop the suite)."""
        path = out / f"suite-{_host()}-{stamp}-{command}.json"
        say(f"suite: running {name} ...")
        t = time.perf_counter()
        try:
            res = fn(path)
        except GpubenchError as e:
            bundle.steps.append(suite.Step(name, command, "error", e.one_line(), time.perf_counter() - t))
            say(f"suite: {name} failed: {e.one_line()}")
            return True
        if not path.exists():
            save(res, path)
        bundle.steps.append(suite.Step(name, command, "ok", "", time.perf_counter() - t, res, str(path)))
        return not res.partial

    def copy_step(path: Path):
        from gpubench.bench import copy as bench
        from gpubench.core.timing import TimingPlan
        from gpubench.core.units import parse_size, size_sweep

        lo, hi, f = COPY_SIZES
        spec = bench.CopySpec(sizes=tuple(size_sweep(parse_size(lo), parse_size(hi), f)),
                              directions=("h2d", "d2h"), memory=("pinned",), devices=tuple(range(n)),
                              plan=TimingPlan())
        with report.progress(not quiet) as prog:
            return bench.run(spec, prog)

    if not record("copy pinned", "copy", copy_step):
        return bundle
    for name, command, argv, min_gpus, needs_merge in CLI_STEPS:
        if needs_merge and not with_merge:
            bundle.steps.append(suite.Step(name, command, "skipped", "not asked (--merge)"))
            continue
        if not module_exists(command):
            bundle.steps.append(suite.Step(name, command, "skipped", f"gpubench {command} is not in this version"))
            continue
        if n < min_gpus:
            bundle.steps.append(suite.Step(name, command, "skipped", f"needs {min_gpus} GPUs, {n} visible"))
            continue
        args = [a.replace("{devices}", devices) for a in argv]
        if not record(name, command, lambda p, c=command, a=args: run_cli_step(c, a, p)):
            return bundle
    return bundle

"""The steps of ``gpubench suite`` and of each fleet node: asked of every plug-in (its
``suite_steps`` hook, :class:`gpubench.core.plugin.SuiteStep`), run through its driver in ``order``,
recorded into a bundle; what the node cannot run or the user did not ask for is skipped with why.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Callable

from gpubench.core import registry, report
from gpubench.core.errors import GpubenchError, MachineError, RegressionFound
from gpubench.core.plugin import Plugin, StepPlace, SuiteStep
from gpubench.core.result import Result, save
from gpubench.validation import suite


def planned(place: StepPlace) -> list[tuple[Plugin, SuiteStep]]:
    """Every step the installed plug-ins declare for ``place``, in run order (``order``, then plug-in name)."""
    def steps(got) -> None:
        for s in got if isinstance(got, list) else [got]:
            if not isinstance(s, SuiteStep) or not isinstance(s.order, int) or not isinstance(s.name, str):
                raise TypeError(f"it gave {type(s).__name__} {s!r:.60}, not a SuiteStep")

    out = [(p, s) for p in registry.plugins().values()
           for s in registry.call_hook(p, "suite_steps", place, check=steps, default=[])]
    return sorted(out, key=lambda ps: (ps[1].order, ps[0].name))


def skip_reason(step: SuiteStep, n_gpus: int, opted: set[str]) -> str | None:
    """Why ``step`` does not run here, or None: an opt-in option not given, or too few GPUs."""
    if step.opt_in is not None and step.opt_in not in opted:
        return f"not asked ({step.opt_in})"
    if n_gpus < step.min_gpus:
        return f"needs {step.min_gpus} GPUs, {n_gpus} visible"
    return None


def run_step(plugin: Plugin, step: SuiteStep, *, quiet: bool = True):
    """Run one step in this process: its Spec through the command's own run (or the plug-in's
    single-process run for ``own_process``, or the step's own ``run``), then the command's own
    verdict; the Result is ``partial`` when a signal stopped it.

    Raises:
        GpubenchError: what the step raised; a MachineError keeps the finished points in
            ``partial_result`` (also when the command's verdict failed a complete result).
    """
    cmd = registry.load_command(plugin.name)
    spec = step.spec() if callable(step.spec) else step.spec
    if step.run is not None:
        run = step.run
    elif step.own_process and plugin.bench is not None:
        run = importlib.import_module(plugin.bench).run
    else:
        run = cmd.select_run(spec)
    with report.progress(not quiet) as prog:
        result = run(spec, prog)
    after = getattr(cmd, "after", None)
    if after is not None and not result.partial:
        try:
            after(result, spec, 0)
        except RegressionFound as e:
            err = MachineError(e.message, e.hint)
            err.partial_result = result  # kept in the bundle; the step is an error
            raise err from None
    return result


def record_step(bundle, name: str, command: str, path: Path, fn: Callable, say=lambda text: None) -> bool:
    """Run ``fn(path) -> Result`` as one step of ``bundle``, saving its result (or a MachineError's
    ``partial_result``) at ``path``; an error makes the step "error". False when it was interrupted."""
    say(f"suite: running {name} ...")
    t = time.perf_counter()

    def keep(res) -> None:
        if not res.argv:
            res.argv = list(registry.INVOCATION)
        if not path.exists():
            save(res, path)

    try:
        res = fn(path)
        if not isinstance(res, Result):
            raise TypeError(f"the step gave {type(res).__name__}, not a Result")
    except Exception as e:  # a step's error is its row of the bundle; the next step runs
        if not isinstance(e, GpubenchError):
            e = MachineError(f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}")
        partial = e.partial_result if isinstance(e, MachineError) else None
        if partial is not None:
            keep(partial)
        bundle.steps.append(suite.Step(name, command, "error", e.one_line(), time.perf_counter() - t, partial,
                                       str(path) if partial is not None else None))
        say(f"suite: {name} failed: {e.one_line()}")
        return True
    keep(res)
    bundle.steps.append(suite.Step(name, command, "ok", "", time.perf_counter() - t, res, str(path)))
    return not res.partial


def run_planned(bundle, place: StepPlace, n_gpus: int, opted: set[str], path_of: Callable[[str], Path], *,
                quiet: bool, say=lambda text: None, each_rank_only: bool = False) -> bool:
    """Run every planned step of ``place`` into ``bundle`` (skipped ones with their reason; ``each_rank_only``:
    only the ``each_rank`` steps). False when a step was interrupted (the caller stops)."""
    for plugin, step in planned(place):
        if each_rank_only and not step.each_rank:
            continue
        why = skip_reason(step, n_gpus, opted)
        if why is not None:
            bundle.steps.append(suite.Step(step.name, plugin.name, "skipped", why))
            continue
        if not record_step(bundle, step.name, plugin.name, path_of(plugin.name),
                           lambda path, p=plugin, s=step: run_step(p, s, quiet=quiet), say):
            return False
    return True

"""The plug-in descriptor: everything the layers above a command ask about it (docs/architecture.md).

Plain data and ``"module:function"`` references, so reading it (``gpubench --help``) imports nothing
heavy; a hook's module is imported only when the hook is called (:meth:`Plugin.hook`).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

NAME = re.compile(r"[a-z][a-z0-9_-]{0,39}\Z")
HOOK = re.compile(r"[A-Za-z_][\w.]{0,199}:[A-Za-z_]\w{0,99}\Z")  # "module:function"
PLOT_KINDS = ("sweep", "bars", "collective")


@dataclass(frozen=True)
class SuiteStep:
    """One step of ``gpubench suite`` (and of each node of the fleet suite), declared by a plug-in.

    Attributes:
        spec: the plug-in's Spec (:func:`gpubench.kit.default_spec`), or a function of nothing that
            builds it when the step runs.
        order: where it runs among every plug-in's steps (copy 10 ... merge 50; default 100).
        opt_in: the suite option that asks for it ("--merge"), or None when it always runs.
        each_rank: on a fleet, every rank runs it on its own GPU; otherwise each node's local rank 0.
        own_process: run it through the single-process path even under a launcher.
        run: (spec, progress) -> Result, where the step is not its command's usual run.
    """

    name: str
    spec: Any
    order: int = 100
    min_gpus: int = 1
    opt_in: str | None = None
    each_rank: bool = False
    own_process: bool = False
    run: Callable | None = None


@dataclass(frozen=True)
class StepPlace:
    """What a plug-in's ``suite_steps`` hook is told about the node it runs on: the visible CUDA
    ordinals, whether it is a fleet node, and there this rank's own GPU."""

    devices: tuple[int, ...]
    fleet: bool = False
    gpu: int | None = None


@dataclass
class StageContext:
    """What a fleet stage is told when it runs (every rank calls it, in the same order): the rank
    group, the local-rank-0 ranks ascending, this rank's GPUs, seconds a rank waits for another
    (``--node-timeout``), a progress printer, why the fleet stopped before this stage (or None)."""

    group: Any
    leaders: list[int]
    n_gpus: int
    timeout: float
    say: Callable[[str], None]
    stopped: str | None = None


@dataclass
class StageOutcome:
    """What a fleet stage did: status ("ok", "error", "skipped"), why, its Result on rank 0, seconds
    taken, rows added to rank 0's checks, and the error that stops later stages (a lost rank)."""

    status: str
    reason: str = ""
    result: Any = None
    seconds: float | None = None
    checks: list = field(default_factory=list)
    fault: Exception | None = None


class FleetStage:
    """A step the fleet suite runs across nodes after every node's own (a ``fleet_stage`` hook's):
    its row ``name``, its ``order`` (nccl 10, net 20), and ``judges``: words naming the step when
    the command's expectations are judged on its result, else None."""

    name: str = ""
    order: int = 100
    judges: str | None = None

    def run(self, ctx: StageContext) -> StageOutcome | None:
        """Run the stage on every rank; None when it does not apply here (nothing is recorded)."""
        raise NotImplementedError

    def rows(self, result, outcomes) -> tuple[dict | None, list[dict]]:
        """The fleet's ``links`` object (or None) and the fleet rows of ``result`` (its flags, and
        ``outcomes``, the expectations judged on it, deciding "fail")."""
        return None, []

    def report(self, result) -> list:
        """Renderables shown after the fleet table."""
        return []


@dataclass(frozen=True)
class Plugin:
    """What one command answers; each field is described in docs/architecture.md's table.

    Attributes:
        writes_results: its runs write Results of its name (False: compare, plot, report, suite).
        compare_notes: (base, new) -> lines; suite_steps: (StepPlace) -> [SuiteStep]; fleet_checks:
            (Result) -> [check dicts]; fleet_stage: () -> :class:`FleetStage`; metrics: (Result) ->
            [(name, help, labels, value)]: each a ``"module:function"``.
        params_schema: ``{"properties": {name: schema}, "required": [names]}`` (:func:`params_schema`);
            empty: any scalar params.
    """

    name: str
    help: str
    command: str
    gpu: str = "yes"
    writes_results: bool = True
    docs: str = ""
    bench: str | None = None
    more_samples: str = "more samples per figure"
    added_options: Mapping[str, Any] = field(default_factory=dict)
    added_params: Mapping[str, Any] = field(default_factory=dict)
    incidental_options: tuple[str, ...] = ()
    compare_notes: str | None = None
    plot_kind: str = "sweep"
    x_name: str | None = None
    matrix_ends: str = "GPU"
    suite_steps: str | None = None
    fleet_checks: str | None = None
    fleet_stage: str | None = None
    metrics: str | None = None
    host_memory: bool = False
    digit_groups: bool = False
    params_schema: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Check every field's type and form, so a broken descriptor is refused where it is made. Raises ValueError:
        naming the field and what it takes."""
        if not isinstance(self.name, str) or not NAME.match(self.name):
            raise ValueError(f"plug-in name {self.name!r:.60}: use lower case letters, digits, '-' and '_' "
                             "(at most 40, a letter first)")

        def bad(what: str, want: str) -> ValueError:
            return ValueError(f"plug-in {self.name}: {what} {getattr(self, what)!r:.60} is not {want}")

        for attr, limit in (("help", 200), ("command", 200), ("gpu", 80), ("docs", 200), ("more_samples", 200),
                            ("matrix_ends", 40)):
            v = getattr(self, attr)
            if not isinstance(v, str) or len(v) > limit or (attr in ("help", "command", "gpu", "matrix_ends")
                                                             and not v.strip()):
                raise bad(attr, f"a string of at most {limit} characters")
        for attr in ("bench", "x_name"):
            v = getattr(self, attr)
            if v is not None and (not isinstance(v, str) or len(v) > 200):
                raise bad(attr, "a string of at most 200 characters, or None")
        for attr in ("compare_notes", "suite_steps", "fleet_checks", "fleet_stage", "metrics"):
            v = getattr(self, attr)
            if v is not None and not (isinstance(v, str) and HOOK.match(v)):
                raise bad(attr, "a 'module:function' reference, or None")
        for attr in ("added_options", "added_params"):
            v = getattr(self, attr)
            if not isinstance(v, Mapping) or not all(isinstance(k, str) for k in v):
                raise bad(attr, "a mapping of option or param names")
        if not isinstance(self.incidental_options, tuple) or not all(isinstance(k, str) for k in self.incidental_options):
            raise bad("incidental_options", "a tuple of option names")
        for attr in ("writes_results", "host_memory", "digit_groups"):
            if not isinstance(getattr(self, attr), bool):
                raise bad(attr, "true or false")
        if self.plot_kind not in PLOT_KINDS:
            raise bad("plot_kind", f"one of {', '.join(PLOT_KINDS)}")
        ps = self.params_schema
        props = ps.get("properties") if isinstance(ps, Mapping) else None
        if ps and not (set(ps) <= {"properties", "required"} and isinstance(props, Mapping)
                       and all(isinstance(k, str) and isinstance(v, Mapping) for k, v in props.items())
                       and isinstance(ps.get("required", []), (list, tuple))
                       and all(k in props for k in ps.get("required", []))):
            raise bad("params_schema", "{'properties': {param: schema}, 'required': [params among them]}")

    def hook(self, attr: str) -> Callable | None:
        """The function a ``"module:function"`` field names, imported now; None where unset. Raises ImportError,
        AttributeError: the reference does not resolve (a broken plug-in)."""
        ref = getattr(self, attr)
        return None if ref is None else resolve(ref)


def resolve(ref: str) -> Any:
    """The object a ``"module:attr"`` reference names (``attr`` may be dotted), its module imported now."""
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj


def param(json_type: str | list[str], description: str, **more: Any) -> dict[str, Any]:
    """One param's JSON Schema: ``{"type": json_type, "description": ..., **more}`` (``more``:
    further keywords, e.g. ``minimum=0``)."""
    return {"type": json_type, "description": description, **more}


def params_schema(required: Mapping[str, Mapping[str, Any]],
                  optional: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """A :attr:`Plugin.params_schema`: the params every record has and those some have, each name ->
    its schema (:func:`param`)."""
    return {"properties": {**required, **(optional or {})}, "required": list(required)}
